"""``make bench-partitions``: a partitioned ZepsStream with 1, 2 and 4 partitions, one run, one machine.

Each partition is a ``zeps-broker --partition p`` process (fsync=group, registered in a real
ZooKeeper) on 127.0.0.1; 100-byte messages under 1,000 keys, so every partition gets its share.

* **Publish**: ``PUBLISHERS`` publisher processes, each a ``PartitionedStreamClient`` publishing
  ``publish_many`` bursts and flushing (every message confirmed): the aggregate rate, and the CPU µs
  per message of each broker (from /proc) and of the publishers.
* **Fan-out 1 -> 10**: ten subscriber processes each reading every partition while one publisher
  publishes: deliveries per second, in all.
* **Spark read**: the same rows read by a Spark batch query from a stream of 1 partition, one of 4,
  and JSON-lines files (:func:`spark_reads`).

The rounds alternate the partition counts (``ROUNDS`` each, medians). The machine's cores are
printed: on 2 cores the publishers, the brokers and the subscribers share them, so a second
partition adds a broker but no core. The last line is one JSON object.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from workers import finish, local_spark
from zeps_dev import ZooKeeperServer
from zeps_dev.process import cpu_seconds, free_port

HERE = Path(__file__).parent
COUNTS = (1, 2, 4)
ROUNDS = int(os.environ.get("ZEPS_BENCH_ROUNDS", "3"))
PUBLISH_COUNT = int(os.environ.get("ZEPS_BENCH_COUNT", "600000"))  # in all, over the publishers
PUBLISHERS = 2
FANOUT, FANOUT_COUNT = 10, 30_000
CHROOT = "/bench"
SPARK_N = int(os.environ.get("ZEPS_BENCH_SPARK_N", "1000000"))  # rows the Spark reads take (0: no Spark part)
BODY = "x" * 100


class Partitions:
    """A broker per partition, registered in ZooKeeper under the stream's partition nodes."""

    def __init__(self, zk: ZooKeeperServer, tmp: Path, count: int, stream: str = "orders") -> None:
        self.endpoints: list[str] = []
        self.procs: list[subprocess.Popen[str]] = []
        try:
            for p in range(count):  # each port chosen once the brokers before hold theirs: no two alike
                endpoint = f"tcp://127.0.0.1:{free_port()}"
                argv = [sys.executable, "-m", "zeps.broker.main", "--stream", stream, "--data-dir", str(tmp / f"p{p}"),
                        "--bind", endpoint, "--fsync", "group", "--zookeeper", zk.connect_string, "--chroot", CHROOT,
                        "--namespace", "bench", "--member", f"b{p}", "--partition", str(p),
                        "--log-level", "WARNING"]  # fmt: skip
                proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
                self.procs.append(proc)
                assert proc.stdout is not None
                line = proc.stdout.readline()
                if "serving" not in line:
                    raise SystemExit(f"partition {p}'s broker did not start: {line!r}")
                self.endpoints.append(endpoint)
        except BaseException:
            self.stop()  # the brokers started so far
            raise

    def cpu(self) -> list[float]:
        return [cpu_seconds(p.pid) for p in self.procs]

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)


def _workers(role: str, endpoints: list[str], count: int, n: int) -> list[subprocess.Popen[str]]:
    """``n`` worker processes of ``role``, each connected and ready (publishers then wait for "go")."""
    argv = [sys.executable, str(HERE / "partition_worker.py"), role, "--endpoints", ",".join(endpoints),
            "--count", str(count)]  # fmt: skip
    procs = [subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for _ in range(n)]
    for proc in procs:
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        if line != "ready":
            raise SystemExit(f"{role} worker failed to start: {line!r}")
    return procs


def _go(procs: list[subprocess.Popen[str]]) -> None:
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()


def publish(system: Partitions) -> dict[str, float]:
    """PUBLISHERS processes publish PUBLISH_COUNT messages in all, started together: the rate from
    the first start to the last confirmation, and CPU µs per message of the brokers (their mean) and
    of the publishers."""
    each = PUBLISH_COUNT // PUBLISHERS
    total = each * PUBLISHERS
    procs = _workers("publish", system.endpoints, each, PUBLISHERS)
    before = system.cpu()
    _go(procs)
    results = finish(procs)  # done <start> <end> <cpu seconds>
    after = system.cpu()
    start, end = min(r[0] for r in results), max(r[1] for r in results)
    per_broker = total / len(before)  # each broker's share of the messages
    return {
        "per_s": total / (end - start),
        "broker_cpu_us": statistics.mean((a - b) / per_broker * 1e6 for a, b in zip(after, before, strict=True)),
        "publisher_cpu_us": sum(r[2] for r in results) / total * 1e6,
    }


def fanout(system: Partitions) -> float:
    subs = _workers("subscribe", system.endpoints, FANOUT_COUNT, FANOUT)
    publisher = _workers("publish", system.endpoints, FANOUT_COUNT, 1)
    _go(publisher)
    [pub] = finish(publisher)
    end = max(r[0] for r in finish(subs))
    return FANOUT * FANOUT_COUNT / (end - pub[0])


def spark_reads(zk: ZooKeeperServer, tmp: Path) -> dict[str, float]:
    """The same SPARK_N rows read by a Spark batch query (``local[2]``; count and the sum of body
    lengths, so every row is built) from a stream of 1 partition, a stream of 4, and JSON-lines files
    (Spark's json source, the baseline of ``make bench-spark``). Each read once to warm up, then three
    rounds taking turns; rows/s of the best of each. The zeps reads have 4 input partitions each
    (partitionSize SPARK_N / 4): the 1-partition stream's four ranges come from one broker, the
    4-partition stream's from four."""
    from pyspark.sql import functions as sf  # noqa: PLC0415 — only this part needs the JVM

    from zeps.client import PartitionedStreamClient  # noqa: PLC0415
    from zeps.client.discovery import read_broker_metadata  # noqa: PLC0415
    from zeps_dev.process import wait_until  # noqa: PLC0415

    rows = [(f"k.{i % 1000}", BODY) for i in range(SPARK_N)]
    (tmp / "json").mkdir()
    for f in range(8):
        with open(tmp / "json" / f"part-{f}.json", "w") as out:
            out.writelines(json.dumps({"key": k, "body": b}) + "\n" for k, b in rows[f::8])
    systems = {n: Partitions(zk, tmp / f"spark-{n}", n, stream=f"spark{n}") for n in (1, 4)}
    try:
        for n, system in systems.items():
            with PartitionedStreamClient(system.endpoints, f"spark{n}", timeout=300) as client:
                client.publish_many((k, b.encode()) for k, b in rows)
                client.flush(timeout=300)

            def facts_say_all(n: int = n) -> bool:  # the source reads each partition's tail there
                tails = [read_broker_metadata(zk.connect_string, "bench", f"spark{n}", chroot=CHROOT, partition=p)
                         .get("lastSequence", 0) for p in range(n)]  # fmt: skip
                return sum(int(t) for t in tails) == SPARK_N

            wait_until(facts_say_all, timeout=60, what=f"the brokers of spark{n} to publish their tails")
        spark = local_spark()

        def zeps_df(n: int) -> Any:
            return (spark.read.format("zeps").schema("key string, body binary").option("stream", f"spark{n}")
                    .option("namespace", "bench").option("zookeeper", zk.connect_string).option("chroot", CHROOT)
                    .option("endpoint", systems[n].endpoints[0]).option("partitionSize", str(SPARK_N // 4))
                    .load())  # fmt: skip

        def timed(df: Any) -> tuple[float, int]:
            start = time.monotonic()
            row = df.agg(sf.count("*").alias("n"), sf.sum(sf.length("body")).alias("b")).collect()[0]
            return time.monotonic() - start, int(row["n"])

        frames = {"json": spark.read.schema("key string, body string").json(str(tmp / "json")),
                  "1": zeps_df(1), "4": zeps_df(4)}  # fmt: skip
        for df in frames.values():
            timed(df)
        brokers_before = {n: sum(system.cpu()) for n, system in systems.items()}
        rounds = [{name: timed(df) for name, df in frames.items()} for _ in range(3)]
        broker_cpu = {n: sum(system.cpu()) - brokers_before[n] for n, system in systems.items()}  # 3 reads each
        spark.stop()
    finally:
        for system in systems.values():
            system.stop()
    best = {name: min(r[name] for r in rounds) for name in frames}
    assert all(n == SPARK_N for _s, n in best.values()), best
    rate = {name: SPARK_N / s for name, (s, _n) in best.items()}
    return {"spark_rows": SPARK_N, "spark_json_rows_per_s": rate["json"], "spark_rows_per_s_1": rate["1"],
            "spark_rows_per_s_4": rate["4"], "spark_4_vs_1": rate["4"] / rate["1"],
            "spark_1_vs_json": rate["1"] / rate["json"], "spark_4_vs_json": rate["4"] / rate["json"],
            # the brokers' CPU for a read (all of a stream's brokers), µs per row: what serving replay costs
            "spark_broker_cpu_us_per_row_1": broker_cpu[1] / (3 * SPARK_N) * 1e6,
            "spark_broker_cpu_us_per_row_4": broker_cpu[4] / (3 * SPARK_N) * 1e6}  # fmt: skip


def main() -> None:
    samples: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="zeps-bench-partitions-") as name:
        tmp = Path(name)
        zk = ZooKeeperServer(tmp / "zk")
        zk.start()
        try:
            for round_ in range(ROUNDS):
                for count in COUNTS:
                    system = Partitions(zk, tmp / f"r{round_}-{count}", count)
                    try:
                        result = publish(system)
                        for key, value in result.items():
                            samples.setdefault(f"publish_{key}_{count}", []).append(value)
                        samples.setdefault(f"fanout_deliveries_per_s_{count}", []).append(fanout(system))
                    finally:
                        system.stop()
                    print(json.dumps({"round": round_, "partitions": count,
                                      **{k: round(v, 2) for k, v in result.items()}}), flush=True)  # fmt: skip
            spark = spark_reads(zk, tmp) if SPARK_N else {}
            print(json.dumps({k: round(v, 3) for k, v in spark.items()}), flush=True)
        finally:
            zk.stop()
    out: dict[str, Any] = {"scenario": "partitions", "cores": os.cpu_count(), "publishers": PUBLISHERS,
                           "rounds": ROUNDS}  # fmt: skip
    out.update({k: round(statistics.median(v), 2) for k, v in sorted(samples.items())})
    if ROUNDS:  # ZEPS_BENCH_ROUNDS=0: the Spark part alone
        out["publish_2_vs_1"] = round(out["publish_per_s_2"] / out["publish_per_s_1"], 3)
        out["publish_4_vs_1"] = round(out["publish_per_s_4"] / out["publish_per_s_1"], 3)
        out["fanout_2_vs_1"] = round(out["fanout_deliveries_per_s_2"] / out["fanout_deliveries_per_s_1"], 3)
    out.update({k: round(v, 3) for k, v in spark.items()})
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
