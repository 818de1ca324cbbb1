"""Cluster-mode settings, carried to the gunicorn worker in ``GPUSLICE_*`` variables like the rest.

``extender.config.ExtenderConfig`` holds the HTTP surface and the decision settings; this holds
what only a cluster needs: how to reach the API server, the leader Lease, the scheduler profile
the webhook routes pods to, the queue gate, resync and notice periods. TLS (the webhook needs it) is gunicorn's:
``gpuslice serve --tls-cert --tls-key``.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass

from extender.cluster.pending_writer import MEMBER_TIMEOUT_S, NOTICE_AFTER_S
from extender.config import ConfigError, env_of, env_values


@dataclass(frozen=True, slots=True)
class ClusterConfig:
    """What cluster mode needs beyond ``ExtenderConfig``."""

    kubeconfig: str = ""  # empty: the in-cluster service account
    namespace: str = "gpuslice-system"  # where the Lease and the entitlements ConfigMap live
    identity: str = ""  # leader-election identity; empty: the host name (the pod name in a cluster)
    leader_elect: bool = True
    lease_name: str = "gpuslice-extender"
    lease_duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 1.0  # a standby polls the Lease this often: a released one is taken within it
    scheduler_name: str = "gpuslice-scheduler"  # the webhook routes slice pods to this profile
    gate: bool = True  # the queue controller lifts gates (off: pods are only explained, never gated)
    resync_s: float = 60.0
    tick_s: float = 1.0
    notice_interval_s: float = 10.0  # position-only updates of a waiting pod's condition, at most this often
    notice_after_s: float = NOTICE_AFTER_S  # a pod admitted within this long is never told it waited
    allocated_events: str = "warnings"  # an Allocated Event per bound pod: "all", or only "warnings" (no enforcement)
    entitlements_configmap: str = "gpuslice-entitlements"
    webhook_path: str = "/mutate"
    leader_label: str = ""  # set on the leader's own pod (named by the identity) once ready; empty: off
    # a pod group admitted but not all bound by then goes back in line; bound but not all Running by then: an Event
    group_ready_timeout_s: float = 300.0
    group_evict_not_ready: bool = False  # ... and its members are evicted (opt-in, as Kueue's waitForPodsReady)
    group_bind_wait_s: float = 10.0  # a member's bind waits this long for the rest (under kube-scheduler's 30 s)
    group_member_timeout_s: float = MEMBER_TIMEOUT_S  # WaitingForMembers this long: a PodGroupIncomplete Event

    def __post_init__(self) -> None:
        if not self.namespace or not self.lease_name:
            raise ConfigError("namespace and lease name must not be empty")
        if not 0 < self.retry_period_s < self.renew_deadline_s < self.lease_duration_s:
            raise ConfigError(
                "leader election needs 0 < retry period < renew deadline < lease duration, got "
                f"{self.retry_period_s} / {self.renew_deadline_s} / {self.lease_duration_s}"
            )
        for name in ("resync_s", "tick_s", "notice_interval_s", "group_ready_timeout_s", "group_bind_wait_s",
                     "group_member_timeout_s"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if not self.notice_after_s >= 0:
            raise ConfigError(f"notice_after_s must be >= 0, got {self.notice_after_s}")
        if self.group_bind_wait_s >= self.group_ready_timeout_s:
            raise ConfigError(f"group_bind_wait_s ({self.group_bind_wait_s}) must be shorter than "
                              f"group_ready_timeout_s ({self.group_ready_timeout_s})")
        if self.allocated_events not in ("all", "warnings"):
            raise ConfigError(f"allocated_events must be all or warnings, got {self.allocated_events!r}")
        if not self.webhook_path.startswith("/"):
            raise ConfigError(f"webhook path must start with '/', got {self.webhook_path!r}")

    @property
    def who(self) -> str:
        """The leader-election identity: stable across a container restart in the same pod."""
        return self.identity or os.environ.get("POD_NAME") or socket.gethostname()

    def to_env(self) -> dict[str, str]:
        """``GPUSLICE_<FIELD>`` variables that ``from_env`` turns back into this config."""
        return env_of(self)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> ClusterConfig:
        """Read every ``GPUSLICE_<FIELD>`` that is set; defaults for the rest. ConfigError if bad."""
        source = os.environ if env is None else env
        values = env_values(cls, source)
        if "namespace" not in values and source.get("POD_NAMESPACE"):
            values["namespace"] = source["POD_NAMESPACE"]
        return cls(**values)
