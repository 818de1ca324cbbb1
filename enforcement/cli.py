"""``gpuslice agent``: the node agent (DaemonSet), or ``--simulate`` against simulated GPUs.

Every flag has an environment twin ``GPUSLICE_AGENT_<FLAG>`` (``--memory-period`` ->
``GPUSLICE_AGENT_MEMORY_PERIOD``); the node name also comes from ``NODE_NAME`` (the downward API).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from enforcement.pacer import PacerParams
from packing.argtypes import non_negative_number, positive_number
from packing.usage import Applies, CommandParser, fields_as_flags

if TYPE_CHECKING:
    from enforcement.agent import AgentConfig
    from enforcement.freezer import FreezeController
    from enforcement.nvml import PynvmlBackend
    from packing.kube.client import Kube

log = logging.getLogger("gpuslice.agent")

ENV_PREFIX = "GPUSLICE_AGENT_"
SIMULATION_ONLY = ("--duration", "--speed", "--report-every")
# what the demo of --simulate does not read: it runs its own two cards and pods, no node, no cluster
NODE_ONLY = ("--node-name", "--cgroup-root", "--proc-root", "--runtime-dir", "--listen", "--kubeconfig",
             "--no-pacing", "--freeze-ceiling", "--nvml-deadline", "--stall", "--kubelet-dir", "--device-plugin-dir",
             "--cdi-dir", "--state-dir", "--dra", "--device-plugin", "--nri", "--nri-socket", "--mps", "--limiter",
             "--limiter-dir", "--limiter-source", "--hami-library", "--inventory-every", "--slice-resync",
             "--simulated-gpus", "--catalog")
# the validators' words for the flags (PacerParams, AgentConfig)
FIELD_FLAGS = {"slot_s": "--slot", "period_s": "--period", "max_freeze_s": "--max-freeze", "burst_s": "--burst",
               "grace_s": "--grace", "memory period": "--memory-period", "freeze ceiling": "--freeze-ceiling",
               "stall limit": "--stall"}
RULES = (
    Applies(SIMULATION_ONLY, lambda a: a.simulate, "applies to --simulate only", "drop it, or add --simulate"),
    Applies(NODE_ONLY, lambda a: not a.simulate,
            "applies to the node agent, and --simulate runs its own demo (two simulated cards, no node, "
            "no cluster)", "drop it, or drop --simulate"),
)


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(ENV_PREFIX + name.upper().replace("-", "_"), default)


def _listen(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not port.isdigit() or not 0 <= int(port) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT")
    return host or "0.0.0.0", int(port)


def parser() -> CommandParser:
    """The agent's command line (flags default to their GPUSLICE_AGENT_* environment variables)."""
    p = CommandParser(
        prog="gpuslice agent",
        description="Enforce GPU slice memory caps and pace compute shares on this node.",
    )
    sim = p.add_argument_group("simulation (no GPU, no cluster)")
    sim.add_argument("--simulate", action="store_true", help="run against simulated GPUs and a fake cgroup tree")
    sim.add_argument("--duration", type=positive_number, help="simulated seconds to run, then stop (default: forever)")
    sim.add_argument(
        "--speed",
        type=non_negative_number,
        help="simulated seconds per wall second; 0 = as fast as possible (default: 0 with --duration, else 1)",
    )
    sim.add_argument("--report-every", type=positive_number, default=5.0, help="simulated seconds between tables (5)")
    node = p.add_argument_group("node")
    node.add_argument("--node-name", default=_env("node-name", os.environ.get("NODE_NAME")), help="this node's name")
    node.add_argument("--cgroup-root", type=Path, default=Path(_env("cgroup-root", "/sys/fs/cgroup") or ""),
                      metavar="DIR", help="the host's cgroup mount, where containers are frozen "
                                          "(default /sys/fs/cgroup)")
    node.add_argument("--proc-root", type=Path, default=Path(_env("proc-root", "/proc") or ""), metavar="DIR",
                      help="the host's /proc, to map GPU processes to their containers (default /proc)")
    node.add_argument(
        "--runtime-dir",
        type=Path,
        default=Path(_env("runtime-dir", "/run/gpuslice-agent") or ""),
        help="where the list of cgroups we froze is kept (thawed at the next start)",
    )
    node.add_argument(
        "--listen", type=_listen, default=_env("listen", "0.0.0.0:9400"), help="HOST:PORT of /healthz, /metrics"
    )
    node.add_argument("--kubeconfig", default=_env("kubeconfig"), metavar="FILE",
                      help="kubeconfig file (default: in-cluster config); read after what a crashed run left frozen "
                           "is thawed, as every check that can fail is")
    ctl = p.add_argument_group("control")
    ctl.add_argument("--memory-period", type=positive_number, default=_env("memory-period") or "0.2",
                     metavar="SECONDS", help="seconds between checks of each slice's GPU memory against its cap "
                                             "(0.2 s)")
    ctl.add_argument("--slot", type=positive_number, default=_env("slot") or "0.1", metavar="SECONDS",
                     help="seconds per pacing decision: cgroups are frozen or thawed on slot boundaries (0.1 s)")
    ctl.add_argument("--period", type=positive_number, default=_env("period") or "1.0", metavar="SECONDS",
                     help="seconds per control period, over which every demanding slice runs (1 s; at least a slot)")
    ctl.add_argument("--max-freeze", type=positive_number, default=_env("max-freeze") or "0.3",
                     metavar="SECONDS", help="longest a slice is frozen at a time (0.3 s; at least a slot, under "
                                             "a period and under --freeze-ceiling)")
    ctl.add_argument("--burst", type=positive_number, default=_env("burst") or "2.0", metavar="GPU_SECONDS",
                     help="credit a slice may bank and spend above its share, in GPU-seconds per whole card of "
                          "entitlement (2: a 50 %% slice runs at most 1 GPU-second ahead of its share)")
    grace = _env("grace")
    ctl.add_argument(
        "--grace",
        type=non_negative_number,
        default=grace or None,
        help="seconds a new slice runs unpaced (default 30; 5 with --simulate)",
    )
    ctl.add_argument("--no-pacing", action="store_true", default=_env("no-pacing") == "1", help="memory caps only")
    safe = p.add_argument_group("fail-safety")
    safe.add_argument(
        "--freeze-ceiling",
        type=positive_number,
        default=_env("freeze-ceiling") or "0.5",
        help="no cgroup stays frozen longer, even with the control loop stuck (0.5 s)",
    )
    safe.add_argument(
        "--nvml-deadline",
        type=positive_number,
        default=_env("nvml-deadline") or "0.5",
        help="an NVML call not answered within this is given up on (0.5 s)",
    )
    safe.add_argument(
        "--stall",
        type=positive_number,
        default=_env("stall") or "2.0",
        help="/healthz fails once the loop has made no progress for this long (2 s)",
    )
    p.add_argument("--log-level", default=_env("log-level", "INFO"), choices=["DEBUG", "INFO", "WARNING", "ERROR"],
                   help="least severe log records printed (default INFO)")
    from enforcement.node import add_arguments

    add_arguments(p)
    return p


def main(argv: Sequence[str]) -> int:
    """Entry point of ``gpuslice agent``; returns the exit code."""
    ap = parser()
    args = ap.parse_args(list(argv))
    if ap.check(args, RULES):
        return 2
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    grace = args.grace if args.grace is not None else (5.0 if args.simulate else 30.0)
    try:
        params = PacerParams(
            slot_s=args.slot, period_s=args.period, max_freeze_s=args.max_freeze, burst_s=args.burst, grace_s=grace
        )
    except ValueError as e:
        return ap.usage_error(fields_as_flags(str(e), FIELD_FLAGS))
    if args.simulate:
        from enforcement.simulate import run_demo

        logging.getLogger("enforcement").setLevel(logging.ERROR)  # the table is the output
        speed = args.speed if args.speed is not None else (0.0 if args.duration else 1.0)
        return run_demo(args.duration, speed, args.report_every, params, args.memory_period)
    if not args.node_name:
        print("gpuslice agent: set --node-name or NODE_NAME (the downward API's spec.nodeName)", file=sys.stderr)
        return 2
    return _run_node(args, params)


def _run_node(args: argparse.Namespace, params: PacerParams) -> int:
    """The node agent. Order matters: thaw what a previous run left frozen before anything that can
    fail or block (NVML, the kubeconfig, the API server), and thaw again on every way out."""
    from enforcement.freezer import CgroupFreezer, FreezeController, FreezeJournal

    journal = FreezeJournal(args.runtime_dir / "frozen.json")
    freezer = FreezeController(CgroupFreezer(args.cgroup_root), journal, ceiling_s=args.freeze_ceiling)
    try:
        thawed = freezer.recover()
    except OSError as e:  # without a journal we could not promise to thaw after a crash: do not pace at all
        print(f"gpuslice agent: cannot keep the freeze journal {journal.path}: {e}", file=sys.stderr)
        return 1
    if thawed:
        log.warning("thawed %d cgroup(s) left frozen by a previous run", len(thawed))
    from enforcement.agent import AgentConfig

    try:
        config = AgentConfig(
            args.node_name,
            memory_period_s=args.memory_period,
            pacer=params,
            pacing=not args.no_pacing,
            freeze_ceiling_s=args.freeze_ceiling,
            stall_s=args.stall,
        )
    except ValueError as e:
        print(f"gpuslice agent: {fields_as_flags(str(e), FIELD_FLAGS)}", file=sys.stderr)
        return 2
    keeper = _start_keeper(journal.path, args.cgroup_root)
    stop = threading.Event()

    def _on_signal(signum: int, frame: FrameType | None) -> None:
        log.info("signal %d: thawing and stopping", signum)
        stop.set()

    previous = {sig: signal.signal(sig, _on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        return _serve(args, config, freezer, stop)
    finally:
        stop.set()  # the pod watch, if it was started
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        stuck = freezer.thaw_all()
        if stuck:
            log.error("could not thaw %s; the keeper and the next start retry", sorted(t.path for t in stuck))
        if keeper is not None:
            with contextlib.suppress(OSError, subprocess.TimeoutExpired):
                keeper.kill()  # everything is thawed and the journal is empty: nothing left to keep
                keeper.wait(5)


def _start_keeper(journal: Path, cgroup_root: Path) -> subprocess.Popen[bytes] | None:
    from enforcement import keeper

    try:
        return keeper.spawn(journal, cgroup_root)
    except OSError as e:
        log.warning("no thaw keeper (%s): if this process is killed, frozen cgroups wait for the next start", e)
        return None


def _serve(args: argparse.Namespace, config: AgentConfig, freezer: FreezeController, stop: threading.Event) -> int:
    """NVML, the API server, then the loop; returns the exit code (the caller thaws)."""
    from enforcement.agent import Agent, run
    from enforcement.cgroups import CgroupResolver
    from enforcement.clock import SystemClock
    from enforcement.endpoints import Endpoints
    from enforcement.events import KubeEventSink
    from enforcement.freezer import ThawGuard
    from enforcement.killer import PidfdKiller
    from enforcement.metrics import AgentMetrics
    from enforcement.node import start as start_node_side
    from enforcement.pods import PodIndex
    from enforcement.refusals import Refusals
    from packing.kube.informer import Informer
    from packing.products import load_catalog

    _check_cgroup_namespace(args.proc_root)
    backend = _open_simulated(args) if args.simulated_gpus else _open_nvml(args.nvml_deadline)
    if backend is None:
        return 1
    try:
        kube = _kube_client(args.kubeconfig)
    except _NoCluster as e:
        backend.close()
        print(f"gpuslice agent: cannot reach the API server: {e}", file=sys.stderr)
        return 1
    if stop.is_set():
        backend.close()
        return 0
    events = KubeEventSink(kube, args.node_name)
    refusals = Refusals(args.node_name, events)
    index = PodIndex(args.node_name, refusals, load_catalog(args.catalog))
    watch = Informer("pods", kube, "/api/v1/pods", index.apply,
                     selectors={"fieldSelector": f"spec.nodeName={args.node_name}"})
    watch.start()  # lists, then watches; relists after 410 Gone or a broken stream, and tells the drift
    try:
        node_side = start_node_side(args, backend, index, kube, stop, events)
    except Exception as e:  # the watchdog runs regardless: a node without hand-off says so, loudly
        log.error("kubelet plugins not started (%s): containers on this node get no slice hand-off", e)
        node_side = None
    clock = SystemClock()
    agent = Agent(
        config,
        backend,
        CgroupResolver(args.proc_root),
        index,
        freezer,
        PidfdKiller(args.proc_root),
        events,
        clock,
        args.cgroup_root,
    )
    metrics = AgentMetrics()
    host, port = args.listen
    try:
        endpoints = Endpoints(host, port, agent.healthy, metrics.render)
    except OSError as e:
        if node_side is not None:
            node_side.close()
        watch.stop(1.0)
        events.close()
        backend.close()
        print(f"gpuslice agent: cannot serve /healthz and /metrics on {host}:{port}: {e}", file=sys.stderr)
        return 1
    agent.start()
    atexit.register(agent.stop)  # thaw on any exit path the signal handler does not see
    guard = ThawGuard(freezer).start()
    endpoints.start()
    started = last_metrics = time.monotonic()
    unsynced_warned = False

    def _refresh() -> None:
        nonlocal last_metrics, unsynced_warned
        now = time.monotonic()
        if now - last_metrics >= 1.0:
            metrics.update(agent)
            if node_side is not None and node_side.writer is not None:
                metrics.update_handoff(node_side.writer)
            metrics.update_refusals(refusals)
            last_metrics = now
        if not unsynced_warned and not watch.synced.is_set() and now - started > 30:
            log.warning("no pod list from the API server after 30 s; enforcing nothing until it comes")
            unsynced_warned = True

    bound_host, bound_port = endpoints.address
    log.info(
        "agent on %s: %d GPU(s), /healthz and /metrics on %s:%d",
        args.node_name,
        len(agent.gpus),
        bound_host,
        bound_port,
    )
    try:
        run(agent, clock, stop, on_step=_refresh)
    finally:
        guard.close()
        endpoints.close()
        watch.stop(1.0)
        events.close()
        if node_side is not None:
            node_side.close()
    return 0


def _open_simulated(args: argparse.Namespace) -> PynvmlBackend:
    """The cards of ``--simulated-gpus`` (a count, or a JSON file) behind pynvml's interface."""
    from enforcement.nvml import PynvmlBackend, bounded
    from enforcement.simnode import SimulatedCards, counted_cards

    given = args.simulated_gpus
    cards = SimulatedCards(counted_cards(given, args.node_name) if isinstance(given, int) else given)
    return bounded(PynvmlBackend(cards), args.nvml_deadline).open()


def _open_nvml(deadline_s: float) -> PynvmlBackend | None:
    """NVML, every call bounded by ``deadline_s`` (opening it, which may take seconds per GPU, by 60 s)."""
    from enforcement.nvml import NvmlError, NvmlUnavailable, PynvmlBackend, bounded

    try:
        return bounded(PynvmlBackend(), deadline_s, {"open": 60.0}).open()
    except NvmlUnavailable as e:
        print(f"gpuslice agent: no NVIDIA driver on this node ({e}); nothing to enforce", file=sys.stderr)
    except NvmlError as e:
        print(f"gpuslice agent: NVML failed at start: {e}", file=sys.stderr)
    return None


class _NoCluster(Exception):
    pass


def _kube_client(kubeconfig: str | None) -> Kube:
    try:
        from packing.kube.client import connect

        return connect(kubeconfig)
    except Exception as e:  # the client raises several unrelated types for "no usable config"
        raise _NoCluster(str(e)) from e


def _check_cgroup_namespace(proc_root: Path) -> None:
    """Say so at start if this process has a cgroup namespace of its own (pacing cannot work then)."""
    try:
        mine, host = os.readlink(proc_root / "self/ns/cgroup"), os.readlink(proc_root / "1/ns/cgroup")
    except OSError:
        return  # cannot tell (no hostPID, or no permission): the per-container check still refuses
    if mine != host:
        log.error(
            "this agent runs in a private cgroup namespace (%s, host %s): other containers' cgroups are outside "
            "its view, so it will not pace any (memory caps still hold). Run it privileged with hostPID, whose "
            "container shares the host's cgroup namespace (enforcement/README.md, Deployment).",
            mine,
            host,
        )
