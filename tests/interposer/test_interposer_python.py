"""The limiter as Python programs meet it: ctypes (dlopen + dlsym, cuGetProcAddress) and the real
pynvml module, which dlopens libnvidia-ml.so.1 (the fake, found through LD_LIBRARY_PATH)."""

from __future__ import annotations

import json

from tests.interposer.conftest import CAP_MIB, CONTEXT_MIB, Node

MIB = 1 << 20


def _json(out: str) -> dict:  # type: ignore[type-arg]
    return json.loads(out.splitlines()[0])  # type: ignore[no-any-return]


def test_ctypes_totals_read_the_cap(node: Node) -> None:
    got = _json(node.ctypes("totals"))
    assert got["devices"] == [{"ordinal": 0, "total_mib": CAP_MIB}]
    assert got["info"] == {"free_mib": CAP_MIB - CONTEXT_MIB, "total_mib": CAP_MIB}


def test_ctypes_seven_then_two_then_free_then_two(node: Node) -> None:
    got = _json(node.ctypes("sequence"))
    assert got["rcs"] == [0, 2, 0, 0]


def test_ctypes_cu_get_proc_address_is_limited(node: Node) -> None:
    got = _json(node.ctypes("procaddress"))
    assert got == {"status": 0, "total_mib": CAP_MIB, "past_cap_rc": 2, "within_rc": 0}


def test_ctypes_fill_stops_at_the_cap(node: Node) -> None:
    got = _json(node.ctypes("fill", "--chunk-mib", "64"))
    assert got["allocated_mib"] == CAP_MIB - CONTEXT_MIB
    assert got["after"]["free_mib"] == 0


PYNVML = r"""
import json, pynvml
pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
m = pynvml.nvmlDeviceGetMemoryInfo(h)
m2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
print(json.dumps({"name": pynvml.nvmlDeviceGetName(h), "v1": [m.total, m.free, m.used],
                  "v2": [m2.total, m2.reserved, m2.free, m2.used],
                  "processes": sorted([p.pid, p.usedGpuMemory] for p in procs)}))
pynvml.nvmlShutdown()
"""


def test_pynvml_reads_the_slice(node: Node) -> None:
    holder = node.spawn([str(node.build.client), "hold", "3072"], node.env())
    try:
        assert "held rc 0" in (holder.stdout.readline() if holder.stdout else "")
        got = _json(node.python(PYNVML))
        used = (3072 + CONTEXT_MIB) * MIB
        assert got["name"] == "Tesla V100-SXM2-32GB"
        assert got["v1"] == [CAP_MIB * MIB, (CAP_MIB * MIB) - used, used]
        total, reserved, free, used2 = got["v2"]
        assert (total, free, used2) == (CAP_MIB * MIB, CAP_MIB * MIB - used, used)
        assert reserved <= used2
        # not wrapped: the per-process list is the driver's (what the agent's watchdog reads)
        assert got["processes"] == [[holder.pid, (3072 + 300) * MIB]]
    finally:
        holder.communicate("", timeout=30)


def test_pynvml_without_the_variables_sees_the_card(node: Node) -> None:
    alone = _json(node.python(PYNVML, env=node.env(limited=False, python=True)))
    preloaded = _json(node.python(PYNVML, env=node.env(limited=False, preloaded=True, python=True)))
    assert preloaded == alone
    assert alone["v1"][0] == 32 * 1024 * MIB
