"""Tunable behaviour of the primitives, with their defaults and bounds: one source of truth.

The SDK validates these when a handle is made; the operator's CRD models reuse the same fields, so
a default or a bound is written once. Invalid values raise :class:`zeps.errors.ConfigError` naming
the field.
"""

from __future__ import annotations

from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from zeps.errors import ConfigError

__all__ = ["BatchOptions", "FullQueuePolicy", "QueueOptions", "TopicOptions"]

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


class BatchOptions(_Options):
    """How a replayable batch Queue stores batches."""

    inline_max_bytes: int = Field(
        256 * 1024,
        ge=0,
        le=900_000,
        description="Batches up to this size are stored in ZooKeeper; larger ones go to the batch store.",
    )
    store_url: str | None = Field(
        None, description="Where large batches go: file:///path (a local or mounted directory, e.g. a PVC)."
    )
    retention_seconds: float = Field(
        7 * 86400, ge=0, description="Batches older than this that every consumer has processed may be removed."
    )
