"""Developer tooling, from a source checkout only: never in the zeps wheel or image.

Local servers for development, tests and ``make demo``: ZooKeeper and a Kubernetes control plane;
in :mod:`zeps_dev.kind` (with :mod:`~zeps_dev.docker` and :mod:`~zeps_dev.images`), the kind
cluster with real nodes that ``make e2e`` and ``make demo CLUSTER=kind`` build and run;
:mod:`zeps_dev.demo` (``make demo``) and :mod:`zeps_dev.cli` (``zeps dev up|down``).

It lives in ``devtools/`` beside ``sdk/``: the editable install (``make setup``) puts it on the
path, the wheel leaves it out, and an import-linter contract keeps the runtime packages (``zeps``,
``zeps_operator``) from importing it.

Nothing here talks ZooKeeper or Kubernetes protocols; it only starts, checks and stops processes
from the pinned binaries that ``make setup`` places in the zeps cache:

* ``ZEPS_ZOOKEEPER_HOME`` — folder with ``lib/*.jar`` (``tools/zookeeper/fetch.sh`` prints it);
* ``ZEPS_TESTBIN`` — folder with etcd, kube-apiserver, … (``tools/testbin/build.sh`` prints it).

Every server binds 127.0.0.1 only and is stopped by ``stop()``, by the context manager, at
interpreter exit, and (by default) when the process that started it dies.
"""

from zeps_dev.controlplane import ControlPlane
from zeps_dev.operator import OperatorProcess
from zeps_dev.process import ManagedProcess, free_port
from zeps_dev.zookeeper import ZooKeeperServer

__all__ = ["ControlPlane", "ManagedProcess", "OperatorProcess", "ZooKeeperServer", "free_port"]
