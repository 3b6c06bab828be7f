"""The ZEPS protocol (seed 004), sans-I/O: the command codec and the per-connection state machine.

No sockets here: :func:`encode`/:func:`decode` turn commands into frames and back, and
:class:`Connection` says which command may travel which way in which state.
"""

from zeps.protocol.commands import (
    LATEST,
    Attach,
    AttachOk,
    Command,
    Credit,
    Deliver,
    DeliverBatch,
    DeliverTs,
    Detach,
    DetachOk,
    Invalid,
    Ping,
    PingOk,
    Publish,
    PublishBatch,
    Subscribe,
    SubscribeOk,
    SubscribeTime,
    decode,
    deliver_size,
    encode,
    encode_deliver,
    encode_deliver_batch,
    encode_publish_batch,
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
    "DeliverTs",
    "Detach",
    "DetachOk",
    "Invalid",
    "Ping",
    "PingOk",
    "Publish",
    "PublishBatch",
    "Subscribe",
    "SubscribeOk",
    "SubscribeTime",
    "decode",
    "deliver_size",
    "encode",
    "encode_deliver",
    "encode_deliver_batch",
    "encode_publish_batch",
]
