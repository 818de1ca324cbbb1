"""Extender speed: server-side latency per verb, and sustained pods/s through gunicorn.

1. Server-side latency (request bytes -> decision -> reply bytes, the work the latency histogram
   measures) of filter, prioritize and bind at 100, 1 000 and 5 000 nodes x 8 V100s with
   ``NodeNames``, on a cluster churned to a realistic fragmented state (packed to 85 %, then a
   random third of the pods released). Each pod goes filter -> prioritize -> bind, then an older
   pod is released so occupancy stays steady. Goal: p99 <= 5 ms at 5 000 nodes.
2. The same at 1 000 nodes with full ``Nodes`` objects (``nodeCacheCapable: false``), also as a
   ratio to plain ``json.loads`` of the same body: the parsing floor no extender can beat.
3. Sustained pods/s (filter + prioritize + bind, plus a release) through a real gunicorn process
   from a load generator on loopback, against the same run's HTTP floor (``GET /healthz``).
4. Stalled clients: ``GET /healthz`` and a filter, p50/p99 over real HTTP, idle and with 200 stalled
   connections held open (half stopped inside their headers, half after 1 of 100 body bytes), for the
   shipped worker (gunicorn's asyncio worker with the front that reads whole requests before a thread
   runs them) and, side by side, gunicorn's threaded worker that served the extender before. Goal:
   p99 <= 100 ms under the stall. Also pods/s of both workers without a stall: what the front costs.

A fixed ~50 µs computation timed the same way first shows the machine's own jitter: on a shared
machine its p99 is the floor under every p99 below.
"""

from __future__ import annotations

import json
import random
import socket
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from tempfile import TemporaryDirectory
from typing import Any

from extender.app import Handlers, create_app
from extender.client import ExtenderClient
from extender.config import ExtenderConfig
from extender.heap import settle_heap
from extender.inventory import synthetic_cards
from extender.samples import binding_args, filter_args, gpu_node, pod
from extender.server import start_on_free_port
from extender.standalone import MemoryBinder
from extender.state import ExtenderState, StateConfig
from packing.ledger import Ledger, NoFit
from packing.policies import BEST_FIT, place
from packing.products import load_catalog

CATALOG = load_catalog()
MIX = ("v100-25", "v100-25", "v100-50", "v100-50", "v100-100")  # quarter and half slices dominate
GPUS = 8
MODEL = "Tesla-V100-SXM2-32GB"


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def churned_state(nodes: int, mode: str = "strict", seed: int = 1) -> ExtenderState:
    """``nodes`` x 8 cards packed best-fit to 85 %, then a random third of the pods released."""
    ledger = Ledger()
    for n in range(nodes):
        ledger.add_node(f"node-{n}", [c.as_tuple() for c in synthetic_cards(f"node-{n}", GPUS, MODEL, 32768)])
    rng = random.Random(seed)
    target = int(0.85 * nodes * GPUS * 1000)
    used, placed, i = 0, [], 0
    while used < target:
        request = CATALOG.request(rng.choice(MIX))
        try:
            place(ledger, f"fill-{i}", request, BEST_FIT)
        except NoFit:
            break
        placed.append(f"fill-{i}")
        used += request.milli
        i += 1
    for claim in rng.sample(placed, len(placed) // 3):
        ledger.release(claim)
    # the state takes the ledger as it is (a restart after a sync), then warms its fit views
    state = ExtenderState(CATALOG, MemoryBinder(), StateConfig(mode=mode), ledger=ledger)
    state.warm()
    settle_heap()  # as the server does after building its state
    return state


Sample = tuple[float, float]  # (wall seconds, CPU seconds of this thread)


def clocked(fn: Callable[[], Any], into: list[Sample]) -> Any:
    """Run ``fn``, recording its wall time and its thread CPU time (immune to being descheduled)."""
    wall, cpu = time.perf_counter(), time.thread_time()
    out = fn()
    into.append((time.perf_counter() - wall, time.thread_time() - cpu))
    return out


def timed(fn: Callable[[bytes], tuple[int, bytes]], body: bytes, into: list[Sample]) -> Any:
    status, reply = clocked(lambda: fn(body), into)
    assert status == 200, reply[:300]
    return json.loads(reply)


def run_stream(handlers: Handlers, pods: int, make_args: Callable[[dict[str, Any]], dict[str, Any]],
               seed: int = 2) -> dict[str, list[Sample]]:
    """filter -> prioritize -> bind per pod, releasing an older pod each time; latencies per verb."""
    rng = random.Random(seed)
    lat: dict[str, list[Sample]] = {"filter": [], "prioritize": [], "bind": []}
    bound: list[str] = []
    for i in range(pods):
        p = pod(f"bench-{seed}-{i}", rng.choice(MIX))
        reply = timed(handlers.filter, json.dumps(make_args(p)).encode(), lat["filter"])
        feasible = reply["NodeNames"]
        if not feasible:
            continue
        scores = timed(handlers.prioritize, json.dumps(filter_args(p, feasible)).encode(), lat["prioritize"])
        top = max(scores, key=lambda s: s["Score"])["Host"]
        out = timed(handlers.bind, json.dumps(binding_args(p, top)).encode(), lat["bind"])
        if not out["Error"]:
            bound.append(p["metadata"]["uid"])
        if len(bound) > 20:
            handlers.state.release(bound.pop(rng.randrange(len(bound))))
    return lat


def p50(samples: list[Sample], cpu: bool = False) -> float:
    return pct([s[1] if cpu else s[0] for s in samples], 0.5)


def line(label: str, samples: list[Sample]) -> str:
    wall = [s[0] * 1000 for s in samples]
    cpu = [s[1] * 1000 for s in samples]
    return (f"  {label:<36} wall p50 {pct(wall, 0.5):7.3f} p99 {pct(wall, 0.99):8.3f} ms | "
            f"cpu p50 {pct(cpu, 0.5):7.3f} p99 {pct(cpu, 0.99):8.3f} ms  n={len(samples)}")


def bench_node_names(nodes: int, pods: int) -> None:
    state = churned_state(nodes)
    handlers = create_app(state).extensions["gpuslice"]
    names = list(state.ledger.nodes)
    lat = run_stream(handlers, pods, lambda p: filter_args(p, names))
    print(f"{nodes} nodes x {GPUS} GPUs, NodeNames, strict mode ({state.ledger.free_milli() / 1000:.0f} of "
          f"{nodes * GPUS} cards free, fragmented):")
    for verb in ("filter", "prioritize", "bind"):
        print(line(verb, lat[verb]))
    coop = churned_state(nodes, mode="cooperative")
    coop_handlers = create_app(coop).extensions["gpuslice"]
    coop_lat = run_stream(coop_handlers, max(50, pods // 4), lambda p: filter_args(p, names), seed=3)
    print(line("cooperative filter (all fitting)", coop_lat["filter"]))
    print(line("cooperative prioritize (all fitting)", coop_lat["prioritize"]))
    body = json.dumps(filter_args(pod("floor", "v100-25"), names)).encode()
    floor: list[Sample] = []
    for _ in range(50):
        clocked(lambda: json.loads(body), floor)
    print(line("json.loads of the filter body", floor))
    print(f"  filter / json.loads (cpu p50)        {p50(lat['filter'], True) / p50(floor, True):.1f}x")


def bench_full_nodes(nodes: int, pods: int) -> None:
    state = churned_state(nodes)
    handlers = create_app(state).extensions["gpuslice"]
    objects = [gpu_node(name, GPUS) for name in state.ledger.nodes]
    lat = run_stream(handlers, pods, lambda p: filter_args(p, nodes=objects))
    body = json.dumps(filter_args(pod("floor", "v100-25"), nodes=objects)).encode()
    floor: list[Sample] = []
    for _ in range(20):
        clocked(lambda: json.loads(body), floor)
    f50, l50 = p50(lat["filter"], True), p50(floor, True)
    print(f"{nodes} nodes x {GPUS} GPUs, full Nodes objects ({len(body) / 1e6:.1f} MB per filter body):")
    print(line("filter", lat["filter"]))
    print(line("json.loads of the same body", floor))
    print(f"  filter / json.loads (cpu p50)        {f50 / l50:.2f}x  (1.0 = parsing is all the work)")


def bench_gunicorn(nodes: int, seconds: float, clients: int) -> None:
    config = ExtenderConfig(standalone=True, nodes=nodes, gpus_per_node=GPUS, threads=8)
    with TemporaryDirectory() as tmp:
        server = start_on_free_port(config, log_path=Path(tmp) / "gunicorn.log", ready_timeout=120)
        try:
            names = [f"node-{i}" for i in range(nodes)]
            floor = _loop(server.url, clients, seconds / 3, lambda c, i: [c.get("/healthz") for _ in range(3)])
            done = _loop(server.url, clients, seconds, lambda c, i: _sequence(c, names, i))
        finally:
            server.stop()
    print(f"through gunicorn (1 worker, 8 threads) on loopback, {nodes} nodes x {GPUS}, {clients} client threads:")
    print(f"  filter+prioritize+bind(+release)   {done:8.1f} pods/s")
    print(f"  HTTP floor: 3 x GET /healthz       {floor:8.1f} sequences/s  (pods/s = {done / floor:.2f}x the floor)")


def _sequence(client: ExtenderClient, names: list[str], i: int) -> None:
    p = pod(f"load-{threading.get_ident()}-{i}", MIX[i % len(MIX)])
    _, reply = client.post("/filter", filter_args(p, names))
    feasible = reply["NodeNames"]
    if feasible:
        _, scores = client.post("/prioritize", filter_args(p, feasible))
        top = max(scores, key=lambda s: s["Score"])["Host"]
        _, out = client.post("/bind", binding_args(p, top))
        if not out["Error"]:
            client.post("/admin/release", {"PodUID": p["metadata"]["uid"]})


def _loop(url: str, clients: int, seconds: float, step: Callable[[ExtenderClient, int], Any]) -> float:
    """Run ``step`` from ``clients`` threads for ``seconds``; completed steps per second."""
    deadline = time.perf_counter() + seconds
    counts = [0] * clients

    def worker(k: int) -> None:
        with ExtenderClient(url, timeout=30) as client:
            i = 0
            while time.perf_counter() < deadline:
                step(client, i)
                i += 1
            counts[k] = i

    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(worker, range(clients)))
    return sum(counts) / (time.perf_counter() - started)


STALLED = 200
WORKERS = (("asyncio front (shipped)", ()), ("gthread, 8 threads (before)", ("-k", "gthread", "--threads", "8")),
           ("gthread, 64 threads", ("-k", "gthread", "--threads", "64")))


def _stall(port: int, in_headers: bool) -> socket.socket:
    """A connection that stops inside its request: in the headers, or after 1 of 100 body bytes."""
    s = socket.create_connection(("127.0.0.1", port), timeout=5)
    head = "POST /filter HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    s.sendall((head + ("X-Slow: " if in_headers else "Content-Length: 100\r\n\r\n{")).encode())
    return s


def _timed_requests(url: str, request: Callable[[ExtenderClient], Any], n: int) -> tuple[list[float], int]:
    """Wall ms of ``n`` requests on one keep-alive client (2 s timeout; gives up after 3 timeouts)."""
    samples: list[float] = []
    timeouts = 0
    with ExtenderClient(url, timeout=2.0) as client:
        for _ in range(n):
            started = time.perf_counter()
            try:
                request(client)
            except Exception:  # a timeout: the server did not answer within 2 s
                timeouts += 1
                if timeouts >= 3:
                    break
                continue
            samples.append((time.perf_counter() - started) * 1000)
    return samples, timeouts


def _latency(label: str, samples: list[float], timeouts: int, n: int) -> str:
    if not samples:
        return f"  {label:<28} no answer within 2 s ({timeouts} timeouts, gave up)"
    answered = f"{len(samples)}/{n} answered" + (f", {timeouts} timed out" if timeouts else "")
    return f"  {label:<28} p50 {pct(samples, 0.5):7.2f} ms  p99 {pct(samples, 0.99):8.2f} ms  ({answered})"


def bench_stalled(nodes: int = 100, samples: int = 200, seconds: float = 4.0) -> None:
    names = [f"node-{i}" for i in range(nodes)]
    body = filter_args(pod("probe", "v100-25"), names)  # the same pod: a re-filter keeps its reservation

    def health(c: ExtenderClient) -> None:
        assert c.get("/healthz")[0] == 200

    def decide(c: ExtenderClient) -> None:
        status, reply = c.post("/filter", body)
        assert status == 200 and reply["NodeNames"]

    print(f"{STALLED} stalled connections ({STALLED // 2} inside their headers, {STALLED // 2} inside their body), "
          f"{nodes} nodes x {GPUS}, one keep-alive client, 2 s client timeout:")
    throughput: dict[str, float] = {}
    for label, args in WORKERS:
        config = ExtenderConfig(standalone=True, nodes=nodes, gpus_per_node=GPUS, threads=8)
        with TemporaryDirectory() as tmp:
            server = start_on_free_port(config, log_path=Path(tmp) / "gunicorn.log", ready_timeout=120,
                                        env={"HOME": tmp}, gunicorn_args=args)
            try:
                idle = {"healthz": _timed_requests(server.url, health, samples),
                        "filter": _timed_requests(server.url, decide, samples)}
                throughput[label] = _loop(server.url, 4, seconds, lambda c, i: _sequence(c, names, i))
                stalled = [_stall(server.config.port, i % 2 == 0) for i in range(STALLED)]
                try:
                    time.sleep(0.5)  # every stalled connection is accepted and waiting
                    under = {"healthz": _timed_requests(server.url, health, samples),
                             "filter": _timed_requests(server.url, decide, samples)}
                finally:
                    for sock in stalled:
                        sock.close()
            finally:
                server.stop()
        print(f" {label}:")
        for what in ("healthz", "filter"):
            print(_latency(f"{what}, idle", *idle[what], samples))
            print(_latency(f"{what}, {STALLED} stalled", *under[what], samples))
    shipped = throughput[WORKERS[0][0]]
    print("  pods/s without a stall (filter+prioritize+bind+release, 4 clients): " + ", ".join(
        f"{label} {n:.1f} ({n / shipped:.2f}x)" for label, n in throughput.items()))


def noise_floor(samples: int = 2000) -> None:
    """p50/p99 of a fixed ~50 µs computation: what this machine's scheduling jitter adds to any p99."""
    work = list(range(2000))
    lat: list[Sample] = []
    for _ in range(samples):
        clocked(lambda: sum(x * x for x in work), lat)
    print("machine noise floor (same run):")
    print(line("fixed ~50 us of work", lat))


def main() -> None:
    """Print the extender's latency and throughput figures (nothing asserted)."""
    started = time.perf_counter()
    noise_floor()
    for nodes, pods in ((100, 400), (1000, 400), (5000, 300)):
        bench_node_names(nodes, pods)
    bench_full_nodes(1000, 60)
    bench_gunicorn(1000, seconds=6.0, clients=4)
    bench_stalled()
    print(f"(one run each, percentiles of raw samples; total {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
