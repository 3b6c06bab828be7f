"""What the operator does for a ZepsStream (:mod:`zeps_operator.handlers` registers it with kopf): the
broker's objects (:mod:`zeps_operator.plan`), its group's manifest, its CURVE keys
(:mod:`zeps_operator.curve`), and its status from the operator's own word."""

from __future__ import annotations

import copy
import functools
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar, cast

import kopf

from zeps.broker.certificates import make_certificate, public_key_of
from zeps.coordination import Group
from zeps.coordination.replication import (
    UncleanElectionError,
    elect_unclean,
    read_replication_state,
    seed_replication_state,
)
from zeps.errors import ConfigError
from zeps.paths import StreamPaths
from zeps_operator import metrics
from zeps_operator.curve import (
    CURVE_SECRET,
    ROTATE,
    ROTATION_PHASES,
    ROTATION_WINDOW,
    StreamKeys,
    client_rotation,
    client_secret,
    client_secret_name,
    forget_keys,
    plan_keys,
    rotation_data,
)
from zeps_operator.models import StreamSpec
from zeps_operator.moving import MOVE_ANNOTATION, MoveFacts, journal_claim, plan_move
from zeps_operator.passes import StreamPasses
from zeps_operator.plan import (
    STREAM_LABEL,
    broker_config_digest,
    broker_name,
    migration_objects,
    receiver_settings,
    refused_pod,
    replacing_map,
    retains_data,
    set_condition,
    stream_endpoint,
    stream_member,
    stream_members,
    stream_objects,
    under_replicated,
)
from zeps_operator.reconcile import conditions_now, namespace_acl, read_after, ready, reconcile
from zeps_operator.resize import plan_resize
from zeps_operator.roll import RollStep, next_step, scale_down
from zeps_operator.state import RESYNC, state

log = logging.getLogger(__name__)
T = TypeVar("T")

# -- ZepsStream ----------------------------------------------------------------------------------
#: one pass over a stream at a time, and no timer pass over a copy of it the last pass acted on
#: (:mod:`zeps_operator.passes`)
PASSES = StreamPasses(hold=RESYNC)


def one_pass_at_a_time(handler: Callable[..., T]) -> Callable[..., T | None]:
    """A ZepsStream handler run holding the stream's lock, over a copy of the object as it was when
    the pass began (kopf's body is a live view, replaced as the watch delivers), skipped when it is a
    timer's pass (kopf names no ``reason``) over the version the last writing pass read. Outside
    :func:`zeps_operator.reconcile.only_changes`: a pass wrote when it handled a creation or a change
    (kopf records what it handled) or its patch is not empty once the unchanged status is left out."""

    @functools.wraps(handler)
    def wrapper(**kwargs: Any) -> T | None:
        live, patch, timer = kwargs["body"], kwargs["patch"], kwargs.get("reason") is None
        key = (live["metadata"]["namespace"], live["metadata"]["name"])
        with PASSES.lock(key):
            body = kwargs["body"] = kopf.Body(cast(kopf.RawBody, copy.deepcopy(dict(live))))
            kwargs["spec"] = body.spec
            if not PASSES.begin(key, str(body["metadata"].get("resourceVersion") or ""), time.monotonic(), timer=timer):
                log.debug("ZepsStream %s/%s: its timer's copy is the one the last pass wrote from: skipped", *key)
                return None
            try:
                return handler(**kwargs)
            finally:
                if patch or kwargs.get("reason") in ("create", "update"):  # kopf then records the change handled
                    PASSES.wrote(key, time.monotonic())

    return wrapper


def reconcile_stream(body: kopf.Body, spec: kopf.Spec, patch: kopf.Patch, reason: kopf.Reason | None) -> None:
    """One pass over a ZepsStream (a change, a resume, or its timer: ``reason`` None): the common
    path, the manifest, CURVE keys, the broker's objects, and its status. Run holding the stream's
    lock (:func:`one_pass_at_a_time`)."""
    generation = body["metadata"].get("generation", 1)
    after = read_after(body, reason)  # kopf names the cause of a change (create, update, resume); a timer none
    # a path restored is drift (a warning, the ZepsDriftRepaired alert's count) once the stream was
    # reconciled (it has an observedGeneration): before that, the paths its first pass makes are not
    if reconcile("ZepsStream", body, spec, patch, read_after=after,
                 quiet=(body.get("status") or {}).get("observedGeneration") is not None) != "ok":  # fmt: skip
        return
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    paths = StreamPaths.of(namespace, name, chroot=state.settings.chroot)
    # every node the operator makes under the namespace's root carries the namespace's ACL, as its
    # resources' nodes do (the operator, a super user of the servers, writes them all the same)
    acl = namespace_acl(namespace, read_after=after)
    group = Group(state.zk, paths.brokers, acl=acl)
    typed = StreamSpec.model_validate(dict(spec))
    if (refused := refused_pod(namespace, typed, state.settings)) is not None:
        conditions = (body.get("status") or {}).get("conditions") or []
        if not any(c.get("reason") == "PodNotAllowed" and c.get("message") == refused for c in conditions):
            kopf.warn(body, reason="PodNotAllowed", message=refused)  # once, not at every pass
        ready(body, patch, False, "PodNotAllowed", refused, generation=generation)
        return  # nothing made or changed for it: what runs keeps running as it was
    replicated = replication_mode(body, typed, patch)
    migrating = replicated is None
    waits: dict[str, str] = {}  # a smaller replicas waits for the replicas that stay (roll.scale_down)
    moves: dict[str, dict[str, Any]] = {}  # a replica being moved (zeps_operator.moving), by its broker set
    surges = {p: scaled(body, typed, p, waits, moves) for p in range(1, typed.partitions)}  # partitions 1 and up
    surge = scaled(body, typed, 0, waits, moves) if replicated else 0
    members = surged_members(name, typed, surge, replicated=replicated is not False)
    if migrating:  # the old broker is the first replica until the new ones hold its journal
        members = [stream_member(name), *members]
        seed_replication_state(state.zk, paths, stream_member(name), acl=acl)
    if group.manifest() != frozenset(members):
        group.set_manifest(members)
    peers = [m for p, up in surges.items() for m in surged_members(name, typed, up, replicated=True, partition=p)]
    public_key = stream_curve(body, typed, members if replicated is not False else [], peers, patch=patch)
    retain = retains_data(dict(spec))
    if migrating and len(migration_copied(namespace, name, typed)) >= typed.in_sync:  # never its old objects again
        finish_migration(body, typed, group, patch, retain=retain, generation=generation)
    objects = broker_objects(namespace, name, typed, replicated, zookeeper_auth=acl is not None)
    apply_objects(body, surged(objects, surge), retain=retain)
    if replicated and (asked := (meta.get("annotations") or {}).get(UNCLEAN_ELECTION)):
        unclean_election(body, typed, str(asked))
    others = [reconcile_partition(body, typed, p, up, acl=acl) for p, up in surges.items()]
    scaling_status(body, patch, waits, generation=generation)
    move_status(body, patch, moves, generation=generation)
    if not migrating:
        resize_journals(body, patch, typed, replicated=bool(replicated), generation=generation)
        rolls = {broker_name(name, p): roll_brokers(body, typed, patch, p) for p in range(typed.partitions)
                 if p > 0 or replicated}  # fmt: skip
        roll_status(body, patch, rolls, generation=generation)
    if migrating:
        finish_migration(body, typed, group, patch, retain=retain, generation=generation)
        return
    if replicated:
        replicated_status(body, typed, group, patch, generation=generation, public_key=public_key, others=others)
        return
    single_status(body, typed, group, patch, generation=generation, public_key=public_key, others=others)


def stream_curve(body: kopf.Body, spec: StreamSpec, members: list[str], others: list[str], *, patch: kopf.Patch
                 ) -> str:  # fmt: skip
    """With ``curve``, the broker's public key, and a certificate for each replica of every replicated
    broker set, which they peer with: ``members``, partition 0's (none for a stream of one broker),
    ``others`` those of partitions 1 and up, each set's surge included (a replica being moved has
    a copy added first: :func:`move_replica`); "" without ``curve``."""
    if not spec.curve:
        return ""
    meta = body["metadata"]
    return ensure_curve(body, meta["namespace"], meta["name"], spec, replicas=[*members, *others], patch=patch)


#: annotate a replicated ZepsStream with ``<replica>`` (or ``<partition>/<replica>``) to elect that
#: replica although it is not in sync, when none of the in-sync replicas can come back
UNCLEAN_ELECTION = "zeps.dev/unclean-election"


def unclean_election(body: kopf.Body, spec: StreamSpec, asked: str) -> None:
    """The annotation :data:`UNCLEAN_ELECTION` asks for an unclean election: done once (the
    annotation is removed once done or refused, by :func:`take_back`; ZooKeeper away, it is tried
    again), said in an event: what it gives up, or why it was refused."""
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    partition, _, replica = asked.rpartition("/")
    try:
        number = int(partition) if partition else 0
        if not 0 <= number < spec.partitions:
            raise UncleanElectionError(f"partition {number}: the stream has {spec.partitions}")
        paths = StreamPaths.of(namespace, name, chroot=state.settings.chroot, partition=number)
        report = elect_unclean(state.zk, paths, replica)
    except (UncleanElectionError, ConfigError, ValueError) as exc:  # not ZooKeeper away: that is tried again
        take_back(body, UNCLEAN_ELECTION)
        kopf.warn(body, reason="UncleanElectionRefused", message=f"{UNCLEAN_ELECTION}={asked!r}: {exc}")
        return
    take_back(body, UNCLEAN_ELECTION)
    kopf.warn(body, reason="UncleanElection", message=(
        f"{replica} leads the next epoch{f' of partition {number}' if number else ''} without having been in sync "
        f"(in sync were {', '.join(sorted(report.in_sync_before))}): it gives up at least {report.gives_up} "
        f"confirmed records (recorded commit point {report.recorded}; it holds up to {report.holds})"))  # fmt: skip


def take_back(body: kopf.Body, annotation: str) -> None:
    """A one-shot request (a replica to move, an unclean election) done or refused: its annotation
    removed, only if it still holds what this pass read (someone may have asked anew since: that
    request stays, for the next pass)."""
    meta = body["metadata"]
    asked = (meta.get("annotations") or {}).get(annotation)
    key = (meta["namespace"], meta["name"])
    if asked is not None and state.kube.remove_annotation("ZepsStream", *key, annotation, str(asked)):
        PASSES.wrote(key, time.monotonic())


def single_status(body: kopf.Body, spec: StreamSpec, group: Group, patch: kopf.Patch, *, generation: int,
                  public_key: str, others: list[dict[str, Any]]) -> None:  # fmt: skip
    """A stream of one broker: ready once its Deployment is available and its broker registered (and
    every other partition of a partitioned stream serves)."""
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    member = stream_member(name)
    available = state.kube.deployment_available(namespace, f"{name}-broker")
    live = group.members()
    registered = member in live
    patch.status["brokerReady"] = available and registered
    metrics.stream_facts(namespace, name, ready=patch.status["brokerReady"])
    if registered:
        # where clients connect and whose key they trust: the operator's own word (its Service, its
        # Secret), never what a member node in ZooKeeper says; the broker's live facts are only facts
        patch.status["endpoint"] = stream_endpoint(namespace, name, spec)
        patch.status["curvePublicKey"] = public_key
        if spec.multicast is not None:
            patch.status["multicast"] = receiver_settings(spec.multicast)
        facts = live[member].metadata
        for key in ("lastSequence", "journalBytes"):
            if isinstance(facts.get(key), int):
                patch.status[key] = facts[key]
    waiting = partitions_status(body, patch, others)
    if available and registered and waiting is None:
        ready(body, patch, True, "BrokerReady", "the broker is available and registered", generation=generation)
    elif available and registered:
        ready(body, patch, False, "PartitionsNotReady", str(waiting), generation=generation)
        raise kopf.TemporaryError(str(waiting), delay=5)
    else:
        why = "the broker Deployment is not available" if not available else "the broker has not registered yet"
        ready(body, patch, False, "BrokerNotReady", why, generation=generation)
        raise kopf.TemporaryError(why, delay=5)


def apply_objects(body: kopf.Body, objects: list[dict[str, Any]], *, retain: bool) -> None:
    """Create or update the stream's objects, owned by it (a retained journal's PVC outlives it)."""
    for obj in objects:
        if not (retain and obj["kind"] == "PersistentVolumeClaim"):
            kopf.adopt(obj, owner=body)
        state.kube.apply(obj)


def replication_mode(body: kopf.Body, spec: StreamSpec, patch: kopf.Patch) -> bool | None:
    """Whether the stream runs replicated (a StatefulSet), decided at its first reconcile and kept in
    ``status.replicated``: a replicated stream stays one at any replicas (3 -> 1 -> 3 scales its
    StatefulSet). None: a stream of one broker asked for replicas, which it grows to in place."""
    decided = body.get("status", {}).get("replicated")
    if decided is None:
        decided = spec.replicas > 1
        patch.status["replicated"] = decided
    if not decided and spec.replicas > 1:
        return None
    return bool(decided)


def migration_copied(namespace: str, name: str, spec: StreamSpec) -> list[str]:
    """The new replicas of a stream growing in place that hold the old broker's journal (in sync). Once
    ``minInSync`` of them do, a pass whose body predates the status that says so (``replicated``) must
    not make the old broker's Deployment again: it finishes instead."""
    replication = read_replication_state(state.zk, StreamPaths.of(namespace, name, chroot=state.settings.chroot))
    new = set(stream_members(name, spec, replicated=True))
    return sorted(new & set(replication.isr)) if replication is not None else []


def finish_migration(body: kopf.Body, spec: StreamSpec, group: Group, patch: kopf.Patch, *, retain: bool,
                     generation: int) -> None:  # fmt: skip
    """A stream growing replicas in place: once ``minInSync`` of the new replicas are in sync (they hold
    the old broker's journal), the old Deployment goes (its broker leaves its session: the new replicas
    elect a leader at once), and its volume too unless the stream retains data."""
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    new = set(stream_members(name, spec, replicated=True))
    copied = migration_copied(namespace, name, spec)
    if len(copied) < spec.in_sync:
        why = f"growing to {spec.replicas} replicas: {len(copied)} of them hold the journal, {spec.in_sync} needed"
        ready(body, patch, False, "Replicating", why, generation=generation)
        raise kopf.TemporaryError(why, delay=5)
    state.kube.delete("apps/v1", "Deployment", namespace, f"{name}-broker")
    if not retain:
        state.kube.delete("v1", "PersistentVolumeClaim", namespace, f"{name}-journal")
    group.set_manifest(sorted(new))
    patch.status["replicated"] = True
    kopf.info(body, reason="Replicated", message=f"{', '.join(copied)} hold the journal: the one broker is gone")
    raise kopf.TemporaryError("replicated: the new replicas elect their leader", delay=2)


def follower_lag(facts: Mapping[str, Any]) -> dict[str, int]:
    """Each follower's lag as its leader publishes it in its facts (a broker's word, in ZooKeeper:
    anything that is not a name and a number is left out)."""
    replication = facts.get("replication")
    lag = replication.get("followerLag") if isinstance(replication, dict) else None
    if not isinstance(lag, dict):
        return {}
    return {str(k)[:253]: v for k, v in list(lag.items())[:256] if isinstance(v, int) and not isinstance(v, bool)}


def fetching(facts: Mapping[str, Any]) -> frozenset[str] | None:
    """The followers that fetch, as their leader publishes it in its facts (None: it does not say;
    names only, 256 at the most)."""
    replication = facts.get("replication")
    names = replication.get("fetching") if isinstance(replication, dict) else None
    if not isinstance(names, list):
        return None
    return frozenset(str(n)[:253] for n in names[:256] if isinstance(n, str))


def held_shutdowns(members: Mapping[str, Any]) -> dict[str, str]:
    """The replicas that, asked to stop, wait because their stop would leave fewer than minInSync in
    sync, and why (their own facts, in ZooKeeper: a string each, bounded, 16 at the most)."""
    held = {}
    for name, member in list(members.items())[:256]:
        reason = member.metadata.get("shutdownHeld") if isinstance(member.metadata, dict) else None
        if isinstance(reason, str) and reason:
            held[str(name)[:253]] = reason[:300]
    return dict(sorted(held.items())[:16])


def replicated_status(body: kopf.Body, spec: StreamSpec, group: Group, patch: kopf.Patch, *, generation: int,
                      public_key: str, others: list[dict[str, Any]]) -> None:  # fmt: skip
    """A replicated stream's status: ready once minInSync replicas run and a leader serves. Who leads,
    in which epoch and with which in-sync set come from ZooKeeper's replication state (written by the
    brokers only, under the namespace's ACL); the followers' lag and the sequences are the leader's
    own facts. The endpoint is the operator's word (its Service): a client reaching a follower there
    is sent to the leader, which it finds in ZooKeeper."""
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    running = state.kube.statefulset_ready(namespace, f"{name}-broker")
    replication = read_replication_state(state.zk, StreamPaths.of(namespace, name, chroot=state.settings.chroot))
    live = group.members()
    leader = live.get(replication.leader) if replication is not None else None
    patch.status["brokerReady"] = leader is not None and running >= spec.in_sync
    metrics.stream_facts(namespace, name, ready=patch.status["brokerReady"])
    patch.status["endpoint"] = stream_endpoint(namespace, name, spec)
    if public_key:  # the operator's word (its Secret), as for a stream of one broker
        patch.status["curvePublicKey"] = public_key
    if replication is not None:
        facts = leader.metadata if leader is not None else {}
        patch.status["replication"] = {
            "leader": replication.leader if leader is not None else "",
            "epoch": replication.epoch,
            "inSync": sorted(replication.isr),
            "followerLag": replacing_map(
                ((body.get("status") or {}).get("replication") or {}).get("followerLag"), follower_lag(facts)
            ),  # a follower gone, or leading now, leaves it
            "replicasReady": running,
        }
        before = ((body.get("status") or {}).get("replication") or {}).get("shutdownHeld")
        before = before if isinstance(before, dict) else {}
        held = held_shutdowns(live)
        patch.status["replication"]["shutdownHeld"] = replacing_map(before, held)
        for member, reason in held.items():
            if member not in before:  # once a hold, not at every pass
                kopf.warn(body, reason="ShutdownHeld", message=f"{member} waits before it stops: {reason}")
        for key in ("lastSequence", "journalBytes"):
            if isinstance(facts.get(key), int):
                patch.status[key] = facts[key]
        sets = {f"{name}-broker": under_replicated(stream_members(name, spec, replicated=True), replication.isr,
                                                   follower_lag(facts), fetching(facts))}  # fmt: skip
        patch.status["replication"]["underReplicated"] = sets[f"{name}-broker"]
        sets |= {broker_name(name, e["partition"]): e["underReplicated"] for e in others if "underReplicated" in e}
        replication_condition(body, patch, sets, generation=generation)
    waiting = partitions_status(body, patch, others)
    if patch.status["brokerReady"] and waiting is None:
        ready(body, patch, True, "LeaderReady", f"{replication.leader if replication else ''} leads; {running} of "
              f"{spec.replicas} replicas run", generation=generation)  # fmt: skip
    elif patch.status["brokerReady"]:
        ready(body, patch, False, "PartitionsNotReady", str(waiting), generation=generation)
        raise kopf.TemporaryError(str(waiting), delay=5)
    else:
        if leader is not None:
            why = f"{running} of {spec.replicas} replicas ready (minInSync {spec.in_sync})"
        elif replication is not None and replication.epoch > 0:
            why = (f"no leader: only the in-sync replicas ({', '.join(sorted(replication.isr))}) may lead, and none "
                   "of them serves; it returns, or an unclean election gives up what only they hold")  # fmt: skip
        else:
            why = "no leader elected yet"
        ready(body, patch, False, "LeaderNotReady", why, generation=generation)
        raise kopf.TemporaryError(why, delay=5)


#: a roll waiting this long (for a replica to be back in sync, or blocked by minInSync) says so in an event
ROLL_PATIENCE_S = 600.0


def roll_brokers(body: kopf.Body, spec: StreamSpec, patch: kopf.Patch, partition: int = 0) -> dict[str, Any] | None:
    """One step of the data-aware roll of a replicated broker set (:mod:`zeps_operator.roll`): the pod
    to restart now is deleted (an event says which), or the roll waits (and says why in
    ``status.roll``, with an event once it has waited :data:`ROLL_PATIENCE_S`). Returns the roll's
    status entry (None once every pod runs the current template)."""
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    statefulset = broker_name(name, partition)
    revision, pods = state.kube.broker_pods(namespace, statefulset)
    if revision is None or not pods:
        return None
    replication = read_replication_state(state.zk, StreamPaths.of(namespace, name, chroot=state.settings.chroot,
                                                                   partition=partition))  # fmt: skip
    step = next_step(pods, leader=replication.leader if replication else None,
                     isr=replication.isr if replication else None, min_insync=spec.in_sync)  # fmt: skip
    if step.done:
        metrics.roll_facts(namespace, name, statefulset, blocked_s=None)
        return None
    before = (((body.get("status") or {}).get("roll") or {}).get(statefulset)) or {}
    now = time.time()
    recorded = before.get("since")
    since = float(recorded) if isinstance(recorded, (int, float)) else now
    # how long it has been blocked (the ZepsStreamRollBlocked alert): since it last moved, if blocked
    metrics.roll_facts(namespace, name, statefulset, blocked_s=max(0.0, now - since) if step.blocked else 0.0)
    uid = next((p.uid for p in pods if p.name == step.delete), "")
    if step.delete is not None and not state.kube.delete_pod(namespace, step.delete, uid):
        step = RollStep(waiting=f"{step.delete} changed since it was looked at", pending=step.pending)
    if step.delete is not None:
        kopf.info(body, reason="RollingPod", message=f"{step.delete} restarts with the new template "
                  f"({len(step.pending) - 1} more after it)")  # fmt: skip
        since = now
    elif now - since >= ROLL_PATIENCE_S and not before.get("reported"):
        kopf.warn(body, reason="RollBlocked" if step.blocked else "RollWaiting",
                  message=f"{statefulset}: waiting {int(now - since)} s: {step.waiting}")  # fmt: skip
        return {"pending": list(step.pending), "waiting": step.waiting, "blocked": step.blocked, "since": since,
                "reported": True}  # fmt: skip
    return {
        "pending": list(step.pending),
        "waiting": step.waiting or f"{step.delete} restarting",
        "blocked": step.blocked,
        "since": since,
        "reported": bool(before.get("reported")) and step.delete is None,
    }


def roll_status(body: kopf.Body, patch: kopf.Patch, rolls: dict[str, dict[str, Any] | None], *,
                generation: int) -> None:  # fmt: skip
    """``status.roll``: each broker set still rolling, what it waits for; gone once all are done. And
    the Rolling condition: True while one rolls (reason ``Blocked`` while minInSync holds one back)."""
    wanted = {k: v for k, v in rolls.items() if v is not None}
    before = (body.get("status") or {}).get("roll")
    if wanted:
        patch.status["roll"] = replacing_map(before, wanted)
    elif before is not None:
        patch.status["roll"] = None  # done: the field goes
    blocked = any(v.get("blocked") for v in wanted.values())
    message = "; ".join(f"{k}: {v.get('waiting')}" for k, v in sorted(wanted.items()))
    patch.status["conditions"] = set_condition(
        conditions_now(body, patch), "Rolling", bool(wanted), generation=generation,
        reason="Blocked" if blocked else "Rolling" if wanted else "Current",
        message=message or "every broker pod runs the current template",
    )  # fmt: skip


def broker_objects(namespace: str, name: str, spec: StreamSpec, replicated: bool | None, *, zookeeper_auth: bool
                   ) -> list[dict[str, Any]]:  # fmt: skip
    """The objects of partition 0's broker set (:func:`zeps_operator.plan.stream_objects`; a stream
    growing replicas in place, ``replicated`` None: :func:`zeps_operator.plan.migration_objects`), its
    journal claims keeping the size they have (:func:`resize_journals` grows them)."""
    if replicated is None:
        return migration_objects(namespace, name, spec, state.settings, zookeeper_auth=zookeeper_auth)
    claim_size = (state.kube.claim_size(namespace, "StatefulSet", broker_name(name)) if replicated
                  else state.kube.claim_size(namespace, "PersistentVolumeClaim", f"{name}-journal"))  # fmt: skip
    return stream_objects(namespace, name, spec, state.settings, zookeeper_auth=zookeeper_auth, replicated=replicated,
                          claim_size=claim_size)  # fmt: skip


def resize_journals(body: kopf.Body, patch: kopf.Patch, spec: StreamSpec, *, replicated: bool, generation: int
                    ) -> None:  # fmt: skip
    """Grow the stream's journal claims (every partition's, each replica's that runs) to
    ``storage.size`` in place (:mod:`zeps_operator.resize`), and say how it goes in the Resizing
    condition; a refusal (a smaller size, a StorageClass that cannot expand) also in a warning event,
    once."""
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    claims = [f"journal-{broker_name(name, p)}-{i}" for p in range(spec.partitions) if p > 0 or replicated
              for i in range(spec.replicas)]  # fmt: skip
    if not replicated:
        claims.insert(0, f"{name}-journal")
    step = plan_resize(spec.storage.size, state.kube.journal_claims(namespace, claims))
    resizing, reason, message = step.resizing, step.reason, step.message
    refused = [f"{claim}: {why}" for claim in step.grow
               if (why := state.kube.grow_claim(namespace, claim, spec.storage.size)) is not None]  # fmt: skip
    if refused:
        resizing, reason = False, "NotExpandable"
        message = f"storage.size {spec.storage.size}: the volumes cannot grow in place: {'; '.join(refused)}"
    elif step.grow:
        kopf.info(body, reason="Resizing", message=f"{', '.join(step.grow)} asked for {spec.storage.size}")
    before = next((c for c in conditions_now(body, patch) or [] if c.get("type") == "Resizing"), {})
    if reason in ("NotExpandable", "CannotShrink") and before.get("reason") != reason:
        kopf.warn(body, reason=reason, message=message)
    patch.status["conditions"] = set_condition(conditions_now(body, patch), "Resizing", resizing, reason=reason,
                                               message=message, generation=generation)  # fmt: skip


def replication_condition(body: kopf.Body, patch: kopf.Patch, sets: dict[str, list[str]], *, generation: int
                          ) -> None:  # fmt: skip
    """The UnderReplicated condition: True while a broker set has replicas outside its in-sync set,
    each named with what it does (catching up, and how far behind, or not fetching). ``sets``: each
    set's descriptions (:func:`zeps_operator.plan.under_replicated`)."""
    out = {k: v for k, v in sets.items() if v}
    caught_up = all("catching up" in d for v in out.values() for d in v)
    patch.status["conditions"] = set_condition(
        conditions_now(body, patch), "UnderReplicated", bool(out), generation=generation,
        reason=("CatchingUp" if caught_up else "ReplicasDown") if out else "AllInSync",
        message="; ".join(f"{k}: {', '.join(v)}" for k, v in sorted(out.items())) or "every replica is in sync",
    )  # fmt: skip


#: annotate a replicated ZepsStream with "true" to scale its broker sets down without waiting for
#: the replicas that stay (one that will never be in sync again): what they lack may be gone with
#: the replicas removed (their volumes stay), as Strimzi's skip-broker-scaledown-check
SKIP_SCALE_DOWN_CHECK = "zeps.dev/skip-scale-down-check"


def guarded_scale(body: kopf.Body, spec: StreamSpec, partition: int, waits: dict[str, str]) -> int:
    """The replicas a broker set keeps running beyond ``spec.replicas`` while it may not go down to
    them yet (:func:`zeps_operator.roll.scale_down`: the replicas that stay must be in sync and run
    the wanted settings, ``minInSync`` and the preferred leader, which reach them through the roll
    first), what it waits for in ``waits``; 0 once it may, or when :data:`SKIP_SCALE_DOWN_CHECK` says
    not to wait (a warning event says what was skipped)."""
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    statefulset = broker_name(name, partition)
    running = state.kube.statefulset_replicas(namespace, statefulset)
    if running is None or running <= spec.replicas:
        return 0
    replication = read_replication_state(state.zk, StreamPaths.of(namespace, name, chroot=state.settings.chroot,
                                                                   partition=partition))  # fmt: skip
    _, pods = state.kube.broker_pods(namespace, statefulset)
    config = broker_config_digest(namespace, name, spec, state.settings, replicated=True, partition=partition)
    members = surged_members(name, spec, running - spec.replicas, replicated=True, partition=partition)
    step = scale_down(running, spec.replicas, members, pods, isr=replication.isr if replication else None,
                      config=config)  # fmt: skip
    if step.waiting is None:
        return 0
    if str((body["metadata"].get("annotations") or {}).get(SKIP_SCALE_DOWN_CHECK, "")).lower() == "true":
        kopf.warn(body, reason="ScaleDownCheckSkipped", message=f"{statefulset} goes down to {spec.replicas} now "
                  f"({SKIP_SCALE_DOWN_CHECK}); it was waiting: {step.waiting}")  # fmt: skip
        return 0
    waits[statefulset] = step.waiting
    return running - spec.replicas


def scaled(body: kopf.Body, spec: StreamSpec, partition: int, waits: dict[str, str],
           moves: dict[str, dict[str, Any]]) -> int:  # fmt: skip
    """The replicas a replicated broker set runs beyond ``spec.replicas`` (its surge): one while one
    of its replicas moves (:func:`move_replica`), else those the guarded scale-down keeps
    (:func:`guarded_scale`). A surge changes only the StatefulSet's replicas and the manifest, never
    the pods' settings (made from ``spec``), so neither a move nor the wait rolls a pod."""
    return move_replica(body, spec, partition, moves) or guarded_scale(body, spec, partition, waits)


def surged_members(name: str, spec: StreamSpec, surge: int, *, replicated: bool, partition: int = 0) -> list[str]:
    """The members of a broker set running ``surge`` replicas beyond ``spec.replicas``."""
    return stream_members(name, spec.model_copy(update={"replicas": spec.replicas + surge}) if surge else spec,
                          replicated=replicated, partition=partition)  # fmt: skip


def surged(objects: list[dict[str, Any]], surge: int) -> list[dict[str, Any]]:
    """``objects`` with their StatefulSet running ``surge`` replicas more."""
    for obj in objects:
        if surge and obj["kind"] == "StatefulSet":
            obj["spec"]["replicas"] += surge
    return objects


def move_replica(body: kopf.Body, spec: StreamSpec, partition: int, moves: dict[str, dict[str, Any]]) -> int:
    """One pass of moving a replica of this broker set, if the annotation asks for one of its pods
    (:mod:`zeps_operator.moving`): what the step says is deleted now, the move's status entry goes in
    ``moves``; returns the set's surge (1 while a copy is added, rebuilt and settling)."""
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    statefulset = broker_name(name, partition)
    asked = str((meta.get("annotations") or {}).get(MOVE_ANNOTATION) or "").strip()
    if not asked or asked.rsplit("-", 1)[0] != statefulset:
        return 0
    before = (body.get("status") or {}).get("move") or {}
    if before.get("replica") != asked:
        before = {}
    running = state.kube.statefulset_replicas(namespace, statefulset) or 0
    _, pods = state.kube.broker_pods(namespace, statefulset)
    replication = read_replication_state(state.zk, StreamPaths.of(namespace, name, chroot=state.settings.chroot,
                                                                   partition=partition))  # fmt: skip
    pod = next((p for p in pods if p.name == asked), None)
    claim = state.kube.claim_identity(namespace, journal_claim(asked))
    extra = f"{statefulset}-{spec.replicas}"
    facts = MoveFacts(
        replicas=spec.replicas, running=running,
        members=surged_members(name, spec, 1, replicated=True, partition=partition),
        isr=replication.isr if replication is not None else None, min_insync=spec.in_sync,
        pod_exists=pod is not None, pod_ready=pod is not None and pod.ready,
        pod_stopping=pod is not None and pod.stopping, claim_uid=claim[0] if claim else None,
        claim_deleting=bool(claim and claim[1]), extra_pod_exists=any(p.name == extra for p in pods),
    )  # fmt: skip
    step = plan_move(asked, str(before.get("phase") or ""), str(before.get("oldClaim") or ""), facts)
    if step.delete_claim:
        state.kube.delete("v1", "PersistentVolumeClaim", namespace, step.delete_claim)
    if step.delete_pod:
        state.kube.delete_pod(namespace, step.delete_pod)
    node = pod.node if pod is not None else ""
    left = str(before.get("from") or node)
    if step.refused:
        if before.get("refused") != step.refused:
            kopf.warn(body, reason="MoveRefused", message=f"{MOVE_ANNOTATION}: {step.refused}")
        moves[statefulset] = {"replica": asked, "refused": step.refused}
    elif step.done:
        kopf.info(body, reason="ReplicaMoved", message=f"{asked} moved from node {left} to node {node or '?'}, its "
                  "copy of the stream rebuilt there")  # fmt: skip
        moves[statefulset] = {"replica": asked, "done": True}
    else:
        if step.phase != before.get("phase"):
            kopf.info(body, reason="MovingReplica", message=f"{asked}: {step.phase}, waiting for {step.waiting}")
        moves[statefulset] = {"replica": asked, "phase": step.phase, "waiting": step.waiting, "from": left,
                              "oldClaim": step.old_claim or None}  # fmt: skip
    return step.surge


def move_status(body: kopf.Body, patch: kopf.Patch, moves: dict[str, dict[str, Any]], *, generation: int) -> None:
    """``status.move`` (the move under way, or refused; gone once done or no longer asked), the
    annotation removed once the move is done, and the Reassigning condition."""
    before = (body.get("status") or {}).get("move")
    entry = next(iter(moves.values()), None)
    if entry is None and before is None and not any(c.get("type") == "Reassigning"
                                                    for c in conditions_now(body, patch) or []):  # fmt: skip
        return  # the condition appears once a move is asked
    if entry is not None and entry.get("done"):
        take_back(body, MOVE_ANNOTATION)
        entry = None
    if entry is not None:
        patch.status["move"] = replacing_map(before, entry)
    elif before is not None:
        patch.status["move"] = None
    moving = entry is not None and "phase" in entry
    refused = entry is not None and "refused" in entry
    message = "no replica is being moved"
    if entry is not None:
        message = f"{entry['replica']}: " + (f"{entry['phase']}, waiting for {entry['waiting']}" if moving
                                             else str(entry.get("refused", "")))  # fmt: skip
    patch.status["conditions"] = set_condition(
        conditions_now(body, patch), "Reassigning", moving, generation=generation,
        reason="Moving" if moving else "Refused" if refused else "Settled", message=message,
    )  # fmt: skip


def scaling_status(body: kopf.Body, patch: kopf.Patch, waits: dict[str, str], *, generation: int) -> None:
    """``status.scaling``: each broker set kept above its replicas, and what it waits for (gone once
    none is), an event when that changes, and the ScalingDown condition (there once a scale-down
    waited: True while one waits)."""
    before = (body.get("status") or {}).get("scaling")
    if waits:
        patch.status["scaling"] = replacing_map(before, waits)
        if before != waits:
            kopf.info(body, reason="ScalingDown", message="; ".join(f"{k}: {v}" for k, v in sorted(waits.items())))
    elif before is not None:
        patch.status["scaling"] = None
    if not waits and not any(c.get("type") == "ScalingDown" for c in conditions_now(body, patch) or []):
        return  # the condition appears once a scale-down waits
    patch.status["conditions"] = set_condition(
        conditions_now(body, patch), "ScalingDown", bool(waits), generation=generation,
        reason="Waiting" if waits else "Done", message="; ".join(f"{k}: {v}" for k, v in sorted(waits.items()))
        or "no broker set runs more replicas than it should",
    )  # fmt: skip


def reconcile_partition(body: kopf.Body, spec: StreamSpec, partition: int, surge: int, *, acl: list[Any] | None
                        ) -> dict[str, Any]:  # fmt: skip
    """Partition ``partition`` (1 and up) of a partitioned stream: its manifest (with the namespace's
    ``acl``), its broker set (a StatefulSet of ``spec.replicas`` and ``surge`` more: :func:`scaled`),
    and its entry in ``status.partitions`` (``ready``: a leader serves and minInSync replicas run)."""
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    zookeeper_auth = acl is not None
    paths = StreamPaths.of(namespace, name, chroot=state.settings.chroot, partition=partition)
    group = Group(state.zk, paths.brokers, acl=acl)
    members = surged_members(name, spec, surge, replicated=True, partition=partition)
    if group.manifest() != frozenset(members):
        group.set_manifest(members)
    claim_size = state.kube.claim_size(namespace, "StatefulSet", broker_name(name, partition))
    objects = stream_objects(namespace, name, spec, state.settings, zookeeper_auth=zookeeper_auth, partition=partition,
                             claim_size=claim_size)  # fmt: skip
    # its journals are the StatefulSet's claims (its retention policy)
    apply_objects(body, surged(objects, surge), retain=False)
    running = state.kube.statefulset_ready(namespace, broker_name(name, partition))
    replication = read_replication_state(state.zk, paths)
    leader = group.members().get(replication.leader) if replication is not None else None
    entry: dict[str, Any] = {
        "partition": partition,
        "endpoint": stream_endpoint(namespace, name, spec, partition),
        "ready": leader is not None and running >= spec.in_sync,
        "replicasReady": running,
    }
    facts = leader.metadata if leader is not None else {}
    if replication is not None:
        lag = follower_lag(facts)
        entry |= {"leader": replication.leader if leader is not None else "", "epoch": replication.epoch,
                  "inSync": sorted(replication.isr), "followerLag": lag,
                  "underReplicated": under_replicated(members, replication.isr, lag, fetching(facts))}  # fmt: skip
    if isinstance(facts.get("lastSequence"), int):
        entry["lastSequence"] = facts["lastSequence"]
    return entry


def partitions_status(body: kopf.Body, patch: kopf.Patch, others: list[dict[str, Any]]) -> str | None:
    """A partitioned stream's ``status.partitions`` (partition 0 from the status just made, the others
    from :func:`reconcile_partition`); why it cannot be Ready for them, or None."""
    if not others:
        return None
    replication = patch.status.get("replication")
    first: dict[str, Any] = {
        "partition": 0,
        "endpoint": patch.status.get("endpoint", ""),
        "ready": bool(patch.status.get("brokerReady")),
        "leader": replication["leader"] if replication else stream_member(body["metadata"]["name"]),
    }
    if replication:  # a replicated partition 0 is shown as the others are
        shown = ("epoch", "inSync", "followerLag", "underReplicated", "replicasReady")
        first |= {k: replication[k] for k in shown if k in replication}
    if isinstance(patch.status.get("lastSequence"), int):
        first["lastSequence"] = patch.status["lastSequence"]
    patch.status["partitions"] = [first, *others]
    waiting = [str(o["partition"]) for o in others if not o["ready"]]
    return f"partition {', '.join(waiting)} has no leader serving with minInSync replicas yet" if waiting else None


def ensure_curve(body: kopf.Body, namespace: str, name: str, spec: StreamSpec, *, replicas: Sequence[str],
                 patch: kopf.Patch) -> str:  # fmt: skip
    """The stream's CURVE keys in the namespace's Secret (made once, kept), its admitted clients set to
    ``spec.curveClients``, each client's own Secret made once (:mod:`zeps_operator.curve`), a multicast
    key if it has a multicast output, a certificate for each of ``replicas`` (the members its manifests
    name), a rotation's next step (:func:`rotate_curve`); the broker's public key."""
    planned: list[StreamKeys] = []
    clients = spec.curve_clients

    def change(data: dict[str, str]) -> dict[str, str]:
        planned.append(plan_keys(data, name, clients, make=make_certificate, multicast=spec.multicast is not None,
                                 replicas=replicas))  # fmt: skip
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
    return rotate_curve(body, namespace, name, spec, patch) or keys.public_key


def rotate_curve(body: kopf.Body, namespace: str, name: str, spec: StreamSpec, patch: kopf.Patch) -> str | None:
    """A rotation of the stream's broker key, asked by annotating it with :data:`ROTATE` (a new value
    each time), a phase a window apart (:mod:`zeps_operator.curve`; the annotation
    ``zeps.dev/curve-rotation-window-seconds`` sets the window). Each phase's writes are made once per
    pass until done (a pass that failed midway writes them again: each is a set, not a change), its
    progress in ``status.curveRotation``. Returns the broker's public key when this pass changed it."""
    annotations = body["metadata"].get("annotations") or {}
    asked = annotations.get(ROTATE)
    done = dict((body.get("status") or {}).get("curveRotation") or {})
    if not asked or (done.get("asked") == asked and done.get("phase") == "done"):
        return None
    try:
        window = max(1.0, float(annotations.get("zeps.dev/curve-rotation-window-seconds", ROTATION_WINDOW)))
    except ValueError:
        window = float(ROTATION_WINDOW)
    now = time.time()
    if done.get("asked") != asked or done.get("phase") not in ROTATION_PHASES:
        phase, since = ROTATION_PHASES[0], now
    else:
        try:  # the status is the operator's, but anyone allowed to patch it could write it: never trusted
            since = min(float(done.get("since", now)), now)
        except (TypeError, ValueError):
            since = now
        since = since if math.isfinite(since) else now
        phase = str(done["phase"])
        if now - since >= window:
            phase, since = ROTATION_PHASES[ROTATION_PHASES.index(phase) + 1], now
    written: list[dict[str, str]] = []

    def change(data: dict[str, str]) -> dict[str, str]:
        written.append(rotation_data(data, name, phase, make=make_certificate))
        return written[-1]

    state.kube.update_secret(namespace, CURVE_SECRET, change, labels={"app.kubernetes.io/managed-by": "zeps-operator"})
    files = client_rotation(written[-1], name, phase)
    for client in spec.curve_clients:
        state.kube.patch_secret_data(namespace, client_secret_name(name, client), files)
    if done.get("phase") != phase or done.get("asked") != asked:
        kopf.info(body, reason="CurveRotation", message=f"rotating the broker's CURVE key ({asked}): {phase}")
    patch.status["curveRotation"] = {"asked": asked, "phase": phase, "since": since}
    return public_key_of(written[-1][f"{name}.broker.key"]) if phase != "distributing" else None


def forget_keys_of(namespace: str, name: str) -> None:
    """A deleted stream's CURVE keys go with it (deletionPolicy Delete)."""
    state.kube.update_secret(namespace, CURVE_SECRET, lambda data: forget_keys(data, name),
                             labels={"app.kubernetes.io/managed-by": "zeps-operator"})  # fmt: skip
