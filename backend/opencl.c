/* The OpenCL backend: the portable path, and on machines without a GPU (PoCL) the one CI runs.
** libOpenCL is opened with dlopen, so libflashjit loads where no OpenCL is installed. Device
** memory is shared virtual memory (clSVMAlloc), so fj_tensor.data is a plain pointer here too. */
#define _POSIX_C_SOURCE 200809L
#define CL_TARGET_OPENCL_VERSION 300
#define CL_USE_DEPRECATED_OPENCL_1_2_APIS
#include <CL/cl.h>

#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend.h"

/* Every OpenCL entry point the backend uses, resolved once from libOpenCL. */
#define CL_FUNCS(X)                                                                                \
    X(clGetPlatformIDs)                                                                            \
    X(clGetPlatformInfo)                                                                           \
    X(clGetDeviceIDs)                                                                              \
    X(clGetDeviceInfo)                                                                             \
    X(clCreateContext)                                                                             \
    X(clReleaseContext)                                                                            \
    X(clCreateCommandQueue)                                                                        \
    X(clReleaseCommandQueue)                                                                       \
    X(clCreateProgramWithSource)                                                                   \
    X(clCreateProgramWithBinary)                                                                   \
    X(clBuildProgram)                                                                              \
    X(clGetProgramBuildInfo)                                                                       \
    X(clGetProgramInfo)                                                                            \
    X(clReleaseProgram)                                                                            \
    X(clCreateKernel)                                                                              \
    X(clReleaseKernel)                                                                             \
    X(clSetKernelArg)                                                                              \
    X(clSetKernelExecInfo)                                                                         \
    X(clEnqueueNDRangeKernel)                                                                      \
    X(clFinish)                                                                                    \
    X(clSVMAlloc)                                                                                  \
    X(clSVMFree)                                                                                   \
    X(clEnqueueSVMMemcpy)                                                                          \
    X(clEnqueueSVMMemFill)

static struct {
    void *lib;
    int ok;
#define CL_FIELD(f) __typeof__(&f) f;
    CL_FUNCS(CL_FIELD)
#undef CL_FIELD
} cl;

static pthread_once_t cl_once = PTHREAD_ONCE_INIT;

static void cl_load(void)
{
    const char *names[] = {"libOpenCL.so.1", "libOpenCL.so"};
    for (size_t i = 0; i < 2 && !cl.lib; i++)
        cl.lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!cl.lib)
        return;
#define CL_RESOLVE(f)                                                                              \
    *(void **)(&cl.f) = dlsym(cl.lib, #f);                                                         \
    if (!cl.f)                                                                                     \
        return;
    CL_FUNCS(CL_RESOLVE)
#undef CL_RESOLVE
    cl.ok = 1;
}

static int cl_available(void)
{
    pthread_once(&cl_once, cl_load);
    return cl.ok;
}

static const char *cl_error_name(cl_int code)
{
    switch (code) {
#define CL_NAME(c)                                                                                 \
    case c: return #c;
        CL_NAME(CL_DEVICE_NOT_FOUND)
        CL_NAME(CL_DEVICE_NOT_AVAILABLE)
        CL_NAME(CL_COMPILER_NOT_AVAILABLE)
        CL_NAME(CL_MEM_OBJECT_ALLOCATION_FAILURE)
        CL_NAME(CL_OUT_OF_RESOURCES)
        CL_NAME(CL_OUT_OF_HOST_MEMORY)
        CL_NAME(CL_BUILD_PROGRAM_FAILURE)
        CL_NAME(CL_INVALID_VALUE)
        CL_NAME(CL_INVALID_DEVICE)
        CL_NAME(CL_INVALID_CONTEXT)
        CL_NAME(CL_INVALID_COMMAND_QUEUE)
        CL_NAME(CL_INVALID_BINARY)
        CL_NAME(CL_INVALID_BUILD_OPTIONS)
        CL_NAME(CL_INVALID_PROGRAM)
        CL_NAME(CL_INVALID_PROGRAM_EXECUTABLE)
        CL_NAME(CL_INVALID_KERNEL_NAME)
        CL_NAME(CL_INVALID_KERNEL)
        CL_NAME(CL_INVALID_ARG_INDEX)
        CL_NAME(CL_INVALID_ARG_VALUE)
        CL_NAME(CL_INVALID_ARG_SIZE)
        CL_NAME(CL_INVALID_KERNEL_ARGS)
        CL_NAME(CL_INVALID_WORK_DIMENSION)
        CL_NAME(CL_INVALID_WORK_GROUP_SIZE)
        CL_NAME(CL_INVALID_WORK_ITEM_SIZE)
        CL_NAME(CL_INVALID_GLOBAL_WORK_SIZE)
        CL_NAME(CL_INVALID_OPERATION)
#undef CL_NAME
    }
    return "CL_ERROR";
}

/* Converts a failed OpenCL call into a status and a message naming the call. */
#define CL_CHECK(call, status)                                                                     \
    do {                                                                                           \
        cl_int rc_ = (call);                                                                       \
        if (rc_ != CL_SUCCESS) {                                                                   \
            st = fj__fail(b->err, (status), "%s: %s (%d)", #call, cl_error_name(rc_), rc_);        \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

/* A block from clSVMAlloc. Kernels may only touch SVM memory of this context (the device has no
** system SVM), so the backend keeps its blocks, sorted by base, to check pointers against. */
typedef struct svm_block {
    uintptr_t base;
    size_t bytes;
} svm_block;

typedef struct clb {
    fj__err *err;
    svm_block *blocks; /* sorted by base */
    size_t nblocks, cap;
    bool system_svm; /* any host pointer is device memory: nothing to check */
    cl_platform_id platform;
    cl_device_id device;
    cl_context context;
    cl_command_queue queue;
    char target[768];
} clb;

/* Finds device `index` among all devices of all platforms, in the order the ICD lists them. */
static fj_status find_device(int32_t index, cl_platform_id *platform, cl_device_id *device,
                             int32_t *count)
{
    cl_platform_id plats[16];
    cl_uint nplat = 0;
    *count = 0;
    if (!cl_available() || cl.clGetPlatformIDs(16, plats, &nplat) != CL_SUCCESS)
        return FJ_ERR_NO_DEVICE;
    if (nplat > 16)
        nplat = 16;
    for (cl_uint p = 0; p < nplat; p++) {
        cl_device_id devs[64];
        cl_uint ndev = 0;
        if (cl.clGetDeviceIDs(plats[p], CL_DEVICE_TYPE_ALL, 64, devs, &ndev) != CL_SUCCESS)
            continue;
        if (ndev > 64)
            ndev = 64;
        for (cl_uint d = 0; d < ndev; d++, (*count)++)
            if (*count == index && platform) {
                *platform = plats[p];
                *device = devs[d];
            }
    }
    return index >= 0 && index < *count ? FJ_OK : FJ_ERR_NO_DEVICE;
}

/* PoCL (the CPU driver) keeps compiled kernels under $POCL_CACHE_DIR, else $XDG_CACHE_HOME, else
** $HOME/.cache; with none writable it registers no device at all, which looks like a missing
** driver. True when that is the likely cause of finding no device. */
static bool pocl_cache_dir_missing(void)
{
    if (getenv("POCL_CACHE_DIR") || getenv("XDG_CACHE_HOME"))
        return false;
    const char *home = getenv("HOME");
    return !home || !*home || access(home, W_OK) != 0;
}

static fj_status no_such_device(fj__err *err, int32_t index, int32_t count)
{
    if (count == 0 && pocl_cache_dir_missing())
        return fj__fail(err, FJ_ERR_NO_DEVICE,
                        "no OpenCL device found; HOME is missing or not writable, and PoCL needs a "
                        "writable cache directory: set POCL_CACHE_DIR (or XDG_CACHE_HOME or HOME)");
    return fj__fail(err, FJ_ERR_NO_DEVICE, "OpenCL device %d does not exist (%d found)", index,
                    count);
}

static fj_status clb_device_count(int32_t *count)
{
    find_device(-1, NULL, NULL, count);
    return FJ_OK;
}

static void device_string(cl_device_id dev, cl_device_info what, char *buf, size_t size)
{
    buf[0] = '\0';
    if (cl.clGetDeviceInfo(dev, what, size, buf, NULL) != CL_SUCCESS)
        buf[0] = '\0';
    buf[size - 1] = '\0';
}

static fj_status clb_device_info(int32_t index, fj_device_info *info, fj__err *err)
{
    cl_platform_id plat;
    cl_device_id dev;
    int32_t count;
    if (find_device(index, &plat, &dev, &count) != FJ_OK)
        return no_such_device(err, index, count);
    info->backend = FJ_BACKEND_OPENCL;
    info->index = index;
    device_string(dev, CL_DEVICE_NAME, info->name, sizeof info->name);
    device_string(dev, CL_DRIVER_VERSION, info->driver, sizeof info->driver);
    snprintf(info->arch, sizeof info->arch, "opencl");
    if (cl.clGetPlatformInfo(plat, CL_PLATFORM_NAME, sizeof info->platform, info->platform, NULL) !=
        CL_SUCCESS)
        info->platform[0] = '\0';
    info->platform[sizeof info->platform - 1] = '\0';
    cl_uint units = 0;
    cl_ulong global = 0, local = 0;
    cl.clGetDeviceInfo(dev, CL_DEVICE_MAX_COMPUTE_UNITS, sizeof units, &units, NULL);
    cl.clGetDeviceInfo(dev, CL_DEVICE_GLOBAL_MEM_SIZE, sizeof global, &global, NULL);
    cl.clGetDeviceInfo(dev, CL_DEVICE_LOCAL_MEM_SIZE, sizeof local, &local, NULL);
    info->compute_units = (int32_t)units;
    info->global_memory = global;
    info->local_memory = local;
    return FJ_OK;
}

static void cl_destroy(void *p)
{
    clb *b = p;
    if (!b)
        return;
    if (b->queue) {
        cl.clFinish(b->queue);
        cl.clReleaseCommandQueue(b->queue);
    }
    if (b->context)
        cl.clReleaseContext(b->context);
    free(b->blocks);
    free(b);
}

static fj_status cl_create(int32_t index, fj__err *err, void **out)
{
    *out = NULL;
    int32_t count = 0;
    cl_platform_id plat;
    cl_device_id dev;
    if (!cl_available())
        return fj__fail(err, FJ_ERR_NO_DEVICE,
                        "OpenCL is not available (libOpenCL.so.1 not found)");
    if (find_device(index, &plat, &dev, &count) != FJ_OK)
        return no_such_device(err, index, count);
    clb *b = calloc(1, sizeof *b);
    if (!b)
        return fj__fail(err, FJ_ERR_OUT_OF_MEMORY, "out of memory");
    b->err = err;
    b->platform = plat;
    b->device = dev;
    fj_status st = FJ_OK;
    cl_device_svm_capabilities svm = 0;
    if (cl.clGetDeviceInfo(dev, CL_DEVICE_SVM_CAPABILITIES, sizeof svm, &svm, NULL) != CL_SUCCESS ||
        !(svm & CL_DEVICE_SVM_COARSE_GRAIN_BUFFER)) {
        st = fj__fail(err, FJ_ERR_UNSUPPORTED,
                      "OpenCL device %d has no shared virtual memory (OpenCL 2.0 SVM is required)",
                      index);
        goto out;
    }
    b->system_svm = (svm & CL_DEVICE_SVM_FINE_GRAIN_SYSTEM) != 0;
    cl_int rc = CL_SUCCESS;
    cl_context_properties props[] = {CL_CONTEXT_PLATFORM, (cl_context_properties)plat, 0};
    b->context = cl.clCreateContext(props, 1, &dev, NULL, NULL, &rc);
    CL_CHECK(rc, FJ_ERR_BACKEND);
    b->queue = cl.clCreateCommandQueue(b->context, dev, 0, &rc);
    CL_CHECK(rc, FJ_ERR_BACKEND);

    char platform[128], name[128], driver[128], version[128];
    cl.clGetPlatformInfo(plat, CL_PLATFORM_NAME, sizeof platform, platform, NULL);
    platform[sizeof platform - 1] = '\0';
    device_string(dev, CL_DEVICE_NAME, name, sizeof name);
    device_string(dev, CL_DRIVER_VERSION, driver, sizeof driver);
    device_string(dev, CL_DEVICE_VERSION, version, sizeof version);
    snprintf(b->target, sizeof b->target, "opencl|%s|%s|%s|%s", platform, name, version, driver);
out:
    if (st != FJ_OK) {
        cl_destroy(b);
        return st;
    }
    *out = b;
    return FJ_OK;
}

static const char *cl_target(void *p)
{
    return ((clb *)p)->target;
}

/* The build log of program for b's device; malloc'd, NULL when there is none. */
static char *build_log(clb *b, cl_program program)
{
    size_t size = 0;
    if (cl.clGetProgramBuildInfo(program, b->device, CL_PROGRAM_BUILD_LOG, 0, NULL, &size) !=
            CL_SUCCESS ||
        size == 0)
        return NULL;
    char *log = malloc(size + 1);
    if (!log)
        return NULL;
    if (cl.clGetProgramBuildInfo(program, b->device, CL_PROGRAM_BUILD_LOG, size, log, NULL) !=
        CL_SUCCESS) {
        free(log);
        return NULL;
    }
    log[size] = '\0';
    return log;
}

static fj_status cl_compile(void *p, const char *source, const char *options, fj__blob *binary,
                            char **log, fj__err *err)
{
    clb *b = p;
    binary->data = NULL;
    binary->size = 0;
    *log = NULL;
    fj_status st = FJ_OK;
    cl_int rc = CL_SUCCESS;
    unsigned char *data = NULL;
    size_t size = 0;
    cl_program program = cl.clCreateProgramWithSource(b->context, 1, &source, NULL, &rc);
    if (rc != CL_SUCCESS)
        return fj__fail(err, FJ_ERR_BACKEND, "clCreateProgramWithSource: %s (%d)",
                        cl_error_name(rc), rc);
    rc = cl.clBuildProgram(program, 1, &b->device, options, NULL, NULL);
    *log = build_log(b, program);
    if (rc != CL_SUCCESS) {
        st = fj__fail(err, FJ_ERR_COMPILE, "clBuildProgram: %s (%d): %.1500s", cl_error_name(rc),
                      rc, *log ? *log : "(no build log)");
    } else if ((rc = cl.clGetProgramInfo(program, CL_PROGRAM_BINARY_SIZES, sizeof size, &size,
                                         NULL)) != CL_SUCCESS ||
               size == 0) {
        st = fj__fail(err, FJ_ERR_BACKEND, "clGetProgramInfo: the device gives no binary (%d)", rc);
    } else if (!(data = malloc(size))) {
        st = fj__fail(err, FJ_ERR_OUT_OF_MEMORY, "out of memory for a %zu-byte binary", size);
    } else if ((rc = cl.clGetProgramInfo(program, CL_PROGRAM_BINARIES, sizeof data, &data, NULL)) !=
               CL_SUCCESS) {
        st = fj__fail(err, FJ_ERR_BACKEND, "clGetProgramInfo(CL_PROGRAM_BINARIES): %s (%d)",
                      cl_error_name(rc), rc);
        FJ_FREE(data);
    } else {
        binary->data = data;
        binary->size = size;
    }
    cl.clReleaseProgram(program);
    return st;
}

/* A loaded kernel and the parameter block last set on it: most calls repeat the previous one's
** (sizes, strides, options and often the tensors), and setting it again costs time. */
typedef struct cl_kern {
    cl_kernel kernel;
    unsigned char *last; /* the bytes last set, or NULL */
    size_t last_size;
} cl_kern;

static fj_status cl_load_kernel(void *p, const void *binary, size_t size, const char *entry,
                                void **kernel)
{
    clb *b = p;
    fj_status st = FJ_OK;
    *kernel = NULL;
    cl_int rc = CL_SUCCESS, bin_rc = CL_SUCCESS;
    const unsigned char *bins[1] = {binary};
    cl_program program =
        cl.clCreateProgramWithBinary(b->context, 1, &b->device, &size, bins, &bin_rc, &rc);
    CL_CHECK(rc, FJ_ERR_BACKEND);
    CL_CHECK(bin_rc, FJ_ERR_BACKEND);
    CL_CHECK(cl.clBuildProgram(program, 1, &b->device, "", NULL, NULL), FJ_ERR_BACKEND);
    cl_kernel k = cl.clCreateKernel(program, entry, &rc);
    CL_CHECK(rc, FJ_ERR_BACKEND);
    cl_kern *ck = calloc(1, sizeof *ck);
    if (!ck) {
        cl.clReleaseKernel(k);
        st = fj__fail(b->err, FJ_ERR_OUT_OF_MEMORY, "out of memory");
        goto out;
    }
    ck->kernel = k;
    *kernel = ck;
out:
    /* The kernel keeps its program alive. */
    if (program)
        cl.clReleaseProgram(program);
    return st;
}

static void cl_unload(void *p, void *kernel)
{
    (void)p;
    cl_kern *ck = kernel;
    if (!ck)
        return;
    cl.clReleaseKernel(ck->kernel);
    free(ck->last);
    free(ck);
}

/* Sets the kernel's one argument, the parameter block, unless it is the one set last. The
** block's pointers travel as integers, so the kernel is also told which SVM allocations it
** reaches through them. */
static fj_status set_params(clb *b, cl_kern *ck, const fj__launch *l)
{
    fj_status st = FJ_OK;
    if (ck->last && ck->last_size == l->params_size &&
        memcmp(ck->last, l->params, l->params_size) == 0)
        return FJ_OK;
    FJ_FREE(ck->last);
    void *ptrs[64];
    int n = fj__playout_pointers(l->layout, l->params, ptrs, 64);
    if (n > 64)
        return fj__fail(b->err, FJ_ERR_BACKEND, "%s has %d pointers, more than 64", l->layout->name,
                        n);
    CL_CHECK(cl.clSetKernelArg(ck->kernel, 0, l->params_size, l->params), FJ_ERR_BACKEND);
    CL_CHECK(cl.clSetKernelExecInfo(ck->kernel, CL_KERNEL_EXEC_INFO_SVM_PTRS,
                                    (size_t)n * sizeof ptrs[0], ptrs),
             FJ_ERR_BACKEND);
    if ((ck->last = malloc(l->params_size))) {
        memcpy(ck->last, l->params, l->params_size);
        ck->last_size = l->params_size;
    }
out:
    return st;
}

static fj_status cl_launch(void *p, void *kernel, const fj__launch *l, void *stream)
{
    clb *b = p;
    cl_kern *ck = kernel;
    fj_status st = set_params(b, ck, l);
    if (st != FJ_OK)
        return st;
    size_t global[3], local[3];
    for (int d = 0; d < 3; d++) {
        local[d] = l->block[d];
        global[d] = (size_t)l->grid[d] * l->block[d];
    }
    cl_command_queue queue = stream ? (cl_command_queue)stream : b->queue;
    CL_CHECK(cl.clEnqueueNDRangeKernel(queue, ck->kernel, 3, NULL, global, local, 0, NULL, NULL),
             FJ_ERR_BACKEND);
out:
    return st;
}

/* The index of the first block whose base is above addr. */
static size_t block_after(const clb *b, uintptr_t addr)
{
    size_t lo = 0, hi = b->nblocks;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (b->blocks[mid].base <= addr)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

static fj_status cl_mem_alloc(void *p, size_t bytes, void **ptr)
{
    clb *b = p;
    if (b->nblocks == b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 16;
        svm_block *grown = realloc(b->blocks, cap * sizeof *grown);
        if (!grown)
            return fj__fail(b->err, FJ_ERR_OUT_OF_MEMORY, "out of memory");
        b->blocks = grown;
        b->cap = cap;
    }
    *ptr = cl.clSVMAlloc(b->context, CL_MEM_READ_WRITE, bytes, 0);
    if (!*ptr)
        return fj__fail(b->err, FJ_ERR_OUT_OF_MEMORY, "clSVMAlloc of %zu bytes failed", bytes);
    size_t i = block_after(b, (uintptr_t)*ptr);
    memmove(b->blocks + i + 1, b->blocks + i, (b->nblocks - i) * sizeof *b->blocks);
    b->blocks[i] = (svm_block){(uintptr_t)*ptr, bytes};
    b->nblocks++;
    return FJ_OK;
}

static fj_status cl_mem_free(void *p, void *ptr)
{
    clb *b = p;
    size_t i = block_after(b, (uintptr_t)ptr);
    if (i == 0 || b->blocks[i - 1].base != (uintptr_t)ptr)
        return fj__fail(b->err, FJ_ERR_INVALID_ARGUMENT,
                        "ptr = %p was not returned by fj_malloc on this context (or was freed)",
                        ptr);
    /* clSVMFree does not wait for kernels that may still use the memory. */
    cl.clFinish(b->queue);
    cl.clSVMFree(b->context, ptr);
    memmove(b->blocks + i - 1, b->blocks + i, (b->nblocks - i) * sizeof *b->blocks);
    b->nblocks--;
    return FJ_OK;
}

static fj_status cl_check_memory(void *p, const void *ptr, size_t bytes)
{
    clb *b = p;
    if (b->system_svm)
        return FJ_OK;
    uintptr_t addr = (uintptr_t)ptr;
    size_t i = block_after(b, addr);
    if (i > 0 && addr - b->blocks[i - 1].base <= b->blocks[i - 1].bytes &&
        bytes <= b->blocks[i - 1].bytes - (addr - b->blocks[i - 1].base))
        return FJ_OK;
    return FJ_ERR_INVALID_ARGUMENT;
}

static fj_status cl_copy(clb *b, void *dst, const void *src, size_t bytes)
{
    fj_status st = FJ_OK;
    CL_CHECK(cl.clEnqueueSVMMemcpy(b->queue, CL_TRUE, dst, src, bytes, 0, NULL, NULL),
             FJ_ERR_BACKEND);
out:
    return st;
}

static fj_status cl_copy_h2d(void *p, void *dst, const void *src, size_t bytes)
{
    return cl_copy(p, dst, src, bytes);
}

static fj_status cl_copy_d2h(void *p, void *dst, const void *src, size_t bytes)
{
    return cl_copy(p, dst, src, bytes);
}

static fj_status cl_memset_async(void *p, void *dst, int value, size_t bytes, void *stream)
{
    clb *b = p;
    fj_status st = FJ_OK;
    const unsigned char pattern = (unsigned char)value;
    CL_CHECK(cl.clEnqueueSVMMemFill(stream ? (cl_command_queue)stream : b->queue, dst, &pattern, 1,
                                    bytes, 0, NULL, NULL),
             FJ_ERR_BACKEND);
out:
    return st;
}

static fj_status cl_synchronize(void *p, void *stream)
{
    clb *b = p;
    fj_status st = FJ_OK;
    CL_CHECK(cl.clFinish(stream ? (cl_command_queue)stream : b->queue), FJ_ERR_BACKEND);
out:
    return st;
}

const struct fj_backend_ops fj__opencl_backend = {
    .api_version = FJ_BACKEND_API_VERSION,
    .name = "opencl",
    .kind = FJ_BACKEND_OPENCL,
    .device_count = clb_device_count,
    .device_info = clb_device_info,
    .create = cl_create,
    .destroy = cl_destroy,
    .target = cl_target,
    .compiler = cl_target,
    .compile = cl_compile,
    .load = cl_load_kernel,
    .unload = cl_unload,
    .launch = cl_launch,
    .mem_alloc = cl_mem_alloc,
    .mem_free = cl_mem_free,
    .check_memory = cl_check_memory,
    .copy_h2d = cl_copy_h2d,
    .copy_d2h = cl_copy_d2h,
    .memset_async = cl_memset_async,
    .synchronize = cl_synchronize,
};
