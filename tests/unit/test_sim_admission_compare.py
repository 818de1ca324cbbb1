"""``gpuslice simulate --compare-admission``: admission settings on the command line, the labelled
table (pooled p99 beside the mean of per-seed p99 and its 95 % interval), the runtime-cap line and
the frontier plot."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from simulations.cli import simulate_main
from simulations.options import UsageError, parse_admission
from simulations.protocol_b import SeedSpread, t975
from simulations.report import product_order, runtime_cap_text


def test_admission_settings_parse_into_a_choice() -> None:
    c = parse_admission("drain-soonest:heads=16:v100-100=0:T=4h:horizon=10m")
    assert (c.name, c.max_drain_targets, c.age_limit_s, c.drain_horizon_s) == ("drain-soonest", 16, 14400.0, 600.0)
    assert c.age_limits == (("v100-100", 0.0),) and c.label == "drain-soonest:heads=16:v100-100=0:T=4h:horizon=10m"
    assert parse_admission("best-effort-fifo").age_limits == ()
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
    assert "--saturation goes with --compare-admission" in capsys.readouterr().err
