"""The server front (``extender.front``) driven as gunicorn's asyncio worker drives it, without a socket.

Whole requests only reach the threads: a body over the limit is refused before the app runs (413,
chunked or not), a body that does not arrive in time gets 408, and binds run on threads of their own,
so a bind waiting for the API server never keeps a filter waiting for a thread. The hot routes
(answered without WSGI or Flask) answer exactly as the Flask views do. The real worker and real
sockets are in ``tests/integration/test_gunicorn_extender.py``.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterable
from typing import Any

from extender.app import CLIENT_SUBJECT, create_app
from extender.config import ExtenderConfig
from extender.front import WsgiFront
from extender.samples import binding_args, filter_args, pod
from extender.standalone import build_state
from extender.state import ExtenderState
from extender.wire import BindingArgs
from packing.products import load_catalog
from packing.record import AllocationRecord

CATALOG = load_catalog()
NAMES = ["node-0", "node-1"]


def scope(path: str, body_length: int | None, client: str = "127.0.0.1", **extensions: Any) -> dict[str, Any]:
    headers = [(b"host", b"x"), (b"content-type", b"application/json")]
    if body_length is not None:
        headers.append((b"content-length", str(body_length).encode()))
    return {"type": "http", "method": "POST", "path": path, "headers": headers, "query_string": b"",
            "server": ("127.0.0.1", 8888), "client": (client, 5555), "scheme": "http", "http_version": "1.1",
            "extensions": extensions}


async def call(front: WsgiFront, sc: dict[str, Any], chunks: Iterable[bytes], stall: bool = False) -> dict[str, Any]:
    """One request through the front: the body in ``chunks``; ``stall``: then nothing more arrives."""
    queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    parts = list(chunks)
    for i, chunk in enumerate(parts):
        await queue.put({"type": "http.request", "body": chunk, "more_body": stall or i < len(parts) - 1})
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return await queue.get()

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await front(sc, receive, send)
    start = next(m for m in sent if m["type"] == "http.response.start")
    body = b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body")
    return {"status": start["status"], "doc": json.loads(body) if body else None}


def front_for(state: ExtenderState, hot: bool = True, config: ExtenderConfig | None = None, **kw: Any) -> WsgiFront:
    """The front as the worker builds it (``hot``: with the app's hot routes; else every request through WSGI)."""
    app = create_app(state, config or ExtenderConfig(standalone=True, nodes=2, gpus_per_node=2))
    return WsgiFront(app.wsgi_app, kw.pop("threads", 2), kw.pop("max_body", 4096), kw.pop("timeout", 5.0),
                     hot=app.extensions["gpuslice-hot"] if hot else None, **kw)


def test_whole_requests_reach_the_app_and_oversize_or_slow_ones_do_not() -> None:
    state = build_state(ExtenderConfig(standalone=True, nodes=2, gpus_per_node=2), CATALOG)
    front = front_for(state, timeout=0.2)
    body = json.dumps(filter_args(pod("p", "v100-25"), NAMES)).encode()
    half = len(body) // 2

    async def run() -> list[dict[str, Any]]:
        return [
            await call(front, scope("/filter", len(body)), [body[:half], body[half:]]),  # arrives in two parts
            await call(front, scope("/filter", 10_000), [b"{"]),  # announced over the limit: refused unread
            await call(front, scope("/filter", None), [b"[" + b" " * 3000, b" " * 3000 + b"]"]),  # chunked, over
            await call(front, scope("/filter", 100), [b"{"], stall=True),  # 1 of 100 bytes, then nothing
        ]

    ok, announced, chunked, slow = asyncio.run(run())
    assert ok["status"] == 200 and ok["doc"]["NodeNames"], ok
    assert (announced["status"], chunked["status"], slow["status"]) == (413, 413, 408)
    assert "over the limit" in announced["doc"]["error"] and "did not arrive" in slow["doc"]["error"]
    assert len(state.ledger.allocations) == 1  # only the whole request decided anything


def test_the_client_address_and_verified_subject_reach_the_access_rules() -> None:
    state = build_state(ExtenderConfig(standalone=True, nodes=1), CATALOG)
    config = ExtenderConfig(standalone=True, nodes=1)
    seen: list[dict[str, Any]] = []
    app = create_app(state, config).wsgi_app

    def spy(environ: dict[str, Any], start_response: Any) -> Any:
        seen.append(dict(environ))
        return app(environ, start_response)

    front = WsgiFront(spy, 1, 4096, 5.0)
    subject = (("commonName", "kube-scheduler"),)
    ext = {"gpuslice.client_subject": subject}
    remote = asyncio.run(call(front, {**scope("/state", 0, client="10.0.0.9"), "method": "GET"}, [b""]))
    assert remote["status"] == 403
    remote_with_cert = asyncio.run(call(front, {**scope("/state", 0, client="10.0.0.9", **ext), "method": "GET"},
                                        [b""]))
    assert remote_with_cert["status"] == 200  # no allow-list: any certificate the CA signed
    assert seen[-1]["REMOTE_ADDR"] == "10.0.0.9" and seen[-1][CLIENT_SUBJECT] == subject
    assert set(seen[-1]["gpuslice.phases"]) == {"read", "queued"}


class HeldBinder:
    """A binder whose binds wait until the test lets them go, as binds wait for a slow API server."""

    def __init__(self) -> None:
        self.go = threading.Event()
        self.waiting = threading.Semaphore(0)

    def bind(self, args: BindingArgs, record: AllocationRecord | None) -> None:
        self.waiting.release()
        assert self.go.wait(30), "the test never let the bind go"

    def release(self, pod_uid: str) -> None:
        pass


def test_binds_waiting_for_the_api_server_never_keep_a_filter_from_a_thread() -> None:
    binder = HeldBinder()
    state = ExtenderState(CATALOG, binder)
    from extender.inventory import synthetic_cards

    state.add_node("node-0", synthetic_cards("node-0", 8, "Tesla-V100-SXM2-32GB", 32768))
    front = front_for(state, threads=2, bind_threads=8, bind_path="/bind")
    pods = [pod(f"b{i}", "v100-25") for i in range(6)]

    async def run() -> tuple[dict[str, Any], list[dict[str, Any]]]:
        for p in pods:  # filtered first (bind needs to have seen the pod)
            filtered = await call(front, scope("/filter", None), [json.dumps(filter_args(p, ["node-0"])).encode()])
            assert filtered["status"] == 200
        bodies = [json.dumps(binding_args(p, "node-0")).encode() for p in pods]
        binds = [asyncio.create_task(call(front, scope("/bind", None), [b])) for b in bodies]
        for _ in pods:  # all six binds are inside the binder, each holding a thread (more than ``threads``)
            await asyncio.get_running_loop().run_in_executor(None, binder.waiting.acquire)
        probe = json.dumps(filter_args(pod("probe", "v100-25"), ["node-0"])).encode()
        answered = await asyncio.wait_for(call(front, scope("/filter", None), [probe]), 20)
        binder.go.set()
        return answered, list(await asyncio.gather(*binds))

    answered, bound = asyncio.run(run())
    assert answered["status"] == 200 and answered["doc"]["NodeNames"] == ["node-0"]
    assert [b["doc"] for b in bound] == [{"Error": ""}] * 6


def test_hot_routes_answer_exactly_as_the_flask_views_do() -> None:
    """The same requests through the hot path and through WSGI + Flask: the same status, body and ledger."""
    config = ExtenderConfig(standalone=True, nodes=2, gpus_per_node=2, tls_cert="c", tls_key="k", client_ca="ca",
                            require_client_cert=True, client_subjects=("CN=kube-scheduler",))
    subject = {"gpuslice.client_subject": (("commonName", "kube-scheduler"),)}
    stranger = {"gpuslice.client_subject": (("commonName", "someone-else"),)}
    good = json.dumps(filter_args(pod("p", "v100-25"), NAMES)).encode()
    requests: list[tuple[str, bytes, bytes, dict[str, Any]]] = [
        ("/filter", b"application/json", good, subject),
        ("/filter", b"application/json; charset=utf-8", good, subject),  # the same pod again: its reservation
        ("/filter", b"application/json", good, {}),  # no certificate: 403
        ("/filter", b"application/json", good, stranger),  # not on the allow-list: 403
        ("/filter", b"text/plain", good, subject),  # 415
        ("/filter", b"application/json", b"{not json", subject),  # 400
        ("/filter", b"application/json", b'{"Pod": 3}', subject),  # 400
        ("/prioritize", b"application/json", json.dumps(filter_args(pod("q", "v100-50"), NAMES)).encode(), subject),
        ("/bind", b"application/json", json.dumps(binding_args(pod("p", "v100-25"), "node-0")).encode(), subject),
        ("/bind", b"application/json", json.dumps(binding_args(pod("x", "v100-25"), "node-0")).encode(), subject),
        ("/bind", b"application/json", b'{"PodName": ""}', subject),
    ]

    def run(hot: bool) -> tuple[list[tuple[int, Any]], Any]:
        state = build_state(config, CATALOG)
        front = front_for(state, hot=hot, config=config)

        async def go() -> list[tuple[int, Any]]:
            out = []
            for path, content_type, body, ext in requests:
                sc = scope(path, len(body), client="10.0.0.9", **ext)
                sc["headers"] = [(k, content_type if k == b"content-type" else v) for k, v in sc["headers"]]
                answer = await call(front, sc, [body])
                out.append((answer["status"], answer["doc"]))
            return out

        answers = asyncio.run(go())
        ledger = sorted((a.claim, a.node, a.gpus, a.reserved) for a in state.ledger.allocations.values())
        return answers, ledger

    hot_answers, hot_ledger = run(True)
    flask_answers, flask_ledger = run(False)
    assert hot_answers == flask_answers
    assert hot_ledger == flask_ledger
    assert [status for status, _ in hot_answers] == [200, 200, 403, 403, 415, 400, 400, 200, 200, 200, 400]
    assert hot_answers[8][1] == {"Error": ""} and "has not seen pod" in hot_answers[9][1]["Error"]
