"""The demand history's API cost per claim: writes and bytes the leader sends to keep it in ConfigMaps.

A simulated hour of claims (each arrives, is admitted a few seconds later, runs minutes) at several
arrival rates goes through a ``DemandBook`` and its ``ConfigMapStore`` flushing every 10 s (the
default), against an in-memory API that counts every call and the bytes of every write. The call
counts follow from the store's rules (one replace per flush with changes, one per heartbeat when
idle), so they do not depend on the machine; the bytes depend on how well the rows compress.
"""

from __future__ import annotations

import random
from typing import Any

from extender.history.book import DemandBook
from extender.history.store import FLUSH_S, ConfigMapStore
from packing.asks import PodAsk
from packing.kube.client import KubeError
from packing.products import load_catalog

NS = "gpuslice-system"
HOUR = 3600.0


class CountingApi:
    def __init__(self) -> None:
        self.items: dict[str, Any] = {}
        self.writes = 0
        self.bytes = 0
        self.other = 0

    def request(self, method: str, path: str, body: Any = None, **kw: Any) -> dict[str, Any]:
        name = path.rsplit("/", 1)[-1]
        if method in ("PUT", "POST"):
            if method == "PUT" and name not in self.items:
                self.other += 1
                raise KubeError(404, "not found")
            self.items[body["metadata"]["name"]] = body
            self.writes += 1
            self.bytes += len(str(body))
            return body
        self.other += 1
        if method == "DELETE":
            self.items.pop(name, None)
        return {"items": [], "metadata": {}}


class Clock:
    def __init__(self) -> None:
        self.t = 1_800_000_000.0

    def __call__(self) -> float:
        return self.t


def hour_at(rate: float) -> tuple[int, CountingApi]:
    catalog = load_catalog()
    rng = random.Random(1)
    clock = Clock()
    api = CountingApi()
    book = DemandBook(catalog, clock=clock)
    store = ConfigMapStore(api, NS, book, clock=clock)  # type: ignore[arg-type]
    store.load(clock.t)
    start = clock.t
    events: list[tuple[float, int, str]] = []
    t, n = start, 0
    while True:
        t += rng.expovariate(rate)
        if t > start + HOUR:
            break
        events += [(t, 0, f"c{n}"), (t + rng.uniform(1, 30), 1, f"c{n}"), (t + rng.uniform(60, 1800), 2, f"c{n}")]
        n += 1
    events.sort()
    products = ["v100-25", "v100-50", "v100-100"]
    next_flush = start + FLUSH_S
    for at, kind, claim in events:
        while at >= next_flush:
            clock.t = next_flush
            store.flush()
            next_flush += FLUSH_S
        clock.t = at
        if kind == 0:
            book.arrived(PodAsk(claim, f"pod-{claim}", f"team-{rng.randrange(5)}",
                                catalog.request(rng.choice(products))))
        elif kind == 1:
            book.admitted(claim, f"node-{rng.randrange(500)}", [f"GPU-{rng.getrandbits(64):016x}"])
        else:
            book.departed(claim)
    store.stop()
    return n, api


def main() -> None:
    print(f"API cost of the demand history over one hour, flush every {FLUSH_S:g} s (calls are exact, bytes as "
          "written: base64 of gzip, with the object's metadata)")
    print(f"  {'claims/s':>9} {'claims':>7} {'writes':>7} {'writes/claim':>13} {'KiB written':>12} {'KiB/claim':>10} "
          f"{'other calls':>12} {'chunks kept':>12}")
    for rate in (0.01, 0.1, 1.0, 10.0):
        n, api = hour_at(rate)
        print(f"  {rate:>9g} {n:>7} {api.writes:>7} {api.writes / n:>13.3f} {api.bytes / 1024:>12.0f} "
              f"{api.bytes / 1024 / n:>10.2f} {api.other:>12} {len(api.items):>12}")
