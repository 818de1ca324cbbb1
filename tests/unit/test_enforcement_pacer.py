"""The share pacer's pieces: water-filling, parameters, and its decision rules in isolation."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from enforcement.pacer import GpuPacer, Member, PacerParams, waterfill

T0 = 1_700_000_000.0


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.floats(0.01, 1.0), st.floats(0.0, 1.0)),
        min_size=1,
        max_size=5,
    ),
    st.floats(0.1, 1.0),
)
def test_waterfill_respects_caps_and_shares_the_rest_by_weight(pairs: list[tuple[float, float]], total: float) -> None:
    weights = {i: w for i, (w, _) in enumerate(pairs)}
    caps = {i: c for i, (_, c) in enumerate(pairs)}
    alloc = waterfill(weights, caps, total)
    assert sum(alloc.values()) == pytest.approx(min(total, sum(caps.values())), abs=1e-9)
    for i in alloc:
        assert -1e-12 <= alloc[i] <= caps[i] + 1e-12
    uncapped = [i for i in alloc if alloc[i] < caps[i] - 1e-9]
    # Anyone below its cap gets at least its weighted part of what the capped ones left.
    for i in uncapped:
        for j in alloc:
            assert alloc[i] / weights[i] >= min(alloc[j], caps[j]) / weights[j] - 1e-9


def test_waterfill_example() -> None:
    assert waterfill({"a": 0.5, "b": 0.25, "c": 0.25}, {"a": 1.0, "b": 1.0, "c": 0.1}) == pytest.approx(
        {"a": 0.6, "b": 0.3, "c": 0.1}
    )


@pytest.mark.parametrize(
    "kwargs",
    [
        {"slot_s": 0.0},
        {"slot_s": 0.5, "period_s": 0.4},
        {"max_freeze_s": 0.05},
        {"max_freeze_s": 1.0},
        {"burst_s": 0.0},
        {"margin": 1.5},
        {"active_window_s": 0.2},
        {"waste_memory_s": 0.0},
        {"waste_share": 0.0},
        {"waste_share": 1.0},
    ],
)
def test_bad_parameters_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        PacerParams(**kwargs)


def drive(
    pacer: GpuPacer[str],
    members: dict[str, Member],
    use: dict[str, float],
    seconds: float,
    start: float = T0,
    gpu_busy: float | None = None,
) -> list[frozenset[str]]:
    """Step the pacer: each slot every thawed holder uses its rate of the slot (a crude GPU).

    Before each decision the pacer polls the GPU's busy fraction: ``gpu_busy`` if given, else the
    last slot's (what the crude GPU really did).
    """
    p = pacer.params
    decisions = []
    t, last_busy = start, 0.0
    while t < start + seconds - 1e-9:
        pacer.observe_busy(t, last_busy if gpu_busy is None else gpu_busy)
        frozen = pacer.decide(t, members)
        decisions.append(frozen)
        running = {k: r for k, r in use.items() if k not in frozen}
        total = sum(running.values()) or 1.0
        pacer.observe(t, t + p.slot_s, {k: r / max(total, 1.0) * p.slot_s for k, r in running.items()})
        last_busy = min(1.0, sum(running.values()))
        t += p.slot_s
    return decisions


def test_a_lone_busy_holder_is_never_frozen() -> None:
    pacer: GpuPacer[str] = GpuPacer(PacerParams(grace_s=0))
    decisions = drive(pacer, {"a": Member(250), "b": Member(250)}, {"a": 1.0}, 10)
    assert all(d == frozenset() for d in decisions)


def test_contention_is_paced_and_no_freeze_outlasts_the_bound() -> None:
    params = PacerParams(grace_s=0)
    pacer: GpuPacer[str] = GpuPacer(params)
    decisions = drive(pacer, {"a": Member(500), "b": Member(250)}, {"a": 1.0, "b": 1.0}, 30)
    assert any("b" in d for d in decisions)
    run = longest = 0
    for d in decisions:
        run = run + 1 if "b" in d else 0
        longest = max(longest, run)
    assert longest * params.slot_s <= params.max_freeze_s + 1e-9
    assert all(len(d) < 2 for d in decisions)  # never everyone at once: the GPU is not idled


def test_grace_and_unpaced_holders_are_left_alone() -> None:
    pacer: GpuPacer[str] = GpuPacer(PacerParams(grace_s=5))
    decisions = drive(pacer, {"a": Member(500), "b": Member(250)}, {"a": 1.0, "b": 1.0}, 4.5)
    assert all(d == frozenset() for d in decisions)
    gang: GpuPacer[str] = GpuPacer(PacerParams(grace_s=0))
    decisions = drive(gang, {"a": Member(1000, paced=False), "b": Member(250)}, {"a": 1.0, "b": 1.0}, 10)
    assert all(d == frozenset() for d in decisions)


def test_fail_open_thaws_everyone() -> None:
    pacer: GpuPacer[str] = GpuPacer(PacerParams(grace_s=0))
    members = {"a": Member(500), "b": Member(250)}
    drive(pacer, members, {"a": 1.0, "b": 1.0}, 10)
    assert pacer.fail_open(T0 + 10, members) == frozenset()
    assert not any(v.frozen for v in pacer.views(T0 + 10).values())


def test_contexts_count_in_the_demand_test() -> None:
    """Two contexts get two native slices: a one-context holder beside them is not 'limited'."""
    pacer: GpuPacer[str] = GpuPacer(PacerParams(grace_s=0))
    members = {"a": Member(500, contexts=1), "b": Member(500, contexts=2)}
    for i in range(30):
        t = T0 + i * 0.1
        pacer.decide(t, members)
        pacer.observe(t, t + 0.1, {"a": 0.1 / 3, "b": 0.2 / 3})
    assert not pacer.holders["a"].limited


def test_freezes_that_idle_the_gpu_thaw_one_more_until_the_idle_leaks_away() -> None:
    """Work conservation when a fill is overestimated: GPU idle while someone is frozen thaws one more."""
    params = PacerParams(grace_s=0, freeze_idle_s=100.0)  # the rule alone: no idle proves a demand here
    pacer: GpuPacer[str] = GpuPacer(params)
    members, use = {"a": Member(500), "b": Member(250)}, {"a": 1.0, "b": 1.0}
    assert any(drive(pacer, members, use, 10))  # paced: someone frozen, the GPU busy throughout
    assert pacer.waste == 0.0
    # The GPU reads half idle beside the freezes: the thawed holder could not fill it after all.
    decisions = drive(pacer, members, use, 1.0, start=T0 + 10, gpu_busy=0.5)
    assert pacer.wasting
    assert decisions[-1] == frozenset()
    # Busy again: the idle leaks away (waste_memory_s) and pacing resumes.
    decisions = drive(pacer, members, use, 3 * params.waste_memory_s, start=T0 + 11)
    assert not pacer.wasting
    assert any(decisions[-20:])
