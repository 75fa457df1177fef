/* Validation of requests (forward, merge). Every rejection names the field and its value, so a
** caller can fix the call from the message alone. Nothing past this point checks arguments
** again. */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "context.h"

/* Sizes the kernels index with 32-bit integers; beyond these a request is unsupported. */
#define FJ__MAX_SEQLEN (1LL << 30)
#define FJ__MAX_GRID_DIM 65535

/* Scores are computed in float, in log2 units: q.k * softmax_scale * log2(e), or with soft-capping
** tanh(q.k * softmax_scale / softcap) * softcap * log2(e). These bounds keep those factors, and the
** scores of any inputs of moderate size, finite (flashjit.h documents them). */
#define FJ__MAX_SCALE 1e6
#define FJ__MIN_SOFTCAP 1e-6
#define FJ__MAX_SOFTCAP 1e6

/* The size of the first published fj_attention_desc: the smallest struct_size accepted. */
#define FJ__DESC_V1_SIZE (offsetof(fj_attention_desc, softcap) + sizeof(float))

static fj_status check_tensor(const fj_tensor *t, const char *name, int32_t ndim, fj__err *err)
{
    if (!t)
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT, "%s is NULL", name);
    if (t->ndim != ndim)
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT, "%s.ndim = %d, expected %d", name,
                        (int)t->ndim, (int)ndim);
    size_t esize = fj_dtype_size(t->dtype);
    if (esize == 0)
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT, "%s.dtype = %d is not an fj_dtype", name,
                        (int)t->dtype);
    if (!t->data)
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT, "%s.data is NULL", name);
    if ((uintptr_t)t->data % esize != 0)
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT,
                        "%s.data = %p is not aligned to its %zu-byte elements", name, t->data,
                        esize);
    int64_t last_offset = 0;
    for (int i = 0; i < ndim; i++) {
        if (t->shape[i] < 1)
            return fj__fail(err, FJ_ERR_INVALID_ARGUMENT, "%s.shape[%d] = %lld, must be >= 1", name,
                            i, (long long)t->shape[i]);
        if (t->stride[i] < 0)
            return fj__fail(err, FJ_ERR_INVALID_ARGUMENT, "%s.stride[%d] = %lld is negative", name,
                            i, (long long)t->stride[i]);
        int64_t span;
        if (__builtin_mul_overflow(t->shape[i] - 1, t->stride[i], &span) ||
            __builtin_add_overflow(last_offset, span, &last_offset) || last_offset > INT64_MAX / 8)
            return fj__fail(err, FJ_ERR_INVALID_ARGUMENT,
                            "%s: shape and strides address beyond 2^60 elements", name);
    }
    if (t->stride[ndim - 1] != 1)
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT,
                        "%s.stride[%d] = %lld, the last dimension must be contiguous (stride 1)",
                        name, ndim - 1, (long long)t->stride[ndim - 1]);
    return FJ_OK;
}

/* An output must not write two elements to one address: sorted by stride, each dimension's
** stride must step over everything the smaller dimensions span. */
static fj_status check_no_overlap(const fj_tensor *t, const char *name, fj__err *err)
{
    int order[4] = {0, 1, 2, 3};
    int n = t->ndim;
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && t->stride[order[j]] < t->stride[order[j - 1]]; j--) {
            int tmp = order[j];
            order[j] = order[j - 1];
            order[j - 1] = tmp;
        }
    int64_t span = 1; /* elements spanned by the dimensions checked so far */
    for (int i = 0; i < n; i++) {
        int d = order[i];
        if (t->shape[d] == 1)
            continue;
        if (t->stride[d] < span)
            return fj__fail(err, FJ_ERR_INVALID_ARGUMENT,
                            "%s.stride[%d] = %lld makes elements overlap (an output needs a "
                            "distinct address for every element)",
                            name, d, (long long)t->stride[d]);
        span = t->stride[d] * t->shape[d];
    }
    return FJ_OK;
}

static fj_status check_dim(fj__err *err, const char *name, int axis, int64_t got, int64_t want,
                           const char *what)
{
    if (got != want)
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT, "%s.shape[%d] (%s) = %lld, expected %lld",
                        name, axis, what, (long long)got, (long long)want);
    return FJ_OK;
}

#define TRY(call)                                                                                  \
    do {                                                                                           \
        fj_status st_ = (call);                                                                    \
        if (st_ != FJ_OK)                                                                          \
            return st_;                                                                            \
    } while (0)

static fj_status check_desc(const fj_attention_desc *in, fj_attention_desc *d, fj__err *err)
{
    fj_attention_desc_init(d);
    if (!in)
        return FJ_OK;
        /* The sizes of released layouts: every field end from the first version's on. */
#define END(f) FJ__FIELD_END(fj_attention_desc, f)
    static const size_t ends[] = {
        END(softcap),        END(mask_mod),      END(score_mod),  END(mod_args),
        END(mod_args_count), END(alibi_slopes),  END(bias),       END(mask),
        END(cu_seqlens_q),   END(cu_seqlens_k),  END(seqused_k),  END(max_seqlen_q),
        END(max_seqlen_k),   END(mask_ranges),   END(block_mask), END(num_splits),
        END(page_table),     END(deterministic), END(dbias),      END(v_descale)};
#undef END
    if (in->struct_size < FJ__DESC_V1_SIZE || in->struct_size > sizeof *d ||
        !fj__size_on_field_end(in->struct_size, ends, (int)(sizeof ends / sizeof ends[0]),
                               sizeof *d))
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT,
                        "desc.struct_size = %zu is not the size of a released fj_attention_desc "
                        "(%zu to %zu, ending on a field; call fj_attention_desc_init)",
                        in->struct_size, (size_t)FJ__DESC_V1_SIZE, sizeof *d);
    memcpy(d, in, in->struct_size);
    if (!(fabsf(d->softmax_scale) <= FJ__MAX_SCALE))
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT,
                        "desc.softmax_scale = %g, expected a finite value of magnitude at most %g "
                        "(0: 1/sqrt(head_dim))",
                        (double)d->softmax_scale, FJ__MAX_SCALE);
    if (d->causal != 0 && d->causal != 1)
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT, "desc.causal = %d, expected 0 or 1",
                        (int)d->causal);
    if (d->deterministic != 0 && d->deterministic != 1)
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT, "desc.deterministic = %d, expected 0 or 1",
                        (int)d->deterministic);
    if (d->num_splits < 0 || d->num_splits > FJ__DECODE_MAX_SPLITS)
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT,
                        "desc.num_splits = %d, expected 0 (automatic) to %d", (int)d->num_splits,
                        FJ__DECODE_MAX_SPLITS);
    if (d->window_left < -1)
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT,
                        "desc.window_left = %d, expected -1 (unbounded) or >= 0",
                        (int)d->window_left);
    if (d->window_right < -1)
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT,
                        "desc.window_right = %d, expected -1 (unbounded) or >= 0",
                        (int)d->window_right);
    if (d->mod_args_count < 0)
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT, "desc.mod_args_count = %lld is negative",
                        (long long)d->mod_args_count);
    if (d->mod_args_count > 0 && !d->mod_args)
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT,
                        "desc.mod_args is NULL but desc.mod_args_count = %lld",
                        (long long)d->mod_args_count);
    if ((uintptr_t)d->mod_args % 4 != 0)
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT,
                        "desc.mod_args = %p is not aligned to its 4-byte elements", d->mod_args);
    if (d->mod_args_count > INT32_MAX)
        return fj__fail(err, FJ_ERR_UNSUPPORTED, "desc.mod_args_count = %lld exceeds 2^31 - 1",
                        (long long)d->mod_args_count);
    if (d->softcap != 0.0f && !(d->softcap >= FJ__MIN_SOFTCAP && d->softcap <= FJ__MAX_SOFTCAP))
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT,
                        "desc.softcap = %g, expected 0 (off) or a value from %g to %g",
                        (double)d->softcap, FJ__MIN_SOFTCAP, FJ__MAX_SOFTCAP);
    return FJ_OK;
}

/* What a mask's or a bias's key dimension is called: with a paged cache, the table's keys. */
static const char *keys_name(const fj__problem *p)
{
    return p->page_table ? "seqlen_k: the page table's keys, max_pages * page_size" : "seqlen_k";
}

/* The first n dimensions of a rank-4 tensor of the given dtype that broadcast over batch,
** heads_q and seqlen_q (in that order): each of size 1 or the full size; their strides go to
** stride, 0 where broadcast. */
static fj_status check_broadcast(const fj_tensor *t, const char *name, fj_dtype dtype, int n,
                                 const fj__problem *p, int64_t *stride, fj__err *err)
{
    TRY(check_tensor(t, name, 4, err));
    if (dtype != FJ_DTYPE_F32 && t->dtype != dtype) /* f32: the caller checks the dtype */
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT, "%s.dtype = %s, expected %s", name,
                        fj__dtype_name(t->dtype), fj__dtype_name(dtype));
    const int64_t full[3] = {p->batch, p->heads_q, p->seqlen_q};
    const char *what[3] = {"batch", "heads_q", p->cu_seqlens_q ? "max_seqlen_q" : "seqlen_q"};
    for (int i = 0; i < n; i++) {
        if (t->shape[i] != 1 && t->shape[i] != full[i])
            return fj__fail(err, FJ_ERR_INVALID_ARGUMENT,
                            "%s.shape[%d] = %lld, expected 1 or %lld (%s)", name, i,
                            (long long)t->shape[i], (long long)full[i], what[i]);
        stride[i] = t->shape[i] == 1 ? 0 : t->stride[i];
    }
    return FJ_OK;
}

/* A [batch | 1, heads_q | 1, seqlen_q | 1, seqlen_k] tensor (bias, mask): its strides with the
** broadcast dimensions at 0. */
static fj_status check_pair_tensor(const fj_tensor *t, const char *name, fj_dtype dtype,
                                   const fj__problem *p, int64_t stride[3], fj__err *err)
{
    TRY(check_broadcast(t, name, dtype, 3, p, stride, err));
    return check_dim(err, name, 3, t->shape[3], p->seqlen_k, keys_name(p));
}

/* alibi_slopes, bias and mask of desc d, for a problem whose sizes are known. */
static fj_status check_score_terms(const fj_attention_desc *d, fj__problem *p, fj__err *err)
{
    if (d->alibi_slopes) {
        const fj_tensor *a = d->alibi_slopes;
        if (a->ndim != 1 && a->ndim != 2)
            return fj__fail(err, FJ_ERR_INVALID_ARGUMENT,
                            "desc.alibi_slopes.ndim = %d, expected 1 ([heads_q]) or 2 ([batch, "
                            "heads_q])",
                            (int)a->ndim);
        TRY(check_tensor(a, "desc.alibi_slopes", a->ndim, err));
        if (a->dtype != FJ_DTYPE_F32)
            return fj__fail(err, FJ_ERR_INVALID_ARGUMENT,
                            "desc.alibi_slopes.dtype = %s, expected f32", fj__dtype_name(a->dtype));
        if (a->ndim == 2)
            TRY(check_dim(err, "desc.alibi_slopes", 0, a->shape[0], p->batch, "batch"));
        TRY(check_dim(err, "desc.alibi_slopes", a->ndim - 1, a->shape[a->ndim - 1], p->heads_q,
                      "heads_q"));
        p->alibi = a;
        p->alibi_stride_b = a->ndim == 2 && a->shape[0] > 1 ? a->stride[0] : 0;
    }
    if (d->bias) {
        TRY(check_pair_tensor(d->bias, "desc.bias", FJ_DTYPE_F32, p, p->bias_stride, err));
        if (d->bias->dtype != FJ_DTYPE_F32 &&
            (d->bias->dtype != p->q_dtype || fj__dtype_fp8(p->q_dtype)))
            return fj__fail(err, FJ_ERR_INVALID_ARGUMENT,
                            fj__dtype_fp8(p->q_dtype)
                                ? "desc.bias.dtype = %s, expected f32 (q.dtype = %s)"
                                : "desc.bias.dtype = %s, expected f32 or q.dtype = %s",
                            fj__dtype_name(d->bias->dtype), fj__dtype_name(p->q_dtype));
        p->bias = d->bias;
    }
    if (d->mask_ranges) {
        const fj_tensor *r = d->mask_ranges;
        TRY(check_broadcast(r, "desc.mask_ranges", FJ_DTYPE_I32, 2, p, p->ranges_stride, err));
        TRY(check_dim(err, "desc.mask_ranges", 2, r->shape[2], p->seqlen_k, keys_name(p)));
        if (r->shape[3] != 2 && r->shape[3] != 4)
            return fj__fail(err, FJ_ERR_INVALID_ARGUMENT,
                            "desc.mask_ranges.shape[3] = %lld, expected 2 (one range of rows) or "
                            "4 (two)",
                            (long long)r->shape[3]);
        p->ranges_stride[2] = r->stride[2];
        p->mask_ranges = r;
    }
    if (d->block_mask) {
        const fj_tensor *m = d->block_mask;
        TRY(check_broadcast(m, "desc.block_mask", FJ_DTYPE_I32, 2, p, p->blocks_stride, err));
        TRY(check_dim(err, "desc.block_mask", 2, m->shape[2], (p->seqlen_q + 127) / 128,
                      "query blocks of 128"));
        TRY(check_dim(err, "desc.block_mask", 3, m->shape[3], (p->seqlen_k + 127) / 128,
                      "key blocks of 128"));
        p->blocks_stride[2] = m->stride[2];
        p->block_mask = m;
    }
    if (d->mask) {
        TRY(check_pair_tensor(d->mask, "desc.mask", FJ_DTYPE_BOOL, p, p->mask_stride, err));
        p->mask = d->mask;
    }
    return FJ_OK;
}

/* The dtypes of q, k, v and out: one floating type; or q, k and v one FP8 type and out f16 or
** bf16; or an FP8 KV cache read by 16-bit queries (k and v one FP8 type, out as q). */
static fj_status check_dtypes(const fj_tensor *q, const fj_tensor *k, const fj_tensor *v,
                              const fj_tensor *out, fj__err *err)
{
    if (q->dtype == FJ_DTYPE_BOOL || q->dtype == FJ_DTYPE_I32)
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT,
                        "q.dtype = %s, expected f16, bf16, f32, f8e4m3 or f8e5m2",
                        fj__dtype_name(q->dtype));
    if (fj__dtype_fp8(k->dtype) && (q->dtype == FJ_DTYPE_F16 || q->dtype == FJ_DTYPE_BF16)) {
        if (v->dtype != k->dtype)
            return fj__fail(err, FJ_ERR_INVALID_ARGUMENT, "v.dtype = %s differs from k.dtype = %s",
                            fj__dtype_name(v->dtype), fj__dtype_name(k->dtype));
        if (out->dtype != q->dtype)
            return fj__fail(err, FJ_ERR_INVALID_ARGUMENT,
                            "out.dtype = %s differs from q.dtype = %s", fj__dtype_name(out->dtype),
                            fj__dtype_name(q->dtype));
        return FJ_OK;
    }
    const int fp8 = fj__dtype_fp8(q->dtype);
    const fj_tensor *same[] = {k, v, out};
    const char *names[] = {"k", "v", "out"};
    for (int i = 0; i < (fp8 ? 2 : 3); i++)
        if (same[i]->dtype != q->dtype)
            return fj__fail(err, FJ_ERR_INVALID_ARGUMENT, "%s.dtype = %s differs from q.dtype = %s",
                            names[i], fj__dtype_name(same[i]->dtype), fj__dtype_name(q->dtype));
    if (fp8 && out->dtype != FJ_DTYPE_F16 && out->dtype != FJ_DTYPE_BF16)
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT,
                        "out.dtype = %s, expected f16 or bf16 with %s inputs",
                        fj__dtype_name(out->dtype), fj__dtype_name(q->dtype));
    return FJ_OK;
}

/* A tensor of FP8 descale factors (named name): f32, [1], [heads_kv] or [batch, heads_kv]; its
** batch and kv head strides (0 where it has no such dimension) go to stride. */
static fj_status check_descale(const fj_tensor *t, const char *name, int64_t batch,
                               int64_t heads_kv, int64_t stride[2], fj__err *err)
{
    if (t->ndim != 1 && t->ndim != 2)
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT,
                        "%s.ndim = %d, expected 1 ([1] or [heads_kv]) or 2 ([batch, heads_kv])",
                        name, (int)t->ndim);
    TRY(check_tensor(t, name, t->ndim, err));
    if (t->dtype != FJ_DTYPE_F32)
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT, "%s.dtype = %s, expected f32", name,
                        fj__dtype_name(t->dtype));
    stride[0] = stride[1] = 0;
    if (t->ndim == 1) {
        if (t->shape[0] != 1 && t->shape[0] != heads_kv)
            return fj__fail(err, FJ_ERR_INVALID_ARGUMENT,
                            "%s.shape[0] = %lld, expected 1 (one factor) or %lld (heads_kv)", name,
                            (long long)t->shape[0], (long long)heads_kv);
        stride[1] = t->shape[0] == 1 ? 0 : t->stride[0];
        return FJ_OK;
    }
    TRY(check_dim(err, name, 0, t->shape[0], batch, "batch"));
    TRY(check_dim(err, name, 1, t->shape[1], heads_kv, "heads_kv"));
    stride[0] = t->stride[0];
    stride[1] = t->stride[1];
    return FJ_OK;
}

/* desc's descale factors (each for an FP8 input only: q's for q, k's and v's for the KV); their
** strides go to p. */
static fj_status check_descales(const fj_attention_desc *d, fj__problem *p, fj__err *err)
{
    const fj_tensor *ts[3] = {d->q_descale, d->k_descale, d->v_descale};
    static const char *const names[3] = {"desc.q_descale", "desc.k_descale", "desc.v_descale"};
    for (int i = 0; i < 3; i++) {
        const fj_tensor *t = ts[i];
        if (!t)
            continue;
        const fj_dtype scaled = i == 0 ? p->q_dtype : p->kv_dtype;
        if (!fj__dtype_fp8(scaled))
            return fj__fail(err, FJ_ERR_INVALID_ARGUMENT,
                            "%s: descale factors are for fp8 inputs, and %s.dtype = %s", names[i],
                            i == 0 ? "q" : "k", fj__dtype_name(scaled));
        TRY(check_descale(t, names[i], p->batch, p->heads_kv, p->descale_stride[i], err));
        p->descale[i] = t;
    }
    return FJ_OK;
}

/* lse: f32 with the given dimensions (what names each); stride is set to its strides. */
static fj_status check_lse(const fj_tensor *lse, int ndim, const int64_t *want,
                           const char *const *what, int64_t *stride, fj__err *err)
{
    TRY(check_tensor(lse, "lse", ndim, err));
    if (lse->dtype != FJ_DTYPE_F32)
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT, "lse.dtype = %s, expected f32",
                        fj__dtype_name(lse->dtype));
    for (int i = 0; i < ndim; i++)
        TRY(check_dim(err, "lse", i, lse->shape[i], want[i], what[i]));
    TRY(check_no_overlap(lse, "lse", err));
    memcpy(stride, lse->stride, (size_t)ndim * sizeof *stride);
    return FJ_OK;
}

/* Dense [batch, seqlen, heads, dim] tensors and lse [batch, heads_q, seqlen_q]. */
static fj_status check_dense(const fj_tensor *q, const fj_tensor *k, const fj_tensor *v,
                             const fj_tensor *out, const fj_tensor *lse, fj__problem *p,
                             fj__err *err)
{
    TRY(check_tensor(q, "q", 4, err));
    TRY(check_tensor(k, "k", 4, err));
    TRY(check_tensor(v, "v", 4, err));
    TRY(check_tensor(out, "out", 4, err));
    TRY(check_dtypes(q, k, v, out, err));

    p->batch = q->shape[0];
    p->seqlen_q = q->shape[1];
    p->heads_q = q->shape[2];
    p->head_dim = q->shape[3];
    p->seqlen_k = k->shape[1];
    p->heads_kv = k->shape[2];
    p->head_dim_v = v->shape[3];

    TRY(check_dim(err, "k", 0, k->shape[0], p->batch, "batch"));
    TRY(check_dim(err, "k", 3, k->shape[3], p->head_dim, "head_dim, as q.shape[3]"));
    TRY(check_dim(err, "v", 0, v->shape[0], p->batch, "batch"));
    TRY(check_dim(err, "v", 1, v->shape[1], p->seqlen_k, "seqlen_k, as k.shape[1]"));
    TRY(check_dim(err, "v", 2, v->shape[2], p->heads_kv, "heads_kv, as k.shape[2]"));
    TRY(check_dim(err, "out", 0, out->shape[0], p->batch, "batch"));
    TRY(check_dim(err, "out", 1, out->shape[1], p->seqlen_q, "seqlen_q, as q.shape[1]"));
    TRY(check_dim(err, "out", 2, out->shape[2], p->heads_q, "heads_q, as q.shape[2]"));
    TRY(check_dim(err, "out", 3, out->shape[3], p->head_dim_v, "head_dim_v, as v.shape[3]"));
    TRY(check_no_overlap(out, "out", err));
    const fj_tensor *t4[4] = {q, k, v, out};
    for (int i = 0; i < 4; i++)
        memcpy(p->strides[i], t4[i]->stride, sizeof p->strides[i]);

    if (lse) {
        static const char *const what[3] = {"batch", "heads_q", "seqlen_q"};
        const int64_t want[3] = {p->batch, p->heads_q, p->seqlen_q};
        TRY(check_lse(lse, 3, want, what, p->lse_stride, err));
    }
    return FJ_OK;
}

/* An I32 vector of n elements in device memory (cu_seqlens_*, seqused_k); n 0: any >= 2. */
static fj_status check_i32_vector(const fj_tensor *t, const char *name, int64_t n, fj__err *err)
{
    TRY(check_tensor(t, name, 1, err));
    if (t->dtype != FJ_DTYPE_I32)
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT, "%s.dtype = %s, expected i32", name,
                        fj__dtype_name(t->dtype));
    if (n == 0 && t->shape[0] < 2)
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT, "%s.shape[0] = %lld, expected batch + 1 >= 2",
                        name, (long long)t->shape[0]);
    if (n > 0)
        TRY(check_dim(err, name, 0, t->shape[0], n, "batch"));
    return FJ_OK;
}

/* Packed queries of variable lengths: cu_seqlens_q [batch + 1] and max_seqlen_q; q and out
** [total_q, heads, dim] against k's and v's last two dimensions (kv heads, head dims; q, k, v
** and out checked as tensors by the caller), lse [heads_q, total_q]. A bias, a mask, ranges and
** block classes index the sequences as a padded batch ([batch, heads, max_seqlen_q,
** max_seqlen_k or the table's keys]: sequence b's query i and key j at (b, i, j); a paged
** cache refuses block classes, check_paged). */
static fj_status check_packed_queries(const fj_attention_desc *d, const fj_tensor *q,
                                      const fj_tensor *k, const fj_tensor *v,
                                      const fj_tensor *out, const fj_tensor *lse, fj__problem *p,
                                      fj__err *err)
{
    TRY(check_i32_vector(d->cu_seqlens_q, "desc.cu_seqlens_q", 0, err));
    p->batch = d->cu_seqlens_q->shape[0] - 1;
    if (d->max_seqlen_q < 1)
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT,
                        "desc.max_seqlen_q = %lld: must be >= 1 with variable lengths",
                        (long long)d->max_seqlen_q);
    TRY(check_dtypes(q, k, v, out, err));
    const int h = k->ndim - 2; /* k's and v's kv-head axis */
    const int64_t total_q = q->shape[0];
    p->heads_q = q->shape[1];
    p->head_dim = q->shape[2];
    p->heads_kv = k->shape[h];
    p->head_dim_v = v->shape[h + 1];
    p->seqlen_q = d->max_seqlen_q;
    TRY(check_dim(err, "k", h + 1, k->shape[h + 1], p->head_dim, "head_dim, as q.shape[2]"));
    TRY(check_dim(err, "v", h, v->shape[h], p->heads_kv,
                  h == 1 ? "heads_kv, as k.shape[1]" : "heads_kv, as k.shape[2]"));
    TRY(check_dim(err, "out", 0, out->shape[0], total_q, "total_q, as q.shape[0]"));
    TRY(check_dim(err, "out", 1, out->shape[1], p->heads_q, "heads_q, as q.shape[1]"));
    TRY(check_dim(err, "out", 2, out->shape[2], p->head_dim_v,
                  h == 1 ? "head_dim_v, as v.shape[2]" : "head_dim_v, as v.shape[3]"));
    TRY(check_no_overlap(out, "out", err));
    if (total_q > INT32_MAX)
        return fj__fail(err, FJ_ERR_UNSUPPORTED, "total_q = %lld: at most 2^31 - 1",
                        (long long)total_q);
    const fj_tensor *qo[2] = {q, out};
    const int roles[2] = {FJ__T_Q, FJ__T_OUT};
    for (int i = 0; i < 2; i++) {
        p->strides[roles[i]][0] = 0; /* sequences are found through the offsets */
        p->strides[roles[i]][1] = qo[i]->stride[0];
        p->strides[roles[i]][2] = qo[i]->stride[1];
    }
    if (lse) {
        /* [heads_q, total_q]: no batch stride, rows through the offsets. */
        static const char *const what[2] = {"heads_q", "total_q"};
        const int64_t want[2] = {p->heads_q, total_q};
        TRY(check_lse(lse, 2, want, what, p->lse_stride + 1, err));
        p->lse_stride[0] = 0;
    }
    p->cu_seqlens_q = d->cu_seqlens_q;
    return FJ_OK;
}

/* A paged KV cache: k, v pages [num_pages, page_size, heads_kv, dim]; the page table
** [batch, max_pages] and seqused_k [batch]; q, out and lse dense, or with cu_seqlens_q packed
** as check_packed_queries' (a batch of sequences with different numbers of queries, each
** against its own keys). */
static fj_status check_paged(const fj_attention_desc *d, const fj_tensor *q, const fj_tensor *k,
                             const fj_tensor *v, const fj_tensor *out, const fj_tensor *lse,
                             fj__problem *p, fj__err *err)
{
    /* (Masks and score terms but block classes are the decode kernel's: a bias's, a mask's and
    ** the ranges' key dimension is then the table's keys, max_pages * page_size) */
    if (d->cu_seqlens_k)
        return fj__fail(err, FJ_ERR_UNSUPPORTED,
                        "desc.cu_seqlens_k with desc.page_table (a paged KV cache) is not "
                        "supported: a sequence's keys are its pages, desc.seqused_k of them");
    if (d->block_mask)
        return fj__fail(err, FJ_ERR_UNSUPPORTED,
                        "desc.block_mask with desc.page_table (a paged KV cache) is not supported");
    TRY(check_tensor(d->page_table, "desc.page_table", 2, err));
    if (d->page_table->dtype != FJ_DTYPE_I32)
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT, "desc.page_table.dtype = %s, expected i32",
                        fj__dtype_name(d->page_table->dtype));
    if (!d->seqused_k)
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT,
                        "desc.seqused_k is NULL: a paged KV cache needs each sequence's length");
    TRY(check_tensor(k, "k", 4, err));
    TRY(check_tensor(v, "v", 4, err));
    TRY(check_dim(err, "v", 0, v->shape[0], k->shape[0], "num_pages, as k.shape[0]"));
    TRY(check_dim(err, "v", 1, v->shape[1], k->shape[1], "page_size, as k.shape[1]"));
    const char *batch_is;
    if (d->cu_seqlens_q) {
        TRY(check_tensor(q, "q", 3, err));
        TRY(check_tensor(out, "out", 3, err));
        TRY(check_packed_queries(d, q, k, v, out, lse, p, err));
        const fj_tensor *kv[2] = {k, v};
        for (int i = 0; i < 2; i++) /* the page's, the row's in the page, the head's */
            memcpy(p->strides[FJ__T_K + i], kv[i]->stride, sizeof p->strides[0]);
        batch_is = "batch, as desc.cu_seqlens_q.shape[0] - 1";
    } else {
        /* k and v as one batch of pages: their shapes check as dense [num_pages, page_size,
        ** ...]. */
        fj_tensor q1 = *q, out1 = *out;
        q1.shape[0] = out1.shape[0] = k->shape[0];
        TRY(check_dense(&q1, k, v, &out1, NULL, p, err));
        p->batch = q->shape[0];
        TRY(check_dim(err, "out", 0, out->shape[0], p->batch, "batch, as q.shape[0]"));
        TRY(check_tensor(q, "q", 4, err));
        TRY(check_tensor(out, "out", 4, err));
        TRY(check_no_overlap(out, "out", err));
        if (lse) {
            static const char *const what[3] = {"batch", "heads_q", "seqlen_q"};
            const int64_t want[3] = {p->batch, p->heads_q, p->seqlen_q};
            TRY(check_lse(lse, 3, want, what, p->lse_stride, err));
        }
        batch_is = "batch, as q.shape[0]";
    }
    TRY(check_dim(err, "desc.page_table", 0, d->page_table->shape[0], p->batch, batch_is));
    TRY(check_i32_vector(d->seqused_k, "desc.seqused_k", p->batch, err));
    p->num_pages = k->shape[0];
    p->page_size = k->shape[1];
    p->page_table = d->page_table;
    p->seqused_k = d->seqused_k;
    const int64_t pages = d->page_table->shape[1];
    if (p->num_pages > INT32_MAX || pages > INT32_MAX / p->page_size)
        return fj__fail(err, FJ_ERR_UNSUPPORTED,
                        "%lld pages of %lld keys, %lld pages per sequence: at most 2^31 - 1 keys "
                        "per sequence and pages",
                        (long long)p->num_pages, (long long)p->page_size, (long long)pages);
    p->seqlen_k = pages * p->page_size; /* the most keys a sequence can have */
    return FJ_OK;
}

/* Packed [total, heads, dim] tensors with sequence offsets, lse [heads_q, total_q]. */
static fj_status check_packed(const fj_attention_desc *d, const fj_tensor *q, const fj_tensor *k,
                              const fj_tensor *v, const fj_tensor *out, const fj_tensor *lse,
                              fj__problem *p, fj__err *err)
{
    if (!d->cu_seqlens_q || !d->cu_seqlens_k)
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT,
                        "desc.%s is NULL: variable lengths need both cu_seqlens_q and "
                        "cu_seqlens_k",
                        d->cu_seqlens_q ? "cu_seqlens_k" : "cu_seqlens_q");
    TRY(check_tensor(q, "q", 3, err));
    TRY(check_tensor(k, "k", 3, err));
    TRY(check_tensor(v, "v", 3, err));
    TRY(check_tensor(out, "out", 3, err));
    TRY(check_packed_queries(d, q, k, v, out, lse, p, err));
    TRY(check_i32_vector(d->cu_seqlens_k, "desc.cu_seqlens_k", d->cu_seqlens_q->shape[0], err));
    if (d->seqused_k)
        TRY(check_i32_vector(d->seqused_k, "desc.seqused_k", p->batch, err));
    if (d->max_seqlen_k < 1)
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT,
                        "desc.max_seqlen_k = %lld: must be >= 1 with variable lengths",
                        (long long)d->max_seqlen_k);
    const int64_t total_k = k->shape[0];
    p->seqlen_k = d->max_seqlen_k;
    TRY(check_dim(err, "v", 0, v->shape[0], total_k, "total_k, as k.shape[0]"));
    if (total_k > INT32_MAX)
        return fj__fail(err, FJ_ERR_UNSUPPORTED, "total_k = %lld: at most 2^31 - 1",
                        (long long)total_k);
    const fj_tensor *kv[2] = {k, v};
    for (int i = 0; i < 2; i++) {
        p->strides[FJ__T_K + i][0] = 0; /* sequences are found through the offsets */
        p->strides[FJ__T_K + i][1] = kv[i]->stride[0];
        p->strides[FJ__T_K + i][2] = kv[i]->stride[1];
    }
    p->cu_seqlens_k = d->cu_seqlens_k;
    p->seqused_k = d->seqused_k;
    return FJ_OK;
}

fj_status fj__validate_forward(const fj_attention_desc *desc, const fj_tensor *q,
                               const fj_tensor *k, const fj_tensor *v, const fj_tensor *out,
                               const fj_tensor *lse, fj__problem *p, fj__err *err)
{
    memset(p, 0, sizeof *p);
    fj_attention_desc d;
    TRY(check_desc(desc, &d, err));
    if (d.page_table)
        TRY(check_paged(&d, q, k, v, out, lse, p, err));
    else if (d.cu_seqlens_q || d.cu_seqlens_k || d.seqused_k)
        TRY(check_packed(&d, q, k, v, out, lse, p, err));
    else
        TRY(check_dense(q, k, v, out, lse, p, err));
    p->q_dtype = q->dtype;
    p->kv_dtype = k->dtype;
    p->out_dtype = out->dtype;
    if (d.page_table && fj__dtype_fp8(p->q_dtype))
        return fj__fail(err, FJ_ERR_UNSUPPORTED,
                        "desc.page_table with %s q: a paged cache takes 16-bit queries (an fp8 "
                        "cache with f16 or bf16 q)",
                        fj__dtype_name(p->q_dtype));

    /* Field names by layout: dense [b, s, h, d] or packed [total, h, d]. */
    const int h_axis = p->cu_seqlens_q ? 1 : 2, d_axis = h_axis + 1;
    if (p->heads_q % p->heads_kv != 0)
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT,
                        "q.shape[%d] (heads_q) = %lld is not a multiple of k.shape[%d] (heads_kv) "
                        "= %lld",
                        h_axis, (long long)p->heads_q, h_axis, (long long)p->heads_kv);
    if (p->head_dim > FJ__MAX_HEAD_DIM)
        return fj__fail(err, FJ_ERR_UNSUPPORTED, "q.shape[%d] (head_dim) = %lld exceeds %d", d_axis,
                        (long long)p->head_dim, FJ__MAX_HEAD_DIM);
    if (p->head_dim_v > FJ__MAX_HEAD_DIM)
        return fj__fail(err, FJ_ERR_UNSUPPORTED, "v.shape[%d] (head_dim_v) = %lld exceeds %d",
                        d_axis, (long long)p->head_dim_v, FJ__MAX_HEAD_DIM);
    if (p->seqlen_q > FJ__MAX_SEQLEN || p->seqlen_k > FJ__MAX_SEQLEN)
        return fj__fail(err, FJ_ERR_UNSUPPORTED, "seqlen_q = %lld, seqlen_k = %lld: at most %lld",
                        (long long)p->seqlen_q, (long long)p->seqlen_k, FJ__MAX_SEQLEN);
    if (p->batch > FJ__MAX_GRID_DIM || p->heads_q > FJ__MAX_GRID_DIM)
        return fj__fail(err, FJ_ERR_UNSUPPORTED, "batch = %lld, heads_q = %lld: at most %d each",
                        (long long)p->batch, (long long)p->heads_q, FJ__MAX_GRID_DIM);

    TRY(check_score_terms(&d, p, err));
    TRY(check_descales(&d, p, err));

    p->q = q;
    p->k = k;
    p->v = v;
    p->out = out;
    p->lse = lse;
    p->scale = d.softmax_scale != 0.0f ? d.softmax_scale : (float)(1.0 / sqrt((double)p->head_dim));
    p->softcap = d.softcap;
    p->mask_mod_src = d.mask_mod;
    p->score_mod_src = d.score_mod;
    p->mod_args = d.mod_args;
    p->mod_args_count = d.mod_args_count;
    p->num_splits = d.num_splits;
    p->deterministic = d.deterministic;
    /* Resolve the band of visible keys. A bound that no row can reach is dropped, so equivalent
    ** requests share one kernel without per-element masking. */
    p->window_left = d.window_left;
    p->window_right = d.causal ? 0 : d.window_right;
    if (p->window_left >= p->seqlen_k - 1)
        p->window_left = -1;
    if (p->window_right >= p->seqlen_q - 1)
        p->window_right = -1;
    return FJ_OK;
}

fj_status fj__validate_block_mask(const fj_attention_desc *desc, const fj_tensor *q,
                                  const fj_tensor *k, const fj_tensor *classes, fj__problem *p,
                                  fj__err *err)
{
    fj_attention_desc d;
    TRY(check_desc(desc, &d, err));
    if (d.page_table)
        return fj__fail(err, FJ_ERR_UNSUPPORTED,
                        "desc.page_table: block classes are not taken with a paged KV cache");
    if (d.block_mask)
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT,
                        "desc.block_mask is set: the classes this call writes become the "
                        "block_mask of later calls");
    if (!d.mask_mod && !d.mask && !d.mask_ranges)
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT,
                        "desc has no element mask to classify (mask_mod, mask, mask_ranges)");
    if (!classes)
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT, "classes is NULL");
    /* As a forward of q and k (v and out shaped by them) whose block_mask the classes are. */
    d.struct_size = sizeof d;
    d.block_mask = classes;
    fj_status st = fj__validate_forward(&d, q, k, k, q, NULL, p, err);
    if (st != FJ_OK && !strncmp(err->msg, "desc.block_mask", 15)) {
        char msg[sizeof err->msg];
        snprintf(msg, sizeof msg, "classes%s", err->msg + 15);
        memcpy(err->msg, msg, sizeof msg);
    }
    if (st == FJ_OK)
        st = check_no_overlap(classes, "classes", err);
    return st;
}

/* The bytes from t's first element to its last. check_tensor bounded the offsets. */
static size_t tensor_extent(const fj_tensor *t)
{
    int64_t last = 0;
    for (int i = 0; i < t->ndim; i++)
        last += (t->shape[i] - 1) * t->stride[i];
    return (size_t)(last + 1) * fj_dtype_size(t->dtype);
}

/* t lies in memory the backend's kernels may use (ops->check_memory is set). */
static fj_status device_memory(const struct fj_backend_ops *ops, void *backend, const fj_tensor *t,
                               const char *name, fj__err *err)
{
    if (ops->check_memory(backend, t->data, tensor_extent(t)) == FJ_OK)
        return FJ_OK;
    return fj__fail(err, FJ_ERR_INVALID_ARGUMENT,
                    "%s.data = %p (%zu bytes) is not device memory of this context: on the %s "
                    "backend tensors must lie in fj_malloc() memory",
                    name, t->data, tensor_extent(t), ops->name);
}

fj_status fj__validate_memory(const fj__problem *p, const struct fj_backend_ops *ops, void *backend,
                              fj__err *err)
{
    if (!ops->check_memory)
        return FJ_OK;
    const struct {
        const char *name;
        const fj_tensor *t;
    } tensors[] = {
        {"q", p->q},
        {"k", p->k},
        {"v", p->v},
        {"out", p->out},
        {"lse", p->lse},
        {"desc.alibi_slopes", p->alibi},
        {"desc.bias", p->bias},
        {"desc.mask", p->mask},
        {"desc.cu_seqlens_q", p->cu_seqlens_q},
        {"desc.cu_seqlens_k", p->cu_seqlens_k},
        {"desc.seqused_k", p->seqused_k},
        {"desc.mask_ranges", p->mask_ranges},
        {"desc.block_mask", p->block_mask},
        {"desc.page_table", p->page_table},
        {"desc.q_descale", p->descale[0]},
        {"desc.k_descale", p->descale[1]},
        {"desc.v_descale", p->descale[2]},
    };
    if (p->mod_args_count > 0 &&
        ops->check_memory(backend, p->mod_args, (size_t)p->mod_args_count * 4) != FJ_OK)
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT,
                        "desc.mod_args = %p (%lld elements) is not device memory of this context: "
                        "on the %s backend it must lie in fj_malloc() memory",
                        p->mod_args, (long long)p->mod_args_count, ops->name);
    for (size_t i = 0; i < sizeof tensors / sizeof tensors[0]; i++)
        if (tensors[i].t)
            TRY(device_memory(ops, backend, tensors[i].t, tensors[i].name, err));
    return FJ_OK;
}

fj_status fj__validate_merge_memory(const fj__merge_problem *p, const struct fj_backend_ops *ops,
                                    void *backend, fj__err *err)
{
    if (!ops->check_memory)
        return FJ_OK;
    char name[32];
    for (int i = 0; i < p->n; i++) {
        snprintf(name, sizeof name, "outs[%d]", i);
        TRY(device_memory(ops, backend, &p->outs[i], name, err));
        snprintf(name, sizeof name, "lses[%d]", i);
        TRY(device_memory(ops, backend, &p->lses[i], name, err));
    }
    TRY(device_memory(ops, backend, p->out, "out", err));
    return p->lse ? device_memory(ops, backend, p->lse, "lse", err) : FJ_OK;
}

/* ---- merges ------------------------------------------------------------------------------- */

static int is_state_dtype(fj_dtype d)
{
    return d == FJ_DTYPE_F16 || d == FJ_DTYPE_BF16 || d == FJ_DTYPE_F32;
}

/* t has shape want[0..ndim-1]; else names the first dimension that differs. */
static fj_status check_shape(const fj_tensor *t, const char *name, const int64_t *want,
                             const char *as, fj__err *err)
{
    for (int i = 0; i < t->ndim; i++)
        if (t->shape[i] != want[i])
            return fj__fail(err, FJ_ERR_INVALID_ARGUMENT, "%s.shape[%d] = %lld, expected %lld (%s)",
                            name, i, (long long)t->shape[i], (long long)want[i], as);
    return FJ_OK;
}

/* The bytes [first, last] a tensor's elements span. */
static void byte_span(const fj_tensor *t, uintptr_t *first, uintptr_t *last)
{
    *first = (uintptr_t)t->data;
    *last = *first + tensor_extent(t) - 1;
}

static int same_view(const fj_tensor *a, const fj_tensor *b)
{
    return a->data == b->data && a->dtype == b->dtype && a->ndim == b->ndim &&
           !memcmp(a->shape, b->shape, sizeof a->shape) &&
           !memcmp(a->stride, b->stride, sizeof a->stride);
}

/* A result tensor may be an input exactly (in place) or lie apart from it. */
static fj_status check_apart(const fj_tensor *result, const char *rname, const fj_tensor *input,
                             const char *iname, int may_be_it, fj__err *err)
{
    if (may_be_it && same_view(result, input))
        return FJ_OK;
    uintptr_t r0, r1, i0, i1;
    byte_span(result, &r0, &r1);
    byte_span(input, &i0, &i1);
    if (r0 <= i1 && i0 <= r1)
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT,
                        may_be_it ? "%s overlaps %s without being it (in place needs the same "
                                    "memory, dtype and strides)"
                                  : "%s overlaps %s",
                        rname, iname);
    return FJ_OK;
}

fj_status fj__validate_merge(const fj_tensor *outs, const fj_tensor *lses, int32_t n,
                             const fj_tensor *out, const fj_tensor *lse, fj__merge_problem *p,
                             fj__err *err)
{
    memset(p, 0, sizeof *p);
    if (n < 1 || n > FJ__MERGE_MAX_STATES)
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT, "n = %d, expected 1 to %d", (int)n,
                        FJ__MERGE_MAX_STATES);
    if (!outs)
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT, "outs is NULL");
    if (!lses)
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT, "lses is NULL");
    const int rank = outs[0].ndim == 3 ? 3 : 4; /* packed [total, h, dv] or [b, s, h, dv] */
    const int64_t *s0 = outs[0].shape;
    char name[32], as[32];
    for (int i = 0; i < n; i++) {
        snprintf(name, sizeof name, "outs[%d]", i);
        TRY(check_tensor(&outs[i], name, rank, err));
        if (!is_state_dtype(outs[i].dtype))
            return fj__fail(err, FJ_ERR_INVALID_ARGUMENT,
                            "%s.dtype = %s, expected f16, bf16 or f32", name,
                            fj__dtype_name(outs[i].dtype));
        if (outs[i].dtype != outs[0].dtype)
            return fj__fail(err, FJ_ERR_INVALID_ARGUMENT,
                            "%s.dtype = %s, expected %s (as outs[0]: the states share one dtype)",
                            name, fj__dtype_name(outs[i].dtype), fj__dtype_name(outs[0].dtype));
        TRY(check_shape(&outs[i], name, s0, "as outs[0]", err));
    }
    /* lse: [b, h, s] for [b, s, h, dv]; [h, total] for [total, h, dv]. */
    const int64_t lse_shape[3] = {rank == 4 ? s0[0] : s0[1], rank == 4 ? s0[2] : s0[0],
                                  rank == 4 ? s0[1] : 0};
    for (int i = 0; i < n; i++) {
        snprintf(name, sizeof name, "lses[%d]", i);
        snprintf(as, sizeof as, "the lse of outs[%d]", i);
        TRY(check_tensor(&lses[i], name, rank - 1, err));
        if (lses[i].dtype != FJ_DTYPE_F32)
            return fj__fail(err, FJ_ERR_INVALID_ARGUMENT, "%s.dtype = %s, expected f32", name,
                            fj__dtype_name(lses[i].dtype));
        TRY(check_shape(&lses[i], name, lse_shape, as, err));
    }
    TRY(check_tensor(out, "out", rank, err));
    if (!is_state_dtype(out->dtype))
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT, "out.dtype = %s, expected f16, bf16 or f32",
                        fj__dtype_name(out->dtype));
    TRY(check_shape(out, "out", s0, "as outs[0]", err));
    TRY(check_no_overlap(out, "out", err));
    if (lse) {
        TRY(check_tensor(lse, "lse", rank - 1, err));
        if (lse->dtype != FJ_DTYPE_F32)
            return fj__fail(err, FJ_ERR_INVALID_ARGUMENT, "lse.dtype = %s, expected f32",
                            fj__dtype_name(lse->dtype));
        TRY(check_shape(lse, "lse", lse_shape, "the lse of out", err));
        TRY(check_no_overlap(lse, "lse", err));
        TRY(check_apart(lse, "lse", out, "out", 0, err));
    }
    for (int i = 0; i < n; i++) {
        snprintf(name, sizeof name, "outs[%d]", i);
        snprintf(as, sizeof as, "lses[%d]", i);
        TRY(check_apart(out, "out", &outs[i], name, 1, err));
        TRY(check_apart(out, "out", &lses[i], as, 0, err));
        if (lse) {
            TRY(check_apart(lse, "lse", &lses[i], as, 1, err));
            TRY(check_apart(lse, "lse", &outs[i], name, 0, err));
        }
    }
    p->batch = rank == 4 ? s0[0] : 1;
    p->seqlen = rank == 4 ? s0[1] : s0[0];
    p->heads = rank == 4 ? s0[2] : s0[1];
    p->head_dim_v = s0[rank - 1];
    if (p->seqlen > INT32_MAX || p->heads > INT32_MAX || p->head_dim_v > INT32_MAX)
        return fj__fail(err, FJ_ERR_UNSUPPORTED,
                        "rows %lld, heads %lld, head_dim_v %lld: at most 2^31 - 1 each",
                        (long long)p->seqlen, (long long)p->heads, (long long)p->head_dim_v);
    p->n = n;
    p->outs = outs;
    p->lses = lses;
    p->out = out;
    p->lse = lse;
    p->in_dtype = outs[0].dtype;
    p->out_dtype = out->dtype;
    return FJ_OK;
}

/* ---- appends to a paged KV cache ---------------------------------------------------------- */

/* The dtypes of an append: k_new's and v_new's one, the caches' one; the new tokens are copied
** as bits into a cache of their dtype, else (f16, bf16, f32 only) rounded into it, divided by
** descale factors where the cache is FP8. */
static fj_status check_append_dtypes(const fj_tensor *k_new, const fj_tensor *v_new,
                                     const fj_tensor *k_cache, const fj_tensor *v_cache,
                                     fj__err *err)
{
    if (!is_state_dtype(k_cache->dtype) && !fj__dtype_fp8(k_cache->dtype))
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT,
                        "k_cache.dtype = %s, expected f16, bf16, f32, f8e4m3 or f8e5m2",
                        fj__dtype_name(k_cache->dtype));
    if (v_cache->dtype != k_cache->dtype)
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT,
                        "v_cache.dtype = %s differs from k_cache.dtype = %s",
                        fj__dtype_name(v_cache->dtype), fj__dtype_name(k_cache->dtype));
    if (v_new->dtype != k_new->dtype)
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT,
                        "v_new.dtype = %s differs from k_new.dtype = %s",
                        fj__dtype_name(v_new->dtype), fj__dtype_name(k_new->dtype));
    if (k_new->dtype != k_cache->dtype && !is_state_dtype(k_new->dtype))
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT,
                        "k_new.dtype = %s differs from k_cache.dtype = %s: new tokens are of "
                        "the caches' dtype, or f16, bf16 or f32 to round into it",
                        fj__dtype_name(k_new->dtype), fj__dtype_name(k_cache->dtype));
    return FJ_OK;
}

/* The descale factors of a quantising append (NULL: 1): for f16, bf16 or f32 tokens into an
** FP8 cache only, apart from the caches the kernel writes. */
static fj_status check_append_descales(const fj_tensor *k_descale, const fj_tensor *v_descale,
                                       const fj_tensor *k_cache, const fj_tensor *v_cache,
                                       fj__append_problem *p, fj__err *err)
{
    const fj_tensor *ts[2] = {k_descale, v_descale};
    static const char *const names[2] = {"k_descale", "v_descale"};
    for (int i = 0; i < 2; i++) {
        if (!ts[i])
            continue;
        if (!fj__dtype_fp8(p->dtype) || p->new_dtype == p->dtype)
            return fj__fail(err, FJ_ERR_INVALID_ARGUMENT,
                            "%s: descale factors quantise f16, bf16 or f32 tokens into an fp8 "
                            "cache, and k_new.dtype = %s, k_cache.dtype = %s",
                            names[i], fj__dtype_name(p->new_dtype), fj__dtype_name(p->dtype));
        TRY(check_descale(ts[i], names[i], p->batch, p->heads_kv, p->descale_stride[i], err));
        TRY(check_apart(k_cache, "k_cache", ts[i], names[i], 0, err));
        TRY(check_apart(v_cache, "v_cache", ts[i], names[i], 0, err));
        p->descale[i] = ts[i];
    }
    return FJ_OK;
}

fj_status fj__validate_append(const fj_tensor *k_new, const fj_tensor *v_new,
                              const fj_tensor *cu_seqlens_new, const fj_tensor *k_descale,
                              const fj_tensor *v_descale, const fj_tensor *k_cache,
                              const fj_tensor *v_cache, const fj_tensor *page_table,
                              const fj_tensor *seqused_k, fj__append_problem *p, fj__err *err)
{
    memset(p, 0, sizeof *p);
    /* Dense [batch, tokens, heads_kv, dim] or packed [tokens, heads_kv, dim]: the names of the
    ** dimensions by layout. */
    const int packed = cu_seqlens_new != NULL, a = packed ? 0 : 1; /* a: the tokens' axis */
    static const char *const tokens_as[2] = {"tokens, as k_new.shape[1]",
                                             "tokens, as k_new.shape[0]"};
    static const char *const heads_as[2] = {"heads_kv, as k_new.shape[2]",
                                            "heads_kv, as k_new.shape[1]"};
    static const char *const dim_as[2] = {"head_dim, as k_new.shape[3]",
                                          "head_dim, as k_new.shape[2]"};
    static const char *const dim_v_as[2] = {"head_dim_v, as v_new.shape[3]",
                                            "head_dim_v, as v_new.shape[2]"};
    TRY(check_tensor(k_new, "k_new", 4 - packed, err));
    TRY(check_tensor(v_new, "v_new", 4 - packed, err));
    TRY(check_tensor(k_cache, "k_cache", 4, err));
    TRY(check_tensor(v_cache, "v_cache", 4, err));
    TRY(check_append_dtypes(k_new, v_new, k_cache, v_cache, err));
    if (packed) {
        TRY(check_i32_vector(cu_seqlens_new, "cu_seqlens_new", 0, err));
        p->batch = cu_seqlens_new->shape[0] - 1;
    } else {
        p->batch = k_new->shape[0];
        TRY(check_dim(err, "v_new", 0, v_new->shape[0], p->batch, "batch, as k_new.shape[0]"));
    }
    p->tokens = k_new->shape[a];
    p->heads_kv = k_new->shape[a + 1];
    p->head_dim = k_new->shape[a + 2];
    p->head_dim_v = v_new->shape[a + 2];
    p->num_pages = k_cache->shape[0];
    p->page_size = k_cache->shape[1];
    p->dtype = k_cache->dtype;
    p->new_dtype = k_new->dtype;
    TRY(check_dim(err, "v_new", a, v_new->shape[a], p->tokens, tokens_as[packed]));
    TRY(check_dim(err, "v_new", a + 1, v_new->shape[a + 1], p->heads_kv, heads_as[packed]));
    TRY(check_dim(err, "k_cache", 2, k_cache->shape[2], p->heads_kv, heads_as[packed]));
    TRY(check_dim(err, "k_cache", 3, k_cache->shape[3], p->head_dim, dim_as[packed]));
    TRY(check_dim(err, "v_cache", 0, v_cache->shape[0], p->num_pages,
                  "num_pages, as k_cache.shape[0]"));
    TRY(check_dim(err, "v_cache", 1, v_cache->shape[1], p->page_size,
                  "page_size, as k_cache.shape[1]"));
    TRY(check_dim(err, "v_cache", 2, v_cache->shape[2], p->heads_kv, heads_as[packed]));
    TRY(check_dim(err, "v_cache", 3, v_cache->shape[3], p->head_dim_v, dim_v_as[packed]));
    TRY(check_no_overlap(k_cache, "k_cache", err));
    TRY(check_no_overlap(v_cache, "v_cache", err));
    TRY(check_apart(v_cache, "v_cache", k_cache, "k_cache", 0, err));
    const fj_tensor *inputs[2] = {k_new, v_new};
    const char *names[2] = {"k_new", "v_new"};
    for (int i = 0; i < 2; i++) {
        TRY(check_apart(k_cache, "k_cache", inputs[i], names[i], 0, err));
        TRY(check_apart(v_cache, "v_cache", inputs[i], names[i], 0, err));
    }
    TRY(check_tensor(page_table, "page_table", 2, err));
    if (page_table->dtype != FJ_DTYPE_I32)
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT, "page_table.dtype = %s, expected i32",
                        fj__dtype_name(page_table->dtype));
    TRY(check_dim(err, "page_table", 0, page_table->shape[0], p->batch,
                  packed ? "batch, as cu_seqlens_new.shape[0] - 1" : "batch, as k_new.shape[0]"));
    TRY(check_i32_vector(seqused_k, "seqused_k", p->batch, err));
    p->max_pages = page_table->shape[1];
    TRY(check_append_descales(k_descale, v_descale, k_cache, v_cache, p, err));
    if (p->num_pages > INT32_MAX || p->max_pages > INT32_MAX / p->page_size)
        return fj__fail(err, FJ_ERR_UNSUPPORTED,
                        "%lld pages of %lld rows, %lld per sequence: at most 2^31 - 1 rows",
                        (long long)p->num_pages, (long long)p->page_size,
                        (long long)p->max_pages);
    for (int i = 0; i < 2; i++) {
        const fj_tensor *t = i ? v_new : k_new;
        p->new_strides[i][0] = packed ? 0 : t->stride[0];
        p->new_strides[i][1] = t->stride[a];
        p->new_strides[i][2] = t->stride[a + 1];
    }
    p->k_new = k_new;
    p->v_new = v_new;
    p->cu_seqlens_new = cu_seqlens_new;
    p->k_cache = k_cache;
    p->v_cache = v_cache;
    p->page_table = page_table;
    p->seqused_k = seqused_k;
    return FJ_OK;
}

fj_status fj__validate_append_memory(const fj__append_problem *p, const struct fj_backend_ops *ops,
                                     void *backend, fj__err *err)
{
    if (!ops->check_memory)
        return FJ_OK;
    const fj_tensor *t[9] = {p->k_new,          p->v_new,      p->k_cache,
                             p->v_cache,        p->page_table, p->seqused_k,
                             p->cu_seqlens_new, p->descale[0], p->descale[1]};
    static const char *const names[9] = {"k_new",          "v_new",      "k_cache",
                                         "v_cache",        "page_table", "seqused_k",
                                         "cu_seqlens_new", "k_descale",  "v_descale"};
    for (int i = 0; i < 9; i++)
        if (t[i])
            TRY(device_memory(ops, backend, t[i], names[i], err));
    return FJ_OK;
}

/* ---- the backward ------------------------------------------------------------------------- */

/* A gradient (or dout) of the shape and dtype of its tensor. */
static fj_status check_like(const fj_tensor *t, const char *name, const fj_tensor *like,
                            const char *like_name, fj__err *err)
{
    TRY(check_tensor(t, name, like->ndim, err));
    if (t->dtype != like->dtype)
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT, "%s.dtype = %s differs from %s.dtype = %s",
                        name, fj__dtype_name(t->dtype), like_name, fj__dtype_name(like->dtype));
    for (int i = 0; i < like->ndim; i++)
        if (t->shape[i] != like->shape[i])
            return fj__fail(err, FJ_ERR_INVALID_ARGUMENT,
                            "%s.shape[%d] = %lld, expected %lld (as %s.shape[%d])", name, i,
                            (long long)t->shape[i], (long long)like->shape[i], like_name, i);
    return FJ_OK;
}

fj_status fj__validate_backward(const fj_attention_desc *desc, const fj_tensor *q,
                                const fj_tensor *k, const fj_tensor *v, const fj_tensor *out,
                                const fj_tensor *dout, const fj_tensor *lse, const fj_tensor *dq,
                                const fj_tensor *dk, const fj_tensor *dv, fj__bwd_problem *p,
                                fj__err *err)
{
    memset(p, 0, sizeof *p);
    if (!lse)
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT,
                        "lse is NULL: the backward needs the forward's log-sum-exp");
    TRY(fj__validate_forward(desc, q, k, v, out, lse, &p->f, err));
    if (p->f.page_table)
        return fj__fail(err, FJ_ERR_UNSUPPORTED,
                        "desc.page_table: the backward of a paged KV cache is not supported");
    if (fj__dtype_fp8(p->f.q_dtype) || fj__dtype_fp8(p->f.kv_dtype))
        return fj__fail(err, FJ_ERR_UNSUPPORTED,
                        "%s.dtype = %s: the backward of fp8 attention is not supported",
                        fj__dtype_fp8(p->f.q_dtype) ? "q" : "k",
                        fj__dtype_name(fj__dtype_fp8(p->f.q_dtype) ? p->f.q_dtype : p->f.kv_dtype));
    TRY(check_like(dout, "dout", out, "out", err));
    TRY(check_like(dq, "dq", q, "q", err));
    TRY(check_like(dk, "dk", k, "k", err));
    TRY(check_like(dv, "dv", v, "v", err));
    const fj_tensor *grads[3] = {dq, dk, dv};
    static const char *const gnames[3] = {"dq", "dk", "dv"};
    const fj_tensor *inputs[6] = {q, k, v, out, dout, lse};
    static const char *const inames[6] = {"q", "k", "v", "out", "dout", "lse"};
    for (int g = 0; g < 3; g++) {
        TRY(check_no_overlap(grads[g], gnames[g], err));
        for (int i = 0; i < 6; i++)
            TRY(check_apart(grads[g], gnames[g], inputs[i], inames[i], 0, err));
        for (int h = g + 1; h < 3; h++)
            TRY(check_apart(grads[g], gnames[g], grads[h], gnames[h], 0, err));
    }
    p->dout = dout;
    p->dq = dq;
    p->dk = dk;
    p->dv = dv;
    if (desc->dbias) {
        const fj_tensor *db = desc->dbias;
        if (!p->f.bias)
            return fj__fail(err, FJ_ERR_INVALID_ARGUMENT,
                            "desc.dbias is set but desc.bias is NULL (no bias to differentiate)");
        TRY(check_tensor(db, "desc.dbias", 4, err));
        if (db->dtype != FJ_DTYPE_F32)
            return fj__fail(err, FJ_ERR_INVALID_ARGUMENT, "desc.dbias.dtype = %s, expected f32",
                            fj__dtype_name(db->dtype));
        static const char *const what[3] = {"batch, or 1 where the bias broadcasts it",
                                            "heads_q, or 1 where the bias broadcasts them",
                                            "seqlen_q, or 1 where the bias broadcasts it"};
        const int64_t full[3] = {p->f.batch, p->f.heads_q, p->f.seqlen_q};
        for (int a = 0; a < 3; a++) {
            p->dbias_extent[a] = p->f.bias_stride[a] == 0 ? 1 : full[a];
            TRY(check_dim(err, "desc.dbias", a, db->shape[a], p->dbias_extent[a], what[a]));
        }
        TRY(check_dim(err, "desc.dbias", 3, db->shape[3], p->f.seqlen_k, "seqlen_k"));
        TRY(check_no_overlap(db, "desc.dbias", err));
        for (int i = 0; i < 6; i++)
            TRY(check_apart(db, "desc.dbias", inputs[i], inames[i], 0, err));
        for (int g = 0; g < 3; g++)
            TRY(check_apart(db, "desc.dbias", grads[g], gnames[g], 0, err));
        TRY(check_apart(db, "desc.dbias", p->f.bias, "desc.bias", 0, err));
        p->dbias = db;
    }
    /* Batch, row and head strides: dense [b, s, h, d]; packed [total, h, d] has no batch. */
    const fj_tensor *t4[4] = {dout, dq, dk, dv};
    const int packed = p->f.cu_seqlens_q != NULL;
    for (int i = 0; i < 4; i++)
        for (int a = 0; a < 3; a++)
            p->grad_strides[i][a] = packed ? (a == 0 ? 0 : t4[i]->stride[a - 1]) : t4[i]->stride[a];
    return FJ_OK;
}

fj_status fj__validate_backward_memory(const fj__bwd_problem *p,
                                       const struct fj_backend_ops *ops, void *backend,
                                       fj__err *err)
{
    TRY(fj__validate_memory(&p->f, ops, backend, err));
    if (!ops->check_memory)
        return FJ_OK;
    const fj_tensor *t[4] = {p->dout, p->dq, p->dk, p->dv};
    static const char *const names[4] = {"dout", "dq", "dk", "dv"};
    for (int i = 0; i < 4; i++)
        TRY(device_memory(ops, backend, t[i], names[i], err));
    if (p->dbias)
        TRY(device_memory(ops, backend, p->dbias, "desc.dbias", err));
    return FJ_OK;
}
