"""Exactly-once publishing into a ZepsStream across crashes: a real broker process and a real publisher
process (an idempotent producer with a fixed ``producer_id``) are each killed with SIGKILL mid-run and
started again, at every fsync mode. Whatever was in flight, the stream ends up holding every input
item once, in order, with contiguous sequences. Real sockets on 127.0.0.1, real journal files."""

from __future__ import annotations

import asyncio
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from zeps.broker import BrokerConfig, BrokerServer
from zeps.client import AsyncStreamClient, StreamClient
from zeps.journal import JournalConfig
from zeps_dev.process import free_port, wait_until

TOTAL = int(os.environ.get("ZEPS_CHAOS_TOTAL", "20000"))  # the scale: ZEPS_CHAOS_TOTAL=200000
GROUP = 500
# The publisher: items 1..TOTAL, ``publish_many`` groups of GROUP with ``flush()`` after each. Started
# again after a kill, it continues after the last item the broker holds from its producer name. It
# starts each group when the test says "go", so the test knows which group a kill interrupts.
PUBLISHER = """
import sys
from zeps.client import AsyncStreamClient, StreamClient

endpoint, total, group = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
with StreamClient(endpoint, "prices", producer_id="chaos-publisher", timeout=60) as client:
    done = client.producer_sequence
    print("resumed", done, flush=True)
    while done < total and sys.stdin.readline() == "go\\n":
        items = [("k", b"%d" % i) for i in range(done + 1, min(done + group, total) + 1)]
        client.publish_many(items)
        client.flush(timeout=60)
        done += len(items)
        print("confirmed", done, flush=True)
"""


class _Process:
    """A child process whose stdout lines arrive on a queue (read by a thread: no blocking read)."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []  # every line taken, for the error message
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.decode(errors="replace").strip())

    def wait_for(self, prefix: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self.lines.get(timeout=left)
            except queue.Empty:
                break
            self.seen.append(line)
            if line.startswith(prefix):
                return line
        tail = "\n".join(self.seen[-15:])
        raise AssertionError(f"no line starting {prefix!r} within {timeout}s (exit code {self.proc.poll()}):\n{tail}")

    def go(self) -> None:
        """Let the publisher start its next group."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"go\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill()


@pytest.mark.parametrize("idempotent", [True, False])
def test_a_batch_journaled_but_unconfirmed_when_the_broker_stops_is_stored_once(
    tmp_path: Path, idempotent: bool
) -> None:
    """The case a crash makes likely and a test can make certain: the broker journaled a batch, then
    stopped before confirming it. The client resends it to the next broker, which must drop it. With
    ``idempotent=False`` (the baseline, at-least-once) the same steps store it twice: the resend happened."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    config = BrokerConfig(tmp_path, ("prices",), journal=JournalConfig(fsync="always"))
    broker = BrokerServer(config, bind=endpoint).start()
    client = StreamClient(endpoint, "prices", timeout=30, idempotent=idempotent).connect()
    try:
        client.publish_many([("k", b"%d" % i) for i in range(500)])  # fewer than confirm_every: no barrier yet
        wait_until(lambda: broker.core.streams["prices"].journal.durable == 500, timeout=10, what="the journal")
        assert client.session.unconfirmed == 500
        broker.stop()
        broker = BrokerServer(config, bind=endpoint).start()
        client.flush()  # its barrier finds the connection gone: it attaches again and resends the 500
        assert client.reconnects >= 1 and client.session.unconfirmed == 0
        duplicates = broker.core.streams["prices"].duplicates
    finally:
        client.close()
        broker.stop()
    journal = BrokerServer(config, bind=endpoint).core.open().streams["prices"].journal
    bodies = [r.body for r in journal.read(1, max_records=2000)]
    journal.close()
    if idempotent:
        assert bodies == [b"%d" % i for i in range(500)] and duplicates == 500
    else:
        assert bodies == [b"%d" % i for i in range(500)] * 2 and duplicates == 0


def test_the_async_client_is_an_idempotent_producer_too(tmp_path: Path) -> None:
    """The same steps with AsyncStreamClient, whose reader task notices the stopped broker and
    attaches again: the resent batch is dropped, and a named producer's restart goes on after it."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    config = BrokerConfig(tmp_path, ("prices",), journal=JournalConfig(fsync="always"))
    servers = [BrokerServer(config, bind=endpoint).start()]

    async def scenario() -> int:
        client = await AsyncStreamClient(endpoint, "prices", timeout=30, producer_id="async-0").connect()
        try:
            await client.publish_many([("k", b"%d" % i) for i in range(500)])
            await asyncio.to_thread(wait_until, lambda: servers[0].core.streams["prices"].journal.durable == 500,
                                    timeout=10, what="the journal")  # fmt: skip
            await asyncio.to_thread(servers[0].stop)
            servers[0] = BrokerServer(config, bind=endpoint).start()
            await client.flush()
        finally:
            await client.close()
        restarted = await AsyncStreamClient(endpoint, "prices", timeout=30, producer_id="async-0").connect()
        try:
            return restarted.producer_sequence
        finally:
            await restarted.close()

    try:
        assert asyncio.run(scenario()) == 500
        duplicates = servers[0].core.streams["prices"].duplicates
    finally:
        servers[0].stop()
    assert duplicates == 500
    journal = BrokerServer(config, bind=endpoint).core.open().streams["prices"].journal
    assert [r.body for r in journal.read(1, max_records=2000)] == [b"%d" % i for i in range(500)]
    journal.close()


@pytest.mark.slow
@pytest.mark.parametrize("fsync", ["always", "group", "interval", "never"])
def test_kill9_of_broker_and_publisher_loses_nothing_and_duplicates_nothing(tmp_path: Path, fsync: str) -> None:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    broker_argv = [sys.executable, "-m", "zeps.broker.main", "--stream", "prices", "--data-dir", str(tmp_path),
                   "--bind", endpoint, "--fsync", fsync, "--segment-bytes", "65536"]  # fmt: skip
    publisher_argv = [sys.executable, "-c", PUBLISHER, endpoint, str(TOTAL), str(GROUP)]

    def broker() -> _Process:
        started = _Process(broker_argv)
        started.wait_for("zeps-broker: serving", 30)
        return started

    running = [broker(), _Process(publisher_argv)]
    # after this many items are confirmed, the next group is sent and this process is killed at once,
    # with that group in flight (or not yet out of the publisher): the broker 4 times, the publisher twice
    tenth = TOTAL // 10
    plan = {tenth: "broker", 2 * tenth: "publisher", 3 * tenth: "broker", 5 * tenth: "broker", 6 * tenth: "publisher",
            7 * tenth: "broker"}  # fmt: skip
    resumed: list[int] = [int(running[1].wait_for("resumed", 60).split()[1])]
    try:
        done = resumed[0]
        while done < TOTAL:
            victim = plan.pop(done, None)
            running[1].go()
            if victim == "broker":
                running[0].kill()
                running[0] = broker()
            elif victim == "publisher":
                running[1].kill()
                running[1] = _Process(publisher_argv)
                resumed.append(int(running[1].wait_for("resumed", 60).split()[1]))
                done = resumed[-1]
                continue
            done = int(running[1].wait_for("confirmed", 60).split()[1])
        assert running[1].proc.wait(30) == 0
        with StreamClient(endpoint, "prices", idempotent=False, timeout=30) as reader:
            reader.start("", since="earliest")
            rows: list[tuple[int, str, bytes, int | None]] = []
            deadline = time.monotonic() + 60
            while len(rows) < TOTAL and time.monotonic() < deadline:
                rows += reader.receive_rows(1.0)
            rows += reader.receive_rows(1.0)  # anything beyond TOTAL would be a duplicate
    finally:
        for process in running:
            process.stop()
    assert not plan, f"kills planned but not made: {plan}"
    bodies = [body for _, _, body, _ in rows]
    assert len(bodies) == TOTAL, f"{len(bodies) - TOTAL:+d} records against the {TOTAL} published"
    assert bodies == [b"%d" % i for i in range(1, TOTAL + 1)], "lost, duplicated or reordered items"
    assert [sequence for sequence, *_ in rows] == list(range(1, TOTAL + 1)), "sequences are not contiguous"
    # each restarted publisher went on from where the broker said its name stopped: after the items
    # confirmed before the kill, and at most the group in flight (journaled, not yet confirmed) more
    assert resumed[0] == 0 and len(resumed) == 3, resumed
    assert 2 * tenth <= resumed[1] <= 2 * tenth + GROUP and 6 * tenth <= resumed[2] <= 6 * tenth + GROUP, resumed
