"""Tunable behaviour of the primitives, with their defaults and bounds: one source of truth.

The SDK validates these when a handle is made; the operator's CRD models reuse the same fields, so
a default or a bound is written once. Invalid values raise :class:`zeps.errors.ConfigError` naming
the field.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from zeps.errors import ConfigError

__all__ = ["BatchOptions", "FullQueuePolicy", "MulticastOptions", "MulticastTransport", "QueueOptions", "TopicOptions"]

FullQueuePolicy = Literal["block", "drop-oldest", "fail"]


class _Options(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    @classmethod
    def make(cls, **values: Any) -> Self:
        """Build from keyword arguments; a bad value raises ConfigError naming the field and its bound."""
        try:
            return cls(**values)
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in exc.errors())
            raise ConfigError(f"invalid {cls.__name__}: {problems}") from None

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> Self:
        """From a resource's spec (camelCase fields, as the CRD has them); fields this model does not
        have are skipped (a Queue's spec also holds the Queue's own fields)."""
        snake = {re.sub(r"(?<!^)(?=[A-Z])", "_", k).lower(): v for k, v in spec.items()}
        return cls.make(**{k: v for k, v in snake.items() if k in cls.model_fields})


class TopicOptions(_Options):
    """How a Topic publishes, delivers and cleans up (the zkms design, with bounds)."""

    max_queue_depth: int = Field(10_000, ge=1, le=1_000_000, description="Messages a subscriber queue may hold.")
    full_queue_policy: FullQueuePolicy = Field(
        "block",
        description="What a publisher does when a subscriber queue is full: wait up to block_timeout "
        "(block), delete that queue's oldest messages (drop-oldest), or raise QueueFullError (fail).",
    )
    block_timeout: float = Field(30.0, gt=0, le=3600, description="Seconds a publisher waits on a full queue.")
    no_subscribers: Literal["error", "ignore"] = Field(
        "error",
        description="Publishing with no subscriber raises NoSubscribersError (error) or succeeds (ignore).",
    )
    max_attempts: int = Field(5, ge=1, le=1000, description="Callback attempts per message before giving up.")
    on_give_up: Literal["drop", "keep"] = Field(
        "drop",
        description="After max_attempts: log and delete the message (drop), or move it to the topic's "
        "parked/<consumer> subtree for inspection (keep).",
    )
    retry_backoff: float = Field(0.1, gt=0, le=60, description="First retry delay in seconds; doubles, capped at 5 s.")
    batch_size: int = Field(200, ge=1, le=5000, description="Messages a subscriber reads and deletes per batch.")
    cleaner_interval: float = Field(30.0, gt=0, le=86400, description="Seconds between cleaner passes.")
    cleaner_grace: float = Field(
        60.0,
        ge=0,
        le=86400,
        description="Seconds a queue survives after its client vanished, so a subscriber that restarts or "
        "whose session expired keeps its messages.",
    )
    max_messages_per_node: int = Field(
        100,
        ge=1,
        le=1000,
        description="A publish batch is packed into one node per subscriber, up to this many messages: far "
        "fewer ZooKeeper operations. A consumer that crashes mid-node sees that node's messages again, so this "
        "bounds redelivery. 1 stores one node per message, as the zkms design does.",
    )
    max_transaction_bytes: int = Field(
        512 * 1024,
        ge=4096,
        le=1_000_000,
        description="Bytes per ZooKeeper transaction; must stay under the server's jute.maxbuffer (1 MiB).",
    )
    max_async_pending: int = Field(
        10_000,
        ge=1,
        le=1_000_000,
        description="Messages publish_async may hold before they are durable; one more waits up to block_timeout "
        "for room, then raises QueueFullError (a publisher faster than ZooKeeper is held back, not buffered "
        "without bound).",
    )


class QueueOptions(_Options):
    """How a work Queue hands out items."""

    max_attempts: int = Field(
        5, ge=1, le=1000, description="Takes of one item (crashes and releases count) before it is dead-lettered."
    )
    dead_letter: bool = Field(
        True,
        description="Move an item taken max_attempts times without an ack aside (to dead/, for inspection and "
        "redrive). false: it stays in the queue and is taken again, however often (an unreadable item is "
        "still moved aside: nobody can process it).",
    )
    default_priority: int = Field(100, ge=0, le=999, description="Priority of put() without one; lower runs first.")
    max_transaction_bytes: int = Field(
        512 * 1024,
        ge=4096,
        le=1_000_000,
        description="Bytes per ZooKeeper transaction (put_all, prefetch, batch acks); under jute.maxbuffer (1 MiB).",
    )
    max_item_bytes: int = Field(
        256 * 1024, ge=1, le=900_000, description="Largest item body; bigger work belongs in a batch store."
    )


#: an object store's settings, the same for a Queue's batch store and a stream's tiered storage
STORE_URL_PATTERN = r"^(file:///|s3://[a-z0-9])"
STORE_ENDPOINT_PATTERN = r"^https?://"
STORE_REGION_PATTERN = r"^[a-z0-9-]{1,32}$"
SECRET_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
#: a tiered stream's active segment is closed once its newest record is this old (10 minutes)
DEFAULT_SEGMENT_IDLE_MS = 600_000


class BatchOptions(_Options):
    """How a replayable batch Queue stores batches."""

    inline_max_bytes: int = Field(
        256 * 1024,
        ge=0,
        le=900_000,
        description="Batches up to this size are stored in ZooKeeper; larger ones go to the batch store.",
    )
    store_url: str | None = Field(
        None,
        pattern=STORE_URL_PATTERN,
        max_length=1024,
        description="Where large batches go: file:///path (a local or mounted directory, e.g. a PVC: one node "
        "reads it) or s3://bucket/prefix (S3-compatible object storage: every node reads it).",
    )
    store_endpoint: str | None = Field(
        None,
        pattern=STORE_ENDPOINT_PATTERN,
        max_length=1024,
        description="s3:// only: the S3 API's URL for an S3-compatible server (http://seaweedfs.storage:8333); "
        "unset: AWS S3 in the store region.",
    )
    store_region: str | None = Field(
        None,
        pattern=STORE_REGION_PATTERN,
        description="s3:// only: the bucket's region (unset: AWS_REGION, else us-east-1).",
    )
    store_path_style: bool | None = Field(
        None,
        description="s3:// only: path-style requests (endpoint/bucket/key) instead of virtual-hosted ones "
        "(bucket.endpoint/key); unset: path-style exactly when an endpoint is set.",
    )
    store_credentials_secret: str | None = Field(
        None,
        pattern=SECRET_NAME_PATTERN,
        description="s3:// only: a Secret in the Queue's namespace with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY. "
        "With no credentials in its environment, zeps.batches() reads it (its ServiceAccount needs get on it); Spark "
        "executors, which have no Kubernetes access, mount it with envFrom. Unset: the environment's credentials "
        "(static keys or web identity).",
    )
    retention_seconds: float = Field(
        7 * 86400, ge=0, description="Batches older than this that every consumer has processed may be removed."
    )
    read_ahead: int = Field(
        2,
        ge=0,
        le=16,
        description="Batches a consumer reads ahead of its handler, in threads, to hide a store's latency: at "
        "most this many batches more in memory (0: one at a time).",
    )


MulticastTransport = Literal["norm", "pgm", "epgm"]
DEFAULT_PGM_RATE_KBPS = 100_000  #: OpenPGM's transmit rate limit when unset (libzmq's own default is 100 kbit/s)
DEFAULT_PGM_RECOVERY_MS = 10_000  #: how long OpenPGM can still repair a lost packet when unset


class MulticastOptions(_Options):
    """A ZepsStream's multicast output (seed 004): each live record sent once to a multicast group,
    never history. Receivers reconcile it with the journal through an ordinary peering."""

    transport: MulticastTransport = Field(
        description="norm (NORM over UDP, NACK-based repair, TCP-friendly congestion control), pgm (PGM over raw "
        "IP: the broker needs CAP_NET_RAW) or epgm (PGM encapsulated in UDP)."
    )
    group: str = Field(
        pattern=r"^2(2[4-9]|3[0-9])\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}$",
        description="IPv4 multicast group address (224.0.0.0-239.255.255.255; 239.0.0.0/8 is for use within an "
        "organisation).",
    )
    port: int = Field(ge=1024, le=65535, description="The group's UDP port (PGM: its data-destination port).")
    interface: str | None = Field(
        None,
        description="The broker's interface for the group: a name (eth0) or one of its IPv4 addresses; unset: the "
        "one its route to the group goes out of.",
    )
    rate_kbps: int | None = Field(
        None,
        ge=64,
        le=10_000_000,
        description=f"pgm/epgm: transmit rate limit in kbit/s, repairs included (unset: {DEFAULT_PGM_RATE_KBPS:,}). "
        "Not for norm: libzmq 4.3.4 runs NORM's own congestion control and takes no rate.",
    )
    recovery_ms: int | None = Field(
        None,
        ge=100,
        le=600_000,
        description=f"pgm/epgm: how long a lost packet can still be repaired, ms (unset: {DEFAULT_PGM_RECOVERY_MS:,}); "
        "later losses are filled by the receivers from the journal. Not for norm.",
    )
    heartbeat_ms: int = Field(
        100,
        ge=20,
        le=60_000,
        description="A stream that sent nothing to the group this long sends TAIL (its last sequence), so receivers "
        "learn of lost records even when nothing follows them. Keep it short with norm: a NORM receiver that joins "
        "a quiet group does not sync with libzmq 4.3.4 (seen here at 500 ms, not at 100).",
    )

    @field_validator("group")
    @classmethod
    def _multicast_group(cls, group: str) -> str:
        try:
            if ipaddress.IPv4Address(group).is_multicast:
                return group
        except ValueError:
            pass
        raise ValueError(f"{group!r} is not an IPv4 multicast address (224.0.0.0-239.255.255.255)")

    @model_validator(mode="after")
    def _pgm_only(self) -> Self:
        if self.transport == "norm" and (self.rate_kbps is not None or self.recovery_ms is not None):
            raise ValueError("rate_kbps and recovery_ms are for pgm/epgm: libzmq 4.3.4 runs NORM's own congestion "
                             "control and repair window; leave them unset with norm")  # fmt: skip
        return self

    @property
    def url(self) -> str:
        """``transport://group:port``: what the broker publishes in its member node and receivers take."""
        return f"{self.transport}://{self.group}:{self.port}"

    @classmethod
    def from_url(cls, url: str, **settings: Any) -> MulticastOptions:
        """Parse ``transport://group:port`` (ConfigError naming the form when it is not one)."""
        transport, sep, rest = url.partition("://")
        group, colon, port = rest.rpartition(":")
        if not (sep and colon and port.isdigit()):
            raise ConfigError(f"multicast {url!r} is not transport://group:port (e.g. epgm://239.192.0.1:5601)")
        return cls.make(transport=transport, group=group, port=int(port), **settings)
