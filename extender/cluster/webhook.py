"""The mutating admission webhook: gate every pod that asks for a slice, at creation.

kube-apiserver POSTs an ``admission.k8s.io/v1`` AdmissionReview; we answer with a JSONPatch that
adds our scheduling gate (so the pod waits ``SchedulingGated`` in our queue instead of hammering
kube-scheduler) and routes it to the gpuslice scheduler profile (kube-scheduler's
``managedResources`` check ignores annotations and DRA claims, so only a dedicated profile whose
extender takes every pod reaches all three ways of asking). Gates can only be added at creation,
which is why this is a webhook and not the controller. A pod whose slice ask gpuslice refuses is
denied here with the reason, rather than gated forever.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable, Mapping
from typing import Any

import orjson

from packing.gate import add_patch

log = logging.getLogger(__name__)

DEFAULT_SCHEDULER = "default-scheduler"

Pod = Mapping[str, Any]


class ReviewError(ValueError):
    """The body is not an AdmissionReview we can answer."""


def pod_patch(pod: Pod, scheduler_name: str | None, gate: bool = True) -> list[dict[str, Any]]:
    """The JSONPatch operations that gate ``pod`` (and route it to our scheduler profile).

    Only a pod meant for the default scheduler is routed: one that names another scheduler
    keeps it (its owner chose), and is still gated.
    """
    spec = pod.get("spec") or {}
    ops: list[dict[str, Any]] = add_patch(pod) if gate else []
    if scheduler_name and spec.get("schedulerName") in (None, "", DEFAULT_SCHEDULER):
        ops.append({"op": "add", "path": "/spec/schedulerName", "value": scheduler_name})
    return ops


def review(
    body: Any, asks_for_slice: Callable[[Pod], bool], scheduler_name: str | None = None, gate: bool = True
) -> dict[str, Any]:
    """Answer one AdmissionReview (ReviewError when ``body`` is not one).

    ``asks_for_slice`` raises ValueError for an ask gpuslice refuses: the pod is denied with that
    message (HTTP 422 in the review). Anything but a Pod CREATE is allowed unchanged.
    """
    if not isinstance(body, Mapping) or not isinstance(body.get("request"), Mapping):
        raise ReviewError("expected an admission.k8s.io/v1 AdmissionReview with a request")
    req = body["request"]
    uid = req.get("uid")
    if not isinstance(uid, str) or not uid:
        raise ReviewError("AdmissionReview request has no uid")
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    pod = req.get("object")
    kind = (req.get("kind") or {}).get("kind") if isinstance(req.get("kind"), Mapping) else None
    if req.get("operation") == "CREATE" and kind == "Pod" and isinstance(pod, Mapping) and not req.get("subResource"):
        try:
            wants = asks_for_slice(pod)
        except ValueError as e:
            response["allowed"] = False
            response["status"] = {"code": 422, "reason": "Invalid", "message": f"gpuslice: {e}"}
            wants = False
        if wants:
            ops = pod_patch(pod, scheduler_name, gate)
            if ops:
                response["patchType"] = "JSONPatch"
                response["patch"] = base64.b64encode(orjson.dumps(ops)).decode()
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


def handle(body: bytes, asks_for_slice: Callable[[Pod], bool], scheduler_name: str | None,
           gate: bool = True) -> tuple[int, bytes]:
    """HTTP body in, (status, body) out: 400 for anything that is not an AdmissionReview."""
    try:
        doc = orjson.loads(body) if body else None
        answer = review(doc, asks_for_slice, scheduler_name, gate)
    except ValueError as e:  # ReviewError, or not JSON (orjson's JSONDecodeError: not UTF-8, too deep, ...)
        return 400, orjson.dumps({"error": f"not an AdmissionReview: {e}"})
    return 200, orjson.dumps(answer)
