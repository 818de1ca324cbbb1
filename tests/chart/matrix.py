"""The values the chart is rendered under in the tests: each combination a user may choose.

``tests/chart`` validates every render against the Kubernetes 1.34 schemas; ``tests/e2e/test_deploy.py``
applies every render to the real kube-apiserver with server-side dry-run.
"""

from __future__ import annotations

from typing import Any

MATRIX: dict[str, dict[str, Any]] = {
    "defaults": {},
    "manifests": {"namespace": {"create": True}, "uninstall": {"refuseWhileInUse": False}},
    # no registry at all: the images as `make image` names them, the scheduler's from the same place
    "no-registry": {"images": {"registry": "localhost"}, "agent": {"simulatedGpus": 2}},
    "cooperative-spread": {"mode": "cooperative", "policy": "spread", "extender": {"replicas": 3}},
    "cooperative-weight": {"mode": "cooperative", "scheduler": {"extenderWeight": 200}, "policy": "frag-aware"},
    "cert-manager": {"tls": {"mode": "cert-manager"}, "monitoring": {"prometheusRule": {"enabled": True},
                                                                    "podMonitor": {"enabled": True}}},
    "cert-manager-issuer": {"tls": {"mode": "cert-manager",
                                    "certManager": {"issuerRef": {"name": "corp-ca", "kind": "ClusterIssuer",
                                                                  "group": "cert-manager.io"}}}},
    "minimal": {"agent": {"enabled": False, "pacing": False}, "admission": {"enabled": False},
                "uninstall": {"refuseWhileInUse": False},
                "claimTemplates": {"namespaces": []}, "extender": {"replicas": 1}, "scheduler": {"replicas": 1}},
    # the uninstall hook evicts (refuseWhileInUse off does not turn it off: evictPods wants the hook)
    "uninstall-evicts": {"uninstall": {"refuseWhileInUse": False, "evictPods": True, "evictTimeoutSeconds": 600}},
    "permissive-admission": {"admission": {"refuseBareGpu": {"enabled": False}, "refuseVirtualMachines": False},
                             "webhook": {"failurePolicy": "Ignore", "exemptNamespaces": ["kube-system", "monitoring"]}},
    "custom-catalog-pool": {
        "catalog": {"models": [{"name": "Tesla-V100-*-32GB", "memoryMiB": 32768}],
                    "products": [{"name": "v100-12", "model": "Tesla-V100-*-32GB", "milli": 125, "memoryMiB": 4096},
                                 {"name": "v100-25", "model": "Tesla-V100-*-32GB", "milli": 250, "memoryMiB": 8192},
                                 {"name": "v100-100", "model": "Tesla-V100-*-32GB", "milli": 1000,
                                  "memoryMiB": 32768}]},
        "sharedPool": {"nodeSelector": {"gpuslice.io/pool": "shared", "nvidia.com/gpu.present": "true"}},
        "claimTemplates": {"namespaces": ["team-a", "team-b"]},
        "entitlements": {"team-a": "v100-25=8,v100-100=2,milli=4000", "team-b": "v100-12=4"},
    },
    "registry-and-placement": {
        "images": {"registry": "registry.example.com/platform/", "extender": {"tag": "0.1.0-rc1"},
                   "agent": {"tag": "0.1.0-rc1", "pullPolicy": "Always"}},
        "imagePullSecrets": [{"name": "regcred"}],
        "extender": {"extraArgs": ["--slow-request", "1.0"],
                     "nodeSelector": {"node-role.kubernetes.io/control-plane": ""},
                     "tolerations": [{"key": "node-role.kubernetes.io/control-plane", "operator": "Exists",
                                      "effect": "NoSchedule"}],
                     "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                         "nodeSelectorTerms": [{"matchExpressions": [
                             {"key": "kubernetes.io/os", "operator": "In", "values": ["linux"]}]}]}}}},
        "agent": {"extraArgs": ["--inventory-every", "10"], "simulatedGpus": 3},
        "tls": {"bootstrap": {"leafDays": 90, "renewWithinDays": 20, "renewSchedule": "0 4 * * 1"}},
    },
}
