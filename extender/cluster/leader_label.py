"""The leader's label on its own pod: what the extender Service selects, so only the leader is reached.

Both replicas are Ready while they serve (a standby that never turned Ready would stall every
rolling update and node drain); routing is by this label instead. A term labels its pod once its
ledger is rebuilt; stepping down, and every start (a restarted container may find the label its
previous process left), remove it. A write that fails is retried by the caller and logged once per
outcome change; off when no label is configured.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field

from packing.kube.client import MERGE_PATCH, Kube, KubeError

log = logging.getLogger(__name__)


@dataclass
class LeaderLabel:
    """Sets or removes ``label: "true"`` on the pod ``namespace/pod``."""

    kube: Kube
    namespace: str
    pod: str
    label: str
    _last: str = ""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def claim(self, ended: threading.Event) -> bool:
        """Set the label for a term, unless it has ended (then True: nothing to do). Serialised with
        ``release``, so a term that ends while its label is being written never keeps it."""
        with self._lock:
            return True if ended.is_set() else self.set(True)

    def release(self) -> None:
        with self._lock:
            self.set(False)

    def set(self, leading: bool) -> bool:
        """Write the label (True when the pod carries what ``leading`` says afterwards)."""
        patch = {"metadata": {"labels": {self.label: "true" if leading else None}}}
        try:
            self.kube.patch_pod(self.namespace, self.pod, patch, MERGE_PATCH)
        except KubeError as e:
            if e.status == 404 and not leading:
                return True  # no such pod: nothing to remove
            self._say(f"cannot {'set' if leading else 'remove'} label {self.label} on pod "
                      f"{self.namespace}/{self.pod}: {e}", logging.WARNING)
            return False
        self._say(f"pod {self.namespace}/{self.pod}: label {self.label} {'set' if leading else 'removed'}",
                  logging.INFO)
        return True

    def _say(self, text: str, level: int) -> None:
        if text != self._last:
            log.log(level, "%s", text)
            self._last = text
