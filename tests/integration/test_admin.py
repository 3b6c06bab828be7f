"""What the operator does in ZooKeeper for a resource (:mod:`zeps.coordination.admin`), against a
real ZooKeeper server."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kazoo.exceptions import NoAuthError
from kazoo.security import ACL, OPEN_ACL_UNSAFE

from harness import ZooKeeperHarness
from zeps.coordination import admin
from zeps.coordination.admin import PathConflictError, ensure_resource, resource_nodes
from zeps.coordination.client import digest_acl

CHILDREN = ["items", "batches/data", "batches/refs"]


def _ensure(zookeeper: ZooKeeperHarness, client: Any, **kwargs: Any) -> list[str]:
    arguments: dict[str, Any] = {"owner": "local/uid-1", "generation": 1, "spec": {"size": 1}}
    arguments.update(kwargs)
    return ensure_resource(
        client, f"{zookeeper.root}/ns/queues/q", CHILDREN, boundary=f"{zookeeper.root}/ns", **arguments
    )


def test_resource_nodes_lists_parents_first_and_stops_at_the_boundary() -> None:
    assert resource_nodes("/z/ns/queues/q", ["items", "batches/data", "batches/refs"], boundary="/z/ns") == [
        "/z/ns/queues",
        "/z/ns/queues/q",
        "/z/ns/queues/q/items",
        "/z/ns/queues/q/batches",
        "/z/ns/queues/q/batches/data",
        "/z/ns/queues/q/batches/refs",
    ]
    assert resource_nodes("/z/t", ["a"]) == ["/z", "/z/t", "/z/t/a"]


def test_a_new_resource_is_created_in_one_transaction(zookeeper: ZooKeeperHarness) -> None:
    client = zookeeper.client()
    root = f"{zookeeper.root}/ns/queues/q"
    written = _ensure(zookeeper, client)
    expected = [*resource_nodes(root, CHILDREN, boundary=f"{zookeeper.root}/ns"), f"{root}/spec"]
    assert written == expected
    # every node of the resource and its spec node carry the same zxid: one multi created them all
    assert len({client.exists(node).czxid for node in expected}) == 1
    data, _ = client.get(f"{root}/spec")
    assert json.loads(data) == {
        "formatVersion": admin.LAYOUT_VERSION,
        "owner": "local/uid-1",
        "generation": 1,
        "spec": {"size": 1},
    }


def test_a_pass_that_finds_everything_in_place_writes_nothing(zookeeper: ZooKeeperHarness) -> None:
    client = zookeeper.client()
    _ensure(zookeeper, client)
    spec = f"{zookeeper.root}/ns/queues/q/spec"
    before = client.exists(spec)
    assert _ensure(zookeeper, client) == []
    assert client.exists(spec) == before


def test_a_missing_child_and_a_new_generation_are_repaired(zookeeper: ZooKeeperHarness) -> None:
    client = zookeeper.client()
    _ensure(zookeeper, client)
    root = f"{zookeeper.root}/ns/queues/q"
    client.delete(f"{root}/batches", recursive=True)
    assert _ensure(zookeeper, client, generation=2) == [
        f"{root}/batches",
        f"{root}/batches/data",
        f"{root}/batches/refs",
        f"{root}/spec",
    ]
    assert json.loads(client.get(f"{root}/spec")[0])["generation"] == 2


def test_a_spec_node_nested_past_any_bound_is_repaired_not_fatal(zookeeper: ZooKeeperHarness) -> None:
    """Anyone with the namespace's ACL can write a resource's spec node: one nested 100,000 deep
    made the operator's read raise RecursionError at every pass (the object could be neither
    reconciled nor deleted). It reads as no spec zeps wrote, and the next pass rewrites it."""
    client = zookeeper.client()
    _ensure(zookeeper, client)
    root = f"{zookeeper.root}/ns/queues/q"
    client.set(f"{root}/spec", b"[" * 100_000 + b"]" * 100_000)
    assert admin.read_spec_node(client, root) == {}
    assert _ensure(zookeeper, client) == [f"{root}/spec"]
    assert json.loads(client.get(f"{root}/spec")[0])["owner"] == "local/uid-1"


def test_a_namespace_root_claimed_before_its_owner_used_zeps_is_taken_back(zookeeper: ZooKeeperHarness) -> None:
    """Anyone may make /zeps/<namespace> (or a node of a resource's path) first, with an ACL of their
    own (ALL for them: they could then delete and make what is under it). The operator, a super user
    of the servers, puts the namespace's own ACL back and says so (the nodes are among those
    repaired); a namespace without credentials gets its root open again (its brokers,
    unauthenticated, must write under it). Before, the squatter kept the root."""
    from harness import OPERATOR_AUTH  # noqa: PLC0415

    operator = zookeeper.client(auth=OPERATOR_AUTH)
    squatter = zookeeper.client(auth=("squatter", "pw"))
    boundary = f"{zookeeper.root}/ns"
    squatter.ensure_path(zookeeper.root)
    squatter.create(boundary, acl=digest_acl("squatter", "pw"))
    squatter.create(f"{boundary}/queues", acl=digest_acl("squatter", "pw"))  # the kind's node too
    team = digest_acl("team", "secret")
    repaired = _ensure(zookeeper, operator, acl=team)
    assert boundary in repaired and f"{boundary}/queues" in repaired
    assert operator.get_acls(boundary)[0] == team == operator.get_acls(f"{boundary}/queues")[0]
    with pytest.raises(NoAuthError):
        squatter.create(f"{boundary}/streams/mine", makepath=True)
    assert boundary not in _ensure(zookeeper, operator, acl=team)  # in place now: nothing to say
    operator.set_acls(boundary, digest_acl("squatter", "pw"))
    assert boundary in _ensure(zookeeper, operator)  # a namespace without credentials
    assert operator.get_acls(boundary)[0] == list(OPEN_ACL_UNSAFE)


def test_another_owner_is_refused_and_the_same_cluster_adopts(zookeeper: ZooKeeperHarness) -> None:
    client = zookeeper.client()
    _ensure(zookeeper, client)
    with pytest.raises(PathConflictError, match="belongs to another object"):
        _ensure(zookeeper, client, owner="other/uid-2")
    assert _ensure(zookeeper, client, owner="local/uid-3", adopt_prefix="local/") == [
        f"{zookeeper.root}/ns/queues/q/spec"
    ]


def test_nodes_below_the_boundary_get_the_namespace_acl(zookeeper: ZooKeeperHarness) -> None:
    acl = digest_acl("team", "secret")
    client = zookeeper.client(auth=("team", "secret"), acl_from_auth=False)
    _ensure(zookeeper, client, acl=acl)
    for node in (
        f"{zookeeper.root}/ns",
        f"{zookeeper.root}/ns/queues/q/batches/data",
        f"{zookeeper.root}/ns/queues/q/spec",
    ):
        assert client.get_acls(node)[0] == acl, node
    open_acl: list[ACL] = client.get_acls(zookeeper.root)[0]
    assert open_acl != acl


def test_a_transaction_that_loses_a_race_is_done_step_by_step(
    zookeeper: ZooKeeperHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The race is real (a second client creates a node between the probe and the transaction); only
    its timing is arranged, by wrapping the module's commit."""
    client, rival = zookeeper.client(), zookeeper.client()
    root = f"{zookeeper.root}/ns/queues/q"
    real_commit = admin.commit

    def commit_after_the_rival(*args: Any) -> list[Any]:
        rival.ensure_path(f"{root}/items")
        return real_commit(*args)

    monkeypatch.setattr(admin, "commit", commit_after_the_rival)
    written = _ensure(zookeeper, client)
    assert f"{root}/items" not in written
    assert f"{root}/spec" in written
    for node in resource_nodes(root, CHILDREN, boundary=f"{zookeeper.root}/ns"):
        assert client.exists(node) is not None, node
    assert json.loads(client.get(f"{root}/spec")[0])["owner"] == "local/uid-1"


def test_the_oldest_child_s_age_comes_from_zookeeper_s_clock_and_is_bounded(zookeeper: ZooKeeperHarness) -> None:
    """The age of a queue's oldest item (lowest sequence, not the first name: priorities sort first in
    the names), measured against ZooKeeper's ctime; empty is 0; over ``most`` children, not listed."""
    client = zookeeper.client()
    items = f"{zookeeper.root}/q/items"
    assert admin.oldest_child_age(client, items) == 0.0  # no such node yet: an empty queue
    client.ensure_path(items)
    assert admin.oldest_child_age(client, items) == 0.0
    first = client.create(f"{items}/i-900-a-", b"", sequence=True)  # low priority, but the oldest
    client.create(f"{items}/i-100-b-", b"", sequence=True)
    created = client.exists(first).ctime / 1000
    assert admin.oldest_child_age(client, items, now=created + 42.0) == pytest.approx(42.0)
    client.delete(first)  # the next oldest is younger
    assert admin.oldest_child_age(client, items, now=created + 42.0) < 42.0
    assert admin.oldest_child_age(client, items, most=0) is None


def test_grandchildren_are_counted_over_the_first_queues(zookeeper: ZooKeeperHarness) -> None:
    client = zookeeper.client()
    messages = f"{zookeeper.root}/t/messages"
    assert admin.count_grandchildren(client, messages) == 0
    for queue, count in (("a", 3), ("b", 0), ("c", 2)):
        client.ensure_path(f"{messages}/{queue}")
        for _ in range(count):
            client.create(f"{messages}/{queue}/m-", b"", sequence=True)
    assert admin.count_grandchildren(client, messages) == 5
    assert admin.count_grandchildren(client, messages, most=2) == 3  # a and b only
    assert admin.count_grandchildren(client, messages, listed=2) is None  # three queues: not listed
