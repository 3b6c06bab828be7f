"""``zeps dev``: in a checkout it is there (from devtools/zeps_dev); where the developer tooling is
not installed (the wheel, the image) it is a one-line error that says where it lives, not a
traceback. The second case is made by dropping devtools/ from ``sys.path`` before zeps is imported,
which is what a wheel install looks like to Python."""

from __future__ import annotations

import subprocess
import sys

from zeps.errors import EXIT_CONFIG

_RUN = """
import sys
if {hide}:
    sys.path[:] = [p for p in sys.path if not p.rstrip("/").endswith("devtools")]
from zeps.cli import main
sys.argv = ["zeps", *sys.argv[1:]]
main()
"""


def _zeps(*args: str, hide_tooling: bool) -> subprocess.CompletedProcess[str]:
    code = _RUN.format(hide=hide_tooling)
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=60, check=False)


def test_zeps_dev_is_there_in_a_checkout() -> None:
    result = _zeps("dev", "--help", hide_tooling=False)
    assert result.returncode == 0, result.stderr
    assert "up" in result.stdout and "down" in result.stdout


def test_zeps_dev_without_the_tooling_says_where_it_lives() -> None:
    result = _zeps("dev", "up", "--workdir", "/nonexistent", hide_tooling=True)
    assert result.returncode == EXIT_CONFIG
    assert "source checkout" in result.stderr and "make setup" in result.stderr
    assert "Traceback" not in result.stderr
    other = _zeps("--help", hide_tooling=True)  # the rest of the CLI does not need the tooling
    assert other.returncode == 0 and "topic" in other.stdout
