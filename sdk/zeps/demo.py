"""``make demo``: run zeps on an embedded default and show what happens.

Today it proves the foundation with a real round trip: start a local ZooKeeper server, write a
znode, watch it from a second session, see the change arrive, clean up, stop the server. The full
demo (operator, Topic/Queue/ZepsStream, broker and a Spark pipeline) replaces this as those parts land.
"""

from __future__ import annotations

import sys
import tempfile
import threading
import time
from pathlib import Path

from zeps.coordination import connect
from zeps.dev import ZooKeeperServer
from zeps.errors import ZepsError

__all__ = ["main"]


def _step(text: str) -> None:
    print(f"[demo] {text}", flush=True)


def run(workdir: Path) -> None:
    started = time.monotonic()
    _step("starting a local ZooKeeper server (127.0.0.1, pinned jars from the zeps cache)")
    with ZooKeeperServer(workdir / "zookeeper") as server:
        _step(f"ZooKeeper serving at {server.connect_string}")
        writer, watcher = connect(server.connect_string), connect(server.connect_string)
        try:
            path = "/zeps/demo/greeting"
            writer.create(path, b"hello", makepath=True)
            changed = threading.Event()
            seen: list[bytes] = []

            def on_change(data: bytes | None, _stat: object) -> None:
                if data is not None:
                    seen.append(data)
                    if data == b"hello, zeps":
                        changed.set()

            watcher.DataWatch(path, on_change)
            writer.set(path, b"hello, zeps")
            if not changed.wait(10):
                raise ZepsError("the watching session never saw the change")
            _step(f"watch delivered across sessions: {[s.decode() for s in seen]}")
            writer.delete("/zeps", recursive=True)
            _step("cleaned up /zeps")
        finally:
            for client in (writer, watcher):
                client.stop()
                client.close()
    _step(f"stopped ZooKeeper; round trip done in {time.monotonic() - started:.1f}s")
    _step("coming next: Topic broadcast, work Queue, ZepsStream broker, the operator and a Spark pipeline")


def main() -> int:
    try:
        with tempfile.TemporaryDirectory(prefix="zeps-demo-") as tmp:
            run(Path(tmp))
    except ZepsError as exc:
        print(f"demo failed: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("demo interrupted; everything it started was stopped", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
