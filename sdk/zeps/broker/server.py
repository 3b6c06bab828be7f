"""The broker on the network: a ZeroMQ ROUTER socket around :class:`~zeps.broker.core.BrokerCore`.

* One command per frame; clients are DEALERs. ``ROUTER_MANDATORY`` is on and every send is
  non-blocking: a full peer queue (EAGAIN) is treated as no credit — the delivery is undone and
  replayed later — and an unroutable peer (EHOSTUNREACH) is forgotten. ZeroMQ never drops silently.
* Publishers are read in bounded batches per loop, so a flood cannot starve deliveries; when the
  broker is behind, ZeroMQ's receive high-water mark pushes back on publishers (they block).
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

import dataclasses
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

from zeps import _netif
from zeps.broker.core import BrokerConfig, BrokerCore
from zeps.broker.metrics import BrokerMetrics, ReplicationMetrics
from zeps.broker.replication import FollowerCopy
from zeps.errors import ConfigError, ProtocolError
from zeps.journal import JournalError, JournalWriteError
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
_MULTICAST_BACKLOG = 16 << 20  # bytes of multicast messages waiting for the group's pipe, at most
# libzmq 4.3.4's NORM engine writes a message into the NORM stream in 2 KiB pieces, and its receivers
# lose every message that spans more than one (checked here: a 2,030-byte frame arrives, 2,040 never):
# NORM runs are cut to this size, and a larger record reaches receivers through the journal only
_NORM_MESSAGE_BYTES = 2000


@dataclass(frozen=True)
class CurveConfig:
    secret_key_file: Path  #: a zmq certificate file with the broker's secret key
    #: who may connect: a directory of zmq public certificates, or a JSON file ``{"name": "public key"}``
    #: (what the operator mounts), read again when it changes; None: any client (encryption only)
    clients: Path | None = None


class AllowedClients:
    """The client public keys a CURVE broker admits, from :attr:`CurveConfig.clients`: the ZAP
    handler's credentials provider (``callback``, on the authenticator's thread) and the broker loop's
    list for revocations (``reload``). The set is replaced whole, never changed in place."""

    def __init__(self, source: Path) -> None:
        self.source = source
        self.keys: frozenset[str] = frozenset()
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
                if not isinstance(listed, dict) or not all(isinstance(k, str) for k in listed.values()):
                    raise ValueError('not a JSON object {"name": "public key"}')
                keys = set(listed.values())
        except (OSError, ValueError) as exc:
            log.error("CURVE clients %s could not be read (%s): keeping the %d keys admitted so far",
                      self.source, exc, len(self.keys))  # fmt: skip
            return False
        self._seen = stamp
        changed = frozenset(keys) != self.keys
        self.keys = frozenset(keys)
        return changed


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
    #: which partition of its stream this broker serves (0: a stream of one partition, or the first);
    #: it registers in that partition's group and elects its leader among that partition's replicas
    partition: int = 0

    def paths(self, stream: str) -> StreamPaths:
        """The ZooKeeper paths of ``stream``'s partition this broker serves."""
        return StreamPaths.of(self.namespace, stream, chroot=self.chroot, partition=self.partition)


@dataclass
class _Link:
    """A follower's peering with its leader: a DEALER, and the copy it feeds."""

    sock: zmq.Socket[Any] | None = None
    copy: FollowerCopy | None = None
    heard: float = 0.0  # when the leader last sent something
    leader: str = ""  # whom we follow ("": nobody yet)
    again: tuple[float, int, str] | None = None  # (when, epoch, leader): a follow to try again


@dataclass(frozen=True)
class Replication:
    """A replicated stream (the broker serves one, and registers in ZooKeeper as one of its replicas,
    named by its member id): see :mod:`zeps.broker.replication` and :mod:`zeps.coordination.replication`."""

    min_insync: int  #: replicas (the leader included) that must hold a record durably before it is confirmed
    lag_s: float = 10.0  #: a follower that has not caught up for this long leaves the in-sync set
    heartbeat_s: float = 0.5  #: a follower hears from the leader at least this often
    leader_silence_s: float = 3.0  #: a follower that heard nothing this long connects again
    session_timeout_s: float = 4.0  #: the broker's ZooKeeper session: how soon a dead leader is replaced


class BrokerServer:
    """Runs the broker loop on a thread. ``start()`` binds and registers; ``stop()`` undoes both."""

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
    ) -> None:
        if replication is not None and (registration is None or len(config.streams) != 1):
            raise ConfigError("a replicated broker serves one stream and registers in ZooKeeper (--zookeeper, "
                              "--member): its replicas find each other, and elect their leader, there")  # fmt: skip
        if multicast is not None:  # the core sends TAIL on a silent stream every heartbeat, runs cut to size
            largest = _NORM_MESSAGE_BYTES if multicast.transport == "norm" else config.batch_bytes
            config = dataclasses.replace(config, multicast_heartbeat_s=multicast.heartbeat_ms / 1000,
                                         multicast_max_bytes=largest)  # fmt: skip
        self.config = config
        self.bind = bind
        self.curve = curve
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
        self._stop = threading.Event()
        self._loop_thread: threading.Thread | None = None
        self._ctx: zmq.Context[Any] | None = None
        self._auth: ThreadAuthenticator | None = None
        #: the client keys a CURVE broker admits (None: no CURVE, or any client)
        self.allowed: AllowedClients | None = None
        self._zk: Any = None
        self._metrics: Any = None  # the metrics HTTP server, when serving metrics
        self.registry = CollectorRegistry()
        self.metrics = BrokerMetrics(self.registry)
        self._memberships: dict[str, Any] = {}  # stream name -> this broker's membership in its group
        self._last_facts = 0.0
        self._facts_writing = threading.Event()  # a write of the facts is under way (not in the loop)
        self.replication = replication  # and its gauges, below
        self._replication_metrics = None if replication is None else ReplicationMetrics(self.registry)
        self._election: Any = None  # this replica's part in the election (zeps.coordination.replication)
        # election events, for the loop; following: the peering with the leader
        self._events, self._link = queue.SimpleQueue[Any](), _Link()
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
        if self.curve is not None:
            self._setup_curve(ctx, sock)
        sock.bind(self.bind)
        self.endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._sock = sock
        if self.multicast is not None:  # a context of its own: libzmq runs NORM and PGM in its I/O thread, which
            self._multicast_ctx = zmq.Context()  # NORM can keep busy; the ROUTER's I/O must not wait behind it
            self._pub = self._open_multicast(self._multicast_ctx, self.multicast)
        if self.metrics_port is not None:
            self._metrics, _ = start_http_server(self.metrics_port, addr=self.metrics_address, registry=self.registry)
        if self.replication is not None:  # no leader known yet: clients are refused until the election
            self.core.follow(self.config.streams[0])
        if self.registration is not None:
            self._register(self.registration)
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

    def _setup_curve(self, ctx: zmq.Context[Any], sock: zmq.Socket[Any]) -> None:
        assert self.curve is not None
        public, secret = zmq.auth.load_certificate(str(self.curve.secret_key_file))
        if secret is None:
            raise ConfigError(f"{self.curve.secret_key_file} holds no secret key; use the .key_secret certificate")
        self._auth = ThreadAuthenticator(ctx)
        self._auth.start()
        if self.curve.clients is not None:
            self.allowed = AllowedClients(self.curve.clients)
            self.allowed.reload()
            self.core.authorized = self.allowed.keys
            self._auth.configure_curve_callback(domain="*", credentials_provider=self.allowed)
        else:
            log.warning("CURVE encrypts, but admits any client key: give the clients allowed (--curve-clients)")
            self._auth.configure_curve(domain="*", location=zmq.auth.CURVE_ALLOW_ANY)
        sock.setsockopt(zmq.CURVE_SERVER, 1)
        sock.setsockopt(zmq.CURVE_SECRETKEY, secret)
        sock.setsockopt(zmq.CURVE_PUBLICKEY, public)
        self.public_key = public.decode()

    def _register(self, reg: Registration) -> None:
        from zeps.coordination import Group, connect  # noqa: PLC0415 — ZooKeeper only when registering

        timeout = self.replication.session_timeout_s if self.replication is not None else 10.0
        self._zk = connect(reg.zookeeper, auth=reg.auth, session_timeout=timeout)
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
            if manifest is not None and reg.member not in manifest:
                self.refused = (
                    f"broker member {reg.member!r} is not in the manifest of stream {name!r} "
                    f"({', '.join(sorted(manifest)) or 'empty'}): refusing to serve"
                )
                raise ConfigError(self.refused)
            self._memberships[name] = group.join(reg.member, metadata, takeover_timeout=reg.takeover_timeout,
                                                 on_failure=self._membership_failed)  # fmt: skip

            def on_status(status: Any, name: str = name) -> None:
                if status.manifest is not None and reg.member not in status.manifest:
                    self.refused = f"broker member {reg.member!r} was removed from the manifest of {name!r}"
                    log.error("%s: stopping", self.refused)
                    self._stop.set()

            group.watch(on_status=on_status)
        if self.replication is not None:
            from zeps.coordination.replication import ReplicaElection  # noqa: PLC0415

            paths = reg.paths(self.config.streams[0])
            journal = self.core.streams[self.config.streams[0]].journal
            empty = lambda: journal.written == 0 and journal.epochs.latest == 0  # noqa: E731 — a new or wiped volume
            self._election = ReplicaElection(self._zk, paths, reg.member, self._replica_event, empty=empty).start()

    def _replica_event(self, event: Any) -> None:
        """From ZooKeeper's thread. A suspended session stops confirmations at once (a new leader may be
        elected once it expires); everything else is the loop's to act on, in order."""
        if event.kind == "suspended":
            leader = self.core.streams[self.config.streams[0]].leader
            if leader is not None:
                leader.valid = False
                log.warning("ZooKeeper connection lost: confirming nothing until it is back")
        self._events.put(event)

    def _membership_failed(self, exc: BaseException) -> None:
        """A rejoin after a ZooKeeper session expiry failed: serving unregistered would hide the broker
        from its clients and the operator (and another broker may hold the id): stop, as a failure."""
        self.failure = f"could not register in ZooKeeper again after its session expired: {exc}"
        log.error("%s: stopping", self.failure)
        self._stop.set()

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
        try:
            while not self._stop.is_set():
                # replay that can go on: no wait; appends to group or replay waiting out a full
                # socket queue: 1 ms; nothing to do: until traffic (at most 50 ms, for the tick)
                wait = 0 if core.replay_ready(time.monotonic()) else 1 if core.busy else 50
                events = dict(poller.poll(wait))
                if self.replication is not None:
                    self._replication_turn(events)
                idle = self._read(sock) if sock in events else True
                core.flush_appends(idle=idle)
                self._send(core.pump())
                if self._pub is not None:
                    self._send_multicast(core.take_multicast())
                now = time.monotonic()
                if now - last_tick >= 1.0:
                    last_tick = now
                    if self.allowed is not None and self.allowed.reload():  # revocations apply at once
                        core.authorize(self.allowed.keys)
                    core.tick(now)
                    if self._election is not None:
                        for _, epoch, isr in core.isr_requests(now):
                            self._election.write_isr(epoch, isr)
                    self._send(core.pump())
                    self._update_metrics()
        except JournalError as exc:  # a broken disk: the cause is the message, no traceback needed
            self.failure = str(exc)
            log.error("broker loop failed: %s", exc)
        except Exception as exc:
            self.failure = f"{type(exc).__name__}: {exc}"
            log.exception("broker loop failed")
        finally:
            try:
                core.close()  # writes what is buffered: may fail on the same disk
            except Exception as exc:
                self.failure = self.failure or f"closing the journals: {exc}"
                log.error("closing the journals failed: %s", exc)
            sock.close(linger=0)
            self._stop_following()
            if self._pub is not None:
                self._pub.close(linger=0)

    # -- replication ----------------------------------------------------------------------------
    def _replication_turn(self, events: dict[Any, int]) -> None:
        """Act on the election's news, and copy from the leader while following."""
        assert self.replication is not None
        name = self.config.streams[0]
        while True:
            try:
                event = self._events.get_nowait()
            except queue.Empty:
                break
            self._on_replica_event(name, event)
        now = time.monotonic()
        link = self._link
        if link.again is not None and now >= link.again[0]:
            _, epoch, leader = link.again
            self._follow(name, epoch, leader)
        sock, copy = link.sock, link.copy
        if sock is None or copy is None:
            return
        if sock in events:
            self._copy_frames(name, sock, copy)
            link.heard = now
        if copy.refused or now - link.heard > self.replication.leader_silence_s:
            why = copy.refused or f"nothing from the leader for {now - link.heard:.1f}s"
            log.warning("stream %s: following again (%s)", name, why)
            self._retry_follow(copy.epoch, link.leader)

    def _copy_frames(self, name: str, sock: zmq.Socket[Any], copy: FollowerCopy) -> None:
        while True:
            try:
                frame = sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                break
            try:
                answers = copy.receive(frame)
            except JournalWriteError:
                raise  # a broken disk: fatal
            except (ProtocolError, JournalError) as exc:
                copy.refused = f"{type(exc).__name__}: {exc}"
                return
            for answer in answers:
                sock.send(answer, zmq.NOBLOCK)
            self.core.copied(name, copy.commit)

    def _on_replica_event(self, name: str, event: Any) -> None:
        assert self.replication is not None and self.registration is not None
        stream = self.core.streams[name]
        if event.kind == "lead":
            self._stop_following()
            self.core.lead(name, me=self.registration.member, epoch=event.epoch, isr=event.isr,
                           min_insync=self.replication.min_insync, lag_s=self.replication.lag_s,
                           heartbeat_s=self.replication.heartbeat_s)  # fmt: skip
        elif event.kind == "follow":
            self._follow(name, event.epoch, event.leader)
        elif event.kind == "isr":
            self.core.isr_written(name, event.epoch, event.isr)
        elif event.kind == "resumed" and stream.leader is not None and stream.leader.epoch == event.epoch:
            stream.leader.valid = True
            log.info("ZooKeeper connection back, same session: confirming again")
        elif event.kind == "lost":
            log.warning("stream %s: ZooKeeper session expired: no longer leading or following", name)
            self._stop_following()
            self.core.follow(name)

    def _follow(self, name: str, epoch: int, leader: str) -> None:
        """Follow ``leader`` of ``epoch``: connect to it (its endpoint from its member node) and copy."""
        assert self.registration is not None and self.replication is not None
        self._stop_following()
        self._link = _Link(leader=leader)
        self.core.follow(name)
        if not leader:
            return  # an election is on: the next event says who won
        from zeps.coordination import Group  # noqa: PLC0415

        reg = self.registration
        member = Group(self._zk, reg.paths(name).brokers).members().get(leader)
        if member is None:  # it has not registered yet (or is gone): look again soon
            self._retry_follow(epoch, leader)
            return
        assert self._ctx is not None and self._poller is not None
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(str(member.metadata["endpoint"]))
        copy = FollowerCopy(self.core.streams[name].journal, name, reg.member, epoch)
        for frame in copy.start():
            sock.send(frame)
        self._link = _Link(sock, copy, time.monotonic(), leader)
        self._poller.register(sock, zmq.POLLIN)
        log.info("stream %s: following %s (epoch %d) at %s", name, leader, epoch, member.metadata["endpoint"])

    def _retry_follow(self, epoch: int, leader: str) -> None:
        self._stop_following()
        self._link = _Link(leader=leader, again=(time.monotonic() + 0.3, epoch, leader))

    def _stop_following(self) -> None:
        """Close the peering with the leader, and forget a follow waiting to be tried again (a leader
        must not step down for a retry left from before its election)."""
        link = self._link
        if link.sock is not None:
            if self._poller is not None:
                self._poller.unregister(link.sock)
            link.sock.close(linger=0)
        self._link = _Link()

    def _read(self, sock: zmq.Socket[Any]) -> bool:
        """Hand the core what arrived, up to a batch (frames or bytes); True if that was all of it."""
        received = size = 0
        recv, receive = sock.recv, self.core.receive
        while received < _READ_BATCH and size < _READ_BYTES:
            try:
                if self.allowed is None:
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

    @staticmethod
    def _replication_facts(stream: Any) -> dict[str, Any]:
        """This replica's role, the leader's epoch and in-sync set, and each follower's lag (records)."""
        leader = stream.leader
        if leader is None:
            return {"role": "follower", "written": stream.journal.written}
        durable = stream.journal.durable
        lag = {name: max(0, durable - f.durable) for name, f in sorted(leader.followers.items())}
        return {"role": "leader", "epoch": leader.epoch, "inSync": sorted(leader.isr), "commit": leader.commit,
                "followerLag": lag, "written": stream.journal.written}  # fmt: skip

    def _update_metrics(self) -> None:
        self.metrics.update(self.core)
        if self._replication_metrics is not None and self.replication is not None:
            for name, stream in self.core.streams.items():
                self._replication_metrics.update(name, stream, self.replication.min_insync)
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
                             "subscriptionCount": count, "subscriptions": furthest}  # fmt: skip
                    if self.replication is not None:
                        facts["replication"] = self._replication_facts(served)
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
