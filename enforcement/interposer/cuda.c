/* The CUDA driver API as a slice shows it: totals are the cap, free memory is what is left of
 * the cap for this container, and an allocation that would pass the cap fails with
 * CUDA_ERROR_OUT_OF_MEMORY before the driver is asked, so nothing changes.
 *
 * Every hook asks the driver first whenever the answer could be an error the driver owns (no
 * context, a bad argument, no device): the limiter only ever narrows a successful answer, so
 * with no driver, or with the variables unset, a program sees exactly what the driver says.
 * (A hook finding no driver behind it answers CUDA_ERROR_NOT_INITIALIZED: only a program that
 * binds to our exported symbol with no libcuda loaded can get there.) */
#include <string.h>

#include "limiter.h"

#define UUID_CACHE 64

static const struct limiter_config *active(void)
{
    const struct limiter_config *c = limiter_config();
    return c->active ? c : NULL;
}

/* The device's UUID, cached per ordinal (a process's ordinals never change). */
static int device_uuid(CUdevice device, unsigned char uuid[16])
{
    static unsigned char cache[UUID_CACHE][16];
    static int known[UUID_CACHE];
    if (device >= 0 && device < UUID_CACHE && __atomic_load_n(&known[device], __ATOMIC_ACQUIRE)) {
        memcpy(uuid, cache[device], 16);
        return 0;
    }
    cuDeviceGetUuid_t *get = REAL(cuDeviceGetUuid);
    CUuuid id;
    if (get == NULL || get(&id, device) != CUDA_SUCCESS)
        return -1;
    memcpy(uuid, id.bytes, 16);
    if (device >= 0 && device < UUID_CACHE) {
        memcpy(cache[device], id.bytes, 16);
        __atomic_store_n(&known[device], 1, __ATOMIC_RELEASE);
    }
    return 0;
}

/* The device of the calling thread's current context, as allocations without a location use. */
static int current_uuid(unsigned char uuid[16])
{
    cuCtxGetDevice_t *get = REAL(cuCtxGetDevice);
    CUdevice device;
    if (get == NULL || get(&device) != CUDA_SUCCESS)
        return -1;
    return device_uuid(device, uuid);
}

/* A charge taken before the driver allocates, settled once it has answered. */
struct charge {
    int device;
    uint64_t bytes;
};

enum { CHARGE_PASS, CHARGE_TAKEN, CHARGE_REFUSED };

/* PASS: leave the call to the driver untouched (limiter off, or no device to charge: then the
 * driver answers with the error, e.g. no current context). */
static int take(struct charge *c, const unsigned char *uuid, uint64_t bytes)
{
    if (uuid == NULL)
        return CHARGE_PASS;
    c->bytes = bytes;
    return ledger_charge(uuid, bytes, &c->device) == 0 ? CHARGE_TAKEN : CHARGE_REFUSED;
}

static int take_current(struct charge *c, uint64_t bytes)
{
    unsigned char uuid[16];
    if (!active() || current_uuid(uuid) != 0)
        return CHARGE_PASS;
    return take(c, uuid, bytes);
}

static void settle(const struct charge *c, CUresult rc, int kind, uint64_t key)
{
    if (rc != CUDA_SUCCESS) {
        ledger_refund(c->device, c->bytes);
        return;
    }
    struct allocation a = {key, c->bytes, c->device, kind}, stale;
    if (table_put(&a, &stale) == 1)
        ledger_refund(stale.device, stale.bytes);
}

/* The plain allocation calls: charged to the current device when the driver could accept their
 * arguments (it answers the others itself), settled with the pointer it wrote. */
static int before(struct charge *c, int arguments_valid, uint64_t bytes)
{
    return arguments_valid && bytes != 0 ? take_current(c, bytes) : CHARGE_PASS;
}

static CUresult after(const struct charge *c, int how, CUresult rc, const CUdeviceptr *dptr)
{
    if (how == CHARGE_TAKEN)
        settle(c, rc, KIND_POINTER, rc == CUDA_SUCCESS ? *dptr : 0);
    return rc;
}

static CUresult after_v1(const struct charge *c, int how, CUresult rc, const CUdeviceptr_v1 *dptr)
{
    if (how == CHARGE_TAKEN)
        settle(c, rc, KIND_POINTER, rc == CUDA_SUCCESS ? *dptr : 0);
    return rc;
}

static void returned(CUresult rc, const struct allocation *a)
{
    struct allocation ignored;
    if (rc == CUDA_SUCCESS)
        ledger_refund(a->device, a->bytes);
    else
        table_put(a, &ignored); /* the driver kept it: so do we */
}

/* total = min(cap, driver's total); free = min(driver's free, total - used by the container) */
static void narrow(uint64_t cap, const unsigned char *uuid, uint64_t *free_bytes, uint64_t *total_bytes)
{
    uint64_t total = *total_bytes < cap ? *total_bytes : cap;
    uint64_t used = uuid ? ledger_used(uuid, 1) : 0;
    uint64_t left = used < total ? total - used : 0;
    *total_bytes = total;
    *free_bytes = *free_bytes < left ? *free_bytes : left;
}

CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice device)
{
    cuDeviceTotalMem_v2_t *real = REAL(cuDeviceTotalMem_v2);
    if (real == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = real(bytes, device);
    const struct limiter_config *c = active();
    if (rc == CUDA_SUCCESS && c && *bytes > c->cap_bytes)
        *bytes = c->cap_bytes;
    return rc;
}

CUresult cuDeviceTotalMem(unsigned int *bytes, CUdevice device)
{
    cuDeviceTotalMem_t *real = REAL(cuDeviceTotalMem);
    if (real == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = real(bytes, device);
    const struct limiter_config *c = active();
    if (rc == CUDA_SUCCESS && c && *bytes > c->cap_bytes)
        *bytes = (unsigned int)c->cap_bytes;
    return rc;
}

CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
    cuMemGetInfo_v2_t *real = REAL(cuMemGetInfo_v2);
    if (real == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = real(free_bytes, total_bytes);
    const struct limiter_config *c = active();
    if (rc != CUDA_SUCCESS || c == NULL)
        return rc;
    unsigned char uuid[16];
    uint64_t f = *free_bytes, t = *total_bytes;
    narrow(c->cap_bytes, current_uuid(uuid) == 0 ? uuid : NULL, &f, &t);
    *free_bytes = f;
    *total_bytes = t;
    return rc;
}

/* The 32-bit call cannot say more than 4 GiB - 1: narrow the exact figures of the _v2 call
 * where the driver has it, then clamp, so that a small free is still the true one. */
CUresult cuMemGetInfo(unsigned int *free_bytes, unsigned int *total_bytes)
{
    cuMemGetInfo_t *real = REAL(cuMemGetInfo);
    if (real == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = real(free_bytes, total_bytes);
    const struct limiter_config *c = active();
    if (rc != CUDA_SUCCESS || c == NULL)
        return rc;
    uint64_t f = *free_bytes, t = *total_bytes;
    size_t f2, t2;
    cuMemGetInfo_v2_t *exact = REAL(cuMemGetInfo_v2);
    if (exact != NULL && exact(&f2, &t2) == CUDA_SUCCESS)
        f = f2, t = t2;
    unsigned char uuid[16];
    narrow(c->cap_bytes, current_uuid(uuid) == 0 ? uuid : NULL, &f, &t);
    *free_bytes = f > UINT32_MAX ? UINT32_MAX : (unsigned int)f;
    *total_bytes = t > UINT32_MAX ? UINT32_MAX : (unsigned int)t;
    return rc;
}

CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytes)
{
    cuMemAlloc_v2_t *real = REAL(cuMemAlloc_v2);
    if (real == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    struct charge c;
    int how = before(&c, dptr != NULL, bytes);
    if (how == CHARGE_REFUSED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    return after(&c, how, real(dptr, bytes), dptr);
}

CUresult cuMemAlloc(CUdeviceptr_v1 *dptr, unsigned int bytes)
{
    cuMemAlloc_t *real = REAL(cuMemAlloc);
    if (real == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    struct charge c;
    int how = before(&c, dptr != NULL, bytes);
    if (how == CHARGE_REFUSED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    return after_v1(&c, how, real(dptr, bytes), dptr);
}

/* The pitch is the driver's choice, so charge width x height first and the padding once known;
 * padding that does not fit undoes the allocation. */
static CUresult settle_pitch(struct charge *c, CUresult rc, uint64_t pitch, uint64_t height, uint64_t ptr,
                             CUresult (*undo)(uint64_t))
{
    /* on undo the caller restores its outputs: a refusal changes nothing */
    if (rc == CUDA_SUCCESS && pitch > 0 && height > UINT64_MAX / pitch) {
        /* impossible for a real driver; never account a size we cannot represent */
        undo(ptr);
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    }
    if (rc == CUDA_SUCCESS && pitch * height > c->bytes) {
        struct charge extra;
        unsigned char uuid[16];
        if (current_uuid(uuid) != 0 || take(&extra, uuid, pitch * height - c->bytes) != CHARGE_TAKEN) {
            undo(ptr);
            rc = CUDA_ERROR_OUT_OF_MEMORY;
        } else
            c->bytes += extra.bytes;
    }
    settle(c, rc, KIND_POINTER, ptr);
    return rc;
}

static CUresult free_v2(uint64_t ptr) { return REAL(cuMemFree_v2)((CUdeviceptr)ptr); }
static CUresult free_v1(uint64_t ptr) { return REAL(cuMemFree)((CUdeviceptr_v1)ptr); }

CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height, unsigned int element_bytes)
{
    cuMemAllocPitch_v2_t *real = REAL(cuMemAllocPitch_v2);
    if (real == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    struct charge c;
    int how = CHARGE_PASS;
    if (dptr && pitch && width && height && width <= SIZE_MAX / height && REAL(cuMemFree_v2))
        how = take_current(&c, (uint64_t)width * height);
    if (how == CHARGE_REFUSED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUdeviceptr dptr_was = how == CHARGE_TAKEN ? *dptr : 0;
    size_t pitch_was = how == CHARGE_TAKEN ? *pitch : 0;
    CUresult rc = real(dptr, pitch, width, height, element_bytes);
    if (how == CHARGE_TAKEN) {
        CUresult driver_rc = rc;
        rc = settle_pitch(&c, rc, rc == CUDA_SUCCESS ? *pitch : 0, height, rc == CUDA_SUCCESS ? *dptr : 0, free_v2);
        if (driver_rc == CUDA_SUCCESS && rc != CUDA_SUCCESS)
            *dptr = dptr_was, *pitch = pitch_was;
    }
    return rc;
}

CUresult cuMemAllocPitch(CUdeviceptr_v1 *dptr, unsigned int *pitch, unsigned int width, unsigned int height,
                         unsigned int element_bytes)
{
    cuMemAllocPitch_t *real = REAL(cuMemAllocPitch);
    if (real == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    struct charge c;
    int how = CHARGE_PASS;
    if (dptr && pitch && width && height && REAL(cuMemFree))
        how = take_current(&c, (uint64_t)width * height);
    if (how == CHARGE_REFUSED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUdeviceptr_v1 dptr_was = how == CHARGE_TAKEN ? *dptr : 0;
    unsigned int pitch_was = how == CHARGE_TAKEN ? *pitch : 0;
    CUresult rc = real(dptr, pitch, width, height, element_bytes);
    if (how == CHARGE_TAKEN) {
        CUresult driver_rc = rc;
        rc = settle_pitch(&c, rc, rc == CUDA_SUCCESS ? *pitch : 0, height, rc == CUDA_SUCCESS ? *dptr : 0, free_v1);
        if (driver_rc == CUDA_SUCCESS && rc != CUDA_SUCCESS)
            *dptr = dptr_was, *pitch = pitch_was;
    }
    return rc;
}

/* Managed memory is charged in full to the current device: it lives there once touched. */
CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytes, unsigned int flags)
{
    cuMemAllocManaged_t *real = REAL(cuMemAllocManaged);
    if (real == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    struct charge c;
    int how = before(&c, dptr != NULL, bytes);
    if (how == CHARGE_REFUSED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    return after(&c, how, real(dptr, bytes, flags), dptr);
}

/* Stream-ordered allocations are charged to the current context's device (see README). */
static CUresult alloc_async(cuMemAllocAsync_t *real, CUdeviceptr *dptr, size_t bytes, CUstream stream)
{
    if (real == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    struct charge c;
    int how = before(&c, dptr != NULL, bytes);
    if (how == CHARGE_REFUSED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    return after(&c, how, real(dptr, bytes, stream), dptr);
}

CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytes, CUstream stream)
{
    return alloc_async(REAL(cuMemAllocAsync), dptr, bytes, stream);
}

CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUstream stream)
{
    return alloc_async(REAL(cuMemAllocAsync_ptsz), dptr, bytes, stream);
}

static CUresult alloc_pool(cuMemAllocFromPoolAsync_t *real, CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool,
                           CUstream stream)
{
    if (real == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    struct charge c;
    int how = before(&c, dptr != NULL && pool != NULL, bytes);
    if (how == CHARGE_REFUSED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    return after(&c, how, real(dptr, bytes, pool, stream), dptr);
}

CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream stream)
{
    return alloc_pool(REAL(cuMemAllocFromPoolAsync), dptr, bytes, pool, stream);
}

CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream stream)
{
    return alloc_pool(REAL(cuMemAllocFromPoolAsync_ptsz), dptr, bytes, pool, stream);
}

/* The VMM path names its device in the properties, not through the current context. */
CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t bytes, const CUmemAllocationProp *prop,
                     unsigned long long flags)
{
    cuMemCreate_t *real = REAL(cuMemCreate);
    if (real == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    struct charge c;
    int how = CHARGE_PASS;
    unsigned char uuid[16];
    if (active() && handle && bytes && prop && prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE &&
        device_uuid(prop->location.id, uuid) == 0)
        how = take(&c, uuid, bytes);
    if (how == CHARGE_REFUSED)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = real(handle, bytes, prop, flags);
    if (how == CHARGE_TAKEN)
        settle(&c, rc, KIND_HANDLE, rc == CUDA_SUCCESS ? *handle : 0);
    return rc;
}

/* Frees: forget the allocation first (so a reuse of its address by another thread cannot be
 * mistaken for it), return the budget only once the driver has freed it. */
static CUresult give_back(int kind, uint64_t key, CUresult (*release)(uint64_t, void *), void *arg)
{
    struct allocation a;
    int tracked = active() && table_take(kind, key, &a);
    CUresult rc = release(key, arg);
    if (tracked)
        returned(rc, &a);
    return rc;
}

static CUresult release_v2(uint64_t key, void *fn) { return ((cuMemFree_v2_t *)fn)((CUdeviceptr)key); }
static CUresult release_v1(uint64_t key, void *fn) { return ((cuMemFree_t *)fn)((CUdeviceptr_v1)key); }
static CUresult release_handle(uint64_t key, void *fn) { return ((cuMemRelease_t *)fn)(key); }

CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    cuMemFree_v2_t *real = REAL(cuMemFree_v2);
    return real ? give_back(KIND_POINTER, dptr, release_v2, (void *)real) : CUDA_ERROR_NOT_INITIALIZED;
}

CUresult cuMemFree(CUdeviceptr_v1 dptr)
{
    cuMemFree_t *real = REAL(cuMemFree);
    return real ? give_back(KIND_POINTER, dptr, release_v1, (void *)real) : CUDA_ERROR_NOT_INITIALIZED;
}

CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    cuMemRelease_t *real = REAL(cuMemRelease);
    return real ? give_back(KIND_HANDLE, handle, release_handle, (void *)real) : CUDA_ERROR_NOT_INITIALIZED;
}

struct async_free {
    cuMemFreeAsync_t *fn;
    CUstream stream;
};

static CUresult release_async(uint64_t key, void *arg)
{
    struct async_free *f = arg;
    return f->fn((CUdeviceptr)key, f->stream);
}

/* The budget returns when the free is enqueued: the pool reuses the memory in stream order. */
CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream stream)
{
    struct async_free f = {REAL(cuMemFreeAsync), stream};
    return f.fn ? give_back(KIND_POINTER, dptr, release_async, &f) : CUDA_ERROR_NOT_INITIALIZED;
}

CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream)
{
    struct async_free f = {REAL(cuMemFreeAsync_ptsz), stream};
    return f.fn ? give_back(KIND_POINTER, dptr, release_async, &f) : CUDA_ERROR_NOT_INITIALIZED;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cuda_version, cuuint64_t flags)
{
    cuGetProcAddress_t *real = REAL(cuGetProcAddress);
    if (real == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = real(symbol, pfn, cuda_version, flags);
    if (rc == CUDA_SUCCESS && pfn && *pfn && active())
        *pfn = limiter_proc_hook(symbol, *pfn, cuda_version, flags);
    return rc;
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cuda_version, cuuint64_t flags, int *status)
{
    cuGetProcAddress_v2_t *real = REAL(cuGetProcAddress_v2);
    if (real == NULL)
        return CUDA_ERROR_NOT_INITIALIZED;
    CUresult rc = real(symbol, pfn, cuda_version, flags, status);
    if (rc == CUDA_SUCCESS && pfn && *pfn && active())
        *pfn = limiter_proc_hook(symbol, *pfn, cuda_version, flags);
    return rc;
}
