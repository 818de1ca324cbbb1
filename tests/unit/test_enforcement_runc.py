"""Exec into a paced container, and a user's pause beside the pacer, with a real runtime (runc).

Each case runs ``tests.unit.runc_probe`` in a private mount namespace that makes this machine look
like a hybrid, a v1-only or a v2-only host, so runc uses the matching cgroup manager. The cgroup
the agent's freezer picks must leave ``runc exec`` working (it waits for the thaw) and ``runc
pause``/``resume`` untouched; the container's own freeze file, the one runc reads, must be the one
that breaks exec (or the choice would no longer be needed: the test says so). Needs root, runc and
busybox (``.ci/run`` installs them); skipped with a message elsewhere, failing in CI instead.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.unit.realnode import CGROUP, require, unavailable

THAW_AFTER_S = 0.3


def _missing(view: str) -> str | None:
    for tool in ("runc", "busybox", "unshare", "mount"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install -y runc busybox-static)"
    layout = "hybrid" if view == "hybrid" else ("v1" if view == "v1" else "v2")
    reason = unavailable(layout)  # type: ignore[arg-type]
    if reason is None and view != "v2" and not (CGROUP / "freezer").is_dir():
        reason = "no v1 freezer"
    if reason is None and view in ("hybrid", "v1") and (CGROUP / "cgroup.controllers").exists():
        reason = f"this host is v2-only: no {view} view to give runc"
    return reason


def _probe(view: str, work: Path) -> dict[str, Any]:
    done = subprocess.run(
        ["unshare", "-m", sys.executable, "-m", "tests.unit.runc_probe", view, str(work)],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert done.returncode == 0, done.stderr[-2000:]
    result: dict[str, Any] = json.loads(done.stdout)
    return result


# The raw freeze file that is runc's own pause switch in each view (v2-only: the container's
# cgroup.freeze; v1 runtimes: the container's freezer.state, read back as freezer.self_freezing).
RUNC_SWITCH = {"hybrid": "v1-container", "v1": "v1-container", "v2": "v2-container"}
EXPECTED_TARGET = {"hybrid": "v2 unified/", "v1": "v1 freezer/", "v2": "v2 "}


@pytest.mark.parametrize("view", ["hybrid", "v1", "v2"])
def test_exec_into_a_paced_container_waits_for_the_thaw(view: str, tmp_path: Path) -> None:
    require(_missing(view))
    result = _probe(view, tmp_path)
    print(f"\n{view} host, {result['runc']}: the agent freezes {result['agent_target']}")
    for mode in ("agent", "v1-container", "v1-pod", "v2-container", "v2-pod"):
        if mode in result:
            r = result[mode]
            e = r["exec"]
            print(
                f"  {mode:<13} runc state {r['state_while_frozen']:<8} exec rc {e['rc']:>3} in {e['seconds']:.3f} s; "
                f"after a user's pause and our freeze/thaw: {r['state_after_user_pause_and_our_freeze_thaw']}, "
                f"resume rc {r['resume_rc']}  {e['err'][-60:]}"
            )
    assert result["agent_target"].startswith(EXPECTED_TARGET[view])
    if view != "hybrid":
        assert result["agent_target"].rsplit("/", 1)[-1].startswith("pod")  # the pod's cgroup, not the container's
    agent = result["agent"]
    assert agent["state_while_frozen"] == "running"  # runc does not see our freeze as a pause
    assert agent["exec"]["rc"] == 0 and agent["exec"]["out"] == "hi"
    assert agent["exec"]["seconds"] >= THAW_AFTER_S - 0.05  # it waited for the thaw, then ran
    assert agent["state_after_user_pause_and_our_freeze_thaw"] == "paused"  # our thaw left the user's pause
    assert agent["resume_rc"] == 0 and agent["state_after_resume"] == "running"
    switch = result[RUNC_SWITCH[view]]
    assert switch["state_while_frozen"] == "paused", "runc no longer reads this file as paused: revisit the choice"
    assert switch["exec"]["rc"] != 0 and "paused" in switch["exec"]["err"]
