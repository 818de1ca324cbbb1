"""``gpuslice gates``: what each listed pod asks for, read by the ask parser; the lift is the queue's patch."""

from __future__ import annotations

from typing import Any

from extender.gates import lift, product_of
from extender.samples import pod
from packing.gate import GATE, lift_patch


def test_product_of_reads_every_way_of_asking() -> None:
    assert product_of(pod("a", "v100-50")) == "v100-50"
    whole = pod("b", "v100-100")
    whole["spec"]["containers"][0]["resources"] = {"limits": {"gpuslice.io/v100-100": "2"}}
    assert product_of(whole) == "v100-100 x2"
    by_annotation = pod("c")
    by_annotation["metadata"]["annotations"] = {"gpuslice.io/product": " v100-25 "}
    assert product_of(by_annotation) == "v100-25"
    by_claim = pod("d")
    by_claim["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "v100-25"}]
    assert product_of(by_claim) == "claim v100-25"
    assert product_of(pod("e")) == "-"
    broken = pod("f", "v100-25")
    broken["spec"]["containers"][0]["resources"]["limits"] = {"gpuslice.io/v100-25": "1.5"}
    assert product_of(broken).startswith("unreadable:")


class Recorder:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any, str]] = []

    def request(self, method: str, path: str, body: Any = None, *, content_type: str = "", **_: Any) -> dict[str, Any]:
        self.calls.append((method, path, body, content_type))
        return {}


def test_lift_sends_the_queues_own_patch_and_skips_a_pod_lifted_meanwhile() -> None:
    kube = Recorder()
    p = pod("g", "v100-25")
    p["spec"]["schedulingGates"] = [{"name": "team.io/hold"}, {"name": GATE}]
    lift(kube, p)  # type: ignore[arg-type]
    (method, path, body, content_type), = kube.calls
    assert (method, path, content_type) == ("PATCH", "/api/v1/namespaces/default/pods/g", "application/json-patch+json")
    assert body == lift_patch(p["metadata"]["uid"], 1)
    p["spec"]["schedulingGates"] = [{"name": "team.io/hold"}]
    lift(kube, p)  # type: ignore[arg-type]
    assert len(kube.calls) == 1
