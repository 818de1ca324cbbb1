"""Fixtures for end-to-end tests against real upstream Kubernetes binaries.

The binaries come from ``$GPUSLICE_KUBE_BIN`` if set, otherwise from
``deploy/e2e/build-kube.sh`` (cached; the first build takes a while). A build
failure fails the tests, unless ``GPUSLICE_E2E_ALLOW_SKIP=1``, which turns it
into a skip.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Generator, Iterator
from pathlib import Path

import pytest

from packing.kube.client import Kube

from . import gpuslice_harness as h
from .cluster import ControlPlane, ControlPlaneError, create_namespace

REPO_ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO_ROOT / "deploy" / "e2e" / "build-kube.sh"
BUILD_TIMEOUT_S = 3600
BINARIES = ("etcd", "kube-apiserver", "kube-scheduler")


def _unavailable(message: str) -> None:
    if os.environ.get("GPUSLICE_E2E_ALLOW_SKIP") == "1":
        pytest.skip(message)
    pytest.fail(message, pytrace=False)


@pytest.fixture(scope="session")
def kube_bin_dir() -> Path:
    """Directory holding etcd, kube-apiserver and kube-scheduler."""
    from_env = os.environ.get("GPUSLICE_KUBE_BIN")
    if from_env:
        bin_dir = Path(from_env)
    else:
        try:
            result = subprocess.run(
                ["bash", str(BUILD_SCRIPT)],
                cwd=REPO_ROOT,
                capture_output=True,
                text=True,
                timeout=BUILD_TIMEOUT_S,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            _unavailable(f"{BUILD_SCRIPT} did not complete: {exc}")
            raise  # unreachable: _unavailable always raises
        if result.returncode != 0:
            output = "\n".join(result.stderr.splitlines()[-60:])
            _unavailable(f"{BUILD_SCRIPT} failed with exit code {result.returncode}:\n{output}")
        lines = result.stdout.strip().splitlines()
        bin_dir = Path(lines[-1]) if lines else Path()
    missing = [b for b in BINARIES if not (bin_dir / b).is_file()]
    if missing:
        _unavailable(f"missing {', '.join(missing)} in {bin_dir}")
    return bin_dir


@pytest.fixture(scope="session")
def control_plane(kube_bin_dir: Path) -> Iterator[ControlPlane]:
    """A running etcd + kube-apiserver for the whole session (scheduler: start it per test)."""
    cp = ControlPlane(kube_bin_dir)
    try:
        cp.start()
    except (ControlPlaneError, TimeoutError) as exc:
        logs = cp.logs_tail(60)
        cp.stop()
        pytest.fail(f"control plane did not start: {exc}\n{logs}", pytrace=False)
    try:
        yield cp
    finally:
        cp.stop()


@pytest.fixture
def scheduler(control_plane: ControlPlane) -> Iterator[ControlPlane]:
    """Default kube-scheduler (no extender) for one test; stopped afterwards."""
    control_plane.start_scheduler()
    try:
        yield control_plane
    finally:
        control_plane.stop_scheduler()


@pytest.fixture
def namespace(control_plane: ControlPlane) -> str:
    """A fresh namespace for one test (never fully deleted: no namespace controller)."""
    return create_namespace(control_plane.api_client())


# ---- for modules that install gpuslice as a module-scoped ``gs`` fixture ------------------------------

@pytest.fixture
def kube(gs: h.Gpuslice) -> Kube:
    return gs.kube


@pytest.fixture
def nodes(gs: h.Gpuslice) -> Iterator[list[str]]:
    """Node names this test creates; deleted afterwards (with their ResourceSlices)."""
    made: list[str] = []
    yield made
    h.delete_nodes(gs.kube, made)


@pytest.fixture
def ns(gs: h.Gpuslice, request: pytest.FixtureRequest) -> Iterator[str]:
    """A fresh namespace named by the module's ``NAMESPACE_PREFIX``; its pods are deleted afterwards
    (their slices free). gpuslice's logs are printed when the test failed."""
    name = create_namespace(gs.cp.api_client(), getattr(request.module, "NAMESPACE_PREFIX", "gs"))
    failed_before = request.session.testsfailed
    yield name
    if request.session.testsfailed > failed_before:
        print(gs.logs())
    h.clear_namespace(gs.kube, name)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Attach the tail of the component logs to a failing test that used the control plane."""
    report = yield
    if report.failed:
        cp = getattr(item, "funcargs", {}).get("control_plane")
        if isinstance(cp, ControlPlane):
            report.sections.append(("control plane logs", cp.logs_tail(40)))
    return report
