"""Failure modes: with the variables unset the library changes nothing; a bad cap turns it off
(and says so); without a usable state directory each process is capped alone (and says so)."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.interposer.conftest import CAP_MIB, CONTEXT_MIB, Node, field_of, lines

SCENARIOS = [("totals",), ("sequence",), ("paths", "6144", "2048", "1024"), ("procaddress",), ("errors",), ("nvml",)]


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda s: s[0])
def test_unset_variables_pass_every_call_through(node: Node, scenario: tuple[str, ...]) -> None:
    """The same transcript, value for value, with and without the library loaded: the same
    totals, the same successes at the card's 32 GiB, the same errors, the driver's own pointers."""
    alone = node.client(*scenario, env=node.env(limited=False))
    preloaded = node.client(*scenario, env=node.env(limited=False, preloaded=True))
    assert preloaded == alone
    if scenario[0] == "procaddress":
        assert "libgpuslice-limiter.so" not in preloaded


def test_unset_variables_leave_dlsym_answers_alone(node: Node) -> None:
    alone = node.client("dynamic", env=node.env(limited=False))
    preloaded = node.client("dynamic", env=node.env(limited=False, preloaded=True))
    assert [line for line in alone.splitlines() if line.startswith("dlsym")] == [
        line for line in preloaded.splitlines() if line.startswith("dlsym")
    ]
    assert "libgpuslice-limiter.so" not in "".join(line for line in preloaded.splitlines() if line.startswith("dlsym"))


def test_unset_variables_leave_ctypes_alone(node: Node) -> None:
    for command in ("totals", "sequence", "procaddress"):
        alone = node.ctypes(command, env=node.env(limited=False, python=True))
        assert node.ctypes(command, env=node.env(limited=False, preloaded=True, python=True)) == alone
    assert json.loads(alone)["total_mib"] == 32 * 1024


@pytest.mark.parametrize("cap", ["abc", "0", "-5", "8192m", "99999999999"])
def test_a_cap_that_is_not_a_number_of_mib_turns_the_limiter_off_and_says_so(node: Node, cap: str) -> None:
    env = node.env(cap_mib=None, GPUSLICE_SLICE_MEMORY_MIB=cap)
    done = subprocess.run([str(node.build.client), "totals"], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0
    assert int(field_of(lines(done.stdout, "device 0")[0], "total_v2_mib")) == 32 * 1024
    assert "gpuslice-limiter" in done.stderr and "GPUSLICE_SLICE_MEMORY_MIB" in done.stderr


def test_without_a_state_dir_each_process_is_capped_alone_and_says_so(node: Node) -> None:
    env = node.env(GPUSLICE_SLICE_STATE_DIR=str(node.root / "missing"))
    done = subprocess.run([str(node.build.client), "sequence"], env=env, capture_output=True, text=True, timeout=60)
    assert [int(field_of(line, "rc")) for line in lines(done.stdout, "alloc_")] == [0, 2, 0]
    assert "accounting this process alone" in done.stderr
    # two processes do not see each other (the watchdog, summing the container, still does)
    holder = node.spawn([str(node.build.client), "hold", "5000"], env)
    try:
        assert "held rc 0" in (holder.stdout.readline() if holder.stdout else "")
        out = node.client("hold", "5000", env=env)
        assert "held rc 0" in out
    finally:
        holder.communicate("", timeout=30)


def test_a_ledger_from_another_version_is_not_trusted(node: Node) -> None:
    node.state_dir.mkdir()
    (node.state_dir / "gpuslice-ledger.v1").write_bytes(b"not a ledger")
    done = subprocess.run([str(node.build.client), "totals"], env=node.env(), capture_output=True, text=True,
                          timeout=60)
    assert int(field_of(lines(done.stdout, "info_v2")[0], "free_mib")) == CAP_MIB - CONTEXT_MIB
    assert "unusable ledger" in done.stderr
    assert (node.state_dir / "gpuslice-ledger.v1").read_bytes() == b"not a ledger"  # left for a person to see


def test_the_context_reserve_can_be_tuned(node: Node) -> None:
    out = node.client("totals", env=node.env(GPUSLICE_SLICE_CONTEXT_MIB="1024"))
    assert int(field_of(lines(out, "info_v2")[0], "free_mib")) == CAP_MIB - 1024
    out = node.client("totals", env=node.env(GPUSLICE_SLICE_CONTEXT_MIB="0"))
    assert int(field_of(lines(out, "info_v2")[0], "free_mib")) == CAP_MIB


def test_with_no_driver_loaded_a_global_lookup_finds_nothing(node: Node) -> None:
    """The library exports cuMemAlloc_v2 itself; a program probing for the driver with
    dlsym(RTLD_DEFAULT, ...) must still learn there is none, as it would without us."""
    code = "import ctypes; me = ctypes.CDLL(None); print(hasattr(me, 'cuMemAlloc_v2'), hasattr(me, 'cuInit'))"
    assert node.python(code).split() == ["False", "False"]
    loaded = "import ctypes; ctypes.CDLL('libcuda.so.1', mode=ctypes.RTLD_GLOBAL); " + code.split("; ", 1)[1]
    assert node.python(loaded).split() == ["True", "True"]
