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
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gunicorn.asgi.protocol import ASGIProtocol
from gunicorn.workers import gasgi

from extender.config import ExtenderConfig, Subject
from extender.front import SUBJECT_EXTENSION, WsgiFront
from extender.metrics import CONNECTIONS


class PeerProtocol(ASGIProtocol):  # type: ignore[misc]
    """gunicorn's HTTP/1.1 and HTTP/2 protocol, plus the verified client certificate's subject in every scope."""

    _looked = False  # the peer certificate is read once per connection
    _subject: Subject | None = None

    def connection_made(self, transport: Any) -> None:
        CONNECTIONS.accepted += 1
        super().connection_made(transport)

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


def assign_role(worker: Any, alive: Iterable[Any], webhook: bool) -> None:
    """Give ``worker`` the role no worker of ``alive`` has: the extender's first, the webhook's when ``webhook``."""
    taken = {getattr(w, "role", EXTENDER) for w in alive}
    worker.role = WEBHOOK if webhook and EXTENDER in taken and WEBHOOK not in taken else EXTENDER


class ExtenderWorker(gasgi.ASGIWorker):  # type: ignore[misc]
    """One asyncio worker: the event loop reads requests, ``threads`` threads decide."""

    role = EXTENDER  # set by the master before the fork (``assign_role``)

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
            self.asgi = WsgiFront(app, WEBHOOK_THREADS, config.max_body_bytes, config.body_timeout_s,
                                  bind_threads=1, hot=app.extensions["gpuslice-hot"])
            return
        app = self.app.wsgi()
        hot = app.extensions.get("gpuslice-hot") if hasattr(app, "extensions") else None
        self.asgi = WsgiFront(app, config.threads, config.max_body_bytes, config.body_timeout_s,
                              config.verb_path(config.bind_verb), config.bind_threads, hot)
