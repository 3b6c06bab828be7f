"""make bench-multicast: one broker, 1 and 10 receivers, its multicast output against ZEPS fan-out.

A lab of network namespaces (``zeps_dev.netlab``: a bridge, a host per process): the broker and the
publisher in host 0, each receiver in a host of its own, so every delivery crosses the bridge as it
would cross a network. Four runs, each on a fresh broker (``--fsync never``: the disk is not
measured) with ``RECORDS`` 100-byte records published at ``RATE`` per second (a rate the receivers
keep up with on these 2 cores, so no multicast receiver falls back to fetching and the broker does
the same work in every run):

* multicast: receivers subscribe with ``subscribe_multicast`` over EPGM (PGM in UDP; history from
  the journal first, then the group);
* unicast: receivers subscribe with ``subscribe`` (the broker sends each its own DELIVER-RUNs).

Reported per run: deliveries per second (records received by all receivers / the seconds from the
first record to the last) and the broker's CPU seconds per million records published (user + system,
/proc/<pid>/stat, from before publishing to the last receiver's end). The ratio that matters is the
broker's CPU per record with 10 receivers against 1: a multicast broker sends each record once
whatever the receivers. Prints one JSON line last. Needs root (network namespaces).
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path

from zeps_dev.netlab import NetLab, available
from zeps_dev.process import cpu_seconds

RECORDS, RATE = 60_000, 6_000  # 10 s of publishing
PORT = 5555
TRANSPORT = "epgm"


def run(role: str, receivers: int, tmp: Path) -> dict[str, float]:
    """One broker, ``receivers`` receivers subscribing by ``role`` (multicast or unicast)."""
    with NetLab(hosts=1 + receivers) as lab:
        group = f"239.192.{lab.net}.{receivers}"
        multicast = f"{TRANSPORT}://{group}:{6000 + lab.net}"
        endpoint = f"tcp://{lab.address(0)}:{PORT}"
        data = tmp / f"{role}-{receivers}"
        output = ["--multicast", multicast] if role == "multicast" else []  # the baseline broker has none
        broker = lab.process(0, "broker", [sys.executable, "-m", "zeps.broker.main", "--stream", "prices",
                                           "--data-dir", str(data / "journal"), "--bind", endpoint, "--fsync", "never",
                                           *output, "--log-level", "WARNING"],
                             log_path=data / "broker.log")  # fmt: skip
        broker.wait_ready(lambda: "zeps-broker: serving" in broker.log_path.read_text(), timeout=30)
        common = ["--endpoint", endpoint, "--count", str(RECORDS), "--rate", str(RATE), "--timeout", "300"]
        worker = [sys.executable, "-m", "zeps_dev.multicast_worker"]
        procs = []
        for host in range(1, 1 + receivers):
            extra = ["--multicast", json.dumps({"transport": TRANSPORT, "group": group, "port": 6000 + lab.net})]
            argv = [*worker, role, *common, *(extra if role == "multicast" else [])]
            procs.append(lab.process(host, f"{role}-{host}", argv, log_path=data / f"receiver-{host}.log"))
        for proc in procs:
            proc.json_line("ready", timeout=60)
        assert broker.pid is not None
        before = cpu_seconds(broker.pid)
        publisher = lab.process(0, "publisher", [*worker, "publish", *common], log_path=data / "publisher.log")
        publisher.json_line("published", timeout=300)
        results = [proc.json_line("ranges", timeout=300) for proc in procs]
        used = cpu_seconds(broker.pid) - before
    for result in results:
        if result["count"] != RECORDS or result["ranges"] != [[1, RECORDS]]:
            raise SystemExit(f"a {role} receiver got {result['count']} of {RECORDS} records: {result}")
    seconds = max(r["seconds"] for r in results)
    out = {
        "deliveries_per_s": round(receivers * RECORDS / seconds),
        "broker_cpu_s_per_million": round(used / RECORDS * 1e6, 2),
    }
    if role == "multicast":  # where the receivers' records came from: the group, or fetches
        out["fetched_records"] = sum(r["fetched_records"] for r in results)
    return out


def main() -> None:
    why = available()
    if why is not None:
        raise SystemExit(f"bench-multicast: {why}")
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="zeps-bench-multicast-") as tmp:
        for role in ("multicast", "unicast"):
            for receivers in (1, 10):
                started = time.monotonic()
                results[f"{role}_{receivers}"] = result = run(role, receivers, Path(tmp))
                print(json.dumps({"run": f"{role}_{receivers}", "seconds": round(time.monotonic() - started, 1),
                                  **result}), flush=True)  # fmt: skip
    cpu = {key: value["broker_cpu_s_per_million"] for key, value in results.items()}
    print(json.dumps({
        "scenario": "multicast",
        "transport": TRANSPORT,
        "records": RECORDS,
        "rate_per_s": RATE,
        **{f"{key}_deliveries_per_s": value["deliveries_per_s"] for key, value in results.items()},
        **{f"{key}_broker_cpu_s_per_million": value for key, value in cpu.items()},
        "multicast_10_vs_1_broker_cpu": round(cpu["multicast_10"] / cpu["multicast_1"], 3),
        "unicast_10_vs_1_broker_cpu": round(cpu["unicast_10"] / cpu["unicast_1"], 3),
        "multicast_fetched_records": {k: v["fetched_records"] for k, v in results.items() if "fetched_records" in v},
    }))  # fmt: skip


if __name__ == "__main__":
    main()
