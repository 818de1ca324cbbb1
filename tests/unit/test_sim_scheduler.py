"""The scheduler model: the key cache equals a full scan, ties, extender levels, the queue adapter."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packing.ledger import Ledger
from packing.policies import POLICIES, get_policy, scale_scores
from packing.products import Request
from simulations.cluster import CardModel, TrackedLedger, build_ledger, card_nodes
from simulations.scheduler import KeyCache, ModelledPolicy, Scheduler, SchedulerError, SchedulerModel, run_policy
from simulations.traces import NodeSpec

CARD = CardModel("Tesla-V100-SXM2-32GB", 32768)
REQUESTS = [
    Request(milli=250, memory_mib=8192, cpu_milli=4000, host_memory_mib=1024),
    Request(milli=500, memory_mib=16384, cpu_milli=8000),
    Request(milli=1000, memory_mib=32768, cpu_milli=12000),
    Request(milli=1000, memory_mib=32768, count=2, cpu_milli=2000),
    Request(milli=0, memory_mib=0, count=0, cpu_milli=16000),
]
CACHED = [name for name, p in POLICIES.items() if not p.capabilities.sampled]


def small_cluster(seed: int) -> TrackedLedger:
    nodes = [NodeSpec(f"n{i}", 32000 + 16000 * (i % 3), 1 << 18, (1, 2, 4)[i % 3], "v") for i in range(6)]
    return build_ledger(nodes, CARD, seed=seed)


ops = st.lists(st.tuples(st.sampled_from(["place", "release"]), st.integers(0, len(REQUESTS) - 1),
                         st.integers(0, 10_000)), max_size=40)


@settings(max_examples=40, deadline=None)
@given(ops=ops, seed=st.integers(0, 100), policy=st.sampled_from(CACHED))
def test_key_cache_equals_a_full_scan(ops: list[tuple[str, int, int]], seed: int, policy: str) -> None:
    ledger = small_cluster(seed)
    p = run_policy(policy, REQUESTS, seed)
    cache = KeyCache(ledger, p)
    live: list[str] = []
    for i, (op, r, pick) in enumerate(ops):
        request = REQUESTS[r]
        p.observe(request)  # a mix reader's keys move with the mix: the cache must follow
        assert cache.keys(request) == p.keys(ledger, request, ledger.nodes)
        assert cache.best(request) == p.best_nodes(ledger, request)
        if op == "place":
            best = cache.best(request)
            if best:
                gpus = p.pick(ledger, request, best[pick % len(best)])
                assert gpus is not None
                ledger.assign(f"c{i}", request, best[pick % len(best)], gpus)
                live.append(f"c{i}")
        elif live:
            ledger.release(live.pop(pick % len(live)))
    for request in REQUESTS:
        assert cache.keys(request) == p.keys(ledger, request, ledger.nodes)


def test_stable_ties_take_the_first_node_in_the_seeds_order() -> None:
    ledger = build_ledger(card_nodes(32, per_node=4), CARD, seed=7)
    scheduler = Scheduler(ledger, get_policy("best-fit"), SchedulerModel("stable"))
    request = Request(milli=1000, memory_mib=32768)
    tied = scheduler.candidates(request)
    assert len(tied) == 8  # every node is empty: all tie
    first = min(ledger.nodes.values(), key=lambda n: n.order).name
    assert scheduler.choose(request) == tied[0] == first


def test_the_node_order_is_a_per_seed_permutation() -> None:
    orders = {seed: [n.order for n in build_ledger(card_nodes(64), CARD, seed=seed).nodes.values()]
              for seed in (1, 2)}
    assert sorted(orders[1]) == list(range(8)) and orders[1] != orders[2]


def test_random_ties_pick_among_the_tied_nodes_only() -> None:
    ledger = build_ledger(card_nodes(32, per_node=4), CARD, seed=7)
    request = Request(milli=250, memory_mib=8192)
    ledger.assign("x", request, "node-0003", ("node-0003/gpu0",))
    picks = {Scheduler(ledger, get_policy("spread"), SchedulerModel("random"), seed=s).choose(request)
             for s in range(40)}
    assert "node-0003" not in picks and len(picks) > 3  # spread avoids the used node, ties are random


@settings(max_examples=30, deadline=None)
@given(keys=st.dictionaries(st.text("abcdefgh", min_size=1, max_size=3),
                            st.tuples(st.integers(0, 5), st.integers(0, 3)), min_size=1, max_size=30))
def test_extender_levels_keep_exactly_the_best_keys_on_top(keys: dict[str, tuple[int, int]]) -> None:
    levels = scale_scores(keys)  # type: ignore[arg-type]
    top = max(levels.values())
    best = min(keys.values())
    assert {n for n, s in levels.items() if s == top} == {n for n, k in keys.items() if k == best}


def test_extender_scores_choose_like_exact_scores() -> None:
    for seed in range(5):
        a = small_cluster(seed)
        b = small_cluster(seed)
        exact = Scheduler(a, get_policy("frag-aware"), SchedulerModel("stable", "exact"), seed=seed)
        ext = Scheduler(b, get_policy("frag-aware"), SchedulerModel("stable", "extender"), seed=seed)
        for i, request in enumerate(REQUESTS * 4):
            ea = exact.place(f"c{i}", request)
            eb = ext.place(f"c{i}", request)
            assert (ea is None) == (eb is None)
            if ea is not None and eb is not None:
                assert (ea.node, ea.gpus) == (eb.node, eb.gpus)


def test_best_fit_index_and_key_cache_agree() -> None:
    indexed = small_cluster(3)
    cached = small_cluster(3)
    s1 = Scheduler(indexed, get_policy("best-fit"), use_index=True)
    s2 = Scheduler(cached, get_policy("best-fit"))
    for i, request in enumerate(REQUESTS * 5):
        a, b = s1.place(f"c{i}", request), s2.place(f"c{i}", request)
        assert (a and (a.node, a.gpus)) == (b and (b.node, b.gpus))
    assert indexed.fingerprint() == cached.fingerprint()


def test_random_fit_samples_a_fitting_node() -> None:
    ledger = small_cluster(1)
    request = Request(milli=1000, memory_mib=32768, count=4)
    chosen = {Scheduler(ledger, run_policy("random", REQUESTS, s), seed=s).choose(request) for s in range(20)}
    assert chosen == {n.name for n in ledger.nodes.values() if len(n.gpus) == 4}


def test_modelled_policy_routes_the_queues_choice_through_the_model() -> None:
    ledger = build_ledger(card_nodes(32, per_node=4), CARD, seed=2)
    scheduler = Scheduler(ledger, get_policy("best-fit"), SchedulerModel("random"), seed=11)
    modelled = ModelledPolicy.wrap(scheduler)
    request = Request(milli=1000, memory_mib=32768)
    picks = {modelled.choose(ledger, request).node for _ in range(30)}  # type: ignore[union-attr]
    assert len(picks) > 1  # random ties reach the queue's choice
    plain = Ledger()
    plain.add_node("solo", [("g", "Tesla-V100-SXM2-32GB", 32768)])
    choice = modelled.choose(plain, request)
    assert choice is not None and choice.node == "solo"  # another ledger: the plain policy answers


def test_unknown_modes_are_refused() -> None:
    with pytest.raises(SchedulerError, match="ties"):
        SchedulerModel(ties="first")
    with pytest.raises(SchedulerError, match="scores"):
        SchedulerModel(scores="coarse")


def test_a_run_gets_its_own_mix() -> None:
    online = run_policy("frag-gradient", REQUESTS, 0)
    offline = run_policy("fgd", REQUESTS, 0)
    assert online.context.mix_source is not None and online.context.mix_source.mix().pods == ()  # nothing seen yet
    assert offline.context.mix_source is not None and len(offline.context.mix_source.mix().pods) == len(REQUESTS)
    online.observe(REQUESTS[0])
    assert [p.milli for p in online.context.mix().pods] == [250]
