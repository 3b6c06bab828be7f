"""Fair turns between namespaces for the operator's blocking work.

kopf runs a sync handler in one thread pool, first come first served: a namespace that applies 5,000
Topics queues 5,000 reconciliations, and another namespace's one Topic waits behind all of them. The
handlers of zeps's resources run here instead (:func:`fair`): each namespace has a queue of its own,
and the worker threads take the namespaces with work waiting in turn (round robin), one item each.
A namespace with one object waiting is served after at most one item of each other busy namespace,
whatever their backlogs; a namespace alone gets every worker, as before.

A handler kopf cancels (an object deleted while its timer waits its turn) leaves the queue if it had
not started yet; if it had, the cancellation waits for it to end, as kopf waits for a sync handler,
so that nothing of the object runs after its deletion handler.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, TypeVar

__all__ = ["FairExecutor", "fair"]

T = TypeVar("T")

_Item = tuple[Callable[[], Any], "concurrent.futures.Future[Any]"]


class FairExecutor:
    """``workers`` threads running callables, taking the keys (namespaces) with work waiting in turn."""

    def __init__(self, workers: int, *, name: str = "zeps-fair") -> None:
        if workers < 1:
            raise ValueError(f"workers={workers}: at least 1")
        self._queues: dict[str, deque[_Item]] = {}
        self._turns: deque[str] = deque()  # the keys with work waiting, in the order they are served
        self._changed = threading.Condition()
        self._stopped = False
        self._threads = [threading.Thread(target=self._work, name=f"{name}-{i}", daemon=True) for i in range(workers)]
        for thread in self._threads:
            thread.start()

    def submit(self, key: str, fn: Callable[[], T]) -> concurrent.futures.Future[T]:
        """Run ``fn()`` in ``key``'s turn; its future resolves with the result (or the exception)."""
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        with self._changed:
            if self._stopped:
                raise RuntimeError("the executor is stopped")
            queue = self._queues.get(key)
            if queue is None:
                queue = self._queues[key] = deque()
                self._turns.append(key)
            queue.append((fn, future))
            self._changed.notify()
        return future

    async def run(self, key: str, fn: Callable[[], T]) -> T:
        """``fn()`` in ``key``'s turn, awaited. Cancelled before it starts, it never runs; cancelled
        while it runs, the cancellation waits for it to end (see the module's notes)."""
        future = self.submit(key, fn)
        try:
            return await asyncio.shield(asyncio.wrap_future(future))
        except asyncio.CancelledError:
            if not future.cancel():  # running already: wait for it, whatever it raises
                await asyncio.wait([asyncio.wrap_future(future)])
            raise

    def waiting(self) -> dict[str, int]:
        """Items waiting their turn, by key."""
        with self._changed:
            return {key: len(queue) for key, queue in self._queues.items()}

    def stop(self, timeout: float = 10.0) -> None:
        """No new work; the threads end once what is queued ran (waited for ``timeout`` at most, in all)."""
        with self._changed:
            self._stopped = True
            self._changed.notify_all()
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _next(self) -> _Item | None:
        with self._changed:
            while not self._turns:
                if self._stopped:
                    return None
                self._changed.wait()
            key = self._turns.popleft()
            queue = self._queues[key]
            item = queue.popleft()
            if queue:
                self._turns.append(key)  # its next item after every other key's
            else:
                del self._queues[key]
            return item

    def _work(self) -> None:
        while (item := self._next()) is not None:
            fn, future = item
            if not future.set_running_or_notify_cancel():
                continue  # cancelled while it waited
            try:
                result = fn()
            except BaseException as exc:  # handed to the awaiting handler, as kopf's thread pool does
                future.set_exception(exc)
            else:
                future.set_result(result)


def fair(executor: Callable[[], FairExecutor]) -> Callable[[Callable[..., T]], Callable[..., Awaitable[T]]]:
    """A sync kopf handler as a coroutine that runs it in its namespace's turn on ``executor()`` (a
    callable: the executor is made at the operator's startup, after the handlers are registered)."""

    def decorate(handler: Callable[..., T]) -> Callable[..., Awaitable[T]]:
        async def in_turn(**kwargs: Any) -> T:
            body: Mapping[str, Any] = kwargs["body"]
            namespace = str(body.get("metadata", {}).get("namespace") or "")
            # in the handler's context, as kopf runs a sync handler: kopf.info() and its kind find
            # their event queue through context variables
            context = contextvars.copy_context()
            return await executor().run(namespace, functools.partial(context.run, handler, **kwargs))

        # the handler's names, but not functools.wraps: kopf follows ``__wrapped__`` to tell a sync
        # handler from a coroutine (and would run this one in its thread pool); the same qualified
        # name keeps the handler's id, under which kopf records its progress on each object
        in_turn.__name__, in_turn.__qualname__ = handler.__name__, handler.__qualname__
        in_turn.__module__, in_turn.__doc__ = handler.__module__, handler.__doc__
        return in_turn

    return decorate
