"""A replicated stream's leader, and a follower's commit point: the broker's side of :mod:`zeps.replication`.

Replication (version 8; :mod:`zeps.replication`, :mod:`zeps.broker.replica`). The replica's state
machine tells the core who leads (:meth:`BrokerCore.lead`, :meth:`BrokerCore.follow`), as ZooKeeper decides. A
leader answers its followers' REPLICA-FETCH with its segment bytes, holds PING-OK and PRODUCE-OK
until the in-sync replicas have the records durably, and routes only up to that commit point. A
follower's journal is written by its copy of the leader's (:meth:`BrokerCore.copied`); it refuses
clients that attach with a version below 8 (NOT_LEADER) and serves those of version 8 reads only
(SUBSCRIBE, FETCH: replay load taken off the leader), up to the leader's commit point as it last
heard it, never beyond what it holds durably; their publishes get NOT_LEADER. A replica's core
(``BrokerConfig.replicated``) starts from its journal's commit checkpoint, never its journal's end
(:mod:`zeps.journal.checkpoint`), and saves it once a second and at close.
"""

from __future__ import annotations

import errno
import logging
import time

import crc32c

from zeps.broker.routing import Routing
from zeps.broker.state import Outgoing, Session, Stream
from zeps.journal import ReplicaSlice
from zeps.journal.producers import ProducerState
from zeps.protocol import (
    Refusal,
    ReplicaData,
    ReplicaEpoch,
    ReplicaEpochEnd,
    ReplicaFetch,
)
from zeps.replication.follower import GAPPED, encode_epochs
from zeps.replication.isr import Leadership

__all__ = ["Leading"]

log = logging.getLogger(__name__)


class Leading(Routing):
    """A replicated stream's leader (and a follower's commit point), on top of routing."""

    def _save_checkpoint(self, stream: Stream) -> None:
        """A replica's commit checkpoint, up to what it knows committed (lagging it is safe; see
        :mod:`zeps.journal.checkpoint`). Written once a second at most (``tick``), and at close."""
        if self.config.replicated:
            checkpoint = stream.journal.checkpoint
            checkpoint.advance(stream.committed)
            if checkpoint.dirty:
                try:
                    checkpoint.save()
                except OSError as exc:
                    if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                        raise  # a broken disk: fatal
                    # a full volume: the file keeps an older commit point, which is safe (it may lag,
                    # never lead); written at a later tick, once there is space
                    now = time.monotonic()
                    if now - stream.checkpoint_full_logged >= 60:
                        stream.checkpoint_full_logged = now
                        log.warning("stream %s: the commit checkpoint stays at %d (%s)", stream.name,
                                    checkpoint.saved, exc)  # fmt: skip

    def lead(self, name: str, *, me: str, epoch: int, isr: frozenset[str], min_insync: int, now: float | None = None,
             data: bool = True, **tuning: float) -> None:  # fmt: skip
        """This broker leads ``name`` from now on, in ``epoch`` (ZooKeeper raised it): its journal's epoch
        history gets an entry, and confirmations wait for the in-sync replicas. What it confirms starts
        from what it knows committed (its checkpoint, or what the leader it followed said), not from its
        journal's end: its tail counts once the in-sync set holds it in this epoch. ``data``: the state
        says the stream may hold committed records (else nothing is committed until it does)."""
        stream = self.streams[name]
        journal = stream.journal
        journal.sync()
        if epoch > journal.epochs.latest:
            journal.epochs.begin(epoch, journal.next_sequence)
        now = time.monotonic() if now is None else now
        known = max(journal.checkpoint.sequence, stream.routed, stream.commit if stream.following else 0)
        commit = min(known, journal.durable)
        stream.leader = Leadership.begin(me, epoch, isr, min_insync=min_insync, commit=commit,
                                         log_end=journal.written, now=now, data=data, **tuning)  # fmt: skip
        stream.following = False
        log.info("stream %s: leading in epoch %d from sequence %d (in sync: %s; committed up to %d)", name, epoch,
                 journal.next_sequence, ", ".join(sorted(stream.leader.isr)), commit)  # fmt: skip

    def follow(self, name: str) -> None:
        """This broker follows the leader of ``name`` (or waits for one). Coming from leading (or from
        serving alone), its client sessions are forgotten and told NOT_LEADER (they find the leader
        and resend what was not confirmed), and nothing held is confirmed; a follower following a new
        leader keeps its readers (what it routed to them was committed: every leader holds it)."""
        stream = self.streams[name]
        if stream.following:
            return
        self._save_checkpoint(stream)  # a leader's commit point was true: kept before it steps down
        stream.commit = stream.routed  # nothing beyond what was routed until a leader says so
        stream.leader, stream.following = None, True
        stream.held.clear()
        stream.waiting.clear()
        if self._appends.pop(name, None) is not None:  # publishes never written: the table forgets them too
            journal = stream.journal
            journal.producers.producers = {n: ProducerState(*p) for n, p in journal.journaled.items()}
        for session in [s for s in self.sessions.values() if s.stream is stream]:
            self._forget(session)
            self._invalid(session.peer, f"this broker no longer leads stream {name!r}: attach to the leader",
                          Refusal.NOT_LEADER, version=session.conn.version, forget=False)  # fmt: skip

    def copied(self, name: str, commit: int) -> None:
        """A follower's copy went on; the leader's commit point is ``commit``: its readers get what it
        holds durably up to there (and this broker starts confirming from there if it is elected)."""
        stream = self.streams[name]
        if not stream.following:
            return  # elected meanwhile: its own commit point counts
        stream.commit = max(stream.commit, commit)
        written = stream.journal.written
        if stream.routed > written:  # the copy was cut below what was delivered: the protocol never does this
            log.error("stream %s: the copy was cut to %d, below %d already delivered", name, written, stream.routed)
            stream.routed = stream.commit = written
        stream.routed = max(stream.routed, stream.journal.first_sequence - 1)  # a copy begun afresh at the
        self._route(stream)  # leader's oldest record has nothing before it to route

    def isr_requests(self, now: float | None = None) -> list[tuple[str, int, frozenset[str]]]:
        """(stream, epoch, in-sync set) to write to ZooKeeper: the leaders' sets as they should be now."""
        now = time.monotonic() if now is None else now
        out = []
        for stream in self.streams.values():
            leader = stream.leader
            if leader is not None and (isr := leader.wanted(stream.journal.durable, now)) is not None:
                out.append((stream.name, leader.epoch, isr))
        return out

    def data_requests(self, now: float | None = None) -> list[tuple[str, int]]:
        """(stream, epoch) whose state must say that the stream holds data before its leader commits."""
        now = time.monotonic() if now is None else now
        return [(stream.name, stream.leader.epoch) for stream in self.streams.values()
                if stream.leader is not None and stream.leader.data_wanted(stream.journal.durable, now)]  # fmt: skip

    def isr_written(self, name: str, epoch: int, isr: frozenset[str], *, data: bool = True) -> None:
        """ZooKeeper holds ``isr`` (and ``data``) for the leader of ``epoch`` (ignored if this broker no
        longer leads it)."""
        leader = self.streams[name].leader
        if leader is not None and leader.epoch == epoch:
            leader.data = leader.data or data
            leader.isr_written(isr)
            log.info("stream %s: in sync now: %s", name, ", ".join(sorted(isr)))
            if leader.under_replicated and self.config.under_replicated == "refuse":
                self._refuse_held(self.streams[name])

    def _refuse_held(self, stream: Stream) -> None:
        """Too few replicas in sync: confirmations still held will not come; their publishers are told."""
        peers = {peer for _, peer, _ in stream.held}
        stream.held.clear()
        for peer in peers:
            session = self.sessions.get(peer)
            if session is not None:
                self._forget(session)
                self._invalid(peer, f"stream {stream.name}: fewer replicas than minInSync are in sync; publishes "
                              "since this peering's last confirmation are not confirmed: attach again and resend "
                              "them", Refusal.NOT_ENOUGH_REPLICAS, version=session.conn.version,
                              forget=False)  # fmt: skip

    def _on_replica_fetch(self, session: Session, command: ReplicaFetch) -> None:
        stream, now = session.stream, session.last_heard  # the time receive() was given
        leader = stream.leader
        if leader is None or command.epoch != leader.epoch:
            self._not_leader(session, command.epoch)
            return
        members, keys, known = self.replica_members, self.replica_keys, session.replica
        if (
            (members is not None and command.replica not in members)
            or (keys is not None and (session.key is None or keys.get(command.replica) != session.key))
            or (known and known != command.replica)
        ):
            # a peer that is none of the stream's replicas, or one peering speaking for two: its
            # acknowledgements would count for minInSync (records confirmed that no replica holds)
            self._forget(session)
            self._invalid(session.peer, f"replica {command.replica!r} is not one of stream {stream.name!r}'s "
                          "replicas (its manifest), its key is not that replica's, or this peering fetched as another",
                          Refusal.UNAUTHORIZED,
                          version=session.conn.version, forget=False)  # fmt: skip
            return
        session.replica = command.replica
        leader.fetched(command.replica, command.durable, stream.journal.durable, now)
        stream.waiting[session.peer] = (command, now)

    def _on_replica_epoch(self, session: Session, command: ReplicaEpoch) -> None:
        stream = session.stream
        leader = stream.leader
        if leader is None or command.epoch != leader.epoch:
            self._not_leader(session, command.epoch)
            return
        found, end = stream.journal.epochs.end_of(command.asked, stream.journal.written)
        self._send(session.peer, session.conn.send(ReplicaEpochEnd(epoch=leader.epoch, found=found, end=end)))

    def _not_leader(self, session: Session, epoch: int) -> None:
        leader = session.stream.leader
        mine = f"it leads epoch {leader.epoch}" if leader is not None else "it does not lead"
        self._forget(session)
        self._invalid(session.peer, f"not the leader of epoch {epoch} of stream {session.stream.name!r} ({mine})",
                      Refusal.NOT_LEADER, version=session.conn.version, forget=False)  # fmt: skip

    def _replicate(self, stream: Stream, now: float) -> None:
        """A leader's turn: answer the followers' fetches that have data (or waited a heartbeat), move
        the commit point, and release the confirmations it covers."""
        leader, journal = stream.leader, stream.journal
        assert leader is not None
        for held in stream.held:
            if held[0] < 0:  # everything the peer published before it is written now
                held[0] = journal.written
        for peer, (fetch, since) in list(stream.waiting.items()):
            session = self.sessions.get(peer)
            if session is None:
                del stream.waiting[peer]
                continue
            more = journal.replica_has_more(fetch.base, fetch.offset, fetch.last)
            if not more and now - since < leader.heartbeat_s:
                continue
            room = self._flight_room(session)  # an answer is cut to it: past the shared budget, a small one
            if room <= 0:
                self._held[peer] = None  # its earlier answers are not out yet: this one waits for them (a
                continue  # peer that fetches again and again, reading nothing, holds its window at most)
            most = min(fetch.most, self.config.replica_fetch_bytes, room)
            window = self._catchup_window(stream, fetch.replica, now)
            if window is not None and window[1] <= 0:  # this second's bytes are spent: the rest in the next
                if now - since < leader.heartbeat_s:
                    continue
                part = ReplicaSlice(fetch.base, fetch.offset, b"")  # a heartbeat: nothing more yet
            else:
                if window is not None:
                    most = min(most, int(window[1]))
                part = journal.replica_read(fetch.base, fetch.offset, fetch.last, most)
                if window is not None:
                    window[1] -= len(part.data)
            epochs = encode_epochs(journal.epochs.newer_than(fetch.known))
            crc = crc32c.crc32c(part.data, crc32c.crc32c(part.marks, crc32c.crc32c(part.starts)))
            reset = GAPPED if part.gapped else int(part.reset)
            answer = ReplicaData(epoch=leader.epoch, base=part.base, offset=part.offset, next=part.next_base,
                                 commit=leader.commit, reset=reset, epochs=epochs, crc=crc,
                                 index=part.starts, marks=part.marks, data=part.data)  # fmt: skip
            frame = session.conn.send(answer)
            session.in_flight += len(frame)  # counted as a delivery is (see zeps.broker.routing)
            self.bytes_in_flight += len(frame)
            self._pending.append(Outgoing(peer, frame, cost=len(frame), session=session))
            del stream.waiting[peer]
        commit = leader.advance(journal.durable)
        while stream.held and stream.held[0][0] <= commit:
            _, peer, frame = stream.held.popleft()
            self._send(peer, frame)

    def _catchup_window(self, stream: Stream, replica: str, now: float) -> list[float] | None:
        """A follower catching up (not in sync) under ``replica_catchup_bytes_per_s``: [when this second
        began, the bytes it may still get in it]; None when it is not limited."""
        rate, leader = self.config.replica_catchup_bytes_per_s, stream.leader
        if not rate or leader is None or replica in leader.isr:
            stream.catchup.pop(replica, None)
            return None
        window = stream.catchup.setdefault(replica, [now, float(rate)])
        if now - window[0] >= 1.0:
            window[0], window[1] = now, float(rate)
        return window
