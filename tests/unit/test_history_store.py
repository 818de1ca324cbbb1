"""The demand history in ConfigMaps (``extender/history/store.py``): the leader writes, a new leader continues."""

from __future__ import annotations

import copy
import json
from typing import Any

from extender.history.book import DemandBook
from extender.history.store import LABEL, ConfigMapStore
from packing.asks import PodAsk
from packing.demand import LOST, parse_header, parse_row
from packing.kube.client import KubeError
from packing.products import load_catalog

CATALOG = load_catalog()
NS = "gpuslice-system"


class FakeConfigMaps:
    """ConfigMaps of one namespace, as the API server keeps them; counts every call."""

    def __init__(self) -> None:
        self.items: dict[str, dict[str, Any]] = {}
        self.calls: list[tuple[str, str]] = []
        self.down = False

    def request(self, method: str, path: str, body: Any = None, **kw: Any) -> dict[str, Any]:
        self.calls.append((method, path))
        if self.down:
            raise KubeError(0, "connection refused")
        base = f"/api/v1/namespaces/{NS}/configmaps"
        assert path.startswith(base), path
        name = path[len(base) + 1:]
        if method == "GET" and not name:
            selector = (kw.get("query") or {}).get("labelSelector", "")
            key, _, value = selector.partition("=")
            return {"items": [copy.deepcopy(c) for c in self.items.values()
                              if c["metadata"].get("labels", {}).get(key) == value], "metadata": {}}
        if method == "PUT":
            if name not in self.items:
                raise KubeError(404, "not found")
            self.items[name] = copy.deepcopy(body)
            return body
        if method == "POST":
            self.items[body["metadata"]["name"]] = copy.deepcopy(body)
            return body
        if method == "DELETE":
            if self.items.pop(name, None) is None:
                raise KubeError(404, "not found")
            return {}
        raise AssertionError(f"unexpected {method} {path}")


class Clock:
    def __init__(self) -> None:
        self.t = 1_800_000_000.0

    def __call__(self) -> float:
        return self.t


def ask(uid: str, product: str = "v100-25") -> PodAsk:
    return PodAsk(uid, f"pod-{uid}", "team-a", CATALOG.request(product))


def leader(api: FakeConfigMaps, clock: Clock, **kw: Any) -> tuple[DemandBook, ConfigMapStore]:
    book = DemandBook(CATALOG, clock=clock, max_bytes=kw.pop("max_bytes", 64 * 1024 * 1024))
    store = ConfigMapStore(api, NS, book, clock=clock, **kw)  # type: ignore[arg-type]
    store.load(clock.t)
    return book, store


def history(book: DemandBook) -> dict[str, Any]:
    lines = book.export().decode().splitlines()
    return {"header": parse_header(json.loads(lines[0])), "rows": {r.claim: r for r in map(parse_row, map(
        json.loads, lines[1:]))}}


def test_a_new_leader_continues_what_the_last_one_wrote() -> None:
    api, clock = FakeConfigMaps(), Clock()
    book, store = leader(api, clock)
    for i in range(30):
        clock.t += 1
        book.arrived(ask(f"c{i}"))
        if i % 3 == 0:
            book.admitted(f"c{i}", "n1", ["g1"])
        if i % 6 == 0:
            book.departed(f"c{i}")
    assert store.flush()
    store.stop()  # a clean hand-over writes what is left
    clock.t += 2  # the next leader takes the Lease within seconds: no gap
    book2, store2 = leader(api, clock)
    before, after = history(book), history(book2)
    assert {c: (r.admitted, r.ended) for c, r in after["rows"].items()} == \
        {c: (r.admitted, r.ended) for c, r in before["rows"].items()}
    assert after["header"].gaps == ()
    book2.departed("c3")  # it goes on from there
    store2.flush()
    book3, _ = leader(api, clock)
    assert history(book3)["rows"]["c3"].ended == "departed"


def test_a_long_hand_over_is_a_gap_and_claims_gone_meanwhile_are_lost() -> None:
    api, clock = FakeConfigMaps(), Clock()
    book, store = leader(api, clock)
    book.arrived(ask("a"))
    book.admitted("a", "n1", ["g1"])
    book.arrived(ask("b"))
    clock.t += 1
    store.flush()  # then the leader dies without a last flush
    clock.t += 600
    book2, store2 = leader(api, clock)
    assert store2.settle(["b"]) == 1  # a's pod is gone: it ended while no one recorded
    h = history(book2)
    assert len(h["header"].gaps) == 1 and 590 < h["header"].gap_seconds < 610
    assert h["rows"]["a"].ended == LOST and h["rows"]["b"].open


def test_chunks_roll_carry_the_open_claims_and_the_oldest_are_pruned() -> None:
    api, clock = FakeConfigMaps(), Clock()
    book, store = leader(api, clock, chunk_bytes=1024, max_bytes=60_000)
    book.arrived(ask("long-runner", "v100-100"))
    book.admitted("long-runner", "n0", ["g0"])
    for i in range(600):
        clock.t += 1
        book.arrived(ask(f"c{i}"))
        book.withdrawn(f"c{i}")
        if i % 20 == 0:
            store.flush()
    store.flush()
    names = sorted(api.items)
    assert len(names) >= 3 and all(n.startswith("gpuslice-history-") for n in names)
    assert all(c["metadata"]["labels"][LABEL] == "chunk" for c in api.items.values())
    raw = sum(int(c["metadata"]["annotations"]["gpuslice.io/history-raw-bytes"]) for c in api.items.values())
    assert raw <= 60_000 + 20_000  # the oldest chunks went (beyond the bound: the current one, never pruned)
    book2, _ = leader(api, clock)
    rows = history(book2)["rows"]
    assert rows["long-runner"].open and rows["long-runner"].node == "n0"  # carried into every new chunk
    assert "c599" in rows and "c0" not in rows  # the newest kept, the oldest pruned


def test_a_refused_write_is_retried_and_loses_nothing() -> None:
    api, clock = FakeConfigMaps(), Clock()
    book, store = leader(api, clock)
    book.arrived(ask("a"))
    api.down = True
    assert not store.flush()
    api.down = False
    book.arrived(ask("b"))
    assert store.flush()
    book2, _ = leader(api, clock)
    assert set(history(book2)["rows"]) == {"a", "b"}


def test_one_write_per_flush_however_many_claims_and_a_heartbeat_when_idle() -> None:
    api, clock = FakeConfigMaps(), Clock()
    book, store = leader(api, clock, heartbeat_s=60.0)
    for i in range(200):
        book.arrived(ask(f"c{i}"))
    writes = sum(1 for m, _ in api.calls if m in ("PUT", "POST"))
    store.flush()
    assert sum(1 for m, _ in api.calls if m in ("PUT", "POST")) - writes <= 2  # a create (PUT 404, then POST)
    calls = len(api.calls)
    clock.t += 10
    store.flush()  # nothing changed, heartbeat not due: no call
    assert len(api.calls) == calls
    clock.t += 60
    store.flush()  # heartbeat: the chunk's until moves on
    assert len(api.calls) == calls + 1
