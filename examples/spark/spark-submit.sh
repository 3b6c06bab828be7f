#!/usr/bin/env bash
# Submit examples/spark/pipeline.py to Spark on Kubernetes (the image holds pyspark and zeps).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
spark-submit \
  --master "k8s://${KUBERNETES_API:-https://kubernetes.default.svc}" \
  --deploy-mode cluster \
  --name zeps-pipeline \
  --conf spark.kubernetes.namespace="${NAMESPACE:-shop}" \
  --conf spark.kubernetes.container.image=ghcr.io/zeps-dev/zeps-spark:0.1.0 \
  --conf spark.kubernetes.authenticate.driver.serviceAccountName=spark-driver \
  --conf spark.kubernetes.driver.podTemplateFile="$here/driver-pod-template.yaml" \
  --conf spark.kubernetes.executor.podTemplateFile="$here/executor-pod-template.yaml" \
  --conf spark.executor.instances=2 \
  local:///opt/zeps/examples/spark/pipeline.py
