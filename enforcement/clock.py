"""Time for the agent: the real wall clock, or a simulated one that tests advance by hand.

NVML stamps its utilisation samples with wall-clock microseconds, so the agent's clock is a
wall clock too: the pacer lines samples up with its own freeze decisions on one time base. Ages
that must not jump with the wall clock (how long a cgroup has been frozen, how long since the
loop last made progress) use :meth:`Clock.monotonic`.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Seconds on the same base as NVML sample timestamps (microseconds / 1e6)."""

    def now(self) -> float: ...

    def monotonic(self) -> float:
        """Seconds that never go backwards (ages and deadlines)."""
        ...

    def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """The host's wall clock."""

    def now(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            time.sleep(seconds)


class SimClock:
    """A clock that only moves when told to: simulated minutes run in wall-clock milliseconds."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start

    def now(self) -> float:
        return self._now

    def monotonic(self) -> float:
        return self._now

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)

    def advance(self, seconds: float) -> None:
        """Move time forward by ``seconds`` (never backwards)."""
        if seconds < 0:
            raise ValueError(f"a clock does not run backwards ({seconds} s)")
        self._now += seconds

    def advance_to(self, when: float) -> None:
        """Set time to ``when`` (not earlier than now): avoids summing float steps."""
        if when < self._now:
            raise ValueError(f"a clock does not run backwards ({when} < {self._now})")
        self._now = when
