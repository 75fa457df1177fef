/* The backend interface: one versioned table of functions per backend (cuda, opencl). Nothing
** above this interface knows which backend runs. */
#ifndef FJ_BACKEND_H
#define FJ_BACKEND_H

#include "../core/core.h"
#include "../core/layout.h"

#include <stddef.h>
#include <stdint.h>

#define FJ_BACKEND_API_VERSION 2

/* A tiled view of a rank-4 tensor for bulk tensor copies (CUDA's TMA): dims[0] is contiguous,
** strides are in bytes for dims 1..3, box is the copied block; shared memory gets the 128-byte
** swizzle, elements outside the tensor read as zeros and bulk reductions skip them. Compared with
** memcmp: zero it first. */
typedef struct fj__tensor_map_desc {
    const void *base;
    uint64_t dims[4];
    uint64_t strides[3];
    uint32_t box[4];
    int32_t dtype; /* fj_dtype of the elements */
} fj__tensor_map_desc;

/* The bytes of an encoded tensor map (CUtensorMap), aligned as the driver requires. */
typedef struct fj__tensor_map {
    _Alignas(64) unsigned char bytes[128];
} fj__tensor_map;

/* One launch: grid counts blocks (work-groups), block counts threads (work-items) per block.
** A kernel takes one argument, its parameter block: params_size bytes at params, laid out as
** layout says (the backend reads it only to find the pointer fields, which OpenCL must be told
** about). */
typedef struct fj__launch {
    uint32_t grid[3];
    uint32_t block[3];
    uint32_t shared_bytes; /* dynamic shared memory (CUDA); 0 for OpenCL */
    /* CUDA, sm_90+: the launch may begin while the stream's previous kernel ends (programmatic
    ** dependent launch); the kernel waits for that kernel's writes itself (griddepcontrol.wait).
    ** Ignored where the driver cannot (no cuLaunchKernelEx) and by OpenCL. */
    uint8_t overlap_previous;
    const void *params;
    size_t params_size;
    const fj__playout *layout;
} fj__launch;

/* A binary produced by compile(), malloc'd; the caller frees data. */
typedef struct fj__blob {
    void *data;
    size_t size;
} fj__blob;

struct fj_backend_ops {
    int api_version; /* FJ_BACKEND_API_VERSION */
    const char *name;
    fj_backend_kind kind;

    /* Devices, without a context. A missing runtime is 0 devices, not an error. */
    fj_status (*device_count)(int32_t *count);
    fj_status (*device_info)(int32_t index, fj_device_info *info, fj__err *err);

    /* Opens device `index`. Failures are described in err, which the backend keeps using for
    ** the object's lifetime. */
    fj_status (*create)(int32_t index, fj__err *err, void **backend);
    void (*destroy)(void *b);

    /* What a binary depends on besides the source, part of every cache key: "cuda|sm_90a"; for
    ** OpenCL the platform, device and driver. Text owned by b. */
    const char *(*target)(void *b);
    /* The compiler that makes binaries, recorded with each cached one (not part of the key: a
    ** cubin runs wherever its arch does, and a shipped cache must hit without NVRTC). */
    const char *(*compiler)(void *b);

    /* Compiles source into a binary for target(). *log gets the compiler log (malloc'd, may be
    ** NULL) on success and failure alike; failures are described in err (not the backend's own
    ** error buffer), so that several threads may compile at once. */
    fj_status (*compile)(void *b, const char *source, const char *options, fj__blob *binary,
                         char **log, fj__err *err);
    /* Loads a binary and resolves entry. A binary for another target fails here. */
    fj_status (*load)(void *b, const void *binary, size_t size, const char *entry, void **kernel);
    void (*unload)(void *b, void *kernel);
    fj_status (*launch)(void *b, void *kernel, const fj__launch *l, void *stream);

    fj_status (*mem_alloc)(void *b, size_t bytes, void **ptr);
    fj_status (*mem_free)(void *b, void *ptr);
    /* Optional (NULL: cannot tell): FJ_OK when kernels may read and write [ptr, ptr + bytes),
    ** FJ_ERR_INVALID_ARGUMENT otherwise. Sets no message; the caller names the tensor. */
    fj_status (*check_memory)(void *b, const void *ptr, size_t bytes);
    fj_status (*copy_h2d)(void *b, void *dst, const void *src, size_t bytes);
    fj_status (*copy_d2h)(void *b, void *dst, const void *src, size_t bytes);
    /* Sets bytes of device memory at dst to value, queued on stream. */
    fj_status (*memset_async)(void *b, void *dst, int value, size_t bytes, void *stream);
    fj_status (*synchronize)(void *b, void *stream);
    /* Optional (NULL: never): whether stream is being captured into a graph, so that nothing
    ** may allocate or wait on it. */
    int (*capturing)(void *b, void *stream);

    /* Optional (NULL: unknown): registers per thread and local-memory (spill) bytes. */
    void (*kernel_info)(void *b, void *kernel, int32_t *registers, int32_t *local_bytes);
    /* Optional (NULL: no bulk tensor copies): encodes a tensor map. */
    fj_status (*tensor_map)(void *b, const fj__tensor_map_desc *d, fj__tensor_map *out);
};

extern const struct fj_backend_ops fj__opencl_backend;
extern const struct fj_backend_ops fj__cuda_backend;

/* Compiles CUDA source for an arch ("sm_90a") with NVRTC alone: no device, no driver. Used by
** the CUDA backend and by `flashjit cache build`. */
fj_status fj__cuda_compile_for(const char *arch, const char *source, const char *options,
                               fj__blob *binary, char **log, fj__err *err);
/* "nvrtc 13.0 (V13.0.88)", or "" when NVRTC is not available. */
const char *fj__cuda_compiler_version(void);
/* What the CUDA backend found: the driver library and its version, NVRTC and where. */
void fj__cuda_describe(char *buf, size_t size);

#endif /* FJ_BACKEND_H */
