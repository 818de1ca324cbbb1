"""Kubernetes Events about a pod: one body, written now (``write``) or queued to a thread (``emit``).

The extender's Pending writer writes from its own thread and wants to know a write failed
(``write`` raises ``KubeError``); the node agent's loops must never wait on the network, so they
``emit``: a bounded queue feeds a worker thread, and what does not fit is dropped and counted (the
act an event reports is logged and counted where it happens; the event is best effort).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from packing.kube.client import Kube, KubeError, Obj

log = logging.getLogger(__name__)

MAX_MESSAGE = 1024  # what kubectl describe shows whole; the API server itself refuses more than 1 MiB


@dataclass(frozen=True, slots=True)
class PodEvent:
    """An Event about one pod."""

    namespace: str
    pod: str
    pod_uid: str
    reason: str
    message: str
    type: str = "Normal"  # or "Warning"


def timestamp(now: float) -> str:
    """An API time (RFC 3339, seconds)."""
    return datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def event_body(event: PodEvent, component: str, instance: str, now: float) -> Obj:
    """The core/v1 Event telling ``event``, reported by ``component`` (on ``instance``: a node, a replica)."""
    ts = timestamp(now)
    source: Obj = {"component": component}
    if instance:
        source["host"] = instance
    return {
        "apiVersion": "v1",
        "kind": "Event",
        # unique per pod, component and microsecond; the pod's name cut so the whole stays a valid name
        "metadata": {"name": f"{event.pod[:180]}.{component}.{int(now * 1e6):x}", "namespace": event.namespace},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": event.pod, "namespace": event.namespace,
                           "uid": event.pod_uid},
        "reason": event.reason,
        "message": event.message[:MAX_MESSAGE],
        "type": event.type,
        "source": source,
        "reportingComponent": component,
        "reportingInstance": instance or component,
        "firstTimestamp": ts,
        "lastTimestamp": ts,
        "count": 1,
    }


class EventWriter:
    """Writes Events about pods as ``component``; ``emit`` hands them to a background thread (started
    on first use, bounded, dropping when full), ``write`` writes at once."""

    def __init__(self, kube: Kube, component: str, instance: str = "", max_pending: int = 256,
                 clock: Callable[[], float] = time.time) -> None:
        self.kube = kube
        self.component = component
        self.instance = instance
        self.clock = clock
        self.dropped = 0  # queue full
        self.failed = 0  # the API server refused or was away
        self._queue: queue.Queue[PodEvent | None] = queue.Queue(maxsize=max_pending)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def write(self, event: PodEvent, now: float | None = None) -> None:
        """Create the Event now; KubeError when the API server refuses or cannot be reached."""
        when = self.clock() if now is None else now
        self.kube.create_event(event.namespace, event_body(event, self.component, self.instance, when))

    def emit(self, event: PodEvent) -> None:
        """Queue the Event for the worker thread; never blocks."""
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"{self.component}-events", daemon=True)
                self._thread.start()
        try:
            self._queue.put_nowait(event)
        except queue.Full:
            self.dropped += 1

    def close(self, timeout_s: float = 2.0) -> None:
        """Flush what is queued (up to ``timeout_s``) and stop the worker."""
        if self._thread is None:
            return
        try:
            self._queue.put(None, timeout=timeout_s)
        except queue.Full:
            return
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while True:
            event = self._queue.get()
            if event is None:
                return
            try:
                self.write(event)
            except KubeError as e:  # an unreachable API server must not stop the caller's work
                self.failed += 1
                log.warning("could not post event %s on %s/%s: %s", event.reason, event.namespace, event.pod, e)
