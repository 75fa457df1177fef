/* Decode numerics on one backend (FJ_TEST_BACKEND): forwards of 1 to 16 query rows per sequence,
** which run on the decode kernel (grouped-query heads packed, keys split and merged), against
** the float64 reference on fresh random data with poisoned outputs; every case also checks that
** the decode kernel is the one that ran. Built once per backend; without a device of that
** backend the suite skips. */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend_suite.h"
#include "plan/plan.h"
#include "reference.h"

static fjh_case decode_case(int64_t sq, int64_t sk, int64_t hq, int64_t hkv, int64_t d,
                            fj_dtype dtype)
{
    return fjh_case_of(3, sq, sk, hq, hkv, d, dtype);
}

/* want_decode of the runs below: a decode kernel, another, either, or a decode kernel but for
** chunks of prefill against pages (more rows than decode takes), which run on Hopper's forward
** where it reads their pages (test_paged_prefill checks which). */
enum { WANT_FORWARD = 0, WANT_DECODE = 1, WANT_EITHER = -1, WANT_DECODE_BUT_CHUNKS = 2 };

/* Runs every case on ctx, one line each; returns the failures (on the numerics, or when another
** kernel ran than want_decode asks). */
static int run_cases_in(fj_context *ctx, const fjh_case *cases, size_t n, int want_decode)
{
    int failures = 0;
    for (size_t i = 0; i < n; i++) {
        fjh_result r;
        char desc[512];
        fjh_describe(&cases[i], desc, sizeof desc);
        fjh_run(ctx, &cases[i], &r);
        const int chunk = cases[i].paged && cases[i].seqlen_q > FJ__DECODE_MAX_SEQLEN_Q;
        const int want = want_decode != WANT_DECODE_BUT_CHUNKS ? want_decode
                         : chunk                               ? WANT_EITHER
                                                               : WANT_DECODE;
        const int decoded = strstr(r.kernel_path, ".decode") != NULL;
        const int ok = r.pass && (want < 0 || decoded == want);
        printf("  %s %s | err %.3g (plain %.3g) lse %.3g | %s\n", ok ? "ok  " : "FAIL", desc,
               r.max_abs_err, r.lowp_max_abs_err, r.lse_max_err,
               !r.pass ? r.why : r.kernel_path);
        if (!ok) {
            if (r.pass)
                printf("       expected %s kernel\n", want ? "the decode" : "another");
            printf("       seed 0x%llx\n", (unsigned long long)r.seed);
            failures++;
        }
    }
    return failures;
}

/* Whether ctx runs on a Hopper GPU (sm_90a), where some requests take other kernels. */
static int on_hopper(fj_context *ctx)
{
    fj_device_info info = {.struct_size = sizeof info};
    assert_int_equal(fj_context_get_device_info(ctx, &info), FJ_OK);
    return FJ_TEST_BACKEND == FJ_BACKEND_CUDA && !strcmp(info.arch, "sm_90a");
}

/* Runs the cases whose head dims are at most `widest` and whose value dims are beyond
** `wider_than` (and, with `pages` -1, not paged; N > 0, contiguous or in pages of whole N-key
** tiles) on a context made with FLASHJIT_CONFIG=config; returns the failures. */
static int run_cases_with(const char *config, const fjh_case *cases, size_t n, int64_t widest,
                          int64_t wider_than, int pages, int want_decode)
{
    fjh_case some[64];
    size_t m = 0;
    assert_true(n <= sizeof some / sizeof some[0]);
    for (size_t i = 0; i < n; i++)
        if (cases[i].head_dim <= widest && cases[i].head_dim_v <= widest &&
            cases[i].head_dim_v > wider_than &&
            (!cases[i].paged || pages == 0 || (pages > 0 && cases[i].paged % pages == 0)))
            some[m++] = cases[i];
    if (m == 0)
        return 0;
    fj_context *ctx = suite_context_with_env("FLASHJIT_CONFIG", config);
    printf("  with FLASHJIT_CONFIG=%s:\n", config);
    const int failures = run_cases_in(ctx, some, m, want_decode);
    fj_context_destroy(ctx);
    return failures;
}

/* Runs every case on the suite's context and, on CUDA, the kernels the defaults leave out:
** the vector kernel (FLASHJIT_CONFIG=path=vec; head dims to 256), on sm_90 the tensor-core
** kernel's bulk row copies on a dense cache of rows to 128 dims (bulk=1; the plan keeps
** cp.async there; elsewhere the config changes nothing) and its tensor maps' copies of swizzled
** panels there and on pages of multiples of 8 keys (bulk=1,swizzle=1: the plan's for dense
** caches of 1 GiB or more, pages of whole 64-key tiles, and pages of part tiles, copied a page
** at a time, of 512 MiB or more), its swizzled ring by cp.async (bulk=0, swizzle=1: rows
** of 64 or 128 dims, dense and paged; elsewhere none), its
** splits merged by their last block (merge_last=1; head dims to 256), and
** on sm_90a the mma kernel where
** value dims beyond 256 run on wgmma (warps=4; elsewhere the default already), the seesaw
** kernel where the tests' small batches leave the other (warps=8: contiguous or pages of whole
** 64-key tiles; v in k in 64-key tiles, its own v in 32-key ones), the kernel of three
** warpgroups where the seesaw one serves (warps=12) and its opt-in cluster pairs sharing their
** bulk copies (multicast=1: with an even number of row tiles a kv head). */
static void run_cases(void **state, const fjh_case *cases, size_t n, int want_decode)
{
    int failures = run_cases_in(suite_context(state), cases, n, want_decode);
    if (FJ_TEST_BACKEND == FJ_BACKEND_CUDA) {
        failures += run_cases_with("path=vec", cases, n, 256, 0, 0, want_decode);
        failures += run_cases_with("bulk=1", cases, n, 128, 0, -1, want_decode);
        failures += run_cases_with("bulk=1,swizzle=1", cases, n, 128, 0, 8, want_decode);
        failures += run_cases_with("bulk=0,swizzle=1", cases, n, 128, 0, 0, want_decode);
        failures += run_cases_with("merge_last=1", cases, n, 256, 0, 0, want_decode);
        failures += run_cases_with("warps=4", cases, n, 576, 256, 0, want_decode);
        failures += run_cases_with("warps=8", cases, n, 576, 256, 64, want_decode);
        failures += run_cases_with("warps=12", cases, n, 576, 256, 0, want_decode);
        failures += run_cases_with("multicast=1", cases, n, 576, 256, 0, want_decode);
    }
    assert_int_equal(failures, 0);
}

/* Grouped-query packing: MHA, GQA 4:1 and 8:1 (the packed rows span several row tiles at 16
** query rows), MQA; query lengths 1 to 16 against short, ragged and longer key ranges. */
static void test_heads_and_lengths(void **state)
{
    static const int64_t heads[][2] = {{4, 4}, {8, 2}, {32, 4}, {6, 1}};
    static const int64_t lens[][2] = {{1, 1}, {1, 300}, {2, 7}, {5, 130}, {16, 1000}, {16, 16}};
    fjh_case cases[24];
    size_t n = 0;
    for (size_t h = 0; h < 4; h++)
        for (size_t l = 0; l < 6; l++) {
            cases[n] = decode_case(lens[l][0], lens[l][1], heads[h][0], heads[h][1], 64,
                                   FJ_DTYPE_BF16);
            cases[n].desc.causal = (int32_t)((h + l) % 2);
            n++;
        }
    run_cases(state, cases, n, 1);
}

/* Split counts 1 to 64 (more than the key tiles: fewer splits run), automatic, with causal
** rows whose bands end in different splits, windows, soft-capping and a negative scale; and
** rows of 72 value columns (a partial run of the merge's lanes) over 9, 16 and 64 splits (the
** merge's teams sharing a row's states two and four ways), 9 rows (the last merge work-group's
** second row empty). */
static void test_splits(void **state)
{
    static const int32_t splits[] = {0, 1, 2, 3, 7, 16, 64};
    fjh_case cases[17];
    size_t n = 0;
    for (size_t i = 0; i < 7; i++) {
        cases[n] = decode_case(4, 2049, 8, 2, 128, FJ_DTYPE_BF16);
        cases[n].desc.num_splits = splits[i];
        cases[n++].desc.causal = 1;
        cases[n] = decode_case(1, 777, 4, 1, 64, FJ_DTYPE_F16);
        cases[n].desc.num_splits = splits[i];
        cases[n].desc.window_left = (int32_t)(100 * i);
        cases[n].desc.softcap = i % 2 ? 20.0f : 0.0f;
        cases[n].desc.softmax_scale = i % 3 == 2 ? -0.2f : 0.0f;
        cases[n++].with_lse = i % 2 == 0;
    }
    static const int32_t many[] = {9, 16, 64};
    for (size_t i = 0; i < 3; i++) {
        cases[n] = decode_case(1, 3000, 3, 1, 72, FJ_DTYPE_BF16);
        cases[n].desc.num_splits = many[i];
        cases[n++].with_lse = 1;
    }
    run_cases(state, cases, n, 1);
}

/* Head dims: small, odd, large, d != dv, MLA's 576 / 512; f32; layouts. */
static void test_head_dims_dtypes_layouts(void **state)
{
    /* Head dims beyond 256 (576 / 512, 320, 448 / 192) too: on CUDA the tensor-core kernel with
    ** O's columns split across its warps where dv is beyond 256. */
    static const int64_t dims[][2] = {{8, 8},     {40, 40},   {72, 40},   {128, 128}, {256, 256},
                                      {96, 200},  {576, 512}, {320, 320}, {448, 192}};
    fjh_case cases[14];
    size_t n = 0;
    for (size_t i = 0; i < 9; i++) {
        cases[n] = decode_case(i % 3 + 1, 515, 8, 2, dims[i][0], FJ_DTYPE_BF16);
        cases[n].head_dim_v = dims[i][1];
        cases[n].desc.num_splits = (int32_t)(i % 4);
        cases[n++].desc.causal = (int32_t)(i % 2);
    }
    cases[n] = decode_case(3, 333, 8, 2, 64, FJ_DTYPE_F32);
    cases[n++].desc.num_splits = 5;
    cases[n] = decode_case(2, 333, 8, 2, 64, FJ_DTYPE_F16);
    cases[n].desc.num_splits = 3;
    cases[n++].layout = FJH_LAYOUT_BHSD;
    cases[n] = decode_case(7, 333, 4, 4, 64, FJ_DTYPE_BF16);
    cases[n].desc.num_splits = 2;
    cases[n].desc.causal = 1;
    cases[n++].layout = FJH_LAYOUT_PADDED;
    /* wide rows padded (d 304 and dv 264 of 320), a sliding window, soft-capping, f16 */
    cases[n] = decode_case(3, 700, 8, 2, 304, FJ_DTYPE_F16);
    cases[n].head_dim_v = 264;
    cases[n].desc.window_left = 200;
    cases[n].desc.softcap = 30.0f;
    cases[n++].desc.num_splits = 3;
    run_cases(state, cases, n, 1);
}

/* Packed sequences of different lengths (one without queries), with and without seqused_k:
** unsplit, split by the caller (more splits than a short sequence's keys: empty states) and
** automatically. */
static void test_varlen(void **state)
{
    static const int32_t splits[] = {4, 1, 0, 64, 3, 2};
    fjh_case cases[6];
    for (int i = 0; i < 6; i++) {
        cases[i] = decode_case(i % 2 ? 16 : 1 + i, 700, 8, 2, 64, FJ_DTYPE_BF16);
        cases[i].batch = 4 + i % 3;
        cases[i].varlen = 1 + i / 3;
        cases[i].desc.num_splits = splits[i];
        cases[i].desc.causal = i % 2;
    }
    cases[5].head_dim = cases[5].head_dim_v = 128;
    cases[5].heads_kv = 1;
    run_cases(state, cases, 6, 1);
}

/* Packed queries against a paged KV cache (cu_seqlens_q with page_table: a serving batch that
** mixes decode, speculative rows and prefill chunks): sequences of 0 to 40 query rows
** (sequence 1 none; row tiles past a sequence's rows idle) against their pages (the full
** length, 0, 1 and random keys), page sizes 1 to 256, causal bottom-right and a window (over
** 16 rows: each row tile's own band), GQA and MQA, split counts, f16 and f32, ALiBi and a
** mask_mod, an FP8 cache, and MLA's latent cache. */
static void test_paged_packed(void **state)
{
    static const int pages[] = {16, 1, 64, 256, 7, 16, 32, 64};
    static const int64_t sq[] = {1, 4, 24, 40, 3, 2, 8, 1};
    static const int32_t splits[] = {0, 3, 1, 64, 5, 2, 0, 4};
    fjh_case cases[8];
    for (int i = 0; i < 8; i++) {
        cases[i] = decode_case(sq[i], 300 + 97 * i, 8, i == 6 ? 1 : 2, i % 4 ? 64 : 128,
                               i == 4 ? FJ_DTYPE_F16 : i == 5 ? FJ_DTYPE_F32 : FJ_DTYPE_BF16);
        cases[i].batch = 5;
        cases[i].paged = pages[i];
        cases[i].varlen = 1;
        cases[i].desc.num_splits = splits[i];
        cases[i].desc.causal = i % 3 != 2;
    }
    cases[2].desc.window_left = 50;
    cases[3].alibi = 1;
    cases[4].desc.mask_mod = "k % 5 != 2";
    cases[6].kv_fp8 = FJ_DTYPE_F8_E4M3;
    cases[7] = decode_case(2, 700, 16, 1, 576, FJ_DTYPE_BF16); /* MLA */
    cases[7].head_dim_v = 512;
    cases[7].batch = 4;
    cases[7].v_in_k = 1;
    cases[7].paged = 64;
    cases[7].varlen = 1;
    cases[7].desc.num_splits = 3;
    cases[7].desc.causal = 1;
    run_cases(state, cases, 8, WANT_DECODE_BUT_CHUNKS);
}

/* A paged KV cache: page sizes 1 to 256 with shuffled page tables and spare pages, sequences
** of the full length, 0 and 1 keys and random counts (seqused_k), decode and speculative
** decode (causal bottom-right), chunked prefill (more than 16 rows), split counts, GQA; pages
** of 8 and 32 too, which sm_90's tensor loader copies a page at a time. */
static void test_paged(void **state)
{
    static const int pages[] = {1, 16, 64, 256, 7};
    static const int64_t sq[] = {1, 4, 16, 40, 2};
    static const int32_t splits[] = {0, 7, 1, 3, 64};
    fjh_case cases[12];
    size_t n = 0;
    for (size_t i = 0; i < 5; i++) {
        cases[n] = decode_case(sq[i], 300 + 131 * (int64_t)i, 8, 2, 64, FJ_DTYPE_BF16);
        cases[n].batch = 5;
        cases[n].paged = pages[i];
        cases[n].desc.num_splits = splits[i];
        cases[n++].desc.causal = sq[i] > 1;
        cases[n] = decode_case(sq[i] % 3 + 1, 200, 4, 4, 128, i % 2 ? FJ_DTYPE_F16 : FJ_DTYPE_F32);
        cases[n].batch = 4;
        cases[n].paged = pages[4 - i];
        cases[n].desc.num_splits = splits[4 - i];
        cases[n].desc.window_left = i == 2 ? 30 : -1;
        cases[n++].desc.softcap = i == 3 ? 10.0f : 0.0f;
    }
    cases[n] = decode_case(1, 777, 32, 8, 128, FJ_DTYPE_BF16);
    cases[n].batch = 3;
    cases[n++].paged = 8;
    cases[n] = decode_case(3, 450, 8, 2, 64, FJ_DTYPE_F16);
    cases[n].batch = 2;
    cases[n].paged = 32;
    cases[n].desc.num_splits = 2;
    cases[n++].desc.causal = 1;
    run_cases(state, cases, n, WANT_DECODE_BUT_CHUNKS);
}

/* Chunks of prefill against a paged cache (more rows than decode takes): on sm_90a on Hopper's
** forward, which copies the keys by pages where its tiles hold whole pages of at least 8 keys or
** pages hold whole tiles (pages of 8 to 256 here), and on the decode kernels for pages of 48
** and 5, elsewhere, and on sm_90a under FLASHJIT_CONFIG=path=decode.
** Dense and packed queries, causal bottom-right, windows, soft-capping, GQA and MQA, head dims
** 64 to 256, random key counts with 0 and 1 among them and NaN in the unused rows and pages
** (the harness's). */
static void test_paged_prefill(void **state)
{
    static const int pages[] = {64, 16, 128, 8, 32, 256, 48, 5};
    static const int64_t dims[] = {128, 64, 256, 96, 128, 128, 64, 64};
    fjh_case cases[8];
    for (int i = 0; i < 8; i++) {
        cases[i] = decode_case(100 + 61 * i, 500 + 111 * i, 8, i == 5 ? 1 : 2, dims[i],
                               i == 1 || i == 4 ? FJ_DTYPE_F16 : FJ_DTYPE_BF16);
        cases[i].paged = pages[i];
        cases[i].desc.causal = i % 3 != 1;
    }
    cases[1].desc.window_left = 100;
    cases[3].desc.softcap = 20.0f;
    cases[4].varlen = 1;
    cases[6].varlen = 1;
    cases[7].desc.window_left = 40;
    cases[7].desc.window_right = 10;
    fj_context *ctx = suite_context(state);
    const int hopper = on_hopper(ctx);
    int failures = run_cases_in(ctx, cases, 6, hopper ? WANT_FORWARD : WANT_DECODE);
    failures += run_cases_in(ctx, cases + 6, 2, WANT_DECODE);
    if (hopper) {
        fj_context *asked = suite_context_with_env("FLASHJIT_CONFIG", "path=decode");
        printf("  with FLASHJIT_CONFIG=path=decode:\n");
        failures += run_cases_in(asked, cases, 8, WANT_DECODE);
        fj_context_destroy(asked);
    }
    assert_int_equal(failures, 0);
}

/* DeepSeek's MLA decode shape: one latent kv head of 576 whose first 512 dims are also v (v a
** view of k), 16 or 128 query heads, paged by 64 or 16, dense too, 1 to 4 query rows. */
static void test_mla(void **state)
{
    fjh_case cases[5];
    for (int i = 0; i < 4; i++) { /* the last: speculative rows, pages of 16 */
        cases[i] = decode_case(i == 2 ? 2 : i == 3 ? 4 : 1, 700, i == 1 ? 128 : 16, 1, 576,
                               FJ_DTYPE_BF16);
        cases[i].head_dim_v = 512;
        cases[i].batch = 4;
        cases[i].v_in_k = 1;
        cases[i].paged = i < 2 ? 64 : i == 3 ? 16 : 0;
        cases[i].desc.causal = i >= 2;
        cases[i].desc.num_splits = i == 1 ? 0 : i == 3 ? 3 : 5;
    }
    /* v a view of k of the same width (d = dv = 128) */
    cases[4] = decode_case(1, 900, 8, 2, 128, FJ_DTYPE_BF16);
    cases[4].v_in_k = 1;
    cases[4].paged = 16;
    run_cases(state, cases, 5, 1);
}

/* Value dims beyond 256 with 64 packed rows or more (the wgmma kernels on sm_90a, which take
** from 16: test_mla's 16 heads run there too): MLA's 64 heads with speculative rows (two row
** tiles: with multicast=1 a cluster pair sharing its bulk copies; with warps=8 the seesaw
** kernel, an odd tile count in a split), and for the seesaw kernel in f16 three rows (three row
** tiles) on pages of 64 with a window and soft-capping in four splits, 128 heads over 77 keys
** (a pair of tiles, the second partial), and v of 384 of k's 576 (three rope panels past v,
** causal, two rows, pages of 64); its own v across two kv heads on pages of 16 (tiles by its
** threads) and of 128 with two rows and a window (bulk copies: NaN in the pages' unused rows,
** windows starting inside a tile), 320 dims on odd pages with a window and soft-capping in
** f16, a partial second row tile, and the two ways the three-warpgroup kernel's halves split
** S's head dims besides an odd panel count (MLA's nine, 320's five): six panels, all in shared
** memory (384, paged 16), and a single one, in registers only (q and k of 64 dims, v of 512). */
static void test_wide_many_rows(void **state)
{
    fjh_case cases[10];
    cases[0] = decode_case(2, 900, 64, 1, 576, FJ_DTYPE_BF16);
    cases[0].head_dim_v = 512;
    cases[0].v_in_k = 1;
    cases[0].desc.causal = 1;
    cases[0].desc.num_splits = 3;
    cases[1] = decode_case(1, 700, 128, 2, 576, FJ_DTYPE_BF16);
    cases[1].head_dim_v = 512;
    cases[1].batch = 3;
    cases[1].paged = 16;
    cases[2] = decode_case(1, 600, 64, 1, 320, FJ_DTYPE_F16);
    cases[2].paged = 7;
    cases[2].desc.window_left = 100;
    cases[2].desc.softcap = 20.0f;
    cases[3] = decode_case(3, 515, 32, 1, 304, FJ_DTYPE_BF16);
    cases[3].head_dim_v = 264;
    cases[3].desc.causal = 1;
    cases[3].desc.num_splits = 2;
    cases[4] = decode_case(2, 650, 128, 2, 576, FJ_DTYPE_BF16);
    cases[4].head_dim_v = 512;
    cases[4].batch = 5;
    cases[4].paged = 128;
    cases[4].desc.causal = 1;
    cases[4].desc.window_left = 201;
    cases[5] = decode_case(1, 1000, 64, 1, 384, FJ_DTYPE_BF16);
    cases[5].paged = 16;
    cases[6] = decode_case(2, 777, 64, 1, 64, FJ_DTYPE_BF16);
    cases[6].head_dim_v = 512;
    cases[6].desc.causal = 1;
    cases[7] = decode_case(3, 1000, 64, 1, 576, FJ_DTYPE_F16);
    cases[7].head_dim_v = 512;
    cases[7].v_in_k = 1;
    cases[7].batch = 2;
    cases[7].paged = 64;
    cases[7].desc.window_left = 300;
    cases[7].desc.softcap = 30.0f;
    cases[7].desc.num_splits = 4;
    cases[8] = decode_case(1, 77, 128, 1, 576, FJ_DTYPE_BF16);
    cases[8].head_dim_v = 512;
    cases[8].v_in_k = 1;
    cases[9] = decode_case(2, 500, 64, 1, 576, FJ_DTYPE_BF16);
    cases[9].head_dim_v = 384;
    cases[9].v_in_k = 1;
    cases[9].paged = 64;
    cases[9].desc.causal = 1;
    run_cases(state, cases, 10, 1);
}

/* MLA prefill (more query rows than decode takes; one kv head of 576 whose first 512 dims are
** v): on sm_90a the seesaw decode kernel, whose row tiles are 64 positions of one query head,
** contiguous and on pages of 64; elsewhere the forward. Causal bottom-right with more keys than
** rows and fewer (rows that see no key), a partial last row tile, a window with soft-capping
** in f16, 16 to 128 heads, a batch of three; all with enough row tiles to fill a quarter of an
** H100 (the plan's condition for the seesaw kernel). */
static void test_mla_prefill(void **state)
{
    static const struct {
        int64_t b, sq, sk, hq;
        int causal, page;
    } m[] = {
        {1, 300, 300, 16, 1, 0},  {2, 203, 461, 16, 1, 0}, {3, 130, 70, 32, 1, 0},
        {1, 40, 600, 128, 1, 64}, {1, 257, 257, 16, 1, 0}, {2, 70, 555, 32, 0, 64},
    };
    enum { N = sizeof m / sizeof m[0] };
    fjh_case cases[N];
    for (size_t i = 0; i < N; i++) {
        cases[i] = decode_case(m[i].sq, m[i].sk, m[i].hq, 1, 576, FJ_DTYPE_BF16);
        cases[i].head_dim_v = 512;
        cases[i].v_in_k = 1;
        cases[i].batch = m[i].b;
        cases[i].paged = m[i].page;
        cases[i].desc.causal = m[i].causal;
    }
    cases[4].dtype = FJ_DTYPE_F16;
    cases[4].desc.window_left = 100;
    cases[4].desc.softcap = 30.0f;
    fj_context *ctx = suite_context(state);
    const int hopper = on_hopper(ctx);
    assert_int_equal(run_cases_in(ctx, cases, N, hopper ? WANT_DECODE : WANT_EITHER), 0);
}

/* What the decode kernels do not take runs on the forward kernels: 17 query rows, block
** classes. */
static void test_other_requests_keep_the_forward(void **state)
{
    fjh_case cases[2];
    cases[0] = decode_case(17, 300, 8, 2, 64, FJ_DTYPE_BF16);
    cases[1] = decode_case(1, 300, 8, 2, 64, FJ_DTYPE_BF16);
    cases[1].blocks = 1;
    run_cases(state, cases, 2, 0);
}

/* Masks and score terms: ALiBi slopes by head and by batch and head, a mask_mod, a score_mod
** with arguments, biases (by batch and head, shared by the batch, a key bias; in the dtype and
** in f32), mask tensors (random, key padding) and FlashMask ranges, alone and with causal rows,
** windows, soft-capping and splits. On a paged cache the portable decode kernel applies them
** (positions within each sequence, bottom-right as the forward's; tensors over the table's
** keys, and with packed queries over max_seqlen_q rows a sequence); contiguous, whichever
** kernel the plan prefers (the forward's tensor cores on CUDA's 16-bit data, else the decode
** kernel) gives the same numbers. */
static void test_masks_and_score_terms(void **state)
{
    static const float per_head[8] = {0.5f, 0.25f, 0.125f, 0.0625f, 1.0f, 0.3f, 0.02f, 0.7f};
    fjh_case paged[14], dense[4];
    for (int i = 0; i < 14; i++) {
        paged[i] = decode_case(1 + i % 3, 300 + 77 * i, 8, 2, i == 4 ? 128 : 64,
                               i == 5 || i == 8 ? FJ_DTYPE_F16 : FJ_DTYPE_BF16);
        paged[i].batch = 4;
        paged[i].paged = (int[]){16, 1, 64, 7, 16, 256, 16, 5, 64, 1, 32, 16, 5, 64}[i];
        paged[i].desc.causal = i % 2;
    }
    /* Packed queries (up to 6 rows a sequence, a serving batch's speculative rows) with a
    ** bias, a mask (a tree mask's shape) and ranges of max_seqlen_q rows a sequence. */
    for (int i = 11; i < 14; i++) {
        paged[i].varlen = 1;
        paged[i].seqlen_q = 6;
    }
    paged[11].bias = 1;
    paged[11].desc.num_splits = 3;
    paged[12].mask = 1;
    paged[13].ranges = 4;
    paged[13].desc.num_splits = 2;
    paged[6].bias = 1;
    paged[7].bias = 2;
    paged[7].bias_f32 = 1;
    paged[7].desc.num_splits = 4;
    paged[8].bias = 3;
    paged[8].alibi = 1;
    paged[9].mask = 1;
    paged[9].desc.num_splits = 2;
    paged[10].mask = 2;
    paged[10].ranges = 2;
    paged[0].alibi = 1;
    paged[1].alibi = 2;
    paged[2].desc.mask_mod = "k % 3 != 1 || q == k - sk + sq";
    paged[3].desc.score_mod = "s - arg[h] * abs(q - k)";
    paged[3].mod_args = per_head;
    paged[3].mod_args_count = 8;
    paged[3].desc.num_splits = 3;
    paged[4].alibi = 1;
    paged[4].desc.mask_mod = "k >= 5";
    paged[4].desc.window_left = 100;
    paged[4].desc.num_splits = 2;
    paged[5].desc.score_mod = "q >= 1 ? s : s * 0.5";
    paged[5].desc.softcap = 20.0f;
    for (int i = 0; i < 4; i++) {
        dense[i] = decode_case(1 + 2 * i, 500, 8, 2, 64, i == 2 ? FJ_DTYPE_F32 : FJ_DTYPE_BF16);
        dense[i].varlen = i == 1;
    }
    dense[0].alibi = 1;
    dense[0].desc.num_splits = 4;
    dense[1].desc.mask_mod = "k <= q + sk - sq && k % 2 == 0";
    dense[2].alibi = 2;
    dense[2].desc.score_mod = "30 * tanh(s / 30)";
    dense[3].bias = 1;
    dense[3].mask = 2;
    int failures = run_cases_in(suite_context(state), paged, 14, 1);
    failures += run_cases_in(suite_context(state), dense, 4, -1);
    assert_int_equal(failures, 0);
}

/* desc.num_splits out of range is named. */
static void test_bad_num_splits(void **state)
{
    fj_context *ctx = suite_context(state);
    static const int32_t bad[] = {-1, 65, 1000};
    for (size_t i = 0; i < 3; i++) {
        fjh_case c = decode_case(1, 100, 4, 4, 64, FJ_DTYPE_BF16);
        c.desc.num_splits = bad[i];
        c.skip_check = 1;
        fjh_result r;
        fjh_run(ctx, &c, &r);
        assert_int_equal(r.status, FJ_ERR_INVALID_ARGUMENT);
        assert_non_null(strstr(r.error, "desc.num_splits"));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_heads_and_lengths),
        cmocka_unit_test(test_splits),
        cmocka_unit_test(test_head_dims_dtypes_layouts),
        cmocka_unit_test(test_varlen),
        cmocka_unit_test(test_paged),
        cmocka_unit_test(test_paged_prefill),
        cmocka_unit_test(test_paged_packed),
        cmocka_unit_test(test_mla),
        cmocka_unit_test(test_wide_many_rows),
        cmocka_unit_test(test_mla_prefill),
        cmocka_unit_test(test_other_requests_keep_the_forward),
        cmocka_unit_test(test_masks_and_score_terms),
        cmocka_unit_test(test_bad_num_splits),
    };
    return suite_run("decode", tests);
}
