"""``gpuslice certs``: make or renew gpuslice's certificates in their Secrets and set the webhook's caBundle.

Runs as the chart's Job and CronJob (the pod's service account) or by hand (your kubeconfig). Each
run reads the three Secrets, decides (``extender.certs.plan``), writes what changed (an update
carries the resourceVersion it read: two runs at once cannot both win), sets the caBundle of every
webhook of the MutatingWebhookConfiguration, and with ``--restart`` rolls the extender and
kube-scheduler when a certificate they load at start changed. Exit status: 0 done, 1 failed (the
API, a refused step; nothing half-written is left: each Secret is written whole), 2 bad arguments,
3 done, but the CA itself expires within the renewal window (rotate it).
"""

from __future__ import annotations

import base64
import os
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from extender.certs.plan import (
    CA_SECRET,
    CLIENT_SECRET,
    METRICS_SECRET,
    SERVING_SECRET,
    Data,
    Options,
    Plan,
    PlanError,
    plan,
)
from packing.argtypes import (
    dns_label,
    dns_subdomain,
    host_name,
    non_negative_int,
    non_negative_number,
    positive_int,
    readable_file,
)
from packing.kube.client import JSON_PATCH, STRATEGIC_PATCH, Kube, KubeError, operator_kube, q
from packing.usage import CommandParser

RESTARTED_AT = "kubectl.kubernetes.io/restartedAt"  # what `kubectl rollout restart` sets
READERS = ("gpuslice-extender", "gpuslice-scheduler")  # Deployments that load the leaves at start
TLS_TYPE = "kubernetes.io/tls"


def _parser() -> CommandParser:
    ap = CommandParser(
        prog="gpuslice certs",
        description="Make or renew the CA, the extender's serving certificate, kube-scheduler's client "
                    "certificate and Prometheus's (for /metrics only) in Secrets, and set the gpuslice "
                    "webhook's caBundle. Safe to run again: what is valid is kept.",
    )
    ap.add_argument("--namespace", type=dns_label, default=os.environ.get("POD_NAMESPACE") or "gpuslice-system",
                    help="the extender's namespace (default $POD_NAMESPACE, else gpuslice-system)")
    ap.add_argument("--kubeconfig", type=readable_file, default=None,
                    help="kubeconfig file (default $KUBECONFIG or ~/.kube/config, else the pod's service account)")
    ap.add_argument("--service", type=dns_label, default="gpuslice-extender",
                    help="the extender's Service (the serving names)")
    ap.add_argument("--webhook", type=dns_subdomain, default="gpuslice",
                    help="the MutatingWebhookConfiguration whose caBundle to set")
    ap.add_argument("--san", type=host_name, action="append", default=[], metavar="NAME",
                    help="one more DNS name or IP address for the serving certificate (repeatable)")
    ap.add_argument("--ca-days", type=positive_int, default=3650, help="validity of a new CA, in days (default 3650)")
    ap.add_argument("--leaf-days", type=positive_int, default=365,
                    help="validity of a new leaf certificate, in days (365)")
    ap.add_argument("--renew-within-days", type=non_negative_int, default=30,
                    help="re-issue a leaf that expires within this many days (default 30)")
    step = ap.add_mutually_exclusive_group()
    step.add_argument("--renew", action="store_true", help="re-issue both leaves now, from the signing CA")
    step.add_argument("--rotate-ca", action="store_true",
                      help="CA rotation, step 1: a new signing CA, trusted next to the old one (leaves unchanged)")
    step.add_argument("--drop-old-ca", action="store_true",
                      help="CA rotation, step 3 (after --renew): trust only the signing CA")
    ap.add_argument("--wait-webhook", type=non_negative_number, default=0.0, metavar="SECONDS",
                    help="wait this long for the webhook configuration to exist (default 0: note it and go on)")
    ap.add_argument("--secrets-only", action="store_true",
                    help="make or renew the Secrets only, leaving the webhook's caBundle to a later run (the chart's "
                         "pre-install hook: the webhook does not exist yet, and its role may not read it)")
    ap.add_argument("--restart", action="store_true",
                    help="when a certificate changed, restart the extender and kube-scheduler Deployments "
                         "(rolling) so they load it")
    return ap


def _read(kube: Kube, namespace: str, names: Sequence[str]) -> tuple[dict[str, Data | None], dict[str, Any]]:
    """Each Secret's decoded data (None when absent), and the objects read (for their resourceVersion)."""
    data: dict[str, Data | None] = {}
    objects: dict[str, Any] = {}
    for name in names:
        obj = kube.get(f"/api/v1/namespaces/{q(namespace)}/secrets/{q(name)}")
        objects[name] = obj
        data[name] = None if obj is None else {k: base64.b64decode(v) for k, v in (obj.get("data") or {}).items()}
    return data, objects


def _write(kube: Kube, namespace: str, name: str, data: Data, current: dict[str, Any] | None) -> None:
    body: dict[str, Any] = {
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace,
                     "labels": {"app.kubernetes.io/part-of": "gpuslice", "app.kubernetes.io/name": "gpuslice-certs"}},
        "type": "Opaque" if name == CA_SECRET else TLS_TYPE,
        "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
    }
    if current is None:
        kube.request("POST", f"/api/v1/namespaces/{q(namespace)}/secrets", body)
        return
    if current.get("type") not in (None, body["type"]):
        raise KubeError(422, f"Secret {namespace}/{name} is of type {current['type']}, not {body['type']}: "
                             "delete it and run again")
    body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
    body["metadata"]["labels"] = {**(current["metadata"].get("labels") or {}), **body["metadata"]["labels"]}
    kube.request("PUT", f"/api/v1/namespaces/{q(namespace)}/secrets/{q(name)}", body)


def _set_ca_bundle(kube: Kube, webhook: str, bundle: bytes, wait_s: float) -> str:
    """Set caBundle on every webhook of the configuration; what was done, in words."""
    path = f"/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations/{q(webhook)}"
    deadline = time.monotonic() + wait_s
    config = kube.get(path)
    while config is None and time.monotonic() < deadline:
        time.sleep(2.0)
        config = kube.get(path)
    if config is None:
        return (f"MutatingWebhookConfiguration {webhook} does not exist yet: its caBundle is set by the next run "
                "(the chart's Job runs after every install and upgrade)")
    wanted = base64.b64encode(bundle).decode()
    ops: list[dict[str, Any]] = []
    for i, hook in enumerate(config.get("webhooks") or []):
        if (hook.get("clientConfig") or {}).get("caBundle") != wanted:
            ops.append({"op": "test", "path": f"/webhooks/{i}/name", "value": hook.get("name")})
            ops.append({"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": wanted})
    if not ops:
        return f"MutatingWebhookConfiguration {webhook}: caBundle already current"
    kube.request("PATCH", path, ops, content_type=JSON_PATCH)
    return f"MutatingWebhookConfiguration {webhook}: caBundle set on {len(ops) // 2} webhook(s)"


def _restart(kube: Kube, namespace: str, now: datetime) -> list[str]:
    done = []
    patch = {"spec": {"template": {"metadata": {"annotations": {RESTARTED_AT: now.strftime("%Y-%m-%dT%H:%M:%SZ")}}}}}
    for name in READERS:
        path = f"/apis/apps/v1/namespaces/{q(namespace)}/deployments/{q(name)}"
        try:
            kube.request("PATCH", path, patch, content_type=STRATEGIC_PATCH)
            done.append(f"Deployment {name}: restarting to load the new certificates")
        except KubeError as e:
            if e.status != 404:
                raise
            done.append(f"Deployment {name}: not there (nothing to restart)")
    return done


def run(kube: Kube, options: Options, *, webhook: str | None, wait_s: float, restart: bool, now: datetime) -> Plan:
    """One run against the API; the plan it carried out (KubeError / PlanError when it could not). No
    ``webhook``: the Secrets only."""
    names = (CA_SECRET, SERVING_SECRET, CLIENT_SECRET, METRICS_SECRET)
    current, objects = _read(kube, options.namespace, names)
    decided = plan(current, options, now)
    for name in names:  # the CA first: a run cut short leaves a CA the next run reuses
        if name in decided.changed:
            _write(kube, options.namespace, name, decided.secrets[name], objects[name])
    bundle = (_set_ca_bundle(kube, webhook, decided.bundle, wait_s) if webhook is not None
              else "the webhook's caBundle: left to the next run (--secrets-only)")
    notes = [*decided.notes, bundle]
    if restart and decided.leaves_changed:
        notes += _restart(kube, options.namespace, now)
    return Plan(decided.secrets, decided.changed, tuple(notes), decided.warnings, decided.bundle)


def main(argv: Sequence[str]) -> int:
    args = _parser().parse_args(list(argv))
    try:
        options = Options(args.namespace, args.service, tuple(args.san), args.ca_days, args.leaf_days,
                          args.renew_within_days, args.renew, args.rotate_ca, args.drop_old_ca)
    except PlanError as e:
        print(f"gpuslice certs: {e}", file=sys.stderr)
        return 2
    from kubernetes.config import ConfigException

    try:
        kube = operator_kube(args.kubeconfig or "")
    except (ConfigException, OSError) as e:
        print(f"gpuslice certs: cannot reach the API: {e}", file=sys.stderr)
        return 1
    try:
        done = run(kube, options, webhook=None if args.secrets_only else args.webhook, wait_s=args.wait_webhook,
                   restart=args.restart,
                   now=datetime.now(UTC))
    except PlanError as e:
        print(f"gpuslice certs: {e}; nothing was written", file=sys.stderr)
        return 1
    except KubeError as e:
        print(f"gpuslice certs: the API refused or could not be reached: {e} (run again: what was written "
              "is whole and is kept)", file=sys.stderr)
        return 1
    for line in done.notes:
        print(line)
    if not done.changed:
        print(f"namespace {options.namespace}: every certificate is valid; nothing changed")
    for line in done.warnings:
        print(f"WARNING: {line}", file=sys.stderr)
    return 3 if done.warnings else 0
