/* A CUDA/NVML client linked directly against libcuda.so.1 and libnvidia-ml.so.1 (the fakes in
 * the tests), one scenario per command; it prints "name value..." lines for the test to read.
 * Sizes are in MiB on the command line. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "abi.h"

#define MIB (1ull << 20)
#define GIB (1ull << 30)

cuInit_t cuInit;
cuDeviceGetCount_t cuDeviceGetCount;
cuDeviceTotalMem_t cuDeviceTotalMem;
cuDeviceTotalMem_v2_t cuDeviceTotalMem_v2;
cuCtxCreate_v2_t cuCtxCreate_v2;
cuMemGetInfo_t cuMemGetInfo;
cuMemGetInfo_v2_t cuMemGetInfo_v2;
cuMemAlloc_t cuMemAlloc;
cuMemAlloc_v2_t cuMemAlloc_v2;
cuMemAllocPitch_t cuMemAllocPitch;
cuMemAllocPitch_v2_t cuMemAllocPitch_v2;
cuMemAllocManaged_t cuMemAllocManaged;
cuMemAllocAsync_t cuMemAllocAsync;
cuMemAllocAsync_ptsz_t cuMemAllocAsync_ptsz;
cuMemAllocFromPoolAsync_t cuMemAllocFromPoolAsync;
cuMemAllocFromPoolAsync_ptsz_t cuMemAllocFromPoolAsync_ptsz;
cuMemCreate_t cuMemCreate;
cuMemFree_t cuMemFree;
cuMemFree_v2_t cuMemFree_v2;
cuMemFreeAsync_t cuMemFreeAsync;
cuMemFreeAsync_ptsz_t cuMemFreeAsync_ptsz;
cuMemRelease_t cuMemRelease;
cuGetProcAddress_t cuGetProcAddress;
cuGetProcAddress_v2_t cuGetProcAddress_v2;
nvmlInit_v2_t nvmlInit_v2;
nvmlDeviceGetCount_v2_t nvmlDeviceGetCount_v2;
nvmlDeviceGetHandleByIndex_v2_t nvmlDeviceGetHandleByIndex_v2;
nvmlDeviceGetUUID_t nvmlDeviceGetUUID;
nvmlDeviceGetMemoryInfo_t nvmlDeviceGetMemoryInfo;
nvmlDeviceGetMemoryInfo_v2_t nvmlDeviceGetMemoryInfo_v2;

static CUmemoryPool const some_pool = (CUmemoryPool)0x1; /* the fake only checks it is not NULL */

static void must(const char *what, CUresult rc)
{
    if (rc != CUDA_SUCCESS) {
        printf("fatal %s %d\n", what, rc);
        exit(3);
    }
}

static void context(int ordinal)
{
    CUcontext ctx;
    must("cuInit", cuInit(0));
    must("cuCtxCreate_v2", cuCtxCreate_v2(&ctx, 0, ordinal));
}

static void info(const char *label)
{
    size_t f = 0, t = 0;
    CUresult rc = cuMemGetInfo_v2(&f, &t);
    printf("%s rc %d free_mib %llu total_mib %llu\n", label, rc, (unsigned long long)(f / MIB),
           (unsigned long long)(t / MIB));
}

/* The shared object an entry point lives in: the limiter's or the driver's. */
static const char *home(void *fn)
{
    Dl_info where;
    if (fn == NULL || dladdr(fn, &where) == 0 || where.dli_fname == NULL)
        return "none";
    const char *slash = strrchr(where.dli_fname, '/');
    return slash ? slash + 1 : where.dli_fname;
}

static int totals(void)
{
    int count = 0;
    must("cuInit", cuInit(0));
    must("cuDeviceGetCount", cuDeviceGetCount(&count));
    for (int d = 0; d < count; d++) {
        size_t v2 = 0;
        unsigned int v1 = 0;
        CUresult rc2 = cuDeviceTotalMem_v2(&v2, d), rc1 = cuDeviceTotalMem(&v1, d);
        printf("device %d total_v2_mib %llu rc %d total_v1 %u rc %d\n", d, (unsigned long long)(v2 / MIB), rc2, v1, rc1);
    }
    context(0);
    info("info_v2");
    unsigned int f1 = 0, t1 = 0;
    CUresult rc = cuMemGetInfo(&f1, &t1);
    printf("info_v1 rc %d free %u total %u\n", rc, f1, t1);
    return 0;
}

/* 7 GiB fits an 8 GiB slice; 2 GiB more does not; after freeing the 7, the 2 do. */
static int sequence(int ordinal)
{
    CUdeviceptr a = 0, b = 0, c = 0;
    context(ordinal);
    info("start");
    printf("alloc_7g rc %d\n", cuMemAlloc_v2(&a, 7 * GIB));
    info("after_7g");
    printf("alloc_2g rc %d\n", cuMemAlloc_v2(&b, 2 * GIB));
    info("after_refused_2g");
    printf("free_7g rc %d\n", cuMemFree_v2(a));
    info("after_free");
    printf("alloc_2g_again rc %d\n", cuMemAlloc_v2(&c, 2 * GIB));
    info("after_2g");
    printf("free_2g rc %d\n", cuMemFree_v2(c));
    return 0;
}

/* Each covered allocation call, next to a base allocation: past the cap it is refused and
 * nothing changes; within, it succeeds; its free gives the budget back. Sizes stay below 4 GiB
 * so the 32-bit calls can ask for them too. */
static int paths(unsigned long long base_mib, unsigned long long over_mib, unsigned long long within_mib)
{
    context(0);
    CUdeviceptr base = 0;
    must("base", cuMemAlloc_v2(&base, base_mib * MIB));
    size_t base_free, total;
    must("info", cuMemGetInfo_v2(&base_free, &total));
    unsigned long long over = over_mib * MIB, within = within_mib * MIB;
    CUmemAllocationProp prop = {CU_MEM_ALLOCATION_TYPE_PINNED, 0, {CU_MEM_LOCATION_TYPE_DEVICE, 0}, NULL, {0}};
    for (int path = 0; path < 13; path++) {
        CUdeviceptr p = 0, q = 0;
        CUdeviceptr_v1 p1 = 0, q1 = 0;
        size_t pitch = 0;
        unsigned int pitch1 = 0;
        CUmemGenericAllocationHandle h = 0, g = 0;
        CUresult refused, ok, freed;
        const char *name;
        switch (path) {
        case 0:
            name = "cuMemAlloc_v2";
            refused = cuMemAlloc_v2(&p, over), ok = cuMemAlloc_v2(&q, within), freed = cuMemFree_v2(q);
            break;
        case 1:
            name = "cuMemAlloc";
            refused = cuMemAlloc(&p1, (unsigned int)over), ok = cuMemAlloc(&q1, (unsigned int)within), freed = cuMemFree(q1);
            break;
        case 2:
            name = "cuMemAllocPitch_v2";
            refused = cuMemAllocPitch_v2(&p, &pitch, over / 1024, 1024, 4);
            ok = cuMemAllocPitch_v2(&q, &pitch, within / 1024, 1024, 4), freed = cuMemFree_v2(q);
            break;
        case 3:
            name = "cuMemAllocPitch";
            refused = cuMemAllocPitch(&p1, &pitch1, (unsigned int)(over / 1024), 1024, 4);
            ok = cuMemAllocPitch(&q1, &pitch1, (unsigned int)(within / 1024), 1024, 4), freed = cuMemFree(q1);
            break;
        case 4:
            name = "cuMemAllocManaged";
            refused = cuMemAllocManaged(&p, over, CU_MEM_ATTACH_GLOBAL);
            ok = cuMemAllocManaged(&q, within, CU_MEM_ATTACH_GLOBAL), freed = cuMemFree_v2(q);
            break;
        case 5:
            name = "cuMemAllocAsync";
            refused = cuMemAllocAsync(&p, over, NULL), ok = cuMemAllocAsync(&q, within, NULL);
            freed = cuMemFreeAsync(q, NULL);
            break;
        case 6:
            name = "cuMemAllocAsync_ptsz";
            refused = cuMemAllocAsync_ptsz(&p, over, NULL), ok = cuMemAllocAsync_ptsz(&q, within, NULL);
            freed = cuMemFreeAsync_ptsz(q, NULL);
            break;
        case 7:
            name = "cuMemAllocFromPoolAsync";
            refused = cuMemAllocFromPoolAsync(&p, over, some_pool, NULL);
            ok = cuMemAllocFromPoolAsync(&q, within, some_pool, NULL), freed = cuMemFreeAsync(q, NULL);
            break;
        case 8:
            name = "cuMemAllocFromPoolAsync_ptsz";
            refused = cuMemAllocFromPoolAsync_ptsz(&p, over, some_pool, NULL);
            ok = cuMemAllocFromPoolAsync_ptsz(&q, within, some_pool, NULL), freed = cuMemFreeAsync_ptsz(q, NULL);
            break;
        case 9:
            name = "cuMemCreate";
            refused = cuMemCreate(&h, over, &prop, 0), ok = cuMemCreate(&g, within, &prop, 0), freed = cuMemRelease(g);
            break;
        case 10:
            name = "cuMemFree_of_async"; /* any matching free returns the budget */
            refused = cuMemAlloc_v2(&p, over), ok = cuMemAllocAsync(&q, within, NULL), freed = cuMemFree_v2(q);
            break;
        case 11:
            name = "cuMemFreeAsync_of_alloc";
            refused = cuMemAlloc_v2(&p, over), ok = cuMemAlloc_v2(&q, within), freed = cuMemFreeAsync(q, NULL);
            break;
        default:
            /* rows of 1000 bytes fit what is left, rows padded to the driver's pitch do not */
            name = "cuMemAllocPitch_v2_padding";
            refused = cuMemAllocPitch_v2(&p, &pitch, 1000, base_free / 1000, 4);
            ok = cuMemAllocPitch_v2(&q, &pitch, 1000, within / 1024, 4), freed = cuMemFree_v2(q);
            break;
        }
        size_t now_free;
        must("info", cuMemGetInfo_v2(&now_free, &total));
        printf("path %s refused %d ok %d freed %d untouched %d free_back %d\n", name, refused, ok, freed,
               p == 0 && p1 == 0 && h == 0, now_free == base_free);
    }
    return 0;
}

static int proc_address(void)
{
    context(0);
    void *fn = NULL, *getter = NULL;
    int status = -1;
    /* what the CUDA runtime does: find cuGetProcAddress_v2 through cuGetProcAddress itself */
    must("cuGetProcAddress", cuGetProcAddress("cuGetProcAddress", &getter, 12000, 0));
    printf("cuGetProcAddress@12000 lives_in %s\n", home(getter));
    cuGetProcAddress_v2_t *lookup = (cuGetProcAddress_v2_t *)getter;
    must("lookup", lookup("cuMemAlloc", &fn, 12000, CU_GET_PROC_ADDRESS_DEFAULT, &status));
    CUdeviceptr p = 0, q = 0;
    printf("cuMemAlloc@12000 lives_in %s status %d refused_9g %d", home(fn), status,
           ((cuMemAlloc_v2_t *)fn)(&p, 9 * GIB));
    printf(" ok_1g %d\n", ((cuMemAlloc_v2_t *)fn)(&q, GIB));
    must("lookup", lookup("cuMemFree", &fn, 12000, 0, NULL));
    printf("cuMemFree@12000 lives_in %s freed %d\n", home(fn), ((cuMemFree_v2_t *)fn)(q));
    must("lookup", lookup("cuMemGetInfo", &fn, 12000, 0, NULL));
    size_t f = 0, t = 0;
    CUresult rc = ((cuMemGetInfo_v2_t *)fn)(&f, &t);
    printf("cuMemGetInfo@12000 lives_in %s rc %d total_mib %llu\n", home(fn), rc, (unsigned long long)(t / MIB));
    /* the 32-bit ABI of old callers, next to 6 GiB held: 2 GiB more pass the cap, 1 GiB does not */
    CUdeviceptr held = 0;
    must("hold", cuMemAlloc_v2(&held, 6 * GIB));
    must("lookup", lookup("cuMemAlloc", &fn, 3000, 0, NULL));
    CUdeviceptr_v1 p1 = 0, q1 = 0;
    printf("cuMemAlloc@3000 lives_in %s refused_2g %d", home(fn), ((cuMemAlloc_t *)fn)(&p1, 2u << 30));
    printf(" ok_1g %d\n", ((cuMemAlloc_t *)fn)(&q1, 1u << 30));
    must("lookup", lookup("cuMemFree", &fn, 3000, 0, NULL));
    printf("cuMemFree@3000 lives_in %s freed %d\n", home(fn), ((cuMemFree_t *)fn)(q1));
    must("free", cuMemFree_v2(held));
    must("lookup", lookup("cuMemAllocAsync", &fn, 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM, NULL));
    printf("cuMemAllocAsync_ptsz lives_in %s refused_9g %d\n", home(fn), ((cuMemAllocAsync_t *)fn)(&p, 9 * GIB, NULL));
    must("lookup", lookup("cuDeviceGetCount", &fn, 12000, 0, NULL));
    printf("cuDeviceGetCount@12000 lives_in %s\n", home(fn));
    must("lookup", lookup("cuNoSuchCall", &fn, 12000, 0, &status));
    printf("cuNoSuchCall fn %s status %d\n", fn ? "set" : "null", status);
    must("old lookup", cuGetProcAddress("cuMemAlloc", &fn, 11030, 0));
    printf("cuGetProcAddress(v1 ABI) cuMemAlloc lives_in %s refused_9g %d\n", home(fn),
           ((cuMemAlloc_v2_t *)fn)(&p, 9 * GIB));
    return 0;
}

static int dynamic(void)
{
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (cuda == NULL)
        return printf("fatal dlopen %s\n", dlerror()), 3;
    cuInit_t *init = (cuInit_t *)dlsym(cuda, "cuInit");
    cuCtxCreate_v2_t *create = (cuCtxCreate_v2_t *)dlsym(cuda, "cuCtxCreate_v2");
    cuMemAlloc_v2_t *alloc = (cuMemAlloc_v2_t *)dlsym(cuda, "cuMemAlloc_v2");
    cuDeviceTotalMem_v2_t *total = (cuDeviceTotalMem_v2_t *)dlsym(cuda, "cuDeviceTotalMem_v2");
    CUcontext ctx;
    must("cuInit", init(0));
    must("cuCtxCreate_v2", create(&ctx, 0, 0));
    size_t bytes = 0;
    CUdeviceptr p = 0;
    CUresult rc = total(&bytes, 0);
    printf("dlsym cuDeviceTotalMem_v2 lives_in %s rc %d total_mib %llu\n", home((void *)total), rc,
           (unsigned long long)(bytes / MIB));
    printf("dlsym cuMemAlloc_v2 lives_in %s refused_9g %d\n", home((void *)alloc), alloc(&p, 9 * GIB));
    printf("dlerror_after_calls %s\n", dlerror() ? "set" : "clear"); /* the limiter's own lookups leave none */
    printf("dlsym cuInit lives_in %s\n", home((void *)init));
    printf("dlsym cuNoSuchCall %s", dlsym(cuda, "cuNoSuchCall") ? "set" : "null");
    printf(" dlerror %s\n", dlerror() ? "set" : "clear");
    /* the caller-relative lookups still see the caller: "the next dlsym after me" is whoever
     * comes after this program, not after the limiter */
    void *next = dlsym(RTLD_NEXT, "dlsym");
    printf("rtld_next_dlsym lives_in %s same_as_mine %d\n", home(next), next == (void *)dlsym);
    return 0;
}

static int hold(unsigned long long mib, int ordinal)
{
    context(ordinal);
    CUdeviceptr p = 0;
    CUresult rc = cuMemAlloc_v2(&p, mib * MIB);
    printf("held rc %d mib %llu\n", rc, mib);
    fflush(stdout);
    char buf[64];
    while (read(STDIN_FILENO, buf, sizeof buf) > 0)
        ;
    if (rc == CUDA_SUCCESS)
        printf("freed rc %d\n", cuMemFree_v2(p));
    return 0;
}

static int errors(void)
{
    CUdeviceptr p = 0;
    size_t f, t;
    printf("alloc_before_init %d\n", cuMemAlloc_v2(&p, MIB));
    printf("info_before_init %d\n", cuMemGetInfo_v2(&f, &t));
    must("cuInit", cuInit(0));
    printf("alloc_without_context %d\n", cuMemAlloc_v2(&p, MIB));
    printf("info_without_context %d\n", cuMemGetInfo_v2(&f, &t));
    printf("total_bad_device %d\n", cuDeviceTotalMem_v2(&f, 7));
    CUcontext ctx;
    must("cuCtxCreate_v2", cuCtxCreate_v2(&ctx, 0, 0));
    printf("alloc_null_pointer %d\n", cuMemAlloc_v2(NULL, MIB));
    printf("alloc_zero %d\n", cuMemAlloc_v2(&p, 0));
    printf("alloc_null_pointer_past_cap %d\n", cuMemAlloc_v2(NULL, 20 * GIB));
    printf("alloc_past_card %d\n", cuMemAlloc_v2(&p, 40 * GIB));
    printf("free_unknown %d\n", cuMemFree_v2(0x1234));
    size_t pitch;
    printf("pitch_bad_element %d\n", cuMemAllocPitch_v2(&p, &pitch, 4096, 4096, 3));
    printf("managed_bad_flags %d\n", cuMemAllocManaged(&p, MIB, 7));
    printf("pool_null %d\n", cuMemAllocFromPoolAsync(&p, MIB, NULL, NULL));
    CUmemAllocationProp prop = {CU_MEM_ALLOCATION_TYPE_PINNED, 0, {CU_MEM_LOCATION_TYPE_DEVICE, 0}, NULL, {0}};
    CUmemGenericAllocationHandle h;
    printf("create_misaligned %d\n", cuMemCreate(&h, MIB + 1, &prop, 0));
    prop.location.id = 9;
    printf("create_bad_device %d\n", cuMemCreate(&h, 2 * MIB, &prop, 0));
    printf("release_unknown %d\n", cuMemRelease(0x77));
    printf("proc_address_future_version %d\n", cuGetProcAddress("cuMemAlloc", (void **)&h, 99000, 0));
    return 0;
}

static int no_device(void)
{
    int n = -1;
    printf("cuInit %d\n", cuInit(0));
    printf("cuDeviceGetCount %d\n", cuDeviceGetCount(&n));
    CUdeviceptr p;
    printf("cuMemAlloc_v2 %d\n", cuMemAlloc_v2(&p, MIB));
    printf("nvmlInit_v2 %d\n", nvmlInit_v2());
    return 0;
}

static int nvml(void)
{
    unsigned int count = 0;
    if (nvmlInit_v2() != NVML_SUCCESS || nvmlDeviceGetCount_v2(&count) != NVML_SUCCESS)
        return printf("fatal nvml\n"), 3;
    for (unsigned int i = 0; i < count; i++) {
        nvmlDevice_t d;
        char uuid[NVML_DEVICE_UUID_BUFFER_SIZE];
        nvmlMemory_t m;
        nvmlMemory_v2_t m2 = {.version = nvmlMemory_v2};
        nvmlMemory_v2_t wrong = {.version = 1};
        nvmlDeviceGetHandleByIndex_v2(i, &d);
        nvmlDeviceGetUUID(d, uuid, sizeof uuid);
        nvmlReturn_t rc1 = nvmlDeviceGetMemoryInfo(d, &m), rc2 = nvmlDeviceGetMemoryInfo_v2(d, &m2);
        printf("nvml %u %s v1 rc %d total_mib %llu free_mib %llu used_mib %llu v2 rc %d total_mib %llu reserved_mib "
               "%llu free_mib %llu used_mib %llu wrong_version %d\n",
               i, uuid, rc1, m.total / MIB, m.free / MIB, m.used / MIB, rc2, m2.total / MIB, m2.reserved / MIB,
               m2.free / MIB, m2.used / MIB, nvmlDeviceGetMemoryInfo_v2(d, &wrong));
    }
    return 0;
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0);
    const char *cmd = argc > 1 ? argv[1] : "";
    if (strcmp(cmd, "totals") == 0)
        return totals();
    if (strcmp(cmd, "sequence") == 0)
        return sequence(argc > 2 ? atoi(argv[2]) : 0);
    if (strcmp(cmd, "paths") == 0 && argc > 4)
        return paths(strtoull(argv[2], NULL, 10), strtoull(argv[3], NULL, 10), strtoull(argv[4], NULL, 10));
    if (strcmp(cmd, "procaddress") == 0)
        return proc_address();
    if (strcmp(cmd, "dynamic") == 0)
        return dynamic();
    if (strcmp(cmd, "hold") == 0 && argc > 2)
        return hold(strtoull(argv[2], NULL, 10), argc > 3 ? atoi(argv[3]) : 0);
    if (strcmp(cmd, "errors") == 0)
        return errors();
    if (strcmp(cmd, "nodevice") == 0)
        return no_device();
    if (strcmp(cmd, "nvml") == 0)
        return nvml();
    fprintf(stderr, "usage: client totals|sequence [ordinal]|paths BASE_MIB OVER_MIB WITHIN_MIB|procaddress|dynamic|"
                    "hold MIB [ordinal]|errors|nodevice|nvml\n");
    return 2;
}
