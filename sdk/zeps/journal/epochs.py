"""A replicated journal's epoch history: which leader epoch wrote which records (Kafka's KIP-101).

Each entry is ``(epoch, first sequence)``: the records from ``first`` on, up to the next entry's
first, were written by the leader of ``epoch``. A leader adds an entry when it takes over
(:meth:`EpochHistory.begin`); a follower adopts the leader's entries for the records it copies. So
every record carries its epoch, without a byte more per record.

A replica that comes back asks the current leader where its own last epoch ends in the leader's
history (:meth:`EpochHistory.end_of`), and cuts its journal there: what it wrote beyond that point
was never acknowledged by a majority, and the leader never had it.

The file ``epochs`` in the journal's directory holds one entry per line (``epoch first``), and is
replaced whole (:func:`zeps.journal._files.replace_file`), so a crash leaves the old or the new history.
"""

from __future__ import annotations

from pathlib import Path

from zeps.errors import ZepsError
from zeps.journal._files import replace_file
from zeps.journal.config import JournalWriteError

__all__ = ["MAX_EPOCHS", "EpochHistory", "EpochHistoryError"]

MAX_EPOCHS = 1000  #: entries kept; older ones go (a replica that old is copied afresh)


class EpochHistoryError(ZepsError):
    """The epoch history file is damaged, or an entry would make it go backwards."""


class EpochHistory:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.entries: list[tuple[int, int]] = []

    def load(self) -> EpochHistory:
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            self.entries = []
            return self
        entries: list[tuple[int, int]] = []
        for number, line in enumerate(text.splitlines(), 1):
            try:
                epoch, first = (int(field) for field in line.split())
            except ValueError:
                raise EpochHistoryError(f"{self.path}: line {number} is not 'epoch first-sequence': {line!r}") from None
            if entries and (epoch <= entries[-1][0] or first < entries[-1][1]):
                raise EpochHistoryError(f"{self.path}: line {number} goes backwards ({epoch} {first})")
            entries.append((epoch, first))
        self.entries = entries
        return self

    @property
    def latest(self) -> int:
        """The last epoch the history knows (0: none)."""
        return self.entries[-1][0] if self.entries else 0

    def begin(self, epoch: int, first: int) -> None:
        """A leader of ``epoch`` writes from sequence ``first`` on."""
        if self.entries and (epoch <= self.entries[-1][0] or first < self.entries[-1][1]):
            raise EpochHistoryError(f"epoch {epoch} from sequence {first} would go back: the history ends with "
                                    f"epoch {self.entries[-1][0]} from {self.entries[-1][1]}")  # fmt: skip
        self._save([*self.entries, (epoch, first)])

    def adopt(self, entries: list[tuple[int, int]], written: int) -> bool:
        """Take the leader's entries newer than ours whose records we hold (first <= ``written``)."""
        new = [(e, f) for e, f in entries if e > self.latest and f <= written]
        if not new:
            return False
        grown = list(self.entries)
        for epoch, first in new:
            if grown and first < grown[-1][1]:
                raise EpochHistoryError(f"the leader's epoch {epoch} starts at {first}, before ours")
            grown.append((epoch, first))
        self._save(grown)
        return True

    def newer_than(self, epoch: int) -> list[tuple[int, int]]:
        """The entries after ``epoch`` (what a follower that knows up to ``epoch`` lacks)."""
        return [(e, f) for e, f in self.entries if e > epoch]

    def end_of(self, epoch: int, written: int) -> tuple[int, int]:
        """Where ``epoch`` ends here: (the largest epoch we know that is not above it, the last sequence
        written in that epoch). ``written`` is this journal's last sequence. (0, first - 1) if every
        epoch we know is newer; (0, written) if the history is empty."""
        if not self.entries:
            return 0, written
        below = [i for i, (e, _) in enumerate(self.entries) if e <= epoch]
        if not below:
            return 0, self.entries[0][1] - 1
        i = below[-1]
        end = written if i + 1 == len(self.entries) else self.entries[i + 1][1] - 1
        return self.entries[i][0], min(end, written)

    def truncate(self, last: int) -> None:
        """The journal was cut after sequence ``last``: forget epochs that begin beyond it."""
        kept = [(e, f) for e, f in self.entries if f <= last]
        if kept != self.entries:
            self._save(kept)

    def clear(self) -> None:
        self.entries = []
        self.path.unlink(missing_ok=True)

    def _save(self, entries: list[tuple[int, int]]) -> None:
        """Replace the file with ``entries``, then take them: a write that fails (a full volume) leaves
        the history as it was, in memory as on disk, so the change is made again, or never counted.
        (Taken before written, a follower's adopted epoch lost to a full volume stayed unwritten, and
        its records were read as the older epoch's after a restart, and cut.)"""
        entries = entries[max(0, len(entries) - MAX_EPOCHS) :]
        try:
            replace_file(self.path, "".join(f"{e} {f}\n" for e, f in entries).encode())
        except OSError as error:  # a full volume (``space``): as for an append; anything else: a broken disk
            raise JournalWriteError(str(self.path), error) from error
        self.entries = entries
