"""Warning Events on a pod when the agent acts on it (a kill, a refused record), through an injectable sink.

Posting to the API server can block, so :class:`KubeEventSink` hands events to the substrate's
``EventWriter`` worker thread (``packing.kube.events``): the watchdog's loop never waits on the network.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from packing.kube.client import Kube
from packing.kube.events import EventWriter, PodEvent

COMPONENT = "gpuslice-agent"


class PodRef(Protocol):
    """The pod an event is about (a ``SliceHolder``, a ``Pod``)."""

    @property
    def namespace(self) -> str: ...

    @property
    def pod(self) -> str: ...

    @property
    def pod_uid(self) -> str: ...


@dataclass(frozen=True, slots=True)
class Pod:
    """A pod by namespace, name and uid."""

    namespace: str
    pod: str
    pod_uid: str


def warning(pod: PodRef, reason: str, message: str) -> PodEvent:
    """A Warning event on ``pod``."""
    return PodEvent(pod.namespace, pod.pod, pod.pod_uid, reason, message, "Warning")


class EventSink(Protocol):
    def emit(self, pod: PodRef, reason: str, message: str) -> None: ...


class RecordingEventSink:
    """Keeps events in a list (tests, simulation)."""

    def __init__(self) -> None:
        self.events: list[PodEvent] = []

    def emit(self, pod: PodRef, reason: str, message: str) -> None:
        self.events.append(warning(pod, reason, message))


class KubeEventSink:
    """Creates the Events on a background thread (bounded queue, drops when full)."""

    def __init__(self, kube: Kube, node_name: str, max_pending: int = 256) -> None:
        self.writer = EventWriter(kube, COMPONENT, node_name, max_pending)

    @property
    def dropped(self) -> int:
        return self.writer.dropped  # the act itself is counted in metrics; an event is best effort

    def emit(self, pod: PodRef, reason: str, message: str) -> None:
        self.writer.emit(warning(pod, reason, message))

    def close(self, timeout_s: float = 2.0) -> None:
        """Flush what is queued (up to ``timeout_s``) and stop the worker."""
        self.writer.close(timeout_s)
