"""Trace readers: the Alibaba ``openb`` node and pod lists, and gpuslice's own trace format.

Every reader returns plain records plus a ``ReadReport``. A bad row either raises a
``TraceError`` naming the file and line (``strict=True``, the default) or is skipped and
counted (``strict=False``): the caller chooses, nothing is silently dropped.

Our own format (CSV with a header, or JSON Lines with the same keys), one workload per row:

=================  ==========================================================================
``arrival``        seconds since the trace start (float, >= 0), required
``duration``       run time in seconds (float, > 0); empty: runs until the simulation ends
``product``        a catalog product (``v100-25``), or empty when ``milli`` is given
``milli``          free-form milli-GPU per card (1..1000), used when ``product`` is empty
``gpu_memory_mib`` free-form GPU memory per card in MiB (default 0)
``count``          cards (default 1; > 1 only for whole cards; 0 with no product/milli: CPU-only)
``cpu_milli``      host CPU request in millicores (default 0)
``memory_mib``     host memory request in MiB (default 0)
``namespace``      tenant (default ``default``)
``priority``       integer, higher first (default 0)
``model``          optional GPU model pattern the workload needs
``name``           optional identifier (default ``job-<line>``)
=================  ==========================================================================
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

OPENB_NODE_COLUMNS = ("sn", "cpu_milli", "memory_mib", "gpu", "model")
OPENB_POD_COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli")
OPENB_POD_TIME_COLUMNS = ("creation_time", "deletion_time", "scheduled_time")
JOB_COLUMNS = ("arrival", "duration", "product", "milli", "gpu_memory_mib", "count", "cpu_milli", "memory_mib",
               "namespace", "priority", "model", "name")


class TraceError(ValueError):
    """A trace file is unreadable or has a bad row; the message names the file and line."""


@dataclass
class ReadReport:
    """What a reader did: rows read, rows skipped (with the first few reasons)."""

    path: str
    rows: int = 0
    skipped: int = 0
    reasons: list[str] = field(default_factory=list)

    def skip(self, message: str) -> None:
        self.skipped += 1
        if len(self.reasons) < 10:  # enough to diagnose, bounded for huge files
            self.reasons.append(message)


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One node of a node list: CPU, RAM and ``gpus`` cards of ``model``."""

    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str


@dataclass(frozen=True, slots=True)
class OpenbPod:
    """One row of an ``openb`` pod list; times are None in files without them (``multigpu*``)."""

    name: str
    cpu_milli: int
    memory_mib: int
    num_gpu: int
    gpu_milli: int
    gpu_spec: str = ""
    qos: str = ""
    phase: str = ""
    creation_time: float | None = None
    deletion_time: float | None = None
    scheduled_time: float | None = None

    @property
    def runtime(self) -> float | None:
        """deletion − scheduled, or None for a pod that never ran (or a file without times)."""
        if self.scheduled_time is None or self.deletion_time is None:
            return None
        return max(0.0, self.deletion_time - self.scheduled_time)

    @property
    def gpu_demand_milli(self) -> int:
        return self.num_gpu * self.gpu_milli


@dataclass(frozen=True, slots=True)
class Job:
    """One workload of a trace, in gpuslice's own terms (see the module docstring)."""

    name: str
    arrival: float
    duration: float | None
    milli: int
    count: int = 1
    gpu_memory_mib: int = 0
    product: str | None = None
    cpu_milli: int = 0
    memory_mib: int = 0
    namespace: str = "default"
    priority: int = 0
    model: str | None = None

    @property
    def gpu_less(self) -> bool:
        return self.count == 0

    @property
    def demand_milli(self) -> int:
        return self.milli * self.count


# ---- small parsing helpers ------------------------------------------------------------------


def _int(raw: Mapping[str, Any], key: str, default: int | None = None, minimum: int = 0) -> int:
    value = raw.get(key)
    if value is None or value == "":
        if default is None:
            raise ValueError(f"missing {key}")
        return default
    try:
        number = int(value) if not isinstance(value, float) or value.is_integer() else None
    except (TypeError, ValueError):
        number = None
    if number is None or isinstance(value, bool):
        raise ValueError(f"{key} must be an integer, got {value!r}")
    if number < minimum:
        raise ValueError(f"{key} must be >= {minimum}, got {number}")
    return number


def _float(raw: Mapping[str, Any], key: str, required: bool, positive: bool = False) -> float | None:
    value = raw.get(key)
    if value is None or value == "":
        if required:
            raise ValueError(f"missing {key}")
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{key} must be a number, got {value!r}") from None
    if isinstance(value, bool) or not math.isfinite(number) or number < 0 or (positive and number == 0):
        raise ValueError(f"{key} must be a finite {'positive' if positive else 'non-negative'} number, got {value!r}")
    return number


def _text(raw: Mapping[str, Any], key: str) -> str:
    value = raw.get(key)
    return "" if value is None else str(value).strip()


# the columns that tell each format apart, and the option that reads it
_FORMATS = ((("sn", "gpu", "model"), "an openb node list: that is what --nodes reads"),
            (("num_gpu", "gpu_milli"), "an openb pod list: that is what --pods reads"),
            (("arrival",), "a trace in our own format: that is what --trace reads"))


def _looks_like(header: Sequence[str], required: tuple[str, ...]) -> str:
    """'; it looks like X: that is what --flag reads' when the header is another format's ('' otherwise)."""
    for columns, what in _FORMATS:
        if set(columns) <= set(header) and not set(columns) <= set(required):
            return f"; it looks like {what}"
    return ""


def _not_text(path: Path, e: UnicodeDecodeError) -> TraceError:
    return TraceError(f"{path}: not a text file (no UTF-8 at byte {e.start}): is it the right file?")


def _open_csv(path: Path, required: tuple[str, ...]) -> tuple[csv.DictReader[str], Any]:
    try:
        handle = path.open(newline="", encoding="utf-8")
    except OSError as e:
        raise TraceError(f"{path}: cannot read: {e.strerror}") from e
    reader = csv.DictReader(handle)
    try:
        header = reader.fieldnames or []
    except UnicodeDecodeError as e:
        handle.close()
        raise _not_text(path, e) from e
    except csv.Error as e:
        handle.close()
        raise TraceError(f"{path}:1: not CSV ({e})") from e
    missing = [c for c in required if c not in header]
    if missing:
        handle.close()
        raise TraceError(f"{path}:1: missing column(s) {', '.join(missing)} (header: {','.join(header) or 'empty'})"
                         + _looks_like(header, required))
    return reader, handle


def _rows(path: Path, required: tuple[str, ...], parse: Callable[[dict[str, str], int], T],
          strict: bool, report: ReadReport) -> list[T]:
    reader, handle = _open_csv(path, required)
    with handle:
        try:
            return _parsed(path, reader, parse, strict, report)
        except UnicodeDecodeError as e:
            raise _not_text(path, e) from e
        except csv.Error as e:
            raise TraceError(f"{path}:{reader.line_num}: not CSV ({e})") from e


def _parsed(path: Path, reader: csv.DictReader[str], parse: Callable[[dict[str, str], int], T], strict: bool,
            report: ReadReport) -> list[T]:
    out: list[T] = []
    for row in reader:
        line = reader.line_num
        try:
            if None in row or any(v is None for v in row.values()):
                raise ValueError("wrong number of fields")
            out.append(parse(row, line))
            report.rows += 1
        except ValueError as e:
            message = f"{path}:{line}: {e}"
            if strict:
                raise TraceError(message) from None
            report.skip(message)
    return out


# ---- openb --------------------------------------------------------------------------------------


def _openb_node(row: dict[str, str], line: int) -> NodeSpec:
    name = _text(row, "sn")
    if not name:
        raise ValueError("empty node name (sn)")
    gpus = _int(row, "gpu")
    model = _text(row, "model")
    if gpus > 0 and not model:
        raise ValueError(f"node {name} has {gpus} GPU(s) but no model")
    return NodeSpec(name, _int(row, "cpu_milli"), _int(row, "memory_mib"), gpus, model)


def read_openb_nodes(path: str | Path, strict: bool = True) -> tuple[list[NodeSpec], ReadReport]:
    """Read an ``openb_node_list_*.csv``; duplicate node names are bad rows too."""
    p = Path(path)
    report = ReadReport(str(p))
    seen: set[str] = set()

    def parse(row: dict[str, str], line: int) -> NodeSpec:
        node = _openb_node(row, line)
        if node.name in seen:
            raise ValueError(f"node {node.name} listed twice")
        seen.add(node.name)
        return node

    return _rows(p, OPENB_NODE_COLUMNS, parse, strict, report), report


def _openb_pod(row: dict[str, str], line: int) -> OpenbPod:
    name = _text(row, "name") or f"pod-{line}"
    num_gpu = _int(row, "num_gpu")
    gpu_milli = _int(row, "gpu_milli")
    if gpu_milli > 1000:
        raise ValueError(f"gpu_milli must be within 0..1000, got {gpu_milli}")
    if (num_gpu == 0) != (gpu_milli == 0):
        raise ValueError(f"num_gpu {num_gpu} with gpu_milli {gpu_milli}: a CPU-only pod has both 0")
    if num_gpu > 1 and gpu_milli != 1000:
        raise ValueError(f"{num_gpu} GPUs of {gpu_milli} milli: multi-GPU pods use whole GPUs")
    creation = _float(row, "creation_time", False)
    deletion = _float(row, "deletion_time", False)
    scheduled = _float(row, "scheduled_time", False)
    if scheduled is not None and deletion is not None and deletion < scheduled:
        raise ValueError(f"deletion_time {deletion} before scheduled_time {scheduled}")
    return OpenbPod(name, _int(row, "cpu_milli"), _int(row, "memory_mib"), num_gpu, gpu_milli,
                    _text(row, "gpu_spec"), _text(row, "qos"), _text(row, "pod_phase"), creation, deletion, scheduled)


def read_openb_pods(path: str | Path, strict: bool = True) -> tuple[list[OpenbPod], ReadReport]:
    """Read an ``openb_pod_list_*.csv`` (with or without the time columns)."""
    p = Path(path)
    report = ReadReport(str(p))
    return _rows(p, OPENB_POD_COLUMNS, _openb_pod, strict, report), report


# ---- our own format -----------------------------------------------------------------------------


def _job(raw: Mapping[str, Any], line: int) -> Job:
    unknown = sorted(k for k in raw if k not in JOB_COLUMNS)
    if unknown:
        raise ValueError(f"unknown field(s) {', '.join(unknown)}")
    product = _text(raw, "product") or None
    has_milli = _text(raw, "milli") != ""
    if product is not None and has_milli:
        raise ValueError("give either product or milli, not both")
    milli = _int(raw, "milli", 0) if has_milli else 0
    if milli > 1000:
        raise ValueError(f"milli must be within 0..1000, got {milli}")
    default_count = 1 if product is not None or milli > 0 else 0
    count = _int(raw, "count", default_count)
    if product is None and (count == 0) != (milli == 0):
        raise ValueError(f"count {count} with milli {milli}: a CPU-only workload has both 0")
    if product is not None and count == 0:
        raise ValueError(f"product {product} with count 0")
    if count > 1 and product is None and milli != 1000:
        raise ValueError(f"{count} cards of {milli} milli: only whole cards may be counted")
    priority_raw = _text(raw, "priority")
    try:
        priority = int(priority_raw) if priority_raw else 0
    except ValueError:
        raise ValueError(f"priority must be an integer, got {priority_raw!r}") from None
    arrival = _float(raw, "arrival", True)
    assert arrival is not None
    return Job(
        name=_text(raw, "name") or f"job-{line}",
        arrival=arrival,
        duration=_float(raw, "duration", False, positive=True),
        milli=milli,
        count=count,
        gpu_memory_mib=_int(raw, "gpu_memory_mib", 0),
        product=product,
        cpu_milli=_int(raw, "cpu_milli", 0),
        memory_mib=_int(raw, "memory_mib", 0),
        namespace=_text(raw, "namespace") or "default",
        priority=priority,
        model=_text(raw, "model") or None,
    )


def read_jobs(path: str | Path, strict: bool = True) -> tuple[list[Job], ReadReport]:
    """Read our trace format: ``.jsonl``/``.ndjson`` as JSON Lines, anything else as CSV.

    Rows come back sorted by arrival (stable), whatever their order in the file.
    """
    p = Path(path)
    report = ReadReport(str(p))
    if p.suffix.lower() in (".jsonl", ".ndjson"):
        jobs = _read_jsonl(p, strict, report)
    else:
        jobs = _rows(p, ("arrival",), _job, strict, report)
    jobs.sort(key=lambda j: j.arrival)
    return jobs, report


def _read_jsonl(path: Path, strict: bool, report: ReadReport) -> list[Job]:
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise TraceError(f"{path}: cannot read: {e.strerror}") from e
    except UnicodeDecodeError as e:
        raise _not_text(path, e) from e
    out: list[Job] = []
    for number, text in enumerate(lines, start=1):
        if not text.strip():
            continue
        try:
            raw = json.loads(text)
            if not isinstance(raw, dict):
                raise ValueError("each line must be a JSON object")
            out.append(_job(raw, number))
            report.rows += 1
        except (ValueError, json.JSONDecodeError) as e:
            message = f"{path}:{number}: {e}"
            if strict:
                raise TraceError(message) from None
            report.skip(message)
    return out


def job_row(job: Job) -> dict[str, str]:
    """One job as the strings our CSV format stores (inverse of the reader)."""
    return {
        "arrival": repr(job.arrival),
        "duration": "" if job.duration is None else repr(job.duration),
        "product": job.product or "",
        "milli": "" if job.product is not None else str(job.milli),
        "gpu_memory_mib": str(job.gpu_memory_mib),
        "count": str(job.count),
        "cpu_milli": str(job.cpu_milli),
        "memory_mib": str(job.memory_mib),
        "namespace": job.namespace,
        "priority": str(job.priority),
        "model": job.model or "",
        "name": job.name,
    }


def write_jobs(path: str | Path, jobs: Iterable[Job]) -> None:
    """Write ``jobs`` in our format: JSON Lines for ``.jsonl``, CSV otherwise."""
    p = Path(path)
    rows = [job_row(j) for j in jobs]
    if p.suffix.lower() in (".jsonl", ".ndjson"):
        with p.open("w", encoding="utf-8") as f:
            for r in rows:
                f.write(json.dumps({k: v for k, v in r.items() if v != ""}) + "\n")
        return
    with p.open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=list(JOB_COLUMNS))
        writer.writeheader()
        writer.writerows(rows)
