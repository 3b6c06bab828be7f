"""What the kind tests share: an application namespace and the pods a test runs there (the zeps image:
the SDK and the ``zeps`` CLI, as the examples' ``zeps-client`` ServiceAccount), and ZooKeeper's own
shell inside the chart's ensemble. The fixtures are in conftest.py."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from zeps.resources import ZOOKEEPER_CLIENT_LABEL
from zeps_dev.kind import client_pod_spec

ROOT = Path(__file__).resolve().parents[2]
IMAGE = os.environ.get("ZEPS_E2E_IMAGE", "")
SEAWEEDFS_IMAGE = os.environ.get("ZEPS_E2E_SEAWEEDFS_IMAGE", "")
#: what the API server answers while briefly overloaded (its etcd slow on a busy machine)
TRANSIENT_API_ERRORS = ("etcdserver: request timed out", "etcdserver: leader changed",
                        "the server is currently unable to handle the request")  # fmt: skip
OPERATOR_NAMESPACE = os.environ.get("ZEPS_E2E_NAMESPACE", "zeps-system")
RELEASE = os.environ.get("ZEPS_E2E_RELEASE", "zeps")
CHROOT = "/zeps"  # the chart's default zookeeper.chroot
#: a pod with this label prints its threads' stacks on SIGUSR1 to PID 1; the failure dump asks it to
#: (its process registers faulthandler for SIGUSR1: the signal's default action would end it)
STACK_DUMP_LABEL = "zeps-e2e/stack-dump"


def dump_stacks(cluster: Any, pod: str, namespace: str) -> None:
    """SIGUSR1 to ``pod``'s main process: one that registered faulthandler for it prints every
    thread's stack to its log; waited for there, briefly (none after 10 s: the log says what there
    is). The images have no ``kill`` binary: the shell's builtin sends it."""
    cluster.kubectl("exec", pod, "-n", namespace, "--", "sh", "-c", "kill -USR1 1", check=False)
    with contextlib.suppress(AssertionError):
        cluster.wait_for(
            f"{pod}'s stack dump",
            lambda: (
                "most recent call first"
                in cluster.kubectl("logs", pod, "-n", namespace, "--all-containers", "--tail=400", check=False)
            ),
            timeout=10,
            interval=0.5,
        )


WORKERS = Path(__file__).resolve().parent / "workers"
CONTROL_PLANE = "node-role.kubernetes.io/control-plane"


def docker(*args: str) -> str:
    """``docker ARGS`` on the engine the kind nodes run in (a node is a container): its stdout."""
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=True, timeout=120).stdout.strip()


def helm(*args: str) -> str:
    """The pinned helm against the kind cluster; a failure fails the test with helm's stderr."""
    binary = Path(os.environ["ZEPS_KINDBIN"]) / "helm"
    result = subprocess.run([str(binary), f"--kubeconfig={os.environ['ZEPS_E2E_KUBECONFIG']}", *args],
                            capture_output=True, text=True, timeout=900, check=False)  # fmt: skip
    assert result.returncode == 0, f"helm {' '.join(args[:2])} failed: {result.stderr}"
    return result.stdout


def on_control_plane(spec: dict[str, Any]) -> dict[str, Any]:
    """A client pod's spec kept off the workers, whose loss a test makes."""
    toleration = {"key": CONTROL_PLANE, "operator": "Exists", "effect": "NoSchedule"}
    return {**spec, "nodeSelector": {CONTROL_PLANE: ""}, "tolerations": [toleration]}


def json_lines(text: str) -> list[dict[str, Any]]:
    """The JSON lines (``zeps --json``, the test workers) in a pod's log."""
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def client_namespace(cluster: Any, name: str, *, zookeeper: bool = True) -> App:
    """A new namespace ``name`` for SDK clients: the examples' client RBAC, and (``zookeeper``) the
    label by which the chart's NetworkPolicy lets every pod of it reach ZooKeeper (the cluster admin's
    opt-in; without it only pods labelled so, and the brokers the operator makes, get through)."""
    labels = {ZOOKEEPER_CLIENT_LABEL: "true"} if zookeeper else {}
    namespace = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}}
    cluster.kubectl("create", "-f", "-", input=json.dumps(namespace))
    cluster.wait_for(f"the default SA in {name}", lambda: cluster.kubectl("get", "sa", "default", "-n", name))
    cluster.kubectl("apply", "-n", name, "-f", str(ROOT / "examples" / "client-rbac.yaml"))
    return App(cluster, name)


class App:
    """One application namespace on the kind cluster, and the pods a test runs there."""

    def __init__(self, cluster: Any, namespace: str) -> None:
        self.cluster = cluster
        self.ns = namespace

    # -- manifests -------------------------------------------------------------------------------
    @staticmethod
    def pod_spec(command: str, *, restart: str = "Never") -> dict[str, Any]:
        """``sh -c command`` in the zeps image as the examples' zeps-client ServiceAccount."""
        return client_pod_spec(IMAGE, command, restart=restart)

    def run_pod(self, name: str, command: str) -> None:
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": self.pod_spec(command)}
        self.apply(pod)

    def deployment(self, name: str, command: str, *, replicas: int) -> None:
        spec = self.pod_spec(command, restart="Always")
        self.apply(
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": name},
                "spec": {
                    "replicas": replicas,
                    "selector": {"matchLabels": {"app": name}},
                    "template": {"metadata": {"labels": {"app": name}}, "spec": spec},
                },
            }
        )
        self.cluster.kubectl("rollout", "status", f"deployment/{name}", "-n", self.ns, "--timeout=180s", timeout=210)

    def apply(self, manifest: dict[str, Any] | str) -> None:
        """``kubectl apply``, tried again for 30 s while the API server is briefly overloaded (an
        apply is idempotent, and a kind cluster's etcd on a busy machine can time a request out); any
        other refusal is raised at once."""
        text = manifest if isinstance(manifest, str) else json.dumps(manifest)
        refused: list[AssertionError] = []

        def applied() -> bool:
            try:
                self.cluster.kubectl("apply", "-n", self.ns, "-f", "-", input=text)
            except AssertionError as exc:
                if any(answer in str(exc) for answer in TRANSIENT_API_ERRORS):
                    return False  # overloaded: again
                refused.append(exc)
            return True

        self.cluster.wait_for("kubectl apply past the API server's overload", applied, timeout=30, interval=2)
        if refused:
            raise refused[0]

    def apply_example(self, name: str, **replace: str) -> None:
        text = (ROOT / "examples" / name).read_text()
        for old, new in replace.items():
            text = text.replace(old, new)
        self.apply(text)

    # -- reading ---------------------------------------------------------------------------------
    def get(self, *args: str) -> Any:
        return self.cluster.json(*args, "-n", self.ns)

    def ready(self, kind: str, name: str, timeout: int = 180) -> dict[str, Any]:
        self.cluster.kubectl(
            "wait", "--for=condition=Ready", f"{kind}/{name}", "-n", self.ns, f"--timeout={timeout}s",
            timeout=timeout + 30,
        )  # fmt: skip
        return dict(self.get(kind, name))

    def logs(self, pod: str, *, previous: bool = False) -> str:
        return str(self.cluster.logs(pod, self.ns, previous=previous, check=not previous))

    def pods(self, app: str) -> list[dict[str, Any]]:
        return list(self.get("pods", "-l", f"app={app}")["items"])

    def status(self, kind: str, name: str) -> dict[str, Any]:
        return dict(self.get(kind, name).get("status", {}))

    def replication(self, stream: str) -> dict[str, Any]:
        """A replicated stream's ``status.replication``: leader, epoch, inSync (empty until reported)."""
        return dict(self.status("zepsstream", stream).get("replication", {}))

    def condition(self, stream: str, kind: str) -> dict[str, Any]:
        """The stream's condition of type ``kind`` (empty if it has none)."""
        conditions = self.status("zepsstream", stream).get("conditions", [])
        return next((c for c in conditions if c.get("type") == kind), {})

    def rolled_pods(self) -> list[dict[str, Any]]:
        """The operator's RollingPod events in this namespace, oldest first (each message begins with
        the pod it restarts)."""
        events = list(self.get("events", "--field-selector", "reason=RollingPod")["items"])
        return sorted(events, key=lambda e: e.get("lastTimestamp") or e["metadata"]["creationTimestamp"])

    # -- clients under load ------------------------------------------------------------------------
    def start_publisher(self, stream: str, count: int, rate: float, group: int, *, keys: int = 0,
                        job: str = "publisher", control_plane: bool = False) -> None:  # fmt: skip
        """A Job publishing bodies 1..``count`` to ``stream`` at about ``rate`` a second, ``group`` per
        confirmed flush, as one idempotent producer (``workers/ledger_publisher.py``; ``keys``: spread
        over that many keys, for a partitioned stream); :meth:`confirmed` reads its progress.
        ``control_plane``: kept off the workers."""
        self.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ledger-publisher"},
                    "data": {"publisher.py": (WORKERS / "ledger_publisher.py").read_text()}})  # fmt: skip
        spec = self.pod_spec(f"exec python /worker/publisher.py {stream} {count} {rate} {group} {keys or ''}")
        spec["containers"][0]["volumeMounts"] = [{"name": "worker", "mountPath": "/worker"}]
        spec["volumes"] = [{"name": "worker", "configMap": {"name": "ledger-publisher"}}]
        labels = {"app": job, STACK_DUMP_LABEL: "1"}
        self.apply({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": job},
                    "spec": {"backoffLimit": 0, "template": {"metadata": {"labels": labels}, "spec": (
                        on_control_plane(spec) if control_plane else spec)}}})  # fmt: skip

    def hurry(self, job: str = "publisher") -> None:
        """The publisher Job publishes the rest without pacing (once the test's faults are over: its
        subscribers then get every body, and the test need not wait out the rate). A publisher that
        has already published everything is left as it is; one that failed fails the test."""
        try:
            self.cluster.kubectl("exec", f"job/{job}", "-n", self.ns, "--", "python", "-c",
                                 "import os, signal; os.kill(1, signal.SIGUSR2)")  # fmt: skip
        except AssertionError:
            # it may have finished between the faults and now: exec cannot enter a completed pod
            pods = self.get("pods", "-l", f"job-name={job}")["items"]
            if not any(pod["status"].get("phase") == "Succeeded" for pod in pods):
                raise

    def confirmed(self, job: str = "publisher") -> list[dict[str, Any]]:
        """The publisher Job's confirmed flushes so far: ``{"confirmed": last body, "t": unix time}``."""
        return [m for m in json_lines(self.logs(f"job/{job}")) if "confirmed" in m]

    def confirmed_past(self, n: int, job: str = "publisher") -> bool:
        lines = self.confirmed(job)
        return bool(lines) and lines[-1]["confirmed"] >= n

    def longest_pause(self, began: float, ended: float, job: str = "publisher") -> float:
        """The longest time between two confirmed flushes of the publisher Job from ``began`` to
        ``ended`` (time.time() here; the publisher's clock is this machine's), in seconds to 0.1: what
        the publisher saw of a fault (it confirms a flush every ``group / rate`` seconds when nothing
        is wrong)."""
        times = [m["t"] for m in self.confirmed(job) if began - 1 <= m["t"] <= ended]
        return round(max((b - a for a, b in itertools.pairwise(times)), default=0.0), 1)

    def wait_succeeded(self, pod: str, timeout: float = 240) -> str:
        """Wait for a pod to succeed and return its log; a failed pod fails the test with its log."""

        def done() -> bool:
            phase = self.get("pod", pod)["status"].get("phase", "")
            if phase == "Failed":  # at once (wait_for takes an AssertionError for "not yet")
                pytest.fail(f"pod {pod} failed:\n{self.logs(pod)}")
            return bool(phase == "Succeeded")

        self.cluster.wait_for(f"pod {self.ns}/{pod} to succeed", done, timeout=timeout)
        return self.logs(pod)


def seaweedfs(app: App, bucket: str, key: str, secret: str) -> None:
    """SeaweedFS (master, volume server, filer and S3 gateway in one pod, its image built here from the
    pinned module) and its Service ``seaweedfs:8333`` in the app's namespace; the identity ``key``,
    ``secret`` its clients use; ``bucket`` made with ``weed shell``, as an operator would."""
    identities = {"identities": [{"name": "zeps", "credentials": [{"accessKey": key, "secretKey": secret}],
                                  "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}  # fmt: skip
    app.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "seaweedfs-identities"},
               "stringData": {"s3.json": json.dumps(identities)}})  # fmt: skip
    args = ["server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-s3.ip.bind=0.0.0.0", "-dir=/data", "-filer", "-s3",
            "-s3.config=/etc/seaweedfs/s3.json", "-s3.autoCreateBucket=false", "-s3.port.iceberg=0",
            "-s3.port.lance=0", "-master.telemetry=false", "-volume.max=32",
            "-master.volumeSizeLimitMB=256"]  # fmt: skip
    container = {
        "name": "seaweedfs", "image": SEAWEEDFS_IMAGE, "imagePullPolicy": "IfNotPresent", "args": args,
        "ports": [{"containerPort": 8333, "name": "s3"}],
        "readinessProbe": {"tcpSocket": {"port": 8333}, "periodSeconds": 2},
        "resources": {"requests": {"cpu": "100m", "memory": "256Mi"}, "limits": {"memory": "1Gi"}},
        "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "allowPrivilegeEscalation": False,
                            "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}},
        "volumeMounts": [{"name": "data", "mountPath": "/data"}, {"name": "tmp", "mountPath": "/tmp"},
                         {"name": "identities", "mountPath": "/etc/seaweedfs", "readOnly": True}],
    }  # fmt: skip
    pod = {"metadata": {"labels": {"app": "seaweedfs"}},
           "spec": {"containers": [container], "securityContext": {"fsGroup": 10001},
                    "volumes": [{"name": "data", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}},
                                {"name": "identities", "secret": {"secretName": "seaweedfs-identities"}}]}}  # fmt: skip
    selector = {"matchLabels": {"app": "seaweedfs"}}
    app.apply({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "seaweedfs"},
               "spec": {"replicas": 1, "selector": selector, "template": pod}})  # fmt: skip
    app.apply({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "seaweedfs"},
               "spec": {"selector": {"app": "seaweedfs"}, "ports": [{"port": 8333, "name": "s3"}]}})  # fmt: skip
    app.cluster.kubectl("rollout", "status", "deployment/seaweedfs", "-n", app.ns, "--timeout=180s", timeout=210)
    _seaweedfs_takes_writes(app)
    shell = ["exec", "-i", "-n", app.ns, "deploy/seaweedfs", "--", "weed", "shell", "-master=127.0.0.1:9333"]

    def bucket_made() -> bool:
        out = str(app.cluster.kubectl(*shell, input=f"s3.bucket.create -name {bucket}\n", check=False))
        return f"created bucket {bucket}" in out

    app.cluster.wait_for(f"bucket {bucket}", bucket_made, timeout=120, interval=3)


def _seaweedfs_takes_writes(app: App) -> None:
    """Wait until SeaweedFS stores a blob (``weed upload``: the master assigns it to the volume server).
    Once, beside a busy machine, its volume server never registered with its master, and every write
    failed for minutes (``no volume server capacity registered yet``) while the S3 port was open: such
    a pod is started again, once, its log printed first."""
    upload = ["exec", "-n", app.ns, "deploy/seaweedfs", "--", "sh", "-c",
              "echo probe > /tmp/zeps-probe && weed upload -master=127.0.0.1:9333 /tmp/zeps-probe"]  # fmt: skip

    def stored() -> bool:
        return '"fid"' in str(app.cluster.kubectl(*upload, check=False))

    try:
        app.cluster.wait_for("SeaweedFS to store a blob", stored, timeout=120, interval=3)
    except AssertionError as exc:
        log = app.cluster.kubectl("logs", "-n", app.ns, "deploy/seaweedfs", "--tail=60", check=False)
        print(f"SeaweedFS stored nothing ({exc}); its pod is started again. Its log's end:\n{log}", flush=True)
        app.cluster.kubectl("delete", "pod", "-n", app.ns, "-l", "app=seaweedfs", "--wait=false")
        app.cluster.kubectl("rollout", "status", "deployment/seaweedfs", "-n", app.ns, "--timeout=180s", timeout=210)
        app.cluster.wait_for("SeaweedFS, started again, to store a blob", stored, timeout=120, interval=3)


def _listing(text: str) -> list[str]:
    """The lines of the shell's output that are ``ls`` listings (``[a, b]``)."""
    return [line for line in text.splitlines() if line.startswith("[") and line.endswith("]")]


class ZooKeeperShell:
    """ZooKeeper's own command-line client (``org.apache.zookeeper.ZooKeeperMain``), run inside a
    server pod of the chart's ensemble: how a test looks at, or damages, what the operator keeps there."""

    def __init__(self, cluster: Any) -> None:
        self.cluster = cluster

    def run(self, *command: str, server: int = 0) -> str:
        line = " ".join(command)
        script = f"java -cp '/opt/zookeeper/lib/*' org.apache.zookeeper.ZooKeeperMain -server 127.0.0.1:2181 {line}"
        return str(
            self.cluster.kubectl(
                "exec", "-n", OPERATOR_NAMESPACE, f"{RELEASE}-zookeeper-{server}", "--", "bash", "-c", script,
                timeout=60, check=False,
            )
        )  # fmt: skip

    @staticmethod
    def addresses(port: int) -> list[str]:
        """Each server's ``host:port`` under the ensemble's Service, server 0 first."""
        return [f"{RELEASE}-zookeeper-{i}.{RELEASE}-zookeeper.{OPERATOR_NAMESPACE}.svc:{port}" for i in range(3)]

    def python(self, worker: str, *args: str, server: int = 0, timeout: float = 120) -> str:
        """The output of ``workers/<worker>`` run by python3 inside server ``server``'s pod (the only
        place the ensemble's NetworkPolicy lets reach the quorum and election ports)."""
        return str(self.cluster.kubectl("exec", "-i", "-n", OPERATOR_NAMESPACE, f"{RELEASE}-zookeeper-{server}", "--",
                                        "python3", "-", *args, input=(WORKERS / worker).read_text(),
                                        timeout=timeout))  # fmt: skip

    def _answered(self, command: str, path: str, answered: Any) -> str:
        """The output of ``command path`` from the first server that answers (``answered(output)``): a
        server whose pod a test deleted, or restarted, may not serve yet. The last output if none did."""
        out = ""
        for server in range(3):
            out = self.run(command, path, server=server)
            if answered(out):
                break
        return out

    def exists(self, path: str) -> bool:
        """Whether ``path`` exists, asked of a server that answers: the shell prints its connection
        ("SyncConnected") on stdout, a missing node's message only on stderr, which is not read."""
        out = self._answered("stat", path, lambda text: "cZxid" in text or "SyncConnected" in text)
        assert "cZxid" in out or "SyncConnected" in out, f"stat {path}: no server answered:\n{out}"
        return "cZxid" in out

    def children(self, path: str) -> list[str]:
        """The children of ``path`` (``ls``); raises if no server printed a list (no such node, no answer)."""
        out = self._answered("ls", path, lambda text: any(_listing(text)))
        listing = _listing(out)
        assert listing, f"ls {path} printed no list:\n{out}"
        return [name.strip() for name in listing[-1][1:-1].split(",") if name.strip()]

    def modes(self) -> dict[int, str]:
        """Each server's role: leader, follower (or "" while it is not serving)."""
        out = {}
        for i in range(3):
            text = self.cluster.kubectl(
                "exec", "-n", OPERATOR_NAMESPACE, f"{RELEASE}-zookeeper-{i}", "--", "bash", "-c",
                "exec 3<>/dev/tcp/127.0.0.1/2181; printf srvr >&3; cat <&3", check=False,
            )  # fmt: skip
            out[i] = text.split("Mode: ")[1].split()[0] if "Mode: " in text else ""
        return out

    def whole(self) -> bool:
        """The ensemble as installed: three Ready pods, one leader and two followers."""
        zookeeper = self.cluster.json("statefulset", f"{RELEASE}-zookeeper", "-n", OPERATOR_NAMESPACE)
        ready = zookeeper["status"].get("readyReplicas") == 3
        return ready and sorted(self.modes().values()) == ["follower", "follower", "leader"]


def wait_seconds(cluster: Any, what: str, check: Any, *, timeout: float = 180) -> float:
    """``cluster.wait_for`` that returns how long the wait took (the fault figures)."""
    started = time.monotonic()
    cluster.wait_for(what, check, timeout=timeout, interval=0.5)
    return time.monotonic() - started
