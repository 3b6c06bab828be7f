"""zeps_dev.testbin: the pinned binaries built in the background of a test session, waited for by the
first fixture that needs one. The build script is replaced by small shell scripts (real processes);
build.sh's own --if-built mode runs for real against an empty cache (it builds nothing)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from zeps.errors import SetupError
from zeps_dev import testbin
from zeps_dev.process import pid_running, wait_until

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


def _fake_go(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """An environment whose ``go`` is a script that records each build's arguments and makes weed and
    nats-server when asked for them (build.sh runs for real around it)."""
    bin_dir, log = tmp_path / "fake-go", tmp_path / "go-builds.log"
    bin_dir.mkdir()
    go = bin_dir / "go"
    go.write_text(
        "#!/bin/sh\n"
        '[ "$1" = env ] && { echo go1.99-fake; exit 0; }\n'
        'echo "$*" >> "$GO_LOG"\n'
        'out=""; prev=""; for a in "$@"; do [ "$prev" = -o ] && out=$a; prev=$a; done\n'
        'for a in "$@"; do case "$a" in\n'
        '  */weed) touch "$out/weed" ;;\n'
        '  */nats-server/v2) touch "$out/nats-server" ;;\n'
        "esac; done\n"
    )
    go.chmod(0o755)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "GO_LOG": str(log),
           "ZEPS_CACHE_DIR": str(tmp_path / "cache")}  # fmt: skip
    return env, log


def test_the_tests_weed_is_built_without_optimisation_and_the_benchmarks_weed_with_it(tmp_path: Path) -> None:
    """build.sh's flags with a recording ``go``: the test set's weed is compiled with -N -l (it does
    little work in a test), the bench set's (ZEPS_WEED, the S3 store's benchmarks) optimised, and the
    control plane optimised in both."""
    env, log = _fake_go(tmp_path)
    for set_name in ("test", "bench"):
        result = subprocess.run([str(BUILD_SH), set_name], env=env, capture_output=True, text=True, timeout=60,
                                check=False)  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert (Path(result.stdout.splitlines()[-1]) / "weed").exists(), f"the {set_name} set names a weed"
    builds = log.read_text().splitlines()
    weed = [line for line in builds if line.endswith("github.com/seaweedfs/seaweedfs/weed")]
    assert len(weed) == 2, builds
    assert "-gcflags=all=-dwarf=false -N -l" in weed[0], "the tests' weed is not optimised"
    assert "-N -l" not in weed[1], "the benchmarks' weed is optimised"
    apiserver = next(line for line in builds if "cmd/kube-apiserver" in line)
    assert "-N" not in apiserver.split(), "the control plane is optimised"


def test_zeps_weed_names_the_weed_a_seaweedfs_server_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from zeps_dev.seaweedfs import ENV_WEED, weed_binary  # noqa: PLC0415

    weed = tmp_path / "weed"
    weed.write_text("#!/bin/sh\n")
    monkeypatch.setenv(ENV_WEED, str(weed))
    with pytest.raises(SetupError, match=r"ZEPS_WEED=.* is not an executable weed; run tools/setup.sh bench"):
        weed_binary()
    weed.chmod(0o755)
    assert weed_binary() == weed
    monkeypatch.delenv(ENV_WEED)
    monkeypatch.setenv(testbin.ENV_TESTBIN, str(_folder_with(tmp_path, "weed", *testbin.TEST_BINARIES)))
    assert weed_binary() == tmp_path / "bin" / "weed", "without it, the test set's"


def test_a_test_session_killed_stops_its_background_build_and_the_go_build_in_it(tmp_path: Path) -> None:
    """A session killed outright (SIGKILL: no atexit runs) still stops the build it started: the kernel
    sends build.sh SIGTERM as the session's thread ends, and build.sh's trap stops the go build it
    waits for. build.sh runs for real; ``go`` is a script that waits as a long build does (a real
    build would spend a core for minutes to show the same)."""
    env, _ = _fake_go(tmp_path)
    go_pid = tmp_path / "go.pid"
    (tmp_path / "fake-go" / "go").write_text(
        '#!/bin/sh\n[ "$1" = env ] && { echo go1.99-fake; exit 0; }\necho $$ > "$GO_PID"\nexec sleep 600\n'
    )
    env = {k: v for k, v in env.items() if k != testbin.ENV_TESTBIN} | {"GO_PID": str(go_pid)}
    session_code = "import signal, zeps_dev.testbin as t; t.start_background_build(); signal.pause()"  # until killed
    session = subprocess.Popen([sys.executable, "-c", session_code], env=env, stdin=subprocess.DEVNULL,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        wait_until(lambda: go_pid.exists() and go_pid.read_text().strip() != "", timeout=30, what="a go build")
        go = int(go_pid.read_text())
        assert pid_running(go)
    finally:
        session.kill()
        session.wait()
    try:
        wait_until(lambda: not pid_running(go), timeout=30, what="the go build stopped with the session")
    finally:
        if pid_running(go):  # the test failed: nothing of it left behind
            os.kill(go, signal.SIGKILL)
