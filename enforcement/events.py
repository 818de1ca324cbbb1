"""Kubernetes Events on the pod when the agent acts on it (a kill), through an injectable sink.

Posting to the API server can block, so :class:`KubeEventSink` hands events to a worker thread:
the watchdog's loop never waits on the network.
"""

from __future__ import annotations

import datetime as dt
import logging
import queue
import threading
from dataclasses import dataclass
from typing import Any, Protocol

log = logging.getLogger(__name__)

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


@dataclass(frozen=True, slots=True)
class PodEvent:
    """A Warning/Normal event about one pod."""

    namespace: str
    pod: str
    pod_uid: str
    reason: str
    message: str
    type: str = "Warning"

    @staticmethod
    def about(pod: PodRef, reason: str, message: str) -> PodEvent:
        """A Warning event on ``pod``."""
        return PodEvent(pod.namespace, pod.pod, pod.pod_uid, reason, message)


class EventSink(Protocol):
    def emit(self, pod: PodRef, reason: str, message: str) -> None: ...


class RecordingEventSink:
    """Keeps events in a list (tests, simulation)."""

    def __init__(self) -> None:
        self.events: list[PodEvent] = []

    def emit(self, pod: PodRef, reason: str, message: str) -> None:
        self.events.append(PodEvent.about(pod, reason, message))


class KubeEventSink:
    """Creates core/v1 Events through CoreV1Api on a background thread (bounded queue, drops when full)."""

    def __init__(self, core_v1: Any, node_name: str, max_pending: int = 256) -> None:
        self.api = core_v1
        self.node_name = node_name
        self.dropped = 0
        self._queue: queue.Queue[PodEvent | None] = queue.Queue(maxsize=max_pending)
        self._thread = threading.Thread(target=self._run, name="gpuslice-events", daemon=True)
        self._thread.start()

    def emit(self, pod: PodRef, reason: str, message: str) -> None:
        try:
            self._queue.put_nowait(PodEvent.about(pod, reason, message))
        except queue.Full:
            self.dropped += 1  # the kill itself is counted in metrics; an event is best effort

    def close(self, timeout_s: float = 2.0) -> None:
        """Flush what is queued (up to ``timeout_s``) and stop the worker."""
        try:
            self._queue.put(None, timeout=timeout_s)
        except queue.Full:
            return
        self._thread.join(timeout_s)

    def _run(self) -> None:
        from kubernetes import client

        while True:
            event = self._queue.get()
            if event is None:
                return
            now = dt.datetime.now(dt.UTC)
            body = client.CoreV1Event(
                metadata=client.V1ObjectMeta(generate_name=f"{event.pod}.", namespace=event.namespace),
                involved_object=client.V1ObjectReference(
                    kind="Pod", api_version="v1", name=event.pod, namespace=event.namespace, uid=event.pod_uid
                ),
                reason=event.reason,
                message=event.message[:1024],
                type=event.type,
                source=client.V1EventSource(component=COMPONENT, host=self.node_name),
                reporting_component=COMPONENT,
                reporting_instance=self.node_name,
                first_timestamp=now,
                last_timestamp=now,
                count=1,
            )
            try:
                self.api.create_namespaced_event(event.namespace, body)
            except Exception as e:  # an unreachable API server must not stop enforcement
                log.warning("could not post event %s on %s/%s: %s", event.reason, event.namespace, event.pod, e)
