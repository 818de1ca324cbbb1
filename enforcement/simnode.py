"""Simulated cards for running the real agent on a node without GPUs (the e2e-node suite, demos, a kind chart).

``gpuslice agent --simulated-gpus N`` serves N V100-32GB cards whose uuids derive from the node's
name (unique across nodes, the same at every start). ``--simulated-gpus cards.json`` reads a JSON
list of cards instead::

    [{"uuid": "GPU-…", "name": "Tesla V100-SXM2-32GB", "memory_mib": 32768, "lost": false}, ...]

Either is served through :class:`~enforcement.simgpu.FakeNVML` (pynvml's names and error classes).
The file is re-read when it changes: a card marked ``"lost": true`` answers every call with
``NVMLError_GpuIsLost`` from then on, as a card fallen off the bus does.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import uuid
from pathlib import Path
from typing import Any

import pynvml

from enforcement.clock import SystemClock
from enforcement.simgpu import GIB, FakeNVML, SimGPU

MAX_CARDS = 64  # more than any node holds: a larger count is a typo


def load_cards(path: Path) -> list[dict[str, Any]]:
    """The cards of a JSON file; ValueError (json.JSONDecodeError, UnicodeDecodeError) when it is not one."""
    doc = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(doc, list) or not all(isinstance(c, dict) and isinstance(c.get("uuid"), str) for c in doc):
        raise ValueError(f"{path}: expected a JSON list of cards with a uuid each")
    return doc


def counted_cards(count: int, node: str) -> list[dict[str, Any]]:
    """``count`` V100-32GB cards with uuids derived from ``node`` (two nodes never share one)."""
    return [{"uuid": f"GPU-{uuid.uuid5(uuid.NAMESPACE_URL, f'gpuslice-simulated/{node}/{i}')}",
             "name": "Tesla V100-SXM2-32GB", "memory_mib": 32 * 1024} for i in range(count)]


def simulated_gpus(text: str) -> int | Path:
    """``--simulated-gpus``: a count of cards (1..MAX_CARDS) or a JSON file of cards, checked here."""
    body = text.strip()
    if body.lstrip("+-").isdigit():
        count = int(body)
        if not 1 <= count <= MAX_CARDS:
            raise argparse.ArgumentTypeError(f"a count of simulated cards is 1..{MAX_CARDS}, got {text!r}")
        return count
    path = Path(body)
    try:
        load_cards(path)
    except FileNotFoundError:
        raise argparse.ArgumentTypeError(f"expected a count of cards (e.g. 4) or a JSON file of cards; "
                                         f"no file {text!r}") from None
    except OSError as e:
        raise argparse.ArgumentTypeError(f"cannot read {text!r}: {e.strerror or e}") from None
    except ValueError as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise argparse.ArgumentTypeError(f"{text!r} is not a JSON list of cards with a uuid each "
                                         f"({str(e).splitlines()[0]})") from None
    return path


class SimulatedCards:
    """A pynvml-shaped library over FakeNVML whose cards can be lost at run time (see module doc)."""

    def __init__(self, source: Path | list[dict[str, Any]]) -> None:
        self.path = source if isinstance(source, Path) else None  # None: a fixed list, never re-read
        cards = load_cards(source) if isinstance(source, Path) else source
        gpus = [SimGPU(i, c["uuid"], str(c.get("name", "Tesla V100-SXM2-32GB")),
                       int(c.get("memory_mib", 32 * 1024)) * (GIB // 1024)) for i, c in enumerate(cards)]
        self._fake = FakeNVML(gpus, SystemClock())
        self._index = {g.uuid: g.index for g in gpus}
        self._lost: set[int] = set()
        self._mtime = 0.0
        self._lock = threading.Lock()
        self._reload()

    def _reload(self) -> None:
        if self.path is None:
            return
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
