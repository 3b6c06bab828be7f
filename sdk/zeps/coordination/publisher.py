"""A Topic's background publisher (``publish_async``): whatever accumulated while the previous batch
was in flight goes as one pipelined publish, in the order it was queued."""

from __future__ import annotations

import queue as queue_mod
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future

from zeps.coordination.topic_view import QueueFullError
from zeps.envelope import Envelope
from zeps.errors import CoordinationError
from zeps.options import TopicOptions

__all__ = ["AsyncPublisher"]


class AsyncPublisher:
    """Background publisher for publish_async: sends whatever accumulated as one publish_many."""

    def __init__(self, name: str, options: TopicOptions, deliver: Callable[[Sequence[Envelope]], None]) -> None:
        self.name, self.options, self._deliver = name, options, deliver
        self._queue: queue_mod.SimpleQueue[tuple[Envelope, Future[str]] | None] = queue_mod.SimpleQueue()
        self._idle = threading.Condition()
        self._outstanding = 0
        self._thread = threading.Thread(target=self._run, name=f"zeps-topic-publisher-{name}", daemon=True)
        self._thread.start()

    def submit(self, envelope: Envelope) -> Future[str]:
        """Queue ``envelope``: at most ``max_async_pending`` wait at once; past that, wait up to
        ``block_timeout`` for room, then QueueFullError."""
        options, future = self.options, Future[str]()
        with self._idle:
            if not self._idle.wait_for(lambda: self._outstanding < options.max_async_pending, options.block_timeout):
                raise QueueFullError(f"topic {self.name!r}: {self._outstanding} publish_async messages still "
                                     f"wait to be durable (max_async_pending); ZooKeeper is slower than this "
                                     f"publisher, or unreachable, for {options.block_timeout:g}s")  # fmt: skip
            self._outstanding += 1
        self._queue.put((envelope, future))
        return future

    def flush(self, timeout: float | None) -> None:
        with self._idle:
            if not self._idle.wait_for(lambda: self._outstanding == 0, timeout):
                raise CoordinationError("flush timed out with messages still unpublished")

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(130)

    def _run(self) -> None:
        max_batch = 1000
        while True:
            item = self._queue.get()
            if item is None:
                return
            batch = [item]
            while len(batch) < max_batch:
                try:
                    more = self._queue.get_nowait()
                except queue_mod.Empty:
                    break
                if more is None:
                    self._queue.put(None)
                    break
                batch.append(more)
            try:
                self._deliver([e for e, _ in batch])
            except Exception as exc:
                for _, future in batch:
                    future.set_exception(exc)
            else:
                for envelope, future in batch:
                    future.set_result(envelope.id)
            with self._idle:
                self._outstanding -= len(batch)
                self._idle.notify_all()
