"""Leader election on a coordination.k8s.io/v1 Lease: one replica owns the ledger.

The standby answers ``/readyz`` false and keeps no ledger. A leader renews every
``retry_period``; one that could not renew for ``renew_deadline`` steps down by itself (before
its Lease can expire at ``lease_duration``, so two leaders never overlap while clocks agree). A
standby takes the Lease once its holder has not renewed for ``lease_duration``; every write
carries the Lease's resourceVersion, so of two standbys only one wins. The same identity (a
container restarted in the same pod) takes its own Lease back at once. A clean stop gives the
Lease up so a standby need not wait.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from extender.cluster.threads import join, start_daemon
from packing.kube.client import Kube, KubeError, parse_time, q

log = logging.getLogger(__name__)


def now_micro(now: float | None = None) -> str:
    """A Lease MicroTime (RFC 3339 with microseconds, UTC)."""
    return datetime.fromtimestamp(time.time() if now is None else now, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class LeaderElector:
    """Campaigns for the Lease ``namespace/name`` as ``identity`` until ``stop()``."""

    kube: Kube
    namespace: str
    name: str
    identity: str
    on_started: Callable[[], None]
    on_stopped: Callable[[], None]
    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry_period: float = 1.0
    clock: Callable[[], float] = time.time
    leading: threading.Event = field(default_factory=threading.Event)
    stopped: threading.Event = field(default_factory=threading.Event)
    transitions: int = 0  # times this elector became leader
    _last_renew: float = 0.0
    _thread: threading.Thread | None = None

    @property
    def path(self) -> str:
        return f"/apis/coordination.k8s.io/v1/namespaces/{q(self.namespace)}/leases/{q(self.name)}"

    def _spec(self, now: float, acquired: str, transitions: int) -> dict[str, Any]:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": max(1, round(self.lease_duration)),
            "acquireTime": acquired,
            "renewTime": now_micro(now),
            "leaseTransitions": transitions,
        }

    def try_acquire_or_renew(self) -> bool:
        """One campaign round: True when this identity holds the Lease afterwards."""
        now = self.clock()
        lease = self.kube.get(self.path)
        if lease is None:
            body = {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self.name, "namespace": self.namespace},
                "spec": self._spec(now, now_micro(now), 0),
            }
            try:
                self.kube.request("POST", self.path.rsplit("/", 1)[0], body)
                return True
            except KubeError as e:
                if e.status == 409:
                    return False  # another replica created it first
                raise
        spec = lease.get("spec") or {}
        holder = spec.get("holderIdentity") or ""
        renewed = parse_time(spec.get("renewTime"))
        duration = float(spec.get("leaseDurationSeconds") or self.lease_duration)
        if holder and holder != self.identity and renewed + duration > now:
            return False
        transitions = int(spec.get("leaseTransitions") or 0)
        acquired = spec.get("acquireTime") or now_micro(now)
        if holder != self.identity:
            transitions += 1
            acquired = now_micro(now)
        lease["spec"] = self._spec(now, acquired, transitions)
        try:
            # the body carries metadata.resourceVersion: a concurrent writer makes this a 409
            self.kube.request("PUT", self.path, lease)
            return True
        except KubeError as e:
            if e.status == 409:
                return False
            raise

    def run(self) -> None:
        """Campaign and renew until ``stop()``; calls ``on_started`` / ``on_stopped`` on each change."""
        while not self.stopped.is_set():
            try:
                ok = self.try_acquire_or_renew()
            except Exception as e:  # the API being away is a failed renewal, not a crash
                log.warning("leader election: %s", e)
                ok = False
            now = time.monotonic()
            if ok:
                self._last_renew = now
                if not self.leading.is_set():
                    log.info("leader election: %s leads %s/%s", self.identity, self.namespace, self.name)
                    self.transitions += 1
                    self.leading.set()
                    self._call(self.on_started)
            elif self.leading.is_set() and now - self._last_renew > self.renew_deadline:
                log.warning("leader election: %s could not renew within %.0f s; stepping down",
                            self.identity, self.renew_deadline)
                self.leading.clear()
                self._call(self.on_stopped)
            self.stopped.wait(self.retry_period)
        if self.leading.is_set():
            self.leading.clear()
            self._call(self.on_stopped)
            self._release()

    @staticmethod
    def _call(callback: Callable[[], None]) -> None:
        try:
            callback()
        except Exception:  # a failing callback must not end the campaign
            log.exception("leader election callback failed")

    def _release(self) -> None:
        """Give the Lease up on a clean stop so a standby need not wait ``lease_duration``."""
        try:
            lease = self.kube.get(self.path)
            spec = (lease or {}).get("spec") or {}
            if lease is not None and spec.get("holderIdentity") == self.identity:
                spec["holderIdentity"] = None
                spec["renewTime"] = None
                spec["leaseDurationSeconds"] = 1
                self.kube.request("PUT", self.path, lease)
        except KubeError as e:
            log.info("leader election: could not release the Lease: %s", e)

    def start(self) -> threading.Thread:
        self._thread = start_daemon(self.run, "leader-election")
        return self._thread

    def stop(self, timeout: float = 5.0) -> None:
        self.stopped.set()
        join(self._thread, timeout)
