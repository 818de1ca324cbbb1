"""A throw-away Kubernetes control plane on 127.0.0.1 for end-to-end tests.

Runs the real upstream etcd, kube-apiserver and (on demand) kube-scheduler
built by ``deploy/e2e/build-kube.sh``. There is no kubelet and no
kube-controller-manager, so:

- nodes are plain API objects: create them Ready with :func:`create_ready_node`;
- pods never run: set their phase by hand with :func:`set_pod_phase`;
- a pod bound to a node is only removed by a deletion with grace period 0
  (:func:`delete_pod_now`), because no kubelet confirms graceful deletion;
- namespaces never finish deleting (no namespace controller): use a fresh
  namespace per test (:func:`create_namespace`);
- no service-account tokens, no garbage collection, no quota usage tracking.

Everything listens on 127.0.0.1 only, writes its logs to files under
``ControlPlane.work_dir`` (see ``ControlPlane.log_paths``) and is killed by
PID on :meth:`ControlPlane.stop`, at interpreter exit, or when the Python
process that started it dies.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import shutil
import signal
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from kubernetes import client as k8s
from kubernetes import config as k8s_config

T = TypeVar("T")

SERVICE_CLUSTER_IP_RANGE = "10.0.0.0/24"
# Admission plugins that need controllers we do not run:
# - ServiceAccount rejects pods until the (absent) token controller has
#   created the namespace's `default` ServiceAccount;
# - TaintNodesByCondition taints every new Node not-ready, and only the
#   (absent) node lifecycle controller would lift that taint.
DEFAULT_DISABLED_ADMISSION = ("ServiceAccount", "TaintNodesByCondition")
SCHEDULER_CONFIG_API = "kubescheduler.config.k8s.io/v1"


class ControlPlaneError(RuntimeError):
    """A component failed to start or to become ready."""


def free_port() -> int:
    """Return a TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_for(
    check: Callable[[], T | None],
    timeout: float,
    interval: float = 0.2,
    what: str = "condition",
) -> T:
    """Poll ``check`` until it returns something other than None/False; return it.

    Raises TimeoutError naming ``what`` after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result is not None and result is not False:
            return result
        if time.monotonic() >= deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def _die_with_parent() -> None:
    # Runs in the child before exec: SIGKILL it when the parent dies, so a
    # killed test run leaves no apiserver behind (Linux only; best effort).
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class _Process:
    """One child process with its log file, killed by PID."""

    def __init__(self, name: str, argv: Sequence[str], log_path: Path) -> None:
        self.name = name
        self.argv = list(argv)
        self.log_path = log_path
        self._log = open(log_path, "ab")  # noqa: SIM115 - lives as long as the process
        self._log.write(f"\n==== {time.strftime('%H:%M:%S')} starting: {' '.join(self.argv)}\n".encode())
        self._log.flush()
        self.popen = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def stop(self, grace: float = 10.0) -> None:
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=grace)
        self._log.close()


def tail(path: Path, lines: int = 40) -> str:
    """Return the last ``lines`` lines of a text file ('' if it does not exist)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return ""
    return "\n".join(data.decode(errors="replace").splitlines()[-lines:])


class ControlPlane:
    """etcd + kube-apiserver (+ kube-scheduler on demand) on 127.0.0.1.

    Typical use::

        cp = ControlPlane(bin_dir)
        cp.start()
        api = cp.api_client()
        cp.start_scheduler(cp.write_scheduler_config(extenders=[...]))
        ...
        cp.stop()
    """

    def __init__(
        self,
        bin_dir: Path | str,
        work_dir: Path | str | None = None,
        apiserver_args: Sequence[str] = (),
        disabled_admission_plugins: Sequence[str] = DEFAULT_DISABLED_ADMISSION,
        keep_work_dir: bool = False,
        address: str = "127.0.0.1",
    ) -> None:
        """Prepare (not start) a control plane.

        ``apiserver_args`` are appended to the kube-apiserver command line
        (e.g. ``["--feature-gates=..."]``). The work dir (certificates,
        kubeconfigs, etcd data, logs) is a fresh temp dir unless given; it is
        removed by :meth:`stop` unless ``keep_work_dir`` or it was given.
        ``address`` is where kube-apiserver listens and advertises itself (the
        install suite gives an address its pods reach; etcd stays on loopback).
        """
        self.bin_dir = Path(bin_dir)
        self.address = address
        for binary in ("etcd", "kube-apiserver", "kube-scheduler"):
            if not (self.bin_dir / binary).is_file():
                raise ControlPlaneError(f"{binary} not found in {self.bin_dir}")
        self._owns_work_dir = work_dir is None and not keep_work_dir
        self.work_dir = Path(work_dir) if work_dir else Path(tempfile.mkdtemp(prefix="gpuslice-e2e-"))
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.pki_dir = self.work_dir / "pki"
        self.apiserver_args = list(apiserver_args)
        self.disabled_admission_plugins = list(disabled_admission_plugins)
        self.etcd_port = 0
        self.apiserver_port = 0
        self.scheduler_port = 0
        self.scheduler_config_path: Path | None = None
        self._scheduler_extra_args: list[str] = []
        self._etcd: _Process | None = None
        self._apiserver: _Process | None = None
        self._scheduler: _Process | None = None
        self._api_client: k8s.ApiClient | None = None
        atexit.register(self.stop)

    # ------------------------------------------------------------ properties
    @property
    def server(self) -> str:
        """The API server URL, ``https://<address>:<port>``."""
        return f"https://{self.address}:{self.apiserver_port}"

    @property
    def ca_cert(self) -> Path:
        return self.pki_dir / "ca.crt"

    @property
    def kubeconfig(self) -> Path:
        """Admin kubeconfig (user ``admin``, group ``system:masters``)."""
        return self.work_dir / "admin.kubeconfig"

    @property
    def scheduler_kubeconfig(self) -> Path:
        """Kubeconfig for user ``system:kube-scheduler`` (bound by bootstrap RBAC)."""
        return self.work_dir / "scheduler.kubeconfig"

    @property
    def log_paths(self) -> dict[str, Path]:
        """Log file of each component, by name (``etcd``, ``kube-apiserver``, ``kube-scheduler``)."""
        return {name: self.work_dir / f"{name}.log" for name in ("etcd", "kube-apiserver", "kube-scheduler")}

    def logs_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of every component log that exists, for failure reports."""
        parts = []
        for name, path in self.log_paths.items():
            if path.exists():
                parts.append(f"---- {name} ({path}) ----\n{tail(path, lines)}")
        return "\n".join(parts)

    # --------------------------------------------------------------- lifecycle
    def start(self, timeout: float = 120.0) -> None:
        """Generate certificates, start etcd and kube-apiserver, wait until ready."""
        self._make_pki()
        for attempt in range(3):
            try:
                self._start_etcd(timeout)
                self._start_apiserver(timeout)
                break
            except ControlPlaneError:
                # A port picked by free_port() may have been taken meanwhile.
                self._stop_process("kube-apiserver")
                self._stop_process("etcd")
                if attempt == 2 or not self._lost_port_race():
                    raise
        self._write_kubeconfig(self.kubeconfig, "admin")
        self._write_kubeconfig(self.scheduler_kubeconfig, "scheduler")
        # /readyz covers RBAC bootstrap; the default namespace comes from a
        # separate apiserver loop, so wait for it too.
        core = k8s.CoreV1Api(self.api_client())
        wait_for(lambda: _exists(lambda: core.read_namespace("default")), timeout, what="namespace default")

    def stop(self) -> None:
        """Kill scheduler, apiserver and etcd (by PID); remove the work dir if we made it."""
        self._stop_process("kube-scheduler")
        self._stop_process("kube-apiserver")
        self._stop_process("etcd")
        if self._api_client is not None:
            with contextlib.suppress(Exception):
                self._api_client.close()  # type: ignore[no-untyped-call]
            self._api_client = None
        if self._owns_work_dir and self.work_dir.exists():
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def api_client(self) -> k8s.ApiClient:
        """A shared ``kubernetes.client.ApiClient`` for the admin kubeconfig."""
        if self._api_client is None:
            self._api_client = new_api_client(self.kubeconfig)
        return self._api_client

    def user_kubeconfig(self, user: str, groups: Sequence[str] = ()) -> Path:
        """Write a kubeconfig for a client-certificate identity ``user`` in ``groups``.

        Useful to run a component (e.g. the extender) under its own RBAC.
        """
        slug = "".join(c if c.isalnum() else "-" for c in user)
        name = f"user-{slug}-{uuid.uuid4().hex[:6]}"
        self._client_cert(name, user, groups)
        path = self.work_dir / f"{name}.kubeconfig"
        self._write_kubeconfig(path, name)
        return path

    # ---------------------------------------------------------------- scheduler
    def write_scheduler_config(
        self,
        extenders: Sequence[Mapping[str, Any]] = (),
        profiles: Sequence[Mapping[str, Any]] | None = None,
        leader_elect: bool = False,
        extra: Mapping[str, Any] | None = None,
        name: str = "scheduler-config.yaml",
    ) -> Path:
        """Write a ``KubeSchedulerConfiguration`` (v1) and return its path.

        ``clientConnection.kubeconfig`` points at :attr:`scheduler_kubeconfig`;
        ``extenders`` and ``profiles`` are copied as given (dicts in the
        upstream JSON shape); ``extra`` top-level keys override the rest.
        """
        doc: dict[str, Any] = {
            "apiVersion": SCHEDULER_CONFIG_API,
            "kind": "KubeSchedulerConfiguration",
            "clientConnection": {"kubeconfig": str(self.scheduler_kubeconfig)},
            "leaderElection": {"leaderElect": leader_elect},
        }
        if extenders:
            doc["extenders"] = [dict(e) for e in extenders]
        if profiles is not None:
            doc["profiles"] = [dict(p) for p in profiles]
        if extra:
            doc.update(extra)
        path = self.work_dir / name
        path.write_text(json.dumps(doc, indent=2) + "\n")  # JSON is YAML
        return path

    def start_scheduler(
        self,
        config_path: Path | str | None = None,
        extra_args: Sequence[str] = (),
        timeout: float = 60.0,
    ) -> None:
        """Start kube-scheduler with a KubeSchedulerConfiguration file and wait until ready.

        Without ``config_path`` a default configuration (no extender) is
        written. A config you write yourself must set
        ``clientConnection.kubeconfig`` (use :attr:`scheduler_kubeconfig`):
        kube-scheduler ignores ``--kubeconfig`` when ``--config`` is given.
        Stops a running scheduler first.
        """
        self.stop_scheduler()
        self.scheduler_config_path = Path(config_path) if config_path else self.write_scheduler_config()
        self._scheduler_extra_args = list(extra_args)
        self._run_scheduler(timeout)

    def stop_scheduler(self) -> None:
        """Kill kube-scheduler if it runs."""
        self._stop_process("kube-scheduler")

    def restart_scheduler(self, timeout: float = 60.0) -> None:
        """Stop and start kube-scheduler with the same configuration and arguments."""
        if self.scheduler_config_path is None:
            raise ControlPlaneError("restart_scheduler() before start_scheduler()")
        self.stop_scheduler()
        self._run_scheduler(timeout)

    def pid(self, name: str) -> int | None:
        """The PID of a running component (``etcd``, ``kube-apiserver``, ``kube-scheduler``), else None."""
        proc: _Process | None = {"etcd": self._etcd, "kube-apiserver": self._apiserver,
                                 "kube-scheduler": self._scheduler}[name]
        return proc.pid if proc is not None and proc.alive() else None

    @property
    def scheduler_running(self) -> bool:
        return self._scheduler is not None and self._scheduler.alive()

    # ------------------------------------------------------------- internals
    def _run_scheduler(self, timeout: float) -> None:
        assert self.scheduler_config_path is not None
        for attempt in range(3):
            self.scheduler_port = free_port()
            argv = [
                str(self.bin_dir / "kube-scheduler"),
                f"--config={self.scheduler_config_path}",
                "--bind-address=127.0.0.1",
                f"--secure-port={self.scheduler_port}",
                f"--authentication-kubeconfig={self.scheduler_kubeconfig}",
                f"--authorization-kubeconfig={self.scheduler_kubeconfig}",
                "--v=2",
                *self._scheduler_extra_args,
            ]
            self._scheduler = _Process("kube-scheduler", argv, self.log_paths["kube-scheduler"])
            try:
                self._wait_https(
                    self._scheduler, f"https://127.0.0.1:{self.scheduler_port}/readyz", timeout, verify=False
                )
                return
            except ControlPlaneError:
                self._stop_process("kube-scheduler")
                if attempt == 2 or not self._lost_port_race():
                    raise

    def _start_etcd(self, timeout: float) -> None:
        self.etcd_port = free_port()
        peer_port = free_port()
        data_dir = self.work_dir / "etcd-data"
        shutil.rmtree(data_dir, ignore_errors=True)
        client_url = f"http://127.0.0.1:{self.etcd_port}"
        peer_url = f"http://127.0.0.1:{peer_port}"
        argv = [
            str(self.bin_dir / "etcd"),
            "--name=e2e",
            f"--data-dir={data_dir}",
            f"--listen-client-urls={client_url}",
            f"--advertise-client-urls={client_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=e2e={peer_url}",
            "--initial-cluster-state=new",
            # Throw-away data: skip fsync, it dominates latency on CI disks.
            "--unsafe-no-fsync=true",
            "--log-level=warn",
        ]
        self._etcd = _Process("etcd", argv, self.log_paths["etcd"])
        self._wait_http(self._etcd, f"{client_url}/health", timeout)

    def _start_apiserver(self, timeout: float) -> None:
        self.apiserver_port = free_port()
        pki = self.pki_dir
        argv = [
            str(self.bin_dir / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
            f"--bind-address={self.address}",
            f"--advertise-address={self.address}",
            f"--secure-port={self.apiserver_port}",
            f"--cert-dir={self.work_dir / 'apiserver-certs'}",
            f"--tls-cert-file={pki / 'apiserver.crt'}",
            f"--tls-private-key-file={pki / 'apiserver.key'}",
            f"--client-ca-file={pki / 'ca.crt'}",
            "--anonymous-auth=false",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={pki / 'sa.pub'}",
            f"--service-account-signing-key-file={pki / 'sa.key'}",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}",
            "--allow-privileged=true",
            "--v=1",
        ]
        if not any(a.startswith("--authorization-mode=") for a in self.apiserver_args):
            argv.append("--authorization-mode=RBAC")  # a list flag: given twice, it is refused
        if self.disabled_admission_plugins:
            argv.append(f"--disable-admission-plugins={','.join(self.disabled_admission_plugins)}")
        argv += self.apiserver_args
        self._apiserver = _Process("kube-apiserver", argv, self.log_paths["kube-apiserver"])
        self._wait_https(self._apiserver, f"{self.server}/readyz", timeout, verify=True)

    def _stop_process(self, name: str) -> None:
        attr = {"etcd": "_etcd", "kube-apiserver": "_apiserver", "kube-scheduler": "_scheduler"}[name]
        proc: _Process | None = getattr(self, attr)
        if proc is not None:
            proc.stop()
            setattr(self, attr, None)

    def _lost_port_race(self) -> bool:
        return any("address already in use" in tail(p, 60) for p in self.log_paths.values())

    def _wait_http(self, proc: _Process, url: str, timeout: float, ctx: ssl.SSLContext | None = None) -> None:
        def ready() -> bool:
            if not proc.alive():
                raise ControlPlaneError(f"{proc.name} exited with {proc.popen.returncode}:\n{tail(proc.log_path, 30)}")
            try:
                with urllib.request.urlopen(url, timeout=5, context=ctx) as resp:
                    return bool(resp.status == 200)
            except (urllib.error.URLError, OSError):
                return False

        try:
            wait_for(ready, timeout, interval=0.25, what=f"{proc.name} at {url}")
        except TimeoutError as exc:
            raise ControlPlaneError(f"{exc}\n{tail(proc.log_path, 30)}") from exc

    def _wait_https(self, proc: _Process, url: str, timeout: float, verify: bool) -> None:
        if verify:
            ctx = ssl.create_default_context(cafile=str(self.ca_cert))
            ctx.load_cert_chain(str(self.pki_dir / "admin.crt"), str(self.pki_dir / "admin.key"))
        else:
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        self._wait_http(proc, url, timeout, ctx)

    # ------------------------------------------------------------------- PKI
    def _openssl(self, *args: str) -> None:
        result = subprocess.run(["openssl", *args], cwd=self.pki_dir, capture_output=True, text=True)
        if result.returncode != 0:
            raise ControlPlaneError(f"openssl {' '.join(args)} failed:\n{result.stderr}")

    def _make_pki(self) -> None:
        if shutil.which("openssl") is None:
            raise ControlPlaneError("the openssl command line tool is required for the e2e control plane")
        self.pki_dir.mkdir(parents=True, exist_ok=True)
        if (self.pki_dir / "ca.crt").exists():
            return
        self._openssl("genrsa", "-out", "ca.key", "2048")
        self._openssl(
            "req", "-x509", "-new", "-key", "ca.key", "-sha256", "-days", "3650",
            "-subj", "/CN=gpuslice-e2e-ca",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
            "-out", "ca.crt",
        )  # fmt: skip
        sans = ",".join(
            [
                "IP:127.0.0.1",
                *([f"IP:{self.address}"] if self.address != "127.0.0.1" else []),
                "IP:10.0.0.1",  # first IP of SERVICE_CLUSTER_IP_RANGE: the kubernetes Service
                "DNS:localhost",
                "DNS:kubernetes",
                "DNS:kubernetes.default",
                "DNS:kubernetes.default.svc",
                "DNS:kubernetes.default.svc.cluster.local",
            ]
        )
        self._signed_cert("apiserver", "/CN=kube-apiserver", "serverAuth", sans)
        self._client_cert("admin", "admin", ["system:masters"])
        self._client_cert("scheduler", "system:kube-scheduler", [])
        self._openssl("genrsa", "-out", "sa.key", "2048")
        self._openssl("rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub")

    def _client_cert(self, name: str, user: str, groups: Sequence[str]) -> None:
        subject = f"/CN={user}" + "".join(f"/O={g}" for g in groups)
        self._signed_cert(name, subject, "clientAuth", None)

    def _signed_cert(self, name: str, subject: str, usage: str, sans: str | None) -> None:
        ext = [
            "basicConstraints=critical,CA:FALSE",
            "keyUsage=critical,digitalSignature,keyEncipherment",
            f"extendedKeyUsage={usage}",
            "subjectKeyIdentifier=hash",
            "authorityKeyIdentifier=keyid",
        ]
        if sans:
            ext.append(f"subjectAltName={sans}")
        (self.pki_dir / f"{name}.ext").write_text("\n".join(ext) + "\n")
        self._openssl("genrsa", "-out", f"{name}.key", "2048")
        self._openssl("req", "-new", "-key", f"{name}.key", "-subj", subject, "-out", f"{name}.csr")
        self._openssl(
            "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
            "-set_serial", str(int(uuid.uuid4().hex[:15], 16)), "-days", "3650", "-sha256",
            "-extfile", f"{name}.ext", "-out", f"{name}.crt",
        )  # fmt: skip

    def _write_kubeconfig(self, path: Path, cert_name: str) -> None:
        doc = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {"name": "e2e", "cluster": {"server": self.server, "certificate-authority": str(self.ca_cert)}}
            ],
            "users": [
                {
                    "name": cert_name,
                    "user": {
                        "client-certificate": str(self.pki_dir / f"{cert_name}.crt"),
                        "client-key": str(self.pki_dir / f"{cert_name}.key"),
                    },
                }
            ],
            "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": cert_name}}],
            "current-context": "e2e",
        }
        path.write_text(json.dumps(doc, indent=2) + "\n")  # JSON is YAML


def _exists(read: Callable[[], object]) -> bool:
    try:
        read()
    except k8s.ApiException as exc:
        if exc.status == 404:
            return False
        raise
    return True


# ------------------------------------------------------------------ helpers
def new_api_client(kubeconfig: Path | str) -> k8s.ApiClient:
    """A fresh ``kubernetes.client.ApiClient`` from a kubeconfig file."""
    api: k8s.ApiClient = k8s_config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(kubeconfig)
    )
    return api


def create_namespace(api: k8s.ApiClient, prefix: str = "e2e") -> str:
    """Create a uniquely named namespace and return its name (it is never fully deleted)."""
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    k8s.CoreV1Api(api).create_namespace(k8s.V1Namespace(metadata=k8s.V1ObjectMeta(name=name)))
    return name


def create_ready_node(
    api: k8s.ApiClient,
    name: str,
    capacity: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    taints: Sequence[k8s.V1Taint] = (),
) -> k8s.V1Node:
    """Create a Node that kube-scheduler will place pods on, as a kubelet would.

    ``capacity`` (used as allocatable too) is merged over a default of
    8 CPUs, 32Gi memory and 110 pods; add extended resources here, e.g.
    ``{"gpuslice.io/v100-25": "4"}``. The status (capacity, allocatable,
    Ready=True) is written through the status subresource, as kube-apiserver
    drops status on create.
    """
    core = k8s.CoreV1Api(api)
    all_labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
    all_labels.update(labels or {})
    resources = {"cpu": "8", "memory": "32Gi", "pods": "110", "ephemeral-storage": "100Gi"}
    resources.update(capacity or {})
    core.create_node(
        k8s.V1Node(
            metadata=k8s.V1ObjectMeta(name=name, labels=all_labels),
            spec=k8s.V1NodeSpec(taints=list(taints) or None),
        )
    )
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    status = {
        "status": {
            "capacity": resources,
            "allocatable": resources,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "e2e fake node",
                    "lastHeartbeatTime": now,
                    "lastTransitionTime": now,
                }
            ],
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": name}],
        }
    }
    node: k8s.V1Node = core.patch_node_status(name, status)
    return node


def set_pod_phase(api: k8s.ApiClient, namespace: str, name: str, phase: str) -> k8s.V1Pod:
    """Set ``status.phase`` of a pod (e.g. ``Running``, ``Succeeded``), standing in for the kubelet."""
    pod: k8s.V1Pod = k8s.CoreV1Api(api).patch_namespaced_pod_status(name, namespace, {"status": {"phase": phase}})
    return pod


def delete_pod_now(api: k8s.ApiClient, namespace: str, name: str) -> None:
    """Delete a pod with grace period 0 (no kubelet would confirm a graceful delete)."""
    with contextlib.suppress(k8s.ApiException):
        k8s.CoreV1Api(api).delete_namespaced_pod(name, namespace, grace_period_seconds=0)


def wait_for_pod_node(api: k8s.ApiClient, namespace: str, name: str, timeout: float = 30.0) -> str:
    """Wait until a pod is bound (``spec.nodeName`` set) and return the node name."""
    core = k8s.CoreV1Api(api)

    def bound() -> str | None:
        spec = core.read_namespaced_pod(name, namespace).spec
        node: str | None = spec.node_name if spec else None
        return node

    return wait_for(bound, timeout, interval=0.2, what=f"pod {namespace}/{name} to be bound")
