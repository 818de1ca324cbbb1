"""Fixtures of the chart tests (``make chart``): helm and the Kubernetes 1.34 schemas, both from Go
modules (cached). Unavailable, they fail the tests, unless ``GPUSLICE_E2E_ALLOW_SKIP=1``."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from .helm import HelmUnavailable, helm_binary
from .schemas import Schemas, SchemasUnavailable


def _unavailable(message: str) -> None:
    if os.environ.get("GPUSLICE_E2E_ALLOW_SKIP") == "1":
        pytest.skip(message)
    pytest.fail(message, pytrace=False)


@pytest.fixture(scope="session")
def helm() -> Path:
    try:
        return helm_binary()
    except HelmUnavailable as e:
        _unavailable(str(e))
        raise


@pytest.fixture(scope="session")
def schemas() -> Schemas:
    try:
        return Schemas()
    except SchemasUnavailable as e:
        _unavailable(str(e))
        raise
