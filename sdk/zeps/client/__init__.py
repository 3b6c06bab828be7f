"""ZEPS clients: blocking (:class:`StreamClient`) and asyncio (:class:`AsyncStreamClient`), same names."""

from zeps.client._transport import BrokerUnavailableError
from zeps.client.aio import AsyncMulticastSubscription, AsyncStreamClient
from zeps.client.discovery import discover
from zeps.client.partitioned import GroupConsumer, PartitionedStreamClient, PartitionMessage, Position
from zeps.client.reconcile import MulticastStats
from zeps.client.session import Fetched, Message, Records, Seq, Since, Time
from zeps.client.sync import MulticastSubscription, StreamClient
from zeps.client.table import Table, read_table

__all__ = [
    "AsyncMulticastSubscription", "AsyncStreamClient", "BrokerUnavailableError", "Fetched", "GroupConsumer", "Message",
    "MulticastStats", "MulticastSubscription", "PartitionMessage", "PartitionedStreamClient", "Position", "Records",
    "Seq", "Since", "StreamClient", "Table", "Time", "discover", "read_table",
]  # fmt: skip
