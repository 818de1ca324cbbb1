"""The device plugin (kubelet API v1beta1): one resource per product, e.g. ``gpuslice.io/v100-25``.

Per product, a gRPC server on ``<kubelet-dir>/device-plugins/gpuslice.io-<product>.sock``,
registered with the kubelet's ``device-plugins/kubelet.sock``:

* ListAndWatch streams the product's tokens (``tokens.py``), Unhealthy on withdrawn cards;
* GetPreferredAllocation prefers tokens by ``packing``'s best-fit policy;
* Allocate checks the tokens are ours and returns their CDI devices; the specs are written by
  :class:`~enforcement.deviceplugin.handoff.TokenHandoff` once PodResources names the holder pod;
* PreStartContainer, which the kubelet calls before it creates each container, returns once the
  container's specs are written (or fails after 20 s, and the kubelet retries).

The kubelet removes every socket in ``device-plugins/`` when it starts: a watcher re-creates ours
and registers again as soon as the kubelet's socket is back.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from enforcement.cdi import qualified
from enforcement.deviceplugin.handoff import TokenHandoff
from enforcement.deviceplugin.tokens import parse, preferred, tokens_of
from enforcement.kubeletapi.stubs import deviceplugin_pb2, deviceplugin_pb2_grpc
from packing.inventory import Card
from packing.products import Catalog, Product

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
KUBELET_SOCKET = "kubelet.sock"
PRESTART_WAIT_S = 20.0  # under the kubelet's 30 s PreStartContainer deadline
OPTIONS = deviceplugin_pb2.DevicePluginOptions(pre_start_required=True, get_preferred_allocation_available=True)


def cdi_annotations(token_ids: Sequence[str]) -> dict[str, str]:
    """The same CDI devices as container annotations, read by runtimes for kubelets older than
    Allocate's ``cdi_devices`` field (1.28); the runtime drops the duplicate where both arrive."""
    out: dict[str, str] = {}
    for token_id in token_ids:
        digest = hashlib.sha256(token_id.encode()).hexdigest()[:16]  # ':' is not allowed in a key
        out[f"cdi.k8s.io/gpuslice.io_{digest}"] = qualified(token_id)
    return out


class _Devices:
    """The current token list of one product, with a version to wake ListAndWatch streams."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._version = 0
        self._devices: list[tuple[str, bool]] = []
        self.closed = False

    def publish(self, devices: list[tuple[str, bool]]) -> None:
        with self._cond:
            if devices != self._devices:
                self._devices = devices
                self._version += 1
                self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self.closed = True
            self._cond.notify_all()

    def ids(self) -> set[str]:
        with self._cond:
            return {d for d, _ in self._devices}

    def wait(self, seen: int, timeout: float) -> tuple[int, list[tuple[str, bool]]]:
        with self._cond:
            self._cond.wait_for(lambda: self._version != seen or self.closed, timeout)
            return self._version, list(self._devices)


class _Servicer:
    def __init__(self, plugin: ProductPlugin) -> None:
        self.plugin = plugin

    def GetDevicePluginOptions(self, request: Any, context: Any) -> Any:
        return OPTIONS

    def ListAndWatch(self, request: Any, context: Any) -> Iterator[Any]:
        seen = -1
        devices = self.plugin.devices
        while context.is_active() and not devices.closed:
            version, current = devices.wait(seen, 1.0)
            if version != seen:
                seen = version
                yield deviceplugin_pb2.ListAndWatchResponse(devices=[
                    deviceplugin_pb2.Device(ID=d, health="Healthy" if ok else "Unhealthy") for d, ok in current
                ])

    def GetPreferredAllocation(self, request: Any, context: Any) -> Any:
        out = deviceplugin_pb2.PreferredAllocationResponse()
        for r in request.container_requests:
            ids = self.plugin.preferred(list(r.available_deviceIDs), list(r.must_include_deviceIDs),
                                        int(r.allocation_size))
            out.container_responses.add(deviceIDs=ids)
        return out

    def Allocate(self, request: Any, context: Any) -> Any:
        out = deviceplugin_pb2.AllocateResponse()
        known = self.plugin.devices.ids()
        for r in request.container_requests:
            unknown = [d for d in r.devices_ids if d not in known]
            if unknown:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                              f"{self.plugin.resource}: unknown device(s) {', '.join(unknown)}")
        for r in request.container_requests:
            self.plugin.handoff.allocated(r.devices_ids)
            out.container_responses.add(
                cdi_devices=[deviceplugin_pb2.CDIDevice(name=qualified(d)) for d in r.devices_ids],
                annotations=cdi_annotations(r.devices_ids),
            )
        return out

    def PreStartContainer(self, request: Any, context: Any) -> Any:
        # the kubelet's barrier before it creates the container: answer once its specs exist
        started = time.monotonic()
        missing = self.plugin.handoff.wait_written(request.devices_ids, PRESTART_WAIT_S)
        log.info("PreStartContainer %s: %s after %.0f ms", ",".join(request.devices_ids),
                 "missing " + ",".join(missing) if missing else "ready", 1000 * (time.monotonic() - started))
        if missing:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                          f"{self.plugin.resource}: no container edits yet for {', '.join(missing)} "
                          f"({self.plugin.handoff.last_error or 'no pod holds them'}); the kubelet retries")
        return deviceplugin_pb2.PreStartContainerResponse()


class ProductPlugin:
    """The device plugin of one product: its tokens, its server, its registration."""

    def __init__(self, product: Product, catalog: Catalog, handoff: TokenHandoff, plugin_dir: Path,
                 cards: Callable[[], list[Card]]) -> None:
        self.product = product
        self.catalog = catalog
        self.resource = product.resource
        self.handoff = handoff
        self.plugin_dir = plugin_dir
        self.socket = plugin_dir / f"{catalog.resource_prefix}-{product.name}.sock"
        self.cards = cards
        self.devices = _Devices()
        self._server: grpc.Server | None = None
        self.registrations = 0

    def update(self, cards: Sequence[Card]) -> None:
        self.devices.publish([(t.id, ok) for t, ok in tokens_of(self.product, cards)])

    def preferred(self, available: list[str], must: list[str], size: int) -> list[str]:
        ours = [t for t in available if (p := parse(t)) is not None and p.product == self.product.name]
        return preferred(self.product, self.catalog, self.cards(), ours, must, size, self.handoff.held())

    def serve(self) -> None:
        self.stop_serving()
        self.plugin_dir.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()
        self.devices.closed = False
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="gpuslice-dp"))
        deviceplugin_pb2_grpc.add_DevicePluginServicer_to_server(_Servicer(self), server)
        try:
            server.add_insecure_port(f"unix://{self.socket}")
        except RuntimeError as e:  # grpc says only "failed to bind"; the usual cause is a path over 107 bytes
            raise OSError(f"cannot listen on {self.socket} ({len(str(self.socket))} bytes): {e}") from e
        server.start()
        os.chmod(self.socket, 0o600)
        self._server = server

    def register(self) -> None:
        """Tell the kubelet about this resource (raises grpc.RpcError when the kubelet refuses)."""
        with grpc.insecure_channel(f"unix://{self.plugin_dir / KUBELET_SOCKET}") as channel:
            deviceplugin_pb2_grpc.RegistrationStub(channel).Register(
                deviceplugin_pb2.RegisterRequest(
                    version=API_VERSION, endpoint=self.socket.name, resource_name=self.resource,
                    options=OPTIONS,
                ),
                timeout=10,
            )
        self.registrations += 1
        log.info("registered %s with the kubelet (%d token devices)", self.resource, len(self.devices.ids()))

    def stop_serving(self) -> None:
        if self._server is not None:
            self.devices.close()
            self._server.stop(grace=0.5).wait(2.0)
            self._server = None


def _inode(path: Path) -> int | None:
    try:
        return path.stat().st_ino
    except FileNotFoundError:
        return None


class DevicePlugins:
    """Every product's plugin, kept registered across kubelet restarts."""

    def __init__(self, plugins: list[ProductPlugin], plugin_dir: Path, poll_s: float = 0.1) -> None:
        self.plugins = plugins
        self.plugin_dir = plugin_dir
        self.poll_s = poll_s
        self._kubelet_inode: int | None = None
        self.healthy = False
        self.last_error = ""

    def update(self, cards: Sequence[Card]) -> None:
        for p in self.plugins:
            p.update(cards)

    def ensure(self) -> None:
        """(Re)serve and (re)register when the kubelet's socket is new or ours vanished."""
        inode = _inode(self.plugin_dir / KUBELET_SOCKET)
        if inode is None:
            self.healthy = False
            self.last_error = "kubelet device plugin socket absent"
            return
        lost = [p for p in self.plugins if not p.socket.exists()]
        if inode == self._kubelet_inode and not lost:
            return
        try:
            for p in self.plugins:
                p.serve()
                p.register()
        except (grpc.RpcError, OSError) as e:
            self.healthy = False
            self.last_error = f"registration failed: {e}"
            log.warning("device plugin registration failed: %s; retrying", e)
            return
        self._kubelet_inode, self.healthy, self.last_error = inode, True, ""

    def run(self, stop: threading.Event) -> None:
        while not stop.is_set():
            self.ensure()
            stop.wait(self.poll_s)
        for p in self.plugins:
            p.stop_serving()
            with contextlib.suppress(FileNotFoundError):
                p.socket.unlink()
