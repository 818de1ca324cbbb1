"""real_gpu_check.sh: it refuses clearly where there is no GPU, and its assertions hold against the
fake driver (with a stand-in nvidia-smi), so on a GPU machine only the driver differs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.interposer.conftest import SOURCES, Build, Node

SCRIPT = SOURCES / "real_gpu_check.sh"
FAKE_SMI = Path(__file__).with_name("fake_nvidia_smi.py")


@pytest.fixture
def release(builds: dict[str, Build], tmp_path: Path) -> Node:
    return Node(builds["release"], tmp_path)


def _fake_smi(tmp: Path) -> Path:
    smi = tmp / "nvidia-smi"
    smi.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{FAKE_SMI}" "$@"\n')
    smi.chmod(0o755)
    return smi


def _run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=300)


def test_without_nvidia_smi_it_says_no_gpu_and_exits_2(release: Node) -> None:
    done = _run({**release.env(limited=False), "NVIDIA_SMI": str(release.root / "no-such-nvidia-smi")})
    assert done.returncode == 2
    assert "NO GPU" in done.stderr and "nothing was checked" in done.stderr
    assert "passed" not in done.stdout


def test_with_a_driver_but_no_gpu_it_says_no_gpu_and_exits_2(release: Node) -> None:
    release.fake["FAKEGPU_NO_DEVICE"] = "1"
    done = _run({**release.env(limited=False), "NVIDIA_SMI": str(_fake_smi(release.root)), "PYTHON": sys.executable})
    assert done.returncode == 2, done.stdout + done.stderr
    assert "NO GPU" in done.stderr


def test_its_checks_pass_against_the_fake_driver(release: Node) -> None:
    env = {**release.env(limited=False), "NVIDIA_SMI": str(_fake_smi(release.root)), "PYTHON": sys.executable}
    done = _run(env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "FAILED" not in done.stdout
    summary = done.stdout.strip().splitlines()[-1]
    assert summary.startswith("real_gpu_check: ") and summary.endswith(" passed, 0 failed")
    assert int(summary.split()[1]) >= 12  # 14 with torch and cupy installed
    for name in ("nvidia-smi total", "7 GiB / 2 GiB / free / 2 GiB", "share back after SIGKILL",
                 "filled under the cap in NVML", "ollama-like under the cap in NVML", "pass-through"):
        assert f"ok      {name}:" in done.stdout, name
