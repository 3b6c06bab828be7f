"""The compiled hot path (zeps._compiled): used only when built from exactly these sources.

The mechanism is tested with a stand-in build (Python files where mypyc would put extension modules:
the finder loads either by its suffix), so these tests need no compiler; ``make test`` runs the whole
suite on a real mypyc build and the unit tier again without it.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import zeps
from zeps._compiled import COMPILED, MANIFEST, active, source_digest

SDK = Path(zeps.__file__).resolve().parent.parent


def _stand_in(build: Path, *, stale: str | None = None) -> None:
    """A build folder whose modules are the real sources plus a marker (``stale``: recorded with a wrong digest)."""
    modules = {}
    for name in COMPILED:
        file = Path(name.replace(".", "/") + ".py")
        (build / file).parent.mkdir(parents=True, exist_ok=True)
        (build / file).write_text((SDK / file).read_text() + "\nSTAND_IN = True\n")
        modules[name] = [str(file), "0" * 64 if name == stale else source_digest(name)]
    (build / MANIFEST).write_text(json.dumps({"python": sys.version, "modules": modules, "shared": []}))


def _probe(build: Path) -> subprocess.CompletedProcess[str]:
    """A fresh interpreter with ZEPS_COMPILED=build: which modules it imports, from where."""
    stand_ins = f"[getattr(importlib.import_module(m), 'STAND_IN', False) for m in {COMPILED!r}]"
    code = f"import zeps, zeps._compiled as c, importlib; print(c.active(), *{stand_ins})"
    env = {**os.environ, "ZEPS_COMPILED": str(build)}
    return subprocess.run([sys.executable, "-W", "always", "-c", code], env=env, capture_output=True, text=True,
                          timeout=60, check=True)  # fmt: skip


def test_a_build_of_these_sources_is_imported_instead_of_them(tmp_path: Path) -> None:
    _stand_in(tmp_path)
    assert _probe(tmp_path).stdout.split() == ["True"] + ["True"] * len(COMPILED)


def test_a_build_of_other_sources_is_never_used_and_says_so(tmp_path: Path) -> None:
    _stand_in(tmp_path, stale="zeps.broker.core")
    probe = _probe(tmp_path)
    assert probe.stdout.split() == ["False"] + ["False"] * len(COMPILED)  # not one of them: a build is all or none
    assert "zeps.broker.core changed since the build" in probe.stderr


def test_a_missing_build_leaves_zeps_pure(tmp_path: Path) -> None:
    probe = _probe(tmp_path / "nowhere")
    assert probe.stdout.split()[0] == "False" and "no usable manifest.json" in probe.stderr


def test_this_run_uses_the_build_it_was_given() -> None:
    """``make test`` sets ZEPS_COMPILED for the suite (every module of the build from it) and clears it
    for its pure-Python unit step (every module from the sources)."""
    directory = os.environ.get("ZEPS_COMPILED")
    files = [Path(str(importlib.import_module(name).__file__)) for name in COMPILED]
    if directory:
        assert active() and all(f.is_relative_to(directory) and f.suffix == ".so" for f in files), files
    else:
        assert not active() and all(f.is_relative_to(SDK) and f.suffix == ".py" for f in files), files


def test_builds_of_the_same_sources_side_by_side_take_turns_and_build_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two setups at once (a fresh clone's CI beside a working tree's setup): the second waits for the
    first's lock and finds its folder complete (before, it failed on the folder the first had made).
    mypyc's run is put in its place here: a stand-in that takes a while."""
    from zeps_dev import compiled  # noqa: PLC0415

    built: list[Path] = []

    def slow_build(out: Path, _digests: dict[str, str]) -> None:
        out.mkdir(parents=True)
        time.sleep(0.3)  # the other setup arrives meanwhile: the window the lock must cover
        built.append(out)
        (out / ".complete").touch()

    monkeypatch.setattr(compiled, "_build", slow_build)
    with ThreadPoolExecutor(2) as pool:
        folders = list(pool.map(lambda _: compiled.build(tmp_path), range(2)))
    assert folders[0] == folders[1] and built == [folders[0]]
