/* The CUDA backend: NVRTC compiles rendered source to a cubin for the device's exact arch, the
** Driver API loads and launches it. Both libraries are opened with dlopen, so libflashjit loads
** (and the OpenCL backend works) where neither exists; the few types and constants used are
** declared here, so building needs no CUDA toolkit either. A cubin from the cache needs only the
** driver: NVRTC is loaded the first time something must be compiled. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "backend.h"

/* ---- the Driver API subset ------------------------------------------------------------------ */
typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef unsigned long long CUdeviceptr;

enum {
    CUDA_SUCCESS = 0,
    CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
    CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN = 97,
    CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES = 3,
    CU_FUNC_ATTRIBUTE_NUM_REGS = 4,
    CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8,
};

#define CU_FUNCS(X)                                                                                \
    X(cuInit, CUresult, (unsigned))                                                                \
    X(cuDriverGetVersion, CUresult, (int *))                                                       \
    X(cuDeviceGetCount, CUresult, (int *))                                                         \
    X(cuDeviceGet, CUresult, (CUdevice *, int))                                                    \
    X(cuDeviceGetName, CUresult, (char *, int, CUdevice))                                          \
    X(cuDeviceGetAttribute, CUresult, (int *, int, CUdevice))                                      \
    X(cuDeviceTotalMem_v2, CUresult, (size_t *, CUdevice))                                         \
    X(cuDevicePrimaryCtxRetain, CUresult, (CUcontext *, CUdevice))                                 \
    X(cuDevicePrimaryCtxRelease_v2, CUresult, (CUdevice))                                          \
    X(cuCtxGetCurrent, CUresult, (CUcontext *))                                                    \
    X(cuCtxSetCurrent, CUresult, (CUcontext))                                                      \
    X(cuCtxGetDevice, CUresult, (CUdevice *))                                                      \
    X(cuCtxSynchronize, CUresult, (void))                                                          \
    X(cuModuleLoadData, CUresult, (CUmodule *, const void *))                                      \
    X(cuModuleUnload, CUresult, (CUmodule))                                                        \
    X(cuModuleGetFunction, CUresult, (CUfunction *, CUmodule, const char *))                       \
    X(cuFuncSetAttribute, CUresult, (CUfunction, int, int))                                        \
    X(cuFuncGetAttribute, CUresult, (int *, int, CUfunction))                                      \
    X(cuLaunchKernel, CUresult,                                                                    \
      (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream, \
       void **, void **))                                                                          \
    X(cuMemAlloc_v2, CUresult, (CUdeviceptr *, size_t))                                            \
    X(cuMemFree_v2, CUresult, (CUdeviceptr))                                                       \
    X(cuMemcpyHtoD_v2, CUresult, (CUdeviceptr, const void *, size_t))                              \
    X(cuMemcpyDtoH_v2, CUresult, (void *, CUdeviceptr, size_t))                                    \
    X(cuMemsetD8Async, CUresult, (CUdeviceptr, unsigned char, size_t, CUstream))                   \
    X(cuStreamSynchronize, CUresult, (CUstream))                                                   \
    X(cuGetErrorName, CUresult, (CUresult, const char **))

/* Tensor maps (CUDA 12+ drivers): optional, resolved apart from the required functions. */
typedef CUresult (*cuTensorMapEncodeTiled_fn)(void *map, int dtype, unsigned rank, void *base,
                                              const unsigned long long *dims,
                                              const unsigned long long *strides,
                                              const unsigned *box, const unsigned *element_strides,
                                              int interleave, int swizzle, int l2_promotion,
                                              int oob_fill);
enum {
    CU_TENSOR_MAP_DATA_TYPE_UINT8 = 0, /* FP8: bytes as they are */
    CU_TENSOR_MAP_DATA_TYPE_FLOAT16 = 6,
    CU_TENSOR_MAP_DATA_TYPE_FLOAT32 = 7,
    CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 = 9,
    CU_TENSOR_MAP_INTERLEAVE_NONE = 0,
    CU_TENSOR_MAP_SWIZZLE_128B = 3,
    CU_TENSOR_MAP_L2_PROMOTION_L2_256B = 3,
    CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE = 0,
};

/* Launches with attributes (CUDA 12+ drivers): the one attribute used, programmatic stream
** serialisation (a launch may overlap the previous kernel's end). */
enum { CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6 };
typedef struct CUlaunchAttribute {
    int id;
    char pad[4];
    union {
        char bytes[64];
        int programmatic_stream_serialization_allowed;
    } value;
} CUlaunchAttribute;
typedef struct CUlaunchConfig {
    unsigned grid[3], block[3], shared_bytes;
    CUstream stream;
    CUlaunchAttribute *attrs;
    unsigned nattrs;
} CUlaunchConfig;
typedef CUresult (*cuLaunchKernelEx_fn)(const CUlaunchConfig *, CUfunction, void **, void **);

static struct {
    void *lib;
    int ok;
    CUresult init_rc;
    cuTensorMapEncodeTiled_fn cuTensorMapEncodeTiled; /* NULL on drivers before CUDA 12 */
    CUresult (*cuStreamIsCapturing)(CUstream, int *); /* optional: NULL, never capturing */
    cuLaunchKernelEx_fn cuLaunchKernelEx; /* optional: NULL, launches never overlap */
#define CU_FIELD(name, ret, args) ret(*name) args;
    CU_FUNCS(CU_FIELD)
#undef CU_FIELD
} cu;

static pthread_once_t cu_once = PTHREAD_ONCE_INIT;

static void cu_load(void)
{
    cu.lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!cu.lib)
        return;
#define CU_RESOLVE(name, ret, args)                                                                \
    *(void **)(&cu.name) = dlsym(cu.lib, #name);                                                   \
    if (!cu.name)                                                                                  \
        return;
    CU_FUNCS(CU_RESOLVE)
#undef CU_RESOLVE
    *(void **)(&cu.cuTensorMapEncodeTiled) = dlsym(cu.lib, "cuTensorMapEncodeTiled");
    *(void **)(&cu.cuStreamIsCapturing) = dlsym(cu.lib, "cuStreamIsCapturing");
    *(void **)(&cu.cuLaunchKernelEx) = dlsym(cu.lib, "cuLaunchKernelEx");
    cu.init_rc = cu.cuInit(0);
    cu.ok = cu.init_rc == CUDA_SUCCESS;
}

static int cu_available(void)
{
    pthread_once(&cu_once, cu_load);
    return cu.ok;
}

static const char *cu_error_name(CUresult rc)
{
    const char *name = NULL;
    if (cu.cuGetErrorName && cu.cuGetErrorName(rc, &name) == CUDA_SUCCESS && name)
        return name;
    return "CUDA_ERROR";
}

/* ---- the NVRTC subset ------------------------------------------------------------------------ */
typedef int nvrtcResult;
typedef struct _nvrtcProgram *nvrtcProgram;

#define NVRTC_FUNCS(X)                                                                             \
    X(nvrtcVersion, nvrtcResult, (int *, int *))                                                   \
    X(nvrtcGetErrorString, const char *, (nvrtcResult))                                            \
    X(nvrtcCreateProgram, nvrtcResult,                                                             \
      (nvrtcProgram *, const char *, const char *, int, const char *const *, const char *const *)) \
    X(nvrtcDestroyProgram, nvrtcResult, (nvrtcProgram *))                                          \
    X(nvrtcCompileProgram, nvrtcResult, (nvrtcProgram, int, const char *const *))                  \
    X(nvrtcGetProgramLogSize, nvrtcResult, (nvrtcProgram, size_t *))                               \
    X(nvrtcGetProgramLog, nvrtcResult, (nvrtcProgram, char *))                                     \
    X(nvrtcGetCUBINSize, nvrtcResult, (nvrtcProgram, size_t *))                                    \
    X(nvrtcGetCUBIN, nvrtcResult, (nvrtcProgram, char *))                                          \
    X(nvrtcGetPTXSize, nvrtcResult, (nvrtcProgram, size_t *))                                      \
    X(nvrtcGetPTX, nvrtcResult, (nvrtcProgram, char *))

static struct {
    void *lib;
    int ok;
    char path[4096];
    char version[128]; /* "nvrtc 13.0 (V13.0.88)" */
#define NV_FIELD(name, ret, args) ret(*name) args;
    NVRTC_FUNCS(NV_FIELD)
#undef NV_FIELD
} nv;

static pthread_once_t nv_once = PTHREAD_ONCE_INIT;

static void nv_load(void)
{
    char from_home[4096] = "";
    const char *home = getenv("CUDA_HOME");
    if (home && home[0])
        snprintf(from_home, sizeof from_home, "%s/lib64/libnvrtc.so", home);
    const char *candidates[] = {"libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so", from_home,
                                "/usr/local/cuda/lib64/libnvrtc.so"};
    for (size_t i = 0; i < sizeof candidates / sizeof candidates[0] && !nv.lib; i++)
        if (candidates[i][0] && (nv.lib = dlopen(candidates[i], RTLD_NOW | RTLD_LOCAL)))
            snprintf(nv.path, sizeof nv.path, "%s", candidates[i]);
    if (!nv.lib)
        return;
#define NV_RESOLVE(name, ret, args)                                                                \
    *(void **)(&nv.name) = dlsym(nv.lib, #name);                                                   \
    if (!nv.name)                                                                                  \
        return;
    NVRTC_FUNCS(NV_RESOLVE)
#undef NV_RESOLVE
    int major = 0, minor = 0;
    nv.nvrtcVersion(&major, &minor);
    snprintf(nv.version, sizeof nv.version, "nvrtc %d.%d", major, minor);
    /* nvrtcVersion gives only major.minor; the exact build is in the header of any PTX. */
    nvrtcProgram prog = NULL;
    const char *opts[] = {"--gpu-architecture=compute_80"};
    if (nv.nvrtcCreateProgram(&prog, "extern \"C\" __global__ void fj_probe() {}", "probe.cu", 0,
                              NULL, NULL) == 0 &&
        nv.nvrtcCompileProgram(prog, 1, opts) == 0) {
        size_t size = 0;
        char *ptx = NULL;
        if (nv.nvrtcGetPTXSize(prog, &size) == 0 && (ptx = malloc(size + 1)) &&
            nv.nvrtcGetPTX(prog, ptx) == 0) {
            ptx[size] = '\0';
            const char *v = strstr(ptx, "Cuda compilation tools, release ");
            const char *build = v ? strstr(v, ", V") : NULL;
            if (build) {
                size_t len = strcspn(build + 2, "\r\n");
                snprintf(nv.version + strlen(nv.version), sizeof nv.version - strlen(nv.version),
                         " (%.*s)", (int)(len < 40 ? len : 40), build + 2);
            }
        }
        free(ptx);
    }
    nv.nvrtcDestroyProgram(&prog);
    nv.ok = 1;
}

static int nv_available(void)
{
    pthread_once(&nv_once, nv_load);
    return nv.ok;
}

/* ---- the backend ------------------------------------------------------------------------------
 */

typedef struct cub {
    fj__err *err;
    CUdevice device;
    CUcontext context;
    int retained_primary;
    char arch[64];      /* "sm_90a" */
    char target[80];    /* "cuda|sm_90a": what a cubin depends on */
    char compiler[192]; /* NVRTC version, recorded with each binary */
} cub;

typedef struct cu_kernel {
    CUmodule module;
    CUfunction function;
    int dynamic_smem; /* the dynamic shared memory limit set so far */
} cu_kernel;

#define CU_CHECK(call)                                                                             \
    do {                                                                                           \
        CUresult rc_ = (call);                                                                     \
        if (rc_ != CUDA_SUCCESS) {                                                                 \
            st = fj__fail(b->err, FJ_ERR_BACKEND, "%s: %s (%d)", #call, cu_error_name(rc_), rc_);  \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

/* The compile target of a compute capability: the arch-specific "a" variant on Hopper, whose
** wgmma and setmaxnreg the sm_90 target lacks. */
static void arch_name(int major, int minor, char *buf, size_t size)
{
    snprintf(buf, size, "sm_%d%d%s", major, minor, major == 9 && minor == 0 ? "a" : "");
}

static fj_status cuda_device_count(int32_t *count)
{
    int n = 0;
    *count = 0;
    if (cu_available() && cu.cuDeviceGetCount(&n) == CUDA_SUCCESS)
        *count = n;
    return FJ_OK;
}

static fj_status cuda_device_info(int32_t index, fj_device_info *info, fj__err *err)
{
    int32_t count = 0;
    cuda_device_count(&count);
    if (index < 0 || index >= count)
        return fj__fail(err, FJ_ERR_NO_DEVICE, "CUDA device %d does not exist (%d found%s)", index,
                        count, cu.lib ? "" : "; libcuda.so.1 not found");
    CUdevice dev;
    cu.cuDeviceGet(&dev, index);
    info->backend = FJ_BACKEND_CUDA;
    info->index = index;
    cu.cuDeviceGetName(info->name, sizeof info->name, dev);
    int major = 0, minor = 0, sms = 0, smem = 0, version = 0;
    cu.cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev);
    cu.cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev);
    cu.cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev);
    cu.cuDeviceGetAttribute(&smem, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev);
    size_t total = 0;
    cu.cuDeviceTotalMem_v2(&total, dev);
    cu.cuDriverGetVersion(&version);
    arch_name(major, minor, info->arch, sizeof info->arch);
    snprintf(info->driver, sizeof info->driver, "CUDA %d.%d", version / 1000, version % 1000 / 10);
    info->platform[0] = '\0';
    info->compute_units = sms;
    info->global_memory = total;
    info->local_memory = (uint64_t)smem;
    return FJ_OK;
}

/* Makes b's context current on the calling thread (the caller may have switched). */
static fj_status make_current(cub *b)
{
    CUcontext cur = NULL;
    if (cu.cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur == b->context)
        return FJ_OK;
    CUresult rc = cu.cuCtxSetCurrent(b->context);
    if (rc != CUDA_SUCCESS)
        return fj__fail(b->err, FJ_ERR_BACKEND, "cuCtxSetCurrent: %s", cu_error_name(rc));
    return FJ_OK;
}

static void cuda_destroy(void *p)
{
    cub *b = p;
    if (!b)
        return;
    if (b->retained_primary) {
        /* The release may destroy the context; a thread left pointing at it would hand the
        ** dead handle to the next context created here (cuda_create adopts the current one). */
        CUcontext cur = NULL;
        if (cu.cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur == b->context)
            cu.cuCtxSetCurrent(NULL);
        cu.cuDevicePrimaryCtxRelease_v2(b->device);
    }
    free(b);
}

static fj_status cuda_create(int32_t index, fj__err *err, void **out)
{
    *out = NULL;
    fj_device_info info = {.struct_size = sizeof info};
    fj_status st = cuda_device_info(index, &info, err);
    if (st != FJ_OK)
        return st;
    cub *b = calloc(1, sizeof *b);
    if (!b)
        return fj__fail(err, FJ_ERR_OUT_OF_MEMORY, "out of memory");
    b->err = err;
    snprintf(b->arch, sizeof b->arch, "%s", info.arch);
    snprintf(b->target, sizeof b->target, "cuda|%s", info.arch);
    snprintf(b->compiler, sizeof b->compiler, "nvrtc (not loaded)");
    CU_CHECK(cu.cuDeviceGet(&b->device, index));
    /* The caller's current context when it is on this device (so flashjit composes with
    ** frameworks), else the device's primary context, as the CUDA runtime uses. */
    CUcontext cur = NULL;
    CUdevice cur_dev = -1;
    if (cu.cuCtxGetCurrent(&cur) == CUDA_SUCCESS && cur &&
        cu.cuCtxGetDevice(&cur_dev) == CUDA_SUCCESS && cur_dev == b->device) {
        b->context = cur;
    } else {
        CU_CHECK(cu.cuDevicePrimaryCtxRetain(&b->context, b->device));
        b->retained_primary = 1;
        CU_CHECK(cu.cuCtxSetCurrent(b->context));
    }
out:
    if (st != FJ_OK) {
        cuda_destroy(b);
        return st;
    }
    *out = b;
    return FJ_OK;
}

static const char *cuda_target(void *p)
{
    return ((cub *)p)->target;
}

static const char *cuda_compiler(void *p)
{
    cub *b = p;
    if (nv_available())
        snprintf(b->compiler, sizeof b->compiler, "%s %s", b->arch, nv.version);
    return b->compiler;
}

/* Compiles source with opts; *log gets the program's log (NULL when it is empty). The caller
** destroys *prog where creating it succeeded. */
static nvrtcResult nvrtc_compile(const char *source, const char *const *opts, int nopts,
                                 nvrtcProgram *prog, char **log)
{
    *log = NULL;
    *prog = NULL;
    nvrtcResult rc = nv.nvrtcCreateProgram(prog, source, "flashjit.cu", 0, NULL, NULL);
    if (rc != 0)
        return rc;
    rc = nv.nvrtcCompileProgram(*prog, nopts, opts);
    size_t log_size = 0;
    if (nv.nvrtcGetProgramLogSize(*prog, &log_size) == 0 && log_size > 1 &&
        (*log = malloc(log_size + 1))) {
        nv.nvrtcGetProgramLog(*prog, *log);
        (*log)[log_size] = '\0';
    }
    return rc;
}

/* The lines of log that report an error, into buf: a failed compile's cause without the
** warnings before it, which can fill any message. */
static void error_lines(const char *log, char *buf, size_t size)
{
    size_t n = 0;
    buf[0] = '\0';
    for (const char *line = log; line && *line && n + 1 < size;) {
        const char *end = strchr(line, '\n');
        const size_t len = end ? (size_t)(end - line) : strlen(line);
        const char *hit = strstr(line, "error");
        if (hit && hit < line + len) {
            const size_t take = len < size - n - 2 ? len : size - n - 2;
            memcpy(buf + n, line, take);
            n += take;
            buf[n++] = ' ';
            buf[n] = '\0';
        }
        line = end ? end + 1 : NULL;
    }
}

fj_status fj__cuda_compile_for(const char *arch, const char *source, const char *options,
                               fj__blob *binary, char **log, fj__err *err)
{
    binary->data = NULL;
    binary->size = 0;
    *log = NULL;
    if (!nv_available())
        return fj__fail(err, FJ_ERR_COMPILE,
                        "NVRTC is not available (libnvrtc.so not found; set CUDA_HOME): kernels "
                        "cannot be compiled, only loaded from a cache");
    char arch_opt[64];
    snprintf(arch_opt, sizeof arch_opt, "--gpu-architecture=%s", arch);
    enum { VERBOSE = 2 }; /* opts[VERBOSE]: ptxas' resource report in the log */
    const char *opts[16] = {arch_opt, "--std=c++17", [VERBOSE] = "--ptxas-options=-v",
                            "--modify-stack-limit=false"};
    int nopts = 4;
    /* Extra options: one string, separated by spaces (no quoting needed for ours). */
    char extra[1024];
    snprintf(extra, sizeof extra, "%s", options ? options : "");
    for (char *tok = strtok(extra, " "); tok && nopts < 16; tok = strtok(NULL, " "))
        opts[nopts++] = tok;

    /* The log explains a failure, and it carries ptxas' resource report. */
    nvrtcProgram prog = NULL;
    nvrtcResult rc = nvrtc_compile(source, opts, nopts, &prog, log);
    if (!prog)
        return fj__fail(err, FJ_ERR_COMPILE, "nvrtcCreateProgram: %s", nv.nvrtcGetErrorString(rc));
    fj_status st = FJ_OK;
    if (rc != 0) {
        char why[1536];
        error_lines(*log, why, sizeof why);
        if (!why[0]) { /* ptxas' own error does not reach a log with its resource report */
            nvrtcProgram again = NULL;
            char *plain = NULL;
            opts[VERBOSE] = opts[--nopts]; /* without it */
            nvrtc_compile(source, opts, nopts, &again, &plain);
            error_lines(plain, why, sizeof why);
            free(plain);
            if (again)
                nv.nvrtcDestroyProgram(&again);
        }
        st = fj__fail(err, FJ_ERR_COMPILE, "NVRTC (%s): %s: %.1500s", arch,
                      nv.nvrtcGetErrorString(rc),
                      why[0] ? why : *log ? *log : "(no log)");
    } else if (*log && strstr(*log, "C7508")) {
        /* ptxas ignored setmaxnreg: the kernel would run with the wrong register split. */
        st = fj__fail(err, FJ_ERR_COMPILE, "ptxas ignored setmaxnreg (C7508): %.1000s", *log);
    } else {
        size_t size = 0;
        if (nv.nvrtcGetCUBINSize(prog, &size) != 0 || size == 0 || !(binary->data = malloc(size)))
            st = fj__fail(err, FJ_ERR_COMPILE, "NVRTC produced no cubin for %s", arch);
        else if (nv.nvrtcGetCUBIN(prog, binary->data) != 0)
            st = fj__fail(err, FJ_ERR_COMPILE, "nvrtcGetCUBIN failed");
        else
            binary->size = size;
    }
    nv.nvrtcDestroyProgram(&prog);
    if (st != FJ_OK)
        FJ_FREE(binary->data);
    return st;
}

const char *fj__cuda_compiler_version(void)
{
    return nv_available() ? nv.version : "";
}

void fj__cuda_describe(char *buf, size_t size)
{
    int driver = 0;
    const char *state = "found";
    if (!cu_available())
        state = cu.lib ? "found, but cuInit failed" : "not found";
    else
        cu.cuDriverGetVersion(&driver);
    int n = snprintf(buf, size, "libcuda.so.1 %s", state);
    if (driver && n > 0 && (size_t)n < size)
        n +=
            snprintf(buf + n, size - (size_t)n, " (CUDA %d.%d)", driver / 1000, driver % 1000 / 10);
    if (n > 0 && (size_t)n < size)
        snprintf(buf + n, size - (size_t)n, "; NVRTC %s%s%s",
                 nv_available() ? nv.version : "not found (kernels load from caches only)",
                 nv_available() ? " at " : "", nv_available() ? nv.path : "");
}

static fj_status cuda_compile(void *p, const char *source, const char *options, fj__blob *binary,
                              char **log, fj__err *err)
{
    cub *b = p;
    return fj__cuda_compile_for(b->arch, source, options, binary, log, err);
}

static fj_status cuda_load(void *p, const void *binary, size_t size, const char *entry,
                           void **kernel)
{
    cub *b = p;
    (void)size;
    *kernel = NULL;
    fj_status st = make_current(b);
    if (st != FJ_OK)
        return st;
    cu_kernel *k = calloc(1, sizeof *k);
    if (!k)
        return fj__fail(b->err, FJ_ERR_OUT_OF_MEMORY, "out of memory");
    /* cuModuleLoadData rejects a cubin for another arch at once (cuLibraryLoadData would only
    ** fail later), so a foreign cached binary is a clean miss. */
    CU_CHECK(cu.cuModuleLoadData(&k->module, binary));
    CU_CHECK(cu.cuModuleGetFunction(&k->function, k->module, entry));
out:
    if (st != FJ_OK) {
        if (k->module)
            cu.cuModuleUnload(k->module);
        free(k);
        return st;
    }
    *kernel = k;
    return FJ_OK;
}

static void cuda_kernel_info(void *p, void *kernel, int32_t *registers, int32_t *local_bytes)
{
    (void)p;
    cu_kernel *k = kernel;
    int regs = 0, local = 0;
    cu.cuFuncGetAttribute(&regs, CU_FUNC_ATTRIBUTE_NUM_REGS, k->function);
    cu.cuFuncGetAttribute(&local, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, k->function);
    *registers = regs;
    *local_bytes = local;
}

static void cuda_unload(void *p, void *kernel)
{
    cu_kernel *k = kernel;
    if (!k)
        return;
    if (make_current(p) == FJ_OK)
        cu.cuModuleUnload(k->module);
    free(k);
}

static fj_status cuda_launch(void *p, void *kernel, const fj__launch *l, void *stream)
{
    cub *b = p;
    cu_kernel *k = kernel;
    fj_status st = make_current(b);
    if (st != FJ_OK)
        return st;
    if (l->shared_bytes > 48 * 1024 && (int)l->shared_bytes > k->dynamic_smem) {
        CU_CHECK(cu.cuFuncSetAttribute(k->function, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                       (int)l->shared_bytes));
        k->dynamic_smem = (int)l->shared_bytes;
    }
    /* The one argument: the parameter block, which the driver copies at the launch. */
    void *params[1] = {(void *)l->params};
    if (l->overlap_previous && cu.cuLaunchKernelEx) {
        CUlaunchAttribute overlap = {.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION};
        overlap.value.programmatic_stream_serialization_allowed = 1;
        const CUlaunchConfig config = {.grid = {l->grid[0], l->grid[1], l->grid[2]},
                                       .block = {l->block[0], l->block[1], l->block[2]},
                                       .shared_bytes = l->shared_bytes,
                                       .stream = (CUstream)stream,
                                       .attrs = &overlap,
                                       .nattrs = 1};
        CU_CHECK(cu.cuLaunchKernelEx(&config, k->function, params, NULL));
    } else {
        CU_CHECK(cu.cuLaunchKernel(k->function, l->grid[0], l->grid[1], l->grid[2], l->block[0],
                                   l->block[1], l->block[2], l->shared_bytes, (CUstream)stream,
                                   params, NULL));
    }
out:
    return st;
}

static fj_status cuda_tensor_map(void *p, const fj__tensor_map_desc *d, fj__tensor_map *out)
{
    cub *b = p;
    fj_status st = FJ_OK;
    if (!cu.cuTensorMapEncodeTiled)
        return fj__fail(b->err, FJ_ERR_UNSUPPORTED,
                        "this driver has no cuTensorMapEncodeTiled (CUDA 12 or newer needed)");
    const unsigned long long dims[4] = {d->dims[0], d->dims[1], d->dims[2], d->dims[3]};
    const unsigned long long strides[3] = {d->strides[0], d->strides[1], d->strides[2]};
    const unsigned ones[4] = {1, 1, 1, 1};
    CU_CHECK(cu.cuTensorMapEncodeTiled(
        out->bytes,
        d->dtype == FJ_DTYPE_F32     ? CU_TENSOR_MAP_DATA_TYPE_FLOAT32
        : d->dtype == FJ_DTYPE_BF16  ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
        : fj_dtype_size(d->dtype) == 1 ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                     : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        4, (void *)d->base, dims, strides, d->box, ones, CU_TENSOR_MAP_INTERLEAVE_NONE,
        CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
out:
    if (st != FJ_OK)
        fj__append(b->err,
                   " (tensor map of dims %llu x %llu x %llu x %llu, byte strides %llu, %llu, "
                   "%llu, box %u x %u x %u x %u)",
                   dims[0], dims[1], dims[2], dims[3], strides[0], strides[1], strides[2],
                   d->box[0], d->box[1], d->box[2], d->box[3]);
    return st;
}

static fj_status cuda_mem_alloc(void *p, size_t bytes, void **ptr)
{
    cub *b = p;
    fj_status st = make_current(b);
    CUdeviceptr d = 0;
    if (st == FJ_OK) {
        CUresult rc = cu.cuMemAlloc_v2(&d, bytes);
        if (rc != CUDA_SUCCESS)
            st = fj__fail(b->err, FJ_ERR_OUT_OF_MEMORY, "cuMemAlloc of %zu bytes: %s", bytes,
                          cu_error_name(rc));
    }
    *ptr = (void *)(uintptr_t)d;
    return st;
}

static fj_status cuda_mem_free(void *p, void *ptr)
{
    cub *b = p;
    fj_status st = make_current(b);
    if (st != FJ_OK)
        return st;
    CU_CHECK(cu.cuMemFree_v2((CUdeviceptr)(uintptr_t)ptr));
out:
    return st;
}

static fj_status cuda_copy_h2d(void *p, void *dst, const void *src, size_t bytes)
{
    cub *b = p;
    fj_status st = make_current(b);
    if (st != FJ_OK)
        return st;
    CU_CHECK(cu.cuMemcpyHtoD_v2((CUdeviceptr)(uintptr_t)dst, src, bytes));
out:
    return st;
}

static fj_status cuda_copy_d2h(void *p, void *dst, const void *src, size_t bytes)
{
    cub *b = p;
    fj_status st = make_current(b);
    if (st != FJ_OK)
        return st;
    CU_CHECK(cu.cuMemcpyDtoH_v2(dst, (CUdeviceptr)(uintptr_t)src, bytes));
out:
    return st;
}

static fj_status cuda_memset_async(void *p, void *dst, int value, size_t bytes, void *stream)
{
    cub *b = p;
    fj_status st = make_current(b);
    if (st != FJ_OK)
        return st;
    CU_CHECK(cu.cuMemsetD8Async((CUdeviceptr)(uintptr_t)dst, (unsigned char)value, bytes,
                                (CUstream)stream));
out:
    return st;
}

static fj_status cuda_synchronize(void *p, void *stream)
{
    cub *b = p;
    fj_status st = make_current(b);
    if (st != FJ_OK)
        return st;
    CU_CHECK(stream ? cu.cuStreamSynchronize((CUstream)stream) : cu.cuCtxSynchronize());
out:
    return st;
}

/* Whether stream is being captured into a CUDA graph (then nothing may allocate or wait). */
static int cuda_capturing(void *p, void *stream)
{
    int status = 0; /* CU_STREAM_CAPTURE_STATUS_NONE */
    if (!cu.cuStreamIsCapturing || make_current(p) != FJ_OK)
        return 0;
    return cu.cuStreamIsCapturing((CUstream)stream, &status) == CUDA_SUCCESS && status != 0;
}

const struct fj_backend_ops fj__cuda_backend = {
    .api_version = FJ_BACKEND_API_VERSION,
    .name = "cuda",
    .kind = FJ_BACKEND_CUDA,
    .device_count = cuda_device_count,
    .device_info = cuda_device_info,
    .create = cuda_create,
    .destroy = cuda_destroy,
    .target = cuda_target,
    .compiler = cuda_compiler,
    .compile = cuda_compile,
    .load = cuda_load,
    .unload = cuda_unload,
    .launch = cuda_launch,
    .mem_alloc = cuda_mem_alloc,
    .mem_free = cuda_mem_free,
    .copy_h2d = cuda_copy_h2d,
    .copy_d2h = cuda_copy_d2h,
    .memset_async = cuda_memset_async,
    .synchronize = cuda_synchronize,
    .capturing = cuda_capturing,
    .kernel_info = cuda_kernel_info,
    .tensor_map = cuda_tensor_map,
};
