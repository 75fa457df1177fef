/* How a kernel parameter block is laid out on the host: the shared vocabulary of the planner,
** which defines the blocks (plan/params.h, plan/families.h), and the renderer, which hands them
** to templates (templates/params.lua writes the kernel's struct and checks it against this). */
#ifndef FJ_CORE_LAYOUT_H
#define FJ_CORE_LAYOUT_H

#include <stddef.h>

typedef enum fj__pkind {
    FJ__PK_PTR,  /* a device pointer (8 bytes; on OpenCL a ulong cast to a pointer in kernels) */
    FJ__PK_I32,  /* int32 */
    FJ__PK_I64,  /* int64 */
    FJ__PK_F32,  /* float */
    FJ__PK_TMAP, /* a 128-byte TMA descriptor, 64-byte aligned (CUDA only) */
    FJ__PK_BLOCK /* a nested parameter block */
} fj__pkind;

typedef struct fj__playout fj__playout;

/* One field as the host laid it out. */
typedef struct fj__pfield {
    const char *name;
    fj__pkind kind;
    const char *ctype;        /* PTR: the pointee, as kernels spell it; else NULL */
    const fj__playout *block; /* BLOCK: the nested block; else NULL */
    size_t offset, size;
} fj__pfield;

/* A parameter block: its name in kernels, its fields in order, and the host's size and
** alignment. */
struct fj__playout {
    const char *name;
    const fj__pfield *fields;
    int nfields;
    size_t size, align;
};

/* A short, stable signature of a layout (its names, kinds, types and offsets, nested blocks
** included), for variant keys: a cached binary built against another layout never matches.
** hex gets 16 digits and a NUL. */
void fj__playout_signature(const fj__playout *l, char hex[17]);

/* The non-NULL pointer fields of a block laid out as l at params (nested blocks included), at
** most max of them into out. Returns how many there are. */
int fj__playout_pointers(const fj__playout *l, const void *params, void **out, int max);

#endif /* FJ_CORE_LAYOUT_H */
