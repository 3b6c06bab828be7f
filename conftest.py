"""The stack fixtures every suite shares (tests/ and e2e/): one ZooKeeper server, one Kubernetes
control plane with the CRDs, one operator, each started once per pytest session and only when a test
asks for it. They live here, above both folders, so that ``make test`` starts one stack for both:
fixtures defined in tests/conftest.py would be invisible to e2e/, and a second definition would start
a second stack.

Servers bind 127.0.0.1 only and are stopped at teardown, on failure and on Ctrl-C (and by the kernel
if pytest itself is killed; see ``zeps_dev.process``). The binaries come from the zeps cache that
``make setup`` fills (``ZEPS_ZOOKEEPER_HOME``, ``ZEPS_TESTBIN``). The kubernetes client is imported
by the fixture that needs it, never when this file loads: unit tests need no extras.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kazoo.security import make_digest_acl_credential

from harness import OPERATOR_AUTH
from zeps.coordination import close_shared
from zeps_dev import ControlPlane, OperatorProcess, ZooKeeperServer

CRDS = Path(__file__).resolve().parent / "crds"


@pytest.fixture(scope="session")
def zookeeper_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    """One ZooKeeper server for the whole test session (each test gets its own root path)."""
    super_digest = make_digest_acl_credential(*OPERATOR_AUTH)
    server = ZooKeeperServer(
        tmp_path_factory.mktemp("zookeeper"),
        jvm_flags=[f"-Dzookeeper.DigestAuthenticationProvider.superDigest={super_digest}"],
    )
    server.start()
    try:
        _check_zookeeper(server)
        yield server
    finally:
        close_shared()  # handles' shared sessions end before the server does (no retry noise at exit)
        server.stop()


def _check_zookeeper(server: ZooKeeperServer) -> None:
    """The tier's health check, once per session: a session, a write read back, a watch fired; a
    failure stops the run with what is wrong rather than as a hundred tests failing alike."""
    import threading  # noqa: PLC0415

    from kazoo.client import KazooClient  # noqa: PLC0415

    client = KazooClient(hosts=server.connect_string)
    try:
        client.start(timeout=15)
        fired = threading.Event()
        client.create("/tier-check", b"ok", ephemeral=True)
        client.exists("/tier-check", watch=lambda _event: fired.set())
        client.delete("/tier-check")
        if not fired.wait(10) or client.exists("/tier-check") is not None:
            raise RuntimeError("a delete did not fire its watch")
    except Exception as exc:
        pytest.exit(f"the ZooKeeper tier cannot run: {exc!r} (server log: {server.workdir / 'zookeeper.log'})", 3)
    finally:
        client.stop()
        client.close()


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """etcd + kube-apiserver + controller-manager + scheduler + kwok, once per test session."""
    plane = ControlPlane(tmp_path_factory.mktemp("control-plane"))
    plane.start()
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="session")
def kube_api(control_plane: ControlPlane) -> Iterator[Any]:
    """A ``kubernetes.client.ApiClient`` authenticated as cluster-admin on the control plane."""
    from kubernetes import config  # noqa: PLC0415 — an extra: only the tests that need it import it

    client = config.new_client_from_config(config_file=str(control_plane.kubeconfig))
    try:
        yield client
    finally:
        client.close()


@pytest.fixture(scope="session")
def crds(control_plane: ControlPlane) -> ControlPlane:
    """The generated CRDs, applied with kubectl and Established."""
    control_plane.kubectl("apply", "-f", str(CRDS))
    for name in ("topics", "queues", "zepsstreams"):
        control_plane.kubectl("wait", "--for=condition=Established", f"crd/{name}.zeps.dev", "--timeout=60s")
    return control_plane


@pytest.fixture(scope="session")
def operator(
    crds: ControlPlane, zookeeper_server: ZooKeeperServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OperatorProcess]:
    """The zeps operator run by kopf against the control plane and the real ZooKeeper, as the chart
    runs it; resync every 3 s so drift repair is quick."""
    proc = OperatorProcess(
        tmp_path_factory.mktemp("operator"),
        kubeconfig=crds.kubeconfig,
        zookeeper=zookeeper_server.connect_string,
        chroot="/operator-tests",
        resync_seconds=3,
        delete_retries=3,
        identity="zeps-operator-test",
        zookeeper_auth=":".join(OPERATOR_AUTH),
    )
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()
