"""Drain targets: the capacity held for a starving head of the line until it frees up for it.

**Node targets** (``pick_target``, the aging guard): one node, where the head would start soonest:

* with declared ends (``packing.estimate``), the node of the earliest estimated start;
* otherwise the node closest to holding the head: the most free capacity usable by it (free
  milli on its best ``count`` matching GPUs, each counted up to the milli it needs), then the
  fewest claims to drain, then node order.

**GPU targets** (``pick_gpu_target``, drain-soonest): ``count`` GPUs of one node that should hold
the head soonest. Each GPU is scored by

* the chance that the claims on it that must end for the head to fit (all of them for a whole
  card; for a slice, any one whose end frees enough) end within a horizon: 1 or 0 for a claim that
  declared its limit, else ``RuntimeHistory.ends_within`` from its product's past runtimes and
  its age -- for the set, the product over its GPUs;
* then its declared drain: the time by which the declared ends alone free enough (None when a
  claim that must end declares nothing);
* then the free capacity a hold would idle meanwhile (less first), node order, GPU index.

Pure and deterministic: the strategy keeps each pick while its head starves.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from packing.entitlements import product_name
from packing.estimate import RuntimeHistory, earliest_node
from packing.ledger import Allocation, Gpu, Ledger, Node
from packing.products import Request


class _Run(Protocol):
    """What a GPU target's score needs of a running claim (``packing.running_book.RunningClaim``)."""

    started_at: float
    ends_at: float | None


def pick_target(ledger: Ledger, request: Request, ends: Iterable[tuple[float, str]], now: float,
                candidates: Collection[str]) -> str | None:
    """The drain target for ``request`` among ``candidates`` (node names that could hold it when
    empty); None when there are none."""
    if not candidates:
        return None
    found = earliest_node(ledger, request, ends, now, nodes=candidates)
    if found is not None:
        return found[1]
    claims: dict[str, int] = {}
    for alloc in ledger.allocations.values():
        claims[alloc.node] = claims.get(alloc.node, 0) + 1
    nodes = [ledger.nodes[name] for name in candidates]
    best = min(nodes, key=lambda n: (-usable_milli(n, request), claims.get(n.name, 0), n.order, n.name))
    return best.name


def usable_milli(node: Node, request: Request) -> int:
    """How much of ``request`` the node's free GPUs could hold now: free milli on its best
    ``count`` matching GPUs, each up to the milli the request needs on one GPU."""
    if request.gpu_less:
        return 0
    free = sorted((min(g.free_milli, request.milli) for g in node.gpus
                   if request.accepts_model(g.model) and g.memory_mib >= request.memory_mib), reverse=True)
    return sum(free[:request.count])


def could_hold(node: Node, r: Request) -> bool:
    """Could ``node``, empty, hold ``r``, and may ``r``'s pod go there (labels, taints, cordon)?"""
    if not node.allows(r):
        return False
    if node.cpu_milli is not None and r.cpu_milli > node.cpu_milli:
        return False
    if node.memory_mib is not None and r.host_memory_mib > node.memory_mib:
        return False
    if r.gpu_less:
        return True
    cards = sum(1 for g in node.gpus if r.accepts_model(g.model) and g.milli >= r.milli
                and g.memory_mib >= r.memory_mib)
    return cards >= r.count


@dataclass(frozen=True, slots=True)
class GpuTarget:
    """A drain target of ``gpus`` on ``node``, and how soon it should hold the head it is held for."""

    node: str
    gpus: tuple[str, ...]
    drains_by: float | None  # declared ends alone free it by then (if nothing new lands); None: unknown
    chance: float  # estimated chance that it holds the head within the horizon
    idle_milli: int  # free on its GPUs now: what holding it idles meanwhile

    def order(self, node_order: int) -> tuple[float, float, int, int, str]:
        """Sort key: the likeliest to hold its head soonest first, then the least idle."""
        return (-self.chance, math.inf if self.drains_by is None else self.drains_by, self.idle_milli,
                node_order, self.node)


def claims_by_gpu(ledger: Ledger, skip: Collection[str] = ()) -> dict[str, list[Allocation]]:
    """The allocations on each GPU, leaving out the claims in ``skip`` (holds)."""
    on: dict[str, list[Allocation]] = {}
    for alloc in ledger.allocations.values():
        if alloc.claim in skip:
            continue
        for share in alloc.shares:
            on.setdefault(share.uuid, []).append(alloc)
    return on


def gpu_drain(g: Gpu, request: Request, on: Sequence[Allocation], runs: Mapping[str, _Run],
              history: RuntimeHistory, now: float, horizon: float) -> tuple[float | None, float, int]:
    """(declared drain, chance within ``horizon``, free milli) of one GPU for ``request``, counting
    only the claims ``on`` it (holds left out)."""
    need_milli = g.milli if request.whole else request.milli
    need_mib = g.memory_mib if request.whole else request.memory_mib
    free_milli, free_mib = g.milli, g.memory_mib
    slices: list[tuple[float, int, int, float]] = []  # (declared end or inf, milli, MiB, chance)
    for alloc in on:
        share = next(s for s in alloc.shares if s.uuid == g.uuid)
        free_milli -= share.milli
        free_mib -= share.memory_mib
        run = runs.get(alloc.claim)
        end = run.ends_at if run is not None else None
        if end is not None:
            chance = 1.0 if end <= now + horizon else 0.0
        else:
            age = now - run.started_at if run is not None else 0.0
            chance = history.ends_within(product_name(alloc.request), age, horizon)
        slices.append((math.inf if end is None else end, share.milli, share.memory_mib, chance))
    if free_milli >= need_milli and free_mib >= need_mib:
        return now, 1.0, free_milli
    declared: float | None = None
    milli, mib = free_milli, free_mib
    for end, m, b, _ in sorted(slices):
        milli += m
        mib += b
        if milli >= need_milli and mib >= need_mib:
            declared = None if math.isinf(end) else max(end, now)
            break
    if request.whole:
        chance = math.prod(c for _, _, _, c in slices)
    else:  # one end that frees enough on its own
        chance = 1.0 - math.prod(1.0 - c for _, m, b, c in slices
                                 if free_milli + m >= need_milli and free_mib + b >= need_mib)
    return declared, chance, free_milli


def gpu_target(ledger: Ledger, request: Request, node: str, gpus: Sequence[str], on: Mapping[str, list[Allocation]],
               runs: Mapping[str, _Run], history: RuntimeHistory, now: float, horizon: float) -> GpuTarget:
    """The target ``gpus`` of ``node`` scored for ``request`` now."""
    chance = 1.0
    idle = 0
    latest: float | None = now
    for uuid in gpus:
        d, c, free = gpu_drain(ledger.gpus[uuid], request, on.get(uuid, ()), runs, history, now, horizon)
        chance *= c
        idle += free
        latest = None if d is None or latest is None else max(latest, d)
    return GpuTarget(node, tuple(gpus), latest, chance, idle)


def pick_gpu_target(ledger: Ledger, request: Request, runs: Mapping[str, _Run], history: RuntimeHistory,
                    now: float, horizon: float, taken: Collection[str],
                    on: Mapping[str, list[Allocation]]) -> GpuTarget | None:
    """The ``request.count`` GPUs of one node, none in ``taken``, that should hold ``request``
    soonest; None when no node has enough GPUs that could hold it."""
    best: tuple[tuple[float, float, int, int, str], GpuTarget] | None = None
    for node in ledger.nodes.values():
        if not could_hold(node, request):
            continue
        scored: list[tuple[tuple[float, float, int, int, str], int, GpuTarget]] = []
        for g in node.gpus:
            if g.uuid in taken or not request.accepts_model(g.model) or g.memory_mib < request.memory_mib:
                continue
            d, c, free = gpu_drain(g, request, on.get(g.uuid, ()), runs, history, now, horizon)
            one = GpuTarget(node.name, (g.uuid,), d, c, free)
            scored.append((one.order(node.order), g.index, one))
        if len(scored) < request.count:
            continue
        scored.sort()
        chosen = [t for _, _, t in scored[:request.count]]
        ends = [t.drains_by for t in chosen]
        target = GpuTarget(node.name, tuple(t.gpus[0] for t in chosen),
                           None if any(e is None for e in ends) else max(e for e in ends if e is not None),
                           math.prod(t.chance for t in chosen), sum(t.idle_milli for t in chosen))
        key = target.order(node.order)
        if best is None or key < best[0]:
            best = (key, target)
    return None if best is None else best[1]
