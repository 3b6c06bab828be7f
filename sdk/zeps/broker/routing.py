"""The broker's routing: subscriptions and fetches, live routing, replay and delivery under credit.

Routing. Each subscription has a cursor: the next sequence it will consider. A subscription whose
cursor is at the journal's durable tail is *live*: newly durable records are routed to it at once
(a prefix trie, plus the few regular-expression subscriptions). One that is behind — a late joiner,
or one that ran out of credit — *replays* from the journal with the same filter until it reaches
the tail, and then is live again. Live delivery is replay at the tail, so the switch is invisible.

Frames. Routing and replay work on journal chunks (runs of records as stored), not single records.
A version 3 session gets each run it matches as one DELIVER-BATCH — the journal's bytes as they are,
or the matching records cut out of them — so a message costs the broker almost nothing beyond its
journal write; a version 4 session gets the same bytes as DELIVER-RUN, with the run's index and one
CRC32C (computed in C per frame), so the client checks a run at once; older sessions get one
DELIVER (-TS) per record from the same chunks.

Credit. A delivery costs its frame's size. With too little credit a subscription stops and
keeps its cursor; CREDIT resumes it at once. A session's credit is shared by its subscriptions.

Bytes in flight. Credit is what a peer says it can take, and a peer may say anything: one that
grants credit and reads nothing would have the broker queue all of it in its socket. So deliveries
handed to the socket count as *in flight* until the adapter learns that ZeroMQ wrote them out of this
process (:meth:`Routing.released`; what the peer's connection reads is the only proof), and a
session's deliveries also stop at ``max_session_bytes_in_flight``, all sessions' together at
``max_bytes_in_flight``. A session stopped so goes on once bytes leave. A session with nothing in
flight may always send one frame: as large as the shared budget's room (a record larger than the
window still goes, alone), and of :data:`RESERVE_BYTES` past it, so that peers reading nothing,
holding the whole budget, cannot stop those that read (and each holds that much past it at most).
A session that goes keeps counting until its bytes leave (ZeroMQ frees them when the connection
closes): ZeroMQ's queue for a peer outlives its session.

Fairness and memory. ``pump`` hands out at most ``pump_budget_bytes`` per call, visiting lagging
subscriptions round-robin, and never reads more than one journal batch per subscription per visit.
Sessions, subscriptions per session and pattern sizes are bounded.

Fetches (version 7). FETCH is a subscription with an end: it replays the records of its range that
match its pattern, never goes live, and ends with FETCH-END once everything in the range was handed
to the adapter (a delivery or FETCH-END the adapter could not send reopens it, as for any replay).

Multicast output (version 7, ``multicast_heartbeat_s`` set). Every record that becomes durable is
also sent once to the multicast group (:meth:`BrokerCore.take_multicast`), whatever the
subscriptions: the broker's work per record does not depend on how many receivers there are. Runs
gather for ``multicast_linger_s`` (5 ms) or until they fill a message, so a trickle of publishes
does not become a packet each.
A stream that sent nothing for a heartbeat sends TAIL (its last durable sequence), so a receiver
learns of the records it lost even when nothing follows them.
"""

from __future__ import annotations

import bisect
import itertools
import time
from array import array
from collections import deque

from zeps.broker.matching import Matcher, PatternError, compile_pattern
from zeps.broker.state import BrokerState, Outgoing, Session, Stream, Subscription, TierRead
from zeps.journal import Chunk
from zeps.protocol import (
    LATEST,
    Fetch,
    FetchEnd,
    Refusal,
    Subscribe,
    SubscribeOk,
    SubscribeTime,
    encode_deliver,
    encode_deliver_batch,
    encode_deliver_run,
    run_index,
)

__all__ = ["RESERVE_BYTES", "Routing"]


#: what a session with nothing in flight may still be sent when the shared bytes-in-flight budget is
#: spent (see the module's notes)
RESERVE_BYTES = 64 << 10


class Routing(BrokerState):
    """A broker's readers: subscriptions and fetches, routed live or replayed from the journal."""

    def _subscribe(self, session: Session, command: Subscribe | SubscribeTime) -> None:
        if len(session.subscriptions) >= self.config.max_subscriptions:
            self._invalid(session.peer, f"at most {self.config.max_subscriptions} subscriptions per peering",
                          Refusal.LIMIT, version=session.conn.version, forget=False)  # fmt: skip
            return
        matcher = self._matcher(session, command.pattern)
        if matcher is None or not self._within_budget(session, matcher):
            return
        since_ms = 0
        if isinstance(command, SubscribeTime):
            cursor, since_ms = self._seek_time(session.stream, command.since)
        elif command.latest == LATEST:
            cursor = session.stream.routed + 1
        else:
            cursor = self._oldest_served(session.stream, command.latest + 1)
        sub = Subscription(session, matcher, cursor, next(self._ids), since_ms=since_ms)
        self._add_subscription(sub)
        self._send(session.peer, session.conn.send(SubscribeOk()))
        if cursor > session.stream.routed:
            self._go_live(sub)
        else:
            self._lagging.append(sub)

    def _within_budget(self, session: Session, matcher: Matcher) -> bool:
        """Whether the broker-wide budgets take one more subscription (or fetch) of ``matcher``; if
        not, the peer is told (LIMIT) and nothing of it is kept."""
        config = self.config
        if (memory := self._over_memory()) is not None:
            why = memory
        elif self.subscription_count >= config.max_total_subscriptions:
            why = (f"the broker holds {self.subscription_count} subscriptions across its peerings, its limit "
                   "(max_total_subscriptions); try again later")  # fmt: skip
        elif matcher.regex is not None and self.regex_subscriptions >= config.max_regex_subscriptions:
            why = (f"the broker holds {self.regex_subscriptions} regular-expression subscriptions, its limit "
                   "(max_regex_subscriptions: each runs against every record); subscribe by key prefix, or "
                   "try again later")  # fmt: skip
        else:
            return True
        self._invalid(session.peer, why, Refusal.LIMIT, version=session.conn.version, forget=False)
        return False

    def _add_subscription(self, sub: Subscription) -> None:
        sub.session.subscriptions.append(sub)
        self.subscription_count += 1
        self.regex_subscriptions += sub.matcher.regex is not None

    def _oldest_served(self, stream: Stream, asked: int) -> int:
        """Where a replay asked from ``asked`` starts: there, where the object store may hold it (a
        tiered stream's; the store's answer moves it on if not), else at the journal's first record."""
        return max(asked, 1) if stream.name in self.tier_reads else max(asked, stream.journal.first_sequence)

    def _seek_time(self, stream: Stream, since_ms: int) -> tuple[int, int]:
        """Where a replay from ``since_ms`` starts, and the time the object store is to be asked about
        (0: not): the journal's first record at or after it, or, on a tiered stream whose volume starts
        at or after that time, the store's oldest (the store's answer then moves it to its own first
        record at or after the time)."""
        journal = stream.journal
        at = journal.seek_time(since_ms)
        if stream.name in self.tier_reads and at <= journal.first_sequence:
            return 1, since_ms
        return at, 0

    def _remove_subscription(self, sub: Subscription) -> None:
        sub.session.subscriptions.remove(sub)
        self.subscription_count -= 1
        self.regex_subscriptions -= sub.matcher.regex is not None

    def _matcher(self, session: Session, pattern: str) -> Matcher | None:
        """The matcher of a subscription's or a fetch's ``pattern``; None (and INVALID) if refused."""
        try:
            return compile_pattern(pattern, allow_regex=self.config.matching == "prefix-and-regex")
        except PatternError as exc:
            self._invalid(session.peer, str(exc), Refusal.PATTERN_REFUSED, version=session.conn.version, forget=False)
            return None

    def _fetch(self, session: Session, command: Fetch) -> None:
        """FETCH: a replay of ``first`` .. ``last`` that ends with FETCH-END (see the module's notes)."""
        if any(sub.end is not None for sub in session.subscriptions):
            self._invalid(session.peer, "one FETCH at a time per peering: wait for FETCH-END", Refusal.LIMIT,
                          version=session.conn.version, forget=False)  # fmt: skip
            return
        matcher = self._matcher(session, command.pattern)
        if matcher is None or not self._within_budget(session, matcher):
            return
        stream = session.stream
        end = min(command.last, stream.routed)
        start, since_ms = self._oldest_served(stream, command.first), 0
        if command.since:
            at, since_ms = self._seek_time(stream, command.since)
            start = max(start, at)
        if start > end:  # nothing in range (yet, or any longer)
            self._send(session.peer, session.conn.send(FetchEnd(first=end + 1, last=end)))
            return
        sub = Subscription(session, matcher, start, next(self._ids), end=end, start=start, since_ms=since_ms)
        self._add_subscription(sub)
        self._lagging.append(sub)

    def _end_fetch(self, sub: Subscription) -> None:
        """Everything of the fetch's range went to the adapter: FETCH-END, and the fetch is gone."""
        session = sub.session
        assert sub.end is not None
        self._remove_subscription(sub)
        frame = session.conn.send(FetchEnd(first=sub.start, last=sub.end))
        self._pending.append(Outgoing(session.peer, frame, sub, sub.end + 1, ends_fetch=True))

    def _go_live(self, sub: Subscription) -> None:
        stream = sub.session.stream
        stream.live_set.add(sub)
        if sub.matcher.prefix is not None:
            stream.trie.add(sub.matcher.prefix, sub)
        else:
            stream.live_regex.add(sub)

    def _leave_live(self, sub: Subscription, cursor: int) -> None:
        stream = sub.session.stream
        if sub in stream.live_set:
            stream.fell_behind += 1
            stream.live_set.discard(sub)
            if sub.matcher.prefix is not None:
                stream.trie.remove(sub.matcher.prefix, sub)
            else:
                stream.live_regex.discard(sub)
        sub.cursor = cursor
        if sub not in self._lagging:
            self._lagging.append(sub)

    def _route(self, stream: Stream) -> None:
        journal = stream.journal
        multicast = self.config.multicast_heartbeat_s is not None and not stream.following  # the leader's output
        if not stream.live_set and not multicast:  # nobody to route to (a follower without readers, say):
            stream.routed = max(stream.routed, stream.committed)  # reading the records back is wasted work;
            return  # a subscriber that comes later replays them from the journal
        while stream.routed < stream.committed:
            chunk = journal.read_chunk(stream.routed + 1, max_bytes=self.config.batch_bytes, end=stream.committed)
            if chunk is None:
                break
            for sub, targeted in self._targets(stream, chunk).items():
                # a subscription asked from past the tail gets nothing before its sequence
                picks = targeted if sub.cursor <= chunk.first else _from(chunk, targeted, sub.cursor)
                if picks == []:
                    continue
                stop = self._deliver(sub, chunk, picks)
                if stop is not None:
                    self._leave_live(sub, stop)
            if multicast:
                stream.outbox.gather(chunk)
            stream.routed = chunk.last
        for sub in stream.live_set:
            sub.cursor = max(sub.cursor, stream.routed + 1)

    @property
    def multicast_pending(self) -> bool:
        """Records wait for the multicast group (the loop should come back within the linger)."""
        return any(stream.outbox.pending for stream in self.streams.values())

    def take_multicast(self, now: float | None = None) -> list[list[bytes]]:
        """The messages for the multicast group since the last call, oldest first (each two frames:
        the stream's topic and DELIVER-RUN or TAIL): a stream's gathered records once they fill a
        message or waited ``multicast_linger_s``; TAIL for each stream silent for a heartbeat
        (:class:`~zeps.broker.outbox.MulticastOutbox`). Empty without a multicast output."""
        heartbeat = self.config.multicast_heartbeat_s
        if heartbeat is None:
            return []
        now = time.monotonic() if now is None else now
        out: list[list[bytes]] = []
        for stream in self.streams.values():
            if not stream.following:  # a replicated stream's multicast output is its leader's
                out += stream.outbox.take(stream.name, stream.routed, now, heartbeat=heartbeat,
                                          linger=self.config.multicast_linger_s,
                                          max_bytes=self.config.multicast_max_bytes)  # fmt: skip
        return out

    @staticmethod
    def _targets(stream: Stream, chunk: Chunk) -> dict[Subscription, list[int] | None]:
        """Which live subscriptions get which records of ``chunk`` (None: all of them)."""
        if not stream.live_set:
            return {}
        by_key: dict[str, frozenset[Subscription]] = {}
        for key in set(chunk.keys):
            targets = {s for s in stream.trie.match(key) if isinstance(s, Subscription)}
            targets.update(s for s in stream.live_regex if s.matcher.matches(key))
            by_key[key] = frozenset(targets)
        if len(set(by_key.values())) == 1:  # every record goes to the same subscriptions (the usual case)
            return dict.fromkeys(next(iter(by_key.values())))
        picks: dict[Subscription, list[int] | None] = {}
        for i, key in enumerate(chunk.keys):
            for sub in by_key[key]:
                picks.setdefault(sub, []).append(i)  # type: ignore[union-attr]
        return picks

    def _deliver(self, sub: Subscription, chunk: Chunk, picks: list[int] | None) -> int | None:
        """Queue the records of ``chunk`` that ``sub`` takes (``picks``, or all) as far as its credit
        goes. Returns None when all went, else the sequence of the first one that did not."""
        if picks is not None and len(picks) == len(chunk):
            picks = None  # every record: a version 3 session gets the run's bytes as they are, uncut
        session = sub.session
        if session.blocked_until:
            return chunk.sequence(picks[0] if picks else 0)
        if session.batches:
            return self._deliver_batch(sub, chunk, picks)
        timestamps = session.timestamps
        for i in range(len(chunk)) if picks is None else picks:
            r = chunk.record(i)
            # the session is attached (it has subscriptions), so DELIVER is allowed: the fast encoder
            # skips the state machine and the generic codec on this, the hottest path of older sessions
            frame = encode_deliver(r.sequence, r.key, r.body, r.timestamp_ms if timestamps else None)
            if self._room(session) < len(frame):
                self._hold(session)
                return r.sequence
            self._queue(sub, frame, r.sequence, 1)
        sub.cursor = chunk.last + 1
        return None

    def _deliver_batch(self, sub: Subscription, chunk: Chunk, picks: list[int] | None) -> int | None:
        """DELIVER-BATCH (version 3) or DELIVER-RUN (version 4: plus a 4-byte index entry per record)."""
        session, offsets = sub.session, chunk.offsets
        indexed, room = session.indexed, self._room(session)
        per_record, room = (4, room - 15) if indexed else (0, room - 7)  # frame overhead
        if picks is None:  # a run: the journal's bytes as they are, as far as credit goes
            fits = bisect.bisect_right(range(len(offsets)), room, key=lambda i: offsets[i] + per_record * i) - 1
            if fits > 0:
                data = chunk.data[: offsets[fits]]
                frame = encode_deliver_run(data, run_index(offsets[:fits])) if indexed else encode_deliver_batch(data)
                self._queue(sub, frame, chunk.first, fits)
            if fits < len(chunk):
                self._hold(session)
                return chunk.sequence(max(fits, 0))
        else:
            size, taken = 0, 0
            for i in picks:
                size += offsets[i + 1] - offsets[i] + per_record
                if size > room:
                    break
                taken += 1
            if taken:
                data, chosen = chunk.data, picks[:taken]
                records = b"".join(data[offsets[i] : offsets[i + 1]] for i in chosen)
                if indexed:
                    starts = array("I", itertools.accumulate((offsets[i + 1] - offsets[i] for i in chosen[:-1]),
                                                             initial=0))  # fmt: skip
                    frame = encode_deliver_run(records, run_index(starts))
                else:
                    frame = encode_deliver_batch(records)
                self._queue(sub, frame, chunk.sequence(picks[0]), taken)
            if taken < len(picks):
                self._hold(session)
                return chunk.sequence(picks[taken])
        sub.cursor = chunk.last + 1
        return None

    def _room(self, session: Session) -> int:
        """The bytes ``session`` may be delivered now: its credit, within the bytes-in-flight budgets."""
        return min(session.credit, self._flight_room(session))

    def _flight_room(self, session: Session) -> int:
        """The bytes the bytes-in-flight budgets let go to ``session`` now (see the module's notes)."""
        config = self.config
        shared = config.max_bytes_in_flight - self.bytes_in_flight
        if session.in_flight == 0:  # one frame, as large as the shared budget's room (a small one past it)
            return max(shared, RESERVE_BYTES)
        return min(config.max_session_bytes_in_flight - session.in_flight, shared)

    def _hold(self, session: Session) -> None:
        """``session``'s delivery stopped: if for bytes in flight rather than credit, it goes on once
        bytes leave (:meth:`released`), not when its peer sends CREDIT."""
        if self._room(session) < session.credit:
            self._held[session.peer] = None

    def released(self, session: Session, size: int) -> None:
        """The adapter learnt that ``size`` more bytes of the deliveries to ``session`` left this process
        (ZeroMQ wrote them to the connection, or freed them with a connection that closed; a session
        that went counts until then): the sessions stopped for bytes in flight go on."""
        size = min(size, session.in_flight)
        session.in_flight -= size
        self.bytes_in_flight -= size
        if session.peer in self._held:  # its own bytes left: it goes on
            del self._held[session.peer]
            self._resume(session)
        if self.bytes_in_flight < self.config.max_bytes_in_flight:
            # room in the shared budget: as many of the others as the bytes that left can serve, oldest
            # first (one that stops again goes to the back), so that peers reading nothing, held for
            # ever, cost a turn each now and then, not a turn each every time bytes leave
            for peer in list(itertools.islice(self._held, 1 + size // self.config.batch_bytes)):
                del self._held[peer]
                waiting = self.sessions.get(peer)
                if waiting is not None:
                    self._resume(waiting)

    def _resume(self, session: Session) -> None:
        """Back in line: every subscription of ``session`` that stopped (not live)."""
        for sub in session.subscriptions:
            if not sub.live and sub not in self._lagging:
                self._lagging.append(sub)

    def _queue(self, sub: Subscription, frame: bytes, first: int, count: int) -> None:
        session = sub.session
        cost = len(frame)
        self._queued_bytes += cost
        session.credit -= cost
        session.in_flight += cost
        self.bytes_in_flight += cost
        session.stream.messages_out += count
        session.stream.bytes_out += cost
        self._pending.append(Outgoing(session.peer, frame, sub, first, cost, count, session=session))

    def replay_ready(self, now: float) -> bool:
        """A lagging subscription can be served now (not waiting out a refused send): the loop
        should pump again at once rather than wait for traffic."""
        return any(sub.session.blocked_until <= now for sub in self._lagging)

    def pump(self, now: float | None = None) -> list[Outgoing]:
        """Replay for lagging subscriptions (fairly, within the budget) and return everything to send."""
        now = time.monotonic() if now is None else now
        budget = self.config.pump_budget_bytes
        for _ in range(len(self._lagging)):
            if budget <= 0:
                break
            sub = self._lagging.popleft()
            session = sub.session
            if session.peer not in self.sessions or sub not in session.subscriptions:
                continue  # gone
            if session.blocked_until > now:
                self._lagging.append(sub)
                continue
            session.blocked_until = 0.0
            if sub.id in self._tier_pending:  # waits for the object store (its answer puts it back in line)
                continue
            stream = session.stream
            last = stream.routed if sub.end is None else sub.end
            if sub.cursor > last:  # a fetch all of whose range went out (a subscription past the tail: live)
                self._requeue(sub)
                continue
            if self._ask_store(sub, last, budget):
                continue
            chunk = stream.journal.read_chunk(
                sub.cursor,
                max_bytes=min(budget, self.config.batch_bytes),
                max_records=self.config.replay_batch if not session.batches else 1 << 30,
                end=last,
            )
            stalled = False
            queued = len(self._pending)
            if chunk is None:  # nothing left of cursor .. last: a damaged closed segment lost it
                sub.cursor = max(sub.cursor, last + 1)
            else:
                before = self._queued_bytes
                stalled = self._replay(sub, chunk)
                budget -= max(self._queued_bytes - before, 1)
            for item in itertools.islice(self._pending, queued, None):
                item.replayed = True
                stream.messages_replayed += item.count
            first = stream.journal.first_sequence
            if sub.cursor < first:  # retention removed what it missed
                sub.cursor = sub.start = first
            if not stalled:  # out of credit: CREDIT puts it back in line
                self._requeue(sub)
        out = list(self._pending)
        self._pending.clear()
        return out

    def _ask_store(self, sub: Subscription, last: int, budget: int) -> bool:
        """A tiered stream's subscription behind the journal's first record: a read of the object
        store asked for (the adapter's thread does it); True if it was."""
        stream = sub.session.stream
        oldest = stream.journal.first_sequence
        if sub.cursor >= oldest or stream.name not in self.tier_reads:
            return False
        read = TierRead(sub, sub.cursor, min(last, oldest - 1), min(budget, self.config.batch_bytes),
                        self.config.replay_batch if not sub.session.batches else 1 << 30, sub.since_ms)  # fmt: skip
        self._tier_pending[sub.id] = read
        self.tier_wanted.append(read)
        return True

    def tier_answered(self, read: TierRead, chunk: Chunk | None, *, failed: bool = False,
                      now: float | None = None) -> None:  # fmt: skip
        """The object store's answer to ``read``: its records from ``read.start`` (delivered as a
        replay from the journal would be); None: the store does not hold them either (the subscription
        goes on from the journal's first record, as after retention); ``failed``: the store did not
        answer (the subscription tries again in a second, losing nothing)."""
        sub = read.sub
        if self._tier_pending.get(sub.id) is not read:
            return
        del self._tier_pending[sub.id]
        session = sub.session
        if session.peer not in self.sessions or sub not in session.subscriptions:
            return  # gone meanwhile
        stream = session.stream
        stalled = False
        if not failed:  # the store was asked about the time: its answer is at or after it, or there is none
            sub.since_ms = 0
        if failed:
            session.blocked_until = (time.monotonic() if now is None else now) + 1.0
        elif chunk is None:  # gone from the store too (its retention): from the journal's first record
            moved = max(sub.cursor, stream.journal.first_sequence)
            sub.start = moved if sub.cursor == sub.start else sub.start  # a fetch's range began there
            sub.cursor = moved
        else:
            if chunk.first > sub.cursor and sub.cursor == sub.start:  # the store's oldest is later
                sub.start = chunk.first
            queued = len(self._pending)
            stalled = self._replay(sub, chunk)
            for item in itertools.islice(self._pending, queued, None):
                item.replayed = True
                stream.messages_replayed += item.count
        if not stalled:  # out of credit: CREDIT puts it back in line
            self._requeue(sub)

    def _requeue(self, sub: Subscription) -> None:
        """Where a subscription goes after a replay that did not stall: a fetch past its range ends, a
        subscription past the durable tail goes live (the store's records may take it there), any
        other back in the replay line."""
        if sub.end is not None:
            if sub.cursor > sub.end:
                self._end_fetch(sub)
            else:
                self._lagging.append(sub)
        elif sub.cursor > sub.session.stream.routed:
            self._go_live(sub)
        else:
            self._lagging.append(sub)

    def _replay(self, sub: Subscription, chunk: Chunk) -> bool:
        """Deliver what ``sub`` takes of ``chunk`` (read from the journal at its cursor) and move the
        cursor on; True if it ran out of credit before the end (stalled)."""
        matches = sub.matcher.matches
        picks = None if sub.matcher.prefix == "" else [i for i, k in enumerate(chunk.keys) if matches(k)]
        if picks == []:
            sub.cursor = chunk.last + 1
            return False
        stop = self._deliver(sub, chunk, picks)
        if stop is None:
            return False
        sub.cursor = stop
        return True

    def unsent(self, item: Outgoing, now: float | None = None) -> None:
        """The adapter could not send ``item`` (the peer's queue is full): undo the delivery."""
        sub = item.subscription
        if sub is None:
            if item.session is not None:  # a follower's REPLICA-DATA: lost (it fetches again), not in flight
                item.session.in_flight -= item.cost
                self.bytes_in_flight -= item.cost
            return
        session = sub.session
        if item.ends_fetch:  # FETCH-END did not go: the fetch is open again, and ends again later
            if session.peer in self.sessions and sub not in session.subscriptions:
                self._add_subscription(sub)
                if sub not in self._lagging:
                    self._lagging.append(sub)
            session.blocked_until = (time.monotonic() if now is None else now) + 0.01
            return
        session.credit += item.cost
        session.in_flight -= item.cost
        self.bytes_in_flight -= item.cost
        session.stream.messages_out -= item.count  # they were counted when queued; undo it
        if item.replayed:
            session.stream.messages_replayed -= item.count
        session.stream.bytes_out -= item.cost
        session.blocked_until = (time.monotonic() if now is None else now) + 0.01
        if sub.cursor > item.sequence:
            self._leave_live(sub, item.sequence)

    def _forget(self, session: Session) -> None:
        for sub in list(session.subscriptions):
            self._leave_live(sub, sub.cursor)
            self._remove_subscription(sub)
        self.sessions.pop(session.peer, None)
        self._let_go(session)
        stream = session.stream
        stream.waiting.pop(session.peer, None)
        if stream.held:  # never a confirmation on a later peering of the same peer
            stream.held = deque(h for h in stream.held if h[1] != session.peer)

    def states(self, stream: str) -> tuple[int, int]:
        """(subscriptions of ``stream`` replaying from the journal — behind the tail, or a FETCH —,
        subscriptions stopped until their peer sends CREDIT)."""
        replaying = {id(sub) for sub in self._lagging if sub.session.stream.name == stream}
        starved = 0
        for session in self.sessions.values():
            if session.stream.name == stream:
                for sub in session.subscriptions:
                    if id(sub) not in replaying and not sub.live:
                        starved += 1  # out of line: its last delivery stopped for credit
        return len(replaying), starved

    def lag(self, stream: str, most: int = 20) -> tuple[int, list[tuple[str, Subscription]]]:
        """(how many subscriptions ``stream`` has, the ``most`` furthest behind as (peer hex,
        subscription)), furthest first: a subscription's lag is the records between its cursor and the
        durable tail."""
        subs = [(sub.lag, session.peer.hex(), sub) for session in self.sessions.values()
                if session.stream.name == stream for sub in session.subscriptions]  # fmt: skip
        subs.sort(key=lambda t: (-t[0], t[1], t[2].id))
        return len(subs), [(peer, sub) for _, peer, sub in subs[:most]]

    def subscriptions(self, stream: str, most: int = 20) -> tuple[int, list[dict[str, object]]]:
        """(how many subscriptions ``stream`` has, the ``most`` furthest behind): peer, subscription
        id, pattern, lag and whether it is live — the facts a broker publishes for its operator."""
        count, furthest = self.lag(stream, most)
        return count, [{"peer": peer, "id": sub.id, "pattern": sub.matcher.pattern, "lag": sub.lag, "live": sub.live}
                       for peer, sub in furthest]  # fmt: skip


def _from(chunk: Chunk, picks: list[int] | None, cursor: int) -> list[int]:
    """The records of ``chunk`` that ``picks`` names (None: all of them) at or after ``cursor``."""
    if cursor > chunk.last:  # a cursor far ahead (any peer may ask for one) costs no scan of the chunk
        return []
    return [i for i in (range(len(chunk)) if picks is None else picks) if chunk.sequence(i) >= cursor]
