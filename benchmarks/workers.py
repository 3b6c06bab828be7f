"""What the benchmarks share about their worker processes (each a script beside them that prints
``ready`` once set up and ``done <numbers…>`` at the end)."""

from __future__ import annotations

import subprocess


def finish(procs: list[subprocess.Popen[str]], timeout: float = 600) -> list[list[float]]:
    """Each worker's numbers from its ``done`` line, once it ends; SystemExit with its output if it
    printed something else."""
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=timeout)
        fields = out.split()
        if not fields or fields[0] != "done":
            raise SystemExit(f"worker failed: {out!r}")
        results.append([float(f) for f in fields[1:]])
    return results
