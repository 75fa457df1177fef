/* The plan of an append to a paged KV cache: one launch, a work-group per (token, sequence), or
** per packed token row. */
#include <string.h>

#include "plan.h"

#define APPEND_THREADS 128 /* kv_append.lua */

fj_status fj__plan_append(const fj__append_problem *p, fj_backend_kind backend, fj__plan *plan,
                          fj__err *err)
{
    memset(plan, 0, sizeof *plan);
    plan->kind = FJ__PLAN_APPEND;
    const int packed = p->cu_seqlens_new != NULL;
    if ((!packed && p->batch > FJ__MAX_GRID_DIM_Y) || p->batch > INT32_MAX ||
        p->tokens > INT32_MAX)
        return fj__fail(err, FJ_ERR_UNSUPPORTED,
                        "%lld sequences of %lld new tokens%s: at most %d sequences (packed: "
                        "2^31 - 1), 2^31 - 1 tokens",
                        (long long)p->batch, (long long)p->tokens, packed ? " in all" : " each",
                        FJ__MAX_GRID_DIM_Y);
    fj__step *s = fj__plan_add_step(plan, FJ__STEP_KERNEL);
    fj__variant *v = &s->variant;
    v->family = FJ__FAMILY_APPEND;
    v->backend = backend;
    v->path = FJ__PATH_SIMT;
    /* kv_dtype: the caches'. New tokens of that dtype are copied by bits, kv_dtype giving the
    ** element size, and the q and out roles are unused (named as kv, or bf16 for an FP8 cache).
    ** Others are read as the q role and rounded into the caches as the out role. */
    v->kv_dtype = p->dtype;
    if (p->new_dtype == p->dtype) {
        v->q_dtype = v->out_dtype = fj__dtype_fp8(p->dtype) ? FJ_DTYPE_BF16 : p->dtype;
    } else {
        v->q_dtype = p->new_dtype;
        v->out_dtype = p->dtype;
    }
    v->acc_dtype = FJ_DTYPE_F32;
    v->threads = APPEND_THREADS;
    s->block[0] = APPEND_THREADS;
    v->varlen = (uint8_t)packed; /* a row finds its sequence */
    s->grid[0] = (uint32_t)p->tokens;
    s->grid[1] = packed ? 1 : (uint32_t)p->batch;
    plan->main_step = 0;
    return FJ_OK;
}

void fj__append_fill(const fj__append_problem *p, void *params)
{
    fj__append_params *A = params;
    A->k_new = p->k_new->data;
    A->v_new = p->v_new->data;
    A->k_cache = p->k_cache->data;
    A->v_cache = p->v_cache->data;
    A->seqused_k = p->seqused_k->data;
    const int64_t *from[4] = {p->new_strides[0], p->new_strides[1], p->k_cache->stride,
                              p->v_cache->stride};
    int64_t *strides[4] = {&A->kn_sb, &A->vn_sb, &A->kc_sp, &A->vc_sp};
    for (int i = 0; i < 4; i++)
        for (int d = 0; d < 3; d++)
            strides[i][d] = from[i][d];
    A->heads_kv = (int32_t)p->heads_kv;
    A->head_dim = (int32_t)p->head_dim;
    A->head_dim_v = (int32_t)p->head_dim_v;
    FJ__FILL_PAGE_FIELDS(A, p);
    A->max_pages = (int32_t)p->max_pages;
    A->cu_seqlens_new = p->cu_seqlens_new ? p->cu_seqlens_new->data : NULL;
    A->batch = (int32_t)p->batch;
    A->tokens = (int32_t)p->tokens;
    A->k_descale = p->descale[0] ? p->descale[0]->data : NULL;
    A->v_descale = p->descale[1] ? p->descale[1]->data : NULL;
    A->kd_sb = p->descale_stride[0][0];
    A->kd_sh = p->descale_stride[0][1];
    A->vd_sb = p->descale_stride[1][0];
    A->vd_sh = p->descale_stride[1][1];
}
