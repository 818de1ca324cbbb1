"""PNG plots (matplotlib, headless): allocation vs arrived, wait CDFs, utilisation, fragmentation,
and the sizing curve."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: never needs a display

import matplotlib.pyplot as plt

from simulations.engine import NEVER, Simulation


def _save(fig: Any, path: str | Path) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p


def allocation_vs_arrived(curves: Mapping[str, Sequence[float | None]], path: str | Path, title: str) -> Path:
    """Protocol A: allocation % against arrived % per policy, with the ideal diagonal."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    top = max((len(c) for c in curves.values()), default=1) - 1
    ax.plot([0, 100, top], [0, 100, 100], color="0.7", linestyle="--", label="ideal")
    for policy, curve in curves.items():
        points = [(x, y) for x, y in enumerate(curve) if y is not None]
        ax.plot([x for x, _ in points], [y for _, y in points], label=policy)
    ax.axvline(100, color="0.85", linewidth=0.8)
    ax.set_xlabel("arrived GPU demand (% of capacity)")
    ax.set_ylabel("allocated GPU (% of capacity)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    return _save(fig, path)


def wait_cdf(sims: Mapping[str, Sequence[Simulation]], path: str | Path, title: str) -> Path:
    """Protocol B: the CDF of waits (minutes, log scale) per product, one line style per run."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    styles = ["-", "--", ":", "-."]
    for k, (label, runs) in enumerate(sims.items()):
        classes = sorted({c for s in runs for c in s.classes})
        for cls in classes:
            waits: list[float] = []
            for s in runs:
                want = s.classes.index(cls) if cls in s.classes else -1
                waits.extend(st - a for c, a, st in zip(s.job_class, s.arrival, s.start, strict=True)
                             if c == want and st != NEVER)
            if not waits:
                continue
            waits.sort()
            step = max(1, len(waits) // 2000)  # a few thousand points draw the same curve
            points = [*range(0, len(waits), step), len(waits) - 1]
            xs = [max(waits[i] / 60, 1e-2) for i in points]
            ys = [(i + 1) / len(waits) for i in points]
            ax.step(xs, ys, where="post", linestyle=styles[k % len(styles)], label=f"{cls} ({label})")
    ax.set_xscale("log")
    ax.set_xlabel("wait (minutes; zero waits at 0.01)")
    ax.set_ylabel("fraction of jobs")
    ax.set_title(title)
    ax.legend(fontsize=7, loc="lower right")
    return _save(fig, path)


def utilisation(series: Mapping[str, Sequence[float]], window_s: float, path: str | Path, title: str) -> Path:
    """Protocol B: allocated % of capacity over the measured window, per run."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for label, buckets in series.items():
        n = len(buckets)
        xs = [(i + 0.5) * window_s / n / 3600 for i in range(n)]
        ax.plot(xs, buckets, label=label, linewidth=1)
    ax.set_xlabel("time (hours)")
    ax.set_ylabel("allocated (% of capacity)")
    ax.set_ylim(0, 105)
    ax.set_title(title)
    ax.legend(fontsize=7)
    return _save(fig, path)


def fragmentation(results: Mapping[str, Mapping[str, Any]], path: str | Path, title: str) -> Path:
    """Protocol B: cards in use against the lower bound ⌈Σ sizes⌉, and stranded capacity, per run."""
    labels = list(results)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(9, 4))
    xs = range(len(labels))
    ax1.bar([x - 0.2 for x in xs], [results[k]["cards_in_use"] for k in labels], width=0.4, label="cards in use")
    ax1.bar([x + 0.2 for x in xs], [results[k]["lower_bound_cards"] for k in labels], width=0.4,
            label="lower bound ⌈Σ sizes⌉")
    ax1.set_xticks(list(xs), labels, rotation=45, ha="right", fontsize=7)
    ax1.set_ylabel("cards (time average)")
    ax1.legend(fontsize=7)
    ax2.bar(list(xs), [results[k]["stranded_pct"] for k in labels], color="tab:red")
    ax2.set_xticks(list(xs), labels, rotation=45, ha="right", fontsize=7)
    ax2.set_ylabel("stranded capacity (% while claims wait)")
    fig.suptitle(title)
    return _save(fig, path)


def sizing_curve(points: Sequence[tuple[int, float]], target_s: float, answer: int | None, path: str | Path,
                 title: str) -> Path:
    """``gpuslice plan``: the wait percentile against card count, the target and the answer."""
    fig, ax = plt.subplots(figsize=(6.5, 4))
    xs = [n for n, _ in points]
    ax.plot(xs, [w / 60 for _, w in points], marker="o")
    ax.axhline(target_s / 60, color="tab:red", linestyle="--", label="target")
    if answer is not None:
        ax.axvline(answer, color="tab:green", linestyle=":", label=f"answer: {answer} cards")
    ax.set_yscale("symlog", linthresh=1)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("cards")
    ax.set_ylabel("wait (minutes)")
    ax.set_title(title)
    ax.legend(fontsize=8)
    return _save(fig, path)


def frontier(points: Sequence[Mapping[str, Any]], path: str | Path, title: str,
             goal: tuple[float, float] | None = (10.0, 56.0)) -> Path:
    """Admission strategies: quarter-slice p99 wait against whole-card p99 wait (minutes), one numbered
    point per strategy and setting (mean of per-seed p99, bars: 95 % interval; a cross: the pooled
    p99), and the goal region."""
    from matplotlib.ticker import FuncFormatter

    fig, (ax, key) = plt.subplots(1, 2, figsize=(10, 5.2), gridspec_kw={"width_ratios": [3.2, 1.3]})
    if goal is not None:
        ax.fill_between([0, goal[0]], 0, goal[1], color="tab:green", alpha=0.15, zorder=0,
                        label=f"goal: quarter ≤ {goal[0]:g} and whole ≤ {goal[1]:g} min")
    at: dict[tuple[float, float], list[str]] = {}
    for i, p in enumerate(points, start=1):
        colour = f"C{(i - 1) % 10}"
        ax.errorbar(p["quarter"], p["whole"], xerr=p["quarter_hw"], yerr=p["whole_hw"], fmt="o", ms=6,
                    color=colour, ecolor=colour, elinewidth=0.8, capsize=2, zorder=3)
        ax.plot(p["quarter_pooled"], p["whole_pooled"], "x", ms=5, color=colour, zorder=3)
        at.setdefault((round(p["quarter"], 1), round(p["whole"], 1)), []).append(str(i))
    for k, ((x, y), names) in enumerate(sorted(at.items())):  # points that coincide share one label
        offset = (5, 4) if k % 2 == 0 else (-9, -11)  # neighbours in x alternate sides
        ax.annotate(",".join(names), (x, y), textcoords="offset points", xytext=offset, fontsize=8)
    ax.plot([], [], "ok", ms=5, label="mean of per-seed p99 (bars: 95 % interval)")
    ax.plot([], [], "xk", ms=5, label="pooled p99")
    ax.set_xscale("symlog", linthresh=1.0)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("quarter-slice (v100-25) p99 wait, minutes (log scale above 1)")
    ax.set_ylabel("whole-card (v100-100) p99 wait, minutes")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="best")
    key.axis("off")
    rows = [f"{i}: {p['label']}" for i, p in enumerate(points, start=1)]
    key.text(0.0, 1.0, "\n".join(rows), va="top", ha="left", fontsize=7, family="monospace",
             transform=key.transAxes, wrap=True)
    return _save(fig, path)
