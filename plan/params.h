/* Kernel parameter blocks: each kernel family takes one struct argument, and its fields are
** listed once, in an X-macro table (families.h). The table makes both sides:
**   - the host struct the runtime fills (FJ__PARAM_STRUCT), and
**   - a layout description (FJ__PARAM_LAYOUT) that the renderer hands to the templates, which
**     write the kernel's struct from it (templates/params.lua) and check at render time that
**     the device layout they computed has the host's offsets and size.
** A table row is X(T, KIND, name, spec): T the host struct, KIND one of PTR, I32, I64, F32, TMAP,
** BLOCK, and spec the pointee type as kernels spell it for PTR ("const q_t", "float"), the
** nested block's host type for BLOCK, and 0 otherwise. */
#ifndef FJ_PLAN_PARAMS_H
#define FJ_PLAN_PARAMS_H

#include <stddef.h>
#include <stdint.h>

#include "../backend/backend.h"
#include "../core/layout.h"

/* The host type of each kind. */
#define FJ__PDECL_PTR(name, spec) const void *name;
#define FJ__PDECL_I32(name, spec) int32_t name;
#define FJ__PDECL_I64(name, spec) int64_t name;
#define FJ__PDECL_F32(name, spec) float name;
#define FJ__PDECL_TMAP(name, spec) fj__tensor_map name;
#define FJ__PDECL_BLOCK(name, spec) spec name;
#define FJ__PDECL(T, kind, name, spec) FJ__PDECL_##kind(name, spec)

/* The description of each kind. */
#define FJ__PDESC_PTR(T, name, spec) {#name, FJ__PK_PTR, spec, NULL, offsetof(T, name), 8},
#define FJ__PDESC_I32(T, name, spec) {#name, FJ__PK_I32, NULL, NULL, offsetof(T, name), 4},
#define FJ__PDESC_I64(T, name, spec) {#name, FJ__PK_I64, NULL, NULL, offsetof(T, name), 8},
#define FJ__PDESC_F32(T, name, spec) {#name, FJ__PK_F32, NULL, NULL, offsetof(T, name), 4},
#define FJ__PDESC_TMAP(T, name, spec)                                                              \
    {#name, FJ__PK_TMAP, NULL, NULL, offsetof(T, name), sizeof(fj__tensor_map)},
#define FJ__PDESC_BLOCK(T, name, spec)                                                             \
    {#name, FJ__PK_BLOCK, NULL, &spec##_layout, offsetof(T, name), sizeof(spec)},
#define FJ__PDESC(T, kind, name, spec) FJ__PDESC_##kind(T, name, spec)

/* typedef struct T {...} T; from a table. */
#define FJ__PARAM_STRUCT(T, LIST)                                                                  \
    typedef struct T {                                                                             \
        LIST(FJ__PDECL, T)                                                                         \
    } T;                                                                                           \
    extern const fj__playout T##_layout

/* Defines T##_layout, the description of T named kname in kernels (in one .c file). */
#define FJ__PARAM_LAYOUT(T, kname, LIST)                                                           \
    static const fj__pfield T##_fields[] = {LIST(FJ__PDESC, T)};                                   \
    const fj__playout T##_layout = {kname, T##_fields,                                             \
                                    (int)(sizeof T##_fields / sizeof T##_fields[0]), sizeof(T),    \
                                    _Alignof(T)}

#endif /* FJ_PLAN_PARAMS_H */
