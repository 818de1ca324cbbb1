"""``gpuslice simulate --compare-admission``: admission settings on the command line, the labelled
table (pooled p99 beside the mean of per-seed p99 and its 95 % interval), the runtime-cap line, the
frontier plot, the fairness verdict against best effort, and several loads in one command."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import pytest

from packing.products import load_catalog
from packing.queue import WorstFirstSettings
from simulations import fairness
from simulations.cli import plan_main, simulate_main
from simulations.metrics import product_order
from simulations.options import UsageError, parse_admission, parse_rhos
from simulations.protocol_b import SeedSpread, t975
from simulations.report import runtime_cap_text, verdict_text


def test_admission_settings_parse_into_a_choice() -> None:
    c = parse_admission("drain-soonest:heads=16:v100-100=0:T=4h:horizon=10m")
    assert (c.name, c.max_drain_targets, c.age_limit_s, c.drain_horizon_s) == ("drain-soonest", 16, 14400.0, 600.0)
    assert c.age_limits == (("v100-100", 0.0),) and c.label == "drain-soonest:heads=16:v100-100=0:T=4h:horizon=10m"
    assert parse_admission("best-effort-fifo").age_limits == ()
    w = parse_admission("worst-first:clock=8h:share=8:ahead.v100-25=15m:ahead.v100-50=-1h:ahead.v100-100x4=30m")
    assert w.worst_first == WorstFirstSettings(hold_clock=28800.0, hold_share=8)  # the others at their defaults
    assert w.head_starts == (("v100-25", 900.0), ("v100-50", -3600.0), ("v100-100x4", 1800.0))
    assert parse_admission("best-effort-fifo:ahead.v100-50=0").head_starts == (("v100-50", 0.0),)
    assert parse_admission("worst-first:clock=never").worst_first == WorstFirstSettings(hold_clock=math.inf)
    assert parse_admission("worst-first:within=0.5").worst_first == WorstFirstSettings(hold_within=0.5)
    assert parse_admission("worst-first:within=off").worst_first == WorstFirstSettings(hold_within=math.inf)
    assert parse_admission("worst-first:front=4").worst_first == WorstFirstSettings(front_share=4)
    assert parse_admission("worst-first:idle=off").worst_first == WorstFirstSettings(hold_idle=math.inf)
    assert parse_admission("worst-first:worst=on").worst_first == WorstFirstSettings(front_worst=True)
    assert parse_admission("worst-first:worst=off").worst_first == WorstFirstSettings()
    assert parse_admission("worst-first:single=sure").worst_first == WorstFirstSettings()  # the default
    assert parse_admission("worst-first:single=own").worst_first == WorstFirstSettings(single_front="own")
    assert parse_admission("worst-first:single=share").worst_first == WorstFirstSettings(single_front="share")
    assert parse_admission("worst-first").worst_first is None  # None: worst-first's defaults
    for bad, says in [("nope", "unknown admission policy"), ("drain-soonest:heads", "must look like key=value"),
                      ("drain-soonest:heads=0", "whole number >= 1"), ("aging-guard:T=soon", "duration")]:
        with pytest.raises(UsageError, match=says):
            parse_admission(bad)


def test_per_seed_spread_has_a_t_interval() -> None:
    s = SeedSpread((10.0, 12.0, 14.0))
    assert s.mean == 12.0
    assert s.half_width == pytest.approx(t975(2) * 2.0 / math.sqrt(3))
    assert math.isnan(SeedSpread((5.0,)).half_width)
    assert t975(9) == 2.262 and t975(35) == 2.042 and t975(500) == 1.960
    with pytest.raises(ValueError):
        t975(0)


def test_products_sort_by_cards_then_size() -> None:
    names = ["v100-100x2", "v100-100", "v100-25", "share", "v100-50"]
    assert sorted(names, key=product_order) == ["v100-25", "v100-50", "v100-100", "v100-100x2", "share"]


def test_the_runtime_cap_line_names_what_it_counts() -> None:
    cap = {"runtime_cap_s": 172800.0, "capped_jobs": 30, "jobs": 5891, "capped_pct": 0.51,
           "gpu_time_removed_pct": 75.83, "dropped_never_ran": 1173, "simulated_jobs": 90000,
           "simulated_at_cap": 459}
    text = runtime_cap_text(cap)
    assert "30 of the 5891 jobs in the trace's pool (0.51 %) ran longer and were cut" in text
    assert "459 of the 90000 jobs simulated (all seeds, 0.51 %) run at the cap" in text


def test_compare_admission_prints_the_labelled_table_and_draws_the_frontier(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = simulate_main(["--jobs", "600", "--cards", "16", "--seeds", "1-3", "--compare-admission",
                          "--admission", "best-effort-fifo,drain-soonest:heads=4", "--saturation", "1.1",
                          "--out", str(tmp_path / "c")])
    assert code == 0
    out = capsys.readouterr().out
    assert "p99 per seed: mean [95 % CI]" in out and "p50..max pooled over 3 runs" in out
    assert "admission comparison:" in out and "usable % at ρ 1.1" in out
    table = out[out.index("admission comparison:"):]
    assert "best-effort-fifo" in table and "drain-soonest:heads=4" in table
    data = json.loads((tmp_path / "c" / "results.json").read_text())
    runs = {r["admission"]: r for r in data["runs"]}
    spread = runs["best-effort-fifo"]["per_seed_p99"]["v100-100"]
    assert len(spread["per_seed"]) == 3 and spread["mean"] == pytest.approx(sum(spread["per_seed"]) / 3)
    assert 0 < runs["drain-soonest:heads=4"]["saturation"]["utilisation_pct"] <= 100
    assert (tmp_path / "c" / "frontier.png").stat().st_size > 1000


def test_saturation_needs_compare_admission(capsys: pytest.CaptureFixture[str]) -> None:
    assert simulate_main(["--jobs", "50", "--seeds", "1", "--saturation", "1.1"]) == 2
    err = capsys.readouterr().err
    assert "--saturation measures the usable capacity" in err and "add --compare-admission" in err
    assert len(err.strip().splitlines()) == 2  # the one line and the hint to --help


def run_figures(p99_min: dict[str, float], max_min: float, util: float) -> dict[str, object]:
    """A run as simulations.cli keeps it: per product the per-seed p99 mean, the longest wait, utilisation."""
    return {"waits": {**{p: {"p99_s": 60 * v} for p, v in p99_min.items()}, "all": {"p99_s": 0.0}},
            "per_seed_p99": {p: {"mean": 60 * v} for p, v in p99_min.items()},
            "max_wait_s": 60 * max_min, "utilisation_pct": util}


@pytest.mark.parametrize(("mine", "goal", "failures"), [
    # best effort: quarter 2, half 20, whole 100 min; max 200; utilisation 83.0
    ({"v100-25": 5.0, "v100-50": 25.0, "v100-100": 80.0}, 0.8, []),  # 0.80: met, nobody above 1.25 x + 5
    ({"v100-25": 5.0, "v100-50": 31.0, "v100-100": 70.0}, 0.8, ["sacrificed v100-50"]),  # 31 > 1.25 x 20 + 5
    ({"v100-25": 2.0, "v100-50": 20.0, "v100-100": 90.0}, 0.8, ["minimax 0.90 > 0.8"]),
])
def test_the_verdict_judges_a_run_against_best_effort(mine: dict[str, float], goal: float,
                                                       failures: list[str]) -> None:
    catalog = load_catalog()
    reference = run_figures({"v100-25": 2.0, "v100-50": 20.0, "v100-100": 100.0}, 200.0, 83.0)
    v = fairness.verdict(run_figures(mine, 150.0, 82.8), reference, catalog)
    assert v.goal_ratio == goal and v.worst_product == max(mine, key=lambda p: mine[p])
    assert v.failures == failures
    slow = fairness.verdict(run_figures(mine, 201.0, 82.0), reference, catalog, {"utilisation_pct": 90.0},
                            {"utilisation_pct": 91.5})
    assert "max wait" in slow.failures and "utilisation -1.00" in slow.failures and "usable -1.50" in slow.failures


def seeds_of(per_seed_min: dict[str, list[float]]) -> dict[str, object]:
    """A run with per-seed p99 figures (minutes) for each product."""
    spread = {p: {"per_seed": [60 * v for v in vs], "mean": 60 * sum(vs) / len(vs)} for p, vs in per_seed_min.items()}
    return {"waits": {**{p: {"p99_s": d["mean"]} for p, d in spread.items()}, "all": {"p99_s": 0.0}},
            "per_seed_p99": spread, "max_wait_s": 600.0, "utilisation_pct": 80.0}


@pytest.mark.parametrize(("mine", "interval"), [
    # best effort's whole cards per seed 100, 60, 140 (mean 100): seed noise the pairing cancels
    ([80.0, 40.0, 120.0], (0.80, 0.80)),  # 20 min less on every seed: no spread, 0.80 exactly
    ([90.0, 40.0, 130.0], (0.72, 1.01)),  # d = -10, -20, -10: mean -13.3, sd 5.77, t(2) 4.303: 0.867 +- 0.143
])
def test_the_ratio_has_an_interval_paired_over_seeds(mine: list[float], interval: tuple[float, float]) -> None:
    catalog = load_catalog()
    reference = seeds_of({"v100-25": [1.0, 1.0, 1.0], "v100-100": [100.0, 60.0, 140.0]})
    v = fairness.verdict(seeds_of({"v100-25": [1.0, 1.0, 1.0], "v100-100": mine}), reference, catalog)
    assert v.ratio_ci95 is not None and v.ratio_ci95 == pytest.approx(interval, abs=0.005)
    assert v.ratio_ci95[0] <= v.ratio <= v.ratio_ci95[1]
    assert fairness.verdict(run_figures({"v100-100": 80.0}, 1.0, 80.0), run_figures({"v100-100": 100.0}, 1.0, 80.0),
                            catalog).ratio_ci95 is None  # one seed, no per-seed figures: no interval


def longest_of(per_seed_min: list[float]) -> dict[str, object]:
    """A run whose seeds' longest waits are ``per_seed_min`` (minutes); the pooled longest is their largest."""
    return {**seeds_of({"v100-100": [100.0] * len(per_seed_min)}), "max_wait_s": 60 * max(per_seed_min),
            "per_seed_max_wait_s": [60 * v for v in per_seed_min]}


@pytest.mark.parametrize(("mine", "mean", "interval", "longer"), [
    # best effort's longest per seed 100, 60, 140 min (mean 100)
    ([90.0, 40.0, 130.0], 86.67, (-27.68, 1.01), 0),  # d = -10, -20, -10: -13.33 +- 4.303 x 5.77 / sqrt 3
    ([150.0, 40.0, 120.0], 103.33, (-97.07, 103.74), 1),  # one seed longer, so the pooled max: 150 > 140
])
def test_the_longest_wait_is_also_paired_seed_by_seed(mine: list[float], mean: float,
                                                      interval: tuple[float, float], longer: int) -> None:
    """The goal's longest wait is the pooled one (the largest of the seeds', one seed decides it); the verdict
    keeps each seed's against best effort's beside it, not judged, and the report prints it."""
    catalog = load_catalog()
    reference = longest_of([100.0, 60.0, 140.0])
    v = fairness.verdict(longest_of(mine), reference, catalog)
    s = v.longest_per_seed
    assert s is not None and s.seeds == 3 and s.longer_seeds == longer
    assert s.mean_s / 60 == pytest.approx(mean, abs=0.01) and s.reference_mean_s == 6000.0
    assert (s.diff_ci95_s[0] / 60, s.diff_ci95_s[1] / 60) == pytest.approx(interval, abs=0.01)
    assert ("max wait" in v.failures) == (max(mine) > 140.0)
    assert f"on average, paired -{-s.diff_ci95_s[0] / 60:.1f}.." in verdict_text(v)
    assert fairness.verdict(longest_of([90.0]), longest_of([100.0]), catalog).longest_per_seed is None  # one seed
    assert fairness.verdict(seeds_of({"v100-100": [1.0, 2.0]}), reference, catalog).longest_per_seed is None


def test_the_goal_is_sharp_only_where_best_efforts_worst_needs_whole_cards() -> None:
    catalog = load_catalog()
    assert fairness.whole_cards("v100-100", catalog) and fairness.whole_cards("v100-100x4", catalog)
    assert fairness.whole_cards("whole", catalog) and not fairness.whole_cards("share", catalog)
    assert not fairness.whole_cards("v100-50", catalog) and not fairness.whole_cards("v100-25x1", catalog)
    halves_worst = run_figures({"v100-25": 2.0, "v100-50": 100.0, "v100-100": 50.0}, 200.0, 80.0)
    v = fairness.verdict(halves_worst, halves_worst, catalog)
    assert v.goal_ratio == 1.0 and v.ratio == 1.0 and v.failures == []
    assert fairness.limit_s(600.0) == 1.25 * 600.0 + 300.0


def test_minimax_is_not_judged_where_best_effort_hardly_waits() -> None:
    """Under 5 min (the goal's own slack) there is no tail to cut: 0.1 against 0.1 min is no failure, but a
    sacrificed product or a longer longest wait still is."""
    catalog = load_catalog()
    reference = run_figures({"v100-25": 0.0, "v100-50": 0.0, "v100-100": 0.1}, 13.9, 67.9)
    same = fairness.verdict(run_figures({"v100-25": 0.0, "v100-50": 0.0, "v100-100": 0.1}, 13.9, 67.9), reference,
                            catalog)
    assert same.ratio == pytest.approx(1.0) and not same.minimax_judged and same.failures == []
    worse = fairness.verdict(run_figures({"v100-25": 0.0, "v100-50": 6.0, "v100-100": 0.2}, 18.1, 67.9), reference,
                             catalog)
    assert worse.failures == ["sacrificed v100-50", "max wait"]
    judged = fairness.verdict(run_figures({"v100-25": 0.0, "v100-50": 0.0, "v100-100": 5.0}, 10.0, 67.9),
                              run_figures({"v100-25": 0.0, "v100-50": 0.0, "v100-100": 5.0}, 13.9, 67.9), catalog)
    assert judged.minimax_judged and judged.failures == ["minimax 1.00 > 0.8"]


def test_several_loads_run_in_one_command_with_a_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = simulate_main(["--jobs", "300", "--cards", "16", "--seeds", "1-2", "--rho", "0.7,0.9",
                          "--compare-admission", "--admission", "worst-first", "--json", str(tmp_path / "r.json")])
    assert code == 0
    out = capsys.readouterr().out
    assert out.count("admission comparison:") == 2 and "==== built-in synthetic" in out
    summary = out[out.index("fairness summary"):]
    assert summary.count("best-effort-fifo") == 2 and summary.count("worst-first") == 2  # the reference added
    assert "x best effort's worst" in out and "x best effort's worst (95 % interval paired over seeds " in out
    data = json.loads((tmp_path / "r.json").read_text())
    assert [round(d["runs"][0]["offered_load"], 1) for d in data["sweep"]] == [0.7, 0.9]
    assert {r["admission"] for r in data["sweep"][0]["runs"]} == {"best-effort-fifo", "worst-first"}


def test_several_loads_are_one_too_many_for_plan_and_placements(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert plan_main(["--jobs", "100", "--rho", "0.7,0.9", "--seeds", "1"]) == 2
    assert "--rho gives several offered loads, and plan sizes the cluster for one at a time" in capsys.readouterr().err
    assert simulate_main(["--jobs", "100", "--rho", "0.7,0.9", "--seeds", "1", "--placements", "p.csv"]) == 2
    assert "--placements writes one run's placements" in capsys.readouterr().err
    pods = [tmp_path / f"openb_pod_list_{m}.csv" for m in ("a", "b")]
    for p in pods:
        p.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n")
    assert plan_main(["--pods", ",".join(map(str, pods)), "--seeds", "1"]) == 2
    assert "--pods names several pod lists, and plan sizes one workload at a time" in capsys.readouterr().err
    assert plan_main(["--pods", str(tmp_path), "--seeds", "1"]) == 2  # a folder of two
    assert "--pods names several pod lists" in capsys.readouterr().err
    assert parse_rhos("0.7, 0.85,none") == (0.7, 0.85, None)
    with pytest.raises(argparse.ArgumentTypeError):
        parse_rhos("0.7,-1")


@pytest.mark.parametrize(("halves", "margin", "text"), [
    # best effort's halves per seed 20, 10, 30 min: limits 30, 17.5, 42.5 (mean 30)
    ([33.0, 20.5, 45.5], (3.0, 3.0), "v100-50 +3.0 min, paired +3.0..+3.0)"),  # 3 min past on every seed
    # d = 10, -7.5, 7.5: mean 3.33, sd 9.46, t(2) 4.303: 3.33 -+ 23.51
    ([40.0, 10.0, 50.0], (-20.18, 26.85), "v100-50 +3.3 min, paired -20.2..+26.8 (within seed noise))"),
])
def test_a_sacrificed_products_margin_is_paired_over_seeds(halves: list[float], margin: tuple[float, float],
                                                          text: str) -> None:
    """The flag judges the mean of per-seed p99s; the margin past the limit, paired, says whether seed noise could
    explain it (not judged)."""
    catalog = load_catalog()
    reference = seeds_of({"v100-50": [20.0, 10.0, 30.0], "v100-100": [100.0, 100.0, 100.0]})
    v = fairness.verdict(seeds_of({"v100-50": halves, "v100-100": [70.0, 70.0, 70.0]}), reference, catalog)
    assert v.sacrificed == ("v100-50",) and v.failures == ["sacrificed v100-50"]
    [(product, ci)] = v.past_limit
    assert product == "v100-50" and ci is not None
    assert (ci[0] / 60, ci[1] / 60) == pytest.approx(margin, abs=0.05)
    assert verdict_text(v).endswith("missed: sacrificed v100-50 (past the limit by: " + text)
    met = fairness.verdict(seeds_of({"v100-50": [20.0, 10.0, 30.0], "v100-100": [70.0, 70.0, 70.0]}), reference,
                           catalog)
    assert met.past_limit == () and "past the limit" not in verdict_text(met)
