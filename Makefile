# zeps — the two commands: `make demo` and `make test`. Both set up what they need first.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
PY := .venv/bin/python
# Load .zeps-env (written by tools/setup.sh) so the harness finds the cached servers.
WITH_ENV := source ./.zeps-env &&
# The shared cache (tools/setup.sh's): mypy's cache lives there too, keyed by mypy's pin, so a fresh
# clone checks only what differs from the last check of any checkout (mypy compares each file's hash)
ZEPS_CACHE := $(or $(ZEPS_CACHE_DIR),$(XDG_CACHE_HOME),$(HOME)/.cache)$(if $(ZEPS_CACHE_DIR),,/zeps)

.PHONY: setup setup-test setup-python test test-unit sim chaos-replication docs e2e e2e-images e2e-stack e2e-down lint demo generate check-generated bench bench-operator-kind bench-roll-kind clean

setup:            ## everything: .venv, ZooKeeper jars, control-plane binaries, the compiled hot path (idempotent)
	@tools/setup.sh python zookeeper testbin promtool compiled

setup-test:       ## what make test needs before its suite; the pinned Go binaries, if not built yet, are built by its pytest session in the background (devtools/zeps_dev/testbin.py)
	@tools/setup.sh python zookeeper promtool compiled testbin-known

setup-python:
	@tools/setup.sh python

lint: setup-python  ## ruff, mypy --strict, import-linter, the docs site built with --strict
	@echo "[lint] ruff"; .venv/bin/ruff check . && .venv/bin/ruff format --check .
	@echo "[lint] mypy --strict"; MYPY_CACHE_DIR=$(ZEPS_CACHE)/mypy-$$(grep -i '^mypy==' constraints.txt | cut -d= -f3) .venv/bin/mypy
	@echo "[lint] import-linter"; .venv/bin/lint-imports
	@$(MAKE) --no-print-directory docs

docs: setup-python  ## the docs site into build/site (mkdocs --strict: a broken link or anchor, or a page not in the navigation, fails)
	@echo "[docs] mkdocs build --strict"; NO_MKDOCS_2_WARNING=1 .venv/bin/mkdocs build --strict --quiet

# make test's pytest-xdist workers (1: one test at a time): the tiers mostly wait on servers, so
# one worker leaves a core idle. A worker starts the session servers its tests ask for (ZooKeeper,
# the control plane, Spark) when its first test needs them. Four finish sooner on an idle machine
# (TEST_LANES=4), but beside CI's load they starved tests past their timeouts: benchmarks/README.md
TEST_LANES ?= 2
test: setup-test lint  ## the whole suite: unit, integration (ZooKeeper, Spark), cluster (API server); TEST_LANES=1 runs one test at a time
	@$(WITH_ENV) $(PY) -m pytest -m "not solo" $(if $(filter-out 1,$(TEST_LANES)),-n $(TEST_LANES) --dist worksteal,)
	@tools/setup.sh testbin  # built now (by the session above if they were not): recorded in .zeps-env
	@# the solo tests mostly wait on the stacks they start: the pure-Python unit step runs beside them,
	@# its output printed after theirs
	@echo "[test] the tests that start a stack of their own (-m solo), once the shared one is gone; beside them, the unit tier again on the pure-Python modules (the fallback where nothing is compiled)"
	@$(WITH_ENV) pure_out=$$(mktemp); \
	 (ZEPS_COMPILED= $(PY) -m pytest -p no:cacheprovider tests/unit >"$$pure_out" 2>&1) & pure=$$!; \
	 solo=0; $(PY) -m pytest -m solo || solo=$$?; \
	 unit=0; wait $$pure || unit=$$?; \
	 echo "[test] the unit tier on the pure-Python modules (run beside the solo tests):"; cat "$$pure_out"; rm -f "$$pure_out"; \
	 [ $$solo -eq 0 ] || { echo "[test] the solo tests failed (exit $$solo): above" >&2; exit $$solo; }; \
	 [ $$unit -eq 0 ] || { echo "[test] the pure-Python unit step failed (exit $$unit): above" >&2; exit $$unit; }

test-unit:        ## the unit tier alone, pure Python: seconds, no server, nothing compiled (the inner loop)
	@tools/setup.sh python zookeeper
	@$(WITH_ENV) ZEPS_COMPILED= $(PY) -m pytest tests/unit

SEEDS ?= 1-1000
sim: setup-python  ## the replication protocol under deterministic simulation, for SEEDS (1-1000; one: SEEDS=22 replays it); prints seeds per second
	@cd tests && ../$(PY) -m simulation.run $(SEEDS)

ROUNDS ?= 30
SEED ?=
FAULTS ?=
chaos-replication: setup-test  ## real replicas under random faults (kill -9, SIGSTOP, all restarted, ZooKeeper answers lost or cut, a full disk, a clock jump) for ROUNDS rounds (SEED= replays, FAULTS=a,b only those); one JSON line a fault, the summary last
	@$(WITH_ENV) cd tests && ../$(PY) -m chaos.replication --rounds $(ROUNDS) $(if $(SEED),--seed $(SEED),) $(if $(FAULTS),--faults $(FAULTS),)

e2e: setup      ## the e2e suite on a kind cluster with real nodes, images built here (see README)
	@tools/setup.sh kind
	@$(WITH_ENV) $(PY) -m zeps_dev.kind e2e $(PYTEST_ARGS)

e2e-images:     ## what `make e2e` builds before its cluster (kind binaries, node and project images), alone
	@tools/setup.sh python zookeeper promtool kind
	@$(WITH_ENV) $(PY) -m zeps_dev.kind images

e2e-stack:      ## what `make e2e` starts before its suite (images, cluster, chart), left running for the next `make e2e` of the same sources to use: CI runs it beside `make test` (with ZEPS_E2E_SERIAL_EARLY=1 it runs the serial e2e tests on it too, and that `make e2e` the rest)
	@tools/setup.sh python zookeeper promtool
	@# the images that need no Go binary beside the kind set's Go builds (downloads and disk beside their CPU)
	@$(WITH_ENV) $(PY) -m zeps_dev.kind base-images & images=$$!; \
	 built=0; tools/setup.sh kind || built=$$?; \
	 made=0; wait $$images || made=$$?; \
	 [ $$built -eq 0 ] && [ $$made -eq 0 ] || { echo "e2e-stack: the Go builds (exit $$built) or the base images (exit $$made) failed (above)" >&2; exit 1; }
	@$(WITH_ENV) $(PY) -m zeps_dev.kind stack

e2e-down:       ## remove a cluster (and a dockerd of zeps) that `make e2e-stack` or ZEPS_KEEP_CLUSTER=1 left
	@tools/setup.sh python zookeeper promtool kind
	@$(WITH_ENV) $(PY) -m zeps_dev.kind down

CLUSTER ?= local
demo:             ## the whole system on the local stack, with a summary (CLUSTER=kind: everything in pods)
	@tools/setup.sh python zookeeper testbin $(if $(filter kind,$(CLUSTER)),kind,)
	@$(WITH_ENV) CLUSTER=$(CLUSTER) $(PY) -m zeps_dev.demo

bench-operator-kind: setup  ## bench-operator with the operator in a pod on kind (the e2e stack; removed after)
	@tools/setup.sh bench kind
	@$(WITH_ENV) $(PY) benchmarks/bench_operator_kind.py

bench-roll-kind: setup  ## bench-roll on kind: an R3 stream's roll with hand-overs against pods killed one at a time (the e2e stack; removed after)
	@tools/setup.sh bench kind
	@$(WITH_ENV) $(PY) benchmarks/bench_roll_kind.py

bench-%: setup    ## benchmarks: bench-topic, -queue, -stream, -stages, -spark, -operator, -core, -replication, -roll, -partitions, -batches, -tiered, -compaction, -fsync, -zookeeper, -zookeeper-tls, -connections; each prints one JSON line last
	@tools/setup.sh bench
	@$(WITH_ENV) $(PY) benchmarks/bench_$*.py

generate: setup-python  ## the generated files from their one source: CRDs (the models) and the reference pages
	@$(PY) -m zeps_operator.crdgen && $(PY) tools/gen_docs.py

check-generated: setup-python  ## fails if a generated file differs from its source (the unit tier checks the same)
	@$(PY) -m zeps_operator.crdgen --check && $(PY) tools/gen_docs.py --check

clean:            ## remove the virtualenv (the shared cache in ~/.cache/zeps stays)
	rm -rf .venv .zeps-env
