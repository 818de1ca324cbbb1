"""The layering, read from every import in the source (function-level ones too):

* ``extender``, ``enforcement`` and ``simulations`` import ``packing`` and never each other;
* ``packing`` is pure: outside ``packing.kube`` (the Kubernetes substrate both services share, which
  does network I/O) no module of it imports ``packing.kube`` or an I/O library, and neither does
  ``simulations``; ``packing.kube`` imports nothing of the edges;
* the cluster sync does not reach up into the extender's HTTP app.

``packing/cli.py`` is the console script: it names the edges' entry points as strings and imports
them only when their subcommand runs, so it is read like any other module (and imports none of them).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EDGES = ("extender", "enforcement", "simulations")
IO = ("kubernetes", "urllib3", "urllib", "http", "socket", "ssl", "requests", "grpc", "flask", "gunicorn",
      "prometheus_client", "pynvml", "subprocess", "threading", "asyncio", "orjson")


def imports(path: Path) -> set[str]:
    """Every module ``path`` imports, anywhere in it, as a dotted name (relative imports resolved)."""
    tree = ast.parse(path.read_text())
    package = ".".join(path.relative_to(REPO).with_suffix("").parts[:-1])
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            out.add(base)
            out |= {f"{base}.{a.name}" for a in node.names}
    return out


def modules(folder: str) -> list[Path]:
    return [p for p in sorted((REPO / folder).rglob("*.py")) if "kubeletapi/protos" not in str(p)]


def within(name: str, roots: tuple[str, ...]) -> bool:
    return any(name == r or name.startswith(r + ".") for r in roots)


def test_every_package_is_read() -> None:
    assert len(modules("packing/kube")) >= 4 and len(modules("packing")) > 40 and len(modules("extender")) > 40


@pytest.mark.parametrize("edge", EDGES)
def test_the_edges_never_import_each_other(edge: str) -> None:
    others = tuple(e for e in EDGES if e != edge)
    found = {str(p.relative_to(REPO)): sorted(n for n in imports(p) if within(n, others)) for p in modules(edge)}
    assert {k: v for k, v in found.items() if v} == {}


def test_packing_is_pure_outside_its_kubernetes_substrate() -> None:
    core = [p for p in modules("packing") if "packing/kube" not in str(p.relative_to(REPO).as_posix())]
    found = {str(p.relative_to(REPO)): sorted(n for n in imports(p) if within(n, ("packing.kube", *IO, *EDGES)))
             for p in core}
    assert {k: v for k, v in found.items() if v} == {}


def test_simulations_never_reach_the_api_server() -> None:
    found = {str(p.relative_to(REPO)): sorted(n for n in imports(p) if within(n, ("packing.kube", "kubernetes")))
             for p in modules("simulations")}
    assert {k: v for k, v in found.items() if v} == {}


def test_the_substrate_imports_nothing_of_the_edges() -> None:
    found = {str(p.relative_to(REPO)): sorted(n for n in imports(p) if within(n, EDGES))
             for p in modules("packing/kube")}
    assert {k: v for k, v in found.items() if v} == {}


def test_the_checks_see_what_they_look_for() -> None:
    """The reader finds a function-level import of an edge (the way a violation would hide)."""
    assert "extender.app" in imports(REPO / "extender" / "cluster" / "serve.py")
    assert "kubernetes.watch.watch" in imports(REPO / "packing" / "kube" / "informer.py")
    assert within("packing.kube.client", ("packing.kube",)) and not within("packing.kubex", ("packing.kube",))


def test_the_cluster_sync_does_not_import_the_http_app() -> None:
    assert not any(within(n, ("extender.app",)) for n in imports(REPO / "extender" / "cluster" / "sync.py"))
