"""Runs of journal records (as DELIVER-RUN carries them) to an Arrow batch, column by column.

Decoding record by record into Python objects and handing those to Arrow costs about 1.6 µs a row;
this does it in numpy and Arrow's C++ kernels instead, so the Python work per row is only the check
``Records`` already made on arrival (the run's CRC32C and index). The layout is ``zeps._records``::

    [length 4][crc 4][sequence 8][timestamp 8][key length 1][key][body]   (network byte order)

* sequence and timestamp: one gather each from a big-endian 8-byte view that starts at every byte
  of the run (a stride of 1), indexed by where each record's field is;
* key and body: every byte of a run belongs to exactly one of three slices per record — the 25-byte
  head, the key, the body — so one Arrow binary array laid over the run's bytes (no copy) holds all
  of them, and ``take`` gathers the keys or the bodies into a column of their own.

Only the columns asked for are built: a query that names fewer (``.schema("key string, body
binary")``) costs less here and in Spark, which converts every column it receives.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from zeps._records import HEAD, OVERHEAD, RecordFormatError, Records

__all__ = ["STREAM_ARROW_SCHEMA", "STREAM_COLUMNS", "arrow_batch"]

STREAM_ARROW_SCHEMA = pa.schema(
    [("sequence", pa.int64()), ("key", pa.string()), ("body", pa.binary()), ("timestamp", pa.timestamp("us", tz="UTC"))]
)
STREAM_COLUMNS: tuple[str, ...] = tuple(STREAM_ARROW_SCHEMA.names)
_SEQUENCE_AT = HEAD.size  # bytes 8..15 of a record
_TIMESTAMP_AT = HEAD.size + 8  # bytes 16..23
_KEY_LENGTH_AT = OVERHEAD - 1  # byte 24


def arrow_batch(
    runs: list[Records], columns: Sequence[str] = STREAM_COLUMNS
) -> tuple[npt.NDArray[np.int64], pa.RecordBatch]:
    """(sequences, batch): the sequence of every record in ``runs`` (checked runs, in order), and
    the records as an Arrow batch of ``columns`` (names of :data:`STREAM_ARROW_SCHEMA`, any order)."""
    data = runs[0].data if len(runs) == 1 else b"".join(run.data for run in runs)
    starts, base = [], 0
    for run in runs:
        starts.append(np.frombuffer(run.offsets, np.uint32)[:-1].astype(np.int64) + base)
        base += len(run.data)
    start = starts[0] if len(starts) == 1 else np.concatenate(starts)
    n, size = len(start), len(data)
    u64 = np.ndarray(shape=(size - 7,), dtype=">u8", buffer=data, strides=(1,))  # a number at any byte
    sequences = u64[start + _SEQUENCE_AT].astype(np.int64)

    slices = None  # head, key and body of each record, as a binary array over ``data``
    if "key" in columns or "body" in columns:
        key_at = start + OVERHEAD
        bounds = np.empty(3 * n + 1, np.int64)
        bounds[0:-1:3], bounds[1::3], bounds[-1] = start, key_at, size
        bounds[2::3] = key_at + np.frombuffer(data, np.uint8)[start + _KEY_LENGTH_AT]
        slices = pa.Array.from_buffers(pa.large_binary(), 3 * n, [None, pa.py_buffer(bounds), pa.py_buffer(data)])

    arrays: list[pa.Array] = []
    for name in columns:
        if name == "sequence":
            arrays.append(pa.array(sequences))
        elif name == "timestamp":  # the broker's milliseconds as Spark's microseconds
            micros = u64[start + _TIMESTAMP_AT].astype(np.int64) * 1000
            arrays.append(pa.array(micros, pa.timestamp("us", tz="UTC")))
        elif name == "key":
            assert slices is not None
            arrays.append(_ascii(slices.take(pa.array(np.arange(1, 3 * n, 3))).cast(pa.binary()), n))
        elif name == "body":
            assert slices is not None
            arrays.append(slices.take(pa.array(np.arange(2, 3 * n, 3))).cast(pa.binary()))
        else:
            raise ValueError(f"no column {name!r} in a stream's rows; there are {', '.join(STREAM_COLUMNS)}")
    schema = pa.schema([STREAM_ARROW_SCHEMA.field(name) for name in columns])
    return sequences, pa.RecordBatch.from_arrays(arrays, schema=schema)


def _ascii(keys: pa.BinaryArray, n: int) -> pa.StringArray:
    """The keys as a string column, without a UTF-8 pass: a key is ASCII (the broker accepts no
    other), which one comparison over the key bytes confirms."""
    _, offsets, values = keys.buffers()
    if values is not None and bool(np.any(np.frombuffer(values, np.uint8) >= 0x80)):
        raise RecordFormatError("a record's key is not ASCII")
    return pa.Array.from_buffers(pa.string(), n, [None, offsets, values])
