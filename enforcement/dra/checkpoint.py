"""The DRA plugin's checkpoint: which claims are prepared, for which pod, with which CDI devices.

A JSON file written atomically (temporary file, fsync, rename) after every change, read at start,
so NodePrepareResources and NodeUnprepareResources stay idempotent across restarts of both the
agent and the kubelet: a claim prepared before a restart is answered from here, never prepared
twice, and an unprepare after a restart still finds (and removes) what was written.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

VERSION = 1


class CheckpointError(RuntimeError):
    """The checkpoint file exists but cannot be read: refuse to guess."""


@dataclass(frozen=True, slots=True)
class PreparedDevice:
    request_names: tuple[str, ...]
    pool_name: str
    device_name: str
    cdi_device_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PreparedClaim:
    claim_uid: str
    namespace: str
    name: str
    pod_uid: str
    pod_name: str
    cdi_device: str  # the spec's device name (not qualified)
    devices: tuple[PreparedDevice, ...]


class Checkpoint:
    """Prepared claims by claim UID, mirrored to ``path``. Thread-safe."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._claims: dict[str, PreparedClaim] = {}
        self._lock = threading.Lock()
        self._load()

    def _load(self) -> None:
        try:
            doc = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return
        except (OSError, json.JSONDecodeError) as e:
            raise CheckpointError(f"DRA checkpoint {self.path} is unreadable: {e}") from e
        if not isinstance(doc, dict) or doc.get("version") != VERSION or not isinstance(doc.get("claims"), dict):
            raise CheckpointError(f"DRA checkpoint {self.path} is not a version {VERSION} checkpoint")
        for uid, c in doc["claims"].items():
            devices = tuple(PreparedDevice(tuple(d["request_names"]), d["pool_name"], d["device_name"],
                                           tuple(d["cdi_device_ids"])) for d in c["devices"])
            self._claims[uid] = PreparedClaim(uid, c["namespace"], c["name"], c["pod_uid"], c["pod_name"],
                                              c["cdi_device"], devices)

    def _save(self) -> None:
        doc = {"version": VERSION, "claims": {uid: asdict(c) for uid, c in sorted(self._claims.items())}}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + ".tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(doc, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def get(self, claim_uid: str) -> PreparedClaim | None:
        with self._lock:
            return self._claims.get(claim_uid)

    def put(self, claim: PreparedClaim) -> None:
        with self._lock:
            self._claims[claim.claim_uid] = claim
            self._save()

    def drop(self, claim_uid: str) -> PreparedClaim | None:
        with self._lock:
            claim = self._claims.pop(claim_uid, None)
            if claim is not None:
                self._save()
            return claim

    def claims(self) -> list[PreparedClaim]:
        with self._lock:
            return list(self._claims.values())
