"""A full one-node Kubernetes cluster on this machine, for the install suite (``make e2e-install``).

What ``tests/e2e`` and ``tests/e2e_node`` run (etcd, kube-apiserver, kube-scheduler, a kubelet on
containerd + runc), plus what a real install needs from a cluster: kube-controller-manager
(Deployments, DaemonSets, Jobs, service-account tokens, claims from templates, garbage collection,
namespace deletion), kube-proxy (Services, iptables mode) and CoreDNS (Service names), all built
from pinned sources by ``deploy/e2e/build-kube.sh install``. Every part runs as a process of this
machine, as a node's own agents do; only gpuslice runs as pods, installed by README's commands.

Addresses never leave the machine: kube-apiserver and the kubelet serve on ``HOST_IP``, an address
added to the loopback device for the run (pods reach it through their bridge's gateway), pods live
in ``POD_CIDR`` on a bridge the CNI plugin makes, Services in ``SERVICE_CLUSTER_IP_RANGE`` exist only
in kube-proxy's iptables rules. Identities are real: the kubelet is ``system:node:<name>`` under
the Node authorizer and NodeRestriction, the controller manager, kube-proxy and the schedulers have
their own, and service-account tokens are signed and checked.

Stopped in reverse order, each part by PID; the address, kube-proxy's rules (``kube-proxy
--cleanup``, then every chain that appeared), the bridge, the mounts and the host directories the
node created are removed, and ``net.ipv4.ip_forward`` is put back, also when a test fails. Each is
written down before it is made (``tests/e2e_node/janitor.py``), so a run that is killed is undone by
the next real-node run.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import subprocess
from pathlib import Path

from tests.e2e.cluster import SERVICE_CLUSTER_IP_RANGE, ControlPlane, _Process, free_port, tail, wait_for
from tests.e2e_node.janitor import Record
from tests.e2e_node.node import HostLayout, RealNode

HOST_IP = "10.88.76.1"  # kube-apiserver, the kubelet, CoreDNS: on the loopback device, for this run only
POD_CIDR = "10.88.77.0/24"
NODE = "gpu-1"
FORWARD = Path("/proc/sys/net/ipv4/ip_forward")
BRIDGE_NF = Path("/proc/sys/net/bridge/bridge-nf-call-iptables")


class ClusterError(RuntimeError):
    pass


class FullCluster:
    """Control plane, controller manager, default scheduler, CoreDNS, kube-proxy and one GPU node."""

    def __init__(self, kube_bin: Path, containerd_bin: Path, coredns_bin: Path) -> None:
        self.kube_bin, self.containerd_bin, self.coredns_bin = kube_bin, containerd_bin, coredns_bin
        self.cp = ControlPlane(kube_bin, address=HOST_IP, disabled_admission_plugins=(), apiserver_args=[
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            "--kubelet-preferred-address-types=InternalIP",
        ])
        pki = self.cp.pki_dir
        # the front-proxy settings every cluster has: delegated authentication (kube-scheduler's /healthz server)
        # reads them from kube-system/extension-apiserver-authentication
        self.cp.apiserver_args += [f"--requestheader-client-ca-file={pki / 'ca.crt'}",
                                   "--requestheader-allowed-names=front-proxy-client",
                                   "--requestheader-username-headers=X-Remote-User",
                                   "--requestheader-group-headers=X-Remote-Group",
                                   "--requestheader-extra-headers-prefix=X-Remote-Extra-"]
        # exec, logs, port-forward: the API server presents the admin certificate to the kubelet
        self.cp.apiserver_args += [f"--kubelet-client-certificate={pki / 'admin.crt'}",
                                   f"--kubelet-client-key={pki / 'admin.key'}"]
        self.node: RealNode | None = None
        self._procs: dict[str, _Process] = {}
        self.record = Record("install cluster")
        self.record.add("roots", self.cp.work_dir)
        self._stopped = False
        atexit.register(self.stop)

    @property
    def work(self) -> Path:
        return self.cp.work_dir

    @property
    def kubeconfig(self) -> Path:
        return self.cp.kubeconfig

    # ---- set-up ---------------------------------------------------------------------------------
    def start(self) -> None:
        for path in (FORWARD, BRIDGE_NF):
            if not path.exists():
                raise ClusterError(f"{path} is missing: the kernel cannot route pods' traffic here")
        self.record.before()  # kube-proxy's and the CNI plugin's chains: those that appear from now on go
        self._add_address()
        self._set(FORWARD, "1")  # pod -> Service -> pod is routed through this machine
        self._set(BRIDGE_NF, "1")  # replies between pods on one bridge pass kube-proxy's NAT
        self.cp.start()
        self.cp.start_scheduler()  # the default scheduler: gpuslice's own pods, the certificate Job
        self._start_controller_manager()
        self._start_coredns()
        self._start_node()
        self._start_kube_proxy()
        wait_for(self._node_ready, 120, what=f"Node {NODE} Ready")

    def _add_address(self) -> None:
        out = subprocess.run(["ip", "-o", "addr", "show", "dev", "lo"], capture_output=True, text=True, check=True)
        if f" {HOST_IP}/" in out.stdout:
            raise ClusterError(f"{HOST_IP} is on lo already: another install suite runs (or a stale one did)")
        self.record.add("addresses", [f"{HOST_IP}/32", "lo"])
        subprocess.run(["ip", "addr", "add", f"{HOST_IP}/32", "dev", "lo"], check=True, capture_output=True)

    def _set(self, path: Path, value: str) -> None:
        sysctl = self.record.data.get("sysctl") or {}
        sysctl.setdefault(str(path), path.read_text().strip())  # the value before the first change: put back
        self.record.put("sysctl", sysctl)
        path.write_text(value)

    def _identity(self, user: str, groups: tuple[str, ...] = ()) -> Path:
        return self.cp.user_kubeconfig(user, list(groups))

    def _process(self, name: str, argv: list[str]) -> _Process:
        proc = _Process(name, argv, self.work / f"{name}.log")
        self._procs[name] = proc
        return proc

    def _start_controller_manager(self) -> None:
        pki = self.cp.pki_dir
        kubeconfig = self._identity("system:kube-controller-manager")
        proc = self._process("kube-controller-manager", [
            str(self.kube_bin / "kube-controller-manager"), f"--kubeconfig={kubeconfig}",
            f"--authentication-kubeconfig={kubeconfig}", f"--authorization-kubeconfig={kubeconfig}",
            "--bind-address=127.0.0.1", f"--secure-port={free_port()}", "--leader-elect=false",
            f"--service-account-private-key-file={pki / 'sa.key'}", f"--root-ca-file={pki / 'ca.crt'}",
            "--use-service-account-credentials=true",
            f"--cluster-signing-cert-file={pki / 'ca.crt'}", f"--cluster-signing-key-file={pki / 'ca.key'}",
            f"--service-cluster-ip-range={SERVICE_CLUSTER_IP_RANGE}", "--v=1",
        ])
        # the token controller makes each namespace's default ServiceAccount: the first sign of life
        wait_for(lambda: self._alive(proc) and self._has_default_service_account(), 120,
                 what="kube-controller-manager (the default ServiceAccount)")

    def _has_default_service_account(self) -> bool:
        out = self.kubectl("get", "serviceaccount", "default", "-n", "default", "-o", "name", check=False)
        return out.returncode == 0

    def _start_coredns(self) -> None:
        corefile = self.work / "Corefile"
        corefile.write_text(
            f"cluster.local:53 {{\n  bind {HOST_IP}\n  errors\n"
            f"  kubernetes cluster.local {{\n    kubeconfig {self.kubeconfig}\n  }}\n}}\n"
            # nothing outside the cluster is resolved: an unknown name is answered at once, never forwarded
            f".:53 {{\n  bind {HOST_IP}\n  template ANY ANY {{\n    rcode NXDOMAIN\n  }}\n}}\n")
        proc = self._process("coredns", [str(self.coredns_bin / "coredns"), "-conf", str(corefile)])
        wait_for(lambda: self._alive(proc) and "CoreDNS-" in tail(proc.log_path, 50), 60, what="CoreDNS")

    def _start_node(self) -> None:
        kubeconfig = self._identity(f"system:node:{NODE}", ("system:nodes",))
        layout = HostLayout(node_ip=HOST_IP, kubeconfig=kubeconfig, cluster_dns=HOST_IP, pod_cidr=POD_CIDR,
                            labels={"nvidia.com/gpu.present": "true"})
        self.node = RealNode(self.cp, self.kube_bin, self.containerd_bin, NODE, host=layout)
        self.node.start()

    def _start_kube_proxy(self) -> None:
        kubeconfig = self._identity("system:kube-proxy")
        config = self.work / "kube-proxy.yaml"
        config.write_text(json.dumps({
            "apiVersion": "kubeproxy.config.k8s.io/v1alpha1", "kind": "KubeProxyConfiguration",
            "clientConnection": {"kubeconfig": str(kubeconfig)}, "hostnameOverride": NODE,
            "mode": "iptables", "clusterCIDR": POD_CIDR, "bindAddress": HOST_IP,
            "healthzBindAddress": f"127.0.0.1:{free_port()}", "metricsBindAddress": f"127.0.0.1:{free_port()}",
            # leave the machine's conntrack table size alone: nothing here needs more
            "conntrack": {"maxPerCore": 0, "min": 0},
        }))
        self._process("kube-proxy", [str(self.kube_bin / "kube-proxy"), f"--config={config}", "--v=1"])
        # the kubernetes Service's rule: pods reach the API server through 10.0.0.1 from then on
        wait_for(lambda: b"KUBE-SVC" in self._iptables_nat(), 60, what="kube-proxy's Service rules")

    def _iptables_nat(self) -> bytes:
        return subprocess.run(["iptables", "-t", "nat", "-S"], capture_output=True, check=False).stdout

    def _node_ready(self) -> bool:
        out = self.kubectl("get", "node", NODE, "-o",
                           "jsonpath={.status.conditions[?(@.type=='Ready')].status}", check=False)
        return out.stdout.strip() == "True"

    def _alive(self, proc: _Process) -> bool:
        if not proc.alive():
            raise ClusterError(f"{proc.name} exited:\n{tail(proc.log_path, 40)}")
        return True

    # ---- use ------------------------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        """The environment README's commands run in: kubectl, helm's build dir, ctr on PATH; the admin kubeconfig."""
        env = dict(os.environ)
        env["PATH"] = f"{self.kube_bin}:{self.containerd_bin}:{env.get('PATH', '/usr/bin:/bin')}"
        env["KUBECONFIG"] = str(self.kubeconfig)
        env["CONTAINERD_ADDRESS"] = str(self.node.sock) if self.node else ""
        return env

    def kubectl(self, *args: str, check: bool = True, timeout: float = 120,
                stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        out = subprocess.run([str(self.kube_bin / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args],
                             capture_output=True, text=True, timeout=timeout, input=stdin)
        if check and out.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args)} failed ({out.returncode}): {out.stderr.strip()}")
        return out

    def logs(self, lines: int = 40) -> str:
        parts = [self.cp.logs_tail(lines)]
        parts += [f"---- {n} ----\n{tail(p.log_path, lines)}" for n, p in self._procs.items()]
        if self.node is not None:
            parts.append(self.node.logs(lines))
        return "\n".join(parts)

    # ---- clean-up -------------------------------------------------------------------------------
    def stop(self) -> None:
        """Everything, in reverse order, by PID; then the rules, the address and the settings put back."""
        if self._stopped:
            return
        for name in ("kube-proxy",):
            if name in self._procs:
                self._procs.pop(name).stop(grace=10)
        if self.node is not None:
            self.node.stop()
            self.node = None
        for name in ("coredns", "kube-controller-manager"):
            if name in self._procs:
                self._procs.pop(name).stop(grace=10)
        self.cp.stop()
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run([str(self.kube_bin / "kube-proxy"), "--cleanup"], capture_output=True, timeout=60)
        self.record.close()  # the chains kube-proxy --cleanup left, the CNI plugin's, the address, the sysctls
        self._stopped = True
