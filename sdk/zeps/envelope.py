"""The message envelope stored in ZooKeeper message nodes: body bytes plus headers, versioned.

Any language can read it::

    offset  size  field
    0       2     magic 0x5A 0x45 ("ZE")
    2       1     version, 1
    3       4     header length N, unsigned, network byte order
    7       N     headers: a UTF-8 JSON object
    7+N     …     body: the message bytes, as published

Header keys in version 1: ``id`` (str, unique per message), ``publisher`` (str), ``timestamp_ms``
(int, publisher's clock, milliseconds since the epoch), ``content_type`` (str, optional) and
``headers`` (object of str → str, the application's own headers). Readers ignore keys they do not
know; a reader meeting a higher version than it knows raises :class:`EnvelopeError`.

A node whose data does not start with the magic is a plain message (the zkms format:
"the node value is the message"): its whole data is the body and it has no headers.

A node may also hold a *pack* of envelopes (a publisher's batch, written as one node per
subscriber to save ZooKeeper operations)::

    offset  size  field
    0       2     magic 0x5A 0x50 ("ZP")
    2       1     version, 1
    3       4     count C, unsigned, network byte order
    7       …     C times: length L (4 bytes, network byte order) then L bytes of one envelope
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field

from zeps import _json as bounded_json
from zeps._framing import join_records, split_records
from zeps.errors import ZepsError

__all__ = ["ENVELOPE_VERSION", "Envelope", "EnvelopeError", "decode", "decode_node", "encode", "encode_pack"]

MAGIC = b"ZE"
PACK_MAGIC = b"ZP"
ENVELOPE_VERSION = 1
_PREFIX = struct.Struct("!2sBI")


class EnvelopeError(ZepsError, ValueError):
    """The bytes claim to be an envelope but cannot be read as one."""


@dataclass(frozen=True)
class Envelope:
    """One message: body plus the headers that travel with it."""

    body: bytes
    id: str = ""
    publisher: str = ""
    timestamp_ms: int = 0
    content_type: str | None = None
    headers: dict[str, str] = field(default_factory=dict)


def encode(envelope: Envelope) -> bytes:
    meta: dict[str, object] = {
        "id": envelope.id,
        "publisher": envelope.publisher,
        "timestamp_ms": envelope.timestamp_ms,
    }
    if envelope.content_type is not None:
        meta["content_type"] = envelope.content_type
    if envelope.headers:
        meta["headers"] = envelope.headers
    header = json.dumps(meta, separators=(",", ":"), ensure_ascii=False).encode()
    return _PREFIX.pack(MAGIC, ENVELOPE_VERSION, len(header)) + header + envelope.body


def decode(data: bytes) -> Envelope:
    if not data.startswith(MAGIC):
        return Envelope(body=data)  # a plain (zkms-style) message
    if len(data) < _PREFIX.size:
        raise EnvelopeError(f"envelope truncated: {len(data)} bytes, the prefix alone is {_PREFIX.size}")
    _, version, length = _PREFIX.unpack_from(data)
    if version != ENVELOPE_VERSION:
        raise EnvelopeError(f"envelope version {version} is not supported (this reader knows {ENVELOPE_VERSION})")
    end = _PREFIX.size + length
    if end > len(data):
        raise EnvelopeError(f"envelope header claims {length} bytes but only {len(data) - _PREFIX.size} follow")
    try:
        meta = bounded_json.loads(data[_PREFIX.size : end])
    except (UnicodeDecodeError, ValueError) as exc:
        raise EnvelopeError(f"envelope header is not JSON: {exc}") from None
    if not isinstance(meta, dict):
        raise EnvelopeError("envelope header must be a JSON object")
    headers = meta.get("headers") or {}
    if not (isinstance(headers, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in headers.items())):
        raise EnvelopeError("envelope 'headers' must map strings to strings")
    return Envelope(
        body=data[end:],
        id=str(meta.get("id", "")),
        publisher=str(meta.get("publisher", "")),
        timestamp_ms=int(meta.get("timestamp_ms", 0)),
        content_type=meta.get("content_type"),
        headers=headers,
    )


def encode_pack(envelopes: list[bytes]) -> bytes:
    """Pack already-encoded envelopes into one node's data (a single one is stored as is)."""
    if len(envelopes) == 1:
        return envelopes[0]
    return _PREFIX.pack(PACK_MAGIC, ENVELOPE_VERSION, len(envelopes)) + join_records(envelopes)


def decode_node(data: bytes) -> list[Envelope]:
    """The messages one node holds, in order: a pack, one envelope, or one plain message."""
    if not data.startswith(PACK_MAGIC):
        return [decode(data)]
    if len(data) < _PREFIX.size:
        raise EnvelopeError(f"pack truncated: {len(data)} bytes, the prefix alone is {_PREFIX.size}")
    _, version, count = _PREFIX.unpack_from(data)
    if version != ENVELOPE_VERSION:
        raise EnvelopeError(f"pack version {version} is not supported (this reader knows {ENVELOPE_VERSION})")
    return [decode(m) for m in split_records(data, _PREFIX.size, count, "message", _PackError)]


class _PackError(EnvelopeError):
    def __init__(self, detail: str) -> None:
        super().__init__(f"pack {detail}")
