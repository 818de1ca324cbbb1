"""Where one request's time goes: phases measured on the request's own thread.

The HTTP layer opens a ``Phases`` for each request (``measuring``); the code it calls adds to it
with ``phase(name)`` or through a ``TimedLock``, without being handed anything. The slow-request
log line and the per-phase histogram read it back. Phases of a request:

* ``read``: its body arriving (the server front buffers a body before any thread sees it);
* ``queued``: waiting for a free worker thread;
* ``parse``: JSON and wire validation, the pod's ask;
* ``lock_wait`` / ``locked``: waiting for the state lock, and holding it (learning and deciding);
* ``binder``: the binder making a bind real (cluster: the API calls);
* ``encode``: the reply.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import TracebackType

_local = threading.local()


@dataclass(slots=True)
class Phases:
    """Seconds per phase of one request, and when it started (``time.perf_counter``)."""

    verb: str
    started: float
    seconds: dict[str, float] = field(default_factory=dict)

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds

    def total(self) -> float:
        return time.perf_counter() - self.started

    def describe(self) -> str:
        return ", ".join(f"{name} {s * 1000:.1f} ms" for name, s in self.seconds.items())


def current() -> Phases | None:
    """The phases of the request this thread is serving, if any."""
    phases: Phases | None = getattr(_local, "phases", None)
    return phases


@contextmanager
def measuring(phases: Phases) -> Iterator[Phases]:
    """Make ``phases`` this thread's current request for the duration of the block."""
    before = current()
    _local.phases = phases
    try:
        yield phases
    finally:
        _local.phases = before


@contextmanager
def phase(name: str) -> Iterator[None]:
    """Add the block's duration to the current request's phase ``name`` (nothing outside a request)."""
    phases = current()
    if phases is None:
        yield
        return
    started = time.perf_counter()
    try:
        yield
    finally:
        phases.add(name, time.perf_counter() - started)


class TimedLock:
    """A ``threading.Lock`` that adds the wait for it and the time it is held to the current request."""

    __slots__ = ("_acquired", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._acquired = 0.0  # when the holder got it (only the holder reads it)

    def __enter__(self) -> TimedLock:
        phases = current()
        if phases is None:
            self._lock.acquire()
            self._acquired = 0.0
            return self
        asked = time.perf_counter()
        self._lock.acquire()
        self._acquired = time.perf_counter()
        phases.add("lock_wait", self._acquired - asked)
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        acquired, self._acquired = self._acquired, 0.0
        self._lock.release()
        phases = current()
        if phases is not None and acquired:
            phases.add("locked", time.perf_counter() - acquired)

    def locked(self) -> bool:
        return self._lock.locked()
