"""From a pod to its container edits: the allocation record, found by pod UID, and its CDI spec.

Both kubelet paths end here. DRA names the pod in its claim's ``status.reservedFor`` (UID and
name); the device plugin learns it from the kubelet's PodResources API (namespace and name, then
the UID from the pod itself). Either way the record is read from *that* pod, never matched by
request size, arrival order or a node-wide lock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from enforcement.cdi import SpecDir, qualified
from enforcement.cgroups import canonical_uid
from enforcement.edits import EditsConfig, EditsError, slice_edits
from enforcement.kubeapi import Api, ApiError, field
from enforcement.pods import ManagedPod, PodIndex

MinorSource = Callable[[], dict[str, int]]  # this node's GPU UUID -> device minor, now


class HandoffError(RuntimeError):
    """The pod, its record or its card cannot be found: the kubelet is told, and retries."""


@dataclass(frozen=True, slots=True)
class Handoff:
    """What gives a container its slice: the record's pod, and the CDI spec written for it."""

    pod: ManagedPod
    cdi_device: str


class RecordLookup:
    """Allocation records by pod: from the node's pod watch, else read from the API (watch lag)."""

    def __init__(self, index: PodIndex, api: Api | None) -> None:
        self.index = index
        self.api = api

    def _read(self, namespace: str, name: str) -> ManagedPod | None:
        if self.api is None:
            return None
        try:
            pod = self.api.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        except ApiError as e:
            raise HandoffError(f"cannot read pod {namespace}/{name}: {e}") from e
        if pod is None:
            return None
        managed, problem = self.index.parse(pod)
        if managed is None and problem is not None:
            raise HandoffError(f"pod {namespace}/{name}: {problem}")
        return managed

    def by_uid(self, uid: str, namespace: str, name: str) -> ManagedPod:
        """The managed pod with this UID; HandoffError when it has no record (or is another pod)."""
        uid = canonical_uid(uid)
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
    """Writes the CDI spec of one device for one pod's record."""

    def __init__(self, specs: SpecDir, minors: MinorSource, config: EditsConfig) -> None:
        self.specs = specs
        self.minors = minors
        self.config = config

    def write(self, device: str, pod: ManagedPod) -> Handoff:
        try:
            edits = slice_edits(pod.record, pod.uid, self.minors(), self.config)
        except EditsError as e:
            raise HandoffError(f"pod {pod.namespace}/{pod.name}: {e}") from e
        self.specs.write(device, edits, pod.uid, {"gpuslice.io/pod": f"{pod.namespace}/{pod.name}"})
        return Handoff(pod, qualified(device))


def claim_reserved_pod(claim: dict[str, object]) -> tuple[str, str]:
    """(pod UID, pod name) of the one pod a claim is reserved for; HandoffError otherwise."""
    refs = field(claim, "status", "reservedFor") or []
    pods = [r for r in refs if isinstance(r, dict) and r.get("resource") == "pods" and not r.get("apiGroup")]
    if len(pods) != 1 or len(refs) != 1:
        raise HandoffError(f"a gpuslice claim serves exactly one pod; status.reservedFor is {refs!r}")
    return str(pods[0].get("uid") or ""), str(pods[0].get("name") or "")

