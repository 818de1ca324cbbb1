"""gpuslice on the e2e control plane, installed from the rendered manifests (``deploy/manifests/``).

Everything is real: ``gpuslice certs`` makes the CA and both certificates in their Secrets and sets
the webhook's caBundle, under the chart's RBAC for it; the extender runs the very command and
environment of the rendered Deployment (``gpuslice serve --cluster`` with the serving certificate,
the client CA, ``--require-client-cert``, the allowed client subject, the catalog, mode and policy),
only with a loopback address and the Secrets' contents as files, under its own client-certificate
identity bound to the rendered ClusterRole and Role; kube-apiserver calls its mutating webhook
(rendered) over TLS and enforces the rendered admission policies; kube-scheduler runs with the
rendered KubeSchedulerConfiguration, presenting its client certificate (``tlsConfig``). There is no
kubelet and no controller manager, so the tests stand in for them: nodes carry GFD labels, pods are
deleted with grace period 0, each extender replica's pod is a stand-in object (the leader labels
it), and a DRA pod's ResourceClaim is created from its template by the test (what the
resourceclaim controller would do).
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
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from extender.certs.pki import KeyPair, issue, new_ca
from extender.certs.plan import CA_SECRET, CLIENT_SECRET, SERVING_SECRET
from extender.cluster.pending_writer import CONDITION
from packing.gate import gated
from packing.kube.client import MERGE_PATCH, Kube, KubeError, q
from packing.record import ANNOTATION, AllocationRecord, decode

from . import manifests
from .cluster import ControlPlane, free_port, tail, wait_for
from .manifests import Resources

REPO_ROOT = Path(__file__).resolve().parents[2]
SYSTEM_NS = "gpuslice-system"
SCHEDULER_NAME = "gpuslice-scheduler"
EXTENDER_USER = "gpuslice-extender"
V100 = "Tesla-V100-SXM2-32GB"
IMAGE = "registry.invalid/never-pulled:1"

Obj = dict[str, Any]

def apply(kube: Kube, obj: Obj) -> Obj:
    """Server-side apply of ``obj`` (tests re-run against one session's API server)."""
    return manifests.apply(kube, resources(kube), obj)


_RESOURCES: dict[int, Resources] = {}


def resources(kube: Kube) -> Resources:
    """The discovery of ``kube``'s API server (one per client)."""
    return _RESOURCES.setdefault(id(kube.api), Resources(kube))


SCHEDULER_SUBJECT = "gpuslice-scheduler"  # the client subject the rendered extender Deployment allows


@dataclass(frozen=True)
class Tls:
    """The Secrets ``gpuslice certs`` made, as files; and two client certificates the tests present."""

    ca: Path  # the trust bundle (ca.crt)
    cert: Path
    key: Path
    scheduler: tuple[Path, Path]  # CN=gpuslice-scheduler: what kube-scheduler presents
    other: tuple[Path, Path]  # CN=someone-else, same CA: verified, but not on the allow-list
    foreign: tuple[Path, Path]  # CN=gpuslice-scheduler from another CA: fails the handshake


def run_certs(kubeconfig: Path, *args: str, home: Path) -> subprocess.CompletedProcess[str]:
    """``gpuslice certs`` as the operator runs it, against the e2e API server."""
    argv = [sys.executable, "-m", "packing.cli", "certs", "--namespace", SYSTEM_NS, "--kubeconfig", str(kubeconfig),
            *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=REPO_ROOT,
                          env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "HOME": str(home)})


def secret_data(kube: Kube, name: str) -> dict[str, bytes]:
    obj = kube.request("GET", f"/api/v1/namespaces/{SYSTEM_NS}/secrets/{q(name)}")
    return {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}


def tls_from_secrets(kube: Kube, directory: Path) -> Tls:
    """The Secrets' contents as the files the pods mount; and the tests' other client certificates."""
    directory.mkdir(parents=True, exist_ok=True)

    def write(name: str, pair: KeyPair) -> tuple[Path, Path]:
        (directory / f"{name}.crt").write_bytes(pair.cert)
        (directory / f"{name}.key").write_bytes(pair.key)
        return directory / f"{name}.crt", directory / f"{name}.key"

    serving = secret_data(kube, SERVING_SECRET)
    client = secret_data(kube, CLIENT_SECRET)
    ca = secret_data(kube, CA_SECRET)
    (directory / "ca.crt").write_bytes(serving["ca.crt"])
    cert, key = write("tls", KeyPair(serving["tls.crt"], serving["tls.key"]))
    now = datetime.now(UTC)
    signer = KeyPair(ca["ca.crt"], ca["ca.key"])
    return Tls(directory / "ca.crt", cert, key,
               scheduler=write("scheduler", KeyPair(client["tls.crt"], client["tls.key"])),
               other=write("other", issue(signer, "someone-else", server=False, days=2, now=now)),
               foreign=write("foreign", issue(new_ca("other-ca", 2, now), SCHEDULER_SUBJECT, server=False,
                                              days=2, now=now)))


def extender_container(root: Path = REPO_ROOT) -> Obj:
    """The extender's container in the rendered Deployment (of the source tree at ``root``)."""
    deployment = manifests.find(manifests.rendered(root=root), "Deployment", "gpuslice-extender")
    container: Obj = deployment["spec"]["template"]["spec"]["containers"][0]
    return container


def extender_command(port: int, tls: Tls, catalog: Path, root: Path = REPO_ROOT,
                     overrides: Mapping[str, str] | None = None, webhook_port: int = 0) -> list[str]:
    """The rendered Deployment's command, with a loopback address, the test's ports (``port``, and
    ``webhook_port`` for a rendered ``--webhook-port``) and files; ``overrides`` replace the value of
    options it has (a benchmark runs another ``--policy``)."""
    command = list(extender_container(root)["command"])
    missing = set(overrides or {}) - set(command)
    assert not missing, f"the rendered command has no {', '.join(sorted(missing))} to override"
    files = {"/etc/gpuslice/tls/tls.crt": tls.cert, "/etc/gpuslice/tls/tls.key": tls.key,
             "/etc/gpuslice/tls/ca.crt": tls.ca, "/etc/gpuslice/catalog/catalog.toml": catalog}
    out = [sys.executable, "-m", "packing.cli"]
    words = iter(command[1:])
    for word in words:
        if word in ("--host", "--port", "--webhook-port"):
            out += [word, {"--host": "127.0.0.1", "--port": str(port), "--webhook-port": str(webhook_port)}[word]]
            next(words)
        elif overrides and word in overrides:
            out += [word, overrides[word]]
            next(words)
        else:
            out.append(str(files.get(word, word)))
    return [*out, "--threads", "8"]


def webhook_apart(root: Path = REPO_ROOT) -> bool:
    """Does the rendered extender (of the tree at ``root``) serve the webhook from a worker of its own?"""
    return "--webhook-port" in extender_container(root)["command"]


def point_webhook(kube: Kube, url: str) -> None:
    """Make kube-apiserver call the webhook at ``url`` (a benchmark switches between source trees)."""
    path = "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/gpuslice"
    kube.request("PATCH", path, [{"op": "replace", "path": "/webhooks/0/clientConfig/url", "value": url}],
                 content_type="application/json-patch+json")


def extender_env() -> dict[str, str]:
    """The rendered Deployment's literal environment (GPUSLICE_*: the leader label, the log level)."""
    return {e["name"]: e["value"] for e in extender_container().get("env") or []
            if "value" in e and e["name"].startswith("GPUSLICE_") and not e["name"].startswith("GPUSLICE_STATUS_")}


@dataclass
class Extender:
    """One extender replica: gunicorn in its own session, ended by PID (SIGKILL for a crash)."""

    port: int
    identity: str
    env: dict[str, str]
    tls: Tls
    catalog: Path
    log_path: Path
    webhook_port: int = 0  # where its webhook worker listens, when its tree's rendered command has --webhook-port
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    root: Path = REPO_ROOT  # the source tree it runs (a benchmark compares two)
    overrides: dict[str, str] = field(default_factory=dict)  # option -> value instead of the rendered one

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def webhook_url(self) -> str:
        """Where kube-apiserver calls its webhook: its webhook worker's port, or its own port when its
        tree serves the webhook there."""
        return f"https://127.0.0.1:{self.webhook_port if webhook_apart(self.root) else self.port}/mutate"

    def start(self) -> None:
        # the rendered Deployment's command; cluster settings come from GPUSLICE_* variables
        argv = extender_command(self.port, self.tls, self.catalog, self.root, self.overrides, self.webhook_port)
        env = {**os.environ, **self.env, "PYTHONPATH": str(self.root), "HOME": str(self.log_path.parent)}
        with open(self.log_path, "ab") as log:
            log.write(f"\n==== {time.strftime('%H:%M:%S')} starting {self.identity} on {self.port}\n".encode())
            self.process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=self.root,
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

    def review(self, pod: Obj) -> tuple[int, Any]:
        """POST an AdmissionReview of ``pod``'s creation to its webhook, as kube-apiserver does (no certificate)."""
        doc = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
               "request": {"uid": str(uuid.uuid4()), "kind": {"group": "", "version": "v1", "kind": "Pod"},
                           "operation": "CREATE", "object": pod}}
        req = urllib.request.Request(self.webhook_url, data=json.dumps(doc).encode(), method="POST",
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=5, context=self._context()) as resp:
            return resp.status, json.loads(resp.read())

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

    def webhook_metrics(self) -> str:
        """Its webhook worker's metrics ("" when its tree serves the webhook in the extender's process)."""
        if not webhook_apart(self.root):
            return ""
        url = f"https://127.0.0.1:{self.webhook_port}/metrics"
        with urllib.request.urlopen(url, timeout=5, context=self._context()) as resp:
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
    catalog: Path
    extenders: list[Extender] = field(default_factory=list)

    @property
    def extender(self) -> Extender:
        return self.extenders[0]

    def new_extender(self, identity: str, port: int | None = None, webhook_port: int | None = None,
                     **settings: str) -> Extender:
        """A replica (not started) with the rendered environment, and its stand-in pod (named by the
        identity, as POD_NAME is in a cluster), on which it sets the leader label; on ``port`` and, when the
        rendered command serves the webhook from a worker of its own, ``webhook_port`` (free ones by default)."""
        stand_in_pod(self.kube, identity)
        env = {
            **extender_env(),
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
        ext = Extender(port or free_port(), identity, env, self.tls, self.catalog,
                       self.work / f"extender-{identity}.log", webhook_port or free_port())
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


CERTS_USER = "gpuslice-certs"  # the e2e identity of the chart's certificate Job


def bound_to(obj: Obj, user: str) -> Obj:
    """A rendered (Cluster)RoleBinding bound to an e2e client-certificate identity instead of its
    ServiceAccount (the e2e API server has no token controller)."""
    return {**obj, "subjects": [{"kind": "User", "name": user, "apiGroup": "rbac.authorization.k8s.io"}]}


EXTENDER_SERVICE_ACCOUNT = f"system:serviceaccount:{SYSTEM_NS}:gpuslice-extender"


def as_extender_user(obj: Obj, user: str) -> Obj:
    """A rendered admission policy that names the extender's ServiceAccount, naming the e2e extender's
    client-certificate identity instead (as :func:`bound_to` does for the RBAC bindings)."""
    text = json.dumps(obj)
    assert EXTENDER_SERVICE_ACCOUNT in text, f"{obj['metadata']['name']} does not name the extender"
    out: Obj = json.loads(text.replace(EXTENDER_SERVICE_ACCOUNT, user))
    return out


def as_installed(obj: Obj) -> Obj:
    """A rendered object as the e2e control plane installs it: an admission policy that lets the extender
    alone do something names the e2e extender's identity."""
    if obj["kind"] == "ValidatingAdmissionPolicy" and obj["metadata"]["name"] in EXTENDER_POLICIES:
        return as_extender_user(obj, EXTENDER_USER)
    return obj


def stand_in_pod(kube: Kube, name: str) -> None:
    """A pod object named like an extender replica's pod in the system namespace (it never runs)."""
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": name, "namespace": SYSTEM_NS,
                        "labels": {"app.kubernetes.io/name": "gpuslice-extender"}},
           "spec": {"schedulerName": "stand-in-never-scheduled", "terminationGracePeriodSeconds": 0,
                    "containers": [{"name": "extender", "image": IMAGE}]}}
    try:
        kube.request("POST", f"/api/v1/namespaces/{SYSTEM_NS}/pods", pod)
    except KubeError as e:
        if e.status != 409:
            raise


def leader_labelled(kube: Kube) -> set[str]:
    """Names of the system namespace's pods the extender Service selects (the leader label)."""
    service = manifests.find(manifests.rendered(), "Service", "gpuslice-extender")
    selector = ",".join(f"{k}={v}" for k, v in service["spec"]["selector"].items())
    items = kube.request("GET", f"/api/v1/namespaces/{SYSTEM_NS}/pods", query={"labelSelector": selector})
    return {p["metadata"]["name"] for p in items.get("items") or []}


# what the e2e control plane installs as it is rendered (the rest: tests/e2e/test_deploy.py dry-runs it)
INSTALLED_KINDS = ("Namespace", "ConfigMap", "ClusterRole", "Role", "DeviceClass", "ValidatingAdmissionPolicy",
                   "ValidatingAdmissionPolicyBinding")
BINDINGS = {"gpuslice-extender": EXTENDER_USER, "gpuslice-certs": CERTS_USER}
EXTENDER_POLICIES = ("gpuslice-allocation-record",)  # the admission policies that let the extender alone do something


def prepare(cp: ControlPlane, work: Path, port: int) -> Gpuslice:
    """The rendered manifests: namespace, catalog, RBAC, DeviceClasses, admission policies, the webhook
    (pointed at ``port`` on loopback: an extender's ``webhook_url``); the certificates by ``gpuslice
    certs``. Nothing started."""
    kube = Kube(cp.api_client())
    objs = manifests.rendered()
    for obj in objs:
        if obj["kind"] in INSTALLED_KINDS and obj["metadata"].get("namespace") in (None, SYSTEM_NS):
            apply(kube, as_installed(obj))
        elif obj["kind"] in ("ClusterRoleBinding", "RoleBinding") and obj["metadata"]["name"] in BINDINGS:
            apply(kube, bound_to(obj, BINDINGS[obj["metadata"]["name"]]))
    catalog = work / "catalog.toml"
    catalog.write_text(manifests.find(objs, "ConfigMap", "gpuslice-catalog")["data"]["catalog.toml"])
    webhook = manifests.find(objs, "MutatingWebhookConfiguration", "gpuslice")
    assert "caBundle" not in webhook["webhooks"][0]["clientConfig"]  # gpuslice certs (or cert-manager) sets it
    webhook["webhooks"][0]["clientConfig"] = {"url": f"https://127.0.0.1:{port}/mutate"}
    apply(kube, webhook)
    certs = run_certs(cp.user_kubeconfig(CERTS_USER), "--san", "127.0.0.1", home=work)
    assert certs.returncode == 0, f"gpuslice certs failed:\n{certs.stdout}\n{certs.stderr}"
    tls = tls_from_secrets(kube, work / "tls")
    return Gpuslice(cp, work, kube, tls, cp.user_kubeconfig(EXTENDER_USER), catalog)


def scheduler_config(g: Gpuslice, ext: Extender, name: str = "gpuslice-scheduler.yaml") -> Path:
    """The rendered KubeSchedulerConfiguration (of ``ext``'s source tree) with only its connection
    details replaced (kubeconfig, leader election off, the extender's loopback URL, the test's TLS
    files); its path."""
    objs = manifests.rendered(root=ext.root)
    config = yaml.safe_load(manifests.find(objs, "ConfigMap", "gpuslice-scheduler-config")["data"]
                            ["scheduler-config.yaml"])
    config["clientConnection"] = {**(config.get("clientConnection") or {}),
                                  "kubeconfig": str(g.cp.scheduler_kubeconfig)}
    config["leaderElection"] = {"leaderElect": False}
    extender = config["extenders"][0]
    extender["urlPrefix"] = ext.url
    # the rendered tlsConfig, with the test's files: kube-scheduler presents its client certificate
    files = {"caFile": g.tls.ca, "certFile": g.tls.scheduler[0], "keyFile": g.tls.scheduler[1]}
    assert set(extender["tlsConfig"]) == set(files), extender["tlsConfig"]
    extender["tlsConfig"] = {k: str(v) for k, v in files.items()}
    path = g.work / name
    path.write_text(yaml.safe_dump(config))
    return path


def install(cp: ControlPlane, work: Path, **settings: str) -> Gpuslice:
    """:func:`prepare`, then one extender (started, ready; ``settings`` as ``GPUSLICE_*`` variables) and the
    scheduler."""
    port, webhook_port = free_port(), free_port()
    g = prepare(cp, work, webhook_port if webhook_apart() else port)
    ext = g.new_extender("e2e-replica-a", port, webhook_port, **settings)
    ext.start()
    ext.wait_ready(90)
    cp.start_scheduler(scheduler_config(g, ext))
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
    kube.request("POST", f"/apis/resource.k8s.io/v1/namespaces/{q(namespace)}/resourceclaims", claim)
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
    return gated(pod)


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


def add_nodes(gs: Gpuslice, made: list[str], count: int, gpus: int, prefix: str) -> list[str]:
    """``count`` nodes of ``gpus`` V100 each, named ``prefix-i`` and added to ``made``; returns once the
    extender's ledger has them all (it learns nodes from its watch)."""
    names = [f"{prefix}-{i}" for i in range(count)]
    for name in names:
        gpu_node(gs.kube, gs.cp.api_client(), name, gpus)
        made.append(name)
    poll(lambda: set(names) <= {n["name"] for n in gs.extender.state()["nodes"]}, 20, "nodes in the ledger")
    return names


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
