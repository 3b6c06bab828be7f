"""``make bench-roll``: a rolling restart of a replicated stream, with the lead handed over and without.

Three ``zeps-broker --min-insync 2`` replicas and a real ZooKeeper (tickTime 500, sessions of the
brokers' default 4 s). An idempotent publisher confirms a group of 5 messages at a time, as fast as
it can, while each replica is stopped with SIGTERM and started again, followers first and the
leader last (as a StatefulSet's rollout; the operator's data-aware roll orders them so). Per
restarted replica: the longest a publisher waited for a confirmation, from the SIGTERM until it is
back in sync.

Two set-ups in alternating rounds, same run: the brokers as shipped (a stopping replica leaves the
election line, a follower the in-sync set, and a leader hands its lead to an in-sync follower first:
``BrokerServer.hand_over``), and the baseline ``--handover-timeout 0`` (it just stops: its session's
close elects the next leader; clients find out when their connection drops). The figure is the ratio
of their medians. As shipped, the replicas also name r0 their preferred leader (as the operator
names one): r0 leads before the roll, and once it is back in sync after its restart the interim
leader gives the lead back to it, a second hand-over, measured too (``give_back``: the longest wait
for a confirmation from r0 back in sync until it leads and 20 more groups are confirmed). The last
line is one JSON object.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench_replication import ZepsReplicas
from zeps.errors import ZepsError
from zeps_dev import ZooKeeperServer
from zeps_dev.process import wait_until

ROUNDS = int(os.environ.get("ZEPS_BENCH_ROUNDS", "3"))  # per set-up, alternating


def roll(zk: ZooKeeperServer, tmp: Path, *, handover: bool) -> dict[str, list[float]]:
    """One roll of three replicas; the longest confirmation wait per restarted replica, by role."""
    replicas = ZepsReplicas(zk, tmp, extra=("--preferred-leader", "r0") if handover else ("--handover-timeout", "0"))
    confirmed: list[float] = []
    stop = threading.Event()
    errors: list[str] = []

    def publish() -> None:
        try:
            with replicas.client(producer_id="roll") as client:
                n = 0
                while not stop.is_set():
                    for _ in range(5):
                        n += 1
                        client.publish("k", b"%d" % n)
                    client.flush(timeout=60)
                    confirmed.append(time.monotonic())
        except ZepsError as exc:
            errors.append(str(exc))

    publisher = threading.Thread(target=publish, daemon=True)
    publisher.start()
    waits: dict[str, list[float]] = {"leader": [], "follower": [], "give_back": []}

    def longest_wait(began: float, more: int = 20) -> float:
        """The longest gap between confirmations from ``began`` until ``more`` groups after now."""
        count = len(confirmed)
        wait_until(lambda: len(confirmed) > count + more, timeout=60, what="confirming again")
        times = [began, *(t for t in confirmed if began < t <= time.monotonic())]
        return max(b - a for a, b in itertools.pairwise(times))

    try:
        wait_until(lambda: len(confirmed) > 50, timeout=60, what="the publisher confirming")
        if handover:  # the lead goes to the preferred replica first (two looks, 5 s apart)
            wait_until(lambda: replicas.state().leader == "r0", timeout=60, what="r0, the preferred replica, leading")
        state = replicas.state()
        leader = state.leader
        for name in [*(n for n in replicas.names if n != leader), leader]:
            began = time.monotonic()
            replicas.procs[name].send_signal(signal.SIGTERM)
            replicas.procs[name].wait(30)
            replicas.start(name)
            wait_until(lambda: replicas.isr() == 3, timeout=60, what=f"{name} back in sync")
            back = time.monotonic()
            waits["leader" if name == leader else "follower"].append(longest_wait(began))
        if handover:  # the interim leader gives the lead back to r0
            wait_until(lambda: replicas.state().leader == "r0", timeout=60, what="the lead back at r0")
            waits["give_back"].append(longest_wait(back))
    finally:
        stop.set()
        publisher.join(90)
        replicas.stop()
    if errors:
        raise SystemExit(f"the publisher failed: {errors[0]}")
    return waits


def main() -> int:
    root = Path(tempfile.mkdtemp(prefix="zeps-bench-roll-"))
    zk = ZooKeeperServer(root / "zookeeper", tick_ms=500)
    zk.start()
    results: dict[str, dict[str, list[float]]] = {"hand-over": {"leader": [], "follower": [], "give_back": []},
                                                  "none": {"leader": [], "follower": []}}  # fmt: skip
    try:
        for i in range(ROUNDS):
            for mode in ("hand-over", "none"):
                waits = roll(zk, root / f"{mode}-{i}", handover=mode == "hand-over")
                for role, values in waits.items():
                    results[mode].setdefault(role, []).extend(values)
                print(json.dumps({"round": i, "set_up": mode, **{k: [round(v, 3) for v in vs]
                                                                 for k, vs in waits.items()}}), flush=True)  # fmt: skip
    finally:
        zk.stop()
    summary: dict[str, Any] = {"rounds": ROUNDS}
    for mode, roles in results.items():
        for role, values in roles.items():
            if not values:
                continue
            summary[f"{mode}_{role}_longest_wait_s_median"] = round(statistics.median(values), 3)
            summary[f"{mode}_{role}_longest_wait_s_max"] = round(max(values), 3)
    for role in ("leader", "follower"):
        summary[f"{role}_wait_ratio_none_over_hand_over"] = round(
            summary[f"none_{role}_longest_wait_s_median"] / summary[f"hand-over_{role}_longest_wait_s_median"], 1
        )
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
