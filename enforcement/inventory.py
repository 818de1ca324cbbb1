"""This node's GPUs as NVML sees them, and their publication on the Node object.

The agent reads each card through NVML (UUID, index, minor number, name, memory) and probes its
health every ``refresh_s``. It publishes the cards as the Node annotation ``gpuslice.io/inventory``,
a JSON list, one entry per card::

    {"uuid": "GPU-…", "index": 0, "model": "Tesla-V100-SXM2-32GB", "memory_mib": 32768, "healthy": true}

``model`` is NVML's name in GPU Feature Discovery's label form (``nvidia.com/gpu.product``), so
the extender's catalog matches it the same way. A card that stops answering as itself is
published ``healthy: false`` (the extender places nothing new on it), its DRA tokens leave the
ResourceSlice and its device plugin tokens turn Unhealthy. Allocation records name these UUIDs.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from enforcement.nvml import GpuDevice, NvmlError

log = logging.getLogger(__name__)

ANNOTATION = "gpuslice.io/inventory"
MIB = 1 << 20
_LABEL_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def gfd_model(nvml_name: str) -> str:
    """NVML's product name in GFD's label form: ``Tesla V100-SXM2-32GB`` -> ``Tesla-V100-SXM2-32GB``."""
    text = "-".join(nvml_name.split())
    return _LABEL_UNSAFE.sub("-", text).strip("-_.")[:63]


@dataclass(frozen=True, slots=True)
class Card:
    """One GPU of this node."""

    uuid: str
    index: int
    minor: int
    model: str
    memory_mib: int
    healthy: bool = True
    problem: str = ""

    def entry(self) -> dict[str, Any]:
        """This card's entry in the published annotation (the contract the extender reads)."""
        return {"uuid": self.uuid, "index": self.index, "model": self.model, "memory_mib": self.memory_mib,
                "healthy": self.healthy}


def encode(cards: Sequence[Card]) -> str:
    """The annotation value: compact JSON, cards in NVML index order."""
    return json.dumps([c.entry() for c in sorted(cards, key=lambda c: c.index)], separators=(",", ":"))


class CardSource(Protocol):
    """What the inventory asks of NVML (``enforcement.nvml.PynvmlBackend`` provides it)."""

    def devices(self) -> list[GpuDevice]: ...

    def minor_number(self, uuid: str) -> int: ...

    def health(self, uuid: str) -> str | None: ...


def read_cards(source: CardSource, devices: Sequence[GpuDevice] | None = None) -> list[Card]:
    """Every card (``devices``, else the source's) with its health now; a card whose minor number
    is unreadable is unhealthy."""
    cards: list[Card] = []
    for d in source.devices() if devices is None else devices:
        try:
            problem = source.health(d.uuid)
        except NvmlError as e:  # a probe that does not answer in time (a hung card) is a failed probe
            problem = str(e)
        try:
            minor = source.minor_number(d.uuid)
        except NvmlError as e:
            minor, problem = d.index, problem or str(e)
        cards.append(Card(d.uuid, d.index, minor, gfd_model(d.name), d.memory_total // MIB, problem is None,
                          problem or ""))
    return cards


class NodeAnnotator(Protocol):
    """Writes one annotation on this node's Node object (raises on failure)."""

    def annotate(self, key: str, value: str) -> None: ...


class KubeNodeAnnotator:
    """NodeAnnotator through the kubernetes client's CoreV1Api (merge patch of metadata only)."""

    def __init__(self, core_v1: Any, node_name: str) -> None:
        self.api = core_v1
        self.node_name = node_name

    def annotate(self, key: str, value: str) -> None:
        self.api.patch_node(self.node_name, {"metadata": {"annotations": {key: value}}})


Listener = Callable[[list[Card]], None]


class Inventory:
    """The current cards, refreshed from NVML, published on the Node, announced to listeners.

    Thread-safe. ``refresh`` is one step (tests call it by hand); ``run`` loops it. A failed
    publication is retried at the next step and reported by ``published`` (never silent).
    """

    def __init__(self, source: CardSource, annotator: NodeAnnotator | None, resync_s: float = 60.0) -> None:
        self.source = source
        # NVML enumerates once, at open: take the list now rather than ask the shared backend from
        # this thread again (a bounded backend refuses a second caller on the same lane)
        self.devices = source.devices()
        self.annotator = annotator
        self.resync_s = resync_s
        self._cards: list[Card] = []
        self._published: str | None = None
        self._published_at = float("-inf")
        self._listeners: list[Listener] = []
        self._lock = threading.Lock()
        self.publish_errors = 0
        self.last_error = ""

    def cards(self) -> list[Card]:
        with self._lock:
            return list(self._cards)

    def healthy(self) -> list[Card]:
        return [c for c in self.cards() if c.healthy]

    def minors(self) -> dict[str, int]:
        """UUID -> device minor, for every card (an unhealthy card keeps its running slices)."""
        return {c.uuid: c.minor for c in self.cards()}

    def subscribe(self, listener: Listener) -> None:
        """Call ``listener(cards)`` now and after every change."""
        with self._lock:
            self._listeners.append(listener)
            cards = list(self._cards)
        listener(cards)

    @property
    def published(self) -> bool:
        """The Node carries the current inventory (always True without an annotator)."""
        with self._lock:
            return self.annotator is None or self._published == encode(self._cards)

    def refresh(self, now: float, stop: threading.Event | None = None) -> bool:
        """Re-read the cards; publish when they changed (or every ``resync_s``); True on change.

        A read that ``stop`` overtook is dropped: NVML shut down under it, the cards did not fail.
        """
        cards = read_cards(self.source, self.devices)
        if stop is not None and stop.is_set():
            return False
        with self._lock:
            changed = cards != self._cards
            self._cards = cards
            listeners = list(self._listeners)
        if changed:
            for c in cards:
                if not c.healthy:
                    log.warning("GPU %s (index %d) withdrawn: %s", c.uuid, c.index, c.problem)
            for listener in listeners:
                listener(cards)
        self._publish(cards, now)
        return changed

    def _publish(self, cards: list[Card], now: float) -> None:
        if self.annotator is None:
            return
        value = encode(cards)
        with self._lock:
            due = value != self._published or now - self._published_at >= self.resync_s
        if not due:
            return
        try:
            self.annotator.annotate(ANNOTATION, value)
        except Exception as e:  # the API server is away: keep the old value, retry next step
            self.publish_errors += 1
            self.last_error = str(e)
            log.warning("could not publish %s on the node: %s", ANNOTATION, e)
            return
        with self._lock:
            self._published, self._published_at = value, now

    def run(self, stop: threading.Event, clock: Callable[[], float], refresh_s: float = 5.0) -> None:
        """Refresh every ``refresh_s`` until ``stop`` is set (run it in a thread)."""
        while not stop.is_set():
            try:
                self.refresh(clock(), stop)
            except Exception as e:  # NVML itself gone: say so and keep trying
                log.warning("inventory refresh failed: %s", e)
            stop.wait(refresh_s)
