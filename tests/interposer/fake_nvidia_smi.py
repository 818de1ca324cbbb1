"""The few nvidia-smi queries real_gpu_check.sh makes, answered through NVML with ctypes (so,
like the real nvidia-smi, through the limiter when it is preloaded). For running that script
against the fake driver; the real nvidia-smi is used on a GPU machine."""

from __future__ import annotations

import ctypes
import sys

MIB = 1 << 20


class Memory(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class ProcessInfo(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong), ("gpuInstanceId", ctypes.c_uint),
                ("computeInstanceId", ctypes.c_uint)]


def main(argv: list[str]) -> int:
    nvml = ctypes.CDLL("libnvidia-ml.so.1")
    if nvml.nvmlInit_v2() != 0:
        print("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")
        return 9
    count = ctypes.c_uint()
    nvml.nvmlDeviceGetCount_v2(ctypes.byref(count))
    indexes = range(count.value)
    if "-i" in argv:
        indexes = range(int(argv[argv.index("-i") + 1]), int(argv[argv.index("-i") + 1]) + 1)
    handles = []
    for i in indexes:
        handle = ctypes.c_void_p()
        nvml.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(handle))
        handles.append((i, handle))
    for i, handle in handles:
        name, uuid = ctypes.create_string_buffer(96), ctypes.create_string_buffer(96)
        nvml.nvmlDeviceGetName(handle, name, 96)
        nvml.nvmlDeviceGetUUID(handle, uuid, 96)
        if "-L" in argv:
            print(f"GPU {i}: {name.value.decode()} (UUID: {uuid.value.decode()})")
        elif "--query-gpu=name,memory.total" in argv:
            memory = Memory()
            nvml.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(memory))
            print(f"{name.value.decode()}, {memory.total // MIB}")
        elif "--query-gpu=memory.total" in argv:
            memory = Memory()
            nvml.nvmlDeviceGetMemoryInfo(handle, ctypes.byref(memory))
            print(memory.total // MIB)
        elif "--query-compute-apps=pid,used_memory" in argv:
            infos, n = (ProcessInfo * 64)(), ctypes.c_uint(64)
            nvml.nvmlDeviceGetComputeRunningProcesses_v3(handle, ctypes.byref(n), infos)
            for p in infos[: n.value]:
                print(f"{p.pid}, {p.usedGpuMemory // MIB}")
        else:
            print(f"fake nvidia-smi: unsupported query {argv}", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
