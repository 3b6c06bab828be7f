"""Local servers for development, tests and ``make demo``: ZooKeeper and a Kubernetes control plane;
and, in :mod:`zeps.dev.kind` (with :mod:`~zeps.dev.docker` and :mod:`~zeps.dev.images`), the kind
cluster with real nodes that ``make e2e`` and ``make demo CLUSTER=kind`` build and run.

Nothing here talks ZooKeeper or Kubernetes protocols; it only starts, checks and stops processes
from the pinned binaries that ``make setup`` places in the zeps cache:

* ``ZEPS_ZOOKEEPER_HOME`` — folder with ``lib/*.jar`` (``tools/zookeeper/fetch.sh`` prints it);
* ``ZEPS_TESTBIN`` — folder with etcd, kube-apiserver, … (``tools/testbin/build.sh`` prints it).

Every server binds 127.0.0.1 only and is stopped by ``stop()``, by the context manager, at
interpreter exit, and (by default) when the process that started it dies.
"""

from zeps.dev.controlplane import ControlPlane
from zeps.dev.operator import OperatorProcess
from zeps.dev.process import ManagedProcess, free_port
from zeps.dev.zookeeper import ZooKeeperServer

__all__ = ["ControlPlane", "ManagedProcess", "OperatorProcess", "ZooKeeperServer", "free_port"]
