"""A real Kubernetes control plane without kubelet, for the cluster test tier and the demo.

etcd, kube-apiserver (RBAC on, TLS and service-account keys generated at start),
kube-controller-manager, kube-scheduler and kwok (which plays the kubelet of one fake node, so
pods created by Deployments are scheduled and reported Running) — all from the pinned binaries that
``tools/testbin/build.sh`` builds into the zeps cache (``ZEPS_TESTBIN``).

No container ever runs: a pod's status is simulated by kwok. Everything listens on 127.0.0.1.
"""

from __future__ import annotations

import json
import re
import shutil
import ssl
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import ClassVar

from zeps.errors import SetupError
from zeps_dev import testbin
from zeps_dev.apireads import ApiReads
from zeps_dev.process import LocalServer, ManagedProcess, free_port, wait_until

__all__ = ["FAKE_NODE", "ControlPlane", "binaries_dir", "request_counts"]

FAKE_NODE = "kwok-node-0"
SERVICE_CIDR = "10.96.0.0/24"
_BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kwok", "helm")


def binaries_dir() -> Path:
    """The folder with the pinned control-plane binaries (``ZEPS_TESTBIN``; built now, or waited for
    while the background build of :mod:`zeps_dev.testbin` runs, when it lacks them)."""
    return testbin.binaries(_BINARIES)


def _openssl(*args: str, cwd: Path) -> None:
    result = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SetupError(f"openssl {' '.join(args[:2])} failed: {result.stderr.strip()}")


class _Pki:
    """Certificates for one control plane: a CA, the API server's serving certificate, one client
    certificate per component, and the service-account signing key pair (all ECDSA P-256, fast)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def path(self, name: str) -> Path:
        return self.folder / name

    def generate(self, clients: Mapping[str, tuple[str, str]]) -> None:
        if shutil.which("openssl") is None:
            raise SetupError("openssl is missing; install it (apt-get install openssl) — it makes the test PKI")
        self.folder.mkdir(parents=True, exist_ok=True)
        f = self.folder
        _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "ca.key", cwd=f)
        _openssl(
            "req",
            "-x509",
            "-new",
            "-key",
            "ca.key",
            "-subj",
            "/CN=zeps-test-ca",
            "-days",
            "7",
            "-out",
            "ca.crt",
            cwd=f,
        )
        _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "sa.key", cwd=f)
        _openssl("ec", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=f)
        sans = "subjectAltName=IP:127.0.0.1,IP:10.96.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default.svc"
        self._leaf(
            "apiserver",
            "/CN=kube-apiserver",
            ["-extfile", "/dev/stdin"],
            ext=sans + "\nextendedKeyUsage=serverAuth",
        )
        for name, (cn, org) in clients.items():
            subject = f"/CN={cn}" + (f"/O={org}" if org else "")
            self._leaf(name, subject, ["-extfile", "/dev/stdin"], ext="extendedKeyUsage=clientAuth")

    def _leaf(self, name: str, subject: str, extra: list[str], *, ext: str) -> None:
        f = self.folder
        _openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", f"{name}.key", cwd=f)
        _openssl("req", "-new", "-key", f"{name}.key", "-subj", subject, "-out", f"{name}.csr", cwd=f)
        result = subprocess.run(
            ["openssl", "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-days", "7", "-out", f"{name}.crt", *extra],
            cwd=f, input=ext, capture_output=True, text=True, check=False,
        )  # fmt: skip
        if result.returncode != 0:
            raise SetupError(f"openssl could not sign the {name} certificate: {result.stderr.strip()}")


def request_counts(metrics: str) -> dict[str, int]:
    """``apiserver_request_total`` in an API server's /metrics text, summed by ``"VERB resource"`` (a
    subresource counts under its resource; requests without one, such as reads of /metrics, under
    ``"VERB -"``). Any API server's: this control plane's, or a kind cluster's."""
    counts: dict[str, int] = {}
    for line in metrics.splitlines():
        if line.startswith("apiserver_request_total{"):
            labels = dict(re.findall(r'(\w+)="([^"]*)"', line.split("}", 1)[0]))
            key = f"{labels.get('verb', '')} {labels.get('resource') or '-'}"
            counts[key] = counts.get(key, 0) + int(float(line.rsplit(" ", 1)[1]))
    return counts


class ControlPlane(LocalServer):
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler + kwok with one fake node.

    ``kubeconfig`` (cluster-admin, client-certificate auth) is written into ``workdir``; other
    kubeconfigs per component sit beside it. ``kubectl(...)`` runs the pinned kubectl against it.
    """

    #: component -> (certificate CN, organisation)
    _CLIENTS: ClassVar[Mapping[str, tuple[str, str]]] = {
        "admin": ("zeps-admin", "system:masters"),
        "controller-manager": ("system:kube-controller-manager", ""),
        "scheduler": ("system:kube-scheduler", ""),
        "kwok": ("kwok-controller", "system:masters"),
        "apiserver-kubelet-client": ("kube-apiserver-kubelet-client", "system:masters"),
    }

    def __init__(self, workdir: Path, *, bin_dir: Path | None = None) -> None:
        self.workdir = workdir
        self.bin_dir = bin_dir
        self.pki = _Pki(workdir / "pki")
        self.api_port = 0
        self._procs: list[ManagedProcess] = []

    # -- paths ------------------------------------------------------------------------------------
    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "admin.kubeconfig"

    def _bin(self, name: str) -> str:
        return str((self.bin_dir or binaries_dir()) / name)

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self, timeout: float = 120.0) -> None:
        bins = self.bin_dir or binaries_dir()
        self.bin_dir = bins
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.api_port = free_port()
        self.pki.generate(self._CLIENTS)
        for name in self._CLIENTS:
            self._write_kubeconfig(name)
        try:
            self._start_etcd(timeout)
            self._start_apiserver(timeout)
            self._start_controllers()
            self._add_fake_node(timeout)
        except BaseException:
            self.stop()
            raise

    def _spawn(self, name: str, argv: list[str]) -> ManagedProcess:
        proc = ManagedProcess(name, argv, log_path=self.workdir / "logs" / f"{name}.log")
        proc.start()
        self._procs.append(proc)
        return proc

    def _start_etcd(self, timeout: float) -> None:
        client, peer = free_port(), free_port()
        self._etcd_url = f"http://127.0.0.1:{client}"
        proc = self._spawn("etcd", [
            self._bin("etcd"), "--name=default", f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls={self._etcd_url}", f"--advertise-client-urls={self._etcd_url}",
            f"--listen-peer-urls=http://127.0.0.1:{peer}", f"--initial-advertise-peer-urls=http://127.0.0.1:{peer}",
            f"--initial-cluster=default=http://127.0.0.1:{peer}", "--listen-metrics-urls=",
            "--unsafe-no-fsync",  # test data only: durability is not what this tier tests
            "--log-level=warn",
        ])  # fmt: skip
        health = f"{self._etcd_url}/health"
        proc.wait_ready(lambda: b"true" in urllib.request.urlopen(health, timeout=2).read(), timeout=timeout)

    def _start_apiserver(self, timeout: float) -> None:
        p = self.pki.path
        proc = self._spawn("kube-apiserver", [
            self._bin("kube-apiserver"),
            f"--etcd-servers={self._etcd_url}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={self.api_port}",
            f"--tls-cert-file={p('apiserver.crt')}", f"--tls-private-key-file={p('apiserver.key')}",
            f"--client-ca-file={p('ca.crt')}",
            f"--kubelet-client-certificate={p('apiserver-kubelet-client.crt')}",
            f"--kubelet-client-key={p('apiserver-kubelet-client.key')}",
            f"--service-account-key-file={p('sa.pub')}", f"--service-account-signing-key-file={p('sa.key')}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC",
            "--allow-privileged=true",
            f"--cert-dir={self.workdir / 'apiserver-certs'}",
            "--enable-priority-and-fairness=false",  # saves CPU on a 2-core machine; not under test
            "--profiling=false", "--v=1",
        ])  # fmt: skip
        proc.wait_ready(lambda: self._get("/readyz") == "ok", timeout=timeout)

    def _start_controllers(self) -> None:
        p = self.pki.path
        common = ["--bind-address=127.0.0.1", "--secure-port=0", "--leader-elect=false", "--v=1"]
        self._spawn("kube-controller-manager", [
            self._bin("kube-controller-manager"),
            f"--kubeconfig={self.workdir / 'controller-manager.kubeconfig'}",
            f"--service-account-private-key-file={p('sa.key')}", f"--root-ca-file={p('ca.crt')}",
            "--use-service-account-credentials=true", "--controllers=*", *common,
        ])  # fmt: skip
        self._spawn("kube-scheduler", [
            self._bin("kube-scheduler"), f"--kubeconfig={self.workdir / 'scheduler.kubeconfig'}", *common,
        ])  # fmt: skip
        self._spawn("kwok", [
            self._bin("kwok"), f"--kubeconfig={self.workdir / 'kwok.kubeconfig'}",
            "--manage-all-nodes=false", "--manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake",
            "--cidr=10.244.0.0/16", "--node-ip=127.0.0.1", f"--server-address=127.0.0.1:{free_port()}",
            # heartbeat by Lease: without it the node is declared unreachable every ~50 s and its pods not Ready
            "--node-lease-duration-seconds=40",
        ])  # fmt: skip

    def _add_fake_node(self, timeout: float) -> None:
        node = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": FAKE_NODE,
                "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
                "labels": {"kubernetes.io/hostname": FAKE_NODE, "kubernetes.io/os": "linux", "type": "kwok"},
            },
            "status": {"allocatable": {"cpu": "32", "memory": "256Gi", "pods": "1000"},
                       "capacity": {"cpu": "32", "memory": "256Gi", "pods": "1000"}},
        }  # fmt: skip
        self.kubectl("apply", "-f", "-", input=json.dumps(node))

        def node_ready() -> bool:
            for proc in self._procs:
                proc.check_alive()
            jsonpath = "jsonpath={.status.conditions[?(@.type=='Ready')].status}"
            return self.kubectl("get", "node", FAKE_NODE, "-o", jsonpath, check=False).strip() == "True"

        def default_service_account() -> bool:
            return self.kubectl("get", "serviceaccount", "default", "-n", "default", "-o", "name", check=False) != ""

        wait_until(node_ready, timeout=timeout, interval=0.5, what=f"kwok to mark node {FAKE_NODE} Ready")
        # Tests create pods right away: the service-account controller must have made the default
        # namespace's ServiceAccount first (pods are rejected by admission without it).
        wait_until(default_service_account, timeout=timeout, interval=0.5, what="the default ServiceAccount")

    def stop(self) -> None:
        """Stop every component, newest first (kwok and controllers before the API server and etcd)."""
        for proc in reversed(self._procs):
            proc.stop(grace=5)
        self._procs.clear()

    # -- helpers ----------------------------------------------------------------------------------
    def _write_kubeconfig(self, name: str) -> None:
        p = self.pki.path
        cluster = {"server": self.server, "certificate-authority": str(p("ca.crt"))}
        user = {"client-certificate": str(p(f"{name}.crt")), "client-key": str(p(f"{name}.key"))}
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "zeps-local", "cluster": cluster}],
            "users": [{"name": name, "user": user}],
            "contexts": [{"name": "zeps-local", "context": {"cluster": "zeps-local", "user": name}}],
            "current-context": "zeps-local",
        }
        target = self.workdir / ("admin.kubeconfig" if name == "admin" else f"{name}.kubeconfig")
        target.write_text(json.dumps(config, indent=2))

    def _ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki.path("ca.crt")))
        ctx.load_cert_chain(str(self.pki.path("admin.crt")), str(self.pki.path("admin.key")))
        return ctx

    def _get(self, path: str) -> str:
        with urllib.request.urlopen(f"{self.server}{path}", timeout=5, context=self._ssl_context()) as resp:
            body: bytes = resp.read()
        return body.decode()

    def pids(self) -> dict[str, int]:
        """The running processes of this control plane by name (etcd, kube-apiserver, ...)."""
        return {proc.name: proc.pid for proc in self._procs if proc.pid is not None}

    def request_counts(self) -> dict[str, int]:
        """The requests this API server has served (:func:`request_counts`), read over HTTPS directly:
        no kubectl process."""
        return request_counts(self._get("/metrics"))

    @property
    def kubectl_argv(self) -> list[str]:
        """The pinned kubectl as cluster-admin of this control plane, for a caller's own subprocess."""
        return [self._bin("kubectl"), f"--kubeconfig={self.kubeconfig}"]

    @cached_property
    def _reads_context(self) -> ssl.SSLContext:
        return self._ssl_context()

    @cached_property
    def reads(self) -> ApiReads:
        """``kubectl get … -o json`` answered in this process (:mod:`zeps_dev.apireads`)."""
        return ApiReads(self._request)

    def _request(self, path: str, query: Sequence[tuple[str, str]], accept_json: bool) -> tuple[int, bytes]:
        url = f"{self.server}{path}" + (f"?{urllib.parse.urlencode(list(query))}" if query else "")
        asked = urllib.request.Request(url, headers={"Accept": "application/json" if accept_json else "*/*"})
        try:
            with urllib.request.urlopen(asked, timeout=60, context=self._reads_context) as resp:
                body: bytes = resp.read()
                return int(resp.status), body
        except urllib.error.HTTPError as exc:  # an answer: not found, forbidden, …
            return exc.code, exc.read()

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        """Run the pinned kubectl as cluster-admin; return stdout, raise :class:`SetupError` on failure.
        ``get … -o json`` is answered in this process (:attr:`reads`): the same GET, no kubectl process."""
        answered = self.reads.answer(args, check=check, error=SetupError) if input is None else None
        if answered is not None:
            return answered
        result = subprocess.run(
            [*self.kubectl_argv, *args],
            input=input, capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        if check and result.returncode != 0:
            raise SetupError(f"kubectl {' '.join(args)} failed: {result.stderr.strip()}")
        return result.stdout
