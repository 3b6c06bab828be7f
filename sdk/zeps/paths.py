"""Every ZooKeeper path zeps uses, in one place, with the layout's format version.

Layout version 1 (one chroot per installation, one subtree per Kubernetes namespace, which is the
ACL boundary, and one subtree per resource)::

    <chroot>/<ns>/topics/<name>/
        spec                          operator-owned JSON of the reconciled spec
        clients/<consumer>            ephemeral: a live SDK client of this topic (the zkms design's /clients)
        subscribers/<consumer>        ephemeral JSON metadata: a live subscription
        messages/<consumer>/m-…       persistent-sequential, one per message per subscriber queue
        cleaner/                      leader election: exactly one cleaner at a time
    <chroot>/<ns>/queues/<name>/
        spec                          operator-owned JSON of the reconciled spec
        items/i-<prio>-<id>-<seq>     persistent-sequential work items (data: envelope)
        taken/<item>                  ephemeral lock of one item; data = owner id
        waiters/w-<owner>-<seq>       ephemeral-sequential: idle workers in line (herd-free wait)
        workers/<owner>               ephemeral: live workers (each takes its own stripe of items)
        dead/<item>                   dead-lettered items, inspectable and re-drivable
        batches/latest                the latest batch id "<name>-<n>"
        batches/lock/                 lock of publishers assigning batch ids
        batches/data/<name>-<n>       a batch body kept in ZooKeeper (small batches)
        batches/refs/<name>-<n>       a batch kept in a batch store: its URL (large batches)
        processors/<consumer>         the last batch id the consumer processed
    <chroot>/<ns>/streams/<name>/
        spec                          operator-owned JSON of the reconciled spec
        manifest                      the broker members that should exist (the group's manifest)
        brokers/<member>              ephemeral JSON {endpoint, curvePublicKey, pod, startedAt}
        replication/state             replicated streams: JSON {epoch, leader, isr}, conditional writes only
        replication/election/<replica>-<seq>  ephemeral sequential: replicas in line to lead
        partitions/<p>/               a partitioned stream's partition p >= 1: manifest, brokers/ and
                                      replication/ as above (partition 0 is the stream's own, so a
                                      stream of one partition keeps its layout when it grows)
        tier/leader                   tiered streams: the epoch of the leader that uploads (its fencing token)
        tier/segments/<first>         tiered streams: JSON of one object of the journal in the object
                                      store (its records first..last, epoch, state: zeps.tiering.manifest);
                                      <first>.<generation>: a compacted stream's run uploaded again
        consumers/<group>/members/<member>   ephemeral: a live member of a consumer group
        consumers/<group>/owners/<p>  ephemeral; data = member: who reads partition p now
        consumers/<group>/offsets/<p> JSON {sequence, owner}: the last sequence of p the group processed

A group is a parent of ephemeral members (JSON metadata) plus, where the design calls
for one, a persistent manifest of the members that should exist (streams: ``brokers/`` beside
``manifest``).

Names are Kubernetes names (DNS-1123 labels), so every path component is safe in ZooKeeper.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from zeps.errors import ConfigError
from zeps.partitioning import MAX_PARTITIONS

__all__ = [
    "DEFAULT_CHROOT",
    "LAYOUT_VERSION",
    "ConsumerGroupPaths",
    "GroupPaths",
    "QueuePaths",
    "StreamPaths",
    "TopicPaths",
    "validate_name",
]

LAYOUT_VERSION = 1
DEFAULT_CHROOT = "/zeps"

_DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_MEMBER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def validate_name(kind: str, value: str) -> str:
    """Check a resource name or namespace is a DNS-1123 label (what Kubernetes allows)."""
    if not (len(value) <= 63 and _DNS1123_LABEL.match(value)):
        raise ConfigError(
            f"{kind} {value!r} is not a valid name: use at most 63 lower-case letters, digits and '-', "
            "starting and ending with a letter or digit"
        )
    return value


def validate_member_id(value: str) -> str:
    """Check a member or consumer id is safe as one znode name (letters, digits, '.', '_', '-')."""
    if not _MEMBER_ID.match(value):
        raise ConfigError(
            f"member id {value!r} is not valid: use 1-128 letters, digits, '.', '_' or '-', starting with a letter "
            "or digit"
        )
    return value


def _chroot(value: str) -> str:
    if not value.startswith("/") or value.endswith("/") or "//" in value:
        raise ConfigError(f"chroot {value!r} must be an absolute ZooKeeper path like '/zeps' (no trailing '/')")
    return value


SEQUENCE_DIGITS = 10  #: the counter ZooKeeper appends to a sequential node's name


def sequence_of(name: str) -> int:
    """The counter ZooKeeper appended to a sequential node's ``name`` (0 for a name without one)."""
    tail = name[-SEQUENCE_DIGITS:]
    return int(tail) if tail.isdigit() else 0


@dataclass(frozen=True)
class GroupPaths:
    """Paths of one group: a parent of ephemeral members and, optionally, a manifest."""

    members: str
    manifest: str | None = None

    def member(self, member_id: str) -> str:
        return f"{self.members}/{validate_member_id(member_id)}"


@dataclass(frozen=True)
class TopicPaths:
    """Paths of one Topic."""

    root: str

    @classmethod
    def of(cls, namespace: str, name: str, *, chroot: str = DEFAULT_CHROOT) -> TopicPaths:
        return cls(f"{_chroot(chroot)}/{validate_name('namespace', namespace)}/topics/{validate_name('topic', name)}")

    @property
    def spec(self) -> str:
        return f"{self.root}/spec"

    @property
    def clients(self) -> GroupPaths:
        """Live SDK clients of the topic: the cleaner keeps a queue while its client is here."""
        return GroupPaths(f"{self.root}/clients")

    @property
    def subscribers(self) -> GroupPaths:
        return GroupPaths(f"{self.root}/subscribers")

    @property
    def messages(self) -> str:
        return f"{self.root}/messages"

    def queue(self, consumer_id: str) -> str:
        return f"{self.messages}/{validate_member_id(consumer_id)}"

    @staticmethod
    def message_name(count: int, first_id: str) -> str:
        """A message node's name (in a subscriber's queue) before ZooKeeper appends its sequence:
        ``m-<count:04>-<first message id>-``; the node packs ``count`` messages."""
        return f"m-{count:04d}-{first_id}-"

    @staticmethod
    def message_count(node: str) -> int:
        """Messages a message node holds, read from its name; a foreign name counts as one."""
        if node.startswith("m-") and node[6:7] == "-" and node[2:6].isdigit():
            return int(node[2:6])
        return 1

    @property
    def parked(self) -> str:
        """Messages a subscriber gave up on (``on_give_up="keep"``), one subtree per consumer."""
        return f"{self.root}/parked"

    def parked_for(self, consumer_id: str) -> str:
        return f"{self.parked}/{validate_member_id(consumer_id)}"

    @property
    def cleaner(self) -> str:
        return f"{self.root}/cleaner"

    def delivery_layout(self) -> list[str]:
        """The nodes publishing and subscribing need (the SDK creates them when missing)."""
        return [self.clients.members, self.subscribers.members, self.messages]

    def layout(self) -> list[str]:
        """The persistent nodes a Topic needs (the operator creates them; the SDK creates the delivery
        ones when missing, ``parked`` on first use)."""
        return [*self.delivery_layout(), self.parked]


@dataclass(frozen=True)
class QueuePaths:
    """Paths of one Queue: the work queue and its batch mode."""

    root: str
    name: str

    @classmethod
    def of(cls, namespace: str, name: str, *, chroot: str = DEFAULT_CHROOT) -> QueuePaths:
        root = f"{_chroot(chroot)}/{validate_name('namespace', namespace)}/queues/{validate_name('queue', name)}"
        return cls(root, name)

    @property
    def spec(self) -> str:
        return f"{self.root}/spec"

    @property
    def items(self) -> str:
        return f"{self.root}/items"

    def item_prefix(self, priority: int, item_id: str) -> str:
        """A new item node's path before ZooKeeper appends its sequence: ``items/i-<prio:03>-<id>-``."""
        return f"{self.items}/i-{priority:03d}-{item_id}-"

    @staticmethod
    def item_order(name: str) -> tuple[int, int]:
        """An item (or dead letter) node's sort key from its name: (priority, sequence); a name not
        made by :meth:`item_prefix` sorts last."""
        try:
            return int(name[2:5]), sequence_of(name)
        except ValueError:
            return 999, sequence_of(name)

    @property
    def taken(self) -> str:
        return f"{self.root}/taken"

    @property
    def waiters(self) -> str:
        return f"{self.root}/waiters"

    @property
    def workers(self) -> GroupPaths:
        return GroupPaths(f"{self.root}/workers")

    @property
    def dead(self) -> str:
        return f"{self.root}/dead"

    @property
    def batches(self) -> str:
        return f"{self.root}/batches"

    @property
    def latest_batch(self) -> str:
        return f"{self.batches}/latest"

    @property
    def batch_lock(self) -> str:
        return f"{self.batches}/lock"

    @property
    def batch_data(self) -> str:
        return f"{self.batches}/data"

    @property
    def batch_refs(self) -> str:
        return f"{self.batches}/refs"

    @property
    def batch_deleting(self) -> str:
        """Objects retention removed the references of and still has to delete from the store."""
        return f"{self.batches}/deleting"

    @property
    def batch_writers(self) -> str:
        return f"{self.batches}/writers"

    def batch_writer(self, writer: str) -> str:
        return f"{self.batch_writers}/{validate_member_id(writer)}"

    @property
    def processors(self) -> str:
        return f"{self.root}/processors"

    def processor(self, consumer: str) -> str:
        return f"{self.processors}/{validate_member_id(consumer)}"

    def work_layout(self) -> list[str]:
        """The persistent nodes of work mode (WorkQueue)."""
        return [self.items, self.taken, self.waiters, self.workers.members, self.dead]

    def batch_layout(self) -> list[str]:
        """The persistent nodes of batch mode (BatchQueue)."""
        return [self.batch_data, self.batch_refs, self.batch_deleting, self.batch_lock, self.batch_writers,
                self.processors]  # fmt: skip

    def layout(self) -> list[str]:
        """The persistent nodes a Queue needs, in either mode (the operator creates them all; each SDK
        class creates its mode's when missing)."""
        return [*self.work_layout(), *self.batch_layout()]


@dataclass(frozen=True)
class StreamPaths:
    """Paths of one ZepsStream: its brokers as a group with a manifest."""

    root: str
    partition: int = 0  #: which of a partitioned stream's partitions (0: the stream's own nodes)

    @classmethod
    def of(cls, namespace: str, name: str, *, chroot: str = DEFAULT_CHROOT, partition: int = 0) -> StreamPaths:
        namespace, name = validate_name("namespace", namespace), validate_name("stream", name)
        return cls(f"{_chroot(chroot)}/{namespace}/streams/{name}").of_partition(partition)

    def of_partition(self, partition: int) -> StreamPaths:
        """The paths of partition ``partition`` of this stream: its brokers, manifest and replication."""
        if not 0 <= partition < MAX_PARTITIONS:
            raise ConfigError(f"partition {partition} is out of range: a stream has partitions 0..{MAX_PARTITIONS - 1}")
        if partition == self.partition:
            return self
        return StreamPaths(self.stream_root if partition == 0 else f"{self.partitions}/{partition}", partition)

    @property
    def stream_root(self) -> str:
        """The stream's own root (partition 0's too)."""
        return self.root if self.partition == 0 else self.root.rsplit("/partitions/", 1)[0]

    @property
    def partitions(self) -> str:
        """Where partitions 1 and up have their nodes."""
        return f"{self.stream_root}/partitions"

    @property
    def spec(self) -> str:
        """The stream's reconciled spec (one for all its partitions)."""
        return f"{self.stream_root}/spec"

    @property
    def brokers(self) -> GroupPaths:
        return GroupPaths(f"{self.root}/brokers", f"{self.root}/manifest")

    @property
    def replication_state(self) -> str:
        """A replicated stream's leader, epoch and in-sync set (JSON, changed by conditional writes only)."""
        return f"{self.root}/replication/state"

    @property
    def election(self) -> str:
        """Its replicas in line to lead: ephemeral sequential ``<replica>~<run>-<seq>`` nodes."""
        return f"{self.root}/replication/election"

    @property
    def replication_stopped(self) -> str:
        """Its replicas stopped on purpose (SIGTERM), not crashed: a ``<replica>`` node each, made as
        it begins to stop and removed when it starts again. A replica holding its own stop waits for
        no replica listed here (none of them is coming back)."""
        return f"{self.root}/replication/stopped"

    @property
    def replication_committed(self) -> str:
        """The last commit point a leader recorded (JSON {"epoch", "commit"}, every few seconds): what an
        unclean election reports it gives up."""
        return f"{self.root}/replication/committed"

    @property
    def tier_leader(self) -> str:
        """A tiered stream's uploading leader: its epoch (each change of the manifest checks this node's
        version, so a leader that lost its lead writes nothing more)."""
        return f"{self.root}/tier/leader"

    @property
    def tier_segments(self) -> str:
        """A tiered stream's manifest: one node per object in the object store, named by its first sequence."""
        return f"{self.root}/tier/segments"

    def consumer_group(self, group: str) -> ConsumerGroupPaths:
        """The nodes of consumer group ``group`` of this stream (of all its partitions)."""
        return ConsumerGroupPaths(f"{self.stream_root}/consumers/{validate_member_id(group)}")

    def layout(self) -> list[str]:
        """The persistent nodes a ZepsStream needs (the manifest is written by the operator)."""
        return [self.brokers.members]


@dataclass(frozen=True)
class ConsumerGroupPaths:
    """A consumer group of a (partitioned) stream: its members, who owns each partition, and the last
    sequence of each partition it processed."""

    root: str

    @property
    def members(self) -> GroupPaths:
        return GroupPaths(f"{self.root}/members")

    def owner(self, partition: int) -> str:
        return f"{self.root}/owners/{partition}"

    def offset(self, partition: int) -> str:
        return f"{self.root}/offsets/{partition}"


def paths_of(
    kind: str, namespace: str, name: str, *, chroot: str = DEFAULT_CHROOT
) -> TopicPaths | QueuePaths | StreamPaths:
    """The paths of a resource of ``kind`` (Topic, Queue or ZepsStream)."""
    classes: dict[str, type[TopicPaths] | type[QueuePaths] | type[StreamPaths]] = {
        "Topic": TopicPaths, "Queue": QueuePaths, "ZepsStream": StreamPaths,
    }  # fmt: skip
    if kind not in classes:
        raise ValueError(f"unknown kind {kind!r}")
    return classes[kind].of(namespace, name, chroot=chroot)


def chroot_of(kind: str, namespace: str, name: str, root: str) -> str | None:
    """The chroot under which ``root`` is the resource's root path (the inverse of :func:`paths_of`),
    or None when ``root`` is not that resource's."""
    suffix = paths_of(kind, namespace, name, chroot="/c").root.removeprefix("/c")
    chroot = root.removesuffix(suffix)
    return chroot if chroot != root and chroot.startswith("/") else None
