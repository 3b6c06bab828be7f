"""The record layout shared by the journal (on disk) and DELIVER-BATCH (on the wire).

One layout in one place: the broker sends journal records to version-3 clients byte for byte as it
wrote them, and the client checks the same CRC the journal wrote — so a record is protected from
the broker's disk to the subscriber. All numbers are network byte order::

    offset  size  field
    0       4     length L of everything after this field
    4       4     CRC32C of bytes 8 .. 4+L
    8       8     sequence
    16      8     timestamp, milliseconds since the epoch
    24      1     key length K
    25      K     key (ASCII)
    25+K    …     body
"""

from __future__ import annotations

import bisect
import importlib.util
import struct
import sys
from array import array

import crc32c

#: The SDK's core needs no numpy; with it (the spark extra) the index of a DELIVER-RUN of NUMPY_FROM
#: records or more is checked in bulk. numpy is imported at the first such run, not with this
#: module: every broker, CLI and client process imports this one, and numpy's import (0.15-0.25 s
#: of CPU, its BLAS threads started: benchmarks/README.md) cost more than most of them ever used
#: it. The tests run with numpy, and check the fallback by switching this off.
HAVE_NUMPY = importlib.util.find_spec("numpy") is not None

HEAD = struct.Struct("!II")  # length, crc
META = struct.Struct("!QQB")  # sequence, timestamp, key length
OVERHEAD = HEAD.size + META.size  # bytes a record adds to its key and body
RECORD = struct.Struct("!IIQQB")  # HEAD then META, read in one call (length, crc, sequence, timestamp, key length)
_SEQUENCE = struct.Struct("!Q")


class RecordFormatError(ValueError):
    """Bytes that are not a run of whole, intact records (the message says where and why)."""


def encode_record(sequence: int, timestamp_ms: int, raw_key: bytes, body: bytes) -> bytes:
    payload = b"".join((META.pack(sequence, timestamp_ms, len(raw_key)), raw_key, body))
    return HEAD.pack(len(payload) + 4, crc32c.crc32c(payload)) + payload


class Records:
    """A run of whole, intact records with increasing sequences, as one DELIVER-BATCH carries them:
    record ``i`` is ``data[offsets[i]:offsets[i + 1]]`` (``offsets`` has one entry more than there
    are records; the last is ``len(data)``). Sequences need not be consecutive (a subscription with
    a pattern gets only the records it matches).

    ``Records(data)`` checks every record (length, CRC32C, key length, sequence order) and raises
    RecordFormatError naming the first bad one; decoding is left to :meth:`rows` or to a columnar
    reader working on ``data`` and ``offsets`` directly (the Spark source).
    """

    __slots__ = ("data", "offsets")

    def __init__(self, data: bytes, offsets: array[int] | None = None) -> None:
        self.data = data
        self.offsets = _checked_offsets(data) if offsets is None else offsets

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def sequence(self, i: int) -> int:
        """The sequence of record ``i`` (negative ``i`` counts from the end)."""
        return int(_SEQUENCE.unpack_from(self.data, self.offsets[i % len(self)] + HEAD.size)[0])

    def row(self, i: int) -> tuple[int, str, bytes, int]:
        """(sequence, key, body, timestamp) of record ``i``."""
        data, at = self.data, self.offsets[i]
        sequence, timestamp, klen = META.unpack_from(data, at + HEAD.size)
        body_at = at + OVERHEAD + klen
        return sequence, data[at + OVERHEAD : body_at].decode("latin-1"), data[body_at : self.offsets[i + 1]], timestamp

    def rows(self, begin: int = 0, end: int | None = None) -> list[tuple[int, str, bytes, int]]:
        """(sequence, key, body, timestamp) of records ``begin .. end - 1`` (:meth:`row`'s decoding,
        inlined: this is the bulk receive path, and a call per row costs it about 10%)."""
        data, offsets, unpack = self.data, self.offsets, META.unpack_from
        stop = len(self) if end is None else end
        out = []
        for i in range(begin, stop):
            at = offsets[i]
            sequence, timestamp, klen = unpack(data, at + HEAD.size)
            body_at = at + OVERHEAD + klen
            out.append((sequence, data[at + OVERHEAD : body_at].decode("latin-1"), data[body_at : offsets[i + 1]],
                        timestamp))  # fmt: skip
        return out

    def part(self, begin: int, end: int | None = None) -> Records:
        """Records ``begin .. end - 1`` as a run of their own (copies their bytes)."""
        stop = len(self) if end is None else end
        if begin == 0 and stop == len(self):
            return self
        base = self.offsets[begin]
        offsets = array("I", [o - base for o in self.offsets[begin : stop + 1]])
        return Records(self.data[base : self.offsets[stop]], offsets)

    def after(self, sequence: int) -> Records:
        """The records with a sequence above ``sequence``."""
        return self.part(bisect.bisect_right(range(len(self)), sequence, key=self.sequence))  # sequences increase


def _checked_offsets(data: bytes) -> array[int]:
    """Where each record starts (and ``len(data)`` last); RecordFormatError at the first bad one."""
    offsets, problem = walk(data)
    if problem is not None:
        raise RecordFormatError(problem)
    return offsets


def walk(data: bytes, *, check_crc: bool = True) -> tuple[array[int], str | None]:
    """(offsets, problem): where each whole, intact record at the start of ``data`` begins, plus the
    end of the last one; and why the walk stopped before the end of ``data`` (None if it did not).
    Intact means: its length fits, its CRC32C matches (unless ``check_crc`` is false), its key fits,
    its sequence is above the one before. The journal's recovery keeps this prefix; a DELIVER-BATCH
    must be all of it."""
    offsets = array("I")
    append, unpack, crc = offsets.append, RECORD.unpack_from, crc32c.crc32c
    offset, size, last = 0, len(data), -1
    view = memoryview(data)
    problem = None
    while offset < size:
        if offset + OVERHEAD > size:
            problem = f"record at byte {offset} is truncated ({size - offset} bytes left)"
            break
        length, checksum, sequence, _, klen = unpack(data, offset)
        end = offset + 4 + length
        if length < 4 + META.size or end > size:
            problem = f"record at byte {offset} claims {length} bytes; {size - offset - 4} follow"
            break
        if check_crc and crc(view[offset + 8 : end]) != checksum:
            problem = f"record at byte {offset} fails its CRC32C"
            break
        if offset + OVERHEAD + klen > end or sequence <= last:
            problem = f"record at byte {offset} has a bad key length or sequence {sequence}"
            break
        append(offset)
        last, offset = sequence, end
    append(offset)
    return offsets, problem


#: a DELIVER-RUN of this many records or more has its index checked in numpy, a shorter one by a walk:
#: numpy's fixed cost per run (about 20 µs) is more than a walk's below about 64 records (1 µs for one
#: record), and a subscriber at a low rate gets runs of one record each
NUMPY_FROM = 64


def indexed_run(records: bytes, index: bytes, crc: int) -> Records:
    """The run a DELIVER-RUN carries, checked once: ``crc`` is the CRC32C of ``index`` then
    ``records``, and ``index`` (the big-endian 4-byte offset of each record) must agree with the
    records: the first at 0, each where the one before ends (its length field), keys within their
    record, sequences increasing. RecordFormatError names the first thing wrong."""
    if crc32c.crc32c(records, crc32c.crc32c(index)) != crc:
        raise RecordFormatError(f"run of {len(records)} bytes and its index fail their CRC32C")
    if not index or len(index) % 4:
        raise RecordFormatError(f"index of {len(index)} bytes is not one or more 4-byte offsets")
    offsets = array("I")
    offsets.frombytes(index)
    if sys.byteorder == "little":
        offsets.byteswap()
    offsets.append(len(records))
    numpy = HAVE_NUMPY and len(offsets) > NUMPY_FROM  # offsets: one per record, and the end
    problem = _index_problem_numpy(records, offsets) if numpy else _index_problem(records, offsets)
    if problem is not None:
        raise RecordFormatError(problem)
    return Records(records, offsets)


def _index_problem(records: bytes, offsets: array[int]) -> str | None:
    """What is wrong with ``offsets`` as the index of ``records`` (a walk without per-record CRCs)."""
    walked, problem = walk(records, check_crc=False)
    if problem is None and walked != offsets:
        at = next(i for i, (a, b) in enumerate(zip(walked, offsets, strict=False)) if a != b)
        problem = f"index entry {at} says byte {offsets[at]}, the records say {walked[at]}"
    return problem


def _index_problem_numpy(records: bytes, offsets: array[int]) -> str | None:
    """:func:`_index_problem` in numpy: the same checks, a few array operations per run."""
    import numpy as np  # noqa: PLC0415 — imported at the first large run (HAVE_NUMPY above)

    bounds = np.frombuffer(offsets, np.uint32).astype(np.int64)
    starts, ends = bounds[:-1], bounds[1:]
    sizes = ends - starts
    if starts[0] != 0 or not bool(np.all(sizes >= OVERHEAD)):  # also: every head lies inside the run
        bad = 0 if starts[0] != 0 else int(np.argmax(sizes < OVERHEAD))
        return f"index entry {bad} says byte {starts[bad]}, which is not where a whole record starts"
    size = len(records)
    u32 = np.ndarray(shape=(size - 3,), dtype=">u4", buffer=records, strides=(1,))  # a number at any byte
    u64 = np.ndarray(shape=(size - 7,), dtype=">u8", buffer=records, strides=(1,))
    lengths = u32[starts].astype(np.int64)
    if not bool(np.all(lengths == sizes - 4)):
        bad = int(np.argmax(lengths != sizes - 4))
        return f"record {bad} at byte {starts[bad]} claims {lengths[bad]} bytes; its index gives it {sizes[bad] - 4}"
    key_ends = starts + OVERHEAD + np.frombuffer(records, np.uint8)[starts + OVERHEAD - 1]
    sequences = u64[starts + HEAD.size]
    order = sequences[1:] > sequences[:-1]
    if not bool(np.all(key_ends <= ends)) or not bool(np.all(order)):
        bad = int(np.argmax(key_ends > ends)) if not bool(np.all(key_ends <= ends)) else int(np.argmax(~order)) + 1
        return f"record at byte {starts[bad]} has a bad key length or sequence {sequences[bad]}"
    return None
