"""How a pod asks for a slice: extended resources, the product annotation, refusals, runtime (DRA claims:
``test_cluster_dra.py``)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from extender.samples import pod
from packing.asks import AskReader, MalformedPod, PodSpecError, asks_for, direct_request, time_limit_of
from packing.constraints import pod_constraints
from packing.products import load_catalog

CATALOG = load_catalog()


def with_containers(containers: list[dict[str, Any]], init: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    doc = pod("p")
    doc["spec"]["containers"] = containers
    if init is not None:
        doc["spec"]["initContainers"] = init
    return doc


def asking(limits: dict[str, Any] | None = None, requests: dict[str, Any] | None = None,
           **extra: Any) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if limits is not None:
        resources["limits"] = limits
    if requests is not None:
        resources["requests"] = requests
    return {"name": "c", "image": "x", "resources": resources, **extra}


@pytest.mark.parametrize("product", ["v100-25", "v100-50", "v100-100"])
def test_each_catalog_product_is_an_extended_resource(product: str) -> None:
    r = direct_request(pod("p", product), CATALOG)
    assert r == CATALOG.request(product)


def test_the_annotation_asks_too_and_must_agree_with_a_resource() -> None:
    assert direct_request(pod("p", "v100-50", via="annotation"), CATALOG) == CATALOG.request("v100-50")
    both = pod("p", "v100-50")
    both["metadata"]["annotations"]["gpuslice.io/product"] = "v100-50"
    assert direct_request(both, CATALOG) == CATALOG.request("v100-50")
    both["metadata"]["annotations"]["gpuslice.io/product"] = "v100-25"
    with pytest.raises(PodSpecError, match="disagrees"):
        direct_request(both, CATALOG)


def test_whole_cards_may_be_counted_fractions_may_not() -> None:
    assert direct_request(pod("p", "v100-100", count=4), CATALOG) == CATALOG.request("v100-100", 4)
    with pytest.raises(PodSpecError, match="at most one fractional slice"):
        direct_request(pod("p", "v100-25", count=2), CATALOG)
    two_containers = with_containers([asking({"gpuslice.io/v100-50": "1"}), asking({"gpuslice.io/v100-50": "1"})])
    with pytest.raises(PodSpecError, match="fractional"):
        direct_request(two_containers, CATALOG)


def test_nothing_managed_means_none() -> None:
    assert direct_request(pod("p"), CATALOG) is None
    assert direct_request(pod("p", extra_resources={"nvidia.com/gpu": "1"}), CATALOG) is None
    assert direct_request({"metadata": {"name": "bare"}}, CATALOG) is None
    assert direct_request(pod("p", "v100-50", count=0), CATALOG) is None


def test_refusals_name_the_problem() -> None:
    with pytest.raises(PodSpecError, match=r"unknown product resource gpuslice\.io/v100-75"):
        direct_request(pod("p", extra_resources={"gpuslice.io/v100-75": "1"}), CATALOG)
    with pytest.raises(PodSpecError, match="unknown product 'a100-50'"):
        direct_request(pod("p", "a100-50", via="annotation"), CATALOG)
    bare = pod("p", extra_resources={"nvidia.com/gpu": "1"})
    with pytest.raises(PodSpecError, match=r"nvidia.com/gpu asks for whole GPUs .* gpuslice.io/v100-100 instead"):
        direct_request(bare, CATALOG, refused=("nvidia.com/gpu",))
    mixed = with_containers([asking({"gpuslice.io/v100-25": "1"}), asking({"gpuslice.io/v100-50": "1"})])
    with pytest.raises(PodSpecError, match="one product"):
        direct_request(mixed, CATALOG)
    for odd in ("500m", "²", "١", "1e3", "9" * 40):  # int() takes "١" (Arabic-Indic one), isdigit() takes "²"
        with pytest.raises(PodSpecError, match="whole numbers"):
            direct_request(with_containers([asking({"gpuslice.io/v100-25": odd})]), CATALOG)
    with pytest.raises(PodSpecError, match="must be equal"):
        direct_request(with_containers([asking({"gpuslice.io/v100-100": "2"}, {"gpuslice.io/v100-100": "1"})]), CATALOG)


def test_limits_alone_requests_alone_and_numbers_count() -> None:
    two = direct_request(with_containers([asking({"gpuslice.io/v100-100": 2})]), CATALOG)
    assert two == CATALOG.request("v100-100", 2)
    assert direct_request(with_containers([asking(None, {"gpuslice.io/v100-25": "1"})]), CATALOG) == \
        CATALOG.request("v100-25")


def test_init_containers_follow_kubernetes_effective_request_rules() -> None:
    whole = {"gpuslice.io/v100-100": "1"}
    # a plain init container runs before the app containers: max, not sum
    doc = with_containers([asking(whole)], init=[asking({"gpuslice.io/v100-100": "2"})])
    assert direct_request(doc, CATALOG) == CATALOG.request("v100-100", 2)
    doc = with_containers([asking(whole), asking(whole)], init=[asking(whole)])
    assert direct_request(doc, CATALOG) == CATALOG.request("v100-100", 2)
    # a sidecar (restartPolicy Always) runs alongside them: sum
    doc = with_containers([asking(whole)], init=[asking(whole, restartPolicy="Always")])
    assert direct_request(doc, CATALOG) == CATALOG.request("v100-100", 2)


@pytest.mark.parametrize("mutate", [
    lambda d: d.__setitem__("spec", []),
    lambda d: d["spec"].__setitem__("containers", {"c": 1}),
    lambda d: d["spec"]["containers"].__setitem__(0, "c"),
    lambda d: d["spec"]["containers"][0].__setitem__("resources", 5),
    lambda d: d["spec"]["containers"][0]["resources"].__setitem__("limits", ["gpuslice.io/v100-25"]),
    lambda d: d["spec"]["containers"][0]["resources"]["limits"].__setitem__("gpuslice.io/v100-25", None),
    lambda d: d["metadata"].__setitem__("annotations", "x"),
    lambda d: d["metadata"]["annotations"].__setitem__("gpuslice.io/product", 3),
])
def test_wrong_types_are_malformed_not_refused(mutate: Any) -> None:
    doc = pod("p", "v100-25")
    mutate(doc)
    with pytest.raises(MalformedPod):
        direct_request(doc, CATALOG)


def test_time_limit_from_deadline_or_annotation() -> None:
    assert time_limit_of(pod("p", "v100-25", time_limit_s=600), CATALOG) == 600.0
    doc = pod("p", "v100-25")
    assert time_limit_of(doc, CATALOG) is None
    doc["metadata"]["annotations"]["gpuslice.io/time-limit"] = "90.5"
    assert time_limit_of(doc, CATALOG) == 90.5
    doc["spec"]["activeDeadlineSeconds"] = 30
    assert time_limit_of(doc, CATALOG) == 30.0  # the enforced deadline wins
    for bad in ("soon", "-1", "0", "nan", "inf"):
        doc = pod("p", "v100-25")
        doc["metadata"]["annotations"]["gpuslice.io/time-limit"] = bad
        with pytest.raises(PodSpecError, match="time-limit"):
            time_limit_of(doc, CATALOG)


def test_reading_a_pod_turns_refusals_into_data_and_needs_a_uid_for_managed_pods() -> None:
    doc = pod("p", "v100-50", namespace="team", priority=7, time_limit_s=60)
    ask = AskReader(CATALOG).read(doc)
    wanted = replace(CATALOG.request("v100-50"), constraints=pod_constraints(doc))  # its default tolerations
    assert (ask.key, ask.request, ask.priority, ask.time_limit_s) == ("team/p", wanted, 7, 60.0)
    refused = AskReader(CATALOG).read(pod("q", extra_resources={"gpuslice.io/v100-75": "1"}))
    assert refused.request is None and refused.refusal is not None and refused.managed
    assert not AskReader(CATALOG).read(pod("r")).managed
    no_uid = pod("s", "v100-25")
    del no_uid["metadata"]["uid"]
    with pytest.raises(MalformedPod, match="uid"):
        AskReader(CATALOG).read(no_uid)
    assert AskReader(CATALOG).read({"metadata": {"name": "cpu"}}).namespace == "default"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.floats(allow_nan=True) | st.text(max_size=12)
    | st.sampled_from(["gpuslice.io/v100-25", "gpuslice.io/v100-100", "nvidia.com/gpu", "1", "2", "limits"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.sampled_from(["spec", "containers", "initContainers", "resources", "limits", "requests", "metadata",
                         "annotations", "gpuslice.io/product", "gpuslice.io/v100-25", "restartPolicy", "uid"]),
        inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_any_json_gives_a_request_none_or_a_pod_spec_error(doc: Any) -> None:
    try:
        result = direct_request(doc, CATALOG, refused=("nvidia.com/gpu",))
    except PodSpecError:
        return
    assert result is None or result.product in {"v100-25", "v100-50", "v100-100"}


def test_a_node_selector_on_the_gpu_product_label_pins_the_model() -> None:
    catalog = load_catalog()
    p = pod("pinned", "v100-50")
    p["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": "Tesla-V100-PCIE-32GB"}
    request = direct_request(p, catalog)
    assert request is not None and request.model == "Tesla-V100-PCIE-32GB" and request.product == "v100-50"
    assert request.accepts_model("Tesla-V100-PCIE-32GB") and not request.accepts_model("Tesla-V100-SXM2-32GB")
    p["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": "Tesla-T4"}
    with pytest.raises(PodSpecError, match="product v100-50 is for Tesla-V100-\\*-32GB GPUs; the claim pins Tesla-T4"):
        direct_request(p, catalog)
    p["spec"]["nodeSelector"] = {"nvidia.com/gpu.product": 7}
    with pytest.raises(MalformedPod, match="nodeSelector"):
        direct_request(p, catalog)


# ---- asks_for: does the pod ask for its record's product (the node agent's check) --------------------

def _asking(how: str | None, product: str = "v100-25") -> dict[str, object]:
    doc = pod("p")
    if how == "resource":
        doc["spec"]["containers"][0]["resources"] = {"limits": {f"gpuslice.io/{product}": "1"}}
    elif how == "annotation":
        doc["metadata"]["annotations"] = {"gpuslice.io/product": f" {product} "}
    elif how == "claim":
        doc["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "any"}]
    return doc


@pytest.mark.parametrize(("how", "asked", "record", "expected"), [
    ("resource", "v100-25", "v100-25", True),
    ("annotation", "v100-25", "v100-25", True),
    ("claim", "", "v100-100", True),  # a claim names its product itself
    ("resource", "v100-25", "v100-100", False),
    ("annotation", "v100-50", "v100-25", False),
    (None, "", "v100-25", False),
    (None, "", None, False),
    ("annotation", "v100-50", None, True),  # a record without a product: any ask will do
])
def test_asks_for_reads_every_way_of_asking(how: str | None, asked: str, record: str | None, expected: bool) -> None:
    assert asks_for(_asking(how, asked or "v100-25"), record, CATALOG) is expected


def test_asks_for_says_malformed_for_wrong_types() -> None:
    doc = pod("p")
    doc["metadata"]["annotations"] = ["not", "a", "map"]
    with pytest.raises(MalformedPod):
        asks_for(doc, "v100-25", CATALOG)
