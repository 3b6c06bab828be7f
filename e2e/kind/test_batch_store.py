"""A batch Queue whose batches are in S3-compatible object storage, on kind: SeaweedFS in a pod (its
image built here from the pinned module), a publisher pod writing through ``zeps.batches()``, which
reads the Queue's storeCredentialsSecret itself (RBAC real: refused, then allowed), and a Spark job
whose executor pods, one per worker node, read the batches back from the store with the Secret as
their environment: exact totals. Nothing is mocked."""

from __future__ import annotations

import json
import os
import secrets
from typing import Any

from kindapp import SEAWEEDFS_IMAGE, App, json_lines, seaweedfs

from harness import TEST_JVM_OPTIONS

SPARK_IMAGE = os.environ.get("ZEPS_E2E_SPARK_IMAGE", "")
BUCKET = "zeps-batches"
BATCHES, PER_BATCH = 30, 1000  # small batches: records "1".."30000"
BIG = 3  # then one batch of BIG records of 4 MiB: 12 MiB, uploaded in parts

PUBLISHER = f"""
import zeps
from zeps.batchstore import BatchStoreError
q = zeps.batches("ledger")

def publish(records):
    for attempt in range(10):  # the server's first write into a bucket waits for its volumes to grow
        try:
            return q.publish(records)
        except BatchStoreError as exc:
            print("retrying:", exc, flush=True)
    raise SystemExit("the store kept refusing")

for n in range({BATCHES}):
    print(publish([b"%d" % v for v in range(n * {PER_BATCH} + 1, (n + 1) * {PER_BATCH} + 1)]), flush=True)
print(publish([b"x" * (4 << 20)] * {BIG}), flush=True)
"""

READER = """
import json, os
from pyspark.sql import SparkSession, functions as F
from pyspark.sql.types import StringType
from zeps.spark import ZepsDataSource

spark = SparkSession.builder.getOrCreate()
spark.dataSource.register(ZepsDataSource)
node = F.udf(lambda: os.environ["NODE_NAME"], StringType()).asNondeterministic()  # the executor's node
rows = spark.read.format("zeps").option("queue", "ledger").load().select(
    "batch", F.length("record").alias("size"), F.col("record").cast("string").alias("text"), node().alias("node"))
rows.cache()
small = rows.where(F.col("size") < 100).agg(F.count("*").alias("n"), F.sum(F.col("text").cast("long")).alias("s"))
big = rows.where(F.col("size") >= 100).groupBy("size").count().collect()
nodes = {r["node"]: r["count"] for r in rows.groupBy("node").count().collect()}
first = small.collect()[0]
print(json.dumps({"records": first["n"], "sum": first["s"], "big": {str(r["size"]): r["count"] for r in big},
                  "nodes": nodes}), flush=True)
"""


def _executor_template(app: App) -> None:
    """What Spark adds to each executor pod: the node it runs on (to report), the store's credentials
    from the Queue's Secret, no Kubernetes token, and one executor per node."""
    template = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"labels": {"app": "ledger-report"}},
        "spec": {
            "automountServiceAccountToken": False,
            "securityContext": {"runAsNonRoot": True, "runAsUser": 185},
            "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
                "labelSelector": {"matchLabels": {"app": "ledger-report", "spark-role": "executor"}},
                "topologyKey": "kubernetes.io/hostname"}]}},
            "containers": [{"name": "spark-kubernetes-executor",
                            "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
                            "envFrom": [{"secretRef": {"name": "ledger-s3"}}]}],
        },
    }  # fmt: skip
    app.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ledger-report"},
               "data": {"executor.yaml": json.dumps(template), "report.py": READER}})  # fmt: skip


def _driver(app: App) -> dict[str, Any]:
    confs = {
        "spark.kubernetes.namespace": "$(POD_NAMESPACE)", "spark.kubernetes.driver.pod.name": "$(POD_NAME)",
        "spark.driver.host": "$(POD_IP)", "spark.driver.bindAddress": "$(POD_IP)",
        "spark.kubernetes.container.image": SPARK_IMAGE, "spark.kubernetes.container.image.pullPolicy": "IfNotPresent",
        "spark.kubernetes.executor.podTemplateFile": "/job/executor.yaml",
        "spark.kubernetes.executor.podNamePrefix": "ledger-report", "spark.executor.instances": "3",
        "spark.executor.cores": "1", "spark.executor.memory": "768m",
        "spark.kubernetes.executor.request.cores": "250m", "spark.scheduler.minRegisteredResourcesRatio": "1.0",
        "spark.scheduler.maxRegisteredResourcesWaitingTime": "240s",
        "spark.driver.extraJavaOptions": TEST_JVM_OPTIONS,
        "spark.executor.extraJavaOptions": TEST_JVM_OPTIONS,
    }  # fmt: skip
    args = ["spark-submit", "--master=k8s://https://kubernetes.default.svc", "--deploy-mode=client",
            "--name=ledger-report", *(f"--conf={k}={v}" for k, v in confs.items()), "/job/report.py"]  # fmt: skip
    env = [{"name": n, "valueFrom": {"fieldRef": {"fieldPath": f}}}
           for n, f in (("POD_NAME", "metadata.name"), ("POD_NAMESPACE", "metadata.namespace"),
                        ("POD_IP", "status.podIP"))]  # fmt: skip
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "ledger-report", "labels": {"spark-role": "driver"}},
        "spec": {
            "serviceAccountName": "spark-driver", "restartPolicy": "Never",
            "securityContext": {"runAsNonRoot": True, "runAsUser": 185, "fsGroup": 185},
            "containers": [{"name": "driver", "image": SPARK_IMAGE, "imagePullPolicy": "IfNotPresent", "args": args,
                            "env": env,
                            "resources": {"requests": {"cpu": "250m", "memory": "1Gi"}},
                            "volumeMounts": [{"name": "job", "mountPath": "/job"}]}],
            "volumes": [{"name": "job", "configMap": {"name": "ledger-report"}}],
        },
    }  # fmt: skip


def _may_read_secret(app: App, service_account: str, secret: str) -> None:
    """A Role letting ``service_account`` get that one Secret (what ``zeps.batches()`` needs to read a
    Queue's credentials Secret itself)."""
    rule = {"apiGroups": [""], "resources": ["secrets"], "resourceNames": [secret], "verbs": ["get"]}
    app.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": f"read-{secret}"},
               "rules": [rule]})  # fmt: skip
    app.apply({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
               "metadata": {"name": f"read-{secret}"},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": f"read-{secret}"},
               "subjects": [{"kind": "ServiceAccount", "name": service_account}]})  # fmt: skip


def test_spark_executors_on_three_nodes_read_a_batch_queue_stored_in_s3(cluster: Any, app: App) -> None:
    """The publisher pod has no credentials in its environment: ``zeps.batches()`` reads the Queue's
    storeCredentialsSecret as its ServiceAccount (a Role allows that one Secret; without it the pod
    fails, naming the permission to grant). The executors, which have no Kubernetes access, get the
    Secret with envFrom."""
    assert SEAWEEDFS_IMAGE and SPARK_IMAGE, "make e2e builds the SeaweedFS and Spark images"
    key, secret = "zeps-ledger", secrets.token_hex(16)
    seaweedfs(app, BUCKET, key, secret)
    store = {"inlineMaxBytes": 1024, "storeUrl": f"s3://{BUCKET}/ledger",
             "storeEndpoint": f"http://seaweedfs.{app.ns}.svc:8333", "storeCredentialsSecret": "ledger-s3"}  # fmt: skip
    app.apply({"apiVersion": "zeps.dev/v1alpha1", "kind": "Queue", "metadata": {"name": "ledger"},
               "spec": {"mode": "batches", "batches": store}})  # fmt: skip
    app.ready("queue", "ledger")
    app.apply({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "ledger-s3"},
               "stringData": {"AWS_ACCESS_KEY_ID": key, "AWS_SECRET_ACCESS_KEY": secret}})  # fmt: skip

    app.apply({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ledger-publisher"},
               "data": {"publisher.py": PUBLISHER}})  # fmt: skip

    def publisher(name: str) -> None:
        spec = App.pod_spec("exec python /job/publisher.py")
        spec["containers"][0]["volumeMounts"] = [{"name": "job", "mountPath": "/job"}]
        spec["volumes"] = [{"name": "job", "configMap": {"name": "ledger-publisher"}}]
        app.apply({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec})

    publisher("ledger-forbidden")  # the examples' zeps-client ServiceAccount may not read Secrets
    cluster.wait_for("the forbidden publisher to fail", lambda: app.get("pod", "ledger-forbidden")["status"].get(
        "phase") == "Failed", timeout=180)  # fmt: skip
    assert "grant get on secrets (resourceNames: [ledger-s3])" in app.logs("ledger-forbidden")
    _may_read_secret(app, "zeps-client", "ledger-s3")
    publisher("ledger-publisher")
    published = [line for line in app.wait_succeeded("ledger-publisher", timeout=300).splitlines()
                 if line.startswith("ledger-")]  # fmt: skip
    assert published == [f"ledger-{n}" for n in range(1, BATCHES + 2)], "ids are linear, each batch once"

    app.apply_example("spark/driver-rbac.yaml")
    _executor_template(app)
    app.apply(_driver(app))
    report = json_lines(app.wait_succeeded("ledger-report", timeout=600))
    assert report, "the Spark job printed no result"
    result = report[-1]
    count = BATCHES * PER_BATCH
    assert (result["records"], result["sum"]) == (count, count * (count + 1) // 2), "every record read once"
    assert result["big"] == {str(4 << 20): BIG}, "the batch uploaded in parts read back whole"
    assert len(result["nodes"]) >= 2, f"executors on different nodes read the batches: {result['nodes']}"
    print("\nFIGURE " + json.dumps({"what": "batch queue on S3, Spark on kind", "nodes": result["nodes"]}), flush=True)
