"""Freezing and thawing container cgroups, and remembering on disk what we froze.

Three mechanisms, best first:

* cgroup v2: write ``1``/``0`` to ``cgroup.freeze`` (Linux >= 5.2); atomic for the whole container,
  children included, invisible to signal handlers; ``cgroup.events`` says when it is done.
* cgroup v1: write ``FROZEN``/``THAWED`` to the freezer controller's ``freezer.state``.
* signals: ``SIGSTOP``/``SIGCONT`` every process listed in the container's ``cgroup.procs`` (each
  through a pidfd opened before the membership is re-checked, so a recycled PID is not hit).

Files are opened write-only without ``O_CREAT``: a cgroup that has gone away is reported as gone,
never re-created. The :class:`FreezeJournal` holds every target we froze, written *before* the
freeze (atomically, by rename), so a crashed agent's successor thaws them all at start-up.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from enforcement.cgroups import ContainerRef, container_in_path

log = logging.getLogger(__name__)

Kind = Literal["v2", "v1", "signal"]
KINDS: tuple[Kind, ...] = ("v2", "v1", "signal")


class FreezeError(RuntimeError):
    """A freeze or thaw could not be applied (the target is still in its previous state)."""


class TargetGone(FreezeError):
    """The cgroup no longer exists: its container has ended, so there is nothing to thaw."""


@dataclass(frozen=True, slots=True, order=True)
class FreezeTarget:
    """A container cgroup and how to freeze it. ``path`` is relative to the cgroup mount root."""

    kind: Kind
    path: str

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "path": self.path}


def _rel(path: str) -> str:
    return path.strip("/")


def target_for(ref: ContainerRef, cgroup_root: Path) -> FreezeTarget | None:
    """The best way to freeze ``ref``'s container on this host, or None if its cgroup is gone.

    Prefers v2 (``<root>/<path>/cgroup.freeze``, also under ``<root>/unified`` on hybrid hosts),
    then the v1 freezer (``<root>/freezer/<path>/freezer.state``), then signals to the processes of
    whichever hierarchy lists them.
    """
    if ref.unified is not None:
        for base in ("", "unified"):
            rel = str(Path(base) / _rel(ref.unified)) if base else _rel(ref.unified)
            if (cgroup_root / rel / "cgroup.freeze").is_file():
                return FreezeTarget("v2", rel)
    freezer_path = ref.v1_path("freezer")
    if freezer_path is not None and (cgroup_root / "freezer" / _rel(freezer_path) / "freezer.state").is_file():
        return FreezeTarget("v1", f"freezer/{_rel(freezer_path)}")
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
            # Only ever touch what is recognisably a pod's container cgroup, whatever the file says.
            if kind in KINDS and isinstance(path, str) and ".." not in path.split("/") and container_in_path(path):
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
    """

    def __init__(self, freezer: CgroupFreezer, journal: FreezeJournal, compact_above: int = 64) -> None:
        self.freezer = freezer
        self.journal = journal
        self.compact_above = compact_above
        self.frozen: set[FreezeTarget] = set()
        self.journaled: set[FreezeTarget] = set()
        self.errors = 0

    def recover(self) -> list[FreezeTarget]:
        """Thaw everything a previous run left frozen (crash-restart); returns what was thawed."""
        leftover = set(self.journal.load())
        self.frozen |= leftover
        self.journaled |= leftover
        stuck = self.thaw_all()
        return sorted(leftover - stuck)

    def apply(self, want: set[FreezeTarget]) -> None:
        """Make exactly ``want`` frozen (of the targets we manage); failures are logged and counted."""
        to_freeze = want - self.frozen
        to_thaw = self.frozen - want
        if to_freeze - self.journaled:
            keep = self.journaled if len(self.journaled) < self.compact_above else self.frozen
            on_file = keep | self.frozen | to_freeze
            self.journal.save(on_file)
            self.journaled = on_file  # only once saved: a failed save leaves the next apply to retry it
        for target in sorted(to_freeze):
            try:
                self.freezer.set_frozen(target, True)
                self.frozen.add(target)
            except FreezeError as e:
                self.errors += 1
                log.warning("freeze %s failed: %s", target.path, e)
                self._thaw_quietly(target)  # a half-applied freeze is rolled back
        if to_thaw:
            self._thaw(to_thaw)

    def thaw_all(self) -> set[FreezeTarget]:
        """Thaw every target we froze; returns those that could not be thawed (kept on file)."""
        stuck = self._thaw(set(self.frozen))
        self.journal.save(stuck)
        self.journaled = set(stuck)
        return stuck

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
        return stuck

    def _thaw_quietly(self, target: FreezeTarget) -> None:
        with contextlib.suppress(FreezeError):
            self.freezer.set_frozen(target, False)
