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
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from zeps.client._transport import Opened, curve_options
from zeps.client.discovery import PartitionWatch, growth_of, locator_of
from zeps.client.session import Message, Seq, Since
from zeps.client.sync import StreamClient, wait_any
from zeps.config import Resolved
from zeps.errors import ConfigError, ZepsError
from zeps.partitioning import MAX_PARTITIONS, partition_of

__all__ = ["GroupConsumer", "PartitionMessage", "PartitionedStreamClient", "Position"]


ROUTES_REMEMBERED = 65_536  #: keys whose partition a client remembers (then it starts over)


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


class PartitionedStreamClient(Opened):
    """One handle on every partition of a stream: ``endpoints[p]`` is partition ``p``'s broker (or
    its leader's, with ``locators`` following it across failovers). ``options`` go to each
    partition's :class:`~zeps.client.StreamClient`. With ``growth``, partitions added to the stream
    join the client at its next publish or receive. Not thread-safe: one thread uses it."""

    def __init__(
        self,
        endpoints: Sequence[str],
        stream: str,
        *,
        locators: Sequence[Any] | None = None,
        growth: PartitionWatch | None = None,
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
        self._held: deque[PartitionMessage] = deque()  # taken from the partitions, not handed out yet
        self._routes: dict[str, int] = {}  # key -> partition, for the last keys published
        self.growth, self._options = growth, options  # partitions added to the stream join this client
        self._connected = False
        self._pattern: str | None = None  # what a reader of every partition subscribed to (None: not that)

    @classmethod
    def of(cls, settings: Resolved, *, follow_growth: bool = True, **options: Any) -> PartitionedStreamClient:
        """A client of a resolved partitioned stream (:func:`zeps.config.resolve`): each partition's
        endpoint from ``settings.partitions`` (the operator's status, or ZEPS_STREAM_<NAME>_PARTITIONS),
        a locator each when ZooKeeper is known (each partition's leader, across failovers), the CURVE
        keys and message limit as :meth:`StreamClient.of`, and (``follow_growth``) a
        :class:`~zeps.client.discovery.PartitionWatch` so that partitions added later join it. Not
        connected yet."""
        endpoints = settings.partitions or (settings.endpoint,)
        wanted = settings.spec.get("partitions", len(endpoints))
        if wanted != len(endpoints):
            raise ConfigError(
                f"ZepsStream {settings.namespace}/{settings.name} has {wanted} partitions and endpoints for "
                f"{len(endpoints)}: wait until the operator lists them all (status.partitions), or set "
                f"ZEPS_STREAM_{settings.name.upper().replace('-', '_')}_PARTITIONS to every partition's endpoint"
            )
        followers = bool(options.get("follower_reads", False))  # a reader of each partition's followers
        locators = (
            [locator_of(settings, followers=followers, partition=p) for p in range(len(endpoints))]
            if settings.zookeeper
            else None
        )
        growth = growth_of(settings, followers=followers) if follow_growth else None
        return cls(endpoints, settings.name, locators=locators, growth=growth, **curve_options(settings),
                   max_message_bytes=settings.max_message_bytes, **options)  # fmt: skip

    @property
    def partitions(self) -> int:
        return len(self.clients)

    def connect(self) -> PartitionedStreamClient:
        if self.growth is not None:
            self.growth.start()
        for client in self.clients:
            client.connect()
        self._connected = True
        return self

    def close(self) -> None:
        """Close every partition's client (confirming what each holds); the first error is raised
        once all are closed."""
        if self.growth is not None:
            self.growth.close()
        failure: ZepsError | None = None
        for client in self.clients:
            try:
                client.close()
            except ZepsError as exc:
                failure = failure or exc
        if failure is not None:
            raise failure

    def _grow(self) -> None:
        """The stream has more partitions than this client (``growth`` says): a client for each one
        added, once its broker is registered (:meth:`PartitionWatch.added`). From then on keys go to
        their partition among all of them (only the slots reassigned move), and a reader of every
        partition reads the new ones from their start."""
        added = self.growth.added(len(self.clients)) if self.growth is not None else []
        for endpoint, locator in added:
            p = len(self.clients)
            client = StreamClient(endpoint, self.stream, locator=locator, **self._options)
            if self._connected:
                client.connect()
            if self._pattern is not None:
                client.start(self._pattern, since="earliest")
                self.reading.append(p)
            self.clients.append(client)
            self._last.append(0)
        if added:
            self._routes.clear()

    @property
    def _grown(self) -> bool:
        return self.growth is not None and self.growth.count > len(self.clients)

    # -- publishing -----------------------------------------------------------------------------
    def partition_of(self, key: str) -> int:
        """The partition ``key``'s records go to (:func:`zeps.partitioning.partition_of`), remembered
        for the last keys seen (computing it costs more than publishing a message)."""
        p = self._routes.get(key)
        if p is None:
            if len(self._routes) >= ROUTES_REMEMBERED:
                self._routes.clear()  # bounded: a stream of ever new keys costs the hash, never memory
            p = self._routes[key] = partition_of(key, len(self.clients))
        return p

    def publish(self, key: str, body: bytes) -> None:
        growth = self.growth  # inline, not the property: this is the one-message path
        if growth is not None and growth.count > len(self.clients):
            self._grow()
        self.clients[self.partition_of(key)].publish(key, body)

    def publish_many(self, items: Iterable[tuple[str, bytes]]) -> None:
        """Publish each to its key's partition, in order per partition (so per key)."""
        if self._grown:
            self._grow()
        if len(self.clients) == 1:
            self.clients[0].publish_many(items)
            return
        by_partition: dict[int, list[tuple[str, bytes]]] = {}
        routes, route = self._routes, self.partition_of
        for item in items:
            p = routes.get(item[0])
            if p is None:
                p = route(item[0])
            part = by_partition.get(p)
            if part is None:
                part = by_partition[p] = []
            part.append(item)
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
        self._pattern = pattern if partitions is None else None  # partitions added later are read too

    def subscribe(
        self, pattern: str = "", *, since: Since | Position = "latest", partitions: Iterable[int] | None = None
    ) -> Iterator[PartitionMessage]:
        """Messages whose key matches ``pattern`` from every partition read (see :meth:`start`), forever."""
        self.start(pattern, since=since, partitions=partitions)
        while True:
            yield from self.receive_many(0.1)

    @property
    def position(self) -> Position:
        """The last sequence taken from each partition (0: none yet)."""
        return Position(tuple(self._last))

    def receive(self, timeout: float) -> PartitionMessage | None:
        """The next message within ``timeout`` seconds, else None."""
        if not self.reading:
            raise ConfigError("nothing to receive: start() a subscription first")
        if not self._held:
            self._held.extend(self._receive(timeout, 100_000))
        return self._handed([self._held.popleft()])[0] if self._held else None

    def receive_many(self, timeout: float, max_messages: int = 100_000) -> list[PartitionMessage]:
        """What every partition read has delivered so far, up to ``max_messages``, waiting up to
        ``timeout`` seconds for the first; [] if none came."""
        if not self.reading:
            raise ConfigError("nothing to receive: start() a subscription first")
        return self._handed(self._receive(timeout, max_messages))

    def _receive(self, timeout: float, max_messages: int) -> list[PartitionMessage]:
        if self._grown:
            self._grow()
        if self._held:  # what receive() took and has not handed out yet comes first
            return [self._held.popleft() for _ in range(min(max_messages, len(self._held)))]
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
            out += [PartitionMessage(p, *m) for m in messages]
        return out

    def _handed(self, messages: list[PartitionMessage]) -> list[PartitionMessage]:
        """``messages`` go to the application now: the position moves past them."""
        for m in messages:
            self._last[m.partition] = m.sequence
        return messages

    def _wait(self, seconds: float) -> None:
        """Until one of the partitions read has input (or ``seconds`` pass)."""
        if seconds > 0:
            wait_any([self.clients[p] for p in self.reading], seconds)


class GroupConsumer(Opened):
    """A member of consumer group ``group`` of a partitioned stream: it reads the partitions the
    group assigns it (:func:`zeps.coordination.consumers.assign` of the live members), each from
    right after the last sequence the group processed of it, and hands them over as members come
    and go (``endpoints`` and ``locators`` as for :class:`PartitionedStreamClient`).

    As Kafka's consumer: calling :meth:`receive_many` again (or :meth:`commit`) says that what it
    returned before is processed; that is committed to ZooKeeper, and a partition given up is
    committed first, so its next owner starts right after it. A member that dies leaves what it
    processed after its last commit to be processed again by the next owner: make the handler
    idempotent (keep the (partition, sequence) processed with its effect) where once matters.
    Partitions nobody processed yet are read from their start (everything retained)."""

    def __init__(
        self,
        endpoints: Sequence[str],
        stream: str,
        *,
        group: str,
        member: str,
        zookeeper: str,
        namespace: str = "default",
        chroot: str = "/zeps",
        auth: tuple[str, str] | None = None,
        ca: str = "",
        locators: Sequence[Any] | None = None,
        pattern: str = "",
        session_timeout: float = 10.0,
        growth: PartitionWatch | None = None,
        **options: Any,
    ) -> None:
        from zeps.coordination import connect  # noqa: PLC0415 — ZooKeeper only for groups
        from zeps.coordination.consumers import ConsumerGroup  # noqa: PLC0415
        from zeps.paths import StreamPaths  # noqa: PLC0415

        if locators is not None and len(locators) != len(endpoints):
            raise ConfigError(f"give a locator for each partition ({len(endpoints)}), or none (got {len(locators)})")
        self.endpoints, self.stream, self.pattern = list(endpoints), stream, pattern
        self.locators, self.options = locators, options
        self._zk = connect(zookeeper, auth=auth, ca=ca, session_timeout=session_timeout)
        paths = StreamPaths.of(namespace, stream, chroot=chroot).consumer_group(group)
        self.group = ConsumerGroup(self._zk, paths, member)
        self.claims: dict[int, Any] = {}  # partition -> Claim
        self.clients: dict[int, StreamClient] = {}
        self._handed: dict[int, int] = {}  # partition -> the last sequence handed to the application
        self._unclaimed = False  # a partition assigned to us is still another's: claim it again soon
        self._looked = 0.0
        self._turn = 0
        self.growth = growth  # partitions added to the stream are shared by the group too
        #: what is read is handed out only while ownership was checked this recently (a session may
        #: expire, and another member own the partitions, only once ZooKeeper heard nothing for a
        #: whole session timeout)
        self.lease_s = session_timeout / 2
        self._checked = float("-inf")  # when the last ownership check began

    @classmethod
    def of(cls, settings: Resolved, *, group: str, member: str, **options: Any) -> GroupConsumer:
        """A member of ``group`` for a resolved partitioned stream (its ZooKeeper must be known)."""
        if not settings.zookeeper:
            raise ConfigError(f"a consumer group of ZepsStream {settings.namespace}/{settings.name} needs ZooKeeper: "
                              "set ZEPS_ZOOKEEPER or read the stream's status")  # fmt: skip
        endpoints = settings.partitions or (settings.endpoint,)
        locators = [locator_of(settings, partition=p) for p in range(len(endpoints))]
        return cls(endpoints, settings.name, group=group, member=member, zookeeper=settings.zookeeper,
                   namespace=settings.namespace, chroot=settings.chroot, auth=settings.auth, ca=settings.zookeeper_ca,
                   locators=locators, growth=growth_of(settings), **curve_options(settings),
                   max_message_bytes=settings.max_message_bytes, **options)  # fmt: skip

    @property
    def assigned(self) -> list[int]:
        """The partitions this member reads now."""
        return sorted(self.claims)

    def connect(self) -> GroupConsumer:
        if self.growth is not None:
            self.growth.start()
        self.group.join()
        return self

    def _grow(self) -> None:
        """The stream has more partitions than this member knows: learn their endpoints (once each
        has a broker registered) and share them out again (:func:`assign` of the larger count)."""
        added = self.growth.added(len(self.endpoints)) if self.growth is not None else []
        for endpoint, locator in added:
            self.endpoints.append(endpoint)
            if self.locators is not None:
                self.locators = [*self.locators, locator]
        if added:
            self.group.changed.set()

    def receive_many(self, timeout: float, max_messages: int = 100_000) -> list[PartitionMessage]:
        """Commit what the last call returned, take up or give up partitions as the group changed,
        then what the partitions read delivered, waiting up to ``timeout`` seconds for the first."""
        self.commit()
        deadline = time.monotonic() + timeout
        while True:
            if self.growth is not None and self.growth.count > len(self.endpoints):
                self._grow()
            self._rebalance()
            if not self._owning():
                if time.monotonic() >= deadline:
                    return []
                time.sleep(min(deadline - time.monotonic(), 0.1))  # ZooKeeper is away: nothing is handed out
                continue
            out: list[PartitionMessage] = []
            order = sorted(self.clients.items())
            self._turn = (self._turn + 1) % max(1, len(order))  # which partition goes first: none starves
            for p, client in order[self._turn :] + order[: self._turn]:
                if len(out) >= max_messages:
                    break
                out += [PartitionMessage(p, *m) for m in client.receive_many(0, max_messages - len(out))]
            for m in out:
                self._handed[m.partition] = m.sequence
            if out or time.monotonic() >= deadline:
                return out
            self._wait(min(deadline - time.monotonic(), 0.1))

    def _owning(self) -> bool:
        """Whether this member's claims are known fresh (checked within :attr:`lease_s`; checked now
        if not): the partitions lost meanwhile are dropped, unread. False while ZooKeeper cannot say."""
        if time.monotonic() - self._checked < self.lease_s or not self.claims:
            return True
        began = time.monotonic()
        try:
            lost = self.group.lost(list(self.claims.values()))
        except ZepsError:
            return False
        for p in lost:
            self._drop(p)
        if lost:
            self.group.changed.set()
        self._checked = began
        return True

    def commit(self) -> None:
        """The group has processed everything handed out so far. A partition lost meanwhile (this
        member's session expired and another member claimed it) is dropped: its messages handed out
        since the last commit are the new owner's to process."""
        from zeps.coordination.consumers import PartitionLostError  # noqa: PLC0415

        for p, claim in list(self.claims.items()):
            if self._handed.get(p, 0) > claim.sequence:
                try:
                    self.group.commit(claim, self._handed[p])
                except PartitionLostError:
                    self._drop(p)
                    self.group.changed.set()

    def _rebalance(self) -> None:
        now = time.monotonic()
        if not self.group.changed.is_set() and not (self._unclaimed and now - self._looked > 0.2):
            return
        self.group.changed.clear()
        self._looked = now
        wanted = set(self.group.wanted(len(self.endpoints)))
        for p in sorted(set(self.claims) - wanted):  # another member's now: processed up to what we handed out
            claim = self.claims[p]
            self._drop(p)
            self.group.release(claim)
        self._unclaimed = False
        for p in sorted(wanted - set(self.claims)):
            claim = self.group.claim(p)
            if claim is None:  # its former owner has not let go yet
                self._unclaimed = True
                continue
            client = StreamClient(self.endpoints[p], self.stream, locator=self.locators[p] if self.locators else None,
                                  **self.options)  # fmt: skip
            client.connect()
            client.start(self.pattern, since=Seq(claim.sequence))
            self.claims[p], self.clients[p] = claim, client
            self._handed[p] = claim.sequence

    def _drop(self, partition: int) -> None:
        self.claims.pop(partition, None)
        self._handed.pop(partition, None)
        client = self.clients.pop(partition, None)
        if client is not None:
            client.locator = None  # the locator is this consumer's, shared across its claims: kept open
            client.close()

    def _wait(self, seconds: float) -> None:
        if seconds <= 0:
            return
        if not self.clients:
            time.sleep(min(seconds, 0.05))  # nothing assigned yet, or waiting for a former owner
            return
        wait_any(self.clients.values(), seconds)

    def close(self) -> None:
        """Commit, give every partition up (the next owners start after what was processed), leave."""
        try:
            self.commit()
            for p in list(self.claims):
                claim = self.claims[p]
                self._drop(p)
                self.group.release(claim)
            self.group.leave()
        finally:
            for locator in self.locators or []:
                if locator is not None:
                    locator.close()
            if self.growth is not None:
                self.growth.close()
            self._zk.stop()
            self._zk.close()
