"""The thaw keeper: a small process beside the agent that thaws what the agent froze if it dies first.

``kill -9``, a crash inside the NVML library, the OOM killer: no handler of the agent runs then,
and its :class:`~enforcement.freezer.ThawGuard` dies with it. The agent starts the keeper right
after it has recovered the journal (``python -m enforcement.keeper --watch <agent pid> ...``). The
keeper waits on a pidfd of the agent; once the agent is gone, it thaws every target the journal
lists (the journal is written before each freeze, so it covers all of them) and exits. It imports
only the freezer (no NVML, no Kubernetes client) and ignores SIGINT/SIGTERM: it leaves when the
agent does, never before.

Not covered: the agent's whole container being killed at once (the kubelet's SIGKILL after the
grace period, a container-level OOM kill) takes the keeper too; then the next agent start thaws,
as recovering the journal is the first thing it does.
"""

from __future__ import annotations

import argparse
import logging
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from enforcement.freezer import CgroupFreezer, FreezeController, FreezeJournal

log = logging.getLogger("gpuslice.keeper")


def wait_for_exit(pid: int, poll_s: float = 0.1) -> None:
    """Return once process ``pid`` has exited (pidfd where the kernel has one, else polling)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except OSError:
        while True:  # no pidfd (Linux < 5.3): the parent is gone once we are re-parented
            if os.getppid() != pid:
                return
            time.sleep(poll_s)
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        while not poller.poll():
            pass
    finally:
        os.close(fd)


def thaw_journal(journal: Path, cgroup_root: Path) -> int:
    """Thaw everything ``journal`` lists; returns how many targets could not be thawed."""
    controller = FreezeController(CgroupFreezer(cgroup_root), FreezeJournal(journal))
    thawed = controller.recover()
    stuck = controller.frozen
    if thawed:
        log.warning("the agent is gone: thawed %s", ", ".join(t.path for t in thawed))
    for target in sorted(stuck):
        log.error("the agent is gone and %s could not be thawed (the next agent start retries)", target.path)
    return len(stuck)


def spawn(journal: Path, cgroup_root: Path) -> subprocess.Popen[bytes]:
    """Start a keeper for this process."""
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "enforcement.keeper",
            "--watch",
            str(os.getpid()),
            "--journal",
            str(journal),
            "--cgroup-root",
            str(cgroup_root),
        ],
        stdin=subprocess.DEVNULL,
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m enforcement.keeper", description=__doc__.splitlines()[0])
    p.add_argument("--watch", type=int, required=True, help="PID of the agent to outlive")
    p.add_argument("--journal", type=Path, required=True, help="the agent's freeze journal")
    p.add_argument("--cgroup-root", type=Path, default=Path("/sys/fs/cgroup"))
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the agent thaws on these itself; we wait for it to go
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    wait_for_exit(args.watch)
    return 1 if thaw_journal(args.journal, args.cgroup_root) else 0


if __name__ == "__main__":
    sys.exit(main())
