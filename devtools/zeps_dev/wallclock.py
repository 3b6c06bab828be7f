"""A wall clock that jumps, for the faults a stepped or mis-set host clock brings: the processes
started with :meth:`WallClock.env` read the time of day shifted by an offset this process sets at
any moment (:meth:`jump`), their monotonic clock untouched, as after an NTP step.

::

    clock = WallClock(tmp / "r1.clock")
    proc = subprocess.Popen(argv, env={**os.environ, **clock.env()})
    clock.jump(-6 * 3600)   # six hours back, within 20 ms
    clock.reset()           # the true time again

It is ``wallclock.c`` beside this file, an ``LD_PRELOAD`` library built here with the C compiler
into the zeps cache (keyed by the source's hash; never committed) that shifts ``clock_gettime`` of
the realtime clocks, ``gettimeofday`` and ``time``. Debian's libfaketime was tried first and cannot
run a broker (see ``tests/chaos/replication.py``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

from zeps.errors import SetupError
from zeps_dev.kind import cache_dir

__all__ = ["WallClock", "available", "library"]

SOURCE = Path(__file__).with_suffix(".c")


def available() -> str | None:
    """None if the library can be built here, else why not (a sentence naming the fix)."""
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        return "no C compiler to build the wall-clock library: apt-get install gcc"
    return None


def library() -> Path:
    """The built library (built once per source version; a concurrent build is harmless)."""
    why = available()
    if why is not None:
        raise SetupError(why)
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    built = cache_dir() / f"wallclock-{digest}" / "libzepswallclock.so"
    if built.exists():
        return built
    built.parent.mkdir(parents=True, exist_ok=True)
    partial = built.with_suffix(f".{os.getpid()}.tmp")
    compiler = shutil.which("cc") or "gcc"
    result = subprocess.run([compiler, "-O2", "-shared", "-fPIC", "-Wall", "-Werror", "-o", str(partial), str(SOURCE),
                             "-ldl"], capture_output=True, check=False)  # fmt: skip
    if result.returncode != 0:
        partial.unlink(missing_ok=True)
        raise SetupError(f"building {SOURCE.name} failed: {result.stderr.decode(errors='replace').strip()}")
    partial.replace(built)
    return built


class WallClock:
    """One process's (or several's) wall-clock offset, kept in the file ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.reset()

    def env(self) -> dict[str, str]:
        """What a process's environment needs to read this clock (an ``LD_PRELOAD`` of its own)."""
        preload = " ".join(p for p in (str(library()), os.environ.get("LD_PRELOAD", "")) if p)
        return {"LD_PRELOAD": preload, "ZEPS_WALLCLOCK_FILE": str(self.path)}

    def jump(self, seconds: float) -> None:
        """The processes' time of day, from now on: the true one plus ``seconds`` (within 20 ms)."""
        partial = self.path.with_suffix(".tmp")
        partial.write_text(f"{seconds:.6f}\n")
        partial.replace(self.path)  # a reader sees the old offset or the new one, never half of it

    def reset(self) -> None:
        self.jump(0.0)
