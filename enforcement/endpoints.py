"""``/healthz`` and ``/metrics`` for the kubelet's probes and Prometheus, on a stdlib HTTP server.

Two read-only endpoints do not justify a WSGI stack in a privileged DaemonSet: a threading
``http.server`` in a daemon thread serves them, and the agent loop never waits on it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST

Health = Callable[[], tuple[bool, str]]
Metrics = Callable[[], bytes]


def _handler(health: Health, metrics: Metrics) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/healthz":
                ok, reason = health()
                self._send(200 if ok else 503, "text/plain; charset=utf-8", (reason + "\n").encode())
            elif path == "/metrics":
                self._send(200, CONTENT_TYPE_LATEST, metrics())
            else:
                self._send(404, "text/plain; charset=utf-8", b"not found: try /healthz or /metrics\n")

        def _send(self, code: int, content_type: str, body: bytes) -> None:
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # probes every few seconds would drown the agent's own log

    return Handler


class Endpoints:
    """The HTTP server; ``port`` 0 picks a free port (see :attr:`address`)."""

    def __init__(self, host: str, port: int, health: Health, metrics: Metrics) -> None:
        self.server = ThreadingHTTPServer((host, port), _handler(health, metrics))
        self.server.daemon_threads = True
        self._thread = threading.Thread(target=self.server.serve_forever, name="gpuslice-http", daemon=True)

    @property
    def address(self) -> tuple[str, int]:
        host, port = self.server.server_address[:2]
        return str(host), int(port)

    def start(self) -> Endpoints:
        self._thread.start()
        return self

    def close(self) -> None:
        if self._thread.is_alive():  # shutdown() waits for serve_forever(), which never ran otherwise
            self.server.shutdown()
        self.server.server_close()
