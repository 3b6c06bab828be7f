"""The custom resources' typed models: the one source of the CRDs (``python -m zeps_operator.crdgen``).

Spec fields that tune SDK behaviour are built from the SDK's option models (``zeps.options``), so a
default, a bound or a description is written once. Field names are camelCase, as Kubernetes
expects. A field marked immutable gets a CEL rule (``self == oldSelf``) in the generated schema, so
the API server itself refuses to change it — no webhook.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model
from pydantic.alias_generators import to_camel

from zeps.journal import DEFAULT_MAX_PRODUCERS, DEFAULT_PRODUCER_TTL_MS
from zeps.journal.config import DEFAULT_MIN_CLEANABLE_RATIO, DEFAULT_TOMBSTONE_RETENTION_MS, Cleanup
from zeps.options import (
    DEFAULT_SEGMENT_IDLE_MS,
    SECRET_NAME_PATTERN,
    STORE_ENDPOINT_PATTERN,
    STORE_REGION_PATTERN,
    STORE_URL_PATTERN,
    BatchOptions,
    MulticastOptions,
    QueueOptions,
    TopicOptions,
)
from zeps.partitioning import MAX_PARTITIONS
from zeps.protocol.limits import DEFAULT_MAX_MESSAGE_BYTES, MAX_MESSAGE_BYTES_CEILING
from zeps.resources import GROUP, PLURALS, VERSION

#: batch consumers a Queue's status and metrics show, the furthest behind first: consumer names are
#: ZooKeeper nodes anyone with the namespace's ACL can make, so their count is not the operator's to
#: leave unbounded (a status is an object of at most 1.5 MiB in etcd; a metric's series cost memory)
BATCH_CONSUMERS_SHOWN = 20
#: most CURVE replicas of a stream, all partitions': each has a certificate in the namespace's Secret
MAX_CURVE_REPLICAS = 64
#: most replicas a partition (or a stream) has
MAX_REPLICAS = 7

__all__ = [
    "BATCH_CONSUMERS_SHOWN",
    "GROUP",
    "KINDS",
    "VERSION",
    "Condition",
    "QueueSpec",
    "ResourceKind",
    "StreamSpec",
    "TopicSpec",
]

IMMUTABLE: dict[str, Any] = {"x-zeps-immutable": True}


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")


def _from_options(options: type[BaseModel], *, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    """The option model's fields, as field definitions for create_model (defaults and bounds kept)."""
    return {name: (f.annotation, f) for name, f in options.model_fields.items() if name not in skip}


DeletionPolicy = Literal["Delete", "Retain"]
_DELETION: Any = Field(
    "Delete",
    description="What deleting the resource does to its data: Delete removes it (ZooKeeper paths, journal "
    "volume); Retain keeps it for a resource created again with the same name.",
)


class _TopicFields(_Model):
    deletion_policy: DeletionPolicy = _DELETION


TopicSpec: type[_Model] = create_model(
    "TopicSpec",
    __base__=_TopicFields,
    __doc__="Broadcast pub/sub over ZooKeeper: every live subscriber gets every message.",
    **_from_options(TopicOptions),
)


BatchSpec: type[_Model] = create_model(
    "BatchSpec", __base__=_Model, __doc__="Replayable batches (mode: batches).", **_from_options(BatchOptions)
)


class _QueueFields(_Model):
    mode: Literal["work", "batches"] = Field(
        "work", description="work: items done once each; batches: replayable batches.", json_schema_extra=IMMUTABLE
    )
    batches: BatchSpec = Field(default_factory=BatchSpec, description="Batch mode settings.")
    deletion_policy: DeletionPolicy = _DELETION


QueueSpec: type[_Model] = create_model(
    "QueueSpec",
    __base__=_QueueFields,
    __doc__="A ZooKeeper work queue with per-item locks, or a replayable batch queue.",
    **_from_options(QueueOptions),
)


class Resources(_Model):
    """Kubernetes resource requests and limits (quantities such as "500m", "256Mi")."""

    requests: dict[str, str] = Field(default_factory=lambda: {"cpu": "100m", "memory": "256Mi"})
    limits: dict[str, str] = Field(default_factory=lambda: {"memory": "1Gi"})


class Storage(_Model):
    size: str = Field("10Gi", pattern=r"^[0-9]+(Ki|Mi|Gi|Ti)$",
                      description="Journal volume size: a larger one grows each volume in place where its "
                      "StorageClass allows expansion (the Resizing condition); volumes never shrink.")  # fmt: skip
    storage_class_name: str | None = Field(
        None, description="StorageClass of the journal volume (cluster default if unset).", json_schema_extra=IMMUTABLE
    )


class Retention(_Model):
    age_seconds: int | None = Field(None, ge=1, description="Remove journal segments older than this.")
    bytes: int | None = Field(None, ge=1_048_576, description="Keep the journal under this size.")


class LocalRetention(_Model):
    """What the journal's volume keeps of a tiered stream (the rest is in the object store alone)."""

    age_seconds: int | None = Field(None, ge=1, description="Delete a local segment older than this once the store "
                                    "holds it (unset: the stream's retention.ageSeconds).")  # fmt: skip
    bytes: int | None = Field(None, ge=1_048_576, description="Keep the local journal under this size, deleting only "
                              "what the store holds (unset: the stream's retention.bytes).")  # fmt: skip


class Tiering(_Model):
    """Tiered storage: the leader uploads the journal's closed, committed segments to an object store
    and a local segment is deleted only once the store holds it; the stream's retention then applies to
    the store, localRetention to the volume. Without the store nothing is lost: the volume keeps what
    the store lacks (the zeps_broker_tier_backlog_bytes metric says how much)."""

    store_url: str = Field(..., pattern=STORE_URL_PATTERN, max_length=1024,
                           description="Where the segments go: s3://bucket/prefix (or file:///path, a volume "
                           "every replica mounts).")  # fmt: skip
    store_endpoint: str | None = Field(None, pattern=STORE_ENDPOINT_PATTERN, max_length=1024,
                                       description="s3:// only: the S3 API's URL for an S3-compatible server; unset: "
                                       "AWS S3 in the store region.")  # fmt: skip
    store_region: str | None = Field(None, pattern=STORE_REGION_PATTERN, description="s3:// only: the bucket's "
                                     "region (unset: us-east-1).")  # fmt: skip
    store_path_style: bool | None = Field(None, description="s3:// only: path-style requests (endpoint/bucket/key); "
                                          "unset: path-style exactly when an endpoint is set.")  # fmt: skip
    store_credentials_secret: str | None = Field(
        None, pattern=SECRET_NAME_PATTERN,
        description="A Secret of the stream's namespace with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY: the brokers "
        "get it as environment variables. Unset: the brokers' own environment (static keys or web identity).",
    )  # fmt: skip
    segment_idle_seconds: int = Field(
        DEFAULT_SEGMENT_IDLE_MS // 1000, ge=1, le=7 * 86400,
        description="The leader closes the journal's active segment once its newest record is this old, so a quiet "
        "stream's records reach the store within about this long (a busy one's as each segment fills).",
    )  # fmt: skip
    max_backlog_bytes: int | None = Field(
        None, ge=1_048_576,
        description="Refuse publishes (JOURNAL_FULL: clients resend once taken again) while more than this many bytes "
        "of closed segments wait for the store, before the volume itself fills up. Unset: only a full volume refuses.",
    )  # fmt: skip
    local_retention: LocalRetention = Field(default_factory=LocalRetention)


class Compaction(_Model):
    """How a stream with cleanup compact keeps each key's latest record: the broker rewrites the
    journal's closed segments on a thread of its own, one at a time, without the records a later one
    of the same key superseded. Sequences never change; a reader from the start sees each key's latest
    record, and every record of the active segment."""

    tombstone_retention_seconds: int = Field(
        DEFAULT_TOMBSTONE_RETENTION_MS // 1000, ge=0,
        description="How long a delete (a record with an empty body) is kept once compacted, so a reader that starts "
        "within it sees the delete.",
    )  # fmt: skip
    min_cleanable_ratio: float = Field(
        DEFAULT_MIN_CLEANABLE_RATIO, ge=0, le=1,
        description="The share of superseded records in the closed segments that starts a compaction pass.",
    )  # fmt: skip
    bytes_per_second: int | None = Field(
        None, ge=1_048_576,
        description="The bytes a compaction pass reads and writes a second at most, so that it leaves the disk to "
        "publishers and readers. Unset: no limit.",
    )  # fmt: skip


class Producers(_Model):
    """The broker's table of idempotent producers (exactly-once publishing)."""

    ttl_seconds: int = Field(
        DEFAULT_PRODUCER_TTL_MS // 1000,
        ge=1,
        description="Forget a producer idle this long; a client resuming it later is refused (PRODUCER_UNKNOWN).",
    )
    max: int = Field(DEFAULT_MAX_PRODUCERS, ge=1, description="Producers the broker remembers at most.")


class _MulticastFields(_Model):
    """Where the broker's pod meets the multicast network: most pod networks carry no multicast."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "self.transport != 'norm' || (!has(self.rateKbps) && !has(self.recoveryMs))",
                 "message": "rateKbps and recoveryMs are for pgm and epgm: libzmq 4.3.4 runs NORM's own congestion "
                 "control and repair window"},
            ]
        }
    )  # fmt: skip
    host_network: bool = Field(
        False,
        description="Run the broker pod on its node's network (hostNetwork), where the group's interface is. The "
        "broker's port is then taken on the node.",
    )
    networks: str | None = Field(
        None,
        description="A secondary network for the broker pod that carries multicast: the value of its "
        "k8s.v1.cni.cncf.io/networks annotation (Multus), e.g. 'multicast-net'. Name its interface in interface.",
    )


class Multicast(_MulticastFields, MulticastOptions):
    """The broker's multicast output (seed 004): each live record once to a NORM or PGM group, never
    history; receivers reconcile it with the journal. Off unless set. Its fields are the SDK's
    :class:`~zeps.options.MulticastOptions` (one source for the CRD, the broker's flags and the SDK)."""


class StreamSpec(_Model):
    """A ZEPS broker with a journal: journalled high-rate pub/sub with replay."""

    model_config = ConfigDict(
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "!has(self.minInSync) || self.minInSync <= self.replicas",
                 "message": "minInSync counts replicas (the leader included): at most replicas"},
                {"rule": f"!has(self.curve) || !self.curve || "
                 f"self.replicas * (has(self.partitions) ? self.partitions : 1) <= {MAX_CURVE_REPLICAS}",
                 "message": f"curve with replicas times partitions above {MAX_CURVE_REPLICAS}: each replica's "
                 "certificate lives in the namespace's zeps-curve Secret (1 MiB in all); use fewer partitions"},
                {"rule": "!has(self.partitions) || self.partitions == 1 || !has(self.multicast)",
                 "message": "partitions above 1 take no multicast output: receivers of a multicast group follow "
                 "one sequence"},
                {"rule": "!has(self.tiering) || !has(self.tiering.localRetention) || "
                 "!has(self.tiering.localRetention.ageSeconds) || !has(self.retention) || "
                 "!has(self.retention.ageSeconds) || "
                 "self.tiering.localRetention.ageSeconds <= self.retention.ageSeconds",
                 "message": "tiering.localRetention.ageSeconds is the volume's part of retention.ageSeconds: "
                 "at most it"},
                {"rule": "!has(self.tiering) || !has(self.tiering.localRetention) || "
                 "!has(self.tiering.localRetention.bytes) || !has(self.retention) || !has(self.retention.bytes) || "
                 "self.tiering.localRetention.bytes <= self.retention.bytes",
                 "message": "tiering.localRetention.bytes is the volume's part of retention.bytes: at most it"},
            ]
        }
    )  # fmt: skip
    replicas: int = Field(
        1,
        ge=1,
        le=MAX_REPLICAS,
        description="Brokers holding the journal. 1: one broker (a Deployment). 2 or more (3 recommended): a "
        "leader and followers (a StatefulSet, a volume each, spread across nodes); a publish is confirmed once "
        "minInSync of them hold it durably, and losing the leader's pod or node loses nothing confirmed. A stream "
        "of one broker grows replicas in place (they copy its journal); a replicated one stays a StatefulSet.",
    )
    partitions: int = Field(
        1,
        ge=1,
        le=MAX_PARTITIONS,
        description="Partitions: each a broker set of its own (replicas brokers each), with its own journal and "
        "sequences; a publish goes to its key's partition (zeps.partitioning.partition_of), so order is kept per "
        "key. Partition 0 is the stream's own broker set; partitions 1 and up run as StatefulSets "
        "<name>-broker-p<N>. May grow on a live stream (only the keys of the slots reassigned move to the new "
        "partitions), never shrink: the records of a partition taken away would be lost.",
        json_schema_extra={
            "x-kubernetes-validations": [
                {"rule": "self >= oldSelf", "message": "partitions can only grow: a partition taken away would take "
                 "its records with it; make a new stream to have fewer"},
            ]
        },
    )  # fmt: skip
    min_in_sync: int | None = Field(
        None,
        ge=1,
        le=MAX_REPLICAS,
        description="With replicas: the replicas (the leader included) that must hold a record durably before it "
        "is confirmed; with fewer in sync, publishes are refused (NOT_ENOUGH_REPLICAS). Unset: a majority.",
    )
    catch_up_megabytes_per_second: int | None = Field(
        None,
        ge=1,
        description="With replicas: MB a second the leader sends a replica that is catching up (a new one, or one "
        "back after an outage) at most, so that rebuilding it does not take the leader's disk and network from "
        "its publishers. Unset: as fast as it takes.",
    )
    image: str | None = Field(
        None,
        description="Image with zeps-broker; unset: the operator's own image (the chart's image values). Another "
        "must be on the chart's brokers.allowedImages, or the stream is not Ready (PodNotAllowed).",
    )
    resources: Resources = Field(default_factory=Resources)
    storage: Storage = Field(default_factory=Storage)
    retention: Retention = Field(default_factory=Retention)
    fsync: Literal["always", "group", "interval", "never"] = Field(
        "group",
        description="Journal fsync policy and what a machine crash may lose: always (nothing), group (default: "
        "at most 5 ms of appends), interval (at most a second), never (the OS writeback delay, about 30 s); a "
        "process crash loses nothing under any of them.",
    )
    matching: Literal["prefix", "prefix-and-regex"] = Field(
        "prefix-and-regex",
        description="Subscription patterns the broker accepts: prefix-and-regex takes key prefixes and ~regex "
        "patterns; prefix refuses a ~regex subscription with INVALID (no regular expression runs in the broker).",
    )
    producers: Producers = Field(default_factory=Producers)
    max_message_bytes: int = Field(
        DEFAULT_MAX_MESSAGE_BYTES,
        ge=1,
        le=MAX_MESSAGE_BYTES_CEILING,
        description="The largest message body the broker accepts; a larger one is refused (TOO_LARGE) and nothing of "
        "its frame is journaled. Clients refuse it before sending (they read this field).",
    )
    curve: bool = Field(
        False,
        description="Encrypt with CURVE and admit only the clients in curveClients (the broker's key pair, and each "
        "client's, in the namespace's zeps-curve Secret). Replicas share the broker's key pair and peer with "
        "certificates of their own: a leader takes a replica's fetches from that replica's key only.",
    )
    curve_clients: list[Annotated[str, Field(pattern=r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")]] = Field(
        default_factory=list,
        max_length=256,
        description="With curve: the clients admitted. Each gets a Secret <stream>-curve-<client> (client.key_secret, "
        "server.key) for its pods to mount (ZEPS_STREAM_<NAME>_CURVE_CLIENT=.../client.key_secret); a client taken "
        "off the list is cut off at once, without a broker restart.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    service_type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = Field("ClusterIP")
    port: int = Field(5555, ge=1024, le=65535, description="The broker's ZeroMQ port.")
    multicast: Multicast | None = Field(
        None,
        description="Also send each live record once to a multicast group (NORM or PGM). Most pod networks carry no "
        "multicast: set hostNetwork, or a secondary network (networks).",
    )
    tiering: Tiering | None = Field(
        None,
        description="Keep the journal in an object store too (tiered storage): the volume keeps localRetention, the "
        "store the stream's retention. Off unless set.",
    )
    cleanup: Cleanup = Field(
        "delete",
        description="What becomes of old records: delete (by retention), compact (each key's latest record is kept; "
        "a record with an empty body deletes its key), or delete,compact (both). Each replica compacts its own "
        "committed segments; tiered, the store keeps the compacted runs (uploaded again as compaction shrinks "
        "them), and compact alone keeps them whatever retention says.",
    )
    compaction: Compaction = Field(default_factory=Compaction)
    deletion_policy: DeletionPolicy = _DELETION

    @property
    def in_sync(self) -> int:
        """minInSync, or its default: a majority of the replicas."""
        return self.min_in_sync or self.replicas // 2 + 1


class Condition(_Model):
    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str
    message: str = ""
    last_transition_time: str = ""
    observed_generation: int = 0


#: A ZepsStream's brokers run as StatefulSet ``<name>-broker-p<N>`` (N up to 255, 12 characters more
#: than the name), and Kubernetes labels each of its pods with ``controller-revision-hash:
#: <StatefulSet>-<10-character hash>``, a label value of at most 63 characters: so the StatefulSet's
#: name takes at most 52 characters and the stream's 40.
MAX_STREAM_NAME = 40


class ResourceKind(BaseModel):
    """How one kind is named, printed and validated."""

    kind: str
    plural: str
    short_names: list[str]
    spec: type[BaseModel]
    #: status facts: name -> (JSON type, description); Ready condition and observedGeneration are common
    status: dict[str, tuple[str, str]]
    columns: list[tuple[str, str, str]]  #: (name, type, jsonPath) besides Ready and Age
    #: the longest name the kind takes (a CEL rule on metadata.name), when the objects made from it need one
    max_name: int | None = None


KINDS = [
    ResourceKind(
        kind="Topic",
        plural=PLURALS["Topic"],
        short_names=["zt"],
        spec=TopicSpec,
        status={
            "subscribers": ("integer", "Live subscribers."),
            "cleanerHolder": ("string", "Who runs the topic's cleaner now."),
            "zookeeper": ("string", "ZooKeeper connect string the SDK should use."),
            "zookeeperCA": (
                "string",
                "The PEM of the CA of the ZooKeeper servers' TLS certificates, when they speak TLS.",
            ),
            "path": ("string", "The topic's ZooKeeper path."),
        },
        columns=[("Subscribers", "integer", ".status.subscribers")],
    ),
    ResourceKind(
        kind="Queue",
        plural=PLURALS["Queue"],
        short_names=["zq"],
        spec=QueueSpec,
        status={
            "depth": ("integer", "Items waiting, taken ones included."),
            "inFlight": ("integer", "Items taken and not acked."),
            "deadLettered": ("integer", "Dead-lettered items."),
            "consumerLag": (
                "object",
                f"Batches each batch consumer still has to process: the {BATCH_CONSUMERS_SHOWN} furthest behind.",
            ),
            "batchConsumers": (
                "integer",
                f"Batch consumers registered (consumerLag shows at most {BATCH_CONSUMERS_SHOWN} of them).",
            ),
            "zookeeper": ("string", "ZooKeeper connect string the SDK should use."),
            "zookeeperCA": (
                "string",
                "The PEM of the CA of the ZooKeeper servers' TLS certificates, when they speak TLS.",
            ),
            "path": ("string", "The queue's ZooKeeper path."),
        },
        columns=[("Mode", "string", ".spec.mode"), ("Depth", "integer", ".status.depth")],
    ),
    ResourceKind(
        kind="ZepsStream",
        plural=PLURALS["ZepsStream"],
        short_names=["zs"],
        spec=StreamSpec,
        status={
            "endpoint": ("string", "The broker's ZeroMQ endpoint."),
            "curvePublicKey": ("string", "The broker's CURVE public key (with curve: true)."),
            "move": (
                "object",
                "The replica being moved (the annotation zeps.dev/move-replica): its phase (adding, rebuilding, "
                "settling, removing), what it waits for, the node it left, or why the move is refused.",
            ),
            "scaling": (
                "object",
                "Each broker set kept above spec.replicas while it may not go down yet, and what it waits for: "
                "the replicas that stay in sync and running the settings wanted (minInSync first).",
            ),
            "curveRotation": (
                "object",
                "The last rotation of the broker's CURVE key (the annotation zeps.dev/rotate-curve-key): the value "
                "asked, its phase (distributing, switched, done) and since when (Unix time).",
            ),
            "journalBytes": ("integer", "Journal size."),
            "lastSequence": ("integer", "Last durable sequence."),
            "brokerReady": ("boolean", "The broker is available and registered."),
            "multicast": (
                "object",
                "The broker's multicast output as receivers need it (transport, group, port, rate_kbps, "
                "recovery_ms, heartbeat_ms), as the broker publishes it in its member node.",
            ),
            "zookeeper": ("string", "ZooKeeper connect string."),
            "zookeeperCA": (
                "string",
                "The PEM of the CA of the ZooKeeper servers' TLS certificates, when they speak TLS.",
            ),
            "path": ("string", "The stream's ZooKeeper path."),
            "partitions": (
                "array",
                "With spec.partitions above 1: each partition's endpoint, leader (or broker), epoch, in-sync "
                "replicas, followers' lag, replicas out of sync (underReplicated) and last sequence, partition 0 "
                "first.",
            ),
        },
        columns=[("Endpoint", "string", ".status.endpoint"), ("Last-Seq", "integer", ".status.lastSequence")],
        max_name=MAX_STREAM_NAME,
    ),
]
