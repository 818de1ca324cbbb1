"""The Flask app: routes, health, readiness, metrics, state, limits, and malformed input.

Malformed bodies come from hypothesis: never a 5xx, and a 400 never changes the ledger (the Flask
test client keeps this fast; the gunicorn tests cover the real server).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from flask.testing import FlaskClient
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.app import create_app
from extender.cli import _render
from extender.config import ExtenderConfig
from extender.samples import binding_args, filter_args, gpu_node, pod
from extender.standalone import build_state
from extender.state import ExtenderState
from packing.products import load_catalog

CATALOG = load_catalog()
NAMES = ["node-0", "node-1", "node-2"]


def setup(**overrides: Any) -> tuple[ExtenderState, FlaskClient]:
    config = ExtenderConfig(standalone=True, nodes=3, gpus_per_node=2, **overrides)
    state = build_state(config, CATALOG)
    return state, create_app(state, config).test_client()


def post(client: FlaskClient, path: str, doc: Any) -> Any:
    return client.post(path, data=json.dumps(doc), content_type="application/json")


def test_health_readiness_follow_the_state_flag() -> None:
    state, client = setup()
    assert client.get("/healthz").status_code == 200
    assert client.get("/readyz").status_code == 200
    assert client.get("/readyz").get_json() == {"status": "ready", "epoch": state.epoch}
    state.ready = False  # cluster mode: not synced yet, or not the leader
    not_ready = client.get("/readyz")
    assert not_ready.status_code == 503
    assert not_ready.get_json() == {"status": "not ready", "epoch": state.epoch, "reason": "not ready"}
    assert client.get("/healthz").status_code == 200


def test_metrics_show_requests_latency_placements_failures_capacity_and_queue() -> None:
    _, client = setup()
    p, big = pod("a", "v100-50"), pod("big", "v100-100", count=4)
    node = post(client, "/filter", filter_args(p, NAMES)).get_json()["NodeNames"][0]
    post(client, "/bind", binding_args(p, node))
    post(client, "/filter", filter_args(big, NAMES))
    text = client.get("/metrics").get_data(as_text=True)
    for needle in (
        'gpuslice_extender_requests_total{code="200",verb="filter"} 2.0',
        'gpuslice_extender_request_seconds_bucket{le="0.005",verb="bind"}',
        'gpuslice_placements_total{product="v100-50"} 1.0',
        'gpuslice_filter_node_failures_total{reason="TooLarge"} 3.0',
        'gpuslice_free_slices{product="v100-100"} 5.0',
        'gpuslice_free_slices{product="v100-25"} 22.0',
        "gpuslice_pending_claims 1.0",
        'gpuslice_claims{state="bound"} 1.0',
        "gpuslice_ready 1.0",
        "gpuslice_placement_churning 0.0",  # the default policy reads the load phase: nothing left yet
        "gpuslice_placement_departure_ratio 0.0",
    ):
        assert needle in text, needle


def test_state_view_shows_ledger_allocations_and_queue() -> None:
    _, client = setup()
    p = pod("a", "v100-25")
    post(client, "/filter", filter_args(p, NAMES))
    post(client, "/filter", filter_args(pod("huge", "v100-100", count=3), NAMES))
    doc = client.get("/state").get_json()
    assert [n["name"] for n in doc["nodes"]] == NAMES
    assert doc["allocations"][0]["state"] == "reserved" and doc["allocations"][0]["pod"] == "default/a"
    assert doc["queue"][0]["pod"] == "default/huge" and doc["queue"][0]["position"] == 1
    assert doc["placement_phase"] == {"churning": False, "departure_ratio": 0.0}  # the default reads the phase
    assert _render(doc).splitlines()[1] == ("placement: the cluster is filling (0.00 departures per arrival lately, "
                                            "under 0.50): the fragment gradient, to keep whole cards free")
    assert setup(policy="best-fit")[1].get("/state").get_json()["placement_phase"] is None
    assert client.post("/state").status_code == 405


def test_prefix_and_verbs_are_configurable() -> None:
    _, client = setup(prefix="/v1", filter_verb="f", prioritize_verb="p", bind_verb="b")
    p = pod("a", "v100-25")
    assert post(client, "/v1/f", filter_args(p, NAMES)).status_code == 200
    assert post(client, "/v1/p", filter_args(p, NAMES)).status_code == 200
    assert post(client, "/filter", filter_args(p, NAMES)).status_code == 404


def test_admin_release_frees_a_slice_and_is_only_there_when_enabled() -> None:
    state, client = setup()
    p = pod("a", "v100-100")
    node = post(client, "/filter", filter_args(p, NAMES)).get_json()["NodeNames"][0]
    post(client, "/bind", binding_args(p, node))
    assert post(client, "/admin/release", {"PodUID": p["metadata"]["uid"]}).status_code == 200
    assert state.ledger.allocations == {}
    again = post(client, "/admin/release", {"PodUID": p["metadata"]["uid"]})
    assert again.status_code == 404 and "holds no slice" in again.get_json()["error"]
    assert post(client, "/admin/release", {"PodUID": 3}).status_code == 400
    cluster_state = build_state(ExtenderConfig(standalone=True), CATALOG)
    cluster_app = create_app(cluster_state, ExtenderConfig()).test_client()
    assert post(cluster_app, "/admin/release", {"PodUID": "x"}).status_code == 404


def test_errors_are_json_and_change_nothing() -> None:
    state, client = setup(max_body_bytes=4096)
    before = state.ledger.fingerprint()
    bad = client.post("/filter", data=b"{not json", content_type="application/json")
    assert bad.status_code == 400 and "not JSON" in bad.get_json()["error"]
    big = client.post("/filter", data=b"[" + b" " * 5000 + b"]", content_type="application/json")
    assert big.status_code == 413 and "error" in big.get_json()
    wrong_method = client.get("/filter")
    assert wrong_method.status_code == 405 and "error" in wrong_method.get_json()
    assert client.get("/nope").status_code == 404
    assert state.ledger.fingerprint() == before


def test_an_internal_failure_is_reported_in_error_not_as_a_crash() -> None:
    state, client = setup()

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("ledger on fire")

    state.filter = broken  # type: ignore[method-assign]
    state.bind = broken  # type: ignore[method-assign]
    reply = post(client, "/filter", filter_args(pod("a", "v100-25"), NAMES))
    assert reply.status_code == 200
    assert reply.get_json()["Error"] == "gpuslice internal error: ledger on fire"
    assert reply.get_json()["NodeNames"] == []
    assert post(client, "/bind", binding_args(pod("a"), "node-0")).get_json()["Error"].endswith("ledger on fire")


# ---- hypothesis: malformed bodies ----------------------------------------------------------------

scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8)
json_any = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=12)
not_object = scalars | st.lists(json_any, max_size=3)
not_string: st.SearchStrategy[Any] = (st.none() | st.booleans() | st.integers() | st.lists(scalars, max_size=2)
                                      | st.just({}))


@st.composite
def malformed_extender_args(draw: st.DrawFn) -> Any:
    """A body that kube-scheduler would never send: one field of a valid one broken."""
    valid = filter_args(pod("h", draw(st.sampled_from(["v100-25", "v100-50", "v100-100"]))), NAMES)
    how = draw(st.sampled_from(["top", "pod", "names", "name", "nodes", "items", "node", "spec", "uid"]))
    if how == "top":
        return draw(not_object)
    if how == "pod":
        valid["Pod"] = draw(st.none() | not_object)
    elif how == "names":
        valid["NodeNames"] = draw(scalars.filter(lambda v: v is not None) | st.just({}))
    elif how == "name":
        valid["NodeNames"] = [*NAMES, draw(not_string | st.just(""))]
    elif how == "nodes":
        valid["Nodes"], valid["NodeNames"] = draw(scalars.filter(lambda v: v is not None) | st.lists(json_any)), None
    elif how == "items":
        items: Any = draw(scalars.filter(lambda v: v is not None) | st.just({}))
        valid["Nodes"], valid["NodeNames"] = {"items": items}, None
    elif how == "node":
        valid["Nodes"], valid["NodeNames"] = {"items": [gpu_node("node-0", 2), draw(not_object | st.just({}))]}, None
    elif how == "spec":
        valid["Pod"]["spec"]["containers"] = draw(scalars.filter(lambda v: v is not None) | st.just({}))
    else:
        valid["Pod"]["metadata"]["uid"] = draw(not_string.filter(lambda v: v is not None and v != {}) | st.just(""))
    return valid


@st.composite
def malformed_binding_args(draw: st.DrawFn) -> Any:
    valid = binding_args(pod("h", "v100-25"), "node-0")
    if draw(st.booleans()):
        return draw(not_object)
    key = draw(st.sampled_from(["PodName", "PodUID", "Node"]))
    valid[key] = draw(not_string | st.just(""))
    return valid


def _checked(state: ExtenderState, client: FlaskClient, path: str, body: bytes) -> Any:
    before = state.ledger.fingerprint()
    reply = client.post(path, data=body, content_type="application/json")
    assert reply.status_code < 500, reply.get_data(as_text=True)
    assert reply.is_json, reply.get_data(as_text=True)
    return reply, before


@settings(max_examples=150, deadline=None)
@given(doc=malformed_extender_args(), verb=st.sampled_from(["/filter", "/prioritize"]))
def test_malformed_extender_args_get_400_and_change_nothing(doc: Any, verb: str) -> None:
    state, client = SHARED
    reply, before = _checked(state, client, verb, json.dumps(doc).encode())
    assert reply.status_code == 400, reply.get_json()
    assert "error" in reply.get_json()
    assert state.ledger.fingerprint() == before


@settings(max_examples=100, deadline=None)
@given(doc=malformed_binding_args())
def test_malformed_binding_args_get_400_and_change_nothing(doc: Any) -> None:
    state, client = SHARED
    reply, before = _checked(state, client, "/bind", json.dumps(doc).encode())
    assert reply.status_code == 400
    assert state.ledger.fingerprint() == before


@settings(max_examples=150, deadline=None)
@given(body=st.binary(max_size=64) | json_any.map(lambda d: json.dumps(d).encode()),
       verb=st.sampled_from(["/filter", "/prioritize", "/bind", "/admin/release"]))
def test_arbitrary_bodies_never_5xx_and_a_refusal_changes_nothing(body: bytes, verb: str) -> None:
    state, client = SHARED
    reply, before = _checked(state, client, verb, body)
    if reply.status_code != 200:
        assert state.ledger.fingerprint() == before
    else:  # a random body that happens to be valid must still be a clean decision
        doc = reply.get_json()
        assert not isinstance(doc, dict) or doc.get("Error", "") == ""


def _shared() -> tuple[ExtenderState, FlaskClient]:
    state, client = setup()
    # some capacity in use, so a wrongly applied change would show in the fingerprint
    for i, product in enumerate(["v100-25", "v100-50", "v100-100"]):
        p = pod(f"seed-{i}", product)
        node = post(client, "/filter", filter_args(p, NAMES)).get_json()["NodeNames"][0]
        assert post(client, "/bind", binding_args(p, node)).get_json() == {"Error": ""}
    return state, client


SHARED = _shared()


@pytest.mark.parametrize("verb", ["/filter", "/prioritize"])
def test_a_valid_body_after_the_storm_still_decides(verb: str) -> None:
    state, client = SHARED
    reply = post(client, verb, filter_args(pod("after", "v100-25"), NAMES))
    assert reply.status_code == 200
    state.ledger.verify()


def test_healthz_answers_503_stopping_once_the_worker_was_told_to_stop() -> None:
    """SIGTERM sets the app's stopping Event (extender/worker.py): the pod leaves the Service's endpoints at once."""
    from extender.app import STOPPING

    config = ExtenderConfig(standalone=True, nodes=3, gpus_per_node=2)
    app = create_app(build_state(config, CATALOG), config)
    client = app.test_client()
    assert client.get("/healthz").status_code == 200
    app.extensions[STOPPING].set()
    reply = client.get("/healthz")
    assert reply.status_code == 503 and reply.get_json() == {"status": "stopping"}


def test_admin_leave_runs_the_stop_hook_turns_unready_and_answers_loopback_only() -> None:
    """The chart's preStop (`gpuslice leave`): leadership given up at once, the process still serving."""
    from extender.app import STOP_HOOK

    config = ExtenderConfig(standalone=True, nodes=3, gpus_per_node=2)
    app = create_app(build_state(config, CATALOG), config)
    stopped: list[bool] = []
    app.extensions[STOP_HOOK] = lambda: stopped.append(True)
    client = app.test_client()
    refused = client.post("/admin/leave", json={}, environ_base={"REMOTE_ADDR": "10.1.2.3"})
    assert refused.status_code == 403 and stopped == []  # from elsewhere: refused, nothing changed
    assert client.get("/healthz").status_code == 200
    left = client.post("/admin/leave", json={})
    assert left.status_code == 200 and stopped == [True]
    assert client.get("/healthz").status_code == 503
    served = post(client, "/filter", filter_args(pod("p", "v100-25"), NAMES))
    assert served.status_code == 200 and served.get_json()["Error"] == ""  # still serving
