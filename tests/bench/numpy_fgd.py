"""A plain numpy re-implementation of FGD's protocol A run: the speed yardstick of ``bench_sim``.

Benchmark code, not a product policy. The cluster is arrays (free milli per node and card, free
CPU and RAM per node), the workload's typical pods are arrays, and per node the sums F needs are
kept per typical pod m: U[n, m], the idle milli on cards with at least m's milli free, and
C[n, m], how many such cards. For every pod, every (fitting node, card) is evaluated at once
from those sums (the card's own change is added, the rest of the node is unchanged): F after
the placement against F before, score ``int(100·sigmoid(gain/1000))``, the first node in the
seed's order among the best scores (the artifact's stable ties), the first card among the
node's best. Its result equals FGD's (``packing.policies.fgd``) up to float rounding: the
bench prints both. Model constraints are not modelled (for workloads without ``gpu_spec``).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np

from packing.fragment import TypicalMix
from packing.products import Request
from simulations.cluster import node_order
from simulations.protocol_a import DEFAULT_INFLATION, headline, inflate
from simulations.traces import NodeSpec


class _Cluster:
    def __init__(self, nodes: Sequence[NodeSpec], mix: TypicalMix) -> None:
        width = max(s.gpus for s in nodes)
        self.free = np.full((len(nodes), width), -1, dtype=np.int64)  # -1: no card in that slot
        for i, s in enumerate(nodes):
            self.free[i, : s.gpus] = 1000
        self.cpu = np.array([s.cpu_milli for s in nodes], dtype=np.int64)
        self.mem = np.array([s.memory_mib for s in nodes], dtype=np.int64)
        pods = [p for p in mix.pods if p.milli > 0]
        self.u = np.array([p.milli for p in pods], dtype=np.int64)  # (M,)
        self.k = np.array([p.count for p in pods], dtype=np.int64)
        self.c = np.array([p.cpu_milli for p in pods], dtype=np.int64)
        self.w = np.array([p.weight for p in pods])
        self.total_w = mix.total_weight
        self.usable = np.zeros((len(nodes), len(pods)))
        self.count = np.zeros((len(nodes), len(pods)), dtype=np.int64)
        self.f = np.zeros(len(nodes))
        for i in range(len(nodes)):
            self.refresh(i)

    def refresh(self, i: int) -> None:
        row = self.free[i]
        fits = row[None, :] >= self.u[:, None]  # (M, width)
        self.usable[i] = (fits * np.where(row > 0, row, 0)).sum(1)
        self.count[i] = fits.sum(1)
        self.f[i] = self._f(np.where(row > 0, row, 0).sum(), self.usable[i], self.count[i], self.cpu[i])

    def _f(self, idle: np.ndarray, usable: np.ndarray, count: np.ndarray, cpu: np.ndarray) -> np.ndarray:
        ok = (count >= self.k) & (cpu[..., None] >= self.c)
        return self.total_w * idle - (ok * usable * self.w).sum(-1)

    def idle(self, nodes: np.ndarray) -> np.ndarray:
        sub = self.free[nodes]
        return np.where(sub > 0, sub, 0).sum(1)


def run(nodes: Sequence[NodeSpec], requests: Sequence[Request], seed: int,
        inflation: float = DEFAULT_INFLATION) -> float:
    """Unallocated GPU % at arrived 100 % of one seed."""
    rng = random.Random(seed)
    order = np.array(node_order(len(nodes), seed))
    capacity = 1000 * sum(s.gpus for s in nodes)
    workload = inflate(requests, capacity, inflation, rng)
    cl = _Cluster(nodes, TypicalMix.from_requests(requests, host_memory=False))
    arrived = allocated = 0
    arrivals: list[float] = []
    allocations: list[float] = []
    for r in workload:
        arrived += r.total_milli
        host = (cl.cpu >= r.cpu_milli) & (cl.mem >= r.host_memory_mib)
        if r.gpu_less:
            cand = np.flatnonzero(host)
            if cand.size:
                after = cl._f(cl.idle(cand), cl.usable[cand], cl.count[cand], cl.cpu[cand] - r.cpu_milli)
                allocated += _place(cl, cand, cl.f[cand] - after, order, None, r)
        elif r.whole:
            empty = cl.free == 1000
            cand = np.flatnonzero(host & (empty.sum(1) >= r.count))
            if cand.size:
                # k empty cards leave: each was usable (and counted) by every typical pod
                usable = cl.usable[cand] - 1000 * r.count
                count = cl.count[cand] - r.count
                after = cl._f(cl.idle(cand) - 1000 * r.count, usable, count, cl.cpu[cand] - r.cpu_milli)
                picks = np.argsort(~empty[cand], axis=1, kind="stable")[:, : r.count]  # the first k empty cards
                allocated += _place(cl, cand, cl.f[cand] - after, order, picks, r)
        else:
            cand = np.flatnonzero(host & (cl.free >= r.milli).any(1))
            if cand.size:
                f0 = cl.free[cand][:, :, None]  # (n', card, 1)
                f1 = f0 - r.milli
                u = cl.u[None, None, :]
                was, now = f0 >= u, f1 >= u  # (n', card, M)
                usable = cl.usable[cand][:, None, :] - was * f0 + now * f1
                count = cl.count[cand][:, None, :] - was + now
                cpu = np.repeat((cl.cpu[cand] - r.cpu_milli)[:, None], f0.shape[1], axis=1)
                after = cl._f((cl.idle(cand) - r.milli)[:, None], usable, count, cpu)
                gains = cl.f[cand][:, None] - after
                scores = np.where(f0[:, :, 0] >= r.milli, (100 / (1 + np.exp(-gains / 1000))).astype(np.int64), -1)
                card = scores.argmax(1)  # the first card among the node's best
                allocated += _place(cl, cand, None, order, card[:, None], r, scores[np.arange(cand.size), card])
        arrivals.append(100.0 * arrived / capacity)
        allocations.append(100.0 * allocated / capacity)
    return headline(arrivals, allocations)[0]


def _place(cl: _Cluster, cand: np.ndarray, gains: np.ndarray | None, order: np.ndarray, picks: np.ndarray | None,
           r: Request, scores: np.ndarray | None = None) -> int:
    """Take the best-scoring candidate (first in node order among equals), update the arrays; the milli placed."""
    if scores is None:
        assert gains is not None
        scores = (100 / (1 + np.exp(-gains / 1000))).astype(np.int64)
    best = np.flatnonzero(scores == scores.max())
    j = best[np.argmin(order[cand[best]])]
    node = cand[j]
    if picks is not None:
        cl.free[node, picks[j]] -= r.milli
    cl.cpu[node] -= r.cpu_milli
    cl.mem[node] -= r.host_memory_mib
    cl.refresh(node)
    return r.total_milli
