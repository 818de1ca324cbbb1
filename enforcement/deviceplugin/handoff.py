"""The device plugin's hand-off, keyed by pod UID: tokens -> pods (PodResources) -> records -> CDI specs.

The kubelet's Allocate names no pod. It returns the token's CDI device ``gpuslice.io/slice=<token>``
and removes any spec that token had before (a token is reused only after its last holder left the
kubelet's books, so a container of the new holder can never resolve the old holder's card). Right
after, the kubelet's PodResources API lists which pod (namespace/name) holds the token; the pod's
UID and allocation record come from the pod itself, and the spec is written from that record.
The loop polls every 10 ms while a token waits. The kubelet calls PreStartContainer (which the
plugin asks for) before it creates each container, and the plugin answers only once the spec of the
container's tokens is written and the runtime's CDI cache has had ``SETTLE_S`` to see it: the
container is never created before its spec.
See ``enforcement/README.md`` ("Device plugin hand-off") for the race analysis.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from enforcement.cdi import SETTLE_S
from enforcement.deviceplugin.tokens import parse
from enforcement.handoff import HandoffError, RecordLookup, Writer
from enforcement.kubeletapi.stubs import podresources_pb2, podresources_pb2_grpc

log = logging.getLogger(__name__)

FAST_S = 0.01
SLOW_S = 2.0
PENDING_LIMIT_S = 300.0  # a token Allocate gave out that no pod holds after this is no longer waited for


@dataclass(frozen=True, slots=True)
class Holder:
    namespace: str
    pod: str
    container: str
    resource: str


class PodResourcesClient:
    """The kubelet's PodResources v1 ``List`` over its unix socket."""

    def __init__(self, socket: Path, timeout_s: float = 5.0) -> None:
        self.socket = socket
        self.timeout_s = timeout_s

    def held(self, resources: set[str]) -> dict[str, Holder]:
        """token id -> its holder, for our ``resources``; raises grpc.RpcError when unreachable."""
        with grpc.insecure_channel(f"unix://{self.socket}") as channel:
            stub = podresources_pb2_grpc.PodResourcesListerStub(channel)
            resp: Any = stub.List(podresources_pb2.ListPodResourcesRequest(), timeout=self.timeout_s)
        out: dict[str, Holder] = {}
        for pod in resp.pod_resources:
            for container in pod.containers:
                for dev in container.devices:
                    if dev.resource_name in resources:
                        for token_id in dev.device_ids:
                            out[token_id] = Holder(pod.namespace, pod.name, container.name, dev.resource_name)
        return out


class TokenHandoff:
    """Writes each held token's spec from its pod's record; removes specs of tokens nobody holds."""

    def __init__(self, lister: Callable[[set[str]], dict[str, Holder]], lookup: RecordLookup, writer: Writer,
                 resources: Iterable[str], clock: Callable[[], float] = time.monotonic) -> None:
        self.lister = lister
        self.lookup = lookup
        self.writer = writer
        self.resources = set(resources)
        self.clock = clock
        self._pending: dict[str, float] = {}  # token -> when Allocate gave it out
        self._held: dict[str, Holder] = {}
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._written = threading.Condition()
        self.written = 0
        self.mismatches = 0  # tokens whose card differs from the record's (harmless: the record wins)
        self.errors = 0
        self.last_error = ""
        self.latencies: list[float] = []  # Allocate -> spec written, seconds (the race margin)
        self._told: dict[str, str] = {}  # token -> the problem last logged for it
        self._written_at: dict[str, float] = {}  # token -> when its spec was last written

    def allocated(self, token_ids: Iterable[str]) -> None:
        """Allocate handed these tokens out: their old specs are gone, new ones are due."""
        now = self.clock()
        with self._lock:
            for token_id in token_ids:
                self.writer.remove(token_id)
                self._pending[token_id] = now
        self._wake.set()

    def wait_written(self, token_ids: Iterable[str], timeout_s: float) -> list[str]:
        """Block until every token's spec is written for its current holder and the runtime's CDI
        cache has had ``SETTLE_S`` to see it; the tokens still missing (empty: go ahead)."""
        tokens = list(token_ids)
        deadline = self.clock() + timeout_s
        while True:
            with self._lock:
                missing = [t for t in tokens if t in self._pending or not self.writer.specs.path(t).exists()]
                newest = max((self._written_at.get(t, float("-inf")) for t in tokens), default=float("-inf"))
            if not missing:
                settle = newest + SETTLE_S - self.clock()
                if settle > 0:
                    time.sleep(settle)
                return []
            if self.clock() >= deadline:
                return missing
            self._wake.set()
            with self._written:
                self._written.wait(FAST_S)

    def held(self) -> list[str]:
        """Tokens held at the last look (for GetPreferredAllocation)."""
        with self._lock:
            return list(self._held)

    def pending(self) -> list[str]:
        with self._lock:
            return list(self._pending)

    def reconcile(self) -> None:
        """One pass: list holders, write missing specs, drop orphaned ones."""
        try:
            held = self.lister(self.resources)
        except grpc.RpcError as e:
            self.errors += 1
            self.last_error = f"PodResources: {e.code()}"
            return
        with self._lock:
            self._held = dict(held)
            pending = dict(self._pending)
        existing = {s.device: s.pod_uid for s in self.writer.specs.written() if parse(s.device) is not None}
        for token_id, holder in held.items():
            try:
                pod = self.lookup.by_name(holder.namespace, holder.pod)
            except HandoffError as e:
                self._problem(token_id, f"token {token_id} held by {holder.namespace}/{holder.pod}: {e}")
                continue
            if existing.get(token_id) == pod.uid:
                with self._lock:
                    self._pending.pop(token_id, None)
                continue
            try:
                self.writer.write(token_id, pod)
            except (HandoffError, OSError) as e:
                self._problem(token_id, f"token {token_id} for pod {pod.namespace}/{pod.name}: {e}")
                continue
            self._told.pop(token_id, None)
            self.written += 1
            token = parse(token_id)
            if token is not None and token.uuid not in pod.record.gpus:
                self.mismatches += 1
                log.info("token %s names card %s, the record of %s/%s names %s: the record wins", token_id,
                         token.uuid, pod.namespace, pod.name, ",".join(pod.record.gpus))
            since = pending.get(token_id)
            if since is not None:
                self.latencies.append(self.clock() - since)
            with self._lock:
                self._pending.pop(token_id, None)
                self._written_at[token_id] = self.clock()
            with self._written:
                self._written.notify_all()
            log.info("token %s -> pod %s/%s (%s): GPU %s", token_id, pod.namespace, pod.name, pod.uid,
                     ",".join(pod.record.gpus))
        now = self.clock()
        for token_id in [t for t in self._told if t not in held]:
            del self._told[token_id]
        for token_id in existing:
            if token_id not in held and token_id not in pending:
                self.writer.remove(token_id)  # its pod left the kubelet's books
        with self._lock:
            for token_id, since in list(self._pending.items()):
                if now - since > PENDING_LIMIT_S:
                    log.warning("token %s was allocated %.0f s ago and no pod holds it", token_id, now - since)
                    del self._pending[token_id]

    def _problem(self, token_id: str, message: str) -> None:
        """Count every failure; log each distinct one once per token (the loop retries every pass)."""
        self.errors += 1
        self.last_error = message
        if self._told.get(token_id) != message:
            self._told[token_id] = message
            log.warning("%s", message)

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.reconcile()
            self._wake.wait(FAST_S if self.pending() else SLOW_S)
            self._wake.clear()
