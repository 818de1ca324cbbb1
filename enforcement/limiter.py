"""What the node hand-off gives a container so that, inside it, its slice is the card.

The in-container limiter (``enforcement/interposer``, ``libgpuslice-limiter.so``) reads two
variables; the hand-off (DRA CDI container edits, or the device plugin's Allocate response) sets
them and mounts three things. :func:`limiter_edits` is that, as data: pure, no I/O. The host side
(the library and the preload file installed by the agent's DaemonSet, the per-slice state
directory created before the container starts and removed after) is described by
:class:`LimiterHost` and in ``enforcement/README.md`` ("In-container limiter: the hand-off").

Two modes. ``GPUSLICE`` (the default) preloads our library through ``/etc/ld.so.preload``.
``HAMI`` is the opt-in for clusters that already ship HAMi-core's ``libvgpu.so``: it sets
HAMi-core's variables instead (``CUDA_DEVICE_MEMORY_LIMIT_<i>`` and friends) and nothing of
ours, so the two limiters are never stacked.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass

CONTAINER_LIBRARY = "/usr/local/gpuslice/lib/libgpuslice-limiter.so"
CONTAINER_PRELOAD = "/etc/ld.so.preload"
CONTAINER_STATE_DIR = "/run/gpuslice/limiter"
HAMI_CONTAINER_LIBRARY = "/usr/local/vgpu/libvgpu.so"
HAMI_LOCK_DIR = "/tmp/vgpulock"

MAX_CAP_MIB = 1 << 24  # the library refuses larger caps (a typo, not a card)
MAX_DEVICES = 16  # devices the library's ledger names
_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,199}")


class LimiterMode(enum.Enum):
    GPUSLICE = "gpuslice"
    HAMI = "hami"


@dataclass(frozen=True, slots=True)
class LimiterHost:
    """Where the node keeps the limiter's files (the agent's DaemonSet installs the first two).

    ``preload_file`` holds one line, :data:`CONTAINER_LIBRARY` (:func:`preload_line`);
    ``hami_preload_file`` likewise names :data:`HAMI_CONTAINER_LIBRARY`. ``hami_library`` is
    None where the images (or HAMi's own hand-off) already carry ``libvgpu.so``.
    """

    library: str = "/var/lib/gpuslice/limiter/libgpuslice-limiter.so"
    preload_file: str = "/var/lib/gpuslice/limiter/ld.so.preload"
    state_root: str = "/var/lib/gpuslice/limiter/state"
    hami_library: str | None = None
    hami_preload_file: str = "/var/lib/gpuslice/limiter/hami-ld.so.preload"


@dataclass(frozen=True, slots=True)
class Mount:
    """A bind mount of a host path into the container."""

    host_path: str
    container_path: str
    read_only: bool


@dataclass(frozen=True, slots=True)
class LimiterEdits:
    """The container edits for one slice holder, plus the state directory the hand-off must
    create (empty, writable by every user of the container) before the container starts and
    remove once the slice is released."""

    env: tuple[tuple[str, str], ...]
    mounts: tuple[Mount, ...]
    state_dir: str

    def env_list(self) -> list[str]:
        """``KEY=value`` strings, as CDI's ``containerEdits.env`` and the device plugin want them."""
        return [f"{k}={v}" for k, v in self.env]


def preload_line(mode: LimiterMode = LimiterMode.GPUSLICE) -> str:
    """The content of the host's preload file for ``mode``."""
    return (CONTAINER_LIBRARY if mode is LimiterMode.GPUSLICE else HAMI_CONTAINER_LIBRARY) + "\n"


def limiter_edits(
    cap_mib: int,
    devices: int,
    key: str,
    mode: LimiterMode = LimiterMode.GPUSLICE,
    host: LimiterHost | None = None,
) -> LimiterEdits:
    """The env and mounts that cap each of ``devices`` GPUs at ``cap_mib`` inside a container.

    ``key`` names the slice holder's state directory under ``host.state_root`` (a DRA claim UID,
    or the pod UID for the device plugin): the containers of one pod that share the slice share
    it, so their processes are accounted together, as the agent's watchdog counts them.
    Raises ValueError for a cap, a device count or a key the library could not honour.
    """
    host = host or LimiterHost()
    if not 1 <= cap_mib <= MAX_CAP_MIB:
        raise ValueError(f"cap_mib must be 1..{MAX_CAP_MIB} MiB, got {cap_mib}")
    if not 1 <= devices <= MAX_DEVICES:
        raise ValueError(f"devices must be 1..{MAX_DEVICES}, got {devices}")
    if not _KEY.fullmatch(key):
        raise ValueError(f"state key {key!r} must be 1-200 characters of [A-Za-z0-9_.-], not starting with . - _")
    state_dir = f"{host.state_root.rstrip('/')}/{key}"
    state = Mount(state_dir, CONTAINER_STATE_DIR, read_only=False)
    if mode is LimiterMode.GPUSLICE:
        env = (("GPUSLICE_SLICE_MEMORY_MIB", str(cap_mib)), ("GPUSLICE_SLICE_STATE_DIR", CONTAINER_STATE_DIR))
        mounts = (
            Mount(host.library, CONTAINER_LIBRARY, read_only=True),
            Mount(host.preload_file, CONTAINER_PRELOAD, read_only=True),
            state,
        )
        return LimiterEdits(env, mounts, state_dir)
    hami_env = (
        *((f"CUDA_DEVICE_MEMORY_LIMIT_{i}", f"{cap_mib}m") for i in range(devices)),
        ("CUDA_DEVICE_MEMORY_SHARED_CACHE", f"{CONTAINER_STATE_DIR}/vgpu.cache"),
        ("GPU_CORE_UTILIZATION_POLICY", "disable"),  # compute is the agent's pacer's: one controller
        ("LIBCUDA_LOG_LEVEL", "0"),  # its log lines would break parsers of nvidia-smi's output
    )
    hami_mounts = [state, Mount(HAMI_LOCK_DIR, HAMI_LOCK_DIR, read_only=False)]
    if host.hami_library is not None:
        hami_mounts += [
            Mount(host.hami_library, HAMI_CONTAINER_LIBRARY, read_only=True),
            Mount(host.hami_preload_file, CONTAINER_PRELOAD, read_only=True),
        ]
    return LimiterEdits(hami_env, tuple(hami_mounts), state_dir)
