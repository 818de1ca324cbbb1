"""The demand history on a real API server: the extender records a workload, ``gpuslice history export``
reads it, ``simulate/plan --from-cluster`` replay it against the live extender, and a new leader
continues it from the chunks the last one wrote in ConfigMaps.

gpuslice runs as ``make e2e`` runs it (``gpuslice_harness``: the rendered Deployment's command, with
its history flags, against etcd, kube-apiserver and kube-scheduler built from pinned sources).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from packing.kube.client import Kube

from . import gpuslice_harness as h
from .cluster import ControlPlane, create_namespace

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def gs(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[h.Gpuslice]:
    g = h.install(control_plane, tmp_path_factory.mktemp("gpuslice-history"))
    try:
        yield g
    finally:
        g.stop()


def gpuslice(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "packing.cli", *args], capture_output=True, text=True, timeout=300)


def rows_of(text: str) -> tuple[dict[str, Any], dict[str, dict[str, Any]]]:
    lines = text.splitlines()
    return json.loads(lines[0]), {r["claim"]: r for r in map(json.loads, lines[1:])}


def test_the_history_is_exported_replayed_and_survives_a_leader_change(gs: h.Gpuslice, tmp_path: Path) -> None:
    kube: Kube = gs.kube
    # the history outlives an install in its namespace (the modules before this one left theirs): ask
    # for this test's period only
    since = f"{time.time() - 1:.3f}"
    ns = create_namespace(gs.cp.api_client(), "hist")
    names = ["hist-0", "hist-1"]
    try:
        for name in names:
            h.gpu_node(kube, gs.cp.api_client(), name, 2)
        h.poll(lambda: set(names) <= {n["name"] for n in gs.extender.state()["nodes"]}, 20, "nodes in the ledger")
        # the workload: four whole cards fill the two nodes, two more wait; two leave, the waiting two start
        pods = [f"whole-{i}" for i in range(6)]
        for name in pods[:4]:
            h.create_pod(kube, ns, h.slice_pod(name, "v100-100"))
            h.wait_bound(kube, ns, name, timeout=30)
        for name in pods[4:]:
            h.create_pod(kube, ns, h.slice_pod(name, "v100-100"))
        h.poll(lambda: len(gs.extender.state()["queue"]) == 2 or None, 30, "two pods waiting")
        for name in pods[:2]:
            h.delete_now(kube, ns, name)
        for name in pods[4:]:
            h.wait_bound(kube, ns, name, timeout=30)
        h.create_pod(kube, ns, h.slice_pod("quarter", "v100-25"))  # waits: no card has room
        h.poll(lambda: len(gs.extender.state()["queue"]) == 1 or None, 30, "the quarter waiting")
        uid = {name: (kube.get_pod(ns, name) or {})["metadata"]["uid"] for name in [*pods[2:], "quarter"]}

        leader = gs.extender
        conn = ["--url", leader.url, "--ca", str(gs.tls.ca)]
        export = gpuslice("history", "export", "--since", since, *conn)
        assert export.returncode == 0, export.stderr
        header, every = rows_of(export.stdout)
        assert header["catalog"]["v100-100"]["milli"] == 1000
        rows = {c: r for c, r in every.items() if r["arrival"] + header["origin"] >= float(since)}
        assert set(uid.values()) <= set(rows) and len(rows) == 7  # every claim, no pod name (--history-names)
        # the term may begin after ``since`` (the last module's leader left a gap up to it): nothing of
        # the workload itself may fall in one; arrivals are creationTimestamps, whole seconds, so up to
        # 1 s early
        first = min(r["arrival"] for r in rows.values())
        assert all(b <= first + 1.0 for _, b in header["gaps"]), (header["gaps"], first)
        assert all("name" not in r for r in rows.values())
        ended = [r for r in rows.values() if r.get("ended") == "departed"]
        assert len(ended) == 2 and all(r["duration"] > 0 for r in ended)
        for name in pods[4:]:
            r = rows[uid[name]]
            assert r["admitted"] > r["arrival"] and r["node"] in names  # they waited, then got a card
        assert "admitted" not in rows[uid["quarter"]]

        # a saved pair, then the live extender itself
        (tmp_path / "state.json").write_text(json.dumps(leader.state()))
        (tmp_path / "history.jsonl").write_text(export.stdout)
        saved = gpuslice("simulate", "--from-cluster", str(tmp_path / "state.json"), "--history",
                         str(tmp_path / "history.jsonl"), "--seeds", "1,2", "--arrivals", "trace")
        assert saved.returncode == 0, saved.stderr
        assert "from cluster" in saved.stdout and "4 cards, 4 slices held, 1 waiting" in saved.stdout
        live = gpuslice("simulate", "--from-cluster", leader.url, "--ca", str(gs.tls.ca), "--seeds", "1",
                        "--add-cards", "2", "--json", str(tmp_path / "live.json"))
        assert live.returncode == 0, live.stderr
        assert json.loads((tmp_path / "live.json").read_text())["cards"] == 6
        plan = gpuslice("plan", "--from-cluster", leader.url, "--ca", str(gs.tls.ca), "--target",
                        "v100-25:p99=5m", "--seeds", "1,2", "--json", str(tmp_path / "plan.json"))
        assert plan.returncode == 0, plan.stdout + plan.stderr
        answer = json.loads((tmp_path / "plan.json").read_text())
        assert answer["cards_now"] == 4 and answer["cards_to_add"] >= 0
        untrusted = gpuslice("history", "export", "--url", leader.url)
        assert untrusted.returncode == 1 and "pass --ca" in untrusted.stderr and len(untrusted.stderr.splitlines()) == 1

        # the leader dies; the standby takes over and goes on from the chunks in ConfigMaps
        time.sleep(11)  # one flush period: what the workload did is in the API before the crash
        chunks = kube.request("GET", f"/api/v1/namespaces/{h.SYSTEM_NS}/configmaps",
                              query={"labelSelector": "gpuslice.io/history=chunk"})["items"]
        assert chunks, "the leader wrote no history chunk"
        standby = gs.new_extender("e2e-history-b")
        standby.start()
        try:
            h.poll(standby.answers, 60, "the standby to answer")
            leader.kill()
            standby.wait_ready(60)
            h.delete_now(kube, ns, pods[2])  # recorded by the new leader
            h.poll(lambda: all(a["pod_uid"] != uid[pods[2]] for a in standby.state()["allocations"]) or None, 30,
                   "the new leader to free the deleted pod's card")
            again = gpuslice("history", "export", "--since", since, "--url", standby.url, "--ca", str(gs.tls.ca))
            assert again.returncode == 0, again.stderr
            header2, rows2 = rows_of(again.stdout)
            assert set(rows) <= set(rows2)
            for claim in rows:  # what the first leader recorded, as it recorded it
                assert rows2[claim]["arrival"] + header2["origin"] == pytest.approx(
                    rows[claim]["arrival"] + header["origin"], abs=1e-3)
            assert rows2[uid[pods[2]]]["ended"] == "departed"
        finally:
            standby.stop()  # a clean stop writes its last rows and gives the Lease back
            gs.extenders.remove(standby)
            leader.start()
            leader.wait_ready(60)
        # the first replica leads again (kube-scheduler calls it): it read back what the second recorded
        h.wait_bound(kube, ns, "quarter", timeout=60)

        def quarter_admitted() -> dict[str, dict[str, Any]] | None:
            out = gpuslice("history", "export", "--since", since, "--url", leader.url, "--ca", str(gs.tls.ca))
            if out.returncode != 0:
                return None
            _, found = rows_of(out.stdout)
            return found if found.get(uid["quarter"], {}).get("admitted") is not None else None

        rows3 = h.poll(quarter_admitted, 30, "the quarter's admission in the history")
        assert rows3[uid[pods[2]]]["ended"] == "departed"  # written by the second leader, read by the third term
        for claim, row in rows.items():  # and what the first recorded, kept through both hand-overs
            if claim not in (uid[pods[2]], uid["quarter"]):
                assert rows3[claim].get("ended") == row.get("ended") and rows3[claim]["node"] == row["node"]
    finally:
        h.clear_namespace(kube, ns)
        h.delete_nodes(kube, names)
