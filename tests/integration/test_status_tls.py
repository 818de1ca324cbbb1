"""``gpuslice status`` against an HTTPS server with real certificates: it reads /state when the CA and
the name check out, and says which flag to fix when they do not (the e2e suite runs it against the
deployed extender with the chart's settings)."""

from __future__ import annotations

import json
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from extender.cli import status_main

from .gunicorn_proc import Certs, make_certs

STATE = {"mode": "strict", "policy": "best-fit", "ready": True, "epoch": 3, "reservation_ttl_s": 30.0,
         "durable": True, "free_slices": {"v100-25": 4}, "nodes": [], "allocations": [], "queue": []}


class _State(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = json.dumps(STATE).encode()
        self.send_response(200 if self.path == "/state" else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certs:
    return make_certs(tmp_path_factory.mktemp("tls"))


@pytest.fixture(scope="module")
def url(certs: Certs) -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _State)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(str(certs.server[0]), str(certs.server[1]))
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"https://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_status_reads_state_over_https_with_the_ca(url: str, certs: Certs, capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GPUSLICE_STATUS_URL", raising=False)
    assert status_main(["--url", url, "--ca", str(certs.ca)]) == 0
    assert capsys.readouterr().out.startswith("mode strict, policy best-fit, ready; ledger built ")


@pytest.mark.parametrize(("flags", "hint"), [
    ([], "--ca ca.crt, the CA of the Secret gpuslice-extender-tls"),
    (["--server-name", "someone-else.svc"], "--server-name gpuslice-extender.gpuslice-system.svc"),
])
def test_status_says_which_flag_a_tls_failure_needs(url: str, certs: Certs, flags: list[str], hint: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    ca = [] if not flags else ["--ca", str(certs.ca)]
    assert status_main(["--url", url, *ca, *flags]) == 1
    err = capsys.readouterr().err
    assert err.startswith("gpuslice status: GET /state on 127.0.0.1:") and hint in err, err


def test_status_names_the_ca_that_did_not_sign_it(url: str, certs: Certs,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    other = certs.ca.parent / "other-ca.crt"
    assert status_main(["--url", url, "--ca", str(other)]) == 1
    assert f"the certificate is not signed by {other}" in capsys.readouterr().err
