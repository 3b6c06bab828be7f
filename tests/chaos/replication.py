"""Chaos on real processes: three ``zeps-broker`` replicas of one stream (``--min-insync 2``), a real
ZooKeeper reached by each replica through a proxy of its own (:mod:`chaos.zkproxy`), three
idempotent publishers and two subscribers (``tests/workers/replica_client.py``), and random faults,
one a round, each healed before the next:

* ``kill-leader``, ``kill-follower``: kill -9, restarted after 0.3-2 s;
* ``pause-leader``, ``pause-follower``: SIGSTOP for 1-5 s (the session, 2 s, may expire meanwhile);
* ``kill-all``: every replica killed, restarted together, followers first, the old leader first, or
  one by one in a random order with pauses;
* ``zk-drop``: the leader's next writes to ZooKeeper are applied and their answers lost, while a
  follower is killed (so the leader writes its in-sync set);
* ``zk-cut``: the leader cut off from ZooKeeper for 3-5 s (a new leader is elected; the old one,
  still reachable by its clients and followers, must stop confirming);
* ``disk-full``: a follower's volume filled to the last byte for 2-6 s (each replica's journal is on
  a volume of its own, :mod:`zeps_dev.volume`; as root only): it must stay up, acknowledge nothing
  it could not write, and catch up once there is space; in half the rounds the leader is killed
  meanwhile (restarted after 0.5-2 s), so the full follower, still listed in sync, may be elected
  and must leave the lead to the other (it cannot write the epoch it would lead);

* ``slow-disk``: the leader's or a follower's disk slowed to 1-5 writes and 8-64 KiB a second for
  2-6 s (each journal on an ext4 file system of its own on a loop device, its writes throttled by
  the kernel's block I/O controller: :mod:`zeps_dev.volume`; as root only, with cgroup v1's blkio);
* ``clock-jump``: the leader's or a follower's wall clock stepped back up to two days or ahead up
  to six hours for 2-5 s (:mod:`zeps_dev.wallclock`, an ``LD_PRELOAD`` library; the monotonic clock
  is left alone, as a real step leaves it). Ahead stays below the producers' TTL (24 h): a leader
  whose clock runs ahead by more stamps records that far ahead, and the stream's own time then
  forgets producers idle by it (their resume is refused ``PRODUCER_UNKNOWN``, as after a real idle).

Every replica prefers r0 as leader (``--preferred-leader``): after each fault that moved the lead,
the leader gives it back to r0 once r0 is in sync, so those hand-overs meet the faults too.

Replica links flapping are the network lab's (tests/integration/test_replication_partition.py).
Debian's libfaketime (0.9.10) cannot run a broker, hence the library of our own: with its monotonic
clock faked, Python 3.11's ``threading`` waits never return; with it left alone
(``FAKETIME_DONT_FAKE_MONOTONIC``), ``time.sleep`` fails with EINVAL (its ``clock_nanosleep``
wrapper). The simulation (tests/simulation) jumps the monotonic clock too.

Everything that happens is written to ``history.jsonl`` (the faults, and each worker's lines); a
round that does not settle within 90 s adds a ``stalled`` line before the run fails: who did not
move on, the state in ZooKeeper, and each replica's readers and log as its metrics show them. At
the end every replica is started, the stream settles, and the history is checked: per fault, the
rounds, the publishes confirmed during them, and what broke the promise — confirmed publishes lost,
publishes committed twice, replicas whose journals differ, and dirty reads (a delivered record the
final log does not hold at its sequence). The last line printed is the summary, as JSON.

``make chaos-replication`` (ROUNDS=…, SEED=…) runs it; ``make test`` runs a short run.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from chaos.zkproxy import ZkProxy
from harness import TEST_JVM_FLAGS, WORKERS, ReplicaSet, ZooKeeperHarness, until
from zeps.errors import SetupError
from zeps_dev import ZooKeeperServer
from zeps_dev.volume import PrivateVolume, available_disk
from zeps_dev.volume import available as volume_available
from zeps_dev.wallclock import WallClock
from zeps_dev.wallclock import available as wallclock_available

FAULTS = (
    "kill-leader",
    "kill-follower",
    "pause-leader",
    "pause-follower",
    "kill-all",
    "zk-drop",
    "zk-cut",
    "disk-full",
    "slow-disk",
    "clock-jump",
)
PUBLISHERS, SUBSCRIBERS = 3, 2
#: the metrics a stalled round's diagnosis keeps (:meth:`Chaos._diagnose`)
DIAGNOSED = tuple(f"zeps_broker_{name}" for name in (
    "subscriptions", "replay_sessions", "credit_starved_subscriptions", "subscriber_lag", "fell_behind",
    "last_sequence", "messages_out", "replica_epoch", "replica_leader", "replica_in_sync", "replica_follower_lag",
))  # fmt: skip


@dataclass
class Round:
    index: int
    fault: str
    began: float
    ended: float = 0.0
    detail: str = ""


@dataclass
class Report:
    rounds: int = 0
    confirmed: int = 0
    lost: int = 0
    duplicates: int = 0
    divergence: int = 0
    dirty_reads: int = 0
    examples: list[str] = field(default_factory=list)
    details: list[str] = field(default_factory=list)  #: what each round of the fault did (its order, target)


class Chaos:
    def __init__(self, server: ZooKeeperServer, root: Path, seed: int, only: set[str] | None = None) -> None:
        self.root, self.rng = root, random.Random(seed)
        self.zk = ZooKeeperHarness(server, f"/chaos-{seed}-{time.time_ns()}")
        names = [f"r{i}" for i in range(3)]
        self.proxies = {name: ZkProxy(server.connect_string).start() for name in names}
        self.replicas = ReplicaSet(self.zk, root, zookeeper_for={n: p.address for n, p in self.proxies.items()})
        self.replicas.extra = ["--preferred-leader", "r0"]  # the lead goes back to r0: give-ways among the faults
        if volume_available() is None:  # each journal on a volume of its own, which disk-full fills (slow-disk
            disk = available_disk() is None  # slows it, if it is a disk: else a tmpfs)
            self.replicas.volumes = {name: PrivateVolume(root / name, size=256 << 20, disk=disk).start()
                                     for name in names}  # fmt: skip
        if wallclock_available() is None:  # each replica's wall clock, which clock-jump steps
            self.replicas.clocks = {name: WallClock(root / f"{name}.clock") for name in names}
        self.faults = [f for f in FAULTS if (f != "disk-full" or self.replicas.volumes)
                       and (f != "slow-disk" or any(v.disk for v in self.replicas.volumes.values()))
                       and (f != "clock-jump" or self.replicas.clocks) and (only is None or f in only)]  # fmt: skip
        if not self.faults:
            raise SystemExit(f"no fault to run here among {sorted(only or FAULTS)} (disk-full needs root)")
        self.history = (root / "history.jsonl").open("w")
        self.rounds: list[Round] = []
        self.workers: list[tuple[str, subprocess.Popen[bytes], Path]] = []
        self.stop_file = root / "stop"

    # -- life --------------------------------------------------------------------------------
    def start(self) -> None:
        for name in self.replicas.names:
            self.replicas.start(name)
        until(lambda: self._isr() == 3, "all three replicas in sync", timeout=60)
        common = ["--zookeeper", self.zk.connect_string, "--chroot", self.zk.root, "--stop-file", str(self.stop_file),
                  "--seconds", "3600"]  # fmt: skip
        for i in range(PUBLISHERS):
            self._worker(f"p{i}", ["publish", "--tag", f"p{i}", "--group", "10", *common])
        for i in range(SUBSCRIBERS):
            self._worker(f"s{i}", ["subscribe", *common])
        before = self._progress()
        until(lambda: self._moved_on(before), "every publisher confirming and every subscriber reading", timeout=90)

    def _progress(self) -> dict[str, int]:
        """Each worker's progress so far: a publisher's last confirmed count, a subscriber's last sequence."""
        out = {}
        for name, _, path in self.workers:
            last = 0
            for line in path.read_text().splitlines():
                if line.startswith("{") and line.endswith("}"):
                    event = json.loads(line)
                    last = max(last, event.get("confirmed", 0), *(seq for seq, _ in event.get("delivered", [])))
            out[name] = last
        return out

    def _moved_on(self, before: dict[str, int]) -> bool:
        """Every worker got further than ``before`` (the stream serves everyone again)."""
        now = self._progress()
        return all(now[name] > before[name] for name in before)

    def _worker(self, name: str, argv: list[str]) -> None:
        out = self.root / f"{name}.jsonl"
        with out.open("wb") as log:
            proc = subprocess.Popen([sys.executable, str(WORKERS / "replica_client.py"), *argv], stdout=log,
                                    stderr=subprocess.STDOUT)  # fmt: skip
        self.workers.append((name, proc, out))

    def stop(self) -> None:
        self.stop_file.touch()
        for volume in self.replicas.volumes.values():
            volume.fast()  # a round stopped midway (its error on its way) may have left one slow
        for _, proc, _ in self.workers:
            try:
                proc.wait(90)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        self.replicas.stop()
        for proxy in self.proxies.values():
            proxy.stop()
        self.zk.close()

    def release(self) -> None:
        """The replicas' volumes go (once their journals are checked)."""
        for volume in self.replicas.volumes.values():
            volume.stop()

    def _say(self, **fields: Any) -> None:
        self.history.write(json.dumps({"t": time.time(), **fields}) + "\n")
        self.history.flush()

    def _isr(self) -> int:
        state = self.replicas.state()
        return 0 if state is None else len(state.isr)

    def _leader(self) -> str:
        return self.replicas.leader()

    # -- rounds ------------------------------------------------------------------------------
    def round(self, index: int, fault: str) -> None:
        leader = self._leader()
        follower = self.rng.choice([n for n in self.replicas.names if n != leader])
        r = Round(index, fault, time.time())
        self._say(round=index, fault=fault, leader=leader, begins=True)
        self.hold(0.5, 1.5)  # some publishing before the fault
        r.detail = self._inject(fault, leader, follower)
        for proxy in self.proxies.values():
            proxy.heal()
        before = self._progress()  # from the heal on: what was done before the fault proves nothing
        try:
            until(lambda: self._isr() == 3 and self._moved_on(before), f"round {index} ({fault}): all three back in "
                  "sync, every publisher confirming and every subscriber reading again", timeout=90)  # fmt: skip
        except SetupError:
            self._say(round=index, fault=fault, detail=r.detail, stalled=self._diagnose(before))
            raise
        r.ended = time.time()
        self.rounds.append(r)
        self._say(round=index, fault=fault, detail=r.detail, ends=True)

    def hold(self, low: float, high: float) -> None:
        """Let a fault (or the traffic around it) last ``low``-``high`` seconds, drawn from the seed:
        the one place chaos waits for time rather than for an event, since a fault's length is what
        a round varies."""
        time.sleep(self.rng.uniform(low, high))  # the fault's length: what the round varies

    def _diagnose(self, before: dict[str, int]) -> dict[str, Any]:
        """What a stalled round looks like, for the history: who has not moved on since the round
        began, the stream's state in ZooKeeper, and each replica's view of its readers and its log
        (its metrics: subscriptions live, replaying or out of credit, their lag, its last sequence)."""
        state = self.replicas.state()
        now = self._progress()
        views: dict[str, list[str]] = {}
        for name in self.replicas.names:
            try:
                text = self.replicas.scrape(name)
            except OSError as exc:  # stopped, or not answering (paused)
                views[name] = [f"no metrics: {exc!r}"]
                continue
            views[name] = [line for line in text.splitlines() if line.startswith(DIAGNOSED)]
        found = None if state is None else {"epoch": state.epoch, "leader": state.leader, "isr": sorted(state.isr)}
        stuck = sorted(name for name in before if now[name] <= before[name])
        return {"stuck": stuck, "progress": now, "state": found, "replicas": views}

    def _inject(self, fault: str, leader: str, follower: str) -> str:
        """One fault, healed before it returns (the ZooKeeper proxies are healed by the caller): what
        it did, for the history."""
        if fault in ("disk-full", "slow-disk", "clock-jump"):
            return self._inject_host(fault, leader, follower)
        rng, replicas = self.rng, self.replicas
        detail = ""
        if fault in ("kill-leader", "kill-follower"):
            target = leader if fault == "kill-leader" else follower
            replicas.kill(target)
            self.hold(0.3, 2.0)
            replicas.start(target)
            detail = target
        elif fault in ("pause-leader", "pause-follower"):
            target = leader if fault == "pause-leader" else follower
            replicas.pause([target])
            self.hold(1.0, 5.0)
            replicas.resume([target])
            detail = target
        elif fault == "kill-all":
            for name in replicas.names:
                replicas.kill(name)
            order = rng.choice(["together", "followers-first", "leader-first", "staggered"])
            others = [n for n in replicas.names if n != leader]
            groups = {"together": [replicas.names], "followers-first": [others, [leader]],
                      "leader-first": [[leader], others],
                      "staggered": [[n] for n in rng.sample(replicas.names, 3)]}[order]  # fmt: skip
            self.hold(0.2, 1.0)
            for group in groups:
                for name in group:
                    replicas.start(name)
                self.hold(0.5, 3.0)
            detail = f"{order}: {groups}"
        elif fault == "zk-drop":
            self.proxies[leader].drop_after_apply(rng.randint(1, 3))
            replicas.kill(follower)  # the leader writes its in-sync set without it
            self.hold(2.0, 5.0)
            replicas.start(follower)
            detail = f"{leader}'s writes ({self.proxies[leader].dropped} answers dropped so far)"
        elif fault == "zk-cut":
            self.proxies[leader].cut()
            self.hold(3.0, 5.0)
            self.proxies[leader].heal()
            detail = leader
        return detail

    def _inject_host(self, fault: str, leader: str, follower: str) -> str:
        """The faults of a replica's machine: its disk full or slow, its clock stepped."""
        rng, detail = self.rng, ""
        if fault == "disk-full":
            taken = self.replicas.volumes[follower].fill()
            also = rng.random() < 0.5  # the leader lost too: the full follower, still in sync, may be elected
            if also:
                self.hold(0.2, 1.0)
                self.replicas.kill(leader)
                self.hold(0.5, 2.0)
                self.replicas.start(leader)
            self.hold(2.0, 6.0)
            self.replicas.volumes[follower].free()
            detail = f"{follower} ({taken >> 20} MiB taken){f', leader {leader} killed meanwhile' if also else ''}"
        elif fault == "slow-disk":
            target = rng.choice([leader, follower])
            writes, kib = rng.randint(1, 5), rng.choice([8, 16, 32, 64])
            detail = f"{target} ({writes} writes, {kib} KiB a second)"
            self._say(injected=detail)
            self.replicas.volumes[target].slow(writes_per_s=writes, bytes_per_s=kib << 10)
            self.hold(2.0, 6.0)
            self.replicas.volumes[target].fast()
        elif fault == "clock-jump":
            target = rng.choice([leader, follower])
            jump = rng.choice([-1.0, 1.0 / 8]) * rng.uniform(60.0, 2 * 86400.0)  # back 2 days at most, ahead 6 h
            self.replicas.clocks[target].jump(jump)
            self.hold(2.0, 5.0)
            self.replicas.clocks[target].reset()
            detail = f"{target} {jump:+.0f} s"
        return detail

    # -- the check ---------------------------------------------------------------------------
    def check(self) -> dict[str, Report]:
        """Per fault, from the workers' lines and the final journals (every replica stopped)."""
        confirmed: dict[str, tuple[int, float]] = {}  # body -> (publisher's count, when confirmed)
        delivered: list[tuple[int, str, float]] = []
        for name, _, out in self.workers:
            for line in out.read_text().splitlines():
                if not line.startswith("{"):
                    continue
                event = json.loads(line)
                self._say(worker=name, **event)
                if "confirmed" in event:
                    for n in range(1, event["confirmed"] + 1):
                        confirmed.setdefault(f"{name}:{n}", (n, event["t"]))
                for seq, body in event.get("delivered", []):
                    delivered.append((seq, body, event["t"]))
        logs = {name: self.replicas.journal(name) for name in self.replicas.names}
        final = {seq: body.decode() for seq, body in logs[self.replicas.names[0]]}
        reports = {fault: Report() for fault in FAULTS} | {"none": Report()}
        for r in self.rounds:
            reports[r.fault].rounds += 1
            reports[r.fault].details.append(f"round {r.index}: {r.detail}")

        def fault_at(t: float) -> str:
            for r in self.rounds:
                if r.began <= t <= r.ended + 1.0:
                    return r.fault
            return "none"

        counts = Counter(final.values())
        for body, (_, t) in confirmed.items():
            report = reports[fault_at(t)]
            report.confirmed += 1
            if counts[body] == 0:
                report.lost += 1
                report.examples.append(f"lost {body}")
        for body, n in counts.items():
            if n > 1:
                reports["none"].duplicates += n - 1
                reports["none"].examples.append(f"{body} committed {n} times")
        for name, log in logs.items():
            if [(s, b.decode()) for s, b in log] != sorted(final.items()):
                reports["none"].divergence += 1
                reports["none"].examples.append(f"{name}'s journal differs from {self.replicas.names[0]}'s")
        for seq, body, t in delivered:
            if final.get(seq) != body:
                report = reports[fault_at(t)]
                report.dirty_reads += 1
                report.examples.append(f"delivered {seq}={body}, the final log holds {final.get(seq)}")
        if bad(reports):  # the replicas' own words on what they cut (the protocol never cuts a commit)
            for name in self.replicas.names:
                errors = [line for line in (self.root / f"{name}.log").read_text(errors="replace").splitlines()
                          if " ERROR " in line or "cutting records" in line]  # fmt: skip
                reports["none"].examples += [f"{name}: {line[:300]}" for line in errors[-5:]]
        return reports


def run(server: ZooKeeperServer, root: Path, *, rounds: int, seed: int, only: set[str] | None = None
        ) -> dict[str, Report]:  # fmt: skip
    chaos = Chaos(server, root, seed, only)
    try:
        try:
            chaos.start()
            for i in range(rounds):
                chaos.round(i, chaos.rng.choice(chaos.faults))
            chaos.hold(1.0, 1.0)  # the last round's publishes confirmed and delivered
        finally:
            chaos.stop()
        return chaos.check()
    finally:  # the volumes (their cgroups, loop devices) go whether the run failed or not
        chaos.history.close()
        chaos.release()


def bad(reports: dict[str, Report]) -> int:
    return sum(r.lost + r.duplicates + r.divergence + r.dirty_reads for r in reports.values())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--seed", type=int, default=int(time.time()) % 100_000)
    parser.add_argument("--keep", action="store_true", help="keep the run's folder (journals, logs, history)")
    parser.add_argument("--faults", type=lambda text: set(text.split(",")),
                        help=f"only these faults, comma-separated (default: all of {', '.join(FAULTS)})")  # fmt: skip
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # the finally blocks stop every process
    root = Path(tempfile.mkdtemp(prefix="zeps-chaos-"))
    server = ZooKeeperServer(root / "zookeeper", jvm_flags=list(TEST_JVM_FLAGS))
    server.start()
    began = time.monotonic()
    try:
        reports = run(server, root / "run", rounds=args.rounds, seed=args.seed, only=args.faults)
    finally:
        server.stop()
    for fault, r in reports.items():
        if r.rounds or r.confirmed:
            print(json.dumps({"fault": fault, "rounds": r.rounds, "confirmed": r.confirmed, "lost": r.lost,
                              "duplicates": r.duplicates, "divergence": r.divergence, "dirty_reads": r.dirty_reads,
                              "examples": r.examples[:3], "details": r.details}))  # fmt: skip
    failures = bad(reports)
    print(f"history: {root / 'run' / 'history.jsonl'}" if args.keep else "")
    print(json.dumps({"seed": args.seed, "rounds": args.rounds, "seconds": round(time.monotonic() - began, 1),
                      "confirmed": sum(r.confirmed for r in reports.values()), "violations": failures}))  # fmt: skip
    if not args.keep:
        import shutil  # noqa: PLC0415

        shutil.rmtree(root, ignore_errors=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
