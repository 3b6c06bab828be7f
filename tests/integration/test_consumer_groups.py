"""Consumer groups over a partitioned stream, against a real ZooKeeper and real brokers (one per
partition, ``--partition``): the recipe's hand-over and fencing, and members reading, joining and
leaving while every message is processed once by the group."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from harness import WORKERS, ZooKeeperHarness, until
from workers.workload import work
from zeps.client import GroupConsumer, PartitionedStreamClient, PartitionMessage
from zeps.coordination.consumers import ConsumerGroup, PartitionLostError, describe
from zeps.partitioning import partition_of
from zeps.paths import StreamPaths

PARTITIONS = 3


def _group(zookeeper: ZooKeeperHarness, member: str, client: object | None = None) -> ConsumerGroup:
    paths = StreamPaths.of("default", "orders", chroot=zookeeper.root).consumer_group("billing")
    return ConsumerGroup(client or zookeeper.client(), paths, member).join()  # type: ignore[arg-type]


def _partitions(zookeeper: ZooKeeperHarness) -> Callable[[], list[dict[str, Any]]]:
    """Group "billing" per partition as ZooKeeper holds it now (``describe``: the sequence committed,
    the owner or ""), read afresh at each call: what :func:`until` waits on."""
    paths = StreamPaths.of("default", "orders", chroot=zookeeper.root).consumer_group("billing")
    client = zookeeper.client()
    return lambda: list(describe(client, paths, PARTITIONS)["partitions"])


def _committed(zookeeper: ZooKeeperHarness) -> Callable[[], int]:
    """How many records the group has committed over every partition (sequences count from 1)."""
    partitions = _partitions(zookeeper)
    return lambda: sum(p["committed"] for p in partitions())


def test_a_partition_passes_to_its_next_owner_after_the_last_commit_and_a_lost_owner_cannot_commit(
    zookeeper: ZooKeeperHarness,
) -> None:
    a_client = zookeeper.client()
    a, b = _group(zookeeper, "a", a_client), _group(zookeeper, "b")
    until(lambda: a.members() == ["a", "b"], "both members")
    assert (a.wanted(3), b.wanted(3)) == ([0, 2], [1])
    claim = a.claim(0)
    assert claim is not None and claim.sequence == 0
    assert b.claim(0) is None  # a still owns it
    a.commit(claim, 40)
    a.release(claim)
    taken = b.claim(0)
    assert taken is not None and taken.sequence == 40  # right after what a processed
    with pytest.raises(PartitionLostError, match="no longer owns partition 0"):
        a.commit(claim, 45)  # a's claim is stale: the group's offset stays b's
    b.commit(taken, 50)

    mine = a.claim(2)
    assert mine is not None
    zookeeper.expire_session(a_client)  # a paused past its session: its owner node is gone
    again = b.claim(2)
    assert again is not None
    with pytest.raises(PartitionLostError):
        a.commit(mine, 7)
    b.commit(again, 3)
    assert b.claim(2) is not None  # its own claim, still: claiming twice is harmless
    a.leave()
    b.leave()


class Member(threading.Thread):
    """A group member processing messages into ``processed`` until told to stop (then it leaves)."""

    def __init__(self, zookeeper: ZooKeeperHarness, endpoints: list[str], name: str,
                 processed: list[tuple[int, int]]) -> None:  # fmt: skip
        super().__init__(daemon=True)
        self.consumer = GroupConsumer(endpoints, "orders", group="billing", member=name,
                                      zookeeper=zookeeper.connect_string, chroot=zookeeper.root)  # fmt: skip
        self.processed, self.stopping, self.error = processed, threading.Event(), None
        self.partitions: set[int] = set()

    def run(self) -> None:
        try:
            with self.consumer:
                while not self.stopping.is_set():
                    batch: list[PartitionMessage] = self.consumer.receive_many(0.1, max_messages=20)
                    self.processed += [(m.partition, m.sequence) for m in batch]
                    if batch:
                        work(0.02)  # a backlog stays while members come and go
                    self.partitions = set(self.consumer.assigned)
        except BaseException as exc:  # reported by the test
            self.error = exc  # type: ignore[assignment]


def test_members_share_the_partitions_take_over_as_they_come_and_go_and_process_each_message_once(
    zookeeper: ZooKeeperHarness, plain: list[str]
) -> None:
    total = 3000
    with PartitionedStreamClient(plain, "orders", producer_id="shop") as publisher:
        publisher.publish_many([(f"customer-{n % 50}", b"%d" % n) for n in range(total // 2)])
        publisher.flush(timeout=30)
        processed: list[tuple[int, int]] = []
        members = [Member(zookeeper, plain, name, processed) for name in ("m1", "m2")]
        for m in members:
            m.start()
        until(lambda: len(processed) > 300, "the first members processing")
        assert len(processed) < total // 2 - 300  # work is left for the third member to take over
        third = Member(zookeeper, plain, "m3", processed)
        third.start()  # a member joins: partitions are handed over to it
        until(lambda: len(third.partitions) == 1 and sum(len(m.partitions) for m in members) == 2,
              "three members with one partition each", timeout=30)  # fmt: skip
        publisher.publish_many([(f"customer-{n % 50}", b"%d" % n) for n in range(total // 2, total)])
        publisher.flush(timeout=30)
        until(lambda: len(processed) > total * 2 // 3, "more processed", timeout=60)
        assert len(processed) < total - 300  # a backlog is left for the hand-over
        members[0].stopping.set()  # a member leaves: the others take its partition over
        members[0].join(30)
        until(lambda: len(processed) >= total, "every message processed", timeout=60)
        committed = _committed(zookeeper)  # and committed: nothing is left for anyone to read again
        until(lambda: committed() == total, "every message committed", timeout=30)
        for m in (members[1], third):
            m.stopping.set()
            m.join(30)
    assert all(m.error is None for m in (*members, third)), [m.error for m in (*members, third)]
    twice = [k for k, n in Counter(processed).items() if n > 1]
    assert not twice, f"processed twice: {twice[:10]}"
    assert len(processed) == total
    counts = Counter(p for p, _ in processed)  # each partition's sequences 1..n, every one of them
    assert {(p, s) for p, s in processed} == {(p, s) for p in counts for s in range(1, counts[p] + 1)}


def _publish_orders(plain: list[str], total: int) -> None:
    """``total`` orders of 50 customers, confirmed, over the partitions ``plain``."""
    with PartitionedStreamClient(plain, "orders", producer_id="shop") as publisher:
        publisher.publish_many([(f"customer-{n % 50}", b"%d" % n) for n in range(total)])
        publisher.flush(timeout=30)


def _member(zookeeper: ZooKeeperHarness, plain: list[str], name: str, out: Path) -> subprocess.Popen[bytes]:
    """A consumer-group member process (tests/workers/stream_group_member.py) writing what it processed to ``out``."""
    argv = [sys.executable, str(WORKERS / "stream_group_member.py"), "--zookeeper", zookeeper.connect_string,
            "--chroot", zookeeper.root, "--endpoints", ",".join(plain), "--member", name,
            "--out", str(out)]  # fmt: skip
    return subprocess.Popen(argv)


def test_a_member_killed_mid_backlog_leaves_only_its_last_uncommitted_batch_to_be_processed_again(
    zookeeper: ZooKeeperHarness, plain: list[str], tmp_path: Path
) -> None:
    """SIGKILL of a member: once its session expires (2 s) the other takes its partitions over from
    the group's last commit. Every message is processed; the only ones processed twice are the
    killed member's last batch (at most 20), which it processed without asking for more; an
    idempotent handler (keyed by partition and sequence) takes effect once for each."""
    total = 3000
    _publish_orders(plain, total)
    outs = {name: tmp_path / f"{name}.out" for name in ("m1", "m2")}

    def member(name: str) -> subprocess.Popen[bytes]:
        return _member(zookeeper, plain, name, outs[name])

    procs = {name: member(name) for name in outs}

    def processed() -> list[tuple[int, int]]:
        lines = [line for out in outs.values() if out.exists() for line in out.read_text().splitlines()]
        return [(int(p), int(s)) for p, s in (line.split() for line in lines if line.count(" ") == 1)]

    try:
        until(lambda: len(processed()) > 600, "both members processing", timeout=30)
        assert len(processed()) < total - 1000
        procs["m1"].send_signal(signal.SIGKILL)
        procs["m1"].wait(10)
        until(lambda: len(set(processed())) >= total, "the rest processed by the other member", timeout=60)
        committed = _committed(zookeeper)  # and committed: nothing is left for anyone to read again
        until(lambda: committed() == total, "every message committed", timeout=30)
    finally:
        for proc in procs.values():
            if proc.poll() is None:
                proc.terminate()
            proc.wait(15)
    seen = processed()
    twice = [k for k, n in Counter(seen).items() if n > 1]
    assert len(set(seen)) == total  # every message processed (an idempotent handler's effect: once each)
    assert len(twice) <= 20, f"more than the killed member's last batch processed again: {len(twice)}"


def test_a_member_paused_past_its_session_hands_out_nothing_of_the_partitions_another_took(
    zookeeper: ZooKeeperHarness, plain: list[str], tmp_path: Path
) -> None:
    """SIGSTOP of a member for longer than its session (2 s): the other member takes its partitions
    over. When it resumes, it holds records it read before the pause; it must hand none of them out
    (they are the new owner's now), not even once before its commit is refused (before, it handed
    out what it had buffered, and both members processed the same records)."""
    total = 9000
    _publish_orders(plain, total)
    outs = {name: tmp_path / f"{name}.out" for name in ("m1", "m2")}

    def member(name: str) -> subprocess.Popen[bytes]:
        return _member(zookeeper, plain, name, outs[name])

    def lines(name: str) -> list[tuple[int, int]]:
        text = outs[name].read_text() if outs[name].exists() else ""
        return [(int(p), int(s)) for p, s in (line.split() for line in text.splitlines() if line.count(" ") == 1)]

    procs = {"m1": member("m1")}
    try:
        until(lambda: len({p for p, _ in lines("m1")}) == PARTITIONS, "m1 reading every partition", timeout=30)
        procs["m1"].send_signal(signal.SIGSTOP)
        paused_at = len(lines("m1"))
        procs["m2"] = member("m2")
        until(lambda: len({p for p, _ in lines("m2")}) == PARTITIONS, "m2 taking every partition over", timeout=30)
        procs["m1"].send_signal(signal.SIGCONT)
        until(lambda: len(set(lines("m1")) | set(lines("m2"))) >= total, "every message processed", timeout=90)
        # m1 back in the group, owning a partition again: it claims in the call after the one that
        # would hand out what it had read before the pause (written to its file before it asks again)
        partitions = _partitions(zookeeper)
        until(lambda: any(p["owner"] == "m1" for p in partitions()), "m1 owning a partition again", timeout=30)
    finally:
        for proc in procs.values():
            proc.send_signal(signal.SIGCONT)
            proc.terminate()
            proc.wait(15)
    after_resume = set(lines("m1")[paused_at:])
    both = after_resume & set(lines("m2"))
    assert not both, f"m1 handed out {len(both)} records after its pause that m2 processed too, e.g. {sorted(both)[:5]}"


def test_a_member_from_the_stream_handle_takes_every_partition_in_turn(
    zookeeper: ZooKeeperHarness, plain: list[str]
) -> None:
    """``zeps.stream(name).consumer_group(group)`` (given ZooKeeper and partition 0's endpoint, as a
    pod without the resource's spec would be) is a member named after its host, reading every
    partition of a group of one. Each call starts at the next partition, so with a backlog on
    every partition three calls in a row each bring another partition's messages first."""
    import socket  # noqa: PLC0415

    import zeps  # noqa: PLC0415

    with PartitionedStreamClient(plain, "orders", producer_id="shop") as publisher:
        publisher.publish_many([(f"customer-{n % 50}", b"%d" % n) for n in range(600)])
        publisher.flush(timeout=30)
    stream = zeps.stream("orders", namespace="default", zookeeper=zookeeper.connect_string, chroot=zookeeper.root,
                         endpoint=plain[0])  # fmt: skip
    with stream.consumer_group("audit") as consumer:
        assert consumer.group.member == socket.gethostname()
        seen: set[int] = set()  # one message from each partition: its replay (a chunk of many) is arriving
        until(lambda: seen.update(m.partition for m in consumer.receive_many(0.1, max_messages=1)) or
              len(seen) == PARTITIONS, "a message from every partition")  # fmt: skip
        firsts = [consumer.receive_many(5.0, max_messages=10)[0].partition for _ in range(PARTITIONS)]
        consumer.commit()
        handed = dict(consumer._handed)
        last = [sum(partition_of(f"customer-{n % 50}", PARTITIONS) == p for n in range(600)) for p in range(PARTITIONS)]
        until(lambda: [q.get("lastSequence") for q in _lag(zookeeper, plain, "audit").get("partitions", [])]
              == last, "every partition's facts", timeout=30)  # fmt: skip
        shown = _lag(zookeeper, plain, "audit")
    assert sorted(firsts) == list(range(PARTITIONS)), f"a partition went first twice: {firsts}"
    # `zeps stream lag --group` shows what the group committed of each partition and who reads it
    assert [q["group"] for q in shown["partitions"]] == [
        {"committed": handed[p], "owner": socket.gethostname(), "lag": last[p] - handed[p]} for p in range(PARTITIONS)
    ]
    assert shown["group"] == {"name": "audit", "members": [socket.gethostname()],
                              "lag": sum(last) - sum(handed.values())}  # fmt: skip


def _lag(zookeeper: ZooKeeperHarness, plain: list[str], group: str) -> dict[str, Any]:
    """``zeps --json stream lag orders --group <group>``, configured without Kubernetes."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ZEPS_", "KUBE"))}
    env["KUBECONFIG"] = "/nonexistent/kubeconfig"
    argv = [sys.executable, "-m", "zeps.cli", "--json", "-n", "default", "--zookeeper", zookeeper.connect_string,
            "--chroot", zookeeper.root, "--endpoint", plain[0], "stream", "lag", "orders",
            "--group", group]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)
    return json.loads(out.stdout) if out.returncode == 0 else {}
