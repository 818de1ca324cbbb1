"""The rendered manifests (``deploy/manifests/``, made from ``deploy/chart`` by ``make manifests``) and
server-side apply of any object kind, its API path found by discovery like kubectl does."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from packing.kube.client import Kube, KubeError, q

REPO_ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = REPO_ROOT / "deploy" / "manifests"
FIELD_MANAGER = "gpuslice-e2e"
APPLY_PATCH = "application/apply-patch+yaml"

Obj = dict[str, Any]


def rendered(name: str = "gpuslice.yaml", root: Path = REPO_ROOT) -> list[Obj]:
    """The objects of one rendered manifest file (of the source tree at ``root``), in its order."""
    return [d for d in yaml.safe_load_all((root / "deploy" / "manifests" / name).read_text()) if d]


def find(objects: Iterable[Obj], kind: str, name: str) -> Obj:
    """The one object of ``kind`` named ``name``."""
    matches = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    if len(matches) != 1:
        raise LookupError(f"{len(matches)} {kind} objects named {name} in the manifest")
    return matches[0]


class Resources:
    """(apiVersion, kind) -> the resource's path and scope, read once from the API's discovery."""

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self._known: dict[tuple[str, str], tuple[str, str, bool]] = {}

    def refresh(self) -> None:
        versions = ["/api/v1"] + [f"/apis/{v['groupVersion']}" for g in self.kube.request("GET", "/apis")["groups"]
                                  for v in g["versions"]]
        for base in versions:
            doc = self.kube.request("GET", base)
            for r in doc.get("resources") or []:
                if "/" not in r["name"]:
                    self._known[(doc["groupVersion"], r["kind"])] = (base, r["name"], r["namespaced"])

    def path(self, obj: Mapping[str, Any], named: bool = True) -> str:
        key = (obj["apiVersion"], obj["kind"])
        if key not in self._known:
            self.refresh()  # a CRD installed since the last look
        base, plural, namespaced = self._known[key]
        meta = obj.get("metadata") or {}
        where = f"/namespaces/{q(meta.get('namespace') or 'default')}" if namespaced else ""
        return f"{base}{where}/{plural}" + (f"/{q(meta['name'])}" if named else "")


def apply(kube: Kube, resources: Resources, obj: Obj, *, dry_run: bool = False) -> Obj:
    """Server-side apply of ``obj`` (``dry_run``: every check the API server makes, nothing stored)."""
    query = {"fieldManager": FIELD_MANAGER, "force": "true"} | ({"dryRun": "All"} if dry_run else {})
    return kube.request("PATCH", resources.path(obj), obj, content_type=APPLY_PATCH, query=query)


def create(kube: Kube, resources: Resources, obj: Obj, *, dry_run: bool = False) -> Obj:
    """POST ``obj`` (a creation: what admission policies on CREATE see)."""
    return kube.request("POST", resources.path(obj, named=False), obj, query={"dryRun": "All"} if dry_run else None)


def delete(kube: Kube, resources: Resources, obj: Mapping[str, Any]) -> None:
    """Delete ``obj`` if it exists."""
    try:
        kube.request("DELETE", resources.path(obj))
    except KubeError as e:
        if e.status != 404:
            raise
