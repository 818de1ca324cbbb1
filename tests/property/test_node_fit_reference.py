"""``packing.node_fit.may_run`` equals a brute-force reference on generated pods and nodes (hypothesis).

The reference works the other way round: instead of asking one node at a time, it computes, for a
generated population of nodes, the *set* of nodes each rule admits -- each requirement's node set,
intersected over a term, united over the terms, intersected with the selector's set and with the
set of nodes whose filtered taints (and cordon) the tolerations cover -- written from the Kubernetes
API documentation and kube-scheduler's filter plugins, sharing no code with the predicate.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from packing.node_fit import NodeConstraints, NodeFacts, Requirement, Taint, Term, Toleration, may_run

KEYS = ["pool", "zone", "gpus", "rack"]
VALUES = ["a", "b", "1", "8", "-2", "+3", " 3", "x", "", "99999999999999999999"]
TAINT_KEYS = ["gpu", "spot", "node.kubernetes.io/unschedulable"]
EFFECTS = ["NoSchedule", "NoExecute", "PreferNoSchedule"]
LABEL_OPS = ["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt", "Bogus"]


@dataclass(frozen=True)
class FakeNode:
    name: str
    labels: dict[str, str]
    taints: tuple[Taint, ...]
    unschedulable: bool

    def facts(self) -> NodeFacts:
        return NodeFacts(tuple(sorted(self.labels.items())), self.taints, self.unschedulable)


requirements = st.builds(Requirement, st.sampled_from(KEYS), st.sampled_from(LABEL_OPS),
                         st.lists(st.sampled_from(VALUES), max_size=3).map(tuple))
field_requirements = st.builds(Requirement, st.sampled_from(["metadata.name", "metadata.name", "spec.x"]),
                               st.sampled_from(["In", "NotIn", "Exists"]),
                               st.lists(st.sampled_from(["n0", "n1", "n2", ""]), max_size=2).map(tuple))
terms = st.builds(Term, st.lists(requirements, max_size=3).map(tuple),
                  st.lists(field_requirements, max_size=1).map(tuple))
tolerations = st.builds(Toleration, st.sampled_from(["", *TAINT_KEYS]), st.sampled_from(["", "Equal", "Exists", "Gt"]),
                        st.sampled_from(["", "true", "x"]), st.sampled_from(["", *EFFECTS]))
constraints = st.none() | st.builds(
    NodeConstraints,
    st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=2).map(lambda d: tuple(sorted(d.items()))),
    st.none() | st.lists(terms, max_size=3).map(tuple),
    st.lists(tolerations, max_size=3).map(tuple),
)


@st.composite
def populations(draw: st.DrawFn) -> list[FakeNode]:
    n = draw(st.integers(1, 5))
    out = []
    for i in range(n):
        labels = draw(st.dictionaries(st.sampled_from(KEYS), st.sampled_from(VALUES), max_size=4))
        taints = tuple(draw(st.lists(st.builds(Taint, st.sampled_from(TAINT_KEYS), st.sampled_from(["", "true", "x"]),
                                               st.sampled_from(EFFECTS)), max_size=2)))
        out.append(FakeNode(f"n{i}", labels, taints, draw(st.booleans())))
    return out


# ---- the reference: node sets ------------------------------------------------------------------------


def go_int64(text: str) -> int | None:
    """strconv.ParseInt(text, 10, 64), written out: optional sign, then one or more ASCII digits."""
    body = text[1:] if text[:1] in ("+", "-") else text
    if not body or any(ch not in "0123456789" for ch in body):
        return None
    value = int(text)
    return value if -(1 << 63) <= value < (1 << 63) else None


def requirement_set(pop: list[FakeNode], r: Requirement) -> set[str] | None:
    """The nodes a label requirement admits; None when NewRequirement refuses it."""
    have = {n.name for n in pop if r.key in n.labels}
    if r.operator in ("In", "NotIn"):
        if not r.values:
            return None
        hit = {n.name for n in pop if r.key in n.labels and n.labels[r.key] in set(r.values)}
        return hit if r.operator == "In" else {n.name for n in pop} - hit
    if r.operator in ("Exists", "DoesNotExist"):
        if r.values:
            return None
        return have if r.operator == "Exists" else {n.name for n in pop} - have
    if r.operator in ("Gt", "Lt"):
        if len(r.values) != 1 or go_int64(r.values[0]) is None:
            return None
        bound = go_int64(r.values[0])
        assert bound is not None
        out = set()
        for n in pop:
            v = go_int64(n.labels[r.key]) if r.key in n.labels else None
            if v is not None and ((v > bound) if r.operator == "Gt" else (v < bound)):
                out.add(n.name)
        return out
    return None


def field_set(pop: list[FakeNode], r: Requirement) -> set[str] | None:
    if r.operator not in ("In", "NotIn") or len(r.values) != 1:
        return None
    equal = {n.name for n in pop if (n.name if r.key == "metadata.name" else "") == r.values[0]}
    return equal if r.operator == "In" else {n.name for n in pop} - equal


def term_set(pop: list[FakeNode], t: Term) -> set[str]:
    if not t.match_expressions and not t.match_fields:
        return set()
    out = {n.name for n in pop}
    for r in t.match_expressions:
        s = requirement_set(pop, r)
        if s is None:
            return set()
        out &= s
    for r in t.match_fields:
        s = field_set(pop, r)
        if s is None:
            return set()
        out &= s
    return out


def covers(tol: Toleration, key: str, value: str, effect: str) -> bool:
    key_ok = tol.key in ("", key)
    effect_ok = tol.effect in ("", effect)
    value_ok = tol.operator == "Exists" or (tol.operator in ("", "Equal") and tol.value == value)
    return key_ok and effect_ok and value_ok


def reference(pop: list[FakeNode], c: NodeConstraints | None) -> set[str]:
    c = c or NodeConstraints()
    everyone = {n.name for n in pop}
    selected = {n.name for n in pop if all(k in n.labels and n.labels[k] == v for k, v in c.node_selector)}
    affine = everyone if c.affinity is None else set().union(*(term_set(pop, t) for t in c.affinity))
    blocked = set()
    for n in pop:
        hard = [(t.key, t.value, t.effect) for t in n.taints if t.effect != "PreferNoSchedule"]
        if n.unschedulable:
            hard.append(("node.kubernetes.io/unschedulable", "", "NoSchedule"))
        if any(not any(covers(tol, *h) for tol in c.tolerations) for h in hard):
            blocked.add(n.name)
    return selected & affine - blocked


@settings(max_examples=400, deadline=None)
@given(pop=populations(), c=constraints)
def test_may_run_equals_the_reference(pop: list[FakeNode], c: NodeConstraints | None) -> None:
    got = {n.name for n in pop if may_run(c, n.name, n.facts())}
    assert got == reference(pop, c)


def test_the_reference_can_tell_apart() -> None:
    """The comparison is not vacuous: the reference admits and refuses on the rules it encodes."""
    pop = [FakeNode("n0", {"pool": "a", "gpus": "8"}, (), False),
           FakeNode("n1", {"pool": "b"}, (Taint("gpu", "true", "NoSchedule"),), False),
           FakeNode("n2", {"pool": "a"}, (), True)]
    assert reference(pop, None) == {"n0"}
    assert reference(pop, NodeConstraints(node_selector=(("pool", "b"),),
                                          tolerations=(Toleration("gpu", "Exists"),))) == {"n1"}
    assert reference(pop, NodeConstraints(affinity=(Term((Requirement("gpus", "Gt", ("3",)),)),))) == {"n0"}
