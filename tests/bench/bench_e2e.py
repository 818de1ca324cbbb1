"""The real path at kube-scheduler's speed: ``make bench-e2e`` (not part of ``make bench`` or CI's pass/fail).

On the e2e control plane (real etcd, kube-apiserver and kube-scheduler v1.34.4 from
``deploy/e2e/build-kube.sh``), ``--nodes`` API-only nodes of ``--gpus`` V100s each (published as the
node agent publishes them, ``gpuslice.io/inventory``), bursts of ``--pods`` pods, in three
configurations run in turn, ``--rounds`` times, the order rotated each round:

* ``plain``: kube-scheduler alone (its default profile, client limits raised to qps/burst 5 000),
  CPU-only pods: the speed to match;
* ``deployed``: gpuslice as the chart installs it (``deploy/manifests/``): the webhook gates and
  routes, the queue gate lifts, kube-scheduler (the rendered KubeSchedulerConfiguration) calls the
  extender over mutual TLS, the extender binds; pods ask for v100-25/25/50/50/100, shuffled;
* ``deployed:best-fit``: the same with ``--policy best-fit`` instead of the chart's default policy
  (``MODE:POLICY`` runs any registered policy so, e.g. ``nogate:best-fit``);
* ``nogate``: the same with ``GPUSLICE_GATE=0`` (the webhook only routes; the queue only reserves and
  nudges).

Each burst starts its own kube-scheduler and extender (so their CPU and metrics are the burst's
alone) and is measured from its first pod creation to its last bind, seen by a watch of bound pods.
Printed per configuration (median over the rounds, and each round's value): pods bound/s, their
ratio to plain measured in the same round, create->bound p50/p99, CPU per bound pod of each process
(``/proc``), API requests per pod (kube-apiserver's ``apiserver_request_total``; the bench's own pod
creations count, as a user's would), webhook calls, watch events and watch KB per pod (minus the
bench's own watch, counted on its side), kube-scheduler's scheduling-algorithm time per pod (its
``scheduler_scheduling_algorithm_duration_seconds``), and for gpuslice the GPUs used against the lower
bound (the sum of the slices' sizes, rounded up) and a check that no GPU is over-committed.

Then, on ``--free-nodes`` full nodes with ``--waiting`` whole-card pods in line, ``--trials`` times:
one running pod is deleted, and the time until the next pod is bound is measured, with which pod it
was: the queue's head (the oldest waiting pod) or another (the gate's fairness, and what running
without it costs).

The goals of the real path follow, each a ratio of the same round: the default policy's extender CPU
per pod against best fit's, pods/s against plain, create->bound p99, the webhook's latency seen by
kube-apiserver (p99 interpolated in its histogram's buckets, as Prometheus' ``histogram_quantile``
does), pod creation against plain's (plain pods pass no webhook), the extender's CPU against
kube-scheduler's. ``--guard RATIO`` (CI, ``make bench-e2e-guard``) exits 1 when the default policy's
extender CPU per pod is above RATIO times best fit's in the same run.

Timing figures on a shared machine are noisy; the ratios are measured side by side in the same run.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import multiprocessing
import os
import random
import re
import shutil
import signal
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packing.inventory import ANNOTATION as INVENTORY
from packing.inventory import Card
from packing.inventory import encode as encode_cards
from packing.record import ANNOTATION as RECORD
from packing.record import decode as decode_record
from tests.bench import e2e_watch
from tests.e2e import gpuslice_harness as h
from tests.e2e.cluster import ControlPlane, free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
CONFIGS = ("plain", "deployed", "deployed:best-fit", "nogate")
DEFAULT_DEPLOYED, BEST_FIT_DEPLOYED = "deployed", "deployed:best-fit"  # the guard's pair
MIX = ("v100-25", "v100-25", "v100-50", "v100-50", "v100-100")
SIZE = {"v100-25": 0.25, "v100-50": 0.5, "v100-100": 1.0}
V100 = "Tesla-V100-SXM2-32GB"
CLK_TCK = os.sysconf("SC_CLK_TCK")
PLAIN_QPS = 5000  # the raised client limits of the plain kube-scheduler
WEBHOOK = "gate.gpuslice.io"
# the extender's settings as the chart runs it (cluster/config.py defaults; the e2e tests shorten them)
DEPLOYED_SETTINGS = {"lease_duration_s": "15", "renew_deadline_s": "10", "retry_period_s": "1",
                     "resync_s": "60", "tick_s": "1", "notice_interval_s": "10", "log_level": "info"}


# ---- the bench's own API client -------------------------------------------------------------------

class Api:
    """Lean HTTPS to kube-apiserver as admin: one keep-alive connection per thread (the bench's own
    calls must cost the machine little; they are the same in every configuration)."""

    def __init__(self, cp: ControlPlane) -> None:
        self.host, self.port = "127.0.0.1", cp.apiserver_port
        self.context = ssl.create_default_context(cafile=str(cp.ca_cert))
        self.context.load_cert_chain(str(cp.pki_dir / "admin.crt"), str(cp.pki_dir / "admin.key"))
        self._local = threading.local()

    def connection(self, timeout: float = 30.0) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(self.host, self.port, context=self.context, timeout=timeout)

    def call(self, method: str, path: str, body: Any = None,
             content_type: str = "application/json") -> tuple[int, bytes]:
        data = body if isinstance(body, bytes) or body is None else json.dumps(body).encode()
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = content_type
        for attempt in (1, 2):
            conn = getattr(self._local, "conn", None)
            if conn is None:
                conn = self._local.conn = self.connection()
            try:
                conn.request(method, path, body=data, headers=headers)
                resp = conn.getresponse()
                return resp.status, resp.read()
            except (OSError, http.client.HTTPException):
                conn.close()
                self._local.conn = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def json(self, method: str, path: str, body: Any = None) -> Any:
        status, data = self.call(method, path, body)
        if not 200 <= status < 300:
            raise RuntimeError(f"{method} {path}: HTTP {status}: {data[:300]!r}")
        return json.loads(data) if data else None

    def metrics(self) -> str:
        status, data = self.call("GET", "/metrics")
        if status != 200:
            raise RuntimeError(f"kube-apiserver /metrics: HTTP {status}")
        return data.decode()


class BoundWatch:
    """Watches the namespace's bound pods (``spec.nodeName!=``: one ADDED event per pod as it binds) from
    a process of its own (``e2e_watch``) and records when each was seen bound; counts its events and
    bytes so they can be taken off kube-apiserver's watch figures."""

    def __init__(self, cp: ControlPlane, namespace: str) -> None:
        self.namespace = namespace
        self.bound: dict[str, tuple[float, str]] = {}  # pod name -> (monotonic time seen bound, node)
        self.events = 0
        self.bytes = 0
        self.resumed = 0
        self.changed = threading.Condition()
        context = multiprocessing.get_context("spawn")
        self._in, child_end = context.Pipe(duplex=False)
        address = ("127.0.0.1", cp.apiserver_port, str(cp.ca_cert), str(cp.pki_dir / "admin.crt"),
                   str(cp.pki_dir / "admin.key"))
        self._process = context.Process(target=e2e_watch.watch, args=(address, namespace, child_end), daemon=True)
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._read, name="bench-watch", daemon=True)

    def start(self) -> BoundWatch:
        self._process.start()
        self._thread.start()
        if not self._ready.wait(60):
            raise RuntimeError("the bench's pod watch did not start")
        return self

    def _read(self) -> None:
        while True:
            try:
                message = self._in.recv()
            except (EOFError, OSError):
                return
            kind = message[0]
            if kind == "ready":
                self._ready.set()
            elif kind == "resumed":
                self.resumed += 1
                print(f"  ! kube-apiserver closed the bench's watch of {self.namespace}; resumed", flush=True)
            elif kind == "failed":
                print(f"  ! the bench's watch of {self.namespace} failed: {message[1]}", flush=True)
                return
            else:
                _, kind, name, node, seen, size = message
                self.events += 1
                self.bytes += size
                if kind in ("ADDED", "MODIFIED") and name and node and name not in self.bound:
                    with self.changed:
                        self.bound[name] = (seen, node)
                        self.changed.notify_all()

    def wait(self, done: Callable[[dict[str, tuple[float, str]]], bool], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        with self.changed:
            while not done(self.bound):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.changed.wait(min(left, 1.0))
            return True

    def stop(self) -> None:
        time.sleep(0.2)  # what is in the pipe is read first
        self._process.terminate()
        self._process.join(5)
        self._in.close()
        self._thread.join(5)


# ---- measurements ---------------------------------------------------------------------------------

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')

Samples = list[tuple[str, dict[str, str], float]]


def parse_metrics(text: str) -> Samples:
    """Prometheus text exposition into (name, labels, value) samples."""
    out: Samples = []
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        m = _SAMPLE.match(line)
        if m is None:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        out.append((m.group(1), dict(_LABEL.findall(m.group(2) or "")), value))
    return out


def total(samples: Samples, metric: str, **match: str) -> float:
    return sum(v for n, labels, v in samples if n == metric and all(labels.get(k) == w for k, w in match.items()))


def by_label(samples: Samples, name: str, keys: Sequence[str]) -> dict[tuple[str, ...], float]:
    out: dict[tuple[str, ...], float] = {}
    for n, labels, v in samples:
        if n == name:
            key = tuple(labels.get(k, "") for k in keys)
            out[key] = out.get(key, 0.0) + v
    return out


def group_cpu_s(pgid: int | None) -> float:
    """CPU seconds (user + system) of every live process in a process group."""
    if pgid is None:
        return 0.0
    ticks = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # fields after the name: state, ppid, pgrp, ... utime (11), stime (12)
            ticks += int(fields[11]) + int(fields[12])
    return ticks / CLK_TCK


def mean_ms_by_kind(before: Samples, after: Samples) -> dict[tuple[str, ...], float]:
    """kube-apiserver's mean time per request of each (verb, resource, subresource) between two scrapes."""
    keys = ("verb", "resource", "subresource")
    sums = [by_label(s, "apiserver_request_duration_seconds_sum", keys) for s in (before, after)]
    counts = [by_label(s, "apiserver_request_duration_seconds_count", keys) for s in (before, after)]
    out: dict[tuple[str, ...], float] = {}
    for kind, count in counts[1].items():
        n = count - counts[0].get(kind, 0.0)
        if n > 0 and kind[0] != "WATCH":
            out[kind] = (sums[1].get(kind, 0.0) - sums[0].get(kind, 0.0)) / n * 1000
    return out


def kind_ms(bursts: Sequence[Burst], kind: tuple[str, ...]) -> str:
    """" (N ms)": the median over ``bursts`` of kube-apiserver's mean time per request of ``kind``, if measured."""
    values = [b.request_ms[kind] for b in bursts if kind in b.request_ms]
    return f" ({med(values):.0f} ms)" if values else ""


def bucket_bounds(samples: Samples, metric: str, **match: str) -> list[str]:
    """The ``le`` labels of a histogram's buckets (as exposed: "0.005", ..., "+Inf")."""
    return sorted({labels["le"] for n, labels, _ in samples
                   if n == metric and "le" in labels and all(labels.get(k) == w for k, w in match.items())},
                  key=float)


def histogram_quantile(q: float, buckets: Mapping[str, float]) -> float:
    """The ``q`` quantile of cumulative bucket counts (``le`` -> count), interpolated linearly inside its
    bucket as Prometheus' ``histogram_quantile`` does (the upper bound of the last finite bucket beyond it)."""
    ordered = sorted(((float(le), c) for le, c in buckets.items()), key=lambda b: b[0])
    if not ordered or ordered[-1][1] <= 0:
        return float("nan")
    rank = q * ordered[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in ordered:
        if count >= rank:
            if math.isinf(bound):
                return lower
            return lower + (bound - lower) * ((rank - below) / (count - below) if count > below else 1.0)
        lower, below = bound, count
    return lower


def parse_config(config: str) -> tuple[str, str, str]:
    """``MODE[:POLICY][@LABEL]`` as (mode, policy or "" for the chart's, source label or "" for this tree)."""
    head, _, label = config.partition("@")
    mode, _, policy = head.partition(":")
    return mode, policy, label


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))] if ordered else float("nan")


@dataclass
class Snapshot:
    at: float
    cpu: dict[str, float]
    api: Samples
    scheduler: Samples
    extender: Samples


@dataclass
class Burst:
    config: str
    round: int
    pods: int
    bound: int
    seconds: float
    create_seconds: float
    create_retries: int
    latencies: list[float]
    cpu_ms: dict[str, float]  # process -> CPU ms per bound pod
    requests: float
    request_kinds: Counter[tuple[str, ...]]
    webhook_calls: float
    watch_events: float
    watch_kb: float
    algorithm_ms: float
    attempts: float
    extender_verbs: dict[str, tuple[float, float]] = field(default_factory=dict)  # verb -> (calls/pod, mean ms)
    connections: float | None = None
    cards_used: int = 0
    lower_bound: int = 0
    overcommitted: int = 0
    webhook_p99_ms: float = float("nan")  # seen by kube-apiserver, interpolated in its histogram
    # (verb, resource, subresource) -> kube-apiserver's mean time per request (apiserver_request_duration_seconds)
    request_ms: dict[tuple[str, ...], float] = field(default_factory=dict)

    @property
    def rate(self) -> float:
        return self.bound / self.seconds if self.seconds > 0 else 0.0


# ---- the cluster ----------------------------------------------------------------------------------

def kube_bin_dir() -> Path:
    from_env = os.environ.get("GPUSLICE_KUBE_BIN")
    if from_env:
        return Path(from_env)
    result = subprocess.run(["bash", str(REPO_ROOT / "deploy" / "e2e" / "build-kube.sh")], cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=3600, check=True)
    return Path(result.stdout.strip().splitlines()[-1])


def node_body(name: str, gpus: int) -> dict[str, Any]:
    cards = [Card(f"GPU-{name}-{i:02d}", i, V100, 32768) for i in range(gpus)]
    labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64"}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels, "annotations": {INVENTORY: encode_cards(cards)}}}


def node_status(name: str) -> dict[str, Any]:
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    resources = {"cpu": "64", "memory": "256Gi", "pods": "110", "ephemeral-storage": "100Gi"}
    return {"status": {
        "capacity": resources, "allocatable": resources,
        "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "bench node",
                        "lastHeartbeatTime": now, "lastTransitionTime": now}],
        "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": name}],
    }}


def create_nodes(api: Api, names: Iterable[str], gpus: int) -> None:
    def one(name: str) -> None:
        api.json("POST", "/api/v1/nodes", node_body(name, gpus))
        status, data = api.call("PATCH", f"/api/v1/nodes/{name}/status", json.dumps(node_status(name)).encode(),
                                "application/merge-patch+json")
        if status != 200:
            raise RuntimeError(f"node {name} status: HTTP {status} {data[:200]!r}")

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, names))


def delete_nodes(api: Api, names: Iterable[str]) -> None:
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda n: api.call("DELETE", f"/api/v1/nodes/{n}"), names))


def clear_pods(api: Api, namespace: str, timeout: float = 180.0) -> None:
    """Delete every pod of the namespace (grace 0: no kubelet confirms) and wait until none is left."""
    path = f"/api/v1/namespaces/{namespace}/pods"
    api.call("DELETE", path + "?gracePeriodSeconds=0")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        items = api.json("GET", path + "?limit=1").get("items") or []
        if not items:
            return
        time.sleep(0.5)
    raise RuntimeError(f"pods of {namespace} still there after {timeout:.0f} s")


def new_namespace(api: Api, prefix: str) -> str:
    name = f"{prefix}-{random.randrange(16**6):06x}"
    api.json("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    return name


def pod_body(name: str, product: str | None) -> bytes:
    container: dict[str, Any] = {"name": "main", "image": h.IMAGE, "resources": {"requests": {"cpu": "10m"}}}
    if product is not None:
        container["resources"] = {"requests": {"cpu": "10m", f"gpuslice.io/{product}": "1"},
                                  "limits": {f"gpuslice.io/{product}": "1"}}
    doc = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
           "spec": {"containers": [container], "terminationGracePeriodSeconds": 0}}
    return json.dumps(doc, separators=(",", ":")).encode()


class Bench:
    """The control plane, gpuslice's files, and the components of one configuration at a time."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.work = Path(tempfile.mkdtemp(prefix="gpuslice-bench-e2e-"))
        self.cp = ControlPlane(kube_bin_dir(), work_dir=self.work / "cp")
        self.cp.start()
        self.api = Api(self.cp)
        self.port = free_port()  # in the rendered scheduler configurations: one port for the run
        self.g = h.prepare(self.cp, self.work, self.port)  # each configuration points the webhook at its extender
        self.ext: h.Extender | None = None
        self.home = self.work / "home"  # gunicorn keeps per-user files under HOME: a private one
        self.home.mkdir()
        self.sources = {"": REPO_ROOT, **compared(args.compare)}
        probe = self.g.new_extender("bench", port=self.port)  # only for its URL and source tree
        self.g.extenders.clear()
        self.gpuslice_config: dict[str, Path] = {}
        for label, root in self.sources.items():  # each source tree's own rendered scheduler config
            probe.root = root
            self.gpuslice_config[label] = h.scheduler_config(self.g, probe, f"gpuslice-scheduler-{label}.yaml")
        self.plain_config = self.cp.write_scheduler_config(
            extra={"clientConnection": {"kubeconfig": str(self.cp.scheduler_kubeconfig), "qps": PLAIN_QPS,
                                        "burst": PLAIN_QPS}}, name="plain-scheduler.yaml")

    def close(self) -> None:
        self.stop_components()
        self.cp.stop()
        if self.args.keep:
            print(f"logs kept in {self.work}")
        else:
            shutil.rmtree(self.work, ignore_errors=True)

    # ---- components --------------------------------------------------------------------------

    def start_components(self, config: str) -> None:
        self.stop_components()
        metrics_paths = "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics"
        if config == "plain":
            self.cp.start_scheduler(self.plain_config, extra_args=[metrics_paths])
            return
        mode, policy, label = parse_config(config)
        settings = {**DEPLOYED_SETTINGS, "gate": "1" if mode == "deployed" else "0"}
        ext = self.g.new_extender("bench", port=self.port, **settings)  # a webhook port freshly free for each
        ext.env["HOME"] = str(self.home)
        ext.root = self.sources[label]
        if policy:
            ext.overrides["--policy"] = policy
        h.point_webhook(self.g.kube, ext.webhook_url)
        ext.start()
        ext.wait_ready(120)
        self.ext = ext
        self.cp.start_scheduler(self.gpuslice_config[label], extra_args=[metrics_paths])

    def stop_components(self) -> None:
        self.cp.stop_scheduler()
        if self.ext is not None:
            self.ext.stop()
            self.ext = None
        self.g.extenders.clear()

    # ---- measurements ------------------------------------------------------------------------

    def snapshot(self) -> Snapshot:
        pids = {name: self.cp.pid(name) for name in ("etcd", "kube-apiserver", "kube-scheduler")}
        cpu = {name: group_cpu_s(pid) for name, pid in pids.items()}
        ext = self.ext
        cpu["extender"] = group_cpu_s(ext.process.pid) if ext is not None and ext.process is not None else 0.0
        cpu["bench"] = time.process_time()
        return Snapshot(time.monotonic(), cpu, parse_metrics(self.api.metrics()), self._scheduler_metrics(),
                        parse_metrics(ext.metrics() + ext.webhook_metrics()) if ext is not None else [])

    def _profile(self, name: str) -> list[subprocess.Popen[bytes]]:
        """py-spy (``--profile DIR``) on each worker process of the extender, collapsed stacks into DIR/name.txt
        (the ledger's worker, spawned first) and DIR/name-webhook.txt (the webhook's, when it has one)."""
        if not self.args.profile or self.ext is None or self.ext.process is None:
            return []
        master = self.ext.process.pid
        children = Path(f"/proc/{master}/task/{master}/children").read_text().split()
        Path(self.args.profile).mkdir(parents=True, exist_ok=True)
        spy = os.environ.get("PY_SPY") or shutil.which("py-spy") or "py-spy"
        return [subprocess.Popen([spy, "record", "--pid", child, "--format", "raw", "--rate", "200", "--threads",
                                  "--gil", "--nonblocking", "-o", str(Path(self.args.profile) / f"{name}{suffix}.txt")],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                for child, suffix in zip(children, ("", "-webhook"), strict=False)]

    def _scheduler_metrics(self) -> Samples:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        conn = http.client.HTTPSConnection("127.0.0.1", self.cp.scheduler_port, context=context, timeout=10)
        try:
            conn.request("GET", "/metrics")
            resp = conn.getresponse()
            return parse_metrics(resp.read().decode()) if resp.status == 200 else []
        finally:
            conn.close()

    # ---- one burst ---------------------------------------------------------------------------

    def burst(self, config: str, round_: int) -> Burst:
        args = self.args
        self.start_components(config)
        namespace = new_namespace(self.api, f"{re.sub('[^a-z0-9-]', '-', config)}{round_}")
        rng = random.Random(round_)
        products: list[str | None] = [MIX[i % len(MIX)] for i in range(args.pods)]
        rng.shuffle(products)
        if config == "plain":
            products = [None] * args.pods
        names = [f"p{i:05d}" for i in range(args.pods)]
        bodies = [pod_body(n, p) for n, p in zip(names, products, strict=True)]
        watch = BoundWatch(self.cp, namespace).start()
        time.sleep(0.5)  # let the components settle after their start
        profilers = self._profile(f"{config}-{round_}") if config != "plain" else []
        before = self.snapshot()
        created: dict[str, float] = {}
        retries = Counter[str]()
        path = f"/api/v1/namespaces/{namespace}/pods"
        cursor = iter(range(args.pods))
        lock = threading.Lock()

        def creator() -> None:
            while True:
                with lock:
                    i = next(cursor, None)
                if i is None:
                    return
                started = time.monotonic()
                for _ in range(50):  # the webhook fails closed: a refused creation is retried, as a controller would
                    status, _ = self.api.call("POST", path, bodies[i])
                    if status == 201:
                        break
                    retries[str(status)] += 1
                    time.sleep(0.1)
                created[names[i]] = started

        threads = [threading.Thread(target=creator, daemon=True) for _ in range(args.clients)]
        first = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        create_seconds = time.monotonic() - first
        complete = watch.wait(lambda bound: len(bound) >= args.pods, args.burst_timeout)
        after = self.snapshot()
        for profiler in profilers:
            profiler.send_signal(signal.SIGINT)  # py-spy writes its output on an interrupt
        for profiler in profilers:
            profiler.wait(30)
        watch.stop()
        bound = dict(watch.bound)
        last = max((t for t, _ in bound.values()), default=first)
        latencies = [bound[n][0] - created[n] for n in bound if n in created]
        result = self._figures(config, round_, before, after, bound, first, last, create_seconds,
                               sum(retries.values()), latencies, watch)
        if not complete:
            print(f"  ! {config} round {round_}: only {len(bound)} of {args.pods} pods bound within "
                  f"{args.burst_timeout:.0f} s", flush=True)
        if config != "plain":
            self._cards(result, namespace, products, names)
        self.stop_components()
        clear_pods(self.api, namespace)
        return result

    def _figures(self, config: str, round_: int, before: Snapshot, after: Snapshot,
                 bound: Mapping[str, tuple[float, str]], first: float, last: float, create_seconds: float,
                 retries: int, latencies: list[float], watch: BoundWatch) -> Burst:
        n = max(1, len(bound))
        cpu = {k: (after.cpu[k] - before.cpu[k]) * 1000 / n for k in after.cpu}
        cpu["total"] = sum(v for k, v in cpu.items() if k != "bench")

        def delta(metric: str, samples: str = "api", **match: str) -> float:
            a, b = getattr(after, samples), getattr(before, samples)
            return total(a, metric, **match) - total(b, metric, **match)

        kinds_after = by_label(after.api, "apiserver_request_total", ("verb", "resource", "subresource"))
        kinds_before = by_label(before.api, "apiserver_request_total", ("verb", "resource", "subresource"))
        kinds = Counter({k: v - kinds_before.get(k, 0) for k, v in kinds_after.items()
                         if k[0] != "WATCH" and v - kinds_before.get(k, 0) > 0})
        requests = sum(kinds.values())
        request_ms = mean_ms_by_kind(before.api, after.api)
        webhook = delta("apiserver_admission_webhook_admission_duration_seconds_count", name=WEBHOOK)
        events = delta("apiserver_watch_events_total") - watch.events
        watch_bytes = delta("apiserver_watch_events_sizes_sum") - watch.bytes
        algo_s = delta("scheduler_scheduling_algorithm_duration_seconds_sum", "scheduler")
        attempts = delta("scheduler_schedule_attempts_total", "scheduler")
        verbs: dict[str, tuple[float, float]] = {}
        hooks = delta("apiserver_admission_webhook_admission_duration_seconds_count", name=WEBHOOK)
        webhook_p99 = float("nan")
        if hooks:
            seconds = delta("apiserver_admission_webhook_admission_duration_seconds_sum", name=WEBHOOK)
            verbs["webhook seen by kube-apiserver"] = (hooks / n, seconds / hooks * 1000)
            webhook_p99 = histogram_quantile(0.99, {
                le: delta("apiserver_admission_webhook_admission_duration_seconds_bucket", name=WEBHOOK, le=le)
                for le in bucket_bounds(after.api, "apiserver_admission_webhook_admission_duration_seconds_bucket",
                                        name=WEBHOOK)}) * 1000
        for verb in ("filter", "prioritize", "bind", "webhook"):
            calls = delta("gpuslice_extender_request_seconds_count", "extender", verb=verb)
            seconds = delta("gpuslice_extender_request_seconds_sum", "extender", verb=verb)
            if calls:
                verbs[verb] = (calls / n, seconds / calls * 1000)
        connections = None
        if any(name == "gpuslice_extender_connections_total" for name, _, _ in after.extender):
            connections = delta("gpuslice_extender_connections_total", "extender")
        return Burst(config, round_, self.args.pods, len(bound), max(1e-9, last - first), create_seconds, retries,
                     latencies, cpu, requests / n, Counter({k: v / n for k, v in kinds.items()}), webhook / n,
                     events / n, watch_bytes / n / 1024, algo_s * 1000 / n, attempts / n, verbs, connections,
                     webhook_p99_ms=webhook_p99, request_ms=request_ms)

    def _cards(self, burst: Burst, namespace: str, products: Sequence[str | None], names: Sequence[str]) -> None:
        items = self.api.json("GET", f"/api/v1/namespaces/{namespace}/pods").get("items") or []
        used: dict[str, int] = {}
        for pod in items:
            value = ((pod.get("metadata") or {}).get("annotations") or {}).get(RECORD)
            if not value or not (pod.get("spec") or {}).get("nodeName"):
                continue
            record = decode_record(value)
            for gpu in record.gpus:
                used[gpu] = used.get(gpu, 0) + record.milli
        bound = {(p.get("metadata") or {}).get("name") for p in items if (p.get("spec") or {}).get("nodeName")}
        size = sum(SIZE[p] for p, n in zip(products, names, strict=True) if p is not None and n in bound)
        burst.cards_used = len(used)
        burst.lower_bound = math.ceil(size - 1e-9)
        burst.overcommitted = sum(1 for milli in used.values() if milli > 1000)

    # ---- a freed slice -----------------------------------------------------------------------

    def freed(self, config: str) -> dict[str, Any]:
        """Full nodes, whole-card pods in line; delete one running pod at a time: how fast, and to whom."""
        args = self.args
        self.start_components(config)
        namespace = new_namespace(self.api, f"free-{re.sub('[^a-z0-9-]', '-', config)}")
        path = f"/api/v1/namespaces/{namespace}/pods"
        watch = BoundWatch(self.cp, namespace).start()
        cards = args.free_nodes * args.gpus
        running = [f"run-{i:03d}" for i in range(cards)]
        with ThreadPoolExecutor(8) as pool:
            list(pool.map(lambda n: self.api.json("POST", path, json.loads(pod_body(n, "v100-100"))), running))
        if not watch.wait(lambda b: all(n in b for n in running), 120):
            raise RuntimeError(f"{config}: the running pods were not all bound")
        line: list[str] = []  # waiting pods, oldest first (created over a second apart: distinct timestamps)
        made = 0
        last_create = 0.0

        def add_waiting() -> None:
            nonlocal made, last_create
            time.sleep(max(0.0, last_create + 1.1 - time.monotonic()))
            name = f"wait-{made:03d}"
            made += 1
            self.api.json("POST", path, json.loads(pod_body(name, "v100-100")))
            last_create = time.monotonic()
            line.append(name)

        for _ in range(args.waiting):
            add_waiting()
        time.sleep(2.0)  # every waiting pod has been tried and found no room (or is gated)
        latencies: list[float] = []
        to_head = 0
        passed_over: Counter[str] = Counter()
        timeouts = 0
        for trial in range(args.trials):
            victim = running.pop(0)
            seen = set(watch.bound)
            started = time.monotonic()
            self.api.call("DELETE", f"{path}/{victim}?gracePeriodSeconds=0")

            def freed_to_one(bound: dict[str, tuple[float, str]], seen: set[str] = seen) -> bool:
                return any(n in bound and n not in seen for n in line)

            got = watch.wait(freed_to_one, args.trial_timeout)
            if not got:
                timeouts += 1
                print(f"  ! {config} trial {trial}: no waiting pod bound within {args.trial_timeout:.0f} s", flush=True)
                continue
            winner = min((n for n in line if n in watch.bound and n not in seen), key=lambda n: watch.bound[n][0])
            latencies.append(watch.bound[winner][0] - started)
            if winner == line[0]:
                to_head += 1
            else:
                passed_over[line[0]] += 1
            line.remove(winner)
            running.append(winner)
            add_waiting()
            time.sleep(1.0)  # the newcomer has been tried (or gated) before the next slice frees
        watch.stop()
        self.stop_components()
        clear_pods(self.api, namespace)
        return {"config": config, "trials": args.trials, "latencies": latencies, "to_head": to_head,
                "timeouts": timeouts, "max_passed_over": max(passed_over.values(), default=0)}


# ---- the report -----------------------------------------------------------------------------------

def med(values: Iterable[float]) -> float:
    values = [v for v in values if v == v]
    return statistics.median(values) if values else float("nan")


def span(values: Sequence[float], fmt: str) -> str:
    return f"{format(med(values), fmt)} [{', '.join(format(v, fmt) for v in values)}]"


def report(bursts: list[Burst], freed: list[dict[str, Any]], rounds: int, configs: Sequence[str]) -> None:
    by: dict[str, list[Burst]] = {c: [b for b in bursts if b.config == c] for c in configs}
    print("\n== pods bound/s and create->bound (median over rounds [each round]) ==")
    print(f"{'path':<18} {'pods/s':<28} {'x plain (same round)':<28} {'p50 s':<24} {'p99 s':<24}")
    plain = {b.round: b.rate for b in by.get("plain", [])}
    for c in configs:
        bs = by[c]
        if not bs:
            continue
        ratios = [b.rate / plain[b.round] for b in bs if plain.get(b.round)]
        p50 = [pct(b.latencies, 0.5) for b in bs]
        p99 = [pct(b.latencies, 0.99) for b in bs]
        print(f"{c:<18} {span([b.rate for b in bs], '.0f'):<28} {span(ratios, '.2f'):<28} "
              f"{span(p50, '.2f'):<24} {span(p99, '.2f'):<24}")
    print("\n== per bound pod (median over rounds) ==")
    procs = ("extender", "kube-scheduler", "kube-apiserver", "etcd", "total", "bench")
    print(f"{'path':<18} " + " ".join(f"{p + ' ms':>17}" for p in procs))
    for c in configs:
        if by[c]:
            print(f"{c:<18} " + " ".join(f"{med(b.cpu_ms[p] for b in by[c]):>17.2f}" for p in procs))
    print(f"\n{'path':<18} {'requests':>9} {'webhook':>8} {'watch ev':>9} {'watch KB':>9} {'algo ms':>8} "
          f"{'attempts':>9} {'create s':>9} {'retries':>8} {'cards':>7} {'bound':>6} {'overcommit':>10}")
    for c in configs:
        bs = by[c]
        if not bs:
            continue
        cards = f"{med(b.cards_used for b in bs):.0f}" if c != "plain" else "-"
        bound = f"{med(b.lower_bound for b in bs):.0f}" if c != "plain" else "-"
        over = f"{sum(b.overcommitted for b in bs)}" if c != "plain" else "-"
        print(f"{c:<18} {med(b.requests for b in bs):>9.2f} {med(b.webhook_calls for b in bs):>8.2f} "
              f"{med(b.watch_events for b in bs):>9.2f} {med(b.watch_kb for b in bs):>9.2f} "
              f"{med(b.algorithm_ms for b in bs):>8.2f} {med(b.attempts for b in bs):>9.2f} "
              f"{med(b.create_seconds for b in bs):>9.1f} {med(b.create_retries for b in bs):>8.0f} "
              f"{cards:>7} {bound:>6} {over:>10}")
    print("\n== API requests per pod by kind (verb resource/subresource, per pod (mean ms in kube-apiserver, "
          "webhook included); median over rounds) ==")
    for c in configs:
        bs = by[c]
        if not bs:
            continue
        kinds = {k for b in bs for k in b.request_kinds}
        rows = sorted(((med(b.request_kinds.get(k, 0.0) for b in bs), k) for k in kinds), reverse=True)
        print(f"{c}: " + ", ".join(f"{k[0]} {k[1]}{'/' + k[2] if k[2] else ''} {v:.2f}{kind_ms(bs, k)}"
                                   for v, k in rows if v >= 0.01))
    print("\n== extender verbs per pod (calls, mean server ms; median over rounds) ==")
    for c in configs:
        if c == "plain":
            continue
        bs = by[c]
        if not bs:
            continue
        verbs = sorted({v for b in bs for v in b.extender_verbs})
        parts = [f"{v} {med(b.extender_verbs[v][0] for b in bs if v in b.extender_verbs):.2f} x "
                 f"{med(b.extender_verbs[v][1] for b in bs if v in b.extender_verbs):.2f} ms" for v in verbs]
        conns = [b.connections for b in bs if b.connections is not None]
        if conns:
            parts.append(f"connections accepted {med(conns):.0f} per burst")
        print(f"{c}: " + ", ".join(parts))
    goals(by, plain)
    compared_runs = [tuple(c.split("@", 1)) for c in configs if "@" in c]
    for mode, label in compared_runs:
        new, old = {b.round: b for b in by.get(mode, [])}, {b.round: b for b in by.get(f"{mode}@{label}", [])}
        pairs = [(new[r], old[r]) for r in sorted(new) if r in old]
        if not pairs:
            continue
        print(f"\n== {mode}: this tree against {label}'s, same round (median [each round]) ==")
        for what, get in (("pods/s", lambda x: x.rate), ("p50 s", lambda x: pct(x.latencies, 0.5)),
                          ("CPU total ms/pod", lambda x: x.cpu_ms["total"]),
                          ("extender ms/pod", lambda x: x.cpu_ms["extender"]),
                          ("kube-apiserver ms/pod", lambda x: x.cpu_ms["kube-apiserver"]),
                          ("requests/pod", lambda x: x.requests), ("algo ms/pod", lambda x: x.algorithm_ms)):
            ratios = [get(n) / get(o) if get(o) else float("nan") for n, o in pairs]
            print(f"  {what:<22} this/{label} {span(ratios, '.2f')}")
    if freed:
        print("\n== a freed slice -> the next pod bound ==")
        for f in freed:
            lat = f["latencies"]
            print(f"{f['config']:<18} p50 {pct(lat, 0.5) * 1000:.0f} ms, p99 {pct(lat, 0.99) * 1000:.0f} ms "
                  f"(max {max(lat, default=float('nan')) * 1000:.0f} ms); to the oldest waiting pod "
                  f"{f['to_head']} of {f['trials']}; no pod bound within the trial timeout {f['timeouts']}; "
                  f"most times one head pod was passed over: {f['max_passed_over']}")
    print(f"\n({rounds} round(s); timing figures are noisy on a shared machine: the ratios are side by side)")


def same_round(news: Sequence[Burst], olds: Sequence[Burst], get: Callable[[Burst], float]) -> list[float]:
    """``get(new) / get(old)`` for each round both ran."""
    old = {b.round: b for b in olds}
    return [get(b) / get(old[b.round]) if get(old[b.round]) else float("nan") for b in news if b.round in old]


def goals(by: Mapping[str, list[Burst]], plain: Mapping[int, float]) -> None:
    """The real path's goals (issue #28), each from figures of the same round: median [each round]."""
    plains = {b.round: b for b in by.get("plain", [])}
    rows: list[tuple[str, str]] = []
    default, best = by.get(DEFAULT_DEPLOYED, []), by.get(BEST_FIT_DEPLOYED, [])
    if default and best:
        rows.append(("extender CPU/pod, default policy / best-fit (<= 1.1)",
                     span(same_round(default, best, lambda b: b.cpu_ms["extender"]), ".2f")))
        rows.append(("pods/s, default policy / best-fit", span(same_round(default, best, lambda b: b.rate), ".2f")))
    for c in (DEFAULT_DEPLOYED, BEST_FIT_DEPLOYED):
        bs = by.get(c, [])
        if not bs:
            continue
        rows.append((f"{c}: pods/s x plain (>= 0.5)",
                     span([b.rate / plain[b.round] for b in bs if plain.get(b.round)], ".2f")))
        rows.append((f"{c}: create->bound p99 s (<= 3)", span([pct(b.latencies, 0.99) for b in bs], ".2f")))
        rows.append((f"{c}: webhook p99 ms seen by kube-apiserver (<= 20)",
                     span([b.webhook_p99_ms for b in bs], ".1f")))
        rows.append((f"{c}: pod creation rate x plain's (>= 0.9)",
                     span([plains[b.round].create_seconds / b.create_seconds for b in bs if b.round in plains], ".2f")))
        rows.append((f"{c}: extender CPU / kube-scheduler CPU (<= 1)",
                     span([b.cpu_ms["extender"] / b.cpu_ms["kube-scheduler"] if b.cpu_ms["kube-scheduler"] else
                           float("nan") for b in bs], ".2f")))
    if not rows:
        return
    print("\n== goals of the real path (same round; median [each round]) ==")
    width = max(len(r[0]) for r in rows)
    for what, value in rows:
        print(f"  {what:<{width}}  {value}")


def guard(by: Mapping[str, list[Burst]], limit: float) -> bool:
    """True when the default policy's extender CPU per pod is within ``limit`` times best fit's (same rounds)."""
    ratios = same_round(by.get(DEFAULT_DEPLOYED, []), by.get(BEST_FIT_DEPLOYED, []), lambda b: b.cpu_ms["extender"])
    if not ratios:
        print(f"guard: no round ran both {DEFAULT_DEPLOYED} and {BEST_FIT_DEPLOYED}", file=sys.stderr)
        return False
    ratio = med(ratios)
    verdict = "ok" if ratio <= limit else "FAILED"
    print(f"\nguard: extender CPU per pod, the default policy / best-fit = {ratio:.2f} "
          f"(limit {limit:.2f}): {verdict}")
    return ratio <= limit


def compared(specs: Sequence[str]) -> dict[str, Path]:
    """``LABEL=DIR`` options as label -> source tree."""
    out: dict[str, Path] = {}
    for spec in specs:
        label, sep, path = spec.partition("=")
        if not sep or not label or "@" in label:
            raise SystemExit(f"--compare takes LABEL=DIR, got {spec!r}")
        out[label] = Path(path).resolve()
    return out


def main(argv: Sequence[str] = ()) -> int:
    parser = argparse.ArgumentParser(prog="bench_e2e", description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--pods", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--configs", default="", help="comma-separated; default: all (and each --compare's)")
    parser.add_argument("--compare", action="append", default=[], metavar="LABEL=DIR",
                        help="another source tree (e.g. a `git archive` of main): its extender and deploy/ run as "
                        "deployed@LABEL and nogate@LABEL, side by side (repeatable)")
    parser.add_argument("--clients", type=int, default=16, help="threads creating pods")
    parser.add_argument("--burst-timeout", type=float, default=180.0)
    parser.add_argument("--free-nodes", type=int, default=2)
    parser.add_argument("--waiting", type=int, default=5)
    parser.add_argument("--trials", type=int, default=10)
    parser.add_argument("--trial-timeout", type=float, default=20.0)
    parser.add_argument("--keep", action="store_true", help="keep the work dir (component logs)")
    parser.add_argument("--profile", default="", help="py-spy the extender's worker in each burst, into this dir")
    parser.add_argument("--guard", type=float, default=0.0, metavar="RATIO",
                        help=f"exit 1 when {DEFAULT_DEPLOYED}'s extender CPU per pod is above RATIO x "
                        f"{BEST_FIT_DEPLOYED}'s in the same run (CI; both must be among the configurations)")
    args = parser.parse_args(list(argv))
    configs = [c for c in args.configs.split(",") if c] or [
        *CONFIGS, *(f"{c}@{label}" for label in compared(args.compare) for c in CONFIGS[1:])]
    for config in configs:
        mode, policy, _ = parse_config(config)
        if config != "plain" and (mode not in ("deployed", "nogate") or ":" in policy):
            parser.error(f"unknown configuration {config!r}: plain, or deployed|nogate[:POLICY][@LABEL]")
    if args.guard and not {DEFAULT_DEPLOYED, BEST_FIT_DEPLOYED} <= set(configs):
        parser.error(f"--guard compares {DEFAULT_DEPLOYED} with {BEST_FIT_DEPLOYED}: run both")
    started = time.monotonic()
    bench = Bench(args)
    bursts: list[Burst] = []
    freed: list[dict[str, Any]] = []
    try:
        print(f"control plane up in {time.monotonic() - started:.0f} s", flush=True)
        if args.trials:
            free_nodes = [f"free-{i}" for i in range(args.free_nodes)]
            create_nodes(bench.api, free_nodes, args.gpus)
            for config in (c for c in configs if c != "plain"):
                freed.append(bench.freed(config))
                f = freed[-1]
                print(f"freed slice, {config}: {len(f['latencies'])} trials, to the head {f['to_head']}", flush=True)
            delete_nodes(bench.api, free_nodes)
        names = [f"node-{i:04d}" for i in range(args.nodes)]
        create_nodes(bench.api, names, args.gpus)
        print(f"{args.nodes} nodes x {args.gpus} V100 in {time.monotonic() - started:.0f} s", flush=True)
        for r in range(args.rounds):
            order = configs[r % len(configs):] + configs[:r % len(configs)]
            for config in order:
                b = bench.burst(config, r)
                bursts.append(b)
                print(f"round {r} {config}: {b.bound}/{b.pods} bound, {b.rate:.0f} pods/s, p50 "
                      f"{pct(b.latencies, 0.5):.2f} s, p99 {pct(b.latencies, 0.99):.2f} s "
                      f"(created in {b.create_seconds:.1f} s; {time.monotonic() - started:.0f} s in)", flush=True)
    finally:
        bench.close()
    report(bursts, freed, args.rounds, configs)
    passed = not args.guard or guard({c: [b for b in bursts if b.config == c] for c in configs}, args.guard)
    print(f"--- bench_e2e: {time.monotonic() - started:.0f} s")
    return 0 if passed else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
