"""The cluster ``Binder``: write the allocation record on the pod, then create its Binding.

Order matters: the node agent reads the record when the kubelet starts the pod, so the record
is on the pod before the pod is on the node. The annotation is written with optimistic
concurrency (a merge patch carrying the ``resourceVersion`` just read: a concurrent writer makes
it a 409, and we re-read and decide again). The Binding carries the pod's uid as a precondition,
so a pod deleted and re-created under the same name is never bound by a stale decision. If the
Binding fails, the record is taken off again (only if it is still ours and the pod still unbound).
A pod already bound to this very node (with our record) is a success; bound elsewhere, an error.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from extender.cluster.kube import MERGE_PATCH, Kube, KubeError
from extender.state import BindError
from extender.wire import BindingArgs
from packing.record import ANNOTATION, AllocationRecord

log = logging.getLogger(__name__)
CONFLICT_RETRIES = 5


def _annotation(pod: Mapping[str, Any]) -> str | None:
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(ANNOTATION)
    return value if isinstance(value, str) else None


def _meta(pod: Mapping[str, Any], key: str) -> str:
    return str((pod.get("metadata") or {}).get(key) or "")


def _node(pod: Mapping[str, Any]) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")


class ClusterBinder:
    """Annotation (optimistic concurrency) + Binding through the API, rolled back on failure."""

    def __init__(self, kube: Kube, may_write: Callable[[], bool] = lambda: True) -> None:
        self.kube = kube
        self.may_write = may_write  # False once this replica stopped leading: a deposed leader writes nothing
        self._lock = threading.Lock()
        self.recent: dict[str, float] = {}  # pod uid -> wall time of its successful bind (for the resync)

    def bind(self, args: BindingArgs, record: AllocationRecord | None) -> None:
        """Make the bind real; BindError (with the API's reason) when it cannot, after rolling back."""
        value = record.encode() if record is not None else None
        wrote = False
        for _ in range(CONFLICT_RETRIES):
            pod = self._read(args)
            node = _node(pod)
            if node:
                if node == args.node and (value is None or _annotation(pod) == value):
                    self._done(args)
                    return  # already bound to this node with our record: a repeat, not an error
                raise BindError(f"pod {args.pod_key} is already bound to node {node}")
            if value is None or _annotation(pod) == value:
                break
            self._check_leading(args)
            body = {"metadata": {"resourceVersion": _meta(pod, "resourceVersion"), "annotations": {ANNOTATION: value}}}
            try:
                self.kube.patch_pod(args.pod_namespace, args.pod_name, body, MERGE_PATCH)
                wrote = True
                break
            except KubeError as e:
                if e.status == 409:
                    continue  # someone changed the pod since we read it: read again, decide again
                raise BindError(f"writing the allocation record failed: {e}") from None
        else:
            raise BindError(f"pod {args.pod_key} kept changing; gave up writing its allocation record")
        try:
            self._check_leading(args)
            self.kube.bind_pod(args.pod_namespace, args.pod_name, args.pod_uid, args.node)
        except (KubeError, BindError) as e:
            if isinstance(e, KubeError) and e.status == 409 and self._bound_here(args):
                self._done(args)
                return  # a concurrent or repeated bind got there first, to this same node
            if wrote and value is not None:
                self._rollback(args, value)
            if isinstance(e, BindError):
                raise
            raise BindError(f"creating the Binding failed: {e}") from None
        self._done(args)

    def _check_leading(self, args: BindingArgs) -> None:
        if not self.may_write():
            raise BindError(f"not binding {args.pod_key}: this replica no longer leads (its ledger is gone)")

    def release(self, pod_uid: str) -> None:
        """Nothing to undo in the API: the pod's deletion or completion is what freed it."""
        with self._lock:
            self.recent.pop(pod_uid, None)

    def bound_since(self, pod_uid: str) -> float | None:
        """Wall time of this binder's successful bind of the pod, if it made one."""
        with self._lock:
            return self.recent.get(pod_uid)

    def _done(self, args: BindingArgs) -> None:
        with self._lock:
            self.recent[args.pod_uid] = time.time()
            if len(self.recent) > 100_000:  # bounded: the resync only asks about the last minutes
                cutoff = time.time() - 600
                self.recent = {u: t for u, t in self.recent.items() if t > cutoff}

    def _read(self, args: BindingArgs) -> dict[str, Any]:
        try:
            pod = self.kube.get_pod(args.pod_namespace, args.pod_name)
        except KubeError as e:
            raise BindError(f"reading the pod failed: {e}") from None
        if pod is None:
            raise BindError(f"pod {args.pod_key} does not exist")
        if args.pod_uid and _meta(pod, "uid") != args.pod_uid:
            raise BindError(f"pod {args.pod_key} was re-created (uid {_meta(pod, 'uid')}, not {args.pod_uid})")
        return pod

    def _bound_here(self, args: BindingArgs) -> bool:
        try:
            pod = self._read(args)
        except BindError:
            return False
        return _node(pod) == args.node

    def _rollback(self, args: BindingArgs, value: str) -> None:
        """Take our record off the still-unbound pod (harmless if it stays: the next bind overwrites it,
        and nothing reads the record of an unbound pod)."""
        for _ in range(CONFLICT_RETRIES):
            try:
                pod = self._read(args)
            except BindError:
                return
            if _node(pod) or _annotation(pod) != value:
                return
            body = {"metadata": {"resourceVersion": _meta(pod, "resourceVersion"), "annotations": {ANNOTATION: None}}}
            try:
                self.kube.patch_pod(args.pod_namespace, args.pod_name, body, MERGE_PATCH)
                return
            except KubeError as e:
                if e.status != 409:
                    log.warning("rolling back the allocation record of %s failed: %s", args.pod_key, e)
                    return
        log.warning("rolling back the allocation record of %s: the pod kept changing", args.pod_key)
