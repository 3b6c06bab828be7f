#!/usr/bin/env bash
# Submit a pipeline job from outside the cluster (a laptop, a CI machine) in client mode: the driver
# runs here, 2 executors run in pods. By default the audit job: revenue per country over the first
# THROUGH sequences of the ZepsStream `orders` (pipeline.py totals). What it needs:
#
#   KUBECONFIG    the cluster; Spark's Kubernetes client reads it, and the driver resolves `orders`
#                 through it (its user must create pods in NAMESPACE and get zepsstreams)
#   DRIVER_HOST   an address of this machine that pods can reach; the driver listens there, and the
#                 executors connect to it. On kind: the gateway of the `kind` Docker network
#                 (docker network inspect kind -f '{{(index .IPAM.Config 0).Gateway}}')
#   IMAGE         the zeps Spark image for the executors (`make e2e` builds zeps-spark:<version>-<hash>)
#   NAMESPACE     where `orders` and the executor pods are (default: default)
#   THROUGH       the last sequence to read (default 10000)
#   REPEAT        how many times to read the range, with a rate line each (default 1)
#
# The executors use executor-pod-template.yaml (no ServiceAccount token), which mounts the claim of
# checkpoints-pvc.yaml: apply it in NAMESPACE first.
# This machine needs Java 17 and the same Python minor version as the image (3.11), with
# `pip install 'zeps[spark,kubernetes]'`, as the first `python3` on PATH (an activated venv): Spark
# starts Python workers by one name on both sides (spark.pyspark.python), the driver's to plan the
# zeps data source, the executors' (/opt/zeps/bin/python3 in the image) to read. The executors get the
# broker's endpoint (a cluster DNS name) from the driver; the driver itself talks only to the API server.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
: "${DRIVER_HOST:?set DRIVER_HOST to an address of this machine that pods can reach}"
: "${IMAGE:?set IMAGE to the zeps Spark image}"
namespace=${NAMESPACE:-default}
api=$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}')
export ZEPS_NAMESPACE=$namespace
exec spark-submit \
  --master "k8s://$api" \
  --deploy-mode client \
  --name zeps-pipeline-totals \
  --conf spark.kubernetes.namespace="$namespace" \
  --conf spark.driver.host="$DRIVER_HOST" \
  --conf spark.driver.bindAddress="$DRIVER_HOST" \
  --conf spark.kubernetes.container.image="$IMAGE" \
  --conf spark.kubernetes.container.image.pullPolicy=IfNotPresent \
  --conf spark.kubernetes.executor.podNamePrefix=zeps-totals \
  --conf spark.kubernetes.executor.podTemplateFile="$here/executor-pod-template.yaml" \
  --conf spark.executor.instances=2 \
  --conf spark.executor.cores=1 \
  --conf spark.executor.memory=768m \
  --conf spark.kubernetes.executor.request.cores=250m \
  --conf spark.pyspark.python=python3 \
  --conf spark.pyspark.driver.python=python3 \
  --conf spark.sql.shuffle.partitions=4 \
  "$here/pipeline.py" totals --through "${THROUGH:-10000}" --repeat "${REPEAT:-1}"
