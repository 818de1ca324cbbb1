"""``gpuslice slices``: the pods that still use gpuslice, listed; with ``--refuse``, an error naming them.

A pod uses gpuslice while it holds a slice (bound with an allocation record, not finished) or waits
for one (it carries the queue's gate, or it is routed to the gpuslice scheduler and not yet bound).
Removing gpuslice under such a pod strands it (README, "Uninstall"): one asking by DRA claim can no
longer finish terminating (the kubelet retries NodeUnprepareResources against a driver that is gone,
forever), one waiting never starts (nothing lifts its gate, and its ``schedulerName`` is immutable),
and one running loses the watchdog and pacer that hold its caps. The chart's pre-delete hook runs
``gpuslice slices -A --refuse``, so ``helm uninstall`` stops with their names until they are gone; with
``uninstall.evictPods`` it runs ``--evict`` (``evict_slices.py``): the pods are evicted first, and only
those that stay are named.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from extender.gates import product_of
from packing.argtypes import dns_label, dns_subdomain, non_negative_number, readable_file
from packing.gate import GATE
from packing.kube.client import KubeError, Obj, operator_kube, q
from packing.record import ANNOTATION, RecordError, decode
from packing.usage import Applies, CommandParser, Conflict

SCHEDULER_NAME = "gpuslice-scheduler"
REFUSED = 3  # the exit status of --refuse when pods still use gpuslice (1: the API could not be read)
EVICT_TIMEOUT = 180.0  # seconds --evict retries and waits: within Helm's 5 min hook wait, with the Job's start


@dataclass(frozen=True)
class Use:
    """One pod that still uses gpuslice, and how."""

    namespace: str
    name: str
    node: str
    product: str
    how: str  # DRA claim | extended resource | annotation (what a hand-off needs on the node)
    state: str  # holds a slice | terminating | waits (gated) | waits (routed, unbound)
    uid: str = ""
    controller: str = ""  # Kind/name of the owner that re-creates it (a ReplicaSet, a Job, ...), "" for none

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
        owner = next((o for o in meta.get("ownerReferences") or [] if o.get("controller")), None)
        controller = f"{owner.get('kind')}/{owner.get('name')}" if owner else ""
        found.append(Use(str(meta.get("namespace")), str(meta.get("name")), node or "-", product, _how(pod), state,
                         str(meta.get("uid") or ""), controller))
    return sorted(found, key=lambda u: (u.namespace, u.name))


class Lister(Protocol):
    def request(self, method: str, path: str) -> Obj: ...


def list_uses(kube: Lister, namespace: str | None, scheduler_name: str = SCHEDULER_NAME) -> list[Use]:
    """The pods of ``namespace`` (every namespace for None) that use gpuslice, read now; KubeError."""
    if namespace:
        listed = kube.request("GET", f"/api/v1/namespaces/{q(namespace)}/pods")
    else:
        listed = kube.request("GET", "/api/v1/pods")
    return uses(listed.get("items") or [], scheduler_name)


def _table(found: Sequence[Use]) -> None:
    print(f"{'NAMESPACE':<20} {'NAME':<40} {'NODE':<16} {'PRODUCT':<12} {'ASKS BY':<18} STATE")
    for u in found:
        print(f"{u.namespace:<20} {u.name:<40} {u.node:<16} {u.product:<12} {u.how:<18} {u.state}")
    if not found:
        print("no pod uses gpuslice")


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
                    "hook, so that an uninstall never strands a pod (README.md, 'Uninstall'). --evict evicts them "
                    "first, waits until they are gone, and exits 3 naming those that stay, and why.")
    where = ap.add_mutually_exclusive_group()
    where.add_argument("-n", "--namespace", type=dns_label, default=None, help="only this namespace")
    where.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace (the default)")
    ap.add_argument("--refuse", action="store_true",
                    help=f"exit {REFUSED} with a message naming every such pod when there is any")
    ap.add_argument("--evict", action="store_true",
                    help="evict every such pod (Eviction API: PodDisruptionBudgets apply), wait until they are "
                         f"gone, then exit {REFUSED} naming those that stay (re-created, PDB, still terminating)")
    ap.add_argument("--timeout", type=non_negative_number, default=EVICT_TIMEOUT, metavar="SECONDS",
                    help=f"how long --evict retries and waits (default {EVICT_TIMEOUT:g})")
    ap.add_argument("--scheduler-name", type=dns_subdomain, default=SCHEDULER_NAME,
                    help=f"the gpuslice scheduler's name (default {SCHEDULER_NAME})")
    ap.add_argument("--kubeconfig", type=readable_file, default=None,
                    help="kubeconfig file (default $KUBECONFIG or ~/.kube/config)")
    args = ap.parse_args(list(argv))
    if ap.check(args, [Conflict("--evict", "--refuse", "--evict refuses what it cannot evict itself; drop --refuse"),
                       Applies(("--timeout",), lambda a: a.evict, "bounds what --evict does", "add --evict")]):
        return 2
    from kubernetes.config import ConfigException

    try:
        kube = operator_kube(args.kubeconfig or "")
        found = list_uses(kube, args.namespace, args.scheduler_name)
    except (ConfigException, OSError, KubeError) as e:
        print(f"gpuslice slices: cannot list pods: {e}", file=sys.stderr)
        return 1
    _table(found)
    if args.evict and found:
        from extender.evict_slices import evict, left_after_eviction

        try:
            left = evict(kube, lambda: list_uses(kube, args.namespace, args.scheduler_name), args.timeout)
        except KubeError as e:
            print(f"gpuslice slices: cannot list pods: {e}", file=sys.stderr)
            return 1
        if left:
            print(left_after_eviction(left, args.timeout), file=sys.stderr)
            return REFUSED
        print("no pod uses gpuslice any more")
        return 0
    if args.refuse and found:
        print(refusal(found), file=sys.stderr)
        return REFUSED
    return 0
