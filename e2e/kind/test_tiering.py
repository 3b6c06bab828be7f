"""Tiered storage on kind: a replicated ZepsStream with ``spec.tiering`` (SeaweedFS in a pod as its
S3 store, the credentials a Secret the operator hands to the brokers with envFrom), a publisher Job,
and then quiet. The leader's pod closes its idle segment and uploads it; only the leader uploads; every
replica learns from the manifest in ZooKeeper that the store holds it and deletes it from its volume
(local retention of a second); a reader pod reads every record back from the store, in order, and the
CLI's replay from 0 gets every record through the broker, which serves them from the store. Nothing
is mocked."""

from __future__ import annotations

import json
import secrets
from typing import Any

from kindapp import SEAWEEDFS_IMAGE, App, json_lines, seaweedfs

BUCKET = "zeps-tier"
COUNT, RATE, GROUP = 6000, 300.0, 50  # 20 s of publishing

READER = """
import json, sys
from zeps.batchstore import open_store
from zeps.config import resolve
from zeps.coordination import connect
from zeps.paths import StreamPaths
from zeps.tiering import TierReader

settings = resolve("ZepsStream", "ledger")
zk = connect(settings.zookeeper, auth=settings.auth, ca=settings.zookeeper_ca)
store = open_store(sys.argv[1], endpoint=sys.argv[2])
reader = TierReader(zk, StreamPaths.of(settings.namespace, "ledger", chroot=settings.chroot), store)
reader.refresh()
bodies, at = [], 1
while (chunk := reader.read_chunk(at, max_bytes=1 << 20)) is not None:
    bodies += [r.body.decode() for r in chunk.records()]
    at = chunk.last + 1
print(json.dumps({"records": len(bodies), "in_order": bodies == [str(n) for n in range(1, len(bodies) + 1)]}))
"""


def _metrics(app: App, pod: dict[str, Any]) -> dict[str, float]:
    """The zeps_broker_tier_* and first-sequence samples of a broker pod, scraped from inside it."""
    port = next(p["containerPort"] for p in pod["spec"]["containers"][0]["ports"] if p["name"] == "metrics")
    url = f"http://{pod['status']['podIP']}:{port}/metrics"
    text = app.cluster.kubectl("exec", pod["metadata"]["name"], "-n", app.ns, "--", "python", "-c",
                               f"import urllib.request; print(urllib.request.urlopen('{url}', timeout=30)"
                               ".read().decode())")  # fmt: skip
    out = {}
    for line in str(text).splitlines():
        name = line.split("{", 1)[0]
        if name.startswith(("zeps_broker_tier_", "zeps_broker_first_sequence")) and 'stream="ledger"' in line:
            out[name] = float(line.rsplit(" ", 1)[1])
    return out


def test_a_tiered_stream_s_leader_pod_uploads_every_replica_trims_behind_the_store_and_nothing_is_lost(
    cluster: Any, app: App
) -> None:
    assert SEAWEEDFS_IMAGE, "make e2e builds the SeaweedFS image"
    key, secret = "zeps-tier", secrets.token_hex(16)
    seaweedfs(app, BUCKET, key, secret)
    app.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "tier-s3"},
               "stringData": {"AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": secret}})  # fmt: skip
    endpoint = f"http://seaweedfs.{app.ns}.svc:8333"
    tiering = {"storeUrl": f"s3://{BUCKET}/ledger", "storeEndpoint": endpoint, "storeCredentialsSecret": "tier-s3",
               "segmentIdleSeconds": 3, "localRetention": {"ageSeconds": 1}}  # fmt: skip
    app.apply({"apiVersion": "zeps.dev/v1alpha1", "kind": "ZepsStream", "metadata": {"name": "ledger"},
               "spec": {"replicas": 3, "minInSync": 2, "storage": {"size": "256Mi"}, "fsync": "always",
                        "tiering": tiering}})  # fmt: skip
    app.ready("zepsstream", "ledger", timeout=300)
    app.start_publisher("ledger", COUNT, RATE, GROUP)
    cluster.wait_for(f"the publisher's {COUNT} records confirmed", lambda: app.confirmed_past(COUNT), timeout=300,
                     interval=2)  # fmt: skip
    leader = app.replication("ledger")["leader"]

    def pods() -> dict[str, dict[str, float]]:
        brokers = app.get("pods", "-l", "app.kubernetes.io/instance=ledger")["items"]
        return {p["metadata"]["name"]: _metrics(app, p) for p in brokers}

    def trimmed() -> bool:  # every replica: the store holds all, the volume none of it
        seen = pods()
        done = [m.get("zeps_broker_tier_tiered_to") == COUNT and m.get("zeps_broker_first_sequence", 0) > COUNT
                for m in seen.values()]  # fmt: skip
        return len(seen) == 3 and all(done)

    cluster.wait_for("every replica to learn the store holds every record and to trim its volume", trimmed,
                     timeout=180, interval=3)  # fmt: skip
    seen = pods()
    assert seen[leader].get("zeps_broker_tier_uploads_total", 0) >= 1
    assert all(m.get("zeps_broker_tier_uploads_total", 0) == 0 for name, m in seen.items() if name != leader), seen
    assert seen[leader]["zeps_broker_tier_backlog_bytes"] == 0

    app.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "tier-reader"},
               "data": {"reader.py": READER}})  # fmt: skip
    spec = app.pod_spec(f"exec python /reader/reader.py s3://{BUCKET}/ledger {endpoint}")
    spec["containers"][0]["volumeMounts"] = [{"name": "reader", "mountPath": "/reader"}]
    spec["containers"][0]["envFrom"] = [{"secretRef": {"name": "tier-s3"}}]
    spec["volumes"] = [{"name": "reader", "configMap": {"name": "tier-reader"}}]
    app.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "tier-reader"}, "spec": spec})
    report = json_lines(app.wait_succeeded("tier-reader", timeout=240))[-1]
    print("\nFIGURE " + json.dumps({"tiered": report, "leader": leader}), flush=True)
    assert report == {"records": COUNT, "in_order": True}

    # the CLI's replay from 0, through the leader, which serves the store's part itself
    app.run_pod("replayer", f"exec zeps --json stream replay ledger --since 0 --count {COUNT} --timeout 120")
    replayed = [m["body"] for m in json_lines(app.wait_succeeded("replayer", timeout=240))]
    assert replayed == [str(n) for n in range(1, COUNT + 1)], f"{len(replayed)} replayed"
