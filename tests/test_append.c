/* fj_kv_cache_append and fj_kv_cache_append_packed on one backend (FJ_TEST_BACKEND): new keys
** and values land at each sequence's length in its shuffled pages, bit for bit, nothing else in
** the caches changes (positions beyond a sequence's pages and rows of no sequence are dropped);
** bad arguments are named. Without a device of that backend the suite skips. */
#define _POSIX_C_SOURCE 200809L
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

/* Appends to caches of dtype dt, dense ([B, TOKENS, ...] with padded token rows) or packed, and
** checks every byte of both caches: the new rows where they belong, nothing else changed. */
static void check_append(fj_context *ctx, fj_dtype dt, int packed, uint64_t *rng)
{
    /* Lengths before the append: empty, mid-page, and one whose last tokens fall beyond its
    ** pages (19 + 3 > 5 pages of 4: positions 20 and 21 are dropped; packed 17 + 5). */
    const int32_t used[B] = {0, 5, packed ? 17 : 19, 11};
    const size_t es = fj_dtype_size(dt);
    const int64_t rows = packed ? PACKED_ROWS : B * TOKENS; /* token rows of k_new, v_new */
    const int64_t kn_row = HKV * D + 8, vn_row = HKV * DV; /* elements between token rows */
    const int64_t kc_shape[4] = {NUM_PAGES, PAGE, HKV, D}, vc_shape[4] = {NUM_PAGES, PAGE, HKV, DV};
    const int64_t kc_stride[4] = {PAGE * HKV * D, HKV * D, D, 1};
    const int64_t vc_stride[4] = {PAGE * HKV * DV, HKV * DV, DV, 1};
    const size_t kn_n = (size_t)(rows * kn_row), vn_n = (size_t)(rows * vn_row);
    const size_t kc_n = (size_t)(NUM_PAGES * kc_stride[0]);
    const size_t vc_n = (size_t)(NUM_PAGES * vc_stride[0]);
    unsigned char *kn = random_bytes(kn_n, es, rng), *vn = random_bytes(vn_n, es, rng);
    unsigned char *kc = random_bytes(kc_n, es, rng), *vc = random_bytes(vc_n, es, rng);
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
    unsigned char *want_k = malloc(kc_n * es), *want_v = malloc(vc_n * es);
    assert_non_null(want_k);
    assert_non_null(want_v);
    memcpy(want_k, kc, kc_n * es);
    memcpy(want_v, vc, vc_n * es);
    for (int b = 0; b < B; b++) {
        const int tokens = packed ? FIRST[b + 1] - FIRST[b] : TOKENS;
        for (int t = 0; t < tokens; t++) {
            const int pos = used[b] + t;
            const int64_t r = packed ? FIRST[b] + t : b * TOKENS + t; /* its row of k_new */
            if (pos >= MAX_PAGES * PAGE)
                continue;
            const int64_t page = table[b * MAX_PAGES + pos / PAGE], row = pos % PAGE;
            for (int h = 0; h < HKV; h++) {
                memcpy(want_k + (size_t)(page * kc_stride[0] + row * kc_stride[1] +
                                         h * kc_stride[2]) * es,
                       kn + (size_t)(r * kn_row + h * D) * es, D * es);
                memcpy(want_v + (size_t)(page * vc_stride[0] + row * vc_stride[1] +
                                         h * vc_stride[2]) * es,
                       vn + (size_t)(r * vn_row + h * DV) * es, DV * es);
            }
        }
    }
    void *d_kn = upload(ctx, kn, kn_n * es), *d_vn = upload(ctx, vn, vn_n * es);
    void *d_kc = upload(ctx, kc, kc_n * es), *d_vc = upload(ctx, vc, vc_n * es);
    void *d_table = upload(ctx, table, sizeof table), *d_used = upload(ctx, used, sizeof used);
    void *d_first = upload(ctx, FIRST, sizeof FIRST);
    fj_tensor tkn, tvn, tkc, tvc;
    const int64_t kn_shape[4] = {B, TOKENS, HKV, D}, vn_shape[4] = {B, TOKENS, HKV, DV};
    const int64_t kn_stride[4] = {TOKENS * kn_row, kn_row, D, 1};
    const int64_t vn_stride[4] = {TOKENS * vn_row, vn_row, DV, 1};
    tensor4(&tkn, d_kn, dt, kn_shape, kn_stride);
    tensor4(&tvn, d_vn, dt, vn_shape, vn_stride);
    if (packed) { /* [rows, HKV, dim], token rows as the dense ones */
        tkn = (fj_tensor){.data = d_kn, .dtype = dt, .ndim = 3, .shape = {PACKED_ROWS, HKV, D},
                          .stride = {kn_row, D, 1}};
        tvn = (fj_tensor){.data = d_vn, .dtype = dt, .ndim = 3, .shape = {PACKED_ROWS, HKV, DV},
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
    fj_status st = packed ? fj_kv_cache_append_packed(ctx, &tkn, &tvn, &tfirst, &tkc, &tvc,
                                                      &ttable, &tused, NULL)
                          : fj_kv_cache_append(ctx, &tkn, &tvn, &tkc, &tvc, &ttable, &tused, NULL);
    if (st != FJ_OK)
        fail_msg("fj_kv_cache_append%s: %s", packed ? "_packed" : "", fj_context_last_error(ctx));
    assert_int_equal(fj_synchronize(ctx, NULL), FJ_OK);
    assert_int_equal(fj_memcpy_d2h(ctx, kc, d_kc, kc_n * es), FJ_OK);
    assert_int_equal(fj_memcpy_d2h(ctx, vc, d_vc, vc_n * es), FJ_OK);
    assert_memory_equal(kc, want_k, kc_n * es);
    assert_memory_equal(vc, want_v, vc_n * es);
    printf("  ok   %s: %d sequences x %s tokens into %d shuffled pages of %d\n",
           dt == FJ_DTYPE_F32    ? "f32"
           : dt == FJ_DTYPE_F16  ? "f16"
           : dt == FJ_DTYPE_BF16 ? "bf16"
                                 : "fp8",
           B,
           packed ? "2, 0, 5, 2 packed" : "3", NUM_PAGES, PAGE);
    void *devs[7] = {d_kn, d_vn, d_kc, d_vc, d_table, d_used, d_first};
    for (int i = 0; i < 7; i++)
        fj_free(ctx, devs[i]);
    free(kn);
    free(vn);
    free(kc);
    free(vc);
    free(want_k);
    free(want_v);
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
            check_append(ctx, dtypes[di], packed, &rng);
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
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_append_lands_in_pages),
        cmocka_unit_test(test_bad_arguments),
    };
    return suite_run("append", tests);
}
