"""What a pod asks for: pod JSON -> a slice ``Request`` (or nothing gpuslice manages), in one place.

Three ways of asking, one catalog: an extended resource per product (``gpuslice.io/v100-50: 1``
in a container's requests or limits; count > 1 only for whole cards), the pod annotation
``gpuslice.io/product: v100-50``, or a DRA claim whose request names a product's DeviceClass. The
first two are read from the pod alone; a claim needs its ResourceClaim or template, which the
``ClaimLookup`` given to ``AskReader`` fetches (cluster mode: ``extender.cluster.dra.ClaimResolver``;
standalone: none, claims are not read). A pod asks for one product in one way: asking twice is
refused with the reason.

Three error types: ``MalformedPod`` for a body no API server would produce (wrong JSON types; the
HTTP layer answers 400), ``PodSpecError`` for a well-formed pod asking for something gpuslice
refuses (unknown product, a bare whole-GPU resource on a shared pool): that pod fails every node
with the message as its reason, and ``ClaimUnavailable`` when a claim cannot be read right now.
"""

from __future__ import annotations

import math
import re
from collections.abc import Collection, Mapping
from dataclasses import dataclass, replace
from typing import Any, Protocol

from packing.claims import MemberOf
from packing.constraints import MalformedConstraints, pod_constraints
from packing.inventory import PRODUCT_LABEL
from packing.pod_group import GroupError, group_of
from packing.products import Catalog, Request, RequestError

_WHOLE_NUMBER = re.compile(r"[0-9]+")  # ASCII digits only: str.isdigit() also takes "²", which int() refuses
MAX_DIGITS = 18  # far above any slice count, and within what a quantity and a Go int64 hold


class PodSpecError(ValueError):
    """A well-formed pod whose GPU ask gpuslice refuses; the message is the per-node reason."""


class MalformedPod(PodSpecError):
    """The pod JSON has wrong types where the Kubernetes API guarantees a shape."""


class ClaimUnavailable(Exception):
    """A DRA claim (or its template) of the pod cannot be read now; asking again later may work."""


class ClaimLookup(Protocol):
    """Reads a pod's DRA claims: (product, count) for each request naming one of our DeviceClasses."""

    def products(self, pod: Mapping[str, Any]) -> list[tuple[str, int]]:
        """RequestError for a claim gpuslice refuses; ClaimUnavailable when it cannot be read now."""


@dataclass(frozen=True, slots=True)
class PodAsk:
    """What the extender remembers about one pod between filter and bind (bind carries no spec)."""

    uid: str
    name: str
    namespace: str
    request: Request | None  # None: the pod asks for nothing gpuslice manages
    refusal: str | None = None  # set when gpuslice refuses the pod's ask
    time_limit_s: float | None = None  # declared runtime, for the queue
    priority: int = 0
    group: MemberOf | None = None  # its pod group (a gang): labels gpuslice.io/pod-group, -size

    @property
    def managed(self) -> bool:
        return self.request is not None or self.refusal is not None

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def product_annotation(catalog: Catalog) -> str:
    return f"{catalog.resource_prefix}/product"


def time_limit_annotation(catalog: Catalog) -> str:
    return f"{catalog.resource_prefix}/time-limit"


def _mapping(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise MalformedPod(f"{where} must be an object, got {type(value).__name__}")
    return value


def _list(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise MalformedPod(f"{where} must be a list, got {type(value).__name__}")
    return value


def _count(value: Any, where: str) -> int:
    """An extended-resource quantity: a whole number, as the API server serializes it ("2")."""
    if isinstance(value, bool):
        raise MalformedPod(f"{where} must be a quantity, got {value!r}")
    if isinstance(value, int):
        count = value
    elif isinstance(value, str):
        text = value.strip()
        if not _WHOLE_NUMBER.fullmatch(text) or len(text) > MAX_DIGITS:
            raise PodSpecError(f"{where} = {value[:40]!r}: slices are counted in whole numbers")
        count = int(text)
    elif isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            raise PodSpecError(f"{where} = {value!r}: slices are counted in whole numbers")
        count = int(value)
    else:
        raise MalformedPod(f"{where} must be a quantity, got {type(value).__name__}")
    if count < 0:
        raise PodSpecError(f"{where} = {value!r} must not be negative")
    return count


def _container_asks(container: Any, where: str, wanted: set[str] | None, prefix: str) -> dict[str, int]:
    """Resource -> count for one container: limits win (requests default to limits)."""
    if not isinstance(container, Mapping):
        raise MalformedPod(f"{where} must be an object")
    resources = _mapping(container.get("resources"), f"{where}.resources")
    requests = _mapping(resources.get("requests"), f"{where}.resources.requests")
    limits = _mapping(resources.get("limits"), f"{where}.resources.limits")
    asks: dict[str, int] = {}
    for name in set(requests) | set(limits):
        if not isinstance(name, str):
            raise MalformedPod(f"{where}: resource names must be strings")
        if not (name.startswith(prefix) or (wanted is not None and name in wanted)):
            continue  # cpu, memory and other vendors' resources are kube-scheduler's business
        req = _count(requests[name], f"{where}.resources.requests[{name}]") if name in requests else None
        lim = _count(limits[name], f"{where}.resources.limits[{name}]") if name in limits else None
        if req is not None and lim is not None and req != lim:
            raise PodSpecError(f"{name}: requests ({req}) and limits ({lim}) differ; they must be equal")
        asks[name] = lim if lim is not None else (req or 0)
    return asks


def resource_asks(pod: Mapping[str, Any], prefix: str, also: Collection[str] = ()) -> dict[str, int]:
    """The pod's effective count of each resource under ``prefix/`` (and each name in ``also``).

    Kubernetes semantics: app containers and restartable (sidecar) init containers add up; a plain
    init container runs alone, so the pod needs the larger of that sum and any one init container.
    """
    spec = _mapping(pod.get("spec"), "Pod.spec")
    wanted = set(also) or None
    head = prefix + "/"
    total: dict[str, int] = {}
    init_peak: dict[str, int] = {}
    for i, c in enumerate(_list(spec.get("containers"), "Pod.spec.containers")):
        for name, n in _container_asks(c, f"containers[{i}]", wanted, head).items():
            total[name] = total.get(name, 0) + n
    for i, c in enumerate(_list(spec.get("initContainers"), "Pod.spec.initContainers")):
        asks = _container_asks(c, f"initContainers[{i}]", wanted, head)
        sidecar = isinstance(c, Mapping) and c.get("restartPolicy") == "Always"
        for name, n in asks.items():
            if sidecar:
                total[name] = total.get(name, 0) + n
            else:
                init_peak[name] = max(init_peak.get(name, 0), n)
    for name, n in init_peak.items():
        total[name] = max(total.get(name, 0), n)
    return {name: n for name, n in total.items() if n > 0}


def direct_request(pod: Mapping[str, Any], catalog: Catalog, *, refused: Collection[str] = ()) -> Request | None:
    """The slice the pod asks for by extended resource or annotation; None when it asks for neither.

    ``refused``: resource names (e.g. ``nvidia.com/gpu``) that must not be used on this pool;
    asking for one raises PodSpecError. MalformedPod for wrong JSON types.
    """
    if not isinstance(pod, Mapping):
        raise MalformedPod("Pod must be an object")
    asks = resource_asks(pod, catalog.resource_prefix, refused)
    for name in sorted(asks):
        if name in refused:
            whole = next((p.resource for p in catalog.products if p.whole), None)
            instead = f"; ask for {whole} instead" if whole else ""
            raise PodSpecError(f"{name} asks for whole GPUs outside gpuslice on a shared pool{instead}")
    products: dict[str, int] = {}
    for name, count in asks.items():
        offered = catalog.product_for_resource(name)
        if offered is None:
            known = ", ".join(sorted(p.resource for p in catalog.products))
            raise PodSpecError(f"unknown product resource {name}; this catalog offers {known}")
        products[offered.name] = count
    metadata = _mapping(pod.get("metadata"), "Pod.metadata")
    annotations = _mapping(metadata.get("annotations"), "Pod.metadata.annotations")
    named = annotations.get(product_annotation(catalog))
    if named is not None and not isinstance(named, str):
        raise MalformedPod(f"annotation {product_annotation(catalog)} must be a string")
    if len(products) > 1:
        raise PodSpecError(f"a pod asks for one product, this one for {', '.join(sorted(products))}")
    pin = model_pin(pod)
    try:
        if products:
            (product, count), = products.items()
            if named is not None and named.strip() != product:
                raise PodSpecError(
                    f"annotation {product_annotation(catalog)}={named!r} disagrees with resource {product}"
                )
            return catalog.request(product, count, model=pin)
        if named is not None:
            return catalog.request(named.strip(), model=pin)
    except RequestError as e:
        raise PodSpecError(str(e)) from None
    return None


def pod_claim_refs(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The pod's ``spec.resourceClaims`` entries."""
    spec = pod.get("spec")
    refs = spec.get("resourceClaims") if isinstance(spec, Mapping) else None
    return [r for r in refs if isinstance(r, Mapping)] if isinstance(refs, list) else []


def claim_request(pod: Mapping[str, Any], catalog: Catalog, claims: ClaimLookup | None) -> Request | None:
    """The slice the pod's DRA claims ask for; None when they name none of our classes (or none are read).

    PodSpecError for a claim gpuslice refuses; ClaimUnavailable when one cannot be read now.
    """
    if claims is None or not pod_claim_refs(pod):
        return None
    try:
        asks = claims.products(pod)
    except RequestError as e:
        raise PodSpecError(str(e)) from None
    if not asks:
        return None
    products = {p for p, _ in asks}
    if len(products) > 1:
        raise PodSpecError(f"a pod asks for one product, its claims for {', '.join(sorted(products))}")
    (product,) = products
    try:
        return catalog.request(product, sum(n for _, n in asks), model=model_pin(pod))
    except RequestError as e:
        raise PodSpecError(str(e)) from None


def asks_for(pod: Mapping[str, Any], product: str | None, catalog: Catalog) -> bool:
    """Does ``pod`` ask for ``product`` (any product when None), as far as the pod alone says? By the
    extended resource ``<prefix>/<product>``, by the annotation naming it, or by a DRA claim (which
    product a claim names is the claim's to say, so any claim counts). The node agent hands a card
    only to a pod that asks for its record's product. MalformedPod for wrong JSON types."""
    prefix = catalog.resource_prefix + "/"
    resources = {name.removeprefix(prefix) for name in resource_asks(pod, catalog.resource_prefix)}
    metadata = _mapping(pod.get("metadata"), "Pod.metadata")
    named = _mapping(metadata.get("annotations"), "Pod.metadata.annotations").get(product_annotation(catalog))
    if isinstance(named, str) and named.strip():
        resources.add(named.strip())
    if product is None:
        return bool(resources) or bool(pod_claim_refs(pod))
    return product in resources or (not resources and bool(pod_claim_refs(pod)))


def model_pin(pod: Mapping[str, Any]) -> str | None:
    """The GPU model a pod pins by node selector on the GPU product label, or None."""
    spec = _mapping(pod.get("spec"), "Pod.spec")
    selector = _mapping(spec.get("nodeSelector"), "Pod.spec.nodeSelector")
    pin = selector.get(PRODUCT_LABEL)
    if pin is not None and not isinstance(pin, str):
        raise MalformedPod(f"Pod.spec.nodeSelector.{PRODUCT_LABEL} must be a string")
    return pin or None


def time_limit_of(pod: Mapping[str, Any], catalog: Catalog) -> float | None:
    """Declared runtime in seconds: ``spec.activeDeadlineSeconds``, else the time-limit annotation."""
    spec = _mapping(pod.get("spec"), "Pod.spec")
    deadline = spec.get("activeDeadlineSeconds")
    if deadline is not None:
        if isinstance(deadline, bool) or not isinstance(deadline, int) or deadline <= 0:
            raise MalformedPod("Pod.spec.activeDeadlineSeconds must be a positive integer")
        return float(deadline)
    metadata = _mapping(pod.get("metadata"), "Pod.metadata")
    annotations = _mapping(metadata.get("annotations"), "Pod.metadata.annotations")
    key = time_limit_annotation(catalog)
    raw = annotations.get(key)
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise MalformedPod(f"annotation {key} must be a string")
    try:
        seconds = float(raw)
    except ValueError:
        raise PodSpecError(f"annotation {key}={raw[:40]!r} is not a number of seconds") from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise PodSpecError(f"annotation {key}={raw[:40]!r} must be a positive number of seconds")
    return seconds


def _str_field(doc: Mapping[str, Any], key: str, where: str) -> str:
    value = doc.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise MalformedPod(f"{where}.{key} must be a string")
    return value


@dataclass(frozen=True, slots=True)
class AskReader:
    """Turns a pod into what it asks for, by any of the three ways, under one catalog and refusal list."""

    catalog: Catalog
    refused: tuple[str, ...] = ()
    claims: ClaimLookup | None = None  # DRA claim look-up; None: claims are not read

    def request(self, pod: Mapping[str, Any]) -> Request | None:
        """The slice ``pod`` asks for (admission: the pod has no uid yet).

        PodSpecError when gpuslice refuses it (MalformedPod for wrong types); ClaimUnavailable when
        one of its claims cannot be read now.
        """
        direct = direct_request(pod, self.catalog, refused=self.refused)
        claimed = claim_request(pod, self.catalog, self.claims)
        if direct is not None and claimed is not None:
            raise PodSpecError("the pod asks for a slice twice: by resource or annotation and by a DRA claim")
        return direct if direct is not None else claimed

    def read(self, pod: Any) -> PodAsk:
        """Everything the extender needs from a pod: identity, request (with its node selector, required
        node affinity and tolerations) or refusal, runtime, priority, pod group (a bad one is a refusal).

        MalformedPod for wrong types, and for a pod gpuslice manages that has no ``metadata.uid``
        (reservations and bind are keyed by it); ClaimUnavailable as for ``request``. A refusal is
        returned, not raised.
        """
        if not isinstance(pod, Mapping):
            raise MalformedPod("Pod must be an object")
        metadata = _mapping(pod.get("metadata"), "Pod.metadata")
        uid = _str_field(metadata, "uid", "Pod.metadata")
        name = _str_field(metadata, "name", "Pod.metadata")
        namespace = _str_field(metadata, "namespace", "Pod.metadata") or "default"
        spec = _mapping(pod.get("spec"), "Pod.spec")
        priority = spec.get("priority", 0)
        if priority is None:
            priority = 0
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise MalformedPod("Pod.spec.priority must be an integer")
        ask = PodAsk(uid, name, namespace, None, None, None, priority)
        try:
            request = self.request(pod)
            limit = time_limit_of(pod, self.catalog) if request is not None else None
            if request is not None:  # where it may go travels with what it asks for (packing.node_fit)
                request = replace(request, constraints=pod_constraints(pod))
            group = group_of(pod) if request is not None else None
        except MalformedConstraints as e:
            raise MalformedPod(str(e)) from None
        except MalformedPod:
            raise
        except (PodSpecError, GroupError) as e:
            ask = replace(ask, refusal=str(e))
        else:
            ask = replace(ask, request=request, time_limit_s=limit, group=group)
        if ask.managed and not uid:
            raise MalformedPod("Pod.metadata.uid is required for a pod asking for a GPU slice")
        return ask
