"""A child process with a log file, a readiness check and a stop that always happens."""

from __future__ import annotations

import abc
import atexit
import contextlib
import ctypes
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from zeps.errors import SetupError

__all__ = [
    "LocalServer",
    "ManagedProcess",
    "apt_install",
    "cpu_seconds",
    "die_with_parent",
    "file_tail",
    "free_port",
    "interruptible_module",
    "pid_running",
    "run_tool",
    "signal_when_parent_ends",
    "wait_until",
]

_PR_SET_PDEATHSIG = 1
_live: set[ManagedProcess] = set()
_live_lock = threading.Lock()


_EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_FIRST_PORT = 10000  #: below this, well-known and registered services live
_handed_out: set[int] = set()
_ports_lock = threading.Lock()


def _ephemeral_low() -> int:
    """The first port of the range the kernel takes local ports from for outgoing connections
    (Linux's default if unreadable)."""
    try:
        return int(_EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _port_share(first: int, end: int) -> tuple[int, int]:
    """This process's part of [first, end): all of it, or under pytest-xdist (``PYTEST_XDIST_WORKER``
    gwN of ``PYTEST_XDIST_WORKER_COUNT``) the N-th of equal shares, so that a server one worker stops
    and starts again on its port never finds it taken by another worker's."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER", ""), os.environ.get("PYTEST_XDIST_WORKER_COUNT", "")
    if not (worker.startswith("gw") and worker[2:].isdigit() and count.isdigit()) or int(count) < 2:
        return first, end
    index, size = int(worker[2:]), (end - first) // int(count)
    return first + index * size, first + (index + 1) * size


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))  # no SO_REUSEADDR: a port still in TIME_WAIT counts as taken
        except OSError:
            return False
    return True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now, outside the kernel's ephemeral
    range, and not handed out before by this process.

    Outside the ephemeral range because a server is often restarted on the port it had (a killed
    ZooKeeper, broker or SeaweedFS coming back): a port from that range may meanwhile be taken as
    the local end of any outgoing connection on the machine, and the restart fails with "address
    already in use" (seen in CI: a SeaweedFS volume server's gRPC port, between kill and start).
    Tests run side by side (pytest-xdist) take ports from separate shares of that range.
    Falls back to a port the kernel picks if the range below the ephemeral one is too small."""
    first, end = _port_share(_FIRST_PORT, _ephemeral_low())
    rng = random.SystemRandom()
    with _ports_lock:
        if end - first >= 1000:
            for _ in range(200):  # bounded: nearly every candidate is free on a test machine
                port = rng.randrange(first, end)
                if port not in _handed_out and _bindable(port):
                    _handed_out.add(port)
                    return port
        for _ in range(50):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.bind(("127.0.0.1", 0))
                port = int(s.getsockname()[1])
            if port not in _handed_out:
                _handed_out.add(port)
                return port
    raise SetupError("found no free TCP port on 127.0.0.1 (tried 250)")


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used so far, from /proc/<pid>/stat (OSError
    when it is gone)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2 :].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def interruptible_module(module: str, *args: str) -> list[str]:
    """The argv of ``python -m module args`` with SIGINT at Python's default (KeyboardInterrupt), as a
    terminal's shell starts a program. A process started in the background by a non-interactive
    shell inherits SIGINT ignored, and an ignored signal stays ignored across exec: a test that
    sends its child a Ctrl-C needs the child to hear it wherever the suite itself was started."""
    start = ("import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler); "
             f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)")  # fmt: skip
    return [sys.executable, "-c", start, *args]


def file_tail(path: Path, lines: int = 20) -> str:
    """The last ``lines`` lines of the log file ``path`` ("(no log)" if it cannot be read)."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def wait_until(check: Callable[[], bool], *, timeout: float, interval: float = 0.1, what: str) -> None:
    """Poll ``check`` until it returns True; raise :class:`SetupError` naming ``what`` after ``timeout``.

    Any exception from ``check`` counts as "not ready yet", except :class:`SetupError`, which ends
    the wait at once.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except SetupError:
            raise  # the check itself knows waiting is pointless (for example: the process exited)
        except Exception:  # not ready yet (connection refused, 503, …)
            pass
        if time.monotonic() >= deadline:
            raise SetupError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def run_tool(
    argv: Sequence[str],
    *,
    timeout: float = 600,
    input: str | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    hint: str = "",
) -> str:
    """Run a command line tool to completion; its stdout, or :class:`SetupError` with the command,
    the tail of what it said, and ``hint`` (what to do about it)."""
    result = subprocess.run(
        list(argv), input=input, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )
    if result.returncode != 0:
        said = (result.stderr or result.stdout).strip()[-3000:]
        raise SetupError(f"{Path(argv[0]).name} {' '.join(argv[1:4])} failed (exit {result.returncode}){hint}: {said}")
    return result.stdout


def apt_install(*packages: str, log: Path) -> None:
    """``apt-get update`` then ``apt-get install`` of Debian ``packages`` (no recommends), output in
    ``log``; :class:`SetupError` naming the command to run by hand when it fails or apt-get is absent."""
    by_hand = f"apt-get install {' '.join(packages)}"
    if shutil.which("apt-get") is None:
        raise SetupError(f"{' '.join(packages)} missing and apt-get is not available: install them ({by_hand})")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        for argv in (
            ["apt-get", "update", "-qq"],
            ["apt-get", "install", "-y", "-qq", "--no-install-recommends", *packages],
        ):
            if subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, env=env, check=False).returncode:
                raise SetupError(f"{' '.join(argv[:2])} failed (log: {log}); as root: {by_hand}")


class LocalServer(abc.ABC):
    """A local server with ``start()``/``stop()``, usable as a context manager."""

    @abc.abstractmethod
    def start(self) -> None: ...

    @abc.abstractmethod
    def stop(self) -> None: ...

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def pid_running(pid: int) -> bool:
    """True while ``pid`` runs (an exited process its parent has not reaped yet, a zombie, does not;
    one of another user counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state != "Z"


def die_with_parent() -> None:
    """A ``preexec_fn`` (runs in the child between fork and exec): the kernel kills the child when the
    thread that started it ends (the whole test process, for one started from its main thread)."""
    signal_when_parent_ends(signal.SIGKILL)()


def signal_when_parent_ends(sig: signal.Signals) -> Callable[[], None]:
    """A ``preexec_fn``: the kernel sends ``sig`` to the child when the thread that started it ends
    (SIGTERM for a child that stops what it started itself on it; SIGKILL: :func:`die_with_parent`)."""

    def preexec() -> None:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, sig)

    return preexec


class ManagedProcess:
    """One server process: started in its own process group, logging to ``log_path``.

    ``stop()`` sends SIGTERM to the group, waits ``grace`` seconds, then SIGKILL. ``kill()`` is
    ``kill -9`` at once (for chaos tests). Processes still running at interpreter exit are stopped.
    With ``die_with_parent`` (the default) the kernel kills the child if this process dies, so even
    ``kill -9`` of the test runner leaves no server behind.
    """

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        *,
        log_path: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
        die_with_parent: bool = True,
    ) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self.env = dict(env) if env is not None else None
        self.cwd = cwd
        self.die_with_parent = die_with_parent
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def wait(self, timeout: float) -> int:
        """Wait up to ``timeout`` seconds for the process to exit by itself; its exit code
        (SetupError naming the process if it is still running then)."""
        if self._proc is None:
            raise SetupError(f"{self.name} was never started")
        try:
            code = self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise SetupError(f"{self.name} still runs after {timeout:.0f}s") from None
        with _live_lock:
            _live.discard(self)
        return code

    def start(self) -> None:
        if self.running():
            return
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            try:
                self._proc = subprocess.Popen(
                    self.argv,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=self.env,
                    cwd=self.cwd,
                    start_new_session=True,
                    preexec_fn=die_with_parent if self.die_with_parent else None,  # noqa: PLW1509
                )
            except FileNotFoundError as exc:
                raise SetupError(f"{self.name}: cannot run {self.argv[0]!r} ({exc.strerror})") from exc
        with _live_lock:
            _live.add(self)

    def check_alive(self) -> None:
        """Raise :class:`SetupError` with the log's tail if the process has exited."""
        if self._proc is not None and self._proc.poll() is not None:
            raise SetupError(
                f"{self.name} exited with code {self._proc.returncode}; last log lines "
                f"({self.log_path}):\n{self.log_tail()}"
            )

    def wait_ready(self, check: Callable[[], bool], *, timeout: float) -> None:
        """Wait until ``check`` passes, failing fast (with the log's tail) if the process exits."""

        def ready() -> bool:
            self.check_alive()
            return check()

        try:
            wait_until(ready, timeout=timeout, what=f"{self.name} to become ready")
        except SetupError as exc:
            self.check_alive()
            raise SetupError(f"{exc}; last log lines ({self.log_path}):\n{self.log_tail()}") from None

    def json_line(self, key: str, *, timeout: float) -> dict[str, Any]:
        """The last JSON object line holding ``key`` in the process's log, waiting for it (SetupError
        with the log's tail if the process exits without printing one)."""

        def found() -> dict[str, Any] | None:
            for line in reversed(self.log_path.read_text(errors="replace").splitlines()):
                if line.startswith("{") and key in line:
                    return dict(json.loads(line))
            return None

        def done() -> bool:
            if found() is not None:
                return True
            self.check_alive()  # exited without it: its log says why
            return False

        wait_until(done, timeout=timeout, interval=0.2, what=f"{self.name} to print {key}")
        result = found()
        assert result is not None
        return result

    def log_tail(self, lines: int = 20) -> str:
        return file_tail(self.log_path, lines)

    def _signal_group(self, sig: signal.Signals) -> None:
        if self._proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._proc.pid, sig)

    def stop(self, grace: float = 10.0) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.poll() is None:
            self._signal_group(signal.SIGTERM)
            try:
                proc.wait(grace)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                proc.wait(5)
        else:
            self._signal_group(signal.SIGKILL)  # stray children of an exited leader
        with _live_lock:
            _live.discard(self)

    def kill(self) -> None:
        """``kill -9`` the process group now and reap it."""
        proc = self._proc
        if proc is None:
            return
        self._signal_group(signal.SIGKILL)
        proc.wait(5)
        with _live_lock:
            _live.discard(self)


@atexit.register
def _stop_all() -> None:
    with _live_lock:
        procs = list(_live)
    for proc in procs:
        proc.stop(grace=3)
