"""The broker's settings (its flags, :mod:`zeps.broker.main`), and their defaults."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from zeps.journal import JournalConfig
from zeps.protocol.limits import DEFAULT_MAX_MESSAGE_BYTES, DELIVERY_BATCH_BYTES, MAX_CREDIT_BYTES, max_frame_bytes

__all__ = [
    "DEFAULT_MAX_BYTES_IN_FLIGHT",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_MAX_REGEX_SUBSCRIPTIONS",
    "DEFAULT_MAX_SESSIONS",
    "DEFAULT_MAX_SESSION_BYTES_IN_FLIGHT",
    "DEFAULT_MAX_TOTAL_SUBSCRIPTIONS",
    "BrokerConfig",
]


#: BrokerConfig's defaults for the broker's flags (a compiled dataclass's class attributes are not its
#: defaults, so the flags read them here)
DEFAULT_MAX_SESSIONS = 10_000
DEFAULT_MAX_TOTAL_SUBSCRIPTIONS = 100_000
DEFAULT_MAX_REGEX_SUBSCRIPTIONS = 1_000
DEFAULT_MAX_SESSION_BYTES_IN_FLIGHT = 16 << 20
DEFAULT_MAX_BYTES_IN_FLIGHT = 512 << 20
DEFAULT_MAX_CONNECTIONS = 4096


@dataclass(frozen=True)
class BrokerConfig:
    data_dir: Path
    streams: tuple[str, ...]  #: the streams this broker serves (from its manifest/config)
    journal: JournalConfig = field(default_factory=JournalConfig)
    heartbeat_s: float = 5.0  #: PING a peer silent this long
    ttl_s: float = 30.0  #: forget a peer silent this long (its state is freed)
    max_sessions: int = DEFAULT_MAX_SESSIONS
    max_subscriptions: int = 64  #: per session
    #: subscriptions and open fetches across all sessions at most (LIMIT past it): each costs memory,
    #: and each live record a lookup, whoever the peers are
    max_total_subscriptions: int = DEFAULT_MAX_TOTAL_SUBSCRIPTIONS
    #: of those, with a ``~regex`` pattern at most (LIMIT past it): each runs against every live
    #: record's key on the broker's one thread
    max_regex_subscriptions: int = DEFAULT_MAX_REGEX_SUBSCRIPTIONS
    #: deliveries handed to the socket and not yet gone from this process (written to the kernel) for
    #: one session at most: a peer that grants credit and reads nothing holds this much of the broker's
    #: memory, whatever its credit says (the adapter learns what left, see ``BrokerCore.released``)
    max_session_bytes_in_flight: int = DEFAULT_MAX_SESSION_BYTES_IN_FLIGHT
    #: the same for all sessions together (a session with nothing in flight may still be sent a frame of
    #: ``zeps.broker.routing.RESERVE_BYTES``)
    max_bytes_in_flight: int = DEFAULT_MAX_BYTES_IN_FLIGHT
    #: the broker's resident memory past which new sessions (BUSY) and subscriptions (LIMIT) are
    #: refused, whoever asks; what is attached goes on (0: no budget). The adapter reads the memory
    #: (``BrokerCore.resident_bytes``)
    max_memory_bytes: int = 0
    #: connections open at once at most, handshakes under way included: past it a new one is refused
    #: at its handshake, before it carries a frame (a replica known by its CURVE key is let in; 0: no
    #: budget). The adapter counts and refuses (``zeps.broker.admission``)
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    pump_budget_bytes: int = 4 * 1024 * 1024  #: delivered per pump() call, across all sessions
    replay_batch: int = 512  #: records read from the journal per subscription visit (older sessions)
    batch_bytes: int = DELIVERY_BATCH_BYTES  #: the largest DELIVER-BATCH (a record larger than this goes alone)
    #: subscription patterns accepted: "prefix" refuses ``~regex`` patterns with INVALID (ZepsStream ``matching``)
    matching: Literal["prefix", "prefix-and-regex"] = "prefix-and-regex"
    #: with a multicast output: a stream silent this long sends TAIL to the group (None: no multicast output)
    multicast_heartbeat_s: float | None = None
    #: the largest multicast message (a DELIVER-RUN frame); a record that does not fit goes only to the journal
    multicast_max_bytes: int = 1024 * 1024
    #: newly durable records wait this long for more to fill a multicast message (fewer, fuller messages)
    multicast_linger_s: float = 0.005
    #: a message body's limit (ZepsStream ``maxMessageBytes``): a larger one is refused with TOO_LARGE
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    #: a session's credit at most: CREDIT beyond it is clamped (what a peer can make the broker queue)
    max_credit_bytes: int = MAX_CREDIT_BYTES
    #: a replicated stream with fewer in-sync replicas than minInSync: "refuse" publishes at once
    #: (NOT_ENOUGH_REPLICAS), or "wait" until enough are back (publishers see a pause, then confirmations)
    under_replicated: Literal["refuse", "wait"] = "refuse"
    #: bytes a follower gets per REPLICA-DATA at most (its fetch may ask for less)
    replica_fetch_bytes: int = 4 * 1024 * 1024
    #: bytes a second a follower outside the in-sync set (catching up) is sent at most (None: no limit),
    #: so that rebuilding a replica does not take the leader's disk and network from its publishers
    replica_catchup_bytes_per_s: int | None = None
    #: a replicated stream's replica: what it confirms and delivers starts from its journal's commit
    #: checkpoint (:mod:`zeps.journal.checkpoint`), never its journal's end, and it follows (serves
    #: nobody's writes) until the election says it leads
    replicated: bool = False

    @property
    def max_frame_bytes(self) -> int:
        """The largest frame a peer may send (the adapter's ``ZMQ_MAXMSGSIZE``)."""
        return max_frame_bytes(self.max_message_bytes)
