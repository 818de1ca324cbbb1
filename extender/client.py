"""A small JSON-over-HTTP(S) client for the extender (demo, ``gpuslice status``, tests, benchmarks).

One keep-alive connection per client, reopened after an error; not thread-safe (one per thread),
like the connections kube-scheduler's HTTP client keeps. For ``https://`` URLs it verifies the
server against ``ca`` (the system's CAs when empty) and presents ``cert``/``key`` when given;
``server_name`` is the name to verify when the URL names an address the certificate does not.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
from typing import Any
from urllib.parse import urlsplit


class ClientError(Exception):
    """The extender could not be reached or answered something that is not JSON."""


class _NamedHTTPSConnection(http.client.HTTPSConnection):
    """HTTPS to an address, verifying the certificate for another name (``server_name``)."""

    def __init__(self, host: str, port: int, server_name: str, context: ssl.SSLContext, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout, context=context)
        self._server_name = server_name
        self._ssl_context = context

    def connect(self) -> None:
        sock = socket.create_connection((self.host, self.port), self.timeout)
        self.sock = self._ssl_context.wrap_socket(sock, server_hostname=self._server_name)


class ExtenderClient:
    """POST/GET JSON to one extender base URL such as ``http://127.0.0.1:8888``."""

    def __init__(self, base_url: str, timeout: float = 10.0, *, ca: str = "", cert: str = "", key: str = "",
                 server_name: str = "", verify: bool = True) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ClientError(f"expected an http(s)://host:port URL, got {base_url!r}")
        if parts.scheme == "http" and (ca or cert or server_name):
            raise ClientError(f"a CA, a client certificate or a server name needs an https:// URL, got {base_url!r}")
        self.host = parts.hostname
        self.https = parts.scheme == "https"
        self.port = parts.port or (443 if self.https else 80)
        self.prefix = parts.path.rstrip("/")
        self.timeout = timeout
        self.server_name = server_name
        self._context: ssl.SSLContext | None = None
        if self.https:
            try:
                context = ssl.create_default_context(cafile=ca or None)
                if not verify:  # only for probing a server this process started itself
                    context.check_hostname = False
                    context.verify_mode = ssl.CERT_NONE
                if cert:
                    context.load_cert_chain(cert, key or None)
            except (OSError, ssl.SSLError) as e:
                raise ClientError(f"cannot load the TLS files: {e}") from e
            self._context = context
        self._conn: http.client.HTTPConnection | None = None

    def _connect(self) -> http.client.HTTPConnection:
        if self._context is None:
            return http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        if self.server_name:
            return _NamedHTTPSConnection(self.host, self.port, self.server_name, self._context, self.timeout)
        return http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout, context=self._context)

    def request_raw(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        """Send ``body`` as-is; (status, response bytes). Retries once on a dropped keep-alive connection."""
        headers = {"Content-Type": "application/json"} if body is not None else {}
        for attempt in (1, 2):
            if self._conn is None:
                self._conn = self._connect()
            try:
                self._conn.request(method, self.prefix + path, body=body, headers=headers)
                response = self._conn.getresponse()
                return response.status, response.read()
            except (OSError, http.client.HTTPException) as e:
                self.close()
                if attempt == 2 or isinstance(e, ssl.SSLError):
                    raise ClientError(f"{method} {path} on {self.host}:{self.port} failed: {e}") from e
        raise AssertionError("unreachable")

    def request(self, method: str, path: str, doc: Any = None) -> tuple[int, Any]:
        """JSON in, (status, decoded JSON) out."""
        body = None if doc is None else json.dumps(doc).encode("utf-8")
        status, raw = self.request_raw(method, path, body)
        try:
            return status, json.loads(raw) if raw else None
        except json.JSONDecodeError as e:
            raise ClientError(f"{method} {path}: HTTP {status} with a body that is not JSON: {raw[:200]!r}") from e

    def post(self, path: str, doc: Any) -> tuple[int, Any]:
        return self.request("POST", path, doc)

    def get(self, path: str) -> tuple[int, Any]:
        return self.request("GET", path)

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> ExtenderClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
