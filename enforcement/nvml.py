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

An NVML call can also hang (a GPU falling off the bus, a wedged driver). :func:`bounded` wraps any
backend so that every call returns or fails within a deadline (:class:`NvmlTimeout`): the agent's
loop, which thaws what it froze, never waits on the driver for longer than that.
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Protocol, TypeVar, cast, runtime_checkable

import pynvml


class NvmlError(RuntimeError):
    """An NVML call failed: the data for this reading is missing (never act on it)."""

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.code = code


class NvmlUnavailable(NvmlError):
    """There is no NVML here at all: no library, or no loaded driver."""


class NvmlTimeout(NvmlError):
    """An NVML call has not returned within its deadline (the driver may be hung): no answer."""


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


@runtime_checkable
class ReportsHangs(Protocol):
    """A backend that knows its calls still running in the driver (:class:`BoundedBackend` does)."""

    def hung(self) -> tuple[str, float] | None:
        """The call running longest (its name, seconds so far), or None when none is running."""
        ...


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

    def minor_number(self, uuid: str) -> int:
        """The card's device minor number: its node is ``/dev/nvidia<minor>``."""
        handle = self._handle(uuid)
        try:
            return int(self._lib.nvmlDeviceGetMinorNumber(handle))
        except pynvml.NVMLError as e:
            raise _wrap("nvmlDeviceGetMinorNumber", e) from e

    def health(self, uuid: str) -> str | None:
        """None while the card answers as itself; else why not (GPU lost, wrong UUID, any NVML error)."""
        handle = self._handle(uuid)
        try:
            seen = _text(self._lib.nvmlDeviceGetUUID(handle))
            self._lib.nvmlDeviceGetMemoryInfo(handle)
        except pynvml.NVMLError as e:
            return str(_wrap("health probe", e))
        return None if seen == uuid else f"handle now answers as {seen}"

    def close(self) -> None:
        """Shut NVML down; safe to call twice."""
        if self._open:
            self._open = False
            with contextlib.suppress(pynvml.NVMLError):  # a lost GPU's library has nothing left to release
                self._lib.nvmlShutdown()


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# --- deadlines ------------------------------------------------------------------------------------
B = TypeVar("B")


@dataclass(slots=True)
class _Call:
    started: float
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None


class _Lane:
    """One worker thread. A call that outlives its deadline keeps the lane busy until it returns:
    later calls on the lane fail at once instead of piling up threads inside a hung driver."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.busy: _Call | None = None
        self._lock = threading.Lock()
        self._work: queue.SimpleQueue[tuple[_Call, Callable[[], Any]]] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=f"gpuslice-nvml-{name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            call, fn = self._work.get()
            try:
                call.result = fn()
            except BaseException as e:  # handed to the caller, whatever it is
                call.error = e
            finally:
                with self._lock:
                    self.busy = None
                call.done.set()

    def submit(self, call: _Call, fn: Callable[[], Any]) -> _Call | None:
        """Queue ``call``; if the lane is still busy, queue nothing and return the call it is busy with."""
        with self._lock:
            if self.busy is not None:
                return self.busy
            self.busy = call
        self._work.put((call, fn))
        return None


class BoundedBackend:
    """Any backend, every method of it run on a worker thread and given up on after a deadline.

    Each method has a lane (a worker thread) per GPU (a first argument that is a string: the device
    UUID), or one for the node otherwise, so a reading that hangs on one GPU does not hold up another
    kind of reading (the watchdog's memory scan beside a hung utilisation call) or another GPU. A
    call past its deadline raises :class:`NvmlTimeout`; its lane stays busy (and further calls on it
    raise NvmlTimeout at once) until the call returns: a hung driver costs one thread per lane, not
    one per attempt. Attributes that are not methods pass straight through.
    """

    def __init__(
        self,
        backend: Any,
        deadline_s: float,
        deadlines: Mapping[str, float] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if deadline_s <= 0:
            raise ValueError(f"an NVML deadline must be positive, got {deadline_s}")
        self._backend = backend
        self._deadline_s = deadline_s
        self._deadlines = dict(deadlines or {})
        self._clock = clock
        self._lanes: dict[str, _Lane] = {}
        self._lanes_lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._backend, name)
        if name.startswith("_") or not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            return self._call(name, attr, args, kwargs)

        return call

    def _lane(self, key: str) -> _Lane:
        with self._lanes_lock:
            lane = self._lanes.get(key)
            if lane is None:
                lane = self._lanes[key] = _Lane(key)
            return lane

    def _call(self, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        lane = self._lane(f"{name} on {args[0]}" if args and isinstance(args[0], str) else name)
        call = _Call(self._clock())
        stuck = lane.submit(call, lambda: fn(*args, **kwargs))
        if stuck is not None:
            age = call.started - stuck.started
            raise NvmlTimeout(f"NVML call {lane.name} has not returned for {age:.1f} s")
        deadline = self._deadlines.get(name, self._deadline_s)
        if not call.done.wait(deadline):
            raise NvmlTimeout(f"NVML call {lane.name}: no answer within {deadline:g} s")
        if call.error is not None:
            raise call.error
        # A method that returns its own backend (open() does) returns the bounded one instead.
        return self if call.result is self._backend else call.result

    def hung(self) -> tuple[str, float] | None:
        """The call running longest (its lane, seconds so far), or None when none is running."""
        now = self._clock()
        with self._lanes_lock:
            running = [(lane.name, now - c.started) for lane in self._lanes.values() if (c := lane.busy) is not None]
        return max(running, key=lambda r: r[1], default=None)


def bounded(backend: B, deadline_s: float, deadlines: Mapping[str, float] | None = None) -> B:
    """``backend`` with every method bounded by ``deadline_s`` (``deadlines`` overrides per method name)."""
    return cast(B, BoundedBackend(backend, deadline_s, deadlines))
