"""The kind tooling's own failure paths and its runtime shim, without a Docker engine: what a user
sees when something is missing or taken, and that the shim really drops what the kernel lacks.

(The tooling's behaviour with a real engine — an interrupted run, a cluster name or port already
taken in an engine zeps did not start — is tested on kind by ``make e2e``: e2e/kind/test_tooling.py.)
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from zeps.errors import SetupError
from zeps_dev.docker import CAPABILITIES, SHIM, missing_capabilities
from zeps_dev.kind import (
    CSI_DRIVER,
    EXPANDABLE_STORAGE,
    KindCluster,
    KindStack,
    _check_disk_for_nodes,
    _check_port_free,
    combined_exit_code,
    e2e_phases,
    expandable_storage,
    run_beside,
    serial_phase_passed_early,
)
from zeps_dev.process import wait_until

ROOT = Path(__file__).resolve().parents[2]


def test_missing_capabilities_reads_the_bounding_set(tmp_path: Path) -> None:
    status = tmp_path / "status"
    status.write_text("Name:\tx\nCapBnd:\t000001fffeffffff\n")  # what this project's VMs show
    assert missing_capabilities(status) == ["CAP_SYS_RESOURCE"]
    status.write_text("CapBnd:\t000001ffffffffff\n")
    assert missing_capabilities(status) == []


def _shim(tmp_path: Path, bounding: int) -> tuple[Path, Path]:
    """The shim as dockerd runs it, with a fake runc that records the spec it was handed."""
    shim = tmp_path / "runc-shim"
    text = SHIM.format(python=sys.executable, names=CAPABILITIES)
    # the shim reads its own bounding set; give it a fixed one for the test
    text = text.replace('open("/proc/self/status")', f"open({str(tmp_path / 'status')!r})")
    shim.write_text(text)
    shim.chmod(0o755)
    (tmp_path / "status").write_text(f"CapBnd:\t{bounding:016x}\n")
    fake = tmp_path / "bin"
    fake.mkdir()
    runc = fake / "runc"
    runc.write_text(f'#!/bin/sh\necho "$@" > {tmp_path}/runc-args\n')
    runc.chmod(0o755)
    return shim, fake


def test_the_runtime_shim_drops_missing_capabilities_then_runs_runc(tmp_path: Path) -> None:
    everything_but_sys_resource = ((1 << len(CAPABILITIES)) - 1) & ~(1 << CAPABILITIES.index("SYS_RESOURCE"))
    shim, fake = _shim(tmp_path, everything_but_sys_resource)
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    caps = ["CAP_CHOWN", "CAP_SYS_RESOURCE", "CAP_SYS_ADMIN"]
    spec = {"process": {"capabilities": {k: caps for k in ("bounding", "effective", "permitted")}}}
    (bundle / "config.json").write_text(json.dumps(spec))
    process = tmp_path / "process.json"
    process.write_text(json.dumps({"capabilities": {"bounding": caps}, "args": ["sh"]}))
    env = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}"}
    for argv in (["create", "--bundle", str(bundle), "id1"], ["exec", "--process", str(process), "id1"]):
        result = subprocess.run(
            [str(shim), "--root", "/x", *argv], env=env, capture_output=True, text=True, check=False
        )
        assert result.returncode == 0, result.stderr
        assert (tmp_path / "runc-args").read_text().split() == ["--root", "/x", *argv]  # runc got the same call
    kept = ["CAP_CHOWN", "CAP_SYS_ADMIN"]
    assert json.loads((bundle / "config.json").read_text())["process"]["capabilities"]["effective"] == kept
    assert json.loads(process.read_text())["capabilities"]["bounding"] == kept


def test_a_port_already_taken_is_named() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        with pytest.raises(SetupError, match=f"port {port} on 127.0.0.1 is taken"):
            _check_port_free(port)


def test_a_disk_too_small_for_the_nodes_volumes_is_named_before_kind_starts(tmp_path: Path) -> None:
    gb = 10**9
    _check_disk_for_nodes((tmp_path, 9 * gb), 2 * gb, 4, ours=True)  # 8 GB needed: enough
    _check_disk_for_nodes(None, 2 * gb, 4, ours=False)  # an engine elsewhere: not known, not checked
    for ours in (True, False):
        with pytest.raises(SetupError) as refused:
            _check_disk_for_nodes((tmp_path, 7 * gb), 2 * gb, 4, ours=ours)
        message = str(refused.value)
        assert f"7.0 GB free on the Docker engine's disk ({tmp_path})" in message
        assert "a cluster of 4 nodes needs at least 8.0 GB" in message
        # the folder of a dockerd of zeps can move; an engine zeps only uses is not its to move
        assert ("ZEPS_DOCKER_ROOT" in message) is ours


@pytest.mark.parametrize("command", ["e2e", "images", "base-images", "stack"])
def test_no_engine_and_no_apt_says_what_to_install_in_one_line(tmp_path: Path, command: str) -> None:
    """No docker, no dockerd, no apt-get on PATH: `make e2e`'s driver (and `make e2e-images`'s and
    `make e2e-stack`'s two steps) exits 3 with one line."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    env = {
        "PATH": str(bin_dir),
        "HOME": str(tmp_path),
        "ZEPS_CACHE_DIR": str(tmp_path / "cache"),
        "ZEPS_KINDBIN": str(tmp_path / "kindbin"),
        "ZEPS_ZOOKEEPER_HOME": os.environ.get("ZEPS_ZOOKEEPER_HOME", str(tmp_path)),
    }
    result = subprocess.run(
        [sys.executable, "-m", "zeps_dev.kind", command],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 3, result.stdout + result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("e2e:")]
    assert len(lines) == 1 and "apt-get install docker.io" in lines[0], result.stdout
    assert "Traceback" not in result.stdout + result.stderr


def test_each_node_gets_a_cni_config_for_its_own_pod_cidr_a_nat_rule_and_routes_to_the_others() -> None:
    """What ``wire_pod_network`` runs in the node containers (a recorder stands in for docker exec)."""
    from zeps_dev.kind import CNI_CONFIG, wire_pod_network  # noqa: PLC0415

    def node(name: str, cidr: str, ip: str) -> dict[str, object]:
        addresses = [{"type": "Hostname", "address": name}, {"type": "InternalIP", "address": ip}]
        return {"metadata": {"name": name}, "spec": {"podCIDR": cidr}, "status": {"addresses": addresses}}

    ran: list[tuple[str, list[str], bytes | None]] = []
    nodes = [node("cp", "10.244.0.0/24", "172.18.0.2"), node("w1", "10.244.1.0/24", "172.18.0.3"),
             node("w2", "10.244.2.0/24", "172.18.0.4")]  # fmt: skip
    wire_pod_network(nodes, lambda name, argv, data: ran.append((name, list(argv), data)))
    configs = {name: json.loads(data) for name, argv, data in ran if data is not None}
    assert {n: c["plugins"][0]["ipam"]["ranges"][0][0]["subnet"] for n, c in configs.items()} == {
        "cp": "10.244.0.0/24", "w1": "10.244.1.0/24", "w2": "10.244.2.0/24"}  # fmt: skip
    assert all(CNI_CONFIG in argv[-1] for _, argv, data in ran if data is not None)
    routes = sorted((name, argv[3], argv[5]) for name, argv, data in ran if argv[:3] == ["ip", "route", "replace"])
    assert routes == [
        ("cp", "10.244.1.0/24", "172.18.0.3"), ("cp", "10.244.2.0/24", "172.18.0.4"),
        ("w1", "10.244.0.0/24", "172.18.0.2"), ("w1", "10.244.2.0/24", "172.18.0.4"),
        ("w2", "10.244.0.0/24", "172.18.0.2"), ("w2", "10.244.1.0/24", "172.18.0.3"),
    ]  # fmt: skip
    # pod-to-pod traffic keeps the pod's address (a NetworkPolicy judges it); what leaves the pod
    # network is masqueraded by one rule per node, added only if missing (wired again after a restart)
    assert not any(c["plugins"][0]["ipMasq"] for c in configs.values())
    nat = {name: argv[-1] for name, argv, data in ran if data is None and "MASQUERADE" in argv[-1]}
    assert set(nat) == {"cp", "w1", "w2"}
    check, add = (shlex.split(part) for part in nat["w1"].split(" || "))
    assert check[:4] == ["iptables", "-t", "nat", "-C"] and add[:4] == ["iptables", "-t", "nat", "-A"]
    assert check[4:] == [*add[4:], "2>/dev/null"]
    assert add[4:10] == ["POSTROUTING", "-s", "10.244.1.0/24", "!", "-d", "10.244.0.0/16"]
    with pytest.raises(SetupError, match="w3 has no pod CIDR"):
        wire_pod_network([*nodes, node("w3", "", "172.18.0.5")], lambda *_: None)


def _collected(*args: str) -> set[str]:
    """The e2e tests ``pytest e2e`` selects on kind with ``args`` (collection only: no cluster needed)."""
    env = {**os.environ, "ZEPS_E2E_KUBECONFIG": "/nonexistent/kubeconfig"}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "e2e", "--co", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode in (0, 5), result.stdout + result.stderr
    return {line for line in result.stdout.splitlines() if "::" in line}


def test_the_e2e_phases_run_every_test_once_and_the_serial_ones_alone() -> None:
    everything = _collected()
    (_, shared), (_, serial) = e2e_phases([], lanes=1)
    in_shared, in_serial = _collected(*shared), _collected(*serial)
    assert in_shared | in_serial == everything and not in_shared & in_serial
    # what stops a node, removes the chart, scales the operator away or takes the ensemble's leader
    assert any("node_loss" in t for t in in_serial) and any("helm_uninstall" in t for t in in_serial)
    assert any("operator_away" in t for t in in_serial) and any("zookeeper_leader_pod" in t for t in in_serial)
    assert len(in_shared) > len(in_serial) > 0
    (_, two_lanes), _ = e2e_phases(["-k", "spark"], lanes=2)
    assert two_lanes == ["-m", "not serial", "-n", "2", "--dist", "worksteal", "-k", "spark"]


def test_make_e2e_counts_a_serial_phase_run_early_only_on_the_very_stack_and_suite_it_ran_on() -> None:
    """``make e2e-stack`` with ZEPS_E2E_SERIAL_EARLY=1 runs the serial phase on its stack beside
    ``make test``; ``make e2e`` skips it only when it adopted that stack, nothing it runs or tests
    changed since, and it was given no pytest arguments of its own."""
    identity = {"node_image": "zeps/kind-node:v1-abc", "images": ["zeps:0.1.0-1"], "workers": 3, "suite": "e2e1"}
    note = json.dumps({"identity": identity, "seconds": 700.0})
    assert serial_phase_passed_early(note, identity, [], adopted=True) == {"identity": identity, "seconds": 700.0}
    assert serial_phase_passed_early(None, identity, [], adopted=True) is None  # none ran (or it failed)
    assert serial_phase_passed_early(note, identity, [], adopted=False) is None  # a new cluster saw none of it
    assert serial_phase_passed_early(note, identity, ["-k", "faults"], adopted=True) is None
    for changed in ({"suite": "e2e2"}, {"images": ["zeps:0.1.0-2"]}, {"workers": 2}):
        assert serial_phase_passed_early(note, {**identity, **changed}, [], adopted=True) is None
    assert serial_phase_passed_early("{not json", identity, [], adopted=True) is None
    assert serial_phase_passed_early("[1]", identity, [], adopted=True) is None


def test_the_phases_exit_codes_combine_into_the_first_failure() -> None:
    assert combined_exit_code([0, 0]) == 0
    assert combined_exit_code([5, 0]) == 0  # a -k that selects from the serial phase only
    assert combined_exit_code([0, 5]) == 0
    assert combined_exit_code([5, 5]) == 5
    assert combined_exit_code([1, 0]) == 1
    assert combined_exit_code([0, 2]) == 2
    assert combined_exit_code([5, 1]) == 1


#: the shared phase's stand-in: blocks on a FIFO until the serial phase's stand-in opens it to write
#: (bounded by an alarm), says so, exits 0; had the phases run one after the other, the alarm would
#: end it with exit 2
WAITS_FOR_THE_OTHER = """
import signal, sys
signal.signal(signal.SIGALRM, lambda *_: sys.exit(2))
signal.alarm(60)
with open(sys.argv[1]) as fifo:
    fifo.read()
print("shared: saw the serial phase running", flush=True)
"""


def test_the_serial_phase_runs_beside_the_shared_one_its_output_after(tmp_path: Path, capfd: Any) -> None:
    """Two real processes: the first runs while the second is prepared and runs (it waits for the
    second to open a FIFO), each exit code is kept, the second's output comes after the first's."""
    fifo = tmp_path / "serial-running"
    os.mkfifo(fifo)
    serial = [sys.executable, "-c", "import sys; open(sys.argv[1], 'w').close(); print('serial: done'); sys.exit(1)",
              str(fifo)]  # fmt: skip
    timings: dict[str, float] = {}
    codes = run_beside([sys.executable, "-c", WAITS_FOR_THE_OTHER, str(fifo)], dict(os.environ),
                       prepare_second=lambda: dict(os.environ), second=serial, log=tmp_path / "serial.log",
                       timings=timings)  # fmt: skip
    assert codes == [0, 1]
    out = capfd.readouterr().out
    assert out.index("shared: saw the serial phase running") < out.index("serial: done")
    assert set(timings) == {"shared_tests_s", "serial_tests_s"}


def test_a_serial_cluster_that_cannot_be_made_fails_the_run_and_the_shared_phase_still_ends(tmp_path: Path) -> None:
    def cannot() -> dict[str, str]:
        raise SetupError("no room for a second cluster")

    shared = [sys.executable, "-c", "print('shared: done')"]
    codes = run_beside(
        shared, dict(os.environ), prepare_second=cannot, second=["false"], log=tmp_path / "log", timings={}
    )
    assert codes == [0, 3]
    assert combined_exit_code(codes) == 3


@pytest.mark.parametrize("sigint", ["as-in-a-terminal", "ignored-as-in-a-background-job"])
def test_an_interrupted_serial_phase_stops_the_shared_one_with_a_ctrl_c(tmp_path: Path, sigint: str) -> None:
    """Ctrl-C (or any error) while the serial cluster is made: the shared pytest gets SIGINT as a
    KeyboardInterrupt (its own teardown runs) and is gone before run_beside returns, also when make e2e
    was started in a shell's background (SIGINT ignored, and inherited so)."""
    pid_file, teardown = tmp_path / "pid", tmp_path / "teardown-ran"
    started = (
        "import os, pathlib, signal, sys; pathlib.Path(sys.argv[1]).write_text(str(os.getpid()))\n"
        "try:\n    signal.pause()\nexcept KeyboardInterrupt:\n    pathlib.Path(sys.argv[2]).touch()"
    )
    shared = [sys.executable, "-c", started, str(pid_file), str(teardown)]

    def interrupted() -> dict[str, str]:
        wait_until(pid_file.exists, timeout=30, what="the shared phase to start")
        raise KeyboardInterrupt

    before = signal.getsignal(signal.SIGINT)
    if sigint.startswith("ignored"):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with pytest.raises(KeyboardInterrupt):
            run_beside(
                shared, dict(os.environ), prepare_second=interrupted, second=["true"], log=tmp_path / "log", timings={}
            )
    finally:
        signal.signal(signal.SIGINT, before)
    assert not Path(f"/proc/{pid_file.read_text()}").exists(), "the shared phase still runs (or was never reaped)"
    assert teardown.exists(), "the shared phase was killed, not interrupted: its teardown did not run"


def test_the_serial_cluster_runs_its_stacks_images_in_its_engine_on_a_port_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The companion builds nothing (a source edited meanwhile would give it other images) and starts
    no engine of its own; a fixed ZEPS_KIND_API_PORT stays the suite's cluster's."""
    monkeypatch.setenv("ZEPS_KIND_API_PORT", "39999")
    monkeypatch.setenv("ZEPS_CACHE_DIR", str(tmp_path))
    stack = KindStack(
        binaries=tmp_path, zookeeper_home=tmp_path, venv_python=Path(sys.executable), spark=True, workers=3
    )
    stack.zeps_image, stack.zookeeper_image, stack.spark_image = "zeps:1", "zeps-zookeeper:2", "zeps-spark:3"
    stack.seaweedfs_image, stack.prometheus_image, stack.csi_image = (
        "zeps-seaweedfs:4",
        "zeps-prometheus:5",
        "zeps-csi:6",
    )
    stack.preloaded, stack.network_policy_image = ("zeps-zookeeper:2",), "zeps-kube-router:7"
    stack.cluster = KindCluster(stack.engine, name="zeps-e2e", node_image="zeps/kind-node:8", binaries=tmp_path,
                                workdir=tmp_path)  # fmt: skip
    companion = stack.companion()
    assert companion.engine is stack.engine and companion.shares_engine and not stack.shares_engine
    assert companion.cluster_name == "zeps-e2e-serial" and (stack.api_port, companion.api_port) == (39999, 0)
    assert companion.build_images() == "zeps/kind-node:8"
    assert (companion.zeps_image, companion.zookeeper_image, companion.spark_image) == (
        "zeps:1",
        "zeps-zookeeper:2",
        "",
    )
    assert (companion.preloaded, companion.network_policy_image) == (stack.preloaded, stack.network_policy_image)
    assert companion.workers == 3 and not companion.spark


def test_down_with_nothing_kept_starts_no_engine(tmp_path: Path) -> None:
    """CI calls ``down`` at its end whatever happened: with no dockerd of zeps running and no engine
    answering, it must not start one (a dockerd would be started only to be stopped)."""
    root, cache = tmp_path / "docker", tmp_path / "cache"
    note = cache / "kind" / "clusters" / "zeps-e2e" / "prepared.json"
    note.parent.mkdir(parents=True)
    note.write_text("{}")  # a note left by make e2e-stack whose engine is gone
    env = {  # this test's own cache and engine folder: a real prepared stack's note is not touched
        **os.environ,
        "ZEPS_CACHE_DIR": str(cache),
        "ZEPS_DOCKER_ROOT": str(root),
        "DOCKER_HOST": f"unix://{tmp_path}/nothing.sock",
        "ZEPS_KIND_CLUSTER": "zeps-e2e",
    }
    result = subprocess.run(
        [sys.executable, "-m", "zeps_dev.kind", "down"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "nothing to remove" in result.stdout
    assert not root.exists(), "down made an engine's folder: it started one"
    assert not note.exists(), "the note of a stack that no longer runs was left for make e2e"


def test_the_node_images_default_storage_class_is_the_csi_driver_zeps_dev_kind_installs() -> None:
    """kind installs images/kind-node/default-storage.yaml as the cluster's default StorageClass: its
    provisioner must be the driver expandable_storage runs (no other provisioner is in the node image,
    so a claim of another would never bind), binding a claim on the node its pod was placed on, and
    its volumes can grow, as those of the class the expansion tests name."""
    import yaml  # noqa: PLC0415

    (default,) = list(yaml.safe_load_all((ROOT / "images" / "kind-node" / "default-storage.yaml").read_text()))
    installed = {o["kind"]: o for o in expandable_storage("zeps-csi:test")}
    assert default["kind"] == "StorageClass" and default["metadata"]["name"] == "standard"
    assert default["metadata"]["annotations"]["storageclass.kubernetes.io/is-default-class"] == "true"
    assert default["provisioner"] == CSI_DRIVER == installed["CSIDriver"]["metadata"]["name"]
    expandable = installed["StorageClass"]
    assert expandable["metadata"]["name"] == EXPANDABLE_STORAGE != default["metadata"]["name"]
    for key in ("provisioner", "volumeBindingMode", "reclaimPolicy", "allowVolumeExpansion"):
        assert default[key] == expandable[key], key
    assert default["volumeBindingMode"] == "WaitForFirstConsumer"
