"""The path every resource takes (:mod:`zeps_operator.handlers` calls it): its ZooKeeper layout and
spec node, the namespace's ACL, the Ready condition, events on transitions only."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping
from typing import Any

import kopf

from zeps.coordination import digest_acl
from zeps.coordination.admin import (
    PathConflictError,
    ZooKeeperUnavailableError,
    ensure_quota,
    ensure_resource,
)
from zeps.errors import QuotaExceededError
from zeps_operator import metrics
from zeps_operator.freshness import read_after_creation
from zeps_operator.kube import InvalidSecretError
from zeps_operator.plan import (
    NAMESPACE_AUTH_SECRET,
    condition,
    ready_at,
    ready_condition,
    status_changes,
    zookeeper_layout,
)
from zeps_operator.state import RECONCILES, SPECS, ZK_DEADLINE, Post, kopf_post, state


# -- the common path: ZooKeeper layout + spec node + Ready ----------------------------------------
def only_changes(handler: Callable[..., Any]) -> Callable[..., Any]:
    """Drop from the handler's status patch every field the object already shows (also when it
    raises): kopf sends no empty patch, so a resync that finds nothing new makes no API write."""

    @functools.wraps(handler)
    def wrapper(**kwargs: Any) -> Any:
        try:
            return handler(**kwargs)
        finally:
            patch: kopf.Patch = kwargs["patch"]
            if "status" in patch:
                changes = status_changes(kwargs["body"].get("status") or {}, patch["status"])
                if changes:
                    patch["status"] = changes
                else:
                    del patch["status"]

    return wrapper


def reconcile(
    kind: str,
    body: Mapping[str, Any],
    spec: Mapping[str, Any],
    patch: kopf.Patch,
    *,
    quiet: bool,
    read_after: float | None,
    post: Post = kopf_post,
) -> str:
    """Ensure the ZooKeeper paths and spec node. ``quiet``: a repaired drift is a warning event (a
    resync found it); ``read_after``: see :func:`namespace_acl`."""
    state.last_event = time.monotonic()
    meta = body["metadata"]
    namespace, name, generation = meta["namespace"], meta["name"], meta.get("generation", 1)
    typed = SPECS[kind].model_validate(dict(spec))  # the schema validated it; defaults filled in
    root, children = zookeeper_layout(kind, namespace, name, state.settings.chroot)
    owner = f"{state.settings.cluster}/{meta['uid']}"
    previous = (body.get("status") or {}).get("conditions")
    if state.zk is None or not state.zk.connected:
        # fail fast: a handler waiting out a ZooKeeper outage would hold up this object's other
        # handlers (kopf runs them one at a time per object), the finalizer included
        patch.status["conditions"] = condition(
            previous,
            ready=False,
            reason="ZooKeeperUnavailable",
            message="ZooKeeper is not reachable",
            generation=generation,
        )
        raise kopf.TemporaryError("ZooKeeper is not reachable", delay=5)
    try:
        namespace_quota(namespace)
        repaired = ensure_resource(
            state.zk,
            root,
            children,
            owner=owner,
            generation=generation,
            spec=typed.model_dump(by_alias=True),
            adopt_prefix=f"{state.settings.cluster}/",
            acl=namespace_acl(namespace, read_after=read_after),
            boundary=f"{state.settings.chroot}/{namespace}",
            deadline=ZK_DEADLINE,
        )
    except ZooKeeperUnavailableError:
        ready(body, patch, False, "ZooKeeperUnavailable", "ZooKeeper did not answer in time", generation=generation)
        raise kopf.TemporaryError("ZooKeeper did not answer in time", delay=5) from None
    except QuotaExceededError as exc:  # the tenant's own nodes fill its quota: it has to free room
        ready(body, patch, False, "QuotaExceeded", str(exc), generation=generation)
        if (ready_condition(previous) or {}).get("reason") != "QuotaExceeded":
            post(body, "Warning", "QuotaExceeded", str(exc))
        raise kopf.TemporaryError(str(exc), delay=30) from None
    except PathConflictError as exc:
        patch.status["conditions"] = condition(
            previous, ready=False, reason="Conflict", message=str(exc), generation=generation
        )
        if (ready_condition(previous) or {}).get("reason") != "Conflict":
            post(body, "Warning", "Conflict", str(exc))  # once, when the conflict begins
        RECONCILES.labels(kind, "conflict").inc()
        return "conflict"
    if repaired and quiet:
        post(body, "Warning", "DriftRepaired", f"restored {', '.join(repaired)}")
        metrics.DRIFT_REPAIRS.labels(kind).inc()
    patch.status["observedGeneration"] = generation
    patch.status["zookeeper"] = state.settings.zookeeper
    patch.status["zookeeperCA"] = state.settings.zookeeper_ca or None  # None: removed, if TLS was turned off
    patch.status["path"] = root
    RECONCILES.labels(kind, "ok").inc()
    return "ok"


def namespace_quota(namespace: str) -> None:
    """The namespace's ZooKeeper quota (the operator's settings; none when both are 0), set on its
    subtree once per namespace and operator process: a tenant cannot fill the servers that every
    namespace shares. Its nodes, and ``/zookeeper/quota``, get the operator's ACL when it has a
    ZooKeeper identity, so no tenant can lift its own quota or set one on another namespace."""
    s = state.settings
    if namespace in state.quotas or not (s.namespace_quota_nodes or s.namespace_quota_bytes):
        return
    acl = digest_acl(*s.zookeeper_auth) if s.zookeeper_auth else None
    ensure_quota(state.zk, f"{s.chroot}/{namespace}", nodes=s.namespace_quota_nodes, size=s.namespace_quota_bytes,
                 acl=acl, deadline=ZK_DEADLINE)  # fmt: skip
    state.quotas.add(namespace)


def namespace_acl(namespace: str, *, read_after: float | None) -> list[Any] | None:
    """The namespace's ZooKeeper ACL: its digest user from the zeps-zookeeper-auth Secret, if any.

    From a read of the Secret that started after ``read_after`` (a wall-clock time: see
    :func:`read_after`), or for None (a resync pass, a resume) within the last resync interval. One
    read serves every handler it is fresh enough for (:mod:`zeps_operator.freshness`): 1,000 Topics
    applied at once cost a few reads, not 1,000; an idle namespace, one per interval. The ACL is given
    to nodes as they are created: a Secret created or changed after an object's nodes exist does not
    change theirs (a node restored later gets the ACL read within the interval)."""
    try:
        return state.acls.get(namespace, read_after=read_after)
    except InvalidSecretError as exc:
        raise kopf.PermanentError(str(exc)) from None


def read_namespace_acl(namespace: str) -> list[Any] | None:
    credentials = state.kube.credentials(namespace, NAMESPACE_AUTH_SECRET)
    return digest_acl(*credentials) if credentials else None


def read_after(body: Mapping[str, Any], reason: kopf.Reason | None) -> float | None:
    """How fresh a read of the namespace's Secret the handler needs: one that shows the Secret as it
    was when the object was created (a user creates the Secret, then the object), or for any other
    change, a read begun now. A resume (every object, at each operator start) or a timer (no reason)
    takes any read of the last resync interval."""
    if reason is None or reason == kopf.Reason.RESUME:
        return None
    created = body["metadata"].get("creationTimestamp")
    if reason == kopf.Reason.CREATE and created:
        return read_after_creation(created)
    return time.time()


def ready(
    body: Mapping[str, Any], patch: kopf.Patch, ready: bool, reason: str, message: str, *, generation: int
) -> None:
    """Set the Ready condition for ``generation``: the one the handler read when it began. kopf's body
    is live, so reading it again here could report a generation the handler never saw (a deletion,
    for one, bumps it)."""
    patch.status["conditions"] = condition(conditions_now(body, patch), ready=ready, reason=reason, message=message,
                                           generation=generation)  # fmt: skip


def conditions_now(body: Mapping[str, Any], patch: kopf.Patch) -> list[dict[str, Any]] | None:
    """The conditions as this pass leaves them so far: those it set already, else the object's."""
    return patch.status.get("conditions") or (body.get("status") or {}).get("conditions")


def zookeeper_resource(
    kind: str,
    body: Mapping[str, Any],
    spec: Mapping[str, Any],
    patch: kopf.Patch,
    facts: Callable[[Mapping[str, Any], kopf.Patch], None],
    *,
    timer: bool,
    reason: kopf.Reason | None = None,
    post: Post = kopf_post,
) -> bool:
    """Topic and Queue: reconcile the ZooKeeper side, fill in the facts, mark Ready. A change
    (not a resync pass: ``timer``) is also reported as an event. True when reconciled. ``reason``:
    the change's (kopf's), None for a resync pass."""
    generation = body["metadata"].get("generation", 1)
    conditions = (body.get("status") or {}).get("conditions")
    was_ready = ready_at(conditions, generation)
    # A resync pass can run beside the create handler: until the object has been reconciled once,
    # missing paths are not drift, and the handler's event is the one to post. Once it has, they are,
    # also while it shows not Ready (a pass during a ZooKeeper outage marks it so; the paths removed
    # meanwhile are restored by the pass after it).
    reconciled_once = (body.get("status") or {}).get("observedGeneration") is not None
    after = read_after(body, reason)
    if reconcile(kind, body, spec, patch, quiet=timer and reconciled_once, read_after=after, post=post) != "ok":
        return False
    facts(body, patch)
    ready(body, patch, True, "Reconciled", "ZooKeeper paths and spec are in place", generation=generation)
    recovered = (ready_condition(conditions) or {}).get("status") == "False"
    if not was_ready and (not timer or recovered):  # a transition: created, changed or recovered
        post(body, "Normal", "Reconciled", f"generation {generation}")
    return True
