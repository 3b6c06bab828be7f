"""A compacted stream read as a table: the latest value of each key (``ZepsStream`` ``cleanup: compact``).

:func:`read_table` fetches the stream from its first sequence up to its tail, a window of sequences at
a time (so the client holds one window of records, never the whole journal), and folds the records
into a :class:`Table`: a record sets its key's value, a record with an empty body (a delete, a
*tombstone*) removes the key. On a compacted stream this reads about one record per key plus the
active segment, whatever the stream's history; on any other stream it reads every record and gives
the same answer. ``Table.sequence`` is the last sequence it covered: a subscriber from
``Seq(table.sequence)`` (after it; on a client of its own: one that fetches does not subscribe) sees every
change after the snapshot, and :meth:`Table.apply` folds it in.
A range retention removed (``delete,compact``) costs an empty fetch per window it spans.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING

from zeps.client.session import Message
from zeps.errors import ConfigError

if TYPE_CHECKING:
    from zeps.client.sync import StreamClient

__all__ = ["DEFAULT_WINDOW", "Table", "read_table"]

DEFAULT_WINDOW = 10_000  #: sequences one fetch covers at most


class Table(Mapping[str, bytes]):
    """Each key's latest value (a read-only mapping), as of :attr:`sequence`."""

    def __init__(self, values: dict[str, bytes] | None = None, sequence: int = 0) -> None:
        self._values = {} if values is None else values
        self.sequence = sequence  #: the last sequence folded in (0: none)

    def apply(self, messages: Iterable[Message]) -> None:
        """Fold records in, in sequence order: a value sets its key, an empty body deletes it; records
        at or below :attr:`sequence` are skipped (a snapshot and a subscription may overlap)."""
        values = self._values
        for message in messages:
            if message.sequence <= self.sequence:
                continue
            if message.body:
                values[message.key] = message.body
            else:
                values.pop(message.key, None)
            self.sequence = message.sequence

    def __getitem__(self, key: str) -> bytes:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Table({len(self._values)} keys, as of sequence {self.sequence})"


def read_table(client: StreamClient, pattern: str = "", *, window: int = DEFAULT_WINDOW) -> Table:
    """The latest value of each key matching ``pattern`` (a prefix, or ~regex), from the stream's first
    sequence to its tail as this call reaches it (see the module's notes). BrokerUnavailableError if
    the broker stays silent the client's timeout."""
    if window < 1:
        raise ConfigError(f"window={window}: a fetch covers at least 1 sequence")
    table, first = Table(), 0
    while True:
        fetched = client.fetch(pattern, first=first, last=max(first, 1) + window - 1)
        table.apply(fetched.messages)
        table.sequence = max(table.sequence, fetched.last)
        if fetched.last < max(first, 1) + window - 1:  # the broker stopped at its tail
            return table
        first = fetched.last + 1
