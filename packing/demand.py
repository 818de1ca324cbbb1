"""The demand history's format: one claim per row, in gpuslice's own trace format, and its header.

The extender records every slice claim it sees (``extender/history``) and the simulator replays
it (``simulations/from_cluster.py``); both read this one definition. A history is JSON Lines:

* line 1, the header (``HistoryHeader``): ``{"gpuslice_history": 1, ...}``: the time origin (Unix
  seconds; every time below is seconds after it), the period covered (``since`` .. ``until``),
  ``complete_since`` (every claim that arrived at or after it is present: older closed claims
  were dropped by the age and size bounds), the ``gaps`` (periods the extender was not
  recording: simulate them as gaps, never as idle demand), the catalog it was recorded under and
  whether rows carry pod names;
* then one row per claim (``DemandRow``), with the keys of our trace format (``JOB_COLUMNS``:
  ``arrival``, ``duration`` = end − admitted for a claim that ran and ended, ``product``,
  ``count``, ``namespace``, ``priority``, ``model``, ``name`` only with ``--history-names``) and
  the history's own (``HISTORY_COLUMNS``: ``claim``, ``admitted``, ``node``, ``gpus``, ``ended``,
  ``end``, ``time_limit``, ``constraints``).

``ended`` says how a claim left: ``departed`` (it ran and its pod ended), ``withdrawn`` (it left
the line before it got a slice), ``lost`` (it ended while the history was not recording: its
end is unknown, its runtime at least ``end`` − ``admitted``); absent while it waits or runs.

Pure: no clock, no I/O. Times are floats; the extender passes its wall clock.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from packing.node_fit import NodeConstraints, Requirement, Term, Toleration
from packing.products import Catalog

FORMAT_KEY = "gpuslice_history"
FORMAT_VERSION = 1
JOB_COLUMNS = ("arrival", "duration", "product", "milli", "gpu_memory_mib", "count", "cpu_milli", "memory_mib",
               "namespace", "priority", "model", "name")
HISTORY_COLUMNS = ("claim", "admitted", "node", "gpus", "ended", "end", "time_limit", "constraints")
DEPARTED, WITHDRAWN, LOST = "departed", "withdrawn", "lost"
ENDINGS = (DEPARTED, WITHDRAWN, LOST)


class DemandError(ValueError):
    """A history line that is not a header or row of this format; the message says what is wrong."""


@dataclass(frozen=True, slots=True)
class DemandRow:
    """One claim as the history knows it; times in seconds of the history's clock (absolute here)."""

    claim: str
    arrival: float
    product: str | None
    count: int = 1
    namespace: str = "default"
    priority: int = 0
    model: str | None = None
    constraints: NodeConstraints | None = None
    time_limit: float | None = None  # declared runtime (activeDeadlineSeconds, gpuslice.io/time-limit)
    name: str | None = None  # namespace/name, only when the extender was asked to keep names
    admitted: float | None = None  # when it got its slice (bound)
    node: str | None = None
    gpus: tuple[str, ...] = ()
    ended: str | None = None  # DEPARTED, WITHDRAWN, LOST; None while it waits or runs
    end: float | None = None

    @property
    def open(self) -> bool:
        return self.ended is None

    @property
    def runtime(self) -> float | None:
        """end − admitted for a claim that ran and departed; None otherwise."""
        if self.ended != DEPARTED or self.admitted is None or self.end is None:
            return None
        return max(0.0, self.end - self.admitted)

    def admit(self, at: float, node: str, gpus: tuple[str, ...]) -> DemandRow:
        # a claim the line had given up on (standalone: no filter asked for a while) may still bind: it is open again
        return replace(self, admitted=at, node=node, gpus=tuple(gpus), ended=None, end=None)

    def close(self, ending: str, at: float) -> DemandRow:
        if ending not in ENDINGS:
            raise DemandError(f"unknown ending {ending!r}; one of {', '.join(ENDINGS)}")
        return replace(self, ended=ending, end=at)

    def to_json(self, origin: float = 0.0) -> dict[str, Any]:
        """The row as our trace format's keys, times relative to ``origin``; empty fields left out."""
        out: dict[str, Any] = {"claim": self.claim, "arrival": _t(self.arrival - origin)}
        runtime = self.runtime
        if runtime is not None and runtime > 0:
            out["duration"] = _t(runtime)
        if self.product is not None:
            out["product"] = self.product
        out["count"] = self.count
        out["namespace"] = self.namespace
        out["priority"] = self.priority
        if self.model is not None:
            out["model"] = self.model
        if self.name is not None:
            out["name"] = self.name
        if self.time_limit is not None:
            out["time_limit"] = _t(self.time_limit)
        if self.constraints is not None:
            out["constraints"] = constraints_to_json(self.constraints)
        if self.admitted is not None:
            out["admitted"] = _t(self.admitted - origin)
            out["node"] = self.node
            out["gpus"] = "|".join(self.gpus)
        if self.ended is not None:
            out["ended"] = self.ended
            if self.end is not None:
                out["end"] = _t(self.end - origin)
        return out

    def encode(self, origin: float = 0.0) -> bytes:
        """One JSON line (with its newline)."""
        return (json.dumps(self.to_json(origin), separators=(",", ":")) + "\n").encode("utf-8")


def _t(x: float) -> float:
    return round(x, 6)


@dataclass(frozen=True, slots=True)
class HistoryHeader:
    """The first line of a history (see the module docstring); times relative to ``origin``."""

    origin: float
    since: float
    until: float
    complete_since: float
    gaps: tuple[tuple[float, float], ...] = ()
    catalog: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    names: bool = False
    claims: int = 0

    def to_json(self) -> dict[str, Any]:
        return {FORMAT_KEY: FORMAT_VERSION, "origin": self.origin, "since": _t(self.since), "until": _t(self.until),
                "complete_since": _t(self.complete_since), "gaps": [[_t(a), _t(b)] for a, b in self.gaps],
                "catalog": {k: dict(v) for k, v in self.catalog.items()}, "names": self.names, "claims": self.claims}

    def encode(self) -> bytes:
        return (json.dumps(self.to_json(), separators=(",", ":")) + "\n").encode("utf-8")

    @property
    def gap_seconds(self) -> float:
        return sum(b - a for a, b in self.gaps)


def catalog_signature(catalog: Catalog) -> dict[str, dict[str, Any]]:
    """What a history records of its catalog: each product's model, size and memory."""
    return {p.name: {"model": p.model, "milli": p.milli, "memory_mib": p.memory_mib} for p in catalog.products}


def catalog_differences(recorded: Mapping[str, Mapping[str, Any]], catalog: Catalog) -> list[str]:
    """How the catalog a history was recorded under differs from ``catalog``, one phrase per product
    ([] when they agree): the simulator refuses such a history, naming them."""
    here = catalog_signature(catalog)
    out: list[str] = []
    for name in sorted(set(recorded) | set(here)):
        a, b = recorded.get(name), here.get(name)
        if a is None:
            out.append(f"{name} (only in this catalog)")
        elif b is None:
            out.append(f"{name} (only in the history's)")
        elif dict(a) != b:
            diff = ", ".join(f"{k} {a.get(k)} there, {b[k]} here" for k in b if a.get(k) != b[k])
            out.append(f"{name} ({diff})")
    return out


# ---- node constraints as JSON ------------------------------------------------------------------------


def constraints_to_json(c: NodeConstraints) -> dict[str, Any]:
    """A pod's node constraints in summary: selector, required affinity terms and tolerations."""
    out: dict[str, Any] = {}
    if c.node_selector:
        out["selector"] = dict(c.node_selector)
    if c.affinity is not None:
        out["affinity"] = [{"expressions": [[r.key, r.operator, list(r.values)] for r in t.match_expressions],
                            "fields": [[r.key, r.operator, list(r.values)] for r in t.match_fields]}
                           for t in c.affinity]
    if c.tolerations:
        out["tolerations"] = [[t.key, t.operator, t.value, t.effect] for t in c.tolerations]
    return out


def constraints_from_json(doc: Any) -> NodeConstraints | None:
    """The inverse of ``constraints_to_json``; DemandError for a malformed value."""
    if doc is None:
        return None
    try:
        if not isinstance(doc, Mapping) or set(doc) - {"selector", "affinity", "tolerations"}:
            raise TypeError
        selector = doc.get("selector") or {}
        if not isinstance(selector, Mapping):
            raise TypeError
        affinity = None
        if "affinity" in doc:
            affinity = tuple(Term(tuple(_requirement(r) for r in t["expressions"]),
                                  tuple(_requirement(r) for r in t["fields"])) for t in doc["affinity"])
        tolerations = tuple(Toleration(*(_text(x) for x in t)) for t in doc.get("tolerations") or ())
        found = NodeConstraints(tuple(sorted((_text(k), _text(v)) for k, v in selector.items())), affinity, tolerations)
    except (TypeError, KeyError, ValueError):
        raise DemandError(f"constraints must be {{selector, affinity, tolerations}} as gpuslice writes them, "
                          f"got {json.dumps(doc)[:200]}") from None
    return None if found.empty else found


def _requirement(r: Any) -> Requirement:
    key, operator, values = r
    return Requirement(_text(key), _text(operator), tuple(_text(v) for v in values))


def _text(x: Any) -> str:
    if not isinstance(x, str):
        raise TypeError
    return x


# ---- reading ---------------------------------------------------------------------------------------------


def is_header(doc: Mapping[str, Any]) -> bool:
    return FORMAT_KEY in doc


def parse_header(doc: Mapping[str, Any]) -> HistoryHeader:
    """A header line's object; DemandError naming what is wrong."""
    version = doc.get(FORMAT_KEY)
    if version != FORMAT_VERSION:
        raise DemandError(f"history format version {version!r}; this gpuslice reads version {FORMAT_VERSION}")
    try:
        gaps = tuple((float(a), float(b)) for a, b in doc.get("gaps") or ())
        catalog = doc.get("catalog") or {}
        if not isinstance(catalog, Mapping) or not all(isinstance(v, Mapping) for v in catalog.values()):
            raise TypeError
        header = HistoryHeader(float(doc["origin"]), float(doc["since"]), float(doc["until"]),
                               float(doc.get("complete_since", doc["since"])), gaps, dict(catalog),
                               bool(doc.get("names", False)), int(doc.get("claims", 0)))
    except (KeyError, TypeError, ValueError):
        raise DemandError("a history header needs origin, since, until (numbers), gaps as [[from, to], ...] "
                          "and catalog as {product: {model, milli, memory_mib}}") from None
    if not all(math.isfinite(x) for x in (header.origin, header.since, header.until)):
        raise DemandError("history header times must be finite")
    if any(b < a for a, b in header.gaps):
        raise DemandError("a history gap ends before it starts")
    return header


def parse_row(doc: Mapping[str, Any]) -> DemandRow:
    """A row's object (times relative to its header's origin, as written); DemandError naming what is wrong."""
    unknown = sorted(k for k in doc if k not in JOB_COLUMNS and k not in HISTORY_COLUMNS)
    if unknown:
        raise DemandError(f"unknown field(s) {', '.join(unknown)}")
    claim = doc.get("claim")
    if not isinstance(claim, str) or not claim:
        raise DemandError("a history row needs its claim id")
    ended = doc.get("ended")
    if ended is not None and ended not in ENDINGS:
        raise DemandError(f"ended must be one of {', '.join(ENDINGS)}, got {ended!r}")
    gpus = doc.get("gpus") or ""
    if not isinstance(gpus, str):
        raise DemandError(f"gpus must be uuids separated by '|', got {gpus!r}")
    arrival = _number(doc, "arrival", True)
    assert arrival is not None
    row = DemandRow(
        claim=claim, arrival=arrival, product=_opt_text(doc, "product"),
        count=int(_number(doc, "count", False) or 1), namespace=_opt_text(doc, "namespace") or "default",
        priority=int(_number(doc, "priority", False, signed=True) or 0), model=_opt_text(doc, "model"),
        constraints=constraints_from_json(doc.get("constraints")), time_limit=_number(doc, "time_limit", False),
        name=_opt_text(doc, "name"), admitted=_number(doc, "admitted", False), node=_opt_text(doc, "node"),
        gpus=tuple(g for g in gpus.split("|") if g), ended=ended, end=_number(doc, "end", False))
    if row.admitted is not None and not row.node:
        raise DemandError("an admitted claim names its node")
    if row.end is not None and row.end < row.arrival:
        raise DemandError(f"claim {claim} ends ({row.end}) before it arrives ({row.arrival})")
    duration = doc.get("duration")
    if duration not in (None, "") and row.runtime is not None and abs(float(duration) - row.runtime) > 1e-3:
        raise DemandError(f"claim {claim}: duration {duration} is not end - admitted ({row.runtime:.6f})")
    return row


def _number(doc: Mapping[str, Any], key: str, required: bool, signed: bool = False) -> float | None:
    value = doc.get(key)
    if value is None or value == "":
        if required:
            raise DemandError(f"missing {key}")
        return None
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise DemandError(f"{key} must be a number, got {value!r}")
    try:
        number = float(value)
    except ValueError:
        raise DemandError(f"{key} must be a number, got {value!r}") from None
    if not math.isfinite(number) or (number < 0 and not signed):
        raise DemandError(f"{key} must be a finite {'' if signed else 'non-negative '}number, got {value!r}")
    return number


def _opt_text(doc: Mapping[str, Any], key: str) -> str | None:
    value = doc.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise DemandError(f"{key} must be text, got {value!r}")
    return value


# ---- the period asked for ------------------------------------------------------------------------------

_AGO = re.compile(r"\s*(\d+(?:\.\d+)?)\s*(s|m|min|h|d|w)\s*")
_UNITS = {"s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}


def parse_since(text: str, now: float) -> float:
    """``?since=``: a duration back from ``now`` (``90m``, ``7d``, ``2w``), Unix seconds, or an ISO 8601 time
    with its zone (``2026-05-01T00:00:00Z``); ValueError saying which forms it takes."""
    from datetime import datetime

    body = text.strip()
    m = _AGO.fullmatch(body)
    if m:
        return now - float(m.group(1)) * _UNITS[m.group(2)]
    try:
        value = float(body)
    except ValueError:
        try:
            moment = datetime.fromisoformat(body.replace("Z", "+00:00"))
        except ValueError:
            moment = None
        if moment is None or moment.tzinfo is None:
            raise ValueError(f"since must be a duration back from now (7d, 12h, 90m), Unix seconds or an ISO 8601 "
                             f"time with its zone (2026-05-01T00:00:00Z), got {text!r}") from None
        return moment.timestamp()
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"since in Unix seconds must be a non-negative number, got {text!r}")
    return value


def encode_history(header: HistoryHeader, rows: Iterable[DemandRow]) -> bytes:
    """A whole history as JSON Lines: the header, then the rows relative to its origin."""
    return header.encode() + b"".join(r.encode(header.origin) for r in rows)
