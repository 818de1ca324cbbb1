"""Simulated cards for running the real agent on a node without GPUs (the e2e-node suite, demos).

``gpuslice agent --simulated-gpus cards.json`` reads a JSON list of cards::

    [{"uuid": "GPU-…", "name": "Tesla V100-SXM2-32GB", "memory_mib": 32768, "lost": false}, ...]

and serves them through :class:`~enforcement.simgpu.FakeNVML` (pynvml's names and error classes).
The file is re-read when it changes: a card marked ``"lost": true`` answers every call with
``NVMLError_GpuIsLost`` from then on, as a card fallen off the bus does.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import pynvml

from enforcement.clock import SystemClock
from enforcement.simgpu import GIB, FakeNVML, SimGPU


def load_cards(path: Path) -> list[dict[str, Any]]:
    doc = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(doc, list) or not all(isinstance(c, dict) and isinstance(c.get("uuid"), str) for c in doc):
        raise ValueError(f"{path}: expected a JSON list of cards with a uuid each")
    return doc


class SimulatedCards:
    """A pynvml-shaped library over FakeNVML whose cards can be lost at run time (see module doc)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        cards = load_cards(path)
        gpus = [SimGPU(i, c["uuid"], str(c.get("name", "Tesla V100-SXM2-32GB")),
                       int(c.get("memory_mib", 32 * 1024)) * (GIB // 1024)) for i, c in enumerate(cards)]
        self._fake = FakeNVML(gpus, SystemClock())
        self._index = {g.uuid: g.index for g in gpus}
        self._lost: set[int] = set()
        self._mtime = 0.0
        self._lock = threading.Lock()
        self._reload()

    def _reload(self) -> None:
        with self._lock:
            try:
                mtime = os.stat(self.path).st_mtime
            except FileNotFoundError:
                return
            if mtime == self._mtime:
                return
            self._mtime = mtime
            try:
                cards = load_cards(self.path)
            except (ValueError, json.JSONDecodeError):
                return  # half-written: keep the last good view
            self._lost = {self._index[c["uuid"]] for c in cards if c.get("lost") and c["uuid"] in self._index}

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._fake, name)
        if not callable(target) or not name.startswith("nvml"):
            return target

        def call(*args: Any, **kwargs: Any) -> Any:
            self._reload()
            handle = args[0] if args else None
            if getattr(handle, "index", None) in self._lost:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)
            return target(*args, **kwargs)

        return call
