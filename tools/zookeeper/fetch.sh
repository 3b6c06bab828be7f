#!/usr/bin/env bash
# Fetch the pinned ZooKeeper server jars (pom.xml beside this script) into the zeps cache.
# Idempotent: the folder is named by a hash of pom.xml and trusted only once ".complete" exists.
# Prints the folder holding lib/ on its last line.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cache=${ZEPS_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/zeps}
say() { printf '[zookeeper] %s\n' "$*" >&2; }

if ! command -v java >/dev/null 2>&1; then
  echo "setup: Java is missing; install a JDK 17 ('apt-get install openjdk-17-jdk-headless') — ZooKeeper and Spark run on it" >&2
  exit 1
fi
jv=$(java -XshowSettings:properties -version 2>&1 | sed -n 's/ *java.specification.version = //p')
if [ "${jv%%.*}" -lt 17 ] 2>/dev/null; then
  echo "setup: Java $jv found but 17 or newer is needed; install openjdk-17-jdk-headless" >&2
  exit 1
fi
command -v mvn >/dev/null 2>&1 || {
  echo "setup: Maven is missing; install it ('apt-get install maven') — it fetches the pinned ZooKeeper jars" >&2
  exit 1
}
key=$(sha256sum "$here/pom.xml" | cut -c1-16)
out="$cache/zookeeper-$key"
if [ -f "$out/.complete" ]; then
  say "up to date ($out)"
else
  say "fetching pinned ZooKeeper jars from Maven Central"
  rm -rf "$out" && mkdir -p "$out/lib"
  if ! mvn -q -B -f "$here/pom.xml" dependency:copy-dependencies -DincludeScope=runtime \
        -DoutputDirectory="$out/lib" >"$out.log" 2>&1; then
    echo "setup: fetching ZooKeeper jars failed; see $out.log" >&2
    tail -n 15 "$out.log" >&2
    rm -rf "$out"
    exit 1
  fi
  touch "$out/.complete"
  say "ready ($(ls "$out/lib" | wc -l) jars)"
fi
echo "$out"
