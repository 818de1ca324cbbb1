"""A progress bar on stderr for long runs: drawn only on a terminal or when asked (--progress)."""

from __future__ import annotations

import sys
import time
from typing import TextIO

WIDTH = 30


class Progress:
    """``update(done, total)`` redraws one line; ``close()`` ends it. Silent when disabled."""

    def __init__(self, label: str, enabled: bool | None = None, stream: TextIO | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = self.stream.isatty() if enabled is None else enabled
        self.label = label
        self.started = time.monotonic()
        self._last_draw = 0.0
        self._drawn = False

    def update(self, done: int, total: int) -> None:
        if not self.enabled or total <= 0:
            return
        now = time.monotonic()
        if done < total and now - self._last_draw < 0.1:  # at most ten redraws a second
            return
        self._last_draw = now
        frac = min(1.0, done / total)
        elapsed = now - self.started
        eta = f"{elapsed * (1 - frac) / frac:5.0f}s left" if frac > 0 else "   ...   "
        bar = "#" * round(frac * WIDTH)
        self.stream.write(f"\r{self.label} [{bar:<{WIDTH}}] {100 * frac:5.1f}% {eta}")
        self.stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False
