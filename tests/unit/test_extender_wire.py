"""The extender wire format against bodies shaped exactly like kube-scheduler's.

kube-scheduler (``k8s.io/kube-scheduler/extender/v1``, no json tags) sends PascalCase keys, full
v1 objects inside, and ``null`` for whichever node field it does not use. Its reply decoding: a
filter reply with ``NodeNames`` null and ``Nodes`` null means zero feasible nodes, so ours must
always carry a list; with ``nodeCacheCapable: false`` it reads ``Nodes``.

Captured bodies under ``../shared/fixtures/extender/`` (next to the repository) are replayed when
that folder exists.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from extender.app import create_app
from extender.config import ExtenderConfig
from extender.samples import binding_args, filter_args, gpu_node, pod
from extender.standalone import build_state
from extender.wire import (
    FilterResult,
    WireError,
    binding_result,
    decode_body,
    parse_binding_args,
    parse_extender_args,
    priorities_to_wire,
)
from packing.products import load_catalog

FIXTURES = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures" / "extender"
CATALOG = load_catalog()


def raw(doc: Any) -> bytes:
    return json.dumps(doc).encode()


def post(client: Any, path: str, body: bytes) -> Any:
    return client.post(path, data=body, content_type="application/json")


# ---- requests ------------------------------------------------------------------------------------


def test_node_names_mode_body_parses_with_null_nodes() -> None:
    body = raw(filter_args(pod("a", "v100-25"), ["n1", "n2"]))
    assert b'"Nodes": null' in body  # exactly what a nodeCacheCapable scheduler sends
    args = parse_extender_args(decode_body(body))
    assert args.node_names == ["n1", "n2"] and args.nodes is None and not args.full_nodes
    assert args.pod["metadata"]["name"] == "a"


def test_full_nodes_mode_body_parses_with_null_node_names() -> None:
    body = raw(filter_args(pod("a", "v100-25"), nodes=[gpu_node("n1"), gpu_node("n2")]))
    args = parse_extender_args(decode_body(body))
    assert args.node_names == ["n1", "n2"] and args.full_nodes
    assert args.nodes is not None and args.nodes[1]["metadata"]["name"] == "n2"


@pytest.mark.parametrize("doc", [
    {"Pod": {}, "Nodes": None, "NodeNames": None},
    {"Pod": {}, "Nodes": None, "NodeNames": []},
    {"Pod": {}, "Nodes": {"metadata": {}, "items": []}, "NodeNames": None},
    {"Pod": {}, "Nodes": {"metadata": {}, "items": None}, "NodeNames": None},
    {"Pod": {}, "Nodes": {}},
    {"Pod": {}},
])
def test_null_and_empty_node_fields_mean_no_candidates(doc: dict[str, Any]) -> None:
    assert parse_extender_args(doc).node_names == []


def test_unknown_fields_are_ignored_like_gos_decoder() -> None:
    doc = filter_args(pod("a", "v100-25"), ["n1"])
    doc["FutureField"] = {"x": 1}
    doc["Pod"]["spec"]["somethingNew"] = True
    assert parse_extender_args(doc).node_names == ["n1"]
    bind = {**binding_args(pod("a"), "n1"), "Extra": [1, 2]}
    assert parse_binding_args(bind).node == "n1"


@pytest.mark.parametrize("doc, needle", [
    ([], "ExtenderArgs must be a JSON object"),
    ({"Pod": None, "NodeNames": ["n"]}, "Pod must be a Pod object"),
    ({"Pod": "p", "NodeNames": ["n"]}, "Pod must be a Pod object"),
    ({"Pod": {}, "NodeNames": "n1"}, "NodeNames must be an array"),
    ({"Pod": {}, "NodeNames": ["n1", 2]}, "non-empty strings"),
    ({"Pod": {}, "NodeNames": [""]}, "non-empty strings"),
    ({"Pod": {}, "Nodes": []}, "Nodes must be a JSON object"),
    ({"Pod": {}, "Nodes": {"items": {}}}, "items must be an array"),
    ({"Pod": {}, "Nodes": {"items": [{"metadata": {}}]}}, "metadata.name"),
    ({"Pod": {}, "Nodes": {"items": [7]}}, "must be a JSON object"),
])
def test_wrong_types_are_wire_errors(doc: Any, needle: str) -> None:
    with pytest.raises(WireError, match=needle):
        parse_extender_args(doc)


@pytest.mark.parametrize("body", [b"", b"{", b"\xff\xfe", b"[" * 100_000])
def test_bodies_that_are_not_json_are_wire_errors(body: bytes) -> None:
    with pytest.raises(WireError):
        decode_body(body)


def test_binding_args_keys_and_errors() -> None:
    args = parse_binding_args(binding_args(pod("p", namespace="ns"), "gpu-b"))
    assert (args.pod_name, args.pod_namespace, args.node) == ("p", "ns", "gpu-b")
    assert parse_binding_args({"PodName": "p", "PodUID": "u", "Node": "n"}).pod_namespace == "default"
    for key in ("PodName", "PodUID", "Node"):
        doc = binding_args(pod("p"), "n")
        doc[key] = None
        with pytest.raises(WireError, match=key):
            parse_binding_args(doc)
    with pytest.raises(WireError, match="PodUID"):
        parse_binding_args({"PodName": "p", "PodUID": 5, "Node": "n"})


# ---- replies -------------------------------------------------------------------------------------


def test_filter_result_always_carries_a_node_names_list_and_the_go_field_names() -> None:
    empty = FilterResult().to_wire()
    assert empty == {"NodeNames": [], "FailedNodes": {}, "FailedAndUnresolvableNodes": {}, "Error": "",
                     "Nodes": None}
    full = FilterResult(["a"], {"b": "x"}, {"c": "y"}, nodes=[{"metadata": {"name": "a"}}]).to_wire()
    assert full["Nodes"] == {"metadata": {}, "items": [{"metadata": {"name": "a"}}]}


def test_host_priority_list_is_an_array_of_host_and_score_in_range() -> None:
    assert priorities_to_wire({"n1": 10, "n2": 0}) == [{"Host": "n1", "Score": 10}, {"Host": "n2", "Score": 0}]
    with pytest.raises(ValueError):
        priorities_to_wire({"n": 11})
    assert binding_result() == {"Error": ""}


def test_over_http_both_modes_answer_in_the_shape_the_scheduler_decodes() -> None:
    config = ExtenderConfig(standalone=True, nodes=2, gpus_per_node=1, learn_nodes=True, policy="best-fit")
    state = build_state(config, CATALOG)
    client = create_app(state, config).test_client()
    by_names = post(client, "/filter", raw(filter_args(pod("a", "v100-100"), ["node-0", "node-1", "x"])))
    doc = by_names.get_json()
    assert by_names.status_code == 200 and by_names.mimetype == "application/json"
    assert set(doc) == {"NodeNames", "Nodes", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
    assert doc["Nodes"] is None and doc["Error"] == ""
    assert doc["NodeNames"] == ["node-0", "node-1"]  # empty cluster: both nodes tie
    assert list(doc["FailedAndUnresolvableNodes"]) == ["x"]
    nodes = [gpu_node("gpu-a", 1), gpu_node("gpu-b", 2), gpu_node("cpu-c", 0)]
    by_objects = post(client, "/filter", raw(filter_args(pod("b", "v100-50"), nodes=nodes))).get_json()
    assert by_objects["NodeNames"] == [n["metadata"]["name"] for n in by_objects["Nodes"]["items"]]
    assert by_objects["Nodes"]["items"][0] == {"metadata": {"name": "gpu-a"}}  # the scheduler reads only names
    assert "cpu-c" in by_objects["FailedAndUnresolvableNodes"]
    scores = post(client, "/prioritize", raw(filter_args(pod("b", "v100-50"), ["gpu-a", "gpu-b"]))).get_json()
    assert [set(s) for s in scores] == [{"Host", "Score"}] * 2
    bound = post(client, "/bind", raw(binding_args(pod("b", "v100-50"), by_objects["NodeNames"][0])))
    assert bound.get_json() == {"Error": ""}


# ---- captured bodies -----------------------------------------------------------------------------


def _fixtures() -> list[Path]:
    return sorted(FIXTURES.glob("*.json")) if FIXTURES.is_dir() else []


@pytest.mark.skipif(not FIXTURES.is_dir(), reason=f"no captured bodies: {FIXTURES} does not exist")
@pytest.mark.parametrize("path", _fixtures(), ids=lambda p: p.name)
def test_captured_bodies_parse_and_replies_keep_their_keys(path: Path) -> None:
    doc = json.loads(path.read_text(encoding="utf-8"))
    if isinstance(doc, dict) and "Pod" in doc:
        args = parse_extender_args(doc)
        expected = doc.get("NodeNames") or [n["metadata"]["name"] for n in (doc.get("Nodes") or {}).get("items") or []]
        assert args.node_names == expected
    elif isinstance(doc, dict) and "PodUID" in doc:
        assert parse_binding_args(doc).pod_uid == doc["PodUID"]
    elif isinstance(doc, dict) and ("FailedNodes" in doc or "NodeNames" in doc):
        assert set(doc) <= set(FilterResult().to_wire())
    elif isinstance(doc, list):
        assert all(set(entry) == {"Host", "Score"} for entry in doc)
    else:
        pytest.skip(f"{path.name}: not an extender body this test knows")
