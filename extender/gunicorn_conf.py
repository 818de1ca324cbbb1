"""gunicorn settings for the extender: one worker process (it owns the ledger) serving with threads.

Used as ``gunicorn -c python:extender.gunicorn_conf "extender.app:app_from_env()"``; the address and
thread count come from the same ``GPUSLICE_*`` settings as the app (``extender.config``).
"""

from __future__ import annotations

import os

from extender.config import ExtenderConfig

_config = ExtenderConfig.from_env()

bind = f"{_config.host}:{_config.port}"
workers = 1  # one process owns the ledger: a second worker would be a second, disagreeing ledger
worker_class = "gthread"  # threads share the process's ledger; the state's lock serializes decisions
threads = _config.threads
max_requests = 0  # never recycle the worker: recycling would drop the in-memory ledger
timeout = 30
graceful_timeout = 10
keepalive = 75  # kube-scheduler's client reuses connections
preload_app = False  # the worker builds the state (and issue 5's informer threads) after the fork
accesslog = os.environ.get("GPUSLICE_ACCESS_LOG") or None
loglevel = os.environ.get("GPUSLICE_LOG_LEVEL", "info")
proc_name = "gpuslice-extender"
