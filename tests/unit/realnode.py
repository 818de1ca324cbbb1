"""Real cgroups and real processes for the node agent's fail-safety tests (needs root).

:class:`CgroupTree` makes pod and container cgroups under a private prefix in the host's real
hierarchies, in one of three layouts (what a container's ``/proc/<pid>/cgroup`` shows on a v1-only,
a v2-only or a hybrid host), puts real processes in them, and removes everything afterwards.
:class:`RealTimeGpu` runs a simulated GPU on the wall clock whose processes are those real
processes, frozen whenever their real cgroup is. Outside a machine that allows this the tests skip
with the reason; in CI (``CI=true``) they fail instead, so they can never silently stop running.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import threading
import time
import uuid as uuidlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import pytest

from enforcement.clock import SystemClock
from enforcement.simgpu import FakeNVML, SimGPU, SimProcess, Workload
from packing.record import ANNOTATION, AllocationRecord

CGROUP = Path("/sys/fs/cgroup")
Layout = Literal["v1", "v2", "hybrid"]
SLEEP = shutil.which("sleep") or "/bin/sleep"


def unified_root() -> Path | None:
    """Where the v2 hierarchy is mounted: the cgroup root (v2-only host) or ``unified`` (hybrid)."""
    for root in (CGROUP, CGROUP / "unified"):
        if (root / "cgroup.controllers").is_file():
            return root
    return None


def unavailable(layout: Layout) -> str | None:
    """Why this machine cannot run a real-cgroup test in ``layout``, or None if it can."""
    if os.geteuid() != 0:
        return "needs root to create cgroups and freeze them"
    if layout in ("v2", "hybrid") and unified_root() is None:
        return f"no cgroup v2 hierarchy under {CGROUP}"
    if layout in ("v1", "hybrid") and not (CGROUP / "freezer" / "cgroup.procs").is_file():
        return f"no cgroup v1 freezer hierarchy at {CGROUP / 'freezer'}"
    return None


def require(reason: str | None) -> None:
    """Skip with ``reason``; in CI, fail: these tests must run there."""
    if reason is None:
        return
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI must run this test, but: {reason}")
    pytest.skip(reason)


@dataclass
class Pod:
    """A pod cgroup with one container cgroup, in each hierarchy of its layout."""

    name: str
    uid: str
    container_id: str
    layout: Layout
    dirs: list[Path]  # container cgroup directories, one per hierarchy
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def frozen(self) -> bool:
        """Whether the container is frozen now (by itself or through its pod), as the kernel says."""
        for d in self.dirs:
            if (d / "cgroup.events").is_file():
                if "frozen 1" in (d / "cgroup.events").read_text():
                    return True
            elif (d / "freezer.state").is_file() and (d / "freezer.state").read_text().strip() != "THAWED":
                return True
        return False

    def manifest(self, node: str, gpu: str, product: str, milli: int, memory_mib: int) -> dict[str, Any]:
        """The pod as the API server would list it, with an allocation record for ``gpu``."""
        record = AllocationRecord(self.uid, node, (gpu,), product, milli, memory_mib)
        return {
            "metadata": {
                "uid": self.uid,
                "name": self.name,
                "namespace": "default",
                "annotations": {ANNOTATION: record.encode(), "gpuslice.io/product": product},
            },
            "spec": {"nodeName": node},
            "status": {
                "phase": "Running",
                "containerStatuses": [{"name": "main", "containerID": f"containerd://{self.container_id}"}],
            },
        }


class CgroupTree:
    """Pod cgroups under ``gpuslice-test-<pid>-<random>`` in the real hierarchies; cleaned up on close."""

    def __init__(self) -> None:
        self.prefix = f"gpuslice-test-{os.getpid()}-{uuidlib.uuid4().hex[:8]}"
        self.roots: list[Path] = []
        self.pods: list[Pod] = []

    def _hierarchies(self, layout: Layout) -> list[Path]:
        unified = unified_root()
        v1 = [CGROUP / "freezer", CGROUP / "pids"]
        if layout == "v1":
            return v1
        assert unified is not None
        return [unified] if layout == "v2" else [unified, *v1]

    def pod(self, name: str, layout: Layout) -> Pod:
        uid = str(uuidlib.uuid4())
        cid = uuidlib.uuid4().hex + uuidlib.uuid4().hex
        dirs = []
        for hierarchy in self._hierarchies(layout):
            if hierarchy / self.prefix not in self.roots:
                self.roots.append(hierarchy / self.prefix)
            d = hierarchy / self.prefix / "kubepods" / "burstable" / f"pod{uid}" / cid
            d.mkdir(parents=True)
            dirs.append(d)
        pod = Pod(name, uid, cid, layout, dirs)
        self.pods.append(pod)
        return pod

    def cgroup(self, layout: Layout, *parts: str) -> list[Path]:
        """A plain cgroup ``<prefix>/<parts>`` in each hierarchy of ``layout`` (for a helper process)."""
        out = []
        for hierarchy in self._hierarchies(layout):
            if hierarchy / self.prefix not in self.roots:
                self.roots.append(hierarchy / self.prefix)
            d = hierarchy / self.prefix / Path(*parts)
            d.mkdir(parents=True, exist_ok=True)
            out.append(d)
        return out

    def spawn(self, pod: Pod, argv: list[str] | None = None) -> subprocess.Popen[bytes]:
        """Start a process and move it into the pod's container cgroups."""
        proc = subprocess.Popen(argv or [SLEEP, "600"])
        pod.processes.append(proc)
        for d in pod.dirs:
            (d / "cgroup.procs").write_text(str(proc.pid))
        return proc

    def close(self) -> None:
        for pod in self.pods:
            for proc in pod.processes:
                with contextlib.suppress(OSError):
                    proc.kill()
        for root in self.roots:  # thaw first: a task frozen by the v1 freezer cannot die
            for d, _, _ in os.walk(root):
                for name, value in (("cgroup.freeze", "0"), ("freezer.state", "THAWED")):
                    with contextlib.suppress(OSError):
                        (Path(d) / name).write_text(value)
        for pod in self.pods:
            for proc in pod.processes:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(5)
        for root in self.roots:
            for d, _, _ in os.walk(root, topdown=False):
                deadline = time.monotonic() + 5
                while True:
                    try:
                        os.rmdir(d)
                        break
                    except FileNotFoundError:
                        break
                    except OSError:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.02)  # a cgroup is busy until its last task has been reaped


@contextlib.contextmanager
def cgroup_tree(*layouts: Layout) -> Iterator[CgroupTree]:
    for layout in layouts:
        require(unavailable(layout))
    tree = CgroupTree()
    try:
        yield tree
    finally:
        tree.close()


class RealTimeGpu:
    """A simulated GPU stepped on the wall clock; its processes are real ones (by PID) and are frozen
    whenever their real cgroup is, and dead once the real process is gone."""

    def __init__(self, uuid: str = "GPU-00000000-5a1e-4c0f-9d00-7ea1000000e0", tick_s: float = 0.01) -> None:
        self.clock = SystemClock()
        self.gpu = SimGPU(0, uuid, sample_window_s=1 / 6, sample_delay_s=0.05, sample_jitter_s=0.0)
        self.nvml = FakeNVML([self.gpu], self.clock)
        self.tick_s = tick_s
        self._members: list[tuple[SimProcess, Pod, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="realtime-gpu", daemon=True)

    @property
    def uuid(self) -> str:
        return self.gpu.uuid

    def attach(self, pod: Pod, proc: subprocess.Popen[bytes], workload: Workload) -> SimProcess:
        process = SimProcess(proc.pid, 0, self.clock.now(), workload)
        self.gpu.attach(process)
        self._members.append((process, pod, proc.pid))
        return process

    def start(self) -> RealTimeGpu:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        last = self.clock.now()
        while not self._stop.wait(self.tick_s):
            for process, pod, pid in self._members:
                if process.alive and not Path(f"/proc/{pid}").exists():
                    process.alive, process.died = False, self.clock.now()
                process.frozen = pod.frozen()
            now = self.clock.now()
            self.gpu.step(now, now - last)
            last = now


class FrozenLog:
    """Polls pods' real frozen state every ``poll_s`` and keeps the intervals (monotonic seconds)."""

    def __init__(self, pods: list[Pod], poll_s: float = 0.002) -> None:
        self.pods = pods
        self.poll_s = poll_s
        self.intervals: dict[str, list[tuple[float, float]]] = {p.name: [] for p in pods}
        self._since: dict[str, float | None] = {p.name: None for p in pods}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="frozen-log", daemon=True)

    def start(self) -> FrozenLog:
        self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        now = time.monotonic()
        for name, since in self._since.items():
            if since is not None:
                self.intervals[name].append((since, now))
                self._since[name] = None

    def frozen_now(self, name: str) -> bool:
        return self._since[name] is not None

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            now = time.monotonic()
            for pod in self.pods:
                frozen, since = pod.frozen(), self._since[pod.name]
                if frozen and since is None:
                    self._since[pod.name] = now
                elif not frozen and since is not None:
                    self.intervals[pod.name].append((since, now))
                    self._since[pod.name] = None

    def longest(self, t0: float, t1: float) -> float:
        """The longest freeze of any pod overlapping ``[t0, t1]``."""
        spans = [b - a for ivs in self.intervals.values() for a, b in ivs if b >= t0 and a <= t1]
        return max(spans, default=0.0)


def wait_until(predicate: Any, timeout_s: float, poll_s: float = 0.005) -> float | None:
    """Poll until ``predicate()`` is true; returns when (monotonic) or None on timeout."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return time.monotonic()
        time.sleep(poll_s)
    return None
