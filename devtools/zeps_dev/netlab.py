"""A small network of hosts for multicast tests: Linux network namespaces joined by a bridge.

::

    with NetLab(hosts=3) as lab:                       # namespaces zl<id>-br, zl<id>-0 .. zl<id>-2
        broker = lab.process(0, "broker", [python, "-m", "zeps.broker.main", ...], log_path=...)
        lab.drop(1, probability=0.05)                  # host 1 loses 5% of its multicast packets
        lab.blackout(1)                                # ... or all of them, until lab.restore(1)

Each host namespace has one veth (``eth0``) on the bridge, an address ``10.<net>.0.<i+1>/24``, its
loopback up and a route for 224.0.0.0/4 through ``eth0``. The bridge lives in a namespace of its own
with IGMP snooping off (it floods multicast: no querier runs here). Nothing is added to the namespace
this process runs in, and traffic never leaves the lab. Loss is an iptables rule in the receiving
host (``-m statistic --mode random``; this kernel has no netem qdisc). ``stop()`` (also at exit)
kills the lab's processes and deletes every namespace it made, which deletes its links.

Needs root (CAP_NET_ADMIN), ``ip`` (iproute2) and ``iptables``; :func:`available` says why not.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

from zeps.errors import SetupError
from zeps_dev.process import ManagedProcess

__all__ = ["NetLab", "available"]

_MULTICAST = "224.0.0.0/4"


def available() -> str | None:
    """None if a lab can be made here, else why not (a sentence naming the fix)."""
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_NET_ADMIN); run the multicast tests as root"
    for tool, package in (("ip", "iproute2"), ("iptables", "iptables")):
        if shutil.which(tool) is None:
            return f"{tool} is missing: apt-get install {package} (make setup installs it)"
    return None


def _run(*argv: str) -> None:
    result = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=30)
    if result.returncode:
        raise SetupError(f"{' '.join(argv)} failed: {(result.stderr or result.stdout).strip()}")


class NetLab:
    """``hosts`` namespaces on one bridge (see the module's notes)."""

    def __init__(self, hosts: int, *, net: int | None = None) -> None:
        if not 1 <= hosts <= 250:
            raise ValueError(f"hosts={hosts}: 1 to 250")
        self.id = f"zl{os.getpid() % 100_000}"
        self.net = net if net is not None else 64 + os.getpid() % 128  # 10.<net>.0.0/24: a test's own
        self.hosts = [f"{self.id}-{i}" for i in range(hosts)]
        self.bridge = f"{self.id}-br"
        self._made: list[str] = []
        self._processes: list[ManagedProcess] = []

    def address(self, host: int) -> str:
        return f"10.{self.net}.0.{host + 1}"

    def start(self) -> Self:
        why = available()
        if why is not None:
            raise SetupError(why)
        atexit.register(self.stop)
        try:
            self._add(self.bridge)
            _run("ip", "-n", self.bridge, "link", "add", "br0", "type", "bridge", "mcast_snooping", "0")
            _run("ip", "-n", self.bridge, "link", "set", "br0", "up")
            for i, name in enumerate(self.hosts):
                self._add(name)
                port = f"v{i}"  # the bridge's end; the host's end is its eth0
                _run("ip", "-n", self.bridge, "link", "add", port, "type", "veth", "peer", "eth0", "netns", name)
                _run("ip", "-n", self.bridge, "link", "set", port, "master", "br0", "up")
                _run("ip", "-n", name, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
                _run("ip", "-n", name, "link", "set", "eth0", "up")
                _run("ip", "-n", name, "link", "set", "lo", "up")
                _run("ip", "-n", name, "route", "add", _MULTICAST, "dev", "eth0")
        except BaseException:
            self.stop()
            raise
        return self

    def _add(self, name: str) -> None:
        _run("ip", "netns", "add", name)
        self._made.append(name)

    def process(self, host: int, name: str, argv: Sequence[str], *, log_path: Path) -> ManagedProcess:
        """``argv`` started in host ``host``'s namespace (stopped with the lab at the latest)."""
        proc = ManagedProcess(name, ["ip", "netns", "exec", self.hosts[host], *argv], log_path=log_path)
        proc.start()
        self._processes.append(proc)
        return proc

    def exec(self, host: int, *argv: str) -> None:
        _run("ip", "netns", "exec", self.hosts[host], *argv)

    def drop(self, host: int, probability: float) -> None:
        """Host ``host`` loses each multicast packet it receives with ``probability`` (on top of
        earlier rules; :meth:`restore` removes them all)."""
        self.exec(host, "iptables", "-A", "INPUT", "-d", _MULTICAST, "-m", "statistic", "--mode", "random",
                  "--probability", f"{probability:.4f}", "-j", "DROP")  # fmt: skip

    def blackout(self, host: int) -> None:
        """Host ``host`` loses every multicast packet until :meth:`restore`."""
        self.exec(host, "iptables", "-I", "INPUT", "1", "-d", _MULTICAST, "-j", "DROP")

    def restore(self, host: int) -> None:
        self.exec(host, "iptables", "-F", "INPUT")

    def dropped(self, host: int) -> int:
        """Packets host ``host``'s rules dropped so far."""
        out = subprocess.run(["ip", "netns", "exec", self.hosts[host], "iptables", "-L", "INPUT", "-v", "-n", "-x"],
                             capture_output=True, text=True, check=True, timeout=30).stdout  # fmt: skip
        return sum(int(line.split()[0]) for line in out.splitlines() if line.split()[2:3] == ["DROP"])

    def stop(self) -> None:
        for proc in self._processes:
            proc.stop(grace=5)
        self._processes.clear()
        for name in reversed(self._made):  # a namespace's links go with it
            subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False, timeout=30)
        self._made.clear()
        atexit.unregister(self.stop)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
