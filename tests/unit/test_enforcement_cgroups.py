"""PID -> pod container: the /proc/<pid>/cgroup parser over every path form, and the resolver's cache."""

from __future__ import annotations

from pathlib import Path

import pytest

from enforcement.cgroups import CgroupResolver, canonical_uid, container_in_path, parse_cgroup, parse_start_time

UID = "0e2d6f4e-8b1a-4d7c-9c3b-2f1e5a6b7c8d"
UID_ = UID.replace("-", "_")
STATIC = "6a8d1c0f3b2e4d5a9c7b8e1f2a3d4c5b"  # a static pod's UID is a 32-hex config hash
CID = "a3f1" * 16
SD = "/kubepods.slice"


def sd_pod(qos: str | None, uid: str = UID_) -> str:
    """The systemd driver's pod cgroup for a QoS class (None: Guaranteed, no QoS level)."""
    if qos is None:
        return f"{SD}/kubepods-pod{uid}.slice"
    return f"{SD}/kubepods-{qos}.slice/kubepods-{qos}-pod{uid}.slice"


def fs_pod(qos: str | None) -> str:
    """The cgroupfs driver's pod cgroup."""
    return f"/kubepods/pod{UID}" if qos is None else f"/kubepods/{qos}/pod{UID}"


# (case, /proc/<pid>/cgroup text, expected pod uid, expected unified container path, expected v1 freezer path)
V2_CASES = [
    (
        "systemd containerd burstable",
        f"0::{sd_pod('burstable')}/cri-containerd-{CID}.scope",
        UID,
        f"{sd_pod('burstable')}/cri-containerd-{CID}.scope",
    ),
    (
        "systemd containerd besteffort",
        f"0::{sd_pod('besteffort')}/cri-containerd-{CID}.scope",
        UID,
        f"{sd_pod('besteffort')}/cri-containerd-{CID}.scope",
    ),
    (
        "systemd containerd guaranteed",
        f"0::{sd_pod(None)}/cri-containerd-{CID}.scope",
        UID,
        f"{sd_pod(None)}/cri-containerd-{CID}.scope",
    ),
    ("systemd CRI-O", f"0::{sd_pod('burstable')}/crio-{CID}.scope", UID, f"{sd_pod('burstable')}/crio-{CID}.scope"),
    (
        "systemd CRI-O nested container cgroup",
        f"0::{sd_pod('besteffort')}/crio-{CID}.scope/container",
        UID,
        f"{sd_pod('besteffort')}/crio-{CID}.scope",
    ),
    (
        "systemd cri-dockerd",
        f"0::{sd_pod('burstable')}/docker-{CID}.scope",
        UID,
        f"{sd_pod('burstable')}/docker-{CID}.scope",
    ),
    ("cgroupfs containerd burstable", f"0::{fs_pod('burstable')}/{CID}", UID, f"{fs_pod('burstable')}/{CID}"),
    ("cgroupfs containerd besteffort", f"0::{fs_pod('besteffort')}/{CID}", UID, f"{fs_pod('besteffort')}/{CID}"),
    ("cgroupfs guaranteed", f"0::{fs_pod(None)}/{CID}", UID, f"{fs_pod(None)}/{CID}"),
    ("cgroupfs CRI-O", f"0::{fs_pod('burstable')}/crio-{CID}", UID, f"{fs_pod('burstable')}/crio-{CID}"),
    (
        "deeper levels are cut off",
        f"0::{fs_pod('burstable')}/{CID}/init.scope/sub",
        UID,
        f"{fs_pod('burstable')}/{CID}",
    ),
    (
        "kind node (nested kubelet slices)",
        f"0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
        f"kubelet-kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope",
        UID,
        f"/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/"
        f"kubelet-kubepods-besteffort-pod{UID_}.slice/cri-containerd-{CID}.scope",
    ),
    (
        "static pod (32-hex uid)",
        f"0::{sd_pod('burstable', STATIC)}/cri-containerd-{CID}.scope",
        STATIC,
        f"{sd_pod('burstable', STATIC)}/cri-containerd-{CID}.scope",
    ),
]


@pytest.mark.parametrize(("case", "text", "uid", "unified"), V2_CASES, ids=[c[0] for c in V2_CASES])
def test_v2_path_forms(case: str, text: str, uid: str, unified: str) -> None:
    ref = parse_cgroup(text + "\n")
    assert ref is not None, case
    assert (ref.pod_uid, ref.container_id, ref.unified) == (uid, CID, unified)


V1_SYSTEMD = "\n".join(
    [
        f"12:freezer:{sd_pod('burstable')}/cri-containerd-{CID}.scope",
        f"11:memory:{sd_pod('burstable')}/cri-containerd-{CID}.scope",
        f"4:cpu,cpuacct:{sd_pod('burstable')}/cri-containerd-{CID}.scope",
        f"3:pids:{sd_pod('burstable')}/cri-containerd-{CID}.scope",
        f"1:name=systemd:{sd_pod('burstable')}/cri-containerd-{CID}.scope",
    ]
)
V1_CGROUPFS = "\n".join(
    [f"{i}:{c}:{fs_pod('besteffort')}/{CID}" for i, c in enumerate(["memory", "freezer", "pids", "devices"], 2)]
    + ["1:name=systemd:/system.slice/containerd.service"]
)
HYBRID = V1_CGROUPFS + "\n0::/system.slice/containerd.service"


@pytest.mark.parametrize(
    ("case", "text", "freezer"),
    [
        ("v1 systemd driver", V1_SYSTEMD, f"{sd_pod('burstable')}/cri-containerd-{CID}.scope"),
        ("v1 cgroupfs driver", V1_CGROUPFS, f"{fs_pod('besteffort')}/{CID}"),
        ("hybrid: the v2 line names no container", HYBRID, f"{fs_pod('besteffort')}/{CID}"),
    ],
)
def test_v1_and_hybrid_forms(case: str, text: str, freezer: str) -> None:
    ref = parse_cgroup(text)
    assert ref is not None, case
    assert (ref.pod_uid, ref.container_id, ref.unified) == (UID, CID, None)
    assert ref.v1_path("freezer") == freezer
    assert ref.v1_path("memory") == freezer
    assert ref.v1_path("blkio") is None


def test_v1_lines_of_other_cgroups_are_not_listed() -> None:
    ref = parse_cgroup(V1_CGROUPFS)
    assert ref is not None
    assert ref.v1_path("name=systemd") is None  # that hierarchy holds the runtime's service, not the container


@pytest.mark.parametrize(
    ("case", "text"),
    [
        ("CRI-O's conmon is not the container", f"0::{sd_pod('burstable')}/crio-conmon-{CID}.scope"),
        ("a host service", "0::/system.slice/sshd.service"),
        ("docker outside Kubernetes", f"0::/system.slice/docker-{CID}.scope"),
        ("the pod-level cgroup itself", f"0::{sd_pod('burstable')}"),
        ("a short container id", f"0::{sd_pod('burstable')}/cri-containerd-abc123.scope"),
        ("the root cgroup", "0::/"),
        ("empty", ""),
        ("garbage", "not a cgroup file\n:::\n"),
        ("pod uid with a wrong shape", f"0::/kubepods/burstable/pod{UID[:-1]}/{CID}"),
        ("v1 host process", "4:memory:/user.slice\n1:name=systemd:/user.slice/user-0.slice"),
    ],
)
def test_not_a_pod_container(case: str, text: str) -> None:
    assert parse_cgroup(text) is None, case


def test_container_in_path_and_canonical_uid() -> None:
    found = container_in_path(f"{sd_pod('burstable')}/cri-containerd-{CID}.scope")
    assert found == (UID, CID, f"{sd_pod('burstable')}/cri-containerd-{CID}.scope")
    assert canonical_uid(UID_.upper()) == UID


@pytest.mark.parametrize(
    ("stat", "start"),
    [
        ("123 (python3) S 1 123 123 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 98765 0 0", 98765),
        ("9 (a) b (c)) R 1 9 9 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 4242 0", 4242),  # ')' and spaces in comm
        ("9 (x) R 1", None),
        ("no parens", None),
        ("9 (x) R 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 notanumber", None),
    ],
)
def test_parse_start_time(stat: str, start: int | None) -> None:
    assert parse_start_time(stat) == start


def write_proc(root: Path, pid: int, start: int, cgroup: str) -> None:
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "stat").write_text(f"{pid} (worker) S 1 {pid} {pid} " + "0 " * 15 + f"{start} 0 0\n")
    (d / "cgroup").write_text(cgroup + "\n")


def test_resolver_caches_by_pid_and_start_time(tmp_path: Path) -> None:
    write_proc(tmp_path, 100, 5000, f"0::{fs_pod('burstable')}/{CID}")
    resolver = CgroupResolver(tmp_path)
    first = resolver.lookup(100)
    assert first is not None and first.container is not None
    assert (first.pid, first.start_time, first.container.pod_uid) == (100, 5000, UID)
    assert resolver.lookup(100) == first
    assert resolver.reads == 1  # the cgroup file was read once; only the start time is re-checked


def test_resolver_is_not_fooled_by_pid_reuse(tmp_path: Path) -> None:
    write_proc(tmp_path, 100, 5000, f"0::{fs_pod('burstable')}/{CID}")
    resolver = CgroupResolver(tmp_path)
    assert resolver.lookup(100) is not None
    write_proc(tmp_path, 100, 7777, "0::/system.slice/cron.service")  # PID 100 now names another process
    reused = resolver.lookup(100)
    assert reused is not None
    assert (reused.start_time, reused.container) == (7777, None)


def test_resolver_gone_process_and_retain(tmp_path: Path) -> None:
    resolver = CgroupResolver(tmp_path)
    assert resolver.lookup(42) is None
    write_proc(tmp_path, 42, 10, f"0::{fs_pod(None)}/{CID}")
    assert resolver.lookup(42) is not None
    resolver.retain(set())
    reads = resolver.reads
    assert resolver.lookup(42) is not None
    assert resolver.reads == reads + 1  # forgotten by retain(), so read again
