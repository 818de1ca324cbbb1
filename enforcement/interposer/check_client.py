"""A CUDA driver / NVML client through ctypes (standard library only), one scenario per command.

The tests run it against the fake driver; ``real_gpu_check.sh`` runs the very same commands
against the real one. It loads ``libcuda.so.1`` and ``libnvidia-ml.so.1`` with ``dlopen`` and
finds every function with ``dlsym``, as ctypes-based programs (pynvml, numba, cuda-python) do,
and the CUDA runtime's path through ``cuGetProcAddress`` is one command. Each command prints one
JSON line; with ``--hold`` it then keeps what it allocated until its standard input closes.

    python3 check_client.py probe | totals | sequence | procaddress | nvml | processes
    python3 check_client.py hold MIB | ollama [--fraction F] [--chunk-mib N] | fill [--chunk-mib N]

Exit codes: 0 ran (the JSON says what happened), 3 an unexpected driver error, 4 no driver.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
from typing import Any

MIB = 1 << 20
GIB = 1 << 30
OUT_OF_MEMORY = 2


class DriverError(RuntimeError):
    pass


def _load(name: str) -> ctypes.CDLL:
    try:
        return ctypes.CDLL(name)
    except OSError as e:
        print(json.dumps({"error": f"cannot load {name}: {e}"}), flush=True)
        sys.exit(4)


class Cuda:
    """The driver calls the scenarios use, each found with dlsym on libcuda.so.1."""

    def __init__(self) -> None:
        self.lib = _load("libcuda.so.1")
        self.held: list[tuple[str, int]] = []

    def call(self, name: str, *args: Any) -> int:
        return int(getattr(self.lib, name)(*args))

    def ok(self, name: str, *args: Any) -> None:
        rc = self.call(name, *args)
        if rc != 0:
            raise DriverError(f"{name} returned CUDA error {rc}")

    def open(self, ordinal: int = 0) -> None:
        """cuInit and the device's primary context made current, as the CUDA runtime does."""
        device, ctx = ctypes.c_int(), ctypes.c_void_p()
        self.ok("cuInit", 0)
        self.ok("cuDeviceGet", ctypes.byref(device), ordinal)
        self.ok("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), device)
        self.ok("cuCtxSetCurrent", ctx)

    def info(self) -> dict[str, int]:
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self.ok("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total))
        return {"free_mib": free.value // MIB, "total_mib": total.value // MIB}

    def alloc(self, mib: int, fn: Any = None) -> int:
        """cuMemAlloc_v2 (or the given function pointer); keeps the pointer on success."""
        ptr = ctypes.c_uint64()
        call = fn if fn is not None else self.lib.cuMemAlloc_v2
        rc = int(call(ctypes.byref(ptr), ctypes.c_size_t(mib * MIB)))
        if rc == 0:
            self.held.append(("cuMemFree_v2", ptr.value))
        elif rc != OUT_OF_MEMORY:
            raise DriverError(f"cuMemAlloc_v2({mib} MiB) returned CUDA error {rc}")
        return rc

    def free_last(self) -> int:
        name, ptr = self.held.pop()
        return self.call(name, ctypes.c_uint64(ptr))

    def free_all(self) -> None:
        while self.held:
            rc = self.free_last()
            if rc != 0:
                raise DriverError(f"cuMemFree_v2 returned CUDA error {rc}")


def probe(cuda: Cuda, _: argparse.Namespace) -> dict[str, Any]:
    count = ctypes.c_int()
    rc = cuda.call("cuInit", 0)
    if rc == 0:
        rc = cuda.call("cuDeviceGetCount", ctypes.byref(count))
    return {"cuInit": rc, "devices": count.value}


def totals(cuda: Cuda, _: argparse.Namespace) -> dict[str, Any]:
    cuda.ok("cuInit", 0)
    count = ctypes.c_int()
    cuda.ok("cuDeviceGetCount", ctypes.byref(count))
    devices = []
    for ordinal in range(count.value):
        total = ctypes.c_size_t()
        cuda.ok("cuDeviceTotalMem_v2", ctypes.byref(total), ordinal)
        devices.append({"ordinal": ordinal, "total_mib": total.value // MIB})
    cuda.open(0)
    return {"devices": devices, "info": cuda.info()}


def sequence(cuda: Cuda, _: argparse.Namespace) -> dict[str, Any]:
    """7 GiB, then 2 GiB more, then free the 7, then the 2 again."""
    cuda.open(0)
    steps: list[dict[str, Any]] = [{"step": "start", **cuda.info()}]
    steps.append({"step": "alloc 7 GiB", "rc": cuda.alloc(7 * 1024), **cuda.info()})
    seven = cuda.held[-1]
    steps.append({"step": "alloc 2 GiB", "rc": cuda.alloc(2 * 1024), **cuda.info()})
    cuda.held.remove(seven)
    steps.append({"step": "free 7 GiB", "rc": cuda.call(seven[0], ctypes.c_uint64(seven[1])), **cuda.info()})
    steps.append({"step": "alloc 2 GiB", "rc": cuda.alloc(2 * 1024), **cuda.info()})
    cuda.free_all()
    return {"steps": steps, "rcs": [s["rc"] for s in steps[1:]]}


def procaddress(cuda: Cuda, _: argparse.Namespace) -> dict[str, Any]:
    """The runtime's way: cuGetProcAddress_v2("cuMemAlloc", 12000) and a call past the cap."""
    cuda.open(0)
    fn = ctypes.c_void_p()
    status = ctypes.c_int(-1)
    cuda.ok("cuGetProcAddress_v2", b"cuMemAlloc", ctypes.byref(fn), 12000, ctypes.c_uint64(0), ctypes.byref(status))
    alloc = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t)(fn.value or 0)
    total_mib = cuda.info()["total_mib"]
    past_cap = cuda.alloc(total_mib + 1024, alloc)
    within = cuda.alloc(1024, alloc)
    cuda.free_all()
    return {"status": status.value, "total_mib": total_mib, "past_cap_rc": past_cap, "within_rc": within}


def hold(cuda: Cuda, args: argparse.Namespace) -> dict[str, Any]:
    cuda.open(args.ordinal)
    return {"rc": cuda.alloc(args.mib), "mib": args.mib, **cuda.info()}


def ollama(cuda: Cuda, args: argparse.Namespace) -> dict[str, Any]:
    """Like an inference server sizing its offload: read free memory, take a fraction in chunks."""
    cuda.open(args.ordinal)
    seen = cuda.info()
    target = int(seen["free_mib"] * args.fraction)
    allocated, refused = 0, 0
    while allocated < target:
        chunk = min(args.chunk_mib, target - allocated)
        if cuda.alloc(chunk) != 0:
            refused += 1
            break
        allocated += chunk
    return {"free_read_mib": seen["free_mib"], "total_read_mib": seen["total_mib"], "target_mib": target,
            "allocated_mib": allocated, "refused": refused, "after": cuda.info()}


def fill(cuda: Cuda, args: argparse.Namespace) -> dict[str, Any]:
    """Allocate chunks until the driver (or the limiter) says out of memory."""
    cuda.open(args.ordinal)
    allocated = 0
    while cuda.alloc(args.chunk_mib) == 0:
        allocated += args.chunk_mib
    return {"allocated_mib": allocated, "chunk_mib": args.chunk_mib, "after": cuda.info()}


class Nvml:
    def __init__(self) -> None:
        self.lib = _load("libnvidia-ml.so.1")
        rc = int(self.lib.nvmlInit_v2())
        if rc != 0:
            raise DriverError(f"nvmlInit_v2 returned NVML error {rc}")

    def handles(self) -> list[ctypes.c_void_p]:
        count = ctypes.c_uint()
        self.lib.nvmlDeviceGetCount_v2(ctypes.byref(count))
        out = []
        for i in range(count.value):
            handle = ctypes.c_void_p()
            self.lib.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle))
            out.append(handle)
        return out


class Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class ProcessInfo(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong), ("gpuInstanceId", ctypes.c_uint),
                ("computeInstanceId", ctypes.c_uint)]


def nvml(_: Cuda | None, __: argparse.Namespace) -> dict[str, Any]:
    lib = Nvml()
    out = []
    for index, handle in enumerate(lib.handles()):
        m = Memory()
        rc = int(lib.lib.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(m)))
        out.append({"index": index, "rc": rc, "total_mib": m.total // MIB, "free_mib": m.free // MIB,
                    "used_mib": m.used // MIB})
    return {"devices": out}


def processes(_: Cuda | None, __: argparse.Namespace) -> dict[str, Any]:
    """Per-process GPU memory, as the agent's watchdog reads it (run it without the limiter)."""
    lib = Nvml()
    out = []
    for index, handle in enumerate(lib.handles()):
        infos = (ProcessInfo * 64)()
        count = ctypes.c_uint(64)
        rc = int(lib.lib.nvmlDeviceGetComputeRunningProcesses_v3(handle, ctypes.byref(count), infos))
        if rc != 0:
            raise DriverError(f"nvmlDeviceGetComputeRunningProcesses_v3 returned NVML error {rc}")
        out += [{"index": index, "pid": infos[i].pid, "used_mib": infos[i].usedGpuMemory // MIB}
                for i in range(count.value)]
    return {"processes": out}


COMMANDS = {"probe": probe, "totals": totals, "sequence": sequence, "procaddress": procaddress, "hold": hold,
            "ollama": ollama, "fill": fill}
NVML_COMMANDS = {"nvml": nvml, "processes": processes}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="CUDA driver / NVML scenarios through ctypes")
    parser.add_argument("command", choices=sorted([*COMMANDS, *NVML_COMMANDS]))
    parser.add_argument("mib", nargs="?", type=int, default=1024)
    parser.add_argument("--ordinal", type=int, default=0)
    parser.add_argument("--fraction", type=float, default=0.9)
    parser.add_argument("--chunk-mib", type=int, default=256)
    parser.add_argument("--hold", action="store_true", help="keep the memory until stdin closes")
    args = parser.parse_args(argv)
    cuda = None
    try:
        if args.command in NVML_COMMANDS:
            result = NVML_COMMANDS[args.command](None, args)
        else:
            cuda = Cuda()
            result = COMMANDS[args.command](cuda, args)
    except DriverError as e:
        print(json.dumps({"error": str(e)}), flush=True)
        return 3
    print(json.dumps(result), flush=True)
    if cuda is not None and (args.hold or args.command == "hold"):
        sys.stdin.read()
        cuda.free_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())
