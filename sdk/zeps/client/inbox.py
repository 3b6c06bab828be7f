"""The client's inbox: deliveries the application has not taken yet, and the credit they hold.

A subscription is granted ``window`` bytes of credit. Every delivery holds its frame's size until
the application takes it; once half the window was taken the inbox gives that much back (through the
``give`` callback its session passes: a CREDIT frame, if the peering is attached). So a consumer that
stops taking holds at most its window in memory, and the broker switches it to replay from the journal
until it takes again.

A window under twice the largest delivery (``largest``) gives credit back sooner: once the window
less the largest delivery was taken. The broker stops when the next record does not fit the credit
it has left, so that credit is under one delivery; with half the window as the only mark, credit
left above half of it meant that what the application had taken stayed under half, and both sides
waited for ever.

Deliveries arrive as runs of records (DELIVER-BATCH, DELIVER-RUN: decoded only when taken) or as
single rows (DELIVER, from a version-1 broker); both are handed out as rows, oldest first.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from zeps._records import Records, encode_record

__all__ = ["Inbox", "Row"]

Row = tuple[int, str, bytes, int | None]  #: a delivered message as a plain tuple, in Message's field order


class Inbox:
    """Deliveries held for the application, oldest first, and the credit due back for what it took."""

    __slots__ = ("_consumed", "_give", "_head", "_mark", "_sizes", "entries", "held_bytes", "window")

    def __init__(self, window: int, give: Callable[[int], bool], largest: int = 0) -> None:
        self.window = window
        #: taken bytes that are given back at once: half the window, or the window less the largest
        #: delivery if that is less (see the module's notes)
        self._mark = max(min(window // 2, window - largest), 1)
        #: gives ``n`` bytes of credit back to the broker; False when it cannot now (detached), so they
        #: are counted on until the next grant
        self._give = give
        self.entries: deque[Records | Row] = deque()  #: runs of records, or single rows
        self._head = 0  # records of entries[0] already handed out, when it is a run
        self._sizes: deque[int] = deque()  # each entry's frame size: credit given back once it is taken
        self.held_bytes = 0  #: delivery bytes not yet taken by the application: at most the window
        self._consumed = 0  # bytes taken (or dropped) since credit was last given

    def __len__(self) -> int:
        """Entries held (a run of records counts once): true while anything waits to be taken."""
        return len(self.entries)

    def grant(self) -> int:
        """The credit for a new subscription or fetch: the window, less what is still held (after a
        re-attach, deliveries of the old peering the application has not taken yet)."""
        self._consumed = 0
        return self.window - self.held_bytes

    def hold(self, entry: Records | Row, size: int) -> None:
        """A delivery of ``size`` bytes: its credit is given back once it is taken."""
        self.entries.append(entry)
        self._sizes.append(size)
        self.held_bytes += size

    def done(self, size: int) -> None:
        """``size`` delivery bytes are done with (taken, or a duplicate dropped on arrival): their
        credit goes back once half the window is (or less: see the module's notes)."""
        self._consumed += size
        if self._consumed >= self._mark and self._give(self._consumed):
            self._consumed = 0

    def _taken(self) -> None:
        """The application took the oldest entry (it is dropped): its credit is due."""
        self.entries.popleft()
        size = self._sizes.popleft()
        self.held_bytes -= size
        self.done(size)

    def take(self, most: int) -> list[Row]:
        """Up to ``most`` rows, oldest first."""
        out: list[Row] = []
        entries = self.entries
        while entries and len(out) < most:
            entry = entries[0]
            if isinstance(entry, Records):
                end = min(len(entry), self._head + most - len(out))
                out += entry.rows(self._head, end)
                if end == len(entry):
                    self._taken()
                    end = 0
                self._head = end
            else:
                self._taken()
                out.append(entry)
        return out

    def take_one(self) -> Row:
        """The oldest row (the inbox must not be empty)."""
        entry = self.entries[0]
        if not isinstance(entry, Records):
            self._taken()
            return entry
        row = entry.row(self._head)
        self._head += 1
        if self._head == len(entry):
            self._taken()
            self._head = 0
        return row

    def take_records(self) -> list[Records]:
        """Everything held as runs of records, oldest first, undecoded (a row from an older broker
        becomes a run of one, its unknown timestamp 0)."""
        out = []
        entries = self.entries
        while entries:
            entry = entries[0]
            self._taken()
            if isinstance(entry, Records):
                out.append(entry.part(self._head))
                self._head = 0
            else:
                sequence, key, body, timestamp = entry
                out.append(Records(encode_record(sequence, timestamp or 0, key.encode("latin-1"), body)))
        return out
