"""The simulator's plots read as a reader would read them: the figures are kept and their parts checked."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from matplotlib.lines import Line2D

from packing.products import load_catalog
from simulations import plots, protocol_b
from simulations.engine import EngineConfig, Simulation
from simulations.synthetic import SyntheticSpec, generate


@pytest.fixture
def figures(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every figure a plot function saves, kept open for inspection instead of closed."""
    kept: list[Any] = []
    close = plots.plt.close
    monkeypatch.setattr(plots.plt, "close", kept.append)
    yield kept
    for fig in kept:
        close(fig)


@pytest.fixture(scope="module")
def sims() -> dict[str, list[Simulation]]:
    catalog = load_catalog()
    jobs = generate(SyntheticSpec(cards=8, rho=0.9, jobs=600), 1)
    out = {}
    for admission in ("aging-guard", "strict-fifo"):
        config = protocol_b.ProtocolBConfig(engine=EngineConfig(admission=admission))
        out[f"best-fit+{admission}"] = protocol_b.run(jobs, catalog, config, [1], cards=8).simulations
    return out


PLAN = [(56, 67.7 * 60), (58, 39.7 * 60), (59, 21.3 * 60), (60, 8.8 * 60), (64, 0.0)]


def test_sizing_curve_keeps_points_off_the_frame_ticks_its_decades_and_names_its_percentile(
        figures: list[Any], tmp_path: Path) -> None:
    plots.sizing_curve(PLAN, 600, 60, tmp_path / "plan.png", "sizing", "p95 wait of all jobs")
    ((ax,),) = [f.axes for f in figures]
    low, high = ax.get_ylim()
    waits = [w / 60 for _, w in PLAN]
    assert low < min(waits) and high > 1.2 * max(waits)  # headroom both ways: no point sits on the frame
    ticks = [t for t in ax.get_yticks() if low <= t <= high]
    assert ticks[0] == 0 and all(b == 10 * a for a, b in itertools.pairwise(ticks[1:]))
    assert ticks[-1] >= max(waits)  # the highest point has a tick above it
    assert "p95" in ax.get_ylabel() and "minutes" in ax.get_ylabel()
    solid = [ln for ln in ax.get_lines() if ln.get_linestyle() == "-" and len(ln.get_xdata()) == 2]
    assert solid and all(abs(ln.get_xdata()[1] - ln.get_xdata()[0]) == 1 for ln in solid)  # measured neighbours
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "not measured in between" in labels and "target 10 min" in labels and "answer: 60 cards" in labels


def test_one_runs_wait_plot_names_the_run_once_and_keeps_every_line_below_the_top(
        figures: list[Any], tmp_path: Path, sims: dict[str, list[Simulation]]) -> None:
    one = {"best-fit+aging-guard": sims["best-fit+aging-guard"]}
    plots.wait_cdf(one, tmp_path / "w.png", "waits")
    ((ax,),) = [f.axes for f in figures]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels and not any("aging-guard" in label for label in labels)  # the run is in the title, once
    assert "best-fit+aging-guard" in ax.get_title()
    top = ax.get_ylim()[1]
    for line in ax.get_lines():
        assert max(line.get_ydata()) <= 1.0 < top  # 100 % is below the frame: a line there stays visible
    assert ax.get_yscale() == "log" and ax.get_xscale() == "log"


def test_several_runs_wait_plot_has_a_panel_per_product_and_a_legend_of_policies_and_admissions(
        figures: list[Any], tmp_path: Path, sims: dict[str, list[Simulation]]) -> None:
    plots.wait_cdf(sims, tmp_path / "w.png", "waits")
    (fig,) = figures
    products = sorted({c for runs in sims.values() for s in runs for c in s.classes})
    shown = [ax for ax in fig.axes if ax.get_visible()]
    assert sorted(ax.get_title() for ax in shown) == products
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == ["best-fit", "aging-guard", "strict-fifo"]
    for ax in shown:  # a line style per admission policy
        assert {ln.get_linestyle() for ln in ax.get_lines() if isinstance(ln, Line2D)} == {"-", "--"}


def test_fragmentation_is_one_panel_a_bar_per_run_split_into_needed_fragmented_free(
        figures: list[Any], tmp_path: Path) -> None:
    run = {"cards": 64, "cards_in_use": 56.0, "lower_bound_cards": 54.0, "stranded_pct": 3.59}
    plots.fragmentation({"best-fit+aging-guard": run}, tmp_path / "f.png", "fragmentation")
    ((ax,),) = [f.axes for f in figures]
    widths = sorted(round(p.get_width(), 6) for p in ax.patches)
    assert widths == [2.0, 8.0, 54.0]  # the three parts of one bar sum to the cards
    assert ax.get_xlim() == (0.0, 64.0)
    texts = [t.get_text() for t in ax.texts]
    assert "stranded\n3.6 %" in texts and {"54.0", "2.0", "8.0"} <= set(texts)


def test_protocol_a_plot_draws_the_ideal_over_the_policies_and_zooms_on_the_knee(
        figures: list[Any], tmp_path: Path) -> None:
    curve: list[float | None] = [min(100.0, float(x)) for x in range(131)]
    plots.allocation_vs_arrived({"best-fit": curve}, tmp_path / "a.png", "protocol A")
    (fig,) = figures
    (main,) = fig.axes
    (inset,) = main.child_axes
    ideal = next(ln for ln in main.get_lines() if ln.get_label() == "ideal")
    assert all(ideal.get_zorder() > ln.get_zorder() for ln in main.get_lines() if ln is not ideal)
    assert inset.get_xlim()[0] == 85 and inset.get_ylim() == (90.0, 100.5)
