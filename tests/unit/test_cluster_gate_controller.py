"""The queue gate: which pods get their gate lifted (or a nudge), in what order, and what a failure does."""

from __future__ import annotations

import copy
from typing import Any

from prometheus_client import CollectorRegistry

from extender.cluster.gate_controller import GateController, nudge_patch
from extender.cluster.metrics import ClusterMetrics
from extender.cluster.state import ClusterState
from extender.inventory import synthetic_cards
from extender.samples import pod
from extender.state import StateConfig
from packing.gate import GATE, gate_index, lift_patch
from packing.kube.client import JSON_PATCH, KubeError
from packing.products import load_catalog

CATALOG = load_catalog()


class NoBinder:
    def bind(self, args: Any, record: Any) -> None:
        raise AssertionError("the gate never binds")

    def release(self, pod_uid: str) -> None:
        pass


class FakePods:
    """Pods by uid, patched the way the API server applies our two kinds of patch."""

    def __init__(self) -> None:
        self.pods: dict[str, dict[str, Any]] = {}
        self.patches: list[tuple[str, Any]] = []
        self.fail_once: dict[str, int] = {}

    def add(self, doc: dict[str, Any], gated: bool = True) -> dict[str, Any]:
        doc = copy.deepcopy(doc)
        if gated:
            doc["spec"]["schedulingGates"] = [{"name": "other.io/x"}, {"name": GATE}]
        self.pods[doc["metadata"]["uid"]] = doc
        return doc

    def _by_name(self, name: str) -> dict[str, Any] | None:
        return next((p for p in self.pods.values() if p["metadata"]["name"] == name), None)

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return copy.deepcopy(self._by_name(name))

    def patch_pod(self, namespace: str, name: str, body: Any, content_type: str,
                  metadata_only: bool = False) -> dict[str, Any]:
        code = self.fail_once.pop(name, 0)
        if code:
            raise KubeError(code, "injected")
        doc = self._by_name(name)
        if doc is None:
            raise KubeError(404, "not found")
        self.patches.append((name, body))
        if content_type == JSON_PATCH:
            tests = {op["path"]: op["value"] for op in body if op["op"] == "test"}
            index = int(next(op for op in body if op["op"] == "remove")["path"].rsplit("/", 1)[1])
            gates = doc["spec"]["schedulingGates"]
            if tests["/metadata/uid"] != doc["metadata"]["uid"] or index >= len(gates) or gates[index]["name"] != GATE:
                raise KubeError(422, "test failed")
            del doc["spec"]["schedulingGates"][index]
        else:
            doc["metadata"].setdefault("annotations", {}).update(body["metadata"]["annotations"])
        return doc


def setup(gpus: int = 1) -> tuple[ClusterState, FakePods, GateController]:
    state = ClusterState(CATALOG, NoBinder(), StateConfig(reservation_ttl_s=30), clock=lambda: 5000.0)
    state.sync_node("n1", synthetic_cards("n1", gpus, "Tesla-V100-SXM2-32GB", 32768))
    api = FakePods()
    gate = GateController(state, api, api.pods.get, ClusterMetrics(CollectorRegistry()))  # type: ignore[arg-type]
    return state, api, gate


def arrive(state: ClusterState, api: FakePods, name: str, product: str, created: float,
           gated: bool = True) -> dict[str, Any]:
    doc = api.add(pod(name, product), gated)
    state.gate_arrive(state.describe(doc), created, "gated")
    return doc


def test_helpers() -> None:
    doc = {"spec": {"schedulingGates": [{"name": "a"}, {"name": GATE}]}}
    assert gate_index(doc) == 1 and gate_index({"spec": {}}) is None
    assert lift_patch("u", 1)[-1] == {"op": "remove", "path": "/spec/schedulingGates/1"}
    assert nudge_patch("n1", 1.0)["metadata"]["annotations"]["gpuslice.io/admitted"] == "n1@1.000"


def test_lifts_gates_of_admitted_pods_only_in_queue_order() -> None:
    state, api, gate = setup(gpus=1)
    docs = [arrive(state, api, f"p{i}", "v100-50", 100.0 + i) for i in range(3)]
    admitted = gate.step()
    assert [a.claim for a in admitted] == [d["metadata"]["uid"] for d in docs[:2]]
    for d in docs[:2]:
        assert d["spec"]["schedulingGates"] == [{"name": "other.io/x"}]  # ours gone, the other kept
    assert gate_index(docs[2]) == 1
    assert gate.step() == []  # nothing more fits: no more writes
    assert len(api.patches) == 2


def test_ungated_pod_is_nudged_with_backoff() -> None:
    state, api, gate = setup()
    doc = arrive(state, api, "p", "v100-25", 100.0, gated=False)
    gate.step()
    assert doc["metadata"]["annotations"]["gpuslice.io/admitted"].startswith("n1@")
    uid = doc["metadata"]["uid"]
    state.observe_gone(uid)  # lost again: re-admitted at once, but not nudged again within its backoff
    state.gate_arrive(state.describe(doc), 100.0, "gated")
    gate.step()
    assert len(api.patches) == 1


def test_pod_gone_before_its_gate_is_lifted_frees_the_reservation() -> None:
    state, api, gate = setup()
    doc = arrive(state, api, "p", "v100-100", 100.0)
    del api.pods[doc["metadata"]["uid"]]
    gate.lookup = lambda uid: None
    gate.step()
    assert not state.ledger.allocations and state.core.waiting.queue.running() == 0


def test_moved_gate_is_read_again_and_lifted() -> None:
    state, api, gate = setup()
    doc = arrive(state, api, "p", "v100-100", 100.0)
    stale = copy.deepcopy(doc)
    doc["spec"]["schedulingGates"] = [{"name": GATE}]  # someone removed the other gate meanwhile
    gate.lookup = lambda uid: stale
    gate.step()
    assert doc["spec"]["schedulingGates"] == []


def test_failed_lift_keeps_the_reservation_to_lapse() -> None:
    state, api, gate = setup()
    doc = arrive(state, api, "p", "v100-100", 100.0)
    api.fail_once["p"] = 500
    gate.step()
    assert gate_index(doc) is not None
    assert state.ledger.allocations[doc["metadata"]["uid"]].reserved  # it lapses after the TTL, then retried
