"""gunicorn settings for the extender: one worker process owns the ledger, an event loop in front of threads;
with a webhook port, a second worker process serves the admission webhook alone (``extender.worker`` roles).

Used as ``gunicorn -c python:extender.gunicorn_conf "extender.app:app_from_env()"``; the address,
TLS and limits come from the same ``GPUSLICE_*`` settings as the app (``extender.config``).
"""

from __future__ import annotations

import os
import ssl
from typing import Any

from extender.config import ExtenderConfig
from extender.worker import assign_role

_config = ExtenderConfig.from_env()

bind = [f"{_config.host}:{_config.port}", *([f"{_config.host}:{_config.webhook_port}"] if _config.webhook_port else [])]
# one process owns the ledger (a second would be a second, disagreeing ledger); the webhook, a pure function of the
# pod, gets a process of its own when it has a port, so no queue step or bind holds the interpreter lock it needs
workers = 2 if _config.webhook_port else 1
worker_class = "extender.worker.ExtenderWorker"  # requests are read whole on an event loop, then decided in threads
worker_connections = 1000  # open connections one worker keeps; a stalled one costs a socket, not a thread
max_requests = 0  # never recycle the worker: recycling would drop the in-memory ledger
timeout = 30
graceful_timeout = 10
# offer HTTP/2 over TLS (ALPN): kube-scheduler's extender client keeps only 2 idle HTTP/1.1 connections (Go's
# default), so concurrent binds opened a new mutual-TLS connection each (0.75 per pod); over HTTP/2 they
# share one (measured in tests/bench/bench_e2e.py: 760 -> 16 connections a burst, -1 ms CPU per pod in
# kube-scheduler); the API server's webhook client speaks it too. Plain-HTTP clients keep HTTP/1.1.
http_protocols = "h2,h1"
keepalive = 75  # HTTP/1.1 clients (probes, gpuslice status) reuse connections
preload_app = False  # the worker builds the state (and the cluster's informer threads) after the fork
control_socket_disable = True  # gunicorn's control socket (shared by the user's instances) can add workers
accesslog = os.environ.get("GPUSLICE_ACCESS_LOG") or None
loglevel = os.environ.get("GPUSLICE_LOG_LEVEL", "info")
proc_name = "gpuslice-extender"
if _config.tls_cert:
    certfile = _config.tls_cert
    keyfile = _config.tls_key
if _config.client_ca:
    ca_certs = _config.client_ca
    # optional at the TLS layer, so probes and the API server's webhook calls (no certificate) still
    # connect; a certificate that is presented must verify, and the app requires one where it should
    cert_reqs = ssl.CERT_OPTIONAL


def nworkers_changed(server: Any, new_value: int, old_value: int | None) -> None:
    """SIGTTIN/SIGTTOU ask the master for one worker more or less: refuse, one process owns the ledger
    (and one serves the webhook, with a webhook port)."""
    if new_value is not None and new_value != workers:
        server.log.warning("refusing %d workers: one gpuslice worker owns the ledger%s", new_value,
                           ", one serves the webhook" if _config.webhook_port else "")
        server.num_workers = workers


def pre_fork(server: Any, worker: Any) -> None:
    """Before a worker is forked: give it the role no live worker has (a worker that died is replaced in its role)."""
    assign_role(worker, server.WORKERS.values(), bool(_config.webhook_port))
