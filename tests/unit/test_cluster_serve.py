"""Cluster mode's HTTP surface (no API server needed): not-ready refusals, the webhook route, settings."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from kubernetes import client

from extender.cluster.config import ClusterConfig
from extender.cluster.serve import NOT_READY, ClusterRuntime, create_cluster_app
from extender.config import ConfigError, ExtenderConfig
from extender.inventory import synthetic_cards
from extender.samples import pod
from packing.gate import GATE


@pytest.fixture
def runtime() -> ClusterRuntime:
    return ClusterRuntime(ExtenderConfig(), ClusterConfig(leader_elect=False), api=client.ApiClient())


def post(app: Any, path: str, doc: Any) -> tuple[int, Any]:
    resp = app.test_client().post(path, data=json.dumps(doc), content_type="application/json")
    return resp.status_code, resp.get_json()


def test_decisions_wait_until_ready(runtime: ClusterRuntime) -> None:
    app = create_cluster_app(runtime.config, runtime.cluster, runtime, start=False)
    p = pod("p", "v100-25")
    assert app.test_client().get("/readyz").status_code == 503
    status, body = post(app, "/filter", {"Pod": p, "NodeNames": ["n1"]})
    assert status == 200 and body["Error"] == NOT_READY and body["NodeNames"] == []
    status, body = post(app, "/bind", {"PodName": "p", "PodNamespace": "default", "PodUID": "u", "Node": "n1"})
    assert status == 200 and body["Error"] == NOT_READY
    assert post(app, "/prioritize", {"Pod": p, "NodeNames": ["n1"]})[0] == 503
    runtime.state.sync_node("n1", synthetic_cards("n1", 1, "Tesla-V100-SXM2-32GB", 32768))
    runtime.state.ready = True
    assert app.test_client().get("/readyz").status_code == 200
    status, body = post(app, "/filter", {"Pod": p, "NodeNames": ["n1"]})
    assert status == 200 and body["NodeNames"] == ["n1"] and not body["Error"]


def test_webhook_route_gates_and_denies(runtime: ClusterRuntime) -> None:
    app = create_cluster_app(runtime.config, runtime.cluster, runtime, start=False)
    request: dict[str, Any] = {"uid": "r", "kind": {"kind": "Pod"}, "operation": "CREATE",
                               "object": pod("p", "v100-25")}
    review = {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    status, body = post(app, "/mutate", review)
    ops = json.loads(base64.b64decode(body["response"]["patch"]))
    assert status == 200 and {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": GATE}]} in ops
    request["object"] = pod("q", "v100-33")  # not in the catalog
    status, body = post(app, "/mutate", review)
    assert status == 200 and body["response"]["allowed"] is False and "v100-33" in body["response"]["status"]["message"]
    assert post(app, "/mutate", {"nope": 1})[0] == 400


def test_with_a_webhook_port_the_extender_leaves_the_webhook_to_its_own_worker() -> None:
    config = ExtenderConfig(webhook_port=8443)
    runtime = ClusterRuntime(config, ClusterConfig(leader_elect=False), api=client.ApiClient())
    app = create_cluster_app(config, runtime.cluster, runtime, start=False)
    request = {"uid": "r", "kind": {"kind": "Pod"}, "operation": "CREATE", "object": pod("p", "v100-25")}
    assert post(app, "/mutate", {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                 "request": request})[0] == 404


def test_cluster_config_from_env() -> None:
    c = ClusterConfig.from_env({"GPUSLICE_LEADER_ELECT": "no", "GPUSLICE_TICK_S": "0.5", "POD_NAMESPACE": "x",
                                "GPUSLICE_IDENTITY": "me"})
    assert (c.leader_elect, c.tick_s, c.namespace, c.who) == (False, 0.5, "x", "me")
    assert ClusterConfig.from_env(c.to_env()) == c
    with pytest.raises(ConfigError, match="GPUSLICE_TICK_S"):
        ClusterConfig.from_env({"GPUSLICE_TICK_S": "soon"})
    with pytest.raises(ConfigError, match="renew deadline"):
        ClusterConfig(lease_duration_s=5, renew_deadline_s=10)
    with pytest.raises(ConfigError, match="webhook path"):
        ClusterConfig(webhook_path="mutate")


def test_a_claim_that_cannot_be_read_now_is_retried_not_refused(runtime: ClusterRuntime) -> None:
    # nothing answers at the API address: the pod's template cannot be read
    away = ClusterRuntime(ExtenderConfig(), ClusterConfig(leader_elect=False),
                          api=client.ApiClient(client.Configuration(host="http://127.0.0.1:9")))
    app = create_cluster_app(away.config, away.cluster, away, start=False)
    away.state.sync_node("n1", synthetic_cards("n1", 1, "Tesla-V100-SXM2-32GB", 32768))
    away.state.ready = True
    p = pod("p")
    p["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "half"}]
    status, body = post(app, "/filter", {"Pod": p, "NodeNames": ["n1"]})
    assert status == 200 and "cannot read the pod's claim now" in body["Error"]  # kube-scheduler retries
    status, body = post(app, "/prioritize", {"Pod": p, "NodeNames": ["n1"]})
    assert status == 503 and "cannot read" in body["error"]
    assert away.state.ledger.allocations == {}
