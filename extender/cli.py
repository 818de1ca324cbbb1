"""``gpuslice serve`` (run the extender under gunicorn) and ``gpuslice status`` (print a running one's state)."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import socket
import sys
import time
from collections.abc import Sequence
from typing import Any

from extender.client import ClientError, ExtenderClient
from extender.config import DEFAULT_MAX_BODY, DEFAULT_PORT, ConfigError, ExtenderConfig, parse_subject
from extender.state import MODES
from extender.wire import DEFAULT_MAX_NODES
from packing.argtypes import (
    non_negative_int,
    non_negative_number,
    port,
    positive_int,
    positive_number,
    readable_file,
)
from packing.load_phase import DEFAULT_THRESHOLD as CHURN_AT
from packing.policies import DEFAULT_POLICY, policy_names
from packing.usage import Applies, CommandParser, fields_as_flags

STANDALONE_ONLY = ("--nodes", "--cards-per-node", "--gpu-model", "--learn-nodes", "--waiting-ttl", "--demo")
# ExtenderConfig's and the state's words for what the flags set (they also read GPUSLICE_* settings)
FIELD_FLAGS = {"verbs": "the verbs (--filter-verb, --prioritize-verb, --bind-verb)", "GPU model": "--gpu-model",
               "webhook port": "--webhook-port", "port": "--port", "threads": "--threads", "max nodes": "--max-nodes",
               "max body": "--max-body-mib",
               "body_timeout_s": "--body-timeout", "slow_request_s": "--slow-request", "prefix": "--prefix",
               "reservation TTL": "--reservation-ttl", "waiting TTL": "--waiting-ttl",
               "pod cache size": "--pod-cache"}


def _url_prefix(text: str) -> str:
    """--prefix: empty, or a path that starts with '/' and does not end with one."""
    if text and (not text.startswith("/") or text.endswith("/") or " " in text):
        raise argparse.ArgumentTypeError(f"expected a path such as /v1 (a leading '/', no trailing one), got {text!r}")
    return text


def _path_segment(text: str) -> str:
    """A verb's path: one segment under --prefix."""
    if not text or "/" in text or " " in text:
        raise argparse.ArgumentTypeError(f"expected one path segment such as filter (no '/'), got {text!r}")
    return text


def _subject(text: str) -> str:
    """An allowed client subject, checked as the extender reads it."""
    try:
        parse_subject(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def _parser() -> CommandParser:
    ap = CommandParser(
        prog="gpuslice serve",
        description="Run the kube-scheduler extender (gunicorn: one worker process, threads).",
    )
    where = ap.add_mutually_exclusive_group()
    where.add_argument("--standalone", action="store_true",
                       help="no cluster: state in memory (not durable), nodes from --nodes (or --learn-nodes), "
                            "binds kept in memory")
    where.add_argument("--cluster", action="store_true",
                       help="in a cluster (the default): sync from the API server (extender.cluster)")
    ap.add_argument("--demo", action="store_true",
                    help="with --standalone: start the server, drive it with a sample workload, stop, exit")
    ap.add_argument("--host", default="127.0.0.1", help="listen address (default 127.0.0.1)")
    ap.add_argument("--port", type=port, default=DEFAULT_PORT, help=f"listen port (default {DEFAULT_PORT})")
    ap.add_argument("--webhook-port", type=port, default=0, metavar="PORT",
                    help="cluster: serve the admission webhook on this port from a worker process of its own, which "
                         "answers on every replica, leader or not, and which no queue step or bind can delay "
                         "(default: on --port, in the extender's process)")
    ap.add_argument("--threads", type=positive_int, default=8,
                    help="threads deciding whole requests in the one worker (default 8; bodies are read before)")
    ap.add_argument("--bind-threads", type=positive_int, default=32,
                    help="threads of binds alone, which wait for the API server in a cluster (default 32)")
    ap.add_argument("--prefix", type=_url_prefix, default="", help="URL prefix of the verbs, e.g. /v1 (default none)")
    for verb, key in (("filter", "filterVerb"), ("prioritize", "prioritizeVerb"), ("bind", "bindVerb")):
        ap.add_argument(f"--{verb}-verb", type=_path_segment, default=verb, metavar="PATH",
                        help=f"URL path of the {verb} call under --prefix: what kube-scheduler's "
                             f"KubeSchedulerConfiguration names extenders[].{key} (default {verb})")
    ap.add_argument("--mode", choices=MODES, default="strict",
                    help="strict (default): filter keeps only the policy's best nodes and reserves; "
                         "cooperative: all fitting")
    ap.add_argument("--policy", choices=policy_names(), default=DEFAULT_POLICY,
                    help=f"placement policy (default {DEFAULT_POLICY}); the simulator offers the same set")
    ap.add_argument("--reservation-ttl", type=positive_number, default=30.0, metavar="SECONDS",
                    help="how long a filter's reservation waits for its bind (default 30)")
    ap.add_argument("--pod-cache", type=positive_int, default=10_000, metavar="PODS",
                    help="pods remembered between filter and bind (default 10000)")
    ap.add_argument("--refuse-resource", action="append", default=[], metavar="NAME",
                    help="refuse pods asking for this resource, e.g. nvidia.com/gpu (repeatable)")
    ap.add_argument("--max-body-mib", type=positive_int, default=DEFAULT_MAX_BODY // (1024 * 1024),
                    help="largest request body in MiB (413 beyond it, chunked bodies too; default "
                         f"{DEFAULT_MAX_BODY // (1024 * 1024)})")
    ap.add_argument("--max-nodes", type=positive_int, default=DEFAULT_MAX_NODES,
                    help=f"most nodes one filter or prioritize may name (413 beyond; default {DEFAULT_MAX_NODES})")
    ap.add_argument("--body-timeout", type=positive_number, default=10.0, metavar="SECONDS",
                    help="a request body still arriving after this long is refused with 408 (default 10)")
    ap.add_argument("--slow-request", type=positive_number, default=0.5, metavar="SECONDS",
                    help="log a request slower than this with its phases (default 0.5)")
    ap.add_argument("--admin", action="store_true", help="enable POST /admin/release (always on standalone)")
    ap.add_argument("--learn-nodes", action="store_true",
                    help="standalone: take GPU inventories from the Node objects of request bodies (trusts every "
                         "client that reaches the port: use it with mutual TLS)")
    ap.add_argument("--waiting-ttl", type=positive_number, default=600.0, metavar="SECONDS",
                    help="standalone: a waiting pod no filter asked about for this long leaves the queue (default 600)")
    ap.add_argument("--nodes", type=non_negative_int, default=0, metavar="N",
                    help="standalone: seed N nodes named node-<i>")
    ap.add_argument("--cards-per-node", type=positive_int, default=8, metavar="N",
                    help="standalone: cards per seeded node (default 8; --gpus-per-node is its deprecated old name)")
    ap.alias("--gpus-per-node", "--cards-per-node")
    ap.add_argument("--gpu-model", default="Tesla-V100-SXM2-32GB",
                    help="standalone: model label of seeded cards (default Tesla-V100-SXM2-32GB)")
    ap.add_argument("--catalog", type=readable_file, default=None, metavar="TOML",
                    help="product catalog TOML (default: the built-in V100 catalog)")
    ap.add_argument("--tls-cert", type=readable_file, default=None, metavar="PEM",
                    help="serve HTTPS with this certificate (PEM)")
    ap.add_argument("--tls-key", type=readable_file, default=None, metavar="PEM",
                    help="the certificate's private key (PEM)")
    ap.add_argument("--client-ca", type=readable_file, default=None, metavar="PEM",
                    help="verify client certificates against this CA (PEM)")
    ap.add_argument("--require-client-cert", action="store_true",
                    help="filter, prioritize and bind need a client certificate signed by --client-ca")
    ap.add_argument("--client-subject", type=_subject, action="append", default=[], metavar="SUBJECT",
                    help="allow only client certificates with this subject, e.g. CN=kube-scheduler or "
                         "/O=gpuslice/CN=kube-scheduler (repeatable)")
    ap.add_argument("--metrics-subject", type=_subject, action="append", default=[], metavar="SUBJECT",
                    help="also allow client certificates with this subject, for GET /metrics only (a Prometheus; "
                         "repeatable)")
    history = ap.add_argument_group("demand history (GET /history, gpuslice history export)")
    history.add_argument("--no-history", dest="history", action="store_false",
                         help="keep no demand history (default: keep one)")
    history.add_argument("--history-max-age", type=positive_number, default=30.0, metavar="DAYS",
                         help="claims that ended longer ago leave the history (default 30 days)")
    history.add_argument("--history-max-mib", type=positive_int, default=64, metavar="MIB",
                         help="the history's size bound, in MiB of its JSON lines (default 64)")
    history.add_argument("--history-names", action="store_true",
                         help="keep pod names (namespace/name) in the history (default: claim ids only)")
    return ap


def config_from_args(args: argparse.Namespace) -> ExtenderConfig:
    """The ExtenderConfig the command line asks for; ConfigError when it is inconsistent."""
    return ExtenderConfig(
        host=args.host, port=args.port, webhook_port=args.webhook_port, threads=args.threads,
        bind_threads=args.bind_threads, prefix=args.prefix,
        filter_verb=args.filter_verb, prioritize_verb=args.prioritize_verb, bind_verb=args.bind_verb,
        max_body_bytes=args.max_body_mib * 1024 * 1024, mode=args.mode, policy=args.policy,
        reservation_ttl_s=args.reservation_ttl, pod_cache_size=args.pod_cache,
        refused_resources=tuple(args.refuse_resource), standalone=args.standalone, admin=args.admin,
        nodes=args.nodes, gpus_per_node=args.cards_per_node, gpu_model=args.gpu_model, catalog=args.catalog or "",
        max_nodes=args.max_nodes, body_timeout_s=args.body_timeout, slow_request_s=args.slow_request,
        learn_nodes=args.learn_nodes, waiting_ttl_s=args.waiting_ttl, tls_cert=args.tls_cert or "",
        tls_key=args.tls_key or "", client_ca=args.client_ca or "", require_client_cert=args.require_client_cert,
        client_subjects=tuple(args.client_subject), metrics_subjects=tuple(args.metrics_subject),
        history=args.history, history_max_age_s=args.history_max_age * 86400.0,
        history_max_mib=args.history_max_mib, history_names=args.history_names,
    )


STANDALONE_APP = "extender.app:app_from_env"
CLUSTER_APP = "extender.cluster.serve:app_from_env"


def _entry_point(config: ExtenderConfig) -> str:
    """``module:function`` building the app in the gunicorn worker."""
    if config.standalone:
        return STANDALONE_APP
    if importlib.util.find_spec(CLUSTER_APP.partition(":")[0]) is None:
        raise ConfigError("cluster mode needs extender.cluster (cluster sync), not in this build; "
                          "run with --standalone")
    return CLUSTER_APP


def _serve(config: ExtenderConfig) -> int:
    """Run gunicorn in this process (it becomes the master) with the shipped config file."""
    from gunicorn.app.base import BaseApplication

    target = _entry_point(config)
    if config.standalone:
        from extender.app import build_app

        build_app(config)  # fail here, with a clear message, rather than in a booting worker
    else:
        from extender.cluster.config import ClusterConfig

        ClusterConfig.from_env()  # the same for bad GPUSLICE_* cluster settings
    _check_listen(config.host, config.port)
    if config.webhook_port:
        _check_listen(config.host, config.webhook_port, "--webhook-port")
    os.environ.update(config.to_env())

    class _Extender(BaseApplication):  # type: ignore[misc]
        def load_config(self) -> None:
            settings = vars(importlib.import_module("extender.gunicorn_conf"))  # reads the env set above
            for name, value in settings.items():
                if name in self.cfg.settings:
                    self.cfg.set(name, value)

        def load(self) -> Any:
            module, _, function = target.partition(":")
            return getattr(importlib.import_module(module), function)()

    _Extender().run()
    return 0


class CannotListen(Exception):
    """The address to serve on is taken or cannot be had (exit status 1: the machine, not the flags)."""


def listen_address(host: str, port_number: int) -> tuple[Any, ...]:
    """(family, type, proto, canonname, sockaddr) of the address to listen on; ConfigError naming --host."""
    try:
        return tuple(socket.getaddrinfo(host, port_number, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0])
    except socket.gaierror as e:
        raise ConfigError(f"--host {host}: not an address to listen on ({e.strerror})") from None


def _check_listen(host: str, port_number: int, flag: str = "--port") -> None:
    """Bind the address once, as gunicorn would, so a taken port is one line rather than gunicorn's retries."""
    family, kind, proto, _, address = listen_address(host, port_number)
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as gunicorn: a TIME_WAIT port is free
        try:
            sock.bind(address)
        except OSError as e:
            raise CannotListen(f"cannot listen on {host}:{port_number}: {e.strerror} (another server there? "
                               f"choose another {flag})") from None


def _rules() -> list[Applies]:
    return [
        Applies(STANDALONE_ONLY, lambda a: a.standalone,
                "applies to --standalone only (in a cluster the nodes come from the API server)",
                "drop it, or add --standalone"),
        Applies(("--webhook-port",), lambda a: not a.standalone, "serves the cluster's admission webhook, and "
                "--standalone serves none", "drop it, or drop --standalone"),
        Applies(("--cards-per-node",), lambda a: a.nodes > 0, "sizes the nodes --nodes seeds, and none are seeded",
                "add --nodes N"),
        Applies(("--gpu-model",), lambda a: a.nodes > 0 or a.demo, "labels the cards --nodes seeds, and none are "
                "seeded", "add --nodes N"),
        Applies(("--history-max-age", "--history-max-mib", "--history-names"), lambda a: a.history,
                "shapes the demand history, and --no-history keeps none", "drop one of them"),
    ]


def main(argv: Sequence[str]) -> int:
    """``gpuslice serve``: exit code 0 on a clean stop, 2 on bad settings, 1 when the address is taken."""
    ap = _parser()
    args = ap.parse_args(list(argv))
    if ap.check(args, _rules()):
        return 2
    if args.standalone and not args.demo and not args.nodes and not args.learn_nodes:
        ap.error("--standalone with no nodes would serve nothing: seed them with --nodes N (--cards-per-node "
                 "cards each), or take them from request bodies with --learn-nodes")
    try:
        config = config_from_args(args)
        if args.demo:
            from extender.app import build_app
            from extender.demo import demo_config, run_demo

            config = demo_config(config)
            build_app(config)  # a bad catalog or model is one line here, not a worker's traceback
            return run_demo(config)
        return _serve(config)
    except (ConfigError, ValueError) as e:
        print(f"gpuslice serve: {ap.flagged(fields_as_flags(str(e), FIELD_FLAGS), args)}", file=sys.stderr)
        return 2
    except CannotListen as e:
        print(f"gpuslice serve: {e}", file=sys.stderr)
        return 1


def _phase_words(phase: dict[str, Any] | None) -> list[str]:
    """Which rule places now and why, for a policy that reads the load phase (none for one that reads none)."""
    if not phase:
        return []
    ratio = f"{phase['departure_ratio']:.2f} departures per arrival lately"
    if phase["churning"]:
        return [f"placement: pods leave about as fast as they arrive ({ratio}, {CHURN_AT:.2f} or more): "
                "best fit, to fill the fullest cards"]
    return [f"placement: the cluster is filling ({ratio}, under {CHURN_AT:.2f}): the fragment gradient, to keep "
            "whole cards free"]


def _since(epoch_ms: int, now: float) -> str:
    """When the ledger's current life began, in words: '3m12s ago (2026-03-01 10:00:00 UTC)'."""
    at = epoch_ms / 1000
    ago = max(0, int(now - at))
    span = f"{ago // 3600}h{ago % 3600 // 60:02d}m" if ago >= 3600 else f"{ago // 60}m{ago % 60:02d}s"
    return f"{span} ago ({time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime(at))})"


def _render(state: dict[str, Any], now: float | None = None) -> str:
    ready = "ready" if state["ready"] else "NOT READY"
    admission = f", admission {state['admission']}" if "admission" in state else ""
    lines = [f"mode {state['mode']}, policy {state['policy']}{admission}, {ready}; ledger built "
             f"{_since(int(state['epoch']), time.time() if now is None else now)}; a filter's reservation waits "
             f"{state['reservation_ttl_s']:g} s for its bind"
             + ("" if state["durable"] else "; in memory only (lost at a restart)")]
    lines += _phase_words(state.get("placement_phase"))
    lines.append(f"free slices: {', '.join(f'{p} x{n}' for p, n in state['free_slices'].items())}")
    lines.append(f"nodes ({len(state['nodes'])}):")
    for node in state["nodes"]:
        cards = " ".join(f"[{'#' * ((g['milli'] - g['free_milli']) // 250):<4}]{'x' if g['withdrawn'] else ''}"
                         for g in node["gpus"])
        lines.append(f"  {node['name']:<20} {cards}  enforcement {node['enforcement']}"
                     + (", inventory change pending" if node["inventory_pending"] else ""))
    lines.append(f"allocations ({len(state['allocations'])}):")
    for a in state["allocations"]:
        extra = f" expires in {a['expires_in_s']} s" if "expires_in_s" in a else ""
        lines.append(f"  {a['pod'] or a['pod_uid']:<30} {a['product']:<9} {a['state']:<8} {a['node']} "
                     f"{','.join(a['gpus'])}{extra}")
    lines.append(f"waiting ({len(state['queue'])}):")
    for w in state["queue"]:
        expected = f" ({w['expected']})" if w.get("expected") else ""
        lines.append(f"  {w['position']:>3}. {w['pod']:<30} {w['product']:<9} {w['waiting_s']:>8.1f} s  "
                     f"{w['reason']}: {w['message']}{expected}")
    return "\n".join(lines)


def _tls_hint(error: str, ca: str) -> str:
    """What to try when the extender's certificate was not trusted or does not carry the URL's name."""
    if "CERTIFICATE_VERIFY_FAILED" not in error:
        return ""
    if "mismatch" in error or "not valid for" in error:
        return ("\n  the certificate does not carry the URL's host: --server-name "
                "gpuslice-extender.gpuslice-system.svc (the name the chart's certificate carries)")
    if not ca:
        return ("\n  the extender's certificate is not trusted here: --ca ca.crt, the CA of the Secret "
                "gpuslice-extender-tls (README.md, 'Check')")
    return f"\n  the certificate is not signed by {ca}: is it the CA of the Secret gpuslice-extender-tls?"


def status_main(argv: Sequence[str]) -> int:
    """``gpuslice status``: GET /state of a running extender and print it (``--json`` for raw)."""
    ap = CommandParser(prog="gpuslice status", description="Print a running extender's ledger and queue.")
    env = os.environ.get  # the chart sets GPUSLICE_STATUS_* in the extender's container: `kubectl exec` needs no flags
    ap.add_argument("--url", default=env("GPUSLICE_STATUS_URL") or f"http://127.0.0.1:{DEFAULT_PORT}",
                    help="the extender's base URL (GET /state answers over loopback, or to an allowed client "
                         "certificate; default $GPUSLICE_STATUS_URL, else http://127.0.0.1:8888)")
    ap.add_argument("--ca", type=readable_file, default=env("GPUSLICE_STATUS_CA") or None, metavar="PEM",
                    help="https: verify the extender against this CA (PEM; default $GPUSLICE_STATUS_CA)")
    ap.add_argument("--cert", type=readable_file, default=env("GPUSLICE_STATUS_CERT") or None, metavar="PEM",
                    help="https: present this client certificate (PEM)")
    ap.add_argument("--key", type=readable_file, default=env("GPUSLICE_STATUS_KEY") or None, metavar="PEM",
                    help="https: the client certificate's key (PEM)")
    ap.add_argument("--server-name", default=env("GPUSLICE_STATUS_SERVER_NAME", ""),
                    help="https: the name the extender's certificate carries, when the URL names an address it "
                         "does not (e.g. gpuslice-extender.gpuslice-system.svc; default $GPUSLICE_STATUS_SERVER_NAME)")
    ap.add_argument("--json", action="store_true", help="print the raw JSON")
    args = ap.parse_args(list(argv))
    ca = args.ca or ""
    try:
        client = ExtenderClient(args.url, timeout=10, ca=ca, cert=args.cert or "", key=args.key or "",
                                server_name=args.server_name)
    except ClientError as e:  # the flags themselves: a URL that is not one, TLS files that do not load
        ap.error(f"--url {args.url}: {e}" if "URL" in str(e) else f"--ca, --cert, --key: {e}")
    try:
        with client:
            status, state = client.get("/state")
    except ClientError as e:
        print(f"gpuslice status: {e}{_tls_hint(str(e), ca)}", file=sys.stderr)
        return 1
    if status != 200 or not isinstance(state, dict):
        print(f"gpuslice status: GET /state answered HTTP {status}: {state}", file=sys.stderr)
        return 1
    print(json.dumps(state, indent=2) if args.json else _render(state))
    if not state.get("ready", True):
        print("gpuslice status: this replica is not ready: a standby (it keeps no ledger) or rebuilding; the "
              "leader is the pod the Lease gpuslice-extender names", file=sys.stderr)
    return 0


def _linger(text: str) -> float:
    """``--linger``: seconds within 0..60 (the kubelet's grace period holds the hook and the rest of the stop)."""
    seconds = non_negative_number(text)
    if seconds > 60:
        raise argparse.ArgumentTypeError(f"at most 60 seconds, got {text!r}")
    return seconds


def leave_main(argv: Sequence[str]) -> int:
    """``gpuslice leave``: POST /admin/leave to this pod's extender, then linger (the chart's preStop hook)."""
    ap = CommandParser(
        prog="gpuslice leave",
        description="Tell a running extender to leave (the chart's preStop hook): /healthz turns 503, a leader "
                    "gives its Lease and label up at once, and it goes on serving what still reaches it; then wait "
                    "--linger seconds, while the Services' endpoints drop the pod, before the kubelet's SIGTERM.")
    env = os.environ.get
    ap.add_argument("--url", default=env("GPUSLICE_STATUS_URL") or f"http://127.0.0.1:{DEFAULT_PORT}",
                    help="the extender's base URL (/admin/leave answers over loopback; default $GPUSLICE_STATUS_URL)")
    ap.add_argument("--ca", type=readable_file, default=env("GPUSLICE_STATUS_CA") or None, metavar="PEM",
                    help="https: verify the extender against this CA (PEM; default $GPUSLICE_STATUS_CA)")
    ap.add_argument("--server-name", default=env("GPUSLICE_STATUS_SERVER_NAME", ""),
                    help="https: the name the extender's certificate carries (default $GPUSLICE_STATUS_SERVER_NAME)")
    ap.add_argument("--linger", type=_linger, default=3.0, metavar="SECONDS",
                    help="keep serving this long after leaving, 0..60 (default 3: the endpoints and kube-proxy "
                         "catch up)")
    args = ap.parse_args(list(argv))
    ca = args.ca or ""
    try:
        client = ExtenderClient(args.url, timeout=20, ca=ca, server_name=args.server_name)
    except ClientError as e:  # the flags themselves: a URL that is not one, a CA that does not load
        ap.error(f"--url {args.url}: {e}" if "URL" in str(e) else f"--ca: {e}")
    try:
        with client:
            status, reply = client.post("/admin/leave", {})
    except ClientError as e:
        print(f"gpuslice leave: {e}{_tls_hint(str(e), ca)}", file=sys.stderr)
        return 1
    if status != 200:
        print(f"gpuslice leave: POST /admin/leave answered HTTP {status}: {reply}", file=sys.stderr)
        return 1
    print(f"gpuslice leave: left; serving {args.linger:g} s more")
    time.sleep(args.linger)
    return 0
