"""Fixtures of the real-node suite (``make e2e-node``): control plane, gpuslice, a real node, the agent.

Everything is real: etcd, kube-apiserver, kube-scheduler with the gpuslice extender under gunicorn
(``tests/e2e/gpuslice_harness.py``), a kubelet on containerd + runc (``node.py``), and the node
agent as a host process (``gpuslice agent --simulated-gpus``) on the kubelet's own sockets,
authenticated by a ServiceAccount token bound to its pod, under the RBAC and admission policy of
the rendered ``deploy/manifests/gpuslice.yaml``. Only the GPUs are simulated (fixed UUIDs,
pynvml's interface). The agent installs the in-container limiter built here by ``make interposer``
into its own ``--limiter-dir``, as the DaemonSet's agent (``deploy/chart/templates/agent.yaml``)
installs the one its image carries.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from packing.kube.client import Kube, KubeError
from tests.e2e import gpuslice_harness as h
from tests.e2e.cluster import ControlPlane, free_port, tail, wait_for

from .janitor import Record
from .lock import hold
from .node import DEVICE_PLUGINS, IMAGE, RealNode

REPO = Path(__file__).resolve().parents[2]
NODE = "e2e-node"
CARDS = [{"uuid": f"GPU-5e1f0000-0000-4000-8000-00000000000{i}", "name": "Tesla V100-SXM2-32GB",
          "memory_mib": 32768} for i in range(3)]
AGENT_PATHS = {
    "ServiceAccount": "/api/v1/namespaces/{ns}/serviceaccounts",
    "ClusterRole": "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    "ClusterRoleBinding": "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    "ValidatingAdmissionPolicy": "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicies",
    "ValidatingAdmissionPolicyBinding": "/apis/admissionregistration.k8s.io/v1/validatingadmissionpolicybindings",
}


def _binaries() -> tuple[Path, Path]:
    out = subprocess.run(["bash", str(REPO / "deploy" / "e2e" / "build-kube.sh"), "node"], capture_output=True,
                         text=True, timeout=3600)
    if out.returncode != 0:
        pytest.fail(f"build-kube.sh node failed:\n{out.stderr[-4000:]}", pytrace=False)
    lines = out.stdout.strip().splitlines()
    return Path(lines[-2]), Path(lines[-1])


@pytest.fixture(scope="session")
def bins() -> Iterator[tuple[Path, Path]]:
    if os.geteuid() != 0:
        pytest.fail("the real-node suite needs root (a kubelet and a container runtime)", pytrace=False)
    found = _binaries()
    lock = hold("e2e-node")  # one real node per machine: the kubelet's device-plugin directory is fixed
    try:
        yield found
    finally:
        if lock is not None:
            lock.close()


@pytest.fixture(scope="session")
def limiter_library() -> Path:
    """``libgpuslice-limiter.so`` from ``make interposer`` (its last line is the library's path)."""
    out = subprocess.run(["make", "-s", "-C", str(REPO), "interposer"], capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        pytest.fail(f"make interposer failed:\n{out.stderr[-4000:]}", pytrace=False)
    return Path(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def cp(bins: tuple[Path, Path]) -> Iterator[ControlPlane]:
    plane = ControlPlane(bins[0])
    record = Record("e2e-node control plane")  # its temp dir, should this run be killed
    record.add("roots", plane.work_dir)
    try:
        plane.start()
    except Exception as e:
        logs = plane.logs_tail(60)
        plane.stop()
        record.close()
        pytest.fail(f"control plane did not start: {e}\n{logs}", pytrace=False)
    yield plane
    plane.stop()
    record.close()


@pytest.fixture(scope="session")
def gs(cp: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[h.Gpuslice]:
    g = h.install(cp, tmp_path_factory.mktemp("gpuslice"))
    yield g
    g.stop()


@pytest.fixture(scope="session")
def node(cp: ControlPlane, gs: h.Gpuslice, bins: tuple[Path, Path]) -> Iterator[RealNode]:
    n = RealNode(cp, bins[0], bins[1], NODE)
    try:
        n.start()
        wait_for(lambda: n.kubelet_alive() and gs.kube.get(f"/api/v1/nodes/{NODE}"), 90, what="the kubelet's Node")
    except Exception as e:
        logs = n.logs()
        n.stop()
        pytest.fail(f"the real node did not start: {e}\n{logs}", pytrace=False)
    yield n
    n.stop()


@dataclass
class Agent:
    """The node agent as a host process on the real node's sockets."""

    argv: list[str]
    env: dict[str, str]
    log: Path
    cards: Path
    port: int
    limiter_dir: Path
    process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as f:
            f.write(f"\n==== {time.strftime('%H:%M:%S')} starting agent\n".encode())
            self.process = subprocess.Popen(self.argv, env=self.env, stdout=f, stderr=subprocess.STDOUT, cwd=REPO,
                                            start_new_session=True)

    def stop(self, kill: bool = False) -> None:
        if self.process is not None and self.process.poll() is None:
            if kill:
                self.process.kill()
            else:
                self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.process = None

    def restart(self, kill: bool = True) -> None:
        self.stop(kill)
        self.start()

    def set_lost(self, uuid: str, lost: bool = True) -> None:
        cards = json.loads(self.cards.read_text())
        for c in cards:
            if c["uuid"] == uuid:
                c["lost"] = lost
        tmp = self.cards.with_suffix(".tmp")
        tmp.write_text(json.dumps(cards))
        tmp.replace(self.cards)

    def tail(self, lines: int = 60) -> str:
        return tail(self.log, lines)


def _apply_agent_rbac(kube: Kube) -> None:
    docs = [d for d in yaml.safe_load_all((REPO / "deploy" / "manifests" / "gpuslice.yaml").read_text()) if d]
    for obj in docs:
        path = AGENT_PATHS.get(obj["kind"])
        if path is None or not obj["metadata"]["name"].startswith("gpuslice-agent"):
            continue
        base = path.format(ns=obj["metadata"].get("namespace", "default"))
        try:
            kube.request("POST", base, obj)
        except KubeError as e:
            if e.status != 409:
                raise


def _agent_token(kube: Kube, pod: dict[str, Any]) -> str:
    """A ServiceAccount token bound to the agent's pod: it carries the node name the policy checks."""
    meta = pod["metadata"]
    req = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
           "spec": {"expirationSeconds": 7200,
                    "boundObjectRef": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"]}}}
    out = kube.request("POST", f"/api/v1/namespaces/{h.SYSTEM_NS}/serviceaccounts/gpuslice-agent/token", req)
    return str(out["status"]["token"])


@pytest.fixture(scope="session")
def agent(cp: ControlPlane, gs: h.Gpuslice, node: RealNode, limiter_library: Path,
          tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agent]:
    kube = gs.kube
    _apply_agent_rbac(kube)
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": f"gpuslice-agent-{NODE}", "namespace": h.SYSTEM_NS},
           "spec": {"nodeName": NODE, "serviceAccountName": "gpuslice-agent", "hostNetwork": True,
                    "automountServiceAccountToken": False, "terminationGracePeriodSeconds": 1,
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [{"name": "stand-in", "image": IMAGE, "imagePullPolicy": "Never",
                                    "command": ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"]}]}}
    try:
        created = kube.request("POST", f"/api/v1/namespaces/{h.SYSTEM_NS}/pods", pod)
    except KubeError as e:
        if e.status != 409:
            raise
        created = kube.request("GET", f"/api/v1/namespaces/{h.SYSTEM_NS}/pods/{pod['metadata']['name']}")
    work = tmp_path_factory.mktemp("agent")
    kubeconfig = work / "agent.kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config",
        "clusters": [{"name": "e2e", "cluster": {"server": cp.server, "certificate-authority": str(cp.ca_cert)}}],
        "users": [{"name": "agent", "user": {"token": _agent_token(kube, created)}}],
        "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": "agent"}}], "current-context": "e2e"}))
    cards = work / "cards.json"
    cards.write_text(json.dumps(CARDS))
    port = free_port()
    argv = [sys.executable, "-m", "packing.cli", "agent", "--node-name", NODE, "--kubeconfig", str(kubeconfig),
            "--simulated-gpus", str(cards), "--kubelet-dir", str(node.kubelet_dir),
            "--device-plugin-dir", str(DEVICE_PLUGINS), "--nri-socket", str(node.nri_socket),
            "--cdi-dir", str(node.cdi_dir),
            "--state-dir", str(work / "state"), "--runtime-dir", str(work / "run"), "--listen", f"127.0.0.1:{port}",
            "--limiter-dir", str(work / "limiter"), "--limiter-source", str(limiter_library),
            "--inventory-every", "0.5", "--slice-resync", "1", "--no-pacing", "--log-level", "INFO"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSLICE_AGENT_")}
    env.update({"PYTHONPATH": str(REPO), "HOME": str(work)})
    a = Agent(argv, env, work / "agent.log", cards, port, work / "limiter")
    a.start()
    try:
        wait_for(lambda: _inventory(kube) is not None, 60, what="the agent's inventory on the Node")
        wait_for(lambda: NODE in {n["name"] for n in gs.extender.state()["nodes"]}, 60, what="the node in the ledger")
        # the kubelet admits a pod asking for a resource it does not know yet as if it had not asked
        wait_for(lambda: _capacity(kube).get("gpuslice.io/v100-25") == str(4 * len(CARDS)), 60,
                 what="the device plugins registered")
    except Exception as e:
        out = a.tail()
        a.stop()
        pytest.fail(f"agent did not come up: {e}\n{out}\n{node.logs()}", pytrace=False)
    yield a
    a.stop()


def _capacity(kube: Kube) -> dict[str, str]:
    n = kube.get(f"/api/v1/nodes/{NODE}") or {}
    return dict((n.get("status") or {}).get("capacity") or {})


def _inventory(kube: Kube) -> list[dict[str, Any]] | None:
    n = kube.get(f"/api/v1/nodes/{NODE}") or {}
    value = ((n.get("metadata") or {}).get("annotations") or {}).get("gpuslice.io/inventory")
    return json.loads(value) if value else None
