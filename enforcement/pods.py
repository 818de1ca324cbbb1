"""Pod -> slice: the allocation records of the pods on this node, kept current by a pod watch.

The extender writes the allocation record (``packing.record``) on the pod before it binds it, so a
node-scoped pod watch (``packing.kube.informer.Informer`` with ``fieldSelector=spec.nodeName=<node>``,
feeding :meth:`PodIndex.apply`) is all the agent needs to know which pod holds
which slice on which GPU. A pod is managed only if it carries the record the extender wrote for it
on this node (``packing.record.record_of_pod``: its claim is the pod's own uid, its node this one);
a pod without one is never touched, and a pod with a record it may not use (a copy of another pod's,
another node's, a broken one) is refused and told why (``enforcement.refusals``), never guessed at.
Identity is always by pod UID (from the cgroup path), never by request size or order.

A slice belongs to the pod (the record is per pod): all of the pod's containers on that GPU share
its memory cap and its compute share. Tests and the simulation feed the index pods from memory
(:meth:`PodIndex.replace`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from typing import Any

from enforcement.cgroups import canonical_uid
from enforcement.events import Pod
from enforcement.refusals import Refusals
from packing.asks import MalformedPod, asks_for
from packing.kube.objects import field
from packing.products import MILLI_PER_GPU, Catalog, load_catalog
from packing.record import NOT_ASKED, AllocationRecord, RecordRefused, record_of_pod

log = logging.getLogger(__name__)

MIB = 1 << 20
_ENDED_PHASES = ("Succeeded", "Failed")


@dataclass(frozen=True, slots=True)
class SliceHolder:
    """One pod's slice on one GPU: the unit the watchdog caps and the pacer paces."""

    pod_uid: str
    namespace: str
    pod: str
    gpu: str
    product: str | None
    cap_bytes: int
    weight: int
    gang: bool = False

    @property
    def key(self) -> tuple[str, str]:
        return (self.pod_uid, self.gpu)

    @property
    def name(self) -> str:
        return f"{self.namespace}/{self.pod}"

    @property
    def paced(self) -> bool:
        """Whole cards and multi-GPU gangs are never paced (nothing to share; peers would stall)."""
        return not self.gang and self.weight < MILLI_PER_GPU


@dataclass(frozen=True, slots=True)
class ManagedPod:
    """A pod on this node with a valid allocation record."""

    uid: str
    namespace: str
    name: str
    record: AllocationRecord
    containers: Mapping[str, str] = dataclass_field(default_factory=dict)  # container id -> container name

    def holder(self, gpu: str) -> SliceHolder | None:
        """The pod's slice on ``gpu``, or None if its record does not name that GPU."""
        if gpu not in self.record.gpus:
            return None
        return SliceHolder(
            pod_uid=self.uid,
            namespace=self.namespace,
            pod=self.name,
            gpu=gpu,
            product=self.record.product,
            cap_bytes=self.record.memory_mib * MIB,
            weight=self.record.milli,
            gang=len(self.record.gpus) > 1,
        )


def container_ids(pod: Mapping[str, Any]) -> dict[str, str]:
    """Container ID (runtime prefix such as ``containerd://`` removed) -> container name."""
    out: dict[str, str] = {}
    for key in ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses"):
        for status in field(pod, "status", key) or []:
            cid, name = field(status, "containerID"), field(status, "name")
            if isinstance(cid, str) and cid:
                out[cid.rsplit("://", 1)[-1].lower()] = name if isinstance(name, str) else ""
    return out


class PodIndex:
    """The managed pods on one node, by pod UID. Thread-safe: the watch writes, the loop reads."""

    def __init__(self, node_name: str, refusals: Refusals | None = None, catalog: Catalog | None = None) -> None:
        self.node_name = node_name
        self.refusals = refusals  # told of every pod whose record this node refuses
        self.catalog = catalog or load_catalog()  # how pods ask (the resource prefix, the annotation)
        self._pods: dict[str, ManagedPod] = {}
        self._rejected: dict[str, str] = {}
        self._lock = threading.Lock()

    def _parse(self, pod: Mapping[str, Any]) -> tuple[str, ManagedPod | None, RecordRefused | None]:
        uid = field(pod, "metadata", "uid")
        if not isinstance(uid, str) or not uid:
            return "", None, None
        if field(pod, "status", "phase") in _ENDED_PHASES:
            return canonical_uid(uid), None, None
        try:
            record = record_of_pod(pod, self.node_name)
        except RecordRefused as e:
            return canonical_uid(uid), None, e
        if record is None:
            return canonical_uid(uid), None, None
        if not self._asks(pod, record):
            wanted = record.product or "slice"
            return canonical_uid(uid), None, RecordRefused(NOT_ASKED, (
                f"it asks for no {wanted} (by extended resource, annotation or DRA claim), yet carries an allocation "
                f"record for one: not the extender's, which writes a record only for a pod that asks for its product"))
        uid = canonical_uid(uid)
        namespace = field(pod, "metadata", "namespace") or "default"
        name = field(pod, "metadata", "name") or uid
        return uid, ManagedPod(uid, str(namespace), str(name), record, container_ids(pod)), None

    def _asks(self, pod: Mapping[str, Any], record: AllocationRecord) -> bool:
        try:
            return asks_for(pod, record.product, self.catalog)
        except MalformedPod:
            return False

    def _put(self, uid: str, managed: ManagedPod | None, problem: RecordRefused | None) -> None:
        self._pods.pop(uid, None)
        self._rejected.pop(uid, None)
        if managed is not None:
            self._pods[uid] = managed
        elif problem is not None:
            self._rejected[uid] = str(problem)

    def _tell(self, pod: Mapping[str, Any], uid: str, problem: RecordRefused | None) -> None:
        """Outside the lock: the refusal is said (an Event is queued, a line logged)."""
        if problem is not None and self.refusals is not None:
            self.refusals.refused(pod_ref(pod, uid), problem)

    def replace(self, pods: Iterable[Mapping[str, Any]]) -> None:
        """Start over from a full list."""
        pods = list(pods)
        parsed = [self._parse(p) for p in pods]
        with self._lock:
            self._pods.clear()
            self._rejected.clear()
            for uid, managed, problem in parsed:
                if uid:
                    self._put(uid, managed, problem)
        for pod, (uid, _, problem) in zip(pods, parsed, strict=True):
            self._tell(pod, uid, problem)

    def apply(self, kind: str, pod: Mapping[str, Any]) -> None:
        """Apply one watch event (ADDED, MODIFIED, DELETED; others are ignored)."""
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            return
        uid, managed, problem = self._parse(pod)
        if not uid:
            return
        with self._lock:
            if kind == "DELETED":
                self._put(uid, None, None)
            else:
                self._put(uid, managed, problem)
        if kind == "DELETED":
            if self.refusals is not None:
                self.refusals.forget(uid)
        else:
            self._tell(pod, uid, problem)

    def get(self, pod_uid: str) -> ManagedPod | None:
        with self._lock:
            return self._pods.get(canonical_uid(pod_uid))

    def find(self, namespace: str, name: str) -> ManagedPod | None:
        """The managed pod called ``namespace/name`` on this node (names are unique while a pod exists)."""
        with self._lock:
            return next((p for p in self._pods.values() if p.namespace == namespace and p.name == name), None)

    def parse(self, pod: Mapping[str, Any]) -> tuple[ManagedPod | None, RecordRefused | None]:
        """A pod object (e.g. read from the API) as this index would hold it, or why it would not (said)."""
        uid, managed, problem = self._parse(pod)
        self._tell(pod, uid, problem)
        return managed, problem

    def holder(self, pod_uid: str, gpu: str) -> SliceHolder | None:
        """The slice ``pod_uid`` holds on ``gpu``, if that pod is managed and its record names it."""
        managed = self.get(pod_uid)
        return managed.holder(gpu) if managed is not None else None

    def rejected(self) -> dict[str, str]:
        """Pods that carry a record we refused, with the reason."""
        with self._lock:
            return dict(self._rejected)

    def __len__(self) -> int:
        with self._lock:
            return len(self._pods)


def pod_ref(pod: Mapping[str, Any], uid: str) -> Pod:
    """The pod object as an event's subject."""
    return Pod(str(field(pod, "metadata", "namespace") or "default"), str(field(pod, "metadata", "name") or uid),
               str(field(pod, "metadata", "uid") or uid))
