"""Turning trace rows into ``packing`` requests, and ``openb`` pods into timed jobs.

Rounding modes: ``none`` keeps free-form ``gpu_milli`` (GPU memory 0, as FGD does), ``slices``
rounds every request up to the smallest catalog product that holds it.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace

from packing.products import Catalog, Request, RequestError
from simulations.traces import Job, OpenbPod

ROUNDINGS = ("none", "slices")
DAY_S = 86400.0
DEFAULT_RUNTIME_CAP_S = 2 * DAY_S  # the reference protocol B study's cap
MIN_RUNTIME_S = 1.0  # deletion == scheduled happens in the trace; a zero-length job is not an event


class WorkloadError(ValueError):
    """A trace row cannot become a request under the chosen catalog and rounding."""


def _rounded(catalog: Catalog, milli: int, count: int, cpu: int, mem: int, model: str | None) -> Request:
    product = catalog.round_up(milli, model)
    if product is None and model is not None:
        raise WorkloadError(f"no product in {catalog.source} is for GPU model {model!r}: slices cannot honour "
                            "that pin (use --rounding none to keep the cluster's own GPU models)")
    if product is None:
        raise WorkloadError(f"no product in {catalog.source} holds {milli} milli")
    return catalog.request(product.name, count, cpu_milli=cpu, host_memory_mib=mem, model=model)


def request_for(milli: int, count: int, cpu: int, mem: int, catalog: Catalog, rounding: str,
                product: str | None = None, gpu_memory_mib: int = 0, model: str | None = None) -> Request:
    """The request one workload makes; WorkloadError when it cannot be one."""
    try:
        if product is not None:
            return catalog.request(product, count, cpu_milli=cpu, host_memory_mib=mem, model=model)
        if count == 0:
            return Request(milli=0, memory_mib=0, count=0, cpu_milli=cpu, host_memory_mib=mem)
        if rounding == "slices":
            return _rounded(catalog, milli, count, cpu, mem, model)
        return Request(milli=milli, memory_mib=gpu_memory_mib, count=count, model=model, cpu_milli=cpu,
                       host_memory_mib=mem)
    except RequestError as e:
        raise WorkloadError(str(e)) from None


def pod_request(pod: OpenbPod, catalog: Catalog, rounding: str) -> Request:
    """An ``openb`` pod's request; its ``gpu_spec`` (``V100M16|V100M32``) is the model it may run on."""
    return request_for(pod.gpu_milli, pod.num_gpu, pod.cpu_milli, pod.memory_mib, catalog, rounding,
                       model=pod.gpu_spec or None)


def job_request(job: Job, catalog: Catalog, rounding: str) -> Request:
    return request_for(job.milli, job.count, job.cpu_milli, job.memory_mib, catalog, rounding,
                       job.product, job.gpu_memory_mib, job.model)


def size_class(request: Request) -> str:
    """The name waits are reported under: the product, or share/whole for free-form sizes."""
    if request.gpu_less:
        return "cpu-only"
    base = request.product or ("whole" if request.whole else "share")
    return base if request.count == 1 else f"{base}x{request.count}"


@dataclass(frozen=True)
class RuntimeCap:
    """What capping the trace's runtimes did (the long tail is truncated at the trace's end)."""

    cap_s: float | None
    pods: int
    jobs: int
    dropped_never_ran: int
    sampled_never_ran: int
    capped: int
    gpu_seconds_raw: float
    gpu_seconds_capped: float

    @property
    def gpu_time_removed_pct(self) -> float:
        return 100.0 * (1 - self.gpu_seconds_capped / self.gpu_seconds_raw) if self.gpu_seconds_raw else 0.0

    def as_dict(self) -> dict[str, float | int | None]:
        return {
            "runtime_cap_s": self.cap_s,
            "pods": self.pods,
            "jobs": self.jobs,
            "dropped_never_ran": self.dropped_never_ran,
            "sampled_never_ran": self.sampled_never_ran,
            "capped_jobs": self.capped,
            "capped_pct": 100.0 * self.capped / self.jobs if self.jobs else 0.0,
            "gpu_seconds_raw": self.gpu_seconds_raw,
            "gpu_seconds_capped": self.gpu_seconds_capped,
            "gpu_time_removed_pct": self.gpu_time_removed_pct,
        }


def borrow_runtimes(pods: Sequence[OpenbPod], donors: Sequence[OpenbPod], seed: int = 0) -> list[OpenbPod]:
    """``pods`` without times (the ``multigpu*`` lists) given runtimes drawn from ``donors`` of the same
    kind: the same card count and sharing or not, else (no such donor) any whole-card donor.

    Borrowed pods arrive at 0: only resampled (Poisson) arrivals make sense for them.
    """
    rng = random.Random(seed)
    by_kind: dict[tuple[int, bool], list[float]] = {}
    for d in donors:
        if d.runtime is not None and d.num_gpu > 0:
            by_kind.setdefault((d.num_gpu, d.gpu_milli < 1000), []).append(d.runtime)
    whole = [r for (count, share), rs in by_kind.items() if not share for r in rs]
    out: list[OpenbPod] = []
    for p in pods:
        if p.creation_time is not None or p.num_gpu == 0:
            out.append(p)
            continue
        pool = by_kind.get((p.num_gpu, p.gpu_milli < 1000)) or (whole if p.gpu_milli == 1000 else [])
        if not pool:
            raise WorkloadError(f"no donor pod with a runtime for {p.name} ({p.num_gpu} x {p.gpu_milli} milli)")
        out.append(replace(p, creation_time=0.0, scheduled_time=0.0, deletion_time=rng.choice(pool)))
    return out


def openb_jobs(pods: Sequence[OpenbPod], cap_s: float | None = DEFAULT_RUNTIME_CAP_S, never_ran: str = "drop",
               seed: int = 0, namespace_from_qos: bool = True,
               keep_cpu_only: bool = False) -> tuple[list[Job], RuntimeCap]:
    """``openb`` pods as timed jobs: arrival = creation, runtime = deletion − scheduled, capped.

    ``never_ran``: ``drop`` pods that were never scheduled, or ``sample`` a runtime for them from
    the pods that ran. CPU-only pods are dropped unless ``keep_cpu_only`` (they hold no card).
    """
    if never_ran not in ("drop", "sample"):
        raise WorkloadError(f"never_ran must be drop or sample, got {never_ran!r}")
    if cap_s is not None and cap_s <= 0:
        raise WorkloadError(f"runtime cap must be positive, got {cap_s}")
    rng = random.Random(seed)
    timed = [p for p in pods if p.creation_time is not None]
    if not timed:
        raise WorkloadError("these pods carry no creation_time: protocol B needs a pod list with times")
    observed = [r for p in timed if (r := p.runtime) is not None]
    jobs: list[Job] = []
    dropped = sampled = capped = 0
    raw_total = capped_total = 0.0
    for p in timed:
        if p.num_gpu == 0 and not keep_cpu_only:
            continue
        runtime = p.runtime
        if runtime is None:
            if never_ran == "drop" or not observed:
                dropped += 1
                continue
            runtime = rng.choice(observed)
            sampled += 1
        runtime = max(MIN_RUNTIME_S, runtime)
        kept = runtime if cap_s is None else min(runtime, cap_s)
        capped += kept < runtime
        raw_total += runtime * p.gpu_demand_milli / 1000
        capped_total += kept * p.gpu_demand_milli / 1000
        assert p.creation_time is not None
        jobs.append(Job(
            name=p.name, arrival=p.creation_time, duration=kept, milli=p.gpu_milli, count=p.num_gpu,
            cpu_milli=p.cpu_milli, memory_mib=p.memory_mib, model=p.gpu_spec or None,
            namespace=(p.qos or "default") if namespace_from_qos else "default",
        ))
    jobs.sort(key=lambda j: j.arrival)
    report = RuntimeCap(cap_s, len(pods), len(jobs), dropped, sampled, capped, raw_total, capped_total)
    return jobs, report
