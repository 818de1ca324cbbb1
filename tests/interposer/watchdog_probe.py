"""The agent's real memory watchdog over the fake driver, as it runs on a node (no limiter here).

It reads NVML through the agent's own backend (``PynvmlBackend`` over the real ``pynvml`` module,
which loads the fake ``libnvidia-ml.so.1``: per-process memory as the fake driver accounts it,
contexts included) and kills with the agent's ``PidfdKiller``. Every process on the card belongs
to one container holding one ``v100-25`` slice, as in a pod whose container is the only GPU user.

It scans every 10 ms until stdin closes; a line ``report`` on stdin asks for the figures so far.
Each answer is one JSON line: scans, the most memory the slice was seen holding, the kills.
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path
from typing import Any

import pynvml

from enforcement.attribution import ProcessOwner
from enforcement.cgroups import ContainerRef, read_start_time
from enforcement.clock import SystemClock
from enforcement.events import RecordingEventSink
from enforcement.killer import PidfdKiller
from enforcement.nvml import PynvmlBackend
from enforcement.pods import MIB, SliceHolder
from enforcement.watchdog import MemoryWatchdog

PERIOD_S = 0.01


def main() -> int:
    cap_mib = int(sys.argv[1]) if len(sys.argv) > 1 else 8192
    backend = PynvmlBackend(pynvml).open()
    [gpu] = [d.uuid for d in backend.devices()][:1]
    holder = SliceHolder("pod-ollama-uid", "default", "ollama", gpu, "v100-25", cap_mib * MIB, 250)
    container = ContainerRef(holder.pod_uid, "0" * 64, None)

    def owner(pid: int, on_gpu: str) -> ProcessOwner | None:
        start = read_start_time(Path("/proc"), pid)
        if start is None or on_gpu != gpu:
            return None
        return ProcessOwner(holder, pid, start, container, "main")

    dog = MemoryWatchdog(backend, owner, PidfdKiller(), RecordingEventSink(), SystemClock())
    done = threading.Event()
    lock = threading.Lock()
    state: dict[str, Any] = {"scans": 0, "max_used_mib": 0, "kills": []}

    def scan() -> None:
        while not done.wait(PERIOD_S):
            for reading in dog.check([gpu]):
                with lock:
                    state["scans"] += 1
                    for usage in reading.holders.values():
                        state["max_used_mib"] = max(state["max_used_mib"], (usage.used_bytes or 0) // MIB)
                    state["kills"] += [
                        {"pid": k.pid, "process_mib": k.process_bytes // MIB, "holder_mib": k.holder_bytes // MIB}
                        for k in reading.kills
                    ]

    thread = threading.Thread(target=scan, daemon=True)
    thread.start()
    print(json.dumps({"ready": True, "gpu": gpu}), flush=True)
    for line in sys.stdin:
        if line.strip() == "report":
            with lock:
                print(json.dumps(state), flush=True)
    done.set()
    thread.join()
    print(json.dumps(state), flush=True)
    backend.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
