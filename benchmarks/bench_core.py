"""make bench-core: the broker's own work per publish frame, plain against idempotent, no sockets.

``BrokerCore`` (the broker without its ZeroMQ adapter) is fed 100,000 ready-made frames in rounds of
2,000, each round followed by the journal write and routing the broker's loop does (``flush_appends``,
``pump``; fsync=never, so the disk is not measured). Four cases: one-message PUBLISH against
PUBLISH-SEQ (an idempotent producer), and 1,000-message PUBLISH-BATCH against PUBLISH-BATCH-SEQ.
Plain and idempotent runs alternate, 9 times each; medians and their ratios (idempotent / plain) are
printed, one JSON line last. This isolates what ``make bench-stream`` cannot see through its noise.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

from zeps.broker.core import BrokerConfig, BrokerCore
from zeps.journal import JournalConfig
from zeps.protocol import Attach, Produce, Publish, encode, encode_publish_batch, encode_publish_seq

MESSAGES, ROUND, BATCH, REPEATS = 100_000, 2_000, 1_000, 9
BODY = b"x" * 100


def _frames(idempotent: bool, batched: bool) -> list[bytes]:
    if batched:
        return [encode_publish_batch([("k", BODY)] * BATCH, 1 + i * BATCH if idempotent else None)
                for i in range(MESSAGES // BATCH)]  # fmt: skip
    if idempotent:
        return [encode_publish_seq(i + 1, "k", BODY) for i in range(MESSAGES)]
    plain = encode(Publish(key="k", body=BODY))
    return [plain] * MESSAGES


def run(idempotent: bool, batched: bool) -> float:
    """Messages per second through one BrokerCore."""
    with tempfile.TemporaryDirectory(prefix="zeps-bench-core-") as tmp:
        core = BrokerCore(BrokerConfig(Path(tmp), ("s",), journal=JournalConfig(fsync="never"))).open()
        core.receive(b"p", encode(Attach(stream="s", version=6)), now=0.0)
        if idempotent:
            core.receive(b"p", encode(Produce(producer="bench")), now=0.0)
        core.flush_appends()
        core.pump(now=0.0)
        frames = _frames(idempotent, batched)
        start = time.perf_counter()
        for i in range(0, len(frames), ROUND):
            for frame in frames[i : i + ROUND]:
                core.receive(b"p", frame, now=0.0)
            core.flush_appends()
            core.pump(now=0.0)
        elapsed = time.perf_counter() - start
        if core.streams["s"].journal.written != MESSAGES:
            raise SystemExit(f"journal holds {core.streams['s'].journal.written} records, not {MESSAGES}")
        core.close()
    return MESSAGES / elapsed


def main() -> None:
    result: dict[str, float] = {}
    for batched, name in ((False, "single"), (True, "batch")):
        samples: dict[bool, list[float]] = {False: [], True: []}
        for _ in range(REPEATS):
            for idempotent in (False, True):
                samples[idempotent].append(run(idempotent, batched))
        plain, idem = statistics.median(samples[False]), statistics.median(samples[True])
        result[f"{name}_plain_per_s"] = round(plain)
        result[f"{name}_idempotent_per_s"] = round(idem)
        result[f"{name}_idempotent_vs_plain"] = round(idem / plain, 3)
    print(json.dumps({"scenario": "broker-core", **result}))


if __name__ == "__main__":
    main()
