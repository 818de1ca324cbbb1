"""The demand history in the API server: the leader writes it in chunks, a new leader reads them and continues.

Why ConfigMaps in the extender's namespace, not a PersistentVolumeClaim: a ReadWriteOnce volume
follows one node, and the standby runs on another (the chart spreads the replicas), so a failover
would wait for the volume to detach; ReadWriteMany storage is not in every cluster. The API server
is already the one durable store gpuslice relies on, and these objects are small.

* **Chunks**: ConfigMaps ``<prefix>-<term start, ms>-<n>`` labelled ``gpuslice.io/history=chunk``;
  ``binaryData["rows.jsonl.gz"]``: gzip of JSON lines, each the state of one row
  (``packing.demand.DemandRow``, absolute times) after a change; the last state of a claim wins.
  Annotations: the period the chunk covers (``from``, ``until``), the history's start, how far back
  it is complete, its gaps.
* **The leader** flushes every ``flush_s`` (10 s) when rows changed, and every ``heartbeat_s``
  (60 s) anyway so its ``until`` says it was recording: one write (a replace of its current chunk)
  per flush, however many claims changed. A chunk is closed at ``chunk_bytes`` compressed (32 KiB).
  Chunks older than the age bound, or beyond the size bound, are deleted oldest first; an open
  claim whose latest row lives in the chunk to delete is written again into the current one first,
  so what is left always holds every open claim. A leader never writes another term's chunk: a
  deposed leader's late write lands in its own chunk and is read at the next load.
* **A new leader** lists the chunks (one LIST), folds them into its book, records a gap from the
  last ``until`` to its own start when they are more than ``GAP_TOLERANCE_S`` apart (the extender
  was down, or a leader died between flushes), and once its ledger is rebuilt marks the open claims
  no pod holds any more as ``lost`` (they ended unseen).

API cost: at most one write per ``flush_s`` while claims change (so at most one per claim, far
less in bursts), one per ``heartbeat_s`` while idle, one LIST per term; ``tests/bench/bench_history.py``
measures writes and bytes per claim.
"""

from __future__ import annotations

import base64
import gzip
import json
import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from extender.history.book import DemandBook
from packing.demand import DemandError, DemandRow, parse_row
from packing.kube.client import Kube, KubeError, q

log = logging.getLogger(__name__)

LABEL = "gpuslice.io/history"
DATA_KEY = "rows.jsonl.gz"
ANN = "gpuslice.io/history-"
FLUSH_S = 10.0
HEARTBEAT_S = 60.0
CHUNK_BYTES = 32 * 1024  # compressed; a ConfigMap holds at most 1 MiB, and each flush rewrites the current chunk
GAP_TOLERANCE_S = 5.0  # a hand-over shorter than this is not a gap (the new leader reads what the old flushed)
MAX_PENDING_LINES = 200_000  # rows kept for a write the API refuses; beyond, the oldest go and a gap says so


@dataclass
class Chunk:
    name: str
    until: float
    raw_bytes: int


class ConfigMapStore:
    """The book's rows in ConfigMaps of ``namespace`` (see the module docstring)."""

    def __init__(self, kube: Kube, namespace: str, book: DemandBook, prefix: str = "gpuslice-history",
                 flush_s: float = FLUSH_S, heartbeat_s: float = HEARTBEAT_S, chunk_bytes: int = CHUNK_BYTES,
                 clock: Callable[[], float] = time.time) -> None:
        self.kube = kube
        self.namespace = namespace
        self.book = book
        self.prefix = prefix
        self.flush_s = flush_s
        self.heartbeat_s = heartbeat_s
        self.chunk_bytes = chunk_bytes
        self.clock = clock
        self.chunks: list[Chunk] = []
        self.term = 0.0
        self._seq = 0
        self._lines: list[bytes] = []  # the current chunk's lines
        self._where: dict[str, str] = {}  # open claim -> the chunk holding its latest row
        self._from = 0.0
        self._written = 0.0  # when the current chunk was last written
        self._dirty = False
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.writes = 0
        self.bytes_written = 0
        self.last_until = 0.0

    @property
    def path(self) -> str:
        return f"/api/v1/namespaces/{q(self.namespace)}/configmaps"

    # ---- a term begins: read what the previous leaders wrote ------------------------------------------

    def load(self, term_start: float) -> int:
        """Fold every chunk into the book (KubeError when the API cannot list them); the rows read."""
        items = self._list()
        rows: list[DemandRow] = []
        started, complete, until = term_start, 0.0, 0.0
        gaps: set[tuple[float, float]] = set()
        self.chunks = []
        self._where = {}
        for cm in sorted(items, key=lambda c: str(c["metadata"]["name"])):
            meta = cm["metadata"]
            ann = meta.get("annotations") or {}
            try:
                raw = gzip.decompress(base64.b64decode((cm.get("binaryData") or {}).get(DATA_KEY, "")))
                found = [parse_row(json.loads(line)) for line in raw.splitlines() if line.strip()]
                rows.extend(found)
                for r in found:
                    if r.open:
                        self._where[r.claim] = str(meta["name"])
                    else:
                        self._where.pop(r.claim, None)
                started = min(started, float(ann.get(ANN + "started", term_start)))
                complete = max(complete, float(ann.get(ANN + "complete-since", 0.0)))
                chunk_until = float(ann.get(ANN + "until", 0.0))
                gaps.update((float(a), float(b)) for a, b in json.loads(ann.get(ANN + "gaps", "[]")))
            except (ValueError, OSError, DemandError, TypeError, EOFError) as e:
                log.error("history chunk %s/%s is unreadable (%s); skipped", self.namespace, meta.get("name"), e)
                continue
            until = max(until, chunk_until)
            self.chunks.append(Chunk(str(meta["name"]), chunk_until, len(raw)))
        self.book.restore(rows, started, complete, gaps)
        if until and term_start - until > GAP_TOLERANCE_S:
            self.book.add_gap(until, term_start)
            log.warning("demand history: nothing recorded from %.0f to %.0f (%.0f s): kept as a gap", until,
                        term_start, term_start - until)
        self.last_until = until
        self.term = term_start
        self._seq = 0
        self._new_chunk(term_start)
        self.book.take_changes()  # what restore set up is stored already
        self.book.track_changes()
        return len(rows)

    def settle(self, alive: Iterable[str]) -> int:
        """Once the ledger is rebuilt: the open claims no pod holds or waits for ended unseen (lost)."""
        return self.book.lost(alive, self.last_until or self.term)

    def _list(self) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        token = None
        while True:
            reply = self.kube.request("GET", self.path, query={"labelSelector": f"{LABEL}=chunk", "limit": 100,
                                                               "continue": token})
            items.extend(reply.get("items") or [])
            token = (reply.get("metadata") or {}).get("continue")
            if not token:
                return [i for i in items if str(i["metadata"]["name"]).startswith(self.prefix + "-")]

    # ---- the leader writes ------------------------------------------------------------------------------

    def _new_chunk(self, at: float) -> None:
        self._lines = []
        self._from = at
        self._dirty = False
        self._written = 0.0

    def _name(self) -> str:
        return f"{self.prefix}-{int(self.term * 1000):013d}-{self._seq:04d}"

    def flush(self) -> bool:
        """Write what changed (and at least every heartbeat); False when the API refused (kept for the next)."""
        with self._lock:
            now = self.clock()
            changed = self.book.take_changes()
            if changed:
                self._append(changed)
                if len(self._lines) > MAX_PENDING_LINES:
                    lost = self._lines[: len(self._lines) - MAX_PENDING_LINES]
                    del self._lines[: len(lost)]
                    self.book.add_gap(self._from, now)
                    log.error("demand history: %d rows could not be written; dropped, kept as a gap", len(lost))
            if not self._dirty and now - self._written < self.heartbeat_s:
                return True
            if not self._write_current(now):
                return False
            self._prune(now)
            return True

    def _append(self, rows: Iterable[DemandRow]) -> None:
        name = self._name()
        for r in rows:
            self._lines.append(r.encode())
            if r.open:
                self._where[r.claim] = name
            else:
                self._where.pop(r.claim, None)  # closed: its chunk may go with the history's bounds
        self._dirty = True

    def _write_current(self, now: float) -> bool:
        """Write the current chunk (closing it once it is full); False when the API refused."""
        raw = b"".join(self._lines)
        packed = gzip.compress(raw, 6)
        try:
            self._write(packed, len(raw), now)
        except KubeError as e:
            log.warning("demand history: writing %s failed (%s); retrying at the next flush", self._name(), e)
            return False
        self._dirty = False
        self._written = now
        if len(packed) > self.chunk_bytes:
            self.chunks.append(Chunk(self._name(), now, len(raw)))
            self._seq += 1
            self._new_chunk(now)
        return True

    def _write(self, packed: bytes, raw_bytes: int, now: float) -> None:
        name = self._name()
        book = self.book
        body: dict[str, Any] = {
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": self.namespace,
                         "labels": {LABEL: "chunk", "app.kubernetes.io/part-of": "gpuslice"},
                         "annotations": {ANN + "from": repr(self._from), ANN + "until": repr(now),
                                         ANN + "started": repr(book.started),
                                         ANN + "complete-since": repr(book.complete_since),
                                         ANN + "gaps": json.dumps(book.gaps), ANN + "raw-bytes": str(raw_bytes)}},
            "binaryData": {DATA_KEY: base64.b64encode(packed).decode("ascii")},
        }
        try:
            self.kube.request("PUT", f"{self.path}/{q(name)}", body)
        except KubeError as e:
            if e.status != 404:
                raise
            self.kube.request("POST", self.path, body)
        self.writes += 1
        self.bytes_written += len(body["binaryData"][DATA_KEY])

    def _prune(self, now: float) -> None:
        """Delete the oldest closed chunks beyond the book's bounds (never the one being written); the open
        claims whose latest row is in one are written into the current chunk first."""
        total = sum(c.raw_bytes for c in self.chunks)
        while self.chunks and (total > self.book.max_bytes or self.chunks[0].until < now - self.book.max_age_s):
            old = self.chunks[0]
            keep = [r for r in self.book.open_rows() if self._where.get(r.claim) == old.name]
            if keep:
                self._append(keep)
                if not self._write_current(now):
                    return
            try:
                self.kube.request("DELETE", f"{self.path}/{q(old.name)}")
            except KubeError as e:
                if e.status != 404:
                    log.warning("demand history: deleting %s failed (%s)", old.name, e)
                    return
            self.chunks.pop(0)
            total -= old.raw_bytes
            self._where = {c: n for c, n in self._where.items() if n != old.name}

    # ---- the flush loop ------------------------------------------------------------------------------------

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="history", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.flush_s):
            try:
                self.flush()
            except Exception:  # never let the history stop the extender
                log.exception("demand history flush failed")

    def stop(self) -> None:
        """End the term: stop the loop and write what is left (a clean hand-over loses nothing)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        try:
            self.flush()
        except Exception:
            log.exception("demand history: the last flush failed")
