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

from packing.entitlements import MILLI_KEY, Entitlement, EntitlementsError, parse_configmap, parse_entitlement

# the text form's parsers live in packing (the simulator's --entitlements reads the same form)
__all__ = ["MILLI_KEY", "EntitlementsError", "changes", "parse_configmap", "parse_entitlement"]


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
