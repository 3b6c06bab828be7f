"""The chart's ZooKeeper servers authenticate each other (issue 48, item 10): three real servers run
by the image's own launcher (``images/zookeeper/zookeeper-run``, the pinned jars) on loopback, and a
process posing as a server of the ensemble (``e2e/kind/workers/forged_zookeeper_peer.py``, which the
kind suite runs from a tenant's pod against the chart's ensemble).

Without quorum authentication a server takes any process that reaches its election port for a peer
and answers its vote (the control: the forger's check can see acceptance). With
``ZOO_QUORUM_USER``/``ZOO_QUORUM_PASSWORD`` (the chart's Secret) the servers form their quorum, a
forger is cut off before its vote is read, whatever server id it claims, and a server holding
another password never joins."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from zeps_dev.process import free_port, wait_until
from zeps_dev.zookeeper import four_letter, zookeeper_home

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = ROOT / "images" / "zookeeper" / "zookeeper-run"
FORGER = ROOT / "e2e" / "kind" / "workers" / "forged_zookeeper_peer.py"
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

    def start(self, servers: str, password: str | None, auth: str = "require") -> None:
        """(Re)start it: ``servers`` the ensemble's server lines; ``password`` None: no quorum
        authentication; ``auth``: ZOO_QUORUM_AUTH."""
        self.stop()
        self.folder.mkdir(exist_ok=True)
        env = {"PATH": os.environ["PATH"], "ZOO_SERVERS": servers, "ZOO_MY_ID": str(self.sid),
               "ZOO_DATA_DIR": str(self.folder / "data"), "ZOO_CLIENT_PORT": str(self.client),
               "ZOO_RUN_DIR": str(self.folder), "ZOO_LIB": str(zookeeper_home() / "lib"), "ZOO_HEAP": "128m",
               **({"ZOO_QUORUM_USER": USER, "ZOO_QUORUM_PASSWORD": password, "ZOO_QUORUM_AUTH": auth}
                  if password else {})}  # fmt: skip
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


def test_the_launcher_refuses_half_a_quorum_identity(tmp_path: Path) -> None:
    env = {"PATH": os.environ["PATH"], "ZOO_DATA_DIR": str(tmp_path), "ZOO_MY_ID": "1", "ZOO_QUORUM_USER": USER}
    done = subprocess.run(["bash", str(LAUNCHER)], env=env, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 64
    assert "ZOO_QUORUM_PASSWORD" in done.stderr


pytestmark = pytest.mark.timeout(180)
