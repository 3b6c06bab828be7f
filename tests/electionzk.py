"""ZooKeeper as a dict, enough to run the election machine's tasks (zeps.replication.election) in
unit tests: no watches, no sessions; the simulation (tests/simulation) has the full model."""

from __future__ import annotations

import itertools
from typing import Any

from zeps.paths import StreamPaths
from zeps.replication import election as zk
from zeps.replication.election import ReplicationState

PATHS = StreamPaths.of("default", "prices", chroot="/zeps")


class Nodes:
    """ZooKeeper's data as a dict: enough to run a machine's tasks (no watches, no sessions)."""

    def __init__(self) -> None:
        self.data: dict[str, tuple[bytes, int]] = {}
        self._sequence = itertools.count()

    def run(self, task: zk.Task) -> None:
        zk.drive(task, self._execute)

    def _execute(self, op: zk.Op) -> Any:
        match op:
            case zk.Create(path, data, _, sequence, _):
                if sequence:
                    path = f"{path}{next(self._sequence):010d}"
                if path in self.data:
                    raise zk.NodeExistsError(path)
                self.data[path] = (data, 0)
                return path
            case zk.Get(path, _):
                if path not in self.data:
                    raise zk.NoNodeError(path)
                return self.data[path]
            case zk.Set(path, data, version):
                if self.data[path][1] != version:
                    raise zk.BadVersionError(path)
                self.data[path] = (data, version + 1)
                return None
            case zk.GetChildren(path, _):
                if path not in self.data:
                    raise zk.NoNodeError(path)
                return [p[len(path) + 1 :] for p in self.data if p.startswith(path + "/")]
            case zk.Exists(path, _):
                return path in self.data
            case zk.Delete(path):
                if path not in self.data:
                    raise zk.NoNodeError(path)
                del self.data[path]
                return None
            case zk.Schedule():
                return None
        raise AssertionError(op)

    def state(self) -> ReplicationState | None:
        return ReplicationState.decode(self.data[PATHS.replication_state][0])
