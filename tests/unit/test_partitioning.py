"""The key → partition mapping of partitioned ZepsStreams (``zeps.partitioning``): its values are
part of the data format, so they are pinned here; growing a stream moves only the slots reassigned."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from zeps.partitioning import (
    MAX_PARTITIONS,
    SLOTS,
    _jump,
    moved_slots,
    partition_of,
    partition_of_slot,
    slot_of,
    slots_of,
)


@pytest.mark.parametrize(
    ("key", "buckets", "bucket"),
    [  # published values of other implementations of the paper's function (ClickHouse's tests, jump's README)
        (1, 1, 0), (42, 57, 43), (256, 1024, 520), (3735883980, 666, 361),
        (16045690984833335023, 255, 237), (10863919174838991, 11, 6), (2016238256797177309, 11, 3),
    ],
)  # fmt: skip
def test_the_jump_hash_is_the_papers(key: int, buckets: int, bucket: int) -> None:
    assert _jump(key, buckets) == bucket


def test_the_mapping_is_pinned() -> None:
    """A change here re-routes every partitioned stream's keys: it must be a deliberate one."""
    assert [slot_of(k) for k in ("", "a", "prices.eu.ACME", "ünïcode")] == [0, 816, 1006, 878]
    assert [partition_of(k, 4) for k in ("a", "b", "prices.eu.ACME", "")] == [1, 2, 0, 0]
    assert [partition_of(f"k.{i}", 3) for i in range(12)] == [1, 1, 2, 0, 2, 1, 1, 0, 1, 2, 2, 2]


def test_growing_moves_only_the_slots_reassigned_each_to_a_new_partition() -> None:
    """About 1 - n/m of the slots move from n to m partitions; the figures are the README's."""
    counts = {(n, m): len(moved_slots(n, m)) for n, m in ((1, 2), (2, 3), (3, 4), (2, 4), (4, 8), (1, 4))}
    assert counts == {(1, 2): 2050, (2, 3): 1373, (3, 4): 1016, (2, 4): 2049, (4, 8): 2059, (1, 4): 3070}
    for (n, m), count in counts.items():
        assert abs(count - SLOTS * (1 - n / m)) < 0.02 * SLOTS
    for n, m in ((3, 4), (2, 7), (5, 6)):
        moved = set(moved_slots(n, m))
        for s in range(SLOTS):
            before, after = partition_of_slot(s, n), partition_of_slot(s, m)
            assert (after >= n) if s in moved else (after == before)


@given(key=st.text(max_size=40), n=st.integers(1, MAX_PARTITIONS), grow=st.integers(0, 64))
def test_a_key_stays_or_moves_to_a_partition_that_did_not_exist(key: str, n: int, grow: int) -> None:
    m = min(MAX_PARTITIONS, n + grow)
    before, after = partition_of(key, n), partition_of(key, m)
    assert 0 <= before < n and 0 <= after < m
    assert after == before or after >= n


@pytest.mark.parametrize("partitions", [2, 3, 5, 8, 16])
def test_partitions_own_about_as_many_slots_each(partitions: int) -> None:
    owned = Counter(partition_of_slot(s, partitions) for s in range(SLOTS))
    assert sorted(owned) == list(range(partitions))
    fair = SLOTS / partitions
    assert all(abs(n - fair) < 0.15 * fair for n in owned.values()), owned
    assert sum(len(slots_of(p, partitions)) for p in range(partitions)) == SLOTS


def test_out_of_range_arguments_name_the_limit() -> None:
    with pytest.raises(ValueError, match=r"partitions must be in 1\.\.256, not 0"):
        partition_of("k", 0)
    with pytest.raises(ValueError, match="not 257"):
        partition_of("k", MAX_PARTITIONS + 1)
    with pytest.raises(ValueError, match=r"slot must be in 0\.\.4095"):
        partition_of_slot(SLOTS, 2)
    with pytest.raises(ValueError, match=r"partition must be in 0\.\.2, not 3"):
        slots_of(3, 3)
    with pytest.raises(ValueError, match="can only grow"):
        moved_slots(3, 2)


def test_a_consumer_group_assigns_every_partition_to_one_member_round_robin_over_sorted_ids() -> None:
    from zeps.coordination.consumers import assign  # noqa: PLC0415

    assert assign(["m2", "m1", "m3"], 7) == {"m1": [0, 3, 6], "m2": [1, 4], "m3": [2, 5]}
    assert assign(["m1"], 3) == {"m1": [0, 1, 2]}
    assert assign(["a", "b", "c", "d"], 2) == {"a": [0], "b": [1], "c": [], "d": []}  # more members than partitions
    assert assign([], 3) == {}
    assert assign(["b", "a", "a"], 2) == assign(["a", "b"], 2)  # the same set, the same answer everywhere
