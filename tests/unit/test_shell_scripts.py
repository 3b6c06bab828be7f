"""The project's shell scripts parse, and the Spark image's entrypoint refuses a role it cannot
serve with one line naming the missing variable. These run on the host with bash: the image itself
is exercised on kind (`e2e/kind/test_spark.py`); a syntax error there used to surface only after a
20-minute e2e run."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ENTRYPOINT = ROOT / "images" / "spark" / "zeps-spark-entrypoint"


def _shell_scripts() -> list[Path]:
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    scripts = []
    for name in listed:
        path = ROOT / name
        if path.is_file() and path.read_bytes()[:2] == b"#!":
            first = path.read_text(errors="replace").splitlines()[0]
            if first.endswith(("/bash", "/sh", " bash", " sh")):
                scripts.append(path)
    return scripts


def test_the_script_list_is_not_empty() -> None:
    names = {path.name for path in _shell_scripts()}
    assert {"zeps-spark-entrypoint", "zookeeper-run", "run"} <= names


@pytest.mark.parametrize("script", _shell_scripts(), ids=lambda path: str(path.relative_to(ROOT)))
def test_every_shell_script_parses(script: Path) -> None:
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr


def _entrypoint(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(ENTRYPOINT), *args],
        env={"PATH": "/usr/bin:/bin", **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_the_driver_role_without_a_bind_address_names_it() -> None:
    result = _entrypoint("driver", "/opt/app.py")
    assert result.returncode == 64
    assert result.stderr.strip().splitlines() == [
        "zeps-spark-entrypoint: driver role without SPARK_DRIVER_BIND_ADDRESS (set it to the pod IP)"
    ]


def test_the_executor_role_names_the_first_missing_variable() -> None:
    full = {
        "SPARK_DRIVER_URL": "spark://CoarseGrainedScheduler@10.0.0.1:7078",
        "SPARK_EXECUTOR_ID": "1",
        "SPARK_EXECUTOR_CORES": "1",
        "SPARK_EXECUTOR_MEMORY": "512m",
        "SPARK_APPLICATION_ID": "spark-1",
        "SPARK_EXECUTOR_POD_IP": "10.0.0.2",
        "SPARK_EXECUTOR_POD_NAME": "exec-1",
    }
    for missing in full:
        env = {name: value for name, value in full.items() if name != missing}
        result = _entrypoint("executor", **env)
        assert result.returncode == 64, missing
        assert result.stderr.strip() == (
            f"zeps-spark-entrypoint: executor role without {missing} (Spark's driver sets it)"
        )


@pytest.mark.parametrize(("user", "password"), [("zeps-operator", "s3cret"), ("u", "pa$$ w%rd\\n")])
def test_the_zookeeper_image_makes_the_super_digest_zookeeper_and_kazoo_expect(user: str, password: str) -> None:
    """zookeeper-run turns the chart's identity into the servers' superDigest (coreutils, no ZooKeeper
    class: its DigestAuthenticationProvider needs jars the image does not carry): the digest kazoo
    authenticates with, for any password."""
    from kazoo.security import make_digest_acl_credential  # noqa: PLC0415

    script = ROOT / "images" / "zookeeper" / "zookeeper-run"
    result = subprocess.run(["bash", str(script), "digest", user, password], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == make_digest_acl_credential(user, password)


def test_the_zookeeper_image_enforces_quotas_and_purges_old_snapshots(tmp_path: Path) -> None:
    """zookeeper-run's server: hard quotas bind (the operator's per-namespace ones: without the flag
    the servers only count), and old snapshots and logs go (three kept, checked hourly). Run with a
    stand-in ``java`` on PATH that prints its arguments: what the server would be started with."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "java").write_text("#!/bin/sh\nprintf '%s\\n' \"$@\"\n")
    (bin_dir / "java").chmod(0o755)
    script = ROOT / "images" / "zookeeper" / "zookeeper-run"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "ZOO_DATA_DIR": str(tmp_path / "data"), "ZOO_MY_ID": "1"}
    argv = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=True, env=env).stdout.split()
    assert "-Dzookeeper.enforceQuota=true" in argv
    config = (tmp_path / "data" / "zoo.cfg").read_text().splitlines()
    assert "autopurge.snapRetainCount=3" in config and "autopurge.purgeInterval=1" in config
