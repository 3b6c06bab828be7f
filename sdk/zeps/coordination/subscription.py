"""A Topic's subscription: a thread that drains one consumer's queue into a callback, at least once
(the queue layout and the design: :mod:`zeps.coordination.topic`)."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import (
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    NodeExistsError,
    NoNodeError,
    SessionExpiredError,
)
from kazoo.retry import KazooRetry

from zeps.coordination._util import bounded_retry, delete_tree
from zeps.coordination.group import Group, Membership
from zeps.coordination.topic_view import TopicView
from zeps.envelope import Envelope, EnvelopeError, decode_node, encode
from zeps.paths import sequence_of, validate_member_id

__all__ = ["Message", "Subscription"]

log = logging.getLogger(__name__)


_ACK_EVERY = 64  # a subscriber acks (deletes) at least every this many messages…
_ACK_INTERVAL = 0.05  # …or this many seconds: the most a crash can redeliver


@dataclass(frozen=True)
class Message:
    """One delivered message."""

    topic: str
    consumer: str
    sequence: int  #: position in this consumer's queue (ZooKeeper's sequence suffix)
    body: bytes
    id: str
    publisher: str
    timestamp_ms: int
    content_type: str | None
    headers: dict[str, str] = field(default_factory=dict)
    attempt: int = 1
    index: int = 0  #: position inside its node (a packed publish batch)


class Subscription:
    """A running subscription: a thread that drains this consumer's queue into the callback."""

    def __init__(
        self, topic: TopicView, callback: Callable[[Message], None], consumer_id: str, metadata: dict[str, Any]
    ) -> None:
        self.topic = topic
        self.callback = callback
        self.consumer_id = validate_member_id(consumer_id)
        self.queue_path = topic.paths.queue(consumer_id)
        self.parked_path = topic.paths.parked_for(consumer_id)
        self._metadata = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "since": int(time.time()),
            **metadata,
        }
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._memberships: list[Membership] = []
        self._attempts: dict[tuple[str, int], int] = {}
        self._progress: dict[str, int] = {}  # node -> index of its next undelivered message
        #: counters: delivered (callback returned), failed attempts, dropped, parked
        self.delivered = 0
        self.failed_attempts = 0
        self.dropped = 0
        self.parked = 0

    @property
    def client(self) -> KazooClient:
        return self.topic.client

    def _start(self) -> None:
        client, paths = self.client, self.topic.paths
        self._memberships.append(Group(client, paths.clients, acl=self.topic.acl).join(self.consumer_id))
        self._ensure_queue()
        self._memberships.append(
            Group(client, paths.subscribers, acl=self.topic.acl).join(self.consumer_id, self._metadata)
        )
        client.add_listener(self._on_state)
        self._thread = threading.Thread(target=self._run, name=f"zeps-topic-{self.consumer_id}", daemon=True)
        self._thread.start()

    def _ensure_queue(self) -> None:
        with contextlib.suppress(NodeExistsError):
            self.client.retry(self.client.create, self.queue_path, acl=self.topic.acl, makepath=True)

    def _on_state(self, state: str) -> None:
        if state == KazooState.CONNECTED:
            self._wake.set()  # re-read after any reconnect; watches may have been lost

    def _wake_up(self, _event: Any = None) -> None:
        self._wake.set()

    def _run(self) -> None:
        retry = bounded_retry()
        while not self._stop.is_set():
            try:
                self._wake.clear()
                children = retry(self.client.get_children, self.queue_path, watch=self._wake_up)
            except NoNodeError:
                # removed by the cleaner while we were away: start a fresh queue
                self._ensure_queue()
                continue
            except ConnectionClosedError:
                log.warning("topic %s: the ZooKeeper client was closed; subscription %s ends",
                            self.topic.name, self.consumer_id)  # fmt: skip
                return
            except KazooException as exc:
                log.warning("topic %s: listing %s failed (%r); retrying", self.topic.name, self.queue_path, exc)
                self._stop.wait(1)
                continue
            if not children:
                self._wake.wait(5.0)  # the watch wakes us; the timeout is the safety net
                continue
            batch = sorted(children, key=sequence_of)[: self.topic.options.batch_size]
            try:
                self._process(batch, retry)
            except KazooException as exc:
                log.warning("topic %s: processing a batch failed (%r); will re-read", self.topic.name, exc)
                self._stop.wait(0.5)

    def _process(self, batch: list[str], retry: KazooRetry) -> None:
        """Deliver one batch in order. Acks (deletes) go out pipelined while the batch runs, every
        _ACK_EVERY messages or _ACK_INTERVAL seconds, so a crash redelivers at most that window."""
        reads = [(node, self.client.get_async(f"{self.queue_path}/{node}")) for node in batch]
        unsent: list[str] = []
        in_flight: list[tuple[list[str], Any]] = []
        last_ack = time.monotonic()
        try:
            for node, result in reads:
                if self._stop.is_set():
                    return
                try:
                    data, _ = result.get()
                except NoNodeError:
                    continue
                if not self._handle(node, data, retry):
                    return  # keep order: retry this message before any later one
                unsent.append(node)
                if len(unsent) >= _ACK_EVERY or time.monotonic() - last_ack >= _ACK_INTERVAL:
                    in_flight.append(self._send_acks(unsent))
                    unsent, last_ack = [], time.monotonic()
        finally:
            if unsent:
                in_flight.append(self._send_acks(unsent))
            self._confirm_acks(in_flight, retry)

    def _send_acks(self, nodes: list[str]) -> tuple[list[str], Any]:
        t = self.client.transaction()
        for node in nodes:
            t.delete(f"{self.queue_path}/{node}")
        return nodes, t.commit_async()

    def _confirm_acks(self, in_flight: list[tuple[list[str], Any]], retry: KazooRetry) -> None:
        for nodes, result in in_flight:
            try:
                outcome = result.get()
                if not any(isinstance(r, Exception) for r in outcome):
                    continue
            except (ConnectionLoss, SessionExpiredError):
                pass
            # unsure or partly gone (a retried ack that had applied): delete one by one
            for node in nodes:
                with contextlib.suppress(NoNodeError):
                    retry(self.client.delete, f"{self.queue_path}/{node}")

    def _handle(self, node: str, data: bytes, retry: KazooRetry) -> bool:
        """Run the callback for each message of one node, resuming where a retry left off; True when
        the node may be deleted (all its messages delivered, dropped or parked)."""
        try:
            envelopes = decode_node(data)
        except EnvelopeError as exc:
            log.error("topic %s: node %s is unreadable (%s); parking it", self.topic.name, node, exc)
            self._park(node, data, retry)
            return True
        for index in range(self._progress.get(node, 0), len(envelopes)):
            if not self._deliver_one(node, index, envelopes[index], retry):
                self._progress[node] = index
                return False
        self._progress.pop(node, None)
        return True

    def _deliver_one(self, node: str, index: int, env: Envelope, retry: KazooRetry) -> bool:
        key = (node, index)
        attempt = self._attempts.get(key, 0) + 1
        message = Message(
            topic=self.topic.name, consumer=self.consumer_id, sequence=sequence_of(node), body=env.body, id=env.id,
            publisher=env.publisher, timestamp_ms=env.timestamp_ms, content_type=env.content_type,
            headers=env.headers, attempt=attempt, index=index,
        )  # fmt: skip
        try:
            self.callback(message)
        except Exception as exc:
            self.failed_attempts += 1
            options = self.topic.options
            if attempt >= options.max_attempts:
                self._attempts.pop(key, None)
                if options.on_give_up == "keep":
                    log.error(
                        "topic %s: message %s failed %d times (%r); parked", self.topic.name, env.id, attempt, exc
                    )
                    self._park(f"{node}.{index}", encode(env), retry)
                else:
                    log.error(
                        "topic %s: message %s failed %d times (%r); dropped", self.topic.name, env.id, attempt, exc
                    )
                    self.dropped += 1
                return True
            self._attempts[key] = attempt
            self._stop.wait(min(options.retry_backoff * 2 ** (attempt - 1), 5.0))
            return False
        self._attempts.pop(key, None)
        self.delivered += 1
        return True

    def _park(self, node: str, data: bytes, retry: KazooRetry) -> None:
        retry(self.client.ensure_path, self.parked_path, acl=self.topic.acl)
        with contextlib.suppress(NodeExistsError):
            retry(self.client.create, f"{self.parked_path}/{node}", data, acl=self.topic.acl)
        self.parked += 1

    def stop(self) -> None:
        """Stop delivering; the queue and registrations stay until close()/unsubscribe()."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(30)
        self.client.remove_listener(self._on_state)

    def close(self) -> None:
        """Stop and leave the group (the queue stays for a restart within cleaner_grace)."""
        self.stop()
        for membership in reversed(self._memberships):
            membership.leave()
        self._memberships.clear()

    def unsubscribe(self) -> None:
        """Stop, leave, and delete this consumer's queue: no more messages are kept for it."""
        self.close()
        delete_tree(self.client, self.queue_path)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
