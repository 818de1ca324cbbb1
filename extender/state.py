"""All of the extender's mutable state in one object, behind one lock.

``ExtenderState`` owns the ledger, the waiting room, the pod cache (bind carries no pod spec), the
readiness flag and the clock. The HTTP layer calls ``filter`` / ``prioritize`` / ``bind`` /
``release``; a cluster sync loop (issue 5) adds nodes, adopts allocation records read back from
pods, releases deleted pods and flips ``ready``. How a bind reaches the cluster is a ``Binder``:
standalone records it in memory, the cluster binder writes the annotation and the Binding.

Concurrency: one process owns the ledger; every state method holds ``lock`` while it reads or
changes the ledger, so concurrent filter/prioritize/bind cannot over-commit a GPU. The binder runs
outside the lock (an API call must not stall every filter); a bind is committed in the ledger
first and rolled back if the binder fails.

Decisions:

* filter returns the nodes where the product fits now. In ``strict`` mode it narrows them to the
  nodes tying for the policy's best exact key (kube-scheduler breaks score ties at random, which
  would undo the packer's choice) and reserves the slice on the best one until ``now + TTL``; a
  later filter of the same pod re-uses or moves the reservation. ``cooperative`` returns every
  fitting node and reserves nothing: prioritize ranks them and bind decides.
* prioritize scores with the same policy (``Policy.scores`` semantics) as if the pod held nothing.
* bind picks the GPU(s) with the same policy on the scheduler's node (``place_on``), commits,
  and is idempotent for the same pod and node.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from extender.fitcache import FitCache, FitNote, ShapeView
from extender.inventory import Card, InventoryError, cards_of_node, source_of
from extender.podspec import PodAsk, describe_pod
from extender.waiting import WaitingRoom
from extender.wire import BindingArgs, ExtenderArgs, FilterResult
from packing.ledger import Allocation, Ledger, LedgerError, NoFit
from packing.policies import POLICIES, NodeKey, Policy, get_policy, place_on, scale_scores
from packing.products import Catalog, Request
from packing.queue import ClaimQueue
from packing.record import AllocationRecord

MODES = ("strict", "cooperative")
# built-in policies whose node key reads only that node: their keys can be cached per node
NODE_LOCAL_POLICIES = frozenset(("best-fit", "first-fit", "spread", "frag-aware"))


class StateError(Exception):
    """A state operation refused for a reason the caller should show (e.g. unknown pod)."""


class BindError(Exception):
    """The binder could not make the binding stick; the ledger change is rolled back."""


class Binder(Protocol):
    """How a decided bind reaches the cluster."""

    def bind(self, args: BindingArgs, record: AllocationRecord | None) -> None:
        """Make the binding real (standalone: remember it; cluster: annotation + Binding). Raise on failure."""

    def release(self, pod_uid: str) -> None:
        """The pod's allocation was released (standalone: forget it; cluster: nothing)."""


@dataclass(frozen=True, slots=True)
class StateConfig:
    """How the extender decides: mode, policy, reservation TTL and bounds."""

    mode: str = "strict"
    policy: str = "best-fit"
    reservation_ttl_s: float = 30.0
    pod_cache_size: int = 10_000
    refused_resources: tuple[str, ...] = ()
    learn_nodes: bool = True  # take GPU inventory from full Node objects in filter/prioritize bodies
    bind_wait_s: float = 10.0  # how long a repeated bind waits for one still in flight

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        get_policy(self.policy)
        if not self.reservation_ttl_s > 0:
            raise ValueError(f"reservation TTL must be positive, got {self.reservation_ttl_s}")
        if self.pod_cache_size < 1:
            raise ValueError(f"pod cache size must be at least 1, got {self.pod_cache_size}")
        if not self.bind_wait_s > 0:
            raise ValueError(f"bind wait must be positive, got {self.bind_wait_s}")


@dataclass(slots=True)
class FilterOutcome:
    result: FilterResult
    ask: PodAsk
    codes: dict[str, int] = field(default_factory=dict)  # failure code -> node count
    reserved_on: str | None = None


@dataclass(slots=True)
class BindOutcome:
    error: str = ""
    record: AllocationRecord | None = None
    changed: bool = False  # False for an idempotent repeat or a refusal

    @property
    def ok(self) -> bool:
        return not self.error


@dataclass(slots=True)
class _BindPlan:
    """A bind decided under the lock, to be made real by the binder outside it."""

    outcome: BindOutcome | None  # set: nothing more to do
    record: AllocationRecord | None = None
    committed: Allocation | None = None
    ask: PodAsk | None = None


def reason_for(code: str, request: Request) -> str:
    """A short, stable per-node reason (no numbers: kube-scheduler aggregates identical reasons)."""
    what = request.describe()
    text = {
        "UnknownNode": "node has no GPUs gpuslice knows of",
        "NoMatchingGPU": f"no {request.model or 'matching'} GPU on this node",
        "TooLarge": f"{what} is larger than this node's GPUs",
        "NotEnoughWholeGPUs": f"not enough free whole GPUs for {what}",
        "NoSliceFree": f"no free {what} slice on any GPU",
        "NoGPUMemoryFree": f"not enough free GPU memory for {what} on any GPU",
        "InsufficientCPU": "not enough CPU",
        "InsufficientMemory": "not enough memory",
        "AlreadyBound": "pod is already bound to another node",
    }.get(code, code)
    return f"{REASON_HEAD}{code}: {text}"


REASON_HEAD = "gpuslice "
UNKNOWN_NODE = "gpuslice UnknownNode: node has no GPUs gpuslice knows of"


def _summary(request: Request, codes: Mapping[str, int], total: int) -> str:
    if total == 0:
        return f"{request.describe()} fits nowhere: no candidate nodes"
    parts = ", ".join(f"{c} on {n}" for c, n in sorted(codes.items(), key=lambda x: (-x[1], x[0])))
    return f"{request.describe()} fits on none of {total} node(s): {parts}"


class ExtenderState:
    """The ledger, the waiting room, the pod cache, readiness and the clock, behind one lock.

    The state owns its ledger: change it only through these methods (``add_node``, ``adopt``,
    ``release``, ...), which keep the fit views current; a direct ledger change is not seen unless
    followed by ``touch`` (the bookkeeping methods are for subclasses such as the cluster state and
    expect the caller to hold ``lock``).
    """

    def __init__(
        self,
        catalog: Catalog,
        binder: Binder,
        config: StateConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        ledger: Ledger | None = None,
        queue: ClaimQueue | None = None,
    ) -> None:
        self.catalog = catalog
        self.binder = binder
        self.config = config or StateConfig()
        self.clock = clock
        self.ledger = ledger if ledger is not None else Ledger()
        self.policy: Policy = get_policy(self.config.policy)
        if queue is None:
            queue = ClaimQueue(self.ledger, self.policy, reservation_ttl=self.config.reservation_ttl_s)
        if queue.ledger is not self.ledger:
            raise ValueError("the claim queue must share the extender's ledger")
        self.waiting = WaitingRoom(queue)
        self._node_local = self.policy.name in NODE_LOCAL_POLICIES and POLICIES.get(self.policy.name) is self.policy
        self.lock = threading.Lock()
        self.ready = True  # issue 5 keeps it False until synced and while not the leader
        self.generation = 0  # bumped on every ledger change (cheap change detection for gauges)
        self._pods: OrderedDict[str, PodAsk] = OrderedDict()
        self._bound: dict[str, str] = {}  # pod uid -> node, every pod this extender bound
        self._binding: dict[str, threading.Event] = {}  # pod uid -> set when its bind finishes
        self._fits = FitCache(self.ledger, self.policy, self._node_local, reason_for)
        self._sources: dict[str, tuple[object, ...]] = {}  # node -> raw inventory fields last seen
        self._bad_inventory: dict[str, str] = {}
        self._gauges: tuple[int, dict[str, Any]] | None = None

    # ---- bookkeeping for this class and the cluster layer: the caller holds ``lock`` ---------------

    def touch(self, node: str) -> None:
        """``node``'s ledger entry changed: fit views re-check it, gauges recompute."""
        self.generation += 1
        self._fits.touch(node)

    def remember(self, ask: PodAsk) -> None:
        """Cache the pod's ask for a later bind (bind carries no pod spec); the oldest falls out past the bound."""
        if not ask.uid:
            return
        self._pods[ask.uid] = ask
        self._pods.move_to_end(ask.uid)
        while len(self._pods) > self.config.pod_cache_size:
            self._pods.popitem(last=False)

    def expire_due(self, now: float) -> list[Allocation]:
        """Release the reservations past their deadline at ``now``; the expired allocations."""
        expired = self.waiting.expire(now)
        for a in expired:
            self.touch(a.node)
        return expired

    def release_allocation(self, alloc: Allocation) -> None:
        """Take ``alloc`` out of the ledger (``restore_allocation`` puts it back)."""
        self.ledger.release(alloc.claim)
        self.touch(alloc.node)

    def restore_allocation(self, alloc: Allocation) -> None:
        """Put a released allocation back exactly as it was (rolling back a failed move)."""
        self.ledger.assign(alloc.claim, alloc.request, alloc.node, alloc.gpus, alloc.expires_at)
        self.touch(alloc.node)

    def bound_node(self, uid: str) -> str | None:
        """The node this state saw the pod bound to (its own bind, or one adopted), or None."""
        return self._bound.get(uid)

    def mark_bound(self, uid: str, node: str) -> None:
        """Record the pod as bound to ``node`` (a repeated bind there is then a no-op)."""
        self._bound[uid] = node

    def bind_in_flight(self, uid: str) -> bool:
        """Is a bind of this pod running right now (between its plan and the binder's answer)?"""
        return uid in self._binding

    def clear(self) -> None:
        """Forget every node, allocation, queue place, cached pod and inventory problem (caller holds ``lock``).

        The ledger is emptied in place (the fit cache and the policies keep their reference to it);
        the queue starts afresh.
        """
        for name in list(self.ledger.nodes):
            self.ledger.remove_node(name)
            self.touch(name)
        self.waiting = WaitingRoom(ClaimQueue(self.ledger, self.policy, reservation_ttl=self.config.reservation_ttl_s))
        self._pods.clear()
        self._bound.clear()
        self._bad_inventory.clear()

    # ---- fit views, and the steps filter and prioritize share ---------------------------------

    def _unknown(self, name: str) -> FitNote:
        """Why a node the ledger does not hold fails every pod that asks for a slice."""
        bad = self._bad_inventory.get(name)
        if bad is not None:
            return FitNote(f"{REASON_HEAD}InvalidInventory: {bad}", False, "InvalidInventory")
        return FitNote(UNKNOWN_NODE, False, "UnknownNode")

    def warm(self) -> None:
        """Build the fit view of every catalog product now, so the first filters are not cold."""
        with self.lock:
            self._fits.warm([self.catalog.request(p.name) for p in self.catalog.products])

    def _take_in(self, args: ExtenderArgs, ask: PodAsk) -> float:
        """What filter and prioritize do first (caller holds the lock): expire, learn inventory, cache the pod; now."""
        now = self.clock()
        self.expire_due(now)
        if args.nodes is not None and self.config.learn_nodes:
            self._learn(args.nodes, _names_of(args.nodes))
        self.remember(ask)
        return now

    # ---- inventory ------------------------------------------------------------------------------

    def add_node(self, name: str, cards: Iterable[Card], order: int | None = None) -> None:
        """Add a node with its GPUs (seeding, informers); LedgerError if it exists."""
        with self.lock:
            self.ledger.add_node(name, [c.as_tuple() for c in cards], order=order)
            self.touch(name)

    def remove_node(self, name: str) -> list[Allocation]:
        """Drop a node and every allocation on it (the node left the cluster)."""
        with self.lock:
            dropped = self.ledger.remove_node(name)
            now = self.clock()
            for a in dropped:
                self._bound.pop(a.claim, None)
                self.waiting.depart(a.claim, now)
            self._sources.pop(name, None)
            self.touch(name)
            return dropped

    def sync_node(self, name: str, cards: Iterable[Card]) -> str:
        """Make the ledger's view of ``name`` equal ``cards``: added, replaced, removed, same, or busy
        (an inventory change under live allocations is not applied: the slices stay accounted)."""
        want = [c.as_tuple() for c in cards]
        with self.lock:
            self._bad_inventory.pop(name, None)
            return self._apply_inventory(name, want)

    def bad_inventory(self, name: str, why: str) -> None:
        """Remember why ``name``'s GPUs could not be read (filter shows it as the node's reason)."""
        with self.lock:
            self._bad_inventory[name] = why

    def drop_node(self, name: str) -> list[Allocation]:
        """The node left the cluster: drop it and every allocation on it ([] for an unknown node)."""
        with self.lock:
            self._bad_inventory.pop(name, None)
            if name not in self.ledger.nodes:
                return []
        return self.remove_node(name)

    def _apply_inventory(self, name: str, want: list[tuple[str, str, int]]) -> str:
        """``sync_node``'s change under the lock; LedgerError (node touched) if the new GPUs cannot be added."""
        existing = self.ledger.nodes.get(name)
        if existing is None:
            if not want:
                return "same"
            self.ledger.add_node(name, want)
            self.touch(name)
            return "added"
        if [(g.uuid, g.model, g.memory_mib) for g in existing.gpus] == want:
            return "same"
        if any(a.node == name for a in self.ledger.allocations.values()):
            return "busy"  # never drop live allocations for an inventory change; the sync loop reconciles
        order = existing.order
        self.ledger.remove_node(name)
        try:
            if want:
                self.ledger.add_node(name, want, order=order)
        finally:
            self.touch(name)
        return "replaced" if want else "removed"

    def _learn(self, nodes: Sequence[Mapping[str, Any]], names: Sequence[str]) -> None:
        """Take GPU inventory from full Node objects; a changed node is replaced only while empty."""
        for name, node in zip(names, nodes, strict=True):
            src = source_of(node)
            if self._sources.get(name) == src:
                continue
            self._sources[name] = src
            try:
                cards = cards_of_node(name, node, self.catalog)
            except InventoryError as e:
                self._bad_inventory[name] = str(e)
                continue
            self._bad_inventory.pop(name, None)
            try:
                self._apply_inventory(name, [c.as_tuple() for c in cards])
            except LedgerError as e:
                self._bad_inventory[name] = str(e)

    # ---- filter ---------------------------------------------------------------------------------

    def describe(self, pod: Mapping[str, Any]) -> PodAsk:
        """The pod's ask under this state's catalog and refusals (MalformedPod for wrong types)."""
        return describe_pod(pod, self.catalog, refused=self.config.refused_resources)

    def filter(self, args: ExtenderArgs, ask: PodAsk | None = None) -> FilterOutcome:
        """Which of ``args``' nodes the pod may go to now, with a reason for every other node."""
        ask = ask if ask is not None else self.describe(args.pod)
        names = args.node_names
        with self.lock:
            now = self._take_in(args, ask)
            outcome = self._filter_locked(ask, names, now)
        if args.nodes is not None:
            passing = set(outcome.result.node_names)
            outcome.result.nodes = [n for n in args.nodes if _name(n) in passing]
        return outcome

    def _filter_locked(self, ask: PodAsk, names: list[str], now: float) -> FilterOutcome:
        if ask.refusal is not None:
            refused = dict.fromkeys(names, f"{REASON_HEAD}Refused: {ask.refusal}")
            return FilterOutcome(FilterResult([], {}, refused), ask, {"Refused": len(refused)})
        request = ask.request
        if request is None:  # nothing we manage: every node passes untouched
            return FilterOutcome(FilterResult(list(names)), ask)
        held = self.ledger.allocations.get(ask.uid)
        if held is not None and not held.reserved:
            bound = [held.node] if held.node in names else []
            failed = {n: reason_for("AlreadyBound", request) for n in names if n != held.node}
            return FilterOutcome(FilterResult(bound, failed), ask, {"AlreadyBound": len(failed)} if failed else {})
        if held is not None:
            self.release_allocation(held)  # the pod's own reservation must not block it
        try:
            return self._decide_filter(ask, request, names, now, held)
        except Exception:
            if held is not None and ask.uid not in self.ledger.allocations:
                self.restore_allocation(held)
            raise

    def _decide_filter(
        self, ask: PodAsk, request: Request, names: list[str], now: float, held: Allocation | None
    ) -> FilterOutcome:
        view = self._fits.view(request)
        candidates = set(names)
        fitting = view.fits & candidates  # set algebra: no per-node work for the nodes that fit
        failed: dict[str, str] = {}
        unresolvable: dict[str, str] = {}
        notes = view.notes
        for name in candidates - fitting:
            note = notes.get(name) or self._unknown(name)
            if note.resolvable:
                failed[name] = note.reason or ""
            else:
                unresolvable[name] = note.reason or ""
        codes = _codes(failed, unresolvable)
        reserved_on: str | None = None
        if fitting and self.config.mode == "strict":
            best = self._best(request, fitting, view)
            target = held.node if held is not None and held.node in best else best[0]
            gpus = self.policy.pick(self.ledger, request, target)
            assert gpus is not None, "a best node must fit"
            self.ledger.assign(ask.uid, request, target, gpus, now + self.config.reservation_ttl_s)
            self.touch(target)
            reserved_on = target
            self.waiting.leave(ask.uid)
            passing = best
            if len(best) < len(fitting):
                # the other fitting nodes are left out, not failed: the pod fits there, so they
                # explain nothing, and listing thousands of them would dominate the reply's cost
                codes["NotBestFit"] = len(fitting) - len(best)
        else:
            passing = [n for n in names if n in fitting]  # the scheduler's order
            if len(passing) > len(fitting):  # a name sent twice is answered once
                passing = list(dict.fromkeys(passing))
        if not passing:
            self.waiting.arrive(ask, _summary(request, codes, len(candidates)), now)
        return FilterOutcome(FilterResult(passing, failed, unresolvable), ask, codes, reserved_on)

    def _best(self, request: Request, fitting: set[str], view: ShapeView) -> list[str]:
        """The fitting nodes tying for the policy's best exact key, in stable node order."""
        if self.policy.name == "best-fit" or not self._node_local:
            return self.policy.best_nodes(self.ledger, request, fitting)
        keys = {n: view.notes[n].key for n in fitting}
        best = min(k for k in keys.values() if k is not None)
        return sorted((n for n, k in keys.items() if k == best), key=lambda n: self.ledger.nodes[n].order)

    # ---- prioritize -----------------------------------------------------------------------------

    def prioritize(self, args: ExtenderArgs, ask: PodAsk | None = None) -> dict[str, int]:
        """Node -> 0..10 (every candidate, in order) from the policy's exact keys, as if the pod held nothing yet."""
        ask = ask if ask is not None else self.describe(args.pod)
        names = args.node_names
        with self.lock:
            self._take_in(args, ask)
            scores = self._scores_locked(ask, names)
        out = dict.fromkeys(names, 0)
        out.update(scores)
        return out

    def _scores_locked(self, ask: PodAsk, names: Sequence[str]) -> dict[str, int]:
        request = ask.request
        if request is None:
            return {}
        held = self.ledger.allocations.get(ask.uid)
        if held is not None and not held.reserved:
            return {held.node: 10} if held.node in names else {}
        if held is not None:
            self.release_allocation(held)
        try:
            if self._node_local:
                view = self._fits.view(request)
                fits, notes = view.fits, view.notes
                keys: dict[str, NodeKey] = {n: k for n in names if n in fits and (k := notes[n].key) is not None}
                return scale_scores(keys)
            return {n: s for n, s in self.policy.scores(self.ledger, request, names).items() if s}
        finally:
            if held is not None:
                self.restore_allocation(held)

    # ---- bind -----------------------------------------------------------------------------------

    def bind(self, args: BindingArgs) -> BindOutcome:
        """Bind the pod to ``args.node``: choose its GPU(s), commit, make it real through the binder.

        Idempotent: the same pod and node again succeeds and changes nothing. A bind of the same
        pod still in flight is waited for, then judged the same way.
        """
        uid = args.pod_uid
        while True:
            with self.lock:
                self.expire_due(self.clock())
                in_flight = self._binding.get(uid)
                if in_flight is None:
                    plan = self._plan_bind(args)
                    if plan.outcome is not None:
                        return plan.outcome
                    gate = threading.Event()
                    self._binding[uid] = gate
                    break
            if not in_flight.wait(self.config.bind_wait_s):
                return BindOutcome(f"a bind of pod {args.pod_key} is still in progress")
        try:
            self.binder.bind(args, plan.record)
        except Exception as e:  # whatever the binder hit, the ledger change is undone
            with self.lock:
                committed = plan.committed
                if committed is not None and self.ledger.allocations.get(uid) is committed:
                    self.release_allocation(committed)
                self._binding.pop(uid, None)
                gate.set()
            return BindOutcome(f"binding pod {args.pod_key} to {args.node} failed: {e}")
        with self.lock:
            self._bound[uid] = args.node
            if plan.ask is not None:
                self.waiting.start(plan.ask, self.clock())
            self._binding.pop(uid, None)
            gate.set()
        return BindOutcome(record=plan.record, changed=True)

    def _plan_bind(self, args: BindingArgs) -> _BindPlan:
        uid, node = args.pod_uid, args.node
        if self._bound.get(uid) == node:
            return _BindPlan(BindOutcome())  # a repeat: already bound here, nothing changes
        if uid in self._bound:
            return _BindPlan(BindOutcome(f"pod {args.pod_key} is already bound to node {self._bound[uid]}"))
        ask = self._pods.get(uid)
        held = self.ledger.allocations.get(uid)
        if ask is None and held is None:
            return _BindPlan(BindOutcome(
                f"gpuslice has not seen pod {args.pod_key} (uid {uid}) in a filter call; cannot bind it"))
        if ask is not None and ask.refusal is not None:
            return _BindPlan(BindOutcome(f"gpuslice refuses pod {args.pod_key}: {ask.refusal}"))
        request = held.request if held is not None else (ask.request if ask is not None else None)
        if request is None:
            return _BindPlan(None)  # nothing we manage: the binder binds it without a slice
        if ask is None or ask.request != request:  # evicted from the pod cache: the ledger knows the ask
            ask = PodAsk(uid, args.pod_name, args.pod_namespace, request)
        if node not in self.ledger.nodes:
            return _BindPlan(BindOutcome(f"node {node} is not known to gpuslice (no GPUs in its view)"))
        if held is not None and held.node == node:
            committed = self.ledger.commit(uid)  # keep the GPUs reserved at filter
            return _BindPlan(None, committed.record(), committed, ask)
        if held is not None:
            self.release_allocation(held)  # moved by the scheduler: release here, place there, or restore
        try:
            committed = place_on(self.ledger, uid, request, node, self.policy)
        except NoFit as e:
            if held is not None:
                self.restore_allocation(held)
            return _BindPlan(BindOutcome(f"{request.describe()} no longer fits on node {node}: "
                                         f"{_first_message(e)}"))
        self.touch(node)
        return _BindPlan(None, committed.record(), committed, ask)

    # ---- release, adopt --------------------------------------------------------------------------

    def release(self, pod_uid: str) -> bool:
        """Free the pod's slice (committed or reserved) and its queue place; False when it held nothing."""
        with self.lock:
            now = self.clock()
            alloc = self.ledger.allocations.get(pod_uid)
            if alloc is not None:
                self.release_allocation(alloc)
            bound = self._bound.pop(pod_uid, None)
            waited = self.waiting.withdraw(pod_uid)
            if bound is not None:
                self.waiting.depart(pod_uid, now)
            found = alloc is not None or bound is not None or waited
        if found:
            self.binder.release(pod_uid)
        return found

    def adopt(self, ask: PodAsk, record: AllocationRecord) -> Allocation:
        """Take a committed allocation read back from a pod (restart, informer); LedgerError if it cannot hold."""
        if ask.request is None:
            raise StateError(f"pod {ask.key} asks for no slice; nothing to adopt")
        with self.lock:
            held = self.ledger.allocations.get(ask.uid)
            if held is not None and not held.reserved:
                raise StateError(f"pod {ask.key} already holds a slice on {held.node}")
            if held is not None:
                self.release_allocation(held)
            try:
                alloc = self.ledger.assign(ask.uid, ask.request, record.node, record.gpus)
            except LedgerError:
                if held is not None:
                    self.restore_allocation(held)
                raise
            self.touch(record.node)
            self._bound[ask.uid] = record.node
            self.remember(ask)
            self.waiting.start(ask, self.clock())
            return alloc

    # ---- views ----------------------------------------------------------------------------------

    def expire(self) -> int:
        """Release reservations past their deadline now; how many."""
        with self.lock:
            return len(self.expire_due(self.clock()))

    def pod(self, uid: str) -> PodAsk | None:
        with self.lock:
            return self._pods.get(uid)

    def gauges(self) -> dict[str, Any]:
        """Free slices per product, waiting / reserved / committed claims (cached per ledger generation)."""
        with self.lock:
            self.expire_due(self.clock())
            if self._gauges is not None and self._gauges[0] == self.generation:
                return self._gauges[1]
            reserved = sum(1 for a in self.ledger.allocations.values() if a.reserved)
            values: dict[str, Any] = {
                "free_slices": {p.name: self.ledger.free_slices(self.catalog.request(p.name))
                                for p in self.catalog.products},
                "waiting": len(self.waiting),
                "reserved": reserved,
                "committed": len(self.ledger.allocations) - reserved,
                "nodes": len(self.ledger.nodes),
                "gpus": len(self.ledger.gpus),
            }
            self._gauges = (self.generation, values)
            return values

    def snapshot(self) -> dict[str, Any]:
        """The ledger and the queue as plain JSON-able data (read-only view for ``GET /state``)."""
        with self.lock:
            now = self.clock()
            self.expire_due(now)
            nodes = [
                {
                    "name": n.name,
                    "gpus": [
                        {"uuid": g.uuid, "model": g.model, "milli": g.milli, "memory_mib": g.memory_mib,
                         "free_milli": g.free_milli, "free_mib": g.free_mib}
                        for g in n.gpus
                    ],
                }
                for n in sorted(self.ledger.nodes.values(), key=lambda n: n.order)
            ]
            allocations = []
            for a in sorted(self.ledger.allocations.values(), key=lambda a: (a.node, a.claim)):
                ask = self._pods.get(a.claim)
                entry: dict[str, Any] = {
                    "pod_uid": a.claim,
                    "pod": ask.key if ask is not None else None,
                    "node": a.node,
                    "gpus": list(a.gpus),
                    "product": a.request.product,
                    "count": a.request.count,
                    "milli": a.request.milli,
                    "memory_mib": a.request.memory_mib,
                    "state": "reserved" if a.reserved else "bound",
                }
                if a.expires_at is not None:
                    entry["expires_in_s"] = round(a.expires_at - now, 3)
                allocations.append(entry)
            return {
                "mode": self.config.mode,
                "policy": self.policy.name,
                "ready": self.ready,
                "reservation_ttl_s": self.config.reservation_ttl_s,
                "nodes": nodes,
                "allocations": allocations,
                "queue": self.waiting.entries(now),
                "free_slices": {p.name: self.ledger.free_slices(self.catalog.request(p.name))
                                for p in self.catalog.products},
                "unknown_inventory": dict(sorted(self._bad_inventory.items())),
            }


def _codes(*reasons: Mapping[str, str]) -> dict[str, int]:
    """Failure code -> node count, from reasons shaped ``gpuslice <code>: <text>``."""
    counts: dict[str, int] = {}
    for by_node in reasons:
        for reason, n in Counter(by_node.values()).items():
            code = reason[len(REASON_HEAD):reason.find(":")]
            counts[code] = counts.get(code, 0) + n
    return counts


def _name(node: Mapping[str, Any]) -> str | None:
    meta = node.get("metadata")
    name = meta.get("name") if isinstance(meta, dict) else None
    return name if isinstance(name, str) else None


def _names_of(nodes: Sequence[Mapping[str, Any]]) -> list[str]:
    return [_name(n) or "" for n in nodes]


def _first_message(e: NoFit) -> str:
    for m in e.misfits.values():
        return m.message
    return str(e)
