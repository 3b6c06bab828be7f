"""The generated CRDs on the real API server: served, defaulted, and validated by the server itself."""

from __future__ import annotations

import json
from typing import Any

import pytest

from zeps.errors import SetupError
from zeps_dev import ControlPlane


def _apply(plane: ControlPlane, namespace: str, body: dict[str, Any]) -> str:
    return plane.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(body))


def _rejected(plane: ControlPlane, namespace: str, body: dict[str, Any]) -> str:
    with pytest.raises(SetupError) as err:
        _apply(plane, namespace, body)
    return str(err.value)


def test_kubectl_applies_the_crds_and_defaults_fill_in(crds: ControlPlane, namespace: str) -> None:
    _apply(crds, namespace, {"apiVersion": "zeps.dev/v1alpha1", "kind": "Topic", "metadata": {"name": "cache"}})
    spec = json.loads(crds.kubectl("get", "topic", "cache", "-n", namespace, "-o", "json"))["spec"]
    assert spec["maxQueueDepth"] == 10_000 and spec["fullQueuePolicy"] == "block" and spec["deletionPolicy"] == "Delete"
    table = crds.kubectl("get", "zt", "-n", namespace)
    assert table.split()[:4] == ["NAME", "READY", "SUBSCRIBERS", "AGE"]


@pytest.mark.parametrize(
    ("kind", "spec", "field"),
    [
        ("Topic", {"maxQueueDepth": 0}, "spec.maxQueueDepth"),
        ("Topic", {"fullQueuePolicy": "sometimes"}, "spec.fullQueuePolicy"),
        ("Topic", {"colour": "blue"}, 'unknown field "spec.colour"'),
        ("Queue", {"mode": "stack"}, "spec.mode"),
        ("Queue", {"mode": "batches", "batches": {"storeUrl": "gs://bucket/p"}}, "spec.batches.storeUrl"),
        ("Queue", {"mode": "batches", "batches": {"storeEndpoint": "seaweedfs:8333"}}, "spec.batches.storeEndpoint"),
        ("Queue", {"mode": "batches", "batches": {"storeCredentialsSecret": "Not_A_Name"}},
         "spec.batches.storeCredentialsSecret"),
        ("ZepsStream", {"storage": {"size": "lots"}}, "spec.storage.size"),
        ("ZepsStream", {"fsync": "sometimes"}, "spec.fsync"),
        ("ZepsStream", {"producers": {"ttlSeconds": 0}}, "spec.producers.ttlSeconds"),
        ("ZepsStream", {"multicast": {"transport": "udp", "group": "239.1.2.3", "port": 5601}},
         "spec.multicast.transport"),
        ("ZepsStream", {"multicast": {"transport": "epgm", "group": "10.1.2.3", "port": 5601}},
         "spec.multicast.group"),
        ("ZepsStream", {"multicast": {"transport": "epgm", "group": "239.1.2.3"}}, "spec.multicast.port"),
        ("ZepsStream", {"multicast": {"transport": "norm", "group": "239.1.2.3", "port": 5601, "rateKbps": 1000}},
         "rateKbps and recoveryMs are for pgm and epgm"),
        ("ZepsStream", {"replicas": 8}, "spec.replicas"),
        ("ZepsStream", {"replicas": 3, "minInSync": 4}, "minInSync counts replicas"),
        ("ZepsStream", {"replicas": 5, "partitions": 13, "curve": True}, "replicas times partitions above 64"),
        ("ZepsStream", {"partitions": 0}, "spec.partitions"),
        ("ZepsStream", {"partitions": 257}, "spec.partitions"),
        ("ZepsStream", {"partitions": 2, "multicast": {"transport": "epgm", "group": "239.1.2.3", "port": 5601}},
         "partitions above 1 take no multicast output"),
        ("ZepsStream", {"tiering": {"storeEndpoint": "http://s3:8333"}}, "spec.tiering.storeUrl"),
        ("ZepsStream", {"tiering": {"storeUrl": "gs://bucket/p"}}, "spec.tiering.storeUrl"),
        ("ZepsStream", {"tiering": {"storeUrl": "s3://b/p", "storeCredentialsSecret": "Not_A_Name"}},
         "spec.tiering.storeCredentialsSecret"),
        ("ZepsStream", {"retention": {"ageSeconds": 60}, "tiering": {"storeUrl": "s3://b/p",
                                                                       "localRetention": {"ageSeconds": 61}}},
         "tiering.localRetention.ageSeconds is the volume's part of retention.ageSeconds"),
        ("ZepsStream", {"retention": {"bytes": 2 << 20}, "tiering": {"storeUrl": "s3://b/p",
                                                                       "localRetention": {"bytes": 4 << 20}}},
         "tiering.localRetention.bytes is the volume's part of retention.bytes"),
        ("ZepsStream", {"cleanup": "compacted"}, "spec.cleanup"),
        ("ZepsStream", {"cleanup": "compact", "compaction": {"minCleanableRatio": 1.5}},
         "spec.compaction.minCleanableRatio"),
    ],
)  # fmt: skip
def test_invalid_specs_are_rejected_naming_the_field(
    crds: ControlPlane, namespace: str, kind: str, spec: dict[str, Any], field: str
) -> None:
    body = {"apiVersion": "zeps.dev/v1alpha1", "kind": kind, "metadata": {"name": "bad"}, "spec": spec}
    assert field in _rejected(crds, namespace, body)


def test_a_stream_name_too_long_for_its_brokers_statefulsets_is_rejected(crds: ControlPlane, namespace: str) -> None:
    """40 characters fit ``<name>-broker-p255`` and its pods' revision label; 41 are refused."""
    stream: dict[str, Any] = {"apiVersion": "zeps.dev/v1alpha1", "kind": "ZepsStream", "spec": {"partitions": 2}}
    _apply(crds, namespace, {**stream, "metadata": {"name": "s" * 40}})
    assert "name takes at most 40 characters" in _rejected(crds, namespace, {**stream, "metadata": {"name": "s" * 41}})


@pytest.mark.parametrize("name", ["orders.eu", "1orders"])
def test_a_stream_name_no_service_could_carry_is_rejected(crds: ControlPlane, namespace: str, name: str) -> None:
    """A name Kubernetes takes for the resource (a DNS subdomain) but not for its Services (a DNS label
    starting with a letter): before, the stream was accepted and its objects could never be made, nor
    the stream deleted past its finalizer."""
    stream: dict[str, Any] = {"apiVersion": "zeps.dev/v1alpha1", "kind": "ZepsStream", "spec": {}}
    assert "name is a DNS label" in _rejected(crds, namespace, {**stream, "metadata": {"name": name}})


def test_immutable_fields_cannot_change(crds: ControlPlane, namespace: str) -> None:
    queue = {"apiVersion": "zeps.dev/v1alpha1", "kind": "Queue", "metadata": {"name": "jobs"}, "spec": {"mode": "work"}}
    _apply(crds, namespace, queue)
    queue["spec"] = {"mode": "batches"}
    assert "spec.mode: Invalid value" in _rejected(crds, namespace, queue)
    assert "is immutable" in _rejected(crds, namespace, queue)
    stream = {"apiVersion": "zeps.dev/v1alpha1", "kind": "ZepsStream", "metadata": {"name": "prices"},
              "spec": {"storage": {"storageClassName": "fast"}}}  # fmt: skip
    _apply(crds, namespace, stream)
    stream["spec"] = {"storage": {"storageClassName": "slow"}}
    assert "spec.storage.storageClassName" in _rejected(crds, namespace, stream)


def test_partitions_can_grow_but_never_shrink(crds: ControlPlane, namespace: str) -> None:
    stream = {"apiVersion": "zeps.dev/v1alpha1", "kind": "ZepsStream", "metadata": {"name": "orders"},
              "spec": {"partitions": 2}}  # fmt: skip
    _apply(crds, namespace, stream)
    stream["spec"] = {"partitions": 3}
    _apply(crds, namespace, stream)
    stream["spec"] = {"partitions": 2}
    assert "partitions can only grow" in _rejected(crds, namespace, stream)
    stream["spec"] = {}  # unset is the default, 1: fewer too
    assert "partitions can only grow" in _rejected(crds, namespace, stream)
    spec = json.loads(crds.kubectl("get", "zepsstream", "orders", "-n", namespace, "-o", "json"))["spec"]
    assert spec["partitions"] == 3


def test_a_multicast_output_is_accepted_and_defaulted(crds: ControlPlane, namespace: str) -> None:
    """The CEL rule lets pgm/epgm take a rate, and norm none, with the API server's null defaults."""
    for name, multicast in (("epgm", {"transport": "epgm", "group": "239.1.2.3", "port": 5601, "rateKbps": 5000}),
                            ("norm", {"transport": "norm", "group": "239.1.2.4", "port": 5602})):  # fmt: skip
        body = {"apiVersion": "zeps.dev/v1alpha1", "kind": "ZepsStream", "metadata": {"name": f"mc-{name}"},
                "spec": {"multicast": multicast}}  # fmt: skip
        _apply(crds, namespace, body)
        spec = json.loads(crds.kubectl("get", "zepsstream", f"mc-{name}", "-n", namespace, "-o", "json"))["spec"]
        assert spec["multicast"]["heartbeatMs"] == 100 and spec["multicast"]["hostNetwork"] is False


def test_a_compacted_stream_of_replicas_is_accepted_and_defaulted(crds: ControlPlane, namespace: str) -> None:
    """cleanup compact with replicas and partitions passes the schema; the API server sets
    compaction's defaults."""
    body = {"apiVersion": "zeps.dev/v1alpha1", "kind": "ZepsStream", "metadata": {"name": "prices"},
            "spec": {"cleanup": "delete,compact", "partitions": 2, "replicas": 3, "compaction": {}}}  # fmt: skip
    _apply(crds, namespace, body)
    spec = json.loads(crds.kubectl("get", "zepsstream", "prices", "-n", namespace, "-o", "json"))["spec"]
    assert spec["compaction"] == {"tombstoneRetentionSeconds": 86400, "minCleanableRatio": 0.5}


def test_curve_takes_replicas_and_partitions_up_to_its_bound(crds: ControlPlane, namespace: str) -> None:
    """CURVE with replicas and partitions is accepted up to 64 replicas in all (each has a
    certificate in the namespace's Secret); one more is refused, naming the bound."""
    for name, replicas, partitions in (("secure-r3p2", 3, 2), ("secure-bound", 4, 16)):
        _apply(crds, namespace, {"apiVersion": "zeps.dev/v1alpha1", "kind": "ZepsStream", "metadata": {"name": name},
                                 "spec": {"curve": True, "replicas": replicas, "partitions": partitions}})  # fmt: skip
    over = {"apiVersion": "zeps.dev/v1alpha1", "kind": "ZepsStream", "metadata": {"name": "secure-over"},
            "spec": {"curve": True, "replicas": 5, "partitions": 13}}  # fmt: skip
    assert "above 64" in _rejected(crds, namespace, over)
