"""The hand-written encoders and decoders of the commands that carry messages (PUBLISH and its batches,
DELIVER and its kin): the hot path, without the generic field walk of :mod:`zeps.protocol.codec`.
Each produces or accepts exactly the bytes the generic codec would (the tests check both ways)."""

from __future__ import annotations

import struct
import sys
from array import array
from collections.abc import Callable, Iterable

from crc32c import crc32c

from zeps._records import RecordFormatError, Records, indexed_run
from zeps.errors import LocalProtocolError, RemoteProtocolError
from zeps.protocol.commands import (
    SIGNATURE,
    Command,
    Deliver,
    DeliverBatch,
    DeliverRun,
    DeliverTs,
    Publish,
    PublishBatch,
    PublishBatchSeq,
    PublishSeq,
)

__all__ = [
    "FAST_DECODERS",
    "deliver_size",
    "encode_deliver",
    "encode_deliver_batch",
    "encode_deliver_run",
    "encode_publish",
    "encode_publish_batch",
    "encode_publish_seq",
    "is_key",
    "is_printable",
    "is_vchar",
    "publish_fields",
    "publish_seq_fields",
]

U8, U16, U32, U64 = struct.Struct("!B"), struct.Struct("!H"), struct.Struct("!I"), struct.Struct("!Q")


def is_vchar(text: str) -> bool:
    """VCHAR: printable ASCII, no space (checked in C, not per character in Python)."""
    return text.isascii() and text.isprintable() and " " not in text


def is_key(text: str) -> bool:
    """A key PUBLISH (and its batch and sequenced forms) can carry: VCHAR, under 256 characters."""
    return len(text) < 256 and is_vchar(text)


def is_printable(text: str) -> bool:
    return text.isascii() and text.isprintable()


# Fast paths for the commands every message takes (PUBLISH in, DELIVER out): one struct call each
# instead of the generic field loop. Byte-for-byte the same frames (the golden tests check both).
_DELIVER_HEAD = struct.Struct("!2sBQB")  # signature, id, sequence, key length
_DELIVER_TS_HEAD = struct.Struct("!2sBQQB")  # signature, id, sequence, timestamp, key length


def encode_deliver(sequence: int, key: str, body: bytes, timestamp: int | None = None) -> bytes:
    """DELIVER (or DELIVER-TS with a timestamp) for a key already validated when it was published."""
    raw = key.encode("ascii")
    if timestamp is None:
        head = _DELIVER_HEAD.pack(SIGNATURE, Deliver.ID, sequence, len(raw))
    else:
        head = _DELIVER_TS_HEAD.pack(SIGNATURE, DeliverTs.ID, sequence, timestamp, len(raw))
    return b"".join((head, raw, U32.pack(len(body)), body))


def _decode_deliver(frame: bytes) -> Deliver | DeliverTs:
    head = _DELIVER_TS_HEAD if frame[2] == DeliverTs.ID else _DELIVER_HEAD
    if len(frame) < head.size:
        raise RemoteProtocolError("DELIVER truncated")
    fields = head.unpack_from(frame)
    klen = fields[-1]
    end = head.size + klen
    if end + 4 > len(frame):
        raise RemoteProtocolError(f"DELIVER.key claims {klen} bytes, or the body length is missing")
    key = frame[head.size : end].decode("latin-1")
    if not is_vchar(key):
        raise RemoteProtocolError("DELIVER.key is not printable ASCII")
    (length,) = U32.unpack_from(frame, end)
    if end + 4 + length != len(frame):
        raise RemoteProtocolError(f"DELIVER body claims {length} bytes, {len(frame) - end - 4} follow")
    body = frame[end + 4 :]
    if head is _DELIVER_TS_HEAD:
        return DeliverTs(sequence=fields[2], timestamp=fields[3], key=key, body=body)
    return Deliver(sequence=fields[2], key=key, body=body)


def _key_and_body(frame: bytes, at: int, name: str) -> tuple[str, bytes]:
    """The ``key`` string and ``body`` chunk that end a PUBLISH (-SEQ) frame, from byte ``at``."""
    if len(frame) < at + 1:
        raise RemoteProtocolError(f"{name} truncated before key")
    klen = frame[at]
    end = at + 1 + klen
    if end + 4 > len(frame):
        raise RemoteProtocolError(f"{name}.key claims {klen} bytes, or the body length is missing")
    key = frame[at + 1 : end].decode("latin-1")
    if not is_vchar(key):
        raise RemoteProtocolError(f"{name}.key is not printable ASCII")
    (length,) = U32.unpack_from(frame, end)
    if end + 4 + length != len(frame):
        problem = "has bytes after its last field" if end + 4 + length < len(frame) else f"body claims {length} bytes"
        raise RemoteProtocolError(f"{name} {problem}")
    return key, frame[end + 4 :]


def publish_fields(frame: bytes) -> tuple[str, bytes]:
    """(key, body) of a PUBLISH frame (its signature and id already checked), as
    :func:`~zeps.protocol.decode` would check them; RemoteProtocolError if malformed."""
    return _key_and_body(frame, 3, "PUBLISH")


def _decode_publish(frame: bytes) -> Publish:
    key, body = publish_fields(frame)
    return Publish(key=key, body=body)


_PUBLISH_HEAD = struct.Struct("!2sBB")  # signature, id, key length
_BATCH_HEAD = struct.Struct("!2sBI")  # signature, id, chunk length
_BATCH_SEQ_HEAD = struct.Struct("!2sBQI")  # signature, id, sequence, chunk length
_PUBLISH_SEQ_HEAD = struct.Struct("!2sBQB")  # signature, id, sequence, key length


def encode_publish(key: str, body: bytes) -> bytes | None:
    """PUBLISH in one join (None when the key is not a VCHAR string: the generic codec says why)."""
    if not is_key(key):
        return None
    head = _PUBLISH_HEAD.pack(SIGNATURE, Publish.ID, len(key))
    return b"".join((head, key.encode("ascii"), U32.pack(len(body)), body))


def encode_publish_batch(items: list[tuple[str, bytes]], sequence: int | None = None) -> bytes:
    """PUBLISH-BATCH for ``items`` (key, body) — PUBLISH-BATCH-SEQ with the producer ``sequence`` of
    the first; LocalProtocolError for a key PUBLISH could not carry."""
    entries = _encode_entries(items)
    if sequence is None:
        return _BATCH_HEAD.pack(SIGNATURE, PublishBatch.ID, len(entries)) + entries
    return _BATCH_SEQ_HEAD.pack(SIGNATURE, PublishBatchSeq.ID, sequence, len(entries)) + entries


def encode_publish_seq(sequence: int, key: str, body: bytes) -> bytes:
    """PUBLISH-SEQ (the hot path of an idempotent producer's single publishes)."""
    if not is_key(key):
        raise LocalProtocolError(f"PUBLISH-SEQ.key must be printable ASCII without spaces, < 256: {key!r}")
    return b"".join((_PUBLISH_SEQ_HEAD.pack(SIGNATURE, PublishSeq.ID, sequence, len(key)), key.encode("ascii"),
                     U32.pack(len(body)), body))  # fmt: skip


def _encode_entries(items: list[tuple[str, bytes]]) -> bytes:
    parts: list[bytes] = []
    pack_len, pack_u8 = U32.pack, U8.pack
    checked: set[str] = set()
    for key, body in items:
        if key not in checked:
            if not is_key(key):
                raise LocalProtocolError(f"PUBLISH-BATCH key must be printable ASCII without spaces, < 256: {key!r}")
            checked.add(key)
        parts += (pack_u8(len(key)), key.encode("ascii"), pack_len(len(body)), body)
    return b"".join(parts)


def encode_deliver_batch(records: bytes) -> bytes:
    """DELIVER-BATCH carrying ``records``, journal records exactly as stored."""
    return _BATCH_HEAD.pack(SIGNATURE, DeliverBatch.ID, len(records)) + records


_RUN_HEAD = struct.Struct("!2sBII")  # signature, id, crc, index length
RUN_OVERHEAD = _RUN_HEAD.size + 4  #: a DELIVER-RUN frame's bytes besides its records and their index entries


def run_index(starts: Iterable[int]) -> bytes:
    """DELIVER-RUN's index: each record's offset in the run, number-4 (network byte order)."""
    index = array("I", starts)
    if sys.byteorder == "little":
        index.byteswap()
    return index.tobytes()


def encode_deliver_run(records: bytes, index: bytes) -> bytes:
    """DELIVER-RUN carrying ``records`` (journal records as stored) and ``index`` (the offset of each
    record in ``records``, number-4 each); the CRC32C is computed here."""
    crc = crc32c(records, crc32c(index))
    return b"".join((_RUN_HEAD.pack(SIGNATURE, DeliverRun.ID, crc, len(index)), index, U32.pack(len(records)), records))


def _decode_deliver_run(frame: bytes) -> DeliverRun:
    if len(frame) < _RUN_HEAD.size:
        raise RemoteProtocolError("DELIVER-RUN truncated")
    _, _, crc, index_length = _RUN_HEAD.unpack_from(frame)
    records_at = _RUN_HEAD.size + index_length + 4
    if records_at > len(frame):
        raise RemoteProtocolError(f"DELIVER-RUN.index claims {index_length} bytes, or the records length is missing")
    (length,) = U32.unpack_from(frame, records_at - 4)
    if records_at + length != len(frame):
        raise RemoteProtocolError(f"DELIVER-RUN.records claims {length} bytes, {len(frame) - records_at} follow")
    index, records = frame[_RUN_HEAD.size : records_at - 4], frame[records_at:]
    try:
        run = indexed_run(records, index, crc)
    except RecordFormatError as exc:
        raise RemoteProtocolError(f"DELIVER-RUN {exc}") from None
    return DeliverRun(crc=crc, index=index, records=records, run=run)


def _batch_body(frame: bytes, name: str) -> bytes:
    if len(frame) < _BATCH_HEAD.size:
        raise RemoteProtocolError(f"{name} truncated")
    (length,) = U32.unpack_from(frame, 3)
    if _BATCH_HEAD.size + length != len(frame):
        raise RemoteProtocolError(f"{name} claims {length} bytes, {len(frame) - _BATCH_HEAD.size} follow")
    if not length:
        raise RemoteProtocolError(f"{name} is empty")
    return frame[_BATCH_HEAD.size :]


def _decode_publish_batch(frame: bytes) -> PublishBatch:
    entries = _batch_body(frame, "PUBLISH-BATCH")
    return PublishBatch(entries=entries, items=_decode_entries(entries, "PUBLISH-BATCH"))


def _decode_publish_batch_seq(frame: bytes) -> PublishBatchSeq:
    if len(frame) < _BATCH_SEQ_HEAD.size:
        raise RemoteProtocolError("PUBLISH-BATCH-SEQ truncated")
    _, _, sequence, length = _BATCH_SEQ_HEAD.unpack_from(frame)
    follow = len(frame) - _BATCH_SEQ_HEAD.size
    if length != follow:
        raise RemoteProtocolError(f"PUBLISH-BATCH-SEQ claims {length} bytes, {follow} follow")
    if not length:
        raise RemoteProtocolError("PUBLISH-BATCH-SEQ is empty")
    entries = frame[_BATCH_SEQ_HEAD.size :]
    items = _decode_entries(entries, "PUBLISH-BATCH-SEQ")
    return PublishBatchSeq(sequence=sequence, entries=entries, items=items)


def publish_seq_fields(frame: bytes) -> tuple[int, str, bytes]:
    """(sequence, key, body) of a PUBLISH-SEQ frame (its signature and id already checked), as
    :func:`~zeps.protocol.decode` would check them; RemoteProtocolError if malformed."""
    if len(frame) < 11:
        raise RemoteProtocolError("PUBLISH-SEQ truncated before key")
    (sequence,) = U64.unpack_from(frame, 3)
    key, body = _key_and_body(frame, 11, "PUBLISH-SEQ")
    return sequence, key, body


def _decode_publish_seq(frame: bytes) -> PublishSeq:
    sequence, key, body = publish_seq_fields(frame)
    return PublishSeq(sequence=sequence, key=key, body=body)


def _decode_entries(entries: bytes, name: str) -> tuple[tuple[str, bytes], ...]:
    """The (key, body) entries of a PUBLISH-BATCH (-SEQ)."""
    items: list[tuple[str, bytes]] = []
    offset, size, checked = 0, len(entries), set[str]()
    while offset < size:
        klen = entries[offset]
        end = offset + 1 + klen
        if end + 4 > size:
            raise RemoteProtocolError(f"{name} entry {len(items)} is truncated")
        key = entries[offset + 1 : end].decode("latin-1")
        if key not in checked:
            if not is_vchar(key):
                raise RemoteProtocolError(f"{name} entry {len(items)} key is not printable ASCII")
            checked.add(key)
        (length,) = U32.unpack_from(entries, end)
        offset = end + 4 + length
        if offset > size:
            raise RemoteProtocolError(f"{name} entry {len(items)} body claims {length} bytes")
        items.append((key, entries[end + 4 : offset]))
    return tuple(items)


def _decode_deliver_batch(frame: bytes) -> DeliverBatch:
    records = _batch_body(frame, "DELIVER-BATCH")
    try:
        run = Records(records)
    except RecordFormatError as exc:
        raise RemoteProtocolError(f"DELIVER-BATCH {exc}") from None
    return DeliverBatch(records=records, run=run)


#: the commands that carry messages, decoded by hand (the generic field walk below is for the rest)
FAST_DECODERS: dict[int, Callable[[bytes], Command]] = {
    Publish.ID: _decode_publish, PublishSeq.ID: _decode_publish_seq, PublishBatch.ID: _decode_publish_batch,
    PublishBatchSeq.ID: _decode_publish_batch_seq, Deliver.ID: _decode_deliver, DeliverTs.ID: _decode_deliver,
    DeliverBatch.ID: _decode_deliver_batch, DeliverRun.ID: _decode_deliver_run,
}  # fmt: skip


def deliver_size(sequence: int, key: str, body_len: int, *, timestamps: bool) -> int:
    """Wire size of a DELIVER (or DELIVER-TS) frame: what a delivery costs in credit."""
    return 2 + 1 + 8 + (8 if timestamps else 0) + 1 + len(key) + 4 + body_len
