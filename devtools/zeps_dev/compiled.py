"""Build the compiled hot path (:mod:`zeps._compiled`) with mypyc into the zeps cache.

``python -m zeps_dev.compiled`` (run by ``tools/setup.sh compiled``, part of ``make setup``) prints the build folder:
``<cache>/compiled-<hash>``, the hash over this Python's version, mypy's, and the sources of the
modules in ``zeps._compiled.COMPILED``. An existing folder with its ``.complete`` stamp is reused;
a changed source builds a new one (about 80 s on 2 cores). The build runs on a copy of ``sdk/`` in a
temporary folder, so the working tree never holds a compiled file. Builds of the same sources side
by side (two checkouts' setups at once) take turns on a lock: the second finds the first's folder
complete; old folders are pruned only once complete, never one another setup is still filling.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import json
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from zeps._compiled import COMPILED, MANIFEST, source_digest
from zeps_dev.kind import cache_dir

__all__ = ["build"]

SDK = Path(__file__).resolve().parents[2] / "sdk"


def _key(digests: dict[str, str]) -> str:
    parts = [sys.version, importlib.metadata.version("mypy"), *(f"{m}={d}" for m, d in digests.items())]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


def build(cache: Path | None = None) -> Path:
    """The build folder for the sources as they are, built first if it is not there yet."""
    digests = {name: source_digest(name) for name in COMPILED}  # of the sources the build copies
    out = (cache or cache_dir()) / f"compiled-{_key(digests)}"
    if (out / ".complete").exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(f"{out}.lock", "w") as lock:  # one build of these sources at a time
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / ".complete").exists():  # (the setup it waited for may have built it)
            _build(out, digests)
    _prune(out.parent, keep=out)
    return out


def _build(out: Path, digests: dict[str, str]) -> None:
    shutil.rmtree(out, ignore_errors=True)  # a build interrupted earlier
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    with tempfile.TemporaryDirectory(prefix="zeps-mypyc-") as tmp:
        work = Path(tmp)
        shutil.copytree(SDK / "zeps", work / "zeps", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
        files = [m.replace(".", "/") + ".py" for m in COMPILED]
        done = subprocess.run([sys.executable, "-m", "mypyc", *files], cwd=work, capture_output=True, text=True,
                              check=False)  # fmt: skip
        if done.returncode != 0:
            raise SystemExit(
                f"mypyc failed (the pure-Python modules still work):\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
            )
        out.mkdir(parents=True)
        modules = {}
        for name, file in zip(COMPILED, files, strict=True):
            built = Path(file[: -len(".py")] + suffix)
            (out / built).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(work / built, out / built)
            modules[name] = [str(built), digests[name]]
        shared = [[lib.name[: -len(suffix)], lib.name] for lib in work.glob(f"*__mypyc{suffix}")]
        for _, lib in shared:
            shutil.copy2(work / lib, out / lib)
    (out / MANIFEST).write_text(json.dumps({"python": sys.version, "modules": modules, "shared": shared}, indent=1))
    (out / ".complete").touch()


def _prune(cache: Path, keep: Path, most: int = 3) -> None:
    """Remove all but the ``most`` newest complete builds (each source change makes one: about 3 MB);
    a folder still being filled (no stamp yet) is another setup's, left alone."""
    builds = [b for b in cache.glob("compiled-*") if b.is_dir() and (b / ".complete").exists()]
    builds.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    for old in [b for b in builds if b != keep][most - 1 :]:
        shutil.rmtree(old, ignore_errors=True)
        Path(f"{old}.lock").unlink(missing_ok=True)


if __name__ == "__main__":
    print(build())
