/* fj_kv_cache_append, _packed and _quantized on one backend (FJ_TEST_BACKEND): new keys and
** values land at each sequence's length in its shuffled pages, bit for bit (or rounded into
** another cache dtype exactly as the host rounds, FP8 with descale factors), nothing else in
** the caches changes (positions beyond a sequence's pages and rows of no sequence are dropped);
** bad arguments are named. Without a device of that backend the suite skips. */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend_suite.h"
#include "random.h"
#include "reference.h"

enum { B = 4, TOKENS = 3, HKV = 2, D = 24, DV = 40, PAGE = 4, MAX_PAGES = 5 };
enum { NUM_PAGES = B * MAX_PAGES + 2 };


/* A host buffer of random elements of es bytes (never NaN: the top bits of each kept low). */
static unsigned char *random_bytes(size_t elements, size_t es, uint64_t *rng)
{
    unsigned char *p = malloc(elements * es);
    assert_non_null(p);
    for (size_t i = 0; i < elements * es; i++)
        p[i] = (unsigned char)(fjr_splitmix(rng) & ((i % es) == es - 1 ? 0x3f : 0xff));
    return p;
}

static void tensor4(fj_tensor *t, void *data, fj_dtype dtype, const int64_t shape[4],
                    const int64_t stride[4])
{
    memset(t, 0, sizeof *t);
    t->data = data;
    t->dtype = dtype;
    t->ndim = 4;
    memcpy(t->shape, shape, sizeof t->shape);
    memcpy(t->stride, stride, sizeof t->stride);
}

static void *upload(fj_context *ctx, const void *host, size_t bytes)
{
    void *dev = NULL;
    assert_int_equal(fj_malloc(ctx, bytes, &dev), FJ_OK);
    assert_int_equal(fj_memcpy_h2d(ctx, dev, host, bytes), FJ_OK);
    return dev;
}

/* New tokens packed for fj_kv_cache_append_packed: sequence b's are rows FIRST[b] to FIRST[b + 1]
** - 1 of PACKED_ROWS; rows 0 and 10 belong to no sequence, sequence 1 adds none, sequence 2's
** last two fall beyond its pages. */
enum { PACKED_ROWS = 11 };
static const int32_t FIRST[B + 1] = {1, 3, 3, 8, 10};

/* New tokens for a cache of another dtype: elements of dtype nt (es bytes) from 2^-24 to 2^13
** in magnitude, both signs, and every 61st a special value (NaN, infinities, zeros, beyond
** FP8's range), so that rounding, subnormals and saturation are all exercised. */
static unsigned char *random_values(size_t elements, fj_dtype nt, size_t es, uint64_t *rng)
{
    static const float special[] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1e5f, -70000.0f};
    unsigned char *p = malloc(elements * es);
    assert_non_null(p);
    for (size_t i = 0; i < elements; i++) {
        const uint64_t r = fjr_splitmix(rng);
        float x = (float)ldexp(1.0 + fjr_unit(r >> 11), (int)(r % 38) - 24);
        if (r & (1u << 6))
            x = -x;
        if (i % 61 == 60)
            x = special[(i / 61) % (sizeof special / sizeof special[0])];
        fjr_store(nt, p + i * es, x);
    }
    return p;
}

/* How an append is given its descale factors (for tokens rounded into an FP8 cache). */
enum descale_kind { NO_DESCALE, ONE_FACTOR, PER_HEAD_AND_SEQUENCE, PER_HEAD, HEADS_ONLY };
static const char *const descale_names[] = {
    "", ", one descale factor", ", descale factors [b, hkv]",
    ", descale factors [b, hkv], batch stride 0", ", descale factors [hkv]"};

/* Descale factors for k (i 0) or v (1), [B, HKV] (stride 0 over the batch for PER_HEAD, the
** first HKV alone for HEADS_ONLY, all one for ONE_FACTOR): f32 between 1/16 and 4, some powers
** of two (exact divisions). */
static void descale_factors(enum descale_kind kind, float f[B * HKV], uint64_t *rng)
{
    for (int i = 0; i < B * HKV; i++) {
        const uint64_t r = fjr_splitmix(rng);
        f[i] = r & 1 ? (float)ldexp(1.0, (int)(r >> 1) % 7 - 4)
                     : (float)(0.0625 + 3.9 * fjr_unit(r >> 11));
    }
    for (int i = 0; i < B * HKV; i++)
        f[i] = kind == ONE_FACTOR ? f[0] : kind >= PER_HEAD ? f[i % HKV] : f[i];
}

/* Appends tokens of dtype nt to caches of dtype dt, dense ([B, TOKENS, ...] with padded token
** rows) or packed, and checks every byte of both caches: the new rows where they belong, nothing
** else changed. Tokens of the caches' dtype must arrive bit for bit; others rounded as the host
** rounds x / factor (fjr_store). */
static void check_append(fj_context *ctx, fj_dtype nt, fj_dtype dt, int packed,
                         enum descale_kind dk, uint64_t *rng)
{
    /* Lengths before the append: empty, mid-page, and one whose last tokens fall beyond its
    ** pages (19 + 3 > 5 pages of 4: positions 20 and 21 are dropped; packed 17 + 5). */
    const int32_t used[B] = {0, 5, packed ? 17 : 19, 11};
    const size_t es = fj_dtype_size(dt), ns = fj_dtype_size(nt);
    const int64_t rows = packed ? PACKED_ROWS : B * TOKENS; /* token rows of k_new, v_new */
    const int64_t kn_row = HKV * D + 8, vn_row = HKV * DV; /* elements between token rows */
    const int64_t kc_shape[4] = {NUM_PAGES, PAGE, HKV, D}, vc_shape[4] = {NUM_PAGES, PAGE, HKV, DV};
    const int64_t kc_stride[4] = {PAGE * HKV * D, HKV * D, D, 1};
    const int64_t vc_stride[4] = {PAGE * HKV * DV, HKV * DV, DV, 1};
    const size_t kn_n = (size_t)(rows * kn_row), vn_n = (size_t)(rows * vn_row);
    const size_t kc_n = (size_t)(NUM_PAGES * kc_stride[0]);
    const size_t vc_n = (size_t)(NUM_PAGES * vc_stride[0]);
    unsigned char *kn = nt == dt ? random_bytes(kn_n, es, rng) : random_values(kn_n, nt, ns, rng);
    unsigned char *vn = nt == dt ? random_bytes(vn_n, es, rng) : random_values(vn_n, nt, ns, rng);
    unsigned char *kc = random_bytes(kc_n, es, rng), *vc = random_bytes(vc_n, es, rng);
    float factors[2][B * HKV];
    for (int i = 0; i < 2; i++)
        descale_factors(dk, factors[i], rng);
    int32_t table[B * MAX_PAGES];
    int32_t perm[NUM_PAGES];
    for (int i = 0; i < NUM_PAGES; i++)
        perm[i] = i;
    for (int i = NUM_PAGES - 1; i > 0; i--) {
        const int j = (int)(fjr_splitmix(rng) % (uint64_t)(i + 1));
        const int32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    memcpy(table, perm, sizeof table);
    /* The expected caches: the old ones with the new rows written where they belong. */
    unsigned char *want[2] = {malloc(kc_n * es), malloc(vc_n * es)};
    assert_non_null(want[0]);
    assert_non_null(want[1]);
    memcpy(want[0], kc, kc_n * es);
    memcpy(want[1], vc, vc_n * es);
    const unsigned char *from[2] = {kn, vn};
    const int64_t from_row[2] = {kn_row, vn_row}, dim[2] = {D, DV};
    const int64_t *cache_stride[2] = {kc_stride, vc_stride};
    for (int b = 0; b < B; b++) {
        const int tokens = packed ? FIRST[b + 1] - FIRST[b] : TOKENS;
        for (int t = 0; t < tokens; t++) {
            const int pos = used[b] + t;
            const int64_t r = packed ? FIRST[b] + t : b * TOKENS + t; /* its row of k_new */
            if (pos >= MAX_PAGES * PAGE)
                continue;
            const int64_t page = table[b * MAX_PAGES + pos / PAGE], row = pos % PAGE;
            for (int kv = 0; kv < 2; kv++)
                for (int h = 0; h < HKV; h++)
                    for (int64_t c = 0; c < dim[kv]; c++) {
                        const int64_t *cs = cache_stride[kv];
                        unsigned char *to =
                            want[kv] + (size_t)(page * cs[0] + row * cs[1] + h * cs[2] + c) * es;
                        const unsigned char *x =
                            from[kv] + (size_t)(r * from_row[kv] + h * dim[kv] + c) * ns;
                        if (nt == dt)
                            memcpy(to, x, es);
                        else
                            fjr_store(dt, to,
                                      fjr_load(nt, x) /
                                          (dk == NO_DESCALE ? 1.0f : factors[kv][b * HKV + h]));
                    }
        }
    }
    void *d_kn = upload(ctx, kn, kn_n * ns), *d_vn = upload(ctx, vn, vn_n * ns);
    void *d_kc = upload(ctx, kc, kc_n * es), *d_vc = upload(ctx, vc, vc_n * es);
    void *d_table = upload(ctx, table, sizeof table), *d_used = upload(ctx, used, sizeof used);
    void *d_first = upload(ctx, FIRST, sizeof FIRST);
    void *d_factors = upload(ctx, factors, sizeof factors);
    fj_tensor tkn, tvn, tkc, tvc;
    const int64_t kn_shape[4] = {B, TOKENS, HKV, D}, vn_shape[4] = {B, TOKENS, HKV, DV};
    const int64_t kn_stride[4] = {TOKENS * kn_row, kn_row, D, 1};
    const int64_t vn_stride[4] = {TOKENS * vn_row, vn_row, DV, 1};
    tensor4(&tkn, d_kn, nt, kn_shape, kn_stride);
    tensor4(&tvn, d_vn, nt, vn_shape, vn_stride);
    if (packed) { /* [rows, HKV, dim], token rows as the dense ones */
        tkn = (fj_tensor){.data = d_kn,
                          .dtype = nt,
                          .ndim = 3,
                          .shape = {PACKED_ROWS, HKV, D},
                          .stride = {kn_row, D, 1}};
        tvn = (fj_tensor){.data = d_vn,
                          .dtype = nt,
                          .ndim = 3,
                          .shape = {PACKED_ROWS, HKV, DV},
                          .stride = {vn_row, DV, 1}};
    }
    tensor4(&tkc, d_kc, dt, kc_shape, kc_stride);
    tensor4(&tvc, d_vc, dt, vc_shape, vc_stride);
    const fj_tensor ttable = {.data = d_table, .dtype = FJ_DTYPE_I32, .ndim = 2,
                              .shape = {B, MAX_PAGES}, .stride = {MAX_PAGES, 1}};
    const fj_tensor tused = {
        .data = d_used, .dtype = FJ_DTYPE_I32, .ndim = 1, .shape = {B}, .stride = {1}};
    const fj_tensor tfirst = {
        .data = d_first, .dtype = FJ_DTYPE_I32, .ndim = 1, .shape = {B + 1}, .stride = {1}};
    fj_tensor tdescale[2];
    for (int i = 0; i < 2; i++) {
        float *f = (float *)d_factors + i * B * HKV;
        tdescale[i] = dk == ONE_FACTOR || dk == HEADS_ONLY
                          ? (fj_tensor){.data = f,
                                        .dtype = FJ_DTYPE_F32,
                                        .ndim = 1,
                                        .shape = {dk == ONE_FACTOR ? 1 : HKV},
                                        .stride = {1}}
                          : (fj_tensor){.data = f,
                                        .dtype = FJ_DTYPE_F32,
                                        .ndim = 2,
                                        .shape = {B, HKV},
                                        .stride = {dk == PER_HEAD ? 0 : HKV, 1}};
    }
    const fj_tensor *first = packed ? &tfirst : NULL;
    const char *fn = dk != NO_DESCALE ? "fj_kv_cache_append_quantized"
                     : packed         ? "fj_kv_cache_append_packed"
                                      : "fj_kv_cache_append";
    fj_status st =
        dk != NO_DESCALE
            ? fj_kv_cache_append_quantized(ctx, &tkn, &tvn, first, &tdescale[0], &tdescale[1], &tkc,
                                           &tvc, &ttable, &tused, NULL)
        : packed
            ? fj_kv_cache_append_packed(ctx, &tkn, &tvn, &tfirst, &tkc, &tvc, &ttable, &tused, NULL)
            : fj_kv_cache_append(ctx, &tkn, &tvn, &tkc, &tvc, &ttable, &tused, NULL);
    if (st != FJ_OK)
        fail_msg("%s: %s", fn, fj_context_last_error(ctx));
    assert_int_equal(fj_synchronize(ctx, NULL), FJ_OK);
    assert_int_equal(fj_memcpy_d2h(ctx, kc, d_kc, kc_n * es), FJ_OK);
    assert_int_equal(fj_memcpy_d2h(ctx, vc, d_vc, vc_n * es), FJ_OK);
    const unsigned char *got[2] = {kc, vc};
    const size_t n[2] = {kc_n, vc_n};
    for (int kv = 0; kv < 2; kv++)
        for (size_t i = 0; i < n[kv]; i++) {
            const unsigned char *g = got[kv] + i * es, *w = want[kv] + i * es;
            /* any NaN for a NaN rounded (a bit copy keeps its bits) */
            if (memcmp(g, w, es) &&
                (nt == dt || !isnan(fjr_load(dt, g)) || !isnan(fjr_load(dt, w))))
                fail_msg("%s, %s into %s: %s cache element %zu = %g, expected %g", fn,
                         fjh_dtype_name(nt), fjh_dtype_name(dt), kv ? "v" : "k", i,
                         (double)fjr_load(dt, g), (double)fjr_load(dt, w));
        }
    printf("  ok   %s into %s: %d sequences x %s tokens into %d shuffled pages of %d%s\n",
           fjh_dtype_name(nt), fjh_dtype_name(dt), B, packed ? "2, 0, 5, 2 packed" : "3", NUM_PAGES,
           PAGE, descale_names[dk]);
    void *devs[8] = {d_kn, d_vn, d_kc, d_vc, d_table, d_used, d_first, d_factors};
    for (int i = 0; i < 8; i++)
        fj_free(ctx, devs[i]);
    free(kn);
    free(vn);
    free(kc);
    free(vc);
    free(want[0]);
    free(want[1]);
}

/* Appends to caches of each dtype (FP8 caches too: the tokens already quantised), dense and
** packed. */
static void test_append_lands_in_pages(void **state)
{
    fj_context *ctx = suite_context(state);
    static const fj_dtype dtypes[] = {FJ_DTYPE_BF16, FJ_DTYPE_F16, FJ_DTYPE_F32,
                                      FJ_DTYPE_F8_E4M3, FJ_DTYPE_F8_E5M2};
    uint64_t rng = 0x5eed;
    for (int packed = 0; packed <= 1; packed++)
        for (size_t di = 0; di < sizeof dtypes / sizeof dtypes[0]; di++)
            check_append(ctx, dtypes[di], dtypes[di], packed, NO_DESCALE, &rng);
}

/* f16, bf16 and f32 tokens quantised into FP8 caches (with each form of descale factors, and
** none), and rounded into 16-bit and f32 caches of another dtype, dense and packed. */
static void test_append_rounds_into_the_cache_dtype(void **state)
{
    fj_context *ctx = suite_context(state);
    static const fj_dtype news[] = {FJ_DTYPE_BF16, FJ_DTYPE_F16, FJ_DTYPE_F32};
    static const fj_dtype fp8[] = {FJ_DTYPE_F8_E4M3, FJ_DTYPE_F8_E5M2};
    uint64_t rng = 0x9a17;
    for (int packed = 0; packed <= 1; packed++)
        for (int ni = 0; ni < 3; ni++) {
            for (int fi = 0; fi < 2; fi++)
                for (int dk = NO_DESCALE; dk <= HEADS_ONLY; dk++)
                    check_append(ctx, news[ni], fp8[fi], packed, (enum descale_kind)dk, &rng);
            check_append(ctx, news[ni], news[(ni + 1) % 3], packed, NO_DESCALE, &rng);
        }
}

/* Bad arguments are refused with the argument named (nothing is launched: validation comes
** first, so the data pointers are never read). */
static void test_bad_arguments(void **state)
{
    fj_context *ctx = suite_context(state);
    /* Addresses never read, 1 MiB apart so that only the case that means to overlaps. */
    char *a = (char *)(uintptr_t)(1u << 20);
    const int64_t kn_shape[4] = {2, 3, 2, 8}, kc_shape[4] = {6, 4, 2, 8};
    const int64_t kn_stride[4] = {48, 16, 8, 1}, kc_stride[4] = {64, 16, 8, 1};
    fj_tensor kn, vn, kc, vc;
    tensor4(&kn, a, FJ_DTYPE_BF16, kn_shape, kn_stride);
    tensor4(&vn, a + (1 << 20), FJ_DTYPE_BF16, kn_shape, kn_stride);
    tensor4(&kc, a + (2 << 20), FJ_DTYPE_BF16, kc_shape, kc_stride);
    tensor4(&vc, a + (3 << 20), FJ_DTYPE_BF16, kc_shape, kc_stride);
    fj_tensor table = {.data = a + (4 << 20), .dtype = FJ_DTYPE_I32, .ndim = 2, .shape = {2, 3},
                       .stride = {3, 1}};
    fj_tensor used = {
        .data = a + (5 << 20), .dtype = FJ_DTYPE_I32, .ndim = 1, .shape = {2}, .stride = {1}};
    fj_tensor bad;
    /* v_cache of another dtype */
    bad = vc;
    bad.dtype = FJ_DTYPE_F16;
    assert_int_equal(fj_kv_cache_append(ctx, &kn, &vn, &kc, &bad, &table, &used, NULL),
                     FJ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fj_context_last_error(ctx), "v_cache.dtype = f16 differs"));
    /* v_cache with another page size */
    bad = vc;
    bad.shape[1] = 8;
    assert_int_equal(fj_kv_cache_append(ctx, &kn, &vn, &kc, &bad, &table, &used, NULL),
                     FJ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fj_context_last_error(ctx), "v_cache.shape[1] (page_size"));
    /* a page table of another dtype, or batch */
    bad = table;
    bad.dtype = FJ_DTYPE_F32;
    assert_int_equal(fj_kv_cache_append(ctx, &kn, &vn, &kc, &vc, &bad, &used, NULL),
                     FJ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fj_context_last_error(ctx), "page_table.dtype = f32, expected i32"));
    bad = table;
    bad.shape[0] = 3;
    assert_int_equal(fj_kv_cache_append(ctx, &kn, &vn, &kc, &vc, &bad, &used, NULL),
                     FJ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fj_context_last_error(ctx), "page_table.shape[0] (batch"));
    /* seqused_k missing */
    assert_int_equal(fj_kv_cache_append(ctx, &kn, &vn, &kc, &vc, &table, NULL, NULL),
                     FJ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fj_context_last_error(ctx), "seqused_k is NULL"));
    /* the new keys inside the cache */
    bad = kn;
    bad.data = kc.data;
    assert_int_equal(fj_kv_cache_append(ctx, &bad, &vn, &kc, &vc, &table, &used, NULL),
                     FJ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fj_context_last_error(ctx), "k_cache overlaps k_new"));
    /* Packed: the offsets missing or not i32, the new tokens not [tokens, heads, dim], a page
    ** table of another batch than the offsets' */
    fj_tensor first = {.data = a + (6 << 20), .dtype = FJ_DTYPE_I32, .ndim = 1, .shape = {3},
                       .stride = {1}};
    fj_tensor pk = {.data = kn.data, .dtype = FJ_DTYPE_BF16, .ndim = 3, .shape = {6, 2, 8},
                    .stride = {16, 8, 1}};
    fj_tensor pv = pk;
    pv.data = vn.data;
    assert_int_equal(fj_kv_cache_append_packed(ctx, &pk, &pv, NULL, &kc, &vc, &table, &used, NULL),
                     FJ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fj_context_last_error(ctx), "cu_seqlens_new is NULL"));
    bad = first;
    bad.dtype = FJ_DTYPE_F32;
    assert_int_equal(fj_kv_cache_append_packed(ctx, &pk, &pv, &bad, &kc, &vc, &table, &used, NULL),
                     FJ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fj_context_last_error(ctx), "cu_seqlens_new.dtype = f32, expected i32"));
    assert_int_equal(fj_kv_cache_append_packed(ctx, &kn, &vn, &first, &kc, &vc, &table, &used,
                                               NULL),
                     FJ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fj_context_last_error(ctx), "k_new.ndim = 4, expected 3"));
    bad = first;
    bad.shape[0] = 4;
    assert_int_equal(fj_kv_cache_append_packed(ctx, &pk, &pv, &bad, &kc, &vc, &table, &used, NULL),
                     FJ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fj_context_last_error(ctx),
                           "page_table.shape[0] (batch, as cu_seqlens_new.shape[0] - 1) = 2, "
                           "expected 3"));
    bad = pv;
    bad.shape[0] = 5;
    assert_int_equal(fj_kv_cache_append_packed(ctx, &pk, &bad, &first, &kc, &vc, &table, &used,
                                               NULL),
                     FJ_ERR_INVALID_ARGUMENT);
    assert_non_null(
        strstr(fj_context_last_error(ctx), "v_new.shape[0] (tokens, as k_new.shape[0])"));
    /* Dtypes: the new values of two dtypes, or FP8 into a cache of another dtype */
    bad = vn;
    bad.dtype = FJ_DTYPE_F16;
    assert_int_equal(fj_kv_cache_append(ctx, &kn, &bad, &kc, &vc, &table, &used, NULL),
                     FJ_ERR_INVALID_ARGUMENT);
    assert_non_null(
        strstr(fj_context_last_error(ctx), "v_new.dtype = f16 differs from k_new.dtype = bf16"));
    fj_tensor k8 = kn, v8 = vn;
    k8.dtype = v8.dtype = FJ_DTYPE_F8_E4M3;
    assert_int_equal(fj_kv_cache_append(ctx, &k8, &v8, &kc, &vc, &table, &used, NULL),
                     FJ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fj_context_last_error(ctx),
                           "k_new.dtype = f8e4m3 differs from k_cache.dtype = bf16"));
    /* Descale factors: with a cache that is not FP8, with tokens already FP8, of another shape
    ** or dtype, inside the cache */
    fj_tensor one = {
        .data = a + (7 << 20), .dtype = FJ_DTYPE_F32, .ndim = 1, .shape = {1}, .stride = {1}};
    assert_int_equal(fj_kv_cache_append_quantized(ctx, &kn, &vn, NULL, &one, NULL, &kc, &vc, &table,
                                                  &used, NULL),
                     FJ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fj_context_last_error(ctx),
                           "k_descale: descale factors quantise f16, bf16 or f32 tokens into an "
                           "fp8 cache, and k_new.dtype = bf16, k_cache.dtype = bf16"));
    fj_tensor kc8 = kc, vc8 = vc;
    kc8.dtype = vc8.dtype = FJ_DTYPE_F8_E4M3;
    assert_int_equal(fj_kv_cache_append_quantized(ctx, &k8, &v8, NULL, NULL, &one, &kc8, &vc8,
                                                  &table, &used, NULL),
                     FJ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fj_context_last_error(ctx), "v_descale: descale factors quantise"));
    bad = (fj_tensor){
        .data = one.data, .dtype = FJ_DTYPE_F32, .ndim = 2, .shape = {3, 2}, .stride = {2, 1}};
    assert_int_equal(fj_kv_cache_append_quantized(ctx, &kn, &vn, NULL, &bad, NULL, &kc8, &vc8,
                                                  &table, &used, NULL),
                     FJ_ERR_INVALID_ARGUMENT);
    assert_non_null(
        strstr(fj_context_last_error(ctx), "k_descale.shape[0] (batch) = 3, expected 2"));
    bad = one;
    bad.dtype = FJ_DTYPE_F16;
    assert_int_equal(fj_kv_cache_append_quantized(ctx, &kn, &vn, NULL, NULL, &bad, &kc8, &vc8,
                                                  &table, &used, NULL),
                     FJ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fj_context_last_error(ctx), "v_descale.dtype = f16, expected f32"));
    bad = one;
    bad.data = vc.data;
    assert_int_equal(fj_kv_cache_append_quantized(ctx, &kn, &vn, NULL, &bad, NULL, &kc8, &vc8,
                                                  &table, &used, NULL),
                     FJ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fj_context_last_error(ctx), "v_cache overlaps k_descale"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_append_lands_in_pages),
        cmocka_unit_test(test_append_rounds_into_the_cache_dtype),
        cmocka_unit_test(test_bad_arguments),
    };
    return suite_run("append", tests);
}
