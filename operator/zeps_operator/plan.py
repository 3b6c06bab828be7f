"""Pure planning: what should exist for a resource — ZooKeeper paths, Kubernetes objects, status.

Nothing here does I/O, so every rule is a plain function with a unit test. The kopf handlers
(:mod:`zeps_operator.handlers`) read the world, call these, apply the result through adapters.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from zeps.config import read_ca
from zeps.errors import ConfigError
from zeps.options import MulticastOptions
from zeps.paths import DEFAULT_CHROOT, paths_of
from zeps.resources import ZOOKEEPER_CLIENT_LABEL
from zeps_operator.curve import REPLICAS, REPLICAS_DIR, broker_volume, replicas_volume
from zeps_operator.models import MAX_REPLICAS, Multicast, StreamSpec
from zeps_operator.roll import CONFIG_ANNOTATION

__all__ = [
    "BROKER_DATA",
    "NAMESPACE_AUTH_SECRET",
    "PARTITION_LABEL",
    "STREAM_LABEL",
    "Settings",
    "broker_name",
    "condition",
    "migration_objects",
    "stream_member",
    "stream_objects",
    "zookeeper_layout",
]

BROKER_DATA = "/var/lib/zeps"
#: the label naming a stream on what outlives it (its journal's PVC, with deletionPolicy Retain)
STREAM_LABEL = "zeps.dev/stream"
#: the label naming a partitioned stream's partition on its broker set (partitions 1 and up)
PARTITION_LABEL = "zeps.dev/partition"
METRICS_PORT = 9102
#: how often the kubelet checks that a broker listens, for its readiness: a roll, a move or a drain
#: waits for each new broker pod to be ready before its next step (Kubernetes' default is 10 s)
READINESS_PERIOD_S = 2
#: the broker image when neither the ZepsStream nor the operator's environment names one
DEFAULT_BROKER_IMAGE = "ghcr.io/zeps-dev/zeps:0.1.0"


@dataclass(frozen=True)
class Settings:
    """The operator's own settings, from its environment (the Helm chart sets them)."""

    zookeeper: str
    chroot: str = DEFAULT_CHROOT
    cluster: str = "default"  #: names this Kubernetes cluster in spec nodes (conflicts across clusters)
    identity: str = field(default_factory=lambda: f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}")
    resync_seconds: float = 30.0
    delete_retries: int = 5  #: finalizer attempts while ZooKeeper is unreachable, then release
    #: the operator's ZooKeeper digest identity ("user:password"; a superDigest user on the servers)
    zookeeper_auth: tuple[str, str] | None = None
    #: the PEM of the CA of the ZooKeeper servers' TLS certificates ("": plain TCP): the operator, its
    #: brokers and, through each object's status, the SDK speak TLS and trust that CA alone
    zookeeper_ca: str = ""
    #: the broker image of a ZepsStream without spec.image: the operator's own (the chart sets both)
    broker_image: str = DEFAULT_BROKER_IMAGE
    broker_image_pull_policy: str = "IfNotPresent"
    #: images a ZepsStream's spec.image may name besides broker_image (the cluster admin's list, the
    #: chart's brokers.allowedImages): exact references, or a prefix ending in "*"
    allowed_images: tuple[str, ...] = ()
    #: namespaces whose streams may ask for host networking or raw sockets (multicast's hostNetwork,
    #: PGM's NET_RAW): the chart's brokers.privilegedNamespaces; every other broker pod is "restricted"
    privileged_namespaces: frozenset[str] = frozenset()
    #: the one Lease whose holder runs every Topic's cleaner: its namespace, name and duration
    cleaner_lease_namespace: str = "default"
    cleaner_lease: str = "zeps-operator-cleaner"
    cleaner_lease_seconds: int = 45
    #: each namespace's ZooKeeper quota (its nodes, the bytes of their data; 0: none), a hard limit on
    #: the chroot's ``<namespace>`` subtree: the chart's zookeeper.namespaceQuota (zeps.coordination.quota)
    namespace_quota_nodes: int = 0
    namespace_quota_bytes: int = 0

    @classmethod
    def from_env(cls) -> Settings:
        zookeeper = os.environ.get("ZEPS_ZOOKEEPER", "")
        if not zookeeper:
            raise SystemExit("ZEPS_ZOOKEEPER is not set: the operator needs the ZooKeeper connect string (host:port,…)")
        return cls(
            zookeeper=zookeeper,
            chroot=os.environ.get("ZEPS_CHROOT", DEFAULT_CHROOT),
            cluster=os.environ.get("ZEPS_CLUSTER", "default"),
            identity=os.environ.get("POD_NAME") or f"{socket.gethostname()}-{uuid.uuid4().hex[:6]}",
            resync_seconds=float(os.environ.get("ZEPS_RESYNC_SECONDS", "30")),
            delete_retries=int(os.environ.get("ZEPS_DELETE_RETRIES", "5")),
            zookeeper_auth=_auth(os.environ.get("ZEPS_ZOOKEEPER_AUTH", "")),
            zookeeper_ca=_ca(),
            broker_image=os.environ.get("ZEPS_BROKER_IMAGE") or DEFAULT_BROKER_IMAGE,
            broker_image_pull_policy=os.environ.get("ZEPS_BROKER_IMAGE_PULL_POLICY") or "IfNotPresent",
            allowed_images=_listed(os.environ.get("ZEPS_ALLOWED_BROKER_IMAGES", "")),
            privileged_namespaces=frozenset(_listed(os.environ.get("ZEPS_PRIVILEGED_NAMESPACES", ""))),
            cleaner_lease_namespace=os.environ.get("POD_NAMESPACE") or "default",
            cleaner_lease=os.environ.get("ZEPS_CLEANER_LEASE") or "zeps-operator-cleaner",
            cleaner_lease_seconds=int(os.environ.get("ZEPS_CLEANER_LEASE_SECONDS", "45")),
            namespace_quota_nodes=_count("ZEPS_NAMESPACE_QUOTA_NODES"),
            namespace_quota_bytes=_count("ZEPS_NAMESPACE_QUOTA_BYTES"),
        )


def _ca() -> str:
    """ZEPS_ZOOKEEPER_CA (a PEM file, the chart mounts the ensemble's ca.crt): read once, at start; a
    bad one stops the operator, naming it."""
    try:
        return read_ca(os.environ.get("ZEPS_ZOOKEEPER_CA", ""), source="ZEPS_ZOOKEEPER_CA")
    except ConfigError as exc:
        raise SystemExit(str(exc)) from None


def _count(variable: str) -> int:
    """A count from the environment (unset or empty: 0); anything but a whole number >= 0 stops the
    operator with the variable named."""
    value = os.environ.get(variable, "").strip() or "0"
    if not value.isdigit():
        raise SystemExit(f"{variable}={value!r}: a whole number of 0 or more (0: no limit)")
    return int(value)


def _listed(value: str) -> tuple[str, ...]:
    return tuple(item.strip() for item in value.split(",") if item.strip())


def refused_pod(namespace: str, spec: StreamSpec, settings: Settings) -> str | None:
    """Why a tenant's ZepsStream may not have the broker pods it asks for (None: it may). Each namespace
    is a tenant, the cluster admin decides (the chart's values): an image not on the allow-list, or
    host networking or raw sockets outside the namespaces opted in."""
    image = spec.image
    if (
        image
        and image != settings.broker_image
        and not any(
            image == allowed or (allowed.endswith("*") and image.startswith(allowed[:-1]))
            for allowed in settings.allowed_images
        )
    ):
        return (f"spec.image {image!r} is not among the images the cluster admin allows for brokers "
                "(the chart's brokers.allowedImages); unset it to run the operator's own image")  # fmt: skip
    multicast = spec.multicast
    if multicast is not None and namespace not in settings.privileged_namespaces:
        asked = [what for what, on in (("host networking (spec.multicast.hostNetwork)", multicast.host_network),
                                       ("raw sockets (NET_RAW, spec.multicast.transport pgm)",
                                        multicast.transport == "pgm")) if on]  # fmt: skip
        if asked:
            return (f"{' and '.join(asked)}: allowed only in namespaces the cluster admin opted in (the chart's "
                    f"brokers.privilegedNamespaces); {namespace} is not one")  # fmt: skip
    return None


def _auth(value: str) -> tuple[str, str] | None:
    if not value:
        return None
    user, sep, password = value.partition(":")
    if not sep or not user or not password:
        raise SystemExit("ZEPS_ZOOKEEPER_AUTH must look like user:password (a ZooKeeper digest identity)")
    return user, password


#: the Secret (keys ``user`` and ``password``) whose digest identity owns a namespace's subtree
NAMESPACE_AUTH_SECRET = "zeps-zookeeper-auth"


def zookeeper_layout(kind: str, namespace: str, name: str, chroot: str) -> tuple[str, list[str]]:
    """(root, children relative to it) a resource needs in ZooKeeper, as :mod:`zeps.paths` lays them out."""
    paths = paths_of(kind, namespace, name, chroot=chroot)
    return paths.root, [node.removeprefix(f"{paths.root}/") for node in paths.layout()]


def condition(
    previous: list[dict[str, Any]] | None, *, ready: bool, reason: str, message: str, generation: int
) -> list[dict[str, Any]]:
    """The conditions list with Ready set; lastTransitionTime moves only when the status changes."""
    return set_condition(previous, "Ready", ready, reason=reason, message=message, generation=generation)


def set_condition(previous: list[dict[str, Any]] | None, kind: str, status: bool, *, reason: str, message: str,
                  generation: int) -> list[dict[str, Any]]:  # fmt: skip
    """The conditions list with the condition ``kind`` set (in its place, so an unchanged list stays
    equal); its lastTransitionTime moves only when its status changes."""
    value = "True" if status else "False"
    old = next((c for c in previous or [] if c.get("type") == kind), None)
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    new = {
        "type": kind,
        "status": value,
        "reason": reason,
        "message": message[:1000],
        "lastTransitionTime": now if old is None or old.get("status") != value else old.get("lastTransitionTime", now),
        "observedGeneration": generation,
    }
    if old is None:
        return [*(previous or []), new]
    return [new if c is old else c for c in previous or []]


def under_replicated(members: list[str], isr: frozenset[str] | list[str], lag: Mapping[str, int],
                     fetching: frozenset[str] | None = None) -> list[str]:  # fmt: skip
    """What each replica of a broker set outside its in-sync set does, as its leader says: catching
    up (it fetches: ``fetching``, or all in ``lag`` from a leader that does not say; and how many
    records it lacks) or not fetching (down, or cut off)."""
    fetching = frozenset(lag) if fetching is None else fetching
    return [f"{m} catching up ({lag.get(m, 0):,} records behind)" if m in fetching else f"{m} not fetching"
            for m in members if m not in isr]  # fmt: skip


def ready_condition(conditions: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    """The Ready condition in ``conditions``, if there is one."""
    return next((c for c in conditions or [] if c.get("type") == "Ready"), None)


def ready_at(conditions: list[dict[str, Any]] | None, generation: int) -> bool:
    """Whether ``conditions`` already say Ready for ``generation``: reconciling again is then no
    transition, and posts no event (an operator restart resumes every object without a word)."""
    ready = ready_condition(conditions)
    return bool(ready and ready.get("status") == "True" and ready.get("observedGeneration") == generation)


def replacing_map(before: object, wanted: Mapping[str, Any]) -> dict[str, Any]:
    """``wanted`` as the value of a status map that was ``before``: a status patch merges maps, so a
    key ``wanted`` no longer has is set to None, which removes it (else it would stay forever)."""
    gone = [key for key in before if key not in wanted] if isinstance(before, Mapping) else []
    return {**dict.fromkeys(gone), **wanted}


def status_changes(current: Mapping[str, Any], wanted: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of ``wanted`` whose value differs from ``current``: all a status patch needs to carry.
    A resync that finds nothing new yields none, and so makes no API write."""
    return {key: value for key, value in wanted.items() if current.get(key) != value}


def retains_data(spec: dict[str, Any]) -> bool:
    """Whether deleting the resource keeps its data (``deletionPolicy: Retain``) rather than removing it."""
    return bool(spec.get("deletionPolicy", "Delete") == "Retain")


def stream_member(name: str) -> str:
    """The broker member id of a stream of one broker (a Deployment): ``<name>-0``."""
    return f"{name}-0"


def broker_name(name: str, partition: int = 0) -> str:
    """The name of the objects of a stream's broker set (Deployment or StatefulSet, ConfigMap, Service):
    ``<name>-broker``, and ``<name>-broker-p<N>`` for partition N >= 1 of a partitioned stream."""
    return f"{name}-broker" if partition == 0 else f"{name}-broker-p{partition}"


def stream_members(name: str, spec: StreamSpec, *, replicated: bool, partition: int = 0) -> list[str]:
    """The broker members a stream (or its partition ``partition``) should have: its one broker's, or
    each replica's (the StatefulSet's pods, ``<name>-broker-<i>``, register under their pod names)."""
    if not replicated and partition == 0:
        return [stream_member(name)]
    return [f"{broker_name(name, partition)}-{i}" for i in range(spec.replicas)]


def preferred_leader(name: str, spec: StreamSpec, partition: int = 0) -> str:
    """The replica that should lead a replicated stream's partition while it is in sync (the others
    give the lead back to it, after a roll or a failover): ordinal ``partition mod replicas`` of its
    set, so that the partitions' leaders spread over the sets' ordinals."""
    return f"{broker_name(name, partition)}-{partition % spec.replicas}"


#: seconds a replica asked to stop may wait for another to be back in sync, and then for its lead to
#: pass (each; ``zeps-broker --handover-timeout``): its pod's grace period covers both
HANDOVER_S = 40


def curve_members(name: str, partition: int = 0) -> list[str]:
    """Every replica a partition's StatefulSet may run, as many as a spec allows: its pods mount their
    certificates (those made), so that scaling it changes no pod template."""
    return [f"{broker_name(name, partition)}-{i}" for i in range(MAX_REPLICAS)]


def replica_service(name: str, partition: int = 0) -> str:
    """The headless Service giving each replica a DNS name (``<pod>.<service>``): followers reach their
    leader there, and clients the leader ZooKeeper names."""
    return f"{broker_name(name, partition)}-pods"


def stream_endpoint(namespace: str, name: str, spec: StreamSpec, partition: int = 0) -> str:
    """Where clients reach a stream's broker (of partition ``partition``): its Service (what the broker
    advertises, too)."""
    return f"tcp://{broker_name(name, partition)}.{namespace}.svc:{spec.port}"


def receiver_settings(multicast: Multicast) -> dict[str, Any]:
    """What a stream's multicast receivers need (``status.multicast``), from the spec: the group and
    the settings both ends share, as the broker's own (``MulticastOptions``, no interface)."""
    shared = MulticastOptions.model_fields.keys() - {"interface"}
    return MulticastOptions.model_validate(multicast.model_dump(include=shared)).model_dump(exclude={"interface"})


def _labels(name: str, partition: int = 0) -> dict[str, str]:
    """A broker set's labels (its selector too). Partition N >= 1 is instance ``<name>.pN``: no stream
    is named so (a stream's name has no dot), so no other broker set's selector takes its pods."""
    labels = {
        "app.kubernetes.io/name": "zeps-broker",
        "app.kubernetes.io/instance": name if partition == 0 else f"{name}.p{partition}",
        "app.kubernetes.io/managed-by": "zeps-operator",
    }
    if partition:
        labels |= {STREAM_LABEL: name, PARTITION_LABEL: str(partition)}
    return labels


def _multicast_pod(multicast: Multicast, template: dict[str, Any], container: dict[str, Any]) -> None:
    """Where the broker's pod meets a network that carries multicast (most pod networks do not): the
    node's own (hostNetwork) or a secondary one (a Multus annotation). PGM sends raw IP packets: its
    container runs as root with NET_RAW as its only capability (a capability added to a non-root
    container is not in its effective set)."""
    pod = template["spec"]
    if multicast.host_network:
        pod["hostNetwork"] = True
        pod["dnsPolicy"] = "ClusterFirstWithHostNet"  # the cluster's DNS still (ZooKeeper's Service)
    if multicast.networks:
        template["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"] = multicast.networks
    if multicast.transport == "pgm":
        container["securityContext"] = {
            **container["securityContext"], "runAsNonRoot": False, "runAsUser": 0,
            "capabilities": {"drop": ["ALL"], "add": ["NET_RAW"]},
        }  # fmt: skip


def config_digest(env: Mapping[str, str]) -> str:
    """A short digest of a broker's settings: equal settings, equal digest."""
    return hashlib.sha256(json.dumps(dict(env), sort_keys=True).encode()).hexdigest()[:16]


def broker_config_digest(namespace: str, name: str, spec: StreamSpec, settings: Settings, *, replicated: bool,
                         partition: int = 0) -> str:  # fmt: skip
    """The digest of the settings a broker set's pods run with (their template's CONFIG_ANNOTATION)."""
    return config_digest(_broker_env(namespace, name, spec, settings, replicated=replicated, partition=partition))


def _broker_env(namespace: str, name: str, spec: StreamSpec, settings: Settings, *, replicated: bool,
                partition: int = 0) -> dict[str, str]:  # fmt: skip
    """The broker's settings (its flags' environment variables), for its ConfigMap."""
    port = spec.port
    retention = spec.retention
    env = {
        "ZEPS_BROKER_STREAMS": name,
        "ZEPS_BROKER_DATA_DIR": BROKER_DATA,
        "ZEPS_BROKER_BIND": f"tcp://0.0.0.0:{port}",
        "ZEPS_BROKER_ADVERTISE": stream_endpoint(namespace, name, spec, partition),
        "ZEPS_BROKER_FSYNC": spec.fsync,
        "ZEPS_BROKER_MATCHING": spec.matching,
        "ZEPS_BROKER_PRODUCER_TTL": str(spec.producers.ttl_seconds),
        "ZEPS_BROKER_MAX_PRODUCERS": str(spec.producers.max),
        "ZEPS_BROKER_ZOOKEEPER": settings.zookeeper,
        **({"ZEPS_BROKER_ZOOKEEPER_CA": settings.zookeeper_ca} if settings.zookeeper_ca else {}),
        "ZEPS_BROKER_NAMESPACE": namespace,
        "ZEPS_BROKER_CHROOT": settings.chroot,
        "ZEPS_BROKER_MEMBER": stream_member(name),
        "ZEPS_BROKER_METRICS_PORT": str(METRICS_PORT),
        "ZEPS_BROKER_MAX_MESSAGE_BYTES": str(spec.max_message_bytes),
    }
    if partition:
        env["ZEPS_BROKER_PARTITION"] = str(partition)
    if replicated:  # each replica names itself and says where it is (its pod's DNS name): in the pod's env
        del env["ZEPS_BROKER_MEMBER"], env["ZEPS_BROKER_ADVERTISE"]
        env["ZEPS_BROKER_MIN_INSYNC"] = str(spec.in_sync)
        env["ZEPS_BROKER_HANDOVER_TIMEOUT"] = str(HANDOVER_S)
        env["ZEPS_BROKER_PREFERRED_LEADER"] = preferred_leader(name, spec, partition)
        if spec.catch_up_megabytes_per_second:
            env["ZEPS_BROKER_REPLICA_CATCHUP_RATE"] = str(spec.catch_up_megabytes_per_second)
    if retention.age_seconds:
        env["ZEPS_BROKER_RETENTION_MS"] = str(retention.age_seconds * 1000)
    if retention.bytes:
        env["ZEPS_BROKER_RETENTION_BYTES"] = str(retention.bytes)
    if spec.curve:
        env["ZEPS_BROKER_CURVE_SECRET_KEY"] = "/etc/zeps/curve/broker.key_secret"
        env["ZEPS_BROKER_CURVE_CLIENTS"] = "/etc/zeps/curve/clients.json"
        if spec.multicast is not None:  # anyone on the segment can send to the group: sign what the broker sends
            env["ZEPS_BROKER_MULTICAST_KEY_FILE"] = "/etc/zeps/curve/multicast.key"
        if replicated:  # replicas peer with their own certificates, beside the replicas' keys
            env["ZEPS_BROKER_CURVE_REPLICAS"] = f"{REPLICAS_DIR}/{REPLICAS}"
    if spec.cleanup != "delete":
        env["ZEPS_BROKER_CLEANUP"] = spec.cleanup
        env["ZEPS_BROKER_TOMBSTONE_RETENTION_MS"] = str(spec.compaction.tombstone_retention_seconds * 1000)
        env["ZEPS_BROKER_MIN_CLEANABLE_RATIO"] = str(spec.compaction.min_cleanable_ratio)
        if spec.compaction.bytes_per_second:
            env["ZEPS_BROKER_COMPACTION_BYTES_PER_S"] = str(spec.compaction.bytes_per_second)
    tiering = spec.tiering
    if tiering is not None:  # the store's credentials come from its Secret, in the pod (never in the ConfigMap)
        env["ZEPS_BROKER_TIER_STORE"] = tiering.store_url
        env["ZEPS_BROKER_TIER_SEGMENT_IDLE_MS"] = str(tiering.segment_idle_seconds * 1000)
        if tiering.max_backlog_bytes:
            env["ZEPS_BROKER_TIER_MAX_BACKLOG_BYTES"] = str(tiering.max_backlog_bytes)
        local = tiering.local_retention
        path_style = None if tiering.store_path_style is None else str(tiering.store_path_style).lower()
        for option, setting in (("ENDPOINT", tiering.store_endpoint), ("REGION", tiering.store_region),
                                ("PATH_STYLE", path_style)):  # fmt: skip
            if setting is not None:
                env[f"ZEPS_BROKER_TIER_STORE_{option}"] = setting
        if local.age_seconds:
            env["ZEPS_BROKER_LOCAL_RETENTION_MS"] = str(local.age_seconds * 1000)
        if local.bytes:
            env["ZEPS_BROKER_LOCAL_RETENTION_BYTES"] = str(local.bytes)
    multicast = spec.multicast
    if multicast is not None:
        env["ZEPS_BROKER_MULTICAST"] = multicast.url
        env["ZEPS_BROKER_MULTICAST_HEARTBEAT"] = str(multicast.heartbeat_ms)
        for key, value in (("INTERFACE", multicast.interface), ("RATE", multicast.rate_kbps),
                           ("RECOVERY", multicast.recovery_ms)):  # fmt: skip
            if value is not None:
                env[f"ZEPS_BROKER_MULTICAST_{key}"] = str(value)
    return env


def _store_credentials(spec: StreamSpec) -> list[dict[str, Any]]:
    """A tiered stream's store credentials, the user's Secret as the broker's environment ([] if none)."""
    secret = spec.tiering.store_credentials_secret if spec.tiering is not None else None
    return [{"secretRef": {"name": secret}}] if secret else []


def stream_objects(
    namespace: str,
    name: str,
    spec: StreamSpec,
    settings: Settings,
    *,
    zookeeper_auth: bool = False,
    replicated: bool = False,
    partition: int = 0,
    claim_size: str | None = None,
) -> list[dict[str, Any]]:
    """ConfigMap, PersistentVolumeClaim, Deployment and Service of a ZepsStream's broker — or, for a
    replicated stream, ConfigMap, StatefulSet, Service, headless Service and PodDisruptionBudget.
    ``spec`` is the typed spec (defaults come from the model, never from here). ``zookeeper_auth``: the
    namespace has ZooKeeper credentials (its zeps-zookeeper-auth Secret): the broker registers with
    them, and its member node gets their ACL. A journal's PVC carries a label naming the stream
    (``zeps.dev/stream``): with ``deletionPolicy: Retain`` it has no owner, outlives the stream, and a
    stream made again with the same name takes it over (the handlers decide ownership; a StatefulSet's
    PVCs by its retention policy). ``partition`` N >= 1: the broker set of that partition of a
    partitioned stream, always a StatefulSet (``<name>-broker-p<N>``). ``claim_size``: the size its
    journal claims (or the StatefulSet's claim template) have now, kept (``storage.size`` when new)."""
    replicated = replicated or partition > 0
    labels = _labels(name, partition)
    port = spec.port
    service_name = broker_name(name, partition)
    env = _broker_env(namespace, name, spec, settings, replicated=replicated, partition=partition)
    multicast = spec.multicast
    storage = spec.storage
    pvc: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": f"{name}-journal", "namespace": namespace, "labels": {**labels, STREAM_LABEL: name}},
        # the claims' size as they exist, if they do: a StatefulSet's claim template never changes, and
        # a claim grows by a resize of its own (zeps_operator.streams.resize_journals), never by apply
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": claim_size or storage.size}}},
    }
    if storage.storage_class_name:
        pvc["spec"]["storageClassName"] = storage.storage_class_name
    volumes: list[dict[str, Any]] = [
        {"name": "journal", "persistentVolumeClaim": {"claimName": f"{name}-journal"}},
        {"name": "tmp", "emptyDir": {}},
    ]
    mounts: list[dict[str, Any]] = [{"name": "journal", "mountPath": BROKER_DATA}, {"name": "tmp", "mountPath": "/tmp"}]
    if spec.curve:
        volumes.append(broker_volume(name, multicast=spec.multicast is not None))
        mounts.append({"name": "curve", "mountPath": "/etc/zeps/curve", "readOnly": True})
        if replicated:
            volumes.append(replicas_volume(name, curve_members(name, partition)))
            mounts.append({"name": "curve-replicas", "mountPath": REPLICAS_DIR, "readOnly": True})
    pod_env: list[dict[str, Any]] = [
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        # metrics on the pod's address only (Prometheus scrapes it there): with host networking, 0.0.0.0
        # would serve them on every address of the node
        {"name": "ZEPS_BROKER_METRICS_ADDRESS", "value": "$(POD_IP)"},
    ]
    if replicated:  # a replica advertises its pod's IP, not a DNS name: finding a new leader then needs
        # no DNS lookup, which a node's loss slows down (a CoreDNS pod on it stays in the kube-dns Service
        # until the node is marked NotReady, 40 s by default; kind showed 45 s pauses so)
        pod_env += [
            {"name": "ZEPS_BROKER_MEMBER", "value": "$(POD_NAME)"},
            {"name": "ZEPS_BROKER_ADVERTISE", "value": f"tcp://$(POD_IP):{port}"},
        ]
    if zookeeper_auth:  # the namespace's ZooKeeper identity, straight from its Secret (never in the ConfigMap)
        pod_env += [{"name": f"ZEPS_BROKER_ZOOKEEPER_{key.upper()}",
                     "valueFrom": {"secretKeyRef": {"name": NAMESPACE_AUTH_SECRET, "key": key}}}
                    for key in ("user", "password")]  # fmt: skip
    probe = {"tcpSocket": {"port": "zeps"}}
    resources = spec.resources
    container = {
        "name": "broker",
        "image": spec.image or settings.broker_image,
        "imagePullPolicy": settings.broker_image_pull_policy,
        "command": ["zeps-broker"],
        "envFrom": [{"configMapRef": {"name": service_name}}, *_store_credentials(spec)],
        "env": pod_env,
        "ports": [{"name": "zeps", "containerPort": port}, {"name": "metrics", "containerPort": METRICS_PORT}],
        "volumeMounts": mounts,
        "readinessProbe": {**probe, "initialDelaySeconds": 1, "periodSeconds": READINESS_PERIOD_S},
        "livenessProbe": {**probe, "initialDelaySeconds": 10, "periodSeconds": 10, "failureThreshold": 6},
        "resources": {"requests": dict(resources.requests), "limits": dict(resources.limits)},
        "securityContext": {
            "runAsNonRoot": True,
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    pod: dict[str, Any] = {
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 10001,
            "fsGroup": 10001,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": volumes,
    }
    if replicated:  # a replica asked to stop may wait for another to be in sync, then hands over
        pod["terminationGracePeriodSeconds"] = 2 * HANDOVER_S + 10
    # plain prometheus.io annotations, for a Prometheus without the operator's PodMonitor CRD (the chart
    # ships a PodMonitor for brokers where it exists: charts/zeps/templates/monitoring.yaml)
    scrape = {"prometheus.io/scrape": "true", "prometheus.io/port": str(METRICS_PORT), "prometheus.io/path": "/metrics"}
    # the pods' labels: the selector's, and the one the chart's NetworkPolicy for ZooKeeper admits (never in
    # a selector: a selector cannot change once its set exists)
    pod_labels = {**labels, ZOOKEEPER_CLIENT_LABEL: "true"}
    template: dict[str, Any] = {"metadata": {"labels": pod_labels, "annotations": scrape}, "spec": pod}
    if multicast is not None:
        _multicast_pod(multicast, template, container)
    config_map = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": service_name, "namespace": namespace, "labels": labels},
        "data": env,
    }
    # the pods read their settings from the ConfigMap once, as they start: a change of them changes the
    # template, so the brokers restart with it (one at a time for replicas: zeps_operator.roll)
    template["metadata"]["annotations"][CONFIG_ANNOTATION] = config_digest(env)
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": service_name, "namespace": namespace, "labels": labels},
        "spec": {
            "type": spec.service_type,
            "selector": labels,
            "ports": [{"name": "zeps", "port": port, "targetPort": "zeps"}],
        },
    }
    if replicated:
        volumes.remove(volumes[0])  # each replica's journal comes from the StatefulSet's claim template
        statefulset = _statefulset(namespace, name, spec, template, pvc, labels=labels, partition=partition)
        return [config_map, statefulset, service, *_replica_objects(namespace, name, spec, labels, partition)]
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": f"{name}-broker", "namespace": namespace, "labels": labels},
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},  # one writer per journal: never two brokers at once
            "selector": {"matchLabels": labels},
            "template": template,
        },
    }
    return [config_map, pvc, deployment, service]


def migration_objects(
    namespace: str, name: str, spec: StreamSpec, settings: Settings, *, zookeeper_auth: bool = False
) -> list[dict[str, Any]]:
    """A stream of one broker growing to ``spec.replicas``: the replicated stream's objects, plus its old
    Deployment and volume, whose broker now runs as the first replica (member ``<name>-0``, in-sync
    set of one, advertising its pod's address) until the replicas have copied its journal. The
    handlers then delete the Deployment (:func:`zeps_operator.streams.reconcile_stream`)."""
    replicated = stream_objects(namespace, name, spec, settings, zookeeper_auth=zookeeper_auth, replicated=True)
    single = stream_objects(namespace, name, spec, settings, zookeeper_auth=zookeeper_auth)
    old = [o for o in single if o["kind"] in ("PersistentVolumeClaim", "Deployment")]
    deployment = next(o for o in old if o["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["env"] = [
        *container["env"],
        {"name": "ZEPS_BROKER_MEMBER", "value": stream_member(name)},
        {"name": "ZEPS_BROKER_ADVERTISE", "value": f"tcp://$(POD_IP):{spec.port}"},
        {"name": "ZEPS_BROKER_MIN_INSYNC", "value": "1"},
    ]  # the pod's env goes over the (replicated) ConfigMap's
    if spec.curve:  # it peers as the first replica: its certificate, and the replicas' keys
        pod = deployment["spec"]["template"]["spec"]
        pod["volumes"].append(replicas_volume(name, [stream_member(name)]))
        container["volumeMounts"].append({"name": "curve-replicas", "mountPath": REPLICAS_DIR, "readOnly": True})
    return [*replicated, *old]


def _statefulset(namespace: str, name: str, spec: StreamSpec, template: dict[str, Any], pvc: dict[str, Any], *,
                 labels: dict[str, str], partition: int = 0) -> dict[str, Any]:  # fmt: skip
    """A replicated stream's brokers: one pod and one journal volume per replica, started together (the
    election orders them, not the StatefulSet), spread across nodes (and zones, where nodes have zone
    labels). Its volumes outlive it with deletionPolicy Retain (the StatefulSet's retention policy),
    and go with it otherwise. ``labels``: the set's selector."""
    spread = {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway",
              "labelSelector": {"matchLabels": labels}}  # fmt: skip
    # zones by anti-affinity, not a second spread constraint: the scheduler's spread scoring skips every
    # node that lacks one of its keys, so a cluster without zone labels (kind, bare metal) would lose
    # the spread across nodes too
    anti = [{"weight": weight, "podAffinityTerm": {"topologyKey": key, "labelSelector": {"matchLabels": labels}}}
            for weight, key in ((100, "kubernetes.io/hostname"), (50, "topology.kubernetes.io/zone"))]  # fmt: skip
    pod = {**template["spec"], "topologySpreadConstraints": [spread],
           "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": anti}}}  # fmt: skip
    claim = {"metadata": {"name": "journal", "labels": pvc["metadata"]["labels"]}, "spec": pvc["spec"]}
    retain = "Retain" if spec.deletion_policy == "Retain" else "Delete"
    return {
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": {"name": broker_name(name, partition), "namespace": namespace, "labels": labels},
        "spec": {
            "replicas": spec.replicas,
            "serviceName": replica_service(name, partition),
            "podManagementPolicy": "Parallel",
            # a new template restarts no pod by itself: the operator rolls them, one at a time, in the
            # order zeps_operator.roll decides (followers first, never below minInSync in sync)
            "updateStrategy": {"type": "OnDelete"},
            "selector": {"matchLabels": labels},
            "template": {**template, "spec": pod},
            "volumeClaimTemplates": [claim],
            "persistentVolumeClaimRetentionPolicy": {"whenDeleted": retain, "whenScaled": "Retain"},
        },
    }


def _replica_objects(namespace: str, name: str, spec: StreamSpec, labels: dict[str, str], partition: int = 0
                     ) -> list[dict[str, Any]]:  # fmt: skip
    """The headless Service naming each replica, and a PodDisruptionBudget letting voluntary
    disruptions (a node drain, an eviction) take one replica at a time: never ``minAvailable`` equal to
    the replicas (with minInSync equal to them, that blocked every drain for good)."""
    headless = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": replica_service(name, partition), "namespace": namespace, "labels": labels},
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": labels,
                 "ports": [{"name": "zeps", "port": spec.port, "targetPort": "zeps"}]},
    }  # fmt: skip
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": broker_name(name, partition), "namespace": namespace, "labels": labels},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": labels}},
    }
    return [headless, budget]
