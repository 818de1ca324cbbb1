"""The queue gate: lift scheduling gates in queue order once the ledger can hold the pod.

Pods asking for a slice are created with our gate (the webhook adds it), so they wait
``SchedulingGated`` and never reach kube-scheduler while nothing fits. Each admission step runs
``ClaimQueue.admit`` over the ledger: every claim it lets in gets its slice *reserved* (until
now + TTL) and its gate removed with a JSON patch that first tests the gate is still where we
read it. kube-scheduler then sees the pod at once (a gate removal is a pod update), our filter
finds the reservation and returns that node, and bind commits it.

Steps run on every relevant event (a pod left, a node joined, a gated pod arrived; ``kick``)
and on a periodic tick, so freed capacity goes to the head of the line within a second, not
after kube-scheduler's 5-minute unschedulable flush. A pod admitted without a gate (created
before the webhook, or whose reservation lapsed after the gate was lifted) is nudged with an
annotation instead: any update of an unschedulable pod sends it back to kube-scheduler's
active queue. A lift that fails leaves the reservation to lapse; the claim goes back to its
place in line and the next step tries again.

A pod group is admitted whole in one step (``packing.group_book``): its members' lifts are in
that step's batch, sent together. A group the queue put back in line (a member's reservation
lapsed or its bind failed, a member deleted before the group was bound) gets a
``PodGroupRolledBack`` Event on every member, with why. Each step also checks the bound groups for
members not Running in time (``group_readiness``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from extender.cluster.group_readiness import GroupReadiness
from extender.cluster.metrics import ClusterMetrics
from extender.cluster.pending_writer import GROUP_ROLLED_BACK, PendingReporter
from extender.cluster.state import ClusterState
from extender.cluster.threads import join, start_daemon
from packing.gate import gate_index, lift_patch
from packing.kube.client import JSON_PATCH, MERGE_PATCH, Kube, KubeError
from packing.queue import Admission

log = logging.getLogger(__name__)

Obj = dict[str, Any]
ADMITTED_ANNOTATION = "gpuslice.io/admitted"
DEBOUNCE_S = 0.02  # a burst of events becomes one step
# lifts run in parallel: a step's lifts take (admitted / workers) x one PATCH's latency, and every lift
# waits for its turn before kube-scheduler can see the pod (4 workers capped a burst near 40 pods/s)
LIFT_WORKERS = 16
MAX_NUDGE_BACKOFF_S = 60.0


def nudge_patch(node: str, now: float) -> dict[str, Any]:
    """A merge patch that changes the pod (so kube-scheduler retries it now) and says why."""
    return {"metadata": {"annotations": {ADMITTED_ANNOTATION: f"{node}@{now:.3f}"}}}


class GateController:
    """Runs admission steps and lifts the gates of the admitted pods."""

    def __init__(
        self,
        state: ClusterState,
        kube: Kube,
        lookup: Callable[[str], Obj | None],
        metrics: ClusterMetrics,
        reporter: PendingReporter | None = None,
        tick_s: float = 1.0,
    ) -> None:
        self.state = state
        self.kube = kube
        self.lookup = lookup  # pod uid -> pod as last seen by the watch
        self.metrics = metrics
        self.reporter = reporter
        self.tick_s = tick_s
        self.readiness: GroupReadiness | None = None  # bound pod groups not Running in time (the leader's)
        self.lifted: dict[str, float] = {}  # pod uid -> wall time its gate was lifted (for measurements)
        self._nudged: dict[str, tuple[int, float]] = {}  # pod uid -> (nudges so far, wall time of the last)
        self._checked = float("-inf")  # monotonic time of the last readiness check of the bound groups
        self._explained = float("-inf")  # monotonic time of the last explanation handed to the reporter
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None
        self._pool = ThreadPoolExecutor(LIFT_WORKERS, thread_name_prefix="gate-lift")

    def kick(self) -> None:
        """Something changed that may let a claim in: step soon."""
        self._wake.set()

    def step(self) -> list[Admission]:
        """One admission step: requeue lost claims, admit, lift gates, explain the rest."""
        started = time.perf_counter()
        lost = self.state.recover_admitted()
        if lost:
            log.info("%d admitted pod(s) lost their reservation before binding; back in line", len(lost))
        now = self.state.clock()
        admissions = self.state.admit(now)
        self.metrics.admission_steps.inc()
        self.metrics.step_seconds.observe(time.perf_counter() - started)
        if admissions:  # a group's members are all in this batch: their gates go together
            list(self._pool.map(lambda a: self._lift(a, now), admissions))
        for back in self.state.rollbacks():
            log.info("pod group %s went back in line: %s", back.group, back.why)
            if self.reporter is not None:
                for uid in back.members:
                    self.reporter.group_event(uid, GROUP_ROLLED_BACK, (
                        f"pod group {back.group} went back to its place in line: {back.why}; the reservations of "
                        "its members not bound yet are released, and it starts again when all of them fit at once"))
        if self.readiness is not None and time.monotonic() - self._checked >= self.tick_s:
            self._checked = time.monotonic()  # O(groups) under the state lock: at most once a tick, as explaining
            try:
                self.readiness.check()
            except Exception:  # telling or evicting a late group must not stop admissions
                log.exception("checking bound pod groups for readiness failed")
        if self.reporter is not None and time.monotonic() - self._explained >= self.tick_s:
            # explaining is O(waiting) under the state lock (80 ms at 10 000 waiting): at most once a tick
            self._explained = time.monotonic()
            self.reporter.submit(self.state.explain(self.state.clock()))
        return admissions

    def _pod(self, uid: str) -> Obj | None:
        pod = self.lookup(uid)
        if pod is not None:
            return pod
        ask = self.state.pod(uid)
        if ask is None:
            return None
        live = self.kube.get_pod(ask.namespace, ask.name)
        if live is None or (live.get("metadata") or {}).get("uid") != uid:
            return None
        return live

    def _lift(self, admission: Admission, now: float) -> None:
        uid, node = admission.claim, admission.allocation.node
        try:
            pod = self._pod(uid)
            for _ in range(3):
                if pod is None:
                    self.state.observe_gone(uid)  # deleted meanwhile: its reservation frees now
                    return
                meta = pod.get("metadata") or {}
                namespace, name = meta.get("namespace") or "default", meta.get("name") or ""
                index = gate_index(pod)
                try:
                    if index is None:
                        if not self._may_nudge(uid):
                            return  # it keeps its reservation; kube-scheduler retries it on its own schedule
                        self.kube.patch_pod(namespace, name, nudge_patch(node, now), MERGE_PATCH, metadata_only=True)
                        self.metrics.gate_lifts.labels("nudged").inc()
                    else:
                        self.kube.patch_pod(namespace, name, lift_patch(uid, index), JSON_PATCH, metadata_only=True)
                        self.metrics.gate_lifts.labels("lifted").inc()
                    self._remember_lift(uid)
                    if self.reporter is not None:
                        self.reporter.admitted(uid, node)
                    return
                except KubeError as e:
                    if e.status == 404:
                        pod = None
                        continue
                    if e.status not in (409, 422):
                        raise
                    live = self.kube.get_pod(namespace, name)  # the gates moved: read them again
                    pod = live if live is not None and (live.get("metadata") or {}).get("uid") == uid else None
            raise KubeError(409, "the pod kept changing")
        except KubeError as e:
            self.metrics.gate_failures.inc()
            log.warning("lifting the gate of pod %s failed: %s; its reservation lapses and it is retried",
                        uid, e)

    def _may_nudge(self, uid: str) -> bool:
        """Nudges of one pod back off exponentially (1, 2, 4 ... 60 s): an admitted pod that kube-scheduler
        keeps rejecting (for what the queue does not evaluate: inter-pod affinity, topology spread, a
        label the watch has not shown yet) must not turn into an update loop against the API server."""
        now = time.time()
        with self._lock:
            count, last = self._nudged.get(uid, (0, 0.0))
            if count and now - last < min(MAX_NUDGE_BACKOFF_S, 2.0 ** (count - 1)):
                return False
            self._nudged[uid] = (count + 1, now)
            return True

    def _remember_lift(self, uid: str) -> None:
        with self._lock:
            self.lifted[uid] = time.time()
            if len(self.lifted) > 100_000:  # bounded: old entries only serve measurements
                cutoff = time.time() - 600
                self.lifted = {u: t for u, t in self.lifted.items() if t > cutoff}
                self._nudged = {u: n for u, n in self._nudged.items() if n[1] > cutoff}

    def run(self) -> None:
        while not self._stopped.is_set():
            self._wake.wait(self.tick_s)
            if self._stopped.is_set():
                break
            self._stopped.wait(DEBOUNCE_S)
            self._wake.clear()
            try:
                self.step()
            except Exception:  # a failed step must not end the controller
                log.exception("admission step failed")

    def start(self) -> threading.Thread:
        self._thread = start_daemon(self.run, "queue-gate")
        return self._thread

    def stop(self, timeout: float = 5.0) -> None:
        self._stopped.set()
        self._wake.set()
        join(self._thread, timeout)
        self._pool.shutdown(wait=False, cancel_futures=True)
