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

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kazoo.security import make_digest_acl_credential

from harness import CLUSTER_TESTS_QUOTA, OPERATOR_AUTH, TEST_JVM_FLAGS
from zeps.coordination import close_shared
from zeps.errors import SetupError
from zeps_dev import ControlPlane, OperatorProcess, ZooKeeperServer

CRDS = Path(__file__).resolve().parent / "crds"
ROOT = Path(__file__).resolve().parent

#: the session fixtures whose servers are pinned binaries of zeps_dev.testbin (tests/cluster/ and
#: e2e/ need them all; their tests use the control plane, or start a stack, without naming it). A
#: test that asks for one with request.getfixturevalue is marked ``testbin`` (it is not seen here).
_TESTBIN_FIXTURES = frozenset({"control_plane", "seaweedfs_server", "own_seaweedfs"})
_TESTBIN_FOLDERS = (ROOT / "tests" / "cluster", ROOT / "e2e")


def _needs_testbin(item: pytest.Item) -> bool:
    return (
        bool(_TESTBIN_FIXTURES.intersection(getattr(item, "fixturenames", ())))
        or item.get_closest_marker("testbin") is not None
        or any(item.path.is_relative_to(folder) for folder in _TESTBIN_FOLDERS)
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The modules with a test that needs a pinned binary of zeps_dev.testbin run last, in their order:
    on a new machine those binaries are still being built (in the background, see
    pytest_collection_finish) while the others run."""
    needing = {item.path for item in items if _needs_testbin(item)}
    items.sort(key=lambda item: item.path in needing)  # stable: each group keeps its order


def pytest_collection_finish(session: pytest.Session) -> None:
    """A selected test needs the pinned binaries and they are not built: build them in the background
    now; the first fixture that needs one waits for them (``zeps_dev.testbin.binaries``)."""
    from zeps_dev import testbin  # noqa: PLC0415

    if testbin.ready() is None and any(_needs_testbin(item) for item in session.items):
        testbin.start_background_build()


@pytest.hookimpl(tryfirst=True, wrapper=True)  # the outermost wrapper: before pytest-timeout starts its timer
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[object]:
    """A test that needs the pinned binaries waits for their build here, outside its own timeout (a
    fixture waiting inside it would time out, and a session fixture keeps that error for every test
    after). A failed build is raised by the fixture that needs a binary, as its SetupError."""
    from zeps_dev import testbin  # noqa: PLC0415

    if testbin.ready() is None and _needs_testbin(item):
        with contextlib.suppress(SetupError):
            testbin.binaries()
    return (yield)


@pytest.fixture(scope="session")
def zookeeper_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ZooKeeperServer]:
    """One ZooKeeper server for the whole test session (each test gets its own root path)."""
    super_digest = make_digest_acl_credential(*OPERATOR_AUTH)
    server = ZooKeeperServer(
        tmp_path_factory.mktemp("zookeeper"),
        jvm_flags=[f"-Dzookeeper.DigestAuthenticationProvider.superDigest={super_digest}", *TEST_JVM_FLAGS],
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
        _check_control_plane(plane)
        yield plane
    finally:
        plane.stop()


def _check_control_plane(plane: ControlPlane) -> None:
    """The tier's health check, once per session: what zeps's cluster tests stand on, end to end.

    A namespace gets its default ServiceAccount (the service-account controller), a Deployment's pod
    is scheduled on the kwok node and reported Running and available (controller-manager, scheduler,
    kwok), kwok keeps the node's Lease (else the node-lifecycle controller marks every pod on it not
    Ready after 50 s), and a ServiceAccount without roles is refused (RBAC, which the operator's own
    role is tested against). A failure stops the run with what is wrong, the components' logs beside it."""
    from kubernetes import client, config  # noqa: PLC0415 — an extra: only the cluster tiers need it
    from kubernetes.client.rest import ApiException  # noqa: PLC0415

    from zeps_dev.controlplane import FAKE_NODE  # noqa: PLC0415
    from zeps_dev.process import wait_until  # noqa: PLC0415

    api = config.new_client_from_config(config_file=str(plane.kubeconfig))
    core, apps = client.CoreV1Api(api), client.AppsV1Api(api)
    name, labels = "tier-check", {"app": "tier-check"}
    try:
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
        wait_until(
            lambda: bool(core.list_namespaced_service_account(name, field_selector="metadata.name=default").items),
            timeout=60,
            what="the service-account controller to make the namespace's default ServiceAccount",
        )
        template = client.V1PodTemplateSpec(
            metadata=client.V1ObjectMeta(labels=labels),
            spec=client.V1PodSpec(containers=[client.V1Container(name="app", image="example.invalid/check:1")]),
        )
        apps.create_namespaced_deployment(name, client.V1Deployment(
            metadata=client.V1ObjectMeta(name=name),
            spec=client.V1DeploymentSpec(replicas=1, selector=client.V1LabelSelector(match_labels=labels),
                                         template=template),
        ))  # fmt: skip
        wait_until(
            lambda: (apps.read_namespaced_deployment(name, name).status.available_replicas or 0) == 1,
            timeout=90,
            what=f"a Deployment's pod Running and available on the kwok node {FAKE_NODE}",
        )
        lease = client.CoordinationV1Api(api).read_namespaced_lease(FAKE_NODE, "kube-node-lease")
        if lease.spec.renew_time is None:
            raise RuntimeError(f"kwok made the Lease of {FAKE_NODE} but never renewed it")
        core.create_namespaced_service_account(
            name, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="nobody"))
        )
        token = core.create_namespaced_service_account_token("nobody", name, client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[]))).status.token  # fmt: skip
        settings = client.Configuration()
        settings.host, settings.ssl_ca_cert = api.configuration.host, api.configuration.ssl_ca_cert
        settings.api_key = {"authorization": f"Bearer {token}"}
        with client.ApiClient(settings) as as_nobody:
            try:
                client.CoreV1Api(as_nobody).list_namespaced_pod(name)
                raise RuntimeError("a ServiceAccount without any role listed pods: RBAC is not enforced")
            except ApiException as exc:
                if exc.status != 403:
                    raise
        core.delete_namespace(name)
    except Exception as exc:
        pytest.exit(f"the cluster tier cannot run: {exc!r} (component logs: {plane.workdir})", 3)
    finally:
        api.close()


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
        namespace_quota=CLUSTER_TESTS_QUOTA,
    )
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()
