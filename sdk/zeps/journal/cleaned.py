"""A compacted segment's files replace the old ones so that a crash at any point leaves one whole
segment, old or new, never a mix (:mod:`zeps.journal.compaction` writes them, recovery finishes them).

For the segment ``X`` (its 20-digit base)::

    X.log.cleaned  X.off.cleaned  X.idx.cleaned  X.seal.cleaned   the new files, written and fsynced
    X.swap                                                        the commit point: created, and the
                                                                  directory fsynced, once all four are

then each ``.cleaned`` file is renamed over its namesake, the directory fsynced, and ``X.swap``
removed. At open (:func:`finish_compaction`) a ``X.swap`` still there means the new segment was
committed: the renames left are done and the marker removed; ``.cleaned`` files without a marker are
an unfinished compaction: removed, the old segment stands.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from pathlib import Path

from zeps.journal._files import fsync_path

__all__ = ["CLEANED", "SUFFIXES", "SWAP", "cleaned_path", "commit_cleaned", "finish_compaction", "write_durably"]

log = logging.getLogger(__name__)

SUFFIXES = (".log", ".off", ".idx", ".seal")  #: a segment's files
CLEANED = ".cleaned"  #: appended to a file's name while its compacted version is written
SWAP = ".swap"  #: the suffix of the commit marker (the segment's base, then this)


def cleaned_path(path: Path) -> Path:
    """Where the compacted version of a segment file is written before it replaces ``path``."""
    return path.with_name(path.name + CLEANED)


def write_durably(path: Path, data: bytes) -> None:
    """Write ``data`` as ``path`` (created or truncated) and fsync it."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        written, view = 0, memoryview(data)
        while written < len(data):  # (a slice assigned to itself in a loop is written twice when compiled)
            written += os.write(fd, view[written:])
        os.fsync(fd)
    finally:
        os.close(fd)


def commit_cleaned(log_path: Path, step: Callable[[str], None]) -> None:
    """Put a segment's ``.cleaned`` files (all written and fsynced) in place of its files; ``step`` is
    called after each step that changes the disk (the crash tests fail one there)."""
    directory, marker = log_path.parent, log_path.with_suffix(SWAP)
    write_durably(marker, b"")
    fsync_path(directory)
    step("committed")
    for suffix in SUFFIXES:
        target = log_path.with_suffix(suffix)
        os.replace(cleaned_path(target), target)
        step(f"replaced {suffix}")
    fsync_path(directory)
    marker.unlink()
    fsync_path(directory)
    step("done")


def finish_compaction(directory: Path) -> list[Path]:
    """Finish or undo what a crash left of compactions in ``directory`` (see the module's notes);
    returns the segments' .log paths it finished."""
    finished = []
    for marker in sorted(directory.glob(f"*{SWAP}")):
        log_path = marker.with_suffix(".log")
        for suffix in SUFFIXES:
            target = log_path.with_suffix(suffix)
            if cleaned_path(target).exists():
                os.replace(cleaned_path(target), target)
        fsync_path(directory)
        marker.unlink()
        finished.append(log_path)
        log.warning("journal %s: finished the compaction of %s a stop interrupted", directory.name, log_path.name)
    leftovers = sorted(directory.glob(f"*{CLEANED}"))
    for path in leftovers:
        path.unlink()
    if leftovers:
        log.warning("journal %s: removed an unfinished compaction's files (%s); the segment stands as it was",
                    directory.name, ", ".join(p.name for p in leftovers))  # fmt: skip
    if finished or leftovers:
        fsync_path(directory)
    return finished
