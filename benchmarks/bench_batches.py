"""make bench-batches: a batch queue's large batches through the S3 store and the file store, side by side.

One ZooKeeper server, one SeaweedFS server (``weed server -s3``, the pinned module; its volumes on
the same disk as the file store's directory), one process. For 1 MiB and 64 MiB batches (one record
each), alternating the two stores round by round: publish throughput (``BatchQueue.publish``:
encode, store the object, then its reference in ZooKeeper; the file store fsyncs the object and its
directory), read throughput (``BatchQueue.read``, one batch at a time, in sequence: the reference,
the object, its CRC32C, the decode; reading in sequence, the S3 store fetches the next object ahead)
and consume throughput (a consumer's ``process_available`` with its default read-ahead of 2 batches
and a handler that does nothing: how a consumer reads) in MB/s of batch payload, and the ratios
S3 / file. The file store's reads come from the page cache, as they do on a node that just wrote the
batches; SeaweedFS's volume reads do too, behind its HTTP gateway and filer. Medians over the
rounds. Also the CPU seconds of this process and of the server per GB read (both passes), which say
where the time goes. Prints one JSON line last.

Goal (issue 31): the S3 store reads at >= 0.5 of the file store on this machine.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient

from zeps.coordination.batches import BatchQueue
from zeps.options import BatchOptions
from zeps_dev import ZooKeeperServer
from zeps_dev.process import cpu_seconds
from zeps_dev.seaweedfs import SeaweedFS

ROUNDS = int(os.environ.get("ZEPS_BENCH_ROUNDS", "5"))
#: batch size (bytes) -> batches per round (64 MiB each way per round for the small ones, 512 MiB for the
#: large ones: a consume of 4 large batches took under half a second, and its ratio swung by a fifth)
SIZES = {1 << 20: 64, 64 << 20: 8}


def _run(queue: BatchQueue, size: int, count: int, server_pid: int | None) -> dict[str, float]:
    record = os.urandom(size)
    start = time.perf_counter()
    ids = [queue.publish([record]) for _ in range(count)]
    publish_s = time.perf_counter() - start
    numbers = [int(i.rpartition("-")[2]) for i in ids]
    cpu0, server0 = time.process_time(), cpu_seconds(server_pid) if server_pid else 0.0
    start = time.perf_counter()
    for n in numbers:
        assert len(queue.read(n).records[0]) == size
    read_s = time.perf_counter() - start
    consumer = queue.consumer("bench")
    consumer.register("earliest")
    start = time.perf_counter()
    assert consumer.process_available(lambda batch: None) == count
    consume_s = time.perf_counter() - start
    gb = 2 * size * count / 1e9  # the CPU figures cover both passes: the reads and the consume
    return {
        "publish_mb_s": size * count / 1e6 / publish_s,
        "read_mb_s": size * count / 1e6 / read_s,
        "consume_mb_s": size * count / 1e6 / consume_s,
        "reader_cpu_s_per_gb": (time.process_time() - cpu0) / gb,
        "server_cpu_s_per_gb": ((cpu_seconds(server_pid) - server0) / gb) if server_pid else 0.0,
    }


def main() -> None:
    results: dict[str, dict[int, list[dict[str, float]]]] = {"s3": {}, "file": {}}
    with tempfile.TemporaryDirectory(prefix="zeps-bench-batches-") as name:
        tmp = Path(name)
        with ZooKeeperServer(tmp / "zk") as zk, SeaweedFS(tmp / "s3") as s3:
            s3.create_bucket("bench")
            os.environ.update(s3.credentials())
            client = KazooClient(hosts=zk.connect_string)
            client.start(15)
            stores: dict[str, dict[str, Any]] = {
                "s3": {"store_url": "s3://bench/batches", "store_endpoint": s3.endpoint},
                "file": {"store_url": (tmp / "file-store").as_uri()},
            }
            assert s3._process is not None
            for round_ in range(ROUNDS):
                for size, count in SIZES.items():
                    for kind, store in stores.items():
                        options = BatchOptions.make(inline_max_bytes=1024, retention_seconds=0, **store)
                        queue = BatchQueue(client, f"{kind}-{size}-{round_}", chroot="/bench", options=options)
                        pid = s3._process.pid if kind == "s3" else None
                        result = _run(queue, size, count, pid)
                        results[kind].setdefault(size, []).append(result)
                        print(json.dumps({"round": round_, "store": kind, "batch_mib": size >> 20,
                                          **{k: round(v, 1) for k, v in result.items()}}), flush=True)  # fmt: skip
            client.stop()
    out: dict[str, Any] = {"scenario": "batches", "rounds": ROUNDS, "cores": os.cpu_count()}
    for size in SIZES:
        mib = size >> 20
        for kind in ("s3", "file"):
            for figure in ("publish_mb_s", "read_mb_s", "consume_mb_s", "reader_cpu_s_per_gb", "server_cpu_s_per_gb"):
                if figure == "server_cpu_s_per_gb" and kind == "file":
                    continue
                out[f"{kind}_{mib}mib_{figure}"] = round(statistics.median(r[figure] for r in results[kind][size]), 2)
        for figure in ("read", "consume", "publish"):
            out[f"{mib}mib_{figure}_s3_vs_file"] = round(
                out[f"s3_{mib}mib_{figure}_mb_s"] / out[f"file_{mib}mib_{figure}_mb_s"], 3
            )
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
