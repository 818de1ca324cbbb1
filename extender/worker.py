"""The gunicorn worker of the extender: gunicorn's asyncio worker serving the Flask app through the front.

``ExtenderWorker`` wraps the WSGI app that the entry point builds in ``extender.front.WsgiFront``
(whole requests only reach the worker threads), and its connections put the subject of the client
certificate the TLS layer verified into each request's scope, where the app's access rules read it.
Used as ``worker_class`` in ``extender/gunicorn_conf.py``.

Each worker has a role: ``extender`` (the ledger, the scheduler verbs, the queue; the entry point's
app, on ``--port``) or, with ``--webhook-port``, ``webhook`` (the admission webhook alone, on that
port: ``extender.cluster.webhook_app``). The master gives a new worker the role no live worker has
(``assign_role``, from ``pre_fork``), so a worker that dies is replaced in its own role; each worker
serves only its role's listener (the master holds both, so connections wait in the backlog while a
worker restarts rather than being refused).

On SIGTERM (a pod deleted, a rollout, a drain) each worker stops at once rather than after the last
client leaves: ``/healthz`` answers 503 ``stopping``, the app's stop hook runs (the extender's, cluster
mode: the leader label removed, the Lease given up, so the standby takes over without waiting it out;
the webhook's has none: it holds no leadership), and every idle connection is closed (HTTP/2: a GOAWAY
first), so that an idle keep-alive connection (the API server's webhook client keeps one) no longer
holds the process until ``graceful_timeout``. Requests in flight finish; their connections close after
them. ``gpuslice leave`` (the preStop hook, before SIGTERM) touches only the extender's role: the
webhook worker answers on until SIGTERM, as the other replicas do.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Any

from gunicorn.asgi.protocol import ASGIProtocol
from gunicorn.workers import gasgi

from extender.app import STOP_HOOK, STOPPING
from extender.config import ExtenderConfig, Subject
from extender.front import SUBJECT_EXTENSION, WsgiFront
from extender.metrics import CONNECTIONS


class PeerProtocol(ASGIProtocol):  # type: ignore[misc]
    """gunicorn's HTTP/1.1 and HTTP/2 protocol, plus the verified client certificate's subject in every scope."""

    _looked = False  # the peer certificate is read once per connection
    _subject: Subject | None = None

    def connection_made(self, transport: Any) -> None:
        CONNECTIONS.accepted += 1
        LIVE.add(self)
        super().connection_made(transport)

    def close_if_idle(self) -> bool:
        """Stopping: close this connection now unless a request is in flight on it (True when closed)."""
        h2 = getattr(self, "_h2_conn", None)
        if h2 is not None:  # HTTP/2: GOAWAY, then the connection's loop ends and closes the transport
            if self._h2_tasks or h2.streams or h2.is_closed:
                return False
            self.worker.loop.create_task(h2.close())
            return True
        if getattr(self, "_awaiting_request", False) and not self._finishing_calls:  # HTTP/1.1 keep-alive
            self._keepalive_timeout()  # closes the transport and wakes the connection's loop
            return True
        return False

    def _build_http_scope(self, request: Any, sockname: Any, peername: Any) -> dict[str, Any]:
        return self._with_subject(super()._build_http_scope(request, sockname, peername))

    def _build_http2_scope(self, request: Any, sockname: Any, peername: Any) -> dict[str, Any]:
        return self._with_subject(super()._build_http2_scope(request, sockname, peername))

    def _with_subject(self, scope: dict[str, Any]) -> dict[str, Any]:
        subject = self._client_subject()
        if subject is not None:
            scope.setdefault("extensions", {})[SUBJECT_EXTENSION] = subject
        return scope

    def _client_subject(self) -> Subject | None:
        if not self._looked:
            self._looked = True
            ssl_object = self.transport.get_extra_info("ssl_object") if self.transport is not None else None
            cert = ssl_object.getpeercert() if ssl_object is not None else None
            # with a client CA, TLS verified any certificate presented; without one, none was asked for
            if cert:
                self._subject = tuple((k, v) for rdn in cert.get("subject", ()) for k, v in rdn)
        return self._subject


EXTENDER, WEBHOOK = "extender", "webhook"
WEBHOOK_THREADS = 4  # the webhook's work is a few milliseconds of parsing: a few threads keep up with a burst
LIVE: weakref.WeakSet[PeerProtocol] = weakref.WeakSet()  # the connections open now (the event loop's thread)


def assign_role(worker: Any, alive: Iterable[Any], webhook: bool) -> None:
    """Give ``worker`` the role no worker of ``alive`` has: the extender's first, the webhook's when ``webhook``."""
    taken = {getattr(w, "role", EXTENDER) for w in alive}
    worker.role = WEBHOOK if webhook and EXTENDER in taken and WEBHOOK not in taken else EXTENDER


class ExtenderWorker(gasgi.ASGIWorker):  # type: ignore[misc]
    """One asyncio worker: the event loop reads requests, ``threads`` threads decide."""

    role = EXTENDER  # set by the master before the fork (``assign_role``)
    _on_stop: Callable[[], None] | None = None
    _stopping: threading.Event | None = None
    _stopped = False

    def handle_exit_signal(self) -> None:
        super().handle_exit_signal()  # not alive: the serving loop ends, no keep-alive after a response
        self.begin_stop()

    def begin_stop(self) -> None:
        """Leave at once (see the module doc); in-flight requests finish."""
        if self._stopped:
            return
        self._stopped = True
        if self._stopping is not None:
            self._stopping.set()
        if self._on_stop is not None:  # API calls: off the event loop, and the process waits for them at exit
            threading.Thread(target=self._on_stop, name="stop-hook", daemon=False).start()
        closed = sum(1 for c in list(LIVE) if c.worker is self and c.close_if_idle())
        self.log.info("stopping (%s): %d idle connection(s) closed, %d with a request in flight", self.role,
                      closed, max(0, self.nr_conns - closed))

    def init_process(self) -> None:
        gasgi.ASGIProtocol = PeerProtocol  # the stock worker builds each connection from this module name
        config = ExtenderConfig.from_env()
        if config.webhook_port:  # each role serves its own listener
            listeners: list[Any] = getattr(self, "sockets")  # noqa: B009 (gunicorn sets it untyped)
            mine = [s for s in listeners if (s.getsockname()[1] == config.webhook_port) == (self.role == WEBHOOK)]
            if not mine:
                raise RuntimeError(f"no listener for the {self.role} worker among {listeners}")
            self.sockets = mine
            if self.role == WEBHOOK:
                # HTTP/1.1 only: kube-apiserver keeps a connection per concurrent call alive, and each call cost
                # 1.5 ms in the server and 1.5 ms CPU per pod over it, against 4.3 ms and 2.0 ms over HTTP/2
                # (500 creations, 16 at a time: tests/bench/bench_e2e.py's machine, extender/README.md)
                self.cfg.set("http_protocols", "h1")
        super().init_process()

    def load_wsgi(self) -> None:
        config = ExtenderConfig.from_env()
        if self.role == WEBHOOK:
            from extender.cluster.webhook_app import app_from_env

            app = app_from_env()
            self._stopping = app.extensions.get(STOPPING)  # /healthz 503 on SIGTERM; no stop hook: no leadership
            self.asgi = WsgiFront(app, WEBHOOK_THREADS, config.max_body_bytes, config.body_timeout_s,
                                  bind_threads=1, hot=app.extensions["gpuslice-hot"])
            return
        app = self.app.wsgi()
        extensions = app.extensions if hasattr(app, "extensions") else {}
        hot = extensions.get("gpuslice-hot")
        self._on_stop = extensions.get(STOP_HOOK)
        self._stopping = extensions.get(STOPPING)
        self.asgi = WsgiFront(app, config.threads, config.max_body_bytes, config.body_timeout_s,
                              config.verb_path(config.bind_verb), config.bind_threads, hot)
