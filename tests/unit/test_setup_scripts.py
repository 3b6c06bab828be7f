"""Setup scripts stop with one line naming what is missing — never a stack trace, never a cache
that the next run would trust. Run with a PATH from which the tool under test is removed."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# What the scripts need besides the tool under test.
BASICS = ["bash", "env", "cat", "sha256sum", "cut", "dirname", "mkdir", "rm", "touch", "tail", "sed",
          "ln", "basename", "mv", "grep", "date", "ls", "wc", "head", "tr"]  # fmt: skip


def _path_without(tmp_path: Path, *missing: str, extra: tuple[str, ...] = ()) -> str:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in [*BASICS, *extra]:
        if tool in missing:
            continue
        found = shutil.which(tool)
        if found:
            (bin_dir / tool).symlink_to(found)
    return str(bin_dir)


def _run(script: str, tmp_path: Path, path: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": path, "HOME": str(tmp_path), "ZEPS_CACHE_DIR": str(tmp_path / "cache")}
    return subprocess.run(
        ["bash", str(ROOT / script), *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def test_testbin_without_go_names_go(tmp_path: Path) -> None:
    result = _run("tools/testbin/build.sh", tmp_path, _path_without(tmp_path, "go"))
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("setup: Go is missing") and "install" in lines[0]
    assert not (tmp_path / "cache" / "testbin").exists(), "left a cache behind"


def test_make_tests_testbin_check_without_go_names_go_rather_than_not_built(tmp_path: Path) -> None:
    result = _run("tools/setup.sh", tmp_path, _path_without(tmp_path, "go", extra=("mktemp", "flock")), "testbin-known")
    assert result.returncode == 1
    assert "Go is missing" in result.stderr and "not built" not in result.stderr


def test_zookeeper_without_java_names_java(tmp_path: Path) -> None:
    result = _run("tools/zookeeper/fetch.sh", tmp_path, _path_without(tmp_path, "java", extra=("mvn",)))
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("setup: Java is missing")
    assert not list((tmp_path / "cache").glob("zookeeper-*")), "left a cache behind"


@pytest.mark.skipif(shutil.which("java") is None, reason="needs java to get past the Java check")
def test_zookeeper_without_maven_names_maven(tmp_path: Path) -> None:
    result = _run("tools/zookeeper/fetch.sh", tmp_path, _path_without(tmp_path, "mvn", extra=("java",)))
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "setup: Maven is missing; install it ('apt-get install maven') — it fetches the pinned ZooKeeper jars"
    ]


def test_python_setup_rejects_old_python(tmp_path: Path) -> None:
    fake = tmp_path / "python3.9"
    fake.write_text("#!/bin/sh\nif [ \"$1\" = -V ]; then echo 'Python 3.9.2'; exit 0; fi\nexit 1\n")
    fake.chmod(0o755)
    env = {**os.environ, "PYTHON": str(fake)}
    result = subprocess.run(
        ["bash", str(ROOT / "tools/setup.sh"), "python"],
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        "setup: Python 3.11 or newer is needed, found Python 3.9.2; set PYTHON=/path/to/python3.11"
    ]
