"""``make demo``: the whole system on an embedded default, with a summary at the end.

1. The local stack (:class:`zeps_dev.stack.LocalStack`): ZooKeeper, the Kubernetes control plane,
   the chart installed with helm, the operator.
2. A Topic, a Queue and a ZepsStream applied with ``kubectl apply -f examples/…`` and waited for
   Ready; the stream's broker started from its Deployment's pod template (no kubelet here).
3. Traffic, through the SDK handles resolved from the resources as a pod would: a cache-invalidation
   broadcast to several subscribers over the Topic; workers taking crawl links from the Queue; a
   Spark pipeline (``examples/demo/orders_pipeline.py``) publishing order events into the stream
   and aggregating them with a streaming query.
4. A summary table — published/delivered per primitive, lag, resources and their status — and a
   consistency check: every published message delivered, every queue item processed, the Spark
   figures equal to the generator's. Everything started is stopped at the end, also on Ctrl-C.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import zeps
from zeps.coordination import close_shared
from zeps.errors import ConfigError, ZepsError
from zeps.resources import PLURALS, ZOOKEEPER_CLIENT_LABEL
from zeps_dev.kind import KindStack, client_pod_spec, kind_stack_from_env
from zeps_dev.process import run_tool
from zeps_dev.stack import REPOSITORY, LocalStack

__all__ = ["Summary", "main", "run"]

NAMESPACE = "zeps-demo"
EXAMPLES = REPOSITORY / "examples"
MANIFESTS = [EXAMPLES / "demo" / "local-volume.yaml", EXAMPLES / "topic.yaml", EXAMPLES / "queue.yaml",
             EXAMPLES / "demo" / "orders-stream.yaml"]  # fmt: skip


def _step(text: str) -> None:
    print(f"[demo] {text}", flush=True)


@dataclass
class Line:
    primitive: str
    resource: str
    published: int
    delivered: int
    lag: int  #: messages still waiting for a consumer at the end
    detail: str
    expected_deliveries: int  #: what "every message delivered" means for this primitive


@dataclass
class Summary:
    lines: list[Line] = field(default_factory=list)
    resources: dict[str, str] = field(default_factory=dict)  #: kind/name -> Ready condition
    spark: dict[str, object] = field(default_factory=dict)
    seconds: float = 0.0

    def problems(self) -> list[str]:
        out = [f"{line.resource}: {line.delivered} delivered, {line.expected_deliveries} expected"
               for line in self.lines if line.delivered != line.expected_deliveries]  # fmt: skip
        out += [f"{line.resource}: {line.lag} messages still waiting" for line in self.lines if line.lag]
        out += [f"{name} is not Ready ({ready})" for name, ready in self.resources.items() if ready != "True"]
        if self.spark.get("mismatch"):
            out.append(f"Spark figures differ from the generator: {self.spark['mismatch']}")
        return out

    def table(self) -> str:
        rows = [("primitive", "resource", "published", "delivered", "lag", "detail")]
        rows += [(x.primitive, x.resource, str(x.published), str(x.delivered), str(x.lag), x.detail)
                 for x in self.lines]  # fmt: skip
        widths = [max(len(r[i]) for r in rows) for i in range(6)]
        text = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
        text.insert(1, "  ".join("-" * w for w in widths))
        text.append("")
        text += [f"{name}: Ready={ready}" for name, ready in sorted(self.resources.items())]
        problems = self.problems()
        text.append("consistent: every message delivered, every item processed" if not problems
                    else "INCONSISTENT: " + "; ".join(problems))  # fmt: skip
        return "\n".join(text)


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _broadcast(invalidations: int, subscribers: int) -> Line:
    topic = zeps.topic("cache-invalidation", namespace=NAMESPACE)
    received = [0] * subscribers
    done = threading.Event()
    lock = threading.Lock()

    def on_message(i: int) -> Callable[[object], None]:
        def take(_message: object) -> None:
            with lock:
                received[i] += 1
                if sum(received) == invalidations * subscribers:
                    done.set()

        return take

    subs = [topic.subscribe(on_message(i), consumer_id=f"cache-node-{i}") for i in range(subscribers)]
    try:
        deadline = time.monotonic() + 30
        while len(topic.queues()) < subscribers and time.monotonic() < deadline:
            time.sleep(0.05)  # the publisher sees new subscribers through a watch
        topic.publish_many([json.dumps({"invalidate": f"product:{n}"}).encode() for n in range(invalidations)])
        topic.flush()
        done.wait(60)
    finally:
        for sub in subs:
            sub.close()
    detail = f"{subscribers} subscribers got {', '.join(map(str, received))}"
    lag = invalidations * subscribers - sum(received)
    return Line("Topic", "cache-invalidation", invalidations, sum(received), lag, detail, invalidations * subscribers)


def _work(links: int, workers: int) -> Line:
    queue = zeps.queue("crawl-links", namespace=NAMESPACE)
    queue.put_all([f"https://shop.example/p/{n}".encode() for n in range(links)])
    done = [0] * workers

    def worker(i: int) -> None:
        mine = zeps.queue("crawl-links", namespace=NAMESPACE)
        while (item := mine.take(timeout=1.0)) is not None:
            with item:  # leaving the block acks it
                done[i] += 1

    threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    stats = queue.stats()
    detail = f"{workers} workers took {', '.join(map(str, done))}; {stats.dead_lettered} dead-lettered"
    return Line("Queue", "crawl-links", links, sum(done), stats.depth, detail, links)


def _spark(
    env: dict[str, str], stream_status: Callable[[], dict[str, Any]], orders: int, workdir: Path
) -> tuple[Line, dict[str, object]]:
    sys.path.insert(0, str(EXAMPLES / "demo"))
    try:
        from orders_pipeline import expected  # type: ignore[import-not-found]  # noqa: PLC0415 — the example's generator
    finally:
        sys.path.pop(0)
    # its own process group, killed whole when it ends or the demo is interrupted: PySpark's JVM ignores
    # SIGINT, and was seen to outlive a driver that Ctrl-C stopped
    job = subprocess.Popen(
        [sys.executable, str(EXAMPLES / "demo" / "orders_pipeline.py"), "--orders", str(orders),
         "--namespace", NAMESPACE, "--out", str(workdir / "revenue")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **env}, start_new_session=True,
    )  # fmt: skip
    try:
        stdout, stderr = job.communicate(timeout=600)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(job.pid, signal.SIGKILL)
        job.wait(30)
    if job.returncode != 0:
        raise ZepsError(f"the Spark pipeline failed:\n{stderr[-3000:]}")
    figures = json.loads(stdout.strip().splitlines()[-1])
    want = {c: {"orders": n, "revenue": round(r, 2)} for c, (n, r) in expected(orders).items()}
    got = figures["countries"]
    mismatch = {
        c: (got.get(c), w)
        for c, w in want.items()
        if got.get(c, {}).get("orders") != w["orders"] or abs(got[c]["revenue"] - w["revenue"]) > 0.01
    }
    status = stream_status()
    revenue = sum(v["revenue"] for v in got.values())
    lag = max(0, int(status.get("lastSequence", 0)) - int(figures["read"]))
    line = Line("ZepsStream", "orders", figures["published"], figures["read"], lag,
                f"Spark: {len(got)} countries, revenue {revenue:,.2f}; journal last sequence "
                f"{status.get('lastSequence', '?')}, {status.get('journalBytes', '?')} bytes", orders)  # fmt: skip
    return line, {"countries": got, "mismatch": mismatch}


def _statuses(kubectl: Callable[..., str]) -> dict[str, str]:
    out = {}
    for kind in PLURALS.values():
        for item in json.loads(kubectl("get", kind, "-n", NAMESPACE, "-o", "json"))["items"]:
            conditions = item.get("status", {}).get("conditions", [])
            ready = next((c["status"] for c in conditions if c["type"] == "Ready"), "?")
            out[f"{item['kind']}/{item['metadata']['name']}"] = ready
    return out


def run(workdir: Path, *, orders: int = 20_000, links: int = 200, invalidations: int = 20, subscribers: int = 3,
        workers: int = 3, progress: Callable[[str], None] = _step) -> Summary:  # fmt: skip
    started = time.monotonic()
    summary = Summary()
    with LocalStack(workdir, namespace=NAMESPACE, progress=progress) as stack:
        for manifest in MANIFESTS:
            progress(f"kubectl apply -f {manifest.relative_to(REPOSITORY)}")
            stack.kubectl("apply", "-n", NAMESPACE, "-f", str(manifest))
        stack.wait_ready("topic", "cache-invalidation")
        stack.wait_ready("queue", "crawl-links")
        progress("Topic and Queue Ready; starting the orders broker from its Deployment's pod template "
                 "(no kubelet here: it runs as a local process)")  # fmt: skip
        stack.run_broker("orders")
        stack.wait_ready("zepsstream", "orders", timeout=120)
        progress("ZepsStream orders Ready")
        with _environment(stack.env()):  # the SDK resolves the resources as a pod would
            progress(f"broadcasting {invalidations} cache invalidations to {subscribers} subscribers")
            summary.lines.append(_broadcast(invalidations, subscribers))
            progress(f"{workers} workers processing {links} crawl links from the Queue")
            summary.lines.append(_work(links, workers))
            progress(f"Spark: publishing {orders} order events, then a streaming query aggregating them")
            line, summary.spark = _spark(stack.env(), lambda: stack.get("zepsstream", "orders")["status"], orders,
                                         workdir)  # fmt: skip
            summary.lines.append(line)
            close_shared()  # the handles' ZooKeeper sessions end before ZooKeeper does
        summary.resources = _statuses(stack.kubectl)
        progress("stopping everything the demo started")
    summary.seconds = time.monotonic() - started
    return summary


# -- on kind: the same demo with everything in pods -------------------------------------------------
#: ``make demo CLUSTER=kind`` on a kind cluster that already runs the chart (the e2e suite's): its
#: kubeconfig, and (:data:`ON_CLUSTER_IMAGE`) the zeps image its nodes hold. The demo then makes and
#: removes its namespace only; without it, it makes a cluster of its own and deletes it at the end.
ON_CLUSTER = "ZEPS_DEMO_KUBECONFIG"
ON_CLUSTER_IMAGE = "ZEPS_DEMO_IMAGE"


class _KindDemo:
    """The demo's traffic as pods on a kind cluster: SDK clients in the zeps image, resolving their
    handles through the ``zeps-client`` ServiceAccount. ``kubectl`` is the pinned binary,
    ``kubeconfig`` the cluster's."""

    def __init__(self, kubectl: Path, kubeconfig: Path, image: str, progress: Callable[[str], None]) -> None:
        self.kubectl_argv = [str(kubectl), f"--kubeconfig={kubeconfig}"]
        self.image = image
        self.progress = progress

    def kubectl(self, *args: str, input: str | None = None) -> str:
        return run_tool([*self.kubectl_argv, *args], timeout=300, input=input)

    def apply(self, manifest: dict[str, Any] | str) -> None:
        text = manifest if isinstance(manifest, str) else json.dumps(manifest)
        self.kubectl("apply", "-n", NAMESPACE, "-f", "-", input=text)

    def pod(self, name: str, command: str) -> None:
        self.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
                    "spec": client_pod_spec(self.image, command)})  # fmt: skip

    def lines(self, pod: str) -> list[dict[str, Any]]:
        log = self.kubectl("logs", pod, "-n", NAMESPACE)
        return [json.loads(line) for line in log.splitlines() if line.startswith("{")]

    def status(self, kind: str, name: str) -> dict[str, Any]:
        return dict(json.loads(self.kubectl("get", kind, name, "-n", NAMESPACE, "-o", "json")).get("status", {}))

    def wait(self, what: str, check: Callable[[], bool], timeout: float = 240) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline:
                raise ZepsError(f"timed out after {timeout:.0f}s waiting for {what}")
            time.sleep(1)

    def finished(self, pod: str) -> list[dict[str, Any]]:
        def done() -> bool:
            phase = self.status("pod", pod).get("phase")
            if phase == "Failed":
                raise ZepsError(f"pod {pod} failed:\n{self.kubectl('logs', pod, '-n', NAMESPACE)}")
            return phase == "Succeeded"

        self.wait(f"pod {pod}", done)
        return self.lines(pod)

    def broadcast(self, invalidations: int, subscribers: int) -> Line:
        names = [f"cache-node-{i}" for i in range(subscribers)]
        for name in names:
            self.pod(name, f"zeps --json topic subscribe cache-invalidation --consumer-id {name} "
                           f"--count {invalidations} --timeout 240")  # fmt: skip
        self.wait(f"{subscribers} subscribers in the Topic's status",
                  lambda: self.status("topic", "cache-invalidation").get("subscribers") == subscribers)  # fmt: skip
        bodies = " ".join(f"invalidate:product:{n}" for n in range(invalidations))
        self.pod("invalidator", f"zeps --json topic publish cache-invalidation {bodies}")
        self.finished("invalidator")
        received = [len(self.finished(name)) for name in names]
        detail = f"{subscribers} subscriber pods got {', '.join(map(str, received))}"
        lag = invalidations * subscribers - sum(received)
        return Line("Topic", "cache-invalidation", invalidations, sum(received), lag, detail,
                    invalidations * subscribers)  # fmt: skip

    def work(self, links: int, workers: int) -> Line:
        urls = [f"https://shop.example/p/{n}" for n in range(links)]
        self.pod("link-producer", "zeps --json queue put crawl-links " + " ".join(urls))
        self.finished("link-producer")
        loop = "while true; do zeps --json queue take crawl-links --count 5 --timeout 5 || true; done"
        spec = client_pod_spec(self.image, loop, restart="Always")
        self.apply({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "crawler"},
                    "spec": {"replicas": workers, "selector": {"matchLabels": {"app": "crawler"}},
                             "template": {"metadata": {"labels": {"app": "crawler"}}, "spec": spec}}})  # fmt: skip

        def per_pod() -> dict[str, list[str]]:
            pods = json.loads(self.kubectl("get", "pods", "-n", NAMESPACE, "-l", "app=crawler", "-o", "json"))
            out = {}
            for pod in pods["items"]:
                if pod["status"].get("phase") == "Running":
                    out[pod["metadata"]["name"]] = [m["body"] for m in self.lines(pod["metadata"]["name"])]
            return out

        self.wait("the crawler pods to take every link",
                  lambda: len({u for taken in per_pod().values() for u in taken}) >= links)  # fmt: skip
        taken = per_pod()
        self.kubectl("scale", "deployment/crawler", "-n", NAMESPACE, "--replicas=0")
        done = sum(len(t) for t in taken.values())
        unique = len({u for t in taken.values() for u in t})
        dead = self.status("queue", "crawl-links").get("deadLettered", 0)
        detail = f"{len(taken)} worker pods took {', '.join(str(len(t)) for t in taken.values())}; {dead} dead-lettered"
        return Line("Queue", "crawl-links", links, done, links - unique, detail, links)


def _forwarding(log: Path) -> Callable[[], bool]:
    return lambda: "Forwarding from" in log.read_text()


def run_kind(*, orders: int = 20_000, links: int = 200, invalidations: int = 20, subscribers: int = 3,
             workers: int = 3, progress: Callable[[str], None] = _step) -> Summary:  # fmt: skip
    """The demo on kind: the operator, ZooKeeper, the brokers and the SDK workloads in pods; the Spark
    pipeline on this machine, reaching ZooKeeper and the broker through ``kubectl port-forward``. On
    a cluster of its own (``zeps-demo``, deleted at the end), or on the one :data:`ON_CLUSTER` names
    (its namespace deleted at the end, the cluster left as it was)."""
    started = time.monotonic()
    counts = {"orders": orders, "links": links, "invalidations": invalidations, "subscribers": subscribers,
              "workers": workers}  # fmt: skip
    kubeconfig = os.environ.get(ON_CLUSTER, "")
    if kubeconfig:
        image = os.environ.get(ON_CLUSTER_IMAGE, "")
        if not image:
            raise ConfigError(f"{ON_CLUSTER} is set but {ON_CLUSTER_IMAGE} is not: name the zeps image its nodes hold")
        kubectl = Path(os.environ.get("ZEPS_KINDBIN", "")) / "kubectl"
        demo = _KindDemo(kubectl, Path(kubeconfig), image, progress)
        try:
            summary = _on_kind(demo, progress, **counts)
        finally:
            progress(f"deleting namespace {NAMESPACE} and stopping everything the demo started")
            demo.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--wait=true", "--timeout=300s")
    else:
        stack: KindStack = kind_stack_from_env(cluster_name="zeps-demo")
        with stack:
            assert stack.cluster is not None
            demo = _KindDemo(stack.binaries / "kubectl", stack.cluster.kubeconfig, stack.zeps_image, progress)
            summary = _on_kind(demo, progress, **counts)
            progress("deleting the cluster and stopping everything the demo started")
    summary.seconds = time.monotonic() - started
    return summary


def _on_kind(demo: _KindDemo, progress: Callable[[str], None], *, orders: int, links: int, invalidations: int,
             subscribers: int, workers: int) -> Summary:  # fmt: skip
    """The demo's namespace (labelled as a client of ZooKeeper, for a chart whose NetworkPolicy is
    on), its resources, and its traffic."""
    from zeps_dev.process import ManagedProcess, free_port  # noqa: PLC0415

    summary = Summary()
    namespace = {"apiVersion": "v1", "kind": "Namespace",
                 "metadata": {"name": NAMESPACE, "labels": {ZOOKEEPER_CLIENT_LABEL: "true"}}}  # fmt: skip
    demo.kubectl("create", "-f", "-", input=json.dumps(namespace))
    demo.kubectl("apply", "-n", NAMESPACE, "-f", str(EXAMPLES / "client-rbac.yaml"))
    for manifest in MANIFESTS[1:]:  # the local volume is for the local stack; kind has a StorageClass
        progress(f"kubectl apply -f {manifest.relative_to(REPOSITORY)}")
        demo.apply(manifest.read_text().replace('storageClassName: ""', "storageClassName: standard"))
    for kind, name in (("topic", "cache-invalidation"), ("queue", "crawl-links"), ("zepsstream", "orders")):
        demo.kubectl("wait", "--for=condition=Ready", f"{kind}/{name}", "-n", NAMESPACE, "--timeout=300s")
    progress("Topic, Queue and ZepsStream Ready; the orders broker runs in its own pod")
    progress(f"broadcasting {invalidations} cache invalidations to {subscribers} subscriber pods")
    summary.lines.append(demo.broadcast(invalidations, subscribers))
    progress(f"{workers} worker pods processing {links} crawl links from the Queue")
    summary.lines.append(demo.work(links, workers))
    progress("Spark (on this machine, through port-forwards): publishing order events, then aggregating them")
    with tempfile.TemporaryDirectory(prefix="zeps-demo-") as tmp:
        forwards = []
        try:
            ports = {"zookeeper": free_port(), "broker": free_port()}
            for what, target, namespace_of, remote in (
                ("zookeeper", "pod/zeps-zookeeper-0", "zeps-system", 2181),
                ("broker", "svc/orders-broker", NAMESPACE, 5555),
            ):
                forward = ManagedProcess(
                    f"port-forward {what}",
                    [*demo.kubectl_argv, "port-forward", "-n", namespace_of, "--address", "127.0.0.1", target,
                     f"{ports[what]}:{remote}"],
                    log_path=Path(tmp) / f"forward-{what}.log",
                )  # fmt: skip
                forward.start()
                forwards.append(forward)
                forward.wait_ready(_forwarding(forward.log_path), timeout=60)
            env = {
                "KUBECONFIG": demo.kubectl_argv[1].removeprefix("--kubeconfig="),
                "ZEPS_ZOOKEEPER": f"127.0.0.1:{ports['zookeeper']}",
                "ZEPS_NAMESPACE": NAMESPACE,
                "ZEPS_STREAM_ORDERS_ENDPOINT": f"tcp://127.0.0.1:{ports['broker']}",
            }
            line, summary.spark = _spark(env, lambda: demo.status("zepsstream", "orders"), orders, Path(tmp))
            summary.lines.append(line)
        finally:
            for forward in forwards:
                forward.stop()
    summary.resources = _statuses(demo.kubectl)
    return summary


def main() -> int:
    cluster = os.environ.get("CLUSTER") or "local"
    if cluster not in ("local", "kind"):
        print(f"demo: CLUSTER={cluster} is not one of local, kind", file=sys.stderr)
        return 2
    try:
        if cluster == "kind":
            summary = run_kind()
        else:
            with tempfile.TemporaryDirectory(prefix="zeps-demo-") as tmp:
                summary = run(Path(tmp))
    except ZepsError as exc:
        print(f"demo failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("demo interrupted; everything it started was stopped", file=sys.stderr)
        return 130
    print()
    print(summary.table())
    print(f"\ndone in {summary.seconds:.0f}s")
    return 0 if not summary.problems() else 1


if __name__ == "__main__":
    sys.exit(main())
