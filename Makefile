# gpuslice: every target creates its own virtual environment first (.venv, from pyproject.toml).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test e2e bench lint typecheck check clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

## demo: the main job on the embedded default (no cluster needed)
demo: $(STAMP)
	$(BIN)/gpuslice serve --standalone --demo

## test: the whole test suite but the end-to-end one (unit, property, wire, gunicorn)
test: $(STAMP)
	$(BIN)/python -m pytest -q tests --ignore=tests/e2e

## e2e: real etcd + kube-apiserver + kube-scheduler, built from pinned sources (cached)
e2e: $(STAMP)
	$(BIN)/python -m pytest -q tests/e2e

## bench: speed figures printed as ratios measured in one run (never asserted in tests)
bench: $(STAMP)
	$(BIN)/python -m tests.bench.run

lint: $(STAMP)
	$(BIN)/ruff check .

typecheck: $(STAMP)
	$(BIN)/mypy packing extender enforcement simulations

check: lint typecheck test

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
