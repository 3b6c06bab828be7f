"""Growing a stream's journal volumes in place (a larger ``storage.size``), as a pure decision over
the claims as they are: which to grow, and what the ``Resizing`` condition says.

A StatefulSet's claim template cannot change, so each claim is asked for the new size itself (the
API server allows it where the claim's StorageClass has ``allowVolumeExpansion``); the template
keeps the size the set was made with. Volumes never shrink: a smaller size is refused in the
condition, and nothing changes. Once asked, the volume plugin grows the volume and sets the claim's
``FileSystemResizePending`` where the filesystem must grow on the node too. kubelet does that itself
while the pod runs where the driver can (online expansion: the condition goes within seconds); only
a condition that lasts :data:`ONLINE_RESIZE_GRACE_S` (a filesystem that grows only unmounted) has
the data-aware roll (:mod:`zeps_operator.roll`) restart that pod, which finishes the resize.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass

__all__ = ["ONLINE_RESIZE_GRACE_S", "Claim", "ResizeStep", "plan_resize", "restart_to_finish", "size_bytes"]

#: seconds kubelet is given to grow a mounted volume's filesystem itself before its pod is restarted
ONLINE_RESIZE_GRACE_S = 120.0

_UNITS = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}


@dataclass(frozen=True)
class Claim:
    """A journal volume's claim as the resize sees it (the adapter reads the quantities: bytes, and
    as written)."""

    name: str
    requested: str  #: spec.resources.requests.storage
    capacity: str  #: status.capacity.storage ("" until bound)
    requested_bytes: int
    capacity_bytes: int  #: 0 until bound
    filesystem_pending: bool = False  #: FileSystemResizePending for too long: its pod must restart to finish


def restart_to_finish(since: dt.datetime | None, now: dt.datetime) -> bool:
    """Whether a claim whose ``FileSystemResizePending`` is True since ``since`` waits for its pod to
    restart: once kubelet has had :data:`ONLINE_RESIZE_GRACE_S` to grow it online (a condition of
    unknown age: at once)."""
    return since is None or (now - since).total_seconds() >= ONLINE_RESIZE_GRACE_S


def size_bytes(size: str) -> int | None:
    """A ``storage.size`` (the schema's ``<n>Ki|Mi|Gi|Ti``) in bytes; None for anything else."""
    match = re.fullmatch(r"([0-9]+)(Ki|Mi|Gi|Ti)", size)
    return int(match.group(1)) * _UNITS[match.group(2)] if match else None


@dataclass(frozen=True)
class ResizeStep:
    """``grow``: the claims to ask for the size wanted now; ``resizing``: whether a resize is under way
    (the condition's status), with ``reason`` and ``message``."""

    grow: tuple[str, ...]
    resizing: bool
    reason: str
    message: str


def plan_resize(wanted: str, claims: list[Claim]) -> ResizeStep:
    """What to do for ``claims`` to hold ``wanted`` (a Kubernetes quantity, the spec's)."""
    size = size_bytes(wanted)
    if size is None or not claims:
        return ResizeStep((), False, "Current", "no journal volume to resize")
    larger = [c.name for c in claims if c.requested_bytes > size]
    if larger:
        return ResizeStep((), False, "CannotShrink", f"storage.size {wanted} is smaller than {', '.join(larger)}: "
                          "volumes never shrink (set it back, or make a new stream)")  # fmt: skip
    grow = tuple(c.name for c in claims if c.requested_bytes < size)
    growing = [c for c in claims if c.name in grow or c.capacity_bytes < size]
    if not growing:
        return ResizeStep((), False, "Current", f"every journal volume holds {wanted}")
    pending = [c.name for c in growing if c.filesystem_pending]
    parts = [f"{c.name} {c.capacity or '?'} -> {wanted}" for c in growing]
    if pending:
        parts.append(
            f"{', '.join(pending)}: the filesystem grows once its pod restarts (a replicated set's roll "
            "restarts it; a stream of one broker: kubectl rollout restart its Deployment)"
        )
    return ResizeStep(grow, True, "Resizing", "; ".join(parts))
