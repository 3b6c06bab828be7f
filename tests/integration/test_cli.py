"""The `zeps` command against a real ZooKeeper and broker: output, JSON and exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq

from harness import ZooKeeperHarness
from zeps.broker import BrokerConfig, BrokerServer
from zeps.coordination.queue import WorkQueue
from zeps.options import QueueOptions
from zeps.protocol import Attach, Subscribe, encode
from zeps_dev.process import ManagedProcess, free_port, wait_until

Zeps = Callable[..., subprocess.CompletedProcess[str]]


@pytest.fixture
def zeps(zookeeper: ZooKeeperHarness, tmp_path: Path) -> Zeps:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ZEPS_", "KUBE"))}
    env["KUBECONFIG"] = str(tmp_path / "no-cluster")  # settings must come from flags here

    def run(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        argv = [
            sys.executable,
            "-m",
            "zeps.cli",
            "-n",
            "cli",
            "--zookeeper",
            zookeeper.connect_string,
            "--chroot",
            zookeeper.root,
            *args,
        ]
        return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout, check=False)

    return run


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerServer]:
    server = BrokerServer(BrokerConfig(tmp_path / "journal", ("prices",))).start()
    yield server
    server.stop()


def test_topic_publish_and_subscribe(zeps: Zeps, zookeeper: ZooKeeperHarness) -> None:
    argv = [
        sys.executable,
        "-m",
        "zeps.cli",
        "-n",
        "cli",
        "--zookeeper",
        zookeeper.connect_string,
        "--chroot",
        zookeeper.root,
        "--json",
        "topic",
        "subscribe",
        "news",
        "--consumer-id",
        "cli-1",
        "--count",
        "2",
        "--timeout",
        "30",
    ]
    subscriber = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    wait_until(lambda: zeps("topic", "publish", "news", "warm-up").returncode == 0, timeout=20, interval=0.3,
               what="a warm-up publish that finds the subscriber registered")  # fmt: skip
    published = zeps("--json", "topic", "publish", "news", "hello")
    assert published.returncode == 0 and len(json.loads(published.stdout)["published"]) == 1
    out, _ = subscriber.communicate(timeout=40)
    bodies = [json.loads(line)["body"] for line in out.splitlines()]
    assert subscriber.returncode == 0 and bodies[-1] == "hello"
    nobody = zeps("topic", "publish", "silence", "x")
    assert nobody.returncode == 4 and "has no subscribers" in nobody.stderr
    quiet = zeps("topic", "subscribe", "silence", "--timeout", "1")
    assert quiet.returncode == 1


def test_queue_put_take_stats_dead_letter(zeps: Zeps, zookeeper: ZooKeeperHarness) -> None:
    assert zeps("queue", "put", "jobs", "a", "b").returncode == 0
    stats = json.loads(zeps("--json", "queue", "stats", "jobs").stdout)
    assert stats["depth"] == 2 and stats["in_flight"] == 0
    taken = zeps("--json", "queue", "take", "jobs", "--count", "2")
    assert taken.returncode == 0 and sorted(json.loads(line)["body"] for line in taken.stdout.splitlines()) == [
        "a",
        "b",
    ]
    assert zeps("queue", "take", "jobs", "--timeout", "0.5").returncode == 1, "empty queue: exit 1"
    worker = WorkQueue(
        zookeeper.client(), "jobs", namespace="cli", chroot=zookeeper.root, options=QueueOptions.make(max_attempts=1)
    )
    worker.put(b"poison")
    item = worker.take(timeout=5)
    assert item is not None
    item.release()  # its only attempt: dead-lettered
    dead = zeps("--json", "queue", "dead-letter", "jobs")
    assert json.loads(dead.stdout)["body"] == "poison"
    assert json.loads(zeps("--json", "queue", "dead-letter", "jobs", "--redrive").stdout) == {"redriven": 1}
    assert zeps("queue", "put", "jobs", "x", "--priority", "1000").returncode == 2, "usage error"


def test_batches_publish_consume_lag_reset(zeps: Zeps) -> None:
    assert zeps("batches", "publish", "orders", "o1", "o2").stdout.strip() == "orders-1"
    assert zeps("batches", "publish", "orders", "o3").stdout.strip() == "orders-2"
    first = zeps("--json", "batches", "consume", "orders", "--consumer", "billing")
    assert [json.loads(line)["batch"] for line in first.stdout.splitlines()] == ["orders-1", "orders-2"]
    assert zeps("batches", "consume", "orders", "--consumer", "billing").returncode == 1, "nothing new"
    assert json.loads(zeps("--json", "batches", "lag", "orders").stdout) == {"lag": {"billing": 0}}
    assert zeps("batches", "reset", "orders", "--consumer", "billing", "--to", "2").returncode == 0
    again = zeps("--json", "batches", "consume", "orders", "--consumer", "billing")
    assert [json.loads(line)["records"] for line in again.stdout.splitlines()] == [["o3"]]


def test_stream_publish_replay_tail(zeps: Zeps, broker: BrokerServer) -> None:
    ep = ["--endpoint", broker.endpoint]
    assert zeps(*ep, "stream", "publish", "prices", "eu.fr", "1", "2", "3").returncode == 0
    replay = zeps(*ep, "--json", "stream", "replay", "prices", "--since", "1", "--timeout", "1")
    assert [json.loads(line)["sequence"] for line in replay.stdout.splitlines()] == [2, 3]
    by_time = zeps(*ep, "stream", "replay", "prices", "--since", "2000-01-01T00:00:00Z", "--count", "3")
    assert by_time.returncode == 0 and len(by_time.stdout.splitlines()) == 3
    bad = zeps(*ep, "stream", "replay", "prices", "--since", "yesterday")
    assert bad.returncode == 3 and "give a sequence number or an ISO time" in bad.stderr
    assert zeps(*ep, "stream", "tail", "prices", "--timeout", "1").returncode == 1, "nothing new: exit 1"


def test_a_publish_run_again_with_its_producer_id_publishes_only_what_the_broker_lacks(
    zeps: Zeps, broker: BrokerServer
) -> None:
    ep = ["--endpoint", broker.endpoint, "--json"]
    first = zeps(*ep, "stream", "publish", "prices", "k", "a", "b", "--producer-id", "job-42")
    assert json.loads(first.stdout) == {"published": 2, "held": 0}
    retry = zeps(*ep, "stream", "publish", "prices", "k", "a", "b", "c", "--producer-id", "job-42")
    assert json.loads(retry.stdout) == {"published": 1, "held": 2}
    replay = zeps(*ep, "stream", "replay", "prices", "--since", "0", "--timeout", "1")
    assert [json.loads(line)["body"] for line in replay.stdout.splitlines()] == ["a", "b", "c"]


def test_errors_say_what_to_do(zeps: Zeps, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ZEPS_", "KUBE"))}
    env["KUBECONFIG"] = str(tmp_path / "nothing")
    missing = subprocess.run(
        [sys.executable, "-m", "zeps.cli", "queue", "stats", "jobs"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert missing.returncode == 3 and "set KUBECONFIG, or pass the settings" in missing.stderr
    unreachable = zeps("--endpoint", f"tcp://127.0.0.1:{free_port()}", "stream", "publish", "prices", "k", "v")
    assert unreachable.returncode == 4 and "no broker answered" in unreachable.stderr


def test_broker_command_and_stream_lag(zeps: Zeps, zookeeper: ZooKeeperHarness, tmp_path: Path) -> None:
    """`zeps broker` serves a stream and joins its ZooKeeper group; `zeps stream lag` reads the facts
    it publishes there every second: the tail, and how far behind a subscription or a position is."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    broker = ManagedProcess(
        "zeps-broker-command",
        [sys.executable, "-m", "zeps.cli", "broker", "--stream", "prices", "--data-dir", str(tmp_path / "journal"),
         "--bind", endpoint, "--zookeeper", zookeeper.connect_string, "--chroot", zookeeper.root,
         "--namespace", "cli", "--member", "prices-0", "--metrics-port", str(free_port())],
        log_path=tmp_path / "broker.log",
    )  # fmt: skip
    broker.start()
    try:
        assert zeps("--endpoint", endpoint, "stream", "publish", "prices", "eu.fr", "1", "2", "3").returncode == 0
        slow = zmq.Context.instance().socket(zmq.DEALER)  # a raw peer that subscribes and grants no credit
        slow.setsockopt(zmq.LINGER, 0)
        slow.connect(endpoint)
        with slow:
            for command in (Attach(stream="prices", version=1), Subscribe(pattern="eu.", latest=0)):
                slow.send(encode(command))

            def lag() -> dict[str, Any]:
                out = zeps("--json", "stream", "lag", "prices", "--position", "1")
                assert out.returncode in (0, 1), out.stderr  # 1: no facts published yet
                return json.loads(out.stdout) if out.returncode == 0 else {}

            wait_until(lambda: lag().get("subscriptionCount") == 1, timeout=30, what="the broker's facts")
            facts = lag()
            assert facts["lastSequence"] == 3 and facts["positionLag"] == 2
            (sub,) = facts["subscriptions"]
            assert sub["pattern"] == "eu." and sub["lag"] == 3 and not sub["live"]
            human = zeps("stream", "lag", "prices")
            assert human.returncode == 0 and "last sequence 3" in human.stdout and "pattern 'eu.'" in human.stdout
    finally:
        broker.stop()
    gone = zeps("stream", "lag", "prices")
    assert gone.returncode == 4 and "no live broker is registered for stream cli/prices" in gone.stderr
    assert zeps("broker", "--fsync", "sometimes").returncode == 2, "argparse's usage error"
