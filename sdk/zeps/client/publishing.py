"""The client's publishing state: the idempotent producer, and the publishes not yet confirmed.

* **The producer** (version 6). A client is an idempotent producer unless told otherwise: it claims a
  name (PRODUCE; random unless the caller names it) and numbers its publishes 1, 2, …, so a broker
  drops a resent publish it had journaled before it died. A named producer starts where the broker
  says its name stopped (PRODUCE-OK), so a restarted process neither repeats nor skips; a random name
  is new, so it starts at 1, and is claimed only at its first publish (a client that only subscribes
  claims none).
* **Unconfirmed publishes.** ZEPS has no publish acknowledgement: the session puts a PING after
  publishes as a barrier, and the broker answers in order, so a PING-OK confirms every publish before
  it. Each publish frame is kept until then, and resent after a reconnect.
"""

from __future__ import annotations

import secrets
from collections import deque

from zeps.errors import ProducerError
from zeps.protocol import Produce, ProduceOk

__all__ = ["Producer", "Unconfirmed"]


class Producer:
    """An idempotent producer's name, epoch and numbering, as the client keeps them."""

    __slots__ = ("claimed", "epoch", "generation", "generation_held", "name", "named", "next_sequence",
                 "produce_sent", "producing")  # fmt: skip

    def __init__(self, name: str | None, generation: int) -> None:
        self.named = name is not None  #: named by the caller (else a random name, new to every broker)
        self.name = name if name is not None else f"zeps-{secrets.token_hex(8)}"
        self.epoch = 0  #: from PRODUCE-OK (0: claim the name afresh)
        self.generation = generation
        self.generation_held: int | None = None  #: publishes of this generation held at the first PRODUCE-OK
        #: the next publish's sequence: a named producer learns it from the first PRODUCE-OK
        self.next_sequence: int | None = None if self.named else 1
        self.producing = False  #: PRODUCE-OK arrived on this peering
        self.claimed = self.named  #: a random name is claimed at the first publish
        self.produce_sent = False  #: PRODUCE went out on this peering

    def produce(self) -> Produce:
        """PRODUCE for this peering: claim the name (afresh with epoch 0, or resuming its epoch)."""
        self.claimed = self.produce_sent = True
        return Produce(producer=self.name, epoch=self.epoch, generation=self.generation)

    def produced(self, answer: ProduceOk) -> None:
        """PRODUCE-OK: the epoch to resume with; at the first one, where the numbering goes on."""
        self.epoch, self.producing = answer.epoch, True
        if self.next_sequence is None:
            self.next_sequence = answer.sequence + 1
            self.generation_held = answer.sequence - answer.base

    def reattached(self) -> None:
        """A new peering: PRODUCE is due on it again (if the name was claimed)."""
        self.producing = self.produce_sent = False

    def number(self, count: int) -> int:
        """The sequence of the first of ``count`` publishes (they take the next ``count``)."""
        if self.next_sequence is None:
            raise ProducerError("the broker has not answered PRODUCE yet: publish once the client is connected")
        first = self.next_sequence
        self.next_sequence += count
        return first

    def claim_due(self, attached: bool) -> bool:
        """Whether PRODUCE must go before the next publish (detached, the re-attach claims it)."""
        return not self.claimed or (attached and not self.produce_sent)

    def confirmed(self, unconfirmed: int) -> int:
        """The last sequence the broker confirmed holding (0: none), with ``unconfirmed`` publishes out."""
        return 0 if self.next_sequence is None else self.next_sequence - 1 - unconfirmed


class Unconfirmed:
    """Publish frames sent and not yet confirmed, oldest first, and the barriers that confirm them."""

    __slots__ = ("_barriers", "_dropped", "every", "frames", "messages", "since_barrier")

    def __init__(self, every: int) -> None:
        self.every = every  #: a barrier after this many publishes
        self.frames: deque[tuple[bytes, int]] = deque()  #: (publish frame, messages in it)
        self.messages = 0  #: messages in :attr:`frames`
        self._dropped = 0  # frames confirmed and dropped so far: positions count from the first frame ever kept
        self._barriers: deque[int] = deque()  # the position after the last frame each PING out covers, oldest first
        self.since_barrier = 0  #: messages published since the last barrier

    def add(self, frame: bytes, count: int) -> bool:
        """Keep a publish frame of ``count`` messages; True when a barrier is due."""
        self.frames.append((frame, count))
        self.messages += count
        self.since_barrier += count
        return self.since_barrier >= self.every

    def barrier(self) -> None:
        """A PING is going out: its answer confirms every frame kept so far."""
        self.since_barrier = 0
        self._barriers.append(self._dropped + len(self.frames))

    def confirmed(self) -> None:
        """A PING-OK: the frames its barrier covered are confirmed and dropped."""
        if not self._barriers:
            return
        frames = self.frames
        for _ in range(min(self._barriers.popleft() - self._dropped, len(frames))):
            self.messages -= frames.popleft()[1]
            self._dropped += 1

    def disconnected(self) -> None:
        """The peering dropped: no PING-OK will come for the barriers out; every frame is resent."""
        self._barriers.clear()
        self.since_barrier = 0
