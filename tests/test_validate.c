/* Validation of forward requests (white-box): every rejected field, its status and that the
** message names it; and how accepted requests are resolved. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "runtime/context.h"

typedef struct request {
    fj_attention_desc desc;
    fj_tensor q, k, v, out, lse;
    fj_tensor alibi, bias, mask; /* used where a case points desc at them */
    fj_tensor cu_q, cu_k, used_k, ranges, blocks, pages;
    fj_tensor descale; /* [2, 2]: batch, heads_kv */
    int use_lse;
} request;

static _Alignas(16) char storage[64];

static void dense(fj_tensor *t, fj_dtype dtype, int ndim, const int64_t *shape)
{
    memset(t, 0, sizeof *t);
    t->data = storage;
    t->dtype = dtype;
    t->ndim = ndim;
    int64_t stride = 1;
    for (int i = ndim - 1; i >= 0; i--) {
        t->shape[i] = shape[i];
        t->stride[i] = stride;
        stride *= shape[i];
    }
}

/* A valid request: q [2,16,4,64], k [2,32,2,64], v [2,32,2,48], out [2,16,4,48], lse [2,4,16]. */
static void baseline(request *r)
{
    fj_attention_desc_init(&r->desc);
    dense(&r->q, FJ_DTYPE_BF16, 4, (int64_t[]){2, 16, 4, 64});
    dense(&r->k, FJ_DTYPE_BF16, 4, (int64_t[]){2, 32, 2, 64});
    dense(&r->v, FJ_DTYPE_BF16, 4, (int64_t[]){2, 32, 2, 48});
    dense(&r->out, FJ_DTYPE_BF16, 4, (int64_t[]){2, 16, 4, 48});
    dense(&r->lse, FJ_DTYPE_F32, 3, (int64_t[]){2, 4, 16});
    dense(&r->alibi, FJ_DTYPE_F32, 1, (int64_t[]){4});
    dense(&r->bias, FJ_DTYPE_F32, 4, (int64_t[]){2, 4, 16, 32});
    dense(&r->mask, FJ_DTYPE_BOOL, 4, (int64_t[]){2, 1, 1, 32});
    dense(&r->cu_q, FJ_DTYPE_I32, 1, (int64_t[]){4});
    dense(&r->cu_k, FJ_DTYPE_I32, 1, (int64_t[]){4});
    dense(&r->used_k, FJ_DTYPE_I32, 1, (int64_t[]){3});
    dense(&r->ranges, FJ_DTYPE_I32, 4, (int64_t[]){1, 4, 32, 2});
    dense(&r->blocks, FJ_DTYPE_I32, 4, (int64_t[]){2, 1, 1, 1});
    dense(&r->descale, FJ_DTYPE_F32, 2, (int64_t[]){2, 2});
    r->use_lse = 1;
}

/* The baseline with q, k, v in f8e4m3 (out stays bf16) and per-(batch, kv head) descales. */
static void fp8(request *r)
{
    baseline(r);
    r->q.dtype = r->k.dtype = r->v.dtype = FJ_DTYPE_F8_E4M3;
    r->desc.q_descale = r->desc.k_descale = r->desc.v_descale = &r->descale;
}

/* The baseline as three packed sequences: q [40, 4, 64], k [70, 2, 64], v [70, 2, 48],
** out [40, 4, 48], lse [4, 40]. */
static void packed(request *r)
{
    baseline(r);
    dense(&r->q, FJ_DTYPE_BF16, 3, (int64_t[]){40, 4, 64});
    dense(&r->k, FJ_DTYPE_BF16, 3, (int64_t[]){70, 2, 64});
    dense(&r->v, FJ_DTYPE_BF16, 3, (int64_t[]){70, 2, 48});
    dense(&r->out, FJ_DTYPE_BF16, 3, (int64_t[]){40, 4, 48});
    dense(&r->lse, FJ_DTYPE_F32, 2, (int64_t[]){4, 40});
    r->desc.cu_seqlens_q = &r->cu_q;
    r->desc.cu_seqlens_k = &r->cu_k;
    r->desc.max_seqlen_q = 20;
    r->desc.max_seqlen_k = 30;
}

/* The baseline against a paged KV cache: k [5, 8, 2, 64] and v [5, 8, 2, 48] pages, a page table
** [2, 4] and seqused_k [2]. */
static void paged(request *r)
{
    baseline(r);
    dense(&r->k, FJ_DTYPE_BF16, 4, (int64_t[]){5, 8, 2, 64});
    dense(&r->v, FJ_DTYPE_BF16, 4, (int64_t[]){5, 8, 2, 48});
    dense(&r->pages, FJ_DTYPE_I32, 2, (int64_t[]){2, 4});
    dense(&r->used_k, FJ_DTYPE_I32, 1, (int64_t[]){2});
    r->desc.page_table = &r->pages;
    r->desc.seqused_k = &r->used_k;
}

/* The paged baseline with packed queries: two sequences of q [40, 4, 64], out [40, 4, 48],
** lse [4, 40] through cu_seqlens_q [3]. */
static void paged_packed(request *r)
{
    paged(r);
    dense(&r->q, FJ_DTYPE_BF16, 3, (int64_t[]){40, 4, 64});
    dense(&r->out, FJ_DTYPE_BF16, 3, (int64_t[]){40, 4, 48});
    dense(&r->lse, FJ_DTYPE_F32, 2, (int64_t[]){4, 40});
    dense(&r->cu_q, FJ_DTYPE_I32, 1, (int64_t[]){3});
    r->desc.cu_seqlens_q = &r->cu_q;
    r->desc.max_seqlen_q = 30;
}

static fj_status validate(request *r, fj__problem *p, fj__err *err, int null_tensor)
{
    const fj_tensor *t[4] = {&r->q, &r->k, &r->v, &r->out};
    if (null_tensor >= 1 && null_tensor <= 4)
        t[null_tensor - 1] = NULL;
    return fj__validate_forward(&r->desc, t[0], t[1], t[2], t[3], r->use_lse ? &r->lse : NULL, p,
                                err);
}

typedef struct bad_case {
    const char *what;
    void (*mutate)(request *r);
    int null_tensor; /* 1..4: pass q, k, v or out as NULL */
    fj_status status;
    const char *message;
} bad_case;

#define MUT(name, body)                                                                            \
    static void name(request *r)                                                                   \
    {                                                                                              \
        body;                                                                                      \
    }
MUT(m_none, (void)r)
MUT(q_ndim, r->q.ndim = 3)
MUT(q_data, r->q.data = NULL)
MUT(q_dtype, r->q.dtype = (fj_dtype)99)
MUT(q_misaligned, r->q.data = storage + 1)
MUT(q_seq0, r->q.shape[1] = 0)
MUT(k_stride_last, r->k.stride[3] = 2)
MUT(v_stride_neg, r->v.stride[1] = -1)
MUT(k_dtype, r->k.dtype = FJ_DTYPE_F16)
MUT(out_dtype, r->out.dtype = FJ_DTYPE_F32)
MUT(all_fp8, r->q.dtype = r->k.dtype = r->v.dtype = r->out.dtype = FJ_DTYPE_F8_E4M3)
MUT(fp8_mixed, {
    fp8(r);
    r->k.dtype = FJ_DTYPE_F8_E5M2;
})
MUT(descale_not_fp8, r->desc.k_descale = &r->descale)
MUT(descale_heads, {
    fp8(r);
    r->descale.shape[1] = 4;
})
MUT(descale_one, {
    fp8(r);
    dense(&r->descale, FJ_DTYPE_F32, 1, (int64_t[]){3});
})
MUT(descale_dtype, {
    fp8(r);
    r->descale.dtype = FJ_DTYPE_BF16;
})
MUT(descale_ndim, {
    fp8(r);
    dense(&r->descale, FJ_DTYPE_F32, 3, (int64_t[]){2, 2, 1});
})
MUT(fp8_bias, {
    fp8(r);
    r->bias.dtype = FJ_DTYPE_F8_E4M3;
    r->desc.bias = &r->bias;
})
MUT(fp8_cache_v, r->k.dtype = FJ_DTYPE_F8_E4M3)
MUT(fp8_cache_out, {
    r->k.dtype = r->v.dtype = FJ_DTYPE_F8_E4M3;
    r->out.dtype = FJ_DTYPE_F16;
})
MUT(fp8_cache_q_descale, {
    r->k.dtype = r->v.dtype = FJ_DTYPE_F8_E4M3;
    r->desc.q_descale = &r->descale;
})
MUT(fp8_paged, {
    paged(r);
    r->q.dtype = r->k.dtype = r->v.dtype = FJ_DTYPE_F8_E5M2;
})
MUT(k_batch, r->k.shape[0] = 3)
MUT(k_dim, r->k.shape[3] = 32)
MUT(v_seq, r->v.shape[1] = 31)
MUT(v_heads, r->v.shape[2] = 1)
MUT(out_dim, r->out.shape[3] = 64)
MUT(out_seq, r->out.shape[1] = 17)
MUT(out_heads, r->out.shape[2] = 3)
MUT(out_overlap, r->out.stride[2] = 0)
MUT(out_overlap2, r->out.stride[1] = 8)
MUT(gqa, {
    r->q.shape[2] = 3;
    r->out.shape[2] = 3;
    r->lse.shape[1] = 3;
})
MUT(d600, {
    r->q.shape[3] = 600;
    r->k.shape[3] = 600;
})
MUT(dv600, {
    dense(&r->v, FJ_DTYPE_BF16, 4, (int64_t[]){2, 32, 2, 600});
    dense(&r->out, FJ_DTYPE_BF16, 4, (int64_t[]){2, 16, 4, 600});
})
MUT(lse_dtype, r->lse.dtype = FJ_DTYPE_BF16)
MUT(lse_ndim, r->lse.ndim = 4)
MUT(lse_seq, r->lse.shape[2] = 15)
MUT(lse_overlap, r->lse.stride[1] = 0)
MUT(lse_data, r->lse.data = NULL)
MUT(desc_size, r->desc.struct_size = 3)
MUT(desc_size_big, r->desc.struct_size = sizeof(fj_attention_desc) + 8)
/* Ends inside a pointer: copied byte by byte, half of it would be the caller's. */
MUT(desc_size_inside, r->desc.struct_size = offsetof(fj_attention_desc, mask_mod) + 3)
MUT(scale_nan, r->desc.softmax_scale = NAN)
MUT(scale_inf, r->desc.softmax_scale = INFINITY)
MUT(causal2, r->desc.causal = 2)
MUT(wleft, r->desc.window_left = -2)
MUT(wright, r->desc.window_right = -5)
MUT(softcap_neg, r->desc.softcap = -1)
MUT(softcap_nan, r->desc.softcap = NAN)
/* Finite but beyond what float scores in log2 units hold. */
MUT(scale_huge, r->desc.softmax_scale = 3.4e38f)
MUT(scale_huge_neg, r->desc.softmax_scale = -2e6f)
MUT(softcap_tiny, r->desc.softcap = 1e-45f)
MUT(softcap_huge, r->desc.softcap = 3.4e38f)
MUT(overflow, r->q.stride[0] = INT64_MAX / 2)
MUT(args_negative, r->desc.mod_args_count = -1)
MUT(args_null, r->desc.mod_args_count = 4)
MUT(args_misaligned, {
    r->desc.mod_args = storage + 2;
    r->desc.mod_args_count = 1;
})
MUT(seq_huge, {
    dense(&r->q, FJ_DTYPE_BF16, 4, (int64_t[]){2, 1LL << 31, 4, 64});
    dense(&r->out, FJ_DTYPE_BF16, 4, (int64_t[]){2, 1LL << 31, 4, 48});
    r->use_lse = 0;
})
MUT(alibi_ndim, {
    r->alibi.ndim = 3;
    r->desc.alibi_slopes = &r->alibi;
})
MUT(alibi_dtype, {
    r->alibi.dtype = FJ_DTYPE_BF16;
    r->desc.alibi_slopes = &r->alibi;
})
MUT(alibi_heads, {
    r->alibi.shape[0] = 2;
    r->desc.alibi_slopes = &r->alibi;
})
MUT(alibi_batch, {
    dense(&r->alibi, FJ_DTYPE_F32, 2, (int64_t[]){3, 4});
    r->desc.alibi_slopes = &r->alibi;
})
MUT(alibi_null_data, {
    r->alibi.data = NULL;
    r->desc.alibi_slopes = &r->alibi;
})
MUT(bias_heads, {
    r->bias.shape[1] = 2;
    r->desc.bias = &r->bias;
})
MUT(bias_keys, {
    r->bias.shape[3] = 31;
    r->desc.bias = &r->bias;
})
MUT(bias_dtype, {
    r->bias.dtype = FJ_DTYPE_F16;
    r->desc.bias = &r->bias;
})
MUT(bias_ndim, {
    r->bias.ndim = 3;
    r->desc.bias = &r->bias;
})
MUT(mask_dtype, {
    r->mask.dtype = FJ_DTYPE_F32;
    r->desc.mask = &r->mask;
})
MUT(mask_rows, {
    r->mask.shape[2] = 15;
    r->desc.mask = &r->mask;
})
MUT(q_bool, r->q.dtype = r->k.dtype = r->v.dtype = r->out.dtype = FJ_DTYPE_BOOL)
MUT(ranges_cols, {
    r->ranges.shape[3] = 3;
    r->desc.mask_ranges = &r->ranges;
})
MUT(ranges_keys, {
    r->ranges.shape[2] = 16;
    r->desc.mask_ranges = &r->ranges;
})
MUT(ranges_dtype, {
    r->ranges.dtype = FJ_DTYPE_F32;
    r->desc.mask_ranges = &r->ranges;
})
MUT(ranges_batch, {
    r->ranges.shape[0] = 3;
    r->desc.mask_ranges = &r->ranges;
})
MUT(blocks_keys, {
    r->blocks.shape[3] = 2;
    r->desc.block_mask = &r->blocks;
})
MUT(blocks_dtype, {
    r->blocks.dtype = FJ_DTYPE_BOOL;
    r->desc.block_mask = &r->blocks;
})
MUT(varlen_no_k, {
    packed(r);
    r->desc.cu_seqlens_k = NULL;
})
MUT(varlen_dtype, {
    packed(r);
    r->cu_q.dtype = FJ_DTYPE_F32;
})
MUT(varlen_short, {
    packed(r);
    r->cu_q.shape[0] = 1;
})
MUT(varlen_k_count, {
    packed(r);
    r->cu_k.shape[0] = 3;
})
MUT(varlen_used, {
    packed(r);
    r->used_k.shape[0] = 4;
    r->desc.seqused_k = &r->used_k;
})
MUT(varlen_max, {
    packed(r);
    r->desc.max_seqlen_k = 0;
})
MUT(varlen_dense, {
    r->desc.cu_seqlens_q = &r->cu_q;
    r->desc.cu_seqlens_k = &r->cu_k;
    r->desc.max_seqlen_q = r->desc.max_seqlen_k = 8;
})
MUT(varlen_v_rows, {
    packed(r);
    r->v.shape[0] = 69;
})
MUT(varlen_lse, {
    packed(r);
    r->lse.shape[1] = 39;
})
MUT(varlen_bias, {
    packed(r);
    dense(&r->bias, FJ_DTYPE_F32, 4, (int64_t[]){3, 4, 16, 30});
    r->desc.bias = &r->bias;
})
MUT(varlen_blocks, { /* (the dense request's classes: two batches, not three sequences) */
    packed(r);
    r->desc.block_mask = &r->blocks;
})
MUT(paged_no_used, {
    paged(r);
    r->desc.seqused_k = NULL;
})
MUT(paged_table_dtype, {
    paged(r);
    r->pages.dtype = FJ_DTYPE_F32;
})
MUT(paged_table_ndim, {
    paged(r);
    dense(&r->pages, FJ_DTYPE_I32, 1, (int64_t[]){2});
})
MUT(paged_table_batch, {
    paged(r);
    dense(&r->pages, FJ_DTYPE_I32, 2, (int64_t[]){3, 4});
})
MUT(paged_v_pages, {
    paged(r);
    r->v.shape[0] = 4;
})
MUT(paged_v_page_size, {
    paged(r);
    r->v.shape[1] = 16;
})
MUT(paged_used_count, {
    paged(r);
    dense(&r->used_k, FJ_DTYPE_I32, 1, (int64_t[]){3});
})
MUT(paged_bias, { /* keys: the table's 4 pages of 8 */
    paged(r);
    dense(&r->bias, FJ_DTYPE_F32, 4, (int64_t[]){2, 4, 16, 30});
    r->desc.bias = &r->bias;
})
MUT(paged_blocks, {
    paged(r);
    r->desc.block_mask = &r->blocks;
})
MUT(paged_packed_max, {
    paged_packed(r);
    r->desc.max_seqlen_q = 0;
})
MUT(paged_packed_cu_k, {
    paged_packed(r);
    r->desc.cu_seqlens_k = &r->cu_k;
})
MUT(paged_packed_q_ndim, {
    paged(r);
    r->desc.cu_seqlens_q = &r->cu_q;
    r->desc.max_seqlen_q = 16;
})
MUT(paged_packed_batch, {
    paged_packed(r);
    dense(&r->cu_q, FJ_DTYPE_I32, 1, (int64_t[]){4});
})
MUT(paged_packed_out_rows, {
    paged_packed(r);
    r->out.shape[0] = 39;
})
MUT(paged_packed_v_heads, {
    paged_packed(r);
    r->v.shape[2] = 1;
})
MUT(paged_packed_lse, {
    paged_packed(r);
    r->lse.shape[1] = 41;
})
MUT(paged_packed_bias, {
    paged_packed(r);
    r->desc.bias = &r->bias;
})
MUT(splits_negative, r->desc.num_splits = -1)
MUT(splits_many, r->desc.num_splits = 65)
MUT(batch_huge, {
    r->q.shape[0] = r->k.shape[0] = r->v.shape[0] = r->out.shape[0] = 70000;
    r->use_lse = 0;
})

static const bad_case bad_cases[] = {
    {"q NULL", m_none, 1, FJ_ERR_INVALID_ARGUMENT, "q is NULL"},
    {"k NULL", m_none, 2, FJ_ERR_INVALID_ARGUMENT, "k is NULL"},
    {"v NULL", m_none, 3, FJ_ERR_INVALID_ARGUMENT, "v is NULL"},
    {"out NULL", m_none, 4, FJ_ERR_INVALID_ARGUMENT, "out is NULL"},
    {"q ndim", q_ndim, 0, FJ_ERR_INVALID_ARGUMENT, "q.ndim = 3, expected 4"},
    {"q data", q_data, 0, FJ_ERR_INVALID_ARGUMENT, "q.data is NULL"},
    {"q dtype", q_dtype, 0, FJ_ERR_INVALID_ARGUMENT, "q.dtype = 99 is not an fj_dtype"},
    {"q aligned", q_misaligned, 0, FJ_ERR_INVALID_ARGUMENT, "is not aligned"},
    {"q seqlen 0", q_seq0, 0, FJ_ERR_INVALID_ARGUMENT, "q.shape[1] = 0, must be >= 1"},
    {"k last stride", k_stride_last, 0, FJ_ERR_INVALID_ARGUMENT,
     "k.stride[3] = 2, the last dimension must be contiguous"},
    {"v negative stride", v_stride_neg, 0, FJ_ERR_INVALID_ARGUMENT, "v.stride[1] = -1 is negative"},
    {"k dtype", k_dtype, 0, FJ_ERR_INVALID_ARGUMENT, "k.dtype = f16 differs from q.dtype = bf16"},
    {"out dtype", out_dtype, 0, FJ_ERR_INVALID_ARGUMENT, "out.dtype = f32 differs"},
    {"fp8 out", all_fp8, 0, FJ_ERR_INVALID_ARGUMENT,
     "out.dtype = f8e4m3, expected f16 or bf16 with f8e4m3 inputs"},
    {"fp8 k", fp8_mixed, 0, FJ_ERR_INVALID_ARGUMENT,
     "k.dtype = f8e5m2 differs from q.dtype = f8e4m3"},
    {"descale bf16 q", descale_not_fp8, 0, FJ_ERR_INVALID_ARGUMENT,
     "desc.k_descale: descale factors are for fp8 inputs, and k.dtype = bf16"},
    {"fp8 cache v", fp8_cache_v, 0, FJ_ERR_INVALID_ARGUMENT,
     "v.dtype = bf16 differs from k.dtype = f8e4m3"},
    {"fp8 cache out", fp8_cache_out, 0, FJ_ERR_INVALID_ARGUMENT,
     "out.dtype = f16 differs from q.dtype = bf16"},
    {"fp8 cache q descale", fp8_cache_q_descale, 0, FJ_ERR_INVALID_ARGUMENT,
     "desc.q_descale: descale factors are for fp8 inputs, and q.dtype = bf16"},
    {"descale heads", descale_heads, 0, FJ_ERR_INVALID_ARGUMENT,
     "desc.q_descale.shape[1] (heads_kv) = 4, expected 2"},
    {"descale one", descale_one, 0, FJ_ERR_INVALID_ARGUMENT,
     "desc.q_descale.shape[0] = 3, expected 1 (one factor) or 2 (heads_kv)"},
    {"descale dtype", descale_dtype, 0, FJ_ERR_INVALID_ARGUMENT,
     "desc.q_descale.dtype = bf16, expected f32"},
    {"descale ndim", descale_ndim, 0, FJ_ERR_INVALID_ARGUMENT,
     "desc.q_descale.ndim = 3, expected 1 ([1] or [heads_kv]) or 2 ([batch, heads_kv])"},
    {"fp8 bias", fp8_bias, 0, FJ_ERR_INVALID_ARGUMENT,
     "desc.bias.dtype = f8e4m3, expected f32 (q.dtype = f8e4m3)"},
    {"fp8 paged", fp8_paged, 0, FJ_ERR_UNSUPPORTED,
     "desc.page_table with f8e5m2 q: a paged cache takes 16-bit queries"},
    {"k batch", k_batch, 0, FJ_ERR_INVALID_ARGUMENT, "k.shape[0] (batch) = 3, expected 2"},
    {"k head dim", k_dim, 0, FJ_ERR_INVALID_ARGUMENT,
     "k.shape[3] (head_dim, as q.shape[3]) = 32, expected 64"},
    {"v seqlen", v_seq, 0, FJ_ERR_INVALID_ARGUMENT, "v.shape[1] (seqlen_k, as k.shape[1]) = 31"},
    {"v heads", v_heads, 0, FJ_ERR_INVALID_ARGUMENT, "v.shape[2] (heads_kv, as k.shape[2]) = 1"},
    {"out head dim", out_dim, 0, FJ_ERR_INVALID_ARGUMENT,
     "out.shape[3] (head_dim_v, as v.shape[3]) = 64, expected 48"},
    {"out seqlen", out_seq, 0, FJ_ERR_INVALID_ARGUMENT,
     "out.shape[1] (seqlen_q, as q.shape[1]) = 17"},
    {"out heads", out_heads, 0, FJ_ERR_INVALID_ARGUMENT,
     "out.shape[2] (heads_q, as q.shape[2]) = 3"},
    {"out overlap 0", out_overlap, 0, FJ_ERR_INVALID_ARGUMENT,
     "out.stride[2] = 0 makes elements overlap"},
    {"out overlap", out_overlap2, 0, FJ_ERR_INVALID_ARGUMENT, "makes elements overlap"},
    {"gqa", gqa, 0, FJ_ERR_INVALID_ARGUMENT,
     "q.shape[2] (heads_q) = 3 is not a multiple of k.shape[2] (heads_kv) = 2"},
    {"head dim 600", d600, 0, FJ_ERR_UNSUPPORTED, "q.shape[3] (head_dim) = 600 exceeds 576"},
    {"head dim v 600", dv600, 0, FJ_ERR_UNSUPPORTED, "v.shape[3] (head_dim_v) = 600 exceeds 576"},
    {"lse dtype", lse_dtype, 0, FJ_ERR_INVALID_ARGUMENT, "lse.dtype = bf16, expected f32"},
    {"lse ndim", lse_ndim, 0, FJ_ERR_INVALID_ARGUMENT, "lse.ndim = 4, expected 3"},
    {"lse seqlen", lse_seq, 0, FJ_ERR_INVALID_ARGUMENT,
     "lse.shape[2] (seqlen_q) = 15, expected 16"},
    {"lse overlap", lse_overlap, 0, FJ_ERR_INVALID_ARGUMENT,
     "lse.stride[1] = 0 makes elements overlap"},
    {"lse data", lse_data, 0, FJ_ERR_INVALID_ARGUMENT, "lse.data is NULL"},
    {"desc size", desc_size, 0, FJ_ERR_INVALID_ARGUMENT, "desc.struct_size = 3"},
    {"desc size big", desc_size_big, 0, FJ_ERR_INVALID_ARGUMENT, "desc.struct_size"},
    {"desc size inside a field", desc_size_inside, 0, FJ_ERR_INVALID_ARGUMENT,
     "is not the size of a released fj_attention_desc"},
    {"scale nan", scale_nan, 0, FJ_ERR_INVALID_ARGUMENT,
     "desc.softmax_scale = nan, expected a finite value of magnitude at most 1e+06"},
    {"scale inf", scale_inf, 0, FJ_ERR_INVALID_ARGUMENT, "desc.softmax_scale = inf"},
    {"scale huge", scale_huge, 0, FJ_ERR_INVALID_ARGUMENT, "desc.softmax_scale = 3.4e+38"},
    {"scale huge negative", scale_huge_neg, 0, FJ_ERR_INVALID_ARGUMENT,
     "desc.softmax_scale = -2e+06"},
    {"softcap tiny", softcap_tiny, 0, FJ_ERR_INVALID_ARGUMENT,
     "desc.softcap = 1.4013e-45, expected 0 (off) or a value from 1e-06 to 1e+06"},
    {"softcap huge", softcap_huge, 0, FJ_ERR_INVALID_ARGUMENT, "desc.softcap = 3.4e+38"},
    {"causal 2", causal2, 0, FJ_ERR_INVALID_ARGUMENT, "desc.causal = 2, expected 0 or 1"},
    {"window left", wleft, 0, FJ_ERR_INVALID_ARGUMENT, "desc.window_left = -2"},
    {"window right", wright, 0, FJ_ERR_INVALID_ARGUMENT, "desc.window_right = -5"},
    {"softcap negative", softcap_neg, 0, FJ_ERR_INVALID_ARGUMENT, "desc.softcap = -1"},
    {"softcap nan", softcap_nan, 0, FJ_ERR_INVALID_ARGUMENT, "desc.softcap = nan"},
    {"stride overflow", overflow, 0, FJ_ERR_INVALID_ARGUMENT,
     "q: shape and strides address beyond"},
    {"seqlen huge", seq_huge, 0, FJ_ERR_UNSUPPORTED, "seqlen_q = 2147483648"},
    {"mod_args negative", args_negative, 0, FJ_ERR_INVALID_ARGUMENT,
     "desc.mod_args_count = -1 is negative"},
    {"mod_args NULL", args_null, 0, FJ_ERR_INVALID_ARGUMENT,
     "desc.mod_args is NULL but desc.mod_args_count = 4"},
    {"mod_args aligned", args_misaligned, 0, FJ_ERR_INVALID_ARGUMENT, "is not aligned"},
    {"batch huge", batch_huge, 0, FJ_ERR_UNSUPPORTED, "batch = 70000"},
    {"alibi ndim", alibi_ndim, 0, FJ_ERR_INVALID_ARGUMENT, "desc.alibi_slopes.ndim = 3"},
    {"alibi dtype", alibi_dtype, 0, FJ_ERR_INVALID_ARGUMENT,
     "desc.alibi_slopes.dtype = bf16, expected f32"},
    {"alibi heads", alibi_heads, 0, FJ_ERR_INVALID_ARGUMENT,
     "desc.alibi_slopes.shape[0] (heads_q) = 2, expected 4"},
    {"alibi batch", alibi_batch, 0, FJ_ERR_INVALID_ARGUMENT,
     "desc.alibi_slopes.shape[0] (batch) = 3, expected 2"},
    {"alibi data", alibi_null_data, 0, FJ_ERR_INVALID_ARGUMENT, "desc.alibi_slopes.data is NULL"},
    {"bias heads", bias_heads, 0, FJ_ERR_INVALID_ARGUMENT,
     "desc.bias.shape[1] = 2, expected 1 or 4 (heads_q)"},
    {"bias keys", bias_keys, 0, FJ_ERR_INVALID_ARGUMENT,
     "desc.bias.shape[3] (seqlen_k) = 31, expected 32"},
    {"bias dtype", bias_dtype, 0, FJ_ERR_INVALID_ARGUMENT,
     "desc.bias.dtype = f16, expected f32 or q.dtype = bf16"},
    {"bias ndim", bias_ndim, 0, FJ_ERR_INVALID_ARGUMENT, "desc.bias.ndim = 3, expected 4"},
    {"mask dtype", mask_dtype, 0, FJ_ERR_INVALID_ARGUMENT, "desc.mask.dtype = f32, expected bool"},
    {"mask rows", mask_rows, 0, FJ_ERR_INVALID_ARGUMENT,
     "desc.mask.shape[2] = 15, expected 1 or 16 (seqlen_q)"},
    {"q bool", q_bool, 0, FJ_ERR_INVALID_ARGUMENT, "q.dtype = bool"},
    {"ranges columns", ranges_cols, 0, FJ_ERR_INVALID_ARGUMENT,
     "desc.mask_ranges.shape[3] = 3, expected 2 (one range of rows) or 4"},
    {"ranges keys", ranges_keys, 0, FJ_ERR_INVALID_ARGUMENT,
     "desc.mask_ranges.shape[2] (seqlen_k) = 16, expected 32"},
    {"ranges dtype", ranges_dtype, 0, FJ_ERR_INVALID_ARGUMENT,
     "desc.mask_ranges.dtype = f32, expected i32"},
    {"ranges batch", ranges_batch, 0, FJ_ERR_INVALID_ARGUMENT,
     "desc.mask_ranges.shape[0] = 3, expected 1 or 2 (batch)"},
    {"blocks keys", blocks_keys, 0, FJ_ERR_INVALID_ARGUMENT,
     "desc.block_mask.shape[3] (key blocks of 128) = 2, expected 1"},
    {"blocks dtype", blocks_dtype, 0, FJ_ERR_INVALID_ARGUMENT,
     "desc.block_mask.dtype = bool, expected i32"},
    {"varlen without k", varlen_no_k, 0, FJ_ERR_INVALID_ARGUMENT, "desc.cu_seqlens_k is NULL"},
    {"varlen dtype", varlen_dtype, 0, FJ_ERR_INVALID_ARGUMENT,
     "desc.cu_seqlens_q.dtype = f32, expected i32"},
    {"varlen short", varlen_short, 0, FJ_ERR_INVALID_ARGUMENT,
     "desc.cu_seqlens_q.shape[0] = 1, expected batch + 1 >= 2"},
    {"varlen k count", varlen_k_count, 0, FJ_ERR_INVALID_ARGUMENT,
     "desc.cu_seqlens_k.shape[0] (batch) = 3, expected 4"},
    {"varlen seqused", varlen_used, 0, FJ_ERR_INVALID_ARGUMENT,
     "desc.seqused_k.shape[0] (batch) = 4, expected 3"},
    {"varlen max", varlen_max, 0, FJ_ERR_INVALID_ARGUMENT, "desc.max_seqlen_k = 0"},
    {"varlen dense tensors", varlen_dense, 0, FJ_ERR_INVALID_ARGUMENT, "q.ndim = 4, expected 3"},
    {"varlen v rows", varlen_v_rows, 0, FJ_ERR_INVALID_ARGUMENT,
     "v.shape[0] (total_k, as k.shape[0]) = 69, expected 70"},
    {"varlen lse", varlen_lse, 0, FJ_ERR_INVALID_ARGUMENT,
     "lse.shape[1] (total_q) = 39, expected 40"},
    {"varlen bias rows", varlen_bias, 0, FJ_ERR_INVALID_ARGUMENT,
     "desc.bias.shape[2] = 16, expected 1 or 20 (max_seqlen_q)"},
    {"varlen block classes", varlen_blocks, 0, FJ_ERR_INVALID_ARGUMENT,
     "desc.block_mask.shape[0] = 2, expected 1 or 3 (batch)"},
    {"paged without seqused_k", paged_no_used, 0, FJ_ERR_INVALID_ARGUMENT,
     "desc.seqused_k is NULL: a paged KV cache needs"},
    {"paged table dtype", paged_table_dtype, 0, FJ_ERR_INVALID_ARGUMENT,
     "desc.page_table.dtype = f32, expected i32"},
    {"paged table ndim", paged_table_ndim, 0, FJ_ERR_INVALID_ARGUMENT,
     "desc.page_table.ndim = 1, expected 2"},
    {"paged table batch", paged_table_batch, 0, FJ_ERR_INVALID_ARGUMENT,
     "desc.page_table.shape[0] (batch, as q.shape[0]) = 3, expected 2"},
    {"paged v pages", paged_v_pages, 0, FJ_ERR_INVALID_ARGUMENT,
     "v.shape[0] (num_pages, as k.shape[0]) = 4, expected 5"},
    {"paged v page size", paged_v_page_size, 0, FJ_ERR_INVALID_ARGUMENT,
     "v.shape[1] (page_size, as k.shape[1]) = 16, expected 8"},
    {"paged seqused_k", paged_used_count, 0, FJ_ERR_INVALID_ARGUMENT,
     "desc.seqused_k.shape[0] (batch) = 3, expected 2"},
    {"paged bias", paged_bias, 0, FJ_ERR_INVALID_ARGUMENT,
     "desc.bias.shape[3] (seqlen_k: the page table's keys, max_pages * page_size) = 30, "
     "expected 32"},
    {"paged blocks", paged_blocks, 0, FJ_ERR_UNSUPPORTED, "desc.block_mask with desc.page_table"},
    {"paged packed max", paged_packed_max, 0, FJ_ERR_INVALID_ARGUMENT,
     "desc.max_seqlen_q = 0: must be >= 1 with variable lengths"},
    {"paged packed cu_seqlens_k", paged_packed_cu_k, 0, FJ_ERR_UNSUPPORTED,
     "desc.cu_seqlens_k with desc.page_table (a paged KV cache) is not supported: a sequence's "
     "keys are its pages, desc.seqused_k of them"},
    {"paged packed q ndim", paged_packed_q_ndim, 0, FJ_ERR_INVALID_ARGUMENT,
     "q.ndim = 4, expected 3"},
    {"paged packed batch", paged_packed_batch, 0, FJ_ERR_INVALID_ARGUMENT,
     "desc.page_table.shape[0] (batch, as desc.cu_seqlens_q.shape[0] - 1) = 2, expected 3"},
    {"paged packed out rows", paged_packed_out_rows, 0, FJ_ERR_INVALID_ARGUMENT,
     "out.shape[0] (total_q, as q.shape[0]) = 39, expected 40"},
    {"paged packed v heads", paged_packed_v_heads, 0, FJ_ERR_INVALID_ARGUMENT,
     "v.shape[2] (heads_kv, as k.shape[2]) = 1, expected 2"},
    {"paged packed lse", paged_packed_lse, 0, FJ_ERR_INVALID_ARGUMENT,
     "lse.shape[1] (total_q) = 41, expected 40"},
    {"paged packed bias rows", paged_packed_bias, 0, FJ_ERR_INVALID_ARGUMENT,
     "desc.bias.shape[2] = 16, expected 1 or 30 (max_seqlen_q)"},
    {"num_splits negative", splits_negative, 0, FJ_ERR_INVALID_ARGUMENT,
     "desc.num_splits = -1, expected 0 (automatic) to 64"},
    {"num_splits too many", splits_many, 0, FJ_ERR_INVALID_ARGUMENT, "desc.num_splits = 65"},
};

static void test_every_rejected_field(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof bad_cases / sizeof bad_cases[0]; i++) {
        const bad_case *c = &bad_cases[i];
        request r;
        baseline(&r);
        c->mutate(&r);
        fj__problem p;
        fj__err err = {{0}};
        fj_status st = validate(&r, &p, &err, c->null_tensor);
        if (st != c->status || !strstr(err.msg, c->message))
            fail_msg("case '%s': status %d (%s), message '%s'; expected status %d and '%s'",
                     c->what, st, fj_status_string(st), err.msg, c->status, c->message);
    }
}

/* A paged request resolves to the cache's geometry: the most keys a sequence can have, the
** page strides in k's and v's batch slot, and features that say paged (not varlen). */
static void test_paged_request_is_resolved(void **state)
{
    (void)state;
    request r;
    paged(&r);
    fj__problem p;
    fj__err err = {{0}};
    assert_int_equal(validate(&r, &p, &err, 0), FJ_OK);
    assert_int_equal(p.batch, 2);
    assert_int_equal(p.seqlen_k, 32); /* 4 pages of 8 */
    assert_int_equal(p.num_pages, 5);
    assert_int_equal(p.page_size, 8);
    assert_int_equal(p.strides[FJ__T_K][0], 8 * 2 * 64);
    assert_int_equal(p.strides[FJ__T_V][1], 2 * 48);
    fj__features f;
    fj__features_of(&p, &f);
    assert_int_equal(f.paged, 1);
    assert_int_equal(f.varlen, 0);
}

/* Packed sequences take a bias and a mask as a padded batch of the longest: [batch,
** heads_q, max_seqlen_q, max_seqlen_k]. */
static void test_packed_bias_is_resolved(void **state)
{
    (void)state;
    request r;
    packed(&r);
    dense(&r.bias, FJ_DTYPE_F32, 4, (int64_t[]){3, 4, 20, 30});
    r.desc.bias = &r.bias;
    fj__problem p;
    fj__err err = {{0}};
    if (validate(&r, &p, &err, 0) != FJ_OK)
        fail_msg("%s", err.msg);
    assert_ptr_equal(p.bias, &r.bias);
    assert_int_equal(p.bias_stride[0], 4 * 20 * 30);
    assert_int_equal(p.bias_stride[2], 30);
}

/* A paged request with packed queries: the sequences are cu_seqlens_q's, q's and out's batch
** strides 0, lse [heads_q, total_q], k's and v's strides the pages'; features say both, and
** whether the rows are mostly decode rows (few_rows); a bias of max_seqlen_q rows is taken. */
static void test_paged_packed_request_is_resolved(void **state)
{
    (void)state;
    request r;
    paged_packed(&r);
    fj__problem p;
    fj__err err = {{0}};
    if (validate(&r, &p, &err, 0) != FJ_OK)
        fail_msg("%s", err.msg);
    assert_int_equal(p.batch, 2);
    assert_int_equal(p.seqlen_q, 30);
    assert_int_equal(p.seqlen_k, 32);
    assert_int_equal(p.heads_q, 4);
    assert_int_equal(p.heads_kv, 2);
    assert_int_equal(p.head_dim_v, 48);
    assert_int_equal(p.strides[FJ__T_Q][0], 0);
    assert_int_equal(p.strides[FJ__T_Q][1], 4 * 64);
    assert_int_equal(p.strides[FJ__T_OUT][2], 48);
    assert_int_equal(p.strides[FJ__T_K][0], 8 * 2 * 64);
    assert_int_equal(p.strides[FJ__T_V][1], 2 * 48);
    assert_int_equal(p.lse_stride[0], 0);
    assert_int_equal(p.lse_stride[1], 40);
    assert_int_equal(p.lse_stride[2], 1);
    assert_ptr_equal(p.cu_seqlens_q, &r.cu_q);
    assert_null(p.cu_seqlens_k);
    fj__features f;
    fj__features_of(&p, &f);
    assert_int_equal(f.paged, 1);
    assert_int_equal(f.varlen, 2);
    assert_int_equal(f.few_rows, 0); /* 40 rows, 2 sequences: more than 16 a sequence */
    /* 32 rows: mostly decode rows (at most 16 a sequence on average), whatever the longest */
    dense(&r.q, FJ_DTYPE_BF16, 3, (int64_t[]){32, 4, 64});
    dense(&r.out, FJ_DTYPE_BF16, 3, (int64_t[]){32, 4, 48});
    dense(&r.lse, FJ_DTYPE_F32, 2, (int64_t[]){4, 32});
    if (validate(&r, &p, &err, 0) != FJ_OK)
        fail_msg("%s", err.msg);
    fj__features_of(&p, &f);
    assert_int_equal(f.few_rows, 1);
    /* A bias of max_seqlen_q rows per sequence and the table's keys (the decode kernel's) */
    dense(&r.bias, FJ_DTYPE_F32, 4, (int64_t[]){2, 4, 30, 32});
    r.desc.bias = &r.bias;
    if (validate(&r, &p, &err, 0) != FJ_OK)
        fail_msg("%s", err.msg);
    assert_ptr_equal(p.bias, &r.bias);
    assert_int_equal(p.bias_stride[2], 32);
}

/* The heuristic's forward variant for p on dev, as a call plans it. */
static void choose(const fj__problem *p, const fj_device_info *dev, const char *config,
                   fj__variant *v)
{
    fj__features f;
    fj__features_of(p, &f);
    fj__choose_forward(&f, dev, config, v);
}

/* FP8 inputs with a bf16 out: the descales' strides resolved ([batch, heads_kv], and [1] read
** with strides 0), the features say so; with f16 out and e5m2 too; and a paged FP8 KV cache
** with bf16 queries, its factors also per kv head ([heads_kv]). */
static void test_fp8_request_is_resolved(void **state)
{
    (void)state;
    request r;
    fp8(&r);
    fj_tensor one;
    dense(&one, FJ_DTYPE_F32, 1, (int64_t[]){1});
    r.desc.v_descale = &one;
    fj__problem p;
    fj__err err = {{0}};
    assert_int_equal(validate(&r, &p, &err, 0), FJ_OK);
    assert_int_equal(p.q_dtype, FJ_DTYPE_F8_E4M3);
    assert_int_equal(p.out_dtype, FJ_DTYPE_BF16);
    assert_ptr_equal(p.descale[0], &r.descale);
    assert_int_equal(p.descale_stride[1][0], 2);
    assert_int_equal(p.descale_stride[1][1], 1);
    assert_int_equal(p.descale_stride[2][0], 0);
    assert_int_equal(p.descale_stride[2][1], 0);
    fj__features f;
    fj__features_of(&p, &f);
    assert_true(f.descale);
    r.q.dtype = r.k.dtype = r.v.dtype = FJ_DTYPE_F8_E5M2;
    r.out.dtype = FJ_DTYPE_F16;
    r.desc.q_descale = r.desc.k_descale = r.desc.v_descale = NULL;
    assert_int_equal(validate(&r, &p, &err, 0), FJ_OK);
    fj__features_of(&p, &f);
    assert_false(f.descale);
    /* An FP8 KV cache (paged) read by bf16 queries, with k's and v's factors. */
    paged(&r);
    r.k.dtype = r.v.dtype = FJ_DTYPE_F8_E4M3;
    r.desc.k_descale = r.desc.v_descale = &r.descale;
    if (validate(&r, &p, &err, 0) != FJ_OK)
        fail_msg("%s", err.msg);
    assert_int_equal(p.kv_dtype, FJ_DTYPE_F8_E4M3);
    assert_int_equal(p.out_dtype, FJ_DTYPE_BF16);
    assert_null(p.descale[0]);
    assert_ptr_equal(p.descale[2], &r.descale);
    /* Per kv head only: [heads_kv], read with batch stride 0. */
    fj_tensor heads;
    dense(&heads, FJ_DTYPE_F32, 1, (int64_t[]){2});
    r.desc.k_descale = &heads;
    if (validate(&r, &p, &err, 0) != FJ_OK)
        fail_msg("%s", err.msg);
    assert_int_equal(p.descale_stride[1][0], 0);
    assert_int_equal(p.descale_stride[1][1], 1);
}

static void test_valid_request_is_resolved(void **state)
{
    (void)state;
    request r;
    baseline(&r);
    fj__problem p;
    fj__err err = {{0}};
    assert_int_equal(validate(&r, &p, &err, 0), FJ_OK);
    assert_int_equal(p.batch, 2);
    assert_int_equal(p.seqlen_q, 16);
    assert_int_equal(p.seqlen_k, 32);
    assert_int_equal(p.heads_q, 4);
    assert_int_equal(p.heads_kv, 2);
    assert_int_equal(p.head_dim, 64);
    assert_int_equal(p.head_dim_v, 48);
    assert_float_equal(p.scale, 0.125f, 1e-7f);
    assert_int_equal(p.window_left, -1);
    assert_int_equal(p.window_right, -1);

    /* causal is the window (-1, 0); a left bound past the first key is dropped. */
    r.desc.causal = 1;
    r.desc.window_left = 1000;
    assert_int_equal(validate(&r, &p, &err, 0), FJ_OK);
    assert_int_equal(p.window_right, 0);
    assert_int_equal(p.window_left, -1);
    r.desc.window_left = 5;
    assert_int_equal(validate(&r, &p, &err, 0), FJ_OK);
    assert_int_equal(p.window_left, 5);

    /* NULL desc means the defaults; NULL lse is allowed; an explicit scale is kept. */
    assert_int_equal(fj__validate_forward(NULL, &r.q, &r.k, &r.v, &r.out, NULL, &p, &err), FJ_OK);
    assert_int_equal(p.window_right, -1);
    assert_null(p.lse);
    r.desc.softmax_scale = -0.5f;
    assert_int_equal(validate(&r, &p, &err, 0), FJ_OK);
    assert_float_equal(p.scale, -0.5f, 0);

    /* Score terms: broadcast dimensions resolve to stride 0. */
    r.desc.alibi_slopes = &r.alibi;
    r.desc.bias = &r.bias;
    r.desc.mask = &r.mask;
    assert_int_equal(validate(&r, &p, &err, 0), FJ_OK);
    assert_ptr_equal(p.alibi, &r.alibi);
    assert_int_equal(p.alibi_stride_b, 0);
    assert_int_equal(p.bias_stride[0], 4 * 16 * 32);
    assert_int_equal(p.bias_stride[2], 32);
    assert_int_equal(p.mask_stride[0], 32);
    assert_int_equal(p.mask_stride[1], 0);
    assert_int_equal(p.mask_stride[2], 0);
    r.desc.mask_ranges = &r.ranges;
    assert_int_equal(validate(&r, &p, &err, 0), FJ_OK);
    assert_int_equal(p.ranges_stride[0], 0);
    assert_int_equal(p.ranges_stride[1], 32 * 2);
    assert_int_equal(p.ranges_stride[2], 2);
    r.desc.mask_ranges = NULL;

    /* Packed sequences: three of them, the maxima as lengths, strides through the offsets. */
    packed(&r);
    assert_int_equal(validate(&r, &p, &err, 0), FJ_OK);
    assert_int_equal(p.batch, 3);
    assert_int_equal(p.seqlen_q, 20);
    assert_int_equal(p.seqlen_k, 30);
    assert_int_equal(p.heads_q, 4);
    assert_int_equal(p.head_dim_v, 48);
    assert_int_equal(p.strides[0][0], 0);
    assert_int_equal(p.strides[0][1], 4 * 64);
    assert_int_equal(p.strides[0][2], 64);
    assert_int_equal(p.lse_stride[1], 40);
    assert_int_equal(p.lse_stride[2], 1);
    fj_device_info hopper = {.backend = FJ_BACKEND_CUDA, .local_memory = 232448};
    snprintf(hopper.arch, sizeof hopper.arch, "sm_90a");
    fj__variant var;
    choose(&p, &hopper, NULL, &var);
    assert_int_equal(var.path, FJ__PATH_WGMMA); /* packed sequences on the Hopper kernel */
    assert_int_equal(var.varlen, 1);
    assert_true(var.persistent != 1); /* sequences differ in cost: not strided */
    p.mask_mod = "k <= q";            /* element masks take dense shapes there */
    choose(&p, &hopper, NULL, &var);
    assert_int_equal(var.path, FJ__PATH_SIMT);
    p.mask_mod = NULL;
    fj_device_info ampere = hopper;
    snprintf(ampere.arch, sizeof ampere.arch, "sm_80");
    choose(&p, &ampere, NULL, &var); /* the mma.sync kernel takes dense shapes */
    assert_int_equal(var.path, FJ__PATH_SIMT);
    baseline(&r);

    /* Permuted ([b, h, s, d]) strides are fine for every tensor, out included. */
    baseline(&r);
    r.out.stride[0] = 16 * 4 * 48;
    r.out.stride[2] = 16 * 48;
    r.out.stride[1] = 48;
    assert_int_equal(validate(&r, &p, &err, 0), FJ_OK);
}

static void test_plan_pads_and_fits_local_memory(void **state)
{
    (void)state;
    request r;
    baseline(&r);
    r.q.shape[3] = r.k.shape[3] = 200;
    r.v.shape[3] = r.out.shape[3] = 40;
    fj__problem p;
    fj__err err = {{0}};
    assert_int_equal(validate(&r, &p, &err, 0), FJ_OK);
    fj_device_info dev = {.backend = FJ_BACKEND_OPENCL, .local_memory = 32768};
    fj__variant v;
    choose(&p, &dev, NULL, &v);
    assert_int_equal(v.head_dim_pad, 208);
    assert_int_equal(v.head_dim_v_pad, 48);
    assert_true((size_t)v.tile_n * (208 + 48) * 4 <= 32768);
    assert_true(v.write_lse);
    assert_false(v.local_mask);
}

/* FLASHJIT_CONFIG overrides: every field, its range, and the errors. */
static void test_config_overrides(void **state)
{
    (void)state;
    fj__variant v;
    memset(&v, 0, sizeof v);
    v.family = FJ__FAMILY_FWD;
    v.path = FJ__PATH_WGMMA;
    fj__err err = {{0}};
    assert_int_equal(fj__apply_config(&v,
                                      "path=wgmma,tile_m=192,tile_n=112,warps=16,stages=3,"
                                      "overlap=1,pingpong=0,persistent=2,kk_unroll=1,q_in_regs=0,"
                                      "q_stages=2,ctas_per_sm=2,exp_poly=3,lazy_rescale=1,"
                                      "d_split=1",
                                      &err),
                     0);
    assert_int_equal(v.d_split, 1);
    assert_int_equal(v.q_stages, 2);
    assert_int_equal(v.lazy_rescale, 1);
    assert_int_equal(v.exp_poly, 3);
    assert_int_equal(v.ctas_per_sm, 2);
    assert_int_equal(v.tile_m, 192);
    assert_int_equal(v.tile_n, 112);
    assert_int_equal(v.warps, 16);
    assert_int_equal(v.threads, 512);
    assert_int_equal(v.stages, 3);
    assert_int_equal(v.overlap, 1);
    assert_int_equal(v.persistent, 2);
    assert_int_equal(v.kk_unroll, 1);
    static const struct {
        const char *config, *message;
    } bad[] = {{"tile_n=300", "tile_n = 300, expected 8..256"},
               {"stages=0", "stages = 0, expected 1..8"},
               {"persistent=4", "persistent = 4, expected 0..3"},
               {"overlap=2", "overlap = 2, expected 0..1"},
               {"q_stages=3", "q_stages = 3, expected 1..2"},
               {"ctas_per_sm=5", "ctas_per_sm = 5, expected 0..4"},
               {"exp_poly=9", "exp_poly = 9, expected 0..8"},
               {"d_split=2", "d_split = 2, expected 0..1"},
               {"bogus=1", "unknown field 'bogus'"},
               {"path=fast", "path must be simt, mma, wgmma, decode or vec"},
               {"tile_n", "cannot read 'tile_n'"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err.msg[0] = '\0';
        assert_int_equal(fj__apply_config(&v, bad[i].config, &err), -1);
        if (!strstr(err.msg, bad[i].message))
            fail_msg("config '%s': message '%s' lacks '%s'", bad[i].config, err.msg,
                     bad[i].message);
    }
}

/* Which kernel design serves a request on a Hopper device, and when it falls back. */
static void test_plan_paths_on_hopper(void **state)
{
    (void)state;
    request r;
    baseline(&r);
    fj__problem p;
    fj__err err = {{0}};
    fj_device_info hopper = {
        .backend = FJ_BACKEND_CUDA, .compute_units = 132, .local_memory = 232448};
    snprintf(hopper.arch, sizeof hopper.arch, "sm_90a");
    fj__variant v;
    assert_int_equal(validate(&r, &p, &err, 0), FJ_OK);
    choose(&p, &hopper, NULL, &v);
    assert_int_equal(v.path, FJ__PATH_WGMMA);
    assert_int_equal(v.head_dim_pad, 64);
    assert_true(fj__variant_fits(&v, &hopper));
    assert_int_equal(v.persistent, 1);    /* no band: tiles strided over the grid */
    assert_int_equal(v.exp_poly, 2);      /* d 64, 128-row tiles: some exponentials off MUFU */
    assert_true(v.overlap && v.pingpong); /* two warpgroups taking turns */
    assert_int_equal(v.lazy_rescale, 0);  /* O rescaled for every key tile */
    /* d 128 from 4k keys without a band: 160-key tiles in two ring slots. */
    request big;
    baseline(&big);
    dense(&big.q, FJ_DTYPE_BF16, 4, (int64_t[]){1, 4096, 16, 128});
    dense(&big.k, FJ_DTYPE_BF16, 4, (int64_t[]){1, 4096, 16, 128});
    dense(&big.v, FJ_DTYPE_BF16, 4, (int64_t[]){1, 4096, 16, 128});
    dense(&big.out, FJ_DTYPE_BF16, 4, (int64_t[]){1, 4096, 16, 128});
    big.use_lse = 0;
    fj__problem bp;
    assert_int_equal(validate(&big, &bp, &err, 0), FJ_OK);
    choose(&bp, &hopper, NULL, &v);
    assert_int_equal(v.tile_n, 160);
    assert_int_equal(v.stages, 2);
    assert_int_equal(v.q_stages, 1);
    assert_true(fj__variant_fits(&v, &hopper));
    choose(&p, &hopper, "path=mma", &v);
    assert_int_equal(v.path, FJ__PATH_MMA);
    /* A configuration that does not fit is ignored. */
    choose(&p, &hopper, "tile_n=256,stages=4", &v);
    assert_int_equal(v.path, FJ__PATH_WGMMA);
    assert_true(fj__variant_fits(&v, &hopper));
    assert_int_equal(v.ctas_per_sm, 1);
    /* Two blocks per SM: one consumer warpgroup each, and half the SM's shared memory. */
    choose(&p, &hopper, "tile_m=64,warps=8,ctas_per_sm=2,pingpong=0", &v);
    assert_int_equal(v.ctas_per_sm, 2);
    assert_int_equal(v.tile_m, 64);
    assert_true(2 * (fj__variant_shared_bytes(&v) + 1024) <= hopper.local_memory + 1024);
    choose(&p, &hopper, "ctas_per_sm=2", &v); /* 128 rows: two consumers, refused */
    assert_int_equal(v.ctas_per_sm, 1);
    choose(&p, &hopper, "tile_m=64,warps=8,ctas_per_sm=2,pingpong=0,tile_n=256,stages=4", &v);
    assert_int_equal(v.ctas_per_sm, 1); /* too much shared memory for two: refused */
    /* Causal: tiles dealt zigzag, so that heavy and light ones pair up. */
    r.desc.causal = 1;
    assert_int_equal(validate(&r, &p, &err, 0), FJ_OK);
    choose(&p, &hopper, NULL, &v);
    assert_int_equal(v.persistent, 3);
    assert_int_equal(v.exp_poly, 0);
    /* Score terms run on the Hopper kernel; element masks too, with tiles that divide the
    ** 128 x 128 blocks they are classified by; before Hopper, on the SIMT kernel. */
    r.desc.alibi_slopes = &r.alibi;
    assert_int_equal(validate(&r, &p, &err, 0), FJ_OK);
    choose(&p, &hopper, NULL, &v);
    assert_int_equal(v.path, FJ__PATH_WGMMA);
    assert_true(v.alibi);
    r.desc.mask_mod = "k <= q";
    r.q.shape[3] = r.k.shape[3] = r.v.shape[3] = r.out.shape[3] = 256;
    for (int i = 0; i < 3; i++)
        r.q.stride[i] = r.k.stride[i] = r.v.stride[i] = r.out.stride[i] = r.q.stride[i] * 8;
    assert_int_equal(validate(&r, &p, &err, 0), FJ_OK);
    p.mask_mod = "(FJ_K <= FJ_Q)"; /* as the context's parser gives it */
    choose(&p, &hopper, NULL, &v);
    assert_int_equal(v.path, FJ__PATH_WGMMA);
    assert_int_equal(128 % v.tile_n, 0);
    assert_int_equal(128 % v.tile_m, 0);
    assert_int_equal(v.lazy_rescale,
                     1); /* d 256: O rescaled only when a maximum outgrows its base */
    choose(&p, &hopper, "tile_n=80", &v); /* does not divide: ignored */
    assert_int_equal(128 % v.tile_n, 0);
    choose(&p, &hopper, "path=mma", &v);
    assert_int_equal(v.path, FJ__PATH_SIMT);
    baseline(&r);
    r.q.dtype = r.k.dtype = r.v.dtype = r.out.dtype = FJ_DTYPE_F32;
    assert_int_equal(validate(&r, &p, &err, 0), FJ_OK);
    choose(&p, &hopper, NULL, &v);
    assert_int_equal(v.path, FJ__PATH_SIMT);
    /* Before Hopper: the mma.sync kernel. */
    baseline(&r);
    snprintf(hopper.arch, sizeof hopper.arch, "sm_80");
    assert_int_equal(validate(&r, &p, &err, 0), FJ_OK);
    choose(&p, &hopper, NULL, &v);
    assert_int_equal(v.path, FJ__PATH_MMA);
}

/* The grid of zigzag-dealt (causal) work: an odd number of rounds leaves the full grid's
** busiest blocks a heavy tile more than the mean; a slightly smaller grid evens the deal. */
static void test_zigzag_grid(void **state)
{
    (void)state;
    fj__features p = {.seqlen_q = 2048,
                      .seqlen_k = 2048,
                      .heads_q = 32,
                      .batch = 8,
                      .window_left = -1,
                      .window_right = 0};
    fj__variant v = {.path = FJ__PATH_WGMMA, .tile_m = 192, .tile_n = 128, .local_mask = 1};
    /* 11 query blocks of 192 rows x 256 heads = 2816 tiles: 21.3 rounds of 132. */
    uint32_t g = fj__zigzag_grid(&p, &v, 132);
    assert_true(g >= 132 - 132 / 8 && g < 132);
    /* With a mask tensor the batches run fastest (8 tiles of one query block in a row). */
    v.mask_tensor = 1;
    g = fj__zigzag_grid(&p, &v, 132);
    assert_true(g >= 132 - 132 / 8 && g <= 132);
    v.mask_tensor = 0;
    /* Without a band (and with whole query blocks) every tile costs the same: no smaller grid
    ** ends sooner. */
    p.window_right = -1;
    v.local_mask = 0;
    v.tile_m = 128;
    assert_int_equal(fj__zigzag_grid(&p, &v, 132), 132);
    /* Fewer tiles than blocks: one block each. */
    p.batch = p.heads_q = 1;
    assert_int_equal(fj__zigzag_grid(&p, &v, 132), 16);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_plan_paths_on_hopper),
        cmocka_unit_test(test_zigzag_grid),
        cmocka_unit_test(test_config_overrides),
        cmocka_unit_test(test_every_rejected_field),
        cmocka_unit_test(test_paged_request_is_resolved),
        cmocka_unit_test(test_packed_bias_is_resolved),
        cmocka_unit_test(test_paged_packed_request_is_resolved),
        cmocka_unit_test(test_valid_request_is_resolved),
        cmocka_unit_test(test_fp8_request_is_resolved),
        cmocka_unit_test(test_plan_pads_and_fits_local_memory),
    };
    return cmocka_run_group_tests_name("validate", tests, NULL, NULL);
}
