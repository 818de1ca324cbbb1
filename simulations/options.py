"""Command-line options shared by ``gpuslice simulate`` and ``gpuslice plan``: value parsers and option groups."""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import math
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from packing.admission.worst_first import SINGLE_FRONTS
from packing.argtypes import positive_int, positive_number, readable_file
from packing.policies import DEFAULT_POLICY, POLICIES, policy_names
from packing.products import Catalog
from packing.queue import (
    ADMISSION_POLICIES,
    AGING_GUARD,
    DEFAULT_ADMISSION,
    DEFAULT_AGE_LIMIT,
    DRAIN_SOONEST,
    MAX_HEAD_START,
    WORST_FIRST,
    WorstFirstSettings,
)
from packing.usage import Applies, Conflict
from simulations import metrics, protocol_b
from simulations.cluster import DEFAULT_CARD_LABEL
from simulations.engine import EngineConfig
from simulations.scheduler import SCORES, TIES
from simulations.workload import DEFAULT_RUNTIME_CAP_S, ROUNDINGS

_UNITS = {"s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0}


class UsageError(ValueError):
    """Bad command-line usage (mutually exclusive or missing options)."""


def parse_seeds(text: str) -> tuple[int, ...]:
    """``42-51``, ``1,2,5`` or ``7``; ranges inclusive."""
    seeds: list[int] = []
    for part in text.split(","):
        part = part.strip()
        m = re.fullmatch(r"(-?\d+)-(-?\d+)", part)
        try:
            if m:
                lo, hi = int(m.group(1)), int(m.group(2))
                if hi < lo:
                    raise ValueError
                seeds.extend(range(lo, hi + 1))
            else:
                seeds.append(int(part))
        except ValueError:
            raise argparse.ArgumentTypeError(f"seeds must look like 42-51 or 1,2,3, got {text!r}") from None
    if not seeds:
        raise argparse.ArgumentTypeError("no seeds given")
    return tuple(seeds)


def parse_duration(text: str) -> float:
    """Seconds, or a number with a unit: 90s, 15m, 2h, 2d."""
    if text.strip().startswith("-"):
        raise argparse.ArgumentTypeError(f"a duration cannot be negative, got {text!r}")
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|m|min|h|d)?\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"duration must look like 3600, 90s, 15m, 2h or 2d, got {text!r}")
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


def positive_duration(text: str) -> float:
    """A duration > 0 (``parse_duration``)."""
    seconds = parse_duration(text)
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"duration must be > 0, got {text!r}")
    return seconds


def parse_signed_duration(text: str) -> float:
    """A duration that may be negative: -1h, 30m, -90s."""
    body = text.strip()
    sign = -1.0 if body.startswith("-") else 1.0
    try:
        return sign * parse_duration(body.removeprefix("-"))
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"a head start looks like 15m, -1h or 0, got {text!r}") from None


def parse_target(text: str) -> float:
    """A wait target with its unit (90s, 10m, 2h, 1d; a bare 0 is zero): a bare 10 is refused, not read as seconds."""
    body = text.strip()
    if body.startswith("-"):
        raise argparse.ArgumentTypeError(f"a wait target cannot be negative, got {text!r}")
    if re.fullmatch(r"\d+(?:\.\d+)?", body) and float(body) != 0:
        raise argparse.ArgumentTypeError(f"a wait target needs its unit: {body}s, {body}m or {body}h, got {text!r}")
    try:
        return parse_duration(body)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"a wait target looks like 90s, 10m, 2h or 1d, got {text!r}") from None


DURATION_FLAGS = ("--target", "--age-limit", "--sla", "--reservation-ttl", "--bind-delay", "--runtime-cap")


def dash_values(argv: Sequence[str], flags: Sequence[str] = DURATION_FLAGS) -> list[str]:
    """``--flag -5m`` as ``--flag=-5m``: argparse takes a value that starts with a dash for an option and
    says only "expected one argument"; joined, the value's own parser explains what is wrong with it."""
    out = list(argv)
    i = 0
    while i < len(out) - 1:
        if out[i] in flags and out[i + 1].startswith("-") and out[i + 1][1:2].isdigit():
            out[i:i + 2] = [f"{out[i]}={out[i + 1]}"]
        i += 1
    return out


def parse_cap(text: str) -> float | None:
    """A runtime cap, or None for 'none', 'off' or '0'."""
    return None if text.strip().lower() in ("none", "off", "0") else parse_duration(text)


def parse_rho(text: str) -> float | None:
    """A positive offered load, or None ('none', 'trace', 'keep') to keep the workload's own timing."""
    if text.strip().lower() in ("none", "trace", "keep"):
        return None
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"offered load must be a number or 'none', got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"offered load must be positive, got {text!r}")
    return value


def parse_rhos(text: str) -> tuple[float | None, ...]:
    """``--rho``: one offered load or several, comma-separated (``0.7,0.85,0.95``); each as ``parse_rho``."""
    parts = [p for p in text.split(",") if p.strip()]
    if not parts:
        raise argparse.ArgumentTypeError(f"offered load must be a number or 'none', got {text!r}")
    return tuple(parse_rho(p) for p in parts)


def parse_load(text: str) -> float:
    """A positive offered load (``--saturation``: 'none' is no load to saturate at)."""
    value = parse_rho(text)
    if value is None:
        raise argparse.ArgumentTypeError(f"expected an offered load such as 1.1, got {text!r}")
    return value


def parse_percentile(text: str) -> float:
    """A percentile, 0..100."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a percentile 0..100, got {text!r}") from None
    if not 0 <= value <= 100:  # nan fails both
        raise argparse.ArgumentTypeError(f"expected a percentile 0..100, got {text!r}")
    return value


def input_paths(text: str) -> str:
    """``--pods``: a file, several comma-separated, or a folder; each must exist."""
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts:
        raise argparse.ArgumentTypeError(f"expected a pod list, several comma-separated or a folder, got {text!r}")
    for part in parts:
        if not os.path.isdir(part):
            readable_file(part)
    return text


def parse_inflation(text: str) -> float:
    """Protocol A's inflation: a multiple of capacity >= 1 (its headline is read at 100 % arrived)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a multiple of capacity, e.g. 1.3, got {text!r}") from None
    if not (math.isfinite(value) and value >= 1):
        raise argparse.ArgumentTypeError(f"protocol A reads the allocation when 100 % of capacity has arrived, so "
                                         f"the workload must reach it: at least 1, got {text!r}")
    return value


def processes(text: str) -> int:
    """A worker-process count; 0 means one per core this process may use."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of processes, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number of processes >= 0, got {text!r}")
    if value == 0:
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return value


# ---- what applies to what (packing/usage.py: an option that does not apply is refused) ------------------


def protocol_of(args: argparse.Namespace) -> str:
    """The protocol a ``simulate`` run is: ``--protocol``, else A for openb pods (``--pods``), else B."""
    return str(getattr(args, "protocol", None) or ("a" if args.pods else "b"))


def _trace(args: argparse.Namespace) -> bool:
    """Whether the demand is read (openb pods, our trace, a live cluster's history), not generated."""
    return bool(args.pods or args.trace or getattr(args, "from_cluster", None))


def _loads(args: argparse.Namespace) -> tuple[float | None, ...]:
    """The loads ``--rho`` gave (several, comma-separated; one before ``settle_loads``)."""
    rho = args.rho
    return tuple(rho) if isinstance(rho, tuple) else (rho,)


def _pod_lists(args: argparse.Namespace) -> int:
    """How many pod lists ``--pods`` names (a folder counts its ``openb_pod_list_*.csv``)."""
    parts = [p.strip() for p in str(getattr(args, "pods", None) or "").split(",") if p.strip()]
    return sum(len(list(Path(p).glob("openb_pod_list_*.csv"))) if os.path.isdir(p) else 1 for p in parts)


def _one_run(args: argparse.Namespace) -> bool:
    """Whether the command runs one workload at one load (one pod list at most, one ``--rho``)."""
    return len(_loads(args)) == 1 and _pod_lists(args) <= 1


def settle_loads(args: argparse.Namespace) -> None:
    """After the rules: ``args.rhos`` every load ``--rho`` gave, ``args.rho`` the first (what one run reads)."""
    args.rhos = _loads(args)
    args.rho = args.rhos[0]


def admission_names(args: argparse.Namespace) -> list[str]:
    """The strategies ``--admission`` names (every one with ``--compare``), without their settings."""
    if getattr(args, "compare", False) or (getattr(args, "compare_admission", False) and args.admission is None):
        return list(ADMISSION_POLICIES)
    return [spec.split(":")[0].strip() for spec in split_admissions(args.admission or DEFAULT_ADMISSION)]


AGING = (AGING_GUARD, DRAIN_SOONEST, WORST_FIRST)  # the strategies that age claims: an age limit orders them
PROTOCOL_A_ONLY = ("--offline", "--processes", "--inflation", "--workers", "--scheduler")
PROTOCOL_B_ONLY = ("--compare-admission", "--saturation", "--admission", "--rho", "--arrivals", "--host",
                   "--max-job-cards", "--age-limit", "--sla", "--reservation-ttl", "--bind-delay", "--declare-limits",
                   "--runtimes-from", "--placements", "--runtime-cap", "--never-ran", "--gang")
WORKLOAD_RULES: tuple[Applies | Conflict, ...] = (
    Conflict("--pods", "--trace", "--pods reads an openb pod list, --trace our own format: give one of them"),
    Conflict("--nodes", "--cards", "both give the cluster: keep --nodes (an openb node list) or --cards (N V100 "
             "cards, 8 per node)"),
    Applies(("--nodes",), _trace, "is the cluster of a trace, and without --pods or --trace the run is the built-in "
            "workload, generated for --cards cards", "add --pods PODS.csv (the pod list the node list goes with), "
            "or size the built-in workload's cluster with --cards N"),
    Applies(("--bad-rows",), lambda a: bool(a.nodes or _trace(a)), "applies to rows of input files, and the "
            "built-in workload reads none", "drop it, or give --pods or --trace"),
    Applies(("--never-ran", "--runtimes-from"), lambda a: bool(a.pods), "applies to openb pod lists (--pods) only",
            "drop it, or give --pods"),
    Applies(("--max-job-cards", "--arrivals"), _trace, "applies to a trace (--pods or --trace), and the built-in "
            "workload is generated as asked", "drop it, or give --pods or --trace"),
    Applies(("--rho",), lambda a: None not in _loads(a) or _trace(a), "none keeps a trace's own timing, and the "
            "built-in workload has none", "give a load, e.g. --rho 0.85, or a trace"),
    Applies(("--bind-delay",), lambda a: a.reservation_ttl is not None, "needs --reservation-ttl (without it "
            "admission commits at once, so nothing waits for a bind)", "add --reservation-ttl DUR"),
    Applies(("--age-limit",), lambda a: any(n in AGING for n in admission_names(a)), "applies to the admission "
            f"strategies that age claims ({', '.join(AGING)}), and none is chosen", "drop it, or choose one of them "
            "with --admission"),
)
SIMULATE_RULES: tuple[Applies | Conflict, ...] = (
    Applies(("--saturation",), lambda a: bool(a.compare_admission), "measures the usable capacity of the strategies "
            "--compare-admission compares, and it is not given", "add --compare-admission, or drop it"),
    Applies(("--placements",), _one_run, "writes one run's placements, and this command runs several pod lists or "
            "loads", "give one pod list and one --rho, or drop it"),
    Applies(PROTOCOL_A_ONLY, lambda a: protocol_of(a) == "a", "applies to protocol A only, and this run is protocol "
            "B", "drop it, or add --protocol a"),
    Applies(PROTOCOL_B_ONLY, lambda a: protocol_of(a) == "b", "applies to protocol B only, and this run is protocol "
            "A", "drop it, or add --protocol b"),
    Applies(("--jobs",), lambda a: protocol_of(a) == "b" or not _trace(a), "sizes the built-in workload (or "
            "protocol B's resampling), and protocol A places the trace's own pods", "drop it"),
    *WORKLOAD_RULES,
)
PLAN_RULES: tuple[Applies | Conflict, ...] = (
    Applies(("--rho",), lambda a: len(_loads(a)) == 1, "gives several offered loads, and plan sizes the cluster for "
            "one at a time", "give one load, e.g. --rho 0.85"),
    Applies(("--pods",), lambda a: _pod_lists(a) <= 1, "names several pod lists, and plan sizes one workload at a "
            "time", "give one pod list"),
    Applies(("--nodes",), lambda a: False, "does not apply to plan: it sizes a cluster of identical V100 cards",
            "drop it (--card-model labels those cards)"),
    Applies(("--cards",), lambda a: False, "does not apply to plan: it searches the card count",
            "drop it (--ref-cards N is the cluster the workload's --rho is offered to)"),
    *WORKLOAD_RULES,
)


def workload_options(ap: argparse.ArgumentParser) -> None:
    """Options choosing and shaping the workload."""
    g = ap.add_argument_group("workload (default: the built-in synthetic workload)")
    g.add_argument("--nodes", type=readable_file, metavar="NODES.csv", help="openb node list (openb_node_list_*.csv)")
    g.add_argument("--pods", type=input_paths, metavar="PODS.csv",
                   help="openb pod list (openb_pod_list_*.csv), or several, comma-separated, or a folder (every "
                   "openb_pod_list_*.csv in it): protocol A sweeps them, protocol B runs each")
    g.add_argument("--trace", type=readable_file, metavar="JOBS",
                   help="our own trace format, CSV or .jsonl (see simulations/README.md)")
    g.add_argument("--bad-rows", choices=("error", "skip"), default="error",
                   help="a bad row stops with file:line (error, default) or is skipped and counted (skip)")
    g.add_argument("--catalog", type=readable_file, metavar="TOML",
                   help="product catalog (default: the built-in V100 catalog)")
    g.add_argument("--card-model", default=DEFAULT_CARD_LABEL,
                   help=f"GPU label every card gets when requests are slices (default {DEFAULT_CARD_LABEL})")
    g.add_argument("--rounding", choices=ROUNDINGS, help="free-form milli (none) or rounded up to catalog slices "
                   "(slices); default: none for protocol A, slices for B")
    g.add_argument("--jobs", type=positive_int, help="jobs to generate or resample (protocol B, plan)")
    g.add_argument("--runtime-cap", type=parse_cap, default=DEFAULT_RUNTIME_CAP_S, metavar="DUR",
                   help="cap runtimes (the openb tail is truncated at the trace's end); 'none' to keep (default 2d)")
    g.add_argument("--never-ran", choices=("drop", "sample"), default="drop",
                   help="openb pods never scheduled: drop them, or sample a runtime (default drop)")
    g.add_argument("--runtimes-from", type=readable_file, metavar="PODS.csv",
                   help="protocol B: pods without times (openb multigpu*) borrow runtimes from this pod list's "
                   "pods of the same card count (Poisson arrivals only)")


def scheduler_options(ap: argparse.ArgumentParser) -> None:
    """Options for placement and the scheduler model."""
    g = ap.add_argument_group("placement and the path through kube-scheduler")
    g.add_argument("--policy", default=DEFAULT_POLICY,
                   help=f"placement policy, or several comma-separated (default {DEFAULT_POLICY}); "
                   "one of: " + ", ".join(policy_names()))
    g.add_argument("--ties", default="stable",
                   help="node-score ties: per-seed fixed node order (stable, FGD's artifact) or random (upstream); "
                   "protocol A also takes both, stable,random")
    g.add_argument("--scores", choices=SCORES, default="exact",
                   help="compare exact keys, or only the extender's 0..10 levels (extender)")
    g.add_argument("--seeds", type=parse_seeds, help="e.g. 42-51 (default: 42-51 for protocol A, 1-3 for B)")


def protocol_a_options(ap: argparse.ArgumentParser) -> None:
    """Protocol A options: the offline reference and worker processes."""
    g = ap.add_argument_group("protocol A: reference and speed")
    g.add_argument("--offline", action="store_true",
                   help="add the offline reference (the pods arrived up to 100 %%, packed knowing all of them)")
    g.add_argument("--processes", "-j", type=processes, default=1, metavar="N",
                   help="run protocol A's runs in N worker processes (0: one per core; default 1)")
    g.add_argument("--workers", type=processes, metavar="N",
                   help="run them on a Dask LocalCluster of N worker processes instead (0: one per core; needs "
                        "gpuslice[sweep])")
    g.add_argument("--scheduler", metavar="tcp://HOST:8786",
                   help="run them on an existing Dask cluster (its scheduler's address; needs gpuslice[sweep])")


def queue_options(ap: argparse.ArgumentParser) -> None:
    """Protocol B options: queue admission, load and cluster size."""
    g = ap.add_argument_group("protocol B: queue and load")
    g.add_argument("--admission", default=None,
                   help=f"queue admission policy, or several comma-separated (default {DEFAULT_ADMISSION}); "
                   f"one of: {', '.join(ADMISSION_POLICIES)}; settings as NAME:key=value:..., keys T (age "
                   "limit), PRODUCT (its age limit), heads (the cap on drain targets: aging-guard claims, "
                   "drain-soonest and worst-first GPUs), horizon; worst-first's clock, share, within, front, "
                   "single (sure, own or share), idle, spare and worst; ahead.KIND for every strategy "
                   "(simulations/README.md)")
    g.add_argument("--rho", type=parse_rhos, default=(0.85,),
                   help="target offered load (default 0.85), or several comma-separated (simulate runs each); "
                   "'none' keeps the workload's own timing")
    g.add_argument("--arrivals", choices=protocol_b.ARRIVALS, default="poisson",
                   help="resample into a Poisson stream (default) or compress the trace's own arrival times")
    g.add_argument("--cards", type=positive_int, help="a cluster of N V100 cards, 8 per node, instead of --nodes "
                   f"(default {protocol_b.DEFAULT_CARDS} without --nodes)")
    g.add_argument("--host", action="store_true", help="track node CPU/RAM in protocol B (default: GPU only)")
    g.add_argument("--max-job-cards", type=positive_int, metavar="N",
                   help="drop jobs asking for more than N cards (reported); e.g. 1 for single-card jobs only")
    g.add_argument("--age-limit", type=parse_duration, default=None, metavar="DUR",
                   help=f"T, the age past which a claim starves, for every product (default: the admission "
                   f"strategy's own: worst-first 0; aging-guard {DEFAULT_AGE_LIMIT / 60:.0f}m; drain-soonest by "
                   "size, see packing/QUEUE.md)")
    g.add_argument("--sla", type=parse_duration, default=metrics.DEFAULT_SLA_S, metavar="DUR",
                   help="waits above this count as starvation (default 60m)")
    g.add_argument("--reservation-ttl", type=parse_duration, metavar="DUR",
                   help="admission reserves for this long instead of committing at once")
    g.add_argument("--bind-delay", type=parse_duration, default=0.0, metavar="DUR",
                   help="admission to bind (needs --reservation-ttl; a longer delay lets reservations lapse)")
    g.add_argument("--declare-limits", action="store_true",
                   help="jobs declare their runtime as an enforced limit (lets the aging guard backfill)")
    g.add_argument("--gang", action="store_true",
                   help="run each job of k > 1 whole cards as k one-card pods of one pod group (all start "
                   "together, on any nodes), instead of one k-card pod on one node")


def output_options(ap: argparse.ArgumentParser) -> None:
    """Where ``simulate`` writes its results."""
    g = ap.add_argument_group("output")
    g.add_argument("--json", metavar="PATH", help="write the results as JSON")
    g.add_argument("--csv", metavar="PATH", help="write the results table as CSV")
    g.add_argument("--plots", metavar="DIR", help="write PNG plots into DIR")
    g.add_argument("--out", metavar="DIR", help="write results.json, results.csv and the plots into DIR")
    g.add_argument("--progress", action="store_true", help="progress bar on stderr even when not a terminal")
    g.add_argument("--placements", metavar="PATH",
                   help="protocol B: write every admission (policy, admission, seed, job, node, GPUs, start) as CSV")



def _names(text: str, known: Sequence[str], what: str, flag: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise UsageError(f"{flag}: no {what} given")
    for n in names:
        if n not in known:
            close = difflib.get_close_matches(n, known, n=1)
            raise UsageError(f"{flag}: unknown {what} {n!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
                             + f"; choose one of {', '.join(known)}")
    return names


def chosen_policies(args: argparse.Namespace) -> list[str]:
    """The placement policies asked for (all of them with ``--compare``)."""
    if getattr(args, "compare", False):
        return list(POLICIES)
    return _names(args.policy, list(POLICIES), "policy", "--policy")


def chosen_ties(args: argparse.Namespace) -> list[str]:
    """The tie rules asked for (protocol A sweeps several; protocol B takes one)."""
    return _names(args.ties, TIES, "tie rule", "--ties")


@dataclass(frozen=True)
class AdmissionChoice:
    """An admission strategy with its settings, as written on the command line: ``NAME`` or
    ``NAME:key=value:...`` with keys ``T`` (age limit of every product), a product name (its own age
    limit), ``heads`` (the cap on drain targets: claims holding one under the aging guard, GPUs the
    targets take under drain-soonest and worst-first), ``horizon`` (theirs), ``clock``, ``share``,
    ``within`` and ``front`` (worst-first's multi-card hold-clock ceiling, ``never`` for no multi-card holds,
    its one-GPU-in-N cap on targets, R: a front of several cards holds its targets only once one likely
    frees within R x its wait, 1 by default, ``off`` to hold at once; and its one-GPU-in-N cap on the
    targets the front's shape holds, 8 by default; ``idle`` K: a front of several cards holds only once
    one likely frees within K x its hold clock as well, 2 by default, ``off`` for no such limit; ``spare``: a
    shape of several cards holds at most the GPUs spare over about that long, 12h by default, ``off`` for no
    such limit) and, for every strategy, ``ahead.KIND`` (a signed head start in queue order for a product, or
    ``PRODUCTxN`` for N whole cards: ``ahead.v100-50=-1h`` puts half cards an hour behind their arrival).
    worst-first's seven (clock, share, within, front, idle, spare, worst) are one ``WorstFirstSettings``,
    ``worst_first``."""

    label: str
    name: str
    age_limits: tuple[tuple[str, float], ...] = ()
    age_limit_s: float | None = None  # None: --age-limit
    max_drain_targets: int | None = None  # None: the strategy's default
    drain_horizon_s: float | None = None  # None: the strategy's default
    head_starts: tuple[tuple[str, float], ...] = ()  # (kind, seconds ahead in line); negative: behind
    worst_first: WorstFirstSettings | None = None  # WORST_FIRST_KEYS' settings; None: defaults

    def configure(self, engine: EngineConfig, age_limit_s: float | None) -> EngineConfig:
        """``engine`` running this strategy with its settings; ``age_limit_s`` (--age-limit) where it sets no T."""
        return replace(engine, admission=self.name,
                       age_limit_s=age_limit_s if self.age_limit_s is None else self.age_limit_s,
                       age_limits=self.age_limits, max_drain_targets=self.max_drain_targets,
                       drain_horizon_s=self.drain_horizon_s, head_starts=self.head_starts,
                       worst_first=self.worst_first)


def _or_off(read: Callable[[str], float], off: str, means: float | None) -> Callable[[str], float | None]:
    """``read``, or ``means`` where the value is the word ``off`` (``off``, ``never``); a refusal names the word
    too."""
    def parse(value: str) -> float | None:
        if value.strip() == off:
            return means
        try:
            return read(value)
        except argparse.ArgumentTypeError as e:
            raise argparse.ArgumentTypeError(f"{e} (or {off})") from None
    return parse


def one_of(*words: str) -> Callable[[str], str]:
    """A reader of one of ``words``; anything else is refused with what it takes."""
    def parse(value: str) -> str:
        if value.strip() not in words:
            raise argparse.ArgumentTypeError(f"must be {', '.join(words[:-1])} or {words[-1]}, got {value!r}")
        return value.strip()
    return parse


def either(yes: str, no: str) -> Callable[[str], bool]:
    """A reader of the word ``yes`` (True) or ``no`` (False): ``one_of`` the two, refused alike."""
    read = one_of(yes, no)
    return lambda value: read(value) == yes


# worst-first's keys: the WorstFirstSettings field each sets, and how its value reads
WORST_FIRST_KEYS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "clock": ("hold_clock", _or_off(parse_duration, "never", math.inf)),
    "share": ("hold_share", positive_int),
    "within": ("hold_within", _or_off(positive_number, "off", math.inf)),
    "front": ("front_share", positive_int),
    "single": ("single_front", one_of(*SINGLE_FRONTS)),
    "idle": ("hold_idle", _or_off(positive_number, "off", math.inf)),
    "spare": ("spare_window", _or_off(positive_duration, "off", None)),
    "worst": ("front_worst", either("on", "off")),
}
# a product's own age limit: AGING
SETTINGS = {"T": AGING, "heads": AGING, "horizon": (DRAIN_SOONEST, WORST_FIRST)} | {
    key: (WORST_FIRST,) for key in WORST_FIRST_KEYS}
AHEAD = "ahead."  # the prefix of a head start's key, for every strategy


def parse_admission(text: str) -> AdmissionChoice:
    """``drain-soonest:heads=16:v100-100=0:T=4h`` and the like; UsageError names what is wrong. A key other
    than T, heads and horizon is a product's age limit: :func:`check_admission_products` checks the name."""
    name, *settings = [part.strip() for part in text.strip().split(":")]
    if name not in ADMISSION_POLICIES:
        raise UsageError(f"--admission: unknown admission policy {name!r}; choose one of "
                         f"{', '.join(ADMISSION_POLICIES)}")
    limits: dict[str, float] = {}
    default: float | None = None
    heads: int | None = None
    horizon: float | None = None
    ahead: dict[str, float] = {}
    worst: WorstFirstSettings | None = None  # once a worst-first key is given: its defaults but for those given
    for item in settings:
        key, sep, value = item.partition("=")
        if not sep or not key or not value:
            raise UsageError(f"--admission {text}: setting {item!r} must look like key=value")
        if key.startswith(AHEAD):
            try:
                ahead[key[len(AHEAD):]] = parse_signed_duration(value)
            except argparse.ArgumentTypeError as e:
                raise UsageError(f"--admission {text}: setting {item!r}: {e}") from None
            continue
        if name not in SETTINGS.get(key, AGING):
            what = f"setting {key!r}" if key in SETTINGS else f"an age limit ({key!r})"
            lacks = ("has no hold clock" if key in WORST_FIRST_KEYS else
                     "does not age claims" if name not in AGING else "has no horizon")
            raise UsageError(f"--admission {text}: {what} does not apply to {name}, which {lacks}"
                             f"; it is for {' and '.join(SETTINGS.get(key, AGING))}")
        try:
            if key == "heads":
                heads = positive_int(value)
            elif key == "horizon":
                horizon = parse_duration(value)
            elif key in WORST_FIRST_KEYS:
                field, read = WORST_FIRST_KEYS[key]
                worst = replace(worst or WorstFirstSettings(), **{field: read(value)})
            elif key == "T":
                default = parse_duration(value)
            else:
                limits[key] = parse_duration(value)
        except argparse.ArgumentTypeError as e:
            raise UsageError(f"--admission {text}: setting {item!r}: {e}") from None
    for kind, seconds in ahead.items():
        if abs(seconds) > MAX_HEAD_START:
            raise UsageError(f"--admission {text}: head start {AHEAD}{kind} must be within "
                             f"+-{MAX_HEAD_START / 3600:.0f}h, got {seconds / 3600:g}h")
    return AdmissionChoice(text.strip(), name, tuple(limits.items()), default, heads, horizon, tuple(ahead.items()),
                           worst)


def check_admission_products(choices: Sequence[AdmissionChoice], catalog: Catalog) -> None:
    """Every per-product age limit names a product of ``catalog`` (``t=5m`` is no product: a typo of T), and
    every head start a product or ``PRODUCTxN`` (N >= 2 whole cards of it)."""
    names = [p.name for p in catalog.products]
    wholes = {p.name for p in catalog.products if p.whole}
    for choice in choices:
        for kind, _ in choice.head_starts:
            head, _, count = kind.rpartition("x")
            product, count = (head, count) if head and count.isdigit() else (kind, "")
            if product in (wholes if count else names) and (not count or int(count) >= 2):
                continue
            close = difflib.get_close_matches(product, names, n=1)
            raise UsageError(f"--admission {choice.label}: head start {AHEAD}{kind!r} names no product of the catalog "
                             f"({', '.join(names)}), nor PRODUCTxN for N >= 2 whole cards ({', '.join(sorted(wholes))})"
                             + (f"; did you mean {AHEAD}{close[0]}?" if close and not count else ""))
        for key, _ in choice.age_limits:
            if key in names:
                continue
            known = [*SETTINGS, *names]
            close = [k for k in known if k.lower() == key.lower()] or difflib.get_close_matches(key, known, n=1)
            raise UsageError(f"--admission {choice.label}: {key!r} is neither a setting ({', '.join(SETTINGS)}, "
                             f"{AHEAD}KIND) nor "
                             f"a product of the catalog ({', '.join(names)})"
                             + (f"; did you mean {close[0]!r}?" if close else ""))


def split_admissions(text: str) -> list[str]:
    """The comma-separated admission specs of ``--admission``."""
    return [part.strip() for part in text.split(",") if part.strip()]


def chosen_admissions(args: argparse.Namespace) -> list[AdmissionChoice]:
    """The admission strategies asked for (all of them, at their defaults, with ``--compare`` or with
    ``--compare-admission`` and no ``--admission``)."""
    given = getattr(args, "admission", None)
    compare_all = getattr(args, "compare", False) or (getattr(args, "compare_admission", False) and given is None)
    if compare_all:
        return [AdmissionChoice(n, n) for n in ADMISSION_POLICIES]
    specs = split_admissions(given or DEFAULT_ADMISSION)
    if not specs:
        raise UsageError("--admission: no admission policy given")
    return [parse_admission(spec) for spec in specs]


PLOTS_EXTRA = "pip install 'gpuslice[plots]'"


def plots_missing() -> bool:
    """True where matplotlib (the ``plots`` extra) is not installed: the images and a plain install leave it out."""
    return importlib.util.find_spec("matplotlib") is None


def check_plots(given: str | None, flag: str) -> None:
    """An explicit plot output without matplotlib is refused before any work, saying how to get it."""
    if given and plots_missing():
        raise UsageError(f"{flag} needs matplotlib, which is not installed: {PLOTS_EXTRA} (or leave {flag} out)")


def output_paths(args: argparse.Namespace) -> tuple[str | None, str | None, str | None]:
    """JSON path, CSV path and plot folder; ``--out DIR`` fills those not given (the plots only where
    matplotlib is installed: ``--out`` then writes the results alone)."""
    json_path, csv_path, plots = args.json, args.csv, args.plots
    if args.out:
        out = Path(args.out)
        json_path = json_path or str(out / "results.json")
        csv_path = csv_path or str(out / "results.csv")
        plots = plots or (None if plots_missing() else str(out))
    return json_path, csv_path, plots
