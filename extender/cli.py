"""``gpuslice serve`` (run the extender under gunicorn) and ``gpuslice status`` (print a running one's state)."""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from extender.client import ClientError, ExtenderClient
from extender.config import DEFAULT_MAX_BODY, DEFAULT_PORT, ConfigError, ExtenderConfig
from extender.state import MODES
from extender.wire import DEFAULT_MAX_NODES
from packing.policies import DEFAULT_POLICY, policy_names


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
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
    ap.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"listen port (default {DEFAULT_PORT})")
    ap.add_argument("--threads", type=int, default=8,
                    help="threads deciding whole requests in the one worker (default 8; bodies are read before)")
    ap.add_argument("--bind-threads", type=int, default=32,
                    help="threads of binds alone, which wait for the API server in a cluster (default 32)")
    ap.add_argument("--prefix", default="", help="URL prefix of the verbs, e.g. /v1 (default none)")
    for verb, key in (("filter", "filterVerb"), ("prioritize", "prioritizeVerb"), ("bind", "bindVerb")):
        ap.add_argument(f"--{verb}-verb", default=verb, metavar="PATH",
                        help=f"URL path of the {verb} call under --prefix: what kube-scheduler's "
                             f"KubeSchedulerConfiguration names extenders[].{key} (default {verb})")
    ap.add_argument("--mode", choices=MODES, default="strict",
                    help="strict (default): filter keeps only the policy's best nodes and reserves; "
                         "cooperative: all fitting")
    ap.add_argument("--policy", choices=policy_names(), default=DEFAULT_POLICY,
                    help=f"placement policy (default {DEFAULT_POLICY}); the simulator offers the same set")
    ap.add_argument("--reservation-ttl", type=float, default=30.0, metavar="SECONDS",
                    help="how long a filter's reservation waits for its bind (default 30)")
    ap.add_argument("--pod-cache", type=int, default=10_000, metavar="PODS",
                    help="pods remembered between filter and bind (default 10000)")
    ap.add_argument("--refuse-resource", action="append", default=[], metavar="NAME",
                    help="refuse pods asking for this resource, e.g. nvidia.com/gpu (repeatable)")
    ap.add_argument("--max-body-mib", type=int, default=DEFAULT_MAX_BODY // (1024 * 1024),
                    help="largest request body in MiB (413 beyond it, chunked bodies too; default "
                         f"{DEFAULT_MAX_BODY // (1024 * 1024)})")
    ap.add_argument("--max-nodes", type=int, default=DEFAULT_MAX_NODES,
                    help=f"most nodes one filter or prioritize may name (413 beyond; default {DEFAULT_MAX_NODES})")
    ap.add_argument("--body-timeout", type=float, default=10.0, metavar="SECONDS",
                    help="a request body still arriving after this long is refused with 408 (default 10)")
    ap.add_argument("--slow-request", type=float, default=0.5, metavar="SECONDS",
                    help="log a request slower than this with its phases (default 0.5)")
    ap.add_argument("--admin", action="store_true", help="enable POST /admin/release (always on standalone)")
    ap.add_argument("--learn-nodes", action="store_true",
                    help="standalone: take GPU inventories from the Node objects of request bodies (trusts every "
                         "client that reaches the port: use it with mutual TLS)")
    ap.add_argument("--waiting-ttl", type=float, default=600.0, metavar="SECONDS",
                    help="standalone: a waiting pod no filter asked about for this long leaves the queue (default 600)")
    ap.add_argument("--nodes", type=int, default=0, help="standalone: seed N nodes named node-<i>")
    ap.add_argument("--gpus-per-node", type=int, default=8, help="standalone: cards per seeded node (default 8)")
    ap.add_argument("--gpu-model", default="Tesla-V100-SXM2-32GB",
                    help="standalone: model label of seeded cards (default Tesla-V100-SXM2-32GB)")
    ap.add_argument("--catalog", default="", help="product catalog TOML (default: the built-in V100 catalog)")
    ap.add_argument("--tls-cert", default="", help="serve HTTPS with this certificate (PEM)")
    ap.add_argument("--tls-key", default="", help="the certificate's private key (PEM)")
    ap.add_argument("--client-ca", default="", help="verify client certificates against this CA (PEM)")
    ap.add_argument("--require-client-cert", action="store_true",
                    help="filter, prioritize and bind need a client certificate signed by --client-ca")
    ap.add_argument("--client-subject", action="append", default=[], metavar="SUBJECT",
                    help="allow only client certificates with this subject, e.g. CN=kube-scheduler or "
                         "/O=gpuslice/CN=kube-scheduler (repeatable)")
    ap.add_argument("--metrics-subject", action="append", default=[], metavar="SUBJECT",
                    help="also allow client certificates with this subject, for GET /metrics only (a Prometheus; "
                         "repeatable)")
    history = ap.add_argument_group("demand history (GET /history, gpuslice history export)")
    history.add_argument("--no-history", dest="history", action="store_false",
                         help="keep no demand history (default: keep one)")
    history.add_argument("--history-max-age", type=float, default=30.0, metavar="DAYS",
                         help="claims that ended longer ago leave the history (default 30 days)")
    history.add_argument("--history-max-mib", type=int, default=64, metavar="MIB",
                         help="the history's size bound, in MiB of its JSON lines (default 64)")
    history.add_argument("--history-names", action="store_true",
                         help="keep pod names (namespace/name) in the history (default: claim ids only)")
    return ap


def config_from_args(args: argparse.Namespace) -> ExtenderConfig:
    """The ExtenderConfig the command line asks for; ConfigError when it is inconsistent."""
    return ExtenderConfig(
        host=args.host, port=args.port, threads=args.threads, bind_threads=args.bind_threads, prefix=args.prefix,
        filter_verb=args.filter_verb, prioritize_verb=args.prioritize_verb, bind_verb=args.bind_verb,
        max_body_bytes=args.max_body_mib * 1024 * 1024, mode=args.mode, policy=args.policy,
        reservation_ttl_s=args.reservation_ttl, pod_cache_size=args.pod_cache,
        refused_resources=tuple(args.refuse_resource), standalone=args.standalone, admin=args.admin,
        nodes=args.nodes, gpus_per_node=args.gpus_per_node, gpu_model=args.gpu_model, catalog=args.catalog,
        max_nodes=args.max_nodes, body_timeout_s=args.body_timeout, slow_request_s=args.slow_request,
        learn_nodes=args.learn_nodes, waiting_ttl_s=args.waiting_ttl, tls_cert=args.tls_cert, tls_key=args.tls_key,
        client_ca=args.client_ca, require_client_cert=args.require_client_cert,
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


def main(argv: Sequence[str]) -> int:
    """``gpuslice serve``: exit code 0 on a clean stop, 2 on bad settings."""
    ap = _parser()
    args = ap.parse_args(list(argv))
    if args.demo and not args.standalone:
        ap.error("--demo needs --standalone (it runs without a cluster)")
    try:
        config = config_from_args(args)
    except ConfigError as e:
        print(f"gpuslice serve: {e}", file=sys.stderr)
        return 2
    if args.demo:
        from extender.demo import run_demo

        return run_demo(config)
    try:
        return _serve(config)
    except (ConfigError, ValueError) as e:
        print(f"gpuslice serve: {e}", file=sys.stderr)
        return 2


def _phase_words(phase: dict[str, Any] | None) -> str:
    """Which rule places now, for a policy that reads the load phase ("" for one that reads none)."""
    if not phase:
        return ""
    rule = "best fit (churning)" if phase["churning"] else "the fragment gradient (filling)"
    return f", placing by {rule}, departures per arrival {phase['departure_ratio']:.2f}"


def _render(state: dict[str, Any]) -> str:
    lines = [f"mode {state['mode']}, policy {state['policy']}, ready {state['ready']}, epoch {state['epoch']}, "
             f"reservation TTL {state['reservation_ttl_s']} s" + ("" if state["durable"] else ", not durable")
             + _phase_words(state.get("placement_phase"))]
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
        lines.append(f"  {w['position']:>3}. {w['pod']:<30} {w['product']:<9} {w['waiting_s']:>8.1f} s  "
                     f"{w['reason']}: {w['message']}")
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
    ap = argparse.ArgumentParser(prog="gpuslice status", description="Print a running extender's ledger and queue.")
    env = os.environ.get  # the chart sets GPUSLICE_STATUS_* in the extender's container: `kubectl exec` needs no flags
    ap.add_argument("--url", default=env("GPUSLICE_STATUS_URL") or f"http://127.0.0.1:{DEFAULT_PORT}",
                    help="the extender's base URL (GET /state answers over loopback, or to an allowed client "
                         "certificate; default $GPUSLICE_STATUS_URL, else http://127.0.0.1:8888)")
    ap.add_argument("--ca", default=env("GPUSLICE_STATUS_CA", ""),
                    help="https: verify the extender against this CA (PEM; default $GPUSLICE_STATUS_CA)")
    ap.add_argument("--cert", default=env("GPUSLICE_STATUS_CERT", ""),
                    help="https: present this client certificate (PEM)")
    ap.add_argument("--key", default=env("GPUSLICE_STATUS_KEY", ""), help="https: the client certificate's key (PEM)")
    ap.add_argument("--server-name", default=env("GPUSLICE_STATUS_SERVER_NAME", ""),
                    help="https: the name the extender's certificate carries, when the URL names an address it "
                         "does not (e.g. gpuslice-extender.gpuslice-system.svc; default $GPUSLICE_STATUS_SERVER_NAME)")
    ap.add_argument("--json", action="store_true", help="print the raw JSON")
    args = ap.parse_args(list(argv))
    try:
        with ExtenderClient(args.url, timeout=10, ca=args.ca, cert=args.cert, key=args.key,
                            server_name=args.server_name) as client:
            status, state = client.get("/state")
    except ClientError as e:
        print(f"gpuslice status: {e}{_tls_hint(str(e), args.ca)}", file=sys.stderr)
        return 1
    if status != 200 or not isinstance(state, dict):
        print(f"gpuslice status: GET /state answered HTTP {status}: {state}", file=sys.stderr)
        return 1
    print(json.dumps(state, indent=2) if args.json else _render(state))
    if not state.get("ready", True):
        print("gpuslice status: this replica is not ready: a standby (it keeps no ledger) or rebuilding; the "
              "leader is the pod the Lease gpuslice-extender names", file=sys.stderr)
    return 0
