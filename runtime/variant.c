/* Variants: the template parameters of a kernel and its canonical key. The same list of named
** values feeds both, so the key always covers exactly what the template sees. */
#include "variant.h"

#include <stdio.h>
#include <string.h>

const char *fj__variant_template(const fj__variant *v)
{
    if (v->family == FJ__FAMILY_CLASSIFY)
        return "attn_classify.lua";
    switch (v->path) {
    case FJ__PATH_MMA:
        return "attn_fwd_mma.cu.lua";
    case FJ__PATH_WGMMA:
        return "attn_fwd_wgmma.cu.lua";
    default:
        return "attn_fwd_simt.lua";
    }
}

const char *fj__variant_entry(const fj__variant *v)
{
    return v->family == FJ__FAMILY_CLASSIFY ? "fj_attn_classify" : "fj_attn_fwd";
}

const char *fj__variant_path(const fj__variant *v)
{
    if (v->family == FJ__FAMILY_CLASSIFY)
        return v->backend == FJ_BACKEND_CUDA ? "cuda.classify" : "opencl.classify";
    if (v->backend == FJ_BACKEND_CUDA)
        return v->path == FJ__PATH_WGMMA ? "cuda.fwd.wgmma"
               : v->path == FJ__PATH_MMA ? "cuda.fwd.mma"
                                         : "cuda.fwd.simt";
    return "opencl.fwd.simt";
}

int fj__variant_element_masks(const fj__variant *v)
{
    return v->mask_mod || v->mask_tensor || v->mask_ranges;
}

uint32_t fj__variant_bias_bytes(const fj__variant *v)
{
    return v->bias == 0 ? 0 : v->bias == 1 ? 4u : (uint32_t)fj_dtype_size((fj_dtype)v->dtype);
}

uint32_t fj__variant_shared_bytes(const fj__variant *v)
{
    if (v->path == FJ__PATH_WGMMA) {
        /* Q buffers, a ring of K and V (and bias) tiles, 8 + 4 * stages mbarriers and two
        ** tile slots (see the template), and slack to align the panels to 1024 bytes. */
        uint32_t q = 2u * (uint32_t)(v->tile_m * v->head_dim_pad) * (v->q_stages ? v->q_stages : 1u);
        uint32_t kv = 2u * (uint32_t)(v->tile_n * (v->head_dim_pad + v->head_dim_v_pad));
        if (v->bias_tma) /* a bias tile per ring slot */
            kv += fj__variant_bias_bytes(v) * (uint32_t)(v->tile_m * v->tile_n);
        return q + v->stages * kv + 8u * (8u + 4u * v->stages) + 8u + 1023u;
    }
    if (v->path != FJ__PATH_MMA)
        return 0; /* the SIMT kernel declares its shared memory statically */
    /* Q [tile_m][d + 8], K [tile_n][d + 8], V [tile_n][dv + 8], 16-bit elements. */
    return (uint32_t)(2 * ((v->tile_m + v->tile_n) * (v->head_dim_pad + 8) +
                           v->tile_n * (v->head_dim_v_pad + 8)));
}

int fj__variant_params(const fj__variant *v, tpl_param out[FJ__MAX_PARAMS])
{
    int n = 0;
#define INT_PARAM(field) out[n++] = (tpl_param){.name = #field, .kind = TPL_INT, .i = v->field}
#define BOOL_PARAM(field)                                                                          \
    out[n++] = (tpl_param)                                                                         \
    {                                                                                              \
        .name = #field, .kind = TPL_BOOL, .i = v->field                                            \
    }
    out[n++] = (tpl_param){
        .name = "backend", .kind = TPL_STR, .s = fj__backend_name((fj_backend_kind)v->backend)};
    out[n++] =
        (tpl_param){.name = "dtype", .kind = TPL_STR, .s = fj__dtype_name((fj_dtype)v->dtype)};
    out[n++] = (tpl_param){.name = "kernel", .kind = TPL_STR, .s = fj__variant_template(v)};
    out[n++] =
        (tpl_param){.name = "mask_mod", .kind = TPL_STR, .s = v->mask_mod ? v->mask_mod : ""};
    out[n++] =
        (tpl_param){.name = "score_mod", .kind = TPL_STR, .s = v->score_mod ? v->score_mod : ""};
    INT_PARAM(head_dim_pad);
    INT_PARAM(head_dim_v_pad);
    INT_PARAM(tile_m);
    INT_PARAM(tile_n);
    INT_PARAM(threads);
    INT_PARAM(warps);
    INT_PARAM(kk_unroll);
    INT_PARAM(stages);
    INT_PARAM(q_stages);
    INT_PARAM(ctas_per_sm);
    INT_PARAM(exp_poly);
    BOOL_PARAM(q_in_regs);
    BOOL_PARAM(lazy_rescale);
    BOOL_PARAM(overlap);
    BOOL_PARAM(pingpong);
    INT_PARAM(persistent);
    BOOL_PARAM(alibi);
    out[n++] = (tpl_param){.name = "bias",
                           .kind = TPL_STR,
                           .s = v->bias == 0 ? "" : v->bias == 1 ? "f32" : "dtype"};
    BOOL_PARAM(mask_tensor);
    INT_PARAM(varlen);
    INT_PARAM(mask_ranges);
    BOOL_PARAM(block_mask);
    BOOL_PARAM(bias_tma);
    BOOL_PARAM(local_mask);
    BOOL_PARAM(softcap);
    BOOL_PARAM(neg_scale);
    BOOL_PARAM(write_lse);
#undef INT_PARAM
#undef BOOL_PARAM
    return n;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(((const tpl_param *)a)->name, ((const tpl_param *)b)->name);
}

size_t fj__variant_key_text(const fj__variant *v, const char *target, const char *template_hash,
                            char *buf, size_t size)
{
    tpl_param params[FJ__MAX_PARAMS + 2];
    int n = fj__variant_params(v, params);
    params[n++] = (tpl_param){.name = "target", .kind = TPL_STR, .s = target};
    params[n++] = (tpl_param){.name = "templates", .kind = TPL_STR, .s = template_hash};
    qsort(params, (size_t)n, sizeof params[0], by_name);
    size_t len = 0;
    for (int i = 0; i < n; i++) {
        char line[1024];
        int w =
            params[i].kind == TPL_STR
                ? snprintf(line, sizeof line, "%s=%s\n", params[i].name, params[i].s)
                : snprintf(line, sizeof line, "%s=%lld\n", params[i].name, (long long)params[i].i);
        if (w < 0)
            continue;
        if (buf && len + (size_t)w < size)
            memcpy(buf + len, line, (size_t)w + 1);
        len += (size_t)w;
    }
    return len;
}
