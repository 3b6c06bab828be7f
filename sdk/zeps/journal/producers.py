"""Idempotent producers: the table a broker deduplicates publishes with, kept in the journal itself.

A producer is a name a client chose (or a random one), an *epoch* (raised each time a client claims
the name afresh, so an older client still publishing under it is fenced) and the last *sequence* the
journal holds from it. The table has no file of its own that could disagree with the records: it is
written into the segment files as *producer marks*, entries that take no sequence and are never
delivered (:class:`~zeps.journal.Journal` cuts them out of what it reads):

* a **group mark** opens every append that changes the table (publishes of producers, a claim): the
  producers it changes, as they are once the append is written, and how many records follow it. A
  group never spans segments: the journal rolls before one that would not fit (the broker keeps
  them to a quarter of a segment, cutting a large flush at the ends of idempotent publishes).
  Recovery drops a group whose records did not all reach the disk, mark included: a group is all or
  nothing, so the table never claims a record the journal lost.
* a **snapshot mark** opens every segment but the first: the whole table as journaled then (also when
  it is empty), made durable before any record follows. Retention removes whole segments, so the
  oldest retained segment starts with everything the removed ones held; and the last segment alone
  rebuilds the table at open (closed segments are not read then).

At open the journal replays the marks of the last segment: its snapshot, then its groups (a last
segment without a snapshot, from a journal older than seals, makes it replay every segment's).
Producers idle longer than the TTL (no claim, no publish) are forgotten then and on every
:meth:`ProducerTable.expire`; the table holds at most ``max_producers``.

A mark is a journal record (:mod:`zeps._records`) whose timestamp is 2^64-1 (no record has it), whose
sequence is that of the record before it, and whose key is empty; its body, numbers in network order::

    kind      number-1    1 = group, 2 = snapshot
    follows   number-4    records of the group after the mark (0 in a snapshot)
    count     number-4    producer entries, each:
      name        number-1 length + ASCII
      epoch       number-4
      sequence    number-8    the last sequence held
      seen        number-8    its last claim or publish, ms since the epoch
      generation  number-8    its current generation (0: none)
      base        number-8    the sequence that generation started after
"""

from __future__ import annotations

import struct
from typing import Literal, NamedTuple

from zeps.errors import ZepsError

__all__ = [
    "GROUP",
    "MARK_TIMESTAMP",
    "SNAPSHOT",
    "Producer",
    "ProducerRefusedError",
    "ProducerState",
    "ProducerTable",
    "decode_mark",
    "encode_mark_body",
    "frozen",
]

MARK_TIMESTAMP = 2**64 - 1  #: the timestamp field of a producer mark (no record has it)
GROUP, SNAPSHOT = 1, 2
_HEAD = struct.Struct("!BII")  # kind, follows, count
_ENTRY = struct.Struct("!IQQQQ")  # epoch, sequence, seen, generation, base (after the name)

Refusal = Literal["fenced", "unknown", "out-of-sequence", "full"]


class ProducerRefusedError(ZepsError):
    """The table refuses a claim or a publish; ``reason`` says why (the broker maps it to a code)."""

    def __init__(self, reason: Refusal, message: str) -> None:
        super().__init__(message)
        self.reason: Refusal = reason


class Producer(NamedTuple):
    """One producer as a mark records it: a snapshot of a :class:`ProducerState`."""

    epoch: int
    sequence: int  #: the last sequence the journal holds from it (0: none)
    seen_ms: int  #: its last claim or publish
    generation: int = 0  #: its current generation (a unit of work such as a Spark micro-batch; 0: none)
    base: int = 0  #: the sequence its current generation started after


class ProducerState:
    """One producer as the table holds it. Mutable: an in-order publish advances ``sequence`` and
    ``seen_ms`` in place (the broker's hot path), and :meth:`frozen` takes the :class:`Producer` a
    mark records when the group holding the change closes."""

    __slots__ = ("base", "epoch", "generation", "seen_ms", "sequence")

    def __init__(self, epoch: int, sequence: int, seen_ms: int, generation: int = 0, base: int = 0) -> None:
        self.epoch = epoch
        self.sequence = sequence  #: the last sequence the journal holds from it (0: none)
        self.seen_ms = seen_ms  #: its last claim or publish
        self.generation = generation  #: its current generation (a unit of work such as a Spark micro-batch; 0: none)
        self.base = base  #: the sequence its current generation started after

    def frozen(self) -> Producer:
        return Producer(self.epoch, self.sequence, self.seen_ms, self.generation, self.base)

    def __repr__(self) -> str:
        return f"ProducerState{tuple(self.frozen())}"


def frozen(changes: dict[str, ProducerState]) -> dict[str, Producer]:
    """Snapshots of ``changes``: what a mark records, unaffected by later publishes."""
    return {name: state.frozen() for name, state in changes.items()}


def encode_mark_body(kind: int, follows: int, producers: dict[str, Producer]) -> bytes:
    parts = [_HEAD.pack(kind, follows, len(producers))]
    for name, p in producers.items():
        raw = name.encode("ascii")
        parts += (bytes([len(raw)]), raw, _ENTRY.pack(p.epoch, p.sequence, p.seen_ms, p.generation, p.base))
    return b"".join(parts)


def decode_mark(body: bytes) -> tuple[int, int, dict[str, Producer]]:
    """(kind, follows, producers) of a mark's body; ValueError if it is not one."""
    if len(body) < _HEAD.size:
        raise ValueError(f"producer mark of {len(body)} bytes is too short")
    kind, follows, count = _HEAD.unpack_from(body)
    if kind not in (GROUP, SNAPSHOT):
        raise ValueError(f"producer mark of unknown kind {kind}")
    producers: dict[str, Producer] = {}
    at = _HEAD.size
    for _ in range(count):
        if at >= len(body) or at + 1 + body[at] + _ENTRY.size > len(body):
            raise ValueError(f"producer mark entry {len(producers)} is truncated")
        end = at + 1 + body[at]
        name = body[at + 1 : end].decode("ascii")
        producers[name] = Producer(*_ENTRY.unpack_from(body, end))
        at = end + _ENTRY.size
    if at != len(body):
        raise ValueError(f"producer mark has {len(body) - at} bytes after its last entry")
    return kind, follows, producers


class ProducerTable:
    """Who has published what: checked at every publish of an idempotent producer. It runs ahead of
    the journal: the caller hands each change (a claim or publish that returns True/held < count) to
    the journal's next append, which writes it in a group mark. Entries are changed in place, so a
    caller holding one sees the producer as it is now; marks record :func:`frozen` copies."""

    def __init__(self, *, ttl_ms: int, max_producers: int) -> None:
        self.ttl_ms = ttl_ms
        self.max_producers = max_producers
        self.producers: dict[str, ProducerState] = {}

    def __len__(self) -> int:
        return len(self.producers)

    def claim(self, name: str, epoch: int, now_ms: int, generation: int = 0) -> tuple[Producer, bool]:
        """A client claims ``name`` (PRODUCE): the producer now, and whether the claim changed it (a
        change the journal must record). Epoch 0 claims it afresh: a new producer, or a new epoch
        of a known one (its sequence goes on; older clients are fenced). A known epoch resumes. An older
        epoch is fenced; a resumed epoch of a name the table does not know is refused (it expired).
        A ``generation`` above the producer's starts a new one after its current sequence; the same
        is a retry of it; a lower one is fenced; 0 leaves the generation as it is."""
        known = self.producers.get(name)
        if known is not None and 0 < generation < known.generation:
            raise ProducerRefusedError("fenced", f"producer {name!r} generation {generation} is fenced: the "
                                       f"producer has gone on to generation {known.generation}")  # fmt: skip
        if epoch == 0:
            if known is None:
                if len(self.producers) >= self.max_producers:
                    self.expire(now_ms)
                    if len(self.producers) >= self.max_producers:
                        limit = f"the broker holds {self.max_producers} producers for this stream, its limit"
                        raise ProducerRefusedError("full", f"{limit}; idle ones are forgotten after {self._ttl}")
                known = self.producers[name] = ProducerState(1, 0, now_ms, generation, 0)
                return known.frozen(), True
            known.epoch += 1
            known.seen_ms = now_ms
            if generation > known.generation:
                known.generation, known.base = generation, known.sequence
            return known.frozen(), True
        if known is None:
            raise ProducerRefusedError(
                "unknown",
                f"producer {name!r} (epoch {epoch}) is not known to this broker: it was idle longer than "
                f"{self._ttl} and expired, or the journal that held it is gone; publishes not yet confirmed "
                "cannot be checked for duplicates",
            )
        if epoch < known.epoch:
            raise self._fenced(name, epoch, known.epoch)
        if generation > known.generation:
            raise ProducerRefusedError("fenced", f"producer {name!r} resumed epoch {epoch} with generation "
                                       f"{generation}, beyond its {known.generation}: claim a new generation "
                                       "with epoch 0")  # fmt: skip
        known.seen_ms = now_ms
        if epoch > known.epoch:  # the claim that raised it was lost with unsynced writes (a machine crash)
            known.epoch = epoch
            return known.frozen(), True
        return known.frozen(), False  # resumed: nothing to journal

    @property
    def _ttl(self) -> str:
        return f"{self.ttl_ms / 1000:g}s"

    @staticmethod
    def _fenced(name: str, epoch: int, newer: int) -> ProducerRefusedError:
        return ProducerRefusedError(
            "fenced",
            f"producer {name!r} epoch {epoch} is fenced: a newer client claimed the name (epoch {newer}); "
            "this client's publishes are refused",
        )

    def admit(self, name: str, epoch: int, first: int, count: int, now_ms: int) -> int:
        """Publishes ``first .. first + count - 1`` of producer ``name``: how many of them, from the
        front, the journal already holds (drop them); the rest are new and the table counts them held
        (a change for the journal when any are new). Refused if the epoch is fenced or unknown, or if
        ``first`` skips a sequence. (The broker checks the in-order case itself, inline.)"""
        known = self.producers.get(name)
        if known is None:
            raise ProducerRefusedError("unknown", f"producer {name!r} expired (idle longer than {self._ttl})")
        if epoch != known.epoch:
            raise self._fenced(name, epoch, known.epoch)
        if first > known.sequence + 1:
            raise ProducerRefusedError(
                "out-of-sequence",
                f"producer {name!r} sent sequence {first}, but the broker holds up to {known.sequence}: "
                f"publishes {known.sequence + 1}..{first - 1} never reached it",
            )
        held = min(count, known.sequence + 1 - first)
        if held < count:
            known.sequence = first + count - 1
        known.seen_ms = now_ms
        return held

    def apply(self, kind: int, producers: dict[str, Producer]) -> None:
        """Replay one mark (recovery): a snapshot replaces the table, a group updates it."""
        if kind == SNAPSHOT:
            self.producers.clear()
        for name, p in producers.items():
            self.producers[name] = ProducerState(*p)

    def expire(self, now_ms: int) -> list[str]:
        """Forget producers idle longer than the TTL; returns their names."""
        cutoff = now_ms - self.ttl_ms
        gone = [name for name, p in self.producers.items() if p.seen_ms < cutoff]
        for name in gone:
            del self.producers[name]
        return gone
