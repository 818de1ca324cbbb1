"""Whether the cluster is filling or churning, learnt from the claims that arrive and depart.

``gradient-fit`` packs by the fragment gradient while the cluster fills and by best fit once
departures keep pace with arrivals (``packing/policies/gradient_fit.py``). ``LoadPhase`` tells
the two apart from two decayed counts over events (an event: one claim arriving or one bound
claim departing):

    on each event:  a ← a · 2^(−1/h),  d ← d · 2^(−1/h),  then a ← a + 1 (arrival) or d ← d + 1 (departure)
    churning  ⇔  a > 0  and  d ≥ θ · a

with ``h`` the half-life in events (default 500) and ``θ`` the threshold (default 0.5). A stream
of arrivals only (FGD's protocol A, a new cluster filling up) never churns; a steady state, where
departures match arrivals (d ≈ a), churns whatever its load. A claim that leaves without having
been bound (withdrawn, a lapsed reservation, a rolled-back bind) is no departure: it freed
nothing that was placed for good. The phase is soft state: a restarted extender starts filling,
its adopted pods count as arrivals, and it churns again as their departures come in.

Invariants (``_check``): ``a, d ≥ 0``; ``churning`` is the formula above on the current counts;
``version`` counts the flips, so key caches drop their keys exactly when the phase changes.
O(1) per event. The defaults were chosen, not tuned: with ρ 0.85 in protocol B the ratio sits
near 1 in steady state, far from θ, and the phase flips a handful of times per run.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

DEFAULT_HALF_LIFE = 500.0  # events
DEFAULT_THRESHOLD = 0.5  # departures per arrival, decayed, at and above which the cluster churns


@dataclass
class LoadPhase:
    """Decayed arrival and departure counts and the phase they say (see the module docstring)."""

    half_life: float = DEFAULT_HALF_LIFE
    threshold: float = DEFAULT_THRESHOLD
    arrivals: float = field(default=0.0, init=False)
    departures: float = field(default=0.0, init=False)
    churning: bool = field(default=False, init=False)
    version: int = field(default=0, init=False)  # flips so far

    def __post_init__(self) -> None:
        if not (math.isfinite(self.half_life) and self.half_life > 0):
            raise ValueError(f"half-life must be a positive number of events, got {self.half_life}")
        if not (math.isfinite(self.threshold) and self.threshold > 0):
            raise ValueError(f"threshold must be a positive ratio of departures to arrivals, got {self.threshold}")
        self._decay = 2.0 ** (-1.0 / self.half_life)

    def arrive(self) -> None:
        """A claim arrived (the first time the scheduler sees it)."""
        self._step(1.0, 0.0)

    def depart(self) -> None:
        """A bound claim left (its pod finished or was deleted) and freed its slice."""
        self._step(0.0, 1.0)

    @property
    def ratio(self) -> float:
        """Decayed departures per decayed arrival (0 before the first arrival)."""
        return self.departures / self.arrivals if self.arrivals > 0 else 0.0

    def _step(self, arrival: float, departure: float) -> None:
        self.arrivals = self.arrivals * self._decay + arrival
        self.departures = self.departures * self._decay + departure
        churning = self.arrivals > 0 and self.departures >= self.threshold * self.arrivals
        if churning != self.churning:
            self.churning = churning
            self.version += 1

    def _check(self) -> None:
        assert self.arrivals >= 0 and self.departures >= 0
        assert self.churning == (self.arrivals > 0 and self.departures >= self.threshold * self.arrivals)
        assert self.version >= 0
