"""Fail-safety of the node agent on real cgroups and real processes (root; see ``realnode``).

One regression test per defect found by running the agent on real Linux primitives: a restart with
NVML failing thaws at once; a killed agent's keeper thaws; a hung NVML call neither keeps a pod
frozen past the ceiling nor passes /healthz; a process killed while frozen dies at once (v1 too);
a PID reused within one clock tick is not killed; a private cgroup namespace refuses pacing and says
so. Each prints the figure it measured (``pytest -s``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from enforcement.agent import Agent, AgentConfig, run
from enforcement.cgroups import CgroupResolver, read_start_time
from enforcement.endpoints import Endpoints
from enforcement.events import RecordingEventSink
from enforcement.freezer import CgroupFreezer, FreezeController, FreezeJournal, ThawGuard, target_for
from enforcement.killer import PidfdKiller
from enforcement.nvml import PynvmlBackend, bounded
from enforcement.pacer import PacerParams
from enforcement.pods import PodIndex
from enforcement.simgpu import GIB, HANG, Fault, Steps, Workload
from tests.unit.realnode import (
    CGROUP,
    SLEEP,
    FrozenLog,
    Pod,
    RealTimeGpu,
    cgroup_tree,
    require,
    unified_root,
    wait_until,
)

NODE = "real-node"
BUSY = Workload(Steps.constant(1.0), Steps.constant(GIB), queue_s=0.02)

# A stand-in for an agent that froze a pod and was then killed: the real freezer, journal and all.
FREEZE_AND_WAIT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from enforcement.cgroups import CgroupResolver
    from enforcement.freezer import CgroupFreezer, FreezeController, FreezeJournal, target_for
    pid, root, journal = int(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    target = target_for(CgroupResolver(Path("/proc")).lookup(pid).container, root)
    FreezeController(CgroupFreezer(root), FreezeJournal(journal)).apply({target})
    if len(sys.argv) > 4:
        from enforcement import keeper
        keeper.spawn(journal, root)
        time.sleep(1.0)  # the keeper is up and waiting on us
    print(target.kind, target.path, flush=True)
    time.sleep(600)
    """
)


def _freeze_then_kill(pod: Pod, journal: Path, with_keeper: bool = False) -> subprocess.Popen[str]:
    argv = [sys.executable, "-c", FREEZE_AND_WAIT, str(pod.processes[0].pid), str(CGROUP), str(journal)]
    helper = subprocess.Popen([*argv, "keeper"] if with_keeper else argv, stdout=subprocess.PIPE, text=True)
    assert helper.stdout is not None
    assert helper.stdout.readline(), "the stand-in agent did not freeze anything"
    assert wait_until(pod.frozen, 2.0) is not None
    helper.send_signal(signal.SIGKILL)
    helper.wait(5)
    return helper


def _gpuslice() -> list[str]:
    script = Path(sys.executable).parent / "gpuslice"
    return [str(script)] if script.exists() else [sys.executable, "-m", "packing.cli"]


def test_a_restart_with_nvml_failing_thaws_what_a_killed_agent_left_frozen(tmp_path: Path) -> None:
    with cgroup_tree("v2") as tree:
        pod = tree.pod("trainer", "v2")
        tree.spawn(pod)
        runtime = tmp_path / "run"
        _freeze_then_kill(pod, runtime / "frozen.json")
        time.sleep(0.3)
        assert pod.frozen(), "the killed agent's freeze stays until someone thaws it"
        broken = tmp_path / "lib"
        broken.mkdir()
        (broken / "libnvidia-ml.so.1").write_bytes(b"not a library")  # NVML fails to load, GPU or not
        env = {**os.environ, "LD_LIBRARY_PATH": str(broken)}
        argv = [*_gpuslice(), "agent", "--node-name", NODE, "--runtime-dir", str(runtime)]
        argv += ["--cgroup-root", str(CGROUP), "--listen", "127.0.0.1:0", "--kubeconfig", str(tmp_path / "none")]
        started = time.monotonic()
        agent = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
        _, err = agent.communicate(timeout=30)
        # the contract is the order: the thaw comes before the agent gives up on NVML and exits
        assert not pod.frozen(), f"still frozen after the agent exited; it said: {err}"
        print(f"\nrestart with NVML failing: thawed and exited {time.monotonic() - started:.3f} s after the restart")
        assert agent.returncode == 1 and "NVIDIA driver" in err
        assert json.loads((runtime / "frozen.json").read_text()) == {"frozen": []}


def test_the_keeper_thaws_when_the_agent_is_killed(tmp_path: Path) -> None:
    with cgroup_tree("v2") as tree:
        pod = tree.pod("trainer", "v2")
        tree.spawn(pod)
        journal = tmp_path / "run" / "frozen.json"
        helper = _freeze_then_kill(pod, journal, with_keeper=True)
        killed = time.monotonic()
        thawed = wait_until(lambda: not pod.frozen(), 5.0)
        print(f"\nagent killed -9: its keeper thawed the pod {thawed - killed:.3f} s later" if thawed else "")
        assert helper.returncode == -signal.SIGKILL
        assert thawed is not None, "the keeper did not thaw the pod within 5 s of the agent's death"
        # The keeper empties the journal right after the thaw (and then exits).
        assert wait_until(lambda: json.loads(journal.read_text()) == {"frozen": []}, 5.0) is not None


def _real_agent(
    gpu: RealTimeGpu, pods: list[dict[str, object]], journal: Path, config: AgentConfig, deadline_s: float | None
) -> Agent:
    index = PodIndex(NODE)
    index.replace(pods)
    backend = PynvmlBackend(gpu.nvml).open()
    return Agent(
        config,
        bounded(backend, deadline_s) if deadline_s else backend,
        CgroupResolver(Path("/proc")),
        index,
        FreezeController(CgroupFreezer(CGROUP), FreezeJournal(journal), ceiling_s=config.freeze_ceiling_s),
        PidfdKiller(),
        RecordingEventSink(),
        gpu.clock,
        CGROUP,
    )


def _health(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return e.code


def test_a_hung_nvml_call_neither_keeps_a_pod_frozen_nor_passes_healthz(tmp_path: Path) -> None:
    with cgroup_tree("v2") as tree:
        gpu = RealTimeGpu()
        big, small = tree.pod("big", "v2"), tree.pod("small", "v2")
        for pod in (big, small):
            gpu.attach(pod, tree.spawn(pod), BUSY)
        manifests = [
            big.manifest(NODE, gpu.uuid, "v100-50", 500, 16384),
            small.manifest(NODE, gpu.uuid, "v100-25", 250, 8192),
        ]
        config = AgentConfig(NODE, pacer=PacerParams(grace_s=0.0))
        agent = _real_agent(gpu, manifests, tmp_path / "frozen.json", config, deadline_s=0.5)
        frozen = FrozenLog([big, small]).start()
        gpu.start()
        agent.start()
        guard = ThawGuard(agent.freezer).start()
        endpoints = Endpoints("127.0.0.1", 0, agent.healthy, lambda: b"").start()
        stop = threading.Event()
        loop = threading.Thread(target=run, args=(agent, gpu.clock, stop), daemon=True)
        loop.start()
        health: list[tuple[float, int]] = []
        try:
            # The 25 % pod gets half the GPU unpaced: the pacer freezes it. Hang NVML while it is frozen.
            assert wait_until(lambda: frozen.frozen_now("small"), 15.0) is not None, "pacing never froze a pod"
            hang_s = 10.0
            now = gpu.clock.now()
            gpu.nvml.faults = (Fault(now, now + hang_s, HANG, "nvmlDeviceGetProcessUtilization"),)
            hung = time.monotonic()
            while time.monotonic() < hung + hang_s + 4.0:
                health.append((time.monotonic() - hung, _health(endpoints.address[1])))
                time.sleep(0.1)
        finally:
            stop.set()
            loop.join(10)
            endpoints.close()
            guard.close()
            gpu.close()
            frozen.close()
        longest = frozen.longest(hung, hung + hang_s)
        failing = [t for t, code in health if code == 503]
        print(
            f"\nNVML hung {hang_s:.0f} s: longest freeze {longest:.3f} s (ceiling {config.freeze_ceiling_s} s); "
            f"/healthz 503 from {failing[0]:.1f} s to {failing[-1]:.1f} s after the hang began"
            if failing
            else f"\nNVML hung {hang_s:.0f} s: longest freeze {longest:.3f} s; /healthz never failed"
        )
        assert longest <= config.freeze_ceiling_s + 0.3, f"a pod stayed frozen {longest:.2f} s"
        assert failing and failing[0] <= config.stall_s + 1.0, "/healthz did not fail while NVML was hung"
        after = [code for t, code in health if t >= hang_s + 3.0]
        assert after and set(after) == {200}, "/healthz did not recover once NVML answered again"
        assert not big.frozen() and not small.frozen()


@pytest.mark.parametrize("layout", ["v1", "v2"])
def test_a_process_killed_while_frozen_dies_at_once(tmp_path: Path, layout: str) -> None:
    """Under the v1 freezer a frozen task cannot die: the agent thaws the pod right after the kill."""
    with cgroup_tree(layout) as tree:  # type: ignore[arg-type]
        gpu = RealTimeGpu()
        pod = tree.pod("leaky", layout)  # type: ignore[arg-type]
        proc = tree.spawn(pod)
        gpu.attach(pod, proc, Workload(Steps.constant(0.5), Steps.constant(9 * GIB)))  # over its 8 GiB cap
        config = AgentConfig(NODE, pacing=False)
        agent = _real_agent(gpu, [pod.manifest(NODE, gpu.uuid, "v100-25", 250, 8192)], tmp_path / "j", config, None)
        agent.start()
        identity = CgroupResolver(Path("/proc"), pin=False).lookup(proc.pid)
        assert identity is not None and identity.container is not None
        target = target_for(identity.container, CGROUP)
        assert target is not None
        agent.freezer.apply({target})  # as the pacer would have
        assert wait_until(pod.frozen, 2.0) is not None
        killed = time.monotonic()
        agent.step()
        assert [k.pid for k in agent.kills] == [proc.pid]
        try:
            proc.wait(2.0)
        except subprocess.TimeoutExpired:
            pytest.fail(f"{layout}: the killed process is still there 2 s after the kill (frozen: {pod.frozen()})")
        died = time.monotonic()
        level = target.path.rsplit("/", 1)[-1][:12]
        print(f"\n{layout} freezer ({target.kind} {level}): kill to exit {died - killed:.3f} s")
        assert proc.returncode == -signal.SIGKILL
        agent.stop()


class _Listing:
    """An NVML reading of one GPU that lists what the test says (process memory only)."""

    def __init__(self, uuid: str) -> None:
        from enforcement.nvml import ProcessMemory

        self.uuid = uuid
        self.make = ProcessMemory
        self.processes: list[object] = []

    def process_memory(self, uuid: str) -> list[object]:
        return list(self.processes)


def _move(pid: int, cgroup: Path) -> None:
    (cgroup / "cgroup.procs").write_text(str(pid))


def test_a_pid_reused_within_one_clock_tick_is_not_killed() -> None:
    """The start time resolves 10 ms: a PID reused within one tick passes a start-time check."""
    from enforcement.attribution import Attributor
    from enforcement.clock import SystemClock
    from enforcement.watchdog import MemoryWatchdog

    require(None if Path("/proc/sys/kernel/ns_last_pid").exists() else "no /proc/sys/kernel/ns_last_pid")
    with cgroup_tree("v2") as tree:
        pod = tree.pod("victim", "v2")
        own = Path("/proc/self/cgroup").read_text().split("0::", 1)[1].split()[0]
        home = unified_root() / own.lstrip("/")  # type: ignore[operator]
        uuid = "GPU-reuse"
        index = PodIndex(NODE)
        index.replace([pod.manifest(NODE, uuid, "v100-25", 250, 8192)])
        reading = _Listing(uuid)
        attributor = Attributor(CgroupResolver(Path("/proc")), index)
        dog = MemoryWatchdog(reading, attributor.owner, PidfdKiller(), RecordingEventSink(), SystemClock())  # type: ignore[arg-type]
        reused = killed = 0
        for _ in range(80):
            _move(os.getpid(), pod.dirs[0])  # the next child starts in the pod's container cgroup
            try:
                old = subprocess.Popen([SLEEP, "60"])
            finally:
                _move(os.getpid(), home)
            reading.processes = [reading.make(old.pid, GIB)]
            dog.check([uuid])  # the agent sees (and remembers) the pod's process, under its cap
            start = read_start_time(Path("/proc"), old.pid)
            old.kill()
            old.wait()
            Path("/proc/sys/kernel/ns_last_pid").write_text(str(old.pid - 1))
            new = subprocess.Popen([SLEEP, "60"])  # a host process, not in any pod
            try:
                if new.pid != old.pid or read_start_time(Path("/proc"), new.pid) != start:
                    continue  # someone else took the PID, or the clock ticked: not the case under test
                reused += 1
                reading.processes = [reading.make(new.pid, 9 * GIB)]  # NVML lists that PID over the cap
                dog.check([uuid])
                time.sleep(0.02)
                killed += new.poll() is not None
            finally:
                new.kill()
                new.wait()
        print(f"\nPID reused within one clock tick {reused} times; the reused PID was killed {killed} times")
        require(None if reused else "could not force a PID reuse within one clock tick on this machine")
        assert killed == 0


NAMESPACED_AGENT = textwrap.dedent(
    """
    import json, logging, sys
    from pathlib import Path
    from enforcement.agent import Agent, AgentConfig
    from enforcement.cgroups import CgroupResolver
    from enforcement.clock import SimClock
    from enforcement.events import RecordingEventSink
    from enforcement.freezer import CgroupFreezer, FreezeController, FreezeJournal
    from enforcement.killer import PidfdKiller
    from enforcement.metrics import AgentMetrics
    from enforcement.nvml import PynvmlBackend
    from enforcement.pacer import PacerParams
    from enforcement.pods import PodIndex
    from enforcement.simgpu import GIB, FakeNVML, SimGPU, SimProcess, Steps, Workload

    pid, manifest, journal = int(sys.argv[1]), json.loads(sys.argv[2]), Path(sys.argv[3])
    logging.basicConfig(level=logging.ERROR, format="%(message)s")
    clock = SimClock()
    gpu = SimGPU(0, sys.argv[4])
    gpu.attach(SimProcess(pid, 0, clock.now(), Workload(Steps.constant(1.0), Steps.constant(GIB))))
    index = PodIndex("real-node")
    index.replace([manifest])
    freezer = FreezeController(CgroupFreezer(Path("/sys/fs/cgroup")), FreezeJournal(journal))
    config = AgentConfig("real-node", pacer=PacerParams(grace_s=0.0))
    agent = Agent(config, PynvmlBackend(FakeNVML([gpu], clock)).open(), CgroupResolver(Path("/proc")), index,
                  freezer, PidfdKiller(), RecordingEventSink(), clock, Path("/sys/fs/cgroup"))
    agent.start()
    agent.step()
    metrics = AgentMetrics()
    metrics.update(agent)
    lines = [x for x in metrics.render().decode().splitlines() if x.startswith("gpuslice_agent_unpaceable")]
    print(json.dumps({"cgroup": Path(f"/proc/{pid}/cgroup").read_text(), "metric": lines,
                      "refused": list(agent.unpaceable)}))
    """
)


def test_a_private_cgroup_namespace_refuses_pacing_and_says_so(tmp_path: Path) -> None:
    require(None if Path("/usr/bin/unshare").exists() else "no unshare(1)")
    with cgroup_tree("v2") as tree:
        pod = tree.pod("trainer", "v2")
        proc = tree.spawn(pod)
        [agent_cgroup] = tree.cgroup("v2", "agent")
        manifest = pod.manifest(NODE, "GPU-ns", "v100-25", 250, 8192)
        script = f'echo $$ > {agent_cgroup}/cgroup.procs && exec unshare --cgroup "$@"'
        argv = ["sh", "-c", script, "sh", sys.executable, "-c", NAMESPACED_AGENT, str(proc.pid)]
        done = subprocess.run(
            [*argv, json.dumps(manifest), str(tmp_path / "frozen.json"), "GPU-ns"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        out = json.loads(done.stdout)
        print(f"\ninside a cgroup namespace the pod shows as {out['cgroup'].strip()!r}; log: {done.stderr.strip()}")
        assert "/../" in out["cgroup"]  # what the kernel shows from inside the namespace
        assert out["refused"] == [pod.container_id]
        assert out["metric"] == ["gpuslice_agent_unpaceable_containers 1.0"]
        assert "not pacing" in done.stderr and "private cgroup namespace" in done.stderr
        assert not pod.frozen()
