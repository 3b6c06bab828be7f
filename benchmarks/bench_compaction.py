"""make bench-compaction: what compacting a journal costs, and what it saves a reader that wants the
latest value per key.

For each key count K (default 1,000 and 10,000): N records (default 400,000; 100-byte bodies) over K
keys, a tenth of them deletes, into 8 MiB segments; then one compaction pass (timed; disk before and
after). The table load, reading the journal from its first sequence and keeping the latest value per
key, is timed on the compacted journal and on an uncompacted copy of it, in the same process and
page cache, alternating, median of 3: the ratio is the figure (goal: proportional to the records kept,
K plus the active segment, not to N). Journal-level: no broker, no socket. One JSON line last.

``ZEPS_BENCH_RECORDS`` and ``ZEPS_BENCH_KEYS`` (comma-separated) change N and the key counts.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import statistics
import tempfile
import time
from pathlib import Path

from zeps.journal import Journal, JournalConfig

RECORDS = int(os.environ.get("ZEPS_BENCH_RECORDS", "400000"))
KEY_COUNTS = [int(k) for k in os.environ.get("ZEPS_BENCH_KEYS", "1000,10000").split(",")]
BODY = b"v" * 100
ROUNDS = 3
CONFIG = JournalConfig(segment_bytes=8 << 20, fsync="never", cleanup="compact", min_cleanable_ratio=0.5)


def fill(directory: Path, keys: int) -> None:
    rng = random.Random(keys)
    journal = Journal(directory, CONFIG, name="bench").open()
    batch: list[tuple[str, bytes]] = []
    for _ in range(RECORDS):
        batch.append((f"key-{rng.randrange(keys):06d}", b"" if rng.random() < 0.1 else BODY))
        if len(batch) == 1000:
            journal.append_many(batch)
            batch = []
    journal.append_many(batch)
    journal.close()


def disk(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.iterdir())


def load_table(directory: Path) -> tuple[float, int, int]:
    """(seconds, records read, keys) to read the journal whole into the latest value per key."""
    journal = Journal(directory, CONFIG, name="bench").open()
    started = time.perf_counter()
    table: dict[str, bytes] = {}
    read, sequence = 0, journal.first_sequence
    while chunk := journal.read_chunk(sequence, max_bytes=1 << 20):
        for record in chunk.records():
            if record.body:
                table[record.key] = record.body
            else:
                table.pop(record.key, None)
        read += len(chunk)
        sequence = chunk.last + 1
    elapsed = time.perf_counter() - started
    journal.close()
    return elapsed, read, len(table)


def one(tmp: Path, keys: int) -> dict[str, object]:
    compacted, whole = tmp / f"compacted-{keys}", tmp / f"whole-{keys}"
    fill(compacted, keys)
    shutil.copytree(compacted, whole)
    before = disk(compacted)
    journal = Journal(compacted, CONFIG, name="bench").open()
    started = time.perf_counter()
    report = journal.compact(now_ms=int(time.time() * 1000))
    compact_s = time.perf_counter() - started
    journal.close()
    assert report is not None and report.segments, report
    loads: dict[str, list[float]] = {"compacted": [], "whole": []}
    counts: dict[str, tuple[int, int]] = {}
    for _ in range(ROUNDS):
        for name, directory in (("compacted", compacted), ("whole", whole)):
            seconds, read, table = load_table(directory)
            loads[name].append(seconds)
            counts[name] = (read, table)
    assert counts["compacted"][1] == counts["whole"][1], counts  # the same table either way
    load = {name: statistics.median(times) for name, times in loads.items()}
    result: dict[str, object] = {
        "keys": keys,
        "records": RECORDS,
        "compact_s": round(compact_s, 3),
        "compact_records_per_s": round(report.records / compact_s),
        "disk_before_bytes": before,
        "disk_after_bytes": disk(compacted),
        "records_read_compacted": counts["compacted"][0],
        "records_read_whole": counts["whole"][0],
        "load_compacted_s": round(load["compacted"], 4),
        "load_whole_s": round(load["whole"], 4),
        "load_ratio": round(load["compacted"] / load["whole"], 4),
        "records_ratio": round(counts["compacted"][0] / counts["whole"][0], 4),
    }
    print(f"[bench-compaction] {json.dumps(result)}", flush=True)
    shutil.rmtree(compacted)
    shutil.rmtree(whole)
    return result


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="zeps-bench-compaction-") as tmp:
        results = [one(Path(tmp), keys) for keys in KEY_COUNTS]
    print(json.dumps({"benchmark": "compaction", "records": RECORDS, "runs": results}))


if __name__ == "__main__":
    main()
