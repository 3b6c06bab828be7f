"""make bench-tiered: a replay from the object store against the same replay from the local journal.

One ZooKeeper server, one SeaweedFS server (``weed server -s3``, the pinned module, its volumes on the
same disk as the journal), one process. A journal of 8 MiB segments is filled with 200-byte records
and all its closed segments uploaded (``TierUploader``, S3 through the batch store). Then, alternating
round by round: a replay of every uploaded record from the local journal (``Journal.read_chunk`` in
1 MiB chunks, its files in the page cache, as on a broker that just wrote them) and from the store
(``TierReader.read_chunk``, the same chunks: each object fetched, checked, parsed), the reader's cache
empty each round (every object fetched from S3), and once more from its warm cache. Records/s,
medians over the rounds, and the ratios store / local. Also the upload's MB/s. Prints one JSON line
last.

Then publishing with uploads running against without: a ``zeps-broker`` process of its own per run
(8 MiB segments, fsync group), with ``--tier-store`` (its leader's thread uploading each segment as it
closes, local retention deleting it after) or without, alternating run by run; one client in this
process publishes PUBLISH records of 200 bytes in batches of 1,000, a flush (every record confirmed)
every 10,000. Records/s, medians, and the ratio with / without.

Then a manifest of 10,000 runs read whole (as every round read it before) against read again by the
``Manifest`` view (its listing, and only the nodes that changed), medians of 5 alternating rounds.

Goals (issue 51): a replay from the object store at >= 0.5 of one from local disk; publishing with
uploads at >= 0.9 of publishing without.
"""

from __future__ import annotations

import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from zeps.batchstore import open_store
from zeps.client import StreamClient
from zeps.coordination.client import connect
from zeps.journal import Journal, JournalConfig
from zeps.paths import StreamPaths
from zeps.tiering import Manifest, State, TierEntry, TierReader, TierUploader, read_manifest
from zeps.tiering.manifest import encode_entry, node_name, object_key
from zeps_dev import ZooKeeperServer
from zeps_dev.process import free_port, wait_until
from zeps_dev.seaweedfs import SeaweedFS

ROUNDS = int(os.environ.get("ZEPS_BENCH_ROUNDS", "5"))
RECORDS = int(os.environ.get("ZEPS_BENCH_RECORDS", "300000"))
#: runs in the manifest read whole and read again (a year of 1 GiB segments at 30 GB a day)
MANIFEST_ENTRIES = int(os.environ.get("ZEPS_BENCH_MANIFEST_ENTRIES", "10000"))
PUBLISH = int(os.environ.get("ZEPS_BENCH_PUBLISH", "300000"))
BODY = 200


def _replay(read: Any, first: int, last: int) -> tuple[float, int]:
    """(seconds, records) of reading ``first .. last`` in 1 MiB chunks through ``read``."""
    start, count, at = time.perf_counter(), 0, first
    while at <= last:
        chunk = read(at, max_bytes=1 << 20, end=last)
        assert chunk is not None, at
        count += len(chunk)
        at = chunk.last + 1
    return time.perf_counter() - start, count


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="zeps-bench-tiered-") as tmp:
        root = Path(tmp)
        zookeeper = ZooKeeperServer(root / "zk")
        s3 = SeaweedFS(root / "s3")
        zookeeper.start()
        s3.start()
        try:
            s3.create_bucket("tiers")
            os.environ.update(s3.credentials())
            result = _measure(root, zookeeper.connect_string, s3.endpoint)
            result.update(_publishing(root, zookeeper.connect_string, s3.endpoint))
            result.update(_manifest_reads(zookeeper.connect_string))
        finally:
            s3.stop()
            zookeeper.stop()
    print(json.dumps(result))


def _measure(root: Path, connect_string: str, endpoint: str) -> dict[str, Any]:
    zk = connect(connect_string)
    journal = Journal(root / "journal", JournalConfig(segment_bytes=8 << 20, fsync="never")).open()
    body = os.urandom(BODY)
    for i in range(0, RECORDS, 1000):
        journal.append_many([(f"key.{(i + n) % 1000}", body) for n in range(min(1000, RECORDS - i))])
    journal.sync()
    paths = StreamPaths.of("bench", "tiered")
    store = open_store("s3://tiers/bench", endpoint=endpoint)
    uploader = TierUploader(zk, paths, store, epoch=1)
    start, uploaded = time.perf_counter(), 0
    for _ in range(len(journal.closed_segments()) + 1):
        step = uploader.step(journal.closed_segments(), journal.durable, now_ms=0)
        assert not step.error, step.error
        if step.uploaded is None:
            break
        uploaded += step.uploaded.size
    upload_s = time.perf_counter() - start
    last = step.tiered_to
    local, cold, warm = [], [], []
    for n in range(ROUNDS):
        seconds, count = _replay(journal.read_chunk, 1, last)
        local.append(count / seconds)
        reader = TierReader(zk, paths, store, cache=root / f"cache-{n}")
        reader.refresh()
        seconds, count = _replay(reader.read_chunk, 1, last)
        cold.append(count / seconds)
        assert reader.fetches == len(reader.refresh())
        again = TierReader(zk, paths, store, cache=root / f"cache-{n}")
        again.refresh()
        seconds, count = _replay(again.read_chunk, 1, last)
        warm.append(count / seconds)
        assert again.fetches == 0
    journal.close()
    zk.stop()
    med = {name: statistics.median(v) for name, v in (("local", local), ("store", cold), ("cache", warm))}
    return {
        "benchmark": "tiered",
        "records": last,
        "record_bytes": BODY,
        "rounds": ROUNDS,
        "upload_mb_s": round(uploaded / upload_s / 1e6, 1),
        "replay_local_records_s": round(med["local"]),
        "replay_store_records_s": round(med["store"]),
        "replay_cache_records_s": round(med["cache"]),
        "store_over_local": round(med["store"] / med["local"], 2),
        "cache_over_local": round(med["cache"] / med["local"], 2),
        "goal_store_over_local": 0.5,
    }


def _publish_rate(root: Path, connect_string: str, namespace: str, tier: list[str]) -> float:
    """Records/s of publishing PUBLISH records into a broker process of its own (``tier``: its
    --tier-store flags, or none)."""
    port = free_port()
    argv = [sys.executable, "-m", "zeps.broker.main", "--stream", "pub", "--data-dir", str(root / namespace),
            "--bind", f"tcp://127.0.0.1:{port}", "--zookeeper", connect_string, "--namespace", namespace,
            "--member", "pub-0", "--segment-bytes", str(8 << 20), "--fsync", "group", "--log-level", "WARNING",
            *tier]  # fmt: skip
    with (root / f"{namespace}.log").open("wb") as log:
        broker = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: _listening(port), timeout=60, what=f"the broker of {namespace}")
        body = os.urandom(BODY)
        with StreamClient(f"tcp://127.0.0.1:{port}", "pub", timeout=120) as client:
            start = time.perf_counter()
            for i in range(0, PUBLISH, 1000):
                client.publish_many([(f"key.{(i + n) % 1000}", body) for n in range(1000)])
                if (i + 1000) % 10_000 == 0:
                    client.flush()
            client.flush()
            return PUBLISH / (time.perf_counter() - start)
    finally:
        broker.terminate()
        broker.wait(30)


def _listening(port: int) -> bool:
    import socket  # noqa: PLC0415

    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _manifest_reads(connect_string: str) -> dict[str, Any]:
    """A manifest of MANIFEST_ENTRIES runs read whole (every node: ``read_manifest``, what each round
    read before) against read again by a :class:`~zeps.tiering.Manifest` (a listing, and the nodes
    that changed: here none), alternating, medians over 5 rounds."""
    zk = connect(connect_string)
    paths = StreamPaths.of("bench", "manifest")
    zk.ensure_path(paths.tier_segments)
    for start in range(0, MANIFEST_ENTRIES, 500):
        transaction = zk.transaction()
        for i in range(start, min(start + 500, MANIFEST_ENTRIES)):
            first = i * 1000 + 1
            entry = TierEntry(first, first + 999, 1, object_key(first, first + 999, 1, secrets.token_hex(8)),
                              State.COPY_FINISHED, 1, 2, 1 << 20, "s3://tiers/x.batch#crc32c=00000000")  # fmt: skip
            transaction.create(f"{paths.tier_segments}/{node_name(entry)}", encode_entry(entry))
        transaction.commit()
    manifest = Manifest(zk, paths)
    manifest.read()
    whole, again = [], []
    for _ in range(5):
        began = time.perf_counter()
        entries, _ = read_manifest(zk, paths)
        whole.append(time.perf_counter() - began)
        began = time.perf_counter()
        cached, _ = manifest.read()
        again.append(time.perf_counter() - began)
        assert cached == entries
    zk.stop()
    full, cached_s = statistics.median(whole), statistics.median(again)
    return {"manifest_entries": MANIFEST_ENTRIES, "manifest_full_read_s": round(full, 3),
            "manifest_read_again_s": round(cached_s, 4), "manifest_read_ratio": round(full / cached_s, 1)}  # fmt: skip


def _publishing(root: Path, connect_string: str, endpoint: str) -> dict[str, Any]:
    plain, tiered = [], []
    for n in range(ROUNDS):
        tier = ["--tier-store", f"s3://tiers/pub-{n}", "--tier-store-endpoint", endpoint,
                "--local-retention-bytes", "1"]  # fmt: skip
        runs = [("plain", []), ("tiered", tier)]
        for mode, flags in runs if n % 2 == 0 else runs[::-1]:
            rate = _publish_rate(root, connect_string, f"bench-{mode}-{n}", flags)
            (plain if mode == "plain" else tiered).append(rate)
    with_uploads, without = statistics.median(tiered), statistics.median(plain)
    return {
        "published_records": PUBLISH,
        "publish_records_s": round(without),
        "publish_with_uploads_records_s": round(with_uploads),
        "uploads_over_none": round(with_uploads / without, 2),
        "goal_uploads_over_none": 0.9,
    }


if __name__ == "__main__":
    main()
