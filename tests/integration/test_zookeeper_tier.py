"""The ZooKeeper tier is real: a ZooKeeper server process on 127.0.0.1, driven through kazoo."""

from __future__ import annotations

import threading
import time

import pytest
from kazoo.exceptions import NoNodeError
from kazoo.protocol.states import EventType, WatchedEvent

from harness import ZooKeeperHarness, until
from zeps_dev import ZooKeeperServer


def test_create_watch_delete(zookeeper: ZooKeeperHarness) -> None:
    client = zookeeper.client()
    path = f"{zookeeper.root}/greeting"
    client.create(path, b"hello", makepath=True)

    events: list[WatchedEvent] = []
    fired = threading.Event()

    def watch(event: WatchedEvent) -> None:
        events.append(event)
        fired.set()

    data, stat = client.get(path, watch=watch)
    assert data == b"hello" and stat.version == 0

    other = zookeeper.client()  # a change made by another session fires this session's watch
    other.set(path, b"bonjour")
    assert fired.wait(10), "data watch did not fire"
    assert events[0].type == EventType.CHANGED and events[0].path == path

    fired.clear()
    client.exists(path, watch=watch)
    other.delete(path)
    assert fired.wait(10), "exists watch did not fire on delete"
    assert events[-1].type == EventType.DELETED
    assert client.exists(path) is None


def test_ephemeral_node_vanishes_on_session_expiry(zookeeper: ZooKeeperHarness) -> None:
    owner, observer = zookeeper.client(), zookeeper.client()
    path = f"{zookeeper.root}/member"
    owner.create(path, b"alive", ephemeral=True, makepath=True)
    assert observer.exists(path) is not None
    old_session = owner.client_id[0]

    zookeeper.expire_session(owner)

    assert observer.exists(path) is None, "ephemeral node survived its session"
    assert owner.client_id[0] != old_session, "client did not get a new session"
    assert owner.connected


def test_restart_keeps_data_and_port(zookeeper: ZooKeeperHarness) -> None:
    client = zookeeper.client()
    path = f"{zookeeper.root}/durable"
    client.create(path, b"kept", makepath=True)
    address = zookeeper.connect_string

    zookeeper.restart()

    assert zookeeper.connect_string == address
    fresh = zookeeper.client()
    assert fresh.get(path)[0] == b"kept"


def test_count_znodes(zookeeper: ZooKeeperHarness) -> None:
    client = zookeeper.client()
    for name in ("a", "a/b", "a/c", "d"):
        client.create(f"{zookeeper.root}/tree/{name}", makepath=True)
    assert zookeeper.count_znodes(f"{zookeeper.root}/tree") == 4
    assert zookeeper.count_znodes(f"{zookeeper.root}/nothing-here") == 0
    with pytest.raises(NoNodeError):
        client.get_children(f"{zookeeper.root}/nothing-here")


def test_four_letter_metrics(zookeeper: ZooKeeperHarness) -> None:
    metrics = zookeeper.server.metrics()
    assert metrics["zk_server_state"] == "standalone"
    assert int(metrics["zk_packets_received"]) > 0


def test_server_binds_loopback_only(zookeeper_server: ZooKeeperServer) -> None:
    config = (zookeeper_server.workdir / "zoo.cfg").read_text()
    assert "clientPortAddress=127.0.0.1" in config


def test_delete_tree_removes_nested_subtrees(zookeeper: ZooKeeperHarness) -> None:
    from zeps.coordination._util import delete_tree  # noqa: PLC0415

    client = zookeeper.client()
    root = f"{zookeeper.root}/deep"
    for path in ("a/b/c", "a/b/d", "e", "f/g"):
        client.create(f"{root}/{path}", makepath=True)
    for i in range(600):  # more than one transaction's worth at one level
        client.create(f"{root}/many/n{i}", makepath=True)
    delete_tree(client, root)
    assert client.exists(root) is None


def test_a_client_reconnects_in_time_to_keep_its_session_after_a_long_outage(zookeeper: ZooKeeperHarness) -> None:
    """ZooKeeper is down for 12 s, twice the client's 6 s session timeout, and every reconnect fails
    at once (connection refused). Once the server is back, whose restart restores the sessions with a
    fresh timeout, the client must try again within the session timeout: its backoff is bounded by a
    third of it (kazoo's own grows to an hour, and after 12 s of failures would sleep for about 13
    more, and the session would expire)."""
    client = zookeeper.client(session_timeout=6)
    session = client.client_id[0]
    node = client.create(f"{zookeeper.root}/still-here", ephemeral=True, makepath=True)
    zookeeper.stop()
    time.sleep(12)
    zookeeper.start()
    back = time.monotonic()
    until(lambda: client.connected, "the client to reconnect", timeout=20)
    reconnected_s = time.monotonic() - back
    assert client.client_id[0] == session, f"the session expired (reconnected after {reconnected_s:.1f} s)"
    assert client.exists(node) is not None, "its ephemeral node is still there"
    assert reconnected_s < 6
