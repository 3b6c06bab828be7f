"""A tiered stream's manifest: which runs of its journal are in the object store, as pure data.

Each object holds the records ``first .. last`` of one stream (or partition), as the journal stores
them without its producer marks (:mod:`zeps._records`: the bytes a DELIVER-BATCH carries), inside the
batch store's object format (length and CRC32C: :mod:`zeps.batchstore.format`). Its manifest entry
is one ZooKeeper node (``StreamPaths.tier_segments``) and goes through these states, as Kafka's
remote log metadata does (KIP-405)::

    copy-started ──put──▶ copy-finished ──(past retention)──▶ delete-started ──delete──▶ (node removed)
         │
         └──(the uploader died or lost its lead)──▶ cleaned: the object deleted, then the node

An entry is written ``copy-started`` with its object's name *before* the upload, so an upload cut
off by a crash or a change of leader leaves a name to clean, never an object nobody knows of; the
next uploader deletes it and uploads that run again under a new name (names are unique: a retry
never meets an object of an earlier try). Only ``copy-finished`` entries are read. An entry is
``delete-started`` before its object is deleted, so a reader never follows an entry to an object
that is gone on purpose, and a deletion cut off is finished by the next uploader ("delete-finished"
is the node's removal).

A compacted stream's segments lose records after their upload (:mod:`zeps.journal.compaction`): the
leader then uploads the compacted run again as the entry's next *generation* (the node
``<first>.<generation>``, the same run ``first .. last`` holding fewer records, ``records`` of them),
through the same states; once it is ``copy-finished`` the older generation is *superseded*: deleted
like an entry past retention (``delete-started``, its object, its node). Readers read the newest
finished generation of each run (:func:`current`); a crash between the two leaves both, and the
next round deletes the older.

Everything here is a pure function of the entries and the journal's closed segments: the uploader
(:mod:`zeps.tiering.uploader`) does the writes, the reader (:mod:`zeps.tiering.reader`) the reads.
A node is data anyone with write access to the stream's subtree could have written: it is parsed
within bounds and refused, never trusted, if anything in it is out of shape.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from zeps import _json
from zeps.journal import ClosedSegment

__all__ = [
    "MAX_ENTRY_BYTES",
    "ClosedSegment",
    "State",
    "TierEntry",
    "Upload",
    "current",
    "decode_entry",
    "encode_entry",
    "expired",
    "next_upload",
    "node_name",
    "object_key",
    "superseded",
    "tiered_to",
]

#: a manifest node larger than this is refused unread (zeps writes about 300 bytes)
MAX_ENTRY_BYTES = 4096
#: the names an object may have: first and last sequence, the uploader's epoch, a random token
_KEY = re.compile(r"^[0-9]{20}-[0-9]{20}-e[0-9]{1,19}-[0-9a-f]{16}$")
_MAX_SEQUENCE = (1 << 64) - 1


class State(StrEnum):
    COPY_STARTED = "copy-started"
    COPY_FINISHED = "copy-finished"
    DELETE_STARTED = "delete-started"


@dataclass(frozen=True, slots=True)
class TierEntry:
    """One object of the stream's journal in the object store: records ``first .. last``."""

    first: int
    last: int
    epoch: int  #: the leader epoch of the uploader that wrote it
    key: str  #: the object's name in the store (unique: :func:`object_key`)
    state: State
    first_ts: int = 0  #: ms: the first record's timestamp
    last_ts: int = 0  #: ms: the last record's timestamp
    size: int = 0  #: bytes of records
    reference: str = ""  #: the store's reference (its URL and CRC32C), once copy-finished
    generation: int = 0  #: 0 as first uploaded; one more each time a compacted run replaces it
    #: how many records the object holds, when compaction removed some of ``first .. last`` (None:
    #: every one of them); 0 when it removed them all (an empty object keeps the run contiguous)
    records: int | None = None

    @property
    def count(self) -> int:
        """The records its object holds."""
        return self.last - self.first + 1 if self.records is None else self.records

    def finished(self, reference: str) -> TierEntry:
        return replace(self, state=State.COPY_FINISHED, reference=reference)

    def deleting(self) -> TierEntry:
        return replace(self, state=State.DELETE_STARTED)


def node_name(entry: TierEntry) -> str:
    """An entry's node: its first sequence, 20 digits (the manifest lists in order of sequence), then
    ``.<generation>`` from the first compacted generation on."""
    return f"{entry.first:020d}" + (f".{entry.generation}" if entry.generation else "")


def object_key(first: int, last: int, epoch: int, token: str) -> str:
    """An object's name: its range, the uploader's epoch and a random ``token`` (16 hex digits), so no
    two tries ever write the same name."""
    return f"{first:020d}-{last:020d}-e{epoch}-{token}"


def encode_entry(entry: TierEntry) -> bytes:
    out: dict[str, Any] = {"first": entry.first, "last": entry.last, "epoch": entry.epoch, "key": entry.key,
                           "state": entry.state.value, "firstTs": entry.first_ts, "lastTs": entry.last_ts,
                           "bytes": entry.size}  # fmt: skip
    if entry.reference:
        out["reference"] = entry.reference
    if entry.generation:
        out["generation"] = entry.generation
    if entry.records is not None:
        out["records"] = entry.records
    return json.dumps(out, separators=(",", ":")).encode()


def decode_entry(data: bytes) -> TierEntry:
    """An entry from a manifest node's bytes; ValueError saying what is wrong with one out of shape."""
    if len(data) > MAX_ENTRY_BYTES:
        raise ValueError(f"{len(data)} bytes, more than {MAX_ENTRY_BYTES}")
    raw = _json.loads(data, max_depth=2)
    if not isinstance(raw, dict):
        raise ValueError("not a JSON object")
    ints = {}
    for field in ("first", "last", "epoch", "firstTs", "lastTs", "bytes"):
        value = raw.get(field)
        if type(value) is not int or not 0 <= value <= _MAX_SEQUENCE:
            raise ValueError(f"{field} must be a whole number from 0 to 2^64-1, not {value!r}")
        ints[field] = value
    if not 1 <= ints["first"] <= ints["last"]:
        raise ValueError(f"first {ints['first']} and last {ints['last']} are not a run of sequences")
    key, state, reference = raw.get("key"), raw.get("state"), raw.get("reference", "")
    if not isinstance(key, str) or not _KEY.match(key):
        raise ValueError(f"key {key!r} is not an object name zeps makes")
    if key != object_key(ints["first"], ints["last"], ints["epoch"], key[-16:]):
        raise ValueError(f"key {key!r} does not name the run {ints['first']}..{ints['last']} of epoch {ints['epoch']}")
    if state not in {s.value for s in State}:
        raise ValueError(f"state {state!r} is not one of {', '.join(s.value for s in State)}")
    if not isinstance(reference, str) or len(reference) > 1024:
        raise ValueError("reference must be a string of at most 1024 characters")
    if state == State.COPY_FINISHED and not reference:
        raise ValueError("a copy-finished entry names its object's reference")
    generation, records = raw.get("generation", 0), raw.get("records")
    if type(generation) is not int or not 0 <= generation < 1 << 32:
        raise ValueError(f"generation must be a whole number from 0 to 2^32-1, not {generation!r}")
    span = ints["last"] - ints["first"] + 1
    if records is not None and (type(records) is not int or not 0 <= records <= span):
        raise ValueError(f"records must be a whole number from 0 to {span} (the run's length), not {records!r}")
    return TierEntry(ints["first"], ints["last"], ints["epoch"], key, State(state), ints["firstTs"], ints["lastTs"],
                     ints["bytes"], reference, generation, records)  # fmt: skip


def current(entries: list[TierEntry]) -> list[TierEntry]:
    """The ``copy-finished`` entries readers read, by first sequence: of each run, its newest finished
    generation."""
    newest: dict[int, TierEntry] = {}
    for entry in entries:
        if entry.state == State.COPY_FINISHED:
            known = newest.get(entry.first)
            if known is None or entry.generation > known.generation:
                newest[entry.first] = entry
    return sorted(newest.values(), key=lambda e: e.first)


def superseded(entries: list[TierEntry]) -> list[TierEntry]:
    """The ``copy-finished`` entries a newer finished generation of their run replaced (to delete)."""
    kept = set(map(id, current(entries)))
    return [e for e in entries if e.state == State.COPY_FINISHED and id(e) not in kept]


def tiered_to(entries: list[TierEntry]) -> int:
    """The last sequence up to which the store holds every record from the first tiered one on: the end
    of the contiguous run of ``copy-finished`` entries from the lowest (0 when there is none). A local
    segment may be deleted by local retention only up to here."""
    finished = current(entries)
    if not finished:
        return 0
    end = finished[0].last
    for entry in finished[1:]:
        if entry.first > end + 1:
            break
        end = max(end, entry.last)
    return end


@dataclass(frozen=True, slots=True)
class Upload:
    """The next run to upload: records ``first .. last`` of the closed segment that starts at ``segment``."""

    segment: int
    first: int
    last: int


def next_upload(segments: list[ClosedSegment], commit: int, entries: list[TierEntry]) -> Upload | None:
    """The next run of the local journal to upload, oldest first: the part above what the store holds
    of a closed segment wholly at or below ``commit`` (a record no quorum holds is never uploaded; the
    active segment is never given). None when there is nothing to upload (yet)."""
    done = max((e.last for e in current(entries)), default=0)
    for segment in segments:
        if segment.last <= done or segment.last < segment.first:
            continue
        if segment.last > commit:
            return None  # not all of it committed yet: later ones are not either
        return Upload(segment.first, max(segment.first, done + 1), segment.last)
    return None


def expired(entries: list[TierEntry], *, now_ms: int, retention_ms: int | None,
            retention_bytes: int | None, local_bytes: int) -> list[TierEntry]:  # fmt: skip
    """The ``copy-finished`` entries the stream's total retention deletes, oldest first: those whose
    last record is older than ``retention_ms``, and the oldest while the stream (the store's objects
    and ``local_bytes`` not in them) holds more than ``retention_bytes``."""
    finished = current(entries)
    total = sum(e.size for e in finished) + local_bytes
    out = []
    for entry in finished:
        too_old = retention_ms is not None and entry.last_ts < now_ms - retention_ms
        too_big = retention_bytes is not None and total > retention_bytes
        if not (too_old or too_big):
            break
        out.append(entry)
        total -= entry.size
    return out
