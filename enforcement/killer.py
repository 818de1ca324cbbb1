"""Killing one exact process: the very process we judged, never whoever holds its PID now.

A PID is only a name; between the NVML reading and the kill, the process may have exited and its
PID been handed to another. Where the resolver pinned the process by a pidfd when it identified it
(``cgroups.CgroupResolver``), the signal goes through that pidfd: it reaches that process or, if it
has exited, nobody, so check and kill are one step. Without one, the killer opens a pidfd itself and
re-reads the start time from ``/proc``; that check resolves one clock tick (10 ms), so a PID reused
within the same tick would pass it: the fallback only for kernels or callers without a pinned pidfd.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Protocol

from enforcement.cgroups import read_start_time


class Killer(Protocol):
    """Sends the fatal signal to the process that started at ``start_time`` as ``pid`` (pinned by
    ``pidfd`` when given), and to nobody else."""

    def kill(self, pid: int, start_time: int, pidfd: int | None = None) -> bool: ...


class PidfdKiller:
    """SIGKILL through ``pidfd_send_signal``; falls back to ``kill(2)`` where pidfds are missing."""

    def __init__(self, proc_root: Path = Path("/proc"), sig: signal.Signals = signal.SIGKILL) -> None:
        self.proc_root = proc_root
        self.sig = sig

    def kill(self, pid: int, start_time: int, pidfd: int | None = None) -> bool:
        """True when the signal went to that very process; False when it is gone or was replaced.

        ``pidfd`` is borrowed (its owner closes it).
        """
        if pidfd is not None:
            try:
                signal.pidfd_send_signal(pidfd, self.sig)
            except ProcessLookupError:
                return False  # it has exited: whoever has its PID now is not ours to kill
            return True
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            return False
        except OSError:
            fd = -1  # no pidfd support (kernel < 5.3): check, then kill(2) with a tiny race left
        try:
            if read_start_time(self.proc_root, pid) != start_time:
                return False
            if fd >= 0:
                signal.pidfd_send_signal(fd, self.sig)
            else:
                os.kill(pid, self.sig)
            return True
        except ProcessLookupError:
            return False
        finally:
            if fd >= 0:
                os.close(fd)
