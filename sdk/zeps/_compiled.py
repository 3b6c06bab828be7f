"""The compiled hot path: the modules every message goes through, built with mypyc, used when present.

zeps is pure Python, and runs as such everywhere. ``make setup`` also compiles the modules below with
mypyc (part of mypy, which type-checks this code strictly anyway: the same annotations make the C)
into the zeps cache, in a folder named by a hash of their sources, and puts its path in
``ZEPS_COMPILED`` (``.zeps-env``). A process that has ``ZEPS_COMPILED`` imports those modules from
there, and every other module from the sources as usual; one publish per message costs about a
quarter less CPU in the publisher and a fifth less in the broker (``make bench-stream``).

The compiled modules are used only if they were built from exactly the sources beside this file
(each source's SHA-256 is in the folder's manifest): after an edit they are skipped with a warning
until ``make setup`` builds them again, so a stale build never runs. Without ``ZEPS_COMPILED`` (the
images, a plain ``pip install``) nothing changes: the pure-Python modules are the fallback, and
``make test`` runs the unit tier on them as well.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

__all__ = ["COMPILED", "MANIFEST", "activate", "activate_from_environment", "active", "source_digest"]

#: the modules compiled, by name: the path of one published and delivered message, end to end
COMPILED = (
    "zeps._records",
    "zeps.protocol._fastpath",
    "zeps.journal.config",
    "zeps.journal.chunks",
    "zeps.journal.segments",
    "zeps.journal.recovery",
    "zeps.journal.appending",
    "zeps.journal.reading",
    "zeps.journal.copying",
    "zeps.journal.cleaned",
    "zeps.journal.compaction",
    "zeps.journal.log",
    "zeps.broker.appends",
    "zeps.broker.config",
    "zeps.broker.state",
    "zeps.broker.routing",
    "zeps.broker.leading",
    "zeps.broker.publishing",
    "zeps.broker.core",
    "zeps.broker.server",
    "zeps.client.inbox",
    "zeps.client.publishing",
    "zeps.client.session",
    "zeps.client.sync",
)
MANIFEST = "manifest.json"  #: in the build folder: {"modules": {name: [file, sha256 of the source]}, "shared": [...]}
_ROOT = Path(__file__).resolve().parent.parent  # the folder holding the zeps package (sdk/)


def source_digest(module: str) -> str:
    """SHA-256 of a module's source file, as it is now beside this one."""
    return hashlib.sha256((_ROOT / (module.replace(".", "/") + ".py")).read_bytes()).hexdigest()


class _Finder(importlib.abc.MetaPathFinder):
    """Finds the compiled modules (and mypyc's shared library of their group) in the build folder."""

    def __init__(self, files: dict[str, Path]) -> None:
        self.files = files

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        file = self.files.get(fullname)
        return None if file is None else importlib.util.spec_from_file_location(fullname, file)


def active() -> bool:
    """Whether this process imports the compiled modules."""
    return any(isinstance(finder, _Finder) for finder in sys.meta_path)


def activate(directory: str) -> bool:
    """Import the compiled modules from ``directory`` from now on, if it was built from these sources
    for this Python; False (with a warning saying why) if not. Call before any of them is imported."""
    build = Path(directory)
    try:
        manifest = json.loads((build / MANIFEST).read_text())
        modules: dict[str, list[str]] = manifest["modules"]
        shared: list[list[str]] = manifest["shared"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        warnings.warn(f"ZEPS_COMPILED={directory}: no usable {MANIFEST} ({exc}); running pure Python", stacklevel=2)
        return False
    if manifest.get("python") != sys.version or sorted(modules) != sorted(COMPILED):
        warnings.warn(f"ZEPS_COMPILED={directory} was built for another Python or module set; running pure "
                      "Python (make setup builds it again)", stacklevel=2)  # fmt: skip
        return False
    stale = [name for name, (_, digest) in modules.items() if source_digest(name) != digest]
    if stale:
        warnings.warn(f"ZEPS_COMPILED: {', '.join(stale)} changed since the build; running pure Python until "
                      "make setup builds them again", stacklevel=2)  # fmt: skip
        return False
    loaded = [name for name in (*modules, *(n for n, _ in shared)) if name in sys.modules]
    if loaded:
        warnings.warn(f"ZEPS_COMPILED: {', '.join(loaded)} already imported; running pure Python", stacklevel=2)
        return False
    files = {name: build / file for name, (file, _) in modules.items()}
    files.update({name: build / file for name, file in shared})
    sys.meta_path.insert(0, _Finder(files))
    return True


def activate_from_environment() -> None:
    """Called by ``zeps/__init__.py``: activate the build ``ZEPS_COMPILED`` names, if any."""
    directory = os.environ.get("ZEPS_COMPILED")
    if directory and not active():
        activate(directory)
