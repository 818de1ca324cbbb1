"""The memory watchdog's rules, one by one, against a scripted NVML reading; and the pidfd killer."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from enforcement.attribution import ProcessOwner
from enforcement.cgroups import ContainerRef, read_start_time
from enforcement.clock import SimClock
from enforcement.events import RecordingEventSink
from enforcement.killer import PidfdKiller
from enforcement.nvml import GpuDevice, NvmlError, ProcessMemory, UtilSample
from enforcement.pods import MIB, SliceHolder
from enforcement.watchdog import KILL_REASON, MemoryWatchdog

GPU = "GPU-0"
GIB = 1024 * MIB
A = SliceHolder("uid-a", "ml", "a", GPU, "v100-25", 8 * GIB, 250)
B = SliceHolder("uid-b", "ml", "b", GPU, "v100-50", 16 * GIB, 500)


class Reading:
    """A scripted NvmlBackend: process memory per call, or an error."""

    def __init__(self) -> None:
        self.processes: list[ProcessMemory] = []
        self.error: str | None = None

    def devices(self) -> list[GpuDevice]:
        return [GpuDevice(0, GPU, "V100", 32 * GIB)]

    def process_memory(self, uuid: str) -> list[ProcessMemory]:
        if self.error:
            raise NvmlError(self.error)
        return list(self.processes)

    def process_utilization(self, uuid: str, since_us: int) -> list[UtilSample]:
        return []

    def gpu_utilization(self, uuid: str) -> int:
        return 0

    def close(self) -> None:
        pass


class SpyKiller:
    def __init__(self) -> None:
        self.killed: list[int] = []
        self.replaced: set[int] = set()

    def kill(self, pid: int, start_time: int, pidfd: int | None = None) -> bool:
        if pid in self.replaced:
            return False
        self.killed.append(pid)
        return True


OWNERS = {
    1: A,
    2: A,
    3: A,
    10: B,
}


def owner(pid: int, gpu: str) -> ProcessOwner | None:
    holder = OWNERS.get(pid)
    if holder is None or gpu != holder.gpu:
        return None
    return ProcessOwner(holder, pid, 1000 + pid, ContainerRef(holder.pod_uid, "0" * 64, None), "main")


def setup() -> tuple[Reading, SpyKiller, RecordingEventSink, MemoryWatchdog]:
    reading, killer, events = Reading(), SpyKiller(), RecordingEventSink()
    return reading, killer, events, MemoryWatchdog(reading, owner, killer, events, SimClock())


def test_over_cap_kills_the_largest_process_and_reports_it() -> None:
    reading, killer, events, dog = setup()
    reading.processes = [ProcessMemory(1, 3 * GIB), ProcessMemory(2, 6 * GIB), ProcessMemory(10, 15 * GIB)]
    [scan] = dog.check([GPU])
    assert killer.killed == [2]
    [kill] = scan.kills
    assert (kill.pid, kill.holder, kill.process_bytes, kill.holder_bytes) == (2, A, 6 * GIB, 9 * GIB)
    [event] = events.events
    assert event.reason == KILL_REASON and event.pod == "a" and "8192 MiB" in event.message


def test_at_the_cap_nothing_happens() -> None:
    reading, killer, events, dog = setup()
    reading.processes = [ProcessMemory(1, 4 * GIB), ProcessMemory(2, 4 * GIB), ProcessMemory(10, 16 * GIB)]
    dog.check([GPU])
    assert killer.killed == [] and events.events == []


def test_kills_largest_first_until_the_rest_fits() -> None:
    reading, killer, _, dog = setup()
    reading.processes = [ProcessMemory(1, 5 * GIB), ProcessMemory(2, 9 * GIB // 2), ProcessMemory(3, 4 * GIB)]
    dog.check([GPU])
    assert killer.killed == [1, 2]


def test_a_process_being_killed_is_not_followed_by_a_second_victim() -> None:
    reading, killer, _, dog = setup()
    reading.processes = [ProcessMemory(1, 5 * GIB), ProcessMemory(2, 4 * GIB)]
    dog.check([GPU])
    assert killer.killed == [1]
    dog.check([GPU])  # still listed (kill latency): its memory is on its way back
    assert killer.killed == [1]
    reading.processes = [ProcessMemory(2, 4 * GIB)]
    dog.check([GPU])
    assert dog.pending == {}
    reading.processes = [ProcessMemory(2, 9 * GIB)]  # a new breach later is enforced again
    dog.check([GPU])
    assert killer.killed == [1, 2]


def test_missing_data_never_kills() -> None:
    reading, killer, _, dog = setup()
    reading.processes = [ProcessMemory(1, 20 * GIB), ProcessMemory(2, None)]
    dog.check([GPU])
    assert killer.killed == [] and dog.skipped_unknown == 1
    reading.error = "GPU is lost"
    [scan] = dog.check([GPU])
    assert not scan.ok and killer.killed == [] and dog.failed_scans == 1


def test_unmanaged_processes_are_never_touched() -> None:
    reading, killer, _, dog = setup()
    reading.processes = [ProcessMemory(99, 30 * GIB), ProcessMemory(1, GIB)]
    [scan] = dog.check([GPU])
    assert killer.killed == [] and scan.unmanaged == 1


def test_a_replaced_pid_is_not_reported_as_a_kill() -> None:
    reading, killer, events, dog = setup()
    killer.replaced.add(1)
    reading.processes = [ProcessMemory(1, 9 * GIB)]
    [scan] = dog.check([GPU])
    assert scan.kills == [] and events.events == []


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


def test_pidfd_killer_kills_only_the_process_it_judged(child: subprocess.Popen[bytes]) -> None:
    proc_root = Path("/proc")
    start = read_start_time(proc_root, child.pid)
    assert start is not None
    killer = PidfdKiller(proc_root)
    assert killer.kill(child.pid, start + 1) is False  # same PID, different process: left alone
    time.sleep(0.05)
    assert child.poll() is None
    assert killer.kill(child.pid, start) is True
    assert child.wait(5) == -9
    assert killer.kill(child.pid, start) is False  # gone
