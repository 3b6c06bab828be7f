"""The partitioned client's parts that need no broker: positions and its settings' errors."""

from __future__ import annotations

import pytest

from zeps.client import PartitionedStreamClient, Position
from zeps.config import resolve
from zeps.errors import ConfigError


def test_a_position_round_trips_through_json_and_reads_partitions_added_since_from_their_start() -> None:
    position = Position((12, 0, 7))
    assert Position.from_json(position.to_json()) == position
    assert [position.after(p) for p in range(5)] == [12, 0, 7, 0, 0]  # partitions 3 and 4 came later
    assert Position.start(2) == Position((0, 0))


@pytest.mark.parametrize(
    "text", ["", "[1, 2]", '{"last": "1,2"}', '{"last": [1, true]}', '{"last": [1.5]}', '{"first": [1]}']
)
def test_anything_but_a_saved_position_is_refused_with_what_one_looks_like(text: str) -> None:
    with pytest.raises(ConfigError, match=r'not a saved position .*expected \{"last"'):
        Position.from_json(text)


def test_a_position_holds_one_sequence_per_partition_none_negative() -> None:
    for last in [(), (1, -1), (0,) * 257]:
        with pytest.raises(ConfigError, match=r"a position holds 1\.\.256 sequences"):
            Position(last)


def test_a_client_needs_an_endpoint_per_partition_and_a_locator_for_each_or_none() -> None:
    with pytest.raises(ConfigError, match=r"1\.\.256 partitions: give an endpoint for each \(got 0\)"):
        PartitionedStreamClient([], "orders")
    with pytest.raises(ConfigError, match=r"a locator for each partition \(2\), or none \(got 1\)"):
        PartitionedStreamClient(["tcp://127.0.0.1:1", "tcp://127.0.0.1:2"], "orders", locators=[lambda: ""])
    client = PartitionedStreamClient(["tcp://127.0.0.1:1", "tcp://127.0.0.1:2"], "orders")
    try:
        with pytest.raises(ConfigError, match="start\\(\\) a subscription first"):
            client.receive_many(0)
        with pytest.raises(ConfigError, match=r"partitions must be some of 0\.\.1, not \[2\]"):
            client.start(partitions=[2])
        assert [client.partition_of(k) for k in ("a", "b")] == [1, 0]
    finally:
        client.close()


def test_settings_name_each_partitions_endpoint_and_a_short_list_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ZEPS_STREAM_ORDERS_PARTITIONS", "tcp://b0:5555, tcp://b1:5555")
    settings = resolve("ZepsStream", "orders", namespace="shop", zookeeper="zk:2181", endpoint="tcp://b0:5555")
    assert settings.partitions == ("tcp://b0:5555", "tcp://b1:5555")
    client = PartitionedStreamClient.of(settings)
    try:  # each partition's client follows its own partition's leader
        assert [c.endpoint for c in client.clients] == ["tcp://b0:5555", "tcp://b1:5555"]
        assert [c.locator.partition for c in client.clients] == [0, 1]  # type: ignore[union-attr]
    finally:
        client.close()
    with pytest.raises(ConfigError, match=r"has 3 partitions and endpoints for 2: .*ZEPS_STREAM_ORDERS_PARTITIONS"):
        PartitionedStreamClient.of(settings.model_copy(update={"spec": {"partitions": 3}}))
    monkeypatch.setenv("ZEPS_STREAM_ORDERS_PARTITIONS", "b0:5555,b1:5555")
    with pytest.raises(ConfigError, match="ZEPS_STREAM_ORDERS_PARTITIONS='b0:5555,b1:5555': give each partition's"):
        resolve("ZepsStream", "orders", namespace="shop", endpoint="tcp://b0:5555")


def test_a_client_remembers_a_bounded_number_of_keys_partitions() -> None:
    from zeps.client import partitioned  # noqa: PLC0415
    from zeps.partitioning import partition_of  # noqa: PLC0415

    client = PartitionedStreamClient([f"tcp://127.0.0.1:{p + 1}" for p in range(3)], "orders")
    try:
        keys = [f"k{i}" for i in range(partitioned.ROUTES_REMEMBERED + 10)]
        assert [client.partition_of(k) for k in keys] == [partition_of(k, 3) for k in keys]
        assert len(client._routes) == 10  # full once: started over, never more than the bound
    finally:
        client.close()
