"""`make demo` end to end (its entry point, zeps_dev.demo.run) and `zeps dev up|down`.

Both start a stack of their own — ZooKeeper, a control plane, the chart, the operator — beside the
session's, and stop it; the Spark pipeline runs as a subprocess (local[2]), as the demo runs it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from harness import TEST_JVM_OPTIONS
from zeps.errors import SetupError
from zeps_dev.controlplane import binaries_dir
from zeps_dev.demo import run
from zeps_dev.process import interruptible_module, pid_running, wait_until

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "demo"))
from orders_pipeline import COUNTRIES, expected  # type: ignore[import-not-found]

ZEPS = str(Path(sys.executable).parent / "zeps")


def _processes_mentioning(text: str) -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmdline and int(pid) != os.getpid():
            found.append(cmdline)
    return found


def _spark_jvm_under(text: str) -> int | None:
    """The pid of a Spark JVM (SparkSubmit) whose parent's command line mentions ``text``, if one runs."""
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if b"org.apache.spark.deploy.SparkSubmit" not in Path(f"/proc/{pid}/cmdline").read_bytes():
                continue
            parent = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1]
            if text.encode() in Path(f"/proc/{parent}/cmdline").read_bytes():
                return int(pid)
        except (OSError, IndexError):
            continue
    return None


@pytest.fixture(autouse=True)
def _jvms_at_c1(monkeypatch: pytest.MonkeyPatch) -> None:
    """The demo's JVMs (its ZooKeeper server, the Spark job) as it starts them, at C1 like every JVM of
    the tests (``harness.TEST_JVM_OPTIONS``, through the JVM's own variable); ``make demo`` keeps Java's
    defaults."""
    monkeypatch.setenv("JAVA_TOOL_OPTIONS", TEST_JVM_OPTIONS)


#: the demo starts a whole stack of its own and a Spark job (71 s on an idle machine): on a loaded one
#: it ran past the suite's 300 s, slow and not hung (the timeout fired while its stack stopped)
@pytest.mark.timeout(600)
def test_demo_summary_is_consistent_and_everything_stops(tmp_path: Path) -> None:
    lines: list[str] = []
    summary = run(tmp_path / "demo", orders=3000, links=60, invalidations=12, subscribers=3, workers=3,
                  progress=lines.append)  # fmt: skip
    assert summary.problems() == [], summary.table()
    by_primitive = {line.primitive: line for line in summary.lines}
    assert by_primitive["Topic"].published == 12 and by_primitive["Topic"].delivered == 36
    assert by_primitive["Queue"].published == by_primitive["Queue"].delivered == 60
    assert by_primitive["Queue"].lag == 0
    assert by_primitive["ZepsStream"].published == by_primitive["ZepsStream"].delivered == 3000
    want = {c: {"orders": n, "revenue": round(r, 2)} for c, (n, r) in expected(3000).items()}
    assert summary.spark["countries"] == want and set(want) == set(COUNTRIES)
    assert summary.resources == {"Topic/cache-invalidation": "True", "Queue/crawl-links": "True",
                                 "ZepsStream/orders": "True"}  # fmt: skip
    assert "consistent: every message delivered" in summary.table()
    assert any("pod template" in line for line in lines) and any("kubectl apply -f examples/" in line for line in lines)
    assert _processes_mentioning(str(tmp_path / "demo")) == [], "the demo left servers running"
    assert _processes_mentioning("zeps-demo-orders") == [], "the demo left the Spark job's JVM running"


def test_zeps_dev_up_and_down(tmp_path: Path) -> None:
    workdir = tmp_path / "dev"
    env = {**os.environ, "ZEPS_TESTBIN": str(binaries_dir())}
    up = subprocess.Popen([ZEPS, "--json", "dev", "up", "--workdir", str(workdir)], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=env)  # fmt: skip
    try:
        assert up.stdout is not None
        started = json.loads(up.stdout.readline())
        stack_env = started["env"]
        crds = subprocess.run(
            [str(binaries_dir() / "kubectl"), f"--kubeconfig={stack_env['KUBECONFIG']}", "get", "crd", "-o", "name"],
            capture_output=True, text=True, check=True, timeout=60,
        ).stdout  # fmt: skip
        assert "zepsstreams.zeps.dev" in crds
        zk = KazooClient(hosts=stack_env["ZEPS_ZOOKEEPER"], timeout=10)
        zk.start(timeout=10)
        zk.stop()
        zk.close()
        again = subprocess.run([ZEPS, "dev", "up", "--workdir", str(workdir)], capture_output=True, text=True,
                               env=env, timeout=60, check=False)  # fmt: skip
        assert again.returncode == 3 and "already running" in again.stderr
        down = subprocess.run([ZEPS, "dev", "down", "--workdir", str(workdir)], capture_output=True, text=True,
                              env=env, timeout=120, check=False)  # fmt: skip
        assert down.returncode == 0 and "stopped the local stack" in down.stdout, down.stderr
        assert up.wait(60) == 0
        assert _processes_mentioning(str(workdir)) == []
        none = subprocess.run([ZEPS, "dev", "down", "--workdir", str(workdir)], capture_output=True, text=True,
                              env=env, timeout=60, check=False)  # fmt: skip
        assert none.returncode == 1 and "no local stack is running" in none.stdout
    finally:
        if up.poll() is None:
            up.kill()
            up.wait(30)


def test_ctrl_c_stops_everything_the_demo_started(tmp_path: Path) -> None:
    """Ctrl-C reaches the demo's whole process group (as a terminal sends it) while the Spark job
    runs: the demo says so, exits 130 and leaves no server behind (its workdir is under TMPDIR)."""
    env = {**os.environ, "TMPDIR": str(tmp_path), "ZEPS_TESTBIN": str(binaries_dir())}
    env.pop("CLUSTER", None)
    # SIGINT at its default, as a terminal's shell leaves it, wherever the suite was started from
    demo = subprocess.Popen(interruptible_module("zeps_dev.demo"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, start_new_session=True)  # fmt: skip
    try:
        assert demo.stdout is not None
        seen = []
        for line in demo.stdout:  # bounded: the demo prints a dozen progress lines, then a summary
            seen.append(line)
            if "Spark: publishing" in line:
                break
        if not any("Spark: publishing" in line for line in seen):
            pytest.fail("the demo ended early:\n" + "".join(seen) + (demo.stderr.read() if demo.stderr else ""))
        # Ctrl-C once the Spark job's JVM runs (its driver's command line names the demo's workdir)
        seen_jvm: list[int] = []

        def jvm_runs() -> bool:
            if demo.poll() is not None:
                raise SetupError("the demo ended before its Spark job's JVM was seen")
            seen_jvm[:] = [pid for pid in [_spark_jvm_under(str(tmp_path))] if pid is not None]
            return bool(seen_jvm)

        wait_until(jvm_runs, timeout=120, interval=0.05, what="the demo's Spark job's JVM")
        jvm = seen_jvm[0]
        os.killpg(demo.pid, signal.SIGINT)
        _, err = demo.communicate(timeout=120)
        assert demo.returncode == 130, err[-2000:]
        assert "demo interrupted; everything it started was stopped" in err
        assert _processes_mentioning(str(tmp_path)) == [], "Ctrl-C left servers running"
        # killed with its process group; reaped by init
        wait_until(lambda: not pid_running(jvm), timeout=10, interval=0.05,
                   what="the Spark job's JVM gone after Ctrl-C")  # fmt: skip
    finally:
        if demo.poll() is None:
            os.killpg(demo.pid, signal.SIGKILL)
            demo.wait(30)
