"""gpuslice on the e2e control plane: the extender under gunicorn (mutual TLS), its webhook, its scheduler.

Everything is real: the extender runs the very command of ``deploy/extender.yaml`` (``gpuslice serve
--cluster`` with its serving certificate, the client CA, ``--require-client-cert`` and the allowed
client subject), only with loopback addresses and the test's certificate files, under its own
client-certificate identity bound to the RBAC in ``deploy/rbac.yaml``; kube-apiserver calls its
mutating webhook (``deploy/webhook.yaml``) over TLS; kube-scheduler runs with
``deploy/scheduler-config-cluster.yaml``, presenting its client certificate (``tlsConfig``). There
is no kubelet and no controller manager, so the tests stand in for them: nodes carry GFD labels,
pods are deleted with grace period 0, and a DRA pod's ResourceClaim is created from its template by
the test (what the resourceclaim controller would do).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from extender.cluster.kube import MERGE_PATCH, Kube, KubeError, q
from extender.cluster.pending_writer import CONDITION
from extender.cluster.webhook import GATE
from packing.record import ANNOTATION, AllocationRecord, decode

from .cluster import ControlPlane, free_port, tail, wait_for

REPO_ROOT = Path(__file__).resolve().parents[2]
DEPLOY = REPO_ROOT / "deploy"
SYSTEM_NS = "gpuslice-system"
SCHEDULER_NAME = "gpuslice-scheduler"
EXTENDER_USER = "gpuslice-extender"
V100 = "Tesla-V100-SXM2-32GB"
IMAGE = "registry.invalid/never-pulled:1"

Obj = dict[str, Any]

# where each kind lives in the API (the few kinds the deploy files and the tests use)
_PATHS = {
    ("v1", "Namespace"): "/api/v1/namespaces",
    ("v1", "ServiceAccount"): "/api/v1/namespaces/{ns}/serviceaccounts",
    ("v1", "ConfigMap"): "/api/v1/namespaces/{ns}/configmaps",
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): "/apis/rbac.authorization.k8s.io/v1/clusterroles",
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
    ("rbac.authorization.k8s.io/v1", "Role"): "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/roles",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "/apis/rbac.authorization.k8s.io/v1/namespaces/{ns}/rolebindings",
    ("admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration"):
        "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations",
    ("resource.k8s.io/v1", "DeviceClass"): "/apis/resource.k8s.io/v1/deviceclasses",
    ("resource.k8s.io/v1", "ResourceSlice"): "/apis/resource.k8s.io/v1/resourceslices",
    ("resource.k8s.io/v1", "ResourceClaimTemplate"): "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaimtemplates",
    ("resource.k8s.io/v1", "ResourceClaim"): "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims",
}


def load_yaml(name: str) -> list[Obj]:
    """The objects of a file in ``deploy/``."""
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


def collection(obj: Mapping[str, Any]) -> str:
    path = _PATHS[(obj["apiVersion"], obj["kind"])]
    return path.format(ns=q((obj.get("metadata") or {}).get("namespace") or "default"))


def apply(kube: Kube, obj: Obj) -> Obj:
    """Create ``obj``, or replace it when it exists (tests re-run against one session's API server)."""
    base = collection(obj)
    try:
        return kube.request("POST", base, obj)
    except KubeError as e:
        if e.status != 409:
            raise
    path = f"{base}/{q(obj['metadata']['name'])}"
    current = kube.request("GET", path)
    obj = {**obj, "metadata": {**obj["metadata"], "resourceVersion": current["metadata"]["resourceVersion"]}}
    return kube.request("PUT", path, obj)


SCHEDULER_SUBJECT = "gpuslice-scheduler"  # the client subject deploy/extender.yaml allows


@dataclass(frozen=True)
class Tls:
    """The e2e PKI: one CA, the extender's serving certificate, and client certificates (cert, key)."""

    ca: Path
    cert: Path
    key: Path
    scheduler: tuple[Path, Path]  # CN=gpuslice-scheduler: what kube-scheduler presents
    other: tuple[Path, Path]  # CN=someone-else, same CA: verified, but not on the allow-list
    foreign: tuple[Path, Path]  # CN=gpuslice-scheduler from another CA: fails the handshake


def make_tls(directory: Path) -> Tls:
    """A CA, a serving certificate for 127.0.0.1, and the client certificates the tests present."""
    directory.mkdir(parents=True, exist_ok=True)

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    def ca(name: str) -> None:
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.crt",
                "-days", "2", "-subj", f"/CN=gpuslice-e2e-{name}", "-addext", "basicConstraints=critical,CA:TRUE",
                "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature")

    def leaf(name: str, subject: str, signer: str, usage: str, san: str = "") -> tuple[Path, Path]:
        (directory / f"{name}.ext").write_text("basicConstraints=critical,CA:FALSE\nkeyUsage=critical,"
                                               f"digitalSignature,keyEncipherment\nextendedKeyUsage={usage}\n"
                                               + (f"subjectAltName={san}\n" if san else ""))
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                "-subj", subject)
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{signer}.crt", "-CAkey", f"{signer}.key",
                "-CAcreateserial", "-days", "2", "-sha256", "-extfile", f"{name}.ext", "-out", f"{name}.crt")
        return directory / f"{name}.crt", directory / f"{name}.key"

    ca("ca")
    ca("other-ca")
    cert, key = leaf("tls", "/CN=127.0.0.1", "ca", "serverAuth", "IP:127.0.0.1,DNS:localhost")
    return Tls(directory / "ca.crt", cert, key,
               scheduler=leaf("scheduler", f"/CN={SCHEDULER_SUBJECT}", "ca", "clientAuth"),
               other=leaf("other", "/CN=someone-else", "ca", "clientAuth"),
               foreign=leaf("foreign", f"/CN={SCHEDULER_SUBJECT}", "other-ca", "clientAuth"))


def extender_command(port: int, tls: Tls) -> list[str]:
    """The extender's command from deploy/extender.yaml, with loopback addresses and the test's files."""
    deployment = next(d for d in load_yaml("extender.yaml") if d["kind"] == "Deployment")
    command = list(deployment["spec"]["template"]["spec"]["containers"][0]["command"])
    files = {"/etc/gpuslice/tls/tls.crt": tls.cert, "/etc/gpuslice/tls/tls.key": tls.key,
             "/etc/gpuslice/tls/ca.crt": tls.ca}
    out = [sys.executable, "-m", "packing.cli"]
    words = iter(command[1:])
    for word in words:
        if word in ("--host", "--port"):
            out += [word, "127.0.0.1" if word == "--host" else str(port)]
            next(words)
        else:
            out.append(str(files.get(word, word)))
    return [*out, "--threads", "8"]


@dataclass
class Extender:
    """One extender replica: gunicorn in its own session, ended by PID (SIGKILL for a crash)."""

    port: int
    identity: str
    env: dict[str, str]
    tls: Tls
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> None:
        # the command of deploy/extender.yaml; cluster settings come from GPUSLICE_* variables
        argv = extender_command(self.port, self.tls)
        env = {**os.environ, **self.env, "PYTHONPATH": str(REPO_ROOT)}
        with open(self.log_path, "ab") as log:
            log.write(f"\n==== {time.strftime('%H:%M:%S')} starting {self.identity} on {self.port}\n".encode())
            self.process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT,
                                            start_new_session=True)
        self.started_at = time.monotonic()

    def kill(self) -> None:
        """SIGKILL the whole process group (master and worker): a crash, nothing cleaned up."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()

    def _context(self, cert: tuple[Path, Path] | None = None) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.tls.ca))
        if cert is not None:
            context.load_cert_chain(str(cert[0]), str(cert[1]))
        return context

    def get(self, path: str) -> tuple[int, Any]:
        """GET over loopback without a client certificate (what the operator routes allow)."""
        return self.call("GET", path)

    def call(self, method: str, path: str, doc: Any = None, cert: tuple[Path, Path] | None = None) -> tuple[int, Any]:
        """One HTTPS request, presenting ``cert`` (or no client certificate)."""
        data = None if doc is None else json.dumps(doc).encode()
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=5, context=self._context(cert)) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null")

    def ready(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(f"extender {self.identity} exited with {self.process.returncode}:\n{self.log_tail()}")
        try:
            return self.get("/readyz")[0] == 200
        except (urllib.error.URLError, OSError):
            return False

    def answers(self) -> bool:
        try:
            self.get("/healthz")
            return True
        except (urllib.error.URLError, OSError):
            return False

    def wait_ready(self, timeout: float = 60.0) -> float:
        """Wait until ``/readyz`` answers 200; seconds since ``start``."""
        wait_for(self.ready, timeout, interval=0.1, what=f"extender {self.identity} to be ready")
        return time.monotonic() - self.started_at

    def state(self) -> Obj:
        status, doc = self.get("/state")
        assert status == 200, doc
        assert isinstance(doc, dict)
        return doc

    def metrics(self) -> str:
        with urllib.request.urlopen(self.url + "/metrics", timeout=5, context=self._context()) as resp:
            text: str = resp.read().decode()
            return text

    def log_tail(self, lines: int = 60) -> str:
        return tail(self.log_path, lines)


@dataclass
class Gpuslice:
    """The extender(s), the webhook and the gpuslice kube-scheduler on one control plane."""

    cp: ControlPlane
    work: Path
    kube: Kube
    tls: Tls
    kubeconfig: Path
    extenders: list[Extender] = field(default_factory=list)

    @property
    def extender(self) -> Extender:
        return self.extenders[0]

    def new_extender(self, identity: str, port: int | None = None, **settings: str) -> Extender:
        env = {
            "GPUSLICE_KUBECONFIG": str(self.kubeconfig),
            "GPUSLICE_NAMESPACE": SYSTEM_NS,
            "GPUSLICE_IDENTITY": identity,
            "GPUSLICE_LEASE_DURATION_S": "6",
            "GPUSLICE_RENEW_DEADLINE_S": "4",
            "GPUSLICE_RETRY_PERIOD_S": "1",
            "GPUSLICE_RESYNC_S": "15",
            "GPUSLICE_TICK_S": "0.5",
            "GPUSLICE_NOTICE_INTERVAL_S": "2",
            "GPUSLICE_SCHEDULER_NAME": SCHEDULER_NAME,
            "GPUSLICE_LOG_LEVEL": "info",
        }
        env.update({f"GPUSLICE_{k.upper()}": v for k, v in settings.items()})
        port = port or free_port()
        ext = Extender(port, identity, env, self.tls, self.work / f"extender-{identity}.log")
        self.extenders.append(ext)
        return ext

    def logs(self) -> str:
        parts = [f"---- extender {e.identity} ----\n{e.log_tail(80)}" for e in self.extenders]
        return "\n".join(parts) + "\n" + self.cp.logs_tail(40)

    def stop(self) -> None:
        for e in self.extenders:
            e.stop()
        self.cp.stop_scheduler()
        with contextlib.suppress(KubeError):
            self.kube.request("DELETE", "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/gpuslice")


def install(cp: ControlPlane, work: Path) -> Gpuslice:
    """RBAC, DeviceClasses, TLS, one extender (started, ready), the webhook, and the scheduler."""
    kube = Kube(cp.api_client())
    for obj in load_yaml("rbac.yaml"):
        if obj["kind"] in ("ClusterRoleBinding", "RoleBinding"):
            obj["subjects"] = [{"kind": "User", "name": EXTENDER_USER, "apiGroup": "rbac.authorization.k8s.io"}]
        if obj["kind"] != "ServiceAccount":
            apply(kube, obj)
    for obj in load_yaml("deviceclasses.yaml"):
        apply(kube, obj)
    tls = make_tls(work / "tls")
    g = Gpuslice(cp, work, kube, tls, cp.user_kubeconfig(EXTENDER_USER))
    ext = g.new_extender("e2e-replica-a")
    ext.start()
    ext.wait_ready(90)
    webhook = load_yaml("webhook.yaml")[0]
    ca_bundle = base64.b64encode(tls.ca.read_bytes()).decode()
    webhook["webhooks"][0]["clientConfig"] = {"url": f"{ext.url}/mutate", "caBundle": ca_bundle}
    apply(kube, webhook)
    config = load_yaml("scheduler-config-cluster.yaml")[0]
    config["clientConnection"] = {"kubeconfig": str(cp.scheduler_kubeconfig)}
    config["leaderElection"] = {"leaderElect": False}
    extender = config["extenders"][0]
    extender["urlPrefix"] = ext.url
    # the file's tlsConfig, with the test's files: kube-scheduler presents its client certificate
    files = {"caFile": tls.ca, "certFile": tls.scheduler[0], "keyFile": tls.scheduler[1]}
    assert set(extender["tlsConfig"]) == set(files), extender["tlsConfig"]
    extender["tlsConfig"] = {k: str(v) for k, v in files.items()}
    path = work / "gpuslice-scheduler.yaml"
    path.write_text(yaml.safe_dump(config))
    cp.start_scheduler(path)
    return g


# ---- objects -------------------------------------------------------------------------------------

def gpu_node(kube: Kube, api: Any, name: str, gpus: int, labels: Mapping[str, str] | None = None) -> None:
    """A Ready node with ``gpus`` V100-32GB cards as GPU Feature Discovery labels them."""
    from .cluster import create_ready_node

    create_ready_node(api, name, labels={
        "nvidia.com/gpu.product": V100, "nvidia.com/gpu.count": str(gpus), "nvidia.com/gpu.memory": "32768",
        **(labels or {}),
    })


def resource_slice(node: str, tokens: int = 16) -> Obj:
    """A ResourceSlice of driver gpuslice.io with ``tokens`` token devices per product on ``node``."""
    devices = [{"name": f"{product}-{i}", "attributes": {"product": {"string": product}}}
               for product in ("v100-25", "v100-50", "v100-100") for i in range(tokens)]
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-gpuslice"},
        "spec": {"driver": "gpuslice.io", "nodeName": node,
                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}, "devices": devices},
    }


def slice_pod(name: str, product: str | None = None, *, annotation: str | None = None,
              claim_template: str | None = None, labels: Mapping[str, str] | None = None) -> Obj:
    """A pod asking for ``product`` by extended resource (or by annotation, or by a DRA claim template)."""
    container: Obj = {"name": "main", "image": IMAGE, "resources": {"requests": {"cpu": "10m"}}}
    if product is not None:
        container["resources"] = {"requests": {"cpu": "10m", f"gpuslice.io/{product}": "1"},
                                  "limits": {f"gpuslice.io/{product}": "1"}}
    meta: Obj = {"name": name, "labels": dict(labels or {})}
    spec: Obj = {"containers": [container], "terminationGracePeriodSeconds": 0}
    if annotation is not None:
        meta["annotations"] = {"gpuslice.io/product": annotation}
    if claim_template is not None:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": claim_template}]
        container["resources"]["claims"] = [{"name": "gpu"}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def create_pod(kube: Kube, namespace: str, pod: Obj) -> Obj:
    return kube.request("POST", f"/api/v1/namespaces/{q(namespace)}/pods", pod)


def stand_in_claim_controller(kube: Kube, namespace: str, pod: Obj, template: Obj) -> str:
    """What kube-controller-manager's resourceclaim controller does for a pod's template claim:
    create the ResourceClaim owned by the pod, and name it in the pod's status."""
    meta = pod["metadata"]
    claim_name = f"{meta['name']}-gpu-{uuid.uuid4().hex[:5]}"
    claim = {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": claim_name, "namespace": namespace,
                     "annotations": {"resource.kubernetes.io/pod-claim-name": "gpu"},
                     "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": meta["name"], "uid": meta["uid"],
                                          "controller": True, "blockOwnerDeletion": True}]},
        "spec": template["spec"]["spec"],
    }
    kube.request("POST", collection(claim), claim)
    kube.patch_pod_status(namespace, meta["name"], {"status": {"resourceClaimStatuses": [
        {"name": "gpu", "resourceClaimName": claim_name}]}}, MERGE_PATCH)
    return claim_name


def pods(kube: Kube, namespace: str) -> list[Obj]:
    return list(kube.request("GET", f"/api/v1/namespaces/{q(namespace)}/pods").get("items") or [])


def node_of(pod: Mapping[str, Any]) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")


def record(pod: Mapping[str, Any]) -> AllocationRecord | None:
    value = ((pod.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION)
    return decode(value) if value else None


def queued(pod: Mapping[str, Any]) -> Obj | None:
    """The pod's gpuslice.io/Queued condition."""
    for c in (pod.get("status") or {}).get("conditions") or []:
        if c.get("type") == CONDITION:
            return dict(c)
    return None


def is_gated(pod: Mapping[str, Any]) -> bool:
    return any(g.get("name") == GATE for g in (pod.get("spec") or {}).get("schedulingGates") or [])


def events_of(kube: Kube, namespace: str, name: str) -> list[Obj]:
    items = kube.request("GET", f"/api/v1/namespaces/{q(namespace)}/events",
                         query={"fieldSelector": f"involvedObject.name={name}"}).get("items") or []
    return [e for e in items if (e.get("source") or {}).get("component") == "gpuslice"]


def wait_bound(kube: Kube, namespace: str, name: str, timeout: float = 30.0, interval: float = 0.02) -> Obj:
    """Wait until the pod has a node; the pod."""
    def bound() -> Obj | None:
        pod = kube.get_pod(namespace, name)
        return pod if pod is not None and node_of(pod) else None

    return wait_for(bound, timeout, interval=interval, what=f"pod {namespace}/{name} to be bound")


def delete_now(kube: Kube, namespace: str, name: str) -> None:
    try:
        kube.request("DELETE", f"/api/v1/namespaces/{q(namespace)}/pods/{q(name)}",
                     {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": 0})
    except KubeError as e:
        if e.status != 404:
            raise


def delete_nodes(kube: Kube, names: Iterable[str]) -> None:
    for name in names:
        for path in (f"/api/v1/nodes/{q(name)}", f"/apis/resource.k8s.io/v1/resourceslices/{q(name)}-gpuslice"):
            try:
                kube.request("DELETE", path)
            except KubeError as e:
                if e.status != 404:
                    raise


def clear_namespace(kube: Kube, namespace: str) -> None:
    for pod in pods(kube, namespace):
        delete_now(kube, namespace, pod["metadata"]["name"])


def gpu_usage(bound: Iterable[Mapping[str, Any]]) -> dict[str, list[int]]:
    """GPU uuid -> [milli, MiB] used, recounted from the allocation records of bound pods."""
    used: dict[str, list[int]] = {}
    for pod in bound:
        r = record(pod)
        assert r is not None, f"bound pod {pod['metadata']['name']} has no allocation record"
        for gpu in r.gpus:
            slot = used.setdefault(gpu, [0, 0])
            slot[0] += r.milli
            slot[1] += r.memory_mib
    return used


def ledger_view(state: Mapping[str, Any]) -> dict[str, tuple[str, tuple[str, ...]]]:
    """pod uid -> (node, GPUs) of the extender's bound allocations."""
    return {a["pod_uid"]: (a["node"], tuple(a["gpus"])) for a in state["allocations"] if a["state"] == "bound"}


def recount(items: Iterable[Mapping[str, Any]]) -> dict[str, tuple[str, tuple[str, ...]]]:
    """pod uid -> (node, GPUs) recounted from the API: bound, unfinished pods with a record."""
    out: dict[str, tuple[str, tuple[str, ...]]] = {}
    for pod in items:
        r = record(pod)
        if node_of(pod) and r is not None and (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
            out[pod["metadata"]["uid"]] = (node_of(pod), r.gpus)
    return out


def poll(check: Callable[[], Any], timeout: float, what: str, interval: float = 0.25) -> Any:
    return wait_for(check, timeout, interval=interval, what=what)
