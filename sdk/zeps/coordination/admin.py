"""What the operator does in ZooKeeper for a resource: its paths, its spec node, its facts.

The spec node (``<root>/spec``) holds ``{"formatVersion", "owner", "generation", "spec"}``: the
reconciled spec and the UID of the Kubernetes object that owns the path. A second object claiming
the same path (another namespace's resource cannot: namespaces are path components; the same
resource recreated gets a new UID) is refused with :class:`PathConflictError`.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError, NoNodeError

from zeps.coordination._util import bounded_retry, delete_tree
from zeps.errors import CoordinationError
from zeps.paths import LAYOUT_VERSION

__all__ = ["PathConflictError", "count_children", "delete_resource", "ensure_resource", "read_spec_node"]


class PathConflictError(CoordinationError):
    """The path belongs to another object (a different UID)."""


def read_spec_node(client: KazooClient, root: str) -> dict[str, Any] | None:
    try:
        data, _ = bounded_retry()(client.get, f"{root}/spec")
    except NoNodeError:
        return None
    try:
        value = json.loads(data)
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def ensure_resource(
    client: KazooClient,
    root: str,
    children: Iterable[str],
    *,
    owner: str,
    generation: int,
    spec: dict[str, Any],
    adopt: bool = False,
    acl: list[Any] | None = None,
    boundary: str | None = None,
) -> list[str]:
    """Create missing paths and (re)write the spec node; returns what was repaired or written.

    ``adopt``: take over a spec node left by an object of the same name with another UID (the
    previous resource was deleted with deletionPolicy: Retain). ``acl``: the ACL of every node
    created below ``boundary`` (the namespace's node); nodes above it stay open."""
    retry = bounded_retry()
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
    current = read_spec_node(client, root)
    if current and current.get("owner") not in (None, owner) and not adopt:
        raise PathConflictError(f"{root} belongs to another object (uid {current.get('owner')})")
    wanted = {"formatVersion": LAYOUT_VERSION, "owner": owner, "generation": generation, "spec": spec}
    if current != wanted:
        data = json.dumps(wanted, sort_keys=True).encode()
        try:
            retry(client.create, f"{root}/spec", data, acl=acl)
        except NodeExistsError:
            retry(client.set, f"{root}/spec", data)
        repaired.append(f"{root}/spec")
    return repaired


def delete_resource(client: KazooClient, root: str) -> None:
    delete_tree(client, root)


def count_children(client: KazooClient, path: str) -> int:
    stat = bounded_retry()(client.exists, path)
    return int(stat.numChildren) if stat is not None else 0
