"""Pod groups bound but not Running in time (Kueue's ``waitForPodsReady``): which ones, and why.

A group is *ready* when every member's pod is Running or Succeeded. Once all its members are
bound, a group that is still not ready ``timeout`` seconds after its admission is *late*: the
extender tells every member (a Warning Event naming the late members and what their status says)
and, if the user asked for it, evicts the group so its slices free. A group not all bound by then
is the reservation deadline's (``packing.group_line``), not this module's.

Pure: the caller hands in the groups (all members bound) with their pods' phases; nothing here
reads the API. Cost: O(members) per call.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

READY_PHASES = frozenset({"Running", "Succeeded"})
WHY_LIMIT = 160  # a container's waiting message can be a page (an image pull's): the Event keeps its start


@dataclass(frozen=True, slots=True)
class MemberStatus:
    """One bound member as its pod's status shows it."""

    name: str  # the pod's name
    phase: str  # status.phase ("" when the pod has none yet)
    why: str = ""  # what the status says keeps it from Running ("" when it says nothing)

    @property
    def ready(self) -> bool:
        return self.phase in READY_PHASES

    def text(self) -> str:
        """``name (phase: why)``, for the Event."""
        said = f"{self.phase or 'no phase'}: {self.why}" if self.why else (self.phase or "no phase")
        return f"{self.name} ({said})"


@dataclass(frozen=True, slots=True)
class BoundGroup:
    """A pod group whose members are all bound, and when it was admitted."""

    label: str  # namespace/name
    admitted_at: float
    members: tuple[MemberStatus, ...]


@dataclass(frozen=True, slots=True)
class LateGroup:
    """A bound group not ready ``waited`` seconds after its admission; ``late`` are its members not Running."""

    group: BoundGroup
    late: tuple[MemberStatus, ...]
    waited: float

    def message(self) -> str:
        late = ", ".join(m.text() for m in self.late)
        return (f"pod group {self.group.label}: {len(self.late)} of {len(self.group.members)} members not Running "
                f"{self.waited:.0f} s after the group was admitted: {late}")


def late_groups(groups: Iterable[BoundGroup], now: float, timeout: float) -> list[LateGroup]:
    """The groups with a member not Running (nor Succeeded) ``timeout`` seconds or more after their
    admission, in the order given. A group admitted less than ``timeout`` ago is never late."""
    out: list[LateGroup] = []
    for g in groups:
        waited = now - g.admitted_at
        if waited < timeout:
            continue
        late = tuple(m for m in g.members if not m.ready)
        if late:
            out.append(LateGroup(g, late, waited))
    return out


def member_status(pod: Mapping[str, Any]) -> MemberStatus:
    """A pod's phase and the first thing its status says against Running: a container waiting or
    ended (init containers first), else the pod's own reason, else a condition that is False."""
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    phase = str(status.get("phase") or "")
    return MemberStatus(str(meta.get("name") or ""), phase, "" if phase in READY_PHASES else _why(status))


def _why(status: Mapping[str, Any]) -> str:
    for key in ("initContainerStatuses", "containerStatuses"):
        for c in status.get(key) or ():
            state = c.get("state") or {}
            for kind in ("waiting", "terminated"):
                s = state.get(kind)
                if s and s.get("reason") and not (kind == "terminated" and key == "initContainerStatuses"
                                                  and s.get("exitCode") == 0):
                    return _said(f"container {c.get('name', '?')} {kind}", s)
    if status.get("reason"):
        return _said("pod", status)
    for cond in status.get("conditions") or ():
        if cond.get("status") == "False" and cond.get("reason"):
            return _said(f"condition {cond.get('type', '?')}", cond)
    return ""


def _said(what: str, s: Mapping[str, Any]) -> str:
    text = f"{what} {s.get('reason')}"
    message = str(s.get("message") or "").strip()
    if message:
        text += f": {message[:WHY_LIMIT]}" + ("..." if len(message) > WHY_LIMIT else "")
    return text
