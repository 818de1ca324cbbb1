"""Where a pod group fits: every member at once, each on a node its pod may use.

* ``place_group``: the placement policy's choice for every member now, largest first (then the one
  that may use the fewest nodes), each seeing the members placed before it (first fit decreasing
  through the policy's own ``choose``); None when one does not fit, and then nothing of it stays in
  the ledger. For members of one shape (the usual gang) this finds a placement whenever one exists:
  a member takes exactly one slot. For members of several shapes or node constraints it may miss
  one that a search would find; it never places part of a group.
* ``group_could_hold``: could the cluster, empty, hold every member at once (best fit decreasing
  over each node's cards, by the nodes each member may use)? A group for which it says no is
  ``Unsatisfiable``.
* ``pick_group_target``: the GPUs to drain for a starving group: per member, largest first, the
  GPU(s) likeliest to free soonest (``packing.drain.gpu_drain``'s score), on empty capacity left
  by the members before it: once the claims on them end, the group fits there exactly.
* ``place_on_target``: the members on their target GPUs now, if each fits there.
* ``group_shortfall``: why the group's members together would take their namespace over its
  entitlement.

Pure; the ledger is changed only inside a call and restored before it returns.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from packing.drain import GpuTarget, gpu_drain
from packing.entitlements import Entitlement, Usage, product_name, slices_of
from packing.estimate import RuntimeHistory
from packing.ledger import Allocation, Ledger, LedgerError, Node
from packing.policies import Choice, Policy
from packing.products import Request
from packing.running_book import RunningClaim

Placement = tuple[str, tuple[str, ...]]  # (node, GPUs) of one member


@dataclass(frozen=True, slots=True)
class GroupChoice(Choice):
    """A whole group's placement: for each of ``requests``, its (node, GPUs) in ``members``. ``node``,
    ``gpus`` and ``key`` are the first's, for code that reads a plain ``Choice``."""

    members: tuple[Placement, ...] = ()
    requests: tuple[Request, ...] = ()

    def for_members(self, requests: Sequence[Request]) -> tuple[Placement, ...]:
        """The placements in the order of ``requests`` (a group's members, asking what ``self.requests``
        asks, in any order): members asking alike are interchangeable."""
        free: dict[Request, list[Placement]] = {}
        for r, p in zip(self.requests, self.members, strict=True):
            free.setdefault(r, []).append(p)
        return tuple(free[r].pop(0) for r in requests)


def largest_first(requests: Sequence[Request], ledger: Ledger) -> list[int]:
    """Member indexes, largest request first (more cards, then more milli, then more memory), and among
    equals the one that may use the fewest nodes first (a member pinned to a pool before one that may
    go anywhere); stable."""
    everywhere = len(ledger.nodes)

    def key(i: int) -> tuple[int, int, int, int]:
        r = requests[i]
        allowed = ledger.eligible(r)
        return (-r.count, -r.milli, -r.memory_mib, everywhere if allowed is None else len(allowed))

    return sorted(range(len(requests)), key=key)


def place_group(policy: Policy, ledger: Ledger, requests: Sequence[Request],
                nodes: Collection[str] | None = None) -> GroupChoice | None:
    """Every member placed now by ``policy`` (each on a node it may use, and one of ``nodes`` when
    given), largest first; None when one does not fit. The ledger is left as it was."""
    from packing.admission.view import choose_allowed  # the queue's one way to place (a cycle at import)

    placed: list[Placement | None] = [None] * len(requests)
    first: Choice | None = None
    temp: list[str] = []
    try:
        for i in largest_first(requests, ledger):
            c = choose_allowed(policy, ledger, requests[i], nodes)
            if c is None:
                return None
            name = f"\x00group-fit/{i}"
            ledger.assign(name, requests[i], c.node, c.gpus)
            temp.append(name)
            placed[i] = (c.node, c.gpus)
            if i == 0:
                first = c
    finally:
        for name in temp:
            ledger.release(name)
    assert first is not None and all(p is not None for p in placed)
    return GroupChoice(first.node, first.gpus, first.key, tuple(p for p in placed if p is not None), tuple(requests))


def fitting_members(policy: Policy, ledger: Ledger, requests: Sequence[Request]) -> int:
    """How many members, largest first, the policy places now before one does not fit."""
    from packing.admission.view import choose_allowed

    temp: list[str] = []
    try:
        for i in largest_first(requests, ledger):
            c = choose_allowed(policy, ledger, requests[i])
            if c is None:
                break
            temp.append(f"\x00group-fit/{i}")
            ledger.assign(temp[-1], requests[i], c.node, c.gpus)
        return len(temp)
    finally:
        for name in temp:
            ledger.release(name)


def place_on_target(ledger: Ledger, requests: Sequence[Request], target: Sequence[Placement]) -> GroupChoice | None:
    """The members on exactly their target GPUs, if every one fits there now; None otherwise."""
    temp: list[str] = []
    try:
        for i, (r, (node, gpus)) in enumerate(zip(requests, target, strict=True)):
            name = f"\x00group-fit/{i}"
            try:
                ledger.assign(name, r, node, gpus)
            except LedgerError:
                return None
            temp.append(name)
    finally:
        for name in temp:
            ledger.release(name)
    node, gpus = target[0]
    return GroupChoice(node, gpus, (), tuple(target), tuple(requests))


def _could_take(node: Node, r: Request) -> bool:
    """May ``r``'s pod go to ``node`` by its constraints, and is the node large enough for one of it?"""
    if not node.allows(r):
        return False
    if node.cpu_milli is not None and r.cpu_milli > node.cpu_milli:
        return False
    return node.memory_mib is None or r.host_memory_mib <= node.memory_mib


class _Empty:
    """The cluster's capacity as if empty, taken member by member."""

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.gpu: dict[str, tuple[int, int]] = {u: (g.milli, g.memory_mib) for u, g in ledger.gpus.items()}
        self.host: dict[str, tuple[int, int]] = {
            n.name: (n.cpu_milli if n.cpu_milli is not None else -1, n.memory_mib if n.memory_mib is not None else -1)
            for n in ledger.nodes.values()}

    def host_fits(self, node: Node, r: Request) -> bool:
        cpu, mem = self.host[node.name]
        return (cpu < 0 or cpu >= r.cpu_milli) and (mem < 0 or mem >= r.host_memory_mib)

    def gpu_fits(self, uuid: str, r: Request) -> bool:
        g = self.ledger.gpus[uuid]
        milli, mib = self.gpu[uuid]
        if not r.accepts_model(g.model) or g.memory_mib < r.memory_mib:
            return False
        if r.whole:
            return (milli, mib) == (g.milli, g.memory_mib)
        return milli >= r.milli and mib >= r.memory_mib

    def take(self, node: Node, r: Request, gpus: Sequence[str]) -> None:
        cpu, mem = self.host[node.name]
        self.host[node.name] = (cpu - r.cpu_milli if cpu >= 0 else cpu, mem - r.host_memory_mib if mem >= 0 else mem)
        for u in gpus:
            milli, mib = self.gpu[u]
            self.gpu[u] = (milli - r.milli, mib - r.memory_mib)


def group_could_hold(ledger: Ledger, requests: Sequence[Request]) -> tuple[Placement, ...] | None:
    """A placement of every member on the cluster as if it were empty (best fit decreasing), or None
    when there is none by that rule: the group is then ``Unsatisfiable``."""
    empty = _Empty(ledger)
    out: list[Placement | None] = [None] * len(requests)
    nodes = sorted(ledger.nodes.values(), key=lambda n: n.order)
    for i in largest_first(requests, ledger):
        r = requests[i]
        best: tuple[tuple[int, int], Node, tuple[str, ...]] | None = None
        for node in nodes:
            if not _could_take(node, r) or not empty.host_fits(node, r):
                continue
            if r.gpu_less:
                cand: tuple[tuple[int, int], Node, tuple[str, ...]] = ((0, node.order), node, ())
            else:
                fitting = [g for g in node.gpus if empty.gpu_fits(g.uuid, r)]
                if len(fitting) < r.count:
                    continue
                if r.whole:  # the node with the fewest spare empty cards
                    cand = ((len(fitting) - r.count, node.order), node, tuple(g.uuid for g in fitting[:r.count]))
                else:  # the GPU with the least room left that takes it
                    g = min(fitting, key=lambda g: (empty.gpu[g.uuid][0], g.index))
                    cand = ((empty.gpu[g.uuid][0] - r.milli, node.order), node, (g.uuid,))
            if best is None or cand[0] < best[0]:
                best = cand
        if best is None:
            return None
        _, node, gpus = best
        empty.take(node, r, gpus)
        out[i] = (node.name, gpus)
    return tuple(p for p in out if p is not None)


def pick_group_target(ledger: Ledger, requests: Sequence[Request], runs: Mapping[str, RunningClaim],
                      history: RuntimeHistory, now: float, horizon: float,
                      on: Mapping[str, list[Allocation]]) -> tuple[Placement, ...] | None:
    """The GPUs to hold for a starving group: member by member, largest first, the GPU(s) of a node
    it may use likeliest to free soonest for it, on the capacity the members before it left (as if
    empty). None when the cluster, empty, could not hold the group by this rule (then
    ``group_could_hold``'s placement serves)."""
    empty = _Empty(ledger)
    out: list[Placement | None] = [None] * len(requests)
    for i in largest_first(requests, ledger):
        r = requests[i]
        best: tuple[tuple[float, float, int, int, str], Node, tuple[str, ...]] | None = None
        for node in ledger.nodes.values():
            if not _could_take(node, r) or not empty.host_fits(node, r):
                continue
            cand: tuple[tuple[float, float, int, int, str], Node, tuple[str, ...]]
            if r.gpu_less:
                cand = (GpuTarget(node.name, (), None, 1.0, 0).order(node.order), node, ())
            else:
                scored = []
                for g in node.gpus:
                    if g.withdrawn or not empty.gpu_fits(g.uuid, r):
                        continue
                    d, c, free = gpu_drain(g, r, on.get(g.uuid, ()), runs, history, now, horizon)
                    one = GpuTarget(node.name, (g.uuid,), d, c, free)
                    scored.append((one.order(node.order), g.index, one))
                if len(scored) < r.count:
                    continue
                scored.sort()
                chosen = [t for _, _, t in scored[:r.count]]
                ends = [t.drains_by for t in chosen]
                joint = GpuTarget(node.name, tuple(t.gpus[0] for t in chosen),
                                  None if any(e is None for e in ends) else max(e for e in ends if e is not None),
                                  math.prod(t.chance for t in chosen), sum(t.idle_milli for t in chosen))
                cand = (joint.order(node.order), node, joint.gpus)
            if best is None or cand[0] < best[0]:
                best = cand
        if best is None:
            return None
        _, node, gpus = best
        empty.take(node, r, gpus)
        out[i] = (node.name, gpus)
    return tuple(p for p in out if p is not None)


def group_shortfall(entitlement: Entitlement | None, namespace: str, requests: Sequence[Request],
                    usage: Usage) -> str | None:
    """Why admitting every member now would take ``namespace`` over its entitlement; None when it
    would not (a namespace without an entitlement is not capped)."""
    if entitlement is None:
        return None
    need: dict[str, int] = {}
    milli = 0
    for r in requests:
        if r.gpu_less:
            continue
        p = product_name(r)
        need[p] = need.get(p, 0) + slices_of(r)
        milli += r.total_milli
    for product, n in sorted(need.items()):
        cap = entitlement.max_slices.get(product)
        if cap is None:
            continue
        held = usage.held(product)
        if held + n > cap:
            never = "; the group can never start under this entitlement" if n > cap else ""
            return (f"namespace {namespace} holds {held} of its {cap} {product} slice(s); its group needs "
                    f"{n} more at once{never}")
    if entitlement.max_milli is not None:
        held_milli = usage.milli
        if held_milli + milli > entitlement.max_milli:
            never = "; the group can never start under this entitlement" if milli > entitlement.max_milli else ""
            return (f"namespace {namespace} holds {held_milli} of its {entitlement.max_milli} milli-GPU; its "
                    f"group needs {milli} more at once{never}")
    return None
