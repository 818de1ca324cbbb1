"""Container edits: what a container holding a slice gets, the one core of the DRA, device plugin and NRI paths.

From a pod's allocation record (``packing.record``) and this node's inventory:

* the card: ``NVIDIA_VISIBLE_DEVICES=<uuid>[,<uuid>...]`` (the NVIDIA container stack reads it),
  and the device nodes ``/dev/nvidia<minor>``, ``/dev/nvidiactl``, ``/dev/nvidia-uvm``,
  ``/dev/nvidia-uvm-tools`` where they exist on the host;
* the memory cap for in-process enforcement: ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=<MiB>M,...``
  (read by MPS clients, ignored without an MPS server) and the in-container limiter
  (``enforcement.limiter``: ``GPUSLICE_SLICE_MEMORY_MIB``, ``GPUSLICE_SLICE_STATE_DIR``, the
  library, its ``/etc/ld.so.preload`` entry and the pod's state directory; or HAMi-core's
  variables), where the node has it; the agent's memory watchdog stays the authority;
* the share, ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=<percent>``, only where the node runs MPS (a
  static SM cap is not work-conserving, so it is not set where the agent's pacer steers the share);
* ``GPUSLICE_*`` facts about the slice (product, pod UID, share) for tools in the container.

The edits are data; ``enforcement.cdi`` turns them into a CDI spec, and ``enforcement.handoff``
creates the state directory they name before it writes the spec.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from packing.products import MILLI_PER_GPU
from packing.record import AllocationRecord

if TYPE_CHECKING:  # limiterhost builds on this module's Mount: the type only, no import cycle
    from enforcement.limiterhost import NodeLimiter

# Control nodes every CUDA process needs besides its card's own /dev/nvidia<minor>.
CONTROL_DEVICE_NODES = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools")


class EditsError(ValueError):
    """The record names a GPU this node does not have, or asks for something we cannot give."""


@dataclass(frozen=True, slots=True)
class DeviceNode:
    path: str
    permissions: str = "rw"


@dataclass(frozen=True, slots=True)
class Mount:
    host_path: str
    container_path: str
    read_only: bool = True


@dataclass(frozen=True, slots=True)
class ContainerEdits:
    """Environment (``KEY=value``), device nodes and mounts for one container; and for the hand-off,
    the host state directory to create before the container starts (None: none), and what the
    node lacks to hand the in-container limiter (said, never mounted)."""

    env: tuple[str, ...]
    device_nodes: tuple[DeviceNode, ...] = ()
    mounts: tuple[Mount, ...] = ()
    state_dir: str | None = None
    limiter_missing: tuple[str, ...] = ()

    def env_map(self) -> dict[str, str]:
        return dict(e.split("=", 1) for e in self.env)


@dataclass(frozen=True, slots=True)
class EditsConfig:
    """Node-wide choices: where device nodes live, whether MPS is used, the in-container limiter
    (None: none at all, as ``LimiterMode.OFF``)."""

    dev_root: Path = Path("/")
    mps: bool = False
    limiter: NodeLimiter | None = None


def _device_nodes(minors: Sequence[int], config: EditsConfig) -> tuple[DeviceNode, ...]:
    paths = [f"/dev/nvidia{m}" for m in minors] + list(CONTROL_DEVICE_NODES)
    return tuple(DeviceNode(p) for p in paths if (config.dev_root / p.lstrip("/")).exists())


def slice_edits(
    record: AllocationRecord,
    pod_uid: str,
    minors: Mapping[str, int],
    config: EditsConfig = EditsConfig(),
) -> ContainerEdits:
    """The edits for a container of the pod holding ``record``; ``minors`` maps this node's UUIDs
    to their device minor numbers. EditsError when the record names a GPU not on this node."""
    missing = [g for g in record.gpus if g not in minors]
    if missing:
        raise EditsError(f"allocation record names GPU(s) {', '.join(missing)} that this node does not have")
    percent = record.milli * 100 // MILLI_PER_GPU
    # Container ordinals follow NVIDIA_VISIBLE_DEVICES' order: the record's order.
    pinned = ",".join(f"{i}={record.memory_mib}M" for i in range(len(record.gpus)))
    env = {
        "NVIDIA_VISIBLE_DEVICES": ",".join(record.gpus),
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": pinned,
        "GPUSLICE_SLICE_SHARE_PERCENT": str(percent),
        "GPUSLICE_SLICE_PRODUCT": record.product or "",
        "GPUSLICE_POD_UID": pod_uid,
    }
    if config.mps:
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(percent)
    nodes = _device_nodes([minors[g] for g in record.gpus], config)
    if config.limiter is None:
        return ContainerEdits(tuple(f"{k}={v}" for k, v in env.items()), nodes)
    try:  # keyed by the pod: its containers share one accounting, whichever path handed them
        part = config.limiter.edits(record.memory_mib, len(record.gpus), pod_uid)
    except ValueError as e:
        raise EditsError(f"in-container limiter: {e}") from e
    env.update(part.env)
    return ContainerEdits(tuple(f"{k}={v}" for k, v in env.items()), nodes, part.mounts, part.state_dir,
                          part.missing)
