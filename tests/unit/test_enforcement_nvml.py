"""The NVML backend over the real pynvml error classes, FakeNVML's contract with pynvml, and deadlines."""

from __future__ import annotations

import inspect
import threading
import time

import pynvml
import pytest

from enforcement.clock import SimClock, SystemClock
from enforcement.nvml import NvmlError, NvmlTimeout, NvmlUnavailable, PynvmlBackend, bounded
from enforcement.simgpu import GIB, HANG, MEMORY_UNKNOWN, FakeNVML, Fault, SimGPU, SimProcess, Steps, Workload


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


class Slow:
    """A backend whose calls block until released (a wedged driver), per GPU."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.opened = 0

    def open(self) -> Slow:
        self.opened += 1
        return self

    def process_memory(self, uuid: str) -> list[str]:
        if uuid == "GPU-hung":
            self.release.wait(10)
        return [uuid]

    def process_utilization(self, uuid: str, since_us: int) -> list[int]:
        return [since_us]

    def fail(self) -> None:
        raise NvmlError("injected", 3)


def test_bounded_calls_answer_as_the_backend_does() -> None:
    raw = Slow()
    backend = bounded(raw, 0.5)
    assert backend.open() is backend  # a method returning its backend returns the bounded one
    assert raw.opened == 1
    assert backend.process_memory("GPU-a") == ["GPU-a"]
    with pytest.raises(NvmlError, match="injected") as info:
        backend.fail()
    assert info.value.code == 3


def test_a_hung_call_times_out_and_holds_only_its_own_lane() -> None:
    raw = Slow()
    backend = bounded(raw, 0.2)
    started = time.monotonic()
    with pytest.raises(NvmlTimeout, match=r"process_memory on GPU-hung: no answer within 0\.2 s"):
        backend.process_memory("GPU-hung")
    assert time.monotonic() - started < 5  # given up on, not waited for (the call blocks 10 s)
    with pytest.raises(NvmlTimeout, match="has not returned for"):  # the lane is still busy: at once
        backend.process_memory("GPU-hung")
    assert backend.process_memory("GPU-b") == ["GPU-b"]  # another GPU's lane
    assert backend.process_utilization("GPU-hung", 7) == [7]  # another reading of the same GPU
    raw.release.set()  # the driver comes back
    deadline = time.monotonic() + 5
    while True:
        try:
            assert backend.process_memory("GPU-hung") == ["GPU-hung"]
            break
        except NvmlTimeout:
            assert time.monotonic() < deadline, "the lane never came back"
            time.sleep(0.01)


def test_bounded_refuses_a_deadline_that_is_not_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        bounded(Slow(), 0)


def test_hang_fault_blocks_the_fake_until_it_ends() -> None:
    clock = SystemClock()
    gpu = SimGPU(0, "GPU-aaaa")
    now = clock.now()
    fake = FakeNVML([gpu], clock, (Fault(now, now + 0.3, HANG, "nvmlDeviceGetUtilizationRates"),))
    backend = PynvmlBackend(fake).open()
    started = time.monotonic()
    assert backend.gpu_utilization("GPU-aaaa") == 0
    assert time.monotonic() - started >= 0.25
    assert backend.process_memory("GPU-aaaa") == []  # other calls are not hung
