"""make bench-fsync: what each ``fsync`` policy costs a message's publish->deliver time (issue 33).

Live deliveries wait for the journal's sync (a subscriber never sees a record a machine crash could
take back), so at a low rate, where every message arrives alone and is synced alone, the disk's sync
is in each message's latency. This measures it: one publish per message at 1,000 msgs/s for 5 s
(``bench_stream``'s latency scenario), on a fresh broker with each policy (``group``, the default;
``always``; ``never``) and on the floor (raw pyzmq PUB -> a relay process -> SUB, the same hops with
no journal and no protocol), the four interleaved, ``ROUNDS`` rounds; p50, p99 and p99.9 in ms.
Beside them, the disk: one ``fdatasync`` after each 100-byte append, 1 ms apart, into a growing file
(what the journal does) and into space written beforehand, p50/p99 in µs. Medians over the rounds;
prints one JSON line last.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_stream import Zeps, ZmqRelay, latency

ROUNDS = int(os.environ.get("ZEPS_BENCH_ROUNDS", "3"))
POLICIES = ("group", "always", "never")
SYNCS = 2000


def fdatasync_us(path: Path, *, written_before: bool) -> tuple[float, float]:
    """p50 and p99 (µs) of an fdatasync after each 100-byte append, 1 ms apart."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        if written_before:  # the blocks and the file's size exist: a sync writes data, no metadata
            os.write(fd, bytes(SYNCS * 100 + 4096))
            os.fsync(fd)
            os.lseek(fd, 0, os.SEEK_SET)
        took = []
        for _ in range(SYNCS):
            os.write(fd, b"x" * 100)
            began = time.perf_counter()
            os.fdatasync(fd)
            took.append((time.perf_counter() - began) * 1e6)
            time.sleep(0.001)
    finally:
        os.close(fd)
    took.sort()
    return took[len(took) // 2], took[len(took) * 99 // 100]


def main() -> None:
    runs: dict[str, list[dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory(prefix="zeps-bench-fsync-") as name:
        tmp = Path(name)
        for round_ in range(ROUNDS):
            for policy in (*POLICIES, "floor"):
                system: Any = ZmqRelay() if policy == "floor" else Zeps(tmp / f"{policy}-{round_}", fsync=policy)
                try:
                    result = latency(system, "zmq" if policy == "floor" else "zeps", 1000)
                finally:
                    system.stop()
                result.pop("p99_per_second")
                runs.setdefault(policy, []).append(result)
                print(json.dumps({"round": round_, "policy": policy, **result}), flush=True)
        disk = {
            "append": [fdatasync_us(tmp / "append", written_before=False) for _ in range(ROUNDS)],
            "written_before": [fdatasync_us(tmp / "written", written_before=True) for _ in range(ROUNDS)],
        }
    out: dict[str, Any] = {"scenario": "fsync", "rounds": ROUNDS, "rate": 1000, "cores": os.cpu_count()}
    for policy, results in runs.items():
        for figure in ("p50", "p99", "p99.9"):
            out[f"{policy}_{figure}_ms"] = round(statistics.median(r[figure] for r in results), 3)
    for kind, figures in disk.items():
        out[f"fdatasync_{kind}_p50_us"] = round(statistics.median(f[0] for f in figures))
        out[f"fdatasync_{kind}_p99_us"] = round(statistics.median(f[1] for f in figures))
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
