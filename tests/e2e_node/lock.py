"""One real node per machine: the suites that start a kubelet hold ``/tmp/gpuslice-realnode.lock``.

The kubelet's device manager serves at the fixed ``/var/lib/kubelet/device-plugins`` and the install
suite uses the host's standard paths, so two such suites at once would break each other. Each takes
the lock for its session (``flock(2)``, the lock ``flock(1)`` takes), waiting for the other; run
already under ``flock /tmp/gpuslice-realnode.lock ...``, it sees that an ancestor process holds the
lock and goes on, rather than waiting for itself. Holding it, a run first undoes what an interrupted
run left (``janitor.sweep_left``), and from then on SIGTERM and SIGHUP stop it as Ctrl-C does, its
fixtures torn down.
"""

from __future__ import annotations

import fcntl
import os
import sys
import time
from pathlib import Path
from typing import IO

from .janitor import interrupt_on_signals, run_tag, sweep_left

LOCK = Path("/tmp/gpuslice-realnode.lock")


def _holders(path: Path) -> set[int]:
    """PIDs holding a flock on ``path`` (from /proc/locks)."""
    inode = os.stat(path).st_ino
    pids = set()
    for line in Path("/proc/locks").read_text().splitlines():
        parts = line.split()
        if len(parts) > 5 and parts[1] == "FLOCK" and parts[5].rsplit(":", 1)[-1] == str(inode):
            pids.add(int(parts[4]))
    return pids


def _ancestors() -> set[int]:
    pids, pid = set(), os.getpid()
    while pid > 1:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            break
        pid = int(stat.rsplit(")", 1)[1].split()[1])
        pids.add(pid)
    return pids


def hold(what: str) -> IO[str] | None:
    """Take the lock for this process (None where an ancestor holds it already; it lasts while the file stays
    open), undo what interrupted runs left, and let SIGTERM stop this run cleanly."""
    f = _take(what)
    run_tag()  # every process this run starts from now on carries it: a killed run's are found by it
    sweep_left(what)
    interrupt_on_signals()
    return f


def _take(what: str) -> IO[str] | None:
    f = open(LOCK, "a")  # noqa: SIM115 - held for the session
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return f
    except BlockingIOError:
        pass
    if _holders(LOCK) & _ancestors():
        f.close()
        return None
    print(f"[{what}] waiting for {LOCK}: another real-node suite runs", file=sys.stderr)
    started = time.monotonic()
    fcntl.flock(f, fcntl.LOCK_EX)
    print(f"[{what}] got {LOCK} after {time.monotonic() - started:.0f} s", file=sys.stderr)
    return f
