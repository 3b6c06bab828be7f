"""A lingering client (``StreamClient(linger=…)``) against a real broker over real sockets: one-at-a-time
publishes that follow each other closely go out together in PUBLISH-BATCHes, in order, each once;
the first after a quiet spell goes at once; what waits goes out at the client's next call, or from
its linger thread when the application calls nothing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from zeps.broker import BrokerConfig, BrokerServer
from zeps.client import AsyncStreamClient, StreamClient
from zeps.client._transport import HOLD_MESSAGES
from zeps.errors import ConfigError
from zeps.journal import JournalConfig

BrokerFactory = Callable[..., BrokerServer]


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerServer]:
    server = BrokerServer(BrokerConfig(tmp_path / "broker", ("prices",), journal=JournalConfig(fsync="group"))).start()
    yield server
    server.stop()


def _take(client: StreamClient, n: int, timeout: float = 30.0) -> list[Any]:
    out: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        out += client.receive_many(0.5)
    return out


@pytest.mark.parametrize("idempotent", [True, False])
def test_a_burst_of_single_publishes_goes_out_in_few_frames_in_order_each_once(
    broker: BrokerServer, idempotent: bool
) -> None:
    """5,000 publishes in a loop with a publish_many in the middle: far fewer frames than messages
    (with ``linger=0`` there is one frame per publish), every message delivered once, in order."""
    with StreamClient(broker.endpoint, "prices") as sub:
        sub.start("", since="earliest")
        with StreamClient(broker.endpoint, "prices", linger=0.05, idempotent=idempotent) as pub:
            for i in range(5000):
                pub.publish(f"k.{i % 7}", b"%d" % i)
                if i == 2500:
                    pub.publish_many((f"m.{j}", b"many %d" % j) for j in range(100))
            pub.flush()
            frames = pub.session.publish_frames
            if idempotent:
                assert pub.producer_sequence == 5100
        got = _take(sub, 5100)
    expected = [b"%d" % i for i in range(2501)] + [b"many %d" % j for j in range(100)]
    expected += [b"%d" % i for i in range(2501, 5000)]
    assert [m.body for m in got] == expected
    assert [m.sequence for m in got] == list(range(1, 5101))
    assert frames <= 2 * 5000 // HOLD_MESSAGES + 20, f"{frames} frames for 5,100 messages"


def test_a_publish_after_a_quiet_spell_goes_at_once_and_one_that_lingers_goes_out_on_its_own(
    broker: BrokerServer,
) -> None:
    """The first publish is made into a frame and sent by the call itself; the next, a moment later,
    waits; with the application calling nothing more, the linger thread sends it."""
    with StreamClient(broker.endpoint, "prices") as sub:
        sub.start("", since="earliest")
        with StreamClient(broker.endpoint, "prices", linger=1.0) as pub:
            pub.publish("k", b"first")
            assert pub.session.publish_frames == 1  # sent by the call: it came after a quiet spell
            pub.publish("k", b"second")
            assert pub.session.publish_frames == 1  # it lingers
            assert [m.body for m in _take(sub, 1)] == [b"first"]
            assert sub.receive(0.3) is None  # still waiting (a second's linger)
            got = _take(sub, 1, timeout=10)  # the publisher is not called meanwhile
            assert [m.body for m in got] == [b"second"]
            assert pub.session.publish_frames == 2


def test_what_lingers_goes_out_first_at_the_clients_next_call(broker: BrokerServer) -> None:
    """Any call sends what waits before its own work: publish_many, a receive, flush."""
    with StreamClient(broker.endpoint, "prices") as sub:
        sub.start("", since="earliest")
        with StreamClient(broker.endpoint, "prices", linger=1.0) as pub:
            pub.publish("k", b"a")
            pub.publish("k", b"b")  # lingers
            pub.publish_many([("k", b"c"), ("k", b"d")])  # b goes first, then c and d
            assert pub.session.publish_frames == 3
            pub.publish("k", b"e")  # lingers
            assert pub.receive(0) is None  # not subscribed: nothing to receive, but e goes out
            assert pub.session.publish_frames == 4
            pub.publish("k", b"f")
            pub.flush()
            assert pub.session.publish_frames == 5
            assert [m.body for m in _take(sub, 6)] == [b"a", b"b", b"c", b"d", b"e", b"f"]


def test_a_body_over_the_limit_is_refused_by_the_publish_that_lingers(broker: BrokerServer) -> None:
    """The checks a publish makes still fail the call itself, not a later one: nothing of it waits."""
    with StreamClient(broker.endpoint, "prices", linger=1.0, max_message_bytes=1024) as pub:
        pub.publish("k", b"a")
        with pytest.raises(Exception, match="over max_message_bytes"):
            pub.publish("k", bytes(2048))
        with pytest.raises(Exception, match="printable ASCII"):
            pub.publish("a key with spaces", b"x")
        pub.flush()
        assert pub.producer_sequence == 1


@pytest.mark.parametrize("linger", [-0.1, 1.5])
def test_linger_out_of_range_is_refused_naming_it(linger: float) -> None:
    with pytest.raises(ConfigError, match=r"linger=.*from 0 .* to 1"):
        StreamClient("tcp://127.0.0.1:1", "prices", linger=linger)


def test_the_asyncio_client_lingers_too_and_its_timer_sends_what_waits(broker: BrokerServer) -> None:
    """The same with AsyncStreamClient: a burst goes out in few frames, in order; the first publish
    after a quiet spell goes at once; one that lingers is sent by the event loop's timer while the
    application only awaits something else."""

    async def scenario() -> tuple[list[bytes], int, list[bytes]]:
        async with AsyncStreamClient(broker.endpoint, "prices") as sub:
            await sub.start("", since="earliest")
            async with AsyncStreamClient(broker.endpoint, "prices", linger=0.05) as pub:
                for i in range(3000):
                    await pub.publish(f"k.{i % 7}", b"%d" % i)
                await pub.flush()
                burst_frames = pub.session.publish_frames
            burst: list[bytes] = []
            while len(burst) < 3000:
                got = await sub.receive_many(10)
                assert got, f"stalled after {len(burst)}"
                burst += [m.body for m in got]
            async with AsyncStreamClient(broker.endpoint, "prices", linger=1.0) as pub:
                await pub.publish("k", b"first")
                assert pub.session.publish_frames == 1  # sent by the call
                await pub.publish("k", b"second")
                assert pub.session.publish_frames == 1  # it lingers
                assert [m.body for m in await sub.receive_many(10)] == [b"first"]
                assert await sub.receive(0.3) is None
                later = [m.body for m in await sub.receive_many(10)]  # the timer sent it
                assert pub.session.publish_frames == 2
            return burst, burst_frames, later

    burst, frames, later = asyncio.run(scenario())
    assert burst == [b"%d" % i for i in range(3000)]
    assert frames <= 2 * 3000 // HOLD_MESSAGES + 20, f"{frames} frames for 3,000 messages"
    assert later == [b"second"]


def test_the_asyncio_client_sends_what_lingers_before_a_receive_a_fetch_and_a_subscribe(
    broker: BrokerServer,
) -> None:
    """As the blocking client does, and in the same order on the wire: a receive (a reply to what
    lingers may be what it waits for), a fetch and a subscribe each send what lingers first, in a
    frame of its own, rather than leave it to the timer."""

    async def scenario() -> tuple[list[int], list[bytes]]:
        frames = []
        async with AsyncStreamClient(broker.endpoint, "prices", linger=1.0) as pub:
            await pub.publish("k", b"a")
            await pub.publish("k", b"b")  # lingers
            assert await pub.receive(0) is None  # not subscribed: nothing to receive, but b goes out
            frames.append(pub.session.publish_frames)
            await pub.publish("k", b"c")  # lingers
            await pub.fetch("")  # c goes first
            frames.append(pub.session.publish_frames)
        async with AsyncStreamClient(broker.endpoint, "prices", linger=1.0) as pub:
            await pub.publish("k", b"d")
            await pub.publish("k", b"e")  # lingers
            await pub.start("", since="earliest")  # e goes first
            frames.append(pub.session.publish_frames)
            await pub.publish("k", b"f")  # lingers; the receive below sends it
            live: list[bytes] = []
            while b"f" not in live:
                got = await pub.receive_many(0.5)
                assert got or pub.session.publish_frames == 3, "f went out with the receive, not after linger"
                live += [m.body for m in got]
            frames.append(pub.session.publish_frames)
        return frames, live

    frames, live = asyncio.run(scenario())
    assert frames == [2, 3, 2, 3], "each call sent what lingered, in a frame of its own, before its own work"
    assert live == [b"a", b"b", b"c", b"d", b"e", b"f"]
