"""Start a real gunicorn extender on a free 127.0.0.1 port for one test, and end it by its PID.

Also what the hardening tests need around it: a private ``HOME`` (gunicorn keeps per-user files
there), the worker processes of a master, and a throw-away CA with server and client certificates.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from extender.client import ClientError, ExtenderClient
from extender.config import ExtenderConfig
from extender.server import ServerProcess, free_port, start_on_free_port


@contextmanager
def running_extender(log_dir: Path, **settings: Any) -> Iterator[ServerProcess]:
    """A standalone extender under gunicorn with ``settings`` (ExtenderConfig fields); stopped after.

    Its log is kept in ``log_dir`` and shown when the test fails inside the block.
    """
    with serving(ExtenderConfig(standalone=True, **settings), log_dir) as server:
        yield server


@contextmanager
def serving_env(log_dir: Path, settings: Mapping[str, str]) -> Iterator[ServerProcess]:
    """A standalone extender configured by ``GPUSLICE_*`` variables (names older code ignores)."""
    with serving(ExtenderConfig.from_env({"GPUSLICE_STANDALONE": "1", **settings}), log_dir) as server:
        yield server


@contextmanager
def serving(config: ExtenderConfig, log_dir: Path) -> Iterator[ServerProcess]:
    home = log_dir / "home"
    home.mkdir(exist_ok=True)
    env = {"HOME": str(home), "XDG_RUNTIME_DIR": str(home)}  # gunicorn's per-user files stay in the test
    server = start_on_free_port(config, log_path=log_dir / "gunicorn.log", env=env)
    try:
        yield server
    except BaseException:
        print(f"--- gunicorn log (pid {server.pid}) ---\n{server.log_tail(80)}")
        raise
    finally:
        code = server.stop()
        assert code == 0, f"gunicorn pid {server.pid} exited with {code}:\n{server.log_tail()}"


@contextmanager
def gpuslice_serve(log_dir: Path, args: list[str], timeout: float = 10.0) -> Iterator[ExtenderClient]:
    """``gpuslice serve --standalone ARGS`` as a user starts it, on a free port with a private HOME:
    its client once /healthz answers; SIGTERM after the block, and exit status 0 asserted."""
    port = free_port()
    home = log_dir / "home"
    home.mkdir(exist_ok=True)
    log_path = log_dir / "serve.log"
    argv = [sys.executable, "-m", "packing.cli", "serve", "--standalone", "--port", str(port), *args]
    with log_path.open("wb") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "HOME": str(home)})
        client = ExtenderClient(f"http://127.0.0.1:{port}", timeout=timeout)
        try:
            deadline = time.monotonic() + 60
            while True:
                try:
                    if client.get("/healthz")[0] == 200:
                        break
                except ClientError:
                    assert proc.poll() is None and time.monotonic() < deadline, log_path.read_text()
                    time.sleep(0.1)
            yield client
        finally:
            client.close()
            os.kill(proc.pid, signal.SIGTERM)
            code = proc.wait(30)
    assert code == 0, log_path.read_text()


def children(pid: int) -> list[int]:
    """PIDs whose parent is ``pid`` (gunicorn's workers of a master), from /proc."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(entry))
    return sorted(out)


def wait_for_workers(pid: int, timeout: float = 30.0, not_in: tuple[int, ...] = ()) -> list[int]:
    """The master's workers once there is at least one that is not in ``not_in``."""
    deadline = time.monotonic() + timeout
    while True:
        workers = children(pid)
        if any(w not in not_in for w in workers):
            return workers
        if time.monotonic() > deadline:
            raise TimeoutError(f"no new worker of master {pid} within {timeout} s: {workers}")
        time.sleep(0.05)


@dataclass(frozen=True)
class Certs:
    """A CA, the server's certificate for 127.0.0.1, and client certificates (cert, key) by name."""

    ca: Path
    server: tuple[Path, Path]
    scheduler: tuple[Path, Path]  # CN=kube-scheduler, signed by the CA
    intruder: tuple[Path, Path]  # CN=intruder, signed by the same CA
    stranger: tuple[Path, Path]  # CN=kube-scheduler, signed by another CA


def make_certs(directory: Path) -> Certs:
    """Everything a mutual-TLS test needs, made with openssl."""
    directory.mkdir(parents=True, exist_ok=True)

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    def ca(name: str) -> None:
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.crt",
                "-days", "2", "-subj", f"/CN={name}", "-addext", "basicConstraints=critical,CA:TRUE",
                "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature")

    def leaf(name: str, subject: str, signer: str, usage: str, san: str = "") -> tuple[Path, Path]:
        ext = f"basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n" \
              f"extendedKeyUsage={usage}\n" + (f"subjectAltName={san}\n" if san else "")
        (directory / f"{name}.ext").write_text(ext)
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
                "-subj", subject)
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{signer}.crt", "-CAkey", f"{signer}.key",
                "-CAcreateserial", "-days", "2", "-sha256", "-extfile", f"{name}.ext", "-out", f"{name}.crt")
        return directory / f"{name}.crt", directory / f"{name}.key"

    ca("ca")
    ca("other-ca")
    return Certs(
        ca=directory / "ca.crt",
        server=leaf("server", "/CN=127.0.0.1", "ca", "serverAuth", "IP:127.0.0.1,DNS:localhost"),
        scheduler=leaf("scheduler", "/O=gpuslice/CN=kube-scheduler", "ca", "clientAuth"),
        intruder=leaf("intruder", "/CN=intruder", "ca", "clientAuth"),
        stranger=leaf("stranger", "/CN=kube-scheduler", "other-ca", "clientAuth"),
    )
