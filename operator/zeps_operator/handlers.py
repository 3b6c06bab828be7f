"""kopf handlers: thin wiring from Kubernetes events to the planner and the adapters.

Run with ``kopf run -m zeps_operator.handlers --all-namespaces`` (the chart does), with
``ZEPS_ZOOKEEPER`` set. Every handler: typed spec -> :mod:`zeps_operator.plan` -> apply (ZooKeeper
through :mod:`zeps.coordination.admin`, Kubernetes objects by server-side apply) -> status. Only the
kopf wiring is here: the path every resource takes is :mod:`zeps_operator.reconcile`, a ZepsStream's
own logic :mod:`zeps_operator.streams`, and what they share (settings, clients, the Lease and the
cleaning, events) :mod:`zeps_operator.state`.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from typing import Any

import kopf
from prometheus_client import start_http_server

from zeps.coordination import Topic, connect
from zeps.coordination.admin import (
    ZooKeeperUnavailableError,
    count_children,
    count_grandchildren,
    delete_resource,
    oldest_child_age,
    read_spec_node,
)
from zeps.coordination.batches import BatchQueue
from zeps.options import TopicOptions
from zeps.paths import QueuePaths, TopicPaths
from zeps.resources import GROUP, PLURALS, VERSION
from zeps_operator import metrics
from zeps_operator.cleaning import Cleaning
from zeps_operator.diffbase import StatusDiffBase
from zeps_operator.fairness import FairExecutor, fair
from zeps_operator.freshness import ReadCache
from zeps_operator.kube import Kube
from zeps_operator.leadership import LeaseKeeper
from zeps_operator.models import TopicSpec
from zeps_operator.plan import (
    Settings,
    replacing_map,
    retains_data,
    status_changes,
    zookeeper_layout,
)
from zeps_operator.reconcile import (
    only_changes,
    read_namespace_acl,
    zookeeper_resource,
)
from zeps_operator.resync import Entry, Resync
from zeps_operator.state import FINALIZER, RECONCILE_WORKERS, RESYNC, ZK_DEADLINE, Post, api_post, state
from zeps_operator.streams import PASSES, forget_keys_of, one_pass_at_a_time, reconcile_stream

log = logging.getLogger(__name__)

#: a resource's handler runs in its namespace's turn (zeps_operator.fairness): a namespace with
#: thousands of objects to reconcile does not hold up another's one
in_turn = fair(lambda: state.fair)


@kopf.on.startup()
def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    state.settings = Settings.from_env()
    state.fair = FairExecutor(RECONCILE_WORKERS, name="zeps-reconcile")
    state.acls = ReadCache(read_namespace_acl, max_age=RESYNC)
    state.quotas = set()
    settings.persistence.finalizer = FINALIZER
    settings.persistence.diffbase_storage = StatusDiffBase()  # one PATCH per change, not two
    settings.watching.server_timeout = 120  # reconnect watches regularly: a stalled one cannot linger
    settings.watching.client_timeout = 150
    settings.posting.level = logging.INFO
    # A timer caught mid-run by a deletion (sync, so in a thread kopf cannot cancel) keeps the finalizer
    # until it returns; kopf looks again only every cancellation_polling seconds (60 by default), so
    # one deletion in a few waited a minute. Wait for the timer in place (its ZooKeeper calls are
    # bounded by ZK_DEADLINE), and look again every second if it is slower still.
    settings.background.instant_exit_timeout = ZK_DEADLINE / 2
    settings.background.cancellation_polling = 1.0
    # Calls made during an outage fail at once (retried until ZK_DEADLINE), never wait for its end: a
    # resync pass stuck in one held up the deletion of its object (Resync.forget waits for it)
    s = state.settings
    state.zk = connect(
        s.zookeeper, auth=s.zookeeper_auth, ca=s.zookeeper_ca, acl_from_auth=False, call_deadline=ZK_DEADLINE
    )
    metrics.watch_zookeeper(lambda: state.zk is not None and state.zk.connected)
    state.kube = Kube.connect()
    state.cleaner_lease = LeaseKeeper(
        state.kube, s.cleaner_lease_namespace, s.cleaner_lease, identity=s.identity, duration=s.cleaner_lease_seconds
    ).start()
    state.cleaning = Cleaning(identity=s.identity, leading=state.cleaner_lease.leading).start()
    state.resync = Resync(_resync, interval=RESYNC, idle=RESYNC / 6).start()
    port = int(os.environ.get("ZEPS_OPERATOR_METRICS_PORT", "0"))
    if port:
        start_http_server(port, addr=os.environ.get("ZEPS_OPERATOR_METRICS_ADDR", "127.0.0.1"))


@kopf.on.cleanup()
def cleanup(**_: Any) -> None:
    if hasattr(state, "fair"):
        state.fair.stop()
    if hasattr(state, "resync"):
        state.resync.stop()
    if hasattr(state, "cleaning"):
        state.cleaning.stop()
    if hasattr(state, "cleaner_lease"):  # startup got that far
        state.cleaner_lease.stop()
    if state.zk is not None:
        state.zk.stop()
        state.zk.close()
    if hasattr(state, "kube"):
        state.kube.close()


# The probes are coroutines on purpose: kopf runs a sync handler in its thread pool, behind every
# handler already queued there. During a burst of 1,000 new Topics on kind, /healthz waited out its
# timeout behind that queue, the kubelet restarted the operator, and the restart resumed all 1,000.
@kopf.on.probe(id="zookeeper")
async def probe_zookeeper(**_: Any) -> bool:
    return bool(state.zk is not None and state.zk.connected)


@kopf.on.probe(id="last_event_age_s")
async def probe_events(**_: Any) -> float:
    return round(time.monotonic() - state.last_event, 1) if state.last_event else -1.0


# -- Topic ---------------------------------------------------------------------------------------
@kopf.on.create(GROUP, VERSION, PLURALS["Topic"])
@kopf.on.update(GROUP, VERSION, PLURALS["Topic"])
@kopf.on.resume(GROUP, VERSION, PLURALS["Topic"])
@in_turn
@only_changes
def topic_changed(body: kopf.Body, spec: kopf.Spec, patch: kopf.Patch, reason: kopf.Reason, **_: Any) -> None:
    if zookeeper_resource("Topic", body, spec, patch, _topic_facts, timer=False, reason=reason):
        state.cleaning.follow(_topic(body["metadata"], spec))  # its clients watched from now on
        _name_cleaner_holder(patch)  # already here, so the first resync pass finds nothing to write


def _topic_facts(body: Mapping[str, Any], patch: kopf.Patch) -> None:
    meta = body["metadata"]
    topic = TopicPaths.of(meta["namespace"], meta["name"], chroot=state.settings.chroot)
    patch.status["subscribers"] = count_children(state.zk, topic.subscribers.members, deadline=ZK_DEADLINE)
    undelivered = count_grandchildren(state.zk, topic.messages, deadline=ZK_DEADLINE)
    metrics.topic_facts(meta["namespace"], meta["name"], subscribers=patch.status["subscribers"],
                        undelivered=undelivered)  # fmt: skip


def _topic(meta: Mapping[str, Any], spec: Mapping[str, Any]) -> Topic:
    fields = TopicSpec.model_validate(dict(spec)).model_dump(exclude={"deletion_policy"})
    options = TopicOptions.make(**fields)
    return Topic(state.zk, meta["name"], namespace=meta["namespace"], chroot=state.settings.chroot, options=options)


def _name_cleaner_holder(patch: kopf.Patch) -> None:
    """``status.cleanerHolder``: the replica that holds the cleaner Lease, once one is known."""
    if state.cleaner_lease.holder:
        patch.status["cleanerHolder"] = state.cleaner_lease.holder


def _run_cleaner(body: Mapping[str, Any], spec: Mapping[str, Any], patch: kopf.Patch, *, post: Post) -> None:
    """The slow safety sweep behind the watch-driven cleaning (:mod:`zeps_operator.cleaning`): one
    cleaner pass over the Topic in the replica that holds the installation's cleaner Lease
    (:mod:`zeps_operator.leadership`), and the event for the queues removed since the last sweep."""
    _name_cleaner_holder(patch)
    removed = state.cleaning.sweep(_topic(body["metadata"], spec))
    if removed:
        post(body, "Normal", "Cleaned", f"removed the queues of vanished consumers {removed}")


# -- Queue ---------------------------------------------------------------------------------------
@kopf.on.create(GROUP, VERSION, PLURALS["Queue"])
@kopf.on.update(GROUP, VERSION, PLURALS["Queue"])
@kopf.on.resume(GROUP, VERSION, PLURALS["Queue"])
@in_turn
@only_changes
def queue_changed(body: kopf.Body, spec: kopf.Spec, patch: kopf.Patch, reason: kopf.Reason, **_: Any) -> None:
    zookeeper_resource("Queue", body, spec, patch, _queue_facts, timer=False, reason=reason)


def _queue_facts(body: Mapping[str, Any], patch: kopf.Patch) -> None:
    meta = body["metadata"]
    paths = QueuePaths.of(meta["namespace"], meta["name"], chroot=state.settings.chroot)
    lag: dict[str, int] = {}
    if (body.get("spec") or {}).get("mode") == "batches":
        batches = BatchQueue(state.zk, meta["name"], namespace=meta["namespace"], chroot=state.settings.chroot)
        lag = batches.lag()
        # consumer names are nodes anyone with the namespace's ACL can make: the status (an object of at
        # most 1.5 MiB in etcd) shows those furthest behind, as the metrics do, and counts them all. A
        # consumer no longer shown (gone, or caught up) leaves the map
        before = (body.get("status") or {}).get("consumerLag")
        patch.status["consumerLag"] = replacing_map(before, dict(metrics.furthest_behind(lag)))
        patch.status["batchConsumers"] = len(lag)
    patch.status["depth"] = count_children(state.zk, paths.items, deadline=ZK_DEADLINE)
    patch.status["inFlight"] = count_children(state.zk, paths.taken, deadline=ZK_DEADLINE)
    patch.status["deadLettered"] = count_children(state.zk, paths.dead, deadline=ZK_DEADLINE)
    oldest = oldest_child_age(state.zk, paths.items, deadline=ZK_DEADLINE)
    metrics.queue_facts(meta["namespace"], meta["name"], items=patch.status["depth"],
                        in_flight=patch.status["inFlight"], dead=patch.status["deadLettered"], lag=lag,
                        oldest_age_s=oldest)  # fmt: skip


# -- the resync of Topics and Queues (zeps_operator.resync) --------------------------------------
class _QuietSeen(logging.Filter):
    """Drops kopf's "Handler 'seen' succeeded." (logged for every watch event of every Topic and
    Queue: four per new Topic) from the operator's log; its failures are still logged."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.msg != "Handler 'seen' succeeded."


logging.getLogger("kopf.objects").addFilter(_QuietSeen())


@kopf.on.event(GROUP, VERSION, PLURALS["Topic"])
@kopf.on.event(GROUP, VERSION, PLURALS["Queue"])
async def seen(body: kopf.Body, type: str | None, **_: Any) -> None:
    """Every change of a Topic or Queue keeps its resync entry current (a coroutine: no thread)."""
    if type == "DELETED":
        meta = body["metadata"]
        state.resync.drop(body["kind"], meta["namespace"], meta["name"])
    else:
        state.resync.saw(body)


def _resync(entry: Entry) -> None:
    """One resync pass over a Topic or Queue: its ZooKeeper side made whole again (drift repaired,
    with a warning event), its facts counted again, a Topic's cleaner sweep run; the status fields
    that changed are written back, unless the object changed since the pass read it."""
    body = entry.body()
    spec, status = body["spec"], body["status"]
    patch = kopf.Patch()
    try:
        if entry.kind == "Topic":
            if zookeeper_resource("Topic", body, spec, patch, _topic_facts, timer=True, post=api_post):
                _run_cleaner(body, spec, patch, post=api_post)
        else:
            zookeeper_resource("Queue", body, spec, patch, _queue_facts, timer=True, post=api_post)
    except (kopf.TemporaryError, kopf.PermanentError) as exc:  # the status says why; passed again next time
        log.info("resync of %s %s/%s: %s", entry.kind, entry.namespace, entry.name, exc)
    finally:
        changes = status_changes(status, patch.get("status") or {})
        if changes:
            state.kube.patch_status(
                entry.kind, entry.namespace, entry.name, changes, resource_version=entry.resource_version
            )


# -- ZepsStream ----------------------------------------------------------------------------------
@kopf.on.create(GROUP, VERSION, PLURALS["ZepsStream"])
@kopf.on.update(GROUP, VERSION, PLURALS["ZepsStream"])
@kopf.on.resume(GROUP, VERSION, PLURALS["ZepsStream"])
@kopf.timer(GROUP, VERSION, PLURALS["ZepsStream"], interval=RESYNC / 3, idle=RESYNC / 15)
@in_turn
@one_pass_at_a_time
@only_changes
def stream_changed(body: kopf.Body, spec: kopf.Spec, patch: kopf.Patch, **kwargs: Any) -> None:
    reconcile_stream(body, spec, patch, kwargs.get("reason"))


# -- deletion ------------------------------------------------------------------------------------
@kopf.on.delete(GROUP, VERSION, PLURALS["Topic"])
@kopf.on.delete(GROUP, VERSION, PLURALS["Queue"])
@kopf.on.delete(GROUP, VERSION, PLURALS["ZepsStream"])
@in_turn
def deleted(body: kopf.Body, spec: kopf.Spec, retry: int, **_: Any) -> None:
    """deletionPolicy Delete removes the ZooKeeper subtree; Retain keeps it. With ZooKeeper
    unreachable: bounded retries, an event, then the finalizer is released (never a deadlock)."""
    kind, meta = body["kind"], body["metadata"]
    state.resync.forget(kind, meta["namespace"], meta["name"])  # a pass running on it ends first
    metrics.forget(kind, meta["namespace"], meta["name"])
    target, _children = zookeeper_layout(kind, meta["namespace"], meta["name"], state.settings.chroot)
    if kind == "Topic":
        state.cleaning.forget(target)
    if kind == "ZepsStream":
        PASSES.forget((meta["namespace"], meta["name"]))
    if retains_data(dict(spec)):
        kept = "ZooKeeper data, journal volume and CURVE keys" if kind == "ZepsStream" else "ZooKeeper data"
        kopf.info(body, reason="Retained", message=f"deletionPolicy Retain: {kept} kept")
        return
    if kind == "ZepsStream":  # its keys go with it (its journal volume too: the stream owns it)
        forget_keys_of(meta["namespace"], meta["name"])
    if state.zk is None or not state.zk.connected:
        if retry < state.settings.delete_retries:
            raise kopf.TemporaryError("ZooKeeper is unreachable; will retry", delay=2)
        kopf.warn(
            body,
            reason="CleanupSkipped",
            message=f"ZooKeeper unreachable after {retry} tries: released without deleting its data",
        )
        # Release it ourselves as well: kopf drops its finalizer only once every handler and timer of
        # the object has settled, which was seen to wait for ZooKeeper's return (idempotent if kopf did)
        remaining = [f for f in meta.get("finalizers", []) if f != FINALIZER]
        state.kube.set_finalizers(kind, meta["namespace"], meta["name"], remaining)
        return
    try:
        owner = str((read_spec_node(state.zk, target, deadline=ZK_DEADLINE) or {}).get("owner", ""))
    except ZooKeeperUnavailableError:
        raise kopf.TemporaryError("ZooKeeper did not answer in time", delay=2) from None
    if owner and owner != f"{state.settings.cluster}/{meta['uid']}":
        kopf.warn(body, reason="NotOwner", message=f"{target} belongs to {owner}: left in place")
        return
    delete_resource(state.zk, target, deadline=ZK_DEADLINE)
    kopf.info(body, reason="Deleted", message=f"removed {target}")
