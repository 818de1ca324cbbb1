"""Fuzz of the extender's wire types with hypothesis: never a 5xx, and a rejection never changes anything.

Bodies are built the way kube-scheduler's would be, then broken anywhere: wrong types, numbers of
thousands of digits, quantities and labels of Unicode digits ("²", "١"), deep nesting, node lists
over the cap, agent inventories with every field wrong, random bytes. Each goes to the extender as
the most exposed configuration runs it (standalone, learning inventories from bodies, mutual-TLS
access rules on) and, for the webhook, to a cluster-mode app. For every reply:

* the status is below 500 and the body is JSON;
* a rejection (any status but 200) leaves the ledger, the queue and the inventory exactly as they
  were (``Ledger.fingerprint``, waiting and running counts, node names);
* a 200 filter or bind carries no internal error.

``make test`` runs a bounded number of examples per test; ``make fuzz`` runs at least 100 000 in
all (``GPUSLICE_FUZZ_EXAMPLES`` per test) and prints the tally.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from flask.testing import FlaskClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kubernetes import client as k8s

from extender.app import create_app
from extender.cluster.config import ClusterConfig
from extender.cluster.dra import ClaimResolver
from extender.cluster.serve import ClusterRuntime, create_cluster_app
from extender.config import ExtenderConfig
from extender.samples import binding_args, filter_args, gpu_node, pod
from extender.standalone import build_state
from extender.state import ExtenderState
from packing.asks import AskReader
from packing.products import load_catalog

CATALOG = load_catalog()
EXAMPLES = int(os.environ.get("GPUSLICE_FUZZ_EXAMPLES", "120"))
MAX_NODES = 40  # small, so node lists over the cap are cheap to make
NODE_NAMES = [f"node-{i}" for i in range(4)] + ["learned-0", "learned-1", "ghost"]
TALLY: Counter[str] = Counter()

FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                       HealthCheck.data_too_large])

# ---- values that broke or could break a parser -----------------------------------------------------

odd_numbers = st.sampled_from(["7" * 4301, "-" + "9" * 5000, "1e999", "-1e999", "1" * 40, "1.5e3", "0.0001",
                               "9007199254740993", "-0"])
odd_strings = st.sampled_from(["²", "١", "𝟙", "1", "0", "-1", "1e3", "500m", "1Gi", " 2 ", "", "\u0000", "nan",
                               "inf", "v100-25", "v100-100", "a100-50", "Tesla-V100-SXM2-32GB", "x" * 300,
                               "gpuslice.io/v100-25", "GPU-" + "f" * 36])
scalars = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False, allow_infinity=False)
           | st.text(max_size=6) | odd_strings)
json_any = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3)
                        | st.dictionaries(st.text(max_size=5) | odd_strings, inner, max_size=3), max_leaves=10)
quantities = scalars | st.integers(0, 9).map(str)


def mostly(good: st.SearchStrategy[Any], bad: st.SearchStrategy[Any], odds: int = 6) -> st.SearchStrategy[Any]:
    """``good`` about ``odds`` times in ``odds + 1``, else ``bad``: a body broken in one place is the point."""
    return st.integers(0, odds).flatmap(lambda k: bad if k == 0 else good)


@st.composite
def containers(draw: st.DrawFn) -> Any:
    product = draw(st.sampled_from(["v100-25", "v100-50", "v100-100", "v100-75"]))
    resource = draw(st.sampled_from([f"gpuslice.io/{product}", "nvidia.com/gpu", "cpu", draw(odd_strings)]))
    resources: dict[str, Any] = {}
    for side in draw(st.lists(st.sampled_from(["limits", "requests"]), unique=True, max_size=2)):
        resources[side] = draw(st.just({resource: draw(quantities)}) | json_any)
    container: Any = {"name": "c", "resources": draw(st.just(resources) | json_any)}
    if draw(st.booleans()):
        container["restartPolicy"] = draw(st.sampled_from(["Always", "OnFailure"]) | scalars)
    return draw(st.just(container) | json_any)


@st.composite
def pods(draw: st.DrawFn) -> Any:
    doc = pod(f"f{draw(st.integers(0, 30))}", draw(st.sampled_from([None, "v100-25", "v100-50", "v100-100"])),
              count=draw(st.sampled_from([1, 1, 2])), via=draw(st.sampled_from(["resource", "annotation"])))
    for _ in range(draw(st.sampled_from([0, 0, 0, 1, 1, 2, 3]))):
        where = draw(st.sampled_from(["uid", "name", "namespace", "annotations", "product", "time-limit",
                                      "containers", "init", "priority", "deadline", "claims", "spec", "metadata"]))
        meta, spec = doc["metadata"], doc["spec"]
        if where in ("uid", "name", "namespace"):
            meta[where] = draw(scalars)
        elif where == "annotations":
            meta["annotations"] = draw(json_any)
        elif where == "product":
            meta["annotations"] = {"gpuslice.io/product": draw(scalars)}
        elif where == "time-limit":
            meta["annotations"] = {"gpuslice.io/time-limit": draw(scalars)}
        elif where == "containers":
            spec["containers"] = draw(st.lists(containers(), max_size=3) | json_any)
        elif where == "init":
            spec["initContainers"] = draw(st.lists(containers(), max_size=2) | json_any)
        elif where == "priority":
            spec["priority"] = draw(scalars)
        elif where == "deadline":
            spec["activeDeadlineSeconds"] = draw(scalars)
        elif where == "claims":
            template = st.sampled_from(["half", "other", "absent"]) | scalars
            spec["resourceClaims"] = draw(st.lists(st.fixed_dictionaries(
                {"name": scalars, "resourceClaimTemplateName": template}), max_size=2) | json_any)
        else:
            doc[where] = draw(json_any)
            break  # the spec or metadata above is no longer the pod's
    return doc


@st.composite
def inventories(draw: st.DrawFn) -> Any:
    cards = []
    for i in range(draw(st.integers(0, 3))):
        card: dict[str, Any] = {"uuid": f"GPU-{draw(st.integers(0, 5))}", "index": i,
                                "model": "Tesla-V100-SXM2-32GB", "memory_mib": 32768, "healthy": True}
        if draw(st.booleans()):
            card[draw(st.sampled_from(sorted(card)))] = draw(scalars)
        cards.append(card)
    return draw(st.just(json.dumps(cards)) | st.text(max_size=20) | json_any.map(json.dumps) | scalars)


@st.composite
def nodes(draw: st.DrawFn) -> Any:
    node = gpu_node(draw(st.sampled_from(NODE_NAMES)), draw(st.integers(0, 3)))
    labels, annotations = node["metadata"]["labels"], node["metadata"]["annotations"]
    for _ in range(draw(st.integers(0, 2))):
        where = draw(st.sampled_from(["count", "product", "memory", "inventory", "name", "labels", "metadata"]))
        if where in ("count", "product", "memory"):
            labels[f"nvidia.com/gpu.{where}"] = draw(scalars)
        elif where == "inventory":
            annotations["gpuslice.io/inventory"] = draw(inventories())
        elif where == "labels":
            node["metadata"]["labels"] = draw(json_any)
            break  # the labels dict above is no longer the node's
        elif where == "name":
            node["metadata"]["name"] = draw(scalars)
        else:
            node["metadata"] = draw(json_any)
            break  # no metadata left to change
    return draw(mostly(st.just(node), json_any))


@st.composite
def extender_args(draw: st.DrawFn) -> Any:
    p = draw(pods())
    if draw(st.booleans()):
        names: Any = draw(mostly(st.lists(st.sampled_from(NODE_NAMES), max_size=MAX_NODES + 3),
                                 st.lists(st.sampled_from(NODE_NAMES) | scalars, max_size=5) | json_any))
        doc: Any = filter_args(p, [])
        doc["NodeNames"] = names
    else:
        doc = filter_args(p, nodes=[])
        doc["Nodes"] = draw(mostly(st.fixed_dictionaries({"items": st.lists(nodes(), max_size=4)}), json_any))
        if draw(st.integers(0, 9)) == 0:  # over the cap
            doc["Nodes"] = {"items": [gpu_node(f"many-{i}", 1) for i in range(MAX_NODES + 1)]}
    if draw(st.integers(0, 6)) == 0:
        doc[draw(st.sampled_from(["Pod", "NodeNames", "Nodes"]))] = draw(json_any)
    return draw(mostly(st.just(doc), json_any))


@st.composite
def binding_docs(draw: st.DrawFn) -> Any:
    doc: Any = binding_args(pod(f"f{draw(st.integers(0, 30))}", "v100-25"), draw(st.sampled_from(NODE_NAMES)))
    for key in draw(st.lists(st.sampled_from(["PodName", "PodNamespace", "PodUID", "Node"]), unique=True)):
        doc[key] = draw(scalars)
    return draw(mostly(st.just(doc), json_any))


def encoded(doc: Any) -> bytes:
    return json.dumps(doc).encode()


@st.composite
def raw_bodies(draw: st.DrawFn) -> bytes:
    """Bytes no encoder would write: big numbers spliced in, truncations, deep nesting, garbage."""
    base = encoded(draw(extender_args() | binding_docs()))
    how = draw(st.sampled_from(["number", "truncate", "deep", "bytes", "escape"]))
    if how == "number":
        cut = draw(st.integers(0, len(base)))
        return base[:cut] + draw(odd_numbers).encode() + base[cut:]
    if how == "truncate":
        return base[: draw(st.integers(0, len(base)))]
    if how == "deep":
        depth = draw(st.integers(100, 3000))
        return b'{"Pod": ' + b'{"a":' * depth + b"1" + b"}" * depth + b', "NodeNames": ["node-0"]}'
    if how == "escape":
        return base.replace(b'"v100', b'"\\ud800v100').replace(b'"node', b'"\\u00b2node')
    return draw(st.binary(max_size=80))


# ---- the apps under fuzz ---------------------------------------------------------------------------


def _standalone() -> tuple[ExtenderState, FlaskClient]:
    config = ExtenderConfig(standalone=True, nodes=4, gpus_per_node=2, learn_nodes=True, max_nodes=MAX_NODES,
                            max_body_bytes=1024 * 1024)
    state = build_state(config, CATALOG)
    client = create_app(state, config).test_client()
    for i, product in enumerate(["v100-25", "v100-50", "v100-100"]):  # some capacity in use
        p = pod(f"seed-{i}", product)
        node = client.post("/filter", data=encoded(filter_args(p, NODE_NAMES[:4])),
                           content_type="application/json").get_json()["NodeNames"][0]
        assert client.post("/bind", data=encoded(binding_args(p, node)),
                           content_type="application/json").get_json() == {"Error": ""}
    return state, client


def _template(namespace: str, name: str) -> dict[str, Any] | None:
    """The DRA API as the fuzz sees it: one template of ours, one of another driver, nothing else."""
    klass = {"half": "v100-50.gpuslice.io", "other": "gpu.nvidia.com"}.get(name)
    if klass is None:
        return None
    return {"spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": klass}}]}}}}


def _cluster() -> tuple[ExtenderState, FlaskClient]:
    runtime = ClusterRuntime(ExtenderConfig(max_nodes=MAX_NODES), ClusterConfig(leader_elect=False),
                             api=k8s.ApiClient(k8s.Configuration(host="http://127.0.0.1:9")))  # nothing listens
    # the claims come from a stand-in of the API: the fuzz is about input, an API away is tested elsewhere
    runtime.state.core.asks = AskReader(CATALOG, (), ClaimResolver(CATALOG, _template, lambda ns, name: None))
    app = create_cluster_app(runtime.config, runtime.cluster, runtime, start=False)
    from extender.inventory import synthetic_cards

    runtime.state.sync_node("node-0", synthetic_cards("node-0", 2, "Tesla-V100-SXM2-32GB", 32768))
    runtime.state.ready = True
    return runtime.state.core, app.test_client()


STANDALONE = _standalone()
CLUSTER = _cluster()


def _mark(state: ExtenderState) -> tuple[object, ...]:
    return (state.ledger.fingerprint(), len(state.waiting), state.waiting.queue.running(),
            tuple(sorted(state.ledger.nodes)))


def _send(state: ExtenderState, client: FlaskClient, path: str, body: bytes, verb_kind: str) -> None:
    before = _mark(state)
    reply = client.post(path, data=body, content_type="application/json")
    TALLY["cases"] += 1
    TALLY[f"{path} {reply.status_code}"] += 1
    if reply.status_code >= 500:
        TALLY["5xx"] += 1
    assert reply.status_code < 500, (path, body[:300], reply.get_data(as_text=True)[:300])
    doc = reply.get_json(silent=True)
    assert doc is not None or reply.data == b"null", reply.get_data(as_text=True)[:300]
    if reply.status_code != 200:
        TALLY["rejections"] += 1
        changed = _mark(state) != before
        TALLY["rejections that changed something"] += changed
        assert not changed, (path, reply.status_code, body[:300])
    elif verb_kind in ("filter", "bind"):
        assert "internal error" not in doc.get("Error", ""), doc
        TALLY[f"{verb_kind} decided"] += 1


@pytest.fixture(scope="module", autouse=True)
def tally() -> Iterator[None]:
    yield
    for state, _ in (STANDALONE, CLUSTER):
        state.ledger.verify()
        state.waiting.queue.verify()
    print(f"\n[fuzz] {TALLY['cases']} cases, {TALLY['5xx']} x 5xx, {TALLY['rejections']} rejections, "
          f"{TALLY['rejections that changed something']} rejections that changed the ledger, queue or inventory")
    print("[fuzz] by route and status: " + ", ".join(f"{k} x{v}" for k, v in sorted(TALLY.items()) if " " in k
                                                     and k.startswith("/")))


@FUZZ
@given(doc=extender_args(), verb=st.sampled_from(["/filter", "/prioritize"]), cluster=st.booleans())
def test_filter_and_prioritize_bodies(doc: Any, verb: str, cluster: bool) -> None:
    state, client = CLUSTER if cluster else STANDALONE
    _send(state, client, verb, encoded(doc), verb.strip("/"))


@FUZZ
@given(doc=binding_docs() | st.fixed_dictionaries({"PodUID": scalars}),
       verb=st.sampled_from(["/bind", "/admin/release"]))
def test_bind_and_release_bodies(doc: Any, verb: str) -> None:
    state, client = STANDALONE
    _send(state, client, verb, encoded(doc), verb.strip("/"))


@FUZZ
@given(body=raw_bodies(), verb=st.sampled_from(["/filter", "/prioritize", "/bind", "/admin/release"]))
def test_raw_bodies(body: bytes, verb: str) -> None:
    state, client = STANDALONE
    _send(state, client, verb, body, verb.strip("/"))


@FUZZ
@given(obj=pods() | json_any, operation=st.sampled_from(["CREATE", "UPDATE", None]),
       raw=st.none() | raw_bodies())
def test_admission_reviews(obj: Any, operation: Any, raw: bytes | None) -> None:
    state, client = CLUSTER
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
              "request": {"uid": "r", "kind": {"kind": "Pod"}, "operation": operation, "object": obj}}
    _send(state, client, "/mutate", raw if raw is not None else encoded(review), "mutate")
