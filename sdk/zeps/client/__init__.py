"""ZEPS clients: blocking (:class:`StreamClient`) and asyncio (:class:`AsyncStreamClient`), same names."""

from zeps.client.aio import AsyncStreamClient
from zeps.client.session import Message, Seq, Since, Time
from zeps.client.sync import BrokerUnavailableError, StreamClient, discover

__all__ = ["AsyncStreamClient", "BrokerUnavailableError", "Message", "Seq", "Since", "StreamClient", "Time", "discover"]
