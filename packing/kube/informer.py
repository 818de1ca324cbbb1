"""A resumable list+watch cache of raw API objects (dicts), with drift reporting.

List once, then watch from the list's resourceVersion (with bookmarks, so a quiet watch still
moves its resourceVersion forward); a watch that ends is resumed from the last version seen; a
410 Gone (or a broken stream) relists and turns the difference into synthetic events, so
handlers never miss a deletion. ``relist()`` on demand (the periodic resync) returns how many
objects the watch had got wrong: that count is the drift the resync reports.

Handlers run under the informer's lock, one event at a time, in the order the API server sent
them; a handler that raises is logged and does not end the watch. The extender watches nodes, pods
and its entitlements with it; the node agent watches the pods of its node (``fieldSelector``).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson

from packing.kube.client import Kube, KubeError

log = logging.getLogger(__name__)

Obj = dict[str, Any]
Handler = Callable[[str, Obj], None]  # (ADDED|MODIFIED|DELETED, object)
RETRY_S = 1.0
MAX_TOMBSTONES = 100_000  # deletions remembered between two lists (a list clears those it is newer than)


def key_of(obj: Mapping[str, Any]) -> str:
    """The cache key: namespace/name (a re-created object of the same name replaces the old one)."""
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


@dataclass
class Informer:
    """Keeps ``cache`` equal to the API's view of one resource list and calls ``handler`` on change.

    ``path`` is the list path (``/api/v1/pods``); ``selectors`` are query parameters narrowing it
    (``fieldSelector``, ``labelSelector``).
    """

    name: str
    kube: Kube
    path: str
    handler: Handler
    selectors: dict[str, str] = field(default_factory=dict)
    watch_timeout: int = 240
    cache: dict[str, Obj] = field(default_factory=dict)
    resource_version: str | None = None
    synced: threading.Event = field(default_factory=threading.Event)
    stopped: threading.Event = field(default_factory=threading.Event)
    relists: int = 0
    lock: threading.RLock = field(default_factory=threading.RLock)
    _tombstones: dict[str, tuple[str, int]] = field(default_factory=dict)  # key -> (uid, rv) deleted by the watch
    _response: Any = None
    _thread: threading.Thread | None = None

    def _list(self) -> tuple[list[Obj], str]:
        doc = self.kube.request("GET", self.path, query=self.selectors)
        return list(doc.get("items") or []), str((doc.get("metadata") or {}).get("resourceVersion", ""))

    def relist(self, resume: bool = True) -> int:
        """Replace the cache by a fresh list; emit the differences; return how many there were
        (0 on the first list: everything is new then, nothing was missed).

        ``resume``: the watch resumes from this list (the watch thread's own relist). The periodic
        resync passes False: its list may be older than what the running watch already applied,
        and an object newer than the list is kept, not rolled back.
        """
        items, rv = self._list()
        listed_at = _int(rv)
        with self.lock:
            first = not self.synced.is_set()
            fresh = {key_of(o): o for o in items}
            drift = 0
            for k, old in list(self.cache.items()):
                if k not in fresh and not (listed_at and _rv_int(old) > listed_at):
                    drift += 1
                    del self.cache[k]
                    self._handle("DELETED", old)
            for k, obj in fresh.items():
                gone = self._tombstones.get(k)
                if gone is not None and gone[0] == _uid(obj) and gone[1] >= _rv_int(obj):
                    continue  # the watch saw this object deleted after the version this list shows
                held = self.cache.get(k)
                if held is not None and _uid(held) != _uid(obj):
                    if _rv_int(held) > _rv_int(obj) > 0:
                        continue  # the watch already saw the re-created object: ours is newer
                    drift += 1  # deleted and re-created while we were not looking
                    del self.cache[k]
                    self._handle("DELETED", held)
                    held = None
                if held is not None and _rv_int(held) > _rv_int(obj) > 0:
                    continue  # the watch is ahead of this list
                if held is None or _rv(held) != _rv(obj):
                    if not first:
                        drift += 1
                    self.cache[k] = obj
                    self._handle("ADDED" if held is None else "MODIFIED", obj)
            self._tombstones = {k: t for k, t in self._tombstones.items() if t[1] > listed_at}
            if resume or self.resource_version is None:
                self.resource_version = rv
            self.relists += 1
            self.synced.set()
        return drift

    def apply(self, kind: str, obj: Obj) -> None:
        """One watch event into the cache and the handler (stale copies are dropped)."""
        k = key_of(obj)
        with self.lock:
            if kind == "DELETED":
                old = self.cache.get(k)
                if old is not None and _uid(old) == _uid(obj):
                    del self.cache[k]
                if len(self._tombstones) < MAX_TOMBSTONES:
                    self._tombstones[k] = (_uid(obj), _rv_int(obj))
            elif kind in ("ADDED", "MODIFIED"):
                old = self.cache.get(k)
                if old is not None and _uid(old) == _uid(obj) and _rv_int(old) > _rv_int(obj) > 0:
                    return  # an older copy than we hold (a relist overtook the watch): never go back
                if old is not None and _uid(old) != _uid(obj):
                    self._handle("DELETED", old)  # its deletion event was missed
                self.cache[k] = obj
            else:
                return
            self._handle(kind, obj)

    def _handle(self, kind: str, obj: Obj) -> None:
        try:
            self.handler(kind, obj)
        except Exception:  # one bad object must not end the watch of all the others
            log.exception("%s: handler failed on %s %s", self.name, kind, key_of(obj))

    def objects(self) -> list[Obj]:
        """A snapshot of the cache."""
        with self.lock:
            return list(self.cache.values())

    def watch_once(self) -> None:
        """One watch from ``resource_version`` until the server ends it; KubeError(410) when expired."""
        query: dict[str, Any] = {
            **self.selectors,
            "watch": True,
            "resourceVersion": self.resource_version,
            "allowWatchBookmarks": True,
            "timeoutSeconds": self.watch_timeout,
        }
        from kubernetes.watch.watch import iter_resp_lines

        resp = self.kube.stream(self.path, query, read_timeout=self.watch_timeout + 30)
        self._response = resp
        try:
            for line in iter_resp_lines(resp):  # type: ignore[no-untyped-call]
                if self.stopped.is_set():
                    return
                if not line:
                    continue
                ev = orjson.loads(line)
                kind = ev.get("type", "")
                obj = ev.get("object") or {}
                if kind == "ERROR":
                    raise KubeError(int(obj.get("code") or 500), str(obj.get("message") or "watch error"))
                rv = (obj.get("metadata") or {}).get("resourceVersion")
                if kind != "BOOKMARK":
                    self.apply(kind, obj)
                if rv:
                    self.resource_version = str(rv)
        finally:
            self._response = None
            resp.release_conn()

    def run(self) -> None:
        """List (unless already listed), then watch until ``stop()``; relist after 410 Gone or a break."""
        while not self.stopped.is_set():
            try:
                if self.resource_version is None:
                    self.relist()
                self.watch_once()
            except KubeError as e:
                if self.stopped.is_set():
                    break
                if e.status == 410:
                    log.info("%s: watch expired (410 Gone), relisting", self.name)
                    self.resource_version = None
                    continue
                log.warning("%s: watch failed (%s %s), relisting in %.0f s", self.name, e.status, e, RETRY_S)
                self.resource_version = None
                self.stopped.wait(RETRY_S)
            except Exception as e:  # a broken connection must not end the informer
                if self.stopped.is_set():
                    break
                log.warning("%s: watch stream broke (%s), relisting in %.0f s", self.name, e, RETRY_S)
                self.resource_version = None
                self.stopped.wait(RETRY_S)

    def start(self) -> threading.Thread:
        """Run the watch in a daemon thread (call ``relist()`` first to be synced before it starts)."""
        self._thread = threading.Thread(target=self.run, name=f"informer-{self.name}", daemon=True)
        self._thread.start()
        return self._thread

    def stop(self, timeout: float = 5.0) -> None:
        """End the watch; closes its connection so a blocked read returns."""
        self.stopped.set()
        resp = self._response
        if resp is not None:
            try:
                resp.shutdown()
            except Exception:  # best effort: the read timeout ends it anyway
                log.debug("%s: could not shut the watch connection", self.name)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)


def _uid(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid", ""))


def _rv(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion", ""))


def _rv_int(obj: Mapping[str, Any]) -> int:
    return _int(_rv(obj))


def _int(text: str) -> int:
    """A resourceVersion as a number (etcd revisions are); 0 when it is not one."""
    try:
        return int(text)
    except ValueError:
        return 0
