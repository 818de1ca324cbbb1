"""A small JSON-over-HTTP client for the extender (demo, ``gpuslice status``, tests, benchmarks).

One keep-alive connection per client, reopened after an error; not thread-safe (one per thread),
like the connections kube-scheduler's HTTP client keeps.
"""

from __future__ import annotations

import http.client
import json
from typing import Any
from urllib.parse import urlsplit


class ClientError(Exception):
    """The extender could not be reached or answered something that is not JSON."""


class ExtenderClient:
    """POST/GET JSON to one extender base URL such as ``http://127.0.0.1:8888``."""

    def __init__(self, base_url: str, timeout: float = 10.0) -> None:
        parts = urlsplit(base_url)
        if parts.scheme != "http" or not parts.hostname:
            raise ClientError(f"expected an http://host:port URL, got {base_url!r}")
        self.host = parts.hostname
        self.port = parts.port or 80
        self.prefix = parts.path.rstrip("/")
        self.timeout = timeout
        self._conn: http.client.HTTPConnection | None = None

    def request_raw(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        """Send ``body`` as-is; (status, response bytes). Retries once on a dropped keep-alive connection."""
        headers = {"Content-Type": "application/json"} if body is not None else {}
        for attempt in (1, 2):
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
            try:
                self._conn.request(method, self.prefix + path, body=body, headers=headers)
                response = self._conn.getresponse()
                return response.status, response.read()
            except (OSError, http.client.HTTPException) as e:
                self.close()
                if attempt == 2:
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
