"""Table test of ``packing.node_fit``: each rule of kube-scheduler's NodeAffinity, TaintToleration and
NodeUnschedulable filters, one row each."""

from __future__ import annotations

import pytest

from packing.node_fit import (
    NO_EXECUTE,
    NO_SCHEDULE,
    PREFER_NO_SCHEDULE,
    NodeConstraints,
    NodeFacts,
    Requirement,
    Taint,
    Term,
    Toleration,
    may_run,
    parse_int64,
    why_not,
)

POOL_A = NodeFacts(labels=(("pool", "a"), ("gpus", "8"), ("zone", "z1")))


def expr(key: str, op: str, *values: str) -> NodeConstraints:
    return NodeConstraints(affinity=(Term((Requirement(key, op, values),)),))


ROWS: list[tuple[str, NodeConstraints | None, NodeFacts, bool]] = [
    ("nothing asked, plain node", None, POOL_A, True),
    ("empty constraints equal None", NodeConstraints(), POOL_A, True),
    ("selector matches", NodeConstraints(node_selector=(("pool", "a"),)), POOL_A, True),
    ("selector other value", NodeConstraints(node_selector=(("pool", "b"),)), POOL_A, False),
    ("selector missing label", NodeConstraints(node_selector=(("gpu", "v100"),)), POOL_A, False),
    ("selector: every key must match", NodeConstraints(node_selector=(("pool", "a"), ("zone", "z2"))), POOL_A, False),
    ("In matches one value", expr("pool", "In", "b", "a"), POOL_A, True),
    ("In no value", expr("pool", "In", "b"), POOL_A, False),
    ("In missing label fails", expr("rack", "In", "r1"), POOL_A, False),
    ("NotIn other value", expr("pool", "NotIn", "b"), POOL_A, True),
    ("NotIn its value", expr("pool", "NotIn", "a"), POOL_A, False),
    ("NotIn missing label passes", expr("rack", "NotIn", "r1"), POOL_A, True),
    ("Exists", expr("pool", "Exists"), POOL_A, True),
    ("Exists missing label fails", expr("rack", "Exists"), POOL_A, False),
    ("DoesNotExist missing label passes", expr("rack", "DoesNotExist"), POOL_A, True),
    ("DoesNotExist present fails", expr("pool", "DoesNotExist"), POOL_A, False),
    ("Gt integer", expr("gpus", "Gt", "4"), POOL_A, True),
    ("Gt is strict", expr("gpus", "Gt", "8"), POOL_A, False),
    ("Lt integer", expr("gpus", "Lt", "9"), POOL_A, True),
    ("Lt is strict", expr("gpus", "Lt", "8"), POOL_A, False),
    ("Gt compares numbers, not text", expr("gpus", "Gt", "10"), POOL_A, False),
    ("Gt signed value", expr("gpus", "Gt", "-3"), POOL_A, True),
    ("Gt missing label fails", expr("rack", "Gt", "1"), POOL_A, False),
    ("Lt missing label fails", expr("rack", "Lt", "1"), POOL_A, False),
    ("Gt label not an integer", expr("pool", "Gt", "1"), POOL_A, False),
    ("Gt label with spaces is not an int64", expr("gpus", "Gt", "1"), NodeFacts(labels=(("gpus", " 8"),)), False),
    ("Gt label beyond int64", expr("gpus", "Gt", "1"), NodeFacts(labels=(("gpus", str(2**63)),)), False),
    ("Gt value not an integer: term invalid", expr("gpus", "Gt", "4.5"), POOL_A, False),
    ("Gt two values: term invalid", expr("gpus", "Gt", "1", "2"), POOL_A, False),
    ("In without values: term invalid", expr("pool", "In"), POOL_A, False),
    ("NotIn without values: term invalid", expr("rack", "NotIn"), POOL_A, False),
    ("Exists with values: term invalid", expr("pool", "Exists", "a"), POOL_A, False),
    ("unknown operator: term invalid", expr("pool", "Equals", "a"), POOL_A, False),
    ("expressions are ANDed", NodeConstraints(affinity=(Term((Requirement("pool", "In", ("a",)),
                                                              Requirement("zone", "In", ("z2",)))),)), POOL_A, False),
    ("terms are ORed", NodeConstraints(affinity=(Term((Requirement("pool", "In", ("b",)),)),
                                                 Term((Requirement("zone", "In", ("z1",)),)))), POOL_A, True),
    ("an empty term matches nothing", NodeConstraints(affinity=(Term(),)), POOL_A, False),
    ("an empty term does not spoil the others", NodeConstraints(affinity=(Term(), Term((Requirement(
        "pool", "Exists"),)))), POOL_A, True),
    ("required affinity without terms matches nothing", NodeConstraints(affinity=()), POOL_A, False),
    ("an invalid term does not spoil the others", NodeConstraints(affinity=(Term((Requirement("pool", "In"),)),
                                                                           Term((Requirement("pool", "Exists"),)))),
     POOL_A, True),
    ("selector and affinity both apply", NodeConstraints(node_selector=(("pool", "b"),),
                                                         affinity=(Term((Requirement("pool", "Exists"),)),)),
     POOL_A, False),
    ("matchFields name In", NodeConstraints(affinity=(Term((), (Requirement("metadata.name", "In", ("n1",)),)),)),
     POOL_A, True),
    ("matchFields name In other", NodeConstraints(affinity=(Term((), (Requirement("metadata.name", "In", ("n2",)),)),)),
     POOL_A, False),
    ("matchFields name NotIn", NodeConstraints(affinity=(Term((), (Requirement("metadata.name", "NotIn", ("n1",)),)),)),
     POOL_A, False),
    ("matchFields two values: term invalid",
     NodeConstraints(affinity=(Term((), (Requirement("metadata.name", "In", ("n1", "n2")),)),)), POOL_A, False),
    ("matchFields Exists: term invalid",
     NodeConstraints(affinity=(Term((), (Requirement("metadata.name", "Exists"),)),)), POOL_A, False),
    ("matchFields and expressions ANDed",
     NodeConstraints(affinity=(Term((Requirement("pool", "In", ("b",)),),
                                    (Requirement("metadata.name", "In", ("n1",)),)),)), POOL_A, False),
    # taints
    ("NoSchedule taint, no toleration", None, NodeFacts(taints=(Taint("gpu", "true", NO_SCHEDULE),)), False),
    ("NoExecute taint, no toleration", None, NodeFacts(taints=(Taint("gpu", "", NO_EXECUTE),)), False),
    ("PreferNoSchedule is ignored", None, NodeFacts(taints=(Taint("gpu", "", PREFER_NO_SCHEDULE),)), True),
    ("Equal toleration, same value", NodeConstraints(tolerations=(Toleration("gpu", "Equal", "true"),)),
     NodeFacts(taints=(Taint("gpu", "true", NO_SCHEDULE),)), True),
    ("empty operator reads Equal", NodeConstraints(tolerations=(Toleration("gpu", "", "true"),)),
     NodeFacts(taints=(Taint("gpu", "true", NO_SCHEDULE),)), True),
    ("Equal toleration, other value", NodeConstraints(tolerations=(Toleration("gpu", "Equal", "false"),)),
     NodeFacts(taints=(Taint("gpu", "true", NO_SCHEDULE),)), False),
    ("Exists toleration, any value", NodeConstraints(tolerations=(Toleration("gpu", "Exists"),)),
     NodeFacts(taints=(Taint("gpu", "x", NO_EXECUTE),)), True),
    ("Exists with empty key tolerates every taint", NodeConstraints(tolerations=(Toleration("", "Exists"),)),
     NodeFacts(taints=(Taint("a", "1", NO_SCHEDULE), Taint("b", "", NO_EXECUTE)), unschedulable=True), True),
    ("toleration effect must equal", NodeConstraints(tolerations=(Toleration("gpu", "Exists", "", NO_SCHEDULE),)),
     NodeFacts(taints=(Taint("gpu", "", NO_EXECUTE),)), False),
    ("empty effect tolerates every effect", NodeConstraints(tolerations=(Toleration("gpu", "Exists"),)),
     NodeFacts(taints=(Taint("gpu", "", NO_SCHEDULE), Taint("gpu", "", NO_EXECUTE))), True),
    ("every filtered taint needs a toleration", NodeConstraints(tolerations=(Toleration("a", "Exists"),)),
     NodeFacts(taints=(Taint("a", "", NO_SCHEDULE), Taint("b", "", NO_SCHEDULE))), False),
    ("unknown toleration operator tolerates nothing", NodeConstraints(tolerations=(Toleration("gpu", "Gt", "1"),)),
     NodeFacts(taints=(Taint("gpu", "2", NO_SCHEDULE),)), False),
    # cordon
    ("cordoned node", None, NodeFacts(unschedulable=True), False),
    ("cordoned node, unschedulable tolerated",
     NodeConstraints(tolerations=(Toleration("node.kubernetes.io/unschedulable", "Exists", "", NO_SCHEDULE),)),
     NodeFacts(unschedulable=True), True),
    ("cordoned node, NoExecute toleration is not enough",
     NodeConstraints(tolerations=(Toleration("node.kubernetes.io/unschedulable", "Exists", "", NO_EXECUTE),)),
     NodeFacts(unschedulable=True), False),
    ("a node nobody described takes any pod", NodeConstraints(node_selector=(("pool", "z"),)),
     NodeFacts(known=False), True),
    ("a node nobody described takes a pod without constraints", None, NodeFacts(known=False), True),
    ("a selector match does not pass a cordon", NodeConstraints(node_selector=(("pool", "a"),)),
     NodeFacts(labels=(("pool", "a"),), unschedulable=True), False),
]


@pytest.mark.parametrize(("constraints", "facts", "expected"), [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_may_run(constraints: NodeConstraints | None, facts: NodeFacts, expected: bool) -> None:
    assert may_run(constraints, "n1", facts) is expected
    assert (why_not(constraints, "n1", facts) is None) is expected


@pytest.mark.parametrize(("text", "value"), [("8", 8), ("+8", 8), ("-8", -8), ("007", 7), (str(2**63 - 1), 2**63 - 1),
                                             (str(-(2**63)), -(2**63)), (str(2**63), None), ("", None), (" 8", None),
                                             ("8.0", None), ("0x10", None), ("1_000", None), ("٣", None)])
def test_parse_int64_is_go_parseint(text: str, value: int | None) -> None:
    assert parse_int64(text) == value


def test_why_not_names_the_rule() -> None:
    pinned = NodeConstraints(node_selector=(("pool", "b"),))
    assert why_not(pinned, "n1", POOL_A) == "labels"
    assert why_not(None, "n1", NodeFacts(taints=(Taint("gpu", "yes", NO_SCHEDULE),))) == "taint gpu=yes:NoSchedule"
    assert why_not(None, "n1", NodeFacts(unschedulable=True)) == "cordoned"
    assert pinned.describe() == "node selector pool=b"
    told = NodeConstraints(affinity=(Term(),), tolerations=(Toleration("gpu", "Exists"), Toleration("", "Exists"),
                                                            Toleration("node.kubernetes.io/unreachable", "Exists",
                                                                       "", NO_EXECUTE)))
    assert told.describe() == "required node affinity (1 term); tolerates every taint, gpu"
    assert NodeConstraints().describe() == "no node constraints"
