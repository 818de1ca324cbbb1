"""The HTTP face of the extender: a Flask app factory over one ``ExtenderState``.

Routes (verbs and prefix configurable): ``POST /filter``, ``POST /prioritize``, ``POST /bind``,
``GET /healthz``, ``GET /readyz`` (the state's ``ready`` flag), ``GET /metrics`` (Prometheus),
``GET /state`` (the ledger and the queue, read-only) and, in standalone mode,
``POST /admin/release`` ``{"PodUID": "..."}``.

Malformed JSON or wrong types get HTTP 400 with a JSON error body and change nothing: bodies are
parsed and validated before the state's lock is taken. Decisions always answer 200 in the wire
format (a pod that fits nowhere gets reasons, not an error); ``Error`` is only set for an internal
failure. gunicorn serves it: ``extender.app:app_from_env()`` with ``extender/gunicorn_conf.py``.
"""

from __future__ import annotations

import gc
import json
import logging
import time
from typing import Any

from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException

from extender.config import ConfigError, ExtenderConfig
from extender.metrics import ExtenderMetrics
from extender.podspec import MalformedPod
from extender.state import ExtenderState
from extender.wire import (
    FilterResult,
    WireError,
    binding_result,
    decode_body,
    encode,
    parse_binding_args,
    parse_extender_args,
    parse_release,
    priorities_to_wire,
)

log = logging.getLogger("gpuslice.extender")
JSON = "application/json"


class Handlers:
    """Body bytes in, (HTTP status, body bytes) out: the server-side work of each verb, timed."""

    def __init__(self, state: ExtenderState, metrics: ExtenderMetrics) -> None:
        self.state = state
        self.metrics = metrics

    def _done(self, verb: str, started: float, status: int, doc: Any) -> tuple[int, bytes]:
        body = encode(doc)
        self.metrics.latency.labels(verb).observe(time.perf_counter() - started)
        self.metrics.requests.labels(verb, str(status)).inc()
        return status, body

    def filter(self, body: bytes) -> tuple[int, bytes]:
        started = time.perf_counter()
        try:
            args = parse_extender_args(decode_body(body))
            ask = self.state.describe(args.pod)
        except (WireError, MalformedPod) as e:
            return self._done("filter", started, 400, {"error": str(e)})
        try:
            outcome = self.state.filter(args, ask)
        except Exception as e:  # an internal failure is reported in the wire's Error field
            log.exception("filter failed for pod %s", ask.key)
            return self._done("filter", started, 200, FilterResult(error=f"gpuslice internal error: {e}").to_wire())
        for code, n in outcome.codes.items():
            self.metrics.filter_failures.labels(code).inc(n)
        if outcome.reserved_on is not None:
            self.metrics.reservations.inc()
        return self._done("filter", started, 200, outcome.result.to_wire())

    def prioritize(self, body: bytes) -> tuple[int, bytes]:
        started = time.perf_counter()
        try:
            args = parse_extender_args(decode_body(body))
            ask = self.state.describe(args.pod)
        except (WireError, MalformedPod) as e:
            return self._done("prioritize", started, 400, {"error": str(e)})
        try:
            scores = self.state.prioritize(args, ask)
        except Exception as e:  # HostPriorityList has no error field; scheduler ignores a 500
            log.exception("prioritize failed for pod %s", ask.key)
            return self._done("prioritize", started, 500, {"error": f"gpuslice internal error: {e}"})
        return self._done("prioritize", started, 200, priorities_to_wire(scores))

    def bind(self, body: bytes) -> tuple[int, bytes]:
        started = time.perf_counter()
        try:
            args = parse_binding_args(decode_body(body))
        except WireError as e:
            return self._done("bind", started, 400, {"error": str(e)})
        try:
            outcome = self.state.bind(args)
        except Exception as e:  # an internal failure is reported in the wire's Error field
            log.exception("bind failed for pod %s", args.pod_key)
            return self._done("bind", started, 200, binding_result(f"gpuslice internal error: {e}"))
        if outcome.error:
            self.metrics.bind_failures.labels(_bind_reason(outcome.error)).inc()
        elif outcome.changed and outcome.record is not None:
            self.metrics.placements.labels(outcome.record.product or "other").inc()
        return self._done("bind", started, 200, binding_result(outcome.error))

    def release(self, body: bytes) -> tuple[int, bytes]:
        started = time.perf_counter()
        try:
            uid = parse_release(decode_body(body))
        except WireError as e:
            return self._done("release", started, 400, {"error": str(e)})
        if self.state.release(uid):
            return self._done("release", started, 200, {"released": uid})
        return self._done("release", started, 404, {"error": f"pod uid {uid} holds no slice and is not waiting"})


def _bind_reason(error: str) -> str:
    """A low-cardinality label for a bind error message."""
    for needle, label in (("no longer fits", "NoFit"), ("not known to gpuslice", "UnknownNode"),
                          ("already bound", "AlreadyBound"), ("has not seen pod", "UnknownPod"),
                          ("refuses", "Refused"), ("in progress", "InFlight"), ("failed:", "BinderFailed")):
        if needle in error:
            return label
    return "Other"


def _reply(status: int, body: bytes) -> Response:
    return Response(body, status=status, mimetype=JSON)


def create_app(state: ExtenderState, config: ExtenderConfig | None = None,
               metrics: ExtenderMetrics | None = None) -> Flask:
    """The extender's Flask app over ``state``; ``config`` names the prefix, verbs and body limit."""
    config = config or ExtenderConfig()
    metrics = metrics or ExtenderMetrics(lambda: {**state.gauges(), "ready": state.ready})
    handlers = Handlers(state, metrics)
    app = Flask("gpuslice-extender")
    app.config["MAX_CONTENT_LENGTH"] = config.max_body_bytes
    app.extensions["gpuslice"] = handlers

    def body() -> bytes:
        return request.get_data(cache=False)

    app.add_url_rule(config.verb_path(config.filter_verb), "filter",
                     lambda: _reply(*handlers.filter(body())), methods=["POST"])
    app.add_url_rule(config.verb_path(config.prioritize_verb), "prioritize",
                     lambda: _reply(*handlers.prioritize(body())), methods=["POST"])
    app.add_url_rule(config.verb_path(config.bind_verb), "bind",
                     lambda: _reply(*handlers.bind(body())), methods=["POST"])
    if config.admin_enabled:
        app.add_url_rule("/admin/release", "release", lambda: _reply(*handlers.release(body())), methods=["POST"])

    @app.get("/healthz")
    def healthz() -> Response:
        return _reply(200, b'{"status":"ok"}')

    @app.get("/readyz")
    def readyz() -> Response:
        if state.ready:
            return _reply(200, b'{"status":"ready"}')
        return _reply(503, b'{"status":"not ready"}')

    @app.get("/metrics")
    def metrics_view() -> Response:
        return Response(metrics.exposition(), mimetype="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/state")
    def state_view() -> Response:
        return _reply(200, json.dumps(state.snapshot(), indent=1).encode("utf-8"))

    @app.errorhandler(HTTPException)
    def http_error(e: HTTPException) -> Response:
        return _reply(e.code or 500, encode({"error": f"{e.name}: {e.description}"}))

    return app


def build_app(config: ExtenderConfig) -> Flask:
    """The app for ``config``: standalone today; cluster sync (issue 5) plugs in its own state here."""
    if not config.standalone:
        raise ConfigError("this factory builds the standalone extender; cluster mode is "
                          "extender.cluster.serve:app_from_env()")
    from extender.standalone import build_state

    return create_app(build_state(config), config)


def settle_heap() -> None:
    """Move everything built so far (the ledger, its indexes, the fit views) out of the GC's reach.

    A full collection walks every tracked object: ~200 ms at 5 000 nodes x 8 GPUs, a pause that
    would land on some unlucky filter. The start-up state is long-lived by nature, so it is
    collected once and frozen; objects made later are collected as usual. Call it once per process,
    after the state is built (the cluster sync: after its first full sync).
    """
    gc.collect()
    gc.freeze()


def app_from_env() -> Flask:
    """gunicorn's entry point: ``extender.app:app_from_env()`` reads ``GPUSLICE_*`` settings."""
    app = build_app(ExtenderConfig.from_env())
    settle_heap()
    return app
