"""The real-node suites' janitor: what a killed run left is undone by the next one, and nothing else."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e_node import janitor


@pytest.fixture
def records(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    where = tmp_path / "records"
    monkeypatch.setattr(janitor, "RECORDS", where)
    monkeypatch.delenv(janitor.TAG, raising=False)  # the run tag a Record sets goes with the test
    return where


@pytest.fixture
def children() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
        p.wait(10)


def _dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def _gone(pid: int) -> bool:
    stat = Path(f"/proc/{pid}/stat")
    return not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")


def test_a_killed_runs_processes_and_paths_are_undone_and_a_live_runs_are_kept(
        records: Path, tmp_path: Path, children: list[subprocess.Popen[bytes]]) -> None:
    tag = "123-deadbeef"
    env = {**os.environ, janitor.TAG: tag}
    # a process of the killed run with a child of its own (as a shim and its container), and one not of the run
    theirs = subprocess.Popen(["sh", "-c", "sleep 60 & exec sleep 61"], env=env)
    other = subprocess.Popen(["sleep", "62"])
    children += [theirs, other]
    time.sleep(0.3)
    grandchild = [int(p) for p in Path(f"/proc/{theirs.pid}/task/{theirs.pid}/children").read_text().split()]
    root, made = tmp_path / "gpuslice-node-x", tmp_path / "var" / "lib" / "made"
    (root / "containerd").mkdir(parents=True)
    made.mkdir(parents=True)
    records.mkdir()
    (records / "dead.json").write_text(json.dumps({
        "what": "real node e2e-node", "owner": _dead_pid(), "owner_start": "1", "tag": tag, "started": "then",
        "roots": [str(root)], "made": [str(tmp_path / "var")]}))
    live = janitor.Record("a live run")  # this process: alive, so its record stays
    live.add("made", tmp_path / "kept")
    (tmp_path / "kept").mkdir()

    janitor.sweep_left("test")

    assert _gone(theirs.pid) and all(_gone(p) for p in grandchild)
    assert other.poll() is None  # not the run's: untouched
    assert not root.exists() and not (tmp_path / "var").exists()
    assert not (records / "dead.json").exists()
    assert live.path.exists() and (tmp_path / "kept").exists()
    live.close()
    assert not live.path.exists() and not (tmp_path / "kept").exists()


def test_made_if_missing_names_what_creating_the_path_creates(records: Path, tmp_path: Path) -> None:
    (tmp_path / "there").mkdir()
    r = janitor.Record("paths")
    r.made_if_missing(tmp_path / "there", tmp_path / "there" / "a" / "b", tmp_path / "new" / "c")
    assert r.data["made"] == [str(tmp_path / "new"), str(tmp_path / "there" / "a")]
    assert json.loads(r.path.read_text())["made"] == r.data["made"]  # on disk before anything is made
    r.close()


def test_a_record_half_written_is_dropped(records: Path) -> None:
    records.mkdir()
    (records / "torn.json").write_text('{"what": "real no')
    janitor.sweep_left("test")
    assert list(records.iterdir()) == []
