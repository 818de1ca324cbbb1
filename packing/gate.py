"""The queue gate: the scheduling gate a pod waits behind while it is in gpuslice's line.

The webhook adds it when a pod that asks for a slice is created (gates can only be added then);
the queue lifts it once the ledger holds the pod's slice, and ``gpuslice gates --lift`` does at an
uninstall. Every reader and writer takes the name, the detection and both patches from here, so
the gate is one contract. A lift is a JSON patch that tests, before it removes anything, that the
object is still the pod read (its uid: a pod deleted and re-created under the same name is never
lifted by a stale decision) and that our gate is still at the index read (a gate added or removed
meanwhile fails the patch, and the caller reads the pod again).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

GATE = "gpuslice.io/queue"

Patch = list[dict[str, Any]]


def _gates(pod: Mapping[str, Any]) -> list[Any]:
    spec = pod.get("spec")
    gates = spec.get("schedulingGates") if isinstance(spec, Mapping) else None
    return gates if isinstance(gates, list) else []


def gate_index(pod: Mapping[str, Any]) -> int | None:
    """Position of our gate in ``spec.schedulingGates``; None when the pod does not carry it."""
    for i, g in enumerate(_gates(pod)):
        if isinstance(g, Mapping) and g.get("name") == GATE:
            return i
    return None


def gated(pod: Mapping[str, Any]) -> bool:
    """Does the pod still wait behind our gate?"""
    return gate_index(pod) is not None


def add_patch(pod: Mapping[str, Any]) -> Patch:
    """JSON patch operations that add our gate to ``pod`` (none when it carries it already)."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping) or not spec.get("schedulingGates"):
        return [{"op": "add", "path": "/spec/schedulingGates", "value": [{"name": GATE}]}]
    if gated(pod):
        return []
    return [{"op": "add", "path": "/spec/schedulingGates/-", "value": {"name": GATE}}]


def lift_patch(uid: str, index: int) -> Patch:
    """JSON patch removing our gate at ``index``, only if it is still the pod ``uid`` and still our gate there."""
    return [
        {"op": "test", "path": "/metadata/uid", "value": uid},
        {"op": "test", "path": f"/spec/schedulingGates/{index}/name", "value": GATE},
        {"op": "remove", "path": f"/spec/schedulingGates/{index}"},
    ]
