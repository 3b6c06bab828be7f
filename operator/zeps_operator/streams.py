"""What the operator does for a ZepsStream (:mod:`zeps_operator.handlers` registers it with kopf): the
broker's objects (:mod:`zeps_operator.plan`), its group's manifest, its CURVE keys
(:mod:`zeps_operator.curve`), and its status from the operator's own word."""

from __future__ import annotations

import kopf

from zeps.broker.certificates import make_certificate
from zeps.coordination import Group
from zeps.coordination.replication import read_replication_state
from zeps.paths import StreamPaths
from zeps_operator.curve import CURVE_SECRET, StreamKeys, client_secret, forget_keys, plan_keys
from zeps_operator.models import StreamSpec
from zeps_operator.plan import (
    STREAM_LABEL,
    receiver_settings,
    retains_data,
    stream_endpoint,
    stream_member,
    stream_members,
    stream_objects,
)
from zeps_operator.reconcile import namespace_acl, read_after, ready, reconcile
from zeps_operator.state import state


# -- ZepsStream ----------------------------------------------------------------------------------
def reconcile_stream(body: kopf.Body, spec: kopf.Spec, patch: kopf.Patch, reason: kopf.Reason | None) -> None:
    """One pass over a ZepsStream (a change, a resume, or its timer: ``reason`` None): the common
    path, the manifest, CURVE keys, the broker's objects, and its status."""
    generation = body["metadata"].get("generation", 1)
    after = read_after(body, reason)  # kopf names the cause of a change (create, update, resume); a timer none
    if reconcile("ZepsStream", body, spec, patch, quiet=True, read_after=after) != "ok":
        return
    meta = body["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    paths = StreamPaths.of(namespace, name, chroot=state.settings.chroot)
    group = Group(state.zk, paths.brokers)
    typed = StreamSpec.model_validate(dict(spec))
    replicated = replication_mode(body, typed, patch)
    if replicated is None:
        ready(body, patch, False, "ReplicasNotChangeable", "this stream was created with one broker (a Deployment) "
              "and cannot be replicated in place yet: its journal would have to move. Create a stream with "
              "replicas >= 2 (or set replicas back to 1)", generation=generation)  # fmt: skip
        return
    members = stream_members(name, typed, replicated=replicated)
    if group.manifest() != frozenset(members):
        group.set_manifest(members)
    public_key = ensure_curve(body, namespace, name, typed) if typed.curve else ""
    zookeeper_auth = namespace_acl(namespace, read_after=after) is not None
    retain = retains_data(dict(spec))
    for obj in stream_objects(namespace, name, typed, state.settings, zookeeper_auth=zookeeper_auth,
                              replicated=replicated):  # fmt: skip
        if not (retain and obj["kind"] == "PersistentVolumeClaim"):  # a retained journal outlives the stream
            kopf.adopt(obj, owner=body)
        state.kube.apply(obj)
    if replicated:
        replicated_status(body, typed, group, patch, generation=generation)
        return
    member = stream_member(name)
    available = state.kube.deployment_available(namespace, f"{name}-broker")
    live = group.members()
    registered = member in live
    patch.status["brokerReady"] = available and registered
    if registered:
        # where clients connect and whose key they trust: the operator's own word (its Service, its
        # Secret), never what a member node in ZooKeeper says; the broker's live facts are only facts
        patch.status["endpoint"] = stream_endpoint(namespace, name, typed)
        patch.status["curvePublicKey"] = public_key
        if typed.multicast is not None:
            patch.status["multicast"] = receiver_settings(typed.multicast)
        facts = live[member].metadata
        for key in ("lastSequence", "journalBytes"):
            if isinstance(facts.get(key), int):
                patch.status[key] = facts[key]
    if available and registered:
        ready(body, patch, True, "BrokerReady", "the broker is available and registered", generation=generation)
    else:
        why = "the broker Deployment is not available" if not available else "the broker has not registered yet"
        ready(body, patch, False, "BrokerNotReady", why, generation=generation)
        raise kopf.TemporaryError(why, delay=5)


def replication_mode(body: kopf.Body, spec: StreamSpec, patch: kopf.Patch) -> bool | None:
    """Whether the stream runs replicated (a StatefulSet), decided at its first reconcile and kept in
    ``status.replicated``: a replicated stream stays one at any replicas (3 -> 1 -> 3 scales its
    StatefulSet). None: a stream of one broker asked to replicate, which is not done in place."""
    decided = body.get("status", {}).get("replicated")
    if decided is None:
        decided = spec.replicas > 1
        patch.status["replicated"] = decided
    if not decided and spec.replicas > 1:
        return None
    return bool(decided)


def replicated_status(body: kopf.Body, spec: StreamSpec, group: Group, patch: kopf.Patch, *, generation: int) -> None:
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
    patch.status["endpoint"] = stream_endpoint(namespace, name, spec)
    if replication is not None:
        facts = leader.metadata if leader is not None else {}
        lag = facts.get("replication", {}).get("followerLag", {})
        patch.status["replication"] = {
            "leader": replication.leader if leader is not None else "",
            "epoch": replication.epoch,
            "inSync": sorted(replication.isr),
            "followerLag": {k: v for k, v in lag.items() if isinstance(v, int)} if isinstance(lag, dict) else {},
            "replicasReady": running,
        }
        for key in ("lastSequence", "journalBytes"):
            if isinstance(facts.get(key), int):
                patch.status[key] = facts[key]
    if patch.status["brokerReady"]:
        ready(body, patch, True, "LeaderReady", f"{replication.leader if replication else ''} leads; {running} of "
              f"{spec.replicas} replicas run", generation=generation)  # fmt: skip
    else:
        why = (f"{running} of {spec.replicas} replicas ready (minInSync {spec.in_sync})" if leader is not None
               else "no leader elected yet")  # fmt: skip
        ready(body, patch, False, "LeaderNotReady", why, generation=generation)
        raise kopf.TemporaryError(why, delay=5)


def ensure_curve(body: kopf.Body, namespace: str, name: str, spec: StreamSpec) -> str:
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


def forget_keys_of(namespace: str, name: str) -> None:
    """A deleted stream's CURVE keys go with it (deletionPolicy Delete)."""
    state.kube.update_secret(namespace, CURVE_SECRET, lambda data: forget_keys(data, name),
                             labels={"app.kubernetes.io/managed-by": "zeps-operator"})  # fmt: skip
