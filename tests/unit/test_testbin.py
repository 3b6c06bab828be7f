"""zeps_dev.testbin: the pinned binaries built in the background of a test session, waited for by the
first fixture that needs one. The build script is replaced by small shell scripts (real processes);
build.sh's own --if-built mode runs for real against an empty cache (it builds nothing)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from zeps.errors import SetupError
from zeps_dev import testbin

BUILD_SH = Path(__file__).resolve().parents[2] / "tools" / "testbin" / "build.sh"


@pytest.fixture(autouse=True)
def _fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """No background build of the session's own, no ZEPS_TESTBIN: each test starts from nothing."""
    monkeypatch.setattr(testbin, "_build", [])
    monkeypatch.delenv(testbin.ENV_TESTBIN, raising=False)


def _script(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "build.sh"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return script


def _folder_with(tmp_path: Path, *names: str) -> Path:
    folder = tmp_path / "bin"
    folder.mkdir()
    for name in names:
        (folder / name).touch()
    return folder


def test_ready_names_the_folder_only_when_it_holds_every_binary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _folder_with(tmp_path, "etcd", "kubectl")
    assert testbin.ready(("etcd",)) is None  # ZEPS_TESTBIN unset
    monkeypatch.setenv(testbin.ENV_TESTBIN, str(folder))
    assert testbin.ready(("etcd", "kubectl")) == folder
    assert testbin.ready(("etcd", "weed")) is None


def test_binaries_waits_for_the_background_build_and_passes_its_folder_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = _folder_with(tmp_path, "helm")
    # the build prints progress on stderr and the folder last on stdout, after a while
    monkeypatch.setattr(testbin, "BUILD_SCRIPT", _script(tmp_path, f"echo building >&2; sleep 1; echo {folder}"))
    testbin.start_background_build()
    (build,) = testbin._build
    assert build.process.poll() is None, "start_background_build returns at once"
    assert testbin.binaries(("helm",)) == folder
    assert os.environ[testbin.ENV_TESTBIN] == str(folder), "the processes tests start find it too"
    testbin.start_background_build()  # ready now: nothing new is started
    assert testbin._build == [build]


def test_a_failed_build_is_a_setup_error_with_what_it_printed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(testbin, "BUILD_SCRIPT", _script(tmp_path, "echo 'setup: building k8s failed' >&2; exit 1"))
    with pytest.raises(SetupError, match=r"(?s)failed \(exit 1\).*building k8s failed"):
        testbin.binaries(("kubectl",))


def test_a_build_whose_folder_lacks_a_binary_is_a_setup_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = _folder_with(tmp_path, "etcd")
    monkeypatch.setattr(testbin, "BUILD_SCRIPT", _script(tmp_path, f"echo {folder}"))
    with pytest.raises(SetupError, match="lacks one of etcd, weed"):
        testbin.binaries(("etcd", "weed"))


def test_stopping_ends_a_running_build(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(testbin, "BUILD_SCRIPT", _script(tmp_path, "sleep 600"))
    testbin.start_background_build()
    (build,) = testbin._build
    testbin.stop_background_build()
    assert build.process.poll() is not None


def test_build_sh_if_built_builds_nothing_and_says_so_by_its_exit_code(tmp_path: Path) -> None:
    env = {**os.environ, "ZEPS_CACHE_DIR": str(tmp_path / "cache")}
    result = subprocess.run(
        [str(BUILD_SH), "test", "--if-built"], env=env, capture_output=True, timeout=60, check=False
    )
    assert result.returncode == 3, result.stderr
    assert not (tmp_path / "cache").exists(), "a check only: nothing built, no folder or lock made"
