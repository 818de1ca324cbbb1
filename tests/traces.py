"""Where tests and benchmarks find the shared research traces: ``$GPUSLICE_TRACES``, never a guessed path.

The traces are research-only data kept outside the project (``shared/traces`` beside a checkout;
``.ci/run`` exports the setting). A test that needs them skips, with the reason, when the
setting is missing, and fails instead when the setting names a folder without them (``.ci/run``
sets it, so CI fails there) or when ``CI=true``: both promised them.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

TRACES_ENV = "GPUSLICE_TRACES"
OPENB = "alibaba-openb"


def openb_dir() -> Path | None:
    """``$GPUSLICE_TRACES/alibaba-openb`` when the setting names a folder that has it, else None."""
    root = os.environ.get(TRACES_ENV)
    if not root:
        return None
    path = Path(root) / OPENB
    return path if (path / "openb_node_list_gpu_node.csv").is_file() else None


def require_openb() -> Path:
    """The openb folder; else fail when it was promised (setting given, or ``CI=true``), else skip."""
    path = openb_dir()
    if path is not None:
        return path
    root = os.environ.get(TRACES_ENV)
    why = (f"${TRACES_ENV} is not set" if not root else
           f"${TRACES_ENV}={root} has no {OPENB}/openb_node_list_gpu_node.csv")
    if root or os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"the openb traces were promised but are missing: {why}", pytrace=False)
    pytest.skip(f"openb traces not found: {why} (point it at the folder holding {OPENB}/)")
