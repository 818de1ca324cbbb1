"""Pod groups end to end: the real kube-apiserver and kube-scheduler, our extender under gunicorn.

Scenarios (the issue's): a group of 4 and a group of 3 whole cards on 3 free cards end with one
whole group bound and the other waiting, gated, with a reason that says so; the cards freed for the
waiting group start all its members together (bound within 2 s of each other); a member deleted
while its group waits; a member kube-scheduler cannot place binds none of its group, and the
group's deadline takes it back in line with an Event; a member whose Binding the API server refuses
goes back in line with an Event and binds once the refusal goes; the webhook refuses a member that
disagrees with its group. Timings are printed (``-s``) and written to ``$GPUSLICE_E2E_TIMINGS``.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pytest

from packing.kube.client import Kube, KubeError

from . import gpuslice_harness as h
from .cluster import ControlPlane
from .test_gpuslice_cluster import note

pytestmark = pytest.mark.e2e

READY_S = 15  # the group ready timeout: a group not all bound by then goes back in line
BIND_WAIT_S = 3  # a member's bind waits this long for the rest of its group


@pytest.fixture(scope="module")
def gs(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[h.Gpuslice]:
    g = h.install(control_plane, tmp_path_factory.mktemp("gpuslice-groups"),
                  group_ready_timeout_s=str(READY_S), group_bind_wait_s=str(BIND_WAIT_S))
    try:
        yield g
    finally:
        g.stop()


NAMESPACE_PREFIX = "gang"  # conftest.py's ``ns`` fixture names this module's namespaces by it


def member(name: str, group: str, size: int, product: str = "v100-100", cpu: str | None = None) -> dict[str, Any]:
    pod = h.slice_pod(name, product, labels={"gpuslice.io/pod-group": group})
    pod["metadata"]["annotations"] = {"gpuslice.io/pod-group-size": str(size)}
    if cpu is not None:
        pod["spec"]["containers"][0]["resources"]["requests"]["cpu"] = cpu
    return pod


def fill(kube: Kube, ns: str, count: int) -> list[str]:
    """``count`` whole cards taken by single pods, bound."""
    names = [f"filler-{i}" for i in range(count)]
    for name in names:
        h.create_pod(kube, ns, h.slice_pod(name, "v100-100"))
    for name in names:
        h.wait_bound(kube, ns, name, timeout=30)
    return names


def bound_times(kube: Kube, ns: str, names: list[str], timeout: float) -> dict[str, float]:
    """When each pod was first seen bound (polled every 50 ms), until all are or ``timeout`` passes."""
    seen: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    while len(seen) < len(names) and time.monotonic() < deadline:
        now = time.monotonic()
        for p in h.pods(kube, ns):
            if p["metadata"]["name"] in names and h.node_of(p):
                seen.setdefault(p["metadata"]["name"], now)
        time.sleep(0.05)
    return seen


def condition(kube: Kube, ns: str, name: str) -> dict[str, Any] | None:
    pod = kube.get_pod(ns, name)
    return None if pod is None else h.queued(pod)


def waiting_reason(kube: Kube, ns: str, name: str, reason: str, timeout: float = 20) -> dict[str, Any]:
    def told() -> dict[str, Any] | None:
        c = condition(kube, ns, name)
        return c if c is not None and c.get("reason") == reason else None

    found: dict[str, Any] = h.poll(told, timeout, f"{ns}/{name} to wait with reason {reason}")
    return found


def test_four_and_three_whole_cards_on_three_free_cards(gs: h.Gpuslice, kube: Kube, nodes: list[str],
                                                         ns: str) -> None:
    h.add_nodes(gs, nodes, 2, 4, "gang")
    fillers = fill(kube, ns, 5)  # 3 of the 8 cards free
    four = [f"four-{i}" for i in range(4)]
    three = [f"three-{i}" for i in range(3)]
    for name in four:
        h.create_pod(kube, ns, member(name, "four", 4))
    for name in three:
        h.create_pod(kube, ns, member(name, "three", 3))
    started = bound_times(kube, ns, three, 30)
    assert set(started) == set(three), f"the group of 3 did not start: {started}"
    spread = max(started.values()) - min(started.values())
    note("group_of_3_bind_spread_s", round(spread, 3))
    assert spread <= 2.0
    # the group of four: never part of it bound, every member gated, told why, with its group
    told = waiting_reason(kube, ns, "four-0", "NoCapacity")
    assert "pod group" in told["message"] and "four" in told["message"] and "4 of 4 members present" in told["message"]
    assert "only 0 would fit now" in told["message"], told["message"]
    pods = {p["metadata"]["name"]: p for p in h.pods(kube, ns)}
    assert all(not h.node_of(pods[n]) and h.is_gated(pods[n]) for n in four)
    queue = {e["pod"].split("/")[1]: e for e in gs.extender.state()["queue"]}
    assert {queue[n]["group"]["name"] for n in four} == {"four"}
    assert {queue[n]["position"] for n in four} == {1}
    # the group of three ends: three cards free, still one short for the group of four
    for name in three:
        h.delete_now(kube, ns, name)
    h.poll(lambda: "only 3 would fit now" in (condition(kube, ns, "four-0") or {}).get("message", ""), 20,
           "the group of four to count three cards")
    assert all(not h.node_of(p) for p in h.pods(kube, ns) if p["metadata"]["name"] in four)
    # a freed card starts all four together
    freed = time.monotonic()
    h.delete_now(kube, ns, fillers[0])
    started = bound_times(kube, ns, four, 30)
    assert set(started) == set(four), f"the group of 4 did not start: {started}"
    spread = max(started.values()) - min(started.values())
    note("group_of_4_bind_spread_s", round(spread, 3))
    note("group_of_4_started_after_freed_s", round(max(started.values()) - freed, 3))
    assert spread <= 2.0
    usage = h.gpu_usage(p for p in h.pods(kube, ns) if h.node_of(p))
    assert all(milli <= 1000 for milli, _ in usage.values()) and len(usage) == 8


def test_a_member_deleted_while_its_group_waits(gs: h.Gpuslice, kube: Kube, nodes: list[str], ns: str) -> None:
    h.add_nodes(gs, nodes, 1, 2, "wait")
    fillers = fill(kube, ns, 2)
    h.create_pod(kube, ns, member("pair-0", "pair", 2))
    h.create_pod(kube, ns, member("pair-1", "pair", 2))
    waiting_reason(kube, ns, "pair-0", "NoCapacity")
    h.delete_now(kube, ns, "pair-1")
    told = waiting_reason(kube, ns, "pair-0", "WaitingForMembers")
    assert "1 of 2 members present" in told["message"], told["message"]
    for name in fillers:  # both cards free: the lone member still does not start
        h.delete_now(kube, ns, name)
    time.sleep(3)
    pod = kube.get_pod(ns, "pair-0")
    assert pod is not None and not h.node_of(pod) and h.is_gated(pod)
    h.create_pod(kube, ns, member("pair-1b", "pair", 2))  # its controller re-creates it
    started = bound_times(kube, ns, ["pair-0", "pair-1b"], 30)
    assert set(started) == {"pair-0", "pair-1b"}
    assert max(started.values()) - min(started.values()) <= 2.0


def test_a_member_kube_scheduler_cannot_place_binds_none_and_the_group_goes_back(
        gs: h.Gpuslice, kube: Kube, nodes: list[str], ns: str) -> None:
    h.add_nodes(gs, nodes, 1, 2, "stuck")
    h.create_pod(kube, ns, member("stuck-0", "stuck", 2))
    h.create_pod(kube, ns, member("stuck-1", "stuck", 2, cpu="64"))  # more CPU than any node: never bound
    started = time.monotonic()

    def rolled_back() -> list[dict[str, Any]] | None:
        events = [e for n in ("stuck-0", "stuck-1") for e in h.events_of(kube, ns, n)
                  if e["reason"] == "PodGroupRolledBack"]
        return events if {e["involvedObject"]["name"] for e in events} == {"stuck-0", "stuck-1"} else None

    events = h.poll(rolled_back, READY_S + 30, "a PodGroupRolledBack Event on both members")
    note("group_rolled_back_after_s", round(time.monotonic() - started, 1))
    assert "reservations lapsed" in events[0]["message"] and events[0]["type"] == "Warning"
    pods = {p["metadata"]["name"]: p for p in h.pods(kube, ns)}
    assert not h.node_of(pods["stuck-0"]) and not h.node_of(pods["stuck-1"]), "part of the group was bound"
    assert not any(a["pod"] and a["pod"].endswith("/stuck-0") and a["state"] == "bound"
                   for a in gs.extender.state()["allocations"])
    # stuck-0's binds answered that its group was incomplete (kube-scheduler retried them)
    assert 'gpuslice_bind_failures_total{reason="GroupIncomplete"}' in gs.extender.metrics()
    # the member that could never be placed is replaced: the group starts whole
    h.delete_now(kube, ns, "stuck-1")
    h.create_pod(kube, ns, member("stuck-1b", "stuck", 2))
    started_at = bound_times(kube, ns, ["stuck-0", "stuck-1b"], READY_S + 30)
    assert set(started_at) == {"stuck-0", "stuck-1b"}
    assert max(started_at.values()) - min(started_at.values()) <= 2.0


@contextlib.contextmanager
def refuse_bindings(kube: Kube, ns: str, prefix: str) -> Iterator[None]:
    """While open: the API server refuses every Binding of a pod of ``ns`` whose name starts with ``prefix``
    (a ValidatingAdmissionPolicy on pods/binding, as a tenant's or a platform's policy might)."""
    name = f"{ns}-refuse-bindings"
    policy = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
              "metadata": {"name": name},
              "spec": {"failurePolicy": "Fail",
                       "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                               "operations": ["CREATE"],
                                                               "resources": ["pods/binding"]}]},
                       "validations": [{"expression": f"!object.metadata.name.startsWith('{prefix}')",
                                        "message": "refused by the test's policy"}]}}
    binding = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
               "metadata": {"name": name},
               "spec": {"policyName": name, "validationActions": ["Deny"],
                        "matchResources": {"namespaceSelector": {"matchLabels": {
                            "kubernetes.io/metadata.name": ns}}}}}
    base = "/apis/admissionregistration.k8s.io/v1"
    kube.request("POST", f"{base}/validatingadmissionpolicies", policy)
    kube.request("POST", f"{base}/validatingadmissionpolicybindings", binding)
    try:
        probe = 0

        def refused() -> bool:  # the policy is in force once the API server refuses a Binding it covers
            nonlocal probe
            probe += 1
            pod = h.slice_pod(f"{prefix}probe-{probe}")
            pod["spec"]["schedulerName"] = "no-such-scheduler"  # nobody else binds it
            h.create_pod(kube, ns, pod)
            try:
                kube.request("POST", f"/api/v1/namespaces/{ns}/pods/{pod['metadata']['name']}/binding", {
                    "apiVersion": "v1", "kind": "Binding", "metadata": {"name": pod["metadata"]["name"]},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": "nowhere"}})
            except KubeError as e:
                return "refused by the test's policy" in str(e)
            finally:
                h.delete_now(kube, ns, pod["metadata"]["name"])
            return False

        h.poll(refused, 20, "the test's binding policy to be in force", interval=0.5)
        yield
    finally:
        for kind in ("validatingadmissionpolicybindings", "validatingadmissionpolicies"):
            try:
                kube.request("DELETE", f"{base}/{kind}/{name}")
            except KubeError as e:
                if e.status != 404:
                    raise


def test_a_binding_the_api_server_refuses_puts_the_member_back_with_an_event_and_it_binds_once_accepted(
        gs: h.Gpuslice, kube: Kube, nodes: list[str], ns: str) -> None:
    h.add_nodes(gs, nodes, 1, 2, "refuse")
    with refuse_bindings(kube, ns, "refused-"):
        h.create_pod(kube, ns, member("ok-0", "flaky", 2))
        h.create_pod(kube, ns, member("refused-1", "flaky", 2))

        def rolled_back() -> list[dict[str, Any]] | None:
            events = [e for e in h.events_of(kube, ns, "refused-1") if e["reason"] == "PodGroupRolledBack"]
            return events or None

        created = time.monotonic()
        events = h.poll(rolled_back, 30, "a PodGroupRolledBack Event on the member whose Binding was refused")
        note("refused_binding_rolled_back_after_s", round(time.monotonic() - created, 2))
        assert "its bind failed" in events[0]["message"] and events[0]["type"] == "Warning", events[0]["message"]
        assert 'gpuslice_bind_failures_total{reason="BinderFailed"}' in gs.extender.metrics()
        assert not h.node_of(kube.get_pod(ns, "refused-1") or {})
        # ok-0 passed the barrier with it, and its Binding was accepted: a bound pod cannot be unbound
        # (packing/QUEUE.md, "No partial hold": members already bound stay), so it keeps its card
        h.wait_bound(kube, ns, "ok-0", timeout=10)
        held = {a["pod"]: a for a in gs.extender.state()["allocations"] if a["pod"]}
        assert held[f"{ns}/ok-0"]["state"] == "bound"
        assert sum(1 for a in held.values() if a["pod"].startswith(f"{ns}/")) <= 2  # no slice leaked by the retries
    accepted = time.monotonic()
    h.wait_bound(kube, ns, "refused-1", timeout=60)  # the policy is gone: a retry's Binding is accepted
    note("refused_member_bound_after_policy_gone_s", round(time.monotonic() - accepted, 2))
    usage = h.gpu_usage(p for p in h.pods(kube, ns) if h.node_of(p))
    assert sorted(milli for milli, _ in usage.values()) == [1000, 1000], usage


def test_the_webhook_refuses_a_member_that_disagrees_with_its_group(gs: h.Gpuslice, kube: Kube, nodes: list[str],
                                                                      ns: str) -> None:
    h.create_pod(kube, ns, member("odd-0", "odd", 3))
    with pytest.raises(KubeError) as refused:
        h.create_pod(kube, ns, member("odd-1", "odd", 2))
    assert "member odd-0 says gpuslice.io/pod-group-size=3, this pod says 2" in str(refused.value)
    other = member("odd-2", "odd", 3)
    other["spec"]["schedulerName"] = "my-scheduler"
    with pytest.raises(KubeError) as refused:
        h.create_pod(kube, ns, other)
    assert "scheduled by gpuslice-scheduler, this pod by my-scheduler" in str(refused.value)
    h.create_pod(kube, ns, member("odd-3", "odd", 3))
    h.create_pod(kube, ns, member("odd-4", "odd", 3))
    with pytest.raises(KubeError) as refused:
        h.create_pod(kube, ns, member("odd-5", "odd", 3))
    assert "already has its 3 member(s)" in str(refused.value)
    with pytest.raises(KubeError) as refused:
        h.create_pod(kube, ns, member("big-0", "big", 33))
    assert "binds at most 32 pods of a group at once" in str(refused.value)
    bad = member("bad-0", "bad", 1)
    bad["metadata"]["annotations"]["gpuslice.io/pod-group-size"] = "0"
    with pytest.raises(KubeError) as refused:
        h.create_pod(kube, ns, bad)
    assert "gpuslice.io/pod-group-size 0 is not a positive whole number" in str(refused.value)
