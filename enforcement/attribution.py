"""Which slice a GPU process belongs to: PID -> cgroup -> pod UID -> the pod's allocation record.

A process counts as a slice's only if its cgroup names a pod container, that pod is managed (it
carries a valid record for this node), and the record names the GPU the process is on. Everything
else (host services, pods without a record, a managed pod's process on a GPU it holds no slice
of) is left alone; the last kind is remembered per process (:attr:`Attributor.off_slice`) so the
metrics can say how many such processes there are.
"""

from __future__ import annotations

from dataclasses import dataclass

from enforcement.cgroups import CgroupResolver, ContainerRef
from enforcement.pods import PodIndex, SliceHolder


@dataclass(frozen=True, slots=True)
class ProcessOwner:
    """A GPU process attributed to a slice holder, pinned by its start time (and pidfd, if any)."""

    holder: SliceHolder
    pid: int
    start_time: int
    container: ContainerRef
    container_name: str
    pidfd: int | None = None


class Attributor:
    """Resolves GPU processes to slice holders through the cgroup resolver and the pod index."""

    def __init__(self, resolver: CgroupResolver, index: PodIndex) -> None:
        self.resolver = resolver
        self.index = index
        self.off_slice: set[tuple[int, int, str]] = set()  # (pid, start time, gpu) since the last scan began

    def new_scan(self) -> None:
        """A memory scan of every GPU begins: off-slice processes are counted afresh."""
        self.off_slice = set()

    def owner(self, pid: int, gpu: str) -> ProcessOwner | None:
        """The slice holder of ``pid`` on ``gpu``, or None when the process is not a managed slice's."""
        identity = self.resolver.lookup(pid)
        if identity is None or identity.container is None:
            return None
        managed = self.index.get(identity.container.pod_uid)
        if managed is None:
            return None
        holder = managed.holder(gpu)
        if holder is None:
            self.off_slice.add((pid, identity.start_time, gpu))
            return None
        name = managed.containers.get(identity.container.container_id, "")
        return ProcessOwner(holder, pid, identity.start_time, identity.container, name, identity.pidfd)
