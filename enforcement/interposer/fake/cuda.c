/* A fake libcuda.so.1 over the simulated cards (card.c): the driver calls the limiter wraps or
 * needs, with the driver's error rules (no cuInit, no context, bad arguments, a full card).
 * Built with -Bsymbolic-functions: like the real driver, its own references never reach a
 * preloaded library. FAKEGPU_PROC_ADDRESS=trampoline makes cuGetProcAddress hand out pointers
 * that dlsym does not (as a driver with internal entry points may). */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "../abi.h"
#include "card.h"

#define DRIVER_VERSION 12040
#define GRANULARITY (2ull << 20)
#define PITCH_ALIGN 512ull
#define ALLOCATIONS 8192

#define FAKE(name) __attribute__((visibility("default"))) name##_t name;
FAKE(cuInit) FAKE(cuDeviceGet) FAKE(cuDeviceGetCount) FAKE(cuDeviceGetUuid) FAKE(cuDeviceTotalMem)
FAKE(cuDeviceTotalMem_v2) FAKE(cuCtxCreate_v2) FAKE(cuCtxGetDevice) FAKE(cuCtxSetCurrent) FAKE(cuDevicePrimaryCtxRetain) FAKE(cuMemGetInfo) FAKE(cuMemGetInfo_v2)
FAKE(cuMemAlloc) FAKE(cuMemAlloc_v2) FAKE(cuMemAllocPitch) FAKE(cuMemAllocPitch_v2) FAKE(cuMemAllocManaged)
FAKE(cuMemAllocAsync) FAKE(cuMemAllocAsync_ptsz) FAKE(cuMemAllocFromPoolAsync) FAKE(cuMemAllocFromPoolAsync_ptsz)
FAKE(cuMemCreate) FAKE(cuMemFree) FAKE(cuMemFree_v2) FAKE(cuMemFreeAsync) FAKE(cuMemFreeAsync_ptsz)
FAKE(cuMemRelease) FAKE(cuGetProcAddress) FAKE(cuGetProcAddress_v2)

struct CUctx_st {
    int card;
    int ordinal;
};

static struct CUctx_st contexts[CARD_MAX];
static int context_charged[CARD_MAX];
static __thread CUcontext current;
static int initialised;

struct allocation {
    uint64_t key;
    uint64_t bytes;
    int card;
    int kind; /* 0 free, 1 pointer, 2 handle */
    int v1;
};

static pthread_mutex_t mutex = PTHREAD_MUTEX_INITIALIZER;
static struct allocation allocations[ALLOCATIONS];
static uint64_t next_address[CARD_MAX];
static uint64_t next_v1_address = 0x10000000;
static uint64_t next_handle = 0x1000;
static int live_v1; /* the 32-bit address space starts over once it is empty */

static CUresult ready(void)
{
    if (!initialised)
        return CUDA_ERROR_NOT_INITIALIZED;
    return CUDA_SUCCESS;
}

static CUresult valid_ordinal(int ordinal)
{
    CUresult rc = ready();
    if (rc != CUDA_SUCCESS)
        return rc;
    return ordinal >= 0 && ordinal < card_count() ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE;
}

CUresult cuInit(unsigned int flags)
{
    if (flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (card_no_device())
        return CUDA_ERROR_NO_DEVICE;
    initialised = 1;
    return CUDA_SUCCESS;
}

CUresult cuDeviceGetCount(int *count)
{
    CUresult rc = ready();
    if (rc == CUDA_SUCCESS && count == NULL)
        rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS)
        *count = card_count();
    return rc;
}

CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    CUresult rc = valid_ordinal(ordinal);
    if (rc == CUDA_SUCCESS && device == NULL)
        rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS)
        *device = ordinal;
    return rc;
}

CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice device)
{
    CUresult rc = valid_ordinal(device);
    if (rc == CUDA_SUCCESS && uuid == NULL)
        rc = CUDA_ERROR_INVALID_VALUE;
    if (rc == CUDA_SUCCESS)
        card_uuid(card_of_ordinal(device), (unsigned char *)uuid->bytes);
    return rc;
}

static CUresult total_mem(uint64_t *bytes, CUdevice device)
{
    CUresult rc = valid_ordinal(device);
    if (rc == CUDA_SUCCESS)
        *bytes = CARD_TOTAL;
    return rc;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice device)
{
    uint64_t b;
    if (bytes == NULL)
        return ready() ? ready() : CUDA_ERROR_INVALID_VALUE;
    CUresult rc = total_mem(&b, device);
    if (rc == CUDA_SUCCESS)
        *bytes = b;
    return rc;
}

/* The 32-bit ABI cannot say 32 GiB: it answers the largest value it can hold. */
CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice device)
{
    uint64_t b;
    if (bytes == NULL)
        return ready() ? ready() : CUDA_ERROR_INVALID_VALUE;
    CUresult rc = total_mem(&b, device);
    if (rc == CUDA_SUCCESS)
        *bytes = b > 0xffffffffull ? 0xffffffffu : (unsigned int)b;
    return rc;
}

CUresult cuCtxCreate_v2(CUcontext *ctx, unsigned int flags, CUdevice device)
{
    (void)flags;
    CUresult rc = valid_ordinal(device);
    if (rc == CUDA_SUCCESS && ctx == NULL)
        rc = CUDA_ERROR_INVALID_VALUE;
    if (rc != CUDA_SUCCESS)
        return rc;
    int card = card_of_ordinal(device);
    pthread_mutex_lock(&mutex);
    if (!context_charged[card]) {
        if (card_take(card, card_context_bytes()) != 0) {
            pthread_mutex_unlock(&mutex);
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        context_charged[card] = 1;
    }
    pthread_mutex_unlock(&mutex);
    contexts[device].card = card;
    contexts[device].ordinal = device;
    current = &contexts[device];
    *ctx = current;
    return CUDA_SUCCESS;
}

/* One context per card and process here: the primary context is that one. */
CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice device)
{
    CUcontext keep = current;
    CUresult rc = cuCtxCreate_v2(ctx, 0, device);
    current = keep; /* retaining does not make it current */
    return rc;
}

CUresult cuCtxSetCurrent(CUcontext ctx)
{
    CUresult rc = ready();
    if (rc == CUDA_SUCCESS && ctx != NULL && (ctx < &contexts[0] || ctx >= &contexts[card_count()]))
        rc = CUDA_ERROR_INVALID_CONTEXT;
    if (rc == CUDA_SUCCESS)
        current = ctx;
    return rc;
}

CUresult cuCtxGetDevice(CUdevice *device)
{
    CUresult rc = ready();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (current == NULL)
        return CUDA_ERROR_INVALID_CONTEXT;
    if (device == NULL)
        return CUDA_ERROR_INVALID_VALUE;
    *device = current->ordinal;
    return CUDA_SUCCESS;
}

static CUresult in_context(void)
{
    CUresult rc = ready();
    if (rc == CUDA_SUCCESS && current == NULL)
        rc = CUDA_ERROR_INVALID_CONTEXT;
    return rc;
}

static CUresult mem_info(uint64_t *free_bytes, uint64_t *total_bytes)
{
    CUresult rc = in_context();
    if (rc != CUDA_SUCCESS)
        return rc;
    *total_bytes = CARD_TOTAL;
    *free_bytes = CARD_TOTAL - card_used(current->card);
    return CUDA_SUCCESS;
}

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
    uint64_t f, t;
    if (free_bytes == NULL || total_bytes == NULL)
        return in_context() ? in_context() : CUDA_ERROR_INVALID_VALUE;
    CUresult rc = mem_info(&f, &t);
    if (rc == CUDA_SUCCESS) {
        *free_bytes = f;
        *total_bytes = t;
    }
    return rc;
}

CUresult cuMemGetInfo(unsigned int *free_bytes, unsigned int *total_bytes)
{
    uint64_t f, t;
    if (free_bytes == NULL || total_bytes == NULL)
        return in_context() ? in_context() : CUDA_ERROR_INVALID_VALUE;
    CUresult rc = mem_info(&f, &t);
    if (rc == CUDA_SUCCESS) {
        *free_bytes = f > 0xffffffffull ? 0xffffffffu : (unsigned int)f;
        *total_bytes = t > 0xffffffffull ? 0xffffffffu : (unsigned int)t;
    }
    return rc;
}

/* Takes room on the card and records the allocation; its key is a fresh address or handle. */
static CUresult allocate(int card, uint64_t bytes, int kind, int v1, uint64_t *key)
{
    pthread_mutex_lock(&mutex);
    int slot = -1;
    for (int i = 0; i < ALLOCATIONS && slot < 0; i++)
        if (allocations[i].kind == 0)
            slot = i;
    CUresult rc = CUDA_SUCCESS;
    if (slot < 0 || card_take(card, bytes) != 0)
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    else if (v1 && next_v1_address + bytes > 0xffffffffull) {
        card_give(card, bytes);
        rc = CUDA_ERROR_OUT_OF_MEMORY; /* the 32-bit address space is full */
    }
    if (rc == CUDA_SUCCESS) {
        uint64_t *next = kind == 2 ? &next_handle : v1 ? &next_v1_address : &next_address[card];
        if (*next == 0)
            *next = 0x7f0000000000ull + ((uint64_t)card << 40);
        *key = *next;
        *next += kind == 2 ? 1 : (bytes + GRANULARITY - 1) / GRANULARITY * GRANULARITY;
        allocations[slot] = (struct allocation){*key, bytes, card, kind, v1};
        live_v1 += v1;
    }
    pthread_mutex_unlock(&mutex);
    return rc;
}

static CUresult release(uint64_t key, int kind)
{
    CUresult rc = ready();
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&mutex);
    rc = CUDA_ERROR_INVALID_VALUE;
    for (int i = 0; i < ALLOCATIONS; i++)
        if (allocations[i].kind == kind && allocations[i].key == key) {
            card_give(allocations[i].card, allocations[i].bytes);
            allocations[i].kind = 0;
            if (allocations[i].v1 && --live_v1 == 0)
                next_v1_address = 0x10000000;
            rc = CUDA_SUCCESS;
            break;
        }
    pthread_mutex_unlock(&mutex);
    return rc;
}

static CUresult alloc_current(uint64_t *key, uint64_t bytes, int v1)
{
    CUresult rc = in_context();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (key == NULL || bytes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    return allocate(current->card, bytes, 1, v1, key);
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes)
{
    uint64_t key;
    CUresult rc = alloc_current(dptr ? &key : NULL, bytes, 0);
    if (rc == CUDA_SUCCESS)
        *dptr = key;
    return rc;
}

CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytes)
{
    uint64_t key;
    CUresult rc = alloc_current(dptr ? &key : NULL, bytes, 1);
    if (rc == CUDA_SUCCESS)
        *dptr = (CUdeviceptr_v1)key;
    return rc;
}

static CUresult alloc_pitch(uint64_t *key, uint64_t *pitch, uint64_t width, uint64_t height, unsigned int element,
                            int v1)
{
    CUresult rc = in_context();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (key == NULL || pitch == NULL || width == 0 || height == 0 || (element != 4 && element != 8 && element != 16))
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t p = (width + PITCH_ALIGN - 1) / PITCH_ALIGN * PITCH_ALIGN;
    if (height > CARD_TOTAL / p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    rc = allocate(current->card, p * height, 1, v1, key);
    if (rc == CUDA_SUCCESS)
        *pitch = p;
    return rc;
}

CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height, unsigned int element)
{
    uint64_t key, p;
    CUresult rc = alloc_pitch(dptr ? &key : NULL, pitch ? &p : NULL, width, height, element, 0);
    if (rc == CUDA_SUCCESS) {
        *dptr = key;
        *pitch = p;
    }
    return rc;
}

CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pitch, unsigned int width, unsigned int height,
                         unsigned int element)
{
    uint64_t key, p;
    CUresult rc = alloc_pitch(dptr ? &key : NULL, pitch ? &p : NULL, width, height, element, 1);
    if (rc == CUDA_SUCCESS) {
        *dptr = (CUdeviceptr_v1)key;
        *pitch = (unsigned int)p;
    }
    return rc;
}

CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytes, unsigned int flags)
{
    if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST)
        return in_context() ? in_context() : CUDA_ERROR_INVALID_VALUE;
    return cuMemAlloc_v2(dptr, bytes);
}

CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytes, CUstream stream)
{
    (void)stream;
    return cuMemAlloc_v2(dptr, bytes);
}

CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUstream stream)
{
    (void)stream;
    return cuMemAlloc_v2(dptr, bytes);
}

CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream stream)
{
    (void)stream;
    if (pool == NULL)
        return in_context() ? in_context() : CUDA_ERROR_INVALID_VALUE;
    return cuMemAlloc_v2(dptr, bytes);
}

CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream stream)
{
    return cuMemAllocFromPoolAsync(dptr, bytes, pool, stream);
}

CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t bytes, const CUmemAllocationProp *prop,
                     unsigned long long flags)
{
    CUresult rc = ready();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (handle == NULL || prop == NULL || flags != 0 || bytes == 0 || bytes % GRANULARITY != 0 ||
        prop->type != CU_MEM_ALLOCATION_TYPE_PINNED || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    if (valid_ordinal(prop->location.id) != CUDA_SUCCESS)
        return CUDA_ERROR_INVALID_DEVICE;
    uint64_t key;
    rc = allocate(card_of_ordinal(prop->location.id), bytes, 2, 0, &key);
    if (rc == CUDA_SUCCESS)
        *handle = key;
    return rc;
}

CUresult cuMemFree_v2(CUdeviceptr dptr) { return release(dptr, 1); }
CUresult cuMemFree(CUdeviceptr_v1 dptr) { return release(dptr, 1); }
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream) { return (void)stream, release(dptr, 1); }
CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream) { return (void)stream, release(dptr, 1); }
CUresult cuMemRelease(CUmemGenericAllocationHandle handle) { return release(handle, 2); }

/* Trampolines: the same calls at addresses dlsym never returns. */
static CUresult tramp_alloc_v2(CUdeviceptr *dptr, size_t bytes) { return cuMemAlloc_v2(dptr, bytes); }
static CUresult tramp_free_v2(CUdeviceptr dptr) { return cuMemFree_v2(dptr); }
static CUresult tramp_info_v2(size_t *f, size_t *t) { return cuMemGetInfo_v2(f, t); }

struct entry {
    const char *base;
    void *older, *newer;
    int newer_since; /* 0: chosen by the per-thread stream flag */
    void *trampoline; /* for the newer one, with FAKEGPU_PROC_ADDRESS=trampoline */
};

static const struct entry entries[] = {
    {"cuInit", (void *)cuInit, (void *)cuInit, 1, NULL},
    {"cuDeviceGet", (void *)cuDeviceGet, (void *)cuDeviceGet, 1, NULL},
    {"cuDeviceGetCount", (void *)cuDeviceGetCount, (void *)cuDeviceGetCount, 1, NULL},
    {"cuDeviceGetUuid", (void *)cuDeviceGetUuid, (void *)cuDeviceGetUuid, 1, NULL},
    {"cuDeviceTotalMem", (void *)cuDeviceTotalMem, (void *)cuDeviceTotalMem_v2, 3020, NULL},
    {"cuCtxCreate", (void *)cuCtxCreate_v2, (void *)cuCtxCreate_v2, 1, NULL},
    {"cuCtxGetDevice", (void *)cuCtxGetDevice, (void *)cuCtxGetDevice, 1, NULL},
    {"cuCtxSetCurrent", (void *)cuCtxSetCurrent, (void *)cuCtxSetCurrent, 1, NULL},
    {"cuDevicePrimaryCtxRetain", (void *)cuDevicePrimaryCtxRetain, (void *)cuDevicePrimaryCtxRetain, 1, NULL},
    {"cuMemGetInfo", (void *)cuMemGetInfo, (void *)cuMemGetInfo_v2, 3020, (void *)tramp_info_v2},
    {"cuMemAlloc", (void *)cuMemAlloc, (void *)cuMemAlloc_v2, 3020, (void *)tramp_alloc_v2},
    {"cuMemAllocPitch", (void *)cuMemAllocPitch, (void *)cuMemAllocPitch_v2, 3020, NULL},
    {"cuMemAllocManaged", (void *)cuMemAllocManaged, (void *)cuMemAllocManaged, 1, NULL},
    {"cuMemAllocAsync", (void *)cuMemAllocAsync, (void *)cuMemAllocAsync_ptsz, 0, NULL},
    {"cuMemAllocFromPoolAsync", (void *)cuMemAllocFromPoolAsync, (void *)cuMemAllocFromPoolAsync_ptsz, 0, NULL},
    {"cuMemCreate", (void *)cuMemCreate, (void *)cuMemCreate, 1, NULL},
    {"cuMemFree", (void *)cuMemFree, (void *)cuMemFree_v2, 3020, (void *)tramp_free_v2},
    {"cuMemFreeAsync", (void *)cuMemFreeAsync, (void *)cuMemFreeAsync_ptsz, 0, NULL},
    {"cuMemRelease", (void *)cuMemRelease, (void *)cuMemRelease, 1, NULL},
    {"cuGetProcAddress", (void *)cuGetProcAddress, (void *)cuGetProcAddress_v2, 12000, NULL},
};

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cuda_version, cuuint64_t flags, int *status)
{
    if (symbol == NULL || pfn == NULL || cuda_version > DRIVER_VERSION)
        return CUDA_ERROR_INVALID_VALUE;
    const char *mode = getenv("FAKEGPU_PROC_ADDRESS");
    int trampolines = mode && strcmp(mode, "trampoline") == 0;
    *pfn = NULL;
    if (status)
        *status = CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    for (size_t i = 0; i < sizeof entries / sizeof entries[0]; i++) {
        const struct entry *e = &entries[i];
        if (strcmp(e->base, symbol) != 0)
            continue;
        int newer = e->newer_since ? cuda_version >= e->newer_since
                                   : (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
        *pfn = newer ? (trampolines && e->trampoline ? e->trampoline : e->newer) : e->older;
        if (status)
            *status = CU_GET_PROC_ADDRESS_SUCCESS;
        break;
    }
    return CUDA_SUCCESS; /* an unknown symbol is not an error: *pfn = NULL says it */
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cuda_version, cuuint64_t flags)
{
    return cuGetProcAddress_v2(symbol, pfn, cuda_version, flags, NULL);
}
