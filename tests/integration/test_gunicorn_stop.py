"""A stopping extender leaves at once: SIGTERM closes idle keep-alive connections (HTTP/2 with a GOAWAY).

Before, an idle connection (the API server's webhook client keeps one open after its first call) held the
worker until gunicorn's graceful_timeout killed it: about 10 s with no extender behind the Service, and
in cluster mode a leader that kept its Lease and label that long (issue #26). The answers here are the
protocol's and the log's, never a stopwatch's.
"""

from __future__ import annotations

import re
import signal
import socket
import ssl
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import pytest

from .gunicorn_proc import make_certs, serving_env


def _h2_idle(port: int, ca: Path) -> tuple[ssl.SSLSocket, h2.connection.H2Connection]:
    """An HTTP/2 connection that made one request and now waits, as Go's clients keep theirs."""
    context = ssl.create_default_context(cafile=str(ca))
    context.set_alpn_protocols(["h2"])
    tls = context.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10), server_hostname="127.0.0.1")
    assert tls.selected_alpn_protocol() == "h2"
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    conn.send_headers(1, [(":method", "GET"), (":path", "/healthz"), (":scheme", "https"),
                          (":authority", "127.0.0.1")], end_stream=True)
    tls.sendall(conn.data_to_send())
    ended = False
    while not ended:
        for event in conn.receive_data(tls.recv(65536)):
            ended = ended or isinstance(event, h2.events.StreamEnded)
        tls.sendall(conn.data_to_send())
    return tls, conn


def _http1_idle(port: int, ca: Path) -> ssl.SSLSocket:
    context = ssl.create_default_context(cafile=str(ca))
    tls = context.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10), server_hostname="127.0.0.1")
    tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    reply = b""
    while b"\r\n\r\n" not in reply or not reply.rstrip().endswith(b"}"):
        reply += tls.recv(65536)
    assert b" 200 " in reply.split(b"\r\n", 1)[0]
    return tls


@pytest.mark.timeout(120)
def test_sigterm_closes_idle_connections_at_once_http2_with_a_goaway(tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "tls")
    settings = {"GPUSLICE_NODES": "2", "GPUSLICE_TLS_CERT": str(certs.server[0]),
                "GPUSLICE_TLS_KEY": str(certs.server[1])}
    with serving_env(tmp_path, settings) as server:
        port = server.config.port
        h2_socket, h2_conn = _h2_idle(port, certs.ca)
        http1 = _http1_idle(port, certs.ca)
        server.process.send_signal(signal.SIGTERM)
        goaway = None
        while goaway is None:
            data = h2_socket.recv(65536)  # the socket's 10 s timeout fails the test where nothing comes
            assert data, "the HTTP/2 connection closed without a GOAWAY"
            goaway = next((e for e in h2_conn.receive_data(data) if isinstance(e, h2.events.ConnectionTerminated)),
                          None)
        assert goaway.error_code == 0  # NO_ERROR: a graceful close, the client opens a new connection elsewhere
        assert http1.recv(65536) == b""  # the idle HTTP/1.1 keep-alive connection: closed, not left to time out
        h2_socket.close()  # as a client told so does (Go's closes on a GOAWAY with no stream open)
        http1.close()
        assert server.process.wait(30) == 0
        log = server.log_path.read_text()
        stopped = r"stopping \(extender\): \d+ idle connection\(s\) closed, 0 with a request in flight"
        assert re.search(stopped, log), log[-3000:]
        assert "Waiting for" not in log and "Forcing close" not in log, log[-3000:]
