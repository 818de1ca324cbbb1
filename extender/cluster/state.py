"""``ClusterState``: the extender's state plus what the cluster sync and the queue gate need.

The base ``ExtenderState`` owns the ledger, the waiting room and the lock; this adds, each under
that same lock:

* ``describe`` that also reads DRA claims (``extender.cluster.asks``);
* the sync's view of the API: ``sync_node``/``drop_node`` (inventory, inherited), ``observe_bound`` (a bound
  pod's allocation record read back: restart, failover, or a bind the watch shows before our own
  bind call returns), ``observe_gone`` (deleted or finished: its slice frees at once);
* the gate's queue steps: ``gate_arrive`` (a gated pod joins the line at its creation time),
  ``admit`` (reserve slices for the claims the queue lets in), ``recover_admitted`` (an admitted
  pod that lost its reservation goes back to its place in line), ``explain``;
* ``reset`` (a new leadership term starts from an empty ledger and rebuilds from the API).

Clock: wall time (``time.time``), so a pod's creation timestamp is its arrival in line and the
queue order survives a restart.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from extender.cluster.asks import describe_cluster_pod
from extender.cluster.dra import ClaimResolver
from extender.podspec import PodAsk
from extender.state import Binder, ExtenderState, StateConfig
from packing.entitlements import Entitlement
from packing.ledger import LedgerError
from packing.policies import place_on
from packing.products import Catalog
from packing.queue import Admission, Explanation
from packing.record import AllocationRecord

log = logging.getLogger(__name__)

KEPT, ADOPTED, PLACED, IN_FLIGHT, CONFLICT = "kept", "adopted", "placed", "in-flight", "conflict"
UNKNOWN_NODE = "unknown-node"


class ClusterState(ExtenderState):
    """The extender's state in a cluster: not ready until the sync has rebuilt it from the API."""

    def __init__(
        self,
        catalog: Catalog,
        binder: Binder,
        config: StateConfig | None = None,
        *,
        resolver: ClaimResolver | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(catalog, binder, config, clock=clock)
        self.resolver = resolver
        self.ready = False
        self._admitted: set[str] = set()  # claims the queue admitted whose bind has not been seen yet

    # ---- asks ------------------------------------------------------------------------------------

    def describe(self, pod: Mapping[str, Any]) -> PodAsk:
        """The pod's ask by resource, annotation or DRA claim (MalformedPod for wrong types)."""
        return describe_cluster_pod(pod, self.catalog, self.resolver, self.config.refused_resources)

    # ---- terms -----------------------------------------------------------------------------------

    def reset(self) -> None:
        """Forget everything (not ready): a new leadership term rebuilds from the API."""
        with self.lock:
            self.ready = False
            self.clear()
            self._admitted.clear()

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
        with self.lock:
            if self.bind_in_flight(uid):
                return IN_FLIGHT
            if node not in self.ledger.nodes:
                return UNKNOWN_NODE  # a node without (known) GPUs, or one that just left with its slices
            held = self.ledger.allocations.get(uid)
            wanted = record.gpus if record is not None else None
            if held is not None and not held.reserved and held.node == node and wanted in (None, held.gpus):
                self.mark_bound(uid, node)
                self._admitted.discard(uid)
                return KEPT
            if held is not None:
                self.release_allocation(held)
            outcome = ADOPTED
            try:
                if wanted is None:
                    raise LedgerError("no record")
                self.ledger.assign(uid, request, node, wanted)
            except LedgerError:
                outcome = PLACED
                try:
                    place_on(self.ledger, uid, request, node, self.policy)
                except LedgerError as e:
                    if held is not None:
                        self.restore_allocation(held)
                    log.error("pod %s is bound to %s but the ledger cannot hold it there: %s", ask.key, node, e)
                    return CONFLICT
            self.touch(node)
            self.mark_bound(uid, node)
            self._admitted.discard(uid)
            self.remember(ask)
            self.waiting.start(ask, self.clock())  # a claim the queue admitted already counts as running
            return outcome

    def observe_gone(self, uid: str) -> bool:
        """The pod was deleted or finished: free its slice and its place in line now."""
        found = self.release(uid)
        with self.lock:
            queue = self.waiting.queue
            where = queue.state(uid)
            if where == "waiting":
                queue.withdraw(uid)
                found = True
            elif where == "running":
                alloc = self.ledger.allocations.get(uid)
                queue.depart(uid, self.clock())
                if alloc is not None:
                    self.touch(alloc.node)
                found = True
            self._admitted.discard(uid)
        return found

    # ---- the queue gate --------------------------------------------------------------------------

    def gate_arrive(self, ask: PodAsk, arrived_at: float, reason: str) -> bool:
        """A gated pod joins the line at ``arrived_at`` (its creation); False when it is already known."""
        if ask.request is None:
            return False
        with self.lock:
            uid = ask.uid
            known = uid in self.ledger.allocations or self.bound_node(uid) is not None
            if known or self.waiting.queue.state(uid) is not None:
                return False
            self.remember(ask)
            self.waiting.arrive(ask, reason, arrived_at)
            return self.waiting.queue.state(uid) == "waiting"

    def admit(self, now: float) -> list[Admission]:
        """One admission step: reserve slices (until now + TTL) for the claims the queue lets in."""
        with self.lock:
            self.expire_due(now)
            admissions = self.waiting.queue.admit(now)
            for a in admissions:
                self.touch(a.allocation.node)
                self._admitted.add(a.claim)
            return admissions

    def recover_admitted(self) -> list[str]:
        """Admitted claims that lost their reservation before a bind (a filter found no node for
        them): back to their place in line. Returns their uids."""
        lost: list[str] = []
        with self.lock:
            queue = self.waiting.queue
            for uid in list(self._admitted):
                if self.bound_node(uid) is not None or queue.state(uid) != "running":
                    self._admitted.discard(uid)
                elif uid not in self.ledger.allocations and not self.bind_in_flight(uid):
                    queue.requeue(uid)
                    self._admitted.discard(uid)
                    lost.append(uid)
        return lost

    def explain(self, now: float) -> list[Explanation]:
        """Every waiting claim in queue order, with its position, reason and what it waits for."""
        with self.lock:
            return self.waiting.queue.explain(now)

    def set_entitlements(self, entitlements: Mapping[str, Entitlement | None]) -> None:
        """Set (or with None, lift) namespaces' entitlements; they apply from the next step."""
        with self.lock:
            for namespace, entitlement in entitlements.items():
                self.waiting.queue.set_entitlement(namespace, entitlement)

    # ---- views for the resync --------------------------------------------------------------------

    def committed(self) -> dict[str, tuple[str, tuple[str, ...]]]:
        """Bound claims: uid -> (node, GPUs)."""
        with self.lock:
            return {a.claim: (a.node, a.gpus) for a in self.ledger.allocations.values() if not a.reserved}

    def knows_node(self, name: str) -> bool:
        """Does the ledger hold GPUs of this node?"""
        with self.lock:
            return name in self.ledger.nodes

    def binding(self, uid: str) -> bool:
        """Is a bind of this pod in flight right now?"""
        with self.lock:
            return self.bind_in_flight(uid)

    def waiting_state(self, uid: str) -> str | None:
        """``waiting``, ``running`` (admitted or bound) or None, as the queue sees the claim."""
        with self.lock:
            return self.waiting.queue.state(uid)
