# fusebox: `make generate` then `make test` on a fresh clone. `make help` lists the rest.
SHELL := /bin/bash
.DEFAULT_GOAL := help
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
SPEC ?= fusebox.yaml
OUT ?= .
# Hash-pinned dependencies (Python 3.11, Linux x86_64): the venv and CI install test.lock, the
# Dockerfile runtime.lock; pyproject.toml keeps the ranges for library users. `make lock` refreshes.
LOCK := requirements/test.lock
UV_VERSION ?= 0.13.9
# Tools (Prometheus 3 promtool, the OpenTelemetry Collector, ...: tools/README.md) are built once into this cache.
export FUSEBOX_TOOLS ?= $(HOME)/.cache/fusebox/tools

.PHONY: help venv lock tools generate check budget backtest check-generated lint test test-fast bench bench-scale demo clean

help: ## list the targets
	@grep -hE '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-16s %s\n", $$1, $$2}'

$(BIN)/fusebox: pyproject.toml $(LOCK)
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --require-hashes -r $(LOCK)
	$(BIN)/pip install -q --no-deps --no-build-isolation -e .
	@touch $@

venv: $(BIN)/fusebox ## create .venv with fusebox and its test dependencies, from requirements/test.lock

# uv runs from a throwaway venv: it is a tool for refreshing the locks, not a dependency.
LOCK_FLAGS := --quiet --generate-hashes --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
	--custom-compile-command 'make lock'
lock: ## refresh requirements/{test,runtime}.lock from pyproject.toml, keeping pins (LOCK_UPGRADE=--upgrade for newest)
	@set -e; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	$(PY) -m venv "$$tmp" && "$$tmp/bin/pip" install -q 'uv==$(UV_VERSION)'; \
	"$$tmp/bin/uv" pip compile pyproject.toml requirements/build.in --extra test $(LOCK_FLAGS) $(LOCK_UPGRADE) -o requirements/test.lock; \
	"$$tmp/bin/uv" pip compile pyproject.toml requirements/build.in -c requirements/test.lock $(LOCK_FLAGS) -o requirements/runtime.lock; \
	echo "requirements/test.lock and requirements/runtime.lock refreshed"

tools: venv ## install promtool, amtool, prometheus, alertmanager, chromium (apt), build the pinned Go tools (promtool 3, otelcol, VictoriaMetrics, Thanos, kube-apiserver, kube-controller-manager and etcd, the Prometheus Operator, KEDA, Jaeger, Sloth), fetch the operator CRDs
	bash tools/bootstrap.sh

generate: venv ## generate every output from the spec (SPEC=fusebox.yaml) into OUT (default .); refresh the starter spec
	$(BIN)/fusebox generate --spec $(SPEC) --out $(OUT)
	cp fusebox.yaml fusebox/data/fusebox.yaml

check: tools ## generated files match the spec, the reaction budget, the in-path shedders, the scaling order, then promtool/vmalert/amtool checks and the generated tests (promtool 2 and 3, vmalert-tool)
	$(BIN)/fusebox check --spec $(SPEC) --out $(OUT)

budget: venv ## each fuse tier's detection floor against the time its resource has left (docs/budget.md)
	$(BIN)/fusebox budget --spec $(SPEC)

backtest: tools ## the spec's rules and fuse replayed over the shipped incident, examples/incidents/breach.om (docs/backtest.md)
	$(BIN)/fusebox backtest --openmetrics examples/incidents/breach.om --spec $(SPEC)

check-generated: venv ## fail when committed outputs drift from the spec, or the starter spec (fusebox init) from fusebox.yaml
	$(BIN)/fusebox generate --spec $(SPEC) --out $(OUT) --check
	@cmp -s fusebox.yaml fusebox/data/fusebox.yaml || { echo "fusebox/data/fusebox.yaml (the starter spec) differs from fusebox.yaml: run make generate"; exit 1; }

lint: venv ## ruff, the code-shape limits (tools/code_shape.py: MI >= 20, <= 700 lines, complexity <= 40), then mypy on an installed copy of fusebox
	$(BIN)/ruff check .
	$(BIN)/python tools/code_shape.py
	@set -e; tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	rm -rf build; `# setuptools' build/ keeps modules removed since` $(BIN)/pip install -q --no-deps --no-build-isolation --target "$$tmp" . ; \
	echo "mypy -p fusebox (an installed copy: fusebox.fuse, .generator, .collectors as users import them)"; \
	cd "$$tmp" && $(CURDIR)/$(BIN)/mypy -p fusebox --config-file $(CURDIR)/pyproject.toml --cache-dir $(CURDIR)/.mypy_cache/installed

# The process tests mostly wait on real servers (rule evaluations, scrapes, timeouts), so four pytest-xdist
# workers share 2 cores well; each takes its own free-port slice (tests/conftest.py). TEST_WORKERS=0 runs serially.
# --dist loadgroup: a test goes to whichever worker is free, except that the tests of a module whose
# module fixture is a whole run (tests/e2e/, ONE_WORKER in tests/conftest.py) stay on one worker, which runs it once.
TEST_WORKERS ?= 4
test: lint tools ## lint, then the whole test suite in TEST_WORKERS (4) workers (unit, promtool, real Prometheus/Alertmanager/Collector, the e2e runs)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup

.PHONY: test-unit test-e2e
test-e2e: tools ## the end-to-end runs alone (tests/e2e/: the demo, VictoriaMetrics, the cluster tests on a real API server)
	$(BIN)/python -m pytest -q tests/e2e

test-unit: venv ## the inner loop: the tests that start no process and bind no port (~1,600; tests/_unit_rule.py decides, a guard enforces)
	$(BIN)/python -m pytest -q -m unit

test-fast: venv ## tests that need no external tool
	$(BIN)/python -m pytest -q -m "not tools and not otelcol"

bench: tools ## run the benchmarks under bench/ (they print figures; bench_scale.py alone takes ~20 min on 2 cores)
	@for b in bench/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

bench-scale: tools ## 10,000 GPUs: rule evaluation on Prometheus and vmalert, dashboards on records vs raw (SCALE_ARGS=--quick for a smoke run; SCALE_ARGS="--cost --gpus N [--vm]" for rule cost, before vs today, on one Prometheus, then vmalert + VictoriaMetrics with --vm)
	$(BIN)/python bench/bench_scale.py $(SCALE_ARGS)

demo: tools ## the real stack on loopback ports replaying a breach, live (Ctrl-C stops it; DEMO_ARGS=--once, --engine victoriametrics)
	$(BIN)/fusebox demo --spec $(SPEC) $(DEMO_ARGS)

clean: ## remove the virtualenv and caches (not the tool cache)
	rm -rf $(VENV) .pytest_cache .hypothesis .mypy_cache .ruff_cache build *.egg-info
