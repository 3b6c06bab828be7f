"""ManagedProcess: real child processes (sleep, sh), no servers."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from zeps.errors import SetupError
from zeps_dev.process import ManagedProcess, _ephemeral_low, _port_share, free_port, pid_running, wait_until


def test_stop_ends_the_whole_process_group(tmp_path: Path) -> None:
    # the shell starts a grandchild; stop() must end both
    pidfile = tmp_path / "child.pid"
    proc = ManagedProcess("sh", ["sh", "-c", f"sleep 600 & echo $! > {pidfile}; wait"], log_path=tmp_path / "log")
    proc.start()
    wait_until(lambda: pidfile.exists() and pidfile.read_text().strip() != "", timeout=5, what="grandchild pid")
    grandchild = int(pidfile.read_text())
    assert proc.running() and pid_running(grandchild)
    proc.stop(grace=5)
    assert not proc.running()
    wait_until(lambda: not pid_running(grandchild), timeout=5, what="grandchild to exit")


def test_a_process_that_exits_fails_fast_with_its_log(tmp_path: Path) -> None:
    proc = ManagedProcess("broken", ["sh", "-c", "echo 'config is bad' >&2; exit 3"], log_path=tmp_path / "log")
    proc.start()
    started = time.monotonic()
    with pytest.raises(SetupError) as err:
        proc.wait_ready(lambda: False, timeout=30)
    assert time.monotonic() - started < 10, "did not notice the exit"
    assert "exited with code 3" in str(err.value) and "config is bad" in str(err.value)


def test_missing_program_is_a_setup_error(tmp_path: Path) -> None:
    proc = ManagedProcess("ghost", ["/nonexistent/zeps-ghost"], log_path=tmp_path / "log")
    with pytest.raises(SetupError, match="ghost: cannot run"):
        proc.start()


def test_kill_is_immediate(tmp_path: Path) -> None:
    # a process that ignores SIGTERM still dies on kill()
    proc = ManagedProcess("stubborn", ["sh", "-c", "trap '' TERM; echo trapped; sleep 600"], log_path=tmp_path / "log")
    proc.start()
    proc.wait_ready(lambda: "trapped" in (tmp_path / "log").read_text(), timeout=10)
    proc.kill()
    assert not proc.running()


def test_free_port_is_bindable_on_loopback() -> None:
    port = free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_free_ports_are_distinct_and_outside_the_ephemeral_range() -> None:
    """A server restarted on its port must find it free: a port from the kernel's ephemeral range
    can be taken meanwhile by any outgoing connection's local end (a CI run lost a SeaweedFS
    restart that way), so free_port stays below that range, and never hands a port out twice."""
    low, _high = (int(f) for f in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    if low >= 11000:  # room below the range (Linux's default 32768-60999 leaves 10000-32767)
        assert all(10000 <= port < low for port in ports), [p for p in ports if not 10000 <= p < low]


def test_workers_side_by_side_take_ports_from_separate_shares(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under pytest-xdist each worker has its own share of the range: a port one worker's server
    gives up for a restart is never handed to the other worker meanwhile."""
    monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw0")
    assert _port_share(10000, 32768) == (10000, 21384)
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    assert _port_share(10000, 32768) == (21384, 32768)
    first, end = _port_share(10000, _ephemeral_low())
    if end - first >= 1000:  # room below this machine's ephemeral range (Linux's default leaves 22768)
        ports = [free_port() for _ in range(50)]
        assert all(first <= port < end for port in ports), ports
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    assert _port_share(10000, 32768) == (10000, 32768)


def test_wait_until_names_what_it_waited_for() -> None:
    with pytest.raises(SetupError, match="the moon"):
        wait_until(lambda: False, timeout=0.3, interval=0.05, what="the moon")
