/* The limiter's configuration, read once from the environment the node hand-off sets. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "limiter.h"

/* What a CUDA context holds on the device that no allocation call shows (local memory, module
 * code, the runtime's heap): the agent's watchdog sees it in NVML's per-process figure, so the
 * limiter must count it too or a container filled to its cap would be killed. Conservative:
 * PyTorch contexts of 700-800 MiB have been reported; GPUSLICE_SLICE_CONTEXT_MIB tunes it. */
#define DEFAULT_CONTEXT_MIB 768ull
#define MAX_CAP_MIB (1ull << 24) /* 16 TiB: anything larger is a typo, not a card */

static struct limiter_config config;
static pthread_once_t once = PTHREAD_ONCE_INIT;

void limiter_warn(const char *what, const char *detail)
{
    /* stderr only: a line on stdout would break parsers of nvidia-smi's output */
    char line[512];
    int n = snprintf(line, sizeof line, "gpuslice-limiter[%ld]: %s%s%s\n", (long)getpid(), what,
                     detail ? ": " : "", detail ? detail : "");
    if (n > 0) {
        ssize_t ignored = write(STDERR_FILENO, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
        (void)ignored;
    }
}

/* A positive decimal number of MiB no larger than max, or 0 (with errno) when it is not one. */
static uint64_t parse_mib(const char *text, uint64_t max)
{
    char *end = NULL;
    errno = 0;
    if (text[0] < '0' || text[0] > '9')
        return errno = EINVAL, 0;
    unsigned long long v = strtoull(text, &end, 10);
    if (errno || *end != '\0' || v > max)
        return errno = errno ? errno : EINVAL, 0;
    return v;
}

static void load(void)
{
    const char *cap = getenv("GPUSLICE_SLICE_MEMORY_MIB");
    if (cap == NULL || cap[0] == '\0')
        return; /* not a slice: pass everything through */
    uint64_t cap_mib = parse_mib(cap, MAX_CAP_MIB);
    if (cap_mib == 0) {
        /* the watchdog still enforces the slice; an unreadable cap must not invent one */
        limiter_warn("GPUSLICE_SLICE_MEMORY_MIB is not a number of MiB in 1..16777216, limiter off", cap);
        return;
    }
    /* a small cap (a test, a tiny slice) keeps three quarters of itself for allocations */
    uint64_t context_mib = DEFAULT_CONTEXT_MIB < cap_mib / 4 ? DEFAULT_CONTEXT_MIB : cap_mib / 4;
    const char *context = getenv("GPUSLICE_SLICE_CONTEXT_MIB");
    if (context != NULL && context[0] != '\0') {
        uint64_t v = parse_mib(context, cap_mib - 1);
        if (v == 0 && strcmp(context, "0") != 0)
            limiter_warn("GPUSLICE_SLICE_CONTEXT_MIB must be below the cap, using the default", context);
        else
            context_mib = v;
    }
    const char *dir = getenv("GPUSLICE_SLICE_STATE_DIR");
    config.state_dir = (dir != NULL && dir[0] != '\0') ? dir : NULL;
    config.cap_bytes = cap_mib * MIB;
    config.context_bytes = context_mib * MIB;
    config.active = 1;
}

const struct limiter_config *limiter_config(void)
{
    pthread_once(&once, load);
    return &config;
}
