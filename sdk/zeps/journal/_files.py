"""Small files a journal keeps beside its segments, replaced whole so a crash leaves the old or the
new content, never a mix: written aside, fsynced, renamed over, and the directory fsynced."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["fsync_path", "replace_file"]


def fsync_path(path: Path) -> None:
    """fsync a file (or a directory: its entries) by path."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_file(path: Path, data: bytes) -> None:
    """Make ``data`` the content of ``path`` durably and at once (see the module's notes)."""
    aside = path.with_suffix(".new")
    fd = os.open(aside, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        try:
            if os.write(fd, data) != len(data):  # a full volume may take part of it
                raise OSError(28, f"{aside}: a short write (the volume is full)")
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:
        aside.unlink(missing_ok=True)  # the old content stays; a half-written file aside goes
        raise
    os.replace(aside, path)
    fsync_path(path.parent)
