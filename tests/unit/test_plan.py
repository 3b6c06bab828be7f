"""The operator's pure planning (zeps_operator.plan): what should exist for a resource, no I/O."""

from __future__ import annotations

from typing import Any

import pytest

from zeps.paths import QueuePaths, TopicPaths
from zeps.resources import ZOOKEEPER_CLIENT_LABEL
from zeps_operator.models import StreamSpec
from zeps_operator.plan import (
    Settings,
    condition,
    ready_at,
    replacing_map,
    set_condition,
    status_changes,
    stream_objects,
    under_replicated,
    zookeeper_layout,
)


def _objects(spec: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    made = stream_objects("shop", "prices", StreamSpec.model_validate(spec or {}), Settings(zookeeper="zk:2181"))
    return {o["kind"]: o for o in made}


def _workload(spec: dict[str, Any]) -> dict[str, Any]:
    """The broker Deployment's or StatefulSet's spec."""
    made = _objects(spec)
    return dict((made.get("Deployment") or made["StatefulSet"])["spec"])


def test_a_stream_gets_a_broker_with_one_writer_per_journal() -> None:
    objects = _objects()
    assert set(objects) == {"ConfigMap", "PersistentVolumeClaim", "Deployment", "Service"}
    deployment = objects["Deployment"]["spec"]
    assert deployment["replicas"] == 1 and deployment["strategy"] == {"type": "Recreate"}  # never two brokers
    # the pods: the selector's labels, and the one the chart's NetworkPolicy lets reach ZooKeeper (never
    # in the selector: it cannot change on a set that exists)
    selector = deployment["selector"]["matchLabels"]
    assert deployment["template"]["metadata"]["labels"] == {**selector, ZOOKEEPER_CLIENT_LABEL: "true"}
    assert objects["Service"]["spec"]["selector"] == selector
    pod = deployment["template"]["spec"]
    [container] = pod["containers"]
    assert container["securityContext"]["readOnlyRootFilesystem"] and pod["securityContext"]["runAsNonRoot"]
    assert {"name": "journal", "persistentVolumeClaim": {"claimName": "prices-journal"}} in pod["volumes"]
    env = objects["ConfigMap"]["data"]
    assert env["ZEPS_BROKER_ADVERTISE"] == "tcp://prices-broker.shop.svc:5555"
    assert env["ZEPS_BROKER_MEMBER"] == "prices-0" and env["ZEPS_BROKER_ZOOKEEPER"] == "zk:2181"


def test_a_broker_pod_is_ready_within_two_seconds_of_listening_and_restarted_only_after_a_minute_silent() -> None:
    """A roll, a move or a drain waits for each new broker pod's readiness (operations.md, "Changing a
    running stream"): the kubelet checks the port every 2 s, not Kubernetes' default 10; liveness
    stays patient."""
    for spec in ({}, {"replicas": 3}):
        [container] = _workload(spec)["template"]["spec"]["containers"]
        ready, alive = container["readinessProbe"], container["livenessProbe"]
        assert ready["tcpSocket"] == alive["tcpSocket"] == {"port": "zeps"}
        assert ready["periodSeconds"] == 2 and ready["initialDelaySeconds"] <= 2
        assert alive["periodSeconds"] * alive["failureThreshold"] >= 60


def test_brokers_get_the_zookeeper_ca_where_the_operator_has_one(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Any
) -> None:
    """The operator's CA file (ZEPS_ZOOKEEPER_CA, the chart mounts ca.crt) is read once; its PEM goes to
    each broker's ConfigMap (a public certificate), none where the operator speaks plain TCP."""
    assert "ZEPS_BROKER_ZOOKEEPER_CA" not in _objects()["ConfigMap"]["data"]
    pem = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----"
    (tmp_path / "ca.crt").write_text(pem + "\n")
    monkeypatch.setenv("ZEPS_ZOOKEEPER", "zk:2281")
    monkeypatch.setenv("ZEPS_ZOOKEEPER_CA", str(tmp_path / "ca.crt"))
    settings = Settings.from_env()
    assert settings.zookeeper_ca == pem
    made = stream_objects("shop", "prices", StreamSpec(), settings)
    assert next(o for o in made if o["kind"] == "ConfigMap")["data"]["ZEPS_BROKER_ZOOKEEPER_CA"] == pem
    monkeypatch.setenv("ZEPS_ZOOKEEPER_CA", str(tmp_path / "missing.crt"))
    with pytest.raises(SystemExit, match=r"ZEPS_ZOOKEEPER_CA=.*missing\.crt.*cannot read it"):
        Settings.from_env()


def test_defaults_come_from_the_model() -> None:
    """An empty spec gets the model's defaults, not a second copy of them in the planner."""
    defaults = StreamSpec()
    objects = _objects()
    container = objects["Deployment"]["spec"]["template"]["spec"]["containers"][0]
    assert objects["PersistentVolumeClaim"]["spec"]["resources"]["requests"]["storage"] == defaults.storage.size
    assert container["resources"] == {"requests": defaults.resources.requests, "limits": defaults.resources.limits}
    assert objects["ConfigMap"]["data"]["ZEPS_BROKER_FSYNC"] == defaults.fsync
    assert objects["ConfigMap"]["data"]["ZEPS_BROKER_PRODUCER_TTL"] == str(defaults.producers.ttl_seconds) == "86400"
    assert objects["ConfigMap"]["data"]["ZEPS_BROKER_MAX_PRODUCERS"] == str(defaults.producers.max)
    assert objects["Service"]["spec"]["type"] == defaults.service_type
    assert "ZEPS_BROKER_RETENTION_MS" not in objects["ConfigMap"]["data"]


def test_ready_condition_keeps_its_transition_time_until_the_status_changes() -> None:
    other = {"type": "Degraded", "status": "False"}
    first = condition([other], ready=False, reason="Waiting", message="", generation=1)
    assert first[0] == other
    since = first[-1]["lastTransitionTime"] = "2020-01-01T00:00:00Z"
    same = condition(first, ready=False, reason="StillWaiting", message="m", generation=2)
    assert same[-1]["lastTransitionTime"] == since and same[-1]["observedGeneration"] == 2
    flipped = condition(same, ready=True, reason="Reconciled", message="", generation=2)
    assert flipped[-1]["status"] == "True" and flipped[-1]["lastTransitionTime"] != since
    assert [c["type"] for c in flipped] == ["Degraded", "Ready"]
    # ready_at: Ready for this very generation (a resume finds nothing to announce), not an older one
    assert ready_at(flipped, 2) and not ready_at(flipped, 3) and not ready_at(same, 2) and not ready_at(None, 1)


def test_other_conditions_keep_their_place_so_an_unchanged_list_stays_equal() -> None:
    """Rolling and UnderReplicated beside Ready: each set in its place (a pass that changes nothing
    writes nothing: status_changes compares the lists), its transition time moving with its status."""
    first = set_condition(None, "Rolling", True, reason="Blocked", message="x waits", generation=1)
    both = condition(first, ready=True, reason="LeaderReady", message="", generation=1)
    since = both[0]["lastTransitionTime"] = "2020-01-01T00:00:00Z"
    again = set_condition(both, "Rolling", True, reason="Rolling", message="y restarting", generation=2)
    assert [c["type"] for c in again] == ["Rolling", "Ready"] and again[0]["lastTransitionTime"] == since
    done = set_condition(again, "Rolling", False, reason="Current", message="", generation=2)
    assert done[0]["status"] == "False" and done[0]["lastTransitionTime"] != since
    assert set_condition(done, "Rolling", False, reason="Current", message="", generation=2)[0] == done[0]


def test_under_replicated_says_which_replicas_catch_up_and_how_far_and_which_fetch_nothing() -> None:
    members = ["s-broker-0", "s-broker-1", "s-broker-2"]
    lag = {"s-broker-1": 12345, "s-broker-2": 40}
    assert under_replicated(members, frozenset(members), lag) == []
    assert under_replicated(members, frozenset({"s-broker-0"}), lag, frozenset({"s-broker-1"})) == [
        "s-broker-1 catching up (12,345 records behind)", "s-broker-2 not fetching"]  # fmt: skip
    # a leader that does not say who fetches: each follower it reports a lag for
    assert under_replicated(members, frozenset({"s-broker-0"}), {"s-broker-2": 3}) == [
        "s-broker-1 not fetching", "s-broker-2 catching up (3 records behind)"]  # fmt: skip


def test_zookeeper_layout_is_the_one_of_zeps_paths() -> None:
    root, children = zookeeper_layout("Topic", "shop", "cache", "/zeps")
    topic = TopicPaths.of("shop", "cache")
    assert root == topic.root and f"{root}/parked" == topic.parked and "parked" in children
    root, children = zookeeper_layout("Queue", "shop", "jobs", "/zeps")
    queue = QueuePaths.of("shop", "jobs")
    assert [f"{root}/{c}" for c in children] == queue.layout()
    assert queue.items in queue.layout() and queue.batch_data in queue.layout()
    with pytest.raises(ValueError, match="unknown kind"):
        zookeeper_layout("Bucket", "shop", "x", "/zeps")


def test_the_operator_refuses_to_start_without_its_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ZEPS_ZOOKEEPER", raising=False)
    with pytest.raises(SystemExit, match="ZEPS_ZOOKEEPER is not set"):
        Settings.from_env()
    monkeypatch.setenv("ZEPS_ZOOKEEPER", "zk:2181")
    monkeypatch.setenv("ZEPS_ZOOKEEPER_AUTH", "no-colon")
    with pytest.raises(SystemExit, match="user:password"):
        Settings.from_env()
    monkeypatch.setenv("ZEPS_ZOOKEEPER_AUTH", "admin:secret")
    assert Settings.from_env().zookeeper_auth == ("admin", "secret")
    assert (Settings.from_env().namespace_quota_nodes, Settings.from_env().namespace_quota_bytes) == (0, 0)
    monkeypatch.setenv("ZEPS_NAMESPACE_QUOTA_NODES", "100000")
    monkeypatch.setenv("ZEPS_NAMESPACE_QUOTA_BYTES", "64Mi")
    with pytest.raises(SystemExit, match=r"ZEPS_NAMESPACE_QUOTA_BYTES='64Mi': a whole number"):
        Settings.from_env()
    monkeypatch.setenv("ZEPS_NAMESPACE_QUOTA_BYTES", "67108864")
    assert (Settings.from_env().namespace_quota_nodes, Settings.from_env().namespace_quota_bytes) == (100000, 1 << 26)


def test_status_changes_carry_only_what_differs() -> None:
    current = {"observedGeneration": 2, "subscribers": 3, "conditions": [{"type": "Ready", "status": "True"}]}
    same = {"observedGeneration": 2, "subscribers": 3, "conditions": [{"type": "Ready", "status": "True"}]}
    assert status_changes(current, same) == {}  # an idle resync: nothing to write
    assert status_changes(current, {**same, "subscribers": 4}) == {"subscribers": 4}
    assert status_changes({}, {"path": "/zeps/a/topics/b"}) == {"path": "/zeps/a/topics/b"}  # new field
    ready_false = [{"type": "Ready", "status": "False"}]
    assert status_changes(current, {**same, "conditions": ready_false}) == {"conditions": ready_false}


def _replicated(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    typed = StreamSpec.model_validate(spec)
    made = stream_objects("shop", "prices", typed, Settings(zookeeper="zk:2181"), replicated=True)
    return {f"{o['kind']}/{o['metadata']['name']}": o for o in made}


def test_a_changed_setting_changes_the_brokers_pod_template_so_they_restart_with_it() -> None:
    """The brokers read their ConfigMap as they start: a setting that lives there alone (the message
    limit, minInSync, fsync) changes the pod template's digest, so the Deployment rolls out and the
    StatefulSet's data-aware roll restarts its pods. Before, such a change reached no running broker
    until it restarted for another reason."""

    def template(objects: dict[str, dict[str, Any]], kind: str) -> dict[str, Any]:
        return dict(next(o for k, o in objects.items() if k.startswith(kind))["spec"]["template"])

    one, same, other = (_objects({"maxMessageBytes": n}) for n in (1 << 20, 1 << 20, 2 << 20))
    assert template(one, "Deployment") == template(same, "Deployment") != template(other, "Deployment")
    assert one["ConfigMap"]["data"] != other["ConfigMap"]["data"]
    two, three = (_replicated({"replicas": 3, "minInSync": n}) for n in (2, 3))
    assert template(two, "StatefulSet") != template(three, "StatefulSet")
    assert two["StatefulSet/prices-broker"]["spec"]["template"]["metadata"]["annotations"]["zeps.dev/config-digest"]


def test_a_replicated_stream_is_a_statefulset_spread_across_nodes_with_a_budget() -> None:
    objects = _replicated({"replicas": 3, "deletionPolicy": "Retain"})
    assert set(objects) == {"ConfigMap/prices-broker", "StatefulSet/prices-broker", "Service/prices-broker",
                            "Service/prices-broker-pods", "PodDisruptionBudget/prices-broker"}  # fmt: skip
    sts = objects["StatefulSet/prices-broker"]["spec"]
    assert sts["replicas"] == 3 and sts["serviceName"] == "prices-broker-pods"
    assert sts["template"]["metadata"]["labels"] == {**sts["selector"]["matchLabels"], ZOOKEEPER_CLIENT_LABEL: "true"}
    assert ZOOKEEPER_CLIENT_LABEL not in sts["selector"]["matchLabels"]
    assert sts["podManagementPolicy"] == "Parallel"
    assert sts["persistentVolumeClaimRetentionPolicy"] == {"whenDeleted": "Retain", "whenScaled": "Retain"}
    (claim,) = sts["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == "journal" and claim["metadata"]["labels"]["zeps.dev/stream"] == "prices"
    pod = sts["template"]["spec"]
    assert [v["name"] for v in pod["volumes"]] == ["tmp"]  # the journal is each replica's own claim
    (spread,) = pod["topologySpreadConstraints"]
    assert spread["topologyKey"] == "kubernetes.io/hostname" and spread["whenUnsatisfiable"] == "ScheduleAnyway"
    preferred = pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert [(t["weight"], t["podAffinityTerm"]["topologyKey"]) for t in preferred] == [
        (100, "kubernetes.io/hostname"), (50, "topology.kubernetes.io/zone")]  # fmt: skip
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["ZEPS_BROKER_MEMBER"] == "$(POD_NAME)"
    assert env["ZEPS_BROKER_ADVERTISE"] == "tcp://$(POD_IP):5555"  # no DNS lookup on failover
    assert env["ZEPS_BROKER_METRICS_ADDRESS"] == "$(POD_IP)"  # never 0.0.0.0: a host-network pod's node
    config = objects["ConfigMap/prices-broker"]["data"]
    assert "ZEPS_BROKER_METRICS_ADDRESS" not in config
    assert config["ZEPS_BROKER_MIN_INSYNC"] == "2" and "ZEPS_BROKER_MEMBER" not in config  # a majority of 3
    # a replica asked to stop may wait for another to be in sync, then hand over: its grace covers both
    handover = float(config["ZEPS_BROKER_HANDOVER_TIMEOUT"])
    assert pod["terminationGracePeriodSeconds"] > 2 * handover
    assert objects["Service/prices-broker-pods"]["spec"]["clusterIP"] == "None"
    assert objects["PodDisruptionBudget/prices-broker"]["spec"] == {
        "maxUnavailable": 1,
        "selector": {"matchLabels": objects["StatefulSet/prices-broker"]["spec"]["selector"]["matchLabels"]},
    }  # one at a time
    deleted = _replicated({"replicas": 5, "minInSync": 3})["StatefulSet/prices-broker"]["spec"]
    assert deleted["persistentVolumeClaimRetentionPolicy"]["whenDeleted"] == "Delete"


def test_each_partition_names_a_preferred_leader_so_leaderships_spread_over_the_ordinals() -> None:
    """The replicas give the lead back to the preferred one after a roll or a failover
    (zeps.replication.election): partition p of a stream of n replicas prefers ordinal p mod n."""
    typed = StreamSpec.model_validate({"replicas": 3, "partitions": 4})
    preferred = []
    for partition in range(4):
        made = stream_objects("shop", "prices", typed, Settings(zookeeper="zk:2181"), replicated=True,
                              partition=partition)  # fmt: skip
        (config,) = (o["data"] for o in made if o["kind"] == "ConfigMap")
        preferred.append(config["ZEPS_BROKER_PREFERRED_LEADER"])
    assert preferred == ["prices-broker-0", "prices-broker-p1-1", "prices-broker-p2-2", "prices-broker-p3-0"]
    single = stream_objects("shop", "prices", StreamSpec.model_validate({}), Settings(zookeeper="zk:2181"))
    assert all("ZEPS_BROKER_PREFERRED_LEADER" not in o.get("data", {}) for o in single)  # one broker: no election


def test_min_in_sync_defaults_to_a_majority() -> None:
    assert [StreamSpec.model_validate({"replicas": n}).in_sync for n in (1, 2, 3, 4, 5)] == [1, 2, 2, 3, 3]
    assert StreamSpec.model_validate({"replicas": 3, "minInSync": 3}).in_sync == 3


def test_a_status_map_replaced_removes_the_keys_it_no_longer_has() -> None:
    """A status patch merges maps: a key left out would stay; a null removes it."""
    assert replacing_map({"a": 1, "b": 2}, {"b": 3, "c": 4}) == {"a": None, "b": 3, "c": 4}
    assert replacing_map(None, {"b": 3}) == {"b": 3}
    assert replacing_map("not a map", {}) == {}


def test_a_tenant_gets_only_the_images_and_privileges_the_cluster_admin_allows() -> None:
    """Each namespace is a tenant: spec.image from the admin's allow-list (or the operator's own),
    host networking and raw sockets only in namespaces opted in; anything else names the value to set."""
    from zeps_operator.plan import refused_pod  # noqa: PLC0415

    allowed = ("registry.example/zeps:*", "mirror.example/zeps:2.0")
    settings = Settings(zookeeper="zk:2181", broker_image="zeps.local/zeps:1", allowed_images=allowed,
                        privileged_namespaces=frozenset({"multicast"}))  # fmt: skip

    def refused(namespace: str, spec: dict[str, Any]) -> str | None:
        return refused_pod(namespace, StreamSpec.model_validate(spec), settings)

    assert refused("shop", {}) is None
    assert refused("shop", {"image": "zeps.local/zeps:1"}) is None  # the operator's own
    assert refused("shop", {"image": "registry.example/zeps:2.1"}) is None
    assert refused("shop", {"image": "mirror.example/zeps:2.0"}) is None
    assert "brokers.allowedImages" in str(refused("shop", {"image": "evil.example/miner:latest"}))
    assert "brokers.allowedImages" in str(refused("shop", {"image": "mirror.example/zeps:2.0-evil"}))
    host = {"multicast": {"transport": "epgm", "group": "239.1.1.1", "port": 5555, "hostNetwork": True}}
    pgm = {"multicast": {"transport": "pgm", "group": "239.1.1.1", "port": 5555}}
    assert "host networking" in str(refused("shop", host)) and "brokers.privilegedNamespaces" in str(
        refused("shop", host)
    )
    assert "NET_RAW" in str(refused("shop", pgm))
    assert refused("multicast", host) is None and refused("multicast", pgm) is None
    assert refused("shop", {"multicast": {"transport": "epgm", "group": "239.1.1.1", "port": 5555}}) is None


def test_every_broker_pod_of_an_unprivileged_stream_is_pod_security_restricted() -> None:
    """What Pod Security "restricted" asks of a pod, checked on the objects the operator makes (the
    API server enforces it on kind: e2e); a stream of one broker, replicated, and with multicast (epgm)."""
    epgm = {"multicast": {"transport": "epgm", "group": "239.1.1.1", "port": 5555}}
    for spec, replicated in (({}, False), ({"replicas": 3}, True), (epgm, False)):
        objects = stream_objects("shop", "prices", StreamSpec.model_validate(spec), Settings(zookeeper="zk:2181"),
                                 replicated=replicated)  # fmt: skip
        owner = next(o for o in objects if o["kind"] in ("Deployment", "StatefulSet"))
        pod = owner["spec"]["template"]["spec"]
        assert not pod.get("hostNetwork") and not pod.get("hostPID") and not pod.get("hostIPC")
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        for container in pod["containers"]:
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False
            assert context["capabilities"] == {"drop": ["ALL"]}
            assert context.get("runAsNonRoot", True) is True and context.get("runAsUser", 1) != 0
            assert "hostPort" not in str(container.get("ports"))
        assert all("hostPath" not in volume for volume in pod.get("volumes", []))
