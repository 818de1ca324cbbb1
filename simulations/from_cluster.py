"""The live cluster as a simulation's start: ``simulate --from-cluster`` and ``plan --from-cluster``.

A snapshot (``Snapshot``) is what a running extender says: ``GET /state`` (the nodes in the
extender's own order, their cards and models, labels and taints; every allocation; the waiting
line) and ``GET /history`` (``packing.demand``: every claim's arrival, admission and end). From it
one run per seed starts (``build_run``):

* **the cluster now** (t0 = the state's time): the same ledger, node order and card ids; the claims
  holding slices keep them and depart after a remaining runtime (below); the waiting line joins
  the queue at t0 with its own arrival times; the policy has observed the history's arrivals and
  departures in their recorded order (its mix and load phase as the extender's);
* **the demand after t0**: the recorded demand, resampled (``arrivals="poisson"``: a Poisson
  stream at the recorded rate × ``demand_scale`` over the recorded span, each arrival a recorded
  claim drawn at random) or replayed (``arrivals="trace"``: the recorded arrival times from t0
  on, each claim ``demand_scale`` times on average); or a trace of the user's (``future``);
* **runtimes**: a claim that ran and departed keeps its runtime; one still running (or whose end was
  lost in a gap) gets a runtime drawn from the departed claims of its product that ran longer than
  it has so far (none: as long again); with ``running_ends="declared"`` a claim that declared one
  (``activeDeadlineSeconds``, ``gpuslice.io/time-limit``) runs exactly that long;
* **gaps** (the extender was not recording): left out of the timeline. Replayed arrivals close
  up over them and the rate counts the recorded time only, so a gap is never idle demand;
* **what-ifs**: cards added (nodes of the cluster's usual size), nodes removed (their claims go
  back in line at t0), demand scaled, and whatever the policy, admission and entitlement options say.

Claims withdrawn while they waited are not replayed (their runtime is unknown; counted in the
notes). The history's catalog must be this run's: a history recorded under another is refused,
naming the products that differ.
"""

from __future__ import annotations

import json
import math
import random
from bisect import bisect_right
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from packing.demand import (
    DEPARTED,
    LOST,
    WITHDRAWN,
    DemandError,
    DemandRow,
    HistoryHeader,
    catalog_differences,
    is_header,
    parse_header,
    parse_row,
)
from packing.node_fit import Taint
from packing.products import Catalog, Request, RequestError
from simulations.cluster import CARDS_PER_NODE, TrackedLedger
from simulations.engine import ClusterStart, RunningClaim
from simulations.traces import Job

ARRIVALS = ("poisson", "trace")
RUNNING_ENDS = ("sampled", "declared")


class SnapshotError(ValueError):
    """A /state or /history that cannot start a simulation; the message says what and where."""


@dataclass(frozen=True, slots=True)
class LiveNode:
    name: str
    cards: tuple[tuple[str, str, int, bool], ...]  # (uuid, model, memory MiB, withdrawn)
    labels: tuple[tuple[str, str], ...] = ()
    taints: tuple[Taint, ...] = ()
    unschedulable: bool = False
    known: bool = True


@dataclass(frozen=True, slots=True)
class Held:
    claim: str
    node: str
    gpus: tuple[str, ...]
    product: str
    count: int


@dataclass(frozen=True, slots=True)
class InLine:
    claim: str
    product: str
    priority: int
    waited_s: float
    namespace: str


@dataclass
class Snapshot:
    """A live cluster as /state and /history describe it (times absolute, Unix seconds)."""

    source: str
    t0: float
    nodes: list[LiveNode]
    held: list[Held]
    line: list[InLine]
    header: HistoryHeader
    rows: list[DemandRow]
    policy: str = ""

    @property
    def by_claim(self) -> dict[str, DemandRow]:
        return {r.claim: r for r in self.rows}

    @property
    def window(self) -> tuple[float, float]:
        """The recorded period whose arrivals are complete: [max(since, complete_since), until]."""
        h = self.header
        return h.origin + max(h.since, h.complete_since), h.origin + h.until

    @property
    def gaps(self) -> list[tuple[float, float]]:
        o = self.header.origin
        return [(o + a, o + b) for a, b in self.header.gaps]

    def recorded_seconds(self) -> float:
        """The window's length less its gaps: the time demand was recorded."""
        start, end = self.window
        lost = sum(max(0.0, min(b, end) - max(a, start)) for a, b in self.gaps)
        return max(0.0, end - start - lost)

    def cards(self) -> int:
        return sum(len(n.cards) for n in self.nodes)


# ---- reading ----------------------------------------------------------------------------------------------


def read_history(data: bytes, where: str) -> tuple[HistoryHeader, list[DemandRow]]:
    """A /history document: its header and rows, times made absolute; SnapshotError naming the line."""
    lines = data.decode("utf-8", "replace").splitlines()
    if not lines or not lines[0].strip():
        raise SnapshotError(f"{where}: empty; a history starts with its header line ({{\"gpuslice_history\": 1, ...}})")
    try:
        first = json.loads(lines[0])
        if not isinstance(first, dict) or not is_header(first):
            raise SnapshotError(f"{where}:1: not a gpuslice history header (export one with gpuslice history "
                                "export)")
        header = parse_header(first)
    except (ValueError, DemandError) as e:
        raise SnapshotError(f"{where}:1: {e}") from None
    rows: list[DemandRow] = []
    for number, text in enumerate(lines[1:], start=2):
        if not text.strip():
            continue
        try:
            doc = json.loads(text)
            if not isinstance(doc, dict):
                raise DemandError("each line must be a JSON object")
            row = parse_row(doc)
        except (ValueError, DemandError) as e:
            raise SnapshotError(f"{where}:{number}: {e}") from None
        rows.append(_absolute(row, header.origin))
    return header, rows


def _absolute(row: DemandRow, origin: float) -> DemandRow:
    def at(x: float | None) -> float | None:
        return None if x is None else x + origin

    return replace(row, arrival=row.arrival + origin, admitted=at(row.admitted), end=at(row.end))


def parse_state(doc: Any, where: str) -> tuple[float | None, list[LiveNode], list[Held], list[InLine], str]:
    """The parts of a /state document a simulation starts from; SnapshotError naming what is missing."""
    try:
        nodes = [LiveNode(str(n["name"]),
                          tuple((str(g["uuid"]), str(g["model"]), int(g["memory_mib"]), bool(g.get("withdrawn")))
                                for g in n["gpus"]),
                          tuple(sorted((str(k), str(v)) for k, v in (n.get("labels") or {}).items())),
                          tuple(Taint(str(t[0]), str(t[1]), str(t[2])) for t in n.get("taints") or ()),
                          bool(n.get("unschedulable", False)), bool(n.get("facts_known", True)))
                 for n in doc["nodes"]]
        held = [Held(str(a["pod_uid"]), str(a["node"]), tuple(str(g) for g in a["gpus"]), str(a["product"]),
                     int(a.get("count") or 1)) for a in doc["allocations"] if a.get("product")]
        line = [InLine(str(w["uid"]), str(w["product"]), int(w.get("priority") or 0), float(w["waiting_s"]),
                       str(w.get("pod") or "default/").split("/", 1)[0]) for w in doc["queue"]]
        t0 = doc.get("wall_time")
        return (None if t0 is None else float(t0)), nodes, held, line, str(doc.get("policy") or "")
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise SnapshotError(f"{where}: not an extender's /state document (gpuslice status --json): {e!r}") from None


def snapshot(state: Any, history: bytes, catalog: Catalog, source: str, where_state: str,
             where_history: str) -> Snapshot:
    """A checked snapshot: the history's catalog is this one, every product known, the cards' models too."""
    header, rows = read_history(history, where_history)
    diff = catalog_differences(header.catalog, catalog)
    if diff:
        raise SnapshotError(f"{where_history}: recorded under another catalog than this run's ({catalog.source}); "
                            f"products that differ: {'; '.join(diff)} (pass the cluster's catalog with --catalog)")
    t0, nodes, held, line, policy = parse_state(state, where_state)
    if t0 is None:
        t0 = header.origin + header.until
    known = {p.name for p in catalog.products}
    unknown = sorted(({h.product for h in held} | {w.product for w in line}) - known)
    if unknown:
        raise SnapshotError(f"{where_state}: claims of product(s) {', '.join(unknown)} this catalog does not offer "
                            "(pass the cluster's catalog with --catalog)")
    if not nodes:
        raise SnapshotError(f"{where_state}: the extender knows no node yet")
    return Snapshot(source, t0, nodes, held, line, header, rows, policy)


def load(source: str, history_path: str | None, catalog: Catalog, fetch: Any = None) -> Snapshot:
    """``--from-cluster``: a saved /state file with ``--history FILE``, or (``fetch``: the URL's
    ``(state, history bytes)``) a running extender's; ``--history`` then replaces the fetched history."""
    if fetch is not None:
        state, history = fetch()
        where_state, where_history = f"{source}/state", f"{source}/history"
    else:
        if not history_path:
            raise SnapshotError(f"--from-cluster {source}: a saved /state needs its history: --history FILE "
                                "(gpuslice history export > FILE)")
        try:
            state = json.loads(Path(source).read_text(encoding="utf-8"))
        except OSError as e:
            raise SnapshotError(f"{source}: cannot read: {e.strerror}") from None
        except ValueError as e:
            raise SnapshotError(f"{source}: not JSON ({e}); save it with gpuslice status --json") from None
        history = b""
        where_state, where_history = source, history_path
    if history_path:
        try:
            history = Path(history_path).read_bytes()
        except OSError as e:
            raise SnapshotError(f"{history_path}: cannot read: {e.strerror}") from None
        where_history = history_path
    return snapshot(state, history, catalog, source, where_state, where_history)


# ---- what-ifs and one seed's run ------------------------------------------------------------------------


@dataclass(frozen=True)
class WhatIf:
    """What the run changes against the live cluster (every field's default: nothing)."""

    add_cards: int = 0
    add_model: str | None = None  # None: the cluster's commonest card
    remove_nodes: tuple[str, ...] = ()
    demand_scale: float = 1.0
    arrivals: str = "poisson"
    running_ends: str = "sampled"
    horizon_s: float | None = None  # resampling: how long after t0 (None: the recorded span)
    future: tuple[Job, ...] | None = None  # the demand after t0 from a trace instead (arrival 0 = t0)

    def __post_init__(self) -> None:
        if self.add_cards < 0:
            raise SnapshotError(f"--add-cards must be >= 0, got {self.add_cards}")
        if not (math.isfinite(self.demand_scale) and self.demand_scale > 0):
            raise SnapshotError(f"--demand-scale must be a positive number, got {self.demand_scale}")
        if self.arrivals not in ARRIVALS:
            raise SnapshotError(f"--arrivals must be one of {', '.join(ARRIVALS)}, got {self.arrivals!r}")
        if self.running_ends not in RUNNING_ENDS:
            raise SnapshotError(f"--running-ends must be one of {', '.join(RUNNING_ENDS)}, got {self.running_ends!r}")


@dataclass
class Notes:
    """What a run had to assume, counted, for the report."""

    withdrawn: int = 0  # recorded claims that left the line: not replayed
    sampled: int = 0  # runtimes drawn (claims still running, lost in a gap, or never started)
    outlived: int = 0  # running longer than every recorded runtime of their product: given as long again
    declared: int = 0  # runtimes taken from a declared limit
    unknown_start: int = 0  # held slices the history has no admission for: taken as started at t0
    requeued: int = 0  # claims on removed nodes, back in line at t0
    added_nodes: list[str] = field(default_factory=list)

    def lines(self, snap: Snapshot) -> list[str]:
        out = []
        h = snap.header
        if h.gaps:
            out.append(f"the history has {len(h.gaps)} gap(s), {h.gap_seconds / 3600:.1f} h in all, when no extender "
                       "recorded: left out of the timeline (not simulated as idle demand)")
        if h.complete_since > h.since:
            out.append(f"claims that ended before {h.complete_since - h.since:.0f} s into the period were pruned by "
                       "the history's bounds: the rate counts the complete part only")
        for n, what in ((self.withdrawn, "recorded claim(s) withdrawn while waiting: not replayed"),
                        (self.sampled, "runtime(s) drawn from the departed claims (still running, lost in a gap, or "
                                       "never started)"),
                        (self.outlived, "claim(s) already ran longer than every recorded runtime of their product: "
                                        "given as long again as they ran"),
                        (self.declared, "runtime(s) taken from the claim's declared limit (--running-ends declared)"),
                        (self.unknown_start, "held slice(s) without an admission in the history: taken as started "
                                             "at the snapshot"),
                        (self.requeued, "claim(s) on removed nodes put back in line at the snapshot")):
            if n:
                out.append(f"{n} {what}")
        if self.added_nodes:
            out.append(f"added {len(self.added_nodes)} node(s): {', '.join(self.added_nodes[:4])}"
                       + (" ..." if len(self.added_nodes) > 4 else ""))
        return out


class Runtimes:
    """Recorded runtimes per product, to draw a claim's runtime from (see the module docstring)."""

    def __init__(self, rows: Sequence[DemandRow]) -> None:
        done = [r for r in rows if r.runtime is not None and r.runtime > 0 and r.product]
        self.by_product: dict[str, list[float]] = {}
        for r in done:
            self.by_product.setdefault(_shape(r.product or "", r.count), []).append(r.runtime or 0.0)
        self.all = sorted(r.runtime or 0.0 for r in done)
        for v in self.by_product.values():
            v.sort()

    def draw(self, rng: random.Random, product: str, count: int, elapsed: float, notes: Notes) -> float:
        """A total runtime above ``elapsed`` for a claim of ``product`` x ``count``."""
        notes.sampled += 1
        for pool in (self.by_product.get(_shape(product, count), []), self.all):
            i = bisect_right(pool, elapsed)
            if i < len(pool):
                return pool[rng.randrange(i, len(pool))]
        notes.outlived += 1
        return 2 * elapsed if elapsed > 0 else 3600.0


def _shape(product: str, count: int) -> str:
    return product if count == 1 else f"{count}x{product}"


def request_of(catalog: Catalog, product: str, count: int, row: DemandRow | None) -> Request:
    """The claim's request as the extender read it: product, count, pinned model, node constraints."""
    try:
        request = catalog.request(product, count, model=row.model if row is not None else None)
    except RequestError as e:
        raise SnapshotError(f"claim {row.claim if row else product}: {e}") from None
    if row is not None and row.constraints is not None:
        request = replace(request, constraints=row.constraints)
    return request


def build_ledger(snap: Snapshot, whatif: WhatIf, catalog: Catalog, notes: Notes) -> TrackedLedger:
    """The live nodes in the extender's order (cards, models, labels, taints), the removed ones left out, the
    added ones last."""
    missing = sorted(set(whatif.remove_nodes) - {n.name for n in snap.nodes})
    if missing:
        some = ", ".join(n.name for n in snap.nodes[:5]) + (" ..." if len(snap.nodes) > 5 else "")
        raise SnapshotError(f"--remove-node: no node {', '.join(missing)} in the cluster (it has {some})")
    ledger = TrackedLedger()
    order = 0
    for node in snap.nodes:
        if node.name in whatif.remove_nodes:
            continue
        ledger.add_node(node.name, [(u, m, mib) for u, m, mib, _ in node.cards], order=order,
                        labels=dict(node.labels), taints=node.taints, unschedulable=node.unschedulable,
                        known=node.known)
        order += 1
    if whatif.add_cards:
        sizes = Counter(len(n.cards) for n in snap.nodes if n.cards)
        per_node = sizes.most_common(1)[0][0] if sizes else CARDS_PER_NODE
        models = Counter(m for n in snap.nodes for _, m, _, _ in n.cards)
        label = whatif.add_model or (models.most_common(1)[0][0] if models else "")
        memory = catalog.model_memory_mib(label)
        if memory is None:
            raise SnapshotError(f"--add-cards: card model {label!r} is not in the catalog ({catalog.source})")
        left, k = whatif.add_cards, 0
        while left > 0:
            take = min(per_node, left)
            name = f"whatif-{k}"
            ledger.add_node(name, [(f"{name}/gpu-{i}", label, memory) for i in range(take)], order=order)
            notes.added_nodes.append(name)
            order += 1
            left -= take
            k += 1
    return ledger


def warmup(rows: Sequence[DemandRow], t0: float, catalog: Catalog) -> tuple[Request | None, ...]:
    """What the extender's policy observed before t0, in order: each claim's request as it arrived, and
    None for each admitted claim that departed (the load phase counts only those)."""
    events: list[tuple[float, int, DemandRow]] = []
    for r in rows:
        if r.arrival <= t0 and r.product:
            events.append((r.arrival, 1, r))
        if r.ended == DEPARTED and r.admitted is not None and r.end is not None and r.end <= t0:
            events.append((r.end, 0, r))
    events.sort(key=lambda e: (e[0], e[1]))
    return tuple(request_of(catalog, r.product or "", r.count, r) if kind else None for _, kind, r in events)


def build_run(snap: Snapshot, whatif: WhatIf, catalog: Catalog, seed: int
              ) -> tuple[TrackedLedger, list[Job], list[Request], ClusterStart, Notes]:
    """One seed's run: the ledger now, the jobs (the line at t0 first, then the demand after t0) with their
    requests, where it starts, and what had to be assumed."""
    rng = random.Random(seed)
    notes = Notes()
    rows = snap.by_claim
    runtimes = Runtimes(snap.rows)
    ledger = build_ledger(snap, whatif, catalog, notes)
    t0 = snap.t0

    def runtime_of(row: DemandRow | None, product: str, count: int, elapsed: float) -> float:
        if whatif.running_ends == "declared" and row is not None and row.time_limit is not None:
            notes.declared += 1
            return row.time_limit
        return runtimes.draw(rng, product, count, elapsed, notes)

    running: list[RunningClaim] = []
    jobs: list[tuple[Job, Request]] = []
    line: set[str] = set()  # the jobs waiting at t0 (their arrival the policy saw before t0)
    for h in snap.held:
        row = rows.get(h.claim)
        request = request_of(catalog, h.product, h.count, row)
        if row is None or row.admitted is None:
            notes.unknown_start += 1
        started = row.admitted if row is not None and row.admitted is not None else t0
        elapsed = max(0.0, t0 - started)
        total = runtime_of(row, h.product, h.count, elapsed)
        remaining = max(0.0, total - elapsed)
        namespace = row.namespace if row is not None else "default"
        if h.node in whatif.remove_nodes:  # evicted: back in line now (its policy saw it arrive long ago)
            line.add(h.claim)
            if remaining <= 0:
                continue  # it would end now anyway
            notes.requeued += 1
            jobs.append((Job(h.claim, t0, remaining, request.milli, request.count,
                             request.memory_mib, h.product, namespace=namespace,
                             priority=row.priority if row is not None else 0), request))
            continue
        running.append(RunningClaim(h.claim, request, h.node, h.gpus, namespace, remaining,
                                    row.time_limit if row is not None else None))
    for w in snap.line:
        line.add(w.claim)
        row = rows.get(w.claim)
        request = request_of(catalog, w.product, _count(row), row)
        total = runtime_of(row, w.product, request.count, 0.0)
        jobs.append((Job(w.claim, t0 - w.waited_s, total, request.milli, request.count, request.memory_mib,
                         w.product, namespace=row.namespace if row is not None else w.namespace,
                         priority=w.priority), request))
    jobs.extend(_future(snap, whatif, catalog, rng, runtimes, notes))
    jobs.sort(key=lambda jr: jr[0].arrival)
    withdrawn = tuple(u for n in snap.nodes for u, _, _, w in n.cards if w and u in ledger.gpus)
    start = ClusterStart(t0, tuple(running), warmup(snap.rows, t0, catalog), withdrawn, frozenset(line))
    return ledger, [j for j, _ in jobs], [r for _, r in jobs], start, notes


def _count(row: DemandRow | None) -> int:
    return row.count if row is not None else 1


def _recorded(snap: Snapshot) -> Any:
    """Absolute time -> recorded time (the gaps before it taken out)."""
    gaps = sorted(snap.gaps)

    def at(t: float) -> float:
        cut = 0.0
        for a, b in gaps:
            if t >= b:
                cut += b - a
            elif t > a:
                cut += t - a
        return t - cut

    return at


def _future(snap: Snapshot, whatif: WhatIf, catalog: Catalog, rng: random.Random, runtimes: Runtimes,
            notes: Notes) -> list[tuple[Job, Request]]:
    """The demand after t0: the user's trace, or the recorded demand resampled or replayed."""
    t0 = snap.t0
    if whatif.future is not None:
        given: list[tuple[Job, Request]] = []
        for j in whatif.future:
            if j.product is None:
                raise SnapshotError(f"--trace job {j.name}: --from-cluster replays catalog products; it asks for "
                                    f"{j.milli} milli")
            try:
                request = catalog.request(j.product, j.count, model=j.model)
            except RequestError as e:
                raise SnapshotError(f"--trace job {j.name}: {e}") from None
            given.append((replace(j, arrival=t0 + j.arrival), request))
        return given
    start, end = snap.window
    pool = [r for r in snap.rows if start <= r.arrival <= end and r.product]
    notes.withdrawn += sum(1 for r in pool if r.ended == WITHDRAWN)
    pool = [r for r in pool if r.ended != WITHDRAWN]
    if not pool:
        return []

    def runtime(r: DemandRow) -> float:
        if r.runtime is not None and r.runtime > 0:
            return r.runtime
        if whatif.running_ends == "declared" and r.time_limit is not None:
            notes.declared += 1
            return r.time_limit
        elapsed = 0.0
        if r.admitted is not None:  # running at the snapshot, or lost in a gap: it ran at least this long
            stop = r.end if r.ended == LOST and r.end is not None else snap.t0
            elapsed = max(0.0, stop - r.admitted)
        return runtimes.draw(rng, r.product or "", r.count, elapsed, notes)

    def job(r: DemandRow, at: float, k: int) -> tuple[Job, Request]:
        request = request_of(catalog, r.product or "", r.count, r)
        name = r.claim if k == 0 else f"{r.claim}#{k}"
        return Job(name, at, runtime(r), request.milli, request.count, request.memory_mib, r.product,
                   namespace=r.namespace, priority=r.priority), request

    out: list[tuple[Job, Request]] = []
    if whatif.arrivals == "trace":
        rec = _recorded(snap)
        base = rec(start)
        for r in pool:
            copies = int(whatif.demand_scale) + (rng.random() < whatif.demand_scale % 1)
            for k in range(copies):
                out.append(job(r, t0 + rec(r.arrival) - base, k))
        return out
    span = snap.recorded_seconds()
    if span <= 0:
        raise SnapshotError("the history records no time to take a rate from (its window is empty or all gaps): "
                            "replay it with --arrivals trace, or export a longer --since")
    horizon = whatif.horizon_s if whatif.horizon_s is not None else span
    rate = len(pool) / span * whatif.demand_scale
    t, k = t0, 0
    while True:
        t += rng.expovariate(rate)
        if t > t0 + horizon:
            return out
        out.append(job(pool[rng.randrange(len(pool))], t, k + 1))
        k += 1


def entitlements_from(text: str, where: str, catalog: Catalog) -> tuple[tuple[str, Any], ...]:
    """``--entitlements FILE``: the ConfigMap gpuslice-entitlements as JSON (``kubectl get cm -o json``), its
    ``data`` as a JSON object, or ``namespace: v100-25=8,...`` lines; SnapshotError naming a bad one."""
    from packing.entitlements import parse_configmap

    data: Mapping[str, Any] | None
    try:
        doc = json.loads(text)
    except ValueError:
        doc = None
    if doc is not None:
        data = doc.get("data", doc) if isinstance(doc, dict) else None
        if not isinstance(data, dict):
            raise SnapshotError(f"{where}: expected a JSON object of namespace: caps (or the ConfigMap)")
    else:
        data = {}
        for number, line in enumerate(text.splitlines(), start=1):
            body = line.split("#", 1)[0].strip()
            if not body:
                continue
            namespace, sep, caps = body.partition(":")
            if not sep or not namespace.strip():
                raise SnapshotError(f"{where}:{number}: expected 'namespace: v100-25=8,v100-100=2'")
            data[namespace.strip()] = caps.strip().strip('"')
    good, bad = parse_configmap(data, catalog)
    if bad:
        raise SnapshotError(f"{where}: {'; '.join(bad[k] for k in sorted(bad))}")
    return tuple(sorted(good.items()))
