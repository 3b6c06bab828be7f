# zeps — the two commands: `make demo` and `make test`. Both set up what they need first.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
PY := .venv/bin/python
# Load .zeps-env (written by tools/setup.sh) so the harness finds the cached servers.
WITH_ENV := source ./.zeps-env &&

.PHONY: setup setup-test setup-python test test-unit e2e e2e-images e2e-stack e2e-down lint demo generate check-generated bench bench-operator-kind clean

setup:            ## everything: .venv, ZooKeeper jars, control-plane binaries, the compiled hot path (idempotent)
	@tools/setup.sh python zookeeper testbin promtool compiled

setup-test:       ## what make test needs before its suite; the pinned Go binaries, if not built yet, are built by its pytest session in the background (devtools/zeps_dev/testbin.py)
	@tools/setup.sh python zookeeper promtool compiled testbin-known

setup-python:
	@tools/setup.sh python

lint: setup-python  ## ruff, mypy --strict, import-linter
	@echo "[lint] ruff"; .venv/bin/ruff check . && .venv/bin/ruff format --check .
	@echo "[lint] mypy --strict"; .venv/bin/mypy
	@echo "[lint] import-linter"; .venv/bin/lint-imports

test: setup-test lint  ## the whole suite: unit, integration (ZooKeeper, Spark), cluster (API server)
	@$(WITH_ENV) $(PY) -m pytest -m "not solo"
	@tools/setup.sh testbin  # built now (by the session above if they were not): recorded in .zeps-env
	@echo "[test] the tests that start a stack of their own (-m solo), once the shared one is gone"
	@$(WITH_ENV) $(PY) -m pytest -m solo
	@echo "[test] the unit tier again on the pure-Python modules (the fallback where nothing is compiled)"
	@$(WITH_ENV) ZEPS_COMPILED= $(PY) -m pytest tests/unit

test-unit:        ## the unit tier alone, pure Python: seconds, no server, nothing compiled (the inner loop)
	@tools/setup.sh python zookeeper
	@$(WITH_ENV) ZEPS_COMPILED= $(PY) -m pytest tests/unit

e2e: setup      ## the e2e suite on a kind cluster with real nodes, images built here (see README)
	@tools/setup.sh kind
	@$(WITH_ENV) $(PY) -m zeps_dev.kind e2e $(PYTEST_ARGS)

e2e-images:     ## what `make e2e` builds before its cluster (kind binaries, node and project images), alone
	@tools/setup.sh python zookeeper promtool kind
	@$(WITH_ENV) $(PY) -m zeps_dev.kind images

e2e-stack:      ## what `make e2e` starts before its suite (images, cluster, chart), left running for the next `make e2e` of the same sources to use: CI runs it beside `make test`
	@tools/setup.sh python zookeeper promtool kind
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

bench-%: setup    ## benchmarks: bench-topic, -queue, -stream, -stages, -spark, -operator, -core, -replication, -partitions, -batches, -fsync; each prints one JSON line last
	@tools/setup.sh bench
	@$(WITH_ENV) $(PY) benchmarks/bench_$*.py

clean:            ## remove the virtualenv (the shared cache in ~/.cache/zeps stays)
	rm -rf .venv .zeps-env
