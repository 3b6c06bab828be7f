"""zeps's own ZooKeeper client helpers against a real server: deleting a subtree in bounded
transactions, and a client that keeps its session across an outage longer than its timeout
(kazoo's own backoff would let it expire). The server's own behaviour is ZooKeeper's: the session
fixture only checks that it runs (tests/conftest.py)."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import ConnectionLoss
from kazoo.retry import RetryFailedError

from harness import CuttingProxy, ZooKeeperHarness, until
from zeps.coordination import Topic
from zeps.coordination._util import bounded_retry
from zeps.coordination.admin import ZooKeeperUnavailableError, count_children
from zeps.coordination.client import FailFastClient, connect


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
    time.sleep(12)  # the outage: twice the session timeout
    zookeeper.start()
    back = time.monotonic()
    until(lambda: client.connected, "the client to reconnect", timeout=20)
    reconnected_s = time.monotonic() - back
    assert client.client_id[0] == session, f"the session expired (reconnected after {reconnected_s:.1f} s)"
    assert client.exists(node) is not None, "its ephemeral node is still there"
    assert reconnected_s < 6


@pytest.fixture
def proxy(zookeeper: ZooKeeperHarness) -> Iterator[CuttingProxy]:
    host, port = zookeeper.connect_string.split(":")
    through = CuttingProxy((host, int(port)))
    yield through
    through.close()


def test_a_client_reopening_its_session_gives_up_on_a_server_that_takes_the_connection_and_never_answers(
    zookeeper: ZooKeeperHarness, proxy: CuttingProxy
) -> None:
    """The client's connection drops, and its next one is taken but never answered, as ZooKeeper
    3.9.4 does to a client that connects while it starts (the refused connection is never closed:
    ZOOKEEPER-5051; it failed a CI run of the outage test above). kazoo would wait the whole 6 s
    session timeout for the answer, longer than the session lives after its last ping; zeps's client
    gives up after 2 s, and its next connection, answered, keeps the session."""
    client = connect(proxy.address, session_timeout=6)
    try:
        proxy.silent = True

        def first_attempt_unanswered() -> None:
            until(lambda: proxy.held == 1, "the first attempt to be taken (and never answered)")
            proxy.silent = False

        assert _drop_and_reconnect(client, proxy, meanwhile=first_attempt_unanswered) < 4.0
    finally:
        client.stop()
        client.close()


def test_a_client_gives_up_on_a_server_whose_address_drops_its_connects_and_reaches_the_next_in_time(
    zookeeper: ZooKeeperHarness, proxy: CuttingProxy
) -> None:
    """The first server of the connect string drops every TCP connect unanswered, as the address of
    a machine that is gone does (here a listening socket whose queue is full). kazoo gives one TCP
    connect the whole 6 s session timeout, so after a drop the client would reach the second server,
    which holds its session, too late; zeps's gives up on the first after 2 s."""
    gone = socket.create_server(("127.0.0.1", 0), backlog=0)  # never accepts: its queue fills
    filler = socket.create_connection(gone.getsockname()[:2])
    client = connect(f"127.0.0.1:{gone.getsockname()[1]},{proxy.address}", session_timeout=6)
    try:
        client.randomize_hosts = False  # the gone server first, from the next round on
        _drop_and_reconnect(client, proxy)  # ends this round (its order random): back in the next
        assert _drop_and_reconnect(client, proxy) < 4.0  # a round that starts with the gone server
    finally:
        client.stop()
        client.close()
        filler.close()
        gone.close()


def _drop_and_reconnect(client: KazooClient, proxy: CuttingProxy, meanwhile: Callable[[], None] = lambda: None
                        ) -> float:  # fmt: skip
    """Cut the client's connection through ``proxy`` (``meanwhile`` runs once the client saw it) and
    return the seconds until it was back, in the same session."""
    session = client.client_id[0]
    proxy.drop()
    dropped = time.monotonic()
    until(lambda: not client.connected, "the client to see the drop")
    meanwhile()
    until(lambda: client.connected, "the client to reconnect", timeout=20)
    back_s = time.monotonic() - dropped
    assert client.client_id[0] == session, f"the session expired (reconnected after {back_s:.1f} s)"
    return back_s


def _seconds(call: Callable[[], object], raises: type[BaseException], *, most: float = 10.0) -> float:
    """How long ``call`` took to raise ``raises`` (it must, within ``most`` seconds: it runs in a
    thread, so a call that waits fails the test instead of hanging it)."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
        except BaseException as exc:  # handed to the test
            outcome.append(exc)
        else:
            outcome.append(None)

    started = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(most)
    assert outcome, f"still waiting after {most:.0f} s"
    assert isinstance(outcome[0], raises), f"raised {outcome[0]!r}, not {raises.__name__}"
    return time.monotonic() - started


def test_a_client_made_with_a_call_deadline_fails_its_calls_during_an_outage_instead_of_waiting_for_its_end(
    zookeeper: ZooKeeperHarness,
) -> None:
    """ZooKeeper down: kazoo's own client queues a call until a server answers (it is still waiting
    after 3 s), so no retry deadline bounds it. The operator's (``call_deadline``) fails a plain call
    at once; zeps's bounded retries and kazoo's own (a watch's first read) give up at their deadlines;
    the operator's cleaner sweep (the call a stuck resync pass once held a deletion up on) returns.
    With the server back, both clients carry on in their sessions."""
    from zeps_operator.cleaning import Cleaning  # noqa: PLC0415

    deadline = 2.0
    waiting, failing = zookeeper.client(), zookeeper.client(call_deadline=deadline)
    assert isinstance(failing, FailFastClient) and not isinstance(waiting, FailFastClient)
    sessions = (waiting.client_id[0], failing.client_id[0])
    node = failing.create(f"{zookeeper.root}/n", b"x", makepath=True)
    topic = Topic(failing, "t", namespace="default", chroot=zookeeper.root)
    topic.ensure()
    cleaning = Cleaning(identity="test", leading=lambda: True)
    cleaning.follow(topic)
    zookeeper.stop()
    try:
        until(lambda: not waiting.connected and not failing.connected, "both clients to see the outage")
        queued: dict[str, object] = {}
        waiter = threading.Thread(target=lambda: queued.setdefault("stat", waiting.exists(node)), daemon=True)
        waiter.start()
        waiter.join(3.0)
        assert waiter.is_alive(), "kazoo's own client waits for the server (what call_deadline is for)"

        assert _seconds(lambda: failing.exists(node), ConnectionLoss) < 1.0
        # a retry gives up when its next sleep would pass its deadline: early by up to that sleep (its
        # delay, at most 1 s, times kazoo's jitter of 0.6..1.4: 1.4 s)
        assert 0.2 <= _seconds(lambda: bounded_retry(1.5)(failing.get, node), RetryFailedError) < 3.5
        assert _seconds(lambda: count_children(failing, zookeeper.root, deadline=1.5), ZooKeeperUnavailableError) < 3.5
        kazoos_own = _seconds(lambda: failing.retry(failing.get_children, zookeeper.root), RetryFailedError)
        assert deadline - 1.5 <= kazoos_own < deadline + 2.0
        watch = _seconds(lambda: failing.ChildrenWatch(zookeeper.root, lambda _children: None), RetryFailedError)
        assert watch < deadline + 2.0

        started = time.monotonic()
        assert cleaning.sweep(topic) == []  # its pass failed with a warning; the next one tries again
        assert time.monotonic() - started < 3.0
    finally:
        zookeeper.start()
    until(lambda: waiting.connected and failing.connected, "both clients to reconnect", timeout=30)
    waiter.join(10)
    assert queued["stat"] is not None, "the queued call was answered once the server was back"
    assert (waiting.client_id[0], failing.client_id[0]) == sessions
    assert failing.get(node)[0] == b"x"
    assert cleaning.sweep(topic) == []
