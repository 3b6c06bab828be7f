"""Run the replication simulation for seeds: ``python -m simulation.run 1-1000`` (from ``tests/``,
or ``make sim SEEDS=1-1000``). Each seed expands into its options and a fault plan, both printed
when it fails, with the command that replays it alone (``--seed N -v`` logs every fault).

A run: three replicas, producers and subscribers start; for ``fault_s`` seconds of simulated time
faults happen (below); then every fault heals and the stream must settle within ``SETTLE_S``
(liveness). The invariants of :mod:`simulation.checker` are checked all along.

Faults: kill -9 of one replica, or of all of them with their restart together, staggered or in a
random order; a replica stopped gracefully (SIGTERM: its lead handed over) and restarted; a machine
crash (the unsynced tail of its journal lost), and a restarted replica's disk may sync slowly
(every 50-400 ms) until the faults stop; SIGSTOP for up to 6 s;
ZooKeeper's connection dropped for up to 6 s (the session may expire); a session expired outright;
a replica cut off from the others; a clock jump (monotonic: up to 5 s; wall: seconds, or days ahead
or back, past the idempotent producers' TTL). ZooKeeper operations fail before or
after they are applied, and frames are lost (with their connection), at the seed's rates. In about
two seeds of three the stream is tiered (:mod:`simulation.tiering`): the leaders upload to an object
store whose calls fail at the tiering's rate and which, now and then, goes away or answers only
after seconds, for up to 5 s.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from simulation.checker import Violation
from simulation.tiering import TierOptions, outage
from simulation.world import ACTING, Client, Options, World, draws_compaction

SETTLE_S = 60.0  #: simulated seconds the stream has to settle after the faults stop
FAULTS = ("kill", "crash", "kill-all", "stop", "pause", "zk-disconnect", "zk-expire", "partition", "clock-jump")


@dataclass
class Outcome:
    seed: int
    ok: bool
    steps: int
    sim_s: float
    wall_s: float
    confirmed: int
    delivered: int
    epochs: int
    faults: list[str]
    error: str = ""
    uploads: int = 0  #: objects put into the tiered stream's store (0: not tiered)


def _plan(world: World) -> list[tuple[float, str, str]]:
    """(when, fault, target) for the fault phase, from the seed."""
    rng, options = world.sim.rng, world.options
    names = sorted(world.replicas)
    plan = [(round(rng.uniform(0.5, options.fault_s), 3), rng.choice(FAULTS), rng.choice(names))
            for _ in range(options.faults)]  # fmt: skip
    return sorted(plan)


def _inject(world: World, fault: str, target: str, log: list[str]) -> None:
    sim, rng = world.sim, world.sim.rng
    replica = world.replicas[target]
    log.append(f"{sim.now:.3f} {fault} {target}")
    if fault in ("kill", "crash"):
        replica.crash(lose_tail=fault == "crash")
        sim.after(rng.uniform(0.2, 3.0), replica.start)
    elif fault == "kill-all":
        lose = rng.random() < 0.5
        for r in world.replicas.values():
            r.crash(lose_tail=lose)
        order = sorted(world.replicas.values(), key=lambda _: rng.random())
        together = rng.random() < 0.3
        delay = rng.uniform(0.1, 2.0)
        for i, r in enumerate(order):
            sim.after(delay if together else delay + i * rng.uniform(0.0, 3.0), r.start)
        log[-1] += f" ({'machines' if lose else 'processes'}; restart {'together' if together else 'in order'} "
        log[-1] += f"{', '.join(r.name for r in order)})"
    elif fault == "stop":  # SIGTERM: a controlled shutdown (the lead handed over), restarted after a while
        replica.stop()
        incarnation = replica.incarnation

        def restart() -> None:  # once it is down (its hand-over takes at most 10 s), unless restarted since
            if replica.incarnation != incarnation:
                return
            if replica.up:
                sim.after(0.5, restart)
            else:
                replica.start()

        sim.after(rng.uniform(1.0, 4.0), restart)
    elif fault == "pause":
        replica.pause()
        sim.after(rng.uniform(0.2, 6.0), replica.resume)
    elif fault == "zk-disconnect":
        replica.disconnect_zookeeper(rng.uniform(0.2, 6.0))
    elif fault == "zk-expire":
        if replica.up and replica.session is not None:
            world.zk.expire(replica.session)
            session = replica.session
            sim.after(rng.uniform(0.0, 0.2), lambda: replica.session_expired(session))
    elif fault == "partition":
        others = [n for n in world.replicas if n != target]
        pairs = {frozenset((target, o)) for o in others}
        world.network.cut |= pairs
        sim.after(rng.uniform(0.5, 4.0), lambda: world.network.cut.difference_update(pairs))
    elif fault == "clock-jump":
        replica.skew += rng.uniform(1.0, 5.0)
        replica.wall_skew += rng.choice([rng.uniform(1.0, 5.0), rng.uniform(1.5, 3.0) * 86400,
                                         -rng.uniform(1.5, 3.0) * 86400])  # fmt: skip
        log[-1] += f" (wall clock {replica.wall_skew:+.0f}s)"


def _store_down(world: World, log: list[str]) -> None:
    seconds, slow = world.tier_rng.uniform(0.5, 5.0), world.tier_rng.random() < 0.5
    log.append(f"{world.sim.now:.3f} store-{'slow' if slow else 'down'} {seconds:.1f}s")
    outage(world, seconds, slow=slow)


def _heal(world: World, log: list[str]) -> None:
    world.faulting = False
    if world.tier_store is not None:
        world.tier_store.down, world.tier_store.slow_until = False, 0.0
    for replica in world.replicas.values():
        replica.sync_every = (0.001, 0.02)
    world.network.cut.clear()
    log.append(f"{world.sim.now:.3f} heal")
    for replica in world.replicas.values():
        if replica.paused:
            replica.resume()
        elif not replica.up:
            replica.start()
        session = replica.session
        if replica.up and session is not None and session.alive and not session.connected:
            replica.disconnect_zookeeper(0.0)  # its reconnect is due: bring it now


def run(seed: int, root: Path, *, options: Options | None = None, tiering: bool = True,
        verbose: bool = False) -> Outcome:  # fmt: skip
    """One seed (``tiering`` False: never tiered, as seeds ran before tiering came to the simulation)."""
    began = time.monotonic()
    world = World(seed, root, options, tiering, compaction=tiering)
    ACTING.sim = world.sim
    faults: list[str] = []
    for replica in world.replicas.values():
        replica.start()
    for i in range(world.options.producers + world.options.subscribers):
        client = Client(world, i, "producer" if i < world.options.producers else "subscriber")
        world.clients.append(client)
        # a compacting seed's subscribers come late: they read from 1 what compaction left, gaps and all
        late = world.options.fault_s / 2 if world.compaction and client.kind == "subscriber" else 0.0
        world.sim.after(0.3 + late, client.connect)
        world.sim.after(0.3 + late + i * 0.001, client.turn)

    for when, fault, target in _plan(world):
        world.sim.at(when, lambda f=fault, t=target: _inject(world, f, t, faults))
    if world.tiering is not None:  # the store's outages: from the tiering's own random source
        for _ in range(world.tiering.outages):
            world.sim.at(world.tier_rng.uniform(0.5, world.options.fault_s), lambda: _store_down(world, faults))
    world.sim.at(world.options.fault_s, lambda: _heal(world, faults))
    limit = world.options.fault_s + SETTLE_S
    error = ""
    try:
        while world.sim.step():
            if world.sim.now > world.options.fault_s and world.checker.settled():
                world.checker.final()
                break
            if world.sim.now > limit:
                raise Violation(f"seed {seed}: not settled {SETTLE_S:.0f} s after the faults stopped: "
                                f"{_situation(world)}")  # fmt: skip
    except Violation as exc:
        error = str(exc)
    finally:
        for replica in world.replicas.values():
            replica.crash(lose_tail=False)  # closes its files
    if verbose:
        for line in faults:
            print("  fault", line)
    return Outcome(seed, not error, world.sim.steps, round(world.sim.now, 3), round(time.monotonic() - began, 3),
                   sum(c.confirmed for c in world.clients), sum(len(c.delivered) for c in world.clients),
                   len(world.checker.leaders), faults, error,
                   len(world.tier_store.puts) if world.tier_store is not None else 0)  # fmt: skip


def _situation(world: World) -> str:
    state = world.zk.state()
    parts = [f"state {state}"]
    for r in world.replicas.values():
        parts.append(f"{r.name}: {'up' if r.up else 'down'}{' paused' if r.paused else ''}")
    for c in world.clients:
        parts.append(
            f"client {c.id} {c.kind}: confirmed {c.confirmed}/{len(c.published)}, delivered "
            f"{len(c.delivered)}, attached {c.session.attached} at {c.at}, producer error "
            f"{c.session.producer_error}, refused {c.session.publish_refused or c.session.refused}"
        )
    if world.tier_store is not None:
        entries = world.checker.manifest()
        parts.append(f"manifest {[(e.first, e.last, e.epoch, e.state.value) for e in entries][-6:]}")
        for r in world.replicas.values():
            if r.uploads is not None and r.core is not None:
                rounds, stream = r.uploads.rounds, r.core.streams[world.stream]
                closed = [(c.first, c.last) for c in stream.journal.closed_segments()][-4:]
                parts.append(f"{r.name} tiering: tiered_to {rounds.tiered_to}, error {rounds.error!r}, "
                             f"{rounds.failures} failures, closed {closed}, committed {stream.committed}")  # fmt: skip
    return "; ".join(parts)


def scratch() -> Path:
    """Where the replicas' journals go: memory when the machine has /dev/shm (fsync is free there)."""
    shm = Path("/dev/shm")
    return Path(tempfile.mkdtemp(prefix="zeps-sim-", dir=shm if shm.is_dir() else None))


def main(argv: list[str] | None = None) -> int:
    if os.environ.get("PYTHONHASHSEED") != "0":  # sets of strings iterate in hash order: fixed, a seed replays
        os.execve(sys.executable, [sys.executable, "-m", "simulation.run", *(argv or sys.argv[1:])],
                  {**os.environ, "PYTHONHASHSEED": "0"})  # fmt: skip
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("seeds", nargs="?", default="1-100", help="N, or FIRST-LAST")
    parser.add_argument("--seed", type=int, help="run this seed alone (with -v: every fault)")
    parser.add_argument("-v", "--verbose", action="store_true")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose and args.seed else logging.CRITICAL,
        format="%(sim)s %(who)s %(levelname)s %(name)s: %(message)s",
    )
    for handler in logging.getLogger().handlers:
        handler.addFilter(ACTING)
    first, _, last = args.seeds.partition("-")
    seeds = [args.seed] if args.seed is not None else list(range(int(first), int(last or first) + 1))
    began, failed = time.monotonic(), []
    for seed in seeds:
        root = scratch()
        try:
            outcome = run(seed, root, verbose=args.verbose)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        if not outcome.ok:
            failed.append(seed)
            print(f"FAIL seed {seed}: {outcome.error}")
            print(f"  options: {json.dumps(asdict(Options.from_seed(__import__('random').Random(seed))))}")
            tiering = TierOptions.from_seed(seed)
            print(f"  tiering: {json.dumps(asdict(tiering)) if tiering is not None else 'none'}")
            print(f"  compaction: {tiering is None and draws_compaction(seed)}")
            print(f"  faults: {outcome.faults}")
            print(f"  replay: make sim SEEDS={seed}   (or: cd tests && python -m simulation.run --seed {seed} -v)")
        elif args.verbose:
            print(
                f"ok seed {seed}: {outcome.steps} steps, {outcome.sim_s}s simulated in {outcome.wall_s}s, "
                f"{outcome.confirmed} confirmed, {outcome.delivered} delivered, {outcome.epochs} epochs, "
                f"{outcome.uploads} uploads"
            )
    wall = time.monotonic() - began
    summary = {"seeds": len(seeds), "failed": failed, "wall_s": round(wall, 2),
               "seeds_per_s": round(len(seeds) / wall, 3) if wall else None}  # fmt: skip
    print(json.dumps(summary))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
