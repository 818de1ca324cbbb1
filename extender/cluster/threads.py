"""Start and stop the cluster layer's background loops (gate, reporter, informers, leader election, resync)."""

from __future__ import annotations

import threading
from collections.abc import Callable


def start_daemon(target: Callable[[], None], name: str) -> threading.Thread:
    """Run ``target`` in a started daemon thread (a loop must not keep the process alive at exit)."""
    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    return thread


def join(thread: threading.Thread | None, timeout: float) -> None:
    """Wait up to ``timeout`` for ``thread`` to end; a loop stopped from its own thread does not wait on itself."""
    if thread is not None and thread is not threading.current_thread():
        thread.join(timeout)
