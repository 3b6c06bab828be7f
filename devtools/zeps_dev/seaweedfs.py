"""A real S3 server on 127.0.0.1: SeaweedFS's ``weed server -s3`` (master, volume server, filer and
S3 gateway in one process), from the pinned module in ``tools/testbin/seaweedfs`` (``ZEPS_TESTBIN``).

Two identities are configured: ``admin`` (may do anything: the stores under test use it) and
``reader`` (may read and list only: the access-denied tests use it). Buckets are not created on
upload (``-s3.autoCreateBucket=false``), so a store naming a missing bucket meets the real error;
:meth:`SeaweedFS.create_bucket` makes one through ``weed shell``. Telemetry is switched off: the
server talks to nobody but its own ports.
"""

from __future__ import annotations

import json
import os
import secrets
import urllib.error
import urllib.request
from pathlib import Path

from zeps.errors import SetupError
from zeps_dev import testbin
from zeps_dev.process import LocalServer, ManagedProcess, free_port, run_tool

__all__ = ["SeaweedFS", "weed_binary"]

_READY_BUCKET = "zeps-harness-ready"  #: where start() writes an object to know the server takes writes

#: the ports one server listens on (each on 127.0.0.1), by the flag that sets it
_PORTS = ("master.port", "master.port.grpc", "volume.port", "volume.port.grpc", "filer.port", "filer.port.grpc",
          "s3.port", "s3.port.grpc")  # fmt: skip

#: glog's flags (before the command): log to stderr only (our log file), never to files in /tmp
_LOG_TO_STDERR = ("-logtostderr",)


#: names an optimised ``weed`` (``tools/setup.sh bench`` builds it for the benchmarks); without it, the
#: test set's, built without optimisation (``tools/testbin/build.sh``: it does little work in a test)
ENV_WEED = "ZEPS_WEED"


def weed_binary() -> Path:
    """SeaweedFS's ``weed``: ``ZEPS_WEED``'s if set, else the one built from its pinned module into
    ``ZEPS_TESTBIN`` (see :mod:`zeps_dev.testbin`)."""
    optimised = os.environ.get(ENV_WEED, "")
    if optimised:
        if not os.access(optimised, os.X_OK):
            raise SetupError(f"{ENV_WEED}={optimised} is not an executable weed; run tools/setup.sh bench, or unset it")
        return Path(optimised)
    return testbin.binaries(("weed",)) / "weed"


class SeaweedFS(LocalServer):
    """One ``weed server -s3`` with its own data directory; ports chosen once and kept across
    :meth:`restart`, data kept too (a restart is the server coming back, not a new one)."""

    def __init__(self, workdir: Path, *, admin: tuple[str, str] | None = None) -> None:
        self.workdir = workdir
        #: (access key id, secret key) allowed everything (random unless given)
        self.admin = admin or ("zeps-admin", secrets.token_hex(16))
        self.reader = ("zeps-reader", secrets.token_hex(16))  #: allowed to read and list only
        self.ports: dict[str, int] = {}
        self._process: ManagedProcess | None = None

    @property
    def endpoint(self) -> str:
        """The S3 API's URL."""
        if not self.ports:
            raise SetupError("SeaweedFS has not been started yet")
        return f"http://127.0.0.1:{self.ports['s3.port']}"

    def credentials(self, who: str = "admin") -> dict[str, str]:
        """The environment variables a client with ``who``'s identity needs (admin or reader)."""
        key, secret = self.admin if who == "admin" else self.reader
        return {"AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": secret}

    def _config(self) -> Path:
        identities = [
            {"name": "admin", "credentials": [{"accessKey": self.admin[0], "secretKey": self.admin[1]}],
             "actions": ["Admin", "Read", "Write", "List", "Tagging"]},
            {"name": "reader", "credentials": [{"accessKey": self.reader[0], "secretKey": self.reader[1]}],
             "actions": ["Read", "List"]},
        ]  # fmt: skip
        path = self.workdir / "s3.json"
        path.write_text(json.dumps({"identities": identities}))
        path.chmod(0o600)
        return path

    def argv(self) -> list[str]:
        data = self.workdir / "data"
        data.mkdir(parents=True, exist_ok=True)
        if not self.ports:
            self.ports = {flag: free_port() for flag in _PORTS}
        return [
            str(weed_binary()), *_LOG_TO_STDERR, "server", "-ip=127.0.0.1", "-ip.bind=127.0.0.1", f"-dir={data}",
            "-filer", "-s3", f"-s3.config={self._config()}", "-s3.autoCreateBucket=false",
            "-s3.port.iceberg=0", "-s3.port.lance=0", "-master.telemetry=false",
            "-volume.max=64", "-master.volumeSizeLimitMB=256",  # 7 volumes of 256 MiB per bucket (sparse files)
            "-master.electionTimeout=1s",  # the lone master elects itself again soon after a restart
            f"-filer.localSocket={self.workdir / 'filer.sock'}", f"-s3.localSocket={self.workdir / 's3.sock'}",
            *(f"-{flag}={port}" for flag, port in self.ports.items()),
        ]  # fmt: skip

    def start(self, timeout: float = 90.0) -> None:
        """Start the server; return once its S3 API stores an object (the first write after a start
        waits seconds for the master to grow volumes: that wait is taken here, not by a test)."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        fresh = not (self.workdir / "data").exists()
        self._process = ManagedProcess("seaweedfs", self.argv(), log_path=self.workdir / "weed.log")
        self._process.start()
        self._process.wait_ready(self._answers, timeout=timeout)
        if fresh:
            self.create_bucket(_READY_BUCKET)
        self._process.wait_ready(self._writes, timeout=timeout)

    def _writes(self) -> bool:
        import obstore  # noqa: PLC0415  (zeps[s3]: in the dev environment)
        from obstore.store import S3Store  # noqa: PLC0415

        key, secret = self.admin
        client = S3Store(_READY_BUCKET, endpoint=self.endpoint, region="us-east-1", access_key_id=key,
                         secret_access_key=secret, client_options={"allow_http": True, "timeout": "2s"},
                         retry_config={"max_retries": 0})  # fmt: skip
        obstore.put(client, "ready", b"ready")
        return True

    def _answers(self) -> bool:
        try:
            urllib.request.urlopen(self.endpoint, timeout=2).close()  # our own loopback server
        except urllib.error.HTTPError as exc:
            return exc.code in (403, 400)  # refused an anonymous listing: the gateway and its filer are up
        return True

    def _shell(self, command: str) -> str:
        p = self.ports
        return run_tool(
            [str(weed_binary()), *_LOG_TO_STDERR, "shell",
             f"-master=127.0.0.1:{p['master.port']}.{p['master.port.grpc']}",
             f"-filer=127.0.0.1:{p['filer.port']}.{p['filer.port.grpc']}"],
            input=command + "\n", timeout=60, hint=" (weed shell)",
        )  # fmt: skip

    def create_bucket(self, name: str) -> None:
        """Create an empty bucket (as an operator would, before zeps uses it)."""
        out = self._shell(f"s3.bucket.create -name {name}")
        if f"created bucket {name}" not in out:
            raise SetupError(f"weed shell did not create bucket {name}: {out.strip()[-500:]}")

    def stop(self) -> None:
        if self._process is not None:
            self._process.stop(grace=3.0)  # weed drains for longer than a test wants to wait; its data is synced
        for port in self.ports.values():
            # the gRPC fast-path sockets weed names by a port of its own in /tmp (removed by a clean
            # stop, not by a kill; seen named after another part's port than their own)
            for stale in Path("/tmp").glob(f"seaweedfs-*-grpc-{port}.sock"):
                stale.unlink(missing_ok=True)

    def kill(self) -> None:
        """``kill -9``: the server dies mid-whatever (restart it with :meth:`start`)."""
        if self._process is not None:
            self._process.kill()

    def restart(self, timeout: float = 90.0) -> None:
        self.stop()
        self.start(timeout)
