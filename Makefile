# orch — every target works from a fresh clone: the first one that needs the venv builds it.
# INVENTORY selects the cluster (default: the two-node local demo); RUN selects a run (default: latest).

SHELL := /bin/bash
# Python may write its bytecode caches (__pycache__/, ignored by git) for what make runs, whatever the
# calling shell says: with PYTHONDONTWRITEBYTECODE set, every test module was assertion-rewritten and
# every orch module compiled again on each run (half of make test-fast's collection time).
unexport PYTHONDONTWRITEBYTECODE
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
ORCH := $(VENV)/bin/orch
INVENTORY ?= inventory/local.yaml
RUN ?=
PYTEST_ARGS ?=
ORCH_TEST_STRICT ?= 1
# Four workers on this 2-core machine: the slow tests hold a slot per core (tests/conftest.py), the
# short ones of the run's tail mostly wait, and with three the tail left 17-37 % of the CPU idle
# (make test on 2026-12-07: 1340 s of pytest with three; 1232 s with four and tests/durations.json
# refreshed from the first run).
PYTEST_WORKERS ?= 4
STAMP := $(VENV)/.installed
DEMO_DIR ?= $(HOME)/.orch/demo
DEMO_DATA := $(DEMO_DIR)/shapes-200-64

.PHONY: help install deps up demo-data check logs status down report test test-fast test-gpu lint typecheck bench gpu-smoke gpu-smoke-dry-run gpu-wheels clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-10s %s\n", $$1, $$2}'

install: $(STAMP)  ## create .venv with orch, the trainer (torch, ultralytics) and the test tools

$(STAMP): setup.cfg pyproject.toml setup.py orchestrator/logs/_fastmerge.c
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -e '.[trainer,test,report]'
	touch $(STAMP)

demo-data: install  ## the synthetic YOLO dataset the local demo trains on
	@test -f $(DEMO_DATA)/data.yaml || $(PY) -m trainer.synth $(DEMO_DATA) --images 200 --classes 3 --imgsz 64

up: install demo-data  ## run a real 2-node training on this machine (or INVENTORY=...), then its report
	$(ORCH) up $(INVENTORY)
	$(ORCH) report

check: install  ## preflight every node of INVENTORY
	$(ORCH) check $(INVENTORY)

logs: install  ## follow the merged log of RUN (default: the latest run)
	$(ORCH) logs --follow $(RUN)

status: install  ## per-node state of RUN
	$(ORCH) status $(RUN)

down: install  ## stop every process of RUN on every node
	$(ORCH) down $(RUN)

report: install  ## write the HTML report of RUN
	$(ORCH) report $(RUN)

deps:  ## the system packages the tests need (.ci/packages): installs them as root, else names them
	.ci/deps

test: deps install  ## the whole suite: every tier, a missing prerequisite fails (ORCH_TEST_STRICT=1)
	ORCH_TEST_STRICT=$(ORCH_TEST_STRICT) $(PY) -m pytest -n $(PYTEST_WORKERS) --maxschedchunk 1 $(PYTEST_ARGS)

test-fast: install  ## the inner loop: tests/unit, pure tests only (no sshd, torchrun, daemons), about a minute
	ORCH_HYPOTHESIS_EXAMPLES=$${ORCH_HYPOTHESIS_EXAMPLES:-50} $(PY) -m pytest tests/unit -n $(PYTEST_WORKERS) $(PYTEST_ARGS)

test-gpu: install  ## the CUDA-only paths (tests/gpu), on a machine with a GPU; skipped elsewhere
	$(PY) -m pytest -m gpu tests/gpu $(PYTEST_ARGS)

lint: install  ## ruff (lint, and the format check: ruff format, 120 columns) and mypy
	$(VENV)/bin/ruff check orchestrator trainer tests bench
	$(VENV)/bin/ruff format --check orchestrator trainer tests bench
	$(VENV)/bin/mypy

typecheck: install  ## mypy alone (make lint runs it too)
	$(VENV)/bin/mypy

bench: install  ## benchmarks against pdsh, sort -m and ultralytics' trainer (bench/results/)
	$(PY) -m bench $(BENCH_ARGS)

# The GPU validation runs where there is no .venv (the GPU machine's python3 plus carried wheels):
# it uses .venv's python when there is one, else python3, and never builds the venv itself.
SMOKE_PY ?= $(if $(wildcard $(PY)),$(PY),$(PYTHON))
GPU_SMOKE_OUT ?= $(or $(OUT),.orch/gpu-smoke)
GPU_SMOKE_ARGS ?=

gpu-smoke:  ## the one-shot GPU validation (bench/gpu_smoke.py) into $OUT (else .orch/gpu-smoke); GPU_SMOKE_ARGS=--cpu-dry-run rehearses it on CPU
	$(SMOKE_PY) bench/gpu_smoke.py --out $(GPU_SMOKE_OUT) $(GPU_SMOKE_ARGS)

gpu-smoke-dry-run: install  ## rehearse gpu-smoke on this CPU, end to end and checked (about 4 minutes; not in make test)
	$(PY) -m pytest tests/integration/test_gpu_smoke_dry_run.py $(PYTEST_ARGS)

gpu-wheels: install  ## download the wheels the GPU machine lacks into .whl/ (for gpu-smoke there)
	$(PY) -m bench.gpu_wheels

clean:  ## remove the venv and the build caches (runs stay in $ORCH_HOME, ~/.orch)
	rm -rf $(VENV) .orch/gpu-smoke .pytest_cache .mypy_cache .ruff_cache build orchestrator/logs/_fastmerge.*.so
