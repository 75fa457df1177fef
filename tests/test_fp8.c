/* FP8 attention on one backend (FJ_TEST_BACKEND): q, k and v in f8e4m3 or f8e5m2 (or k and v
** alone: an FP8 KV cache read by 16-bit queries) with descale factors ([1], [batch, heads_kv] or
** none), out in bf16 or f16, against the float64 reference
** of the dequantised inputs; the error bar is a plain FP8 implementation (inputs and P in FP8,
** f32 accumulation, out rounded). Inputs carry outliers (a few large values per row); outputs
** are poisoned before the call and every element is checked. The host's FP8 conversions are
** checked against the formats' defining values first. Without a device of that backend the
** suite skips. */
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

#include "backend_suite.h"
#include "random.h"
#include "reference.h"

/* The formats' landmarks: largest finite values, smallest subnormals, NaN codes, rounding. */
static void test_host_conversions(void **state)
{
    (void)state;
    const fj_dtype e4m3 = FJ_DTYPE_F8_E4M3, e5m2 = FJ_DTYPE_F8_E5M2;
    assert_true(fjr_fp8_to_f32(e4m3, 0x7e) == 448.0f);
    assert_true(fjr_fp8_to_f32(e4m3, 0x01) == ldexpf(1.0f, -9));
    assert_true(fjr_fp8_to_f32(e4m3, 0x38) == 1.0f);
    assert_true(isnan(fjr_fp8_to_f32(e4m3, 0x7f)) && isnan(fjr_fp8_to_f32(e4m3, 0xff)));
    assert_true(fjr_fp8_to_f32(e5m2, 0x7b) == 57344.0f);
    assert_true(fjr_fp8_to_f32(e5m2, 0x01) == ldexpf(1.0f, -16));
    assert_true(fjr_fp8_to_f32(e5m2, 0x3c) == 1.0f);
    assert_true(isinf(fjr_fp8_to_f32(e5m2, 0x7c)));
    assert_int_equal(fjr_f32_to_fp8(e4m3, 1000.0f), 0x7e);  /* saturates */
    assert_int_equal(fjr_f32_to_fp8(e4m3, -1.0625f), 0xb8); /* a tie: to the even code, -1 */
    assert_int_equal(fjr_f32_to_fp8(e4m3, 1.1875f), 0x3a);  /* a tie between 1.125 and 1.25 */
    assert_int_equal(fjr_f32_to_fp8(e5m2, 1.2f), 0x3d);
    for (int c = 0; c < 256; c++) { /* every finite code round-trips */
        const float x = fjr_fp8_to_f32(e4m3, (uint8_t)c), y = fjr_fp8_to_f32(e5m2, (uint8_t)c);
        if (isfinite(x) && x != 0.0f)
            assert_int_equal(fjr_f32_to_fp8(e4m3, x), c);
        if (isfinite(y) && y != 0.0f)
            assert_int_equal(fjr_f32_to_fp8(e5m2, y), c);
    }
}

enum { ANY_KERNEL, HOPPER, CACHE };

typedef struct fp8_case {
    fj_dtype in, out;
    int q16;     /* q in out's dtype (an FP8 KV cache read by 16-bit queries; no q descale) */
    int descale; /* 0 none, 1 [1], 2 [batch, heads_kv] */
    int causal;
    int64_t b, sq, sk, hq, hkv, d, dv;
    int kernel; /* what it must run: ANY_KERNEL; HOPPER (on sm_90a Hopper's FP8 kernel,
                ** cuda.fwd.wgmma); CACHE (an FP8 cache in 16-byte rows: on CUDA sm_80+ the
                ** decode kernel run_case is given) */
    int dequant; /* run through 16-bit copies: q's, times its factors, rounds to out's dtype */
} fp8_case;

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double uniform(void) /* in [-1, 1) */
{
    return fjr_signed_unit(fjr_xorshift(&rng));
}

/* The report of ctx's last call. */
static fj_call_info last_call(const fj_context *ctx)
{
    fj_call_info info = {.struct_size = sizeof info};
    assert_int_equal(fj_context_last_call(ctx, &info), FJ_OK);
    return info;
}

/* A device copy of n bytes of host. */
static void *upload(fj_context *ctx, const void *host, size_t n)
{
    void *d = NULL;
    assert_int_equal(fj_malloc(ctx, n, &d), FJ_OK);
    assert_int_equal(fj_memcpy_h2d(ctx, d, host, n), FJ_OK);
    return d;
}

/* Fills the elements (dtype) of a [b, s, h, dim] tensor with random values divided by their
** (batch, kv head)'s factor (so that real = element * factor), with outliers: the first element
** of every row of 8 is 8x larger. real[] receives the values the elements stand for. */
static void make_input(const fp8_case *c, fj_dtype dtype, int64_t s, int64_t h, int64_t dim,
                       const float *factor, unsigned char *elems, double *real)
{
    const size_t es = fj_dtype_size(dtype);
    for (int64_t b = 0; b < c->b; b++)
        for (int64_t i = 0; i < s; i++)
            for (int64_t j = 0; j < h; j++)
                for (int64_t e = 0; e < dim; e++) {
                    const int64_t at = ((b * s + i) * h + j) * dim + e;
                    const float f = factor[b * c->hkv + j * c->hkv / h];
                    const double x = uniform() * (e % 8 == 0 ? 8.0 : 1.0);
                    fjr_store(dtype, elems + at * es, (float)(x / f));
                    real[at] = (double)fjr_load(dtype, elems + at * es) * f;
                }
}

/* One row of attention in float64 (ref, its lse) and the plain FP8 implementation (plain: P
** rounded to e4m3 after the max is taken out, f32 sums, the result rounded to out's dtype). */
static void reference_row(const fp8_case *c, const double *q, const double *k, const double *v,
                          int64_t b, int64_t h, int64_t i, double scale, double *ref,
                          double *ref_lse, double *plain, double *magnitude)
{
    const int64_t hk = h / (c->hq / c->hkv);
    const int64_t last = c->causal ? i + c->sk - c->sq : c->sk - 1;
    double m = -INFINITY;
    double *s = malloc((size_t)c->sk * sizeof *s);
    assert_non_null(s);
    *magnitude = 0;
    for (int64_t j = 0; j <= last && j < c->sk; j++) {
        double dot = 0, sum_abs = 0;
        for (int64_t e = 0; e < c->d; e++) {
            const double x = q[((b * c->sq + i) * c->hq + h) * c->d + e] *
                             k[((b * c->sk + j) * c->hkv + hk) * c->d + e];
            dot += x;
            sum_abs += fabs(x);
        }
        s[j] = dot * scale;
        m = fmax(m, s[j]);
        *magnitude = fmax(*magnitude, sum_abs * scale);
    }
    double l = 0;
    float lp = 0;
    for (int64_t e = 0; e < c->dv; e++)
        ref[e] = plain[e] = 0;
    for (int64_t j = 0; j <= last && j < c->sk; j++) {
        const double p = exp(s[j] - m);
        const float pf = (float)p, p8 = fjr_round(FJ_DTYPE_F8_E4M3, pf);
        l += p;
        lp += pf;
        for (int64_t e = 0; e < c->dv; e++) {
            const double x = v[((b * c->sk + j) * c->hkv + hk) * c->dv + e];
            ref[e] += p * x;
            plain[e] = (double)((float)plain[e] + p8 * (float)x);
        }
    }
    for (int64_t e = 0; e < c->dv; e++) {
        ref[e] = l > 0 ? ref[e] / l : 0;
        plain[e] = lp > 0 ? fjr_round(c->out, (float)(plain[e] / lp)) : 0;
    }
    *ref_lse = l > 0 ? m + log(l) : -INFINITY;
    free(s);
}

/* The sm number of a CUDA device's arch ("sm_90a": 90), 0 elsewhere. */
static int sm_of(const fj_device_info *dev)
{
    return dev->backend == FJ_BACKEND_CUDA ? atoi(dev->arch + 3) : 0;
}

/* Runs one case and prints its line; whether it passed (CACHE cases: on kernel cache_kernel). */
static int run_case(fj_context *ctx, const fp8_case *c, const char *cache_kernel)
{
    const int64_t nq = c->b * c->sq * c->hq * c->d, nk = c->b * c->sk * c->hkv * c->d,
                  nv = c->b * c->sk * c->hkv * c->dv, no = c->b * c->sq * c->hq * c->dv,
                  nl = c->b * c->hq * c->sq, nf = c->b * c->hkv;
    const fj_dtype q_dtype = c->q16 ? c->out : c->in;
    const size_t qs = fj_dtype_size(q_dtype);
    unsigned char *codes[3] = {malloc((size_t)nq * qs), malloc((size_t)nk), malloc((size_t)nv)};
    double *real[3] = {malloc((size_t)nq * 8), malloc((size_t)nk * 8), malloc((size_t)nv * 8)};
    /* Each input's factors, per (batch, kv head): one for all ([1]), or none (1). */
    float factors[3][64];
    for (int t = 0; t < 3; t++) {
        assert_true(codes[t] && real[t] && nf <= 64);
        for (int64_t f = 0; f < nf; f++)
            factors[t][f] = c->descale == 0 || (t == 0 && c->q16) ? 1.0f
                            : c->descale == 1                     ? (float)(0.05 + 0.02 * t)
                                              : (float)(0.03 + 0.01 * (double)((f + t) % 5));
    }
    make_input(c, q_dtype, c->sq, c->hq, c->d, factors[0], codes[0], real[0]);
    make_input(c, c->in, c->sk, c->hkv, c->d, factors[1], codes[1], real[1]);
    make_input(c, c->in, c->sk, c->hkv, c->dv, factors[2], codes[2], real[2]);

    const size_t os = fj_dtype_size(c->out);
    unsigned char *out_host = malloc((size_t)no * os);
    float *lse_host = malloc((size_t)nl * 4);
    assert_true(out_host && lse_host);
    memset(out_host, 0xff, (size_t)no * os); /* NaN in both 16-bit types */
    for (int64_t i = 0; i < nl; i++)
        lse_host[i] = NAN;
    void *dq = upload(ctx, codes[0], (size_t)nq * qs), *dk = upload(ctx, codes[1], (size_t)nk),
         *dv = upload(ctx, codes[2], (size_t)nv), *dout = upload(ctx, out_host, (size_t)no * os),
         *dlse = upload(ctx, lse_host, (size_t)nl * 4);
    void *dfac[3] = {upload(ctx, factors[0], (size_t)nf * 4),
                     upload(ctx, factors[1], (size_t)nf * 4),
                     upload(ctx, factors[2], (size_t)nf * 4)};

    fj_tensor tq = {.data = dq,
                    .dtype = q_dtype,
                    .ndim = 4,
                    .shape = {c->b, c->sq, c->hq, c->d},
                    .stride = {c->sq * c->hq * c->d, c->hq * c->d, c->d, 1}};
    fj_tensor tk = {.data = dk,
                    .dtype = c->in,
                    .ndim = 4,
                    .shape = {c->b, c->sk, c->hkv, c->d},
                    .stride = {c->sk * c->hkv * c->d, c->hkv * c->d, c->d, 1}};
    fj_tensor tv = tk;
    tv.data = dv;
    tv.shape[3] = c->dv;
    tv.stride[0] = c->sk * c->hkv * c->dv;
    tv.stride[1] = c->hkv * c->dv;
    tv.stride[2] = c->dv;
    fj_tensor to = {.data = dout,
                    .dtype = c->out,
                    .ndim = 4,
                    .shape = {c->b, c->sq, c->hq, c->dv},
                    .stride = {c->sq * c->hq * c->dv, c->hq * c->dv, c->dv, 1}};
    fj_tensor tl = {.data = dlse,
                    .dtype = FJ_DTYPE_F32,
                    .ndim = 3,
                    .shape = {c->b, c->hq, c->sq},
                    .stride = {c->hq * c->sq, c->sq, 1}};
    fj_tensor tf[3];
    for (int t = 0; t < 3; t++)
        tf[t] = c->descale == 1 ? (fj_tensor){.data = dfac[t],
                                              .dtype = FJ_DTYPE_F32,
                                              .ndim = 1,
                                              .shape = {1},
                                              .stride = {1}}
                                : (fj_tensor){.data = dfac[t],
                                              .dtype = FJ_DTYPE_F32,
                                              .ndim = 2,
                                              .shape = {c->b, c->hkv},
                                              .stride = {c->hkv, 1}};
    fj_attention_desc desc;
    fj_attention_desc_init(&desc);
    desc.causal = c->causal;
    if (c->descale) {
        desc.q_descale = c->q16 ? NULL : &tf[0];
        desc.k_descale = &tf[1];
        desc.v_descale = &tf[2];
    }
    fj_status st = fj_attention_forward(ctx, &desc, &tq, &tk, &tv, &to, &tl, NULL);
    if (st != FJ_OK)
        fail_msg("fj_attention_forward: %s", fj_context_last_error(ctx));
    assert_int_equal(fj_memcpy_d2h(ctx, out_host, dout, (size_t)no * os), FJ_OK);
    assert_int_equal(fj_memcpy_d2h(ctx, lse_host, dlse, (size_t)nl * 4), FJ_OK);

    /* Every element against the reference; the error bar: twice the plain implementation's,
    ** plus out's rounding at the largest magnitude. lse: relative error 1e-4 plus 2^-9 of the
    ** row's largest sum of |q_i k_i| (times the scale), since Hopper's tensor cores add FP8
    ** products with about 13 bits of mantissa, rounding at each of a sum's ~log2(d) levels
    ** (measured: up to 1.3 x 2^-11); lse_err is the error over that bar. Through 16-bit copies
    ** the bar is 2^-8: q's copy (times q's and k's factors) rounds each element by up to 2^-9
    ** in bf16, and every score with it (the case asks for them, or the plan chose them: the
    ** call launched the dequantising kernel). */
    const fj_call_info info = last_call(ctx);
    const int copies = c->dequant || (info.launched && strstr(info.launched, "dequant"));
    double err = 0, plain_err = 0, ref_max = 0, lse_err = 0, magnitude = 0;
    int64_t bad = 0;
    double ref[512], plain[512], ref_lse;
    assert_true(c->dv <= 512);
    const double scale = 1.0 / sqrt((double)c->d);
    for (int64_t b = 0; b < c->b; b++)
        for (int64_t h = 0; h < c->hq; h++)
            for (int64_t i = 0; i < c->sq; i++) {
                reference_row(c, real[0], real[1], real[2], b, h, i, scale, ref, &ref_lse, plain,
                              &magnitude);
                for (int64_t e = 0; e < c->dv; e++) {
                    const double got = fjr_load(
                        c->out,
                        out_host + (size_t)(((b * c->sq + i) * c->hq + h) * c->dv + e) * os);
                    if (!isfinite(got))
                        bad++;
                    err = fmax(err, fabs(got - ref[e]));
                    plain_err = fmax(plain_err, fabs(plain[e] - ref[e]));
                    ref_max = fmax(ref_max, fabs(ref[e]));
                }
                const double got_lse = lse_host[(b * c->hq + h) * c->sq + i];
                if (isinf(ref_lse))
                    bad += !(isinf(got_lse) && got_lse < 0);
                else
                    lse_err = fmax(lse_err, fabs(got_lse - ref_lse) /
                                                (1e-4 * fmax(1.0, fabs(ref_lse)) +
                                                 ldexp(magnitude, copies ? -8 : -9)));
            }
    const double rounding = ref_max * (c->out == FJ_DTYPE_BF16 ? 1.0 / 256 : 1.0 / 2048);
    fj_device_info dev = {.struct_size = sizeof dev};
    assert_int_equal(fj_context_get_device_info(ctx, &dev), FJ_OK);
    const char *path = info.kernel_path ? info.kernel_path : "";
    const int path_ok =
        c->kernel == HOPPER   ? strcmp(dev.arch, "sm_90a") != 0 || !strcmp(path, "cuda.fwd.wgmma")
        : c->kernel == CACHE ? sm_of(&dev) < 80 || !strcmp(path, cache_kernel)
                             : 1;
    const int ok = bad == 0 && err <= 2 * plain_err + rounding && lse_err <= 1 &&
                   plain_err > 0 && path_ok;
    printf(
        "  %s %s%s -> %s descale %d causal %d b %lld sq %lld sk %lld hq %lld hkv %lld d %lld/%lld"
        " | err %.3g (plain fp8 %.3g, of %.3g) lse %.2g of its bar, %lld bad | %s%s\n",
        ok ? "ok  " : "FAIL", c->q16 ? "q 16-bit, kv " : "",
        c->in == FJ_DTYPE_F8_E4M3 ? "e4m3" : "e5m2", c->out == FJ_DTYPE_BF16 ? "bf16" : "f16",
        c->descale, c->causal, (long long)c->b, (long long)c->sq, (long long)c->sk,
        (long long)c->hq, (long long)c->hkv, (long long)c->d, (long long)c->dv, err, plain_err,
        ref_max, lse_err, (long long)bad, info.kernel_path ? info.kernel_path : "",
        copies ? " (16-bit copies)" : "");
    for (int t = 0; t < 3; t++) {
        free(codes[t]);
        free(real[t]);
        fj_free(ctx, dfac[t]);
    }
    void *bufs[5] = {dq, dk, dv, dout, dlse};
    for (int i = 0; i < 5; i++)
        fj_free(ctx, bufs[i]);
    free(out_host);
    free(lse_host);
    return ok;
}

/* Both formats, both 16-bit outputs, every descale shape, causal and not, GQA, odd sizes,
** d != dv; and an FP8 KV cache read by 16-bit queries: decode shapes (on CUDA those marked run
** the tensor-core decode kernel, or its other forms (test_fp8_cache_kernels), whose rows are
** 16-byte multiples: d 48 to 256, d != dv, GQA groups of 4 to 8 rows and beyond a block's 32
** (16 causal rows of 4 heads), 5000 keys in splits, the tensor-core kernel's cp.async loaders
** (columns, pieces at 48 / 80); d 72 / 40 the portable one) and a prefill.
** On Hopper those marked (rows of 16-byte multiples) run its FP8 kernel: several key
** and query tiles, partial last tiles, d 64 to 256 (beyond 128 with S summed by panels in key
** parts of 64, or of 16 at dv 256: before, d 192 and 256 had 3x the plain error here), dv up
** to 256 (its plain loop; with a lazy rescale two cases had 2.8x the plain error), d != dv,
** more queries than keys under causal masking. */
static const fp8_case forward_cases[] = {
    {FJ_DTYPE_F8_E4M3, FJ_DTYPE_BF16, 0, 2, 0, 2, 37, 70, 4, 2, 40, 24, ANY_KERNEL, 0},
    {FJ_DTYPE_F8_E4M3, FJ_DTYPE_F16, 0, 1, 1, 2, 70, 45, 2, 1, 64, 64, ANY_KERNEL, 0},
    {FJ_DTYPE_F8_E5M2, FJ_DTYPE_BF16, 0, 0, 1, 1, 33, 33, 6, 3, 32, 48, ANY_KERNEL, 0},
    {FJ_DTYPE_F8_E5M2, FJ_DTYPE_F16, 0, 2, 0, 3, 17, 129, 2, 2, 16, 16, ANY_KERNEL, 0},
    {FJ_DTYPE_F8_E4M3, FJ_DTYPE_BF16, 0, 2, 1, 1, 65, 200, 4, 1, 128, 128, ANY_KERNEL, 0},
    {FJ_DTYPE_F8_E4M3, FJ_DTYPE_BF16, 1, 2, 0, 2, 1, 300, 8, 2, 64, 64, CACHE, 0},
    {FJ_DTYPE_F8_E5M2, FJ_DTYPE_F16, 1, 1, 1, 1, 4, 129, 4, 1, 128, 64, CACHE, 0},
    {FJ_DTYPE_F8_E4M3, FJ_DTYPE_BF16, 1, 2, 0, 2, 1, 5000, 32, 8, 128, 128, CACHE, 0},
    {FJ_DTYPE_F8_E5M2, FJ_DTYPE_BF16, 1, 1, 1, 2, 3, 777, 8, 1, 256, 256, CACHE, 0},
    {FJ_DTYPE_F8_E4M3, FJ_DTYPE_F16, 1, 1, 1, 2, 16, 700, 8, 2, 48, 80, CACHE, 0},
    {FJ_DTYPE_F8_E5M2, FJ_DTYPE_BF16, 1, 2, 0, 3, 2, 2100, 16, 2, 192, 128, CACHE, 0},
    {FJ_DTYPE_F8_E4M3, FJ_DTYPE_F16, 1, 0, 1, 1, 2, 100, 6, 2, 72, 40, ANY_KERNEL, 0},
    {FJ_DTYPE_F8_E4M3, FJ_DTYPE_F16, 1, 2, 1, 2, 50, 80, 4, 2, 32, 32, ANY_KERNEL, 0},
    {FJ_DTYPE_F8_E4M3, FJ_DTYPE_BF16, 0, 2, 1, 2, 300, 517, 4, 2, 128, 128, HOPPER, 0},
    {FJ_DTYPE_F8_E5M2, FJ_DTYPE_F16, 0, 1, 0, 1, 257, 1000, 2, 1, 128, 256, HOPPER, 0},
    {FJ_DTYPE_F8_E5M2, FJ_DTYPE_F16, 0, 1, 0, 1, 257, 1000, 2, 1, 256, 256, HOPPER, 0},
    {FJ_DTYPE_F8_E4M3, FJ_DTYPE_BF16, 0, 0, 0, 2, 200, 384, 2, 2, 64, 64, HOPPER, 0},
    {FJ_DTYPE_F8_E4M3, FJ_DTYPE_BF16, 0, 2, 1, 1, 129, 260, 3, 1, 192, 128, HOPPER, 0},
    {FJ_DTYPE_F8_E4M3, FJ_DTYPE_BF16, 0, 2, 1, 2, 200, 333, 8, 2, 256, 128, HOPPER, 0},
    {FJ_DTYPE_F8_E4M3, FJ_DTYPE_BF16, 0, 1, 1, 1, 300, 517, 2, 1, 256, 256, HOPPER, 0},
    {FJ_DTYPE_F8_E5M2, FJ_DTYPE_F16, 0, 0, 0, 1, 150, 700, 4, 4, 160, 256, HOPPER, 0},
    {FJ_DTYPE_F8_E4M3, FJ_DTYPE_BF16, 0, 2, 1, 1, 129, 260, 3, 1, 96, 192, HOPPER, 0},
    {FJ_DTYPE_F8_E5M2, FJ_DTYPE_BF16, 0, 1, 1, 2, 300, 130, 2, 2, 64, 96, HOPPER, 0},
    {FJ_DTYPE_F8_E4M3, FJ_DTYPE_F16, 0, 2, 0, 1, 64, 2048, 8, 2, 128, 128, HOPPER, 0},
};

/* Runs forward_cases on ctx: each within the plain FP8 error's bar, and on Hopper those marked
** after the plan's step that transposes v (dense requests) or without it, as `stepped` says.
** Returns the number of failures. */
static int run_forward_cases(fj_context *ctx, int stepped)
{
    fj_device_info dev = {.struct_size = sizeof dev};
    assert_int_equal(fj_context_get_device_info(ctx, &dev), FJ_OK);
    const int hopper = !strcmp(dev.arch, "sm_90a");
    int failed = 0;
    for (size_t i = 0; i < sizeof forward_cases / sizeof forward_cases[0]; i++) {
        const fp8_case *c = &forward_cases[i];
        failed += !run_case(ctx, c, "cuda.decode.mma");
        const fj_call_info info = last_call(ctx);
        const int transposed = info.launched && strstr(info.launched, "cuda.transpose_v");
        if (hopper && c->kernel == HOPPER && transposed != stepped) {
            printf("  case %zu: launched %s, %s\n", i, info.launched ? info.launched : "",
                   stepped ? "no transposing step" : "a transposing step");
            failed++;
        }
    }
    return failed;
}

/* The cases as planned: on Hopper v transposed by a plan step ahead of the FP8 kernel. */
static void test_fp8_forward(void **state)
{
    assert_int_equal(run_forward_cases(suite_context(state), 1), 0);
}

/* The same cases with the FP8 kernel's own transposing warps (FLASHJIT_CONFIG=v_transposed=0,
** what packed sequences take): every case within the plain FP8 error's bar; elsewhere the
** option changes nothing. */
static void test_fp8_own_transposer(void **state)
{
    (void)state;
    fj_context *ctx = suite_context_with_env("FLASHJIT_CONFIG", "v_transposed=0");
    const int failed = run_forward_cases(ctx, 0);
    fj_context_destroy(ctx);
    assert_int_equal(failed, 0);
}

/* The FP8 cache cases on the decode kernels' other forms: the vector kernel, which converts
** the cache in registers (FLASHJIT_CONFIG=path=vec), and the tensor-core kernel's rows by bulk
** copies (bulk=1: the tuner's other copy on sm_90); every case within the plain FP8 error's
** bar. */
static void test_fp8_cache_kernels(void **state)
{
    (void)state;
    static const char *const configs[][2] = {{"path=vec", "cuda.decode.vec"},
                                             {"bulk=1", "cuda.decode.mma"}};
    int failed = 0, ran = 0;
    for (int k = 0; k < 2; k++) {
        fj_context *ctx = suite_context_with_env("FLASHJIT_CONFIG", configs[k][0]);
        printf(" FLASHJIT_CONFIG=%s\n", configs[k][0]);
        for (size_t i = 0; i < sizeof forward_cases / sizeof forward_cases[0]; i++)
            if (forward_cases[i].kernel == CACHE) {
                failed += !run_case(ctx, &forward_cases[i], configs[k][1]);
                ran++;
            }
        fj_context_destroy(ctx);
    }
    assert_true(ran >= 8);
    assert_int_equal(failed, 0);
}

/* FP8 q, k and v through 16-bit copies ahead of the 16-bit forward, forced (FLASHJIT_CONFIG=
** dequant=1; by default only where the SIMT forward would run): both formats and outputs,
** every descale shape (q's by its kv head), GQA, causal, rows of any width, d != dv, d 256 and
** beyond; every case within the plain FP8 error's bar, and the call's workspace holds the
** three copies. */
static void test_fp8_dequantised(void **state)
{
    (void)state;
    fj_context *ctx = suite_context_with_env("FLASHJIT_CONFIG", "dequant=1");
    const fp8_case cases[] = {
        {FJ_DTYPE_F8_E4M3, FJ_DTYPE_BF16, 0, 2, 0, 2, 37, 70, 4, 2, 40, 24, ANY_KERNEL, 1},
        {FJ_DTYPE_F8_E5M2, FJ_DTYPE_F16, 0, 1, 1, 1, 70, 45, 2, 1, 64, 64, ANY_KERNEL, 1},
        {FJ_DTYPE_F8_E4M3, FJ_DTYPE_BF16, 0, 0, 1, 1, 65, 200, 6, 3, 128, 96, ANY_KERNEL, 1},
        {FJ_DTYPE_F8_E5M2, FJ_DTYPE_BF16, 0, 2, 1, 2, 129, 260, 8, 2, 256, 256, ANY_KERNEL, 1},
        {FJ_DTYPE_F8_E4M3, FJ_DTYPE_F16, 0, 1, 0, 1, 40, 77, 2, 1, 320, 264, ANY_KERNEL, 1},
    };
    int failed = 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const fp8_case *c = &cases[i];
        failed += !run_case(ctx, c, NULL);
        const fj_call_info info = last_call(ctx);
        const uint64_t copies =
            (uint64_t)c->b * (c->sq * c->hq * c->d + c->sk * c->hkv * (c->d + c->dv)) * 2;
        if (info.workspace_bytes < copies) {
            printf("  case %zu: workspace %llu bytes, less than the copies' %llu\n", i,
                   (unsigned long long)info.workspace_bytes, (unsigned long long)copies);
            failed++;
        }
    }
    fj_context_destroy(ctx);
    assert_int_equal(failed, 0);
}

/* The backward of FP8 attention is refused, naming q.dtype. */
static void test_fp8_backward_unsupported(void **state)
{
    fj_context *ctx = suite_context(state);
    static _Alignas(16) unsigned char storage[256];
    fj_tensor q = {.data = storage,
                   .dtype = FJ_DTYPE_F8_E4M3,
                   .ndim = 4,
                   .shape = {1, 4, 1, 16},
                   .stride = {64, 16, 16, 1}};
    fj_tensor out = q, lse = {.data = storage,
                              .dtype = FJ_DTYPE_F32,
                              .ndim = 3,
                              .shape = {1, 1, 4},
                              .stride = {4, 4, 1}};
    out.dtype = FJ_DTYPE_BF16;
    fj_tensor dq = out;
    assert_int_equal(
        fj_attention_backward(ctx, NULL, &q, &q, &q, &out, &out, &lse, &dq, &dq, &dq, NULL),
        FJ_ERR_UNSUPPORTED);
    assert_non_null(strstr(fj_context_last_error(ctx), "q.dtype = f8e4m3"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_host_conversions),
        cmocka_unit_test(test_fp8_forward),
        cmocka_unit_test(test_fp8_own_transposer),
        cmocka_unit_test(test_fp8_cache_kernels),
        cmocka_unit_test(test_fp8_dequantised),
        cmocka_unit_test(test_fp8_backward_unsupported),
    };
    return suite_run("fp8", tests);
}
