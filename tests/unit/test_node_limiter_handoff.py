"""The in-container limiter in the hand-off: the edits per mode and node state (a table), installing
it, the state directory's life beside the CDI specs, a node without the library, the HAMi opt-in."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from enforcement import cli
from enforcement.cdi import SpecDir
from enforcement.edits import EditsConfig, slice_edits
from enforcement.events import RecordingEventSink
from enforcement.handoff import LIMITER_MISSING, HandoffError, Writer
from enforcement.limiter import CONTAINER_LIBRARY, CONTAINER_STATE_DIR, HAMI_CONTAINER_LIBRARY, LimiterMode
from enforcement.limiterhost import NodeLimiter, install, make_state_dir, release_state_dir
from enforcement.metrics import AgentMetrics
from enforcement.node import node_limiter
from enforcement.pods import ManagedPod
from packing.record import AllocationRecord
from tests.unit.fake_limiter import LIBRARY, installed

GPU_A, GPU_B = "GPU-aaaaaaaa-0000-4000-8000-000000000000", "GPU-bbbbbbbb-0000-4000-8000-000000000000"
UID, OTHER = "11111111-2222-4333-8444-555555555555", "66666666-7777-4888-9999-000000000000"
MINORS = {GPU_A: 0, GPU_B: 1}
PRODUCTS = {"v100-25": (250, 8192), "v100-50": (500, 16384), "v100-100": (1000, 32768)}
LIMITER_KEYS = ("GPUSLICE_SLICE_MEMORY_MIB", "GPUSLICE_SLICE_STATE_DIR", "CUDA_DEVICE_MEMORY_", "GPU_CORE_UTIL",
                "LIBCUDA_LOG_LEVEL")
HAMI_TAIL = {"CUDA_DEVICE_MEMORY_SHARED_CACHE": f"{CONTAINER_STATE_DIR}/vgpu.cache",
             "GPU_CORE_UTILIZATION_POLICY": "disable", "LIBCUDA_LOG_LEVEL": "0"}
OURS = [(CONTAINER_LIBRARY, True), ("/etc/ld.so.preload", True), (CONTAINER_STATE_DIR, False)]
HAMI = [(CONTAINER_STATE_DIR, False), ("/tmp/vgpulock", False)]
HAMI_HOST = [*HAMI, (HAMI_CONTAINER_LIBRARY, True), ("/etc/ld.so.preload", True)]


def record(product: str = "v100-25", gpus: tuple[str, ...] = (GPU_A,)) -> AllocationRecord:
    milli, mib = PRODUCTS[product]
    return AllocationRecord("claim", "node-a", gpus, product, milli, mib)


def pod(uid: str = UID, name: str = "trainer", product: str = "v100-25") -> ManagedPod:
    return ManagedPod(uid, "ml", name, record(product))


# ---- the edits: mode x what the node has x the record ---------------------------------------------

def _node(tmp: Path, mode: LimiterMode | None, state: str) -> NodeLimiter | None:
    """A limiter of ``mode`` on a node whose files are in ``state``."""
    if mode is None:
        return None
    hami_library = None
    if state in ("hami-host", "hami-host-gone"):
        hami_library = str(tmp / "hami" / "libvgpu.so")
        if state == "hami-host":
            (tmp / "hami").mkdir()
            (tmp / "hami" / "libvgpu.so").write_bytes(b"\x7fELF libvgpu")
    limiter = installed(tmp, mode, hami_library)
    if state == "no-library":
        Path(limiter.host.library).unlink()
    elif state == "empty-library":
        Path(limiter.host.library).write_bytes(b"")
    elif state == "foreign-preload":
        Path(limiter.host.preload_file).write_text("/usr/lib/libother.so\n")
    return limiter


CASES = [
    # id, mode, node state, product, gpus, limiter env, mounts (container path, read-only), state dir, missing
    ("ours v100-25", LimiterMode.GPUSLICE, "installed", "v100-25", (GPU_A,),
     {"GPUSLICE_SLICE_MEMORY_MIB": "8192", "GPUSLICE_SLICE_STATE_DIR": CONTAINER_STATE_DIR}, OURS, True, ""),
    ("ours, two whole cards: one cap per device", LimiterMode.GPUSLICE, "installed", "v100-100", (GPU_B, GPU_A),
     {"GPUSLICE_SLICE_MEMORY_MIB": "32768", "GPUSLICE_SLICE_STATE_DIR": CONTAINER_STATE_DIR}, OURS, True, ""),
    ("ours, library not installed: the cap only", LimiterMode.GPUSLICE, "no-library", "v100-50", (GPU_A,),
     {"GPUSLICE_SLICE_MEMORY_MIB": "16384"}, [], False, "libgpuslice-limiter.so: No such file"),
    ("ours, empty library", LimiterMode.GPUSLICE, "empty-library", "v100-25", (GPU_A,),
     {"GPUSLICE_SLICE_MEMORY_MIB": "8192"}, [], False, "libgpuslice-limiter.so: empty"),
    ("ours, preload file naming another library", LimiterMode.GPUSLICE, "foreign-preload", "v100-25", (GPU_A,),
     {"GPUSLICE_SLICE_MEMORY_MIB": "8192"}, [], False, "ld.so.preload: holds b'/usr/lib/libother.so\\n'"),
    ("HAMi opt-in, libvgpu in the images", LimiterMode.HAMI, "installed", "v100-50", (GPU_A,),
     {"CUDA_DEVICE_MEMORY_LIMIT_0": "16384m", **HAMI_TAIL}, HAMI, True, ""),
    ("HAMi opt-in, host libvgpu, two cards", LimiterMode.HAMI, "hami-host", "v100-100", (GPU_A, GPU_B),
     {"CUDA_DEVICE_MEMORY_LIMIT_0": "32768m", "CUDA_DEVICE_MEMORY_LIMIT_1": "32768m", **HAMI_TAIL}, HAMI_HOST, True,
     ""),
    ("HAMi opt-in, host libvgpu missing", LimiterMode.HAMI, "hami-host-gone", "v100-25", (GPU_A,),
     {"CUDA_DEVICE_MEMORY_LIMIT_0": "8192m", **HAMI_TAIL}, HAMI, True, "libvgpu.so: No such file"),
    ("off", LimiterMode.OFF, "installed", "v100-25", (GPU_A,), {}, [], False, ""),
    ("no limiter configured", None, "installed", "v100-25", (GPU_A,), {}, [], False, ""),
]


@pytest.mark.parametrize(("mode", "state", "product", "gpus", "env", "mounts", "has_state", "missing"),
                         [pytest.param(*c[1:], id=c[0]) for c in CASES])
def test_slice_edits_with_the_limiter(tmp_path: Path, mode: LimiterMode | None, state: str, product: str,
                                      gpus: tuple[str, ...], env: dict[str, str], mounts: list[tuple[str, bool]],
                                      has_state: bool, missing: str) -> None:
    limiter = _node(tmp_path, mode, state)
    edits = slice_edits(record(product, gpus), UID, MINORS, EditsConfig(dev_root=tmp_path, limiter=limiter))
    got = edits.env_map()
    assert {k: v for k, v in got.items() if k.startswith(LIMITER_KEYS)} == env
    assert got["NVIDIA_VISIBLE_DEVICES"] == ",".join(gpus) and got["GPUSLICE_POD_UID"] == UID  # the card still
    assert [(m.container_path, m.read_only) for m in edits.mounts] == mounts
    if has_state:
        assert limiter is not None and edits.state_dir == f"{limiter.host.state_root}/{UID}"
        assert {m.container_path: m.host_path for m in edits.mounts}[CONTAINER_STATE_DIR] == edits.state_dir
    else:
        assert edits.state_dir is None
    for m in edits.mounts:
        if m.read_only:  # a mounted file is always one the node has
            assert Path(m.host_path).is_file(), m
    assert (missing in "; ".join(edits.limiter_missing)) if missing else edits.limiter_missing == ()
    if missing:
        assert edits.limiter_missing


# ---- installing it -------------------------------------------------------------------------------

def test_install_copies_atomically_and_is_idempotent(tmp_path: Path) -> None:
    limiter = installed(tmp_path)
    host = limiter.host
    assert Path(host.library).read_bytes() == LIBRARY and os.stat(host.library).st_mode & 0o777 == 0o755
    assert Path(host.preload_file).read_text() == CONTAINER_LIBRARY + "\n"
    assert os.stat(host.state_root).st_mode & 0o777 == 0o700 and limiter.missing() == ()
    source = tmp_path / "image" / "libgpuslice-limiter.so"
    assert install(limiter, source) == []  # nothing to do the second time
    # an upgrade: a container that mounted the old library keeps its inode; new mounts get the new one
    old_inode = os.stat(host.library).st_ino
    with open(host.library, "rb") as held:
        source.write_bytes(LIBRARY + b" v2")
        assert install(limiter, source) == [f"installed {host.library} from {source}"]
        assert held.read() == LIBRARY
    assert Path(host.library).read_bytes() == LIBRARY + b" v2" and os.stat(host.library).st_ino != old_inode
    assert not [p for p in Path(host.library).parent.iterdir() if p.name.startswith(".")]  # no temporary left
    # an image without the library: what is installed stays, and that is said
    assert install(limiter, tmp_path / "nowhere.so") == [f"no limiter library at {tmp_path / 'nowhere.so'} to install"]
    assert Path(host.library).read_bytes() == LIBRARY + b" v2"


def test_install_for_hami_makes_its_lock_directory_and_preload_file(tmp_path: Path) -> None:
    (tmp_path / "libvgpu.so").write_bytes(b"\x7fELF")
    limiter = installed(tmp_path, LimiterMode.HAMI, str(tmp_path / "libvgpu.so"))
    assert os.stat(limiter.host.hami_lock_dir).st_mode & 0o7777 == 0o1777
    assert Path(limiter.host.hami_preload_file).read_text() == HAMI_CONTAINER_LIBRARY + "\n"
    assert not Path(limiter.host.library).exists()  # ours is not installed: the two are never stacked
    assert limiter.missing() == ()


# ---- the state directory beside the specs ----------------------------------------------------------

def writer(tmp: Path, limiter: NodeLimiter, events: RecordingEventSink | None = None) -> Writer:
    return Writer(SpecDir(tmp / "cdi"), lambda: MINORS, EditsConfig(dev_root=tmp, limiter=limiter), events)


def test_the_state_directory_lives_while_a_spec_mounts_it(tmp_path: Path) -> None:
    limiter = installed(tmp_path)
    w = writer(tmp_path, limiter)
    state = Path(limiter.host.state_root) / UID
    w.write(f"claim-{OTHER}", pod())  # DRA's spec of the pod
    assert state.is_dir() and os.stat(state).st_mode & 0o777 == 0o777 and not list(state.iterdir())
    w.write(f"pod-{UID}", pod())  # NRI's spec of the same pod (written at sandbox start)
    (state / "gpuslice-ledger.v1").write_bytes(b"ledger")  # what the container's processes leave
    outside = tmp_path / "outside"
    outside.write_text("keep")
    (state / "escape").symlink_to(outside)
    assert w.remove(f"claim-{OTHER}") and state.is_dir()  # the NRI spec still mounts it
    assert w.remove(f"pod-{UID}") and not state.exists()
    assert outside.read_text() == "keep"  # a container's symlink is removed, never followed
    assert not w.remove(f"pod-{UID}")  # already done: not an error
    assert w.specs.written() == []


def test_reconcile_after_a_restart_repairs_from_the_specs(tmp_path: Path) -> None:
    limiter = installed(tmp_path)
    w = writer(tmp_path, limiter)
    w.write(f"pod-{UID}", pod())
    state = Path(limiter.host.state_root) / UID
    state.rmdir()  # wiped while the agent was away
    stale = Path(limiter.host.state_root) / OTHER  # its pod left while the agent was away
    stale.mkdir()
    (stale / "gpuslice-ledger.v1").write_bytes(b"x")
    again = writer(tmp_path, limiter)
    again.reconcile()
    assert state.is_dir() and not stale.exists()
    again.reconcile()  # idempotent
    assert state.is_dir()


def test_a_failed_spec_write_leaves_no_state_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    limiter = installed(tmp_path)
    w = writer(tmp_path, limiter)

    def refuse(*args: object, **kwargs: object) -> Path:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(w.specs, "write", refuse)
    with pytest.raises(OSError, match="No space"):
        w.write(f"pod-{UID}", pod())
    assert not (Path(limiter.host.state_root) / UID).exists()


def test_a_state_directory_it_cannot_make_is_a_clear_handoff_error(tmp_path: Path) -> None:
    limiter = installed(tmp_path)
    (Path(limiter.host.state_root) / UID).write_text("a file where the directory goes")
    with pytest.raises(HandoffError, match="cannot create the in-container limiter's state directory"):
        writer(tmp_path, limiter).write(f"pod-{UID}", pod())
    assert SpecDir(tmp_path / "cdi").written() == []


def test_release_only_touches_children_of_the_state_root(tmp_path: Path) -> None:
    make_state_dir(str(tmp_path / "root" / "a"))
    assert os.stat(tmp_path / "root").st_mode & 0o777 == 0o700
    for bad in (str(tmp_path / "elsewhere"), str(tmp_path / "root" / "a" / "deeper"), str(tmp_path / "root")):
        with pytest.raises(ValueError, match="not a state directory"):
            release_state_dir(bad, str(tmp_path / "root"))
    assert release_state_dir(str(tmp_path / "root" / "a"), str(tmp_path / "root"))
    assert not release_state_dir(str(tmp_path / "root" / "a"), str(tmp_path / "root"))


# ---- a node without the library says so ------------------------------------------------------------

def _metrics(writer: Writer) -> dict[tuple[str, str], float]:
    m = AgentMetrics()
    m.update_handoff(writer)
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(m.render().decode()):
        for s in family.samples:
            ours = s.name.startswith(("gpuslice_agent_limiter", "gpuslice_agent_handoffs"))
            if ours and not s.name.endswith("_created"):
                out[(s.name, s.labels.get("mode", ""))] = s.value
    return out


def test_a_node_without_the_library_says_so_and_mounts_nothing(tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    limiter = installed(tmp_path)
    Path(limiter.host.library).unlink()
    events = RecordingEventSink()
    w = writer(tmp_path, limiter, events)
    caplog.set_level(logging.INFO, logger="enforcement.handoff")
    assert w.limiter_missing()  # at start
    w.write(f"claim-{OTHER}", pod())
    w.write(f"pod-{UID}", pod())  # the same pod through a second path: one event per pod
    w.write(f"pod-{OTHER}", pod(OTHER, "server", "v100-50"))
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "not installed on this node" in errors[0] and "watchdog alone" in errors[0]
    assert [(e.pod, e.reason) for e in events.events] == [("trainer", LIMITER_MISSING), ("server", LIMITER_MISSING)]
    assert "16384 MiB" in events.events[1].message and "watchdog kills" in events.events[1].message
    assert w.without_limiter == 3
    spec = w.specs.read(f"pod-{UID}")
    assert spec is not None and "mounts" not in spec["devices"][0]["containerEdits"]
    assert "GPUSLICE_SLICE_MEMORY_MIB=8192" in spec["devices"][0]["containerEdits"]["env"]
    assert not list(Path(limiter.host.state_root).iterdir())  # no state directory without the library
    assert _metrics(w) == {("gpuslice_agent_limiter_installed", "gpuslice"): 0.0,
                           ("gpuslice_agent_handoffs_without_limiter_total", ""): 3.0}
    # installed (e.g. the agent restarted from a fixed image): said, and the next hand-off has it
    install(limiter, tmp_path / "image" / "libgpuslice-limiter.so")
    w.write(f"pod-{UID}", pod())
    assert any("installed in" in r.getMessage() for r in caplog.records)
    spec = w.specs.read(f"pod-{UID}")
    assert spec is not None and len(spec["devices"][0]["containerEdits"]["mounts"]) == 3
    assert _metrics(w)[("gpuslice_agent_limiter_installed", "gpuslice")] == 1.0


# ---- the HAMi opt-in: a flag and its environment twin ----------------------------------------------

def _args(argv: list[str]) -> argparse.Namespace:
    return cli.parser().parse_args(argv)


def test_defaults_are_ours_under_var_lib() -> None:
    args = _args([])
    assert args.limiter is LimiterMode.GPUSLICE
    assert args.limiter_dir == Path("/var/lib/gpuslice/limiter")
    assert args.limiter_source == Path("/usr/local/lib/gpuslice/libgpuslice-limiter.so")


@pytest.mark.parametrize("how", ["flag", "env"])
def test_the_hami_opt_in_turns_ours_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str) -> None:
    (tmp_path / "image").mkdir()
    (tmp_path / "image" / "lib.so").write_bytes(LIBRARY)
    argv = ["--limiter-dir", str(tmp_path / "limiter"), "--limiter-source", str(tmp_path / "image" / "lib.so")]
    if how == "flag":
        argv += ["--limiter", "hami"]
    else:
        monkeypatch.setenv("GPUSLICE_AGENT_LIMITER", "hami")
    limiter = node_limiter(_args(argv))
    assert limiter.mode is LimiterMode.HAMI and not Path(limiter.host.library).exists()
    env = slice_edits(record(), UID, MINORS, EditsConfig(dev_root=tmp_path, limiter=limiter)).env_map()
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "8192m"
    assert not [k for k in env if k in ("GPUSLICE_SLICE_MEMORY_MIB", "GPUSLICE_SLICE_STATE_DIR")]


@pytest.mark.parametrize(("env", "argv"), [("hamy", []), ("", ["--limiter", "hamy"])], ids=["env", "flag"])
def test_a_bad_limiter_mode_is_refused_with_its_name(monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str], env: str,
                                                     argv: list[str]) -> None:
    if env:
        monkeypatch.setenv("GPUSLICE_AGENT_LIMITER", env)
    with pytest.raises(SystemExit):
        _args(argv)
    assert "'hamy' is not one of gpuslice, hami, off" in capsys.readouterr().err
