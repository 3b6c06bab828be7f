"""kopf handlers: thin wiring from Kubernetes events to the planner and the adapters.

Run with ``kopf run -m zeps_operator.handlers --all-namespaces`` (the chart does), with
``ZEPS_ZOOKEEPER`` set. Every handler: typed spec -> :mod:`zeps_operator.plan` -> apply (ZooKeeper
through :mod:`zeps.coordination.admin`, Kubernetes objects by server-side apply) -> status.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any

import kopf
from prometheus_client import Counter, start_http_server
from pydantic import BaseModel

from zeps.broker.certificates import make_certificate
from zeps.coordination import Group, Topic, connect, digest_acl
from zeps.coordination.admin import (
    PathConflictError,
    ZooKeeperUnavailableError,
    count_children,
    delete_resource,
    ensure_resource,
    read_spec_node,
)
from zeps.coordination.batches import BatchQueue
from zeps.options import TopicOptions
from zeps.paths import QueuePaths, StreamPaths, TopicPaths
from zeps.resources import GROUP, PLURALS, VERSION
from zeps_operator.cleaning import Cleaning
from zeps_operator.curve import CURVE_SECRET, StreamKeys, client_secret, forget_keys, plan_keys
from zeps_operator.diffbase import StatusDiffBase
from zeps_operator.freshness import ReadCache, read_after_creation
from zeps_operator.kube import InvalidSecretError, Kube
from zeps_operator.leadership import LeaseKeeper
from zeps_operator.models import QueueSpec, StreamSpec, TopicSpec
from zeps_operator.plan import (
    NAMESPACE_AUTH_SECRET,
    STREAM_LABEL,
    Settings,
    condition,
    ready_at,
    ready_condition,
    receiver_settings,
    retains_data,
    status_changes,
    stream_endpoint,
    stream_member,
    stream_objects,
    zookeeper_layout,
)
from zeps_operator.resync import Entry, Resync

log = logging.getLogger(__name__)

RESYNC = float(os.environ.get("ZEPS_RESYNC_SECONDS", "30"))
# ZooKeeper calls give up after this: a handler waiting out an outage holds up every other handler
# of its object (kopf runs them one at a time), the finalizer included
ZK_DEADLINE = 10.0  # seconds
SPECS: dict[str, type[BaseModel]] = {"Topic": TopicSpec, "Queue": QueueSpec, "ZepsStream": StreamSpec}
FINALIZER = f"{GROUP}/cleanup"
RECONCILES = Counter("zeps_operator_reconciles", "Reconciliations", ["kind", "outcome"])


class _State:
    settings: Settings
    kube: Kube  # the Kubernetes adapter: every API call besides kopf's own
    cleaner_lease: LeaseKeeper  # whether this replica runs the Topics' cleaners
    cleaning: Cleaning  # the Topics' cleaner passes, driven by ZooKeeper watches
    resync: Resync  # the Topics' and Queues' resync passes
    zk: Any = None
    acls: ReadCache[list[Any] | None]  # namespace -> its ZooKeeper ACL, read from its Secret; see _namespace_acl
    last_event = 0.0


state = _State()


@kopf.on.startup()
def startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    state.settings = Settings.from_env()
    state.acls = ReadCache(_read_namespace_acl, max_age=RESYNC)
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
    state.zk = connect(state.settings.zookeeper, auth=state.settings.zookeeper_auth, acl_from_auth=False)
    state.kube = Kube.connect()
    s = state.settings
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


# -- events --------------------------------------------------------------------------------------
Post = Callable[[Mapping[str, Any], str, str, str], None]  # (body, type, reason, message)


def _kopf_post(body: Mapping[str, Any], type: str, reason: str, message: str) -> None:
    """An event from a kopf handler: kopf's poster, which batches them."""
    kopf.event(body, type=type, reason=reason, message=message)  # type: ignore[arg-type]


def _api_post(body: Mapping[str, Any], type: str, reason: str, message: str) -> None:
    """An event from the resync thread, where kopf's poster is not available: through the adapter."""
    meta = body["metadata"]
    involved = {"kind": body["kind"], "namespace": meta["namespace"], "name": meta["name"], "uid": meta["uid"]}
    state.kube.post_event(involved, type=type, reason=reason, message=message)


# -- the common path: ZooKeeper layout + spec node + Ready ----------------------------------------
def _only_changes(handler: Callable[..., Any]) -> Callable[..., Any]:
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


def _reconcile(
    kind: str,
    body: Mapping[str, Any],
    spec: Mapping[str, Any],
    patch: kopf.Patch,
    *,
    quiet: bool,
    read_after: float | None,
    post: Post = _kopf_post,
) -> str:
    """Ensure the ZooKeeper paths and spec node. ``quiet``: a repaired drift is a warning event (a
    resync found it); ``read_after``: see :func:`_namespace_acl`."""
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
        repaired = ensure_resource(
            state.zk,
            root,
            children,
            owner=owner,
            generation=generation,
            spec=typed.model_dump(by_alias=True),
            adopt_prefix=f"{state.settings.cluster}/",
            acl=_namespace_acl(namespace, read_after=read_after),
            boundary=f"{state.settings.chroot}/{namespace}",
            deadline=ZK_DEADLINE,
        )
    except ZooKeeperUnavailableError:
        _ready(body, patch, False, "ZooKeeperUnavailable", "ZooKeeper did not answer in time", generation=generation)
        raise kopf.TemporaryError("ZooKeeper did not answer in time", delay=5) from None
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
    patch.status["observedGeneration"] = generation
    patch.status["zookeeper"] = state.settings.zookeeper
    patch.status["path"] = root
    RECONCILES.labels(kind, "ok").inc()
    return "ok"


def _namespace_acl(namespace: str, *, read_after: float | None) -> list[Any] | None:
    """The namespace's ZooKeeper ACL: its digest user from the zeps-zookeeper-auth Secret, if any.

    From a read of the Secret that started after ``read_after`` (a wall-clock time: see
    :func:`_read_after`), or for None (a resync pass, a resume) within the last resync interval. One
    read serves every handler it is fresh enough for (:mod:`zeps_operator.freshness`): 1,000 Topics
    applied at once cost a few reads, not 1,000; an idle namespace, one per interval. The ACL is given
    to nodes as they are created: a Secret created or changed after an object's nodes exist does not
    change theirs (a node restored later gets the ACL read within the interval)."""
    try:
        return state.acls.get(namespace, read_after=read_after)
    except InvalidSecretError as exc:
        raise kopf.PermanentError(str(exc)) from None


def _read_namespace_acl(namespace: str) -> list[Any] | None:
    credentials = state.kube.credentials(namespace, NAMESPACE_AUTH_SECRET)
    return digest_acl(*credentials) if credentials else None


def _read_after(body: Mapping[str, Any], reason: kopf.Reason | None) -> float | None:
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


def _ready(
    body: Mapping[str, Any], patch: kopf.Patch, ready: bool, reason: str, message: str, *, generation: int
) -> None:
    """Set the Ready condition for ``generation``: the one the handler read when it began. kopf's body
    is live, so reading it again here could report a generation the handler never saw (a deletion,
    for one, bumps it)."""
    previous = (body.get("status") or {}).get("conditions")
    patch.status["conditions"] = condition(previous, ready=ready, reason=reason, message=message, generation=generation)


def _zookeeper_resource(
    kind: str,
    body: Mapping[str, Any],
    spec: Mapping[str, Any],
    patch: kopf.Patch,
    facts: Callable[[Mapping[str, Any], kopf.Patch], None],
    *,
    timer: bool,
    reason: kopf.Reason | None = None,
    post: Post = _kopf_post,
) -> bool:
    """Topic and Queue: reconcile the ZooKeeper side, fill in the facts, mark Ready. A change
    (not a resync pass: ``timer``) is also reported as an event. True when reconciled. ``reason``:
    the change's (kopf's), None for a resync pass."""
    generation = body["metadata"].get("generation", 1)
    conditions = (body.get("status") or {}).get("conditions")
    was_ready = ready_at(conditions, generation)
    # A resync pass can run beside the create handler: until the object has been Ready, missing
    # paths are not drift, and the handler's event is the one to post.
    read_after = _read_after(body, reason)
    if _reconcile(kind, body, spec, patch, quiet=timer and was_ready, read_after=read_after, post=post) != "ok":
        return False
    facts(body, patch)
    _ready(body, patch, True, "Reconciled", "ZooKeeper paths and spec are in place", generation=generation)
    recovered = (ready_condition(conditions) or {}).get("status") == "False"
    if not was_ready and (not timer or recovered):  # a transition: created, changed or recovered
        post(body, "Normal", "Reconciled", f"generation {generation}")
    return True


# -- Topic ---------------------------------------------------------------------------------------
@kopf.on.create(GROUP, VERSION, PLURALS["Topic"])
@kopf.on.update(GROUP, VERSION, PLURALS["Topic"])
@kopf.on.resume(GROUP, VERSION, PLURALS["Topic"])
@_only_changes
def topic_changed(body: kopf.Body, spec: kopf.Spec, patch: kopf.Patch, reason: kopf.Reason, **_: Any) -> None:
    if _zookeeper_resource("Topic", body, spec, patch, _topic_facts, timer=False, reason=reason):
        state.cleaning.follow(_topic(body["metadata"], spec))  # its clients watched from now on
        _name_cleaner_holder(patch)  # already here, so the first resync pass finds nothing to write


def _topic_facts(body: Mapping[str, Any], patch: kopf.Patch) -> None:
    meta = body["metadata"]
    topic = TopicPaths.of(meta["namespace"], meta["name"], chroot=state.settings.chroot)
    patch.status["subscribers"] = count_children(state.zk, topic.subscribers.members, deadline=ZK_DEADLINE)


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
@_only_changes
def queue_changed(body: kopf.Body, spec: kopf.Spec, patch: kopf.Patch, reason: kopf.Reason, **_: Any) -> None:
    _zookeeper_resource("Queue", body, spec, patch, _queue_facts, timer=False, reason=reason)


def _queue_facts(body: Mapping[str, Any], patch: kopf.Patch) -> None:
    meta = body["metadata"]
    paths = QueuePaths.of(meta["namespace"], meta["name"], chroot=state.settings.chroot)
    if (body.get("spec") or {}).get("mode") == "batches":
        batches = BatchQueue(state.zk, meta["name"], namespace=meta["namespace"], chroot=state.settings.chroot)
        patch.status["consumerLag"] = batches.lag()
    patch.status["depth"] = count_children(state.zk, paths.items, deadline=ZK_DEADLINE)
    patch.status["inFlight"] = count_children(state.zk, paths.taken, deadline=ZK_DEADLINE)
    patch.status["deadLettered"] = count_children(state.zk, paths.dead, deadline=ZK_DEADLINE)


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
            if _zookeeper_resource("Topic", body, spec, patch, _topic_facts, timer=True, post=_api_post):
                _run_cleaner(body, spec, patch, post=_api_post)
        else:
            _zookeeper_resource("Queue", body, spec, patch, _queue_facts, timer=True, post=_api_post)
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
@_only_changes
def stream_changed(body: kopf.Body, spec: kopf.Spec, patch: kopf.Patch, **kwargs: Any) -> None:
    generation = body["metadata"].get("generation", 1)
    # kopf names the cause of a change (create, update, resume); a timer has none
    read_after = _read_after(body, kwargs.get("reason"))
    if _reconcile("ZepsStream", body, spec, patch, quiet=True, read_after=read_after) != "ok":
        return
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    group = Group(state.zk, StreamPaths.of(namespace, name, chroot=state.settings.chroot).brokers)
    member = stream_member(name)
    if group.manifest() != frozenset({member}):
        group.set_manifest([member])
    typed = StreamSpec.model_validate(dict(spec))
    public_key = _ensure_curve(body, namespace, name, typed) if typed.curve else ""
    zookeeper_auth = _namespace_acl(namespace, read_after=read_after) is not None
    retain = retains_data(dict(spec))
    for obj in stream_objects(namespace, name, typed, state.settings, zookeeper_auth=zookeeper_auth):
        if not (retain and obj["kind"] == "PersistentVolumeClaim"):  # a retained journal outlives the stream
            kopf.adopt(obj, owner=body)
        state.kube.apply(obj)
    available = state.kube.deployment_available(namespace, f"{name}-broker")
    members = group.members()
    registered = member in members
    patch.status["brokerReady"] = available and registered
    if registered:
        # where clients connect and whose key they trust: the operator's own word (its Service, its
        # Secret), never what a member node in ZooKeeper says; the broker's live facts are only facts
        patch.status["endpoint"] = stream_endpoint(namespace, name, typed)
        patch.status["curvePublicKey"] = public_key
        if typed.multicast is not None:
            patch.status["multicast"] = receiver_settings(typed.multicast)
        facts = members[member].metadata
        for key in ("lastSequence", "journalBytes"):
            if isinstance(facts.get(key), int):
                patch.status[key] = facts[key]
    if available and registered:
        _ready(body, patch, True, "BrokerReady", "the broker is available and registered", generation=generation)
    else:
        why = "the broker Deployment is not available" if not available else "the broker has not registered yet"
        _ready(body, patch, False, "BrokerNotReady", why, generation=generation)
        raise kopf.TemporaryError(why, delay=5)


def _ensure_curve(body: kopf.Body, namespace: str, name: str, spec: StreamSpec) -> str:
    """The stream's CURVE keys in the namespace's Secret (made once, kept), its admitted clients set to
    ``spec.curveClients``, each client's own Secret made once (:mod:`zeps_operator.curve`), a multicast
    key if it has a multicast output; the broker's public key."""
    planned: list[StreamKeys] = []
    clients = spec.curve_clients

    def change(data: dict[str, str]) -> dict[str, str]:
        planned.append(plan_keys(data, name, clients, make=make_certificate, multicast=spec.multicast is not None))
        return planned[-1].data

    state.kube.update_secret(namespace, CURVE_SECRET, change, labels={"app.kubernetes.io/managed-by": "zeps-operator"})
    keys = planned[-1]
    if keys.changed:
        kopf.info(body, reason="CurveKeys", message=f"CURVE clients admitted: {', '.join(clients) or 'none'}")
    for client in keys.clients:
        secret = client_secret(namespace, name, client, keys, {"app.kubernetes.io/managed-by": "zeps-operator",
                                                                 STREAM_LABEL: name})  # fmt: skip
        kopf.adopt(secret, owner=body)
        if state.kube.create_once(secret):
            made = secret["metadata"]["name"]
            kopf.info(body, reason="CurveClient", message=f"made Secret {made} for client {client}")
    return keys.public_key


# -- deletion ------------------------------------------------------------------------------------
@kopf.on.delete(GROUP, VERSION, PLURALS["Topic"])
@kopf.on.delete(GROUP, VERSION, PLURALS["Queue"])
@kopf.on.delete(GROUP, VERSION, PLURALS["ZepsStream"])
def deleted(body: kopf.Body, spec: kopf.Spec, retry: int, **_: Any) -> None:
    """deletionPolicy Delete removes the ZooKeeper subtree; Retain keeps it. With ZooKeeper
    unreachable: bounded retries, an event, then the finalizer is released (never a deadlock)."""
    kind, meta = body["kind"], body["metadata"]
    state.resync.forget(kind, meta["namespace"], meta["name"])  # a pass running on it ends first
    target, _children = zookeeper_layout(kind, meta["namespace"], meta["name"], state.settings.chroot)
    if kind == "Topic":
        state.cleaning.forget(target)
    if retains_data(dict(spec)):
        kept = "ZooKeeper data, journal volume and CURVE keys" if kind == "ZepsStream" else "ZooKeeper data"
        kopf.info(body, reason="Retained", message=f"deletionPolicy Retain: {kept} kept")
        return
    if kind == "ZepsStream":  # its keys go with it (its journal volume too: the stream owns it)
        state.kube.update_secret(meta["namespace"], CURVE_SECRET, lambda data: forget_keys(data, meta["name"]),
                                 labels={"app.kubernetes.io/managed-by": "zeps-operator"})  # fmt: skip
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
