"""Consumer groups over a partitioned stream: N members share its partitions, each partition read by
one member at a time, handed over through ZooKeeper when members come and go.

Layout (:class:`zeps.paths.ConsumerGroupPaths`)::

    consumers/<group>/members/<member>   ephemeral: the live members (a :class:`~zeps.coordination.Group`)
    consumers/<group>/owners/<p>         ephemeral; data = member: who reads partition p now
    consumers/<group>/offsets/<p>        JSON {"sequence": n, "owner": member}: what the group processed

* Which member should read which partition is :func:`assign` of the live members: a pure function
  every member computes alike, so no leader is needed.
* A member reads a partition only once it **claims** it: it creates the ephemeral owner node (so it
  waits while the previous owner still holds it) and then rewrites the offset node, which bumps its
  version. Each commit is a write conditional on the version the member last wrote, so a member that
  lost the partition (its session expired while it was paused, and another claimed it) can never
  move the group's offset: :class:`PartitionLostError`.
* A member **hands out** what it read of its partitions only while its ownership is known fresh: at
  least every half session timeout it reads its owner nodes back (:meth:`ConsumerGroup.lost`). A
  member paused past its session (SIGSTOP, a long GC) resumes with records read before the pause;
  it hands none of a partition another member took meanwhile (it learns so first), nor anything at
  all while it cannot reach ZooKeeper.
* A member giving a partition up (another member joined) commits what it processed and then deletes
  its owner node; the next owner starts right after that sequence: nothing twice. A member that dies
  loses its owner nodes with its session: the next owner starts after its last commit, so what it
  processed and had not committed yet is processed again; handlers that must see each message once
  keep the (partition, sequence) they processed with their effect (an idempotent handler).
"""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from zeps import _json as bounded_json
from zeps.coordination._util import zookeeper_errors
from zeps.coordination.group import Group, Membership
from zeps.errors import CoordinationError
from zeps.paths import ConsumerGroupPaths, validate_member_id

__all__ = ["Claim", "ConsumerGroup", "PartitionLostError", "assign", "describe"]


class PartitionLostError(CoordinationError):
    """This member no longer owns the partition (its session expired and another member claimed it):
    its commit was refused, and what it read of the partition since its last commit is another's now."""


def assign(members: Iterable[str], partitions: int) -> dict[str, list[int]]:
    """Which partitions each member reads: round robin over the members in sorted order (partition p
    to the ``p % len(members)``-th). Every member computes the same from the same set."""
    ordered = sorted(set(members))
    out: dict[str, list[int]] = {m: [] for m in ordered}
    for p in range(partitions if ordered else 0):
        out[ordered[p % len(ordered)]].append(p)
    return out


@dataclass
class Claim:
    """A partition this member owns: the sequence the group processed up to, and the version of the
    offset node it last wrote (its commits are conditional on it)."""

    partition: int
    sequence: int
    version: int


def _offset(data: bytes) -> int:
    """The sequence an offset node holds; 0 for one that holds none (or something not ours to trust)."""
    try:
        value = bounded_json.loads(data, max_bytes=4096) if data else {}
        sequence = value.get("sequence", 0) if isinstance(value, dict) else 0
    except ValueError:
        return 0
    return sequence if isinstance(sequence, int) and not isinstance(sequence, bool) and sequence >= 0 else 0


class ConsumerGroup:
    """This process's membership in consumer group ``paths`` as ``member``, over a started kazoo
    ``client`` (the caller's). :meth:`join` first; :attr:`changed` is set whenever the members change
    (clear it, then look at :meth:`wanted`)."""

    def __init__(self, client: KazooClient, paths: ConsumerGroupPaths, member: str) -> None:
        self.client, self.paths, self.member = client, paths, validate_member_id(member)
        self.changed = threading.Event()
        self._group = Group(client, paths.members)
        self._membership: Membership | None = None
        self._watch: Any = None

    def join(self) -> ConsumerGroup:
        self._membership = self._group.join(self.member, {"member": self.member})
        self._watch = self._group.watch(on_status=lambda _status: self.changed.set())
        self.changed.set()
        return self

    def members(self) -> list[str]:
        return sorted(self._group.members())

    def wanted(self, partitions: int) -> list[int]:
        """The partitions this member should read now, by :func:`assign` of the live members."""
        return assign([*self.members(), self.member], partitions).get(self.member, [])

    @zookeeper_errors
    def claim(self, partition: int) -> Claim | None:
        """Own ``partition``: None while another member still does (it has not given it up yet, or its
        session has not expired yet)."""
        owner = self.paths.owner(partition)
        try:
            self.client.retry(self.client.create, owner, self.member.encode(), ephemeral=True, makepath=True)
        except NodeExistsError:
            try:
                _data, stat = self.client.retry(self.client.get, owner)
            except NoNodeError:
                return None  # its owner let go just now: claim it on the next look
            if stat.ephemeralOwner != self.client.client_id[0]:
                return None  # another session's
        offset = self.paths.offset(partition)
        try:
            data, stat = self.client.retry(self.client.get, offset)
        except NoNodeError:
            with contextlib.suppress(NodeExistsError):  # another member made it meanwhile
                self.client.retry(self.client.create, offset, self._encode(0), makepath=True)
            data, stat = self.client.retry(self.client.get, offset)
        sequence = _offset(data)
        try:  # the claim itself is a write: a former owner's next conditional commit now fails
            stat = self.client.retry(self.client.set, offset, self._encode(sequence), version=stat.version)
        except BadVersionError:
            self._drop_owner(partition)
            return None  # a former owner committed meanwhile: claim again on the next look
        return Claim(partition, sequence, stat.version)

    @zookeeper_errors
    def commit(self, claim: Claim, sequence: int) -> None:
        """The group processed ``claim``'s partition up to ``sequence``. PartitionLostError if this
        member no longer owns it."""
        if sequence <= claim.sequence:
            return
        try:
            stat = self.client.retry(self.client.set, self.paths.offset(claim.partition), self._encode(sequence),
                                     version=claim.version)  # fmt: skip
        except (BadVersionError, NoNodeError):
            raise PartitionLostError(
                f"member {self.member} of {self.paths.root} no longer owns partition {claim.partition}: another "
                f"member claimed it; sequences after {claim.sequence} of it are that member's to process"
            ) from None
        claim.sequence, claim.version = sequence, stat.version

    @zookeeper_errors
    def lost(self, claims: Iterable[Claim]) -> list[int]:
        """The partitions of ``claims`` this member no longer owns, as ZooKeeper says now (a read
        each): its owner node gone, or another session's. A member checks before it hands out what it
        read, at least every half session timeout: ZooKeeper cannot have expired a session that
        answered a moment ago, so no other member can own its partitions yet (KIP-848's member epoch,
        on ZooKeeper's session)."""
        session = self.client.client_id[0] if self.client.client_id else None
        out = []
        for claim in claims:
            try:
                _data, stat = self.client.retry(self.client.get, self.paths.owner(claim.partition))
            except NoNodeError:
                out.append(claim.partition)
                continue
            if stat.ephemeralOwner != session:
                out.append(claim.partition)
        return out

    @zookeeper_errors
    def release(self, claim: Claim) -> None:
        """Give ``claim``'s partition up (commit first): the next owner starts after its sequence."""
        self._drop_owner(claim.partition)

    def _drop_owner(self, partition: int) -> None:
        owner = self.paths.owner(partition)
        try:
            _data, stat = self.client.retry(self.client.get, owner)
            if stat.ephemeralOwner == self.client.client_id[0]:
                self.client.retry(self.client.delete, owner, version=stat.version)
        except (NoNodeError, BadVersionError):
            pass

    def leave(self) -> None:
        if self._watch is not None:
            self._watch.stop()
            self._watch = None
        if self._membership is not None:
            self._membership.leave()
            self._membership = None

    def _encode(self, sequence: int) -> bytes:
        return json.dumps({"sequence": sequence, "owner": self.member}).encode()


@zookeeper_errors
def describe(client: KazooClient, paths: ConsumerGroupPaths, partitions: int) -> dict[str, Any]:
    """What consumer group ``paths`` looks like now (``zeps stream lag --group``): its live members and,
    for each partition, the sequence the group committed and the member that owns it ("" for none).
    The nodes are anyone's to write: a value that is not ours reads as 0, a name is cut to 253 chars."""

    def text(path: str) -> str:
        try:
            data, _stat = client.retry(client.get, path)
        except NoNodeError:
            return ""
        return bytes(data[:253]).decode(errors="replace")

    def sequence(path: str) -> int:
        try:
            data, _stat = client.retry(client.get, path)
        except NoNodeError:
            return 0
        return _offset(data[:4096])

    try:
        members = sorted(client.retry(client.get_children, paths.members.members))
    except NoNodeError:
        members = []  # nobody joined yet
    return {
        "members": [m[:253] for m in members][:1000],
        "partitions": [
            {"partition": p, "committed": sequence(paths.offset(p)), "owner": text(paths.owner(p))}
            for p in range(partitions)
        ],
    }
