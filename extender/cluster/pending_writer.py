"""The Pending explanation writer: a pod condition and an Event for every waiting pod, updated on change only.

The condition ``gpuslice.io/Queued`` (status True while the pod waits) carries the reason, the
queue position and what the pod waits for. A new reason rewrites it at once and emits an Event,
so ``kubectl describe pod`` tells the story; a changed position or message (capacity moved, the
line moved) rewrites only the condition, at most every ``min_interval`` seconds: a long queue must
not turn every admission into n status writes. A pod is told from ``notice_after_s`` of waiting
on: one the queue admits sooner is never told it waited (every notice is an API write a burst pays
for). When the queue admits the pod the condition turns False with reason ``Admitted`` (and one
Event). A pod group's member that has waited ``WaitingForMembers`` longer than ``member_timeout_s``
gets one Warning Event saying so (``PodGroupIncomplete``), and every member of a group the queue put
back in line gets one (``PodGroupRolledBack``, with why). When a pod is bound on a node where
nothing enforces its slice (known only by its labels),
an ``Allocated`` Warning names its GPUs and says so; with ``allocated_events: all`` every bound pod
gets one (``enforcement: agent`` as a Normal Event). The writes run in the reporter's own thread,
so a slow API server never delays a gate being lifted or a bind.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from extender.cluster.threads import join, start_daemon
from packing.explain import expected_text
from packing.kube.client import STRATEGIC_PATCH, Kube, KubeError
from packing.kube.events import EventWriter, PodEvent, timestamp
from packing.queue import WAITING_FOR_MEMBERS, Explanation

log = logging.getLogger(__name__)

CONDITION = "gpuslice.io/Queued"
COMPONENT = "gpuslice"
ADMITTED = "Admitted"
REFUSED = "Refused"
ALLOCATED = "Allocated"
GROUP_INCOMPLETE = "PodGroupIncomplete"
GROUP_ROLLED_BACK = "PodGroupRolledBack"
NOTICE_AFTER_S = 2.0  # waits shorter than this go untold: in a burst most pods wait a moment, not minutes
MEMBER_TIMEOUT_S = 600.0  # a pod group still missing members after this long says so in an Event

Obj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Notice:
    """What a pod should show now: condition status, reason, message, queue position (0: none)."""

    reason: str
    message: str
    position: int = 0
    status: str = "True"

    def text(self) -> str:
        """The condition/event message: position first, then what the pod waits for."""
        if self.position:
            return f"position {self.position} in the gpuslice queue: {self.message}"
        return self.message


def notice_of(e: Explanation) -> Notice:
    """The notice for one waiting claim's explanation: what it waits for, its place among its product's
    claims and, once enough claims of its product were admitted, what their waits say about its own."""
    expected = expected_text(e)
    tail = f"; {expected}" if expected else ""
    message = f"{e.message} ({e.product}: {_ordinal(e.product_position)} of its product in line{tail})"
    return Notice(e.reason, message, e.position)


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


@dataclass(frozen=True, slots=True)
class Due:
    condition: bool
    event: bool


@dataclass
class PendingNotifier:
    """Remembers what each pod was last told and decides what is due now (pure; no I/O)."""

    min_interval: float = 10.0
    _last: dict[str, tuple[Notice, float]] = field(default_factory=dict)

    def due(self, pod_uid: str, notice: Notice, now: float) -> Due:
        """A new reason or status: condition and event now. Same reason, other message or position:
        the condition, once ``min_interval`` has passed since the last write. Nothing otherwise."""
        last = self._last.get(pod_uid)
        if last is None:
            return Due(True, True)
        before, at = last
        if before.reason != notice.reason or before.status != notice.status:
            return Due(True, True)
        if before == notice:
            return Due(False, False)
        return Due(now - at >= self.min_interval, False)

    def written(self, pod_uid: str, notice: Notice, now: float) -> None:
        self._last[pod_uid] = (notice, now)

    def told(self, pod_uid: str) -> Notice | None:
        last = self._last.get(pod_uid)
        return last[0] if last else None

    def forget(self, pod_uid: str) -> None:
        self._last.pop(pod_uid, None)

    def __len__(self) -> int:
        return len(self._last)


def condition_patch(notice: Notice, now: float) -> Obj:
    """A strategic merge patch of the pod status setting our condition (merge key: type)."""
    return {"status": {"conditions": [{
        "type": CONDITION,
        "status": notice.status,
        "reason": notice.reason,
        "message": notice.text(),
        "lastTransitionTime": timestamp(now),
    }]}}


def pod_event(pod: Mapping[str, Any], notice: Notice, kind: str = "Normal") -> PodEvent:
    """The Event about ``pod`` telling ``notice``."""
    meta = pod.get("metadata") or {}
    return PodEvent(str(meta.get("namespace") or "default"), str(meta.get("name") or ""), str(meta.get("uid") or ""),
                    notice.reason, notice.text(), kind)


class PendingReporter:
    """Writes conditions and Events for waiting pods from the latest queue explanation, in a thread."""

    def __init__(
        self,
        kube: Kube,
        lookup: Callable[[str], Obj | None],
        min_interval: float = 10.0,
        clock: Callable[[], float] = time.time,
        on_write: Callable[[str], None] | None = None,
        allocated_events: str = "warnings",
        notice_after_s: float = NOTICE_AFTER_S,
        member_timeout_s: float = MEMBER_TIMEOUT_S,
    ) -> None:
        self.kube = kube
        self.events = EventWriter(kube, COMPONENT, clock=clock)
        self.member_timeout_s = member_timeout_s  # WaitingForMembers this long: one PodGroupIncomplete Event
        self.notice_after_s = notice_after_s  # a pod that has waited less is not told yet
        self.allocated_events = allocated_events  # "all": an Allocated Event for every bound pod
        self.lookup = lookup  # pod uid -> the pod as last seen (None when gone)
        self.notifier = PendingNotifier(min_interval)
        self.clock = clock
        self.on_write = on_write  # metrics hook: "condition" or "event"
        self._lock = threading.Lock()
        self._latest: dict[str, Notice] = {}
        self._extra: dict[str, Notice] = {}  # admitted / refused notices, written once
        self._events: list[tuple[Obj, Notice, str]] = []  # (pod identity, notice, event type): events only
        self._pod_events: list[tuple[str, Notice, str]] = []  # (pod uid, notice, event type): found when written
        self._incomplete: set[str] = set()  # members told their group is still incomplete (once each)
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    def submit(self, explanations: list[Explanation]) -> None:
        """The queue's latest explanation of every waiting claim (replaces the previous one)."""
        after = self.notice_after_s
        latest = {e.claim: notice_of(e) for e in explanations if e.waited >= after}
        overdue = [e for e in explanations if e.reason == WAITING_FOR_MEMBERS and e.waited >= self.member_timeout_s]
        with self._lock:
            self._latest = latest
            waiting = {e.claim for e in explanations}
            self._incomplete &= waiting  # a member that left the line may be told again when it comes back
            for e in overdue:
                if e.claim not in self._incomplete:
                    self._incomplete.add(e.claim)
                    text = (f"{e.message}; still incomplete after {self.member_timeout_s:g} s: is a member's "
                            "creation failing (its controller's events, a quota), or is the size too large?")
                    self._pod_events.append((e.claim, Notice(GROUP_INCOMPLETE, text, 0, "True"), "Warning"))
        self._wake.set()

    def group_event(self, uid: str, reason: str, message: str, kind: str = "Warning") -> None:
        """One Event on the pod ``uid`` about its pod group (written when the pod is found)."""
        with self._lock:
            self._pod_events.append((uid, Notice(reason, message, 0, "True"), kind))
        self._wake.set()

    def admitted(self, uid: str, node: str) -> None:
        """The queue admitted the pod: its condition turns False (only if we had told it to wait)."""
        if self.notifier.told(uid) is None:
            return
        with self._lock:
            self._latest.pop(uid, None)  # its last waiting notice is stale now
            self._extra[uid] = Notice(ADMITTED, f"a slice is reserved on node {node}; the scheduling gate is lifted",
                                      0, "False")
        self._wake.set()

    def refused(self, uid: str, message: str) -> None:
        """The pod asks for something gpuslice refuses: it stays gated, and says why."""
        with self._lock:
            self._extra[uid] = Notice(REFUSED, message, 0, "True")
        self._wake.set()

    def allocated(self, pod: Obj, product: str, node: str, gpus: tuple[str, ...], enforcement: str) -> None:
        """The pod was bound: one Event says where its slice is and who enforces it there (with
        ``allocated_events`` "warnings", only where nothing enforces it: the allocation record on the
        pod names its GPUs either way, and a Normal Event per pod is an API write a burst pays for)."""
        if enforcement == "agent" and self.allocated_events != "all":
            return
        where = f"{product or 'slice'} on node {node}, GPU {', '.join(gpus)}"
        if enforcement == "agent":
            text = f"{where}; enforcement: agent (the gpuslice node agent hands over the slice and caps it)"
            kind = "Normal"
        else:
            text = (f"{where}; enforcement: none (node {node} is known only by its GPU labels: no gpuslice node "
                    "agent enforces the slice's memory cap or compute share there)")
            kind = "Warning"
        with self._lock:
            self._events.append((pod, Notice(ALLOCATED, text, 0, "True"), kind))
        self._wake.set()

    def forget(self, uid: str) -> None:
        with self._lock:
            self._latest.pop(uid, None)
            self._extra.pop(uid, None)
            self.notifier.forget(uid)

    def flush(self) -> int:
        """Write every due condition and Event now; how many writes were made."""
        with self._lock:
            todo = {**self._latest, **self._extra}  # an admitted/refused notice wins over a stale waiting one
            self._extra = {}
            events, self._events = self._events, []
            about, self._pod_events = self._pod_events, []
        for uid, notice, kind in about:
            pod = self.lookup(uid)
            if pod is not None:
                events.append((pod, notice, kind))
        writes = 0
        for bound, notice, kind in events:
            who = bound.get("metadata") or {}
            try:
                self.events.write(pod_event(bound, notice, kind))
                writes += 1
                self._count("event")
            except KubeError as e:
                log.warning("telling pod %s/%s where its slice is failed: %s", who.get("namespace"),
                            who.get("name"), e)
        for uid, notice in todo.items():
            now = self.clock()
            with self._lock:
                due = self.notifier.due(uid, notice, now)
            if not (due.condition or due.event):
                continue
            pod = self.lookup(uid)
            if pod is None:
                continue
            meta = pod.get("metadata") or {}
            namespace, name = meta.get("namespace") or "default", meta.get("name") or ""
            try:
                if due.condition:
                    self.kube.patch_pod_status(namespace, name, condition_patch(notice, now), STRATEGIC_PATCH)
                    writes += 1
                    self._count("condition")
                if due.event:
                    kind = "Warning" if notice.reason == REFUSED else "Normal"
                    self.events.write(pod_event(pod, notice, kind), now)
                    writes += 1
                    self._count("event")
            except KubeError as e:
                if e.status == 404:
                    self.forget(uid)
                else:
                    log.warning("explaining pod %s/%s failed: %s", namespace, name, e)
                continue
            with self._lock:
                if uid in self._latest or notice.reason in (ADMITTED, REFUSED):
                    self.notifier.written(uid, notice, now)
        return writes

    def _count(self, kind: str) -> None:
        if self.on_write is not None:
            self.on_write(kind)

    def run(self) -> None:
        while not self._stopped.is_set():
            self._wake.wait(self.notifier.min_interval)
            self._wake.clear()
            if self._stopped.is_set():
                break
            try:
                self.flush()
            except Exception:  # the reporter must outlive one bad write
                log.exception("pending reporter failed")

    def start(self) -> threading.Thread:
        self._thread = start_daemon(self.run, "pending-reporter")
        return self._thread

    def stop(self, timeout: float = 5.0) -> None:
        self._stopped.set()
        self._wake.set()
        join(self._thread, timeout)
