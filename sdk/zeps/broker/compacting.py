"""A compacted stream's compaction beside the broker's loop (:mod:`zeps.journal.compaction`).

The reading and writing run on a thread per stream; the loop only offers the closed segments when a
pass is due and puts each rewritten segment in place (a few renames), so it never waits on a pass:

1. the loop (each tick): the journal says a pass is due (a segment closed, a kept tombstone
   expired) and the thread is idle: it hands the thread copies of the closed segments;
2. the thread maps the keys, and if the superseded share reaches the ratio rewrites one segment at a
   time (within the I/O budget), handing each to the loop and waiting for it to be put in place
   before the next: the disk holds at most one segment more;
3. the loop installs each (or refuses it, if retention removed the segment meanwhile) and, at the
   pass's report, notes it done.

A pass that fails (a full volume) leaves every segment as it was; the next is tried a minute later.
"""

from __future__ import annotations

import logging
import queue
import threading
import time

from zeps.journal import CompactionReport, Journal, JournalConfig
from zeps.journal.compaction import Cleaned, Throttle, run_pass
from zeps.journal.segments import Segment

__all__ = ["RETRY_AFTER_S", "CompactionTask"]

log = logging.getLogger(__name__)

RETRY_AFTER_S = 60.0  #: after a failed pass, the next is offered no sooner than this
Done = CompactionReport | Exception  # what ends a pass: its report, or what failed it


class CompactionTask:
    """One stream's compaction thread (see the module's notes). The loop calls :meth:`turn` each tick."""

    def __init__(self, name: str, config: JournalConfig) -> None:
        self.name, self.config = name, config
        self._offers: queue.SimpleQueue[tuple[list[Segment], int] | None] = queue.SimpleQueue()
        self._results: queue.SimpleQueue[Cleaned | Done] = queue.SimpleQueue()
        self._acks: queue.SimpleQueue[bool] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=f"compact-{name}", daemon=True)
        self.busy = False  #: a pass is running (the loop offers no other)
        self.retry_at = 0.0  #: monotonic time before which no pass is offered (after a failure)
        self.passes = self.failures = self.removed = self.segments = 0  #: for the metrics
        #: every closed segment up to this sequence was offered to a pass that finished: what local
        #: retention of a tiered stream waits for, so the store gets the segments compacted
        self.covered_to = 0
        self._offered_to = 0
        self._upto: int | None = None  # the bound the running pass was offered under

    def start(self) -> CompactionTask:
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._offers.put(None)
        self._acks.put(False)  # a pass waiting for an install ends
        self._thread.join(timeout)

    def turn(self, journal: Journal, now_ms: int, now: float | None = None, *, upto: int | None = None) -> None:
        """The loop's part: install what the thread rewrote, note a finished pass, offer the next.
        ``upto``: a replicated stream's commit checkpoint; only segments wholly at or below it are
        offered (each replica compacts its own copy of what can never be cut)."""
        while True:
            try:
                item = self._results.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, Cleaned):
                installed = journal.install(item)
                self.segments += installed
                self.removed += item.removed if installed else 0
                self._acks.put(installed)
            elif isinstance(item, CompactionReport):
                self.busy, self.passes = False, self.passes + 1
                self.covered_to = max(self.covered_to, self._offered_to)
                journal.compaction_done(item, self._upto)
            else:
                self.busy, self.failures = False, self.failures + 1
                self.retry_at = (time.monotonic() if now is None else now) + RETRY_AFTER_S
                log.error("compaction of %s failed (%s); every segment stays as it was, the next pass in %.0f s",
                          self.name, item, RETRY_AFTER_S)  # fmt: skip
        moment = time.monotonic() if now is None else now
        if not self.busy and moment >= self.retry_at and journal.compaction_due(now_ms, upto):
            self.busy, self._upto = True, upto
            view = journal.compaction_view(upto)
            self._offered_to = view[-1].last_seq if view else self._offered_to
            self._offers.put((view, now_ms))

    def _run(self) -> None:
        while (offer := self._offers.get()) is not None:
            segments, now_ms = offer
            try:
                self._results.put(self._pass(segments, now_ms))
            except Exception as exc:  # reported to the loop, which logs it and tries again later
                self._results.put(exc)

    def _pass(self, segments: list[Segment], now_ms: int) -> CompactionReport:
        """A pass on this thread; each rewritten segment goes to the loop, and the thread waits for it
        to be installed before writing the next."""

        def install(cleaned: Cleaned) -> bool:
            self._results.put(cleaned)
            return self._acks.get()

        return run_pass(segments, self.config, now_ms, install, Throttle(self.config.compaction_bytes_per_s),
                        name=self.name)  # fmt: skip
