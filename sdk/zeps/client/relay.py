"""A child process that receives a multicast group and hands its messages on over IPC.

libzmq 4.3.4 (Debian bookworm's, which the multicast output needs for NORM and PGM) aborts the whole
process when a NORM receiver's stream breaks (``zmq_assert`` in ``norm_engine.cpp``, reached here
under packet loss; libzmq removed it in 2023, commit ec013f3a, after 4.3.4). A multicast
subscription over NORM therefore receives the group in this child: its SUB socket forwards every
message to a PULL socket of the subscription's over ``ipc://`` (``zmq.proxy``, in C). If libzmq aborts
the child, the subscription starts another and the records the group carried meanwhile are fetched
from the journal like any other gap.

The child dies with its parent (``PR_SET_PDEATHSIG``). Run as ``python -m zeps.client.relay SPEC``,
SPEC being the JSON :class:`Relay` writes.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import zmq

from zeps.options import DEFAULT_PGM_RATE_KBPS, DEFAULT_PGM_RECOVERY_MS, MulticastOptions
from zeps.protocol.limits import max_delivery_frame_bytes

__all__ = ["Relay", "configure_group_socket"]

log = logging.getLogger(__name__)

_RESTART_EVERY = 1.0  # seconds between restarts of a child that keeps dying


def configure_group_socket(sock: Any, options: MulticastOptions, topic: bytes, endpoint: str) -> None:
    """A SUB socket on the group: the stream's topic only, OpenPGM's window sized as the sender's."""
    sock.setsockopt(zmq.SUBSCRIBE, topic)
    sock.setsockopt(zmq.RCVHWM, 100_000)
    sock.setsockopt(zmq.MAXMSGSIZE, max_delivery_frame_bytes())  # anyone may send to a group
    sock.setsockopt(zmq.LINGER, 0)
    if options.transport != "norm":  # OpenPGM sizes its receive window from these, as the sender does
        sock.setsockopt(zmq.RATE, options.rate_kbps or DEFAULT_PGM_RATE_KBPS)
        sock.setsockopt(zmq.RECOVERY_IVL, options.recovery_ms or DEFAULT_PGM_RECOVERY_MS)
    sock.connect(endpoint)


class Relay:
    """The parent's end: a PULL socket (``socket``) bound on IPC, and the child that feeds it."""

    def __init__(self, ctx: Any, options: MulticastOptions, topic: bytes, endpoint: str) -> None:
        self._dir = Path(tempfile.mkdtemp(prefix="zeps-relay-"))
        address = f"ipc://{self._dir / 'group'}"
        self.socket = ctx.socket(zmq.PULL)
        self.socket.setsockopt(zmq.RCVHWM, 100_000)
        self.socket.setsockopt(zmq.MAXMSGSIZE, max_delivery_frame_bytes())
        self.socket.setsockopt(zmq.LINGER, 0)
        self.socket.bind(address)
        spec = {"options": options.model_dump(), "topic": topic.hex(), "endpoint": endpoint, "relay": address}
        self._argv = [sys.executable, "-m", "zeps.client.relay", json.dumps(spec)]
        self._log = self._dir / "relay.log"
        self._proc: subprocess.Popen[bytes] | None = None
        self._started = 0.0
        self.restarts = 0  #: times the child died (libzmq aborted it) and was started again
        self._spawn()
        atexit.register(self.close)  # a process that exits without closing its subscription leaves nothing

    def _spawn(self) -> None:
        with self._log.open("ab") as out:
            self._proc = subprocess.Popen(self._argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
        self._started = time.monotonic()

    def check(self, now: float) -> None:
        """Start the child again if it died (at most once a ``_RESTART_EVERY``)."""
        proc = self._proc
        if proc is None or proc.poll() is None or now - self._started < _RESTART_EVERY:
            return
        tail = self._log.read_text(errors="replace").strip().splitlines()[-1:] if self._log.exists() else []
        log.warning("multicast relay exited with %s (%s): starting another", proc.returncode, " ".join(tail))
        self.restarts += 1
        self._spawn()

    def close(self) -> None:
        atexit.unregister(self.close)
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(10)
        self.socket.close(linger=0)
        shutil.rmtree(self._dir, ignore_errors=True)


def _die_with_parent(parent: int) -> None:
    with contextlib.suppress(OSError, AttributeError):  # Linux: SIGKILL when the parent goes
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # it went before the line above took effect
        sys.exit(0)


def main(argv: list[str]) -> None:
    spec = json.loads(argv[0])
    _die_with_parent(os.getppid())
    ctx: zmq.Context[Any] = zmq.Context()
    group, relay = ctx.socket(zmq.SUB), ctx.socket(zmq.PUSH)
    relay.setsockopt(zmq.SNDHWM, 100_000)
    relay.connect(spec["relay"])
    configure_group_socket(group, MulticastOptions.make(**spec["options"]), bytes.fromhex(spec["topic"]),
                           spec["endpoint"])  # fmt: skip
    zmq.proxy(group, relay)


if __name__ == "__main__":
    main(sys.argv[1:])
