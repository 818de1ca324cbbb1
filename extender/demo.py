"""``gpuslice serve --standalone --demo``: a real gunicorn extender driven like kube-scheduler drives it.

Starts the extender (standalone, seeded nodes) as a gunicorn process on 127.0.0.1, sends a sample
workload through real HTTP — filter, then prioritize, then bind, picking at random among the
top-scored nodes as kube-scheduler does — shows placements, free capacity and the waiting queue,
releases a few pods, serves the queue again in order, then stops the server.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from extender.client import ExtenderClient
from extender.config import ExtenderConfig
from extender.samples import binding_args, filter_args, pod
from extender.server import ServerError, start_on_free_port

WORKLOAD: tuple[tuple[str, str], ...] = (
    ("notebook-a", "v100-25"), ("train-b", "v100-50"), ("infer-c", "v100-25"), ("train-d", "v100-100"),
    ("notebook-e", "v100-25"), ("train-f", "v100-50"), ("infer-g", "v100-25"), ("train-h", "v100-100"),
    ("infer-i", "v100-25"), ("train-j", "v100-50"), ("train-k", "v100-100"), ("infer-l", "v100-25"),
    ("train-m", "v100-100"), ("notebook-n", "v100-50"),
)
RELEASES = ("train-b", "notebook-a", "infer-c", "train-d")
DEMO_NODES, DEMO_GPUS = 3, 2


class DemoError(Exception):
    """The extender answered something kube-scheduler would not accept."""


def _check(status: int, reply: Any, what: str) -> Any:
    if status != 200:
        raise DemoError(f"{what}: HTTP {status}: {reply}")
    return reply


def schedule(client: ExtenderClient, config: ExtenderConfig, pod_doc: dict[str, Any], nodes: list[str],
             rng: random.Random) -> tuple[str | None, str]:
    """One scheduling cycle as kube-scheduler runs it; (node, "") when bound, (None, why) otherwise."""
    name = pod_doc["metadata"]["name"]
    reply = _check(*client.post(config.verb_path(config.filter_verb), filter_args(pod_doc, nodes)), f"filter {name}")
    if reply["Error"]:
        raise DemoError(f"filter {name}: {reply['Error']}")
    feasible = reply["NodeNames"]
    if not feasible:
        reasons = sorted(set(reply["FailedNodes"].values()) | set(reply["FailedAndUnresolvableNodes"].values()))
        return None, "; ".join(reasons)
    if len(feasible) > 1:  # kube-scheduler skips prioritize when one node is left
        scores = _check(*client.post(config.verb_path(config.prioritize_verb), filter_args(pod_doc, feasible)),
                        f"prioritize {name}")
        top = max(s["Score"] for s in scores)
        feasible = [s["Host"] for s in scores if s["Score"] == top]
    node = rng.choice(feasible)  # ties are broken at random upstream
    bound = _check(*client.post(config.verb_path(config.bind_verb), binding_args(pod_doc, node)), f"bind {name}")
    if bound["Error"]:
        return None, bound["Error"]
    return node, ""


def _cards(state: dict[str, Any]) -> list[str]:
    lines = []
    for node in state["nodes"]:
        cards = " ".join(f"{g['uuid'].rsplit('/', 1)[-1]} [{'#' * ((g['milli'] - g['free_milli']) // 250):<4}]"
                         for g in node["gpus"])
        free = sum(g["free_milli"] for g in node["gpus"])
        lines.append(f"  {node['name']:<8} {cards}   free {free} milli")
    slices = ", ".join(f"{p} x{n}" for p, n in state["free_slices"].items())
    lines.append(f"  free slices now: {slices}")
    return lines


def _queue(state: dict[str, Any]) -> list[str]:
    if not state["queue"]:
        return ["  (nobody waits)"]
    return [f"  {w['position']}. {w['pod']:<20} {w['product']:<9} {w['reason']}: {w['message']}"
            for w in state["queue"]]


def _gpus_of(state: dict[str, Any], uid: str) -> str:
    for a in state["allocations"]:
        if a["pod_uid"] == uid:
            return ",".join(a["gpus"])
    return "?"


def _serve(client: ExtenderClient, config: ExtenderConfig, name: str, product: str, pod_doc: dict[str, Any],
           nodes: list[str], rng: random.Random, waits: str) -> str:
    """Schedule one pod; the demo's line about where it went or why it ``waits``."""
    node, why = schedule(client, config, pod_doc, nodes, rng)
    if node is None:
        return f"  {name:<11} {product:<9} {waits}: {why}"
    state = _check(*client.get("/state"), "state")
    return f"  {name:<11} {product:<9} -> {node:<7} {_gpus_of(state, pod_doc['metadata']['uid'])}"


def _report(out: Callable[[str], None], state: dict[str, Any], queue_title: str) -> None:
    """Free capacity, then the waiting queue under ``queue_title``."""
    out("\nfree capacity:")
    for line in _cards(state):
        out(line)
    out(queue_title)
    for line in _queue(state):
        out(line)


def demo_config(config: ExtenderConfig) -> ExtenderConfig:
    """The settings the demo serves: standalone, and its own nodes unless ``config`` seeds some."""
    if config.nodes:
        return replace(config, standalone=True)
    return replace(config, standalone=True, nodes=DEMO_NODES, gpus_per_node=DEMO_GPUS)


def run_demo(config: ExtenderConfig, out: Callable[[str], None] = print, seed: int = 7) -> int:
    """Drive a fresh gunicorn extender with the sample workload; 0 when every reply was well-formed."""
    config = demo_config(config)
    nodes, gpus = config.nodes, config.gpus_per_node
    try:
        server = start_on_free_port(config)
    except ServerError as e:
        out(f"gpuslice demo: the extender did not start: {e}")
        return 1
    rng = random.Random(seed)
    names = [f"node-{i}" for i in range(nodes)]
    pods = {name: pod(name, product) for name, product in WORKLOAD}
    client = ExtenderClient(server.url)
    try:
        out(f"gpuslice extender (standalone, {config.mode} mode, {config.policy}): gunicorn pid {server.pid} "
            f"on {server.url}")
        out(f"cluster: {nodes} nodes x {gpus} {config.gpu_model}; pods sent through real HTTP like kube-scheduler "
            "(filter -> prioritize -> bind, random among top scores)\n")
        for name, product in WORKLOAD:
            out(_serve(client, config, name, product, pods[name], names, rng, "waits"))
        state = _check(*client.get("/state"), "state")
        _report(out, state, "waiting queue (GET /state):")
        out(f"\nreleasing {', '.join(RELEASES)} (POST /admin/release)")
        for name in RELEASES:
            _check(*client.post("/admin/release", {"PodUID": pods[name]["metadata"]["uid"]}), f"release {name}")
        out("serving the queue in order:")
        by_uid = {p["metadata"]["uid"]: n for n, p in pods.items()}
        for entry in state["queue"]:
            name = by_uid[entry["uid"]]
            out(_serve(client, config, name, entry["product"], pods[name], names, rng, "still waits"))
        state = _check(*client.get("/state"), "state")
        _report(out, state, "waiting queue:")
        bound = sum(1 for a in state["allocations"] if a["state"] == "bound")
        out(f"\n{bound} pods hold slices, {len(state['queue'])} wait.")
        return 0
    except DemoError as e:
        out(f"gpuslice demo: {e}")
        return 1
    finally:
        client.close()
        code = server.stop()
        out(f"stopped gunicorn pid {server.pid} (exit {code})")
