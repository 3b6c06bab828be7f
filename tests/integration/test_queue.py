"""Work queue against a real ZooKeeper server; chaos with worker processes."""

from __future__ import annotations

import collections
import random
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from kazoo.exceptions import NoAuthError

from harness import CuttingProxy, WorkerProcess, ZooKeeperHarness, until
from zeps.coordination import connect
from zeps.coordination.queue import AckUncertainError, LockLostError, WorkQueue
from zeps.coordination.testing import expire_session_by_id
from zeps.errors import ConfigError, CoordinationError
from zeps.options import QueueOptions


@pytest.fixture
def queue_factory(zookeeper: ZooKeeperHarness) -> Iterator[Callable[..., WorkQueue]]:
    def make(name: str = "work", **options: object) -> WorkQueue:
        return WorkQueue(zookeeper.client(), name, chroot=zookeeper.root, options=QueueOptions.make(**options))

    yield make


def test_fifo_within_priority_and_priorities_first(queue_factory: Callable[..., WorkQueue]) -> None:
    q = queue_factory()
    q.put_all([b"n1", b"n2", b"n3"])
    q.put(b"low", priority=500)
    q.put(b"urgent", priority=1)
    order = []
    while item := q.take(timeout=0.2):
        order.append(item.body)
        item.ack()
    assert order == [b"urgent", b"n1", b"n2", b"n3", b"low"]


def test_context_manager_acks_on_success_and_releases_on_error(queue_factory: Callable[..., WorkQueue]) -> None:
    q = queue_factory()
    q.put(b"job")
    with pytest.raises(RuntimeError), q.take(timeout=1):  # type: ignore[union-attr]
        raise RuntimeError("crawl failed")
    again = q.take(timeout=1)
    assert again is not None and again.body == b"job" and again.attempt == 2
    with again:
        pass
    assert q.stats().depth == 0


def test_crashed_worker_item_comes_back_with_attempt_count(
    zookeeper: ZooKeeperHarness, queue_factory: Callable[..., WorkQueue]
) -> None:
    doomed = queue_factory()
    doomed.put(b"job")
    item = doomed.take(timeout=1)
    assert item is not None and item.attempt == 1
    rescuer = queue_factory()
    assert rescuer.take(timeout=0.3) is None, "a held item must not be handed out twice"
    zookeeper.expire_session(doomed.client)  # the worker "dies": its lock vanishes with its session
    again = rescuer.take(timeout=10)
    assert again is not None and again.id == item.id and again.attempt == 2
    # the fenced ack: the expired worker can never ack an item another worker now holds
    with pytest.raises(LockLostError):
        item.ack()
    again.ack()
    assert rescuer.stats().depth == 0


def test_expired_worker_may_still_ack_an_item_nobody_took(
    zookeeper: ZooKeeperHarness, queue_factory: Callable[..., WorkQueue]
) -> None:
    q = queue_factory()
    q.put(b"job")
    item = q.take(timeout=1)
    assert item is not None
    zookeeper.expire_session(q.client)  # lock gone, but nobody took the item meanwhile
    item.ack()
    assert q.stats().depth == 0


def test_an_ack_whose_session_expired_in_flight_is_uncertain_not_lost(zookeeper: ZooKeeperHarness) -> None:
    """The ack transaction reaches ZooKeeper and applies, the answer is cut, and the session expires
    before the worker is back (what a ZooKeeper leader change under load did on kind). The item is
    gone and nobody will redo it: the worker gets AckUncertainError (not claimed, nothing to redo),
    never the plain LockLostError that means "someone else redoes it"."""
    host, port = zookeeper.connect_string.split(":")
    proxy = CuttingProxy((host, int(port)), min_bytes=100)
    client = connect(proxy.address, session_timeout=4)
    try:
        producer = WorkQueue(zookeeper.client(), "uncertain", chroot=zookeeper.root)
        producer.put(b"job")
        worker = WorkQueue(client, "uncertain", chroot=zookeeper.root)
        item = worker.take(timeout=5)
        assert item is not None
        session_id, password = client.client_id
        proxy.refusing = True  # once cut, the worker cannot come back until the session is expired
        proxy.arm("response")
        outcome: list[BaseException | None] = []

        def ack() -> None:
            try:
                item.ack()
                outcome.append(None)
            except BaseException as exc:
                outcome.append(exc)

        acking = threading.Thread(target=ack)
        acking.start()
        until(lambda: proxy.cuts == 1, "the ack to reach ZooKeeper and its answer to be cut")
        assert producer.stats().depth == 0, "the ack transaction applied"
        expire_session_by_id(zookeeper.connect_string, session_id, password)
        proxy.refusing = False
        acking.join(60)
        assert not acking.is_alive()
        assert len(outcome) == 1 and type(outcome[0]) is AckUncertainError, outcome
        assert "nothing is left to redo" in str(outcome[0])
        assert client.client_id[0] != session_id, "the worker is back with a new session"
    finally:
        client.stop()
        client.close()
        proxy.close()


@pytest.mark.parametrize("mode", ["request", "response"], ids=["request-dropped", "answer-lost"])
def test_a_connection_cut_at_any_step_of_take_and_ack_is_survived(zookeeper: ZooKeeperHarness, mode: str) -> None:
    """The worker's connection is cut at each ZooKeeper request of a take-and-ack cycle in turn:
    the request dropped, or applied with its answer lost. That is what a worker sees when the server
    it talks to leaves the ensemble (the leader's pod deleted on kind). The session survives, the
    client reconnecting at once, so nothing may be lost or redone. take() and ack() must retry what
    is safe to retry and return normally: a kazoo ConnectionLoss escaping them crashes a worker loop
    that catches zeps errors, as one did on kind. Every item is acked exactly once and nothing is
    left in ZooKeeper."""
    host, port = zookeeper.connect_string.split(":")
    proxy = CuttingProxy((host, int(port)), min_bytes=40)  # pings (12 bytes) pass; every request is cut-able
    client = connect(proxy.address, session_timeout=10)
    try:
        producer = WorkQueue(zookeeper.client(), "cut", chroot=zookeeper.root)
        steps = 8
        producer.put_all([f"job-{i}".encode() for i in range(steps + 1)])
        worker = WorkQueue(client, "cut", chroot=zookeeper.root)
        first = worker.take(timeout=5)  # joins the workers and lists the items: no cut yet
        assert first is not None
        first.ack()
        acked = [first.body]
        for skip in range(steps):  # a take and its ack make a handful of requests: cut the skip-th
            proxy.arm(mode, skip=skip)
            item = worker.take(timeout=10)
            assert item is not None, f"take after a cut at request {skip} found nothing"
            item.ack()
            acked.append(item.body)
        assert proxy.cuts >= 3, "the cuts did not land inside take and ack"
        assert sorted(acked) == sorted(f"job-{i}".encode() for i in range(steps + 1))
        assert producer.stats().depth == 0
        assert client.get_children(f"{worker.paths.taken}") == []
    finally:
        client.stop()
        client.close()
        proxy.close()


def test_a_zookeeper_refusal_surfaces_as_a_zeps_error(zookeeper: ZooKeeperHarness) -> None:
    """What the recipe does not expect from ZooKeeper leaves its public methods as CoordinationError
    (a zeps error naming the call), never as a raw kazoo exception a worker's ``except ZepsError``
    would miss. Here, for real: the queue's nodes belong to another digest identity."""
    owner = WorkQueue(zookeeper.client(auth=("owner", "secret")), "private", chroot=zookeeper.root)
    owner.put(b"not yours")
    stranger = WorkQueue(zookeeper.client(), "private", chroot=zookeeper.root)
    for call in (stranger.stats, lambda: stranger.take(timeout=1), lambda: stranger.put(b"x")):
        with pytest.raises(CoordinationError, match=r"WorkQueue\.\w+: ZooKeeper refused \(NoAuth\)") as caught:
            call()
        assert isinstance(caught.value.__cause__, NoAuthError)


def test_dead_letter_after_max_attempts_and_redrive(queue_factory: Callable[..., WorkQueue]) -> None:
    q = queue_factory(max_attempts=3)
    q.put(b"poison", headers={"source": "test"})
    for attempt in (1, 2, 3):
        item = q.take(timeout=1)
        assert item is not None and item.attempt == attempt
        item.release()
    assert q.take(timeout=0.3) is None
    [dead] = q.dead_letters()
    assert (dead.body, dead.attempts, dead.headers) == (b"poison", 3, {"source": "test"})
    assert "last attempt" in dead.reason
    assert q.stats().dead_lettered == 1
    assert q.redrive() == 1
    item = q.take(timeout=1)
    assert item is not None and item.body == b"poison" and item.attempt == 1
    item.ack()
    assert q.dead_letters() == []


def test_without_dead_letter_an_item_is_retried_past_max_attempts(
    zookeeper: ZooKeeperHarness, queue_factory: Callable[..., WorkQueue]
) -> None:
    """dead_letter=False (the Queue's deadLetter: false): released and crashed takes past max_attempts
    leave the item in the queue, and it is taken again with the attempt count going on."""
    q = queue_factory(max_attempts=2, dead_letter=False)
    q.put(b"flaky")
    for attempt in (1, 2, 3):  # released: past max_attempts, still here
        item = q.take(timeout=1)
        assert item is not None and item.attempt == attempt
        item.release()
    crashed = queue_factory(max_attempts=2, dead_letter=False)
    item = crashed.take(timeout=1)
    assert item is not None and item.attempt == 4
    zookeeper.expire_session(crashed.client)  # the worker dies holding it
    item = q.take(timeout=5)
    assert item is not None and (item.body, item.attempt) == (b"flaky", 5)
    item.ack()
    assert q.dead_letters() == [] and q.stats().dead_lettered == 0 and q.stats().depth == 0


def test_release_with_delay(queue_factory: Callable[..., WorkQueue]) -> None:
    q = queue_factory()
    q.put(b"later")
    item = q.take(timeout=1)
    assert item is not None
    item.release(delay=1.0)
    assert q.take(timeout=0.3) is None, "a delayed item came back early"
    again = q.take(timeout=5)
    assert again is not None and again.body == b"later" and again.attempt == 2
    again.ack()


def test_prefetch_locks_many_in_one_go_and_acks_in_batch(queue_factory: Callable[..., WorkQueue]) -> None:
    q = queue_factory()
    q.put_all([b"%d" % i for i in range(25)])
    before = q.requests
    items = q.take_many(10, timeout=1)
    # list items + list taken + 10 reads (pipelined) + one lock transaction for all ten
    assert len(items) == 10 and q.requests - before == 13
    assert q.stats().in_flight == 10
    before = q.requests
    q.ack_all(items)
    assert q.requests - before == 1, "ten acks in one transaction"
    assert q.stats().depth == 15


def test_stats(queue_factory: Callable[..., WorkQueue]) -> None:
    q = queue_factory()
    empty = q.stats()
    assert (empty.depth, empty.in_flight, empty.oldest_age_s) == (0, 0, None)
    q.put_all([b"a", b"b"])
    item = q.take(timeout=1)
    stats = q.stats()
    assert (stats.depth, stats.in_flight, stats.dead_lettered) == (2, 1, 0)
    assert stats.oldest_age_s is not None and 0 <= stats.oldest_age_s < 60
    assert item is not None


def test_bad_input_is_refused_clearly(queue_factory: Callable[..., WorkQueue]) -> None:
    q = queue_factory(max_item_bytes=10)
    with pytest.raises(ConfigError, match="max_item_bytes=10"):
        q.put(b"x" * 11)
    with pytest.raises(ConfigError, match="priority 1000 is out of range"):
        q.put(b"x", priority=1000)
    with pytest.raises(ConfigError, match="max_attempts"):
        QueueOptions.make(max_attempts=0)


def test_waiting_workers_get_items_put_later(queue_factory: Callable[..., WorkQueue]) -> None:
    got: list[bytes] = []
    lock = threading.Lock()

    def worker() -> None:
        q = queue_factory()
        item = q.take(timeout=20)
        if item:
            with lock:
                got.append(item.body)
            item.ack()

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    producer = queue_factory()
    until(lambda: producer.stats().waiting_workers == 4, "the four workers waiting in line", timeout=20)
    for i in range(4):
        producer.put(b"%d" % i)  # one at a time: each wakes one waiter
    for t in threads:
        t.join(30)
    assert sorted(got) == [b"0", b"1", b"2", b"3"]


def _herd_run(
    zookeeper: ZooKeeperHarness, queue_factory: Callable[..., WorkQueue], workers: int
) -> tuple[float, float]:
    """Idle workers wait while items trickle in one by one: the worst case for a herd. Returns
    (ZooKeeper requests, watch notifications) per consumed item, summed over the workers."""
    items = 40
    handles = [queue_factory(f"herd-{workers}") for _ in range(workers)]
    consumed: list[str] = []
    lock = threading.Lock()

    def work(q: WorkQueue) -> None:
        while item := q.take(timeout=60):  # long-poll, as real workers do
            item.ack()
            if item.body == b"stop":
                return
            with lock:
                consumed.append(item.id)

    threads = [threading.Thread(target=work, args=(h,), daemon=True) for h in handles]
    for t in threads:
        t.start()
    producer = queue_factory(f"herd-{workers}")
    until(lambda: producer.stats().waiting_workers == workers, "every worker in line")
    base_requests = sum(h.requests for h in handles)
    base_notes = sum(h.notifications for h in handles)
    for i in range(items):
        producer.put(b"%d" % i)
        until(lambda i=i: len(consumed) > i, "the item to be consumed")
    requests = (sum(h.requests for h in handles) - base_requests) / items
    notes = (sum(h.notifications for h in handles) - base_notes) / items
    producer.put_all([b"stop"] * workers)
    for t in threads:
        t.join(30)
    assert len(set(consumed)) == items
    return requests, notes


def test_no_herd_requests_and_notifications_per_item_stay_flat(
    zookeeper: ZooKeeperHarness, queue_factory: Callable[..., WorkQueue]
) -> None:
    """Requests and notifications per consumed item, from 1 to 16 idle workers: printed and asserted
    bounded (counts, not times). Seed 001's design wakes every worker and has each list the queue on
    every change, so its counts grow with the number of workers; here they stay flat."""
    results = {w: _herd_run(zookeeper, queue_factory, w) for w in (1, 4, 8, 16)}
    for w, (requests, notes) in results.items():
        print(f"[herd] workers={w:2d} requests/item={requests:5.2f} notifications/item={notes:4.2f}")
    one, sixteen = results[1], results[16]
    # a herd costs at least one notification and one listing per worker per item: 16 at 16 workers
    assert sixteen[1] <= 6.0, f"{sixteen[1]:.1f} notifications per item with 16 workers"
    assert sixteen[0] <= 2.5 * one[0], f"requests per item grew from {one[0]:.1f} to {sixteen[0]:.1f}"
    assert sixteen[1] <= 2.5 * max(one[1], 1.0), f"notifications per item grew from {one[1]:.1f} to {sixteen[1]:.1f}"


@pytest.mark.slow
def test_chaos_10000_items_8_workers_kill9_and_session_expiry(zookeeper: ZooKeeperHarness, tmp_path: Path) -> None:
    """10,000 items, 8 worker processes; workers are killed with -9 (and replaced) and others have
    their sessions expired while they work. Every item is acked exactly once, none is lost, items of
    dead workers are redelivered, and poison items are dead-lettered after max_attempts."""
    rng = random.Random(7)
    producer = WorkQueue(zookeeper.client(), "chaos", chroot=zookeeper.root)
    poison = [b"poison-%d" % i for i in range(10)]
    bodies = [b"item-%d" % i for i in range(10_000)]
    events = ["kill", "expire"] * 6 + ["kill", "kill"]
    # The items go in by tranches, one per event and a last one, and each event fires once its
    # tranche is half taken: the chaos happens while items are processed however fast the machine
    # and its workers are. (Keyed to the depth of one queue filled at once, the events fell behind
    # the workers: starting a replacement worker takes a second or more on a loaded 2-core machine,
    # and the queue ran dry after 4 kills, on a slow machine and again with a faster server.)
    size = len(bodies) // (len(events) + 1)
    tranches = [bodies[i * size : (i + 1) * size] for i in range(len(events))] + [bodies[len(events) * size :]]
    poison_ids = set(producer.put_all(poison))
    good_ids: set[str] = set()

    args = ["--hosts", zookeeper.connect_string, "--chroot", zookeeper.root, "--queue", "chaos",
            "--max-attempts", "6", "--prefetch", "4", "--work-ms", "4", "--session-timeout", "3"]  # fmt: skip
    counter = iter(range(1000))
    workers = [WorkerProcess(tmp_path, "queue_worker.py", f"w{next(counter)}", args).start() for _ in range(8)]
    everyone = list(workers)

    def sessions(worker: WorkerProcess) -> list[list[str]]:
        return [line.split() for line in worker.lines() if line.startswith("session ")]

    kills = expiries = 0
    depths_at_events: list[int] = []
    for event, tranche in zip(events, tranches, strict=False):
        good_ids.update(producer.put_all(tranche))
        until(lambda: producer.stats().depth <= size // 2, f"the queue's depth down to {size // 2}", 120)
        depths_at_events.append(producer.stats().depth)
        if event == "kill":
            victim = rng.randrange(len(workers))
            workers[victim].kill()  # kill -9 mid-work
            workers[victim] = WorkerProcess(tmp_path, "queue_worker.py", f"w{next(counter)}", args).start()
            everyone.append(workers[victim])
            kills += 1
            continue
        # a worker just started may not have a session yet
        until(lambda: any(sessions(w) for w in workers), "a worker with a session", 60)
        _, sid, password = rng.choice([s for w in workers if (s := sessions(w))])[-1]
        expire_session_by_id(zookeeper.connect_string, int(sid, 16), bytes.fromhex(password))
        expiries += 1
    good_ids.update(producer.put_all(tranches[-1]))  # the last tranche, for the redeliveries to mix with
    until(lambda: producer.stats().depth == 0, "the queue drained", 240)
    for w in workers:
        w.stop()
    assert producer.stats().depth == 0, "the queue did not drain"

    acked: collections.Counter[str] = collections.Counter()
    acking: set[str] = set()
    for w in everyone:
        for line in w.lines():
            kind, _, item_id = line.partition(" ")
            if kind == "acked":
                acked[item_id] += 1
            elif kind == "acking":
                acking.add(item_id)
    dead = {d.id for d in producer.dead_letters()}
    print(f"\n[chaos] kills={kills} expiries={expiries} acked={sum(acked.values())} dead={len(dead)}")
    assert min(depths_at_events) > 0, f"an event came after its tranche was done: depths {depths_at_events}"
    assert max(acked.values()) == 1, "an item was acked twice"
    assert dead == poison_ids, "exactly the poison items are dead-lettered"
    assert good_ids <= acking, f"lost items: {sorted(good_ids - acking)[:5]}"
    # an item without an 'acked' line was being acked when its worker was killed
    assert len(good_ids - set(acked)) <= kills * 4
