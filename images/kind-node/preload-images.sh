#!/bin/sh
# Import the image archive given as $1 into containerd's k8s.io namespace (content only: unpacked
# on first use), with a containerd started just for this. zeps_dev.images runs it once in a container
# of the node image, with the archive bind-mounted, then commits the container: the archive itself
# never becomes a layer of the node image.
set -eu
containerd --log-level warn >/tmp/containerd.log 2>&1 &
pid=$!
for _ in $(seq 1 100); do ctr version >/dev/null 2>&1 && break; sleep 0.1; done
ctr --namespace=k8s.io images import --all-platforms --no-unpack --digests "$1"
ctr --namespace=k8s.io images list -q
kill "$pid"
wait "$pid" || true
rm -rf /tmp/containerd.log /run/containerd
