"""Node fit: may a pod go to a node, by its node constraints and the node's labels, taints and cordon.

Pure, over plain data, with kube-scheduler's exact semantics (the ``NodeAffinity``,
``TaintToleration`` and ``NodeUnschedulable`` filter plugins, v1.34). ``may_run(c, node)`` is true
exactly when all three hold:

1. **Node selector** (``spec.nodeSelector``): every key is a label of the node with exactly that value.
2. **Required node affinity** (``requiredDuringSchedulingIgnoredDuringExecution``), when the pod has
   one: its ``nodeSelectorTerms`` are ORed -- no terms, or only empty terms, match no node; within a
   term, ``matchExpressions`` and ``matchFields`` are all ANDed. A requirement on label ``k``:

   ==============  ================================================================
   ``In``          ``k`` is set and its value is one of ``values``
   ``NotIn``       ``k`` is not set, or its value is none of ``values``
   ``Exists``      ``k`` is set
   ``DoesNotExist``  ``k`` is not set
   ``Gt`` / ``Lt``   ``k`` is set, its value parses as a base-10 int64 (``strconv.ParseInt``: an
                   optional sign and ASCII digits, nothing else) and is greater / less than the
                   single value (an int64 too)
   ==============  ================================================================

   ``matchFields`` reads ``metadata.name`` (any other field is ""), with ``In`` / ``NotIn`` and
   exactly one value. A
   requirement the API server would not parse into a selector (``In``/``NotIn`` without values,
   ``Exists``/``DoesNotExist`` with values, ``Gt``/``Lt`` without exactly one integer, an unknown
   operator or field) makes its term match no node, as in kube-scheduler.
3. **Taints** (``spec.taints``): every taint of effect ``NoSchedule`` or ``NoExecute`` is tolerated by
   one of the pod's tolerations (``PreferNoSchedule`` is a preference: ignored). A toleration
   tolerates a taint when its effect is empty or equal, its key is empty or equal, and its operator
   is ``Exists``, or ``Equal`` (the default) with an equal value. **Cordon**
   (``spec.unschedulable``): the pod must tolerate the taint ``node.kubernetes.io/unschedulable:NoSchedule``.

``NodeConstraints()`` (no selector, no affinity, no tolerations) is what a pod without any says:
it may go to any schedulable node without a NoSchedule/NoExecute taint.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

IN, NOT_IN, EXISTS, DOES_NOT_EXIST, GT, LT = "In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"
OPERATORS = (IN, NOT_IN, EXISTS, DOES_NOT_EXIST, GT, LT)
EQUAL = "Equal"
NO_SCHEDULE, NO_EXECUTE, PREFER_NO_SCHEDULE = "NoSchedule", "NoExecute", "PreferNoSchedule"
FILTERED_EFFECTS = (NO_SCHEDULE, NO_EXECUTE)  # the effects the scheduler's filter enforces
UNSCHEDULABLE_TAINT_KEY = "node.kubernetes.io/unschedulable"
NAME_FIELD = "metadata.name"
# what the API server's DefaultTolerationSeconds plugin gives every pod (NoExecute, for 300 s)
DEFAULT_TOLERATION_KEYS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
_INT64 = re.compile(r"[+-]?[0-9]+")  # what Go's strconv.ParseInt(s, 10, 64) accepts, before the range check
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1


@dataclass(frozen=True, slots=True)
class Requirement:
    """One ``matchExpressions`` / ``matchFields`` entry: ``key`` ``operator`` ``values``."""

    key: str
    operator: str
    values: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Term:
    """One ``nodeSelectorTerms`` entry: its label and field requirements, all ANDed."""

    match_expressions: tuple[Requirement, ...] = ()
    match_fields: tuple[Requirement, ...] = ()


@dataclass(frozen=True, slots=True)
class Toleration:
    """One ``spec.tolerations`` entry (``operator`` "" reads as ``Equal``)."""

    key: str = ""
    operator: str = EQUAL
    value: str = ""
    effect: str = ""


@dataclass(frozen=True, slots=True)
class Taint:
    """One ``spec.taints`` entry of a node."""

    key: str
    value: str = ""
    effect: str = NO_SCHEDULE


@dataclass(frozen=True, slots=True)
class NodeConstraints:
    """Where a pod may go: its node selector, its required node affinity terms (None: it has no
    required affinity, so any labels do) and its tolerations. Hashable: requests carry it."""

    node_selector: tuple[tuple[str, str], ...] = ()
    affinity: tuple[Term, ...] | None = None
    tolerations: tuple[Toleration, ...] = ()
    _hash: int = field(default=0, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.node_selector, self.affinity, self.tolerations)))

    def __hash__(self) -> int:  # computed once: requests carrying it are dict keys all over the queue
        return self._hash

    @property
    def empty(self) -> bool:
        """Says nothing: any schedulable node without a filtered taint."""
        return not self.node_selector and self.affinity is None and not self.tolerations

    def describe(self) -> str:
        """A short human summary, for messages: 'node selector pool=a; required node affinity (1 term);
        tolerates gpu'. The tolerations every pod gets (``DEFAULT_TOLERATION_KEYS``) go unsaid."""
        parts = []
        if self.node_selector:
            parts.append("node selector " + ",".join(f"{k}={v}" for k, v in self.node_selector))
        if self.affinity is not None:
            n = len(self.affinity)
            parts.append(f"required node affinity ({n} term{'s' if n != 1 else ''})")
        told = sorted({t.key or "every taint" for t in self.tolerations
                       if not (t.key in DEFAULT_TOLERATION_KEYS and t.effect == NO_EXECUTE)})
        if told:
            parts.append("tolerates " + ", ".join(told))
        return "; ".join(parts) or "no node constraints"


@dataclass(frozen=True, slots=True)
class NodeFacts:
    """What the scheduler's filters read of a node: its labels, taints and ``spec.unschedulable``.
    ``known`` False: nobody told us (a node seeded without its Node object): every pod may go there,
    as far as we know -- kube-scheduler, which reads the Node object, decides."""

    labels: tuple[tuple[str, str], ...] = ()
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False
    known: bool = True

    @property
    def open(self) -> bool:
        """Does a pod without constraints fit here: schedulable, no NoSchedule/NoExecute taint?"""
        return not self.known or (not self.unschedulable and not any(t.effect in FILTERED_EFFECTS
                                                                     for t in self.taints))


def parse_int64(text: str) -> int | None:
    """``strconv.ParseInt(text, 10, 64)``: the int, or None where Go returns an error."""
    if not _INT64.fullmatch(text):
        return None
    value = int(text)
    return value if _INT64_MIN <= value <= _INT64_MAX else None


def _valid(r: Requirement) -> bool:
    """Would the API server's selector parser take this label requirement?"""
    if r.operator in (IN, NOT_IN):
        return len(r.values) > 0
    if r.operator in (EXISTS, DOES_NOT_EXIST):
        return len(r.values) == 0
    if r.operator in (GT, LT):
        return len(r.values) == 1 and parse_int64(r.values[0]) is not None
    return False


def requirement_matches(r: Requirement, labels: Mapping[str, str]) -> bool:
    """Does one (valid) label requirement match ``labels``?"""
    value = labels.get(r.key)
    if r.operator == IN:
        return value is not None and value in r.values
    if r.operator == NOT_IN:
        return value is None or value not in r.values
    if r.operator == EXISTS:
        return value is not None
    if r.operator == DOES_NOT_EXIST:
        return value is None
    if value is None:
        return False
    have, want = parse_int64(value), parse_int64(r.values[0])
    if have is None or want is None:
        return False
    return have > want if r.operator == GT else have < want


def _field_matches(r: Requirement, name: str) -> bool | None:
    """A ``matchFields`` requirement against the node's fields (``metadata.name`` only: any other
    field reads as ""); None when the selector parser refuses it."""
    if r.operator not in (IN, NOT_IN) or len(r.values) != 1:
        return None
    value = name if r.key == NAME_FIELD else ""
    return (value == r.values[0]) == (r.operator == IN)


def term_matches(t: Term, name: str, labels: Mapping[str, str]) -> bool:
    """Does one node selector term match? An empty or unparseable term matches nothing."""
    if not t.match_expressions and not t.match_fields:
        return False
    if not all(_valid(r) for r in t.match_expressions):
        return False
    fields = [_field_matches(r, name) for r in t.match_fields]
    if None in fields:
        return False
    return all(fields) and all(requirement_matches(r, labels) for r in t.match_expressions)


def tolerates(tol: Toleration, taint: Taint) -> bool:
    """``Toleration.ToleratesTaint``: effect and key empty or equal; ``Exists``, or ``Equal`` values."""
    if tol.effect and tol.effect != taint.effect:
        return False
    if tol.key and tol.key != taint.key:
        return False
    if tol.operator in ("", EQUAL):
        return tol.value == taint.value
    return tol.operator == EXISTS


def labels_match(c: NodeConstraints, name: str, labels: Mapping[str, str]) -> bool:
    """Node selector and required node affinity (rules 1 and 2)."""
    if any(labels.get(k) != v for k, v in c.node_selector):
        return False
    return c.affinity is None or any(term_matches(t, name, labels) for t in c.affinity)


def taints_tolerated(c: NodeConstraints, taints: tuple[Taint, ...], unschedulable: bool) -> bool:
    """Filtered taints and the cordon (rule 3)."""
    for taint in taints:
        if taint.effect in FILTERED_EFFECTS and not any(tolerates(t, taint) for t in c.tolerations):
            return False
    if unschedulable:
        cordon = Taint(UNSCHEDULABLE_TAINT_KEY, "", NO_SCHEDULE)
        return any(tolerates(t, cordon) for t in c.tolerations)
    return True


def may_run(c: NodeConstraints | None, name: str, facts: NodeFacts) -> bool:
    """May a pod with constraints ``c`` (None: none at all) go to node ``name`` with ``facts``?"""
    if c is None or c.empty or not facts.known:
        return facts.open
    if (c.node_selector or c.affinity is not None) and not labels_match(c, name, dict(facts.labels)):
        return False
    return taints_tolerated(c, facts.taints, facts.unschedulable)


def why_not(c: NodeConstraints | None, name: str, facts: NodeFacts) -> str | None:
    """Which rule keeps the pod off the node ('cordoned', 'taint k=v:NoSchedule', 'labels'); None: it may go."""
    c = c or NodeConstraints()
    if not facts.known:
        return None
    if not labels_match(c, name, dict(facts.labels)):
        return "labels"
    for taint in facts.taints:
        if taint.effect in FILTERED_EFFECTS and not any(tolerates(t, taint) for t in c.tolerations):
            return f"taint {taint.key}{'=' + taint.value if taint.value else ''}:{taint.effect}"
    if facts.unschedulable and not taints_tolerated(c, (), True):
        return "cordoned"
    return None
