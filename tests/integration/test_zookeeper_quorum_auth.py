"""The chart's ZooKeeper servers authenticate each other and speak TLS to each other (issue 48,
item 10): three real servers run by the image's own launcher (``images/zookeeper/zookeeper-run``,
the pinned jars) on loopback, and a process posing as a server of the ensemble
(``e2e/kind/workers/forged_zookeeper_peer.py``, which the kind suite runs inside a server's pod).

Without quorum authentication a server takes any process that reaches its election port for a peer
and answers its vote (the control: the forger's check can see acceptance). With
``ZOO_QUORUM_USER``/``ZOO_QUORUM_PASSWORD`` (the chart's Secret) the servers form their quorum, a
forger is cut off before its vote is read, whatever server id it claims, and a server holding
another password never joins. With ``ZOO_TLS_DIR`` (the chart's certificates) the servers peer over
TLS with certificates their CA signed: plain TCP is cut off, a server whose certificate another CA
signed never joins, and an ensemble that ran without TLS gets to it by rolling restarts."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.handlers.threading import KazooTimeoutError

from harness import TEST_JVM_OPTIONS
from zeps_dev.process import free_port, wait_until
from zeps_dev.tls import certificates
from zeps_dev.zookeeper import four_letter, zookeeper_home

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = ROOT / "images" / "zookeeper" / "zookeeper-run"
FORGER = ROOT / "e2e" / "kind" / "workers" / "forged_zookeeper_peer.py"
TLS_PEER = ROOT / "e2e" / "kind" / "workers" / "zookeeper_tls_peer.py"
USER, PASSWORD = "zeps-quorum", "Quorum0Password0Of0Letters"


class Server:
    """One server of a loopback ensemble, run by the image's launcher."""

    def __init__(self, sid: int, folder: Path) -> None:
        self.sid, self.folder = sid, folder
        self.client, self.quorum, self.election = free_port(), free_port(), free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def log(self) -> str:
        return (self.folder / "log").read_text(errors="replace")

    def mode(self) -> str:
        """leader, follower, or "" while it serves no client (no quorum yet)."""
        try:
            text = four_letter(self.client, "srvr", timeout=2)
        except OSError:
            return ""
        return text.split("Mode: ")[1].split()[0] if "Mode: " in text else ""

    def start(self, servers: str, password: str | None, auth: str = "require", *, tls: Path | None = None,
              tls_mode: str = "require", client_tls: str = "") -> None:  # fmt: skip
        """(Re)start it: ``servers`` the ensemble's server lines; ``password`` None: no quorum
        authentication; ``auth``: ZOO_QUORUM_AUTH; ``tls``: ZOO_TLS_DIR (None: plain TCP between the
        servers), ``tls_mode``: ZOO_QUORUM_TLS, ``client_tls``: ZOO_CLIENT_TLS ("": none)."""
        self.stop()
        self.folder.mkdir(exist_ok=True)
        env = {"PATH": os.environ["PATH"], "ZOO_SERVERS": servers, "ZOO_MY_ID": str(self.sid),
               "ZOO_DATA_DIR": str(self.folder / "data"), "ZOO_CLIENT_PORT": str(self.client),
               "ZOO_RUN_DIR": str(self.folder), "ZOO_LIB": str(zookeeper_home() / "lib"), "ZOO_HEAP": "128m",
               "JAVA_TOOL_OPTIONS": TEST_JVM_OPTIONS,  # the launcher's java as it is, at C1 (ci.md)
               **({"ZOO_QUORUM_USER": USER, "ZOO_QUORUM_PASSWORD": password, "ZOO_QUORUM_AUTH": auth}
                  if password else {}),
               **({"ZOO_TLS_DIR": str(tls), "ZOO_QUORUM_TLS": tls_mode} if tls else {}),
               **({"ZOO_CLIENT_TLS": client_tls, "ZOO_SECURE_CLIENT_PORT": str(free_port())}
                  if client_tls else {})}  # fmt: skip
        with (self.folder / "log").open("ab") as log:
            self.process = subprocess.Popen(["bash", str(LAUNCHER)], env=env, stdout=log, stderr=subprocess.STDOUT)

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=30)
            self.process = None


def _line(servers: list[Server]) -> str:
    return " ".join(f"server.{s.sid}=127.0.0.1:{s.quorum}:{s.election};{s.client}" for s in servers)


@contextmanager
def ensemble(tmp_path: Path, passwords: list[str | None]) -> Iterator[list[Server]]:
    """One server per entry of ``passwords`` (None: no quorum authentication), stopped at the end."""
    servers = [Server(i + 1, tmp_path / f"server{i + 1}") for i in range(len(passwords))]
    try:
        for server, password in zip(servers, passwords, strict=True):
            server.start(_line(servers), password)
        yield servers
    finally:
        for server in servers:
            server.stop()


def _whole(servers: list[Server]) -> bool:
    """One leader, the others followers."""
    modes = sorted(s.mode() for s in servers)
    return modes == sorted(["leader"] + ["follower"] * (len(servers) - 1))


def _forge(sid: int, servers: list[Server]) -> dict[int, str]:
    """Each server's answer to a process posing as server ``sid``."""
    done = subprocess.run([sys.executable, str(FORGER), str(sid), *(f"127.0.0.1:{s.election}" for s in servers)],
                          capture_output=True, text=True, timeout=120, check=True)  # fmt: skip
    answers = [json.loads(line)["answer"] for line in done.stdout.splitlines()]
    return {s.sid: a for s, a in zip(servers, answers, strict=True)}


def test_without_quorum_authentication_a_process_posing_as_a_server_is_answered(tmp_path: Path) -> None:
    with ensemble(tmp_path, [None, None, None]) as servers:
        wait_until(lambda: _whole(servers), timeout=60, what="one leader and two followers")
        assert _forge(1000, servers) == {1: "vote", 2: "vote", 3: "vote"}


def test_servers_that_share_the_quorum_password_serve_and_cut_off_a_process_posing_as_one(tmp_path: Path) -> None:
    with ensemble(tmp_path, [PASSWORD] * 3) as servers:
        wait_until(lambda: _whole(servers), timeout=60, what="one leader and two followers, authenticated")
        assert _forge(1000, servers) == {1: "closed", 2: "closed", 3: "closed"}  # a stranger's id
        assert _forge(2, servers) == {1: "closed", 2: "closed", 3: "closed"}  # a member's id
        assert "Learner not trying to authenticate and authentication is required" in servers[0].log
        assert _whole(servers), "the forgers disturbed the ensemble"


def test_a_server_holding_another_quorum_password_never_joins(tmp_path: Path) -> None:
    with ensemble(tmp_path, [PASSWORD, PASSWORD, "Another0Password0Entirely"]) as servers:
        wait_until(lambda: _whole(servers[:2]), timeout=60, what="the two servers that agree serving")
        wait_until(lambda: "Failed to authenticate using SASL" in servers[0].log + servers[1].log, timeout=60,
                   what="a SASL failure logged by a server the third tried")  # fmt: skip
        assert servers[2].mode() == "", "a server with another password joined the quorum"


def test_an_ensemble_that_ran_without_it_gets_to_quorum_authentication_one_server_at_a_time(tmp_path: Path) -> None:
    """The chart's upgrade path (``quorumAuth.mode``): three rolling restarts, highest id first as a
    StatefulSet rolls, each server back in the quorum before the next; accept, then send, then
    require. The ensemble serves at every step, and at the end cuts a forger off."""
    with ensemble(tmp_path, [None, None, None]) as servers:
        wait_until(lambda: _whole(servers), timeout=60, what="one leader and two followers, no authentication")
        for auth in ("accept", "send", "require"):
            for server in reversed(servers):
                server.start(_line(servers), PASSWORD, auth)
                wait_until(lambda: _whole(servers), timeout=90, what=f"the ensemble whole, server {server.sid} {auth}")
        assert _forge(1000, servers) == {1: "closed", 2: "closed", 3: "closed"}


def test_servers_that_share_a_ca_peer_over_tls_and_cut_off_a_process_speaking_plain_tcp(tmp_path: Path) -> None:
    """ZOO_TLS_DIR: the quorum and election connections are TLS, each server's certificate signed by
    the ensemble's CA; a process that reaches an election port and speaks ZooKeeper's plain
    handshake is cut off before its vote is read (without TLS or SASL it is answered: the first test
    of this module). Quorum authentication on too, as the chart runs them."""
    tls = certificates(tmp_path / "tls")
    servers = [Server(i + 1, tmp_path / f"server{i + 1}") for i in range(3)]
    try:
        for server in servers:
            server.start(_line(servers), PASSWORD, tls=tls)
        wait_until(lambda: _whole(servers), timeout=60, what="one leader and two followers over TLS")
        assert _forge(1000, servers) == {1: "closed", 2: "closed", 3: "closed"}
        # the election ports speak TLS, and take only a peer with a certificate the CA signed (the
        # worker the kind suite runs in a server's pod)
        peers = subprocess.run([sys.executable, str(TLS_PEER), str(tls), *(f"127.0.0.1:{s.election}" for s in servers)],
                               capture_output=True, text=True, timeout=120, check=True)  # fmt: skip
        answers = [(a["certificate"], a["answer"], a.get("peer")) for a in map(json.loads, peers.stdout.splitlines())]
        assert answers == [(True, "open", "zeps-zookeeper"), (False, "refused", None)] * 3, answers
        config = (servers[0].folder / "data" / "zoo.cfg").read_text()
        assert "sslQuorum=true" in config and "portUnification=false" in config
        assert "-----BEGIN PRIVATE KEY-----" in (servers[0].folder / "quorum-keystore.pem").read_text(), "PKCS#8"
        assert oct((servers[0].folder / "quorum-keystore.pem").stat().st_mode & 0o777) == "0o600"
        assert _whole(servers), "the forgers disturbed the ensemble"
    finally:
        for server in servers:
            server.stop()


def test_a_server_whose_certificate_another_ca_signed_never_joins(tmp_path: Path) -> None:
    tls = certificates(tmp_path / "tls")
    stranger = certificates(tmp_path / "stranger")
    servers = [Server(i + 1, tmp_path / f"server{i + 1}") for i in range(3)]
    try:
        for server, folder in zip(servers, (tls, tls, stranger), strict=True):
            server.start(_line(servers), None, tls=folder)
        wait_until(lambda: _whole(servers[:2]), timeout=60, what="the two servers of the ensemble's CA serving")
        wait_until(lambda: "PKIX path" in servers[0].log + servers[1].log + servers[2].log, timeout=60,
                   what="a certificate refused for want of a path to the trusted CA")  # fmt: skip
        assert servers[2].mode() == "", "a server with a stranger's certificate joined the quorum"
    finally:
        for server in servers:
            server.stop()


def test_an_ensemble_that_ran_without_tls_gets_to_it_one_server_at_a_time(tmp_path: Path) -> None:
    """The chart's upgrade path (``tls.quorumMode``): three rolling restarts, highest id first, each
    server back in the quorum before the next; accept (TLS and plain on the same ports), send (peers
    reached with TLS), require. The ensemble serves at every step; at the end plain TCP is cut off."""
    tls = certificates(tmp_path / "tls")
    with ensemble(tmp_path, [None, None, None]) as servers:
        wait_until(lambda: _whole(servers), timeout=60, what="one leader and two followers, plain TCP")
        for mode in ("accept", "send", "require"):
            for server in reversed(servers):
                server.start(_line(servers), None, tls=tls, tls_mode=mode)
                wait_until(lambda: _whole(servers), timeout=90, what=f"the ensemble whole, server {server.sid} {mode}")
        assert _forge(1000, servers) == {1: "closed", 2: "closed", 3: "closed"}


def test_clients_reach_a_server_over_tls_and_its_plain_port_only_from_its_own_address(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """ZOO_CLIENT_TLS=require: a client that trusts the ensemble's CA and checks the server's name
    works on the secure port (kazoo's TLS); a client trusting another CA is refused there; the
    plain port answers on 127.0.0.1 alone (the readiness probe, a shell in the pod), so another
    address of this machine (127.0.0.2) gets no plain connection."""
    tls = certificates(tmp_path / "tls")
    stranger = certificates(tmp_path / "stranger")
    server = Server(1, tmp_path / "server1")
    secure = free_port()
    server.folder.mkdir()
    env = {"PATH": os.environ["PATH"], "ZOO_MY_ID": "1", "ZOO_DATA_DIR": str(server.folder / "data"),
           "ZOO_CLIENT_PORT": str(server.client), "ZOO_SECURE_CLIENT_PORT": str(secure),
           "ZOO_RUN_DIR": str(server.folder), "ZOO_LIB": str(zookeeper_home() / "lib"), "ZOO_HEAP": "128m",
           "ZOO_TLS_DIR": str(tls), "ZOO_CLIENT_TLS": "require"}  # fmt: skip
    with (server.folder / "log").open("ab") as log:
        server.process = subprocess.Popen(["bash", str(LAUNCHER)], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: server.mode() == "standalone", timeout=60, what="the server serving")

        def client(ca: Path) -> KazooClient:
            return KazooClient(hosts=f"127.0.0.1:{secure}", use_ssl=True, ca=str(ca / "ca.crt"), verify_certs=True,
                               check_hostname=True, connection_retry={"max_tries": 0})  # fmt: skip

        trusted = client(tls)
        trusted.start(timeout=30)
        try:
            trusted.create("/over-tls", b"secret")
            assert trusted.get("/over-tls")[0] == b"secret"
        finally:
            trusted.stop()
            trusted.close()
        refused = client(stranger)
        with pytest.raises(KazooTimeoutError):  # kazoo logs each refused handshake and gives up at the timeout
            refused.start(timeout=5)
        assert "CERTIFICATE_VERIFY_FAILED" in caplog.text
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.2", server.client), timeout=5).close()
    finally:
        server.stop()


def test_in_an_ensemble_with_client_tls_required_the_plain_port_listens_on_loopback_alone(tmp_path: Path) -> None:
    """Each server line names its client port (";2181" in the chart), which overrides
    clientPortAddress: the launcher binds it to 127.0.0.1 there too."""
    tls = certificates(tmp_path / "tls")
    servers = [Server(i + 1, tmp_path / f"server{i + 1}") for i in range(3)]
    try:
        for server in servers:
            server.start(_line(servers), None, tls=tls, client_tls="require")
        wait_until(lambda: _whole(servers), timeout=60, what="one leader and two followers")  # plain srvr on 127.0.0.1
        for server in servers:
            with pytest.raises(OSError):
                socket.create_connection(("127.0.0.2", server.client), timeout=5).close()
    finally:
        for server in servers:
            server.stop()


def test_the_launcher_refuses_a_tls_folder_without_its_files_and_client_tls_without_one(tmp_path: Path) -> None:
    env = {"PATH": os.environ["PATH"], "ZOO_DATA_DIR": str(tmp_path), "ZOO_MY_ID": "1", "ZOO_TLS_DIR": str(tmp_path)}
    done = subprocess.run(["bash", str(LAUNCHER)], env=env, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 64
    assert "has no readable ca.crt" in done.stderr
    env = {"PATH": os.environ["PATH"], "ZOO_DATA_DIR": str(tmp_path), "ZOO_MY_ID": "1", "ZOO_CLIENT_TLS": "require"}
    done = subprocess.run(["bash", str(LAUNCHER)], env=env, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 64
    assert "ZOO_CLIENT_TLS needs ZOO_TLS_DIR" in done.stderr


def test_the_launcher_refuses_half_a_quorum_identity(tmp_path: Path) -> None:
    env = {"PATH": os.environ["PATH"], "ZOO_DATA_DIR": str(tmp_path), "ZOO_MY_ID": "1", "ZOO_QUORUM_USER": USER}
    done = subprocess.run(["bash", str(LAUNCHER)], env=env, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 64
    assert "ZOO_QUORUM_PASSWORD" in done.stderr


pytestmark = pytest.mark.timeout(300)
