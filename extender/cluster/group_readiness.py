"""Bound pod groups not all Running within the ready timeout (Kueue's ``waitForPodsReady``).

Each admission step the leader asks the state for the groups whose members are all bound, reads
their pods' phases from the pod watch, and lets ``packing.group_ready`` pick the late ones: not
every member Running (or Succeeded) ``timeout`` seconds after the group's admission. Every member
of a late group gets one ``PodGroupNotReady`` Warning naming the members not Running and what their
status says. With ``evict`` on, the members are evicted (the Eviction API: a PodDisruptionBudget
that forbids it makes us retry; the uid is a precondition), so their slices free when they end and a
controller (Job, JobSet) re-creates them into the queue; a bare pod is gone. Off (the default), the
group keeps its slices: the Event is all.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from extender.cluster.metrics import ClusterMetrics
from extender.cluster.pending_writer import PendingReporter
from extender.cluster.state import ClusterState
from packing.group_ready import BoundGroup, LateGroup, late_groups, member_status
from packing.kube.client import Kube, KubeError

log = logging.getLogger(__name__)

Obj = dict[str, Any]
GROUP_NOT_READY = "PodGroupNotReady"
EVICT_RETRY_S = 10.0  # a refused eviction (a PodDisruptionBudget, the API away) is tried again this often


class GroupReadiness:
    """Tells, and optionally evicts, bound pod groups whose members are not all Running in time."""

    def __init__(self, state: ClusterState, kube: Kube, lookup: Callable[[str], Obj | None],
                 metrics: ClusterMetrics, reporter: PendingReporter | None, timeout_s: float, evict: bool) -> None:
        self.state = state
        self.kube = kube
        self.lookup = lookup  # pod uid -> the pod as last seen by the watch
        self.metrics = metrics
        self.reporter = reporter
        self.timeout_s = timeout_s
        self.evict = evict
        self._told: set[tuple[str, float]] = set()  # (group, admitted at): told once per admission
        self._evicted: set[str] = set()  # members whose eviction the API server took
        self._refused: dict[str, float] = {}  # member uid -> monotonic time its eviction was last refused

    def check(self) -> list[LateGroup]:
        """One look at the bound groups: the late ones are told (once) and, with ``evict``, evicted."""
        now = self.state.clock()
        groups: list[BoundGroup] = []
        pods: dict[str, list[tuple[str, Obj]]] = {}  # group -> its members' (uid, pod)
        for label, admitted_at, uids in self.state.bound_groups(now):
            if now - admitted_at < self.timeout_s:
                continue
            seen = [(uid, self.lookup(uid)) for uid in uids]
            members = [(uid, pod) for uid, pod in seen if pod is not None]
            if len(members) != len(uids):
                continue  # a member the watch no longer shows is leaving: the group is not whole any more
            pods[label] = members
            groups.append(BoundGroup(label, admitted_at, tuple(member_status(pod) for _, pod in members)))
        late = late_groups(groups, now, self.timeout_s)
        for g in late:
            told = (g.group.label, g.group.admitted_at)
            if told not in self._told:
                self._told.add(told)
                self._tell(g, pods[g.group.label])
            if self.evict:
                self._evict(g.group.label, pods[g.group.label])
        self._told = {t for t in self._told if t[0] in pods}  # groups not late any more (or gone) are forgotten
        known = {uid for ms in pods.values() for uid, _ in ms}
        self._evicted &= known
        self._refused = {uid: at for uid, at in self._refused.items() if uid in known}
        return late

    def _tell(self, g: LateGroup, members: list[tuple[str, Obj]]) -> None:
        if self.evict:
            then = ("its members are evicted, so their slices free: a controller (Job, JobSet) re-creates them "
                    "into the queue, a bare pod is gone")
        else:
            then = ("nothing is evicted (GPUSLICE_GROUP_EVICT_NOT_READY, chart extender.podGroups.evictNotReady, "
                    "is off): its members keep their slices until they end or are deleted")
        text = f"{g.message()}; {then}"
        log.warning("%s", text)
        self.metrics.groups_not_ready.labels("told").inc()
        if self.reporter is not None:
            for uid, _ in members:
                self.reporter.group_event(uid, GROUP_NOT_READY, text)

    def _evict(self, label: str, members: list[tuple[str, Obj]]) -> None:
        for uid, pod in members:
            meta = pod.get("metadata") or {}
            if meta.get("deletionTimestamp") or uid in self._evicted:
                continue  # leaving already: its slice frees when it is gone
            last = self._refused.get(uid)
            if last is not None and time.monotonic() - last < EVICT_RETRY_S:
                continue
            namespace, name = str(meta.get("namespace") or "default"), str(meta.get("name") or "")
            try:
                self.kube.evict_pod(namespace, name, uid)
                self._evicted.add(uid)
                self._refused.pop(uid, None)
                self.metrics.groups_not_ready.labels("evicted").inc()
                log.info("pod group %s not ready: evicted member %s/%s", label, namespace, name)
            except KubeError as e:
                if e.status in (404, 409):
                    continue  # gone, or re-created under that name: nothing of this group to evict
                self._refused[uid] = time.monotonic()
                self.metrics.groups_not_ready.labels("eviction_failed").inc()
                log.warning("pod group %s not ready: evicting member %s/%s failed (%s); retried in %g s",
                            label, namespace, name, e, EVICT_RETRY_S)
