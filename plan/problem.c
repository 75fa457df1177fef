/* The features of a request: what its plan depends on (see problem.h). */
#include "problem.h"

#include "plan.h"

#include <string.h>

/* Tensor-core copies move 16-byte chunks: base, row strides and head dim must allow it (in
** multiples of 8 elements, 16 of FP8). */
static int rows_16b(const fj_tensor *packed_or_4d)
{
    const fj_tensor t = fj__tensor_4d(packed_or_4d);
    const int64_t per16 = fj_dtype_size(t.dtype) == 1 ? 16 : 8;
    if ((uintptr_t)t.data % 16 != 0 || t.shape[3] % per16 != 0)
        return 0;
    for (int i = 0; i < 3; i++)
        if (t.stride[i] % per16 != 0)
            return 0;
    return 1;
}

/* Whether bulk tensor copies can read t: 16-byte aligned base and byte strides below 2^40, and
** no broadcast (stride 0) dimension of more than one element. */
static int tma_can_read(const fj_tensor *packed_or_4d)
{
    if (!rows_16b(packed_or_4d))
        return 0;
    const fj_tensor t = fj__tensor_4d(packed_or_4d);
    const int64_t es = (int64_t)fj_dtype_size(t.dtype);
    for (int i = 0; i < 3; i++)
        if (t.shape[i] > 1 && (t.stride[i] <= 0 || t.stride[i] * es >= ((int64_t)1 << 40)))
            return 0;
    return 1;
}

/* Whether TMA can copy tiles of p's bias: rows of 16-byte multiples, one per query, and the
** broadcast-free dimensions nested as in a contiguous [batch, heads, sq, sk] tensor. */
static int bias_tma_can_read(const fj__problem *p)
{
    const fj_tensor *b = p->bias;
    const int64_t es = (int64_t)fj_dtype_size(b->dtype);
    const int64_t *s = p->bias_stride; /* batch, head, row; 0 where broadcast */
    if ((uintptr_t)b->data % 16 || s[2] <= 0 || (s[2] * es) % 16 || s[2] < p->seqlen_k ||
        (s[1] && ((s[1] * es) % 16 || s[1] < s[2] * p->seqlen_q)) ||
        (s[0] && ((s[0] * es) % 16 || s[0] < (s[1] ? s[1] * p->heads_q : s[2] * p->seqlen_q))))
        return 0;
    return s[0] * es < ((int64_t)1 << 40) && s[1] * es < ((int64_t)1 << 40);
}

void fj__bwd_features_of(const fj__bwd_problem *p, fj__features *f)
{
    fj__features_of(&p->f, f);
    memcpy(f->dbias_extent, p->dbias_extent, sizeof f->dbias_extent);
    f->grads_16b = rows_16b(p->dout) && rows_16b(p->dq) && rows_16b(p->dk) && rows_16b(p->dv);
    f->dout_tma = (uint8_t)tma_can_read(p->dout);
    f->deterministic = p->f.deterministic != 0;
}

void fj__features_of(const fj__problem *p, fj__features *f)
{
    memset(f, 0, sizeof *f);
    f->batch = p->batch;
    f->seqlen_q = p->seqlen_q;
    f->seqlen_k = p->seqlen_k;
    f->heads_q = p->heads_q;
    f->heads_kv = p->heads_kv;
    f->head_dim = p->head_dim;
    f->head_dim_v = p->head_dim_v;
    f->q_dtype = p->q_dtype;
    f->kv_dtype = p->kv_dtype;
    f->out_dtype = p->out_dtype;
    f->bias_dtype = p->bias ? (int32_t)p->bias->dtype : -1;
    f->window_left = p->window_left;
    f->window_right = p->window_right;
    f->softcap = p->softcap > 0.0f;
    f->neg_scale = p->scale < 0.0f;
    f->lse = p->lse != NULL;
    f->alibi = p->alibi != NULL;
    f->mask = p->mask != NULL;
    f->block_mask = p->block_mask != NULL;
    f->varlen = (uint8_t)(p->cu_seqlens_q ? 1 + (p->seqused_k != NULL) : 0);
    f->ranges = p->mask_ranges ? (uint8_t)p->mask_ranges->shape[3] : 0;
    const fj_tensor *t[4] = {p->q, p->k, p->v, p->out};
    for (int i = 0; i < 4; i++)
        f->rows_16b[i] = (uint8_t)rows_16b(t[i]);
    for (int i = 0; i < 3; i++)
        f->tma[i] = (uint8_t)tma_can_read(t[i]);
    f->bias_tma = p->bias && bias_tma_can_read(p);
    f->mask_mod = p->mask_mod;
    f->score_mod = p->score_mod;
    f->score_mod_grad = p->score_mod_grad;
    f->mask_mod_reads_args = (uint8_t)p->mask_mod_reads_args;
    /* Block classes are shared across batches and heads unless a mask differs by them. */
    const char *mm = p->mask_mod;
    f->classes_by_b = (mm && strstr(mm, "FJ_B")) || (p->mask && p->mask_stride[0]) ||
                      (p->mask_ranges && p->ranges_stride[0]);
    f->classes_by_h = (mm && strstr(mm, "FJ_H")) || (p->mask && p->mask_stride[1]) ||
                      (p->mask_ranges && p->ranges_stride[1]);
    f->num_splits = p->num_splits;
    f->paged = p->page_table != NULL;
    f->page_size = f->paged ? p->page_size : 0;
    f->few_rows = f->paged && p->cu_seqlens_q &&
                  p->q->shape[0] <= FJ__DECODE_MAX_SEQLEN_Q * p->batch;
    f->descale = p->descale[0] || p->descale[1] || p->descale[2];
    f->v_in_k = p->v->data == p->k->data && p->v->dtype == p->k->dtype &&
                p->head_dim_v <= p->head_dim && p->v->stride[0] == p->k->stride[0] &&
                p->v->stride[1] == p->k->stride[1] && p->v->stride[2] == p->k->stride[2] &&
                p->v->shape[1] == p->k->shape[1] && p->v->shape[2] == p->k->shape[2];
}
