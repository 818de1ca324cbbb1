"""Stateful property test: random clusters under random sequences of every ledger operation.

After every step the ledger verifies (never over-committed, every unit accounted once, indexes
equal to a recomputation) and agrees with a plain-dict model of which claim holds what. Every
failed operation leaves the fingerprint unchanged, ``release(place(x))`` and ``readmit(release(x))``
are the identity, and no new placement ever lands on a withdrawn GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from packing.ledger import Ledger, LedgerError, NoFit
from packing.policies import BEST_FIT, FIRST_FIT, FRAG_AWARE, SPREAD, Policy, place, place_on
from packing.products import Catalog, Request, load_catalog

T = TypeVar("T")

CATALOG: Catalog = load_catalog()
MODELS = {"Tesla-V100-SXM2-32GB": 32768, "Tesla-V100-PCIE-32GB": 32768, "Tesla-T4": 16384}
NODE_NAMES = [f"n{i}" for i in range(6)]
CLAIMS = [f"c{i}" for i in range(14)]

model_labels = st.sampled_from(sorted(MODELS))
times = st.integers(0, 100).map(float)
policies = st.sampled_from([BEST_FIT, FIRST_FIT, SPREAD, FRAG_AWARE])  # POLICIES may hold others' policies


@st.composite
def requests(draw: st.DrawFn, gpu_less: bool = True) -> Request:
    """Catalog products (k whole cards too), free-form slices of any model, and GPU-less asks."""
    cpu = draw(st.sampled_from([0, 0, 500, 4000, 20000]))
    ram = draw(st.sampled_from([0, 0, 2048, 40000]))
    kind = draw(st.sampled_from(["product", "product", "free"] + ["gpu-less"] * gpu_less))
    if kind == "product":
        name = draw(st.sampled_from([p.name for p in CATALOG.products]))
        count = draw(st.integers(1, 8)) if CATALOG.product(name).whole else 1
        return CATALOG.request(name, count, cpu, ram)
    if kind == "gpu-less":
        return Request(0, 0, count=0, cpu_milli=cpu, host_memory_mib=ram)
    milli = draw(st.sampled_from([125, 250, 500, 1000]) | st.integers(1, 1000))
    count = draw(st.integers(1, 3)) if milli == 1000 else 1
    model = draw(st.sampled_from([None, "Tesla-V100-*", "Tesla-T4", "*"]))
    return Request(milli, draw(st.integers(0, 20000)), count, model, None, cpu, ram)


node_shapes = st.integers(1, 8).flatmap(
    lambda n: st.lists(model_labels, min_size=n, max_size=n) | model_labels.map(lambda m: [m] * n)
)
host_sizes = st.none() | st.sampled_from([8000, 32000])


class LedgerMachine(RuleBasedStateMachine):
    """Drives one Ledger and a dict model of it; the two must agree after every step."""

    def __init__(self) -> None:
        super().__init__()
        self.ledger = Ledger()
        self.model: dict[str, tuple[str, tuple[str, ...], Request, float | None]] = {}
        self.withdrawn: set[str] = set()
        self.serial = 0

    # ---- helpers ---------------------------------------------------------------------------

    def attempt(self, what: str, op: Callable[[], T]) -> T | None:
        """Run ``op``; when the ledger refuses, it must be exactly as before."""
        before = self.ledger.fingerprint()
        try:
            done = op()
        except LedgerError as e:  # NoFit and UnknownClaim are LedgerErrors too
            assert self.ledger.fingerprint() == before, "a refused operation changed the ledger"
            event(f"{what}: refused ({type(e).__name__})")
            return None
        event(f"{what}: done")
        return done

    def fits_somewhere(self, request: Request, nodes: list[str] | None) -> bool:
        names = self.ledger.nodes if nodes is None else nodes
        return any(n in self.ledger.nodes and self.ledger.fits_on(self.ledger.nodes[n], request) for n in names)

    def held(self, claim: str) -> bool:
        return claim in self.model

    def some_claim(self, data: st.DataObject) -> str:
        """Mostly a claim the ledger holds (so lifecycle steps do something), sometimes any name."""
        if self.model and data.draw(st.integers(0, 3)) > 0:
            return data.draw(st.sampled_from(sorted(self.model)))
        return data.draw(st.sampled_from(CLAIMS))

    # ---- inventory ---------------------------------------------------------------------------

    @initialize(shapes=st.lists(node_shapes, min_size=1, max_size=4), tracked=st.booleans())
    def cluster(self, shapes: list[list[str]], tracked: bool) -> None:
        host = 32000 if tracked else None
        for name, shape in zip(NODE_NAMES, shapes, strict=False):
            self.ledger.add_node(name, [(f"{name}-g{i}", m, MODELS[m]) for i, m in enumerate(shape)], host, host)

    @rule(name=st.sampled_from(NODE_NAMES), shape=node_shapes, cpu=host_sizes, ram=host_sizes,
          order=st.none() | st.integers(0, 5))
    def add_node(self, name: str, shape: list[str], cpu: int | None, ram: int | None, order: int | None) -> None:
        self.serial += 1
        gpus = [(f"{name}-{self.serial}-g{i}", m, MODELS[m]) for i, m in enumerate(shape)]
        existed = name in self.ledger.nodes
        node = self.attempt("add_node", lambda: self.ledger.add_node(name, gpus, cpu, ram, order))
        assert (node is None) == existed

    @precondition(lambda self: bool(self.ledger.gpus))
    @rule(name=st.sampled_from(NODE_NAMES), data=st.data())
    def add_node_stealing_a_gpu(self, name: str, data: st.DataObject) -> None:
        stolen = data.draw(st.sampled_from(sorted(self.ledger.gpus)))
        node = self.attempt("add_node", lambda: self.ledger.add_node(name, [(stolen, "Tesla-T4", 16384)]))
        assert node is None

    @rule(name=st.sampled_from(NODE_NAMES))
    def remove_node(self, name: str) -> None:
        existed = name in self.ledger.nodes
        dropped = self.attempt("remove_node", lambda: self.ledger.remove_node(name))
        assert (dropped is not None) == existed
        if dropped is not None:
            self.withdrawn = {u for u in self.withdrawn if u in self.ledger.gpus}
            gone = {c for c, (node, *_) in self.model.items() if node == name}
            assert {a.claim for a in dropped} == gone
            for c in gone:
                del self.model[c]

    # ---- placement ---------------------------------------------------------------------------

    @rule(claim=st.sampled_from(CLAIMS), request=requests(), policy=policies,
          nodes=st.none() | st.lists(st.sampled_from(NODE_NAMES), unique=True),
          expires_at=st.none() | times, keep=st.booleans())
    def place(self, claim: str, request: Request, policy: Policy, nodes: list[str] | None,
              expires_at: float | None, keep: bool) -> None:
        before = self.ledger.fingerprint()
        fits = self.fits_somewhere(request, nodes)
        alloc = self.attempt("place", lambda: place(self.ledger, claim, request, policy, nodes, expires_at))
        assert (alloc is not None) == (fits and not self.held(claim))
        if alloc is None:
            return
        assert nodes is None or alloc.node in nodes
        assert not set(alloc.gpus) & self.withdrawn, "a new placement on a withdrawn GPU"
        if keep:
            self.model[claim] = (alloc.node, alloc.gpus, request, expires_at)
        else:
            self.ledger.verify()
            assert self.ledger.release(claim) == alloc
            assert self.ledger.fingerprint() == before, "release(place(x)) is not the identity"

    @rule(claim=st.sampled_from(CLAIMS), request=requests(), policy=policies, node=st.sampled_from(NODE_NAMES),
          expires_at=st.none() | times)
    def place_on(self, claim: str, request: Request, policy: Policy, node: str, expires_at: float | None) -> None:
        fits = node in self.ledger.nodes and self.ledger.fits_on(self.ledger.nodes[node], request)
        alloc = self.attempt("place_on", lambda: place_on(self.ledger, claim, request, node, policy, expires_at))
        assert (alloc is not None) == (fits and not self.held(claim))
        if alloc is not None:
            assert alloc.node == node and len(alloc.gpus) == request.count
            assert not set(alloc.gpus) & self.withdrawn, "a new placement on a withdrawn GPU"
            self.model[claim] = (node, alloc.gpus, request, expires_at)

    @rule(claim=st.sampled_from(CLAIMS), request=requests(), node=st.sampled_from(NODE_NAMES),
          expires_at=st.none() | times, data=st.data())
    def assign(self, claim: str, request: Request, node: str, expires_at: float | None, data: st.DataObject) -> None:
        cards = self.ledger.nodes[node].gpus if node in self.ledger.nodes else []
        # mostly the right number of the node's own cards; sometimes too many, or cards that are not there
        size = data.draw(st.sampled_from([request.count] * 3 + [request.count + 1, max(0, request.count - 1)]))
        picks = data.draw(st.lists(st.integers(0, 9), min_size=size, max_size=size))
        gpus = tuple(cards[i].uuid if i < len(cards) else f"ghost-{i}" for i in picks)
        alloc = self.attempt("assign", lambda: self.ledger.assign(claim, request, node, gpus, expires_at))
        if alloc is not None:
            assert (alloc.node, alloc.gpus) == (node, gpus) and not self.held(claim)
            assert not set(gpus) & self.withdrawn, "a new placement on a withdrawn GPU"
            self.model[claim] = (node, gpus, request, expires_at)

    @precondition(lambda self: bool(self.ledger.gpus))
    @rule(data=st.data(), withdrawn=st.booleans())
    def withdraw(self, data: st.DataObject, withdrawn: bool) -> None:
        uuid = data.draw(st.sampled_from(sorted(self.ledger.gpus)))
        held = dict(self.ledger.allocations)
        self.ledger.withdraw(uuid, withdrawn)
        assert self.ledger.allocations == held, "withdrawing a GPU must keep what it holds"
        if withdrawn:
            self.withdrawn.add(uuid)
        else:
            self.withdrawn.discard(uuid)
        event(f"withdraw: {'out' if withdrawn else 'back in'}{'' if self.ledger.gpus[uuid].empty else ' (busy)'}")

    @rule(data=st.data())
    def release_then_readmit(self, data: st.DataObject) -> None:
        claim = self.some_claim(data)
        if not self.held(claim):
            return
        before = self.ledger.fingerprint()
        alloc = self.ledger.release(claim)
        self.ledger.verify()
        assert self.ledger.readmit(alloc) == alloc
        assert self.ledger.fingerprint() == before, "readmit(release(x)) is not the identity"
        assert self.attempt("readmit", lambda: self.ledger.readmit(alloc)) is None  # held already: refused

    # ---- lifecycle ---------------------------------------------------------------------------

    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        claim = self.some_claim(data)
        alloc = self.attempt("release", lambda: self.ledger.release(claim))
        assert (alloc is not None) == self.held(claim)
        if alloc is not None:
            assert (alloc.node, alloc.gpus) == self.model.pop(claim)[:2]

    @rule(data=st.data())
    def commit(self, data: st.DataObject) -> None:
        claim = self.some_claim(data)
        alloc = self.attempt("commit", lambda: self.ledger.commit(claim))
        assert (alloc is not None) == self.held(claim)
        if alloc is not None:
            assert not alloc.reserved
            self.model[claim] = (*self.model[claim][:3], None)

    @rule(expires_at=times, data=st.data())
    def extend(self, expires_at: float, data: st.DataObject) -> None:
        claim = self.some_claim(data)
        reserved = self.held(claim) and self.model[claim][3] is not None
        alloc = self.attempt("extend", lambda: self.ledger.extend(claim, expires_at))
        assert (alloc is not None) == reserved
        if alloc is not None:
            self.model[claim] = (*self.model[claim][:3], expires_at)

    @rule(now=times)
    def expire(self, now: float) -> None:
        due = {c for c, (*_, t) in self.model.items() if t is not None and t <= now}
        expired = self.ledger.expire(now)
        assert {a.claim for a in expired} == due
        assert [a.expires_at for a in expired] == sorted(a.expires_at for a in expired)  # type: ignore[type-var]
        for c in due:
            del self.model[c]

    # ---- read-only checks against the live state ------------------------------------------

    @rule(request=requests())
    def explain_agrees_with_fits(self, request: Request) -> None:
        for name, node in self.ledger.nodes.items():
            misfit = self.ledger.explain(request, name)
            assert (misfit is None) == self.ledger.fits_on(node, request), (name, misfit)

    @rule(request=requests(gpu_less=False))
    def free_slices_counts_what_placement_takes(self, request: Request) -> None:
        # only meaningful where CPU/RAM cannot be the limit: free_slices counts GPU capacity alone
        if any(n.cpu_milli is not None or n.memory_mib is not None for n in self.ledger.nodes.values()):
            return
        before = self.ledger.fingerprint()
        expected = self.ledger.free_slices(request)
        placed: list[str] = []
        while True:
            try:
                placed.append(place(self.ledger, f"probe-{len(placed)}", request).claim)
            except NoFit:
                break
        assert len(placed) == expected
        for claim in placed:
            self.ledger.release(claim)
        assert self.ledger.fingerprint() == before

    # ---- invariants --------------------------------------------------------------------------

    @invariant()
    def ledger_verifies(self) -> None:
        self.ledger.verify()

    @invariant()
    def withdrawn_gpus_agree_with_the_model(self) -> None:
        assert {u for u, g in self.ledger.gpus.items() if g.withdrawn} == self.withdrawn

    @invariant()
    def ledger_agrees_with_the_model(self) -> None:
        held = {c: (a.node, a.gpus, a.request, a.expires_at) for c, a in self.ledger.allocations.items()}
        assert held == self.model


LedgerMachine.TestCase.settings = settings(max_examples=250, stateful_step_count=50, deadline=None)
test_ledger_machine = LedgerMachine.TestCase
