"""The multi-card frontier of the fairness bench: its orders, labels, the largest product and the verdicts."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from packing.products import load_catalog
from tests.bench import bench_fairness
from tests.bench.frontier_multi_card import FIFO, largest, multi_card_orders, multi_label, verdict

MIN = 60.0
inf = math.inf


def test_the_grid_starts_with_first_in_first_out_once() -> None:
    orders = multi_card_orders([0, 60], [inf, 0])
    assert orders == [FIFO, (0.0, 0.0), (3600.0, inf), (3600.0, 0.0)]
    assert [multi_label(o) for o in orders] == ["a 0 hold ∞", "a 0 hold 0", "a 60 hold ∞", "a 60 hold 0"]
    assert multi_card_orders([inf], [240]) == [FIFO, (inf, 14400.0)]
    assert multi_label((inf, 14400.0)) == "a ∞ hold 240"


def test_the_largest_product_is_the_one_asking_most_cards() -> None:
    catalog = load_catalog()
    reqs = [catalog.request("v100-25"), catalog.request("v100-100", count=4), catalog.request("v100-100", count=2)]
    assert largest(reqs) == "v100-100x4"


# the relaxation's FIFO: quarters 10 min, 8-card jobs 100; limits 17.5 and 130 min
ROWS = {
    FIFO: {"v100-25": 10 * MIN, "v100-100x8": 100 * MIN},
    (inf, 0.0): {"v100-25": 90 * MIN, "v100-100x8": 40 * MIN},  # quarters pay
    (3600.0, inf): {"v100-25": 15 * MIN, "v100-100x8": 85 * MIN},  # the best fair order: 0.85 x
}


def test_the_verdict_names_the_best_fair_order_and_whether_it_reaches_0_8() -> None:
    own = verdict(ROWS, ROWS[FIFO], "its own")
    assert "a 60 hold ∞, v100-100x8 85.0 = 0.85 x; 0.8 x is 80.0: NOT reached" in own
    closer = {**ROWS, (60.0, inf): {"v100-25": 17 * MIN, "v100-100x8": 79 * MIN}}
    assert "a 1 hold ∞, v100-100x8 79.0 = 0.79 x; 0.8 x is 80.0: reached" in verdict(closer, ROWS[FIFO], "its own")
    strict = {"v100-25": 1 * MIN, "v100-100x8": 100 * MIN}  # limits 6.25 and 130: every order sacrifices
    assert verdict(ROWS, strict, "real") == "  against real: every order sacrifices a product"


def write_traces(root: Path) -> Path:
    """A tiny multigpu50 and the default trace it borrows runtimes from (openb's columns)."""
    folder = root / "alibaba-openb"
    folder.mkdir()
    sizes = [(1, 250), (1, 500), (1, 1000), (2, 1000), (4, 1000), (8, 1000)]
    rows = [f"openb-pod-{i:04d},4000,8192,{n},{m}" for i, (n, m) in enumerate(sizes * 8)]
    (folder / "openb_pod_list_multigpu50.csv").write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
                                                          + "\n".join(rows) + "\n")
    donors = [f"openb-pod-{i:04d},4000,8192,1,{(250, 500, 1000)[i % 3]},,LS,Succeeded,{10 * i},"
              f"{10 * i + 600 + 900 * (i % 7)},{10 * i}" for i in range(60)]
    (folder / "openb_pod_list_default.csv").write_text(
        "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,"
        "scheduled_time\n" + "\n".join(donors) + "\n")
    return folder


def test_the_command_prints_each_cell_with_alone_and_its_own_verdict(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    write_traces(tmp_path)
    monkeypatch.setenv("GPUSLICE_TRACES", str(tmp_path))
    code = bench_fairness.main(["--frontier", "--multi-card", "--seeds", "1-2", "--jobs", "300", "--rho", "0.9",
                                "--aheads", "0,inf", "--holds", "inf,0"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "multigpu50 ρ 0.9, seeds 1-2, 300 jobs, 64 cards; no best-effort figures for this cell" in out
    labels = [line.split()[:4] for line in out.splitlines() if line.strip().startswith("a ")]
    assert labels == [["a", "0", "hold", "∞"], ["a", "0", "hold", "0"], ["a", "∞", "hold", "∞"],
                      ["a", "∞", "hold", "0"]]
    assert any(line.strip().startswith("alone") for line in out.splitlines())
    assert "against this relaxation's first in, first out:" in out


@pytest.mark.parametrize("argv", [["--mixes", "multigpu99"], ["--holds", "-5"], ["--aheads", "nan"],
                                  ["--aheads", "soon"]])
def test_bad_settings_are_refused_with_the_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    write_traces(tmp_path)
    monkeypatch.setenv("GPUSLICE_TRACES", str(tmp_path))
    assert bench_fairness.main(["--frontier", "--multi-card", "--seeds", "1", "--jobs", "50", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bench-fairness: ") and err.strip() != "bench-fairness:"
