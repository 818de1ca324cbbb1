"""Regression on the real ``openb`` trace: the published FGD baselines, GPU models, our own trace format.

The trace is research-only data kept outside the project; these tests find it through
``$GPUSLICE_TRACES`` (``tests/traces.py``): they skip, saying why, without it, and fail when it
names a folder without them, or under ``CI=true``. One seed each: it lands within about 0.8 point of a 10-seed mean.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from packing.products import load_catalog
from simulations.cli import simulate_main
from simulations.cluster import card_model_for
from simulations.protocol_a import ProtocolAConfig, pod_requests, run_seed
from simulations.traces import Job, read_openb_nodes, read_openb_pods, write_jobs
from tests.traces import require_openb


@pytest.fixture(scope="module")
def openb() -> Path:
    return require_openb()


@pytest.fixture(scope="module")
def default_trace(openb: Path) -> tuple[list, list]:  # type: ignore[type-arg]
    nodes, _ = read_openb_nodes(openb / "openb_node_list_gpu_node.csv")
    pods, _ = read_openb_pods(openb / "openb_pod_list_default.csv")
    return nodes, pods


@pytest.mark.parametrize("policy, published", [("go-best-fit", 7.14), ("random", 13.70), ("fgd", 4.77)])
def test_protocol_a_reproduces_the_published_baselines(default_trace: tuple[list, list],  # type: ignore[type-arg]
                                                       policy: str, published: float) -> None:
    nodes, pods = default_trace
    catalog = load_catalog()
    requests = pod_requests(pods, catalog, "none")
    run = run_seed(nodes, requests, card_model_for(catalog, "none"), ProtocolAConfig(policy=policy), seed=42)
    assert run.unallocated_gpu_pct_at_100 == pytest.approx(published, abs=0.8)


def test_gpu_models_reproduce_fgds_gpuspec33_figure(openb: Path, tmp_path: Path) -> None:
    out = tmp_path / "spec.json"
    code = simulate_main(["--nodes", str(openb / "openb_node_list_gpu_node.csv"), "--pods",
                          str(openb / "openb_pod_list_gpuspec33.csv"), "--seeds", "42", "--policy", "fgd",
                          "--json", str(out)])
    assert code == 0
    # 12.16 published; with gpu_spec ignored the figure was default's 4.8
    assert json.loads(out.read_text())["unallocated_gpu_pct_at_100"] == pytest.approx(12.16, abs=0.3)


def test_our_format_honours_cpu_and_ram_and_models_like_openb(default_trace: tuple[list, list],  # type: ignore[type-arg]
                                                              openb: Path, tmp_path: Path) -> None:
    _, pods = default_trace
    jobs = [Job(name=p.name, arrival=float(i), duration=None, milli=p.gpu_milli, count=p.num_gpu,
                cpu_milli=p.cpu_milli, memory_mib=p.memory_mib, model=p.gpu_spec or None) for i, p in enumerate(pods)]
    trace = tmp_path / "default.csv"
    write_jobs(trace, jobs)
    nodes = str(openb / "openb_node_list_gpu_node.csv")
    figures = []
    for source in (["--pods", str(openb / "openb_pod_list_default.csv")], ["--trace", str(trace)]):
        out = tmp_path / "out.json"
        assert simulate_main(["--nodes", nodes, *source, "--protocol", "a", "--seeds", "42", "--policy", "best-fit",
                              "--json", str(out)]) == 0
        figures.append(json.loads(out.read_text())["unallocated_gpu_pct_at_100"])
    assert figures[0] == pytest.approx(figures[1], abs=1e-9)  # the same pods, the same answer, whatever the format


def test_the_cli_contract_on_the_real_trace(openb: Path, tmp_path: Path) -> None:
    out = tmp_path / "a.json"
    code = simulate_main(["--nodes", str(openb / "openb_node_list_gpu_node.csv"), "--pods",
                          str(openb / "openb_pod_list_default.csv"), "--protocol", "a", "--seeds", "42",
                          "--policy", "best-fit", "--json", str(out)])
    assert code == 0
    data = json.loads(out.read_text())
    assert data["cards"] == 6212 and data["nodes"] == 1213
    assert 4.5 < data["unallocated_gpu_pct_at_100"] < 6.5  # GPU-level best fit: 5.66 % in the notes
