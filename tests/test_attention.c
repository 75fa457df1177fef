/* The forward numerics on one backend (FJ_TEST_BACKEND): every feature over odd sizes, fresh
** random data each run, outputs poisoned, every element against the float64 reference. Built
** once per backend; without a device of that backend every test skips with a message. */
#define _POSIX_C_SOURCE 200809L
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "backend_suite.h"
#include "random.h"
#include "reference.h"

/* Runs every case, prints one line per case, and fails the test if any case failed. */
static void run_cases(void **state, const fjh_case *cases, size_t n)
{
    fj_context *ctx = suite_context(state);
    int failures = 0;
    for (size_t i = 0; i < n; i++) {
        fjh_result r;
        char desc[512];
        fjh_describe(&cases[i], desc, sizeof desc);
        fjh_run(ctx, &cases[i], &r);
        printf("  %s %s | err %.3g (plain %.3g) rel %.3g lse %.3g | %s\n", r.pass ? "ok  " : "FAIL",
               desc, r.max_abs_err, r.lowp_max_abs_err, r.rel_err, r.lse_max_err,
               r.pass ? r.kernel_path : r.why);
        if (!r.pass) {
            printf("       seed 0x%llx\n", (unsigned long long)r.seed);
            failures++;
        }
    }
    assert_int_equal(failures, 0);
}

static fjh_case base(int64_t sq, int64_t sk, int64_t d, fj_dtype dtype)
{
    fjh_case c;
    fjh_case_init(&c);
    c.batch = 2;
    c.heads_q = c.heads_kv = 2;
    c.seqlen_q = sq;
    c.seqlen_k = sk;
    c.head_dim = c.head_dim_v = d;
    c.dtype = dtype;
    return c;
}

static void test_seqlens(void **state)
{
    static const int64_t pairs[][2] = {{1, 1},   {7, 7},   {129, 129}, {300, 300},
                                       {1, 300}, {300, 7}, {129, 517}, {7, 129}};
    fjh_case cases[16];
    size_t n = 0;
    for (size_t i = 0; i < 8; i++)
        for (int causal = 0; causal < 2; causal++) {
            cases[n] = base(pairs[i][0], pairs[i][1], 64, FJ_DTYPE_BF16);
            cases[n++].desc.causal = causal;
        }
    run_cases(state, cases, n);
}

static void test_head_dims(void **state)
{
    static const int64_t dims[][2] = {
        {8, 8},    {40, 40}, {72, 72},  {96, 96},   {128, 128}, {200, 200}, {256, 256}, {72, 40},
        {40, 200}, {256, 8}, {128, 64}, {192, 128}, {320, 320}, {512, 512}, {576, 512}, {64, 400}};
    enum { N = sizeof dims / sizeof dims[0] };
    fjh_case cases[N];
    for (size_t i = 0; i < N; i++) {
        cases[i] = base(129, 129, dims[i][0], FJ_DTYPE_BF16);
        cases[i].head_dim_v = dims[i][1];
        cases[i].desc.causal = (int)(i % 2);
    }
    run_cases(state, cases, N);
}

/* Head dims beyond 256 (on Hopper: value slices of at most 256 columns, each recomputing S; on
** CUDA also with S split between a cluster pair, d_split, and on the seesaw decode kernel with
** v in its own panels): each width alone with odd lengths and GQA/MQA, d != dv either way,
** MLA's 576 / 512 with v a view of k, three slices, and with the other features: window,
** soft-capping, bias, mask_mod, variable lengths, layouts, f16. */
static void test_wide_head_dims(void **state)
{
    static const int64_t dims[][2] = {{264, 264}, {320, 320}, {384, 384}, {448, 448},
                                      {512, 512}, {576, 512}, {576, 576}, {448, 192},
                                      {128, 512}, {576, 512}, {320, 320}, {512, 512},
                                      {384, 320}, {512, 512}, {576, 512}};
    enum { N = sizeof dims / sizeof dims[0] };
    fjh_case cases[N];
    for (size_t i = 0; i < N; i++) {
        cases[i] = base(i % 3 ? 193 : 64, i % 2 ? 517 : 300, dims[i][0], FJ_DTYPE_BF16);
        cases[i].head_dim_v = dims[i][1];
        cases[i].batch = 1 + (int64_t)(i % 2);
        cases[i].heads_q = 4;
        cases[i].heads_kv = i % 3 == 2 ? 1 : 2;
        cases[i].desc.causal = (int)(i % 2);
    }
    cases[5].v_in_k = 1; /* MLA: one kv head of 576, v its first 512 dims */
    cases[5].heads_q = 8;
    cases[5].heads_kv = 1;
    cases[6].desc.window_left = 70;
    cases[6].desc.softcap = 5.0f;
    cases[9].dtype = FJ_DTYPE_F16;
    cases[9].desc.softmax_scale = -0.05f;
    cases[10].bias = 1;
    cases[11].desc.mask_mod = "(q + 2 * k) % 5 != 0";
    cases[12].varlen = 2;
    cases[12].batch = 3;
    cases[13].layout = FJH_LAYOUT_BHSD;
    cases[14].layout = FJH_LAYOUT_PADDED;
    cases[14].alibi = 1;
    /* (Under FLASHJIT_CONFIG=path=mma, test_attention_cuda_mma, the dense ones run on mma.sync's
    ** kernel in value slices, opt-in.) */
    run_cases(state, cases, N);
    if (FJ_TEST_BACKEND != FJ_BACKEND_CUDA)
        return;
    /* Again with S's head dim split between the two blocks of a cluster (opt-in on Hopper), on
    ** the forward kernel (MLA's prefill otherwise runs on the seesaw decode kernel). */
    printf("  with FLASHJIT_CONFIG=path=wgmma,d_split=1:\n");
    void *split = suite_context_with_env("FLASHJIT_CONFIG", "path=wgmma,d_split=1");
    run_cases(&split, cases, N);
    fj_context_destroy(split);
    /* Again with the prefills the decode kernels take (not bias, mask_mod, ALiBi or packed
    ** sequences) on the seesaw kernel, v in its own panels where it is not a view of k. */
    printf("  with FLASHJIT_CONFIG=path=decode,warps=8:\n");
    void *seesaw = suite_context_with_env("FLASHJIT_CONFIG", "path=decode,warps=8");
    run_cases(&seesaw, cases, N);
    fj_context_destroy(seesaw);
}

static void test_dtypes(void **state)
{
    fj_dtype dtypes[] = {FJ_DTYPE_F32, FJ_DTYPE_F16, FJ_DTYPE_BF16};
    fjh_case cases[9];
    size_t n = 0;
    for (int i = 0; i < 3; i++)
        for (int mode = 0; mode < 3; mode++) {
            cases[n] = base(300, 129, 72, dtypes[i]);
            cases[n].desc.causal = mode == 1;
            cases[n++].desc.softcap = mode == 2 ? 5.0f : 0.0f;
        }
    run_cases(state, cases, n);
}

static void test_gqa_mqa(void **state)
{
    static const int64_t heads[][2] = {{6, 2}, {8, 1}, {4, 4}, {3, 1}};
    fjh_case cases[4];
    for (int i = 0; i < 4; i++) {
        cases[i] = base(129, 300, 64, FJ_DTYPE_BF16);
        cases[i].heads_q = heads[i][0];
        cases[i].heads_kv = heads[i][1];
        cases[i].desc.causal = i % 2;
    }
    run_cases(state, cases, 4);
}

static void test_windows_softcap_scale(void **state)
{
    static const struct {
        int64_t sq, sk;
        int causal, left, right;
        float softcap, scale;
    } m[] = {
        {129, 129, 0, 16, -1, 0, 0},        {129, 129, 0, -1, 16, 0, 0},
        {129, 300, 0, 8, 8, 0, 0},          {300, 129, 0, 0, 0, 0, 0},
        {129, 129, 1, 32, -1, 0, 0},        {300, 300, 0, 100, 3, 0, 0},
        {7, 300, 1, 5, -1, 0, 0},           {129, 129, 0, 16, 16, 2.0f, 0},
        {129, 300, 0, -1, -1, 0, 0.3f},     {129, 129, 1, -1, -1, 0, -0.2f},
        {129, 129, 0, -1, -1, 30.0f, 1.0f},
    };
    size_t n = sizeof m / sizeof m[0];
    fjh_case cases[sizeof m / sizeof m[0]];
    for (size_t i = 0; i < n; i++) {
        cases[i] = base(m[i].sq, m[i].sk, 40, i % 2 ? FJ_DTYPE_F16 : FJ_DTYPE_BF16);
        cases[i].desc.causal = m[i].causal;
        cases[i].desc.window_left = m[i].left;
        cases[i].desc.window_right = m[i].right;
        cases[i].desc.softcap = m[i].softcap;
        cases[i].desc.softmax_scale = m[i].scale;
    }
    run_cases(state, cases, n);
}

/* Rows that see no key at all: out 0 and lse -inf (checked exactly by the harness); among them
** whole query tiles further below the band than a tile and two key tiles, whose count of key
** tiles once came out negative (the Hopper kernel's ring then lost step with its producer and
** hung). */
static void test_fully_masked_rows(void **state)
{
    fjh_case cases[5];
    cases[0] =
        base(300, 7, 64, FJ_DTYPE_BF16); /* causal, sq > sk: the first 293 rows see nothing */
    cases[0].desc.causal = 1;
    cases[1] = base(129, 7, 64, FJ_DTYPE_F32); /* window (0, 0) with sq > sk */
    cases[1].desc.window_left = 0;
    cases[1].desc.window_right = 0;
    cases[2] = base(300, 7, 40, FJ_DTYPE_F16);
    cases[2].desc.causal = 1;
    cases[2].desc.softcap = 3.0f;
    cases[3] = base(1100, 9, 128, FJ_DTYPE_BF16); /* causal, 1091 rows see nothing */
    cases[3].desc.causal = 1;
    cases[4] = base(900, 40, 64, FJ_DTYPE_F16);
    cases[4].desc.causal = 1;
    cases[4].heads_q = 4; /* GQA: several work tiles a block on a persistent grid */
    cases[4].batch = 3;
    run_cases(state, cases, 5);
}

static void test_layouts_and_lse(void **state)
{
    fjh_case cases[6];
    for (int i = 0; i < 6; i++) {
        cases[i] = base(129, 300, 72, i < 3 ? FJ_DTYPE_BF16 : FJ_DTYPE_F32);
        cases[i].heads_q = 4;
        cases[i].layout = (fjh_layout)(i % 3);
        cases[i].with_lse = i != 1;
        cases[i].desc.causal = i >= 4;
    }
    run_cases(state, cases, 6);
}

/* More work tiles (query blocks x heads x batch) than a GPU has SMs, so that a persistent grid
** gives each block several: GQA, ragged lengths, masks and both head-dim regimes. */
static void test_many_work_tiles(void **state)
{
    fjh_case cases[4];
    for (int i = 0; i < 4; i++) {
        cases[i] = base(i % 2 ? 129 : 200, 300, i < 2 ? 64 : 128, FJ_DTYPE_BF16);
        cases[i].batch = 9;
        cases[i].heads_q = 16;
        cases[i].heads_kv = 4;
        cases[i].desc.causal = i % 2;
    }
    cases[3].desc.window_left = 50;
    run_cases(state, cases, 4);
}

/* ALiBi slopes, bias and mask tensors: each alone in its layouts, in pairs, all three, and with
** causal, window, soft-capping, GQA, f32 and expressions. */
static void test_alibi_bias_mask(void **state)
{
    fjh_case cases[16];
    size_t n = 0;
    for (int i = 0; i < 16; i++) {
        cases[i] = base(i % 3 ? 77 : 129, i % 2 ? 130 : 61, i % 4 == 3 ? 40 : 64,
                        i % 5 == 4 ? FJ_DTYPE_F16 : FJ_DTYPE_BF16);
        cases[i].heads_q = 4;
        cases[i].heads_kv = i % 2 ? 2 : 4;
    }
    cases[n++].alibi = 1;
    cases[n].alibi = 2;
    cases[n++].desc.causal = 1;
    cases[n++].bias = 1;
    cases[n].bias = 2;
    cases[n++].bias_f32 = 1;
    cases[n].bias = 3;
    cases[n++].desc.window_left = 20;
    cases[n++].mask = 1;
    cases[n].mask = 2;
    cases[n++].desc.causal = 1;
    cases[n].alibi = 1;
    cases[n++].bias = 1;
    cases[n].bias = 3;
    cases[n].bias_f32 = 1;
    cases[n++].mask = 2;
    cases[n].alibi = 2;
    cases[n].mask = 1;
    cases[n++].desc.softcap = 3.0f;
    cases[n].alibi = 1;
    cases[n].bias = 1;
    cases[n].mask = 1;
    cases[n++].desc.causal = 1;
    cases[n].bias = 1; /* with an expression on top */
    cases[n].mask = 2;
    cases[n++].desc.mask_mod = "q % 5 != 1";
    cases[n].dtype = FJ_DTYPE_F32;
    cases[n].alibi = 1;
    cases[n].bias = 2;
    cases[n++].mask = 1;
    cases[n].dtype = FJ_DTYPE_F32;
    cases[n].bias = 1;
    cases[n].bias_f32 = 1;
    cases[n++].desc.window_right = 9;
    /* An FP8 KV cache: the bias in q's dtype (not k's and v's), and ALiBi with a mask */
    cases[n].kv_fp8 = FJ_DTYPE_F8_E5M2;
    cases[n++].bias = 3;
    cases[n].kv_fp8 = FJ_DTYPE_F8_E4M3;
    cases[n].alibi = 1;
    cases[n].bias = 1;
    cases[n++].mask = 1;
    run_cases(state, cases, n);
}

/* FlashMask-style column ranges: one or two per key, broadcast over batch, with causal, window,
** GQA, the other masks and f32. */
static void test_mask_ranges(void **state)
{
    fjh_case cases[6];
    for (int i = 0; i < 6; i++) {
        cases[i] = base(i % 2 ? 77 : 129, i % 3 ? 130 : 61, i == 5 ? 40 : 64, FJ_DTYPE_BF16);
        cases[i].heads_q = 4;
        cases[i].heads_kv = i % 2 ? 2 : 4;
        cases[i].ranges = i % 2 ? 4 : 2;
    }
    cases[4].blocks = 2;
    cases[1].desc.causal = 1;
    cases[2].desc.window_left = 25;
    cases[3].mask = 2;
    cases[3].alibi = 1;
    cases[4].desc.mask_mod = "k % 7 != 3";
    cases[5].dtype = FJ_DTYPE_F32;
    cases[5].desc.causal = 1;
    run_cases(state, cases, 6);
}

/* The caller's 128 x 128 block classes: alone, broadcast, with causal and with each mask kind
** (class 2 overrides them), over several blocks each way. */
static void test_block_mask(void **state)
{
    fjh_case cases[6];
    for (int i = 0; i < 6; i++) {
        cases[i] = base(i % 2 ? 300 : 390, i % 3 ? 500 : 260, 64, FJ_DTYPE_BF16);
        cases[i].heads_q = 4;
        cases[i].heads_kv = 2;
        cases[i].blocks = i % 2 ? 2 : 1;
    }
    cases[1].desc.causal = 1;
    cases[2].desc.mask_mod = "(q + k) % 5 != 0";
    cases[3].mask = 1;
    cases[4].ranges = 2;
    cases[5].dtype = FJ_DTYPE_F32;
    cases[5].desc.window_left = 100;
    run_cases(state, cases, 6);
}

/* Variable lengths: packed sequences of random lengths (one without queries), with seqused_k,
** masks, GQA, layouts, dtypes, ALiBi, an expression that reads the sequence index, and block
** classes of each sequence's own 128-row and 128-key blocks (per sequence and head; shared, under
** an expression) over lengths of several blocks. */
static void test_varlen(void **state)
{
    fjh_case cases[12];
    for (int i = 0; i < 10; i++) {
        cases[i] = base(i % 2 ? 97 : 150, i % 3 ? 130 : 61, i % 4 == 3 ? 40 : 64, FJ_DTYPE_BF16);
        cases[i].batch = 5;
        cases[i].heads_q = 4;
        cases[i].heads_kv = i % 2 ? 2 : 4;
        cases[i].varlen = 1;
    }
    cases[1].desc.causal = 1;
    cases[2].varlen = 2;
    cases[3].varlen = 2;
    cases[3].desc.causal = 1;
    cases[4].desc.window_left = 30;
    cases[4].desc.window_right = 5;
    cases[5].layout = FJH_LAYOUT_PADDED;
    cases[5].with_lse = 0;
    cases[6].dtype = FJ_DTYPE_F16;
    cases[6].alibi = 2;
    cases[6].desc.softcap = 4.0f;
    cases[7].dtype = FJ_DTYPE_F32;
    cases[7].desc.causal = 1;
    cases[8].desc.mask_mod = "(q + k + b) % 3 != 0";
    cases[9].head_dim = cases[9].head_dim_v = 320;
    cases[9].varlen = 2;
    for (int i = 10; i < 12; i++) {
        cases[i] = base(300 + 50 * (i - 10), 420, 64, FJ_DTYPE_BF16);
        cases[i].batch = 3;
        cases[i].heads_q = 4;
        cases[i].heads_kv = 2;
        cases[i].varlen = 12 - i;
        cases[i].blocks = i - 9;
    }
    cases[10].desc.causal = 1;
    cases[11].desc.mask_mod = "(q / 50) % 2 == (k / 50) % 2";
    run_cases(state, cases, 12);
}

/* mask_mod and score_mod expressions: FlexAttention's classic masks and an ALiBi-like score,
** alone, together, with causal and soft-capping, and rows that keep no key. */
static void test_mask_and_score_expressions(void **state)
{
    static const float slopes[] = {0.5f, 0.25f, 0.125f, 0.0625f};
    static const struct {
        const char *mask, *score;
        int causal;
        float softcap;
        fj_dtype dtype;
    } m[] = {
        {"q / 64 == k / 64", NULL, 0, 0, FJ_DTYPE_BF16},                        /* documents */
        {"k <= q + sk - sq && k > q + sk - sq - 50", NULL, 0, 0, FJ_DTYPE_F16}, /* window */
        {"k < 32 || k <= q", NULL, 0, 0, FJ_DTYPE_F32},                         /* prefix-LM */
        {"(q * 7 + k * 13 + h) % 3 != 0", NULL, 1, 0, FJ_DTYPE_BF16},           /* irregular */
        {NULL, "s - arg[h] * abs(q - k) / 16", 0, 0, FJ_DTYPE_F32},             /* ALiBi-like */
        {NULL, "s * 0.5f + (k % 5 == 0 ? 1.0 : 0.0)", 1, 3.0f, FJ_DTYPE_F16},
        {"b == 1 || k < q", "tanh(s / 4.0) * 4.0", 0, 0, FJ_DTYPE_BF16},
        {"k > 1000", NULL, 0, 0, FJ_DTYPE_F32}, /* no row keeps a key */
        /* The defined arithmetic (flashjit.h): a zero divisor gives 0, int32 wraps. */
        {"q / (k - k) == 0 && (q + 1) % (k % 3) != 1", NULL, 0, 0, FJ_DTYPE_BF16},
        {"(q * 1000003 * 1000003 + k * 65537 * 65537) % 5 != 0", NULL, 0, 0, FJ_DTYPE_F16},
        {"abs((q + 1) * 1073741824) >= 0 || k < q", "s + ((k * 2147483647) % 3 == 1 ? 0.5 : 0.0)",
         0, 0, FJ_DTYPE_F32},
        /* Extreme finite scores are computed right (equal ones: a uniform softmax); -inf masks. */
        {NULL, "-3.4e38", 0, 0, FJ_DTYPE_BF16},
        {NULL, "k % 2 == 0 ? 3.4e38 : s", 0, 0, FJ_DTYPE_F16},
        {NULL, "k > q ? -1.0 / 0.0 : s", 0, 0, FJ_DTYPE_F32},
    };
    size_t n = sizeof m / sizeof m[0];
    fjh_case cases[sizeof m / sizeof m[0]];
    for (size_t i = 0; i < n; i++) {
        cases[i] = base(129, 200, 40, m[i].dtype);
        cases[i].heads_q = 4;
        cases[i].desc.mask_mod = m[i].mask;
        cases[i].desc.score_mod = m[i].score;
        cases[i].desc.causal = m[i].causal;
        cases[i].desc.softcap = m[i].softcap;
        cases[i].mod_args = slopes;
        cases[i].mod_args_count = 4;
    }
    run_cases(state, cases, n);
}

/* Deeply nested calls and argument reads compile in bounded time and compute right: integer
** abs/min/max and the argument reads are functions in the kernels, not macros that repeat their
** argument (24 nested abs made the compiler expand 2^24 copies). */
static void test_nested_expressions(void **state)
{
    static const int32_t perm[4] = {1, 2, 3, 0}; /* iarg[i]: a 4-cycle */
    static char abs24[512], minmax[512], iarg12[512], *texts[3] = {abs24, minmax, iarg12};
    strcpy(abs24, "q - k");
    for (int i = 0; i < 24; i++) {
        char t[512];
        snprintf(t, sizeof t, "abs(%s)", abs24);
        strcpy(abs24, t);
    }
    strcat(abs24, " % 7 != 3");
    strcpy(minmax, "q");
    for (int i = 0; i < 16; i++) {
        char t[512];
        snprintf(t, sizeof t, i % 2 ? "min(%s, k + %d)" : "max(%s, k - %d)", minmax, i);
        strcpy(minmax, t);
    }
    strcat(minmax, " % 5 != 0");
    strcpy(iarg12, "q % 4");
    for (int i = 0; i < 12; i++) {
        char t[512];
        snprintf(t, sizeof t, "iarg[%s]", iarg12);
        strcpy(iarg12, t);
    }
    strcat(iarg12, " != k % 4");
    fjh_case cases[3];
    for (int i = 0; i < 3; i++) {
        cases[i] = base(150, 170, 32, FJ_DTYPE_F32);
        cases[i].desc.mask_mod = texts[i];
        cases[i].mod_args = (const float *)perm;
        cases[i].mod_args_count = 4;
    }
    fj_context *ctx = suite_context(state);
    for (int i = 0; i < 3; i++) {
        fjh_result r;
        fjh_run(ctx, &cases[i], &r);
        if (!r.pass)
            fail_msg("%s: %s", texts[i], r.why);
        /* The first call renders and compiles: seconds, not the minutes of exponential source. */
        if (r.first_call_ms > 30000)
            fail_msg("%s: first call %.0f ms", texts[i], r.first_call_ms);
        printf("  ok   %.60s... first call %.0f ms | %s\n", texts[i], r.first_call_ms,
               r.kernel_path);
    }
}

/* Masks over many 128 x 128 blocks, where the Hopper kernel classifies blocks and skips, masks
** or keeps them whole: documents, prefix-LM, a random block-sparse table read through iarg, a
** mask tensor and ranges with the band, ragged ends, head dims that take 64-key tiles. */
static void test_masks_over_many_blocks(void **state)
{
    static int32_t table[8 * 8];
    for (int i = 0; i < 64; i++)
        table[i] = (i * 37 + 11) % 7 < 4; /* about half the blocks kept */
    fjh_case cases[11];
    size_t n = 0;
    cases[n] = base(1000, 1000, 128, FJ_DTYPE_BF16);
    cases[n++].desc.mask_mod = "q / 300 == k / 300 && k <= q"; /* documents */
    /* Biases whose rows are 16-byte multiples: the Hopper kernel copies their tiles by TMA. */
    cases[n] = base(1000, 1024, 128, FJ_DTYPE_BF16);
    cases[n].bias = 1;
    cases[n++].desc.causal = 1;
    cases[n] = base(700, 512, 256, FJ_DTYPE_BF16);
    cases[n].bias = 2;
    cases[n++].bias_f32 = 1;
    cases[n] = base(640, 896, 64, FJ_DTYPE_F16);
    cases[n].bias = 1;
    cases[n].alibi = 1;
    cases[n++].desc.mask_mod = "(q + k) % 4 != 0";
    cases[n] = base(900, 1100, 64, FJ_DTYPE_F16);
    cases[n++].desc.mask_mod = "k < 200 || k <= q + sk - sq"; /* prefix-LM */
    cases[n] = base(1000, 1000, 256, FJ_DTYPE_BF16);
    cases[n].desc.mask_mod = "iarg[(q / 128) * 8 + k / 128] != 0"; /* block-sparse */
    cases[n].mod_args = (const float *)table;
    cases[n++].mod_args_count = 64;
    cases[n] = base(1000, 1000, 96, FJ_DTYPE_BF16);
    cases[n].desc.mask_mod = "iarg[(q / 128) * 8 + k / 128] != 0 && (q + k) % 3 != 0";
    cases[n].mod_args = (const float *)table;
    cases[n].mod_args_count = 64;
    cases[n++].desc.causal = 1;
    cases[n] = base(700, 900, 128, FJ_DTYPE_BF16);
    cases[n].mask = 1;
    cases[n++].desc.causal = 1;
    cases[n] = base(800, 800, 128, FJ_DTYPE_BF16);
    cases[n].ranges = 4;
    cases[n++].desc.window_left = 300;
    cases[n] = base(640, 900, 128, FJ_DTYPE_BF16);
    cases[n].bias = 1;
    cases[n].alibi = 2;
    cases[n++].desc.mask_mod = "h == 0 || k % 128 < 100";
    cases[n] = base(1000, 1000, 64, FJ_DTYPE_BF16);
    cases[n].blocks = 1;
    cases[n].desc.score_mod = "s + (q - k) / 512.0";
    cases[n++].desc.causal = 1;
    run_cases(state, cases, n);
}

/* Many key tiles, both loop directions of the tensor-core kernel, both masks. */
static void test_long_sequences(void **state)
{
    fjh_case cases[11];
    size_t n = 0;
    int64_t lens[] = {1024, FJ_TEST_BACKEND == FJ_BACKEND_CUDA ? 2048 : 1024};
    for (int i = 0; i < 2; i++)
        for (int causal = 0; causal < 2; causal++) {
            cases[n] = base(lens[i], lens[i], i ? 128 : 64, FJ_DTYPE_BF16);
            cases[n].batch = 1;
            cases[n++].desc.causal = causal;
        }
    cases[n] = base(1000, 1500, 96, FJ_DTYPE_F16); /* ragged tiles on both axes */
    cases[n].desc.window_left = 300;
    cases[n++].desc.window_right = 40;
    cases[n] = base(777, 333, 256, FJ_DTYPE_BF16);
    cases[n].heads_q = 4;
    cases[n++].desc.causal = 1;
    if (FJ_TEST_BACKEND == FJ_BACKEND_CUDA) {
        /* Long enough for the eight-warp d = 256 tiles (mma) and, at d <= 64, the three
        ** consumer warpgroups (wgmma). */
        cases[n] = base(2100, 2100, 256, FJ_DTYPE_BF16);
        cases[n++].batch = 1;
        cases[n] = base(2100, 2100, 64, FJ_DTYPE_BF16);
        cases[n].batch = 1;
        cases[n++].desc.causal = 1;
        cases[n] = base(2300, 1900, 48, FJ_DTYPE_F16);
        cases[n].heads_q = 4;
        cases[n++].batch = 1;
        /* d 128 from 4k keys: 160-key tiles (wgmma), the last one ragged. */
        cases[n] = base(300, 4100, 128, FJ_DTYPE_BF16);
        cases[n++].batch = 1;
        /* Scores spread over 2^30 and more, so that rows' maxima outgrow the stale exponent
        ** base of d 256 many times (wgmma's lazy rescaling). */
        cases[n] = base(700, 1500, 256, FJ_DTYPE_BF16);
        cases[n].desc.softmax_scale = 1.0f;
        cases[n++].batch = 1;
    }
    run_cases(state, cases, n);
}

/* A draw in [0, n) from the xorshift state *x. */
static int draw(uint64_t *x, int n)
{
    return (int)(fjr_xorshift(x) % (uint64_t)n);
}

/* Requests drawn at random from everything the API combines (a fixed seed, so a failure
** repeats): shapes off any grid, GQA, d != dv, dtypes and an FP8 KV cache, layouts, the band,
** soft-capping, both scale signs, expressions, score terms, masks, ranges, block classes, packed
** sequences, paged caches and decode shapes, and the backward where it applies. The lists
** above pin each feature; this finds the combinations they miss (an FP8 cache with a bias in
** q's dtype failed to compile; so did the f32 kernel at d 320 / dv 64 with a mask_mod). */
static void test_random_requests(void **state)
{
    static const int64_t dims[] = {8, 16, 24, 40, 64, 72, 96, 128, 136, 192, 256, 320};
    static const fj_dtype dtypes[] = {FJ_DTYPE_BF16, FJ_DTYPE_F16, FJ_DTYPE_F32};
    static const char *const masks[] = {"q / 16 == k / 16", "(q + k) % 3 != 1",
                                        "k <= q + 2 || k % 7 == 0"};
    static const char *const scores[] = {"s * 0.5 + 0.1", "tanh(s) * 3", "q > k ? s : s * 2"};
    enum { N = 20 };
    fjh_case cases[N];
    uint64_t x = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < N; i++) {
        fjh_case *c = &cases[i];
        const int decode = draw(&x, 4) == 0;
        *c = base(decode ? 1 + draw(&x, 16) : 17 + draw(&x, 150), 1 + draw(&x, 300),
                  dims[draw(&x, 12)], dtypes[draw(&x, 3)]);
        c->batch = 1 + draw(&x, 3);
        c->heads_kv = 1 + draw(&x, 3);
        c->heads_q = c->heads_kv * (1 << draw(&x, 3));
        if (draw(&x, 3) == 0)
            c->head_dim_v = dims[draw(&x, 8)];
        c->layout = (fjh_layout)draw(&x, 3);
        c->desc.causal = draw(&x, 3) == 0;
        if (draw(&x, 6) == 0)
            c->desc.window_left = draw(&x, 60);
        if (draw(&x, 8) == 0)
            c->desc.window_right = draw(&x, 60);
        if (draw(&x, 6) == 0)
            c->desc.softcap = 5.0f + (float)draw(&x, 30);
        if (draw(&x, 8) == 0)
            c->desc.softmax_scale = draw(&x, 2) ? -0.2f : 0.3f;
        const int fp8_cache = c->dtype != FJ_DTYPE_F32 && draw(&x, 6) == 0;
        if (fp8_cache)
            c->kv_fp8 = draw(&x, 2) ? FJ_DTYPE_F8_E4M3 : FJ_DTYPE_F8_E5M2;
        if (decode && draw(&x, 3) == 0) {
            c->paged = 1 << draw(&x, 7);
        } else if (draw(&x, 8) == 0) {
            c->varlen = 1 + draw(&x, 2);
        } else {
            if (draw(&x, 5) == 0)
                c->desc.mask_mod = masks[draw(&x, 3)];
            if (draw(&x, 5) == 0)
                c->desc.score_mod = scores[draw(&x, 3)];
            if (draw(&x, 8) == 0)
                c->alibi = 1 + draw(&x, 2);
            if (draw(&x, 6) == 0) {
                c->bias = 1 + draw(&x, 3);
                c->bias_f32 = draw(&x, 2);
            }
            if (draw(&x, 8) == 0)
                c->mask = 1 + draw(&x, 2);
            if (draw(&x, 8) == 0)
                c->ranges = draw(&x, 2) ? 2 : 4;
            if (draw(&x, 8) == 0)
                c->blocks = 1 + draw(&x, 2);
        }
        if (!fp8_cache && !c->paged && draw(&x, 3) == 0) {
            c->backward = 1;
            c->desc.deterministic = draw(&x, 4) == 0;
            c->dbias = c->bias && !c->varlen && draw(&x, 2);
        }
    }
    run_cases(state, cases, N);
}

static void test_second_call_is_memoised(void **state)
{
    fj_context *ctx = suite_context(state);
    fjh_case c = base(64, 64, 32, FJ_DTYPE_BF16);
    fjh_result r1, r2;
    assert_int_equal(fjh_run(ctx, &c, &r1), FJ_OK);
    assert_int_equal(fjh_run(ctx, &c, &r2), FJ_OK);
    assert_true(r1.pass && r2.pass);
    assert_int_equal(r2.first.source, FJ_KERNEL_MEMORY);
    assert_int_equal(r2.first.compiles, r1.first.compiles);
    assert_string_equal(r1.variant, r2.variant);
    /* Another head dim in the same padded bucket (17..32, multiple of 8) reuses the kernel. */
    c.head_dim = c.head_dim_v = 24;
    assert_int_equal(fjh_run(ctx, &c, &r2), FJ_OK);
    assert_true(r2.pass);
    assert_int_equal(r2.first.source, FJ_KERNEL_MEMORY);
}

/* Masks for the classes' check, each as an expression and as the host's function: every class,
** a single kept or masked pair on an odd row and the last keys of a short block (a pair the
** classifier skipped would show), whole rows. */
static int keeps_docs(int q, int k) { return q / 64 == k / 64 || k < 16; }
static int keeps_band(int q, int k) { return k <= q + 100; }
static int keeps_one(int q, int k) { return q == 251 && k == 299; }
static int keeps_all_but_one(int q, int k) { return q != 131 || k != 255; }
static int keeps_rows(int q, int k)
{
    (void)k;
    return q < 128;
}
static const struct {
    const char *expr;
    int (*keeps)(int q, int k);
} class_masks[] = {{"q / 64 == k / 64 || k < 16", keeps_docs},
                   {"k <= q + 100", keeps_band},
                   {"q == 251 && k == 299", keeps_one},
                   {"q != 131 || k != 255", keeps_all_but_one},
                   {"q < 128", keeps_rows}};

/* fj_block_mask_build: the classes of each mask_mod above over 300 x 300 pairs equal the
** host's count of kept pairs per 128 x 128 block (pairs past the ends ignored); a forward
** given them as desc.block_mask equals one that classifies itself; bad arguments are named.
** Packed sequences: the same classes (those of the padded batch), the same agreement, and
** masks that read a sequence's lengths refused. */
static void test_block_mask_build(void **state)
{
    fj_context *ctx = suite_context(state);
    enum { B = 2, S = 300, H = 4, HKV = 2, D = 32, NB = (S + 127) / 128 };
    const size_t nq = (size_t)B * S * H * D, nk = (size_t)B * S * HKV * D;
    float *host = malloc(nq * sizeof *host);
    assert_non_null(host);
    uint64_t r = 7;
    for (size_t i = 0; i < nq; i++) {
        host[i] = (float)fjr_signed_unit(fjr_lcg(&r));
    }
    void *q, *k, *o1, *o2, *cls;
    assert_int_equal(fj_malloc(ctx, nq * 4, &q), FJ_OK);
    assert_int_equal(fj_malloc(ctx, nk * 4, &k), FJ_OK);
    assert_int_equal(fj_malloc(ctx, nq * 4, &o1), FJ_OK);
    assert_int_equal(fj_malloc(ctx, nq * 4, &o2), FJ_OK);
    assert_int_equal(fj_malloc(ctx, NB * NB * 4, &cls), FJ_OK);
    assert_int_equal(fj_memcpy_h2d(ctx, q, host, nq * 4), FJ_OK);
    assert_int_equal(fj_memcpy_h2d(ctx, k, host + 5, nk * 4), FJ_OK);
    fj_tensor tq = {.data = q, .dtype = FJ_DTYPE_F32, .ndim = 4, .shape = {B, S, H, D},
                    .stride = {S * H * D, H * D, D, 1}};
    fj_tensor tk = tq, to1 = tq, to2 = tq;
    tk.data = k;
    tk.shape[2] = HKV;
    tk.stride[0] = S * HKV * D;
    tk.stride[1] = HKV * D;
    to1.data = o1;
    to2.data = o2;
    fj_tensor tc = {.data = cls, .dtype = FJ_DTYPE_I32, .ndim = 4, .shape = {1, 1, NB, NB},
                    .stride = {NB * NB, NB * NB, NB, 1}};
    fj_attention_desc desc;
    fj_attention_desc_init(&desc);
    int32_t got[NB * NB], want[NB * NB];
    fj_status st;
    for (size_t m = 0; m < sizeof class_masks / sizeof class_masks[0]; m++) {
        desc.mask_mod = class_masks[m].expr;
        st = fj_block_mask_build(ctx, &desc, &tq, &tk, &tc, NULL);
        if (st != FJ_OK)
            fail_msg("fj_block_mask_build: %s", fj_context_last_error(ctx));
        assert_int_equal(fj_memcpy_d2h(ctx, got, cls, sizeof got), FJ_OK);
        for (int qb = 0; qb < NB; qb++)
            for (int kb = 0; kb < NB; kb++) {
                int kept = 0, pairs = 0;
                for (int i = qb * 128; i < S && i < qb * 128 + 128; i++)
                    for (int j = kb * 128; j < S && j < kb * 128 + 128; j++, pairs++)
                        kept += class_masks[m].keeps(i, j);
                want[qb * NB + kb] = kept == 0 ? 0 : kept == pairs ? 2 : 1;
                if (got[qb * NB + kb] != want[qb * NB + kb])
                    fail_msg("%s: block (%d, %d) has class %d, want %d", desc.mask_mod, qb, kb,
                             got[qb * NB + kb], want[qb * NB + kb]);
            }
    }
    /* The first mask's classes (checked above) for the rest. */
    desc.mask_mod = class_masks[0].expr;
    assert_int_equal(fj_block_mask_build(ctx, &desc, &tq, &tk, &tc, NULL), FJ_OK);
    assert_int_equal(fj_memcpy_d2h(ctx, want, cls, sizeof want), FJ_OK);

    /* The forward with the classes as its block_mask, against one that classifies itself. */
    assert_int_equal(fj_attention_forward(ctx, &desc, &tq, &tk, &tk, &to1, NULL, NULL), FJ_OK);
    fj_attention_desc with = desc;
    with.block_mask = &tc;
    assert_int_equal(fj_attention_forward(ctx, &with, &tq, &tk, &tk, &to2, NULL, NULL), FJ_OK);
    fj_call_info info = {.struct_size = sizeof info}; /* no classification pre-pass */
    assert_int_equal(fj_context_last_call(ctx, &info), FJ_OK);
    assert_non_null(strstr(info.launched, info.kernel_path));
    assert_null(strstr(info.launched, "classify"));
    float *a = malloc(nq * 4), *b = malloc(nq * 4);
    assert_true(a && b);
    assert_int_equal(fj_memcpy_d2h(ctx, a, o1, nq * 4), FJ_OK);
    assert_int_equal(fj_memcpy_d2h(ctx, b, o2, nq * 4), FJ_OK);
    double diff = 0;
    for (size_t i = 0; i < nq; i++)
        diff = fmax(diff, fabs((double)a[i] - b[i]));
    assert_true(diff <= 1e-6);

    /* Bad arguments, each named. */
    fj_tensor bad = tc;
    bad.shape[2] = NB + 1;
    assert_int_equal(fj_block_mask_build(ctx, &desc, &tq, &tk, &bad, NULL),
                     FJ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fj_context_last_error(ctx), "classes.shape[2]"));
    assert_int_equal(fj_block_mask_build(ctx, &with, &tq, &tk, &tc, NULL), FJ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fj_context_last_error(ctx), "desc.block_mask is set"));
    assert_int_equal(fj_block_mask_build(ctx, &desc, &tq, &tk, NULL, NULL),
                     FJ_ERR_INVALID_ARGUMENT);
    assert_string_equal(fj_context_last_error(ctx), "classes is NULL");
    fj_attention_desc plain;
    fj_attention_desc_init(&plain);
    assert_int_equal(fj_block_mask_build(ctx, &plain, &tq, &tk, &tc, NULL),
                     FJ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fj_context_last_error(ctx), "no element mask"));
    fj_attention_desc by_head = desc;
    by_head.mask_mod = "h == 0 || k <= q";
    assert_int_equal(fj_block_mask_build(ctx, &by_head, &tq, &tk, &tc, NULL),
                     FJ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fj_context_last_error(ctx), "classes.shape[1] = 1, but the masks "
                                                       "differ by head"));

    /* Packed sequences (three, of 250, 300 and 50 rows against 300, 120 and 180 keys): classes
    ** of the padded batch of the longest, the dense case's here, which the forward then takes. */
    void *offsets;
    assert_int_equal(fj_malloc(ctx, 8 * sizeof(int32_t), &offsets), FJ_OK);
    const int32_t cu[8] = {0, 250, 550, 600, 0, 300, 420, 600};
    assert_int_equal(fj_memcpy_h2d(ctx, offsets, cu, sizeof cu), FJ_OK);
    fj_tensor pq = {.data = q, .dtype = FJ_DTYPE_F32, .ndim = 3, .shape = {B * S, H, D},
                    .stride = {H * D, D, 1}};
    fj_tensor pk = {.data = k, .dtype = FJ_DTYPE_F32, .ndim = 3, .shape = {B * S, HKV, D},
                    .stride = {HKV * D, D, 1}};
    fj_tensor po1 = pq, po2 = pq;
    po1.data = o1;
    po2.data = o2;
    fj_tensor cu_q = {.data = offsets, .dtype = FJ_DTYPE_I32, .ndim = 1, .shape = {4},
                      .stride = {1}};
    fj_tensor cu_k = cu_q;
    cu_k.data = (int32_t *)offsets + 4;
    fj_attention_desc packed = desc;
    packed.cu_seqlens_q = &cu_q;
    packed.cu_seqlens_k = &cu_k;
    packed.max_seqlen_q = packed.max_seqlen_k = S;
    assert_int_equal(fj_memcpy_h2d(ctx, cls, (int32_t[NB * NB]){0}, NB * NB * 4), FJ_OK);
    st = fj_block_mask_build(ctx, &packed, &pq, &pk, &tc, NULL);
    if (st != FJ_OK)
        fail_msg("fj_block_mask_build, packed: %s", fj_context_last_error(ctx));
    assert_int_equal(fj_memcpy_d2h(ctx, got, cls, sizeof got), FJ_OK);
    assert_memory_equal(got, want, sizeof want);
    assert_int_equal(fj_attention_forward(ctx, &packed, &pq, &pk, &pk, &po1, NULL, NULL), FJ_OK);
    fj_attention_desc packed_with = packed;
    packed_with.block_mask = &tc;
    assert_int_equal(fj_attention_forward(ctx, &packed_with, &pq, &pk, &pk, &po2, NULL, NULL),
                     FJ_OK);
    assert_int_equal(fj_memcpy_d2h(ctx, a, o1, nq * 4), FJ_OK);
    assert_int_equal(fj_memcpy_d2h(ctx, b, o2, nq * 4), FJ_OK);
    diff = 0;
    for (size_t i = 0; i < nq; i++)
        diff = fmax(diff, fabs((double)a[i] - b[i]));
    assert_true(diff <= 1e-6);
    /* A mask that reads a sequence's own lengths cannot be classified as the longest's. */
    fj_attention_desc by_length = packed;
    by_length.mask_mod = "k <= q + sk - sq";
    assert_int_equal(fj_block_mask_build(ctx, &by_length, &pq, &pk, &tc, NULL),
                     FJ_ERR_UNSUPPORTED);
    assert_non_null(strstr(fj_context_last_error(ctx), "desc.mask_mod reads sq or sk"));
    void *bufs[6] = {q, k, o1, o2, cls, offsets};
    for (int i = 0; i < 6; i++)
        fj_free(ctx, bufs[i]);
    free(host);
    free(a);
    free(b);
}

/* A broken template or a kernel that does not compile reaches the caller as a status and a
** message, and the context keeps working afterwards. */
static void test_template_and_compile_errors_reach_caller(void **state)
{
    fj_context *ctx = suite_context(state);
    char dir[] = "/tmp/fj-broken-XXXXXX";
    assert_non_null(mkdtemp(dir));
    /* Every kernel design, so the override applies whichever the device uses (16 query rows
    ** are a decode: its kernels too). */
    static const char *const names[] = {"attn_fwd_simt.lua",     "attn_fwd_mma.cu.lua",
                                        "attn_fwd_wgmma.cu.lua", "attn_decode.lua",
                                        "attn_decode_mma.cu.lua", "attn_decode_vec.cu.lua",
                                        "attn_decode_wgmma.cu.lua"};
    enum { NAMES = sizeof names / sizeof names[0] };
    char paths[NAMES][256];
    for (int p = 0; p < NAMES; p++)
        snprintf(paths[p], sizeof paths[p], "%s/%s", dir, names[p]);
    /* A context of its own reads the folder (it renders from the files there as they are then). */
    fj_context *broken_ctx = suite_context_with_env("FLASHJIT_TEMPLATE_DIR", dir);

    static const struct {
        const char *text;
        fj_status status;
        const char *message;
        int64_t head_dim; /* a head dim no other test uses, so nothing is memoised */
    } broken[] = {
        {"% error('this template is broken')\n", FJ_ERR_TEMPLATE, "this template is broken", 100},
        {"this is not a kernel;\n", FJ_ERR_COMPILE, "error", 136},
    };
    for (int i = 0; i < 2; i++) {
        for (int p = 0; p < NAMES; p++) {
            FILE *f = fopen(paths[p], "w");
            assert_non_null(f);
            fputs(broken[i].text, f);
            fclose(f);
        }
        fjh_case c = base(16, 16, broken[i].head_dim, FJ_DTYPE_BF16);
        fjh_result r;
        assert_int_equal(fjh_run(broken_ctx, &c, &r), broken[i].status);
        if (!strstr(r.error, broken[i].message))
            fail_msg("message '%s' lacks '%s'", r.error, broken[i].message);
    }
    for (int p = 0; p < NAMES; p++)
        unlink(paths[p]);
    rmdir(dir);
    /* With the files gone it renders the embedded templates: the failures left nothing behind
    ** (the suite's context never saw the folder). */
    fjh_case c = base(16, 16, 100, FJ_DTYPE_BF16);
    fjh_result r;
    assert_int_equal(fjh_run(broken_ctx, &c, &r), FJ_OK);
    assert_true(r.pass);
    fj_context_destroy(broken_ctx);
    assert_int_equal(fjh_run(ctx, &c, &r), FJ_OK);
    assert_true(r.pass);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_seqlens),
        cmocka_unit_test(test_head_dims),
        cmocka_unit_test(test_wide_head_dims),
        cmocka_unit_test(test_dtypes),
        cmocka_unit_test(test_gqa_mqa),
        cmocka_unit_test(test_windows_softcap_scale),
        cmocka_unit_test(test_fully_masked_rows),
        cmocka_unit_test(test_layouts_and_lse),
        cmocka_unit_test(test_many_work_tiles),
        cmocka_unit_test(test_alibi_bias_mask),
        cmocka_unit_test(test_varlen),
        cmocka_unit_test(test_mask_ranges),
        cmocka_unit_test(test_block_mask),
        cmocka_unit_test(test_block_mask_build),
        cmocka_unit_test(test_mask_and_score_expressions),
        cmocka_unit_test(test_nested_expressions),
        cmocka_unit_test(test_masks_over_many_blocks),
        cmocka_unit_test(test_long_sequences),
        cmocka_unit_test(test_random_requests),
        cmocka_unit_test(test_second_call_is_memoised),
        cmocka_unit_test(test_template_and_compile_errors_reach_caller),
    };
    return suite_run("attention", tests);
}
