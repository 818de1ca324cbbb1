"""Killing one exact process: by pidfd, after checking it is still the process we judged.

A PID is only a name; between the NVML reading and the kill, the process may have exited and its
PID been handed to another. So the killer opens a pidfd first (which pins that process), then
re-reads the start time from ``/proc``: equal means the pidfd refers to the process we measured.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Protocol

from enforcement.cgroups import read_start_time


class Killer(Protocol):
    """Sends the fatal signal to ``pid`` only if it is still the process that started at ``start_time``."""

    def kill(self, pid: int, start_time: int) -> bool: ...


class PidfdKiller:
    """SIGKILL through ``pidfd_send_signal``; falls back to ``kill(2)`` where pidfds are missing."""

    def __init__(self, proc_root: Path = Path("/proc"), sig: signal.Signals = signal.SIGKILL) -> None:
        self.proc_root = proc_root
        self.sig = sig

    def kill(self, pid: int, start_time: int) -> bool:
        """True when the signal went to that very process; False when it is gone or was replaced."""
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
