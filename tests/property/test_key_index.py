"""Stateful property test: a policy answering through its ``KeyIndex`` places exactly as the plain policy.

Every policy that declares ``key_index`` runs twice over one random ledger: the instance ``policy_for``
gives (its keys ranked in a ``packing.key_index.KeyIndex``) and the same policy reading the very same mix
and load phase without an index (the registry's plain scan of every node). Random clusters (one or two
card models, CPU and RAM tracked or not) go through random placements, releases, withdrawn and returned
cards, nodes joining and leaving, arrivals that move the learnt mix, departures that flip the phase.
Before every placement both answer ``choose``, ``best_nodes`` (all nodes, and a random subset, small and
large) and ``keys`` alike; after every step the index's invariants hold (``KeyIndex._check``).
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from packing.key_index import KeyIndex
from packing.ledger import Ledger, LedgerError
from packing.policies import POLICIES, Policy, get_policy, place, policy_for
from packing.products import Catalog, Request, load_catalog

CATALOG: Catalog = load_catalog()
MODELS = {"Tesla-V100-SXM2-32GB": 32768, "Tesla-T4": 16384}
INDEXED = sorted(name for name, p in POLICIES.items() if p.capabilities.key_index)


@st.composite
def requests(draw: st.DrawFn) -> Request:
    """Catalog products (k whole cards too), free-form slices of either model, GPU-less asks."""
    cpu = draw(st.sampled_from([0, 0, 500, 4000, 20000]))
    ram = draw(st.sampled_from([0, 0, 2048, 40000]))
    kind = draw(st.sampled_from(["product", "product", "free", "gpu-less"]))
    if kind == "product":
        name = draw(st.sampled_from([p.name for p in CATALOG.products]))
        count = draw(st.integers(1, 4)) if CATALOG.product(name).whole else 1
        return CATALOG.request(name, count, cpu, ram)
    if kind == "gpu-less":
        return Request(0, 0, count=0, cpu_milli=cpu, host_memory_mib=ram)
    milli = draw(st.sampled_from([125, 250, 500, 1000]))
    count = draw(st.integers(1, 3)) if milli == 1000 else 1
    model = draw(st.sampled_from([None, "Tesla-V100-*", "Tesla-T4"]))
    return Request(milli, draw(st.sampled_from([0, 4096, 16384])), count, model, None, cpu, ram)


node_cards = st.integers(1, 6).flatmap(
    lambda n: st.lists(st.sampled_from(sorted(MODELS)), min_size=n, max_size=n)
    | st.sampled_from(sorted(MODELS)).map(lambda m: [m] * n))
host_sizes = st.none() | st.sampled_from([8000, 32000])


def plain(policy: Policy) -> Policy:
    """The same policy, reading the same mix and phase, with no index: every answer a scan."""
    return get_policy(policy.name).with_context(replace(policy.context, index=None))


class IndexMachine(RuleBasedStateMachine):
    """One ledger, one policy with its index and the same policy without."""

    def __init__(self) -> None:
        super().__init__()
        self.ledger = Ledger()
        self.claims: list[str] = []
        self.serial = 0

    @initialize(name=st.sampled_from(INDEXED), nodes=st.lists(st.tuples(node_cards, host_sizes), min_size=1,
                                                                max_size=7))
    def start(self, name: str, nodes: list[tuple[list[str], int | None]]) -> None:
        for cards, host in nodes:
            self._add(cards, host)
        self.indexed = policy_for(name)
        assert isinstance(self.indexed.context.index, KeyIndex)
        self.plain = plain(self.indexed)

    def _add(self, cards: list[str], host: int | None, name: str | None = None) -> None:
        if name is None:
            name = f"n{self.serial}"
            self.serial += 1
        gpus = [(f"{name}-{self.serial}-g{i}", m, MODELS[m]) for i, m in enumerate(cards)]
        self.serial += 1
        self.ledger.add_node(name, gpus, cpu_milli=host, memory_mib=None if host is None else host * 8)

    # ---- the two must agree ---------------------------------------------------------------------

    def agree(self, request: Request, subset: list[str]) -> None:
        names = list(self.ledger.nodes)
        a, b = self.indexed, self.plain
        assert a.choose(self.ledger, request) == b.choose(self.ledger, request)
        assert a.best_nodes(self.ledger, request) == b.best_nodes(self.ledger, request)
        assert a.keys(self.ledger, request, names) == b.keys(self.ledger, request, names)
        assert a.choose(self.ledger, request, subset) == b.choose(self.ledger, request, subset)
        assert a.best_nodes(self.ledger, request, subset) == b.best_nodes(self.ledger, request, subset)
        many = set(names) - set(subset[:1])  # nearly every node: met in key order, not one by one
        assert a.best_nodes(self.ledger, request, many) == b.best_nodes(self.ledger, request, many)
        assert a.choose(self.ledger, request, many) == b.choose(self.ledger, request, many)

    # ---- rules -------------------------------------------------------------------------------------

    @rule(request=requests(), data=st.data(), reserve=st.booleans())
    def place_one(self, request: Request, data: st.DataObject, reserve: bool) -> None:
        subset = data.draw(st.lists(st.sampled_from(sorted(self.ledger.nodes)), max_size=4)
                           if self.ledger.nodes else st.just([]))
        self.agree(request, subset)
        claim = f"c{self.serial}"
        self.serial += 1
        self.indexed.observe(request)  # the mix and the phase are shared: both policies see the arrival
        try:
            place(self.ledger, claim, request, self.indexed, expires_at=100.0 if reserve else None)
        except LedgerError:
            event("placement: no fit")
            return
        self.claims.append(claim)
        event("placement: done")

    @precondition(lambda self: bool(self.claims))
    @rule(data=st.data(), departs=st.booleans())
    def release(self, data: st.DataObject, departs: bool) -> None:
        claim = data.draw(st.sampled_from(self.claims))
        self.claims.remove(claim)
        self.ledger.release(claim)
        if departs:
            self.indexed.observe_departure()

    @rule(departures=st.integers(1, 400))
    def churn(self, departures: int) -> None:
        """Departures with no capacity freed: the phase may flip to churning (a new key version)."""
        for _ in range(departures):
            self.indexed.observe_departure()

    @precondition(lambda self: bool(self.ledger.gpus))
    @rule(data=st.data(), withdrawn=st.booleans())
    def withdraw(self, data: st.DataObject, withdrawn: bool) -> None:
        self.ledger.withdraw(data.draw(st.sampled_from(sorted(self.ledger.gpus))), withdrawn)

    @rule(cards=node_cards, host=host_sizes)
    def join(self, cards: list[str], host: int | None) -> None:
        self._add(cards, host)

    @precondition(lambda self: len(self.ledger.nodes) > 1)
    @rule(data=st.data(), back=st.none() | st.tuples(node_cards, host_sizes))
    def leave(self, data: st.DataObject, back: tuple[list[str], int | None] | None) -> None:
        """A node leaves; ``back``: it rejoins under its name, a new order, maybe other cards."""
        name = data.draw(st.sampled_from(sorted(self.ledger.nodes)))
        dropped = {a.claim for a in self.ledger.remove_node(name)}
        self.claims = [c for c in self.claims if c not in dropped]
        if back is not None:
            self._add(back[0], back[1], name)

    @rule(request=requests())
    def ask(self, request: Request) -> None:
        self.agree(request, [])

    @invariant()
    def index_holds(self) -> None:
        if hasattr(self, "indexed"):
            index = self.indexed.context.index
            assert index is not None
            index._check(self.ledger, self.indexed.node_key, self.indexed.key_version)


IndexMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)
TestKeyIndex = IndexMachine.TestCase


def test_another_ledger_starts_afresh() -> None:
    """Asked about a second ledger, the index binds to it and answers there as a scan does."""
    policy = policy_for("gradient-fit")
    first, second = Ledger(), Ledger()
    first.add_node("a", [("a0", "Tesla-V100-SXM2-32GB", 32768)])
    second.add_node("b", [("b0", "Tesla-V100-SXM2-32GB", 32768)])
    request = CATALOG.request("v100-50")
    assert policy.best_nodes(first, request) == ["a"]
    assert policy.best_nodes(second, request) == ["b"]
    assert policy.best_nodes(first, request) == ["a"]


def test_a_key_without_the_node_order_is_refused() -> None:
    """The index ranks states and appends the order: a key that does not end with it cannot be indexed."""
    ledger = Ledger()
    ledger.add_node("a", [("a0", "Tesla-V100-SXM2-32GB", 32768)])
    index = KeyIndex()
    try:
        index.best(ledger, CATALOG.request("v100-50"), lambda _l, _r, _n: (0.0, 99.0), 0)
    except ValueError as e:
        assert "end with the node's order" in str(e)
    else:
        raise AssertionError("a key not ending with the node order was indexed")


def test_keys_are_computed_per_capacity_state_not_per_node() -> None:
    """On 200 alike nodes a question, a placement and a new key version each cost a key per state."""
    ledger = Ledger()
    for i in range(200):
        ledger.add_node(f"n{i:03d}", [(f"n{i:03d}-g{k}", "Tesla-V100-SXM2-32GB", 32768) for k in range(8)])
    policy = policy_for("gradient-fit")
    index = policy.context.index
    assert index is not None
    request = CATALOG.request("v100-25")
    assert policy.best_nodes(ledger, request) == ["n000"]
    assert index.keys_computed == 1, "one state (every node empty): one key"
    place(ledger, "c0", request, policy)
    assert policy.best_nodes(ledger, request) == ["n000"]
    assert index.keys_computed == 2, "the placement made one new state"
    version = policy.key_version
    for _ in range(64):  # arrivals until the mix estimator publishes a new snapshot
        policy.observe(CATALOG.request("v100-100"))
    assert policy.key_version != version
    policy.best_nodes(ledger, request)
    assert index.keys_computed == 4 and index.rebuilt == 2, "a new version re-ranks the two states"
