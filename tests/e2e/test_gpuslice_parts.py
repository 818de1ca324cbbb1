"""The cluster parts against the real kube-apiserver: the binder's Binding with its record, and the Lease.

No extender process here: each part is driven directly.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from extender.cluster.binder import ClusterBinder
from extender.cluster.leader import LeaderElector
from extender.state import BindError
from extender.wire import BindingArgs
from packing.kube.client import MERGE_PATCH, Kube
from packing.record import ANNOTATION, AllocationRecord

from . import gpuslice_harness as h
from .cluster import ControlPlane, create_namespace, create_ready_node, new_api_client

pytestmark = pytest.mark.e2e


@pytest.fixture
def kube(control_plane: ControlPlane) -> Kube:
    return Kube(control_plane.api_client())


@pytest.fixture
def ns(control_plane: ControlPlane) -> str:
    return create_namespace(control_plane.api_client(), "parts")


@pytest.fixture
def extender_kube(control_plane: ControlPlane, ns: str) -> Kube:
    """The binder's identity: the extender's user (the one the record admission policy lets write a
    record, where it is installed), allowed to read pods and create Bindings in ``ns``."""
    kube = Kube(control_plane.api_client())
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}"
    kube.request("POST", f"{rbac}/roles", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "binder"},
        "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
                  {"apiGroups": [""], "resources": ["pods/binding"], "verbs": ["create"]}]})
    kube.request("POST", f"{rbac}/rolebindings", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "binder"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "binder"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": h.EXTENDER_USER}]})
    return Kube(new_api_client(control_plane.user_kubeconfig(h.EXTENDER_USER)))


@pytest.fixture
def node(control_plane: ControlPlane) -> Any:
    name = f"parts-{time.monotonic_ns() % 100000}"
    create_ready_node(control_plane.api_client(), name)
    yield name
    Kube(control_plane.api_client()).request("DELETE", f"/api/v1/nodes/{name}")


def plain_pod(kube: Kube, ns: str, name: str) -> dict[str, Any]:
    """An unscheduled pod (no scheduler runs for it: the binder is the only one to bind it)."""
    doc = h.slice_pod(name, "v100-25")
    doc["spec"]["schedulerName"] = "nobody"
    return h.create_pod(kube, ns, doc)


def record_for(pod: dict[str, Any], node: str) -> AllocationRecord:
    return AllocationRecord(pod["metadata"]["uid"], node, (f"{node}/gpu-0",), "v100-25", 250, 8192)


def args(pod: dict[str, Any], node: str) -> BindingArgs:
    meta = pod["metadata"]
    return BindingArgs(meta["name"], meta["namespace"], meta["uid"], node)


class Counting(Kube):
    """Counts the API calls made through it."""

    calls: list[str]

    def request(self, method: str, path: str, body: Any = None, **kw: Any) -> dict[str, Any]:
        self.calls.append(f"{method} {path}")
        return super().request(method, path, body, **kw)


def counting(kube: Kube) -> Counting:
    c = Counting(kube.api)
    c.calls = []
    return c


def test_bind_writes_the_record_with_the_binding_in_one_call(kube: Kube, extender_kube: Kube, ns: str,
                                                             node: str) -> None:
    pod = plain_pod(kube, ns, "p")
    rec = record_for(pod, node)
    api = counting(extender_kube)
    binder = ClusterBinder(api)
    binder.bind(args(pod, node), rec)
    assert api.calls == [f"POST /api/v1/namespaces/{ns}/pods/p/binding"]  # the record travels with it
    got = kube.get_pod(ns, "p")
    assert got is not None and got["spec"]["nodeName"] == node
    assert got["metadata"]["annotations"][ANNOTATION] == rec.encode()
    binder.bind(args(pod, node), rec)  # again: already bound here with our record, a success
    assert binder.bound_since(pod["metadata"]["uid"]) is not None
    with pytest.raises(BindError, match="already bound to node"):
        binder.bind(args(pod, "another-node"), rec)
    other = AllocationRecord(pod["metadata"]["uid"], node, (f"{node}/gpu-1",), "v100-25", 250, 8192)
    with pytest.raises(BindError, match="already bound to node"):  # here, but not with this record
        binder.bind(args(pod, node), other)


def test_bind_without_record_binds_only(kube: Kube, ns: str, node: str) -> None:
    pod = plain_pod(kube, ns, "cpu-only")
    ClusterBinder(kube).bind(args(pod, node), None)
    got = kube.get_pod(ns, "cpu-only")
    assert got is not None and got["spec"]["nodeName"] == node
    assert ANNOTATION not in (got["metadata"].get("annotations") or {})


def test_a_refused_binding_leaves_no_record(kube: Kube, extender_kube: Kube, ns: str, node: str) -> None:
    doc = h.slice_pod("gated", "v100-25")
    doc["spec"]["schedulerName"] = "nobody"
    doc["spec"]["schedulingGates"] = [{"name": "example.com/hold"}]  # kube-apiserver refuses to bind it
    pod = h.create_pod(kube, ns, doc)
    with pytest.raises(BindError, match="schedulingGates"):
        ClusterBinder(extender_kube).bind(args(pod, node), record_for(pod, node))
    got = kube.get_pod(ns, "gated")
    assert got is not None and not got["spec"].get("nodeName")
    assert ANNOTATION not in (got["metadata"].get("annotations") or {})  # record and node: both or neither


def test_another_writers_change_survives_the_bind(kube: Kube, extender_kube: Kube, ns: str, node: str) -> None:
    pod = plain_pod(kube, ns, "p")
    kube.patch_pod(ns, "p", {"metadata": {"labels": {"touched": "yes"}, "annotations": {"other": "x"}}},
                   MERGE_PATCH)  # after the decision, before the bind
    ClusterBinder(extender_kube).bind(args(pod, node), record_for(pod, node))
    got = kube.get_pod(ns, "p")
    assert got is not None and got["spec"]["nodeName"] == node
    assert got["metadata"]["labels"]["touched"] == "yes" and got["metadata"]["annotations"]["other"] == "x"
    assert got["metadata"]["annotations"][ANNOTATION] == record_for(pod, node).encode()


def test_recreated_pod_is_not_bound_by_a_stale_decision(kube: Kube, extender_kube: Kube, ns: str, node: str) -> None:
    old = plain_pod(kube, ns, "p")
    h.delete_now(kube, ns, "p")
    h.poll(lambda: kube.get_pod(ns, "p") is None, 10, "the pod to go")
    plain_pod(kube, ns, "p")
    with pytest.raises(BindError, match="re-created"):
        ClusterBinder(extender_kube).bind(args(old, node), record_for(old, node))
    got = kube.get_pod(ns, "p")
    assert got is not None and not got["spec"].get("nodeName")


def elector(kube: Kube, identity: str, lease: str, events: list[str]) -> LeaderElector:
    return LeaderElector(kube, "default", lease, identity, lambda: events.append(f"{identity}+"),
                         lambda: events.append(f"{identity}-"), lease_duration=2.0, renew_deadline=1.5,
                         retry_period=0.2)


def test_one_leader_takeover_after_expiry_and_same_identity_returns(kube: Kube) -> None:
    lease = f"parts-lease-{time.monotonic_ns() % 100000}"
    events: list[str] = []
    a, b = elector(kube, "a", lease, events), elector(kube, "b", lease, events)
    assert a.try_acquire_or_renew() is True
    assert b.try_acquire_or_renew() is False
    assert a.try_acquire_or_renew() is True  # renewing
    a_again = elector(kube, "a", lease, events)  # a restarted container, same identity
    assert a_again.try_acquire_or_renew() is True
    time.sleep(2.3)  # a stops renewing: its lease expires
    assert b.try_acquire_or_renew() is True
    assert a.try_acquire_or_renew() is False
    doc = kube.request("GET", a.path)
    assert doc["spec"]["holderIdentity"] == "b" and doc["spec"]["leaseTransitions"] == 1


def test_clean_stop_hands_over_at_once(kube: Kube) -> None:
    lease = f"parts-lease-{time.monotonic_ns() % 100000}"
    events: list[str] = []
    a, b = elector(kube, "a", lease, events), elector(kube, "b", lease, events)
    a.start()
    h.poll(lambda: a.leading.is_set(), 10, "a to lead", interval=0.05)
    b.start()
    time.sleep(0.6)
    assert not b.leading.is_set()
    a.stop()
    # a gave the Lease up: it is free (or already b's), never still a's waiting to expire
    assert kube.request("GET", a.path)["spec"].get("holderIdentity") in (None, "b")
    h.poll(lambda: b.leading.is_set(), 10, "b to take over", interval=0.05)
    b.stop()
    assert events == ["a+", "a-", "b+", "b-"]


def test_deposed_leader_writes_nothing(kube: Kube, ns: str, node: str) -> None:
    pod = plain_pod(kube, ns, "p")
    with pytest.raises(BindError, match="no longer leads"):
        ClusterBinder(kube, may_write=lambda: False).bind(args(pod, node), record_for(pod, node))
    got = kube.get_pod(ns, "p")
    assert got is not None and not got["spec"].get("nodeName")
    assert ANNOTATION not in (got["metadata"].get("annotations") or {})
