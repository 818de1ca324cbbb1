# gpuslice: every target creates its own virtual environment first (.venv, from pyproject.toml).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test chart manifests image image-scheduler image-archives e2e-install e2e e2e-node bench bench-e2e bench-e2e-guard bench-fairness sweep-a fuzz lint typecheck check clean interposer

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
	$(BIN)/python -m pytest -q tests --ignore=tests/e2e --ignore=tests/e2e_node --ignore=tests/e2e_install --ignore=tests/chart

## chart: the Helm chart rendered under every values combination, validated against the Kubernetes
## 1.34 OpenAPI schema (from the k8s.io/kubernetes module; helm built by deploy/e2e/build-helm.sh, cached)
chart: $(STAMP)
	$(BIN)/python -m pytest -q tests/chart

## manifests: render deploy/chart into deploy/manifests/ (the plain manifests; make chart checks them)
manifests: $(STAMP)
	$(BIN)/python -m tests.chart.helm

## image: the extender and agent images (deploy/images/*.Containerfile) with podman, buildah or docker, named
## $(IMAGE_REGISTRY)/gpuslice-{extender,agent}:$(IMAGE_TAG) as the chart names them; PYTHON_IMAGE and LIMITER_IMAGE
## choose the base images (deploy/images/debian-base.sh makes both from Debian packages, without a registry)
IMAGE_TAG ?= $(shell sed -n 's/^appVersion: "\(.*\)"/\1/p' deploy/chart/Chart.yaml)
IMAGE_REGISTRY ?= localhost
PYTHON_IMAGE ?=
LIMITER_IMAGE ?=
BUILDER ?= $(shell command -v podman || command -v buildah || command -v docker)
REGISTRY_PREFIX = $(patsubst %/,%,$(IMAGE_REGISTRY))
KUBE_VERSION := $(shell sed -n 's/^KUBE_VERSION="\(v[^"]*\)".*/\1/p' deploy/e2e/build-kube.sh)
IMAGE_ARGS = $(if $(PYTHON_IMAGE),--build-arg PYTHON_IMAGE=$(PYTHON_IMAGE)) $(if $(LIMITER_IMAGE),--build-arg LIMITER_IMAGE=$(LIMITER_IMAGE))
image:
	@test -n "$(BUILDER)" || { echo "make image: no podman, buildah or docker on this machine (set BUILDER=...)"; exit 2; }
	$(BUILDER) build $(IMAGE_ARGS) -f deploy/images/extender.Containerfile -t $(REGISTRY_PREFIX)/gpuslice-extender:$(IMAGE_TAG) .
	$(BUILDER) build $(IMAGE_ARGS) -f deploy/images/agent.Containerfile -t $(REGISTRY_PREFIX)/gpuslice-agent:$(IMAGE_TAG) .

## image-scheduler: $(IMAGE_REGISTRY)/kube-scheduler:$(KUBE_VERSION), the pinned kube-scheduler built from its Go module
## (deploy/e2e/build-kube.sh, cached) in an image FROM scratch: for clusters that cannot pull registry.k8s.io's
image-scheduler:
	@test -n "$(BUILDER)" || { echo "make image-scheduler: no podman, buildah or docker on this machine (set BUILDER=...)"; exit 2; }
	rm -rf build/kube-scheduler && mkdir -p build/kube-scheduler
	cp "$$(deploy/e2e/build-kube.sh | tail -1)/kube-scheduler" build/kube-scheduler/
	$(BUILDER) build -f deploy/images/kube-scheduler.Containerfile -t $(REGISTRY_PREFIX)/kube-scheduler:$(KUBE_VERSION) build/kube-scheduler

## image-archives: the images above as OCI archives in build/images/, for nodes that load them without a
## registry (`ctr -n k8s.io images import build/images/<name>.tar`, README "Install")
IMAGE_NAMES = gpuslice-extender:$(IMAGE_TAG) gpuslice-agent:$(IMAGE_TAG) kube-scheduler:$(KUBE_VERSION)
image-archives:
	@test -n "$(BUILDER)" || { echo "make image-archives: no podman, buildah or docker on this machine (set BUILDER=...)"; exit 2; }
	mkdir -p build/images
	@set -e; for name in $(IMAGE_NAMES); do \
	  ref=$(REGISTRY_PREFIX)/$$name; out=build/images/$$(echo $$name | tr : -).tar; rm -f $$out; \
	  case "$$(basename $(BUILDER))" in \
	    buildah) echo "buildah push $$ref oci-archive:$$out:$$ref"; buildah push --quiet $$ref oci-archive:$$out:$$ref ;; \
	    docker) echo "docker save -o $$out $$ref"; docker save -o $$out $$ref ;; \
	    *) echo "$(BUILDER) save --format oci-archive -o $$out $$ref"; $(BUILDER) save --quiet --format oci-archive -o $$out $$ref ;; \
	  esac; \
	done

## e2e: real etcd + kube-apiserver + kube-scheduler, built from pinned sources (cached)
e2e: $(STAMP)
	$(BIN)/python -m pytest -q tests/e2e

## e2e-node: a real kubelet on containerd 2.x + runc (root, real cgroups), the agent on its sockets
e2e-node: $(STAMP)
	$(BIN)/python -m pytest -q tests/e2e_node

## e2e-install: README's install, check, first slice, upgrade and uninstall, run as written on a full cluster of
## this machine (kube-controller-manager, kube-proxy, CoreDNS, a kubelet on containerd; build-kube.sh install, cached)
## with the images built and loaded without a registry (root; podman or buildah, mmdebstrap, iptables)
e2e-install: $(STAMP)
	$(BIN)/python -m pytest -q tests/e2e_install

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
## built-in mix at offered load 0.7, 0.85 and 0.95, 64 cards, seeds 1-10, 15 000 jobs, usable capacity at 1.1, then
## the no-fragmentation reference's frontiers against that best effort (single-card; multi-card with the alone
## lower bound); needs GPUSLICE_TRACES; hours on 2 cores (FAIRNESS_ARGS="--seeds 1-3 --jobs 5000" for a quicker
## look; "--frontier --best-effort FILE.json": the single-card frontier only, "--frontier --multi-card": the other)
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
