"""Container edits, CDI specs (validated against the CDI 0.6.0 schema) and the NVML inventory."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from enforcement.cdi import CDI_VERSION, CdiError, SpecDir, spec_document
from enforcement.clock import SimClock
from enforcement.edits import EditsConfig, EditsError, slice_edits
from enforcement.inventory import Inventory, gfd_model, read_cards
from enforcement.nvml import PynvmlBackend
from enforcement.simgpu import FakeNVML, SimGPU
from enforcement.simnode import SimulatedCards
from packing.inventory import ANNOTATION, encode
from packing.record import AllocationRecord
from tests.unit.fake_limiter import installed

GPU_A, GPU_B = "GPU-aaaaaaaa-0000-4000-8000-000000000000", "GPU-bbbbbbbb-0000-4000-8000-000000000000"
NAME = r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$"
ABS = r"^/"
# The CDI spec as its SPEC.md (v0.6.0 fields) defines it; unknown fields refused, so a typo fails.
CDI_SCHEMA: dict[str, Any] = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "definitions": {
        "env": {"type": "array", "items": {"type": "string", "pattern": r"^[^=]+=.*$"}},
        "edits": {"type": "object", "additionalProperties": False, "properties": {
            "env": {"$ref": "#/definitions/env"},
            "deviceNodes": {"type": "array", "items": {"type": "object", "additionalProperties": False,
                                                       "required": ["path"], "properties": {
                "path": {"type": "string", "pattern": ABS}, "hostPath": {"type": "string", "pattern": ABS},
                "type": {"type": "string"}, "major": {"type": "integer"}, "minor": {"type": "integer"},
                "fileMode": {"type": "integer"}, "permissions": {"type": "string", "pattern": "^[rwm]*$"},
                "uid": {"type": "integer", "minimum": 0}, "gid": {"type": "integer", "minimum": 0}}}},
            "mounts": {"type": "array", "items": {"type": "object", "additionalProperties": False,
                                                  "required": ["hostPath", "containerPath"], "properties": {
                "hostPath": {"type": "string"}, "containerPath": {"type": "string", "pattern": ABS},
                "type": {"type": "string"}, "options": {"type": "array", "items": {"type": "string"}}}}},
            "hooks": {"type": "array"}}},
        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
    },
    "type": "object", "additionalProperties": False, "required": ["cdiVersion", "kind", "devices"],
    "properties": {
        "cdiVersion": {"type": "string", "pattern": r"^\d+\.\d+\.\d+$"},
        "kind": {"type": "string",
                 "pattern": r"^[a-z0-9]([a-z0-9.-]*[a-z0-9])?/[A-Za-z0-9]([A-Za-z0-9_.-]*[A-Za-z0-9])?$"},
        "annotations": {"$ref": "#/definitions/annotations"},
        "containerEdits": {"$ref": "#/definitions/edits"},
        "devices": {"type": "array", "minItems": 1, "items": {
            "type": "object", "additionalProperties": False, "required": ["name", "containerEdits"], "properties": {
                "name": {"type": "string", "pattern": NAME}, "annotations": {"$ref": "#/definitions/annotations"},
                "containerEdits": {"$ref": "#/definitions/edits"}}}},
    },
}


def record(gpus: tuple[str, ...] = (GPU_A,), product: str = "v100-25", milli: int = 250, mib: int = 8192
           ) -> AllocationRecord:
    return AllocationRecord("claim", "node-a", gpus, product, milli, mib)


def test_edits_carry_the_card_and_the_caps(tmp_path: Path) -> None:
    (tmp_path / "dev").mkdir()
    for node in ("nvidia1", "nvidiactl", "nvidia-uvm"):
        (tmp_path / "dev" / node).touch()
    edits = slice_edits(record(), "pod-uid", {GPU_A: 1, GPU_B: 0}, EditsConfig(dev_root=tmp_path))
    env = edits.env_map()
    assert env["NVIDIA_VISIBLE_DEVICES"] == GPU_A
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=8192M"
    assert not edits.mounts and edits.state_dir is None  # no in-container limiter configured: none handed
    assert env["GPUSLICE_SLICE_SHARE_PERCENT"] == "25" and env["GPUSLICE_POD_UID"] == "pod-uid"
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in env  # no MPS: the pacer steers the share
    # only the device nodes that exist, and the card's own minor (1), not the other card's
    assert [d.path for d in edits.device_nodes] == ["/dev/nvidia1", "/dev/nvidiactl", "/dev/nvidia-uvm"]
    mps = slice_edits(record(), "u", {GPU_A: 1}, EditsConfig(dev_root=tmp_path, mps=True)).env_map()
    assert mps["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"


def test_gang_edits_and_a_foreign_card(tmp_path: Path) -> None:
    gang = slice_edits(record((GPU_B, GPU_A), "v100-100", 1000, 32768), "u", {GPU_A: 0, GPU_B: 1},
                       EditsConfig(dev_root=tmp_path))
    assert gang.env_map()["NVIDIA_VISIBLE_DEVICES"] == f"{GPU_B},{GPU_A}"
    assert gang.env_map()["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=32768M,1=32768M"
    with pytest.raises(EditsError, match="does not have"):
        slice_edits(record((GPU_B,)), "u", {GPU_A: 0})


def test_cdi_spec_validates_against_the_schema_and_round_trips(tmp_path: Path) -> None:
    (tmp_path / "dev").mkdir()
    (tmp_path / "dev" / "nvidia0").touch()
    limiter = installed(tmp_path)  # the spec then carries the limiter's three mounts (one read-write)
    edits = slice_edits(record(), "pod-uid", {GPU_A: 0}, EditsConfig(dev_root=tmp_path, limiter=limiter))
    specs = SpecDir(tmp_path / "cdi")
    path = specs.write("v100-25::" + GPU_A + "::3", edits, "pod-uid")
    doc = json.loads(path.read_text())
    jsonschema.validate(doc, CDI_SCHEMA)
    assert doc["cdiVersion"] == CDI_VERSION == "0.6.0" and doc["kind"] == "gpuslice.io/slice"
    assert [m["options"][0] for m in doc["devices"][0]["containerEdits"]["mounts"]] == ["ro", "ro", "rw"]
    assert [s.pod_uid for s in specs.written()] == ["pod-uid"]
    assert not list((tmp_path / "cdi").glob(".*"))  # no temporary file left behind
    assert specs.remove("v100-25::" + GPU_A + "::3") and not specs.remove("v100-25::" + GPU_A + "::3")
    with pytest.raises(jsonschema.ValidationError):  # the schema is not a rubber stamp
        jsonschema.validate({**doc, "devices": [{"name": "-bad", "containerEdits": {}}]}, CDI_SCHEMA)
    with pytest.raises(CdiError):
        spec_document("bad name", edits, {})


def test_gfd_model_names() -> None:
    assert gfd_model("Tesla V100-SXM2-32GB") == "Tesla-V100-SXM2-32GB"
    assert gfd_model("NVIDIA A100-SXM4-40GB") == "NVIDIA-A100-SXM4-40GB"
    assert gfd_model("  Tesla  V100 (PCIe) 32GB ") == "Tesla-V100--PCIe--32GB"


class Annotator:
    def __init__(self) -> None:
        self.values: list[str] = []
        self.fail = False

    def annotate(self, key: str, value: str) -> None:
        assert key == ANNOTATION
        if self.fail:
            raise RuntimeError("API server away")
        self.values.append(value)


def test_inventory_publishes_withdraws_and_retries(tmp_path: Path) -> None:
    cards_file = tmp_path / "cards.json"
    cards_file.write_text(json.dumps([{"uuid": GPU_A, "name": "Tesla V100-SXM2-32GB", "memory_mib": 32768},
                                      {"uuid": GPU_B, "name": "Tesla V100-SXM2-32GB", "memory_mib": 32768}]))
    backend = PynvmlBackend(SimulatedCards(cards_file)).open()
    annotator = Annotator()
    inv = Inventory(backend, annotator, resync_s=60)
    seen: list[int] = []
    inv.subscribe(lambda cards: seen.append(sum(c.healthy for c in cards)))
    assert inv.refresh(0.0) and inv.published
    assert json.loads(annotator.values[-1]) == [
        {"uuid": GPU_A, "index": 0, "model": "Tesla-V100-SXM2-32GB", "memory_mib": 32768, "healthy": True},
        {"uuid": GPU_B, "index": 1, "model": "Tesla-V100-SXM2-32GB", "memory_mib": 32768, "healthy": True}]
    assert not inv.refresh(1.0) and len(annotator.values) == 1  # unchanged: not re-published
    cards_file.write_text(json.dumps([{"uuid": GPU_A, "lost": True}, {"uuid": GPU_B}]))
    annotator.fail = True
    assert inv.refresh(2.0) and not inv.published and inv.publish_errors == 1
    annotator.fail = False
    inv.refresh(3.0)
    assert inv.published and [c["healthy"] for c in json.loads(annotator.values[-1])] == [False, True]
    assert "lost" in inv.readings()[0].problem.lower()
    assert seen == [0, 2, 1]
    assert inv.minors() == {GPU_A: 0, GPU_B: 1}


def test_read_cards_over_fake_nvml() -> None:
    clock = SimClock()
    fake = FakeNVML([SimGPU(0, GPU_A, "Tesla V100-SXM2-32GB")], clock)
    readings = read_cards(PynvmlBackend(fake).open())
    assert [r.minor for r in readings] == [0]
    assert encode(r.card for r in readings) == json.dumps([{"uuid": GPU_A, "index": 0, "model": "Tesla-V100-SXM2-32GB",
                                         "memory_mib": 32768, "healthy": True}], separators=(",", ":"))


def test_inventory_asks_the_shared_backend_for_devices_once() -> None:
    """The agent's loop shares the (bounded) backend: a refresh must not call devices() again, or
    the agent's own call on that lane is refused while ours runs."""
    fake = FakeNVML([SimGPU(0, GPU_A, "Tesla V100-SXM2-32GB")], SimClock())
    backend = PynvmlBackend(fake).open()
    calls = []

    class Counting:
        def devices(self) -> Any:
            calls.append(1)
            return backend.devices()

        def minor_number(self, uuid: str) -> int:
            return backend.minor_number(uuid)

        def health(self, uuid: str) -> str | None:
            return backend.health(uuid)

    inv = Inventory(Counting(), None)
    for t in range(5):
        inv.refresh(float(t))
    assert len(calls) == 1 and [c.uuid for c in inv.cards()] == [GPU_A]
