"""Every spec field of every CRD reaches the code that uses it: a field in the schema that nothing
reads is a promise the system does not keep.

The test walks the fields of the models the CRDs are generated from (nested ones as ``a.b``) and
requires a check for each, so a new field without one fails here. Each check sets a value other than
the default and finds it where it takes effect: in the SDK recipe a handle builds from the resource's
spec, in the broker's configuration parsed from the ConfigMap the operator writes, in the objects
the operator creates, or in the operator's decision. No ZooKeeper is needed: the recipes' constructors
do no I/O, so the handles get a placeholder client (said here, as the standards ask of a stand-in).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from types import UnionType
from typing import Any, Literal, get_args, get_origin

import pytest
from pydantic import BaseModel

import zeps.handles
from zeps.broker.certificates import make_certificate, public_key_of
from zeps.broker.main import multicast_options, parse_args, replication, settings, tiering
from zeps.config import Resolved
from zeps.errors import ConfigError
from zeps.options import BatchOptions, QueueOptions, TopicOptions
from zeps_operator.curve import plan_keys
from zeps_operator.models import KINDS, StreamSpec
from zeps_operator.plan import Settings, retains_data, stream_members, stream_objects

Check = Callable[[Any, pytest.MonkeyPatch, Path], None]


def _paths(model: type[BaseModel], prefix: str = "") -> set[str]:
    """The spec's field names (camelCase), nested models' fields as ``outer.inner``."""
    out = set()
    for name, info in model.model_fields.items():
        alias = info.alias or name
        annotation = info.annotation
        if isinstance(annotation, UnionType):  # an optional block: its fields
            annotation = next(a for a in get_args(annotation) if a is not type(None))
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            out |= _paths(annotation, f"{prefix}{alias}.")
        else:
            out.add(prefix + alias)
    return out


def _handle_recipe(handle_type: type[Any], kind: str, spec: dict[str, Any]) -> Any:
    handle = handle_type(Resolved(kind=kind, name="n", namespace="ns", zookeeper="zk:2181", spec=spec))  # type: ignore[arg-type]
    handle._zookeeper = object  # placeholder client: the recipes' constructors do no I/O
    return handle._recipe()


def _other(model: type[BaseModel], field: str) -> Any:
    """A valid value of ``field`` other than its default."""
    info = model.model_fields[field]
    default = info.default
    if get_origin(info.annotation) is Literal:
        candidates: list[Any] = [c for c in get_args(info.annotation) if c != default]
    elif isinstance(default, bool):
        candidates = [not default]
    elif isinstance(default, (int, float)):
        candidates = [default + 1, default - 1, 2 * default + 1]
    else:
        candidates = ["s3://bucket/prefix", "file:///tmp/x", "http://127.0.0.1:8333", "eu-west-1", True]
    for value in candidates:
        try:
            model.model_validate({field: value})
            return value
        except ValueError:
            continue
    raise AssertionError(f"no other valid value found for {model.__name__}.{field}")


def _option_checks(model: type[BaseModel], handle_type: type[Any], kind: str, under: str = "") -> dict[str, Check]:
    """The options every handle passes from the spec to its recipe, one check per field."""
    checks: dict[str, Check] = {}
    for name, info in model.model_fields.items():
        alias = info.alias or "".join(w.capitalize() if i else w for i, w in enumerate(name.split("_")))

        def check(_value: Any, _mp: pytest.MonkeyPatch, _tmp: Path, name: str = name, alias: str = alias) -> None:
            value = _other(model, name)
            spec = {under: {alias: value}} if under else {alias: value}
            assert getattr(_handle_recipe(handle_type, kind, spec).options, name) == value

        checks[f"{under}.{alias}" if under else alias] = check
    return checks


def _deletion(_value: Any, _mp: pytest.MonkeyPatch, _tmp: Path) -> None:
    assert retains_data({"deletionPolicy": "Retain"}) and not retains_data({"deletionPolicy": "Delete"})
    assert not retains_data({})  # the default deletes


def _queue_mode(_value: Any, mp: pytest.MonkeyPatch, _tmp: Path) -> None:
    """spec.mode decides which handle may open the Queue (the Spark source's part: test_spark_source)."""
    for mode, refused in (("batches", zeps.handles.queue), ("work", zeps.handles.batches)):
        resolved = Resolved(kind="Queue", name="q", namespace="ns", zookeeper="zk:2181", spec={"mode": mode})
        mp.setattr(zeps.handles, "resolve", lambda *_a, resolved=resolved, **_k: resolved)
        with pytest.raises(ConfigError, match=rf"has spec\.mode '{mode}'"):
            refused("q")


def _broker(spec: dict[str, Any], mp: pytest.MonkeyPatch, tmp: Path) -> tuple[Any, ...]:
    """The objects the operator creates for ``spec``, and the broker's settings parsed from the
    ConfigMap it writes (as the broker pod reads it: environment variables)."""
    objects = stream_objects("ns", "prices", StreamSpec.model_validate(spec), Settings(zookeeper="zk:2181"))
    by_kind = {o["kind"]: o for o in objects}
    for key, value in by_kind["ConfigMap"]["data"].items():
        mp.setenv(key, value)
    mp.setenv("ZEPS_BROKER_DATA_DIR", str(tmp))
    args = parse_args([])
    config, curve, _registration = settings(args)
    container = by_kind["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    return by_kind, container, config, curve, multicast_options(args), tiering(args)


def _stream(path: str, value: Any, effect: Callable[..., Any]) -> Check:
    def check(_value: Any, mp: pytest.MonkeyPatch, tmp: Path) -> None:
        spec: dict[str, Any] = {}
        node = spec
        *outer, last = path.split(".")
        for part in outer:
            node = node.setdefault(part, {})
        node[last] = value
        if outer == ["multicast"]:  # a field of the block: the rest of a valid one around it
            spec["multicast"] = {**_MULTICAST, **node}
        if outer[:1] == ["tiering"]:
            spec["tiering"] = {"storeUrl": "s3://bucket/prefix", **spec["tiering"]}
        if outer[:1] == ["compaction"]:  # its fields are for a compacted stream
            spec["cleanup"] = "compact"
        by_kind, container, config, curve, multicast, tiered = _broker(spec, mp, tmp)
        assert effect(by_kind=by_kind, container=container, config=config, curve=curve, multicast=multicast,
                      tiered=tiered), path  # fmt: skip

    return check


_MULTICAST = {"transport": "epgm", "group": "239.192.0.1", "port": 5601}


def _replica_broker(spec: StreamSpec, mp: pytest.MonkeyPatch, tmp: Path) -> tuple[list[dict[str, Any]], Any]:
    """A replicated stream's objects, and the parsed flags of its first replica (the ConfigMap as its
    environment, plus the member name the pod's own env gives it)."""
    objects = stream_objects("ns", "prices", spec, Settings(zookeeper="zk:2181"), replicated=True)
    for key, value in next(o for o in objects if o["kind"] == "ConfigMap")["data"].items():
        mp.setenv(key, value)
    mp.setenv("ZEPS_BROKER_DATA_DIR", str(tmp))
    mp.setenv("ZEPS_BROKER_MEMBER", "prices-broker-0")
    return objects, parse_args([])


def _replicas(_value: Any, mp: pytest.MonkeyPatch, tmp: Path) -> None:
    """spec.replicas: the StatefulSet's pods, the group's manifest, and each replica's broker flags."""
    spec = StreamSpec.model_validate({"replicas": 4})
    objects, args = _replica_broker(spec, mp, tmp)
    sts = next(o for o in objects if o["kind"] == "StatefulSet")
    assert sts["spec"]["replicas"] == 4
    assert stream_members("prices", spec, replicated=True) == [f"prices-broker-{i}" for i in range(4)]
    replica = replication(args)
    assert replica is not None and replica.min_insync == 3  # a majority of 4


def _partitions(_value: Any, mp: pytest.MonkeyPatch, tmp: Path) -> None:
    """spec.partitions: partition 2 of 3 is a StatefulSet of its own whose brokers serve partition 2
    (they register and elect under it); partition 0 stays the stream's own broker set, and no broker
    set's selector takes another's pods."""
    spec = StreamSpec.model_validate({"partitions": 3, "replicas": 2})
    objects = stream_objects("ns", "prices", spec, Settings(zookeeper="zk:2181"), partition=2)
    by_kind = {o["kind"]: o for o in objects if o["kind"] != "Service" or "clusterIP" not in o["spec"]}
    sts = by_kind["StatefulSet"]
    assert sts["metadata"]["name"] == "prices-broker-p2" and sts["spec"]["replicas"] == 2
    assert sts["spec"]["serviceName"] == "prices-broker-p2-pods"
    assert stream_members("prices", spec, replicated=True, partition=2) == ["prices-broker-p2-0", "prices-broker-p2-1"]
    for key, value in by_kind["ConfigMap"]["data"].items():
        mp.setenv(key, value)
    mp.setenv("ZEPS_BROKER_DATA_DIR", str(tmp))
    mp.setenv("ZEPS_BROKER_MEMBER", "prices-broker-p2-0")
    args = parse_args([])
    _config, _curve, registration = settings(args)
    assert registration is not None and registration.partition == 2 and replication(args) is not None
    first = stream_objects("ns", "prices", spec, Settings(zookeeper="zk:2181"))
    selectors = [o["spec"]["selector"] for o in (*first, *objects) if o["kind"] == "Service"]
    pods = [o["spec"]["template"]["metadata"]["labels"] for o in (*first, *objects) if "template" in o.get("spec", {})]
    assert [sum(all(p.get(k) == v for k, v in sel.items()) for p in pods) for sel in selectors] == [1, 1, 1]


def _catch_up(_value: Any, mp: pytest.MonkeyPatch, tmp: Path) -> None:
    """spec.catchUpMegabytesPerSecond: the leader's limit for a replica catching up (the broker's config)."""
    _, args = _replica_broker(StreamSpec.model_validate({"replicas": 3, "catchUpMegabytesPerSecond": 40}), mp, tmp)
    config, _curve, _registration = settings(args)
    assert config.replica_catchup_bytes_per_s == 40_000_000


def _min_in_sync(_value: Any, mp: pytest.MonkeyPatch, tmp: Path) -> None:
    objects, args = _replica_broker(StreamSpec.model_validate({"replicas": 3, "minInSync": 3}), mp, tmp)
    replica = replication(args)
    assert replica is not None and replica.min_insync == 3
    budget = next(o for o in objects if o["kind"] == "PodDisruptionBudget")["spec"]
    assert budget["maxUnavailable"] == 1 and "minAvailable" not in budget  # a drain is never blocked for good


def _pod(by_kind: dict[str, Any]) -> dict[str, Any]:
    return by_kind["Deployment"]["spec"]["template"]  # type: ignore[no-any-return]


def _curve_clients(_value: Any, _mp: pytest.MonkeyPatch, _tmp: Path) -> None:
    """spec.curveClients: the operator's plan of the namespace's CURVE Secret admits those clients'
    keys (the broker reads that list: test_stream's revocation test), and gives each its certificate."""
    keys = plan_keys({}, "prices", ["orders", "audit"], make=make_certificate)
    admitted = json.loads(keys.data["prices.clients.json"])
    assert sorted(admitted) == ["audit", "orders"] and sorted(keys.clients) == ["audit", "orders"]
    assert admitted["orders"] == public_key_of(keys.clients["orders"])
    fewer = plan_keys(keys.data, "prices", ["audit"], make=make_certificate)
    assert list(json.loads(fewer.data["prices.clients.json"])) == ["audit"]  # orders revoked, its key kept
    assert fewer.data["prices.client.orders.key_secret"] == keys.clients["orders"]


STREAM_CHECKS: dict[str, Check] = {
    "image": _stream(
        "image", "registry.local/zeps:9", lambda container, **_: container["image"] == "registry.local/zeps:9"
    ),
    "resources.requests": _stream(
        "resources.requests", {"cpu": "3"}, lambda container, **_: container["resources"]["requests"] == {"cpu": "3"}
    ),
    "resources.limits": _stream(
        "resources.limits",
        {"memory": "3Gi"},
        lambda container, **_: container["resources"]["limits"] == {"memory": "3Gi"},
    ),
    "storage.size": _stream(
        "storage.size",
        "7Gi",
        lambda by_kind, **_: by_kind["PersistentVolumeClaim"]["spec"]["resources"]["requests"]["storage"] == "7Gi",
    ),
    "storage.storageClassName": _stream(
        "storage.storageClassName",
        "fast",
        lambda by_kind, **_: by_kind["PersistentVolumeClaim"]["spec"]["storageClassName"] == "fast",
    ),
    "retention.ageSeconds": _stream(
        "retention.ageSeconds", 90, lambda config, **_: config.journal.retention_ms == 90_000
    ),
    "retention.bytes": _stream(
        "retention.bytes", 5 << 20, lambda config, **_: config.journal.retention_bytes == 5 << 20
    ),
    "fsync": _stream("fsync", "always", lambda config, **_: config.journal.fsync == "always"),
    "replicas": _replicas,
    "minInSync": _min_in_sync,
    "partitions": _partitions,
    "catchUpMegabytesPerSecond": _catch_up,
    "matching": _stream("matching", "prefix", lambda config, **_: config.matching == "prefix"),
    "producers.ttlSeconds": _stream(
        "producers.ttlSeconds", 600, lambda config, **_: config.journal.producer_ttl_ms == 600_000
    ),
    "producers.max": _stream("producers.max", 5000, lambda config, **_: config.journal.max_producers == 5000),
    "curve": _stream(
        "curve",
        True,
        lambda curve, container, **_: (
            curve is not None
            and curve.clients is not None  # authenticates: only the listed clients
            and any(m["name"] == "curve" for m in container["volumeMounts"])
        ),
    ),
    "curveClients": _curve_clients,
    "maxMessageBytes": _stream("maxMessageBytes", 4096, lambda config, **_: config.max_message_bytes == 4096),
    "serviceType": _stream(
        "serviceType", "NodePort", lambda by_kind, **_: by_kind["Service"]["spec"]["type"] == "NodePort"
    ),
    "port": _stream(
        "port",
        6000,
        lambda by_kind, container, **_: (
            container["ports"][0]["containerPort"] == 6000 and by_kind["Service"]["spec"]["ports"][0]["port"] == 6000
        ),
    ),
    "deletionPolicy": _deletion,
    "cleanup": _stream("cleanup", "delete,compact", lambda config, **_: config.journal.cleanup == "delete,compact"),
    "compaction.tombstoneRetentionSeconds": _stream(
        "compaction.tombstoneRetentionSeconds", 60, lambda config, **_: config.journal.tombstone_retention_ms == 60_000
    ),
    "compaction.minCleanableRatio": _stream(
        "compaction.minCleanableRatio", 0.25, lambda config, **_: config.journal.min_cleanable_ratio == 0.25
    ),
    "compaction.bytesPerSecond": _stream(
        "compaction.bytesPerSecond", 4 << 20, lambda config, **_: config.journal.compaction_bytes_per_s == 4 << 20
    ),
    "tiering.storeUrl": _stream(
        "tiering.storeUrl",
        "s3://other/p",
        lambda tiered, **_: tiered is not None and tiered.store_url == "s3://other/p",
    ),
    "tiering.storeEndpoint": _stream(
        "tiering.storeEndpoint", "http://s3:8333", lambda tiered, **_: tiered.endpoint == "http://s3:8333"
    ),
    "tiering.storeRegion": _stream(
        "tiering.storeRegion", "eu-west-1", lambda tiered, **_: tiered.region == "eu-west-1"
    ),
    "tiering.storePathStyle": _stream("tiering.storePathStyle", False, lambda tiered, **_: tiered.path_style is False),
    "tiering.storeCredentialsSecret": _stream(
        "tiering.storeCredentialsSecret",
        "s3-keys",
        lambda container, **_: {"secretRef": {"name": "s3-keys"}} in container["envFrom"],
    ),
    "tiering.segmentIdleSeconds": _stream(
        "tiering.segmentIdleSeconds", 30, lambda tiered, **_: tiered.segment_idle_ms == 30_000
    ),
    "tiering.maxBacklogBytes": _stream(
        "tiering.maxBacklogBytes", 8 << 20, lambda tiered, **_: tiered.max_backlog_bytes == 8 << 20
    ),
    "tiering.localRetention.ageSeconds": _stream(
        "tiering.localRetention.ageSeconds", 60, lambda config, **_: config.journal.retention_ms == 60_000
    ),
    "tiering.localRetention.bytes": _stream(
        "tiering.localRetention.bytes", 2 << 20, lambda config, **_: config.journal.retention_bytes == 2 << 20
    ),
    "multicast.transport": _stream(
        "multicast.transport",
        "pgm",
        lambda multicast, container, **_: (  # PGM sends raw IP packets: root with NET_RAW alone
            multicast.transport == "pgm" and container["securityContext"]["capabilities"]["add"] == ["NET_RAW"]
        ),
    ),
    "multicast.group": _stream("multicast.group", "239.1.2.3", lambda multicast, **_: multicast.group == "239.1.2.3"),
    "multicast.port": _stream("multicast.port", 6001, lambda multicast, **_: multicast.port == 6001),
    "multicast.interface": _stream("multicast.interface", "net1", lambda multicast, **_: multicast.interface == "net1"),
    "multicast.rateKbps": _stream("multicast.rateKbps", 2000, lambda multicast, **_: multicast.rate_kbps == 2000),
    "multicast.recoveryMs": _stream("multicast.recoveryMs", 3000, lambda multicast, **_: multicast.recovery_ms == 3000),
    "multicast.heartbeatMs": _stream(
        "multicast.heartbeatMs", 250, lambda multicast, **_: multicast.heartbeat_ms == 250
    ),
    "multicast.hostNetwork": _stream(
        "multicast.hostNetwork",
        True,
        lambda by_kind, **_: (
            _pod(by_kind)["spec"]["hostNetwork"] and _pod(by_kind)["spec"]["dnsPolicy"] == "ClusterFirstWithHostNet"
        ),
    ),
    "multicast.networks": _stream(
        "multicast.networks",
        "mcast",
        lambda by_kind, **_: _pod(by_kind)["metadata"]["annotations"]["k8s.v1.cni.cncf.io/networks"] == "mcast",
    ),
}

CHECKS: dict[str, dict[str, Check]] = {
    "Topic": {**_option_checks(TopicOptions, zeps.handles.TopicHandle, "Topic"), "deletionPolicy": _deletion},
    "Queue": {
        **_option_checks(QueueOptions, zeps.handles.QueueHandle, "Queue"),
        **_option_checks(BatchOptions, zeps.handles.BatchesHandle, "Queue", under="batches"),
        "mode": _queue_mode,
        "deletionPolicy": _deletion,
    },
    "ZepsStream": STREAM_CHECKS,
}


@pytest.mark.parametrize("kind", [k.kind for k in KINDS])
def test_every_spec_field_has_a_check(kind: str) -> None:
    spec = next(k.spec for k in KINDS if k.kind == kind)
    assert _paths(spec) == set(CHECKS[kind]), "a spec field without a consumer (or a check for a field that is gone)"


@pytest.mark.parametrize(("kind", "path"), [(kind, path) for kind, checks in CHECKS.items() for path in checks])
def test_the_field_reaches_the_code_that_uses_it(kind: str, path: str, monkeypatch: pytest.MonkeyPatch,
                                                 tmp_path: Path) -> None:  # fmt: skip
    CHECKS[kind][path](None, monkeypatch, tmp_path)
