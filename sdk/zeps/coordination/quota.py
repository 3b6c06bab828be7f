"""A ZooKeeper quota on a subtree: what one namespace may store on the shared servers.

ZooKeeper (3.7+) keeps a subtree's quota in nodes of its own, ``/zookeeper/quota/<path>/``:
``zookeeper_limits`` holds the limits, ``zookeeper_stats`` what the subtree holds now (the servers
keep it). A hard limit (``countHardLimit``, ``byteHardLimit``) is enforced by servers started with
``-Dzookeeper.enforceQuota=true`` (zeps's ZooKeeper image and development servers are): a create or
a set that would pass it fails with ``QuotaExceeded``, which the recipes raise as
:class:`zeps.errors.QuotaExceededError`. A soft limit only logs, so zeps writes hard ones only.

Whoever may write under ``/zookeeper/quota`` may change or lift any quota, or set a tiny one on
another tenant's path. The operator, the servers' super user, writes the quota nodes with its own ACL
and makes ``/zookeeper/quota`` readable by everyone and writable by it alone
(:func:`protect_quotas`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kazoo.client import KazooClient
from kazoo.exceptions import NodeExistsError
from kazoo.security import ACL, make_acl

__all__ = ["QUOTA_ROOT", "Quota", "Usage", "protect_quotas", "read_quota", "set_quota"]

QUOTA_ROOT = "/zookeeper/quota"
LIMITS, STATS = "zookeeper_limits", "zookeeper_stats"


@dataclass(frozen=True)
class Quota:
    """Hard limits on a subtree: ``nodes`` (the subtree's root counts) and ``size``, the bytes of node
    data; 0 leaves that one unlimited."""

    nodes: int = 0
    size: int = 0

    def encode(self) -> bytes:
        """ZooKeeper's ``StatsTrack`` text: no soft limits, the hard ones (-1: none)."""
        return (f"count=-1,bytes=-1,countHardLimit={self.nodes or -1},byteHardLimit={self.size or -1}").encode()

    @property
    def unlimited(self) -> bool:
        return not (self.nodes or self.size)


@dataclass(frozen=True)
class Usage:
    """What the subtree holds now, as the servers count it: nodes, and bytes of data (``size``)."""

    nodes: int
    size: int


def _fields(data: bytes) -> dict[str, int]:
    out = {}
    for part in data.decode("ascii", "replace").split(","):
        key, _, value = part.partition("=")
        if value.lstrip("-").isdigit():
            out[key.strip()] = int(value)
    return out


def set_quota(client: KazooClient, path: str, quota: Quota, *, acl: Sequence[ACL] | None = None) -> bool:
    """Make ``quota`` the hard limits of the subtree at ``path`` (its nodes need not exist yet);
    True if anything was written. ``acl``: the quota nodes' (the operator's own, so that tenants
    cannot change them; everyone may read them). The stats node comes first: the servers count the
    subtree into it when the limits appear."""
    base = f"{QUOTA_ROOT}{path}"
    nodes_acl = [*acl, make_acl("world", "anyone", read=True)] if acl else None  # a tenant may read its own
    client.ensure_path(base, acl=nodes_acl)
    wrote = False
    try:
        client.create(f"{base}/{STATS}", b"count=0,bytes=0", acl=nodes_acl)
        wrote = True
    except NodeExistsError:
        pass
    encoded = quota.encode()
    try:
        client.create(f"{base}/{LIMITS}", encoded, acl=nodes_acl)
        return True
    except NodeExistsError:
        data, stat = client.get(f"{base}/{LIMITS}")
        if data != encoded:
            client.set(f"{base}/{LIMITS}", encoded, version=stat.version)
            return True
    return wrote


def read_quota(client: KazooClient, path: str) -> tuple[Quota, Usage] | None:
    """The hard limits on ``path`` and what it holds now; None without a quota."""
    base = f"{QUOTA_ROOT}{path}"
    if client.exists(f"{base}/{LIMITS}") is None:
        return None
    limits = _fields(client.get(f"{base}/{LIMITS}")[0])
    stats = _fields(client.get(f"{base}/{STATS}")[0]) if client.exists(f"{base}/{STATS}") else {}
    quota = Quota(max(limits.get("countHardLimit", -1), 0), max(limits.get("byteHardLimit", -1), 0))
    return quota, Usage(stats.get("count", 0), stats.get("bytes", 0))


def protect_quotas(client: KazooClient, acl: Sequence[ACL]) -> None:
    """``/zookeeper/quota`` readable by everyone and otherwise only by ``acl`` (the operator's)."""
    read = make_acl("world", "anyone", read=True)
    wanted = [*acl, read]
    current, stat = client.get_acls(QUOTA_ROOT)
    if sorted(map(str, current)) != sorted(map(str, wanted)):
        client.set_acls(QUOTA_ROOT, wanted, version=stat.aversion)
