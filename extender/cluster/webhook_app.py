"""Serving the admission webhook: in the extender's process, or in a worker process of its own.

The webhook (``extender.cluster.webhook``) is a pure function of the pod: it needs the catalog and,
for a DRA claim, a look-up of the claim; no ledger, no queue, no leadership. With ``--webhook-port``
(the chart sets it) gunicorn runs a second worker process for it (``extender.worker``): a replica
answers the webhook whether it leads or stands by, so the webhook's Service selects every ready
replica (a leader hand-over leaves no one to answer), and no admission step, bind or watch of the
extender's process shares its interpreter lock: a webhook call waits for nothing but its own work.
Without a webhook port the extender's own process serves it on ``--port``, as before.

Its process answers ``POST <webhook path>``, ``GET /healthz`` and ``/readyz`` (ready once it serves:
it has nothing to rebuild) and ``GET /metrics`` (its requests, ``verb="webhook"``; loopback or a
metrics client certificate), with the extender's HTTP rules (``extender.app.serving_app``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from flask import Flask, Response

from extender.app import HotRoutes, record_request, serving_app
from extender.cluster.config import ClusterConfig
from extender.cluster.dra import ClaimResolver
from extender.cluster.webhook import Pod
from extender.cluster.webhook import handle as handle_review
from extender.config import ExtenderConfig
from extender.heap import settle_heap
from extender.metrics import ExtenderMetrics, watch_gc
from extender.timing import Phases, measuring
from packing.asks import AskReader, ClaimUnavailable
from packing.claims import MemberOf
from packing.kube.client import Kube, KubeError, connect, q
from packing.pod_group import GROUP_LABEL, group_of, members_disagree
from packing.products import load_catalog

log = logging.getLogger(__name__)
API_CONNECTIONS = 4  # the webhook reads DRA claims (cached): a few calls at once at most


def slice_asker(asks: AskReader, kube: Kube, scheduler: str | None, max_group: int) -> Callable[[Pod], bool]:
    """For the webhook: does this pod ask for a slice? ValueError (deny, with the reason) when its ask
    is refused, its DRA claim cannot be read now, or its pod group cannot take it (a size above
    ``max_group``, or disagreeing with the group's members already created: ``check_members``)."""

    def asks_for_slice(pod: Pod) -> bool:
        try:
            if asks.request(pod) is None:
                return False
        except ClaimUnavailable as e:
            raise ValueError(f"cannot read the pod's ResourceClaim(Template) now: {e}") from None
        tag = group_of(pod, max_group)  # GroupError is a ValueError: denied with its reason
        if tag is not None:
            check_members(kube, pod, tag, scheduler)
        return True

    return asks_for_slice


def check_members(kube: Kube, pod: Pod, tag: MemberOf, scheduler: str | None) -> None:
    """ValueError when ``pod`` disagrees with its group's members already created (size, scheduler) or
    the group is full. An API error lets the pod in: the queue then holds a group whose members
    disagree (InvalidGroup) and says so."""
    namespace = (pod.get("metadata") or {}).get("namespace") or "default"
    try:
        # a consistent list, not resourceVersion=0: the cache may not yet hold the member created just before
        others = kube.request("GET", f"/api/v1/namespaces/{q(namespace)}/pods", query={
            "labelSelector": f"{GROUP_LABEL}={tag.name}"}).get("items") or []
    except KubeError as e:
        log.warning("webhook: cannot list pod group %s/%s to check a new member: %s", namespace, tag.name, e)
        return
    why = members_disagree(pod, tag, others, scheduler)
    if why is not None:
        raise ValueError(why)


def mount_webhook(app: Flask, config: ExtenderConfig, cluster: ClusterConfig, asks_for_slice: Callable[[Pod], bool],
                  metrics: ExtenderMetrics) -> None:
    """Serve ``POST <cluster.webhook_path>`` on ``app`` (a hot route: the API server presents no certificate)."""
    hot: HotRoutes = app.extensions["gpuslice-hot"]
    scheduler = cluster.scheduler_name or None

    def webhook(body: bytes, phases: Phases) -> tuple[int, bytes]:
        with measuring(phases):
            status, reply = handle_review(body, asks_for_slice, scheduler, cluster.gate)
            record_request(metrics, config, phases, status)
        return status, reply

    hot.mount(cluster.webhook_path, "webhook", webhook, checked=False, inline=reads_no_claim)


def reads_no_claim(body: bytes) -> bool:
    """Surely no DRA claim to read for this review (so no API call): no ``resourceClaims`` in it, and no
    escaped character that could spell one (Go's encoder escapes only <, > and &, so real pods pass)."""
    return b"resourceClaims" not in body and b"\\u" not in body


def create_webhook_app(config: ExtenderConfig, cluster: ClusterConfig, asks_for_slice: Callable[[Pod], bool],
                       metrics: ExtenderMetrics | None = None) -> Flask:
    """The webhook process's app (see the module docstring)."""
    metrics = metrics or ExtenderMetrics()
    app = serving_app("gpuslice-webhook", config, metrics)
    mount_webhook(app, config, cluster, asks_for_slice, metrics)

    @app.get("/readyz")
    def readyz() -> Response:
        return Response(b'{"status":"ready","serves":"webhook"}', status=200, mimetype="application/json")

    return app


def app_from_env() -> Flask:
    """The webhook worker's app, from the same ``GPUSLICE_*`` settings as the extender's."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    watch_gc()
    config, cluster = ExtenderConfig.from_env(), ClusterConfig.from_env()
    catalog = load_catalog(config.catalog or None)
    kube = connect(cluster.kubeconfig, API_CONNECTIONS)
    claims = ClaimResolver(catalog, kube.get_claim_template, kube.get_claim)
    asks = AskReader(catalog, config.refused_resources, claims)
    app = create_webhook_app(config, cluster, slice_asker(asks, kube, cluster.scheduler_name or None,
                                                          config.bind_threads))
    settle_heap()  # what the imports built lives as long as the process: no full collection walks it mid-burst
    return app
