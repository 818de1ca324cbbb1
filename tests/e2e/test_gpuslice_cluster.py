"""gpuslice end to end: the real kube-apiserver and kube-scheduler, our extender under gunicorn.

Scenarios: best-fit packing through filter/prioritize/bind; explained Pending and a
freed slice going to the head of the line within seconds; entitlements; a SIGKILL in the middle
of a burst of 200 pods; a pod deleted while the extender is down; a DRA pod placed like an
extended-resource one; a pod pinned to a full node pool waiting while an unpinned one behind it
goes ahead; a cordoned node taking no new reservation. Timings worth reporting are printed (``-s``
shows them) and written to ``$GPUSLICE_E2E_TIMINGS`` when set.
"""

from __future__ import annotations

import json
import os
import statistics
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from packing.explain import ADMISSIBLE
from packing.kube.client import MERGE_PATCH, Kube, KubeError
from packing.queue import REASONS

from . import gpuslice_harness as h
from .cluster import ControlPlane

pytestmark = pytest.mark.e2e

TIMINGS: dict[str, Any] = {}


def note(key: str, value: Any) -> None:
    """Record a measured figure (printed, and saved for the report)."""
    TIMINGS[key] = value
    print(f"[gpuslice e2e] {key}: {value}")
    path = os.environ.get("GPUSLICE_E2E_TIMINGS")
    if path:
        Path(path).write_text(json.dumps(TIMINGS, indent=1) + "\n")


@pytest.fixture(scope="module")
def gs(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[h.Gpuslice]:
    """gpuslice installed on the session's control plane for this module."""
    started = time.monotonic()
    g = h.install(control_plane, tmp_path_factory.mktemp("gpuslice"))
    note("install_s", round(time.monotonic() - started, 2))
    try:
        yield g
    finally:
        g.stop()


NAMESPACE_PREFIX = "gs"  # conftest.py's ``ns`` fixture names this module's namespaces by it


# ---- 1. best fit through the real scheduler ------------------------------------------------------

def test_best_fit_through_filter_prioritize_bind(gs: h.Gpuslice, kube: Kube, nodes: list[str], ns: str) -> None:
    a, b = h.add_nodes(gs, nodes, 2, 2, "bf")
    order = [("half", "v100-50", None), ("quarter", "v100-25", None), ("whole", "v100-100", None),
             ("quarter-by-annotation", None, "v100-25"), ("half-2", "v100-50", None)]
    placed: dict[str, Any] = {}
    for name, product, annotation in order:
        h.create_pod(kube, ns, h.slice_pod(name, product, annotation=annotation))
        pod = h.wait_bound(kube, ns, name, timeout=30)
        placed[name] = (h.node_of(pod), h.record(pod))
    for name, (node, rec) in placed.items():
        assert rec is not None and rec.node == node, f"{name} bound without a matching allocation record"
    half, quarter, whole, quarter2, half2 = (placed[n][1] for n, _, _ in order)
    assert half is not None and quarter is not None and whole is not None and quarter2 is not None
    assert half2 is not None
    assert (half.milli, quarter.milli, whole.milli, quarter2.milli) == (500, 250, 1000, 250)
    # a quarter goes to the partly used card, not an empty one
    assert quarter.gpus == half.gpus
    # the whole card goes to the empty card of the same (fuller) node, not to the empty node
    assert whole.node == half.node and whole.gpus != half.gpus
    # the annotation pod is a quarter too, and fills the same card to the brim
    assert quarter2.gpus == half.gpus
    # that node is now full: the next half opens the other node
    assert half2.node != half.node
    usage = h.gpu_usage(h.pods(kube, ns))
    assert all(milli <= 1000 and mib <= 32768 for milli, mib in usage.values())
    assert usage[half.gpus[0]] == [1000, 32768]
    # the ledger says what the API says
    assert h.ledger_view(gs.extender.state()).items() >= h.recount(h.pods(kube, ns)).items()
    assert {a, b} == {half.node, half2.node}


def test_a_write_that_reads_nothing_back_gets_only_the_metadata(gs: h.Gpuslice, kube: Kube, ns: str) -> None:
    """The gate's lift asks kube-apiserver for the patched pod's metadata only (less to encode and decode)."""
    h.create_pod(kube, ns, h.slice_pod("meta-only", "v100-25"))
    reply = kube.patch_pod(ns, "meta-only", {"metadata": {"labels": {"x": "y"}}}, MERGE_PATCH, metadata_only=True)
    assert reply["kind"] == "PartialObjectMetadata" and "spec" not in reply, reply
    assert reply["metadata"]["labels"]["x"] == "y"
    full = kube.patch_pod(ns, "meta-only", {"metadata": {"labels": {"x": "z"}}}, MERGE_PATCH)
    assert full["kind"] == "Pod" and "spec" in full


# ---- 2. more demand than capacity: explained Pending, freed slice goes to the head of the line ----

def test_pending_is_explained_and_freed_slice_goes_to_head(
    gs: h.Gpuslice, kube: Kube, nodes: list[str], ns: str
) -> None:
    (node,) = h.add_nodes(gs, nodes, 1, 1, "q")
    running = [f"run-{i}" for i in range(4)]
    for name in running:
        h.create_pod(kube, ns, h.slice_pod(name, "v100-25"))
    for name in running:
        h.wait_bound(kube, ns, name, timeout=30)
    waiting = [f"wait-{i}" for i in range(3)]
    for name in waiting:
        h.create_pod(kube, ns, h.slice_pod(name, "v100-25"))
        time.sleep(1.05)  # creation timestamps have second resolution: make the line order unambiguous

    def explained() -> dict[str, dict[str, Any]] | None:
        out = {}
        for name in waiting:
            pod = kube.get_pod(ns, name)
            assert pod is not None and not h.node_of(pod), f"{name} was bound with no capacity free"
            cond = h.queued(pod)
            where = f"position {waiting.index(name) + 1} "
            if cond is None or cond["status"] != "True" or where not in cond["message"]:
                return None
            out[name] = {"pod": pod, "condition": cond}
        return out

    seen = h.poll(explained, 30, "the waiting pods to carry the gpuslice.io/Queued condition")
    for i, name in enumerate(waiting):
        pod, cond = seen[name]["pod"], seen[name]["condition"]
        assert h.is_gated(pod), f"{name} should wait SchedulingGated, not hammer kube-scheduler"
        # worst-first: the longest-waiting claim that fits nowhere is the front: the GPU likeliest to free is
        # held for it
        assert cond["reason"] == ("WaitingForReservation" if i == 0 else "NoCapacity"), cond
        assert f"position {i + 1} in the gpuslice queue" in cond["message"]
        assert "250-milli slice" in cond["message"] and "v100-25" in cond["message"]
        scheduled = {c["type"]: c for c in (pod.get("status") or {}).get("conditions") or []}.get("PodScheduled")
        assert scheduled is not None and scheduled["reason"] == "SchedulingGated"
    events = h.poll(lambda: h.events_of(kube, ns, waiting[0]) or None, 10, "an Event on the head of the line")
    assert events[0]["reason"] == "WaitingForReservation" and "position 1" in events[0]["message"]

    latencies = []
    for i, name in enumerate(waiting):
        victim = running[i]
        freed = time.monotonic()
        h.delete_now(kube, ns, victim)
        # 30 s: far inside kube-scheduler's 5-minute unschedulable flush, which the gate must not wait for
        pod = h.wait_bound(kube, ns, name, timeout=30, interval=0.01)
        latencies.append(time.monotonic() - freed)
        assert h.node_of(pod) == node
        # the head went first: nobody behind it was bound before it
        for later in waiting[i + 1:]:
            behind = kube.get_pod(ns, later)
            assert behind is not None and not h.node_of(behind), f"{later} overtook {name}"
        cond = h.queued(pod)
        assert cond is not None
    note("free_to_bind_s", {"samples": [round(x, 3) for x in latencies],
                            "p50": round(statistics.median(latencies), 3), "max": round(max(latencies), 3)})
    usage = h.gpu_usage(p for p in h.pods(kube, ns) if h.node_of(p))
    assert all(milli <= 1000 for milli, _ in usage.values())


def test_entitlement_holds_a_namespace_to_its_share(gs: h.Gpuslice, kube: Kube, nodes: list[str], ns: str) -> None:
    h.add_nodes(gs, nodes, 1, 2, "ent")
    cm = {"apiVersion": "v1", "kind": "ConfigMap",
          "metadata": {"name": "gpuslice-entitlements", "namespace": h.SYSTEM_NS},
          "data": {ns: "v100-50=1"}}
    h.apply(kube, cm)
    try:
        h.create_pod(kube, ns, h.slice_pod("first", "v100-50"))
        h.wait_bound(kube, ns, "first")
        h.create_pod(kube, ns, h.slice_pod("second", "v100-50"))

        def over_quota() -> dict[str, Any] | None:
            pod = kube.get_pod(ns, "second")
            assert pod is not None and not h.node_of(pod), "the namespace got more than its entitlement"
            cond = h.queued(pod)
            return cond if cond is not None and cond["reason"] == "QuotaExceeded" else None

        cond = h.poll(over_quota, 20, "the second pod to wait with reason QuotaExceeded")
        assert "holds 1 of its 1 v100-50" in cond["message"]
        h.delete_now(kube, ns, "first")
        h.wait_bound(kube, ns, "second", timeout=20)
    finally:
        kube.request("DELETE", f"/api/v1/namespaces/{h.SYSTEM_NS}/configmaps/gpuslice-entitlements")


# ---- 3. SIGKILL in the middle of a burst of 200 pods ------------------------------------------------

BURST = 200
BURST_MIX = ("v100-25", "v100-25", "v100-25", "v100-50", "v100-50", "v100-100")  # 200 pods ask for ~92 cards


def create_with_retry(kube: Kube, ns: str, pod: dict[str, Any], failures: list[str], deadline: float) -> None:
    """Create a pod as a controller would: while no extender answers the webhook, creation fails; retry."""
    while True:
        try:
            h.create_pod(kube, ns, pod)
            return
        except KubeError as e:
            if e.status == 409:
                return
            failures.append(f"{e.status}: {e}")
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def settled(gs: h.Gpuslice, kube: Kube, ns: str, total: int) -> dict[str, Any] | None:
    """Every pod bound or explained Pending, no reservation in flight, and the API agrees with the ledger."""
    items = h.pods(kube, ns)
    if len(items) < total:
        return None
    try:
        state = gs.extender.state()
    except OSError:
        return None
    if not state["ready"] or any(a["state"] != "bound" for a in state["allocations"]):
        return None
    for pod in items:
        if h.node_of(pod):
            continue
        cond = h.queued(pod)
        # Admissible: explained before the admission step that starts it, so still in flight
        if cond is None or cond["status"] != "True" or cond["reason"] not in REASONS or cond["reason"] == ADMISSIBLE:
            return None
    return {"pods": items, "state": state}


def test_sigkill_in_burst_then_ledger_equals_api(gs: h.Gpuslice, kube: Kube, nodes: list[str], ns: str) -> None:
    h.add_nodes(gs, nodes, 5, 4, "burst")  # 20 cards for ~92 cards of demand
    ext = gs.extender
    failures: list[str] = []
    deadline = time.monotonic() + 120
    names = [f"b-{i:03d}" for i in range(BURST)]
    created = threading.Semaphore(0)

    def creator(chunk: list[str]) -> None:
        for name in chunk:
            product = BURST_MIX[int(name[2:]) % len(BURST_MIX)]
            create_with_retry(kube, ns, h.slice_pod(name, product), failures, deadline)
            created.release()

    threads = [threading.Thread(target=creator, args=(names[i::4],)) for i in range(4)]
    burst_started = time.monotonic()
    for t in threads:
        t.start()
    for _ in range(BURST // 3):  # a third of the burst is in, the rest is on its way: crash now
        created.acquire()
    bound_at_kill = sum(1 for p in h.pods(kube, ns) if h.node_of(p))
    ext.kill()
    killed = time.monotonic()
    time.sleep(1.5)  # the burst keeps coming (and failing at the webhook) while nobody answers
    ext.start()
    ready_after = ext.wait_ready(60)
    note("restart_ready_s", round(ready_after, 2))
    for t in threads:
        t.join(120)
    result = h.poll(lambda: settled(gs, kube, ns, BURST), 180, "the burst to settle", interval=0.5)
    note("burst", {"pods": BURST, "bound_at_kill": bound_at_kill, "create_retries_while_down": len(failures),
                   "kill_to_settled_s": round(time.monotonic() - killed, 2),
                   "burst_to_settled_s": round(time.monotonic() - burst_started, 2)})
    items, state = result["pods"], result["state"]
    bound = [p for p in items if h.node_of(p)]
    waiting = [p for p in items if not h.node_of(p)]
    assert len(items) == BURST and bound and waiting
    # no card is over-committed, by the records on the pods
    usage = h.gpu_usage(bound)
    over = {gpu: used for gpu, used in usage.items() if used[0] > 1000 or used[1] > 32768}
    assert not over, f"over-committed cards: {over}"
    # the ledger equals a recount from the API
    assert h.ledger_view(state) == h.recount(bound)
    # every waiting pod is explained, and none of them would fit now (the queue admits all that fit) but
    # on capacity held for an older pod (worst-first holds the GPUs likeliest to free for the front of the line)
    free = state["free_slices"]
    for pod in waiting:
        cond = h.queued(pod)
        assert cond is not None and cond["status"] == "True" and "position" in cond["message"]
        product = next(k.split("/")[1] for k in pod["spec"]["containers"][0]["resources"]["limits"])
        if cond["reason"] == "NoCapacity":
            assert free[product] == 0, f"{pod['metadata']['name']} waits for {product} while {free[product]} are free"
        else:
            assert cond["reason"] in ("BlockedByHeadOfLine", "WaitingForReservation"), cond
    assert len(state["queue"]) == len(waiting)


# ---- 4. a pod deleted while the extender is down is freed after restart ---------------------------

def test_pod_deleted_while_down_is_freed_after_restart(
    gs: h.Gpuslice, kube: Kube, nodes: list[str], ns: str
) -> None:
    h.add_nodes(gs, nodes, 1, 1, "down")
    h.create_pod(kube, ns, h.slice_pod("holder", "v100-100"))
    holder = h.wait_bound(kube, ns, "holder")
    h.create_pod(kube, ns, h.slice_pod("next", "v100-100"))
    h.poll(lambda: (h.queued(kube.get_pod(ns, "next") or {}) or {}).get("reason") == "WaitingForReservation", 20,
           "the second pod to wait, holding the card (the longest-waiting claim is held for at once)")
    ext = gs.extender
    ext.kill()
    h.delete_now(kube, ns, "holder")
    ext.start()
    ext.wait_ready(60)
    pod = h.wait_bound(kube, ns, "next", timeout=30)
    rec = h.record(pod)
    assert rec is not None and rec.gpus == h.record(holder).gpus  # type: ignore[union-attr]
    assert holder["metadata"]["uid"] not in h.ledger_view(ext.state())


# ---- 5. DRA: a ResourceClaimTemplate naming our DeviceClass is placed like an extended resource ----

def test_dra_claim_is_placed_like_an_extended_resource(
    gs: h.Gpuslice, kube: Kube, nodes: list[str], ns: str
) -> None:
    (node,) = h.add_nodes(gs, nodes, 1, 2, "dra")
    h.apply(kube, h.resource_slice(node))
    template = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
        "metadata": {"name": "half-gpu", "namespace": ns},
        "spec": {"spec": {"devices": {"requests": [
            {"name": "gpu", "exactly": {"deviceClassName": "v100-50.gpuslice.io"}}]}}},
    }
    h.apply(kube, template)
    h.create_pod(kube, ns, h.slice_pod("quarter", "v100-25"))
    quarter = h.wait_bound(kube, ns, "quarter")
    pod = h.create_pod(kube, ns, h.slice_pod("dra-half", claim_template="half-gpu"))
    assert h.is_gated(pod) and pod["spec"]["schedulerName"] == h.SCHEDULER_NAME, "the webhook must route DRA pods"
    claim_name = h.stand_in_claim_controller(kube, ns, pod, template)
    bound = h.wait_bound(kube, ns, "dra-half", timeout=30)
    rec, quarter_rec = h.record(bound), h.record(quarter)
    assert rec is not None and quarter_rec is not None
    assert (rec.product, rec.milli, rec.memory_mib, rec.node) == ("v100-50", 500, 16384, node)
    assert rec.gpus == quarter_rec.gpus, "best fit: the half joins the partly used card"
    claim = kube.request("GET", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{claim_name}")
    results = claim["status"]["allocation"]["devices"]["results"]
    assert results[0]["driver"] == "gpuslice.io" and results[0]["device"].startswith("v100-50-")


# ---- leader election: the standby is not ready; on the leader's crash it rebuilds and serves --------

def test_standby_takes_over_after_leader_crash(gs: h.Gpuslice, kube: Kube, nodes: list[str], ns: str) -> None:
    h.add_nodes(gs, nodes, 1, 2, "ha")
    for name, product in (("x", "v100-50"), ("y", "v100-25"), ("z", "v100-100")):
        h.create_pod(kube, ns, h.slice_pod(name, product))
        h.wait_bound(kube, ns, name)
    leader = gs.extender
    standby = gs.new_extender("e2e-replica-b")
    standby.start()
    try:
        h.poll(standby.answers, 60, "the standby to answer")
        time.sleep(2)  # a few campaign rounds: it must stay a standby while the leader renews
        assert not standby.ready() and leader.ready()
        status, _ = standby.get("/readyz")
        assert status == 503
        # the Service selects the leader's pod by its label; the standby serves (/healthz, Ready) unlabelled
        assert standby.get("/healthz")[0] == 200
        assert h.leader_labelled(kube) == {leader.identity}
        # the webhook needs no leadership: the standby answers it too (its Service selects every replica)
        status, doc = standby.review(h.slice_pod("via-standby", "v100-25"))
        assert status == 200 and doc["response"]["allowed"] and doc["response"]["patchType"] == "JSONPatch"
        leader.kill()
        crashed = time.monotonic()
        standby.wait_ready(60)
        note("failover_ready_s", round(time.monotonic() - crashed, 2))
        # a crashed leader cannot unlabel its pod: its replacement process does at start (here: below)
        h.poll(lambda: standby.identity in h.leader_labelled(kube), 10, "the new leader to label its pod")
        expected = h.recount(h.pods(kube, ns))
        assert expected.items() <= h.ledger_view(standby.state()).items()
        assert len(expected) == 3
    finally:
        standby.stop()  # a clean stop gives the Lease up and the label: the first replica takes both back
        gs.extenders.remove(standby)
        leader.start()
        leader.wait_ready(60)
    h.poll(lambda: h.leader_labelled(kube) == {leader.identity}, 10, "the label back on the first replica only")


# ---- mutual TLS: kube-scheduler presents its client certificate; a client without one is refused ------

def test_mutual_tls_between_kube_scheduler_and_the_extender(
    gs: h.Gpuslice, kube: Kube, nodes: list[str], ns: str
) -> None:
    import ssl
    import urllib.error

    (node,) = h.add_nodes(gs, nodes, 1, 1, "mtls")
    h.create_pod(kube, ns, h.slice_pod("through-mtls", "v100-25"))
    bound = h.wait_bound(kube, ns, "through-mtls")  # filter and bind needed kube-scheduler's certificate
    assert h.node_of(bound) == node
    ext = gs.extender
    body = {"Pod": h.slice_pod("probe", "v100-25") | {"metadata": {"name": "probe", "uid": "u-probe"}},
            "NodeNames": [node], "Nodes": None}
    status, reply = ext.call("POST", "/filter", body)  # no client certificate
    assert status == 403 and "client certificate" in reply["error"], reply
    status, reply = ext.call("POST", "/filter", body, cert=gs.tls.other)  # the CA's, but not on the allow-list
    assert status == 403 and "someone-else" in reply["error"], reply
    with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
        ext.call("POST", "/filter", body, cert=gs.tls.foreign)  # another CA: no handshake
    status, reply = ext.call("POST", "/filter", body, cert=gs.tls.scheduler)
    assert status == 200 and reply["Error"] == "", reply
    assert ext.get("/readyz")[0] == 200  # probes carry no certificate
    # the pod was told where its slice is, and that nothing on a node known only by its labels enforces it
    events = h.poll(lambda: [e for e in h.events_of(kube, ns, "through-mtls") if e["reason"] == "Allocated"] or None,
                    20, "the Allocated event")
    assert "enforcement: none" in events[0]["message"] and events[0]["type"] == "Warning", events[0]
    state = ext.state()
    assert {n["name"]: n["enforcement"] for n in state["nodes"]}[node] == "none"
    note("mtls", {"refused_without_certificate": True, "refused_other_subject": True,
                  "refused_other_ca": True, "scheduler_bound_through_mtls": True})


# ---- node constraints: a pod pinned to a full pool waits; one behind it goes to the pool with room ----

def test_a_pod_pinned_to_a_full_pool_waits_and_an_unpinned_one_behind_it_goes_ahead(
    gs: h.Gpuslice, kube: Kube, nodes: list[str], ns: str
) -> None:
    pool_key = "e2e.gpuslice.io/pool"
    a, b = "pin-a-0", "pin-b-0"
    for name, pool in ((a, "a"), (b, "b")):
        h.gpu_node(kube, gs.cp.api_client(), name, 1, labels={pool_key: pool})
        nodes.append(name)
    h.poll(lambda: {a, b} <= {n["name"] for n in gs.extender.state()["nodes"]}, 20, "nodes in the ledger")

    def on_pool(name: str, pool: str | None) -> dict[str, Any]:
        pod = h.slice_pod(name, "v100-50")
        if pool is not None:
            pod["spec"]["nodeSelector"] = {pool_key: pool}
        return pod

    for name in ("fill-0", "fill-1"):  # pool a's only card, full
        h.create_pod(kube, ns, on_pool(name, "a"))
        assert h.node_of(h.wait_bound(kube, ns, name, timeout=30)) == a
    h.create_pod(kube, ns, on_pool("pinned", "a"))

    def waits_held_for() -> dict[str, Any] | None:
        """worst-first: the pinned pod, the longest-waiting claim that fits nowhere, holds its pool's GPU."""
        pod = kube.get_pod(ns, "pinned")
        assert pod is not None and not h.node_of(pod), "the pinned pod was bound though its pool is full"
        cond = h.queued(pod)
        held = cond is not None and cond["status"] == "True" and cond["reason"] == "WaitingForReservation"
        return cond if held else None

    cond = h.poll(waits_held_for, 30, "the pinned pod to wait with reason WaitingForReservation")
    assert "position 1 in the gpuslice queue" in cond["message"], cond
    assert f"node selector {pool_key}=a" in cond["message"] and f"of node {a} for it" in cond["message"], cond
    time.sleep(1.05)  # creation timestamps have second resolution: the unpinned pod is behind it in line
    started = time.monotonic()
    h.create_pod(kube, ns, on_pool("unpinned", None))
    unpinned = h.wait_bound(kube, ns, "unpinned", timeout=30)
    took = time.monotonic() - started
    assert h.node_of(unpinned) != a
    if {n["name"] for n in gs.extender.state()["nodes"]} == {a, b}:
        assert h.node_of(unpinned) == b
    pinned = kube.get_pod(ns, "pinned")
    assert pinned is not None and not h.node_of(pinned) and h.is_gated(pinned)
    cond = h.queued(pinned)
    assert cond is not None and cond["reason"] == "WaitingForReservation", cond
    # a slice frees on its pool: the pinned pod goes there, not to b (which still has room)
    h.delete_now(kube, ns, "fill-0")
    assert h.node_of(h.wait_bound(kube, ns, "pinned", timeout=30)) == a
    note("pinned_pool", {"unpinned_bound_behind_pinned_s": round(took, 3), "pinned_reason": "WaitingForReservation"})


def test_a_cordoned_node_takes_no_new_reservation_until_it_is_uncordoned(
    gs: h.Gpuslice, kube: Kube, nodes: list[str], ns: str
) -> None:
    from packing.kube.client import MERGE_PATCH

    (node,) = h.add_nodes(gs, nodes, 1, 1, "cordon")

    def cordon(flag: bool) -> None:
        kube.request("PATCH", f"/api/v1/nodes/{node}", {"spec": {"unschedulable": flag}}, content_type=MERGE_PATCH)
        h.poll(lambda: {n["name"] for n in gs.extender.state()["nodes"]} >= {node}, 10, "the node in the ledger")

    cordon(True)
    time.sleep(1.0)  # the node watch carries the cordon to the ledger
    h.create_pod(kube, ns, h.slice_pod("after-cordon", "v100-50"))

    def waits() -> dict[str, Any] | None:
        pod = kube.get_pod(ns, "after-cordon")
        assert pod is not None and not h.node_of(pod), "a pod was bound on a cordoned node"
        cond = h.queued(pod)
        return cond if cond is not None and cond["status"] == "True" else None

    cond = h.poll(waits, 30, "the pod to wait while the only GPU node is cordoned")
    if {n["name"] for n in gs.extender.state()["nodes"]} == {node}:
        assert cond["reason"] == "Unsatisfiable" and "1 are cordoned" in cond["message"], cond
    cordon(False)
    assert h.node_of(h.wait_bound(kube, ns, "after-cordon", timeout=30)) == node
