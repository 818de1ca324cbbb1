"""A prepared check of the real NVML path on a machine with an NVIDIA GPU (run it by hand or in a lab).

``python -m enforcement.real_gpu_check [--gpu 0] [--cap-mib 1024] [--step-mib 256]``

1. Lists the devices through the same PynvmlBackend the agent uses.
2. Starts a child process that allocates GPU memory in steps, past a small cap, and holds it.
   Assumption: only the NVIDIA driver is needed. The child calls the CUDA *driver* API through
   ctypes (``libcuda.so.1``: cuInit, cuDevicePrimaryCtxRetain, cuMemAlloc_v2), so neither PyTorch
   nor CuPy is required; ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` makes its ordinal match NVML's index.
   It prints a timestamp for every step, so the moment it crossed the cap is known.
3. Runs the real MemoryWatchdog (real NVML readings, real pidfd kill) with the child as the only
   process of a synthetic slice capped at ``--cap-mib``, and reports the time from crossing the
   cap to the kill. Success: the kill came within one memory period (plus scheduling slack).

Without a driver (``NVMLError_LibraryNotFound``) it says so and exits 0: nothing to check here.
Exit codes: 0 passed or skipped, 1 failed, 2 bad arguments.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, TextIO

import pynvml

from enforcement.attribution import ProcessOwner
from enforcement.cgroups import ContainerRef, read_start_time
from enforcement.clock import SystemClock
from enforcement.events import RecordingEventSink
from enforcement.killer import PidfdKiller
from enforcement.nvml import NvmlError, NvmlUnavailable, PynvmlBackend
from enforcement.pods import MIB, SliceHolder
from enforcement.watchdog import MemoryWatchdog

ALLOCATOR = r"""
import ctypes, sys, time
ordinal, step_mib, target_mib = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
try:
    cuda = ctypes.CDLL("libcuda.so.1")
except OSError as e:
    print(f"ERROR no libcuda.so.1: {e}", flush=True); sys.exit(3)
def ok(name, *args):
    rc = getattr(cuda, name)(*args)
    if rc != 0:
        print(f"ERROR {name} returned CUDA error {rc}", flush=True); sys.exit(4)
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
ok("cuInit", 0)
ok("cuDeviceGet", ctypes.byref(dev), ordinal)
ok("cuDevicePrimaryCtxRetain", ctypes.byref(ctx), dev)
ok("cuCtxSetCurrent", ctx)
held, ptrs = 0, []
while held < target_mib:
    ptr = ctypes.c_uint64()
    ok("cuMemAlloc_v2", ctypes.byref(ptr), ctypes.c_size_t(step_mib << 20))
    ptrs.append(ptr); held += step_mib
    print(f"HELD {held} {time.time():.6f}", flush=True)
    time.sleep(0.5)
print("HOLDING", flush=True)
time.sleep(3600)
"""


def _spawn_allocator(ordinal: int, step_mib: int, target_mib: int) -> subprocess.Popen[str]:
    env = {"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "PATH": "/usr/bin:/bin"}
    return subprocess.Popen(
        [sys.executable, "-c", ALLOCATOR, str(ordinal), str(step_mib), str(target_mib)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )


def _reader(child: subprocess.Popen[str], lines: list[str]) -> None:
    assert child.stdout is not None
    for line in child.stdout:
        lines.append(line.strip())


def check(
    out: TextIO,
    lib: ModuleType | Any = pynvml,
    gpu_index: int = 0,
    cap_mib: int = 1024,
    step_mib: int = 256,
    period_s: float = 0.2,
    timeout_s: float = 60.0,
    spawn: Callable[[int, int, int], subprocess.Popen[str]] = _spawn_allocator,
    proc_root: Path = Path("/proc"),
) -> int:
    """Run the check; returns the exit code (0 passed or skipped, 1 failed)."""
    try:
        backend = PynvmlBackend(lib).open()
    except NvmlUnavailable as e:
        print(f"SKIPPED: no NVIDIA driver or NVML library on this machine ({e}); nothing to check", file=out)
        return 0
    except NvmlError as e:
        print(f"FAILED: NVML is present but does not work: {e}", file=out)
        return 1
    try:
        devices = backend.devices()
        print(f"{len(devices)} GPU(s):", file=out)
        for d in devices:
            print(f"  {d.index}: {d.name} {d.uuid} {d.memory_total / MIB:.0f} MiB", file=out)
        if not 0 <= gpu_index < len(devices):
            print(f"FAILED: no GPU with index {gpu_index}", file=out)
            return 1
        return _run(
            out, backend, devices[gpu_index].uuid, gpu_index, cap_mib, step_mib, period_s, timeout_s, spawn, proc_root
        )
    finally:
        backend.close()


def _run(
    out: TextIO,
    backend: PynvmlBackend,
    uuid: str,
    gpu_index: int,
    cap_mib: int,
    step_mib: int,
    period_s: float,
    timeout_s: float,
    spawn: Callable[[int, int, int], subprocess.Popen[str]],
    proc_root: Path,
) -> int:
    target_mib = cap_mib + 2 * step_mib
    child = spawn(gpu_index, step_mib, target_mib)
    lines: list[str] = []
    threading.Thread(target=_reader, args=(child, lines), daemon=True).start()
    start = read_start_time(proc_root, child.pid)
    if start is None:
        print("FAILED: the allocator exited at once", file=out)
        return 1
    holder = SliceHolder("real-gpu-check", "gpuslice", "real-gpu-check", uuid, "check", cap_mib * MIB, 250)
    ref = ContainerRef("real-gpu-check", "0" * 64, None)

    def owner(pid: int, gpu: str) -> ProcessOwner | None:
        # Only the child belongs to the synthetic slice: every other process on the GPU is left alone.
        return ProcessOwner(holder, pid, start, ref, "allocator") if pid == child.pid and gpu == uuid else None

    events = RecordingEventSink()
    watchdog = MemoryWatchdog(backend, owner, PidfdKiller(proc_root), events, SystemClock())
    print(
        f"allocator pid {child.pid}: {step_mib} MiB steps up to {target_mib} MiB; cap {cap_mib} MiB; "
        f"memory period {period_s} s",
        file=out,
    )
    deadline = time.time() + timeout_s
    killed_at: float | None = None
    last_under = time.time()  # the breach began after the last reading at or under the cap
    try:
        while time.time() < deadline and killed_at is None:
            for scan in watchdog.check([uuid]):
                now = time.time()
                if not scan.ok:
                    print(f"  NVML reading failed: {scan.error} (nothing killed)", file=out)
                for usage in scan.holders.values():
                    used = usage.used_bytes
                    print(f"  {now:.3f} slice holds {'?' if used is None else used // MIB} MiB", file=out)
                    if used is not None and used <= holder.cap_bytes and not scan.kills:
                        last_under = now
                if scan.kills:
                    killed_at = scan.kills[0].time
            if child.poll() is not None and killed_at is None:
                print(f"FAILED: the allocator exited by itself: {' | '.join(lines[-3:])}", file=out)
                return 1
            time.sleep(period_s)
        if killed_at is None:
            print(f"FAILED: not killed within {timeout_s:.0f} s; allocator said: {' | '.join(lines[-3:])}", file=out)
            return 1
        child.wait(10)
        for event in events.events:
            print(f"  event {event.reason}: {event.message}", file=out)
        crossed = _crossed_at(lines, cap_mib)
        if crossed is not None:
            print(f"  the allocator's own allocations passed the cap at {crossed:.3f}", file=out)
        breach = killed_at - last_under
        verdict = "PASSED" if breach <= 2 * period_s else "FAILED"
        print(
            f"{verdict}: last reading under the cap at {last_under:.3f}, killed at {killed_at:.3f}: the breach "
            f"lasted at most {breach:.3f} s (memory period {period_s} s; the NVML reading includes the CUDA context)",
            file=out,
        )
        return 0 if verdict == "PASSED" else 1
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)


def _crossed_at(lines: Sequence[str], cap_mib: int) -> float | None:
    for line in lines:
        parts = line.split()
        if len(parts) == 3 and parts[0] == "HELD" and int(parts[1]) > cap_mib:
            return float(parts[2])
    return None


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m enforcement.real_gpu_check", description=__doc__.split("\n")[0])
    p.add_argument("--gpu", type=int, default=0, help="NVML index of the GPU to use (0)")
    p.add_argument("--cap-mib", type=int, default=1024, help="the synthetic slice's memory cap (1024)")
    p.add_argument("--step-mib", type=int, default=256, help="allocation step of the child (256)")
    p.add_argument("--period", type=float, default=0.2, help="memory period in seconds (0.2)")
    p.add_argument("--timeout", type=float, default=60.0, help="give up after this many seconds (60)")
    args = p.parse_args(sys.argv[1:] if argv is None else list(argv))
    if args.cap_mib <= 0 or args.step_mib <= 0 or args.period <= 0:
        print("cap, step and period must be positive", file=sys.stderr)
        return 2
    return check(sys.stdout, pynvml, args.gpu, args.cap_mib, args.step_mib, args.period, args.timeout)


if __name__ == "__main__":
    raise SystemExit(main())
