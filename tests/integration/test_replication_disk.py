"""A replicated stream's replicas whose disks fail them: real processes (three ``zeps-broker``
replicas, ``--min-insync 2``), a real ZooKeeper and an idempotent publisher
(``tests/workers/replica_client.py``), each journal on a volume of its own (``zeps_dev.volume``).

* A follower's volume filled to the last byte (a tmpfs): it stays up, out of the in-sync set (it
  acknowledges nothing it could not write), while the leader and the other follower go on confirming;
  once there is space again it catches up and is back in sync.
* A follower's disk slowed to a write a second (an ext4 file system on a loop device, its writes
  throttled by the kernel's block I/O controller): it falls behind and leaves the in-sync set without
  holding confirmations back, and is back once the disk is fast; then the leader's disk slowed: its
  confirmations slow down, nothing is lost.
* A replica elected while its volume is full (it cannot write the epoch it would lead): it stays up,
  leading nothing, and steps aside; alone in line it keeps trying, and once the others are back one
  of them leads, confirming while its volume is still full.

Every journal then holds each confirmed publish exactly once, in order. Needs root (skipped with the
reason otherwise, as the network lab's tests)."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness import Publisher, ReplicaSet, ZooKeeperHarness, assert_published_once_in_order, until
from zeps_dev.volume import PrivateVolume, available, available_disk

pytestmark = pytest.mark.skipif(available() is not None, reason=str(available()))


def test_a_follower_whose_volume_fills_up_stays_up_out_of_sync_and_catches_up_once_there_is_space(
    zookeeper: ZooKeeperHarness, tmp_path: Path
) -> None:
    replicas = ReplicaSet(zookeeper, tmp_path)
    for name in replicas.names:  # each on a volume of its own: whichever follows can be filled
        replicas.volumes[name] = PrivateVolume(tmp_path / name, size=64 << 20).start()
    publisher: Publisher | None = None
    try:
        leader = replicas.start_in_sync()
        full = next(n for n in replicas.names if n != leader)
        publisher = Publisher(zookeeper, tmp_path)
        publisher.goes_on(1, "the publisher confirming")

        taken = replicas.volumes[full].fill()
        assert taken > 0
        until(lambda: full not in replicas.state().isr, f"{full} out of the in-sync set", timeout=60)
        publisher.goes_on(200, "the leader confirming with the other follower")
        assert replicas.procs[full].poll() is None, f"{full} exited on a full volume"
        assert "volume is full" in (tmp_path / f"{full}.log").read_text()

        replicas.volumes[full].free()
        until(lambda: len(replicas.state().isr) == 3, f"{full} back in sync once there is space", timeout=90)
        publisher.goes_on(1, "the publisher confirming with all three")
        confirmed = publisher.stop()
        replicas.stop()
        journals = {name: replicas.journal(name) for name in replicas.names}
    finally:
        if publisher is not None:
            publisher.stop()
        replicas.stop()
        for volume in replicas.volumes.values():
            volume.stop()
    assert_published_once_in_order(journals, confirmed)


@pytest.mark.skipif(available_disk() is not None, reason=str(available_disk()))
def test_a_slow_follower_disk_leaves_the_in_sync_set_without_holding_confirmations_back(
    zookeeper: ZooKeeperHarness, tmp_path: Path
) -> None:
    replicas = ReplicaSet(zookeeper, tmp_path)
    for name in replicas.names:  # each on a disk of its own: whichever follows can be slowed
        replicas.volumes[name] = PrivateVolume(tmp_path / name, size=64 << 20, disk=True).start()
    publisher: Publisher | None = None
    try:
        leader = replicas.start_in_sync()
        slow = next(n for n in replicas.names if n != leader)
        publisher = Publisher(zookeeper, tmp_path)
        publisher.goes_on(1, "the publisher confirming")

        replicas.volumes[slow].slow(writes_per_s=1, bytes_per_s=8 << 10)
        until(lambda: slow not in replicas.state().isr, f"{slow}, on a slow disk, out of the in-sync set", timeout=60)
        publisher.goes_on(200, "the leader confirming with the other follower")
        assert replicas.procs[slow].poll() is None, f"{slow} exited on a slow disk"
        replicas.volumes[slow].fast()
        until(lambda: len(replicas.state().isr) == 3, f"{slow} back in sync once its disk is fast", timeout=90)

        replicas.volumes[leader].slow(writes_per_s=5, bytes_per_s=64 << 10)
        publisher.goes_on(100, "the leader confirming on a slow disk", timeout=90)
        replicas.volumes[leader].fast()
        publisher.goes_on(200, "the publisher confirming once the disk is fast")
        confirmed = publisher.stop()
        replicas.stop()
        journals = {name: replicas.journal(name) for name in replicas.names}
    finally:
        if publisher is not None:
            publisher.stop()
        for volume in replicas.volumes.values():
            volume.fast()  # a throttled broker would be slow to stop
        replicas.stop()
        for volume in replicas.volumes.values():
            volume.stop()
    assert_published_once_in_order(journals, confirmed)


def test_a_replica_elected_on_a_full_volume_stays_up_and_leaves_the_lead_to_one_that_can_write(
    zookeeper: ZooKeeperHarness, tmp_path: Path
) -> None:
    """A follower's volume filled while nothing is published (so it stays caught up, in sync), then
    both other replicas killed: it is elected alone, and cannot begin its epoch. It must stay up (before,
    its broker exited while its election node stood first, and a chaos round never settled) and, once
    the others are back, leave them the lead: they confirm while its volume is still full."""
    replicas = ReplicaSet(zookeeper, tmp_path)
    for name in replicas.names:
        replicas.volumes[name] = PrivateVolume(tmp_path / name, size=64 << 20).start()
    first: Publisher | None = None
    second: Publisher | None = None
    try:
        leader = replicas.start_in_sync()
        full, other = (n for n in replicas.names if n != leader)
        first = Publisher(zookeeper, tmp_path, tag="p")
        first.goes_on(50, "the first publisher confirming")
        confirmed_first = first.stop()
        until(lambda: replicas.all_hold(confirmed_first), "every replica holding the first publisher's records")

        assert replicas.volumes[full].fill() > 0
        replicas.kill(leader)
        replicas.kill(other)
        log = tmp_path / f"{full}.log"
        until(lambda: "cannot begin it" in log.read_text(), f"{full} elected alone, unable to begin its epoch")
        until(lambda: log.read_text().count("stepping to the back of the line") >= 2,
              f"{full} trying again, and stepping aside again")  # fmt: skip
        assert replicas.procs[full].poll() is None, f"{full} exited on a full volume"

        replicas.start(other)
        replicas.start(leader)
        until(lambda: replicas.state().leader != full, f"a replica other than {full} leading")
        second = Publisher(zookeeper, tmp_path, tag="q")
        second.goes_on(100, f"the publisher confirming while {full}'s volume is still full")
        assert replicas.procs[full].poll() is None, f"{full} exited on a full volume"

        replicas.volumes[full].free()
        until(lambda: len(replicas.state().isr) == 3, f"{full} back in sync once there is space", timeout=90)
        second.goes_on(1, "the publisher confirming with all three")
        confirmed_second = second.stop()
        replicas.stop()
        journals = {name: replicas.journal(name) for name in replicas.names}
    finally:
        for publisher in (first, second):
            if publisher is not None:
                publisher.stop()
        replicas.stop()
        for volume in replicas.volumes.values():
            volume.stop()
    assert_published_once_in_order(journals, confirmed_first, tag="p")
    assert_published_once_in_order(journals, confirmed_second, tag="q")
