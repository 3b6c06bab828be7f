"""A stream's append buffer: the publishes the broker took since its loop last wrote the journal.

The loop reads every frame it can (up to a batch), then writes what they published in one go
(:meth:`AppendBuffer.write_to`), so a burst of one-message publishes costs one journal write, not
one each. Idempotent producers' publishes change the producer table; the buffer cuts its entries
into groups of about ``group_bytes`` (a quarter segment, so a group never spans segments), each
written with a group mark holding the table's entries as they are once the group is journaled
(:mod:`zeps.journal.producers`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from zeps.journal import Journal
from zeps.journal.producers import Producer, ProducerState, frozen

__all__ = ["AppendBuffer"]


@dataclass(eq=False)
class AppendBuffer:
    """One stream's publishes since the last write, and the producer-table changes they make."""

    group_bytes: int
    entries: list[tuple[str, bytes]] = field(default_factory=list)
    size: int = 0  # bytes of the entries (keys, bodies, a few framing bytes)
    #: closed groups: (entries end, the producers they change, as they are once entries[:end] are written)
    groups: list[tuple[int, dict[str, Producer]]] = field(default_factory=list)
    #: the producers the open group changes: the table's own entries, frozen when the group closes
    changes: dict[str, ProducerState] = field(default_factory=dict)
    start: int = 0  # size when the open group began
    peers: set[bytes] = field(default_factory=set)  # who published these (refused if the write fails)

    def add(self, items: Iterable[tuple[str, bytes]], size: int) -> None:
        self.entries.extend(items)
        self.size += size
        if self.size - self.start >= self.group_bytes:
            self.groups.append((len(self.entries), frozen(self.changes)))
            self.changes, self.start = {}, self.size

    def producers_changed(self) -> set[str]:
        """Every producer a group of the buffer changes (their table entries are undone on a refusal)."""
        return {n for _, changes in self.groups for n in changes} | self.changes.keys()

    def write_to(self, journal: Journal, timestamp_ms: int) -> None:
        """Append the publishes, group by group (a group without producers' changes is a plain
        append, which may roll segments within it), stamped ``timestamp_ms`` (the broker's wall clock)."""
        entries, begin = self.entries, 0
        for end, changes in [*self.groups, (len(entries), frozen(self.changes))]:
            if end > begin or changes:
                part = entries if begin == 0 and end == len(entries) else entries[begin:end]
                journal.append_many(part, timestamp_ms=timestamp_ms, changes=changes or None)
            begin = end
