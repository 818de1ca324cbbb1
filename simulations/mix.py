"""The workload's typical request mix and FGD's fragmentation measure over it.

FGD (Weng et al., ATC'23) calls a node's idle GPU capacity a *fragment* for a typical pod m
when m cannot use it: all of it when m does not fit on the node at all (CPU or GPUs), else the
GPUs whose free share is below m's ``gpu_milli``. F(node) = Σ_m p_m · fragment_m(node).

With T the node's idle milli and big_u the idle milli on GPUs with at least u free, this is
F = P·T − Σ_{m fits} p_m · big_{u_m}: one pass over the node's GPUs per distinct size u.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from packing.products import Request

FGD_COVERAGE = 0.95  # the FGD artifact's podPopularityThreshold: the commonest shapes covering 95 % of pods
MEMO_LIMIT = 400_000  # node states remembered per mix before the memo is cleared


@dataclass(frozen=True, slots=True)
class TypicalPod:
    cpu_milli: int
    milli: int
    count: int
    weight: float


class TypicalMix:
    """The commonest request shapes and their frequencies (weights sum to 1)."""

    def __init__(self, pods: Iterable[TypicalPod]) -> None:
        self.pods = tuple(pods)
        self.total_weight = sum(p.weight for p in self.pods)
        by_milli: dict[int, list[tuple[int, int, float]]] = {}
        for p in self.pods:
            if p.milli > 0:
                by_milli.setdefault(p.milli, []).append((p.count, p.cpu_milli, p.weight))
        self.by_milli = tuple((u, tuple(entries)) for u, entries in sorted(by_milli.items()))
        self._memo: dict[tuple[int, tuple[int, ...]], float] = {}

    @classmethod
    def from_requests(cls, requests: Iterable[Request], coverage: float = FGD_COVERAGE,
                      by_gpu: bool = False) -> TypicalMix:
        """FGD's typical pods: shapes (CPU, milli, count) by decreasing frequency until ``coverage``.

        ``by_gpu`` weighs each shape by its GPU demand instead of its pod count (an FGD option).
        """
        counts: dict[tuple[int, int, int], float] = {}
        for r in requests:
            shape = (r.cpu_milli, r.milli, r.count)
            counts[shape] = counts.get(shape, 0.0) + ((1 + r.total_milli / 1000) if by_gpu else 1.0)
        total = sum(counts.values())
        if total == 0:
            return cls(())
        ranked = sorted(counts.items(), key=lambda kv: (-kv[1], tuple(-x for x in kv[0])))
        chosen: list[tuple[tuple[int, int, int], float]] = []
        covered = 0.0
        for shape, n in ranked:
            if covered >= coverage * total:
                break
            chosen.append((shape, n))
            covered += n
        return cls(TypicalPod(c, m, k, n / covered) for (c, m, k), n in chosen)

    def fragment(self, cpu_free: int | None, frees: tuple[int, ...]) -> float:
        """F for a node with ``cpu_free`` millicores (None: unlimited) and GPU free shares ``frees``."""
        key = (-1 if cpu_free is None else cpu_free, tuple(sorted(frees)))
        value = self._memo.get(key)
        if value is not None:
            return value
        idle = sum(frees)
        total = self.total_weight * idle
        if idle:
            for u, entries in self.by_milli:
                fitting = 0
                usable = 0
                for f in frees:
                    if f >= u:
                        fitting += 1
                        usable += f
                if not usable:
                    continue
                for count, cpu, weight in entries:
                    if fitting >= count and (cpu_free is None or cpu_free >= cpu):
                        total -= weight * usable
        if len(self._memo) > MEMO_LIMIT:
            self._memo.clear()
        self._memo[key] = total
        return total

    def describe(self) -> list[dict[str, float | int]]:
        return [{"cpu_milli": p.cpu_milli, "milli": p.milli, "count": p.count, "weight": round(p.weight, 6)}
                for p in self.pods]


_current = TypicalMix(())


def set_mix(mix: TypicalMix) -> None:
    """Make ``mix`` the one fragmentation-aware policies score against (set per run)."""
    global _current
    _current = mix


def current_mix() -> TypicalMix:
    return _current
