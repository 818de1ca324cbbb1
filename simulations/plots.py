"""PNG plots (matplotlib, headless): allocation vs arrived, wait CDFs, utilisation, fragmentation,
and the sizing curve."""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: never needs a display

import matplotlib.pyplot as plt
from matplotlib.lines import Line2D

from simulations.engine import NEVER, Simulation
from simulations.metrics import product_order


def _save(fig: Any, path: str | Path, layout: bool = True) -> Path:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    if layout:
        fig.tight_layout()
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p


def allocation_vs_arrived(curves: Mapping[str, Sequence[float | None]], path: str | Path, title: str) -> Path:
    """Protocol A: allocation % against arrived % per policy, the ideal drawn over them (a policy that
    packs perfectly shows through it), and a zoom on 85 % arrived and beyond, where the policies part."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    top = max((len(c) for c in curves.values()), default=1) - 1
    inset = ax.inset_axes((0.52, 0.08, 0.44, 0.44))
    for where in (ax, inset):
        for policy, curve in curves.items():
            points = [(x, y) for x, y in enumerate(curve) if y is not None]
            where.plot([x for x, _ in points], [y for _, y in points], label=policy)
        where.plot([0, 100, top], [0, 100, 100], color="black", linestyle=(0, (3, 3)), linewidth=0.8,
                   label="ideal", zorder=5)
        where.axvline(100, color="0.85", linewidth=0.8)
    inset.set_xlim(85, max(top, 101))
    inset.set_ylim(90, 100.5)  # the packers worth comparing part within a few points of 100
    inset.tick_params(labelsize=7)
    inset.set_title("zoom: 85 % arrived and beyond, 90-100 % allocated", fontsize=7)
    ax.set_xlabel("arrived GPU demand (% of capacity)")
    ax.set_ylabel("allocated GPU (% of capacity)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8, loc="upper left")
    return _save(fig, path)


def _waits_min(runs: Sequence[Simulation], cls: str) -> tuple[list[float], int]:
    """The started waits (minutes, sorted) of product ``cls`` over ``runs``, and how many jobs it had."""
    waits: list[float] = []
    jobs = 0
    for s in runs:
        if cls not in s.classes:
            continue
        want = s.classes.index(cls)
        for c, a, st in zip(s.job_class, s.arrival, s.start, strict=True):
            if c == want:
                jobs += 1
                if st != NEVER:
                    waits.append((st - a) / 60)
    waits.sort()
    return waits, jobs


def _survival(ax: Any, waits: Sequence[float], jobs: int, x0: float, **style: Any) -> None:
    """The share of ``jobs`` that waited at least x, for x from ``x0`` to the longest wait, where the line
    ends (a job that never started waited longer than any x)."""
    tail = [w for w in waits if w >= x0]
    never = jobs - len(waits)
    if not tail:
        return  # nobody waited that long: nothing to draw (the legend gives the share that waited)
    step = max(1, len(tail) // 2000)  # a few thousand points draw the same curve
    keep = sorted({*range(0, len(tail), step), len(tail) - 1})
    xs = [x0] + [tail[i] for i in keep]
    ys = [(len(tail) + never) / jobs] + [(len(tail) - i + never) / jobs for i in keep]
    ax.step(xs, ys, where="pre", **style)  # on (x[i-1], x[i]]: the waits of index >= i, at least x


def _share_axis(ax: Any, smallest: float) -> None:
    ax.set_yscale("log")
    low = 10 ** math.floor(math.log10(max(smallest, 1e-6)))
    ax.set_ylim(low / 2, 1.6)  # headroom: a line at 100 % stays off the frame
    ticks = [10 ** -k for k in range(0, -int(math.log10(low)) + 1)]
    ax.set_yticks(ticks, [f"{100 * t:g} %" for t in ticks])
    ax.set_xscale("log")
    ax.grid(True, which="major", color="0.9", linewidth=0.6)


def _run_styles(labels: Sequence[str]) -> tuple[dict[str, dict[str, Any]], list[Any]]:
    """A colour per placement policy and a line style per admission policy for ``policy+admission`` run
    labels (a colour per run otherwise), and the legend handles that say which is which."""
    from matplotlib.lines import Line2D

    dashes: tuple[Any, ...] = ("-", "--", ":", "-.")
    pairs = [label.split("+", 1) for label in labels]
    if not all(len(p) == 2 for p in pairs):
        styles = {label: {"color": f"C{k % 10}", "linestyle": dashes[k // 10 % 4], "label": label}
                  for k, label in enumerate(labels)}
        return styles, [Line2D([], [], color=st["color"], linestyle=st["linestyle"], label=label)
                        for label, st in styles.items()]
    policies = list(dict.fromkeys(p for p, _ in pairs))
    admissions = list(dict.fromkeys(a for _, a in pairs))
    # the first drawn is the widest: a run that ends where a later one does still shows round it
    width = {p: 1.0 + 2.0 * (len(policies) - 1 - k) / max(1, len(policies) - 1) for k, p in enumerate(policies)}
    styles = {label: {"color": f"C{policies.index(p) % 10}", "linestyle": dashes[admissions.index(a) % 4],
                      "linewidth": width[p]} for label, (p, a) in zip(labels, pairs, strict=True)}
    handles = [Line2D([], [], color=f"C{k % 10}", linewidth=width[p], label=p) for k, p in enumerate(policies)]
    if len(admissions) > 1:
        handles += [Line2D([], [], color="black", linestyle=dashes[k % 4], label=a) for k, a in enumerate(admissions)]
    return styles, handles


def _legend_beside(fig: Any, handles: list[Any], share: float) -> None:
    """Lay the plots out in all but the right ``share`` of the figure, the legend in that column."""
    fig.tight_layout(rect=(0, 0, 1 - share, 1))
    fig.legend(handles=handles, fontsize=7, loc="center left", bbox_to_anchor=(1 - share + 0.005, 0.5),
               frameon=False)


def wait_cdf(sims: Mapping[str, Sequence[Simulation]], path: str | Path, title: str) -> Path:
    """Protocol B: per product, the share of its jobs that waited at least x minutes (the complement
    of the wait CDF, both axes log: a tail of 1 % is as visible as one of 50 %). One run: a line per
    product. Several runs (``--compare``): a panel per product, a line per run."""
    classes = sorted({c for runs in sims.values() for s in runs for c in s.classes}, key=product_order)
    data = {(label, cls): _waits_min(runs, cls) for label, runs in sims.items() for cls in classes}
    positive = sorted(w for waits, _ in data.values() for w in waits if w > 0)
    # from the decade of the shortest 1 % of waits that are not zero: below it the lines only run flat
    x0 = 10 ** math.floor(math.log10(positive[len(positive) // 100])) if positive else 0.1
    smallest = min((1 / jobs for _, jobs in data.values() if jobs), default=1.0)
    if len(sims) == 1:
        (label,) = sims
        fig, ax = plt.subplots(figsize=(7, 4.5))
        entries = []
        for k, cls in enumerate(classes):
            waits, jobs = data[(label, cls)]
            if jobs:
                waited = 100 * (jobs - sum(1 for w in waits if w <= 0)) / jobs
                name, color = f"{cls}: {waited:.1f} % waited at all", f"C{k}"
                _survival(ax, waits, jobs, x0, label=name, color=color)
                entries.append(Line2D([], [], label=name, color=color))  # nobody waited: no line, still named
        _share_axis(ax, smallest)
        ax.set_xlabel("wait (minutes)")
        ax.set_ylabel("jobs that waited at least this long")
        ax.set_title(f"{title}\n{label}", fontsize=10)
        ax.legend(handles=entries, fontsize=8, loc="lower left")
        return _save(fig, path)
    styles, handles = _run_styles(list(sims))
    cols = min(3, len(classes))
    rows = math.ceil(len(classes) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(3.6 * cols + 1.8, 3.0 * rows + 0.6), sharex=True, sharey=True,
                             squeeze=False)
    for ax, cls in zip(axes.flat, classes, strict=False):
        for label in sims:
            waits, jobs = data[(label, cls)]
            if jobs:
                _survival(ax, waits, jobs, x0, **styles[label])
        _share_axis(ax, smallest)
        ax.set_title(cls, fontsize=9)
    for ax in axes.flat[len(classes):]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel("jobs that waited at least this long", fontsize=8)
    for ax in axes[-1, :]:
        ax.set_xlabel("wait (minutes)")
    fig.suptitle(title)
    _legend_beside(fig, handles, 1.7 / (3.6 * cols + 1.8))
    return _save(fig, path, layout=False)


def utilisation(series: Mapping[str, Sequence[float]], window_s: float, path: str | Path, title: str) -> Path:
    """Protocol B: allocated % of capacity over the measured window, per run (one run: named in the title;
    several: a colour per placement policy, a line style per admission policy, the legend beside)."""
    many = len(series) > 1
    fig, ax = plt.subplots(figsize=(8.8 if many else 7, 4))
    styles, handles = _run_styles(list(series))
    for label, buckets in series.items():
        n = len(buckets)
        xs = [(i + 0.5) * window_s / n / 3600 for i in range(n)]
        ax.plot(xs, buckets, **{"linewidth": 1.0, **styles[label], "label": label})
    ax.set_xlabel("time since the first arrival (hours)")
    ax.set_ylabel("allocated (% of capacity)")
    ax.set_ylim(0, 105)
    ax.set_xlim(0, window_s / 3600)
    ax.grid(True, axis="y", color="0.92", linewidth=0.6)
    if many:
        ax.set_title(title, fontsize=10)
        _legend_beside(fig, handles, 1.7 / 8.8)
        return _save(fig, path, layout=False)
    ax.set_title(f"{title}\n{next(iter(series))}", fontsize=10)
    return _save(fig, path)


def fragmentation(results: Mapping[str, Mapping[str, Any]], path: str | Path, title: str) -> Path:
    """Protocol B: where the cards go, per run, time-averaged: the work's lower bound ⌈Σ sizes⌉, the cards
    fragmentation adds to it (in use beyond the bound), and the cards left free; stranded capacity beside."""
    labels = list(results)
    runs = [results[k] for k in labels]
    cards = max(float(r["cards"]) for r in runs)
    fig, ax = plt.subplots(figsize=(8, 1.7 + 0.5 * len(labels)))
    ys = list(range(len(labels)))[::-1]  # the first run on top
    parts = (("needed: lower bound ⌈Σ sizes⌉", "tab:blue", [r["lower_bound_cards"] for r in runs]),
             ("fragmentation: in use beyond it", "tab:red", [r["cards_in_use"] - r["lower_bound_cards"] for r in runs]),
             ("free", "0.85", [r["cards"] - r["cards_in_use"] for r in runs]))
    left = [0.0] * len(labels)
    for name, color, values in parts:
        widths = [max(0.0, float(v)) for v in values]
        ax.barh(ys, widths, left=left, color=color, label=name, height=0.6)
        for y, x, w in zip(ys, left, widths, strict=True):
            if w >= 0.08 * cards:  # wide enough to hold its figure
                ax.text(x + w / 2, y, f"{w:.1f}", ha="center", va="center", fontsize=7,
                        color="black" if color == "0.85" else "white")
            elif w > 0:  # a thin segment: its figure above it
                ax.text(x + w / 2, y + 0.32, f"{w:.1f}", ha="center", va="bottom", fontsize=7,
                        color="0.35" if color == "0.85" else color)
        left = [a + w for a, w in zip(left, widths, strict=True)]
    for y, r in zip(ys, runs, strict=True):
        ax.text(1.01, y, f"stranded\n{r['stranded_pct']:.1f} %", transform=ax.get_yaxis_transform(), va="center",
                fontsize=7, clip_on=False)
    ax.set_yticks(ys, labels, fontsize=8)
    ax.set_ylim(-0.6, len(labels) - 0.15)
    ax.set_xlim(0, cards)
    ax.set_xlabel("cards (time average over the measured window); stranded: capacity left free while claims "
                  "waited, % of capacity", fontsize=8)
    ax.legend(fontsize=7, loc="lower left", bbox_to_anchor=(0, 1.0), ncols=3, frameon=False, borderaxespad=0.2)
    fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def sizing_curve(points: Sequence[tuple[int, float]], target_s: float, answer: int | None, path: str | Path,
                 title: str, metric: str = "wait percentile") -> Path:
    """``gpuslice plan``: the measured wait ``metric`` against card count, the target and the answer.

    Only measured counts are drawn as points; a solid line joins neighbours (n, n + 1) alone, a faint
    dotted one bridges counts the search skipped. The y axis is linear to 1 minute and logarithmic
    above (waits span decades), with headroom so no point sits on the frame; a count whose jobs
    did not all start (an infinite percentile) is marked at the top."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    finite = [(n, w / 60) for n, w in points if math.isfinite(w)]
    top_value = max([w for _, w in finite] + [target_s / 60, 1.0])
    top = 10 ** math.ceil(math.log10(top_value * 1.3))  # the next decade: the highest point has headroom
    for (n0, w0), (n1, w1) in itertools.pairwise(finite):
        joined = n1 - n0 == 1
        ax.plot([n0, n1], [w0, w1], color="tab:blue" if joined else "0.6", linestyle="-" if joined else ":",
                linewidth=1.5 if joined else 1, label=None if joined else "_skipped")
    ax.plot([n for n, _ in finite], [w for _, w in finite], "o", color="tab:blue", label="measured")
    unserved = [n for n, w in points if not math.isfinite(w)]
    if unserved:
        ax.plot(unserved, [top * 0.8] * len(unserved), "^", color="tab:purple", label="some jobs never started")
    if any(n1 - n0 > 1 for (n0, _), (n1, _) in itertools.pairwise(finite)):
        ax.plot([], [], color="0.6", linestyle=":", label="not measured in between")
    ax.axhline(target_s / 60, color="tab:red", linestyle="--", label=f"target {target_s / 60:g} min")
    if answer is not None:
        ax.axvline(answer, color="tab:green", linestyle=":", label=f"answer: {answer} cards")
        at = dict(finite).get(answer)
        if at is not None:
            ax.annotate(f"{at:.1f} min", (answer, at), textcoords="offset points", xytext=(8, -14), fontsize=8)
    ax.set_yscale("symlog", linthresh=1, linscale=0.5)
    ticks = [0.0] + [10.0 ** k for k in range(0, round(math.log10(top)) + 1)]
    ax.set_yticks(ticks, [f"{t:g}" for t in ticks])
    ax.set_ylim(-0.4, top * 1.1)
    counts = [n for n, _ in points]
    if counts:
        span = max(counts) - min(counts)
        ax.set_xlim(min(counts) - max(0.5, 0.04 * span), max(counts) + max(0.5, 0.04 * span))
        if span <= 20:
            ax.set_xticks(range(min(counts), max(counts) + 1))
    ax.set_xlabel("cards")
    ax.set_ylabel(f"{metric} (minutes)")
    ax.set_title(title, fontsize=10)
    ax.grid(True, axis="y", color="0.92", linewidth=0.6)
    ax.legend(fontsize=7, loc="upper right")
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
