"""The NRI plugin over its wire protocol on a unix socket, against a stand-in runtime.

The stand-in speaks what containerd speaks (NRI's mux frames, ttrpc messages, NRI v1alpha1
payloads); the real containerd runs the same plugin in ``tests/e2e_node``.
"""

from __future__ import annotations

import shutil
import socket
import struct
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from enforcement.cdi import SETTLE_S, SpecDir
from enforcement.edits import ContainerEdits, EditsConfig
from enforcement.events import RecordingEventSink
from enforcement.handoff import RecordLookup, Writer
from enforcement.kubeletapi.stubs import nri_pb2, ttrpc_pb2
from enforcement.nri import EVENTS, NriPlugin, pod_device
from enforcement.pods import PodIndex
from enforcement.refusals import REFUSED, Refusals
from packing.record import ANNOTATION, AllocationRecord
from tests.unit.fake_limiter import installed

GPU = "GPU-aaaaaaaa-0000-4000-8000-000000000000"
UID = "11111111-2222-4333-8444-555555555555"


class Runtime:
    """A stand-in for containerd's NRI side: accepts the plugin, calls it, records its answers."""

    def __init__(self, path: Path) -> None:
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(1)
        self.conn: socket.socket | None = None
        self.registered: Any = None
        self._stream = 1

    def _read(self, n: int) -> bytes:
        assert self.conn is not None
        out = b""
        while len(out) < n:
            chunk = self.conn.recv(n - len(out))
            assert chunk, "plugin closed the connection"
            out += chunk
        return out

    def _message(self) -> tuple[int, int, int, bytes]:
        conn_id, size = struct.unpack(">II", self._read(8))
        frame = self._read(size)
        length, stream, kind, _ = struct.unpack(">IIBB", frame[:10])
        assert len(frame) == 10 + length  # the plugin sends one message per frame
        return conn_id, stream, kind, frame[10:]

    def _send(self, conn_id: int, stream: int, kind: int, payload: bytes) -> None:
        assert self.conn is not None
        message = struct.pack(">IIBB", len(payload), stream, kind, 0) + payload
        # split the message over two frames: the plugin must reassemble the stream
        cut = len(message) // 2
        for part in (message[:cut], message[cut:]):
            self.conn.sendall(struct.pack(">II", conn_id, len(part)) + part)

    def accept(self) -> None:
        self.conn, _ = self.server.accept()
        conn_id, stream, kind, payload = self._message()
        req = ttrpc_pb2.Request()
        req.ParseFromString(payload)
        assert (conn_id, kind, req.service, req.method) == (2, 1, "nri.pkg.api.v1alpha1.Runtime", "RegisterPlugin")
        self.registered = nri_pb2.RegisterPluginRequest()
        self.registered.ParseFromString(req.payload)
        self._send(2, stream, 2, ttrpc_pb2.Response(payload=nri_pb2.Empty().SerializeToString()).SerializeToString())

    def call(self, method: str, message: Any, reply: Any) -> tuple[Any, Any]:
        """Call the plugin; (the reply message, the ttrpc status)."""
        stream, self._stream = self._stream, self._stream + 2
        req = ttrpc_pb2.Request(service="nri.pkg.api.v1alpha1.Plugin", method=method,
                                payload=message.SerializeToString())
        self._send(1, stream, 1, req.SerializeToString())
        conn_id, got_stream, kind, payload = self._message()
        assert (conn_id, got_stream, kind) == (1, stream, 2)
        resp = ttrpc_pb2.Response()
        resp.ParseFromString(payload)
        reply.ParseFromString(resp.payload)
        return reply, resp.status

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.server.close()


class Cluster:
    """The API server's pods (the plugin reads a sandbox's pod there when the node's watch has not shown it)."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}

    def add(self, sandbox: Any, asks: str | None = "v100-25") -> None:
        """The pod of ``sandbox`` as the API shows it: its annotations, asking for ``asks`` by annotation."""
        annotations = {**dict(sandbox.annotations), **({"gpuslice.io/product": asks} if asks else {})}
        self.objects[f"/api/v1/namespaces/{sandbox.namespace}/pods/{sandbox.name}"] = {
            "metadata": {"uid": sandbox.uid, "name": sandbox.name, "namespace": sandbox.namespace,
                         "annotations": annotations}, "spec": {"nodeName": "node-a"}}

    def get(self, path: str) -> dict[str, Any] | None:
        return self.objects.get(path)


CLUSTER = Cluster()


@pytest.fixture
def setup() -> Iterator[tuple[Runtime, NriPlugin, SpecDir, threading.Event]]:
    tmp = Path(tempfile.mkdtemp(prefix="gs-nri-"))
    runtime = Runtime(tmp / "nri.sock")
    specs = SpecDir(tmp / "cdi")
    limiter = installed(tmp)
    CLUSTER.objects.clear()
    CLUSTER.add(pod())
    index = PodIndex("node-a", Refusals("node-a", RecordingEventSink()))
    plugin = NriPlugin(tmp / "nri.sock", Writer(specs, lambda: {GPU: 0}, EditsConfig(dev_root=tmp, limiter=limiter)),
                       RecordLookup(index, CLUSTER))  # type: ignore[arg-type]
    stop = threading.Event()
    thread = threading.Thread(target=plugin.run, args=(stop,), daemon=True)
    thread.start()
    runtime.accept()
    assert plugin.connected.wait(5)
    yield runtime, plugin, specs, stop
    stop.set()
    runtime.close()
    thread.join(5)
    shutil.rmtree(tmp, ignore_errors=True)


def pod(node: str = "node-a", record: str | None = None) -> Any:
    value = record if record is not None else AllocationRecord(UID, node, (GPU,), "v100-25", 250, 8192).encode()
    return nri_pb2.PodSandbox(id="sb", name="trainer", uid=UID, namespace="ml", annotations={ANNOTATION: value})


def test_registers_configures_and_hands_an_annotation_pod_its_slice(
        setup: tuple[Runtime, NriPlugin, SpecDir, threading.Event]) -> None:
    runtime, plugin, specs, _ = setup
    assert plugin.handed == 0
    assert (runtime.registered.plugin_name, runtime.registered.plugin_idx) == ("gpuslice", "50")
    conf, status = runtime.call("Configure", nri_pb2.ConfigureRequest(runtime_name="containerd"),
                                nri_pb2.ConfigureResponse())
    assert status.code == 0 and conf.events == EVENTS == 0b1011  # CreateContainer, Stop- and RunPodSandbox
    sync, _ = runtime.call("Synchronize", nri_pb2.SynchronizeRequest(more=False), nri_pb2.SynchronizeResponse())
    assert not sync.more
    # the spec is written when the sandbox starts, ahead of the containers
    runtime.call("StateChange", nri_pb2.StateChangeEvent(event=1, pod=pod()), nri_pb2.Empty())
    assert specs.read(pod_device(UID)) is not None
    state = specs.root.parent / "limiter" / "state" / UID
    assert state.is_dir()  # the limiter's state directory, ahead of the containers too
    req = nri_pb2.CreateContainerRequest(pod=pod(), container=nri_pb2.Container(name="main", env=["PATH=/bin"]))
    resp, status = runtime.call("CreateContainer", req, nri_pb2.CreateContainerResponse())
    assert status.code == 0
    assert [d.name for d in resp.adjust.CDI_devices] == [f"gpuslice.io/slice=pod-{UID}"] and plugin.handed == 1
    spec = specs.read(pod_device(UID))
    assert spec is not None and f"NVIDIA_VISIBLE_DEVICES={GPU}" in spec["devices"][0]["containerEdits"]["env"]
    stopped = nri_pb2.StateChangeEvent(event=2, pod=pod())
    runtime.call("StateChange", stopped, nri_pb2.Empty())
    assert specs.read(pod_device(UID)) is None and not state.exists()


def test_a_container_whose_sandbox_start_it_missed_waits_for_the_runtime_cache(
        setup: tuple[Runtime, NriPlugin, SpecDir, threading.Event]) -> None:
    runtime, plugin, specs, _ = setup
    started = time.monotonic()
    assert plugin.handed == 0
    req = nri_pb2.CreateContainerRequest(pod=pod(), container=nri_pb2.Container(name="main"))
    resp, status = runtime.call("CreateContainer", req, nri_pb2.CreateContainerResponse())
    assert status.code == 0 and [d.name for d in resp.adjust.CDI_devices] == [f"gpuslice.io/slice=pod-{UID}"]
    assert specs.read(pod_device(UID)) is not None and time.monotonic() - started >= SETTLE_S


def test_leaves_pods_that_are_not_ours_or_already_handed(
        setup: tuple[Runtime, NriPlugin, SpecDir, threading.Event]) -> None:
    runtime, plugin, specs, _ = setup
    plain = nri_pb2.PodSandbox(id="sb", name="web", uid=UID, namespace="ml")
    for p, c in ((plain, nri_pb2.Container(name="main")),
                 (pod(), nri_pb2.Container(name="main", env=[f"GPUSLICE_POD_UID={UID}"])),
                 (pod(), nri_pb2.Container(name="main", CDI_devices=[nri_pb2.CDIDevice(name="gpuslice.io/slice=x")]))):
        resp, status = runtime.call("CreateContainer", nri_pb2.CreateContainerRequest(pod=p, container=c),
                                    nri_pb2.CreateContainerResponse())
        assert status.code == 0 and not list(resp.adjust.CDI_devices)
    assert specs.written() == [] and plugin.skipped == 2


def sandbox(record: str, uid: str = UID) -> Any:
    return nri_pb2.PodSandbox(id="sb", name="copycat", uid=uid, namespace="tenant", annotations={ANNOTATION: record})


COPY = AllocationRecord("a-running-slice-pod", "node-a", (GPU,), "v100-25", 250, 8192).encode()
OWN = AllocationRecord(UID, "node-a", (GPU,), "v100-25", 250, 8192).encode()


@pytest.mark.parametrize("bad, message, reason, asks", [
    (pod(node="node-b"), "names node 'node-b'", "other-node", "v100-25"),
    (pod(record="{nope"), "gpuslice.io/allocation annotation is unreadable", "unreadable", "v100-25"),
    (sandbox(COPY), "names claim a-running-slice-pod, not this pod", "other-pod", "v100-25"),  # another pod's
    (sandbox(OWN), "asks for no v100-25", "not-asked", None),  # its own uid, patched on; it asks for nothing
])
def test_a_record_it_may_not_honour_fails_the_container_creation_and_is_told(
        setup: tuple[Runtime, NriPlugin, SpecDir, threading.Event], bad: Any, message: str, reason: str,
        asks: str | None) -> None:
    runtime, plugin, specs, _ = setup
    CLUSTER.add(bad, asks)
    refusals = plugin.lookup.index.refusals
    assert refusals is not None
    events = refusals.events
    assert isinstance(events, RecordingEventSink)
    runtime.call("StateChange", nri_pb2.StateChangeEvent(event=1, pod=bad), nri_pb2.Empty())  # the sandbox starts
    for _ in range(2):  # the kubelet retries the creation: refused each time, told once
        _, status = runtime.call("CreateContainer", nri_pb2.CreateContainerRequest(pod=bad, container=nri_pb2.Container(
            name="main")), nri_pb2.CreateContainerResponse())
        assert status.code != 0 and message in status.message  # the runtime fails it; the kubelet retries
    assert specs.written() == [] and plugin.handed == 0
    assert not (specs.root.parent / "limiter" / "state" / UID).exists()
    assert [(e.reason, e.pod, e.pod_uid) for e in events.events] == [(REFUSED, bad.name, UID)]
    assert message in events.events[0].message
    assert refusals.totals()[reason] == 1
    _, status = runtime.call("UpdateContainer", nri_pb2.Empty(), nri_pb2.Empty())
    assert status.code == 12  # unimplemented, said so


def test_synchronize_removes_the_specs_of_sandboxes_gone_while_away(
        setup: tuple[Runtime, NriPlugin, SpecDir, threading.Event]) -> None:
    """A sandbox stopped while the plugin was not connected: the runtime's Synchronize list (in
    chunks) no longer names it, so its spec and its pod's limiter state directory go; the rest stay."""
    runtime, _, specs, _ = setup
    gone = "22222222-3333-4444-8555-666666666666"
    runtime.call("StateChange", nri_pb2.StateChangeEvent(event=1, pod=pod()), nri_pb2.Empty())
    left = pod()
    left.uid = gone
    left.annotations[ANNOTATION] = AllocationRecord(gone, "node-a", (GPU,), "v100-25", 250, 8192).encode()
    left.name = "left"
    CLUSTER.add(left)
    runtime.call("StateChange", nri_pb2.StateChangeEvent(event=1, pod=left), nri_pb2.Empty())
    state = specs.root.parent / "limiter" / "state"
    assert (state / gone).is_dir() and (state / UID).is_dir()
    specs.write("claim-x", ContainerEdits(("X=1",)), "some-pod")  # another path's spec: never NRI's to remove
    runtime.call("Synchronize", nri_pb2.SynchronizeRequest(pods=[pod()], more=True), nri_pb2.SynchronizeResponse())
    assert specs.read(pod_device(gone)) is not None  # not before the last chunk
    runtime.call("Synchronize", nri_pb2.SynchronizeRequest(more=False), nri_pb2.SynchronizeResponse())
    assert sorted(s.device for s in specs.written()) == ["claim-x", pod_device(UID)]
    assert not (state / gone).exists() and (state / UID).is_dir()
