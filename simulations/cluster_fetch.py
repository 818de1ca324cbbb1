"""Read a running extender's ``GET /state`` and ``GET /history`` for ``simulate --from-cluster URL``.

The simulator never imports the extender (the project's layering), so this is its own small HTTPS
client: the standard library's, with the extender's CA (``--ca``), a client certificate
(``--cert``/``--key``) and the name its certificate carries (``--server-name``). A failure is a
``FetchError`` whose message names the flag that fixes it.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit


class FetchError(ValueError):
    """The extender could not be read; the message is one line naming the flag that fixes it."""


@dataclass(frozen=True)
class Connection:
    """Where the extender is and how to trust it (the flags of ``gpuslice status``)."""

    url: str
    ca: str = ""
    cert: str = ""
    key: str = ""
    server_name: str = ""
    timeout_s: float = 60.0


def _connection(c: Connection) -> tuple[http.client.HTTPConnection, str]:
    parts = urlsplit(c.url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise FetchError(f"--from-cluster: expected the extender's http(s)://host:port URL or a saved /state file, "
                         f"got {c.url!r}")
    if parts.scheme == "http" and (c.ca or c.cert or c.server_name):
        raise FetchError("--ca, --cert and --server-name need an https:// URL in --from-cluster")
    port = parts.port or (443 if parts.scheme == "https" else 80)
    if parts.scheme == "http":
        return http.client.HTTPConnection(parts.hostname, port, timeout=c.timeout_s), parts.path.rstrip("/")
    try:
        context = ssl.create_default_context(cafile=c.ca or None)
        if c.cert:
            context.load_cert_chain(c.cert, c.key or None)
    except (OSError, ssl.SSLError) as e:
        raise FetchError(f"cannot load the TLS files ({e}): check --ca, --cert and --key") from None
    host, name = parts.hostname, c.server_name or parts.hostname

    class Named(http.client.HTTPSConnection):
        def connect(self) -> None:
            sock = socket.create_connection((host, port), c.timeout_s)
            self.sock = context.wrap_socket(sock, server_hostname=name)

    return Named(host, port, timeout=c.timeout_s, context=context), parts.path.rstrip("/")


def get(c: Connection, path: str) -> bytes:
    """The body of ``GET path`` (200 only); FetchError naming the flag otherwise."""
    conn, prefix = _connection(c)
    try:
        conn.request("GET", prefix + path)
        response = conn.getresponse()
        status, body = response.status, response.read()
    except ssl.SSLError as e:
        if "CERTIFICATE_VERIFY_FAILED" in str(e) and ("mismatch" in str(e) or "not valid for" in str(e)):
            raise FetchError(f"the extender's certificate does not carry {urlsplit(c.url).hostname}: pass "
                             "--server-name (the chart's: gpuslice-extender.gpuslice-system.svc)") from None
        raise FetchError(f"TLS with the extender failed ({e.reason or e}): pass --ca, the CA of the Secret "
                         "gpuslice-extender-tls") from None
    except (OSError, http.client.HTTPException) as e:
        raise FetchError(f"cannot reach the extender at {c.url} ({e}): check --from-cluster's URL "
                         "(kubectl port-forward to the leader's pod)") from None
    finally:
        conn.close()
    if status == 200:
        return body
    message = _message(body)
    if status == 403:
        raise FetchError(f"the extender refused GET {path.split('?')[0]} ({message}): ask from loopback, or pass "
                         "--cert and --key, a client certificate it allows")
    if status == 503:
        raise FetchError(f"this extender replica is not ready ({message}): point --from-cluster at the leader")
    raise FetchError(f"GET {path.split('?')[0]} answered HTTP {status}: {message}")


def _message(body: bytes) -> str:
    try:
        doc: Any = json.loads(body)
        return str(doc.get("error", doc)) if isinstance(doc, dict) else str(doc)
    except ValueError:
        return body[:200].decode("utf-8", "replace")


def state_and_history(c: Connection, since: str) -> tuple[Any, bytes]:
    """``/state`` (decoded) and ``/history?since=`` (JSON Lines) of the extender at ``c``."""
    state = json.loads(get(c, "/state"))
    history = get(c, f"/history?since={quote(since)}")
    return state, history
