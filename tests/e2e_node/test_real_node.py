"""gpuslice on a real kubelet with containerd: each container gets exactly its record's card and caps.

Scenarios (the figures are printed, and saved to ``$GPUSLICE_E2E_TIMINGS`` when set):

1. a pod asking by DRA claim, one by extended resource and one by annotation reach Running, and
   each container's environment (its log) holds exactly its record's UUID and its product's caps
   (the annotation pod through the agent's NRI plugin);
2. two pods with identical requests are admitted by the kubelet in the opposite order to their
   binds, and each still gets its own card;
3. the agent is restarted between prepare and unprepare, the kubelet while pods run: nothing is
   prepared twice and nothing is lost;
4. delete -> the next queued pod Running (p50/p99), with the claim or token handed back;
5. a card withdrawn from the inventory gets nothing new;
6. a pod group of two slice pods: the first waits for its partner (gated, WaitingForMembers), then
   both are bound together and Running, each handed its own card and caps.

In every handed container (every path) the in-container limiter is checked as the hand-off gives
it: ``/etc/ld.so.preload`` naming the library, the library itself (the very file ``make
interposer`` built, read-only), the pod's state directory mounted read-write (a file the
container writes there appears in ``<limiter-dir>/state/<pod uid>`` on the host) and
``GPUSLICE_SLICE_MEMORY_MIB`` / ``GPUSLICE_SLICE_STATE_DIR`` set to its product's cap. busybox is
static, so the loader never preloads the library into these containers: the suite checks the
files and the environment, not the library's answers (``tests/interposer`` does those).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import statistics
import time
from pathlib import Path
from typing import Any

import pytest

from packing.kube.client import MERGE_PATCH, Kube, KubeError
from packing.record import AllocationRecord
from tests.e2e import gpuslice_harness as h
from tests.e2e.cluster import create_namespace, wait_for

from .conftest import CARDS, NODE, Agent, _inventory
from .node import IMAGE, RealNode

pytestmark = pytest.mark.e2e
HOLD = "e2e.gpuslice.io/hold"
CAPS = {"v100-25": ("8192", "25"), "v100-50": ("16384", "50"), "v100-100": ("32768", "100")}
# the hand-off's contract (enforcement/README.md, "The hand-off"), written out: a test, not a copy
CONTAINER_LIBRARY = "/usr/local/gpuslice/lib/libgpuslice-limiter.so"
CONTAINER_STATE_DIR = "/run/gpuslice/limiter"
FIGURES: dict[str, Any] = {}
SEEN: dict[str, dict[str, str]] = {}  # pod name -> what its container reported of its limiter


def note(key: str, value: Any) -> None:
    FIGURES[key] = value
    print(f"[gpuslice e2e-node] {key}: {value}")
    path = os.environ.get("GPUSLICE_E2E_TIMINGS")
    if path:
        Path(path).write_text(json.dumps(FIGURES, indent=1) + "\n")


# What the container reports of its limiter, one "limiter <what>=<value>" line each (busybox's ash), then
# "limiter done=1": the log is read once that line is there.
LIMITER_PROBE = " ".join((
    'echo "limiter preload=$(cat /etc/ld.so.preload)";',
    f'set -- $(sha256sum {CONTAINER_LIBRARY}); echo "limiter library_sha256=$1";',
    '(echo x > /etc/ld.so.preload) 2>/dev/null && echo "limiter preload_write=allowed" ||',
    'echo "limiter preload_write=refused";',
    f'(echo x > {CONTAINER_LIBRARY}) 2>/dev/null && echo "limiter library_write=allowed" ||',
    'echo "limiter library_write=refused";',
    'echo "limiter state_mode=$(stat -c %a "$GPUSLICE_SLICE_STATE_DIR")";',
    '(echo "$GPUSLICE_POD_UID" > "$GPUSLICE_SLICE_STATE_DIR/probe-main") 2>/dev/null &&',
    'echo "limiter state_write=ok" || echo "limiter state_write=failed";',
    'echo "limiter done=1";',
))


def pod(name: str, product: str, how: str, claim: str | None = None, hold: bool = False) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "main", "image": IMAGE, "imagePullPolicy": "Never",
        "command": ["sh", "-c", f"env; {LIMITER_PROBE} trap 'exit 0' TERM; while :; do sleep 1; done"],
        "resources": {"requests": {"cpu": "10m"}},
    }
    meta: dict[str, Any] = {"name": name}
    spec: dict[str, Any] = {"containers": [container], "hostNetwork": True, "terminationGracePeriodSeconds": 1,
                            "tolerations": [{"operator": "Exists"}]}
    if how == "resource":
        container["resources"] = {"requests": {"cpu": "10m", f"gpuslice.io/{product}": "1"},
                                  "limits": {f"gpuslice.io/{product}": "1"}}
    elif how == "annotation":
        meta["annotations"] = {"gpuslice.io/product": product}
    elif how == "dra":
        assert claim is not None
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim}]
        container["resources"]["claims"] = [{"name": "gpu"}]
    if hold:
        spec["schedulingGates"] = [{"name": HOLD}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def claim(kube: Kube, ns: str, name: str, product: str) -> None:
    kube.request("POST", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims", {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": name},
        "spec": {"devices": {"requests": [{"name": "slice", "exactly": {
            "deviceClassName": f"{product}.gpuslice.io", "allocationMode": "ExactCount", "count": 1}}]}}})


def running(kube: Kube, ns: str, name: str, timeout: float = 90.0) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        p = kube.get_pod(ns, name)
        phase = (p or {}).get("status", {}).get("phase")
        if phase == "Failed":
            raise AssertionError(f"pod {ns}/{name} failed: {(p or {}).get('status')}")
        return p if phase == "Running" else None

    got: dict[str, Any] = wait_for(check, timeout, interval=0.05, what=f"pod {ns}/{name} Running")
    return got


def container_env(node: RealNode, p: dict[str, Any], timeout: float = 30.0) -> dict[str, str]:
    meta = p["metadata"]

    def read() -> dict[str, str] | None:
        text = node.container_log(meta["namespace"], meta["name"], meta["uid"])
        env: dict[str, str] = {}
        for line in text.splitlines():
            parts = line.split(" ", 3)  # CRI log format: <time> <stream> <tag> <line>
            if len(parts) == 4 and "=" in parts[3]:
                key, _, value = parts[3].partition("=")
                env[key] = value
        return env if "limiter done" in env else None

    got: dict[str, str] = wait_for(read, timeout, interval=0.1, what=f"the log of {meta['name']}")
    return got


def limiter_state(agent: Agent, p: dict[str, Any]) -> Path:
    """The host side of the pod's limiter state directory."""
    return agent.limiter_dir / "state" / str(p["metadata"]["uid"])


def assert_handed(node: RealNode, agent: Agent, p: dict[str, Any]) -> AllocationRecord:
    rec = h.record(p)
    assert rec is not None and rec.node == NODE, f"{p['metadata']['name']} has no record for {NODE}"
    assert set(rec.gpus) <= {c["uuid"] for c in CARDS}, f"record names non-NVML ids: {rec.gpus}"
    env = container_env(node, p)
    mib, percent = CAPS[str(rec.product)]
    assert env.get("NVIDIA_VISIBLE_DEVICES") == ",".join(rec.gpus), env
    assert env.get("GPUSLICE_SLICE_MEMORY_MIB") == mib == str(rec.memory_mib)
    assert env.get("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT") == f"0={mib}M"
    assert env.get("GPUSLICE_SLICE_SHARE_PERCENT") == percent
    assert env.get("GPUSLICE_POD_UID") == p["metadata"]["uid"]
    # the in-container limiter: preload entry, the library built here (read-only), the pod's state dir
    built = Path(agent.argv[agent.argv.index("--limiter-source") + 1])
    seen = {k.removeprefix("limiter "): v for k, v in env.items() if k.startswith("limiter ")}
    assert env.get("GPUSLICE_SLICE_STATE_DIR") == CONTAINER_STATE_DIR, env
    assert seen == {"preload": CONTAINER_LIBRARY, "library_sha256": hashlib.sha256(built.read_bytes()).hexdigest(),
                    "preload_write": "refused", "library_write": "refused", "state_mode": "777",
                    "state_write": "ok", "done": "1"}, seen
    probe = limiter_state(agent, p) / "probe-main"
    assert probe.read_text().strip() == p["metadata"]["uid"], "the container's state dir is not its pod's"
    SEEN[p["metadata"]["name"]] = {**seen, "GPUSLICE_SLICE_MEMORY_MIB": mib, "host_state": str(probe.parent)}
    return rec


@pytest.fixture
def ns(gs: h.Gpuslice, node: RealNode, agent: Agent, request: pytest.FixtureRequest) -> Any:
    name = create_namespace(gs.cp.api_client(), "node")
    failed = request.session.testsfailed
    yield name
    if request.session.testsfailed > failed:
        print(agent.tail(80), node.logs(60), gs.logs())
    for p in h.pods(gs.kube, name):
        h.delete_now(gs.kube, name, p["metadata"]["name"])
    wait_for(lambda: not _node_pods(gs.kube, name), 60, what=f"the pods of {name} to go")


def _node_pods(kube: Kube, ns: str) -> list[dict[str, Any]]:
    return h.pods(kube, ns)


# ---- 1 ---------------------------------------------------------------------------------------------

def test_dra_and_extended_resource_pods_get_their_card_and_caps(gs: h.Gpuslice, node: RealNode, agent: Agent,
                                                                ns: str) -> None:
    kube = gs.kube
    inv = _inventory(kube)
    assert inv is not None and [c["uuid"] for c in inv] == [c["uuid"] for c in CARDS]
    assert all(c["model"] == "Tesla-V100-SXM2-32GB" and c["memory_mib"] == 32768 and c["healthy"] for c in inv)
    claim(kube, ns, "half", "v100-50")
    h.create_pod(kube, ns, pod("by-claim", "v100-50", "dra", claim="half"))
    h.create_pod(kube, ns, pod("by-resource", "v100-25", "resource"))
    # the usual DRA form: a ResourceClaimTemplate (its claim made as the resourceclaim controller would)
    template = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "quarter"},
                "spec": {"spec": {"devices": {"requests": [{"name": "slice", "exactly": {
                    "deviceClassName": "v100-25.gpuslice.io", "allocationMode": "ExactCount", "count": 1}}]}}}}
    kube.request("POST", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaimtemplates", template)
    by_template = pod("by-template", "v100-25", "dra", claim="unused")
    by_template["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "quarter"}]
    h.stand_in_claim_controller(kube, ns, h.create_pod(kube, ns, by_template), template)
    by_claim, by_resource = running(kube, ns, "by-claim"), running(kube, ns, "by-resource")
    rec_claim, rec_resource = assert_handed(node, agent, by_claim), assert_handed(node, agent, by_resource)
    assert rec_claim.product == "v100-50" and rec_resource.product == "v100-25"
    assert assert_handed(node, agent, running(kube, ns, "by-template")).product == "v100-25"
    c = kube.request("GET", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/half")
    spec_path = node.cdi_dir / f"gpuslice.io-slice_claim-{c['metadata']['uid']}.json"
    doc = json.loads(spec_path.read_text())
    assert doc["annotations"]["gpuslice.io/pod-uid"] == by_claim["metadata"]["uid"]
    note("handed_pods", {"dra": rec_claim.gpus, "resource": rec_resource.gpus})
    note("limiter_in_container", {n: SEEN[n] for n in ("by-claim", "by-template", "by-resource")})


def test_annotation_pod_gets_its_card_through_nri(gs: h.Gpuslice, node: RealNode, agent: Agent, ns: str) -> None:
    """No kubelet plugin sees an annotation-only pod; the agent's NRI plugin hands it its slice."""
    h.create_pod(gs.kube, ns, pod("by-annotation", "v100-25", "annotation"))
    p = running(gs.kube, ns, "by-annotation")
    rec = assert_handed(node, agent, p)
    spec = node.cdi_dir / f"gpuslice.io-slice_pod-{p['metadata']['uid']}.json"
    assert spec.exists()
    # the DRA and device plugin pods of the other tests were not handed twice
    assert "NRI: container" in agent.log.read_text()
    state = limiter_state(agent, p)
    assert state.is_dir()
    h.delete_now(gs.kube, ns, "by-annotation")
    wait_for(lambda: not spec.exists(), 60, what="the pod's NRI spec removed when its sandbox stops")
    wait_for(lambda: not state.exists(), 10, what="the pod's limiter state directory removed with its spec")
    note("annotation_pod", {"gpus": rec.gpus, "limiter_in_container": SEEN["by-annotation"]})


# ---- 2 ---------------------------------------------------------------------------------------------

def _admission_order(node: RealNode, uids: set[str]) -> list[str]:
    order: list[str] = []
    for line in node.kubelet_log.read_text(errors="replace").splitlines():
        if "Need devices to allocate for pod" in line:
            m = re.search(r'podUID="([0-9a-f-]+)"', line)
            if m and m.group(1) in uids and m.group(1) not in order:
                order.append(m.group(1))
    return order


def test_opposite_admission_order_still_gives_each_pod_its_card(gs: h.Gpuslice, node: RealNode, agent: Agent,
                                                               ns: str) -> None:
    kube = gs.kube
    node.stop_kubelet()
    try:
        h.create_pod(kube, ns, pod("first-created", "v100-100", "resource", hold=True))
        # the queue reserves its card and lifts its own gate; our hold keeps it from being bound
        wait_for(lambda: [g["name"] for g in kube.get_pod(ns, "first-created")["spec"].get("schedulingGates", [])]
                 == [HOLD], 30, what="first-created admitted by the queue")
        time.sleep(1.1)  # creation timestamps have second resolution
        h.create_pod(kube, ns, pod("second-created", "v100-100", "resource"))
        second = h.wait_bound(kube, ns, "second-created", timeout=30)
        kube.patch_pod(ns, "first-created", {"spec": {"schedulingGates": []}}, MERGE_PATCH)
        first = h.wait_bound(kube, ns, "first-created", timeout=30)
    finally:
        node.start_kubelet()
    bind_order = ["second-created", "first-created"]  # bound while the kubelet was down
    a, b = running(kube, ns, "first-created", 120), running(kube, ns, "second-created", 120)
    uids = {a["metadata"]["uid"]: "first-created", b["metadata"]["uid"]: "second-created"}
    admitted = [uids[u] for u in _admission_order(node, set(uids))]
    assert admitted == ["first-created", "second-created"], f"kubelet admission order {admitted}"
    assert admitted == list(reversed(bind_order))
    rec_a, rec_b = assert_handed(node, agent, a), assert_handed(node, agent, b)
    assert rec_a.gpus != rec_b.gpus, "two whole cards on one card"
    assert h.record(first) == rec_a and h.record(second) == rec_b
    note("opposite_order", {"bound": bind_order, "admitted": admitted, "cards": [rec_a.gpus, rec_b.gpus],
                            "token_card_mismatches_so_far": agent.log.read_text().count("the record wins")})


# ---- 3 ---------------------------------------------------------------------------------------------

def test_agent_and_kubelet_restarts_prepare_nothing_twice_and_lose_nothing(gs: h.Gpuslice, node: RealNode,
                                                                         agent: Agent, ns: str) -> None:
    kube = gs.kube
    claim(kube, ns, "quarter", "v100-25")
    h.create_pod(kube, ns, pod("dra-pod", "v100-25", "dra", claim="quarter"))
    h.create_pod(kube, ns, pod("dp-pod", "v100-25", "resource"))
    dra_pod, dp_pod = running(kube, ns, "dra-pod"), running(kube, ns, "dp-pod")
    claim_uid = kube.request("GET", f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/quarter")[
        "metadata"]["uid"]
    spec_path = node.cdi_dir / f"gpuslice.io-slice_claim-{claim_uid}.json"
    assert spec_path.exists()
    checkpoint = Path(agent.argv[agent.argv.index("--state-dir") + 1]) / "dra-checkpoint.json"
    assert claim_uid in json.loads(checkpoint.read_text())["claims"]

    agent.restart(kill=True)  # SIGKILL: nothing cleaned up
    wait_for(lambda: (node.kubelet_dir / "plugins_registry" / "gpuslice.io-reg.sock").exists(), 30,
             what="the DRA plugin back")
    node.restart_kubelet()
    wait_for(lambda: node.kubelet_alive() and _ready_again(kube), 90, what="the kubelet back")
    time.sleep(5)  # the kubelet re-syncs its pods (and would re-prepare, were it going to)
    for name, before in (("dra-pod", dra_pod), ("dp-pod", dp_pod)):
        now = kube.get_pod(ns, name)
        assert now is not None and now["status"]["phase"] == "Running"
        assert now["metadata"]["uid"] == before["metadata"]["uid"]
        restarts = [s["restartCount"] for s in now["status"]["containerStatuses"]]
        assert restarts == [0], f"{name} containers restarted: {restarts}"
    log = agent.log.read_text()
    assert log.count(f"prepared claim {ns}/quarter ") == 1, "the claim was prepared twice"
    assert spec_path.exists() and claim_uid in json.loads(checkpoint.read_text())["claims"]
    for p in (dra_pod, dp_pod):  # the restarted agent kept the running pods' limiter state (and what is in it)
        probe = limiter_state(agent, p) / "probe-main"
        assert probe.read_text().strip() == p["metadata"]["uid"], f"{p['metadata']['name']} lost its limiter state"

    h.delete_now(kube, ns, "dra-pod")
    wait_for(lambda: not spec_path.exists(), 60, what="the claim's CDI spec removed by NodeUnprepareResources")
    wait_for(lambda: claim_uid not in json.loads(checkpoint.read_text())["claims"], 10, what="checkpoint entry gone")
    assert agent.log.read_text().count(f"unprepared claim {ns}/quarter ") == 1
    wait_for(lambda: not limiter_state(agent, dra_pod).exists(), 30, what="the DRA pod's limiter state removed")
    assert limiter_state(agent, dp_pod).is_dir()  # a neighbour's stays
    note("restarts", {"prepared_once": True, "unprepared_after_restarts": True})


def _ready_again(kube: Kube) -> bool:
    n = kube.get(f"/api/v1/nodes/{NODE}") or {}
    for c in (n.get("status") or {}).get("conditions") or []:
        if c.get("type") == "Ready":
            return bool(c.get("status") == "True")
    return False


# ---- 4 ---------------------------------------------------------------------------------------------

def _claim_uid(kube: Kube, ns: str, name: str) -> str:
    path = f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}"
    return str(kube.request("GET", path)["metadata"]["uid"])


def release_claim(kube: Kube, ns: str, name: str) -> None:
    """What kube-controller-manager's resourceclaim controller does once a claim's pod is gone (this
    control plane runs none): clear the reservation and allocation, drop the finalizer, delete."""
    path = f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}"
    c = kube.request("GET", path)
    c["status"] = {}
    c = kube.request("PUT", path + "/status", c)
    c["metadata"]["finalizers"] = []
    kube.request("PUT", path, c)
    kube.request("DELETE", path)


@pytest.mark.parametrize("how", ["dra", "resource"])
def test_delete_to_next_queued_pod_running(gs: h.Gpuslice, node: RealNode, agent: Agent, ns: str, how: str) -> None:
    """Every card full; delete a pod: its claim is unprepared (DRA), the ledger frees its slice, and the
    next queued pod runs with its card. Delete -> Running is timed."""
    kube = gs.kube
    rounds = 6

    def make(name: str) -> None:
        if how == "dra":
            claim(kube, ns, name, "v100-100")
        h.create_pod(kube, ns, pod(name, "v100-100", how, claim=name if how == "dra" else None))

    for i in range(len(CARDS)):
        make(f"hold-{i}")
    for i in range(len(CARDS)):
        running(kube, ns, f"hold-{i}")
    for i in range(rounds):
        make(f"next-{i}")
        time.sleep(1.05)  # an unambiguous line order
    live = [f"hold-{i}" for i in range(len(CARDS))]
    samples: list[float] = []
    for i in range(rounds):
        victim = live.pop(0)
        state = limiter_state(agent, kube.get_pod(ns, victim) or {"metadata": {"uid": "?"}})
        assert state.is_dir(), f"{victim} has no limiter state directory"
        spec = None
        if how == "dra":
            spec = node.cdi_dir / f"gpuslice.io-slice_claim-{_claim_uid(kube, ns, victim)}.json"
        started = time.monotonic()
        h.delete_now(kube, ns, victim)
        if how == "dra":
            release_claim(kube, ns, victim)
        p = running(kube, ns, f"next-{i}", 120)
        samples.append(time.monotonic() - started)
        assert_handed(node, agent, p)
        if spec is not None:
            wait_for(lambda s=spec: not s.exists(), 30, what=f"the claim of {victim} unprepared")
        wait_for(lambda d=state: not d.exists(), 30, what=f"the limiter state of {victim} removed")
        live.append(f"next-{i}")
    samples.sort()
    p99 = samples[min(len(samples) - 1, round(0.99 * (len(samples) - 1)))]
    note(f"delete_to_running_s_{how}", {"samples": [round(x, 2) for x in samples],
                                        "p50": round(statistics.median(samples), 2), "p99": round(p99, 2), "n": rounds})


# ---- 5 ---------------------------------------------------------------------------------------------

def test_withdrawn_card_gets_nothing_new(gs: h.Gpuslice, node: RealNode, agent: Agent, ns: str) -> None:
    kube = gs.kube
    lost = CARDS[0]["uuid"]
    agent.set_lost(lost)
    try:
        wait_for(lambda: any(c["uuid"] == lost and not c["healthy"] for c in _inventory(kube) or []), 30,
                 what="the card withdrawn from the inventory")
        wait_for(lambda: _slice_tokens(kube) == 2 * 7, 30, what="the ResourceSlice without the card's tokens")
        # two healthy cards left: a quarter (DRA) on one, a whole card on the other, and a second
        # whole card that only the withdrawn card could hold
        claim(kube, ns, "after-claim", "v100-25")
        h.create_pod(kube, ns, pod("after-dra", "v100-25", "dra", claim="after-claim"))
        running(kube, ns, "after-dra", 90)
        for name in ("after-0", "after-1"):
            h.create_pod(kube, ns, pod(name, "v100-100", "resource"))
            time.sleep(1.05)
        running(kube, ns, "after-0", 90)
        time.sleep(5)  # the queue and the scheduler have had every chance to place after-1
        names = ("after-dra", "after-0", "after-1")
        records = {n: h.record(kube.get_pod(ns, n) or {}) for n in names}
        on_lost = [n for n, r in records.items() if r is not None and lost in r.gpus]
        assert not on_lost, f"{on_lost} placed on the withdrawn card {lost} (records: {records})"
        placed = [assert_handed(node, agent, running(kube, ns, n, 30)) for n in ("after-dra", "after-0")]
        assert records["after-1"] is None, "a whole card placed with no healthy card free"
        note("withdrawn_card", {"placed": [r.gpus for r in placed], "after-1": "Pending"})
    finally:
        agent.set_lost(lost, False)
        wait_for(lambda: all(c["healthy"] for c in _inventory(kube) or [{}]), 30, what="the card back")


def _slice_tokens(kube: Kube) -> int:
    try:
        s = kube.request("GET", f"/apis/resource.k8s.io/v1/resourceslices/{NODE}-gpuslice.io")
    except KubeError:
        return -1
    return len(s["spec"]["devices"])


# ---- the device plugin hand-off's race margin (from the three components' own logs) ---------------

def _stamp(text: str, fmt: str) -> float:
    t = time.strptime(text.split(".")[0].split(",")[0], fmt)
    frac = re.split(r"[.,]", text)[1] if re.search(r"[.,]", text) else "0"
    return t.tm_hour * 3600 + t.tm_min * 60 + t.tm_sec + float("0." + frac)


def test_device_plugin_handoff_margin(node: RealNode, agent: Agent) -> None:
    """Allocate -> spec written, spec written -> the runtime creating the container, per pod, and
    the PreStartContainer barrier (the kubelet waits for it before it creates a container)."""
    need: dict[str, float] = {}
    for line in node.kubelet_log.read_text(errors="replace").splitlines():
        m = re.match(r"I\d{4} (\d\d:\d\d:\d\d\.\d+)", line)
        u = re.search(r'"Need devices to allocate for pod".*podUID="([0-9a-f-]+)"', line)
        if m and u:
            need.setdefault(u.group(1), _stamp(m.group(1), "%H:%M:%S"))
    written: dict[str, float] = {}
    for line in agent.log.read_text(errors="replace").splitlines():
        m = re.match(r"\S+ (\d\d:\d\d:\d\d,\d+) INFO .*token \S+ -> pod \S+ \(([0-9a-f-]+)\)", line)
        if m:
            written.setdefault(m.group(2), _stamp(m.group(1), "%H:%M:%S"))
    sandbox_uid: dict[str, str] = {}
    created: dict[str, float] = {}
    failed = 0
    for line in node.containerd_log.read_text(errors="replace").splitlines():
        sb = re.search(r'RunPodSandbox for .*?uid:\\"([0-9a-f-]+)\\".*returns sandbox id \\"([0-9a-f]+)\\"', line)
        if sb:
            sandbox_uid[sb.group(2)] = sb.group(1)
        cc = re.search(r'time="[\d-]+T(\d\d:\d\d:\d\d\.\d+)Z".*msg="CreateContainer within sandbox '
                       r'\\"([0-9a-f]+)\\" for container', line)
        if cc and cc.group(2) in sandbox_uid:
            created.setdefault(sandbox_uid[cc.group(2)], _stamp(cc.group(1), "%H:%M:%S"))
        failed += "CDI device injection failed" in line
    barrier = [float(m.group(1)) for m in re.finditer(r"PreStartContainer \S+: ready after (\d+) ms",
                                                       agent.log.read_text(errors="replace"))]
    assert barrier, "the kubelet never called PreStartContainer (pre_start_required was ignored)"
    to_spec = sorted(written[u] - need[u] for u in need if u in written)
    margin = sorted(created[u] - written[u] for u in written if u in created)
    assert to_spec, "no device plugin hand-off was seen in the logs"
    note("device_plugin_handoff_ms", {
        "pods": len(to_spec),
        "allocate_to_spec_p50": round(1000 * statistics.median(to_spec)),
        "allocate_to_spec_max": round(1000 * max(to_spec)),
        "spec_to_container_create_min": round(1000 * min(margin)) if margin else None,
        "containers_created_before_their_spec": failed,
        "prestart_calls": len(barrier), "prestart_wait_max": max(barrier)})


# ---- 6 ---------------------------------------------------------------------------------------------

def test_a_pod_group_of_two_slice_pods_starts_together_on_the_real_kubelet(gs: h.Gpuslice, node: RealNode,
                                                                          agent: Agent, ns: str) -> None:
    kube = gs.kube

    def member(name: str) -> dict[str, Any]:
        p = pod(name, "v100-50", "resource")
        p["metadata"]["labels"] = {"gpuslice.io/pod-group": "pair"}
        p["metadata"]["annotations"] = {"gpuslice.io/pod-group-size": "2"}
        return p

    h.create_pod(kube, ns, member("pair-0"))

    def told() -> dict[str, Any] | None:
        c = h.queued(kube.get_pod(ns, "pair-0") or {})
        return c if c is not None and c.get("reason") == "WaitingForMembers" else None

    waiting = wait_for(told, 30, interval=0.2, what="pair-0 to wait for its partner")
    assert "1 of 2 members present" in waiting["message"]
    alone = kube.get_pod(ns, "pair-0")
    assert alone is not None and h.is_gated(alone) and not h.node_of(alone)
    created = time.monotonic()
    h.create_pod(kube, ns, member("pair-1"))
    first, second = running(kube, ns, "pair-0", 120), running(kube, ns, "pair-1", 120)
    note("pod_group_running_after_s", round(time.monotonic() - created, 2))
    scheduled = [next(c["lastTransitionTime"] for c in p["status"]["conditions"] if c["type"] == "PodScheduled")
                 for p in (first, second)]
    assert scheduled[0] == scheduled[1] or abs(
        time.mktime(time.strptime(scheduled[0], "%Y-%m-%dT%H:%M:%SZ"))
        - time.mktime(time.strptime(scheduled[1], "%Y-%m-%dT%H:%M:%SZ"))) <= 2, scheduled
    records = [assert_handed(node, agent, p) for p in (first, second)]
    assert all(r.product == "v100-50" for r in records)
    note("pod_group", {"gpus": [r.gpus for r in records], "scheduled": scheduled})
