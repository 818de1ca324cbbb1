"""Pod groups in the extender: how a pod asks, the webhook's checks, the gate lifting a whole group,
filter and bind of members, the group's deadline, its Events, and ``gpuslice queue``'s GROUP column."""

from __future__ import annotations

import copy
import threading
import time
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from extender.cluster.gate_controller import GateController, gate_index
from extender.cluster.group_readiness import GROUP_NOT_READY, GroupReadiness
from extender.cluster.metrics import ClusterMetrics
from extender.cluster.pending_writer import GROUP_INCOMPLETE, GROUP_ROLLED_BACK, PendingReporter, notice_of
from extender.cluster.state import ClusterState
from extender.decide import BindCode
from extender.inventory import synthetic_cards
from extender.queue_view import as_json, table, waiting_of
from extender.samples import pod
from extender.state import StateConfig
from extender.wire import BindingArgs, ExtenderArgs
from packing.asks import AskReader
from packing.claims import MemberOf
from packing.kube.client import KubeError
from packing.pod_group import GROUP_LABEL, SIZE_ANNOTATION, GroupError, group_of, members_disagree
from packing.products import load_catalog
from packing.queue import NO_CAPACITY, WAITING_FOR_MEMBERS
from tests.unit.test_cluster_gate_controller import FakePods

CATALOG = load_catalog()
READY_S = 120.0


def member(name: str, group: str | None = "train", size: str | None = "2", product: str = "v100-100",
           scheduler: str | None = None) -> dict[str, Any]:
    doc = pod(name, product, namespace="team")
    meta = doc["metadata"]
    if group is not None:
        meta.setdefault("labels", {})[GROUP_LABEL] = group
    if size is not None:
        meta.setdefault("annotations", {})[SIZE_ANNOTATION] = size
    if scheduler is not None:
        doc["spec"]["schedulerName"] = scheduler
    return doc


# ---- how a pod asks ------------------------------------------------------------------------------

@pytest.mark.parametrize(("group", "size", "wanted"), [
    (None, None, None),
    ("train", "4", MemberOf("train", 4)),
    ("train", "1", MemberOf("train", 1)),
    ("train", None, "without the annotation"),
    (None, "4", "without the label"),
    ("train", "0", "not a positive whole number"),
    ("train", "-2", "not a positive whole number"),
    ("train", "four", "not a positive whole number"),
    ("train", " 4", "not a positive whole number"),
    ("train", "²", "not a positive whole number"),  # a Unicode digit int() would take
    ("train", "33", "binds at most 32 pods of a group"),
])
def test_group_of_reads_the_label_and_the_size(group: str | None, size: str | None,
                                                 wanted: MemberOf | str | None) -> None:
    doc = member("p", group, size)
    if isinstance(wanted, str):
        with pytest.raises(GroupError, match=wanted):
            group_of(doc, max_size=32)
    else:
        assert group_of(doc, max_size=32) == wanted


def test_the_ask_carries_the_group_and_a_bad_one_is_a_refusal() -> None:
    reader = AskReader(CATALOG)
    assert reader.read(member("p")).group == MemberOf("train", 2)
    bad = reader.read(member("p", size="x"))
    assert bad.request is None and bad.refusal is not None and "not a positive whole number" in bad.refusal
    assert reader.read(member("p", group=None, size=None)).group is None


def test_members_must_agree_on_size_and_scheduler_and_a_group_takes_no_more_than_its_size() -> None:
    tag = MemberOf("train", 2)
    routed = "gpuslice-scheduler"
    mine = member("new")
    first = member("a", scheduler=routed)
    assert members_disagree(mine, tag, [first], routed) is None
    why = members_disagree(mine, tag, [member("a", size="3", scheduler=routed)], routed)
    assert why is not None and "says gpuslice.io/pod-group-size=3, this pod says 2" in why
    why = members_disagree(member("new", scheduler="volcano"), tag, [first], routed)
    assert why is not None and "scheduled by gpuslice-scheduler, this pod by volcano" in why
    why = members_disagree(mine, tag, [first, member("b", scheduler=routed)], routed)
    assert why is not None and "already has its 2 member(s) (a, b)" in why
    done = member("b", scheduler=routed)
    done["status"] = {"phase": "Failed"}
    leaving = member("c", scheduler=routed)
    leaving["metadata"]["deletionTimestamp"] = "2025-01-01T00:00:00Z"
    assert members_disagree(mine, tag, [first, done, leaving], routed) is None  # those no longer count


# ---- the cluster: gate, filter, bind, deadline, events ----------------------------------------------

class Binder:
    def __init__(self) -> None:
        self.bound: dict[str, float] = {}

    def bind(self, args: Any, record: Any) -> None:
        self.bound[args.pod_name] = time.monotonic()

    def release(self, pod_uid: str) -> None:
        pass


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Events:
    """A Kube stand-in that keeps the Events and status patches the reporter writes."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def create_event(self, namespace: str, body: dict[str, Any]) -> None:
        self.events.append(body)

    def patch_pod_status(self, namespace: str, name: str, body: Any, content_type: str) -> None:
        pass

    def reasons(self, name: str) -> list[str]:
        return [e["reason"] for e in self.events if e["involvedObject"]["name"] == name]


def cluster(gpus: int = 2, wait_s: float = 5.0, mode: str = "strict"
            ) -> tuple[ClusterState, FakePods, GateController, Binder, Clock, Events]:
    clock = Clock(5000.0)
    binder = Binder()
    state = ClusterState(CATALOG, binder, StateConfig(mode=mode, reservation_ttl_s=30), clock=clock,
                         group_ready_timeout_s=READY_S, group_bind_wait_s=wait_s)
    state.sync_node("n1", synthetic_cards("n1", gpus, "Tesla-V100-SXM2-32GB", 32768))
    state.ready = True
    api = FakePods()
    events = Events()
    reporter = PendingReporter(events, api.pods.get, notice_after_s=0.0, member_timeout_s=60.0,  # type: ignore[arg-type]
                               clock=clock)
    gate = GateController(state, api, api.pods.get, ClusterMetrics(CollectorRegistry()), reporter)  # type: ignore[arg-type]
    return state, api, gate, binder, clock, events


def arrive(state: ClusterState, api: FakePods, doc: dict[str, Any], created: float) -> dict[str, Any]:
    doc = api.add(doc)
    state.gate_arrive(state.describe(doc), created, "gated")
    return doc


def uid(doc: dict[str, Any]) -> str:
    return str(doc["metadata"]["uid"])


def test_the_gate_lifts_a_whole_group_in_one_step_with_the_groups_deadline() -> None:
    state, api, gate, _, clock, _ = cluster(gpus=2)
    a = arrive(state, api, member("a"), 100.0)
    assert gate.step() == []  # one of two members: nothing lifted
    e = state.explain(clock.now)[0]
    assert e.reason == WAITING_FOR_MEMBERS and e.group is not None and (e.group.present, e.group.size) == (1, 2)
    b = arrive(state, api, member("b"), 101.0)
    assert {x.claim for x in gate.step()} == {uid(a), uid(b)}
    assert gate_index(a) is None and gate_index(b) is None
    for d in (a, b):
        assert state.ledger.allocations[uid(d)].expires_at == clock.now + READY_S


def test_a_group_that_does_not_fit_is_never_partly_lifted() -> None:
    state, api, gate, _, clock, _ = cluster(gpus=4)
    filler = arrive(state, api, pod("filler", "v100-100", count=2, namespace="team"), 90.0)
    assert [x.claim for x in gate.step()] == [uid(filler)]
    docs = [arrive(state, api, member(f"m{i}", size="3"), 100.0 + i) for i in range(3)]
    assert gate.step() == []
    assert all(gate_index(d) is not None for d in docs) and set(state.ledger.allocations) == {uid(filler)}
    e = {x.claim: x for x in state.explain(clock.now)}
    assert {x.reason for x in e.values()} == {NO_CAPACITY}
    assert "only 2 would fit now" in e[uid(docs[0])].message


def test_filter_refuses_a_member_the_queue_has_not_admitted() -> None:
    state, api, _gate, _, clock, _ = cluster(gpus=2)
    doc = api.add(member("a"), gated=False)  # ungated: created before the webhook, say
    out = state.core.filter(ExtenderArgs(doc, ["n1"]))
    assert out.result.node_names == [] and "WaitingForGroup" in out.result.failed["n1"]
    assert not state.ledger.allocations
    assert state.waiting_state(uid(doc)) == "waiting"
    standalone = ClusterState(CATALOG, Binder(), StateConfig(standalone=True), clock=clock)
    standalone.sync_node("n1", synthetic_cards("n1", 2, "Tesla-V100-SXM2-32GB", 32768))
    refused = standalone.core.filter(ExtenderArgs(doc, ["n1"]))
    assert "need the cluster's queue gate" in refused.result.unresolvable["n1"]


@pytest.mark.parametrize("mode", ["strict", "cooperative"])
def test_members_bind_together_at_the_barrier(mode: str) -> None:
    state, api, gate, binder, _clock, _ = cluster(gpus=2, mode=mode)
    a = arrive(state, api, member("a"), 100.0)
    b = arrive(state, api, member("b"), 101.0)
    gate.step()
    for d in (a, b):  # each filter keeps the reservation its group's admission made (cooperative too)
        assert state.core.filter(ExtenderArgs(d, ["n1"])).result.node_names == ["n1"]
        assert state.ledger.allocations[uid(d)].reserved
    results: dict[str, Any] = {}

    def bind(d: dict[str, Any]) -> None:
        results[d["metadata"]["name"]] = state.core.bind(BindingArgs(d["metadata"]["name"], "team", uid(d), "n1"))

    first = threading.Thread(target=bind, args=(a,))
    first.start()
    time.sleep(0.3)
    assert "a" not in binder.bound  # a waits for b
    bind(b)
    first.join(5)
    assert results["a"].ok and results["b"].ok
    assert abs(binder.bound["a"] - binder.bound["b"]) < 0.5


def test_a_member_that_never_comes_to_bind_binds_no_one_and_the_deadline_takes_the_group_back() -> None:
    state, api, gate, binder, clock, events = cluster(gpus=2, wait_s=0.2)
    a = arrive(state, api, member("a"), 100.0)
    b = arrive(state, api, member("b"), 101.0)
    gate.step()
    out = state.core.bind(BindingArgs("a", "team", uid(a), "n1"))
    assert out.code is BindCode.GROUP_INCOMPLETE and "1 of the 2 admitted members" in out.error
    assert binder.bound == {} and state.ledger.allocations[uid(a)].reserved  # kept until the deadline
    clock.now += READY_S + 1
    again = gate.step()  # the lapsed group goes back to its place, and (it fits) is admitted again at once
    gate.reporter.flush()  # type: ignore[union-attr]
    assert binder.bound == {}
    for name in ("a", "b"):
        assert GROUP_ROLLED_BACK in events.reasons(name)
    rolled = next(e for e in events.events if e["reason"] == GROUP_ROLLED_BACK)
    assert "reservations lapsed" in rolled["message"] and rolled["type"] == "Warning"
    assert {x.claim for x in again} == {uid(a), uid(b)}
    assert all(state.ledger.allocations[uid(d)].expires_at == clock.now + READY_S for d in (a, b))


def test_a_member_deleted_after_admission_takes_the_reserved_rest_back_and_says_so() -> None:
    state, api, gate, _, clock, events = cluster(gpus=2)
    a = arrive(state, api, member("a"), 100.0)
    b = arrive(state, api, member("b"), 101.0)
    gate.step()
    state.observe_gone(uid(b))
    assert uid(a) not in state.ledger.allocations and state.waiting_state(uid(a)) == "waiting"
    e = state.explain(clock.now)[0]
    assert e.reason == WAITING_FOR_MEMBERS and e.group is not None and e.group.present == 1
    gate.step()
    gate.reporter.flush()  # type: ignore[union-attr]
    assert GROUP_ROLLED_BACK in events.reasons("a")
    assert any(f"member {uid(b)} is gone" in x["message"] for x in events.events)


def test_a_group_still_missing_members_after_the_timeout_says_so_once() -> None:
    state, api, gate, _, clock, events = cluster(gpus=2)
    arrive(state, api, member("a", size="3"), 100.0)
    clock.now = 100.0 + 30
    gate.reporter.submit(state.explain(clock.now))  # type: ignore[union-attr]
    gate.reporter.flush()  # type: ignore[union-attr]
    assert GROUP_INCOMPLETE not in events.reasons("a")
    for _ in range(2):
        clock.now = 100.0 + 61
        gate.reporter.submit(state.explain(clock.now))  # type: ignore[union-attr]
        gate.reporter.flush()  # type: ignore[union-attr]
    assert events.reasons("a").count(GROUP_INCOMPLETE) == 1
    told = next(e for e in events.events if e["reason"] == GROUP_INCOMPLETE)
    assert "1 of 3 members present" in told["message"] and told["type"] == "Warning"


def test_gpuslice_queue_shows_the_group_and_its_members() -> None:
    state, api, _gate, _, clock, _ = cluster(gpus=2)
    a = arrive(state, api, member("a", size="3"), 100.0)
    e = state.explain(clock.now)[0]
    shown = copy.deepcopy(a)
    shown["status"] = {"phase": "Pending", "conditions": [{"type": "gpuslice.io/Queued", "status": "True",
                                                            "reason": e.reason, "message": notice_of(e).text()}]}
    row = waiting_of(shown, clock.now)
    assert row is not None and (row.group, row.members) == ("train", "1/3")
    lines = table([row], all_namespaces=False).splitlines()
    assert lines[0].split() == ["NAME", "POSITION", "PRODUCT", "GROUP", "REASON", "WAITED", "EXPECTED", "MESSAGE"]
    assert "train (1/3)" in lines[1]
    assert '"group": {\n        "name": "train",\n        "present": 1,\n        "size": 3\n      }' in as_json([row])


def test_a_member_whose_group_went_back_never_binds_alone() -> None:
    state, api, gate, binder, _clock, _ = cluster(gpus=2)
    a = arrive(state, api, member("a"), 100.0)
    b = arrive(state, api, member("b"), 101.0)
    gate.step()
    state.observe_gone(uid(b))  # the group goes back: a's reservation is released
    assert uid(a) not in state.ledger.allocations
    out = state.core.bind(BindingArgs("a", "team", uid(a), "n1"))  # kube-scheduler had it in its binding cycle
    assert out.code is BindCode.GROUP_INCOMPLETE and "without a reservation" in out.error
    assert binder.bound == {} and uid(a) not in state.ledger.allocations


# ---- bound but not Running within the ready timeout ------------------------------------------------

class EvictingPods(FakePods):
    """FakePods that also take evictions (a status code in ``refuse`` answers the next one for that pod)."""

    def __init__(self) -> None:
        super().__init__()
        self.evicted: list[str] = []
        self.refuse: dict[str, int] = {}

    def evict_pod(self, namespace: str, name: str, uid: str) -> None:
        code = self.refuse.pop(name, 0)
        if code:
            raise KubeError(code, "injected")
        self.evicted.append(name)


def bound_pair(wait_s: float = 2.0) -> tuple[ClusterState, EvictingPods, GateController, Clock, Events,
                                             list[dict[str, Any]]]:
    state, _, gate, _, clock, events = cluster(gpus=2, wait_s=wait_s)
    api = EvictingPods()
    gate.kube, gate.lookup, gate.reporter.lookup = api, api.pods.get, api.pods.get  # type: ignore[assignment,union-attr]
    docs = [arrive(state, api, member(n), 100.0 + i) for i, n in enumerate(("a", "b"))]
    gate.step()
    threads = [threading.Thread(target=state.core.bind, args=(BindingArgs(d["metadata"]["name"], "team", uid(d),
                                                                          "n1"),)) for d in docs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(5)
    assert all(state.core.cache.bound_node(uid(d)) == "n1" for d in docs)
    return state, api, gate, clock, events, docs


def readiness(state: ClusterState, api: EvictingPods, gate: GateController, evict: bool) -> GroupReadiness:
    return GroupReadiness(state, api, api.pods.get, ClusterMetrics(CollectorRegistry()), gate.reporter,  # type: ignore[arg-type]
                          READY_S, evict)


def test_a_bound_group_not_running_in_time_is_told_once_and_evicted(monkeypatch: pytest.MonkeyPatch) -> None:
    state, api, gate, clock, events, (a, b) = bound_pair()
    admitted = clock.now
    assert state.bound_groups(clock.now) == [("team/train", admitted, tuple(sorted((uid(a), uid(b)))))]
    a["status"] = {"phase": "Running"}
    b["status"] = {"phase": "Pending", "containerStatuses": [{"name": "c", "state": {"waiting": {
        "reason": "ImagePullBackOff"}}}]}
    watch = readiness(state, api, gate, evict=True)
    clock.now = admitted + READY_S - 1
    assert watch.check() == [] and api.evicted == []
    clock.now = admitted + READY_S
    monkeypatch.setattr("extender.cluster.group_readiness.EVICT_RETRY_S", 0.0)
    api.refuse["b"] = 429  # a PodDisruptionBudget forbids it for now: tried again at the next check
    (late,) = watch.check()
    assert [m.name for m in late.late] == ["b"]
    assert api.evicted == ["a"]
    watch.check()
    assert api.evicted == ["a", "b"]
    gate.reporter.flush()  # type: ignore[union-attr]
    told = [e for e in events.events if e["reason"] == GROUP_NOT_READY]
    assert sorted(e["involvedObject"]["name"] for e in told) == ["a", "b"]  # once each, over both checks
    assert "b (Pending: container c waiting ImagePullBackOff)" in told[0]["message"]
    assert "evicted" in told[0]["message"] and told[0]["type"] == "Warning"
    for d in (a, b):
        d["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"  # leaving: not evicted again
    watch.check()
    assert api.evicted == ["a", "b"]


def test_off_only_tells_and_a_running_group_or_one_not_all_bound_is_never_late() -> None:
    state, api, gate, clock, events, (a, b) = bound_pair()
    watch = readiness(state, api, gate, evict=False)
    clock.now += READY_S + 1
    for d in (a, b):
        d["status"] = {"phase": "Running"}
    assert watch.check() == []
    b["status"] = {"phase": "Pending"}
    assert len(watch.check()) == 1 and len(watch.check()) == 1
    gate.reporter.flush()  # type: ignore[union-attr]
    told = [e for e in events.events if e["reason"] == GROUP_NOT_READY]
    assert len(told) == 2 and "nothing is evicted" in told[0]["message"]
    assert api.evicted == []
    # a group admitted but not bound yet is the reservation deadline's, not this check's
    state2, _, gate2, _, clock2, _ = cluster(gpus=2)
    api2 = FakePods()
    for i, n in enumerate(("c", "d")):
        arrive(state2, api2, member(n), 100.0 + i)
    gate2.step()
    assert state2.bound_groups(clock2.now + READY_S + 1) == []


def test_a_group_adopted_bound_counts_from_when_it_is_first_seen() -> None:
    state, _api, _gate, clock, _, (a, b) = bound_pair()
    state._group_admitted.clear()  # as after a leader change: this replica did not admit it
    clock.now += 1000.0
    assert state.bound_groups(clock.now)[0][1] == clock.now
    assert state.bound_groups(clock.now + 5)[0][1] == clock.now  # kept
    state.observe_gone(uid(a))
    state.observe_gone(uid(b))
    assert state.bound_groups(clock.now) == [] and state._group_admitted == {}
