"""JSON someone else may have written, parsed within bounds (zeps._json)."""

from __future__ import annotations

import time

import pytest

from zeps import _json


def test_what_zeps_writes_parses_as_json_does() -> None:
    value = {"version": 1, "epoch": 3, "isr": ["r0", "r1"], "nested": {"a": [1, {"b": "[{"}]}}
    import json  # noqa: PLC0415

    assert _json.loads(json.dumps(value)) == value
    assert _json.loads('"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["') == "[" * 40  # brackets in a string


def test_a_deeply_nested_value_is_refused_before_it_is_parsed() -> None:
    """The stdlib parser raises RecursionError at about 1,000 levels (which no caller catches: an
    operator's reconcile failed for good); refused here at 32, after one pass over the bytes."""
    hostile = b"[" * 200_000 + b"]" * 200_000
    began = time.perf_counter()
    with pytest.raises(ValueError, match="nested deeper than 32"):
        _json.loads(hostile)
    assert time.perf_counter() - began < 5  # one pass; not a timed promise, a guard against a runaway
    with pytest.raises(ValueError, match="nested deeper"):
        _json.loads('{"a":' * 33 + "1" + "}" * 33)
    assert _json.loads('{"a":' * 32 + "1" + "}" * 32) is not None


def test_a_value_over_its_size_is_refused_and_bad_json_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="more than 10"):
        _json.loads(b'{"a": "0123456789"}', max_bytes=10)
    with pytest.raises(ValueError):
        _json.loads(b"{not json")
