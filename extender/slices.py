"""``gpuslice slices``: the pods that still use gpuslice, listed; with ``--refuse``, an error naming them.

A pod uses gpuslice while it holds a slice (bound with an allocation record, not finished) or waits
for one (it carries the queue's gate, or it is routed to the gpuslice scheduler and not yet bound).
Removing gpuslice under such a pod strands it (README, "Uninstall"): one asking by DRA claim can no
longer finish terminating (the kubelet retries NodeUnprepareResources against a driver that is gone,
forever), one waiting never starts (nothing lifts its gate, and its ``schedulerName`` is immutable),
and one running loses the watchdog and pacer that hold its caps. The chart's pre-delete hook runs
``gpuslice slices -A --refuse``, so ``helm uninstall`` stops with their names until they are gone.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from extender.gates import product_of
from packing.argtypes import dns_label, dns_subdomain, readable_file
from packing.gate import GATE
from packing.kube.client import KubeError, operator_kube, q
from packing.record import ANNOTATION, RecordError, decode
from packing.usage import CommandParser

SCHEDULER_NAME = "gpuslice-scheduler"
REFUSED = 3  # the exit status of --refuse when pods still use gpuslice (1: the API could not be read)


@dataclass(frozen=True)
class Use:
    """One pod that still uses gpuslice, and how."""

    namespace: str
    name: str
    node: str
    product: str
    how: str  # DRA claim | extended resource | annotation (what a hand-off needs on the node)
    state: str  # holds a slice | terminating | waits (gated) | waits (routed, unbound)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def _how(pod: Mapping[str, Any]) -> str:
    spec = pod.get("spec") or {}
    if spec.get("resourceClaims"):
        return "DRA claim"
    for c in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
        if any(str(k).startswith("gpuslice.io/") for k in ((c.get("resources") or {}).get("limits") or {})):
            return "extended resource"
    return "annotation"


def uses(pods: Iterable[Mapping[str, Any]], scheduler_name: str = SCHEDULER_NAME) -> list[Use]:
    """The pods of ``pods`` that use gpuslice (see the module doc), in namespace and name order."""
    found = []
    for pod in pods:
        meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
        if status.get("phase") in ("Succeeded", "Failed"):
            continue  # finished: its containers are gone, and so is what the agent prepared for them
        record, product = (meta.get("annotations") or {}).get(ANNOTATION), product_of(pod)
        node = str(spec.get("nodeName") or "")
        if record and node:
            with contextlib.suppress(RecordError):  # a record no gpuslice wrote: the spec says what it asks
                product = decode(record).product or product
            state = "terminating" if meta.get("deletionTimestamp") else "holds a slice"
        elif any(g.get("name") == GATE for g in spec.get("schedulingGates") or []):
            state = "waits (gated)"
        elif spec.get("schedulerName") == scheduler_name and not node:
            state = "waits (routed, unbound)"
        else:
            continue
        found.append(Use(str(meta.get("namespace")), str(meta.get("name")), node or "-", product, _how(pod), state))
    return sorted(found, key=lambda u: (u.namespace, u.name))


def refusal(found: Sequence[Use]) -> str:
    """What --refuse says: every pod by name, why it blocks, and what to do."""
    listed = ", ".join(f"{u.key} ({u.state}, {u.how})" for u in found)
    return (f"gpuslice: uninstall refused: {len(found)} pod(s) still use gpuslice: {listed}. Removing gpuslice now "
            "would strand them (a pod asking by DRA claim could not finish terminating, a waiting one would never "
            "start). Stop the workloads that make them (delete or scale down their Deployments, Jobs, ...), wait "
            "until `gpuslice slices -A` lists none, then uninstall again; `helm uninstall --no-hooks` removes "
            "gpuslice anyway and strands them.")


def main(argv: Sequence[str]) -> int:
    ap = CommandParser(
        prog="gpuslice slices",
        description="List the pods that still use gpuslice: holding a slice, or waiting for one (gated, or routed "
                    "to the gpuslice scheduler and unbound). --refuse exits 3 naming them: the chart's pre-delete "
                    "hook, so that an uninstall never strands a pod (README.md, 'Uninstall').")
    where = ap.add_mutually_exclusive_group()
    where.add_argument("-n", "--namespace", type=dns_label, default=None, help="only this namespace")
    where.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace (the default)")
    ap.add_argument("--refuse", action="store_true",
                    help=f"exit {REFUSED} with a message naming every such pod when there is any")
    ap.add_argument("--scheduler-name", type=dns_subdomain, default=SCHEDULER_NAME,
                    help=f"the gpuslice scheduler's name (default {SCHEDULER_NAME})")
    ap.add_argument("--kubeconfig", type=readable_file, default=None,
                    help="kubeconfig file (default $KUBECONFIG or ~/.kube/config)")
    args = ap.parse_args(list(argv))
    from kubernetes.config import ConfigException

    try:
        kube = operator_kube(args.kubeconfig or "")
        if args.namespace:
            listed = kube.request("GET", f"/api/v1/namespaces/{q(args.namespace)}/pods")
        else:
            listed = kube.request("GET", "/api/v1/pods")
        pods = listed.get("items") or []
    except (ConfigException, OSError, KubeError) as e:
        print(f"gpuslice slices: cannot list pods: {e}", file=sys.stderr)
        return 1
    found = uses(pods, args.scheduler_name)
    print(f"{'NAMESPACE':<20} {'NAME':<40} {'NODE':<16} {'PRODUCT':<12} {'ASKS BY':<18} STATE")
    for u in found:
        print(f"{u.namespace:<20} {u.name:<40} {u.node:<16} {u.product:<12} {u.how:<18} {u.state}")
    if not found:
        print("no pod uses gpuslice")
    if args.refuse and found:
        print(refusal(found), file=sys.stderr)
        return REFUSED
    return 0
