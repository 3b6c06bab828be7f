"""The custom resources' API coordinates: the one place the group, the version and each kind's plural
are written. The SDK (resolving a handle through the Kubernetes API), the operator (its handlers and
the CRD models) and the dev stack read them from here."""

from __future__ import annotations

from typing import Literal

__all__ = ["GROUP", "KIND_NAMES", "PLURALS", "VERSION", "ZOOKEEPER_CLIENT_LABEL", "Kind"]

GROUP = "zeps.dev"
VERSION = "v1alpha1"
Kind = Literal["Topic", "Queue", "ZepsStream"]
#: each kind's plural, as in its CRD's name (``<plural>.<group>``) and in API paths
PLURALS: dict[str, str] = {"Topic": "topics", "Queue": "queues", "ZepsStream": "zepsstreams"}
KIND_NAMES: tuple[str, ...] = tuple(PLURALS)
#: the pod label the chart's NetworkPolicy for ZooKeeper admits (value "true"): the operator's pods,
#: the brokers it makes, and every SDK client's pod (charts/zeps/templates/zookeeper-network-policy.yaml)
ZOOKEEPER_CLIENT_LABEL = "zeps.dev/zookeeper-client"
