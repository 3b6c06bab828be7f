"""Spark on Kubernetes for real: the examples/spark pipeline with its driver and executors in pods on
kind, exactly-once under the loss of an executor pod and of the driver pod; and
examples/spark/spark-submit.sh run as a user would, from this machine (the driver here in client
mode, the executors in pods connecting back to it at the kind network's gateway).

The manifests are the ones in examples/spark (the image tag is replaced with the one ``make e2e``
built, and the pipeline's driver and executors get the tests' JVM flags, which change only the JIT);
orders come from a publisher pod (workers/order_publisher.py) whose orders have known
totals. Nothing is mocked. Figures are printed as ``FIGURE {...}`` lines (pytest -s shows them).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
from kindapp import ROOT, App, json_lines

from harness import TEST_JVM_OPTIONS
from zeps_dev.kind import spark_kind_figure

SPARK_IMAGE = os.environ.get("ZEPS_E2E_SPARK_IMAGE", "")
EXAMPLES = ROOT / "examples" / "spark"
WORKERS = Path(__file__).resolve().parent / "workers"
COUNTRIES = ["fr", "de", "it", "es", "nl"]  # as workers/order_publisher.py makes them
DRIVER = "zeps-pipeline-driver"
#: each publisher of the loss test writes at most this many orders (10 minutes at 100 a second); the
#: test stops it long before, once the pipeline has recovered from the loss it caused
PUBLISHER_LIMIT = 60_000


VENV_BIN = ROOT / ".venv" / "bin"
KIND_FIGURE = spark_kind_figure()  # read by benchmarks/bench_spark.py


def _figure(**fields: object) -> None:
    print("\nFIGURE " + json.dumps(fields), flush=True)


def _expected(first: int, count: int) -> dict[str, dict[str, float]]:
    totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for i in range(first, first + count):
        totals[COUNTRIES[i % 5]][0] += 1
        totals[COUNTRIES[i % 5]][1] += i % 97 + 0.25
    return {c: {"orders": n, "revenue": round(r, 2)} for c, (n, r) in totals.items()}


def _resources(app: App) -> None:
    """What the pipeline needs: examples/spark's resources, RBAC and checkpoint PVC, and the publisher."""
    app.apply_example("spark/resources.yaml")
    app.ready("zepsstream", "orders", timeout=240)
    app.ready("queue", "revenue")
    app.apply_example("spark/driver-rbac.yaml")
    app.apply_example("spark/checkpoints-pvc.yaml")
    source = (WORKERS / "order_publisher.py").read_text()
    app.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "publisher"},
               "data": {"publisher.py": source}})  # fmt: skip


def _publish(app: App, name: str, first: int, count: int, rate: float) -> None:
    spec = App.pod_spec(f"exec python /publisher/publisher.py {first} {count} {rate}")
    spec["containers"][0]["volumeMounts"] = [{"name": "publisher", "mountPath": "/publisher"}]
    spec["volumes"] = [{"name": "publisher", "configMap": {"name": "publisher"}}]
    app.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec})


def _driver_manifest() -> str:
    """examples/spark/driver-pod.yaml with the image built here, and the tests' JVM flags for its
    driver and executors (``harness.TEST_JVM_OPTIONS``: the JIT at C1 only)."""
    example = (EXAMPLES / "driver-pod.yaml").read_text().replace("zeps-spark:0.1.0", SPARK_IMAGE)
    last_conf = "        - --conf=spark.sql.shuffle.partitions=4\n"
    assert example.count(last_conf) == 1, "examples/spark/driver-pod.yaml changed: place the JVM flags anew"
    jvms = "".join(
        f"        - --conf=spark.{role}.extraJavaOptions={TEST_JVM_OPTIONS}\n" for role in ("driver", "executor")
    )
    return example.replace(last_conf, last_conf + jvms)


def _totals_of(batch: dict[str, Any]) -> dict[str, Any]:
    """One batch of ``revenue`` as ``zeps --json batches consume`` prints it, as the pipeline's
    ``report`` prints it: its id (``revenue-<number>``), the micro-batch that made it, the totals per
    country."""
    lines = [json.loads(record) for record in batch["records"]]
    entry: dict[str, Any] = {"batch": batch["batch"], "microBatch": lines[0]["microBatch"]}
    assert {line["microBatch"] for line in lines} == {entry["microBatch"]}, f"one batch, two micro-batches: {lines}"
    for line in lines:
        entry[line["country"]] = {"orders": line["orders"], "revenue": round(line["revenue"], 2)}
    return entry


def _published(app: App, pod: str) -> list[dict[str, Any]]:
    """The pipeline's progress lines: one per micro-batch it published."""
    return [line for line in json_lines(app.logs(pod)) if "published" in line]


def _executors(app: App) -> list[str]:
    pods = app.get("pods", "-l", "spark-role=executor")["items"]
    return [p["metadata"]["name"] for p in pods if p["status"].get("phase") == "Running"]


def _writing(app: App, publisher: str) -> bool:
    return bool(app.get("pod", publisher)["status"].get("phase") == "Running")


def _stop_publishing(app: App, publisher: str) -> int:
    """Stop a publisher after the group it has in flight (SIGTERM, which it handles); the last order
    it published, every one of them confirmed."""
    app.cluster.kubectl("exec", publisher, "-n", app.ns, "--", "sh", "-c", "kill -TERM 1")
    published = [line["published"] for line in json_lines(app.wait_succeeded(publisher, timeout=120))
                 if "published" in line]  # fmt: skip
    return int(published[-1])


@pytest.mark.timeout(1500)
def test_pipeline_in_pods_is_exactly_once_when_an_executor_and_the_driver_are_lost(cluster: Any, app: App) -> None:
    """Orders come in two parts, each from a publisher pod writing 100 a second: the executor pod is
    deleted while the first is writing, the driver pod while the second is. Each publisher writes
    until the test has seen the pipeline recover from its loss (however long that takes on a busy
    machine, up to its limit), then stops; the counts must still be exact."""
    _resources(app)
    _publish(app, "publisher-a", 0, PUBLISHER_LIMIT, rate=100)
    cluster.wait_for("the first orders", lambda: json_lines(app.logs("publisher-a")), timeout=120)

    submitted = time.monotonic()
    app.apply(_driver_manifest())
    cluster.wait_for("the first micro-batch published", lambda: _published(app, DRIVER), timeout=300, interval=1)
    first_batch_s = time.monotonic() - submitted
    executors = _executors(app)
    assert len(executors) == 2, f"executor pods: {executors}"
    for pod in executors:
        spec = app.get("pod", pod)["spec"]
        assert spec["automountServiceAccountToken"] is False, "executors have no Kubernetes credentials"
        assert spec["containers"][0]["image"] == SPARK_IMAGE

    # an executor pod is lost mid-stream: Spark reruns its tasks on a new executor pod
    assert _writing(app, "publisher-a"), "the executor must be lost while orders are being written"
    lost = executors[0]
    killed = time.monotonic()
    cluster.kubectl("delete", "pod", lost, "-n", app.ns, "--grace-period=0", "--force", check=False)
    cluster.wait_for(
        "a new executor pod", lambda: len([p for p in _executors(app) if p != lost]) == 2, timeout=240, interval=1
    )
    executor_back_s = time.monotonic() - killed
    before = len(_published(app, DRIVER))
    cluster.wait_for("micro-batches after the loss", lambda: len(_published(app, DRIVER)) >= before + 2, timeout=240)
    assert _writing(app, "publisher-a"), "the pipeline must recover while orders are still being written"
    second = _stop_publishing(app, "publisher-a") + 1

    # the driver pod is lost mid-stream: submitted again, it resumes from the checkpoint on the PVC
    _publish(app, "publisher-b", second, PUBLISHER_LIMIT, rate=100)
    cluster.wait_for("the second part's first orders", lambda: json_lines(app.logs("publisher-b")), timeout=120)
    before = len(_published(app, DRIVER))
    cluster.wait_for("a micro-batch of the second part", lambda: len(_published(app, DRIVER)) > before, timeout=120)
    assert _writing(app, "publisher-b"), "the driver must be lost while orders are being written"
    cluster.kubectl("delete", "pod", DRIVER, "-n", app.ns, "--grace-period=0", "--force", "--wait=true")
    cluster.wait_for("the executors to go with their driver", lambda: not _executors(app), timeout=180)
    resubmitted = time.monotonic()
    app.apply(_driver_manifest())
    cluster.wait_for("a micro-batch from the new driver", lambda: _published(app, DRIVER), timeout=300, interval=1)
    resumed_s = time.monotonic() - resubmitted
    resumed_from = _published(app, DRIVER)[0]["published"]
    assert resumed_from > 0, "the new driver continued the query's micro-batches instead of starting over"
    assert _writing(app, "publisher-b"), "the new driver must resume while orders are still being written"

    total = _stop_publishing(app, "publisher-b") + 1
    cluster.wait_for(
        f"the pipeline to count all {total} orders",
        lambda: _published(app, DRIVER)[-1]["orders"] == total,
        timeout=300,
        interval=2,
    )
    cluster.kubectl("delete", "pod", DRIVER, "-n", app.ns, "--wait=true")

    # what the batch queue holds, read back with the SDK in a client pod (the Spark batch-queue source
    # reads a batch queue on kind in test_batch_store.py; the pipeline's own `report` runs in make test)
    app.run_pod("report", "exec zeps --json batches consume revenue --consumer report")
    report = [_totals_of(batch) for batch in json_lines(app.wait_succeeded("report", timeout=240))]
    micro_batches = [b["microBatch"] for b in report]
    assert micro_batches == sorted(set(micro_batches)), f"a micro-batch published twice: {micro_batches}"
    assert [b["batch"] for b in report] == [f"revenue-{n}" for n in range(1, len(report) + 1)], "a batch missing"
    counts = [sum(v["orders"] for k, v in b.items() if k in COUNTRIES) for b in report]
    assert counts == sorted(set(counts)), f"totals must grow with every batch: {counts}"
    last = {k: v for k, v in report[-1].items() if k in COUNTRIES}
    assert last == _expected(0, total), "every order counted exactly once"
    _figure(
        what="spark pipeline on kind",
        orders=total,
        submit_to_first_batch_s=round(first_batch_s, 1),
        executor_pod_replaced_s=round(executor_back_s, 1),
        driver_resubmitted_to_first_batch_s=round(resumed_s, 1),
        micro_batches=len(report),
        resumed_at_micro_batch=resumed_from,
    )


def _kind_gateway() -> str:
    """This machine's address on the kind Docker network: where pods reach a driver running here."""
    out = subprocess.run(
        ["docker", "network", "inspect", "kind", "-f", "{{range .IPAM.Config}}{{.Gateway}} {{end}}"],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout.split()  # fmt: skip
    ipv4 = [address for address in out if "." in address]
    assert ipv4, f"the kind network has no IPv4 gateway: {out}"
    return ipv4[0]


@pytest.mark.timeout(900)
def test_spark_submit_from_this_machine_runs_executors_in_pods(cluster: Any, app: App) -> None:
    """examples/spark/spark-submit.sh as documented: the driver on this machine (pyspark from the
    project's venv as ``python3``, the pinned kubectl, the kind kubeconfig), 2 executor pods of the
    Spark image reading ``orders`` from the broker's Service; the totals must be exact. The range is
    read 3 times; the best rate is the figure make bench-spark reports (reported, not asserted)."""
    _resources(app)
    count = 200_000
    _publish(app, "publisher", 0, count, rate=0)
    app.wait_succeeded("publisher", timeout=600)
    kubectl_dir = os.environ["ZEPS_KINDBIN"]  # the pinned kubectl; spark-submit.sh asks it for the API address
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(VENV_BIN), kubectl_dir, os.environ.get("PATH", "")]),
        "KUBECONFIG": os.environ["ZEPS_E2E_KUBECONFIG"],
        "DRIVER_HOST": _kind_gateway(),
        "IMAGE": SPARK_IMAGE,
        "NAMESPACE": app.ns,
        "THROUGH": str(count),
        "REPEAT": "3",  # the first read includes the executors' Python workers starting; the best of 3 is the figure
    }
    started = time.monotonic()
    result = subprocess.run(
        ["bash", str(EXAMPLES / "spark-submit.sh")], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    seconds = time.monotonic() - started
    assert result.returncode == 0, f"spark-submit.sh failed:\n{result.stderr[-4000:]}"
    lines = json_lines(result.stdout)
    totals = {
        line["country"]: {"orders": line["orders"], "revenue": line["revenue"]} for line in lines if "country" in line
    }
    assert totals == _expected(0, count), "every order of 1..THROUGH counted once"
    rates = [line["rows_per_s"] for line in lines if "rows_per_s" in line]
    assert len(rates) == 3, f"one rate line per read: {lines}"
    cluster.wait_for(
        "the executor pods to go with the driver",
        lambda: not app.get("pods", "-l", "spark-role=executor")["items"],
        timeout=120,
    )
    figure = {
        "what": "spark-submit.sh from this machine, 2 executor pods",
        "rows": count,
        "read_rows_per_s": max(rates),
        "first_read_rows_per_s": rates[0],
        "submit_to_exit_s": round(seconds, 1),
    }
    _figure(**figure)
    # make bench-spark reports the latest of these next to its local[2] figures (reported, not asserted)
    KIND_FIGURE.parent.mkdir(parents=True, exist_ok=True)
    KIND_FIGURE.write_text(json.dumps({**figure, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z")}) + "\n")
