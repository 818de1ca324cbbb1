"""The kubelet side over the real gRPC protocol on unix sockets: DRA, device plugin, PodResources.

The kubelet's end is played by the generated client stubs (and, for the device plugin's
registration and PodResources, by small servers of the kubelet's services), all on sockets in a
temporary directory. The real kubelet runs these same paths in ``tests/e2e_node``.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from enforcement.cdi import SpecDir
from enforcement.deviceplugin.handoff import Holder, PodResourcesClient, TokenHandoff
from enforcement.deviceplugin.plugin import DevicePlugins, ProductPlugin
from enforcement.dra.checkpoint import Checkpoint
from enforcement.dra.plugin import DraDriver, DraServer
from enforcement.dra.slices import SLICES, SlicePublisher
from enforcement.edits import ContainerEdits, EditsConfig
from enforcement.handoff import RecordLookup, Writer
from enforcement.kubeletapi.stubs import (
    deviceplugin_pb2,
    deviceplugin_pb2_grpc,
    dra_pb2,
    dra_pb2_grpc,
    pluginregistration_pb2,
    pluginregistration_pb2_grpc,
    podresources_pb2,
    podresources_pb2_grpc,
)
from enforcement.pods import PodIndex
from packing.inventory import Card
from packing.kube.client import KubeError
from packing.products import load_catalog
from packing.record import ANNOTATION, AllocationRecord
from tests.unit.fake_limiter import installed

NODE = "node-a"
GPU_A, GPU_B = "GPU-aaaaaaaa-0000-4000-8000-000000000000", "GPU-bbbbbbbb-0000-4000-8000-000000000000"
CARDS = [Card(GPU_A, 0, "Tesla-V100-SXM2-32GB", 32768), Card(GPU_B, 1, "Tesla-V100-SXM2-32GB", 32768)]
POD_UID = "11111111-2222-4333-8444-555555555555"
CLAIM_UID = "99999999-8888-4777-8666-555555555555"


class MemoryApi:
    """The API server as a dict of objects by path, behind the two calls of ``Kube`` the node side makes."""

    def __init__(self) -> None:
        self.objects: dict[str, dict[str, Any]] = {}

    def get(self, path: str) -> dict[str, Any] | None:
        return self.objects.get(path)

    def request(self, method: str, path: str, body: Any = None, **_: Any) -> dict[str, Any]:
        if method == "POST":
            self.objects[f"{path}/{body['metadata']['name']}"] = body
        elif method == "PUT":
            self.objects[path] = body
        elif method == "DELETE":
            self.objects.pop(path, None)
        else:
            raise AssertionError(f"{method} {path}")
        return dict(body or {})


def managed_pod(name: str = "trainer", uid: str = POD_UID, gpu: str = GPU_A,
                product: str = "v100-25") -> dict[str, Any]:
    milli, mib = {"v100-25": (250, 8192), "v100-50": (500, 16384)}[product]
    record = AllocationRecord(uid, NODE, (gpu,), product, milli, mib)
    return {"metadata": {"uid": uid, "name": name, "namespace": "ml", "annotations": {ANNOTATION: record.encode()}},
            "spec": {"nodeName": NODE, "resourceClaims": [{"name": "gpu", "resourceClaimName": "gpu"}]},
            "status": {"phase": "Pending"}}


def claim_obj(reserved: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "gpu", "namespace": "ml", "uid": CLAIM_UID},
            "status": {"allocation": {"devices": {"results": [
                {"request": "slice", "driver": "gpuslice.io", "pool": NODE, "device": "v100-25-3"}]}},
                "reservedFor": reserved if reserved is not None else
                [{"resource": "pods", "name": "trainer", "uid": POD_UID}]}}


@pytest.fixture
def world() -> Iterator[dict[str, Any]]:
    tmp_path = Path(tempfile.mkdtemp(prefix="gs-"))  # short: a unix socket path has at most 107 bytes
    index = PodIndex(NODE)
    index.replace([managed_pod()])
    api = MemoryApi()
    api.objects["/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/gpu"] = claim_obj()
    specs = SpecDir(tmp_path / "cdi")
    limiter = installed(tmp_path)
    writer = Writer(specs, lambda: {GPU_A: 0, GPU_B: 1}, EditsConfig(dev_root=tmp_path / "dev", limiter=limiter))
    yield {"index": index, "api": api, "specs": specs, "writer": writer, "lookup": RecordLookup(index, api),
           "tmp": tmp_path, "pod_state": Path(limiter.host.state_root) / POD_UID}
    shutil.rmtree(tmp_path, ignore_errors=True)


def dra(world: dict[str, Any]) -> tuple[DraDriver, DraServer]:
    checkpoint = Checkpoint(world["tmp"] / "state" / "dra-checkpoint.json")
    driver = DraDriver(world["api"], world["lookup"], world["writer"], checkpoint)
    return driver, DraServer(driver, world["tmp"] / "kubelet").start()


def test_dra_registration_and_prepare_unprepare_over_unix_sockets(world: dict[str, Any]) -> None:
    driver, server = dra(world)
    try:
        with grpc.insecure_channel(f"unix://{server.registration_socket}") as ch:
            info = pluginregistration_pb2_grpc.RegistrationStub(ch).GetInfo(pluginregistration_pb2.InfoRequest())
            assert (info.type, info.name, list(info.supported_versions)) == ("DRAPlugin", "gpuslice.io",
                                                                             ["v1.DRAPlugin"])
            assert info.endpoint == str(server.endpoint)
            pluginregistration_pb2_grpc.RegistrationStub(ch).NotifyRegistrationStatus(
                pluginregistration_pb2.RegistrationStatus(plugin_registered=True))
        assert server.registration.registered.is_set()
        with grpc.insecure_channel(f"unix://{info.endpoint}") as ch:
            stub = dra_pb2_grpc.DRAPluginStub(ch)
            claim = dra_pb2.Claim(namespace="ml", name="gpu", uid=CLAIM_UID)
            first = stub.NodePrepareResources(dra_pb2.NodePrepareResourcesRequest(claims=[claim]))
            again = stub.NodePrepareResources(dra_pb2.NodePrepareResourcesRequest(claims=[claim]))
            got = first.claims[CLAIM_UID]
            assert got.error == ""
            assert [(list(d.request_names), d.pool_name, d.device_name, list(d.cdi_device_ids)) for d in got.devices] \
                == [(["slice"], NODE, "v100-25-3", [f"gpuslice.io/slice=claim-{CLAIM_UID}"])]
            assert again == first and driver.prepared_count == 1  # idempotent: prepared once
            spec = world["specs"].read(f"claim-{CLAIM_UID}")
            assert spec is not None
            env = spec["devices"][0]["containerEdits"]["env"]
            assert f"NVIDIA_VISIBLE_DEVICES={GPU_A}" in env and "GPUSLICE_SLICE_MEMORY_MIB=8192" in env
            assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=8192M" in env
            assert "GPUSLICE_SLICE_STATE_DIR=/run/gpuslice/limiter" in env
            assert spec["annotations"]["gpuslice.io/pod-uid"] == POD_UID
            # the limiter's state directory exists, empty and open to every user, before the kubelet goes on
            state = world["pod_state"]
            assert state.is_dir() and not list(state.iterdir()) and state.stat().st_mode & 0o777 == 0o777
            assert {m["containerPath"]: m["hostPath"] for m in spec["devices"][0]["containerEdits"]["mounts"]}[
                "/run/gpuslice/limiter"] == str(state)
            out = stub.NodeUnprepareResources(dra_pb2.NodeUnprepareResourcesRequest(claims=[claim]))
            assert out.claims[CLAIM_UID].error == ""
            assert world["specs"].read(f"claim-{CLAIM_UID}") is None and driver.checkpoint.get(CLAIM_UID) is None
            assert not state.exists()  # released with the claim
            # unprepare twice (the kubelet retries after a restart): still fine
            out = stub.NodeUnprepareResources(dra_pb2.NodeUnprepareResourcesRequest(claims=[claim]))
            assert out.claims[CLAIM_UID].error == ""
    finally:
        server.stop()


@pytest.mark.parametrize("case, message", [
    ("unknown-claim", "ResourceClaim ml/nope does not exist"),
    ("no-record", "has no gpuslice allocation record"),
    ("two-pods", "serves exactly one pod"),
    ("other-node", "allocation record names node 'node-b'"),
    ("copied", "names claim 6b0c0000-a-running-slice-pod, not this pod"),  # read from the API: the watch lags
    ("copied-watched", "names claim 6b0c0000-a-running-slice-pod, not this pod"),  # refused by the watch already
])
def test_dra_unknown_claim_or_pod_is_a_clear_error(world: dict[str, Any], case: str, message: str) -> None:
    name = "gpu"
    if case == "unknown-claim":
        name = "nope"
    elif case == "no-record":
        world["index"].replace([])
    elif case == "two-pods":
        world["api"].objects["/apis/resource.k8s.io/v1/namespaces/ml/resourceclaims/gpu"] = claim_obj(
            [{"resource": "pods", "name": "a", "uid": POD_UID}, {"resource": "pods", "name": "b", "uid": "x"}])
    elif case == "other-node":
        pod = managed_pod()
        record = AllocationRecord(POD_UID, "node-b", (GPU_A,), "v100-25", 250, 8192)
        pod["metadata"]["annotations"][ANNOTATION] = record.encode()
        world["api"].objects["/api/v1/namespaces/ml/pods/trainer"] = pod
        world["index"].replace([])
    elif case.startswith("copied"):  # a tenant's pod carrying a copy of a running slice pod's record
        pod = managed_pod()
        copy = AllocationRecord("6b0c0000-a-running-slice-pod", NODE, (GPU_A,), "v100-25", 250, 8192)
        pod["metadata"]["annotations"][ANNOTATION] = copy.encode()
        world["api"].objects["/api/v1/namespaces/ml/pods/trainer"] = pod
        world["index"].replace([pod] if case == "copied-watched" else [])
    driver, server = dra(world)
    try:
        with grpc.insecure_channel(f"unix://{server.endpoint}") as ch:
            resp = dra_pb2_grpc.DRAPluginStub(ch).NodePrepareResources(dra_pb2.NodePrepareResourcesRequest(
                claims=[dra_pb2.Claim(namespace="ml", name=name, uid=CLAIM_UID)]))
        assert message in resp.claims[CLAIM_UID].error
        assert not list(resp.claims[CLAIM_UID].devices) and driver.checkpoint.claims() == []
        assert world["specs"].written() == [] and not world["pod_state"].exists()  # nothing half-done
    finally:
        server.stop()


def test_dra_checkpoint_survives_an_agent_restart(world: dict[str, Any]) -> None:
    driver, server = dra(world)
    first = driver.prepare("ml", "gpu", CLAIM_UID)
    server.stop()
    # the API forgets the claim and the pod: a restarted agent answers from its checkpoint alone
    world["api"].objects.clear()
    world["index"].replace([])
    driver2, server2 = dra(world)
    try:
        assert driver2.prepare("ml", "gpu", CLAIM_UID) == first and driver2.prepared_count == 0
        assert world["pod_state"].is_dir()
        assert driver2.unprepare(CLAIM_UID) and not driver2.unprepare(CLAIM_UID)
        assert world["specs"].written() == [] and not world["pod_state"].exists()
    finally:
        server2.stop()


# ---- device plugin ---------------------------------------------------------------------------------

class FakeKubelet:
    """The kubelet's device plugin Registration and its PodResources List, on unix sockets."""

    def __init__(self, plugin_dir: Path, pod_resources: Path) -> None:
        self.registered: list[Any] = []
        self.pods: list[Any] = []
        self.servers: list[grpc.Server] = []
        outer = self

        class Registration(deviceplugin_pb2_grpc.RegistrationServicer):  # type: ignore[misc]
            def Register(self, request: Any, context: Any) -> Any:
                outer.registered.append(request)
                return deviceplugin_pb2.Empty()

        class Lister(podresources_pb2_grpc.PodResourcesListerServicer):  # type: ignore[misc]
            def List(self, request: Any, context: Any) -> Any:
                return podresources_pb2.ListPodResourcesResponse(pod_resources=outer.pods)

        registration = deviceplugin_pb2_grpc.add_RegistrationServicer_to_server
        for sock, add, servicer in ((plugin_dir / "kubelet.sock", registration, Registration()),
                                    (pod_resources, podresources_pb2_grpc.add_PodResourcesListerServicer_to_server,
                                     Lister())):
            sock.parent.mkdir(parents=True, exist_ok=True)
            server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
            add(servicer, server)
            server.add_insecure_port(f"unix://{sock}")
            server.start()
            self.servers.append(server)

    def hold(self, namespace: str, pod: str, resource: str, tokens: list[str]) -> None:
        self.pods.append(podresources_pb2.PodResources(name=pod, namespace=namespace, containers=[
            podresources_pb2.ContainerResources(name="main", devices=[
                podresources_pb2.ContainerDevices(resource_name=resource, device_ids=tokens)])]))

    def stop(self) -> None:
        for s in self.servers:
            s.stop(0)


@pytest.fixture
def plugins(world: dict[str, Any]) -> Iterator[tuple[DevicePlugins, FakeKubelet, TokenHandoff]]:
    catalog = load_catalog()
    plugin_dir = world["tmp"] / "device-plugins"
    kubelet = FakeKubelet(plugin_dir, world["tmp"] / "pod-resources" / "kubelet.sock")
    lister = PodResourcesClient(world["tmp"] / "pod-resources" / "kubelet.sock")
    handoff = TokenHandoff(lister.held, world["lookup"], world["writer"], [p.resource for p in catalog.products])
    dps = DevicePlugins([ProductPlugin(p, catalog, handoff, plugin_dir, lambda: CARDS) for p in catalog.products],
                        plugin_dir)
    dps.update(CARDS)
    dps.ensure()
    yield dps, kubelet, handoff
    for p in dps.plugins:
        p.stop_serving()
    kubelet.stop()


def quarter(plugins: DevicePlugins) -> ProductPlugin:
    return next(p for p in plugins.plugins if p.resource == "gpuslice.io/v100-25")


def test_device_plugin_registers_lists_prefers_and_allocates(
        world: dict[str, Any], plugins: tuple[DevicePlugins, FakeKubelet, TokenHandoff],
        monkeypatch: pytest.MonkeyPatch) -> None:
    dps, kubelet, handoff = plugins
    assert dps.healthy
    assert sorted(r.resource_name for r in kubelet.registered) == [
        "gpuslice.io/v100-100", "gpuslice.io/v100-25", "gpuslice.io/v100-50"]
    assert all(r.version == "v1beta1" and r.options.get_preferred_allocation_available
               and r.options.pre_start_required for r in kubelet.registered)
    q = quarter(dps)
    with grpc.insecure_channel(f"unix://{q.socket}") as ch:
        stub = deviceplugin_pb2_grpc.DevicePluginStub(ch)
        stream = stub.ListAndWatch(deviceplugin_pb2.Empty())
        first = next(stream)
        assert len(first.devices) == 8 and {d.health for d in first.devices} == {"Healthy"}
        # card A withdrawn: its four tokens turn Unhealthy on the open stream
        dps.update([Card(GPU_A, 0, "Tesla-V100-SXM2-32GB", 32768, healthy=False), CARDS[1]])
        second = next(stream)
        assert sorted(d.health for d in second.devices if GPU_A in d.ID) == ["Unhealthy"] * 4
        stream.cancel()
        dps.update(CARDS)
        ids = [d.ID for d in first.devices]
        a_tokens, b_tokens = [i for i in ids if GPU_A in i], [i for i in ids if GPU_B in i]
        # one quarter already held on card B: best fit prefers B's free tokens over the empty card A
        kubelet.hold("ml", "other", "gpuslice.io/v100-25", [b_tokens[0]])
        handoff.reconcile()
        pref = stub.GetPreferredAllocation(deviceplugin_pb2.PreferredAllocationRequest(container_requests=[
            deviceplugin_pb2.ContainerPreferredAllocationRequest(available_deviceIDs=a_tokens + b_tokens[1:],
                                                                 allocation_size=1)]))
        assert [list(r.deviceIDs) for r in pref.container_responses] == [[b_tokens[1]]]
        with pytest.raises(grpc.RpcError) as err:
            stub.Allocate(deviceplugin_pb2.AllocateRequest(container_requests=[
                deviceplugin_pb2.ContainerAllocateRequest(devices_ids=["v100-25::GPU-nope::0"])]))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "unknown device" in str(err.value.details())
        # a stale spec of the token (its previous holder) is removed by Allocate, before anything else
        world["specs"].write(b_tokens[1], ContainerEdits(("X=old",)), "old-pod")
        resp = stub.Allocate(deviceplugin_pb2.AllocateRequest(container_requests=[
            deviceplugin_pb2.ContainerAllocateRequest(devices_ids=[b_tokens[1]])]))
        assert [c.name for c in resp.container_responses[0].cdi_devices] == [f"gpuslice.io/slice={b_tokens[1]}"]
        assert list(resp.container_responses[0].annotations.values()) == [f"gpuslice.io/slice={b_tokens[1]}"]
        assert world["specs"].read(b_tokens[1]) is None
        # the kubelet's PreStartContainer barrier waits for the spec; a stuck one says why
        prestart: list[Any] = []
        barrier = threading.Thread(target=lambda: prestart.append(stub.PreStartContainer(
            deviceplugin_pb2.PreStartContainerRequest(devices_ids=[b_tokens[1]]))))
        barrier.start()
        barrier.join(0.3)
        assert barrier.is_alive() and not prestart  # no spec yet: the container must not be created
        # the kubelet records the token for ml/trainer, whose record names card A (not the token's B)
        kubelet.hold("ml", "trainer", "gpuslice.io/v100-25", [b_tokens[1]])
        handoff.reconcile()
        barrier.join(5)
        assert len(prestart) == 1
        monkeypatch.setattr("enforcement.deviceplugin.plugin.PRESTART_WAIT_S", 0.2)
        with pytest.raises(grpc.RpcError) as err:
            stub.PreStartContainer(deviceplugin_pb2.PreStartContainerRequest(devices_ids=[b_tokens[2]]))
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    spec = world["specs"].read(b_tokens[1])
    assert spec is not None and spec["annotations"]["gpuslice.io/pod-uid"] == POD_UID
    assert f"NVIDIA_VISIBLE_DEVICES={GPU_A}" in spec["devices"][0]["containerEdits"]["env"]
    assert "GPUSLICE_SLICE_MEMORY_MIB=8192" in spec["devices"][0]["containerEdits"]["env"]
    assert world["pod_state"].is_dir()  # created before PreStartContainer let the container be made
    assert handoff.mismatches == 1 and handoff.pending() == []
    # ml/other has no record: its token gets no spec, and says why
    assert world["specs"].read(b_tokens[0]) is None and "ml/other" in handoff.last_error
    # the holder leaves the kubelet's books: its spec goes, and its state directory with it
    kubelet.pods.clear()
    handoff.reconcile()
    assert world["specs"].read(b_tokens[1]) is None and not world["pod_state"].exists()


def test_device_plugin_reregisters_when_the_kubelet_restarts(
        plugins: tuple[DevicePlugins, FakeKubelet, TokenHandoff]) -> None:
    dps, kubelet, _ = plugins
    assert len(kubelet.registered) == 3
    dps.ensure()
    assert len(kubelet.registered) == 3  # nothing changed: no re-registration
    for p in dps.plugins:  # what a starting kubelet does to the device-plugins directory
        p.socket.unlink()
    dps.ensure()
    assert len(kubelet.registered) == 6 and all(p.socket.exists() for p in dps.plugins)


def test_pod_resources_list_over_its_socket(world: dict[str, Any]) -> None:
    kubelet = FakeKubelet(world["tmp"] / "dp", world["tmp"] / "pr" / "kubelet.sock")
    try:
        kubelet.hold("ml", "trainer", "gpuslice.io/v100-50", ["t1", "t2"])
        kubelet.hold("ml", "cpu-only", "example.com/other", ["x"])
        held = PodResourcesClient(world["tmp"] / "pr" / "kubelet.sock").held({"gpuslice.io/v100-50"})
        assert held == {t: Holder("ml", "trainer", "main", "gpuslice.io/v100-50") for t in ("t1", "t2")}
    finally:
        kubelet.stop()
    with pytest.raises(grpc.RpcError):
        PodResourcesClient(world["tmp"] / "pr" / "kubelet.sock", timeout_s=1).held(set())


def test_token_handoff_writes_nothing_for_a_pod_it_cannot_find(world: dict[str, Any]) -> None:
    listing = {"v100-25::" + GPU_A + "::0": Holder("ml", "ghost", "main", "gpuslice.io/v100-25")}
    handoff = TokenHandoff(lambda _: listing, world["lookup"], world["writer"], ["gpuslice.io/v100-25"])
    handoff.allocated(listing)
    handoff.reconcile()
    assert world["specs"].written() == [] and handoff.pending() == list(listing)  # still waited for
    assert "ml/ghost" in handoff.last_error and handoff.held() == list(listing)


def test_token_handoff_gives_no_card_to_a_pod_with_a_copied_record(world: dict[str, Any]) -> None:
    """A pod that got a token (it asked by extended resource) but carries another pod's record: no spec."""
    pod = managed_pod("copycat", uid="c0c0c0c0-0000-4000-8000-000000000001")
    copy = AllocationRecord(POD_UID, NODE, (GPU_A,), "v100-25", 250, 8192)  # the running trainer's record
    pod["metadata"]["annotations"][ANNOTATION] = copy.encode()
    world["api"].objects["/api/v1/namespaces/ml/pods/copycat"] = pod
    listing = {"v100-25::" + GPU_A + "::1": Holder("ml", "copycat", "main", "gpuslice.io/v100-25")}
    handoff = TokenHandoff(lambda _: listing, world["lookup"], world["writer"], ["gpuslice.io/v100-25"])
    handoff.allocated(listing)
    handoff.reconcile()
    assert world["specs"].written() == [] and handoff.pending() == list(listing)
    assert f"names claim {POD_UID}, not this pod" in handoff.last_error
    assert not (Path(world["pod_state"]).parent / pod["metadata"]["uid"]).exists()


# ---- ResourceSlice ---------------------------------------------------------------------------------

def test_resource_slice_follows_the_healthy_cards(world: dict[str, Any]) -> None:
    api: MemoryApi = world["api"]
    api.objects[f"/api/v1/nodes/{NODE}"] = {"metadata": {"name": NODE, "uid": "node-uid"}}
    slices = SlicePublisher(api, NODE, load_catalog())
    path = f"{SLICES}/{NODE}-gpuslice.io"
    slices.update(CARDS)
    first = api.objects[path]
    names = [d["name"] for d in first["spec"]["devices"]]
    assert len(names) == 2 * (4 + 2 + 1) and "v100-25-7" in names and "v100-100-1" in names
    assert {d["attributes"]["product"]["string"] for d in first["spec"]["devices"]} == {
        "v100-25", "v100-50", "v100-100"}
    assert first["spec"]["pool"] == {"name": NODE, "generation": 1, "resourceSliceCount": 1}
    assert first["metadata"]["ownerReferences"][0]["uid"] == "node-uid" and slices.synced
    slices.update([Card(GPU_A, 0, "Tesla-V100-SXM2-32GB", 32768, healthy=False), CARDS[1]])
    second = api.objects[path]
    assert len(second["spec"]["devices"]) == 7 and second["spec"]["pool"]["generation"] == 2
    del api.objects[path]  # the kubelet wiped it: the next check puts it back
    slices.sync()
    assert len(api.objects[path]["spec"]["devices"]) == 7


def test_resource_slice_on_a_cluster_without_resource_k8s_io_v1(world: dict[str, Any]) -> None:
    class OldCluster(MemoryApi):
        def request(self, method: str, path: str, body: Any = None, **_: Any) -> dict[str, Any]:
            if method == "POST":
                raise KubeError(404, "the server could not find the requested resource")
            return super().request(method, path, body)

    slices = SlicePublisher(OldCluster(), NODE, load_catalog())
    slices.update(CARDS)
    assert slices.unsupported and not slices.synced
