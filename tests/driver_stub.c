/* A stand-in for the CUDA driver (built as libcuda.so.1 in its own folder) that lets the CUDA
** backend's host side run on a machine without a GPU: one device whose compute capability comes
** from $FJ_STUB_SM (default 90), device memory that is host memory, modules and functions that
** are names, and launches that run nothing but are recorded, with a copy of their parameter
** block, for test_cuda_host.c to read (fjstub_* below). Tensor maps hold their base address
** in their first 8 bytes, so a test can find a tensor behind a map. NVRTC asks for the driver's
** export table; it gets none and compiles as it does without a driver.
** Only what backend/cuda.c calls is here, with the Driver API's signatures (pointers for its
** handle types). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "driver_stub.h"

#define STUB_API __attribute__((visibility("default")))

typedef int CUresult;
enum { OK = 0, ERR_INVALID_VALUE = 1, ERR_NOT_FOUND = 500 };
enum { MAX_LAUNCHES = 64 };

static struct {
    fjstub_launch launches[MAX_LAUNCHES];
    int nlaunches;     /* all launches, also those past MAX_LAUNCHES */
    int allocs, syncs; /* cuMemAlloc, cuStreamSynchronize + cuCtxSynchronize */
    void *capturing;   /* the stream that reports being captured */
    void *current;     /* the current context */
} S;

static int context_object, module_object;

/* ---- what tests read and set ---------------------------------------------------------------- */
STUB_API void fjstub_reset(void)
{
    S.nlaunches = S.allocs = S.syncs = 0;
}
STUB_API int fjstub_launches(void)
{
    return S.nlaunches;
}
STUB_API const fjstub_launch *fjstub_launch_at(int i)
{
    return i >= 0 && i < S.nlaunches && i < MAX_LAUNCHES ? &S.launches[i] : NULL;
}
STUB_API int fjstub_allocs(void)
{
    return S.allocs;
}
STUB_API int fjstub_syncs(void)
{
    return S.syncs;
}
STUB_API void fjstub_set_capturing(void *stream)
{
    S.capturing = stream;
}

/* ---- the driver ------------------------------------------------------------------------------ */
STUB_API CUresult cuInit(unsigned flags)
{
    return OK;
}
STUB_API CUresult cuDriverGetVersion(int *v)
{
    *v = 13000;
    return OK;
}
STUB_API CUresult cuDeviceGetCount(int *n)
{
    *n = 1;
    return OK;
}
STUB_API CUresult cuDeviceGet(int *d, int ordinal)
{
    *d = 0;
    return ordinal == 0 ? OK : ERR_INVALID_VALUE;
}
STUB_API CUresult cuDeviceGetName(char *name, int len, int d)
{
    strncpy(name, "driver stub", (size_t)len);
    return OK;
}
STUB_API CUresult cuDeviceTotalMem_v2(size_t *bytes, int d)
{
    *bytes = (size_t)80 << 30;
    return OK;
}
STUB_API CUresult cuDeviceGetAttribute(int *v, int attribute, int d)
{
    const char *sm = getenv("FJ_STUB_SM");
    const int cc = sm ? atoi(sm) : 90;
    switch (attribute) {
    case 16: /* multiprocessors */ *v = 132; return OK;
    case 75: /* compute capability */ *v = cc / 10; return OK;
    case 76: *v = cc % 10; return OK;
    case 97: /* opt-in shared memory per block */
        *v = cc >= 90 ? 232448 : cc == 80 ? 166912 : 101376;
        return OK;
    default: *v = 1; return OK;
    }
}
STUB_API CUresult cuDevicePrimaryCtxRetain(void **ctx, int d)
{
    *ctx = &context_object;
    return OK;
}
STUB_API CUresult cuDevicePrimaryCtxRelease_v2(int d)
{
    return OK;
}
STUB_API CUresult cuCtxGetCurrent(void **ctx)
{
    *ctx = S.current;
    return OK;
}
STUB_API CUresult cuCtxSetCurrent(void *ctx)
{
    S.current = ctx;
    return OK;
}
STUB_API CUresult cuCtxGetDevice(int *d)
{
    *d = 0;
    return OK;
}
STUB_API CUresult cuCtxSynchronize(void)
{
    S.syncs++;
    return OK;
}
STUB_API CUresult cuStreamSynchronize(void *stream)
{
    S.syncs++;
    return OK;
}
STUB_API CUresult cuStreamIsCapturing(void *stream, int *status)
{
    *status = stream && stream == S.capturing;
    return OK;
}
STUB_API CUresult cuMemAlloc_v2(uint64_t *ptr, size_t bytes)
{
    S.allocs++;
    void *p = malloc(bytes ? bytes : 1);
    *ptr = (uint64_t)(uintptr_t)p;
    return p ? OK : 2;
}
STUB_API CUresult cuMemFree_v2(uint64_t ptr)
{
    free((void *)(uintptr_t)ptr);
    return OK;
}
STUB_API CUresult cuMemcpyHtoD_v2(uint64_t dst, const void *src, size_t bytes)
{
    memcpy((void *)(uintptr_t)dst, src, bytes);
    return OK;
}
STUB_API CUresult cuMemcpyDtoH_v2(void *dst, uint64_t src, size_t bytes)
{
    memcpy(dst, (const void *)(uintptr_t)src, bytes);
    return OK;
}
STUB_API CUresult cuMemsetD8Async(uint64_t dst, unsigned char value, size_t bytes, void *stream)
{
    memset((void *)(uintptr_t)dst, value, bytes);
    return OK;
}
STUB_API CUresult cuModuleLoadData(void **module, const void *image)
{
    *module = &module_object;
    return OK;
}
STUB_API CUresult cuModuleUnload(void *module)
{
    return OK;
}
/* A function handle is its name, kept in a table, which launches record. */
static char names[64][128];
STUB_API CUresult cuModuleGetFunction(void **function, void *module, const char *name)
{
    int i = 0;
    while (i < 64 && names[i][0] && strcmp(names[i], name) != 0)
        i++;
    if (i == 64 || strlen(name) >= sizeof names[i])
        return ERR_NOT_FOUND;
    strcpy(names[i], name);
    *function = names[i];
    return OK;
}
STUB_API CUresult cuFuncGetAttribute(int *v, int attribute, void *function)
{
    *v = attribute == 4 ? 128 : 0; /* registers; no local memory */
    return OK;
}
STUB_API CUresult cuFuncSetAttribute(void *function, int attribute, int value)
{
    return OK;
}
/* Records a launch (see fjstub_launch). */
static void record(void *function, const unsigned grid[3], const unsigned block[3],
                   unsigned shared_bytes, void *stream, int overlap_previous, void **params)
{
    if (S.nlaunches < MAX_LAUNCHES) {
        fjstub_launch *l = &S.launches[S.nlaunches];
        memset(l, 0, sizeof *l);
        strncpy(l->function, function ? (const char *)function : "", sizeof l->function - 1);
        memcpy(l->grid, grid, sizeof l->grid);
        memcpy(l->block, block, sizeof l->block);
        l->shared_bytes = shared_bytes;
        l->stream = stream;
        l->overlap_previous = overlap_previous;
        /* flashjit passes one argument, its parameter block, from a buffer of at least
        ** FJSTUB_PARAM_COPY bytes */
        if (params && params[0])
            memcpy(l->params, params[0], FJSTUB_PARAM_COPY);
    }
    S.nlaunches++;
}
STUB_API CUresult cuLaunchKernel(void *function, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                 unsigned by, unsigned bz, unsigned shared_bytes, void *stream,
                                 void **params, void **extra)
{
    const unsigned grid[3] = {gx, gy, gz}, block[3] = {bx, by, bz};
    record(function, grid, block, shared_bytes, stream, 0, params);
    return OK;
}
/* CUlaunchConfig and CUlaunchAttribute as the Driver API lays them out. */
typedef struct {
    int id;
    char pad[4];
    union {
        char bytes[64];
        int value;
    } value;
} launch_attribute;
typedef struct {
    unsigned grid[3], block[3], shared_bytes;
    void *stream;
    launch_attribute *attrs;
    unsigned nattrs;
} launch_config;
STUB_API CUresult cuLaunchKernelEx(const launch_config *config, void *function, void **params,
                                   void **extra)
{
    int overlap = 0;
    for (unsigned i = 0; i < config->nattrs; i++) {
        if (config->attrs[i].id != 6) /* programmatic stream serialisation: the only one used */
            return ERR_INVALID_VALUE;
        overlap = config->attrs[i].value.value != 0;
    }
    record(function, config->grid, config->block, config->shared_bytes, config->stream, overlap,
           params);
    return OK;
}
STUB_API CUresult cuTensorMapEncodeTiled(void *map, int dtype, unsigned rank, void *base,
                                         const unsigned long long *dims,
                                         const unsigned long long *strides, const unsigned *box,
                                         const unsigned *element_strides, int interleave,
                                         int swizzle, int l2_promotion, int oob_fill)
{
    memset(map, 0, 128);
    memcpy(map, &base, sizeof base);
    return OK;
}
STUB_API CUresult cuGetErrorName(CUresult rc, const char **name)
{
    *name = "CUDA_ERROR_STUB";
    return OK;
}
STUB_API CUresult cuGetExportTable(const void **table, const void *id)
{
    *table = NULL;
    return ERR_NOT_FOUND;
}
