"""Holds: the free capacity of chosen GPUs, reserved in the ledger for the rest of one admission step.

A drain target must not take new work, whatever placement policy runs: a hold is a ledger
reservation of exactly the GPU's free milli and MiB under a claim id no pod can have (it starts
with a NUL), so every policy sees the GPU as full. Holds live for one step only -- ``release_all``
runs in a ``finally`` -- so between steps the ledger, its allocation records and everything that
reads them see no hold. Lifting one hold (to start the head, or a backfilled claim, there) and
holding again what is left is O(log n) each.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from packing.ledger import Gpu, Ledger
from packing.products import Request

HOLD_PREFIX = "\x00hold/"


def is_hold(claim: str) -> bool:
    """Is ``claim`` a hold, not a claim of a pod?"""
    return claim.startswith(HOLD_PREFIX)


def fits_off(ledger: Ledger, r: Request, held: set[str] | frozenset[str]) -> bool:
    """Does ``r`` fit now on GPUs not in ``held``, on a node its pod may use? O(nodes x GPUs)."""
    return any(
        n.allows(r) and ledger.host_fits(n, r)
        and (r.gpu_less or sum(1 for g in ledger.fitting_gpus(n, r) if g.uuid not in held) >= r.count)
        for n in ledger.nodes.values())


class Holds:
    """The holds of one step on one ledger."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self._held: dict[str, str] = {}  # GPU uuid -> the hold's claim id
        self.lifted = 0  # holds given back so far: a fit that failed before the last one may succeed now

    def __contains__(self, gpu: object) -> bool:
        return gpu in self._held

    def hold(self, gpu: str) -> None:
        """Reserve whatever is free on ``gpu`` now (nothing when it is full or already held)."""
        g = self.ledger.gpus.get(gpu)
        if g is None or gpu in self._held or g.free_milli == 0:
            return
        name = HOLD_PREFIX + gpu
        self.ledger.assign(name, Request(milli=g.free_milli, memory_mib=g.free_mib), g.node, (gpu,))
        self._held[gpu] = name

    def lift(self, gpu: str) -> None:
        """Give ``gpu``'s held capacity back for the moment (``hold`` takes what is still free)."""
        name = self._held.pop(gpu, None)
        if name is not None and name in self.ledger.allocations:
            self.ledger.release(name)
            self.lifted += 1

    @contextmanager
    def lifted_meanwhile(self, gpus: Sequence[str]) -> Iterator[None]:
        """Lift ``gpus`` for the body, then hold what is still free there again; not counted in ``lifted``
        (nothing is let go for the rest of the step)."""
        count = self.lifted
        for gpu in gpus:
            self.lift(gpu)
        try:
            yield
        finally:
            for gpu in gpus:
                self.hold(gpu)
            self.lifted = count

    def release_all(self) -> None:
        for gpu in list(self._held):
            self.lift(gpu)

    def free(self, g: Gpu) -> tuple[int, int]:
        """(milli, MiB) that ``g`` would have free without its hold."""
        name = self._held.get(g.uuid)
        alloc = self.ledger.allocations.get(name) if name is not None else None
        if alloc is None:
            return g.free_milli, g.free_mib
        return g.free_milli + alloc.request.milli, g.free_mib + alloc.request.memory_mib
