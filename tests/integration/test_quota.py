"""Per-namespace ZooKeeper quotas (:mod:`zeps.coordination.quota`) on the real server, which every
test server runs with ``-Dzookeeper.enforceQuota=true``: a tenant past its quota is refused with a
zeps error that says what to do and loses nothing it stored; other namespaces go on; a raised quota
takes effect at once; once the operator protected the quotas, no tenant can lift its own or set one
on another namespace."""

from __future__ import annotations

import pytest
from kazoo.exceptions import NoAuthError

from harness import OPERATOR_AUTH, ZooKeeperHarness
from zeps.coordination import digest_acl
from zeps.coordination.admin import ensure_quota
from zeps.coordination.queue import WorkQueue
from zeps.coordination.quota import QUOTA_ROOT, Quota, read_quota
from zeps.errors import QuotaExceededError
from zeps.options import QueueOptions


def _queue(zookeeper: ZooKeeperHarness, namespace: str) -> WorkQueue:
    queue = WorkQueue(zookeeper.client(), "work", namespace=namespace, chroot=zookeeper.root,
                      options=QueueOptions.make())  # fmt: skip
    queue.ensure()
    return queue


def test_a_namespace_past_its_node_quota_is_refused_clearly_and_the_others_go_on(zookeeper: ZooKeeperHarness) -> None:
    admin = zookeeper.client(auth=OPERATOR_AUTH)
    tenant = f"{zookeeper.root}/tenant-a"
    work = _queue(zookeeper, "tenant-a")
    used = read_quota(admin, tenant)
    assert used is None, "no quota before the operator sets one"
    assert ensure_quota(admin, tenant, nodes=40, size=0, acl=digest_acl(*OPERATOR_AUTH))
    assert not ensure_quota(admin, tenant, nodes=40, size=0, acl=digest_acl(*OPERATOR_AUTH)), "set once"
    stored = []
    with pytest.raises(QuotaExceededError, match=r"QuotaExceeded.*namespaceQuota.*Free room"):
        for i in range(100):  # bounded: the quota stops it long before
            work.put(b"item-%d" % i)
            stored.append(b"item-%d" % i)
    quota, usage = read_quota(admin, tenant) or (None, None)
    assert quota == Quota(40, 0) and usage is not None and usage.nodes <= 40
    # the others go on
    other = _queue(zookeeper, "tenant-b")
    other.put_all([b"b-%d" % i for i in range(100)])
    assert other.stats().depth == 100
    # at the quota nothing of the namespace is written, a worker's lock included: the cluster admin
    # raises it, and what was stored is all there
    assert ensure_quota(admin, tenant, nodes=200, size=0, acl=digest_acl(*OPERATOR_AUTH))
    taken = []
    while item := work.take(timeout=0.5):
        taken.append(item.body)
        item.ack()
    assert sorted(taken) == sorted(stored) and stored


def test_a_namespace_past_its_byte_quota_is_refused(zookeeper: ZooKeeperHarness) -> None:
    admin = zookeeper.client(auth=OPERATOR_AUTH)
    work = _queue(zookeeper, "tenant-c")
    ensure_quota(admin, f"{zookeeper.root}/tenant-c", nodes=0, size=64 * 1024, acl=digest_acl(*OPERATOR_AUTH))
    work.put(bytes(16 * 1024))
    with pytest.raises(QuotaExceededError):
        for _ in range(10):  # 160 KiB against 64 KiB: refused on the way
            work.put(bytes(16 * 1024))


def test_tenants_cannot_lift_change_or_set_quotas_once_the_operator_protected_them(
    zookeeper: ZooKeeperHarness,
) -> None:
    admin = zookeeper.client(auth=OPERATOR_AUTH)
    ensure_quota(admin, f"{zookeeper.root}/tenant-d", nodes=1000, size=0, acl=digest_acl(*OPERATOR_AUTH))
    limits = f"{QUOTA_ROOT}{zookeeper.root}/tenant-d/zookeeper_limits"
    tenant = zookeeper.client(auth=("tenant-d", "its-password"))
    nobody = zookeeper.client()
    for client in (tenant, nobody):
        with pytest.raises(NoAuthError):
            client.delete(limits)  # lift it
        with pytest.raises(NoAuthError):
            client.set(limits, b"count=-1,bytes=-1,countHardLimit=1000000,byteHardLimit=-1")  # raise it
        with pytest.raises(NoAuthError):  # a tiny quota on another namespace's path
            client.create(f"{QUOTA_ROOT}{zookeeper.root}/tenant-e/zookeeper_limits", b"count=-1,bytes=-1,"
                          b"countHardLimit=1,byteHardLimit=-1", makepath=True)  # fmt: skip
        with pytest.raises(NoAuthError):
            client.create(f"{QUOTA_ROOT}/elsewhere")
    assert client.get(limits)[0].endswith(b"countHardLimit=1000,byteHardLimit=-1"), "everyone may read it"
