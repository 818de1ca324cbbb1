"""Pod -> slice: the allocation records of the pods on this node, kept current by a pod watch.

The extender writes the allocation record (``packing.record``) on the pod before it binds it, so a
node-scoped pod watch (``spec.nodeName=<node>``) is all the agent needs to know which pod holds
which slice on which GPU. A pod is managed only if it carries the record the extender wrote for it
on this node (``packing.record.record_of_pod``: its claim is the pod's own uid, its node this one);
a pod without one is never touched, and a pod with a record it may not use (a copy of another pod's,
another node's, a broken one) is refused and told why (``enforcement.refusals``), never guessed at.
Identity is always by pod UID (from the cgroup path), never by request size or order.

A slice belongs to the pod (the record is per pod): all of the pod's containers on that GPU share
its memory cap and its compute share. The :class:`PodSource` protocol hides the API server, so
tests and the simulation feed pods from memory.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from enforcement.cgroups import canonical_uid
from enforcement.events import Pod
from enforcement.refusals import Refusals
from packing.products import MILLI_PER_GPU
from packing.record import AllocationRecord, RecordRefused, record_of_pod

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
    containers: Mapping[str, str] = field(default_factory=dict)  # container id -> container name

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


def _get(obj: Mapping[str, Any] | None, *path: str) -> Any:
    cur: Any = obj
    for key in path:
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(key)
    return cur


def container_ids(pod: Mapping[str, Any]) -> dict[str, str]:
    """Container ID (runtime prefix such as ``containerd://`` removed) -> container name."""
    out: dict[str, str] = {}
    for key in ("containerStatuses", "initContainerStatuses", "ephemeralContainerStatuses"):
        for status in _get(pod, "status", key) or []:
            cid, name = _get(status, "containerID"), _get(status, "name")
            if isinstance(cid, str) and cid:
                out[cid.rsplit("://", 1)[-1].lower()] = name if isinstance(name, str) else ""
    return out


class PodIndex:
    """The managed pods on one node, by pod UID. Thread-safe: the watch writes, the loop reads."""

    def __init__(self, node_name: str, refusals: Refusals | None = None) -> None:
        self.node_name = node_name
        self.refusals = refusals  # told of every pod whose record this node refuses
        self._pods: dict[str, ManagedPod] = {}
        self._rejected: dict[str, str] = {}
        self._lock = threading.Lock()

    def _parse(self, pod: Mapping[str, Any]) -> tuple[str, ManagedPod | None, RecordRefused | None]:
        uid = _get(pod, "metadata", "uid")
        if not isinstance(uid, str) or not uid:
            return "", None, None
        if _get(pod, "status", "phase") in _ENDED_PHASES:
            return canonical_uid(uid), None, None
        try:
            record = record_of_pod(pod, self.node_name)
        except RecordRefused as e:
            return canonical_uid(uid), None, e
        if record is None:
            return canonical_uid(uid), None, None
        uid = canonical_uid(uid)
        namespace = _get(pod, "metadata", "namespace") or "default"
        name = _get(pod, "metadata", "name") or uid
        return uid, ManagedPod(uid, str(namespace), str(name), record, container_ids(pod)), None

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
    return Pod(str(_get(pod, "metadata", "namespace") or "default"), str(_get(pod, "metadata", "name") or uid),
               str(_get(pod, "metadata", "uid") or uid))


class WatchExpired(Exception):
    """The watch's resource version is too old (HTTP 410 Gone): list again."""


class PodSource(Protocol):
    """Pods as API JSON dicts: a full list with its resource version, and a watch from one."""

    def list_pods(self) -> tuple[list[dict[str, Any]], str]: ...

    def watch_pods(self, resource_version: str, timeout_s: int) -> Iterator[tuple[str, dict[str, Any]]]: ...


class StaticPodSource:
    """An in-memory pod source for tests and the simulation: ``publish`` queues watch events."""

    def __init__(self, pods: Iterable[dict[str, Any]] = ()) -> None:
        self._pods: dict[str, dict[str, Any]] = {}
        self._events: list[tuple[str, dict[str, Any]]] = []
        self._version = 0
        for pod in pods:
            self.publish("ADDED", pod)
        self._events.clear()

    def publish(self, kind: str, pod: dict[str, Any]) -> None:
        """Record a change: the next list shows it, and pending watches yield it."""
        self._version += 1
        uid = str(_get(pod, "metadata", "uid"))
        if kind == "DELETED":
            self._pods.pop(uid, None)
        else:
            self._pods[uid] = pod
        self._events.append((kind, pod))

    def list_pods(self) -> tuple[list[dict[str, Any]], str]:
        self._events.clear()
        return [json.loads(json.dumps(p)) for p in self._pods.values()], str(self._version)

    def watch_pods(self, resource_version: str, timeout_s: int) -> Iterator[tuple[str, dict[str, Any]]]:
        events, self._events = self._events, []
        yield from events


class KubePodSource:
    """Pods on one node from the API server, through the kubernetes client's CoreV1Api."""

    def __init__(self, core_v1: Any, node_name: str) -> None:
        self.api = core_v1
        self.selector = f"spec.nodeName={node_name}"

    def list_pods(self) -> tuple[list[dict[str, Any]], str]:
        resp = self.api.list_pod_for_all_namespaces(field_selector=self.selector, _preload_content=False)
        doc = json.loads(resp.data)
        return list(doc.get("items", [])), str(_get(doc, "metadata", "resourceVersion") or "")

    def watch_pods(self, resource_version: str, timeout_s: int) -> Iterator[tuple[str, dict[str, Any]]]:
        from kubernetes import watch
        from kubernetes.client.exceptions import ApiException

        stream = watch.Watch().stream(  # type: ignore[no-untyped-call]
            self.api.list_pod_for_all_namespaces,
            field_selector=self.selector,
            resource_version=resource_version,
            timeout_seconds=timeout_s,
            allow_watch_bookmarks=True,
        )
        try:
            for event in stream:
                kind, raw = event.get("type"), event.get("raw_object") or {}
                if kind == "ERROR":
                    if _get(raw, "code") == 410:
                        raise WatchExpired(str(_get(raw, "message")))
                    raise RuntimeError(f"pod watch error: {raw}")
                yield str(kind), raw
        except ApiException as e:
            if e.status == 410:
                raise WatchExpired(str(e.reason)) from e
            raise


class PodWatch:
    """Keeps a PodIndex current from a PodSource: list, then watch; relist on expiry or error."""

    def __init__(self, source: PodSource, index: PodIndex, watch_timeout_s: int = 300, backoff_s: float = 2.0) -> None:
        self.source = source
        self.index = index
        self.watch_timeout_s = watch_timeout_s
        self.backoff_s = backoff_s
        self.synced = threading.Event()
        self.relists = 0
        self.errors = 0

    def sync(self) -> str:
        """List all pods of the node into the index; returns the list's resource version."""
        pods, version = self.source.list_pods()
        self.index.replace(pods)
        self.relists += 1
        self.synced.set()
        return version

    def pump(self, resource_version: str) -> str:
        """Apply one watch's events (until it ends); returns the last resource version seen."""
        for kind, pod in self.source.watch_pods(resource_version, self.watch_timeout_s):
            if kind != "BOOKMARK":
                self.index.apply(kind, pod)
            resource_version = str(_get(pod, "metadata", "resourceVersion") or resource_version)
        return resource_version

    def run(self, stop: threading.Event) -> None:
        """Watch until ``stop`` is set (run it in a thread)."""
        version: str | None = None
        while not stop.is_set():
            try:
                if version is None:
                    version = self.sync()
                version = self.pump(version)
                stop.wait(0.2)  # a watch that ended quietly is simply restarted, not spun on
            except WatchExpired:
                version = None
            except Exception as e:  # the API server is away: keep enforcing what we know, retry later
                self.errors += 1
                log.warning("pod watch failed: %s; relisting in %.0f s", e, self.backoff_s)
                version = None
                stop.wait(self.backoff_s)
