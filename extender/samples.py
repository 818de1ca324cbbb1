"""Pods, Nodes and extender request bodies shaped like the ones kube-scheduler sends.

Used by the standalone demo, the benchmarks and the tests, so that all of them speak the real
wire format: full ``v1.Pod`` / ``v1.Node`` objects (lowerCamel keys) inside PascalCase
``ExtenderArgs`` / ``ExtenderBindingArgs``.
"""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Sequence
from typing import Any

from extender.inventory import COUNT_LABEL, DEFAULT_MODEL, MEMORY_LABEL
from packing.inventory import ANNOTATION as INVENTORY_ANNOTATION
from packing.inventory import PRODUCT_LABEL, Card, encode

RESOURCE_PREFIX = "gpuslice.io"


def pod(
    name: str,
    product: str | None = None,
    *,
    uid: str | None = None,
    namespace: str = "default",
    count: int = 1,
    via: str = "resource",
    time_limit_s: int | None = None,
    priority: int | None = None,
    extra_resources: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A pending v1.Pod asking for ``count`` x ``product`` through ``via`` ("resource" or "annotation")."""
    uid = uid or str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"gpuslice/{namespace}/{name}"))
    limits: dict[str, str] = {"cpu": "2", "memory": "8Gi"}
    requests: dict[str, str] = {"cpu": "1", "memory": "4Gi"}
    annotations: dict[str, str] = {}
    if product is not None and via == "resource":
        limits[f"{RESOURCE_PREFIX}/{product}"] = str(count)
        requests[f"{RESOURCE_PREFIX}/{product}"] = str(count)
    elif product is not None:
        annotations[f"{RESOURCE_PREFIX}/product"] = product
    for k, v in (extra_resources or {}).items():
        limits[k] = v
        requests[k] = v
    spec: dict[str, Any] = {
        "volumes": [{"name": "kube-api-access", "projected": {"sources": [{"serviceAccountToken": {
            "expirationSeconds": 3607, "path": "token"}}], "defaultMode": 420}}],
        "containers": [{
            "name": "main",
            "image": "nvcr.io/nvidia/pytorch:24.01-py3",
            "command": ["python", "train.py"],
            "resources": {"limits": limits, "requests": requests},
            "volumeMounts": [{"name": "kube-api-access", "readOnly": True,
                              "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
            "terminationMessagePath": "/dev/termination-log",
            "terminationMessagePolicy": "File",
            "imagePullPolicy": "IfNotPresent",
        }],
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default",
        "securityContext": {},
        "schedulerName": "default-scheduler",
        "tolerations": [
            {"key": "node.kubernetes.io/not-ready", "operator": "Exists", "effect": "NoExecute",
             "tolerationSeconds": 300},
            {"key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
             "tolerationSeconds": 300},
        ],
        "priority": priority if priority is not None else 0,
        "enableServiceLinks": True,
        "preemptionPolicy": "PreemptLowerPriority",
    }
    if time_limit_s is not None:
        spec["activeDeadlineSeconds"] = time_limit_s
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid,
            "resourceVersion": "1234",
            "creationTimestamp": "2025-01-01T00:00:00Z",
            "labels": {"app": "train"},
            "annotations": annotations,
            "managedFields": [{"manager": "kubectl", "operation": "Update", "apiVersion": "v1"}],
        },
        "spec": spec,
        "status": {"phase": "Pending", "qosClass": "Burstable"},
    }


def gpu_node(
    name: str,
    gpus: int = 8,
    model: str = DEFAULT_MODEL,
    *,
    memory_mib: int = 32768,
    inventory: Sequence[Card] | None = None,
    labels: bool = True,
) -> dict[str, Any]:
    """A Ready v1.Node with GPU Feature Discovery labels (and the agent's inventory when given)."""
    node_labels = {
        "kubernetes.io/hostname": name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": "p3dn.24xlarge",
        "nvidia.com/cuda.driver.major": "535",
        "nvidia.com/gpu.family": "volta",
        "nvidia.com/gpu.present": "true",
    }
    if labels and gpus:
        node_labels.update({PRODUCT_LABEL: model, COUNT_LABEL: str(gpus), MEMORY_LABEL: str(memory_mib)})
    annotations = {"node.alpha.kubernetes.io/ttl": "0",
                   "volumes.kubernetes.io/controller-managed-attach-detach": "true"}
    if inventory is not None:
        annotations[INVENTORY_ANNOTATION] = encode(inventory)
    capacity = {"cpu": "96", "memory": "784Gi", "pods": "110", "ephemeral-storage": "1Ti", "nvidia.com/gpu": str(gpus)}
    return {
        "metadata": {
            "name": name,
            "uid": str(uuidlib.uuid5(uuidlib.NAMESPACE_URL, f"gpuslice/node/{name}")),
            "resourceVersion": "987",
            "creationTimestamp": "2025-01-01T00:00:00Z",
            "labels": node_labels,
            "annotations": annotations,
        },
        "spec": {"podCIDR": "10.244.1.0/24", "providerID": f"aws:///us-east-1a/{name}"},
        "status": {
            "capacity": capacity,
            "allocatable": dict(capacity),
            "conditions": [
                {"type": t, "status": "False", "reason": f"KubeletHas{r}", "message": f"kubelet has {r}",
                 "lastHeartbeatTime": "2025-01-01T00:00:00Z", "lastTransitionTime": "2025-01-01T00:00:00Z"}
                for t, r in (("MemoryPressure", "SufficientMemory"), ("DiskPressure", "NoDiskPressure"),
                             ("PIDPressure", "SufficientPID"))
            ] + [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                  "message": "kubelet is posting ready status", "lastHeartbeatTime": "2025-01-01T00:00:00Z",
                  "lastTransitionTime": "2025-01-01T00:00:00Z"}],
            "addresses": [{"type": "InternalIP", "address": "10.0.0.1"}, {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {"machineID": "ec2", "systemUUID": "ec2", "bootID": "b", "kernelVersion": "6.1.0",
                         "osImage": "Ubuntu 22.04.4 LTS", "containerRuntimeVersion": "containerd://1.7.13",
                         "kubeletVersion": "v1.34.1", "kubeProxyVersion": "", "operatingSystem": "linux",
                         "architecture": "amd64"},
            "images": [{"names": ["nvcr.io/nvidia/pytorch:24.01-py3"], "sizeBytes": 9876543210}],
        },
    }


def filter_args(
    pod_doc: dict[str, Any],
    node_names: Sequence[str] | None = None,
    nodes: Sequence[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """An ``ExtenderArgs`` body: ``NodeNames`` (nodeCacheCapable) or full ``Nodes``; the other is null."""
    return {
        "Pod": pod_doc,
        "Nodes": None if nodes is None else {"metadata": {}, "items": list(nodes)},
        "NodeNames": None if node_names is None else list(node_names),
    }


def binding_args(pod_doc: dict[str, Any], node: str) -> dict[str, Any]:
    """An ``ExtenderBindingArgs`` body for ``pod_doc`` on ``node``."""
    meta = pod_doc["metadata"]
    return {"PodName": meta["name"], "PodNamespace": meta["namespace"], "PodUID": meta["uid"], "Node": node}
