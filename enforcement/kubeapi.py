"""The few raw API calls the node side makes (claims, pods, ResourceSlices), as JSON dicts.

A narrow protocol so the plugins are tested against an in-memory API and run against the real
one through the kubernetes client's ``ApiClient`` (no typed models: fields are read by name).
"""

from __future__ import annotations

import json
from typing import Any, Protocol

Obj = dict[str, Any]


class ApiError(RuntimeError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class Api(Protocol):
    def get(self, path: str) -> Obj | None: ...  # None when absent (404)

    def create(self, path: str, obj: Obj) -> Obj: ...

    def replace(self, path: str, obj: Obj) -> Obj: ...

    def delete(self, path: str) -> None: ...


class KubeApi:
    """Api over ``kubernetes.client.ApiClient`` (its auth and TLS settings)."""

    def __init__(self, api_client: Any) -> None:
        self.client = api_client

    def _call(self, method: str, path: str, body: Obj | None = None) -> Obj | None:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        try:
            m, url, hdrs, _, _ = self.client.param_serialize(method, path, header_params=headers,
                                                             auth_settings=["BearerToken"])
            resp = self.client.call_api(m, url, header_params=hdrs, body=body, _request_timeout=(5.0, 30.0))
            data: bytes = resp.read()
        except Exception as e:  # connection refused, TLS, timeouts: the server was not reached
            raise ApiError(0, f"{type(e).__name__}: {e}") from None
        if resp.status == 404:
            return None
        if not 200 <= resp.status < 300:
            raise ApiError(resp.status, data.decode(errors="replace")[:500])
        doc = json.loads(data) if data else {}
        return doc if isinstance(doc, dict) else {"items": doc}

    def get(self, path: str) -> Obj | None:
        return self._call("GET", path)

    def create(self, path: str, obj: Obj) -> Obj:
        out = self._call("POST", path, obj)
        if out is None:
            raise ApiError(404, f"{path} not found")
        return out

    def replace(self, path: str, obj: Obj) -> Obj:
        out = self._call("PUT", path, obj)
        if out is None:
            raise ApiError(404, f"{path} not found")
        return out

    def delete(self, path: str) -> None:
        self._call("DELETE", path)


def field(obj: Any, *path: str) -> Any:
    """``obj[path[0]][path[1]]...``, or None where a level is missing or not a dict."""
    cur = obj
    for key in path:
        if not isinstance(cur, dict):
            return None
        cur = cur.get(key)
    return cur
