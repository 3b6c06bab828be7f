"""The broker's logic without sockets: sessions, streams, routing, credit, replay, heartbeats.

The network adapter (:mod:`zeps.broker.server`) feeds frames in (:meth:`BrokerCore.receive`),
asks for work (:meth:`BrokerCore.pump`), and sends what comes out — and tells the core when a send
could not be made (:meth:`BrokerCore.unsent`), which rewinds that subscription as if it had no credit.

The core is built in layers, one concept a module (:mod:`zeps.broker.state` lists them): this one
holds the peer's state machine (ATTACH, the table of an attached session's commands), the
journals' opening and closing, and time (heartbeats, retention, producers' expiry). What happens to
each command is in the layer of its concept: :mod:`~zeps.broker.routing` (SUBSCRIBE, FETCH, CREDIT's
effect), :mod:`~zeps.broker.publishing` (the publishes, PRODUCE), :mod:`~zeps.broker.leading`
(REPLICA-FETCH, REPLICA-EPOCH).
"""

from __future__ import annotations

import contextlib
import logging
import re
import time
from collections.abc import Callable
from typing import Any

from zeps.broker.config import BrokerConfig
from zeps.broker.publishing import Publishing
from zeps.broker.state import Outgoing, Session, Stream
from zeps.errors import ProtocolError
from zeps.journal import Journal
from zeps.protocol import (
    Attach,
    AttachOk,
    Connection,
    Credit,
    Detach,
    DetachOk,
    Fetch,
    Ping,
    PingOk,
    Produce,
    Publish,
    PublishBatch,
    PublishBatchSeq,
    PublishSeq,
    Refusal,
    ReplicaEpoch,
    ReplicaFetch,
    Subscribe,
    SubscribeTime,
    decode,
    publish_fields,
    publish_seq_fields,
    stays_attached,
)
from zeps.protocol.commands import PROTOCOL, SIGNATURE
from zeps.protocol.connection import SUPPORTED_VERSIONS
from zeps.replication.follower import REPLICATION_VERSION

__all__ = ["BrokerConfig", "BrokerCore", "Outgoing"]

#: PUBLISH-SEQ and PUBLISH, the frames of a client publishing one message at a time (idempotent or
#: not), skip the state machine's objects when it would take them (an attached session of a version
#: that has them): command id -> the version from which it may
_ONE_MESSAGE = {c.ID: v for c in (PublishSeq, Publish) if (v := stays_attached("broker", "receive", c)) is not None}

log = logging.getLogger(__name__)

_STREAM_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


class BrokerCore(Publishing):
    """The broker's logic: every layer of it (see the module's notes); single-threaded."""

    def __init__(self, config: BrokerConfig, *, wall_ms: Callable[[], int] | None = None) -> None:
        super().__init__(config, wall_ms=wall_ms)
        # what an attached session's commands do, by type (ATTACH comes before a session exists)
        self._handlers: dict[type, Callable[[Session, Any], None]] = {
            PublishSeq: self._on_publish_seq, PublishBatchSeq: self._on_publish_batch_seq,
            Publish: self._on_publish, PublishBatch: self._on_publish_batch, Produce: self._produce,
            Credit: self._on_credit, Subscribe: self._subscribe, SubscribeTime: self._subscribe, Fetch: self._fetch,
            Ping: self._on_ping, Detach: self._on_detach, ReplicaFetch: self._on_replica_fetch,
            ReplicaEpoch: self._on_replica_epoch,
        }  # fmt: skip
        #: a follower's: the same, but writes get NOT_LEADER (only the leader journals publishes)
        self._following_handlers = {**self._handlers, **dict.fromkeys(
            (PublishSeq, PublishBatchSeq, Publish, PublishBatch, Produce), self._write_on_follower)}  # fmt: skip

    def open(self) -> BrokerCore:
        for name in self.config.streams:
            if not _STREAM_NAME.match(name):
                raise ValueError(f"stream name {name!r} is not valid (lower-case letters, digits, '-', '.')")
            journal = Journal(self.config.data_dir / name, self.config.journal, name=name).open()
            stream = self.streams[name] = Stream(name, journal, routed=journal.durable)
            if self.config.replicated:
                checkpoint = journal.checkpoint
                # a journal never replicated (no epochs, no checkpoint) was a lone broker's: all of it confirmed
                known = checkpoint.exists or bool(journal.epochs.entries)
                stream.routed = stream.commit = min(journal.durable, checkpoint.sequence if known else journal.durable)
                stream.following = True
                log.info("stream %s: a replica whose journal ends at %d, committed up to %d", name, journal.written,
                         stream.routed)  # fmt: skip
        return self

    def close(self) -> None:
        self.flush_appends()
        for stream in self.streams.values():
            self._save_checkpoint(stream)
            stream.journal.close()

    def receive(self, peer: bytes, frame: bytes, now: float | None = None) -> None:
        """Handle one frame from ``peer``. Bad input gets INVALID; other peers are unaffected."""
        now = time.monotonic() if now is None else now
        session = self.sessions.get(peer)
        if (
            session is not None
            and len(frame) > 2
            and session.conn.version >= _ONE_MESSAGE.get(frame[2], 1 << 30)
            and session.conn.state == "ATTACHED"
            and frame[:2] == SIGNATURE
            and not session.stream.following
            and self._one_message(session, frame, now)
        ):
            return
        key = self.peer_keys.pop(peer, None) if session is None and self.peer_keys else None
        conn = session.conn if session else Connection("broker")
        try:
            command = conn.receive(frame)
        except ProtocolError as exc:
            self.invalid_frames += 1
            code, asked = Refusal.BAD_FRAME, session.conn.version if session else 0
            if session is None:  # an ATTACH refused by the state machine says what its sender reads
                with contextlib.suppress(ProtocolError):
                    attach = decode(frame)
                    if isinstance(attach, Attach):
                        asked = attach.version
                        if attach.protocol == PROTOCOL and attach.version not in SUPPORTED_VERSIONS:
                            code = Refusal.VERSION_UNSUPPORTED
            self._invalid(peer, str(exc), code, version=asked, forget=session is None)
            return
        if session is not None:
            session.last_heard = now
        if isinstance(command, Attach):
            self._attach(peer, conn, command, now, key)
            return
        assert session is not None  # the state machine only allows other commands after ATTACH
        handlers = self._following_handlers if session.stream.following else self._handlers
        handler = handlers.get(type(command))  # a table: one lookup, whatever the command
        if handler is not None:
            handler(session, command)

    def _one_message(self, session: Session, frame: bytes, now: float) -> bool:
        """A PUBLISH-SEQ or PUBLISH of an attached session, as :meth:`receive` would handle it (the
        state machine keeps the session attached), without a command object; False if the frame is
        malformed, for the general path to refuse it with its reason."""
        try:
            if frame[2] == PublishSeq.ID:
                sequence, key, body = publish_seq_fields(frame)
            else:
                sequence, (key, body) = -1, publish_fields(frame)
        except ProtocolError:
            return False
        session.last_heard = now
        if len(body) > self._max_body:
            self._too_large(session, len(body))
        elif sequence >= 0:
            self._publish_seq(session, sequence, ((key, body),), len(key) + len(body))
        else:
            self._append_plain(session, key, body)
        return True

    def _on_credit(self, session: Session, command: Credit) -> None:
        session.credit = min(session.credit + command.credit, self.config.max_credit_bytes)
        session.blocked_until = 0.0
        self._resume(session)

    def _on_ping(self, session: Session, _command: Ping) -> None:
        self._confirm(session, session.conn.send(PingOk()))

    def _on_detach(self, session: Session, _command: Detach) -> None:
        self._send(session.peer, session.conn.send(DetachOk()))
        self._forget(session)

    def _attach(self, peer: bytes, conn: Connection, command: Attach, now: float, key: str | None = None) -> None:
        if self.authorized is not None and key not in self.authorized:
            self._invalid(peer, "this client's CURVE key is not (or no longer) among the stream's clients",
                          Refusal.UNAUTHORIZED, version=command.version, forget=True)  # fmt: skip
            return
        stream = self.streams.get(command.stream)
        if stream is None:
            self._invalid(peer, f"stream {command.stream!r} is not served by this broker", Refusal.STREAM_UNKNOWN,
                          version=command.version, forget=True)  # fmt: skip
            return
        if len(self.sessions) >= self.config.max_sessions:
            self._invalid(peer, "broker is at its session limit; try again later", Refusal.BUSY,
                          version=command.version, forget=True)  # fmt: skip
            return
        if (why := self._over_memory()) is not None:
            self._invalid(peer, why, Refusal.BUSY, version=command.version, forget=True)
            return
        if stream.following and command.version < REPLICATION_VERSION:
            self._invalid(peer, f"this broker follows the leader of stream {stream.name!r}: attach to the leader "
                          "(ZooKeeper names it)", Refusal.NOT_LEADER, version=command.version, forget=True)  # fmt: skip
            return
        self.sessions[peer] = Session(peer, conn, stream, last_heard=now, last_ping=now, key=key)
        self._send(peer, conn.send(AttachOk()))

    def authorize(self, keys: frozenset[str]) -> None:
        """The client keys admitted from now on: attached sessions whose key is no longer among them
        are forgotten at once and told so (UNAUTHORIZED); their connections' next ATTACH is refused."""
        self.authorized = keys
        for session in [s for s in self.sessions.values() if s.key not in keys]:
            self._forget(session)
            self._invalid(session.peer, "this client's CURVE key was revoked: it is no longer among the stream's "
                          "clients", Refusal.UNAUTHORIZED, version=session.conn.version, forget=False)  # fmt: skip

    @property
    def busy(self) -> bool:
        """Work waits that a loop should come back for soon (a millisecond, not a tick): subscriptions
        behind, publishes not yet written, records gathered for the multicast group, reads of the
        object store under way."""
        return bool(self._lagging or self._appends or self.multicast_pending or self._tier_pending)

    @property
    def held(self) -> int:
        """Sessions whose deliveries wait for their bytes in flight to leave (the adapter looks for that
        more often while there are any)."""
        return len(self._held)

    def tick(self, now: float | None = None) -> None:
        """Heartbeats: PING peers silent for heartbeat_s; forget those silent for ttl_s."""
        now = time.monotonic() if now is None else now
        self._clock_ms = self.wall_ms()
        for session in list(self.sessions.values()):
            silent = now - session.last_heard
            if silent > self.config.ttl_s:
                log.info("peer %s silent for %.0fs: forgetting it", session.peer.hex(), silent)
                self._forget(session)
            elif silent > self.config.heartbeat_s and now - session.last_ping > self.config.heartbeat_s:
                session.last_ping = now
                self._send(session.peer, session.conn.send(Ping()))
        for stream in self.streams.values():
            # a tiered stream's: only what the object store holds (TierTask.tiered_to, from the adapter)
            stream.journal.apply_retention(tiered_to=self.tiered_to.get(stream.name))
            # the stream's own time (its newest record's stamp), not this broker's clock: every replica
            # forgets an idle producer at the same point of the journal, whatever its clock says
            stream.journal.expire_producers(stream.journal.last_timestamp_ms)
            self._save_checkpoint(stream)

    def disconnected(self, peer: bytes) -> None:
        """The adapter learnt the peer is gone (unroutable): free its state now."""
        session = self.sessions.get(peer)
        if session is not None:
            self._forget(session)
