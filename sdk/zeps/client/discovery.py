"""Finding a stream's broker in ZooKeeper: the group its brokers join (``streams/<name>/brokers``).

What a member node says is only as trustworthy as who may write it (see :func:`discover`)."""

from __future__ import annotations

import logging
import random
import time
from typing import Any

from zeps.client._transport import BrokerUnavailableError, Locator
from zeps.config import Resolved

log = logging.getLogger(__name__)

__all__ = [
    "LeaderLocator", "PartitionWatch", "broker_metadata", "discover", "growth_of", "locator_of", "partition_count",
    "partition_endpoints", "read_broker_metadata",
]  # fmt: skip


def broker_metadata(
    client: Any, namespace: str, stream: str, *, chroot: str = "/zeps", partition: int = 0
) -> dict[str, Any]:
    """What the live broker of ``stream`` (of its partition ``partition``) publishes in its ZooKeeper
    group (``client``, a started kazoo client): ``endpoint`` and ``curvePublicKey`` when it joins;
    ``lastSequence``, ``journalBytes``, ``subscriptionCount`` and the furthest-behind
    ``subscriptions`` every second."""
    from zeps.coordination import Group  # noqa: PLC0415 — ZooKeeper only for discovery
    from zeps.coordination.replication import read_replication_state  # noqa: PLC0415
    from zeps.paths import StreamPaths  # noqa: PLC0415

    paths = StreamPaths.of(namespace, stream, chroot=chroot, partition=partition)
    where = f"{namespace}/{stream}" + (f" partition {partition}" if partition else "")
    group = Group(client, paths.brokers)
    manifest = group.status().manifest
    members = group.members()
    usable = [m for name, m in sorted(members.items()) if manifest is None or name in manifest]
    if not usable:
        raise BrokerUnavailableError(f"no live broker is registered for stream {where}")
    state = read_replication_state(client, paths)
    if state is not None:  # a replicated stream: its leader, while it lives
        leader = members.get(state.leader)
        if leader is None or (manifest is not None and state.leader not in manifest):
            raise BrokerUnavailableError(f"stream {where} has no leader right now (epoch {state.epoch}'s "
                                         f"leader {state.leader} is gone: an election is on)")  # fmt: skip
        return dict(leader.metadata)
    return dict(usable[0].metadata)


def partition_count(client: Any, namespace: str, stream: str, *, chroot: str = "/zeps") -> int:
    """How many partitions ``stream`` has, from ZooKeeper: 1 plus the partitions ``1, 2, …`` the
    operator made nodes for (``streams/<name>/partitions/<p>``) without a gap; a child that is not a
    partition number (written by someone else) is ignored."""
    from zeps.paths import StreamPaths  # noqa: PLC0415

    path = StreamPaths.of(namespace, stream, chroot=chroot).partitions
    return _contiguous(client.get_children(path) if client.exists(path) else [])


def _contiguous(children: list[str]) -> int:
    """1 plus the partitions ``1, 2, …`` among the children of a stream's ``partitions`` node, up to
    the first gap (a child that is not a partition number, written by someone else, is ignored)."""
    from zeps.partitioning import MAX_PARTITIONS  # noqa: PLC0415

    made, count = set(children), 1
    while count < MAX_PARTITIONS and str(count) in made:
        count += 1
    return count


def partition_endpoints(client: Any, namespace: str, stream: str, *, chroot: str = "/zeps") -> tuple[str, ...]:
    """A partitioned stream's endpoint of each partition as its brokers advertise them in ZooKeeper
    (its leader's, for a replicated partition), partition 0 first; () for a stream of one partition."""
    count = partition_count(client, namespace, stream, chroot=chroot)
    if count == 1:
        return ()
    return tuple(str(broker_metadata(client, namespace, stream, chroot=chroot, partition=p)["endpoint"])
                 for p in range(count))  # fmt: skip


def read_broker_metadata(
    zookeeper: str,
    namespace: str,
    stream: str,
    *,
    chroot: str = "/zeps",
    auth: tuple[str, str] | None = None,
    ca: str = "",
    partition: int = 0,
) -> dict[str, Any]:
    """:func:`broker_metadata` through a ZooKeeper session of its own, closed before returning."""
    from zeps.coordination import connect  # noqa: PLC0415 — ZooKeeper only for discovery

    client = connect(zookeeper, auth=auth, ca=ca)
    try:
        return broker_metadata(client, namespace, stream, chroot=chroot, partition=partition)
    finally:
        client.stop()
        client.close()


def discover(
    zookeeper: str,
    namespace: str,
    stream: str,
    *,
    chroot: str = "/zeps",
    auth: tuple[str, str] | None = None,
    ca: str = "",
    partition: int = 0,
) -> tuple[str, str]:
    """The (endpoint, CURVE public key) of the live broker of ``stream``, from its ZooKeeper group
    (``auth``: the namespace's ZooKeeper identity, where ACLs are on; ``ca``: the PEM of the servers'
    TLS CA, where they speak TLS). What a member node says is only
    as trustworthy as who may write it: with the namespace's ACL, its brokers; without, anyone. So
    take the broker's key from a source of your own (the Secret the operator made, the resource's
    status) when it matters: a forged node's endpoint then fails the CURVE handshake."""
    meta = read_broker_metadata(zookeeper, namespace, stream, chroot=chroot, auth=auth, ca=ca, partition=partition)
    return str(meta["endpoint"]), str(meta.get("curvePublicKey", ""))


class LeaderLocator:
    """Where a stream's broker is now (its leader, for a replicated stream): called by a client each
    time it connects again, so it follows the leader across a failover. ``followers``: for a client
    that only reads (``follower_reads``), one of the leader's in-sync followers, chosen at random
    (spreading replay load over them) and kept while it is one, or the leader while none lives.
    ``partition``: of a partitioned stream, the partition whose broker is looked for. Keeps one
    ZooKeeper session, opened at the first call; :meth:`close` ends it."""

    def __init__(
        self,
        zookeeper: str,
        namespace: str,
        stream: str,
        *,
        chroot: str = "/zeps",
        auth: tuple[str, str] | None = None,
        ca: str = "",
        followers: bool = False,
        partition: int = 0,
    ) -> None:
        self.zookeeper, self.namespace, self.stream, self.chroot, self.auth = zookeeper, namespace, stream, chroot, auth
        self.ca = ca
        self.followers, self.partition = followers, partition
        self._follower: str | None = None  # the follower chosen last (a reader stays with it while it serves)
        self._client: Any = None

    def __call__(self) -> str:
        """The leader's endpoint; BrokerUnavailableError while there is none (an election), and for a
        stream that is not replicated: its one broker stays where the client reached it (a port-forward,
        a NodePort or a load balancer is not the address the broker advertises in ZooKeeper)."""
        from zeps.coordination.replication import read_replication_state  # noqa: PLC0415
        from zeps.paths import StreamPaths  # noqa: PLC0415

        if self._client is None:
            from zeps.coordination import connect  # noqa: PLC0415 — ZooKeeper only for discovery

            self._client = connect(self.zookeeper, auth=self.auth, ca=self.ca, timeout=3)  # a client waits on this
        paths = StreamPaths.of(self.namespace, self.stream, chroot=self.chroot, partition=self.partition)
        state = read_replication_state(self._client, paths)
        if state is None:
            raise BrokerUnavailableError(f"stream {self.namespace}/{self.stream} (partition {self.partition}) is not "
                                         "replicated: no leader")  # fmt: skip
        if self.followers:
            from zeps.coordination import Group  # noqa: PLC0415

            members = Group(self._client, paths.brokers).members()
            live = [str(members[n].metadata["endpoint"]) for n in sorted(state.isr - {state.leader}) if n in members]
            if self._follower not in live:  # the one chosen before while it serves, else one at random
                self._follower = random.choice(live) if live else None  # spreading replay load over them
            if self._follower is not None:
                return self._follower
        meta = broker_metadata(self._client, self.namespace, self.stream, chroot=self.chroot, partition=self.partition)
        return str(meta["endpoint"])

    def close(self) -> None:
        if self._client is not None:
            self._client.stop()
            self._client.close()
            self._client = None


class PartitionWatch:
    """Tells a partitioned stream's clients that the stream grew: a ZooKeeper watch on the stream's
    ``partitions`` node keeps :attr:`count` (what :func:`partition_count` would say) up to date, from
    ZooKeeper's thread; a client compares it with the partitions it has (an int, cheap on every call)
    and, when the stream has more, asks :meth:`added` for them on its own thread. Keeps one
    ZooKeeper session, opened by :meth:`start`; :meth:`close` ends it."""

    def __init__(
        self,
        zookeeper: str,
        namespace: str,
        stream: str,
        *,
        chroot: str = "/zeps",
        auth: tuple[str, str] | None = None,
        ca: str = "",
        followers: bool = False,
    ) -> None:
        self.zookeeper, self.namespace, self.stream, self.chroot, self.auth = zookeeper, namespace, stream, chroot, auth
        self.ca = ca
        self.followers = followers
        self.count = 0  #: the stream's partitions as ZooKeeper says now (0 until the watch has read them)
        self._client: Any = None
        self._look_after = 0.0  # a partition added has no broker yet: look again then

    def start(self) -> PartitionWatch:
        """Open the session and set the watch, once. If ZooKeeper cannot be reached, the watch stays
        inert (count 0) with a warning: the partitions known still serve, only growth goes unnoticed."""
        from zeps.coordination import connect  # noqa: PLC0415 — ZooKeeper only for discovery
        from zeps.errors import ZepsError  # noqa: PLC0415
        from zeps.paths import StreamPaths  # noqa: PLC0415

        if self._client is not None:
            return self

        def children(names: list[str]) -> None:
            self.count = max(self.count, _contiguous(names))  # partitions never go away

        try:
            self._client = connect(self.zookeeper, auth=self.auth, ca=self.ca, timeout=3)
        except ZepsError as exc:
            log.warning("stream %s: cannot watch for partitions added (%s)", self.stream, exc)
            return self
        path = StreamPaths.of(self.namespace, self.stream, chroot=self.chroot).partitions
        self._client.ChildrenWatch(path, children)  # a stream of one partition has no such node: no watch
        return self

    def added(self, known: int) -> list[tuple[str, LeaderLocator]]:
        """The endpoint and a locator of each partition after the first ``known``, once every one has
        a broker registered; [] until then (looked up at most once a second) or if there is none."""
        from zeps.errors import ZepsError  # noqa: PLC0415

        now = time.monotonic()
        if self.count <= known or now < self._look_after:
            return []
        try:
            endpoints = [str(broker_metadata(self._client, self.namespace, self.stream, chroot=self.chroot,
                                             partition=p)["endpoint"]) for p in range(known, self.count)]  # fmt: skip
        except ZepsError:  # a partition just added has no broker registered yet
            self._look_after = now + 1.0
            return []
        return [(endpoint, self.locator(p)) for p, endpoint in enumerate(endpoints, start=known)]

    def locator(self, partition: int) -> LeaderLocator:
        """A locator for ``partition`` (a client of a partition added follows its leader too)."""
        return LeaderLocator(self.zookeeper, self.namespace, self.stream, chroot=self.chroot, auth=self.auth,
                             ca=self.ca, followers=self.followers, partition=partition)  # fmt: skip

    def close(self) -> None:
        if self._client is not None:
            self._client.stop()
            self._client.close()
            self._client = None


def locator_of(settings: Resolved, *, followers: bool = False, partition: int = 0) -> Locator | None:
    """A locator for a resolved stream whose ZooKeeper is known: the first connection goes to the
    endpoint resolved (the operator's word), each later one to wherever the stream's leader is then
    (``followers``: one of its in-sync followers, for a client that only reads; ``partition``: of
    that partition of a partitioned stream)."""
    if not settings.zookeeper:
        return None
    return LeaderLocator(settings.zookeeper, settings.namespace, settings.name, chroot=settings.chroot,
                         auth=settings.auth, ca=settings.zookeeper_ca, followers=followers,
                         partition=partition)  # fmt: skip


def growth_of(settings: Resolved, *, followers: bool = False) -> PartitionWatch | None:
    """What tells a client of a resolved partitioned stream that partitions were added, when its
    ZooKeeper is known (:class:`zeps.client.discovery.PartitionWatch`); not started yet."""
    if not settings.zookeeper:
        return None
    return PartitionWatch(settings.zookeeper, settings.namespace, settings.name, chroot=settings.chroot,
                          auth=settings.auth, ca=settings.zookeeper_ca, followers=followers)  # fmt: skip
