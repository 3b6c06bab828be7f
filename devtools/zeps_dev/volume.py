"""A small volume that can be filled up: a size-limited tmpfs that only the processes started through
it see (a mount namespace of its own), for the faults a full disk brings.

::

    with PrivateVolume(tmp / "r2", size=32 << 20) as volume:
        proc = subprocess.Popen(volume.wrap([python, "-m", "zeps.broker.main", "--data-dir", str(tmp / "r2"), ...]))
        volume.fill()        # every byte left taken: the next write gets ENOSPC from the kernel
        volume.free()        # the space back
        volume.path(tmp / "r2" / "prices")   # the same files, reached from this process

``disk=True`` makes it a small ext4 file system on a loop device instead (a file beside
``mount_point``), which :meth:`slow` throttles: the writes of the processes started through it are
held to a few per second by the kernel's block I/O throttling (cgroup v1 ``blkio``), as a failing or
overloaded disk holds them; :meth:`fast` lifts it.

A process holds the namespace (``unshare --mount --propagation private sleep``); the tmpfs is mounted
in it over ``mount_point`` (a directory of this machine, left as it was), and processes started with
:meth:`wrap` enter it (``nsenter --mount``), so they keep their data across restarts for as long as
the volume lives. Nothing is mounted in this process's namespace: when the holder ends (``stop()``,
at exit, or with this process: it dies with its parent), the namespace and the tmpfs go with it.

Needs root (CAP_SYS_ADMIN) and util-linux's ``unshare`` and ``nsenter``; :func:`available` says why not
(and :func:`available_disk`, for ``disk=True``: ``mkfs.ext4``, loop devices, the ``blkio`` cgroup).
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

from zeps.errors import SetupError
from zeps_dev.process import die_with_parent

__all__ = ["PrivateVolume", "available", "available_disk"]

_FILL = ".zeps-fill"
BLKIO = Path("/sys/fs/cgroup/blkio")  # cgroup v1's block I/O controller (its throttling rules)


def available() -> str | None:
    """None if a volume can be made here, else why not (a sentence naming the fix)."""
    if os.geteuid() != 0:
        return "a private tmpfs needs root (CAP_SYS_ADMIN); run the disk-fault tests as root"
    for tool in ("unshare", "nsenter"):
        if shutil.which(tool) is None:
            return f"{tool} is missing: apt-get install util-linux"
    return None


def available_disk() -> str | None:
    """None if a throttled disk (``disk=True``) can be made here, else why not."""
    if (why := available()) is not None:
        return why
    for tool in ("mkfs.ext4", "losetup"):
        if shutil.which(tool) is None:
            return f"{tool} is missing: apt-get install e2fsprogs util-linux"
    if not (BLKIO / "blkio.throttle.write_iops_device").exists():
        return f"no cgroup v1 blkio controller at {BLKIO} to throttle a disk with (cgroup v2's io.max is not used here)"
    if not Path("/dev/loop-control").exists():
        return "no /dev/loop-control: loop devices are not available"
    return None


class PrivateVolume:
    """A tmpfs of ``size`` bytes over ``mount_point`` (``disk=True``: an ext4 file system on a loop
    device, which can be slowed), seen by the processes :meth:`wrap` starts."""

    def __init__(self, mount_point: Path, *, size: int, disk: bool = False) -> None:
        self.mount_point, self.size, self.disk = mount_point.resolve(), size, disk
        self.image = self.mount_point.with_name(f".{self.mount_point.name}.img")  # disk=True: its backing file
        self.cgroup = BLKIO / f"zeps-volume-{os.getpid()}-{id(self):x}"  # disk=True: its processes' I/O rules
        self._holder: subprocess.Popen[bytes] | None = None

    def start(self) -> Self:
        why = available_disk() if self.disk else available()
        if why is not None:
            raise SetupError(why)
        self.mount_point.mkdir(parents=True, exist_ok=True)
        self._holder = subprocess.Popen(  # the holder dies with this process
            ["unshare", "--mount", "--propagation", "private", "sleep", "infinity"],
            preexec_fn=die_with_parent,  # noqa: PLW1509 — set before any thread of the child exists
        )
        atexit.register(self.stop)
        mine = os.readlink("/proc/self/ns/mnt")
        deadline = time.monotonic() + 10
        while os.readlink(f"/proc/{self._holder.pid}/ns/mnt") == mine:  # until unshare has made the namespace
            if self._holder.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise SetupError(f"unshare --mount did not make a mount namespace (exit {self._holder.returncode})")
            time.sleep(0.01)
        if self.disk:  # a loop mount clears its device once unmounted: when the namespace goes
            self._disk_image()
            mount = ["mount", "-o", "loop", str(self.image), str(self.mount_point)]
        else:
            mount = ["mount", "-t", "tmpfs", "-o", f"size={self.size}", "zeps-volume", str(self.mount_point)]
        result = subprocess.run(["nsenter", "-t", str(self._holder.pid), "--mount", "--", *mount],
                                capture_output=True, text=True, check=False, timeout=30)  # fmt: skip
        if result.returncode:
            self.stop()
            raise SetupError(f"mounting {mount[-2]} over {self.mount_point} failed: {result.stderr.strip()}")
        return self

    def _disk_image(self) -> None:
        with self.image.open("wb") as image:
            image.truncate(self.size)
        made = subprocess.run(["mkfs.ext4", "-q", "-F", str(self.image)], capture_output=True, text=True, check=False)
        if made.returncode:
            self.stop()
            raise SetupError(f"mkfs.ext4 {self.image} failed: {made.stderr.strip()}")
        self.cgroup.mkdir(exist_ok=True)

    def _device(self) -> str:
        """The loop device's ``major:minor`` (the throttling rules name it)."""
        listed = subprocess.run(["losetup", "-j", str(self.image)], capture_output=True, text=True, check=False)
        device = listed.stdout.split(":", 1)[0].strip()
        if not device:
            raise SetupError(f"no loop device holds {self.image}: {listed.stderr.strip()}")
        rdev = os.stat(device).st_rdev
        return f"{os.major(rdev)}:{os.minor(rdev)}"

    def slow(self, *, writes_per_s: int = 10, bytes_per_s: int = 64 << 10) -> None:
        """``disk=True``: the processes :meth:`wrap` started write to it at most ``writes_per_s`` times
        and ``bytes_per_s`` a second (their reads are left alone), until :meth:`fast`."""
        device = self._device()
        (self.cgroup / "blkio.throttle.write_iops_device").write_text(f"{device} {writes_per_s}\n")
        (self.cgroup / "blkio.throttle.write_bps_device").write_text(f"{device} {bytes_per_s}\n")

    def fast(self) -> None:
        """The throttling :meth:`slow` set, lifted (a rule of 0 removes it); nothing to do once the
        volume is gone."""
        if self._holder is None or not self.cgroup.exists():
            return
        device = self._device()
        for rule in ("blkio.throttle.write_iops_device", "blkio.throttle.write_bps_device"):
            (self.cgroup / rule).write_text(f"{device} 0\n")

    @property
    def pid(self) -> int:
        if self._holder is None:
            raise SetupError("the volume is not started")
        return self._holder.pid

    def wrap(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run in the volume's namespace (it sees the tmpfs at ``mount_point``); with
        ``disk=True``, in the volume's blkio cgroup too (whose rules :meth:`slow` sets)."""
        if self.disk:  # joins the cgroup, then becomes argv (same pid: the caller's process is the program)
            join = f'echo $$ > {self.cgroup / "cgroup.procs"} && exec "$@"'
            return ["nsenter", "-t", str(self.pid), "--mount", "--", "sh", "-c", join, "sh", *argv]
        return ["nsenter", "-t", str(self.pid), "--mount", "--", *argv]

    def path(self, inside: Path) -> Path:
        """A path under ``mount_point`` as this process reaches it (through the holder's root)."""
        return Path(f"/proc/{self.pid}/root") / inside.resolve().relative_to("/")

    def fill(self) -> int:
        """Take every byte left (a file of them, allocated a chunk at a time, down to a page, while
        whatever runs on the volume goes on writing): returns how many were taken."""
        fd = os.open(self.path(self.mount_point) / _FILL, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        taken, chunk = 0, 1 << 20
        try:
            while chunk >= 4096:
                try:
                    os.posix_fallocate(fd, os.fstat(fd).st_size, chunk)
                    taken += chunk
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    chunk //= 16  # 1 MiB, 64 KiB, 4 KiB: then the volume is full to its last page
        finally:
            os.close(fd)
        return taken

    def free(self) -> None:
        """The space :meth:`fill` took, back."""
        (self.path(self.mount_point) / _FILL).unlink(missing_ok=True)

    def stop(self) -> None:
        holder, self._holder = self._holder, None
        if holder is not None and holder.poll() is None:
            holder.kill()
            holder.wait(10)
        if self.disk:
            self._remove_cgroup()
            self.image.unlink(missing_ok=True)
        atexit.unregister(self.stop)

    def _remove_cgroup(self) -> None:
        """The cgroup goes; a process of it still running goes back to the root cgroup first."""
        if not self.cgroup.exists():
            return
        with contextlib.suppress(OSError):
            for pid in (self.cgroup / "cgroup.procs").read_text().split():
                (BLKIO / "cgroup.procs").write_text(pid)
        for _ in range(50):
            try:
                self.cgroup.rmdir()
                return
            except OSError:
                time.sleep(0.1)  # a process just leaving

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
