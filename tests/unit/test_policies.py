"""Placement policies, checked against brute force over random ledgers, plus worked examples."""

from __future__ import annotations

import contextlib
from collections.abc import Collection

import pytest
from hypothesis import given, note, settings
from hypothesis import strategies as st

from packing.fragment import TypicalMix
from packing.ledger import Gpu, Ledger, LedgerError, NoFit
from packing.mix_estimator import FixedMix
from packing.policies import (
    BEST_FIT,
    DEFAULT_POLICY,
    FIRST_FIT,
    FRAG_AWARE,
    MAX_SCORE,
    POLICIES,
    SPREAD,
    Capabilities,
    Choice,
    NodeKey,
    Policy,
    get_policy,
    place,
    place_on,
    policy_for,
    policy_names,
    scale_scores,
)
from packing.policies.best_fit import indexed_best_nodes
from packing.products import Catalog, Request, load_catalog

CATALOG: Catalog = load_catalog()
MODELS = {"Tesla-V100-SXM2-32GB": 32768, "Tesla-V100-PCIE-32GB": 32768, "Tesla-T4": 16384}
V100 = "Tesla-V100-SXM2-32GB"
Q = CATALOG.request("v100-25")
H = CATALOG.request("v100-50")
W = CATALOG.request("v100-100")
# a mix for the policies that read one: catalog slices, free-form shares and host CPU
MIX = FixedMix(TypicalMix.from_requests(
    [Q, Q, H, W, W, W, CATALOG.request("v100-100", 2), Request(470, cpu_milli=4000), Request(810, cpu_milli=8000),
     Request(0, count=0, cpu_milli=2000)]))
# every registered policy but random fit (its key is a fresh draw), each with its own context
KEYED = [policy_for(name, MIX) for name, p in POLICIES.items() if not p.capabilities.sampled]


# ---- strategies ----------------------------------------------------------------------------------

model_labels = st.sampled_from(sorted(MODELS))


@st.composite
def requests(draw: st.DrawFn) -> Request:
    """Catalog products (k whole cards too), free-form slices of any model, and GPU-less asks."""
    cpu = draw(st.sampled_from([0, 0, 500, 2000, 8000]))
    ram = draw(st.sampled_from([0, 0, 1024, 16384]))
    kind = draw(st.sampled_from(["product", "product", "free", "gpu-less"]))
    if kind == "product":
        name = draw(st.sampled_from([p.name for p in CATALOG.products]))
        count = draw(st.integers(1, 8)) if CATALOG.product(name).whole else 1
        return CATALOG.request(name, count, cpu, ram)
    if kind == "gpu-less":
        return Request(0, 0, count=0, cpu_milli=cpu, host_memory_mib=ram)
    milli = draw(st.sampled_from([125, 250, 300, 500, 750, 1000]) | st.integers(1, 1000))
    count = draw(st.integers(1, 4)) if milli == 1000 else 1
    model = draw(st.sampled_from([None, "Tesla-V100-*", "Tesla-T4", V100, "*"]))
    return Request(milli, draw(st.integers(0, 20000)), count, model, None, cpu, ram)


@st.composite
def ledgers(draw: st.DrawFn, max_nodes: int = 8) -> Ledger:
    """A random cluster (1-8 cards a node, sometimes mixed models, optional CPU/RAM) in a random state.

    The state comes from ``assign`` at random GPUs, not from a policy, so every reachable
    fragmentation pattern is on the table.
    """
    ledger = Ledger()
    for n in range(draw(st.integers(1, max_nodes))):
        size = draw(st.integers(1, 8))
        if draw(st.booleans()):
            labels = draw(st.lists(model_labels, min_size=size, max_size=size))
        else:
            labels = [draw(model_labels)] * size
        tracked = draw(st.booleans())
        ledger.add_node(
            f"n{n}",
            [(f"n{n}-g{i}", m, MODELS[m]) for i, m in enumerate(labels)],
            cpu_milli=16000 if tracked else None,
            memory_mib=65536 if tracked else None,
            order=draw(st.integers(0, 3)) if draw(st.booleans()) else None,  # ties in order are allowed
        )
    names = sorted(ledger.nodes)
    for c in range(draw(st.integers(0, 30))):
        r = draw(requests())
        node = ledger.nodes[draw(st.sampled_from(names))]
        if r.count > len(node.gpus):
            continue
        uuids = [g.uuid for g in node.gpus]
        picks = draw(st.lists(st.sampled_from(uuids), min_size=r.count, max_size=r.count, unique=True)) if uuids else []
        with contextlib.suppress(LedgerError):  # refused picks simply leave that claim out
            ledger.assign(f"c{c}", r, node.name, tuple(picks))
    ledger.verify()
    return ledger


def describe(ledger: Ledger) -> str:
    """The ledger's cards and claims, for hypothesis's failure report."""
    lines = []
    for n in ledger.nodes.values():
        host = "" if n.cpu_milli is None else f" cpu {n.free_cpu}/{n.cpu_milli} ram {n.free_mem}/{n.memory_mib}"
        cards = ", ".join(f"{g.uuid}:{g.model} {g.free_milli}m/{g.free_mib}MiB" for g in n.gpus)
        lines.append(f"{n.name} (order {n.order}{host}): {cards}")
    lines += [f"{a.claim} -> {a.node} {a.gpus} {a.request.describe()}" for a in ledger.allocations.values()]
    return "\n".join(lines)


def subsets(ledger: Ledger) -> st.SearchStrategy[Collection[str] | None]:
    names = [*sorted(ledger.nodes), "not-a-node"]
    return st.none() | st.lists(st.sampled_from(names), unique=True) | st.sets(st.sampled_from(names))


# ---- brute force ---------------------------------------------------------------------------------


def brute_best_fit(ledger: Ledger, request: Request, nodes: Collection[str] | None
                   ) -> tuple[str, tuple[str, ...]] | None:
    """Best fit by exhaustive search, written from the specification rather than the index."""
    allowed = [n for n in ledger.nodes.values() if nodes is None or n.name in nodes]
    hosts = [n for n in allowed if ledger.host_fits(n, request)]
    if request.gpu_less:
        best = min(hosts, key=lambda n: (n.free_gpu_milli, n.order, n.name), default=None)
        return None if best is None else (best.name, ())
    if request.whole:
        def empty(n: list[Gpu]) -> list[Gpu]:
            return [g for g in n if g.free_milli == g.milli and g.free_mib == g.memory_mib
                    and request.accepts_model(g.model) and g.memory_mib >= request.memory_mib]
        able = [n for n in hosts if len(empty(n.gpus)) >= request.count]
        if not able:
            return None
        node = min(able, key=lambda n: (len(empty(n.gpus)), n.free_gpu_milli, n.order, n.name))
        cards = sorted(empty(node.gpus), key=lambda g: (g.free_mib - request.memory_mib, g.index))
        return node.name, tuple(g.uuid for g in cards[: request.count])
    fits = [(g, n) for n in hosts for g in n.gpus
            if g.free_milli >= request.milli and g.free_mib >= request.memory_mib and request.accepts_model(g.model)]
    if not fits:
        return None
    g, n = min(fits, key=lambda gn: (gn[0].free_milli - request.milli, gn[1].free_gpu_milli, gn[1].order,
                                     gn[1].name, gn[0].free_mib - request.memory_mib, gn[0].index))
    return n.name, (g.uuid,)


def brute_choose(policy: Policy, ledger: Ledger, request: Request, nodes: Collection[str] | None) -> Choice | None:
    """The argmin of (node_key, node order) over every allowed node, then the policy's pick there."""
    keyed = [(k, n.order, n.name) for n in ledger.nodes.values()
             if (nodes is None or n.name in nodes) and (k := policy.node_key(ledger, request, n)) is not None]
    if not keyed:
        return None
    key, _, name = min(keyed)
    gpus = policy.pick(ledger, request, name)
    assert gpus is not None
    return Choice(name, gpus, key)


def generic_best_nodes(ledger: Ledger, request: Request, nodes: Collection[str] | None) -> list[str]:
    keys = BEST_FIT.keys(ledger, request, ledger.nodes if nodes is None else nodes)
    if not keys:
        return []
    best = min(keys.values())
    return sorted((n for n, k in keys.items() if k == best), key=lambda n: (ledger.nodes[n].order, n))


# ---- properties ----------------------------------------------------------------------------------


@given(st.data())
@settings(max_examples=300)
def test_best_fit_places_on_the_brute_force_best_gpu(data: st.DataObject) -> None:
    ledger = data.draw(ledgers())
    note(describe(ledger))
    request = data.draw(requests())
    nodes = data.draw(subsets(ledger))
    expected = brute_best_fit(ledger, request, nodes)
    before = ledger.fingerprint()
    if expected is None:
        with pytest.raises(NoFit):
            place(ledger, "new", request, BEST_FIT, nodes)
        assert ledger.fingerprint() == before
        return
    alloc = place(ledger, "new", request, BEST_FIT, nodes)
    assert (alloc.node, alloc.gpus) == expected
    ledger.verify()
    ledger.release("new")
    assert ledger.fingerprint() == before


@given(st.data())
@settings(max_examples=300)
def test_every_policy_chooses_the_argmin_of_its_node_key(data: st.DataObject) -> None:
    ledger = data.draw(ledgers())
    note(describe(ledger))
    request = data.draw(requests())
    nodes = data.draw(subsets(ledger))
    policy = data.draw(st.sampled_from(KEYED))
    choice = policy.choose(ledger, request, nodes)
    assert choice == brute_choose(policy, ledger, request, nodes)
    candidates = [*(ledger.nodes if nodes is None else nodes), "not-a-node"]
    fitting = {n for n in candidates if n in ledger.nodes and ledger.fits_on(ledger.nodes[n], request)}
    scores = policy.scores(ledger, request, candidates)
    for name, score in scores.items():
        assert (score == 0) == (name not in fitting), (name, score)
        assert 0 <= score <= MAX_SCORE
    if choice is None:
        assert not fitting
        return
    assert scores[choice.node] == MAX_SCORE
    assert policy.pick(ledger, request, choice.node) == choice.gpus  # the GPU bound is the GPU scored
    assert choice.key == policy.node_key(ledger, request, ledger.nodes[choice.node])
    if nodes is None:
        assert choice.node in policy.best_nodes(ledger, request)
        best_key = min(k for k in policy.keys(ledger, request, ledger.nodes).values())
        assert choice.key == best_key


@given(st.data())
@settings(max_examples=400)
def test_best_fit_fast_path_equals_the_generic_scan(data: st.DataObject) -> None:
    ledger = data.draw(ledgers())
    note(describe(ledger))
    request = data.draw(requests().filter(lambda r: not r.gpu_less))
    nodes = data.draw(subsets(ledger))
    fast = indexed_best_nodes(ledger, request, nodes)
    generic = generic_best_nodes(ledger, request, nodes)
    models = [m for m in ledger.models() if request.accepts_model(m)]
    first = indexed_best_nodes(ledger, request, nodes, first_only=True)
    if request.whole and len(models) > 1:
        assert fast is None and first is None  # declined: the scan decides
    else:
        assert fast == generic
        assert first is not None and first[:1] == generic[:1]  # choose's short cut finds the same winner
    assert BEST_FIT.best_nodes(ledger, request, nodes) == generic


@given(st.dictionaries(st.text(max_size=3), st.tuples(st.integers(-3, 3), st.integers(0, 3)), max_size=25))
def test_scale_scores_keeps_the_order_of_keys(keys: dict[str, NodeKey]) -> None:
    scores = scale_scores(keys)
    assert scores.keys() == keys.keys()
    for a in keys:
        assert 1 <= scores[a] <= MAX_SCORE
        assert (scores[a] == MAX_SCORE) == (keys[a] == min(keys.values()))
        for b in keys:
            if keys[a] < keys[b]:
                assert scores[a] >= scores[b]


def test_scale_scores_separates_the_best_from_the_rest() -> None:
    assert scale_scores({"a": (0, 5), "b": (250, 5), "c": (500, 1)}) == {"a": 10, "b": 5, "c": 1}
    assert scale_scores({}) == {}


# ---- worked examples -----------------------------------------------------------------------------


def cluster(*shape: int) -> Ledger:
    ledger = Ledger()
    for i, n in enumerate(shape):
        ledger.add_node(f"n{i}", [(f"n{i}-g{j}", V100, 32768) for j in range(n)])
    return ledger


def test_best_fit_prefers_the_tightest_card_then_the_fullest_node() -> None:
    ledger = cluster(2, 2)
    ledger.assign("a", H, "n0", ("n0-g0",))
    ledger.assign("b", H, "n1", ("n1-g1",))
    ledger.assign("c", W, "n1", ("n1-g0",))
    alloc = place(ledger, "q", Q, BEST_FIT)
    assert (alloc.node, alloc.gpus) == ("n1", ("n1-g1",))  # both 500-free cards tie; n1 is fuller


def test_first_fit_takes_the_first_node_and_card() -> None:
    ledger = cluster(2, 2)
    ledger.assign("a", W, "n0", ("n0-g0",))
    ledger.assign("b", H, "n1", ("n1-g0",))
    assert place(ledger, "q", Q, FIRST_FIT).gpus == ("n0-g1",)


def test_spread_takes_the_emptiest_card() -> None:
    ledger = cluster(1, 1)
    ledger.assign("a", Q, "n0", ("n0-g0",))
    assert place(ledger, "q", Q, SPREAD).gpus == ("n1-g0",)
    assert place(ledger, "r", Q, SPREAD).gpus == ("n0-g0",)  # 750 free each: n0 comes first in order


def test_frag_aware_keeps_empty_cards_whole() -> None:
    ledger = cluster(2)
    ledger.assign("a", Q, "n0", ("n0-g0",))
    # best fit and frag-aware agree here; with a half-used card they differ only on key structure
    assert place(ledger, "q", Q, FRAG_AWARE).gpus == ("n0-g0",)
    other = cluster(1, 1)
    other.assign("a", H, "n0", ("n0-g0",))
    other.assign("b", Q, "n0", ("n0-g0",))  # 250 left on n0
    assert place(other, "h", H, FRAG_AWARE).gpus == ("n1-g0",)  # no partly used card fits: break n1


def test_k_whole_cards_go_to_the_node_with_the_fewest_empty_cards() -> None:
    ledger = cluster(8, 4, 4)
    ledger.assign("a", Q, "n2", ("n2-g0",))
    two = CATALOG.request("v100-100", count=2)
    assert place(ledger, "w", two, BEST_FIT).node == "n2"  # 3 empty cards, the fewest that still hold 2
    assert place(ledger, "x", CATALOG.request("v100-100", count=8), BEST_FIT).node == "n0"


def test_gpu_less_requests_go_to_the_node_with_the_least_idle_gpu() -> None:
    ledger = cluster(2, 1)
    ledger.add_node("cpu", [])
    assert place(ledger, "job", Request(0, count=0), BEST_FIT).node == "cpu"


def test_best_fit_sees_every_model_on_a_mixed_node() -> None:
    # regression: the fast path kept a node's first-seen (worse) key from another model's index
    ledger = Ledger()
    ledger.add_node("a", [("a0", "X", 1000), ("a1", "Y", 1000)])
    ledger.assign("big", Request(750, model="Y"), "a", ("a1",))
    alloc = place(ledger, "q", Request(250), BEST_FIT)
    assert alloc.gpus == ("a1",)


def test_whole_cards_of_two_models_on_one_node() -> None:
    # regression: the per-model whole-card index cannot see k cards spread over two models
    ledger = Ledger()
    ledger.add_node("a", [("a0", "X", 1000), ("a1", "Y", 1000)])
    assert place(ledger, "w", Request(1000, count=2), BEST_FIT).gpus == ("a0", "a1")


def test_no_fit_explains_every_node_and_changes_nothing() -> None:
    ledger = cluster(1, 1)
    ledger.assign("a", W, "n0", ("n0-g0",))
    ledger.assign("b", H, "n1", ("n1-g0",))
    before = ledger.fingerprint()
    with pytest.raises(NoFit) as err:
        place(ledger, "w", W, BEST_FIT)
    assert str(err.value) == "v100-100 fits on none of 2 node(s): NotEnoughWholeGPUs on 2 node(s)"
    assert set(err.value.misfits) == {"n0", "n1"}
    assert err.value.misfits["n1"].message == "needs 1 empty card(s); 0 empty here"
    assert ledger.fingerprint() == before


def test_no_fit_on_an_empty_ledger() -> None:
    with pytest.raises(NoFit, match="v100-25 fits nowhere: no nodes"):
        place(Ledger(), "q", Q)


def test_place_refuses_a_claim_twice() -> None:
    ledger = cluster(2)
    place(ledger, "q", Q)
    before = ledger.fingerprint()
    with pytest.raises(LedgerError, match="claim q already holds an allocation on n0"):
        place(ledger, "q", Q)
    with pytest.raises(LedgerError, match="claim q already holds"):
        place_on(ledger, "q", Q, "n0")
    assert ledger.fingerprint() == before


def test_place_on_a_node_that_cannot_hold_it() -> None:
    ledger = cluster(1)
    with pytest.raises(NoFit, match="v100-25 does not fit on n9: gpuslice knows no GPUs on node n9") as err:
        place_on(ledger, "q", Q, "n9")
    assert err.value.misfits["n9"].code == "UnknownNode"
    place_on(ledger, "w", W, "n0")
    with pytest.raises(NoFit, match="no GPU with 250 milli free; largest free 0"):
        place_on(ledger, "q", Q, "n0")


def test_policy_registry_is_one_immutable_mapping() -> None:
    assert policy_names()[0] == DEFAULT_POLICY and get_policy("best-fit") is BEST_FIT
    with pytest.raises(ValueError, match="unknown policy 'worst'; choose one of gradient-fit, best-fit"):
        get_policy("worst")
    with pytest.raises(TypeError):
        POLICIES["worst"] = BEST_FIT  # type: ignore[index]
    assert {"random", "go-best-fit", "fgd"} <= set(POLICIES)  # the baselines are served too, marked
    assert [n for n, p in POLICIES.items() if p.capabilities.baseline] == ["random", "go-best-fit", "fgd"]
    assert policy_names(baselines=False) == [n for n in POLICIES if n not in ("random", "go-best-fit", "fgd")]
    custom = Policy("test-last", "the last node", lambda _c, _l, _r, n: (-n.order,), BEST_FIT.pick_fn)
    assert place(cluster(1, 1, 1), "q", Q, custom).node == "n2"  # an unregistered policy still places


def test_policy_for_gives_each_user_its_own_context() -> None:
    a, b = policy_for(DEFAULT_POLICY), policy_for(DEFAULT_POLICY)
    assert a.context.mix_source is not None and a.context.mix_source is not b.context.mix_source
    version = a.key_version
    a.observe(Q)
    assert a.key_version != version and b.key_version == version
    assert get_policy(DEFAULT_POLICY).context.mix_source is None  # the registry's entry stays context-free
    assert policy_for("best-fit") == BEST_FIT and policy_for("best-fit").key_version == 0
    rng_a, rng_b = policy_for("random", seed=7).context.rng, policy_for("random", seed=7).context.rng
    assert rng_a is not None and rng_b is not None and rng_a.random() == rng_b.random()


def test_capabilities_are_declared_not_inferred_from_names() -> None:
    assert BEST_FIT.capabilities == Capabilities(indexed=True)
    assert get_policy("random").capabilities.sampled and not get_policy("random").capabilities.node_local
    assert get_policy("fgd").capabilities.workload_mix and get_policy("fgd").capabilities.needs_mix
    for name in ("frag-gradient", "relative-gradient", DEFAULT_POLICY):
        caps = get_policy(name).capabilities
        assert caps.needs_mix and caps.unique_keys and not caps.baseline
    assert [n for n in policy_names() if get_policy(n).capabilities.mix_per_card] == [DEFAULT_POLICY]


@pytest.mark.parametrize("policy", KEYED, ids=lambda p: p.name)
def test_ties_in_node_order_break_by_name_whatever_the_candidate_order(policy: Policy) -> None:
    # regression: with equal keys and equal orders the winner followed the caller's list order
    ledger = Ledger()
    for name in ("b", "a", "c"):
        ledger.add_node(name, [(f"{name}-g0", V100, 32768)], order=0)
    for request in (Q, W, Request(0, count=0)):
        for nodes in (None, ["c", "b", "a"], ["b", "a"], {"c", "a"}):
            choice = policy.choose(ledger, request, nodes)
            assert choice is not None and choice.node == "a"
