"""What the operator does in ZooKeeper for a resource: its paths, its spec node, its facts.

The spec node (``<root>/spec``) holds ``{"formatVersion", "owner", "generation", "spec"}``: the
reconciled spec and the UID of the Kubernetes object that owns the path. A second object claiming
the same path (another namespace's resource cannot: namespaces are path components; the same
resource recreated gets a new UID) is refused with :class:`PathConflictError`.
"""

from __future__ import annotations

import contextlib
import functools
import json
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NodeExistsError, NoNodeError
from kazoo.exceptions import QuotaExceededError as KazooQuotaExceededError
from kazoo.retry import KazooRetry, RetryFailedError
from kazoo.security import OPEN_ACL_UNSAFE

from zeps import _json as bounded_json
from zeps.coordination._util import QUOTA_REFUSAL, Op, bounded_retry, commit, delete_tree, failures
from zeps.coordination.quota import Quota, protect_quotas, set_quota
from zeps.errors import CoordinationError, QuotaExceededError, UnavailableError
from zeps.paths import LAYOUT_VERSION

__all__ = [
    "PathConflictError",
    "ZooKeeperUnavailableError",
    "count_children",
    "count_grandchildren",
    "delete_resource",
    "ensure_quota",
    "ensure_resource",
    "oldest_child_age",
    "read_spec_node",
    "resource_nodes",
]

F = TypeVar("F", bound=Callable[..., Any])


class PathConflictError(CoordinationError):
    """The path belongs to another object (a different UID)."""


class ZooKeeperUnavailableError(CoordinationError, UnavailableError):
    """ZooKeeper did not answer within the call's deadline."""


def _bounded(func: F) -> F:
    """Report an exhausted retry deadline as ZooKeeperUnavailableError, and a write past the
    namespace's quota as QuotaExceededError (callers need no kazoo)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except RetryFailedError as exc:
            raise ZooKeeperUnavailableError(f"ZooKeeper did not answer in time ({exc})") from None
        except KazooQuotaExceededError:
            raise QuotaExceededError(QUOTA_REFUSAL) from None

    return wrapper  # type: ignore[return-value]


@_bounded
def read_spec_node(client: KazooClient, root: str, *, deadline: float = 120.0) -> dict[str, Any] | None:
    try:
        data, _ = bounded_retry(deadline)(client.get, f"{root}/spec")
    except NoNodeError:
        return None
    return _decode_spec(data)


def resource_nodes(root: str, children: Iterable[str], *, boundary: str | None = None) -> list[str]:
    """Every node a resource needs, parents first: the ancestors of ``root`` below ``boundary`` (all
    of them without one), ``root``, and each child with the nodes between (``batches`` before
    ``batches/data``)."""
    nodes: list[str] = []
    parts = root.strip("/").split("/")
    for depth in range(1, len(parts) + 1):
        node = "/" + "/".join(parts[:depth])
        if boundary is None or (node.startswith(f"{boundary}/") and node != boundary):
            nodes.append(node)
    for child in children:
        steps = child.split("/")
        for depth in range(1, len(steps) + 1):
            node = f"{root}/{'/'.join(steps[:depth])}"
            if node not in nodes:
                nodes.append(node)
    return nodes


@_bounded
def ensure_resource(
    client: KazooClient,
    root: str,
    children: Iterable[str],
    *,
    owner: str,
    generation: int,
    spec: dict[str, Any],
    adopt_prefix: str | None = None,
    acl: list[Any] | None = None,
    boundary: str | None = None,
    deadline: float = 120.0,
) -> list[str]:
    """Create missing paths and (re)write the spec node; returns what was repaired or written.

    ``adopt_prefix``: take over a spec node whose owner starts with it — an object of the same name
    and cluster with another UID (the previous resource was deleted with deletionPolicy: Retain).
    ``acl``: the ACL of every node created below ``boundary`` (the namespace's node); nodes above
    it stay open. ``deadline`` bounds the retries through a ZooKeeper outage (the operator keeps it
    short).

    Two round trips, however many nodes: one asks at once whether each node exists and what the
    spec node holds; one transaction creates what is missing and writes the spec node (checked
    against the version read). A transaction that fails because another client changed the paths
    in between is done again one call at a time (:func:`_ensure_step_by_step`)."""
    retry = bounded_retry(deadline)
    children = list(children)
    wanted = {"formatVersion": LAYOUT_VERSION, "owner": owner, "generation": generation, "spec": spec}
    nodes = resource_nodes(root, children, boundary=boundary)
    probed = [*([boundary] if boundary is not None else []), *nodes]
    found, spec_data, spec_stat = retry(_probe, client, probed, f"{root}/spec")
    exists = {node: (f[1] if f is not None else None) for node, f in zip(probed, found, strict=True)}
    if boundary is not None and exists[boundary] is None:
        _ensure_boundary(client, boundary, acl=acl, retry=retry)
    # a node someone made (or changed) before its owner used zeps, with an ACL of their own (ALL for
    # them: they could then delete and make what is under it): the operator, a super user of the
    # servers, puts the namespace's own back on it, and says so (it is among the nodes repaired)
    repaired = []
    for node, f in zip(probed, found, strict=True):
        if f is not None and _acl_differs(f[0], acl):
            retry(client.set_acls, node, acl or list(OPEN_ACL_UNSAFE), version=f[1].aversion)
            repaired.append(node)
    current = _decode_spec(spec_data) if spec_stat is not None else None
    _check_owner(current, root, owner=owner, adopt_prefix=adopt_prefix)
    missing = [node for node in nodes if exists[node] is None]
    ops: list[Op] = [("create", node, b"", {"acl": acl}) for node in missing]
    data = json.dumps(wanted, sort_keys=True).encode()
    if spec_stat is None:
        ops.append(("create", f"{root}/spec", data, {"acl": acl}))
    elif current != wanted:
        ops.append(("set", f"{root}/spec", data, spec_stat.version))
    if not ops:
        return repaired
    # A commit retried after its answer was lost finds its own nodes there: it fails, and the step
    # by step pass finds nothing left to do (and reports nothing repaired).
    if failures(retry(commit, client, ops)):  # another client got there between the two round trips
        return repaired + _ensure_step_by_step(
            client, root, children, wanted=wanted, adopt_prefix=adopt_prefix, acl=acl, retry=retry
        )
    return repaired + [op[1] for op in ops]


@_bounded
def ensure_quota(
    client: KazooClient, path: str, *, nodes: int, size: int, acl: list[Any] | None = None, deadline: float = 120.0
) -> bool:
    """Hard limits on the subtree at ``path``: ``nodes`` nodes and ``size`` bytes of data (0: none of
    that kind; both 0: nothing is done). ``acl``: the operator's own, for the quota's nodes and for
    ``/zookeeper/quota`` (then only it may set or lift a quota; see :mod:`zeps.coordination.quota`).
    True if anything was written."""
    quota = Quota(nodes, size)
    if quota.unlimited:
        return False
    retry = bounded_retry(deadline)
    if acl:
        retry(protect_quotas, client, acl)
    return bool(retry(set_quota, client, path, quota, acl=acl))


def _probe(client: KazooClient, nodes: list[str], spec_node: str) -> tuple[list[Any], bytes | None, Any]:
    """Each of ``nodes``' ACL and stat (None for a missing node), and the spec node's data and stat,
    asked for all at once: one round trip to ZooKeeper, not one per node."""
    asked = [client.get_acls_async(node) for node in nodes]
    spec = client.get_async(spec_node)
    found: list[Any] = []
    for answer in asked:
        try:
            found.append(answer.get())
        except NoNodeError:
            found.append(None)
    try:
        data, stat = spec.get()
    except NoNodeError:
        return found, None, None
    return found, data, stat


def _acl_differs(found: list[Any], wanted: list[Any] | None) -> bool:
    """Whether a node's ACL is not the one wanted (None: open to everyone, a namespace without credentials)."""
    want = wanted or list(OPEN_ACL_UNSAFE)
    return sorted((a.perms, a.id.scheme, a.id.id) for a in found) != sorted(
        (a.perms, a.id.scheme, a.id.id) for a in want
    )


def _ensure_boundary(client: KazooClient, boundary: str, *, acl: list[Any] | None, retry: KazooRetry) -> None:
    """The namespace's node, with ``acl``; the nodes above it open."""
    parent = boundary.rsplit("/", 1)[0]
    if parent:
        retry(client.ensure_path, parent)
    with contextlib.suppress(NodeExistsError):
        retry(client.create, boundary, acl=acl)


def _decode_spec(data: bytes | None) -> dict[str, Any]:
    try:
        value = bounded_json.loads(data or b"")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _check_owner(current: dict[str, Any] | None, root: str, *, owner: str, adopt_prefix: str | None) -> None:
    holder = str((current or {}).get("owner") or "")
    if holder and holder != owner and not (adopt_prefix and holder.startswith(adopt_prefix)):
        raise PathConflictError(f"{root} belongs to another object (uid {holder})")


def _ensure_step_by_step(
    client: KazooClient,
    root: str,
    children: list[str],
    *,
    wanted: dict[str, Any],
    adopt_prefix: str | None,
    acl: list[Any] | None,
    retry: KazooRetry,
) -> list[str]:
    """What :func:`ensure_resource` does, one call at a time, each tolerating what another client
    did just before: used when its transaction lost a race."""
    repaired = []
    for child in (root, *(f"{root}/{c}" for c in children)):
        if retry(client.exists, child) is None:
            retry(client.ensure_path, child, acl=acl)
            repaired.append(child)
    try:
        data, _ = retry(client.get, f"{root}/spec")
        current: dict[str, Any] | None = _decode_spec(data)
    except NoNodeError:
        current = None
    _check_owner(current, root, owner=wanted["owner"], adopt_prefix=adopt_prefix)
    if current != wanted:
        data = json.dumps(wanted, sort_keys=True).encode()
        try:
            retry(client.create, f"{root}/spec", data, acl=acl)
        except NodeExistsError:
            retry(client.set, f"{root}/spec", data)
        repaired.append(f"{root}/spec")
    return repaired


@_bounded
def delete_resource(client: KazooClient, root: str, *, deadline: float = 120.0) -> None:
    delete_tree(client, root, deadline=deadline)


@_bounded
def count_children(client: KazooClient, path: str, *, deadline: float = 120.0) -> int:
    stat = bounded_retry(deadline)(client.exists, path)
    return int(stat.numChildren) if stat is not None else 0


@_bounded
def oldest_child_age(client: KazooClient, path: str, *, most: int = 10_000, now: float | None = None,
                     deadline: float = 120.0) -> float | None:  # fmt: skip
    """Seconds since the oldest child of ``path`` (the lowest sequence suffix: children made
    sequential) was created, by ZooKeeper's clock; 0.0 without children; None when there are more
    than ``most`` (listing them would cost more than the fact is worth) or the oldest went while we
    looked."""
    retry = bounded_retry(deadline)
    stat = retry(client.exists, path)
    if stat is None or stat.numChildren == 0:
        return 0.0
    if stat.numChildren > most:
        return None
    names = sorted(retry(client.get_children, path), key=lambda name: name[-10:])[:3]
    for name in names:  # the oldest may be taken and acked between the listing and its stat
        child = retry(client.exists, f"{path}/{name}")
        if child is not None:
            return max(0.0, (time.time() if now is None else now) - int(child.ctime) / 1000)
    return None


@_bounded
def count_grandchildren(client: KazooClient, path: str, *, most: int = 1000, listed: int = 10_000,
                        deadline: float = 120.0) -> int | None:  # fmt: skip
    """The children of the first ``most`` children of ``path`` (by name), counted: one listing and one
    pipelined stat per child, whatever their sizes. None when ``path`` has more than ``listed``
    children (anyone with the ACL can make them: listing them all would cost more than the fact)."""
    retry = bounded_retry(deadline)
    stat = retry(client.exists, path)
    if stat is None:
        return 0
    if stat.numChildren > listed:
        return None
    names = sorted(retry(client.get_children, path))[:most]
    pending = [client.exists_async(f"{path}/{name}") for name in names]
    total = 0
    for name, result in zip(names, pending, strict=True):
        try:
            child = result.get(timeout=deadline)
        except (KazooException, client.handler.timeout_exception):  # a lost connection: ask again, bounded
            child = retry(client.exists, f"{path}/{name}")
        total += int(child.numChildren) if child is not None else 0
    return total
