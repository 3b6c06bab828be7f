"""Topic: broadcast pub/sub over ZooKeeper (the zkms design), made fast and safe.

Layout (:class:`zeps.paths.TopicPaths`)::

    <topic>/clients/<consumer>              ephemeral: the consumer's client is alive
    <topic>/subscribers/<consumer>          ephemeral JSON {host, pid, since}: a live subscription
    <topic>/messages/<consumer>/m-<count>-<first id>-<seq>  persistent-sequential: 1..count messages
    <topic>/parked/<consumer>/…             messages given up on with on_give_up="keep"
    <topic>/cleaner/                        leader election of the one cleaner

What differs from the zkms design, and why:

* **Publishers write to every queue under messages/**, not to the children of subscribers/. A
  queue exists from subscribe until unsubscribe, or until the cleaner removes it once its client has
  been gone for ``cleaner_grace`` seconds; so a subscriber whose session expires, or that crashes
  and restarts with the same consumer id, misses nothing published meanwhile.
* **The queue list is cached** by a children watch instead of listed per message.
* **One transaction (multi) per queue per batch**, all pipelined (async), each under
  ``max_transaction_bytes`` (jute.maxbuffer): N subscribers x k messages cost N round trips
  in flight at once, not N·k sequential ones.
* **Packed nodes**: a publish batch becomes one node per queue holding up to
  ``max_messages_per_node`` messages (:func:`zeps.envelope.encode_pack`), so the cost per message
  falls by that factor for ZooKeeper and subscribers alike. A single publish is one node, as in
  the zkms design; ``max_messages_per_node=1`` always writes one node per message.
* **Protected names**: each node name carries its message count and its first message's id
  (``m-<count>-<publisher>.<n>-<seq>``), so after a ConnectionLoss the publisher checks whether a
  transaction applied before resending it — a retry never duplicates a message.
* **Consumers read and delete in batches**: list once, read the batch pipelined, run the callbacks
  in order, delete in transactions sent while the batch runs. A node is deleted only after the
  callbacks of all its messages returned (at-least-once; a crash redelivers at most the node in
  flight and the acks not yet sent, see ``_ACK_EVERY``).

Order: a publisher's messages reach each queue in publish order (ZooKeeper applies one session's
requests in order, and a batch is fully acknowledged before the next is sent); consumers deliver in
sequence order.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import (
    ConnectionLoss,
    NoNodeError,
    RolledBackError,
    SessionExpiredError,
)

from zeps.coordination._util import bounded_retry, refused, zookeeper_errors
from zeps.coordination.cleaner import TopicCleaner
from zeps.coordination.group import Group, Member
from zeps.coordination.publisher import AsyncPublisher
from zeps.coordination.subscription import Message, Subscription
from zeps.coordination.topic_view import QueueFullError
from zeps.envelope import Envelope, encode, encode_pack
from zeps.errors import CoordinationError
from zeps.options import TopicOptions
from zeps.paths import DEFAULT_CHROOT, TopicPaths, sequence_of, validate_member_id

__all__ = ["Message", "NoSubscribersError", "QueueFullError", "Subscription", "Topic", "TopicCleaner"]

log = logging.getLogger(__name__)


class NoSubscribersError(CoordinationError):
    """Nobody subscribes to the topic (set ``no_subscribers="ignore"`` to publish to nobody)."""


class Topic:
    """A handle on one topic. No I/O happens in the constructor.

    ``client`` is a started kazoo client the caller owns. ``client_id`` names this handle as a
    publisher (part of every message id); it defaults to ``<host>-<pid>-<random>``.
    """

    def __init__(
        self,
        client: KazooClient,
        name: str,
        *,
        namespace: str = "default",
        chroot: str = DEFAULT_CHROOT,
        options: TopicOptions | None = None,
        acl: list[Any] | None = None,
        client_id: str | None = None,
    ) -> None:
        self.client = client
        self.name, self.namespace = name, namespace
        self.paths = TopicPaths.of(namespace, name, chroot=chroot)
        self.options = options or TopicOptions()
        self.acl = acl
        self.client_id = validate_member_id(client_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}")
        self._counter = itertools.count(1)
        self._queues: frozenset[str] | None = None
        self._queues_lock = threading.Lock()
        self._queues_changed = threading.Condition(self._queues_lock)
        self._ensured = False
        self._batcher: AsyncPublisher | None = None
        self._publish_lock = threading.Lock()
        self._closed = False

    # -- setup ----------------------------------------------------------------------------------
    @zookeeper_errors
    def ensure(self) -> None:
        """Create the topic's paths if missing (idempotent; the operator normally does this)."""
        if self._ensured:
            return
        for path in self.paths.delivery_layout():
            self.client.retry(self.client.ensure_path, path, acl=self.acl)
        self._ensured = True

    def _watch_queues(self) -> None:
        """Start caching the queue list (once per handle); kazoo re-arms the watch after reconnects.
        :meth:`close` ends it: kazoo drops the watch at its next event (ZooKeeper's watches cannot be
        withdrawn; kazoo's end when their function returns False)."""
        with self._queues_lock:
            if self._closed:
                raise CoordinationError(f"topic handle {self.name!r} is closed")
            if self._queues is not None:
                return
        self.ensure()
        ready = threading.Event()

        def changed(children: list[str]) -> bool:
            with self._queues_changed:
                if self._closed:
                    return False  # the handle is closed: kazoo stops calling, and lets go of it
                self._queues = frozenset(children)
                self._queues_changed.notify_all()
            ready.set()
            return True

        self.client.ChildrenWatch(self.paths.messages, changed)
        if not ready.wait(30):
            raise CoordinationError(f"could not list {self.paths.messages} within 30s")

    @zookeeper_errors
    def queues(self) -> frozenset[str]:
        """The consumer ids whose queues receive messages now (cached, kept current by a watch)."""
        self._watch_queues()
        with self._queues_lock:
            assert self._queues is not None
            return self._queues

    @zookeeper_errors
    def subscribers(self) -> dict[str, Member]:
        """Live subscriptions with their metadata (read now)."""
        return Group(self.client, self.paths.subscribers).members()

    # -- publishing -----------------------------------------------------------------------------
    @zookeeper_errors
    def publish(self, body: bytes, *, headers: dict[str, str] | None = None, content_type: str | None = None) -> str:
        """Publish one message to every subscriber; returns its id once it is durable in ZooKeeper."""
        return self.publish_many([body], headers=headers, content_type=content_type)[0]

    @zookeeper_errors
    def publish_many(
        self,
        bodies: Iterable[bytes],
        *,
        headers: dict[str, str] | None = None,
        content_type: str | None = None,
    ) -> list[str]:
        """Publish several messages, in order, in one pipelined round of transactions."""
        envelopes = [self._envelope(body, headers, content_type) for body in bodies]
        self._deliver_in_order(envelopes)
        return [e.id for e in envelopes]

    def _deliver_in_order(self, envelopes: Sequence[Envelope]) -> None:
        with self._publish_lock:  # one publish at a time: the queues' sequence order is the publish order
            self._deliver(envelopes)

    def publish_async(
        self, body: bytes, *, headers: dict[str, str] | None = None, content_type: str | None = None
    ) -> Future[str]:
        """Queue a message for a background publisher that batches whatever accumulates while the
        previous batch is in flight; the future resolves with the id once durable (or with the error).
        Order between publish_async calls of one handle is kept."""
        if self._batcher is None:
            with self._publish_lock:
                if self._batcher is None:
                    self._batcher = AsyncPublisher(self.name, self.options, self._deliver_in_order)
        return self._batcher.submit(self._envelope(body, headers, content_type))

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every publish_async message so far is durable (or failed)."""
        if self._batcher is not None:
            self._batcher.flush(timeout)

    def _envelope(self, body: bytes, headers: dict[str, str] | None, content_type: str | None) -> Envelope:
        if not isinstance(body, bytes | bytearray | memoryview):
            raise TypeError(f"message body must be bytes, not {type(body).__name__}")
        return Envelope(
            body=bytes(body),
            id=f"{self.client_id}.{next(self._counter)}",
            publisher=self.client_id,
            timestamp_ms=int(time.time() * 1000),
            content_type=content_type,
            headers=dict(headers or {}),
        )

    def _deliver(self, envelopes: Sequence[Envelope]) -> None:
        if not envelopes:
            return
        targets = sorted(self.queues())
        if not targets:
            if self.options.no_subscribers == "error":
                raise NoSubscribersError(f"topic {self.paths.root} has no subscribers")
            return
        nodes = self._pack([(e.id, encode(e)) for e in envelopes])
        drops = self._make_room(targets, len(envelopes))
        batches: list[_Txn] = []
        for consumer in targets:
            batches.extend(self._split(self.paths.queue(consumer), nodes, drops.get(consumer, [])))
        self._commit_all(batches)

    def _pack(self, encoded: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
        """Group encoded messages into nodes: (name prefix, data), each under the node limits."""
        per_node = self.options.max_messages_per_node
        byte_limit = self.options.max_transaction_bytes // 2
        nodes: list[tuple[str, bytes]] = []
        group: list[tuple[str, bytes]] = []
        size = 0

        def close() -> None:
            nodes.append((TopicPaths.message_name(len(group), group[0][0]), encode_pack([data for _, data in group])))

        for msg_id, data in encoded:
            if group and (len(group) >= per_node or size + len(data) > byte_limit):
                close()
                group, size = [], 0
            group.append((msg_id, data))
            size += len(data) + 4
        close()
        return nodes

    def _split(self, queue: str, nodes: list[tuple[str, bytes]], drops: list[str]) -> list[_Txn]:
        """Cut one queue's node creates into transactions under max_transaction_bytes (deletes first)."""
        limit = self.options.max_transaction_bytes
        txns: list[_Txn] = []
        current = _Txn(queue, deletes=[f"{queue}/{d}" for d in drops])
        size = 0
        for prefix, data in nodes:
            cost = len(data) + len(queue) + 64
            if current.creates and size + cost > limit:
                txns.append(current)
                current, size = _Txn(queue), 0
            current.creates.append((f"{queue}/{prefix}", data))
            size += cost
        txns.append(current)
        return txns

    def _make_room(self, targets: list[str], incoming: int) -> dict[str, list[str]]:
        """Apply the full-queue policy; returns nodes to delete per consumer (drop-oldest).

        Depth is counted in messages. The node count times max_messages_per_node bounds it from
        above, so only a queue that may be near full is listed to count exactly.
        """
        limit = self.options.max_queue_depth
        per_node = self.options.max_messages_per_node
        policy = self.options.full_queue_policy
        deadline = time.monotonic() + self.options.block_timeout
        while True:
            nodes = bounded_retry()(self._depths, targets)
            full: dict[str, tuple[int, list[str]]] = {}
            for consumer, count in nodes.items():
                if count * per_node + incoming <= limit:
                    continue
                try:
                    children = bounded_retry()(self.client.get_children, self.paths.queue(consumer))
                except NoNodeError:
                    continue
                depth = sum(TopicPaths.message_count(c) for c in children)
                if depth + incoming > limit:
                    full[consumer] = (depth, children)
            if not full:
                return {}
            if policy == "drop-oldest":
                drops: dict[str, list[str]] = {}
                for consumer, (depth, children) in full.items():
                    excess, dropped = depth + incoming - limit, []
                    for child in sorted(children, key=sequence_of):
                        if excess <= 0:
                            break
                        dropped.append(child)
                        excess -= TopicPaths.message_count(child)
                    drops[consumer] = dropped
                    log.warning("topic %s: queue of %s is full; dropping its %d oldest nodes",
                                self.name, consumer, len(dropped))  # fmt: skip
                return drops
            names = ", ".join(f"{c} ({d}/{limit})" for c, (d, _) in sorted(full.items()))
            if policy == "fail" or time.monotonic() >= deadline:
                waited = "" if policy == "fail" else f" after waiting {self.options.block_timeout:.0f}s"
                raise QueueFullError(f"topic {self.name}: subscriber queues full{waited}: {names}")
            time.sleep(0.05)

    def _depths(self, targets: list[str]) -> dict[str, int]:
        """Nodes per queue, read pipelined (one round trip for all queues); a vanished queue is left out."""
        stats = [(c, self.client.exists_async(self.paths.queue(c))) for c in targets]
        return {c: stat.numChildren for c, result in stats if (stat := result.get()) is not None}

    def _commit_all(self, txns: list[_Txn]) -> None:
        """Send every transaction pipelined; after ConnectionLoss, resend only what did not apply."""
        pending = txns
        retry_deadline = time.monotonic() + 120
        while pending:
            results = []
            for txn in pending:
                t = self.client.transaction()
                for path in txn.deletes:
                    t.delete(path)
                for path, data in txn.creates:
                    t.create(path, data, acl=self.acl, sequence=True)
                results.append((txn, t.commit_async()))
            unsure: list[_Txn] = []
            for txn, result in results:
                try:
                    outcome = result.get()
                except (ConnectionLoss, SessionExpiredError):
                    unsure.append(txn)
                    continue
                self._check_outcome(txn, outcome)
            if not unsure:
                return
            if time.monotonic() > retry_deadline:
                raise CoordinationError(f"topic {self.name}: could not publish within 120s (ZooKeeper unreachable)")
            self._wait_connected(retry_deadline)
            pending = [txn for txn in unsure if not self._applied(txn)]

    def _check_outcome(self, txn: _Txn, outcome: list[Any]) -> None:
        errors = [r for r in outcome if isinstance(r, Exception) and not isinstance(r, RolledBackError)]
        if not errors:
            return
        if all(isinstance(e, NoNodeError) for e in errors):
            if txn.deletes and self.client.exists(txn.queue) is not None:
                # a dropped-oldest node was consumed meanwhile: send the creates alone
                self._commit_all([_Txn(txn.queue, creates=txn.creates)])
            return  # otherwise the queue is gone: the subscriber left or was cleaned
        raise refused(f"topic {self.name}: writing to {txn.queue} failed", errors)

    def _applied(self, txn: _Txn) -> bool:
        """Did this transaction apply before the connection was lost? (protected names)"""
        if not txn.creates:
            return True
        marker = txn.creates[0][0].rsplit("/", 1)[1]
        try:
            children = bounded_retry()(self.client.get_children, txn.queue)
        except NoNodeError:
            return True  # queue gone: nothing to deliver
        return any(child.startswith(marker) for child in children)

    def _wait_connected(self, deadline: float) -> None:
        while not self.client.connected:
            if time.monotonic() > deadline:
                raise CoordinationError(f"topic {self.name}: ZooKeeper unreachable")
            time.sleep(0.05)

    # -- subscribing ----------------------------------------------------------------------------
    def subscribe(
        self,
        callback: Callable[[Message], None],
        *,
        consumer_id: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Subscription:
        """Start delivering this topic's messages to ``callback`` on a background thread.

        ``consumer_id`` is the durable identity: restart with the same id to get the messages that
        arrived meanwhile (within ``cleaner_grace``). It defaults to a random id, as in the zkms design.
        """
        self.ensure()
        sub = Subscription(self, callback, consumer_id or uuid.uuid4().hex, metadata or {})
        sub._start()
        return sub

    # -- cleaning -------------------------------------------------------------------------------
    def cleaner(self, *, identifier: str | None = None, clock: Callable[[], float] = time.monotonic) -> TopicCleaner:
        """A cleaner candidate for this topic; call ``start()`` to take part in the election. ``clock``
        measures the grace (a test's own)."""
        return TopicCleaner(self, identifier=identifier or self.client_id, clock=clock)

    def close(self) -> None:
        """Publish what publish_async queued, stop its publisher, and stop watching the queue list."""
        if self._batcher is not None:
            self._batcher.close()
        with self._queues_lock:
            self._closed = True
            self._queues = None


@dataclass
class _Txn:
    queue: str
    creates: list[tuple[str, bytes]] = field(default_factory=list)
    deletes: list[str] = field(default_factory=list)
