"""Entitlements from the ConfigMap ``gpuslice-entitlements`` in the extender's namespace.

One key per namespace; its value caps what that namespace may hold at once, e.g.::

    data:
      team-a: "v100-25=8,v100-100=2,milli=4000"   # 8 quarters, 2 whole cards, 4 cards' worth in all
      team-b: "v100-50=4"

Product names come from the catalog; ``milli`` caps the namespace's total milli-GPU. A namespace
without a key is not capped (quota is an entitlement, not a reservation: it never sets capacity
aside). Why a ConfigMap and not a ResourceQuota: core ResourceQuota counts DRA *devices*, not
capacity, and only at claim creation, and its usage is computed by kube-controller-manager, which
gpuslice would then have to trust for a number it must enforce itself in queue order. A ConfigMap
is read once per change and states the caps in the products users ask for.
"""

from __future__ import annotations

from collections.abc import Mapping

from packing.entitlements import Entitlement, EntitlementError
from packing.products import Catalog

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


def changes(
    before: Mapping[str, Entitlement], good: Mapping[str, Entitlement], bad: Mapping[str, str]
) -> tuple[dict[str, Entitlement | None], dict[str, Entitlement]]:
    """What to apply to the queue, and the entitlements in force afterwards.

    A namespace whose new value is malformed keeps its previous entitlement (bad input changes
    nothing); a namespace whose key was removed is no longer capped.
    """
    apply: dict[str, Entitlement | None] = {}
    after: dict[str, Entitlement] = {}
    for namespace in set(before) | set(good) | set(bad):
        if namespace in good:
            after[namespace] = good[namespace]
            if before.get(namespace) != good[namespace]:
                apply[namespace] = good[namespace]
        elif namespace in bad:
            if namespace in before:
                after[namespace] = before[namespace]
        else:
            apply[namespace] = None
    return apply, after
