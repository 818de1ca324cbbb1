"""From a pod to its container edits: the allocation record, found by pod UID, and its CDI spec.

Every path ends here. DRA names the pod in its claim's ``status.reservedFor`` (UID and name); the
device plugin learns it from the kubelet's PodResources API (namespace and name, then the UID from
the pod itself); NRI from the pod sandbox the runtime names. Either way the record is read from
*that* pod, never matched by request size, arrival order or a node-wide lock. :class:`Writer`
writes the spec and keeps the in-container limiter's state directory beside it.
"""

from __future__ import annotations

import logging
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from enforcement.cdi import POD_UID_ANNOTATION, SpecDir, qualified, spec_mounts
from enforcement.cgroups import canonical_uid
from enforcement.edits import EditsConfig, EditsError, slice_edits
from enforcement.events import EventSink
from enforcement.limiter import CONTAINER_STATE_DIR, LimiterMode
from enforcement.limiterhost import make_state_dir, release_state_dir, state_dirs
from enforcement.pods import ManagedPod, PodIndex
from packing.kube.client import Kube, KubeError
from packing.kube.objects import field

log = logging.getLogger(__name__)

MinorSource = Callable[[], dict[str, int]]  # this node's GPU UUID -> device minor, now
LIMITER_MISSING = "SliceLimiterMissing"  # the event reason of a hand-off without the in-container limiter
_STRIPES = 64


class HandoffError(RuntimeError):
    """The pod, its record or its card cannot be found: the kubelet is told, and retries."""


@dataclass(frozen=True, slots=True)
class Handoff:
    """What gives a container its slice: the record's pod, and the CDI spec written for it."""

    pod: ManagedPod
    cdi_device: str


class RecordLookup:
    """Allocation records by pod: from the node's pod watch, else read from the API (watch lag)."""

    def __init__(self, index: PodIndex, api: Kube | None) -> None:
        self.index = index
        self.api = api

    def _read(self, namespace: str, name: str) -> ManagedPod | None:
        if self.api is None:
            return None
        try:
            pod = self.api.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        except KubeError as e:
            raise HandoffError(f"cannot read pod {namespace}/{name}: {e}") from e
        if pod is None:
            return None
        managed, problem = self.index.parse(pod)
        if managed is None and problem is not None:
            raise HandoffError(f"pod {namespace}/{name}: {problem}")
        return managed

    def by_uid(self, uid: str, namespace: str, name: str) -> ManagedPod:
        """The managed pod with this UID; HandoffError when it has no record of its own (or is another pod)."""
        uid = canonical_uid(uid)
        refused = self.index.rejected().get(uid)
        if refused is not None:  # the watch saw its record and refused it (said once, there)
            raise HandoffError(f"pod {namespace}/{name}: {refused}")
        managed = self.index.get(uid) or self._read(namespace, name)
        if managed is None:
            raise HandoffError(f"pod {namespace}/{name} ({uid}) has no gpuslice allocation record on this node")
        if managed.uid != uid:
            raise HandoffError(f"pod {namespace}/{name} is now {managed.uid}, not {uid}")
        return managed

    def by_name(self, namespace: str, name: str) -> ManagedPod:
        managed = self.index.find(namespace, name) or self._read(namespace, name)
        if managed is None:
            raise HandoffError(f"pod {namespace}/{name} has no gpuslice allocation record on this node")
        return managed


class Writer:
    """Writes and removes the CDI spec of one device for one pod's record, with the state directory
    of the pod's in-container limiter: created before the spec that mounts it is written, removed
    once no spec on disk mounts it (so a pod handed by two paths keeps it until both let go). The
    spec files are the state: :meth:`reconcile` repairs the directories from them after a restart.

    A hand-off made without the limiter (its files are not on the node) is said: logged when that
    changes, one Warning event per pod (``SliceLimiterMissing``), and counted."""

    def __init__(self, specs: SpecDir, minors: MinorSource, config: EditsConfig,
                 events: EventSink | None = None) -> None:
        self.specs = specs
        self.minors = minors
        self.config = config
        self.events = events
        self.without_limiter = 0  # hand-offs written without the in-container limiter's files
        self._stripes = tuple(threading.Lock() for _ in range(_STRIPES))  # per state directory, never node-wide
        self._said: tuple[str, ...] | None = None  # the limiter's missing files last logged
        self._told: set[str] = set()  # pods sent a SliceLimiterMissing event, until their spec goes

    def _lock(self, state_dir: str | None) -> threading.Lock:
        return self._stripes[zlib.crc32((state_dir or "").encode()) % _STRIPES]

    def write(self, device: str, pod: ManagedPod) -> Handoff:
        try:
            edits = slice_edits(pod.record, pod.uid, self.minors(), self.config)
        except EditsError as e:
            raise HandoffError(f"pod {pod.namespace}/{pod.name}: {e}") from e
        with self._lock(edits.state_dir):
            if edits.state_dir is not None:
                try:
                    make_state_dir(edits.state_dir)
                except OSError as e:
                    raise HandoffError(f"pod {pod.namespace}/{pod.name}: cannot create the in-container limiter's "
                                       f"state directory {edits.state_dir}: {e}") from e
            try:
                self.specs.write(device, edits, pod.uid, {"gpuslice.io/pod": f"{pod.namespace}/{pod.name}"})
            except OSError:
                if edits.state_dir is not None:
                    self._release_unused(edits.state_dir)  # nothing half-done stays
                raise
        self._limiter_state(edits.limiter_missing, pod)
        return Handoff(pod, qualified(device))

    def remove(self, device: str) -> bool:
        """Remove the spec of ``device``, and its state directory when no other spec mounts it;
        False when there was no spec."""
        doc = self.specs.read(device) or {}
        state_dir = spec_mounts(doc).get(CONTAINER_STATE_DIR)
        with self._lock(state_dir):
            removed = self.specs.remove(device)
            if state_dir is not None:
                self._release_unused(state_dir)
        self._told.discard(str((doc.get("annotations") or {}).get(POD_UID_ANNOTATION, "")))
        return removed

    def reconcile(self) -> None:
        """After a restart: every state directory a spec on disk mounts exists, and the others are gone."""
        mounted = {m for s in self.specs.written() if (m := s.mounts.get(CONTAINER_STATE_DIR))}
        for state_dir in sorted(mounted):
            with self._lock(state_dir):
                try:
                    make_state_dir(state_dir)
                except OSError as e:
                    log.error("cannot re-create the limiter state directory %s: %s", state_dir, e)
        limiter = self.config.limiter
        if limiter is not None:
            for state_dir in state_dirs(limiter.host.state_root):
                if state_dir not in mounted:
                    with self._lock(state_dir):
                        self._release_unused(state_dir)

    def _release_unused(self, state_dir: str) -> None:
        """Remove ``state_dir`` unless a spec on disk mounts it (caller holds its lock)."""
        if any(s.mounts.get(CONTAINER_STATE_DIR) == state_dir for s in self.specs.written()):
            return
        limiter = self.config.limiter
        root = limiter.host.state_root if limiter is not None else str(Path(state_dir).parent)
        try:
            if release_state_dir(state_dir, root):
                log.info("removed the limiter state directory %s", state_dir)
        except (OSError, ValueError) as e:
            log.warning("left the limiter state directory %s: %s", state_dir, e)

    def limiter_missing(self) -> tuple[str, ...]:
        """What this node lacks now to hand the in-container limiter (logged when it changes)."""
        limiter = self.config.limiter
        missing = limiter.missing() if limiter is not None else ()
        self._say(missing)
        return missing

    def _say(self, missing: tuple[str, ...]) -> None:
        limiter = self.config.limiter
        if limiter is None or missing == self._said:
            return
        if limiter.mode is LimiterMode.OFF:
            log.info("in-container limiter off: the memory watchdog alone holds the slices' caps")
        elif missing:
            log.error("in-container limiter (%s) not installed on this node (%s): containers get none, the memory "
                      "watchdog alone holds their caps", limiter.mode.value, "; ".join(missing))
        else:
            log.info("in-container limiter (%s) installed in %s: every slice's container gets it",
                     limiter.mode.value, Path(limiter.host.state_root).parent)
        self._said = missing

    def _limiter_state(self, missing: tuple[str, ...], pod: ManagedPod) -> None:
        """Say when a hand-off goes without the in-container limiter, and when it is back."""
        limiter = self.config.limiter
        if limiter is None or limiter.mode is LimiterMode.OFF:
            return
        self._say(missing)
        if not missing:
            return
        self.without_limiter += 1
        if pod.uid in self._told:
            return
        self._told.add(pod.uid)
        log.warning("pod %s/%s handed its slice without the in-container limiter", pod.namespace, pod.name)
        holder = pod.holder(pod.record.gpus[0]) if pod.record.gpus else None
        if self.events is not None and holder is not None:
            self.events.emit(holder, LIMITER_MISSING, (
                f"the in-container memory limiter ({limiter.mode.value}) is not installed on node {pod.record.node} "
                f"({'; '.join(missing)}): inside the container the card shows its full memory, and past the "
                f"slice's {pod.record.memory_mib} MiB the agent's watchdog kills the largest process instead of "
                "CUDA answering out of memory"))


def claim_reserved_pod(claim: dict[str, object]) -> tuple[str, str]:
    """(pod UID, pod name) of the one pod a claim is reserved for; HandoffError otherwise."""
    refs = field(claim, "status", "reservedFor") or []
    pods = [r for r in refs if isinstance(r, dict) and r.get("resource") == "pods" and not r.get("apiGroup")]
    if len(pods) != 1 or len(refs) != 1:
        raise HandoffError(f"a gpuslice claim serves exactly one pod; status.reservedFor is {refs!r}")
    return str(pods[0].get("uid") or ""), str(pods[0].get("name") or "")

