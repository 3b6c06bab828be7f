"""What a hostile peer can cost a real broker process: bounded memory, and everyone else still served.

The broker runs as ``zeps-broker`` in a process of its own, so its memory is its own: the tests read
its resident set (``VmRSS``) and its peak (``VmHWM``) from ``/proc``. Peers are raw DEALER sockets
speaking frames built from the grammar, as an attacker would; an honest client publishes and
subscribes beside them. The bounds asserted are the README's limits table.
"""

from __future__ import annotations

import socket
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
from zmq.utils.monitor import recv_monitor_message

from harness import until
from zeps.broker.config import DEFAULT_MAX_SESSION_BYTES_IN_FLIGHT
from zeps.client import BrokerUnavailableError, Seq, StreamClient
from zeps.protocol import (
    Attach,
    AttachOk,
    Credit,
    Detach,
    DetachOk,
    InvalidCode,
    Publish,
    Refusal,
    Subscribe,
    SubscribeOk,
    decode,
    encode,
    encode_publish_batch,
)
from zeps.protocol.limits import DEFAULT_MAX_MESSAGE_BYTES, MAX_CREDIT_BYTES
from zeps_dev.process import ManagedProcess, free_port

MiB = 1 << 20
#: what one hostile peer may add to the broker's resident memory at most: a session's credit
#: (64 MiB of deliveries queued for it), the journal's tail cache (16 MiB), a loop's reads (16 MiB,
#: and their records until written) and allocator slack; measured: about 60 MiB besides the credit
PEER_BOUND = MAX_CREDIT_BYTES + 96 * MiB


class Broker:
    """A ``zeps-broker`` process and its memory."""

    def __init__(self, tmp_path: Path, *flags: str) -> None:
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.process = ManagedProcess(
            "zeps-broker",
            [sys.executable, "-m", "zeps.broker.main", "--stream", "prices", "--data-dir", str(tmp_path / "journal"),
             "--bind", self.endpoint, "--fsync", "never", *flags],
            log_path=tmp_path / "broker.log",
        )  # fmt: skip

    def start(self) -> None:
        self.process.start()
        self.process.wait_ready(lambda: "serving prices" in self.process.log_tail(), timeout=30)

    def memory(self, field: str = "VmRSS") -> int:
        """The broker's resident memory now (``VmRSS``) or at its peak so far (``VmHWM``), bytes."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1]) * 1024
        raise AssertionError(f"no {field} for the broker")


class RawPeer:
    """A DEALER speaking raw frames: attached with version 7, answers decoded."""

    def __init__(self, endpoint: str) -> None:
        self.ctx: zmq.Context[Any] = zmq.Context()
        self.sock = self.ctx.socket(zmq.DEALER)
        self.sock.setsockopt(zmq.LINGER, 0)
        self.sock.setsockopt(zmq.SNDHWM, 0)
        self.sock.connect(endpoint)
        self.sock.send(encode(Attach(stream="prices", version=7)))
        assert self.recv() == AttachOk()

    def recv(self, timeout: float = 5.0) -> Any:
        return decode(self.sock.recv()) if self.sock.poll(int(timeout * 1000)) else None

    def watch_disconnect(self) -> zmq.Socket[Any]:
        """A monitor of this peer's connection (before the frame that should cut it): :func:`_cut` waits on it."""
        return self.sock.get_monitor_socket(zmq.EVENT_DISCONNECTED)

    def close(self) -> None:
        self.sock.close()
        self.ctx.term()


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    server = Broker(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.process.stop()


def _cut(monitor: zmq.Socket[Any], timeout: float = 20.0) -> None:
    """Wait for the connection ``monitor`` watches to be dropped (ZMQ_EVENT_DISCONNECTED): the event
    that says the other side refused what it was sent. Closes ``monitor`` (its context can end)."""
    try:
        assert monitor.poll(int(timeout * 1000)), f"the connection was not dropped within {timeout:.0f} s"
        assert recv_monitor_message(monitor)["event"] == zmq.EVENT_DISCONNECTED
    finally:
        monitor.close(linger=0)


def _honest_round_trip(endpoint: str, n: int = 100) -> None:
    """Another client publishes and reads its messages back: the broker serves others meanwhile."""
    key = f"honest.{time.monotonic_ns()}"
    with StreamClient(endpoint, "prices", timeout=20) as client:
        client.publish_many((key, b"%d" % i) for i in range(n))
        client.flush()
        client.start(key, since=Seq(0))
        got: list[bytes] = []
        deadline = time.monotonic() + 20
        while len(got) < n and time.monotonic() < deadline:
            got += [m.body for m in client.receive_many(0.5)]
    assert got == [b"%d" % i for i in range(n)]


def test_an_oversized_frame_costs_the_broker_nothing(broker: Broker) -> None:
    """One 256 MiB PUBLISH from a raw peer grew the broker from 56 to 825 MB; ZeroMQ now drops the
    peer's connection at the frame's header, before reading it into memory."""
    _honest_round_trip(broker.endpoint)
    before = broker.memory()
    peer = RawPeer(broker.endpoint)
    try:
        cut = peer.watch_disconnect()
        peer.sock.send(encode(Publish(key="k", body=bytes(256 * MiB))), copy=False)
        _cut(cut)  # the broker dropped the connection at the frame's header
        assert peer.recv(0.5) is None  # and answered nothing
    finally:
        peer.close()
    _honest_round_trip(broker.endpoint)
    assert broker.memory("VmHWM") - before < 32 * MiB, "the frame was never read into memory"


def test_a_message_over_the_limit_is_refused_and_nothing_of_its_frame_is_journaled(broker: Broker) -> None:
    peer = RawPeer(broker.endpoint)
    try:
        big = bytes(DEFAULT_MAX_MESSAGE_BYTES + 1)  # over the limit, within the frame bound: read, refused
        peer.sock.send(encode(Publish(key="k", body=big)))
        answer = peer.recv()
        assert isinstance(answer, InvalidCode) and answer.code == Refusal.TOO_LARGE, answer
        assert f"{len(big)} bytes is over this stream's limit" in answer.reason
        peer.sock.send(encode_publish_batch([("small", b"x"), ("big", big)]))  # a batch goes whole or not at all
        answer = peer.recv()
        assert isinstance(answer, InvalidCode) and answer.code == Refusal.TOO_LARGE
    finally:
        peer.close()
    with StreamClient(broker.endpoint, "prices") as client:
        assert client.fetch().messages == [], "nothing of the refused frames was journaled"


def test_a_peer_granting_huge_credit_and_reading_nothing_holds_at_most_the_credit_cap(broker: Broker) -> None:
    """Credit is capped (64 MiB): a peer that grants 2^63 and never reads makes the broker queue that
    much for it, not the whole stream, while 512 MiB are published (measured without the cap: the
    broker grew by 446 MiB)."""
    peer = RawPeer(broker.endpoint)
    peer.sock.setsockopt(zmq.RCVBUF, 4096)  # a peer that reads nothing: the kernel buffers little for it
    try:
        peer.sock.send(encode(Subscribe(pattern="", latest=0)))
        assert peer.recv() == SubscribeOk()
        for _ in range(4):
            peer.sock.send(encode(Credit(credit=2**62)))
        before = broker.memory()
        body = bytes(64 * 1024)
        with StreamClient(broker.endpoint, "prices", timeout=30) as publisher:
            for _ in range(128):  # 4 MiB at a time: what waits in the broker's receive queue stays small
                publisher.publish_many(("flood", body) for _ in range(64))
                publisher.flush()
        _honest_round_trip(broker.endpoint)
        grew = broker.memory("VmHWM") - before
        assert grew < PEER_BOUND, f"the broker grew by {grew / MiB:.0f} MiB for one peer"
    finally:
        peer.close()


def _non_readers(endpoint: str, count: int) -> list[RawPeer]:
    """``count`` peers subscribed to everything from the start that never read: ZeroMQ takes one
    frame off their connection at most (``RCVHWM`` 1), the kernel a few KiB."""
    peers = []
    for _ in range(count):
        peer = RawPeer(endpoint)
        peers.append(peer)
        peer.sock.setsockopt(zmq.RCVBUF, 4096)
        peer.sock.setsockopt(zmq.RCVHWM, 2)
        peer.sock.send(encode(Subscribe(pattern="", latest=0)))
        assert peer.recv() == SubscribeOk()
    return peers


def _flood_granting_credit(broker: Broker, peers: list[RawPeer], mib: int) -> None:
    """Publish ``mib`` MiB while each peer grants its whole credit again after every 4 MiB (as a client
    would that read what it got)."""
    body = bytes(64 * 1024)
    with StreamClient(broker.endpoint, "prices", timeout=30) as publisher:
        for _ in range(mib // 4):
            publisher.publish_many(("flood", body) for _ in range(64))
            publisher.flush()
            for peer in peers:
                peer.sock.send(encode(Credit(credit=MAX_CREDIT_BYTES)))


def test_a_peer_granting_credit_again_and_again_and_reading_nothing_holds_at_most_its_bytes_in_flight(
    tmp_path: Path,
) -> None:
    """Credit is a balance, not proof of reading: a peer that grants it again each time, reading
    nothing, had the broker queue every byte granted in its socket (ZeroMQ's queue holds 10,000
    frames of up to 1 MiB). Deliveries now count as in flight until ZeroMQ wrote them to the peer's
    connection, and stop at the session's bytes in flight (16 MiB). Here 512 MiB are published."""
    broker = Broker(tmp_path)
    broker.start()
    try:
        [peer] = peers = _non_readers(broker.endpoint, 1)
        before = broker.memory()
        _flood_granting_credit(broker, peers, 512)
        _honest_round_trip(broker.endpoint)  # (and the deliveries the last grants allowed meanwhile)
        grew = broker.memory("VmHWM") - before
        assert grew < DEFAULT_MAX_SESSION_BYTES_IN_FLIGHT + 96 * MiB, f"the broker grew by {grew / MiB:.0f} MiB"
        peer.close()
    finally:
        broker.process.stop()


def test_many_peers_reading_nothing_hold_at_most_the_brokers_bytes_in_flight(tmp_path: Path) -> None:
    """Bytes in flight are bounded for the whole broker too: eight peers that read nothing, each
    allowed 64 MiB in flight, hold 16 MiB together (and a frame each), not 512 MiB; and a client that
    reads is still served beside them (a peering with nothing in flight always gets a frame)."""
    broker = Broker(tmp_path, "--max-session-bytes-in-flight", str(64 * MiB), "--max-bytes-in-flight", str(16 * MiB))
    broker.start()
    try:
        peers = _non_readers(broker.endpoint, 8)
        before = broker.memory()
        _flood_granting_credit(broker, peers, 256)
        _honest_round_trip(broker.endpoint)
        grew = broker.memory("VmHWM") - before
        assert grew < (16 + 8 + 96) * MiB, f"the broker grew by {grew / MiB:.0f} MiB"
        for peer in peers:
            peer.close()
    finally:
        broker.process.stop()


def test_past_its_memory_budget_a_broker_refuses_new_clients_naming_the_budget(tmp_path: Path) -> None:
    """The broker reads its resident memory (``/proc/self/statm``) at start and every second; past
    ``--max-memory-bytes`` a client's ATTACH is refused BUSY, and the client's error says why."""
    broker = Broker(tmp_path, "--max-memory-bytes", str(1 * MiB))  # a Python process holds tens of MiB
    broker.start()
    try:
        refused = r"refused: the broker uses \d+ MiB, past its memory budget of 1 MiB \(--max-memory-bytes\)"
        with pytest.raises(BrokerUnavailableError, match=refused), StreamClient(broker.endpoint, "prices", timeout=5):
            pass
    finally:
        broker.process.stop()


def test_ten_thousand_subscriptions_from_one_peer_are_refused_past_the_limit(broker: Broker) -> None:
    peer = RawPeer(broker.endpoint)
    try:
        before = broker.memory()
        for i in range(10_000):
            peer.sock.send(encode(Subscribe(pattern=f"~^k{i}(a|b)*c", latest=0)))
        answers = [peer.recv() for _ in range(10_000)]
        assert answers.count(SubscribeOk()) == 64
        refused = [a for a in answers if isinstance(a, InvalidCode)]
        assert len(refused) == 10_000 - 64 and {a.code for a in refused} == {Refusal.LIMIT}
        _honest_round_trip(broker.endpoint)
        assert broker.memory("VmHWM") - before < 32 * MiB
    finally:
        peer.close()
    assert broker.process.running()


def test_regex_subscriptions_from_many_peers_are_bounded_for_the_whole_broker(tmp_path: Path) -> None:
    """Per-peer limits do not bound many peers: 40 peers, each well under its own 64, ask for 25
    regular-expression subscriptions; the broker (``--max-regex-subscriptions 200``) takes 200 of
    them in all, refuses the rest with LIMIT naming the budget, and serves an honest client; peers
    that leave give their share back."""
    server = Broker(tmp_path)
    server.process.argv += ["--max-regex-subscriptions", "200"]
    server.start()
    peers = [RawPeer(server.endpoint) for _ in range(40)]
    try:
        for i, peer in enumerate(peers):
            for j in range(25):
                peer.sock.send(encode(Subscribe(pattern=f"~^k{i}-{j}(a|b)*c", latest=0)))
        answers = [peer.recv() for peer in peers for _ in range(25)]
        assert answers.count(SubscribeOk()) == 200
        refused = [a for a in answers if isinstance(a, InvalidCode)]
        assert len(refused) == 800 and {a.code for a in refused} == {Refusal.LIMIT}
        assert "regular-expression subscriptions, its limit" in refused[0].reason
        _honest_round_trip(server.endpoint)
        for peer in peers:  # all leave: the budget is free again
            peer.sock.send(encode(Detach()))
        # The broker answers DETACH-OK in the step that forgets the session (and its subscriptions):
        # once every peer has its answer, all 200 are given back.
        assert [peer.recv() for peer in peers] == [DetachOk()] * len(peers)
        late = RawPeer(server.endpoint)
        peers.append(late)
        for j in range(30):
            late.sock.send(encode(Subscribe(pattern=f"~^late{j}", latest=0)))
        assert [late.recv() for _ in range(30)] == [SubscribeOk()] * 30
    finally:
        for peer in peers:
            peer.close()
        server.process.stop()


def test_a_hostile_broker_cannot_fill_a_clients_memory_with_huge_frames(tmp_path: Path) -> None:
    """Whatever answers at a stream's address may be hostile too: after ATTACH-OK it sends a client
    that reads nothing three 100 MiB frames. The client's DEALER refuses frames over the largest a
    broker sends (ZMQ_MAXMSGSIZE: the connection drops before the frame is read into memory); before,
    all three sat in its receive queue. The client is a process of its own, so its memory is its own."""
    ctx: zmq.Context[Any] = zmq.Context()
    fake = ctx.socket(zmq.ROUTER)
    fake.setsockopt(zmq.LINGER, 0)
    port = fake.bind_to_random_port("tcp://127.0.0.1")
    script = ("import signal, sys\nfrom zeps.client import StreamClient\n"
              "c = StreamClient(sys.argv[1], 'prices', timeout=10, idempotent=False).connect()\n"
              "print('attached', flush=True)\nsignal.pause()\n")  # fmt: skip
    client = ManagedProcess("client", [sys.executable, "-c", script, f"tcp://127.0.0.1:{port}"],
                            log_path=tmp_path / "client.log")  # fmt: skip
    client.start()
    try:
        assert fake.poll(20_000), "the client never attached"
        peer, _attach = fake.recv_multipart()
        fake.send_multipart([peer, encode(AttachOk())])
        client.wait_ready(lambda: "attached" in client.log_tail(), timeout=20)
        status = Path(f"/proc/{client.pid}/status")

        def rss() -> int:
            line = next(x for x in status.read_text().splitlines() if x.startswith("VmRSS:"))
            return int(line.split()[1]) * 1024

        before = rss()
        cut = fake.get_monitor_socket(zmq.EVENT_DISCONNECTED)
        huge = b"\xaa\xa5\x07" + b"x" * (100 * MiB)
        for _ in range(3):
            fake.send_multipart([peer, huge], copy=False)
        _cut(cut)  # the client dropped the connection at the first frame's header (the rest go with it)
        grown = rss() - before
        assert grown < 50 * MiB, f"the client's memory grew {grown // MiB} MiB"
    finally:
        client.stop()
        fake.close()
        ctx.term()


def test_connections_past_the_budget_are_refused_at_their_handshake_and_free_again_when_they_close(
    tmp_path: Path,
) -> None:
    """Peers that only connect (a TCP connection each, never a byte) took a file descriptor and ZeroMQ's
    buffers each, without bound: enough of them and the broker could open no journal segment. With
    ``--max-connections 16``, 16 such connections fill the budget: a client's connection is refused at
    its handshake, and it says so at once (not a timeout); once they close, clients get in again. The
    gauge and the counter say what happened."""
    metrics = free_port()
    server = Broker(tmp_path, "--max-connections", "16", "--metrics-port", str(metrics))
    server.start()
    host, port = server.endpoint.removeprefix("tcp://").rsplit(":", 1)

    def scraped(name: str) -> float:
        text = urllib.request.urlopen(f"http://127.0.0.1:{metrics}/metrics", timeout=10).read().decode()
        return next((float(line.split()[-1]) for line in text.splitlines() if line.startswith(f"{name} ")), -1.0)

    silent = [socket.create_connection((host, int(port)), timeout=10) for _ in range(16)]
    try:
        assert "connection budget 16" in server.process.log_tail()
        until(lambda: scraped("zeps_broker_connections") == 16, "the 16 counted (the gauge, once a second)")
        with pytest.raises(BrokerUnavailableError, match="connection budget is full"):
            StreamClient(server.endpoint, "prices", timeout=20).connect()
        assert scraped("zeps_broker_connections_refused_total") >= 1
    finally:
        for s in silent:
            s.close()
    until(lambda: scraped("zeps_broker_connections") == 0, "the closed connections forgotten")
    _honest_round_trip(server.endpoint)
    server.process.stop()
