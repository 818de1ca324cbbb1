"""The gunicorn worker of the extender: gunicorn's asyncio worker serving the Flask app through the front.

``ExtenderWorker`` wraps the WSGI app that the entry point builds in ``extender.front.WsgiFront``
(whole requests only reach the worker threads), and its connections put the subject of the client
certificate the TLS layer verified into each request's scope, where the app's access rules read it.
Used as ``worker_class`` in ``extender/gunicorn_conf.py``.
"""

from __future__ import annotations

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


class ExtenderWorker(gasgi.ASGIWorker):  # type: ignore[misc]
    """One asyncio worker: the event loop reads requests, ``threads`` threads decide."""

    def init_process(self) -> None:
        gasgi.ASGIProtocol = PeerProtocol  # the stock worker builds each connection from this module name
        super().init_process()

    def load_wsgi(self) -> None:
        config = ExtenderConfig.from_env()
        app = self.app.wsgi()
        hot = app.extensions.get("gpuslice-hot") if hasattr(app, "extensions") else None
        self.asgi = WsgiFront(app, config.threads, config.max_body_bytes, config.body_timeout_s,
                              config.verb_path(config.bind_verb), config.bind_threads, hot)
