"""Replayable batch queue: immutable batches, the latest id in a znode, and every
consumer tracking its own progress.

Layout (:class:`zeps.paths.QueuePaths`)::

    <queue>/batches/latest          "<queue>-<n>": the latest batch id
    <queue>/batches/lock/           lock of publishers while they assign an id
    <queue>/batches/data/<queue>-<n>   the batch itself, when small (see BatchOptions.inline_max_bytes)
    <queue>/batches/refs/<queue>-<n>   the URL of the batch in the batch store, when large
    <queue>/batches/deleting/<queue>-<n>   the URL of an object retention still has to delete
    <queue>/batches/writers/<writer>   "<sequence> <queue>-<n>": an idempotent writer's last publish
    <queue>/processors/<consumer>   "<queue>-<k>": the last batch the consumer processed

Publishing takes the lock, reads the latest id, writes the new batch and advances ``latest`` in
one transaction (a large batch is first written to the store, atomically): ids are unique, linear
(no gaps) and known in advance, batches immutable. An idempotent writer (``publish(records,
writer=..., sequence=n)``, e.g. a Spark query publishing micro-batch ``n``) records its sequence in
the same transaction, so publishing sequence ``n`` again returns the batch it made the first time
instead of a second copy: exactly-once across retries and restarts. Consumers process every batch from their
position to the latest, in order, and advance their position with a compare-and-set afterwards:
a consumer that crashes between processing and committing processes that one batch again.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
import urllib.parse
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from zeps.batchstore import (
    BatchLostError,
    BatchStore,
    BatchStoreError,
    ForeignObjectError,
    Prefetch,
    decode_batch,
    encode_batch,
    open_store,
)
from zeps.coordination._util import bounded_retry, commit, failures, refused, zookeeper_errors
from zeps.errors import ConfigError, CoordinationError, ZepsError
from zeps.options import BatchOptions
from zeps.paths import DEFAULT_CHROOT, QueuePaths, validate_member_id

__all__ = ["Batch", "BatchConsumer", "BatchQueue", "ConsumerConflictError", "open_batch_store"]

log = logging.getLogger(__name__)


class ConsumerConflictError(CoordinationError):
    """Another instance of the same named consumer moved its position meanwhile."""


@dataclass(frozen=True)
class Batch:
    id: str
    number: int
    records: list[bytes]
    created_ms: int


def open_batch_store(options: BatchOptions, *, credentials: tuple[str, str] | None = None) -> BatchStore:
    """The store ``options.store_url`` names, with the options' store settings (and ``credentials``,
    when the caller has them rather than the environment)."""
    if not options.store_url:
        raise ConfigError("the batch queue has no store_url")
    return open_store(options.store_url, endpoint=options.store_endpoint, region=options.store_region,
                      path_style=options.store_path_style, credentials_secret=options.store_credentials_secret,
                      credentials=credentials)  # fmt: skip


class BatchQueue:
    """A handle on one batch queue. No I/O happens in the constructor."""

    def __init__(
        self,
        client: KazooClient,
        name: str,
        *,
        namespace: str = "default",
        chroot: str = DEFAULT_CHROOT,
        options: BatchOptions | None = None,
        store: BatchStore | None = None,
        owner_id: str = "",
    ) -> None:
        self.client = client
        self.name = name
        self.paths = QueuePaths.of(namespace, name, chroot=chroot)
        self.options = options or BatchOptions()
        self._store = store
        self.owner_id = owner_id
        self._ensured = False
        #: whether read() asks the store for a batch's object before its reference is known: until a
        #: read finds a batch inline (such a queue's batches are often small), and again after a stored one
        self._prefetching = True
        #: read() in sequence: the number read last, and the next batch's early GET, begun by that read
        self._ahead_lock = threading.Lock()
        self._last_read = -1
        self._held: tuple[int, Prefetch] | None = None

    @property
    def store(self) -> BatchStore | None:
        if self._store is None and self.options.store_url:
            self._store = open_batch_store(self.options)
        return self._store

    def batch_id(self, number: int) -> str:
        return f"{self.name}-{number}"

    def _number(self, batch_id: str) -> int:
        prefix, _, n = batch_id.rpartition("-")
        if prefix != self.name or not n.isdigit():
            raise CoordinationError(f"{batch_id!r} is not a batch id of queue {self.name!r}")
        return int(n)

    @zookeeper_errors
    def ensure(self) -> None:
        if self._ensured:
            return
        for path in self.paths.batch_layout():
            bounded_retry()(self.client.ensure_path, path)
        self._ensured = True

    # -- publishing -----------------------------------------------------------------------------
    @zookeeper_errors
    def latest(self) -> int:
        """The latest batch number (0 before the first batch)."""
        self.ensure()
        try:
            data, _ = bounded_retry()(self.client.get, self.paths.latest_batch)
        except NoNodeError:
            return 0
        return self._number(data.decode())

    @zookeeper_errors
    def publish(self, records: Sequence[bytes], *, writer: str | None = None, sequence: int | None = None) -> str:
        """Write an immutable batch and make it the latest; returns its id (``<queue>-<n>``).

        With ``writer`` and ``sequence`` (both or neither) the publish is idempotent: a writer's
        sequences must increase, and publishing the last one again returns the batch it made then
        without writing anything. An older sequence raises CoordinationError (nothing is written)."""
        if (writer is None) != (sequence is None):
            raise ConfigError("publish: give writer and sequence together (an idempotent writer), or neither")
        self.ensure()
        body = encode_batch(records)
        inline = len(body) <= self.options.inline_max_bytes
        if not inline and self.store is None:
            raise ConfigError(
                f"batch of {len(body)} bytes exceeds inline_max_bytes={self.options.inline_max_bytes} and the "
                "queue has no batch store: set store_url (file:///mounted/path or s3://bucket/prefix)"
            )
        lock = self.client.Lock(self.paths.batch_lock, self.owner_id)
        if not lock.acquire(timeout=60):
            raise CoordinationError(f"batch queue {self.name}: publisher lock not acquired within 60s")
        try:
            batch_id: str = bounded_retry()(self._publish_locked, body, inline, writer, sequence)
            return batch_id
        finally:
            lock.release()

    def _written(self, writer: str, sequence: int) -> str | None:
        """The batch ``writer`` already published as ``sequence``, or None if it is new (under the lock)."""
        try:
            data, _ = self.client.get(self.paths.batch_writer(writer))
        except NoNodeError:
            return None
        text: str = data.decode()
        last, batch_id = text.split(" ", 1)
        if sequence == int(last):
            return batch_id
        if sequence < int(last):
            raise CoordinationError(
                f"batch queue {self.name}: writer {writer!r} already published sequence {last} ({batch_id}); "
                f"sequence {sequence} is older (a second writer with the same name, or an old checkpoint?)"
            )
        return None

    def _publish_locked(self, body: bytes, inline: bool, writer: str | None, sequence: int | None) -> str:
        if writer is not None and sequence is not None:  # also on a retry whose lost commit had applied
            done = self._written(writer, sequence)
            if done is not None:
                return done
        try:
            data, stat = self.client.get(self.paths.latest_batch)
            number, version = self._number(data.decode()) + 1, stat.version
        except NoNodeError:
            number, version = 1, -1
        batch_id = self.batch_id(number)
        if inline:
            ops: list[Any] = [("create", f"{self.paths.batch_data}/{batch_id}", body)]
        else:
            assert self.store is not None
            url = self.store.put(batch_id, body)  # atomic; an orphan if the commit below fails
            ops = [("create", f"{self.paths.batch_refs}/{batch_id}", url.encode())]
        latest = batch_id.encode()
        ops.append(("set", self.paths.latest_batch, latest, version) if version >= 0
                   else ("create", self.paths.latest_batch, latest))  # fmt: skip
        if writer is not None:
            progress = f"{sequence} {batch_id}".encode()
            path = self.paths.batch_writer(writer)
            ops.append(("set", path, progress) if self.client.exists(path) else ("create", path, progress))
        outcome = commit(self.client, ops)
        if errors := failures(outcome):
            if isinstance(errors[0], NodeExistsError) and self.latest() == number:
                return batch_id  # a retried commit that had applied (we still hold the lock)
            raise refused(f"batch queue {self.name}: publishing {batch_id} failed", errors)
        return batch_id

    # -- reading --------------------------------------------------------------------------------
    def read(self, number: int) -> Batch:
        """Read a retained batch; CoordinationError if it was removed by retention or never existed,
        BatchLostError (a DataLossError naming it) if its stored object is missing or damaged.

        Reads in sequence (``read(n)`` after ``read(n - 1)``) read ahead: from a store whose objects
        take longer to fetch than the lookup (S3), the next batch's object is fetched while the caller
        handles this one. At most one batch is held ahead; it is used only if it is the object its
        reference names, and dropped by a read of any other number."""
        return self._read(number, read_ahead=True)

    @zookeeper_errors
    def _read(self, number: int, *, read_ahead: bool) -> Batch:
        """read(); without ``read_ahead`` for callers that read ahead themselves (a consumer's threads)."""
        batch_id = self.batch_id(number)
        retry = bounded_retry()
        prefetched = self._early_gets(number) if read_ahead else self._prefetch(batch_id)
        inline, ref = retry(self._lookup, batch_id)
        body: bytes | memoryview
        if inline is not None:
            self._prefetching = False
            body, stat = inline
        elif ref is None:
            raise CoordinationError(f"batch {batch_id} is not retained (removed, or not published yet)")
        else:
            self._prefetching = True
            url, stat = ref
            store = self.store
            if store is None:
                raise ConfigError(f"batch {batch_id} is in a batch store but this handle has no store_url")
            try:
                body = store.get(url.decode(errors="replace"), prefetched)
            except BatchLostError as exc:
                if not retry(self.client.exists, f"{self.paths.batch_refs}/{batch_id}"):  # retention got there first
                    raise CoordinationError(f"batch {batch_id} is not retained (removed by retention)") from None
                raise BatchLostError(f"batch {batch_id} of queue {self.name}: {exc}") from None
        return Batch(batch_id, number, decode_batch(body), stat.ctime)

    def _early_gets(self, number: int) -> Prefetch | None:
        """The early GET of batch ``number`` (one the read of ``number - 1`` began, or one begun now
        unless the last batch read was inline), and, when the reads go in sequence, the next batch's
        (a GET of a batch not published yet finds nothing: its read fetches it again)."""
        with self._ahead_lock:
            held, self._held = self._held, None
            in_sequence, self._last_read = self._last_read == number - 1, number
        if held is not None and held[0] == number:
            mine: Prefetch | None = held[1]
        else:
            if held is not None:
                held[1].raw.cancel()  # read out of sequence: not wanted (a running GET just ends unread)
            mine = self._prefetch(self.batch_id(number))
        if in_sequence and mine is not None:
            following = self._prefetch(self.batch_id(number + 1))
            if following is not None:
                with self._ahead_lock:
                    if self._held is None and self._last_read == number:
                        self._held, following = (number + 1, following), None
                if following is not None:  # another read came meanwhile (reads from several threads)
                    following.raw.cancel()
        return mine

    def _prefetch(self, batch_id: str) -> Prefetch | None:
        """Begin reading the batch's object from the store, if it has one, so that the read overlaps
        the ZooKeeper lookup (an S3 GET takes longer than the lookup); used only if the reference
        names that very object (``BatchStore.get``). A store that cannot be opened (no credentials,
        say) prefetches nothing, and is not tried again before a read that needs it: its error is
        said when a batch is stored there, not for inline ones. None after an inline batch."""
        if not self._prefetching:
            return None
        try:
            store = self.store
        except ZepsError:
            self._prefetching = False
            return None
        return store.prefetch(batch_id) if store is not None else None

    def _lookup(self, batch_id: str) -> tuple[tuple[bytes, Any] | None, tuple[bytes, Any] | None]:
        """The batch's inline node and its store reference, each (data, stat) or None: asked for
        together, one round trip (a batch is one or the other)."""
        asked = [self.client.get_async(f"{parent}/{batch_id}") for parent in (self.paths.batch_data,
                                                                              self.paths.batch_refs)]  # fmt: skip
        found: list[tuple[bytes, Any] | None] = []
        for result in asked:
            try:
                found.append(result.get())
            except NoNodeError:
                found.append(None)
        return found[0], found[1]

    @zookeeper_errors
    def first_retained(self) -> int:
        """The oldest batch still readable (latest + 1 when none is)."""
        names = bounded_retry()(self.client.get_children, self.paths.batch_data)
        names += bounded_retry()(self.client.get_children, self.paths.batch_refs)
        numbers = [self._number(n) for n in names]
        return min(numbers) if numbers else self.latest() + 1

    # -- consumers ------------------------------------------------------------------------------
    def consumer(self, name: str, *, start: Literal["earliest", "latest"] = "earliest") -> BatchConsumer:
        """A named consumer; a new one starts before the first batch or at the latest."""
        consumer = BatchConsumer(self, validate_member_id(name))
        consumer.register(start)
        return consumer

    @zookeeper_errors
    def positions(self) -> dict[str, int]:
        """Every registered consumer's last processed batch number (asked for all at once: one round
        trip's wait, however many consumers there are). CoordinationError naming the consumer whose
        node holds no batch id of this queue (written by something other than zeps)."""
        self.ensure()
        positions: dict[str, int] = bounded_retry()(self._positions, strict=True)
        return positions

    def _positions(self, *, strict: bool) -> dict[str, int]:
        """``strict``: a malformed position raises; else it is left out, with a warning."""
        names = self.client.get_children(self.paths.processors)
        asked = [(name, self.client.get_async(self.paths.processor(name))) for name in names]
        out = {}
        for name, result in asked:
            try:
                data, _ = result.get()
            except NoNodeError:
                continue  # unregistered meanwhile
            try:
                out[name] = self._number(data.decode("utf-8", "replace"))
            except CoordinationError:
                why = (f"batch consumer {name!r} of queue {self.name}: its position {data[:64]!r} is not a batch id "
                       "of this queue (written by something other than zeps?)")  # fmt: skip
                if strict:
                    raise CoordinationError(why) from None
                log.warning("%s; left out", why)
        return out

    @zookeeper_errors
    def lag(self) -> dict[str, int]:
        """Batches each consumer still has to process. A consumer whose position is no batch id of
        this queue is left out (with a warning); :meth:`prune`, which must not remove what such a
        consumer may need, refuses to run instead."""
        self.ensure()
        latest = self.latest()
        positions: dict[str, int] = bounded_retry()(self._positions, strict=False)
        return {name: latest - position for name, position in positions.items()}

    @zookeeper_errors
    def prune(self, *, now: float | None = None) -> list[str]:
        """Remove batches every registered consumer has processed and older than retention_seconds.
        Never removes one a registered consumer still needs. Returns the removed ids.

        A stored batch's reference goes in one transaction with a note of its object
        (``batches/deleting/<id>``); the object is deleted from the store, then the note. So no
        reference ever names a deleted object, and an object the store could not delete then (down,
        access denied) is deleted by a later prune, which first finishes what earlier ones noted. A
        pass stops asking the store after its first failure (logged as a warning): the rest is noted."""
        positions = self.positions()  # (ensures the layout, batches/deleting with it)
        store = self.store  # a store that cannot be opened (no credentials) fails here, before any removal
        deleting = _Deleting(self, store)
        for name in sorted(bounded_retry()(self.client.get_children, self.paths.batch_deleting)):
            deleting.finish(name)
        if not positions:
            deleting.report()
            return []  # with no consumer registered, nothing is known to be done with
        horizon = min(positions.values())
        cutoff_ms = ((now if now is not None else time.time()) - self.options.retention_seconds) * 1000
        removed = []
        for parent in (self.paths.batch_data, self.paths.batch_refs):
            for name in sorted(bounded_retry()(self.client.get_children, parent), key=self._number):
                if self._number(name) > horizon:
                    continue
                try:
                    data, stat = bounded_retry()(self.client.get, f"{parent}/{name}")
                except NoNodeError:
                    continue
                if stat.ctime > cutoff_ms:
                    continue
                if parent == self.paths.batch_data:
                    try:
                        bounded_retry()(self.client.delete, f"{parent}/{name}")
                    except NoNodeError:
                        continue  # another prune got there first
                elif not deleting.note(name, data, stat.version):
                    continue  # another prune got there first
                removed.append(name)
        deleting.report()
        return removed


class _Deleting:
    """One prune's deletions of stored objects, each noted in ZooKeeper until the store has done it."""

    def __init__(self, queue: BatchQueue, store: BatchStore | None) -> None:
        self.queue, self.store = queue, store
        self.failure: str | None = None  #: the store's first refusal in this pass; the store is not asked again
        self.left = 0  #: objects left noted for a later prune

    def _path(self, name: str) -> str:
        return f"{self.queue.paths.batch_deleting}/{name}"

    def note(self, name: str, url: bytes, version: int) -> bool:
        """Remove ``name``'s reference and note its object, in one transaction, then delete the object;
        False if the reference was gone or changed meanwhile (another prune)."""
        ops = [("delete", f"{self.queue.paths.batch_refs}/{name}", version), ("create", self._path(name), url)]
        if failures(bounded_retry()(commit, self.queue.client, ops)):
            return False
        self.finish(name, url)
        return True

    def finish(self, name: str, url: bytes | None = None) -> None:
        """Delete the noted object of ``name`` from the store, then its note (the note stays if the store
        failed, or this handle has none). ``url``: the note :meth:`note` just made, in the transaction
        that removed the reference (a note found in ZooKeeper is read, and its reference looked for)."""
        if self.store is None or self.failure is not None:
            self.left += 1
            return
        client = self.queue.client
        found = url is None
        try:
            if url is None:
                url, _ = bounded_retry()(client.get, self._path(name))
            text = url.decode(errors="replace")
            # a note (or the reference it came from) is data anyone with write access could have made: only
            # the object named after its own batch of this queue, whose reference is gone, is deleted (a
            # store may hold other queues' batches too)
            try:
                self.queue._number(name)
            except CoordinationError:
                raise ForeignObjectError(f"{name!r} is no batch of this queue") from None
            if urllib.parse.urlparse(text).path.rpartition("/")[2] != f"{name}.batch":
                raise ForeignObjectError(f"{text!r} is not the object of batch {name}")
            if found and bounded_retry()(client.exists, f"{self.queue.paths.batch_refs}/{name}"):
                raise ForeignObjectError(f"batch {name} is still referenced")
            self.store.delete(text)
        except NoNodeError:
            return  # another prune finished it
        except ForeignObjectError as exc:  # written by something other than zeps: nothing of ours to delete
            log.warning("batch queue %s: the note of %s names no object retention may delete (%s); dropped",
                        self.queue.name, name, exc)  # fmt: skip
        except BatchStoreError as exc:
            self.failure = str(exc)
            self.left += 1
            return
        with contextlib.suppress(NoNodeError):
            bounded_retry()(client.delete, self._path(name))

    def report(self) -> None:
        if self.left:
            why = self.failure or "this handle has no store_url"
            log.warning("batch queue %s: %d removed batches' objects are still in the store (%s); they are "
                        "noted under %s and the next prune deletes them", self.queue.name, self.left, why,
                        self.queue.paths.batch_deleting)  # fmt: skip


class BatchConsumer:
    """One named consumer of a batch queue (its position is shared by all its instances)."""

    def __init__(self, queue: BatchQueue, name: str) -> None:
        self.queue = queue
        self.name = name
        self.path = queue.paths.processor(name)
        self.client = queue.client

    @zookeeper_errors
    def register(self, start: Literal["earliest", "latest"]) -> None:
        if start not in ("earliest", "latest"):
            raise ConfigError(f"start must be 'earliest' or 'latest', not {start!r}")
        self.queue.ensure()
        first = self.queue.latest() if start == "latest" else self.queue.first_retained() - 1
        with contextlib.suppress(NodeExistsError):  # an existing consumer keeps its position
            bounded_retry()(self.client.create, self.path, self.queue.batch_id(max(first, 0)).encode())

    def _read_position(self) -> tuple[int, int]:
        data, stat = bounded_retry()(self.client.get, self.path)
        return self.queue._number(data.decode()), stat.version

    @zookeeper_errors
    def position(self) -> int:
        """The last batch number this consumer processed."""
        return self._read_position()[0]

    @zookeeper_errors
    def lag(self) -> int:
        return self.queue.latest() - self.position()

    def process_available(self, handler: Callable[[Batch], None], *, limit: int | None = None) -> int:
        """Process, in order, every batch after our position up to the latest (at most ``limit``);
        the position advances (compare-and-set) after each handler returns. Returns the count.

        While the handler runs, the next ``read_ahead`` batches are read in threads (a store's
        latency overlaps the handler's work); a batch read ahead that is never handled (a limit, an
        error) is dropped, never counted."""
        ahead = self.queue.options.read_ahead
        latest = self.queue.latest()
        if ahead == 0:
            return self._process(handler, latest, limit, self.queue.read)
        with ThreadPoolExecutor(ahead, thread_name_prefix=f"zeps-read-{self.name}") as pool:
            reads: dict[int, Future[Batch]] = {}

            def take(number: int) -> Batch:
                for n in range(number, min(number + ahead, latest) + 1):
                    if n not in reads:
                        reads[n] = pool.submit(self.queue._read, n, read_ahead=False)  # reading ahead itself
                for n in [n for n in reads if n < number]:  # the position moved back (a reset): stale
                    reads.pop(n).cancel()
                return reads.pop(number).result()

            try:
                return self._process(handler, latest, limit, take)
            finally:
                for future in reads.values():
                    future.cancel()

    def _process(self, handler: Callable[[Batch], None], latest: int, limit: int | None,
                 read: Callable[[int], Batch]) -> int:  # fmt: skip
        done = 0
        while limit is None or done < limit:
            position, version = self._read_position()
            if position >= latest:
                return done
            batch = read(position + 1)
            handler(batch)
            try:
                bounded_retry()(self.client.set, self.path, batch.id.encode(), version=version)
            except BadVersionError:
                raise ConsumerConflictError(
                    f"consumer {self.name!r} of {self.queue.name}: another instance moved the position while "
                    f"{batch.id} was processed; run one instance per consumer name"
                ) from None
            done += 1
        return done

    def run(self, handler: Callable[[Batch], None], stop: threading.Event) -> None:
        """Process batches as they are published until ``stop`` is set (woken by a watch on latest)."""
        changed = threading.Event()

        def on_latest(_event: Any) -> None:
            changed.set()

        while not stop.is_set():
            changed.clear()
            bounded_retry()(self.client.exists, self.queue.paths.latest_batch, watch=on_latest)
            self.process_available(handler)
            # the watch wakes us, a stop ends the wait at once; after 5 s we look anyway (safety net)
            for _ in range(50):
                if changed.wait(0.1) or stop.is_set():
                    break

    @zookeeper_errors
    def reset(self, to: int) -> None:
        """Replay: make batch ``to`` the next one processed (it must still be retained)."""
        first = self.queue.first_retained()
        latest = self.queue.latest()
        if not first <= to <= latest + 1:
            raise ConfigError(f"cannot reset {self.name!r} to batch {to}: retained batches are {first}..{latest}")
        bounded_retry()(self.client.set, self.path, self.queue.batch_id(to - 1).encode())
