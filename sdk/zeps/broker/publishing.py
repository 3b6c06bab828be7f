"""Publishes: the append buffers, idempotent producers, and the flush that journals them.

Idempotent producers (version 6). A session that sent PRODUCE publishes with sequences; the stream's
journal keeps the producer table (:mod:`zeps.journal.producers`) and the broker asks it at once, as
each publish arrives: the leading entries it already holds are dropped (the PING barrier after them
still confirms them), the rest go to the journal with a group mark that records the table's change.
A flush cuts a stream's publishes into groups of about a quarter segment at the ends of idempotent
publishes (a group never spans segments, so this bounds how far a segment overshoots).
A fenced, expired or out-of-sequence publish is refused with INVALID-CODE and not journaled.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from typing import Any

from zeps.broker.appends import AppendBuffer
from zeps.broker.leading import Leading
from zeps.broker.state import Session, Stream
from zeps.journal import JournalWriteError
from zeps.journal.producers import ProducerRefusedError, ProducerState
from zeps.protocol import (
    Produce,
    ProduceOk,
    Publish,
    PublishBatch,
    PublishBatchSeq,
    PublishSeq,
    Refusal,
)

__all__ = ["Publishing"]

log = logging.getLogger(__name__)


class Publishing(Leading):
    """Publishes and producers, journaled by the flush (and, when replicated, confirmed at commit)."""

    def _on_publish_seq(self, session: Session, command: PublishSeq) -> None:
        body = command.body  # the usual frame of every client: one message of an idempotent producer
        if len(body) > self._max_body:
            self._too_large(session, len(body))
            return
        self._publish_seq(session, command.sequence, ((command.key, body),), len(command.key) + len(body))

    def _on_publish_batch_seq(self, session: Session, command: PublishBatchSeq) -> None:
        if len(command.entries) > self._max_body and self._oversized(session, command.items):
            return
        self._publish_seq(session, command.sequence, command.items, len(command.entries))

    def _on_publish(self, session: Session, command: Publish) -> None:
        if len(command.body) > self._max_body:
            self._too_large(session, len(command.body))
            return
        self._append_plain(session, command.key, command.body)

    def _append_plain(self, session: Session, key: str, body: bytes) -> None:
        stream = session.stream
        pending = self._appending(stream)
        pending.add(((key, body),), len(key) + len(body))
        pending.peers.add(session.peer)
        stream.messages_in += 1
        stream.bytes_in += len(body)

    def _on_publish_batch(self, session: Session, command: PublishBatch) -> None:
        stream = session.stream
        if len(command.entries) > self._max_body and self._oversized(session, command.items):
            return
        pending = self._appending(stream)
        pending.add(command.items, len(command.entries))
        pending.peers.add(session.peer)
        stream.messages_in += len(command.items)
        stream.bytes_in += len(command.entries)

    def _write_on_follower(self, session: Session, _command: Any) -> None:
        """A publish or PRODUCE sent to a follower (by a version 8 peer, attached to read): never
        journaled here; NOT_LEADER, and the peer finds the leader."""
        self._forget(session)
        self._invalid(session.peer, f"this broker follows the leader of stream {session.stream.name!r}: it serves "
                      "reads only; publish to the leader (ZooKeeper names it)", Refusal.NOT_LEADER,
                      version=session.conn.version, forget=False)  # fmt: skip

    def _confirm(self, session: Session, frame: bytes) -> None:
        """Send a confirmation (PING-OK, PRODUCE-OK) — a replicated leader's once committed."""
        stream = session.stream
        if stream.leader is None:
            self._send(session.peer, frame)
        else:
            stream.held.append([-1, session.peer, frame])

    def _oversized(self, session: Session, items: tuple[tuple[str, bytes], ...]) -> bool:
        """Whether a batch holds a body over the limit (then refused whole: nothing of it is journaled)."""
        largest = max(len(body) for _, body in items)
        if largest > self.config.max_message_bytes:
            self._too_large(session, largest)
            return True
        return False

    def _too_large(self, session: Session, size: int) -> None:
        session.stream.refused_too_large += 1
        self._invalid(session.peer, f"a message body of {size} bytes is over this stream's limit of "
                      f"{self.config.max_message_bytes} (maxMessageBytes); nothing of the frame was journaled",
                      Refusal.TOO_LARGE, version=session.conn.version, forget=False)  # fmt: skip

    def _appending(self, stream: Stream) -> AppendBuffer:
        pending = self._appends.get(stream.name)
        if pending is None:
            pending = self._appends[stream.name] = AppendBuffer(stream.journal.config.segment_bytes // 4)
        return pending

    def _produce(self, session: Session, command: Produce) -> None:
        try:
            producer, changed = session.stream.journal.producers.claim(command.producer, command.epoch,
                                                                       self._stream_ms(session.stream),
                                                                       command.generation)  # fmt: skip
        except ProducerRefusedError as exc:
            self._invalid(session.peer, str(exc), _REFUSALS[exc.reason], version=session.conn.version, forget=False)
            return
        if changed:  # a new producer or epoch: journaled (a group mark with no record) before PRODUCE-OK goes
            pending = self._appending(session.stream)
            pending.changes[command.producer] = session.stream.journal.producers.producers[command.producer]
            pending.peers.add(session.peer)
        session.producer, session.epoch = command.producer, producer.epoch
        answer = ProduceOk(epoch=producer.epoch, sequence=producer.sequence, base=producer.base)
        self._confirm(session, session.conn.send(answer))

    def _stream_ms(self, stream: Stream) -> int:
        """A producer's last activity, in the stream's time: this broker's clock, never behind the
        stream's newest stamp (the journal stamps no record earlier than the one before it). Producers
        expire by the stream's time (:meth:`tick`); a clock stepped back must not make a producer
        publishing now look idle since then."""
        return max(self._clock_ms, stream.journal.last_timestamp_ms)

    def _publish_seq(self, session: Session, first: int, items: tuple[tuple[str, bytes], ...], size: int) -> None:
        """An idempotent producer's publishes: journal the ones the journal does not hold yet."""
        stream = session.stream
        if session.producer is None:
            self._invalid(session.peer, "PUBLISH-SEQ and PUBLISH-BATCH-SEQ need a PRODUCE first", Refusal.BAD_FRAME,
                          version=session.conn.version, forget=False)  # fmt: skip
            return
        table = stream.journal.producers
        known = table.producers.get(session.producer)
        if known is not None and known.epoch == session.epoch and first == known.sequence + 1:  # the usual case
            known.sequence = first + len(items) - 1  # in place: two stores, frozen when its group closes
            known.seen_ms = self._stream_ms(stream)
            pending = self._appending(stream)
            pending.changes[session.producer] = known  # before add(): a group it closes holds the change
            pending.add(items, size)
            pending.peers.add(session.peer)
            stream.messages_in += len(items)
            stream.bytes_in += size
            return
        try:
            held = table.admit(session.producer, session.epoch, first, len(items), self._stream_ms(stream))
        except ProducerRefusedError as exc:
            self._invalid(session.peer, str(exc), _REFUSALS[exc.reason], version=session.conn.version, forget=False)
            return
        stream.duplicates += held
        if held < len(items):
            fresh = items[held:]
            size = sum(len(key) + len(body) + 5 for key, body in fresh)
            pending = self._appending(stream)
            pending.changes[session.producer] = table.producers[session.producer]
            pending.add(fresh, size)
            pending.peers.add(session.peer)
            stream.messages_in += len(fresh)
            stream.bytes_in += size

    def flush_appends(self, *, idle: bool = True, now: float | None = None) -> None:
        """Write buffered publishes to the journals, apply the fsync policy, and route what became
        durable to live subscriptions."""
        self._clock_ms = self.wall_ms()
        now = time.monotonic() if now is None else now
        for name, pending in self._appends.items():
            stream = self.streams[name]
            if stream.leader is not None and not self._replicated_enough(stream, pending):
                continue
            if stream.tier_behind:  # the volume keeps what the store lacks: not without bound
                stream.refused_tier_behind += len(pending.entries)
                reason = (f"stream {stream.name}: {stream.tier_behind}; publishes since this peering's last "
                          "confirmation were not journaled: attach again and resend them")  # fmt: skip
                self._refuse(stream, pending, reason, Refusal.JOURNAL_FULL)
                continue
            try:
                pending.write_to(stream.journal, self._clock_ms)
            except JournalWriteError as exc:
                if not exc.space:  # not a full volume: a broken disk, fatal (the broker exits non-zero)
                    self._appends.clear()  # none of it was confirmed; closing must not try it again
                    raise
                self._refuse_writes(stream, pending, exc)
        self._appends.clear()
        for stream in self.streams.values():
            stream.journal.maybe_sync(idle=idle)
            if stream.leader is not None:
                self._replicate(stream, now)
            self._route(stream)

    def _replicated_enough(self, stream: Stream, pending: AppendBuffer) -> bool:
        """Whether a replicated leader takes the flush's publishes: not while fewer replicas than
        minInSync are in sync, unless the stream waits for them (``under_replicated: wait``)."""
        leader = stream.leader
        assert leader is not None
        if not leader.under_replicated or self.config.under_replicated == "wait":
            return True
        reason = (f"stream {stream.name}: {len(leader.isr)} of its replicas are in sync, fewer than minInSync "
                  f"({leader.min_insync}); publishes since this peering's last confirmation were not journaled: "
                  "attach again and resend them")  # fmt: skip
        stream.refused_under_replicated += len(pending.entries)
        self._refuse(stream, pending, reason, Refusal.NOT_ENOUGH_REPLICAS)
        return False

    def _refuse_writes(self, stream: Stream, pending: AppendBuffer, exc: JournalWriteError) -> None:
        """The journal's volume is full: the flush's publishes are refused, never confirmed. The
        journal undid the failed append; the producer table goes back to what the journal holds; the
        publishers lose the PING-OKs and PRODUCE-OKs queued for them in this loop (their barriers
        cover refused publishes), get JOURNAL_FULL, and are forgotten (their claims may be undone), so
        they attach again and resend. Publishes of groups written before the failure may come again:
        an idempotent producer's are dropped as duplicates, plain ones are at-least-once anyway."""
        stream.refused_journal_full += len(pending.entries)
        reason = (f"stream {stream.name}: its journal's volume is full ({exc.args[0]}); publishes since this "
                  "peering's last confirmation were not journaled: attach again and resend them")  # fmt: skip
        self._refuse(stream, pending, reason, Refusal.JOURNAL_FULL)
        now = time.monotonic()
        if now - stream.journal_full_logged >= 60:
            stream.journal_full_logged = now
            log.error("%s: refusing publishes (%d so far; retention or a larger volume makes room)", exc,
                      stream.refused_journal_full)  # fmt: skip

    def _refuse(self, stream: Stream, pending: AppendBuffer, reason: str, code: Refusal) -> None:
        """Refuse a flush's publishes (none was journaled): the producer table goes back to what the
        journal holds, and the publishers lose the confirmations queued for them in this loop (their
        barriers cover refused publishes), get ``code`` and are forgotten, so they attach again and resend."""
        table, journaled = stream.journal.producers, stream.journal.journaled
        for name in pending.producers_changed():
            if name in journaled:
                table.producers[name] = ProducerState(*journaled[name])
            else:
                table.producers.pop(name, None)
        self._pending = deque(o for o in self._pending if o.subscription is not None or o.peer not in pending.peers)
        for peer in pending.peers:
            session = self.sessions.get(peer)
            version = session.conn.version if session is not None else 0
            if session is not None:
                self._forget(session)
            self._invalid(peer, reason, code, version=version, forget=False)


_REFUSALS = {"fenced": Refusal.FENCED, "unknown": Refusal.PRODUCER_UNKNOWN, "out-of-sequence": Refusal.OUT_OF_SEQUENCE,
             "full": Refusal.PRODUCER_LIMIT}  # fmt: skip
