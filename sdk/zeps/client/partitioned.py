"""A partitioned ZepsStream through one blocking handle: a :class:`~zeps.client.StreamClient` per
partition underneath.

::

    with PartitionedStreamClient(["tcp://b0:5555", "tcp://b1:5555"], "orders") as client:
        client.publish("customer-17", b"...")        # to partition_of("customer-17", 2)
        client.start("", since="earliest")           # every partition (or partitions=[...])
        for message in client.receive_many(1.0):     # PartitionMessage: partition, sequence, key, ...
            position = client.position               # per partition, the last sequence taken

Each partition is a stream of its own: its sequences, its journal, its replicas and leader, its
idempotent producer table. So what the single-partition client promises holds per partition:
order, replay, exactly-once with a named ``producer_id`` (the same name on every partition: each
broker keeps its own table), failover. Across partitions there is no order: messages of one key
are in order (a key has one partition), messages of different partitions arrive as they come.

A reader's place is a :class:`Position`, the last sequence taken from each partition; give it back
as ``since`` to resume exactly after it (it serialises to JSON). Partitions added since it was taken
are read from their start: they hold only records published after they were added.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, NamedTuple

import zmq

from zeps.client.session import Message, Seq, Since
from zeps.client.sync import StreamClient
from zeps.errors import ConfigError, ZepsError
from zeps.partitioning import MAX_PARTITIONS, partition_of

__all__ = ["PartitionMessage", "PartitionedStreamClient", "Position"]


class PartitionMessage(NamedTuple):
    """A message of a partitioned stream: a :class:`~zeps.client.Message` and its partition."""

    partition: int
    sequence: int  #: within its partition
    key: str
    body: bytes
    timestamp_ms: int | None


@dataclass(frozen=True)
class Position:
    """Where a reader of a partitioned stream is: for each partition, the last sequence it took
    (0: none yet). Resumable (``since=position``) and serialisable (:meth:`to_json`)."""

    last: tuple[int, ...]

    def __post_init__(self) -> None:
        if not 1 <= len(self.last) <= MAX_PARTITIONS or any(s < 0 for s in self.last):
            raise ConfigError(f"a position holds 1..{MAX_PARTITIONS} sequences, none negative: {self.last!r}")

    @classmethod
    def start(cls, partitions: int) -> Position:
        """Before every partition's first record."""
        return cls((0,) * partitions)

    def after(self, partition: int) -> int:
        """The last sequence taken from ``partition`` (0 for a partition added since)."""
        return self.last[partition] if partition < len(self.last) else 0

    def to_json(self) -> str:
        return json.dumps({"last": list(self.last)})

    @classmethod
    def from_json(cls, text: str) -> Position:
        """The position :meth:`to_json` wrote; ConfigError saying what is wrong with anything else."""
        try:
            last = json.loads(text)["last"]
            if not (isinstance(last, list) and all(isinstance(s, int) and not isinstance(s, bool) for s in last)):
                raise TypeError("not a list of integers")
        except (ValueError, KeyError, TypeError) as exc:
            expected = '{"last": [<sequence per partition>, ...]}'
            raise ConfigError(f"not a saved position ({exc}): expected {expected}") from None
        return cls(tuple(last))


class PartitionedStreamClient:
    """One handle on every partition of a stream: ``endpoints[p]`` is partition ``p``'s broker (or
    its leader's, with ``locators`` following it across failovers). ``options`` go to each
    partition's :class:`~zeps.client.StreamClient`. Not thread-safe: one thread uses it."""

    def __init__(
        self,
        endpoints: Sequence[str],
        stream: str,
        *,
        locators: Sequence[Any] | None = None,
        **options: Any,
    ) -> None:
        if not 1 <= len(endpoints) <= MAX_PARTITIONS:
            raise ConfigError(f"a partitioned stream has 1..{MAX_PARTITIONS} partitions: give an endpoint for each "
                              f"(got {len(endpoints)})")  # fmt: skip
        if locators is not None and len(locators) != len(endpoints):
            raise ConfigError(f"give a locator for each partition ({len(endpoints)}), or none (got {len(locators)})")
        self.stream = stream
        self.clients = [
            StreamClient(endpoint, stream, locator=locators[p] if locators else None, **options)
            for p, endpoint in enumerate(endpoints)
        ]
        self.reading: list[int] = []  # the partitions subscribed to
        self._last: list[int] = [0] * len(self.clients)
        self._next = 0  # the partition whose messages are taken first next time (no partition starves)

    @property
    def partitions(self) -> int:
        return len(self.clients)

    def connect(self) -> PartitionedStreamClient:
        for client in self.clients:
            client.connect()
        return self

    def close(self) -> None:
        """Close every partition's client (confirming what each holds); the first error is raised
        once all are closed."""
        failure: ZepsError | None = None
        for client in self.clients:
            try:
                client.close()
            except ZepsError as exc:
                failure = failure or exc
        if failure is not None:
            raise failure

    def __enter__(self) -> PartitionedStreamClient:
        try:
            return self.connect()
        except BaseException:
            self.close()
            raise

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            self.close()
        except ZepsError as error:
            if exc is None:
                raise
            exc.add_note(f"and closing the client failed: {error}")

    # -- publishing -----------------------------------------------------------------------------
    def partition_of(self, key: str) -> int:
        """The partition ``key``'s records go to (:func:`zeps.partitioning.partition_of`)."""
        return partition_of(key, len(self.clients))

    def publish(self, key: str, body: bytes) -> None:
        self.clients[partition_of(key, len(self.clients))].publish(key, body)

    def publish_many(self, items: Iterable[tuple[str, bytes]]) -> None:
        """Publish each to its key's partition, in order per partition (so per key)."""
        n = len(self.clients)
        if n == 1:
            self.clients[0].publish_many(items)
            return
        by_partition: dict[int, list[tuple[str, bytes]]] = {}
        for item in items:
            by_partition.setdefault(partition_of(item[0], n), []).append(item)
        for p, part in by_partition.items():
            self.clients[p].publish_many(part)

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every partition's broker confirmed every publish so far."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for client in self.clients:
            client.flush(None if deadline is None else max(0.0, deadline - time.monotonic()))

    # -- reading --------------------------------------------------------------------------------
    def start(
        self, pattern: str = "", *, since: Since | Position = "latest", partitions: Iterable[int] | None = None
    ) -> None:
        """Subscribe on ``partitions`` (all by default) to keys matching ``pattern``; ``since`` as for
        :meth:`StreamClient.start`, or a :class:`Position` to resume right after it."""
        chosen = sorted(set(range(len(self.clients)) if partitions is None else partitions))
        if not chosen or not all(0 <= p < len(self.clients) for p in chosen):
            raise ConfigError(f"partitions must be some of 0..{len(self.clients) - 1}, not {partitions!r}")
        for p in chosen:
            start: Since = Seq(since.after(p)) if isinstance(since, Position) else since
            if isinstance(since, Position):
                self._last[p] = since.after(p)
            self.clients[p].start(pattern, since=start)
        self.reading = sorted({*self.reading, *chosen})

    @property
    def position(self) -> Position:
        """The last sequence taken from each partition (0: none yet)."""
        return Position(tuple(self._last))

    def receive_many(self, timeout: float, max_messages: int = 100_000) -> list[PartitionMessage]:
        """What every partition read has delivered so far, up to ``max_messages``, waiting up to
        ``timeout`` seconds for the first; [] if none came."""
        if not self.reading:
            raise ConfigError("nothing to receive: start() a subscription first")
        deadline = time.monotonic() + timeout
        while True:
            got = self._take(max_messages)
            if got or time.monotonic() >= deadline:
                return got
            self._wait(min(deadline - time.monotonic(), 0.1))

    def _take(self, max_messages: int) -> list[PartitionMessage]:
        out: list[PartitionMessage] = []
        order = self.reading[self._next :] + self.reading[: self._next]
        self._next = (self._next + 1) % len(self.reading)
        for p in order:
            if len(out) >= max_messages:
                break
            messages: list[Message] = self.clients[p].receive_many(0, max_messages - len(out))
            if messages:
                self._last[p] = messages[-1].sequence
                out += [PartitionMessage(p, *m) for m in messages]
        return out

    def _wait(self, seconds: float) -> None:
        """Until one of the partitions read has input (or ``seconds`` pass)."""
        if seconds <= 0:
            return
        poller = zmq.Poller()
        for p in self.reading:
            for sock in self.clients[p].sockets():
                poller.register(sock, zmq.POLLIN)
        poller.poll(int(seconds * 1000))
