"""Runs of records as DELIVER-BATCH and DELIVER-RUN carry them: checked on arrival (record by record,
or at once with an index and one CRC32C), handed out as rows or as columns, and the client's inbox
mixing them with single deliveries from older brokers."""

from __future__ import annotations

import itertools
import struct
import subprocess
import sys
from array import array

import crc32c
import pytest
from hypothesis import given
from hypothesis import strategies as st

from zeps import _records
from zeps._records import RecordFormatError, Records, encode_record, indexed_run
from zeps.client.session import ClientSession
from zeps.errors import RemoteProtocolError
from zeps.protocol import (
    AttachOk,
    Connection,
    Deliver,
    DeliverRun,
    Subscribe,
    SubscribeOk,
    decode,
    encode_deliver_batch,
    encode_deliver_run,
)
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


@given(records, st.permutations(["sequence", "key", "body", "timestamp"]), st.integers(1, 4))
def test_only_the_columns_asked_for_are_built_in_their_order(rows: list[Row], order: list[str], count: int) -> None:
    columns = order[:count]
    sequences, batch = arrow_batch([_run(rows)], columns)
    assert batch.schema.names == columns and sequences.tolist() == [r[0] for r in rows]
    whole = arrow_batch([_run(rows)])[1]
    for name in columns:
        assert batch.column(name).equals(whole.column(name))


def test_a_key_that_is_not_ascii_is_refused() -> None:
    """The broker takes ASCII keys only; bytes a client did not expect there (CRC-intact, from a
    broker of another make) do not become a string column."""
    run = Records(encode_record(1, 5, "clé".encode(), b"v"))
    with pytest.raises(RecordFormatError, match="key is not ASCII"):
        arrow_batch([run], ["key"])
    assert arrow_batch([run], ["body"])[1].column(0).to_pylist() == [b"v"]
    with pytest.raises(ValueError, match="no column 'offset'"):
        arrow_batch([run], ["offset"])


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
    assert session.inbox.take(2) == first[:2]
    assert session.inbox.take_one() == first[2]
    assert session.inbox.take(3) == [first[3], first[4], (6, "old", b"z", None)]
    assert session.inbox.take_one() == second[0]
    assert [r for run in session.inbox.take_records() for r in run.rows()] == second[1:]
    assert not session.inbox and session.inbox.take(5) == []

    session.receive(broker.send(Deliver(sequence=10, key="old", body=b"z")))
    session.receive(encode_deliver_batch(_run([(11, "k", b"", 1)]).data))
    runs = session.inbox.take_records()  # a single delivery becomes a run of one (its unknown time 0)
    assert [r for run in runs for r in run.rows()] == [(10, "old", b"z", 0), (11, "k", b"", 1)]


def test_a_delivery_sent_again_after_a_reattach_is_kept_once() -> None:
    session, _ = _attached_session()
    rows = [(s, "k", b"v", s) for s in range(1, 11)]
    session.receive(encode_deliver_batch(_run(rows[:6]).data))
    session.receive(encode_deliver_batch(_run(rows[3:]).data))  # 4..6 again, then 7..10
    session.receive(encode_deliver_batch(_run(rows[:2]).data))  # nothing new at all
    assert session.inbox.take(100) == rows
    assert session.last_sequence == 10


def _index(run: Records) -> bytes:
    starts = array("I", run.offsets[:-1])
    if sys.byteorder == "little":
        starts.byteswap()
    return starts.tobytes()


@pytest.fixture(params=["numpy", "python"])
def index_check(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """DELIVER-RUN's index is checked in numpy when it is installed (for runs of NUMPY_FROM records or
    more), else by a walk: test both, at every length."""
    monkeypatch.setattr(_records, "HAVE_NUMPY", request.param == "numpy")
    monkeypatch.setattr(_records, "NUMPY_FROM", 0)
    return str(request.param)


def test_every_single_byte_flip_in_a_deliver_run_is_refused(index_check: str) -> None:
    rows = [(s, f"k.{s % 3}", b"body-%d" % s, 1000 + s) for s in range(1, 9)]
    run = _run(rows)
    frame = encode_deliver_run(run.data, _index(run))
    command = decode(frame)
    assert isinstance(command, DeliverRun) and command.run is not None and command.run.rows() == rows
    for at in range(3, len(frame)):  # after the signature and the command id
        for flip in (0x01, 0x80):
            damaged = bytearray(frame)
            damaged[at] ^= flip
            with pytest.raises(RemoteProtocolError, match="DELIVER-RUN"):
                decode(bytes(damaged))


def _forged(run: Records, index: bytes) -> tuple[bytes, bytes, int]:
    """A run and an index that pass the CRC (as a broker with a bug would send them)."""
    return run.data, index, crc32c.crc32c(run.data, crc32c.crc32c(index))


@given(records, st.data())
def test_the_index_is_checked_against_the_records_the_same_way_in_numpy_and_python(
    rows: list[Row], data: st.DataObject
) -> None:
    run = _run(rows)
    entries = list(struct.unpack(f"!{len(rows)}I", _index(run)))
    what = data.draw(st.sampled_from(["intact", "moved", "dropped", "extra", "swapped"]))
    if what == "moved":
        i = data.draw(st.integers(0, len(entries) - 1))
        entries[i] = data.draw(st.integers(0, len(run.data) - 1).filter(lambda o: o != entries[i]))
    elif what == "dropped" and len(entries) > 1:
        del entries[data.draw(st.integers(0, len(entries) - 1))]
    elif what == "extra":
        entries.insert(data.draw(st.integers(0, len(entries))), data.draw(st.integers(0, len(run.data) - 1)))
    elif what == "swapped" and len(entries) > 1:
        i = data.draw(st.integers(0, len(entries) - 2))
        entries[i], entries[i + 1] = entries[i + 1], entries[i]
    changed = entries != list(struct.unpack(f"!{len(rows)}I", _index(run)))
    index = struct.pack(f"!{len(entries)}I", *entries)
    verdicts = []
    numpy_from = _records.NUMPY_FROM
    for numpy in (True, False):
        _records.HAVE_NUMPY, _records.NUMPY_FROM = numpy, 0
        try:
            verdicts.append(indexed_run(*_forged(run, index)).rows())
        except RecordFormatError as exc:
            verdicts.append(type(exc))
        finally:
            _records.HAVE_NUMPY, _records.NUMPY_FROM = True, numpy_from
    assert verdicts[0] == verdicts[1]
    assert verdicts[0] == (RecordFormatError if changed else rows)


def test_each_index_check_is_the_one_the_switches_choose(index_check: str) -> None:
    """The two checks word a moved index entry differently: this proves the fixture's switch reaches
    the module (compiled too), so the tests above run each check."""
    run = _run([(s, "k", b"body", 1) for s in (1, 2)])
    entries = list(struct.unpack("!2I", _index(run)))
    index = struct.pack("!2I", entries[0], entries[1] + 1)
    wording = "the records say" if index_check == "python" else "its index gives it|not where a whole record"
    with pytest.raises(RecordFormatError, match=wording):
        indexed_run(*_forged(run, index))


def test_a_short_run_is_walked_and_a_long_one_checked_in_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Below NUMPY_FROM records numpy's fixed cost is more than a walk's: the walk checks short runs."""
    monkeypatch.setattr(_records, "HAVE_NUMPY", True)
    for count, wording in ((2, "the records say"), (_records.NUMPY_FROM, "its index gives it|not where a whole")):
        run = _run([(s, "k", b"body", 1) for s in range(1, count + 1)])
        entries = list(struct.unpack(f"!{count}I", _index(run)))
        entries[1] += 1
        with pytest.raises(RecordFormatError, match=wording):
            indexed_run(*_forged(run, struct.pack(f"!{count}I", *entries)))


def test_records_out_of_order_are_refused_even_with_a_true_index(index_check: str) -> None:
    first, second = encode_record(5, 1, b"k", b"a"), encode_record(4, 1, b"k", b"b")
    run = Records(first + second, array("I", [0, len(first), len(first) + len(second)]))  # not checked here
    with pytest.raises(RecordFormatError, match="bad key length or sequence 4"):
        indexed_run(*_forged(run, _index(run)))
    with pytest.raises(RecordFormatError, match="not one or more 4-byte offsets"):
        indexed_run(*_forged(run, b""))


def test_a_session_refuses_a_damaged_run_and_keeps_what_it_had() -> None:
    session, _ = _attached_session()
    assert session.conn.version >= 4  # DELIVER-RUN is version 4
    first = _run([(s, "k", b"v", s) for s in range(1, 4)])
    session.receive(encode_deliver_run(first.data, _index(first)))
    second = _run([(s, "k", b"v", s) for s in range(4, 7)])
    damaged = bytearray(encode_deliver_run(second.data, _index(second)))
    damaged[-1] ^= 0xFF  # the last body byte
    with pytest.raises(RemoteProtocolError, match="fail their CRC32C"):
        session.receive(bytes(damaged))
    assert session.inbox.take(10) == first.rows() and session.last_sequence == 3


def test_a_broker_the_cli_and_a_client_start_without_importing_numpy() -> None:
    """numpy is imported at the first DELIVER-RUN long enough to check in bulk, not when a process of
    the SDK starts: its import cost more CPU than most brokers, CLI runs and clients ever used it."""
    code = "import sys, zeps.broker.main, zeps.cli, zeps.handles; print('numpy' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
