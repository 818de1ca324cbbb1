"""Explained Pending: what is due when, and what the reporter writes (against a recording fake API)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from extender.cluster.pending_writer import (
    ADMITTED,
    CONDITION,
    Notice,
    PendingNotifier,
    PendingReporter,
    condition_patch,
    notice_of,
    pod_event,
)
from packing.kube.client import KubeError
from packing.kube.events import event_body
from packing.queue import Explanation


def explanation(claim: str = "u1", position: int = 1, reason: str = "NoCapacity",
                message: str = "needs a 250-milli slice (v100-25); largest free is 0 on node n") -> Explanation:
    return Explanation(claim, "ns", "v100-25", position, position, reason, message, 3.0)


def test_notice_text_names_position_reason_and_product() -> None:
    n = notice_of(explanation(position=3))
    assert n.reason == "NoCapacity" and n.position == 3
    assert n.text().startswith("position 3 in the gpuslice queue: needs a 250-milli slice")
    assert "(v100-25: 3rd of its product in line)" in n.text()
    patch = condition_patch(n, 0.0)["status"]["conditions"][0]
    assert patch["type"] == CONDITION and patch["status"] == "True" and patch["reason"] == "NoCapacity"
    ev = event_body(pod_event({"metadata": {"name": "p", "namespace": "ns", "uid": "u1"}}, n), "gpuslice", "", 1.5)
    assert ev["involvedObject"] == {"apiVersion": "v1", "kind": "Pod", "name": "p", "namespace": "ns", "uid": "u1"}
    assert ev["reason"] == "NoCapacity" and ev["message"] == n.text()


def test_due_rules() -> None:
    notifier = PendingNotifier(min_interval=10)
    first = Notice("NoCapacity", "m", 3)
    assert notifier.due("u", first, 0).condition and notifier.due("u", first, 0).event
    notifier.written("u", first, 0)
    assert not notifier.due("u", first, 100).condition  # nothing changed: nothing to write, ever
    moved = Notice("NoCapacity", "m", 2)
    assert not notifier.due("u", moved, 5).condition  # position-only move: rate limited
    assert notifier.due("u", moved, 10).condition and not notifier.due("u", moved, 10).event
    quota = Notice("QuotaExceeded", "q", 2)
    assert notifier.due("u", quota, 1).condition and notifier.due("u", quota, 1).event  # new reason: now


notices = st.builds(Notice, st.sampled_from(["NoCapacity", "QuotaExceeded", "Unsatisfiable"]),
                    st.sampled_from(["a", "b"]), st.integers(1, 4))


@settings(max_examples=200)
@given(steps=st.lists(st.tuples(notices, st.floats(0, 6)), max_size=30))
def test_writes_are_bounded_and_reasons_always_told(steps: list[tuple[Notice, float]]) -> None:
    """Events only on a reason change; between reason changes, at most one condition write per
    interval; and the latest reason is always what the pod shows."""
    notifier = PendingNotifier(min_interval=10)
    now = 0.0
    shown: Notice | None = None
    last_write = -1e9
    for notice, gap in steps:
        now += gap
        due = notifier.due("u", notice, now)
        new_reason = shown is None or shown.reason != notice.reason
        assert due.event == new_reason
        if new_reason:
            assert due.condition
        elif due.condition:
            assert now - last_write >= 10
        if due.condition:
            notifier.written("u", notice, now)
            shown, last_write = notice, now
        assert shown is not None and shown.reason == notice.reason


class RecordingKube:
    def __init__(self, fail: dict[str, int] | None = None) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        self.fail = fail or {}

    def patch_pod_status(self, namespace: str, name: str, body: Any, content_type: str) -> dict[str, Any]:
        if name in self.fail:
            raise KubeError(self.fail[name], "nope")
        self.calls.append(("condition", name, body["status"]["conditions"][0]))
        return {}

    def create_event(self, namespace: str, body: Any) -> None:
        self.calls.append(("event", body["involvedObject"]["name"], body))


def pods(*names: str) -> dict[str, dict[str, Any]]:
    return {f"uid-{n}": {"metadata": {"name": n, "namespace": "ns", "uid": f"uid-{n}"}} for n in names}


def reporter(kube: RecordingKube, known: dict[str, dict[str, Any]], clock: list[float]) -> PendingReporter:
    return PendingReporter(kube, known.get, min_interval=10, clock=lambda: clock[0])  # type: ignore[arg-type]


def test_reporter_writes_once_then_on_change() -> None:
    kube, clock = RecordingKube(), [0.0]
    r = reporter(kube, pods("a", "b"), clock)
    r.submit([explanation("uid-a", 1), explanation("uid-b", 2)])
    assert r.flush() == 4  # a condition and an event each
    assert r.flush() == 0
    r.submit([explanation("uid-b", 1)])  # a was admitted; b moved up: rate limited
    assert r.flush() == 0
    clock[0] = 11
    assert r.flush() == 1 and kube.calls[-1][0] == "condition" and "position 1" in kube.calls[-1][2]["message"]


def test_admitted_turns_the_condition_false_once() -> None:
    kube, clock = RecordingKube(), [0.0]
    r = reporter(kube, pods("a", "b"), clock)
    r.admitted("uid-a", "n1")  # never told to wait: nothing to undo
    assert r.flush() == 0
    r.submit([explanation("uid-a")])
    r.flush()
    r.admitted("uid-a", "n1")
    assert r.flush() == 2
    kind, name, cond = kube.calls[-2]
    assert (kind, name, cond["status"], cond["reason"]) == ("condition", "a", "False", ADMITTED)
    assert "n1" in cond["message"]
    assert r.flush() == 0


def test_refused_and_missing_pods() -> None:
    kube, clock = RecordingKube(fail={"gone": 404, "flaky": 500}), [0.0]
    r = reporter(kube, pods("x", "gone", "flaky"), clock)
    r.refused("uid-x", "gpuslice refuses this pod: bad")
    r.submit([explanation("uid-gone"), explanation("uid-flaky"), explanation("uid-unknown")])
    assert r.flush() == 2
    assert kube.calls[1][2]["type"] == "Warning"
    assert r.notifier.told("uid-gone") is None  # 404: forgotten
    assert r.notifier.told("uid-flaky") is None  # a failed write is tried again next time
    kube.fail.pop("flaky")
    assert r.flush() == 2


def test_allocated_events_warn_where_nothing_enforces_and_all_only_when_asked() -> None:
    kube, clock = RecordingKube(), [0.0]
    r = reporter(kube, pods("a", "b"), clock)
    r.allocated(pods("a")["uid-a"], "v100-25", "n1", ("GPU-1",), "agent")  # the record says it all: no write
    r.allocated(pods("b")["uid-b"], "v100-25", "n2", ("n2/gpu-0",), "none")
    assert r.flush() == 1
    kind, name, event = kube.calls[-1]
    assert (kind, name, event["reason"], event["type"]) == ("event", "b", "Allocated", "Warning")
    assert "enforcement: none" in event["message"] and "n2/gpu-0" in event["message"]
    every = PendingReporter(kube, pods("a").get, clock=lambda: clock[0], allocated_events="all")  # type: ignore[arg-type]
    every.allocated(pods("a")["uid-a"], "v100-25", "n1", ("GPU-1",), "agent")
    assert every.flush() == 1 and kube.calls[-1][2]["type"] == "Normal"
    assert "enforcement: agent" in kube.calls[-1][2]["message"]


def test_a_short_wait_goes_untold() -> None:
    kube, clock = RecordingKube(), [0.0]
    r = PendingReporter(kube, pods("a", "b").get, min_interval=10, clock=lambda: clock[0],  # type: ignore[arg-type]
                        notice_after_s=2.0)
    brief = Explanation("uid-a", "ns", "v100-25", 1, 1, "NoCapacity", "m", 1.9)
    long = Explanation("uid-b", "ns", "v100-25", 2, 2, "NoCapacity", "m", 2.0)
    r.submit([brief, long])
    assert r.flush() == 2 and {c[1] for c in kube.calls} == {"b"}  # b's condition and event only
    r.admitted("uid-a", "n1")  # a never heard it waited: nothing to undo
    assert r.flush() == 0
