"""Every Kubernetes API call a part of gpuslice's code makes, found by reading its source (the AST).

Both services reach the API through one substrate (``packing/kube``), in few ways, each recognised
here: ``Kube.request(METHOD, path)``, ``Kube.get(path)`` and the ``Kube`` helpers (``get_pod``,
``patch_pod``, ``annotate_node``, ...: their own calls, read from ``packing/kube/client.py``); an
``Informer`` (list and watch); ``Kube.stream`` (watch); an ``EventWriter`` (creates Events). A path
is resolved from string literals, f-strings, module constants, local variables, ``pod_path(...)`` and
``self.path`` properties; a call whose path cannot be resolved is reported, never skipped.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VERB_OF = {"GET": "get", "POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
RAW = {"get": "GET"}


@dataclass(frozen=True, order=True)
class Call:
    """One permission a call needs: verb on group/resource[/subresource], and where it is made."""

    group: str
    resource: str
    verb: str
    where: str


class Unresolved(Exception):
    pass


def permission(method: str, path: str) -> tuple[str, str, str]:
    """(group, resource[/sub], verb) of ``method path``; ``{}`` marks a formatted part."""
    parts = path.strip("/").split("/")
    if parts[0] == "api":
        group, rest = "", parts[2:]
    elif parts[0] == "apis":
        group, rest = parts[1], parts[3:]
    else:
        raise Unresolved(f"not an API path: {path}")
    if len(rest) >= 2 and rest[0] == "namespaces" and len(rest) != 2:
        rest = rest[2:]  # a namespaced resource
    resource, named, sub = rest[0], len(rest) >= 2, "/".join(rest[2:])
    verb = method.lower() if method in ("LIST", "WATCH") else VERB_OF[method]
    if verb == "get" and not named:
        verb = "list"
    return group, resource + (f"/{sub}" if sub else ""), verb


class _Module:
    """Path resolution within one source file."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.tree = ast.parse(path.read_text())
        self.constants: dict[str, ast.expr] = {}
        self.functions: dict[str, ast.FunctionDef] = {}
        for node in self.tree.body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                self.constants[node.targets[0].id] = node.value
            if isinstance(node, ast.FunctionDef):
                self.functions[node.name] = node
        self.properties: dict[str, ast.expr] = {}
        for cls in (n for n in self.tree.body if isinstance(n, ast.ClassDef)):
            for fn in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
                returns = [n.value for n in ast.walk(fn) if isinstance(n, ast.Return) and n.value is not None]
                if any(isinstance(d, ast.Name) and d.id == "property" for d in fn.decorator_list) and returns:
                    self.properties[fn.name] = returns[0]

    def resolve(self, node: ast.expr, local: dict[str, ast.expr]) -> str:
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            return node.value
        if isinstance(node, ast.JoinedStr):
            out = ""
            for v in node.values:
                if isinstance(v, ast.Constant):
                    out += str(v.value)
                else:
                    assert isinstance(v, ast.FormattedValue)
                    try:
                        out += self.resolve(v.value, local)
                    except Unresolved:
                        out += "{}"
            return out
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            return self.resolve(node.left, local) + self.resolve(node.right, local)
        if isinstance(node, ast.Name):
            if node.id in local:
                return self.resolve(local[node.id], {})
            if node.id in self.constants:
                return self.resolve(self.constants[node.id], {})
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self" \
                and node.attr in self.properties:
            return self.resolve(self.properties[node.attr], {})
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in self.functions:
            fn = self.functions[node.func.id]
            returns = [n.value for n in ast.walk(fn) if isinstance(n, ast.Return)]
            if len(returns) == 1 and returns[0] is not None:
                return self.resolve(returns[0], _locals(fn))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("q", "quote", "str"):
            raise Unresolved("a formatted segment")
        # `x.rsplit("/", 1)[0]`: the collection of a named path
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Call) and \
                isinstance(node.value.func, ast.Attribute) and node.value.func.attr == "rsplit":
            return self.resolve(node.value.func.value, local).rsplit("/", 1)[0]
        raise Unresolved(ast.unparse(node))


def _locals(fn: ast.AST) -> dict[str, ast.expr]:
    out: dict[str, ast.expr] = {}
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            out.setdefault(node.targets[0].id, node.value)
    return out


def _api_path(mod: _Module, node: ast.expr, local: dict[str, ast.expr]) -> str | None:
    try:
        path = mod.resolve(node, local)
    except Unresolved:
        return None
    return path if path.startswith(("/api/", "/apis/")) else None


def kube_helpers() -> dict[str, list[tuple[str, str]]]:
    """``Kube`` method -> the (method, path) calls it makes (read from packing/kube/client.py)."""
    mod = _Module(REPO / "packing" / "kube" / "client.py")
    cls = next(n for n in mod.tree.body if isinstance(n, ast.ClassDef) and n.name == "Kube")
    out: dict[str, list[tuple[str, str]]] = {}
    for fn in (n for n in cls.body if isinstance(n, ast.FunctionDef)):
        local = _locals(fn)
        for call in (n for n in ast.walk(fn) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)):
            if call.func.attr == "request" and call.args and isinstance(call.args[0], ast.Constant):
                path = _api_path(mod, call.args[1], local)
                if path:
                    out.setdefault(fn.name, []).append((str(call.args[0].value), path))
            if call.func.attr == "get" and call.args and (path := _api_path(mod, call.args[0], local)):
                out.setdefault(fn.name, []).append(("GET", path))
    return out


def calls(*folders: str, files: tuple[str, ...] = ()) -> tuple[set[Call], list[str]]:
    """Every API call in the Python files of ``folders`` (and ``files``); and the call sites that look
    like API calls but whose path could not be resolved. The Informer's own list and watch are its
    constructions' (``Informer(name, kube, path, ...)``), an EventWriter's Events its construction's:
    the substrate itself (``packing/kube``) is not read."""
    helpers = kube_helpers()
    found: set[Call] = set()
    unresolved: list[str] = []
    sources = [p for f in folders for p in sorted((REPO / f).rglob("*.py"))] + [REPO / f for f in files]
    for source in sources:
        if "kubeletapi/protos" in str(source) or "packing/kube/" in source.as_posix():
            continue
        mod = _Module(source)
        rel = str(source.relative_to(REPO))
        parents: dict[ast.AST, ast.AST] = {}
        for node in ast.walk(mod.tree):
            for child in ast.iter_child_nodes(node):
                parents[child] = node
        for call in (n for n in ast.walk(mod.tree) if isinstance(n, ast.Call)):
            chain: list[ast.AST] = []
            up = parents.get(call)
            while up is not None:
                if isinstance(up, ast.FunctionDef | ast.AsyncFunctionDef):
                    chain.insert(0, up)
                up = parents.get(up)
            local: dict[str, ast.expr] = {}
            for fn in chain:
                local.update(_locals(fn))
            for group, resource, verb in _permissions_of(mod, call, local, helpers, unresolved, rel):
                found.add(Call(group, resource, verb, f"{rel}:{call.lineno}"))
        # a helper handed over uncalled (ClaimResolver(catalog, kube.get_claim_template, ...)) is called later
        called = {id(c.func) for c in ast.walk(mod.tree) if isinstance(c, ast.Call)}
        for ref in (n for n in ast.walk(mod.tree) if isinstance(n, ast.Attribute) and n.attr in helpers):
            if id(ref) not in called:
                for method, path in helpers[ref.attr]:
                    found.add(Call(*permission(method, path), f"{rel}:{ref.lineno}"))
    return found, sorted(set(unresolved))


def _permissions_of(mod: _Module, call: ast.Call, local: dict[str, ast.expr],
                    helpers: dict[str, list[tuple[str, str]]], unresolved: list[str],
                    rel: str) -> Iterator[tuple[str, str, str]]:
    func = call.func
    if isinstance(func, ast.Name) and func.id == "EventWriter":
        yield "", "events", "create"
        return
    if isinstance(func, ast.Name) and func.id == "Informer" and len(call.args) >= 3:
        path = _api_path(mod, call.args[2], local)
        if path is None:
            unresolved.append(f"{rel}:{call.lineno}: Informer path {ast.unparse(call.args[2])}")
            return
        yield permission("LIST", path)
        yield permission("WATCH", path)
        return
    if not isinstance(func, ast.Attribute):
        return
    name = func.attr
    if name == "request" and call.args and isinstance(call.args[0], ast.Constant) and len(call.args) >= 2 \
            and call.args[0].value in VERB_OF:
        path = _api_path(mod, call.args[1], local)
        if path is None:
            unresolved.append(f"{rel}:{call.lineno}: {ast.unparse(call)[:100]}")
            return
        yield permission(str(call.args[0].value), path)
    elif name in RAW and call.args and (path := _api_path(mod, call.args[0], local)):
        yield permission(RAW[name], path)
    elif name == "stream" and call.args and (path := _api_path(mod, call.args[0], local)):
        yield permission("WATCH", path)
    elif name in helpers:
        for method, path in helpers[name]:
            yield permission(method, path)
