"""The webhook's own process (``extender.cluster.webhook_app``): its app, what runs on the event loop, the
worker roles. The real two-worker gunicorn is in ``tests/integration/test_webhook_worker.py``."""

from __future__ import annotations

import asyncio
import json
import threading
from types import SimpleNamespace
from typing import Any

import pytest

from extender.cluster.config import ClusterConfig
from extender.cluster.webhook_app import create_webhook_app, reads_no_claim, slice_asker
from extender.config import ConfigError, ExtenderConfig
from extender.front import WsgiFront
from extender.samples import pod
from extender.worker import EXTENDER, WEBHOOK, assign_role
from packing.asks import AskReader
from packing.kube.client import KubeError
from packing.pod_group import GROUP_LABEL
from packing.products import load_catalog

from .test_extender_front import call, scope
from .test_extender_groups import member

CATALOG = load_catalog()


def review(p: dict[str, Any]) -> bytes:
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                       "request": {"uid": "r", "kind": {"kind": "Pod"}, "operation": "CREATE", "object": p}}).encode()


class NoGroups:
    """A Kube for pods that name no group: never asked."""

    def request(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("no pod group to list")


class GroupPods:
    """A Kube whose pod list (by group label) is ``items``, or fails with ``error``."""

    def __init__(self, items: list[dict[str, Any]], error: KubeError | None = None) -> None:
        self.items, self.error = items, error
        self.asked: list[dict[str, str]] = []

    def request(self, method: str, path: str, query: dict[str, str]) -> dict[str, Any]:
        self.asked.append(query)
        if self.error is not None:
            raise self.error
        return {"items": self.items}


def test_the_webhook_workers_asker_checks_pod_groups_as_the_extenders_did() -> None:
    routed = "gpuslice-scheduler"
    first = member("a", scheduler=routed)
    kube = GroupPods([first])
    asker = slice_asker(AskReader(CATALOG), kube, routed, 32)  # type: ignore[arg-type]
    assert asker(member("new")) is True
    assert kube.asked == [{"labelSelector": f"{GROUP_LABEL}=train"}]  # consistent: never the cache's resourceVersion 0
    with pytest.raises(ValueError, match="already has its 2 member"):
        slice_asker(AskReader(CATALOG), GroupPods([first, member("b", scheduler=routed)]), routed, 32)(  # type: ignore[arg-type]
            member("new"))
    with pytest.raises(ValueError, match="binds at most 32 pods of a group"):
        asker(member("big", size="33"))
    down = slice_asker(AskReader(CATALOG), GroupPods([], KubeError(503, "down")), routed, 32)  # type: ignore[arg-type]
    assert down(member("new")) is True  # the queue then says InvalidGroup if the members disagree
    assert slice_asker(AskReader(CATALOG), NoGroups(), routed, 32)(pod("p", "v100-25")) is True  # type: ignore[arg-type]


def app_and_threads() -> tuple[Any, list[str]]:
    seen: list[str] = []
    asker = slice_asker(AskReader(CATALOG), NoGroups(), None, 32)

    def asks(p: Any) -> bool:
        seen.append(threading.current_thread().name)
        return asker(p)

    return create_webhook_app(ExtenderConfig(), ClusterConfig(), asks), seen


def test_a_pod_naming_no_claim_is_answered_on_the_event_loop_others_on_a_thread() -> None:
    app, seen = app_and_threads()
    front = WsgiFront(app.wsgi_app, 2, 1 << 20, 5.0, hot=app.extensions["gpuslice-hot"])
    claimed = pod("c", "v100-25")
    claimed["spec"]["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "t"}]

    async def go() -> list[dict[str, Any]]:
        out = []
        for p in (pod("p", "v100-25"), claimed):
            body = review(p)
            out.append(await call(front, scope("/mutate", len(body)), [body]))
        return out

    plain, with_claim = asyncio.run(go())
    assert plain["status"] == 200 and plain["doc"]["response"]["allowed"] is True
    assert with_claim["status"] == 200  # no claim look-up in this test: asking twice is refused, in words
    assert seen[0] == "MainThread" and seen[1].startswith("request"), seen


def test_reads_no_claim_is_conservative() -> None:
    assert reads_no_claim(review(pod("p", "v100-25")))
    assert not reads_no_claim(b'{"spec": {"resourceClaims": []}}')
    assert not reads_no_claim(b'{"spec": {"\\u0072esourceClaims": []}}'), "an escape could spell the key"


def test_the_webhook_app_is_ready_without_a_ledger_and_keeps_its_metrics_to_operators() -> None:
    app, _ = app_and_threads()
    client = app.test_client()
    assert client.get("/readyz").status_code == 200 and client.get("/healthz").status_code == 200
    resp = client.post("/mutate", data=review(pod("p", "v100-25")), content_type="application/json")
    assert resp.status_code == 200 and resp.get_json()["response"]["patchType"] == "JSONPatch"
    assert client.post("/mutate", data=b"{}", content_type="text/plain").status_code == 415
    assert client.post("/filter", data=b"{}", content_type="application/json").status_code == 404
    metrics = client.get("/metrics", environ_base={"REMOTE_ADDR": "127.0.0.1"})
    assert metrics.status_code == 200 and b'verb="webhook"' in metrics.data
    assert client.get("/metrics", environ_base={"REMOTE_ADDR": "10.0.0.9"}).status_code == 403


def test_roles_the_extender_first_then_the_webhook_and_a_dead_one_is_replaced_in_its_role() -> None:
    def worker(role: str | None = None) -> Any:
        return SimpleNamespace() if role is None else SimpleNamespace(role=role)

    first, second = worker(), worker()
    assign_role(first, [], True)
    assign_role(second, [first], True)
    assert (first.role, second.role) == (EXTENDER, WEBHOOK)
    for alive, wanted in (([worker(WEBHOOK)], EXTENDER), ([worker(EXTENDER)], WEBHOOK), ([], EXTENDER)):
        new = worker()
        assign_role(new, alive, True)
        assert new.role == wanted
    alone = worker()
    assign_role(alone, [worker(EXTENDER)], False)
    assert alone.role == EXTENDER, "without a webhook port every worker is the extender's (there is one)"


@pytest.mark.parametrize("settings", [{"webhook_port": 8888}, {"webhook_port": 70000}, {"webhook_port": -1},
                                      {"webhook_port": 8443, "standalone": True}])
def test_a_webhook_port_must_be_another_port_in_cluster_mode(settings: dict[str, Any]) -> None:
    with pytest.raises(ConfigError, match="webhook port"):
        ExtenderConfig(**settings)
