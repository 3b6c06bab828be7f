"""The operator's process-wide state and constants: what its handlers, its reconcile path
(:mod:`zeps_operator.reconcile`) and its ZepsStream logic (:mod:`zeps_operator.streams`) share. Set up
by the startup handler (:mod:`zeps_operator.handlers`)."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import kopf
from prometheus_client import Counter
from pydantic import BaseModel

from zeps.resources import GROUP
from zeps_operator.cleaning import Cleaning
from zeps_operator.fairness import FairExecutor
from zeps_operator.freshness import ReadCache
from zeps_operator.kube import Kube
from zeps_operator.leadership import LeaseKeeper
from zeps_operator.models import QueueSpec, StreamSpec, TopicSpec
from zeps_operator.plan import (
    Settings,
)
from zeps_operator.resync import Resync

RESYNC = float(os.environ.get("ZEPS_RESYNC_SECONDS", "30"))
# ZooKeeper calls give up after this: a handler waiting out an outage holds up every other handler
# of its object (kopf runs them one at a time), the finalizer included
ZK_DEADLINE = 10.0  # seconds
SPECS: dict[str, type[BaseModel]] = {"Topic": TopicSpec, "Queue": QueueSpec, "ZepsStream": StreamSpec}
FINALIZER = f"{GROUP}/cleanup"
#: threads running the resources' handlers, taking namespaces in turn (kopf's own pool's default size)
RECONCILE_WORKERS = min(32, (os.cpu_count() or 1) + 4)
RECONCILES = Counter("zeps_operator_reconciles", "Reconciliations", ["kind", "outcome"])


class _State:
    settings: Settings
    kube: Kube  # the Kubernetes adapter: every API call besides kopf's own
    cleaner_lease: LeaseKeeper  # whether this replica runs the Topics' cleaners
    cleaning: Cleaning  # the Topics' cleaner passes, driven by ZooKeeper watches
    resync: Resync  # the Topics' and Queues' resync passes
    fair: FairExecutor  # where the resources' handlers run: namespaces in turn (zeps_operator.fairness)
    zk: Any = None
    acls: ReadCache[list[Any] | None]  # namespace -> its ZooKeeper ACL, read from its Secret; see namespace_acl
    quotas: set[str]  # namespaces whose ZooKeeper quota this process has set; see namespace_quota
    last_event = 0.0


state = _State()


# -- events --------------------------------------------------------------------------------------
Post = Callable[[Mapping[str, Any], str, str, str], None]  # (body, type, reason, message)


def kopf_post(body: Mapping[str, Any], type: str, reason: str, message: str) -> None:
    """An event from a kopf handler: kopf's poster, which batches them."""
    kopf.event(body, type=type, reason=reason, message=message)  # type: ignore[arg-type]


def api_post(body: Mapping[str, Any], type: str, reason: str, message: str) -> None:
    """An event from the resync thread, where kopf's poster is not available: through the adapter."""
    meta = body["metadata"]
    involved = {"kind": body["kind"], "namespace": meta["namespace"], "name": meta["name"], "uid": meta["uid"]}
    state.kube.post_event(involved, type=type, reason=reason, message=message)
