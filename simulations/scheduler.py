"""The scheduler model: how kube-scheduler turns a policy's node keys into one node.

The policy ranks nodes (``Policy.node_key``, lower is better, the very function the extender
uses); the model then decides what kube-scheduler would do with that ranking:

* ``scores="exact"`` compares exact keys; ``scores="extender"`` compares only the 0..10 levels
  the extender's prioritize returns (``packing.policies.scale_scores``);
* ``ties="stable"`` takes the first tied node in a per-seed random but fixed node order (the FGD
  artifact's patched scheduler), ``ties="random"`` picks among the tied nodes at random, as
  upstream kube-scheduler does.

The GPU(s) inside the chosen node come from ``packing.policies.place_on`` (the bind path).

Tie order: the ledger's node order, which the simulator sets to a per-seed permutation.

``KeyCache`` memoises node keys per request shape and re-scores only the nodes the ledger
changed since that shape was last seen. It is exact for every policy that declares its key
``node_local``; for one that reads the workload mix or the load phase it starts afresh whenever
``Policy.key_version`` moves. A ``sampled`` policy (random fit) answers ``best_nodes`` itself. An ``indexed`` policy
(best fit) can also go through the ledger's sorted index (``use_index``): the same answers,
slower when many requests fit nowhere or need no GPU.

``run_policy`` makes the policy instance of one run: its own mix (learnt online from the
arrivals, or the whole workload for a baseline that assumes it known) and generator.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field, fields

from sortedcontainers import SortedList

from packing.fragment import TypicalMix
from packing.ledger import Allocation, Ledger, Node
from packing.mix_estimator import FixedMix
from packing.policies import Choice, NodeKey, Policy, get_policy, place_on, policy_for, scale_scores
from packing.products import Request
from simulations.cluster import TrackedLedger

TIES = ("stable", "random")
SCORES = ("exact", "extender")
MAX_CACHED_SHAPES = 1024  # bounds memory when request shapes are continuous (synthetic CPU sizes)
MAX_STATES = 200_000  # distinct node states remembered before the state table is rebuilt
MAX_STATES_PER_SHAPE = 8192  # keys remembered per request shape


class SchedulerError(ValueError):
    """An unknown tie-breaking or score mode."""


@dataclass(frozen=True, slots=True)
class SchedulerModel:
    """How node-score ties are broken and how fine the compared scores are."""

    ties: str = "stable"
    scores: str = "exact"

    def __post_init__(self) -> None:
        if self.ties not in TIES:
            raise SchedulerError(f"unknown ties {self.ties!r}; choose one of {', '.join(TIES)}")
        if self.scores not in SCORES:
            raise SchedulerError(f"unknown scores {self.scores!r}; choose one of {', '.join(SCORES)}")


def run_policy(name: str, requests: Sequence[Request], seed: int, prior: Sequence[Request] = ()) -> Policy:
    """``name``'s instance for one run: a baseline that assumes the workload known gets the mix of
    all ``requests`` (FGD's typical pods ignore host RAM); every other mix reader learns online
    from ``prior`` on, with the extender's estimator settings."""
    if get_policy(name).capabilities.workload_mix:
        return policy_for(name, FixedMix(TypicalMix.from_requests(requests, host_memory=False)), seed)
    return policy_for(name, seed=seed, prior=prior)


def node_state(node: Node) -> tuple[object, ...]:
    """Everything a node-local key can depend on: the node's capacities and free capacity."""
    return (
        node.cpu_milli, node.memory_mib, node.free_cpu, node.free_mem,
        tuple((g.model, g.milli, g.memory_mib, g.free_milli, g.free_mib, g.withdrawn) for g in node.gpus),
        tuple(sorted(node.labels.items())),
    )


@dataclass
class _Shape:
    entries: dict[str, tuple[NodeKey, int, str]] = field(default_factory=dict)  # name -> (key, order, name)
    ranked: SortedList = field(default_factory=SortedList)  # the same entries, best key first
    by_state: dict[int, NodeKey | None] = field(default_factory=dict)  # node state id -> key
    cursor: int = -1  # position in the ledger's change log this shape is current with; -1: never scored


class KeyCache:
    """Exact node keys of ``policy`` per request shape, kept current from the ledger's change log.

    Nodes in equal states get equal keys (the key is node-local), so a key is computed once per
    (request shape, node state) and looked up for every node in that state; for a policy with
    ``unique_keys``, the state's part of the key is shared and each node's order appended. Keys of
    a policy that reads the mix or the load phase are dropped whenever ``policy.key_version`` moves.
    """

    def __init__(self, ledger: TrackedLedger, policy: Policy, max_shapes: int = MAX_CACHED_SHAPES) -> None:
        self.ledger = ledger
        self.policy = policy
        self.max_shapes = max_shapes
        self._shapes: OrderedDict[Request, _Shape] = OrderedDict()
        self._state_ids: dict[tuple[object, ...], int] = {}
        self._node_state: dict[str, int] = {}
        self._state_cursor = 0
        self._order_last = policy.capabilities.unique_keys
        self._key_version = policy.key_version
        self.rescored = 0  # node keys actually computed, for benchmarks
        self.resets = 0  # times the mix or the phase moved and every key was dropped

    def _sync_states(self) -> None:
        log = self.ledger.changes
        if self._state_cursor == len(log):
            return
        if len(self._state_ids) > MAX_STATES:  # forget states no node is in any more
            self._state_ids.clear()
            self._node_state.clear()
            for shape in self._shapes.values():
                shape.by_state.clear()
            changed: Iterable[str] = list(self.ledger.nodes)
        else:
            changed = set(log[self._state_cursor:])
        for name in changed:
            node = self.ledger.nodes.get(name)
            if node is None:
                self._node_state.pop(name, None)
                continue
            state = node_state(node)
            self._node_state[name] = self._state_ids.setdefault(state, len(self._state_ids))
        self._state_cursor = len(log)

    def _key(self, shape: _Shape, request: Request, node: Node) -> NodeKey | None:
        state = self._node_state[node.name]
        if state in shape.by_state:
            base = shape.by_state[state]
        else:
            base = self.policy.node_key(self.ledger, request, node)
            self.rescored += 1
            if base is not None and self._order_last:
                base = base[:-1]  # the state's part; the node's own order is appended below
            if len(shape.by_state) >= MAX_STATES_PER_SHAPE:
                shape.by_state.clear()
            shape.by_state[state] = base
        if base is None or not self._order_last:
            return base
        return (*base, node.order)

    def _rescore(self, shape: _Shape, request: Request, name: str) -> None:
        old = shape.entries.pop(name, None)
        if old is not None:
            shape.ranked.remove(old)
        node = self.ledger.nodes.get(name)
        if node is None:
            return
        key = self._key(shape, request, node)
        if key is not None:
            entry = (key, node.order, name)
            shape.entries[name] = entry
            shape.ranked.add(entry)

    def _current(self, request: Request) -> _Shape:
        version = self.policy.key_version
        if version != self._key_version:  # the mix or the phase moved: every key may have changed
            self._key_version = version
            self._shapes.clear()
            self.resets += 1
        self._sync_states()
        shape = self._shapes.get(request)
        if shape is None:
            shape = self._shapes[request] = _Shape()
            if len(self._shapes) > self.max_shapes:
                self._shapes.popitem(last=False)
        else:
            self._shapes.move_to_end(request)
        log = self.ledger.changes
        if shape.cursor < 0:
            for node in self.ledger.nodes.values():
                key = self._key(shape, request, node)
                if key is not None:
                    shape.entries[node.name] = (key, node.order, node.name)
            shape.ranked = SortedList(shape.entries.values())
        elif shape.cursor < len(log):
            for name in set(log[shape.cursor:]):
                self._rescore(shape, request, name)
        shape.cursor = len(log)
        return shape

    def keys(self, request: Request) -> dict[str, NodeKey]:
        """Every fitting node's exact key (equal to ``policy.keys`` over all nodes)."""
        return {name: entry[0] for name, entry in self._current(request).entries.items()}

    def best(self, request: Request) -> list[str]:
        """The nodes tying for the best key, in node order (equal to ``policy.best_nodes``)."""
        ranked = self._current(request).ranked
        if not ranked:
            return []
        top = ranked[0][0]
        out: list[str] = []
        for key, _, name in ranked:
            if key != top:
                break
            out.append(name)
        return out


class Scheduler:
    """One policy under one scheduler model, placing claims on one ledger."""

    def __init__(self, ledger: Ledger, policy: Policy, model: SchedulerModel | None = None, seed: int = 0,
                 use_index: bool = False) -> None:
        """``use_index``: best fit through the ledger's own sorted index instead of the key cache
        (the same answer; the index is slower when many requests fit nowhere or need no GPU)."""
        self.ledger = ledger
        self.policy = policy
        self.model = model or SchedulerModel()
        self.rng = random.Random(seed)
        caps = policy.capabilities
        cacheable = caps.node_local and not caps.sampled
        self.cache = KeyCache(ledger, policy) if cacheable and isinstance(ledger, TrackedLedger) else None
        self._own_index = caps.sampled or (use_index and caps.indexed)

    def _keys(self, request: Request) -> dict[str, NodeKey]:
        if self.cache is not None and not self._own_index:
            return self.cache.keys(request)
        return self.policy.keys(self.ledger, request, self.ledger.nodes)

    def candidates(self, request: Request) -> list[str]:
        """The nodes kube-scheduler would consider best, in node order."""
        if self.model.scores == "extender":
            levels = scale_scores(self._keys(request))
            if not levels:
                return []
            top = max(levels.values())
            return sorted((n for n, s in levels.items() if s == top), key=lambda n: self.ledger.nodes[n].order)
        if self.cache is not None and not self._own_index:
            return self.cache.best(request)
        return self.policy.best_nodes(self.ledger, request)

    def choose(self, request: Request) -> str | None:
        """The node this model picks for ``request``, or None when it fits nowhere."""
        best = self.candidates(request)
        if not best:
            return None
        if self.model.ties == "random" and len(best) > 1:
            return self.rng.choice(best)
        return best[0]

    def place(self, claim: str, request: Request, expires_at: float | None = None) -> Allocation | None:
        """Place ``claim`` (a reservation when ``expires_at`` is set), or None when nothing fits."""
        node = self.choose(request)
        if node is None:
            return None
        return place_on(self.ledger, claim, request, node, self.policy, expires_at)


@dataclass(frozen=True)
class ModelledPolicy(Policy):
    """``policy`` as the queue sees it when kube-scheduler sits in between: the queue's
    ``choose`` (which node and GPUs a claim gets) goes through ``scheduler``'s model.

    Asked about another ledger or a subset of nodes, it answers as the plain policy.
    """

    scheduler: Scheduler | None = None

    @classmethod
    def wrap(cls, scheduler: Scheduler) -> ModelledPolicy:
        p = scheduler.policy
        return cls(**{f.name: getattr(p, f.name) for f in fields(Policy)}, scheduler=scheduler)

    def _ours(self, ledger: Ledger, nodes: Collection[str] | None) -> Scheduler | None:
        s = self.scheduler
        return s if s is not None and nodes is None and ledger is s.ledger else None

    def best_nodes(self, ledger: Ledger, request: Request, nodes: Collection[str] | None = None) -> list[str]:
        s = self._ours(ledger, nodes)
        return s.candidates(request) if s is not None else plain_policy(self).best_nodes(ledger, request, nodes)

    def choose(self, ledger: Ledger, request: Request, nodes: Collection[str] | None = None) -> Choice | None:
        s = self._ours(ledger, nodes)
        if s is None:
            return plain_policy(self).choose(ledger, request, nodes)
        name = s.choose(request)
        return None if name is None else self.choice_on(ledger, request, name)


def plain_policy(p: ModelledPolicy) -> Policy:
    """The plain policy behind a modelled one (the scheduler's, else a bare copy)."""
    if p.scheduler is not None:
        return p.scheduler.policy
    return Policy(**{f.name: getattr(p, f.name) for f in fields(Policy)})
