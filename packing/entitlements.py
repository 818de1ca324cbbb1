"""Entitlements: how many slices of each product a namespace may hold at once.

Quota is an entitlement, not a reservation: it caps what a namespace holds, it never sets capacity
aside. A claim that would take its namespace over its entitlement waits (``QuotaExceeded``) without
consuming capacity; one within its entitlement waits only for a free slice. Products a namespace's
entitlement does not name are not capped per product (only by ``max_milli`` when set), the way a
Kubernetes ResourceQuota leaves unnamed resources alone; a namespace without an entitlement is not
capped at all.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from packing.products import Catalog, Request


class EntitlementError(ValueError):
    """An entitlement with a negative or non-integer cap."""


def product_name(request: Request) -> str:
    """The product a request is counted under: its catalog name, else its size (``250-milli``)."""
    if request.product:
        return request.product
    return f"{request.milli}-milli" if request.count else "cpu-only"


def slices_of(request: Request) -> int:
    """Slices a request holds: one per GPU (k whole cards are k slices)."""
    return request.count


@dataclass(frozen=True)
class Entitlement:
    """A namespace may hold at most ``max_slices[product]`` slices of a product and ``max_milli`` in all."""

    max_slices: dict[str, int] = field(default_factory=dict)
    max_milli: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.max_slices, Mapping):
            raise EntitlementError(f"max_slices must map product names to counts, got {self.max_slices!r}")
        for product, cap in self.max_slices.items():
            if not isinstance(product, str) or not product:
                raise EntitlementError(f"entitlement names a product {product!r}; product names are strings")
            if not _count(cap):
                raise EntitlementError(f"entitlement for {product}: {cap!r} is not a whole number >= 0")
        if self.max_milli is not None and not _count(self.max_milli):
            raise EntitlementError(f"max_milli {self.max_milli!r} is not a whole number >= 0")
        # a private copy: a caller mutating its dict later must not change a running entitlement
        object.__setattr__(self, "max_slices", dict(self.max_slices))


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


@dataclass(frozen=True)
class Usage:
    """What a namespace holds now: slices per product and milli-GPU in total."""

    slices: dict[str, int] = field(default_factory=dict)
    milli: int = 0

    def held(self, product: str) -> int:
        """Slices of ``product`` held."""
        return self.slices.get(product, 0)


class UsageBook:
    """Running totals per namespace, kept in step with the claims that hold slices."""

    def __init__(self) -> None:
        self._slices: dict[str, dict[str, int]] = {}
        self._milli: dict[str, int] = {}

    def add(self, namespace: str, request: Request) -> None:
        """Count a claim that now holds its slice."""
        per = self._slices.setdefault(namespace, {})
        product = product_name(request)
        per[product] = per.get(product, 0) + slices_of(request)
        self._milli[namespace] = self._milli.get(namespace, 0) + request.total_milli

    def remove(self, namespace: str, request: Request) -> None:
        """Stop counting a claim that gave its slice back (it must have been added)."""
        per = self._slices[namespace]
        product = product_name(request)
        per[product] -= slices_of(request)
        if per[product] == 0:
            del per[product]
        self._milli[namespace] -= request.total_milli
        if not per and self._milli[namespace] == 0:
            del self._slices[namespace]
            del self._milli[namespace]

    def of(self, namespace: str) -> Usage:
        """A snapshot of what ``namespace`` holds."""
        return Usage(dict(self._slices.get(namespace, {})), self._milli.get(namespace, 0))

    def held(self, namespace: str, product: str) -> int:
        """Slices of ``product`` that ``namespace`` holds."""
        return self._slices.get(namespace, {}).get(product, 0)

    def milli(self, namespace: str) -> int:
        """Milli-GPU that ``namespace`` holds in total."""
        return self._milli.get(namespace, 0)

    def namespaces(self) -> list[str]:
        """Namespaces holding anything."""
        return sorted(self._slices)


def shortfall(
    entitlement: Entitlement | None, namespace: str, request: Request, book: UsageBook
) -> str | None:
    """Why admitting ``request`` now would take ``namespace`` over its entitlement; None when it would not."""
    if entitlement is None or request.gpu_less:
        return None
    product = product_name(request)
    need = slices_of(request)
    cap = entitlement.max_slices.get(product)
    if cap is not None:
        held = book.held(namespace, product)
        if held + need > cap:
            return (f"namespace {namespace} holds {held} of its {cap} {product} slice(s); "
                    f"this claim needs {need} more")
    if entitlement.max_milli is not None:
        held_milli = book.milli(namespace)
        if held_milli + request.total_milli > entitlement.max_milli:
            return (f"namespace {namespace} holds {held_milli} of its {entitlement.max_milli} milli-GPU; "
                    f"this claim needs {request.total_milli} more")
    return None


# ---- the text form: the ConfigMap gpuslice-entitlements (the extender), --entitlements FILE (the simulator) ----

MILLI_KEY = "milli"


class EntitlementsError(ValueError):
    """A ConfigMap value that is not a valid entitlement (the namespace keeps its previous one)."""


def parse_entitlement(text: str, catalog: Catalog, namespace: str = "") -> Entitlement:
    """``v100-25=8,v100-100=2,milli=4000`` -> Entitlement; EntitlementsError names what is wrong."""
    where = f"entitlement of namespace {namespace}" if namespace else "entitlement"
    caps: dict[str, int] = {}
    milli: int | None = None
    known = {p.name for p in catalog.products}
    for part in (p.strip() for p in text.replace("\n", ",").split(",")):
        if not part:
            continue
        key, sep, raw = (s.strip() for s in part.partition("="))
        if not sep or not key:
            raise EntitlementsError(f"{where}: {part!r} is not PRODUCT=COUNT")
        if not raw.isdigit():
            raise EntitlementsError(f"{where}: {key}={raw!r} is not a whole number >= 0")
        value = int(raw)
        if key == MILLI_KEY:
            milli = value
        elif key in known:
            if key in caps:
                raise EntitlementsError(f"{where}: {key} is given twice")
            caps[key] = value
        else:
            raise EntitlementsError(f"{where}: unknown product {key!r}; the catalog offers {', '.join(sorted(known))}")
    try:
        return Entitlement(caps, milli)
    except EntitlementError as e:
        raise EntitlementsError(f"{where}: {e}") from None


def parse_configmap(
    data: Mapping[str, object] | None, catalog: Catalog
) -> tuple[dict[str, Entitlement], dict[str, str]]:
    """Every namespace's entitlement in a ConfigMap's ``data``, and an error per key it could not read."""
    good: dict[str, Entitlement] = {}
    bad: dict[str, str] = {}
    for namespace, value in (data or {}).items():
        if not isinstance(value, str):
            bad[namespace] = f"entitlement of namespace {namespace}: value must be a string"
            continue
        try:
            good[namespace] = parse_entitlement(value, catalog, namespace)
        except EntitlementsError as e:
            bad[namespace] = str(e)
    return good, bad
