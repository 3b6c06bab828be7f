"""ZEPS clients: blocking (:class:`StreamClient`) and asyncio (:class:`AsyncStreamClient`), same names."""

from zeps.client.aio import AsyncStreamClient
from zeps.client.session import Message, Records, Seq, Since, Time
from zeps.client.sync import BrokerUnavailableError, StreamClient, discover

__all__ = [
    "AsyncStreamClient", "BrokerUnavailableError", "Message", "Records", "Seq", "Since", "StreamClient", "Time",
    "discover",
]  # fmt: skip
