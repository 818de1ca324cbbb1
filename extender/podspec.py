"""How a pod asks for a slice: pod JSON -> packing Request (or None when it asks for nothing we manage).

Two ways today (issue 5 adds DRA claims): an extended resource per product
(``gpuslice.io/v100-50: 1`` in a container's requests or limits; count > 1 only for whole cards),
or the pod annotation ``gpuslice.io/product: v100-50``. Both name products from the catalog, so
the resource prefix and the product names are data, not code.

Two error types: ``MalformedPod`` for a body no API server would produce (wrong JSON types; the
HTTP layer answers 400), and ``PodSpecError`` for a well-formed pod asking for something we
refuse (unknown product, a bare whole-GPU resource on a shared pool): that pod fails every node
with the error's message as its reason.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from packing.products import Catalog, Request, RequestError


class PodSpecError(ValueError):
    """A well-formed pod whose GPU ask gpuslice refuses; the message is the per-node reason."""


class MalformedPod(PodSpecError):
    """The pod JSON has wrong types where the Kubernetes API guarantees a shape."""


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
        if not text.isdigit():
            raise PodSpecError(f"{where} = {value!r}: slices are counted in whole numbers")
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


def request_of(pod: Mapping[str, Any], catalog: Catalog, *, refused: Collection[str] = ()) -> Request | None:
    """The slice ``pod`` asks for, or None when it asks for nothing gpuslice manages.

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
    try:
        if products:
            (product, count), = products.items()
            if named is not None and named.strip() != product:
                raise PodSpecError(
                    f"annotation {product_annotation(catalog)}={named!r} disagrees with resource {product}"
                )
            return catalog.request(product, count)
        if named is not None:
            return catalog.request(named.strip())
    except RequestError as e:
        raise PodSpecError(str(e)) from None
    return None


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
        raise PodSpecError(f"annotation {key}={raw!r} is not a number of seconds") from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise PodSpecError(f"annotation {key}={raw!r} must be a positive number of seconds")
    return seconds


def _str_field(doc: Mapping[str, Any], key: str, where: str) -> str:
    value = doc.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise MalformedPod(f"{where}.{key} must be a string")
    return value


def describe_pod(pod: Any, catalog: Catalog, *, refused: Collection[str] = ()) -> PodAsk:
    """Everything the extender needs from a pod: identity, request or refusal, runtime, priority.

    MalformedPod for wrong types, and for a pod gpuslice manages that has no ``metadata.uid``
    (reservations and bind are keyed by it). A refusal is returned, not raised.
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
    request: Request | None = None
    refusal: str | None = None
    limit: float | None = None
    try:
        request = request_of(pod, catalog, refused=refused)
        limit = time_limit_of(pod, catalog) if request is not None else None
    except MalformedPod:
        raise
    except PodSpecError as e:
        request, refusal = None, str(e)
    if (request is not None or refusal is not None) and not uid:
        raise MalformedPod("Pod.metadata.uid is required for a pod asking for a GPU slice")
    return PodAsk(uid, name, namespace, request, refusal, limit, priority)
