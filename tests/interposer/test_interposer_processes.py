"""One budget per container, shared by its processes, crash-safe: a process that dies without
freeing gives its share back, whoever holds its PID next."""

from __future__ import annotations

import fcntl
import os
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from enforcement.cgroups import read_start_time
from tests.interposer.conftest import CAP_MIB, CONTEXT_MIB, SOURCES, Node, assert_clean, field_of, lines

MIB = 1 << 20


def _hold(node: Node, mib: int) -> subprocess.Popen[str]:
    holder = node.spawn([str(node.build.client), "hold", str(mib)], node.env())
    first = holder.stdout.readline() if holder.stdout else ""
    assert f"held rc 0 mib {mib}" in first, first + (holder.stderr.read() if holder.stderr else "")
    return holder


def _try(node: Node, mib: int) -> int:
    out = node.client("hold", str(mib), env=node.env())
    return int(field_of(lines(out, "held")[0], "rc"))


def _used(node: Node) -> int:
    return int(field_of(lines(node.client("nvml"), "nvml 0")[0], "used_mib"))


def test_two_processes_share_one_budget(node: Node) -> None:
    a = _hold(node, 5000)
    try:
        assert _used(node) == 5000 + CONTEXT_MIB
        # 5000 + 768 + (768 + 3000) > 8192: the second process's own context counts too
        assert _try(node, 3000) == 2
        assert _try(node, 1500) == 0
    finally:
        a.communicate("", timeout=30)
    assert a.returncode == 0
    assert _used(node) == 0
    assert _try(node, 7000) == 0


def test_sigkill_returns_the_share(node: Node) -> None:
    a = _hold(node, 5000)
    assert _try(node, 3000) == 2
    a.kill()
    a.wait(timeout=30)
    assert a.returncode == -signal.SIGKILL
    assert _used(node) == 0  # the next reader swept the dead process's slot
    assert _try(node, 3000) == 0


def test_a_zombie_holds_nothing(node: Node) -> None:
    """Killed but not yet reaped by its parent: its memory is gone, so is its share."""
    a = _hold(node, 5000)
    assert _try(node, 3000) == 2
    os.kill(a.pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while (Path(f"/proc/{a.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]) != "Z":
        assert time.monotonic() < deadline, "the holder did not become a zombie"
        time.sleep(0.01)
    try:
        assert _try(node, 3000) == 0
    finally:
        a.wait(timeout=30)


# The ledger's layout (ledger.c): magic, version, devices, 16 UUIDs, then 128 slots of
# pid, attached mask, start time, bytes per device (16).
HEADER = struct.Struct("=8sII256s")
SLOT = struct.Struct("=iIQ16Q")
FAKE_UUID_0 = bytes([0x5A, 0x1E, 0xC0, 0xDE, 0, 0, 0x4C, 0x0F, 0x9D, 0, 0, 0, 0, 0, 0, 0xA0])  # card.c


def _plant_slot(node: Node, pid: int, start_time: int, mib: int) -> int:
    """A slot as a process that allocated ``mib`` and never freed it would have left; its byte
    offset (the byte its owner holds locked while it lives)."""
    node.state_dir.mkdir(exist_ok=True)
    node.client("totals")  # creates the ledger and names device 0
    path = node.state_dir / "gpuslice-ledger.v1"
    data = bytearray(path.read_bytes())
    magic, version, devices, uuids = HEADER.unpack_from(data)
    assert (magic, version, devices, uuids[:16]) == (b"GPUSLICE", 1, 1, FAKE_UUID_0)
    free_slot = next(i for i in range(128) if SLOT.unpack_from(data, HEADER.size + i * SLOT.size)[0] == 0)
    offset = HEADER.size + free_slot * SLOT.size
    SLOT.pack_into(data, offset, pid, 1, start_time, mib * MIB, *([0] * 15))
    path.write_bytes(bytes(data))
    return offset


def test_a_slot_nobody_holds_is_taken_back(node: Node) -> None:
    """Liveness is the slot's lock, not its PID: this one names a live process (this one, with
    its true start time) but no process holds it, as after its owner died and its PID was reused."""
    me = os.getpid()
    _plant_slot(node, me, read_start_time(Path("/proc"), me) or 0, 7000)
    assert _try(node, 3000) == 0


def test_a_slot_its_owner_holds_is_kept(node: Node) -> None:
    """The control: the same slot, its byte locked as a live owner keeps it, counts."""
    me = os.getpid()
    offset = _plant_slot(node, me, read_start_time(Path("/proc"), me) or 0, 7000)
    with open(node.state_dir / "gpuslice-ledger.v1", "r+b") as ledger:
        lock = struct.pack("hhqqi4x", fcntl.F_WRLCK, os.SEEK_SET, offset, 1, 0)
        fcntl.fcntl(ledger.fileno(), fcntl.F_OFD_SETLK, lock)
        assert _try(node, 3000) == 2
        assert _used(node) == 7000
    assert _try(node, 3000) == 0  # its owner is gone (the lock went with the descriptor)


def test_containers_in_other_pid_namespaces_share_one_ledger(node: Node) -> None:
    """The containers of a pod share a slice and may share its state directory, each in its own
    PID namespace: a PID means nothing across them, the slot lock does."""
    if subprocess.run(["unshare", "-p", "-f", "true"], capture_output=True).returncode != 0:
        pytest.skip("no permission to create a PID namespace here")
    pid_namespace = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child"]
    a = node.spawn([*pid_namespace, str(node.build.client), "hold", "5000"], node.env())
    try:
        first = a.stdout.readline() if a.stdout else ""
        assert "held rc 0" in first, first + (a.stderr.read() if a.stderr else "")
        assert _try(node, 3000) == 2  # alive, whatever its PID says here
        assert _used(node) == 5000 + CONTEXT_MIB
    finally:
        a.kill()
        a.wait(timeout=30)
    deadline = time.monotonic() + 10
    while _used(node) != 0:  # --kill-child: the holder dies with unshare
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert _try(node, 3000) == 0


FORK = r"""
import ctypes, os, sys
sys.path.insert(0, sys.argv[1])
from check_client import Cuda
cuda = Cuda(); cuda.open(0)
assert cuda.alloc(2048) == 0
pid = os.fork()
if pid == 0:
    # a forked child is a process of its own: its own slot, its own context reserve
    child = Cuda(); child.open(0)
    code = child.alloc(2048)
    os._exit(10 + code)
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status) - 10)
print("after_child_exit", cuda.info()["free_mib"])
print("big", cuda.alloc(4096))
"""


def test_a_forked_child_is_accounted_as_its_own_process(node: Node) -> None:
    """Parent 2048 + context, child 2048 + its context: both fit; once the child exits its
    share is gone, so 4096 more fit the parent (they would not if the child's bytes had been
    added to the parent's slot)."""
    done = subprocess.run([sys.executable, "-c", FORK, str(SOURCES)], env=node.env(python=True), capture_output=True,
                          text=True, timeout=60)
    assert_clean(done.stderr)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    values = dict(line.split() for line in out.splitlines())
    assert values == {"child": "0", "after_child_exit": str(CAP_MIB - CONTEXT_MIB - 2048), "big": "0"}
