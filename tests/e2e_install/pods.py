"""Pods of the install suite: the three ways of asking for a slice, and reading what each was handed.

Their image is ``docker.io/library/busybox:1.35``: Debian's static busybox (the same 1.35), packed here
and loaded into the node, standing in for the public image a node would pull (no registry here).
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

from packing.kube.client import Kube
from packing.record import ANNOTATION, AllocationRecord, decode
from tests.e2e.cluster import new_api_client, wait_for
from tests.e2e_node.node import oci_archive

from .cluster import FullCluster

BUSYBOX = "docker.io/library/busybox:1.35"
CAPS = {"v100-12": "4096", "v100-25": "8192", "v100-50": "16384", "v100-100": "32768"}
# the hand-off's contract (enforcement/README.md, "The hand-off"), written out: a test, not a copy
LIBRARY = "/usr/local/gpuslice/lib/libgpuslice-limiter.so"


def load_busybox(cluster: FullCluster) -> None:
    listed = subprocess.run(["/bin/busybox", "--list"], capture_output=True, text=True, check=True).stdout.split()
    applets = tuple(a for a in listed if a != "busybox")  # a link named busybox would replace the binary
    archive = cluster.work / "busybox.tar"
    oci_archive(archive, BUSYBOX, ["sh"], applets)
    assert cluster.node is not None
    cluster.node.ctr("images", "import", "--local", str(archive))


def kube(cluster: FullCluster) -> Kube:
    return Kube(new_api_client(cluster.kubeconfig))


def slice_pod(name: str, product: str, how: str, template: str | None = None,
              command: str = "exec sleep 1d") -> dict[str, Any]:
    """A pod asking for ``product`` by ``how``: resource, annotation, or dra (the ResourceClaimTemplate named
    ``template``, by default the chart's example one of the product)."""
    resources = {"requests": {"cpu": "10m", "memory": "8Mi"}, "limits": {"memory": "32Mi"}}
    container: dict[str, Any] = {"name": "main", "image": BUSYBOX, "command": ["sh", "-c", command],
                                 "resources": resources}
    meta: dict[str, Any] = {"name": name, "labels": {"e2e-install": "slice"}}
    spec: dict[str, Any] = {"containers": [container], "terminationGracePeriodSeconds": 2}
    if how == "resource":
        container["resources"]["requests"][f"gpuslice.io/{product}"] = "1"
        container["resources"]["limits"][f"gpuslice.io/{product}"] = "1"
    elif how == "annotation":
        meta["annotations"] = {"gpuslice.io/product": product}
    elif how == "dra":
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": template or product}]
        container["resources"]["claims"] = [{"name": "gpu"}]
    else:
        raise ValueError(how)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec}


def create(cluster: FullCluster, obj: dict[str, Any], namespace: str = "default") -> None:
    cluster.kubectl("-n", namespace, "create", "-f", "-", stdin=json.dumps(obj))


def running(k: Kube, name: str, namespace: str = "default", timeout: float = 120) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        p = k.get_pod(namespace, name)
        phase = ((p or {}).get("status") or {}).get("phase")
        if phase == "Failed":
            raise AssertionError(f"pod {namespace}/{name} failed: {(p or {}).get('status')}")
        return p if phase == "Running" else None

    got: dict[str, Any] = wait_for(check, timeout, interval=0.2, what=f"pod {namespace}/{name} Running")
    return got


def record(pod: dict[str, Any]) -> AllocationRecord:
    return decode(pod["metadata"]["annotations"][ANNOTATION])


def exec_in(cluster: FullCluster, name: str, script: str, namespace: str = "default") -> str:
    return cluster.kubectl("-n", namespace, "exec", name, "--", "sh", "-c", script).stdout


def handed(cluster: FullCluster, name: str, namespace: str = "default") -> dict[str, str]:
    """What the container was handed: its card, its cap, and the limiter as its files say."""
    out = exec_in(cluster, name, " ".join((
        'echo "card=$NVIDIA_VISIBLE_DEVICES"; echo "mib=$GPUSLICE_SLICE_MEMORY_MIB";',
        'echo "preload=$(cat /etc/ld.so.preload)";',
        f'test -s {LIBRARY} && echo library=present || echo library=missing;',
        '(echo x >> /etc/ld.so.preload) 2>/dev/null && echo preload_write=allowed || echo preload_write=refused;',
        'test -d "$GPUSLICE_SLICE_STATE_DIR" && echo state=dir || echo state=missing',
    )), namespace)
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)


def delete_all(cluster: FullCluster, selector: str = "e2e-install", namespace: str = "default",
               timeout: str = "120s") -> None:
    cluster.kubectl("-n", namespace, "delete", "pods,jobs", "-l", selector, "--wait", f"--timeout={timeout}",
                    "--ignore-not-found", timeout=180)


def agent_pod(k: Kube) -> dict[str, Any] | None:
    pods = k.request("GET", "/api/v1/namespaces/gpuslice-system/pods",
                     query={"labelSelector": "app.kubernetes.io/name=gpuslice-agent"}).get("items") or []
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    return live[0] if live else None


def note(figures: dict[str, Any], key: str, value: Any) -> None:
    figures[key] = value
    print(f"[e2e-install] {key}: {value}")


def wait_gone(path: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
