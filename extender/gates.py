"""``gpuslice gates``: the pods that still carry gpuslice's scheduling gate, listed or lifted.

For an uninstall (README, "Uninstall"): once the webhook is gone no new pod is gated, but pods
gated before wait ``SchedulingGated`` until gpuslice's queue lifts the gate, and after the extender
is gone nothing would. ``gpuslice gates`` lists them (namespace, name, product, age, scheduler);
``--lift`` removes the gate (``packing.gate.lift_patch``, the queue's own: it tests that the pod is
still the one listed and the gate still where it was read), so kube-scheduler takes them at once,
outside the queue's order and entitlements.
A pod routed to the gpuslice scheduler (spec.schedulerName, immutable) still needs that scheduler:
lift before removing it, or delete such pods and let their controllers recreate them.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from packing import gate
from packing.argtypes import dns_label, readable_file
from packing.asks import MalformedPod, PodSpecError, pod_claim_refs, product_annotation, resource_asks
from packing.kube.client import JSON_PATCH, Kube, KubeError, current_namespace, operator_kube, parse_time, q
from packing.products import Catalog, load_catalog
from packing.usage import CommandParser


def gated(kube: Kube, namespace: str | None) -> list[dict[str, Any]]:
    """The pods (of ``namespace``, or all) that carry the gate, oldest first."""
    path = f"/api/v1/namespaces/{q(namespace)}/pods" if namespace else "/api/v1/pods"
    items = kube.request("GET", path).get("items") or []
    found = [p for p in items if gate.gated(p)]
    return sorted(found, key=lambda p: (p["metadata"].get("creationTimestamp") or "", p["metadata"]["name"]))


@functools.cache
def _built_in() -> Catalog:
    return load_catalog()


def product_of(pod: Mapping[str, Any], catalog: Catalog | None = None) -> str:
    """What the pod asks for, as its spec says (read by ``packing.asks``; a claim is named, not resolved)."""
    catalog = catalog or _built_in()
    try:
        asks = resource_asks(pod, catalog.resource_prefix)
    except (MalformedPod, PodSpecError) as e:
        return f"unreadable: {e}"
    if asks:
        return ",".join(f"{name.removeprefix(catalog.resource_prefix + '/')}" + (f" x{n}" if n > 1 else "")
                        for name, n in sorted(asks.items()))
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    named = annotations.get(product_annotation(catalog)) if isinstance(annotations, Mapping) else None
    if isinstance(named, str) and named.strip():
        return named.strip()
    refs = pod_claim_refs(pod)
    if refs:
        return "claim " + ",".join(str(r.get("resourceClaimTemplateName") or r.get("resourceClaimName")) for r in refs)
    return "-"


def lift(kube: Kube, pod: Mapping[str, Any]) -> None:
    """Remove the gate; KubeError when the pod changed or was re-created meanwhile (409/422: read it again)."""
    index = gate.gate_index(pod)
    if index is None:
        return  # lifted meanwhile (by the queue, or another --lift)
    meta = pod["metadata"]
    kube.request("PATCH", f"/api/v1/namespaces/{q(meta['namespace'])}/pods/{q(meta['name'])}",
                 gate.lift_patch(str(meta.get("uid") or ""), index), content_type=JSON_PATCH)


def _age(pod: Mapping[str, Any], now: float) -> str:
    seconds = max(0, int(now - parse_time(pod["metadata"].get("creationTimestamp"))))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"


def main(argv: Sequence[str]) -> int:
    ap = CommandParser(
        prog="gpuslice gates",
        description="List the pods that still carry gpuslice's scheduling gate (gpuslice.io/queue), or lift it "
                    "(--lift): for an uninstall, once the webhook is gone (README.md, 'Uninstall'). A lifted pod "
                    "is scheduled at once, outside the queue's order and entitlements. Namespaces as kubectl "
                    "chooses them (and as gpuslice queue does): -n, -A, else the kubeconfig context's.")
    where = ap.add_mutually_exclusive_group()
    where.add_argument("-n", "--namespace", type=dns_label, default=None, help="only this namespace")
    where.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace")
    ap.add_argument("--lift", action="store_true", help="remove the gate from each pod listed")
    ap.add_argument("--kubeconfig", type=readable_file, default=None,
                    help="kubeconfig file (default $KUBECONFIG or ~/.kube/config)")
    args = ap.parse_args(list(argv))
    from kubernetes.config import ConfigException

    try:
        namespace = None if args.all_namespaces else args.namespace or current_namespace(args.kubeconfig or "")
        kube = operator_kube(args.kubeconfig or "")
        pods = gated(kube, namespace)
    except (ConfigException, OSError, KubeError) as e:
        print(f"gpuslice gates: cannot list pods: {e}", file=sys.stderr)
        return 1
    now = datetime.now(UTC).timestamp()
    print(f"{'NAMESPACE':<20} {'NAME':<40} {'ASKS FOR':<16} {'AGE':>8}  SCHEDULER")
    for p in pods:
        meta, spec = p["metadata"], p.get("spec") or {}
        print(f"{meta['namespace']:<20} {meta['name']:<40} {product_of(p):<16} {_age(p, now):>8}  "
              f"{spec.get('schedulerName') or 'default-scheduler'}")
    failed = 0
    if args.lift:
        for p in pods:
            try:
                lift(kube, p)
            except KubeError as e:
                failed += 1
                print(f"gpuslice gates: {p['metadata']['namespace']}/{p['metadata']['name']}: not lifted: {e}",
                      file=sys.stderr)
        print(f"lifted {len(pods) - failed} of {len(pods)} gates")
    elif not pods:
        scope = f" in namespace {namespace} (-A: every namespace)" if namespace else ""
        print(f"no pod carries the gpuslice.io/queue gate{scope}")
    return 1 if failed else 0
