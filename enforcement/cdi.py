"""CDI spec files: how the container runtime learns a slice's container edits.

One spec file per CDI device (a DRA claim, or a device plugin token), in the runtime's dynamic
spec directory (``/var/run/cdi`` by default), kind ``gpuslice.io/slice``, ``cdiVersion`` 0.6.0
(containerd >= 1.7 and CRI-O >= 1.27 read it). containerd's CDI cache refreshes from an inotify
watch of the directory, so a spec is visible a moment after it is written, not at once (seen on the
real node: a spec written 4 ms before a container create was not found). Every path therefore
writes its spec ahead of the create and lets ``SETTLE_S`` pass after a write before it lets the
create go on.

Writes are atomic (a temporary name the runtime does not read, then a rename), and removal is
idempotent. The pod UID a spec was written for is kept in its annotations, so the spec files
themselves say, after a restart, what was prepared for whom.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from enforcement.edits import ContainerEdits

CDI_VERSION = "0.6.0"
VENDOR = "gpuslice.io"
CLASS = "slice"
KIND = f"{VENDOR}/{CLASS}"
POD_UID_ANNOTATION = "gpuslice.io/pod-uid"
SETTLE_S = 0.1  # from a spec written to the runtime's CDI cache having seen it (inotify, then a rescan)
_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.:-]*[A-Za-z0-9])?$")


class CdiError(ValueError):
    """A device name CDI would refuse, or a spec file that cannot be written."""


def qualified(device: str) -> str:
    """The fully qualified CDI device name the runtime resolves: ``gpuslice.io/slice=<device>``."""
    return f"{KIND}={device}"


def check_name(device: str) -> str:
    if not _NAME.match(device):
        raise CdiError(f"{device!r} is not a valid CDI device name (letters, digits, '_', '-', '.', ':')")
    return device


def spec_document(device: str, edits: ContainerEdits, annotations: Mapping[str, str]) -> dict[str, Any]:
    """The CDI spec (as JSON data) of one device carrying ``edits``."""
    container_edits: dict[str, Any] = {"env": list(edits.env)}
    if edits.device_nodes:
        container_edits["deviceNodes"] = [{"path": d.path, "permissions": d.permissions} for d in edits.device_nodes]
    if edits.mounts:
        container_edits["mounts"] = [
            {
                "hostPath": m.host_path,
                "containerPath": m.container_path,
                "options": ["ro" if m.read_only else "rw", "nosuid", "nodev", "bind"],
            }
            for m in edits.mounts
        ]
    return {
        "cdiVersion": CDI_VERSION,
        "kind": KIND,
        "annotations": dict(annotations),
        "devices": [{"name": check_name(device), "containerEdits": container_edits}],
    }


@dataclass(frozen=True, slots=True)
class WrittenSpec:
    device: str
    pod_uid: str
    path: Path
    mounts: Mapping[str, str] = field(default_factory=dict)  # container path -> host path


def spec_mounts(doc: Mapping[str, Any]) -> dict[str, str]:
    """Container path -> host path of every mount in a spec document."""
    out: dict[str, str] = {}
    for device in doc.get("devices") or []:
        for m in ((device or {}).get("containerEdits") or {}).get("mounts") or []:
            if isinstance(m, dict) and isinstance(m.get("containerPath"), str) and isinstance(m.get("hostPath"), str):
                out[m["containerPath"]] = m["hostPath"]
    return out


class SpecDir:
    """The spec files gpuslice owns in one CDI directory."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, device: str) -> Path:
        return self.root / f"{VENDOR}-{CLASS}_{check_name(device)}.json"

    def write(self, device: str, edits: ContainerEdits, pod_uid: str, annotations: Mapping[str, str] = {}) -> Path:
        """Write (or replace) the spec of ``device``; returns its path."""
        doc = spec_document(device, edits, {POD_UID_ANNOTATION: pod_uid, **annotations})
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.path(device)
        tmp = final.with_name(f".{final.name}.tmp")  # not *.json: the runtime never reads a half-written spec
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
        return final

    def remove(self, device: str) -> bool:
        """Remove the spec of ``device``; False when there was none."""
        try:
            self.path(device).unlink()
        except FileNotFoundError:
            return False
        return True

    def read(self, device: str) -> dict[str, Any] | None:
        try:
            doc = json.loads(self.path(device).read_text(encoding="utf-8"))
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        return doc if isinstance(doc, dict) else None

    def written(self) -> list[WrittenSpec]:
        """Every gpuslice spec in the directory, with the pod UID it was written for and its mounts."""
        out: list[WrittenSpec] = []
        prefix = f"{VENDOR}-{CLASS}_"
        with contextlib.suppress(FileNotFoundError):
            for path in sorted(self.root.glob(f"{prefix}*.json")):
                device = path.name[len(prefix) : -len(".json")]
                doc = self.read(device) or {}
                uid = (doc.get("annotations") or {}).get(POD_UID_ANNOTATION)
                out.append(WrittenSpec(device, str(uid or ""), path, spec_mounts(doc)))
        return out
