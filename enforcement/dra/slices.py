"""The ResourceSlice this node publishes for the DRA driver ``gpuslice.io``.

Kubernetes 1.34 cannot express an 8/16/32 GiB share of one card in DRA (consumable capacity is
alpha there), so the slice holds *token* devices: per healthy card, as many tokens of each
product of its model as fit on a card (4 ``v100-25``, 2 ``v100-50``, 1 ``v100-100``), each with
the attribute ``gpuslice.io/product``, which the DeviceClasses of ``deploy/chart`` (``templates/deviceclasses.yaml``)
select. kube-scheduler's DynamicResources plugin only checks that a token is free; the extender's
ledger decides the real card and writes the allocation record, which NodePrepareResources reads.
A withdrawn card's tokens leave the slice, so the node offers less.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from typing import Any

from packing.inventory import Card
from packing.kube.client import Kube, KubeError, Obj
from packing.kube.objects import field
from packing.products import MILLI_PER_GPU, Catalog

log = logging.getLogger(__name__)

DRIVER = "gpuslice.io"
MAX_DEVICES = 128  # resource.k8s.io/v1 ResourceSlice limit
SLICES = "/apis/resource.k8s.io/v1/resourceslices"


def token_devices(cards: Sequence[Card], catalog: Catalog) -> list[Obj]:
    """The token devices for the healthy ``cards``: ``<product>-<n>``, n counting across cards."""
    counts: dict[str, int] = {}
    for card in cards:
        if not card.healthy:
            continue
        for product in catalog.products:
            if product.matches_model(card.model):
                counts[product.name] = counts.get(product.name, 0) + MILLI_PER_GPU // product.milli
    devices = [
        {"name": f"{name}-{i}", "attributes": {"product": {"string": name}}}
        for name in sorted(counts) for i in range(counts[name])
    ]
    if len(devices) > MAX_DEVICES:
        log.error("%d token devices exceed a ResourceSlice's %d; publishing the first %d",
                  len(devices), MAX_DEVICES, MAX_DEVICES)
    return devices[:MAX_DEVICES]


def slice_name(node: str) -> str:
    return f"{node}-{DRIVER}"


def resource_slice(node: str, node_uid: str | None, devices: list[Obj], generation: int) -> Obj:
    meta: Obj = {"name": slice_name(node)}
    if node_uid:  # garbage-collected with its Node
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": meta,
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


class _NotServed(Exception):
    pass


class SlicePublisher:
    """Keeps this node's ResourceSlice equal to the token devices of the healthy cards.

    ``sync`` creates it, replaces it when the devices changed (pool generation + 1), or recreates
    it when someone deleted it (the kubelet wipes a driver's slices when its plugin goes away).
    """

    def __init__(self, api: Kube, node: str, catalog: Catalog) -> None:
        self.api = api
        self.node = node
        self.catalog = catalog
        self._devices: list[Obj] = []
        self._lock = threading.Lock()
        self.errors = 0
        self.last_error = ""
        self.synced = False
        self.unsupported = False  # the API server serves no resource.k8s.io/v1 (Kubernetes < 1.34)

    def update(self, cards: Sequence[Card]) -> None:
        """The inventory changed: publish its tokens."""
        with self._lock:
            self._devices = token_devices(cards, self.catalog)
        self.sync()

    def sync(self) -> None:
        with self._lock:
            if self.unsupported:
                return
            devices = list(self._devices)
            try:
                self._sync(devices)
                self.synced = True
            except _NotServed:
                self.unsupported = True
                log.error("the API server serves no %s: the DRA path is off on this cluster (Kubernetes "
                          "1.34+ needed); extended resources and annotations still work", SLICES)
                return
            except KubeError as e:
                self.errors += 1
                self.last_error = str(e)
                self.synced = False
                log.warning("could not publish ResourceSlice %s: %s", slice_name(self.node), e)

    def _sync(self, devices: list[Obj]) -> None:
        path = f"{SLICES}/{slice_name(self.node)}"
        current = self.api.get(path)
        if current is None:
            node = self.api.get(f"/api/v1/nodes/{self.node}")
            try:
                self.api.request("POST", SLICES, resource_slice(self.node, field(node, "metadata", "uid"), devices, 1))
            except KubeError as e:
                if e.status == 404:  # a POST to the collection itself found nothing: the API is not served
                    raise _NotServed() from e
                raise
            log.info("published ResourceSlice %s with %d token devices", slice_name(self.node), len(devices))
            return
        if field(current, "spec", "devices") == devices and field(current, "spec", "nodeName") == self.node:
            return
        generation = int(field(current, "spec", "pool", "generation") or 0) + 1
        meta: Any = current.get("metadata") or {}
        obj = resource_slice(self.node, None, devices, generation)
        obj["metadata"] = {**meta, "name": slice_name(self.node)}
        self.api.request("PUT", path, obj)
        log.info("ResourceSlice %s: %d token devices (generation %d)", slice_name(self.node), len(devices), generation)

    def run(self, stop: threading.Event, every_s: float) -> None:
        """Re-check every ``every_s`` (a deleted slice comes back)."""
        while not stop.wait(every_s):
            self.sync()
