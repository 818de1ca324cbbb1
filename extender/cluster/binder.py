"""The cluster ``Binder``: the pod's Binding, carrying the allocation record, in one API call.

The node agent reads the record when the kubelet starts the pod, so the record must be on the pod
no later than the pod is on its node. A Binding's annotations are merged into the pod by the same
update that sets ``spec.nodeName`` (kube-apiserver's ``pods/binding``), so the record and the node
land together or not at all: nothing to roll back, no read before the write, and no window in
which a pod is bound without its record. The Binding carries the pod's uid as a precondition, so a
pod deleted and re-created under the same name is never bound by a stale decision.

Only when the Binding is refused is the pod read, to say why: already bound to this very node with
our record is a success (a repeat, or a concurrent bind that got there first); bound elsewhere,
re-created or gone is a ``BindError`` with the reason.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from extender.state import BindError
from extender.wire import BindingArgs
from packing.kube.client import Kube, KubeError
from packing.record import ANNOTATION, AllocationRecord

log = logging.getLogger(__name__)


def _annotation(pod: Mapping[str, Any]) -> str | None:
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    value = annotations.get(ANNOTATION)
    return value if isinstance(value, str) else None


def _meta(pod: Mapping[str, Any], key: str) -> str:
    return str((pod.get("metadata") or {}).get(key) or "")


def _node(pod: Mapping[str, Any]) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")


class ClusterBinder:
    """The Binding with the allocation record as its annotation: one API call per bind."""

    def __init__(self, kube: Kube, may_write: Callable[[], bool] = lambda: True) -> None:
        self.kube = kube
        self.may_write = may_write  # False once this replica stopped leading: a deposed leader writes nothing
        self._lock = threading.Lock()
        self.recent: dict[str, float] = {}  # pod uid -> wall time of its successful bind (for the resync)

    def bind(self, args: BindingArgs, record: AllocationRecord | None) -> None:
        """Make the bind real; BindError (with the API's reason) when it cannot."""
        value = record.encode() if record is not None else None
        if not self.may_write():
            raise BindError(f"not binding {args.pod_key}: this replica no longer leads (its ledger is gone)")
        try:
            self.kube.bind_pod(args.pod_namespace, args.pod_name, args.pod_uid, args.node,
                               {ANNOTATION: value} if value is not None else None)
        except KubeError as e:
            self._judge(args, value, e)  # returns only when the pod is bound here with our record
        self._done(args)

    def _judge(self, args: BindingArgs, value: str | None, error: KubeError) -> None:
        """Why the Binding was refused (BindError), unless the pod is already bound here with our record."""
        if error.status == 0:  # the API server was not reached: nothing to read either
            raise BindError(f"creating the Binding failed: {error}")
        pod = self._read(args)
        node = _node(pod)
        if node == args.node and (value is None or _annotation(pod) == value):
            return  # a repeat, or a concurrent bind of the same decision that got there first
        if node:
            raise BindError(f"pod {args.pod_key} is already bound to node {node}")
        raise BindError(f"creating the Binding failed: {error}")

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
