"""The operator's CURVE plan for replicated and partitioned streams, read by the broker as its pod would.

The kubelet's part (a Secret volume's items written as files) is done here by hand, from the very
objects the operator plans: the mount itself is real on kind (e2e/kind/test_security.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from zeps.broker.certificates import make_certificate, public_key_of
from zeps.broker.main import parse_args, settings
from zeps_operator.curve import CURVE_SECRET, client_rotation, plan_keys, rotation_data
from zeps_operator.models import MAX_REPLICAS, StreamSpec
from zeps_operator.plan import Settings, migration_objects, stream_members, stream_objects

SPEC = StreamSpec.model_validate({"curve": True, "curveClients": ["app"], "replicas": 3, "partitions": 2})


def _members() -> list[str]:
    return [m for p in range(SPEC.partitions) for m in stream_members("prices", SPEC, replicated=True, partition=p)]


def _pod(objects: list[dict[str, Any]], kind: str = "StatefulSet") -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == kind)["spec"]["template"]  # type: ignore[no-any-return]


def _mount(data: dict[str, str], pod: dict[str, Any], env: dict[str, str], root: Path) -> dict[str, str]:
    """What the kubelet does with the pod's Secret volumes (an optional one's missing items left out),
    under ``root``; the broker's environment with its paths moved there."""
    [container] = pod["spec"]["containers"]
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    for volume in pod["spec"]["volumes"]:
        secret = volume.get("secret")
        if secret is None:
            continue
        assert secret["secretName"] == CURVE_SECRET
        target = root / mounts[volume["name"]].lstrip("/")
        target.mkdir(parents=True, exist_ok=True)
        for item in secret["items"]:
            if item["key"] in data:
                (target / item["path"]).write_text(data[item["key"]])
            else:
                assert secret.get("optional"), f"{item['key']} missing from a volume that is not optional"
    return {k: str(root / v.lstrip("/")) if v.startswith("/etc/zeps/") else v for k, v in env.items()}


def test_each_replica_of_every_partition_gets_a_certificate_listed_by_its_public_key() -> None:
    keys = plan_keys({}, "prices", ["app"], make=make_certificate, replicas=_members())
    listed = json.loads(keys.data["prices.replicas.json"])
    assert sorted(listed) == sorted(_members()) and len(listed) == 6
    for member, public in listed.items():
        assert public_key_of(keys.data[f"prices.replica.{member}.key_secret"]) == public
    assert len(set(listed.values()) | {keys.public_key}) == 7  # a key of its own each, none the server's
    again = plan_keys(keys.data, "prices", ["app"], make=make_certificate, replicas=_members())
    assert not again.changed  # made once, kept
    fewer = plan_keys(keys.data, "prices", ["app"], make=make_certificate, replicas=_members()[:2])
    assert sorted(json.loads(fewer.data["prices.replicas.json"])) == sorted(_members()[:2])  # off the list
    assert (
        fewer.data["prices.replica.prices-broker-2.key_secret"]
        == keys.data["prices.replica.prices-broker-2.key_secret"]
    )


@pytest.mark.parametrize("partition", [0, 1])
def test_a_replica_pod_finds_its_own_certificate_and_the_replicas_keys_where_the_broker_looks(
    partition: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plan's volumes, ConfigMap and the pod's own name give the broker a CURVE config whose
    replica list is the Secret's and whose certificate is this replica's own."""
    keys = plan_keys({}, "prices", ["app"], make=make_certificate, replicas=_members())
    objects = stream_objects("shop", "prices", SPEC, Settings(zookeeper="zk:2181"), replicated=True,
                             partition=partition)  # fmt: skip
    env = _mount(keys.data, _pod(objects), next(o for o in objects if o["kind"] == "ConfigMap")["data"], tmp_path)
    member = stream_members("prices", SPEC, replicated=True, partition=partition)[1]
    for key, value in {**env, "ZEPS_BROKER_MEMBER": member, "ZEPS_BROKER_DATA_DIR": str(tmp_path)}.items():
        monkeypatch.setenv(key, value)
    _config, curve, registration = settings(parse_args([]))
    assert curve is not None and curve.replicas is not None and registration is not None
    assert json.loads(curve.replicas.read_text()) == json.loads(keys.data["prices.replicas.json"])
    mine = curve.replica_certificate(registration.member)
    assert mine is not None and mine.read_text() == keys.data[f"prices.replica.{member}.key_secret"]
    held = {p.name for p in mine.parent.iterdir()}  # its own partition's replicas only
    assert held == {
        "replicas.json",
        *(f"replica.{m}.key_secret" for m in stream_members("prices", SPEC, replicated=True, partition=partition)),
    }


def test_scaling_a_curve_stream_changes_no_pod_template() -> None:
    """The replicas' certificates are mounted for every index a spec allows (those not made yet are
    left out), and a key rotation's coming key: scaling from 3 to 5 with minInSync as it was rolls no
    running replica (a minInSync that follows the replicas, their majority, reaches them by the roll)."""
    three, five = (stream_objects("shop", "prices", StreamSpec.model_validate({"curve": True, "replicas": n,
                                                                               "minInSync": 2}),
                                  Settings(zookeeper="zk:2181"), replicated=True) for n in (3, 5))  # fmt: skip
    assert _pod(three) == _pod(five)
    volume = next(v for v in _pod(three)["spec"]["volumes"] if v["name"] == "curve-replicas")
    assert volume["secret"]["optional"] is True and len(volume["secret"]["items"]) == MAX_REPLICAS + 2


def test_a_curve_stream_growing_replicas_peers_its_old_broker_as_the_first_replica(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """During the migration from one broker, the old Deployment's broker peers with its own replica
    certificate (its member name), as the new replicas do."""
    spec = StreamSpec.model_validate({"curve": True, "replicas": 3})
    members = ["prices-0", *stream_members("prices", spec, replicated=True)]
    keys = plan_keys({}, "prices", [], make=make_certificate, replicas=members)
    objects = migration_objects("shop", "prices", spec, Settings(zookeeper="zk:2181"))
    pod = _pod(objects, "Deployment")
    env = _mount(keys.data, pod, next(o for o in objects if o["kind"] == "ConfigMap")["data"], tmp_path)
    own = {e["name"]: e["value"] for e in pod["spec"]["containers"][0]["env"] if "value" in e}
    for key, value in {
        **env,
        "ZEPS_BROKER_MEMBER": own["ZEPS_BROKER_MEMBER"],
        "ZEPS_BROKER_DATA_DIR": str(tmp_path),
    }.items():
        monkeypatch.setenv(key, value)
    _config, curve, registration = settings(parse_args([]))
    assert curve is not None and registration is not None and registration.member == "prices-0"
    mine = curve.replica_certificate("prices-0")
    assert mine is not None and mine.read_text() == keys.data["prices.replica.prices-0.key_secret"]


def test_a_key_rotation_hands_out_the_coming_key_switches_then_forgets_the_old_each_step_once() -> None:
    """The phases of a rotation as the namespace Secret and each client's Secret see them; each is
    the same when done again (a pass that failed midway writes it again)."""
    data = plan_keys({}, "prices", ["teller"], make=make_certificate).data
    old = public_key_of(data["prices.broker.key"])
    coming = rotation_data(data, "prices", "distributing", make=make_certificate)
    assert rotation_data(coming, "prices", "distributing", make=make_certificate) == coming
    new = public_key_of(coming["prices.broker.next.key"])
    assert new != old and coming["prices.broker.key_secret"] == data["prices.broker.key_secret"]
    assert public_key_of(str(client_rotation(coming, "prices", "distributing")["server.next.key"])) == new
    switched = rotation_data(coming, "prices", "switched", make=make_certificate)
    assert rotation_data(switched, "prices", "switched", make=make_certificate) == switched
    assert public_key_of(switched["prices.broker.key_secret"]) == public_key_of(switched["prices.broker.key"]) == new
    assert not {"prices.broker.next.key", "prices.broker.next.key_secret"} & set(switched)
    files = client_rotation(switched, "prices", "switched")
    assert files["server.next.key"] is None and public_key_of(str(files["server.key"])) == new
    assert public_key_of(str(files["server.previous.key"])) == old
    done = rotation_data(switched, "prices", "done", make=make_certificate)
    assert (
        "prices.broker.previous.key" not in done
        and done["prices.broker.key_secret"] == switched["prices.broker.key_secret"]
    )
    assert client_rotation(done, "prices", "done") == {"server.previous.key": None}
