"""zeps's own ZooKeeper client helpers against a real server: deleting a subtree in bounded
transactions, and a client that keeps its session across an outage longer than its timeout
(kazoo's own backoff would let it expire). The server's own behaviour is ZooKeeper's: the session
fixture only checks that it runs (tests/conftest.py)."""

from __future__ import annotations

import time

from harness import ZooKeeperHarness, until


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
