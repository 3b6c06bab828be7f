"""The pinned binaries of the test tiers: etcd, kube-apiserver, kube-controller-manager,
kube-scheduler, kubectl, kwok, helm and SeaweedFS's weed, which ``tools/testbin/build.sh`` builds
from their pinned Go modules into the zeps cache and names in ``ZEPS_TESTBIN``.

``make setup`` builds them before anything else. ``make test`` does not wait for them: on a new
machine they are a quarter of an hour of compiling, and most of the suite (the unit tier, ZooKeeper,
Spark) needs none of them. Its pytest session starts the build in the background when it has
collected a test that needs them (:func:`start_background_build`), runs the tests that need none
first (the root conftest orders them so), and the first fixture that needs a binary waits for the
build (:func:`binaries`). The build script is idempotent and locks each module, so a build that
``make e2e-stack`` runs beside it (CI) is shared, not repeated.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

from zeps.errors import SetupError
from zeps_dev.process import signal_when_parent_ends

__all__ = ["ENV_TESTBIN", "binaries", "ready", "start_background_build", "stop_background_build"]

ENV_TESTBIN = "ZEPS_TESTBIN"
BUILD_SCRIPT = Path(__file__).resolve().parents[2] / "tools" / "testbin" / "build.sh"
#: what the test set of build.sh makes (kubectl and helm for the chart tests, weed the S3 server)
TEST_BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kwok", "helm",
                 "weed")  # fmt: skip
#: a cold build takes 15 minutes on 2 cores; beside a loaded suite it may take twice that
BUILD_TIMEOUT_S = 60 * 60
#: niced: the tests running meanwhile have servers with timeouts, the build has none (not far: in CI
#: the stack job, at the same niceness, waits for the same modules)
BUILD_NICENESS = 5


class _Build:
    """The one background run of build.sh of this process: its folder's stdout (whose last line names
    the binaries' folder) and stderr (its progress), and when it started."""

    def __init__(self) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="zeps-testbin-"))
        self.out, self.log = self.folder / "build.out", self.folder / "build.log"
        with self.out.open("wb") as out, self.log.open("wb") as err:
            # SIGTERM to build.sh when the session's main thread ends, even killed (no atexit then):
            # it stops its go build itself (build.sh's trap), which a SIGKILL to it would orphan
            self.process = subprocess.Popen(
                ["nice", "-n", str(BUILD_NICENESS), str(BUILD_SCRIPT), "test"],
                stdout=out, stderr=err, stdin=subprocess.DEVNULL, start_new_session=True,
                preexec_fn=signal_when_parent_ends(signal.SIGTERM),  # noqa: PLW1509 — before any thread
            )  # fmt: skip
        self.started = time.monotonic()

    def wait(self) -> Path:
        """Wait for the build (within BUILD_TIMEOUT_S of its start); the binaries' folder it printed."""
        try:
            rc = self.process.wait(timeout=max(1.0, BUILD_TIMEOUT_S - (time.monotonic() - self.started)))
        except subprocess.TimeoutExpired:
            self.stop()
            raise SetupError(f"building the pinned binaries took over {BUILD_TIMEOUT_S}s; see {self.log}") from None
        if rc != 0:
            tail = "\n".join(self.log.read_text(errors="replace").splitlines()[-15:])
            raise SetupError(f"building the pinned binaries failed (exit {rc}); build.sh printed:\n{tail}")
        printed = self.out.read_text().split()
        if not printed:
            raise SetupError(f"build.sh printed no folder; see {self.log}")
        return Path(printed[-1])

    def stop(self) -> None:
        """Stop the build if it still runs (its whole process group: the go commands too)."""
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
            except ProcessLookupError:
                pass


_build: list[_Build] = []  # the background build of this process, when one was started


def ready(names: Iterable[str] = TEST_BINARIES) -> Path | None:
    """The folder ``ZEPS_TESTBIN`` names if it holds every one of ``names``, else None."""
    value = os.environ.get(ENV_TESTBIN)
    if not value:
        return None
    folder = Path(value)
    return folder if all((folder / name).exists() for name in names) else None


def start_background_build() -> None:
    """Start build.sh in the background (niced, in a process group of its own, stopped at exit) unless
    the binaries are there or a build of this process was started. Its output goes to a temporary
    folder removed at exit (a failed module's whole log stays in the cache, beside its build)."""
    if _build or ready() is not None:
        return
    if not BUILD_SCRIPT.exists():
        raise SetupError(f"{ENV_TESTBIN} is not set and {BUILD_SCRIPT} is missing; run `make setup`")
    build = _Build()
    _build.append(build)
    atexit.register(shutil.rmtree, build.folder, ignore_errors=True)
    atexit.register(stop_background_build)  # registered last, so run first
    print(f"[testbin] building the pinned binaries in the background (progress: {build.log})", file=sys.stderr)


def stop_background_build() -> None:
    """Stop the background build if it still runs."""
    for build in _build:
        build.stop()


def binaries(names: Iterable[str] = TEST_BINARIES) -> Path:
    """The folder with the pinned binaries ``names``: ``ZEPS_TESTBIN``'s when it holds them, else the
    one build.sh makes (waiting for the background build, or starting one and waiting). The folder
    is put in ``ZEPS_TESTBIN`` so the processes the tests start find it too."""
    wanted = tuple(names)
    folder = ready(wanted)
    if folder is not None:
        return folder
    start_background_build()
    print(f"[testbin] waiting for the pinned binaries (progress: {_build[0].log})", file=sys.stderr)
    os.environ[ENV_TESTBIN] = str(_build[0].wait())
    folder = ready(wanted)
    if folder is None:
        raise SetupError(f"{ENV_TESTBIN}={os.environ[ENV_TESTBIN]} lacks one of {', '.join(wanted)} after the build")
    return folder
