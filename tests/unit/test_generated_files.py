"""Generated files match their single source (CI fails on drift)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_readme_generated_blocks_are_current() -> None:
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gen_docs.py"), "--check"], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
