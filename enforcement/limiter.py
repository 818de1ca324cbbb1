"""What the node hand-off gives a container so that, inside it, its slice is the card.

The in-container limiter (``enforcement/interposer``, ``libgpuslice-limiter.so``) reads two
variables; the hand-off (the CDI spec every path writes through ``enforcement.edits``) sets them
and mounts three things. :func:`limiter_edits` is that, as data: pure, no I/O. Where the node
keeps the files is :class:`LimiterHost`; installing them, checking them and the per-slice state
directories are ``enforcement.limiterhost``. See ``enforcement/README.md`` ("The hand-off").

Three modes. ``GPUSLICE`` (the default) preloads our library through ``/etc/ld.so.preload``.
``HAMI`` is the opt-in for clusters that already ship HAMi-core's ``libvgpu.so``: it sets
HAMi-core's variables instead (``CUDA_DEVICE_MEMORY_LIMIT_<i>`` and friends) and nothing of
ours, so the two limiters are never stacked. ``OFF`` hands no in-container limiter: the agent's
memory watchdog alone holds the cap.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Sequence
from dataclasses import dataclass

from enforcement.edits import Mount

CONTAINER_LIBRARY = "/usr/local/gpuslice/lib/libgpuslice-limiter.so"
CONTAINER_PRELOAD = "/etc/ld.so.preload"
CONTAINER_STATE_DIR = "/run/gpuslice/limiter"
HAMI_CONTAINER_LIBRARY = "/usr/local/vgpu/libvgpu.so"
HAMI_LOCK_DIR = "/tmp/vgpulock"  # where HAMi-core takes its node-wide lock, inside the container
LIBRARY_NAME = "libgpuslice-limiter.so"

MAX_CAP_MIB = 1 << 24  # the library refuses larger caps (a typo, not a card)
MAX_DEVICES = 16  # devices the library's ledger names
_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,199}")


class LimiterMode(enum.Enum):
    GPUSLICE = "gpuslice"
    HAMI = "hami"
    OFF = "off"


@dataclass(frozen=True, slots=True)
class LimiterHost:
    """Where the node keeps the limiter's files (``--limiter-dir``; the agent installs the first two).

    ``preload_file`` holds one line, :data:`CONTAINER_LIBRARY` (:func:`preload_line`);
    ``hami_preload_file`` likewise names :data:`HAMI_CONTAINER_LIBRARY`. ``hami_library`` is
    None where the images (or HAMi's own hand-off) already carry ``libvgpu.so``. ``hami_lock_dir``
    is HAMi-core's node-wide lock directory, shared by every HAMi-limited container of the node.
    """

    library: str = "/var/lib/gpuslice/limiter/libgpuslice-limiter.so"
    preload_file: str = "/var/lib/gpuslice/limiter/ld.so.preload"
    state_root: str = "/var/lib/gpuslice/limiter/state"
    hami_library: str | None = None
    hami_preload_file: str = "/var/lib/gpuslice/limiter/hami-ld.so.preload"
    hami_lock_dir: str = "/var/lib/gpuslice/limiter/hami-lock"

    @staticmethod
    def under(root: str, hami_library: str | None = None) -> LimiterHost:
        """The layout of one limiter directory (the defaults are ``under("/var/lib/gpuslice/limiter")``)."""
        root = root.rstrip("/")
        return LimiterHost(f"{root}/{LIBRARY_NAME}", f"{root}/ld.so.preload", f"{root}/state", hami_library,
                           f"{root}/hami-ld.so.preload", f"{root}/hami-lock")

    def files(self, mode: LimiterMode) -> tuple[tuple[str, str | None], ...]:
        """The host files ``mode`` mounts, each with the content it must hold (None: any, not empty)."""
        if mode is LimiterMode.GPUSLICE:
            return ((self.library, None), (self.preload_file, preload_line(mode)))
        if mode is LimiterMode.HAMI and self.hami_library is not None:
            return ((self.hami_library, None), (self.hami_preload_file, preload_line(mode)))
        return ()


@dataclass(frozen=True, slots=True)
class LimiterEdits:
    """The container edits for one slice holder; the state directory the hand-off must create
    (empty, writable by every user of the container) before the container starts and remove once
    the slice is released (None: none to create); the host files of ``LimiterHost.files`` the node
    lacks (``missing``: they are not mounted, and the watchdog alone holds the cap)."""

    env: tuple[tuple[str, str], ...]
    mounts: tuple[Mount, ...]
    state_dir: str | None
    missing: tuple[str, ...] = ()

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
    missing: Sequence[str] = (),
) -> LimiterEdits:
    """The env and mounts that cap each of ``devices`` GPUs at ``cap_mib`` inside a container.

    ``key`` names the slice holder's state directory under ``host.state_root``: the pod UID, so
    that every container of the pod holding the slice, whichever path handed it, shares one
    accounting, as the agent's watchdog counts them. ``missing``: the host files of
    ``host.files(mode)`` the node lacks, never mounted. Our library without its files leaves only
    ``GPUSLICE_SLICE_MEMORY_MIB`` (the cap, for an image that carries the library itself);
    HAMi-core without its host copy keeps its variables (its images may carry it).
    Raises ValueError for a cap, a device count or a key the library could not honour.
    """
    host = host or LimiterHost()
    if not 1 <= cap_mib <= MAX_CAP_MIB:
        raise ValueError(f"cap_mib must be 1..{MAX_CAP_MIB} MiB, got {cap_mib}")
    if not 1 <= devices <= MAX_DEVICES:
        raise ValueError(f"devices must be 1..{MAX_DEVICES}, got {devices}")
    if not _KEY.fullmatch(key):
        raise ValueError(f"state key {key!r} must be 1-200 characters of [A-Za-z0-9_.-], not starting with . - _")
    if mode is LimiterMode.OFF:
        return LimiterEdits((), (), None)
    missing = tuple(missing)
    state_dir = f"{host.state_root.rstrip('/')}/{key}"
    state = Mount(state_dir, CONTAINER_STATE_DIR, read_only=False)
    if mode is LimiterMode.GPUSLICE:
        if missing:
            return LimiterEdits((("GPUSLICE_SLICE_MEMORY_MIB", str(cap_mib)),), (), None, missing)
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
    hami_mounts = [state, Mount(host.hami_lock_dir, HAMI_LOCK_DIR, read_only=False)]
    if host.hami_library is not None and not missing:
        hami_mounts += [
            Mount(host.hami_library, HAMI_CONTAINER_LIBRARY, read_only=True),
            Mount(host.hami_preload_file, CONTAINER_PRELOAD, read_only=True),
        ]
    return LimiterEdits(hami_env, tuple(hami_mounts), state_dir, missing)
