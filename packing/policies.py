"""Placement policies: which node and which GPU(s) get a request.

One policy yields both answers kube-scheduler needs, so they cannot disagree:

* ``node_key(ledger, request, node)``: the node's exact rank (lower is better), or None when the
  request does not fit there; ``prioritize`` scales it to 0..10 and ``filter`` (strict mode)
  keeps the nodes that tie for the best key;
* ``pick(ledger, request, node)``: the GPU(s) on that node, used at bind;
* ``choose(ledger, request, nodes)``: the best (node, GPUs) overall: the minimum of
  ``(node_key, node order)``, i.e. the node key then a stable node order.

Every policy is a pure function of the ledger. Best fit has a logarithmic fast path through
the ledger's sorted free-capacity index; the others scan candidate nodes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass

from packing.ledger import Allocation, Gpu, Ledger, LedgerError, Misfit, Node, NoFit
from packing.products import Request

NodeKey = tuple[float, ...]
MAX_SCORE = 10  # kube-scheduler's MaxExtenderPriority


@dataclass(frozen=True, slots=True)
class Choice:
    node: str
    gpus: tuple[str, ...]
    key: NodeKey


def _host_ok(ledger: Ledger, node: Node, request: Request) -> bool:
    return ledger.host_fits(node, request)


def _gpu_candidates(ledger: Ledger, node: Node, request: Request) -> list[Gpu]:
    return ledger.fitting_gpus(node, request) if _host_ok(ledger, node, request) else []


# ---- per-policy GPU ranking inside one node (lower is better) ----------------------------------


def _tightest(g: Gpu, r: Request) -> tuple[int, int, int]:
    return (g.free_milli - r.milli, g.free_mib - r.memory_mib, g.index)


def _loosest(g: Gpu, r: Request) -> tuple[int, int, int]:
    return (r.milli - g.free_milli, r.memory_mib - g.free_mib, g.index)


def _first(g: Gpu, r: Request) -> tuple[int, int, int]:
    return (g.index, 0, 0)


def _pick_with(rank: Callable[[Gpu, Request], tuple[int, int, int]]) -> Callable[
        [Ledger, Request, Node], tuple[str, ...] | None]:
    def pick(ledger: Ledger, request: Request, node: Node) -> tuple[str, ...] | None:
        if request.gpu_less:
            return () if _host_ok(ledger, node, request) else None
        gpus = _gpu_candidates(ledger, node, request)
        if len(gpus) < request.count:
            return None
        gpus.sort(key=lambda g: rank(g, request))
        return tuple(g.uuid for g in gpus[: request.count])

    return pick


# ---- node keys ----------------------------------------------------------------------------------


def _best_fit_key(ledger: Ledger, request: Request, node: Node) -> NodeKey | None:
    """Smallest leftover on the chosen GPU, then the fullest node (least free GPU in total)."""
    gpus = _gpu_candidates(ledger, node, request) if not request.gpu_less else []
    if request.gpu_less:
        return (0, node.free_gpu_milli) if _host_ok(ledger, node, request) else None
    if len(gpus) < request.count:
        return None
    if request.whole:
        return (len(gpus), node.free_gpu_milli)  # fewest empty cards that still hold k
    return (min(g.free_milli - request.milli for g in gpus), node.free_gpu_milli)


def _spread_key(ledger: Ledger, request: Request, node: Node) -> NodeKey | None:
    """Worst fit: the largest leftover, then the emptiest node."""
    key = _best_fit_key(ledger, request, node)
    if key is None:
        return None
    if request.whole or request.gpu_less:
        return (-key[0], -key[1])
    largest = max(g.free_milli for g in _gpu_candidates(ledger, node, request))
    return (-(largest - request.milli), -node.free_gpu_milli)


def _first_fit_key(ledger: Ledger, request: Request, node: Node) -> NodeKey | None:
    """The first node (stable order) that fits: every fitting node ties."""
    return (0,) if _best_fit_key(ledger, request, node) is not None else None


def _frag_aware_key(ledger: Ledger, request: Request, node: Node) -> NodeKey | None:
    """Best fit that never breaks an empty card for a slice while a partly used card fits.

    Primary: does the slice land on an already-broken card (0) or break an empty one (1)?
    Then best fit. Whole cards and GPU-less requests keep best fit's key.
    """
    key = _best_fit_key(ledger, request, node)
    if key is None or request.whole or request.gpu_less:
        return key
    gpus = _gpu_candidates(ledger, node, request)
    partly = [g for g in gpus if not g.empty]
    if partly:
        return (0, min(g.free_milli - request.milli for g in partly), node.free_gpu_milli)
    return (1, key[0], key[1])


def _frag_pick(ledger: Ledger, request: Request, node: Node) -> tuple[str, ...] | None:
    if request.gpu_less or request.whole:
        return _pick_with(_tightest)(ledger, request, node)
    gpus = _gpu_candidates(ledger, node, request)
    if not gpus:
        return None
    gpus.sort(key=lambda g: (g.empty, *_tightest(g, request)))
    return (gpus[0].uuid,)


@dataclass(frozen=True)
class Policy:
    """A placement policy: a node key (lower is better) and a GPU pick inside a node."""

    name: str
    description: str
    node_key: Callable[[Ledger, Request, Node], NodeKey | None]
    pick_on: Callable[[Ledger, Request, Node], tuple[str, ...] | None]

    def pick(self, ledger: Ledger, request: Request, node: str) -> tuple[str, ...] | None:
        """The GPU(s) this policy takes on ``node``, or None when the request does not fit."""
        n = ledger.nodes.get(node)
        return None if n is None else self.pick_on(ledger, request, n)

    def keys(self, ledger: Ledger, request: Request, nodes: Iterable[str]) -> dict[str, NodeKey]:
        """The exact key of every node in ``nodes`` where ``request`` fits."""
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
        if self.name == "best-fit":
            fast = _best_fit_best_nodes(ledger, request, nodes)
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
        """The first of ``best_nodes``; best fit finds it without walking every tying node."""
        # a subclass that redefines best_nodes keeps its own answer
        if self.name == "best-fit" and type(self).best_nodes is Policy.best_nodes:
            fast = _best_fit_best_nodes(ledger, request, nodes, first_only=True)
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


def _index_candidates(
    ledger: Ledger, request: Request, model: str, allowed: Collection[str] | None
) -> Iterator[tuple[Node, NodeKey]]:
    """(node, best-fit key) for ``model`` in the ledger index's order: ascending key, then node order."""
    if request.whole:
        for n in ledger.nodes_with_whole(model, request.count):
            if allowed is None or n.name in allowed:
                key = _best_fit_key(ledger, request, n)
                if key is not None:
                    yield n, key
        return
    for g in ledger.gpus_from(model, request.milli):
        node = ledger.nodes[g.node]
        if allowed is not None and node.name not in allowed:
            continue
        if ledger.gpu_fits(g, request) and ledger.host_fits(node, request):
            yield node, (g.free_milli - request.milli, node.free_gpu_milli)


def _best_fit_best_nodes(
    ledger: Ledger, request: Request, nodes: Collection[str] | None, first_only: bool = False
) -> list[str] | None:
    """Best fit's nodes through the sorted index: O(log n + skipped entries + ties).

    ``first_only`` stops at the best (key, node order), which is all ``choose`` needs: a cluster
    of identical nodes then costs a look-up, not a walk over every tying node.
    Returns None when the fast path does not apply (GPU-less requests), so the caller scans.
    """
    models = [m for m in ledger.models() if request.accepts_model(m)]
    if request.gpu_less or (request.whole and len(models) > 1):
        return None  # k empty cards may span models on one node: the per-model whole index cannot rank that
    allowed = None if nodes is None else (nodes if isinstance(nodes, (set, frozenset, dict)) else set(nodes))
    bound: tuple[NodeKey, int] | None = None  # the best (key, node order) met so far
    found: dict[str, tuple[NodeKey, int]] = {}
    for model in models:
        for node, key in _index_candidates(ledger, request, model, allowed):
            rank = (key, node.order)
            if bound is not None and (key > bound[0] or (first_only and rank > bound)):
                break  # ascending index: nothing better follows in this model
            bound = rank if bound is None or rank < bound else bound
            if node.name not in found or rank < found[node.name]:
                found[node.name] = rank  # a node's key is its best card over every model's index
    if bound is None:
        return []
    best = [n for n, r in found.items() if r[0] == bound[0] and (r == bound or not first_only)]
    return sorted(best, key=lambda n: (ledger.nodes[n].order, n))


BEST_FIT = Policy(
    "best-fit",
    "the GPU whose leftover is smallest, then the fullest node, then a stable order (default)",
    _best_fit_key,
    _pick_with(_tightest),
)
FIRST_FIT = Policy("first-fit", "the first node in stable order that fits, its first GPU that fits",
                   _first_fit_key, _pick_with(_first))
SPREAD = Policy("spread", "worst fit: the GPU with the largest leftover, then the emptiest node",
                _spread_key, _pick_with(_loosest))
FRAG_AWARE = Policy(
    "frag-aware",
    "best fit, but never break an empty card for a slice while a partly used card fits",
    _frag_aware_key,
    _frag_pick,
)

POLICIES: dict[str, Policy] = {p.name: p for p in (BEST_FIT, FIRST_FIT, SPREAD, FRAG_AWARE)}
DEFAULT_POLICY = BEST_FIT.name


def get_policy(name: str) -> Policy:
    try:
        return POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}") from None


def register_policy(policy: Policy) -> None:
    """Add a policy (the simulator's FGD-style scorer registers itself this way)."""
    if policy.name in POLICIES:
        raise ValueError(f"policy {policy.name!r} already registered")
    POLICIES[policy.name] = policy


def place(
    ledger: Ledger,
    claim: str,
    request: Request,
    policy: Policy = BEST_FIT,
    nodes: Collection[str] | None = None,
    expires_at: float | None = None,
) -> Allocation:
    """Place ``claim`` where ``policy`` wants it; a reservation when ``expires_at`` is set.

    All-or-nothing: NoFit (with a per-node explanation) leaves the ledger unchanged.
    """
    if claim in ledger.allocations:
        raise LedgerError(f"claim {claim} already holds an allocation on {ledger.allocations[claim].node}")
    choice = policy.choose(ledger, request, nodes)
    if choice is None:
        names = list(ledger.nodes) if nodes is None else list(nodes)
        misfits = {n: m for n in names if (m := ledger.explain(request, n)) is not None}
        raise NoFit(summarize_misfits(request, misfits), misfits)
    return ledger.assign(claim, request, choice.node, choice.gpus, expires_at)


def place_on(
    ledger: Ledger, claim: str, request: Request, node: str, policy: Policy = BEST_FIT,
    expires_at: float | None = None,
) -> Allocation:
    """Place ``claim`` on ``node`` (the scheduler's pick), choosing GPUs with ``policy``."""
    if claim in ledger.allocations:
        raise LedgerError(f"claim {claim} already holds an allocation on {ledger.allocations[claim].node}")
    gpus = policy.pick(ledger, request, node)
    if gpus is None:
        misfit = ledger.explain(request, node) or Misfit("NoFit", "does not fit", True)
        raise NoFit(f"{request.describe()} does not fit on {node}: {misfit.message}", {node: misfit})
    return ledger.assign(claim, request, node, gpus, expires_at)


def summarize_misfits(request: Request, misfits: dict[str, Misfit]) -> str:
    """One line for a whole cluster: the most common reason and the largest free slice."""
    if not misfits:
        return f"{request.describe()} fits nowhere: no nodes"
    counts: dict[str, int] = {}
    for m in misfits.values():
        counts[m.code] = counts.get(m.code, 0) + 1
    parts = ", ".join(f"{c} on {k} node(s)" for c, k in sorted(counts.items(), key=lambda x: (-x[1], x[0])))
    return f"{request.describe()} fits on none of {len(misfits)} node(s): {parts}"
