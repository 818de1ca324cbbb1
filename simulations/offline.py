"""The offline reference for protocol A: the pods arrived up to 100 %, packed knowing all of them.

An online policy places each pod as it arrives and never moves it. The reference sees the whole
prefix of a seed's workload whose requested GPU reaches 100 % of capacity, and may reorder,
move and leave out pods as it likes. It is not an optimum (that is an NP-hard multi-dimensional
packing), but a packing no online policy is promised, so the gap between it and a policy is
headroom an online policy could still gain. It is built in two steps:

1. **start**: the better of two passes of ``policy`` over the prefix, in arrival order and in
   decreasing size (GPU milli, then CPU), on a fresh cluster in the seed's node order;
2. **repair**, largest failed pod first, until a pass gains nothing (at most ``MAX_PASSES``):
   * *move*: a placed pod q leaves a node for another one where it fits (best fit), and the
     failed pod p takes its room: + p's GPU (the ``MOVE_TRIES`` smallest such q are tried);
   * *swap*: a placed pod q smaller than p (in GPU) leaves the cluster so that p fits on its
     node: + p's GPU − q's, and q joins the failed pods (it may find room later).

Unallocated GPU % = 100 − allocated % of capacity, with arrived = the prefix's demand (≤ 100 %
by at most one pod). Deterministic for a seed.
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

from packing.ledger import Ledger, Node
from packing.policies import BEST_FIT, DEFAULT_POLICY
from packing.products import Request
from simulations.cluster import CardModel, TrackedLedger, build_ledger
from simulations.protocol_a import DEFAULT_INFLATION, inflate
from simulations.scheduler import Scheduler, run_policy
from simulations.traces import NodeSpec

MAX_PASSES = 4
MOVE_TRIES = 16  # the smallest candidates tried for a move per failed pod (each try is a best-fit search)
OFFLINE = "offline"  # the name the reference is reported under


@dataclass
class OfflineRun:
    seed: int
    pods: int  # in the prefix
    capacity_milli: int
    arrived_pct: float
    unallocated_gpu_pct: float
    start_unallocated_gpu_pct: float  # after step 1
    start: str  # "arrival" or "decreasing"
    moves: int
    swaps: int
    seconds: float

    def as_dict(self) -> dict[str, object]:
        return dict(self.__dict__)


def prefix_to_capacity(workload: Sequence[Request], capacity_milli: int) -> list[Request]:
    """The leading pods whose requested GPU stays within ``capacity_milli``."""
    out: list[Request] = []
    arrived = 0
    for r in workload:
        if arrived + r.total_milli > capacity_milli:
            break
        arrived += r.total_milli
        out.append(r)
    return out


def _pass(nodes: Sequence[NodeSpec], card: CardModel, order: Sequence[int], requests: Sequence[Request],
          policy_name: str, mix_requests: Sequence[Request], seed: int, track_host: bool,
          prior: Sequence[Request]) -> tuple[TrackedLedger, dict[str, int], list[int]]:
    """One online pass of ``policy_name`` over ``requests`` in ``order``: the ledger, placed claims, failed indices."""
    ledger = build_ledger(nodes, card, seed=seed, track_host=track_host)
    policy = run_policy(policy_name, mix_requests, seed, prior)
    scheduler = Scheduler(ledger, policy, seed=seed)
    placed: dict[str, int] = {}
    failed: list[int] = []
    for i in order:
        policy.observe(requests[i])
        if scheduler.place(f"p{i}", requests[i]) is not None:
            placed[f"p{i}"] = i
        else:
            failed.append(i)
    return ledger, placed, failed


def _fits_after_leaving(node: Node, q: Request, q_gpus: tuple[str, ...], p: Request) -> bool:
    """Would ``p`` fit on ``node`` once ``q`` (holding ``q_gpus`` there) left? Host and GPUs, no ledger change."""
    if node.cpu_milli is not None and p.cpu_milli > node.free_cpu + q.cpu_milli:
        return False
    if node.memory_mib is not None and p.host_memory_mib > node.free_mem + q.host_memory_mib:
        return False
    if p.gpu_less:
        return True
    freed = set(q_gpus)
    able = 0
    for g in node.gpus:
        if g.withdrawn or not p.accepts_model(g.model):
            continue
        free = g.free_milli + (q.milli if g.uuid in freed else 0)
        mib = g.free_mib + (q.memory_mib if g.uuid in freed else 0)
        if p.whole:
            able += free == g.milli and mib == g.memory_mib and g.memory_mib >= p.memory_mib
        else:
            able += free >= p.milli and mib >= p.memory_mib
    return able >= p.count


def _candidates(ledger: Ledger, by_node: dict[str, set[str]], p: Request) -> list[tuple[int, str, str]]:
    """(GPU milli, node, claim) of every placed claim whose leaving lets ``p`` fit on its node, smallest
    first (cheap necessary conditions per node and claim before the exact check)."""
    out: list[tuple[int, str, str]] = []
    for name, claims in by_node.items():
        node = ledger.nodes[name]
        cpu_short = p.cpu_milli - node.free_cpu if node.cpu_milli is not None else 0
        mem_short = p.host_memory_mib - node.free_mem if node.memory_mib is not None else 0
        usable = [g for g in node.gpus if p.accepts_model(g.model)]
        if len(usable) < p.count:
            continue
        empties = sum(1 for g in usable if g.empty)
        room = any(g.free_milli >= p.milli for g in usable)
        for c in claims:
            a = ledger.allocations[c]
            q = a.request
            if cpu_short > q.cpu_milli or mem_short > q.host_memory_mib:
                continue
            if p.whole and empties + q.count < p.count:
                continue
            if not p.whole and not room and (q.gpu_less or q.milli + ledger.gpus[a.gpus[0]].free_milli < p.milli):
                continue
            if _fits_after_leaving(node, q, a.gpus, p):
                out.append((q.total_milli, name, c))
    out.sort()
    return out


def _repair(ledger: Ledger, requests: Sequence[Request], placed: dict[str, int], failed: list[int]) -> tuple[int, int]:
    """Moves and swaps until a pass gains nothing; (moves, swaps). Changes ``placed`` and ``failed``."""
    moves = swaps = 0
    others = set(ledger.nodes)  # every node but the one a pod is moved off (discarded while it is)
    by_node: dict[str, set[str]] = {}
    for claim, alloc in ledger.allocations.items():
        by_node.setdefault(alloc.node, set()).add(claim)
    changes = 0  # moves and swaps so far: a request that found nothing needs no new search until this moves
    hopeless: dict[Request, int] = {}
    for _ in range(MAX_PASSES):
        gained = False
        for i in sorted(failed, key=lambda k: (-requests[k].total_milli, k)):
            p = requests[i]
            if p.gpu_less or hopeless.get(p) == changes:
                continue  # no GPU to gain, or the same ask found nothing in this very ledger
            candidates = _candidates(ledger, by_node, p)
            if not candidates:
                hopeless[p] = changes
                continue
            done = False
            for _, name, c in candidates[:MOVE_TRIES]:  # a move first: it loses nothing
                a = ledger.release(c)
                others.discard(name)
                elsewhere = BEST_FIT.choose(ledger, a.request, others)
                others.add(name)
                if elsewhere is not None:
                    ledger.assign(c, a.request, elsewhere.node, elsewhere.gpus)
                    by_node[name].discard(c)
                    by_node.setdefault(elsewhere.node, set()).add(c)
                    done = True
                    moves += 1
                    break
                ledger.assign(c, a.request, a.node, a.gpus)
            if not done:
                size, name, c = candidates[0]
                if size >= p.total_milli:
                    hopeless[p] = changes
                    continue  # no swap gains GPU
                a = ledger.release(c)
                by_node[name].discard(c)
                del placed[c]
                failed.append(int(c[1:]))
                swaps += 1
            claim = f"p{i}"
            gpus = BEST_FIT.pick(ledger, p, name)
            assert gpus is not None, "the freed node holds p"
            ledger.assign(claim, p, name, gpus)
            by_node.setdefault(name, set()).add(claim)
            placed[claim] = i
            failed.remove(i)
            changes += 1
            gained = True
        if not gained:
            break
    return moves, swaps


def reference(nodes: Sequence[NodeSpec], requests: Sequence[Request], card: CardModel, seed: int,
              inflation: float = DEFAULT_INFLATION, policy: str = DEFAULT_POLICY,
              track_host: bool = True, prior: Sequence[Request] = ()) -> OfflineRun:
    """The offline reference of one seed (the same inflated, shuffled workload as protocol A's)."""
    started = time.perf_counter()
    rng = random.Random(seed)
    capacity = build_ledger(nodes, card, seed=seed, track_host=track_host).capacity_milli()
    if capacity == 0:
        raise ValueError("the offline reference needs GPUs: the node list has none")
    prefix = prefix_to_capacity(inflate(requests, capacity, inflation, rng), capacity)
    arrival = list(range(len(prefix)))
    decreasing = sorted(arrival, key=lambda i: (-prefix[i].total_milli, -prefix[i].cpu_milli, i))
    best: tuple[int, str, TrackedLedger, dict[str, int], list[int]] | None = None
    for label, order in (("arrival", arrival), ("decreasing", decreasing)):
        ledger, placed, failed = _pass(nodes, card, order, prefix, policy, requests, seed, track_host, prior)
        allocated = sum(prefix[i].total_milli for i in placed.values())
        if best is None or allocated > best[0]:
            best = (allocated, label, ledger, placed, failed)
    assert best is not None
    start_alloc, label, ledger, placed, failed = best
    moves, swaps = _repair(ledger, prefix, placed, failed)
    allocated = sum(prefix[i].total_milli for i in placed.values())
    arrived = sum(r.total_milli for r in prefix)
    return OfflineRun(
        seed=seed, pods=len(prefix), capacity_milli=capacity, arrived_pct=100.0 * arrived / capacity,
        unallocated_gpu_pct=100.0 * (capacity - allocated) / capacity,
        start_unallocated_gpu_pct=100.0 * (capacity - start_alloc) / capacity, start=label, moves=moves, swaps=swaps,
        seconds=time.perf_counter() - started,
    )


def summarize(runs: Sequence[OfflineRun]) -> dict[str, object]:
    """Mean and standard deviation over seeds of the reference's unallocated GPU %, and its steps."""
    values = [r.unallocated_gpu_pct for r in runs]
    return {
        "policy": OFFLINE,
        "seeds": [r.seed for r in runs],
        "unallocated_gpu_pct": statistics.fmean(values) if values else float("nan"),
        "unallocated_gpu_pct_sd": statistics.stdev(values) if len(values) > 1 else 0.0,
        "start_unallocated_gpu_pct": statistics.fmean(r.start_unallocated_gpu_pct for r in runs) if runs else 0.0,
        "moves": sum(r.moves for r in runs),
        "swaps": sum(r.swaps for r in runs),
        "seconds_per_run": statistics.fmean(r.seconds for r in runs) if runs else 0.0,
    }
