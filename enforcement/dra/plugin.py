"""The DRA kubelet plugin of the driver ``gpuslice.io``: registration, NodePrepare/NodeUnprepare.

Serves the kubelet's DRA gRPC API **v1** (``v1.DRAPlugin``, Kubernetes 1.34+) on
``<kubelet-dir>/plugins/gpuslice.io/dra.sock`` and registers it through the plugin registration
API (``<kubelet-dir>/plugins_registry/gpuslice.io-reg.sock``, type ``DRAPlugin``).

NodePrepareResources, per claim: answered from the checkpoint when already prepared (idempotent);
else read the ResourceClaim, take the one pod in its ``status.reservedFor``, find *that* pod's
allocation record by UID, write a CDI spec (device ``claim-<claim uid>``) with the container edits
of the record, checkpoint, and return its CDI id for every allocated ``gpuslice.io`` device. A
failure is the claim's ``error`` (the kubelet retries), never a guess. NodeUnprepareResources
removes the spec and the checkpoint entry; an unknown claim is already unprepared.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Iterable
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from enforcement.dra.checkpoint import Checkpoint, PreparedClaim, PreparedDevice
from enforcement.dra.slices import DRIVER
from enforcement.handoff import HandoffError, RecordLookup, Writer, claim_reserved_pod
from enforcement.kubeletapi.stubs import (
    dra_pb2,
    dra_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
)
from packing.kube.client import Kube, KubeError
from packing.kube.objects import field

log = logging.getLogger(__name__)

SERVICES = ("v1.DRAPlugin",)  # the kubelet DRA gRPC services we serve


def claim_device(claim_uid: str) -> str:
    return f"claim-{claim_uid}"


class DraDriver:
    """Prepare and unprepare claims (the logic; :class:`DraServer` puts it on gRPC)."""

    def __init__(self, api: Kube, lookup: RecordLookup, writer: Writer, checkpoint: Checkpoint) -> None:
        self.api = api
        self.lookup = lookup
        self.writer = writer
        self.checkpoint = checkpoint
        self._locks: dict[str, threading.Lock] = {}  # one prepare/unprepare per claim at a time, never node-wide
        self._locks_lock = threading.Lock()
        self.prepared_count = 0  # prepares that did the work (not answered from the checkpoint)

    def _lock(self, claim_uid: str) -> threading.Lock:
        with self._locks_lock:
            return self._locks.setdefault(claim_uid, threading.Lock())

    def prepare(self, namespace: str, name: str, uid: str) -> PreparedClaim:
        """Prepare one claim; HandoffError says why not."""
        if not uid or not name or not namespace:
            raise HandoffError("a claim needs namespace, name and uid")
        with self._lock(uid):
            done = self.checkpoint.get(uid)
            if done is not None:
                if not self.writer.specs.path(done.cdi_device).exists():  # the spec dir was wiped
                    self.writer.write(done.cdi_device, self.lookup.by_uid(done.pod_uid, namespace, done.pod_name))
                return done
            claim = self._claim(namespace, name, uid)
            results = [r for r in field(claim, "status", "allocation", "devices", "results") or []
                       if isinstance(r, dict) and r.get("driver") == DRIVER]
            if not results:
                raise HandoffError(f"ResourceClaim {namespace}/{name} has no {DRIVER} device allocated")
            pod_uid, pod_name = claim_reserved_pod(claim)
            pod = self.lookup.by_uid(pod_uid, namespace, pod_name)  # its own record, for this node (record_of_pod)
            device = claim_device(uid)
            handoff = self.writer.write(device, pod)
            devices = tuple(
                PreparedDevice((str(r.get("request", "")),), str(r.get("pool", "")), str(r.get("device", "")),
                               (handoff.cdi_device,))
                for r in results
            )
            prepared = PreparedClaim(uid, namespace, name, pod.uid, pod.name, device, devices)
            self.checkpoint.put(prepared)
            self.prepared_count += 1
            log.info("prepared claim %s/%s for pod %s/%s: GPU %s", namespace, name, pod.namespace, pod.name,
                     ",".join(pod.record.gpus))
            return prepared

    def _claim(self, namespace: str, name: str, uid: str) -> dict[str, Any]:
        try:
            claim = self.api.get(f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims/{name}")
        except KubeError as e:
            raise HandoffError(f"cannot read ResourceClaim {namespace}/{name}: {e}") from e
        if claim is None:
            raise HandoffError(f"ResourceClaim {namespace}/{name} does not exist")
        if field(claim, "metadata", "uid") != uid:
            raise HandoffError(f"ResourceClaim {namespace}/{name} is {field(claim, 'metadata', 'uid')}, not {uid}")
        return claim

    def unprepare(self, uid: str) -> bool:
        """Unprepare one claim; False when it was not prepared (already done: not an error)."""
        with self._lock(uid):
            done = self.checkpoint.get(uid)
            self.writer.remove(claim_device(uid))
            if done is None:
                return False
            self.checkpoint.drop(uid)
        with self._locks_lock:
            self._locks.pop(uid, None)
            log.info("unprepared claim %s/%s (pod %s)", done.namespace, done.name, done.pod_uid)
            return True


class _DraServicer:
    def __init__(self, driver: DraDriver) -> None:
        self.driver = driver

    def NodePrepareResources(self, request: Any, context: Any) -> Any:
        out = dra_pb2.NodePrepareResourcesResponse()
        for c in request.claims:
            entry = out.claims[c.uid]
            try:
                prepared = self.driver.prepare(c.namespace, c.name, c.uid)
            except HandoffError as e:
                log.warning("prepare of claim %s/%s failed: %s", c.namespace, c.name, e)
                entry.error = str(e)
                continue
            for d in prepared.devices:
                entry.devices.add(request_names=list(d.request_names), pool_name=d.pool_name,
                                  device_name=d.device_name, cdi_device_ids=list(d.cdi_device_ids))
        return out

    def NodeUnprepareResources(self, request: Any, context: Any) -> Any:
        out = dra_pb2.NodeUnprepareResourcesResponse()
        for c in request.claims:
            entry = out.claims[c.uid]
            try:
                self.driver.unprepare(c.uid)
            except OSError as e:
                entry.error = f"could not remove the CDI spec of claim {c.uid}: {e}"
        return out


class _RegistrationServicer:
    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint
        self.registered = threading.Event()
        self.error = ""

    def GetInfo(self, request: Any, context: Any) -> Any:
        return pluginregistration_pb2.PluginInfo(type="DRAPlugin", name=DRIVER, endpoint=self.endpoint,
                                                 supported_versions=list(SERVICES))

    def NotifyRegistrationStatus(self, request: Any, context: Any) -> Any:
        if request.plugin_registered:
            log.info("kubelet registered DRA driver %s", DRIVER)
            self.error = ""
            self.registered.set()
        else:
            self.error = request.error
            self.registered.clear()
            log.error("kubelet refused DRA driver %s: %s", DRIVER, request.error)
        return pluginregistration_pb2.RegistrationStatusResponse()


def _serve(socket: Path, add: Iterable[Any], workers: int = 4) -> grpc.Server:
    socket.parent.mkdir(parents=True, exist_ok=True)
    if socket.exists() or socket.is_symlink():
        socket.unlink()  # a socket left by a previous run
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers, thread_name_prefix="gpuslice-dra"))
    for register in add:
        register(server)
    try:
        server.add_insecure_port(f"unix://{socket}")
    except RuntimeError as e:  # grpc says only "failed to bind"; the usual cause is a path over 107 bytes
        raise OSError(f"cannot listen on {socket} ({len(str(socket))} bytes): {e}") from e
    server.start()
    os.chmod(socket, 0o600)  # only root (the kubelet) talks to us
    return server


class DraServer:
    """The DRA plugin's two sockets: the driver API, then its registration (in that order)."""

    def __init__(self, driver: DraDriver, kubelet_dir: Path) -> None:
        self.driver = driver
        self.endpoint = kubelet_dir / "plugins" / DRIVER / "dra.sock"
        self.registration_socket = kubelet_dir / "plugins_registry" / f"{DRIVER}-reg.sock"
        self.registration = _RegistrationServicer(str(self.endpoint))
        self._servers: list[grpc.Server] = []

    def start(self) -> DraServer:
        servicer = _DraServicer(self.driver)
        add_driver = [lambda s: dra_pb2_grpc.add_DRAPluginServicer_to_server(servicer, s)]
        self._servers.append(_serve(self.endpoint, add_driver))
        reg = self.registration
        self._servers.append(_serve(self.registration_socket,
                                    [lambda s: pluginregistration_pb2_grpc.add_RegistrationServicer_to_server(reg, s)],
                                    workers=2))
        return self

    def stop(self) -> None:
        for server in self._servers:
            server.stop(grace=1.0).wait(2.0)
        self._servers.clear()
        # Without the registration socket the kubelet deregisters us; the driver socket goes too.
        for path in (self.registration_socket, self.endpoint):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

