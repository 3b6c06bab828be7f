"""Runs of records as DELIVER-BATCH carries them: checked on arrival, handed out as rows or as
columns, and the client's inbox mixing them with single deliveries from older brokers."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zeps._records import RecordFormatError, Records, encode_record
from zeps.client.session import ClientSession
from zeps.protocol import AttachOk, Connection, Deliver, Subscribe, SubscribeOk, encode_deliver_batch
from zeps.spark.columns import arrow_batch

Row = tuple[int, str, bytes, int]

keys = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=255)


def _numbered(items: list[tuple[int, int, str, bytes]]) -> list[Row]:
    """Increasing sequences with gaps (a pattern's subscription, or retention)."""
    rows, sequence = [], 0
    for gap, timestamp, key, body in items:
        sequence += gap
        rows.append((sequence, key, body, timestamp))
    return rows


records = st.lists(
    st.tuples(st.integers(1, 5), st.integers(0, 2**53), keys, st.binary(max_size=300)), min_size=1, max_size=60
).map(_numbered)


def _run(rows: list[Row]) -> Records:
    return Records(b"".join(encode_record(s, ts, k.encode(), b) for s, k, b, ts in rows))


@given(records, st.data())
def test_a_run_gives_back_its_rows_whole_and_in_parts(rows: list[Row], data: st.DataObject) -> None:
    run = _run(rows)
    assert len(run) == len(rows) and run.rows() == rows
    assert [run.row(i) for i in range(len(run))] == rows
    assert (run.sequence(0), run.sequence(-1)) == (rows[0][0], rows[-1][0])
    begin = data.draw(st.integers(0, len(rows)))
    end = data.draw(st.integers(begin, len(rows)))
    assert run.rows(begin, end) == rows[begin:end] == run.part(begin, end).rows()
    cut = data.draw(st.integers(0, rows[-1][0] + 1))
    assert run.after(cut).rows() == [r for r in rows if r[0] > cut]


@settings(deadline=None)  # the first example pays Arrow's first-use set-up (~300 ms on 2 busy cores)
@given(records, st.data())
def test_columns_hold_exactly_the_rows_however_the_runs_are_split(rows: list[Row], data: st.DataObject) -> None:
    cuts = sorted(data.draw(st.sets(st.integers(1, len(rows) - 1), max_size=4)) if len(rows) > 1 else set())
    bounds = [0, *cuts, len(rows)]
    runs = [_run(rows[a:b]) for a, b in itertools.pairwise(bounds)]
    sequences, batch = arrow_batch(runs)
    assert sequences.tolist() == [r[0] for r in rows]
    table = batch.select(["sequence", "key", "body"]).to_pydict()
    assert table["sequence"] == [r[0] for r in rows]
    assert table["key"] == [r[1] for r in rows]
    assert table["body"] == [r[2] for r in rows]
    assert batch.column(3).cast("int64").to_pylist() == [r[3] * 1000 for r in rows]  # broker ms, Spark µs


def test_a_run_is_checked_when_made() -> None:
    good = encode_record(1, 5, b"k", b"v")
    with pytest.raises(RecordFormatError, match="fails its CRC32C"):
        Records(good[:-1] + b"w")
    with pytest.raises(RecordFormatError, match="sequence 1"):
        Records(good + good)
    with pytest.raises(RecordFormatError, match="truncated"):
        Records(good + good[:10])
    assert len(Records(b"")) == 0


def _attached_session() -> tuple[ClientSession, Connection]:
    session, broker = ClientSession("prices"), Connection("broker")
    broker.receive(session.attach())
    session.receive(broker.send(AttachOk()))
    for frame in session.subscribe("", "earliest"):
        if isinstance(broker.receive(frame), Subscribe):
            session.receive(broker.send(SubscribeOk()))
    return session, broker


def test_the_inbox_hands_out_runs_and_single_deliveries_in_order_however_taken() -> None:
    session, broker = _attached_session()
    first = [(s, f"k{s}", b"x" * s, 100 + s) for s in range(1, 6)]
    second = [(s, f"k{s}", b"y", 100 + s) for s in range(7, 10)]
    session.receive(encode_deliver_batch(_run(first).data))
    session.receive(broker.send(Deliver(sequence=6, key="old", body=b"z")))  # as a version-1 broker would
    session.receive(encode_deliver_batch(_run(second).data))
    assert session.take(2) == first[:2]
    assert session.take_one() == first[2]
    assert session.take(3) == [first[3], first[4], (6, "old", b"z", None)]
    assert session.take_one() == second[0]
    assert [r for run in session.take_records() for r in run.rows()] == second[1:]
    assert not session.inbox and session.take(5) == []

    session.receive(broker.send(Deliver(sequence=10, key="old", body=b"z")))
    session.receive(encode_deliver_batch(_run([(11, "k", b"", 1)]).data))
    runs = session.take_records()  # a single delivery becomes a run of one (its unknown time 0)
    assert [r for run in runs for r in run.rows()] == [(10, "old", b"z", 0), (11, "k", b"", 1)]


def test_a_delivery_sent_again_after_a_reattach_is_kept_once() -> None:
    session, _ = _attached_session()
    rows = [(s, "k", b"v", s) for s in range(1, 11)]
    session.receive(encode_deliver_batch(_run(rows[:6]).data))
    session.receive(encode_deliver_batch(_run(rows[3:]).data))  # 4..6 again, then 7..10
    session.receive(encode_deliver_batch(_run(rows[:2]).data))  # nothing new at all
    assert session.take(100) == rows
    assert session.last_sequence == 10
