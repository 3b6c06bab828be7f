"""``zeps dev up|down``: the local stack as a command, attached to the ``zeps`` CLI when this checkout's
tooling is importable (:func:`zeps.cli._attach_dev_commands`)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

import click

from zeps.cli_common import EXIT_EMPTY, emit, reporting_errors
from zeps.errors import ConfigError, ZepsError
from zeps_dev.process import pid_running

__all__ = ["dev"]


def _dev_state(workdir: str | None) -> Any:
    xdg = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    cache = Path(os.environ.get("ZEPS_CACHE_DIR") or Path(xdg) / "zeps")  # as tools/setup.sh
    folder = Path(workdir) if workdir else cache / "dev"
    folder.mkdir(parents=True, exist_ok=True)
    return folder, folder / "stack.json"


@click.group()
def dev() -> None:
    """The local stack: ZooKeeper, a Kubernetes control plane, the chart and the operator."""


@dev.command("up")
@click.option("--workdir", default=None, help="Where the stack keeps its state (default: the zeps cache's dev/).")
@click.pass_context
@reporting_errors
def dev_up(ctx: click.Context, workdir: str | None) -> None:
    """Start the local stack and keep it running until Ctrl-C or `zeps dev down`."""
    from zeps_dev.stack import LocalStack  # noqa: PLC0415 (imported when used: `zeps` starts fast)

    folder, state = _dev_state(workdir)
    if state.exists():
        pid = json.loads(state.read_text())["pid"]
        if pid_running(pid):
            raise ConfigError(f"a local stack is already running (pid {pid}); `zeps dev down` stops it")
        state.unlink()
    shutil.rmtree(folder / "stack", ignore_errors=True)  # a fresh stack each time: no stale data
    stopping = False

    def stop(_signum: int, _frame: Any) -> None:
        nonlocal stopping
        stopping = True
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)

    def say(text: str) -> None:
        if not ctx.obj["json"]:
            click.echo(f"[dev] {text}", err=True)

    stack = LocalStack(folder / "stack", namespace=ctx.obj["namespace"] or "default", progress=say)
    try:
        stack.start()
        env = stack.env()
        state.write_text(json.dumps({"pid": os.getpid(), "env": env}))
        exports = "\n".join(f"export {k}={v}" for k, v in env.items())
        emit(ctx, f"{exports}\n# the stack runs until Ctrl-C or `zeps dev down`", {"pid": os.getpid(), "env": env})
        sys.stdout.flush()
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        say("stopping the local stack")
        stack.stop()
        state.unlink(missing_ok=True)
    if not stopping:
        say("stopped")


@dev.command("down")
@click.option("--workdir", default=None, help="The stack's state folder (as given to `zeps dev up`).")
@click.option("--timeout", default=60.0, show_default=True, help="Seconds to wait for the stack to stop.")
@click.pass_context
@reporting_errors
def dev_down(ctx: click.Context, workdir: str | None, timeout: float) -> None:
    """Stop the local stack started by `zeps dev up`."""

    _, state = _dev_state(workdir)
    if not state.exists():
        emit(ctx, "no local stack is running", {"stopped": False})
        sys.exit(EXIT_EMPTY)
    pid = json.loads(state.read_text())["pid"]
    if pid_running(pid):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while pid_running(pid):
            if time.monotonic() > deadline:
                raise ZepsError(f"the local stack (pid {pid}) did not stop within {timeout:.0f}s")
            time.sleep(0.2)
    state.unlink(missing_ok=True)
    emit(ctx, f"stopped the local stack (pid {pid})", {"stopped": True, "pid": pid})
