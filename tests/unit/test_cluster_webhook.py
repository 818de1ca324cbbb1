"""The mutating webhook: an AdmissionReview in, a JSONPatch that gates and routes slice pods out."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.cluster.webhook import ReviewError, handle, pod_patch, review
from packing.gate import GATE

SCHED = "gpuslice-scheduler"


def apply_patch(doc: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """The JSON-patch subset the webhook emits (add to an object member, or append with '-')."""
    out = copy.deepcopy(doc)
    for op in ops:
        assert op["op"] == "add"
        *parents, last = op["path"].lstrip("/").split("/")
        target: Any = out
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target.setdefault(part, {})
        if last == "-":
            target.append(op["value"])
        else:
            target[last] = op["value"]
    return out


def admission(pod: dict[str, Any], operation: str = "CREATE", kind: str = "Pod") -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "req-1", "kind": {"group": "", "version": "v1", "kind": kind},
                        "operation": operation, "object": pod}}


def pod_with(gates: list[str] | None = None, scheduler: str | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [{"name": "c"}]}
    if gates is not None:
        spec["schedulingGates"] = [{"name": g} for g in gates]
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    return {"metadata": {"name": "p"}, "spec": spec}


def patched(answer: dict[str, Any], pod: dict[str, Any]) -> dict[str, Any]:
    response = answer["response"]
    if "patch" not in response:
        return pod
    assert response["patchType"] == "JSONPatch"
    return apply_patch(pod, json.loads(base64.b64decode(response["patch"])))


def test_slice_pod_is_gated_and_routed() -> None:
    pod = pod_with(scheduler="default-scheduler")
    answer = review(admission(pod), lambda p: True, SCHED)
    assert answer["response"]["allowed"] and answer["response"]["uid"] == "req-1"
    out = patched(answer, pod)
    assert out["spec"]["schedulingGates"] == [{"name": GATE}]
    assert out["spec"]["schedulerName"] == SCHED


def test_pod_without_slice_is_left_alone() -> None:
    answer = review(admission(pod_with()), lambda p: False, SCHED)
    assert answer["response"] == {"uid": "req-1", "allowed": True}


def test_refused_ask_is_denied_with_reason() -> None:
    def refuse(pod: Any) -> bool:
        raise ValueError("unknown product resource gpuslice.io/v100-33")

    response = review(admission(pod_with()), refuse, SCHED)["response"]
    assert response["allowed"] is False
    assert response["status"]["code"] == 422
    assert "v100-33" in response["status"]["message"] and "patch" not in response


def test_other_scheduler_is_kept_but_gated() -> None:
    pod = pod_with(scheduler="volcano")
    out = patched(review(admission(pod), lambda p: True, SCHED), pod)
    assert out["spec"]["schedulerName"] == "volcano"
    assert {"name": GATE} in out["spec"]["schedulingGates"]


def test_gate_off_only_routes() -> None:
    pod = pod_with()
    out = patched(review(admission(pod), lambda p: True, SCHED, gate=False), pod)
    assert "schedulingGates" not in out["spec"] and out["spec"]["schedulerName"] == SCHED


@pytest.mark.parametrize("operation,kind", [("UPDATE", "Pod"), ("CREATE", "Deployment"), ("DELETE", "Pod")])
def test_only_pod_creation_is_mutated(operation: str, kind: str) -> None:
    calls: list[Any] = []

    def asks(pod: Any) -> bool:
        calls.append(pod)
        return True

    answer = review(admission(pod_with(), operation, kind), asks, SCHED)
    assert answer["response"] == {"uid": "req-1", "allowed": True} and not calls


@pytest.mark.parametrize("body", [None, [], {}, {"request": []}, {"request": {"uid": ""}}, {"request": {}}])
def test_non_review_is_refused(body: Any) -> None:
    with pytest.raises(ReviewError):
        review(body, lambda p: True, SCHED)


@pytest.mark.parametrize("raw", [b"", b"{", b"[1]", b'{"request": 3}', b"\xff\xfe"])
def test_handle_answers_400_for_garbage(raw: bytes) -> None:
    status, body = handle(raw, lambda p: True, SCHED)
    assert status == 400 and "AdmissionReview" in json.loads(body)["error"]


def test_handle_answers_review() -> None:
    status, body = handle(json.dumps(admission(pod_with())).encode(), lambda p: True, SCHED)
    doc = json.loads(body)
    assert status == 200 and doc["kind"] == "AdmissionReview" and doc["response"]["patchType"] == "JSONPatch"


gate_names = st.lists(st.sampled_from([GATE, "example.com/a", "kueue.x-k8s.io/admission", "b"]), max_size=4)


@settings(max_examples=150)
@given(gates=st.one_of(st.none(), gate_names), scheduler=st.sampled_from([None, "", "default-scheduler", "x"]))
def test_patch_leaves_exactly_one_gate_and_keeps_the_others(gates: list[str] | None, scheduler: str | None) -> None:
    pod = pod_with(gates, scheduler)
    out = apply_patch(pod, pod_patch(pod, SCHED))
    names = [g["name"] for g in out["spec"].get("schedulingGates") or []]
    assert GATE in names
    before = gates or []
    assert [n for n in names if n != GATE] == [n for n in before if n != GATE]
    if GATE not in before:
        assert names.count(GATE) == 1
    expected = SCHED if scheduler in (None, "", "default-scheduler") else scheduler
    assert out["spec"]["schedulerName"] == expected
    # idempotent: a second pass over the result changes nothing more
    assert not [op for op in pod_patch(out, SCHED) if op["path"].startswith("/spec/schedulingGates")]
