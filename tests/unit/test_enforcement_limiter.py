"""The hand-off's limiter edits, case by case: our library, HAMi-core's opt-in, off, files missing, bad input."""

from __future__ import annotations

import pytest

from enforcement.edits import Mount
from enforcement.limiter import (
    CONTAINER_LIBRARY,
    CONTAINER_PRELOAD,
    CONTAINER_STATE_DIR,
    HAMI_CONTAINER_LIBRARY,
    HAMI_LOCK_DIR,
    LimiterEdits,
    LimiterHost,
    LimiterMode,
    limiter_edits,
    preload_line,
)
from packing.products import load_catalog

HOST = LimiterHost()
STATE = f"{HOST.state_root}/claim-1"
OURS_MOUNTS = (
    Mount(HOST.library, CONTAINER_LIBRARY, read_only=True),
    Mount(HOST.preload_file, CONTAINER_PRELOAD, read_only=True),
    Mount(STATE, CONTAINER_STATE_DIR, read_only=False),
)
HAMI_ENV_TAIL = (
    ("CUDA_DEVICE_MEMORY_SHARED_CACHE", f"{CONTAINER_STATE_DIR}/vgpu.cache"),
    ("GPU_CORE_UTILIZATION_POLICY", "disable"),
    ("LIBCUDA_LOG_LEVEL", "0"),
)
HAMI_MOUNTS = (Mount(STATE, CONTAINER_STATE_DIR, read_only=False),
               Mount(HOST.hami_lock_dir, HAMI_LOCK_DIR, read_only=False))
GONE = ("/var/lib/gpuslice/limiter/libgpuslice-limiter.so: No such file or directory",)

CASES = [
    pytest.param(
        8192, 1, LimiterMode.GPUSLICE, HOST,
        LimiterEdits(
            (("GPUSLICE_SLICE_MEMORY_MIB", "8192"), ("GPUSLICE_SLICE_STATE_DIR", CONTAINER_STATE_DIR)),
            OURS_MOUNTS, STATE,
        ),
        id="v100-25 ours",
    ),
    pytest.param(
        32768, 2, LimiterMode.GPUSLICE, HOST,
        LimiterEdits(
            (("GPUSLICE_SLICE_MEMORY_MIB", "32768"), ("GPUSLICE_SLICE_STATE_DIR", CONTAINER_STATE_DIR)),
            OURS_MOUNTS, STATE,
        ),
        id="two whole cards ours: one cap per device",
    ),
    pytest.param(
        16384, 2, LimiterMode.HAMI, HOST,
        LimiterEdits(
            (("CUDA_DEVICE_MEMORY_LIMIT_0", "16384m"), ("CUDA_DEVICE_MEMORY_LIMIT_1", "16384m"), *HAMI_ENV_TAIL),
            HAMI_MOUNTS, STATE,
        ),
        id="v100-50 x2 HAMi, libvgpu from the image: none of ours",
    ),
    pytest.param(
        8192, 1, LimiterMode.HAMI, LimiterHost(hami_library="/opt/hami/libvgpu.so"),
        LimiterEdits(
            (("CUDA_DEVICE_MEMORY_LIMIT_0", "8192m"), *HAMI_ENV_TAIL),
            (*HAMI_MOUNTS, Mount("/opt/hami/libvgpu.so", HAMI_CONTAINER_LIBRARY, read_only=True),
             Mount(HOST.hami_preload_file, CONTAINER_PRELOAD, read_only=True)),
            STATE,
        ),
        id="v100-25 HAMi, libvgpu from the host",
    ),
    pytest.param(
        8192, 1, LimiterMode.GPUSLICE, HOST,
        LimiterEdits((("GPUSLICE_SLICE_MEMORY_MIB", "8192"),), (), None, GONE),
        id="ours, library missing: the cap only, nothing mounted, no state directory",
    ),
    pytest.param(
        8192, 1, LimiterMode.HAMI, LimiterHost(hami_library="/opt/hami/libvgpu.so"),
        LimiterEdits((("CUDA_DEVICE_MEMORY_LIMIT_0", "8192m"), *HAMI_ENV_TAIL), HAMI_MOUNTS, STATE, GONE),
        id="HAMi, host libvgpu missing: its variables, not its mounts",
    ),
    pytest.param(8192, 1, LimiterMode.OFF, HOST, LimiterEdits((), (), None), id="off: nothing"),
]


@pytest.mark.parametrize(("cap", "devices", "mode", "host", "want"), CASES)
def test_edits(cap: int, devices: int, mode: LimiterMode, host: LimiterHost, want: LimiterEdits) -> None:
    assert limiter_edits(cap, devices, "claim-1", mode, host, want.missing) == want


def test_the_layout_under_one_directory_is_the_default_one() -> None:
    assert LimiterHost.under("/var/lib/gpuslice/limiter/") == HOST
    assert LimiterHost.under("/x", "/h/libvgpu.so").files(LimiterMode.HAMI) == (
        ("/h/libvgpu.so", None), ("/x/hami-ld.so.preload", preload_line(LimiterMode.HAMI)))
    assert HOST.files(LimiterMode.HAMI) == () and HOST.files(LimiterMode.OFF) == ()


def test_hami_mode_turns_ours_off() -> None:
    edits = limiter_edits(8192, 1, "claim-1", LimiterMode.HAMI)
    assert not any(k.startswith("GPUSLICE_") for k, _ in edits.env)
    assert all(m.host_path != HOST.library for m in edits.mounts)


def test_env_list_is_cdi_shaped() -> None:
    assert limiter_edits(8192, 1, "claim-1").env_list() == [
        "GPUSLICE_SLICE_MEMORY_MIB=8192",
        f"GPUSLICE_SLICE_STATE_DIR={CONTAINER_STATE_DIR}",
    ]


def test_preload_lines_name_the_container_paths() -> None:
    assert preload_line() == CONTAINER_LIBRARY + "\n"
    assert preload_line(LimiterMode.HAMI) == HAMI_CONTAINER_LIBRARY + "\n"


def test_every_product_cap_is_one_the_library_accepts() -> None:
    for product in load_catalog().products:
        edits = limiter_edits(product.memory_mib, 1, "claim-1")
        assert dict(edits.env)["GPUSLICE_SLICE_MEMORY_MIB"] == str(product.memory_mib)


@pytest.mark.parametrize(
    ("cap", "devices", "key", "message"),
    [
        (0, 1, "claim-1", "cap_mib"),
        (1 << 25, 1, "claim-1", "cap_mib"),
        (8192, 0, "claim-1", "devices"),
        (8192, 17, "claim-1", "devices"),
        (8192, 1, "", "state key"),
        (8192, 1, "../etc", "state key"),
        (8192, 1, "a/b", "state key"),
        (8192, 1, ".hidden", "state key"),
        (8192, 1, "x" * 201, "state key"),
    ],
)
def test_bad_input_is_refused_clearly(cap: int, devices: int, key: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        limiter_edits(cap, devices, key)
