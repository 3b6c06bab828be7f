"""Topic against a real ZooKeeper server, with subscribers in separate processes."""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kazoo.exceptions import NoAuthError

from harness import CuttingProxy, WorkerProcess, ZooKeeperHarness, until
from zeps.coordination import Message, NoSubscribersError, QueueFullError, Topic, connect
from zeps.envelope import decode_node
from zeps.errors import CoordinationError
from zeps.options import TopicOptions


class Collector:
    """An in-process callback that records what it saw."""

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.lock = threading.Lock()

    def __call__(self, message: Message) -> None:
        with self.lock:
            self.messages.append(message)

    @property
    def bodies(self) -> list[bytes]:
        with self.lock:
            return [m.body for m in self.messages]


@pytest.fixture
def topic_factory(zookeeper: ZooKeeperHarness) -> Iterator[Callable[..., Topic]]:
    made: list[Topic] = []

    def make(name: str = "events", **options: object) -> Topic:
        client = zookeeper.client()
        topic = Topic(client, name, chroot=zookeeper.root, options=TopicOptions.make(**options))
        made.append(topic)
        return topic

    yield make
    for topic in made:
        topic.close()


def _subscriber(
    zookeeper: ZooKeeperHarness, tmp_path: Path, consumer: str, *extra: str, run: str = ""
) -> WorkerProcess:
    """A subscriber process; ``run`` tells apart two runs with the same consumer id (own output file)."""
    args = ["--hosts", zookeeper.connect_string, "--chroot", zookeeper.root, "--topic", "events"]
    return WorkerProcess(tmp_path, "topic_subscriber.py", consumer + run, [*args, "--consumer", consumer, *extra])


def _publisher_order_kept(ids: list[str]) -> bool:
    """Per publisher, the message counters appear in increasing order."""
    last: dict[str, int] = {}
    for msg_id in ids:
        publisher, n = msg_id.rsplit(".", 1)
        if int(n) <= last.get(publisher, 0):
            return False
        last[publisher] = int(n)
    return True


def test_subscribers_in_separate_processes_all_receive_everything_in_order(
    zookeeper: ZooKeeperHarness, tmp_path: Path, topic_factory: Callable[..., Topic]
) -> None:
    subs = [_subscriber(zookeeper, tmp_path, f"sub-{i}").start() for i in range(3)]
    try:
        publishers = [topic_factory(), topic_factory()]
        until(lambda: len(publishers[0].queues()) == 3, "three queues", 10)
        sent: list[str] = []
        lock = threading.Lock()

        def publish(topic: Topic, tag: str) -> None:
            for i in range(150):
                if i % 3 == 0:
                    ids = topic.publish_many([f"{tag}-{i}-{j}".encode() for j in range(3)])
                else:
                    ids = [topic.publish_async(f"{tag}-{i}".encode()).result(30)]
                with lock:
                    sent.extend(ids)

        threads = [threading.Thread(target=publish, args=(p, f"p{n}")) for n, p in enumerate(publishers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        until(lambda: all(len(s.done_ids()) >= len(sent) for s in subs), "every subscriber to see everything", 60)
        for sub in subs:
            got = sub.done_ids()
            assert sorted(got) == sorted(sent), f"{sub.out.name} lost or duplicated messages"
            assert _publisher_order_kept(got), f"{sub.out.name} saw a publisher's messages out of order"
    finally:
        for sub in subs:
            sub.stop()


@pytest.mark.parametrize("per_node", [1, 10])
def test_kill9_mid_callback_then_restart_with_same_identity_loses_nothing(
    zookeeper: ZooKeeperHarness, tmp_path: Path, topic_factory: Callable[..., Topic], per_node: int
) -> None:
    slow = _subscriber(zookeeper, tmp_path, "steady", "--sleep", "0.05", "--session-timeout", "2",
                       "--hold-at", "15").start()  # fmt: skip
    publisher = topic_factory(max_messages_per_node=per_node)
    until(lambda: publisher.queues() == {"steady"}, "the queue", 10)
    sent = publisher.publish_many([f"m{i}".encode() for i in range(60)])
    until(lambda: "holding" in slow.lines(), "the 15th callback to stop", 30)
    slow.kill()  # kill -9 inside that callback: it said so, and never returns
    lines = slow.lines()
    assert len(lines) >= 2 and lines[-2].startswith("start ") and lines[-1] == "holding", lines[-3:]
    in_flight = lines[-2].split()[1]
    sent += publisher.publish_many([f"late{i}".encode() for i in range(10)])  # while it is down

    again = _subscriber(zookeeper, tmp_path, "steady", "--session-timeout", "2", run="-restarted").start()
    try:
        until(lambda: set(again.done_ids()) | set(slow.done_ids()) >= set(sent), "every message after restart", 60)
        assert in_flight in again.done_ids(), "the message killed mid-callback was not redelivered"
        # at-least-once, bounded: only the node in flight (messages packed with the one killed
        # mid-callback) and nodes whose ack was still on its way (acks go out at least every 50 ms,
        # each message takes 50 ms here) may come again
        position = sent.index(in_flight)
        node_in_flight = set(sent[position - position % per_node : position - position % per_node + per_node])
        both = slow.done_ids() + again.done_ids()
        dupes = {m for m, n in collections.Counter(both).items() if n > 1}
        allowed = node_in_flight | set(slow.done_ids()[-3:])
        assert dupes <= allowed, f"redelivered more than the node in flight: {sorted(dupes - allowed)}"
    finally:
        again.stop()


def test_cleaner_removes_the_queue_of_a_subscriber_that_never_returns(
    zookeeper: ZooKeeperHarness, tmp_path: Path, topic_factory: Callable[..., Topic]
) -> None:
    publisher = topic_factory(cleaner_grace=1.0, cleaner_interval=0.5)
    cleaner = publisher.cleaner().start()
    gone = _subscriber(zookeeper, tmp_path, "gone", "--session-timeout", "2").start()
    try:
        until(lambda: publisher.queues() == {"gone"}, "the queue", 10)
        publisher.publish_many([b"a", b"b"])
        until(lambda: len(gone.done_ids()) == 2, "delivery", 10)
        publisher.publish(b"never read")
        gone.kill()
        until(lambda: publisher.queues() == frozenset(), "the cleaner to remove the dead queue", 30)
        assert cleaner.removed == ["gone"]
        assert cleaner.is_leader
        assert zookeeper.count_znodes(publisher.paths.messages) == 0
    finally:
        cleaner.stop()


def test_a_cleaner_following_a_new_handle_keeps_counting_the_grace(
    topic_factory: Callable[..., Topic],
) -> None:
    """Passes run by hand (the operator's timer does this), on the test's clock: the grace counts from
    the first pass that missed the consumer, also after the cleaner follows a handle with new options;
    a handle on another topic is refused."""
    topic = topic_factory(cleaner_grace=1.5)
    sub = topic.subscribe(lambda _m: None, consumer_id="leaving")
    sub.close()  # left the group, its queue stays
    now = [100.0]
    cleaner = topic.cleaner(clock=lambda: now[0])
    assert cleaner.clean_once() == []  # first missed now
    assert cleaner.next_due() == 101.5
    now[0] += 1.0
    cleaner.follow(topic_factory(cleaner_grace=1.5, batch_size=50))
    assert cleaner.clean_once() == []  # 1.0 s < 1.5 s
    now[0] += 0.49
    assert cleaner.clean_once() == []  # 1.49 s
    now[0] += 0.01
    assert cleaner.clean_once() == ["leaving"]
    assert topic.queues() == frozenset()
    with pytest.raises(ValueError, match="cannot follow"):
        cleaner.follow(topic_factory("other"))


def test_killing_the_cleaner_hands_over_to_another_instance(
    zookeeper: ZooKeeperHarness, tmp_path: Path, topic_factory: Callable[..., Topic]
) -> None:
    first = _subscriber(
        zookeeper, tmp_path, "cleaner-a", "--cleaner", "--no-subscribe", "--session-timeout", "2"
    ).start()
    until(lambda: "leader" in first.lines(), "the first cleaner to lead", 20)
    standby_topic = topic_factory(cleaner_grace=0.5, cleaner_interval=0.5)
    standby = standby_topic.cleaner(identifier="cleaner-b").start()
    try:
        election = standby_topic.client.Election(standby_topic.paths.cleaner)
        until(lambda: "cleaner-b" in election.contenders(), "the standby in the cleaners' election", 20)
        assert election.contenders()[0] == "cleaner-a"  # the first leads; the standby waits its turn
        assert not standby.is_leader, "two cleaners led at once"
        first.kill()
        until(lambda: standby.is_leader, "the standby cleaner to take over", 30)
        # and it cleans: a queue without a client disappears
        standby_topic.client.create(standby_topic.paths.queue("orphan"), makepath=True)
        until(lambda: "orphan" in standby.removed, "the new leader to clean", 20)
    finally:
        standby.stop()


def test_session_expiry_subscriber_rejoins_and_keeps_receiving(
    zookeeper: ZooKeeperHarness, topic_factory: Callable[..., Topic]
) -> None:
    sub_topic, publisher = topic_factory(), topic_factory()
    seen = Collector()
    with sub_topic.subscribe(seen, consumer_id="phoenix") as subscription:
        publisher.publish(b"before")
        until(lambda: seen.bodies == [b"before"], "first delivery", 10)
        zookeeper.expire_session(sub_topic.client, wait_reconnect=False)
        publisher.publish(b"during")  # the queue is durable: nothing is lost in the gap
        until(lambda: all(m.joined for m in subscription._memberships), "rejoin", 20)
        assert "phoenix" in publisher.subscribers()
        publisher.publish(b"after")
        until(lambda: seen.bodies == [b"before", b"during", b"after"], "delivery after rejoin", 20)


def test_zookeeper_restart_loses_nothing_over_2000_messages(
    zookeeper: ZooKeeperHarness, tmp_path: Path, topic_factory: Callable[..., Topic]
) -> None:
    subs = [_subscriber(zookeeper, tmp_path, f"r{i}", "--session-timeout", "20").start() for i in range(2)]
    publisher = topic_factory()
    try:
        until(lambda: len(publisher.queues()) == 2, "queues", 10)
        futures = []
        for i in range(2000):
            futures.append(publisher.publish_async(f"n{i}".encode()))
            if i == 1000:
                zookeeper.restart()
        ids = [f.result(120) for f in futures]
        until(lambda: all(set(s.done_ids()) >= set(ids) for s in subs), "all 2000 messages at both", 120)
        for sub in subs:
            got = sub.done_ids()
            assert set(got) == set(ids), "lost or foreign messages"
            first_seen = list(dict.fromkeys(got))
            assert _publisher_order_kept(first_seen)
    finally:
        for sub in subs:
            sub.stop()


@pytest.mark.parametrize("cut", ["response", "request"])
def test_connection_loss_during_publish_never_duplicates(zookeeper: ZooKeeperHarness, cut: str) -> None:
    host, port = zookeeper.connect_string.split(":")
    proxy = CuttingProxy((host, int(port)))
    try:
        client = connect(proxy.address)
        try:
            topic = Topic(client, "events", chroot=zookeeper.root)
            reader = zookeeper.client()
            for consumer in ("a", "b"):
                reader.create(topic.paths.queue(consumer), makepath=True)
            until(lambda: len(topic.queues()) == 2, "queues", 10)
            proxy.arm(cut)
            ids = topic.publish_many([b"x" * 100 for _ in range(5)])
            assert proxy.cuts == 1, "the proxy did not cut the connection"
            for consumer in ("a", "b"):
                queue = topic.paths.queue(consumer)
                stored = [e.id for n in reader.get_children(queue) for e in decode_node(reader.get(f"{queue}/{n}")[0])]
                assert collections.Counter(stored) == dict.fromkeys(ids, 1), f"queue {consumer}: {stored}"
        finally:
            client.stop()
            client.close()
    finally:
        proxy.close()


def test_publish_async_holds_at_most_max_async_pending_while_zookeeper_is_away(zookeeper: ZooKeeperHarness) -> None:
    """publish_async queued without bound: a publisher faster than ZooKeeper (or ZooKeeper away) grew
    the handle's memory forever. At most max_async_pending wait; one more waits block_timeout, then
    QueueFullError."""
    host, port = zookeeper.connect_string.split(":")
    proxy = CuttingProxy((host, int(port)))
    client = connect(proxy.address)
    try:
        options = TopicOptions.make(max_async_pending=3, block_timeout=0.5)
        topic = Topic(client, "events", chroot=zookeeper.root, options=options)
        zookeeper.client().create(topic.paths.queue("a"), makepath=True)
        until(lambda: len(topic.queues()) == 1, "queues", 10)
        proxy.refusing = True
        proxy.drop()  # ZooKeeper is away: nothing becomes durable
        held = [topic.publish_async(b"%d" % i) for i in range(3)]
        with pytest.raises(QueueFullError, match="max_async_pending"):
            topic.publish_async(b"one too many")
        proxy.refusing = False  # back: what was held goes out
        assert [f.result(60) for f in held] == [f"{topic.client_id}.{i}" for i in (1, 2, 3)]
        topic.close()
    finally:
        client.stop()
        client.close()
        proxy.close()


def test_a_closed_topic_handle_stops_watching_the_queue_list(zookeeper: ZooKeeperHarness) -> None:
    """Each handle watched the queue list forever: handles made and closed on a shared client piled up
    watches (and kept every handle alive). After close() the watch ends at its next event."""
    client = zookeeper.client()
    listeners = len(client.state_listeners)
    topic = Topic(client, "events", chroot=zookeeper.root)
    assert topic.queues() == frozenset()
    assert len(client.state_listeners) == listeners + 1  # the watch follows the session
    topic.close()
    zookeeper.client().create(topic.paths.queue("late"), makepath=True)  # the watch's next event
    until(lambda: len(client.state_listeners) == listeners, "the watch to end", 10)
    with pytest.raises(CoordinationError, match="closed"):
        topic.queues()


def test_no_subscribers(topic_factory: Callable[..., Topic]) -> None:
    with pytest.raises(NoSubscribersError):
        topic_factory().publish(b"hello?")
    assert topic_factory(no_subscribers="ignore").publish(b"hello?")


def test_full_queue_policies(topic_factory: Callable[..., Topic], zookeeper: ZooKeeperHarness) -> None:
    # one node per message: depth and drops are exact per message
    failing = topic_factory("bounded", max_queue_depth=5, full_queue_policy="fail", max_messages_per_node=1)
    failing.client.create(failing.paths.queue("idle"), makepath=True)
    failing.publish_many([b"%d" % i for i in range(5)])
    with pytest.raises(QueueFullError, match="idle"):
        failing.publish(b"one too many")

    dropping = topic_factory("bounded", max_queue_depth=5, full_queue_policy="drop-oldest", max_messages_per_node=1)
    dropping.publish_many([b"5", b"6"])
    reader = zookeeper.client()
    names = sorted(reader.get_children(dropping.paths.queue("idle")), key=lambda n: int(n[-10:]))
    bodies = [reader.get(f"{dropping.paths.queue('idle')}/{n}")[0][-1:] for n in names]
    assert bodies == [b"2", b"3", b"4", b"5", b"6"], "drop-oldest must keep the newest max_queue_depth"

    blocking = topic_factory("bounded", max_queue_depth=5, full_queue_policy="block", block_timeout=0.5,
                             max_messages_per_node=1)  # fmt: skip
    started = time.monotonic()
    with pytest.raises(QueueFullError, match="after waiting"):
        blocking.publish(b"7")
    assert time.monotonic() - started >= 0.5
    # a consumer draining the queue unblocks the publisher
    blocking_long = topic_factory("bounded", max_queue_depth=5, full_queue_policy="block", block_timeout=30,
                                  max_messages_per_node=1)  # fmt: skip
    done = threading.Event()
    threading.Thread(target=lambda: (blocking_long.publish(b"8"), done.set()), daemon=True).start()
    assert not done.wait(0.3), "the publish to a full queue returned at once"
    seen = Collector()
    with topic_factory("bounded").subscribe(seen, consumer_id="idle"):
        assert done.wait(20), "publisher stayed blocked after the queue drained"
        until(lambda: seen.bodies[-1:] == [b"8"], "the blocked message", 10)


def test_depth_counts_messages_in_packed_nodes(
    topic_factory: Callable[..., Topic], zookeeper: ZooKeeperHarness
) -> None:
    packed = topic_factory("packed", max_queue_depth=25, full_queue_policy="fail", max_messages_per_node=10)
    packed.client.create(packed.paths.queue("idle"), makepath=True)
    packed.publish_many([b"%d" % i for i in range(20)])  # two nodes of ten
    assert zookeeper.count_znodes(packed.paths.queue("idle")) == 2
    packed.publish_many([b"a", b"b", b"c", b"d", b"e"])  # 25: exactly full
    with pytest.raises(QueueFullError, match=r"idle \(25/25\)"):
        packed.publish(b"one too many")
    dropping = topic_factory("packed", max_queue_depth=25, full_queue_policy="drop-oldest", max_messages_per_node=10)
    dropping.publish_many([b"x", b"y"])  # drops whole nodes, oldest first, until the batch fits
    reader = zookeeper.client()
    queue = dropping.paths.queue("idle")
    kept = [e.body for n in sorted(reader.get_children(queue), key=lambda n: int(n[-10:]))
            for e in decode_node(reader.get(f"{queue}/{n}")[0])]  # fmt: skip
    assert kept == [b"%d" % i for i in range(10, 20)] + [b"a", b"b", b"c", b"d", b"e", b"x", b"y"]


def test_callback_errors_are_retried_then_dropped_or_parked(
    topic_factory: Callable[..., Topic], zookeeper: ZooKeeperHarness
) -> None:
    attempts: collections.Counter[bytes] = collections.Counter()

    def flaky(message: Message) -> None:
        attempts[message.body] += 1
        if message.body == b"poison" or (message.body == b"wobbly" and message.attempt < 2):
            raise RuntimeError("boom")

    for policy in ("drop", "keep"):
        attempts.clear()
        topic = topic_factory(f"flaky-{policy}", max_attempts=3, retry_backoff=0.01, on_give_up=policy)
        with topic.subscribe(flaky, consumer_id="c") as sub:
            topic.publish_many([b"wobbly", b"poison", b"fine"])
            until(lambda: attempts[b"fine"] == 1, "the message after the poison one", 10)
        assert attempts == {b"wobbly": 2, b"poison": 3, b"fine": 1}
        assert sub.delivered == 2
        parked = f"{topic.paths.root}/parked/c"
        if policy == "drop":
            assert sub.dropped == 1 and zookeeper.count_znodes(parked) == 0
        else:
            assert sub.parked == 1 and zookeeper.count_znodes(parked) == 1
        assert zookeeper.count_znodes(topic.paths.queue("c")) == 0


def test_digest_acls_keep_other_users_out(zookeeper: ZooKeeperHarness) -> None:
    owner = zookeeper.client(auth=("shop", "s3cret"))
    stranger = zookeeper.client()
    topic = Topic(owner, "private", chroot=f"{zookeeper.root}-acl")
    seen = Collector()
    cleaner = topic.cleaner().start()
    try:
        with topic.subscribe(seen, consumer_id="c"):
            topic.publish(b"for shop only")
            until(lambda: seen.bodies == [b"for shop only"], "delivery to the owner", 10)
            until(lambda: cleaner.is_leader, "the cleaner to lead", 10)
            # every node the SDK made, kazoo's election nodes included, is the owner's alone
            walk = [topic.paths.root]
            while walk:
                path = walk.pop()
                acl, _ = owner.get_acls(path)
                assert [(a.id.scheme, a.id.id.split(":")[0]) for a in acl] == [("digest", "shop")], path
                walk += [f"{path}/{child}" for child in owner.get_children(path)]
            with pytest.raises(NoAuthError):
                stranger.get_children(topic.paths.queue("c"))
            with pytest.raises(NoAuthError):
                stranger.create(f"{topic.paths.queue('c')}/m-forged-", b"x", sequence=True)
    finally:
        cleaner.stop()


def test_message_headers_travel(topic_factory: Callable[..., Topic]) -> None:
    topic = topic_factory()
    seen = Collector()
    with topic.subscribe(seen, consumer_id="c"):
        msg_id = topic.publish(b"{}", headers={"trace": "abc"}, content_type="application/json")
        until(lambda: len(seen.messages) == 1, "delivery", 10)
    m = seen.messages[0]
    assert (m.id, m.headers, m.content_type) == (msg_id, {"trace": "abc"}, "application/json")
    assert m.publisher == topic.client_id
    assert abs(m.timestamp_ms / 1000 - time.time()) < 60


def test_unsubscribe_removes_subscription_client_and_queue(
    topic_factory: Callable[..., Topic], zookeeper: ZooKeeperHarness
) -> None:
    topic = topic_factory()
    sub = topic.subscribe(Collector(), consumer_id="leaver", metadata={"pod": "web-1"})
    assert topic.subscribers()["leaver"].metadata["pod"] == "web-1"
    assert topic.client.exists(topic.paths.clients.member("leaver")) is not None
    sub.unsubscribe()
    assert topic.subscribers() == {}
    assert topic.client.exists(topic.paths.clients.member("leaver")) is None
    assert topic.client.exists(topic.paths.queue("leaver")) is None
    until(lambda: topic.queues() == frozenset(), "publishers to stop seeing the queue", 10)
