"""ClusterState: the sync's and the gate's operations on the extender's state, alone and interleaved.

The stateful test plays a small cluster: gated pods arrive, the gate admits them, "kube-scheduler"
filters and binds them (sometimes to the node filter returned, sometimes never), pods finish or
are deleted, the watch replays bound pods, reservations lapse and the extender restarts (reset and
rebuild from the API). After every step: the ledger's and the queue's own invariants, no GPU over
its capacity, and the ledger's bound claims equal to the pods the API shows bound.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from extender.cluster.state import ADOPTED, CONFLICT, IN_FLIGHT, KEPT, PLACED, UNKNOWN_NODE, ClusterState
from extender.inventory import synthetic_cards
from extender.samples import pod
from extender.state import StateConfig
from extender.wire import BindingArgs, ExtenderArgs
from packing.entitlements import Entitlement
from packing.products import load_catalog
from packing.record import AllocationRecord

CATALOG = load_catalog()
V100 = "Tesla-V100-SXM2-32GB"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


class Binder:
    """Binds by remembering (the API side is tested against a real API server in tests/e2e)."""

    def __init__(self) -> None:
        self.bound: dict[str, tuple[str, AllocationRecord | None]] = {}
        self.fail = False

    def bind(self, args: BindingArgs, record: AllocationRecord | None) -> None:
        if self.fail:
            raise RuntimeError("API away")
        self.bound[args.pod_uid] = (args.node, record)

    def release(self, pod_uid: str) -> None:
        self.bound.pop(pod_uid, None)


def new_state(clock: Clock | None = None) -> tuple[ClusterState, Binder, Clock]:
    clock = clock or Clock()
    binder = Binder()
    state = ClusterState(CATALOG, binder, StateConfig(reservation_ttl_s=30), clock=clock)
    return state, binder, clock


def cards(node: str, n: int) -> Any:
    return synthetic_cards(node, n, V100, 32768)


def ask(state: ClusterState, name: str, product: str, namespace: str = "default") -> Any:
    return state.describe(pod(name, product, namespace=namespace))


def test_sync_node_outcomes() -> None:
    state, _, _ = new_state()
    assert state.sync_node("n1", cards("n1", 2)) == "added"
    assert state.sync_node("n1", cards("n1", 2)) == "same"
    assert state.sync_node("n1", cards("n1", 4)) == "replaced"
    a = ask(state, "p", "v100-25")
    assert state.observe_bound(a, None, "n1") == PLACED
    held = state.ledger.allocations[a.uid].gpus
    assert held == ("n1/gpu-0",)
    assert state.sync_node("n1", cards("n1", 1)) == "replaced"  # the idle cards go at once
    assert [g.uuid for g in state.ledger.nodes["n1"].gpus] == ["n1/gpu-0"]
    assert state.sync_node("n1", ()) == "pending"  # never drops a live allocation: withdrawn until it leaves
    assert state.ledger.gpus["n1/gpu-0"].withdrawn and state.ledger.allocations[a.uid].gpus == held
    assert state.observe_gone(a.uid)
    assert "n1" not in state.ledger.nodes  # the change waited for the slice, and applied when it left
    assert state.sync_node("n1", ()) == "same"
    assert state.drop_node("n1") == []


def test_gate_admits_in_creation_order_and_explains_the_rest() -> None:
    state, _, clock = new_state()
    state.sync_node("n1", cards("n1", 1))
    asks = [ask(state, f"p{i}", "v100-50") for i in range(4)]
    for i, a in reversed(list(enumerate(asks))):  # seen in reverse: creation time decides the order
        assert state.gate_arrive(a, clock.now + i, "gated")
    assert not state.gate_arrive(asks[0], clock.now, "gated")  # already in line
    admitted = state.admit(clock.now + 10)
    assert [x.claim for x in admitted] == [asks[0].uid, asks[1].uid]
    assert all(state.ledger.allocations[x.claim].reserved for x in admitted)
    waiting = state.explain(clock.now + 10)
    # worst-first: the first in line is the front, its card held for it; the second waits behind it
    assert [(e.claim, e.position, e.reason) for e in waiting] == [(asks[2].uid, 1, "WaitingForReservation"),
                                                                   (asks[3].uid, 2, "NoCapacity")]
    state.ledger.verify()
    state.core.waiting.queue.verify()


def test_observe_bound_outcomes() -> None:
    state, _, _ = new_state()
    state.sync_node("n1", cards("n1", 2))
    a = ask(state, "a", "v100-50")
    rec = AllocationRecord(a.uid, "n1", ("n1/gpu-1",), "v100-50", 500, 16384)
    assert state.observe_bound(a, rec, "n1") == ADOPTED
    assert state.ledger.allocations[a.uid].gpus == ("n1/gpu-1",)
    assert state.observe_bound(a, rec, "n1") == KEPT
    b = ask(state, "b", "v100-100")
    clash = AllocationRecord(b.uid, "n1", ("n1/gpu-1",), "v100-100", 1000, 32768)
    assert state.observe_bound(b, clash, "n1") == PLACED  # its record clashes: the policy finds gpu-0
    c = ask(state, "c", "v100-100")
    before = state.ledger.fingerprint()
    assert state.observe_bound(c, None, "n1") == CONFLICT  # nothing left: the ledger is unchanged
    assert state.ledger.fingerprint() == before
    assert state.observe_bound(ask(state, "d", "v100-25"), None, "elsewhere") == UNKNOWN_NODE
    state.ledger.verify()


def test_observe_bound_waits_for_our_own_bind() -> None:
    state, _, _ = new_state()
    state.sync_node("n1", cards("n1", 1))
    a = ask(state, "a", "v100-25")
    state.core.cache.begin_bind(a.uid)  # a bind in flight
    assert state.observe_bound(a, None, "n1") == IN_FLIGHT
    assert a.uid not in state.ledger.allocations


def test_admitted_pod_that_loses_its_reservation_goes_back_to_its_place() -> None:
    state, _, clock = new_state()
    state.sync_node("n1", cards("n1", 1))
    state.sync_node("n2", cards("n2", 1))
    first, second = ask(state, "first", "v100-100"), ask(state, "second", "v100-100")
    third = ask(state, "third", "v100-100")
    for i, a in enumerate((first, second, third)):
        state.gate_arrive(a, clock.now + i, "gated")
    admitted = {x.claim: x.allocation.node for x in state.admit(clock.now + 5)}
    assert set(admitted) == {first.uid, second.uid}
    # kube-scheduler offers `first` only a node where it does not fit: its filter drops the reservation
    other = admitted[second.uid]
    outcome = state.core.filter(ExtenderArgs(pod("first", "v100-100"), [other]))
    assert outcome.result.node_names == [] and first.uid not in state.ledger.allocations
    assert state.recover_admitted() == [first.uid]
    assert [e.claim for e in state.explain(clock.now + 5)] == [first.uid, third.uid]  # back ahead of third
    assert [x.claim for x in state.admit(clock.now + 6)] == [first.uid]


def test_entitlements_hold_admission() -> None:
    state, _, clock = new_state()
    state.sync_node("n1", cards("n1", 4))
    state.set_entitlements({"team": Entitlement({"v100-100": 1})})
    asks = [ask(state, f"p{i}", "v100-100", "team") for i in range(2)]
    for i, a in enumerate(asks):
        state.gate_arrive(a, clock.now + i, "gated")
    assert [x.claim for x in state.admit(clock.now + 5)] == [asks[0].uid]
    assert state.explain(clock.now + 5)[0].reason == "QuotaExceeded"
    state.set_entitlements({"team": None})
    assert [x.claim for x in state.admit(clock.now + 6)] == [asks[1].uid]


def test_reset_forgets_everything() -> None:
    state, _, clock = new_state()
    state.sync_node("n1", cards("n1", 1))
    a, b = ask(state, "a", "v100-100"), ask(state, "b", "v100-100")
    state.observe_bound(a, None, "n1")
    state.gate_arrive(b, clock.now, "gated")
    state.ready = True
    state.reset()
    assert not state.ready and not state.ledger.nodes and not state.ledger.allocations
    assert state.core.waiting.queue.waiting() == 0 and state.core.waiting.queue.running() == 0
    state.sync_node("n1", cards("n1", 1))  # a new term rebuilds from scratch
    assert state.observe_bound(a, None, "n1") == PLACED


def test_admitted_then_bound_pod_counts_once(caplog: pytest.LogCaptureFixture) -> None:
    state, _, clock = new_state()
    state.sync_node("n1", cards("n1", 2))
    state.set_entitlements({"default": Entitlement({"v100-100": 1})})
    a, b = ask(state, "a", "v100-100"), ask(state, "b", "v100-100")
    state.gate_arrive(a, clock.now, "gated")
    state.gate_arrive(b, clock.now + 1, "gated")
    assert [x.claim for x in state.admit(clock.now + 2)] == [a.uid]
    assert state.core.filter(ExtenderArgs(pod("a", "v100-100"), ["n1"])).result.node_names == ["n1"]
    with caplog.at_level("WARNING"):
        assert state.core.bind(BindingArgs("a", "default", a.uid, "n1")).ok
    assert not caplog.records  # the queue already tracks an admitted claim as running: no complaint
    assert state.core.waiting.queue.usage("default").held("v100-100") == 1  # counted once, not twice
    assert state.admit(clock.now + 3) == []  # b still waits on the entitlement
    state.core.waiting.queue.verify()


@pytest.mark.parametrize("gone_while", ["waiting", "admitted", "bound"])
def test_observe_gone_frees_at_every_stage(gone_while: str) -> None:
    state, _, clock = new_state()
    state.sync_node("n1", cards("n1", 1))
    a = ask(state, "a", "v100-100")
    state.gate_arrive(a, clock.now, "gated")
    if gone_while in ("admitted", "bound"):
        state.admit(clock.now)
    if gone_while == "bound":
        outcome = state.core.filter(ExtenderArgs(pod("a", "v100-100"), ["n1"]))
        assert outcome.result.node_names == ["n1"]
        assert state.core.bind(BindingArgs("a", "default", a.uid, "n1")).ok
    assert state.observe_gone(a.uid)
    assert not state.ledger.allocations
    assert state.core.waiting.queue.waiting() == 0 and state.core.waiting.queue.running() == 0
    state.core.waiting.queue.verify()


class ClusterMachine(RuleBasedStateMachine):
    """A small cluster driven through the state the way the sync, the gate and kube-scheduler do."""

    def __init__(self) -> None:
        super().__init__()
        self.state, self.binder, self.clock = new_state()
        self.api_nodes: dict[str, int] = {}
        self.pods: dict[str, dict[str, Any]] = {}  # name -> {"doc", "uid", "node", "record", "created"}
        self.seq = 0

    def _ask(self, name: str) -> Any:
        return self.state.describe(self.pods[name]["doc"])

    @rule(gpus=st.integers(1, 3))
    def add_node(self, gpus: int) -> None:
        name = f"n{len(self.api_nodes)}"
        self.api_nodes[name] = gpus
        self.state.sync_node(name, cards(name, gpus))

    @rule(product=st.sampled_from(["v100-25", "v100-50", "v100-100"]))
    def create_gated_pod(self, product: str) -> None:
        self.seq += 1
        name = f"p{self.seq}"
        self.pods[name] = {"doc": pod(name, product), "node": None, "record": None, "created": self.clock.now}
        self.state.gate_arrive(self._ask(name), self.clock.now, "gated")

    @rule()
    def admission_step(self) -> None:
        self.state.recover_admitted()
        self.state.admit(self.clock())

    @precondition(lambda self: self.api_nodes and any(p["node"] is None for p in self.pods.values()))
    @rule(data=st.data(), follow=st.booleans(), fail=st.sampled_from([False, False, False, True]))
    def schedule(self, data: st.DataObject, follow: bool, fail: bool) -> None:
        """kube-scheduler: filter over some candidate nodes, then bind (maybe elsewhere, maybe failing)."""
        name = data.draw(st.sampled_from(sorted(n for n, p in self.pods.items() if p["node"] is None)))
        every = sorted(self.api_nodes)
        candidates = data.draw(st.one_of(st.just(every), st.lists(st.sampled_from(every), unique=True)))
        outcome = self.state.core.filter(ExtenderArgs(self.pods[name]["doc"], candidates))
        passing = outcome.result.node_names
        target = passing[0] if (follow and passing) else (candidates[0] if candidates else None)
        if target is None:
            return
        self.binder.fail = fail
        result = self.state.core.bind(BindingArgs(name, "default", self._ask(name).uid, target))
        self.binder.fail = False
        if result.ok and result.record is not None:
            self.pods[name]["node"], self.pods[name]["record"] = target, result.record

    @precondition(lambda self: self.pods)
    @rule(data=st.data())
    def pod_leaves(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(self.pods)))
        uid = self._ask(name).uid
        del self.pods[name]
        self.state.observe_gone(uid)

    @rule()
    def watch_replays_bound_pods(self) -> None:
        for p in self.pods.values():
            if p["node"] is not None:
                outcome = self.state.observe_bound(self.state.describe(p["doc"]), p["record"], p["node"])
                assert outcome == KEPT

    @rule(seconds=st.sampled_from([1.0, 31.0]))
    def time_passes(self, seconds: float) -> None:
        self.clock.now += seconds
        self.state.core.expire()

    @rule()
    def restart(self) -> None:
        """A new term: empty, then rebuilt from the API (nodes, bound pods, gated pods)."""
        self.state.reset()
        for name, gpus in self.api_nodes.items():
            self.state.sync_node(name, cards(name, gpus))
        for p in self.pods.values():
            a = self.state.describe(p["doc"])
            if p["node"] is not None:
                assert self.state.observe_bound(a, p["record"], p["node"]) == ADOPTED
            else:
                self.state.gate_arrive(a, p["created"], "gated")

    @invariant()
    def consistent(self) -> None:
        self.state.ledger.verify()
        self.state.core.waiting.queue.verify()
        bound = {self.state.describe(p["doc"]).uid: (p["node"], p["record"].gpus)
                 for p in self.pods.values() if p["node"] is not None}
        assert self.state.committed() == bound


ClusterMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
test_cluster_machine = ClusterMachine.TestCase
