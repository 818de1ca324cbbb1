"""This node's GPUs as NVML sees them, and their publication on the Node object.

The agent reads each card through NVML (UUID, index, minor number, name, memory) and probes its
health every ``refresh_s``. It publishes the cards as the Node annotation ``gpuslice.io/inventory``,
the inventory record of ``packing.inventory`` (one ``Card`` per GPU, its encoding and the
extender's decoding in one place), with ``model`` NVML's name in GPU Feature Discovery's label form
(``nvidia.com/gpu.product``), so the extender's catalog matches it the same way. The minor number
and a failed probe's message stay on the node (a ``Reading``). A card that stops answering as itself is
published ``healthy: false`` (the extender places nothing new on it), its DRA tokens leave the
ResourceSlice and its device plugin tokens turn Unhealthy. Allocation records name these UUIDs.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from enforcement.nvml import GpuDevice, NvmlError
from packing.inventory import ANNOTATION, Card, encode
from packing.kube.client import Kube

log = logging.getLogger(__name__)

MIB = 1 << 20
_LABEL_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def gfd_model(nvml_name: str) -> str:
    """NVML's product name in GFD's label form: ``Tesla V100-SXM2-32GB`` -> ``Tesla-V100-SXM2-32GB``."""
    text = "-".join(nvml_name.split())
    return _LABEL_UNSAFE.sub("-", text).strip("-_.")[:63]


@dataclass(frozen=True, slots=True)
class Reading:
    """One GPU of this node as NVML read it now: its published card, its device minor, why it is unhealthy."""

    card: Card
    minor: int
    problem: str = ""


class CardSource(Protocol):
    """What the inventory asks of NVML (``enforcement.nvml.PynvmlBackend`` provides it)."""

    def devices(self) -> list[GpuDevice]: ...

    def minor_number(self, uuid: str) -> int: ...

    def health(self, uuid: str) -> str | None: ...


def read_cards(source: CardSource, devices: Sequence[GpuDevice] | None = None) -> list[Reading]:
    """Every card (``devices``, else the source's) with its health now; a card whose minor number
    is unreadable is unhealthy."""
    cards: list[Reading] = []
    for d in source.devices() if devices is None else devices:
        try:
            problem = source.health(d.uuid)
        except NvmlError as e:  # a probe that does not answer in time (a hung card) is a failed probe
            problem = str(e)
        try:
            minor = source.minor_number(d.uuid)
        except NvmlError as e:
            minor, problem = d.index, problem or str(e)
        cards.append(Reading(Card(d.uuid, d.index, gfd_model(d.name), d.memory_total // MIB, problem is None),
                             minor, problem or ""))
    return cards


class NodeAnnotator(Protocol):
    """Writes one annotation on this node's Node object (raises on failure)."""

    def annotate(self, key: str, value: str) -> None: ...


class KubeNodeAnnotator:
    """NodeAnnotator through the API (a merge patch of the Node's annotations only)."""

    def __init__(self, kube: Kube, node_name: str) -> None:
        self.kube = kube
        self.node_name = node_name

    def annotate(self, key: str, value: str) -> None:
        self.kube.annotate_node(self.node_name, {key: value})


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
        self._readings: list[Reading] = []
        self._published: str | None = None
        self._published_at = float("-inf")
        self._listeners: list[Listener] = []
        self._lock = threading.Lock()
        self.publish_errors = 0
        self.last_error = ""

    def cards(self) -> list[Card]:
        with self._lock:
            return [r.card for r in self._readings]

    def readings(self) -> list[Reading]:
        with self._lock:
            return list(self._readings)

    def healthy(self) -> list[Card]:
        return [c for c in self.cards() if c.healthy]

    def minors(self) -> dict[str, int]:
        """UUID -> device minor, for every card (an unhealthy card keeps its running slices)."""
        return {r.card.uuid: r.minor for r in self.readings()}

    def subscribe(self, listener: Listener) -> None:
        """Call ``listener(cards)`` now and after every change."""
        with self._lock:
            self._listeners.append(listener)
            cards = [r.card for r in self._readings]
        listener(cards)

    @property
    def published(self) -> bool:
        """The Node carries the current inventory (always True without an annotator)."""
        with self._lock:
            return self.annotator is None or self._published == encode(r.card for r in self._readings)

    def refresh(self, now: float, stop: threading.Event | None = None) -> bool:
        """Re-read the cards; publish when they changed (or every ``resync_s``); True on change.

        A read that ``stop`` overtook is dropped: NVML shut down under it, the cards did not fail.
        """
        readings = read_cards(self.source, self.devices)
        if stop is not None and stop.is_set():
            return False
        with self._lock:
            changed = readings != self._readings
            self._readings = readings
            listeners = list(self._listeners)
        cards = [r.card for r in readings]
        if changed:
            for r in readings:
                if not r.card.healthy:
                    log.warning("GPU %s (index %d) withdrawn: %s", r.card.uuid, r.card.index, r.problem)
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
