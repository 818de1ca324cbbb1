"""``gpuslice slices --evict``: every pod that uses gpuslice evicted and waited for; those that stay named, with why.

A fake API (pods in a dict, the Eviction API's answers as kube-apiserver gives them) and a fake clock that
only moves when the command sleeps: the outcomes are asserted, never the time taken.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import pytest

from extender import slices
from extender.evict_slices import evict, left_after_eviction
from extender.slices import uses
from packing.kube.client import KubeError
from packing.record import ANNOTATION, AllocationRecord

RECORD = AllocationRecord("c1", "gpu-1", ("GPU-1",), "v100-25", 250, 8192).encode()
UIDS = itertools.count(1)


def pod(name: str, *, claim: bool = False, owner: str = "", namespace: str = "team-a") -> dict[str, Any]:
    meta: dict[str, Any] = {"namespace": namespace, "name": name, "uid": f"uid-{next(UIDS)}",
                            "annotations": {ANNOTATION: RECORD}}
    if owner:
        kind, owner_name = owner.split("/")
        meta["ownerReferences"] = [{"kind": kind, "name": owner_name, "controller": True}]
    spec: dict[str, Any] = {"nodeName": "gpu-1", "schedulerName": "gpuslice-scheduler",
                            "containers": [{"name": "c", "resources": {"limits": {} if claim else
                                                                       {"gpuslice.io/v100-25": "1"}}}]}
    if claim:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "v100-25"}]
    return {"metadata": meta, "spec": spec, "status": {"phase": "Running"}}


@dataclass
class FakeApi:
    """Pods by (namespace, name). ``pdb``: names a budget keeps (429) for that many evictions (-1: always);
    ``recreate``: names whose controller makes a new pod of the same owner once evicted; ``lingers``:
    sleeps an evicted pod stays terminating (its grace period); ``gone_first`` / ``replaced_first``:
    names deleted, or re-created under the same name, between the listing and the eviction (404, 409)."""

    pods: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    pdb: dict[str, int] = field(default_factory=dict)
    recreate: set[str] = field(default_factory=set)
    lingers: int = 1
    gone_first: set[str] = field(default_factory=set)
    replaced_first: set[str] = field(default_factory=set)
    forbidden: set[str] = field(default_factory=set)
    now: float = 0.0
    evictions: list[str] = field(default_factory=list)
    dying: dict[tuple[str, str], int] = field(default_factory=dict)  # evicted pod -> sleeps left

    def add(self, p: dict[str, Any]) -> None:
        self.pods[(p["metadata"]["namespace"], p["metadata"]["name"])] = p

    def request(self, method: str, path: str) -> dict[str, Any]:
        assert method == "GET"
        if path == "/api/v1/pods":
            return {"items": list(self.pods.values())}
        namespace = path.split("/")[4]
        return {"items": [p for (ns, _), p in self.pods.items() if ns == namespace]}

    def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.pods.get((namespace, name))

    def evict_pod(self, namespace: str, name: str, uid: str) -> None:
        key = (namespace, name)
        if name in self.gone_first:
            self.gone_first.discard(name)
            del self.pods[key]
        if name in self.replaced_first:
            self.replaced_first.discard(name)
            self.add(pod(name, namespace=namespace, owner="StatefulSet/db"))
        current = self.pods.get(key)
        if current is None:
            raise KubeError(404, f'pods "{name}" not found', "NotFound")
        if current["metadata"]["uid"] != uid:
            raise KubeError(409, f"Precondition failed: UID in precondition: {uid}", "Conflict")
        if name in self.forbidden:
            raise KubeError(403, f'pods "{name}" is forbidden: cannot create resource "pods/eviction"', "Forbidden")
        if self.pdb.get(name, 0) != 0:
            self.pdb[name] -= 1
            raise KubeError(429, "Cannot evict pod as it would violate the pod's disruption budget.",
                            "TooManyRequests")
        self.evictions.append(name)
        current["metadata"]["deletionTimestamp"] = "2026-12-04T00:00:00Z"
        self.dying[key] = self.lingers
        if self.lingers == 0:
            self._remove(key)

    def _remove(self, key: tuple[str, str]) -> None:
        gone = self.pods.pop(key)
        self.dying.pop(key, None)
        if key[1] in self.recreate:
            owner = gone["metadata"]["ownerReferences"][0]
            self.add(pod(f"{key[1]}-next", namespace=key[0], claim=True, owner=f"{owner['kind']}/{owner['name']}"))

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        for key, left in list(self.dying.items()):
            if left <= 1:
                self._remove(key)
            else:
                self.dying[key] = left - 1


def run(api: FakeApi, timeout: float = 60.0) -> tuple[list[tuple[str, str]], list[str]]:
    said: list[str] = []
    left = evict(api, lambda: uses(api.pods.values()), timeout, say=said.append, clock=lambda: api.now,
                 sleep=api.sleep)
    return [(u.name, why) for u, why in left], said


@dataclass(frozen=True)
class Case:
    pods: tuple[dict[str, Any], ...]
    api: dict[str, Any]
    evicted: tuple[str, ...]
    stays: dict[str, str]  # name -> a part of why it stays


CASES = {
    "none": Case((), {}, (), {}),
    "bare pods evicted and waited for": Case((pod("dra", claim=True), pod("res")), {"lingers": 3}, ("dra", "res"), {}),
    "a budget forbids it until the timeout": Case((pod("guarded"), pod("free")), {"pdb": {"guarded": -1}},
                                                  ("free",), {"guarded": "a PodDisruptionBudget forbids evicting it"}),
    "a budget lets it go on a retry": Case((pod("guarded"),), {"pdb": {"guarded": 2}}, ("guarded",), {}),
    "re-created by its controller": Case((pod("web-1", claim=True, owner="ReplicaSet/web-7f9"),),
                                         {"recreate": {"web-1"}}, ("web-1",),
                                         {"web-1-next": "by its controller ReplicaSet/web-7f9: scale it down"}),
    "404: gone already": Case((pod("quick"),), {"gone_first": {"quick"}}, (), {}),
    "409: re-created under its name": Case((pod("db-0", owner="StatefulSet/db"),), {"replaced_first": {"db-0"}}, (),
                                           {"db-0": "re-created by its controller StatefulSet/db"}),
    "still terminating at the timeout": Case((pod("slow"),), {"lingers": 1000}, ("slow",),
                                             {"slow": "still terminating after 60 s"}),
    "403: refused for good, not retried": Case((pod("locked"),), {"forbidden": {"locked"}}, (),
                                               {"locked": "its eviction failed (pods \"locked\" is forbidden"}),
}


@pytest.mark.parametrize("case", CASES.values(), ids=list(CASES))
def test_evict(case: Case) -> None:
    api = FakeApi(**case.api)
    for p in case.pods:
        api.add(p)
    left, said = run(api)
    assert tuple(sorted(api.evictions)) == case.evicted
    assert {name for name, _ in left} == set(case.stays)
    for name, why in left:
        assert case.stays[name] in why, why
    for name in case.evicted:  # each eviction is said, and each pod evicted that went, too
        assert any(line.startswith(f"evicted team-a/{name} ") for line in said), said
    assert [n for n in case.evicted if n not in case.stays and ("team-a", n) in api.pods] == []  # waited for


def test_a_pod_terminating_already_is_waited_for_not_evicted_again() -> None:
    api = FakeApi(lingers=2)
    p = pod("leaving")
    api.add(p)
    api.evict_pod("team-a", "leaving", p["metadata"]["uid"])  # someone else deleted it
    api.evictions.clear()
    left, said = run(api)
    assert left == [] and api.evictions == [] and "team-a/leaving is terminating already" in said
    assert "team-a/leaving is gone" in said


def test_it_says_what_it_still_waits_for() -> None:
    api = FakeApi(lingers=3)
    api.add(pod("a"))
    api.add(pod("b", claim=True))
    _, said = run(api)
    assert "waiting for 2 pod(s): team-a/a, team-a/b" in said, said


def test_the_message_names_every_pod_that_stays_and_why() -> None:
    api = FakeApi(pdb={"guarded": -1}, recreate={"web-1"})
    api.add(pod("guarded"))
    api.add(pod("web-1", claim=True, owner="ReplicaSet/web-7f9"))
    found = evict(api, lambda: uses(api.pods.values()), 10, say=lambda _: None, clock=lambda: api.now,
                  sleep=api.sleep)
    text = left_after_eviction(found, 10)
    assert "2 pod(s) still use gpuslice" in text
    assert "team-a/guarded (holds a slice, extended resource): a PodDisruptionBudget forbids" in text
    assert "team-a/web-1-next (holds a slice, DRA claim): re-created by its controller ReplicaSet/web-7f9" in text
    assert "helm uninstall --no-hooks" in text


# ---- the command -------------------------------------------------------------------------------------

def command(api: FakeApi, argv: list[str], monkeypatch: pytest.MonkeyPatch,
            capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    monkeypatch.setattr(slices, "operator_kube", lambda kubeconfig="": api)
    try:
        status = slices.main(argv)
    except SystemExit as e:  # a value refused where it is parsed
        status = int(e.code or 0)
    out = capsys.readouterr()
    return status, out.out, out.err


def test_evict_exits_0_once_none_is_left(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    api = FakeApi(lingers=0)
    api.add(pod("dra", claim=True))
    api.add(pod("res"))
    api.add(pod("elsewhere", namespace="team-b"))
    status, out, err = command(api, ["-n", "team-a", "--evict", "--timeout", "30"], monkeypatch, capsys)
    assert (status, err) == (0, "")
    assert sorted(api.evictions) == ["dra", "res"] and ("team-b", "elsewhere") in api.pods
    assert "evicted team-a/dra (holds a slice, DRA claim, node gpu-1)" in out
    assert out.rstrip().endswith("no pod uses gpuslice any more")


def test_evict_exits_3_naming_what_stays(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    api = FakeApi(lingers=0, pdb={"guarded": -1})
    api.add(pod("guarded"))
    status, _, err = command(api, ["-A", "--evict", "--timeout", "0"], monkeypatch, capsys)
    assert status == slices.REFUSED
    assert "uninstall refused" in err and "team-a/guarded" in err and "PodDisruptionBudget" in err


@pytest.mark.parametrize(("argv", "says"), [
    (["--evict", "--timeout", "-1"], "--timeout: expected a number >= 0, got '-1'"),
    (["--evict", "--timeout", "soon"], "--timeout: expected a number, got 'soon'"),
    (["--timeout", "5"], "--timeout bounds what --evict does; add --evict"),
    (["--evict", "--refuse"], "--evict and --refuse cannot go together"),
])
def test_bad_input_is_refused_before_anything_is_evicted(argv: list[str], says: str, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    api = FakeApi()
    api.add(pod("a"))
    status, _, err = command(api, argv, monkeypatch, capsys)
    assert status == 2 and says in err, err
    assert api.evictions == [] and ("team-a", "a") in api.pods
