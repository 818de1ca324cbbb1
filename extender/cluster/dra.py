"""DRA claims: a pod whose ResourceClaim(Template) names one of our DeviceClasses asks for that product.

Each product has a DeviceClass named ``<product>.<resource prefix>`` (``v100-25.gpuslice.io``).
We read each request's ``exactly.deviceClassName`` and ``count`` (resource.k8s.io/v1). Claims
and templates are fetched through the API once and cached: their spec is immutable. A pod's
generated claim (``status.resourceClaimStatuses``) is preferred to its template once it exists.

Kubernetes 1.34 cannot express an 8/16/32 GiB share of one device in DRA itself (consumable
capacity, KEP-5075, is alpha and off), so kube-scheduler's DynamicResources plugin allocates a
token device of the class from a ResourceSlice, and gpuslice decides the real GPU and writes the
allocation record, exactly as for an extended-resource pod (see ``deploy/README.md``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from packing.asks import ClaimUnavailable, pod_claim_refs
from packing.kube.client import KubeError
from packing.products import Catalog, RequestError

Obj = dict[str, Any]
Fetch = Callable[[str, str], Obj | None]  # (namespace, name) -> object, None when absent


def device_class_name(product: str, catalog: Catalog) -> str:
    """The DeviceClass that stands for ``product``."""
    return f"{product}.{catalog.resource_prefix}"


def product_of_device_class(name: str, catalog: Catalog) -> str | None:
    """The product a DeviceClass name stands for; None for a class that is not ours."""
    suffix = "." + catalog.resource_prefix
    if not name.endswith(suffix):
        return None
    product = name[: -len(suffix)]
    return product if any(p.name == product for p in catalog.products) else None


def _ours(klass: Any, catalog: Catalog) -> bool:
    return isinstance(klass, str) and klass.endswith("." + catalog.resource_prefix)


def claim_products(claim_spec: Mapping[str, Any], catalog: Catalog) -> list[tuple[str, int]]:
    """(product, count) for each request of a claim spec that names one of our DeviceClasses.

    RequestError for a request of ours that gpuslice cannot serve (an unknown product, allocation
    mode All, a firstAvailable list, a non-positive count).
    """
    devices = claim_spec.get("devices") if isinstance(claim_spec, Mapping) else None
    requests = devices.get("requests") if isinstance(devices, Mapping) else None
    out: list[tuple[str, int]] = []
    for r in requests if isinstance(requests, list) else []:
        if not isinstance(r, Mapping):
            continue
        alternatives = r.get("firstAvailable")
        if isinstance(alternatives, list) and any(
            isinstance(a, Mapping) and _ours(a.get("deviceClassName"), catalog) for a in alternatives
        ):
            raise RequestError(f"claim request {r.get('name')!r}: firstAvailable is not supported for gpuslice classes")
        exact = r.get("exactly")
        if not isinstance(exact, Mapping):
            exact = r  # v1beta1 put the fields on the request itself
        klass = exact.get("deviceClassName")
        if not _ours(klass, catalog):
            continue
        assert isinstance(klass, str)
        product = product_of_device_class(klass, catalog)
        if product is None:
            raise RequestError(f"DeviceClass {klass} names no product in the gpuslice catalog")
        if exact.get("allocationMode", "ExactCount") != "ExactCount":
            raise RequestError(f"DeviceClass {klass}: only allocationMode ExactCount is supported")
        count = exact.get("count", 1)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise RequestError(f"DeviceClass {klass}: count must be a positive integer, got {count!r}")
        out.append((product, count))
    return out


class ClaimResolver:
    """Resolves a pod's claims to (product, count) through cached API look-ups (thread-safe): the
    ``packing.asks.ClaimLookup`` of cluster mode."""

    def __init__(self, catalog: Catalog, get_template: Fetch, get_claim: Fetch, max_entries: int = 10_000) -> None:
        self.catalog = catalog
        self._get_template = get_template
        self._get_claim = get_claim
        self._cache: dict[tuple[str, str, str], Obj] = {}
        self._lock = threading.Lock()
        self._max = max_entries
        self.lookups = 0  # API reads made (the rest came from the cache)

    def _fetch(self, kind: str, namespace: str, name: str) -> Obj | None:
        key = (kind, namespace, name)
        with self._lock:
            hit = self._cache.get(key)
        if hit is not None:
            return hit
        self.lookups += 1
        try:
            obj = (self._get_template if kind == "template" else self._get_claim)(namespace, name)
        except KubeError as e:
            raise ClaimUnavailable(f"cannot read {kind} {namespace}/{name} now: {e}") from None
        if obj is not None:  # an absent object is looked up again next time: it may be created later
            with self._lock:
                if len(self._cache) >= self._max:
                    self._cache.clear()
                self._cache[key] = obj
        return obj

    def products(self, pod: Mapping[str, Any]) -> list[tuple[str, int]]:
        """Every (product, count) the pod's claims ask for; RequestError for a claim we refuse,
        or for a claim or template that does not exist (yet); ClaimUnavailable when the API cannot
        be read now."""
        meta = pod.get("metadata")
        ns = (meta.get("namespace") if isinstance(meta, Mapping) else None) or "default"
        status = pod.get("status")
        statuses = status.get("resourceClaimStatuses") if isinstance(status, Mapping) else None
        generated = {s.get("name"): s.get("resourceClaimName")
                     for s in (statuses if isinstance(statuses, list) else []) if isinstance(s, Mapping)}
        out: list[tuple[str, int]] = []
        for ref in pod_claim_refs(pod):
            spec: Any = None
            claim_name = ref.get("resourceClaimName") or generated.get(ref.get("name"))
            template_name = ref.get("resourceClaimTemplateName")
            if isinstance(claim_name, str) and claim_name:
                claim = self._fetch("claim", ns, claim_name)
                if claim is not None:
                    spec = claim.get("spec")
                elif not template_name:
                    raise RequestError(f"ResourceClaim {ns}/{claim_name} does not exist")
            if spec is None and isinstance(template_name, str) and template_name:
                template = self._fetch("template", ns, template_name)
                if template is None:
                    raise RequestError(f"ResourceClaimTemplate {ns}/{template_name} does not exist")
                outer = template.get("spec")
                spec = outer.get("spec") if isinstance(outer, Mapping) else None
            if isinstance(spec, Mapping):
                out.extend(claim_products(spec, self.catalog))
        return out
