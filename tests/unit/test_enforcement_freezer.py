"""Freezing pod and container cgroups (v2, v1, signals): which cgroup, the ceiling, the journal, the keeper."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from enforcement.cgroups import ContainerRef
from enforcement.freezer import (
    CgroupFreezer,
    CgroupViewError,
    FreezeController,
    FreezeError,
    FreezeJournal,
    FreezeTarget,
    TargetGone,
    ThawGuard,
    target_for,
)

UID = "0e2d6f4e-8b1a-4d7c-9c3b-2f1e5a6b7c8d"
CID = "b7" * 32
OTHER = "c8" * 32
PATH = f"kubepods/burstable/pod{UID}/{CID}"
OTHER_PATH = f"kubepods/burstable/pod{UID}/{OTHER}"


def v2_cgroup(root: Path, rel: str, frozen: bool = False) -> Path:
    d = root / rel
    d.mkdir(parents=True)
    (d / "cgroup.freeze").write_text("1\n" if frozen else "0\n")
    (d / "cgroup.events").write_text(f"populated 1\nfrozen {int(frozen)}\n")
    (d / "cgroup.procs").write_text("")
    return d


def test_v2_freeze_and_thaw_write_cgroup_freeze(tmp_path: Path) -> None:
    d = v2_cgroup(tmp_path, PATH)
    freezer = CgroupFreezer(tmp_path)
    target = FreezeTarget("v2", PATH)
    freezer.set_frozen(target, True)
    assert (d / "cgroup.freeze").read_text().strip() == "1"
    assert freezer.is_frozen(target) is False  # the kernel has not confirmed yet (cgroup.events)
    (d / "cgroup.events").write_text("populated 1\nfrozen 1\n")
    assert freezer.is_frozen(target) is True
    freezer.set_frozen(target, False)
    assert (d / "cgroup.freeze").read_text().strip() == "0"


def test_a_vanished_cgroup_is_gone_and_never_recreated(tmp_path: Path) -> None:
    freezer = CgroupFreezer(tmp_path)
    with pytest.raises(TargetGone):
        freezer.set_frozen(FreezeTarget("v2", PATH), True)
    (tmp_path / PATH).mkdir(parents=True)  # the directory exists but is no cgroup: nothing may be created in it
    with pytest.raises(TargetGone):
        freezer.set_frozen(FreezeTarget("v2", PATH), False)
    assert list((tmp_path / PATH).iterdir()) == []
    assert freezer.is_frozen(FreezeTarget("v2", PATH)) is None


def test_v1_freezer_state(tmp_path: Path) -> None:
    d = tmp_path / "freezer" / PATH
    d.mkdir(parents=True)
    (d / "freezer.state").write_text("THAWED\n")
    freezer = CgroupFreezer(tmp_path)
    target = FreezeTarget("v1", f"freezer/{PATH}")
    freezer.set_frozen(target, True)
    assert (d / "freezer.state").read_text().strip() == "FROZEN"
    assert freezer.is_frozen(target) is True
    freezer.set_frozen(target, False)
    assert (d / "freezer.state").read_text().strip() == "THAWED"


def _state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rfind(")") + 2]


def _wait_state(pid: int, want: set[str], timeout: float = 5.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        state = _state(pid)
        if state in want or time.monotonic() > deadline:
            return state
        time.sleep(0.01)


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) for _ in range(2)]
    yield procs
    for p in procs:
        p.kill()
        p.wait()


def test_signal_fallback_stops_and_continues_only_the_listed_processes(
    tmp_path: Path, sleepers: list[subprocess.Popen[bytes]]
) -> None:
    member, outsider = sleepers
    d = tmp_path / "pids" / PATH
    d.mkdir(parents=True)
    (d / "cgroup.procs").write_text(f"{member.pid}\n")
    freezer = CgroupFreezer(tmp_path)
    target = FreezeTarget("signal", f"pids/{PATH}")
    freezer.set_frozen(target, True)
    assert _wait_state(member.pid, {"T", "t"}) in {"T", "t"}
    assert _state(outsider.pid) in {"S", "R"}
    freezer.set_frozen(target, False)
    assert _wait_state(member.pid, {"S", "R"}) in {"S", "R"}
    (d / "cgroup.procs").unlink()
    with pytest.raises(TargetGone):
        freezer.set_frozen(target, True)


POD_PATH = f"kubepods/burstable/pod{UID}"


def test_target_for_prefers_v2_then_v1_then_signals(tmp_path: Path) -> None:
    """Hybrid host (the runtime drives v1, the container also sits in the unified tree)."""
    ref = ContainerRef(UID, CID, f"/{PATH}", (("freezer", f"/{PATH}"), ("memory", f"/{PATH}")))
    assert target_for(ref, tmp_path) is None  # nothing on disk: the container is gone
    (tmp_path / "memory" / PATH).mkdir(parents=True)
    (tmp_path / "memory" / PATH / "cgroup.procs").write_text("")
    assert target_for(ref, tmp_path) == FreezeTarget("signal", f"memory/{PATH}")
    (tmp_path / "freezer" / PATH).mkdir(parents=True)
    (tmp_path / "freezer" / PATH / "freezer.state").write_text("THAWED")  # runc's own pause switch: never ours
    assert target_for(ref, tmp_path) == FreezeTarget("signal", f"memory/{PATH}")
    (tmp_path / "freezer" / POD_PATH / "freezer.state").write_text("THAWED")
    assert target_for(ref, tmp_path) == FreezeTarget("v1", f"freezer/{POD_PATH}")
    v2_cgroup(tmp_path / "unified", PATH)  # hybrid hosts mount v2 under ./unified; runc never reads it
    assert target_for(ref, tmp_path) == FreezeTarget("v2", f"unified/{PATH}")
    v2_cgroup(tmp_path, PATH)
    assert target_for(ref, tmp_path) == FreezeTarget("v2", PATH)


def test_on_a_v2_only_host_the_pod_cgroup_is_frozen_not_the_runtimes_switch(tmp_path: Path) -> None:
    ref = ContainerRef(UID, CID, f"/{PATH}")
    v2_cgroup(tmp_path, PATH)  # the container's cgroup.freeze is what runc reads as "paused"
    assert target_for(ref, tmp_path) == FreezeTarget("signal", PATH)
    (tmp_path / POD_PATH / "cgroup.freeze").write_text("0\n")
    assert target_for(ref, tmp_path) == FreezeTarget("v2", POD_PATH)


def test_v1_only_host_freezes_the_pod_freezer_cgroup(tmp_path: Path) -> None:
    ref = ContainerRef(UID, CID, None, (("freezer", f"/{PATH}"), ("pids", f"/{PATH}")))
    (tmp_path / "freezer" / PATH).mkdir(parents=True)
    (tmp_path / "freezer" / PATH / "freezer.state").write_text("THAWED")
    (tmp_path / "freezer" / POD_PATH / "freezer.state").write_text("THAWED")
    assert target_for(ref, tmp_path) == FreezeTarget("v1", f"freezer/{POD_PATH}")


@pytest.mark.parametrize(
    "ref",
    [
        ContainerRef(UID, CID, f"/../../{PATH}"),
        ContainerRef(UID, CID, None, (("freezer", f"/../{PATH}"),)),
        ContainerRef(UID, CID, f"/{PATH}", (("memory", f"/../../{PATH}"),)),
    ],
)
def test_a_path_outside_the_cgroup_view_is_refused_not_guessed(tmp_path: Path, ref: ContainerRef) -> None:
    """A private cgroup namespace shows other containers as /../..: nothing under the root is theirs."""
    (tmp_path / "x").mkdir()
    v2_cgroup(tmp_path / "x", PATH)  # what /../.. might resolve to from a deeper root: never used
    with pytest.raises(CgroupViewError, match="outside this agent's cgroup view"):
        target_for(ref, tmp_path / "x" / "kubepods")


def test_journal_round_trip_and_rejects_what_is_not_a_container(tmp_path: Path) -> None:
    journal = FreezeJournal(tmp_path / "run" / "frozen.json")
    assert journal.load() == []
    targets = [FreezeTarget("v2", PATH), FreezeTarget("v1", f"freezer/{OTHER_PATH}")]
    journal.save(targets)
    assert journal.load() == sorted(targets)
    journal.path.write_text(
        '{"frozen": [{"kind": "v2", "path": "system.slice/sshd.service"},'
        f' {{"kind": "v2", "path": "../../{PATH}"}}, {{"kind": "bogus", "path": "{PATH}"}},'
        f' "junk", {{"kind": "signal", "path": "{PATH}"}}]}}'
    )
    assert journal.load() == [FreezeTarget("signal", PATH)]
    journal.path.write_text("{not json")
    assert journal.load() == []


class SpyFreezer(CgroupFreezer):
    """Records each write and what the journal said at that moment; can be told to fail."""

    def __init__(self, root: Path, journal: FreezeJournal) -> None:
        super().__init__(root)
        self.journal = journal
        self.calls: list[tuple[FreezeTarget, bool, list[FreezeTarget]]] = []
        self.fail: set[tuple[FreezeTarget, bool]] = set()

    def set_frozen(self, target: FreezeTarget, frozen: bool) -> None:
        self.calls.append((target, frozen, self.journal.load()))
        if (target, frozen) in self.fail:
            raise FreezeError("injected")
        super().set_frozen(target, frozen)


def test_controller_journals_before_freezing_and_clears_on_thaw(tmp_path: Path) -> None:
    v2_cgroup(tmp_path, PATH)
    v2_cgroup(tmp_path, OTHER_PATH)
    journal = FreezeJournal(tmp_path / "run" / "frozen.json")
    spy = SpyFreezer(tmp_path, journal)
    ctl = FreezeController(spy, journal)
    a, b = FreezeTarget("v2", PATH), FreezeTarget("v2", OTHER_PATH)
    ctl.apply({a})
    target, frozen, on_file = spy.calls[-1]
    assert (target, frozen) == (a, True) and a in on_file
    ctl.apply({b})
    assert ctl.frozen == {b}
    assert (tmp_path / PATH / "cgroup.freeze").read_text().strip() == "0"
    assert (tmp_path / OTHER_PATH / "cgroup.freeze").read_text().strip() == "1"
    assert set(journal.load()) >= {b}
    assert ctl.thaw_all() == set()
    assert ctl.frozen == set() and journal.load() == []
    assert (tmp_path / OTHER_PATH / "cgroup.freeze").read_text().strip() == "0"


def test_a_failed_freeze_is_rolled_back(tmp_path: Path) -> None:
    v2_cgroup(tmp_path, PATH)
    journal = FreezeJournal(tmp_path / "frozen.json")
    spy = SpyFreezer(tmp_path, journal)
    a = FreezeTarget("v2", PATH)
    spy.fail.add((a, True))
    ctl = FreezeController(spy, journal)
    ctl.apply({a})
    assert ctl.frozen == set() and ctl.errors == 1
    assert [(t, f) for t, f, _ in spy.calls] == [(a, True), (a, False)]


def test_recover_thaws_what_a_crashed_run_froze_and_nothing_else(tmp_path: Path) -> None:
    mine = v2_cgroup(tmp_path, PATH)
    foreign = v2_cgroup(tmp_path, OTHER_PATH, frozen=True)  # frozen by someone else (e.g. a paused container)
    journal = FreezeJournal(tmp_path / "frozen.json")
    crashed = FreezeController(CgroupFreezer(tmp_path), journal)
    crashed.apply({FreezeTarget("v2", PATH)})
    assert (mine / "cgroup.freeze").read_text().strip() == "1"
    foreign_mtime = (foreign / "cgroup.freeze").stat().st_mtime_ns
    successor = FreezeController(CgroupFreezer(tmp_path), journal)  # the crashed one never thawed
    assert successor.recover() == [FreezeTarget("v2", PATH)]
    assert (mine / "cgroup.freeze").read_text().strip() == "0"
    assert (foreign / "cgroup.freeze").read_text() == "1\n"
    assert (foreign / "cgroup.freeze").stat().st_mtime_ns == foreign_mtime
    assert journal.load() == []


def test_a_thaw_that_fails_stays_on_file(tmp_path: Path) -> None:
    v2_cgroup(tmp_path, PATH)
    journal = FreezeJournal(tmp_path / "frozen.json")
    spy = SpyFreezer(tmp_path, journal)
    a = FreezeTarget("v2", PATH)
    ctl = FreezeController(spy, journal)
    ctl.apply({a})
    spy.fail.add((a, False))
    assert ctl.thaw_all() == {a}
    assert journal.load() == [a] and ctl.frozen == {a}
    spy.fail.clear()
    assert ctl.thaw_all() == set() and journal.load() == []


def test_thawing_a_container_that_ended_is_not_an_error(tmp_path: Path) -> None:
    d = v2_cgroup(tmp_path, PATH)
    journal = FreezeJournal(tmp_path / "frozen.json")
    ctl = FreezeController(CgroupFreezer(tmp_path), journal)
    ctl.apply({FreezeTarget("v2", PATH)})
    for f in d.iterdir():
        f.unlink()
    d.rmdir()
    assert ctl.thaw_all() == set()
    assert ctl.errors == 0 and journal.load() == []


class Ticks:
    """A hand-driven monotonic clock."""

    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_expire_cuts_a_freeze_at_the_ceiling(tmp_path: Path) -> None:
    v2_cgroup(tmp_path, PATH)
    v2_cgroup(tmp_path, OTHER_PATH)
    clock = Ticks()
    ctl = FreezeController(CgroupFreezer(tmp_path), FreezeJournal(tmp_path / "j"), ceiling_s=0.5, clock=clock)
    a, b = FreezeTarget("v2", PATH), FreezeTarget("v2", OTHER_PATH)
    ctl.apply({a})
    clock.t += 0.3
    ctl.apply({a, b})
    assert ctl.next_expiry() == pytest.approx(100.5)
    clock.t += 0.19
    assert ctl.expire() == []
    clock.t += 0.01
    assert ctl.expire() == [a]  # frozen 0.5 s: cut, whatever the controller wants
    assert (tmp_path / PATH / "cgroup.freeze").read_text().strip() == "0"
    assert ctl.frozen == {b} and ctl.ceiling_thaws == 1
    assert ctl.next_expiry() == pytest.approx(100.8)


def test_the_thaw_guard_thaws_on_its_own_thread(tmp_path: Path) -> None:
    v2_cgroup(tmp_path, PATH)
    ctl = FreezeController(CgroupFreezer(tmp_path), FreezeJournal(tmp_path / "j"), ceiling_s=0.2)
    guard = ThawGuard(ctl).start()
    try:
        started = time.monotonic()
        ctl.apply({FreezeTarget("v2", PATH)})  # and then the control loop never calls again
        while ctl.frozen and time.monotonic() - started < 5:
            time.sleep(0.005)
        assert ctl.frozen == set()
        assert time.monotonic() - started >= 0.2
        assert (tmp_path / PATH / "cgroup.freeze").read_text().strip() == "0"
    finally:
        guard.close()
    with pytest.raises(ValueError, match="ceiling"):
        ThawGuard(FreezeController(CgroupFreezer(tmp_path), FreezeJournal(tmp_path / "j")))


def test_a_cgroup_someone_else_froze_is_left_to_them(tmp_path: Path) -> None:
    d = v2_cgroup(tmp_path, POD_PATH, frozen=True)  # a user's pause at the level we would use
    ctl = FreezeController(CgroupFreezer(tmp_path), FreezeJournal(tmp_path / "j"))
    target = FreezeTarget("v2", POD_PATH)
    ctl.apply({target})
    ctl.apply(set())
    assert (d / "cgroup.freeze").read_text().strip() == "1"  # not thawed by us: it was never ours
    assert ctl.frozen == set() and ctl.foreign == {target}
    (d / "cgroup.freeze").write_text("0\n")  # they resumed it: now we may pace it
    ctl.apply({target})
    assert ctl.frozen == {target} and ctl.foreign == set()


def test_v1_self_freezing_tells_our_freeze_from_an_inherited_one(tmp_path: Path) -> None:
    d = tmp_path / "freezer" / POD_PATH
    d.mkdir(parents=True)
    (d / "freezer.state").write_text("FROZEN\n")
    (d / "freezer.self_freezing").write_text("0\n")  # frozen through its parent, not by anyone's write
    freezer = CgroupFreezer(tmp_path)
    target = FreezeTarget("v1", f"freezer/{POD_PATH}")
    assert freezer.self_frozen(target) is False
    (d / "freezer.self_freezing").write_text("1\n")
    assert freezer.self_frozen(target) is True


def test_journal_keeps_pod_cgroups_too(tmp_path: Path) -> None:
    journal = FreezeJournal(tmp_path / "frozen.json")
    journal.save([FreezeTarget("v2", POD_PATH), FreezeTarget("v1", f"freezer/{POD_PATH}")])
    assert journal.load() == [FreezeTarget("v1", f"freezer/{POD_PATH}"), FreezeTarget("v2", POD_PATH)]
    journal.path.write_text('{"frozen": [{"kind": "v2", "path": "kubepods/burstable"}]}')
    assert journal.load() == []  # a QoS level is nobody's pod


def test_the_keeper_thaws_the_journal_once_the_agent_is_gone(tmp_path: Path) -> None:
    d = v2_cgroup(tmp_path / "cgroup", PATH)
    journal = FreezeJournal(tmp_path / "run" / "frozen.json")
    FreezeController(CgroupFreezer(tmp_path / "cgroup"), journal).apply({FreezeTarget("v2", PATH)})
    agent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    argv = ["--watch", str(agent.pid), "--journal", str(journal.path), "--cgroup-root", str(tmp_path / "cgroup")]
    keeper = subprocess.Popen([sys.executable, "-m", "enforcement.keeper", *argv], stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(0.5)
        keeper.send_signal(signal.SIGTERM)  # ignored: it leaves with the agent, never before
        time.sleep(0.2)
        assert keeper.poll() is None and (d / "cgroup.freeze").read_text().strip() == "1"
        agent.kill()
        agent.wait()
        assert keeper.wait(10) == 0
    finally:
        agent.kill()
        keeper.kill()
    assert (d / "cgroup.freeze").read_text().strip() == "0"
    assert journal.load() == []
    assert "the agent is gone: thawed" in (keeper.stderr.read() if keeper.stderr else "")
