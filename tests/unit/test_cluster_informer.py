"""The list+watch cache: relist differences, stale events, 410 Gone, re-created objects, drift counts.

A fake API server holds objects with etcd-like resource versions; the informer runs against it
through the same two calls it makes on a real one (a list, a watch stream). The stateful test
interleaves API changes, delivered or lost watch events and relists, and checks that after a
relist the cache equals the server and the handler's view equals the cache.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from packing.kube.client import KubeError
from packing.kube.informer import Informer, key_of


class Stream:
    """A watch response: newline-separated JSON events."""

    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.body = b"".join(json.dumps(e).encode() + b"\n" for e in events)

    def stream(self, amt: Any = None, decode_content: bool = False) -> Any:
        yield self.body[:7]  # split mid-line: the reader must reassemble lines
        yield self.body[7:]

    def release_conn(self) -> None:
        pass

    def shutdown(self) -> None:
        pass


class FakeApi:
    """Objects by name with a global revision; records every event for the watch."""

    def __init__(self) -> None:
        self.rev = 10
        self.objects: dict[str, dict[str, Any]] = {}
        self.log: list[tuple[int, dict[str, Any]]] = []  # (revision, event)
        self.compacted = 0
        self.watch_calls: list[dict[str, Any]] = []

    def _bump(self) -> int:
        self.rev += 1
        return self.rev

    def put(self, name: str, value: int, uid: str | None = None) -> None:
        old = self.objects.get(name)
        rev = self._bump()
        obj = {"metadata": {"name": name, "namespace": "ns", "uid": uid or (old or {}).get("metadata", {}).get(
            "uid", f"uid-{name}-{rev}"), "resourceVersion": str(rev)}, "value": value}
        self.objects[name] = obj
        self.log.append((rev, {"type": "ADDED" if old is None else "MODIFIED", "object": obj}))

    def delete(self, name: str) -> None:
        old = self.objects.pop(name)
        rev = self._bump()
        gone = {**old, "metadata": {**old["metadata"], "resourceVersion": str(rev)}}
        self.log.append((rev, {"type": "DELETED", "object": gone}))

    # ---- the two calls the informer makes ----

    def request(self, method: str, path: str, query: Any = None, **_: Any) -> dict[str, Any]:
        assert method == "GET"
        return {"metadata": {"resourceVersion": str(self.rev)}, "items": list(self.objects.values())}

    def stream(self, path: str, query: dict[str, Any], read_timeout: float) -> Stream:
        self.watch_calls.append(dict(query))
        since = int(query["resourceVersion"])
        if since < self.compacted:
            return Stream([{"type": "ERROR", "object": {"code": 410, "message": "too old resource version"}}])
        events = [e for rev, e in self.log if rev > since]
        events.append({"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": str(self.rev)}}})
        return Stream(events)


class Seen:
    """The handler: what a consumer believes exists, from the events it was given."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}
        self.events: list[tuple[str, str]] = []

    def __call__(self, kind: str, obj: dict[str, Any]) -> None:
        self.events.append((kind, obj["metadata"]["name"]))
        if kind == "DELETED":
            if self.objects.get(key_of(obj), {}).get("metadata", {}).get("uid") == obj["metadata"]["uid"]:
                del self.objects[key_of(obj)]
        else:
            self.objects[key_of(obj)] = obj


def informer(api: FakeApi, seen: Seen) -> Informer:
    return Informer("test", api, "/api/v1/things", seen)  # type: ignore[arg-type]


def values(cache: dict[str, dict[str, Any]]) -> dict[str, tuple[str, int]]:
    return {k: (o["metadata"]["uid"], o["value"]) for k, o in cache.items()}


def test_first_list_is_not_drift_and_later_differences_are() -> None:
    api, seen = FakeApi(), Seen()
    api.put("a", 1)
    api.put("b", 1)
    inf = informer(api, seen)
    assert inf.relist() == 0 and inf.synced.is_set()
    api.put("a", 2)
    api.delete("b")
    api.put("c", 1)
    assert inf.relist() == 3
    assert values(inf.cache) == values({key_of(o): o for o in api.objects.values()}) == values(seen.objects)
    assert inf.relist() == 0  # nothing new


def test_watch_applies_events_and_moves_its_version() -> None:
    api, seen = FakeApi(), Seen()
    inf = informer(api, seen)
    inf.relist()
    api.put("a", 1)
    api.put("a", 2)
    api.delete("a")
    api.put("b", 5)
    inf.watch_once()
    assert values(inf.cache) == values(seen.objects) == {"ns/b": (api.objects["b"]["metadata"]["uid"], 5)}
    assert inf.resource_version == str(api.rev)  # the bookmark carried it forward
    assert [k for k, _ in seen.events] == ["ADDED", "MODIFIED", "DELETED", "ADDED"]


def test_stale_event_never_goes_back_in_time() -> None:
    api, seen = FakeApi(), Seen()
    api.put("a", 1)
    old = dict(api.objects["a"])
    api.put("a", 2)
    inf = informer(api, seen)
    inf.relist()
    inf.apply("MODIFIED", old)
    assert inf.cache["ns/a"]["value"] == 2 and seen.objects["ns/a"]["value"] == 2


def test_relist_older_than_the_watch_keeps_newer_objects_and_deletions() -> None:
    api, seen = FakeApi(), Seen()
    api.put("a", 1)
    api.put("b", 1)
    inf = informer(api, seen)
    inf.relist()
    listed = api.request("GET", "")  # a list taken now ...
    api.put("a", 2)
    api.delete("b")
    api.put("c", 1)
    inf.watch_once()  # ... is overtaken by the watch before it is applied
    inf.kube = type("Old", (), {"request": lambda self, *a, **k: listed})()
    assert inf.relist(resume=False) == 0
    assert values(inf.cache) == values({key_of(o): o for o in api.objects.values()})
    assert inf.resource_version == str(api.rev)  # a resync list does not rewind the watch


def test_recreated_object_is_deleted_then_added() -> None:
    api, seen = FakeApi(), Seen()
    api.put("a", 1)
    inf = informer(api, seen)
    inf.relist()
    first_uid = api.objects["a"]["metadata"]["uid"]
    api.delete("a")
    api.put("a", 7)  # same name, new uid: the deletion was missed
    assert inf.relist() == 2
    assert ("DELETED", "a") in seen.events and seen.objects["ns/a"]["metadata"]["uid"] != first_uid


def test_run_relists_after_410_gone() -> None:
    api, seen = FakeApi(), Seen()
    api.put("a", 1)
    inf = informer(api, seen)
    inf.relist()
    api.put("b", 1)
    api.compacted = api.rev + 1  # everything the watch would resume from is gone

    def fail_twice() -> None:
        inf.watch_once()

    with pytest.raises(KubeError) as gone:
        fail_twice()
    assert gone.value.status == 410
    api.compacted = 0
    done = threading.Event()
    original = inf.relist

    def relist_then_stop(resume: bool = True) -> int:
        drift = original(resume)
        done.set()
        inf.stopped.set()
        return drift

    inf.relist = relist_then_stop  # type: ignore[method-assign]
    inf.resource_version = None  # what run() does on a 410
    inf.run()
    assert done.is_set() and "ns/b" in seen.objects


def test_handler_failure_does_not_stop_the_others() -> None:
    api = FakeApi()
    api.put("bad", 1)
    api.put("good", 1)
    got: list[str] = []

    def handler(kind: str, obj: dict[str, Any]) -> None:
        if obj["metadata"]["name"] == "bad":
            raise RuntimeError("boom")
        got.append(obj["metadata"]["name"])

    inf = Informer("t", api, "/x", handler)  # type: ignore[arg-type]
    inf.relist()
    assert got == ["good"] and set(inf.cache) == {"ns/bad", "ns/good"}


class InformerMachine(RuleBasedStateMachine):
    """API changes, watch deliveries (some lost) and relists in any order."""

    def __init__(self) -> None:
        super().__init__()
        self.api = FakeApi()
        self.seen = Seen()
        self.inf = informer(self.api, self.seen)
        self.inf.relist()
        self.delivered = self.api.rev

    @rule(name=st.sampled_from("abcd"), value=st.integers(0, 9))
    def put(self, name: str, value: int) -> None:
        self.api.put(name, value)

    @rule(name=st.sampled_from("abcd"))
    def delete(self, name: str) -> None:
        if name in self.api.objects:
            self.api.delete(name)

    @rule(lose=st.booleans())
    def watch(self, lose: bool) -> None:
        """Deliver what happened since the last delivery (or lose it: a broken stream)."""
        if not lose:
            for rev, event in self.api.log:
                if rev > self.delivered:
                    self.inf.apply(event["type"], event["object"])
        self.delivered = self.api.rev

    @rule()
    def relist(self) -> None:
        self.inf.relist(resume=False)
        truth = values({key_of(o): o for o in self.api.objects.values()})
        assert values(self.inf.cache) == truth

    @invariant()
    def handler_agrees_with_cache(self) -> None:
        assert values(self.seen.objects) == values(self.inf.cache)


InformerMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=25, deadline=None)
test_informer_machine = InformerMachine.TestCase
