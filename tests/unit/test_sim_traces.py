"""Trace readers: openb node/pod lists and our own CSV / JSON Lines format."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulations.traces import (
    Job,
    TraceError,
    read_jobs,
    read_openb_nodes,
    read_openb_pods,
    write_jobs,
)

NODES = """sn,cpu_milli,memory_mib,gpu,model
n0,96000,393216,8,G2
n1,104000,524288,2,T4
n2,32000,131072,0,
"""

PODS = """name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time
p0,12000,16384,1,1000,,LS,Running,0,500,10
p1,6000,12288,1,460,,BE,Succeeded,5,100,7
p2,8000,8192,0,0,,LS,Pending,9,20,
p3,3000,4096,4,1000,,LS,Failed,11,40,12
"""


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def test_openb_nodes_are_read_with_their_cards(tmp_path: Path) -> None:
    nodes, report = read_openb_nodes(write(tmp_path, "nodes.csv", NODES))
    assert [(n.name, n.gpus, n.model) for n in nodes] == [("n0", 8, "G2"), ("n1", 2, "T4"), ("n2", 0, "")]
    assert nodes[1].cpu_milli == 104000 and nodes[1].memory_mib == 524288
    assert (report.rows, report.skipped) == (3, 0)


def test_openb_pods_carry_times_and_runtime(tmp_path: Path) -> None:
    pods, report = read_openb_pods(write(tmp_path, "pods.csv", PODS))
    assert report.rows == 4
    assert [p.runtime for p in pods] == [490.0, 93.0, None, 28.0]
    assert pods[1].gpu_milli == 460 and pods[1].qos == "BE"
    assert pods[3].gpu_demand_milli == 4000


def test_openb_pods_without_time_columns(tmp_path: Path) -> None:
    text = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1000,1024,2,1000\n"
    pods, _ = read_openb_pods(write(tmp_path, "multigpu.csv", text))
    assert pods[0].creation_time is None and pods[0].runtime is None and pods[0].num_gpu == 2


@pytest.mark.parametrize("row, why", [
    ("p9,1000,1024,1,1200,,LS,Running,0,1,0", "gpu_milli"),
    ("p9,1000,1024,2,500,,LS,Running,0,1,0", "whole GPUs"),
    ("p9,1000,1024,0,300,,LS,Running,0,1,0", "CPU-only"),
    ("p9,abc,1024,1,300,,LS,Running,0,1,0", "cpu_milli"),
    ("p9,1000,1024,1,300,,LS,Running,0,5,9", "deletion_time"),
    ("p9,1000,1024,1,300", "wrong number"),
])
def test_bad_pod_row_names_file_and_line(tmp_path: Path, row: str, why: str) -> None:
    path = write(tmp_path, "pods.csv", PODS + row + "\n")
    with pytest.raises(TraceError) as e:
        read_openb_pods(path)
    assert f"{path}:6:" in str(e.value) and why in str(e.value)


def test_bad_rows_can_be_skipped_and_counted(tmp_path: Path) -> None:
    path = write(tmp_path, "pods.csv", PODS + "p9,1000,1024,1,1200,,LS,Running,0,1,0\np10,x,1,1,1,,,,,,\n")
    pods, report = read_openb_pods(path, strict=False)
    assert len(pods) == 4 and report.skipped == 2 and report.rows == 4
    assert report.reasons[0].startswith(f"{path}:6:")


def test_missing_column_is_an_error_on_line_one(tmp_path: Path) -> None:
    path = write(tmp_path, "nodes.csv", "sn,cpu_milli,gpu,model\nn0,1,1,G2\n")
    with pytest.raises(TraceError, match=r":1: missing column\(s\) memory_mib"):
        read_openb_nodes(path)


def test_duplicate_node_is_a_bad_row(tmp_path: Path) -> None:
    path = write(tmp_path, "nodes.csv", NODES + "n0,1000,1024,1,G2\n")
    with pytest.raises(TraceError, match=r":5: node n0 listed twice"):
        read_openb_nodes(path)


def test_unreadable_file_is_a_trace_error(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="cannot read"):
        read_jobs(tmp_path / "absent.csv")


def test_own_csv_format_defaults_and_sorting(tmp_path: Path) -> None:
    text = "arrival,duration,product,milli,count,namespace,priority\n" \
           "30,600,v100-25,,,team-a,5\n" \
           "10,,,700,,,\n" \
           "20,60,,1000,4,,\n" \
           "25,60,,,,,\n"
    jobs, report = read_jobs(write(tmp_path, "jobs.csv", text))
    assert report.rows == 4
    assert [j.arrival for j in jobs] == [10.0, 20.0, 25.0, 30.0]
    free, multi, cpu_only, sliced = jobs
    assert (free.milli, free.count, free.duration, free.product) == (700, 1, None, None)
    assert (multi.milli, multi.count) == (1000, 4)
    assert cpu_only.gpu_less
    assert (sliced.product, sliced.namespace, sliced.priority, sliced.count) == ("v100-25", "team-a", 5, 1)


@pytest.mark.parametrize("row, why", [
    ("1,10,v100-25,250,,,", "either product or milli"),
    ("1,10,,500,2,,", "only whole cards"),
    ("-1,10,,500,,,", "arrival"),
    ("1,0,,500,,,", "duration"),
    ("1,10,,500,,,high", "priority"),
    (",10,,500,,,", "missing arrival"),
])
def test_own_format_bad_rows(tmp_path: Path, row: str, why: str) -> None:
    path = write(tmp_path, "jobs.csv", "arrival,duration,product,milli,count,namespace,priority\n" + row + "\n")
    with pytest.raises(TraceError) as e:
        read_jobs(path)
    assert f"{path}:2:" in str(e.value) and why in str(e.value)


def test_jsonl_errors_name_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, "jobs.jsonl", '{"arrival": 1, "milli": 250}\n\n[1, 2]\n{"arrival": 2, "color": "red"}\n')
    with pytest.raises(TraceError, match=r"jobs.jsonl:3: each line must be a JSON object"):
        read_jobs(path)
    jobs, report = read_jobs(path, strict=False)
    assert len(jobs) == 1 and report.skipped == 2
    assert "unknown field(s) color" in report.reasons[1]


jobs_strategy = st.lists(
    st.builds(
        Job,
        name=st.text(alphabet="abcxyz-0123456789", min_size=1, max_size=8),
        arrival=st.floats(min_value=0, max_value=1e7, allow_nan=False),
        duration=st.none() | st.floats(min_value=0.001, max_value=1e7, allow_nan=False),
        milli=st.sampled_from([50, 250, 470, 810, 1000]),
        count=st.just(1),
        gpu_memory_mib=st.integers(0, 32768),
        product=st.none(),
        cpu_milli=st.integers(0, 128000),
        memory_mib=st.integers(0, 1 << 20),
        namespace=st.sampled_from(["default", "team-a", "b"]),
        priority=st.integers(-5, 100),
        model=st.none() | st.just("Tesla-V100-*-32GB"),
    ),
    max_size=20,
)


@settings(max_examples=40, deadline=None)
@given(jobs=jobs_strategy, suffix=st.sampled_from([".csv", ".jsonl"]))
def test_write_then_read_is_identity(tmp_path_factory: pytest.TempPathFactory, jobs: list[Job], suffix: str) -> None:
    path = tmp_path_factory.mktemp("trace") / f"jobs{suffix}"
    write_jobs(path, jobs)
    back, report = read_jobs(path)
    assert report.skipped == 0
    assert back == sorted(jobs, key=lambda j: j.arrival)
