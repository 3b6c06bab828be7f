"""Joins a group in its own process and stays until killed (for crash tests). Writes ``ready``."""

from __future__ import annotations

import argparse
import signal
import sys

from zeps.coordination import Group, connect
from zeps.paths import GroupPaths


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts", required=True)
    parser.add_argument("--members", required=True, help="the group's members path")
    parser.add_argument("--member", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--session-timeout", type=float, default=10.0)
    args = parser.parse_args()
    client = connect(args.hosts, session_timeout=args.session_timeout)
    Group(client, GroupPaths(args.members)).join(args.member, {"pid": __import__("os").getpid()})
    with open(args.out, "a") as out:
        out.write("ready\n")
    signal.pause()  # a member holding its place until it is killed


if __name__ == "__main__":
    sys.exit(main())
