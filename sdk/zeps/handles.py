"""Ready-to-use handles configured from the custom resources: ``zeps.topic("cache")`` and friends.

A handle holds only its resolved settings (:class:`zeps.config.Resolved`), so it pickles: Spark's
driver resolves once and ships handles to executors, which need no Kubernetes access. The ZooKeeper
client or broker connection behind it is made lazily, once per process (keyed by pid: kazoo threads
and ZeroMQ contexts do not survive a fork).
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

from zeps.batchstore import BatchStore
from zeps.batchstore.s3 import credentials_in_environment
from zeps.client import GroupConsumer, MulticastSubscription, PartitionedStreamClient, StreamClient
from zeps.client._transport import multicast_key
from zeps.client.discovery import partition_endpoints
from zeps.client.session import Since
from zeps.config import Resolved, require_queue_mode, resolve
from zeps.config.resolver import read_secret
from zeps.coordination import Topic, shared_client
from zeps.coordination.batches import BatchQueue, open_batch_store
from zeps.coordination.queue import WorkQueue
from zeps.errors import ZepsError
from zeps.options import BatchOptions, QueueOptions, TopicOptions

__all__ = ["BatchesHandle", "QueueHandle", "StreamHandle", "TopicHandle", "batches", "queue", "stream", "topic"]

log = logging.getLogger(__name__)


class _Handle:
    def __init__(self, settings: Resolved) -> None:
        self.settings = settings
        self._per_pid: dict[int, Any] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"settings": self.settings.model_dump()}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(Resolved(**state["settings"]))  # type: ignore[misc]

    def __repr__(self) -> str:
        s = self.settings
        return f"{type(self).__name__}({s.namespace}/{s.name})"

    def _make(self) -> Any:
        raise NotImplementedError

    def _recipe(self) -> Any:
        pid = os.getpid()
        if pid not in self._per_pid:
            self._per_pid = {pid: self._make()}  # drop whatever a parent process left behind
        return self._per_pid[pid]

    def _zookeeper(self) -> Any:
        return shared_client(self.settings.zookeeper, auth=self.settings.auth, ca=self.settings.zookeeper_ca)


class _Forwarding(_Handle):
    """A handle whose public methods are its recipe's (made lazily, per process)."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name == "settings":
            raise AttributeError(name)
        return getattr(self._recipe(), name)


class TopicHandle(_Handle):
    """``zeps.topic(name)``: broadcast to every live subscriber (see :class:`zeps.coordination.Topic`)."""

    def _make(self) -> Topic:
        s = self.settings
        return Topic(
            self._zookeeper(), s.name, namespace=s.namespace, chroot=s.chroot, options=TopicOptions.from_spec(s.spec)
        )

    def publish(self, body: bytes, **kwargs: Any) -> str:
        return str(self._recipe().publish(body, **kwargs))

    def publish_many(self, bodies: list[bytes], **kwargs: Any) -> list[str]:
        return list(self._recipe().publish_many(bodies, **kwargs))

    def publish_async(self, body: bytes, **kwargs: Any) -> Any:
        return self._recipe().publish_async(body, **kwargs)

    def flush(self, timeout: float | None = None) -> None:
        self._recipe().flush(timeout)

    def subscribe(self, callback: Any, **kwargs: Any) -> Any:
        return self._recipe().subscribe(callback, **kwargs)

    def queues(self) -> frozenset[str]:
        """The consumers a publish reaches now."""
        return frozenset(self._recipe().queues())


class QueueHandle(_Forwarding):
    """``zeps.queue(name)``: a work queue (see :class:`zeps.coordination.queue.WorkQueue`)."""

    def _make(self) -> WorkQueue:
        s = self.settings
        return WorkQueue(
            self._zookeeper(), s.name, namespace=s.namespace, chroot=s.chroot, options=QueueOptions.from_spec(s.spec)
        )


class BatchesHandle(_Forwarding):
    """``zeps.batches(name)``: a replayable batch queue (see :class:`zeps.coordination.batches.BatchQueue`)."""

    def _make(self) -> BatchQueue:
        s = self.settings
        options = BatchOptions.from_spec(s.spec.get("batches") or {})
        return BatchQueue(
            self._zookeeper(),
            s.name,
            namespace=s.namespace,
            chroot=s.chroot,
            options=options,
            store=self._store(options),
        )

    def _store(self, options: BatchOptions) -> BatchStore | None:
        """An s3:// store whose credentials Secret the Queue names, when the environment has none: the
        Secret read through the Kubernetes API (as this pod's ServiceAccount). Otherwise None: the queue
        opens its store itself, credentials from the environment (a Spark executor's, from envFrom)."""
        secret = options.store_credentials_secret
        if not (options.store_url or "").startswith("s3://") or secret is None or credentials_in_environment():
            return None
        keys = read_secret(self.settings.namespace, secret, ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"),
                           why=f"the batch store of Queue {self.settings.name}")  # fmt: skip
        return open_batch_store(options, credentials=(keys["AWS_ACCESS_KEY_ID"], keys["AWS_SECRET_ACCESS_KEY"]))


class StreamHandle(_Forwarding):
    """``zeps.stream(name)``: a ZepsStream peering (see :class:`zeps.client.StreamClient`); of a
    partitioned stream, a peering with each partition (see :class:`zeps.client.PartitionedStreamClient`)."""

    def _make(self) -> StreamClient | PartitionedStreamClient:
        s = self._with_partitions()
        if len(s.partitions) > 1 or s.spec.get("partitions", 1) > 1:
            return PartitionedStreamClient.of(s).connect()
        return StreamClient.of(s).connect()

    def _with_partitions(self) -> Resolved:
        s = self.settings
        if not s.partitions and s.zookeeper and "partitions" not in s.spec:
            # settings given without the resource's spec: whether the stream is partitioned, ZooKeeper says
            # (unreachable: the endpoint given serves the stream's one partition, as before)
            try:
                found = partition_endpoints(self._zookeeper(), s.namespace, s.name, chroot=s.chroot)
            except ZepsError as exc:
                log.warning("stream %s: could not look for its partitions in ZooKeeper (%s)", s.name, exc)
                found = ()
            s = self.settings = s.model_copy(update={"partitions": found})
        return s

    def consumer_group(self, group: str, *, member: str | None = None, **options: Any) -> GroupConsumer:
        """A member of consumer group ``group`` of this stream, joined (see :class:`zeps.client.GroupConsumer`):
        ``member`` is this host's name unless given (in a pod, the pod's name, unique while it lives).
        Its own peerings and ZooKeeper session; close it (or use ``with``) to hand its partitions over."""
        s = self._with_partitions()
        name = member or socket.gethostname()
        return GroupConsumer.of(s, group=group, member=name, **options).connect()

    def subscribe_multicast(
        self, pattern: str = "", *, since: Since = "latest", interface: str | None = None, stall: float | None = None
    ) -> MulticastSubscription:
        """A multicast subscription (see :meth:`zeps.client.StreamClient.subscribe_multicast`) on a
        peering of its own, closed with it; the group's settings from the resource's status (what its
        broker publishes) or ``ZEPS_STREAM_<NAME>_MULTICAST``. ConfigError if the stream has none."""
        s = self.settings
        multicast = (
            s.multicast
            or resolve("ZepsStream", s.name, namespace=s.namespace, endpoint=s.endpoint, needs=("multicast",)).multicast
        )
        client = StreamClient.of(s).connect()
        try:
            subscription = client.subscribe_multicast(pattern, since=since, multicast=multicast, interface=interface,
                                                      stall=stall, key=multicast_key(s))  # fmt: skip
        except BaseException:
            client.close()
            raise
        subscription.owns_client = True
        return subscription


def topic(name: str, namespace: str | None = None, **settings: Any) -> TopicHandle:
    """A Topic handle; settings resolve from arguments, then the environment, then the resource."""
    return TopicHandle(resolve("Topic", name, namespace=namespace, **settings))


def queue(name: str, namespace: str | None = None, **settings: Any) -> QueueHandle:
    """A work Queue handle (a Queue of ``mode: work``)."""
    resolved = resolve("Queue", name, namespace=namespace, **settings)
    require_queue_mode(resolved, "work")
    return QueueHandle(resolved)


def batches(name: str, namespace: str | None = None, **settings: Any) -> BatchesHandle:
    """A replayable batch Queue handle (a Queue of ``mode: batches``)."""
    resolved = resolve("Queue", name, namespace=namespace, **settings)
    require_queue_mode(resolved, "batches")
    return BatchesHandle(resolved)


def stream(name: str, namespace: str | None = None, **settings: Any) -> StreamHandle:
    return StreamHandle(resolve("ZepsStream", name, namespace=namespace, **settings))
