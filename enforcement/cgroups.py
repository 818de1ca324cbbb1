"""Who is who: a host PID to its pod UID, container ID and container cgroup.

The kubelet names a pod's cgroup ``kubepods[/<qos>]/pod<UID>`` (cgroupfs driver) or
``kubepods[-<qos>]-pod<UID_>.slice`` (systemd driver, ``-`` escaped to ``_``); Guaranteed pods
have no QoS level. The runtime's container cgroup sits right below it: ``cri-containerd-<id>.scope``
(containerd), ``crio-<id>.scope`` / ``crio-<id>`` (CRI-O), ``docker-<id>.scope`` (cri-dockerd), or the
bare 64-hex ID (cgroupfs). ``crio-conmon-<id>.scope`` is CRI-O's monitor, not the container, and
deeper levels (CRI-O's nested ``container`` cgroup, systemd inside a container) are cut off: the
container cgroup is the unit that gets frozen.

Lookups are cached per process. On the host's ``/proc`` each process is pinned by a pidfd opened
before its files are read and checked alive after: as long as that pidfd's process lives, the PID is
that process, so a cached identity is valid exactly while it is alive, and the killer signals that
very pidfd. Elsewhere (a simulated ``/proc``, or a kernel without pidfds) the cache key is
``(pid, start time)`` (field 22 of ``/proc/<pid>/stat``), which only resolves one clock tick
(10 ms): a PID reused within the same tick would pass for the process that held it before.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
from dataclasses import dataclass
from pathlib import Path

_UID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32}"
_POD_COMPONENT = re.compile(rf"(?:[a-z0-9_.-]*-)?pod({_UID})(?:\.slice)?")
_CONTAINER_COMPONENT = re.compile(r"(?:cri-containerd-|crio-|docker-)?([0-9a-f]{64})(?:\.scope)?")
_V1_PREFERRED = ("memory", "pids", "freezer", "cpu", "cpuacct", "devices", "name=systemd")


@dataclass(frozen=True, slots=True)
class ContainerRef:
    """A container's identity and where its cgroup lives in each hierarchy the process showed.

    ``unified`` is the container cgroup's path in the v2 hierarchy (None when the v2 line does
    not name the container, e.g. on a v1 or hybrid host); ``v1`` maps a v1 controller (``freezer``,
    ``memory``, ...) to the container cgroup's path in that controller's hierarchy.
    """

    pod_uid: str
    container_id: str
    unified: str | None
    v1: tuple[tuple[str, str], ...] = ()

    def v1_path(self, controller: str) -> str | None:
        """The container cgroup's path in one v1 controller's hierarchy, if the process is in it."""
        return next((p for c, p in self.v1 if c == controller), None)


def canonical_uid(uid: str) -> str:
    """The form pod UIDs are compared in: lower case, dashes (the systemd driver writes ``_``)."""
    return uid.strip().lower().replace("_", "-")


def container_in_path(path: str) -> tuple[str, str, str] | None:
    """``(pod uid, container id, container cgroup path)`` if ``path`` lies in a pod's container cgroup.

    The returned path stops at the container level (deeper sub-cgroups are the container's own
    business). None for anything else: host services, pod-level cgroups, CRI-O's conmon.
    """
    parts = [p for p in path.split("/") if p]
    for i in range(len(parts) - 1):
        pod = _POD_COMPONENT.fullmatch(parts[i])
        if pod is None:
            continue
        container = _CONTAINER_COMPONENT.fullmatch(parts[i + 1])
        if container is None:
            continue
        return canonical_uid(pod.group(1)), container.group(1), "/" + "/".join(parts[: i + 2])
    return None


def pod_in_path(path: str) -> str | None:
    """The pod UID if ``path`` is a pod's own cgroup (``.../pod<UID>``, nothing below it), else None."""
    parts = [p for p in path.split("/") if p]
    pod = _POD_COMPONENT.fullmatch(parts[-1]) if parts else None
    return canonical_uid(pod.group(1)) if pod is not None else None


def parse_cgroup(text: str) -> ContainerRef | None:
    """Parse ``/proc/<pid>/cgroup`` (v1, v2 or hybrid): the container the process runs in, or None.

    The v2 line (``0::<path>``) is preferred; if it does not name a container (v1 hosts, hybrid
    hosts where the kubelet drives v1), the v1 ``memory``/``pids``/... lines are used. Lines that
    are not ``id:controllers:path`` are ignored.
    """
    unified_path: str | None = None
    v1_paths: dict[str, str] = {}
    for line in text.splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        hierarchy, controllers, path = fields
        if hierarchy == "0" and controllers == "":
            unified_path = path
        elif controllers:
            for controller in controllers.split(","):
                v1_paths[controller] = path
    unified = container_in_path(unified_path) if unified_path is not None else None
    identity = unified
    if identity is None:
        ordered = [c for c in _V1_PREFERRED if c in v1_paths] + sorted(set(v1_paths) - set(_V1_PREFERRED))
        for controller in ordered:
            identity = container_in_path(v1_paths[controller])
            if identity is not None:
                break
    if identity is None:
        return None
    pod_uid, container_id, _ = identity
    v1: list[tuple[str, str]] = []
    for controller, path in sorted(v1_paths.items()):
        found = container_in_path(path)
        if found is not None and found[:2] == (pod_uid, container_id):
            v1.append((controller, found[2]))
    return ContainerRef(pod_uid, container_id, unified[2] if unified else None, tuple(v1))


def parse_start_time(stat: str) -> int | None:
    """Field 22 (``starttime``, clock ticks after boot) of a ``/proc/<pid>/stat`` line.

    The command name (field 2) is in parentheses and may itself hold spaces and parentheses, so
    the fields are counted from the last ``)``.
    """
    close = stat.rfind(")")
    if close < 0:
        return None
    rest = stat[close + 1 :].split()
    try:
        return int(rest[19])  # rest[0] is field 3 (state), so field 22 is rest[19]
    except (IndexError, ValueError):
        return None


def read_start_time(proc_root: Path, pid: int) -> int | None:
    """The start time of ``pid`` under ``proc_root``, or None if there is no such process."""
    try:
        return parse_start_time((proc_root / str(pid) / "stat").read_text())
    except OSError:  # gone, never there, or unreadable: no process to speak of
        return None


@dataclass(frozen=True, slots=True)
class ProcessIdentity:
    """A live process: its PID, start time, the container it runs in (None: not in a pod), and the
    pidfd that pins it (None where there is none: then only ``(pid, start_time)`` names it)."""

    pid: int
    start_time: int
    container: ContainerRef | None
    pidfd: int | None = None


def pidfd_alive(fd: int) -> bool:
    """Whether the process a pidfd refers to still exists (signal 0 checks without signalling)."""
    try:
        signal.pidfd_send_signal(fd, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists; whether we may signal it is the killer's question
    return True


def _is_host_proc(proc_root: Path) -> bool:
    try:
        return proc_root.resolve() == Path("/proc")
    except OSError:
        return False


class CgroupResolver:
    """PID -> container, read from ``<proc_root>/<pid>/cgroup``; cached per process (see the module doc).

    ``pin`` (default: whether ``proc_root`` is the host's ``/proc``) pins each process by a pidfd;
    it turns itself off where the kernel has no ``pidfd_open`` (Linux < 5.3).
    """

    def __init__(self, proc_root: Path = Path("/proc"), max_entries: int = 65536, pin: bool | None = None) -> None:
        self.proc_root = proc_root
        self.max_entries = max_entries
        self.pin = _is_host_proc(proc_root) if pin is None else pin
        self._cache: dict[tuple[int, int], ContainerRef | None] = {}
        self._pins: dict[int, tuple[int, int]] = {}  # pid -> (pidfd, start time)
        self.reads = 0

    def lookup(self, pid: int) -> ProcessIdentity | None:
        """The process's identity, or None when it has exited (or cannot be read)."""
        if not self.pin:
            return self._lookup_by_start_time(pid)
        return self._pinned(pid) or self._pin_and_read(pid)

    def _pinned(self, pid: int) -> ProcessIdentity | None:
        entry = self._pins.get(pid)
        if entry is None:
            return None
        fd, start = entry
        if pidfd_alive(fd) and (pid, start) in self._cache:
            return ProcessIdentity(pid, start, self._cache[(pid, start)], fd)
        self._unpin(pid)  # that process is gone: whoever has the PID now is looked up afresh
        return None

    def _pin_and_read(self, pid: int) -> ProcessIdentity | None:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return None
        except OSError:  # no pidfd_open on this kernel: fall back to start times for good
            self.pin = False
            return self._lookup_by_start_time(pid)
        start = read_start_time(self.proc_root, pid)
        try:
            text = (self.proc_root / str(pid) / "cgroup").read_text()
        except OSError:
            text = None
        # Alive after the reads: the PID named the pinned process all along, so they describe it.
        if start is None or text is None or not pidfd_alive(fd):
            os.close(fd)
            return None
        self.reads += 1
        if len(self._cache) >= self.max_entries:
            self._forget_all()
        ref = parse_cgroup(text)
        self._cache[(pid, start)] = ref
        self._pins[pid] = (fd, start)
        return ProcessIdentity(pid, start, ref, fd)

    def _unpin(self, pid: int) -> None:
        entry = self._pins.pop(pid, None)
        if entry is not None:
            self._cache.pop((pid, entry[1]), None)
            with contextlib.suppress(OSError):
                os.close(entry[0])

    def _forget_all(self) -> None:
        for pid in list(self._pins):
            self._unpin(pid)
        self._cache.clear()  # a bounded cache; re-reading a few files is cheap

    def close(self) -> None:
        """Close every pidfd held (the resolver stays usable)."""
        self._forget_all()

    def _lookup_by_start_time(self, pid: int) -> ProcessIdentity | None:
        start = read_start_time(self.proc_root, pid)
        if start is None:
            return None
        key = (pid, start)
        if key in self._cache:
            return ProcessIdentity(pid, start, self._cache[key])
        try:
            text = (self.proc_root / str(pid) / "cgroup").read_text()
        except OSError:
            return None
        self.reads += 1
        # Re-check: if the PID was recycled between the two reads, the cgroup file is the newcomer's.
        if read_start_time(self.proc_root, pid) != start:
            return None
        ref = parse_cgroup(text)
        if len(self._cache) >= self.max_entries:
            self._forget_all()
        self._cache[key] = ref
        return ProcessIdentity(pid, start, ref)

    def retain(self, live: set[tuple[int, int]]) -> None:
        """Forget processes not in ``live`` ((pid, start time) pairs seen on a GPU lately)."""
        for pid, (_, start) in list(self._pins.items()):
            if (pid, start) not in live:
                self._unpin(pid)
        for key in [k for k in self._cache if k not in live]:
            del self._cache[key]
