"""The bench's watch of bound pods, in a process of its own (``bench_e2e.BoundWatch`` starts it).

A watcher that falls behind is closed by kube-apiserver; in the bench's own process the watch thread
competes for the GIL with the threads creating pods, so it runs here, with nothing else to do. It
sends each event's (type, pod name, node, monotonic time seen, bytes) to the bench. A watch the
server ends is resumed from the last resourceVersion seen and reported (events replayed then are
seen late). Standard library only: a spawned process imports just this module.
"""

from __future__ import annotations

import http.client
import json
import ssl
import time
import urllib.parse
from multiprocessing.connection import Connection


def watch(address: tuple[str, int, str, str, str], namespace: str, out: Connection) -> None:
    host, port, ca, cert, key = address
    context = ssl.create_default_context(cafile=ca)
    context.load_cert_chain(cert, key)
    selector = urllib.parse.quote("spec.nodeName!=")
    version = ""
    first = True
    while True:
        path = f"/api/v1/namespaces/{namespace}/pods?watch=1&fieldSelector={selector}&timeoutSeconds=1800"
        if version:
            path += f"&resourceVersion={version}"
        conn = http.client.HTTPSConnection(host, port, context=context, timeout=1800)
        conn.request("GET", path, headers={"Accept": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            out.send(("failed", f"HTTP {resp.status}: {resp.read()[:200]!r}"))
            return
        out.send(("ready",) if first else ("resumed", time.monotonic()))
        first = False
        while line := resp.readline():
            seen = time.monotonic()
            event = json.loads(line)
            pod = event.get("object") or {}
            meta = pod.get("metadata") or {}
            version = str(meta.get("resourceVersion") or version)
            out.send(("event", event.get("type"), meta.get("name"), (pod.get("spec") or {}).get("nodeName"),
                      seen, len(line)))
        conn.close()
