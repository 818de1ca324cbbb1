"""The limiter's test bench: the library built by ``make interposer``, a fake driver (a simulated
V100-SXM2-32GB node: ``libcuda.so.1`` + ``libnvidia-ml.so.1`` compiled here from
``enforcement/interposer/fake``), and clients that reach it three ways (a C program linked against
the fakes, ctypes, the real ``pynvml``).

Every test runs twice: against the release build, and against the sanitizer build
(``INTERPOSER_FLAVOR=sanitize``: ASan + UBSan in the limiter, the fakes and the C client; any
report fails the test). Each test gets a fresh simulated node and a fresh container state dir.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SOURCES = REPO / "enforcement" / "interposer"
CHECK_CLIENT = SOURCES / "check_client.py"
CAP_MIB = 8192
CONTEXT_MIB = 768  # the limiter's default context reserve (config.c), for a cap of 8192
FAKE_CONTEXT_MIB = 300  # what a context takes on the fake card (card.c)
WARN = ["-Wall", "-Wextra", "-Werror", "-Wshadow"]
SANITIZE = ["-O1", "-fno-omit-frame-pointer", "-fsanitize=address,undefined", "-fno-sanitize-recover=all"]
SANITIZER_REPORTS = ("ERROR: AddressSanitizer", "ERROR: LeakSanitizer", "runtime error:", "UndefinedBehaviorSanitizer")


def _run(cmd: Sequence[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(list(cmd), capture_output=True, text=True, timeout=300, cwd=cwd)
    if done.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done


@dataclass(frozen=True)
class Build:
    """One flavor of everything the tests run: the limiter, the fake driver, the C clients."""

    flavor: str
    limiter: Path
    fake_dir: Path
    client: Path
    table_check: Path
    preload_first: tuple[str, ...]  # the sanitizer runtime, which must come before anything it instruments

    def preload(self, limiter: bool) -> str:
        return " ".join([*self.preload_first, *([str(self.limiter)] if limiter else [])])


def _build(flavor: str, out: Path) -> Build:
    make = _run(["make", "-s", "interposer", f"INTERPOSER_FLAVOR={flavor}"], cwd=REPO)
    limiter = Path(make.stdout.strip().splitlines()[-1])
    extra = SANITIZE if flavor == "sanitize" else ["-O2"]
    out.mkdir(parents=True, exist_ok=True)
    fake = SOURCES / "fake"
    shared = ["gcc", "-std=gnu11", "-g", "-fPIC", "-shared", "-fvisibility=hidden", *WARN, *extra,
              "-Wl,-Bsymbolic-functions"]
    for soname, source in (("libcuda.so.1", "cuda.c"), ("libnvidia-ml.so.1", "nvml.c")):
        _run([*shared, f"-Wl,-soname,{soname}", "-o", str(out / soname), str(fake / source), str(fake / "card.c"),
              "-lpthread"])
    program = ["gcc", "-std=gnu11", "-g", *WARN, *extra, f"-I{SOURCES}"]
    client = out / "client"
    _run([*program, "-o", str(client), str(Path(__file__).with_name("client.c")), f"-L{out}", "-l:libcuda.so.1",
          "-l:libnvidia-ml.so.1"])
    table_check = out / "table_check"
    _run([*program, "-o", str(table_check), str(Path(__file__).with_name("table_check.c")), str(SOURCES / "table.c"),
          "-lpthread"])
    first: tuple[str, ...] = ()
    if flavor == "sanitize":
        asan = _run(["gcc", "-print-file-name=libasan.so"]).stdout.strip()
        first = (str(Path(asan).resolve()),)
    return Build(flavor, limiter, out, client, table_check, first)


@pytest.fixture(scope="session")
def builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Build]:
    if shutil.which("gcc") is None:
        pytest.fail("gcc is needed to build the limiter and the fake driver")
    root = tmp_path_factory.mktemp("interposer")
    return {flavor: _build(flavor, root / flavor) for flavor in ("release", "sanitize")}


@dataclass
class Node:
    """A simulated GPU node and one container on it; ``env()`` is what a process there runs with."""

    build: Build
    root: Path
    devices: int = 1
    fake: dict[str, str] = field(default_factory=dict)

    @property
    def state_dir(self) -> Path:
        return self.root / "container-state"

    def env(self, limited: bool = True, preloaded: bool | None = None, cap_mib: int | None = CAP_MIB,
            python: bool = False, **extra: str) -> dict[str, str]:
        """``limited``: the hand-off's variables are set; ``preloaded``: the library is loaded
        (default: when limited), so preloaded but not limited is the pass-through case."""
        home = self.root / "home"
        home.mkdir(exist_ok=True)
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(home),
            "LD_LIBRARY_PATH": str(self.build.fake_dir),
            "FAKEGPU_STATE": str(self.root / "cards"),
            "FAKEGPU_DEVICES": str(self.devices),
            # Python (not built with ASan) leaks by design at exit; the C client is checked for leaks.
            "ASAN_OPTIONS": f"detect_leaks={0 if python else 1}:halt_on_error=1",
            "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1",
            **self.fake,
        }
        if preloaded if preloaded is not None else limited:
            env["LD_PRELOAD"] = self.build.preload(limiter=True)
        elif self.build.preload_first:
            env["LD_PRELOAD"] = self.build.preload(limiter=False)
        if limited:
            self.state_dir.mkdir(exist_ok=True)
            if cap_mib is not None:
                env["GPUSLICE_SLICE_MEMORY_MIB"] = str(cap_mib)
            env["GPUSLICE_SLICE_STATE_DIR"] = str(self.state_dir)
        env.update(extra)
        return env

    def client(self, *args: str, env: dict[str, str] | None = None, check: bool = True) -> str:
        """Runs the C client; its stdout."""
        return self._run([str(self.build.client), *args], env or self.env(), check)

    def ctypes(self, *args: str, env: dict[str, str] | None = None, check: bool = True) -> str:
        """Runs check_client.py (ctypes) with this interpreter; its stdout."""
        return self._run([sys.executable, str(CHECK_CLIENT), *args], env or self.env(python=True), check)

    def python(self, code: str, env: dict[str, str] | None = None) -> str:
        return self._run([sys.executable, "-c", code], env or self.env(python=True), True)

    def spawn(self, cmd: Sequence[str], env: dict[str, str]) -> subprocess.Popen[str]:
        return subprocess.Popen(list(cmd), env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    @staticmethod
    def _run(cmd: list[str], env: dict[str, str], check: bool) -> str:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
        assert_clean(done.stderr)
        if check and done.returncode != 0:
            raise AssertionError(f"{cmd} exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
        return done.stdout


def assert_clean(stderr: str) -> None:
    """No sanitizer report (the sanitizer build halts on the first one, so this is also exit code)."""
    for marker in SANITIZER_REPORTS:
        assert marker not in stderr, stderr


def lines(output: str, prefix: str) -> list[list[str]]:
    """The whitespace-split lines of the C client's output that start with ``prefix``."""
    return [line.split() for line in output.splitlines() if line.startswith(prefix)]


def field_of(line: list[str], name: str) -> str:
    """The value after ``name`` in a C client line."""
    return line[line.index(name) + 1]


@pytest.fixture(params=["release", "sanitize"])
def node(request: pytest.FixtureRequest, builds: dict[str, Build], tmp_path: Path) -> Iterator[Node]:
    yield Node(builds[request.param], tmp_path)
