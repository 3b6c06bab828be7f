"""The docs site's promises that a unit test can keep: every alert's runbook link lands on a heading
of the docs (the site's anchors are made from headings as Python-Markdown's toc makes them), and the
README stays a short front page (the rest is in docs/, built with --strict by make lint)."""

from __future__ import annotations

import re
import unicodedata
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
SITE = "https://zeps-dev.github.io/zeps/"


def _anchor(heading: str) -> str:
    """Python-Markdown's toc slug of a heading (what the site's anchors are)."""
    text = unicodedata.normalize("NFKD", heading.replace("`", "")).encode("ascii", "ignore").decode()
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", text).strip().lower())


def _anchors(page: Path) -> set[str]:
    headings, fenced = [], False
    for line in page.read_text().splitlines():
        fenced ^= line.startswith("```")
        if not fenced and (m := re.match(r"^#{1,6} (.+)$", line)):
            headings.append(m.group(1))
    return {_anchor(h) for h in headings}


def test_every_runbook_link_lands_on_a_heading_of_the_docs() -> None:
    rules = yaml.safe_load((ROOT / "charts/zeps/files/zeps-rules.yaml").read_text())
    alerts = [rule for group in rules["groups"] for rule in group["rules"] if "alert" in rule]
    assert alerts
    for alert in alerts:
        url = alert["annotations"]["runbook_url"]
        assert url.startswith(SITE), f"{alert['alert']}: {url} is not a page of the docs site"
        page, _, anchor = url[len(SITE) :].partition("#")
        source = ROOT / "docs" / f"{page.rstrip('/')}.md"
        assert source.exists(), f"{alert['alert']}: no page {source.relative_to(ROOT)}"
        assert anchor == alert["alert"].lower(), f"{alert['alert']}: its runbook is its own section"
        assert anchor in _anchors(source), f"{alert['alert']}: no heading for #{anchor} in {source.relative_to(ROOT)}"


def test_the_readme_is_a_short_front_page() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    # it is the package's long description too: its links must work off GitHub (absolute, or anchors)
    relative = [link for link in re.findall(r"\]\(([^)]+)\)", readme) if not link.startswith(("http", "#"))]
    assert relative == [], f"relative links in the README: {relative}"


def test_every_test_a_page_names_as_its_backing_exists() -> None:
    """A promise in the docs names the test that keeps it (``test_name…``, a prefix when it ends in
    an ellipsis): each must name a test function of tests/ or e2e/, or the promise has lost its test."""
    defined = {m.group(1) for folder in ("tests", "e2e") for path in (ROOT / folder).rglob("test_*.py")
               for m in re.finditer(r"^(?:async )?def (test_\w+)", path.read_text(), re.M)}  # fmt: skip
    assert len(defined) > 100
    pages = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")]
    named = {(page.relative_to(ROOT), m.group(1), bool(m.group(2)))
             for page in pages for m in re.finditer(r"`(test_\w+)(…|\.\.\.)?`", page.read_text())}  # fmt: skip
    assert named
    missing = [f"{page}: {name}" for page, name, prefix in sorted(named)
               if not (any(d.startswith(name) for d in defined) if prefix else name in defined)]  # fmt: skip
    assert missing == [], f"tests the docs name that do not exist: {missing}"


def test_every_benchmark_has_its_section_in_the_one_home_of_figures() -> None:
    """benchmarks/README.md holds a section per ``make bench-<scenario>`` (what it measures, against
    what, the latest figures, what limits them): a benchmark without one has figures nowhere, and a
    section without its benchmark describes a target that is gone."""
    targets = {"bench-" + p.stem.removeprefix("bench_").replace("_", "-")
               for p in (ROOT / "benchmarks").glob("bench_*.py")}  # fmt: skip
    readme = (ROOT / "benchmarks" / "README.md").read_text()
    sections = set(re.findall(r"^#{2,3} (?:On kind: )?make (bench-[\w-]+)$", readme, re.M))
    assert len(targets) > 10
    assert targets - sections == set(), "benchmarks without a section in benchmarks/README.md"
    assert sections - targets == set(), "sections of benchmarks/README.md without their benchmark"


def test_the_tests_wait_on_conditions_and_each_sleep_says_why() -> None:
    """docs/development/test-tiers.md: a test waits for an event, not for time; what is left of
    ``time.sleep`` (a fault's length, a negative check, a workload's pace) says why on its line, and
    there are at most 25 of them in tests/ and e2e/."""
    sleeps = [(path.relative_to(ROOT), n, line.strip())
              for folder in ("tests", "e2e") for path in sorted((ROOT / folder).rglob("*.py"))
              for n, line in enumerate(path.read_text().splitlines(), 1)
              if re.search(r"\b(?:time|asyncio)\.sleep\(", line)]  # fmt: skip
    assert len(sleeps) > 5, "the scan found nothing: has the layout moved?"
    unexplained = [f"{path}:{n}" for path, n, line in sleeps if "#" not in line.split("sleep(", 1)[1]]
    assert unexplained == [], "a sleep without its reason on its line"
    assert len(sleeps) <= 25, f"{len(sleeps)} sleeps: wait on a condition instead ({sleeps})"
