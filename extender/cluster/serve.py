"""Cluster mode: the extender app with the sync, the queue gate, the webhook and leader election.

``ClusterRuntime`` assembles the parts around one ``ClusterState``. Each leadership term starts
from an empty ledger, rebuilds it from the API (``/readyz`` stays 503 until then), and only then
runs the watches, the queue gate and the Pending reporter; losing the Lease ends the term at once
(not ready, parts stopped, ledger dropped). While not ready, filter and bind answer with an
``Error`` (kube-scheduler retries the pod with backoff) rather than decide on a partial ledger.
Every term's ledger has a new epoch (``/readyz``, ``/state``, ``gpuslice_ledger_epoch``).

gunicorn serves it from its one worker: ``extender.cluster.serve:app_from_env()`` with the
settings in ``GPUSLICE_*`` variables (``extender.config`` and ``extender.cluster.config``).
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from flask import Flask
from kubernetes import client

from extender.app import STOP_HOOK, Handlers, create_app
from extender.cluster.binder import ClusterBinder
from extender.cluster.config import ClusterConfig
from extender.cluster.dra import ClaimResolver
from extender.cluster.gate_controller import LIFT_WORKERS, GateController
from extender.cluster.group_readiness import GroupReadiness
from extender.cluster.leader import LeaderElector
from extender.cluster.leader_label import LeaderLabel
from extender.cluster.metrics import ClusterMetrics
from extender.cluster.pending_writer import PendingReporter
from extender.cluster.state import ClusterState
from extender.cluster.sync import ClusterSync
from extender.cluster.webhook import Pod
from extender.cluster.webhook_app import mount_webhook, slice_asker
from extender.config import ConfigError, ExtenderConfig
from extender.heap import settle_heap
from extender.history.store import ConfigMapStore
from extender.inventory import Enforcement
from extender.metrics import ExtenderMetrics, watch_gc
from extender.wire import BindingArgs, FilterResult, binding_result
from packing.kube.client import Kube, connect
from packing.products import Catalog, load_catalog
from packing.record import AllocationRecord

log = logging.getLogger("gpuslice.cluster")
JSON = "application/json"
NOT_READY = "gpuslice is not ready (rebuilding its ledger from the API, or a standby replica)"


# connections beyond the binds and the lifts: three watches, the reporter, leader election, the resync
OTHER_API_CONNECTIONS = 8


@dataclass
class _Term:
    """The parts of one leadership term."""

    sync: ClusterSync
    gate: GateController
    reporter: PendingReporter
    stopped: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None


class ClusterRuntime:
    """Everything cluster mode runs around one ``ClusterState``."""

    def __init__(
        self,
        config: ExtenderConfig,
        cluster: ClusterConfig,
        api: client.ApiClient | None = None,
        catalog: Catalog | None = None,
    ) -> None:
        if config.standalone or config.learn_nodes:
            raise ConfigError("cluster mode takes its inventory from the node watch only: no --standalone, "
                              "no --learn-nodes")
        self.config = config
        self.cluster = cluster
        self.catalog = catalog or load_catalog(config.catalog or None)
        connections = config.bind_threads + LIFT_WORKERS + OTHER_API_CONNECTIONS
        self.kube = Kube(api) if api is not None else connect(cluster.kubeconfig, connections)
        self.binder = ClusterBinder(self.kube, may_write=lambda: self.state.ready)
        self.resolver = ClaimResolver(self.catalog, self.kube.get_claim_template, self.kube.get_claim)
        self.state = ClusterState(self.catalog, self.binder, config.state_config(), resolver=self.resolver,
                                  group_ready_timeout_s=cluster.group_ready_timeout_s,
                                  group_bind_wait_s=cluster.group_bind_wait_s)
        self.state.core.on_bound = self._allocated
        self.state.core.history = config.demand_book(self.catalog)
        self.history: ConfigMapStore | None = None  # the demand history's chunks in the API (the leader writes)
        if self.state.core.history is not None:
            self.history = ConfigMapStore(self.kube, cluster.namespace, self.state.core.history,
                                          prefix=f"{cluster.lease_name}-history")
        self.extender_metrics = ExtenderMetrics(self.state.core.gauges)
        self.metrics = ClusterMetrics(self.extender_metrics.registry)
        self.elector: LeaderElector | None = None
        if cluster.leader_elect:
            self.elector = LeaderElector(
                self.kube, cluster.namespace, cluster.lease_name, cluster.who, self._lead, self._step_down,
                cluster.lease_duration_s, cluster.renew_deadline_s, cluster.retry_period_s,
            )
        self._lock = threading.Lock()
        self._term: _Term | None = None
        self._settled = False
        self.label: LeaderLabel | None = None
        if cluster.leader_label:
            self.label = LeaderLabel(self.kube, cluster.namespace, cluster.who, cluster.leader_label)

    # ---- lifecycle -------------------------------------------------------------------------------

    def start(self) -> None:
        """Campaign for the Lease (or, without leader election, lead at once)."""
        if self.label is not None:
            self.label.release()  # a restarted container may find its previous process's label
        if self.elector is not None:
            self.elector.start()
        else:
            self._lead()

    def stop(self) -> None:
        if self.elector is not None:
            self.elector.stop()
        self._step_down()

    @property
    def term(self) -> _Term | None:
        return self._term

    def _allocated(self, args: BindingArgs, record: AllocationRecord, enforcement: Enforcement) -> None:
        """A bind went through: the term's reporter tells the pod where its slice is, and who enforces it."""
        term = self._term
        if term is not None:
            pod = {"metadata": {"name": args.pod_name, "namespace": args.pod_namespace, "uid": args.pod_uid}}
            term.reporter.allocated(pod, record.product or "", record.node, record.gpus, enforcement.value)

    def _lead(self) -> None:
        """Start a term: its rebuild runs in its own thread, so the Lease keeps being renewed."""
        with self._lock:
            if self._term is not None:
                return
            self.metrics.leader.set(1)
            self.state.reset()
            reporter = PendingReporter(self.kube, lambda uid: None, self.cluster.notice_interval_s,
                                       on_write=lambda kind: self.metrics.notices.labels(kind).inc(),
                                       allocated_events=self.cluster.allocated_events,
                                       notice_after_s=self.cluster.notice_after_s,
                                       member_timeout_s=self.cluster.group_member_timeout_s)
            sync = ClusterSync(self.state, self.kube, self.cluster, self.metrics, reporter=reporter,
                               recently_bound=self.binder.bound_since)
            gate = GateController(self.state, self.kube, sync.pod, self.metrics, reporter, self.cluster.tick_s)
            gate.readiness = GroupReadiness(self.state, self.kube, sync.pod, self.metrics, reporter,
                                            self.cluster.group_ready_timeout_s, self.cluster.group_evict_not_ready)
            sync.kick = gate.kick  # the sync wakes the gate; both read pods from the sync's cache
            reporter.lookup = sync.pod
            term = _Term(sync, gate, reporter)
            term.thread = threading.Thread(target=self._run_term, args=(term,), name="term", daemon=True)
            self._term = term
            term.thread.start()

    def _run_term(self, term: _Term) -> None:
        """Rebuild from the API (retrying while the API is away), then run the parts and turn ready."""
        began = time.time()
        while not term.stopped.is_set():
            try:
                if self.history is not None:
                    self.history.load(began)  # before the rebuild: the claims it adopts are known ones
                term.sync.rebuild()
                break
            except Exception as e:  # the API away, or a bad object: not ready, and try again
                log.warning("rebuild from the API failed (%s); retrying in 1 s", e)
                term.stopped.wait(1.0)
        if self.history is not None and not term.stopped.is_set():
            lost = self.history.settle(self.state.holding_or_waiting())
            if lost:
                log.info("demand history: %d claim(s) ended while no leader recorded", lost)
        if not self._settled:
            settle_heap()  # the rebuilt ledger is long-lived: keep full GC passes off the request path
            self._settled = True
        with self._lock:
            if term.stopped.is_set() or self._term is not term:
                return
            term.sync.start()
            term.reporter.start()
            term.gate.start()
            if self.history is not None:
                self.history.start()
            self.state.ready = True
            term.gate.kick()
        log.info("gpuslice is ready: %d nodes, %d bound claims", len(self.state.ledger.nodes),
                 len(self.state.committed()))
        while self.label is not None and not self.label.claim(term.stopped):
            term.stopped.wait(1.0)  # unlabelled, the Service reaches no one: keep trying while we lead

    def _step_down(self) -> None:
        """End the term: not ready at once, parts stopped, ledger dropped."""
        with self._lock:
            term, self._term = self._term, None
            self.state.ready = False
            self.metrics.leader.set(0)
            if term is None:
                return
            term.stopped.set()
        if self.label is not None:
            self.label.release()
        term.gate.stop()
        term.reporter.stop()
        term.sync.stop()
        if self.history is not None:
            self.history.stop()  # the last rows written: the next leader continues from them
        self.state.reset()

    # ---- webhook ---------------------------------------------------------------------------------

    def asks_for_slice(self, pod: Pod) -> bool:
        """For the webhook served here (no ``--webhook-port``): does this pod ask for a slice? ValueError
        (deny, with the reason) when its ask is refused, its DRA claim cannot be read now, or its pod group
        cannot take it (``webhook_app.slice_asker``, as the webhook's own worker answers)."""
        scheduler = self.cluster.scheduler_name or None
        return slice_asker(self.state.core.asks, self.kube, scheduler, self.config.bind_threads)(pod)


def create_cluster_app(config: ExtenderConfig, cluster: ClusterConfig, runtime: ClusterRuntime | None = None,
                       start: bool = True) -> Flask:
    """The extender app in cluster mode; ``start`` campaigns for the Lease (or leads) right away."""
    runtime = runtime or ClusterRuntime(config, cluster)
    app = create_app(runtime.state.core, config, runtime.extender_metrics)
    app.extensions["gpuslice-cluster"] = runtime
    handlers: Handlers = app.extensions["gpuslice"]

    def unready(verb: str) -> tuple[int, Any] | None:
        if runtime.state.ready:
            return None
        if verb == "filter":
            return 200, FilterResult(error=NOT_READY).to_wire()
        if verb == "bind":
            return 200, binding_result(NOT_READY)
        return 503, {"error": NOT_READY}

    handlers.unready = unready

    if not config.webhook_port:  # else a worker process of its own serves it (extender.cluster.webhook_app)
        mount_webhook(app, config, cluster, runtime.asks_for_slice, runtime.extender_metrics)
    if start:
        runtime.start()
        atexit.register(runtime.stop)  # a clean worker exit gives the Lease up: the standby need not wait
    # SIGTERM: the worker runs this at once, not after its last connection closed (extender/worker.py)
    app.extensions[STOP_HOOK] = runtime.stop
    return app


def app_from_env() -> Flask:
    """gunicorn's entry point in cluster mode: ``extender.cluster.serve:app_from_env()``."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    watch_gc()
    return create_cluster_app(ExtenderConfig.from_env(), ClusterConfig.from_env())
