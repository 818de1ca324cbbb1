"""``gpuslice queue``: the pods waiting for a slice, read from the API as ``kubectl get`` reads them.

A pod waits while it carries gpuslice's scheduling gate (the queue holds it), or while it is
Pending and unbound after the queue admitted it (kube-scheduler binds it next). What it waits for
is the condition ``gpuslice.io/Queued`` the extender writes (``extender/cluster/pending_writer.py``):
its reason, and a message that starts with the pod's position in line and ends with what the recent
waits of its product say (``EXPECTED``: about how much longer, from ``packing.wait_history``; ``longer``
when it waited longer than every recent claim of its product; ``<none>`` before enough were admitted).
A gated pod the extender has not explained yet shows ``<none>``. The line is one for the whole cluster:
``-n`` shows the waiting pods of one namespace with their places in that one line. A pod group's
members (label ``gpuslice.io/pod-group``) share their group's place and reason; a GROUP column then
shows the group's name and its members present / size, as the extender counted them.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from extender.cluster.pending_writer import CONDITION
from extender.gates import product_of
from packing.argtypes import dns_label, readable_file
from packing.explain import EXPECTED_IN, EXPECTED_LONGER
from packing.gate import gated
from packing.kube.client import Kube, KubeError, current_namespace, operator_kube, parse_time, q
from packing.pod_group import GROUP_LABEL, SIZE_ANNOTATION
from packing.usage import CommandParser

# Notice.text() and notice_of() in pending_writer.py write these two parts; test_queue_view checks both ways
_POSITION = re.compile(r"^position (\d+) in the gpuslice queue: ")
_PRODUCT = re.compile(r"\(([^():\s]+): \d+(?:st|nd|rd|th) of its product in line(?:; [^()]*)?\)$")
_GROUP = re.compile(r"pod group \S+ \((\d+) of (\d+) members present\)")  # packing.group_admission's words
_EXPECTED = re.compile(rf"; (?:{EXPECTED_IN} ([^;()]+)|({EXPECTED_LONGER}) [^;()]+); [^;()]*\)$")
NONE = "<none>"  # kubectl's word for an empty cell


@dataclass(frozen=True, slots=True)
class Waiting:
    """One waiting pod as ``gpuslice queue`` shows it (``-o json`` prints these fields)."""

    namespace: str
    name: str
    position: int | None  # its place in the cluster's one line; None when not in line (admitted, refused)
    product: str
    reason: str  # the condition's reason; "" before the extender explained the pod
    status: str  # "gated" (the queue holds it) or "admitted" (gate lifted, not bound yet)
    waiting_since: str  # the pod's creation: it is gated from then on
    waited_s: float
    message: str  # the condition's message without its position prefix
    group: str = ""  # its pod group's name ("" for none)
    members: str = ""  # the group's members present / size ("3/4"), "?" where the extender has not said
    expected: str = ""  # what its product's recent waits say: "~5 min" more, "longer" than all, "" when unknown


def queued_condition(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == CONDITION:
            return c  # type: ignore[no-any-return]
    return None


def waiting_of(pod: Mapping[str, Any], now: float) -> Waiting | None:
    """The pod as a row, or None when it does not wait for a slice (bound, running, never queued)."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    condition = queued_condition(pod)
    waits = gated(pod)
    pending = (pod.get("status") or {}).get("phase", "Pending") == "Pending" and not spec.get("nodeName")
    if not waits and not (pending and condition is not None):
        return None
    text = str((condition or {}).get("message") or "")
    position = None
    if (m := _POSITION.match(text)) is not None:
        position, text = int(m.group(1)), text[m.end():]
    if not waits:
        position = None  # the gate is gone: whatever the condition said, the pod left the line
    product = product_of(pod)
    if product.startswith("claim ") and (m := _PRODUCT.search(text)) is not None:
        product = m.group(1)  # a claim's product is resolved by the extender, which names it
    expected = ""
    if waits and (m := _EXPECTED.search(text)) is not None:
        expected = f"~{m.group(1).strip()}" if m.group(1) else "longer"
    since = parse_time(meta.get("creationTimestamp"))
    group = str((meta.get("labels") or {}).get(GROUP_LABEL) or "")
    members = ""
    if group:
        said = _GROUP.search(text)
        size = str((meta.get("annotations") or {}).get(SIZE_ANNOTATION) or "?")
        members = f"{said.group(1)}/{said.group(2)}" if said is not None else f"?/{size}"
    return Waiting(namespace=str(meta.get("namespace") or ""), name=str(meta.get("name") or ""),
                   position=position, product=product, reason=str((condition or {}).get("reason") or ""),
                   status="gated" if waits else "admitted", waiting_since=str(meta.get("creationTimestamp") or ""),
                   waited_s=max(0.0, now - since) if since else 0.0, message=text, group=group, members=members,
                   expected=expected)


def waiting_pods(pods: Sequence[Mapping[str, Any]], now: float) -> list[Waiting]:
    """The waiting pods in line order: by position, then those without one, oldest first."""
    rows = [w for p in pods if (w := waiting_of(p, now)) is not None]
    return sorted(rows, key=lambda w: (w.position is None, w.position or 0, -w.waited_s, w.namespace, w.name))


def list_pending(kube: Kube, namespace: str | None) -> list[dict[str, Any]]:
    """The Pending pods of ``namespace`` (None: all); a gated pod is always Pending."""
    path = f"/api/v1/namespaces/{q(namespace)}/pods" if namespace else "/api/v1/pods"
    reply = kube.request("GET", path, query={"fieldSelector": "status.phase=Pending"})
    return list(reply.get("items") or [])


def human_duration(seconds: float) -> str:
    """kubectl's AGE format (apimachinery's HumanDuration): 45s, 5m3s, 42m, 3h7m, 20h, 3d4h, 40d, 2y3d."""
    s = int(seconds)
    if s < 0:
        return "0s"
    if s < 120:
        return f"{s}s"
    m = s // 60
    if m < 10:
        return f"{m}m{s % 60}s" if s % 60 else f"{m}m"
    if m < 180:
        return f"{m}m"
    h = m // 60
    if h < 8:
        return f"{h}h{m % 60}m" if m % 60 else f"{h}h"
    if h < 48:
        return f"{h}h"
    d = h // 24
    if h < 24 * 8:
        return f"{d}d{h % 24}h" if h % 24 else f"{d}d"
    if d < 365 * 2:
        return f"{d}d"
    y = d // 365
    if y < 8:
        return f"{y}y{d % 365}d" if d % 365 else f"{y}y"
    return f"{y}y"


def table(rows: Sequence[Waiting], all_namespaces: bool, headers: bool = True) -> str:
    """kubectl's table shape: upper-case headers, columns padded to their widest cell, 3 spaces apart; a
    GROUP column (name and members present / size) when a pod of a group is among the rows."""
    groups = any(w.group for w in rows)
    head = ((["NAMESPACE"] if all_namespaces else []) + ["NAME", "POSITION", "PRODUCT"] + (["GROUP"] if groups else [])
            + ["REASON", "WAITED", "EXPECTED", "MESSAGE"])
    cells = [([w.namespace] if all_namespaces else [])
             + [w.name, str(w.position) if w.position is not None else "-", w.product or NONE]
             + ([f"{w.group} ({w.members})" if w.group else NONE] if groups else [])
             + [w.reason or NONE, human_duration(w.waited_s), w.expected or NONE, w.message or _unexplained(w)]
             for w in rows]
    lines = ([head] if headers else []) + cells
    widths = [max(len(line[i]) for line in lines) for i in range(len(head) - 1)]
    return "\n".join("   ".join([c.ljust(widths[i]) for i, c in enumerate(line[:-1])] + [line[-1]]).rstrip()
                     for line in lines)


def _unexplained(w: Waiting) -> str:
    if w.status == "gated":
        return "not explained yet: the extender's leader writes the reason within seconds (is it running?)"
    return NONE


def as_json(rows: Sequence[Waiting]) -> str:
    """The rows as ``{"items": [...]}``, field names as the API spells them (camelCase)."""
    items = [{"namespace": w.namespace, "name": w.name, "position": w.position, "product": w.product,
              "reason": w.reason, "status": w.status, "waitingSince": w.waiting_since,
              "waitedSeconds": round(w.waited_s, 3), "expected": w.expected, "message": w.message,
              "group": _group_json(w)} for w in rows]
    return json.dumps({"items": items}, indent=2)


def _group_json(w: Waiting) -> dict[str, Any] | None:
    if not w.group:
        return None
    present, _, size = w.members.partition("/")
    return {"name": w.group, "present": int(present) if present.isdigit() else None,
            "size": int(size) if size.isdigit() else None}


def main(argv: Sequence[str]) -> int:
    ap = CommandParser(
        prog="gpuslice queue",
        description="List the pods waiting for a slice: their place in line, product, reason, how long they have "
                    "waited and what they wait for (the gpuslice.io/Queued condition). Namespaces as kubectl "
                    "chooses them: -n, -A, else the kubeconfig context's.",
        epilog="Reasons and what to do about each: README.md, 'Runbook'. Exit status: 0 listed (even none), "
               "1 the API could not be read.")
    where = ap.add_mutually_exclusive_group()
    where.add_argument("-n", "--namespace", type=dns_label, default=None, help="only this namespace")
    where.add_argument("-A", "--all-namespaces", action="store_true",
                       help="every namespace (adds a NAMESPACE column)")
    ap.add_argument("-o", "--output", choices=("table", "json"), default="table",
                    help="table (default) or json: the same rows, waits in seconds")
    ap.add_argument("--no-headers", action="store_true", help="table without its header line")
    ap.add_argument("--kubeconfig", type=readable_file, default=None,
                    help="kubeconfig file (default $KUBECONFIG or ~/.kube/config)")
    args = ap.parse_args(list(argv))
    from kubernetes.config import ConfigException

    try:
        namespace = None if args.all_namespaces else args.namespace or current_namespace(args.kubeconfig or "")
        kube = operator_kube(args.kubeconfig or "")
        pods = list_pending(kube, namespace)
    except (ConfigException, OSError, KubeError) as e:
        print(f"gpuslice queue: cannot list pods: {e}", file=sys.stderr)
        return 1
    rows = waiting_pods(pods, datetime.now(UTC).timestamp())
    if args.output == "json":
        print(as_json(rows))
    elif rows:
        print(table(rows, namespace is None, headers=not args.no_headers))
    else:  # as kubectl says it, on stderr: a script reading stdout sees no rows
        where_text = f" in namespace {namespace}" if namespace else ""
        print(f"No pods wait for a slice{where_text}.", file=sys.stderr)
    return 0
