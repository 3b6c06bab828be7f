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
"""

from __future__ import annotations

from zeps.errors import RemoteProtocolError
from zeps.protocol.commands import DeliverRun, Tail, decode, encode, encode_deliver_run

__all__ = ["decode_message", "encode_run", "encode_tail", "topic"]


def topic(stream: str) -> bytes:
    """The first frame of every message of ``stream`` (and what a receiver subscribes to)."""
    return stream.encode("ascii") + b"\x00"


def encode_tail(stream: str, sequence: int) -> list[bytes]:
    return [topic(stream), encode(Tail(sequence=sequence))]


def decode_message(frames: list[bytes], stream: str) -> DeliverRun | Tail:
    """The run or TAIL a multicast message of ``stream`` carries; RemoteProtocolError for anything
    else (another stream's message, a damaged run: its CRC is checked here)."""
    if len(frames) != 2 or frames[0] != topic(stream):
        raise RemoteProtocolError(f"not a multicast message of stream {stream!r} ({len(frames)} frames)")
    command = decode(frames[1])
    if not isinstance(command, DeliverRun | Tail):
        raise RemoteProtocolError(f"{command.NAME} is not sent to a multicast group")
    return command


def encode_run(stream: str, records: bytes, index: bytes) -> list[bytes]:
    """A run of records (journal layout, consecutive sequences) and their ``index`` (each record's
    offset, number-4 each) as one multicast message."""
    return [topic(stream), encode_deliver_run(records, index)]
