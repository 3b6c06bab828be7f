"""Growing journal volumes in place (zeps_operator.resize): which claims to grow, and what the
Resizing condition says, as a pure decision over the claims as they are; and the StatefulSet's
claim template keeping the size it was made with (it cannot change). The API server's side (the
claims patched, a StorageClass that refuses) runs in tests/cluster/test_replicated_stream.py."""

from __future__ import annotations

import datetime as dt

from zeps_operator.models import StreamSpec
from zeps_operator.plan import Settings, stream_objects
from zeps_operator.resize import ONLINE_RESIZE_GRACE_S, Claim, plan_resize, restart_to_finish, size_bytes

GI = 1 << 30


def _claim(name: str, requested: str, capacity: str, *, pending: bool = False) -> Claim:
    """A claim as the adapter reads it (these tests write sizes as Gi)."""
    return Claim(name, requested, capacity, size_bytes(requested) or 0, size_bytes(capacity) or 0, pending)


def test_a_larger_size_grows_each_claim_asked_for_less_and_says_resizing_until_each_holds_it() -> None:
    claims = [_claim("journal-s-broker-0", "1Gi", "1Gi"), _claim("journal-s-broker-1", "1Gi", "1Gi")]
    step = plan_resize("2Gi", claims)
    assert step.grow == ("journal-s-broker-0", "journal-s-broker-1") and step.resizing and step.reason == "Resizing"
    asked = [_claim("journal-s-broker-0", "2Gi", "1Gi"), _claim("journal-s-broker-1", "2Gi", "2Gi")]
    step = plan_resize("2Gi", asked)  # asked already: nothing more to ask; one volume still growing
    assert step.grow == () and step.resizing and "journal-s-broker-0 1Gi -> 2Gi" in step.message
    assert "journal-s-broker-1" not in step.message
    done = plan_resize("2Gi", [Claim("journal-s-broker-0", "2Gi", "2147483648", 2 * GI, 2 * GI)])  # bytes compared
    assert (done.grow, done.resizing, done.reason) == ((), False, "Current")


def test_a_filesystem_that_grows_only_unmounted_says_its_pod_restarts() -> None:
    step = plan_resize("2Gi", [_claim("journal-s-broker-0", "2Gi", "1Gi", pending=True)])
    assert step.resizing and "journal-s-broker-0: the filesystem grows once its pod restarts" in step.message


def test_volumes_never_shrink_a_smaller_size_is_refused_and_nothing_is_asked() -> None:
    step = plan_resize("1Gi", [_claim("journal-s-broker-0", "2Gi", "2Gi"), _claim("journal-s-broker-1", "1Gi", "1Gi")])
    assert (step.grow, step.resizing, step.reason) == ((), False, "CannotShrink")
    assert "journal-s-broker-0" in step.message and "never shrink" in step.message


def test_no_claim_yet_is_nothing_to_resize_and_sizes_read_as_the_schema_writes_them() -> None:
    assert plan_resize("2Gi", []).reason == "Current"
    assert (size_bytes("3Gi"), size_bytes("512Mi"), size_bytes("2G"), size_bytes("x")) == (3 * GI, GI // 2, None, None)


def test_the_statefulsets_claim_template_keeps_the_size_it_was_made_with() -> None:
    """A StatefulSet's volumeClaimTemplates cannot change: applying a new size there would fail every
    pass. The template keeps the claims' size; the claims themselves are grown."""
    spec = StreamSpec.model_validate({"replicas": 3, "storage": {"size": "4Gi"}})
    made = stream_objects("shop", "s", spec, Settings(zookeeper="zk:2181"), replicated=True, claim_size="1Gi")
    (sts,) = (o for o in made if o["kind"] == "StatefulSet")
    (template,) = sts["spec"]["volumeClaimTemplates"]
    assert template["spec"]["resources"]["requests"]["storage"] == "1Gi"
    new = stream_objects("shop", "s", spec, Settings(zookeeper="zk:2181"), replicated=True)
    (sts,) = (o for o in new if o["kind"] == "StatefulSet")
    assert sts["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == "4Gi"  # a new set


def test_a_filesystem_waiting_for_its_node_restarts_its_pod_only_once_kubelet_had_its_time() -> None:
    """kubelet grows a mounted volume's filesystem itself where the driver can (online expansion: the
    condition goes within seconds); only a FileSystemResizePending that lasts the grace, or whose
    age is unknown, waits for a restart (before, a pod restarted for every condition: on kind, all
    three replicas of a stream whose volumes grew online)."""
    now = dt.datetime(2026, 12, 3, 18, 0, tzinfo=dt.UTC)
    assert not restart_to_finish(now, now)
    assert not restart_to_finish(now - dt.timedelta(seconds=ONLINE_RESIZE_GRACE_S - 1), now)
    assert restart_to_finish(now - dt.timedelta(seconds=ONLINE_RESIZE_GRACE_S), now)
    assert restart_to_finish(None, now)
