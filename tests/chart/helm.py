"""helm, built from its Go module by ``deploy/e2e/build-helm.sh`` (cached), and the chart's renders.

``python -m tests.chart.helm`` (``make manifests``) writes ``deploy/manifests/`` from the chart;
``tests/chart/test_manifests.py`` fails when the files differ from a fresh render.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
CHART = REPO_ROOT / "deploy" / "chart"
MANIFESTS = REPO_ROOT / "deploy" / "manifests"
BUILD_SCRIPT = REPO_ROOT / "deploy" / "e2e" / "build-helm.sh"
KUBE_VERSION = "1.34.4"
NAMESPACE = "gpuslice-system"

# the plain manifests: file -> the --set pairs of its render (and the one template it shows, if any)
RENDERS: dict[str, tuple[tuple[str, ...], str]] = {
    # no pre-delete hook: without Helm nothing runs it (README's kubectl uninstall runs its check first)
    "gpuslice.yaml": (("namespace.create=true", "uninstall.refuseWhileInUse=false"), ""),
    "monitoring.yaml": (("monitoring.prometheusRule.enabled=true", "monitoring.podMonitor.enabled=true"),
                        "templates/monitoring.yaml"),
}
HEADER = ("# Rendered from deploy/chart by `make manifests` (helm template gpuslice deploy/chart -n {ns} {sets}).\n"
          "# Do not edit: change the chart and render again; tests/chart/test_manifests.py fails on any difference.\n")


class HelmUnavailable(RuntimeError):
    """helm could not be built (no Go, no module proxy)."""


def helm_binary() -> Path:
    """The helm binary: $GPUSLICE_HELM if set, else built (once, cached) by deploy/e2e/build-helm.sh."""
    if os.environ.get("GPUSLICE_HELM"):
        return Path(os.environ["GPUSLICE_HELM"])
    try:
        out = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=3600)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise HelmUnavailable(f"{BUILD_SCRIPT} did not complete: {e}") from None
    if out.returncode != 0:
        raise HelmUnavailable(f"{BUILD_SCRIPT} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    return Path(out.stdout.strip().splitlines()[-1])


def template(helm: Path, values: Mapping[str, Any] | None = None, *, sets: Sequence[str] = (),
             show_only: str = "", namespace: str = NAMESPACE) -> str:
    """``helm template`` of the chart: its YAML text. RuntimeError with helm's message on failure."""
    argv = [str(helm), "template", "gpuslice", str(CHART), "--namespace", namespace, "--kube-version", KUBE_VERSION]
    for s in sets:
        argv += ["--set", s]
    if show_only:
        argv += ["--show-only", show_only]
    if values:
        argv += ["--values", "-"]
    out = subprocess.run(argv, input=yaml.safe_dump(dict(values or {})), capture_output=True, text=True,
                         timeout=120, cwd=REPO_ROOT)
    if out.returncode != 0:
        raise RuntimeError(f"helm template failed: {out.stderr.strip()}")
    return out.stdout


def objects(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def manifest(helm: Path, name: str) -> str:
    """The text ``deploy/manifests/<name>`` must have."""
    sets, show_only = RENDERS[name]
    body = template(helm, sets=sets, show_only=show_only)
    chart_path = str(CHART.relative_to(REPO_ROOT))
    body = body.replace(str(CHART), chart_path)
    return HEADER.format(ns=NAMESPACE, sets=" ".join(f"--set {s}" for s in sets)
                         + (f" --show-only {show_only}" if show_only else "")) + body


def main() -> int:
    helm = helm_binary()
    MANIFESTS.mkdir(exist_ok=True)
    for name in RENDERS:
        (MANIFESTS / name).write_text(manifest(helm, name))
        print(f"wrote {(MANIFESTS / name).relative_to(REPO_ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
