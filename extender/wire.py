"""The kube-scheduler extender wire format, exactly as kube-scheduler writes and reads it.

``k8s.io/kube-scheduler/extender/v1`` has no json tags, so the keys are Go field names in
PascalCase (``Pod``, ``Nodes``, ``NodeNames``, ``FailedNodes``, ...); embedded Kubernetes
objects keep their own lowerCamel keys. Requests may carry ``null`` for either node field.

Replies follow the scheduler's decoding rules: a filter reply always carries a ``NodeNames`` list
(possibly empty) because a reply without one rejects every node; with full ``Nodes`` (when
``nodeCacheCapable`` is false) the scheduler reads ``Nodes`` instead, and only the names of the
objects there (it maps them back to its own Node objects), so the passing nodes are echoed as
``{"metadata": {"name": ...}}``: a reply never costs more than the names it carries. ``Error`` is
only for internal failures: it skips preemption and events.

What one request may cost is capped: a body that names more than ``max_nodes`` nodes is refused
with ``TooLarge`` (HTTP 413) before any work, as is a body over the byte limit (the HTTP layer's).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

MIN_SCORE = 0
MAX_SCORE = 10  # kube-scheduler's MaxExtenderPriority
DEFAULT_MAX_NODES = 20_000  # four times Kubernetes' tested limit of 5 000 nodes per cluster


class WireError(ValueError):
    """A body that is not what kube-scheduler sends: HTTP 400, nothing changes."""

    status = 400


class TooLarge(WireError):
    """A body that asks for more work than one request may cost: HTTP 413, nothing changes."""

    status = 413


def decode_body(body: bytes) -> Any:
    """Parse a request body as JSON; WireError says what is wrong."""
    if not body:
        raise WireError("empty request body; expected a JSON object")
    try:
        return orjson.loads(body)
    except orjson.JSONDecodeError as e:  # not UTF-8, not JSON, nested over 1 024 deep, a number past a double
        raise WireError(f"request body is not JSON gpuslice accepts: {e.msg} at position {e.pos}") from None


def encode(doc: Any) -> bytes:
    """Compact JSON bytes for a reply."""
    return orjson.dumps(doc)


def _object(doc: Any, what: str) -> Mapping[str, Any]:
    if not isinstance(doc, dict):  # JSON objects decode to dict; the ABC check costs 5x
        raise WireError(f"{what} must be a JSON object, got {_kind(doc)}")
    return doc


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    return {dict: "object", list: "array", str: "string", bool: "boolean", int: "number",
            float: "number"}.get(type(value), type(value).__name__)


@dataclass(frozen=True, slots=True)
class ExtenderArgs:
    """A filter or prioritize request: the pod and the candidate nodes."""

    pod: Mapping[str, Any]
    node_names: list[str]  # the candidates in the scheduler's order, from whichever field it sent
    nodes: Sequence[Mapping[str, Any]] | None = None  # full Node objects (nodeCacheCapable: false)

    @property
    def full_nodes(self) -> bool:
        return self.nodes is not None


def node_name_of(node: Any, where: str) -> str:
    """``metadata.name`` of a Node object; WireError when it is missing or not a string."""
    meta = _object(node, where).get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    if not isinstance(name, str) or not name:
        raise WireError(f"{where}.metadata.name must be a non-empty string")
    return name


def node_name(node: Mapping[str, Any]) -> str:
    """``metadata.name`` of a Node object that ``parse_extender_args`` accepted."""
    name: str = node["metadata"]["name"]
    return name


def parse_extender_args(doc: Any, max_nodes: int = DEFAULT_MAX_NODES) -> ExtenderArgs:
    """Validate an ``ExtenderArgs`` body (unknown fields are ignored, as Go's decoder does).

    TooLarge when it names more than ``max_nodes`` nodes, checked before anything else is looked at.
    """
    args = _object(doc, "ExtenderArgs")
    for key in ("NodeNames", "Nodes"):
        many = args.get(key)
        if isinstance(many, dict):
            many = many.get("items")
        if isinstance(many, list) and len(many) > max_nodes:
            raise TooLarge(f"ExtenderArgs.{key} names {len(many)} nodes; at most {max_nodes} are accepted")
    pod = args.get("Pod")
    if not isinstance(pod, Mapping):
        raise WireError(f"ExtenderArgs.Pod must be a Pod object, got {_kind(pod)}")
    raw_names = args.get("NodeNames")
    raw_nodes = args.get("Nodes")
    nodes: list[Mapping[str, Any]] | None = None
    if raw_nodes is not None:
        node_list = _object(raw_nodes, "ExtenderArgs.Nodes")
        items = node_list.get("items")
        if items is None:
            items = []
        if not isinstance(items, list):
            raise WireError(f"ExtenderArgs.Nodes.items must be an array, got {_kind(items)}")
        nodes = list(items)
    if raw_names is not None:
        if not isinstance(raw_names, list):
            raise WireError(f"ExtenderArgs.NodeNames must be an array of strings, got {_kind(raw_names)}")
        if not set(map(type, raw_names)) <= {str} or "" in raw_names:  # C-speed check of 5 000 names
            raise WireError("ExtenderArgs.NodeNames must hold non-empty strings")
        names: list[str] = raw_names
        if nodes is not None:  # both sent: names rule, the objects only teach inventory
            for i, node in enumerate(nodes):
                node_name_of(node, f"ExtenderArgs.Nodes.items[{i}]")
    elif nodes is not None:
        names = [node_name_of(node, f"ExtenderArgs.Nodes.items[{i}]") for i, node in enumerate(nodes)]
    else:
        names = []
    return ExtenderArgs(pod, names, nodes)


@dataclass(slots=True)
class FilterResult:
    """An ``ExtenderFilterResult``: the passing nodes and a short, stable reason for every other one."""

    node_names: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    unresolvable: dict[str, str] = field(default_factory=dict)
    error: str = ""
    nodes: list[Mapping[str, Any]] | None = None  # the passing nodes, by name, in full-Nodes mode

    def to_wire(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "NodeNames": list(self.node_names),
            "FailedNodes": self.failed,
            "FailedAndUnresolvableNodes": self.unresolvable,
            "Error": self.error,
        }
        doc["Nodes"] = None if self.nodes is None else {"metadata": {}, "items": self.nodes}
        return doc


def priorities_to_wire(scores: Mapping[str, int]) -> list[dict[str, Any]]:
    """A ``HostPriorityList``: a JSON array of ``{"Host", "Score"}``, scores within 0..10."""
    if scores and not MIN_SCORE <= min(scores.values()) <= max(scores.values()) <= MAX_SCORE:
        raise ValueError(f"extender scores must lie within {MIN_SCORE}..{MAX_SCORE}")
    return [{"Host": host, "Score": score} for host, score in scores.items()]


@dataclass(frozen=True, slots=True)
class BindingArgs:
    """An ``ExtenderBindingArgs``: which pod goes to which node (no pod spec)."""

    pod_name: str
    pod_namespace: str
    pod_uid: str
    node: str

    @property
    def pod_key(self) -> str:
        return f"{self.pod_namespace}/{self.pod_name}"


def _string(args: Mapping[str, Any], key: str, what: str, required: bool) -> str:
    value = args.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or (required and not value):
        raise WireError(f"{what}.{key} must be a non-empty string, got {_kind(value)}")
    return value


def parse_binding_args(doc: Any) -> BindingArgs:
    """Validate an ``ExtenderBindingArgs`` body."""
    args = _object(doc, "ExtenderBindingArgs")
    what = "ExtenderBindingArgs"
    return BindingArgs(
        pod_name=_string(args, "PodName", what, True),
        pod_namespace=_string(args, "PodNamespace", what, False) or "default",
        pod_uid=_string(args, "PodUID", what, True),
        node=_string(args, "Node", what, True),
    )


def binding_result(error: str = "") -> dict[str, Any]:
    """An ``ExtenderBindingResult``: an empty ``Error`` means bound."""
    return {"Error": error}


def parse_release(doc: Any) -> str:
    """The admin release body ``{"PodUID": "..."}``."""
    return _string(_object(doc, "release request"), "PodUID", "release request", True)
