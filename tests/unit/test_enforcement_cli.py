"""``gpuslice agent``: the demo, argument errors, the no-driver paths, start-up order, /healthz and /metrics."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from io import StringIO
from pathlib import Path

import pynvml
import pytest
from prometheus_client.parser import text_string_to_metric_families

from enforcement import cli, real_gpu_check
from enforcement.agent import AgentConfig, run
from enforcement.cli import main
from enforcement.clock import SimClock, SystemClock
from enforcement.endpoints import Endpoints
from enforcement.metrics import AgentMetrics
from enforcement.nvml import PynvmlBackend, bounded
from enforcement.pacer import PacerParams
from enforcement.simgpu import GIB, FakeNVML, SimGPU, SimProcess, Steps, Workload
from enforcement.simulate import Simulation, demo_scenario
from packing.cli import main as gpuslice
from packing.kube.client import Kube, KubeError


def test_simulate_runs_the_demo_and_ends_by_itself(capsys: pytest.CaptureFixture[str]) -> None:
    assert gpuslice(["agent", "--simulate", "--duration", "30", "--report-every", "10"]) == 0
    out = capsys.readouterr().out
    assert out.count("GPU POD") == 3  # a table every 10 simulated seconds
    assert "default/train-a" in out and "dcgm-exporter (host)" in out
    assert "infer-c: over cap at 21.00 s, killed at" in out
    assert "host processes touched: 0" in out
    assert "after stop, frozen managed cgroups: none" in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--simulate", "--max-freeze", "2"], "--max-freeze must be at least one slot"),
        (["--simulate", "--period", "0.01"], "need 0 < --slot <= --period, got 0.1, 0.01"),  # issue #29, row 15
        (["--node-name", ""], "NODE_NAME"),
    ],
)
def test_bad_configuration_is_refused(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--duration", "-1"], ["--listen", "nowhere"], ["--speed", "fast"], ["--bogus"]])
def test_malformed_flags_exit_with_usage(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2


def _has_driver() -> bool:
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return False
    pynvml.nvmlShutdown()
    return True


@pytest.mark.skipif(_has_driver(), reason="this machine has an NVIDIA driver")
def test_the_real_agent_without_a_driver_says_so(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["--node-name", "node-a", "--runtime-dir", str(tmp_path), "--cgroup-root", str(tmp_path)]) == 1
    assert "no NVIDIA driver on this node" in capsys.readouterr().err


@pytest.mark.skipif(_has_driver(), reason="this machine has an NVIDIA driver")
def test_real_gpu_check_without_a_driver_exits_cleanly() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "enforcement.real_gpu_check"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0
    assert done.stdout.startswith("SKIPPED: no NVIDIA driver") and done.stderr == ""


def test_real_gpu_check_reports_a_missing_driver_through_the_backend() -> None:
    out = StringIO()
    fake = FakeNVML([], SimClock(), driver_present=False)
    assert real_gpu_check.check(out, fake) == 0
    assert "SKIPPED" in out.getvalue() and "NVML Shared Library Not Found" in out.getvalue()


def test_real_gpu_check_kills_a_real_process_that_outgrows_its_cap() -> None:
    """The check's whole path, with NVML simulated and everything else real: child, pidfd, /proc."""
    clock = SystemClock()
    gpu = SimGPU(0, "GPU-check")
    fake = FakeNVML([gpu], clock)
    children: list[subprocess.Popen[str]] = []

    def spawn(ordinal: int, step_mib: int, target_mib: int) -> subprocess.Popen[str]:
        child = subprocess.Popen(
            [
                sys.executable,
                "-c",
                f"import time; print('HELD {target_mib} %f' % (time.time() + 0.3), flush=True); time.sleep(60)",
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        memory = Steps.of((0, 512 << 20), (0.3, target_mib << 20))  # crosses the cap 0.3 s after start
        gpu.attach(SimProcess(child.pid, 0, clock.now(), Workload(Steps.constant(0.0), memory)))
        children.append(child)
        return child

    out = StringIO()
    code = real_gpu_check.check(out, fake, cap_mib=1024, step_mib=256, period_s=0.1, timeout_s=10, spawn=spawn)
    assert code == 0, out.getvalue()
    assert "PASSED" in out.getvalue() and "GpuMemoryCapExceeded" in out.getvalue()
    assert children[0].wait(5) == -9


def test_health_and_metrics_endpoints() -> None:
    healthy = [True]
    server = Endpoints("127.0.0.1", 0, lambda: (healthy[0], "ok" if healthy[0] else "stuck"), lambda: b"m 1\n").start()
    host, port = server.address
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/healthz") as r:
            assert (r.status, r.read()) == (200, b"ok\n")
        with urllib.request.urlopen(f"http://{host}:{port}/metrics") as r:
            assert r.read() == b"m 1\n" and "text/plain" in r.headers["Content-Type"]
        healthy[0] = False
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(f"http://{host}:{port}/healthz")
        assert info.value.code == 503
        with pytest.raises(urllib.error.HTTPError) as info:
            urllib.request.urlopen(f"http://{host}:{port}/nope")
        assert info.value.code == 404
    finally:
        server.close()


def samples(metrics: AgentMetrics) -> dict[tuple[str, str], float]:
    """(metric name, pod label) -> value, parsed back from the exposition text."""
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for sample in family.samples:
            out[(sample.name, sample.labels.get("pod", ""))] = sample.value
    return out


def test_metrics_follow_the_agent() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        sim = Simulation(demo_scenario(), Path(tmp), AgentConfig("sim-node", pacer=PacerParams(grace_s=2)))
        sim.start()
        sim.run_until(20.5)
        metrics = AgentMetrics()
        metrics.update(sim.agent)
        before = samples(metrics)
        assert before[("gpuslice_agent_memory_cap_bytes", "train-a")] == 16 * GIB
        assert before[("gpuslice_agent_memory_used_bytes", "infer-c")] == 7 * GIB
        assert before[("gpuslice_agent_entitlement_ratio", "infer-c")] == 0.25
        assert before[("gpuslice_agent_share_target_ratio", "train-a")] == pytest.approx(0.5, abs=0.01)
        assert before[("gpuslice_agent_healthy", "")] == 1.0
        assert not any(pod == "dcgm-exporter" for _, pod in before)  # host processes are nobody's slice
        sim.run_until(22)  # infer-c leaked past its cap at 21 s and was killed; it restarts at 23 s
        metrics.update(sim.agent)
        after = samples(metrics)
        assert after[("gpuslice_agent_kills_total", "")] == 1.0
        assert not any(pod == "infer-c" for _, pod in after)  # the departed slice's series are removed
        sim.stop()


def test_the_run_loop_thaws_everything_when_stopped() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        sim = Simulation(demo_scenario(), Path(tmp), AgentConfig("sim-node", pacer=PacerParams(grace_s=0)))
        sim.start()
        sim.run_until(8)
        assert sim.agent.freezer.frozen, "the demo's GPU 0 is paced by now"
        stop = threading.Event()
        steps = []

        def on_step() -> None:
            steps.append(1)
            if len(steps) >= 3:
                stop.set()

        run(sim.agent, sim.clock, stop, on_step=on_step)
        assert sim.agent.stopped and sim.agent.freezer.frozen == set()
        assert sim.agent.freezer.journal.load() == []
        sim.node.sync_cgroups()
        assert not any(c.frozen for c in sim.node.containers.values())


def test_help_lists_the_simulation_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "--simulate" in out and "--duration" in out and "--max-freeze" in out


POD_PATH = "kubepods/burstable/pod0e2d6f4e-8b1a-4d7c-9c3b-2f1e5a6b7c8d"


class _Unreachable(Kube):
    """A Kube whose API server never answers (a refused connection, as Kube reports it)."""

    def __init__(self) -> None:
        pass

    def request(self, method: str, path: str, body: object = None, **kw: object) -> dict[str, object]:
        raise KubeError(0, "ConnectionRefusedError: API server unreachable")

    def stream(self, path: str, query: object, read_timeout: float) -> object:
        raise KubeError(0, "ConnectionRefusedError: API server unreachable")


def _left_frozen(tmp_path: Path) -> tuple[Path, Path]:
    """A cgroup tree with a pod cgroup a crashed agent froze, and its journal."""
    root, runtime = tmp_path / "cgroup", tmp_path / "run"
    (root / POD_PATH).mkdir(parents=True)
    (root / POD_PATH / "cgroup.freeze").write_text("1\n")
    runtime.mkdir()
    (runtime / "frozen.json").write_text(json.dumps({"frozen": [{"kind": "v2", "path": POD_PATH}]}))
    return root, runtime


def _argv(root: Path, runtime: Path) -> list[str]:
    # every host path the node side serves or writes under the test's own dir: with the defaults, a root run of
    # this test took over (and on stop removed) the DRA, device-plugin and NRI sockets of a kubelet on this machine
    host = runtime.parent / "host"
    return ["--node-name", "node-a", "--cgroup-root", str(root), "--runtime-dir", str(runtime),
            "--kubelet-dir", str(host / "kubelet"), "--cdi-dir", str(host / "cdi"), "--state-dir", str(host / "state"),
            "--nri-socket", str(host / "nri" / "nri.sock"), "--limiter-dir", str(host / "limiter")]


def test_the_agent_thaws_before_nvml_and_the_api_server_and_logs_the_bound_port(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root, runtime = _left_frozen(tmp_path)
    seen_at_nvml: list[str] = []
    gpu = SimGPU(0, "GPU-cli")

    def open_nvml(deadline_s: float) -> object:
        seen_at_nvml.append((root / POD_PATH / "cgroup.freeze").read_text().strip())
        return bounded(PynvmlBackend(FakeNVML([gpu], SystemClock())).open(), deadline_s)

    servers: list[Endpoints] = []
    start = Endpoints.start

    def record(self: Endpoints) -> Endpoints:
        servers.append(self)
        return start(self)

    monkeypatch.setattr(cli, "_open_nvml", open_nvml)
    monkeypatch.setattr(cli, "_kube_client", lambda kubeconfig: _Unreachable())
    monkeypatch.setattr(Endpoints, "start", record)
    health: list[tuple[int, bytes]] = []

    def probe_then_stop() -> None:
        deadline = time.monotonic() + 20
        while not servers and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.5)  # a few steps
        host, port = servers[0].address
        with urllib.request.urlopen(f"http://{host}:{port}/healthz") as r:
            health.append((r.status, r.read()))
        os.kill(os.getpid(), signal.SIGTERM)  # the agent's own handler: thaw and stop

    caplog.set_level(logging.INFO)
    prober = threading.Thread(target=probe_then_stop)
    prober.start()
    assert main([*_argv(root, runtime), "--listen", "127.0.0.1:0"]) == 0
    prober.join()
    assert seen_at_nvml == ["0"]  # thawed before NVML was even opened
    port = servers[0].address[1]
    assert port != 0 and f"/healthz and /metrics on 127.0.0.1:{port}" in caplog.text
    assert health == [(200, b"ok\n")]  # the API server being away is not the agent being stuck
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # the handlers are put back


@pytest.mark.parametrize("broken", ["nvml", "kubeconfig"])
def test_a_failed_start_still_thaws_what_a_crashed_run_left_frozen(
    broken: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, runtime = _left_frozen(tmp_path)
    if broken == "nvml":
        monkeypatch.setattr(cli, "_open_nvml", lambda deadline_s: None)
    else:
        fake = FakeNVML([SimGPU(0, "GPU-cli")], SystemClock())
        monkeypatch.setattr(cli, "_open_nvml", lambda deadline_s: PynvmlBackend(fake).open())
    assert main([*_argv(root, runtime), "--kubeconfig", str(tmp_path / "missing")]) == 1
    assert (root / POD_PATH / "cgroup.freeze").read_text().strip() == "0"
    assert (runtime / "frozen.json").read_text() == '{"frozen": []}'


def test_counters_are_totals_and_off_slice_counts_processes() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        sim = Simulation(demo_scenario(), Path(tmp), AgentConfig("sim-node", pacer=PacerParams(grace_s=2)))
        sim.start()
        # train-a holds a slice of GPU 0 only; one of its processes also runs on GPU 1: off its slice.
        sim.node.spawn(sim.node.containers["train-a"], Workload(Steps.constant(0.1), Steps.constant(GIB)), 1)
        sim.run_until(22)
        metrics = AgentMetrics()
        metrics.update(sim.agent)
        families = {f.name: f for f in text_string_to_metric_families(metrics.render().decode())}
        counters = {name for name, f in families.items() if f.type == "counter"}
        assert {
            "gpuslice_agent_nvml_errors",
            "gpuslice_agent_memory_checks_skipped",
            "gpuslice_agent_freeze_errors",
            "gpuslice_agent_slice_kills",
            "gpuslice_agent_frozen_seconds",
            "gpuslice_agent_kills",
            "gpuslice_agent_ceiling_thaws",
            "gpuslice_agent_pacer_backstop_slots",
        } <= counters
        exposed = {s.name for f in families.values() for s in f.samples}
        assert all(f"{name}_total" in exposed for name in counters)
        assert not any(name.endswith("_total") for name, f in families.items() if f.type == "gauge")
        after = samples(metrics)
        assert after[("gpuslice_agent_off_slice_processes", "")] == 1.0  # one process, however often looked up
        assert after[("gpuslice_agent_frozen_seconds_total", "train-b")] > 0
        sim.stop()


def test_a_port_in_use_is_a_clear_error_and_still_thaws(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root, runtime = _left_frozen(tmp_path)
    fake = FakeNVML([SimGPU(0, "GPU-cli")], SystemClock())
    monkeypatch.setattr(cli, "_open_nvml", lambda deadline_s: PynvmlBackend(fake).open())
    monkeypatch.setattr(cli, "_kube_client", lambda kubeconfig: _Unreachable())
    taken = Endpoints("127.0.0.1", 0, lambda: (True, "ok"), lambda: b"")
    try:
        port = taken.address[1]
        assert main([*_argv(root, runtime), "--listen", f"127.0.0.1:{port}"]) == 1
    finally:
        taken.close()
    assert f"cannot serve /healthz and /metrics on 127.0.0.1:{port}" in capsys.readouterr().err
    assert (root / POD_PATH / "cgroup.freeze").read_text().strip() == "0"
