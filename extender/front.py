"""The server front: an ASGI app, served by gunicorn's asyncio worker, in front of the extender's WSGI app.

A worker thread must never wait for a client. gunicorn's threaded worker hands a connection to a
thread as soon as it opens and reads the request there, so a client that sends its headers and
then stalls holds a thread: eight of them stopped every decision, health checks included. The
front reads each request whole on the event loop first (headers by gunicorn's parser, the body
here, at most ``max_body_bytes`` (413, chunked bodies counted as they arrive) and within
``body_timeout_s`` (408)), and only then gives it to one of ``threads`` threads that run the
Flask app. A stalled client, or a connection a client opened and has not used yet, costs a socket
and a coroutine, never a thread (measured in ``tests/bench/bench_extender.py``; the choice is
explained in ``extender/README.md``).

The POST routes every pod goes through (``extender.app.HotRoutes``: filter, prioritize, bind, the
admission webhook) are answered from the body bytes by the same function the Flask views call,
without a WSGI environ or Flask's request machinery; every other route goes through the WSGI app.
A hot route that declares a body needs no I/O (the webhook, for a pod naming no DRA claim) is
answered on the event loop itself: its work is smaller than the two thread switches it would cost.

Binds run on threads of their own (``bind_threads``): in a cluster a bind waits for the API server
(the Binding that carries the allocation record), and a slow API server must not keep filters and the
admission webhook (which fails closed) waiting for a thread.

Each request's environ also carries when its headers arrived, how long its body took and how long
it waited for a thread (``extender.app`` turns them into phases), and the subject of the client
certificate the TLS layer verified, if any (``extender.worker`` puts it in the scope).
"""

from __future__ import annotations

import asyncio
import io
import json
import logging
import sys
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from extender.app import CLIENT_SUBJECT, FRONT_PHASES, STARTED, HotRoutes

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Callable[[], Any]
Send = Callable[[dict[str, Any]], Any]
Wsgi = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]
SUBJECT_EXTENSION = "gpuslice.client_subject"  # scope["extensions"] key set by extender.worker
DRAIN_BYTES = 16 * 1024 * 1024  # what of a refused body is still read (and dropped) so the connection stays in step


class WsgiFront:
    """ASGI in, WSGI behind: whole requests only reach the threads."""

    def __init__(self, app: Wsgi, threads: int, max_body_bytes: int, body_timeout_s: float,
                 bind_path: str = "/bind", bind_threads: int = 32, hot: HotRoutes | None = None) -> None:
        self.app = app
        self.hot = hot  # POST routes answered from the body bytes, without WSGI or Flask
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s
        self.bind_path = bind_path
        self.pool = ThreadPoolExecutor(threads, thread_name_prefix="request")
        self.bind_pool = ThreadPoolExecutor(bind_threads, thread_name_prefix="bind")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return  # no websockets here: the connection closes
        started = time.perf_counter()
        length = _content_length(scope)
        if length is not None and length > self.max_body_bytes:
            await _answer(send, 413, f"request body of {length} bytes is over the limit of {self.max_body_bytes}")
            if length <= self.max_body_bytes + DRAIN_BYTES:
                await self._drain(receive, length)
            return
        body = await self._body(receive, send)
        if body is None:
            return
        read = time.perf_counter() - started
        loop = asyncio.get_running_loop()
        pool = self.bind_pool if scope["path"] == self.bind_path else self.pool
        if self.hot is not None and scope["method"] == "POST" and scope["path"] in self.hot:
            if self.hot.inline(scope["path"], body):  # no I/O, a fraction of a millisecond: no thread hand-off
                status, reply = self._run_hot(scope, body, started, read, time.perf_counter())
            else:
                status, reply = await loop.run_in_executor(
                    pool, self._run_hot, scope, body, started, read, time.perf_counter())
            headers = [(b"content-type", b"application/json"), (b"content-length", str(len(reply)).encode())]
        else:
            status, headers, reply = await loop.run_in_executor(
                pool, self._run, scope, body, started, read, time.perf_counter())
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": reply})

    async def _body(self, receive: Receive, send: Send) -> bytes | None:
        """The whole body, or None after answering why there is none (413, 408, or the client left)."""
        chunks: list[bytes] = []
        size = 0
        try:
            async with asyncio.timeout(self.body_timeout_s):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return None
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > self.max_body_bytes:
                        await _answer(send, 413, f"request body is over the limit of {self.max_body_bytes} bytes")
                        if message.get("more_body", False):
                            await self._drain(receive, DRAIN_BYTES)
                        return None
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        return b"".join(chunks)
        except TimeoutError:
            await _answer(send, 408, f"request body did not arrive within {self.body_timeout_s:g} s")
            return None

    async def _drain(self, receive: Receive, limit: int) -> None:
        """Read and drop the rest of a refused body (at most ``limit`` bytes, within the body timeout), so
        the server sees the request end and the next one on the connection is read from its start; a
        longer or slower body is left to the connection's keep-alive timeout."""
        dropped = 0
        try:
            async with asyncio.timeout(self.body_timeout_s):
                while dropped <= limit:
                    message = await receive()
                    if message["type"] == "http.disconnect" or not message.get("more_body", False):
                        return
                    dropped += len(message.get("body", b""))
        except TimeoutError:
            return

    def _run_hot(self, scope: Scope, body: bytes, started: float, read: float, handed: float) -> tuple[int, bytes]:
        """Answer a hot route (in a worker thread, or on the loop for an inline one): the same
        ``HotRoutes.serve`` the Flask view calls."""
        assert self.hot is not None
        client = scope.get("client") or ("", 0)
        environ: dict[str, Any] = {"REMOTE_ADDR": str(client[0]), STARTED: started,
                                   FRONT_PHASES: {"read": read, "queued": time.perf_counter() - handed}}
        subject = (scope.get("extensions") or {}).get(SUBJECT_EXTENSION)
        if subject is not None:
            environ[CLIENT_SUBJECT] = subject
        content_type = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"content-type"), "")
        try:
            return self.hot.serve(scope["path"], content_type, body, environ)
        except Exception as e:  # as Flask answers an unhandled error: a JSON 500, the server stays up
            log.exception("%s %s failed", scope["method"], scope["path"])
            return 500, json.dumps({"error": f"Internal Server Error: {e}"}).encode()

    def _run(self, scope: Scope, body: bytes, started: float, read: float,
             handed: float) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """Run the WSGI app on one whole request (in a worker thread)."""
        environ = _environ(scope, body)
        environ[STARTED] = started
        environ[FRONT_PHASES] = {"read": read, "queued": time.perf_counter() - handed}
        subject = (scope.get("extensions") or {}).get(SUBJECT_EXTENSION)
        if subject is not None:
            environ[CLIENT_SUBJECT] = subject
        answer: dict[str, Any] = {}

        def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Callable[..., Any]:
            answer["status"] = int(status.split(" ", 1)[0])
            answer["headers"] = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers]
            return lambda data: None  # the legacy write() callable: the extender never uses it

        result = self.app(environ, start_response)
        try:
            reply = b"".join(result)
        finally:
            close = getattr(result, "close", None)
            if close is not None:
                close()
        return answer["status"], answer["headers"], reply

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self.pool.shutdown(wait=False, cancel_futures=True)
                self.bind_pool.shutdown(wait=False, cancel_futures=True)
                await send({"type": "lifespan.shutdown.complete"})
                return


def _content_length(scope: Scope) -> int | None:
    for name, value in scope["headers"]:
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _answer(send: Send, status: int, message: str) -> None:
    """An error the front gives itself (the app never saw the request)."""
    body = json.dumps({"error": message}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


def _environ(scope: Scope, body: bytes) -> dict[str, Any]:
    """The WSGI environ of an ASGI HTTP scope with a complete body (PEP 3333)."""
    server = scope.get("server") or ("localhost", 0)
    client = scope.get("client") or ("", 0)
    environ: dict[str, Any] = {
        "REQUEST_METHOD": scope["method"],
        "SCRIPT_NAME": scope.get("root_path", "").encode("utf-8").decode("latin-1"),
        "PATH_INFO": scope["path"].encode("utf-8").decode("latin-1"),
        "QUERY_STRING": scope.get("query_string", b"").decode("latin-1"),
        "SERVER_NAME": str(server[0]),
        "SERVER_PORT": str(server[1] if len(server) > 1 else 0),
        "SERVER_PROTOCOL": f"HTTP/{scope.get('http_version', '1.1')}",
        "REMOTE_ADDR": str(client[0]),
        "REMOTE_PORT": str(client[1] if len(client) > 1 else 0),
        "CONTENT_LENGTH": str(len(body)),
        "wsgi.version": (1, 0),
        "wsgi.url_scheme": scope.get("scheme", "http"),
        "wsgi.input": io.BytesIO(body),
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": False,
        "wsgi.run_once": False,
    }
    for raw_name, raw_value in scope["headers"]:
        name = raw_name.decode("latin-1").upper().replace("-", "_")
        value = raw_value.decode("latin-1")
        if name == "CONTENT_TYPE":
            environ["CONTENT_TYPE"] = value
        elif name != "CONTENT_LENGTH":
            key = f"HTTP_{name}"
            environ[key] = f"{environ[key]},{value}" if key in environ else value
    return environ
