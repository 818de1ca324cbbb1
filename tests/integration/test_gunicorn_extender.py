"""The extender as kube-scheduler meets it: a real gunicorn process on 127.0.0.1, real HTTP.

The burst tests fire hundreds of concurrent filter(+prioritize)+bind sequences for far more
slices than exist, then recount every GPU by brute force from ``GET /state``: no GPU may be
over-committed, every successful bind must hold exactly its slice, and every refusal must be a
clean, well-formed reply.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from extender.cli import status_main
from extender.client import ClientError, ExtenderClient
from extender.samples import binding_args, filter_args, pod
from extender.server import ServerProcess, free_port
from packing.products import load_catalog

from .gunicorn_proc import running_extender

CATALOG = load_catalog()
NODES = [f"node-{i}" for i in range(4)]
CANDIDATES = [*NODES, "cpu-only-node"]
PRODUCTS = [("v100-25", 1), ("v100-50", 1), ("v100-100", 1), ("v100-100", 2)]


@pytest.fixture
def server(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    mode = getattr(request, "param", "strict")
    with running_extender(tmp_path, nodes=len(NODES), gpus_per_node=2, mode=mode, threads=8) as s:
        yield s


def one_pod(client: ExtenderClient, i: int, seed: int) -> dict[str, Any]:
    """filter -> (prioritize) -> bind for one pod, like kube-scheduler; what happened, as data."""
    rng = random.Random(seed * 100_003 + i)
    product, count = PRODUCTS[rng.randrange(len(PRODUCTS))]
    p = pod(f"burst-{seed}-{i}", product, count=count)
    outcome: dict[str, Any] = {"uid": p["metadata"]["uid"], "product": product, "count": count, "bound": None}
    status, reply = client.post("/filter", filter_args(p, CANDIDATES))
    assert status == 200, reply
    assert set(reply) == {"NodeNames", "Nodes", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
    assert reply["Error"] == "", reply["Error"]
    assert isinstance(reply["NodeNames"], list)
    explained = set(reply["NodeNames"]) | set(reply["FailedNodes"]) | set(reply["FailedAndUnresolvableNodes"])
    assert explained <= set(CANDIDATES)
    if not reply["NodeNames"]:  # a pod that fits nowhere gets a reason for every node
        assert explained == set(CANDIDATES)
    assert "UnknownNode" in reply["FailedAndUnresolvableNodes"]["cpu-only-node"]
    feasible = reply["NodeNames"]
    if not feasible:
        outcome["why"] = sorted(set(reply["FailedNodes"].values()) | set(reply["FailedAndUnresolvableNodes"].values()))
        return outcome
    if len(feasible) > 1 and rng.random() < 0.5:
        status, scores = client.post("/prioritize", filter_args(p, feasible))
        assert status == 200 and all(0 <= s["Score"] <= 10 for s in scores), scores
        top = max(s["Score"] for s in scores)
        feasible = [s["Host"] for s in scores if s["Score"] == top]
    node = rng.choice(feasible)
    status, bound = client.post("/bind", binding_args(p, node))
    assert status == 200 and set(bound) == {"Error"}, bound
    if bound["Error"]:
        assert "internal error" not in bound["Error"], bound["Error"]
        assert "no longer fits" in bound["Error"], bound["Error"]  # the only honest reason in this workload
        outcome["bind_error"] = bound["Error"]
    else:
        outcome["bound"] = node
    return outcome


def burst(server: ServerProcess, pods: int, workers: int, seed: int) -> list[dict[str, Any]]:
    """``pods`` sequences from ``workers`` threads, each thread with its own keep-alive connection."""
    local = threading.local()
    clients: list[ExtenderClient] = []
    lock = threading.Lock()

    def run(i: int) -> dict[str, Any]:
        if not hasattr(local, "client"):
            local.client = ExtenderClient(server.url, timeout=30)
            with lock:
                clients.append(local.client)
        return one_pod(local.client, i, seed)

    try:
        with ThreadPoolExecutor(workers) as pool:
            return list(pool.map(run, range(pods)))
    finally:
        for c in clients:
            c.close()


def recount(state: dict[str, Any], outcomes: list[dict[str, Any]]) -> None:
    """Brute force from /state: capacity per GPU against every allocation, and against the binds."""
    gpus = {g["uuid"]: (node["name"], g) for node in state["nodes"] for g in node["gpus"]}
    used: dict[str, list[int]] = {u: [0, 0] for u in gpus}
    for a in state["allocations"]:
        assert len(a["gpus"]) == a["count"] and len(set(a["gpus"])) == a["count"]
        for uuid in a["gpus"]:
            node, _ = gpus[uuid]
            assert node == a["node"]
            used[uuid][0] += a["milli"]
            used[uuid][1] += a["memory_mib"]
    for uuid, (_, g) in gpus.items():
        assert used[uuid][0] <= g["milli"], f"GPU {uuid} over-committed: {used[uuid][0]} milli"
        assert used[uuid][1] <= g["memory_mib"], f"GPU {uuid} memory over-committed"
        assert g["free_milli"] == g["milli"] - used[uuid][0]
        assert g["free_mib"] == g["memory_mib"] - used[uuid][1]
    bound = {o["uid"]: o for o in outcomes if o["bound"]}
    held = {a["pod_uid"]: a for a in state["allocations"] if a["state"] == "bound"}
    assert set(held) == set(bound)
    for uid, o in bound.items():
        assert held[uid]["node"] == o["bound"]
        assert (held[uid]["product"], held[uid]["count"]) == (o["product"], o["count"])
    for a in state["allocations"]:
        if a["state"] == "reserved":  # a filter's hold on a pod that never bound: it lapses
            assert a["pod_uid"] not in bound and a["expires_in_s"] <= state["reservation_ttl_s"]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("server", ["strict", "cooperative"], indirect=True)
def test_a_burst_of_concurrent_sequences_never_over_commits(server: ServerProcess) -> None:
    outcomes = burst(server, pods=600, workers=24, seed=1)
    capacity = len(NODES) * 2 * 1000
    with ExtenderClient(server.url) as client:
        status, state = client.get("/state")
    assert status == 200
    recount(state, outcomes)
    placed = sum(CATALOG.product(o["product"]).milli * o["count"] for o in outcomes if o["bound"])
    assert 0 < placed <= capacity
    waiting = {w["uid"] for w in state["queue"]}
    never = {o["uid"] for o in outcomes if not o["bound"] and "why" in o}
    assert waiting <= never | {o["uid"] for o in outcomes if "bind_error" in o}
    assert len(waiting) > 0  # far more asked than exists: the queue shows who waits


@pytest.mark.timeout(300)
def test_bind_is_idempotent_over_http_and_health_metrics_state_answer(server: ServerProcess) -> None:
    p = pod("again", "v100-50")
    with ExtenderClient(server.url) as client:
        _, reply = client.post("/filter", filter_args(p, NODES))
        node = reply["NodeNames"][0]
        assert client.post("/bind", binding_args(p, node)) == (200, {"Error": ""})
        _, before = client.get("/state")
        assert client.post("/bind", binding_args(p, node)) == (200, {"Error": ""})
        _, after = client.get("/state")
        assert before["allocations"] == after["allocations"]
        assert client.get("/readyz")[0] == 200 and client.get("/healthz")[0] == 200
        status, text = client.request_raw("GET", "/metrics")
        assert status == 200 and b'gpuslice_placements_total{product="v100-50"} 1.0' in text
        status, body = client.request_raw("POST", "/filter", b"{broken")
        assert status == 400 and "error" in json.loads(body)


@pytest.mark.timeout(300)
def test_gpuslice_status_prints_a_running_extenders_state(server: ServerProcess,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    p = pod("shown", "v100-25")
    with ExtenderClient(server.url) as client:
        _, reply = client.post("/filter", filter_args(p, NODES))
        client.post("/bind", binding_args(p, reply["NodeNames"][0]))
        client.post("/filter", filter_args(pod("too-big", "v100-100", count=3), NODES))
    assert status_main(["--url", server.url]) == 0
    out = capsys.readouterr().out
    assert "default/shown" in out and "bound" in out and "default/too-big" in out
    assert status_main(["--url", server.url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["mode"] == "strict"


@pytest.mark.timeout(300)
def test_serve_standalone_demo_runs_the_sample_workload_through_gunicorn_and_exits_0() -> None:
    done = subprocess.run([sys.executable, "-m", "packing.cli", "serve", "--standalone", "--demo"],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "gunicorn pid" in out and "waiting queue" in out and "POST /admin/release" in out
    assert "waits:" in out  # the sample asks for more than exists
    assert "(exit 0)" in out  # the server it started was stopped cleanly


def test_status_reports_an_unreachable_extender() -> None:
    assert status_main(["--url", f"http://127.0.0.1:{free_port()}"]) == 1


@pytest.mark.timeout(120)
def test_gpuslice_serve_standalone_runs_gunicorn_in_process_until_sigterm(tmp_path: Path) -> None:
    port = free_port()
    log = (tmp_path / "serve.log").open("wb")
    argv = [sys.executable, "-m", "packing.cli", "serve", "--standalone", "--nodes", "2", "--gpus-per-node", "2",
            "--port", str(port), "--prefix", "/v1"]
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        client = ExtenderClient(f"http://127.0.0.1:{port}", timeout=5)
        deadline = time.monotonic() + 60
        while True:
            try:
                if client.get("/healthz")[0] == 200:
                    break
            except ClientError:
                assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
                time.sleep(0.1)
        status, reply = client.post("/v1/filter", filter_args(pod("p", "v100-50"), ["node-0", "node-1"]))
        assert status == 200 and reply["NodeNames"] == ["node-0", "node-1"]
        client.close()
    finally:
        os.kill(proc.pid, signal.SIGTERM)
        code = proc.wait(30)
        log.close()
    assert code == 0, (tmp_path / "serve.log").read_text()


def test_gpuslice_serve_refuses_inconsistent_settings(capsys: pytest.CaptureFixture[str]) -> None:
    from extender.cli import main

    assert main(["--standalone", "--port", "0"]) == 2
    assert "port" in capsys.readouterr().err
    assert main(["--standalone", "--nodes", "1", "--gpu-model", "Tesla-T4"]) == 2
    assert "not in the catalog" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--demo"])  # the demo runs without a cluster only
