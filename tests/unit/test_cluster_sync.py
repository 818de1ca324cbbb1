"""The cluster sync against a fake API: rebuild from records, frees, gated arrivals, resync drift repair."""

from __future__ import annotations

import copy
from typing import Any

from prometheus_client import CollectorRegistry

from extender.cluster.config import ClusterConfig
from extender.cluster.metrics import ClusterMetrics
from extender.cluster.state import ClusterState
from extender.cluster.sync import ClusterSync, record_of
from extender.samples import pod
from extender.state import StateConfig
from packing.gate import GATE
from packing.products import load_catalog
from packing.record import ANNOTATION, AllocationRecord

CATALOG = load_catalog()
V100 = "Tesla-V100-SXM2-32GB"


class NoBinder:
    def bind(self, args: Any, record: Any) -> None:
        raise AssertionError("not in these tests")

    def release(self, pod_uid: str) -> None:
        pass


class FakeApi:
    """Lists of nodes, pods and configmaps, and pod reads, with resource versions."""

    def __init__(self) -> None:
        self.rev = 100
        self.nodes: dict[str, dict[str, Any]] = {}
        self.pods: dict[str, dict[str, Any]] = {}
        self.configmaps: dict[str, dict[str, Any]] = {}

    def _rv(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.rev += 1
        obj["metadata"]["resourceVersion"] = str(self.rev)
        return obj

    def node(self, name: str, gpus: int) -> None:
        self.nodes[name] = self._rv({"metadata": {"name": name, "uid": f"node-{name}", "labels": {
            "nvidia.com/gpu.product": V100, "nvidia.com/gpu.count": str(gpus)}}})

    def pod(self, doc: dict[str, Any]) -> dict[str, Any]:
        doc = self._rv(copy.deepcopy(doc))
        self.pods[doc["metadata"]["name"]] = doc
        return doc

    def request(self, method: str, path: str, body: Any = None, **kw: Any) -> dict[str, Any]:
        assert method == "GET"
        source = {"/api/v1/nodes": self.nodes, "/api/v1/pods": self.pods}.get(path, self.configmaps)
        return {"metadata": {"resourceVersion": str(self.rev)}, "items": copy.deepcopy(list(source.values()))}

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self.pods.get(name))


def bound_pod(name: str, product: str, node: str, gpu: int | None, created: str = "2026-01-01T00:00:00Z",
              uid: str | None = None) -> dict[str, Any]:
    doc = pod(name, product, uid=uid)
    doc["spec"]["nodeName"] = node
    doc["metadata"]["creationTimestamp"] = created
    if gpu is not None:
        milli = {"v100-25": 250, "v100-50": 500, "v100-100": 1000}[product]
        rec = AllocationRecord(doc["metadata"]["uid"], node, (f"{node}/gpu-{gpu}",), product, milli,
                               milli * 32768 // 1000)
        doc["metadata"]["annotations"] = {ANNOTATION: rec.encode()}
    return doc


def gated_pod(name: str, product: str, created: str) -> dict[str, Any]:
    doc = pod(name, product)
    doc["spec"]["schedulingGates"] = [{"name": GATE}]
    doc["metadata"]["creationTimestamp"] = created
    return doc


def setup() -> tuple[FakeApi, ClusterState, ClusterSync, list[int]]:
    api = FakeApi()
    state = ClusterState(CATALOG, NoBinder(), StateConfig(policy="best-fit"), clock=lambda: 1.8e9)
    kicks: list[int] = []
    sync = ClusterSync(state, api, ClusterConfig(), ClusterMetrics(CollectorRegistry()),  # type: ignore[arg-type]
                       kick=lambda: kicks.append(1))
    return api, state, sync, kicks


def test_rebuild_takes_records_and_queues_gated_pods_in_creation_order() -> None:
    api, state, sync, _ = setup()
    api.node("n1", 2)
    a = api.pod(bound_pod("a", "v100-50", "n1", 1))
    b = api.pod(bound_pod("b", "v100-25", "n1", None))  # bound outside gpuslice: accounted by policy
    done = bound_pod("done", "v100-100", "n1", 0)
    done["status"]["phase"] = "Succeeded"
    api.pod(done)
    late = api.pod(gated_pod("late", "v100-100", "2026-01-01T00:00:09Z"))
    early = api.pod(gated_pod("early", "v100-100", "2026-01-01T00:00:01Z"))
    sync.rebuild()
    committed = state.committed()
    assert committed[a["metadata"]["uid"]] == ("n1", ("n1/gpu-1",))
    assert committed[b["metadata"]["uid"]] == ("n1", ("n1/gpu-1",))  # best fit: the partly used card
    assert done["metadata"]["uid"] not in committed
    line = [e.claim for e in state.explain(1.8e9)]
    assert line == [early["metadata"]["uid"], late["metadata"]["uid"]]
    state.ledger.verify()


def test_deleted_or_finished_pod_frees_at_once() -> None:
    api, state, sync, kicks = setup()
    api.node("n1", 1)
    a = api.pod(bound_pod("a", "v100-100", "n1", 0))
    sync.rebuild()
    finished = copy.deepcopy(a)
    finished["status"]["phase"] = "Failed"
    sync.pods.apply("MODIFIED", api._rv(finished))
    assert not state.committed() and kicks
    g = api.pod(gated_pod("g", "v100-100", "2026-01-01T00:00:01Z"))
    sync.pods.apply("ADDED", g)
    assert state.waiting_state(g["metadata"]["uid"]) == "waiting"
    sync.pods.apply("DELETED", g)
    assert state.waiting_state(g["metadata"]["uid"]) is None


def test_unreadable_or_foreign_record_is_not_trusted() -> None:
    doc = bound_pod("a", "v100-25", "n1", 0)
    assert record_of(doc) is not None
    doc["metadata"]["annotations"][ANNOTATION] = "{not json"
    assert record_of(doc) is None
    other = bound_pod("b", "v100-25", "n2", 0)  # a record written for another node
    other["spec"]["nodeName"] = "n1"
    assert record_of(other) is None


def test_resync_repairs_and_counts_drift() -> None:
    api, state, sync, _ = setup()
    api.node("n1", 2)
    a = api.pod(bound_pod("a", "v100-100", "n1", 0))
    b = api.pod(bound_pod("b", "v100-100", "n1", 1))
    sync.rebuild()
    assert sync.resync() == 0
    # drift behind the sync's back: a's slice lost from the ledger, b deleted without an event
    state.core.release(a["metadata"]["uid"])
    del api.pods["b"]
    assert sync.resync() == 2
    assert state.committed() == {a["metadata"]["uid"]: ("n1", ("n1/gpu-0",))}
    assert sync.resync() == 0
    assert b["metadata"]["uid"] not in state.committed()


def test_resync_does_not_free_a_slice_the_watch_has_not_caught_up_with() -> None:
    api, state, sync, _ = setup()
    api.node("n1", 1)
    sync.rebuild()
    doc = api.pod(bound_pod("a", "v100-100", "n1", 0))
    rec = record_of(doc)
    assert rec is not None
    ask = state.describe(doc)
    state.observe_bound(ask, rec, "n1")  # our bind, before the watch showed the pod
    assert sync.reconcile() == 0  # the live read shows it bound: kept, not drift
    assert state.committed()


def test_entitlements_configmap_applies_and_keeps_previous_on_error() -> None:
    api, state, sync, kicks = setup()
    cm = {"metadata": {"name": "gpuslice-entitlements", "namespace": "gpuslice-system", "uid": "cm"},
          "data": {"team": "v100-100=1"}}
    sync.entitlements.apply("ADDED", api._rv(cm))
    assert state.core.waiting.queue.entitlement("team") is not None and kicks
    bad = copy.deepcopy(cm)
    bad["data"] = {"team": "v100-100=lots"}
    sync.entitlements.apply("MODIFIED", api._rv(bad))
    entitlement = state.core.waiting.queue.entitlement("team")
    assert entitlement is not None and entitlement.max_slices == {"v100-100": 1}
    sync.entitlements.apply("DELETED", api._rv(copy.deepcopy(bad)))
    assert state.core.waiting.queue.entitlement("team") is None
