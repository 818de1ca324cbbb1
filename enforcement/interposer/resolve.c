/* How calls reach the hooks, whichever way a program finds the driver:
 *  - linked against libcuda / libnvidia-ml: the preloaded library's exported hooks win;
 *  - dlopen + dlsym (ctypes, pynvml, the CUDA runtime's loader): dlsym is wrapped;
 *  - cuGetProcAddress(_v2) (the CUDA runtime since 11.3): its answer is mapped to our hook.
 * And how the hooks reach the driver: the pointer dlsym found, or a lookup in the library that
 * is already loaded (never one we load ourselves: no driver must stay no driver). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdlib.h>
#include <string.h>

#include "limiter.h"

struct symbol {
    const char *name;
    const char *library;
    void *hook; /* NULL: a driver call we make, not one we wrap */
    void *real;  /* cached; every racer writes an equivalent value */
    int missing; /* its library is loaded and lacks it */
};

#define HOOK_ENTRY(name, lib) {#name, lib, (void *)name, NULL, 0},
#define CALL_ENTRY(name, lib) {#name, lib, NULL, NULL, 0},
static struct symbol symbols[SYM_COUNT] = {LIMITER_SYMBOLS(HOOK_ENTRY, CALL_ENTRY)};

typedef void *(*dlsym_fn)(void *, const char *);

/* glibc's dlsym, found by version so that looking it up does not come back to us. */
NOT_INSTRUMENTED static dlsym_fn libc_dlsym(void)
{
    static dlsym_fn found;
    dlsym_fn fn = __atomic_load_n(&found, __ATOMIC_ACQUIRE);
    if (fn == NULL) {
        static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.2.5", "GLIBC_2.17"};
        for (size_t i = 0; fn == NULL && i < sizeof versions / sizeof versions[0]; i++)
            fn = (dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", versions[i]);
        if (fn == NULL) {
            limiter_warn("cannot find glibc's dlsym; this libc is not supported", dlerror());
            abort(); /* every dlsym caller would get NULL: better to stop loudly */
        }
        __atomic_store_n(&found, fn, __ATOMIC_RELEASE);
    }
    return fn;
}

/* strcmp without a call: a sanitizer's strcmp is not ready when its runtime first asks dlsym */
NOT_INSTRUMENTED static int same(const char *a, const char *b)
{
    while (*a && *a == *b)
        a++, b++;
    return *a == *b;
}

NOT_INSTRUMENTED static struct symbol *wrapped(const char *name)
{
    if (name[0] != 'c' && name[0] != 'n') /* glibc declares name nonnull, as it is here */
        return NULL;
    for (int i = 0; i < SYM_COUNT; i++)
        if (symbols[i].hook != NULL && same(symbols[i].name, name))
            return &symbols[i];
    return NULL;
}

void *limiter_real(enum limiter_symbol id)
{
    struct symbol *s = &symbols[id];
    void *fn = __atomic_load_n(&s->real, __ATOMIC_ACQUIRE);
    if (fn != NULL || __atomic_load_n(&s->missing, __ATOMIC_ACQUIRE))
        return fn;
    fn = libc_dlsym()(RTLD_NEXT, s->name); /* linked directly, or dlopened RTLD_GLOBAL */
    if (fn == NULL || fn == s->hook) {
        void *lib = dlopen(s->library, RTLD_LAZY | RTLD_NOLOAD); /* dlopened RTLD_LOCAL */
        fn = lib ? libc_dlsym()(lib, s->name) : NULL;
        if (lib && fn == NULL)
            __atomic_store_n(&s->missing, 1, __ATOMIC_RELEASE); /* an older driver: do not ask again */
        if (lib)
            dlclose(lib);
    }
    if (fn == s->hook)
        fn = NULL;
    if (fn != NULL)
        __atomic_store_n(&s->real, fn, __ATOMIC_RELEASE);
    dlerror(); /* our misses are not the program's: leave no error for its next dlerror() */
    return fn;
}

/* Which variant cuGetProcAddress hands out for a base name: by the caller's CUDA version
 * (the "_v2" ABIs of CUDA 3.2, cuGetProcAddress_v2 of 12.0) or by its stream flag ("_ptsz"). */
struct variant {
    const char *base;
    enum limiter_symbol older, newer;
    int newer_since; /* 0: chosen by CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM instead */
};

static const struct variant variants[] = {
    {"cuDeviceTotalMem", SYM_cuDeviceTotalMem, SYM_cuDeviceTotalMem_v2, 3020},
    {"cuMemGetInfo", SYM_cuMemGetInfo, SYM_cuMemGetInfo_v2, 3020},
    {"cuMemAlloc", SYM_cuMemAlloc, SYM_cuMemAlloc_v2, 3020},
    {"cuMemAllocPitch", SYM_cuMemAllocPitch, SYM_cuMemAllocPitch_v2, 3020},
    {"cuMemFree", SYM_cuMemFree, SYM_cuMemFree_v2, 3020},
    {"cuMemAllocManaged", SYM_cuMemAllocManaged, SYM_cuMemAllocManaged, 1},
    {"cuMemCreate", SYM_cuMemCreate, SYM_cuMemCreate, 1},
    {"cuMemRelease", SYM_cuMemRelease, SYM_cuMemRelease, 1},
    {"cuMemAllocAsync", SYM_cuMemAllocAsync, SYM_cuMemAllocAsync_ptsz, 0},
    {"cuMemAllocFromPoolAsync", SYM_cuMemAllocFromPoolAsync, SYM_cuMemAllocFromPoolAsync_ptsz, 0},
    {"cuMemFreeAsync", SYM_cuMemFreeAsync, SYM_cuMemFreeAsync_ptsz, 0},
    {"cuGetProcAddress", SYM_cuGetProcAddress, SYM_cuGetProcAddress_v2, 12000},
};

void *limiter_proc_hook(const char *base, void *driver_fn, int cuda_version, cuuint64_t flags)
{
    /* the driver's pointer is one dlsym also gives: the exact match */
    for (int i = 0; i < SYM_COUNT; i++)
        if (symbols[i].hook != NULL && driver_fn == limiter_real((enum limiter_symbol)i))
            return symbols[i].hook;
    /* a pointer of its own (a trampoline): go by name, and call the driver through that pointer */
    for (size_t i = 0; base && i < sizeof variants / sizeof variants[0]; i++) {
        const struct variant *v = &variants[i];
        if (strcmp(v->base, base) != 0)
            continue;
        int newer = v->newer_since ? cuda_version >= v->newer_since
                                   : (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
        struct symbol *s = &symbols[newer ? v->newer : v->older];
        __atomic_store_n(&s->real, driver_fn, __ATOMIC_RELEASE);
        return s->hook;
    }
    return driver_fn;
}

NOT_INSTRUMENTED EXPORT void *dlsym(void *handle, const char *name)
{
    struct symbol *s = wrapped(name);
    if (s == NULL || !limiter_config()->active)
        return libc_dlsym()(handle, name); /* a tail call: RTLD_NEXT/RTLD_DEFAULT still see the caller */
    void *fn = libc_dlsym()(handle, name);
    if (fn == NULL)
        return NULL; /* that library has no such function: say so, as the driver would */
    if (fn != s->hook)
        __atomic_store_n(&s->real, fn, __ATOMIC_RELEASE);
    else if (limiter_real((enum limiter_symbol)(s - symbols)) == NULL)
        return libc_dlsym()(RTLD_NEXT, name); /* found only ourselves: no driver; NULL, dlerror() says why */
    return s->hook;
}
