"""Standalone mode: no cluster. Nodes come from a seed (``--nodes``) or, opted in with ``--learn-nodes``,
from the Node objects of request bodies; binds are kept in memory.

``MemoryBinder`` is the ``Binder`` for this mode: a bind succeeds by being remembered (with the
allocation record a cluster binder would write on the pod); releases come from ``POST
/admin/release`` or reservation expiry, and waiting claims no filter asks about again expire.

Nothing here is durable: a restart (or a crashed worker that gunicorn replaces) starts an empty
ledger under a new epoch, which ``/readyz``, ``/state`` and ``gpuslice_ledger_epoch`` show, so a
client can tell that every bind it made before is forgotten. A cluster keeps its state in the API
server (allocation records on the pods) and rebuilds from there.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from extender.config import ExtenderConfig
from extender.inventory import synthetic_cards
from extender.state import ExtenderState
from extender.wire import BindingArgs
from packing.products import Catalog, load_catalog
from packing.record import AllocationRecord


@dataclass(frozen=True, slots=True)
class Bound:
    pod: str
    node: str
    record: str | None  # the encoded allocation record, as the annotation would carry it


class MemoryBinder:
    """Remembers binds in memory: the standalone stand-in for the Binding and its record."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.bound: dict[str, Bound] = {}

    def bind(self, args: BindingArgs, record: AllocationRecord | None) -> None:
        with self._lock:
            self.bound[args.pod_uid] = Bound(args.pod_key, args.node, record.encode() if record else None)

    def release(self, pod_uid: str) -> None:
        with self._lock:
            self.bound.pop(pod_uid, None)


def seed_nodes(state: ExtenderState, count: int, gpus_per_node: int, model: str, prefix: str = "node") -> None:
    """Add ``count`` nodes ``<prefix>-<i>`` of ``gpus_per_node`` cards of ``model`` (NodeNames mode works)."""
    memory = state.catalog.model_memory_mib(model)
    if memory is None:
        raise ValueError(f"GPU model {model!r} is not in the catalog ({state.catalog.source})")
    for i in range(count):
        name = f"{prefix}-{i}"
        state.add_node(name, synthetic_cards(name, gpus_per_node, model, memory))


def build_state(
    config: ExtenderConfig, catalog: Catalog | None = None, clock: Callable[[], float] = time.monotonic
) -> ExtenderState:
    """A standalone state from ``config``: in-memory binder, nodes seeded when asked."""
    catalog = catalog or load_catalog(config.catalog or None)
    state = ExtenderState(catalog, MemoryBinder(), config.state_config(), clock=clock)
    state.history = config.demand_book(catalog)
    if config.nodes:
        seed_nodes(state, config.nodes, config.gpus_per_node, config.gpu_model)
    state.warm()
    return state
