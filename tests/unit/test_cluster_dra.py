"""DRA claims as slice asks: DeviceClass names, claim specs, the cached resolver, the combined ask."""

from __future__ import annotations

from typing import Any

import pytest

from extender.cluster.dra import ClaimResolver, claim_products, device_class_name, product_of_device_class
from packing.asks import AskReader, ClaimUnavailable, PodSpecError, claim_request
from packing.kube.client import KubeError
from packing.products import RequestError, load_catalog

CATALOG = load_catalog()


def spec(*requests: dict[str, Any]) -> dict[str, Any]:
    return {"devices": {"requests": list(requests)}}


def exactly(klass: str, **extra: Any) -> dict[str, Any]:
    return {"name": "gpu", "exactly": {"deviceClassName": klass, **extra}}


class Api:
    """Templates and claims by (namespace, name), counting reads."""

    def __init__(self, templates: dict[tuple[str, str], Any] | None = None,
                 claims: dict[tuple[str, str], Any] | None = None) -> None:
        self.templates = templates or {}
        self.claims = claims or {}
        self.reads: list[tuple[str, str, str]] = []

    def template(self, ns: str, name: str) -> Any:
        self.reads.append(("template", ns, name))
        return self.templates.get((ns, name))

    def claim(self, ns: str, name: str) -> Any:
        self.reads.append(("claim", ns, name))
        return self.claims.get((ns, name))

    def resolver(self) -> ClaimResolver:
        return ClaimResolver(CATALOG, self.template, self.claim)


def template(*requests: dict[str, Any]) -> dict[str, Any]:
    return {"spec": {"spec": spec(*requests)}}


def dra_pod(uid: str = "u1", template_name: str | None = "half", claim_name: str | None = None,
            generated: str | None = None, extra_resources: dict[str, str] | None = None) -> dict[str, Any]:
    ref: dict[str, Any] = {"name": "gpu"}
    if template_name:
        ref["resourceClaimTemplateName"] = template_name
    if claim_name:
        ref["resourceClaimName"] = claim_name
    resources: dict[str, Any] = {"claims": [{"name": "gpu"}]}
    if extra_resources:
        resources["limits"] = extra_resources
    pod: dict[str, Any] = {
        "metadata": {"uid": uid, "name": "p", "namespace": "ns"},
        "spec": {"containers": [{"name": "c", "resources": resources}], "resourceClaims": [ref]},
    }
    if generated:
        pod["status"] = {"resourceClaimStatuses": [{"name": "gpu", "resourceClaimName": generated}]}
    return pod


def test_device_class_names_round_trip() -> None:
    for p in CATALOG.products:
        assert product_of_device_class(device_class_name(p.name, CATALOG), CATALOG) == p.name
    assert product_of_device_class("gpu.nvidia.com", CATALOG) is None
    assert product_of_device_class("v100-33.gpuslice.io", CATALOG) is None


def test_claim_products_reads_v1_and_v1beta1_shapes() -> None:
    assert claim_products(spec(exactly("v100-50.gpuslice.io")), CATALOG) == [("v100-50", 1)]
    flat = {"name": "gpu", "deviceClassName": "v100-100.gpuslice.io", "count": 2}
    assert claim_products(spec(flat), CATALOG) == [("v100-100", 2)]
    assert claim_products(spec(exactly("gpu.nvidia.com")), CATALOG) == []  # another driver's class
    assert claim_products({}, CATALOG) == []


@pytest.mark.parametrize("request_, message", [
    (exactly("v100-33.gpuslice.io"), "names no product"),
    (exactly("v100-25.gpuslice.io", allocationMode="All"), "ExactCount"),
    (exactly("v100-25.gpuslice.io", count=0), "positive"),
    (exactly("v100-25.gpuslice.io", count=True), "positive"),
    ({"name": "gpu", "firstAvailable": [{"name": "a", "deviceClassName": "v100-25.gpuslice.io"}]}, "firstAvailable"),
])
def test_claim_products_refuses_what_it_cannot_serve(request_: dict[str, Any], message: str) -> None:
    with pytest.raises(RequestError, match=message):
        claim_products(spec(request_), CATALOG)


def test_resolver_caches_templates() -> None:
    api = Api({("ns", "half"): template(exactly("v100-50.gpuslice.io"))})
    resolver = api.resolver()
    for _ in range(3):
        assert resolver.products(dra_pod()) == [("v100-50", 1)]
    assert api.reads == [("template", "ns", "half")]


def test_resolver_prefers_the_generated_claim_and_looks_absent_ones_up_again() -> None:
    api = Api({("ns", "half"): template(exactly("v100-50.gpuslice.io"))},
              {("ns", "p-gpu-1"): {"spec": spec(exactly("v100-25.gpuslice.io"))}})
    resolver = api.resolver()
    assert resolver.products(dra_pod(generated="p-gpu-1")) == [("v100-25", 1)]
    assert resolver.products(dra_pod(generated="p-gpu-2")) == [("v100-50", 1)]  # claim not there yet
    assert resolver.products(dra_pod(generated="p-gpu-2")) == [("v100-50", 1)]
    assert api.reads.count(("claim", "ns", "p-gpu-2")) == 2  # a missing object is not cached


def test_resolver_refuses_missing_template_and_claim() -> None:
    resolver = Api().resolver()
    with pytest.raises(RequestError, match="ResourceClaimTemplate ns/half does not exist"):
        resolver.products(dra_pod())
    with pytest.raises(RequestError, match="ResourceClaim ns/c1 does not exist"):
        resolver.products(dra_pod(template_name=None, claim_name="c1"))


def test_claim_request_combines_counts_and_refuses_two_products() -> None:
    api = Api({("ns", "two-whole"): template(exactly("v100-100.gpuslice.io"), exactly("v100-100.gpuslice.io")),
               ("ns", "mixed"): template(exactly("v100-100.gpuslice.io"), exactly("v100-25.gpuslice.io")),
               ("ns", "two-quarters"): template(exactly("v100-25.gpuslice.io", count=2))})
    resolver = api.resolver()
    whole = claim_request(dra_pod(template_name="two-whole"), CATALOG, resolver)
    assert whole is not None and (whole.product, whole.count) == ("v100-100", 2)
    with pytest.raises(PodSpecError, match="one product"):
        claim_request(dra_pod(template_name="mixed"), CATALOG, resolver)
    with pytest.raises(PodSpecError, match="fractional"):
        claim_request(dra_pod(template_name="two-quarters"), CATALOG, resolver)


def test_reading_turns_a_dra_pod_into_a_slice_ask() -> None:
    resolver = Api({("ns", "half"): template(exactly("v100-50.gpuslice.io"))}).resolver()
    ask = AskReader(CATALOG, claims=resolver).read(dra_pod())
    assert ask.request is not None and ask.request.product == "v100-50" and ask.refusal is None
    # without a resolver (or without claims) it is the plain pod description
    assert AskReader(CATALOG, claims=None).read(dra_pod()).request is None


def test_asking_twice_is_refused() -> None:
    resolver = Api({("ns", "half"): template(exactly("v100-50.gpuslice.io"))}).resolver()
    pod = dra_pod(extra_resources={"gpuslice.io/v100-25": "1"})
    ask = AskReader(CATALOG, claims=resolver).read(pod)
    assert ask.request is None and ask.refusal is not None and "twice" in ask.refusal
    with pytest.raises(PodSpecError, match="twice"):
        AskReader(CATALOG, claims=resolver).request(pod)


def test_claims_of_other_drivers_ask_for_nothing() -> None:
    resolver = Api({("ns", "half"): template(exactly("gpu.nvidia.com"))}).resolver()
    assert AskReader(CATALOG, claims=resolver).read(dra_pod()).request is None
    assert AskReader(CATALOG, claims=resolver).request(dra_pod()) is None


def test_the_request_needs_no_uid_at_admission() -> None:
    resolver = Api({("ns", "half"): template(exactly("v100-50.gpuslice.io"))}).resolver()
    pod = dra_pod(uid="")
    request = AskReader(CATALOG, claims=resolver).request(pod)
    assert request is not None and request.milli == 500


def test_an_api_that_cannot_be_read_is_unavailable_not_a_refusal() -> None:
    def away(namespace: str, name: str) -> Any:
        raise KubeError(0, "connection refused")

    reader = AskReader(CATALOG, claims=ClaimResolver(CATALOG, away, away))
    with pytest.raises(ClaimUnavailable, match="connection refused"):
        reader.read(dra_pod())
    with pytest.raises(ClaimUnavailable):
        reader.request(dra_pod())
