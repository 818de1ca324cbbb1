"""The records the agent refuses to honour, said where the pod's owner and the operator look.

A pod whose ``gpuslice.io/allocation`` is not the extender's record for that very pod on this node
(``packing.record.record_of_pod``: a copy of another pod's, one written by hand, one for another
node, an unreadable one; or a record for a product the pod does not ask for) gets no card from any
hand-off path. Each such pod is told once, by a Warning Event ``AllocationRecordRefused`` naming
why, logged, and counted by reason (``gpuslice_agent_records_refused_total{reason}``; again only
when its record changes), whichever path met it first (the pod watch, a look-up of the pod by NRI
or a kubelet plugin).
"""

from __future__ import annotations

import logging
import threading

from enforcement.events import EventSink, PodRef
from packing.record import REFUSALS, RecordRefused

log = logging.getLogger(__name__)

REFUSED = "AllocationRecordRefused"  # the Event's reason


class Refusals:
    """Tells each refused pod once (per distinct reason), and counts them by reason. Thread-safe."""

    def __init__(self, node: str, events: EventSink | None = None) -> None:
        self.node = node
        self.events = events
        self.counts: dict[str, int] = dict.fromkeys(REFUSALS, 0)
        self._told: dict[str, str] = {}  # pod uid -> the refusal it was told
        self._lock = threading.Lock()

    def refused(self, pod: PodRef, error: RecordRefused) -> None:
        """``pod`` carries a record this node does not honour: say so, unless it was told this already."""
        message = str(error)
        with self._lock:
            if self._told.get(pod.pod_uid) == message:
                return
            self._told[pod.pod_uid] = message
            self.counts[error.reason] = self.counts.get(error.reason, 0) + 1
        log.warning("pod %s/%s (%s) gets no card: %s", pod.namespace, pod.pod, pod.pod_uid, message)
        if self.events is not None:
            self.events.emit(pod, REFUSED, f"gpuslice agent on node {self.node} hands this pod no GPU: {message}")

    def totals(self) -> dict[str, int]:
        """Pods refused so far, by reason."""
        with self._lock:
            return dict(self.counts)

    def forget(self, pod_uid: str) -> None:
        """The pod is gone (a uid is never reused): forget that it was told."""
        with self._lock:
            self._told.pop(pod_uid, None)
