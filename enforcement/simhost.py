"""A simulated node around the simulated GPUs: fake ``/proc``, fake cgroupfs, pods, a killer.

The agent runs against it unchanged: it reads ``<root>/proc/<pid>/{stat,cgroup}`` through the
real resolver and writes ``<root>/cgroup/<path>/cgroup.freeze`` through the real freezer (the
host is v2-only, so the agent freezes pod cgroups). The "kernel" here reads those files after each
agent step (the agent is their only writer, and it only runs between ticks), stops or resumes the
processes of every cgroup that is frozen itself or through an ancestor (as v2 does), and answers
in ``cgroup.events``. With ``kill_waits_for_thaw`` a killed process does not die while frozen
(the v1 freezer's behaviour). Everything the tests judge is recorded as ground truth: per-tick GPU time and
memory of each container, freeze intervals, kills, and writes to cgroups nobody should touch.
"""

from __future__ import annotations

import os
import random
import uuid as uuidlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from enforcement.clock import SimClock
from enforcement.simgpu import TICK_S, SimGPU, SimProcess, Workload
from packing.record import ANNOTATION, AllocationRecord

BOOT_OFFSET_S = 1000.0  # simulated processes start this long after boot (start time in ticks)
CLK_TCK = 100


def _overwrite(path: Path, text: str) -> None:
    """Rewrite a same-length file in place: no truncation, so ext4 does not flush it to disk."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def systemd_container_path(pod_uid: str, container_id: str, qos: str = "burstable") -> str:
    """The v2 path of a container cgroup under the systemd driver with containerd."""
    escaped = pod_uid.replace("-", "_")
    if qos == "guaranteed":
        return f"/kubepods.slice/kubepods-pod{escaped}.slice/cri-containerd-{container_id}.scope"
    return f"/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{escaped}.slice/cri-containerd-{container_id}.scope"


@dataclass
class SimContainer:
    """A container cgroup in the fake tree and the ground truth recorded for it."""

    name: str
    path: str
    directory: Path
    gpu_index: int | None
    processes: list[SimProcess] = field(default_factory=list)
    frozen: bool = False
    frozen_since: float | None = None
    freeze_intervals: list[tuple[float, float]] = field(default_factory=list)
    gpu_time: list[float] = field(default_factory=list)  # cumulative, one entry per tick
    memory: list[int] = field(default_factory=list)  # bytes held on its GPU, one entry per tick

    def live(self) -> list[SimProcess]:
        return [p for p in self.processes if p.alive]


@dataclass(frozen=True, slots=True)
class KillLog:
    """A kill the agent issued: when, which process, in which container, and when it died."""

    time: float
    pid: int
    container: str
    died: float


class SimNode:
    """Simulated host: GPUs, processes in container cgroups, and the files the agent reads."""

    def __init__(
        self,
        root: Path,
        gpus: Sequence[SimGPU],
        clock: SimClock | None = None,
        node_name: str = "sim-node",
        kill_latency_s: float = 0.0,
        tick_s: float = TICK_S,
        seed: int = 0,
        kill_waits_for_thaw: bool = False,
    ) -> None:
        self.root = root
        self.proc_root = root / "proc"
        self.cgroup_root = root / "cgroup"
        self.proc_root.mkdir(parents=True, exist_ok=True)
        self.cgroup_root.mkdir(parents=True, exist_ok=True)
        self.gpus = list(gpus)
        self.clock = clock or SimClock()
        self.origin = self.clock.now()
        self.node_name = node_name
        self.kill_latency_s = kill_latency_s
        self.kill_waits_for_thaw = kill_waits_for_thaw
        self.tick_s = tick_s
        self.ticks = 0
        self.rng = random.Random(seed)
        self.containers: dict[str, SimContainer] = {}
        self.pods: list[dict[str, Any]] = []
        self.kills: list[KillLog] = []
        self.foreign_signals: list[int] = []
        self.gpu_busy: list[list[float]] = [[] for _ in self.gpus]
        self._next_pid = 4000
        self._by_pid: dict[int, tuple[SimProcess, SimContainer]] = {}
        self._deaths: list[tuple[float, SimProcess]] = []
        self._cgroups: dict[Path, bool] = {}  # every cgroup with a cgroup.freeze -> frozen (itself or inherited)

    # --- building the scene -------------------------------------------------------------------
    def now(self) -> float:
        """Seconds since the simulation started."""
        return self.clock.now() - self.origin

    def _add_cgroup(self, directory: Path, frozen: bool = False) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "cgroup.freeze").write_text("1\n" if frozen else "0\n")
        (directory / "cgroup.events").write_text(f"populated 1\nfrozen {int(frozen)}\n")
        (directory / "cgroup.procs").write_text("")
        self._cgroups[directory] = frozen

    def add_container(self, name: str, path: str, gpu_index: int | None, pre_frozen: bool = False) -> SimContainer:
        """Create a container cgroup (``cgroup.freeze``, ``cgroup.events``, ``cgroup.procs``)."""
        directory = self.cgroup_root / path.strip("/")
        self._add_cgroup(directory, pre_frozen)
        container = SimContainer(name, path, directory, gpu_index, frozen=pre_frozen)
        if pre_frozen:
            container.frozen_since = self.now()
        self.containers[name] = container
        return container

    def add_pod(
        self,
        name: str,
        product: str | None,
        milli: int,
        memory_mib: int,
        gpu_indexes: Sequence[int],
        namespace: str = "default",
        managed: bool = True,
        record_node: str | None = None,
        qos: str = "burstable",
    ) -> SimContainer:
        """A pod with one container; with ``managed`` it carries an allocation record."""
        pod_uid = str(uuidlib.UUID(int=self.rng.getrandbits(128), version=4))
        container_id = "".join(self.rng.choice("0123456789abcdef") for _ in range(64))
        path = systemd_container_path(pod_uid, container_id, qos)
        self._add_cgroup((self.cgroup_root / path.strip("/")).parent)  # the pod's cgroup
        container = self.add_container(name, path, gpu_indexes[0] if gpu_indexes else None)
        annotations: dict[str, str] = {}
        spec: dict[str, object] = {"nodeName": self.node_name}
        if managed:  # it asks as a real pod does: by annotation, or by a DRA claim that names its product
            if product:
                annotations["gpuslice.io/product"] = product
            else:
                spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": f"{name}-gpu"}]
            record = AllocationRecord(
                claim_uid=pod_uid,  # the extender writes a record for the pod it binds
                node=record_node or self.node_name,
                gpus=tuple(self.gpus[i].uuid for i in gpu_indexes),
                product=product,
                milli=milli,
                memory_mib=memory_mib,
            )
            annotations[ANNOTATION] = record.encode()
        self.pods.append(
            {
                "metadata": {"uid": pod_uid, "name": name, "namespace": namespace, "annotations": annotations},
                "spec": spec,
                "status": {
                    "phase": "Running",
                    "containerStatuses": [{"name": "main", "containerID": f"containerd://{container_id}"}],
                },
            }
        )
        return container

    def spawn(self, container: SimContainer, workload: Workload, gpu_index: int | None = None) -> SimProcess:
        """Start a process in ``container`` on a GPU, with its /proc entries."""
        pid = self._next_pid
        self._next_pid += 1
        now = self.now()
        start_ticks = round((BOOT_OFFSET_S + now) * CLK_TCK)
        process = SimProcess(
            pid=pid, start_ticks=start_ticks, born=self.clock.now(), workload=workload, frozen=container.frozen
        )
        index = container.gpu_index if gpu_index is None else gpu_index
        if index is None:
            raise ValueError(f"container {container.name} has no GPU to run on")
        self.gpus[index].attach(process)
        container.processes.append(process)
        self._by_pid[pid] = (process, container)
        proc_dir = self.proc_root / str(pid)
        proc_dir.mkdir(parents=True, exist_ok=True)
        (proc_dir / "cgroup").write_text(f"0::{container.path}\n")
        fields = ["S", "1", str(pid), str(pid)] + ["0"] * 15 + [str(start_ticks)] + ["0"] * 30
        (proc_dir / "stat").write_text(f"{pid} (python3 worker) " + " ".join(fields) + "\n")
        self._write_procs(container)
        return process

    def _write_procs(self, container: SimContainer) -> None:
        (container.directory / "cgroup.procs").write_text("".join(f"{p.pid}\n" for p in container.live()))

    # --- the agent's hands ---------------------------------------------------------------------
    def kill(self, pid: int, start_time: int, pidfd: int | None = None) -> bool:
        """The Killer protocol: SIGKILL ``pid`` if it is still the process that started at ``start_time``."""
        found = self._by_pid.get(pid)
        if found is None or not found[0].alive or found[0].start_ticks != start_time:
            self.foreign_signals.append(pid)
            return False
        process, container = found
        if any(p is process for _, p in self._deaths):
            return True
        died = self.now() + self.kill_latency_s
        self._deaths.append((died, process))
        self.kills.append(KillLog(self.now(), pid, container.name, died))
        if self.kill_latency_s <= 0:
            self._reap()
        return True

    def _reap(self) -> None:
        now = self.now()

        def can_die(process: SimProcess) -> bool:
            return not (self.kill_waits_for_thaw and self._by_pid[process.pid][1].frozen)

        due = [(t, p) for t, p in self._deaths if t <= now + 1e-12 and can_die(p)]
        self._deaths = [(t, p) for t, p in self._deaths if not (t <= now + 1e-12 and can_die(p))]
        for _, process in due:
            process.alive = False
            process.died = self.clock.now()
            process.queued = 0.0
            _, container = self._by_pid[process.pid]
            self._write_procs(container)
            stat = self.proc_root / str(process.pid) / "stat"
            stat.unlink(missing_ok=True)
            (self.proc_root / str(process.pid) / "cgroup").unlink(missing_ok=True)

    def sync_cgroups(self) -> None:
        """The kernel's side of the freezer: apply what ``cgroup.freeze`` says (a cgroup is frozen if it or
        an ancestor is set frozen), report in ``cgroup.events``."""
        now = self.now()
        own = {d: (d / "cgroup.freeze").read_text().strip() == "1" for d in self._cgroups}
        for directory in self._cgroups:
            frozen = any(own.get(a, False) for a in (directory, *directory.parents))
            if frozen != self._cgroups[directory]:
                self._cgroups[directory] = frozen
                _overwrite(directory / "cgroup.events", f"populated 1\nfrozen {int(frozen)}\n")
        for container in self.containers.values():
            want = self._cgroups[container.directory]
            if want == container.frozen:
                continue
            container.frozen = want
            for p in container.processes:
                p.frozen = want
            if want:
                container.frozen_since = now
            else:
                assert container.frozen_since is not None
                container.freeze_intervals.append((container.frozen_since, now))
                container.frozen_since = None
        self._reap()  # a thawed process with a kill pending dies now

    # --- time ------------------------------------------------------------------------------------
    def advance(self) -> None:
        """One tick: deaths due, every GPU's time-slicing and sampling, then the ground truth."""
        self.ticks += 1
        self.clock.advance_to(self.origin + self.ticks * self.tick_s)
        self._reap()
        now_abs = self.clock.now()
        for i, gpu in enumerate(self.gpus):
            gpu.step(now_abs, self.tick_s)
            self.gpu_busy[i].append(gpu.busy_time)
        for container in self.containers.values():
            container.gpu_time.append(sum(p.gpu_time for p in container.processes))
            container.memory.append(sum(p.memory_at(now_abs) for p in container.processes if p.alive))

    # --- ground truth queries --------------------------------------------------------------------
    def tick_index(self, t: float) -> int:
        """Index of the tick ending at simulated time ``t`` (clamped to what has been recorded)."""
        return max(0, min(self.ticks - 1, round(t / self.tick_s) - 1))

    def share(self, name: str, t0: float, t1: float) -> float:
        """Fraction of the GPU the container used between t0 and t1 (ground truth)."""
        return self._rate(self.containers[name].gpu_time, t0, t1)

    def gpu_share_busy(self, gpu_index: int, t0: float, t1: float) -> float:
        """Fraction of time the GPU was busy between t0 and t1 (ground truth)."""
        return self._rate(self.gpu_busy[gpu_index], t0, t1)

    def _rate(self, cumulative: list[float], t0: float, t1: float) -> float:
        """Growth per second of a per-tick cumulative series between t0 and t1."""
        i0, i1 = self.tick_index(t0), self.tick_index(t1)
        return (cumulative[i1] - cumulative[i0]) / max(t1 - t0, 1e-9)

    def frozen_intervals(self, name: str) -> list[tuple[float, float]]:
        """Closed freeze intervals plus the one still open (ending now)."""
        c = self.containers[name]
        open_ = [(c.frozen_since, self.now())] if c.frozen_since is not None else []
        return c.freeze_intervals + open_
