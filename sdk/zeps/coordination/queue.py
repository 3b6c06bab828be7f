"""Work queue with per-item locks, free of the herd effect.

Layout (:class:`zeps.paths.QueuePaths`)::

    <queue>/items/i-<prio>-<id>-<seq>   persistent-sequential; data = envelope (body + headers)
    <queue>/taken/<item>                ephemeral lock; data = the owner's id
    <queue>/waiters/w-<owner>-<seq>     ephemeral-sequential: idle workers waiting in line
    <queue>/workers/<owner>             ephemeral: the live workers (a group)
    <queue>/dead/<item>                 dead-lettered items

How it works:

* **Order.** Items sort by (priority, sequence): lower priority numbers first, FIFO within one. With
  several workers, each honours that order within its stripe.
* **Taking** an item is one transaction: create its ephemeral lock and rewrite the item with a
  version check. The item's data version therefore counts how often it was taken (its attempts),
  and a worker's take is identified by the version it produced.
* **Fenced ack**: one transaction checks the item still has the version our take produced, then
  deletes the lock and the item. A worker whose session expired, and whose item another worker has
  taken since, fails that check: it can never ack an item someone else holds.
* **Crash ⇒ redelivery**: the lock is ephemeral, so a dead worker's items become available again.
  An item taken ``max_attempts`` times without an ack moves to ``dead/`` (inspect with
  :meth:`WorkQueue.dead_letters`, re-drive with :meth:`WorkQueue.redrive`); with
  ``dead_letter=False`` it stays and is taken again, however often.
* **No herd, few races.** Workers join the queue's ``workers/`` group; with W live workers, worker
  number i (in id order) takes the items whose sequence is i modulo W — its stripe — in (priority,
  FIFO) order, and helps with other stripes only when its own is empty. Busy workers therefore
  rarely race for the same item; one that loses a race moves on to its next candidate instead of
  listing again. Idle workers wait in line:
  each creates an ephemeral-sequential waiter node; only the first watches the queue, every other
  one watches its predecessor (the ZooKeeper lock recipe's trick, :class:`~zeps.coordination.line.WaitingLine`).
  A change to the queue wakes one worker, not all of them.
* **Prefetch**: :meth:`WorkQueue.take_many` locks up to N items in one transaction, and
  :meth:`WorkQueue.ack_all` acknowledges many in one.

Reserved headers (``zeps-…``) carry queue bookkeeping inside the envelope: ``zeps-attempts``
(takes before the item was re-created by a delayed release) and ``zeps-not-before-ms`` (a delayed
release). They are hidden from :class:`Item` headers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import os
import random
import socket
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, ConnectionLoss, NoNodeError, SessionExpiredError
from kazoo.protocol.states import ZnodeStat

from zeps.coordination._util import Op, bounded_retry, commit, failures, refused, zookeeper_errors
from zeps.coordination.group import Group, Membership
from zeps.coordination.line import WaitingLine
from zeps.envelope import Envelope, EnvelopeError, decode, encode
from zeps.errors import ConfigError, CoordinationError
from zeps.options import QueueOptions
from zeps.paths import DEFAULT_CHROOT, QueuePaths, sequence_of, validate_member_id

__all__ = ["AckUncertainError", "DeadLetter", "Item", "LockLostError", "QueueStats", "WorkQueue"]

log = logging.getLogger(__name__)

_ATTEMPTS = "zeps-attempts"
_NOT_BEFORE = "zeps-not-before-ms"
_REASON = "zeps-dead-reason"
_RESERVED = (_ATTEMPTS, _NOT_BEFORE, _REASON)
_SCAN_WINDOW = 16  # after a lost race, a worker starts at a random one of the first few items


class LockLostError(CoordinationError):
    """The ack (or release) was refused: the item's lock is no longer ours (our session expired), and the
    item is back in the queue or another worker has taken it. The work is someone else's to redo."""


class AckUncertainError(LockLostError):
    """Our session expired while the ack was in flight, and the item is gone: either this ack removed
    it or a worker that took it after our lock vanished acked it; ZooKeeper keeps nothing that tells
    which. Nothing is left to redo, but this ack is not claimed (processing is at-least-once)."""


@dataclass
class Item:
    """A taken item. Use it as a context manager: success acks it, an exception releases it."""

    queue: WorkQueue
    name: str
    body: bytes
    id: str
    priority: int
    attempt: int  #: 1 on the first take
    headers: dict[str, str]
    content_type: str | None
    enqueued_ms: int
    _version: int = field(repr=False)  # item data version our take produced (the fence)
    _envelope: Envelope = field(repr=False)
    _session: int = field(repr=False)  # the ZooKeeper session that took it (holds the lock)
    done: bool = False

    def ack(self) -> None:
        """Done: delete the item (fenced: raises LockLostError if another worker holds it now, and its
        subclass AckUncertainError if our session expired mid-ack and the item is gone)."""
        self.queue.ack(self)

    def release(self, *, delay: float = 0.0) -> None:
        """Not done: make the item available again, after ``delay`` seconds if given."""
        self.queue.release(self, delay=delay)

    def __enter__(self) -> Item:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.done:
            return
        if exc_type is None:
            self.ack()
        else:
            self.release()


@dataclass(frozen=True)
class DeadLetter:
    """An item moved aside after too many attempts."""

    name: str
    body: bytes
    id: str
    attempts: int
    reason: str
    headers: dict[str, str]


@dataclass(frozen=True)
class QueueStats:
    depth: int  #: items in the queue, taken ones included
    in_flight: int  #: items taken and not yet acked or released
    dead_lettered: int
    waiting_workers: int
    oldest_age_s: float | None  #: age of the oldest item, None when empty


class WorkQueue:
    """A handle on one work queue. No I/O happens in the constructor.

    ``owner_id`` names this worker in lock nodes; it defaults to ``<host>-<pid>-<random>``.
    Counters (``requests``, ``notifications``) count the ZooKeeper requests this handle made and the
    watch notifications it received, for the herd measurements.
    """

    def __init__(
        self,
        client: KazooClient,
        name: str,
        *,
        namespace: str = "default",
        chroot: str = DEFAULT_CHROOT,
        options: QueueOptions | None = None,
        owner_id: str | None = None,
    ) -> None:
        self.client = client
        self.name = name
        self.paths = QueuePaths.of(namespace, name, chroot=chroot)
        self.options = options or QueueOptions()
        self.owner_id = validate_member_id(owner_id or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}")
        self._counter = itertools.count(1)
        self._candidates: list[str] = []
        self._delayed: dict[str, float] = {}  # item -> unix time its delayed release ends
        self._contended = False  # lost a race on the last lock attempt
        self._membership: Membership | None = None
        self._workers: list[str] = []  # live workers, sorted (kept by a children watch)
        self._acks: list[Item] = []  # done items to acknowledge with the next lock transaction
        self._ensured = False
        self.requests = 0
        self._line = WaitingLine(client, self.paths.waiters, call=self._call, once=self._once)

    # -- setup ----------------------------------------------------------------------------------
    @zookeeper_errors
    def ensure(self) -> None:
        """Create the queue's paths if missing (idempotent; the operator normally does this)."""
        if self._ensured:
            return
        for path in self.paths.work_layout():
            bounded_retry()(self.client.ensure_path, path)
        self._ensured = True

    def _call(self, func: Any, *args: Any, **kwargs: Any) -> Any:
        self.requests += 1
        return bounded_retry()(func, *args, **kwargs)

    def _once(self, func: Any, *args: Any, **kwargs: Any) -> Any:
        self.requests += 1
        return func(*args, **kwargs)

    @property
    def notifications(self) -> int:
        """Watch notifications received while waiting in line."""
        return self._line.notifications

    # -- putting --------------------------------------------------------------------------------
    def put(
        self,
        body: bytes,
        *,
        priority: int | None = None,
        headers: dict[str, str] | None = None,
        content_type: str | None = None,
    ) -> str:
        """Add one item; returns its id once it is durable."""
        return self.put_all([body], priority=priority, headers=headers, content_type=content_type)[0]

    @zookeeper_errors
    def put_all(
        self,
        bodies: Iterable[bytes],
        *,
        priority: int | None = None,
        headers: dict[str, str] | None = None,
        content_type: str | None = None,
    ) -> list[str]:
        """Add several items in transactions (atomic per transaction); returns their ids, in order."""
        self.ensure()
        prio = self.options.default_priority if priority is None else priority
        if not 0 <= prio <= 999:
            raise ConfigError(f"priority {prio} is out of range: use 0 (first) to 999 (last)")
        creates: list[tuple[str, str, bytes]] = []
        for body in bodies:
            if len(body) > self.options.max_item_bytes:
                raise ConfigError(
                    f"item of {len(body)} bytes exceeds max_item_bytes={self.options.max_item_bytes}; "
                    "put large work in a batch store and queue a reference"
                )
            item_id = f"{self.owner_id}.{next(self._counter)}"
            env = Envelope(
                body=bytes(body),
                id=item_id,
                publisher=self.owner_id,
                timestamp_ms=int(time.time() * 1000),
                content_type=content_type,
                headers=dict(headers or {}),
            )
            creates.append((item_id, self.paths.item_prefix(prio, item_id), encode(env)))
        self._create_protected(creates)
        return [item_id for item_id, _, _ in creates]

    def _create_protected(self, creates: list[tuple[str, str, bytes]]) -> None:
        """Create sequential nodes in transactions; after ConnectionLoss, a transaction is resent only
        if none of its (id-carrying) nodes exists: a retry never duplicates an item."""
        limit = self.options.max_transaction_bytes
        chunks: list[list[tuple[str, str, bytes]]] = [[]]
        size = 0
        for entry in creates:
            if chunks[-1] and size + len(entry[2]) + 100 > limit:
                chunks.append([])
                size = 0
            chunks[-1].append(entry)
            size += len(entry[2]) + 100
        for chunk in chunks:
            if chunk:
                self._commit_protected(chunk)

    def _commit_protected(self, chunk: list[tuple[str, str, bytes]]) -> None:
        deadline = time.monotonic() + 120
        while True:
            self.requests += 1
            try:
                outcome = commit(self.client, [("create", path, data, {"sequence": True}) for _, path, data in chunk])
            except (ConnectionLoss, SessionExpiredError) as exc:  # did it apply?
                if time.monotonic() > deadline:
                    raise CoordinationError(f"queue {self.name}: put failed: {exc!r}") from exc
                marker = chunk[0][1].rsplit("/", 1)[1]
                names = self._call(self.client.get_children, self.paths.items)
                if any(n.startswith(marker) for n in names):
                    return
                continue
            if errors := failures(outcome):
                raise refused(f"queue {self.name}: put failed", errors)
            return

    # -- taking ---------------------------------------------------------------------------------
    def take(self, timeout: float | None = None) -> Item | None:
        """Take the next item, waiting up to ``timeout`` seconds (None: forever); None if none came."""
        items = self.take_many(1, timeout=timeout)
        return items[0] if items else None

    @zookeeper_errors
    def take_many(self, n: int, *, timeout: float | None = None, ack: Sequence[Item] = ()) -> list[Item]:
        """Take up to ``n`` items in one transaction (prefetch); waits like :meth:`take` for the first.

        ``ack``: items done with, acknowledged in the same transaction that locks the next ones (a
        worker loop then costs one write per batch instead of two). If acking fails the acks are
        settled on their own, and LockLostError is raised before anything new is taken.
        """
        if n < 1:
            raise ConfigError(f"take_many needs n >= 1, got {n}")
        self.ensure()
        self._join_workers()
        self._acks = [i for i in ack if not i.done]
        deadline = None if timeout is None else time.monotonic() + timeout
        waiter: str | None = None
        try:
            while True:
                got = self._try_take(n)
                if self._acks:  # nothing to lock them with: acknowledge on their own
                    acks, self._acks = self._acks, []
                    self.ack_all(acks)
                if got:
                    return got
                if deadline is not None and time.monotonic() >= deadline:
                    return []
                # Keep our place in line until we hold an item: leaving earlier would wake the
                # next waiter while the item is still free, and it would wake the next… (a herd).
                waiter = waiter or self._line.join(f"w-{self.owner_id}-")
                if not self._line.wait(waiter, deadline, self._look):
                    waiter = None  # our waiter vanished with an expired session: queue up again
        finally:
            if waiter is not None:
                self._line.leave(waiter)

    def _refresh(self) -> None:
        """List available items (not taken) as this worker's candidates.

        With several live workers, the candidates are this worker's stripe, in (priority, FIFO)
        order. When the stripe is empty (or after a lost race) the worker helps with the rest,
        starting at a random one of the first few items of the head priority, so helpers spread out
        instead of racing for the same items.
        """
        items = self._call(self.client.get_children, self.paths.items)
        taken = set(self._call(self.client.get_children, self.paths.taken))
        available = sorted((i for i in items if i not in taken), key=QueuePaths.item_order)
        workers = self._workers
        if len(workers) > 1 and self.owner_id in workers:
            slot, width = workers.index(self.owner_id), len(workers)
            mine = [i for i in available if QueuePaths.item_order(i)[1] % width == slot]
            if mine:
                self._candidates = mine
                return
        if (self._contended or len(workers) > 1) and available:
            head = QueuePaths.item_order(available[0])[0]
            window = sum(1 for i in available[:_SCAN_WINDOW] if QueuePaths.item_order(i)[0] == head)
            start = random.randrange(window)
            available = available[start:window] + available[:start] + available[window:]
        self._candidates = available

    def _join_workers(self) -> None:
        """Join the workers group (once) and keep the sorted list of live workers current."""
        if self._membership is not None:
            return
        group = Group(self.client, self.paths.workers)
        self._membership = group.join(self.owner_id)

        def changed(children: list[str]) -> None:
            self._workers = sorted(children)
            self._candidates = []  # stripes moved: list again before the next take

        self.client.ChildrenWatch(self.paths.workers.members, changed)

    @zookeeper_errors
    def close(self) -> None:
        """Leave the workers group (other workers take over this stripe at once)."""
        if self._membership is not None:
            self._membership.leave()
            self._membership = None

    def _try_take(self, n: int) -> list[Item]:
        taken: list[Item] = []
        refreshes = 0
        while len(taken) < n:
            if not self._candidates:
                if taken or refreshes == 2:
                    break  # got some (do not list again just to fill a prefetch), or nothing takeable
                self._refresh()
                refreshes += 1
                if not self._candidates:
                    break
            want = n - len(taken)
            names, self._candidates = self._candidates[:want], self._candidates[want:]
            reads = [(name, self.client.get_async(f"{self.paths.items}/{name}")) for name in names]
            self.requests += len(reads)
            ready: list[tuple[str, bytes, ZnodeStat, Envelope]] = []
            now_ms = int(time.time() * 1000)
            for name, result in reads:
                try:
                    try:
                        data, stat = result.get()
                    except (ConnectionLoss, SessionExpiredError):  # a read: safe to ask again
                        data, stat = self._call(self.client.get, f"{self.paths.items}/{name}")
                except NoNodeError:
                    continue  # acked by someone meanwhile: move on
                try:
                    env = decode(data)
                except EnvelopeError as exc:
                    self._dead_letter(name, data, stat, f"unreadable item: {exc}")
                    continue
                not_before = int(env.headers.get(_NOT_BEFORE, "0"))
                if not_before > now_ms:
                    self._delayed[name] = not_before / 1000
                    continue  # a delayed release still in force
                spent = int(env.headers.get(_ATTEMPTS, "0")) + stat.version >= self.options.max_attempts
                if spent and self.options.dead_letter:
                    self._dead_letter(name, data, stat, f"taken {self.options.max_attempts} times without an ack")
                    continue
                ready.append((name, data, stat, env))
            taken.extend(self._lock_all(ready))
        return taken

    def _lock_all(self, ready: list[tuple[str, bytes, ZnodeStat, Envelope]]) -> list[Item]:
        """Lock candidates in one transaction; on a lost race, retry without the items lost."""
        while ready:
            acks = self._acks
            ops = self._ack_ops(acks)
            owners: list[int | None] = [None] * len(ops)  # per op: the candidate it locks (None: an ack)
            for k, (name, data, stat, _) in enumerate(ready):
                ops.append(("create", f"{self.paths.taken}/{name}", self.owner_id.encode(), {"ephemeral": True}))
                ops.append(("set", f"{self.paths.items}/{name}", data, stat.version))
                owners += [k, k]
            self.requests += 1
            try:
                outcome = commit(self.client, ops)
            except (ConnectionLoss, SessionExpiredError):
                return self._adopt_locks(ready)  # the acks stay pending and are settled on their own
            bad = [i for i, r in enumerate(outcome) if r in failures(outcome)]
            if not bad:
                for item in acks:
                    item.done = True
                self._acks = []
                self._contended = False
                return [self._item(name, stat.version + 1, env) for name, _, stat, env in ready]
            if any(owners[i] is None for i in bad):
                self._acks = []
                self.ack_all(acks)  # settle them alone: raises LockLostError if one is lost
                continue
            failed = {owners[i] for i in bad}
            self._contended = True
            ready = [entry for i, entry in enumerate(ready) if i not in failed]  # lost those races
        return []

    def _ack_ops(self, items: Sequence[Item]) -> list[Op]:
        ops: list[Op] = []
        for item in items:
            ops += [
                ("check", f"{self.paths.items}/{item.name}", item._version),
                ("delete", f"{self.paths.taken}/{item.name}"),
                ("delete", f"{self.paths.items}/{item.name}"),
            ]
        return ops

    def _adopt_locks(self, ready: list[tuple[str, bytes, ZnodeStat, Envelope]]) -> list[Item]:
        """The lock transaction's outcome is unknown: the locks our session holds are ours to use
        (otherwise they would strand their items until this process exits)."""
        self._candidates.clear()
        mine = []
        for name, _, stat, env in ready:
            try:
                _, lock = self._call(self.client.get, f"{self.paths.taken}/{name}")
                _, now = self._call(self.client.get, f"{self.paths.items}/{name}")
            except NoNodeError:
                continue
            if lock.ephemeralOwner == self.client.client_id[0] and now.version == stat.version + 1:
                mine.append(self._item(name, now.version, env))
        return mine

    def _item(self, name: str, version: int, env: Envelope) -> Item:
        prio, _ = QueuePaths.item_order(name)
        carried = int(env.headers.get(_ATTEMPTS, "0"))
        return Item(
            queue=self, name=name, body=env.body, id=env.id, priority=prio, attempt=carried + version,
            headers={k: v for k, v in env.headers.items() if k not in _RESERVED},
            content_type=env.content_type, enqueued_ms=env.timestamp_ms, _version=version, _envelope=env,
            _session=self.client.client_id[0],
        )  # fmt: skip

    # -- waiting without a herd -----------------------------------------------------------------
    def _look(self, watch: Any) -> Literal[True] | float | None:
        """At the head of the line of idle workers (:class:`WaitingLine`): watch the items and their
        locks; True when an item can be taken (the candidates are set), else the monotonic time the
        first delayed item falls due, or None."""
        items = self._call(self.client.get_children, self.paths.items, watch=watch)
        taken = set(self._call(self.client.get_children, self.paths.taken, watch=watch))
        now = time.time()
        self._delayed = {k: v for k, v in self._delayed.items() if v > now and k in items}
        free = (i for i in items if i not in taken and i not in self._delayed)
        available = sorted(free, key=QueuePaths.item_order)
        if available:
            self._candidates = available
            return True
        if self._delayed:
            return time.monotonic() + max(0.05, min(self._delayed.values()) - now)
        return None

    # -- finishing ------------------------------------------------------------------------------
    def ack(self, item: Item) -> None:
        """Delete a done item, fenced by the version our take produced."""
        self.ack_all([item])

    @zookeeper_errors
    def ack_all(self, items: Sequence[Item]) -> None:
        """Acknowledge many items in one transaction (falls back to one by one if any fails)."""
        todo = [i for i in items if not i.done]
        if not todo:
            return
        ops = self._ack_ops(todo)
        self.requests += 1
        unsure = False
        try:
            outcome = commit(self.client, ops)
        except (ConnectionLoss, SessionExpiredError):
            outcome, unsure = [ConnectionLoss()], True  # unknown: settle item by item below
        if not failures(outcome):
            for item in todo:
                item.done = True
            return
        lost: list[str] = []
        uncertain: list[str] = []
        for item in todo:
            try:
                self._ack_one(item, unsure=unsure)
            except AckUncertainError:
                uncertain.append(item.name)
            except LockLostError:
                lost.append(item.name)
        if lost:
            gone = f"; gone, by this ack or another worker's: {', '.join(uncertain)}" if uncertain else ""
            raise LockLostError(f"queue {self.name}: items taken by another worker since: {', '.join(lost)}{gone}")
        if uncertain:
            raise AckUncertainError(
                f"queue {self.name}: our session expired while acking {', '.join(uncertain)}: gone, by this ack or "
                "another worker's (not claimed; nothing is left to redo)"
            )

    def _ack_one(self, item: Item, *, unsure: bool) -> None:
        """Ack one item after a batch ack failed. ``unsure``: that batch's outcome is unknown (the
        connection dropped), so an item found gone may have been deleted by it; otherwise an item
        found gone was acked by another worker, after our lock was lost."""
        item_path, lock_path = f"{self.paths.items}/{item.name}", f"{self.paths.taken}/{item.name}"
        state = {"unsure": unsure}

        def attempt() -> None:
            try:
                _, stat = self.client.get(item_path)
            except NoNodeError:
                if state["unsure"] and self.client.client_id[0] == item._session:
                    return  # we held the lock throughout: only our own ack can have deleted it
                if state["unsure"]:
                    raise AckUncertainError(
                        f"item {item.name} is gone, but our session expired while acking it: this ack or another "
                        "worker's removed it, so this ack is not claimed (nothing is left to redo)"
                    ) from None
                raise LockLostError(f"item {item.name} was acked by another worker after our lock was lost") from None
            state["unsure"] = True  # from here, a dropped connection leaves this attempt's outcome unknown
            if stat.version != item._version:
                raise LockLostError(f"item {item.name} was taken by another worker since (our take was lost)")
            ops: list[Op] = [("check", item_path, item._version)]
            if self.client.exists(lock_path) is not None:
                ops.append(("delete", lock_path))
            ops.append(("delete", item_path))
            errors = failures(commit(self.client, ops))
            if any(isinstance(e, BadVersionError) for e in errors):
                raise LockLostError(f"item {item.name} was taken by another worker since")
            if errors and not all(isinstance(e, NoNodeError) for e in errors):
                raise refused(f"ack of {item.name} failed", errors)

        self.requests += 1
        bounded_retry()(attempt)
        item.done = True

    @zookeeper_errors
    def release(self, item: Item, *, delay: float = 0.0) -> None:
        """Give an item back (nack). After ``delay`` seconds it can be taken again; it then goes to
        the back of its priority. If it has used up its attempts it is dead-lettered instead (unless
        the queue's ``dead_letter`` is off)."""
        if item.done:
            return
        item_path, lock_path = f"{self.paths.items}/{item.name}", f"{self.paths.taken}/{item.name}"
        ops: list[Op] = [("check", item_path, item._version)]
        dead = item.attempt >= self.options.max_attempts and self.options.dead_letter
        moves = dead or delay > 0
        if dead:
            reason = "released after the last attempt"
            ops += [("create", f"{self.paths.dead}/{item.name}", self._dead_data(item._envelope, item.attempt, reason)),
                    ("delete", item_path)]  # fmt: skip
        elif delay > 0:
            headers = {**item._envelope.headers, _ATTEMPTS: str(item.attempt),
                       _NOT_BEFORE: str(int((time.time() + delay) * 1000))}  # fmt: skip
            env = dataclasses.replace(item._envelope, headers=headers)
            new = self.paths.item_prefix(item.priority, f"{item.id}~{item.attempt}")
            ops += [("create", new, encode(env), {"sequence": True}), ("delete", item_path)]
        ops.append(("delete", lock_path))
        for _ in range(10):  # bounded: each round either applies, or finds out why not
            self.requests += 1
            try:
                if not failures(commit(self.client, ops)):
                    item.done = True
                    return
            except (ConnectionLoss, SessionExpiredError):
                pass
            # failed or unsure: read the state to decide
            try:
                _, stat = self._call(self.client.get, item_path)
            except NoNodeError:
                if moves:  # our transaction moved it (applied before the connection dropped)
                    item.done = True
                    return
                raise LockLostError(f"item {item.name} was taken and acked by another worker") from None
            if stat.version != item._version:
                raise LockLostError(f"item {item.name} is no longer ours to release: another worker took it")
            lock = self._call(self.client.exists, lock_path)
            if lock is None or lock.ephemeralOwner != self.client.client_id[0]:
                item.done = True  # our lock is gone (session expired): the item is available again
                return
        raise CoordinationError(f"queue {self.name}: could not release {item.name}")

    # -- dead letters ---------------------------------------------------------------------------
    def _dead_data(self, env: Envelope, attempts: int, reason: str) -> bytes:
        headers = {**env.headers, _ATTEMPTS: str(attempts), _REASON: reason}
        headers.pop(_NOT_BEFORE, None)
        return encode(dataclasses.replace(env, headers=headers))

    def _dead_letter(self, name: str, data: bytes, stat: ZnodeStat, reason: str) -> None:
        """Move an item to dead/, fenced by the version read (a concurrent take wins)."""
        try:
            env = decode(data)
            dead = self._dead_data(env, int(env.headers.get(_ATTEMPTS, "0")) + stat.version, reason)
        except EnvelopeError:
            dead = data
        ops: list[Op] = [
            ("check", f"{self.paths.items}/{name}", stat.version),
            ("create", f"{self.paths.dead}/{name}", dead),
            ("delete", f"{self.paths.items}/{name}"),
        ]
        self.requests += 1
        try:
            outcome = bounded_retry()(commit, self.client, ops)
        except (ConnectionLoss, SessionExpiredError):
            return  # unknown; the next take that reads this item decides again
        if not failures(outcome):
            log.warning("queue %s: item %s dead-lettered: %s", self.name, name, reason)

    @zookeeper_errors
    def dead_letters(self) -> list[DeadLetter]:
        """The dead-lettered items, oldest first."""
        self.ensure()
        out = []
        for name in sorted(self._call(self.client.get_children, self.paths.dead), key=QueuePaths.item_order):
            try:
                data, _ = self._call(self.client.get, f"{self.paths.dead}/{name}")
            except NoNodeError:
                continue
            try:
                env = decode(data)
            except EnvelopeError:
                env = Envelope(body=data)
            out.append(DeadLetter(
                name=name, body=env.body, id=env.id, attempts=int(env.headers.get(_ATTEMPTS, "0")),
                reason=env.headers.get(_REASON, ""),
                headers={k: v for k, v in env.headers.items() if k not in _RESERVED},
            ))  # fmt: skip
        return out

    @zookeeper_errors
    def redrive(self, names: Iterable[str] | None = None) -> int:
        """Put dead-lettered items back in the queue with fresh attempts; returns how many moved."""
        self.ensure()
        chosen = list(names) if names is not None else self._call(self.client.get_children, self.paths.dead)
        moved = 0
        for name in chosen:
            try:
                data, stat = self._call(self.client.get, f"{self.paths.dead}/{name}")
            except NoNodeError:
                continue
            try:
                env = decode(data)
                env = dataclasses.replace(env, headers={k: v for k, v in env.headers.items() if k not in _RESERVED})
                prio, item_id = QueuePaths.item_order(name)[0], env.id or uuid.uuid4().hex
            except EnvelopeError:
                env, prio, item_id = Envelope(body=data), self.options.default_priority, uuid.uuid4().hex
            ops: list[Op] = [
                ("delete", f"{self.paths.dead}/{name}", stat.version),
                ("create", self.paths.item_prefix(prio, f"{item_id}~r"), encode(env), {"sequence": True}),
            ]
            self.requests += 1
            with contextlib.suppress(ConnectionLoss, SessionExpiredError):
                if not failures(commit(self.client, ops)):
                    moved += 1
                    continue
            if self._call(self.client.exists, f"{self.paths.dead}/{name}") is None:
                moved += 1  # applied before the connection dropped (or someone else re-drove it)
        return moved

    # -- stats ----------------------------------------------------------------------------------
    @zookeeper_errors
    def stats(self) -> QueueStats:
        self.ensure()
        paths = (self.paths.items, self.paths.taken, self.paths.dead, self.paths.waiters)
        counts = [self.client.exists_async(p) for p in paths]
        self.requests += len(counts)
        try:
            stats = [r.get() for r in counts]
        except (ConnectionLoss, SessionExpiredError):  # reads: ask again, one by one with retries
            stats = [self._call(self.client.exists, p) for p in paths]
        depth, in_flight, dead, waiting = (s.numChildren if s else 0 for s in stats)
        oldest = None
        if depth:
            names = self._call(self.client.get_children, self.paths.items)
            if names:
                first = min(names, key=sequence_of)
                with contextlib.suppress(NoNodeError):
                    _, stat = self._call(self.client.get, f"{self.paths.items}/{first}")
                    oldest = max(0.0, time.time() - stat.ctime / 1000)
        return QueueStats(
            depth=depth, in_flight=in_flight, dead_lettered=dead, waiting_workers=waiting, oldest_age_s=oldest
        )
