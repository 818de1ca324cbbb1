"""Scheduling constraints read from API objects: a pod's node selector, required node affinity and
tolerations, and a node's labels, taints and cordon, as the plain data of ``packing.node_fit``.

The queue places a gated pod only on a node it may use, so a reservation is always one kube-scheduler
can honour. Pods: ``MalformedConstraints`` for wrong JSON types (a body no API server produces;
``packing.asks`` answers it as a malformed pod); the values
themselves are kept as written (an operator the API would refuse makes its term match nothing, as in
kube-scheduler). Nodes: entries of the wrong type are skipped and counted as nothing, so a node
never fails its inventory for its taints. Both are put in a canonical order (selectors, values and
tolerations sorted), so pods that say the same thing share one request shape in the queue.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from packing.node_fit import NodeConstraints, NodeFacts, Requirement, Taint, Term, Toleration


class MalformedConstraints(ValueError):
    """The pod's nodeSelector, affinity or tolerations have wrong JSON types."""


def _map(value: Any, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise MalformedConstraints(f"{where} must be an object, got {type(value).__name__}")
    return value


def _items(value: Any, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise MalformedConstraints(f"{where} must be a list, got {type(value).__name__}")
    return value


def _text(doc: Mapping[str, Any], key: str, where: str) -> str:
    value = doc.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise MalformedConstraints(f"{where}.{key} must be a string")
    return value


def _requirements(value: Any, where: str) -> tuple[Requirement, ...]:
    out = []
    for i, entry in enumerate(_items(value, where)):
        here = f"{where}[{i}]"
        doc = _map(entry, here)
        values = _items(doc.get("values"), f"{here}.values")
        if not all(isinstance(v, str) for v in values):
            raise MalformedConstraints(f"{here}.values must be strings")
        out.append(Requirement(_text(doc, "key", here), _text(doc, "operator", here), tuple(sorted(values))))
    return tuple(out)


def pod_constraints(pod: Mapping[str, Any]) -> NodeConstraints | None:
    """The pod's node constraints; None when it has none (any schedulable untainted node)."""
    spec = _map(pod.get("spec"), "Pod.spec")
    selector = _map(spec.get("nodeSelector"), "Pod.spec.nodeSelector")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in selector.items()):
        raise MalformedConstraints("Pod.spec.nodeSelector must map strings to strings")
    affinity = _map(spec.get("affinity"), "Pod.spec.affinity")
    node_affinity = _map(affinity.get("nodeAffinity"), "Pod.spec.affinity.nodeAffinity")
    where = "Pod.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution")
    terms: tuple[Term, ...] | None = None
    if required is not None:
        doc = _map(required, where)
        found = []
        for i, term in enumerate(_items(doc.get("nodeSelectorTerms"), f"{where}.nodeSelectorTerms")):
            here = f"{where}.nodeSelectorTerms[{i}]"
            t = _map(term, here)
            found.append(Term(_requirements(t.get("matchExpressions"), f"{here}.matchExpressions"),
                              _requirements(t.get("matchFields"), f"{here}.matchFields")))
        terms = tuple(found)
    tolerations = []
    for i, entry in enumerate(_items(spec.get("tolerations"), "Pod.spec.tolerations")):
        here = f"Pod.spec.tolerations[{i}]"
        doc = _map(entry, here)
        tolerations.append(Toleration(_text(doc, "key", here), _text(doc, "operator", here) or "Equal",
                                      _text(doc, "value", here), _text(doc, "effect", here)))
    found_constraints = NodeConstraints(tuple(sorted(selector.items())), terms,
                                        tuple(sorted(set(tolerations), key=_toleration_order)))
    return None if found_constraints.empty else found_constraints


def _toleration_order(t: Toleration) -> tuple[str, str, str, str]:
    return (t.key, t.operator, t.value, t.effect)


def node_facts(node: Mapping[str, Any]) -> NodeFacts:
    """A Node object's labels, taints and ``spec.unschedulable`` (malformed entries read as absent)."""
    meta = node.get("metadata")
    labels = meta.get("labels") if isinstance(meta, Mapping) else None
    pairs = tuple(sorted((k, v) for k, v in labels.items() if isinstance(k, str) and isinstance(v, str))) \
        if isinstance(labels, Mapping) else ()
    spec = node.get("spec")
    spec = spec if isinstance(spec, Mapping) else {}
    taints = []
    listed = spec.get("taints")
    for entry in listed if isinstance(listed, list) else ():
        if isinstance(entry, Mapping) and isinstance(entry.get("key"), str) and isinstance(entry.get("effect"), str):
            value = entry.get("value")
            taints.append(Taint(entry["key"], value if isinstance(value, str) else "", entry["effect"]))
    return NodeFacts(pairs, tuple(taints), spec.get("unschedulable") is True)
