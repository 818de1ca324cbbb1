"""The node side of the agent: inventory on the Node, the DRA kubelet plugin, the device plugin.

``start`` wires them onto a running agent's NVML backend and pod index, each in its own thread:

* the inventory refresh (NVML -> ``gpuslice.io/inventory`` on the Node) feeds the other two;
* the DRA plugin (``--dra``, on by default): ResourceSlice of token devices, registration,
  NodePrepareResources / NodeUnprepareResources, checkpoint;
* the device plugin (``--device-plugin``, on by default): one resource per product, and the
  token hand-off through PodResources;
* the NRI plugin (``--nri``, on by default): the hand-off of pods that ask by annotation only.

All three write CDI specs into ``--cdi-dir`` from the same container-edits core (``edits.py``),
with the in-container limiter (``--limiter``, installed into ``--limiter-dir`` at start) or, as
the opt-in ``--limiter=hami``, HAMi-core's variables instead.
"""

from __future__ import annotations

import argparse
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from enforcement.cdi import SpecDir
from enforcement.edits import EditsConfig
from enforcement.events import EventSink
from enforcement.handoff import RecordLookup, Writer
from enforcement.inventory import CardSource, Inventory, KubeNodeAnnotator
from enforcement.limiter import LimiterHost, LimiterMode
from enforcement.limiterhost import NodeLimiter, install
from enforcement.pods import PodIndex
from enforcement.simnode import simulated_gpus
from packing.argtypes import positive_number
from packing.kube.client import Kube
from packing.products import load_catalog

log = logging.getLogger(__name__)


def _env(name: str, default: str) -> str:
    return os.environ.get("GPUSLICE_AGENT_" + name.upper().replace("-", "_"), default)


def _limiter_mode(text: str) -> LimiterMode:
    try:
        return LimiterMode(text)
    except ValueError:
        modes = ", ".join(m.value for m in LimiterMode)
        raise argparse.ArgumentTypeError(f"{text!r} is not one of {modes} (--limiter, GPUSLICE_AGENT_LIMITER)"
                                         ) from None


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The node side's flags (each with its GPUSLICE_AGENT_* environment twin)."""
    g = p.add_argument_group("kubelet plugins (hand each container its slice)")
    g.add_argument("--kubelet-dir", type=Path, default=Path(_env("kubelet-dir", "/var/lib/kubelet")),
                   help="the kubelet's root directory (plugin, device plugin and pod-resources sockets)")
    g.add_argument("--device-plugin-dir", type=Path, default=_env("device-plugin-dir", "") or None,
                   help="the kubelet's device plugin directory (default <kubelet-dir>/device-plugins; the kubelet "
                        "itself always uses /var/lib/kubelet/device-plugins, whatever its --root-dir)")
    g.add_argument("--cdi-dir", type=Path, default=Path(_env("cdi-dir", "/var/run/cdi")),
                   help="the container runtime's dynamic CDI spec directory")
    g.add_argument("--state-dir", type=Path, default=Path(_env("state-dir", "/var/lib/gpuslice-agent")),
                   help="where the DRA checkpoint lives (must survive agent and kubelet restarts)")
    g.add_argument("--dra", action=argparse.BooleanOptionalAction, default=_env("dra", "1") == "1",
                   help="serve the DRA kubelet plugin and publish the ResourceSlice (default on)")
    g.add_argument("--device-plugin", action=argparse.BooleanOptionalAction,
                   default=_env("device-plugin", "1") == "1", help="serve one device plugin per product (default on)")
    g.add_argument("--nri", action=argparse.BooleanOptionalAction, default=_env("nri", "1") == "1",
                   help="register an NRI plugin with the runtime: the hand-off of pods that ask by annotation")
    g.add_argument("--nri-socket", type=Path, default=Path(_env("nri-socket", "/var/run/nri/nri.sock")),
                   help="the runtime's NRI socket")
    g.add_argument("--mps", action="store_true", default=_env("mps", "0") == "1",
                   help="this node runs MPS: also set CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
    g.add_argument("--limiter", type=_limiter_mode, default=_env("limiter", "gpuslice"),
                   metavar="{" + ",".join(m.value for m in LimiterMode) + "}",
                   help="the in-container memory limiter each slice's container gets: gpuslice (ours, preloaded; "
                        "default), hami (HAMi-core's CUDA_DEVICE_MEMORY_LIMIT_<i> for images that ship libvgpu.so; "
                        "turns ours off) or off (the memory watchdog alone)")
    g.add_argument("--limiter-dir", type=Path, default=Path(_env("limiter-dir", "/var/lib/gpuslice/limiter")),
                   help="host directory of the limiter's library, preload file and per-pod state directories "
                        "(seen at the same path by the agent and the runtime; a local filesystem)")
    g.add_argument("--limiter-source", type=Path,
                   default=_env("limiter-source", "/usr/local/lib/gpuslice/libgpuslice-limiter.so") or None,
                   help="the library to install into --limiter-dir at start (the agent image's build; '' = "
                        "install nothing, use what is there)")
    g.add_argument("--hami-library", default=_env("hami-library", "") or None,
                   help="with --limiter=hami: a host libvgpu.so to mount into containers (default: the images "
                        "carry it)")
    g.add_argument("--inventory-every", type=positive_number, default=_env("inventory-every", "") or "5",
                   help="seconds between NVML health probes of the cards (5)")
    g.add_argument("--slice-resync", type=positive_number, default=_env("slice-resync", "") or "10",
                   help="seconds between checks that the ResourceSlice is still there (10)")
    g.add_argument("--simulated-gpus", type=simulated_gpus, default=_env("simulated-gpus", "") or None,
                   metavar="N|CARDS.json",
                   help="serve simulated cards instead of NVML: N V100-32GB cards, or the cards of a JSON file "
                        "(enforcement/simnode.py); tests, demos and clusters without GPUs only")
    g.add_argument("--catalog", default=_env("catalog", "") or None, metavar="TOML",
                   help="product catalog (default: built-in; read after the thaw at start, like --kubeconfig)")


@dataclass
class NodeSide:
    """The running node side (for health, metrics and tests)."""

    inventory: Inventory
    stop: threading.Event
    threads: list[threading.Thread] = field(default_factory=list)
    dra: Any = None
    slices: Any = None
    device_plugins: Any = None
    handoff: Any = None
    nri: Any = None
    writer: Writer | None = None
    problem: str = ""  # a part that could not start at all

    def healthy(self) -> tuple[bool, str]:
        ok, why, _ = self.state()
        return ok, why

    def state(self) -> tuple[bool, str, bool]:
        """(healthy, why not, failed): a part that has not finished its first attempt yet is unhealthy
        but has not failed (it has no error to name); one whose attempt failed says why."""
        if self.problem:
            return False, self.problem, True
        parts = [(self.inventory.published, "inventory not published", self.inventory.last_error)]
        if self.slices is not None and not self.slices.unsupported:
            parts.append((self.slices.synced, "ResourceSlice not published", self.slices.last_error))
        if self.device_plugins is not None:
            parts.append((self.device_plugins.healthy, "device plugins", self.device_plugins.last_error))
        for ok, what, error in parts:
            if not ok:
                return (False, f"{what}: {error}", True) if error else (False, f"starting: {what} yet", False)
        # a runtime without NRI is a configuration (logged at start), a lost NRI connection a fault
        if self.nri is not None and self.nri.ever_connected and not self.nri.connected.is_set():
            return False, f"NRI plugin lost the runtime: {self.nri.last_error or 'connection closed'}", True
        return True, "ok", False

    def report(self, every_s: float = 5.0, poll_s: float = 0.2) -> None:
        """Log the node side's state whenever it changes (run it in a thread): an ERROR only for a part
        that failed, naming why; while parts are still starting, INFO. The agent's /healthz is the
        watchdog's: a kubelet plugin that cannot do its job must not get the agent restarted."""
        said = ""
        while not self.stop.is_set():
            ok, why, failed = self.state()
            state = "ok" if ok else why
            if state != said:
                (log.error if failed else log.info)("node side: %s", state)
                said = state
            # while starting, look again soon: "ok" follows within moments, not a report period later
            self.stop.wait(every_s if ok or failed else poll_s)

    def close(self) -> None:
        self.stop.set()
        if self.dra is not None:
            self.dra.stop()
        for t in self.threads:
            t.join(5.0)


def _thread(side: NodeSide, name: str, target: Any, *args: Any) -> None:
    t = threading.Thread(target=target, args=args, name=f"gpuslice-{name}", daemon=True)
    t.start()
    side.threads.append(t)


def node_limiter(args: argparse.Namespace) -> NodeLimiter:
    """The in-container limiter of ``--limiter`` in ``--limiter-dir``, installed from ``--limiter-source``."""
    limiter = NodeLimiter(args.limiter, LimiterHost.under(str(args.limiter_dir), args.hami_library))
    try:
        for line in install(limiter, args.limiter_source if limiter.mode is LimiterMode.GPUSLICE else None):
            log.info("in-container limiter: %s", line)
    except OSError as e:  # said again by the hand-off, pod by pod
        log.error("in-container limiter: cannot install into %s: %s", args.limiter_dir, e)
    return limiter


def start(args: argparse.Namespace, source: CardSource, index: PodIndex, api: Kube,
          stop: threading.Event, events: EventSink | None = None) -> NodeSide:
    """Start the node side for ``args.node_name`` (see the module docstring); ``stop`` ends it.
    ``events`` receives the pods' hand-off warnings (a hand-off without the in-container limiter)."""
    catalog = load_catalog(args.catalog)
    inventory = Inventory(source, KubeNodeAnnotator(api, args.node_name))
    inventory.refresh(time.monotonic())  # the first publication before anything is offered
    side = NodeSide(inventory, stop)
    lookup = RecordLookup(index, api)
    limiter = node_limiter(args)
    writer = Writer(SpecDir(args.cdi_dir), inventory.minors, EditsConfig(mps=args.mps, limiter=limiter), events)
    writer.limiter_missing()  # logs what this node lacks, once, before any hand-off
    writer.reconcile()  # before any path hands anything: the state directories match the specs on disk
    side.writer = writer
    if args.dra:
        from enforcement.dra.checkpoint import Checkpoint, CheckpointError
        from enforcement.dra.plugin import DraDriver, DraServer
        from enforcement.dra.slices import SlicePublisher

        side.slices = SlicePublisher(api, args.node_name, catalog)
        inventory.subscribe(side.slices.update)
        _thread(side, "resourceslice", side.slices.run, side.stop, args.slice_resync)
        try:  # the watchdog must run even when the kubelet plugin cannot: say so, do not exit
            driver = DraDriver(api, lookup, writer, Checkpoint(args.state_dir / "dra-checkpoint.json"))
            side.dra = DraServer(driver, args.kubelet_dir).start()
        except (OSError, CheckpointError) as e:
            side.problem = f"DRA plugin not served: {e}"
            log.error("%s", side.problem)
    if args.device_plugin:
        from enforcement.deviceplugin.handoff import PodResourcesClient, TokenHandoff
        from enforcement.deviceplugin.plugin import DevicePlugins, ProductPlugin

        resources = [p.resource for p in catalog.products]
        lister = PodResourcesClient(args.kubelet_dir / "pod-resources" / "kubelet.sock")
        side.handoff = TokenHandoff(lister.held, lookup, writer, resources)
        plugin_dir = args.device_plugin_dir or args.kubelet_dir / "device-plugins"
        plugins = [ProductPlugin(p, catalog, side.handoff, plugin_dir, inventory.cards) for p in catalog.products]
        side.device_plugins = DevicePlugins(plugins, plugin_dir)
        inventory.subscribe(side.device_plugins.update)
        _thread(side, "token-handoff", side.handoff.run, side.stop)
        _thread(side, "device-plugins", side.device_plugins.run, side.stop)
    if args.nri:
        from enforcement.nri import NriPlugin

        side.nri = NriPlugin(args.nri_socket, writer, lookup)
        _thread(side, "nri", side.nri.run, side.stop)
    _thread(side, "inventory", inventory.run, side.stop, time.monotonic, args.inventory_every)
    _thread(side, "node-side-report", side.report)
    log.info("node side on %s: %d card(s), DRA %s, device plugin %s, NRI %s, in-container limiter %s",
             args.node_name, len(inventory.cards()), "on" if args.dra else "off",
             "on" if args.device_plugin else "off", "on" if args.nri else "off", limiter.mode.value)
    return side

