"""Cluster sync: nodes, pods and the entitlements ConfigMap, watched into the extender's state.

The API server is the only durable state. ``rebuild()`` lists nodes, entitlements and pods and
rebuilds the ledger from the allocation records on bound pods before the extender answers as
ready; the watches then keep it current:

* a node's GPU inventory (agent annotation or GFD labels) enters the ledger, with its labels,
  taints and cordon (where the queue may place a pod); a deleted node leaves it with its allocations;
* a bound pod enters the ledger on its record's GPUs (or, bound outside gpuslice, on the GPUs
  the policy picks there, with a warning);
* a pod that is deleted, or reaches Succeeded/Failed, frees its slice (or its place in line) at
  once, and wakes the queue gate;
* a gated pod joins the line at its creation time.

``resync()`` (every ``resync_s``) relists everything, then compares the ledger with the pods:
what the watch missed and what the ledger got wrong is repaired and counted as drift (metric
``gpuslice_resync_drift_total`` and a log line). A claim the cache no longer shows bound is
checked against the live API before it is freed, so a lagging watch never frees a slice in use.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from extender.cluster.config import ClusterConfig
from extender.cluster.entitlements import changes, parse_configmap
from extender.cluster.metrics import ClusterMetrics
from extender.cluster.pending_writer import PendingReporter
from extender.cluster.state import PLACED, ClusterState
from extender.cluster.threads import join, start_daemon
from extender.heap import settle_heap
from extender.inventory import inventory_of_node
from extender.inventory_sync import SyncOutcome
from packing.asks import ClaimUnavailable, MalformedPod
from packing.entitlements import Entitlement
from packing.gate import gated
from packing.inventory import InventoryError
from packing.kube.client import Kube, KubeError, parse_time, q
from packing.kube.informer import Informer
from packing.record import AllocationRecord, RecordRefused, record_of_pod

log = logging.getLogger(__name__)

Obj = dict[str, Any]
TERMINAL = ("Succeeded", "Failed")
QUEUED_REASON = "gated: waiting for its turn in the gpuslice queue"


def pod_uid(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("uid") or "")


def pod_node(pod: Mapping[str, Any]) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")


def pod_phase(pod: Mapping[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "")


def record_of(pod: Mapping[str, Any]) -> AllocationRecord | None:
    """The pod's allocation record if it carries the one written for it on its node; None otherwise."""
    try:
        return record_of_pod(pod, pod_node(pod))
    except RecordRefused as e:
        log.warning("pod %s: %s; accounting it by policy", _key(pod), e)
        return None


class ClusterSync:
    """Informers for nodes, pods and entitlements feeding one ``ClusterState``."""

    def __init__(
        self,
        state: ClusterState,
        kube: Kube,
        config: ClusterConfig,
        metrics: ClusterMetrics,
        kick: Callable[[], None] = lambda: None,
        reporter: PendingReporter | None = None,
        recently_bound: Callable[[str], float | None] = lambda uid: None,
    ) -> None:
        self.state = state
        self.kube = kube
        self.config = config
        self.metrics = metrics
        self.kick = kick
        self.reporter = reporter
        self.recently_bound = recently_bound  # pod uid -> when our binder bound it (the watch may lag)
        self.nodes = Informer("nodes", kube, "/api/v1/nodes", self._on_node)
        self.pods = Informer("pods", kube, "/api/v1/pods", self._on_pod)
        self.entitlements = Informer(
            "entitlements", kube, f"/api/v1/namespaces/{q(config.namespace)}/configmaps", self._on_configmap,
            selectors={"fieldSelector": f"metadata.name={config.entitlements_configmap}"},
        )
        self._by_uid: dict[str, Obj] = {}
        self._entitled: dict[str, Entitlement] = {}
        self._stopped = threading.Event()
        self._resync_thread: threading.Thread | None = None

    # ---- lifecycle -------------------------------------------------------------------------------

    def rebuild(self) -> float:
        """List nodes, entitlements and pods into the state (nodes first: pods need them); seconds taken."""
        started = time.perf_counter()
        self.nodes.relist()
        self.entitlements.relist()
        self.pods.relist()
        took = time.perf_counter() - started
        self.metrics.sync_seconds.set(took)
        log.info("rebuilt from the API in %.2f s: %d nodes, %d pods, %d bound claims", took,
                 len(self.nodes.cache), len(self.pods.cache), len(self.state.committed()))
        return took

    def start(self) -> None:
        """Watch from the rebuilt state on, and resync every ``resync_s``."""
        for informer in (self.nodes, self.entitlements, self.pods):
            informer.start()
        self._resync_thread = start_daemon(self._resync_loop, "resync")

    def stop(self) -> None:
        self._stopped.set()
        for informer in (self.pods, self.entitlements, self.nodes):
            informer.stop()
        join(self._resync_thread, 5.0)

    def pod(self, uid: str) -> Obj | None:
        """The pod as last seen by the watch (None when unknown or gone)."""
        with self.pods.lock:
            return self._by_uid.get(uid)

    # ---- handlers (run under their informer's lock) ----------------------------------------------

    def _on_node(self, kind: str, node: Obj) -> None:
        name = str((node.get("metadata") or {}).get("name") or "")
        if not name:
            return
        if kind == "DELETED":
            dropped = self.state.drop_node(name)
            if dropped:
                log.warning("node %s left the cluster with %d allocations on it", name, len(dropped))
            self.kick()
            return
        try:
            inventory = inventory_of_node(name, node, self.state.catalog)
        except InventoryError as e:
            log.warning("node %s: cannot read its GPU inventory: %s", name, e)
            self.state.bad_inventory(name, str(e))
            return
        outcome = self.state.sync_node(name, inventory.cards, inventory.enforcement, inventory.facts)
        if outcome == SyncOutcome.PENDING:
            log.warning("node %s: its GPU inventory changed under live slices; the cards they hold are withdrawn "
                        "(nothing new goes there) and change once the slices leave", name)
            self.kick()
        elif outcome == SyncOutcome.INVALID:
            log.warning("node %s: the ledger refused its GPU inventory; kept the previous one", name)
        elif outcome == SyncOutcome.RELABELED:
            log.info("node %s: labels, taints or cordon changed (unschedulable: %s, %d taints)", name,
                     inventory.facts.unschedulable, len(inventory.facts.taints))
            self.kick()
        elif outcome != SyncOutcome.SAME:
            log.info("node %s: inventory %s (%d GPUs, enforcement %s)", name, outcome, len(inventory.cards),
                     inventory.enforcement)
            self.kick()

    def _on_pod(self, kind: str, pod: Obj) -> None:
        uid = pod_uid(pod)
        if not uid:
            return
        if kind == "DELETED" or pod_phase(pod) in TERMINAL:
            self._by_uid.pop(uid, None)
            if self.state.observe_gone(uid):
                self.metrics.freed.labels("deleted" if kind == "DELETED" else pod_phase(pod).lower()).inc()
                self.kick()
            if self.reporter is not None:
                self.reporter.forget(uid)
            return
        self._by_uid[uid] = pod
        node = pod_node(pod)
        if not node and not gated(pod):
            return  # neither bound nor in line (the echo of a gate lift, a pod of another scheduler): nothing to do
        try:
            ask = self.state.describe(pod)
        except (MalformedPod, ClaimUnavailable, KubeError) as e:
            log.warning("pod %s: cannot read its slice ask: %s", _key(pod), e)
            return
        if not ask.managed:
            return
        if node:
            if ask.request is None:
                return  # bound with an ask we refuse: kube-scheduler did not get it from us
            record = record_of(pod)
            outcome = self.state.observe_bound(ask, record, node)
            self.metrics.observed.labels(outcome).inc()
            if outcome == PLACED and record is None:
                log.warning("pod %s is bound to %s without a gpuslice allocation record (bound outside "
                            "gpuslice); accounted on the GPUs the policy picks there", ask.key, node)
        elif gated(pod):
            if ask.request is not None:
                created = parse_time((pod.get("metadata") or {}).get("creationTimestamp")) or self.state.clock()
                if self.state.gate_arrive(ask, created, QUEUED_REASON):
                    self.kick()
            elif ask.refusal is not None and self.reporter is not None:
                self.reporter.refused(uid, f"gpuslice refuses this pod: {ask.refusal}")

    def _on_configmap(self, kind: str, cm: Obj) -> None:
        data = None if kind == "DELETED" else cm.get("data")
        good, bad = parse_configmap(data if isinstance(data, Mapping) else {}, self.state.catalog)
        for why in bad.values():
            log.error("%s/%s: %s (keeping the previous entitlement)", self.config.namespace,
                      self.config.entitlements_configmap, why)
            self.metrics.entitlement_errors.inc()
        apply, self._entitled = changes(self._entitled, good, bad)
        if apply:
            self.state.set_entitlements(apply)
            log.info("entitlements changed for %s", ", ".join(sorted(apply)))
            self.kick()

    # ---- resync ----------------------------------------------------------------------------------

    def _resync_loop(self) -> None:
        while not self._stopped.wait(self.config.resync_s):
            try:
                self.resync()
            except Exception:  # the API may be away: the next period tries again
                log.exception("resync failed")
            # the pods cached since the last period are long-lived: collect once here, then freeze them, so
            # the collector's full passes (which stop every thread) walk one period's objects, not the cluster
            settle_heap()

    def resync(self) -> int:
        """Relist everything and repair the ledger; the drift found (also counted and logged)."""
        drift = {
            "nodes": self.nodes.relist(resume=False),
            "entitlements": self.entitlements.relist(resume=False),
            "pods": self.pods.relist(resume=False),
        }
        drift["ledger"] = self.reconcile()
        total = sum(drift.values())
        for source, n in drift.items():
            if n:
                self.metrics.drift.labels(source).inc(n)
        self.metrics.resyncs.inc()
        if total:
            log.warning("resync repaired drift: %s", ", ".join(f"{k} {v}" for k, v in drift.items() if v))
        self.kick()
        return total

    def reconcile(self) -> int:
        """Compare the ledger's bound claims with the pods; repair and count each difference."""
        drift = 0
        with self.pods.lock:
            pods = dict(self._by_uid)
            committed = self.state.committed()
            for uid, (node, gpus) in committed.items():
                pod = pods.get(uid)
                if pod is not None and pod_node(pod) == node and _gpus(pod) in (None, gpus):
                    continue
                if self.state.binding(uid) or self._just_bound(uid):
                    continue  # our own bind: the watch has not shown it yet
                try:
                    live = self._live(uid)
                except KubeError as e:
                    log.warning("resync: cannot read the pod of claim %s: %s; kept", uid, e)
                    continue
                if live is not None and pod_node(live) == node and pod_phase(live) not in TERMINAL \
                        and _gpus(live) in (None, gpus):
                    continue  # the watch lags; the pod holds its slice
                drift += 1
                if live is None:
                    log.warning("resync: claim %s on %s has no live pod; freeing it", uid, node)
                    self.state.observe_gone(uid)
                else:
                    self._on_pod("MODIFIED", live)
            held = set(self.state.committed())
            for uid, pod in pods.items():
                if uid in held or not self.state.knows_node(pod_node(pod)) or pod_phase(pod) in TERMINAL:
                    continue
                try:
                    ask = self.state.describe(pod)
                except (MalformedPod, ClaimUnavailable, KubeError):
                    continue
                if ask.request is None:
                    continue
                drift += 1
                log.warning("resync: bound pod %s holds no slice in the ledger; taking it in", ask.key)
                self._on_pod("MODIFIED", pod)
        return drift

    def _just_bound(self, uid: str, window: float = 60.0) -> bool:
        at = self.recently_bound(uid)
        return at is not None and time.time() - at < window

    def _live(self, uid: str) -> Obj | None:
        """The pod of this claim as the API shows it now (None when it is gone or was re-created;
        KubeError when the API cannot tell)."""
        ask = self.state.pod(uid)
        if ask is None:
            return None
        pod = self.kube.get_pod(ask.namespace, ask.name)
        if pod is None or pod_uid(pod) != uid:
            return None
        return pod


def _gpus(pod: Mapping[str, Any]) -> tuple[str, ...] | None:
    record = record_of(pod) if (pod.get("metadata") or {}).get("annotations") else None
    return record.gpus if record is not None else None


def _key(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"
