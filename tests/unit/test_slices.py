"""``gpuslice slices``: which pods an uninstall would strand, and the refusal that names them."""

from __future__ import annotations

from typing import Any

from extender.slices import refusal, uses
from packing.record import ANNOTATION, AllocationRecord

RECORD = AllocationRecord("c1", "gpu-1", ("GPU-1",), "v100-25", 250, 8192).encode()


def pod(name: str, *, phase: str = "Running", node: str = "gpu-1", record: bool = True, gated: bool = False,
        scheduler: str = "gpuslice-scheduler", claim: bool = False, resource: bool = False,
        deleting: bool = False) -> dict[str, Any]:
    meta: dict[str, Any] = {"namespace": "team-a", "name": name, "annotations": {}}
    if record:
        meta["annotations"][ANNOTATION] = RECORD
    if deleting:
        meta["deletionTimestamp"] = "2026-12-04T00:00:00Z"
    limits = {"gpuslice.io/v100-50": "1"} if resource else {}
    spec: dict[str, Any] = {"schedulerName": scheduler, "containers": [{"name": "c", "resources": {"limits": limits}}]}
    if node:
        spec["nodeName"] = node
    if gated:
        spec["schedulingGates"] = [{"name": "gpuslice.io/queue"}]
    if claim:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "v100-50"}]
    return {"metadata": meta, "spec": spec, "status": {"phase": phase}}


def test_holding_waiting_and_terminating_pods_are_uses_finished_and_unrelated_ones_are_not() -> None:
    pods = [
        pod("dra", claim=True),
        pod("by-resource", resource=True),
        pod("dying", claim=True, deleting=True),
        pod("gated", node="", record=False, gated=True, claim=True),
        pod("routed", node="", record=False),
        pod("done", phase="Succeeded", claim=True),
        pod("failed", phase="Failed"),
        pod("plain", record=False, scheduler="default-scheduler"),
        pod("bound-without-slice", record=False),  # the gpuslice scheduler binds every pod it gets
    ]
    found = {u.name: (u.state, u.how, u.product) for u in uses(pods)}
    assert found == {
        "by-resource": ("holds a slice", "extended resource", "v100-25"),
        "dra": ("holds a slice", "DRA claim", "v100-25"),
        "dying": ("terminating", "DRA claim", "v100-25"),
        "gated": ("waits (gated)", "DRA claim", "claim v100-50"),
        "routed": ("waits (routed, unbound)", "annotation", "-"),
    }


def test_the_refusal_names_every_pod_and_says_what_to_do() -> None:
    text = refusal(uses([pod("a", claim=True), pod("b", node="", record=False, gated=True)]))
    assert "2 pod(s) still use gpuslice: team-a/a (holds a slice, DRA claim), team-a/b (waits (gated)" in text
    assert "helm uninstall --no-hooks" in text and "gpuslice slices -A" in text
