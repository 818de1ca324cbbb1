"""The memory watchdog: a slice's memory cap is a hard limit.

Every sampling period, per GPU, the used memory of each slice holder's processes is summed; a
holder above its cap loses its largest process on that GPU (SIGKILL by pidfd after re-checking the
start time, then the next largest while the rest still exceeds the cap), and the pod gets an Event.
No grace period: GPU memory is only returned when the process exits, so anything gentler would
leave the slice over its cap for longer than one period.

Never on doubtful data: a failed NVML call skips that GPU for the period, and a holder with any
process whose usage NVML cannot report is skipped. Never outside a managed slice: unattributed
processes are not even considered. A process already killed but still listed (kill latency) is
discounted rather than followed by a second victim. Right after a kill, ``on_kill`` runs (the agent
thaws the pod there: a process frozen by the v1 freezer cannot die, so its memory would stay held).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from enforcement.attribution import ProcessOwner
from enforcement.clock import Clock
from enforcement.events import EventSink
from enforcement.killer import Killer
from enforcement.nvml import NvmlBackend, NvmlError, NvmlTimeout
from enforcement.pods import MIB, SliceHolder

log = logging.getLogger(__name__)

KILL_REASON = "GpuMemoryCapExceeded"


@dataclass(frozen=True, slots=True)
class Kill:
    """One process the watchdog killed, and why."""

    time: float
    pid: int
    start_time: int
    holder: SliceHolder
    container: str
    process_bytes: int
    holder_bytes: int


@dataclass(slots=True)
class HolderMemory:
    """A holder's processes on one GPU; ``used_bytes`` is None if any of them cannot be measured."""

    holder: SliceHolder
    processes: list[tuple[ProcessOwner, int | None]] = field(default_factory=list)

    @property
    def used_bytes(self) -> int | None:
        if any(used is None for _, used in self.processes):
            return None
        return sum(used or 0 for _, used in self.processes)


@dataclass(slots=True)
class GpuScan:
    """One GPU's reading in one period."""

    gpu: str
    ok: bool
    error: str | None = None
    timed_out: bool = False  # the NVML call did not return in time (no progress, not just no data)
    holders: dict[tuple[str, str], HolderMemory] = field(default_factory=dict)
    unmanaged: int = 0
    kills: list[Kill] = field(default_factory=list)


class MemoryWatchdog:
    """Enforces memory caps per slice holder; see the module docstring for the rules."""

    def __init__(
        self,
        backend: NvmlBackend,
        attribute: Callable[[int, str], ProcessOwner | None],
        killer: Killer,
        events: EventSink,
        clock: Clock,
        on_kill: Callable[[ProcessOwner], None] | None = None,
    ) -> None:
        self.backend = backend
        self.attribute = attribute
        self.killer = killer
        self.events = events
        self.clock = clock
        self.on_kill = on_kill
        self.pending: dict[tuple[int, int], Kill] = {}
        self.skipped_unknown = 0
        self.failed_scans = 0

    def check(self, gpus: Sequence[str]) -> list[GpuScan]:
        """Scan every GPU once and enforce the caps; returns the readings (kills included)."""
        return [self._check_gpu(gpu) for gpu in gpus]

    def _check_gpu(self, gpu: str) -> GpuScan:
        try:
            processes = self.backend.process_memory(gpu)
        except NvmlError as e:
            self.failed_scans += 1
            return GpuScan(gpu, ok=False, error=str(e), timed_out=isinstance(e, NvmlTimeout))
        scan = GpuScan(gpu, ok=True)
        listed: set[tuple[int, int]] = set()
        for proc in processes:
            owner = self.attribute(proc.pid, gpu)
            if owner is None:
                scan.unmanaged += 1
                continue
            listed.add((owner.pid, owner.start_time))
            scan.holders.setdefault(owner.holder.key, HolderMemory(owner.holder)).processes.append(
                (owner, proc.used_bytes)
            )
        for key in [k for k, kill in self.pending.items() if kill.holder.gpu == gpu and k not in listed]:
            del self.pending[key]  # it has exited: its memory is back
        for usage in scan.holders.values():
            scan.kills += self._enforce(usage)
        return scan

    def _enforce(self, usage: HolderMemory) -> list[Kill]:
        total = usage.used_bytes
        cap = usage.holder.cap_bytes
        if total is None:
            self.skipped_unknown += 1
            return []
        effective = total - sum(used or 0 for o, used in usage.processes if (o.pid, o.start_time) in self.pending)
        if effective <= cap:
            return []
        candidates = sorted(
            ((o, used or 0) for o, used in usage.processes if (o.pid, o.start_time) not in self.pending),
            key=lambda item: (-item[1], item[0].pid),
        )
        kills: list[Kill] = []
        for owner, used in candidates:
            if effective <= cap:
                break
            effective -= used  # killed now, or already gone: either way that memory is on its way back
            if not self.killer.kill(owner.pid, owner.start_time, owner.pidfd):
                continue
            if self.on_kill is not None:
                self.on_kill(owner)
            kill = Kill(self.clock.now(), owner.pid, owner.start_time, usage.holder, owner.container_name, used, total)
            self.pending[(owner.pid, owner.start_time)] = kill
            kills.append(kill)
            self._report(kill)
        return kills

    def _report(self, kill: Kill) -> None:
        h = kill.holder
        what = f"container {kill.container!r} process" if kill.container else "process"
        message = (
            f"{what} {kill.pid} held {kill.process_bytes / MIB:.0f} MiB of GPU {h.gpu}; the pod's slice "
            f"({h.product or f'{h.weight} milli'}) caps GPU memory at {h.cap_bytes / MIB:.0f} MiB and it held "
            f"{kill.holder_bytes / MIB:.0f} MiB: killed"
        )
        log.warning("%s: %s", h.name, message)
        self.events.emit(h, KILL_REASON, message)
