"""Table tests for placement policies, in the manner of kube-scheduler's noderesources plugins.

A ``Case`` is a small cluster written out card by card, one request, the exact key the policy
must give every node, and the (node, cards) it must choose. ``check`` builds the ledger, runs the
policy and compares; each ``test_policies_<name>.py`` holds its policy's table.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from packing.fragment import TypicalMix, TypicalPod
from packing.ledger import Ledger
from packing.mix_estimator import FixedMix
from packing.policies import NodeKey, Policy, policy_for
from packing.products import Request

V100 = "Tesla-V100-SXM2-32GB"
MIB = 32768


@dataclass(frozen=True)
class Node:
    """One node: the milli already used on each of its cards, and its free CPU (None: untracked)."""

    used: tuple[int, ...]
    cpu: int | None = None
    model: str = V100
    withdrawn: tuple[int, ...] = ()  # cards taking no new placement (gone or unhealthy)


@dataclass(frozen=True)
class Case:
    name: str
    nodes: dict[str, Node]
    request: Request
    keys: dict[str, NodeKey | None]  # every node's expected key (None: does not fit)
    choice: tuple[str, tuple[int, ...]] | None  # (node, card indices), None: fits nowhere
    mix: tuple[TypicalPod, ...] = field(default=())
    churning: bool = False  # the load phase the policy reads (one arrival then one departure), if it reads one


def ledger_of(nodes: dict[str, Node]) -> Ledger:
    """The cluster of a case: nodes in the order given (order 0, 1, …), cards filled as written."""
    ledger = Ledger()
    for name, spec in nodes.items():
        ledger.add_node(name, [(f"{name}/g{i}", spec.model, MIB) for i in range(len(spec.used))],
                        cpu_milli=spec.cpu, memory_mib=None)
        for i, used in enumerate(spec.used):
            if used:
                ledger.assign(f"{name}-fill{i}", Request(used, MIB * used // 1000), name, (f"{name}/g{i}",))
        for i in spec.withdrawn:
            ledger.withdraw(f"{name}/g{i}")
    return ledger


def check(policy_name: str, case: Case) -> None:
    """The policy's keys and choice on the case's cluster equal the table's."""
    policy: Policy = policy_for(policy_name, FixedMix(TypicalMix(case.mix)))
    if case.churning:
        assert policy.context.phase is not None, f"{policy_name} reads no load phase"
        policy.context.phase.arrive()
        policy.observe_departure()
        assert policy.context.churning
    ledger = ledger_of(case.nodes)
    got = {n: policy.node_key(ledger, case.request, ledger.nodes[n]) for n in case.nodes}
    assert got == case.keys, case.name
    choice = policy.choose(ledger, case.request)
    if case.choice is None:
        assert choice is None, case.name
        return
    assert choice is not None, case.name
    node, cards = case.choice
    assert (choice.node, choice.gpus) == (node, tuple(f"{node}/g{i}" for i in cards)), case.name
