"""What every placement policy is: a node key, a GPU pick, declared capabilities; and the shared verbs.

One policy yields both answers kube-scheduler needs, so they cannot disagree:

* ``node_key(ledger, request, node)``: the node's exact rank (lower is better), or None when the
  request does not fit there; ``prioritize`` scales it to 0..10 and ``filter`` (strict mode)
  keeps the nodes that tie for the best key;
* ``pick_on(ledger, request, node)``: the GPU(s) on that node, used at bind;
* ``choose(ledger, request, nodes)``: the best (node, GPUs) overall: the minimum of
  ``(node_key, node order)``, i.e. the node key then a stable node order.

A policy is immutable. What it reads besides the ledger travels in its ``PolicyContext``: the
workload mix (fragmentation-aware policies), the load phase (filling or churning, ``gradient-fit``)
and a random generator (random fit). The registry (``packing.policies.registry``) holds
context-free entries; ``policy_for`` gives a user (the extender, one simulator run) its own instance.

``Capabilities`` say what callers may rely on instead of checking names: whether keys can be
cached per node, whether the key follows the mix or the phase (drop cached keys when ``key_version`` moves),
whether a logarithmic fast path answers ``best_nodes``, whether keys are unique per node.

A policy that declares ``key_index`` gets a ``KeyIndex`` in its context from ``policy_for``
(``packing.key_index``): ``best_nodes``, ``choose`` and ``keys`` then read node keys ranked per request
shape and kept current as the ledger, the mix and the phase change, with exactly the answers of a scan
(the registry's entries, without a context, scan).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field, replace

from packing.fragment import EMPTY_MIX, TypicalMix
from packing.key_index import KeyIndex
from packing.ledger import Allocation, Gpu, Ledger, LedgerError, Misfit, Node, NoFit
from packing.load_phase import LoadPhase
from packing.mix_estimator import MixSource
from packing.products import Request

NodeKey = tuple[float, ...]
MAX_SCORE = 10  # kube-scheduler's MaxExtenderPriority

_FALLBACK_RNG = random.Random(0)  # a registry entry's generator; policy_for gives each user its own


@dataclass(frozen=True, slots=True)
class Choice:
    node: str
    gpus: tuple[str, ...]
    key: NodeKey


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a policy declares about itself; callers branch on these, never on its name."""

    node_local: bool = True  # the key reads that node's own state only (and the mix, when needs_mix)
    indexed: bool = False  # best_nodes has a logarithmic fast path (the ledger's sorted index, or key_index)
    key_index: bool = False  # key = (a part read from the node's capacity state, node order): kept in a KeyIndex
    needs_mix: bool = False  # the key reads the workload's typical-pod mix (PolicyContext.mix)
    needs_phase: bool = False  # the key reads the load phase, filling or churning (PolicyContext.phase)
    mix_per_card: bool = False  # its online mix weighs a k-card shape 1/k of its claims (fragment.per_card_weights)
    workload_mix: bool = False  # a baseline whose mix is the whole workload, known in advance (FGD's artifact)
    unique_keys: bool = False  # the key ends with the node's order: it never leaves ties to the scheduler
    sampled: bool = False  # best_nodes is a random draw among fitting nodes, not an argmin of keys
    baseline: bool = False  # a published baseline kept for comparison, not meant for production


@dataclass(frozen=True, slots=True)
class PolicyContext:
    """What a policy reads besides the ledger: the workload mix, the load phase and a random generator;
    and the index of its keys (``Capabilities.key_index``), which only makes answers cheaper."""

    mix_source: MixSource | None = None
    rng: random.Random | None = None
    phase: LoadPhase | None = None
    index: KeyIndex | None = None

    def mix(self) -> TypicalMix:
        """The current typical mix (empty without a source: every placement scores alike)."""
        return EMPTY_MIX if self.mix_source is None else self.mix_source.mix()

    @property
    def churning(self) -> bool:
        """Departures keep pace with arrivals (``packing.load_phase``); False without a phase: filling."""
        return self.phase is not None and self.phase.churning

    def random(self) -> random.Random:
        return self.rng if self.rng is not None else _FALLBACK_RNG


KeyFn = Callable[[PolicyContext, Ledger, Request, Node], NodeKey | None]
PickFn = Callable[[PolicyContext, Ledger, Request, Node], tuple[str, ...] | None]
# a fast best_nodes: (context, ledger, request, allowed nodes, first only) -> nodes, or None to scan
BestFn = Callable[[PolicyContext, Ledger, Request, Collection[str] | None, bool], list[str] | None]


def host_ok(ledger: Ledger, node: Node, request: Request) -> bool:
    return ledger.host_fits(node, request)


def gpu_candidates(ledger: Ledger, node: Node, request: Request) -> list[Gpu]:
    """The GPUs of ``node`` that could take one share of ``request``, if the host has room."""
    return ledger.fitting_gpus(node, request) if host_ok(ledger, node, request) else []


# ---- GPU ranking inside one node (lower is better) ----------------------------------------------


def tightest(g: Gpu, r: Request) -> tuple[int, int, int]:
    return (g.free_milli - r.milli, g.free_mib - r.memory_mib, g.index)


def loosest(g: Gpu, r: Request) -> tuple[int, int, int]:
    return (r.milli - g.free_milli, r.memory_mib - g.free_mib, g.index)


def first_card(g: Gpu, r: Request) -> tuple[int, int, int]:
    return (g.index, 0, 0)


def pick_with(rank: Callable[[Gpu, Request], tuple[int, int, int]]) -> PickFn:
    """A GPU pick taking the ``count`` best-ranked fitting GPUs of the node."""

    def pick(_ctx: PolicyContext, ledger: Ledger, request: Request, node: Node) -> tuple[str, ...] | None:
        if request.gpu_less:
            return () if host_ok(ledger, node, request) else None
        gpus = gpu_candidates(ledger, node, request)
        if len(gpus) < request.count:
            return None
        gpus.sort(key=lambda g: rank(g, request))
        return tuple(g.uuid for g in gpus[: request.count])

    return pick


@dataclass(frozen=True)
class Policy:
    """A placement policy: a node key (lower is better), a GPU pick inside a node, its capabilities."""

    name: str
    description: str
    key: KeyFn
    pick_fn: PickFn
    capabilities: Capabilities = field(default_factory=Capabilities)
    fast_best: BestFn | None = None
    context: PolicyContext = field(default_factory=PolicyContext)

    # ---- the two per-node answers -------------------------------------------------------------

    def node_key(self, ledger: Ledger, request: Request, node: Node) -> NodeKey | None:
        """The node's exact key for ``request`` (lower is better), or None when it does not fit."""
        return self.key(self.context, ledger, request, node)

    def pick_on(self, ledger: Ledger, request: Request, node: Node) -> tuple[str, ...] | None:
        """The GPU(s) this policy takes on ``node``, or None when the request does not fit."""
        return self.pick_fn(self.context, ledger, request, node)

    def pick(self, ledger: Ledger, request: Request, node: str) -> tuple[str, ...] | None:
        """The GPU(s) this policy takes on the node called ``node`` (None: unknown node or no fit)."""
        n = ledger.nodes.get(node)
        return None if n is None else self.pick_on(ledger, request, n)

    # ---- context ---------------------------------------------------------------------------------

    def with_context(self, context: PolicyContext) -> Policy:
        """This policy reading ``context`` (its own mix source and generator)."""
        return replace(self, context=context)

    def observe(self, request: Request) -> None:
        """A claim arrived: the mix source learns its shape, the phase counts it (nothing for policies
        without them)."""
        if self.context.mix_source is not None:
            self.context.mix_source.observe(request)
        if self.context.phase is not None:
            self.context.phase.arrive()

    def observe_departure(self) -> None:
        """A bound claim left and freed its slice: the phase counts it (nothing for policies without one)."""
        if self.context.phase is not None:
            self.context.phase.depart()

    @property
    def key_version(self) -> int:
        """Changes whenever what the keys read besides the ledger changes, the mix or the phase (0 for
        policies that read neither); both counters only grow, so their sum moves with either."""
        caps, ctx = self.capabilities, self.context
        mix = ctx.mix_source.version if ctx.mix_source is not None and caps.needs_mix else 0
        phase = ctx.phase.version if ctx.phase is not None and caps.needs_phase else 0
        return mix + phase

    # ---- over many nodes ------------------------------------------------------------------------

    def keys(self, ledger: Ledger, request: Request, nodes: Iterable[str]) -> dict[str, NodeKey]:
        """The exact key of every node in ``nodes`` where ``request`` fits."""
        if self.context.index is not None:
            return self.context.index.keys(ledger, request, self.node_key, self.key_version, nodes)
        out: dict[str, NodeKey] = {}
        for name in nodes:
            n = ledger.nodes.get(name)
            if n is not None:
                key = self.node_key(ledger, request, n)
                if key is not None:
                    out[name] = key
        return out

    def best_nodes(self, ledger: Ledger, request: Request, nodes: Collection[str] | None = None) -> list[str]:
        """The nodes tying for this policy's best exact key, in stable node order."""
        if self.context.index is not None:
            return self.context.index.best(ledger, request, self.node_key, self.key_version, nodes)
        if self.fast_best is not None:
            fast = self.fast_best(self.context, ledger, request, nodes, False)
            if fast is not None:
                return fast
        keys = self.keys(ledger, request, ledger.nodes if nodes is None else nodes)
        if not keys:
            return []
        best = min(keys.values())
        return sorted((n for n, k in keys.items() if k == best), key=lambda n: (ledger.nodes[n].order, n))

    def choose(self, ledger: Ledger, request: Request, nodes: Collection[str] | None = None) -> Choice | None:
        """The (node, GPUs) this policy wants among ``nodes`` (all nodes when None)."""
        first = self._first_best(ledger, request, nodes)
        return None if first is None else self.choice_on(ledger, request, first)

    def choice_on(self, ledger: Ledger, request: Request, node_name: str) -> Choice:
        """The Choice this policy makes on ``node_name``, a node already known to fit."""
        node = ledger.nodes[node_name]
        gpus = self.pick_on(ledger, request, node)
        key = self.node_key(ledger, request, node)
        assert gpus is not None and key is not None, "a chosen node must fit"
        return Choice(node.name, gpus, key)

    def _first_best(self, ledger: Ledger, request: Request, nodes: Collection[str] | None) -> str | None:
        """The first of ``best_nodes``; a fast path finds it without walking every tying node."""
        # a subclass that redefines best_nodes keeps its own answer
        if self.context.index is not None and type(self).best_nodes is Policy.best_nodes:
            first = self.context.index.best(ledger, request, self.node_key, self.key_version, nodes, True)
            return first[0] if first else None
        if self.fast_best is not None and type(self).best_nodes is Policy.best_nodes:
            fast = self.fast_best(self.context, ledger, request, nodes, True)
            if fast is not None:
                return fast[0] if fast else None
        best = self.best_nodes(ledger, request, nodes)
        return best[0] if best else None

    def scores(self, ledger: Ledger, request: Request, nodes: Iterable[str]) -> dict[str, int]:
        """0..10 per node: 10 for the nodes tying for the best key, 0 where it does not fit."""
        names = list(nodes)
        keys = self.keys(ledger, request, names)
        out = dict.fromkeys(names, 0)
        out.update(scale_scores(keys))
        return out


def scale_scores(keys: dict[str, NodeKey]) -> dict[str, int]:
    """Map exact keys to kube-scheduler's 1..10: the best key gets 10, others by rank of key.

    Rank-based, not value-based: a leftover of 0 against 250 must not collapse into one level.
    Distinct keys get distinct levels while there are levels left; fitting nodes never score 0.
    """
    if not keys:
        return {}
    distinct = sorted(set(keys.values()))
    levels = MAX_SCORE - 1  # levels 1..9 for everything below the best
    span = max(1, len(distinct) - 1)
    # one level per distinct key, then a look-up per node (list.index per node was O(n^2))
    level = {key: MAX_SCORE if rank == 0 else max(1, MAX_SCORE - math.ceil(rank * levels / span))
             for rank, key in enumerate(distinct)}
    return {name: level[key] for name, key in keys.items()}


def place(
    ledger: Ledger,
    claim: str,
    request: Request,
    policy: Policy | None = None,
    nodes: Collection[str] | None = None,
    expires_at: float | None = None,
) -> Allocation:
    """Place ``claim`` where ``policy`` (default: best fit) wants it; a reservation when ``expires_at`` is set.

    All-or-nothing: NoFit (with a per-node explanation) leaves the ledger unchanged.
    """
    policy = policy or _best_fit()
    if claim in ledger.allocations:
        raise LedgerError(f"claim {claim} already holds an allocation on {ledger.allocations[claim].node}")
    choice = policy.choose(ledger, request, nodes)
    if choice is None:
        names = list(ledger.nodes) if nodes is None else list(nodes)
        misfits = {n: m for n in names if (m := ledger.explain(request, n)) is not None}
        raise NoFit(summarize_misfits(request, misfits), misfits)
    return ledger.assign(claim, request, choice.node, choice.gpus, expires_at)


def place_on(
    ledger: Ledger, claim: str, request: Request, node: str, policy: Policy | None = None,
    expires_at: float | None = None,
) -> Allocation:
    """Place ``claim`` on ``node`` (the scheduler's pick), choosing GPUs with ``policy`` (default: best fit)."""
    policy = policy or _best_fit()
    if claim in ledger.allocations:
        raise LedgerError(f"claim {claim} already holds an allocation on {ledger.allocations[claim].node}")
    gpus = policy.pick(ledger, request, node)
    if gpus is None:
        misfit = ledger.explain(request, node) or Misfit("NoFit", "does not fit", True)
        raise NoFit(f"{request.describe()} does not fit on {node}: {misfit.message}", {node: misfit})
    return ledger.assign(claim, request, node, gpus, expires_at)


def _best_fit() -> Policy:
    from packing.policies.best_fit import BEST_FIT  # best_fit builds on this module

    return BEST_FIT


def summarize_misfits(request: Request, misfits: dict[str, Misfit]) -> str:
    """One line for a whole cluster: the most common reason and the largest free slice."""
    if not misfits:
        return f"{request.describe()} fits nowhere: no nodes"
    counts: dict[str, int] = {}
    for m in misfits.values():
        counts[m.code] = counts.get(m.code, 0) + 1
    parts = ", ".join(f"{c} on {k} node(s)" for c, k in sorted(counts.items(), key=lambda x: (-x[1], x[0])))
    return f"{request.describe()} fits on none of {len(misfits)} node(s): {parts}"
