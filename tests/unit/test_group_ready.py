"""Which bound pod groups are late (not every member Running in time), and what their pods say."""

from __future__ import annotations

from typing import Any

import pytest

from packing.group_ready import BoundGroup, MemberStatus, late_groups, member_status

TIMEOUT = 300.0


def group(label: str, admitted_at: float, *phases: str) -> BoundGroup:
    return BoundGroup(label, admitted_at, tuple(MemberStatus(f"{label}-{i}", p) for i, p in enumerate(phases)))


@pytest.mark.parametrize(("phases", "admitted_at", "now", "late"), [
    (("Running", "Running"), 0.0, 1000.0, None),  # all Running: never late
    (("Running", "Succeeded"), 0.0, 1000.0, None),  # one done already: the group ran
    (("Running", "Pending"), 0.0, 299.9, None),  # before the timeout: not yet
    (("Running", "Pending"), 0.0, 300.0, ("g-1",)),  # at the timeout: late
    (("Pending", "Pending"), 100.0, 450.0, ("g-0", "g-1")),  # counted from admission, not from 0
    (("Pending", "Pending"), 100.0, 399.0, None),
    (("Running", ""), 0.0, 301.0, ("g-1",)),  # no phase yet (the kubelet has not reported): not Running
    (("Running", "Failed"), 0.0, 301.0, ("g-1",)),
    (("Unknown", "Running"), 0.0, 301.0, ("g-0",)),
])
def test_late_groups_table(phases: tuple[str, ...], admitted_at: float, now: float,
                           late: tuple[str, ...] | None) -> None:
    got = late_groups([group("g", admitted_at, *phases)], now, TIMEOUT)
    if late is None:
        assert got == []
    else:
        assert len(got) == 1
        assert tuple(m.name for m in got[0].late) == late
        assert got[0].waited == now - admitted_at


def test_only_late_groups_in_the_order_given() -> None:
    groups = [group("a", 0.0, "Pending"), group("b", 0.0, "Running"), group("c", 200.0, "Pending"),
              group("d", 10.0, "Running", "Pending")]
    assert [g.group.label for g in late_groups(groups, 400.0, TIMEOUT)] == ["a", "d"]


def test_message_names_the_late_members_and_why() -> None:
    g = BoundGroup("ns/train", 0.0, (MemberStatus("w-0", "Running"),
                                     MemberStatus("w-1", "Pending", "container main waiting ImagePullBackOff")))
    (late,) = late_groups([g], 301.0, TIMEOUT)
    assert late.message() == ("pod group ns/train: 1 of 2 members not Running 301 s after the group was admitted: "
                              "w-1 (Pending: container main waiting ImagePullBackOff)")


def pod(phase: str, **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p"}, "status": {"phase": phase, **status}}


@pytest.mark.parametrize(("p", "why"), [
    (pod("Running"), ""),
    (pod("Pending"), ""),
    ({"metadata": {"name": "p"}}, ""),
    (pod("Pending", containerStatuses=[{"name": "main", "state": {"waiting": {
        "reason": "ImagePullBackOff", "message": 'Back-off pulling image "x"'}}}]),
     'container main waiting ImagePullBackOff: Back-off pulling image "x"'),
    (pod("Pending", initContainerStatuses=[{"name": "init", "state": {"terminated": {"reason": "Completed",
                                                                                    "exitCode": 0}}}],
         containerStatuses=[{"name": "main", "state": {"waiting": {"reason": "CreateContainerConfigError"}}}]),
     "container main waiting CreateContainerConfigError"),
    (pod("Pending", initContainerStatuses=[{"name": "init", "state": {"terminated": {"reason": "Error",
                                                                                    "exitCode": 1}}}]),
     "container init terminated Error"),
    (pod("Failed", reason="OutOfgpu", message="Pod was rejected"), "pod OutOfgpu: Pod was rejected"),
    (pod("Pending", conditions=[{"type": "PodScheduled", "status": "True"},
                                {"type": "Ready", "status": "False", "reason": "ContainersNotReady"}]),
     "condition Ready ContainersNotReady"),
    (pod("Pending", containerStatuses=[{"name": "m", "state": {"waiting": {"reason": "ErrImagePull",
                                                                           "message": "x" * 500}}}]),
     "container m waiting ErrImagePull: " + "x" * 160 + "..."),
])
def test_member_status_says_why(p: dict[str, Any], why: str) -> None:
    s = member_status(p)
    assert s.why == why
    assert s.phase == (p.get("status") or {}).get("phase", "")
