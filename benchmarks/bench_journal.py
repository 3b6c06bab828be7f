"""make bench-journal: how a stream's start-up grows with what it retains.

Two journals of full 64 MiB segments (the default size; 200-byte records, about 290,000 a segment):
one with 1 segment, one with 20. Both are opened 5 times each, alternating, and the medians compared:
opening reads the active (last) segment whole, since its tail may be torn, and only the seal of each
closed one, so the goal is a ratio of at most 1.5. The baseline is what opening cost before seals: the
20-segment journal with its seals removed is read whole (and sealed again) on each of 3 opens.
The page cache holds the files in every case (they were just written): this measures the broker's
work, not the disk's. One JSON line last.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

from zeps.journal import Journal, JournalConfig

SEGMENT = 64 << 20
BODY = b"x" * 170  # a 200-byte record with its key and header
ROUNDS = 5
CONFIG = JournalConfig(segment_bytes=SEGMENT, fsync="never")


def fill(directory: Path, segments: int) -> int:
    """Append records until ``segments`` segments are full; the number of records."""
    journal = Journal(directory, CONFIG, name="bench").open()
    batch = [(f"k{i % 100:03d}", BODY) for i in range(4096)]
    while len(list(directory.glob("*.log"))) <= segments:
        journal.append_many(batch)
    count = journal.written
    journal.close()
    logs = sorted(directory.glob("*.log"))  # the last segment just begun: drop it, so the last is full
    for suffix in (".log", ".off", ".idx", ".seal"):
        logs[-1].with_suffix(suffix).unlink(missing_ok=True)
    logs[-2].with_suffix(".seal").unlink()  # the last full one is the active segment again: no seal
    return count


def open_seconds(directory: Path) -> float:
    started = time.perf_counter()
    journal = Journal(directory, CONFIG, name="bench").open()
    elapsed = time.perf_counter() - started
    journal.close()
    return elapsed


def main() -> None:
    with tempfile.TemporaryDirectory(prefix="zeps-bench-journal-") as tmp:
        one, twenty = Path(tmp) / "one", Path(tmp) / "twenty"
        print("[bench-journal] writing 1 and 20 full 64 MiB segments (about 1.3 GB)", flush=True)
        fill(one, 1)
        records = fill(twenty, 20)
        times: dict[str, list[float]] = {"one": [], "twenty": []}
        for _ in range(ROUNDS):
            times["one"].append(open_seconds(one))
            times["twenty"].append(open_seconds(twenty))
        unsealed = []
        for _ in range(3):
            for seal in twenty.glob("*.seal"):
                seal.unlink()
            unsealed.append(open_seconds(twenty))
    one_s, twenty_s, unsealed_s = (statistics.median(times["one"]), statistics.median(times["twenty"]),
                                   statistics.median(unsealed))  # fmt: skip
    print(f"[bench-journal] open: 1 segment {one_s:.3f} s, 20 segments {twenty_s:.3f} s "
          f"(ratio {twenty_s / one_s:.2f}; goal <= 1.5); 20 unsealed, read whole {unsealed_s:.3f} s "
          f"(ratio {unsealed_s / one_s:.2f})", flush=True)  # fmt: skip
    print(json.dumps({
        "benchmark": "journal-startup", "segment_bytes": SEGMENT, "records_in_20": records,
        "open_1_segment_s": round(one_s, 4), "open_20_segments_s": round(twenty_s, 4),
        "ratio_20_to_1": round(twenty_s / one_s, 3), "goal_ratio": 1.5,
        "open_20_unsealed_s": round(unsealed_s, 4), "unsealed_ratio_20_to_1": round(unsealed_s / one_s, 3),
    }))  # fmt: skip


if __name__ == "__main__":
    main()
