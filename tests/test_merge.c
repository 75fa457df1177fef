/* fj_attention_merge against the float64 merge (tools/check): random states with empty ones and
** empty rows, every dtype pair, dense, permuted, padded and packed layouts, one launch and chains
** of them, in place; the merge of forward calls over split keys equals the forward over all keys;
** bad arguments are named. Outputs are poisoned first and the bytes around the views checked.
** Runs once per backend, like test_attention.c. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "flashjit.h"
#include "backend_suite.h"
#include "random.h"
#include "reference.h"

enum { POISON = 0xff }; /* 0xff.. is NaN in f32, f16 and bf16 */

static uint64_t rng = 0x9e3779b97f4a7c15ull;

static double uniform(void) /* [0, 1) */
{
    return fjr_unit(fjr_xorshift(&rng));
}

/* How a state's elements lie in memory. */
typedef enum layout { BSHD, BHSD, PADDED, PACKED } layout;

/* A tensor with host and device copies of all the memory its view spans, gaps included. */
typedef struct buffer {
    fj_tensor t;
    size_t elements;
    unsigned char *host;
    void *dev;
} buffer;

/* out-like [b, s, h, dv] (packed: [b * s, h, dv]) or, with lse, lse-like [b, h, s] ([h, b * s]). */
static void make_view(buffer *x, layout l, int lse, fj_dtype dtype, int64_t b, int64_t s, int64_t h,
                      int64_t dv)
{
    memset(x, 0, sizeof *x);
    fj_tensor *t = &x->t;
    t->dtype = dtype;
    if (l == PACKED) {
        const int64_t rows = b * s;
        t->ndim = lse ? 2 : 3;
        int64_t shape[3] = {rows, h, dv}, lshape[2] = {h, rows};
        memcpy(t->shape, lse ? lshape : shape, sizeof(int64_t) * (size_t)t->ndim);
        if (lse) {
            t->stride[1] = 1;
            t->stride[0] = rows + 3;
            x->elements = (size_t)(h * (rows + 3));
        } else {
            t->stride[2] = 1;
            t->stride[1] = dv + 1;
            t->stride[0] = h * (dv + 1) + 2;
            x->elements = (size_t)(rows * t->stride[0]);
        }
        return;
    }
    t->ndim = lse ? 3 : 4;
    if (lse) {
        const int64_t gap = l == PADDED ? 2 : 0;
        int64_t shape[3] = {b, h, s};
        memcpy(t->shape, shape, sizeof shape);
        t->stride[2] = 1;
        t->stride[1] = s + gap;
        t->stride[0] = h * (s + gap) + gap;
        x->elements = (size_t)(b * t->stride[0]);
        return;
    }
    int64_t shape[4] = {b, s, h, dv};
    memcpy(t->shape, shape, sizeof shape);
    t->stride[3] = 1;
    if (l == BHSD) { /* [b, h, s, dv] storage */
        t->stride[1] = dv;
        t->stride[2] = s * dv;
        t->stride[0] = h * s * dv;
    } else {
        const int64_t gap = l == PADDED ? 3 : 0;
        t->stride[2] = dv + gap;
        t->stride[1] = h * (dv + gap) + gap;
        t->stride[0] = s * t->stride[1] + gap;
    }
    x->elements = (size_t)(b * t->stride[0]);
}

/* The element offset of (b, s, h, d) in an out-like view, dense or packed (rows b * seqlen + s). */
static int64_t at_out(const fj_tensor *t, int64_t b, int64_t s, int64_t h, int64_t d,
                      int64_t seqlen)
{
    if (t->ndim == 3)
        return (b * seqlen + s) * t->stride[0] + h * t->stride[1] + d;
    return b * t->stride[0] + s * t->stride[1] + h * t->stride[2] + d;
}

/* The element offset of (b, h, s) in an lse-like view, dense [b, h, s] or packed [h, rows]. */
static int64_t at_lse(const fj_tensor *t, int64_t b, int64_t s, int64_t h, int64_t seqlen)
{
    if (t->ndim == 2)
        return h * t->stride[0] + (b * seqlen + s) * t->stride[1];
    return b * t->stride[0] + h * t->stride[1] + s * t->stride[2];
}

static const char *dtype_name(fj_dtype d)
{
    return d == FJ_DTYPE_BF16 ? "bf16" : d == FJ_DTYPE_F16 ? "f16" : "f32";
}

static void upload(fj_context *ctx, buffer *x)
{
    const size_t bytes = x->elements * fj_dtype_size(x->t.dtype);
    assert_int_equal(fj_malloc(ctx, bytes, &x->dev), FJ_OK);
    assert_int_equal(fj_memcpy_h2d(ctx, x->dev, x->host, bytes), FJ_OK);
    x->t.data = x->dev;
}

static void release(fj_context *ctx, buffer *x)
{
    if (x->dev)
        fj_free(ctx, x->dev);
    free(x->host);
    x->dev = NULL;
    x->host = NULL;
}

/* One merge case. */
typedef struct merge_case {
    int n;
    int64_t b, s, h, dv;
    fj_dtype in, out;
    layout states, result;
    int with_lse;
    int in_place; /* the result is state 0 (out and lse) */
    int specials; /* some rows get a NaN or +inf lse (the row must come out NaN) */
} merge_case;

/* Runs c on random states and checks every element against fjr_merge; returns 1 when it
** passes (and prints why not). */
static int run_merge(fj_context *ctx, const merge_case *c)
{
    const int64_t rows = c->b * c->s * c->h, dv = c->dv;
    buffer *outs = calloc((size_t)c->n, sizeof *outs), *lses = calloc((size_t)c->n, sizeof *lses);
    double **ref_outs = calloc((size_t)c->n, sizeof *ref_outs);
    double *ref_lses = calloc((size_t)(c->n * rows), sizeof *ref_lses);
    assert_true(outs && lses && ref_outs && ref_lses);
    for (int i = 0; i < c->n; i++) {
        make_view(&outs[i], c->states, 0, c->in, c->b, c->s, c->h, dv);
        make_view(&lses[i], c->states, 1, FJ_DTYPE_F32, c->b, c->s, c->h, dv);
        outs[i].host = malloc(outs[i].elements * fj_dtype_size(c->in));
        lses[i].host = malloc(lses[i].elements * 4);
        ref_outs[i] = malloc((size_t)(rows * dv) * sizeof(double));
        assert_true(outs[i].host && lses[i].host && ref_outs[i]);
        memset(outs[i].host, POISON, outs[i].elements * fj_dtype_size(c->in));
        memset(lses[i].host, POISON, lses[i].elements * 4);
        for (int64_t b = 0, r = 0; b < c->b; b++)
            for (int64_t s = 0; s < c->s; s++)
                for (int64_t h = 0; h < c->h; h++, r++) {
                    /* Every seventh state of a row is empty (its out holds NaN: never read), and
                    ** so is all of every 11th row. */
                    const int empty = (r + i) % 7 == 3 || r % 11 == 5;
                    float l = empty ? -INFINITY : (float)(8.0 * uniform() - 4.0);
                    if (c->specials && r % 13 == 7 && i == 0)
                        l = NAN;
                    if (c->specials && r % 13 == 9 && i == c->n - 1)
                        l = INFINITY;
                    memcpy(lses[i].host + 4 * at_lse(&lses[i].t, b, s, h, c->s), &l, 4);
                    ref_lses[i * rows + r] = l;
                    for (int64_t d = 0; d < dv; d++) {
                        const float x = empty ? NAN : fjr_round(c->in, (float)(2 * uniform() - 1));
                        fjr_store(c->in,
                                  outs[i].host +
                                      fj_dtype_size(c->in) * at_out(&outs[i].t, b, s, h, d, c->s),
                                  x);
                        ref_outs[i][r * dv + d] = x;
                    }
                }
        upload(ctx, &outs[i]);
        upload(ctx, &lses[i]);
    }
    buffer out = {0}, lse = {0};
    const fj_tensor *out_t = &outs[0].t, *lse_t = &lses[0].t;
    if (!c->in_place) {
        make_view(&out, c->result, 0, c->out, c->b, c->s, c->h, dv);
        make_view(&lse, c->result, 1, FJ_DTYPE_F32, c->b, c->s, c->h, dv);
        out.host = malloc(out.elements * fj_dtype_size(c->out));
        lse.host = malloc(lse.elements * 4);
        assert_true(out.host && lse.host);
        memset(out.host, POISON, out.elements * fj_dtype_size(c->out));
        memset(lse.host, POISON, lse.elements * 4);
        upload(ctx, &out);
        upload(ctx, &lse);
        out_t = &out.t;
        lse_t = &lse.t;
    }
    fj_tensor *state_outs = calloc((size_t)c->n, sizeof *state_outs);
    fj_tensor *state_lses = calloc((size_t)c->n, sizeof *state_lses);
    for (int i = 0; i < c->n; i++) {
        state_outs[i] = outs[i].t;
        state_lses[i] = lses[i].t;
    }
    fj_tensor result = *out_t, result_lse = *lse_t;
    fj_status st = fj_attention_merge(ctx, state_outs, state_lses, c->n, &result,
                                      c->with_lse ? &result_lse : NULL, NULL);
    if (st != FJ_OK)
        fail_msg("merge failed: %s: %s", fj_status_string(st), fj_context_last_error(ctx));
    assert_int_equal(fj_synchronize(ctx, NULL), FJ_OK);

    /* Read back the result (and, in place, state 0). */
    buffer *ro = c->in_place ? &outs[0] : &out, *rl = c->in_place ? &lses[0] : &lse;
    const fj_dtype odt = c->in_place ? c->in : c->out;
    assert_int_equal(fj_memcpy_d2h(ctx, ro->host, ro->dev, ro->elements * fj_dtype_size(odt)),
                     FJ_OK);
    assert_int_equal(fj_memcpy_d2h(ctx, rl->host, rl->dev, rl->elements * 4), FJ_OK);
    double *ref = malloc((size_t)(rows * dv) * sizeof *ref), *ref_lse = malloc(rows * sizeof *ref);
    assert_true(ref && ref_lse);
    fjr_merge(c->n, (const double *const *)ref_outs, ref_lses, rows, dv, ref, ref_lse);
    /* The result is rounded once to its dtype; f32 accumulation adds a few ulps. */
    const double tol = odt == FJ_DTYPE_BF16 ? 1.0 / 256 : odt == FJ_DTYPE_F16 ? 1.0 / 2048 : 1e-5;
    double worst = 0, worst_lse = 0;
    int64_t bad = 0;
    unsigned char *seen = calloc(ro->elements, 1), *seen_lse = calloc(rl->elements, 1);
    for (int64_t b = 0, r = 0; b < c->b; b++)
        for (int64_t s = 0; s < c->s; s++)
            for (int64_t h = 0; h < c->h; h++, r++) {
                for (int64_t d = 0; d < dv; d++) {
                    const int64_t off = at_out(&ro->t, b, s, h, d, c->s);
                    seen[off] = 1;
                    const double got = fjr_load(odt, ro->host + fj_dtype_size(odt) * off);
                    const double want = ref[r * dv + d];
                    if (!isfinite(got) || !isfinite(want))
                        bad += !(isnan(got) ? isnan(want) : got == want);
                    else
                        worst = fmax(worst, fabs(got - want) / fmax(1.0, fabs(want)));
                }
                if (!c->with_lse)
                    continue;
                const int64_t off = at_lse(&rl->t, b, s, h, c->s);
                seen_lse[off] = 1;
                float got;
                memcpy(&got, rl->host + 4 * off, 4);
                const double want = ref_lse[r];
                if (!isfinite(got) || !isfinite(want))
                    bad += !(isnan(got) ? isnan(want) : got == want);
                else
                    worst_lse = fmax(worst_lse, fabs(got - want) / fmax(1.0, fabs(want)));
            }
    /* Nothing outside the views was written (in place, state 0's gaps hold its poison too). */
    int64_t clobbered = 0;
    for (size_t e = 0; e < ro->elements; e++)
        for (size_t k = 0; !seen[e] && k < fj_dtype_size(odt); k++)
            clobbered += ro->host[e * fj_dtype_size(odt) + k] != POISON;
    for (size_t e = 0; c->with_lse && e < rl->elements; e++)
        for (size_t k = 0; !seen_lse[e] && k < 4; k++)
            clobbered += rl->host[e * 4 + k] != POISON;
    const int pass = !bad && !clobbered && worst <= tol && worst_lse <= 1e-5;
    printf("  %s n=%d b=%lld s=%lld h=%lld dv=%lld %s->%s layouts %d->%d lse=%d in_place=%d | "
           "err %.3g (tol %.3g) lse %.3g bad %lld clobbered %lld\n",
           pass ? "ok  " : "FAIL", c->n, (long long)c->b, (long long)c->s, (long long)c->h,
           (long long)dv, dtype_name(c->in), dtype_name(odt), c->states, c->result, c->with_lse,
           c->in_place, worst, tol, worst_lse, (long long)bad, (long long)clobbered);
    free(seen);
    free(seen_lse);
    free(ref);
    free(ref_lse);
    for (int i = 0; i < c->n; i++) {
        release(ctx, &outs[i]);
        release(ctx, &lses[i]);
        free(ref_outs[i]);
    }
    release(ctx, &out);
    release(ctx, &lse);
    free(outs);
    free(lses);
    free(ref_outs);
    free(ref_lses);
    free(state_outs);
    free(state_lses);
    return pass;
}

static void run_all(void **state, const merge_case *cases, size_t n)
{
    fj_context *ctx = suite_context(state);
    int failures = 0;
    for (size_t i = 0; i < n; i++)
        failures += !run_merge(ctx, &cases[i]);
    assert_int_equal(failures, 0);
}

/* One launch (n <= 8) and chains (9, 16, 23, 64), every dtype pair, odd sizes. */
static void test_counts_and_dtypes(void **state)
{
    static const merge_case cases[] = {
        {1, 2, 5, 3, 40, FJ_DTYPE_BF16, FJ_DTYPE_BF16, BSHD, BSHD, 1, 0, 0},
        {2, 1, 37, 4, 64, FJ_DTYPE_F16, FJ_DTYPE_F16, BSHD, BSHD, 1, 0, 0},
        {3, 2, 9, 2, 129, FJ_DTYPE_F32, FJ_DTYPE_BF16, BHSD, PADDED, 1, 0, 0},
        {8, 1, 17, 3, 8, FJ_DTYPE_BF16, FJ_DTYPE_F32, PADDED, BSHD, 1, 0, 0},
        {9, 2, 7, 2, 96, FJ_DTYPE_F32, FJ_DTYPE_F32, BSHD, BHSD, 1, 0, 0},
        {16, 1, 13, 5, 33, FJ_DTYPE_F16, FJ_DTYPE_BF16, BSHD, BSHD, 0, 0, 0},
        {23, 1, 6, 2, 72, FJ_DTYPE_BF16, FJ_DTYPE_F16, PADDED, PADDED, 1, 0, 0},
        {64, 1, 3, 2, 16, FJ_DTYPE_F32, FJ_DTYPE_F32, BSHD, BSHD, 1, 0, 0},
    };
    run_all(state, cases, sizeof cases / sizeof cases[0]);
}

/* Packed states ([total, h, dv], lse [h, total]) and the result in place of state 0. */
static void test_packed_and_in_place(void **state)
{
    static const merge_case cases[] = {
        {4, 3, 11, 2, 48, FJ_DTYPE_BF16, FJ_DTYPE_BF16, PACKED, PACKED, 1, 0, 0},
        {12, 1, 20, 3, 64, FJ_DTYPE_F32, FJ_DTYPE_F16, PACKED, PACKED, 1, 0, 0},
        {5, 2, 9, 3, 40, FJ_DTYPE_BF16, FJ_DTYPE_BF16, PADDED, PADDED, 1, 1, 0},
        {10, 1, 8, 4, 576, FJ_DTYPE_F32, FJ_DTYPE_F32, BSHD, BSHD, 1, 1, 0},
        {3, 2, 5, 2, 32, FJ_DTYPE_F16, FJ_DTYPE_F16, PACKED, PACKED, 1, 1, 0},
        /* NaN and +inf log-sum-exps, in one launch and in a chain. */
        {4, 2, 13, 2, 24, FJ_DTYPE_F32, FJ_DTYPE_BF16, BSHD, BSHD, 1, 0, 1},
        {11, 1, 26, 1, 24, FJ_DTYPE_BF16, FJ_DTYPE_F32, BSHD, PADDED, 1, 0, 1},
    };
    run_all(state, cases, sizeof cases / sizeof cases[0]);
}

/* The merge of forward calls over disjoint key ranges (f32) equals the forward over all keys. */
static void test_split_forward_merges_to_the_whole(void **state)
{
    fj_context *ctx = suite_context(state);
    enum { B = 2, SQ = 33, SK = 150, H = 4, HKV = 2, D = 40, SPLITS = 5 };
    const int64_t cut[SPLITS + 1] = {0, 7, 8, 60, 100, SK}; /* uneven, one of one key */
    const size_t nq = (size_t)B * SQ * H * D, nk = (size_t)B * SK * HKV * D;
    float *hq = malloc(nq * 4), *hk = malloc(nk * 4), *hv = malloc(nk * 4);
    assert_true(hq && hk && hv);
    for (size_t i = 0; i < nq; i++)
        hq[i] = (float)(2 * uniform() - 1);
    for (size_t i = 0; i < nk; i++) {
        hk[i] = (float)(2 * uniform() - 1);
        hv[i] = (float)(2 * uniform() - 1);
    }
    void *q, *k, *v, *outs, *lses, *whole, *whole_lse, *merged, *merged_lse;
    const size_t no = nq * 4, nl = (size_t)B * H * SQ * 4;
    assert_int_equal(fj_malloc(ctx, nq * 4, &q), FJ_OK);
    assert_int_equal(fj_malloc(ctx, nk * 4, &k), FJ_OK);
    assert_int_equal(fj_malloc(ctx, nk * 4, &v), FJ_OK);
    assert_int_equal(fj_malloc(ctx, SPLITS * no, &outs), FJ_OK);
    assert_int_equal(fj_malloc(ctx, SPLITS * nl, &lses), FJ_OK);
    assert_int_equal(fj_malloc(ctx, no, &whole), FJ_OK);
    assert_int_equal(fj_malloc(ctx, nl, &whole_lse), FJ_OK);
    assert_int_equal(fj_malloc(ctx, no, &merged), FJ_OK);
    assert_int_equal(fj_malloc(ctx, nl, &merged_lse), FJ_OK);
    assert_int_equal(fj_memcpy_h2d(ctx, q, hq, nq * 4), FJ_OK);
    assert_int_equal(fj_memcpy_h2d(ctx, k, hk, nk * 4), FJ_OK);
    assert_int_equal(fj_memcpy_h2d(ctx, v, hv, nk * 4), FJ_OK);
    const fj_tensor tq = {q, FJ_DTYPE_F32, 4, {B, SQ, H, D}, {SQ * H * D, H * D, D, 1}};
    fj_tensor tk = {k, FJ_DTYPE_F32, 4, {B, SK, HKV, D}, {SK * HKV * D, HKV * D, D, 1}};
    fj_tensor tv = tk;
    tv.data = v;
    fj_tensor to = {whole, FJ_DTYPE_F32, 4, {B, SQ, H, D}, {SQ * H * D, H * D, D, 1}};
    fj_tensor tl = {whole_lse, FJ_DTYPE_F32, 3, {B, H, SQ}, {H * SQ, SQ, 1}};
    fj_attention_desc desc;
    fj_attention_desc_init(&desc);
    desc.softmax_scale = 0.3f;
    assert_int_equal(fj_attention_forward(ctx, &desc, &tq, &tk, &tv, &to, &tl, NULL), FJ_OK);
    fj_tensor part_o[SPLITS], part_l[SPLITS];
    for (int i = 0; i < SPLITS; i++) {
        fj_tensor ks = tk, vs = tv; /* keys [cut[i], cut[i + 1]): views into k and v */
        ks.shape[1] = vs.shape[1] = cut[i + 1] - cut[i];
        ks.data = (float *)k + cut[i] * HKV * D;
        vs.data = (float *)v + cut[i] * HKV * D;
        part_o[i] = to;
        part_o[i].data = (char *)outs + i * no;
        part_l[i] = tl;
        part_l[i].data = (char *)lses + i * nl;
        assert_int_equal(
            fj_attention_forward(ctx, &desc, &tq, &ks, &vs, &part_o[i], &part_l[i], NULL), FJ_OK);
    }
    fj_tensor mo = to, ml = tl;
    mo.data = merged;
    ml.data = merged_lse;
    assert_int_equal(fj_attention_merge(ctx, part_o, part_l, SPLITS, &mo, &ml, NULL), FJ_OK);
    float *a = malloc(no), *m = malloc(no), *la = malloc(nl), *lm = malloc(nl);
    assert_true(a && m && la && lm);
    assert_int_equal(fj_memcpy_d2h(ctx, a, whole, no), FJ_OK);
    assert_int_equal(fj_memcpy_d2h(ctx, m, merged, no), FJ_OK);
    assert_int_equal(fj_memcpy_d2h(ctx, la, whole_lse, nl), FJ_OK);
    assert_int_equal(fj_memcpy_d2h(ctx, lm, merged_lse, nl), FJ_OK);
    double worst = 0, worst_lse = 0;
    for (size_t i = 0; i < nq; i++)
        worst = fmax(worst, fabs((double)a[i] - m[i]));
    for (size_t i = 0; i < nl / 4; i++)
        worst_lse = fmax(worst_lse, fabs((double)la[i] - lm[i]) / fmax(1.0, fabs(la[i])));
    printf("  split forward over %d key ranges, merged: max abs diff %.3g, lse %.3g\n", SPLITS,
           worst, worst_lse);
    assert_true(worst < 1e-5);
    assert_true(worst_lse < 2e-6);
    void *all[] = {q, k, v, outs, lses, whole, whole_lse, merged, merged_lse};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        fj_free(ctx, all[i]);
    free(hq);
    free(hk);
    free(hv);
    free(a);
    free(m);
    free(la);
    free(lm);
}

/* Every bad argument is named before anything runs. */
static void test_bad_arguments(void **state)
{
    fj_context *ctx = suite_context(state);
    void *mem = NULL;
    assert_int_equal(fj_malloc(ctx, 1 << 16, &mem), FJ_OK);
    float *base = mem;
    fj_tensor o[3], l[3];
    for (int i = 0; i < 3; i++) {
        o[i] = (fj_tensor){base + i * 2048, FJ_DTYPE_F32, 4, {1, 8, 2, 16}, {256, 32, 16, 1}};
        l[i] = (fj_tensor){base + 8192 + i * 64, FJ_DTYPE_F32, 3, {1, 2, 8}, {16, 8, 1}};
    }
    fj_tensor out = o[0], lse = l[0];
    out.data = base + 6144;
    lse.data = base + 8192 + 512;
    static const struct {
        int what;
        const char *message;
    } cases[] = {
        {0, "n = 0, expected 1 to 64"},
        {1, "n = 65"},
        {2, "outs is NULL"},
        {3, "lses is NULL"},
        {4, "outs[2].dtype = bf16, expected f32 (as outs[0]"},
        {5, "outs[1].shape[2] = 3, expected 2 (as outs[0])"},
        {6, "lses[2].shape[2] = 9, expected 8 (the lse of outs[2])"},
        {7, "lses[0].dtype = f16, expected f32"},
        {8, "out.dtype = i32, expected f16, bf16 or f32"},
        {9, "out overlaps outs[1] without being it"},
        {10, "lse overlaps out"},
        {11, "out.stride[2] = 0 makes elements overlap"},
        {12, "out overlaps lses[1]"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        fj_tensor O[3], L[3], R = out, RL = lse;
        memcpy(O, o, sizeof O);
        memcpy(L, l, sizeof L);
        int n = 3;
        const fj_tensor *os = O, *ls = L;
        switch (cases[c].what) {
        case 0: n = 0; break;
        case 1: n = 65; break;
        case 2: os = NULL; break;
        case 3: ls = NULL; break;
        case 4: O[2].dtype = FJ_DTYPE_BF16; break;
        case 5: O[1].shape[2] = 3; break;
        case 6: L[2].shape[2] = 9; break;
        case 7: L[0].dtype = FJ_DTYPE_F16; break;
        case 8: R.dtype = FJ_DTYPE_I32; break;
        case 9: R.data = base + 2048 + 16; break;
        case 10: RL.data = (float *)R.data + 4; break;
        case 11: R.stride[2] = 0; break;
        case 12: R.data = L[1].data; break;
        }
        fj_status st = fj_attention_merge(ctx, os, ls, n, &R, &RL, NULL);
        if (st != FJ_ERR_INVALID_ARGUMENT || !strstr(fj_context_last_error(ctx), cases[c].message))
            fail_msg("case %d: status %d, '%s', expected '%s'", cases[c].what, st,
                     fj_context_last_error(ctx), cases[c].message);
    }
    /* In place is fine: out is outs[1] and lse is lses[2]. */
    assert_int_equal(fj_attention_merge(ctx, o, l, 3, &o[1], &l[2], NULL), FJ_OK);
    assert_int_equal(fj_synchronize(ctx, NULL), FJ_OK);
    fj_free(ctx, mem);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_counts_and_dtypes),
        cmocka_unit_test(test_packed_and_in_place),
        cmocka_unit_test(test_split_forward_merges_to_the_whole),
        cmocka_unit_test(test_bad_arguments),
    };
    return suite_run("merge", tests);
}
