"""A real node for the end-to-end suite: containerd 2.x (CDI on) + runc + kubelet, all in a temp dir.

Built by ``deploy/e2e/build-kube.sh node`` (kubelet from the same pinned sources as the control
plane, containerd from its Go module); runc and the CNI plugins come from Debian (``.ci/run``
installs them). Images are made here: a static busybox from Debian's ``busybox-static`` in one
layer, packed as an OCI archive and imported with ``ctr images import`` (no registry anywhere).

Needs root and real cgroups (v1 here, with the cgroupfs driver: PID 1 is not systemd). What the node
changes on the host is written down first (``janitor.Record``: its temp dir, the host paths it creates,
the iptables chains and ``kubepods`` cgroups that appear, the CNI bridge); :meth:`RealNode.stop`, also
at interpreter exit, kills containerd's shims and the containers under them, unmounts, and removes it
all, and a run that was killed is undone by the next one (``lock.hold``). containerd keeps the pods'
network namespaces and the CNI plugin its address leases inside the temp dir, so nothing of a pod's
network outlives the dir.

:class:`HostLayout` puts the node where a cluster's node has it instead (``tests/e2e_install``: the
kubelet's root ``/var/lib/kubelet``, containerd's socket, NRI socket and CDI directories at their
defaults, as the chart's hostPaths expect), on an address its pods reach, with a node identity and DNS.
Only what the node itself created is removed on stop.
"""

from __future__ import annotations

import atexit
import contextlib
import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.e2e.cluster import ControlPlane, _Process, free_port, tail, wait_for

from .janitor import Record

BUSYBOX = Path("/bin/busybox")
IMAGE = "docker.io/library/e2e-busybox:1"
PAUSE = "docker.io/library/e2e-pause:1"
APPLETS = ("sh", "sleep", "env", "cat", "echo", "true", "sha256sum", "stat")
RUNC = "/usr/sbin/runc"
# The kubelet's device manager always serves here, whatever its --root-dir: one real node per machine.
DEVICE_PLUGINS = Path("/var/lib/kubelet/device-plugins")
CNI_BIN = "/usr/lib/cni"
RUNC_STATE = Path("/run/containerd")  # the runc shim keeps runc's state here whatever containerd's own state dir
POD_LOG_LINKS = Path("/var/log/containers")  # the kubelet's symlinks to pod logs, whatever its podLogsDir
CNI_STATE = Path("/var/lib/cni")  # libcni's result cache (its address leases are in the node's temp dir)
BRIDGE = "gpuslice-e2e0"


class NodeError(RuntimeError):
    pass


@dataclass(frozen=True)
class HostLayout:
    """A node at the host's standard paths (the install suite), instead of inside its temp dir."""

    node_ip: str  # the kubelet serves and registers here; pods reach it (and the API server beside it)
    kubeconfig: Path  # the kubelet's own identity (system:node:<name>)
    cluster_dns: str
    pod_cidr: str
    labels: dict[str, str] = field(default_factory=dict)
    kubelet_dir: Path = Path("/var/lib/kubelet")
    socket: Path = Path("/run/containerd/containerd.sock")
    nri_socket: Path = Path("/var/run/nri/nri.sock")
    cdi_dirs: tuple[Path, ...] = (Path("/etc/cdi"), Path("/var/run/cdi"))
    pod_logs: Path = Path("/var/log/pods")


def _blob(data: bytes) -> tuple[str, int]:
    return "sha256:" + hashlib.sha256(data).hexdigest(), len(data)


def busybox_layer(applets: tuple[str, ...] = APPLETS) -> bytes:
    """One gzipped tar layer: /bin/busybox and applet links, /tmp, /etc/passwd."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        for d in ("bin", "tmp", "etc", "proc", "sys", "dev"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755
            tar.addfile(info)
        tar.add(str(BUSYBOX), arcname="bin/busybox")
        for applet in applets:
            info = tarfile.TarInfo(f"bin/{applet}")
            info.type, info.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(info)
        passwd = b"root:x:0:0:root:/:/bin/sh\n"
        info = tarfile.TarInfo("etc/passwd")
        info.size = len(passwd)
        tar.addfile(info, io.BytesIO(passwd))
    return gzip.compress(raw.getvalue(), mtime=0)


def oci_archive(path: Path, name: str, cmd: list[str], applets: tuple[str, ...] = APPLETS) -> None:
    """Write an OCI image layout tar holding one image ``name`` running ``cmd``."""
    layer = busybox_layer(applets)
    diff_id = "sha256:" + hashlib.sha256(gzip.decompress(layer)).hexdigest()
    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Cmd": cmd, "Env": ["PATH=/bin"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    }).encode()
    config_digest, config_size = _blob(config)
    layer_digest, layer_size = _blob(layer)
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest,
                   "size": config_size},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": layer_digest,
                    "size": layer_size}],
    }).encode()
    manifest_digest, manifest_size = _blob(manifest)
    index = json.dumps({"schemaVersion": 2, "manifests": [{
        "mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": manifest_digest,
        "size": manifest_size, "annotations": {"io.containerd.image.name": name,
                                               "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1]},
    }]}).encode()
    with tarfile.open(path, "w") as tar:
        for arcname, data in [("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'), ("index.json", index),
                              (f"blobs/sha256/{config_digest[7:]}", config),
                              (f"blobs/sha256/{layer_digest[7:]}", layer),
                              (f"blobs/sha256/{manifest_digest[7:]}", manifest)]:
            info = tarfile.TarInfo(arcname)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def containerd_config(default: str, root: Path, host: HostLayout | None = None) -> str:
    """containerd's own default config, moved into ``root``, with CDI dir, runc, CNI, local pause, and
    NRI on (its default) with its socket in ``root``; with ``host``, its socket, NRI socket and CDI
    directories stay at their defaults (its root and state still in ``root``)."""
    subs = [
        ("root = '/var/lib/containerd'", f"root = '{root}/containerd/root'"),
        ("state = '/run/containerd'", f"state = '{root}/containerd/state'"),
        ("sandbox = 'registry.k8s.io/pause:3.10.1'", f"sandbox = '{PAUSE}'"),
        # this sandbox's root lacks CAP_SYS_RESOURCE: a negative oom_score_adj is refused
        ("restrict_oom_score_adj = false", "restrict_oom_score_adj = true"),
        ("BinaryName = ''", f"BinaryName = '{RUNC}'"),
        ("bin_dirs = ['/opt/cni/bin']", f"bin_dirs = ['{CNI_BIN}']"),
        ("conf_dir = '/etc/cni/net.d'", f"conf_dir = '{root}/cni'"),
        ("imports = ['/etc/containerd/conf.d/*.toml']", "imports = []"),
        # pods' network namespaces under its state dir (in ``root``), not /run/netns: none outlives the node
        ("netns_mounts_under_state_dir = false", "netns_mounts_under_state_dir = true"),
    ]
    if host is None:
        subs += [
            ("address = '/run/containerd/containerd.sock'", f"address = '{root}/containerd/containerd.sock'"),
            ("cdi_spec_dirs = ['/etc/cdi', '/var/run/cdi']", f"cdi_spec_dirs = ['{root}/cdi']"),
            ("socket_path = '/var/run/nri/nri.sock'", f"socket_path = '{root}/nri.sock'"),
        ]
    text = default
    for old, new in subs:
        if old not in text:
            raise NodeError(f"containerd default config changed: {old!r} not found")
        text = text.replace(old, new)
    return text


class RealNode:
    """containerd + kubelet registered as ``name`` with ``cp``; see the module docstring."""

    def __init__(self, cp: ControlPlane, kube_bin: Path, containerd_bin: Path, name: str = "e2e-node",
                 host: HostLayout | None = None) -> None:
        self.cp = cp
        self.name = name
        self.kube_bin = kube_bin
        self.containerd_bin = containerd_bin
        self.host = host
        self.root = Path(tempfile.mkdtemp(prefix="gpuslice-node-"))
        self.kubelet_dir = host.kubelet_dir if host else self.root / "kubelet"
        self.cdi_dir = host.cdi_dirs[-1] if host else self.root / "cdi"
        self.pod_logs = host.pod_logs if host else self.root / "pod-logs"
        self.sock = host.socket if host else self.root / "containerd" / "containerd.sock"
        self.nri_socket = host.nri_socket if host else self.root / "nri.sock"
        self._containerd: _Process | None = None
        self._kubelet: _Process | None = None
        self.kubelet_log = self.root / "kubelet.log"
        # what this node changes on the host, written down before it does (undone by stop, or by the next run)
        self.record = Record(f"real node {name}")
        self.record.add("roots", self.root)
        self.record.add("containerd_roots", self.root / "containerd" / "root")
        wanted = [DEVICE_PLUGINS.parent, RUNC_STATE, POD_LOG_LINKS, CNI_STATE]
        if host:
            wanted += [self.kubelet_dir, self.sock.parent, self.nri_socket.parent, *host.cdi_dirs, self.pod_logs]
            # the kubelet bind-mounts its root dir onto itself (shared), and mounts pods' volumes under it
            self.record.add("unmount", self.kubelet_dir)
        self.record.made_if_missing(*wanted)
        self.record.add("links", BRIDGE)
        self._stopped = False
        self.containerd_log = self.root / "containerd.log"
        atexit.register(self.stop)

    # ---- set-up ---------------------------------------------------------------------------------
    def start(self) -> None:
        if self.host is not None and self.sock.exists():
            raise NodeError(f"{self.sock} exists: another containerd runs on this machine")
        self.record.before()  # the iptables chains and kubepods cgroups there are now: later ones are the node's
        for d in (self.kubelet_dir, self.cdi_dir, self.pod_logs, self.root / "cni"):
            d.mkdir(parents=True, exist_ok=True)
        default = subprocess.run([str(self.containerd_bin / "containerd"), "config", "default"], check=True,
                                 capture_output=True, text=True).stdout
        (self.root / "containerd.toml").write_text(containerd_config(default, self.root, self.host))
        subnet = self.host.pod_cidr if self.host else "10.88.77.0/24"
        (self.root / "cni" / "10-e2e.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": "e2e", "plugins": [
                {"type": "bridge", "bridge": BRIDGE, "isGateway": True, "ipMasq": False,
                 # pods that are not on the host's network reach Services and the API server through the bridge
                 "isDefaultGateway": self.host is not None, "hairpinMode": True,
                 "ipam": {"type": "host-local", "ranges": [[{"subnet": subnet}]],
                          "dataDir": str(self.root / "cni-leases")}},
                {"type": "loopback"}]}))
        self.start_containerd()
        for image, cmd in ((IMAGE, ["/bin/sh"]),
                           (PAUSE, ["/bin/sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"])):
            archive = self.root / f"{image.rsplit('/', 1)[1].replace(':', '-')}.tar"
            oci_archive(archive, image, cmd)
            self.ctr("images", "import", "--local", str(archive))
        self.start_kubelet()

    def ctr(self, *args: str) -> str:
        out = subprocess.run([str(self.containerd_bin / "ctr"), "--address", str(self.sock), "-n", "k8s.io", *args],
                             capture_output=True, text=True, timeout=120)
        if out.returncode != 0:
            raise NodeError(f"ctr {' '.join(args)} failed: {out.stderr.strip()}")
        return out.stdout

    def start_containerd(self) -> None:
        env_path = f"{self.containerd_bin}:{os.environ.get('PATH', '/usr/bin:/bin')}"
        os.environ["PATH"] = env_path  # containerd finds its shim on PATH
        self._containerd = _Process("containerd", [str(self.containerd_bin / "containerd"), "--config",
                                                   str(self.root / "containerd.toml")], self.containerd_log)
        wait_for(lambda: self.sock.exists() and self._ctr_ok(), 60, what="containerd")

    def _ctr_ok(self) -> bool:
        if self._containerd is not None and not self._containerd.alive():
            raise NodeError(f"containerd exited:\n{tail(self.containerd_log, 30)}")
        try:
            self.ctr("version")
        except NodeError:
            return False
        return True

    def start_kubelet(self) -> None:
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "cgroupDriver": "cgroupfs", "failSwapOn": False, "failCgroupV1": False,
            "localStorageCapacityIsolation": False, "enforceNodeAllocatable": [],
            "containerRuntimeEndpoint": f"unix://{self.sock}",
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False},
                               "x509": {"clientCAFile": str(self.cp.ca_cert)}},
            "authorization": {"mode": "AlwaysAllow"},
            "podLogsDir": str(self.pod_logs),
            "staticPodPath": "", "syncFrequency": "10s", "fileCheckFrequency": "20s",
            "nodeStatusUpdateFrequency": "2s", "imageGCHighThresholdPercent": 100,
            "evictionHard": {}, "evictionPressureTransitionPeriod": "1s",
            "port": free_port(), "readOnlyPort": 0, "healthzPort": free_port(), "healthzBindAddress": "127.0.0.1",
            "address": "127.0.0.1", "serializeImagePulls": False,
        }
        kubeconfig, node_ip, extra = self.cp.kubeconfig, "127.0.0.1", []
        if self.host is not None:
            # as a cluster's kubelet: its own identity, the API server's client certificate checked
            # (webhook authorization: SubjectAccessReviews), served where the API server reaches it
            config.update({
                "address": self.host.node_ip, "port": 10250,
                "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                                   "x509": {"clientCAFile": str(self.cp.ca_cert)}},
                "authorization": {"mode": "Webhook"},
                "clusterDNS": [self.host.cluster_dns], "clusterDomain": "cluster.local",
            })
            del config["podLogsDir"]  # the default, /var/log/pods
            kubeconfig, node_ip = self.host.kubeconfig, self.host.node_ip
            if self.host.labels:
                extra.append("--node-labels=" + ",".join(f"{k}={v}" for k, v in self.host.labels.items()))
        (self.root / "kubelet.yaml").write_text(json.dumps(config, indent=1))
        argv = [str(self.kube_bin / "kubelet"), f"--config={self.root / 'kubelet.yaml'}",
                f"--kubeconfig={kubeconfig}", f"--root-dir={self.kubelet_dir}",
                f"--hostname-override={self.name}", f"--cert-dir={self.root / 'pki'}", f"--node-ip={node_ip}",
                "--v=3", *extra]
        self._kubelet = _Process("kubelet", argv, self.kubelet_log)

    def stop_kubelet(self) -> None:
        if self._kubelet is not None:
            self._kubelet.stop(grace=15)
            self._kubelet = None

    def restart_kubelet(self) -> None:
        self.stop_kubelet()
        self.start_kubelet()

    def kubelet_alive(self) -> bool:
        if self._kubelet is None or not self._kubelet.alive():
            raise NodeError(f"kubelet not running:\n{tail(self.kubelet_log, 40)}")
        return True

    # ---- reading ---------------------------------------------------------------------------------
    def container_log(self, namespace: str, pod: str, uid: str, container: str = "main") -> str:
        """The container's log file, read where the kubelet writes it (no kubelet serving cert here)."""
        d = self.pod_logs / f"{namespace}_{pod}_{uid}" / container
        files = sorted(d.glob("*.log")) if d.is_dir() else []
        return "".join(f.read_text(errors="replace") for f in files)

    def logs(self, lines: int = 40) -> str:
        return (f"---- kubelet ----\n{tail(self.kubelet_log, lines)}\n"
                f"---- containerd ----\n{tail(self.containerd_log, lines)}")

    # ---- clean-up --------------------------------------------------------------------------------
    def stop(self) -> None:
        """Kill the kubelet, every container, containerd; then undo the node's record (shims, mounts, chains,
        cgroups, the bridge, the temp dir and the host paths it made)."""
        if self._stopped:
            return
        self.stop_kubelet()
        if self._containerd is not None and self._containerd.alive():
            with contextlib.suppress(Exception):
                for task in self.ctr("tasks", "ls", "-q").split():
                    subprocess.run([str(self.containerd_bin / "ctr"), "--address", str(self.sock), "-n", "k8s.io",
                                    "tasks", "kill", "-s", "SIGKILL", task], capture_output=True, timeout=10)
            time.sleep(0.5)
            self._containerd.stop(grace=10)
        self._containerd = None
        if self.host is not None:
            for sock in (self.sock, Path(f"{self.sock}.ttrpc")):
                sock.unlink(missing_ok=True)
        keep = os.environ.get("GPUSLICE_E2E_LOGS")  # a directory to keep the node's logs in
        if keep:
            Path(keep).mkdir(parents=True, exist_ok=True)
            for log in (self.kubelet_log, self.containerd_log):
                with contextlib.suppress(OSError):
                    shutil.copy(log, Path(keep) / log.name)
        self.record.close()
        # the device manager's socket and checkpoint (and our plugins' sockets) at the fixed path
        shutil.rmtree(DEVICE_PLUGINS, ignore_errors=True)
        self._stopped = True
