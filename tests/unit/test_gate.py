"""The queue gate: one name, one detection, the add and the lift patches, checked by applying them as
kube-apiserver applies a JSON patch (a failed test op changes nothing)."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packing.gate import GATE, add_patch, gate_index, gated, lift_patch

Doc = dict[str, Any]


class PatchFailed(Exception):
    pass


def apply(doc: Doc, ops: list[dict[str, Any]]) -> Doc:
    """RFC 6902 for the paths these patches use: all or nothing."""
    out = copy.deepcopy(doc)
    for op in ops:
        *parents, last = op["path"].strip("/").split("/")
        node: Any = out
        for key in parents:
            node = node[int(key)] if isinstance(node, list) else node.setdefault(key, {})
        if op["op"] == "test":
            try:
                got = node[int(last)] if isinstance(node, list) else node[last]
            except (IndexError, KeyError):
                raise PatchFailed(op["path"]) from None
            if got != op["value"]:
                raise PatchFailed(op["path"])
        elif op["op"] == "add":
            if last == "-":
                node.append(op["value"])
            else:
                node[last] = op["value"]
        elif op["op"] == "remove":
            try:
                del node[int(last)]
            except IndexError:
                raise PatchFailed(op["path"]) from None
    return out


others = st.lists(st.sampled_from(["example.com/a", "example.com/b", "team.io/hold"]), unique=True, max_size=3)


def pod(uid: str, gates: list[str] | None) -> Doc:
    spec: Doc = {} if gates is None else {"schedulingGates": [{"name": g} for g in gates]}
    return {"metadata": {"uid": uid}, "spec": spec}


def test_the_gate_name() -> None:
    assert GATE == "gpuslice.io/queue"


@given(others, st.booleans(), st.integers(0, 3))
@settings(max_examples=200)
def test_added_then_lifted_leaves_the_other_gates_as_they_were(names: list[str], none: bool, at: int) -> None:
    before = pod("u", None if none and not names else names)
    gated_pod = apply(before, add_patch(before))
    assert gated(gated_pod) and add_patch(gated_pod) == []  # adding twice adds nothing
    index = gate_index(gated_pod)
    assert index is not None
    lifted = apply(gated_pod, lift_patch("u", index))
    assert not gated(lifted) and [g["name"] for g in lifted["spec"]["schedulingGates"]] == names


@given(others, st.integers(0, 3))
def test_a_lift_of_another_pod_or_a_moved_gate_changes_nothing(names: list[str], where: int) -> None:
    gates = [*names]
    gates.insert(min(where, len(gates)), GATE)
    doc = pod("u", gates)
    index = gate_index(doc)
    assert index == gates.index(GATE)
    with pytest.raises(PatchFailed):
        apply(doc, lift_patch("re-created", index))  # the same name, another pod
    moved = pod("u", ["team.io/new", *gates])  # a gate added in front meanwhile: ours is one further
    with pytest.raises(PatchFailed):
        apply(moved, lift_patch("u", index))


def test_detection_reads_only_a_gate_named_so() -> None:
    assert not gated({}) and not gated({"spec": None}) and not gated({"spec": {"schedulingGates": "x"}})
    assert not gated(pod("u", ["gpuslice.io/queue-2", "x"]))
    assert gate_index({"spec": {"schedulingGates": ["junk", {"name": GATE}]}}) == 1
