"""Tenant B's attacks on tenant A, from a pod of B's namespace with B's own ZooKeeper identity (its
``zeps-zookeeper-auth`` Secret, in ``ZEPS_ZOOKEEPER_USER`` / ``_PASSWORD``) and nothing of A's but what
anyone can see (A's namespace, its objects' names, its leader's pod address and its broker's public
key). Arguments: A's namespace, A's stream, A's leader replica, A's queue, the leader's endpoint
(``tcp://ip:port``), A's broker public key (Z85), B's own Topic (how B finds ZooKeeper) and a third
namespace C that has not used zeps yet.

Prints one JSON line: for each attack, what happened (an exception's class name, or what was done).
Runs in the zeps image; every wait is bounded.
"""

import json
import sys
from collections.abc import Callable
from typing import Any

import zmq
from kazoo.security import make_digest_acl

from zeps.config import resolve
from zeps.coordination import connect
from zeps.coordination.quota import QUOTA_ROOT
from zeps.paths import QueuePaths, StreamPaths, TopicPaths
from zeps.protocol import Attach, encode


def outcome(call: Callable[[], object]) -> str:
    """What ZooKeeper answered: "done" or the exception's class name (NoAuthError: refused)."""
    try:
        call()
    except Exception as exc:  # the class name is the answer
        return type(exc).__name__
    return "done"


def zookeeper_attacks(zk: Any, a_ns: str, stream: str, leader: str, queue: str, *, chroot: str) -> dict[str, str]:
    """Every kind of node the operator and A's brokers make, written (and one read) as someone else."""
    s = StreamPaths.of(a_ns, stream, chroot=chroot)
    q = QueuePaths.of(a_ns, queue, chroot=chroot)
    assert s.brokers.manifest is not None
    forged = json.dumps({"epoch": 99, "leader": "evil", "isr": ["evil"]}).encode()
    return {
        "read replication state": outcome(lambda: zk.get(s.replication_state)),
        "rewrite replication state": outcome(lambda: zk.set(s.replication_state, forged)),
        "rewrite manifest": outcome(lambda: zk.set(s.brokers.manifest, b'["evil"]')),
        "rewrite spec": outcome(lambda: zk.set(s.spec, b"{}")),
        "delete leader member": outcome(lambda: zk.delete(s.brokers.member(leader))),
        "add a broker member": outcome(
            lambda: zk.create(s.brokers.member("evil"), b'{"endpoint": "tcp://10.0.0.1:5555"}', ephemeral=True)
        ),
        "jump the election line": outcome(lambda: zk.create(f"{s.election}/evil~x-", ephemeral=True, sequence=True)),
        "add a partition": outcome(lambda: zk.create(f"{s.partitions}/7", makepath=True)),
        "put a queue item": outcome(lambda: zk.create(q.item_prefix(0, "evil"), b"x", sequence=True)),
        "delete the queue": outcome(lambda: zk.delete(q.root, recursive=True)),
        "lift the namespace quota": outcome(lambda: zk.delete(f"{QUOTA_ROOT}{chroot}/{a_ns}/zookeeper_limits")),
    }


def curve_attacks(endpoint: str, server_key: str, stream: str) -> dict[str, str]:
    """A's broker reached directly: attaching as a replica (version 8) with a key of B's own making,
    and without CURVE at all. Either must get no answer: the handshake or the ZAP check refuses it."""
    out = {}
    ctx = zmq.Context()
    for how in ("own CURVE key", "no CURVE"):
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        if how == "own CURVE key":
            public, secret = zmq.curve_keypair()
            sock.setsockopt(zmq.CURVE_SERVERKEY, server_key.encode())
            sock.setsockopt(zmq.CURVE_PUBLICKEY, public)
            sock.setsockopt(zmq.CURVE_SECRETKEY, secret)
        sock.connect(endpoint)
        sock.send(encode(Attach(stream=stream, version=8)))
        out[f"attach with {how}"] = "answered" if sock.poll(10_000) else "no answer"
        sock.close()
    ctx.term()
    return out


def main() -> None:
    a_ns, stream, leader, queue, endpoint, server_key, own_topic, c_ns = sys.argv[1:9]
    mine = resolve("Topic", own_topic, needs=("zookeeper",))
    assert mine.auth is not None, "B's pod has no ZooKeeper identity"
    chroot = mine.chroot
    report: dict[str, object] = {}
    zk = connect(mine.zookeeper, auth=mine.auth, ca=mine.zookeeper_ca)
    anonymous = connect(mine.zookeeper, ca=mine.zookeeper_ca)
    report["as B"] = zookeeper_attacks(zk, a_ns, stream, leader, queue, chroot=chroot)
    report["anonymous"] = zookeeper_attacks(anonymous, a_ns, stream, leader, queue, chroot=chroot)
    # C's root claimed before C uses zeps, with B's ACL (allowed: the operator must take it back)
    acl = [make_digest_acl(*mine.auth, all=True)]
    report["claim C's root"] = outcome(lambda: zk.create(f"{chroot}/{c_ns}", acl=acl))
    report["claim C's topics"] = outcome(lambda: zk.create(f"{chroot}/{c_ns}/topics", acl=acl))
    # B's own Topic's spec node nested past any parser's bound (B may write its own namespace's nodes)
    nested = b"[" * 100_000 + b"]" * 100_000
    report["poison own spec"] = outcome(lambda: zk.set(TopicPaths.of(mine.namespace, own_topic, chroot=chroot).spec,
                                                      nested))  # fmt: skip
    report.update(curve_attacks(endpoint, server_key, stream))
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
