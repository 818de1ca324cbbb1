"""The admitted-claims cache: every slice reserved or bound, who is bound where, binds in flight, and
what each pod seen asked for, behind one lock (the part Kueue's ``pkg/cache`` plays for it).

The ledger is changed only through this cache (``assign``, ``release``, ``readmit``, ``commit``,
``add_node``, ``remove_node``, ``withdraw``, ``set_facts``), which keeps the per-shape fit views current
(``touch``) and counts every change (``generation``, for gauges that may be cached).

Transactions: ``undo_on_error()`` journals every ledger change made inside the block and, if the
block raises, undoes them in reverse before the error goes on, so a failing request of any verb
leaves the ledger as it was. Blocks nest: an inner one that fails undoes only its own changes.
Should an undo itself fail, the cache marks itself ``broken`` (the extender then answers not
ready) rather than serve from a ledger it can no longer vouch for.

The epoch names this cache's life: a new one on every start and on every ``clear`` (a cluster
rebuild), shown to clients so that a reset is never silent. Callers hold ``lock`` for every method
but ``new_epoch``; the lock times its waits and holds into the current request (``timing``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

from extender.decide import PolicyUse
from extender.fitcache import FitCache
from extender.timing import TimedLock
from packing.asks import PodAsk
from packing.ledger import Allocation, Ledger
from packing.node_fit import NodeFacts
from packing.products import Request

log = logging.getLogger(__name__)
_epoch_lock = threading.Lock()
_last_epoch = 0


def new_epoch() -> int:
    """Milliseconds since 1970 when this epoch began: later than every earlier epoch of this process,
    and (by the clock) of every earlier process."""
    global _last_epoch
    with _epoch_lock:
        _last_epoch = max(int(time.time() * 1000), _last_epoch + 1)
        return _last_epoch


class ClaimCache:
    """The ledger and the claims it holds, one lock, the fit views over it, and an undo journal."""

    def __init__(self, ledger: Ledger, use: PolicyUse, pod_cache_size: int = 10_000) -> None:
        self.lock = TimedLock()
        self.ledger = ledger
        self.fits = FitCache(ledger, use)
        self.epoch = new_epoch()
        self.generation = 0  # bumped on every ledger change
        self.broken = ""  # why the ledger can no longer be trusted ("" while it can)
        self._pod_cache_size = pod_cache_size
        self._asks: OrderedDict[str, PodAsk] = OrderedDict()  # bind carries no pod spec
        self._bound: dict[str, str] = {}  # pod uid -> node, every pod bound (by us or read back)
        self._binding: dict[str, threading.Event] = {}  # pod uid -> set when its bind finishes
        self._journal: list[Callable[[], None]] = []
        self._depth = 0

    # ---- transactions ----------------------------------------------------------------------------

    @contextmanager
    def undo_on_error(self) -> Iterator[None]:
        """Undo every ledger change of the block if it raises (the error goes on)."""
        start = len(self._journal)
        self._depth += 1
        try:
            yield
        except BaseException:
            undo = self._journal[start:]
            del self._journal[start:]
            for step in reversed(undo):
                try:
                    step()
                except Exception as e:  # the ledger is no longer what it was: stop trusting it
                    self.broken = f"undoing a failed change failed: {e}"
                    log.critical("ledger epoch %d: %s; the extender reports not ready", self.epoch, self.broken)
            raise
        finally:
            self._depth -= 1
            if self._depth == 0:
                self._journal.clear()

    def _undo(self, step: Callable[[], None]) -> None:
        if self._depth:
            self._journal.append(step)

    # ---- ledger changes --------------------------------------------------------------------------

    def touch(self, node: str) -> None:
        """``node``'s ledger entry changed: fit views re-check it, cached gauges recompute."""
        self.generation += 1
        self.fits.touch(node)

    def assign(self, claim: str, request: Request, node: str, gpus: tuple[str, ...],
               expires_at: float | None = None) -> Allocation:
        alloc = self.ledger.assign(claim, request, node, gpus, expires_at)
        self.touch(node)
        self._undo(lambda: self._raw_release(alloc))
        return alloc

    def release(self, claim: str) -> Allocation:
        alloc = self.ledger.release(claim)
        self.touch(alloc.node)
        self._undo(lambda: self._raw_readmit(alloc))
        return alloc

    def readmit(self, alloc: Allocation) -> Allocation:
        """Put a released allocation back exactly as it was (withdrawn GPUs included)."""
        self._raw_readmit(alloc)
        self._undo(lambda: self._raw_release(alloc))
        return alloc

    def commit(self, claim: str) -> Allocation:
        reserved = self.ledger.allocations[claim]
        committed = self.ledger.commit(claim)
        self.touch(committed.node)
        if committed is not reserved:
            def uncommit() -> None:
                self._raw_release(committed)
                self._raw_readmit(reserved)

            self._undo(uncommit)
        return committed

    def add_node(self, name: str, cards: Iterable[tuple[str, str, int]], order: int | None = None) -> None:
        self.ledger.add_node(name, cards, order=order)
        self.touch(name)
        self._undo(lambda: self._raw_remove(name))

    def set_facts(self, name: str, facts: NodeFacts) -> bool:
        """Make ``name``'s labels, taints and cordon what its Node object says; True when they changed."""
        node = self.ledger.nodes[name]
        old = node.facts
        if not self.ledger.set_facts(name, dict(facts.labels), facts.taints, facts.unschedulable, facts.known):
            return False
        self.touch(name)

        def back() -> None:
            self.ledger.set_facts(name, dict(old.labels), old.taints, old.unschedulable, old.known)
            self.touch(name)

        self._undo(back)
        return True

    def remove_node(self, name: str) -> list[Allocation]:
        """Drop a node and every allocation on it (an undo puts both back exactly)."""
        node = self.ledger.nodes[name]
        cards = [(g.uuid, g.model, g.memory_mib, g.withdrawn) for g in node.gpus]
        order = node.order
        facts = node.facts
        dropped = self.ledger.remove_node(name)
        self.touch(name)

        def restore() -> None:
            self.ledger.add_node(name, [c[:3] for c in cards], order=order, labels=dict(facts.labels),
                                 taints=facts.taints, unschedulable=facts.unschedulable, known=facts.known)
            for uuid, *_, withdrawn in cards:
                self.ledger.withdraw(uuid, withdrawn)
            for a in dropped:
                self.ledger.readmit(a)
            self.touch(name)

        self._undo(restore)
        return dropped

    def withdraw(self, uuid: str, withdrawn: bool = True) -> None:
        gpu = self.ledger.gpus[uuid]
        if gpu.withdrawn == withdrawn:
            return
        self.ledger.withdraw(uuid, withdrawn)
        self.touch(gpu.node)

        def back() -> None:
            self.ledger.withdraw(uuid, not withdrawn)
            self.touch(gpu.node)

        self._undo(back)

    def _raw_release(self, alloc: Allocation) -> None:
        self.ledger.release(alloc.claim)
        self.touch(alloc.node)

    def _raw_readmit(self, alloc: Allocation) -> None:
        self.ledger.readmit(alloc)
        self.touch(alloc.node)

    def _raw_remove(self, name: str) -> None:
        self.ledger.remove_node(name)
        self.touch(name)

    def node_allocations(self, name: str) -> list[Allocation]:
        """Every allocation on ``name`` (a walk over all allocations: for the rare inventory change)."""
        return [a for a in self.ledger.allocations.values() if a.node == name]

    # ---- pods seen, bound, binding ----------------------------------------------------------------

    def remember(self, ask: PodAsk) -> bool:
        """Keep the pod's ask for a later bind (the oldest falls out past the bound); True when it is new."""
        if not ask.uid:
            return False
        new = ask.uid not in self._asks
        self._asks[ask.uid] = ask
        self._asks.move_to_end(ask.uid)
        while len(self._asks) > self._pod_cache_size:
            self._asks.popitem(last=False)
        return new

    def ask(self, uid: str) -> PodAsk | None:
        return self._asks.get(uid)

    def bound_node(self, uid: str) -> str | None:
        """The node the pod is bound to (our bind, or one read back), or None."""
        return self._bound.get(uid)

    def mark_bound(self, uid: str, node: str) -> None:
        self._bound[uid] = node

    def unbind(self, uid: str) -> str | None:
        return self._bound.pop(uid, None)

    def begin_bind(self, uid: str) -> threading.Event | None:
        """Mark a bind of ``uid`` in flight; the Event of the one already in flight instead (None: begun)."""
        running = self._binding.get(uid)
        if running is not None:
            return running
        self._binding[uid] = threading.Event()
        return None

    def end_bind(self, uid: str) -> None:
        gate = self._binding.pop(uid, None)
        if gate is not None:
            gate.set()

    def bind_in_flight(self, uid: str) -> bool:
        return uid in self._binding

    # ---- whole-cache -----------------------------------------------------------------------------

    def clear(self) -> None:
        """Forget every node, allocation, bound pod and ask; a new epoch begins.

        The ledger is emptied in place (the fit views and the queue keep their reference to it).
        """
        for name in list(self.ledger.nodes):
            self._raw_remove(name)
        self._asks.clear()
        self._bound.clear()
        self.broken = ""
        self.epoch = new_epoch()
