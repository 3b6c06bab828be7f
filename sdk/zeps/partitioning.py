"""Which partition of a partitioned ZepsStream a key belongs to: the one mapping the SDK, the broker
and the Spark sink share.

A key goes to one of :data:`SLOTS` slots by a hash of its UTF-8 bytes, as Redis Cluster spreads keys
over 16,384 slots; slots, not keys, are what partitions own. A slot's partition is Lamport and
Veach's *jump consistent hash* of the slot over the number of partitions ("A Fast, Minimal Memory,
Consistent Hash Algorithm", 2014), so that growing a stream from ``n`` to ``m`` partitions moves only
the slots reassigned, each to one of the new partitions, never between old ones: about ``1 - n/m`` of
them (:func:`moved_slots` says exactly which). Records of one key always share a partition, which is
where their order is kept.

The mapping is part of the data format: a stream's records were placed by it, and a consumer or a
producer computing it differently would read or write the wrong partition. ``tests/unit/
test_partitioning.py`` pins its values, so a change to it cannot go unnoticed.

>>> partition_of("prices.eu.ACME", 1)
0
>>> 0 <= partition_of("prices.eu.ACME", 3) < 3
True
"""

from __future__ import annotations

from crc32c import crc32c

SLOTS = 4096
"""Slots a key hashes to. Fixed for good: it bounds how many partitions a stream can ever have."""

MAX_PARTITIONS = 256
"""The most partitions a stream may have (the CRD's limit too): at least 16 slots each."""

_MASK64 = (1 << 64) - 1
_JUMP_MULTIPLIER = 2862933555777941757  # the 64-bit linear congruential step of the paper


def slot_of(key: str) -> int:
    """The slot of ``key``: CRC32C of its UTF-8 bytes, modulo :data:`SLOTS`."""
    return crc32c(key.encode()) % SLOTS


def partition_of_slot(slot: int, partitions: int) -> int:
    """The partition (``0 .. partitions - 1``) that owns ``slot`` in a stream of ``partitions``."""
    if not 0 <= slot < SLOTS:
        raise ValueError(f"slot must be in 0..{SLOTS - 1}, not {slot}")
    _check_partitions(partitions)
    return _jump(slot, partitions)


def partition_of(key: str, partitions: int) -> int:
    """The partition ``key``'s records go to in a stream of ``partitions`` partitions."""
    return partition_of_slot(slot_of(key), partitions)


def slots_of(partition: int, partitions: int) -> list[int]:
    """The slots ``partition`` owns in a stream of ``partitions`` (ascending)."""
    _check_partitions(partitions)
    if not 0 <= partition < partitions:
        raise ValueError(f"partition must be in 0..{partitions - 1}, not {partition}")
    return [s for s in range(SLOTS) if partition_of_slot(s, partitions) == partition]


def moved_slots(before: int, after: int) -> list[int]:
    """The slots whose partition changes when a stream goes from ``before`` to ``after`` partitions
    (``after >= before``: partitions are never taken away). Each moves to a partition ``>= before``."""
    _check_partitions(before)
    _check_partitions(after)
    if after < before:
        raise ValueError(f"partitions can only grow: {before} -> {after} would leave keys without a partition")
    return [s for s in range(SLOTS) if partition_of_slot(s, before) != partition_of_slot(s, after)]


def _jump(key: int, buckets: int) -> int:
    """The paper's function, step for step: the bucket of the 64-bit ``key`` among ``buckets``."""
    b, j = -1, 0
    while j < buckets:  # about ln(buckets) + 1 rounds
        b = j
        key = (key * _JUMP_MULTIPLIER + 1) & _MASK64
        j = int((b + 1) * ((1 << 31) / ((key >> 33) + 1)))
    return b


def _check_partitions(partitions: int) -> None:
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise ValueError(f"partitions must be in 1..{MAX_PARTITIONS}, not {partitions}")
