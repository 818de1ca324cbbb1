"""ExtenderState decisions: strict narrowing + reservations, cooperative mode, bind, expiry, queue, transactions.

The stateful test drives random filter/prioritize/bind/release/clock sequences and checks every
filter and prioritize answer against a recomputation from scratch on a copy of the ledger (so the
per-node fit cache can never serve a stale answer), and the ledger's invariants after every step.
"""

from __future__ import annotations

import copy
import threading
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from extender.config import ExtenderConfig
from extender.decide import BindCode, Code, reason_for
from extender.inventory import synthetic_cards
from extender.samples import pod
from extender.standalone import MemoryBinder, build_state
from extender.state import BindError, ExtenderState, StateConfig
from extender.wire import BindingArgs, ExtenderArgs
from packing.asks import PodAsk
from packing.ledger import Ledger
from packing.policies import get_policy
from packing.products import load_catalog
from packing.record import AllocationRecord

CATALOG = load_catalog()
V100 = "Tesla-V100-SXM2-32GB"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def make_state(nodes: int = 3, gpus: int = 2, mode: str = "strict", policy: str = "best-fit",
               clock: Clock | None = None, ttl: float = 30.0, cache: int = 10_000) -> ExtenderState:
    config = ExtenderConfig(standalone=True, nodes=nodes, gpus_per_node=gpus, mode=mode, policy=policy,
                            reservation_ttl_s=ttl, pod_cache_size=cache)
    return build_state(config, CATALOG, clock=clock or Clock())


def names(n: int) -> list[str]:
    return [f"node-{i}" for i in range(n)]


def fargs(pod_doc: dict[str, Any], node_names: list[str]) -> ExtenderArgs:
    return ExtenderArgs(pod_doc, list(node_names))


def bargs(pod_doc: dict[str, Any], node: str) -> BindingArgs:
    m = pod_doc["metadata"]
    return BindingArgs(m["name"], m["namespace"], m["uid"], node)


def fill(state: ExtenderState, node: str, gpu: int, milli: int, claim: str) -> None:
    """Occupy ``milli`` of one GPU with a bound pod of the matching product (as read back from its record)."""
    product = CATALOG.product({250: "v100-25", 500: "v100-50", 1000: "v100-100"}[milli])
    ask = PodAsk(claim, claim, "default", CATALOG.request(product.name))
    state.adopt(ask, AllocationRecord(claim, node, (f"{node}/gpu-{gpu}",), product.name, milli, product.memory_mib))


# ---- strict mode ---------------------------------------------------------------------------------


def test_strict_filter_keeps_only_the_best_fit_nodes_and_reserves_on_one() -> None:
    state = make_state(nodes=3, gpus=2)
    fill(state, "node-1", 0, 500, "other")  # node-1 gpu-0 has 500 free: the tightest home for a v100-50
    p = pod("a", "v100-50")
    out = state.filter(fargs(p, names(3)))
    assert out.result.node_names == ["node-1"]
    assert out.result.failed == {}  # the others fit: narrowed away, not failed
    assert out.codes == {"NotBestFit": 2}
    alloc = state.ledger.allocations[p["metadata"]["uid"]]
    assert (alloc.node, alloc.gpus, alloc.reserved) == ("node-1", ("node-1/gpu-0",), True)
    state.ledger.verify()


def test_strict_filter_ties_pass_together_and_refilter_reuses_the_reservation() -> None:
    state = make_state(nodes=3, gpus=2)
    p = pod("a", "v100-25")
    first = state.filter(fargs(p, names(3)))
    assert first.result.node_names == names(3)  # empty cluster: every node ties
    held = state.ledger.allocations[p["metadata"]["uid"]]
    before = state.ledger.fingerprint()
    again = state.filter(fargs(p, names(3)))
    assert again.result.node_names == names(3)
    assert state.ledger.allocations[p["metadata"]["uid"]].gpus == held.gpus
    assert state.ledger.fingerprint() == before  # same reservation, same deadline (clock did not move)


def test_refilter_moves_the_reservation_when_its_node_is_no_longer_offered() -> None:
    state = make_state(nodes=3, gpus=2)
    p = pod("a", "v100-25")
    state.filter(fargs(p, names(3)))
    first = state.ledger.allocations[p["metadata"]["uid"]].node
    others = [n for n in names(3) if n != first]
    out = state.filter(fargs(p, others))
    moved = state.ledger.allocations[p["metadata"]["uid"]]
    assert moved.node in others and moved.node in out.result.node_names
    assert sum(1 for a in state.ledger.allocations.values() if a.claim == p["metadata"]["uid"]) == 1
    state.ledger.verify()


def test_reasons_are_stable_and_sorted_into_resolvable_or_not() -> None:
    state = make_state(nodes=2, gpus=1)
    state.add_node("t4-node", synthetic_cards("t4-node", 1, "Tesla-T4", 15360))
    fill(state, "node-0", 0, 1000, "whole")
    fill(state, "node-1", 0, 500, "half")
    p = pod("big", "v100-100", count=2)
    out = state.filter(fargs(p, ["node-0", "node-1", "t4-node", "ghost"]))
    assert out.result.node_names == []
    assert out.result.failed == {}
    assert set(out.result.unresolvable) == {"node-0", "node-1", "t4-node", "ghost"}
    assert "TooLarge" in out.result.unresolvable["node-0"]
    assert "NoMatchingGPU" in out.result.unresolvable["t4-node"]
    assert "UnknownNode" in out.result.unresolvable["ghost"]
    small = pod("small", "v100-100")
    out = state.filter(fargs(small, ["node-0", "node-1"]))
    assert out.result.failed == {n: reason_for(Code.NOT_ENOUGH_WHOLE_GPUS, CATALOG.request("v100-100"))
                                 for n in ("node-0", "node-1")}
    assert not any(ch.isdigit() for r in out.result.failed.values() for ch in r.split(":", 1)[1].replace(
        "v100-100", ""))  # no numbers in reasons: kube-scheduler aggregates identical ones


def test_pod_asking_for_nothing_passes_every_node_and_changes_nothing() -> None:
    state = make_state()
    before = state.ledger.fingerprint()
    out = state.filter(fargs(pod("cpu-only"), [*names(3), "no-gpu-node"]))
    assert out.result.node_names == [*names(3), "no-gpu-node"]
    assert out.result.failed == {} and out.result.unresolvable == {}
    assert state.ledger.fingerprint() == before
    assert state.bind(bargs(pod("cpu-only"), "no-gpu-node")).ok  # bound without a slice


def test_refused_pod_fails_every_node_with_one_clear_reason() -> None:
    catalog_state = ExtenderState(CATALOG, MemoryBinder(), StateConfig(refused_resources=("nvidia.com/gpu",)))
    catalog_state.add_node("node-0", synthetic_cards("node-0", 2, V100, 32768))
    bare = pod("bare", None, extra_resources={"nvidia.com/gpu": "1"})
    unknown = pod("odd", None, extra_resources={"gpuslice.io/v100-75": "1"})
    for p, needle in ((bare, "nvidia.com/gpu"), (unknown, "unknown product")):
        out = catalog_state.filter(fargs(p, ["node-0", "node-1"]))
        assert out.result.node_names == []
        assert set(out.result.unresolvable) == {"node-0", "node-1"}
        assert all(needle in r and "Refused" in r for r in out.result.unresolvable.values())
        assert "refuses" in catalog_state.bind(bargs(p, "node-0")).error
    assert catalog_state.ledger.allocations == {}


# ---- bind ----------------------------------------------------------------------------------------


def test_bind_is_idempotent_for_the_same_pod_and_node() -> None:
    state = make_state()
    p = pod("a", "v100-50")
    out = state.filter(fargs(p, names(3)))
    node = out.result.node_names[0]
    first = state.bind(bargs(p, node))
    assert first.ok and first.changed and first.record is not None
    before = state.ledger.fingerprint()
    again = state.bind(bargs(p, node))
    assert again.ok and not again.changed
    assert state.ledger.fingerprint() == before
    elsewhere = state.bind(bargs(p, next(n for n in names(3) if n != node)))
    assert "already bound" in elsewhere.error
    assert state.ledger.fingerprint() == before
    binder = state.binder
    assert isinstance(binder, MemoryBinder)
    assert binder.bound[p["metadata"]["uid"]].record == first.record.encode()


def test_bind_on_another_tied_node_moves_the_reservation_atomically() -> None:
    state = make_state(nodes=3, gpus=1)
    p = pod("a", "v100-25")
    out = state.filter(fargs(p, names(3)))
    reserved = state.ledger.allocations[p["metadata"]["uid"]].node
    target = next(n for n in out.result.node_names if n != reserved)
    assert state.bind(bargs(p, target)).ok
    alloc = state.ledger.allocations[p["metadata"]["uid"]]
    assert alloc.node == target and not alloc.reserved
    assert state.ledger.nodes[reserved].free_gpu_milli == 1000
    state.ledger.verify()


def test_bind_where_the_slice_no_longer_fits_fails_clearly_and_keeps_the_reservation() -> None:
    state = make_state(nodes=2, gpus=1, mode="cooperative")
    p, q = pod("a", "v100-100"), pod("b", "v100-100")
    assert state.filter(fargs(p, names(2))).result.node_names == names(2)
    assert state.filter(fargs(q, names(2))).result.node_names == names(2)  # cooperative: no reservation
    assert state.bind(bargs(p, "node-0")).ok
    before = state.ledger.fingerprint()
    lost = state.bind(bargs(q, "node-0"))
    assert "no longer fits on node node-0" in lost.error
    assert state.ledger.fingerprint() == before
    strict = make_state(nodes=2, gpus=1)
    a, b = pod("a", "v100-100"), pod("b", "v100-100")
    strict.filter(fargs(a, names(2)))
    strict.filter(fargs(b, names(2)))  # reserved on the other node
    held = strict.ledger.allocations[b["metadata"]["uid"]]
    before = strict.ledger.fingerprint()
    assert "no longer fits" in strict.bind(bargs(b, strict.ledger.allocations[a["metadata"]["uid"]].node)).error
    assert strict.ledger.fingerprint() == before
    assert strict.ledger.allocations[b["metadata"]["uid"]] == held


def test_bind_errors_for_unknown_node_and_unseen_pod() -> None:
    state = make_state()
    p = pod("a", "v100-25")
    assert "has not seen pod" in state.bind(bargs(p, "node-0")).error
    state.filter(fargs(p, names(3)))
    before = state.ledger.fingerprint()
    assert "not known to gpuslice" in state.bind(bargs(p, "ghost")).error
    assert state.ledger.fingerprint() == before


def test_a_failing_binder_rolls_the_ledger_back() -> None:
    class Refusing(MemoryBinder):
        def bind(self, args: BindingArgs, record: AllocationRecord | None) -> None:
            raise BindError("API server said 409 Conflict")

    state = ExtenderState(CATALOG, Refusing(), StateConfig(mode="cooperative"))
    state.add_node("node-0", synthetic_cards("node-0", 2, V100, 32768))
    p = pod("a", "v100-50")
    state.filter(fargs(p, ["node-0"]))
    before = state.ledger.fingerprint()
    out = state.bind(bargs(p, "node-0"))
    assert "409 Conflict" in out.error
    assert state.ledger.fingerprint() == before


def test_bind_works_from_the_reservation_when_the_pod_cache_forgot_the_pod() -> None:
    state = make_state(cache=1)
    a, b = pod("a", "v100-50"), pod("b", "v100-25")
    node = state.filter(fargs(a, names(3))).result.node_names[0]
    state.filter(fargs(b, names(3)))  # evicts a from the one-entry pod cache
    assert state.pod(a["metadata"]["uid"]) is None
    assert state.bind(bargs(a, node)).ok
    c = pod("c", "v100-25")
    coop = make_state(cache=1, mode="cooperative")
    coop.filter(fargs(c, names(3)))
    coop.filter(fargs(b, names(3)))
    assert "has not seen pod" in coop.bind(bargs(c, "node-0")).error


# ---- expiry --------------------------------------------------------------------------------------


def test_a_filtered_pod_that_is_never_bound_stops_holding_capacity_after_the_ttl() -> None:
    clock = Clock()
    state = make_state(nodes=1, gpus=1, clock=clock, ttl=30)
    p, q = pod("a", "v100-100"), pod("b", "v100-100")
    assert state.filter(fargs(p, ["node-0"])).result.node_names == ["node-0"]
    blocked = state.filter(fargs(q, ["node-0"]))
    assert blocked.result.node_names == [] and "NotEnoughWholeGPUs" in blocked.result.failed["node-0"]
    clock.now += 29.9
    assert state.filter(fargs(q, ["node-0"])).result.node_names == []
    clock.now += 0.2  # a's reservation lapses
    assert state.filter(fargs(q, ["node-0"])).result.node_names == ["node-0"]
    assert p["metadata"]["uid"] not in state.ledger.allocations
    assert "no longer fits" in state.bind(bargs(p, "node-0")).error
    assert state.bind(bargs(q, "node-0")).ok
    state.ledger.verify()


def test_refilter_renews_the_reservation_deadline() -> None:
    clock = Clock()
    state = make_state(nodes=1, gpus=1, clock=clock, ttl=30)
    p = pod("a", "v100-25")
    state.filter(fargs(p, ["node-0"]))
    clock.now += 20
    state.filter(fargs(p, ["node-0"]))
    clock.now += 20  # 40 s after the first filter, 20 s after the renewal
    assert state.expire() == 0
    assert state.bind(bargs(p, "node-0")).ok


# ---- queue, release ------------------------------------------------------------------------------


def test_a_pod_that_fits_nowhere_waits_with_a_reason_and_leaves_the_line_when_bound() -> None:
    state = make_state(nodes=1, gpus=1)
    fill(state, "node-0", 0, 1000, "whole")
    p = pod("a", "v100-50", priority=5)
    q = pod("b", "v100-25")
    state.filter(fargs(q, ["node-0"]))
    state.filter(fargs(p, ["node-0"]))
    queue = state.snapshot()["queue"]
    assert [w["pod"] for w in queue] == ["default/a", "default/b"]  # priority first
    assert queue[0]["position"] == 1 and queue[0]["reason"] == "NoCapacity"
    assert "NoSliceFree" in queue[0]["filter"]
    assert state.release("whole")
    node = state.filter(fargs(p, ["node-0"])).result.node_names
    assert node == ["node-0"]
    assert [w["pod"] for w in state.snapshot()["queue"]] == ["default/b"]  # reserved: out of line
    assert state.bind(bargs(p, "node-0")).ok
    assert state.waiting.queue.state(p["metadata"]["uid"]) == "running"
    assert state.release(q["metadata"]["uid"])  # a waiting pod withdraws
    assert state.snapshot()["queue"] == []
    assert state.release(p["metadata"]["uid"])
    assert state.waiting.queue.state(p["metadata"]["uid"]) is None
    assert not state.release(p["metadata"]["uid"])
    assert state.ledger.allocations == {}


def test_adopt_takes_a_record_back_and_refuses_what_cannot_hold() -> None:
    state = make_state(nodes=1, gpus=1)
    ask = PodAsk("u1", "a", "default", CATALOG.request("v100-50"))
    record = AllocationRecord("u1", "node-0", ("node-0/gpu-0",), "v100-50", 500, 16384)
    state.adopt(ask, record)
    assert state.ledger.allocations["u1"].node == "node-0"
    before = state.ledger.fingerprint()
    other = PodAsk("u2", "b", "default", CATALOG.request("v100-100"))
    with pytest.raises(Exception, match="has 500 milli"):
        state.adopt(other, AllocationRecord("u2", "node-0", ("node-0/gpu-0",), "v100-100", 1000, 32768))
    assert state.ledger.fingerprint() == before


def test_concurrent_filter_and_bind_never_over_commit() -> None:
    state = make_state(nodes=2, gpus=2)
    errors: list[BaseException] = []

    def worker(k: int) -> None:
        try:
            for j in range(25):
                p = pod(f"w{k}-{j}", ("v100-25", "v100-50", "v100-100")[(k + j) % 3])
                out = state.filter(fargs(p, names(2)))
                if out.result.node_names:
                    state.bind(bargs(p, out.result.node_names[-1]))
        except BaseException as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    state.ledger.verify()
    assert state.ledger.free_milli() >= 0


# ---- transactions, outcome codes -----------------------------------------------------------------


def test_a_request_that_fails_midway_leaves_the_ledger_as_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    from extender.samples import gpu_node

    config = StateConfig(standalone=True, learn_nodes=True)
    state = ExtenderState(CATALOG, MemoryBinder(), config, clock=Clock())
    p = pod("a", "v100-25")
    state.filter(ExtenderArgs(p, ["n1", "n2"], [gpu_node("n1", 2), gpu_node("n2", 2)]))  # learned; reserved on one
    before, nodes = state.ledger.fingerprint(), set(state.ledger.nodes)
    reserved = state.ledger.allocations[p["metadata"]["uid"]].node
    other = next(n for n in nodes if n != reserved)

    def on_fire(request: Any) -> Any:
        raise RuntimeError("view on fire")

    monkeypatch.setattr(state.cache.fits, "view", on_fire)
    for verb in (state.filter, state.prioritize):  # each learns a node and lets go of the reservation first
        with pytest.raises(RuntimeError, match="on fire"):
            verb(ExtenderArgs(p, ["n1", "n3"], [gpu_node("n1", 4), gpu_node("n3", 4)]))
        assert state.ledger.fingerprint() == before and set(state.ledger.nodes) == nodes
    monkeypatch.undo()

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("assign on fire")

    monkeypatch.setattr(state.cache, "assign", refuse)  # a bind on another node: release there, then fail
    with pytest.raises(RuntimeError, match="assign on fire"):
        state.bind(bargs(p, other))
    assert state.ledger.fingerprint() == before
    monkeypatch.undo()
    assert state.ready and state.bind(bargs(p, other)).ok  # nothing was left half done, no bind in flight either
    state.ledger.verify()


def test_an_undo_that_fails_turns_the_state_not_ready() -> None:
    state = make_state()
    with state.cache.lock, pytest.raises(RuntimeError, match="request failed"), state.cache.undo_on_error():
        state.cache.assign("x", CATALOG.request("v100-25"), "node-0", ("node-0/gpu-0",))
        state.ledger.release("x")  # a change behind the cache's back: the journal can no longer undo
        raise RuntimeError("request failed")
    assert state.cache.broken and not state.ready


def test_every_bind_outcome_has_its_code() -> None:
    class Failing(MemoryBinder):
        def bind(self, args: BindingArgs, record: AllocationRecord | None) -> None:
            raise BindError("API away")

    state = make_state(nodes=2, gpus=1)
    p, q, cpu = pod("a", "v100-100"), pod("b", "v100-100"), pod("cpu")
    refused = pod("odd", None, extra_resources={"gpuslice.io/v100-75": "1"})
    assert state.bind(bargs(p, "node-0")).code is BindCode.UNKNOWN_POD
    for x in (p, q, cpu, refused):
        state.filter(fargs(x, names(2)))
    node = state.ledger.allocations[p["metadata"]["uid"]].node
    assert state.bind(bargs(p, "ghost")).code is BindCode.UNKNOWN_NODE
    assert state.bind(bargs(q, node)).code is BindCode.NO_FIT
    assert state.bind(bargs(refused, node)).code is BindCode.REFUSED
    assert state.bind(bargs(cpu, "cpu-node")).code is BindCode.UNMANAGED
    bound = state.bind(bargs(p, node))
    assert bound.code is BindCode.BOUND and bound.ok and bound.record is not None
    assert bound.enforcement is not None and bound.enforcement.value == "none"  # seeded: known by labels only
    assert state.bind(bargs(p, node)).code is BindCode.REPEAT
    assert state.bind(bargs(p, next(n for n in names(2) if n != node))).code is BindCode.ALREADY_BOUND
    failing = ExtenderState(CATALOG, Failing(), StateConfig())
    failing.add_node("node-0", synthetic_cards("node-0", 1, V100, 32768))
    failing.filter(fargs(q, ["node-0"]))
    before = failing.ledger.fingerprint()
    failed = failing.bind(bargs(q, "node-0"))
    assert failed.code is BindCode.BINDER_FAILED and "API away" in failed.error
    assert q["metadata"]["uid"] not in failing.ledger.allocations and failing.ledger.fingerprint() != before


# ---- stateful property: every answer equals a recomputation from scratch ---------------------------

PRODUCTS = ("v100-25", "v100-50", "v100-100", "v100-25", "v100-50", "v100-100:2")
NODE_POOL = [*names(4), "t4-node", "ghost"]


def _request_of(i: int) -> tuple[str, int]:
    product, _, count = PRODUCTS[i % len(PRODUCTS)].partition(":")
    return product, int(count or 1)


def _without(state: ExtenderState, uid: str) -> Ledger:
    """A copy of the ledger without ``uid``'s reservation: what the pod's own decisions see."""
    ledger = copy.deepcopy(state.ledger)
    held = ledger.allocations.get(uid)
    if held is not None and held.reserved:
        ledger.release(uid)
    return ledger


class ExtenderMachine(RuleBasedStateMachine):
    mode = "strict"
    policy = "best-fit"

    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock()
        self.state = make_state(nodes=4, gpus=2, mode=self.mode, policy=self.policy, clock=self.clock, ttl=30)
        self.state.add_node("t4-node", synthetic_cards("t4-node", 1, "Tesla-T4", 15360))
        self.pods = {}
        for i in range(10):
            product, count = _request_of(i)
            self.pods[i] = pod(f"p{i}", product, count=count)

    def _uid(self, i: int) -> str:
        uid: str = self.pods[i]["metadata"]["uid"]
        return uid

    @rule(i=st.integers(0, 9), subset=st.lists(st.sampled_from(NODE_POOL), min_size=0, max_size=6, unique=True))
    def filter(self, i: int, subset: list[str]) -> None:
        self.state.expire()
        uid = self._uid(i)
        request = self.state.describe(self.pods[i]).request
        assert request is not None
        held = self.state.ledger.allocations.get(uid)
        ref = _without(self.state, uid)
        out = self.state.filter(fargs(self.pods[i], subset)).result
        if held is not None and not held.reserved:
            assert out.node_names == [n for n in subset if n == held.node]
            return
        fitting = [n for n in subset if ref.explain(request, n) is None]
        misfits = {n: m for n in subset if (m := ref.explain(request, n)) is not None}
        if self.mode == "strict" and fitting:
            best = get_policy(self.policy).best_nodes(ref, request, fitting)
            assert out.node_names == best  # the policy's ties, in stable node order
            assert self.state.ledger.allocations[uid].node in best
            assert self.state.ledger.allocations[uid].reserved
        else:
            assert out.node_names == fitting
        assert set(out.unresolvable) == {n for n, m in misfits.items() if not m.resolvable}
        assert set(out.failed) == {n for n, m in misfits.items() if m.resolvable}

    @rule(i=st.integers(0, 9), subset=st.lists(st.sampled_from(NODE_POOL), min_size=0, max_size=6, unique=True))
    def prioritize(self, i: int, subset: list[str]) -> None:
        self.state.expire()
        uid = self._uid(i)
        request = self.state.describe(self.pods[i]).request
        assert request is not None
        held = self.state.ledger.allocations.get(uid)
        ref = _without(self.state, uid)
        before = self.state.ledger.fingerprint()
        scores = self.state.prioritize(fargs(self.pods[i], subset))
        assert self.state.ledger.fingerprint() == before  # a temporary release is put back exactly
        if held is not None and not held.reserved:
            assert scores == {n: (10 if n == held.node else 0) for n in subset}
            return
        assert scores == get_policy(self.policy).scores(ref, request, subset)
        top = [n for n in subset if scores[n] == 10]
        if top:  # prioritize agrees with the GPU bind would pick: 10 exactly on the policy's best nodes
            assert set(top) == set(get_policy(self.policy).best_nodes(ref, request, subset))

    @rule(i=st.integers(0, 9), node=st.sampled_from(NODE_POOL))
    def bind(self, i: int, node: str) -> None:
        self.state.expire()
        uid = self._uid(i)
        held = self.state.ledger.allocations.get(uid)
        before = self.state.ledger.fingerprint()
        expected_gpus = None
        if held is None or held.node != node:
            request = self.state.describe(self.pods[i]).request
            assert request is not None
            expected_gpus = get_policy(self.policy).pick(_without(self.state, uid), request, node)
        out = self.state.bind(bargs(self.pods[i], node))
        if out.ok:
            alloc = self.state.ledger.allocations[uid]
            assert alloc.node == node and not alloc.reserved
            if out.changed and held is not None and held.node == node:
                assert alloc.gpus == held.gpus  # the GPUs reserved at filter are the ones bound
            elif out.changed:
                assert alloc.gpus == expected_gpus  # bind picks with the same policy as prioritize scores
        else:
            assert self.state.ledger.fingerprint() == before

    @rule(i=st.integers(0, 9))
    def release(self, i: int) -> None:
        uid = self._uid(i)
        had = uid in self.state.ledger.allocations
        released = self.state.release(uid)
        assert released or not had
        assert uid not in self.state.ledger.allocations

    @rule(dt=st.sampled_from([1.0, 15.0, 31.0]))
    def tick(self, dt: float) -> None:
        self.clock.now += dt

    @precondition(lambda self: True)
    @invariant()
    def ledger_is_consistent(self) -> None:
        self.state.ledger.verify()
        self.state.waiting.queue.verify()
        for uid in self.state.ledger.allocations:
            assert self.state.waiting.queue.state(uid) != "waiting"


TestStrictMachine = ExtenderMachine.TestCase
TestStrictMachine.settings = settings(max_examples=40, stateful_step_count=25, deadline=None,
                                      suppress_health_check=[HealthCheck.too_slow])


class CooperativeMachine(ExtenderMachine):
    mode = "cooperative"


class FragAwareMachine(ExtenderMachine):
    policy = "frag-aware"


TestCooperativeMachine = CooperativeMachine.TestCase
TestCooperativeMachine.settings = TestStrictMachine.settings
TestFragAwareMachine = FragAwareMachine.TestCase
TestFragAwareMachine.settings = TestStrictMachine.settings


def test_only_a_bound_pod_leaving_counts_as_a_departure_for_the_load_phase() -> None:
    state = make_state(policy="gradient-fit")
    phase = state.policy.context.phase
    assert phase is not None
    reserved, bound = pod("r", "v100-50"), pod("b", "v100-50")
    assert state.filter(fargs(reserved, names(3))).result.node_names
    out = state.filter(fargs(bound, names(3)))
    assert state.bind(bargs(bound, out.result.node_names[0])).ok
    assert (phase.arrivals > 0, phase.departures) == (True, 0.0)
    assert state.release(reserved["metadata"]["uid"])  # a reservation lapses or its pod goes: nothing ran
    assert phase.departures == 0.0 and not phase.churning
    assert state.gauges()["phase"] == (False, 0.0)
    assert state.release(bound["metadata"]["uid"])  # the bound pod finished: its slice is freed
    assert phase.departures == 1.0 and phase.churning
    assert state.gauges()["phase"] == (True, phase.ratio)
    assert not state.release(bound["metadata"]["uid"])  # gone already: counted once
    assert phase.departures == 1.0
    assert make_state(policy="best-fit").gauges()["phase"] is None
