"""ZEPS broker and clients over real ZeroMQ sockets on 127.0.0.1 (and a real ZooKeeper for groups)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
import zmq.auth
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kazoo.exceptions import NoAuthError
from kazoo.security import OPEN_ACL_UNSAFE

from harness import OPERATOR_AUTH, ZooKeeperHarness, next_millisecond
from zeps._records import encode_record
from zeps.broker import BrokerConfig, BrokerServer, CurveConfig, Registration
from zeps.client import AsyncStreamClient, BrokerUnavailableError, Seq, StreamClient, Time, discover
from zeps.coordination import Group, digest_acl
from zeps.errors import ConfigError, ProtocolError
from zeps.journal import JournalConfig
from zeps.paths import StreamPaths
from zeps.protocol import (
    LATEST,
    Attach,
    AttachOk,
    Credit,
    Deliver,
    DeliverBatch,
    DeliverRun,
    Invalid,
    InvalidCode,
    Publish,
    PublishBatch,
    Refusal,
    Subscribe,
    SubscribeOk,
    SubscribeTime,
    decode,
    encode,
    encode_publish_batch,
)
from zeps_dev.process import free_port, wait_until

BrokerFactory = Callable[..., BrokerServer]


@pytest.fixture
def broker_factory(tmp_path: Path) -> Iterator[BrokerFactory]:
    made: list[BrokerServer] = []

    def make(*streams: str, journal: JournalConfig | None = None, **kwargs: Any) -> BrokerServer:
        settings_ = {k: kwargs.pop(k) for k in ("heartbeat_s", "ttl_s", "pump_budget_bytes", "matching") if k in kwargs}
        config = BrokerConfig(tmp_path / f"broker-{len(made)}", streams or ("prices",),
                              journal=journal or JournalConfig(fsync="group"), **settings_)  # fmt: skip
        server = BrokerServer(config, **kwargs).start()
        made.append(server)
        return server

    yield make
    for server in made:
        server.stop()


def _publish(endpoint: str, n: int, *, key: str = "eu.fr.cac40", start: int = 0, stream: str = "prices") -> None:
    with StreamClient(endpoint, stream) as pub:
        for i in range(start, start + n):
            pub.publish(key if "{" not in key else key.format(i=i), b"%d" % i)
        pub.flush()


def _collect(client: StreamClient, n: int, timeout: float = 30) -> list[Any]:
    out = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        message = client.receive(0.5)
        if message is not None:
            out.append(message)
    return out


def _assert_contiguous(sequences: list[int], first: int = 1) -> None:
    assert sequences == list(range(first, first + len(sequences))), "gap or duplicate in sequences"


def test_late_joiner_replays_history_then_continues_live_with_no_gap(broker_factory: BrokerFactory) -> None:
    broker = broker_factory()
    _publish(broker.endpoint, 3000)
    with StreamClient(broker.endpoint, "prices") as late:
        late.start("", since="earliest")
        feeder = threading.Thread(target=_publish, args=(broker.endpoint, 2000), kwargs={"start": 3000})
        feeder.start()  # live traffic while it replays
        got = _collect(late, 5000)
        feeder.join()
    _assert_contiguous([m.sequence for m in got])
    assert [m.body for m in got] == [b"%d" % i for i in range(5000)]
    assert all(m.timestamp_ms for m in got)


def test_slow_consumer_falls_back_to_the_journal_and_catches_up(broker_factory: BrokerFactory) -> None:
    """A live subscriber with little credit falls behind a fast publisher: the broker stops routing to
    it live, serves it from the journal as its credit allows, and it ends up live again with every
    message, in order, none twice."""
    broker = broker_factory()
    stream = broker.core.streams["prices"]
    # ~30 messages of credit
    with StreamClient(broker.endpoint, "prices", credit_window=4096, max_message_bytes=1024) as slow:
        slow.start("")
        wait_until(lambda: stream.live_set, timeout=5, what="the subscription to be live")
        _publish(broker.endpoint, 2000)  # arrives far faster than the credit allows
        first = _collect(slow, 100)
        # fallen behind: the broker keeps the cursor, sends nothing without credit
        wait_until(lambda: not stream.live_set, timeout=5, what="the subscription out of credit, off the live path")
        rest = _collect(slow, 1900)
        got = first + rest
        assert len(got) == 2000, f"{len(got)} of 2000 messages arrived"
        _assert_contiguous([m.sequence for m in got])
        assert [m.body for m in got] == [b"%d" % i for i in range(2000)]
        # it really fell back to the journal, and caught up: live again, nothing left to replay
        assert stream.fell_behind >= 1
        assert stream.messages_replayed >= 1000, f"only {stream.messages_replayed} messages came from the journal"
        wait_until(lambda: stream.live_set, timeout=5, what="the caught-up subscription to be live again")
        assert [sub.lag for _, sub in broker.core.lag("prices")[1]] == [0]


def test_a_window_under_twice_the_largest_record_never_waits_for_credit_that_cannot_come(
    broker_factory: BrokerFactory,
) -> None:
    """The smallest window a client may ask for (its largest message and a delivery's overhead):
    records of mixed sizes leave the broker with credit above half the window yet short of the next
    record. The client gave credit back only once half its window was taken, so both waited for
    ever; it now gives it back once the window less the largest delivery was taken, whatever is
    left the next record fits."""
    broker = broker_factory()
    sizes = [940 + (i * 37) % 61 for i in range(40)]  # 940-1000 bytes: two never fit in the window
    with StreamClient(broker.endpoint, "prices") as publisher:
        publisher.publish_many(("k", bytes(size)) for size in sizes)
        publisher.flush()
    with StreamClient(broker.endpoint, "prices", max_message_bytes=1000, credit_window=1000 + 1024) as tight:
        tight.start("", since="earliest")
        got = _collect(tight, len(sizes), timeout=10)
    assert [len(m.body) for m in got] == sizes


def test_retention_removes_old_segments(broker_factory: BrokerFactory, tmp_path: Path) -> None:
    journal = JournalConfig(fsync="always", segment_bytes=4096, retention_bytes=16384)
    broker = broker_factory(journal=journal)
    _publish(broker.endpoint, 2000)
    wait_until(lambda: len(list((tmp_path / "broker-0" / "prices").glob("*.log"))) <= 5, timeout=10,
               what="retention to remove segments")  # fmt: skip
    with StreamClient(broker.endpoint, "prices") as late:
        late.start("", since="earliest")
        got = _collect(late, 2000, timeout=3)
    assert got and got[0].sequence > 1, "the oldest records are gone"
    _assert_contiguous([m.sequence for m in got], first=got[0].sequence)
    assert got[-1].sequence == 2000


def test_prefix_regex_and_resume_from_a_sequence(broker_factory: BrokerFactory) -> None:
    broker = broker_factory()
    _publish(broker.endpoint, 300, key="eu.{i}")
    with StreamClient(broker.endpoint, "prices") as c:
        c.start("~^eu\\.1[0-9]$", since="earliest")
        got = _collect(c, 10)
    assert [m.key for m in got] == [f"eu.{i}" for i in range(10, 20)]
    with StreamClient(broker.endpoint, "prices") as c:
        c.start("eu.29", since=Seq(250))
        got = _collect(c, 9, timeout=5)
    assert [m.key for m in got] == [f"eu.{i}" for i in range(290, 299)]


def test_replay_from_a_time(broker_factory: BrokerFactory) -> None:
    broker = broker_factory()
    _publish(broker.endpoint, 100)
    next_millisecond()  # the broker stamps records in milliseconds: ``middle`` falls between two
    middle = time.time()
    next_millisecond()  # (and after it, the next records' stamps)
    _publish(broker.endpoint, 50, start=100)
    with StreamClient(broker.endpoint, "prices") as c:
        c.start("", since=Time(middle))
        got = _collect(c, 50)
    assert got[0].sequence == 101 and len(got) == 50
    assert all(m.timestamp_ms >= middle * 1000 for m in got)  # type: ignore[operator]


def test_bad_patterns_and_unknown_streams_are_refused(broker_factory: BrokerFactory) -> None:
    broker = broker_factory()
    with StreamClient(broker.endpoint, "prices") as c:
        c.start("~(a)\\1")  # a backreference needs a backtracking engine: refused
        with pytest.raises(ProtocolError, match="not a valid regular expression for RE2"):
            c.receive(2)
    with pytest.raises(BrokerUnavailableError, match="not served by this broker"):
        StreamClient(broker.endpoint, "nope", timeout=3).connect()
    with pytest.raises(ConfigError, match="tcp://host:port"):
        StreamClient("localhost:5555", "prices")


def test_a_catastrophic_regex_subscription_does_not_stall_the_broker(broker_factory: BrokerFactory) -> None:
    """``~(.|..)*x`` made a backtracking matcher take seconds per 40-character key on the broker's one
    thread (tried: 40 such publishes were not confirmed within 20 s, and nobody was served). With RE2
    the subscriber gets its matches and the publisher's confirmations come as usual."""
    broker = broker_factory()
    with StreamClient(broker.endpoint, "prices", timeout=10) as subscriber:
        subscriber.start("~(.|..)*x")
        keys = ["a" * 39 + ("x" if i % 2 else "y") for i in range(40)]
        with StreamClient(broker.endpoint, "prices", timeout=10) as publisher:
            wait_until(lambda: broker.core.subscriptions("prices")[0] == 1, timeout=5, what="the subscription")
            for key in keys:
                publisher.publish(key, b"v")
            publisher.flush()
        got = _collect(subscriber, 20, timeout=10)
    assert [m.key for m in got] == [k for k in keys if k.endswith("x")]


def test_a_prefix_only_broker_refuses_regex_subscriptions_and_keeps_serving(broker_factory: BrokerFactory) -> None:
    """matching: prefix (the ZepsStream field, --matching): a ~regex subscription gets INVALID naming
    the setting; prefix subscriptions on the same broker still work."""
    broker = broker_factory(matching="prefix")
    with StreamClient(broker.endpoint, "prices") as c:
        c.start("~eu\\..*")
        with pytest.raises(ProtocolError, match=r"accepts key prefixes only \(matching: prefix\)"):
            c.receive(2)
    with StreamClient(broker.endpoint, "prices") as c:
        c.start("eu.")
        _publish(broker.endpoint, 3, key="us.{i}")
        _publish(broker.endpoint, 3, key="eu.{i}")
        assert [m.key for m in _collect(c, 3)] == ["eu.0", "eu.1", "eu.2"]
    regex_broker = broker_factory()  # the default, prefix-and-regex, takes it
    _publish(regex_broker.endpoint, 2, key="eu.{i}")
    with StreamClient(regex_broker.endpoint, "prices") as c:
        c.start("~eu\\..*", since="earliest")
        assert len(_collect(c, 2)) == 2


class RawPeer:
    """A DEALER speaking raw frames, like a peer built from the grammar alone."""

    def __init__(self, endpoint: str) -> None:
        self.ctx: zmq.Context[Any] = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.connect(endpoint)

    def send(self, frame: bytes) -> None:
        self.sock.send(frame)

    def recv(self, timeout: float = 2.0) -> Any:
        if not self.sock.poll(int(timeout * 1000)):
            return None
        return decode(self.sock.recv())

    def drain(self, timeout: float = 0.3) -> list[Any]:
        out = []
        while (cmd := self.recv(timeout)) is not None:
            out.append(cmd)
        return out

    def close(self) -> None:
        self.sock.close()
        self.ctx.term()


def test_version_1_peer_gets_plain_deliver_and_never_the_extension(broker_factory: BrokerFactory) -> None:
    broker = broker_factory()
    _publish(broker.endpoint, 3)
    peer = RawPeer(broker.endpoint)
    try:
        peer.send(encode(Attach(stream="prices", version=1)))
        assert peer.recv() == AttachOk()
        peer.send(encode(Subscribe(pattern="", latest=0)))
        peer.send(encode(Credit(credit=1 << 20)))
        got = peer.drain()
        assert [type(c) for c in got[1:]] == [Deliver, Deliver, Deliver]
        peer.send(encode(SubscribeTime(pattern="", since=0)))
        refusal = peer.recv()
        assert isinstance(refusal, Invalid) and "needs protocol version 2" in refusal.reason
    finally:
        peer.close()


def test_zero_credit_stops_delivery_and_credit_resumes_it(broker_factory: BrokerFactory) -> None:
    broker = broker_factory()
    _publish(broker.endpoint, 100)
    peer = RawPeer(broker.endpoint)
    try:
        peer.send(encode(Attach(stream="prices", version=1)))
        peer.recv()
        one = len(encode(Deliver(sequence=1, key="eu.fr.cac40", body=b"0")))
        peer.send(encode(Subscribe(pattern="", latest=0)))
        peer.send(encode(Credit(credit=one * 5)))
        got = [c for c in peer.drain() if isinstance(c, Deliver)]
        assert [c.sequence for c in got] == [1, 2, 3, 4, 5], "exactly the credit's worth"
        peer.send(encode(Credit(credit=one * 1000)))
        more = [c for c in peer.drain() if isinstance(c, Deliver)]
        assert [c.sequence for c in more][:3] == [6, 7, 8] and more[-1].sequence == 100
    finally:
        peer.close()


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(frames=st.lists(st.one_of(st.binary(max_size=40), st.binary(max_size=6).map(lambda b: b"\xaa\xa5" + b)),
                       min_size=1, max_size=8))  # fmt: skip
def test_fuzzed_frames_get_invalid_and_others_keep_being_served(
    broker_factory: BrokerFactory, frames: list[bytes]
) -> None:
    broker = getattr(test_fuzzed_frames_get_invalid_and_others_keep_being_served, "_broker", None)
    if broker is None:
        broker = broker_factory()
        test_fuzzed_frames_get_invalid_and_others_keep_being_served._broker = broker  # type: ignore[attr-defined]
    attacker = RawPeer(broker.endpoint)
    before = broker.core.invalid_frames
    try:
        for frame in frames:
            attacker.send(frame)
        answers = [attacker.recv(5.0) for _ in frames]  # one answer per frame: the peer never attached
        assert attacker.recv(0.05) is None
        assert all(isinstance(a, Invalid | InvalidCode) for a in answers), answers
        # every frame was refused; all but an ATTACH naming a stream this broker lacks are malformed
        unknown_stream = sum(isinstance(a, InvalidCode) and a.code == Refusal.STREAM_UNKNOWN for a in answers)
        assert broker.core.invalid_frames - before == len(frames) - unknown_stream
    finally:
        attacker.close()
    with StreamClient(broker.endpoint, "prices", timeout=5) as honest:  # the broker still serves
        honest.publish("k", b"v")
        honest.flush()


def test_fuzz_answers_are_invalid_with_reasons(broker_factory: BrokerFactory) -> None:
    broker = broker_factory()
    peer = RawPeer(broker.endpoint)
    try:
        for frame in (b"junk", b"\xaa\xa5\x63", b"\xaa\xa5\x06\x05ab", encode(Publish(key="k", body=b"x"))):
            peer.send(frame)
            answer = peer.recv()
            assert isinstance(answer, Invalid), frame
        assert broker.core.invalid_frames == 4
    finally:
        peer.close()


def test_silent_peers_expire_and_their_state_is_freed(broker_factory: BrokerFactory) -> None:
    broker = broker_factory(heartbeat_s=0.2, ttl_s=1.0)
    peer = RawPeer(broker.endpoint)
    try:
        peer.send(encode(Attach(stream="prices", version=1)))
        peer.recv()
        peer.send(encode(Subscribe(pattern="", latest=LATEST)))
        wait_until(lambda: len(broker.core.sessions) == 1, timeout=5, what="the session")
        wait_until(lambda: not broker.core.sessions, timeout=10, what="the silent peer to expire")
    finally:
        peer.close()
    with StreamClient(broker.endpoint, "prices", heartbeat=0.2, ttl=5) as alive:
        alive.start("")
        assert alive.receive(2.0) is None  # waiting for messages, it answers and sends heartbeats
        _publish(broker.endpoint, 1)
        assert alive.receive(5) is not None, "a heartbeating client must stay attached"
        assert alive.reconnects == 0
        # not used for longer than the broker's ttl (1 s): the broker forgets it
        wait_until(lambda: len(broker.core.sessions) == 0, timeout=7, what="the broker to forget the idle client")
        _publish(broker.endpoint, 1, start=1)
        message = alive.receive(5)  # on its next use it attaches again and resumes: nothing missed
        assert message is not None and message.body == b"1" and alive.reconnects == 1


def _start_serving(argv: list[str]) -> subprocess.Popen[bytes]:
    """A broker process, once it serves. A kill -9 in the middle of a write leaves a torn group, which
    the restart cuts off with a warning before it serves (those records were never confirmed: the
    publisher resends them). One that does not start is killed before the test fails."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert proc.stdout is not None
    for _ in range(20):
        line = proc.stdout.readline()
        if b"serving" in line or not line:
            break
    if b"serving" not in line:
        proc.kill()
        proc.wait()
        raise AssertionError(f"the broker did not start: {line!r}")
    return proc


@pytest.mark.parametrize("linger", [0.0, 0.002])
def test_kill9_broker_during_10000_publishes_then_restart(tmp_path: Path, linger: float) -> None:
    """The journal recovers, synced records survive, sequences continue, and a subscriber resumes
    with no gap or duplicate. The publisher resends what the broker had not confirmed, and the broker
    drops what of it the journal already held (an idempotent producer): every message once. Also with
    a lingering publisher, whose publishes go out in batches, some of them waiting at the kill."""
    port = free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    argv = [sys.executable, "-m", "zeps.broker.main", "--stream", "prices", "--data-dir", str(tmp_path / "data"),
            "--bind", endpoint, "--fsync", "always", "--segment-bytes", "65536"]  # fmt: skip

    def start() -> subprocess.Popen[bytes]:
        return _start_serving(argv)

    broker = start()
    seen: list[int] = []
    bodies: set[bytes] = set()
    sub = StreamClient(endpoint, "prices", heartbeat=0.5, ttl=3, timeout=30)
    sub.connect()
    sub.start("", since="earliest")
    pub = StreamClient(endpoint, "prices", timeout=60, linger=linger)
    pub.connect()
    try:
        for i in range(10_000):
            pub.publish("k", b"%d" % i)
            if i == 4000:
                frames_before_the_kill = pub.session.publish_frames
                broker.send_signal(signal.SIGKILL)  # mid-publish
                broker.wait()
                while (m := sub.receive(0.05)) is not None:  # the subscriber notices, keeps its place
                    seen.append(m.sequence)
                    bodies.add(m.body)
                pub.publish("k", b"while down")  # waits in the client until a broker confirms it
                broker = start()
        pub.flush(timeout=60)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            m = sub.receive(1)
            if m is None and seen and seen[-1] >= 10_000:
                break
            if m is not None:
                seen.append(m.sequence)
                bodies.add(m.body)
        _assert_contiguous(seen)
        missing = ({b"%d" % i for i in range(10_000)} | {b"while down"}) - bodies
        assert not missing, f"lost {len(missing)} published messages, e.g. {sorted(missing)[:3]}"
        assert seen[-1] == 10_001, f"{seen[-1] - 10_001} messages stored twice"
        assert sub.reconnects >= 1 and pub.reconnects >= 1
        if linger:  # (not while detached: those go one frame each, and are sent at the re-attach)
            assert frames_before_the_kill < 400, "the publishes lingered, and went out in batches"
    finally:
        pub.close()
        sub.close()
        broker.send_signal(signal.SIGTERM)
        broker.wait(30)


def test_a_registered_broker_goes_on_confirming_while_zookeeper_is_down(
    zookeeper: ZooKeeperHarness, broker_factory: BrokerFactory
) -> None:
    """ZooKeeper holds a broker's membership and its facts, not its data path: with the server
    stopped, publishes are confirmed as before (the facts, written once a second when they change,
    are written off the broker's loop, only while connected), and once it is back the facts catch up.
    Before, the loop wrote them itself, and a write made as the connection dropped held the loop, and
    every confirmation, until ZooKeeper came back."""
    broker = broker_factory(registration=Registration(zookeeper.connect_string, "shop", "prices-0",
                                                      chroot=zookeeper.root))  # fmt: skip
    published = 0
    with StreamClient(broker.endpoint, "prices", timeout=5) as client:
        client.publish_many([("k", b"x")] * 100)
        client.flush()
        published += 100
        wait_until(lambda: broker.facts("prices").get("lastSequence") == published, timeout=10, what="the facts")
        zookeeper.stop()
        wait_until(lambda: not broker._zk.connected, timeout=10, what="the broker to see ZooKeeper go")
        deadline = time.monotonic() + 3  # three ticks of the facts, each with something new to write
        while time.monotonic() < deadline:
            client.publish_many([("k", b"y")] * 100)
            client.flush(timeout=5)  # BrokerUnavailableError when the loop is held
            published += 100
        zookeeper.start()
        wait_until(lambda: broker.facts("prices").get("lastSequence") == published, timeout=30,
                   what="the facts after ZooKeeper came back")  # fmt: skip


def test_a_member_node_forged_by_another_zookeeper_user_cannot_redirect_a_client(
    zookeeper: ZooKeeperHarness, broker_factory: BrokerFactory, tmp_path: Path
) -> None:
    """With the namespace's ACL (its zeps-zookeeper-auth identity) on the stream's subtree, the broker
    registers with that identity and no other ZooKeeper user may add, change or remove a member node.
    Where ACLs are off, anyone may write there: a client that takes the broker's key from the
    operator's Secret then fails the CURVE handshake with a forged endpoint, and sends it nothing."""
    paths = StreamPaths.of("shop", "prices", chroot=zookeeper.root).brokers
    owner = ("shop", "shop-secret")
    admin = zookeeper.client(auth=OPERATOR_AUTH, acl_from_auth=False)  # the operator: a super user
    admin.ensure_path(zookeeper.root)  # above the namespaces: open
    admin.ensure_path(paths.members, acl=digest_acl(*owner))  # as the operator lays out an ACL'd namespace
    reg = Registration(zookeeper.connect_string, "shop", "prices-0", chroot=zookeeper.root, auth=owner)
    broker = broker_factory(registration=reg)
    intruder = zookeeper.client(auth=("mallory", "mallory-secret"))
    node = f"{paths.members}/prices-0"
    with pytest.raises(NoAuthError):
        intruder.create(f"{paths.members}/prices-1", b'{"endpoint": "tcp://127.0.0.1:1"}', ephemeral=True)
    with pytest.raises(NoAuthError):
        intruder.set(node, b'{"endpoint": "tcp://127.0.0.1:1"}')
    with pytest.raises(NoAuthError):
        intruder.delete(node)
    assert discover(zookeeper.connect_string, "shop", "prices", chroot=zookeeper.root, auth=owner)[0] == broker.endpoint

    # no ACL: the node can be forged; the broker's key from a source of the client's own foils it
    open_paths = StreamPaths.of("open", "prices", chroot=zookeeper.root).brokers
    server_public, server_secret = zmq.auth.create_certificates(str(tmp_path), "real")
    real = broker_factory(curve=CurveConfig(Path(server_secret)))
    fake_public, fake_secret = zmq.auth.create_certificates(str(tmp_path), "fake")
    impostor = broker_factory(curve=CurveConfig(Path(fake_secret)))
    intruder.ensure_path(open_paths.members, acl=OPEN_ACL_UNSAFE)  # a namespace without ACLs: anyone writes
    intruder.create(f"{open_paths.members}/prices-0", json.dumps(
        {"endpoint": impostor.endpoint, "curvePublicKey": zmq.auth.load_certificate(fake_public)[0].decode()}
    ).encode(), ephemeral=True, acl=OPEN_ACL_UNSAFE)  # fmt: skip
    endpoint, _forged_key = discover(zookeeper.connect_string, "open", "prices", chroot=zookeeper.root)
    assert endpoint == impostor.endpoint and endpoint != real.endpoint
    trusted_key = zmq.auth.load_certificate(server_public)[0].decode()  # the operator's Secret says this
    fooled = StreamClient(endpoint, "prices", server_public_key=trusted_key, timeout=3)
    with pytest.raises(BrokerUnavailableError):
        fooled.connect()
    fooled.close()
    assert impostor.core.sessions == {} and impostor.core.streams["prices"].journal.written == 0


def test_registration_discovery_and_manifest(
    zookeeper: ZooKeeperHarness, broker_factory: BrokerFactory, tmp_path: Path
) -> None:
    reg = Registration(zookeeper.connect_string, "shop", "prices-0", chroot=zookeeper.root)
    broker = broker_factory(registration=reg)
    endpoint, key = discover(zookeeper.connect_string, "shop", "prices", chroot=zookeeper.root)
    assert endpoint == broker.endpoint and key == ""
    group = Group(zookeeper.client(), StreamPaths.of("shop", "prices", chroot=zookeeper.root).brokers)
    assert group.members()["prices-0"].metadata["streams"] == ["prices"]
    group.set_manifest(["prices-1"])  # prices-0 is now rogue: it stops serving
    wait_until(lambda: broker.refused is not None, timeout=10, what="the rogue broker to stop")
    assert "removed from the manifest" in (broker.refused or "")
    # a broker refused at start closes what it had opened: its ports, its ZooKeeper session, its journal
    port, metrics = free_port(), free_port()
    refused = BrokerServer(
        BrokerConfig(tmp_path / "refused", ("prices",)), bind=f"tcp://127.0.0.1:{port}", metrics_port=metrics,
        registration=Registration(zookeeper.connect_string, "shop", "prices-9", chroot=zookeeper.root),
    )  # fmt: skip
    with pytest.raises(ConfigError, match="not in the manifest"):
        refused.start()
    for taken in (port, metrics):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", taken))  # free again
    assert refused._zk is None and refused.core.streams["prices"].journal._fd < 0


def test_a_broker_that_cannot_register_again_after_its_session_expired_stops_as_a_failure(
    zookeeper: ZooKeeperHarness, broker_factory: BrokerFactory
) -> None:
    """Its session expired and another session took its member id: serving unregistered would hide it
    from clients and the operator, so it stops, with a failure (zeps-broker then exits 1)."""
    reg = Registration(zookeeper.connect_string, "shop", "prices-0", chroot=zookeeper.root, takeover_timeout=1)
    broker = broker_factory(registration=reg)
    node = f"{StreamPaths.of('shop', 'prices', chroot=zookeeper.root).brokers.members}/prices-0"
    rival = zookeeper.client()
    took = threading.Event()

    def take_it(data: bytes | None, _stat: Any) -> bool:  # the moment the expired session's node goes
        if data is None and not took.is_set():
            with contextlib.suppress(Exception):
                rival.create(node, b"{}", ephemeral=True)
                took.set()
        return not took.is_set()

    for _ in range(5):  # bounded: the broker may win the race for the node; expire it again then
        rival.DataWatch(node, take_it)
        zookeeper.expire_session(broker._zk, wait_reconnect=False)
        if took.wait(5):
            break
    assert took.is_set(), "the rival never got the member id"
    wait_until(lambda: broker.failure is not None, timeout=20, what="the broker to fail")
    assert "could not register in ZooKeeper again" in (broker.failure or "")
    assert broker.wait(10), "the broker stopped serving"


def test_live_facts_are_written_to_zookeeper_only_when_they_change(
    zookeeper: ZooKeeperHarness, broker_factory: BrokerFactory
) -> None:
    reg = Registration(zookeeper.connect_string, "shop", "prices-0", chroot=zookeeper.root)
    broker = broker_factory(registration=reg)
    node = f"{StreamPaths.of('shop', 'prices', chroot=zookeeper.root).brokers.members}/prices-0"
    zk = zookeeper.client()
    wait_until(lambda: b"lastSequence" in zk.get(node)[0], timeout=10, what="the first facts")
    version, tick = zk.get(node)[1].version, broker._last_facts
    # two more of the broker's fact ticks (once a second) with nothing new, any write they began done
    wait_until(lambda: broker._last_facts >= tick + 2 and not broker._facts_writing.is_set(), timeout=20,
               what="two fact ticks")  # fmt: skip
    assert zk.get(node)[1].version == version
    with StreamClient(broker.endpoint, "prices") as c:
        c.publish("k", b"v")
        c.flush()
    wait_until(lambda: zk.get(node)[1].version > version, timeout=10, what="the new last sequence")
    assert json.loads(zk.get(node)[0])["lastSequence"] == 1


def _curve_broker(broker_factory: BrokerFactory, tmp_path: Path) -> tuple[BrokerServer, str, tuple[str, str]]:
    """A CURVE broker that admits one client: (broker, its public key, that client's key pair)."""
    keys, clients = tmp_path / "keys", tmp_path / "clients"
    keys.mkdir()
    clients.mkdir()
    server_public, server_secret = zmq.auth.create_certificates(str(keys), "server")
    _, client_secret = zmq.auth.create_certificates(str(clients), "client")
    broker = broker_factory(curve=CurveConfig(Path(server_secret), clients))
    public, secret = zmq.auth.load_certificate(client_secret)
    assert secret is not None
    return broker, zmq.auth.load_certificate(server_public)[0].decode(), (public.decode(), secret.decode())


def test_curve_encrypts_and_admits_only_known_clients(broker_factory: BrokerFactory, tmp_path: Path) -> None:
    broker, server_key, client_keys = _curve_broker(broker_factory, tmp_path)
    with StreamClient(broker.endpoint, "prices", server_public_key=server_key, client_keys=client_keys) as c:
        c.publish("k", b"secret")
        c.flush()
    stranger = StreamClient(broker.endpoint, "prices", server_public_key=server_key, timeout=5)  # random keys
    with pytest.raises(BrokerUnavailableError, match="refused the CURVE handshake: this client has no key"):
        stranger.connect()
    stranger.close()
    made_up = zmq.curve_keypair()
    impostor = StreamClient(broker.endpoint, "prices", server_public_key=server_key, timeout=5,
                            client_keys=(made_up[0].decode(), made_up[1].decode()))  # fmt: skip
    with pytest.raises(BrokerUnavailableError, match=re.escape(f"client key {made_up[0].decode()} is not among")):
        impostor.connect()
    impostor.close()


def test_a_client_taken_off_the_list_is_cut_off_at_once_without_a_restart(
    broker_factory: BrokerFactory, tmp_path: Path
) -> None:
    """The broker reads its clients file again when it changes (the operator rewrites it when
    spec.curveClients changes): a revoked client's session ends with UNAUTHORIZED, its next
    connection is refused at the handshake, and the others go on."""
    server_public, server_secret = zmq.auth.create_certificates(str(tmp_path), "server")
    server_key = zmq.auth.load_certificate(server_public)[0].decode()
    pairs = {name: tuple(k.decode() for k in zmq.curve_keypair()) for name in ("orders", "audit")}
    clients = tmp_path / "clients.json"
    clients.write_text(json.dumps({name: public for name, (public, _) in pairs.items()}))
    broker = broker_factory(curve=CurveConfig(Path(server_secret), clients))

    def client(name: str) -> StreamClient:
        return StreamClient(broker.endpoint, "prices", server_public_key=server_key, client_keys=pairs[name],
                            timeout=5).connect()  # type: ignore[arg-type]  # fmt: skip

    orders, audit = client("orders"), client("audit")
    orders.start("")
    audit.start("")
    clients.write_text(json.dumps({"audit": pairs["audit"][0]}))  # orders revoked
    with pytest.raises(BrokerUnavailableError, match="was revoked"):
        for _ in range(100):  # bounded: 10 s
            orders.receive(0.1)
    orders.close()
    with pytest.raises(BrokerUnavailableError, match="refused the CURVE handshake"):
        client("orders")
    audit.publish("k", b"still served")
    audit.flush()
    message = audit.receive(5)
    assert message is not None and message.body == b"still served"
    audit.close()
    assert broker.wait(0) is False, "the broker never restarted"


def test_async_client_speaks_curve(broker_factory: BrokerFactory, tmp_path: Path) -> None:
    broker, server_key, client_keys = _curve_broker(broker_factory, tmp_path)

    async def scenario() -> list[bytes]:
        async with AsyncStreamClient(broker.endpoint, "prices", server_public_key=server_key,
                                     client_keys=client_keys) as c:  # fmt: skip
            await c.publish("k", b"secret")
            await c.flush()
            await c.start("", since="earliest")
            message = await c.receive(5)
        stranger = AsyncStreamClient(broker.endpoint, "prices", server_public_key=server_key, timeout=2)
        with pytest.raises(BrokerUnavailableError):
            await stranger.connect()  # random keys: the broker does not know them
        await stranger.close()
        return [message.body] if message else []

    assert asyncio.run(scenario()) == [b"secret"]


def test_async_client_attaches_again_at_once_when_the_connection_drops(tmp_path: Path) -> None:
    """The disconnect monitor: a broker restarted on the same address is re-attached as soon as the
    connection is back, long before a heartbeat (30 s here) or the ttl (60 s) would notice."""
    port = free_port()

    def broker() -> BrokerServer:
        return BrokerServer(BrokerConfig(tmp_path / "b", ("prices",)), bind=f"tcp://127.0.0.1:{port}").start()

    first = broker()

    async def scenario() -> tuple[list[bytes], int]:
        async with AsyncStreamClient(first.endpoint, "prices", heartbeat=30, ttl=60) as c:
            await c.start("")
            subscribed = first.core.streams["prices"].live_set
            await asyncio.to_thread(wait_until, lambda: subscribed, timeout=10, what="the subscription")
            first.stop()
            second = broker()
            try:
                attached = lambda: bool(c.reconnects and c.session.attached)  # noqa: E731
                await asyncio.to_thread(wait_until, attached, timeout=20, what="the client attached again")
                _publish(second.endpoint, 1)
                message = await c.receive(10)
            finally:
                await c.close()
                second.stop()
            return [message.body] if message else [], c.reconnects

    bodies, reconnects = asyncio.run(scenario())
    assert bodies == [b"0"] and reconnects == 1


class DyingBroker:
    """A broker that dies between reading a client's ATTACH and answering it, as a restarted replica
    does when it is killed again before its loop runs (it binds first, then waits for ZooKeeper),
    played by a ROUTER socket: it takes the ATTACH off the wire, then closes (the client's connection
    drops). ``silent=True``: it keeps the connection and never answers instead."""

    def __init__(self, *, silent: bool = False) -> None:
        self.ctx: zmq.Context[Any] = zmq.Context()
        self.router = self.ctx.socket(zmq.ROUTER)
        self.router.setsockopt(zmq.LINGER, 0)
        self.port = self.router.bind_to_random_port("tcp://127.0.0.1")
        self.attaches = 0
        self.silent = silent
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._stop = threading.Event()
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self.router.poll(100):
                continue
            _, frame = self.router.recv_multipart()
            if isinstance(decode(frame), Attach):
                self.attaches += 1
                if not self.silent:
                    break
        self.router.close()
        self.ctx.term()

    def dead(self) -> None:
        """Wait for its end (the ATTACH read, the socket closed), or end it (``silent``)."""
        if self.silent:
            self._stop.set()
        self._thread.join(10)
        assert not self._thread.is_alive()


def test_a_client_whose_attach_died_with_the_broker_attaches_to_its_successor(tmp_path: Path) -> None:
    """An ATTACH the broker read and never answered (it died) is sent again, on a fresh socket, as
    soon as the connection drops: the broker restarted on the same address takes the client long
    before the client's timeout (60 s here) or ttl (60 s) would end the wait."""
    dying = DyingBroker()
    endpoint = f"tcp://127.0.0.1:{dying.port}"
    made: list[StreamClient] = []
    errors: list[BaseException] = []

    def connect() -> None:
        try:
            made.append(StreamClient(endpoint, "prices", heartbeat=30, ttl=60, timeout=60).connect())
        except BaseException as exc:  # the test thread reports it
            errors.append(exc)

    connecting = threading.Thread(target=connect)
    connecting.start()
    dying.dead()
    successor = BrokerServer(BrokerConfig(tmp_path / "b", ("prices",)), bind=endpoint).start()
    try:
        wait_until(lambda: made or errors, timeout=20, what="the client attached to the successor")
        assert not errors and dying.attaches == 1
        with made[0] as client:
            assert client.reconnects >= 1
            client.publish("k", b"after")
            client.flush()
            client.start("", since="earliest")
            message = client.receive(10)
            assert message is not None and message.body == b"after"
    finally:
        connecting.join(30)
        successor.stop()


def test_an_attach_unanswered_for_ttl_is_sent_again_on_a_fresh_socket() -> None:
    """A broker that keeps the connection and never answers ATTACH (lost, or a broker wedged): after
    ``ttl`` the client attaches afresh rather than waiting out its whole timeout on one frame."""
    silent = DyingBroker(silent=True)
    endpoint = f"tcp://127.0.0.1:{silent.port}"
    client = StreamClient(endpoint, "prices", heartbeat=0.5, ttl=1.0, timeout=4)
    with pytest.raises(BrokerUnavailableError, match="no broker answered"), client:
        pass
    silent.dead()
    assert silent.attaches >= 2, "the client waited on its first ATTACH for its whole timeout"


def test_the_async_client_whose_attach_died_with_the_broker_attaches_to_its_successor(tmp_path: Path) -> None:
    """As for the blocking client: the ATTACH a dying broker read is sent again once the connection
    drops, and the broker restarted on the same address takes the client at once."""
    dying = DyingBroker()
    endpoint = f"tcp://127.0.0.1:{dying.port}"

    async def scenario() -> tuple[bytes | None, int]:
        client = AsyncStreamClient(endpoint, "prices", heartbeat=30, ttl=60, timeout=60)
        connecting = asyncio.ensure_future(client.connect())
        await asyncio.to_thread(dying.dead)
        successor = BrokerServer(BrokerConfig(tmp_path / "b", ("prices",)), bind=endpoint).start()
        try:
            await asyncio.wait_for(connecting, 20)
            await client.publish("k", b"after")
            await client.flush()
            await client.start("", since="earliest")
            message = await client.receive(10)
        finally:
            await client.close()
            successor.stop()
        return (message.body if message else None), client.reconnects

    body, reconnects = asyncio.run(scenario())
    assert body == b"after" and reconnects >= 1 and dying.attaches == 1


def test_metrics_endpoint(broker_factory: BrokerFactory) -> None:
    port = free_port()
    broker = broker_factory(metrics_port=port)
    _publish(broker.endpoint, 10)

    def exported() -> bytes:
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read()  # type: ignore[no-any-return]

    wait_until(lambda: b'zeps_broker_messages_in_total{stream="prices"} 10.0' in exported(), timeout=10, what="metrics")
    text = exported().decode()
    assert 'zeps_broker_last_sequence{stream="prices"} 10.0' in text
    assert 'zeps_broker_first_sequence{stream="prices"} 1.0' in text

    ctx = zmq.Context.instance()
    stranger = ctx.socket(zmq.DEALER)
    stranger.setsockopt(zmq.LINGER, 0)
    stranger.connect(broker.endpoint)
    stranger.send(b"not a frame")  # refused: a peer not attached, so no stream
    assert stranger.poll(10_000), "no answer to a malformed frame"
    assert isinstance(decode(stranger.recv()), Invalid | InvalidCode)
    stranger.close()
    with StreamClient(broker.endpoint, "prices", producer_id="billing") as producer:
        producer.publish("k", b"once")
        producer.flush()
        wait_until(lambda: b'zeps_broker_producers{stream="prices"} 1.0' in exported(), timeout=10, what="producers")
    _publish(broker.endpoint, 100, start=10)  # ~3 kB of deliveries: more than the smallest window takes
    with StreamClient(broker.endpoint, "prices", max_message_bytes=16, credit_window=16 + 1024) as starved:
        # the window fills, and nobody receives: no CREDIT follows, the subscription stops
        starved.start("", since="earliest")
        lines = ('zeps_broker_refused_frames_total{code="bad_frame",stream=""} 1.0',
                 'zeps_broker_subscriptions{stream="prices"} 1.0',
                 'zeps_broker_credit_starved_subscriptions{stream="prices"} 1.0',
                 'zeps_broker_subscriber_lag{peer=')  # fmt: skip
        wait_until(lambda: all(line.encode() in exported() for line in lines), timeout=10,
                   what=f"{lines} in {exported().decode()}")  # fmt: skip


def test_async_client_works(broker_factory: BrokerFactory) -> None:
    broker = broker_factory()

    async def scenario() -> list[int]:
        async with AsyncStreamClient(broker.endpoint, "prices") as pub:
            for i in range(250):
                await pub.publish("k", b"%d" % i)
            await pub.publish_many(("k", b"%d" % i) for i in range(250, 500))
            await pub.flush()
        got = []
        async with AsyncStreamClient(broker.endpoint, "prices") as sub:
            async for message in sub.subscribe("", since=Seq(100)):
                got.append(message.sequence)
                if len(got) == 400:
                    break
        async with AsyncStreamClient(broker.endpoint, "prices") as bulk:
            await bulk.start("", since=Seq(490))
            rows: list[int] = []
            for _ in range(50):  # the ten may come in more than one frame
                rows += [row[0] for run in await bulk.receive_records(5) for row in run.rows()]
                if len(rows) >= 10:
                    break
        return got + rows

    assert asyncio.run(scenario()) == list(range(101, 501)) + list(range(491, 501))


@pytest.mark.parametrize("version", [3, 4])
def test_batches_are_journal_records_cut_to_pattern_and_credit(broker_factory: BrokerFactory, version: int) -> None:
    """Version 3 gets DELIVER-BATCH, version 4 DELIVER-RUN (the same records, their index and one CRC32C):
    whole runs and runs cut to a pattern, exactly as far as credit goes, replayed and live."""
    broker = broker_factory()
    peer = RawPeer(broker.endpoint)
    kind, overhead, per_record = (DeliverBatch, 7, 0) if version == 3 else (DeliverRun, 15, 4)
    try:
        peer.send(encode(Attach(stream="prices", version=version)))
        assert peer.recv() == AttachOk()
        keys = ["eu.fr", "us.ny", "eu.de"]
        peer.send(encode_publish_batch([(keys[i % 3], b"%d" % i) for i in range(300)]))
        wait_until(lambda: broker.core.streams["prices"].journal.durable == 300, timeout=10, what="300 journalled")
        peer.send(encode(Subscribe(pattern="eu.", latest=0)))
        record = 25 + len("eu.fr") + 1  # a journal record of a one-digit body
        peer.send(encode(Credit(credit=overhead + 3 * (record + per_record))))  # one frame's header, three records
        got = [c for c in peer.drain() if not isinstance(c, SubscribeOk)]
        assert {type(c) for c in got} == {kind}
        assert [seq for c in got for seq, *_ in c.items] == [1, 3, 4], "exactly the credit's worth, eu. only"
        peer.send(encode(Credit(credit=1 << 20)))
        rest = [item for c in peer.drain() if isinstance(c, kind) for item in c.items]
        assert [seq for seq, *_ in rest] == [n for n in range(5, 301) if (n - 1) % 3 != 1]
        assert all(key.startswith("eu.") and body == b"%d" % (seq - 1) for seq, key, body, _ in rest)
        # live: a new batch reaches the (now live) subscription as a batch
        peer.send(encode_publish_batch([("eu.fr", b"live-1"), ("us.ny", b"no"), ("eu.de", b"live-2")]))
        live = [item for c in peer.drain() if isinstance(c, kind) for item in c.items]
        assert [(seq, body) for seq, _, body, _ in live] == [(301, b"live-1"), (303, b"live-2")]
    finally:
        peer.close()
    whole = RawPeer(broker.endpoint)  # everything, uncut, from the start: whole runs, credit permitting
    try:
        whole.send(encode(Attach(stream="prices", version=version)))
        assert whole.recv() == AttachOk()
        whole.send(encode(Subscribe(pattern="", latest=0)))
        whole.send(encode(Credit(credit=overhead + 10 * (record + per_record))))
        runs = [c for c in whole.drain() if isinstance(c, kind)]
        assert [seq for c in runs for seq, *_ in c.items] == list(range(1, 11))
    finally:
        whole.close()


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        (b"\xaa\xa5\x0f\x00\x00\x00\x00", "PUBLISH-BATCH is empty"),
        (b"\xaa\xa5\x0f\x00\x00\x00\x03\x01k\x00", "entry 0 is truncated"),
        (encode_publish_batch([("k", b"v")])[:-1], "claims 7 bytes, 6 follow"),
        (encode(DeliverBatch(records=encode_record(1, 1, b"k", b"v"))), "DELIVER-BATCH is not allowed"),
    ],
)
def test_malformed_batches_get_invalid_and_the_peering_goes_on(
    broker_factory: BrokerFactory, frame: bytes, reason: str
) -> None:
    broker = broker_factory()
    peer = RawPeer(broker.endpoint)
    try:
        peer.send(encode(Attach(stream="prices", version=3)))
        assert peer.recv() == AttachOk()
        peer.send(frame)
        answer = peer.recv()
        assert isinstance(answer, Invalid) and reason in answer.reason, answer
        peer.send(encode_publish_batch([("k", b"after")]))  # the same peering still publishes
        wait_until(lambda: broker.core.streams["prices"].journal.durable == 1, timeout=10, what="the good batch")
    finally:
        peer.close()
    v2 = RawPeer(broker.endpoint)
    try:
        v2.send(encode(Attach(stream="prices", version=2)))
        assert v2.recv() == AttachOk()
        v2.send(encode_publish_batch([("k", b"v")]))
        refusal = v2.recv()
        assert isinstance(refusal, Invalid) and "needs protocol version 3" in refusal.reason
    finally:
        v2.close()


def test_client_attaches_with_a_lower_version_when_the_broker_is_older() -> None:
    """A broker from before refusal codes that only speaks versions 1 and 2 is played by a ROUTER
    socket in this test (every zeps broker of this tree speaks version 7), with its exact refusal: the
    client tries 4 after the plain INVALID, falls back to version 2, and publish_many sends plain
    PUBLISH frames, one per message (no producer sequences: at-least-once against such a broker)."""
    ctx: zmq.Context[Any] = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.setsockopt(zmq.LINGER, 0)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    seen: list[Any] = []

    def old_broker() -> None:
        while router.poll(3000):
            peer, frame = router.recv_multipart()
            command = decode(frame)
            seen.append(command)
            if isinstance(command, Attach) and command.version > 2:
                refusal = Invalid(reason=f"ATTACH version {command.version} is not supported (use one of 1, 2)")
                router.send_multipart([peer, encode(refusal)])
            elif isinstance(command, Attach):
                router.send_multipart([peer, encode(AttachOk())])
            elif type(command).__name__ == "Ping":
                router.send_multipart([peer, b"\xaa\xa5\x09"])  # PING-OK

    thread = threading.Thread(target=old_broker, daemon=True)
    thread.start()
    try:
        with StreamClient(f"tcp://127.0.0.1:{port}", "prices", timeout=5) as client:
            assert client.session.conn.version == 2
            client.publish_many([("k", b"1"), ("k", b"2")])
            client.flush()
    finally:
        thread.join(10)
        router.close()
        ctx.term()
    assert [c.version for c in seen if isinstance(c, Attach)] == [7, 4, 3, 2]
    assert [c.body for c in seen if isinstance(c, Publish)] == [b"1", b"2"]
    assert not any(isinstance(c, PublishBatch) for c in seen)


def test_publish_many_with_live_and_replaying_pattern_subscribers(broker_factory: BrokerFactory) -> None:
    broker = broker_factory()
    keys = ["eu.fr", "us.ny", "eu.de"]
    with StreamClient(broker.endpoint, "prices") as live, StreamClient(broker.endpoint, "prices") as pub:
        live.start("eu.", since="latest")
        stream = broker.core.streams["prices"]
        wait_until(lambda: stream.live_set, timeout=5, what="the subscription to be live")
        pub.publish_many((keys[i % 3], b"%d" % i) for i in range(6000))
        pub.publish("eu.fr", b"single")
        pub.flush()
        got = _collect(live, 4001)
        assert [m.sequence for m in got] == [n for n in range(1, 6002) if (n - 1) % 3 != 1]
        assert got[-1].body == b"single" and all(m.key.startswith("eu.") for m in got)
    with StreamClient(broker.endpoint, "prices") as late:
        late.start("~\\.de$", since="earliest")
        replayed = _collect(late, 2000)
        assert [m.sequence for m in replayed] == list(range(3, 6001, 3))
        assert all(m.body == b"%d" % (m.sequence - 1) for m in replayed)


def test_an_asyncio_consumer_that_stops_taking_holds_its_window_and_catches_up_from_the_journal(
    broker_factory: BrokerFactory,
) -> None:
    """Credit goes back when the application takes a delivery: the asyncio reader task keeps reading
    the socket, but a consumer that takes nothing holds at most its window, and the broker switches it
    to replay; once it takes again it catches up from the journal, nothing lost, nothing twice."""
    broker = broker_factory()
    stream = broker.core.streams["prices"]
    window, body = 64 * 1024, bytes(1000)

    async def scenario() -> tuple[int, list[int]]:
        async with AsyncStreamClient(broker.endpoint, "prices", credit_window=window, max_message_bytes=4096) as c:
            await c.start("", since="earliest")
            with StreamClient(broker.endpoint, "prices") as publisher:  # 2 MB: 30 windows
                publisher.publish_many((f"k{i}", body) for i in range(2000))
                publisher.flush()
            # the reader task runs all along; the application takes nothing until the broker gave up on it
            out_of_credit = lambda: stream.fell_behind >= 1 and c.session.inbox.held_bytes > 0  # noqa: E731
            await asyncio.to_thread(wait_until, out_of_credit, timeout=10, what="the window held, the broker replaying")
            held = c.session.inbox.held_bytes
            sequences: list[int] = []
            while len(sequences) < 2000:
                batch = await c.receive_many(10)
                assert batch, f"stalled after {len(sequences)} messages"
                sequences += [m.sequence for m in batch]
            return held, sequences

    held, sequences = asyncio.run(scenario())
    assert 0 < held <= window, f"{held} bytes held by a consumer with a {window}-byte window"
    assert sequences == list(range(1, 2001))
    assert stream.fell_behind >= 1 and stream.messages_replayed > 0, "it went to replay, and came back"


def test_close_raises_when_publishes_stay_unconfirmed(broker_factory: BrokerFactory) -> None:
    """close() confirms what was published; what it cannot confirm is an error, raised after
    the client has closed its sockets, never dropped in silence."""
    broker = broker_factory()
    client = StreamClient(broker.endpoint, "prices", timeout=1).connect()
    broker.stop()  # nobody will confirm
    client.publish("k", b"lost?")
    with pytest.raises(BrokerUnavailableError, match="1 publishes unconfirmed"):
        client.close()
    assert client._sock is None  # closed all the same

    async def scenario() -> None:
        other = broker_factory()
        c = await AsyncStreamClient(other.endpoint, "prices", timeout=1).connect()
        other.stop()
        await c.publish("k", b"lost?")
        with pytest.raises(BrokerUnavailableError, match="1 publishes unconfirmed"):
            await c.close()
        assert c._reader is not None and c._reader.done() and c._sock is None

    asyncio.run(scenario())


def test_the_asyncio_client_raises_when_its_re_attach_is_refused(tmp_path: Path) -> None:
    """A broker restarted without the stream refuses the re-attach: receive() raises, rather than
    returning None forever."""
    port = free_port()
    first = BrokerServer(BrokerConfig(tmp_path / "a", ("prices",)), bind=f"tcp://127.0.0.1:{port}").start()

    async def scenario() -> None:
        async with AsyncStreamClient(first.endpoint, "prices", heartbeat=0.2, ttl=1) as c:
            await c.start("")
            first.stop()
            other = BrokerServer(BrokerConfig(tmp_path / "b", ("other",)), bind=f"tcp://127.0.0.1:{port}").start()
            try:
                with pytest.raises(BrokerUnavailableError, match="not served by this broker"):
                    for _ in range(100):  # bounded: 10 s
                        await c.receive(0.1)
            finally:
                other.stop()

    asyncio.run(scenario())


def test_a_client_of_a_stream_that_is_not_replicated_keeps_the_address_it_was_given(
    zookeeper: ZooKeeperHarness, broker_factory: BrokerFactory
) -> None:
    """A client that resolves a stream with its ZooKeeper follows a replicated stream's leader. A
    stream of one broker has none to follow: the client keeps the address it reached the broker at (a
    port-forward, a NodePort, a load balancer), not the in-cluster one the broker advertises."""
    from zeps.config import Resolved  # noqa: PLC0415

    reg = Registration(zookeeper.connect_string, "shop", "prices-0", chroot=zookeeper.root,
                       advertise="tcp://prices-broker.shop.svc:5555")  # fmt: skip
    broker = broker_factory(registration=reg)
    resolved = Resolved(kind="ZepsStream", name="prices", namespace="shop", zookeeper=zookeeper.connect_string,
                        chroot=zookeeper.root, endpoint=broker.endpoint)  # fmt: skip
    client = StreamClient.of(resolved, timeout=10)
    assert client.locator is not None
    with client:
        client.publish("k", b"1")
        client.flush()
        client._reconnect()  # as after a dropped connection
        client.publish("k", b"2")
        client.flush()
        assert client.endpoint == broker.endpoint
    assert broker.core.streams["prices"].journal.written == 2


def test_a_client_whose_zookeeper_is_away_stays_at_its_broker(broker_factory: BrokerFactory) -> None:
    """Where the leader is, is advice: a client whose ZooKeeper does not answer (nothing listens at
    its address here) reconnects to the broker it was given, after the locator's 3 s, and goes on."""
    from zeps.config import Resolved  # noqa: PLC0415

    broker = broker_factory()
    resolved = Resolved(kind="ZepsStream", name="prices", namespace="shop", zookeeper=f"127.0.0.1:{free_port()}",
                        endpoint=broker.endpoint)  # fmt: skip
    with StreamClient.of(resolved, timeout=10) as client:
        client.publish("k", b"1")
        client.flush()
        client._reconnect()  # as after a dropped connection: the locator fails, the endpoint stays
        client.publish("k", b"2")
        client.flush()
        assert client.endpoint == broker.endpoint
    assert broker.core.streams["prices"].journal.written == 2
