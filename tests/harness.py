"""Test harness objects shared by the fixtures in conftest.py (importable as ``harness``)."""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient

from zeps.coordination import connect
from zeps.coordination.testing import count_znodes, expire_session
from zeps_dev import ZooKeeperServer
from zeps_dev.process import ManagedProcess, wait_until


def until(check: Callable[[], bool], what: str, timeout: float = 20.0) -> None:
    """The tests' one way to wait: poll ``check`` every 50 ms until it is true; after ``timeout``
    seconds fail naming ``what`` (zeps_dev.process.wait_until underneath)."""
    wait_until(check, timeout=timeout, interval=0.05, what=what)


class ZooKeeperHarness:
    """The ``zookeeper`` fixture: a real server plus helpers.

    ``root`` is a fresh znode path for the current test, so tests sharing the server never see
    each other's nodes. Clients made by :meth:`client` are stopped at teardown.
    """

    def __init__(self, server: ZooKeeperServer, root: str) -> None:
        self.server = server
        self.root = root
        self._clients: list[KazooClient] = []

    @property
    def connect_string(self) -> str:
        return self.server.connect_string

    def client(self, **kwargs: Any) -> KazooClient:
        client = connect(self.connect_string, **kwargs)
        self._clients.append(client)
        return client

    def expire_session(self, client: KazooClient, *, wait_reconnect: bool = True) -> None:
        expire_session(client, wait_reconnect=wait_reconnect)

    def count_znodes(self, path: str) -> int:
        helper = self.client()
        try:
            return count_znodes(helper, path)
        finally:
            self._clients.remove(helper)
            helper.stop()
            helper.close()

    def stop(self) -> None:
        self.server.stop()

    def kill(self) -> None:
        self.server.kill()

    def start(self) -> None:
        self.server.start()

    def restart(self) -> None:
        self.server.restart()

    def close(self) -> None:
        for client in self._clients:
            client.stop()
            client.close()
        self._clients.clear()


WORKERS = Path(__file__).parent / "workers"
#: the operator's ZooKeeper identity in tests; the session server trusts it as super user
OPERATOR_AUTH = ("zeps-operator", "operator-secret")


class WorkerProcess:
    """A worker script from tests/workers in its own Python process, reporting through a line file."""

    def __init__(self, workdir: Path, script: str, name: str, args: list[str]) -> None:
        self.out = workdir / f"{name}.out"
        self.process = ManagedProcess(
            name,
            [sys.executable, str(WORKERS / script), "--out", str(self.out), *args],
            log_path=workdir / f"{name}.log",
        )

    def start(self, *, ready_timeout: float = 30.0) -> WorkerProcess:
        self.process.start()
        self.process.wait_ready(lambda: "ready" in self.lines(), timeout=ready_timeout)
        return self

    def lines(self) -> list[str]:
        try:
            return self.out.read_text().splitlines()
        except FileNotFoundError:
            return []

    def done_ids(self) -> list[str]:
        """Ids whose callback finished, in the order they finished."""
        return [line.split()[1] for line in self.lines() if line.startswith("done ")]

    def started_ids(self) -> list[str]:
        return [line.split()[1] for line in self.lines() if line.startswith("start ")]

    def kill(self) -> None:
        self.process.kill()

    def stop(self) -> None:
        self.process.stop(grace=10)


class CuttingProxy:
    """A TCP proxy to ZooKeeper that can cut the connection around the next large request.

    ``arm("response")``: the next client request of at least ``min_bytes`` reaches the server, then
    the connection is cut before the server's answer reaches the client (the write applied, the
    client sees ConnectionLoss). ``arm("request")``: that request is dropped and the connection cut
    (nothing applied). Small packets (pings) pass untouched either way. One cut per arm;
    ``skip=n`` lets the next ``n`` large requests through first (so a test can cut at each step).
    ``refusing = True``: new connections are closed at once (the client cannot reconnect until it is
    False again), so a test can act while the client is away, e.g. expire its session.
    """

    def __init__(self, target: tuple[str, int], *, min_bytes: int = 200) -> None:
        self.target = target
        self.min_bytes = min_bytes
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._mode: str | None = None
        self._skip = 0
        self._cut_next_response = False
        self.cuts = 0
        self._lock = threading.Lock()
        self._closed = False
        self._conns: list[socket.socket] = []
        self.refusing = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def arm(self, mode: str, *, skip: int = 0) -> None:
        assert mode in ("request", "response")
        with self._lock:
            self._mode = mode
            self._skip = skip

    def close(self) -> None:
        self._closed = True
        self._listener.close()
        self.drop()

    def drop(self) -> None:
        """Close every connection through the proxy now (with ``refusing``: ZooKeeper is unreachable)."""
        for conn in self._conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                conn.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            if self.refusing:
                client.close()
                continue
            try:
                server = socket.create_connection(self.target)
            except OSError:
                client.close()
                continue
            self._conns += [client, server]
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _cut(self, a: socket.socket, b: socket.socket) -> None:
        self.cuts += 1
        for s in (a, b):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def _pump(self, src: socket.socket, dst: socket.socket, upstream: bool) -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                return
            if not data:
                with contextlib.suppress(OSError):
                    dst.close()
                return
            with self._lock:
                if upstream and self._mode and len(data) >= self.min_bytes:
                    if self._skip:  # a large request let through before the cut
                        self._skip -= 1
                    else:
                        mode, self._mode = self._mode, None
                        if mode == "request":
                            self._cut(src, dst)
                            return
                        self._cut_next_response = True
                elif not upstream and self._cut_next_response:
                    self._cut_next_response = False
                    self._cut(src, dst)
                    return
            try:
                dst.sendall(data)
            except OSError:
                return
