"""A real standalone ZooKeeper server on 127.0.0.1, from the pinned jars in the zeps cache."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

from zeps.errors import SetupError
from zeps_dev.process import LocalServer, ManagedProcess, free_port

__all__ = ["ZooKeeperServer", "zookeeper_home"]

ENV_HOME = "ZEPS_ZOOKEEPER_HOME"


def zookeeper_home() -> Path:
    """The folder holding ZooKeeper's ``lib/*.jar``, from ``ZEPS_ZOOKEEPER_HOME``."""
    value = os.environ.get(ENV_HOME)
    if not value:
        raise SetupError(f"{ENV_HOME} is not set; run `make setup` (or export {ENV_HOME}=$(tools/zookeeper/fetch.sh))")
    home = Path(value)
    if not any((home / "lib").glob("zookeeper-*.jar")):
        raise SetupError(f"{ENV_HOME}={home} holds no lib/zookeeper-*.jar; run `make setup` again")
    return home


def four_letter(port: int, command: str, timeout: float = 5.0) -> str:
    """Send a four-letter-word command to the server on 127.0.0.1:``port`` and return the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(command.encode("ascii"))
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")


class ZooKeeperServer(LocalServer):
    """One standalone ZooKeeper server with its own data directory.

    The port is chosen once and kept across :meth:`restart`, so clients reconnect to the same
    address; the data directory survives restarts (it is the server's durable state).

    Settings chosen for tests and the demo: ``tickTime=500`` so sessions may be as short as 1 s
    (fast expiry tests) and as long as 60 s; 4-letter-word commands enabled (``mntr``, ``srvr``,
    ``cons``) so tests can count requests; the AdminServer (Jetty) disabled.
    """

    def __init__(
        self,
        workdir: Path,
        *,
        home: Path | None = None,
        port: int | None = None,
        tick_ms: int = 500,
        force_sync: bool = True,
        heap_mb: int = 512,
        extra_config: dict[str, str] | None = None,
        jvm_flags: list[str] | None = None,
        tls: Path | None = None,
    ) -> None:
        self.workdir = workdir
        self.home = home
        self.port = port
        self.tick_ms = tick_ms
        self.force_sync = force_sync
        self.heap_mb = heap_mb
        self.extra_config = dict(extra_config or {})
        self.jvm_flags = list(jvm_flags or [])  # e.g. -Dzookeeper.DigestAuthenticationProvider.superDigest=…
        #: a folder with ca.crt, tls.crt and tls.key (zeps_dev.tls.certificates): clients are served over
        #: TLS on secure_port as well (the plain port stays, on 127.0.0.1, for srvr and the tests' checks)
        self.tls = tls
        self.secure_port: int | None = None
        self._process: ManagedProcess | None = None

    # -- addresses --------------------------------------------------------------------------------
    @property
    def connect_string(self) -> str:
        if self.port is None:
            raise SetupError("ZooKeeperServer has not been started yet")
        return f"127.0.0.1:{self.port}"

    @property
    def secure_connect_string(self) -> str:
        """The TLS port's address, with a server started with ``tls``."""
        if self.secure_port is None:
            raise SetupError("ZooKeeperServer was not started with tls")
        return f"127.0.0.1:{self.secure_port}"

    @property
    def data_dir(self) -> Path:
        return self.workdir / "data"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    # -- lifecycle --------------------------------------------------------------------------------
    def _write_config(self) -> Path:
        assert self.port is not None
        config = {
            "tickTime": str(self.tick_ms),
            "dataDir": str(self.data_dir),
            "clientPort": str(self.port),
            "clientPortAddress": "127.0.0.1",
            "maxClientCnxns": "0",
            "minSessionTimeout": str(2 * self.tick_ms),
            "maxSessionTimeout": "60000",
            "admin.enableServer": "false",
            "4lw.commands.whitelist": "*",
            "forceSync": "yes" if self.force_sync else "no",
            "autopurge.snapRetainCount": "3",
            "autopurge.purgeInterval": "1",
            **self._tls_config(),
            **self.extra_config,
        }
        path = self.workdir / "zoo.cfg"
        path.write_text("".join(f"{k}={v}\n" for k, v in config.items()))
        return path

    def _tls_config(self) -> dict[str, str]:
        """The secure client port's settings (as images/zookeeper/zookeeper-run writes them)."""
        if self.tls is None:
            return {}
        if self.secure_port is None:
            self.secure_port = free_port()
        # ZooKeeper's PEM key store takes a PKCS#8 key: the chart's (Helm's) is PKCS#1
        key = subprocess.run(["openssl", "pkcs8", "-topk8", "-nocrypt", "-in", str(self.tls / "tls.key")],
                             capture_output=True, text=True, check=True, timeout=60).stdout  # fmt: skip
        keystore = self.workdir / "keystore.pem"
        keystore.write_text(key + (self.tls / "tls.crt").read_text())
        keystore.chmod(0o600)
        return {
            "serverCnxnFactory": "org.apache.zookeeper.server.NettyServerCnxnFactory",
            "secureClientPort": str(self.secure_port),
            "secureClientPortAddress": "127.0.0.1",
            "ssl.keyStore.location": str(keystore),
            "ssl.keyStore.type": "PEM",
            "ssl.trustStore.location": str(self.tls / "ca.crt"),
            "ssl.trustStore.type": "PEM",
            "ssl.clientAuth": "none",
        }

    def start(self, timeout: float = 60.0) -> None:
        """Start the server and wait until it serves requests."""
        argv = self.argv()
        self._process = ManagedProcess("zookeeper", argv, log_path=self.workdir / "zookeeper.log")
        self._process.start()
        # a probe sent while the server starts can be taken and never answered (ZooKeeper 3.9.4,
        # ZOOKEEPER-5051): it is given up after a second and sent again
        self._process.wait_ready(lambda: "Mode: standalone" in self.four_letter("srvr", timeout=1.0), timeout=timeout)

    def argv(self) -> list[str]:
        """The server's command line (its configuration written first), for a caller that runs it
        elsewhere — in a network namespace of the lab (set ``clientPortAddress`` in ``extra_config``)."""
        home = self.home or zookeeper_home()
        java = shutil.which("java")
        if java is None:
            raise SetupError("Java is missing; install a JDK 17 (apt-get install openjdk-17-jdk-headless)")
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.data_dir.mkdir(exist_ok=True)
        if self.port is None:
            self.port = free_port()
        config = self._write_config()
        return [
            java,
            f"-Xmx{self.heap_mb}m",
            "-XX:+UseSerialGC",
            "-Dzookeeper.jmx.log4j.disable=true",
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
            "-Dorg.slf4j.simpleLogger.showDateTime=true",
            "-Dzookeeper.enforceQuota=true",  # the hard quotas the operator sets per namespace bind
            *self.jvm_flags,
            "-cp",
            f"{home / 'lib'}/*",
            "org.apache.zookeeper.server.ZooKeeperServerMain",
            str(config),
        ]

    def stop(self) -> None:
        if self._process is not None:
            self._process.stop()

    def kill(self) -> None:
        """``kill -9`` the server (its data directory stays)."""
        if self._process is not None:
            self._process.kill()

    def restart(self, timeout: float = 60.0) -> None:
        """Stop and start again on the same port with the same data."""
        self.stop()
        self.start(timeout=timeout)

    def running(self) -> bool:
        return self._process is not None and self._process.running()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Freeze the server (SIGSTOP) for the body of the ``with``, as a long GC pause or a stalled disk
        would: connections stay open and requests wait unanswered. Keep it shorter than a third of the
        clients' session timeout, or kazoo drops the connection for a missed heartbeat."""
        pid = self.pid
        if pid is None or not self.running():
            raise SetupError("ZooKeeperServer is not running: nothing to pause")
        os.kill(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(pid, signal.SIGCONT)

    # -- inspection -------------------------------------------------------------------------------
    def four_letter(self, command: str, timeout: float = 5.0) -> str:
        """Send a four-letter-word command (``ruok``, ``srvr``, ``mntr``, ``cons``…) and return the answer."""
        if self.port is None:
            raise SetupError("ZooKeeperServer has not been started yet")
        return four_letter(self.port, command, timeout)

    def metrics(self) -> dict[str, str]:
        """The ``mntr`` metrics as a dict (for example ``zk_packets_received``, ``zk_znode_count``)."""
        out: dict[str, str] = {}
        for line in self.four_letter("mntr").splitlines():
            key, _, value = line.partition("\t")
            if key:
                out[key] = value
        return out
