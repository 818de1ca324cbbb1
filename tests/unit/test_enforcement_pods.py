"""Pod -> slice: the pod index over allocation records, and the watch that keeps it current."""

from __future__ import annotations

import json
from typing import Any

import pytest

from enforcement.events import RecordingEventSink
from enforcement.pods import MIB, PodIndex, container_ids
from enforcement.refusals import REFUSED, Refusals
from packing.kube.informer import Informer
from packing.record import ANNOTATION, NOT_ASKED, OTHER_NODE, OTHER_POD, UNREADABLE, AllocationRecord
from tests.unit.test_cluster_informer import Stream

UID = "0e2d6f4e-8b1a-4d7c-9c3b-2f1e5a6b7c8d"
GPU0, GPU1 = "GPU-0000", "GPU-1111"


def pod(
    uid: str = UID,
    name: str = "trainer",
    record: AllocationRecord | None = None,
    annotation: str | None = None,
    phase: str = "Running",
    containers: dict[str, str] | None = None,
    asks: str | None = "v100-25",
) -> dict[str, Any]:
    """A pod on node-a asking for ``asks`` by annotation ("claim": by a DRA claim; None: for nothing)."""
    annotations = {}
    spec: dict[str, Any] = {"nodeName": "node-a"}
    if asks == "claim":
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": "gpu"}]
    elif asks is not None:
        annotations["gpuslice.io/product"] = asks
    if record is not None:
        annotations[ANNOTATION] = record.encode()
    if annotation is not None:
        annotations[ANNOTATION] = annotation
    statuses = [{"name": n, "containerID": cid} for n, cid in (containers or {}).items()]
    return {
        "metadata": {"uid": uid, "name": name, "namespace": "ml", "annotations": annotations, "resourceVersion": "7"},
        "spec": spec,
        "status": {"phase": phase, "containerStatuses": statuses},
    }


def record(
    node: str = "node-a", gpus: tuple[str, ...] = (GPU0,), milli: int = 250, mib: int = 8192, claim: str = UID
) -> AllocationRecord:
    return AllocationRecord(claim, node, gpus, "v100-25" if milli == 250 else None, milli, mib)


def test_a_managed_pod_holds_a_slice_on_its_gpu_only() -> None:
    index = PodIndex("node-a")
    index.replace([pod(record=record(), containers={"main": "containerd://" + "ab" * 32})])
    holder = index.holder(UID, GPU0)
    assert holder is not None
    assert (holder.name, holder.product, holder.cap_bytes, holder.weight) == ("ml/trainer", "v100-25", 8192 * MIB, 250)
    assert holder.paced and not holder.gang
    assert index.holder(UID, GPU1) is None
    managed = index.get(UID.replace("-", "_").upper())  # the systemd form of the UID finds it too
    assert managed is not None and managed.containers == {"ab" * 32: "main"}


def test_whole_cards_and_gangs_are_not_paced() -> None:
    index = PodIndex("node-a")
    index.replace([pod(record=record(gpus=(GPU0, GPU1), milli=1000, mib=32768))])
    gang = index.holder(UID, GPU1)
    assert gang is not None and gang.gang and not gang.paced
    index.replace([pod(record=record(milli=1000, mib=32768))])
    whole = index.holder(UID, GPU0)
    assert whole is not None and not whole.paced


@pytest.mark.parametrize(
    ("item", "reason"),
    [
        (pod(annotation="{not json"), "not JSON"),
        (pod(annotation=json.dumps({"v": 99})), "newer gpuslice"),
        (pod(record=record(node="node-b")), "names node 'node-b'"),
        (pod(record=record(claim="another-pod")), "names claim another-pod, not this pod"),
    ],
)
def test_a_bad_record_is_refused_with_a_reason(item: dict[str, Any], reason: str) -> None:
    index = PodIndex("node-a")
    index.replace([item])
    assert index.get(UID) is None and len(index) == 0
    assert reason in index.rejected()[UID]


@pytest.mark.parametrize(("asks", "product", "managed"), [
    ("v100-25", "v100-25", True),
    ("claim", "v100-25", True),  # a DRA claim names its product itself (the DRA path reads it)
    (None, "v100-25", False),  # its own uid, this node, and it asks for nothing: a record put on it by hand
    ("v100-25", "v100-100", False),  # asks for a quarter, records a whole card
])
def test_a_record_hands_a_card_only_to_a_pod_that_asks_for_its_product(asks: str | None, product: str,
                                                                      managed: bool) -> None:
    refusals = Refusals("node-a")
    index = PodIndex("node-a", refusals)
    milli, mib = {"v100-25": (250, 8192), "v100-100": (1000, 32768)}[product]
    index.replace([pod(record=AllocationRecord(UID, "node-a", (GPU0,), product, milli, mib), asks=asks)])
    assert (index.get(UID) is not None) == managed
    if not managed:
        assert f"asks for no {product}" in index.rejected()[UID] and refusals.totals()[NOT_ASKED] == 1
    by_resource = pod(record=AllocationRecord(UID, "node-a", (GPU0,), product, milli, mib), asks=None)
    by_resource["spec"]["containers"] = [{"name": "m", "resources": {"limits": {"gpuslice.io/v100-25": "1"}}}]
    index.replace([by_resource])
    assert (index.get(UID) is not None) == (product == "v100-25")


def test_a_refused_record_is_told_once_by_an_event_and_counted_by_reason() -> None:
    events = RecordingEventSink()
    refusals = Refusals("node-a", events)
    index = PodIndex("node-a", refusals)
    copy = pod(record=record(claim="a-running-slice-pod"))  # another pod's record, copied onto this one
    index.replace([copy])
    index.apply("MODIFIED", copy)  # the pod changes (its status): nothing new to say
    index.apply("MODIFIED", pod(record=record(claim="yet-another-pod")))  # edited: still not its own, said again
    assert [(e.reason, e.namespace, e.pod, e.pod_uid) for e in events.events] == [(REFUSED, "ml", "trainer", UID)] * 2
    assert "names claim a-running-slice-pod, not this pod" in events.events[0].message
    assert "node-a" in events.events[0].message
    assert refusals.totals() == {OTHER_POD: 2, OTHER_NODE: 0, UNREADABLE: 0, NOT_ASKED: 0}
    index.apply("DELETED", copy)
    index.apply("ADDED", pod(uid="22222222-0000-4000-8000-000000000000", annotation="{"))
    assert refusals.totals()[UNREADABLE] == 1 and len(events.events) == 3
    assert index.get(UID) is None and len(index) == 0


@pytest.mark.parametrize("item", [pod(), pod(record=record(), phase="Succeeded"), pod(record=record(), phase="Failed")])
def test_pods_without_a_live_record_are_not_managed(item: dict[str, Any]) -> None:
    index = PodIndex("node-a")
    index.replace([item])
    assert index.get(UID) is None and index.rejected() == {}


def test_watch_events_add_change_and_delete() -> None:
    index = PodIndex("node-a")
    index.apply("ADDED", pod(record=record()))
    assert index.holder(UID, GPU0) is not None
    index.apply("MODIFIED", pod(annotation="garbage"))
    assert index.get(UID) is None and UID in index.rejected()
    index.apply("MODIFIED", pod(record=record(mib=16384, milli=500)))
    holder = index.holder(UID, GPU0)
    assert holder is not None and holder.cap_bytes == 16384 * MIB
    index.apply("BOOKMARK", pod())
    assert index.get(UID) is not None
    index.apply("DELETED", pod(record=record()))
    assert index.get(UID) is None and index.rejected() == {}
    index.apply("ADDED", {"metadata": {}})
    assert len(index) == 0


def test_container_ids_drop_the_runtime_prefix() -> None:
    item = pod(containers={"a": "containerd://" + "AB" * 32, "b": "cri-o://" + "cd" * 32, "c": "docker://" + "ef" * 32})
    item["status"]["initContainerStatuses"] = [{"name": "init", "containerID": "containerd://" + "12" * 32}]
    assert container_ids(item) == {"ab" * 32: "a", "cd" * 32: "b", "ef" * 32: "c", "12" * 32: "init"}


class NodePods:
    """The API server as the agent's informer sees it: the pods of one node, listed and watched."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = {p["metadata"]["uid"]: p for p in pods}
        self.rev = 7
        self.queries: list[dict[str, Any]] = []
        self.pending: list[dict[str, Any]] = []  # watch events not yet streamed

    def change(self, kind: str, doc: dict[str, Any], *, lost: bool = False) -> None:
        self.rev += 1
        doc = {**doc, "metadata": {**doc["metadata"], "resourceVersion": str(self.rev)}}
        if kind == "DELETED":
            self.pods.pop(doc["metadata"]["uid"], None)
        else:
            self.pods[doc["metadata"]["uid"]] = doc
        if not lost:
            self.pending.append({"type": kind, "object": doc})

    def request(self, method: str, path: str, body: Any = None, *, query: Any = None, **_: Any) -> dict[str, Any]:
        assert (method, path) == ("GET", "/api/v1/pods")
        self.queries.append(dict(query or {}))
        return {"metadata": {"resourceVersion": str(self.rev)}, "items": list(self.pods.values())}

    def stream(self, path: str, query: dict[str, Any], read_timeout: float) -> Stream:
        self.queries.append(dict(query))
        events, self.pending = self.pending, []
        return Stream(events)


def test_the_pod_watch_is_the_shared_informer_on_this_node_with_its_drift() -> None:
    api = NodePods([pod(record=record())])
    index = PodIndex("node-a")
    watch = Informer("pods", api, "/api/v1/pods", index.apply,  # type: ignore[arg-type]
                     selectors={"fieldSelector": "spec.nodeName=node-a"})
    assert watch.relist() == 0 and index.get(UID) is not None
    other = "11111111-2222-3333-4444-555555555555"
    api.change("ADDED", pod(uid=other, name="second", record=record(gpus=(GPU1,), claim=other)))
    api.change("DELETED", pod(record=record()))
    watch.watch_once()
    assert index.get(UID) is None and index.holder(other, GPU1) is not None
    assert all(q["fieldSelector"] == "spec.nodeName=node-a" for q in api.queries)  # the node's pods only
    assert api.queries[-1]["watch"] is True and api.queries[-1]["resourceVersion"] == "7"  # from the list on
    assert watch.resource_version == str(api.rev)  # resumes after the last event seen
    # a deletion the watch never delivered: the next relist says so (a tombstone-less miss is drift)
    api.change("DELETED", pod(uid=other, name="second", record=record(claim=other)), lost=True)
    assert watch.relist(resume=False) == 1 and index.get(other) is None and len(index) == 0
