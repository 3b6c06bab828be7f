#!/usr/bin/env bash
# Idempotent setup for `make test`, `make demo` and `make lint`. Components (default: all):
#   python     — .venv with the pinned dependencies (pyproject.toml + constraints.txt); pyzmq is built
#                against Debian's libzmq (libzmq3-dev), which has PGM and NORM for the multicast output
#                (the PyPI wheels bundle a libzmq without them); iptables for the multicast tests' lossy links.
#                Their wheels are kept in the cache (wheels-<key of the pins>): a new .venv, as a fresh
#                clone makes, is installed from them by uv, offline, in seconds
#   zookeeper  — the pinned ZooKeeper server jars (tools/zookeeper/), needs Java 17 + Maven
#   testbin    — etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kwok, helm
#                and SeaweedFS's weed, built from pinned Go modules (tools/testbin/), needs Go
#   testbin-known — records them in .zeps-env only if they are built already, building nothing
#                (`make test`: its pytest session builds them in the background otherwise)
#   kind       — what `make e2e` adds: kind, kubelet, kubeadm, kube-proxy and CoreDNS from pinned Go
#                modules (tools/testbin/build.sh kind); Docker itself is set up by `make e2e`
#   promtool   — Prometheus's promtool (and server) from Debian's prometheus package, unpacked into the
#                cache (nothing installed, no service started): the alert rules' tests in `make test`
#   bench      — what only the benchmarks need: nats-server built from its pinned Go module (the JetStream baseline)
#                and an optimised weed (ZEPS_WEED: the S3 store's benchmarks)
# Writes .zeps-env (git-ignored): the environment variables that point the harness at the cache.
# Every step says what it does; a missing tool stops setup with one line naming it and the fix.
set -euo pipefail
cd "$(dirname "$0")/.."
say() { printf '[setup] %s\n' "$*" >&2; }
fail() { printf 'setup: %s\n' "$*" >&2; exit 1; }

components=${*:-python zookeeper testbin promtool}
env_file=.zeps-env
touch "$env_file"

set_env() {  # set_env NAME [VALUE]: replace the line for NAME in .zeps-env, or remove it when no VALUE is
  (           # given (two setups may run at once)
    flock 9
    grep -v "^export $1=" "$env_file" > "$env_file.tmp" || true
    [ $# -lt 2 ] || printf 'export %s=%q\n' "$1" "$2" >> "$env_file.tmp"
    mv "$env_file.tmp" "$env_file"
  ) 9>"$env_file.lock"
}

# Debian packages the Python environment and its tests need: libzmq's headers (pyzmq is built against
# Debian's libzmq: PGM and NORM), iproute2 and iptables (the multicast tests' network namespaces).
DEBS=(libzmq3-dev iproute2 iptables)

setup_debs() {
  local missing=()
  for pkg in "${DEBS[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  [ ${#missing[@]} -eq 0 ] && return
  command -v apt-get >/dev/null 2>&1 || fail "${missing[*]} missing and apt-get is not available; install them (Debian/Ubuntu package names)"
  say "debs: installing Debian's ${missing[*]}"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"; } >/tmp/zeps-apt.log 2>&1 \
    || fail "apt-get install ${missing[*]} failed (see /tmp/zeps-apt.log); as root: apt-get install ${missing[*]}"
}

# pyzmq built against Debian's libzmq (its pinned version from constraints.txt), unless the one in
# .venv already has PGM and NORM; the build needs a compiler, and pip caches the wheel it makes.
setup_pyzmq() {
  local has='import zmq, sys; sys.exit(not (zmq.has("pgm") and zmq.has("norm") and zmq.has("curve")))'
  .venv/bin/python -c "$has" 2>/dev/null && return
  local pin
  pin=$(grep -i '^pyzmq==' constraints.txt)
  say "python: building $pin against Debian's libzmq (PGM and NORM for the multicast output)"
  if ! .venv/bin/python -m pip install -q --disable-pip-version-check --force-reinstall --no-deps \
      --no-binary pyzmq "$pin" >.venv/pyzmq.log 2>&1; then
    tail -n 15 .venv/pyzmq.log >&2
    fail "building pyzmq against Debian's libzmq failed; full log in .venv/pyzmq.log (needs gcc and libzmq3-dev)"
  fi
  .venv/bin/python -c "$has" || fail "pyzmq in .venv lacks PGM, NORM or CURVE after the build (see .venv/pyzmq.log)"
}

# The key of what .venv installs: the dependency lists of pyproject.toml (not its tools' settings),
# constraints.txt, the Python, and how pyzmq is built. It names the wheelhouse below.
pins_key() {
  "$1" - <<'PY'
import hashlib, json, subprocess, sys, tomllib
project = tomllib.load(open("pyproject.toml", "rb"))
lists = [project["build-system"], project["project"].get("dependencies"), project["project"].get("optional-dependencies")]
text = json.dumps(lists, sort_keys=True) + open("constraints.txt").read() + sys.version + "pyzmq on Debian's libzmq"
text += subprocess.run(["dpkg-query", "-W", "-f=${Version}", "libzmq3-dev"], capture_output=True, text=True).stdout
print(hashlib.sha256(text.encode()).hexdigest()[:16])
PY
}

# The wheels of every pinned dependency, of the build backend and of uv (its pin is in
# constraints.txt), made once per key with pip (its cache holds the downloads; pyzmq built here
# against Debian's libzmq) into <cache>/wheels-<key>; the two newest wheelhouses are kept.
setup_wheelhouse() {
  local py=$1 key=$2 cache dir tmp
  cache=${ZEPS_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/zeps}
  dir="$cache/wheels-$key"
  mkdir -p "$cache"
  (
    flock 9
    if [ ! -f "$dir/.complete" ]; then
      say "python: the pinned dependencies' wheels into $dir (once per pin set; pyzmq built against Debian's libzmq)"
      tmp=$(mktemp -d "$cache/wheels-tmp.XXXXXX")
      "$py" -m venv "$tmp/pip" >/dev/null 2>&1 || { rm -rf "$tmp"; fail "could not create a virtualenv; install python3-venv (apt-get install python3-venv)"; }
      if ! "$tmp/pip/bin/python" -m pip wheel -q --disable-pip-version-check --no-binary pyzmq -c constraints.txt \
          -w "$tmp/wheels" '.[operator,spark,dev,bench,s3,docs]' hatchling editables uv >"$cache/wheels-$key.log" 2>&1; then
        tail -n 15 "$cache/wheels-$key.log" >&2; rm -rf "$tmp"
        fail "pip wheel failed; full log in $cache/wheels-$key.log"
      fi
      rm -f "$tmp"/wheels/zeps-*.whl  # the project itself is installed editable from the checkout
      rm -rf "$dir" && mv "$tmp/wheels" "$dir" && rm -rf "$tmp" && touch "$dir/.complete"
    fi
    touch "$dir"
    # older pin sets' wheelhouses and uv's caches of them: the two newest stay (a .venv installed from
    # one keeps its files: uv links them)
    find "$cache" -maxdepth 1 -name 'wheels-*' -type d ! -name 'wheels-tmp.*' -printf '%T@ %f\n' \
      | sort -rn | tail -n +3 | cut -d' ' -f2- | sed 's/^wheels-//' \
      | while read -r old; do rm -rf "$cache/wheels-$old" "$cache/uv-$old" "$cache/wheels-$old.log"; done
  ) 9>"$cache/wheels.lock" || exit 1
  printf '%s\n' "$dir"
}

setup_python() {
  local py=${PYTHON:-python3}
  command -v "$py" >/dev/null 2>&1 || fail "Python 3.11+ is missing; install python3 (apt-get install python3 python3-venv)"
  "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))' \
    || fail "Python 3.11 or newer is needed, found $("$py" -V 2>&1); set PYTHON=/path/to/python3.11"
  setup_debs
  local pins key wheels cache
  pins=$(pins_key "$py") || fail "could not read pyproject.toml and constraints.txt for their key (above)"
  wheels=$(setup_wheelhouse "$py" "$pins")  # the images' wheels come from it too
  # .venv again when anything of pyproject.toml changes (its scripts, its packages), not only the pins
  key=$(cat pyproject.toml <(echo "$pins") | sha256sum | cut -c1-16)
  if [ -f .venv/.installed ] && [ "$(cat .venv/.installed)" = "$key" ]; then
    say "python: .venv up to date"
    set_env ZEPS_WHEELHOUSE "$wheels"
    compile_sources
    return
  fi
  if [ ! -x .venv/bin/python ]; then
    say "python: creating .venv with $("$py" -V)"
    "$py" -m venv .venv >/dev/null 2>&1 || { rm -rf .venv; fail "could not create a virtualenv; install python3-venv (apt-get install python3-venv)"; }
  fi
  rm -f .venv/.installed
  say "python: installing the pinned dependencies into .venv from $wheels (uv, offline)"
  cache=${ZEPS_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/zeps}
  if ! { .venv/bin/python -m pip install -q --disable-pip-version-check --no-index --find-links "$wheels" \
           -c constraints.txt uv \
         && UV_CACHE_DIR="$cache/uv-$pins" .venv/bin/uv pip install -q --offline --no-index --find-links "$wheels" \
           --compile-bytecode --python .venv/bin/python -c constraints.txt -e '.[operator,spark,dev,bench,s3,docs]'; } \
         >.venv/pip.log 2>&1; then
    tail -n 15 .venv/pip.log >&2
    fail "installing into .venv failed; full log in .venv/pip.log"
  fi
  setup_pyzmq
  set_env ZEPS_WHEELHOUSE "$wheels"
  compile_sources
  echo "$key" > .venv/.installed
  say "python: ready"
}

# The checkout's own modules compiled to bytecode (their __pycache__ is git-ignored), as the installed
# packages are (uv --compile-bytecode): where PYTHONDONTWRITEBYTECODE is set, as in CI, Python would
# otherwise compile every one from source in every process (a broker's start: 0.8 s of CPU against
# 0.55). Only the files changed since are compiled again; a file edited later is read from its source.
compile_sources() {
  .venv/bin/python -m compileall -q sdk operator devtools >/dev/null \
    || fail "compiling the sources to bytecode failed: .venv/bin/python -m compileall sdk operator devtools"
}

setup_compiled() {  # the hot path compiled with mypyc (zeps._compiled), cached by a hash of its sources
  [ -x .venv/bin/python ] || fail "compiled: run tools/setup.sh python first"
  say "compiled: the hot path built with mypyc (about 80 s when its sources changed, else cached)"
  local dir
  dir=$(.venv/bin/python -m zeps_dev.compiled) || fail "compiled: mypyc failed (above); the pure-Python modules still work: unset ZEPS_COMPILED in .zeps-env to use them"
  set_env ZEPS_COMPILED "$dir"
  say "compiled: $dir"
}

setup_zookeeper() {
  local home
  home=$(tools/zookeeper/fetch.sh)
  set_env ZEPS_ZOOKEEPER_HOME "$home"
}

# The test binaries' Go builds (minutes on a new machine, CPU-bound) start before the other steps
# and run beside the Python and ZooKeeper ones (mostly downloads); setup_testbin waits for them.
testbin_pid=""
testbin_out=""
start_testbin() {
  testbin_out=$(mktemp -d)
  tools/testbin/build.sh >"$testbin_out/stdout" 2>"$testbin_out/stderr" &
  testbin_pid=$!
}
stop_testbin() {  # on any exit before it was waited for: no build outlives setup
  if [ -n "$testbin_pid" ] && kill -0 "$testbin_pid" 2>/dev/null; then
    pkill -TERM -P "$testbin_pid" 2>/dev/null || true
    kill "$testbin_pid" 2>/dev/null || true
  fi
  [ -z "$testbin_out" ] || rm -rf "$testbin_out"
}
trap stop_testbin EXIT

setup_testbin() {
  local bin rc=0
  [ -n "$testbin_pid" ] || start_testbin
  wait "$testbin_pid" || rc=$?
  testbin_pid=""
  cat "$testbin_out/stderr" >&2
  [ "$rc" -eq 0 ] || fail "building the test binaries failed (above)"
  bin=$(tail -n 1 "$testbin_out/stdout")
  set_env ZEPS_TESTBIN "$bin"
}

setup_testbin_known() {  # ZEPS_TESTBIN only if its pinned binaries are built; else make test's pytest builds them in its background
  local bin rc=0 err
  err=$(mktemp)
  bin=$(tools/testbin/build.sh test --if-built 2>"$err") || rc=$?
  case "$rc" in
    0) set_env ZEPS_TESTBIN "$bin" ;;
    3) say "testbin: not built for these pins yet; the test session builds them in its background"
       set_env ZEPS_TESTBIN ;;
    *) cat "$err" >&2; rm -f "$err"; exit "$rc" ;;  # build.sh named what is missing (Go)
  esac
  rm -f "$err"
}

setup_kind() {
  local bin
  bin=$(tools/testbin/build.sh kind)
  set_env ZEPS_KINDBIN "$bin"
}

setup_promtool() {
  # The .deb is only unpacked (dpkg-deb -x): no service, no user, no files outside the cache. The folder
  # is named by the package version apt offers, so an update (deb12u2) unpacks anew.
  command -v apt-get >/dev/null 2>&1 || fail "promtool: apt-get is not available; install Prometheus's promtool 2.4x and set ZEPS_PROMTOOL to it"
  local version dir cache
  cache=${ZEPS_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/zeps}
  version=$(apt-cache policy prometheus 2>/dev/null | awk '/Candidate:/ {print $2}')
  if [ -z "$version" ] || [ "$version" = "(none)" ]; then
    apt-get update -qq >/tmp/zeps-apt.log 2>&1 || fail "apt-get update failed (see /tmp/zeps-apt.log)"
    version=$(apt-cache policy prometheus 2>/dev/null | awk '/Candidate:/ {print $2}')
  fi
  [ -n "$version" ] && [ "$version" != "(none)" ] || fail "promtool: Debian's prometheus package is not available here"
  dir="$cache/prometheus-$(echo "$version" | tr -c 'A-Za-z0-9.+\n-' '_')"
  if [ ! -f "$dir/.complete" ]; then
    say "promtool: unpacking Debian's prometheus $version (promtool for the alert rules' tests)"
    rm -rf "$dir" && mkdir -p "$dir/deb"
    (cd "$dir/deb" && apt-get download "prometheus=$version" >/tmp/zeps-apt.log 2>&1) \
      || fail "apt-get download prometheus=$version failed (see /tmp/zeps-apt.log)"
    dpkg-deb -x "$dir"/deb/prometheus_*.deb "$dir/root" || fail "dpkg-deb -x of the prometheus package failed"
    rm -rf "$dir/deb"
    "$dir/root/usr/bin/promtool" --version >/dev/null 2>&1 || fail "the unpacked promtool does not run ($dir)"
    touch "$dir/.complete"
  fi
  set_env ZEPS_PROMTOOL "$dir/root/usr/bin/promtool"
}

setup_bench() {  # nats-server from its pinned Go module (tools/testbin/nats-server): the JetStream baseline;
  # and an optimised weed (the test set's is built without optimisation), for the S3 store's benchmarks
  local bin
  bin=$(tools/testbin/build.sh bench) || fail "building nats-server or weed failed (above)"
  "$bin/nats-server" --version >/dev/null 2>&1 || fail "the built nats-server does not run ($bin)"
  "$bin/weed" version >/dev/null 2>&1 || fail "the built weed does not run ($bin)"
  set_env ZEPS_NATS_SERVER "$bin/nats-server"
  set_env ZEPS_WEED "$bin/weed"
}

case " $components " in *" testbin "*) start_testbin ;; esac
for c in $components; do
  case "$c" in
    python) setup_python ;;
    zookeeper) setup_zookeeper ;;
    testbin) setup_testbin ;;
    testbin-known) setup_testbin_known ;;
    kind) setup_kind ;;
    promtool) setup_promtool ;;
    bench) setup_bench ;;
    compiled) setup_compiled ;;
    *) fail "unknown setup component '$c' (python, zookeeper, testbin, testbin-known, promtool, kind, bench, compiled)" ;;
  esac
done
