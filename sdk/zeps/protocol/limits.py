"""What one peer may cost the broker: message and frame sizes, credit. One source for the broker,
the clients, the CRD (``spec.maxMessageBytes``) and the README's limits table.

* A message body may hold at most ``max_message_bytes`` (:data:`DEFAULT_MAX_MESSAGE_BYTES` unless the
  stream sets another): the broker refuses a larger one with INVALID-CODE ``TOO_LARGE`` and journals
  nothing of its frame; the clients refuse it before sending.
* A frame may hold at most :func:`max_frame_bytes`: one message plus a PUBLISH-BATCH's worth of others
  (clients cut batches at :data:`PUBLISH_BATCH_BYTES`). ZeroMQ drops the connection of a peer that
  sends more (``ZMQ_MAXMSGSIZE``) before reading the frame into memory.
* A session's credit is capped at :data:`MAX_CREDIT_BYTES`: CREDIT beyond it is clamped, so what the
  broker queues for a peer that grants much and reads nothing stays bounded.
* What a client receives is bounded the same way, against a broker (or anything at its address)
  that sends more than one would: every socket a client reads (its DEALER, a multicast group's SUB,
  a relay's PULL) refuses frames over :func:`max_delivery_frame_bytes`, dropping the connection
  before the frame is read into memory.
"""

from __future__ import annotations

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "DELIVERY_BATCH_BYTES",
    "MAX_CREDIT_BYTES",
    "MAX_MESSAGE_BYTES_CEILING",
    "PUBLISH_BATCH_BYTES",
    "max_delivery_frame_bytes",
    "max_frame_bytes",
]

DEFAULT_MAX_MESSAGE_BYTES = 1 << 20  #: a message body's limit unless the stream sets another (1 MiB)
MAX_MESSAGE_BYTES_CEILING = 64 << 20  #: the largest limit a stream may set (a record must fit a delivery)
PUBLISH_BATCH_BYTES = 256 * 1024  #: clients close a PUBLISH-BATCH once its entries reach this size
DELIVERY_BATCH_BYTES = 1 << 20  #: the largest DELIVER-BATCH/RUN (and multicast message) a broker makes
MAX_CREDIT_BYTES = 64 << 20  #: a session's credit at most (a client's window should stay below it)
_FRAME_OVERHEAD = 64 * 1024  # signature, command, key, sequence and entry framing, with room to spare


def max_frame_bytes(max_message_bytes: int) -> int:
    """The largest frame a client following these limits sends: a batch of up to
    :data:`PUBLISH_BATCH_BYTES` closed by one more message of up to ``max_message_bytes``."""
    return max_message_bytes + PUBLISH_BATCH_BYTES + _FRAME_OVERHEAD


def max_delivery_frame_bytes() -> int:
    """The largest frame a broker sends a client, whatever the stream's limit: a delivery of up to
    :data:`DELIVERY_BATCH_BYTES`, or one record of up to :data:`MAX_MESSAGE_BYTES_CEILING` alone, with
    its framing and index entry."""
    return max(DELIVERY_BATCH_BYTES, MAX_MESSAGE_BYTES_CEILING) + _FRAME_OVERHEAD
