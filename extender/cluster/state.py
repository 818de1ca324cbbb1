"""``ClusterState``: what the cluster sync and the queue gate do to the extender's state.

It holds the extender's ``ExtenderState`` (``core``, the one the HTTP layer serves) and works on its
parts, under the core's one lock:

* the sync's view of the API: ``sync_node``/``drop_node`` (inventory), ``observe_bound`` (a bound
  pod's allocation record read back: restart, failover, or a bind the watch shows before our own
  bind call returns), ``observe_gone`` (deleted or finished: its slice frees at once);
* the gate's queue steps: ``gate_arrive`` (a gated pod joins the line at its creation time),
  ``admit`` (reserve slices for the claims the queue lets in; a pod group's members until the group
  ready timeout), ``recover_admitted`` (an admitted pod that lost its reservation goes back to its
  place in line), ``explain``, ``rollbacks`` (the pod groups put back in line since last asked);
* ``reset`` (a new leadership term starts from an empty ledger, under a new epoch, and rebuilds
  from the API).

The core's clock is wall time (``time.time``) here, so a pod's creation timestamp is its arrival in
line and the queue order survives a restart. Request bodies never change the inventory in a
cluster: the node watch is its only source.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from extender.group_binds import GroupBinds
from extender.inventory import Enforcement
from extender.state import Binder, ExtenderState, RolledBack, StateConfig
from packing.asks import ClaimLookup, PodAsk
from packing.entitlements import Entitlement
from packing.inventory import Card
from packing.ledger import Allocation, Ledger, LedgerError
from packing.node_fit import NodeFacts
from packing.products import Catalog
from packing.queue import Admission, Explanation
from packing.record import AllocationRecord

log = logging.getLogger(__name__)

KEPT, ADOPTED, PLACED, IN_FLIGHT, CONFLICT = "kept", "adopted", "placed", "in-flight", "conflict"
UNKNOWN_NODE = "unknown-node"


class ClusterState:
    """The extender's state in a cluster: not ready until the sync has rebuilt it from the API."""

    def __init__(
        self,
        catalog: Catalog,
        binder: Binder,
        config: StateConfig | None = None,
        *,
        resolver: ClaimLookup | None = None,
        clock: Callable[[], float] = time.time,
        group_ready_timeout_s: float = 300.0,
        group_bind_wait_s: float = 10.0,
    ) -> None:
        self.core = ExtenderState(catalog, binder, config, clock=clock, claims=resolver)
        self.core.ready = False
        self.core.group_binds = GroupBinds(group_bind_wait_s)
        self.group_ready_timeout_s = group_ready_timeout_s  # a group's reservations last this long from its admission
        self._admitted: set[str] = set()  # claims the queue admitted whose bind has not been seen yet
        self._group_admitted: dict[tuple[str, str], float] = {}  # pod group -> when its last members were admitted

    # ---- the core's parts ------------------------------------------------------------------------

    @property
    def catalog(self) -> Catalog:
        return self.core.catalog

    @property
    def ledger(self) -> Ledger:
        return self.core.ledger

    @property
    def ready(self) -> bool:
        return self.core.ready

    @ready.setter
    def ready(self, value: bool) -> None:
        self.core.ready = value

    def clock(self) -> float:
        return self.core.clock()

    def describe(self, pod: Mapping[str, Any]) -> PodAsk:
        """The pod's ask by resource, annotation or DRA claim (MalformedPod, ClaimUnavailable)."""
        return self.core.describe(pod)

    def sync_node(self, name: str, cards: Iterable[Card], enforcement: Enforcement = Enforcement.NONE,
                  facts: NodeFacts | None = None) -> str:
        return self.core.sync_node(name, cards, enforcement, facts)

    def bad_inventory(self, name: str, why: str) -> None:
        self.core.bad_inventory(name, why)

    def drop_node(self, name: str) -> list[Allocation]:
        return self.core.drop_node(name)

    def pod(self, uid: str) -> PodAsk | None:
        return self.core.pod(uid)

    # ---- terms -----------------------------------------------------------------------------------

    def reset(self) -> None:
        """Forget everything (not ready): a new leadership term rebuilds from the API under a new epoch."""
        with self.core.cache.lock:
            self.core.ready = False
            self.core.clear()
            self._admitted.clear()
            self._group_admitted.clear()

    # ---- pods seen through the API ---------------------------------------------------------------

    def observe_bound(self, ask: PodAsk, record: AllocationRecord | None, node: str) -> str:
        """A pod the API shows bound to ``node``: make the ledger hold it there.

        With a valid record, on exactly the record's GPUs (``adopted``); without one (bound outside
        gpuslice), on the GPUs the policy picks on that node (``placed``). ``kept`` when the ledger
        already agrees, ``in-flight`` while our own bind of it runs, ``conflict`` when the node cannot
        hold it (the ledger is then unchanged and the caller reports it), ``unknown-node`` when the ledger
        has no GPUs of that node (it left the cluster, or its inventory is unreadable).
        """
        request = ask.request
        if request is None:
            raise LedgerError(f"pod {ask.key} asks for no slice")
        uid = ask.uid
        core, cache = self.core, self.core.cache
        with cache.lock:
            if cache.bind_in_flight(uid):
                return IN_FLIGHT
            if node not in cache.ledger.nodes:
                return UNKNOWN_NODE  # a node without (known) GPUs, or one that just left with its slices
            held = cache.ledger.allocations.get(uid)
            wanted = record.gpus if record is not None else None
            if held is not None and not held.reserved and held.node == node and wanted in (None, held.gpus):
                cache.mark_bound(uid, node)
                self._admitted.discard(uid)
                return KEPT
            try:
                with cache.undo_on_error():
                    if held is not None:
                        cache.release(uid)
                    outcome = self._hold(uid, request, node, wanted)
            except LedgerError as e:
                log.error("pod %s is bound to %s but the ledger cannot hold it there: %s", ask.key, node, e)
                return CONFLICT
            if held is not None and held.node != node:
                core.inventory.settle(held.node)
            cache.mark_bound(uid, node)
            self._admitted.discard(uid)
            core.take_in(ask)
            core.waiting.start(ask, core.clock())  # a claim the queue admitted already counts as running
            if core.history is not None:
                core.history.admitted(uid, node, cache.ledger.allocations[uid].gpus)
            return outcome

    def _hold(self, uid: str, request: Any, node: str, wanted: tuple[str, ...] | None) -> str:
        """The bound pod's slice on ``node``: the record's GPUs, else the policy's pick (LedgerError if neither)."""
        cache = self.core.cache
        if wanted is not None:
            try:
                with cache.undo_on_error():
                    cache.assign(uid, request, node, wanted)
                return ADOPTED
            except LedgerError:
                pass  # a record the ledger cannot hold: place it by policy, as if it had none
        gpus = self.core.policy.pick(cache.ledger, request, node)
        if gpus is None:
            misfit = cache.ledger.explain(request, node)
            raise LedgerError(misfit.message if misfit is not None else f"does not fit on {node}")
        cache.assign(uid, request, node, gpus)
        return PLACED

    def observe_gone(self, uid: str) -> bool:
        """The pod was deleted or finished: free its slice and its place in line now."""
        found = self.core.release(uid)
        core = self.core
        with core.cache.lock:
            queue = core.waiting.queue
            where = queue.state(uid)
            if where == "waiting":
                queue.withdraw(uid)
                found = True
            elif where == "running":
                alloc = core.ledger.allocations.get(uid)
                group = queue.group_of(uid)
                released = queue.depart(uid, core.clock())
                if alloc is not None:
                    core.cache.touch(alloc.node)
                for a in released:  # its group's reserved members, back in line: the group cannot start whole
                    core.freed(a.node)
                if released and group is not None:
                    core.note_rollbacks([a.claim for a in released], f"member {uid} is gone (deleted or "
                                        "finished) before the group was bound; it waits for that member again")
                found = True
            if found and core.history is not None:
                core.history.released(uid)
            self._admitted.discard(uid)
        return found

    # ---- the queue gate --------------------------------------------------------------------------

    def gate_arrive(self, ask: PodAsk, arrived_at: float, reason: str) -> bool:
        """A gated pod joins the line at ``arrived_at`` (its creation); False when it is already known."""
        if ask.request is None:
            return False
        core = self.core
        with core.cache.lock:
            uid = ask.uid
            known = uid in core.ledger.allocations or core.cache.bound_node(uid) is not None
            if known or core.waiting.queue.state(uid) is not None:
                return False
            core.take_in(ask, arrived_at)
            core.waiting.arrive(ask, reason, arrived_at)
            return core.waiting.queue.state(uid) == "waiting"

    def admit(self, now: float) -> list[Admission]:
        """One admission step: reserve slices (until now + TTL) for the claims the queue lets in."""
        core = self.core
        with core.cache.lock:
            core.expire_due(now)
            queue = core.waiting.queue
            admissions = queue.admit(now)
            for a in admissions:
                core.cache.touch(a.allocation.node)
                self._admitted.add(a.claim)
                group = queue.group_of(a.claim)
                if a.allocation.reserved and group is not None:
                    # a group binds together, maybe after kube-scheduler's retries: its deadline is the ready timeout
                    core.ledger.extend(a.claim, now + self.group_ready_timeout_s)
                    self._group_admitted[group.key] = now  # its members must be Running by now + the ready timeout
            return admissions

    def bound_groups(self, now: float) -> list[tuple[str, float, tuple[str, ...]]]:
        """Pod groups whose members are all bound: (namespace/name, admitted at, member uids). A group
        this leader did not admit (adopted after a leader change) counts from when it is first seen here."""
        core = self.core
        with core.cache.lock:
            out: list[tuple[str, float, tuple[str, ...]]] = []
            known: set[tuple[str, str]] = set()
            for g in core.waiting.queue.groups():
                known.add(g.key)
                if g.waiting or not g.running or len(g.running) != g.size or g.invalid() is not None:
                    continue
                if any(core.cache.bound_node(uid) is None for uid in g.running):
                    continue  # not all bound yet: the reservation deadline's case
                admitted_at = self._group_admitted.setdefault(g.key, now)
                out.append((g.label, admitted_at, tuple(sorted(g.running))))
            for key in [k for k in self._group_admitted if k not in known]:
                del self._group_admitted[key]  # the group is gone: forget when it was admitted
            return out

    def recover_admitted(self) -> list[str]:
        """Admitted claims that lost their reservation before a bind (a filter found no node for
        them): back to their place in line. Returns their uids."""
        lost: list[str] = []
        core = self.core
        with core.cache.lock:
            queue = core.waiting.queue
            for uid in list(self._admitted):
                if core.cache.bound_node(uid) is not None or queue.state(uid) != "running":
                    self._admitted.discard(uid)
                elif uid not in core.ledger.allocations and not core.cache.bind_in_flight(uid):
                    for a in queue.requeue(uid):  # its group's reserved members go back with it
                        core.freed(a.node)
                    self._admitted.discard(uid)
                    lost.append(uid)
            core.note_rollbacks(lost, "a member lost its reservation before its bind (its bind failed, or no node "
                                "took it)")
        return lost

    def rollbacks(self) -> list[RolledBack]:
        """The pod groups put back in line since the last call (their members' reservations released)."""
        with self.core.cache.lock:
            out, self.core.rolled_back = self.core.rolled_back, []
            return out

    def explain(self, now: float) -> list[Explanation]:
        """Every waiting claim in queue order, with its position, reason and what it waits for."""
        with self.core.cache.lock:
            return self.core.waiting.queue.explain(now)

    def set_entitlements(self, entitlements: Mapping[str, Entitlement | None]) -> None:
        """Set (or with None, lift) namespaces' entitlements; they apply from the next step."""
        with self.core.cache.lock:
            for namespace, entitlement in entitlements.items():
                self.core.waiting.queue.set_entitlement(namespace, entitlement)

    # ---- views for the resync --------------------------------------------------------------------

    def committed(self) -> dict[str, tuple[str, tuple[str, ...]]]:
        """Bound claims: uid -> (node, GPUs)."""
        with self.core.cache.lock:
            return {a.claim: (a.node, a.gpus) for a in self.core.ledger.allocations.values() if not a.reserved}

    def holding_or_waiting(self) -> set[str]:
        """Claims holding a slice or waiting in line (what the demand history may keep open)."""
        with self.core.cache.lock:
            queue = self.core.waiting.queue
            held = set(self.core.ledger.allocations)
            if self.core.history is None:
                return held
            return held | {r.claim for r in self.core.history.open_rows() if queue.state(r.claim) is not None}

    def knows_node(self, name: str) -> bool:
        """Does the ledger hold GPUs of this node?"""
        with self.core.cache.lock:
            return name in self.core.ledger.nodes

    def binding(self, uid: str) -> bool:
        """Is a bind of this pod in flight right now?"""
        with self.core.cache.lock:
            return self.core.cache.bind_in_flight(uid)

    def waiting_state(self, uid: str) -> str | None:
        """``waiting``, ``running`` (admitted or bound) or None, as the queue sees the claim."""
        with self.core.cache.lock:
            return self.core.waiting.queue.state(uid)
