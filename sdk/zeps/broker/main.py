"""``zeps-broker``: run a ZEPS broker for one or more streams until SIGTERM/SIGINT.

Every flag has an environment variable (what the operator's Deployment sets), e.g.::

    zeps-broker --stream prices --data-dir /var/lib/zeps --bind tcp://0.0.0.0:5555 \\
        --zookeeper zk:2181 --namespace shop --member prices-0 --fsync group \\
        [--multicast epgm://239.192.0.1:5601 --multicast-interface eth0]
"""

from __future__ import annotations

import argparse
import logging
import os
import resource
import signal
import sys
import time
from pathlib import Path

from zeps.broker.config import (
    DEFAULT_MAX_BYTES_IN_FLIGHT,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_MAX_REGEX_SUBSCRIPTIONS,
    DEFAULT_MAX_SESSION_BYTES_IN_FLIGHT,
    DEFAULT_MAX_SESSIONS,
    DEFAULT_MAX_TOTAL_SUBSCRIPTIONS,
    BrokerConfig,
)
from zeps.broker.server import BrokerServer, CurveConfig, Registration, Replication
from zeps.broker.tiering import DEFAULT_SEGMENT_IDLE_MS, Tiering
from zeps.config import read_ca
from zeps.errors import ConfigError, ZepsError
from zeps.journal import DEFAULT_MAX_PRODUCERS, DEFAULT_PRODUCER_TTL_MS, JournalConfig
from zeps.journal.config import CLEANUPS, DEFAULT_MIN_CLEANABLE_RATIO, DEFAULT_TOMBSTONE_RETENTION_MS
from zeps.options import MulticastOptions
from zeps.partitioning import MAX_PARTITIONS
from zeps.paths import validate_member_id
from zeps.protocol.limits import DEFAULT_MAX_MESSAGE_BYTES, MAX_MESSAGE_BYTES_CEILING

__all__ = ["main", "multicast_options", "parse_args", "read_key", "replication", "settings", "tiering"]


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(f"ZEPS_BROKER_{name}", default)


def _env_int(name: str) -> int | None:
    return int(v) if (v := _env(name)) else None


def parser() -> argparse.ArgumentParser:
    """The broker's flags, each defaulting to its ``ZEPS_BROKER_*`` variable (the docs' reference is made from it)."""
    p = argparse.ArgumentParser(prog="zeps-broker", description="Run a ZEPS broker (journalled pub/sub over ZeroMQ).")
    streams = _env("STREAMS")
    p.add_argument("--stream", action="append", default=streams.split(",") if streams else None,
                   help="a stream to serve (repeat for several) [ZEPS_BROKER_STREAMS, comma-separated]")  # fmt: skip
    p.add_argument("--data-dir", default=_env("DATA_DIR"), help="journal directory [ZEPS_BROKER_DATA_DIR]")
    p.add_argument("--bind", default=_env("BIND", "tcp://127.0.0.1:5555"), help="ZeroMQ endpoint [ZEPS_BROKER_BIND]")
    p.add_argument("--fsync", choices=["always", "group", "interval", "never"], default=_env("FSYNC", "group"))
    p.add_argument("--segment-bytes", type=int, default=int(_env("SEGMENT_BYTES", str(64 << 20)) or 0))
    p.add_argument("--retention-ms", type=int, default=_env_int("RETENTION_MS"))
    p.add_argument("--retention-bytes", type=int, default=_env_int("RETENTION_BYTES"))
    p.add_argument("--producer-ttl", type=float,
                   default=float(_env("PRODUCER_TTL") or DEFAULT_PRODUCER_TTL_MS / 1000),
                   help="seconds an idempotent producer may stay idle before the broker forgets it; a client "
                   "resuming it afterwards is refused (PRODUCER_UNKNOWN) [ZEPS_BROKER_PRODUCER_TTL]")  # fmt: skip
    p.add_argument("--max-producers", type=int, default=int(_env("MAX_PRODUCERS") or DEFAULT_MAX_PRODUCERS),
                   help="idempotent producers remembered per stream [ZEPS_BROKER_MAX_PRODUCERS]")  # fmt: skip
    p.add_argument("--matching", choices=["prefix", "prefix-and-regex"], default=_env("MATCHING", "prefix-and-regex"),
                   help="patterns accepted; prefix refuses ~regex ones [ZEPS_BROKER_MATCHING]")  # fmt: skip
    p.add_argument("--max-sessions", type=int, default=int(_env("MAX_SESSIONS") or DEFAULT_MAX_SESSIONS),
                   help="peerings at most, all clients together; ATTACH past it is refused BUSY "
                   "[ZEPS_BROKER_MAX_SESSIONS]")  # fmt: skip
    p.add_argument("--max-total-subscriptions", type=int,
                   default=int(_env("MAX_TOTAL_SUBSCRIPTIONS") or DEFAULT_MAX_TOTAL_SUBSCRIPTIONS),
                   help="subscriptions and open fetches at most, all peerings together (LIMIT past it; a peering "
                   "holds 64 at most) [ZEPS_BROKER_MAX_TOTAL_SUBSCRIPTIONS]")  # fmt: skip
    p.add_argument("--max-regex-subscriptions", type=int,
                   default=int(_env("MAX_REGEX_SUBSCRIPTIONS") or DEFAULT_MAX_REGEX_SUBSCRIPTIONS),
                   help="of those, with a ~regex pattern at most, all peerings together: each runs against "
                   "every record's key on the broker's one thread (LIMIT past it) "
                   "[ZEPS_BROKER_MAX_REGEX_SUBSCRIPTIONS]")  # fmt: skip
    p.add_argument("--max-session-bytes-in-flight", type=int,
                   default=int(_env("MAX_SESSION_BYTES_IN_FLIGHT") or DEFAULT_MAX_SESSION_BYTES_IN_FLIGHT),
                   help="bytes of deliveries handed to a peering's socket and not yet written to its connection, "
                   "at most: a peer that grants credit and reads nothing holds this much, whatever its credit "
                   "[ZEPS_BROKER_MAX_SESSION_BYTES_IN_FLIGHT]")  # fmt: skip
    p.add_argument(
        "--max-bytes-in-flight",
        type=int,
        default=int(_env("MAX_BYTES_IN_FLIGHT") or DEFAULT_MAX_BYTES_IN_FLIGHT),
        help="the same, all peerings together (deliveries wait past it) [ZEPS_BROKER_MAX_BYTES_IN_FLIGHT]",
    )
    p.add_argument("--max-memory-bytes", type=int, default=_env_int("MAX_MEMORY_BYTES"),
                   help="resident memory past which new peerings (BUSY) and subscriptions (LIMIT) are refused; "
                   "0: no budget; unset: 0.8 times the container's memory limit (cgroup), none without one "
                   "[ZEPS_BROKER_MAX_MEMORY_BYTES]")  # fmt: skip
    p.add_argument("--max-connections", type=int, default=_env_int("MAX_CONNECTIONS"),
                   help="connections open at once (handshakes under way included) past which a new one is refused "
                   "at its handshake, before it carries a frame; a replica with its CURVE key is let in; 0: no "
                   f"budget; unset: {DEFAULT_MAX_CONNECTIONS}, or half the process's file descriptor limit if that "
                   "is lower [ZEPS_BROKER_MAX_CONNECTIONS]")  # fmt: skip
    p.add_argument("--heartbeat", type=float, default=float(_env("HEARTBEAT", "5") or 5))
    p.add_argument("--ttl", type=float, default=float(_env("TTL", "30") or 30))
    p.add_argument("--curve-secret-key", default=_env("CURVE_SECRET_KEY"), help="zmq certificate with the secret key")
    p.add_argument("--curve-replicas", default=_env("CURVE_REPLICAS"),
                   help="a replicated stream with CURVE: a JSON file {\"replica\": \"public key\"} of its replicas; "
                   "a follower peers with its own certificate replica.<member>.key_secret beside it, and a leader "
                   "takes each replica's fetches from that replica's key only "
                   "[ZEPS_BROKER_CURVE_REPLICAS]")  # fmt: skip
    p.add_argument("--curve-clients", "--curve-clients-dir", dest="curve_clients",
                   default=_env("CURVE_CLIENTS") or _env("CURVE_CLIENTS_DIR"),
                   help="the clients admitted: a directory of zmq public certificates, or a JSON file "
                   '{"name": "public key"}; read again when it changes (a client taken off is cut off at once); '
                   "unset: any client key (encryption only) [ZEPS_BROKER_CURVE_CLIENTS]")  # fmt: skip
    p.add_argument("--metrics-port", type=int, default=_env_int("METRICS_PORT"),
                   help="serve Prometheus metrics on this port [ZEPS_BROKER_METRICS_PORT]")  # fmt: skip
    p.add_argument("--metrics-address", default=_env("METRICS_ADDRESS", "127.0.0.1"),
                   help="the address metrics are served on; 0.0.0.0 in a pod, so that other pods can scrape "
                   "them [ZEPS_BROKER_METRICS_ADDRESS]")  # fmt: skip
    p.add_argument("--max-message-bytes", type=int,
                   default=int(_env("MAX_MESSAGE_BYTES") or DEFAULT_MAX_MESSAGE_BYTES),
                   help="the largest message body accepted; a larger one is refused (TOO_LARGE) "
                   "[ZEPS_BROKER_MAX_MESSAGE_BYTES]")  # fmt: skip
    p.add_argument("--zookeeper", default=_env("ZOOKEEPER"), help="register in ZooKeeper (host:port,…)")
    p.add_argument("--zookeeper-ca", default=_env("ZOOKEEPER_CA"),
                   help="the CA of the ZooKeeper servers' TLS certificates, a PEM file (or the PEM): speak TLS to "
                   "them [ZEPS_BROKER_ZOOKEEPER_CA]")  # fmt: skip
    p.add_argument("--namespace", default=_env("NAMESPACE", "default"))
    p.add_argument("--chroot", default=_env("CHROOT", "/zeps"))
    p.add_argument("--member", default=_env("MEMBER"), help="this broker's member id in the group")
    p.add_argument("--advertise", default=_env("ADVERTISE"), help="the endpoint clients should use")
    p.add_argument("--partition", type=int, default=int(_env("PARTITION") or 0),
                   help="the partition of its stream this broker serves, in a partitioned stream: it registers "
                   "(and elects a leader) among that partition's brokers [ZEPS_BROKER_PARTITION]")  # fmt: skip
    p.add_argument("--multicast", default=_env("MULTICAST"),
                   help="also send each live record once to a multicast group: norm|pgm|epgm://GROUP:PORT "
                   "[ZEPS_BROKER_MULTICAST]")  # fmt: skip
    p.add_argument("--multicast-interface", default=_env("MULTICAST_INTERFACE"),
                   help="its interface: a name or an IPv4 address (default: the route to the group's) "
                   "[ZEPS_BROKER_MULTICAST_INTERFACE]")  # fmt: skip
    p.add_argument("--multicast-rate", type=int, default=_env_int("MULTICAST_RATE"),
                   help="pgm/epgm: transmit rate limit, kbit/s [ZEPS_BROKER_MULTICAST_RATE]")  # fmt: skip
    p.add_argument("--multicast-recovery", type=int, default=_env_int("MULTICAST_RECOVERY"),
                   help="pgm/epgm: ms a lost packet can be repaired [ZEPS_BROKER_MULTICAST_RECOVERY]")  # fmt: skip
    p.add_argument("--multicast-heartbeat", type=int, default=_env_int("MULTICAST_HEARTBEAT"),
                   help="ms a stream may stay silent before TAIL [ZEPS_BROKER_MULTICAST_HEARTBEAT]")  # fmt: skip
    p.add_argument("--multicast-key-file", default=_env("MULTICAST_KEY_FILE"),
                   help="sign each multicast message with this key (a file of hex digits; the stream's clients "
                   "have it): receivers drop what is not signed with it [ZEPS_BROKER_MULTICAST_KEY_FILE]")  # fmt: skip
    p.add_argument("--min-insync", type=int, default=_env_int("MIN_INSYNC"),
                   help="replicate the stream: this broker is one of its replicas (named by --member), and a "
                   "publish is confirmed once this many replicas, the leader included, hold it durably "
                   "[ZEPS_BROKER_MIN_INSYNC]")  # fmt: skip
    p.add_argument(
        "--replica-lag",
        type=float,
        default=float(_env("REPLICA_LAG") or 10),
        help="seconds a follower may stay behind before it leaves the in-sync set [ZEPS_BROKER_REPLICA_LAG]",
    )
    p.add_argument("--under-replicated", choices=["refuse", "wait"], default=_env("UNDER_REPLICATED", "refuse"),
                   help="with fewer in-sync replicas than --min-insync: refuse publishes (NOT_ENOUGH_REPLICAS) or "
                   "hold their confirmations until enough are back [ZEPS_BROKER_UNDER_REPLICATED]")  # fmt: skip
    p.add_argument("--replica-catchup-rate", type=float, default=float(_env("REPLICA_CATCHUP_RATE") or 0),
                   help="MB a second a replica catching up (out of sync: new, or back after a while) is sent at "
                   "most by the leader; 0: no limit [ZEPS_BROKER_REPLICA_CATCHUP_RATE]")  # fmt: skip
    p.add_argument("--zookeeper-session-timeout", type=float, default=float(_env("ZOOKEEPER_SESSION_TIMEOUT") or 4),
                   help="seconds; a replicated stream's dead leader is replaced after about this long "
                   "[ZEPS_BROKER_ZOOKEEPER_SESSION_TIMEOUT]")  # fmt: skip
    p.add_argument("--preferred-leader", default=_env("PREFERRED_LEADER"),
                   help="the replica (its --member) that should lead the stream while it is in sync: the others "
                   "give the lead back to it, after a roll or a failover [ZEPS_BROKER_PREFERRED_LEADER]")  # fmt: skip
    p.add_argument("--handover-timeout", type=float, default=float(_env("HANDOVER_TIMEOUT") or 10),
                   help="seconds a replica stopping (SIGTERM) waits for its lead to pass to an in-sync follower "
                   "before it stops anyway (a failover then); 0: no hand-over "
                   "[ZEPS_BROKER_HANDOVER_TIMEOUT]")  # fmt: skip
    _old_records_flags(p)
    p.add_argument("--log-level", default=_env("LOG_LEVEL", "INFO"), help="[ZEPS_BROKER_LOG_LEVEL]")
    return p


def _old_records_flags(p: argparse.ArgumentParser) -> None:
    """What becomes of a stream's old records besides retention: tiered to a store, compacted."""
    _tiering_flags(p)
    _compaction_flags(p)


def _compaction_flags(p: argparse.ArgumentParser) -> None:
    """Compaction's flags (:mod:`zeps.journal.compaction`; JournalConfig checks them)."""
    g = p.add_argument_group("compaction")
    g.add_argument("--cleanup", choices=list(CLEANUPS), default=_env("CLEANUP", "delete"),
                   help="what happens to old records: delete (retention by --retention-ms/--retention-bytes), "
                   "compact (keep each key's latest record; a record with an empty body deletes its key), or "
                   "both [ZEPS_BROKER_CLEANUP]")  # fmt: skip
    g.add_argument("--tombstone-retention-ms", type=int,
                   default=int(_env("TOMBSTONE_RETENTION_MS") or DEFAULT_TOMBSTONE_RETENTION_MS),
                   help="with --cleanup compact: how long a delete (a record with an empty body) is kept, so a "
                   "reader that starts within it sees the delete [ZEPS_BROKER_TOMBSTONE_RETENTION_MS]")  # fmt: skip
    g.add_argument("--min-cleanable-ratio", type=float,
                   default=float(_env("MIN_CLEANABLE_RATIO") or DEFAULT_MIN_CLEANABLE_RATIO),
                   help="with --cleanup compact: the share of superseded records in closed segments that starts a "
                   "compaction pass [ZEPS_BROKER_MIN_CLEANABLE_RATIO]")  # fmt: skip
    g.add_argument("--compaction-bytes-per-s", type=int, default=_env_int("COMPACTION_BYTES_PER_S"),
                   help="with --cleanup compact: the bytes a compaction pass reads and writes a second at most; "
                   "unset: no limit [ZEPS_BROKER_COMPACTION_BYTES_PER_S]")  # fmt: skip


def _tiering_flags(p: argparse.ArgumentParser) -> None:
    """Tiered storage's flags (:func:`tiering` checks them together)."""
    g = p.add_argument_group("tiered storage")
    g.add_argument("--tier-store", default=_env("TIER_STORE"),
                   help="tier the journal to this object store (s3://bucket/prefix, or file:///path): the leader "
                   "uploads closed, committed segments there, the manifest is kept in ZooKeeper (--zookeeper), and "
                   "a local segment is deleted only once the store holds it; --retention-ms/--retention-bytes are "
                   "then the stream's total retention, kept in the store (with --cleanup compact alone, the store "
                   "keeps the compacted runs for good). Credentials: AWS_ACCESS_KEY_ID and "
                   "AWS_SECRET_ACCESS_KEY [ZEPS_BROKER_TIER_STORE]")  # fmt: skip
    g.add_argument("--tier-store-endpoint", default=_env("TIER_STORE_ENDPOINT"),
                   help="the S3 endpoint URL (an S3-compatible server) [ZEPS_BROKER_TIER_STORE_ENDPOINT]")  # fmt: skip
    g.add_argument("--tier-store-region", default=_env("TIER_STORE_REGION"),
                   help="the S3 region [ZEPS_BROKER_TIER_STORE_REGION]")  # fmt: skip
    g.add_argument("--tier-store-path-style", choices=["true", "false"], default=_env("TIER_STORE_PATH_STYLE"),
                   help="address buckets by path, not by host name [ZEPS_BROKER_TIER_STORE_PATH_STYLE]")  # fmt: skip
    g.add_argument("--tier-segment-idle-ms", type=int,
                   default=int(_env("TIER_SEGMENT_IDLE_MS") or DEFAULT_SEGMENT_IDLE_MS),
                   help="with --tier-store: the leader closes its active segment once its newest record is this old, "
                   "so a quiet stream's records reach the store within about this long "
                   "[ZEPS_BROKER_TIER_SEGMENT_IDLE_MS]")  # fmt: skip
    g.add_argument("--tier-max-backlog-bytes", type=int, default=_env_int("TIER_MAX_BACKLOG_BYTES"),
                   help="with --tier-store: refuse publishes (JOURNAL_FULL) while more than this many bytes of closed "
                   "segments wait for the store, before the volume itself fills up; unset: only a full volume "
                   "refuses [ZEPS_BROKER_TIER_MAX_BACKLOG_BYTES]")  # fmt: skip
    g.add_argument("--local-retention-ms", type=int, default=_env_int("LOCAL_RETENTION_MS"),
                   help="with --tier-store: how long the volume keeps what the store holds (at most "
                   "--retention-ms; unset: --retention-ms) [ZEPS_BROKER_LOCAL_RETENTION_MS]")  # fmt: skip
    g.add_argument("--local-retention-bytes", type=int, default=_env_int("LOCAL_RETENTION_BYTES"),
                   help="with --tier-store: how many bytes the volume keeps of what the store holds (at most "
                   "--retention-bytes; unset: --retention-bytes) [ZEPS_BROKER_LOCAL_RETENTION_BYTES]")  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = parser()
    args = p.parse_args(argv)
    if not args.stream:
        p.error("at least one --stream is needed (or ZEPS_BROKER_STREAMS)")
    if not args.data_dir:
        p.error("--data-dir is needed (or ZEPS_BROKER_DATA_DIR): the journal lives there")
    if args.zookeeper and not args.member:
        p.error("--member is needed with --zookeeper: it names this broker in the stream's group")
    if args.min_insync is not None and (not args.zookeeper or len(args.stream) != 1 or args.min_insync < 1):
        p.error("--min-insync (a replicated stream) needs --zookeeper and --member, exactly one --stream, and a "
                "value of 1 or more")  # fmt: skip
    if args.preferred_leader:
        if args.min_insync is None:
            p.error("--preferred-leader names a replica of a replicated stream: give --min-insync too")
        try:
            validate_member_id(args.preferred_leader)
        except ConfigError as exc:
            p.error(f"--preferred-leader: {exc}")
    if not 0 <= args.partition < MAX_PARTITIONS or (args.partition and (not args.zookeeper or len(args.stream) != 1)):
        p.error(f"--partition must be in 0..{MAX_PARTITIONS - 1}, and a partition other than 0 needs "
                "--zookeeper and exactly one --stream (its brokers and clients find each other there)")  # fmt: skip
    return args


def _zookeeper_auth() -> tuple[str, str] | None:
    """The namespace's ZooKeeper identity, from the environment only (a password in a flag shows in
    ``ps``): ZEPS_BROKER_ZOOKEEPER_USER and ZEPS_BROKER_ZOOKEEPER_PASSWORD (the operator sets both from
    the namespace's zeps-zookeeper-auth Secret)."""
    user, password = _env("ZOOKEEPER_USER") or "", _env("ZOOKEEPER_PASSWORD") or ""
    if bool(user) != bool(password):
        raise ConfigError("set both ZEPS_BROKER_ZOOKEEPER_USER and ZEPS_BROKER_ZOOKEEPER_PASSWORD, or neither")
    return (user, password) if user else None


def read_key(path: str) -> bytes:
    """A multicast key from its file: hex digits (16 bytes at least); ConfigError naming the file."""
    try:
        key = bytes.fromhex(Path(path).read_text().strip())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--multicast-key-file {path}: not a readable file of hex digits ({exc})") from None
    if len(key) < 16:
        raise ConfigError(f"--multicast-key-file {path}: {len(key)} bytes; give 16 or more")
    return key


def multicast_options(args: argparse.Namespace) -> MulticastOptions | None:
    """The multicast output the flags ask for (None: none); ConfigError naming the bad one."""
    tuning = {"interface": args.multicast_interface, "rate_kbps": args.multicast_rate,
              "recovery_ms": args.multicast_recovery, "heartbeat_ms": args.multicast_heartbeat}  # fmt: skip
    if not args.multicast:
        given = [f"--multicast-{name.split('_')[0]}" for name, value in tuning.items() if value is not None]
        if given:
            raise ConfigError(f"{', '.join(given)} without --multicast: name the group (norm|pgm|epgm://GROUP:PORT)")
        return None
    return MulticastOptions.from_url(args.multicast, **{k: v for k, v in tuning.items() if v is not None})


def replication(args: argparse.Namespace) -> Replication | None:
    """The replication the flags ask for (None: the stream has this one broker)."""
    if args.min_insync is None:
        return None
    return Replication(args.min_insync, lag_s=args.replica_lag, session_timeout_s=args.zookeeper_session_timeout,
                       preferred_leader=args.preferred_leader or None)  # fmt: skip


def tiering(args: argparse.Namespace) -> Tiering | None:
    """The tiered storage the flags ask for (None: none); ConfigError naming the flag and the fix."""
    local = {"--local-retention-ms": args.local_retention_ms, "--local-retention-bytes": args.local_retention_bytes}
    if not args.tier_store:
        given = [flag for flag, value in local.items() if value is not None]
        given += [f"--tier-store-{o}" for o in ("endpoint", "region", "path-style")
                  if getattr(args, f"tier_store_{o.replace('-', '_')}") is not None]  # fmt: skip
        if given:
            raise ConfigError(f"{', '.join(given)} without --tier-store: name the object store (s3://bucket/prefix)")
        return None
    if not args.zookeeper:
        raise ConfigError("--tier-store needs --zookeeper and --member: the store's manifest is kept in ZooKeeper")
    for (flag, value), (total_flag, total) in zip(local.items(), (("--retention-ms", args.retention_ms),
                                                                  ("--retention-bytes", args.retention_bytes)),
                                                  strict=True):  # fmt: skip
        if value is not None and (value < 0 or (total is not None and value > total)):
            raise ConfigError(f"{flag}={value}: must be at least 0 and at most {total_flag}={total} (the local "
                              "part of the stream's retention)")  # fmt: skip
    path_style = None if args.tier_store_path_style is None else args.tier_store_path_style == "true"
    if args.tier_segment_idle_ms < 1:
        raise ConfigError(f"--tier-segment-idle-ms={args.tier_segment_idle_ms}: must be at least 1")
    if args.tier_max_backlog_bytes is not None and args.tier_max_backlog_bytes < 1:
        raise ConfigError(f"--tier-max-backlog-bytes={args.tier_max_backlog_bytes}: must be at least 1")
    deletes = "delete" in args.cleanup  # compacted alone: the store keeps each key's latest record for good
    return Tiering(args.tier_store, endpoint=args.tier_store_endpoint, region=args.tier_store_region,
                   path_style=path_style, retention_ms=args.retention_ms if deletes else None,
                   retention_bytes=args.retention_bytes if deletes else None,
                   segment_idle_ms=args.tier_segment_idle_ms,
                   max_backlog_bytes=args.tier_max_backlog_bytes)  # fmt: skip


def memory_budget(cgroup: Path = Path("/sys/fs/cgroup")) -> int:
    """The broker's memory budget unless set: 80% of its container's memory limit (cgroup v2
    ``memory.max``, or v1 ``memory/memory.limit_in_bytes``), so that it refuses new work before the
    kernel kills it; 0 (none) without a limit."""
    for name in ("memory.max", "memory/memory.limit_in_bytes"):
        try:
            text = (cgroup / name).read_text().strip()
        except OSError:
            continue
        return int(text) * 4 // 5 if text.isdigit() and int(text) < 1 << 60 else 0  # "max", v1's "none"
    return 0


def connection_budget() -> int:
    """The broker's connection budget unless set: DEFAULT_MAX_CONNECTIONS, or half its file descriptor
    limit if that is lower (each connection takes one; the journal's segments need theirs)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return DEFAULT_MAX_CONNECTIONS
    return max(1, min(DEFAULT_MAX_CONNECTIONS, soft // 2))


def settings(args: argparse.Namespace) -> tuple[BrokerConfig, CurveConfig | None, Registration | None]:
    """The broker's configuration from its parsed flags (no I/O). Raises ZepsError for a bad journal
    setting."""
    # a tiered journal keeps its local retention (unset: the total), the store the total (tiering())
    retention_ms, retention_bytes = args.retention_ms, args.retention_bytes
    if args.tier_store:
        retention_ms = retention_ms if args.local_retention_ms is None else args.local_retention_ms
        retention_bytes = retention_bytes if args.local_retention_bytes is None else args.local_retention_bytes
    journal = JournalConfig(segment_bytes=args.segment_bytes, fsync=args.fsync, retention_ms=retention_ms,
                            retention_bytes=retention_bytes, producer_ttl_ms=int(args.producer_ttl * 1000),
                            max_producers=args.max_producers, cleanup=args.cleanup,
                            tombstone_retention_ms=args.tombstone_retention_ms,
                            min_cleanable_ratio=args.min_cleanable_ratio,
                            compaction_bytes_per_s=args.compaction_bytes_per_s)  # fmt: skip
    if not 0 < args.max_message_bytes <= MAX_MESSAGE_BYTES_CEILING:
        raise ConfigError(f"--max-message-bytes={args.max_message_bytes}: must be between 1 and "
                          f"{MAX_MESSAGE_BYTES_CEILING}")  # fmt: skip
    for flag, value, least in (("--max-sessions", args.max_sessions, 1),
                               ("--max-total-subscriptions", args.max_total_subscriptions, 1),
                               ("--max-regex-subscriptions", args.max_regex_subscriptions, 0),
                               ("--max-session-bytes-in-flight", args.max_session_bytes_in_flight, 1 << 16),
                               ("--max-bytes-in-flight", args.max_bytes_in_flight, 1 << 16),
                               ("--max-memory-bytes", args.max_memory_bytes or 0, 0),
                               ("--max-connections", args.max_connections or 0, 0)):  # fmt: skip
        if value < least:
            raise ConfigError(
                f"{flag}={value}: must be at least {least}"
                + (" (--matching prefix refuses every ~regex pattern)" if least == 0 else "")
            )
    config = BrokerConfig(Path(args.data_dir), tuple(args.stream), journal=journal, heartbeat_s=args.heartbeat,
                          ttl_s=args.ttl, matching=args.matching, max_message_bytes=args.max_message_bytes,
                          under_replicated=args.under_replicated, max_sessions=args.max_sessions,
                          max_total_subscriptions=args.max_total_subscriptions,
                          max_regex_subscriptions=args.max_regex_subscriptions,
                          max_session_bytes_in_flight=args.max_session_bytes_in_flight,
                          max_bytes_in_flight=args.max_bytes_in_flight,
                          max_memory_bytes=memory_budget() if args.max_memory_bytes is None else args.max_memory_bytes,
                          max_connections=connection_budget() if args.max_connections is None else args.max_connections,
                          replica_catchup_bytes_per_s=int(args.replica_catchup_rate * 1e6) or None)  # fmt: skip
    curve = None
    if args.curve_secret_key:
        clients = Path(args.curve_clients) if args.curve_clients else None
        replicas = Path(args.curve_replicas) if args.curve_replicas else None
        curve = CurveConfig(Path(args.curve_secret_key), clients, replicas)
    registration = None
    if args.zookeeper:
        registration = Registration(args.zookeeper, args.namespace, args.member, args.chroot, args.advertise,
                                    auth=_zookeeper_auth(), partition=args.partition,
                                    ca=read_ca(args.zookeeper_ca or "", source="--zookeeper-ca"))  # fmt: skip
    return config, curve, registration


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config, curve, registration = settings(args)
    except ZepsError as exc:
        print(f"zeps-broker: settings (--segment-bytes, --producer-ttl, --max-producers, --max-message-bytes): "
              f"{exc}", file=sys.stderr)  # fmt: skip
        return 2
    try:
        multicast = multicast_options(args)
        multicast_key = read_key(args.multicast_key_file) if args.multicast_key_file else None
    except ZepsError as exc:
        print(f"zeps-broker: multicast settings: {exc}", file=sys.stderr)
        return 2
    try:
        tiered = tiering(args)
    except ZepsError as exc:
        print(f"zeps-broker: tiered storage settings: {exc}", file=sys.stderr)
        return 2
    server = BrokerServer(config, bind=args.bind, curve=curve, metrics_port=args.metrics_port,
                          metrics_address=args.metrics_address, registration=registration,
                          multicast=multicast, multicast_key=multicast_key,
                          replication=replication(args), tiering=tiered)  # fmt: skip
    # The signal handler only appends to a list. Event.set() there could deadlock: the handler runs in
    # the main thread, possibly inside its own Event.wait() on the same Event, whose lock it then waits
    # for (seen once: a broker that never stopped on SIGTERM).
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _frame: stopping.append(signum))
    signal.signal(signal.SIGINT, lambda signum, _frame: stopping.append(signum))
    try:
        server.start()
    except (ZepsError, OSError, ValueError) as exc:
        print(f"zeps-broker: {exc}", file=sys.stderr)
        return 2
    also = f", multicast on {server.multicast_endpoint}" if server.multicast_endpoint else ""
    print(f"zeps-broker: serving {', '.join(args.stream)} at {server.endpoint}{also}", flush=True)
    while not stopping:
        if server.wait(0):
            break  # the loop ended by itself (removed from the manifest, or failed)
        time.sleep(0.2)  # a signal cuts it short
    if stopping and args.handover_timeout > 0:  # asked to stop (not failed): a replica hands its lead over first
        server.hand_over(args.handover_timeout)
    server.stop()
    if server.failure:  # the loop failed: Kubernetes must see a failure (and restart the pod), never a success
        print(f"zeps-broker: fatal: {server.failure}", file=sys.stderr)
        return 1
    if server.refused:
        print(f"zeps-broker: {server.refused}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
