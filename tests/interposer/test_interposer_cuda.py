"""The limiter through a C program linked directly against libcuda.so.1 / libnvidia-ml.so.1, and
through the same program's dlopen + dlsym and cuGetProcAddress lookups."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.interposer.conftest import CAP_MIB, CONTEXT_MIB, REPO, Node, field_of, lines

ORIGINAL_MIB = 32 * 1024
V1_MAX = 2**32 - 1


def test_make_interposer_prints_the_library_path_last() -> None:
    # as a caller runs it: not as a sub-make of `make test` (GNU make then adds its own
    # "Leaving directory" line after everything, as it does under -C; -s drops it)
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS")}
    out = subprocess.run(["make", "interposer"], cwd=REPO, env=env, capture_output=True, text=True,
                         check=True).stdout
    last = out.strip().splitlines()[-1]
    assert last.startswith("/") and last.endswith("/libgpuslice-limiter.so")
    assert Path(last) == (REPO / "build" / "interposer" / "release" / "libgpuslice-limiter.so").resolve()
    assert Path(last).is_file()


def test_it_exports_exactly_the_hooks_and_dlsym(node: Node) -> None:
    out = subprocess.run(["nm", "-D", "--defined-only", str(node.build.limiter)], capture_output=True, text=True,
                         check=True).stdout
    exported = {parts[2] for parts in (line.split() for line in out.splitlines()) if len(parts) == 3
                and parts[1] == "T"}
    assert exported == {
        "dlsym", "cuDeviceTotalMem", "cuDeviceTotalMem_v2", "cuMemGetInfo", "cuMemGetInfo_v2", "cuMemAlloc",
        "cuMemAlloc_v2", "cuMemAllocPitch", "cuMemAllocPitch_v2", "cuMemAllocManaged", "cuMemAllocAsync",
        "cuMemAllocAsync_ptsz", "cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync_ptsz", "cuMemCreate",
        "cuMemFree", "cuMemFree_v2", "cuMemFreeAsync", "cuMemFreeAsync_ptsz", "cuMemRelease", "cuGetProcAddress",
        "cuGetProcAddress_v2", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMemoryInfo_v2",
    }


def test_the_allocation_table_agrees_with_a_reference(node: Node) -> None:
    out = subprocess.run([str(node.build.table_check)], env=node.env(limited=False), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "agrees" in out.stdout


def test_totals_read_the_cap(node: Node) -> None:
    out = node.client("totals")
    [device] = lines(out, "device 0")
    assert int(field_of(device, "total_v2_mib")) == CAP_MIB
    assert int(field_of(device, "total_v1")) == V1_MAX  # the 32-bit call cannot say 8 GiB either
    [info] = lines(out, "info_v2")
    assert int(field_of(info, "total_mib")) == CAP_MIB
    assert int(field_of(info, "free_mib")) == CAP_MIB - CONTEXT_MIB  # this process's context is charged
    [info_v1] = lines(out, "info_v1")
    assert int(field_of(info_v1, "total")) == V1_MAX and int(field_of(info_v1, "free")) == V1_MAX


def test_seven_gib_fit_two_more_do_not_and_fit_again_after_a_free(node: Node) -> None:
    out = node.client("sequence")
    rcs = {line[0]: int(field_of(line, "rc")) for line in lines(out, "alloc_") + lines(out, "free_")}
    assert rcs == {"alloc_7g": 0, "alloc_2g": 2, "free_7g": 0, "alloc_2g_again": 0, "free_2g": 0}
    free = {line[0]: int(field_of(line, "free_mib")) for line in lines(out, "") if "free_mib" in line}
    assert free["after_7g"] == CAP_MIB - CONTEXT_MIB - 7 * 1024
    assert free["after_refused_2g"] == free["after_7g"]  # a refusal changes nothing
    assert free["after_free"] == CAP_MIB - CONTEXT_MIB
    assert free["after_2g"] == CAP_MIB - CONTEXT_MIB - 2 * 1024


def test_every_covered_allocation_call_is_capped_and_every_free_returns_the_budget(node: Node) -> None:
    # next to 6144 MiB held (+ the context reserve), 2048 more pass the cap and 1024 do not
    out = node.client("paths", "6144", "2048", "1024")
    rows = {line[1]: line for line in lines(out, "path ")}
    assert set(rows) == {
        "cuMemAlloc_v2", "cuMemAlloc", "cuMemAllocPitch_v2", "cuMemAllocPitch", "cuMemAllocManaged",
        "cuMemAllocAsync", "cuMemAllocAsync_ptsz", "cuMemAllocFromPoolAsync", "cuMemAllocFromPoolAsync_ptsz",
        "cuMemCreate", "cuMemFree_of_async", "cuMemFreeAsync_of_alloc", "cuMemAllocPitch_v2_padding",
    }
    for name, row in rows.items():
        got = {key: int(field_of(row, key)) for key in ("refused", "ok", "freed", "untouched", "free_back")}
        assert got == {"refused": 2, "ok": 0, "freed": 0, "untouched": 1, "free_back": 1}, name


def test_without_the_limiter_the_same_calls_succeed(node: Node) -> None:
    """The control: it is the limiter, not the fake card, that refuses."""
    out = node.client("paths", "6144", "2048", "1024", env=node.env(limited=False))
    refused = {line[1]: int(field_of(line, "refused")) for line in lines(out, "path ")}
    assert refused["cuMemAlloc_v2"] == 0 and refused["cuMemCreate"] == 0 and refused["cuMemAllocManaged"] == 0


def test_each_visible_device_has_its_own_cap_named_by_uuid(node: Node) -> None:
    """Two cards whose CUDA ordinals run opposite to NVML's indexes: 7 GiB on ordinal 0 leave
    ordinal 1 untouched, and NVML shows them on the card they are on (index 1)."""
    node.devices = 2
    node.fake["FAKEGPU_ORDER"] = "reversed"
    holder = node.spawn([str(node.build.client), "hold", "7168", "0"], node.env())
    try:
        assert "held rc 0" in (holder.stdout.readline() if holder.stdout else "")
        out = node.client("sequence", "1")
        assert [int(field_of(line, "rc")) for line in lines(out, "alloc_")] == [0, 2, 0]
        nvml = {int(line[1]): line for line in lines(node.client("nvml"), "nvml ")}
        assert int(field_of(nvml[1], "used_mib")) == 7168 + CONTEXT_MIB
        assert int(field_of(nvml[0], "used_mib")) == 0
        refused = node.client("hold", "1024", "0", env=node.env())
        assert "held rc 2" in refused
    finally:
        holder.communicate("", timeout=30)
    assert holder.returncode == 0


def test_dlopen_and_dlsym_hand_out_the_limited_calls(node: Node) -> None:
    out = node.client("dynamic")
    [total] = lines(out, "dlsym cuDeviceTotalMem_v2")
    assert field_of(total, "lives_in") == "libgpuslice-limiter.so" and int(field_of(total, "total_mib")) == CAP_MIB
    [alloc] = lines(out, "dlsym cuMemAlloc_v2")
    assert field_of(alloc, "lives_in") == "libgpuslice-limiter.so" and field_of(alloc, "refused_9g") == "2"
    [init] = lines(out, "dlsym cuInit")
    assert field_of(init, "lives_in") == "libcuda.so.1"  # what we do not wrap is the driver's own
    [unknown] = lines(out, "dlsym cuNoSuchCall")
    assert field_of(unknown, "cuNoSuchCall") == "null" and field_of(unknown, "dlerror") == "set"
    assert "dlerror_after_calls clear" in out
    [nxt] = lines(out, "rtld_next_dlsym")
    assert field_of(nxt, "same_as_mine") == "1"  # RTLD_NEXT is still relative to the caller


def _proc_address_checks(out: str) -> None:
    limited = ("cuGetProcAddress@12000", "cuMemAlloc@12000", "cuMemFree@12000", "cuMemGetInfo@12000",
               "cuMemAlloc@3000", "cuMemFree@3000", "cuMemAllocAsync_ptsz", "cuGetProcAddress(v1")
    for name in limited:
        [line] = lines(out, name + " ")
        assert field_of(line, "lives_in") == "libgpuslice-limiter.so", line
    [alloc] = lines(out, "cuMemAlloc@12000")
    assert field_of(alloc, "refused_9g") == "2" and field_of(alloc, "ok_1g") == "0"
    assert field_of(lines(out, "cuMemGetInfo@12000")[0], "total_mib") == str(CAP_MIB)
    [v1] = lines(out, "cuMemAlloc@3000")
    assert field_of(v1, "refused_2g") == "2" and field_of(v1, "ok_1g") == "0"
    assert field_of(lines(out, "cuMemAllocAsync_ptsz")[0], "refused_9g") == "2"
    assert field_of(lines(out, "cuGetProcAddress(v1")[0], "refused_9g") == "2"
    assert field_of(lines(out, "cuDeviceGetCount@12000")[0], "lives_in") == "libcuda.so.1"
    [unknown] = lines(out, "cuNoSuchCall")
    assert field_of(unknown, "fn") == "null" and field_of(unknown, "status") == "1"


def test_cu_get_proc_address_resolves_to_the_limited_calls(node: Node) -> None:
    _proc_address_checks(node.client("procaddress"))


def test_a_driver_whose_entry_points_differ_from_dlsym_is_mapped_by_name(node: Node) -> None:
    """Where cuGetProcAddress answers with its own trampolines, the limiter goes by name and
    version, and calls the driver through the pointer the driver gave."""
    node.fake["FAKEGPU_PROC_ADDRESS"] = "trampoline"
    _proc_address_checks(node.client("procaddress"))


def test_driver_errors_are_the_drivers_own(node: Node) -> None:
    """No cuInit, no context, bad arguments, a full card: the limited run answers exactly as the
    driver alone, a NULL pointer past the cap included (INVALID_VALUE, not OUT_OF_MEMORY)."""
    alone = node.client("errors", env=node.env(limited=False))
    limited = node.client("errors")
    assert limited == alone
    assert "alloc_without_context 201" in limited and "alloc_null_pointer_past_cap 1" in limited


def test_a_driver_without_a_gpu_fails_as_it_does_alone(node: Node) -> None:
    node.fake["FAKEGPU_NO_DEVICE"] = "1"
    alone = node.client("nodevice", env=node.env(limited=False))
    assert node.client("nodevice") == alone
    assert "cuInit 100" in alone and "nvmlInit_v2 9" in alone


def test_nvml_reports_the_slice(node: Node) -> None:
    holder = node.spawn([str(node.build.client), "hold", "3072"], node.env())
    try:
        assert "held rc 0" in (holder.stdout.readline() if holder.stdout else "")
        [row] = lines(node.client("nvml"), "nvml 0")
        assert int(field_of(row, "total_mib")) == CAP_MIB
        used = 3072 + CONTEXT_MIB
        v1 = row[row.index("v1"):row.index("v2")]
        v2 = row[row.index("v2"):]
        assert (int(field_of(v1, "used_mib")), int(field_of(v1, "free_mib"))) == (used, CAP_MIB - used)
        assert (int(field_of(v2, "total_mib")), int(field_of(v2, "used_mib"))) == (CAP_MIB, used)
        assert int(field_of(v2, "free_mib")) == CAP_MIB - used
        assert int(field_of(v2, "reserved_mib")) <= used
        assert field_of(row, "wrong_version") == "25"
    finally:
        holder.communicate("", timeout=30)
