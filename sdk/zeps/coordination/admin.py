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
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError
from kazoo.retry import RetryFailedError

from zeps.coordination._util import bounded_retry, delete_tree
from zeps.errors import CoordinationError, UnavailableError
from zeps.paths import LAYOUT_VERSION

__all__ = [
    "PathConflictError",
    "ZooKeeperUnavailableError",
    "count_children",
    "delete_resource",
    "ensure_resource",
    "read_spec_node",
]

F = TypeVar("F", bound=Callable[..., Any])


class PathConflictError(CoordinationError):
    """The path belongs to another object (a different UID)."""


class ZooKeeperUnavailableError(CoordinationError, UnavailableError):
    """ZooKeeper did not answer within the call's deadline."""


def _bounded(func: F) -> F:
    """Report an exhausted retry deadline as ZooKeeperUnavailableError (callers need no kazoo)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except RetryFailedError as exc:
            raise ZooKeeperUnavailableError(f"ZooKeeper did not answer in time ({exc})") from None

    return wrapper  # type: ignore[return-value]


@_bounded
def read_spec_node(client: KazooClient, root: str, *, deadline: float = 120.0) -> dict[str, Any] | None:
    try:
        data, _ = bounded_retry(deadline)(client.get, f"{root}/spec")
    except NoNodeError:
        return None
    try:
        value = json.loads(data)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


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
    it stay open. ``deadline``
    bounds the retries through a ZooKeeper outage (the operator keeps it short)."""
    retry = bounded_retry(deadline)
    repaired = []
    if boundary is not None and retry(client.exists, boundary) is None:
        parent = boundary.rsplit("/", 1)[0]
        if parent:
            retry(client.ensure_path, parent)
        with contextlib.suppress(NodeExistsError):
            retry(client.create, boundary, acl=acl)
    for child in (root, *(f"{root}/{c}" for c in children)):
        if retry(client.exists, child) is None:
            retry(client.ensure_path, child, acl=acl)
            repaired.append(child)
    current = read_spec_node(client, root, deadline=deadline)
    holder = str((current or {}).get("owner") or "")
    if holder and holder != owner and not (adopt_prefix and holder.startswith(adopt_prefix)):
        raise PathConflictError(f"{root} belongs to another object (uid {holder})")
    wanted = {"formatVersion": LAYOUT_VERSION, "owner": owner, "generation": generation, "spec": spec}
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
