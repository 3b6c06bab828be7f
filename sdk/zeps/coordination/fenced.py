"""Nodes only the newest leader may change: the children of one node, written by the holder of a
fencing node for the highest epoch (a tiered stream's manifest: :mod:`zeps.tiering`).

:meth:`FencedNodes.claim` writes the caller's epoch into the fencing node, never over a higher one
(a node out of shape counts as the lowest: anyone may have written it). Every later change is a
transaction that checks the fencing node's version first, so a writer whose epoch was overtaken has
each write refused with :class:`FencedError`, however late its request arrives: the fencing token of
a lease, with ZooKeeper's version as the token.
"""

from __future__ import annotations

import json
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import BadVersionError, NodeExistsError, NoNodeError

from zeps import _json
from zeps.coordination._util import commit, failures, zookeeper_errors
from zeps.errors import CoordinationError

__all__ = ["FencedError", "FencedNodes", "list_children", "read_children", "read_nodes"]


#: reads sent before their answers are awaited (a manifest of 10,000 nodes read in ten round trips,
#: not 10,000)
PIPELINE = 1000


class FencedError(CoordinationError):
    """A newer epoch holds the fencing node: this writer must stop writing."""


@zookeeper_errors
def _read(_: object, client: KazooClient, parent: str, limit: int) -> list[tuple[str, bytes]]:
    try:
        names = sorted(client.get_children(parent))[:limit]
    except NoNodeError:
        return []
    return _read_nodes(None, client, parent, names)


@zookeeper_errors
def _read_nodes(_: object, client: KazooClient, parent: str, names: list[str]) -> list[tuple[str, bytes]]:
    out = []
    for start in range(0, len(names), PIPELINE):  # the reads of a batch in flight together: one round trip
        batch = names[start : start + PIPELINE]
        for name, pending in [(name, client.get_async(f"{parent}/{name}")) for name in batch]:
            try:
                data, _stat = pending.get()
            except NoNodeError:
                continue  # removed since the listing
            out.append((name, bytes(data)))
    return out


def read_children(client: KazooClient, parent: str, *, limit: int) -> list[tuple[str, bytes]]:
    """(name, data) of the first ``limit`` children of ``parent`` by name ([] if it does not exist)."""
    return _read(None, client, parent, limit)


def read_nodes(client: KazooClient, parent: str, names: list[str]) -> list[tuple[str, bytes]]:
    """(name, data) of those children of ``parent`` that exist, in the order of ``names``."""
    return _read_nodes(None, client, parent, names)


@zookeeper_errors
def _list(_: object, client: KazooClient, parent: str) -> tuple[list[str], int]:
    try:
        names, stat = client.get_children(parent, include_data=True)
    except NoNodeError:
        return [], -1
    return names, stat.cversion


def list_children(client: KazooClient, parent: str) -> tuple[list[str], int]:
    """``parent``'s children and its child version (one more with each child made or removed; -1 and
    none if it does not exist)."""
    return _list(None, client, parent)


class FencedNodes:
    """The children of ``parent``, changed only while ``fence`` holds ``epoch`` (or a lower one)."""

    def __init__(self, client: KazooClient, parent: str, fence: str, *, epoch: int, acl: list[Any] | None = None
                 ) -> None:  # fmt: skip
        self.client, self.parent, self.fence, self.epoch, self.acl = client, parent, fence, epoch, acl
        self._version: int | None = None  #: the fencing node's version as claimed

    @zookeeper_errors
    def claim(self) -> None:
        """Hold the fencing node for this epoch (FencedError if a newer epoch holds it)."""
        self.client.ensure_path(self.parent, acl=self.acl)
        mine = json.dumps({"epoch": self.epoch}).encode()
        for _ in range(8):  # another writer's claim in between: look again (bounded: each is a newer state)
            try:
                data, stat = self.client.get(self.fence)
            except NoNodeError:
                try:
                    self.client.create(self.fence, mine, acl=self.acl, makepath=True)
                except NodeExistsError:
                    continue
                self._version = 0
                return
            held = _epoch(data)
            if held > self.epoch:
                self._version = None
                raise FencedError(f"{self.fence} holds epoch {held}, newer than {self.epoch}")
            if held == self.epoch:
                self._version = stat.version
                return
            try:
                self._version = self.client.set(self.fence, mine, version=stat.version).version
            except BadVersionError:
                continue
            return
        raise CoordinationError(f"{self.fence}: changed by others eight times while it was claimed")

    def create(self, name: str, data: bytes) -> None:
        self._write(("create", f"{self.parent}/{name}", data, {"acl": self.acl}), f"creating {name}")

    def set(self, name: str, data: bytes) -> None:
        self._write(("set", f"{self.parent}/{name}", data, -1), f"writing {name}")

    def delete(self, name: str) -> None:
        """Remove a child (already gone: nothing to do)."""
        self._write(("delete", f"{self.parent}/{name}", -1), f"removing {name}")

    def read(self, *, limit: int) -> list[tuple[str, bytes]]:
        return read_children(self.client, self.parent, limit=limit)

    @zookeeper_errors
    def _write(self, op: tuple[Any, ...], what: str) -> None:
        if self._version is None:
            self.claim()
        outcome = commit(self.client, [("check", self.fence, self._version), op])
        errors = failures(outcome)
        if not errors:
            return
        if isinstance(outcome[0], BadVersionError):
            self._version = None
            raise FencedError(f"{what}: {self.fence} was claimed by a newer epoch than {self.epoch}")
        if isinstance(errors[0], NoNodeError) and op[0] == "delete":
            return  # gone already: what the delete wanted
        raise CoordinationError(f"{what} under {self.parent}: {errors[0]!r}")


def _epoch(data: bytes) -> int:
    """The epoch a fencing node holds (-1 if it is out of shape)."""
    try:
        held = _json.loads(data, max_bytes=256)["epoch"]
    except (ValueError, KeyError, TypeError):
        return -1
    return held if type(held) is int else -1
