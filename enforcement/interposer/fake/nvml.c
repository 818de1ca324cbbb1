/* A fake libnvidia-ml.so.1 over the simulated cards (card.c): what pynvml, nvidia-smi-like
 * tools and the agent's watchdog call, with NVML's error rules. Process memory is what each
 * live process holds on the card, its context included, as the real driver reports it. */
#include <stdio.h>
#include <string.h>

#include "../abi.h"
#include "card.h"

#define EXPORT __attribute__((visibility("default")))

static struct nvmlDevice_st {
    int card;
} devices[CARD_MAX];

static int initialised;

static nvmlReturn_t init(void)
{
    if (card_no_device())
        return NVML_ERROR_DRIVER_NOT_LOADED;
    initialised++;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlInit_v2(void) { return init(); }
EXPORT nvmlReturn_t nvmlInit(void) { return init(); }
EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { return (void)flags, init(); }

EXPORT nvmlReturn_t nvmlShutdown(void)
{
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    initialised--;
    return NVML_SUCCESS;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t rc)
{
    switch (rc) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument Version Mismatch";
    default: return "Unknown Error";
    }
}

static nvmlReturn_t copy_text(const char *text, char *out, unsigned int length)
{
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    if (out == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(text) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, text, strlen(text) + 1);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *out, unsigned int length) { return copy_text("550.54.15", out, length); }

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    if (count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    *count = (unsigned int)card_count();
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    if (device == NULL || index >= (unsigned int)card_count())
        return NVML_ERROR_INVALID_ARGUMENT;
    devices[index].card = (int)index;
    *device = &devices[index];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

static int valid(nvmlDevice_t device)
{
    return device >= &devices[0] && device < &devices[card_count()];
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *out, unsigned int length)
{
    if (initialised && !valid(device))
        return NVML_ERROR_INVALID_ARGUMENT;
    return copy_text(CARD_NAME, out, length);
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *out, unsigned int length)
{
    if (initialised && !valid(device))
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned char u[16];
    char text[48];
    card_uuid(initialised ? device->card : 0, u);
    snprintf(text, sizeof text, "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", u[0], u[1],
             u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
    return copy_text(text, out, length);
}

static nvmlReturn_t memory(nvmlDevice_t device, unsigned long long *total, unsigned long long *free_bytes,
                           unsigned long long *used)
{
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    if (!valid(device))
        return NVML_ERROR_INVALID_ARGUMENT;
    *total = CARD_TOTAL;
    *used = card_used(device->card);
    *free_bytes = CARD_TOTAL - *used;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *m)
{
    if (m == NULL)
        return initialised ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_UNINITIALIZED;
    return memory(device, &m->total, &m->free, &m->used);
}

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *m)
{
    if (m == NULL)
        return initialised ? NVML_ERROR_INVALID_ARGUMENT : NVML_ERROR_UNINITIALIZED;
    if (m->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    m->reserved = CARD_RESERVED;
    return memory(device, &m->total, &m->free, &m->used);
}

static nvmlReturn_t processes(nvmlDevice_t device, unsigned int *count, nvmlProcessInfo_t *infos)
{
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    if (!valid(device) || count == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int pids[64];
    unsigned long long bytes[64];
    int n = card_processes(device->card, pids, bytes, 64);
    if (n > 64)
        n = 64;
    if (infos == NULL || *count < (unsigned int)n) {
        *count = (unsigned int)n;
        return n == 0 ? NVML_SUCCESS : NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (int i = 0; i < n; i++)
        infos[i] = (nvmlProcessInfo_t){pids[i], bytes[i], 0xffffffffu, 0xffffffffu};
    *count = (unsigned int)n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *p)
{
    return processes(d, c, p);
}

EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t d, unsigned int *c, nvmlProcessInfo_t *p)
{
    return processes(d, c, p);
}
