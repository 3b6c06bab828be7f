"""A kind cluster with real nodes, built and run here: what ``make e2e`` and ``make demo CLUSTER=kind`` use.

``KindStack`` puts the pieces together, each in its own module:

* :class:`~zeps_dev.docker.DockerEngine` — the user's engine, or a dockerd of zeps;
* :class:`~zeps_dev.images.ImageBuilder` — the node image and the project's images, no registry;
* :class:`KindCluster` — ``kind create cluster`` with that node image (kubeconfig in the zeps cache,
  never the user's ``~/.kube/config``), a control-plane node and ``workers`` worker nodes, each
  node's pod network wired here (:func:`wire_pod_network`: what kindnetd would do), images loaded
  with ``kind load``, CoreDNS answering only for the cluster (no upstream forwarding: nothing in the
  cluster tries any address outside it);
* the chart installed with helm: the operator and a 3-server ZooKeeper ensemble in pods.

Stopping (also on Ctrl-C or an exception) deletes the cluster (unless ``ZEPS_KEEP_CLUSTER=1``) and
stops the dockerd of zeps, if one was started.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from zeps.errors import SetupError
from zeps_dev.docker import DockerEngine
from zeps_dev.images import REPOSITORY, ROOTFS, TESTBIN_SOURCES, ImageBuilder, go_module_dir, tree_hash
from zeps_dev.process import LocalServer, run_tool

__all__ = [
    "KindCluster",
    "KindStack",
    "cache_dir",
    "client_pod_spec",
    "kind_stack_from_env",
    "network_policy_controller",
    "wire_pod_network",
]

CHART = REPOSITORY / "charts" / "zeps"
DEFAULT_CLUSTER = "zeps-e2e"
RELEASE = "zeps"
OPERATOR_NAMESPACE = "zeps-system"
#: the e2e cluster's worker nodes: a replicated stream's three brokers each on a node of its own, so
#: that stopping one node container is the loss of one replica (and of one ZooKeeper server)
E2E_WORKERS = 3
#: pytest-xdist workers for the e2e tests that keep to their own namespaces (``ZEPS_E2E_LANES``; 1: one
#: at a time). Two: on 2 cores the suite one test at a time keeps them about half busy.
E2E_LANES = int(os.environ.get("ZEPS_E2E_LANES", "2"))
#: ``ZEPS_E2E_SERIAL_CLUSTER=1``: the ``serial`` e2e tests on a second cluster of their own, made by
#: ``make e2e`` beside the shared tests, not after them on the one cluster. Alone they keep the cores
#: about half idle for 10-14 minutes; beside the shared phase both cores are full, which slows it (the
#: Spark tests most) and puts every test under more load: it shortens a cold CI run by a few minutes
#: (benchmarks/README.md), and is not the default.
E2E_SERIAL_CLUSTER = os.environ.get("ZEPS_E2E_SERIAL_CLUSTER", "0") == "1"
#: the second cluster's name: the suite's cluster's with this after it
SERIAL_SUFFIX = "-serial"
#: ``ZEPS_E2E_SERIAL_EARLY=1`` (CI sets it for ``make e2e-stack``): once the stack is ready, the
#: ``serial`` e2e tests run on it at once, beside ``make test``, whose tiers leave a core idle for much
#: of their run while the cluster would idle until ``make e2e``; the ``make e2e`` that adopts that
#: stack then runs the shared phase only (:func:`serial_phase_passed_early`). Where the stack is ready
#: only as ``make test`` ends (a new machine), the order is the only change.
E2E_SERIAL_EARLY = os.environ.get("ZEPS_E2E_SERIAL_EARLY", "0") == "1"
#: beside a cluster's kubeconfig: the serial phase ``make e2e-stack`` ran on it, and with what
SERIAL_NOTE = "serial-phase.json"
NO_TESTS_COLLECTED = 5  #: pytest's exit code when a run selects no test
#: how long a cluster's deletion waits for its node containers to be gone: an engine removing four
#: node containers killed mid-creation, beside a busy suite, was seen to take more than 40 s
REMOVE_NODES_S = 180.0
#: beside a cluster's kubeconfig: what ``make e2e-stack`` left running, for ``make e2e`` to use
PREPARED_NOTE = "prepared.json"
CNI_CONFIG = "/etc/cni/net.d/10-zeps-ptp.conflist"
#: kind's pod network: the controller-manager gives each node a /24 of it
POD_NETWORK = "10.244.0.0/16"
#: kind's (kubeadm's) Service network
SERVICE_NETWORK = "10.96.0.0/12"


def upstream_node_image() -> str:
    """The node image the pinned kind release defaults to, pinned by digest (read from kind's source,
    ``pkg/apis/config/defaults/image.go``): for users who can pull from a registry."""
    kind = go_module_dir(TESTBIN_SOURCES / "kind", "sigs.k8s.io/kind")
    source = kind / "pkg" / "apis" / "config" / "defaults" / "image.go"
    match = re.search(r'const Image = "([^"]+@sha256:[0-9a-f]{64})"', source.read_text())
    if match is None:
        raise SetupError(f"no pinned default image in {source}")
    return match.group(1)


def cache_dir() -> Path:
    """The zeps cache, as tools/setup.sh finds it: ZEPS_CACHE_DIR, else $XDG_CACHE_HOME/zeps or ~/.cache/zeps."""
    if os.environ.get("ZEPS_CACHE_DIR"):
        return Path(os.environ["ZEPS_CACHE_DIR"])
    return Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "zeps"


def spark_kind_figure() -> Path:
    """Where ``e2e/kind/test_spark.py`` leaves its executors-in-pods figure for ``make bench-spark``."""
    return cache_dir() / "figures" / "spark-kind.json"


def docker_root() -> Path:
    """Where a dockerd of zeps keeps its socket, data and exec roots: ``<cache>/docker``, or
    ``ZEPS_DOCKER_ROOT`` (a short path: the engine's sockets live below it)."""
    return Path(os.environ.get("ZEPS_DOCKER_ROOT") or cache_dir() / "docker")


def _say(line: str) -> None:
    print(f"[e2e] {line}", flush=True)


class KindCluster(LocalServer):
    """One kind cluster in ``engine``; ``kubectl()`` and ``helm()`` talk to it with its own kubeconfig."""

    def __init__(
        self,
        engine: DockerEngine,
        *,
        name: str,
        node_image: str,
        binaries: Path,
        workdir: Path,
        api_port: int = 0,
        workers: int = 0,
        say: Callable[[str], None] = _say,
    ) -> None:
        self.engine = engine
        self.name = name
        self.workers = workers
        self.node_image = node_image
        self.binaries = binaries
        self.workdir = workdir
        self.api_port = api_port
        self.say = say
        self.kubeconfig = workdir / "kubeconfig"
        self.created = False

    # -- commands --------------------------------------------------------------------------------
    def _run(self, argv: Sequence[str], *, timeout: float = 600, input: str | None = None) -> str:
        return run_tool(argv, env=self.engine.env, timeout=timeout, input=input)

    def kind(self, *args: str, timeout: float = 600) -> str:
        return self._run([str(self.binaries / "kind"), *args], timeout=timeout)

    def kubectl(self, *args: str, timeout: float = 300, input: str | None = None) -> str:
        return self._run(
            [str(self.binaries / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args], timeout=timeout, input=input
        )

    def helm(self, *args: str, timeout: float = 900) -> str:
        return self._run([str(self.binaries / "helm"), f"--kubeconfig={self.kubeconfig}", *args], timeout=timeout)

    def exists(self) -> bool:
        return self.name in self.kind("get", "clusters").split()

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        if self.exists():
            if not self.engine.owned:
                raise SetupError(
                    f"a kind cluster named {self.name!r} already exists in your Docker engine and zeps did not "
                    f"create it: set ZEPS_KIND_CLUSTER to another name (or delete it yourself: "
                    f"kind delete cluster --name {self.name})"
                )
            self.say(f"kind: deleting cluster {self.name} left by an earlier run (in the dockerd of zeps)")
            self.kind("delete", "cluster", "--name", self.name, "--kubeconfig", str(self.kubeconfig))
        if self.api_port:
            _check_port_free(self.api_port)
        inspected = self.engine.docker("image", "inspect", "--format", "{{.Size}}", self.node_image, check=False)
        if inspected.returncode == 0:  # else kind says the image is missing
            free = self.engine.free_space()
            _check_disk_for_nodes(free, int(inspected.stdout), 1 + self.workers, ours=self.engine.owned)
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "kind.yaml"
        config.write_text(_kind_config(self.api_port, self.workers))
        nodes = f"a control-plane node and {self.workers} workers" if self.workers else "one node"
        self.say(f"kind: creating cluster {self.name}, {nodes} (node image {self.node_image})")
        started = time.monotonic()
        self.created = True  # from here on, stop() deletes whatever kind made
        self.kind(
            "create", "cluster", "--name", self.name, "--image", self.node_image, "--config", str(config),
            "--kubeconfig", str(self.kubeconfig), "--wait", "0s", "--retain",
            timeout=900,
        )  # fmt: skip
        self.wire_pod_network()  # the nodes are NotReady until each has its CNI config
        self._cluster_dns_only()
        self.kubectl("wait", "--for=condition=Ready", "node", "--all", "--timeout=300s", timeout=330)
        self.kubectl(
            "-n", "kube-system", "rollout", "status", "deployment/coredns", "--timeout=300s", timeout=330
        )  # fmt: skip
        self.say(f"kind: cluster {self.name} ready in {time.monotonic() - started:.0f}s (kubeconfig {self.kubeconfig})")

    def wire_pod_network(self, *, timeout: float = 120) -> None:
        """:func:`wire_pod_network` for this cluster, once every node has its pod CIDR (the
        controller-manager gives each a /24 of kind's :data:`POD_NETWORK` as it registers)."""
        deadline = time.monotonic() + timeout
        while True:
            nodes = json.loads(self.kubectl("get", "nodes", "-o", "json"))["items"]
            if len(nodes) == 1 + self.workers and all(n["spec"].get("podCIDR") for n in nodes):
                break
            if time.monotonic() > deadline:
                have = {n["metadata"]["name"]: n["spec"].get("podCIDR") for n in nodes}
                raise SetupError(f"kind: not every node has a pod CIDR after {timeout:.0f}s: {have}")
            time.sleep(1)

        def docker_exec(node: str, argv: Sequence[str], data: bytes | None) -> None:
            self.engine.docker("exec", "-i", node, *argv, input=data, timeout=60)

        wire_pod_network(nodes, docker_exec)

    def _cluster_dns_only(self) -> None:
        """CoreDNS without its ``forward`` to the node's resolv.conf: names outside the cluster are
        not resolved, so nothing in the cluster sends a DNS query past this machine."""
        cm = json.loads(self.kubectl("-n", "kube-system", "get", "configmap", "coredns", "-o", "json"))
        corefile = cm["data"]["Corefile"]
        patched = re.sub(r"\n\s*forward \. [^\n{]*(\{[^}]*\})?", "", corefile)
        patched = re.sub(r"\n\s*loop\b", "", patched)
        if patched != corefile:
            cm["data"]["Corefile"] = patched
            self.kubectl("replace", "-f", "-", input=json.dumps(cm))
            self.kubectl("-n", "kube-system", "rollout", "restart", "deployment/coredns")

    def enforce_network_policy(self, image: str) -> None:
        """Run :func:`network_policy_controller` with ``image`` (preloaded in the node image) and wait
        until it runs on every node."""
        self.say("kind: NetworkPolicy enforced by kube-router's firewall on every node")
        manifest = json.dumps({"apiVersion": "v1", "kind": "List", "items": network_policy_controller(image)})
        self.kubectl("apply", "-f", "-", input=manifest)
        self.kubectl("-n", "kube-system", "rollout", "status", "daemonset/zeps-kube-router", "--timeout=180s",
                     timeout=210)  # fmt: skip

    def install_expandable_storage(self, image: str) -> None:
        """Run :func:`expandable_storage` with ``image`` and wait until its driver is registered with
        every worker's kubelet (a CSINode lists it), so a claim of its class can be placed at once."""
        self.say(f"kind: StorageClass {EXPANDABLE_STORAGE} (zeps-csi-hostpath: volumes that can grow)")
        manifest = json.dumps({"apiVersion": "v1", "kind": "List", "items": expandable_storage(image)})
        self.kubectl("apply", "-f", "-", input=manifest)
        self.kubectl("-n", "kube-system", "rollout", "status", "daemonset/zeps-csi", "--timeout=180s", timeout=210)
        deadline = time.monotonic() + 60

        def registered() -> int:
            nodes = json.loads(self.kubectl("get", "csinodes", "-o", "json"))["items"]
            return sum(any(d["name"] == CSI_DRIVER for d in n["spec"].get("drivers") or []) for n in nodes)

        while registered() < max(self.workers, 1):  # without workers, the control-plane node runs pods
            if time.monotonic() > deadline:
                raise SetupError(f"{CSI_DRIVER} is not registered with every worker's kubelet after 60 s: see "
                                 "kubectl -n kube-system logs daemonset/zeps-csi -c driver")  # fmt: skip
            time.sleep(1)

    def load(self, *images: str, workers_only: bool = False) -> None:
        """``kind load docker-image`` into every node, or (``workers_only``, with workers) into the
        worker nodes alone: the control-plane node is tainted against workloads, and importing an
        image into a node's containerd costs CPU and seconds per node."""
        nodes = [f"{self.name}-worker{i if i > 1 else ''}" for i in range(1, self.workers + 1)]
        where = ["--nodes", ",".join(nodes)] if workers_only and nodes else []
        self.say(f"kind: loading {', '.join(images)}" + (f" into {', '.join(nodes)}" if where else ""))
        self.kind("load", "docker-image", "--name", self.name, *where, *images, timeout=900)

    def containers(self) -> list[str]:
        """The engine's containers of this cluster (kind labels each node with the cluster's name)."""
        listed = self.engine.docker("ps", "-a", "-q", "--filter", f"label=io.x-k8s.kind.cluster={self.name}")
        return listed.stdout.decode().split()

    def stop(self) -> None:
        """Delete the cluster, and make sure no node container of it is left: a Ctrl-C during
        ``kind create`` can leave the engine finishing a node container after kind listed them."""
        if not self.created:
            return
        self.say(f"kind: deleting cluster {self.name}")
        with contextlib.suppress(SetupError, subprocess.TimeoutExpired):
            self.kind("delete", "cluster", "--name", self.name, "--kubeconfig", str(self.kubeconfig), timeout=300)
        empty_checks, why = 0, ""
        deadline = time.monotonic() + REMOVE_NODES_S
        while time.monotonic() < deadline:
            left = self.containers()
            empty_checks = 0 if left else empty_checks + 1
            if empty_checks == 2:  # twice, a second apart: no container is still being made
                break
            if left:
                removed = self.engine.docker("rm", "-f", *left, check=False)
                why = removed.stderr.decode(errors="replace").strip() if removed.returncode else why
            time.sleep(1)
        else:
            raise SetupError(
                f"could not remove the node containers of kind cluster {self.name} in "
                f"{REMOVE_NODES_S:.0f} s: {self.containers()} ({why or 'docker rm -f said nothing'})"
            )
        self.created = False


def client_pod_spec(image: str, command: str, *, restart: str = "Never") -> dict[str, Any]:
    """A pod spec running ``sh -c command`` in the zeps image as an SDK client: the ServiceAccount of
    ``examples/client-rbac.yaml``, its namespace in ``ZEPS_NAMESPACE``, non-root, read-only root."""
    return {
        "serviceAccountName": "zeps-client",
        "restartPolicy": restart,
        "terminationGracePeriodSeconds": 5,
        "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [
            {
                "name": "app",
                "image": image,
                "imagePullPolicy": "Never",
                "command": ["sh", "-c", command],
                "env": [{"name": "ZEPS_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}],
                "securityContext": {
                    "readOnlyRootFilesystem": True,
                    "allowPrivilegeEscalation": False,
                    "capabilities": {"drop": ["ALL"]},
                },
            }
        ],
    }


def cni_config(subnet: str) -> str:
    """A node's CNI config: a ptp network on its pod CIDR ``subnet``. No masquerading here: a pod's
    traffic to another pod keeps its source address (a NetworkPolicy judges pods by it); traffic
    leaving the cluster's pod network is masqueraded by the node's own rule (:func:`masquerade_rule`)."""
    ptp = {
        "type": "ptp",
        "ipMasq": False,
        "ipam": {
            "type": "host-local",
            "dataDir": "/run/cni-ipam-state",
            "routes": [{"dst": "0.0.0.0/0"}],
            "ranges": [[{"subnet": subnet}]],
        },
        "mtu": 1500,
    }
    portmap = {"type": "portmap", "capabilities": {"portMappings": True}}
    return json.dumps({"cniVersion": "0.3.1", "name": "zeps-kind", "plugins": [ptp, portmap]}, indent=2) + "\n"


def masquerade_rule(subnet: str) -> list[str]:
    """The node's NAT rule for its pods (what kindnetd sets): traffic from ``subnet`` to an address
    outside the cluster's pod network (:data:`POD_NETWORK`: the host, where a client-mode Spark driver
    listens, or a node) leaves with the node's address, so replies come back over the kind network
    whatever routes the far end has; pod-to-pod traffic keeps its pod address."""
    return ["POSTROUTING", "-s", subnet, "!", "-d", POD_NETWORK, "-m", "comment", "--comment", "zeps-kind pods",
            "-j", "MASQUERADE"]  # fmt: skip


def wire_pod_network(
    nodes: Sequence[dict[str, Any]], docker_exec: Callable[[str, Sequence[str], bytes | None], None]
) -> None:
    """What kindnetd does, without its image: on every node (``nodes``: Node objects, named as
    their containers), the CNI config for the node's own pod CIDR, and a route to each other
    node's pod CIDR through that node's address. Idempotent: run again after a node container
    restarts (its routes are gone with its network namespace, and its address may have changed).
    ``docker_exec(node, argv, stdin)`` runs a command in a node container."""
    wired = []
    for node in nodes:
        cidr = node["spec"].get("podCIDR")
        address = next((a["address"] for a in node["status"].get("addresses", []) if a["type"] == "InternalIP"), None)
        if not cidr or not address:
            raise SetupError(f"kind: node {node['metadata']['name']} has no pod CIDR or no InternalIP yet")
        wired.append((node["metadata"]["name"], cidr, address))
    for name, cidr, _address in wired:
        # written beside it and renamed: containerd never reads a half-written config
        write = f"mkdir -p /etc/cni/net.d && cat > {CNI_CONFIG}.new && mv {CNI_CONFIG}.new {CNI_CONFIG}"
        docker_exec(name, ["sh", "-c", write], cni_config(cidr).encode())
        rule = " ".join(f"'{word}'" for word in masquerade_rule(cidr))
        docker_exec(name, ["sh", "-c", f"iptables -t nat -C {rule} 2>/dev/null || iptables -t nat -A {rule}"], None)
        for other, other_cidr, other_address in wired:
            if other != name:
                docker_exec(name, ["ip", "route", "replace", other_cidr, "via", other_address], None)


def network_policy_controller(image: str) -> list[dict[str, Any]]:
    """kube-router as the cluster's NetworkPolicy controller (its firewall only: no BGP router, no
    service proxy), a DaemonSet on every node with the RBAC it needs to watch pods, namespaces, nodes
    and policies. The pod network :func:`wire_pod_network` makes enforces no policy by itself; with
    this, the chart's NetworkPolicy for ZooKeeper is enforced on kind as on a production cluster."""
    name = "zeps-kube-router"
    rules = [
        {"apiGroups": [""], "resources": ["namespaces", "pods", "nodes", "services", "endpoints"],
         "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["", "events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]},
    ]  # fmt: skip
    container = {
        "name": "kube-router",
        "image": image,
        "imagePullPolicy": "Never",
        "args": [
            "--run-router=false",
            "--run-service-proxy=false",
            "--run-firewall=true",
            f"--service-cluster-ip-range={SERVICE_NETWORK}",
            "--iptables-sync-period=1m",
        ],
        "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
        "securityContext": {"privileged": True},
        "livenessProbe": {"httpGet": {"path": "/healthz", "port": 20244}, "periodSeconds": 10},
        "volumeMounts": [{"name": "xtables-lock", "mountPath": "/run/xtables.lock"}],
    }
    # iptables' lock, shared with kube-proxy on the node
    lock = {"name": "xtables-lock", "hostPath": {"path": "/run/xtables.lock", "type": "FileOrCreate"}}
    pod = {"hostNetwork": True, "tolerations": [{"operator": "Exists"}], "containers": [container], "volumes": [lock]}
    return _node_agent(name, rules, pod)


def _node_agent(name: str, rules: list[dict[str, Any]], pod: dict[str, Any]) -> list[dict[str, Any]]:
    """A DaemonSet ``name`` in kube-system whose pods (``pod``: their spec, beside the account and
    priority) run as the ServiceAccount ``name``, bound to a ClusterRole of ``rules``."""
    labels = {"k8s-app": name}
    daemonset = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": name, "namespace": "kube-system", "labels": labels},
        "spec": {
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"serviceAccountName": name, "priorityClassName": "system-node-critical", **pod},
            },
        },
    }
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": name, "namespace": "kube-system"}},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": name},
         "rules": rules},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": name},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
         "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": "kube-system"}]},
        daemonset,
    ]  # fmt: skip


#: the StorageClass whose volumes grow in place (:func:`expandable_storage`), and its CSI driver: the
#: driver of the node image's default class "standard" too (images/kind-node/default-storage.yaml)
EXPANDABLE_STORAGE = "zeps-expandable"
CSI_DRIVER = "hostpath.csi.zeps.dev"


def expandable_storage(image: str) -> list[dict[str, Any]]:
    """The cluster's CSI driver, zeps-csi-hostpath (tools/testbin/k8s/zeps-csi-hostpath), and a StorageClass of it whose
    claims can grow (``allowVolumeExpansion``), named by the tests of a stream's storage grown in
    place: on kind's own node image too, whose default class (local-path) cannot expand a volume. The
    node image built here has no other provisioner: its default class "standard" is this driver's
    (images/kind-node/default-storage.yaml). The driver keeps each volume as a folder on its node,
    beside the upstream external-provisioner (one per node, ``--node-deployment``: a volume is made
    and deleted on the node the scheduler chose) and external-resizer (leader-elected), in one
    DaemonSet on the workers; kubelet then finishes each expansion on the node (NodeExpandVolume), as
    for a disk."""
    name, plugin = "zeps-csi", f"/var/lib/kubelet/plugins/{CSI_DRIVER}"
    read = ["get", "list", "watch"]
    rules = [
        {"apiGroups": [""], "resources": ["persistentvolumes"],
         "verbs": [*read, "create", "delete", "patch", "update"]},
        {"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": [*read, "patch", "update"]},
        {"apiGroups": [""], "resources": ["persistentvolumeclaims/status"], "verbs": ["patch", "update"]},
        {"apiGroups": [""], "resources": ["pods", "nodes"], "verbs": read},
        {"apiGroups": [""], "resources": ["events"], "verbs": [*read, "create", "update", "patch"]},
        {"apiGroups": ["storage.k8s.io"], "resources": ["storageclasses", "csinodes", "volumeattachments",
                                                         "volumeattributesclasses"], "verbs": read},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": [*read, "create", "update", "patch",
                                                                                   "delete"]},
    ]  # fmt: skip
    node_name = {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}
    socket = {"name": "socket", "mountPath": "/csi"}
    sidecar = {"image": image, "imagePullPolicy": "Never", "env": [node_name], "volumeMounts": [socket]}
    containers = [
        {"name": "driver", "image": image, "imagePullPolicy": "Never", "env": [node_name],
         "command": ["/usr/local/bin/zeps-csi-hostpath"], "securityContext": {"privileged": True},
         "volumeMounts": [socket, {"name": "registration", "mountPath": "/registration"},
                          {"name": "kubelet", "mountPath": "/var/lib/kubelet", "mountPropagation": "Bidirectional"},
                          {"name": "data", "mountPath": "/var/lib/zeps-csi"}]},
        {**sidecar, "name": "provisioner", "command": ["/usr/local/bin/csi-provisioner"],
         "args": ["--csi-address=/csi/csi.sock", "--node-deployment=true", "--feature-gates=Topology=true",
                  "--timeout=60s"]},
        {**sidecar, "name": "resizer", "command": ["/usr/local/bin/csi-resizer"],
         "args": ["--csi-address=/csi/csi.sock", "--leader-election", "--leader-election-namespace=kube-system",
                  "--timeout=60s"]},
    ]  # fmt: skip

    def folder(volume: str, path: str, kind: str) -> dict[str, Any]:
        return {"name": volume, "hostPath": {"path": path, "type": kind}}

    volumes = [
        folder("socket", plugin, "DirectoryOrCreate"),
        folder("registration", "/var/lib/kubelet/plugins_registry", "Directory"),
        folder("kubelet", "/var/lib/kubelet", "Directory"),
        folder("data", "/var/lib/zeps-csi", "DirectoryOrCreate"),
    ]
    return [
        {"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver", "metadata": {"name": CSI_DRIVER},
         "spec": {"attachRequired": False, "podInfoOnMount": False, "fsGroupPolicy": "File",
                  "volumeLifecycleModes": ["Persistent"]}},
        {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": EXPANDABLE_STORAGE},
         "provisioner": CSI_DRIVER, "reclaimPolicy": "Delete", "volumeBindingMode": "WaitForFirstConsumer",
         "allowVolumeExpansion": True},
        *_node_agent(name, rules, {"containers": containers, "volumes": volumes}),
    ]  # fmt: skip


def _kind_config(api_port: int, workers: int) -> str:
    return (
        "# written by zeps_dev.kind for make e2e\n"
        "kind: Cluster\n"
        "apiVersion: kind.x-k8s.io/v1alpha4\n"
        "networking:\n"
        "  apiServerAddress: 127.0.0.1\n"
        f"  apiServerPort: {api_port}\n"
        "  disableDefaultCNI: true  # no kindnetd image: zeps_dev.kind wires each node's pod network\n"
        "kubeadmConfigPatches:\n"
        "  - |\n"
        "    kind: KubeletConfiguration\n"
        "    cgroupDriver: cgroupfs  # the node image runs no dbus-daemon (images/kind-node/Dockerfile)\n"
        "nodes:\n"
        "  - role: control-plane\n" + _WORKER * workers
    )


#: a worker runs no static pod, so its kubelet watches no manifest folder: each inotify instance
#: counts against the host's per-user limit (128 by default), which every kind node shares (a
#: joining kubelet takes the cluster's configuration: the flag overrides it)
_WORKER = (
    "  - role: worker\n"
    "    kubeadmConfigPatches:\n"
    "      - |\n"
    "        kind: JoinConfiguration\n"
    "        nodeRegistration:\n"
    "          kubeletExtraArgs:\n"
    '            pod-manifest-path: ""\n'
)


def _check_port_free(port: int) -> None:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            raise SetupError(
                f"port {port} on 127.0.0.1 is taken (ZEPS_KIND_API_PORT): "
                "choose a free one, or unset it for a random port"
            ) from None


def _check_disk_for_nodes(free: tuple[Path, int] | None, image_bytes: int, nodes: int, *, ours: bool) -> None:
    """Each kind node's ``/var`` is a Docker volume made as a copy of the node image's (the images
    preloaded in it) that grows with the images loaded into the node: a cluster needs at least its
    nodes times the node image's size free on the engine's disk. With less, ``kind create cluster``
    fails midway with Docker's ``failed to copy files``; this says so before it starts. ``free``:
    :meth:`DockerEngine.free_space` (None: not known here, nothing checked); ``ours``: a dockerd of zeps
    (whose folder ``ZEPS_DOCKER_ROOT`` moves), else an engine zeps only uses."""
    if free is None:
        return
    root, have = free
    need = nodes * image_bytes
    if have < need:
        raise SetupError(
            f"kind: {have / 1e9:.1f} GB free on the Docker engine's disk ({root}), and a cluster of {nodes} nodes "
            f"needs at least {need / 1e9:.1f} GB: each node's /var starts as a copy of the node image "
            f"({image_bytes / 1e9:.1f} GB) and grows with the images loaded into it. Free some space on it"
            + (", or give the dockerd of zeps a larger disk (ZEPS_DOCKER_ROOT)" if ours else "")
        )


class KindStack(LocalServer):
    """Engine, images, cluster and chart: everything in pods, on real nodes."""

    def __init__(
        self,
        *,
        binaries: Path,
        zookeeper_home: Path,
        venv_python: Path,
        cluster_name: str = DEFAULT_CLUSTER,
        keep: bool = False,
        detached: bool | None = None,
        spark: bool = False,
        workers: int = 0,
        engine: DockerEngine | None = None,
        api_port: int | None = None,
        say: Callable[[str], None] = _say,
    ) -> None:
        self.say = say
        self.workers = workers
        self.keep = keep
        self.spark = spark  # build and load the Spark image too (the e2e suite's Spark jobs)
        self.binaries = binaries
        self.cache = cache_dir()
        # detached: a dockerd of ours outlives this process (a kept or prepared stack); otherwise the
        # kernel stops it if this process dies. An engine passed in is another stack's, started and
        # stopped by it (:meth:`companion`)
        self.shares_engine = engine is not None
        #: a companion's stack (:meth:`companion`): its images are used as they are, none built
        self.images_of: KindStack | None = None
        self.engine = engine or DockerEngine(docker_root(), say=say, detached=keep if detached is None else detached)
        self.api_port = int(os.environ.get("ZEPS_KIND_API_PORT", "0")) if api_port is None else api_port
        self.builder = ImageBuilder(
            self.engine, binaries=binaries, cache=self.cache, zookeeper_home=zookeeper_home, say=say
        )
        self.venv_python = venv_python
        self.cluster_name = cluster_name
        self.cluster: KindCluster | None = None
        self.zeps_image = ""
        self.zookeeper_image = ""
        self.spark_image = ""
        self.seaweedfs_image = ""
        self.prometheus_image = ""
        self.csi_image = ""
        #: the images the node image holds besides kubeadm's (none in a node image not built here)
        self.preloaded: tuple[str, ...] = ()
        #: what enforces NetworkPolicy, in the node image built here ("": a node image from elsewhere)
        self.network_policy_image = ""
        #: the operator's ZooKeeper identity on this cluster (the ensemble's super user): new each stack
        self.zookeeper_password = secrets.token_hex(12)
        self.timings: dict[str, float] = {}

    def build_images(self) -> str:
        """Every image the stack needs, built or found cached (the engine must be running); returns
        the node image."""
        t0 = time.monotonic()
        if self.images_of is not None:  # a companion: exactly what its stack runs (started by now)
            stack = self.images_of
            assert stack.cluster is not None, "a companion starts after its stack"
            self.zeps_image, self.zookeeper_image = stack.zeps_image, stack.zookeeper_image
            self.seaweedfs_image, self.prometheus_image = stack.seaweedfs_image, stack.prometheus_image
            self.csi_image, self.preloaded = stack.csi_image, stack.preloaded
            self.network_policy_image = stack.network_policy_image
            return stack.cluster.node_image
        self.zookeeper_image = self.builder.zookeeper_image()
        self.seaweedfs_image = self.builder.seaweedfs_image()
        self.prometheus_image = self.builder.prometheus_image()
        self.csi_image = self.builder.csi_image()
        node_image = self._node_image()
        self.zeps_image = self.builder.zeps_image(self.venv_python)
        if self.spark:
            self.spark_image = self.builder.spark_image(self.venv_python)
        self.timings["images_s"] = time.monotonic() - t0
        return node_image

    def _new_cluster(self, node_image: str) -> KindCluster:
        return KindCluster(
            self.engine,
            name=self.cluster_name,
            node_image=node_image,
            binaries=self.binaries,
            workdir=self.cache / "kind" / "clusters" / self.cluster_name,
            api_port=self.api_port,
            workers=self.workers,
            say=self.say,
        )

    def companion(self) -> KindStack:
        """A second cluster like this one, beside it in the same engine, for the e2e tests that must
        run alone (``serial``: they stop a node, upgrade or remove the chart): its own nodes, chart and
        ZooKeeper ensemble, the same images (no Spark image: no serial test runs a Spark job). Its
        API server gets a free port of its own; :meth:`stop` deletes its cluster and leaves the
        engine to this stack."""
        companion = KindStack(
            binaries=self.binaries,
            zookeeper_home=self.builder.zookeeper_home,
            venv_python=self.venv_python,
            cluster_name=self.cluster_name + SERIAL_SUFFIX,
            keep=self.keep,
            spark=False,
            workers=self.workers,
            engine=self.engine,
            api_port=0,
            say=lambda line: self.say(f"[{self.cluster_name + SERIAL_SUFFIX}] {line}"),
        )
        companion.images_of = self
        return companion

    @property
    def prepared_note(self) -> Path:
        """Where :meth:`prepare` says what it left running, for the next :meth:`start` to adopt."""
        return self.cache / "kind" / "clusters" / self.cluster_name / PREPARED_NOTE

    @property
    def serial_note(self) -> Path:
        """Where :func:`run_serial_early` records the serial phase it ran on this stack's cluster."""
        return self.cache / "kind" / "clusters" / self.cluster_name / SERIAL_NOTE

    def serial_identity(self) -> dict[str, Any]:
        """What a serial phase ran against: the images and nodes (:meth:`_what_it_runs`) and the e2e
        suite's own files (the tests, their helpers and workloads)."""
        assert self.cluster is not None
        return {**self._what_it_runs(self.cluster.node_image), "suite": tree_hash(REPOSITORY / "e2e")}

    def _what_it_runs(self, node_image: str) -> dict[str, Any]:
        images = [self.zeps_image, self.zookeeper_image, self.seaweedfs_image, self.prometheus_image, self.csi_image,
                  self.spark_image]  # fmt: skip
        return {"node_image": node_image, "images": images, "workers": self.workers}

    def prepare(self) -> None:
        """``make e2e-stack``: :meth:`start`, then leave the engine, the cluster and the chart running
        with a note (:attr:`prepared_note`) that the next ``make e2e`` of the same sources adopts. CI
        runs it beside ``make test``, so ``make e2e`` starts with its cluster ready. On failure
        everything it started is stopped."""
        self.start()
        assert self.cluster is not None
        note = {**self._what_it_runs(self.cluster.node_image), "zookeeper_password": self.zookeeper_password}
        self.prepared_note.unlink(missing_ok=True)
        self.prepared_note.touch(mode=0o600)  # the ensemble's super user's password: this user's only
        self.prepared_note.write_text(json.dumps(note))
        self.say(f"stack ready in {self.timings['ready_s']:.0f}s and kept for make e2e: {json.dumps(self.timings)}")

    def _adopt(self, node_image: str) -> bool:
        """Use the stack :meth:`prepare` left, if it runs exactly what this run would start (the same
        node image, images and workers: the same sources) and is healthy. The note is used once: a
        stack that does not fit is deleted (zeps made it, in whichever engine), and a new one made."""
        try:
            note = json.loads(self.prepared_note.read_text())
        except (OSError, ValueError):
            return False
        self.prepared_note.unlink()
        cluster = self._new_cluster(node_image)
        cluster.created = cluster.exists()
        wanted = self._what_it_runs(node_image)
        why = next((f"its {k} differs" for k in wanted if note.get(k) != wanted[k]), None)
        if why is None and not cluster.created:
            why = "it is gone"
        if why is None:
            try:
                cluster.kubectl("wait", "--for=condition=Ready", "node", "--all", "--timeout=60s", timeout=90)
                cluster.kubectl("wait", "--for=condition=Ready", "pod", "--all", "-n", OPERATOR_NAMESPACE,
                                "--timeout=120s", timeout=150)  # fmt: skip
            except (SetupError, subprocess.TimeoutExpired) as exc:
                why = f"it is not healthy ({exc})"
        if why is not None:
            self.say(f"kind: not using the cluster make e2e-stack prepared: {why}; making a new one")
            cluster.stop()  # deletes it if it exists: zeps made it
            return False
        self.cluster = cluster
        self.zookeeper_password = str(note["zookeeper_password"])
        self.say(f"kind: using cluster {self.cluster_name}, prepared by make e2e-stack with these images")
        return True

    def start(self) -> None:
        t0 = time.monotonic()
        try:
            if not self.shares_engine:
                self.engine.start()
            node_image = self.build_images()
            t1 = time.monotonic()
            if self._adopt(node_image):
                self.timings["adopted_s"] = time.monotonic() - t1
                self.timings["ready_s"] = time.monotonic() - t0
                return
            self.cluster = self._new_cluster(node_image)
            self.cluster.start()
            if self.network_policy_image:
                self.cluster.enforce_network_policy(self.network_policy_image)
            self.timings["cluster_create_s"] = time.monotonic() - t1
            # zeps everywhere (test clients run on the control-plane node too: test_replication.py),
            # the servers and Spark on the workers, where their pods go
            t2 = time.monotonic()
            self.cluster.load(self.zeps_image)
            images = (self.zookeeper_image, self.seaweedfs_image, self.prometheus_image, self.csi_image,
                      self.spark_image)  # fmt: skip
            # what the node image does not hold; one load per call (kind loads all of a call's images
            # into every node that lacks any one of them)
            missing = [i for i in images if i and i not in self.preloaded]
            if missing:
                self.cluster.load(*missing, workers_only=True)
            self.cluster.install_expandable_storage(self.csi_image)
            t3 = time.monotonic()
            self.timings["load_s"] = t3 - t2
            self.install_chart()
            self.timings["chart_s"] = time.monotonic() - t3
            self.timings["ready_s"] = time.monotonic() - t0
        except BaseException:
            self.stop()
            raise

    def _node_image(self) -> str:
        choice = os.environ.get("ZEPS_KIND_NODE_IMAGE", "")
        if choice == "upstream":
            image = upstream_node_image()
            self.say(f"images: using kind's own default node image {image} (pulled by kind; needs a registry)")
            return image
        if choice:
            self.say(f"images: using the node image ZEPS_KIND_NODE_IMAGE={choice}")
            return choice
        # the pinned servers' images change only with their pins: inside the node image, no node
        # imports them again (the project's images change with every source change: loaded)
        self.preloaded = (self.zookeeper_image, self.seaweedfs_image, self.prometheus_image, self.csi_image)
        self.network_policy_image = self.builder.network_policy_image  # in the node image
        return self.builder.node_image(preload=self.preloaded)

    def chart_values(self) -> list[str]:
        repository, tag = self.zeps_image.split(":")
        zk_repository, zk_tag = self.zookeeper_image.split(":")
        return [
            f"image.repository={repository}",
            f"image.tag={tag}",
            "image.pullPolicy=Never",
            "zookeeper.ensemble.enabled=true",
            f"zookeeper.ensemble.image.repository={zk_repository}",
            f"zookeeper.ensemble.image.tag={zk_tag}",
            "zookeeper.ensemble.image.pullPolicy=Never",
            f"zookeeper.auth.password={self.zookeeper_password}",  # ACLs work as users set them up
            "operator.resyncSeconds=10",
            "brokers.allowedImages={zeps.local/*}",  # the images built here (a test runs a broker from one)
            # a server per worker: a node's loss then takes one server, never the quorum
            *(["zookeeper.ensemble.antiAffinity=required"] if self.workers >= 3 else []),
        ]

    def chart_files(self) -> list[str]:
        """Values files under the ``--set`` values: the production values where the cluster has the
        three workers they need (servers on nodes of their own): the e2e suite runs against them."""
        return [str(CHART / "values-production.yaml")] if self.workers >= 3 else []

    def install_chart(self, *, upgrade: bool = False, extra: Sequence[str] = ()) -> None:
        assert self.cluster is not None
        verb = "upgrade" if upgrade else "install"
        self.say(f"helm: {verb} {RELEASE} (operator + 3 ZooKeeper servers) into {OPERATOR_NAMESPACE}")
        args = [
            verb, RELEASE, str(CHART), "--namespace", OPERATOR_NAMESPACE,
            "--create-namespace", "--wait", "--timeout", "10m",
        ]  # fmt: skip
        for values in self.chart_files():
            args += ["-f", values]
        for value in [*self.chart_values(), *extra]:
            args += ["--set", value]
        self.cluster.helm(*args, timeout=660)

    def env(self) -> dict[str, str]:
        """What the e2e suite needs to find this stack."""
        assert self.cluster is not None
        return {
            "ZEPS_E2E_KUBECONFIG": str(self.cluster.kubeconfig),
            "ZEPS_E2E_IMAGE": self.zeps_image,
            "ZEPS_E2E_ZOOKEEPER_IMAGE": self.zookeeper_image,
            "ZEPS_E2E_SPARK_IMAGE": self.spark_image,
            "ZEPS_E2E_SEAWEEDFS_IMAGE": self.seaweedfs_image,
            "ZEPS_E2E_PROMETHEUS_IMAGE": self.prometheus_image,
            "ZEPS_E2E_RELEASE": RELEASE,
            "ZEPS_E2E_NAMESPACE": OPERATOR_NAMESPACE,
            "ZEPS_E2E_CHART_VALUES": ",".join(self.chart_values()),
            "ZEPS_E2E_CHART_FILES": ",".join(self.chart_files()),
            "ZEPS_E2E_KIND_CLUSTER": self.cluster_name,
            **{k: v for k, v in self.engine.env.items() if k == "DOCKER_HOST"},
        }

    def stop(self) -> None:
        if self.keep and self.cluster is not None and self.cluster.created:
            self.say(
                f"ZEPS_KEEP_CLUSTER=1: cluster {self.cluster_name} kept; reach it with "
                f"KUBECONFIG={self.cluster.kubeconfig}"
                + (f" and DOCKER_HOST={self.engine.env['DOCKER_HOST']}" if self.engine.owned else "")
                + "; remove it with `python -m zeps_dev.kind down`"
            )
            return
        try:
            if self.cluster is not None:
                self.cluster.stop()
        finally:
            if not self.shares_engine:
                self.engine.stop()


def kind_stack_from_env(
    *,
    cluster_name: str | None = None,
    spark: bool = False,
    workers: int = 0,
    keep: bool | None = None,
    detached: bool | None = None,
) -> KindStack:
    """A KindStack with what ``tools/setup.sh`` wrote to .zeps-env (``make e2e``, ``make demo CLUSTER=kind``)."""
    from zeps_dev.testbin import ENV_TESTBIN  # noqa: PLC0415
    from zeps_dev.zookeeper import zookeeper_home  # noqa: PLC0415

    kindbin = os.environ.get("ZEPS_KINDBIN")
    if not kindbin:
        raise SetupError(
            f"ZEPS_KINDBIN is not set; run `make e2e` (or tools/setup.sh kind): {ENV_TESTBIN} is not enough"
        )
    return KindStack(
        binaries=Path(kindbin),
        zookeeper_home=zookeeper_home(),
        venv_python=REPOSITORY / ".venv" / "bin" / "python",
        cluster_name=cluster_name or os.environ.get("ZEPS_KIND_CLUSTER", DEFAULT_CLUSTER),
        keep=os.environ.get("ZEPS_KEEP_CLUSTER") == "1" if keep is None else keep,
        detached=detached,
        spark=spark,
        workers=workers,
    )


def e2e_phases(pytest_args: Sequence[str], lanes: int) -> list[tuple[str, list[str]]]:
    """The e2e suite as two pytest runs. ``shared``: the tests that keep to namespaces of their own,
    in ``lanes`` pytest-xdist workers side by side (they mostly wait on pods, so one at a time leaves
    a core idle). ``serial``: the ones that change or watch what every test of their cluster shares
    (the chart, the operator, the ZooKeeper ensemble, a node, the host's network links), one at a
    time with nothing beside them on their cluster. ``pytest_args`` (``make e2e PYTEST_ARGS=...``) go
    to both."""
    side_by_side = ["-n", str(lanes), "--dist", "worksteal"] if lanes > 1 else []
    return [
        ("shared", ["-m", "not serial", *side_by_side, *pytest_args]),
        ("serial", ["-m", "serial", *pytest_args]),
    ]


def combined_exit_code(codes: Sequence[int]) -> int:
    """One exit code for the phases: the first failure's; 0 if every phase passed or had nothing to
    run (5: a ``-k`` that selects from one phase only); 5 if no phase had anything to run."""
    failed = [code for code in codes if code not in (0, NO_TESTS_COLLECTED)]
    if failed:
        return failed[0]
    return 0 if any(code == 0 for code in codes) else NO_TESTS_COLLECTED


def _pytest(args: Sequence[str]) -> list[str]:
    return [str(REPOSITORY / ".venv" / "bin" / "python"), "-m", "pytest", "e2e", *args]


def _sigint_as_ctrl_c() -> None:
    """In a child, before it runs: SIGINT back to its default, which Python turns into Ctrl-C. A job
    started in the background of a shell (``make e2e &``, a CI runner's) inherits SIGINT ignored, and
    then run_beside's SIGINT would not stop the first phase (waited for two minutes, then killed,
    its teardown never run)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_beside(
    first: Sequence[str],
    first_env: dict[str, str],
    *,
    prepare_second: Callable[[], dict[str, str]],
    second: Sequence[str],
    log: Path,
    timings: dict[str, float],
) -> list[int]:
    """``first`` started (its output as it comes), then ``prepare_second()`` (a cluster made ready:
    the environment to reach it) and ``second`` run in this process's time, its output into ``log``
    and printed once both ended, so neither's lines cut into the other's. Returns both exit codes; a
    second phase that could not be prepared gets 3 (as ``make e2e`` when its setup fails), the first
    still waited for. Ctrl-C or an error stops the first before it returns (pytest's own Ctrl-C).
    Each phase's seconds go into ``timings`` (``<name>_tests_s``)."""
    started = time.monotonic()
    proc = subprocess.Popen(first, env=first_env, cwd=REPOSITORY, preexec_fn=_sigint_as_ctrl_c)  # noqa: PLW1509
    try:
        second_code = NO_TESTS_COLLECTED
        try:
            env = prepare_second()
        except SetupError as exc:
            _say(f"serial tests: their cluster could not be made ready: {exc}")
            second_code = 3
        else:
            second_started = time.monotonic()
            with log.open("w") as out:
                second_code = subprocess.run(
                    second, env=env, cwd=REPOSITORY, stdout=out, stderr=subprocess.STDOUT, check=False
                ).returncode
            timings["serial_tests_s"] = time.monotonic() - second_started
            _say(f"serial tests done (exit {second_code}); their output follows the shared tests'")
        first_code = proc.wait()
        timings["shared_tests_s"] = time.monotonic() - started
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # pytest's Ctrl-C: its teardown runs, namespaces go
            try:
                proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    if log.exists():
        print(log.read_text(errors="replace"), end="", flush=True)
    return [first_code, second_code]


def run_e2e(pytest_args: Sequence[str]) -> int:
    """``make e2e``: the stack up, the e2e suite on it (:func:`e2e_phases`), everything down again.
    The serial phase runs after the shared one on the one cluster, or with ``ZEPS_E2E_SERIAL_CLUSTER=1``
    on a second cluster (:meth:`KindStack.companion`) beside it (:func:`run_beside`), or not at all
    when the adopted stack's ``make e2e-stack`` ran it already (:func:`serial_phase_passed_early`).
    Returns pytest's code (:func:`combined_exit_code`)."""
    started = time.monotonic()
    stack = kind_stack_from_env(spark=True, workers=E2E_WORKERS)
    (_, shared), (_, serial) = e2e_phases(pytest_args, E2E_LANES)
    with stack:
        _say(f"stack ready in {stack.timings['ready_s']:.0f}s; running the e2e suite")
        env = {**os.environ, **stack.env()}
        early = serial_phase_passed_early(
            _read_once(stack.serial_note), stack.serial_identity(), pytest_args, adopted="adopted_s" in stack.timings
        )
        if early is not None:
            _say(f"serial tests: passed on this cluster before the shared ones, beside make test (make e2e-stack "
                 f"with ZEPS_E2E_SERIAL_EARLY=1, in {early.get('seconds', 0):.0f}s); not run again")  # fmt: skip
        if early is None and E2E_SERIAL_CLUSTER:
            companion = stack.companion()

            def serial_cluster() -> dict[str, str]:
                companion.start()  # made now: make e2e-stack prepares only the suite's cluster
                _say(f"serial tests on cluster {companion.cluster_name}: pytest {' '.join(serial)}")
                return {**os.environ, **companion.env()}

            _say(f"shared tests on cluster {stack.cluster_name}: pytest {' '.join(shared)}")
            try:
                codes = run_beside(
                    _pytest(shared), env, prepare_second=serial_cluster, second=_pytest(serial),
                    log=stack.cache / "kind" / "serial-tests.log", timings=stack.timings,
                )  # fmt: skip
            finally:
                companion.stop()
        else:
            codes = []
            phases = [("shared", shared)] + ([("serial", serial)] if early is None else [])  # early: passed already
            for phase, args in phases:
                _say(f"{phase} tests: pytest {' '.join(args)}")
                phase_started = time.monotonic()
                codes.append(subprocess.run(_pytest(args), env=env, cwd=REPOSITORY, check=False).returncode)
                stack.timings[f"{phase}_tests_s"] = time.monotonic() - phase_started
    timings = {k: round(v, 1) for k, v in stack.timings.items()}
    _say(f"done in {time.monotonic() - started:.0f}s: {json.dumps(timings)}")
    return combined_exit_code(codes)


def build_e2e_images() -> int:
    """``make e2e-images``: build (or find cached) every image ``make e2e`` needs, then stop the engine.
    CI runs it beside ``make test``, whose tiers mostly wait on servers: the images' CPU-bound builds
    fill the idle core, and ``make e2e`` then finds them cached."""
    started = time.monotonic()
    stack = kind_stack_from_env(spark=True, workers=E2E_WORKERS)
    try:
        stack.engine.start()
        stack.build_images()
    finally:
        stack.engine.stop()
    _say(f"images ready in {time.monotonic() - started:.0f}s")
    return 0


def build_base_images() -> int:
    """``make e2e-stack``'s first step, beside the kind set's Go builds (``tools/setup.sh kind``): the
    images that need no Go binary, built or found cached (the Debian root filesystems, ZooKeeper's,
    Prometheus', the project's zeps and Spark images), then the engine stopped. On a new machine their
    debootstraps and pip wheels mostly wait on downloads and the disk, which the Go builds' CPU then
    fills; ``stack`` finds them cached and builds only the ones made of Go binaries."""
    from zeps_dev.zookeeper import zookeeper_home  # noqa: PLC0415

    started = time.monotonic()
    engine = DockerEngine(docker_root(), say=_say)
    # no Go binary is read here: a folder that does not exist says so if one ever is
    builder = ImageBuilder(engine, binaries=cache_dir() / "testbin" / "none-before-the-go-builds",
                           cache=cache_dir(), zookeeper_home=zookeeper_home(), say=_say)  # fmt: skip
    venv_python = REPOSITORY / ".venv" / "bin" / "python"
    try:
        engine.start()
        for name in ROOTFS:
            builder.rootfs(name)
        builder.zookeeper_image()
        builder.prometheus_image()
        builder.zeps_image(venv_python)
        builder.spark_image(venv_python)
    finally:
        engine.stop()
    _say(f"base images ready in {time.monotonic() - started:.0f}s")
    return 0


def prepare_e2e_stack() -> int:
    """``make e2e-stack``: what ``make e2e`` starts before its suite (images, cluster, chart), left
    running for it (:meth:`KindStack.prepare`), and with ``ZEPS_E2E_SERIAL_EARLY=1`` the serial
    phase run on it (:func:`run_serial_early`); ``python -m zeps_dev.kind down`` removes it."""
    stack = kind_stack_from_env(spark=True, workers=E2E_WORKERS, keep=False, detached=True)
    stack.serial_note.unlink(missing_ok=True)  # an earlier stack's: never taken for this one's
    # Not the serial tests' cluster (ZEPS_E2E_SERIAL_CLUSTER=1): make e2e makes it beside its shared
    # tests. Made here, beside make test, it slowed make test by as much as it saved (benchmarks/README.md).
    try:
        stack.prepare()
    except BaseException:
        stack.stop()
        raise
    return run_serial_early(stack) if E2E_SERIAL_EARLY else 0


def run_serial_early(stack: KindStack) -> int:
    """The serial phase (:func:`e2e_phases`) on the stack :func:`prepare_e2e_stack` just made ready,
    one test at a time as ``make e2e`` runs it; if it passes, a note (:attr:`KindStack.serial_note`)
    for the ``make e2e`` that adopts this stack to run the shared phase only. The stack stays
    running either way (``make e2e-down`` or CI's end removes it). Returns pytest's code."""
    _, (_, serial) = e2e_phases([], 1)
    _say(f"serial tests on the prepared cluster now (ZEPS_E2E_SERIAL_EARLY=1): pytest {' '.join(serial)}")
    started = time.monotonic()
    code = subprocess.run(_pytest(serial), env={**os.environ, **stack.env()}, cwd=REPOSITORY, check=False).returncode
    seconds = time.monotonic() - started
    if code != 0:
        _say(f"serial tests failed (exit {code}) after {seconds:.0f}s: above; make e2e would run them again")
        return code
    stack.serial_note.write_text(json.dumps({"identity": stack.serial_identity(), "seconds": seconds}))
    _say(f"serial tests passed in {seconds:.0f}s; the next make e2e on this stack runs the shared ones only")
    return 0


def serial_phase_passed_early(
    note: str | None, identity: dict[str, Any], pytest_args: Sequence[str], *, adopted: bool
) -> dict[str, Any] | None:
    """The note :func:`run_serial_early` left (``note``: its text, None if there is none), if ``make
    e2e`` may count that serial phase as its own: it adopted the very stack the phase ran on
    (``adopted``; a stack made anew has seen none of it), that stack still runs the same images and
    nodes and the suite's files are the same (``identity``), and ``make e2e`` was given no pytest
    arguments (a ``-k`` or ``-x`` of its own selects or runs otherwise). Else None: the phase runs."""
    if note is None or not adopted or pytest_args:
        return None
    try:
        done = json.loads(note)
    except ValueError:
        return None
    if not isinstance(done, dict) or done.get("identity") != identity:
        return None
    return done


def _read_once(path: Path) -> str | None:
    """``path``'s text, the file removed: a note is used by one run at most."""
    try:
        text = path.read_text()
    except OSError:
        return None
    path.unlink(missing_ok=True)
    return text


def down() -> int:
    """Remove what ``ZEPS_KEEP_CLUSTER=1`` or ``make e2e-stack`` left: the cluster and a dockerd of
    zeps. Nothing to do (and no engine started) when neither runs."""
    name = os.environ.get("ZEPS_KIND_CLUSTER", DEFAULT_CLUSTER)
    names = (name, name + SERIAL_SUFFIX)  # the suite's cluster and the serial tests' (run_e2e)
    for each in names:
        for note in (PREPARED_NOTE, SERIAL_NOTE):
            (cache_dir() / "kind" / "clusters" / each / note).unlink(missing_ok=True)
    engine = DockerEngine(docker_root(), say=_say)
    if not engine.running():
        _say("down: no dockerd of zeps runs and no engine answers: nothing to remove")
        return 0
    engine.start()  # adopts the dockerd a ZEPS_KEEP_CLUSTER=1 run or make e2e-stack kept
    try:
        kindbin = os.environ.get("ZEPS_KINDBIN")
        for each in names if kindbin else ():  # without kind (never built), no cluster was made
            workdir = cache_dir() / "kind" / "clusters" / each
            cluster = KindCluster(engine, name=each, node_image="", binaries=Path(kindbin or ""), workdir=workdir)
            cluster.created = cluster.exists()
            cluster.stop()
    finally:
        engine.stop()  # one of ours: every container it holds, then itself; another engine: left alone
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    import sys  # noqa: PLC0415

    args = list(sys.argv[1:] if argv is None else argv)
    command = args.pop(0) if args else "e2e"
    try:
        if command == "e2e":
            return run_e2e(args)
        if command == "images":
            return build_e2e_images()
        if command == "base-images":
            return build_base_images()
        if command == "stack":
            return prepare_e2e_stack()
        if command == "down":
            return down()
    except SetupError as exc:
        print(f"e2e: {exc}", flush=True)
        return 3
    except KeyboardInterrupt:
        print("e2e: interrupted", flush=True)
        return 130
    print(f"usage: python -m zeps_dev.kind [e2e [PYTEST ARGS] | images | base-images | stack | down] (got {command!r})")
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
