"""The agent's one narrow window onto NVML, over ``pynvml`` (nvidia-ml-py) or its simulated twin.

Only what the watchdog and the pacer need: devices and UUIDs, memory, per-process used memory
(host PIDs), per-process SM utilisation since a timestamp, and the GPU's own busy percent. The
quirks of the real library are handled here, once:

* ``nvmlDeviceGetProcessUtilization`` raises ``NVMLError_NotFound`` when there is no sample newer
  than the timestamp: that is "no samples", not a failure.
* ``nvmlDeviceGetComputeRunningProcesses`` calls the ``_v3`` entry point; a driver without it makes
  pynvml raise ``NVMLLibraryMismatchError``, which is *not* an ``NVMLError``: fall back to ``_v2``.
* ``usedGpuMemory`` is ``None`` where the driver cannot say (WDDM, some MIG/vGPU set-ups).
* No driver or library: ``NVMLError_LibraryNotFound`` / ``DriverNotLoaded`` at init.

Every other NVML error becomes :class:`NvmlError`, so callers treat the reading as missing.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol

import pynvml


class NvmlError(RuntimeError):
    """An NVML call failed: the data for this reading is missing (never act on it)."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class NvmlUnavailable(NvmlError):
    """There is no NVML here at all: no library, or no loaded driver."""


@dataclass(frozen=True, slots=True)
class GpuDevice:
    """One GPU as NVML names it."""

    index: int
    uuid: str
    name: str
    memory_total: int


@dataclass(frozen=True, slots=True)
class ProcessMemory:
    """A compute process on a GPU; ``used_bytes`` is None when the driver cannot say."""

    pid: int
    used_bytes: int | None


@dataclass(frozen=True, slots=True)
class UtilSample:
    """One per-process utilisation sample: SM busy percent over the window ending at ``timestamp_us``."""

    pid: int
    timestamp_us: int
    sm_util: int


class NvmlBackend(Protocol):
    """What the agent asks of NVML. Every method raises NvmlError when the answer is unknown."""

    def devices(self) -> list[GpuDevice]: ...

    def process_memory(self, uuid: str) -> list[ProcessMemory]: ...

    def process_utilization(self, uuid: str, since_us: int) -> list[UtilSample]: ...

    def gpu_utilization(self, uuid: str) -> int: ...

    def close(self) -> None: ...


_UNAVAILABLE_CODES = (pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, pynvml.NVML_ERROR_DRIVER_NOT_LOADED)


def _wrap(call: str, err: pynvml.NVMLError) -> NvmlError:
    code = getattr(err, "value", None)
    kind = NvmlUnavailable if code in _UNAVAILABLE_CODES else NvmlError
    return kind(f"{call}: {err}", code)


class PynvmlBackend:
    """NvmlBackend over a pynvml-shaped library: the real ``pynvml`` module or ``simgpu.FakeNVML``.

    ``open()`` initialises the library and indexes the devices by UUID; it raises NvmlUnavailable
    when there is no driver, so callers can say so plainly.
    """

    def __init__(self, lib: ModuleType | Any = pynvml) -> None:
        self._lib = lib
        self._handles: dict[str, Any] = {}
        self._devices: list[GpuDevice] = []
        self._use_v2 = False
        self._open = False

    def open(self) -> PynvmlBackend:
        """Initialise NVML and enumerate the devices (NvmlUnavailable without a driver)."""
        lib = self._lib
        try:
            lib.nvmlInit()
        except pynvml.NVMLError as e:
            raise _wrap("nvmlInit", e) from e
        self._open = True
        try:
            devices: list[GpuDevice] = []
            handles: dict[str, Any] = {}
            for index in range(lib.nvmlDeviceGetCount()):
                handle = lib.nvmlDeviceGetHandleByIndex(index)
                uuid = _text(lib.nvmlDeviceGetUUID(handle))
                memory = lib.nvmlDeviceGetMemoryInfo(handle)
                devices.append(GpuDevice(index, uuid, _text(lib.nvmlDeviceGetName(handle)), int(memory.total)))
                handles[uuid] = handle
        except pynvml.NVMLError as e:
            self.close()
            raise _wrap("device enumeration", e) from e
        self._devices, self._handles = devices, handles
        return self

    def devices(self) -> list[GpuDevice]:
        """The GPUs found at open(), in NVML index order."""
        return list(self._devices)

    def _handle(self, uuid: str) -> Any:
        try:
            return self._handles[uuid]
        except KeyError:
            raise NvmlError(f"no GPU with uuid {uuid} on this node") from None

    def process_memory(self, uuid: str) -> list[ProcessMemory]:
        """Compute processes on the GPU with their used memory (host PIDs)."""
        handle = self._handle(uuid)
        try:
            if self._use_v2:
                procs = self._lib.nvmlDeviceGetComputeRunningProcesses_v2(handle)
            else:
                try:
                    procs = self._lib.nvmlDeviceGetComputeRunningProcesses(handle)
                except pynvml.NVMLLibraryMismatchError:
                    # A driver older than pynvml's _v3 entry point: the _v2 struct holds what we need.
                    self._use_v2 = True
                    procs = self._lib.nvmlDeviceGetComputeRunningProcesses_v2(handle)
        except pynvml.NVMLError as e:
            raise _wrap("nvmlDeviceGetComputeRunningProcesses", e) from e
        out: list[ProcessMemory] = []
        for p in procs:
            used = p.usedGpuMemory
            out.append(ProcessMemory(int(p.pid), None if used is None else int(used)))
        return out

    def process_utilization(self, uuid: str, since_us: int) -> list[UtilSample]:
        """Samples newer than ``since_us``; an empty list when NVML has none (NVMLError_NotFound)."""
        handle = self._handle(uuid)
        try:
            samples = self._lib.nvmlDeviceGetProcessUtilization(handle, since_us)
        except pynvml.NVMLError_NotFound:
            return []
        except pynvml.NVMLError as e:
            raise _wrap("nvmlDeviceGetProcessUtilization", e) from e
        return [UtilSample(int(s.pid), int(s.timeStamp), int(s.smUtil)) for s in samples]

    def gpu_utilization(self, uuid: str) -> int:
        """Percent of the last sample period in which any kernel ran (one value: one integer floor)."""
        handle = self._handle(uuid)
        try:
            return int(self._lib.nvmlDeviceGetUtilizationRates(handle).gpu)
        except pynvml.NVMLError as e:
            raise _wrap("nvmlDeviceGetUtilizationRates", e) from e

    def close(self) -> None:
        """Shut NVML down; safe to call twice."""
        if self._open:
            self._open = False
            with contextlib.suppress(pynvml.NVMLError):  # a lost GPU's library has nothing left to release
                self._lib.nvmlShutdown()


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
