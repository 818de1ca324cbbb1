"""The HTTP face of the extender: a Flask app factory over one ``ExtenderState``.

Routes (verbs and prefix configurable): ``POST /filter``, ``POST /prioritize``, ``POST /bind``,
``GET /healthz``, ``GET /readyz`` (the state's ``ready`` flag and ledger epoch), ``GET /metrics``
(Prometheus), ``GET /state`` (the ledger and the queue, read-only), ``GET /history?since=`` (the
demand history, JSON Lines, ``extender/history``) and, in standalone mode, ``POST /admin/release``
``{"PodUID": "..."}``.

Who may ask (``access``): ``/state``, ``/history``, ``/metrics`` and ``/admin/*`` answer a client on a loopback
address, or one that presented a verified client certificate on the allow-list; with
``require_client_cert`` the scheduler verbs need such a certificate too. Probes (``/healthz``,
``/readyz``) answer anyone. Every POST must be ``application/json`` (415 otherwise), which keeps a
browser's cross-site form or simple request from changing anything.

Bad input gets a 4xx JSON error and changes nothing: bodies are parsed, capped (413 for a body or a
node list over its limit) and validated before the state's lock is taken. Decisions answer 200 in
the wire format (a pod that fits nowhere gets reasons, not an error); ``Error`` is only set for an
internal failure, after the state has undone whatever that request changed. gunicorn serves it
(``extender/gunicorn_conf.py``); a request slower than ``slow_request_s`` is logged with its phases.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import threading
import time
from collections.abc import Callable, Collection, Mapping
from typing import Any

from flask import Flask, Response, request
from werkzeug.exceptions import HTTPException

from extender.config import ConfigError, ExtenderConfig, Subject, parse_subject
from extender.heap import settle_heap
from extender.history.book import DemandBook
from extender.metrics import ExtenderMetrics, watch_gc
from extender.state import ExtenderState
from extender.timing import Phases, measuring, phase
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
from packing.asks import ClaimUnavailable, MalformedPod
from packing.demand import parse_since

log = logging.getLogger("gpuslice.extender")
# app.extensions the gunicorn worker reads (extender/worker.py): an Event it sets on SIGTERM (/healthz then
# answers 503), and what it runs at once then (cluster mode: leave the Service, give the Lease up)
STOPPING = "gpuslice-stopping"
STOP_HOOK = "gpuslice-on-stop"
JSON = "application/json"
CLIENT_SUBJECT = "gpuslice.client_subject"  # environ: the verified client certificate's subject (the server front)
STARTED = "gpuslice.started"  # environ: perf_counter when the request's headers arrived
FRONT_PHASES = "gpuslice.phases"  # environ: {"read": s, "queued": s} measured by the server front


class Handlers:
    """Body bytes in, (HTTP status, body bytes) out: the server-side work of each verb, timed by phase."""

    def __init__(self, state: ExtenderState, metrics: ExtenderMetrics, config: ExtenderConfig | None = None) -> None:
        self.state = state
        self.metrics = metrics
        self.config = config or ExtenderConfig()
        # verb -> the answer while this extender may not decide (cluster: rebuilding, or a standby); None: serve
        self.unready: Callable[[str], tuple[int, Any] | None] = lambda verb: None

    def _done(self, phases: Phases, status: int, doc: Any, who: str = "") -> tuple[int, bytes]:
        with phase("encode"):
            body = encode(doc)
        self.record(phases, status, who)
        return status, body

    def record(self, phases: Phases, status: int, who: str = "") -> None:
        """Count a finished request, observe its latency and phases, and log it when slow."""
        record_request(self.metrics, self.config, phases, status, who)

    def filter(self, body: bytes, phases: Phases | None = None) -> tuple[int, bytes]:
        with measuring(phases or Phases("filter", time.perf_counter())) as p:
            refused = self.unready("filter")
            if refused is not None:
                return self._done(p, *refused)
            try:
                with phase("parse"):
                    args = parse_extender_args(decode_body(body), self.config.max_nodes)
                    ask = self.state.describe(args.pod)
            except (WireError, MalformedPod) as e:
                return self._done(p, _status(e), {"error": str(e)})
            except ClaimUnavailable as e:  # kube-scheduler retries the pod with backoff
                unread = FilterResult(error=f"gpuslice cannot read the pod's claim now: {e}")
                return self._done(p, 200, unread.to_wire())
            try:
                outcome = self.state.filter(args, ask)
            except Exception as e:  # the state undid the request's changes; the wire's Error says so
                log.exception("filter failed for pod %s", ask.key)
                return self._done(p, 200, FilterResult(error=f"gpuslice internal error: {e}").to_wire(), ask.key)
            for code, n in outcome.codes.items():
                self.metrics.filter_failures.labels(code).inc(n)
            if outcome.reserved_on is not None:
                self.metrics.reservations.inc()
            return self._done(p, 200, outcome.result.to_wire(), ask.key)

    def prioritize(self, body: bytes, phases: Phases | None = None) -> tuple[int, bytes]:
        with measuring(phases or Phases("prioritize", time.perf_counter())) as p:
            refused = self.unready("prioritize")
            if refused is not None:
                return self._done(p, *refused)
            try:
                with phase("parse"):
                    args = parse_extender_args(decode_body(body), self.config.max_nodes)
                    ask = self.state.describe(args.pod)
            except (WireError, MalformedPod) as e:
                return self._done(p, _status(e), {"error": str(e)})
            except ClaimUnavailable as e:  # HostPriorityList has no error field: kube-scheduler sees a 503
                return self._done(p, 503, {"error": f"gpuslice cannot read the pod's claim now: {e}"})
            try:
                scores = self.state.prioritize(args, ask)
            except Exception as e:  # the state undid the request's changes; a 500 is all this verb can say
                log.exception("prioritize failed for pod %s", ask.key)
                return self._done(p, 500, {"error": f"gpuslice internal error: {e}"}, ask.key)
            return self._done(p, 200, priorities_to_wire(scores), ask.key)

    def bind(self, body: bytes, phases: Phases | None = None) -> tuple[int, bytes]:
        with measuring(phases or Phases("bind", time.perf_counter())) as p:
            refused = self.unready("bind")
            if refused is not None:
                return self._done(p, *refused)
            try:
                with phase("parse"):
                    args = parse_binding_args(decode_body(body))
            except WireError as e:
                return self._done(p, _status(e), {"error": str(e)})
            try:
                outcome = self.state.bind(args)
            except Exception as e:  # the state undid the request's changes; the wire's Error says so
                log.exception("bind failed for pod %s", args.pod_key)
                return self._done(p, 200, binding_result(f"gpuslice internal error: {e}"), args.pod_key)
            if not outcome.ok:
                self.metrics.bind_failures.labels(outcome.code.value).inc()
            elif outcome.changed and outcome.record is not None:
                self.metrics.placements.labels(outcome.record.product or "other").inc()
            return self._done(p, 200, binding_result(outcome.error), args.pod_key)

    def release(self, body: bytes, phases: Phases | None = None) -> tuple[int, bytes]:
        with measuring(phases or Phases("release", time.perf_counter())) as p:
            try:
                with phase("parse"):
                    uid = parse_release(decode_body(body))
            except WireError as e:
                return self._done(p, _status(e), {"error": str(e)})
            if self.state.release(uid):
                return self._done(p, 200, {"released": uid})
            return self._done(p, 404, {"error": f"pod uid {uid} holds no slice and is not waiting"})


def record_request(metrics: ExtenderMetrics, config: ExtenderConfig, phases: Phases, status: int,
                   who: str = "") -> None:
    """Count a finished request, observe its latency and phases, and log it when slow."""
    verb = phases.verb
    total = phases.total()
    metrics.latency.labels(verb).observe(total)
    metrics.requests.labels(verb, str(status)).inc()
    for name, seconds in phases.seconds.items():
        metrics.phases.labels(verb, name).observe(seconds)
    if total > config.slow_request_s:
        metrics.slow.labels(verb).inc()
        log.warning("slow %s%s: %.0f ms, HTTP %d (%s)", verb, f" of {who}" if who else "", total * 1000,
                    status, phases.describe())


def _status(e: Exception) -> int:
    return e.status if isinstance(e, WireError) else 400


def _reply(status: int, body: bytes) -> Response:
    return Response(body, status=status, mimetype=JSON)


def _error(status: int, message: str) -> Response:
    return _reply(status, encode({"error": message}))


def request_phases(verb: str, environ: Mapping[str, Any]) -> Phases:
    """A request's phases, begun when its headers arrived (what the server front measured comes first)."""
    phases = Phases(verb, environ.get(STARTED) or time.perf_counter())
    for name, seconds in (environ.get(FRONT_PHASES) or {}).items():
        phases.add(name, seconds)
    return phases


class Access:
    """Who may reach which routes (see the module docstring)."""

    def __init__(self, config: ExtenderConfig) -> None:
        self.require_cert = config.require_client_cert
        self.allowed: tuple[Subject, ...] = tuple(parse_subject(s) for s in config.client_subjects)
        self.metrics_only: tuple[Subject, ...] = tuple(parse_subject(s) for s in config.metrics_subjects)

    @staticmethod
    def loopback(environ: Mapping[str, Any]) -> bool:
        try:
            return ipaddress.ip_address(str(environ.get("REMOTE_ADDR") or "")).is_loopback
        except ValueError:
            return False

    def subject_ok(self, subject: Subject) -> bool:
        held = set(subject)
        return not self.allowed or any(set(entry) <= held for entry in self.allowed)

    def refusal(self, environ: Mapping[str, Any], operator: bool, path: str = "") -> str | None:
        """Why this request may not go on (None: it may)."""
        subject: Subject | None = environ.get(CLIENT_SUBJECT)
        if subject is not None and not self.subject_ok(subject):
            if any(set(entry) <= set(subject) for entry in self.metrics_only):
                return None if path == "/metrics" else f"client certificate subject {_show(subject)} may read " \
                    "/metrics only"
            return f"client certificate subject {_show(subject)} is not on this extender's allow-list"
        if operator and subject is None and not self.loopback(environ):
            return "this route answers only over loopback or to an allowed client certificate"
        if not operator and self.require_cert and subject is None:
            return "this extender requires a client certificate signed by its client CA"
        return None


Answer = tuple[int, bytes]  # HTTP status, JSON body
Handler = Callable[[bytes, Phases], Answer]


class HotRoutes:
    """The POST routes of every pod (the scheduler verbs, the admission webhook), served by the server
    front (``extender.front``) straight from the body bytes, without building a WSGI request or passing
    through Flask; the Flask app's views for the same paths call the same ``serve``, so both ways
    apply the same rules (who may ask, ``application/json`` only) and give the same answers."""

    def __init__(self, app: Flask, access: Access) -> None:
        self.app = app
        self.access = access
        self.routes: dict[str, tuple[str, Handler, bool]] = {}  # path -> (verb, handler, who-may-ask applies)
        self._inline: dict[str, Callable[[bytes], bool]] = {}  # path -> does this body need no thread?

    def mount(self, path: str, verb: str, handler: Handler, checked: bool = True,
              inline: Callable[[bytes], bool] | None = None) -> None:
        """Serve ``POST path`` with ``handler``; ``checked``: only clients ``Access`` lets ask the verbs;
        ``inline(body)`` True: the handler does no I/O for this body and takes well under a millisecond, so
        the front may answer it on its event loop instead of handing it to a thread (two thread switches)."""
        self.routes[path] = (verb, handler, checked)
        if inline is not None:
            self._inline[path] = inline
        self.app.add_url_rule(path, verb, lambda: _reply(*self.serve(
            path, request.content_type or "", request.get_data(cache=False), request.environ)), methods=["POST"])

    def __contains__(self, path: object) -> bool:
        return path in self.routes

    def inline(self, path: str, body: bytes) -> bool:
        """May the front answer this request on its event loop (``mount``'s ``inline``)?"""
        check = self._inline.get(path)
        return check is not None and check(body)

    def serve(self, path: str, content_type: str, body: bytes, environ: Mapping[str, Any]) -> Answer:
        """One request to a mounted path (``environ``: at least ``REMOTE_ADDR``, and what the front adds)."""
        verb, handler, checked = self.routes[path]
        if checked:
            why = self.access.refusal(environ, False)
            if why is not None:
                return 403, encode({"error": why})
        mimetype = content_type.split(";", 1)[0].strip().lower()
        if mimetype != JSON:
            return 415, encode({"error": f"POST {path} takes {JSON}, not {mimetype or 'a body without a type'}"})
        return handler(body, request_phases(verb, environ))


def _show(subject: Subject) -> str:
    short = {"commonName": "CN", "organizationName": "O", "organizationalUnitName": "OU"}
    return "/" + "/".join(f"{short.get(k, k)}={v}" for k, v in subject)


def serving_app(name: str, config: ExtenderConfig, metrics: ExtenderMetrics, verbs: Collection[str] = ()) -> Flask:
    """A Flask app with what every gpuslice server answers the same way: who may ask (``Access``, for
    the scheduler ``verbs`` and the operator routes), ``application/json`` POSTs only, ``/healthz``,
    ``/metrics``, errors as JSON; and its ``HotRoutes`` (``app.extensions["gpuslice-hot"]``)."""
    access = Access(config)
    app = Flask(name)
    app.config["MAX_CONTENT_LENGTH"] = config.max_body_bytes
    hot = HotRoutes(app, access)
    app.extensions["gpuslice-hot"] = hot

    @app.before_request
    def guard() -> Response | None:
        path = request.path
        if request.method == "POST" and path in hot:
            return None  # HotRoutes.serve applies the same rules
        operator = path in ("/state", "/metrics", "/history") or path.startswith("/admin/")
        if operator or path in verbs:
            why = access.refusal(request.environ, operator, path)
            if why is not None:
                return _error(403, why)
        if request.method == "POST" and request.url_rule is not None and request.mimetype != JSON:
            return _error(415, f"POST {path} takes {JSON}, not {request.mimetype or 'a body without a type'}")
        return None

    stopping = app.extensions.setdefault(STOPPING, threading.Event())  # set by the worker on SIGTERM

    @app.post("/admin/leave")
    def leave() -> Response:
        """The pod's preStop hook (`gpuslice leave`): stop being ready and give leadership up now, while the
        process still serves what is routed to it until the Service's endpoints have dropped the pod."""
        stopping.set()
        hook = app.extensions.get(STOP_HOOK)
        if hook is not None:
            hook()
        log.info("left: /healthz answers 503 stopping%s", ", leadership given up" if hook is not None else "")
        return _reply(200, b'{"status":"stopping"}')

    @app.get("/healthz")
    def healthz() -> Response:
        if stopping.is_set():  # leave the Service's endpoints at once: the process is going
            return _reply(503, b'{"status":"stopping"}')
        return _reply(200, b'{"status":"ok"}')

    @app.get("/metrics")
    def metrics_view() -> Response:
        return Response(metrics.exposition(), mimetype="text/plain; version=0.0.4; charset=utf-8")

    @app.errorhandler(HTTPException)
    def http_error(e: HTTPException) -> Response:
        return _error(e.code or 500, f"{e.name}: {e.description}")

    return app


def create_app(state: ExtenderState, config: ExtenderConfig | None = None,
               metrics: ExtenderMetrics | None = None) -> Flask:
    """The extender's Flask app over ``state``; ``config`` names the prefix, verbs, limits and access."""
    config = config or ExtenderConfig()
    metrics = metrics or ExtenderMetrics(state.gauges)
    handlers = Handlers(state, metrics, config)
    paths = [config.verb_path(v) for v in (config.filter_verb, config.prioritize_verb, config.bind_verb)]
    app = serving_app("gpuslice-extender", config, metrics, paths)
    app.extensions["gpuslice"] = handlers
    hot: HotRoutes = app.extensions["gpuslice-hot"]
    for path, verb, handler in zip(paths, ("filter", "prioritize", "bind"),
                                   (handlers.filter, handlers.prioritize, handlers.bind), strict=True):
        hot.mount(path, verb, handler)
    if config.admin_enabled:
        app.add_url_rule("/admin/release", "release", lambda: _reply(*handlers.release(
            request.get_data(cache=False), request_phases("release", request.environ))), methods=["POST"])

    @app.get("/readyz")
    def readyz() -> Response:
        if state.ready:
            return _reply(200, encode({"status": "ready", "epoch": state.epoch}))
        why = state.cache.broken or "not ready"
        return _reply(503, encode({"status": "not ready", "epoch": state.epoch, "reason": why}))

    @app.get("/state")
    def state_view() -> Response:
        return _reply(200, json.dumps(state.snapshot(), indent=1).encode("utf-8"))

    @app.get("/history")
    def history_view() -> Response:
        return Response(*history_answer(state.history, request.args.get("since")))

    return app


def history_answer(book: DemandBook | None, since: str | None) -> tuple[bytes, int, dict[str, str]]:
    """``GET /history?since=``: the demand history as JSON Lines (``packing.demand``), or why not."""
    if book is None:
        return encode({"error": "this extender keeps no demand history (started with --no-history)"}), 404, \
            {"Content-Type": JSON}
    try:
        start = None if since in (None, "") else parse_since(since, time.time())
    except ValueError as e:
        return encode({"error": str(e)}), 400, {"Content-Type": JSON}
    return book.export(start), 200, {"Content-Type": "application/x-ndjson"}


def build_app(config: ExtenderConfig) -> Flask:
    """The standalone app for ``config`` (cluster mode is ``extender.cluster.serve:app_from_env()``)."""
    if not config.standalone:
        raise ConfigError("this factory builds the standalone extender; cluster mode is "
                          "extender.cluster.serve:app_from_env()")
    from extender.standalone import build_state

    return create_app(build_state(config), config)


def app_from_env() -> Flask:
    """gunicorn's entry point: ``extender.app:app_from_env()`` reads ``GPUSLICE_*`` settings."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    watch_gc()
    app = build_app(ExtenderConfig.from_env())
    settle_heap()
    return app
