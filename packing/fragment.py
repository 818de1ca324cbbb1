"""FGD's fragmentation measure: how much of a node's idle GPU the workload's typical pods cannot use.

FGD (Weng et al., USENIX ATC'23, ``pkg/utils/frag.go`` ``NodeGpuShareFragAmount``) calls a node's
idle GPU a *fragment* for a typical pod m when m cannot use it:

* all of it when m cannot be hosted on the node at all: too little CPU, fewer than ``count``
  GPUs of m's model with ``milli`` free, or no GPU of m's model (FGD's ``NoAccess``);
* else the idle milli on the GPUs that m cannot use (free share below m's ``milli``, or another
  model than m's).

F(node) = Σ_m p_m · fragment_m(node). With T the node's idle milli and usable_m the idle milli
on GPUs of m's model with at least m's ``milli`` free, F = P·T − Σ_{m fits} p_m · usable_m: one pass
over the node's GPUs per distinct (size, model) of the mix. A GPU-less typical pod uses no GPU,
so all idle GPU is fragment for it (FGD's ``XLSatisfied``/``XRLackCPU`` count it too).

F depends on the free CPU only through which typical pods' CPU requests it meets, so the memo
keys on the rank of the free CPU among the mix's CPU requests, not on the raw value.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from packing.products import Request, model_accepts

MEMO_LIMIT = 400_000  # node states remembered per mix before the memo is cleared
DEFAULT_COVERAGE = 0.95  # the FGD artifact's podPopularityThreshold: the commonest shapes covering 95 % of pods

Shape = tuple[int, int, int, int, str | None]  # (cpu milli, host MiB, milli per GPU, GPU count, model pattern)


def per_card_weights(weights: Mapping[Shape, float]) -> dict[Shape, float]:
    """Each shape's weight divided by its card count (k ≥ 1; one-card and GPU-less shapes unchanged).

    A k-card pod's fragment on a node with fewer than k free cards is all of the node's idle GPU, up
    to k − 1 whole cards; weighed by its pods, that term outweighs what the one-card pods, which can
    use those cards, would strand there. Divided by k it counts per card the pod asks (measured on
    ``openb``'s ``multigpu*`` lists: ``simulations/README.md``). Where models constrain
    (``TypicalMix.mixed_models``) ``from_weights`` does not apply it: on ``openb``'s ``gpuspec*``
    lists it moved the result both ways, beyond noise (−0.78 on one, +0.29 on another).
    """
    return {s: w / max(1, s[3]) for s, w in weights.items()}


def shape_of(request: Request) -> Shape:
    """The shape typical pods are counted by (GPU memory does not enter F: it follows the milli)."""
    return (request.cpu_milli, request.host_memory_mib, request.milli, request.count, request.model)


@dataclass(frozen=True, slots=True)
class TypicalPod:
    """One typical request shape and its frequency in the mix."""

    cpu_milli: int
    milli: int
    count: int
    weight: float
    model: str | None = None
    memory_mib: int = 0


class TypicalMix:
    """The commonest request shapes and their frequencies (weights sum to 1), and F over them.

    ``fragment`` is memoised per (CPU rank, RAM rank, cards): equal node states cost one computation.
    ``mixed_models``: the typical pods with GPUs name more than one model pattern (no pattern
    counting as one), so models constrain where some of them can go.
    """

    def __init__(self, pods: Iterable[TypicalPod]) -> None:
        self.pods = tuple(pods)
        self.total_weight = sum(p.weight for p in self.pods)
        self.mixed_models = len({p.model for p in self.pods if p.milli > 0}) > 1
        self._cpus = sorted({p.cpu_milli for p in self.pods})
        self._mems = sorted({p.memory_mib for p in self.pods})
        groups: dict[tuple[int, str | None], list[tuple[int, int, int, float]]] = {}
        for p in self.pods:
            if p.milli > 0:
                entry = (p.count, bisect.bisect_left(self._cpus, p.cpu_milli),
                         bisect.bisect_left(self._mems, p.memory_mib), p.weight)
                groups.setdefault((p.milli, p.model), []).append(entry)
        # per (milli, model pattern): the (count, CPU rank, RAM rank, weight) of its typical pods
        self._groups = tuple((u, m, tuple(e)) for (u, m), e in sorted(groups.items(),
                                                                      key=lambda kv: (kv[0][0], str(kv[0][1]))))
        self._accepts: dict[tuple[str | None, str], bool] = {}
        self._memo: dict[tuple[int, int, tuple[tuple[str, int], ...]], float] = {}

    @classmethod
    def from_weights(cls, weights: Mapping[Shape, float], coverage: float = DEFAULT_COVERAGE,
                     host_memory: bool = True, per_card: bool = False) -> TypicalMix:
        """Typical pods: shapes by decreasing weight until ``coverage`` of the total, renormalised.

        ``host_memory`` False merges shapes that differ only in host RAM (FGD's typical pods ignore it).
        ``per_card``: a shape of k > 1 cards weighs 1/k of its pods (``per_card_weights``), unless the
        mix by pods has ``mixed_models``: there it is kept as it is.
        """
        if not 0 < coverage <= 1:
            raise ValueError(f"coverage must be within (0, 1], got {coverage}")
        if per_card:
            by_pods = cls.from_weights(weights, coverage, host_memory)
            if by_pods.mixed_models:
                return by_pods
            weights = per_card_weights(weights)
        if not host_memory:
            merged: dict[Shape, float] = {}
            for (c, _, m, k, model), w in weights.items():
                merged[(c, 0, m, k, model)] = merged.get((c, 0, m, k, model), 0.0) + w
            weights = merged
        total = sum(weights.values())
        if total <= 0:
            return cls(())
        ranked = sorted(weights.items(), key=lambda kv: (-kv[1], _shape_order(kv[0])))
        chosen: list[tuple[Shape, float]] = []
        covered = 0.0
        for shape, w in ranked:
            if covered >= coverage * total * (1 - 1e-12):
                break
            chosen.append((shape, w))
            covered += w
        return cls(TypicalPod(c, m, k, w / covered, model, mem) for (c, mem, m, k, model), w in chosen)

    @classmethod
    def from_requests(cls, requests: Iterable[Request], coverage: float = DEFAULT_COVERAGE,
                      host_memory: bool = True) -> TypicalMix:
        """The typical mix of a whole workload known in advance (the FGD artifact's way)."""
        counts: dict[Shape, float] = {}
        for r in requests:
            s = shape_of(r)
            counts[s] = counts.get(s, 0.0) + 1.0
        return cls.from_weights(counts, coverage, host_memory)

    def host_rank(self, cpu_free: int | None, mem_free: int | None) -> tuple[int, int]:
        """How many of the mix's distinct CPU and RAM requests the free host meets (None: untracked, all)."""
        cpu = len(self._cpus) if cpu_free is None else bisect.bisect_right(self._cpus, cpu_free)
        mem = len(self._mems) if mem_free is None else bisect.bisect_right(self._mems, mem_free)
        return cpu, mem

    def _accepted(self, pattern: str | None, label: str) -> bool:
        key = (pattern, label)
        hit = self._accepts.get(key)
        if hit is None:
            hit = self._accepts[key] = model_accepts(pattern, label)
        return hit

    def fragment(self, cpu_free: int | None, mem_free: int | None, cards: Sequence[tuple[str, int]]) -> float:
        """F for a node with ``cpu_free`` millicores and ``mem_free`` MiB (None: not tracked) and
        ``cards`` as (model, free milli)."""
        cpu, mem = self.host_rank(cpu_free, mem_free)
        return self.fragment_at(cpu, mem, tuple(sorted(cards)))

    def fragment_at(self, cpu_rank: int, mem_rank: int, cards: tuple[tuple[str, int], ...]) -> float:
        """F for host ranks (``host_rank``) and sorted (model, free milli) pairs."""
        key = (cpu_rank, mem_rank, cards)
        value = self._memo.get(key)
        if value is not None:
            return value
        idle = 0
        for _, f in cards:
            idle += f
        total = self.total_weight * idle
        if idle:
            for u, pattern, entries in self._groups:
                fitting = usable = 0
                for model, f in cards:
                    if f >= u and (pattern is None or self._accepted(pattern, model)):
                        fitting += 1
                        usable += f
                if not usable:
                    continue
                for count, c, m, weight in entries:
                    if fitting >= count and c < cpu_rank and m < mem_rank:
                        total -= weight * usable
        if len(self._memo) > MEMO_LIMIT:
            self._memo.clear()
        self._memo[key] = total
        return total

    def describe(self) -> list[dict[str, object]]:
        return [{"cpu_milli": p.cpu_milli, "memory_mib": p.memory_mib, "milli": p.milli, "count": p.count,
                 "model": p.model, "weight": round(p.weight, 6)} for p in self.pods]


def _shape_order(shape: Shape) -> tuple[int, int, int, int, str]:
    """A total order on shapes for ties in weight: larger asks first (deterministic)."""
    cpu, mem, milli, count, model = shape
    return (-cpu, -milli, -count, -mem, model or "")


EMPTY_MIX = TypicalMix(())
