"""A pod's slice ask in a cluster: extended resource, annotation, or a DRA claim naming our DeviceClass.

``extender.podspec`` reads the first two from the pod alone; a DRA claim needs the API (its
template or claim), resolved through a cached ``ClaimResolver``. A pod asks for one product in
one way: asking twice (a resource and a claim, or two products) is refused with the reason.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import replace
from typing import Any

from extender.cluster.dra import ClaimResolver, pod_claim_refs
from extender.podspec import MalformedPod, PodAsk, PodSpecError, describe_pod, request_of, time_limit_of
from packing.products import Catalog, Request, RequestError


def claim_request(pod: Mapping[str, Any], catalog: Catalog, resolver: ClaimResolver | None) -> Request | None:
    """The slice the pod's DRA claims ask for; None when they name none of our classes.

    PodSpecError for a claim gpuslice refuses; KubeError when the API cannot be read now.
    """
    if resolver is None or not pod_claim_refs(pod):
        return None
    try:
        asks = resolver.products(pod)
    except RequestError as e:
        raise PodSpecError(str(e)) from None
    if not asks:
        return None
    products = {p for p, _ in asks}
    if len(products) > 1:
        raise PodSpecError(f"a pod asks for one product, its claims for {', '.join(sorted(products))}")
    (product,) = products
    try:
        return catalog.request(product, sum(n for _, n in asks))
    except RequestError as e:
        raise PodSpecError(str(e)) from None


def slice_request(
    pod: Mapping[str, Any], catalog: Catalog, resolver: ClaimResolver | None, refused: Collection[str] = ()
) -> Request | None:
    """What the pod asks for, by any of the three ways; PodSpecError when gpuslice refuses it.

    Used at admission, where the pod has no uid yet. KubeError when a claim cannot be read now.
    """
    direct = request_of(pod, catalog, refused=refused)
    claimed = claim_request(pod, catalog, resolver)
    if direct is not None and claimed is not None:
        raise PodSpecError("the pod asks for a slice twice: by resource or annotation and by a DRA claim")
    return direct if direct is not None else claimed


def describe_cluster_pod(
    pod: Mapping[str, Any], catalog: Catalog, resolver: ClaimResolver | None, refused: Collection[str] = ()
) -> PodAsk:
    """``describe_pod`` plus DRA claims. MalformedPod for wrong types; KubeError when the API is away."""
    ask = describe_pod(pod, catalog, refused=refused)
    if ask.refusal is not None or resolver is None or not pod_claim_refs(pod):
        return ask
    try:
        claimed = claim_request(pod, catalog, resolver)
    except PodSpecError as e:
        return _refused(ask, str(e))
    if claimed is None:
        return ask
    if ask.request is not None:
        return _refused(ask, "the pod asks for a slice twice: by resource or annotation and by a DRA claim")
    if not ask.uid:
        raise MalformedPod("Pod.metadata.uid is required for a pod asking for a GPU slice")
    try:
        limit = time_limit_of(pod, catalog)
    except PodSpecError as e:
        return _refused(ask, str(e))
    return replace(ask, request=claimed, time_limit_s=limit)


def _refused(ask: PodAsk, why: str) -> PodAsk:
    return replace(ask, request=None, refusal=why, time_limit_s=None)

