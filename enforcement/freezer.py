"""Freezing and thawing pod cgroups, never longer than a ceiling, and remembering on disk what we froze.

Three mechanisms, best first:

* cgroup v2: write ``1``/``0`` to ``cgroup.freeze`` (Linux >= 5.2); atomic for the whole cgroup,
  children included, invisible to signal handlers; ``cgroup.events`` says when it is done. A frozen
  task still dies of SIGKILL.
* cgroup v1: write ``FROZEN``/``THAWED`` to the freezer controller's ``freezer.state``. A frozen
  task does *not* die of SIGKILL until it is thawed (the agent thaws a pod right after a kill).
* signals: ``SIGSTOP``/``SIGCONT`` every process listed in the container's ``cgroup.procs`` (each
  through a pidfd opened before the membership is re-checked, so a recycled PID is not hit).

**Which cgroup.** Never the file the container runtime itself uses to pause the container: runc
reads the container cgroup's own ``cgroup.freeze`` (v2) or ``freezer.self_freezing`` (v1) as
"paused", and then refuses ``exec`` ("cannot exec in a paused container": exec probes and
``kubectl exec`` fail) and mixes its pause/resume with ours (README.md has the measurements). So:

* hybrid hosts (the runtime drives v1; the container also sits in the unified tree, as runc puts
  it there): the container's unified cgroup (``cgroup.freeze``), which runc never reads;
* v2-only hosts: the **pod's** cgroup (the container cgroup's parent), whose freeze the container
  inherits while its own ``cgroup.freeze`` stays ``0``;
* v1-only hosts: the pod's v1 freezer cgroup, which the container inherits while its own
  ``freezer.self_freezing`` stays ``0``.

A pod-level freeze also stops the pod's other containers (sidecars) for the freeze: the price where
there is no unified tree beside the runtime's.

Files are opened write-only without ``O_CREAT``: a cgroup that has gone away is reported as gone,
never re-created. The :class:`FreezeJournal` holds every target we froze, written *before* the
freeze (atomically, by rename), so a crashed agent's successor (or its keeper) thaws them all.
:class:`FreezeController` cuts any freeze at ``ceiling_s``; :class:`ThawGuard` runs that cut on its
own thread, so it holds even while the control loop is stuck (in a hung NVML call, say).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from enforcement.cgroups import ContainerRef, container_in_path, pod_in_path

log = logging.getLogger(__name__)

Kind = Literal["v2", "v1", "signal"]
KINDS: tuple[Kind, ...] = ("v2", "v1", "signal")


class FreezeError(RuntimeError):
    """A freeze or thaw could not be applied (the target is still in its previous state)."""


class TargetGone(FreezeError):
    """The cgroup no longer exists: its container has ended, so there is nothing to thaw."""


class CgroupViewError(RuntimeError):
    """The container's cgroup lies outside what this agent can see (a private cgroup namespace, or a
    path outside the cgroup mount): it cannot be paced, and nothing is written."""


@dataclass(frozen=True, slots=True, order=True)
class FreezeTarget:
    """A pod or container cgroup and how to freeze it. ``path`` is relative to the cgroup mount root."""

    kind: Kind
    path: str

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "path": self.path}


def _rel(path: str) -> str:
    return path.strip("/")


def _parent(path: str) -> str:
    return _rel(path).rpartition("/")[0]


def check_view(ref: ContainerRef, cgroup_root: Path) -> None:
    """Raise CgroupViewError if any of ``ref``'s cgroup paths lies outside ``cgroup_root``'s view.

    Inside a private cgroup namespace the kernel shows other containers' cgroups as
    ``/../../kubepods/...``; under ``cgroup_root`` such a path leads somewhere unrelated.
    """
    paths = ([ref.unified] if ref.unified is not None else []) + [p for _, p in ref.v1]
    for path in paths:
        if ".." in path.split("/"):
            raise CgroupViewError(
                f"container {ref.container_id[:12]} of pod {ref.pod_uid}: cgroup path {path!r} lies outside "
                f"this agent's cgroup view ({cgroup_root}); the agent runs in a private cgroup namespace "
                "(run it privileged with hostPID: see enforcement/README.md, Deployment)"
            )


def target_for(ref: ContainerRef, cgroup_root: Path) -> FreezeTarget | None:
    """How to freeze ``ref``'s container on this host (module doc: which cgroup), or None if it is gone.

    Prefers v2 (``<root>/<path>/cgroup.freeze``, also under ``<root>/unified`` on hybrid hosts),
    then the v1 freezer (``<root>/freezer/<pod path>/freezer.state``), then signals to the processes
    of whichever hierarchy lists them. Raises CgroupViewError when the paths lie outside the view.
    """
    check_view(ref, cgroup_root)
    if ref.unified is not None:
        # ref.v1 naming the container too means the runtime drives v1: the unified file is ours alone.
        level = _rel(ref.unified) if ref.v1 else _parent(ref.unified)
        for base in ("", "unified"):
            rel = f"{base}/{level}" if base else level
            if (cgroup_root / rel / "cgroup.freeze").is_file():
                return FreezeTarget("v2", rel)
    freezer_path = ref.v1_path("freezer")
    if freezer_path is not None:
        pod = _parent(freezer_path)
        if (cgroup_root / "freezer" / pod / "freezer.state").is_file():
            return FreezeTarget("v1", f"freezer/{pod}")
    candidates = [_rel(ref.unified)] if ref.unified is not None else []
    candidates += [f"{c}/{_rel(p)}" for c, p in ref.v1 if not c.startswith("name=")]
    for rel in candidates:
        if (cgroup_root / rel / "cgroup.procs").is_file():
            return FreezeTarget("signal", rel)
    return None


def _write(path: Path, value: str) -> None:
    try:
        fd = os.open(path, os.O_WRONLY)  # never O_CREAT: a vanished cgroup must stay vanished
    except FileNotFoundError:
        raise TargetGone(f"{path.parent} is gone") from None
    except OSError as e:
        raise FreezeError(f"cannot open {path}: {e.strerror}") from e
    try:
        os.write(fd, value.encode())
    except OSError as e:
        raise FreezeError(f"cannot write {value!r} to {path}: {e.strerror}") from e
    finally:
        os.close(fd)


class CgroupFreezer:
    """Applies freeze/thaw to FreezeTargets under one cgroup mount root."""

    def __init__(self, cgroup_root: Path = Path("/sys/fs/cgroup")) -> None:
        self.cgroup_root = cgroup_root

    def set_frozen(self, target: FreezeTarget, frozen: bool) -> None:
        """Freeze or thaw ``target``; FreezeError (TargetGone if the cgroup is gone) otherwise."""
        where = self.cgroup_root / target.path
        if target.kind == "v2":
            _write(where / "cgroup.freeze", "1" if frozen else "0")
        elif target.kind == "v1":
            _write(where / "freezer.state", "FROZEN" if frozen else "THAWED")
        else:
            self._signal_all(where, signal.SIGSTOP if frozen else signal.SIGCONT)

    def is_frozen(self, target: FreezeTarget) -> bool | None:
        """Whether the kernel reports the freeze complete; None when unknown (signals, gone)."""
        where = self.cgroup_root / target.path
        try:
            if target.kind == "v2":
                for line in (where / "cgroup.events").read_text().splitlines():
                    key, _, value = line.partition(" ")
                    if key == "frozen":
                        return value.strip() == "1"
                return None
            if target.kind == "v1":
                return (where / "freezer.state").read_text().strip() == "FROZEN"
        except OSError:
            return None
        return None

    def self_frozen(self, target: FreezeTarget) -> bool | None:
        """Whether ``target`` itself is set frozen (by a write to it, not via a parent); None if unknown.

        Asked before we freeze a target: set frozen already means someone else froze it (a user's
        pause), and then it is theirs, not ours, to thaw.
        """
        where = self.cgroup_root / target.path
        try:
            if target.kind == "v2":
                return (where / "cgroup.freeze").read_text().strip() == "1"
            if target.kind == "v1":
                try:
                    return (where / "freezer.self_freezing").read_text().strip() == "1"
                except FileNotFoundError:  # kernels before 3.11 (or a fake tree): the state says it
                    return (where / "freezer.state").read_text().strip() == "FROZEN"
        except OSError:
            return None
        return None

    @staticmethod
    def _members(where: Path) -> set[int]:
        try:
            return {int(x) for x in (where / "cgroup.procs").read_text().split()}
        except FileNotFoundError:
            raise TargetGone(f"{where} is gone") from None
        except (OSError, ValueError) as e:
            raise FreezeError(f"cannot list {where}/cgroup.procs: {e}") from e

    def _signal_all(self, where: Path, sig: signal.Signals) -> None:
        for pid in sorted(self._members(where)):
            try:
                fd = os.pidfd_open(pid)
            except ProcessLookupError:
                continue
            try:
                # Only signal the PID if it is still a member once we hold its pidfd (no reuse race).
                if pid in self._members(where):
                    signal.pidfd_send_signal(fd, sig)
            except ProcessLookupError:
                continue
            except PermissionError as e:
                raise FreezeError(f"cannot signal {pid} in {where}: {e.strerror}") from e
            finally:
                os.close(fd)


class FreezeJournal:
    """The set of targets this agent froze, kept in one JSON file under the runtime directory."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> list[FreezeTarget]:
        """The targets on file; entries that are malformed or name no container cgroup are dropped."""
        try:
            doc = json.loads(self.path.read_text())
        except FileNotFoundError:
            return []
        except (OSError, ValueError) as e:
            log.error("freeze journal %s unreadable (%s); nothing to thaw from it", self.path, e)
            return []
        entries = doc.get("frozen", []) if isinstance(doc, dict) else []
        out: list[FreezeTarget] = []
        for entry in entries if isinstance(entries, list) else []:
            kind, path = (entry.get("kind"), entry.get("path")) if isinstance(entry, dict) else (None, None)
            # Only ever touch what is recognisably a pod's or a pod container's cgroup, whatever the file says.
            if (
                kind in KINDS
                and isinstance(path, str)
                and ".." not in path.split("/")
                and (container_in_path(path) or pod_in_path(path))
            ):
                out.append(FreezeTarget(kind, path))
            else:
                log.error("freeze journal %s: ignoring entry %r", self.path, entry)
        return out

    def save(self, targets: Iterable[FreezeTarget]) -> None:
        """Replace the file's content atomically (write a temporary file, rename it over).

        No fsync: the journal must survive the agent's crash, which the page cache does; a host
        crash needs nothing from it (after a reboot no cgroup is frozen).
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)
        doc = {"frozen": [t.to_json() for t in sorted(set(targets))]}
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(doc))
        os.replace(tmp, self.path)


class FreezeController:
    """Keeps the frozen set and the journal in step: a target is on file before it is frozen.

    The file holds a *superset* of what is frozen (thawing a thawed cgroup at recovery is a
    no-op), so it is rewritten only when a target not yet on file is frozen, and compacted when
    everything is thawed: steady pacing among the same containers writes nothing.

    Thread-safe: the control loop calls :meth:`apply`, :class:`ThawGuard` calls :meth:`expire`. The
    lock is held for cgroup and journal writes only (never for NVML or the network), which is what
    makes the ceiling hold: a freeze started at ``t`` is cut by ``t + ceiling_s`` plus the guard's
    wake-up and at most one critical section. ``since`` is taken on ``clock`` (monotonic).
    """

    def __init__(
        self,
        freezer: CgroupFreezer,
        journal: FreezeJournal,
        compact_above: int = 64,
        ceiling_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        retry_s: float = 0.05,
    ) -> None:
        if ceiling_s is not None and ceiling_s <= 0:
            raise ValueError(f"the freeze ceiling must be positive, got {ceiling_s}")
        self.freezer = freezer
        self.journal = journal
        self.compact_above = compact_above
        self.ceiling_s = ceiling_s
        self.clock = clock
        self.retry_s = retry_s
        self.frozen: set[FreezeTarget] = set()
        self.since: dict[FreezeTarget, float] = {}  # when each frozen target was frozen (clock)
        self.journaled: set[FreezeTarget] = set()
        self.foreign: set[FreezeTarget] = set()  # frozen by someone else when we wanted it: left alone
        self.errors = 0
        self.ceiling_thaws = 0
        self.changed = threading.Condition(threading.RLock())

    def recover(self) -> list[FreezeTarget]:
        """Thaw everything a previous run left frozen (crash-restart); returns what was thawed."""
        with self.changed:
            leftover = set(self.journal.load())
            now = self.clock()
            for target in leftover - self.frozen:
                self.since[target] = now
            self.frozen |= leftover
            self.journaled |= leftover
            stuck = self.thaw_all()
            return sorted(leftover - stuck)

    def apply(self, want: set[FreezeTarget]) -> None:
        """Make exactly ``want`` frozen (of the targets we manage); failures are logged and counted."""
        with self.changed:
            to_freeze = {t for t in want - self.frozen if not self._frozen_by_others(t)}
            to_thaw = self.frozen - want
            if to_freeze - self.journaled:
                keep = self.journaled if len(self.journaled) < self.compact_above else self.frozen
                on_file = keep | self.frozen | to_freeze
                self.journal.save(on_file)
                self.journaled = on_file  # only once saved: a failed save leaves the next apply to retry it
            for target in sorted(to_freeze):
                self.since[target] = self.clock()  # before the write: the ceiling counts from no later
                try:
                    self.freezer.set_frozen(target, True)
                    self.frozen.add(target)
                except FreezeError as e:
                    self.errors += 1
                    del self.since[target]
                    log.warning("freeze %s failed: %s", target.path, e)
                    self._thaw_quietly(target)  # a half-applied freeze is rolled back
            if to_thaw:
                self._thaw(to_thaw)
            if to_freeze:
                self.changed.notify_all()  # the guard's next deadline may be earlier now

    def _frozen_by_others(self, target: FreezeTarget) -> bool:
        if self.freezer.self_frozen(target):
            if target not in self.foreign:
                self.foreign.add(target)
                log.warning("%s is frozen by someone else (a paused container?): not pacing it", target.path)
            return True
        self.foreign.discard(target)
        return False

    def thaw(self, targets: Iterable[FreezeTarget]) -> set[FreezeTarget]:
        """Thaw these of our targets now (after a kill, say); returns those that could not be thawed."""
        with self.changed:
            return self._thaw(set(targets) & self.frozen)

    def thaw_all(self) -> set[FreezeTarget]:
        """Thaw every target we froze; returns those that could not be thawed (kept on file)."""
        with self.changed:
            stuck = self._thaw(set(self.frozen))
            self.journal.save(stuck)
            self.journaled = set(stuck)
            return stuck

    def next_expiry(self) -> float | None:
        """When the longest-frozen target reaches the ceiling (clock time); None if nothing is frozen."""
        with self.changed:
            if self.ceiling_s is None or not self.since:
                return None
            return min(self.since.values()) + self.ceiling_s

    def expire(self) -> list[FreezeTarget]:
        """Thaw every target frozen for ``ceiling_s`` or longer; returns those thawed."""
        with self.changed:
            if self.ceiling_s is None:
                return []
            now = self.clock()
            due = {t for t, since in self.since.items() if now - since >= self.ceiling_s - 1e-9}
            if not due:
                return []
            longest = now - min(self.since[t] for t in due)
            stuck = self._thaw(due)
            for target in stuck:  # try again shortly, not in a busy loop
                self.since[target] = now - self.ceiling_s + self.retry_s
            done = sorted(due - stuck)
            if done:
                self.ceiling_thaws += len(done)
                log.warning(
                    "thawed %s after %.2f s frozen: the control loop is late (freeze ceiling %.2f s)",
                    ", ".join(t.path for t in done),
                    longest,
                    self.ceiling_s,
                )
            return done

    def _thaw(self, targets: set[FreezeTarget]) -> set[FreezeTarget]:
        stuck: set[FreezeTarget] = set()
        for target in sorted(targets):
            try:
                self.freezer.set_frozen(target, False)
            except TargetGone:
                pass  # the container ended: nothing left frozen
            except FreezeError as e:
                self.errors += 1
                stuck.add(target)
                log.error("thaw %s failed: %s (will retry)", target.path, e)
                continue
            self.frozen.discard(target)
            self.since.pop(target, None)
        return stuck

    def _thaw_quietly(self, target: FreezeTarget) -> None:
        with contextlib.suppress(FreezeError):
            self.freezer.set_frozen(target, False)


class ThawGuard:
    """A thread that cuts every freeze at the controller's ceiling, whatever the control loop is doing.

    It sleeps until the oldest freeze reaches the ceiling (woken early when a new freeze starts),
    then thaws what is due. It touches nothing but the controller: no NVML, no network, no agent lock.
    """

    def __init__(self, controller: FreezeController) -> None:
        if controller.ceiling_s is None:
            raise ValueError("a thaw guard needs a controller with a freeze ceiling")
        self.controller = controller
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="gpuslice-thaw-guard", daemon=True)

    def start(self) -> ThawGuard:
        self._thread.start()
        return self

    def close(self) -> None:
        with self.controller.changed:
            self._closed = True
            self.controller.changed.notify_all()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        c = self.controller
        while True:
            with c.changed:
                if self._closed:
                    return
                due = c.next_expiry()
                wait = None if due is None else due - c.clock()
                if wait is None or wait > 0:
                    c.changed.wait(wait)
                    continue
                try:
                    c.expire()
                except Exception:  # the guard must outlive any one failure (a full disk, say)
                    log.exception("thaw guard: expiring freezes failed; retrying")
                    c.changed.wait(c.retry_s)
