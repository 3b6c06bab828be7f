"""The SDK's table view of a compacted stream (zeps.client.table): folding records into the latest
value per key. Reading one from a broker is in tests/integration/test_compacted_broker.py."""

from __future__ import annotations

import pytest

from zeps.client import Message, Table, read_table
from zeps.errors import ConfigError


def test_a_table_keeps_each_keys_latest_value_and_a_delete_removes_the_key() -> None:
    table = Table()
    table.apply([Message(1, "a", b"1", None), Message(2, "b", b"2", None), Message(3, "a", b"3", None),
                 Message(4, "b", b"", None)])  # fmt: skip
    assert dict(table) == {"a": b"3"} and table.sequence == 4 and len(table) == 1
    table.apply([Message(3, "b", b"old", None), Message(5, "c", b"5", None)])  # overlapping: 3 is skipped
    assert dict(table) == {"a": b"3", "c": b"5"} and table.sequence == 5
    assert "b" not in table and table["c"] == b"5" and repr(table) == "Table(2 keys, as of sequence 5)"


def test_a_window_below_one_sequence_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match="window=0"):
        read_table(None, window=0)  # type: ignore[arg-type]
