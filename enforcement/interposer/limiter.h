/* Internal interface of libgpuslice-limiter: configuration, the hook registry, the container
 * ledger and the per-process allocation table. Only the hooks and dlsym are exported. */
#ifndef GPUSLICE_LIMITER_H
#define GPUSLICE_LIMITER_H

#include "abi.h"

#define EXPORT __attribute__((visibility("default")))
/* For code a sanitizer runtime itself calls before it has initialised (its dlsym lookups). */
#define NOT_INSTRUMENTED __attribute__((no_sanitize("address", "undefined")))
#define MIB (1024ull * 1024ull)

/* config.c */
struct limiter_config {
    int active;              /* a valid GPUSLICE_SLICE_MEMORY_MIB is set */
    uint64_t cap_bytes;      /* per visible device */
    uint64_t context_bytes;  /* charged once per process and device for what a context holds */
    const char *state_dir;   /* NULL: this process is accounted alone */
};
const struct limiter_config *limiter_config(void);
void limiter_warn(const char *what, const char *detail);

/* resolve.c: every driver symbol the limiter wraps (hook != NULL) or calls (hook == NULL).
 * One list, so the exported set, the dlsym answers and the cuGetProcAddress answers agree. */
#define LIMITER_CUDA "libcuda.so.1"
#define LIMITER_NVML "libnvidia-ml.so.1"
#define LIMITER_SYMBOLS(HOOK, CALL)                                   \
    HOOK(cuDeviceTotalMem, LIMITER_CUDA)                              \
    HOOK(cuDeviceTotalMem_v2, LIMITER_CUDA)                           \
    HOOK(cuMemGetInfo, LIMITER_CUDA)                                  \
    HOOK(cuMemGetInfo_v2, LIMITER_CUDA)                               \
    HOOK(cuMemAlloc, LIMITER_CUDA)                                    \
    HOOK(cuMemAlloc_v2, LIMITER_CUDA)                                 \
    HOOK(cuMemAllocPitch, LIMITER_CUDA)                               \
    HOOK(cuMemAllocPitch_v2, LIMITER_CUDA)                            \
    HOOK(cuMemAllocManaged, LIMITER_CUDA)                             \
    HOOK(cuMemAllocAsync, LIMITER_CUDA)                               \
    HOOK(cuMemAllocAsync_ptsz, LIMITER_CUDA)                          \
    HOOK(cuMemAllocFromPoolAsync, LIMITER_CUDA)                       \
    HOOK(cuMemAllocFromPoolAsync_ptsz, LIMITER_CUDA)                  \
    HOOK(cuMemCreate, LIMITER_CUDA)                                   \
    HOOK(cuMemFree, LIMITER_CUDA)                                     \
    HOOK(cuMemFree_v2, LIMITER_CUDA)                                  \
    HOOK(cuMemFreeAsync, LIMITER_CUDA)                                \
    HOOK(cuMemFreeAsync_ptsz, LIMITER_CUDA)                           \
    HOOK(cuMemRelease, LIMITER_CUDA)                                  \
    HOOK(cuGetProcAddress, LIMITER_CUDA)                              \
    HOOK(cuGetProcAddress_v2, LIMITER_CUDA)                           \
    HOOK(nvmlDeviceGetMemoryInfo, LIMITER_NVML)                       \
    HOOK(nvmlDeviceGetMemoryInfo_v2, LIMITER_NVML)                    \
    CALL(cuCtxGetDevice, LIMITER_CUDA)                                \
    CALL(cuDeviceGetUuid, LIMITER_CUDA)                               \
    CALL(nvmlDeviceGetUUID, LIMITER_NVML)

#define LIMITER_ID(name, lib) SYM_##name,
enum limiter_symbol { LIMITER_SYMBOLS(LIMITER_ID, LIMITER_ID) SYM_COUNT };
#undef LIMITER_ID

#define LIMITER_DECLARE(name, lib) EXPORT name##_t name;
#define LIMITER_SKIP(name, lib)
LIMITER_SYMBOLS(LIMITER_DECLARE, LIMITER_SKIP)

/* The driver's own function, or NULL when no loaded library has it. */
void *limiter_real(enum limiter_symbol id);
#define REAL(name) ((name##_t *)limiter_real(SYM_##name))
/* Our hook for what cuGetProcAddress(base, version, flags) returned, or that pointer itself
 * when we do not wrap it. */
void *limiter_proc_hook(const char *base, void *driver_fn, int cuda_version, cuuint64_t flags);

/* ledger.c: the container's accounting, shared by its processes through the state directory.
 * Devices are named by UUID (CUDA ordinals and NVML indexes need not agree). */
#define LEDGER_NO_DEVICE (-1)
int ledger_charge(const unsigned char uuid[16], uint64_t bytes, int *device); /* 0, or -1: past the cap */
void ledger_refund(int device, uint64_t bytes);
uint64_t ledger_used(const unsigned char uuid[16], int attach); /* attach: this process has a context there */

/* table.c: this process's live allocations, so a free knows what it returns. */
enum { KIND_POINTER = 1, KIND_HANDLE = 2 };
struct allocation {
    uint64_t key;
    uint64_t bytes;
    int device;
    int kind;
};
/* Records a; a stale entry under the same key (freed behind our back) is returned in *stale. */
int table_put(const struct allocation *a, struct allocation *stale);
int table_take(int kind, uint64_t key, struct allocation *out);

#endif
