"""make bench-stages: where one message's publish->deliver time goes, stage by stage (issue 33).

One publish per message at 1,000 msgs/s for 5 s (``ZEPS_BENCH_RATE``), the blocking client in this
process, one zeps subscriber process (``stream_worker.py --stamps``: each message's send time from
its body and its arrival in the application), and one broker (``fsync: group``, the default)
whose loop is timed by hooks wrapped around its methods: when its read of the socket began and
ended, when the journal write, the fsync and the routing were done (and how long the fsync took),
when the deliveries were handed to ZeroMQ. The hooks wrap Python methods, so the broker runs the
pure-Python modules (a compiled class cannot be wrapped) and the hooks' own cost is in its figures:
its stages are an upper bound of the compiled broker's; the clients are compiled when ``make setup``
built them. Stages (µs, p50/p90/p99 over the messages):

* ``to_broker``: the publisher's stamp to the start of the broker's read (the client's publish,
  ZeroMQ's two threads, the broker's wake-up);
* ``read``: the broker's read and decode; ``write_sync_route``: the journal write, the fsync
  (``fsync`` alone) and the routing; ``send``: the delivery frames handed to ZeroMQ;
* ``to_application``: from there to the subscriber's application holding the message.

Prints one JSON line last.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench_stream import _pace, _stamped
from workers import finish
from zeps.client import StreamClient
from zeps_dev.process import free_port

HERE = Path(__file__).parent
RATE = int(os.environ.get("ZEPS_BENCH_RATE", "1000"))
SECONDS = 5
_STAMP = re.compile(rb"(1\d{18})x")  # _stamped(): time.time_ns() then 'x' padding


def install_hooks(out: str) -> None:
    """In the broker's process, before it starts: time each loop turn that handled a stamped message,
    and write one row per message to ``out`` when the process exits."""
    from zeps.broker import core, server  # noqa: PLC0415
    from zeps.journal import log  # noqa: PLC0415

    rows: list[tuple[int, ...]] = []
    turn: dict[str, Any] = {}
    receive, read, flush, sync, send = (core.BrokerCore.receive, server.BrokerServer._read,
                                        core.BrokerCore.flush_appends, log.Journal.sync,
                                        server.BrokerServer._send)  # fmt: skip

    def timed_receive(self: Any, peer: bytes, frame: bytes, now: float | None = None) -> None:
        if found := _STAMP.search(frame):
            turn.setdefault("stamps", []).append(int(found.group(1)))
        receive(self, peer, frame, now)

    def timed_read(self: Any, sock: Any) -> bool:
        turn.clear()
        turn["read"] = time.time_ns()
        drained = read(self, sock)
        turn["read_end"] = time.time_ns()
        return drained

    def timed_flush(self: Any, *, idle: bool = True) -> None:
        flush(self, idle=idle)
        turn["flushed"] = time.time_ns()

    def timed_sync(self: Any) -> None:
        began = time.time_ns()
        sync(self)
        turn["fsync"] = turn.get("fsync", 0) + time.time_ns() - began

    def timed_send(self: Any, outgoing: list[Any]) -> None:
        send(self, outgoing)
        if outgoing and turn.get("stamps") and "flushed" in turn and "sent" not in turn:
            turn["sent"] = time.time_ns()
            rows.extend((s, turn["read"], turn["read_end"], turn["flushed"], turn["sent"], turn.get("fsync", 0))
                        for s in turn["stamps"])  # fmt: skip

    core.BrokerCore.receive, server.BrokerServer._read = timed_receive, timed_read  # type: ignore[method-assign]
    core.BrokerCore.flush_appends, log.Journal.sync = timed_flush, timed_sync  # type: ignore[method-assign]
    server.BrokerServer._send = timed_send  # type: ignore[method-assign]

    def write() -> None:
        with open(out, "w") as f:
            f.writelines("\t".join(map(str, row)) + "\n" for row in rows)

    atexit.register(write)


def _quantiles(values: list[float]) -> dict[str, float]:
    q = statistics.quantiles(values, n=100, method="inclusive")
    return {"p50": round(q[49], 1), "p90": round(q[89], 1), "p99": round(q[98], 1)}


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="zeps-bench-stages-") as name:
        tmp = Path(name)
        endpoint, rows_file, stamps_file = f"tcp://127.0.0.1:{free_port()}", tmp / "broker.tsv", tmp / "sub.tsv"
        boot = (f"import sys; sys.path.insert(0, {str(HERE)!r}); import bench_stages; "
                f"bench_stages.install_hooks({str(rows_file)!r}); from zeps.broker.main import main; "
                f"sys.exit(main(['--stream', 'bench', '--data-dir', {str(tmp / 'journal')!r}, '--bind', "
                f"{endpoint!r}, '--fsync', 'group', '--log-level', 'WARNING']))")  # fmt: skip
        env = {k: v for k, v in os.environ.items() if k != "ZEPS_COMPILED"}
        broker = subprocess.Popen([sys.executable, "-c", boot], stdout=subprocess.PIPE, text=True, env=env)
        try:
            assert broker.stdout is not None and "serving" in broker.stdout.readline()
            count = RATE * SECONDS
            sub = subprocess.Popen([sys.executable, str(HERE / "stream_worker.py"), "zeps", "--endpoint", endpoint,
                                    "--count", str(count), "--stamps", str(stamps_file)], stdout=subprocess.PIPE,
                                   text=True)  # fmt: skip
            assert sub.stdout is not None and sub.stdout.readline().strip() == "ready"
            with StreamClient(endpoint, "bench", idempotent=False) as client:
                start = time.time()
                for i in range(count):
                    _pace(start, i, RATE)
                    client.publish("bench.k", _stamped())
                client.flush(timeout=60)
            finish([sub])
        finally:
            broker.terminate()
            broker.wait(30)
        arrived = dict(tuple(map(int, line.split())) for line in stamps_file.read_text().splitlines())
        rows = [tuple(map(int, line.split())) for line in rows_file.read_text().splitlines()]
    rows = [r for r in rows if r[0] in arrived]
    us = 1e-3
    stages = {
        "to_broker": [(r[1] - r[0]) * us for r in rows],
        "read": [(r[2] - r[1]) * us for r in rows],
        "write_sync_route": [(r[3] - r[2]) * us for r in rows],
        "fsync": [r[5] * us for r in rows],
        "send": [(r[4] - r[3]) * us for r in rows],
        "to_application": [(arrived[r[0]] - r[4]) * us for r in rows],
        "end_to_end": [(arrived[r[0]] - r[0]) * us for r in rows],
    }
    print(json.dumps({"scenario": "stages", "rate": RATE, "messages": len(rows),
                      **{f"{stage}_us": _quantiles(values) for stage, values in stages.items()}}))  # fmt: skip


if __name__ == "__main__":
    main()
