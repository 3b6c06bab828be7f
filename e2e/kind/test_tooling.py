"""``make e2e``'s driver, run as a child of the suite. Against an engine it did not start (the suite's
own, reached through ``DOCKER_HOST``, so the child treats it as the user's): a name or port already
taken is refused with one line and touches nothing; Ctrl-C in the middle of ``kind create`` leaves no
container behind and the engine (and the cluster already in it) as they were. With no engine at all:
Ctrl-C while its own dockerd runs leaves no dockerd, process or bridge behind."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from zeps.errors import SetupError
from zeps_dev.kind import E2E_WORKERS
from zeps_dev.process import interruptible_module, wait_until

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = os.environ.get("ZEPS_E2E_KIND_CLUSTER", "zeps-e2e")
#: how long a driver may take to get as far as the test needs: it checks every image of the stack
#: first (seconds on an idle machine; minutes beside the suite's other lanes and a busy machine)
DRIVER_S = 600


def _driver(**env: str) -> subprocess.Popen[str]:
    """The e2e driver as a user starts it (never with the suite's own ZEPS_KEEP_CLUSTER: a kept
    cluster is exactly what these tests check is not left behind)."""
    inherited = {k: v for k, v in os.environ.items() if k != "ZEPS_KEEP_CLUSTER"}
    return subprocess.Popen(
        # collect only, if it got that far; SIGINT at its default, wherever the suite was started from
        interruptible_module("zeps_dev.kind", "e2e", "--co", "-q"),
        env={**inherited, **env},
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def _docker(*args: str) -> str:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=True, timeout=60).stdout


def _cluster_containers(name: str) -> list[str]:
    return _docker("ps", "-a", "-q", "--filter", f"label=io.x-k8s.kind.cluster={name}").split()


def _the_suites_cluster_is_untouched(cluster: Any) -> None:
    assert len(_cluster_containers(CLUSTER)) == 1 + E2E_WORKERS
    nodes = cluster.json("nodes")["items"]
    ready = [c["status"] for n in nodes for c in n["status"]["conditions"] if c["type"] == "Ready"]
    assert ready == ["True"] * (1 + E2E_WORKERS)


@pytest.mark.timeout(DRIVER_S + 240)  # the driver's deadline, then what the test checks after it
def test_a_cluster_name_already_taken_is_refused_and_left_alone(cluster: Any) -> None:
    proc = _driver(ZEPS_KIND_CLUSTER=CLUSTER)
    out, _ = proc.communicate(timeout=DRIVER_S)
    assert proc.returncode == 3, out
    refusal = [line for line in out.splitlines() if line.startswith("e2e:")]
    assert len(refusal) == 1 and f"named {CLUSTER!r} already exists" in refusal[0], out
    _the_suites_cluster_is_untouched(cluster)


@pytest.mark.timeout(DRIVER_S + 240)  # the driver's deadline, then what the test checks after it
def test_an_api_port_already_taken_is_named(cluster: Any) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = _driver(ZEPS_KIND_CLUSTER="zeps-port-taken", ZEPS_KIND_API_PORT=str(port))
        out, _ = proc.communicate(timeout=DRIVER_S)
    assert proc.returncode == 3, out
    assert f"e2e: port {port} on 127.0.0.1 is taken" in out
    assert not _cluster_containers("zeps-port-taken")
    _the_suites_cluster_is_untouched(cluster)


@pytest.mark.serial  # makes a node container: a host network link, which the test below counts
@pytest.mark.timeout(DRIVER_S + 240)  # the driver's deadline, then what the test checks after it
def test_ctrl_c_during_kind_create_leaves_no_container(cluster: Any) -> None:
    name = "zeps-interrupted"
    proc = _driver(ZEPS_KIND_CLUSTER=name)
    assert proc.stdout is not None
    seen = []
    deadline = time.monotonic() + DRIVER_S
    for line in proc.stdout:
        seen.append(line)
        if "kind: creating cluster" in line or time.monotonic() > deadline:
            break
    # Ctrl-C once kind has made the node container (what a terminal sends: SIGINT to the group)
    try:
        wait_until(lambda: bool(_cluster_containers(name)), timeout=30, what="kind to create the node container")
    except SetupError:
        pytest.fail("kind never created the node container: " + "".join(seen))
    os.killpg(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 130, "".join(seen) + out
    assert not _cluster_containers(name), "the interrupted run left its node container"
    assert name not in _docker("ps", "-a", "--format", "{{.Names}}")
    _the_suites_cluster_is_untouched(cluster)


@pytest.mark.serial  # counts the host's network links
def test_ctrl_c_while_a_dockerd_of_zeps_runs_leaves_no_dockerd(tmp_path: Path) -> None:
    """No engine answers (DOCKER_HOST names nothing), so the driver starts a dockerd of its own, in a
    root of this test's; Ctrl-C once it serves: no process of that root is left, no host bridge."""
    root = Path(tempfile.mkdtemp(prefix="zd-", dir="/tmp"))  # short: dockerd's sockets live below it
    bridges_before = set(os.listdir("/sys/class/net"))
    try:
        proc = _driver(DOCKER_HOST=f"unix://{tmp_path}/nothing.sock", ZEPS_DOCKER_ROOT=str(root))
        assert proc.stdout is not None
        seen = []
        for line in proc.stdout:
            seen.append(line)
            if line.startswith("[e2e] images:") or len(seen) > 50:
                break
        assert any("starting dockerd of zeps" in line for line in seen), "".join(seen)
        os.killpg(proc.pid, signal.SIGINT)
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 130, "".join(seen) + out
        assert "no process, container or network of it left" in out, out
        ours = [p for p in os.listdir("/proc") if p.isdigit() and _cmdline_has(p, str(root))]
        assert not ours, f"processes of the interrupted run's dockerd are still running: {ours}"
        assert set(os.listdir("/sys/class/net")) <= bridges_before
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _cmdline_has(pid: str, text: str) -> bool:
    try:
        return text.encode() in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
