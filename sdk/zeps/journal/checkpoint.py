"""A replicated journal's commit checkpoint: the last sequence this replica knows was committed.

Kafka's replication-offset-checkpoint, Raft's commit index. A record is *committed* once every
member of the stream's in-sync set holds it durably (:mod:`zeps.replication.isr`); only committed
records are confirmed to publishers and delivered to subscribers. The journal itself holds more: a
leader's tail that no follower copied yet, a follower's copy ahead of the commit point it heard.
After a restart that tail must not count as committed (everything may have restarted at once: no
quorum ever held it), so the commit point a replica starts from is this checkpoint, never its
journal's end.

The checkpoint may lag the true commit point (it is written at most every ``interval`` seconds,
off the publish path): that is safe. Every record at or below the true commit point is held by
every replica that may be elected, and the next leader commits it again in its own epoch. It must
never run ahead: it is only ever set from a commit point the leader computed.

A journal that has never been replicated (no epoch history, no checkpoint file) was written by a
broker serving alone, which confirmed everything durable: its checkpoint is its durable tail (a
stream growing from one broker to several keeps what its subscribers saw).

The file ``commit`` in the journal's directory holds one line, the sequence, and is replaced whole
(:func:`zeps.journal._files.replace_file`).
"""

from __future__ import annotations

import logging
from pathlib import Path

from zeps.journal._files import replace_file

__all__ = ["CommitCheckpoint"]

log = logging.getLogger(__name__)


class CommitCheckpoint:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.sequence = 0  #: the last committed sequence as the file holds it (or will, once saved)
        self.exists = False  #: whether the file was found at load (or has been saved since)
        self._saved = 0

    def load(self) -> CommitCheckpoint:
        """Read the file; a missing or damaged one counts as 0 (``exists`` says which)."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            self.sequence = self._saved = 0
            self.exists = False
            return self
        try:
            self.sequence = self._saved = max(0, int(text.strip()))
        except ValueError:  # replaced whole, so only someone else's write can do this: start from nothing
            log.error("commit checkpoint %s is not a sequence (%r): counting nothing as committed", self.path,
                      text[:40])  # fmt: skip
            self.sequence = self._saved = 0
        self.exists = True
        return self

    def advance(self, sequence: int) -> None:
        """The commit point reached ``sequence`` (never goes back here; :meth:`lower` does)."""
        self.sequence = max(self.sequence, sequence)

    def lower(self, sequence: int) -> None:
        """The journal was cut after ``sequence``: nothing beyond it can be committed here. Saved at
        once; if that fails (a full volume), the file goes instead: no checkpoint claims nothing."""
        if self.sequence > sequence:
            self.sequence = sequence
            try:
                self.save()
            except OSError as exc:
                log.warning("commit checkpoint %s could not be lowered to %d (%s): removed instead, counting "
                            "nothing as committed until it is written again", self.path, sequence, exc)  # fmt: skip
                self.path.unlink(missing_ok=True)  # needs no space; failing too, the broker stops
                self._saved, self.exists = 0, False

    @property
    def saved(self) -> int:
        """The sequence the file holds (0: none)."""
        return self._saved

    @property
    def dirty(self) -> bool:
        return self.sequence != self._saved

    def save(self) -> None:
        """Write the checkpoint (nothing to do if the file holds it already)."""
        if not self.dirty and self.exists:
            return
        replace_file(self.path, b"%d\n" % self.sequence)
        self._saved = self.sequence
        self.exists = True

    def clear(self) -> None:
        """The copy starts over, empty: nothing here is committed."""
        self.sequence = self._saved = 0
        self.path.unlink(missing_ok=True)
        self.exists = False
