"""zeps's ZooKeeper clients over TLS (issue 48, item 10): a real server serves clients on a TLS port
(``ZooKeeperServer(tls=...)``, the settings the image's launcher writes for ``ZOO_CLIENT_TLS``) with
a certificate of a CA made here (``zeps_dev.tls``, as the chart's Secret holds them).

The SDK's handles, the CLI, a replicated stream's brokers and a client following their leader all
reach it given the CA alone (a PEM file, the PEM itself, ``ZEPS_ZOOKEEPER_CA``); a client trusting
another CA, or dialling a name the certificate does not carry, is refused with an error that says
TLS, and a plain client gets nothing from the TLS port. The server's plain port stays on 127.0.0.1
for the checks of these tests (ReplicaSet's own client reads the election state there)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import zeps
from harness import TEST_JVM_FLAGS, ReplicaSet, ZooKeeperHarness, until
from zeps.client import StreamClient
from zeps.client.discovery import LeaderLocator, discover
from zeps.coordination import connect
from zeps.coordination.client import TLSHandler
from zeps.errors import ConfigError, CoordinationError
from zeps_dev.tls import certificates
from zeps_dev.zookeeper import ZooKeeperServer


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ZooKeeperServer, Path]]:
    """A server of its own (the session's has no TLS port), and the folder of its certificates."""
    tmp = tmp_path_factory.mktemp("zk-tls")
    tls = certificates(tmp / "tls")
    with ZooKeeperServer(tmp / "zk", tls=tls, heap_mb=256, jvm_flags=list(TEST_JVM_FLAGS)) as server:
        yield server, tls


def test_a_handle_given_the_ca_works_over_tls_and_trusts_that_ca_alone(
    tls_server: tuple[ZooKeeperServer, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    server, tls = tls_server
    monkeypatch.setenv("ZEPS_ZOOKEEPER_CA", str(tls / "ca.crt"))  # what a pod is given: the file
    jobs = zeps.queue("jobs", namespace="tls", zookeeper=server.secure_connect_string)
    assert jobs.settings.zookeeper_ca == (tls / "ca.crt").read_text().strip()
    jobs.put(b"over tls")
    item = jobs.take(timeout=10)
    assert item is not None and item.body == b"over tls"
    item.ack()
    monkeypatch.delenv("ZEPS_ZOOKEEPER_CA")
    pem = (tls / "ca.crt").read_text()  # or the PEM itself, as the operator hands it to its brokers
    news = zeps.topic("news", namespace="tls", zookeeper=server.secure_connect_string, zookeeper_ca=pem)
    assert news.queues() == frozenset()
    # the handshake trusts the one CA given, not the system's store (kazoo's use_ssl loads both)
    assert len(TLSHandler(pem, 5.0).context.get_ca_certs()) == 1


def test_another_ca_a_name_not_on_the_certificate_and_a_plain_client_are_refused(
    tls_server: tuple[ZooKeeperServer, Path], tmp_path: Path
) -> None:
    server, tls = tls_server
    stranger = (certificates(tmp_path / "stranger") / "ca.crt").read_text()
    with pytest.raises(CoordinationError, match=r"TLS: .*CERTIFICATE_VERIFY_FAILED.*ZEPS_ZOOKEEPER_CA"):
        connect(server.secure_connect_string, ca=stranger, timeout=4)
    # the certificate names 127.0.0.1 and the chart's servers, not "localhost"
    with pytest.raises(CoordinationError, match=r"TLS: .*(Hostname mismatch|IP address mismatch|doesn't match)"):
        connect(f"localhost:{server.secure_port}", ca=(tls / "ca.crt").read_text(), timeout=4)
    with pytest.raises(CoordinationError, match="no ZooKeeper server answered"):
        connect(server.secure_connect_string, timeout=4)
    with pytest.raises(ConfigError, match="not a PEM certificate"):
        connect(server.secure_connect_string, ca="-----BEGIN CERTIFICATE-----\nnot one\n-----END CERTIFICATE-----")
    with pytest.raises(ConfigError, match=r"ZEPS_ZOOKEEPER_CA='/nowhere/ca.crt': cannot read it"):
        os.environ["ZEPS_ZOOKEEPER_CA"] = "/nowhere/ca.crt"
        try:
            zeps.queue("jobs", namespace="tls", zookeeper=server.secure_connect_string)
        finally:
            del os.environ["ZEPS_ZOOKEEPER_CA"]


def test_the_cli_takes_the_ca_as_a_flag(tls_server: tuple[ZooKeeperServer, Path]) -> None:
    server, tls = tls_server
    base = [sys.executable, "-m", "zeps.cli", "-n", "tls", "--zookeeper", server.secure_connect_string]
    put = subprocess.run([*base, "--zookeeper-ca", str(tls / "ca.crt"), "queue", "put", "cli-jobs", "from the cli"],
                         capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert put.returncode == 0, put.stderr
    took = subprocess.run([*base, "--zookeeper-ca", str(tls / "ca.crt"), "--json", "queue", "take", "cli-jobs"],
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert took.returncode == 0 and "from the cli" in took.stdout, took.stdout + took.stderr


def test_a_replicated_streams_brokers_and_its_client_reach_zookeeper_over_tls_alone(
    tls_server: tuple[ZooKeeperServer, Path], tmp_path: Path
) -> None:
    """Three brokers given the TLS port and ``--zookeeper-ca`` register and elect a leader there; a
    client locating the leader over TLS publishes, follows the new leader when the first is killed,
    and loses nothing it had confirmed."""
    server, tls = tls_server
    zookeeper = ZooKeeperHarness(server, "/tls-stream")
    replicas = ReplicaSet(
        zookeeper, tmp_path, zookeeper_for=dict.fromkeys(["r0", "r1", "r2"], server.secure_connect_string)
    )
    replicas.extra = ["--zookeeper-ca", str(tls / "ca.crt")]
    ca = (tls / "ca.crt").read_text()
    try:
        leader = replicas.start_in_sync()
        endpoint, _ = discover(server.secure_connect_string, "default", "prices", chroot=zookeeper.root, ca=ca)
        assert endpoint == f"tcp://127.0.0.1:{replicas.ports[leader]}"
        locator = LeaderLocator(server.secure_connect_string, "default", "prices", chroot=zookeeper.root, ca=ca)
        with StreamClient(locator(), "prices", producer_id="tls", locator=locator, timeout=60) as client:
            for n in range(50):
                client.publish("k", f"p:{n}".encode())
            client.flush(timeout=30)
            epoch = replicas.state().epoch
            replicas.kill(leader)
            until(lambda: replicas.state().epoch > epoch, "a new leader elected over TLS", timeout=30)
            for n in range(50, 100):
                client.publish("k", f"p:{n}".encode())
            client.flush(timeout=60)
        new_leader = replicas.leader()
        assert new_leader != leader
        bodies = [body for _, body in replicas.journal(new_leader) if body.startswith(b"p:")]
        assert bodies == [f"p:{n}".encode() for n in range(100)], bodies[:5]
        locator.close()
    finally:
        replicas.stop()
        zookeeper.close()
