"""Trace rows to requests (free-form and rounded), openb runtimes and their cap, synthetic load."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from packing.products import load_catalog
from simulations.synthetic import SyntheticError, SyntheticSpec, compress, generate, resample
from simulations.traces import Job, OpenbPod
from simulations.workload import WorkloadError, openb_jobs, request_for, size_class

CATALOG = load_catalog()


@pytest.mark.parametrize("milli, product", [(50, "v100-25"), (250, "v100-25"), (251, "v100-50"), (470, "v100-50"),
                                            (500, "v100-50"), (810, "v100-100"), (1000, "v100-100")])
def test_slices_round_up_to_the_smallest_product(milli: int, product: str) -> None:
    r = request_for(milli, 1, 3000, 4096, CATALOG, "slices")
    assert (r.product, r.cpu_milli, r.host_memory_mib) == (product, 3000, 4096)
    assert r.milli >= milli and r.memory_mib == CATALOG.product(product).memory_mib


def test_free_form_keeps_milli_and_no_gpu_memory() -> None:
    r = request_for(470, 1, 3000, 4096, CATALOG, "none")
    assert (r.milli, r.memory_mib, r.product, r.model) == (470, 0, None, None)
    assert size_class(r) == "share"


def test_multi_card_and_cpu_only_requests() -> None:
    multi = request_for(1000, 8, 1, 1, CATALOG, "slices")
    assert (multi.product, multi.count, size_class(multi)) == ("v100-100", 8, "v100-100x8")
    cpu = request_for(0, 0, 12500, 1024, CATALOG, "slices")
    assert cpu.gpu_less and size_class(cpu) == "cpu-only"


def test_unknown_product_is_a_workload_error() -> None:
    with pytest.raises(WorkloadError, match="unknown product"):
        request_for(0, 1, 0, 0, CATALOG, "slices", product="a100-33")


def pod(name: str, gpus: int, milli: int, created: float, scheduled: float | None, deleted: float) -> OpenbPod:
    return OpenbPod(name, 1000, 1024, gpus, milli, creation_time=created, scheduled_time=scheduled,
                    deletion_time=deleted)


def test_openb_runtimes_are_capped_and_reported() -> None:
    pods = [pod("short", 1, 500, 0, 10, 110), pod("long", 1, 1000, 5, 5, 5 + 10 * 86400),
            pod("never", 1, 250, 7, None, 50), pod("cpu", 0, 0, 8, 8, 100)]
    jobs, cap = openb_jobs(pods, cap_s=86400.0)
    assert [(j.name, j.duration) for j in jobs] == [("short", 100.0), ("long", 86400.0)]
    assert (cap.capped, cap.dropped_never_ran, cap.jobs) == (1, 1, 2)
    assert cap.gpu_seconds_raw == pytest.approx(0.5 * 100 + 10 * 86400)
    assert cap.gpu_time_removed_pct == pytest.approx(100 * (1 - (50 + 86400) / (50 + 864000)))


def test_never_ran_pods_can_get_a_sampled_runtime() -> None:
    pods = [pod("a", 1, 500, 0, 0, 300), pod("b", 1, 500, 1, None, 2)]
    jobs, cap = openb_jobs(pods, cap_s=None, never_ran="sample", seed=3)
    assert [j.duration for j in jobs] == [300.0, 300.0] and cap.sampled_never_ran == 1


def test_pods_without_times_cannot_feed_protocol_b() -> None:
    with pytest.raises(WorkloadError, match="creation_time"):
        openb_jobs([OpenbPod("x", 1, 1, 1, 500)])


@settings(max_examples=15, deadline=None)
@given(rho=st.floats(0.1, 1.5), seed=st.integers(0, 10_000))
def test_synthetic_load_is_close_to_the_target(rho: float, seed: int) -> None:
    spec = SyntheticSpec(cards=32, rho=rho, jobs=3000)
    jobs = generate(spec, seed)
    span = jobs[-1].arrival  # arrivals start after 0
    work = sum(spec.product_milli[j.product or ""] * j.count * (j.duration or 0) for j in jobs)
    realised = work / (32 * 1000 * span)
    assert abs(realised - rho) / rho < 0.1  # Poisson noise of the span: sd about 1/sqrt(3000)
    assert generate(spec, seed) == jobs  # deterministic for a seed
    assert all(j.duration is not None and 1 <= j.duration <= spec.runtime_cap_s for j in jobs)


def test_compress_hits_the_target_exactly() -> None:
    jobs = [Job(f"j{i}", arrival=100.0 * i, duration=50.0, milli=500) for i in range(11)]
    out, factor = compress(jobs, [500] * 11, 0.5, 1000)
    span = out[-1].arrival - out[0].arrival
    assert sum(0.5 * 50 for _ in out) * 1000 / (1000 * span) == pytest.approx(0.5)
    assert factor == pytest.approx(0.5 * 1000 * 1000 / (11 * 500 * 50))
    assert [j.duration for j in out] == [50.0] * 11


def test_resample_keeps_size_and_runtime_together() -> None:
    pool = [Job("small", 0, 10.0, 250), Job("big", 0, 1000.0, 1000)]
    jobs, picks = resample(pool, [250, 1000], 500, 0.8, 8000, seed=1)
    assert len(jobs) == len(picks) == 500
    for j, i in zip(jobs, picks, strict=True):
        assert (j.milli, j.duration) == (pool[i].milli, pool[i].duration)
    assert all(a.arrival <= b.arrival for a, b in itertools.pairwise(jobs))


def test_bad_synthetic_specs_are_refused() -> None:
    with pytest.raises(SyntheticError):
        SyntheticSpec(rho=0)
    with pytest.raises(SyntheticError):
        SyntheticSpec(mix=(("v100-33", 1, 1.0),))
    with pytest.raises(SyntheticError):
        SyntheticSpec(rho=math.nan)
