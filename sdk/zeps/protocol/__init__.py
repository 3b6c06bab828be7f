"""The ZEPS protocol, sans-I/O: the commands, their codec and the per-connection state machine.

No sockets here: :func:`encode`/:func:`decode` (:mod:`~zeps.protocol.codec`, with the hand-written
paths of :mod:`~zeps.protocol._fastpath`) turn commands (:mod:`~zeps.protocol.commands`) into frames
and back, and :class:`Connection` says which command may travel which way in which state. The
protocol itself, version by version: ``docs/protocol.md``.
"""

from zeps.protocol._fastpath import (
    deliver_size,
    encode_deliver,
    encode_deliver_batch,
    encode_deliver_run,
    encode_publish_batch,
    encode_publish_seq,
)
from zeps.protocol.codec import decode, encode
from zeps.protocol.commands import (
    LATEST,
    Attach,
    AttachOk,
    Command,
    Credit,
    Deliver,
    DeliverBatch,
    DeliverRun,
    DeliverTs,
    Detach,
    DetachOk,
    Fetch,
    FetchEnd,
    Invalid,
    InvalidCode,
    Ping,
    PingOk,
    Produce,
    ProduceOk,
    Publish,
    PublishBatch,
    PublishBatchSeq,
    PublishSeq,
    Refusal,
    Subscribe,
    SubscribeOk,
    SubscribeTime,
    Tail,
)
from zeps.protocol.connection import Connection

__all__ = [
    "LATEST",
    "Attach",
    "AttachOk",
    "Command",
    "Connection",
    "Credit",
    "Deliver",
    "DeliverBatch",
    "DeliverRun",
    "DeliverTs",
    "Detach",
    "DetachOk",
    "Fetch",
    "FetchEnd",
    "Invalid",
    "InvalidCode",
    "Ping",
    "PingOk",
    "Produce",
    "ProduceOk",
    "Publish",
    "PublishBatch",
    "PublishBatchSeq",
    "PublishSeq",
    "Refusal",
    "Subscribe",
    "SubscribeOk",
    "SubscribeTime",
    "Tail",
    "decode",
    "deliver_size",
    "encode",
    "encode_deliver",
    "encode_deliver_batch",
    "encode_deliver_run",
    "encode_publish_batch",
    "encode_publish_seq",
]
