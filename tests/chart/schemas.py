"""Kubernetes 1.34's OpenAPI schemas, and the CRD schemas of cert-manager and the Prometheus Operator,
read from their Go module zips (the module proxy or the module cache: no network beyond that, no
cluster), turned into strict JSON Schema validators.

``k8s.io/kubernetes@v1.34.4`` carries ``api/openapi-spec/v3/*.json`` (what kube-apiserver itself
serves); ``github.com/cert-manager/cert-manager`` carries ``deploy/crds/`` and
``github.com/prometheus-operator/prometheus-operator`` ``example/prometheus-operator-crd/``. Strict
as ``kubectl apply --validate=strict`` is: a field the schema does not know fails (unless the
schema says ``x-kubernetes-preserve-unknown-fields``), so does a null the schema does not allow.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import subprocess
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml

KUBERNETES = ("k8s.io/kubernetes", "v1.34.4", "api/openapi-spec/v3")
CRDS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("github.com/cert-manager/cert-manager", "v1.21.2",
     ("deploy/crds/cert-manager.io_certificates.yaml", "deploy/crds/cert-manager.io_issuers.yaml",
      "deploy/crds/cert-manager.io_clusterissuers.yaml")),
    ("github.com/prometheus-operator/prometheus-operator", "v0.85.0",
     ("example/prometheus-operator-crd/monitoring.coreos.com_prometheusrules.yaml",
      "example/prometheus-operator-crd/monitoring.coreos.com_podmonitors.yaml")),
)
OBJECT_META = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta"

Schema = dict[str, Any]


class SchemasUnavailable(RuntimeError):
    """A module could not be downloaded (no Go, no module proxy)."""


def go() -> str:
    found = os.environ.get("GO") or shutil.which("go") or "/usr/local/go/bin/go"
    if not Path(found).exists():
        raise SchemasUnavailable("go not found (PATH, /usr/local/go/bin/go or $GO): it fetches the schemas' modules")
    return found


@cache
def module_dir(module: str, version: str) -> Path:
    """The extracted directory of ``module@version`` in the Go module cache (downloaded if needed)."""
    out = subprocess.run([go(), "mod", "download", "-json", f"{module}@{version}"], capture_output=True, text=True,
                         timeout=1800, env={**os.environ, "GOFLAGS": "-mod=mod", "GOWORK": "off"})
    try:
        doc = json.loads(out.stdout)
    except json.JSONDecodeError:
        raise SchemasUnavailable(f"go mod download {module}@{version}: {out.stderr[-2000:]}") from None
    if doc.get("Error") or not doc.get("Dir"):
        raise SchemasUnavailable(f"go mod download {module}@{version}: {doc.get('Error')}")
    return Path(doc["Dir"])


def crd_documents() -> Iterator[dict[str, Any]]:
    """The CustomResourceDefinitions the chart's optional objects need."""
    for module, version, files in CRDS:
        root = module_dir(module, version)
        for name in files:
            yield from (d for d in yaml.safe_load_all((root / name).read_text()) if d)


def _strict(node: Any) -> Any:
    """A copy of an OpenAPI 3.0 schema as strict JSON Schema (unknown fields and unexpected nulls fail)."""
    if isinstance(node, list):
        return [_strict(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _strict(v) for k, v in node.items() if k not in ("description", "default", "example")}
    if out.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    open_ended = "additionalProperties" in out or out.get("x-kubernetes-preserve-unknown-fields")
    if "properties" in out and not open_ended:
        out["additionalProperties"] = False
    if out.get("nullable"):
        inner = {k: v for k, v in out.items() if k != "nullable"}
        out = {"anyOf": [{"type": "null"}, inner]}
    return out


class Schemas:
    """(apiVersion, kind) -> a validator for objects of that kind."""

    def __init__(self) -> None:
        module, version, folder = KUBERNETES
        self.components: dict[str, Schema] = {}
        self.kinds: dict[tuple[str, str], str] = {}
        for path in sorted((module_dir(module, version) / folder).glob("*.json")):
            for name, schema in json.loads(path.read_text()).get("components", {}).get("schemas", {}).items():
                self.components.setdefault(name, _strict(schema))
                for gvk in schema.get("x-kubernetes-group-version-kind") or []:
                    api_version = f"{gvk['group']}/{gvk['version']}" if gvk["group"] else gvk["version"]
                    self.kinds.setdefault((api_version, gvk["kind"]), name)
        for crd in crd_documents():
            spec = crd["spec"]
            for v in spec["versions"]:
                schema = copy.deepcopy(v["schema"]["openAPIV3Schema"])
                schema.setdefault("properties", {})["metadata"] = {"$ref": f"#/components/schemas/{OBJECT_META}"}
                name = f"crd.{spec['group']}.{v['name']}.{spec['names']['kind']}"
                self.components[name] = _strict(schema)
                self.kinds[(f"{spec['group']}/{v['name']}", spec["names"]["kind"])] = name
        self._validators: dict[str, jsonschema.protocols.Validator] = {}

    def validator(self, api_version: str, kind: str) -> jsonschema.protocols.Validator:
        """KeyError for a kind no schema describes (itself a failure: the chart rendered something unknown)."""
        name = self.kinds[(api_version, kind)]
        if name not in self._validators:
            root = {"$ref": f"#/components/schemas/{name}", "components": {"schemas": self.components}}
            self._validators[name] = jsonschema.Draft202012Validator(root)
        return self._validators[name]

    def errors(self, obj: Mapping[str, Any]) -> list[str]:
        """Every schema violation of ``obj``, as 'path: message'."""
        found = self.validator(obj["apiVersion"], obj["kind"]).iter_errors(obj)
        return sorted(f"{'.'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}" for e in found)
