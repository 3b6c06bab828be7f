"""Partitioned streams with real processes: a ``zeps-broker`` set per partition (``--partition``)
registered in a real ZooKeeper, and :class:`PartitionedStreamClient` publishing each key to its
partition and reading them all. Checked against the brokers' own journals (each partition holds
exactly its keys' records) and against a history (every confirmed publish read once, in order per
key, resumable from a saved position; exactly once across a partition leader's SIGKILL)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from harness import PlainPartitions, ReplicaSet, ZooKeeperHarness, until
from workers.workload import Pace
from zeps.client import PartitionedStreamClient, PartitionMessage, Position, StreamClient
from zeps.errors import PublishRefusedError
from zeps.partitioning import partition_of

PARTITIONS = 3


def _orders(count: int, start: int = 0) -> list[tuple[str, bytes]]:
    """``count`` orders of 40 customers; a body says its customer and its number for that customer."""
    return [(f"customer-{n % 40}", b"%d" % (n // 40)) for n in range(start, start + count)]


def _read_all(client: PartitionedStreamClient, count: int) -> list[PartitionMessage]:
    got: list[PartitionMessage] = []
    deadline = time.monotonic() + 60
    while len(got) < count and time.monotonic() < deadline:
        got += client.receive_many(0.5)
    return got


def _per_key_in_order(messages: list[PartitionMessage]) -> dict[str, list[int]]:
    by_key: dict[str, list[int]] = defaultdict(list)
    for m in messages:
        by_key[m.key].append(int(m.body))
    return by_key


def test_each_key_goes_to_its_partition_and_a_reader_gets_every_partition_in_order_per_key(plain: list[str]) -> None:
    with PartitionedStreamClient(plain, "orders", producer_id="shop") as client:
        client.publish_many(_orders(2000))
        client.publish("customer-7", b"50")  # one at a time too
        client.flush(timeout=30)
    for p, endpoint in enumerate(plain):  # each broker's journal: exactly the keys of its partition
        with StreamClient(endpoint, "orders") as one:
            keys = {m.key for m in one.fetch("", first=1).messages}
        assert keys and all(partition_of(k, PARTITIONS) == p for k in keys), (p, keys)
    with PartitionedStreamClient(plain, "orders") as reader:
        reader.start("", since="earliest")
        got = _read_all(reader, 2001)
        assert len(got) == 2001 and len({(m.partition, m.sequence) for m in got}) == 2001  # each once
        assert all(m.partition == partition_of(m.key, PARTITIONS) for m in got)
        by_key = _per_key_in_order(got)
        assert by_key["customer-7"] == list(range(51)) and len(by_key) == 40
        assert all(v == list(range(len(v))) for v in by_key.values())  # in order, per key
        counts = [sum(1 for m in got if m.partition == p) for p in range(PARTITIONS)]
        assert reader.position == Position(tuple(counts))  # each partition's sequences start at 1


def test_a_reader_resumes_from_a_saved_position_with_no_gap_and_no_duplicate(plain: list[str]) -> None:
    with PartitionedStreamClient(plain, "orders", producer_id="shop") as client:
        client.publish_many(_orders(1200))
        client.flush(timeout=30)
        with PartitionedStreamClient(plain, "orders") as reader:
            reader.start("customer-1", since="earliest")  # a prefix: customer-1 and customer-10..19
            first = _read_all(reader, 330)
            saved = reader.position.to_json()
        client.publish_many(_orders(400, start=1200))
        client.flush(timeout=30)
    with PartitionedStreamClient(plain, "orders") as reader:
        reader.start("customer-1", since=Position.from_json(saved))
        rest = _read_all(reader, 110)
        rest += reader.receive_many(0.7)  # a negative check: nothing more than the 110 that were not read
    assert len(first) == 330 and len(rest) == 110
    seen = [(m.partition, m.sequence) for m in first + rest]
    assert len(set(seen)) == len(seen)
    assert all(v == list(range(40)) for v in _per_key_in_order(first + rest).values())


def test_a_reader_of_chosen_partitions_gets_only_theirs(plain: list[str]) -> None:
    with PartitionedStreamClient(plain, "orders", producer_id="shop") as client:
        client.publish_many(_orders(400))
        client.flush(timeout=30)
    with PartitionedStreamClient(plain, "orders") as reader:
        reader.start("", since="earliest", partitions=[1])
        got = _read_all(reader, sum(1 for k, _ in _orders(400) if partition_of(k, PARTITIONS) == 1))
        got += reader.receive_many(0.5)  # a negative check: nothing of another partition follows
    assert got and {m.partition for m in got} == {1}
    assert len(got) == sum(1 for k, _ in _orders(400) if partition_of(k, PARTITIONS) == 1)
    assert reader.position.last[0] == reader.position.last[2] == 0


def test_a_partition_leaders_kill_loses_nothing_confirmed_and_stores_nothing_twice(
    zookeeper: ZooKeeperHarness, tmp_path: Path
) -> None:
    """Two partitions of three replicas each (``--min-insync 2``); partition 1's leader is killed while
    an idempotent publisher goes on: every confirmed order is in its partition exactly once."""
    sets = [ReplicaSet(zookeeper, tmp_path / f"p{p}", stream="orders", partition=p) for p in range(2)]
    for s in sets:
        for name in s.names:
            s.start(name)
    try:
        for s in sets:
            until(lambda s=s: s.state() is not None and len(s.state().isr) == 3, "3 replicas in sync", timeout=30)
        located = [s.located() for s in sets]
        confirmed: list[tuple[str, bytes]] = []
        stop = threading.Event()
        errors: list[BaseException] = []

        def publish() -> None:
            try:
                with PartitionedStreamClient([e for e, _ in located], "orders", locators=[loc for _, loc in located],
                                             producer_id="history", timeout=60) as client:  # fmt: skip
                    n = 0
                    while not stop.is_set():
                        batch = _orders(40, start=n)
                        n += 40
                        client.publish_many(batch)
                        tries = Pace(10)  # an election takes a moment: ten tries a second
                        for _ in range(100):
                            tries.step()
                            try:
                                client.flush(timeout=60)
                                break
                            except PublishRefusedError:  # too few in sync for a moment: resent on re-attach
                                continue
                        confirmed.extend(batch)
            except BaseException as exc:
                errors.append(exc)

        thread = threading.Thread(target=publish, daemon=True)
        thread.start()
        until(lambda: len(confirmed) > 400 or bool(errors), "publishes confirmed", timeout=30)
        victim = sets[1].leader()
        sets[1].kill(victim)
        until(lambda: sets[1].state().leader != victim, "partition 1 has a new leader", timeout=30)
        mark = len(confirmed)
        until(lambda: len(confirmed) > mark + 400 or bool(errors), "publishes confirmed after the kill", timeout=60)
        stop.set()
        thread.join(60)
        assert not errors, errors
        with PartitionedStreamClient([s.endpoint() for s in sets], "orders") as reader:
            reader.start("", since="earliest")
            got = _read_all(reader, len(confirmed))
            got += reader.receive_many(0.7)  # a negative check: no duplicate follows
        for p in range(2):
            sequences = [m.sequence for m in got if m.partition == p]
            assert sequences == list(range(1, len(sequences) + 1)), f"partition {p}: a gap or a duplicate"
        expected = _per_key_in_order([PartitionMessage(0, 0, k, b, None) for k, b in confirmed])
        held = _per_key_in_order(got)
        for key, numbers in expected.items():  # every confirmed one, once, in order (and nothing twice)
            assert held[key][: len(numbers)] == numbers and held[key] == list(range(len(held[key]))), key
    finally:
        for s in sets:
            s.stop()


def test_the_stream_handle_of_a_partitioned_stream_publishes_and_reads_by_partition(
    plain: list[str], monkeypatch: pytest.MonkeyPatch, zookeeper: ZooKeeperHarness
) -> None:
    """``zeps.stream(name)`` configured as a pod's would be (ZEPS_STREAM_<NAME>_PARTITIONS) is a
    handle on every partition; so is one given only ZooKeeper and partition 0's endpoint, which
    finds the partitions there."""
    import zeps  # noqa: PLC0415

    monkeypatch.setenv("ZEPS_STREAM_ORDERS_PARTITIONS", ",".join(plain))
    stream = zeps.stream("orders", namespace="default", zookeeper=zookeeper.connect_string, chroot=zookeeper.root,
                         endpoint=plain[0])  # fmt: skip
    monkeypatch.delenv("ZEPS_STREAM_ORDERS_PARTITIONS")
    found = zeps.stream("orders", namespace="default", zookeeper=zookeeper.connect_string, chroot=zookeeper.root,
                        endpoint=plain[0])  # fmt: skip
    try:
        found.publish("customer-1", b"found")
        found.flush()
        assert found.partitions == PARTITIONS
    finally:
        found.close()
    try:
        stream.publish_many(_orders(300))
        stream.flush()
        got = []
        for message in stream.subscribe("", since="earliest"):
            if message.body != b"found":
                got.append(message)
            if len(got) == 300:
                break
    finally:
        stream.close()
    assert {m.partition for m in got} == set(range(PARTITIONS))
    assert all(m.partition == partition_of(m.key, PARTITIONS) for m in got)
    assert all(v == list(range(len(v))) for v in _per_key_in_order(got).values())


def test_a_position_saved_between_single_receives_covers_only_what_was_handed_out(plain: list[str]) -> None:
    """receive() takes a partition's delivery whole and hands it out one message at a time: a position
    saved in between must not cover the messages still held, or a resume from it would skip them."""
    with PartitionedStreamClient(plain, "orders", producer_id="shop") as client:
        client.publish_many(_orders(600))
        client.flush(timeout=30)
    with PartitionedStreamClient(plain, "orders") as reader:
        reader.start("", since="earliest")
        first = [reader.receive(10.0) for _ in range(250)]
        saved = reader.position
    assert all(m is not None for m in first)
    assert sum(saved.last) == 250  # sequences start at 1 in each partition: exactly the 250 handed out
    with PartitionedStreamClient(plain, "orders") as reader:
        reader.start("", since=saved)
        rest = _read_all(reader, 350)
    seen = [(m.partition, m.sequence) for m in [*first, *rest] if m is not None]
    assert len(seen) == len(set(seen)) == 600


def test_the_cli_publishes_to_a_keys_partition_replays_by_position_and_shows_each_partitions_lag(
    plain: list[str], zookeeper: ZooKeeperHarness, tmp_path: Path
) -> None:
    """``zeps stream`` finds a stream's partitions in ZooKeeper: publish goes to the key's partition,
    replay takes a position, lag shows every partition and how far a position is behind."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ZEPS_", "KUBE"))}
    env["KUBECONFIG"] = str(tmp_path / "no-cluster")

    def zeps(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "zeps.cli", "--json", "-n", "default", "--zookeeper", zookeeper.connect_string,
                "--chroot", zookeeper.root, "--endpoint", plain[0], *args]  # fmt: skip
        return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60, check=False)

    done = zeps("stream", "publish", "orders", "customer-7", "a", "b", "c", "--producer-id", "cli")
    assert done.returncode == 0, done.stderr
    again = zeps("stream", "publish", "orders", "customer-7", "a", "b", "c", "--producer-id", "cli")
    assert json.loads(again.stdout) == {"published": 0, "held": 3}  # its partition's producer table
    p = partition_of("customer-7", PARTITIONS)
    replay = zeps("stream", "replay", "orders", "--since", '{"last": [0, 0, 0]}', "--timeout", "2")
    rows = [json.loads(line) for line in replay.stdout.splitlines()]
    assert [(r["partition"], r["sequence"], r["body"]) for r in rows] == [(p, 1, "a"), (p, 2, "b"), (p, 3, "c")]
    refused = zeps("stream", "replay", "orders", "--since", "1")
    assert refused.returncode == 3 and "sequences are per partition" in refused.stderr

    position = json.dumps({"last": [1 if q == p else 0 for q in range(PARTITIONS)]})

    def lag() -> dict[str, Any]:
        out = zeps("stream", "lag", "orders", "--position", position)
        return json.loads(out.stdout) if out.returncode == 0 else {}

    until(lambda: [q.get("lastSequence") for q in lag().get("partitions", [])] == [3 if q == p else 0
          for q in range(PARTITIONS)], "every partition's facts", timeout=30)  # fmt: skip
    assert lag()["positionLag"] == 2


def test_a_publisher_a_reader_and_a_group_member_take_up_partitions_added_to_a_live_stream(
    zookeeper: ZooKeeperHarness, tmp_path: Path
) -> None:
    """A stream of two partitions grows to three while handles on it publish, read every partition
    and consume as a group of one: each notices (a ZooKeeper watch), keys then go to their partition
    among three, the reader reads the new partition from its start, the member claims it, and every
    message is read once by each."""
    import zeps  # noqa: PLC0415

    brokers = PlainPartitions(zookeeper, tmp_path, 2)
    try:
        endpoints = brokers.endpoints()

        def handle() -> Any:
            return zeps.stream("orders", namespace="default", zookeeper=zookeeper.connect_string,
                               chroot=zookeeper.root, endpoint=endpoints[0])  # fmt: skip

        publisher, reader = handle(), handle()
        member = handle().consumer_group("billing", member="m1")
        try:
            reader.start("", since="earliest")
            published = _orders(200)
            publisher.publish_many(published)
            publisher.flush(timeout=30)
            assert publisher.partitions == reader.partitions == 2
            brokers.add()
            n = 200

            def grown() -> bool:  # publishing one more order at a time until the publisher has three
                nonlocal n
                published.extend(_orders(1, n))
                n += 1
                publisher.publish_many(published[-1:])
                return bool(publisher.partitions == 3)

            until(grown, "the publisher to see the third partition", timeout=30)
            after = _orders(300, n)
            publisher.publish_many(after)
            publisher.flush(timeout=30)
            published += after
            got = _read_all(reader, len(published))
            processed: list[PartitionMessage] = []
            until(lambda: processed.extend(member.receive_many(0.2)) or len(processed) >= len(published),
                  "the member to process everything", timeout=60)  # fmt: skip
            assigned = member.assigned
        finally:
            for h in (publisher, reader, member):
                h.close()
    finally:
        brokers.stop()
    assert reader.partitions == 3 and assigned == [0, 1, 2]
    for name, messages in (("reader", got), ("member", processed)):
        assert sorted((m.key, int(m.body)) for m in messages) == sorted((k, int(b)) for k, b in published), name
        for p in range(3):  # a key whose slot moved starts a new run in its new partition: in order in each
            in_p = [m for m in messages if m.partition == p]
            assert all(v == sorted(v) for v in _per_key_in_order(in_p).values()), f"{name}: partition {p} out of order"
    assert all(m.partition == partition_of(m.key, 3) for m in got if (m.key, m.body) in set(after))
    assert any(m.partition == 2 for m in got)
