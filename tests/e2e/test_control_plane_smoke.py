"""The e2e harness is real: upstream kube-scheduler binds a pod to a node we made."""

from __future__ import annotations

import pytest
from kubernetes import client as k8s

from .cluster import ControlPlane, create_ready_node, delete_pod_now, wait_for_pod_node

pytestmark = pytest.mark.e2e

SLICE = "gpuslice.io/v100-25"


def test_apiserver_serves_v1_34(control_plane: ControlPlane) -> None:
    version = k8s.VersionApi(control_plane.api_client()).get_code()
    assert (version.major, version.minor) == ("1", "34")
    assert version.git_version.startswith("v1.34.")


def test_scheduler_binds_pod_to_ready_node(scheduler: ControlPlane, namespace: str) -> None:
    api = scheduler.api_client()
    core = k8s.CoreV1Api(api)
    node = create_ready_node(api, "smoke-node", capacity={SLICE: "4"})
    assert node.status and node.status.allocatable and node.status.allocatable[SLICE] == "4"
    assert node.spec and not node.spec.taints

    pod = k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name="smoke"),
        spec=k8s.V1PodSpec(
            containers=[
                k8s.V1Container(
                    name="main",
                    image="registry.invalid/never-pulled:1",
                    resources=k8s.V1ResourceRequirements(
                        requests={"cpu": "100m", "memory": "64Mi", SLICE: "1"},
                        limits={SLICE: "1"},
                    ),
                )
            ]
        ),
    )
    core.create_namespaced_pod(namespace, pod)
    try:
        assert wait_for_pod_node(api, namespace, "smoke", timeout=60) == "smoke-node"
        scheduled = core.read_namespaced_pod("smoke", namespace)
        assert scheduled.status is not None
        conditions = {c.type: c.status for c in scheduled.status.conditions or []}
        assert conditions.get("PodScheduled") == "True"
    finally:
        delete_pod_now(api, namespace, "smoke")
        core.delete_node("smoke-node")
