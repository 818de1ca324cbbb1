"""The NVML backend over the real pynvml error classes, and FakeNVML's contract with pynvml."""

from __future__ import annotations

import inspect

import pynvml
import pytest

from enforcement.clock import SimClock
from enforcement.nvml import NvmlError, NvmlUnavailable, PynvmlBackend
from enforcement.simgpu import GIB, MEMORY_UNKNOWN, FakeNVML, Fault, SimGPU, SimProcess, Steps, Workload


@pytest.mark.parametrize("name", FakeNVML.API)
def test_fake_has_pynvml_names_and_signatures(name: str) -> None:
    real = inspect.signature(getattr(pynvml, name))
    fake = inspect.signature(getattr(FakeNVML([], SimClock()), name))
    assert [(p.name, p.kind, p.default) for p in fake.parameters.values()] == [
        (p.name, p.kind, p.default) for p in real.parameters.values()
    ]


def test_pynvml_quirks_the_backend_relies_on() -> None:
    # The unversioned process call raises this when _v3 is missing, and it is not an NVMLError.
    assert not issubclass(pynvml.NVMLLibraryMismatchError, pynvml.NVMLError)
    assert isinstance(pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND), pynvml.NVMLError_NotFound)


def sim(has_v3: bool = True, faults: tuple[Fault, ...] = ()) -> tuple[SimClock, SimGPU, FakeNVML]:
    clock = SimClock()
    gpu = SimGPU(0, "GPU-aaaa", sample_window_s=0.1, sample_delay_s=0.0, sample_jitter_s=0.0)
    proc = SimProcess(4242, 1, clock.now(), Workload(Steps.constant(0.5), Steps.constant(3 * GIB)))
    gpu.attach(proc)
    return clock, gpu, FakeNVML([gpu], clock, faults, has_v3=has_v3)


def run(clock: SimClock, gpu: SimGPU, seconds: float) -> None:
    for _ in range(round(seconds / 0.01)):
        clock.advance(0.01)
        gpu.step(clock.now(), 0.01)


def test_backend_reads_devices_memory_and_samples() -> None:
    clock, gpu, fake = sim()
    backend = PynvmlBackend(fake).open()
    [device] = backend.devices()
    assert (device.index, device.uuid, device.memory_total) == (0, "GPU-aaaa", 32 * GIB)
    [proc] = backend.process_memory("GPU-aaaa")
    assert (proc.pid, proc.used_bytes) == (4242, 3 * GIB)
    assert backend.process_utilization("GPU-aaaa", 0) == []  # NVMLError_NotFound: no sample yet
    run(clock, gpu, 0.35)
    samples = backend.process_utilization("GPU-aaaa", 0)
    assert [s.sm_util for s in samples] == [50, 50, 50]
    assert backend.process_utilization("GPU-aaaa", samples[-1].timestamp_us) == []
    with pytest.raises(NvmlError, match="no GPU with uuid"):
        backend.process_memory("GPU-nope")
    backend.close()
    backend.close()


def test_missing_v3_falls_back_to_v2() -> None:
    _, _, fake = sim(has_v3=False)
    fake.nvmlInit()
    with pytest.raises(pynvml.NVMLLibraryMismatchError):
        fake.nvmlDeviceGetComputeRunningProcesses(fake.nvmlDeviceGetHandleByIndex(0))
    backend = PynvmlBackend(fake).open()
    assert [p.pid for p in backend.process_memory("GPU-aaaa")] == [4242]
    assert [p.pid for p in backend.process_memory("GPU-aaaa")] == [4242]


@pytest.mark.parametrize("code", [pynvml.NVML_ERROR_GPU_IS_LOST, pynvml.NVML_ERROR_UNKNOWN, pynvml.NVML_ERROR_TIMEOUT])
def test_injected_errors_become_nvml_errors_with_their_code(code: int) -> None:
    _, _, fake = sim(faults=(Fault(0.0, 2e9, code, "nvmlDeviceGetComputeRunningProcesses_v3"),))
    backend = PynvmlBackend(fake).open()
    with pytest.raises(NvmlError) as info:
        backend.process_memory("GPU-aaaa")
    assert info.value.code == code and not isinstance(info.value, NvmlUnavailable)


def test_faults_are_bounded_in_time_and_memory_can_be_unknown() -> None:
    clock, gpu, _ = sim()
    start = clock.now()
    fake = FakeNVML(
        [gpu],
        clock,
        (Fault(start + 1, start + 2, pynvml.NVML_ERROR_GPU_IS_LOST), Fault(start + 3, start + 4, MEMORY_UNKNOWN)),
    )
    backend = PynvmlBackend(fake).open()
    assert backend.process_memory("GPU-aaaa")[0].used_bytes == 3 * GIB
    clock.advance(1.5)
    with pytest.raises(NvmlError):
        backend.process_memory("GPU-aaaa")
    clock.advance(2.0)
    assert backend.process_memory("GPU-aaaa")[0].used_bytes is None
    clock.advance(1.0)
    assert backend.process_memory("GPU-aaaa")[0].used_bytes == 3 * GIB


def test_fake_refuses_calls_before_init() -> None:
    _, _, fake = sim()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()


def test_no_driver_is_unavailable() -> None:
    _, _, fake = sim()
    fake.driver_present = False
    with pytest.raises(NvmlUnavailable):
        PynvmlBackend(fake).open()


def test_the_real_library_without_a_driver_is_unavailable() -> None:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError_LibraryNotFound:
        pass
    else:
        pynvml.nvmlShutdown()
        pytest.skip("this machine has an NVIDIA driver")
    with pytest.raises(NvmlUnavailable, match="Not Found"):
        PynvmlBackend().open()
