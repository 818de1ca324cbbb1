"""An NRI plugin (containerd's Node Resource Interface): the hand-off for pods that ask by annotation.

No kubelet plugin ever sees a pod that asks for its slice by annotation only: it requests no
extended resource and no claim. The container runtime does see it. At every container creation
containerd asks its NRI plugins for adjustments, naming the pod sandbox (its UID and annotations,
so the allocation record itself) and the container. This plugin answers, for a container of a pod
whose record is the one the extender wrote for it on this node (the pod as the watch shows it, else
as the API does, read by ``handoff.RecordLookup`` like the other paths: ``packing.record.record_of_pod``,
and the pod asks for the record's product; a copy of another pod's record is refused, the pod told
why) and that no other path has handed its slice yet (no
``GPUSLICE_POD_UID`` in its environment, no ``gpuslice.io/slice`` CDI device), with the CDI
device ``gpuslice.io/slice=pod-<uid>``, whose spec it wrote from the record, with the same
container-edits core as the kubelet paths, when the pod sandbox started (so the runtime's CDI
cache has seen it by the time containers are created). containerd injects it like any CDI device.
The spec is removed when the pod sandbox stops (no container of it is created after that).

Wire protocol (NRI v1alpha1 over ttrpc over NRI's connection multiplexer, on one unix socket):

* mux frame: ``conn id (u32 BE) | length (u32 BE) | bytes``; conn 1 carries the plugin's service
  (the runtime calls us), conn 2 the runtime's (we call it);
* ttrpc message: ``length (u32 BE) | stream id (u32 BE) | type (1 request, 2 response) | flags``
  then a ``ttrpc.Request`` / ``ttrpc.Response`` protobuf.

The plugin registers (``Runtime.RegisterPlugin``), answers ``Configure`` with the events it wants
(RunPodSandbox, StopPodSandbox, CreateContainer), and reconnects when containerd restarts. The
``Synchronize`` list that follows each connection removes the specs of sandboxes that stopped
while the plugin was not connected.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
import threading
import time
from collections.abc import Callable
from concurrent import futures
from pathlib import Path
from typing import Any

from enforcement.cdi import KIND, POD_UID_ANNOTATION, SETTLE_S, qualified
from enforcement.handoff import HandoffError, RecordLookup, Writer
from enforcement.kubeletapi.stubs import nri_pb2, ttrpc_pb2
from enforcement.pods import ManagedPod
from packing.record import ANNOTATION, AllocationRecord

log = logging.getLogger(__name__)

PLUGIN_CONN, RUNTIME_CONN = 1, 2
REQUEST, RESPONSE = 1, 2
PLUGIN_SERVICE = "nri.pkg.api.v1alpha1.Plugin"
RUNTIME_SERVICE = "nri.pkg.api.v1alpha1.Runtime"
RUN_POD_SANDBOX, STOP_POD_SANDBOX, CREATE_CONTAINER = 1, 2, 4
EVENTS = (1 << (RUN_POD_SANDBOX - 1)) | (1 << (STOP_POD_SANDBOX - 1)) | (1 << (CREATE_CONTAINER - 1))
NAME, INDEX = "gpuslice", "50"
MAX_MESSAGE = 4 << 20
UNIMPLEMENTED = 12


POD_PREFIX = "pod-"  # the spec devices of this path (DRA's are claim-*, the device plugin's tokens)


def pod_device(pod_uid: str) -> str:
    return POD_PREFIX + pod_uid


class NriError(RuntimeError):
    pass


class _Conn:
    """One NRI connection: the mux trunk, a reader thread, ttrpc messages on conns 1 and 2."""

    def __init__(self, sock: socket.socket, handle: Callable[[str, bytes], bytes]) -> None:
        self.sock = sock
        self.handle = handle
        self._wlock = threading.Lock()
        self._bufs = {PLUGIN_CONN: bytearray(), RUNTIME_CONN: bytearray()}
        self._replies: dict[int, futures.Future[Any]] = {}
        self._next_stream = 1
        self._pool = futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="gpuslice-nri")
        self.closed = threading.Event()

    def _send(self, conn: int, stream: int, kind: int, payload: bytes) -> None:
        message = struct.pack(">IIBB", len(payload), stream, kind, 0) + payload
        with self._wlock:
            self.sock.sendall(struct.pack(">II", conn, len(message)) + message)

    def call(self, method: str, payload: bytes, timeout: float = 5.0) -> bytes:
        """Call the runtime's ``method`` (conn 2); its response payload, or NriError."""
        with self._wlock:
            stream, self._next_stream = self._next_stream, self._next_stream + 2  # client streams are odd
        reply: futures.Future[Any] = futures.Future()
        self._replies[stream] = reply
        req = ttrpc_pb2.Request(service=RUNTIME_SERVICE, method=method, payload=payload,
                                timeout_nano=int(timeout * 1e9))
        self._send(RUNTIME_CONN, stream, REQUEST, req.SerializeToString())
        try:
            resp: Any = reply.result(timeout)
        except futures.TimeoutError:
            raise NriError(f"runtime did not answer {method} within {timeout} s") from None
        if resp.status.code != 0:
            raise NriError(f"runtime refused {method}: {resp.status.message}")
        return bytes(resp.payload)

    def serve(self) -> None:
        """Read until the runtime closes the connection (run in a thread)."""
        try:
            while True:
                head = self._read(8)
                conn, size = struct.unpack(">II", head)
                data = self._read(size)
                buf = self._bufs.get(conn)
                if buf is None:
                    continue  # a connection we do not use
                buf += data
                while len(buf) >= 10:
                    length, stream, kind, _ = struct.unpack(">IIBB", buf[:10])
                    if length > MAX_MESSAGE:
                        raise NriError(f"ttrpc message of {length} bytes")
                    if len(buf) < 10 + length:
                        break
                    payload = bytes(buf[10 : 10 + length])
                    del buf[: 10 + length]
                    self._dispatch(conn, stream, kind, payload)
        except (OSError, NriError, EOFError) as e:
            if not self.closed.is_set():
                log.info("NRI connection closed: %s", e)
        finally:
            self.close()

    def _read(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise EOFError("runtime closed the NRI socket")
            out += chunk
        return bytes(out)

    def _dispatch(self, conn: int, stream: int, kind: int, payload: bytes) -> None:
        if conn == RUNTIME_CONN and kind == RESPONSE:
            reply = self._replies.pop(stream, None)
            if reply is not None:
                resp = ttrpc_pb2.Response()
                resp.ParseFromString(payload)
                reply.set_result(resp)
        elif conn == PLUGIN_CONN and kind == REQUEST:
            req = ttrpc_pb2.Request()
            req.ParseFromString(payload)
            self._pool.submit(self._answer, stream, req)

    def _answer(self, stream: int, req: Any) -> None:
        resp = ttrpc_pb2.Response()
        try:
            if req.service != PLUGIN_SERVICE:
                raise NotImplementedError(req.service)
            resp.payload = self.handle(req.method, bytes(req.payload))
        except NotImplementedError as e:
            resp.status.code, resp.status.message = UNIMPLEMENTED, f"gpuslice NRI plugin: {e} not implemented"
        except Exception as e:  # a failure is the runtime's to report, never a silent empty answer
            log.exception("NRI %s failed", req.method)
            resp.status.code, resp.status.message = 13, f"gpuslice NRI plugin: {req.method}: {e}"
        with contextlib.suppress(OSError):
            self._send(PLUGIN_CONN, stream, RESPONSE, resp.SerializeToString())

    def close(self) -> None:
        self.closed.set()
        with contextlib.suppress(OSError):
            self.sock.close()
        self._pool.shutdown(wait=False)
        for reply in self._replies.values():
            reply.cancel()


class NriPlugin:
    """Hands annotation-only pods their slice at container creation (see the module docstring)."""

    def __init__(self, socket_path: Path, writer: Writer, lookup: RecordLookup) -> None:
        self.socket_path = socket_path
        self.writer = writer
        self.lookup = lookup
        self.connected = threading.Event()
        self.ever_connected = False
        self.handed = 0
        self.skipped = 0
        self.last_error = ""
        self._seen: set[str] = set()  # pod UIDs of a Synchronize still in progress

    # ---- the plugin's answers -------------------------------------------------------------------
    def handle(self, method: str, payload: bytes) -> bytes:
        if method == "Configure":
            return bytes(nri_pb2.ConfigureResponse(events=EVENTS).SerializeToString())
        if method == "Synchronize":
            req = nri_pb2.SynchronizeRequest()
            req.ParseFromString(payload)
            self._synchronized(req)
            return bytes(nri_pb2.SynchronizeResponse(more=req.more).SerializeToString())
        if method == "CreateContainer":
            req = nri_pb2.CreateContainerRequest()
            req.ParseFromString(payload)
            resp = nri_pb2.CreateContainerResponse(adjust=self.adjust(req.pod, req.container))
            return bytes(resp.SerializeToString())
        if method == "StateChange":
            event = nri_pb2.StateChangeEvent()
            event.ParseFromString(payload)
            if event.event == RUN_POD_SANDBOX and event.pod.uid and ANNOTATION in event.pod.annotations:
                try:  # ahead of its containers: the runtime's CDI cache has seen it by their creation
                    self._write(event.pod)
                except HandoffError as e:
                    log.warning("NRI: %s", e)  # said again, and refused, at container creation
            if event.event == STOP_POD_SANDBOX and event.pod.uid:  # no container of it is created again
                self.writer.remove(pod_device(event.pod.uid))
            return bytes(nri_pb2.Empty().SerializeToString())
        if method == "Shutdown":
            return bytes(nri_pb2.Empty().SerializeToString())
        raise NotImplementedError(method)

    def _synchronized(self, req: Any) -> None:
        """The runtime lists its pod sandboxes on (re)connection, in chunks until ``more`` is false:
        a ``pod-<uid>`` spec of a sandbox no longer there (stopped while the agent was away) goes,
        and the pod's limiter state directory with it."""
        self._seen.update(p.uid for p in req.pods if p.uid)
        if req.more:
            return
        seen, self._seen = self._seen, set()
        for spec in self.writer.specs.written():
            if spec.device.startswith(POD_PREFIX) and spec.device.removeprefix(POD_PREFIX) not in seen:
                self.writer.remove(spec.device)
                log.info("NRI: removed %s, whose pod sandbox is gone", qualified(spec.device))

    def adjust(self, pod: Any, container: Any) -> Any:
        """The adjustment for one container: our CDI device, or nothing (not ours, or handed already)."""
        adjust = nri_pb2.ContainerAdjustment()
        value = pod.annotations.get(ANNOTATION)
        if value is None:
            return adjust
        already = any(e.startswith("GPUSLICE_POD_UID=") for e in container.env) or any(
            d.name.startswith(KIND + "=") for d in container.CDI_devices)
        if already:
            self.skipped += 1
            return adjust
        spec = self.writer.specs.read(pod_device(pod.uid))
        if ((spec or {}).get("annotations") or {}).get(POD_UID_ANNOTATION) == pod.uid:
            record = self._pod(pod).record  # written at sandbox start: long seen by the runtime's cache
        else:
            record = self._write(pod)
            time.sleep(SETTLE_S)  # just written: give the runtime's CDI cache time to see it
        adjust.CDI_devices.add(name=qualified(pod_device(pod.uid)))
        self.handed += 1
        log.info("NRI: container %s of pod %s/%s gets %s: GPU %s", container.name, pod.namespace, pod.name,
                 qualified(pod_device(pod.uid)), ",".join(record.gpus))
        return adjust

    def _pod(self, pod: Any) -> ManagedPod:
        """The sandbox's pod with the record the extender wrote for it here (HandoffError, the refusal
        said, otherwise): as the node's pod watch shows it, else as the API does."""
        return self.lookup.by_uid(pod.uid, pod.namespace, pod.name)

    def _write(self, pod: Any) -> AllocationRecord:
        """Write the pod's spec from its record; HandoffError if it has none it may use."""
        managed = self._pod(pod)
        self.writer.write(pod_device(pod.uid), managed)
        return managed.record

    # ---- the connection -------------------------------------------------------------------------
    def connect_once(self) -> _Conn:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(str(self.socket_path))
        except OSError:
            sock.close()
            raise
        conn = _Conn(sock, self.handle)
        threading.Thread(target=conn.serve, name="gpuslice-nri-reader", daemon=True).start()
        conn.call("RegisterPlugin", nri_pb2.RegisterPluginRequest(plugin_name=NAME, plugin_idx=INDEX)
                  .SerializeToString())
        log.info("registered NRI plugin %s-%s on %s", INDEX, NAME, self.socket_path)
        return conn

    def run(self, stop: threading.Event, retry_s: float = 2.0) -> None:
        """Stay registered with the runtime until ``stop`` (reconnect after a runtime restart)."""
        while not stop.is_set():
            try:
                conn = self.connect_once()
            except (OSError, NriError) as e:
                self.connected.clear()
                if str(e) != self.last_error:
                    log.warning("NRI socket %s: %s; retrying every %.0f s", self.socket_path, e, retry_s)
                self.last_error = str(e)
                stop.wait(retry_s)
                continue
            self.connected.set()
            self.ever_connected = True
            self.last_error = ""
            while not stop.is_set() and not conn.closed.wait(0.5):
                pass
            conn.close()
            self.connected.clear()
            self.last_error = "connection closed"
