"""``gpuslice history export``: the demand history of a running extender, as JSON Lines on stdout.

It reaches the extender as ``gpuslice status`` does (``--url``, ``--ca``, ``--cert``, ``--key``,
``--server-name``, or the ``GPUSLICE_STATUS_*`` variables the chart sets in the extender's
container) and asks ``GET /history?since=``. What cannot work is one line on stderr naming the
flag that fixes it; exit 0 done, 1 the extender could not be asked or refused, 2 bad usage.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from urllib.parse import quote

from extender.client import ClientError, ExtenderClient
from extender.config import DEFAULT_PORT
from packing.argtypes import readable_file
from packing.demand import parse_since
from packing.usage import CommandParser

PROG = "gpuslice history"


def connection_options(ap: argparse.ArgumentParser) -> None:
    """How to reach the extender: the flags (and ``GPUSLICE_STATUS_*`` defaults) of ``gpuslice status``."""
    env = os.environ.get
    ap.add_argument("--url", default=env("GPUSLICE_STATUS_URL") or f"http://127.0.0.1:{DEFAULT_PORT}",
                    help="the extender's base URL (GET /history answers over loopback, or to an allowed client "
                         "certificate; default $GPUSLICE_STATUS_URL, else http://127.0.0.1:8888)")
    ap.add_argument("--ca", type=readable_file, default=env("GPUSLICE_STATUS_CA") or None, metavar="PEM",
                    help="https: verify the extender against this CA")
    ap.add_argument("--cert", type=readable_file, default=env("GPUSLICE_STATUS_CERT") or None, metavar="PEM",
                    help="https: present this client certificate")
    ap.add_argument("--key", type=readable_file, default=env("GPUSLICE_STATUS_KEY") or None, metavar="PEM",
                    help="https: the client certificate's key")
    ap.add_argument("--server-name", default=env("GPUSLICE_STATUS_SERVER_NAME", ""),
                    help="https: the name the extender's certificate carries, when the URL names an address")


def why_not(error: str, args: argparse.Namespace) -> str:
    """The one line that names the flag fixing a connection that failed."""
    if "CERTIFICATE_VERIFY_FAILED" in error:
        if "mismatch" in error or "not valid for" in error:
            return "its certificate does not carry the URL's host: pass --server-name (the chart's: " \
                   "gpuslice-extender.gpuslice-system.svc)"
        return "its certificate is not trusted here: pass --ca (the CA of the Secret gpuslice-extender-tls)"
    if "cannot load the TLS files" in error:
        return f"{error.split(': ', 1)[-1]}: check --ca, --cert and --key"
    if "needs an https:// URL" in error:
        return f"{error}: pass an https:// --url, or drop --ca, --cert, --key and --server-name"
    return f"cannot reach the extender at {args.url} ({error.rsplit(': ', 1)[-1]}): pass --url " \
           "(or set GPUSLICE_STATUS_URL; kubectl port-forward to the leader's pod)"


def refusal(status: int, body: bytes) -> str:
    """The one line for an answer that is not the history."""
    try:
        message = json.loads(body).get("error", "")
    except (ValueError, AttributeError):
        message = body[:200].decode("utf-8", "replace")
    if status == 403:
        return f"the extender refused ({message}): ask from loopback (kubectl exec into its pod), or pass " \
               "--cert and --key, a client certificate it allows (--client-subject)"
    if status == 503:
        return f"this replica is not ready ({message}): ask the leader (the pod the Lease gpuslice-extender names)"
    if status == 404 and "--no-history" in message:
        return f"{message}: restart it without --no-history (chart value history.enabled)"
    return f"GET /history answered HTTP {status}: {message}"


def fetch_history(args: argparse.Namespace, since: str) -> bytes:
    """The history's JSON Lines; RuntimeError carrying the one line to print."""
    try:
        with ExtenderClient(args.url, timeout=60, ca=args.ca or "", cert=args.cert or "", key=args.key or "",
                            server_name=args.server_name) as client:
            status, body = client.request_raw("GET", f"/history?since={quote(since)}" if since else "/history")
    except ClientError as e:
        raise RuntimeError(why_not(str(e), args)) from None
    if status != 200:
        raise RuntimeError(refusal(status, body))
    return body


def _unwritable(path: str | None) -> str:
    """Why ``path`` cannot be written ('' when it can, or when there is none)."""
    if not path:
        return ""
    folder = os.path.dirname(path) or "."
    if os.path.isdir(path):
        return "it is a folder"
    if not os.path.isdir(folder):
        return f"no folder {folder}"
    return "" if os.access(folder, os.W_OK) else f"{folder} is not writable"


def main(argv: Sequence[str]) -> int:
    """``gpuslice history export``; the subcommand is the first word."""
    ap = CommandParser(prog=PROG, description="The demand history an extender keeps (GET /history).")
    sub = ap.add_subparsers(dest="action", metavar="export", required=True)
    export = sub.add_parser("export", help="write the history as JSON Lines (gpuslice's trace format, a header "
                                           "line first) to stdout or --output",
                            description="Write the demand history as JSON Lines: a header (time origin, gaps, the "
                                        "catalog), then one row per claim in gpuslice's trace format. Read it with "
                                        "gpuslice simulate --from-cluster STATE.json --history FILE.")
    export.add_argument("--since", default="30d",
                        help="how far back: a duration (7d, 12h, 90m), Unix seconds or an ISO 8601 time with its zone "
                             "(default 30d, the history's default bound)")
    export.add_argument("--output", "-o", metavar="FILE", help="write here instead of stdout")
    connection_options(export)
    args = ap.parse_args(list(argv))
    try:
        parse_since(args.since, time.time())
    except ValueError as e:
        return export.usage_error(f"--since: {e}")
    unwritable = _unwritable(args.output)
    if unwritable:  # before asking the extender, not after
        return export.usage_error(f"--output: cannot write {args.output}: {unwritable}")
    try:
        body = fetch_history(args, args.since)
    except RuntimeError as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1
    if args.output:
        try:
            with open(args.output, "wb") as f:
                f.write(body)
        except OSError as e:
            print(f"{PROG}: --output: cannot write {args.output}: {e.strerror}", file=sys.stderr)
            return 1
    else:
        sys.stdout.buffer.write(body)
        sys.stdout.flush()
    header = json.loads(body.split(b"\n", 1)[0])
    gaps = header.get("gaps") or []
    if gaps:
        lost = sum(b - a for a, b in gaps)
        print(f"{PROG}: the history has {len(gaps)} gap(s), {lost / 60:.0f} min in all, when no extender recorded "
              "(a leader change, an outage); simulate treats them as gaps, not as idle demand", file=sys.stderr)
    return 0
