"""``gpuslice simulate`` / ``plan`` as a newcomer meets them: targets with units, an overloaded run said
to be one, output folders checked before the run, a real progress line, the pooled seeds named."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest

from simulations.cli import plan_main, simulate_main
from simulations.options import dash_values, parse_target
from simulations.sizing import smallest_cards

SMALL = ["--jobs", "300", "--cards", "16", "--seeds", "1"]


@pytest.mark.parametrize(("text", "seconds"), [("10m", 600), ("90s", 90), ("2h", 7200), ("1d", 86400),
                                               ("0.5h", 1800), ("0", 0)])
def test_a_target_with_its_unit(text: str, seconds: float) -> None:
    assert parse_target(text) == seconds


@pytest.mark.parametrize(("text", "said"), [
    ("10", "a wait target needs its unit: 10s, 10m or 10h"),
    ("-5m", "a wait target cannot be negative, got '-5m'"),
    ("-5", "a wait target cannot be negative"),
    ("1w", "a wait target looks like 90s, 10m, 2h or 1d, got '1w'"),
])
def test_a_bare_negative_or_unknown_target_is_refused(text: str, said: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError, match=re.escape(said)):
        parse_target(text)


@pytest.mark.parametrize("argv", [["--target", "-5m"], ["--target=-5m"], ["--target", "10"], ["--age-limit", "-1h"]])
def test_plan_explains_a_bad_target_in_one_line(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        plan_main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert "expected one argument" not in err and ("needs its unit" in err or "cannot be negative" in err), err


def test_dash_values_joins_only_duration_flags_followed_by_a_negative() -> None:
    assert dash_values(["--target", "-5m", "--rho", "-1", "--sla", "2h", "--target"]) == \
        ["--target=-5m", "--rho", "-1", "--sla", "2h", "--target"]


def test_an_overloaded_run_says_so_and_shows_the_line_growing(capsys: pytest.CaptureFixture[str]) -> None:
    assert simulate_main([*SMALL, "--rho", "1.5"]) == 0
    out = capsys.readouterr().out
    m = re.search(r"overloaded: ρ ([\d.]+) >= 1, .* \(mean wait ([\d.]+) min for the first fifth of arrivals, "
                  r"([\d.]+) min for the last\)", out)
    assert m is not None, out
    assert float(m.group(1)) > 1 and float(m.group(3)) > float(m.group(2))  # the line grew while jobs arrived
    assert "no steady state" in out
    assert simulate_main([*SMALL, "--rho", "0.5"]) == 0
    assert "overloaded" not in capsys.readouterr().out


def test_the_header_says_per_seed_and_the_all_row_says_pooled(capsys: pytest.CaptureFixture[str]) -> None:
    assert simulate_main(["--jobs", "200", "--cards", "16", "--seeds", "1-2"]) == 0
    out = capsys.readouterr().out
    assert "built-in synthetic (200 jobs per seed)" in out
    assert "jobs and p50..max pooled over 2 runs" in out
    (row,) = [line.split() for line in out.splitlines() if line.strip().startswith("all ")]
    assert row[:2] == ["all", "400"]


def test_unwritable_outputs_are_refused_before_the_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    for argv, said in (
        (["--plots", str(blocker / "plots")],
         f"cannot write the plots (--plots) into {blocker / 'plots'}: {blocker} is a file"),
        (["--out", str(blocker)],
         f"cannot write the results (--out) into {blocker}: {blocker} is a file, not a folder"),
        (["--json", str(tmp_path)], f"cannot write the results (--json) to {tmp_path}: it is a folder"),
        (["--csv", str(blocker / "r.csv")],
         f"cannot write the results table (--csv) into {blocker}: {blocker} is a file"),
        (["--plots", "/proc/gpuslice-plots"], "cannot write the plots (--plots) into /proc/gpuslice-plots: "),
        (["--placements", str(blocker / "p.csv")], f"cannot write the placements (--placements) into {blocker}: "),
    ):
        assert simulate_main([*SMALL, *argv]) == 2
        out, err = capsys.readouterr()
        assert out == "" and said in err and "Traceback" not in err, (argv, err)  # no results: it did not run
    assert plan_main(["--jobs", "100", "--seeds", "1", "--plot", str(blocker / "p.png")]) == 2
    assert f"cannot write the plot (--plot) into {blocker}" in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file"]  # nothing left behind


def test_plan_progress_is_one_finished_line_per_card_count(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plan.json"
    code = plan_main(["--jobs", "400", "--ref-cards", "16", "--target", "5m", "--seeds", "1", "--progress",
                      "--json", str(out)])
    assert code == 0
    lines = [line.rsplit("\r", 1)[-1] for line in capsys.readouterr().err.split("\n") if line]  # as a terminal shows
    curve = json.loads(out.read_text())["curve"]
    assert len(lines) == len(curve)  # one line per measured card count
    runs = [re.match(r"plan: (\d+) cards, run (\d+)(?: of at most (\d+)| \(bracketing\)) \[#+\] 100\.0%", line)
            for line in lines]
    assert all(runs), lines
    assert [int(m.group(2)) for m in runs if m] == list(range(1, len(curve) + 1))
    assert sorted(int(m.group(1)) for m in runs if m) == [p["cards"] for p in curve]
    assert all(int(m.group(3)) >= len(curve) for m in runs if m and m.group(3))  # the bound held


def test_plan_says_when_the_work_needs_more_than_max_cards(capsys: pytest.CaptureFixture[str]) -> None:
    assert plan_main(["--jobs", "200", "--seeds", "1", "--max-cards", "2"]) == 2
    err = capsys.readouterr().err
    assert re.search(r"the offered work needs at least \d+ cards, above --max-cards 2", err), err


def test_bisection_announces_each_count_with_a_bound_that_holds() -> None:
    told: list[tuple[int, int, int | None]] = []
    sizing = smallest_cards(lambda n: 1000.0 / n, 10.0, 5, 1000, on_point=lambda n, k, m: told.append((n, k, m)))
    assert [n for n, _, _ in told] == list(sizing.points)  # told before each, in order, once each
    assert [k for _, k, _ in told] == list(range(1, len(told) + 1))
    bounded = [m for _, _, m in told if m is not None]
    assert bounded and all(m >= len(told) for m in bounded) and bounded == sorted(bounded, reverse=True)
