"""The reconciliation of a multicast flow with the journal, without sockets (seed 004: "if clients
want both multicast real-time data, and historical data, they would create two connections and
reconcile them").

A :class:`Reconciler` is fed what arrives — runs and TAILs from the multicast group, records and
FETCH-ENDs from a peering it fetches on — and says what to fetch next. It hands the application
each record once, in sequence order:

* **History first.** The first fetch covers ``since`` up to the broker's tail; the group's runs that
  arrive meanwhile wait.
* **Then the multicast flow, from where history ended.** A run that starts where the output stands
  is handed out (cut by the key prefix here: the group carries every record); a run that ends
  before it is a duplicate; one that starts after it, or a TAIL beyond it, is a **gap** — a late
  start, a packet PGM or NORM could not repair, a run the broker's backlog dropped — fetched from
  the journal while the runs behind it wait.
* **A silent group** (``stall`` seconds without a run or TAIL, though the broker sends TAIL every
  heartbeat): a fetch up to the tail, again each ``stall`` while the silence lasts, so a receiver
  whose group went quiet still gets every record, late.

Waiting runs are bounded (``max_waiting_bytes``): past it the newest are let go, and fetched later
as the gap they leave. Records retention removed before a gap could be fetched raise
:class:`~zeps.errors.DataLossError` naming them.

Sequences here are over every record of the stream (the fetches are filtered by the broker, so
only a FETCH-END says how far a fetch got).
"""

from __future__ import annotations

import bisect
from collections import deque
from dataclasses import dataclass, field

from zeps._records import Records
from zeps.client.session import Row, Seq, Since, Time
from zeps.errors import ConfigError, DataLossError, RemoteProtocolError
from zeps.protocol import LATEST, Fetch
from zeps.protocol._fastpath import is_vchar

__all__ = ["MulticastStats", "Reconciler"]


@dataclass
class MulticastStats:
    """What a multicast subscription did: where its records came from, and the gaps it filled."""

    multicast_records: int = 0  #: records handed out from the group (matching or not)
    fetched_records: int = 0  #: records handed out from fetches (history and gaps; matching only)
    duplicates: int = 0  #: records the group sent that were already handed out (dropped)
    gaps: int = 0  #: gaps found (a jump in the group's runs, a TAIL beyond the output, a silent group)
    fetches: int = 0
    let_go: int = 0  #: waiting runs let go past max_waiting_bytes (fetched later instead)
    bad_messages: int = 0  #: messages from the group that failed their checks (their gap is fetched)
    forged: int = 0  #: of those, messages without the stream key's MAC (a signed stream): not the broker's
    relay_restarts: int = 0  #: NORM only: times libzmq aborted the receiving child and another was started
    gap_ranges: list[tuple[int, int]] = field(default_factory=list)  #: the last gaps fetched (at most 100)


class Reconciler:
    """Multicast runs and fetched records in, each record once in sequence order out."""

    def __init__(self, pattern: str, since: Since, *, stall: float, max_waiting_bytes: int = 64 << 20) -> None:
        if pattern.startswith("~") or not (pattern == "" or is_vchar(pattern)):
            raise ConfigError(f"pattern {pattern!r}: a multicast subscription takes a key prefix (printable ASCII, "
                              "no spaces; \"\" for every key), not a ~regex")  # fmt: skip
        self.pattern = pattern
        self.stall = stall
        self.max_waiting_bytes = max_waiting_bytes
        self.stats = MulticastStats()
        self.output: deque[Row] = deque()  #: records for the application, in order
        self.next: int | None = None  #: the sequence the output stands at (None: history not fetched yet)
        self._waiting: list[Records] = []  # runs ahead of the output, by first sequence
        self._waiting_bytes = 0
        self._tail = 0  # the highest TAIL (or run end) heard from the group
        self._heard = 0.0  # when the group was last heard from
        self._fetch: Fetch | None = None  # the fetch in flight
        self._history = self._first_fetch(since)

    def _first_fetch(self, since: Since) -> Fetch:
        if isinstance(since, Seq):
            return Fetch(pattern=self.pattern, first=since.after + 1)
        if isinstance(since, Time):
            return Fetch(pattern=self.pattern, first=0, since=since.ms)
        return Fetch(pattern=self.pattern, first=0 if since == "earliest" else LATEST)

    # -- what to fetch --------------------------------------------------------------------------
    def start(self, now: float) -> Fetch:
        """The history fetch: send it first (the group is already being read)."""
        self._heard = now
        self._fetch = self._history
        self.stats.fetches += 1
        return self._history

    def poll(self, now: float) -> Fetch | None:
        """The fetch to send now, if any (one at a time): a gap the group left, or a catch-up when it
        has been silent for ``stall`` seconds."""
        if self._fetch is not None or self.next is None:
            return None
        if self._waiting and self._waiting[0].sequence(0) > self.next:  # runs wait behind a gap
            return self._gap(self.next, self._waiting[0].sequence(0) - 1)
        if not self._waiting and self._tail >= self.next:  # the group said it sent records we lack
            return self._gap(self.next, self._tail)
        if now - self._heard >= self.stall:
            self._heard = now  # again after another stall, while the silence lasts
            return self._gap(self.next, LATEST)
        return None

    def _gap(self, first: int, last: int) -> Fetch:
        self.stats.gaps += 1
        self.stats.fetches += 1
        if len(self.stats.gap_ranges) >= 100:
            del self.stats.gap_ranges[0]
        self.stats.gap_ranges.append((first, last))
        self._fetch = Fetch(pattern=self.pattern, first=first, last=last)
        return self._fetch

    @property
    def fetching(self) -> bool:
        return self._fetch is not None

    # -- the group ------------------------------------------------------------------------------
    def on_run(self, run: Records, now: float) -> None:
        """A DELIVER-RUN from the group: consecutive records, newly durable."""
        self._heard = now
        first, last = run.sequence(0), run.sequence(-1)
        if last - first + 1 != len(run):
            raise RemoteProtocolError(f"a multicast run of {len(run)} records spans sequences {first}..{last}")
        self._tail = max(self._tail, last)
        if self.next is not None and last < self.next:
            self.stats.duplicates += len(run)
            return
        if self.next is not None and self._fetch is None and first <= self.next:
            self._hand_out(run)
            self._drain()
            return
        if self._waiting_bytes + len(run.data) > self.max_waiting_bytes:
            self.stats.let_go += 1  # fetched later as the gap it leaves
            return
        bisect.insort(self._waiting, run, key=lambda waiting: waiting.sequence(0))
        self._waiting_bytes += len(run.data)

    def on_tail(self, sequence: int, now: float) -> None:
        """TAIL from the group: every record up to ``sequence`` was sent to it."""
        self._heard = now
        self._tail = max(self._tail, sequence)

    def _hand_out(self, run: Records) -> None:
        """Out with the records of ``run`` from the output's position on (the run reaches it)."""
        assert self.next is not None
        skip = self.next - run.sequence(0)
        if skip > 0:
            self.stats.duplicates += skip
            run = run.part(skip)
        prefix = self.pattern
        self.output.extend(row for row in run.rows() if row[1].startswith(prefix))
        self.stats.multicast_records += len(run)
        self.next = run.sequence(-1) + 1

    def _drain(self) -> None:
        """Hand out the waiting runs the output has reached."""
        while self._waiting and self.next is not None and self._waiting[0].sequence(0) <= self.next:
            run = self._waiting.pop(0)
            self._waiting_bytes -= len(run.data)
            if run.sequence(-1) < self.next:
                self.stats.duplicates += len(run)
            else:
                self._hand_out(run)

    # -- the peering ----------------------------------------------------------------------------
    def on_fetched(self, rows: list[Row]) -> None:
        """Records the fetch in flight delivered (the broker filtered them by the prefix; the session
        already dropped what a fetch sent again after a re-attach repeats)."""
        self.output.extend(rows)
        self.stats.fetched_records += len(rows)

    def on_fetch_end(self, first: int, last: int) -> None:
        """FETCH-END of the fetch in flight: it covered ``first`` .. ``last``."""
        asked = self._fetch
        if asked is None:
            raise RemoteProtocolError("FETCH-END without a FETCH in flight")
        self._fetch = None
        if asked is not self._history and first > asked.first:  # history starts at the oldest retained, as subscribe
            gone = f"{asked.first}..{min(first - 1, asked.last)}"
            raise DataLossError(f"records {gone} of the stream were removed by retention before this subscription "
                                "could fetch them; subscribe again from a later sequence")  # fmt: skip
        if self.next is None or last + 1 > self.next:
            self.next = last + 1
        self._tail = max(self._tail, last)
        self._drain()
