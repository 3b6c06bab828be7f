"""A stream's multicast output (protocol version 7): every record that becomes durable, once, to the
multicast group, whatever the subscriptions.

Newly durable records are gathered (:meth:`MulticastOutbox.gather`) and sent once they fill a message
or have waited ``linger`` seconds, so a trickle of publishes makes few, fuller messages; a stream that
sent nothing for ``heartbeat`` seconds sends TAIL (its last sequence), so receivers notice what they
missed. Each message is a DELIVER-RUN frame of at most ``max_bytes``; a record too large for one
alone is left out, and receivers fetch it from the journal (they see the gap).
"""

from __future__ import annotations

import bisect
from array import array
from dataclasses import dataclass, field

from zeps.journal import Chunk
from zeps.protocol import RUN_OVERHEAD, multicast, run_index

__all__ = ["MulticastOutbox"]


@dataclass(eq=False)
class MulticastOutbox:
    """One stream's records on their way to the multicast group, and its counters."""

    pending: list[Chunk] = field(default_factory=list)  # durable records gathered, consecutive
    pending_bytes: int = 0
    since: float | None = None  # when take() first saw the gathered records (monotonic)
    at: float = 0.0  # when the stream last queued something for the group (monotonic)
    records: int = 0  # records queued for the group, ever
    oversize: int = 0  # records too large for a message: receivers fetch them

    def gather(self, chunk: Chunk) -> None:
        self.pending.append(chunk)
        self.pending_bytes += len(chunk.data) + 4 * len(chunk)

    def take(self, stream: str, routed: int, now: float, *, heartbeat: float, linger: float,
             max_bytes: int) -> list[list[bytes]]:  # fmt: skip
        """The messages due now (each two frames: the stream's topic, then DELIVER-RUN or TAIL)."""
        if self.pending:
            if self.since is None:
                self.since = now
            if self.pending_bytes >= max_bytes or now - self.since >= linger:
                self.at = now
                return self._runs(stream, max_bytes)
        elif now - self.at >= heartbeat:
            self.at = now
            return [multicast.encode_tail(stream, routed)]
        return []

    def _runs(self, stream: str, max_bytes: int) -> list[list[bytes]]:
        """The gathered records, once, in runs whose frames fit ``max_bytes``."""
        chunks, self.pending, self.pending_bytes, self.since = self.pending, [], 0, None
        if len(chunks) == 1:
            data, offsets = chunks[0].data, chunks[0].offsets
        else:  # consecutive chunks: one run of records
            data, offsets, size = b"".join(c.data for c in chunks), array("I", [0]), 0
            for c in chunks:
                offsets.extend(o + size for o in c.offsets[1:])
                size += len(c.data)
        out: list[list[bytes]] = []
        count, limit, begin = len(offsets) - 1, max_bytes - RUN_OVERHEAD, 0
        while begin < count:
            base = offsets[begin]
            end = bisect.bisect_right(range(begin, count + 1), limit,
                                      key=lambda j: offsets[j] - base + 4 * (j - begin)) + begin - 1  # fmt: skip
            if end == begin:  # record ``begin`` alone is too large
                self.oversize += 1
                begin += 1
                continue
            starts = offsets[begin:end] if base == 0 else array("I", (o - base for o in offsets[begin:end]))
            out.append(multicast.encode_run(stream, data[base : offsets[end]], run_index(starts)))
            self.records += end - begin
            begin = end
        return out
