"""ZEPS clients: blocking (:class:`StreamClient`) and asyncio (:class:`AsyncStreamClient`), same names."""

from zeps.client.aio import AsyncStreamClient
from zeps.client.multicast import AsyncMulticastSubscription, MulticastSubscription
from zeps.client.reconcile import MulticastStats
from zeps.client.session import Fetched, Message, Records, Seq, Since, Time
from zeps.client.sync import BrokerUnavailableError, StreamClient, discover

__all__ = [
    "AsyncMulticastSubscription", "AsyncStreamClient", "BrokerUnavailableError", "Fetched", "Message",
    "MulticastStats", "MulticastSubscription", "Records", "Seq", "Since", "StreamClient", "Time", "discover",
]  # fmt: skip
