"""``gpuslice queue`` on pod objects as the API returns them (the e2e suite runs it against a real API server)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from extender.cluster.pending_writer import Notice, condition_patch, notice_of
from extender.queue_view import Waiting, as_json, human_duration, main, table, waiting_of, waiting_pods
from packing.gate import GATE
from packing.kube.events import timestamp
from packing.queue import Explanation
from packing.wait_history import WaitSummary

NOW = 1_790_000_000.0


def ts(offset_s: float) -> str:
    return timestamp(NOW - offset_s)


Obj = dict[str, Any]


def pod(name: str, *, ns: str = "team-a", gated: bool = True, notice: Notice | None = None, age_s: float = 90,
        limits: dict[str, str] | None = None, claim: str = "", node: str = "", phase: str = "Pending") -> Obj:
    container: dict[str, Any] = {"name": "c", "image": "x"}
    if limits is not None:
        container["resources"] = {"limits": limits}
    spec: dict[str, Any] = {"containers": [container], "schedulerName": "gpuslice-scheduler"}
    if gated:
        spec["schedulingGates"] = [{"name": "other.example/gate"}, {"name": GATE}]
    if claim:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": claim}]
    if node:
        spec["nodeName"] = node
    status: dict[str, Any] = {"phase": phase, "conditions": [{"type": "PodScheduled", "status": "False",
                                                              "reason": "SchedulingGated"}]}
    if notice is not None:  # exactly what the pending writer patches onto the pod
        status["conditions"] += condition_patch(notice, NOW - 5)["status"]["conditions"]
    return {"metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}", "creationTimestamp": ts(age_s)},
            "spec": spec, "status": status}


def explained(reason: str, message: str, product: str, position: int, product_position: int) -> Notice:
    return notice_of(Explanation(claim="c", reason=reason, message=message, position=position, product=product,
                                 product_position=product_position, namespace="team-a", waited=0.0))


def test_a_gated_pod_shows_the_writers_position_reason_and_message_without_the_prefix() -> None:
    notice = explained("NoCapacity", "no card has a 250-milli slice free", "v100-25", 3, 2)
    w = waiting_of(pod("p", notice=notice, limits={"gpuslice.io/v100-25": "1"}, age_s=303), NOW)
    assert w == Waiting(namespace="team-a", name="p", position=3, product="v100-25", reason="NoCapacity",
                        status="gated", waiting_since=ts(303), waited_s=pytest.approx(303),
                        message="no card has a 250-milli slice free (v100-25: 2nd of its product in line)")
    assert notice.text() == f"position 3 in the gpuslice queue: {w.message}"  # the writer's text, read back


def test_the_expected_wait_the_writer_adds_is_read_back() -> None:
    lately = WaitSummary("v100-50", 120.0, 660.0, 500)
    told = notice_of(Explanation(claim="c", reason="NoCapacity", message="needs a 500-milli slice", position=4,
                                 product="v100-50", product_position=2, namespace="team-a", waited=60.0,
                                 expected_in=250.0, wait_lately=lately))
    assert told.message.endswith("(v100-50: 2nd of its product in line; expected start in about 5 min; "
                                 "v100-50 lately: median 2 min, p90 10 min)")
    w = waiting_of(pod("p", notice=told, claim="half-card"), NOW)
    assert w is not None and w.product == "v100-50" and w.expected == "~5 min"
    late = notice_of(Explanation(claim="c", reason="NoCapacity", message="m", position=1, product="v100-50",
                                 product_position=1, namespace="team-a", waited=9000.0, wait_lately=lately))
    assert "waited longer than every recent v100-50 claim; v100-50 lately" in late.message
    w = waiting_of(pod("q", notice=late), NOW)
    assert w is not None and w.expected == "longer"
    assert "~5 min" in table(waiting_pods([pod("p", notice=told)], NOW), all_namespaces=False)
    admitted = waiting_of(pod("r", gated=False, notice=told), NOW)
    assert admitted is not None and admitted.expected == ""  # left the line: no expectation shown


def test_a_claims_product_comes_from_the_extenders_message() -> None:
    notice = explained("QuotaExceeded", "namespace team-a is at its entitlement", "v100-50", 1, 1)
    w = waiting_of(pod("p", notice=notice, claim="half-card"), NOW)
    assert w is not None and w.product == "v100-50"
    unexplained = waiting_of(pod("q", claim="half-card"), NOW)
    assert unexplained is not None and unexplained.product == "claim half-card" and unexplained.reason == ""


def test_who_waits_and_who_does_not() -> None:
    admitted = Notice("Admitted", "a slice is reserved on node n1; the scheduling gate is lifted", 0, "False")
    stale = explained("NoCapacity", "no card has a 1000-milli slice free", "v100-100", 4, 1)
    rows = {
        "gated-unexplained": waiting_of(pod("a"), NOW),
        "admitted-unbound": waiting_of(pod("b", gated=False, notice=admitted), NOW),
        "lifted-by-hand": waiting_of(pod("c", gated=False, notice=stale), NOW),
        "bound": waiting_of(pod("d", gated=False, notice=admitted, node="n1"), NOW),
        "running": waiting_of(pod("e", gated=False, notice=admitted, node="n1", phase="Running"), NOW),
        "pending-not-ours": waiting_of(pod("f", gated=False), NOW),
    }
    assert rows["gated-unexplained"] is not None and rows["gated-unexplained"].status == "gated"
    assert rows["admitted-unbound"] is not None and rows["admitted-unbound"].status == "admitted"
    assert rows["admitted-unbound"].reason == "Admitted" and rows["admitted-unbound"].position is None
    # the gate is gone (gpuslice gates --lift): the pod left the line, whatever its condition still says
    assert rows["lifted-by-hand"] is not None and rows["lifted-by-hand"].position is None
    assert rows["bound"] is None and rows["running"] is None and rows["pending-not-ours"] is None


def test_rows_are_in_line_order_then_the_oldest_without_a_place() -> None:
    pods = [pod("third", notice=explained("NoCapacity", "m", "v100-25", 3, 1)),
            pod("young", age_s=10), pod("first", ns="team-b", notice=explained("NoCapacity", "m", "v100-25", 1, 1)),
            pod("old", age_s=5000), pod("second", notice=explained("QuotaExceeded", "m", "v100-50", 2, 1))]
    assert [w.name for w in waiting_pods(pods, NOW)] == ["first", "second", "third", "old", "young"]


def test_table_is_kubectls_shape() -> None:
    rows = waiting_pods([pod("train-0", notice=explained("NoCapacity", "no card has a 1000-milli slice free",
                                                         "v100-100", 1, 1), limits={"gpuslice.io/v100-100": "1"},
                             age_s=4000),
                         pod("x", ns="b", age_s=61)], NOW)
    lines = table(rows, all_namespaces=True).splitlines()
    assert lines[0].split() == ["NAMESPACE", "NAME", "POSITION", "PRODUCT", "REASON", "WAITED", "EXPECTED", "MESSAGE"]
    assert lines[1].split()[:7] == ["team-a", "train-0", "1", "v100-100", "NoCapacity", "66m", "<none>"]
    assert lines[2].split()[:7] == ["b", "x", "-", "-", "<none>", "61s", "<none>"]
    assert "not explained yet" in lines[2]
    # columns line up: each header starts where its cells start
    for header in ("NAME", "POSITION", "PRODUCT", "REASON", "WAITED", "EXPECTED", "MESSAGE"):
        at = lines[0].index(" " + header) + 1
        assert all(line[at - 1] == " " and line[at] != " " for line in lines[1:]), header
    one_ns = table(rows, all_namespaces=False, headers=False).splitlines()
    assert len(one_ns) == 2 and one_ns[0].split()[0] == "train-0"


def test_json_has_the_same_rows() -> None:
    rows = waiting_pods([pod("p", notice=explained("NoCapacity", "m", "v100-25", 2, 1), age_s=42.5)], NOW)
    (item,) = json.loads(as_json(rows))["items"]
    assert item == {"namespace": "team-a", "name": "p", "position": 2, "product": "-", "reason": "NoCapacity",
                    "status": "gated", "waitingSince": ts(42.5), "waitedSeconds": pytest.approx(42.5, abs=1),
                    "expected": "", "message": "m (v100-25: 1st of its product in line)", "group": None}
    assert json.loads(as_json([])) == {"items": []}


@pytest.mark.parametrize(("seconds", "text"), [
    (-5, "0s"), (0, "0s"), (119, "119s"), (120, "2m"), (125, "2m5s"), (599, "9m59s"), (600, "10m"),
    (3 * 3600 - 1, "179m"), (3 * 3600, "3h"), (3 * 3600 + 60, "3h1m"), (8 * 3600, "8h"), (47 * 3600, "47h"),
    (48 * 3600, "2d"), (50 * 3600, "2d2h"), (8 * 86400, "8d"), (730 * 86400, "2y"), (731 * 86400, "2y1d"),
    (9 * 365 * 86400, "9y"),
])
def test_waited_reads_as_kubectl_writes_ages(seconds: float, text: str) -> None:
    assert human_duration(seconds) == text



KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "http://127.0.0.1:1"}}]
users: [{name: u, user: {token: t}}]
contexts: [{name: x, context: {cluster: c, user: u, namespace: team-q}}]
current-context: x
"""


def test_without_n_the_contexts_namespace_is_listed_and_an_unreachable_api_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config"
    config.write_text(KUBECONFIG)
    assert main(["--kubeconfig", str(config)]) == 1  # nothing listens on port 1
    err = capsys.readouterr().err
    assert err.startswith("gpuslice queue: cannot list pods: ") and "/api/v1/namespaces/team-q/pods" in err
    assert err.count("\n") == 1
    with pytest.raises(SystemExit) as exit_:
        main(["--kubeconfig", str(tmp_path / "missing")])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[0] == \
        f"gpuslice queue: error: argument --kubeconfig: no file {tmp_path / 'missing'}"
