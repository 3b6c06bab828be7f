#!/usr/bin/env bash
# Build binaries from the pinned Go modules beside this script into a cache directory outside the
# repository. Two sets:
#   test (default)  the cluster tier of `make test`: etcd, kube-apiserver, kube-controller-manager,
#                   kube-scheduler, kubectl, kwok, helm; and SeaweedFS's weed (the batch stores' S3 server)
#   kind            what `make e2e` adds for a kind cluster built here: kind, kubelet, kubeadm,
#                   kube-proxy, CoreDNS and kube-router (the node image and its images; kube-router
#                   enforces NetworkPolicy), and the CSI driver and sidecars of the node's
#                   StorageClasses, whose volumes can grow (zeps-csi-hostpath)
#   bench           what only the benchmarks need: nats-server (JetStream, their baseline) and an
#                   optimised weed (the test set's is built without optimisation: see gcflags below)
#
# Each module is rebuilt only when its go.mod/go.sum, its own Go programs (a main.go beside go.mod),
# its target list or the Go version change: the output folder is named by a hash of those, and a
# binary set is trusted only once the ".complete" stamp is written (an interrupted build leaves
# nothing the next run trusts). The bin-<hash> folder
# of symlinks is per set of pins, so checkouts with different pins never overwrite each other's.
#
# Prints the directory holding the binaries on its last line. With a second argument --if-built it
# builds nothing: it prints that directory if every module of the set is built, else exits 3 (so
# `make test` knows whether to build them in its background; see devtools/zeps_dev/testbin.py).
set -euo pipefail
set_name=${1:-test}
if_built=${2:-}
here=$(cd "$(dirname "$0")" && pwd)
cache=${ZEPS_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/zeps}
say() { printf '[testbin] %s\n' "$*" >&2; }
# Stopped (SIGTERM, SIGINT: CI's end, or the end of the test session that started it, whatever way it
# ended), it stops the go build it waits for at once: bash runs a trap only between commands, so each
# go build runs in the background and is waited for
building=""
trap 'trap - TERM INT; [ -z "$building" ] || kill -TERM "$building" 2>/dev/null; exit 143' TERM INT

command -v go >/dev/null 2>&1 || {
  echo "setup: Go is missing; install Go >= 1.24 (https://go.dev/doc/install or 'apt-get install golang') — it builds the test control plane" >&2
  exit 1
}
goversion=$(go env GOVERSION)
keys=""

# build name -> the module directory beside this script, and the packages it builds from it
# (kwok, kube-router and the CSI programs are built from the Kubernetes module: one version of each
# library they share with Kubernetes, so what one build compiled the next finds in Go's build cache)
declare -A module=([etcd]=etcd [k8s]=k8s [kwok]=k8s [helm]=helm [k8s-node]=k8s [kind]=kind [coredns]=coredns [kube-router]=k8s [seaweedfs]=seaweedfs [seaweedfs-optimised]=seaweedfs [nats-server]=nats-server [csi]=k8s)
declare -A targets=(
  [etcd]="."
  [k8s]="k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl"
  [kwok]="sigs.k8s.io/kwok/cmd/kwok"
  [helm]="helm.sh/helm/v3/cmd/helm"
  [k8s-node]="k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kubeadm k8s.io/kubernetes/cmd/kube-proxy"
  [kind]="sigs.k8s.io/kind"
  [coredns]="."
  [kube-router]="github.com/cloudnativelabs/kube-router/v2/cmd/kube-router"
  [seaweedfs]="github.com/seaweedfs/seaweedfs/weed"
  [seaweedfs-optimised]="github.com/seaweedfs/seaweedfs/weed"
  [nats-server]="github.com/nats-io/nats-server/v2"
  [csi]="github.com/kubernetes-csi/external-provisioner/v5/cmd/csi-provisioner github.com/kubernetes-csi/external-resizer/cmd/csi-resizer ./zeps-csi-hostpath"
)
case "$set_name" in
  test) builds="etcd k8s kwok helm seaweedfs" ;;
  kind) builds="etcd k8s kwok helm seaweedfs k8s-node kind coredns kube-router csi" ;;
  bench) builds="nats-server seaweedfs-optimised" ;;
  *) echo "setup: unknown binary set '$set_name' (test, kind, bench)" >&2; exit 2 ;;
esac

# Version stamps, as the projects' own release builds set them (from the pins above, not repeated):
# without them kube-apiserver reports v0.0.0-master and helm renders charts for Kubernetes 1.20.
# pinned MODULE_DIR MODULE: the version go.mod requires, on a require line of its own or in a block
pinned() {
  local version
  version=$(awk -v m="$2" '($1 == "require" && $2 == m) {print $3; exit} ($1 == m && $2 ~ /^v/) {print $2; exit}' "$here/$1/go.mod")
  [ -n "$version" ] || { echo "setup: tools/testbin/$1/go.mod does not require $2" >&2; exit 1; }
  echo "$version"
}
k8s_version=$(pinned k8s k8s.io/kubernetes)
helm_version=$(pinned helm helm.sh/helm/v3)
k8s_major=$(echo "$k8s_version" | cut -d. -f1 | tr -d v)
k8s_minor=$(echo "$k8s_version" | cut -d. -f2)
stamp() { for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  printf -- '-X %s.gitVersion=%s -X %s.gitMajor=%s -X %s.gitMinor=%s -X %s.gitTreeState=clean ' \
    "$pkg" "$k8s_version" "$pkg" "$k8s_major" "$pkg" "$k8s_minor" "$pkg"; done; }
declare -A ldflags=(
  [etcd]=""
  [k8s]="$(stamp)"
  [k8s-node]="$(stamp)"
  [kind]=""
  [coredns]=""
  [kube-router]=""
  [seaweedfs]=""
  [seaweedfs-optimised]=""
  [nats-server]=""
  [csi]=""
  [kwok]=""
  [helm]="-X helm.sh/helm/v3/internal/version.version=$helm_version -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=$k8s_major -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$k8s_minor"
)

# No DWARF from the compiler either: the linker drops it (-s -w), so making it was wasted work (a cold
# CoreDNS build: 11% less CPU). Panics still name functions and lines (from the pclntab, not DWARF).
# Without optimisation or inlining (-N -l), about a quarter less CPU to compile (SeaweedFS cold: 348 s
# to 259): the modules that do little at run time (a whole cold `make test` and `make e2e`: weed 9 s
# of CPU, helm 5, CoreDNS 4) and where that saving outweighs the packages they would share with the
# control plane's build (flags differ: nothing is shared). kwok, kube-router and the CSI programs,
# built from the Kubernetes module, find most of their packages compiled by the control plane's build
# and stay optimised, as do the control plane, etcd, the node's binaries and the benchmarks' servers.
# The standard library is compiled once more with these flags.
declare -A unoptimised=([seaweedfs]=1 [coredns]=1 [helm]=1 [kind]=1)

for mod in $builds; do
  dir="$here/${module[$mod]}"
  gcflags="all=-dwarf=false${unoptimised[$mod]:+ -N -l}"
  # its own programs too (CoreDNS's plugin list, etcd's main, the CSI driver); tools.go only pins
  key=$(cat "$dir/go.mod" "$dir/go.sum" $(find "$dir" -name '*.go' ! -name tools.go | LC_ALL=C sort) \
        <(echo "$goversion ${targets[$mod]} ${ldflags[$mod]} $gcflags") | sha256sum | cut -c1-16)
  out="$cache/testbin/$mod-$key"
  if [ "$if_built" = --if-built ]; then  # a check only: no folder made, no lock taken
    [ -f "$out/.complete" ] || exit 3
    keys="$keys $mod-$key"
    continue
  fi
  mkdir -p "$cache/testbin"
  # one build of a module at a time: CI's early Go builds, `make test`'s background build and
  # `make e2e-stack` (all three side by side in CI) build the same modules; a second waits here,
  # then finds the first one's build complete
  exec {lock}>"$out.lock"
  flock "$lock"
  if [ -f "$out/.complete" ]; then
    say "$mod: up to date ($out)"
  else
    say "$mod: building with $goversion (first time takes minutes; cached afterwards)"
    rm -rf "$out" && mkdir -p "$out"
    start=$(date +%s)
    # GOSUMDB=off: the checksum database is not reachable here; go.sum (committed) still verifies every module.
    # GOGC=400: the compiler collects its garbage a quarter as often: less CPU for a little more memory,
    # the same binaries (measured: benchmarks/README.md, CI)
    (cd "$dir" && GOGC=${GOGC:-400} GOSUMDB=off GOFLAGS=-mod=readonly CGO_ENABLED=0 \
       exec go build -trimpath -ldflags="-s -w ${ldflags[$mod]}" -gcflags="$gcflags" -o "$out/" ${targets[$mod]} >"$out.log" 2>&1) &
    building=$!
    if ! wait "$building"; then
      echo "setup: building $mod failed; see $out.log (last lines below)" >&2
      tail -n 15 "$out.log" >&2
      rm -rf "$out"
      exit 1
    fi
    building=""
    touch "$out/.complete"
    say "$mod: built in $(( $(date +%s) - start ))s"
  fi
  exec {lock}>&-
  keys="$keys $mod-$key"
done

bin="$cache/testbin/bin-$(echo "$keys" | sha256sum | cut -c1-16)"
mkdir -p "$bin"
for mk in $keys; do
  for f in "$cache/testbin/$mk"/*; do ln -sfn "$f" "$bin/$(basename "$f")"; done
done
echo "$bin"
