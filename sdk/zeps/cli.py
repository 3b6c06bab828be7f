"""The ``zeps`` command: publish, consume and inspect Topics, Queues, batch queues and streams.

Settings resolve like the SDK's handles: ``--zookeeper``/``--chroot``/``--endpoint`` flags, then the
environment (``ZEPS_ZOOKEEPER``…), then the resource's status through the Kubernetes API.

Output is for people by default; ``--json`` prints one JSON document per line for scripts.
Exit codes scripts can trust: 0 done; 1 nothing to do within the timeout (empty queue, no message);
2 usage error; 3 configuration or resource error (the message says what to fix); 4 ZooKeeper or
broker unreachable or refusing.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click

from zeps.cli_common import EXIT_EMPTY, emit, reporting_errors
from zeps.errors import ConfigError, SetupError

__all__ = ["cli", "main"]


def _settings(ctx: click.Context) -> dict[str, Any]:
    o = ctx.obj
    out = {k: o[k] for k in ("zookeeper", "zookeeper_ca", "chroot", "endpoint") if o.get(k)}
    if o.get("user"):
        out["auth"] = (o["user"], o["password"] or "")
    return out


@click.group()
@click.option("--namespace", "-n", default=None, help="Namespace of the resources (default: ZEPS_NAMESPACE…).")
@click.option("--zookeeper", default=None, help="ZooKeeper connect string (default: ZEPS_ZOOKEEPER or the status).")
@click.option(
    "--zookeeper-ca",
    default=None,
    help="The servers' TLS CA, a PEM file: speak TLS (default: ZEPS_ZOOKEEPER_CA or the status).",
)
@click.option("--chroot", default=None, help="The installation's ZooKeeper root (default /zeps).")
@click.option("--endpoint", default=None, help="Broker endpoint for stream commands (default: the status).")
@click.option("--user", default=None, help="ZooKeeper digest user, when ACLs are on.")
@click.option("--password", default=None, help="ZooKeeper digest password.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines for scripts.")
@click.version_option(package_name="zeps")
@click.pass_context
def cli(
    ctx: click.Context,
    *,
    namespace: str | None,
    zookeeper: str | None,
    zookeeper_ca: str | None,
    chroot: str | None,
    endpoint: str | None,
    user: str | None,
    password: str | None,
    as_json: bool,
) -> None:
    """zeps: ZooKeeper-coordinated messaging — Topics, Queues and ZepsStreams."""
    ctx.obj = {
        "namespace": namespace,
        "zookeeper": zookeeper,
        "zookeeper_ca": zookeeper_ca,
        "chroot": chroot,
        "endpoint": endpoint,
        "user": user,
        "password": password,
        "json": as_json,
    }


# -- topic ------------------------------------------------------------------------------------------
@cli.group()
def topic() -> None:
    """Broadcast messages to every live subscriber."""


@topic.command("publish")
@click.argument("name")
@click.argument("messages", nargs=-1, required=True)
@click.pass_context
@reporting_errors
def topic_publish(ctx: click.Context, name: str, messages: tuple[str, ...]) -> None:
    """Publish MESSAGES (one per argument) to topic NAME."""
    from zeps.handles import topic as topic_handle  # noqa: PLC0415 — keep `zeps --help` fast

    ids = topic_handle(name, ctx.obj["namespace"], **_settings(ctx)).publish_many([m.encode() for m in messages])
    emit(ctx, "\n".join(ids), {"published": ids})


@topic.command("subscribe")
@click.argument("name")
@click.option("--consumer-id", default=None, help="Durable subscriber id (default: a random one).")
@click.option("--count", type=int, default=0, help="Stop after this many messages (0: until the timeout).")
@click.option("--timeout", type=float, default=10.0, help="Seconds to wait for messages.")
@click.pass_context
@reporting_errors
def topic_subscribe(ctx: click.Context, name: str, consumer_id: str | None, count: int, timeout: float) -> None:
    """Print messages of topic NAME as they arrive."""
    import queue as queue_mod  # noqa: PLC0415
    import time  # noqa: PLC0415

    from zeps.handles import topic as topic_handle  # noqa: PLC0415

    inbox: queue_mod.Queue[Any] = queue_mod.Queue()
    seen = 0
    deadline = time.monotonic() + timeout
    with topic_handle(name, ctx.obj["namespace"], **_settings(ctx)).subscribe(inbox.put, consumer_id=consumer_id):
        while (not count or seen < count) and time.monotonic() < deadline:
            try:
                m = inbox.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue_mod.Empty:
                break
            seen += 1
            emit(
                ctx,
                m.body.decode(errors="replace"),
                {"id": m.id, "body": m.body.decode(errors="replace"), "publisher": m.publisher, "headers": m.headers},
            )
    if seen == 0:
        sys.exit(EXIT_EMPTY)


# -- queue ------------------------------------------------------------------------------------------
@cli.group()
def queue() -> None:
    """Work items, each done by one worker."""


@queue.command("put")
@click.argument("name")
@click.argument("items", nargs=-1, required=True)
@click.option("--priority", type=click.IntRange(0, 999), default=None, help="Lower runs first.")
@click.pass_context
@reporting_errors
def queue_put(ctx: click.Context, name: str, items: tuple[str, ...], priority: int | None) -> None:
    """Add ITEMS (one per argument) to queue NAME."""
    from zeps.handles import queue as queue_handle  # noqa: PLC0415

    ids = queue_handle(name, ctx.obj["namespace"], **_settings(ctx)).put_all(
        [i.encode() for i in items], priority=priority
    )
    emit(ctx, "\n".join(ids), {"put": ids})


@queue.command("take")
@click.argument("name")
@click.option("--count", type=int, default=1, help="How many items to take.")
@click.option("--timeout", type=float, default=5.0, help="Seconds to wait for the first item.")
@click.option("--ack/--release", default=True, help="Ack what was taken (default), or give it back.")
@click.pass_context
@reporting_errors
def queue_take(ctx: click.Context, name: str, count: int, timeout: float, ack: bool) -> None:
    """Take items from queue NAME, print them, and ack them."""
    from zeps.handles import queue as queue_handle  # noqa: PLC0415

    handle = queue_handle(name, ctx.obj["namespace"], **_settings(ctx))
    items = handle.take_many(count, timeout=timeout)
    for item in items:
        emit(
            ctx,
            item.body.decode(errors="replace"),
            {"id": item.id, "body": item.body.decode(errors="replace"), "attempt": item.attempt},
        )
        item.ack() if ack else item.release()
    if not items:
        sys.exit(EXIT_EMPTY)


@queue.command("stats")
@click.argument("name")
@click.pass_context
@reporting_errors
def queue_stats(ctx: click.Context, name: str) -> None:
    """Depth, in-flight, dead-lettered, waiting workers and oldest age of queue NAME."""
    from zeps.handles import queue as queue_handle  # noqa: PLC0415

    stats = queue_handle(name, ctx.obj["namespace"], **_settings(ctx)).stats()
    data = dict(stats.__dict__)
    emit(ctx, "  ".join(f"{k}={v}" for k, v in data.items()), data)


@queue.command("dead-letter")
@click.argument("name")
@click.option("--redrive", is_flag=True, help="Put every dead-lettered item back in the queue.")
@click.pass_context
@reporting_errors
def queue_dead_letter(ctx: click.Context, name: str, redrive: bool) -> None:
    """List the dead letters of queue NAME (or re-drive them)."""
    from zeps.handles import queue as queue_handle  # noqa: PLC0415

    handle = queue_handle(name, ctx.obj["namespace"], **_settings(ctx))
    if redrive:
        moved = handle.redrive()
        emit(ctx, f"re-drove {moved} items", {"redriven": moved})
        return
    for d in handle.dead_letters():
        emit(
            ctx,
            f"{d.id}  attempts={d.attempts}  {d.reason}  {d.body.decode(errors='replace')}",
            {"id": d.id, "attempts": d.attempts, "reason": d.reason, "body": d.body.decode(errors="replace")},
        )


# -- batches ----------------------------------------------------------------------------------------
@cli.group()
def batches() -> None:
    """Replayable batch queues: every consumer at its own pace."""


def _batches(ctx: click.Context, name: str) -> Any:
    from zeps.handles import batches as batches_handle  # noqa: PLC0415

    return batches_handle(name, ctx.obj["namespace"], **_settings(ctx))


@batches.command("publish")
@click.argument("name")
@click.argument("records", nargs=-1, required=True)
@click.pass_context
@reporting_errors
def batches_publish(ctx: click.Context, name: str, records: tuple[str, ...]) -> None:
    """Publish one batch of RECORDS to batch queue NAME."""
    batch_id = _batches(ctx, name).publish([r.encode() for r in records])
    emit(ctx, batch_id, {"batch": batch_id})


@batches.command("consume")
@click.argument("name")
@click.option("--consumer", required=True, help="The consumer's name (its position is kept in ZooKeeper).")
@click.option("--max", "limit", type=int, default=None, help="Process at most this many batches.")
@click.option("--start", type=click.Choice(["earliest", "latest"]), default="earliest", help="For a new consumer.")
@click.pass_context
@reporting_errors
def batches_consume(ctx: click.Context, name: str, consumer: str, limit: int | None, start: str) -> None:
    """Print the batches CONSUMER has not processed yet, and advance its position."""
    processed = (
        _batches(ctx, name)
        .consumer(consumer, start=start)
        .process_available(
            lambda b: emit(
                ctx,
                f"{b.id}: " + " ".join(r.decode(errors="replace") for r in b.records),
                {"batch": b.id, "records": [r.decode(errors="replace") for r in b.records]},
            ),
            limit=limit,
        )
    )
    if processed == 0:
        sys.exit(EXIT_EMPTY)


@batches.command("lag")
@click.argument("name")
@click.pass_context
@reporting_errors
def batches_lag(ctx: click.Context, name: str) -> None:
    """Batches each consumer of NAME still has to process."""
    lag = _batches(ctx, name).lag()
    emit(ctx, "\n".join(f"{c}: {n}" for c, n in sorted(lag.items())) or "no consumers", {"lag": lag})


@batches.command("reset")
@click.argument("name")
@click.option("--consumer", required=True)
@click.option("--to", "to", type=int, required=True, help="The batch number to process next (replay).")
@click.pass_context
@reporting_errors
def batches_reset(ctx: click.Context, name: str, consumer: str, to: int) -> None:
    """Replay: make batch --to the next one CONSUMER processes."""
    _batches(ctx, name).consumer(consumer).reset(to)
    emit(ctx, f"{consumer} will process batch {to} next", {"consumer": consumer, "next": to})


# -- stream -----------------------------------------------------------------------------------------
@cli.group()
def stream() -> None:
    """Journalled pub/sub through a ZEPS broker."""


def _stream_client(
    ctx: click.Context, name: str, producer_id: str | None = None, *, follower_reads: bool = False
) -> Any:
    """A StreamClient, or a PartitionedStreamClient for a stream of several partitions (known from its
    status, ZEPS_STREAM_<NAME>_PARTITIONS, or the partitions its ZooKeeper nodes show)."""
    from zeps.client import PartitionedStreamClient, StreamClient  # noqa: PLC0415
    from zeps.config import resolve  # noqa: PLC0415

    s = resolve("ZepsStream", name, namespace=ctx.obj["namespace"], **_settings(ctx))
    if not s.partitions and s.zookeeper and "partitions" not in s.spec:  # settings without the resource's spec
        s = s.model_copy(update={"partitions": _partition_endpoints(s)})
    if len(s.partitions) > 1 or s.spec.get("partitions", 1) > 1:
        return PartitionedStreamClient.of(s, producer_id=producer_id, follower_reads=follower_reads)
    return StreamClient.of(s, producer_id=producer_id, follower_reads=follower_reads)


def _partition_endpoints(s: Any) -> tuple[str, ...]:
    """A partitioned stream's endpoint of each partition as its brokers advertise them in ZooKeeper
    (its leader's, for a replicated partition); () for a stream of one partition."""
    from zeps.client.discovery import partition_endpoints  # noqa: PLC0415
    from zeps.coordination import connect  # noqa: PLC0415
    from zeps.errors import ZepsError  # noqa: PLC0415

    try:
        client = connect(s.zookeeper, auth=s.auth, ca=s.zookeeper_ca)
    except ZepsError as exc:  # the endpoint given still serves a stream of one partition
        click.echo(f"zeps: could not look for partitions of {s.name} in ZooKeeper ({exc}); using {s.endpoint}",
                   err=True)  # fmt: skip
        return ()
    try:
        return partition_endpoints(client, s.namespace, s.name, chroot=s.chroot)
    finally:
        client.stop()
        client.close()


@stream.command("publish")
@click.argument("name")
@click.argument("key")
@click.argument("bodies", nargs=-1, required=True)
@click.option("--producer-id", default=None,
              help="Publish as this idempotent producer: run again with the same id and BODIES (a retry after a "
              "failure), it publishes only those the broker does not hold yet.")  # fmt: skip
@click.pass_context
@reporting_errors
def stream_publish(
    ctx: click.Context, *, name: str, key: str, bodies: tuple[str, ...], producer_id: str | None
) -> None:
    """Publish BODIES under routing KEY to stream NAME (confirmed by the broker before exiting)."""
    from zeps.client import PartitionedStreamClient  # noqa: PLC0415

    with _stream_client(ctx, name, producer_id) as opened:
        partitioned = isinstance(opened, PartitionedStreamClient)  # every body goes to KEY's partition
        client = opened.clients[opened.partition_of(key)] if partitioned else opened
        held = client.producer_sequence if producer_id else 0  # a named producer: what an earlier run published
        for body in bodies[held:]:
            client.publish(key, body.encode())
        client.flush()
    published = max(len(bodies) - held, 0)
    emit(ctx, f"published {published}" + (f" ({held} held already)" if held else ""),
         {"published": published, "held": held})  # fmt: skip


_FOLLOWER_READS = click.option(
    "--follower-reads", is_flag=True, help="Read a replicated stream from one of its in-sync followers, not its leader."
)


def _print_messages(
    ctx: click.Context, name: str, *, pattern: str, since: Any, count: int, timeout: float, follower_reads: bool = False
) -> None:
    from zeps.client import PartitionedStreamClient, Position, Seq  # noqa: PLC0415

    seen = 0
    with _stream_client(ctx, name, follower_reads=follower_reads) as client:
        partitioned = isinstance(client, PartitionedStreamClient)
        if partitioned and isinstance(since, Seq):
            raise ConfigError(f"stream {name} is partitioned: its sequences are per partition; give --since a time, "
                              'or a position {"last": [<sequence per partition>, ...]}')  # fmt: skip
        if not partitioned and isinstance(since, Position):
            raise ConfigError(f"stream {name} has one partition: give --since a sequence or a time")
        client.start(pattern, since=since)
        while not count or seen < count:
            m = client.receive(timeout)
            if m is None:
                break
            seen += 1
            partition = getattr(m, "partition", None)  # a partitioned stream's: sequences are per partition
            data = {"sequence": m.sequence, "key": m.key, "body": m.body.decode(errors="replace"),
                    "timestamp_ms": m.timestamp_ms}  # fmt: skip
            if partition is not None:
                data = {"partition": partition, **data}
            where = f"{partition}/{m.sequence}" if partition is not None else f"{m.sequence}"
            emit(ctx, f"{where}  {m.key}  {data['body']}", data)
    if seen == 0:
        sys.exit(EXIT_EMPTY)


@stream.command("tail")
@click.argument("name")
@click.option("--pattern", default="", help="Key prefix, or ~regex.")
@click.option("--count", type=int, default=0, help="Stop after this many (0: until quiet for --timeout).")
@click.option("--timeout", type=float, default=10.0)
@_FOLLOWER_READS
@click.pass_context
@reporting_errors
def stream_tail(
    ctx: click.Context, *, name: str, pattern: str, count: int, timeout: float, follower_reads: bool
) -> None:
    """Print new messages of stream NAME as they arrive."""
    _print_messages(ctx, name, pattern=pattern, since="latest", count=count, timeout=timeout,
                    follower_reads=follower_reads)  # fmt: skip


@stream.command("replay")
@click.argument("name")
@click.option("--since", required=True, help="A sequence (replay after it), an ISO time (2026-11-21T10:00:00Z), or "
              'for a partitioned stream a position {"last": [<sequence per partition>, ...]}.')  # fmt: skip
@click.option("--pattern", default="")
@click.option("--count", type=int, default=0)
@click.option("--timeout", type=float, default=3.0, help="Stop when nothing arrives for this long.")
@_FOLLOWER_READS
@click.pass_context
@reporting_errors
def stream_replay(
    ctx: click.Context, *, name: str, since: str, pattern: str, count: int, timeout: float, follower_reads: bool
) -> None:
    """Print messages of stream NAME from --since on."""
    from datetime import datetime  # noqa: PLC0415

    from zeps.client import Position, Seq, Time  # noqa: PLC0415

    if since.isdigit():
        start: Any = Seq(int(since))
    elif since.lstrip().startswith("{"):
        start = Position.from_json(since)
    else:
        try:
            start = Time(datetime.fromisoformat(since.replace("Z", "+00:00")))
        except ValueError:
            raise ConfigError(
                f"--since {since!r}: give a sequence number or an ISO time like 2026-11-21T10:00:00Z"
            ) from None
    _print_messages(ctx, name, pattern=pattern, since=start, count=count, timeout=timeout,
                    follower_reads=follower_reads)  # fmt: skip


def _stream_facts(s: Any, group: str | None) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """What the brokers of each partition of resolved stream ``s`` publish in ZooKeeper, and how
    consumer ``group`` stands (None without one)."""
    from zeps.client.discovery import broker_metadata, partition_count  # noqa: PLC0415
    from zeps.coordination import connect  # noqa: PLC0415
    from zeps.coordination.consumers import describe  # noqa: PLC0415
    from zeps.paths import StreamPaths  # noqa: PLC0415

    zk = connect(s.zookeeper, auth=s.auth, ca=s.zookeeper_ca)
    try:
        count = partition_count(zk, s.namespace, s.name, chroot=s.chroot)
        metas = [broker_metadata(zk, s.namespace, s.name, chroot=s.chroot, partition=p) for p in range(count)]
        paths = StreamPaths.of(s.namespace, s.name, chroot=s.chroot).consumer_group(group) if group else None
        return metas, describe(zk, paths, count) if paths else None
    finally:
        zk.stop()
        zk.close()


@stream.command("lag")
@click.argument("name")
@click.option("--position", default=None,
              help="A consumer's last processed sequence (say, a Spark checkpoint's offset); of a partitioned "
              'stream, its position {"last": [<sequence per partition>, ...]}.')  # fmt: skip
@click.option(
    "--group",
    default=None,
    help="A consumer group of the stream: what it committed of each partition, and who reads it.",
)
@click.pass_context
@reporting_errors
def stream_lag(ctx: click.Context, *, name: str, position: str | None, group: str | None) -> None:
    """How far behind the durable tail of stream NAME (of each of its partitions) its subscriptions
    are, from the facts the brokers publish in ZooKeeper every second (the furthest behind first)."""
    from zeps.client import Position  # noqa: PLC0415
    from zeps.config import resolve  # noqa: PLC0415

    s = resolve("ZepsStream", name, namespace=ctx.obj["namespace"], needs=("zookeeper",), **_settings(ctx))
    metas, described = _stream_facts(s, group)
    count = len(metas)
    if any("lastSequence" not in meta for meta in metas):
        click.echo(f"zeps: the broker of {name} has not published its facts yet; try again in a second", err=True)
        sys.exit(EXIT_EMPTY)
    if position is None:
        positions: list[int] | None = None
    elif count == 1 and position.isdigit():
        positions = [int(position)]
    elif count > 1 and position.lstrip().startswith("{"):
        positions = [Position.from_json(position).after(p) for p in range(count)]
    else:
        want = "a sequence number" if count == 1 else 'a position {"last": [<sequence per partition>, ...]}'
        raise ConfigError(f"--position {position!r}: stream {name} has {count} partition(s); give {want}")
    lines, parts = [], []
    for p, meta in enumerate(metas):
        last, subs = int(meta["lastSequence"]), list(meta.get("subscriptions", []))
        part: dict[str, Any] = {
            "partition": p, "lastSequence": last, "journalBytes": meta.get("journalBytes", 0),
            "subscriptionCount": meta.get("subscriptionCount", len(subs)), "subscriptions": subs,
        }  # fmt: skip
        where = f"stream {s.namespace}/{name}" + (f" partition {p}" if count > 1 else "")
        lines.append(f"{where}: last sequence {last}, {part['journalBytes']} journal bytes, "
                     f"{part['subscriptionCount']} subscriptions")  # fmt: skip
        lines += [f"  {sub['peer'][:8]}#{sub['id']}  pattern {sub['pattern']!r}  lag {sub['lag']}"
                  f"{'  (live)' if sub['live'] else '  (replaying)'}" for sub in subs]  # fmt: skip
        if positions is not None:
            part["positionLag"] = max(0, last - positions[p])
            lines.append(f"  position {positions[p]}: {part['positionLag']} behind")
        if described is not None:
            committed, owner = described["partitions"][p]["committed"], described["partitions"][p]["owner"]
            part["group"] = {"committed": committed, "owner": owner, "lag": max(0, last - committed)}
            lines.append(f"  group {group}: committed {committed}, {part['group']['lag']} behind, "
                         f"read by {owner or 'nobody'}")  # fmt: skip
        parts.append(part)
    data: dict[str, Any] = {"stream": name, **parts[0]} if count == 1 else {"stream": name, "partitions": parts}
    if count > 1 and positions is not None:
        data["positionLag"] = sum(part["positionLag"] for part in parts)
    if described is not None:
        data["group"] = {"name": group, "members": described["members"],
                         "lag": sum(part["group"]["lag"] for part in parts)}  # fmt: skip
        lines.append(f"group {group}: {len(described['members'])} members {', '.join(described['members'])}; "
                     f"{data['group']['lag']} behind in all")  # fmt: skip
    emit(ctx, "\n".join(lines), data)


@stream.command("elect-unclean")
@click.argument("name")
@click.option("--replica", required=True, help="The replica to elect (it must run): it gives up what only the "
              "in-sync replicas held beyond its journal.")  # fmt: skip
@click.option("--partition", type=int, default=0, show_default=True, help="Of a partitioned stream.")
@click.option("--yes", is_flag=True, help="Elect it; without, say only what it would give up.")
@click.pass_context
@reporting_errors
def stream_elect_unclean(ctx: click.Context, *, name: str, replica: str, partition: int, yes: bool) -> None:
    """When no in-sync replica of replicated stream NAME can come back, make REPLICA the only one in
    sync so it leads (Kafka's unclean leader election): the stream serves again and gives up the
    confirmed records only the lost replicas held (at least as many as this prints)."""
    from zeps.config import resolve  # noqa: PLC0415
    from zeps.coordination import connect  # noqa: PLC0415
    from zeps.coordination.replication import elect_unclean  # noqa: PLC0415
    from zeps.paths import StreamPaths  # noqa: PLC0415

    s = resolve("ZepsStream", name, namespace=ctx.obj["namespace"], needs=("zookeeper",), **_settings(ctx))
    zk = connect(s.zookeeper, auth=s.auth, ca=s.zookeeper_ca)
    try:
        paths = StreamPaths.of(s.namespace, s.name, chroot=s.chroot, partition=partition)
        report = elect_unclean(zk, paths, replica, dry_run=not yes)
    finally:
        zk.stop()
        zk.close()
    what = "made the only replica in sync: it leads" if report.written else "would be made the only replica in sync"
    where = f"{s.namespace}/{name}" + (f" partition {partition}" if partition else "")
    text = (f"{replica} {what} epoch {report.epoch + 1} of {where}; in sync were "
            f"{', '.join(sorted(report.in_sync_before))}. "
            f"It holds records up to {report.holds}; the last recorded commit point was {report.recorded}: "
            f"it gives up at least {report.gives_up} confirmed records"
            f"{'' if report.written else ' (run again with --yes to elect it)'}")  # fmt: skip
    emit(ctx, text, {"replica": replica, "epoch": report.epoch + 1, "inSyncBefore": sorted(report.in_sync_before),
                     "holds": report.holds, "recordedCommit": report.recorded, "givesUpAtLeast": report.gives_up,
                     "elected": report.written})  # fmt: skip


# -- status -----------------------------------------------------------------------------------------
_FACTS = {
    "Topic": ("subscribers", "cleanerHolder"),
    "Queue": ("depth", "inFlight", "deadLettered"),
    "ZepsStream": ("endpoint", "lastSequence", "journalBytes"),
}


@cli.command("status")
@click.option("--all-namespaces", "-A", is_flag=True, help="Every namespace, not just --namespace.")
@click.pass_context
@reporting_errors
def status(ctx: click.Context, all_namespaces: bool) -> None:
    """Every Topic, Queue and ZepsStream with its Ready condition and live facts (via Kubernetes)."""
    from zeps.config import default_namespace  # noqa: PLC0415
    from zeps.config.resolver import list_resources  # noqa: PLC0415

    items = list_resources(None if all_namespaces else default_namespace(ctx.obj["namespace"]))
    not_ready = 0
    for item in items:
        meta, st = item["metadata"], item.get("status") or {}
        ready: dict[str, Any] = next((c for c in st.get("conditions", []) if c.get("type") == "Ready"), {})
        facts = {k: st[k] for k in _FACTS[item["kind"]] if k in st}
        not_ready += ready.get("status") != "True"
        human = (
            f"{item['kind']:<11} {meta['namespace']}/{meta['name']:<24} Ready={ready.get('status', 'Unknown'):<7}"
            f" {ready.get('reason', '')}  " + "  ".join(f"{k}={v}" for k, v in facts.items())
        )
        emit(
            ctx,
            human,
            {
                "kind": item["kind"],
                "namespace": meta["namespace"],
                "name": meta["name"],
                "ready": ready.get("status", "Unknown"),
                "reason": ready.get("reason", ""),
                **facts,
            },
        )
    if not items:
        emit(ctx, "no zeps resources", {"resources": 0})
    sys.exit(EXIT_EMPTY if not_ready else 0)


# -- broker -----------------------------------------------------------------------------------------
@cli.command("broker", context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.pass_context
def broker(ctx: click.Context) -> None:
    """Run a ZEPS broker (the same as zeps-broker; see `zeps broker --help`)."""
    from zeps.broker.main import main as broker_main  # noqa: PLC0415

    sys.exit(broker_main(ctx.args))


# -- dev ----------------------------------------------------------------------------------------------
def _attach_dev_commands() -> None:
    """``zeps dev up|down`` (the local stack) belongs to the developer tooling, :mod:`zeps_dev`, which
    only a source checkout has (the wheel and the image leave it out). Attached when importable, by
    name: the runtime packages never import the tooling (an import-linter contract)."""
    try:
        tooling = importlib.import_module("zeps_dev.cli")
    except ModuleNotFoundError as exc:
        if exc.name != "zeps_dev":
            raise

        @cli.command("dev", context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
        @reporting_errors
        def dev() -> None:
            """The local stack (from a zeps source checkout only)."""
            raise SetupError(
                "`zeps dev` runs the local stack from a zeps source checkout: clone the repository and run "
                "`make setup` there (this installation has the runtime only)"
            )

    else:
        cli.add_command(tooling.dev)


_attach_dev_commands()


def main() -> None:
    cli(prog_name="zeps")


if __name__ == "__main__":
    main()
