"""A simulated GPU, and ``FakeNVML``: pynvml's names, signatures and error classes over it.

The model (discrete time, one tick = 10 ms of the injected clock):

* A process has a **demand curve** (the GPU load it offers when alone, 0..1), a **launch queue**
  of ``queue_s`` seconds (how far its CPU side may run ahead of the GPU) and a **memory trace**.
  Each tick a thawed process enqueues ``demand * tick`` of GPU work, up to a full queue.
* The GPU **time-slices between runnable contexts**: each tick is split equally among the
  processes with queued work (water-filling: one that needs less leaves the rest to the others).
* A **frozen** process enqueues nothing, but its queue **keeps draining**: work already launched
  runs to completion (the drain lag the pacer must live with).
* NVML-like **sampling**: per-process busy time is summed over windows of ``sample_window_s``;
  at each window end every process that ran gets a sample ``floor(100 * busy / window)`` (integer
  percent), stamped with the window end and visible ``sample_delay_s`` (+ jitter) later; the
  GPU-level busy percent of the window (``nvmlDeviceGetUtilizationRates``) likewise.
* Physical memory exhaustion is not modelled: traces are what the processes *try* to hold.

``FakeNVML`` raises the real ``pynvml.NVMLError`` subclasses: ``NVMLError_NotFound`` when there is
no sample newer than the timestamp, ``NVMLError_Uninitialized`` before ``nvmlInit``, injected
faults (``GpuIsLost``, ``Unknown``, ...), and ``NVMLLibraryMismatchError`` from the unversioned
process call when the simulated driver lacks ``_v3``.
"""

from __future__ import annotations

import bisect
import math
import random
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pynvml

from enforcement.clock import Clock

TICK_S = 0.01
GIB = 1 << 30
MEMORY_UNKNOWN = -1  # a Fault code: the process list answers, but usedGpuMemory is None
HANG = -2  # a Fault code: the call blocks until the fault ends (a wedged driver; real clocks only)


@dataclass(frozen=True, slots=True)
class Steps:
    """A piecewise-constant function of time: ``value`` from each ``(t, value)`` point on."""

    points: tuple[tuple[float, float], ...]

    def __post_init__(self) -> None:
        if not self.points or self.points[0][0] != 0.0:
            raise ValueError("a step function starts at t=0")
        if any(b[0] <= a[0] for a, b in zip(self.points, self.points[1:], strict=False)):
            raise ValueError("step times must increase")

    def at(self, t: float) -> float:
        i = bisect.bisect_right(self.points, (t, math.inf)) - 1
        return self.points[max(i, 0)][1]

    @staticmethod
    def constant(value: float) -> Steps:
        return Steps(((0.0, value),))

    @staticmethod
    def of(*points: tuple[float, float]) -> Steps:
        return Steps(tuple((float(t), float(v)) for t, v in points))


@dataclass(frozen=True, slots=True)
class Workload:
    """How one simulated process behaves: GPU demand, launch-queue depth, memory over its lifetime."""

    demand: Steps
    memory: Steps
    queue_s: float = 0.02

    def __post_init__(self) -> None:
        if self.queue_s < TICK_S:
            raise ValueError(f"a launch queue shorter than one tick ({self.queue_s} s) cannot keep a GPU busy")


@dataclass(slots=True)
class SimProcess:
    """A process on a simulated GPU (``born`` on the clock's base); ``gpu_time`` is ground truth."""

    pid: int
    start_ticks: int
    born: float
    workload: Workload
    frozen: bool = False
    alive: bool = True
    died: float | None = None
    queued: float = 0.0
    gpu_time: float = 0.0
    window_busy: float = 0.0

    def memory_at(self, now: float) -> int:
        return int(self.workload.memory.at(now - self.born)) if self.alive else 0

    def demand_at(self, when: float) -> float:
        """The load it offered at clock time ``when`` (0 before birth and after death)."""
        if when < self.born or (self.died is not None and when >= self.died):
            return 0.0
        return self.workload.demand.at(when - self.born)


@dataclass(slots=True)
class _Sample:
    pid: int
    timeStamp: int
    smUtil: int
    memUtil: int = 0
    encUtil: int = 0
    decUtil: int = 0


@dataclass(slots=True)
class _ProcessInfo:
    pid: int
    usedGpuMemory: int | None
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


@dataclass(slots=True)
class _Utilization:
    gpu: int
    memory: int = 0


@dataclass(slots=True)
class _Memory:
    total: int
    free: int
    used: int


class SimGPU:
    """One simulated card: processes, time-slicing, and NVML-like utilisation sampling."""

    def __init__(
        self,
        index: int,
        uuid: str,
        name: str = "Tesla-V100-SXM2-32GB",
        memory_total: int = 32 * GIB,
        sample_window_s: float = 1 / 6,
        sample_delay_s: float = 0.05,
        sample_jitter_s: float = 0.02,
        rng: random.Random | None = None,
    ) -> None:
        self.index = index
        self.uuid = uuid
        self.name = name
        self.memory_total = memory_total
        self.sample_window_s = sample_window_s
        self.sample_delay_s = sample_delay_s
        self.sample_jitter_s = sample_jitter_s
        self.rng = rng or random.Random(index)
        self.processes: list[SimProcess] = []
        self.busy_time = 0.0
        self._window_busy = 0.0
        self._gpu_util: list[tuple[float, int]] = [(0.0, 0)]  # (visible at, percent), newest last
        self._window_start: float | None = None
        self._samples: deque[tuple[float, _Sample]] = deque(maxlen=512)

    def attach(self, process: SimProcess) -> None:
        self.processes.append(process)

    def step(self, now: float, dt: float) -> float:
        """Advance one tick ending at ``now``; returns the GPU busy time in it."""
        if self._window_start is None:
            self._window_start = now - dt
        live = [p for p in self.processes if p.alive]
        for p in live:
            if not p.frozen:
                p.queued = min(p.workload.queue_s, p.queued + p.workload.demand.at(now - dt - p.born) * dt)
        runnable = sorted((p for p in live if p.queued > 1e-12), key=lambda p: p.queued)
        remaining = dt
        for i, p in enumerate(runnable):
            take = min(p.queued, remaining / (len(runnable) - i))
            p.queued -= take
            p.gpu_time += take
            p.window_busy += take
            remaining -= take
        busy = dt - remaining
        self.busy_time += busy
        self._window_busy += busy
        self._maybe_sample(now)
        return busy

    def _maybe_sample(self, now: float) -> None:
        assert self._window_start is not None
        length = now - self._window_start
        if length + 1e-9 < self.sample_window_s:
            return
        stamp = round(now * 1e6)
        visible = now + self.sample_delay_s + self.rng.uniform(0.0, self.sample_jitter_s)
        for p in self.processes:
            if p.window_busy > 0 and p.alive:
                util = min(100, math.floor(100.0 * p.window_busy / length + 1e-9))
                self._samples.append((visible, _Sample(p.pid, stamp, util)))
            p.window_busy = 0.0
        util = min(100, math.floor(100.0 * self._window_busy / length + 1e-9))
        self._gpu_util = [*self._gpu_util[-8:], (visible, util)]
        self._window_busy = 0.0
        self._window_start = now

    def visible_samples(self, now: float, since_us: int) -> list[_Sample]:
        return [s for visible, s in self._samples if visible <= now and s.timeStamp > since_us]

    def gpu_util(self, now: float) -> int:
        """The GPU-level busy percent of the latest sample period visible at ``now``."""
        return next((u for visible, u in reversed(self._gpu_util) if visible <= now), 0)

    def memory_used(self, now: float) -> int:
        return sum(p.memory_at(now) for p in self.processes if p.alive)


@dataclass(frozen=True, slots=True)
class Fault:
    """From ``start`` to ``end`` (clock seconds), ``call`` (or every call, ``*``) fails with ``code``.

    ``code`` is an ``NVML_ERROR_*`` value, or MEMORY_UNKNOWN: the process list then answers with
    ``usedGpuMemory = None`` (the driver cannot say), which is missing data, not an error; or HANG:
    the call sleeps (really: only with a wall clock) until ``end``, then answers.
    """

    start: float
    end: float
    code: int = pynvml.NVML_ERROR_UNKNOWN
    call: str = "*"
    gpu: int | None = None

    def hits(self, now: float, call: str, gpu: int | None) -> bool:
        return (
            self.start <= now < self.end
            and self.call in ("*", call)
            and (self.gpu is None or gpu is None or self.gpu == gpu)
        )


@dataclass(frozen=True, slots=True)
class _Handle:
    index: int


@dataclass
class FakeNVML:
    """pynvml's functions (same names and signatures) over simulated GPUs and an injected clock."""

    gpus: Sequence[SimGPU]
    clock: Clock
    faults: Iterable[Fault] = ()
    has_v3: bool = True
    driver_present: bool = True
    calls: int = 0
    _initialised: int = field(default=0, init=False)

    API = (
        "nvmlInit",
        "nvmlShutdown",
        "nvmlDeviceGetCount",
        "nvmlDeviceGetHandleByIndex",
        "nvmlDeviceGetUUID",
        "nvmlDeviceGetName",
        "nvmlDeviceGetMinorNumber",
        "nvmlDeviceGetMemoryInfo",
        "nvmlDeviceGetComputeRunningProcesses",
        "nvmlDeviceGetComputeRunningProcesses_v2",
        "nvmlDeviceGetComputeRunningProcesses_v3",
        "nvmlDeviceGetProcessUtilization",
        "nvmlDeviceGetUtilizationRates",
    )

    def __post_init__(self) -> None:
        self.faults = tuple(self.faults)

    def _enter(self, call: str, handle: Any = None) -> SimGPU | None:
        self.calls += 1
        if not self._initialised:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        gpu: SimGPU | None = None
        if handle is not None:
            if not isinstance(handle, _Handle) or not 0 <= handle.index < len(self.gpus):
                raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            gpu = self.gpus[handle.index]
        now = self.clock.now()
        for fault in self.faults:
            if fault.code == HANG and fault.hits(now, call, gpu.index if gpu else None):
                time.sleep(fault.end - now)
            elif fault.code not in (MEMORY_UNKNOWN, HANG) and fault.hits(now, call, gpu.index if gpu else None):
                raise pynvml.NVMLError(fault.code)
        return gpu

    def _device(self, call: str, handle: Any) -> SimGPU:
        """:meth:`_enter` for a call on one GPU: the GPU its handle names."""
        gpu = self._enter(call, handle)
        assert gpu is not None  # a valid handle always names a GPU (an invalid one has raised)
        return gpu

    def _memory_unknown(self, gpu: SimGPU) -> bool:
        now = self.clock.now()
        return any(
            f.code == MEMORY_UNKNOWN and f.hits(now, "nvmlDeviceGetComputeRunningProcesses", gpu.index)
            for f in self.faults
        )

    def nvmlInit(self) -> None:
        if not self.driver_present:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
        self._initialised += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self._initialised -= 1

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(index)

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        return self._device("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        return self._device("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetMinorNumber(self, handle: _Handle) -> int:
        return self._device("nvmlDeviceGetMinorNumber", handle).index

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle, version: int | None = None) -> _Memory:
        gpu = self._device("nvmlDeviceGetMemoryInfo", handle)
        used = min(gpu.memory_total, gpu.memory_used(self.clock.now()))
        return _Memory(gpu.memory_total, gpu.memory_total - used, used)

    def _processes(self, call: str, handle: _Handle) -> list[_ProcessInfo]:
        gpu = self._device(call, handle)
        now, unknown = self.clock.now(), self._memory_unknown(gpu)
        return [_ProcessInfo(p.pid, None if unknown else p.memory_at(now)) for p in gpu.processes if p.alive]

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: _Handle) -> list[_ProcessInfo]:
        return self._processes("nvmlDeviceGetComputeRunningProcesses_v2", handle)

    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: _Handle) -> list[_ProcessInfo]:
        if not self.has_v3:
            self._enter("nvmlDeviceGetComputeRunningProcesses_v3", handle)
            raise pynvml.NVMLError(pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return self._processes("nvmlDeviceGetComputeRunningProcesses_v3", handle)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: _Handle) -> list[_ProcessInfo]:
        try:
            return self.nvmlDeviceGetComputeRunningProcesses_v3(handle)
        except pynvml.NVMLError_FunctionNotFound:
            # What pynvml's throwOnVersionMismatch does; note this is not an NVMLError.
            raise pynvml.NVMLLibraryMismatchError(
                "Unversioned function called and the pyNVML version does not match the NVML lib version."
            ) from None

    def nvmlDeviceGetProcessUtilization(self, handle: _Handle, timeStamp: int) -> list[_Sample]:
        gpu = self._device("nvmlDeviceGetProcessUtilization", handle)
        samples = gpu.visible_samples(self.clock.now(), int(timeStamp))
        if not samples:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return samples

    def nvmlDeviceGetUtilizationRates(self, handle: _Handle) -> _Utilization:
        gpu = self._device("nvmlDeviceGetUtilizationRates", handle)
        return _Utilization(gpu.gpu_util(self.clock.now()))
