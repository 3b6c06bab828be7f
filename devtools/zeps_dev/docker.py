"""The Docker engine behind ``make e2e``: the user's own when ``docker info`` answers, else one of ours.

An engine of ours is a ``dockerd`` with its own socket, data root and exec root under the zeps cache
(``<cache>/docker``), so it never touches an engine, container or network that zeps did not start:

* bridge ``none`` (no ``docker0``), no iptables rules and no IP forwarding on the host: containers
  reach each other on their own networks and the host through published ports, nothing else;
* where the kernel's capability bounding set lacks capabilities Docker grants privileged containers
  (CAP_SYS_RESOURCE on some VMs), a runtime shim (:data:`SHIM`) drops those from each container's
  OCI spec before it runs ``runc`` — otherwise ``docker run --privileged`` fails with "unable to
  apply caps";
* stopped with SIGTERM (dockerd then stops its containers); if the process that started it dies,
  the kernel sends dockerd the same SIGTERM (unless started ``detached``, to keep a cluster); a later
  start adopts a dockerd of ours that still answers (and stops it at the end), or cleans up after one
  that does not.

One ``make e2e`` at a time per cache: a lock file says who holds the engine.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from zeps.errors import SetupError
from zeps_dev.process import LocalServer, apt_install, wait_until

__all__ = ["CAPABILITIES", "SHIM", "DockerEngine", "image_exists", "missing_capabilities"]

# Linux capability numbers (include/uapi/linux/capability.h), the names OCI specs use.
CAPABILITIES = (
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "SETPCAP",
    "LINUX_IMMUTABLE",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_ADMIN",
    "NET_RAW",
    "IPC_LOCK",
    "IPC_OWNER",
    "SYS_MODULE",
    "SYS_RAWIO",
    "SYS_CHROOT",
    "SYS_PTRACE",
    "SYS_PACCT",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_NICE",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "MKNOD",
    "LEASE",
    "AUDIT_WRITE",
    "AUDIT_CONTROL",
    "SETFCAP",
    "MAC_OVERRIDE",
    "MAC_ADMIN",
    "SYSLOG",
    "WAKE_ALARM",
    "BLOCK_SUSPEND",
    "AUDIT_READ",
    "PERFMON",
    "BPF",
    "CHECKPOINT_RESTORE",
)

# The runtime shim, written into the engine's folder. It runs for every container start and exec,
# so it is small and stdlib-only; it edits the bundle's config.json (create/run) or the --process
# file (exec) and then becomes runc.
SHIM = '''#!{python}
"""zeps runtime shim: drop capabilities the kernel's bounding set lacks, then exec runc."""
import json, os, sys
NAMES = {names!r}
bound = int(next(l for l in open("/proc/self/status") if l.startswith("CapBnd:")).split()[1], 16)
allowed = {{"CAP_" + n for i, n in enumerate(NAMES) if bound >> i & 1}}
def edit(path, in_process):
    with open(path) as f:
        doc = json.load(f)
    caps = (doc.get("process") or {{}}).get("capabilities") if in_process else doc.get("capabilities")
    for key, value in (caps or {{}}).items():
        if isinstance(value, list):
            caps[key] = [c for c in value if c in allowed]
    with open(path, "w") as f:
        json.dump(doc, f)
args = sys.argv[1:]
for i, arg in enumerate(args):
    for flag, short, in_process, name in (("--bundle", "-b", True, "config.json"), ("--process", "-p", False, "")):
        value = None
        if arg in (flag, short) and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
        if value:
            edit(os.path.join(value, name) if name else value, in_process)
os.execvp("runc", ["runc"] + args)
'''

_PR_SET_PDEATHSIG = 1


def missing_capabilities(status: Path = Path("/proc/self/status")) -> list[str]:
    """The capabilities Docker would grant a privileged container that this kernel's bounding set lacks."""
    for line in status.read_text().splitlines():
        if line.startswith("CapBnd:"):
            bound = int(line.split()[1], 16)
            return [f"CAP_{name}" for i, name in enumerate(CAPABILITIES) if not bound >> i & 1]
    return []


def _term_with_parent() -> None:  # runs in dockerd's process between fork and exec
    _normal_priority()
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _normal_priority() -> None:  # runs in dockerd's process between fork and exec
    """dockerd (and so every container: the cluster's nodes) at nice 0 even when a niced job starts
    it (CI's ``nice make e2e-stack``): ``make e2e`` uses that engine later, with its clients at 0.
    Lowering a niceness needs root; without it dockerd keeps the caller's."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, 0, 0)


class DockerEngine(LocalServer):
    """A Docker engine to build images and run kind in; ``docker()`` runs the CLI against it.

    ``start()`` uses the engine ``docker info`` reaches with the caller's environment (``owned`` is
    then False and ``stop()`` leaves it alone), or starts a dockerd of ours under ``root``
    (installing Debian's ``docker.io`` first when ``dockerd`` is missing and apt-get is there).
    """

    def __init__(
        self,
        root: Path,
        *,
        say: Callable[[str], None] = lambda line: None,
        use_existing: bool = True,
        install: bool = True,
        detached: bool = False,
    ) -> None:
        self.root = root
        self.say = say
        self.use_existing = use_existing
        self.install = install
        self.detached = detached  # a dockerd of ours outlives this process (ZEPS_KEEP_CLUSTER=1)
        self.owned = False
        self.env: dict[str, str] = dict(os.environ)
        self._proc: subprocess.Popen[bytes] | None = None  # a dockerd this object started
        self._pid: int | None = None  # the dockerd of ours it stops: started, or adopted
        self._lock: int | None = None

    # -- paths of an engine of ours --------------------------------------------------------------
    @property
    def socket(self) -> Path:
        return self.root / "docker.sock"

    @property
    def exec_root(self) -> Path:
        return self.root / "exec"

    @property
    def data_root(self) -> Path:
        return self.root / "data"

    @property
    def log_path(self) -> Path:
        return self.root / "dockerd.log"

    # -- the CLI ---------------------------------------------------------------------------------
    def docker(
        self, *args: str, input: bytes | None = None, timeout: float = 600, check: bool = True
    ) -> subprocess.CompletedProcess[bytes]:
        """Run ``docker ARGS`` against this engine; a failure raises :class:`SetupError` with stderr."""
        result = subprocess.run(
            ["docker", *args], input=input, capture_output=True, env=self.env, timeout=timeout, check=False
        )
        if check and result.returncode != 0:
            err = result.stderr.decode(errors="replace").strip()
            raise SetupError(f"docker {' '.join(args[:3])} failed (exit {result.returncode}): {err}")
        return result

    def text(self, *args: str, timeout: float = 600) -> str:
        return self.docker(*args, timeout=timeout).stdout.decode().strip()

    def free_space(self) -> tuple[Path, int] | None:
        """The folder where this engine keeps its images and volumes (its data root: ours, or the
        one ``docker info`` names for an engine zeps did not start) and the bytes free on its file
        system; None if that folder is not on this machine (an engine elsewhere)."""
        root = self.data_root if self.owned else Path(self.text("info", "--format", "{{.DockerRootDir}}"))
        try:
            return root, shutil.disk_usage(root).free
        except OSError:
            return None

    def answers(self) -> bool:
        try:
            return self.docker("info", "--format", "{{.ServerVersion}}", timeout=20, check=False).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False

    # -- lifecycle -------------------------------------------------------------------------------
    def start(self) -> None:
        if shutil.which("docker") is None and not self._install_docker():
            raise SetupError(
                "no Docker engine and no apt-get to install one: install Docker Engine "
                "(Debian: apt-get install docker.io) or start one so that `docker info` answers"
            )
        if self.use_existing and self.answers():
            self.owned = False
            version = self.text("info", "--format", "{{.ServerVersion}}")
            self.say(f"docker: using the engine `docker info` answers (Docker {version}); zeps starts none")
            return
        self._start_own()

    def _install_docker(self) -> bool:
        if not self.install or shutil.which("apt-get") is None:
            return False
        self.say("docker: installing Debian's docker.io with apt-get")
        apt_install("docker.io", "iptables", log=self.root / "apt.log")
        return shutil.which("docker") is not None

    def _start_own(self) -> None:
        if shutil.which("dockerd") is None and not self._install_docker():
            raise SetupError(
                "no Docker engine answers and dockerd is not installed, and apt-get is not available: "
                "install Docker Engine (Debian: apt-get install docker.io)"
            )
        if shutil.which("dockerd") is None:
            raise SetupError("dockerd is still missing after installing docker.io; install Docker Engine by hand")
        self.root.mkdir(parents=True, exist_ok=True)
        self._take_lock()
        self.env = {**os.environ, "DOCKER_HOST": f"unix://{self.socket}"}
        leftover = self._leftover_pid()
        if leftover is not None and self.answers():
            self.say(f"docker: adopting the dockerd of zeps an earlier run kept (pid {leftover}; stopped at the end)")
            self._pid = leftover
            self.owned = True
            return
        self._stop_leftover()
        argv = [
            "dockerd",
            f"--host=unix://{self.socket}",
            f"--data-root={self.data_root}",
            f"--exec-root={self.exec_root}",
            f"--pidfile={self.root / 'dockerd.pid'}",
            "--bridge=none",
            "--iptables=false",
            "--ip6tables=false",
            "--ip-forward=false",
            "--ip-masq=false",
        ]
        missing = missing_capabilities()
        if missing:
            shim = self.root / "runc-shim"
            python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
            shim.write_text(SHIM.format(python=python, names=CAPABILITIES))
            shim.chmod(0o755)
            argv += [f"--add-runtime=zeps-runc={shim}", "--default-runtime=zeps-runc"]
            self.say(f"docker: the kernel's bounding set lacks {', '.join(missing)}: runtime shim {shim} drops them")
        self.say(f"docker: starting dockerd of zeps ({self.root}; log {self.log_path})")
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_normal_priority if self.detached else _term_with_parent,  # noqa: PLW1509 — SIGTERM: it stops its containers
            )
        self._pid = self._proc.pid
        self.owned = True

        def ready() -> bool:
            if self._proc is not None and self._proc.poll() is not None:
                raise SetupError(f"dockerd exited with code {self._proc.returncode}; see {self.log_path}")
            return self.answers()

        try:
            wait_until(ready, timeout=60, interval=0.25, what="dockerd to answer")
        except SetupError:
            self.stop()
            raise
        # containers an earlier engine of ours left (a run killed before its clean-up): kind's nodes
        # restart with the engine, and a forgotten cluster would take CPU from this run's
        left = self._remove_containers()
        if left:
            self.say(f"docker: removed {left} container(s) an earlier dockerd of zeps left behind")

    def _take_lock(self) -> None:
        fd = os.open(self.root / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise SetupError(
                f"another zeps run (pid {holder}) holds the Docker engine in {self.root}; "
                "wait for it to finish, or stop it"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        self._lock = fd

    def _own_processes(self) -> list[int]:
        """Processes whose command line names this engine's folder: our dockerd, its containerd, shims."""
        marker = str(self.root).encode()
        pids = []
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit() or int(entry.name) == os.getpid():
                continue
            with contextlib.suppress(OSError):
                if marker in (entry / "cmdline").read_bytes():
                    pids.append(int(entry.name))
        return pids

    def _remove_containers(self) -> int:
        """Remove every container of our engine, running or stopped, with its anonymous volumes;
        how many there were. Only ever called on an engine of ours: zeps made all of them."""
        containers = self.docker("ps", "-a", "-q", check=False).stdout.decode().split()
        if containers:
            self.docker("rm", "-f", "-v", *containers, check=False, timeout=300)
        return len(containers)

    def _remove_networks(self) -> list[str]:
        """Remove every container of our engine (zeps made them all: the engine is ours, with its
        own socket), running or stopped — a cluster a killed run or ZEPS_KEEP_CLUSTER left would
        otherwise be back with the next start, and keep its network in use — then its own bridge
        networks (kind's), so no host bridge outlives it, and volumes no container uses; the
        networks' host interface names (``br-<id>``) for a last check."""
        if not self.answers():
            return []
        self._remove_containers()
        listed = self.docker("network", "ls", "--filter", "driver=bridge", "--format", "{{.ID}} {{.Name}}", check=False)
        bridges = []
        for line in listed.stdout.decode().split("\n"):
            if not line.strip():
                continue
            network_id, name = line.split()
            bridges.append(f"br-{network_id[:12]}")
            self.docker("network", "rm", name, check=False)
        self.docker("volume", "prune", "-f", check=False)  # a node's /var volume that an interrupted kind left
        return bridges

    def running(self) -> bool:
        """Whether there is an engine to talk to without starting one: a dockerd of ours still
        running, or (unless told to run our own) the one ``docker info`` answers."""
        if self._leftover_pid() is not None:
            return True
        return self.use_existing and shutil.which("docker") is not None and self.answers()

    def _leftover_pid(self) -> int | None:
        """The pid of a dockerd of ours still running (its pidfile, and our folder in its command line)."""
        with contextlib.suppress(OSError, ValueError):
            pid = int((self.root / "dockerd.pid").read_text().strip())
            if str(self.root).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                return pid
        return None

    def _stop_leftover(self) -> None:
        pid = self._leftover_pid()
        if pid is not None:
            self.say(f"docker: stopping a dockerd of zeps left by an earlier run (pid {pid})")
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
            self._wait_gone(pid, 90)
        self._kill_strays()
        self._unmount_own()

    def _kill_strays(self) -> None:
        for pid in self._own_processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def _own_mounts(self) -> list[Path]:
        """Mount points inside this engine's folder (dockerd binds its data root onto itself, and a
        dockerd stopped hard leaves that mount and its overlays behind), deepest first."""
        marker = str(self.root) + "/"
        points = []
        with contextlib.suppress(OSError):
            for line in Path("/proc/self/mountinfo").read_text().splitlines():
                point = line.split()[4].replace("\\040", " ")
                if point.startswith(marker):
                    points.append(Path(point))
        return sorted(points, key=lambda p: len(p.parts), reverse=True)

    def _unmount_own(self) -> None:
        """Unmount what a stopped dockerd of ours left mounted in its own folder (nothing else)."""
        for point in self._own_mounts():
            subprocess.run(["umount", "--lazy", str(point)], capture_output=True, check=False)

    @staticmethod
    def _wait_gone(pid: int, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
            time.sleep(0.1)
        return False

    def stop(self) -> None:
        """Stop an engine of ours (its containers first); an engine we did not start is left alone."""
        pid = self._pid
        if pid is not None:
            bridges = self._remove_networks()
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)  # dockerd alone: it stops its containers, then its containerd
            if self._proc is not None:
                try:
                    self._proc.wait(90)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(pid, signal.SIGKILL)
                    self._proc.wait(10)
            elif not self._wait_gone(pid, 90):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self._proc = None
            self._pid = None
            self._kill_strays()  # a shim or containerd that outlived dockerd
            for bridge in bridges:  # a host interface of one of our networks that dockerd left
                if Path("/sys/class/net", bridge).exists():
                    subprocess.run(["ip", "link", "delete", bridge], capture_output=True, check=False)
            self._unmount_own()
            left = [str(p) for p in self._own_processes()] + [b for b in bridges if Path("/sys/class/net", b).exists()]
            left += [str(m) for m in self._own_mounts()]
            if left:
                raise SetupError(f"the dockerd of zeps left {', '.join(left)} behind")
            self.say("docker: dockerd of zeps stopped (no process, container or network of it left)")
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None


def image_exists(engine: DockerEngine, ref: str) -> bool:
    return engine.docker("image", "inspect", ref, "--format", "{{.Id}}", check=False).returncode == 0
