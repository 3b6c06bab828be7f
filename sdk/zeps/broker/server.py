"""The broker on the network: a ZeroMQ ROUTER socket around :class:`~zeps.broker.core.BrokerCore`.

* One command per frame; clients are DEALERs. ``ROUTER_MANDATORY`` is on and every send is
  non-blocking: a full peer queue (EAGAIN) is treated as no credit — the delivery is undone and
  replayed later — and an unroutable peer (EHOSTUNREACH) is forgotten. ZeroMQ never drops silently.
* Bytes in flight (:mod:`zeps.broker.routing`): each delivery frame is sent *tracked* (pyzmq's
  ``MessageTracker``: ZeroMQ tells when it is done with the frame: written to the connection, or
  freed with a connection that closed), and the core is told (``released``): only a peer that reads
  frees its share. (A tracked send costs about 2 µs more; a delivery is a batch of records.)
* Publishers are read in bounded batches per loop, so a flood cannot starve deliveries; when the
  broker is behind, ZeroMQ's receive high-water mark pushes back on publishers (they block).
* A connection budget (:mod:`zeps.broker.admission`): the ROUTER's open connections are counted from
  its monitor, and its ZAP handler (asked about every handshake, CURVE or NULL) refuses those past
  ``max_connections`` before they carry a frame.
* Optional CURVE: the broker's secret key from a certificate file, and who may connect
  (:class:`CurveConfig`): a ZAP handler (pyzmq's authenticator, with :class:`AllowedClients` as its
  credentials provider) admits only the listed client public keys. The list is read again when it
  changes (every second): a client taken off it is refused at its next connection, and its
  attached sessions are forgotten at once with INVALID-CODE ``UNAUTHORIZED`` (each session keeps the
  key its connection authenticated with, from the frame's ``User-Id``) — no restart.
* Optional registration in ZooKeeper: the broker joins ``streams/<name>/brokers/<member>`` with its
  endpoint and public key, and honours the manifest: a member that the manifest does not list
  refuses to serve (a rogue broker stops at once).
* Optional multicast output (:class:`~zeps.options.MulticastOptions`): an XPUB socket on a NORM or
  (E)PGM group gets each newly durable run once (never history) and TAIL on a silent stream, each
  message signed when the broker has a multicast key (:func:`zeps.protocol.multicast.sign`). With
  ``XPUB_NODROP`` a full pipe (the PGM rate limit, NORM's congestion control) is seen, not silent:
  messages wait in a bounded backlog and the oldest are dropped past it, counted in
  ``zeps_broker_multicast_dropped``; receivers fill such gaps from the journal.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import itertools
import json
import logging
import os
import queue
import socket
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
import zmq.auth
from prometheus_client import CollectorRegistry, start_http_server
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85
from zmq.utils.monitor import recv_monitor_message

from zeps import _netif
from zeps.broker.admission import ZAP_DOMAIN, ConnectionCount, Gatekeeper
from zeps.broker.compacting import CompactionTask
from zeps.broker.core import BrokerConfig, BrokerCore
from zeps.broker.metrics import BrokerMetrics, CompactionMetrics, ReplicationMetrics, TieringMetrics
from zeps.broker.replica import (
    Close,
    Connect,
    MarkData,
    RecordCommit,
    ReplicaNode,
    ReplicaSettings,
    Send,
    StepAside,
    WriteIsr,
)
from zeps.broker.state import Outgoing, Session
from zeps.broker.tiering import NOT_KNOWN, TIER_CACHE, Offer, Tiering, TierServe, TierTask
from zeps.errors import ConfigError
from zeps.journal import JournalError
from zeps.options import DEFAULT_PGM_RATE_KBPS, DEFAULT_PGM_RECOVERY_MS, MulticastOptions
from zeps.paths import StreamPaths
from zeps.protocol import multicast

__all__ = ["AllowedClients", "BrokerServer", "CurveConfig", "Registration", "Replication"]

log = logging.getLogger(__name__)

_NOBLOCK, _RCVMORE = int(zmq.NOBLOCK), int(zmq.RCVMORE)  # plain ints: pyzmq's enums cost a conversion each use
_READ_BATCH = 2000  # frames read per loop before the broker writes, routes and sends
# ... or this many bytes: what a loop holds in memory before its journal write. Small, because a turn
# is also how long a replicated leader's followers wait for their next REPLICA-DATA (their fetches are
# answered between turns) and how long subscribers wait for routing: at 16 MiB a leader under a
# publish_many flood read the publisher's whole unconfirmed window in one turn and then idled while
# its followers caught up (make bench-replication's throughput: replicated/single 0.59-0.64 at 16 MiB,
# 0.73-0.75 at 64 and 256 KiB, a lone broker's rate the same)
_READ_BYTES = 256 << 10
_RCVHWM = 1000  # frames waiting from one peer in ZeroMQ's receive queue (each at most max_frame_bytes)
#: peers whose oldest delivery frames are looked at per loop at most (in turn): the look costs the
#: broker's one thread, and a peer that never reads keeps its frames outstanding for ever
_MARKS_PER_TURN = 512
_MULTICAST_BACKLOG = 16 << 20  # bytes of multicast messages waiting for the group's pipe, at most
# libzmq 4.3.4's NORM engine writes a message into the NORM stream in 2 KiB pieces, and its receivers
# lose every message that spans more than one (checked here: a 2,030-byte frame arrives, 2,040 never):
# NORM runs are cut to this size, and a larger record reaches receivers through the journal only
_NORM_MESSAGE_BYTES = 2000
#: a replica's peering with its leader: CURVE handshakes the leader did not complete (it serves another key)
_HANDSHAKE_FAILED = zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL


@dataclass(frozen=True)
class CurveConfig:
    secret_key_file: Path  #: a zmq certificate file with the broker's secret key
    #: who may connect: a directory of zmq public certificates, or a JSON file ``{"name": "public key"}``
    #: (what the operator mounts), read again when it changes; None: any client (encryption only)
    clients: Path | None = None
    #: a replicated stream's replicas, a JSON file ``{"replica": "public key"}`` read again when it
    #: changes: admitted as clients are, a replica's fetches taken from its own key only; beside it,
    #: each replica's certificate ``replica.<member>.key_secret`` (a follower peers with its own)
    replicas: Path | None = None

    def replica_certificate(self, member: str) -> Path | None:
        """This broker's own certificate as replica ``member`` (None without replicas)."""
        return None if self.replicas is None else self.replicas.with_name(f"replica.{member}.key_secret")


class AllowedClients:
    """The client public keys a CURVE broker admits, from :attr:`CurveConfig.clients`: the ZAP
    handler's credentials provider (``callback``, on the authenticator's thread) and the broker loop's
    list for revocations (``reload``). The set is replaced whole, never changed in place."""

    def __init__(self, source: Path) -> None:
        self.source = source
        self.keys: frozenset[str] = frozenset()
        self.named: dict[str, str] = {}  #: name -> (first) public key (a JSON list's; empty for a directory)
        self._seen: object = None

    def callback(self, domain: str, key: bytes) -> bool:
        return key.decode("ascii", "replace") in self.keys

    def reload(self) -> bool:
        """Read the list again; True if it changed. A list that cannot be read keeps the last one
        (logged): a half-written update must not open the broker, nor lock everyone out."""
        try:
            if self.source.is_dir():
                stamp: object = sorted((p.name, p.stat().st_mtime_ns) for p in self.source.iterdir())
                if stamp == self._seen:
                    return False
                keys = {str(public) for public in _public_keys(self.source)}
            else:
                raw = self.source.read_bytes()
                stamp = raw
                if stamp == self._seen:
                    return False
                listed = json.loads(raw)
                if not isinstance(listed, dict) or not all(_keys_of(k) for k in listed.values()):
                    raise ValueError('not a JSON object {"name": "public key" or ["public key", ...]}')
                keys = {key for value in listed.values() for key in _keys_of(value)}
                self.named = {str(name): _keys_of(value)[0] for name, value in listed.items()}
        except (OSError, ValueError) as exc:
            log.error("CURVE clients %s could not be read (%s): keeping the %d keys admitted so far",
                      self.source, exc, len(self.keys))  # fmt: skip
            return False
        self._seen = stamp
        changed = frozenset(keys) != self.keys
        self.keys = frozenset(keys)
        return changed


def _keys_of(value: object) -> list[str]:
    """A listed name's keys: one, or during a rotation of its key the old and the new (both admitted);
    empty if the value is neither a key nor a list of keys."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and value and all(isinstance(k, str) for k in value):
        return list(value)
    return []


def _public_keys(directory: Path) -> list[str]:
    """The public keys of the zmq certificates (``*.key``, ``*.key_secret``) in ``directory``."""
    keys = []
    for path in sorted(directory.iterdir()):
        if path.suffix in (".key", ".key_secret"):
            public, _ = zmq.auth.load_certificate(str(path))
            keys.append(public.decode())
    return keys


@dataclass(frozen=True)
class Registration:
    """Where the broker registers itself (a group with a manifest)."""

    zookeeper: str
    namespace: str
    member: str
    chroot: str = "/zeps"
    advertise: str | None = None  #: the endpoint clients should use (default: the bound one)
    #: how long to wait for another session to let go of this member id (after a restart, a rejoin)
    takeover_timeout: float = 60.0
    #: the namespace's ZooKeeper digest identity (user, password): the broker's session authenticates
    #: with it and its member node gets its ACL, so no other ZooKeeper user can forge or change it
    auth: tuple[str, str] | None = None
    #: the PEM of the CA of the servers' TLS certificates: the session speaks TLS ("": plain TCP)
    ca: str = ""
    #: which partition of its stream this broker serves (0: a stream of one partition, or the first);
    #: it registers in that partition's group and elects its leader among that partition's replicas
    partition: int = 0

    def paths(self, stream: str) -> StreamPaths:
        """The ZooKeeper paths of ``stream``'s partition this broker serves."""
        return StreamPaths.of(self.namespace, stream, chroot=self.chroot, partition=self.partition)


@dataclass(frozen=True)
class Replication:
    """A replicated stream (the broker serves one, and registers in ZooKeeper as one of its replicas,
    named by its member id): see :mod:`zeps.broker.replica`, :mod:`zeps.replication` and
    :mod:`zeps.coordination.replication`."""

    min_insync: int  #: replicas (the leader included) that must hold a record durably before it is confirmed
    lag_s: float = 10.0  #: a follower that has not caught up for this long leaves the in-sync set
    heartbeat_s: float = 0.5  #: a follower hears from the leader at least this often
    leader_silence_s: float = 3.0  #: a follower that heard nothing this long connects again
    session_timeout_s: float = 4.0  #: the broker's ZooKeeper session: how soon a dead leader is replaced
    #: the replica that should lead while it is in sync (the others give way to it); None: any
    preferred_leader: str | None = None

    def settings(self) -> ReplicaSettings:
        return ReplicaSettings(self.min_insync, lag_s=self.lag_s, heartbeat_s=self.heartbeat_s,
                               leader_silence_s=self.leader_silence_s)  # fmt: skip


_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def resident_bytes() -> int:
    """This process's resident memory (``/proc/self/statm``; 0 where there is none to read)."""
    try:
        return int(Path("/proc/self/statm").read_text().split()[1]) * _PAGE_BYTES
    except (OSError, IndexError, ValueError):
        return 0


class _InFlight:
    """Which deliveries left this process (see the module's notes): per peer, its delivery frames
    ZeroMQ may still hold (tracker, size, the session it was sent to), oldest first."""

    def __init__(self) -> None:
        self.marks: dict[bytes, deque[tuple[zmq.MessageTracker, int, Session]]] = {}
        self.looked = 0.0  #: when :meth:`release` last looked

    def send(self, sock: zmq.Socket[Any], item: Outgoing) -> None:
        """Send ``item`` (a delivery, or a follower's REPLICA-DATA), tracked (raises zmq.Again as a
        send does)."""
        tracker = sock.send_multipart([item.peer, item.frame], _NOBLOCK, copy=False, track=True)
        assert tracker is not None and item.session is not None  # a tracked send without copy; what it counts for
        self.marks.setdefault(item.peer, deque()).append((tracker, item.cost, item.session))

    def release(self, core: BrokerCore) -> None:
        """Tell ``core`` which deliveries left, for at most ``_MARKS_PER_TURN`` peers (in turn): a
        peer's frames go out in order, so its first one not done ends the look."""
        self.looked = time.monotonic()
        marks = self.marks
        for peer in list(itertools.islice(marks, _MARKS_PER_TURN)):
            pending = marks.pop(peer)
            while pending and pending[0][0].done:
                _, size, session = pending.popleft()
                core.released(session, size)
            if pending:
                marks[peer] = pending  # at the end: the others' turn first


def _check_options(config: BrokerConfig, registration: Registration | None, replication: Replication | None,
                   tiering: Tiering | None) -> None:  # fmt: skip
    """ConfigError for options that need others: replication and tiering need ZooKeeper."""
    if replication is not None and (registration is None or len(config.streams) != 1):
        raise ConfigError("a replicated broker serves one stream and registers in ZooKeeper (--zookeeper, "
                          "--member): its replicas find each other, and elect their leader, there")  # fmt: skip
    if tiering is not None and registration is None:
        raise ConfigError("a tiered broker (--tier-store) registers in ZooKeeper (--zookeeper, --member): the "
                          "store's manifest is kept there")  # fmt: skip


class BrokerServer:
    """Runs the broker loop on a thread. ``start()`` binds and registers; ``stop()`` undoes both."""

    _tier_tasks: dict[str, TierTask]  #: a tiered broker's: each stream's uploads on a thread of their own
    _tier_serves: dict[str, TierServe]  #: and each stream's reads of the store for subscriptions behind
    _tier_answers: queue.SimpleQueue[Any]  #: those reads' answers, for the loop
    _compactions: dict[str, CompactionTask] | None = None  #: each compacted stream's compaction thread
    _compaction_metrics: CompactionMetrics | None = None

    def __init__(
        self,
        config: BrokerConfig,
        *,
        bind: str = "tcp://127.0.0.1:*",
        curve: CurveConfig | None = None,
        metrics_port: int | None = None,
        metrics_address: str = "127.0.0.1",
        registration: Registration | None = None,
        multicast: MulticastOptions | None = None,
        multicast_key: bytes | None = None,
        replication: Replication | None = None,
        tiering: Tiering | None = None,
    ) -> None:
        _check_options(config, registration, replication, tiering)
        if replication is not None:  # its core starts from its commit checkpoint, following
            config = dataclasses.replace(config, replicated=True)
        if multicast is not None:  # the core sends TAIL on a silent stream every heartbeat, runs cut to size
            largest = _NORM_MESSAGE_BYTES if multicast.transport == "norm" else config.batch_bytes
            config = dataclasses.replace(config, multicast_heartbeat_s=multicast.heartbeat_ms / 1000,
                                         multicast_max_bytes=largest)  # fmt: skip
        self.config, self.bind, self.curve = config, bind, curve
        self.metrics_port = metrics_port
        self.metrics_address = metrics_address  #: where metrics are served (a pod: 0.0.0.0, its port's interfaces)
        self.registration = registration
        self.multicast = multicast
        self.multicast_key = multicast_key  #: each multicast message is signed with it (zeps.protocol.multicast)
        self.multicast_endpoint = ""  #: the ZeroMQ endpoint of the multicast output, once started
        self._pub: zmq.Socket[Any] | None = None
        self._multicast_ctx: zmq.Context[Any] | None = None
        self._backlog: deque[list[bytes]] = deque()  # multicast messages the group's pipe could not take yet
        self._backlog_bytes = 0
        self.core = BrokerCore(config)
        self.endpoint, self.public_key = "", ""  #: where it serves, and its CURVE key, once started
        #: its CURVE key, and after a rotation the ones it served before (at most 2 more)
        self.served_keys: list[str] = []
        #: the key a rotation under way brings (``broker.next.key`` beside its certificate), if any
        self.next_key: str | None = None
        # the certificate file's text as last read; which of server_keys the peering with a leader uses
        # (the next after a handshake the leader did not complete)
        self._certificate, self._link_key = b"", 0
        self._stop = threading.Event()
        self._loop_thread: threading.Thread | None = None
        self._ctx: zmq.Context[Any] | None = None
        self._auth: ThreadAuthenticator | None = None  # the ZAP handler: a Gatekeeper (zeps.broker.admission)
        #: the connections open now, against the budget (the ROUTER's monitor counts them)
        self.connections = ConnectionCount(config.max_connections)
        #: the client keys a CURVE broker admits (None: no CURVE, or any client)
        self.allowed: AllowedClients | None = None
        #: a CURVE replica set's replicas and their keys, and this replica's own certificate (public, secret)
        self.replicas_allowed: AllowedClients | None = None
        self.replica_certificate: tuple[bytes, bytes | None] | None = None
        #: why a stopping replica waits before it goes (its stop would leave fewer than minInSync in sync)
        self.shutdown_held: str | None = None
        self._zk: Any = None
        self._metrics: Any = None  # the metrics HTTP server, when serving metrics
        self.registry = CollectorRegistry()
        self.metrics = BrokerMetrics(self.registry)
        self._memberships: dict[str, Any] = {}  # stream name -> this broker's membership in its group
        # which deliveries left this process; when the live facts were last written
        self._in_flight, self._last_facts = _InFlight(), 0.0
        self._facts_writing = threading.Event()  # a write of the facts is under way (not in the loop)
        self.replication = replication  # and its gauges, below
        self.tiering, self._tiering_metrics = tiering, None if tiering is None else TieringMetrics(self.registry)
        self._tier_tasks, self._tier_serves, self._tier_answers = {}, {}, queue.SimpleQueue()
        self._replication_metrics = None if replication is None else ReplicationMetrics(self.registry)
        self._election: Any = None  # this replica's part in the election (zeps.coordination.replication)
        #: this replica's state machine (a replicated broker's), and the peering with its leader's socket
        self.node = (
            None if replication is None else ReplicaNode(self.core, config.streams[0], "", replication.settings())
        )
        self._link: zmq.Socket[Any] | None = None
        self._link_monitor: zmq.Socket[Any] | None = None  # the peering's handshake failures (CURVE)
        self._events = queue.SimpleQueue[Any]()  # the election's news and endpoint lookups, for the loop
        self._poller: zmq.Poller | None = None
        self.refused: str | None = None  #: why the broker stopped serving (not in the manifest…)
        #: why the broker's loop failed (a disk error, a bug): it stopped serving; zeps-broker exits 1
        self.failure: str | None = None

    def facts(self, stream: str) -> dict[str, Any]:
        """What this broker last published about ``stream`` in its group member node (endpoint,
        ``lastSequence``, journal size, subscriptions…); empty when it is not registered."""
        membership = self._memberships.get(stream)
        return membership.metadata if membership is not None else {}

    # -- lifecycle ------------------------------------------------------------------------------
    def start(self) -> BrokerServer:
        """Bind, register and serve; if any step fails (a port taken, not in the manifest, ZooKeeper
        unreachable), what the earlier steps opened is closed again before the error propagates."""
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        log.info("broker serving %s at %s", ", ".join(self.config.streams), self.endpoint)
        if self.config.max_memory_bytes:
            log.info("memory budget %d MiB: past it, new peerings and subscriptions are refused",
                     self.config.max_memory_bytes >> 20)  # fmt: skip
        if self.connections.budget:
            log.info("connection budget %d: past it, new connections are refused at their handshake",
                     self.connections.budget)  # fmt: skip
        return self

    def _start(self) -> None:
        self.core.open()
        ctx: zmq.Context[Any] = zmq.Context()
        self._ctx = ctx
        sock = ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, 10_000)  # deliveries are bounded by each session's credit besides
        sock.setsockopt(zmq.RCVHWM, _RCVHWM)
        # a larger frame drops its peer's connection before it is read into memory (a 256 MiB PUBLISH
        # from a raw peer took the broker from 56 to 825 MB); clients never send one (zeps.protocol.limits)
        sock.setsockopt(zmq.MAXMSGSIZE, self.config.max_frame_bytes)
        if self.connections.budget or self.curve is not None:  # a ZAP handler: the connection budget, CURVE keys
            self._auth = Gatekeeper(ctx, self.connections, exempt=self._replica_key,
                                    refused=self.metrics.connections_refused.inc)  # fmt: skip
            self._auth.start()
            sock.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN.encode())  # ZeroMQ asks it about NULL handshakes too
            self.connections.watch(sock)
        if self.curve is not None:
            self._setup_curve(sock)
        sock.bind(self.bind)
        self.endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._sock = sock
        if self.multicast is not None:  # a context of its own: libzmq runs NORM and PGM in its I/O thread, which
            self._multicast_ctx = zmq.Context()  # NORM can keep busy; the ROUTER's I/O must not wait behind it
            self._pub = self._open_multicast(self._multicast_ctx, self.multicast)
        if self.metrics_port is not None:
            self._metrics, _ = start_http_server(self.metrics_port, addr=self.metrics_address, registry=self.registry)
        if self.registration is not None:
            self._register(self.registration)
            if self.tiering is not None:
                self._start_tiering(self.registration, self.tiering)
        self._loop_thread = threading.Thread(target=self._loop, name="zeps-broker", daemon=True)
        self._last_facts = time.monotonic() - 9  # first facts a second after start
        self._loop_thread.start()

    def _open_multicast(self, ctx: zmq.Context[Any], options: MulticastOptions) -> zmq.Socket[Any]:
        """The multicast output's XPUB socket (ConfigError naming the fix when this libzmq lacks the
        transport, or the interface is unknown)."""
        _netif.require_transport(options.transport, zmq.has, zmq.zmq_version())
        interface = _netif.resolve(options.interface, options.group)
        pub: zmq.Socket[Any] = ctx.socket(zmq.XPUB)
        pub.setsockopt(zmq.XPUB_NODROP, 1)  # a full pipe raises EAGAIN instead of dropping silently
        pub.setsockopt(zmq.SNDHWM, 1000)
        pub.setsockopt(zmq.LINGER, 0)
        if options.transport != "norm":  # OpenPGM's rate limit and repair window (libzmq's NORM takes neither)
            pub.setsockopt(zmq.RATE, options.rate_kbps or DEFAULT_PGM_RATE_KBPS)
            pub.setsockopt(zmq.RECOVERY_IVL, options.recovery_ms or DEFAULT_PGM_RECOVERY_MS)
        self.multicast_endpoint = _netif.endpoint(options.transport, options.group, options.port, interface)
        try:
            pub.connect(self.multicast_endpoint)
        except zmq.ZMQError as exc:
            pub.close(linger=0)
            raise ConfigError(f"multicast output {self.multicast_endpoint}: {exc}") from None
        log.info("multicast output on %s (interface %s)", self.multicast_endpoint, interface)
        return pub

    def _send_multicast(self, messages: list[list[bytes]]) -> None:
        """Send what the core queued for the group, oldest first; what the pipe cannot take waits in
        a bounded backlog (its oldest messages are dropped past it: receivers repair from the journal)."""
        assert self._pub is not None
        key = self.multicast_key
        for message in messages:
            self._backlog.append(message if key is None else multicast.sign(message, key))
            self._backlog_bytes += len(message[1])
        while self._backlog:
            try:
                self._pub.send_multipart(self._backlog[0], zmq.NOBLOCK)
            except zmq.Again:
                break
            self._backlog_bytes -= len(self._backlog.popleft()[1])
        while self._backlog_bytes > _MULTICAST_BACKLOG:
            self._backlog_bytes -= len(self._backlog.popleft()[1])
            self.metrics.multicast_dropped.inc()

    def _load_certificate(self) -> tuple[bytes, bytes, bytes]:
        """The broker's certificate file: (its text, public key, secret key)."""
        assert self.curve is not None
        path = self.curve.secret_key_file
        text = path.read_bytes()
        public, secret = zmq.auth.load_certificate(str(path))
        if secret is None:
            raise ConfigError(f"{path} holds no secret key; use the .key_secret certificate")
        return text, public, secret

    def _setup_curve(self, sock: zmq.Socket[Any]) -> None:
        assert self.curve is not None and self._auth is not None
        self._certificate, public, secret = self._load_certificate()
        if self.curve.replicas is not None:  # a replica set: each replica's key, and this one's own certificate
            self.replicas_allowed = AllowedClients(self.curve.replicas)
            self.replicas_allowed.reload()
            self.core.replica_keys = dict(self.replicas_allowed.named)
            mine = self.curve.replica_certificate(self.registration.member if self.registration else "")
            if mine is None or not mine.exists():
                raise ConfigError(f"{mine}: this replica's CURVE certificate is missing (mounted from the stream's "
                                  "Secret beside --curve-replicas)")  # fmt: skip
            self.replica_certificate = zmq.auth.load_certificate(str(mine))
        if self.curve.clients is not None:
            self.allowed = AllowedClients(self.curve.clients)
            self.allowed.reload()
            self.core.authorized = self._admitted()
        else:
            log.warning("CURVE encrypts, but admits any client key: give the clients allowed (--curve-clients)")
        if self.allowed is not None or self.replicas_allowed is not None:  # keys checked: each peer's is known
            self._auth.configure_curve_callback(domain=ZAP_DOMAIN, credentials_provider=self)
        else:
            self._auth.configure_curve(domain=ZAP_DOMAIN, location=zmq.auth.CURVE_ALLOW_ANY)
        sock.setsockopt(zmq.CURVE_SERVER, 1)
        sock.setsockopt(zmq.CURVE_SECRETKEY, secret)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, public)
        self.public_key = public.decode()
        self.served_keys = [self.public_key]
        self._read_next_key()

    def _admitted(self) -> frozenset[str]:
        """The keys admitted: the clients', and a replica set's replicas'."""
        clients = self.allowed.keys if self.allowed is not None else frozenset()
        replicas = self.replicas_allowed.keys if self.replicas_allowed is not None else frozenset()
        return clients | replicas

    def _replica_key(self, key: bytes) -> bool:
        """The ZAP handler's question (its thread) past the connection budget: is this CURVE public key
        (32 bytes) one of the stream's replicas'?"""
        replicas = self.replicas_allowed
        return replicas is not None and len(key) == 32 and z85.encode(key).decode("ascii") in replicas.keys

    def callback(self, domain: str, key: bytes) -> bool:
        """The ZAP handler's question (its thread): is this key admitted (any client's, without a list of
        clients)? The sets are replaced whole, never changed in place."""
        text = key.decode("ascii", "replace")
        return (self.allowed is None or text in self.allowed.keys) or (
            self.replicas_allowed is not None and text in self.replicas_allowed.keys
        )

    def _reload_keys(self) -> None:
        """The loop's second: the lists read again if they changed; revocations apply at once; a new
        key pair of the broker's own is served from now on (:meth:`_rekey`)."""
        if self.curve is not None:
            self._reload_certificate()
        clients = self.allowed is not None and self.allowed.reload()
        replicas = self.replicas_allowed is not None and self.replicas_allowed.reload()
        if replicas and self.replicas_allowed is not None:
            self.core.replica_keys = dict(self.replicas_allowed.named)
        if (clients or replicas) and self.allowed is not None:
            self.core.authorize(self._admitted())

    @property
    def server_keys(self) -> list[str]:
        """The stream's server keys this replica's peering with its leader tries, in turn: the one it
        serves, the one a rotation brings, the ones it served before (a leader whose certificate
        changed before or after its own: the replicas' Secret volumes are not updated at once)."""
        keys = [*self.served_keys[:1], *([self.next_key] if self.next_key else []), *self.served_keys[1:]]
        return list(dict.fromkeys(keys))

    def _read_next_key(self) -> None:
        """The key a rotation brings: ``broker.next.key`` beside the replicas' list (where the operator
        mounts it) or beside the certificate."""
        assert self.curve is not None
        places = [*([self.curve.replicas] if self.curve.replicas else []), self.curve.secret_key_file]
        self.next_key = None  # no rotation under way (or its file being replaced: read the next second)
        for place in places:
            try:
                self.next_key = zmq.auth.load_certificate(str(place.with_name("broker.next.key")))[0].decode()
                return
            except (OSError, ValueError):
                continue

    def _reload_certificate(self) -> None:
        """The broker's certificate read again: a new key pair (a rotation: the operator changed the
        Secret) is served from now on. One that cannot be read keeps the key served (logged)."""
        assert self.curve is not None
        self._read_next_key()
        try:
            if self.curve.secret_key_file.read_bytes() == self._certificate:
                return
            self._certificate, public, secret = self._load_certificate()
        except (OSError, ValueError, ConfigError) as exc:  # said once for each content it has
            with contextlib.suppress(OSError):
                self._certificate = self.curve.secret_key_file.read_bytes()
            log.error("CURVE certificate %s could not be read (%s): serving key %s still", self.curve.secret_key_file,
                      exc, self.public_key)  # fmt: skip
            return
        if public.decode() != self.public_key:
            self._rekey(public, secret)

    def _rekey(self, public: bytes, secret: bytes) -> None:
        """Serve a new key pair: the endpoint is bound again with it. Connections made with the old key
        close with the old listener; clients that trust the new key attach again at once (each
        rotation phase hands them both: :mod:`zeps.client._transport`), and what they had not had
        confirmed is resent. The old key stays in :attr:`server_keys`, for this broker's own peering
        with a leader that has not changed keys yet."""
        sock, endpoint = self._sock, self.endpoint
        sock.unbind(endpoint)
        sock.setsockopt(zmq.CURVE_SECRETKEY, secret)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, public)
        for attempt in range(100):  # the unbind completes on ZeroMQ's I/O thread: a bind may find the port taken
            try:
                sock.bind(endpoint)
                break
            except zmq.ZMQError as exc:
                if exc.errno != errno.EADDRINUSE or attempt == 99:
                    raise
                time.sleep(0.01)  # bounded: 1 s at most, then the loop fails (its supervisor restarts it)
        old, self.public_key = self.public_key, public.decode()
        self.served_keys = [self.public_key, *(k for k in self.served_keys if k != self.public_key)][:3]
        self._link_key = 0  # its next peering tries the new key first
        log.warning("CURVE key changed: serving %s (was %s) at %s; clients attach again with it", self.public_key,
                    old, endpoint)  # fmt: skip

    def _register(self, reg: Registration) -> None:
        from zeps.coordination import Group, connect  # noqa: PLC0415 — ZooKeeper only when registering

        timeout = self.replication.session_timeout_s if self.replication is not None else 10.0
        self._zk = connect(reg.zookeeper, auth=reg.auth, ca=reg.ca, session_timeout=timeout)
        metadata = {
            "endpoint": reg.advertise or self.endpoint,
            "curvePublicKey": self.public_key,
            "pod": os.environ.get("POD_NAME", socket.gethostname()),
            "startedAt": int(time.time()),
            "streams": list(self.config.streams),
            "partition": reg.partition,
        }
        if self.multicast is not None:  # what a receiver needs: the group, and the settings both ends share
            metadata["multicast"] = self.multicast.model_dump(exclude={"interface"})
        for name in self.config.streams:
            group = Group(self._zk, reg.paths(name).brokers)
            manifest = group.manifest()
            self.core.replica_members = manifest  # who may fetch as a replica (a replicated stream's)
            if manifest is not None and reg.member not in manifest:
                self.refused = (
                    f"broker member {reg.member!r} is not in the manifest of stream {name!r} "
                    f"({', '.join(sorted(manifest)) or 'empty'}): refusing to serve"
                )
                raise ConfigError(self.refused)
            self._memberships[name] = group.join(reg.member, metadata, takeover_timeout=reg.takeover_timeout,
                                                 on_failure=self._membership_failed)  # fmt: skip

            def on_status(status: Any, name: str = name) -> None:
                self.core.replica_members = status.manifest  # one store: the loop reads it whole
                if status.manifest is not None and reg.member not in status.manifest:
                    self.refused = f"broker member {reg.member!r} was removed from the manifest of {name!r}"
                    log.error("%s: stopping", self.refused)
                    self._stop.set()

            group.watch(on_status=on_status)
        if self.replication is not None:
            from zeps.coordination.replication import ReplicaElection, unmark_stopping  # noqa: PLC0415

            paths = reg.paths(self.config.streams[0])
            try:  # running again: no longer one that stopped on purpose
                unmark_stopping(self._zk, paths, reg.member)
            except Exception as exc:  # best effort: the others then hold for this one less (as before marks)
                log.warning("could not clear %s's stopping mark in ZooKeeper: %r", reg.member, exc)
            journal = self.core.streams[self.config.streams[0]].journal
            empty = lambda: journal.written == 0 and journal.epochs.latest == 0  # noqa: E731 — a new or wiped volume
            assert self.node is not None
            self.node.me = reg.member
            self._election = ReplicaElection(self._zk, paths, reg.member, self._events.put, empty=empty,
                                             on_connection=self.node.connection,
                                             preferred=self.replication.preferred_leader,
                                             caught_up=self.node.caught_up).start()  # fmt: skip

    def _start_tiering(self, reg: Registration, tiering: Tiering) -> None:
        """A TierTask per stream, on the broker's ZooKeeper session; the store's credentials from the
        environment (AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY: the Secret the pod's env names)."""
        from zeps.batchstore import open_store  # noqa: PLC0415 — the store's client only when tiering
        from zeps.coordination.client import digest_acl  # noqa: PLC0415
        from zeps.tiering import TierReader  # noqa: PLC0415

        store = open_store(tiering.store_url, endpoint=tiering.endpoint, region=tiering.region,
                           path_style=tiering.path_style)  # fmt: skip
        acl = digest_acl(*reg.auth) if reg.auth else None
        for name in self.config.streams:
            self.core.tiered_to[name] = NOT_KNOWN  # nothing is deleted locally before the manifest is read
            self._tier_tasks[name] = TierTask(name, self._zk, reg.paths(name), store, tiering, acl=acl).start()
            reader = TierReader(self._zk, reg.paths(name), store, cache=self.config.data_dir / TIER_CACHE / name)
            answer = lambda read, chunk, failed: self._tier_answers.put((read, chunk, failed))  # noqa: E731
            self._tier_serves[name] = TierServe(name, reader, answer).start()
            self.core.tier_reads.add(name)
        log.info("tiering %s into %s (local retention: the journal's; total: %s ms, %s bytes)",
                 ", ".join(self.config.streams), tiering.store_url, tiering.retention_ms,
                 tiering.retention_bytes)  # fmt: skip

    def _tier_turn(self) -> None:
        """Reads of the object store the core asked for, to their threads; their answers, to the core."""
        if not self._tier_serves:
            return
        core = self.core
        for read in core.tier_wanted:
            self._tier_serves[read.sub.session.stream.name].ask(read)
        core.tier_wanted.clear()
        while True:
            try:
                read, chunk, failed = self._tier_answers.get_nowait()
            except queue.Empty:
                return
            core.tier_answered(read, chunk, failed=failed)

    def _tick_tasks(self) -> None:
        """A tick's turn of the threads beside the loop: tiering's and compaction's."""
        if self._compactions is None:  # the first tick: a thread per compacted stream
            self._compactions = {name: CompactionTask(name, self.config.journal).start()
                                 for name in self.config.streams if self.config.journal.compacts}  # fmt: skip
            self._compaction_metrics = CompactionMetrics(self.registry) if self._compactions else None
        self._offer_tiering(self._compactions)
        for name, task in self._compactions.items():
            journal = self.core.streams[name].journal
            # a replica compacts only what can never be cut: what its commit checkpoint covers
            upto = journal.checkpoint.sequence if self.config.replicated else None
            task.turn(journal, self.core.wall_ms(), upto=upto)
            if self._compaction_metrics is not None:
                self._compaction_metrics.update(name, task)

    def _offer_tiering(self, compactions: dict[str, CompactionTask]) -> None:
        """Each tiered stream's news to its TierTask, and how far local retention may delete back to the
        core (a tick's): what the store holds, and of a compacted stream what a compaction pass saw
        (so the store gets each segment as compaction left it)."""
        assert self.tiering is not None or not self._tier_tasks
        for name, task in self._tier_tasks.items():
            stream = self.core.streams[name]
            leader = stream.leader
            leading = self.node is None or leader is not None  # this broker uploads (and closes idle segments)
            if leading and self.tiering is not None:  # idle by the records' time, or by the loop's clock
                quiet = task.quiet(stream.journal.written, time.monotonic())
                stream.journal.close_idle_segment(now_ms=self.core.wall_ms(),
                                                  idle_ms=0 if quiet else self.tiering.segment_idle_ms)  # fmt: skip
            segments = tuple(stream.journal.closed_segments())
            offer = Offer(leading=leading, epoch=leader.epoch if leader else 0, segments=segments,
                          commit=stream.committed, local_bytes=stream.journal.size_bytes,
                          compacts=self.config.journal.compacts)  # fmt: skip
            task.offer(offer)
            tiered, bound = task.tiered_to, task.retention_bound(offer)
            compaction = compactions.get(name)
            self.core.tiered_to[name] = bound if compaction is None else min(bound, compaction.covered_to)
            # this tick's backlog (the task's gauge is its last round's): what the limit is held to
            waiting = sum(s.size for s in segments if s.last > tiered) if tiered != NOT_KNOWN else 0
            was, stream.tier_behind = stream.tier_behind, self._tier_behind(task, waiting, leading=leading)
            if bool(was) != bool(stream.tier_behind):
                log.log(logging.ERROR if stream.tier_behind else logging.INFO, "tiering %s: %s", name,
                        stream.tier_behind or "the store caught up: publishes are taken again")  # fmt: skip

    def _tier_behind(self, task: TierTask, waiting: int, *, leading: bool) -> str:
        """Why a leader refuses publishes: ``waiting`` bytes for the store, past --tier-max-backlog-bytes
        ("": it does not refuse)."""
        limit = self.tiering.max_backlog_bytes if self.tiering is not None else None
        if not leading or limit is None or waiting <= limit:
            return ""
        return (f"{waiting} bytes of its journal wait for the object store, more than its limit of "
                f"{limit} (the store: {task.error[:200] or 'slower than the publishers'})")  # fmt: skip

    def _membership_failed(self, exc: BaseException) -> None:
        """A rejoin after a ZooKeeper session expiry failed: serving unregistered would hide the broker
        from its clients and the operator (and another broker may hold the id): stop, as a failure."""
        self.failure = f"could not register in ZooKeeper again after its session expired: {exc}"
        log.error("%s: stopping", self.failure)
        self._stop.set()

    def hand_over(self, timeout: float) -> None:
        """Before :meth:`stop` (SIGTERM): a replica leaves its stream's election line, and a leader
        hands the lead to an in-sync follower at once instead of a failover after its session ends:
        it stops confirming, the next in line takes the next epoch, and its clients are told
        NOT_LEADER then (they find the new leader and resend what was not confirmed). Waits at most
        ``timeout`` seconds; a broker that is no replica, or whose loop ended, has nothing to do."""
        node, election = self.node, self._election
        if node is None or election is None or self._loop_thread is None or not self._loop_thread.is_alive():
            return
        began = time.monotonic()
        self._mark_stopping()
        self._hold_while_needed(timeout)
        node.resign()
        while not node.peered_off and time.monotonic() - began < min(timeout, 1.0) and self._loop_thread.is_alive():
            time.sleep(0.005)  # a follower fetches no more before it leaves the in-sync set
        election.resign(self.replication.min_insync if self.replication is not None else 0)
        checked, alone = time.monotonic(), False
        while not node.handed_over and time.monotonic() - began < timeout and self._loop_thread.is_alive():
            time.sleep(0.005)
            if time.monotonic() - checked >= 0.5 and self.registration is not None:
                checked = time.monotonic()  # every other replica stopping too: no one will take the lead
                alone = self._no_one_to_wait_for(self.registration.paths(self.config.streams[0]), frozenset())
                if alone:
                    break
        if node.handed_over and node.resigned_epoch:
            time.sleep(0.1)  # the loop's next turns send the NOT_LEADERs
        if node.handed_over and node.resigned_epoch:
            what = f"the lead of epoch {node.resigned_epoch} handed over"
        elif node.handed_over:
            what = "out of the election line"
        elif alone:
            what = "no hand-over: every other replica is stopping too, no one will take the lead"
        elif not self._loop_thread.is_alive():
            what = "no hand-over: the broker's loop ended"
        else:
            what = f"no hand-over (timed out after {timeout:g} s)"
        log.info("stream %s: %s in %.0f ms", self.config.streams[0], what, (time.monotonic() - began) * 1000)

    def _hold_while_needed(self, timeout: float) -> None:
        """A replica in sync whose stop would leave fewer than minInSync in sync waits (up to
        ``timeout``) until another is back in sync: a drain or a rollout that the operator did not
        order would otherwise stop publishes (NOT_ENOUGH_REPLICAS) until it is back. Said in the log,
        in its facts (the operator shows them in status, with an event) and a gauge."""
        if self.replication is None or self._zk is None or self.registration is None:
            return
        from zeps.coordination.replication import read_replication_state  # noqa: PLC0415

        me, need = self.registration.member, self.replication.min_insync
        paths = self.registration.paths(self.config.streams[0])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self._loop_thread is not None and self._loop_thread.is_alive():
            try:
                state = read_replication_state(self._zk, paths)
            except Exception as exc:  # ZooKeeper away: nothing to learn; stop as asked
                log.warning("could not read the in-sync set before stopping: %r", exc)
                break
            if state is None or me not in state.isr or len(state.isr - {me}) >= need:
                break
            if self._no_one_to_wait_for(paths, state.isr):
                log.info("stream %s: every other replica is stopping too (or stopped): no one to wait for",
                         self.config.streams[0])  # fmt: skip
                break
            if self.shutdown_held is None:
                self.shutdown_held = (f"without {me}, {len(state.isr) - 1} replicas would be in sync "
                                      f"({', '.join(sorted(state.isr - {me})) or 'none'}), fewer than minInSync "
                                      f"{need}: waiting for another to be back in sync")  # fmt: skip
                log.warning("stream %s: holding the shutdown: %s", self.config.streams[0], self.shutdown_held)
            time.sleep(0.2)
        if self.shutdown_held is not None:
            log.info("stream %s: the shutdown goes on (held %.1f s)", self.config.streams[0],
                     timeout - max(0.0, deadline - time.monotonic()))  # fmt: skip
            self.shutdown_held = None

    def _mark_stopping(self) -> None:
        """Say in ZooKeeper that this replica stops on purpose (``replication_stopped``), before it
        holds or hands over: a replica of the same set holding its own stop then knows not to wait
        for this one. Best effort: without it, the others hold as for a crash."""
        if self.replication is None or self._zk is None or self.registration is None:
            return
        from zeps.coordination.replication import mark_stopping  # noqa: PLC0415

        try:
            mark_stopping(self._zk, self.registration.paths(self.config.streams[0]), self.registration.member)
        except Exception as exc:
            log.warning("could not mark %s as stopping in ZooKeeper: %r", self.registration.member, exc)

    def _no_one_to_wait_for(self, paths: Any, isr: frozenset[str]) -> bool:
        """Whether every other replica of the set has begun to stop on purpose (its node under
        ``replication_stopped``): the whole set is stopping (deleted, scaled to 0, every pod at
        once), and none will be back in sync for this one to wait for. The set: the manifest's
        replicas (the operator's), else those in sync, live or marked. A replica that crashed left no
        mark: holding waits for it to be back, as it should."""
        from zeps.coordination import Group  # noqa: PLC0415
        from zeps.coordination.replication import stopping_replicas  # noqa: PLC0415

        assert self.registration is not None and self._zk is not None
        me = self.registration.member
        try:
            stopping = stopping_replicas(self._zk, paths)
            if not stopping:  # no replica has marked itself: all are running or crashed
                return False
            group = Group(self._zk, paths.brokers)
            manifest = group.manifest()
            others = (set(manifest) if manifest is not None else set(isr) | set(group.members()) | stopping) - {me}
        except Exception as exc:  # ZooKeeper away: nothing to learn; holding goes on as it would
            log.warning("could not read which replicas are stopping: %r", exc)
            return False
        return bool(others) and others <= stopping

    def stop(self) -> None:
        self._stop.set()
        if self._loop_thread is not None:
            self._loop_thread.join(30)  # the loop closes the journals and the socket when it ends
        else:
            self.core.close()  # start() failed before the loop ran
        if self._metrics is not None:
            self._metrics.shutdown()
            self._metrics.server_close()
            self._metrics = None
        if self._election is not None:
            self._election.stop()
            self._election = None
        for task in self._tier_tasks.values():
            task.stop()
        self._tier_tasks = {}
        for serve in self._tier_serves.values():
            serve.stop()
        self._tier_serves = {}
        for compaction in (self._compactions or {}).values():
            compaction.stop()
        self._compactions = None
        if self._zk is not None:
            self._zk.stop()
            self._zk.close()
            self._zk = None
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
        if self._ctx is not None:
            self._ctx.destroy(linger=0)
            self._ctx = None
        if self._multicast_ctx is not None:
            self._multicast_ctx.destroy(linger=0)
            self._multicast_ctx = None

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the broker stops; True if it did."""
        if self._loop_thread is None:
            return True
        self._loop_thread.join(timeout)
        return not self._loop_thread.is_alive()

    # -- the loop -------------------------------------------------------------------------------
    def _loop(self) -> None:
        core, sock = self.core, self._sock
        poller = self._poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        last_tick = time.monotonic()
        core.resident_bytes = resident_bytes()  # the memory budget from the first ATTACH
        self._update_metrics()  # every gauge from the start, not a second later
        try:
            while not self._stop.is_set():
                # replay that can go on: no wait; appends to group or replay waiting out a full
                # socket queue: 1 ms; nothing to do: until traffic (at most 50 ms, for the tick)
                # sessions waiting for their bytes in flight to leave: 5 ms
                wait = 0 if core.replay_ready(time.monotonic()) else 1 if core.busy else 5 if core.held else 50
                events = dict(poller.poll(wait))
                if self.node is not None:
                    self._replication_turn(self.node, events)
                if self._in_flight.marks and (core.held or time.monotonic() - self._in_flight.looked >= 0.01):
                    self._in_flight.release(core)
                idle = self._read(sock) if sock in events else True
                core.flush_appends(idle=idle)
                self._tier_turn()
                self._send(core.pump())
                if self._pub is not None:
                    self._send_multicast(core.take_multicast())
                now = time.monotonic()
                if now - last_tick >= 1.0:
                    last_tick = now
                    self._reload_keys()
                    core.resident_bytes = resident_bytes()
                    core.tick(now)
                    self._tick_tasks()
                    self._send(core.pump())
                    self._update_metrics()
        except JournalError as exc:  # a broken disk: the cause is the message, no traceback needed
            self.failure = str(exc)
            log.error("broker loop failed: %s", exc)
        except Exception as error:  # (a name of its own: compiled, ``exc`` is typed JournalError above)
            self.failure = f"{type(error).__name__}: {error}"
            log.exception("broker loop failed")
        finally:
            try:
                core.close()  # writes what is buffered: may fail on the same disk
            except Exception as exc:
                self.failure = self.failure or f"closing the journals: {exc}"
                log.error("closing the journals failed: %s", exc)
            self.connections.unwatch(sock)
            sock.close(linger=0)
            self._close_link()
            if self._pub is not None:
                self._pub.close(linger=0)

    # -- replication ----------------------------------------------------------------------------
    def _replication_turn(self, node: ReplicaNode, events: dict[Any, int]) -> None:
        """The replica's turn: the election's news and endpoint lookups, the leader's frames, time."""
        now = time.monotonic()
        actions: list[Any] = []
        while True:
            try:
                item = self._events.get_nowait()
            except queue.Empty:
                break
            if isinstance(item, tuple):  # ("endpoint", epoch, leader, endpoint or None): a lookup's answer
                _, epoch, leader, endpoint = item
                if endpoint is None:
                    actions += node.unreachable(epoch, leader, now)
                else:
                    self._open_link(endpoint)
                    actions += node.linked(epoch, leader, now)
            else:
                actions += node.event(item, now)
        if self._link_monitor is not None and self._link_monitor in events and self._link_handshake_failed():
            self._link_key += 1  # the leader serves another key (a rotation): the next one, at once
            actions += node.link_failed(now)
        if self._link is not None and self._link in events:
            actions += node.frames(self._link_frames(self._link), now)
        actions += node.turn(now)
        for action in actions:
            self._act(action)

    def _act(self, action: Any) -> None:
        if isinstance(action, Send):
            if self._link is not None:
                try:
                    self._link.send(action.frame, zmq.NOBLOCK)
                except zmq.Again:  # never with one fetch in flight; if it happens, the silence check reconnects
                    log.warning("the peering with the leader could not take a frame")
        elif isinstance(action, Close):
            self._close_link()
        elif isinstance(action, WriteIsr):
            if self._election is not None:
                self._election.write_isr(action.epoch, action.isr)
        elif isinstance(action, MarkData):
            if self._election is not None:
                self._election.mark_data(action.epoch)
        elif isinstance(action, StepAside):
            if self._election is not None:
                self._election.step_aside(action.epoch)
        elif isinstance(action, RecordCommit):
            if self._election is not None:
                self._election.record_commit(action.epoch, action.commit)
        elif isinstance(action, Connect):
            self._zk.handler.spawn(self._look_up, action.epoch, action.leader)

    def _look_up(self, epoch: int, leader: str) -> None:
        """ZooKeeper's thread (never the loop's): the leader's endpoint, from its member node."""
        from zeps.coordination import Group  # noqa: PLC0415

        assert self.registration is not None
        endpoint = None
        try:
            member = Group(self._zk, self.registration.paths(self.config.streams[0]).brokers).members().get(leader)
            endpoint = None if member is None else str(member.metadata["endpoint"])
        except Exception as exc:  # not reachable now: the replica asks again
            log.warning("could not look up the leader %s's endpoint: %r", leader, exc)
        self._events.put(("endpoint", epoch, leader, endpoint))

    def _open_link(self, endpoint: str) -> None:
        assert self._ctx is not None and self._poller is not None
        self._close_link()
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        if self.replica_certificate is not None:  # the replicas share the stream's server key: the leader's is ours
            public, secret = self.replica_certificate
            # ours, or during a rotation the coming or the last one (a leader whose certificate changed
            # before or after ours): the next is tried when the leader fails the handshake with this one
            server_key = self.server_keys[self._link_key % len(self.server_keys)]
            sock.setsockopt(zmq.CURVE_SERVERKEY, server_key.encode())
            sock.setsockopt(zmq.CURVE_PUBLICKEY, public)
            sock.setsockopt(zmq.CURVE_SECRETKEY, secret or b"")
            self._link_monitor = sock.get_monitor_socket(_HANDSHAKE_FAILED)
            self._poller.register(self._link_monitor, zmq.POLLIN)
        # a REPLICA-DATA holds whole entries: at most a fetch's bytes, or one group (a quarter segment), and its index
        largest = 2 * max(self.config.replica_fetch_bytes, self.config.journal.segment_bytes) + (1 << 20)
        sock.setsockopt(zmq.MAXMSGSIZE, largest)
        sock.connect(endpoint)
        self._link = sock
        self._poller.register(sock, zmq.POLLIN)

    @staticmethod
    def _link_frames(sock: zmq.Socket[Any]) -> list[bytes]:
        frames: list[bytes] = []
        while len(frames) < 1000:
            try:
                frames.append(sock.recv(zmq.NOBLOCK))
            except zmq.Again:
                break
        return frames

    def _link_handshake_failed(self) -> bool:
        """Whether the peering's monitor reported a CURVE handshake the leader did not complete."""
        assert self._link_monitor is not None
        failed = False
        while True:
            try:
                event = recv_monitor_message(self._link_monitor, zmq.NOBLOCK)
            except zmq.Again:
                return failed
            failed = failed or bool(event["event"] & _HANDSHAKE_FAILED)

    def _close_link(self) -> None:
        if self._link is not None:
            if self._poller is not None:
                self._poller.unregister(self._link)
                if self._link_monitor is not None:
                    self._poller.unregister(self._link_monitor)
            self._link.disable_monitor()
            if self._link_monitor is not None:
                self._link_monitor.close(linger=0)
                self._link_monitor = None
            self._link.close(linger=0)
            self._link = None

    def _read(self, sock: zmq.Socket[Any]) -> bool:
        """Hand the core what arrived, up to a batch (frames or bytes); True if that was all of it."""
        received = size = 0
        recv, receive = sock.recv, self.core.receive
        while received < _READ_BATCH and size < _READ_BYTES:
            try:
                if self.allowed is None and self.replicas_allowed is None:
                    # [peer, frame] as a ROUTER gets it from a DEALER. The frame comes as a zmq.Frame,
                    # whose ``more`` is a field: sock.get(RCVMORE) looks the option up in an enum at
                    # every call (0.75 µs, an eighth of a one-message publish's cost in the broker)
                    peer = recv(_NOBLOCK)
                    part = recv(_NOBLOCK, copy=False)
                    if part.more:
                        self._discard_rest(sock)
                        continue  # a multipart message of another shape: not ZEPS
                    frame = part.bytes
                else:  # each session keeps the key its connection authenticated with
                    peer, frame = self._receive_authenticated(sock)
            except zmq.Again:
                return True
            except ValueError:
                continue  # a multipart message of another shape: not ZEPS
            receive(peer, frame)
            received += 1
            size += len(frame)
        return False

    @staticmethod
    def _discard_rest(sock: zmq.Socket[Any]) -> None:
        """Read and drop the remaining parts of a multipart message (they arrive together)."""
        while sock.get(_RCVMORE):
            sock.recv(_NOBLOCK)

    def _receive_authenticated(self, sock: zmq.Socket[Any]) -> tuple[bytes, bytes]:
        """(peer, frame), telling the core which client key the peer's connection authenticated with
        when the peer has no session yet (an ATTACH is checked against the allowed keys)."""
        parts = sock.recv_multipart(zmq.NOBLOCK, copy=False)
        if len(parts) != 2:
            raise ValueError("not a ZEPS message")
        peer = parts[0].bytes
        if peer not in self.core.sessions:
            user = parts[1].get("User-Id")
            self.core.peer_keys[peer] = user if isinstance(user, str) else None
        return peer, parts[1].bytes

    def _send(self, outgoing: list[Any]) -> None:
        blocked: set[bytes] = set()
        for item in outgoing:
            if item.peer in blocked:
                self.core.unsent(item)
                continue
            try:
                if item.cost:  # a delivery or REPLICA-DATA: tracked until it leaves
                    self._in_flight.send(self._sock, item)
                else:  # an answer, a refusal, a PING
                    self._sock.send_multipart([item.peer, item.frame], zmq.NOBLOCK)
            except zmq.Again:  # the peer's queue is full: as if it had no credit
                blocked.add(item.peer)
                self.core.unsent(item)
            except zmq.ZMQError as exc:
                if exc.errno == zmq.EHOSTUNREACH:  # the peer is gone
                    blocked.add(item.peer)
                    self.core.unsent(item)
                    self.core.disconnected(item.peer)
                else:
                    raise

    def _replication_facts(self, stream: Any) -> dict[str, Any]:
        """This replica's role, the leader's epoch and in-sync set, and each follower's lag (records)."""
        leader = stream.leader
        if leader is None:
            return {
                "role": "follower",
                "written": stream.journal.written,
                "commit": stream.committed,
                "leader": self.node.following[1] if self.node is not None and self.node.following else "",
            }
        return {"role": "leader", "epoch": leader.epoch, "inSync": sorted(leader.isr), "commit": leader.commit,
                "followerLag": leader.lag(stream.journal.durable), "written": stream.journal.written,
                "fetching": leader.fetching(time.monotonic())}  # fmt: skip

    def _update_metrics(self) -> None:
        self.metrics.update(self.core)
        if self._tiering_metrics is not None:
            for name, task in self._tier_tasks.items():
                self._tiering_metrics.update(name, task)
        self.connections.read()
        self.metrics.connections.set(self.connections.open)
        if self._replication_metrics is not None and self.replication is not None and self.node is not None:
            for name, stream in self.core.streams.items():
                self._replication_metrics.update(name, stream, self.replication.min_insync,
                                                 leaderless=self.node.leaderless,
                                                 shutdown_held=self.shutdown_held is not None)  # fmt: skip
        now = time.monotonic()
        # live facts (operator status, Spark offsets): once a second, while ZooKeeper is connected and
        # the last write is done
        if self._memberships and now - self._last_facts >= 1 and not self._facts_writing.is_set():
            self._last_facts = now
            writes = []
            for name, membership in self._memberships.items():
                served = self.core.streams.get(name)
                if served is not None:
                    count, furthest = self.core.subscriptions(served.name)
                    facts = {"lastSequence": served.committed, "journalBytes": served.journal.size_bytes,
                             "subscriptionCount": count, "subscriptions": furthest,
                             "curvePublicKey": self.public_key}  # fmt: skip
                    if self.replication is not None:
                        facts["replication"] = self._replication_facts(served)
                        facts["shutdownHeld"] = self.shutdown_held or ""
                    if not all(membership.metadata.get(k) == v for k, v in facts.items()):  # else no write
                        writes.append((membership, {**membership.metadata, **facts}))
            if writes and self._zk is not None and self._zk.connected:
                self._facts_writing.set()
                self._zk.handler.spawn(self._write_facts, writes)

    def _write_facts(self, writes: list[tuple[Any, dict[str, Any]]]) -> None:
        """Write members' facts, in ZooKeeper's thread pool: never in the loop, where a write made as
        the connection drops would wait for ZooKeeper to come back, and publishes for confirmation."""
        try:
            for membership, metadata in writes:
                membership.update(metadata)
        except Exception as exc:  # facts are best effort; serving is not
            log.warning("could not publish broker facts to ZooKeeper: %r", exc)
        finally:
            self._facts_writing.clear()
