"""The operator's Kubernetes adapter (``zeps_operator.kube``) against the real API server: the cleaner
Lease's compare-and-set between identities and its takeover after expiry, Secrets, server-side
apply, Deployment availability. Nothing is mocked."""

from __future__ import annotations

import base64
import datetime as dt
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from zeps_operator.kube import FIELD_MANAGER, InvalidSecretError, Kube


def _owner(kube_api: Any, namespace: str, name: str) -> dict[str, str]:
    """A real object to own the Lease: with an owner that does not exist, the garbage collector would
    delete the Lease under the test."""
    made = client.CoreV1Api(kube_api).create_namespaced_config_map(
        namespace, client.V1ConfigMap(metadata=client.V1ObjectMeta(name=name))
    )
    return {"apiVersion": "v1", "kind": "ConfigMap", "name": name, "uid": made.metadata.uid}


def test_a_lease_is_held_by_one_identity_until_it_expires(kube_api: Any, namespace: str) -> None:
    kube = Kube(kube_api)
    owner = _owner(kube_api, namespace, "lease-owner")

    start = dt.datetime.now(dt.UTC)

    def hold(identity: str, after: float) -> str:
        at = start + dt.timedelta(seconds=after)
        return kube.hold_lease(namespace, "cleaner", identity=identity, owner=owner, duration=2, now=at)

    assert hold("a", 0) == "a"  # created
    assert hold("b", 1) == "a"  # held by a, renewed within its duration
    assert hold("a", 1.5) == "a"  # renewed
    assert hold("b", 3) == "a"  # 1.5 s after the renewal: still a's
    assert hold("b", 4) == "b"  # a stopped renewing: the Lease expired 2 s after it, and b took it over
    assert hold("a", 4.5) == "b"
    lease = client.CoordinationV1Api(kube_api).read_namespaced_lease("cleaner", namespace)
    assert lease.spec.holder_identity == "b" and lease.spec.lease_duration_seconds == 2
    assert [r.uid for r in lease.metadata.owner_references] == [owner["uid"]]


def test_racing_identities_agree_on_one_holder(kube_api: Any, namespace: str) -> None:
    """Four replicas ask for the same fresh Lease at once, eight times: every answer names the same holder."""
    kube = Kube(kube_api)
    owner = _owner(kube_api, namespace, "race-owner")
    for round_ in range(8):
        answers: dict[str, str] = {}
        start = threading.Barrier(4)

        def ask(identity: str, lease: str, start: threading.Barrier, answers: dict[str, str]) -> None:
            start.wait(10)
            answers[identity] = kube.hold_lease(namespace, lease, identity=identity, owner=owner)

        threads = [
            threading.Thread(target=ask, args=(f"replica-{i}", f"race-{round_}", start, answers)) for i in range(4)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert len(answers) == 4 and len(set(answers.values())) == 1, answers
        assert next(iter(answers.values())) in answers


def test_credentials_come_from_a_secret_with_both_keys(kube_api: Any, namespace: str) -> None:
    kube = Kube(kube_api)
    core = client.CoreV1Api(kube_api)
    assert kube.credentials(namespace, "zk-auth") is None
    core.create_namespaced_secret(
        namespace,
        client.V1Secret(metadata=client.V1ObjectMeta(name="zk-auth"), string_data={"user": "u", "password": "p"}),
    )
    assert kube.credentials(namespace, "zk-auth") == ("u", "p")
    core.create_namespaced_secret(
        namespace, client.V1Secret(metadata=client.V1ObjectMeta(name="half"), string_data={"user": "u"})
    )
    with pytest.raises(InvalidSecretError, match="needs the keys user and password"):
        kube.credentials(namespace, "half")
    binary = {"user": base64.b64encode(b"u").decode(), "password": base64.b64encode(b"\xff\xfe").decode()}
    core.create_namespaced_secret(namespace, client.V1Secret(metadata=client.V1ObjectMeta(name="binary"), data=binary))
    with pytest.raises(InvalidSecretError, match="Secret binary: user and password must be UTF-8 text"):
        kube.credentials(namespace, "binary")
    core.create_namespaced_secret(
        namespace,
        client.V1Secret(metadata=client.V1ObjectMeta(name="colon"), string_data={"user": "a:b", "password": "p"}),
    )
    with pytest.raises(InvalidSecretError, match="the user must not contain ':'"):
        kube.credentials(namespace, "colon")


def test_apply_creates_then_updates_as_the_operators_field_manager(kube_api: Any, namespace: str) -> None:
    kube = Kube(kube_api)
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "applied", "namespace": namespace}}
    kube.apply({**config_map, "data": {"k": "1"}})
    kube.apply({**config_map, "data": {"k": "2"}})
    read = client.CoreV1Api(kube_api).read_namespaced_config_map("applied", namespace)
    assert read.data == {"k": "2"}
    assert FIELD_MANAGER in {f.manager for f in read.metadata.managed_fields}


def test_apply_reads_and_writes_no_discovery_cache_file(
    kube_api: Any, namespace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The dynamic client's discovery stays in memory: by default it is a file in the shared temporary
    directory (``osrcp-<hash>.json``), which anyone on the machine could have written first."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    kube = Kube(kube_api)
    kube.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "discovery", "namespace": namespace}})
    kube.delete("v1", "ConfigMap", namespace, "discovery")
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_missing_deployment_is_not_available(kube_api: Any, namespace: str) -> None:
    assert Kube(kube_api).deployment_available(namespace, "no-such-broker") is False


def test_a_status_patch_at_a_stale_resource_version_is_refused(kube_api: Any, crds: Any, namespace: str) -> None:
    """The resync's write: merged into the status only while the object is as the pass read it. (The
    session's operator may write to the Topic too: the first write is retried until it lands on a
    fresh read; the field written is one the operator leaves alone.)"""
    kube = Kube(kube_api)
    api = client.CustomObjectsApi(kube_api)
    topic = {"apiVersion": "zeps.dev/v1alpha1", "kind": "Topic", "metadata": {"name": "stale"}}
    api.create_namespaced_custom_object("zeps.dev", "v1alpha1", namespace, "topics", topic)

    def read_version() -> str:
        return str(
            api.get_namespaced_custom_object("zeps.dev", "v1alpha1", namespace, "topics", "stale")["metadata"][
                "resourceVersion"
            ]
        )

    for _ in range(20):
        read_at = read_version()
        if kube.patch_status("Topic", namespace, "stale", {"testNote": "first"}, resource_version=read_at):
            break
    else:
        pytest.fail("no status patch landed on a fresh read in 20 tries")
    # that write moved the resourceVersion on: a writer that read before it is refused
    assert not kube.patch_status("Topic", namespace, "stale", {"testNote": "second"}, resource_version=read_at)
    now = api.get_namespaced_custom_object("zeps.dev", "v1alpha1", namespace, "topics", "stale")
    assert now["status"]["testNote"] == "first"
    assert not kube.patch_status("Topic", namespace, "gone", {"testNote": "x"}, resource_version="1")


def test_a_request_annotation_is_removed_only_while_it_holds_what_was_done(
    kube_api: Any, crds: Any, namespace: str
) -> None:
    """How the operator takes back a one-shot request (a replica to move, an unclean election) once done:
    the annotation goes only if it still holds the request done. A pass working from an old copy of the
    object must not remove a new request annotated since. (A key no handler reads: the session's operator
    may handle the Topic, and leaves it alone.)"""
    kube = Kube(kube_api)
    api = client.CustomObjectsApi(kube_api)
    key = "zeps.dev/test-request"
    topic = {"apiVersion": "zeps.dev/v1alpha1", "kind": "Topic",
             "metadata": {"name": "asked", "annotations": {key: "second", "other": "kept"}}}  # fmt: skip
    api.create_namespaced_custom_object("zeps.dev", "v1alpha1", namespace, "topics", topic)

    def annotations() -> dict[str, str]:
        return dict(api.get_namespaced_custom_object("zeps.dev", "v1alpha1", namespace, "topics", "asked")
                    ["metadata"].get("annotations") or {})  # fmt: skip

    assert not kube.remove_annotation("Topic", namespace, "asked", key, "first")  # done: "first"; asked now: "second"
    assert annotations()[key] == "second"
    assert kube.remove_annotation("Topic", namespace, "asked", key, "second")
    assert key not in annotations() and annotations()["other"] == "kept"
    assert not kube.remove_annotation("Topic", namespace, "asked", key, "second")  # gone already
    assert not kube.remove_annotation("Topic", namespace, "gone", key, "second")  # no such object


def test_an_event_names_the_object_it_is_about(kube_api: Any, namespace: str) -> None:
    kube = Kube(kube_api)
    involved = {"kind": "Topic", "namespace": namespace, "name": "orders", "uid": "uid-1"}
    kube.post_event(involved, type="Warning", reason="DriftRepaired", message="restored /x " + "y" * 2000)
    (event,) = client.CoreV1Api(kube_api).list_namespaced_event(namespace).items
    assert (event.type, event.reason, event.count) == ("Warning", "DriftRepaired", 1)
    assert len(event.message) == 1024 and event.source.component == FIELD_MANAGER
    ref = event.involved_object
    assert (ref.api_version, ref.kind, ref.name, ref.uid) == ("zeps.dev/v1alpha1", "Topic", "orders", "uid-1")


def test_a_pod_is_deleted_only_if_it_is_still_the_one_looked_at(kube_api: Any, namespace: str) -> None:
    """The roll deletes a pod by name and uid: a pod made again under that name since it was looked at
    (another uid) is left alone, and the call says so; the one looked at is deleted."""
    kube, core = Kube(kube_api), client.CoreV1Api(kube_api)

    def make() -> str:
        # bound to no node (its selector matches none): the API server deletes it at once
        pod = client.V1Pod(metadata=client.V1ObjectMeta(name="broker-0"),
                           spec=client.V1PodSpec(containers=[client.V1Container(name="c", image="none")],
                                                 node_selector={"zeps.dev/nowhere": "true"}))  # fmt: skip
        return str(core.create_namespaced_pod(namespace, pod).metadata.uid)

    looked_at = make()
    assert kube.delete_pod(namespace, "broker-0", looked_at)
    again = make()  # made again under the name
    assert not kube.delete_pod(namespace, "broker-0", looked_at), "not the pod looked at"
    assert core.read_namespaced_pod("broker-0", namespace).metadata.uid == again
    assert kube.delete_pod(namespace, "broker-0", again)
    assert kube.delete_pod(namespace, "broker-0", again), "gone already: nothing to do"
