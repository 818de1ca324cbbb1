"""Only the extender's record hands out a card: a tenant who copies or forges one gets none.

The attack (issue 32): a tenant who may create pods in its own namespace (a user bound to the
``edit`` ClusterRole there) copies the allocation record (``gpuslice.io/allocation``) of a running
slice pod of another namespace onto a pod that asks for no slice, and puts that pod on the slice's
node: by ``spec.nodeName``, or through the default scheduler; or writes a record by hand.

* Installed as the chart installs it, the admission policy refuses each of them, and a record set by
  a later update, by a Binding or by a status update, whoever asks (an administrator too) but the
  extender's own identity.
* With that policy off, the node agent refuses each record (it names another pod's claim), and a
  record patched on after creation that names the pod's own uid (the pod asks for no slice): no
  hand-off path gives the pod a card (no CDI spec of its own, no limiter state directory, no
  container with ``NVIDIA_VISIBLE_DEVICES``), the pod gets an Event that says why, and the agent
  counts it (``gpuslice_agent_records_refused_total``).
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from packing.kube.client import MERGE_PATCH, Kube, KubeError
from packing.record import ANNOTATION, AllocationRecord
from tests.e2e import gpuslice_harness as h
from tests.e2e import manifests
from tests.e2e.cluster import ControlPlane, _Process, create_namespace, free_port, new_api_client, wait_for

from .conftest import CARDS, NODE, Agent
from .node import RealNode
from .test_real_node import assert_handed, container_env, pod, running

pytestmark = pytest.mark.e2e
POLICY = "gpuslice-allocation-record"
REFUSED = "AllocationRecordRefused"  # the agent's Event reason


@pytest.fixture(scope="module")
def default_scheduler(gs: h.Gpuslice, node: RealNode) -> Iterator[None]:
    """kube-scheduler with its default profile only (``default-scheduler``), beside gpuslice's."""
    cp = gs.cp
    config = cp.write_scheduler_config(profiles=[{"schedulerName": "default-scheduler"}],
                                       name="default-scheduler.yaml")
    port = free_port()
    proc = _Process("default-scheduler", [
        str(cp.bin_dir / "kube-scheduler"), f"--config={config}", "--bind-address=127.0.0.1",
        f"--secure-port={port}", f"--authentication-kubeconfig={cp.scheduler_kubeconfig}",
        f"--authorization-kubeconfig={cp.scheduler_kubeconfig}", "--v=2"], gs.work / "default-scheduler.log")
    yield
    proc.stop()


@pytest.fixture(scope="module")
def victim(gs: h.Gpuslice, node: RealNode, agent: Agent) -> Iterator[dict[str, Any]]:
    """A running slice pod (by annotation: NRI hands it its card) whose record the tenant copies."""
    ns = create_namespace(gs.cp.api_client(), "victim")
    h.create_pod(gs.kube, ns, pod("victim", "v100-25", "annotation"))
    p = running(gs.kube, ns, "victim")
    assert_handed(node, agent, p)
    yield p
    h.delete_now(gs.kube, ns, "victim")


@pytest.fixture(scope="module")
def tenant_kube(gs: h.Gpuslice) -> Kube:
    """The tenant's client: a user with nothing but what each test's namespace grants it."""
    return Kube(new_api_client(gs.cp.user_kubeconfig("e2e-tenant")))


@pytest.fixture
def tenant(gs: h.Gpuslice, tenant_kube: Kube) -> Iterator[tuple[str, Kube]]:
    """A namespace of the tenant's own, where it may do to pods what the ``edit`` ClusterRole allows (that
    role's rules are aggregated by kube-controller-manager, which this control plane does not run, so
    they are written out); the tenant's client. Its pods go after the test."""
    cp: ControlPlane = gs.cp
    ns = create_namespace(cp.api_client(), "tenant")
    rbac = f"/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}"
    gs.kube.request("POST", f"{rbac}/roles", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": "tenant-edit"},
        "rules": [{"apiGroups": [""], "resources": ["pods"],
                   "verbs": ["create", "delete", "get", "list", "watch", "patch", "update"]},
                  {"apiGroups": [""], "resources": ["pods/attach", "pods/exec", "pods/log"],
                   "verbs": ["create", "get"]}]})
    gs.kube.request("POST", f"{rbac}/rolebindings", {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "tenant-edit"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tenant-edit"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "e2e-tenant"}]})
    yield ns, tenant_kube
    for p in h.pods(gs.kube, ns):
        h.delete_now(gs.kube, ns, p["metadata"]["name"])


def copycat(name: str, record: str, how: str) -> dict[str, Any]:
    """A pod asking for no slice, carrying ``record``, put on the slice's node ``how``."""
    doc = pod(name, "v100-25", "none")
    doc["metadata"]["annotations"] = {ANNOTATION: record}
    if how == "nodeName":
        doc["spec"]["nodeName"] = NODE
    else:  # the default scheduler, steered to the node by its hostname label
        doc["spec"]["nodeSelector"] = {"kubernetes.io/hostname": NODE}
    return doc


def forged(victim: dict[str, Any]) -> str:
    """A record written by hand: a whole card the victim shares, for a claim nobody holds."""
    gpu = h.record(victim).gpus[0]  # type: ignore[union-attr]
    return AllocationRecord(str(uuid.uuid4()), NODE, (gpu,), "v100-100", 1000, 32768).encode()


def refused(call: Callable[[], Any], what: str) -> str:
    try:
        call()
    except KubeError as e:
        assert e.status == 403 and "gpuslice.io/allocation" in str(e), f"{what}: refused for another reason: {e}"
        return str(e)
    raise AssertionError(f"{what}: accepted, the admission policy let a record not written by the extender in")


def test_the_installed_policy_refuses_a_record_not_written_by_the_extender(
        gs: h.Gpuslice, victim: dict[str, Any], tenant: tuple[str, Kube]) -> None:
    ns, kube = tenant
    copy = victim["metadata"]["annotations"][ANNOTATION]
    said = refused(lambda: h.create_pod(kube, ns, copycat("copy-by-name", copy, "nodeName")), "a copy by nodeName")
    assert "extender" in said, said
    refused(lambda: h.create_pod(kube, ns, copycat("copy-by-scheduler", copy, "scheduler")), "a copy by scheduler")
    refused(lambda: h.create_pod(kube, ns, copycat("forged", forged(victim), "nodeName")), "a forged record")
    # set later: by an update, through the status subresource, by a Binding (an administrator, too)
    plain = copycat("plain", copy, "scheduler")
    plain["metadata"]["annotations"] = {}
    plain["spec"]["schedulingGates"] = [{"name": "e2e.gpuslice.io/hold"}]
    uid = h.create_pod(kube, ns, plain)["metadata"]["uid"]
    refused(lambda: kube.patch_pod(ns, "plain", {"metadata": {"annotations": {ANNOTATION: copy}}}, MERGE_PATCH),
            "a record patched on")
    refused(lambda: gs.kube.patch_pod_status(ns, "plain", {"metadata": {"annotations": {ANNOTATION: copy}}},
                                            MERGE_PATCH), "a record set through pods/status")
    gs.kube.patch_pod(ns, "plain", {"spec": {"schedulingGates": []}}, MERGE_PATCH)
    refused(lambda: gs.kube.bind_pod(ns, "plain", uid, NODE, {ANNOTATION: copy}), "a record in a Binding")
    # nor may anyone but the extender change or remove the victim's own record
    vns, vname = victim["metadata"]["namespace"], victim["metadata"]["name"]
    refused(lambda: gs.kube.patch_pod(vns, vname, {"metadata": {"annotations": {ANNOTATION: forged(victim)}}},
                                      MERGE_PATCH), "the victim's record changed")
    refused(lambda: gs.kube.patch_pod(vns, vname, {"metadata": {"annotations": {ANNOTATION: None}}}, MERGE_PATCH),
            "the victim's record removed")


@pytest.fixture
def policy_off(gs: h.Gpuslice, tenant: tuple[str, Kube], victim: dict[str, Any]) -> Iterator[None]:
    """The record policy's binding deleted (as with ``admission.enabled: false``), then put back."""
    binding = next((o for o in manifests.rendered() if o["kind"] == "ValidatingAdmissionPolicyBinding"
                    and o["metadata"]["name"] == POLICY), None)  # main before issue 32 had none
    path = f"/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings/{POLICY}"
    try:
        gs.kube.request("DELETE", path)
    except KubeError as e:
        if e.status != 404:
            raise
    ns, kube = tenant
    probe = copycat("probe", victim["metadata"]["annotations"][ANNOTATION], "nodeName")

    def off() -> bool:
        try:
            kube.request("POST", f"/api/v1/namespaces/{ns}/pods", probe, query={"dryRun": "All"})
        except KubeError:
            return False
        return True

    wait_for(off, 30, what="the record policy to be off")
    yield
    if binding is not None:
        h.apply(gs.kube, binding)


def _metric(agent: Agent, name: str) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{agent.port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    out: dict[str, float] = {}
    for m in re.finditer(rf"^{name}(\{{[^}}]*\}})? (\S+)$", text, re.M):
        out[m.group(1) or ""] = float(m.group(2))
    return out


def _agent_events(kube: Kube, ns: str, name: str) -> list[dict[str, Any]]:
    items = kube.request("GET", f"/api/v1/namespaces/{ns}/events",
                         query={"fieldSelector": f"involvedObject.name={name}"}).get("items") or []
    return [e for e in items if (e.get("source") or {}).get("component") == "gpuslice-agent"]


def _no_card(gs: h.Gpuslice, node: RealNode, agent: Agent, ns: str, name: str, why: str) -> dict[str, Any]:
    """Wait until the agent said why ``name`` gets no card; check that no hand-off path gave it one."""
    p = gs.kube.get_pod(ns, name)
    assert p is not None
    uid = p["metadata"]["uid"]

    def told_or_handed() -> list[dict[str, Any]] | None:
        text = node.container_log(ns, name, uid)
        if "NVIDIA_VISIBLE_DEVICES=" in text:
            raise AssertionError(f"{name} got a card: {container_env(node, p, 5).get('NVIDIA_VISIBLE_DEVICES')}")
        return _agent_events(gs.kube, ns, name) or None

    events = wait_for(told_or_handed, 60, interval=0.2, what=f"the agent's Event on {ns}/{name}")
    assert [e["reason"] for e in events] == [REFUSED], events
    assert why in events[0]["message"], events[0]["message"]
    time.sleep(3)  # the kubelet has tried to create the container by now, more than once
    text = node.container_log(ns, name, uid)
    assert "NVIDIA_VISIBLE_DEVICES=" not in text and "GPUSLICE_" not in text, text
    assert not (node.cdi_dir / f"gpuslice.io-slice_pod-{uid}.json").exists(), "a CDI spec was written for it"
    assert not (agent.limiter_dir / "state" / uid).exists(), "a limiter state directory was made for it"
    live = gs.kube.get_pod(ns, name) or {}
    waiting = [(s.get("state") or {}).get("waiting") or {} for s in live.get("status", {}).get("containerStatuses")
               or []]
    assert not any((s.get("state") or {}).get("running") for s in live["status"].get("containerStatuses") or []), \
        f"{name}'s container runs"
    return {"events": [e["message"] for e in events], "container": waiting}


def test_with_the_policy_off_the_agent_hands_a_copied_or_forged_record_no_card(
        gs: h.Gpuslice, node: RealNode, agent: Agent, victim: dict[str, Any], tenant: tuple[str, Kube],
        default_scheduler: None, policy_off: None) -> None:
    ns, kube = tenant
    before = sum(_metric(agent, "gpuslice_agent_records_refused_total").values())
    copy = victim["metadata"]["annotations"][ANNOTATION]
    h.create_pod(kube, ns, copycat("copy-by-name", copy, "nodeName"))
    h.create_pod(kube, ns, copycat("copy-by-scheduler", copy, "scheduler"))
    h.create_pod(kube, ns, copycat("forged", forged(victim), "nodeName"))
    # the strongest forgery: a record naming the pod's own uid, patched on while the pod waits behind a gate
    # of the tenant's own, then bound by the default scheduler (an update the policy would have refused)
    held = copycat("patched", copy, "scheduler")
    held["metadata"]["annotations"] = {}
    held["spec"]["schedulingGates"] = [{"name": "e2e.gpuslice.io/hold"}]
    uid = h.create_pod(kube, ns, held)["metadata"]["uid"]
    own = AllocationRecord(uid, NODE, h.record(victim).gpus, "v100-25", 250, 8192)  # type: ignore[union-attr]
    kube.patch_pod(ns, "patched", {"metadata": {"annotations": {ANNOTATION: own.encode()}},
                                   "spec": {"schedulingGates": []}}, MERGE_PATCH)
    for name in ("copy-by-scheduler", "patched"):
        assert h.wait_bound(gs.kube, ns, name, timeout=60)["spec"]["nodeName"] == NODE
    why = {"copy-by-name": "not this pod", "copy-by-scheduler": "not this pod", "forged": "not this pod",
           "patched": "asks for no v100-25"}
    seen = {name: _no_card(gs, node, agent, ns, name, text) for name, text in why.items()}
    refused_now = _metric(agent, "gpuslice_agent_records_refused_total")
    assert sum(refused_now.values()) - before >= 4, refused_now
    assert refused_now['{reason="other-pod"}'] >= 3 and refused_now['{reason="not-asked"}'] >= 1, refused_now
    # the victim keeps its card, untouched
    assert assert_handed(node, agent, running(gs.kube, victim["metadata"]["namespace"], "victim")).gpus[0] in {
        c["uuid"] for c in CARDS}
    Path(gs.work / "record-trust.json").write_text(json.dumps(seen, indent=1))
    print(f"[gpuslice e2e-node] refused records: {json.dumps(seen)}")
