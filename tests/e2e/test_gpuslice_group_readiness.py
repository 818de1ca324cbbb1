"""A bound pod group not all Running within the ready timeout: the real kube-apiserver and
kube-scheduler, our extender under gunicorn, with and without ``GPUSLICE_GROUP_EVICT_NOT_READY``.

There is no kubelet here: the test plays it, writing the members' phase through pods/status (one
Running, the other Pending with its container waiting in ImagePullBackOff). Every member gets a
``PodGroupNotReady`` Warning naming the one not Running and why. With eviction on, the extender
evicts both members through the Eviction API (the extender's RBAC from the chart) and their slices
free; off, the Event is all and the group keeps its cards. Timings go to ``$GPUSLICE_E2E_TIMINGS``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from packing.kube.client import MERGE_PATCH, Kube

from . import gpuslice_harness as h
from .cluster import ControlPlane
from .test_gpuslice_cluster import note
from .test_gpuslice_groups import member

pytestmark = pytest.mark.e2e

READY_S = 8  # the group ready timeout: bound but not all Running by then, the group is late
BIND_WAIT_S = 3


@pytest.fixture(scope="module", params=["evict", "tell-only"])
def gs(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory,
       request: pytest.FixtureRequest) -> Iterator[h.Gpuslice]:
    settings = {"group_ready_timeout_s": str(READY_S), "group_bind_wait_s": str(BIND_WAIT_S)}
    if request.param == "evict":
        settings["group_evict_not_ready"] = "true"  # off is the chart's default: the rendered env says so
    g = h.install(control_plane, tmp_path_factory.mktemp(f"gpuslice-ready-{request.param}"), **settings)
    g.evicts = request.param == "evict"  # type: ignore[attr-defined]
    try:
        yield g
    finally:
        g.stop()


NAMESPACE_PREFIX = "ready"  # conftest.py's ``ns`` fixture names this module's namespaces by it


def play_kubelet(kube: Kube, ns: str, name: str, status: dict[str, Any]) -> None:
    """What a kubelet would report for the pod (there is none here)."""
    kube.patch_pod_status(ns, name, {"status": status}, MERGE_PATCH)


def held(gs: h.Gpuslice, ns: str, names: list[str]) -> set[str]:
    """Which of the pods hold a slice in the extender's ledger."""
    state = gs.extender.state()
    return {n for n in names for a in state["allocations"] if a["pod"] == f"{ns}/{n}"}


def test_a_bound_group_not_running_in_time_is_told_and_evicted_when_asked(
        gs: h.Gpuslice, kube: Kube, nodes: list[str], ns: str) -> None:
    evicts: bool = gs.evicts  # type: ignore[attr-defined]
    h.add_nodes(gs, nodes, 1, 2, "ready")
    names = ["late-0", "late-1"]
    for name in names:
        doc = member(name, "late", 2)
        if name == "late-0":  # it ends as a kubelet would end it: Terminating first, gone once the test says so
            doc["spec"]["terminationGracePeriodSeconds"] = 30
        h.create_pod(kube, ns, doc)
    for name in names:
        h.wait_bound(kube, ns, name, timeout=30)
    bound_at = time.monotonic()
    assert held(gs, ns, names) == set(names)
    play_kubelet(kube, ns, "late-0", {"phase": "Running"})
    play_kubelet(kube, ns, "late-1", {"phase": "Pending", "containerStatuses": [{
        "name": "main", "image": h.IMAGE, "imageID": "", "ready": False, "restartCount": 0,
        "state": {"waiting": {"reason": "ImagePullBackOff", "message": 'Back-off pulling image "nowhere/x"'}}}]})

    def told() -> list[dict[str, Any]] | None:
        events = [e for n in names for e in h.events_of(kube, ns, n) if e["reason"] == "PodGroupNotReady"]
        return events if {e["involvedObject"]["name"] for e in events} == set(names) else None

    events = h.poll(told, READY_S + 30, "a PodGroupNotReady Event on both members")
    note(f"group_not_ready_told_after_bound_s_{'evict' if evicts else 'tell'}", round(time.monotonic() - bound_at, 1))
    message = events[0]["message"]
    assert events[0]["type"] == "Warning"
    assert "1 of 2 members not Running" in message
    assert "late-1 (Pending: container main waiting ImagePullBackOff" in message
    assert "late-0" not in message.split("admitted:")[1]  # the Running member is not named late

    if evicts:
        assert "evicted" in message and "a bare pod is gone" in message

        def terminating() -> dict[str, Any] | None:
            pods = {p["metadata"]["name"]: p for p in h.pods(kube, ns)}
            late0 = pods.get("late-0")
            return late0 if "late-1" not in pods and late0 and late0["metadata"].get("deletionTimestamp") else None

        late0 = h.poll(terminating, 20, "late-1 evicted (gone at once, grace 0), late-0 evicted (Terminating)")
        disrupted = [c for c in late0["status"].get("conditions") or [] if c["type"] == "DisruptionTarget"]
        assert disrupted and disrupted[0]["reason"] == "EvictionByEvictionAPI", late0["status"]
        h.poll(lambda: held(gs, ns, names) == {"late-0"}, 10, "late-1's slice freed; late-0 keeps its own")
        time.sleep(2)  # a few more checks: a Terminating member is not evicted again
        assert held(gs, ns, names) == {"late-0"}
        h.delete_now(kube, ns, "late-0")  # what the kubelet does once its containers stopped
        h.poll(lambda: not held(gs, ns, names), 10, "both members' slices freed in the ledger")
        metrics = gs.extender.metrics()
        assert 'gpuslice_pod_groups_not_ready_total{what="evicted"} 2.0' in metrics
        assert 'gpuslice_pod_groups_not_ready_total{what="told"} 1.0' in metrics
        # the cards are free: a new group of two starts on them
        for name in ("next-0", "next-1"):
            h.create_pod(kube, ns, member(name, "next", 2))
        for name in ("next-0", "next-1"):
            h.wait_bound(kube, ns, name, timeout=30)
    else:
        assert "nothing is evicted" in message
        time.sleep(3)  # a few more checks (one a tick): still no eviction, and one Event per member only
        pods = {p["metadata"]["name"]: p for p in h.pods(kube, ns)}
        assert set(pods) == set(names) and all(not p["metadata"].get("deletionTimestamp") for p in pods.values())
        assert held(gs, ns, names) == set(names)
        assert len(told() or []) == 2
        assert 'gpuslice_pod_groups_not_ready_total{what="evicted"}' not in gs.extender.metrics()
