"""``LoadPhase``: filling while arrivals dominate, churning once decayed departures reach θ × decayed arrivals."""

from __future__ import annotations

import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packing.load_phase import DEFAULT_THRESHOLD, LoadPhase
from packing.policies import policy_for


def run(phase: LoadPhase, events: str) -> list[bool]:
    """Feed ``events`` ('a' arrival, 'd' departure); the phase after each, checked."""
    out = []
    for e in events:
        phase.arrive() if e == "a" else phase.depart()
        phase._check()
        out.append(phase.churning)
    return out


@pytest.mark.parametrize(("events", "churning", "flips"), [
    ("", False, 0),
    ("aaaaaaaaaa", False, 0),  # FGD's protocol A: no departure, ever
    ("d", False, 0),  # a departure before any arrival (a restart adopting running pods): no arrivals to weigh
    ("ad", True, 1),  # d = 1 ≥ 0.5 · 2^(−1/500)
    ("aad", True, 1),  # d = 1 ≥ 0.5 · (1 + 2^(−1/500)) · 2^(−1/500) ≈ 0.998
    ("aaad", False, 0),  # d = 1 < 0.5 · (about 3)
    ("ad" + "a" * 5, False, 2),  # the arrivals outrun the one departure again
])
def test_the_phase_after_a_stream(events: str, churning: bool, flips: int) -> None:
    phase = LoadPhase()
    run(phase, events)
    assert (phase.churning, phase.version) == (churning, flips)


def test_old_events_fade_with_the_half_life() -> None:
    phase = LoadPhase(half_life=10)
    run(phase, "a" * 20 + "d" * 10)
    # 20 arrivals then 10 departures: a ≈ Σ_{k=10}^{29} 2^(−k/10), d ≈ Σ_{k=0}^{9} 2^(−k/10)
    a = sum(2 ** (-k / 10) for k in range(10, 30))
    d = sum(2 ** (-k / 10) for k in range(10))
    assert phase.arrivals == pytest.approx(a) and phase.departures == pytest.approx(d)
    assert phase.churning == (d >= DEFAULT_THRESHOLD * a)


def test_a_long_stream_of_departures_stays_finite() -> None:
    phase = LoadPhase(half_life=1)
    run(phase, "a" + "d" * 2000)
    assert phase.arrivals == 0.0 and not phase.churning and phase.ratio == 0.0


@pytest.mark.parametrize("bad", [{"half_life": 0}, {"half_life": float("inf")}, {"threshold": 0},
                                 {"threshold": float("nan")}])
def test_bad_settings_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        LoadPhase(**bad)


@settings(max_examples=60, deadline=None)
@given(p=st.floats(0.0, 0.9), seed=st.integers(0, 10_000))
def test_a_stationary_stream_settles_on_its_phase(p: float, seed: int) -> None:
    # each event a departure with probability p: d / a tends to p / (1 − p)
    ratio = p / (1 - p)
    if abs(ratio - DEFAULT_THRESHOLD) < 0.25:
        return  # too near the threshold to settle within the stream
    rng = random.Random(seed)
    phase = LoadPhase(half_life=200)
    seen = run(phase, "".join("d" if rng.random() < p else "a" for _ in range(4000)))
    assert all(c == (ratio >= DEFAULT_THRESHOLD) for c in seen[-1000:])


@settings(max_examples=100, deadline=None)
@given(events=st.text(alphabet="ad", max_size=300))
def test_the_version_counts_every_flip(events: str) -> None:
    phase = LoadPhase(half_life=20)
    seen = [False, *run(phase, events)]
    assert phase.version == sum(1 for x, y in itertools.pairwise(seen) if x != y)


def test_the_default_policy_reads_a_phase_of_its_own_and_its_keys_follow_it() -> None:
    a, b = policy_for("gradient-fit"), policy_for("gradient-fit")
    assert a.context.phase is not None and a.context.phase is not b.context.phase
    version = a.key_version
    a.context.phase.arrive()
    a.observe_departure()
    assert a.context.churning and a.key_version != version and not b.context.churning
    assert policy_for("best-fit").context.phase is None and policy_for("fgd").context.phase is None
