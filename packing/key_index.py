"""An incremental index of a policy's node keys: the best node for a request in O(log n), kept current as
the ledger changes and as the keys' inputs (the typical-pod mix, the load phase) move.

A policy whose key is ``(its part from the node's capacity state, the node's order)`` (the gradient
policies: ``Capabilities.key_index``) ranks every node of one *capacity state* alike, so the index ranks
states, not nodes:

* every node is in exactly one **state** (``capacity_state``: its free and total CPU and RAM as the ledger
  tracks them, and its cards' model, size, free milli and MiB and withdrawn flag; sorted when the node has
  one model, in index order otherwise); a state holds its nodes in a ``SortedList`` by (order, name);
* per request **shape** (the request without its node constraints: a key never reads them), the key's state
  part ``base`` of every state, computed once per state on one of its nodes, and a ``SortedList`` ``ranked``
  of ``(base, the state's first node order, state id)`` over the states where the shape fits. The best node
  is the first node of the first entry; the nodes a request may use (``allowed``) are met in key order;
* the ledger names the nodes whose capacity changed (``Ledger.feed``); at the next question each moves to
  its new state and the shapes mark both states dirty; a shape re-ranks its dirty states when next asked;
* a new ``version`` (the policy's ``key_version``: a new mix snapshot, a phase flip) re-ranks a shape when
  it is next asked: one key per state, not per node. The re-rank is exact (no tolerance): the index answers
  exactly what a scan of every node's key answers (property-tested against the plain policy).

Invariants (``_check``): every ledger node (after a sync) is in the state ``capacity_state`` says, and in
no other; a state with no node is forgotten; per shape, ``ranked`` holds exactly one entry per live state
that fits, ``(base, first order, id)`` with ``base`` the key's state part on any of its nodes.

Cost, with n nodes, s live states (s ≤ n; a few dozen in a burst of catalog slices on alike nodes),
h shapes asked about:

* a node's capacity change: O(h + log n) at the next question, plus one key per shape asked about for a
  state not seen since the last version;
* a question: O(log s + entries skipped for ``allowed`` + ties), or O(k) for k allowed nodes when k is small;
* a version change: O(s) keys + O(s log s) per shape, at that shape's next question.

Bound to one ledger at a time (held weakly): asked about another, it starts afresh there (O(n)). Not
thread-safe: the ledger's callers lock, and so do this index's.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field, replace

from sortedcontainers import SortedList

from packing.ledger import ChangeFeed, Ledger, Node
from packing.products import Request

Key = tuple[float, ...]
KeyOf = Callable[[Ledger, Request, Node], Key | None]  # the policy's plain key of one node
CardState = tuple[str, int, int, int, int, bool]  # model, milli, MiB, free milli, free MiB, withdrawn
State = tuple[int | None, int | None, bool, tuple[CardState, ...]]

MAX_SHAPES = 64  # request shapes come from the catalog (products x whole-card counts): few
DIRECT_SCAN = 64  # at most this many allowed nodes are ranked one by one rather than met in key order


def capacity_state(node: Node) -> State:
    """Everything of ``node`` an indexed key may read besides its order: free CPU and RAM (None when not
    tracked) and its cards. One model's cards are sorted, since which of two alike cards is which does
    not change such a key; cards of several models keep their index order, which picks whole cards."""
    cards = tuple((g.model, g.milli, g.memory_mib, g.free_milli, g.free_mib, g.withdrawn) for g in node.gpus)
    one_model = all(c[0] == cards[0][0] for c in cards)
    return (node.free_cpu if node.cpu_milli is not None else None,
            node.free_mem if node.memory_mib is not None else None,
            one_model, tuple(sorted(cards)) if one_model else cards)


@dataclass(slots=True)
class _Shape:
    """One request shape's ranking of the live states, current with ``version``."""

    version: int
    base: dict[int, Key | None] = field(default_factory=dict)  # state id -> key without the order (None: no fit)
    ranked: SortedList = field(default_factory=SortedList)  # (base, first node order, state id)
    entry: dict[int, tuple[Key, int, int]] = field(default_factory=dict)  # state id -> its entry in ranked
    dirty: set[int] = field(default_factory=set)  # states whose nodes changed since the shape was ranked


class KeyIndex:
    """Node keys of one policy ranked per request shape over one ledger (see the module docstring)."""

    def __init__(self) -> None:
        self._ledger: weakref.ref[Ledger] | None = None
        self._feed = ChangeFeed()
        self._ids: dict[State, int] = {}  # live state -> its id (ids are never reused)
        self._states: dict[int, State] = {}
        self._members: dict[int, SortedList] = {}  # state id -> (order, name) of its nodes
        self._node: dict[str, tuple[int, int]] = {}  # node -> (state id, order)
        self._next_id = 0
        self._shapes: dict[Request, _Shape] = {}
        self.rebuilt = 0  # shape rankings built from scratch (first use or a new version), for benchmarks
        self.keys_computed = 0  # keys computed on a state's node, for benchmarks

    # ---- questions ---------------------------------------------------------------------------------

    def best(self, ledger: Ledger, request: Request, key: KeyOf, version: int,
             allowed: Collection[str] | None = None, first_only: bool = False) -> list[str]:
        """The nodes (of ``allowed``, when given) tying for the best key of ``request``, in (order, name)
        order: exactly ``Policy.best_nodes`` of a policy whose key is ``key``, at ``version``; only the
        first of them with ``first_only``."""
        shape = self._current(ledger, request, key, version)
        if allowed is not None:
            allowed = allowed if isinstance(allowed, (set, frozenset, dict)) else set(allowed)
            if len(allowed) <= DIRECT_SCAN or 4 * len(allowed) <= len(self._node):
                return self._best_of(shape, allowed, first_only)
        found: list[tuple[int, str]] = []
        best: tuple[Key, int] | None = None  # (base, order) of the best allowed node met so far
        for base, first, sid in shape.ranked:
            if best is not None and (base != best[0] or first > best[1]):
                break  # ascending (base, first order): nothing better or tying follows
            for order, name in self._members[sid]:
                if best is not None and order > best[1]:
                    break
                if allowed is not None and name not in allowed:
                    continue
                if best is None or order < best[1]:
                    best, found = (base, order), [(order, name)]
                else:
                    found.append((order, name))
        found.sort()
        return [name for _, name in found[:1 if first_only else len(found)]]

    def keys(self, ledger: Ledger, request: Request, key: KeyOf, version: int,
             names: Iterable[str]) -> dict[str, Key]:
        """The exact key of every node of ``names`` where ``request`` fits (``Policy.keys``), O(1) each."""
        shape = self._current(ledger, request, key, version)
        out: dict[str, Key] = {}
        for name in names:
            where = self._node.get(name)
            if where is not None:
                base = shape.base[where[0]]
                if base is not None:
                    out[name] = (*base, where[1])
        return out

    def _best_of(self, shape: _Shape, allowed: Collection[str], first_only: bool) -> list[str]:
        """``best`` over a few allowed nodes, one by one."""
        ranked: list[tuple[Key, int, str]] = []
        for name in allowed:
            where = self._node.get(name)
            if where is not None:
                base = shape.base[where[0]]
                if base is not None:
                    ranked.append((base, where[1], name))
        if not ranked:
            return []
        top = min(ranked)
        if first_only:
            return [top[2]]
        return [name for base, order, name in sorted(ranked) if (base, order) == top[:2]]

    # ---- keeping current ---------------------------------------------------------------------------

    def _current(self, ledger: Ledger, request: Request, key: KeyOf, version: int) -> _Shape:
        """``request``'s shape, synced with the ledger and ranked at ``version``."""
        self._sync(ledger)
        if request.constraints is not None:
            request = replace(request, constraints=None)
        shape = self._shapes.get(request)
        if shape is None or shape.version != version:
            if shape is None and len(self._shapes) >= MAX_SHAPES:
                del self._shapes[next(iter(self._shapes))]  # the oldest shape
            shape = self._shapes[request] = self._rank_all(ledger, request, key, version)
        elif shape.dirty:
            for sid in shape.dirty:
                self._rerank(shape, sid, ledger, request, key)
            shape.dirty.clear()
        return shape

    def _sync(self, ledger: Ledger) -> None:
        """Bind to ``ledger`` (starting afresh when it is another), then move the changed nodes."""
        if self._ledger is None or self._ledger() is not ledger:
            self._bind(ledger)
            return
        for name in self._feed.take():
            self._move(name, ledger.nodes.get(name))

    def _bind(self, ledger: Ledger) -> None:
        self._ledger = weakref.ref(ledger)
        self._feed = ledger.feed()
        self._ids.clear()
        self._states.clear()
        self._members.clear()
        self._node.clear()
        self._shapes.clear()
        for node in ledger.nodes.values():
            self._move(node.name, node)

    def _move(self, name: str, node: Node | None) -> None:
        """Put ``name`` in the state its node is in now (out of every state once it left the ledger)."""
        old = self._node.get(name)
        state = None if node is None else capacity_state(node)
        if old is not None and node is not None and state is not None and (self._ids.get(state), node.order) == old:
            return  # a change that came back (a reservation released and made again)
        if old is not None:
            members = self._members[old[0]]
            members.remove((old[1], name))
            if not members:
                del self._members[old[0]], self._ids[self._states.pop(old[0])]
            del self._node[name]
        new = None
        if node is not None and state is not None:
            new = self._ids.get(state)
            if new is None:
                new = self._ids[state] = self._next_id
                self._next_id += 1
                self._states[new] = state
                self._members[new] = SortedList()
            self._members[new].add((node.order, name))
            self._node[name] = (new, node.order)
        for shape in self._shapes.values():
            if old is not None:
                shape.dirty.add(old[0])
            if new is not None:
                shape.dirty.add(new)

    def _base(self, shape: _Shape, sid: int, ledger: Ledger, request: Request, key: KeyOf) -> Key | None:
        """The state part of the key shared by the nodes of state ``sid`` (memoised per shape and version)."""
        if sid in shape.base:
            return shape.base[sid]
        order, name = self._members[sid][0]
        full = key(ledger, request, ledger.nodes[name])
        self.keys_computed += 1
        if full is not None and full[-1] != order:
            raise ValueError(f"an indexed key must end with the node's order: {full!r} on node {name}")
        base = shape.base[sid] = None if full is None else full[:-1]
        return base

    def _rank_all(self, ledger: Ledger, request: Request, key: KeyOf, version: int) -> _Shape:
        self.rebuilt += 1
        shape = _Shape(version)
        entries = []
        for sid, members in self._members.items():
            base = self._base(shape, sid, ledger, request, key)
            if base is not None:
                entry = shape.entry[sid] = (base, members[0][0], sid)
                entries.append(entry)
        shape.ranked = SortedList(entries)
        return shape

    def _rerank(self, shape: _Shape, sid: int, ledger: Ledger, request: Request, key: KeyOf) -> None:
        old = shape.entry.pop(sid, None)
        if old is not None:
            shape.ranked.remove(old)
        members = self._members.get(sid)
        if members is None:
            shape.base.pop(sid, None)  # a state no node is in any more
            return
        base = self._base(shape, sid, ledger, request, key)
        if base is not None:
            entry = shape.entry[sid] = (base, members[0][0], sid)
            shape.ranked.add(entry)

    # ---- invariants ----------------------------------------------------------------------------------

    def _check(self, ledger: Ledger, key: KeyOf, version: int) -> None:
        """Assert the invariants of the module docstring against ``ledger`` after a sync (O(n · shapes)
        keys); shapes ranked at another ``version`` are re-ranked when next asked, and not checked."""
        self._sync(ledger)
        assert set(self._node) == set(ledger.nodes), "the index's nodes are not the ledger's"
        assert set(self._members) == set(self._states) == set(self._ids.values()), "state tables disagree"
        seen = 0
        for sid, members in self._members.items():
            assert members, f"state {sid} holds no node but is kept"
            for order, name in members:
                node = ledger.nodes[name]
                assert self._node[name] == (sid, order) and node.order == order, f"node {name} misplaced"
                assert capacity_state(node) == self._states[sid], f"node {name} is not in its capacity state"
                seen += 1
        assert seen == len(self._node), "a node is in two states"
        for request, shape in self._shapes.items():
            if shape.version != version:
                continue
            for sid in shape.dirty:  # rank what is pending, as the next question would
                self._rerank(shape, sid, ledger, request, key)
            shape.dirty.clear()
            want = set()
            for sid, members in self._members.items():
                base = shape.base[sid]
                for order, name in members:
                    full = key(ledger, request, ledger.nodes[name])
                    assert full == (None if base is None else (*base, order)), f"stale key of {name} for {request}"
                if base is not None:
                    want.add((base, members[0][0], sid))
            assert set(shape.ranked) == want and len(shape.ranked) == len(want), f"ranking of {request} drifted"
            assert set(shape.entry.values()) == want, f"entries of {request} drifted"
