"""Helpers shared by the recipes: the bounded retry policy, the boundary that turns kazoo's errors
into zeps errors, and deleting a subtree in transactions."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Concatenate, ParamSpec, TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoAuthError, NoNodeError, NotEmptyError, RolledBackError
from kazoo.exceptions import QuotaExceededError as KazooQuotaExceededError
from kazoo.retry import KazooRetry

from zeps.errors import CoordinationError, QuotaExceededError

DELETE_CHUNK = 500  # deletes per transaction when emptying a node
#: what a write refused for the namespace's quota says (the recipes' boundary, the operator's status)
QUOTA_REFUSAL = (
    "ZooKeeper refused the write (QuotaExceeded): this namespace's nodes are at the quota the operator set "
    "(the chart's zookeeper.namespaceQuota); nothing was written. Free room (drain the namespace's queues, "
    "delete the Topics and Queues it no longer needs) or ask the cluster admin for a larger quota"
)


def bounded_retry(deadline: float = 120.0) -> KazooRetry:
    """Retry through ConnectionLoss and session expiry (a reconnect, a ZooKeeper restart) for up to
    ``deadline`` seconds (two minutes by default). The deadline is checked between attempts: an
    attempt made while the client has no connection waits for a server, unless the client was made
    with ``connect(call_deadline=...)`` (then it fails at once, and this retries it). A fresh object
    per call: KazooRetry keeps per-call state."""
    return KazooRetry(max_tries=-1, delay=0.05, backoff=2, max_delay=1.0, deadline=deadline, ignore_expire=True)


P = ParamSpec("P")
R = TypeVar("R")
S = TypeVar("S")


def zookeeper_errors(method: Callable[Concatenate[S, P], R]) -> Callable[Concatenate[S, P], R]:
    """The boundary of a recipe's public method: a kazoo error that gets this far (a bounded retry's
    deadline passed, a refusal the recipe does not expect) leaves as a CoordinationError naming the
    call, so a caller's ``except zeps.ZepsError`` is enough to keep a worker loop alive."""

    @functools.wraps(method)
    def boundary(self: S, /, *args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(self, *args, **kwargs)
        except NoAuthError as exc:
            raise CoordinationError(
                f"{type(self).__name__}.{method.__name__}: ZooKeeper refused (NoAuth): this client's ZooKeeper "
                "identity may not touch these nodes; use the namespace's own (ZEPS_ZOOKEEPER_USER and "
                "ZEPS_ZOOKEEPER_PASSWORD from its zeps-zookeeper-auth Secret)"
            ) from exc
        except KazooQuotaExceededError as exc:
            raise QuotaExceededError(f"{type(self).__name__}.{method.__name__}: {QUOTA_REFUSAL}") from exc
        except KazooException as exc:
            raise CoordinationError(f"{type(self).__name__}.{method.__name__}: ZooKeeper: {exc!r}") from exc

    return boundary


Op = tuple[Any, ...]


def commit(client: KazooClient, ops: list[Op]) -> list[Any]:
    """Build and commit one transaction from ``ops`` — ``("create", path, data, kwargs)``,
    ``("delete", path)``, ``("delete", path, version)``, ``("check", path, version)``,
    ``("set", path, data, version)`` — and return kazoo's per-op outcome. Raises what kazoo raises
    (ConnectionLoss leaves the outcome unknown: the caller decides how to find out)."""
    t = client.transaction()
    for op in ops:
        kind, path, *rest = op
        if kind == "create":
            t.create(path, rest[0], **(rest[1] if len(rest) > 1 else {}))
        elif kind == "delete":
            t.delete(path, *rest)
        elif kind == "check":
            t.check(path, rest[0])
        elif kind == "set":
            t.set_data(path, rest[0], *rest[1:])
        else:
            raise ValueError(f"unknown transaction op {kind!r}")
    result: list[Any] = t.commit()
    return result


def failures(outcome: list[Any]) -> list[Exception]:
    """The errors in a transaction outcome, without the RolledBackError of the ops that were fine."""
    return [r for r in outcome if isinstance(r, Exception) and not isinstance(r, RolledBackError)]


def refused(what: str, errors: list[Exception]) -> CoordinationError:
    """The error a failed transaction raises: QuotaExceededError when the namespace's quota refused
    an op (saying what to do), else a CoordinationError naming ``what`` and the first failure."""
    if any(isinstance(e, KazooQuotaExceededError) for e in errors):
        return QuotaExceededError(f"{what}: {QUOTA_REFUSAL}")
    return CoordinationError(f"{what}: {errors[0]!r}")


def delete_tree(client: KazooClient, path: str, *, attempts: int = 20, deadline: float = 120.0) -> None:
    """Delete ``path`` and everything below it, in transactions of DELETE_CHUNK, even while writers
    keep adding children (bounded by ``attempts`` passes). Children that have children of their own
    are emptied first, recursively."""
    retry = bounded_retry(deadline)
    for _ in range(attempts):
        try:
            children = retry(client.get_children, path)
        except NoNodeError:
            return
        for start in range(0, len(children), DELETE_CHUNK):
            chunk = children[start : start + DELETE_CHUNK]
            outcome = retry(lambda chunk=chunk: commit(client, [("delete", f"{path}/{c}") for c in chunk]))
            for child, result in zip(chunk, outcome, strict=False):
                if isinstance(result, NotEmptyError):  # a subtree: empty it, then it goes on the next pass
                    delete_tree(client, f"{path}/{child}", attempts=attempts, deadline=deadline)
        try:
            retry(client.delete, path)
            return
        except NotEmptyError:
            continue
        except NoNodeError:
            return
    raise CoordinationError(f"could not delete {path}: it keeps receiving children")
