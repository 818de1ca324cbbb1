"""``gpuslice serve --cluster --webhook-port``: the admission webhook from a gunicorn worker of its own.

A real gunicorn master with two workers, against an API server that cannot be reached: the extender's
worker never gets its ledger (not ready), yet the webhook's worker answers at once, since it needs no
ledger and no leadership; each worker serves only its own port; a worker that dies is replaced in its
own role; the preStop leave stops the extender's worker only, and SIGTERM stops both at once.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from extender.client import ClientError, ExtenderClient
from extender.samples import pod
from extender.server import free_port
from packing.gate import GATE

from .gunicorn_proc import children

UNREACHABLE = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
"""


def review(p: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "r-1", "kind": {"kind": "Pod"}, "operation": "CREATE", "object": p}}


def answers(client: ExtenderClient) -> bool:
    try:
        return client.get("/healthz")[0] == 200
    except ClientError:
        return False


def wait(what: str, check: Any, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], ExtenderClient, ExtenderClient, Path]]:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(UNREACHABLE)
    port, webhook_port = free_port(), free_port()
    log_path = tmp_path / "serve.log"
    env = {**os.environ, "HOME": str(tmp_path), "GPUSLICE_KUBECONFIG": str(kubeconfig), "GPUSLICE_LEADER_ELECT": "0"}
    argv = [sys.executable, "-m", "packing.cli", "serve", "--cluster", "--port", str(port),
            "--webhook-port", str(webhook_port)]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
    extender = ExtenderClient(f"http://127.0.0.1:{port}", timeout=5)
    webhook = ExtenderClient(f"http://127.0.0.1:{webhook_port}", timeout=5)
    try:
        wait("both workers", lambda: answers(extender) and answers(webhook))
        yield proc, extender, webhook, log_path
    except BaseException:
        print(log_path.read_text(errors="replace")[-6000:])
        raise
    finally:
        extender.close()
        webhook.close()
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
        assert code == 0, log_path.read_text(errors="replace")[-4000:]


def test_the_webhook_answers_from_its_own_worker_without_a_ledger(
        serve: tuple[subprocess.Popen[bytes], ExtenderClient, ExtenderClient, Path]) -> None:
    proc, extender, webhook, _ = serve
    assert len(children(proc.pid)) == 2, "one worker owns the ledger, one serves the webhook"
    assert extender.get("/readyz")[0] == 503, "the extender cannot rebuild its ledger from an unreachable API"
    assert webhook.get("/readyz")[0] == 200, "the webhook needs no ledger: ready as soon as it serves"
    status, doc = webhook.post("/mutate", review(pod("p", "v100-25")))
    assert status == 200 and doc["response"]["allowed"] is True
    ops = json.loads(base64.b64decode(doc["response"]["patch"]))
    assert {"op": "add", "path": "/spec/schedulingGates", "value": [{"name": GATE}]} in ops
    status, doc = webhook.post("/mutate", review(pod("q", "v100-33")))  # a product the catalog does not offer
    assert status == 200 and doc["response"]["allowed"] is False and "v100-33" in doc["response"]["status"]["message"]
    # each worker serves its own port only
    assert extender.post("/mutate", review(pod("p", "v100-25")))[0] == 404
    assert webhook.post("/filter", {"Pod": pod("p", "v100-25"), "NodeNames": ["n1"]})[0] == 404
    status, raw = webhook.request_raw("GET", "/metrics")  # loopback may read it
    assert status == 200 and 'gpuslice_extender_requests_total{code="200",verb="webhook"} 2.0' in raw.decode()


def test_a_dead_worker_is_replaced_in_its_own_role(
        serve: tuple[subprocess.Popen[bytes], ExtenderClient, ExtenderClient, Path]) -> None:
    proc, extender, webhook, _ = serve
    for both in (False, True):  # the webhook's worker (spawned second), then both at once
        workers = children(proc.pid)
        victims = workers if both else workers[-1:]
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        wait("the replacement workers", lambda v=victims: len([w for w in children(proc.pid) if w not in v]) == 2)
        wait("both ports to answer again", lambda: answers(extender) and answers(webhook))
        assert webhook.get("/readyz")[0] == 200 and extender.get("/readyz")[0] == 503
        assert webhook.post("/mutate", review(pod("p", "v100-25")))[0] == 200
        assert extender.post("/mutate", review(pod("p", "v100-25")))[0] == 404


def test_the_webhook_answers_through_the_leave_and_closes_its_idle_connections_on_sigterm(
        serve: tuple[subprocess.Popen[bytes], ExtenderClient, ExtenderClient, Path]) -> None:
    proc, extender, webhook, log_path = serve
    assert extender.post("/admin/leave", {})[0] == 200  # the preStop hook (gpuslice leave)
    assert extender.get("/healthz")[0] == 503, "left: the pod goes out of the Services' endpoints"
    # the window while the endpoints drop the pod: the webhook still admits, as every other replica does
    status, doc = webhook.post("/mutate", review(pod("p", "v100-25")))
    assert status == 200 and doc["response"]["allowed"] is True
    assert webhook.get("/healthz")[0] == 200
    idle = socket.create_connection(("127.0.0.1", webhook.port), timeout=10)  # kube-apiserver keeps one alive
    idle.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    reply = b""
    while not reply.rstrip().endswith(b"}"):
        reply += idle.recv(65536)
    assert b" 200 " in reply.split(b"\r\n", 1)[0]
    extender.close()
    webhook.close()
    proc.send_signal(signal.SIGTERM)
    assert idle.recv(65536) == b"", "the idle keep-alive connection: closed at once, not left to graceful_timeout"
    idle.close()
    assert proc.wait(30) == 0
    log = log_path.read_text(errors="replace")
    assert re.search(r"stopping \(webhook\): [1-9]\d* idle connection\(s\) closed, 0 with a request in flight", log), \
        log[-3000:]
    assert "Waiting for" not in log and "Forcing close" not in log, log[-3000:]
