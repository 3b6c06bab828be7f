"""The alert rules with Prometheus's own tool (promtool, from Debian's prometheus package, unpacked by
``make setup``): they parse, pass promtool's checks, and each alert fires on the series that should
page and stays silent on the ones that should not (tests/monitoring/zeps-rules.test.yaml)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "charts" / "zeps" / "files" / "zeps-rules.yaml"
RULE_TESTS = ROOT / "tests" / "monitoring" / "zeps-rules.test.yaml"


@pytest.fixture(scope="module")
def promtool() -> str:
    path = os.environ.get("ZEPS_PROMTOOL", "")
    assert path and Path(path).exists(), "ZEPS_PROMTOOL is not set: run `make setup` (tools/setup.sh promtool)"
    return path


def _run(*argv: str) -> str:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False, cwd=RULE_TESTS.parent)
    assert result.returncode == 0, f"{' '.join(argv[1:3])} failed:\n{result.stdout}\n{result.stderr}"
    return result.stdout


def test_the_rules_pass_promtool_check(promtool: str) -> None:
    out = _run(promtool, "check", "rules", str(RULES))
    assert "SUCCESS" in out


def test_each_alert_fires_and_stays_silent_as_its_tests_say(promtool: str) -> None:
    _run(promtool, "test", "rules", RULE_TESTS.name)


def test_every_dashboard_expression_is_valid_promql(promtool: str, tmp_path: Path) -> None:
    """Each panel's query as a recording rule, so promtool's parser checks it."""
    import json  # noqa: PLC0415

    import yaml  # noqa: PLC0415

    rules = []
    for dashboard in sorted((RULES.parent / "dashboards").glob("*.json")):
        for panel in json.loads(dashboard.read_text())["panels"]:
            rules += [{"record": f"dashboard:{dashboard.stem.replace('-', '_')}:{panel['id']}_{t['refId']}",
                       "expr": t["expr"]} for t in panel["targets"]]  # fmt: skip
    assert len(rules) > 10
    path = tmp_path / "dashboards.rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboards", "rules": rules}]}))
    assert "SUCCESS" in _run(promtool, "check", "rules", str(path))


def test_every_alert_is_tested(promtool: str) -> None:
    """A new alert without a promtool test fails here."""
    import yaml  # noqa: PLC0415

    alerts = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r}
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    tested = {case["alertname"] for t in tests for case in t.get("alert_rule_test", []) if case.get("exp_alerts")}
    assert alerts == tested, f"alerts never seen firing in a test: {sorted(alerts - tested)}"
