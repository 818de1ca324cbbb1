"""Start and stop a real gunicorn process serving the extender (demo, tests, benchmarks).

The process is ``python -m gunicorn -c python:extender.gunicorn_conf "extender.app:app_from_env()"``
with the settings in its environment; it is ended by its PID (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from extender.client import ClientError, ExtenderClient
from extender.config import ExtenderConfig

REPO_ROOT = Path(__file__).resolve().parents[1]


class ServerError(Exception):
    """The extender process did not come up; the message carries its log tail."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


@dataclass
class ServerProcess:
    """A running gunicorn master serving the extender."""

    process: subprocess.Popen[bytes]
    config: ExtenderConfig
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def url(self) -> str:
        scheme = "https" if self.config.tls_cert else "http"
        return f"{scheme}://{self.config.host}:{self.config.port}"

    def log_tail(self, lines: int = 40) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 10.0) -> int:
        """SIGTERM the master by PID (it stops its worker), SIGKILL after ``timeout``; the exit code."""
        if self.process.poll() is None:
            os.kill(self.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, signal.SIGKILL)
                self.process.wait(timeout)
        return self.process.returncode


def start_server(
    config: ExtenderConfig,
    *,
    ready_timeout: float = 30.0,
    log_path: Path | None = None,
    env: dict[str, str] | None = None,
    gunicorn_args: tuple[str, ...] = (),
) -> ServerProcess:
    """Start gunicorn with ``config`` and wait until it answers ``GET /healthz``.

    ``env`` adds to this process's environment (give every test server a private ``HOME``: gunicorn
    keeps per-user files there); the ``GPUSLICE_*`` settings come from ``config``. ``gunicorn_args``
    override the shipped gunicorn settings (benchmarks compare worker models this way).
    """
    if log_path is None:
        fd, name = tempfile.mkstemp(prefix="gpuslice-extender-", suffix=".log")
        os.close(fd)
        log_path = Path(name)
    full_env = {**os.environ, **(env or {}), **config.to_env()}
    full_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), full_env.get("PYTHONPATH", "")) if p)
    argv = [sys.executable, "-m", "gunicorn", "-c", "python:extender.gunicorn_conf", *gunicorn_args,
            "extender.app:app_from_env()"]
    with open(log_path, "ab") as log:
        process = subprocess.Popen(argv, env=full_env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT)
    server = ServerProcess(process, config, log_path)
    deadline = time.monotonic() + ready_timeout
    client = ExtenderClient(server.url, timeout=2.0, verify=False)  # our own child, on loopback
    try:
        while True:
            if process.poll() is not None:
                raise ServerError(f"gunicorn exited with {process.returncode}:\n{server.log_tail()}")
            try:
                status, _ = client.get("/healthz")
                if status == 200:
                    return server
            except ClientError:
                pass
            if time.monotonic() > deadline:
                server.stop()
                raise ServerError(f"gunicorn did not answer /healthz within {ready_timeout} s:\n{server.log_tail()}")
            time.sleep(0.05)
    finally:
        client.close()


def start_on_free_port(
    config: ExtenderConfig,
    *,
    attempts: int = 3,
    ready_timeout: float = 30.0,
    log_path: Path | None = None,
    env: dict[str, str] | None = None,
    gunicorn_args: tuple[str, ...] = (),
) -> ServerProcess:
    """``start_server`` on a fresh free port, retrying when another process took it meanwhile."""
    last: ServerError | None = None
    for _ in range(attempts):
        try:
            return start_server(replace(config, port=free_port(config.host)), ready_timeout=ready_timeout,
                                log_path=log_path, env=env, gunicorn_args=gunicorn_args)
        except ServerError as e:
            last = e
    assert last is not None
    raise last
