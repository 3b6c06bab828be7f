"""Test harness objects shared by the fixtures in conftest.py (importable as ``harness``)."""

from __future__ import annotations

from typing import Any

from kazoo.client import KazooClient

from zeps.coordination import connect
from zeps.coordination.testing import count_znodes, expire_session
from zeps.dev import ZooKeeperServer


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
