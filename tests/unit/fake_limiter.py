"""An in-container limiter installed into a temporary directory, as the agent installs it at start."""

from __future__ import annotations

from pathlib import Path

from enforcement.limiter import LimiterHost, LimiterMode
from enforcement.limiterhost import NodeLimiter, install

LIBRARY = b"\x7fELF stand-in for libgpuslice-limiter.so"  # only copied and mounted, never loaded here


def installed(root: Path, mode: LimiterMode = LimiterMode.GPUSLICE, hami_library: str | None = None) -> NodeLimiter:
    """A limiter of ``mode`` whose files are in ``root/limiter`` (our library copied from a stand-in)."""
    source = root / "image" / "libgpuslice-limiter.so"
    source.parent.mkdir(parents=True, exist_ok=True)
    source.write_bytes(LIBRARY)
    limiter = NodeLimiter(mode, LimiterHost.under(str(root / "limiter"), hami_library))
    install(limiter, source)
    return limiter
