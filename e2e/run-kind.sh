#!/usr/bin/env bash
# Run the e2e suite on a kind cluster: create it, build and load the image, install ZooKeeper and the
# chart, run tests/cluster against it. Needs docker (or podman) and kind; these machines have neither,
# so CI runs the same suite against the local control plane instead (make test).
set -euo pipefail
cd "$(dirname "$0")/.."
for tool in docker kind helm kubectl; do
  command -v "$tool" >/dev/null || { echo "e2e: $tool is missing; install it to run the kind suite" >&2; exit 1; }
done
cluster=${KIND_CLUSTER:-zeps-e2e}
kind create cluster --name "$cluster" --config e2e/kind.yaml
trap 'kind delete cluster --name "$cluster"' EXIT
docker build -t ghcr.io/zeps-dev/zeps:0.1.0 .
kind load docker-image ghcr.io/zeps-dev/zeps:0.1.0 --name "$cluster"
helm install zeps charts/zeps --namespace zeps --create-namespace --set zookeeper.ensemble.enabled=true --wait --timeout 5m
ZEPS_E2E_KUBECONFIG="$(kind get kubeconfig-path --name "$cluster" 2>/dev/null || echo "$HOME/.kube/config")" \
  .venv/bin/python -m pytest e2e -q
