"""What the operator does for a ZepsStream (:mod:`zeps_operator.handlers` registers it with kopf): the
broker's objects (:mod:`zeps_operator.plan`), its group's manifest, its CURVE keys
(:mod:`zeps_operator.curve`), and its status from the operator's own word."""

from __future__ import annotations

import kopf

from zeps.broker.certificates import make_certificate
from zeps.coordination import Group
from zeps.paths import StreamPaths
from zeps_operator.curve import CURVE_SECRET, StreamKeys, client_secret, forget_keys, plan_keys
from zeps_operator.models import StreamSpec
from zeps_operator.plan import (
    STREAM_LABEL,
    receiver_settings,
    retains_data,
    stream_endpoint,
    stream_member,
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
    group = Group(state.zk, StreamPaths.of(namespace, name, chroot=state.settings.chroot).brokers)
    member = stream_member(name)
    if group.manifest() != frozenset({member}):
        group.set_manifest([member])
    typed = StreamSpec.model_validate(dict(spec))
    public_key = ensure_curve(body, namespace, name, typed) if typed.curve else ""
    zookeeper_auth = namespace_acl(namespace, read_after=after) is not None
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
        ready(body, patch, True, "BrokerReady", "the broker is available and registered", generation=generation)
    else:
        why = "the broker Deployment is not available" if not available else "the broker has not registered yet"
        ready(body, patch, False, "BrokerNotReady", why, generation=generation)
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
