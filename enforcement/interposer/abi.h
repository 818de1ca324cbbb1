/* The slice of the CUDA driver and NVML ABIs that the limiter, the fake driver and the test
 * clients touch, declared here from NVIDIA's public API reference (no NVIDIA header is needed
 * to build). Only what is used is declared; layouts are those of the 64-bit Linux ABI. */
#ifndef GPUSLICE_ABI_H
#define GPUSLICE_ABI_H

#include <stddef.h>
#include <stdint.h>

/* CUDA driver API */
typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUstream_st *CUstream;
typedef struct CUmemPoolHandle_st *CUmemoryPool;
typedef unsigned long long CUdeviceptr;       /* CUdeviceptr_v2: what every "_v2" call takes */
typedef unsigned int CUdeviceptr_v1;          /* the pre-3.2 32-bit ABI of the unsuffixed names */
typedef unsigned long long CUmemGenericAllocationHandle;
typedef uint64_t cuuint64_t;
typedef struct { char bytes[16]; } CUuuid;

typedef struct {
    int type; /* CUmemLocationType */
    int id;   /* a device ordinal when type is CU_MEM_LOCATION_TYPE_DEVICE */
} CUmemLocation;

typedef struct {
    int type;                 /* CUmemAllocationType */
    int requestedHandleTypes; /* CUmemAllocationHandleType */
    CUmemLocation location;
    void *win32HandleMetaData;
    unsigned char allocFlags[8];
} CUmemAllocationProp;

enum {
    CUDA_SUCCESS = 0,
    CUDA_ERROR_INVALID_VALUE = 1,
    CUDA_ERROR_OUT_OF_MEMORY = 2,
    CUDA_ERROR_NOT_INITIALIZED = 3,
    CUDA_ERROR_NO_DEVICE = 100,
    CUDA_ERROR_INVALID_DEVICE = 101,
    CUDA_ERROR_INVALID_CONTEXT = 201,
};

enum { CU_MEM_ALLOCATION_TYPE_PINNED = 1 };
enum { CU_MEM_LOCATION_TYPE_DEVICE = 1, CU_MEM_LOCATION_TYPE_HOST = 2 };
enum { CU_MEM_ATTACH_GLOBAL = 1, CU_MEM_ATTACH_HOST = 2 };
enum { CU_GET_PROC_ADDRESS_DEFAULT = 0, CU_GET_PROC_ADDRESS_LEGACY_STREAM = 1,
       CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM = 2 };
enum { CU_GET_PROC_ADDRESS_SUCCESS = 0, CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND = 1,
       CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT = 2 };

/* NVML */
typedef int nvmlReturn_t;
typedef struct nvmlDevice_st *nvmlDevice_t;

typedef struct {
    unsigned long long total;
    unsigned long long free;
    unsigned long long used; /* includes what the driver reserves: total = free + used */
} nvmlMemory_t;

typedef struct {
    unsigned int version; /* nvmlMemory_v2 */
    unsigned long long total;
    unsigned long long reserved;
    unsigned long long free;
    unsigned long long used; /* includes reserved */
} nvmlMemory_v2_t;

#define nvmlMemory_v2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24)))

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId;
    unsigned int computeInstanceId;
} nvmlProcessInfo_t; /* the _v2 and _v3 process calls share this layout */

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
};

#define NVML_DEVICE_UUID_BUFFER_SIZE 96

/* Function types, one per entry point (name##_t), for definitions, calls and casts alike. */
typedef CUresult cuInit_t(unsigned int flags);
typedef CUresult cuDeviceGet_t(CUdevice *device, int ordinal);
typedef CUresult cuDeviceGetCount_t(int *count);
typedef CUresult cuDeviceGetUuid_t(CUuuid *uuid, CUdevice device);
typedef CUresult cuDeviceTotalMem_t(unsigned int *bytes, CUdevice device);
typedef CUresult cuDeviceTotalMem_v2_t(size_t *bytes, CUdevice device);
typedef CUresult cuCtxCreate_v2_t(CUcontext *ctx, unsigned int flags, CUdevice device);
typedef CUresult cuCtxGetDevice_t(CUdevice *device);
typedef CUresult cuCtxSetCurrent_t(CUcontext ctx);
typedef CUresult cuDevicePrimaryCtxRetain_t(CUcontext *ctx, CUdevice device);
typedef CUresult cuMemGetInfo_t(unsigned int *free, unsigned int *total);
typedef CUresult cuMemGetInfo_v2_t(size_t *free, size_t *total);
typedef CUresult cuMemAlloc_t(CUdeviceptr_v1 *dptr, unsigned int bytes);
typedef CUresult cuMemAlloc_v2_t(CUdeviceptr *dptr, size_t bytes);
typedef CUresult cuMemAllocPitch_t(CUdeviceptr_v1 *dptr, unsigned int *pitch, unsigned int width,
                                   unsigned int height, unsigned int element_bytes);
typedef CUresult cuMemAllocPitch_v2_t(CUdeviceptr *dptr, size_t *pitch, size_t width, size_t height,
                                      unsigned int element_bytes);
typedef CUresult cuMemAllocManaged_t(CUdeviceptr *dptr, size_t bytes, unsigned int flags);
typedef CUresult cuMemAllocAsync_t(CUdeviceptr *dptr, size_t bytes, CUstream stream);
typedef cuMemAllocAsync_t cuMemAllocAsync_ptsz_t;
typedef CUresult cuMemAllocFromPoolAsync_t(CUdeviceptr *dptr, size_t bytes, CUmemoryPool pool, CUstream stream);
typedef cuMemAllocFromPoolAsync_t cuMemAllocFromPoolAsync_ptsz_t;
typedef CUresult cuMemCreate_t(CUmemGenericAllocationHandle *handle, size_t bytes, const CUmemAllocationProp *prop,
                               unsigned long long flags);
typedef CUresult cuMemFree_t(CUdeviceptr_v1 dptr);
typedef CUresult cuMemFree_v2_t(CUdeviceptr dptr);
typedef CUresult cuMemFreeAsync_t(CUdeviceptr dptr, CUstream stream);
typedef cuMemFreeAsync_t cuMemFreeAsync_ptsz_t;
typedef CUresult cuMemRelease_t(CUmemGenericAllocationHandle handle);
typedef CUresult cuGetProcAddress_t(const char *symbol, void **pfn, int cuda_version, cuuint64_t flags);
typedef CUresult cuGetProcAddress_v2_t(const char *symbol, void **pfn, int cuda_version, cuuint64_t flags,
                                       int *symbol_status);

typedef nvmlReturn_t nvmlInit_v2_t(void);
typedef nvmlReturn_t nvmlDeviceGetCount_v2_t(unsigned int *count);
typedef nvmlReturn_t nvmlDeviceGetHandleByIndex_v2_t(unsigned int index, nvmlDevice_t *device);
typedef nvmlReturn_t nvmlDeviceGetUUID_t(nvmlDevice_t device, char *uuid, unsigned int length);
typedef nvmlReturn_t nvmlDeviceGetMemoryInfo_t(nvmlDevice_t device, nvmlMemory_t *memory);
typedef nvmlReturn_t nvmlDeviceGetMemoryInfo_v2_t(nvmlDevice_t device, nvmlMemory_v2_t *memory);

#endif
