"""The multicast output's messages (seed 004, "Multicast Output"; protocol version 7), sans-I/O.

A broker with a multicast output sends each newly durable record of a stream once to a multicast
group (NORM or PGM, through a ZeroMQ PUB socket), and never history. Each message is two frames:

* the **topic**: the stream's name and a NUL byte (a receiver's SUB socket subscribes to exactly
  that, so streams may share a group: a stream name holds no NUL, so ``prices`` never matches
  ``prices-eu``);
* one **ZEPS frame**: DELIVER-RUN (a run of records in the journal's layout, with its index and one
  CRC32C, as a version-4 peering gets it; sequences consecutive) or TAIL (the last durable
  sequence: every record up to it was sent before).

A receiver learns of a lost record from a run that does not start where the previous one ended, or
from a TAIL beyond what it holds, and fetches it over an ordinary peering
(:class:`~zeps.protocol.Fetch`).

**Signed messages** (a stream with CURVE): anyone on the network segment can send to the group, so
a broker given a key adds a third frame, the first :data:`MAC_BYTES` bytes of HMAC-SHA256(key, the
topic frame, then the ZEPS frame). A receiver given the key drops every message whose MAC is missing
or wrong (:class:`ForgedMessageError`; the record is then fetched from the journal like any gap).
The key is shared by the broker and the stream's clients (the operator puts it in each client's
Secret): it keeps out whoever is not a client; a client could still forge to the others. It does
not hide the records (they travel in clear), and a replayed genuine message is dropped as the
duplicate it is.
"""

from __future__ import annotations

import hashlib
import hmac

from zeps.errors import RemoteProtocolError
from zeps.protocol._fastpath import encode_deliver_run
from zeps.protocol.codec import decode, encode
from zeps.protocol.commands import DeliverRun, Tail

__all__ = ["MAC_BYTES", "ForgedMessageError", "decode_message", "encode_run", "encode_tail", "sign", "topic"]

MAC_BYTES = 16  #: a signed message's third frame: HMAC-SHA256 cut to 128 bits


class ForgedMessageError(RemoteProtocolError):
    """A multicast message without the MAC of the stream's key: not the broker's (dropped, counted)."""


def _mac(key: bytes, frames: list[bytes]) -> bytes:
    return hmac.new(key, frames[0] + frames[1], hashlib.sha256).digest()[:MAC_BYTES]


def sign(message: list[bytes], key: bytes) -> list[bytes]:
    """``message`` (topic and ZEPS frame) with its MAC as a third frame."""
    return [*message, _mac(key, message)]


def topic(stream: str) -> bytes:
    """The first frame of every message of ``stream`` (and what a receiver subscribes to)."""
    return stream.encode("ascii") + b"\x00"


def encode_tail(stream: str, sequence: int) -> list[bytes]:
    return [topic(stream), encode(Tail(sequence=sequence))]


def decode_message(frames: list[bytes], stream: str, key: bytes | None = None) -> DeliverRun | Tail:
    """The run or TAIL a multicast message of ``stream`` carries; RemoteProtocolError for anything
    else (another stream's message, a damaged run: its CRC is checked here). With ``key`` (a signed
    stream), ForgedMessageError unless its MAC is that key's; without, a MAC is not looked at."""
    if len(frames) not in (2, 3) or frames[0] != topic(stream):
        raise RemoteProtocolError(f"not a multicast message of stream {stream!r} ({len(frames)} frames)")
    if key is not None and (len(frames) != 3 or not hmac.compare_digest(frames[2], _mac(key, frames))):
        raise ForgedMessageError(f"a multicast message of stream {stream!r} without a valid MAC: not the broker's")
    command = decode(frames[1])
    if not isinstance(command, DeliverRun | Tail):
        raise RemoteProtocolError(f"{command.NAME} is not sent to a multicast group")
    return command


def encode_run(stream: str, records: bytes, index: bytes) -> list[bytes]:
    """A run of records (journal layout, consecutive sequences) and their ``index`` (each record's
    offset, number-4 each) as one multicast message."""
    return [topic(stream), encode_deliver_run(records, index)]
