"""Images for ``make e2e``, built here from Debian packages and pinned Go modules — no registry.

What is built, each cached by a hash of what goes into it (an image whose tag exists is reused):

* Debian rootfs images (:data:`ROOTFS`): ``debootstrap --variant=minbase bookworm`` with a package
  list, then ``docker import``. The mirror is the machine's own apt source.
* the node-side component images kubeadm asks for (``kubeadm config images list``): kube-apiserver,
  kube-controller-manager, kube-scheduler, kube-proxy, etcd, CoreDNS, pause — binaries from
  ``tools/testbin/build.sh kind`` (pause: ``pause.c`` from the pinned Kubernetes module, gcc -static);
  and the node's NetworkPolicy add-on, kube-router (storage: zeps-csi-hostpath, :meth:`csi_image`).
* the kind node image (``images/kind-node/Dockerfile``): the node rootfs, kind's node files from the
  pinned kind module, kubelet/kubeadm/kubectl, the component images preloaded into containerd.
  Also kept as a ``docker save`` archive in the cache, so an engine without it loads it in seconds.
* the project's images: ``images/zeps/Dockerfile`` (operator, broker, SDK, CLI),
  ``images/zookeeper/Dockerfile`` (the chart's ensemble) and ``images/spark/Dockerfile`` (Spark's
  driver and executors with pyspark and zeps, and ``examples/spark``).

Every ``docker build`` runs with ``--network none``: nothing inside a build reaches any address.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from zeps.errors import SetupError
from zeps_dev.docker import DockerEngine, image_exists
from zeps_dev.process import apt_install, run_tool

__all__ = ["NETWORK_POLICY", "ROOTFS", "ImageBuilder", "Pins", "go_module_dir", "project_image_tag", "tree_hash"]

REPOSITORY = Path(__file__).resolve().parents[2]  # devtools/zeps_dev/images.py -> the checkout
TESTBIN_SOURCES = REPOSITORY / "tools" / "testbin"
IMAGES = REPOSITORY / "images"
SUITE = "bookworm"

# Debian rootfs images: name -> packages added to debootstrap's minbase. One place for each list.
# fmt: off
ROOTFS: Mapping[str, tuple[str, ...]] = {
    # kind's node: the packages of kind's base image, with Debian's containerd, runc and CNI plugins
    "node": (
        "systemd", "systemd-sysv", "dbus", "containerd", "runc", "containernetworking-plugins",
        "iproute2", "iptables", "nftables", "conntrack", "ethtool", "util-linux", "mount", "kmod",
        "libseccomp2", "pigz", "bash", "ca-certificates", "jq", "procps",
    ),
    # kube-proxy's; kube-router's too (a NetworkPolicy controller: it programs iptables and ipset
    # through their tools), which saves a debootstrap of its own
    "kube-proxy": ("iptables", "nftables", "conntrack", "ipset"),
    # libzmq5: Debian's libzmq (PGM and NORM), which the wheels' pyzmq is built against (_wheels);
    # venv and pip: the same rootfs is the project images' build stage (one debootstrap fewer)
    "python": ("python3", "python3-venv", "python3-pip", "ca-certificates", "libzmq5"),
    # Spark's driver and executors: the JVM, the Python that runs pyspark's workers, tini as PID 1;
    # ZooKeeper's image too (a JRE and bash: a second JRE rootfs cost a debootstrap of its own; openssl:
    # zookeeper-run turns a PKCS#1 key into the PKCS#8 ZooKeeper's PEM key store reads)
    "spark": ("python3", "openjdk-17-jre-headless", "tini", "bash", "procps", "ca-certificates", "libzmq5",
              "openssl"),
}
# fmt: on

# How each image kubeadm lists is made: the binary's name in the build output and the rootfs under it
# (None: FROM scratch, a static binary), and the entrypoint where kubeadm's manifests give no command.
_COMPONENTS: Mapping[str, tuple[str, str | None, str | None]] = {
    "kube-apiserver": ("kube-apiserver", None, None),
    "kube-controller-manager": ("kube-controller-manager", None, None),
    "kube-scheduler": ("kube-scheduler", None, None),
    "kube-proxy": ("kube-proxy", "kube-proxy", None),
    "etcd": ("etcd", None, None),
    "coredns": ("coredns", None, "/usr/local/bin/coredns"),
    "pause": ("pause", None, "/usr/local/bin/pause"),
    "kube-router": ("kube-router", "kube-proxy", "/usr/local/bin/kube-router"),
}
# What enforces NetworkPolicy on the nodes (the pod network zeps_dev.kind wires has no policy of its
# own): kube-router's firewall alone, as a DaemonSet zeps_dev.kind applies (network_policy_controller)
NETWORK_POLICY = "zeps.local/kube-router"


def _go_mod_version(module_dir: str, module: str) -> str:
    text = (TESTBIN_SOURCES / module_dir / "go.mod").read_text()
    match = re.search(rf"^(?:require\s+)?\s*{re.escape(module)}\s+(v\S+)", text, re.MULTILINE)
    if match is None:
        raise SetupError(f"tools/testbin/{module_dir}/go.mod does not require {module}")
    return match.group(1)


def _hash(*parts: str | bytes) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode() if isinstance(part, str) else part)
        digest.update(b"\0")
    return digest.hexdigest()[:12]


def tree_hash(root: Path) -> str:
    """12 hex digits of a hash of every file under ``root`` (names and contents; no ``__pycache__``)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def project_image_tag(*extra: str) -> str:
    """``<version>-<hash>``: the package version plus a hash of everything the zeps image holds."""
    version = re.search(r'^version = "([^"]+)"', (REPOSITORY / "pyproject.toml").read_text(), re.MULTILINE)
    if version is None:
        raise SetupError("pyproject.toml has no version")
    digest = hashlib.sha256()
    for rel in ("pyproject.toml", "constraints.txt", "sdk", "operator", "images/zeps"):
        path = REPOSITORY / rel
        files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        for f in files:
            if "__pycache__" in f.parts:
                continue
            digest.update(str(f.relative_to(REPOSITORY)).encode())
            digest.update(f.read_bytes())
    for part in extra:
        digest.update(part.encode())
    return f"{version.group(1)}-{digest.hexdigest()[:10]}"


@dataclass(frozen=True)
class Pins:
    """The versions the images are built from, read from the pinned Go modules (one source)."""

    kubernetes: str
    etcd: str
    coredns: str
    kind: str
    kube_router: str

    @classmethod
    def read(cls) -> Pins:
        return cls(
            kubernetes=_go_mod_version("k8s", "k8s.io/kubernetes"),
            etcd=_go_mod_version("etcd", "go.etcd.io/etcd/server/v3"),
            coredns=_go_mod_version("coredns", "github.com/coredns/coredns"),
            kind=_go_mod_version("kind", "sigs.k8s.io/kind"),
            kube_router=_go_mod_version("k8s", "github.com/cloudnativelabs/kube-router/v2"),
        )


class ImageBuilder:
    """Builds (or finds cached) every image ``make e2e`` needs, in ``engine``.

    ``binaries`` is the folder ``tools/testbin/build.sh kind`` printed; ``cache`` the zeps cache.
    """

    def __init__(
        self,
        engine: DockerEngine,
        *,
        binaries: Path,
        cache: Path,
        zookeeper_home: Path,
        say: Callable[[str], None] = lambda line: None,
    ) -> None:
        self.engine = engine
        self.binaries = binaries
        self.cache = cache / "kind"
        self.zookeeper_home = zookeeper_home
        self.say = say
        self.pins = Pins.read()

    # -- Debian rootfs ---------------------------------------------------------------------------
    def rootfs(self, name: str) -> str:
        packages = ROOTFS[name]
        tag = f"zeps-rootfs-{name}:{SUITE}-{_hash(SUITE, *packages)}"
        if image_exists(self.engine, tag):
            return tag
        if shutil.which("debootstrap") is None:
            self._apt_install("debootstrap")
        mirror = _debian_mirror()
        work = Path(tempfile.mkdtemp(prefix=f"rootfs-{name}-", dir=self._scratch()))
        debs = self.cache / "debs"
        debs.mkdir(parents=True, exist_ok=True)
        self.say(f"images: debootstrap {SUITE} minbase + {len(packages)} packages for {tag} (about 2 min)")
        log = self.cache / f"debootstrap-{name}.log"
        try:
            with log.open("wb") as out:
                result = subprocess.run(
                    [
                        "debootstrap",
                        "--variant=minbase",
                        f"--cache-dir={debs}",
                        f"--include={','.join(packages)}",
                        SUITE,
                        str(work / "root"),
                        mirror,
                    ],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    check=False,
                    timeout=1800,
                )
            if result.returncode != 0:
                raise SetupError(f"debootstrap for {tag} failed; see {log}")
            root = work / "root"
            for junk in ("var/cache/apt/archives", "var/lib/apt/lists", "usr/share/doc", "usr/share/man"):
                shutil.rmtree(root / junk, ignore_errors=True)
                (root / junk).mkdir(parents=True, exist_ok=True)
            tar = subprocess.Popen(["tar", "-C", str(root), "--numeric-owner", "-c", "."], stdout=subprocess.PIPE)
            imported = subprocess.run(
                ["docker", "import", "-", tag], stdin=tar.stdout, env=self.engine.env, capture_output=True, check=False
            )
            tar.wait()
            if imported.returncode != 0 or tar.returncode != 0:
                raise SetupError(f"docker import of {tag} failed: {imported.stderr.decode(errors='replace')}")
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return tag

    def _scratch(self) -> Path:
        path = self.cache / "tmp"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def _apt_install(self, *packages: str) -> None:
        self.say(f"images: installing Debian's {' '.join(packages)} with apt-get")
        apt_install(*packages, log=self.cache / "apt.log")

    # -- docker build ----------------------------------------------------------------------------
    def build(self, tag: str, context: Path, *, dockerfile: Path | str, args: Mapping[str, str] | None = None) -> None:
        """``docker build --network none`` of ``dockerfile`` (a path, or the text itself) in ``context``."""
        argv = ["build", "--network", "none", "--quiet", "-t", tag]
        for key, value in (args or {}).items():
            argv += ["--build-arg", f"{key}={value}"]
        text = None
        if isinstance(dockerfile, Path):
            argv += ["-f", str(dockerfile)]
        else:
            argv += ["-f", "-"]
            text = dockerfile.encode()
        argv.append(str(context))
        env = {**self.engine.env, "DOCKER_BUILDKIT": "0"}
        result = subprocess.run(["docker", *argv], input=text, env=env, capture_output=True, check=False, timeout=1800)
        if result.returncode != 0:
            out = (result.stdout + result.stderr).decode(errors="replace").strip().splitlines()
            raise SetupError(f"docker build of {tag} failed:\n" + "\n".join(out[-25:]))

    def forget_older(self, tag: str) -> None:
        """In a dockerd of zeps, remove the other tags of ``tag``'s repository and dangling layers: each
        change of the sources makes a new tag, and the cache must not grow with every run. (An
        engine zeps did not start is left as it is.)"""
        if not self.engine.owned:
            return
        repository = tag.rsplit(":", 1)[0]
        listed = self.engine.text("images", repository, "--format", "{{.Repository}}:{{.Tag}}").split()
        older = [ref for ref in listed if ref != tag]
        if older:
            self.engine.docker("rmi", *older, check=False)
        self.engine.docker("image", "prune", "-f", check=False)

    # -- the component images kubeadm asks for ---------------------------------------------------
    def kubeadm_images(self) -> list[str]:
        kubeadm = [str(self.binaries / "kubeadm"), "config", "images", "list"]
        listed = run_tool([*kubeadm, "--kubernetes-version", self.pins.kubernetes], timeout=60)
        images = [line.strip() for line in listed.splitlines() if line.strip()]
        self._check_pins(images)
        return images

    def _check_pins(self, images: Iterable[str]) -> None:
        for ref in images:
            name, tag = ref.rsplit("/", 1)[-1].split(":")
            pinned = {"etcd": self.pins.etcd, "coredns": self.pins.coredns}.get(name)
            if pinned is not None and not tag.startswith(pinned.lstrip("v")) and tag != pinned:
                module = "etcd" if name == "etcd" else "coredns"
                raise SetupError(
                    f"kubeadm {self.pins.kubernetes} deploys {ref}, but tools/testbin/{module}/go.mod pins "
                    f"{pinned}: bump the pin to the version kubeadm lists"
                )

    def node_images(self) -> list[str]:
        """What the node preloads: every image kubeadm lists (tagged as kubeadm names them) and the
        NetworkPolicy controller's."""
        return [*self.kubeadm_images(), self.network_policy_image]

    @property
    def network_policy_image(self) -> str:
        """The NetworkPolicy controller's image (kube-router), preloaded in the node image."""
        return f"{NETWORK_POLICY}:{self.pins.kube_router}"

    def component_images(self) -> list[str]:
        """Build every image of :meth:`node_images` that the engine lacks; return their refs."""
        refs = self.node_images()
        for ref in refs:
            if image_exists(self.engine, ref):
                continue
            name, tag = ref.rsplit("/", 1)[-1].split(":")
            if name not in _COMPONENTS:
                raise SetupError(f"kubeadm asks for {ref}, which zeps does not know how to build")
            binary_name, rootfs, entrypoint = _COMPONENTS[name]
            with tempfile.TemporaryDirectory(dir=self._scratch()) as tmp:
                context = Path(tmp)
                binary = context / binary_name
                if name == "pause":
                    self._compile_pause(tag, binary)
                else:
                    shutil.copy2(self.binaries / binary_name, binary)
                base = self.rootfs(rootfs) if rootfs else "scratch"
                lines = [f"FROM {base}", f"COPY {binary_name} /usr/local/bin/{binary_name}"]
                if entrypoint:
                    lines.append(f'ENTRYPOINT ["{entrypoint}"]')
                self.say(f"images: {ref} from {'pause.c' if name == 'pause' else binary_name} ({base})")
                self.build(ref, context, dockerfile="\n".join(lines) + "\n")
        return refs

    def _compile_pause(self, tag: str, out: Path) -> None:
        source = go_module_dir(TESTBIN_SOURCES / "k8s", "k8s.io/kubernetes") / "build" / "pause" / "linux" / "pause.c"
        if shutil.which("gcc") is None:
            self._apt_install("gcc", "libc6-dev")  # pause is a static C program
        run_tool(
            ["gcc", "-Os", "-static", "-Wall", "-Werror", f"-DVERSION={tag}", "-o", str(out), str(source)],
            hint=" (a static binary needs glibc's static library: apt-get install libc6-dev)",
        )

    # -- the kind node image ---------------------------------------------------------------------
    def node_image(self, preload: Sequence[str] = ()) -> str:
        """The node image's tag, built or loaded from its ``docker save`` archive when missing. Besides
        kubeadm's images it preloads ``preload``: images the engine has, whose tags are keyed by their
        contents (the pinned servers': ZooKeeper, SeaweedFS, Prometheus), so that ``kind load`` finds
        them on every node (it compares image IDs) instead of importing them into each one."""
        kind_files = go_module_dir(TESTBIN_SOURCES / "kind", "sigs.k8s.io/kind") / "images" / "base" / "files"
        kubeadm = self.node_images()
        components = [*kubeadm, *preload]
        binaries = [self.binaries / b for b in ("kubelet", "kubeadm", "kubectl")]
        key = _hash(
            self.pins.kubernetes,
            tree_hash(IMAGES / "kind-node"),
            tree_hash(kind_files),
            *ROOTFS["node"],
            *components,
            *(hashlib.sha256(b.read_bytes()).hexdigest() for b in binaries),
            *(self._component_key(ref) for ref in kubeadm),
        )
        tag = f"zeps/kind-node:{self.pins.kubernetes}-{key}"
        archive = self.cache / f"kind-node-{self.pins.kubernetes}-{key}.tar"
        if image_exists(self.engine, tag):
            self.say(f"images: node image {tag} (cached)")
            return tag
        if archive.exists():
            self.say(f"images: loading node image {tag} from {archive}")
            with archive.open("rb") as f:
                self.engine.docker("load", "-q", input=f.read())
            if image_exists(self.engine, tag):
                return tag
        refs = self.component_images()
        base = self.rootfs("node")
        self.say(f"images: building node image {tag}")
        with tempfile.TemporaryDirectory(dir=self._scratch()) as tmp:
            context = Path(tmp) / "context"
            shutil.copytree(IMAGES / "kind-node", context)
            shutil.copytree(kind_files, context / "kind-base")
            for path in (context / "kind-base").rglob("*"):
                path.chmod(0o755 if path.is_dir() or path.suffix == ".sh" or "bin" in path.parts else 0o644)
            (context / "bin").mkdir()
            for b in binaries:
                shutil.copy2(b, context / "bin" / b.name)
            (context / "version").write_text(self.pins.kubernetes + "\n")
            archive_tar = Path(tmp) / "images.tar"  # not in the build context: it is never a layer
            with archive_tar.open("wb") as out:
                saved = subprocess.run(["docker", "save", *refs, *preload], stdout=out, env=self.engine.env,
                                       check=False)  # fmt: skip
            if saved.returncode != 0:
                raise SetupError("docker save of the component images failed")
            stage = f"{tag}-stage"
            self.build(stage, context, dockerfile=context / "Dockerfile", args={"BASE": base})
            self._preload(stage, archive_tar, tag)
        self.forget_older(tag)
        self.say(f"images: saving {tag} to {archive} (a later run loads it in seconds)")
        for stale in self.cache.glob("kind-node-*.tar"):
            stale.unlink()
        partial = archive.with_suffix(".partial")
        self.engine.docker("save", "-o", str(partial), tag, timeout=900)
        partial.rename(archive)
        return tag

    def _preload(self, stage: str, archive_tar: Path, tag: str) -> None:
        """``tag`` = ``stage`` with the images of ``archive_tar`` in its containerd: run the node image's
        preload-images.sh with the archive bind-mounted (no network), commit, restore the entrypoint."""
        container = f"zeps-preload-{os.getpid()}"
        try:
            self.engine.docker(
                "run", "--name", container, "--network", "none", "--entrypoint", "/kind/bin/preload-images.sh",
                "-v", f"{archive_tar}:/kind/images.tar:ro", stage, "/kind/images.tar", timeout=900,
            )  # fmt: skip
            self.engine.docker(
                "commit", "--change", 'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]', "--change", "CMD []",
                container, tag,
            )  # fmt: skip
        finally:
            self.engine.docker("rm", "-f", container, check=False)
            self.engine.docker("rmi", stage, check=False)

    def _component_key(self, ref: str) -> str:
        name = ref.rsplit("/", 1)[-1].split(":", maxsplit=1)[0]
        binary_name, rootfs, _ = _COMPONENTS.get(name, (name, None, None))
        path = self.binaries / binary_name
        content = path.read_bytes() if path.exists() else name.encode()
        return _hash(ref, content, *(ROOTFS[rootfs] if rootfs else ()))

    # -- the project's images --------------------------------------------------------------------
    def _cached(self, tag: str, *, building: str) -> bool:
        """Whether the engine has ``tag`` already; says which it is."""
        if image_exists(self.engine, tag):
            self.say(f"images: {tag} (cached)")
            return True
        self.say(f"images: building {tag} ({building})")
        return False

    def zeps_image(self, venv_python: Path) -> str:
        """``zeps:<version>-<hash>`` from images/zeps/Dockerfile, wheels made here with pip."""
        tag = f"zeps:{project_image_tag()}"
        if self._cached(tag, building="wheels with pip, then images/zeps/Dockerfile"):
            return tag
        with tempfile.TemporaryDirectory(dir=self._scratch()) as tmp:
            context = Path(tmp)
            self._wheels(venv_python, "operator,s3", context / "wheels")
            self.build(
                tag,
                context,
                dockerfile=IMAGES / "zeps" / "Dockerfile",
                args={"BUILD_BASE": self.rootfs("python"), "RUNTIME_BASE": self.rootfs("python")},
            )
        self.forget_older(tag)
        return tag

    def _wheels(self, venv_python: Path, extras: str, into: Path) -> None:
        """The zeps wheel with ``extras`` and every dependency, at the versions of constraints.txt;
        pyzmq built here against Debian's libzmq (PGM and NORM for the multicast output; the images
        carry libzmq5 and no compiler), as ``make setup`` builds it for .venv. The dependencies' wheels
        come from the wheelhouse ``tools/setup.sh python`` made (``ZEPS_WHEELHOUSE``), offline; only the
        zeps wheel is built."""
        pip = [str(venv_python), "-m", "pip", "wheel", "-q", "--disable-pip-version-check"]
        wheelhouse = os.environ.get("ZEPS_WHEELHOUSE", "")
        if wheelhouse and (Path(wheelhouse) / ".complete").exists():
            pip += ["--no-index", "--find-links", wheelhouse]  # its pyzmq is the one built here
        else:
            pip += ["--no-binary", "pyzmq"]
        constraints = str(REPOSITORY / "constraints.txt")
        run_tool([*pip, "-c", constraints, "-w", str(into), f"{REPOSITORY}[{extras}]"], timeout=1200)

    def spark_image(self, venv_python: Path) -> str:
        """``zeps-spark:<version>-<hash>`` from images/spark/Dockerfile: a JRE 17, Python 3.11 with pyspark
        and zeps, tini, the entrypoint for Spark's roles, and examples/spark."""
        examples = REPOSITORY / "examples" / "spark"
        tag = f"zeps-spark:{project_image_tag(tree_hash(IMAGES / 'spark'), tree_hash(examples), *ROOTFS['spark'])}"
        if self._cached(tag, building="wheels with pip (pyspark is large), then images/spark/Dockerfile"):
            return tag
        with tempfile.TemporaryDirectory(dir=self._scratch()) as tmp:
            context = Path(tmp)
            self._wheels(venv_python, "spark,kubernetes,s3", context / "wheels")
            shutil.copy2(IMAGES / "spark" / "zeps-spark-entrypoint", context / "zeps-spark-entrypoint")
            shutil.copytree(examples, context / "spark", ignore=shutil.ignore_patterns("__pycache__"))
            self.build(
                tag,
                context,
                dockerfile=IMAGES / "spark" / "Dockerfile",
                args={"BUILD_BASE": self.rootfs("python"), "RUNTIME_BASE": self.rootfs("spark")},
            )
        self.forget_older(tag)
        return tag

    def seaweedfs_image(self) -> str:
        """``zeps-seaweedfs:<key>``: SeaweedFS's weed (from the pinned module, built by ``tools/testbin/build.sh
        kind``) on the Debian Python rootfs (a shell and /tmp, where weed puts its local sockets): the S3
        server the e2e suite runs in a pod for the s3:// batch store."""
        weed = (self.binaries / "weed").resolve()
        if not weed.exists():
            raise SetupError(f"{self.binaries} has no weed; run `tools/setup.sh kind` again")
        # the build folder's name carries the hash of the module's pins (tools/testbin/build.sh)
        return self._binary_image("zeps-seaweedfs", weed, pin=weed.parent.name, user=10001,
                                  building="weed on the Debian Python rootfs")  # fmt: skip

    def prometheus_image(self) -> str:
        """``zeps-prometheus:<hash>``: the Prometheus server of Debian's ``prometheus`` package
        (unpacked beside promtool by ``tools/setup.sh promtool``: ``$ZEPS_PROMTOOL``'s folder) on the
        Debian Python rootfs: the server the e2e suite runs in a pod to scrape zeps and evaluate its
        alert rules."""
        promtool = os.environ.get("ZEPS_PROMTOOL", "")
        server = Path(promtool).parent / "prometheus" if promtool else None
        if server is None or not server.exists():
            raise SetupError("no Prometheus server beside $ZEPS_PROMTOOL; run `tools/setup.sh promtool` (make setup)")
        # the unpacked package's folder is named by its Debian version (tools/setup.sh)
        version = server.parents[3].name.removeprefix("prometheus-")
        return self._binary_image("zeps-prometheus", server, pin=version, user=65534,
                                  building="Debian's prometheus on the Debian Python rootfs")  # fmt: skip

    def csi_image(self) -> str:
        """``zeps-csi:<key>``: the expandable StorageClass's CSI driver (zeps-csi-hostpath) and its
        sidecars, external-provisioner and external-resizer, built from the pinned module by
        ``tools/testbin/build.sh kind``, on the Debian Python rootfs; run as root (the driver mounts
        volumes on the node: zeps_dev.kind.expandable_storage)."""
        names = ("zeps-csi-hostpath", "csi-provisioner", "csi-resizer")
        binaries = [(self.binaries / n).resolve() for n in names]
        if not all(b.exists() for b in binaries):
            raise SetupError(f"{self.binaries} lacks one of {', '.join(names)}; run `tools/setup.sh kind` again")
        return self._binary_image("zeps-csi", *binaries, pin=binaries[0].parent.name, user=0,
                                  building="the CSI driver and its sidecars on the Debian Python rootfs")  # fmt: skip

    def _binary_image(self, repository: str, *binaries: Path, pin: str, user: int, building: str) -> str:
        """``<repository>:<hash of pin and the rootfs>``: programs (the first one the entrypoint, run
        as ``user``) on the Debian Python rootfs, built once per pin."""
        tag = f"{repository}:{_hash(pin, *ROOTFS['python'])}"
        if self._cached(tag, building=building):
            return tag
        with tempfile.TemporaryDirectory(dir=self._scratch()) as tmp:
            context = Path(tmp)
            lines = [f"FROM {self.rootfs('python')}"]
            for binary in binaries:
                shutil.copy2(binary, context / binary.name)
                lines.append(f"COPY {binary.name} /usr/local/bin/{binary.name}")
            lines += [f"USER {user}", f'ENTRYPOINT ["/usr/local/bin/{binaries[0].name}"]']
            self.build(tag, context, dockerfile="\n".join(lines) + "\n")
        self.forget_older(tag)
        return tag

    def zookeeper_image(self) -> str:
        """``zeps-zookeeper:<version>-<hash>``: a JRE, the pinned jars and images/zookeeper's launcher."""
        jars = sorted((self.zookeeper_home / "lib").glob("*.jar"))
        version = next((j.stem.split("-", 1)[1] for j in jars if re.fullmatch(r"zookeeper-\d[\d.]*", j.stem)), None)
        if version is None:
            raise SetupError(f"no zookeeper-<version>.jar in {self.zookeeper_home / 'lib'}")
        key = _hash(tree_hash(IMAGES / "zookeeper"), *(j.name for j in jars), *ROOTFS["spark"])
        tag = f"zeps-zookeeper:{version}-{key}"
        if self._cached(tag, building="images/zookeeper/Dockerfile"):
            return tag
        with tempfile.TemporaryDirectory(dir=self._scratch()) as tmp:
            context = Path(tmp)
            shutil.copytree(IMAGES / "zookeeper", context, dirs_exist_ok=True)
            (context / "lib").mkdir()
            for jar in jars:
                shutil.copy2(jar, context / "lib" / jar.name)
            self.build(tag, context, dockerfile=context / "Dockerfile", args={"JAVA_BASE": self.rootfs("spark")})
        self.forget_older(tag)
        return tag


def go_module_dir(module_dir: Path, module: str) -> Path:
    """Where the Go module cache holds ``module`` at the version ``module_dir``'s go.mod pins."""
    env = {**os.environ, "GOFLAGS": "-mod=readonly", "GOSUMDB": "off"}
    folder = json.loads(run_tool(["go", "list", "-m", "-json", module], cwd=module_dir, env=env)).get("Dir")
    if not folder:  # pinned, but not downloaded yet
        run_tool(["go", "mod", "download", module], cwd=module_dir, env=env, timeout=900)
        folder = json.loads(run_tool(["go", "list", "-m", "-json", module], cwd=module_dir, env=env)).get("Dir")
    if not folder:
        raise SetupError(f"{module} is not in the Go module cache; run tools/testbin/build.sh kind")
    return Path(folder)


def _debian_mirror() -> str:
    """The Debian mirror this machine's apt uses (deb822 or one-line sources), for debootstrap."""
    override = os.environ.get("ZEPS_DEBIAN_MIRROR")
    if override:
        return override
    sources = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    for path in sources:
        try:
            text = path.read_text()
        except OSError:
            continue
        if path.suffix == ".sources":
            for block in text.split("\n\n"):
                uris = re.search(r"^URIs:\s*(\S+)", block, re.MULTILINE)
                suites = re.search(r"^Suites:\s*(.+)$", block, re.MULTILINE)
                if uris and suites and SUITE in suites.group(1).split() and "security" not in uris.group(1):
                    return uris.group(1)
        else:
            for line in text.splitlines():
                parts = line.split()
                if len(parts) >= 3 and parts[0] == "deb" and parts[2] == SUITE:
                    return parts[1]
    raise SetupError(
        f"found no Debian {SUITE} mirror in /etc/apt/sources.list(.d); "
        "set ZEPS_DEBIAN_MIRROR to one (debootstrap uses it)"
    )
