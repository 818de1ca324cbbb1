# gpuslice: every target creates its own virtual environment first (.venv, from pyproject.toml).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test chart manifests image e2e e2e-node bench bench-e2e bench-e2e-guard bench-fairness sweep-a fuzz lint typecheck check clean interposer

$(STAMP): pyproject.toml $(wildcard enforcement/kubeletapi/protos/*.proto)
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	$(BIN)/python -m enforcement.kubeletapi.generate
	touch $(STAMP)

## demo: the main job on the embedded default (no cluster needed)
demo: $(STAMP)
	$(BIN)/gpuslice serve --standalone --demo

## test: the whole test suite but the end-to-end one (unit, property, wire, gunicorn)
test: $(STAMP)
	$(BIN)/python -m pytest -q tests --ignore=tests/e2e --ignore=tests/e2e_node --ignore=tests/chart

## chart: the Helm chart rendered under every values combination, validated against the Kubernetes
## 1.34 OpenAPI schema (from the k8s.io/kubernetes module; helm built by deploy/e2e/build-helm.sh, cached)
chart: $(STAMP)
	$(BIN)/python -m pytest -q tests/chart

## manifests: render deploy/chart into deploy/manifests/ (the plain manifests; make chart checks them)
manifests: $(STAMP)
	$(BIN)/python -m tests.chart.helm

## image: the extender and agent images (deploy/images/*.Containerfile) with podman, docker or buildah
IMAGE_TAG ?= $(shell sed -n 's/^appVersion: "\(.*\)"/\1/p' deploy/chart/Chart.yaml)
IMAGE_REGISTRY ?=
BUILDER ?= $(shell command -v podman || command -v docker || command -v buildah)
image:
	@test -n "$(BUILDER)" || { echo "make image: no podman, docker or buildah on this machine (set BUILDER=...)"; exit 2; }
	$(BUILDER) build -f deploy/images/extender.Containerfile -t $(IMAGE_REGISTRY)gpuslice-extender:$(IMAGE_TAG) .
	$(BUILDER) build -f deploy/images/agent.Containerfile -t $(IMAGE_REGISTRY)gpuslice-agent:$(IMAGE_TAG) .

## e2e: real etcd + kube-apiserver + kube-scheduler, built from pinned sources (cached)
e2e: $(STAMP)
	$(BIN)/python -m pytest -q tests/e2e

## e2e-node: a real kubelet on containerd 2.x + runc (root, real cgroups), the agent on its sockets
e2e-node: $(STAMP)
	$(BIN)/python -m pytest -q tests/e2e_node

## fuzz: the extender's wire fuzz at 4 x 25 000 = 100 000 cases (make test runs a few hundred); prints the tally
fuzz: $(STAMP)
	GPUSLICE_FUZZ_EXAMPLES=25000 $(BIN)/python -m pytest -q -s tests/unit/test_extender_fuzz.py

## bench: speed figures printed as ratios measured in one run (never asserted in tests)
bench: $(STAMP)
	$(BIN)/python -m tests.bench.run

## sweep-a: protocol A's placement table on all 24 openb pod lists in $$GPUSLICE_TRACES/alibaba-openb: the default,
## best-fit, frag-gradient, relative-gradient and FGD under both tie rules, the offline reference, seeds 42-51
## (about 82 min on 2 cores, timed in parts; SWEEP_PROCESSES=N spreads the runs over N processes,
## SWEEP_WORKERS=N over a Dask LocalCluster, SWEEP_SCHEDULER=tcp://HOST:8786 over an existing Dask cluster;
## SWEEP_ARGS adds options, e.g. --seeds 42-46); table on stdout, runs in sweep-a.json
SWEEP_PROCESSES ?= 2
SWEEP_WORKERS ?=
SWEEP_SCHEDULER ?=
SWEEP_SPREAD = $(if $(SWEEP_SCHEDULER),--scheduler $(SWEEP_SCHEDULER),$(if $(SWEEP_WORKERS),--workers $(SWEEP_WORKERS),--processes $(SWEEP_PROCESSES)))
sweep-a: $(STAMP)
	@test -n "$$GPUSLICE_TRACES" || { echo "sweep-a: set GPUSLICE_TRACES to the folder holding alibaba-openb/" >&2; exit 2; }
	$(BIN)/gpuslice simulate --nodes "$$GPUSLICE_TRACES/alibaba-openb/openb_node_list_gpu_node.csv" \
	    --pods "$$GPUSLICE_TRACES/alibaba-openb" --policy gradient-fit,best-fit,frag-gradient,relative-gradient,fgd \
	    --ties stable,random --offline --seeds 42-51 $(SWEEP_SPREAD) --json sweep-a.json $(SWEEP_ARGS)

## bench-fairness: the queue fairness table (tests/bench/bench_fairness.py): every admission strategy that matters
## (best effort, the default worst-first, drain-soonest) on default, gpushare100, gpushare60, multigpu50 and the
## built-in mix at offered load 0.7, 0.85 and 0.95, 64 cards, seeds 1-10, 15 000 jobs, usable capacity at 1.1;
## needs GPUSLICE_TRACES; hours on 2 cores (FAIRNESS_ARGS="--seeds 1-3 --jobs 5000" for a quicker look)
bench-fairness: $(STAMP)
	@test -n "$$GPUSLICE_TRACES" || { echo "bench-fairness: set GPUSLICE_TRACES to the folder holding alibaba-openb/" >&2; exit 2; }
	$(BIN)/python -m tests.bench.bench_fairness --full $(FAIRNESS_ARGS)

## bench-e2e: the real path (etcd, kube-apiserver, kube-scheduler, the extender) against plain kube-scheduler, in one
## run: the chart's default policy, best fit, without the gate (minutes; CI runs the short bench-e2e-guard instead);
## BENCH_E2E_ARGS adds options (--rounds 3, --pods 1000, --configs ..., ...)
bench-e2e: $(STAMP)
	$(BIN)/python -m tests.bench.bench_e2e $(BENCH_E2E_ARGS)

## bench-e2e-guard: CI's short real path (200 nodes, 500 pods, 1 round): prints the ratios, fails only when the default
## policy's extender CPU per pod is above 1.5x best-fit's in the same run (a ratio, robust to a noisy machine)
bench-e2e-guard: $(STAMP)
	$(BIN)/python -m tests.bench.bench_e2e --nodes 200 --pods 500 --rounds 1 --trials 0 \
	    --configs plain,deployed,deployed:best-fit --guard 1.5

lint: $(STAMP)
	$(BIN)/ruff check .

typecheck: $(STAMP)
	$(BIN)/mypy packing extender enforcement simulations

## interposer: the in-container memory limiter (C); the last line printed is the library's path
## (INTERPOSER_FLAVOR=sanitize builds it with ASan + UBSan, as the tests' sanitizer run uses it)
ifeq ($(origin CC),default)
CC := gcc
endif
INTERPOSER_FLAVOR ?= release
INTERPOSER_SRC := $(wildcard enforcement/interposer/*.c)
INTERPOSER_LIB := build/interposer/$(INTERPOSER_FLAVOR)/libgpuslice-limiter.so
INTERPOSER_WARN := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes
ifeq ($(INTERPOSER_FLAVOR),sanitize)
INTERPOSER_OPT := -O1 -foptimize-sibling-calls -fno-omit-frame-pointer -fsanitize=address,undefined -fno-sanitize-recover=all
else
INTERPOSER_OPT := -O2
endif

$(INTERPOSER_LIB): $(INTERPOSER_SRC) $(wildcard enforcement/interposer/*.h)
	mkdir -p $(@D)
	$(CC) -std=gnu11 $(INTERPOSER_OPT) -g -fPIC -fvisibility=hidden $(INTERPOSER_WARN) -shared \
		-Wl,-soname,libgpuslice-limiter.so -Wl,-z,defs -Wl,-z,now -o $@.tmp $(INTERPOSER_SRC) -ldl -lpthread
	mv $@.tmp $@

interposer: $(INTERPOSER_LIB)
	@echo $(abspath $(INTERPOSER_LIB))

check: lint typecheck test

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
