/* NVML as a slice shows it (what nvidia-smi, pynvml and DCGM read): total = the cap,
 * free = min(the card's free, cap - used by this container), used = total - free. */
#include <string.h>

#include "limiter.h"

static int hex(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
        return c - 'A' + 10;
    return -1;
}

/* "GPU-0a1b2c3d-...": the same 16 bytes cuDeviceGetUuid returns, as hex after the prefix. */
static int parse_uuid(const char *text, unsigned char uuid[16])
{
    const char *p = strchr(text, '-');
    if (p == NULL)
        return -1;
    int n = 0;
    for (p++; *p && n < 32; p++) {
        if (*p == '-')
            continue;
        int v = hex(*p);
        if (v < 0)
            return -1;
        if (n % 2 == 0)
            uuid[n / 2] = (unsigned char)(v << 4);
        else
            uuid[n / 2] |= (unsigned char)v;
        n++;
    }
    return n == 32 && *p == '\0' ? 0 : -1;
}

/* Used by this container on that device; 0 when the device cannot be named (then only the
 * cap narrows the answer). */
static uint64_t container_used(nvmlDevice_t device)
{
    nvmlDeviceGetUUID_t *get = REAL(nvmlDeviceGetUUID);
    char text[NVML_DEVICE_UUID_BUFFER_SIZE];
    unsigned char uuid[16];
    if (get == NULL || get(device, text, sizeof text) != NVML_SUCCESS)
        return 0;
    text[sizeof text - 1] = '\0';
    return parse_uuid(text, uuid) == 0 ? ledger_used(uuid, 0) : 0;
}

/* total' = min(cap, total), free' = min(free, total' - used); the rest of total' is "used" */
static void narrow(uint64_t *total, uint64_t *free_bytes, uint64_t used)
{
    uint64_t cap = limiter_config()->cap_bytes;
    uint64_t t = *total < cap ? *total : cap;
    uint64_t left = used < t ? t - used : 0;
    *total = t;
    *free_bytes = *free_bytes < left ? *free_bytes : left;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory)
{
    nvmlDeviceGetMemoryInfo_t *real = REAL(nvmlDeviceGetMemoryInfo);
    if (real == NULL)
        return NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t rc = real(device, memory);
    if (rc != NVML_SUCCESS || !limiter_config()->active)
        return rc;
    uint64_t total = memory->total, free_bytes = memory->free;
    narrow(&total, &free_bytes, container_used(device));
    memory->total = total;
    memory->free = free_bytes;
    memory->used = total - free_bytes;
    return rc;
}

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory)
{
    nvmlDeviceGetMemoryInfo_v2_t *real = REAL(nvmlDeviceGetMemoryInfo_v2);
    if (real == NULL)
        return NVML_ERROR_UNINITIALIZED;
    nvmlReturn_t rc = real(device, memory);
    if (rc != NVML_SUCCESS || !limiter_config()->active)
        return rc;
    uint64_t total = memory->total, free_bytes = memory->free;
    narrow(&total, &free_bytes, container_used(device));
    memory->total = total;
    memory->free = free_bytes;
    memory->used = total - free_bytes; /* as the driver's: reserved is part of used */
    if (memory->reserved > memory->used)
        memory->reserved = memory->used;
    return rc;
}
