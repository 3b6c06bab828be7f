"""A broker whose disk fails: a full journal volume refuses publishes (never confirms them) and the
broker keeps serving; any other disk error is fatal, and ``zeps-broker`` exits 1 naming the cause
(Kubernetes then records a failure and restarts the pod; a crash used to exit 0).

The journal lives on a real, size-limited filesystem: a tmpfs mounted with ``size=`` in a mount
namespace of the broker's own (``unshare --mount``), so nothing outside the test sees it and it goes
away with the broker. That needs root (CI runs as root); without it these tests are skipped, saying so.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from zeps.client import Seq, StreamClient
from zeps.errors import PublishRefusedError, ZepsError
from zeps_dev.process import ManagedProcess, free_port

_WHY_NOT = ("needs root (a tmpfs in a mount namespace)" if os.geteuid() != 0
            else "needs unshare and prlimit (util-linux)" if not (shutil.which("unshare") and shutil.which("prlimit"))
            else None)  # fmt: skip
pytestmark = pytest.mark.skipif(_WHY_NOT is not None, reason=str(_WHY_NOT))


class BrokerOnTmpfs:
    """``zeps-broker`` with its journal on a tmpfs of ``size`` in a mount namespace of its own."""

    def __init__(self, tmp_path: Path, size: str) -> None:
        self.data = tmp_path / "journal"  # the mount point; the tmpfs shadows it inside the namespace
        self.data.mkdir()
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        mount = f'mount -t tmpfs -o size={size} zeps-test-journal "$0" && exec "$@"'
        self.process = ManagedProcess(
            "zeps-broker-on-tmpfs",
            ["unshare", "--mount", "--propagation", "private", "sh", "-c", mount, str(self.data),
             sys.executable, "-m", "zeps.broker.main", "--stream", "prices", "--data-dir", str(self.data),
             "--bind", self.endpoint, "--fsync", "always", "--segment-bytes", str(256 * 1024)],
            log_path=tmp_path / "broker.log",
        )  # fmt: skip

    def start(self) -> BrokerOnTmpfs:
        self.process.start()
        self.process.wait_ready(lambda: "serving prices" in self.process.log_tail(), timeout=30)
        return self


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerOnTmpfs]:
    server = BrokerOnTmpfs(tmp_path, size="2m").start()
    try:
        yield server
    finally:
        server.process.stop()


def test_a_full_journal_volume_refuses_publishes_and_confirms_only_what_it_wrote(broker: BrokerOnTmpfs) -> None:
    confirmed: list[bytes] = []
    body = bytes(10_000)
    publisher = StreamClient(broker.endpoint, "prices", timeout=10).connect()
    refusal = None
    for round_ in range(1000):  # bounded: 2 MiB fill up long before 200 MB
        batch = [b"%06d" % (round_ * 20 + i) + body for i in range(20)]
        try:  # the refusal comes at the flush, or at a publish once the broker's answer is in
            for message in batch:
                publisher.publish("k", message)
            publisher.flush()
        except PublishRefusedError as exc:
            refusal = exc
            break
        confirmed += batch
    assert refusal is not None, "the volume never filled"
    assert "journal's volume is full" in str(refusal) and "No space left on device" in str(refusal)
    assert 50 < len(confirmed) < 200
    with pytest.raises(PublishRefusedError):  # still full: the resent publishes are refused again
        publisher.close()

    # the broker serves on: a reader gets every confirmed message, once, in order, and nothing else
    with StreamClient(broker.endpoint, "prices", timeout=10) as reader:
        reader.start("", since=Seq(0))
        got: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(got) < len(confirmed) and time.monotonic() < deadline:
            got += [m.body for m in reader.receive_many(0.5)]
        got += [m.body for m in reader.receive_many(0.7)]  # a negative check: no duplicate follows
    assert got[: len(confirmed)] == confirmed, "every confirmed message is there, once, in order"
    written = got[len(confirmed) :]  # of the refused round: what earlier loops wrote before the volume filled
    assert len(written) < len(batch) and written == batch[: len(written)], "nothing else, nothing twice"
    assert broker.process.running()


def test_a_disk_error_other_than_full_stops_the_broker_with_exit_code_1_and_the_cause(broker: BrokerOnTmpfs) -> None:
    """Writes past the broker's file size limit fail with EFBIG (set on the running process with
    prlimit: a disk error that is not a full volume)."""
    publisher = StreamClient(broker.endpoint, "prices", timeout=2).connect()
    publisher.publish("k", b"before")
    publisher.flush()
    subprocess.run(["prlimit", "--pid", str(broker.process.pid), "--fsize=4096"], check=True)
    publisher.publish("k", bytes(10_000))
    assert broker.process.wait(30) == 1
    with pytest.raises(ZepsError):  # nobody confirms it: the broker is gone
        publisher.close()
    last = broker.process.log_tail(1)
    assert last.startswith("zeps-broker: fatal: journal prices:") and "File too large" in last, last
