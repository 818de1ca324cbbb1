"""Fixtures of the install suite (``make e2e-install``): a full cluster on this machine and README's commands.

The cluster (``cluster.py``) is built from pinned sources (``deploy/e2e/build-kube.sh install``, cached)
and started once per session under the real-node lock; helm comes from ``deploy/e2e/build-helm.sh``.
README's blocks run in :func:`shell`'s environment: kubectl, helm and ctr on PATH, the cluster's admin
kubeconfig, ``REGISTRY=localhost`` (the images are loaded into the node, README "Install", step 1).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.chart.helm import HelmUnavailable, helm_binary
from tests.e2e_node.lock import hold

from .cluster import FullCluster

AGENT_HOST_PATHS = ("/var/lib/gpuslice", "/var/lib/gpuslice-agent", "/run/gpuslice-agent")

REPO = Path(__file__).resolve().parents[2]


def _fail(message: str) -> None:
    pytest.fail(message, pytrace=False)


@pytest.fixture(scope="session")
def binaries() -> tuple[Path, Path, Path]:
    if os.geteuid() != 0:
        _fail("the install suite needs root (a kubelet, a container runtime, iptables, image builds)")
    out = subprocess.run(["bash", str(REPO / "deploy" / "e2e" / "build-kube.sh"), "install"], capture_output=True,
                         text=True, timeout=5400)
    if out.returncode != 0:
        _fail(f"build-kube.sh install failed:\n{out.stderr[-4000:]}")
    kube, containerd, coredns = (Path(p) for p in out.stdout.strip().splitlines()[-3:])
    return kube, containerd, coredns


@pytest.fixture(scope="session")
def helm() -> Path:
    try:
        return helm_binary()
    except HelmUnavailable as e:
        _fail(str(e))
        raise


@pytest.fixture(scope="session")
def cluster(binaries: tuple[Path, Path, Path], helm: Path) -> Iterator[FullCluster]:
    lock = hold("e2e-install")
    c = FullCluster(*binaries)
    # the agent's files, where a failed test never reached README's uninstall
    c.record.made_if_missing(*(Path(p) for p in AGENT_HOST_PATHS))
    try:
        c.start()
    except Exception as e:
        logs = c.logs()
        c.stop()
        _fail(f"the cluster did not start: {e}\n{logs}")
    try:
        yield c
    finally:
        keep = os.environ.get("GPUSLICE_E2E_LOGS")
        if keep:
            Path(keep).mkdir(parents=True, exist_ok=True)
            (Path(keep) / "e2e-install-cluster.log").write_text(c.logs(400))
        c.stop()
        for spec in Path("/var/run/cdi").glob("gpuslice.io-*.json"):  # where /var/run/cdi was there before
            spec.unlink(missing_ok=True)
        if lock is not None:
            lock.close()


@pytest.fixture(scope="session")
def shell(cluster: FullCluster, helm: Path) -> dict[str, str]:
    """The environment README's blocks run in."""
    env = cluster.env()
    env["PATH"] = f"{helm.parent}:{env['PATH']}"
    env["REGISTRY"] = "localhost"
    # helm's and kubectl's own caches and settings: the run's, not the user's (HOME stays: the build caches)
    for var in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME", "KUBECACHEDIR"):
        env[var] = str(cluster.work / var.lower())
    return env


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """A failing test gets the cluster's state and the tails of its logs."""
    report = yield
    if report.failed:
        c = getattr(item, "funcargs", {}).get("cluster")
        if isinstance(c, FullCluster):
            state = c.kubectl("get", "pods,jobs,events", "-A", "-o", "wide", check=False)
            report.sections.append(("cluster state", state.stdout[-6000:] + state.stderr[-1000:]))
            report.sections.append(("cluster logs", c.logs(30)))
    return report
