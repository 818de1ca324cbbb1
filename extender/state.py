"""``ExtenderState``: filter, prioritize, bind and release, composed of parts with one job each.

* ``cache`` (``extender.cache.ClaimCache``): the ledger and the claims it holds, the lock, the undo
  journal, the epoch;
* ``inventory`` (``extender.inventory_sync.InventorySync``): each node's wanted inventory, applied as
  its slices allow;
* ``waiting`` (``extender.waiting_room.WaitingRoom``): the queue: who waits, why, where;
* ``asks`` (``packing.asks.AskReader``): what a pod asks for;
* the decisions (``extender.decide``): pure functions whose outcomes the verbs apply;
* ``binder``: how a decided bind reaches the cluster (standalone: remembered; cluster: annotation
  and Binding).

Concurrency: every verb holds the cache's lock while it reads or changes the ledger, so concurrent
filter/prioritize/bind cannot over-commit a GPU, and runs its learning and deciding as one
transaction: a verb that fails leaves the ledger as it was. The binder runs outside the lock (an API
call must not stall every filter); a bind is committed in the ledger first and released again if
the binder fails. One clock, ``clock``: monotonic standalone, wall time in a cluster (a pod's
creation time is its arrival in line there).

Decisions (``extender/README.md``): strict filter narrows to the policy's best nodes and reserves
there until ``now + TTL``; cooperative filter returns every fitting node; prioritize scores as if the
pod held nothing; bind takes the reservation's GPUs on its node, else the policy's pick on the
scheduler's node, and is idempotent for the same pod and node.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from extender.cache import ClaimCache
from extender.decide import (
    MODES,
    BindCode,
    BindStep,
    Code,
    FilterDecision,
    PolicyUse,
    bound_elsewhere,
    filter_nodes,
    group_refused,
    group_waits,
    plan_bind,
    refused_everywhere,
    score_nodes,
    waiting_summary,
)
from extender.group_binds import GroupBinds
from extender.history.book import DemandBook
from extender.inventory import Enforcement, NodeInventory
from extender.inventory_sync import InventorySync, SyncOutcome
from extender.timing import phase
from extender.waiting_room import WaitingRoom
from extender.wire import BindingArgs, ExtenderArgs, FilterResult, node_name
from packing.asks import AskReader, ClaimLookup, PodAsk
from packing.inventory import Card
from packing.ledger import Allocation, Ledger, LedgerError
from packing.node_fit import NodeFacts
from packing.policies import DEFAULT_POLICY, Policy
from packing.products import Catalog
from packing.queue import ClaimQueue
from packing.record import AllocationRecord

__all__ = ["MODES", "BindError", "BindOutcome", "Binder", "ExtenderState", "FilterOutcome", "StateConfig",
           "StateError"]


class StateError(Exception):
    """A state operation refused for a reason the caller should show (e.g. unknown pod)."""


class BindError(Exception):
    """The binder could not make the binding stick; the ledger change is rolled back."""


class Binder(Protocol):
    """How a decided bind reaches the cluster."""

    def bind(self, args: BindingArgs, record: AllocationRecord | None) -> None:
        """Make the binding real (standalone: remember it; cluster: the Binding with the record). Raise on failure."""

    def release(self, pod_uid: str) -> None:
        """The pod's allocation was released (standalone: forget it; cluster: nothing)."""


@dataclass(frozen=True, slots=True)
class StateConfig:
    """How the extender decides: mode, policy, reservation TTL and bounds, and standalone's own rules."""

    mode: str = "strict"
    policy: str = DEFAULT_POLICY
    reservation_ttl_s: float = 30.0
    pod_cache_size: int = 10_000
    refused_resources: tuple[str, ...] = ()
    learn_nodes: bool = False  # standalone only: take inventories from the Node objects of request bodies
    bind_wait_s: float = 10.0  # how long a repeated bind waits for one still in flight
    standalone: bool = False  # no gate and no watch: filters admit, and idle waiting claims expire
    waiting_ttl_s: float = 600.0  # standalone: a waiting claim no filter asked about for this long leaves

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        PolicyUse.named(self.policy)
        for name, what in (("reservation_ttl_s", "reservation TTL"), ("bind_wait_s", "bind wait"),
                           ("waiting_ttl_s", "waiting TTL")):
            if not getattr(self, name) > 0:
                raise ValueError(f"{what} must be positive, got {getattr(self, name)}")
        if self.pod_cache_size < 1:
            raise ValueError(f"pod cache size must be at least 1, got {self.pod_cache_size}")
        if self.learn_nodes and not self.standalone:
            raise ValueError("learning inventories from request bodies is for standalone mode only "
                             "(in a cluster the node watch is the only source)")


@dataclass(frozen=True, slots=True)
class RolledBack:
    """A pod group the queue took back in line: its reserved members' reservations released."""

    group: str  # namespace/name
    members: tuple[str, ...]  # every member's uid (waiting and running) when it went back
    why: str


@dataclass(slots=True)
class FilterOutcome:
    result: FilterResult
    ask: PodAsk
    codes: dict[Code, int] = field(default_factory=dict)  # failure code -> node count
    reserved_on: str | None = None


@dataclass(slots=True)
class BindOutcome:
    code: BindCode
    error: str = ""
    record: AllocationRecord | None = None
    enforcement: Enforcement | None = None  # who enforces the slice on its node (set when bound with one)

    @property
    def ok(self) -> bool:
        return self.code.ok

    @property
    def changed(self) -> bool:
        return self.code in (BindCode.BOUND, BindCode.UNMANAGED)


class ExtenderState:
    """The extender's decisions over its parts; see the module docstring."""

    def __init__(
        self,
        catalog: Catalog,
        binder: Binder,
        config: StateConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        ledger: Ledger | None = None,
        queue: ClaimQueue | None = None,
        claims: ClaimLookup | None = None,
    ) -> None:
        self.catalog = catalog
        self.binder = binder
        self.config = config or StateConfig()
        self.clock = clock
        self.use = PolicyUse.named(self.config.policy, catalog)
        self.cache = ClaimCache(ledger if ledger is not None else Ledger(), self.use, self.config.pod_cache_size)
        self.inventory = InventorySync(self.cache, catalog)
        self.asks = AskReader(catalog, self.config.refused_resources, claims)
        if queue is None:
            queue = self._new_queue()
        if queue.ledger is not self.cache.ledger:
            raise ValueError("the claim queue must share the extender's ledger")
        self.waiting = WaitingRoom(queue, self.config.waiting_ttl_s if self.config.standalone else None)
        self.on_bound: Callable[[BindingArgs, AllocationRecord, Enforcement], None] | None = None
        self.history: DemandBook | None = None  # the demand history, told what the policy observes
        self.group_binds: GroupBinds | None = None  # cluster mode: pod groups' members bind together
        self.rolled_back: list[RolledBack] = []  # pod groups put back in line, for the cluster to tell (drained)
        self._ready = True
        self._gauges: tuple[tuple[int, int], dict[str, Any]] | None = None

    def _new_queue(self) -> ClaimQueue:
        return ClaimQueue(self.cache.ledger, self.policy, reservation_ttl=self.config.reservation_ttl_s)

    @property
    def policy(self) -> Policy:
        return self.use.policy

    @property
    def ledger(self) -> Ledger:
        """The ledger, to read (change it only through the state's and the cache's methods)."""
        return self.cache.ledger

    @property
    def ready(self) -> bool:
        """Serving decisions: set by the owner (cluster: synced and leading), and the ledger trusted."""
        return self._ready and not self.cache.broken

    @ready.setter
    def ready(self, value: bool) -> None:
        self._ready = value

    @property
    def epoch(self) -> int:
        return self.cache.epoch

    # ---- taking in -------------------------------------------------------------------------------

    def describe(self, pod: Mapping[str, Any]) -> PodAsk:
        """The pod's ask (MalformedPod for wrong types; ClaimUnavailable when a claim cannot be read now)."""
        return self.asks.read(pod)

    def take_in(self, ask: PodAsk, at: float | None = None) -> bool:
        """The one place a claim the extender sees is first taken in (caller holds the lock); True when new.

        A new claim's shape feeds the policy's mix estimator and load phase (nothing for a policy
        that reads neither), and the demand history (arrived ``at``, wall time; default now).
        """
        new = self.cache.remember(ask)
        if new and ask.request is not None:
            self.policy.observe(ask.request)
            if self.history is not None:
                self.history.arrived(ask, at)
        return new

    def housekeep(self) -> float:
        """Lapse due reservations and idle waiting claims (caller holds the lock); now."""
        now = self.clock()
        self.expire_due(now)
        gone = self.waiting.expire_idle(now)
        if gone and self.history is not None:
            for uid in gone:
                self.history.withdrawn(uid)
        return now

    def expire_due(self, now: float) -> list[Allocation]:
        """Release the reservations past their deadline at ``now`` (caller holds the lock)."""
        expired = self.waiting.expire(now)
        for a in expired:
            self.freed(a.node)
        self.note_rollbacks([a.claim for a in expired], "not every member was bound before its reservations "
                            "lapsed (the group ready timeout)")
        return expired

    def note_rollbacks(self, claims: Iterable[str], why: str) -> None:
        """Remember the pod groups whose members among ``claims`` went back in line, with every member
        they have now (caller holds the lock)."""
        groups: dict[str, tuple[str, ...]] = {}
        for claim in claims:
            g = self.waiting.queue.group_of(claim)
            if g is not None:
                groups[g.label] = tuple(sorted((*g.waiting, *g.running)))
        self.rolled_back.extend(RolledBack(label, members, why) for label, members in groups.items())

    def freed(self, node: str) -> None:
        """A slice left ``node`` (caller holds the lock): fit views re-check it, a waiting inventory applies."""
        self.cache.touch(node)
        self.inventory.settle(node)

    def warm(self) -> None:
        """Build the fit view of every catalog product now, so the first filters are not cold."""
        with self.cache.lock:
            self.cache.fits.warm([self.catalog.request(p.name) for p in self.catalog.products])

    def _learn(self, args: ExtenderArgs) -> None:
        if args.nodes is not None and self.config.learn_nodes:
            self.inventory.learn(args.nodes, [node_name(n) for n in args.nodes])

    # ---- inventory ------------------------------------------------------------------------------

    def add_node(self, name: str, cards: Iterable[Card], enforcement: Enforcement = Enforcement.NONE) -> None:
        """Add a node with its GPUs (seeding, tests); LedgerError if it exists or the ledger refuses it."""
        with self.cache.lock:
            if name in self.ledger.nodes:
                raise LedgerError(f"node {name} is already in the ledger")
            if self.inventory.sync(name, NodeInventory(tuple(cards), enforcement)) is SyncOutcome.INVALID:
                raise LedgerError(self.inventory.bad().get(name, f"node {name} was refused"))

    def sync_node(self, name: str, cards: Iterable[Card], enforcement: Enforcement = Enforcement.NONE,
                  facts: NodeFacts | None = None) -> str:
        """Make ``name``'s GPUs (and labels, taints, cordon) what its Node object says, as far as its
        slices allow (``SyncOutcome``)."""
        with self.cache.lock:
            inventory = NodeInventory(tuple(cards), enforcement) if facts is None else \
                NodeInventory(tuple(cards), enforcement, facts)
            return self.inventory.sync(name, inventory).value

    def bad_inventory(self, name: str, why: str) -> None:
        """Remember why ``name``'s GPUs could not be read (filter shows it as the node's reason)."""
        with self.cache.lock:
            self.inventory.mark_bad(name, why)

    def drop_node(self, name: str) -> list[Allocation]:
        """The node left the cluster: drop it and every allocation on it ([] for an unknown node)."""
        with self.cache.lock:
            self.inventory.forget(name)
            if name not in self.ledger.nodes:
                return []
            now = self.clock()
            dropped = self.cache.remove_node(name)
            for a in dropped:
                self.cache.unbind(a.claim)
                self.waiting.depart(a.claim, now)
                if self.history is not None:
                    self.history.departed(a.claim)
            return dropped

    # ---- filter ---------------------------------------------------------------------------------

    def filter(self, args: ExtenderArgs, ask: PodAsk | None = None) -> FilterOutcome:
        """Which of ``args``' nodes the pod may go to now, with a reason for every other node."""
        ask = ask if ask is not None else self.describe(args.pod)
        names = args.node_names
        with self.cache.lock:
            now = self.housekeep()
            with self.cache.undo_on_error():
                self._learn(args)
                self.take_in(ask)
                decision = self._filter_locked(ask, names, now)
        result = FilterResult(decision.passing, decision.failed, decision.unresolvable)
        if args.nodes is not None:  # kube-scheduler reads only the names of the Node objects echoed
            result.nodes = [{"metadata": {"name": n}} for n in decision.passing]
        reserved_on = decision.reserve[0] if decision.reserve is not None else None
        return FilterOutcome(result, ask, dict(decision.codes), reserved_on)

    def _filter_locked(self, ask: PodAsk, names: Sequence[str], now: float) -> FilterDecision:
        if ask.refusal is not None:
            return refused_everywhere(names, ask.refusal)
        request = ask.request
        if request is None:  # nothing we manage: every node passes untouched
            return FilterDecision(list(names))
        held = self.ledger.allocations.get(ask.uid)
        if held is not None and not held.reserved:
            return bound_elsewhere(names, held.node, request)
        if ask.group is not None and held is not None and held.node in names:
            return FilterDecision([held.node])  # a group's member keeps what its group's admission reserved
        if ask.group is not None and held is None:  # only the queue places a group's member, with its group
            if self.config.standalone:
                return group_refused(names)
            self.waiting.arrive(ask, "a pod group's member waits for its group's admission", now)
            return group_waits(names)
        if held is not None:
            self.cache.release(ask.uid)  # the pod's own reservation must not block it
        view = self.cache.fits.view(request)
        decision = filter_nodes(self.ledger, view, self.inventory.unknown, self.use, request, names,
                                self.config.mode == "strict", held.node if held is not None else None)
        if decision.reserve is not None:
            node, gpus = decision.reserve
            expires = now + self.config.reservation_ttl_s
            if ask.group is not None and held is not None and held.expires_at is not None:
                expires = held.expires_at  # a group's reservations keep the deadline the queue gave them
            self.cache.assign(ask.uid, request, node, gpus, expires)
            self.waiting.leave(ask.uid)
        elif held is not None:
            self.inventory.settle(held.node)
        if decision.waits:
            self.waiting.arrive(ask, waiting_summary(request, decision.codes, len(set(names))), now)
        return decision

    # ---- prioritize -----------------------------------------------------------------------------

    def prioritize(self, args: ExtenderArgs, ask: PodAsk | None = None) -> dict[str, int]:
        """Node -> 0..10 (every candidate, in order) from the policy's exact keys, as if the pod held nothing yet."""
        ask = ask if ask is not None else self.describe(args.pod)
        names = args.node_names
        with self.cache.lock:
            self.housekeep()
            with self.cache.undo_on_error():
                self._learn(args)
                self.take_in(ask)
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
            self.cache.release(ask.uid)
        scores = score_nodes(self.ledger, self.cache.fits.view(request), self.use, request, names)
        if held is not None:
            self.cache.readmit(held)
        return scores

    # ---- bind -----------------------------------------------------------------------------------

    def bind(self, args: BindingArgs) -> BindOutcome:
        """Bind the pod to ``args.node``: choose its GPU(s), commit, make it real through the binder.

        Idempotent: the same pod and node again succeeds and changes nothing. A bind of the same
        pod still in flight is waited for, then judged the same way.
        """
        uid = args.pod_uid
        waited = self._group_barrier(args)
        if waited is not None:
            return waited
        while True:
            with self.cache.lock:
                self.housekeep()
                in_flight = self.cache.begin_bind(uid)
                if in_flight is None:
                    try:
                        with self.cache.undo_on_error():
                            planned = self._plan_bind(args)
                    except BaseException:
                        self.cache.end_bind(uid)
                        raise
                    if isinstance(planned, BindOutcome):
                        self.cache.end_bind(uid)
                        return planned
                    committed, ask = planned
                    break
            if not in_flight.wait(self.config.bind_wait_s):
                return BindOutcome(BindCode.IN_FLIGHT, f"a bind of pod {args.pod_key} is still in progress")
        record = committed.record() if committed is not None else None
        try:
            with phase("binder"):
                self.binder.bind(args, record)
        except Exception as e:  # whatever the binder hit, the ledger change is undone
            with self.cache.lock:
                if committed is not None and self.ledger.allocations.get(uid) is committed:
                    self.cache.release(uid)
                    self.inventory.settle(committed.node)
                self.cache.end_bind(uid)
            return BindOutcome(BindCode.BINDER_FAILED, f"binding pod {args.pod_key} to {args.node} failed: {e}")
        with self.cache.lock:
            self.cache.mark_bound(uid, args.node)
            if ask is not None:
                self.waiting.start(ask, self.clock())
            if record is not None and self.history is not None:
                self.history.admitted(uid, args.node, record.gpus)
            self.cache.end_bind(uid)
            enforcement = self.inventory.enforcement(args.node) if record is not None else None
        if record is not None and enforcement is not None and self.on_bound is not None:
            self.on_bound(args, record, enforcement)
        code = BindCode.BOUND if record is not None else BindCode.UNMANAGED
        return BindOutcome(code, record=record, enforcement=enforcement)

    def _group_barrier(self, args: BindingArgs) -> BindOutcome | None:
        """A pod group's member waits here until every admitted member of its group reached bind
        (``extender.group_binds``); None to go on, or the answer when the rest did not come in time."""
        binds = self.group_binds
        if binds is None:
            return None
        uid = args.pod_uid
        with self.cache.lock:
            group = self.waiting.queue.group_of(uid)
            if group is None or uid not in group.running or self.cache.bound_node(uid) is not None:
                return None
            opened = binds.arrive(uid, group, lambda m: self.cache.bound_node(m) is not None)
            key, label, admitted = group.key, group.label, len(group.running)
        if opened.wait(binds.wait_s):
            return None
        with self.cache.lock:
            came = binds.waiting(key)
            binds.leave(uid, key)
        return BindOutcome(BindCode.GROUP_INCOMPLETE,
                           f"pod {args.pod_key}: {came} of the {admitted} admitted members of pod group {label} "
                           f"reached bind within {binds.wait_s:g} s; they bind together, so it waits (retried)")

    def _plan_bind(self, args: BindingArgs) -> BindOutcome | tuple[Allocation | None, PodAsk | None]:
        """Under the lock: the answer, or the allocation committed for the binder and the ask to start."""
        uid, node = args.pod_uid, args.node
        ask = self.cache.ask(uid)
        held = self.ledger.allocations.get(uid)
        plan = plan_bind(self.ledger, self.use, args.pod_key, uid, node, self.cache.bound_node(uid), ask, held)
        if plan.step is BindStep.NOTHING:
            return BindOutcome(plan.code, plan.message)
        if plan.step is BindStep.BINDER_ONLY or plan.request is None:
            return None, None
        member = (ask is not None and ask.group is not None) or self.waiting.queue.group_of(uid) is not None
        if plan.step is BindStep.PLACE and held is None and member:  # a group's member binds only as admitted
            return BindOutcome(BindCode.GROUP_INCOMPLETE, f"pod {args.pod_key} is a pod group's member without a "
                               "reservation (its group went back in line): it binds only with its whole group")
        if ask is None or ask.request != plan.request:  # evicted from the pod cache: the ledger knows the ask
            ask = PodAsk(uid, args.pod_name, args.pod_namespace, plan.request)
        if plan.step is BindStep.COMMIT:
            return self.cache.commit(uid), ask
        if held is not None:
            self.cache.release(uid)  # moved by the scheduler: the reservation elsewhere goes
            self.inventory.settle(held.node)
        return self.cache.assign(uid, plan.request, node, plan.gpus), ask

    # ---- release, adopt --------------------------------------------------------------------------

    def release(self, pod_uid: str) -> bool:
        """Free the pod's slice (committed or reserved) and its queue place; False when it held nothing."""
        with self.cache.lock:
            now = self.clock()
            with self.cache.undo_on_error():
                alloc = self.ledger.allocations.get(pod_uid)
                if alloc is not None:
                    self.cache.release(pod_uid)
                    self.inventory.settle(alloc.node)
                bound = self.cache.unbind(pod_uid)
                waited = self.waiting.withdraw(pod_uid)
                if bound is not None:
                    self.waiting.depart(pod_uid, now)
            if bound is not None and alloc is not None:
                self.policy.observe_departure()  # a bound slice freed: the load phase counts it, once it is done
            found = alloc is not None or bound is not None or waited
            if found and self.history is not None:
                self.history.released(pod_uid)
        if found:
            self.binder.release(pod_uid)
        return found

    def adopt(self, ask: PodAsk, record: AllocationRecord) -> Allocation:
        """Take a committed allocation read back from a pod (restart, informer); LedgerError if it cannot hold."""
        if ask.request is None:
            raise StateError(f"pod {ask.key} asks for no slice; nothing to adopt")
        with self.cache.lock, self.cache.undo_on_error():
            held = self.ledger.allocations.get(ask.uid)
            if held is not None and not held.reserved:
                raise StateError(f"pod {ask.key} already holds a slice on {held.node}")
            if held is not None:
                self.cache.release(ask.uid)
            alloc = self.cache.assign(ask.uid, ask.request, record.node, record.gpus)
            self.cache.mark_bound(ask.uid, record.node)
            self.take_in(ask)
            self.waiting.start(ask, self.clock())
            if self.history is not None:
                self.history.admitted(ask.uid, record.node, record.gpus)
            return alloc

    # ---- whole state ------------------------------------------------------------------------------

    def clear(self) -> None:
        """Forget every node, allocation, queue place, cached pod and inventory (caller holds the lock);
        a new epoch begins with a fresh queue over the same ledger."""
        self.cache.clear()
        self.inventory.clear()
        self.waiting.clear()
        self.waiting = WaitingRoom(self._new_queue(), self.waiting.ttl_s)
        self._gauges = None

    # ---- views ----------------------------------------------------------------------------------

    def expire(self) -> int:
        """Release reservations past their deadline now; how many."""
        with self.cache.lock:
            return len(self.expire_due(self.clock()))

    def pod(self, uid: str) -> PodAsk | None:
        with self.cache.lock:
            return self.cache.ask(uid)

    def gauges(self) -> dict[str, Any]:
        """Free slices per product, nodes by enforcement, waiting / reserved / committed claims, the epoch,
        the policy's load phase (churning, departures per arrival; None for a policy that reads none).

        The queue's figures are read now; the ledger's walk every GPU, so they are kept until the
        ledger next changes (every change goes through the cache and bumps its generation).
        """
        with self.cache.lock:
            self.housekeep()
            key = (self.cache.generation, len(self.ledger.allocations))
            if self._gauges is None or self._gauges[0] != key:
                reserved = sum(1 for a in self.ledger.allocations.values() if a.reserved)
                self._gauges = (key, {
                    "free_slices": self._free_slices(),
                    "reserved": reserved,
                    "committed": len(self.ledger.allocations) - reserved,
                    "nodes": len(self.ledger.nodes),
                    "gpus": len(self.ledger.gpus),
                    "nodes_by_enforcement": {e.value: n for e, n in self.inventory.by_enforcement().items()},
                })
            phase = self.policy.context.phase
            return {**self._gauges[1], "waiting": len(self.waiting), "epoch": self.cache.epoch,
                    "ready": self.ready, "phase": None if phase is None else (phase.churning, phase.ratio)}

    def _placement_phase(self) -> dict[str, Any] | None:
        """The load phase the policy places by (``packing.load_phase``); None for a policy that reads none."""
        phase = self.policy.context.phase
        if phase is None:
            return None
        return {"churning": phase.churning, "departure_ratio": round(phase.ratio, 4)}

    def _free_slices(self) -> dict[str, int]:
        return {p.name: self.ledger.free_slices(self.catalog.request(p.name)) for p in self.catalog.products}

    def snapshot(self) -> dict[str, Any]:
        """The ledger, the inventories and the queue as plain JSON-able data (``GET /state``)."""
        with self.cache.lock:
            now = self.housekeep()
            nodes = [
                {
                    "name": n.name,
                    "enforcement": self.inventory.enforcement(n.name).value,
                    "inventory_pending": self.inventory.pending(n.name),
                    "labels": dict(n.facts.labels), "taints": [[t.key, t.value, t.effect] for t in n.facts.taints],
                    "unschedulable": n.facts.unschedulable, "facts_known": n.facts.known,
                    "gpus": [
                        {"uuid": g.uuid, "model": g.model, "milli": g.milli, "memory_mib": g.memory_mib,
                         "free_milli": g.free_milli, "free_mib": g.free_mib, "withdrawn": g.withdrawn}
                        for g in n.gpus
                    ],
                }
                for n in sorted(self.ledger.nodes.values(), key=lambda n: n.order)
            ]
            allocations = []
            for a in sorted(self.ledger.allocations.values(), key=lambda a: (a.node, a.claim)):
                ask = self.cache.ask(a.claim)
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
                    "enforcement": self.inventory.enforcement(a.node).value,
                }
                if a.expires_at is not None:
                    entry["expires_in_s"] = round(a.expires_at - now, 3)
                allocations.append(entry)
            return {
                "mode": self.config.mode,
                "policy": self.policy.name,
                "admission": self.waiting.queue.admission,
                "placement_phase": self._placement_phase(),
                "ready": self.ready,
                "epoch": self.cache.epoch,
                "durable": not self.config.standalone,  # standalone keeps its state in this process only
                "wall_time": time.time(),  # when this snapshot was taken (the demand history's clock)
                "reservation_ttl_s": self.config.reservation_ttl_s,
                "nodes": nodes,
                "allocations": allocations,
                "queue": self.waiting.entries(now),
                "free_slices": self._free_slices(),
                "unknown_inventory": self.inventory.bad(),
            }
