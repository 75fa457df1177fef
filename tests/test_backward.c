/* The backward on one backend (FJ_TEST_BACKEND): dq, dk, dv of random problems against the
** float64 reference's analytic gradients (which a finite-difference check confirms first), over
** odd sizes, GQA, every mask kind and score term, soft-capping, both scale signs, layouts,
** dtypes and packed sequences; with and without dq's atomics on tensor cores; bit-identical
** deterministic gradients run to run; bad arguments named. Without a device of that backend the
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
#include "plan/expr.h"

static fjh_case bwd_case(int64_t sq, int64_t sk, int64_t hq, int64_t hkv, int64_t d,
                         fj_dtype dtype)
{
    fjh_case c = fjh_case_of(2, sq, sk, hq, hkv, d, dtype);
    c.backward = 1;
    return c;
}

/* Whether path is one of the '|'-separated names of list. */
static int path_in(const char *path, const char *list)
{
    const size_t len = strlen(path);
    for (const char *p = list; p; p = strchr(p, '|') ? strchr(p, '|') + 1 : NULL)
        if (!strncmp(p, path, len) && (p[len] == '|' || p[len] == '\0'))
            return 1;
    return 0;
}

/* Runs and checks the cases on ctx; bwd_paths (NULL: any) the backward kernels, '|'-separated,
** one of which each must have run on. */
static void run_cases_in(fj_context *ctx, const fjh_case *cases, size_t n, const char *bwd_paths)
{
    int failures = 0;
    for (size_t i = 0; i < n; i++) {
        fjh_result r;
        char desc[512];
        fjh_describe(&cases[i], desc, sizeof desc);
        fjh_run(ctx, &cases[i], &r);
        /* A dbias case must have checked it (a reference of nonzero magnitude). */
        const int ok = r.pass && (!cases[i].dbias || r.grad_max[3] > 0) &&
                       (!bwd_paths || path_in(r.bwd_kernel_path, bwd_paths));
        printf("  %s %s | dq %.3g dk %.3g dv %.3g (plain %.3g %.3g %.3g)", ok ? "ok  " : "FAIL",
               desc, r.grad_err[0], r.grad_err[1], r.grad_err[2], r.grad_lowp_err[0],
               r.grad_lowp_err[1], r.grad_lowp_err[2]);
        if (cases[i].dbias)
            printf(" dbias %.3g (plain %.3g)", r.grad_err[3], r.grad_lowp_err[3]);
        printf(" | %s%s\n", !r.pass ? r.why : r.bwd_kernel_path,
               r.pass && !ok ? (bwd_paths && !path_in(r.bwd_kernel_path, bwd_paths)
                                    ? ": not the expected backward kernel"
                                    : ": dbias not checked")
                             : "");
        if (!ok) {
            printf("       seed 0x%llx\n", (unsigned long long)r.seed);
            failures++;
        }
    }
    assert_int_equal(failures, 0);
}

static void run_cases(void **state, const fjh_case *cases, size_t n)
{
    run_cases_in(suite_context(state), cases, n, NULL);
}

/* The reference's gradients against central differences of L = sum(dout * out), in float64,
** with soft-capping, ALiBi, a window and GQA, and through score_mod expressions (evaluated in
** double precision here): smooth ones, a piecewise ternary, min/abs kinks, a relative-position
** term (a wrong formula fails by far more than 1e-6). */
static void test_reference_matches_finite_differences(void **state)
{
    (void)state;
    enum { B = 1, SQ = 3, SK = 5, HQ = 2, HKV = 1, D = 4, DV = 3 };
    static const float slopes[HQ] = {0.3f, 0.7f};
    static const char *const mods[] = {NULL, "tanh(s) * 2.0 + s * s / 3.0",
                                       "s > 0.1 ? exp(s) - 1.0 : 0.5 * s",
                                       "sqrt(s * s + 1.0) - 0.1 * abs(q - k) + min(s, 0.3)",
                                       "log(1.0 + exp(s)) / (1.5 + s * s)"};
    for (size_t m = 0; m < sizeof mods / sizeof mods[0]; m++) {
        fj__expr *mod = NULL;
        fj__err err = {{0}};
        if (mods[m])
            assert_int_equal(fj__expr_parse("score_mod", mods[m], 1, &mod, &err), FJ_OK);
        fjr_problem p = {.batch = B, .seqlen_q = SQ, .seqlen_k = SK, .heads_q = HQ,
                         .heads_kv = HKV, .head_dim = D, .head_dim_v = DV, .scale = 0.7,
                         .softcap = m % 2 ? 0 : 1.5, .window_left = 3, .window_right = 1,
                         .alibi = slopes, .score_mod = mod, .exact_mods = 1};
        double q[B * SQ * HQ * D], k[B * SK * HKV * D], v[B * SK * HKV * DV];
        double g[B * SQ * HQ * DV], out[B * SQ * HQ * DV];
        double dq[sizeof q / sizeof q[0]], dk[sizeof k / sizeof k[0]], dv[sizeof v / sizeof v[0]];
        uint64_t s = 7 + m;
        double *all[4] = {q, k, v, g};
        const size_t n[4] = {sizeof q / 8, sizeof k / 8, sizeof v / 8, sizeof g / 8};
        for (int t = 0; t < 4; t++)
            for (size_t i = 0; i < n[t]; i++) {
                all[t][i] = fjr_signed_unit(fjr_lcg(&s));
            }
        fjr_attention_backward(&p, q, k, v, g, dq, dk, dv);
        double *grads[3] = {dq, dk, dv};
        const double h = 1e-6;
        for (int t = 0; t < 3; t++)
            for (size_t i = 0; i < n[t]; i++) {
                double loss[2];
                for (int side = 0; side < 2; side++) {
                    const double keep = all[t][i];
                    all[t][i] = keep + (side ? -h : h);
                    fjr_attention(&p, q, k, v, out, NULL);
                    all[t][i] = keep;
                    loss[side] = 0;
                    for (size_t e = 0; e < n[3]; e++)
                        loss[side] += g[e] * out[e];
                }
                const double numeric = (loss[0] - loss[1]) / (2 * h);
                if (fabs(numeric - grads[t][i]) > 1e-6)
                    fail_msg("score_mod \"%s\", tensor %d element %zu: analytic %.9g, finite "
                             "difference %.9g",
                             mods[m] ? mods[m] : "", t, i, grads[t][i], numeric);
            }
        fj__expr_free(mod);
    }
}

/* Odd sizes, GQA, causal and windows, soft-capping, a negative scale, d != dv, dtypes. */
static void test_shapes_and_options(void **state)
{
    static const int64_t sizes[][5] = {{1, 1, 2, 2, 16}, {7, 130, 4, 2, 40}, {129, 65, 6, 2, 64},
                                       {33, 33, 4, 1, 128}, {50, 300, 2, 2, 72}};
    static const fj_dtype dtypes[] = {FJ_DTYPE_BF16, FJ_DTYPE_F16, FJ_DTYPE_F32};
    fjh_case cases[17];
    size_t n = 0;
    for (size_t i = 0; i < 5; i++)
        for (int causal = 0; causal < 2; causal++) {
            cases[n] = bwd_case(sizes[i][0], sizes[i][1], sizes[i][2], sizes[i][3], sizes[i][4],
                                dtypes[(i + causal) % 3]);
            cases[n].desc.causal = causal;
            if (i == 1)
                cases[n].head_dim_v = 24;
            if (i == 2 && causal)
                cases[n].desc.window_left = 20;
            if (i == 3)
                cases[n].desc.softcap = 3.0f;
            if (i == 4)
                cases[n].desc.softmax_scale = causal ? -0.15f : 0.3f;
            n++;
        }
    cases[n] = bwd_case(45, 70, 4, 2, 64, FJ_DTYPE_BF16);
    cases[n++].layout = FJH_LAYOUT_BHSD;
    cases[n] = bwd_case(45, 70, 4, 2, 64, FJ_DTYPE_F16);
    cases[n].desc.window_left = 5;
    cases[n].desc.window_right = 9;
    cases[n++].layout = FJH_LAYOUT_PADDED;
    cases[n] = bwd_case(21, 40, 2, 1, 576, FJ_DTYPE_F32);
    cases[n++].head_dim_v = 512;
    /* One key: P = 1 and dS = dP - D cancels, so dq and dk are 0 and a float kernel's are its
    ** rounding (checked against the terms' magnitude, not the zero gradient). */
    cases[n++] = bwd_case(40, 1, 4, 2, 96, FJ_DTYPE_F32);
    /* Causal with 680 rows that see no key: whole query tiles far below the band (the forward
    ** once counted fewer key tiles than none for them, and hung on Hopper) */
    cases[n] = bwd_case(700, 20, 2, 1, 64, FJ_DTYPE_BF16);
    cases[n++].desc.causal = 1;
    run_cases(state, cases, n);
}

/* The tensor-core stages (CUDA): many tiles each way, ragged ends, causal with sq < sk and
** sq > sk (rows that see no key), windows, soft-capping, a negative scale, GQA and MQA, d != dv,
** head dims to 256 (dV and dK in separate launches beyond d + dv = 256: MLA's 192 / 128, 256),
** element masks and score terms (a mask_mod, the mask tensor, ranges, ALiBi with a bias, a
** score_mod with soft-capping), block classes (alone; shared, with a mask_mod), packed
** sequences (with seqused_k, causal; with a mask_mod); each must run on the tensor-core
** kernels, with dq added by atomics (the default) and deterministic (dq a stage of its own, or
** on Hopper added in runs into slices of its sum):
** on the default kernels (Hopper's dk/dv kernel on sm_90a where it serves, mma.sync elsewhere),
** and, on sm_90a, again with FLASHJIT_BWD_CONFIG=path=mma (the mma.sync kernels), and
** deterministic with FLASHJIT_BWD_CONFIG=dq_turns=1. */
static void test_tensor_core_tiles(void **state)
{
    if (FJ_TEST_BACKEND != FJ_BACKEND_CUDA) {
        (void)suite_context(state);
        printf("  (the tensor-core stages exist on CUDA only)\n");
        skip();
    }
    fjh_case cases[20];
    size_t n = 0;
    cases[n] = bwd_case(300, 517, 8, 2, 128, FJ_DTYPE_BF16);
    cases[n++].desc.causal = 1;
    cases[n] = bwd_case(517, 300, 8, 2, 128, FJ_DTYPE_F16);
    cases[n++].desc.causal = 1;
    cases[n] = bwd_case(256, 256, 4, 4, 64, FJ_DTYPE_BF16);
    cases[n].desc.window_left = 64;
    cases[n++].desc.window_right = 16;
    cases[n] = bwd_case(200, 333, 6, 3, 96, FJ_DTYPE_F16);
    cases[n++].desc.softcap = 5.0f;
    cases[n] = bwd_case(130, 130, 4, 1, 112, FJ_DTYPE_BF16);
    cases[n].desc.causal = 1;
    cases[n].desc.softmax_scale = -0.1f;
    cases[n++].head_dim_v = 64;
    cases[n] = bwd_case(1000, 1000, 2, 1, 128, FJ_DTYPE_BF16);
    cases[n].desc.causal = 1;
    cases[n++].desc.softcap = 30.0f;
    cases[n] = bwd_case(77, 1200, 4, 2, 32, FJ_DTYPE_BF16);
    cases[n].desc.window_left = 100;
    cases[n++].desc.window_right = 0;
    cases[n] = bwd_case(64, 64, 2, 2, 16, FJ_DTYPE_F16);
    cases[n++].layout = FJH_LAYOUT_BHSD;
    cases[n] = bwd_case(333, 250, 4, 2, 256, FJ_DTYPE_BF16);
    cases[n++].desc.causal = 1;
    cases[n] = bwd_case(200, 300, 4, 1, 192, FJ_DTYPE_BF16);
    cases[n].head_dim_v = 128;
    cases[n++].desc.softcap = 20.0f;
    cases[n] = bwd_case(150, 150, 2, 2, 160, FJ_DTYPE_F16);
    cases[n].desc.window_left = 40;
    cases[n++].desc.window_right = 40;
    cases[n] = bwd_case(97, 130, 4, 4, 256, FJ_DTYPE_F16);
    cases[n++].head_dim_v = 64;
    cases[n] = bwd_case(300, 300, 4, 2, 64, FJ_DTYPE_BF16);
    cases[n].desc.mask_mod = "k % 3 != 0 && k <= q + 20";
    cases[n++].mask = 1;
    cases[n] = bwd_case(200, 330, 4, 2, 128, FJ_DTYPE_F16);
    cases[n].alibi = 2;
    cases[n].bias = 1;
    cases[n++].desc.causal = 1;
    cases[n] = bwd_case(250, 250, 2, 1, 64, FJ_DTYPE_BF16);
    cases[n++].ranges = 4;
    cases[n] = bwd_case(180, 220, 4, 2, 96, FJ_DTYPE_BF16);
    cases[n].desc.softcap = 15.0f;
    cases[n++].desc.score_mod = "s * 0.5 + tanh(s) - 0.01 * abs(q - k)";
    cases[n] = bwd_case(230, 300, 4, 2, 64, FJ_DTYPE_BF16);
    cases[n].batch = 5;
    cases[n].varlen = 2;
    cases[n++].desc.causal = 1;
    cases[n] = bwd_case(180, 180, 4, 4, 128, FJ_DTYPE_F16);
    cases[n].batch = 3;
    cases[n].varlen = 1;
    cases[n++].desc.mask_mod = "k % 2 == 0 || q == k";
    cases[n] = bwd_case(400, 520, 4, 2, 64, FJ_DTYPE_BF16);
    cases[n].desc.causal = 1;
    cases[n++].blocks = 1;
    cases[n] = bwd_case(300, 300, 4, 1, 128, FJ_DTYPE_F16);
    cases[n].desc.mask_mod = "(q / 50) % 2 == (k / 50) % 2";
    cases[n++].blocks = 2;
    fj_context *ctx = suite_context(state);
    for (int deterministic = 0; deterministic <= 1; deterministic++) {
        for (size_t i = 0; i < n; i++)
            cases[i].desc.deterministic = deterministic;
        run_cases_in(ctx, cases, n, "cuda.bwd.wgmma|cuda.bwd.mma");
    }
    fj_device_info dev = {.struct_size = sizeof dev};
    assert_int_equal(fj_context_get_device_info(ctx, &dev), FJ_OK);
    if (strcmp(dev.arch, "sm_90a") != 0)
        return;
    /* The portable kernels on Hopper: a context made with the override. */
    fj_context *mma = suite_context_with_env("FLASHJIT_BWD_CONFIG", "path=mma");
    for (size_t i = 0; i < n; i++)
        cases[i].desc.deterministic = (int32_t)(i % 2);
    run_cases_in(mma, cases, n, "cuda.bwd.mma");
    fj_context_destroy(mma);
    /* Deterministic in turns (FLASHJIT_BWD_CONFIG=dq_turns=1: the key blocks add into the one
    ** sum of dq in key-block order; where the config does not fit, the default plan). */
    fj_context *turns = suite_context_with_env("FLASHJIT_BWD_CONFIG", "dq_turns=1");
    for (size_t i = 0; i < n; i++)
        cases[i].desc.deterministic = 1;
    run_cases_in(turns, cases, n, "cuda.bwd.wgmma|cuda.bwd.mma");
    fj_context_destroy(turns);
}

/* Every mask kind and score term alone and in pairs; a row that sees no key (zero gradients). */
static void test_masks_and_terms(void **state)
{
    fjh_case cases[9];
    size_t n = 0;
    cases[n] = bwd_case(70, 90, 4, 2, 32, FJ_DTYPE_BF16);
    cases[n++].desc.mask_mod = "k % 3 != 0 && k <= q + 20";
    cases[n] = bwd_case(40, 90, 4, 2, 48, FJ_DTYPE_F16);
    cases[n].alibi = 2;
    cases[n++].bias = 1;
    cases[n] = bwd_case(60, 60, 2, 2, 16, FJ_DTYPE_F32);
    cases[n++].mask = 1; /* row 0 of (0, 0) sees no key */
    cases[n] = bwd_case(150, 150, 2, 1, 32, FJ_DTYPE_BF16);
    cases[n].ranges = 4;
    cases[n++].desc.causal = 1;
    cases[n] = bwd_case(300, 260, 2, 2, 16, FJ_DTYPE_BF16);
    cases[n++].blocks = 1;
    cases[n] = bwd_case(300, 260, 2, 2, 16, FJ_DTYPE_F32);
    cases[n].blocks = 2;
    cases[n++].desc.mask_mod = "(q + k) % 4 != 1";
    cases[n] = bwd_case(64, 64, 4, 2, 32, FJ_DTYPE_F16);
    cases[n].mask = 2;
    cases[n++].bias = 3;
    cases[n] = bwd_case(64, 80, 4, 2, 32, FJ_DTYPE_BF16);
    cases[n].alibi = 1;
    cases[n].desc.softcap = 10.0f;
    cases[n++].desc.causal = 1;
    static const int32_t perm[4] = {3, 1, 2, 0};
    cases[n] = bwd_case(50, 50, 2, 2, 32, FJ_DTYPE_F32);
    cases[n].desc.mask_mod = "iarg[q % 4] != k % 4";
    cases[n].mod_args = (const float *)perm;
    cases[n++].mod_args_count = 4;
    run_cases(state, cases, n);
}

/* Gradients through score_mod (its derivative generated from the expression): smooth terms,
** piecewise ternaries, a relative-position term, per-head arguments, with soft-capping, ALiBi,
** a bias, masks and GQA; a score_mod that masks (-inf) some pairs. */
static void test_score_mod(void **state)
{
    static const float per_head[4] = {0.5f, 1.0f, 1.5f, -0.25f};
    fjh_case cases[8];
    size_t n = 0;
    cases[n] = bwd_case(70, 90, 4, 2, 32, FJ_DTYPE_F32);
    cases[n++].desc.score_mod = "s * 0.5 + tanh(s)";
    cases[n] = bwd_case(65, 65, 4, 2, 64, FJ_DTYPE_BF16);
    cases[n].desc.causal = 1;
    cases[n++].desc.score_mod = "s > 0.0 ? s : 0.3 * s";
    cases[n] = bwd_case(40, 100, 4, 1, 48, FJ_DTYPE_F16);
    cases[n++].desc.score_mod = "s - 0.05 * abs(q - k)";
    cases[n] = bwd_case(33, 47, 4, 4, 32, FJ_DTYPE_F32);
    cases[n].desc.score_mod = "s * arg[h] + 0.01 * (k - q)";
    cases[n].mod_args = per_head;
    cases[n++].mod_args_count = 4;
    cases[n] = bwd_case(50, 60, 2, 2, 32, FJ_DTYPE_BF16);
    cases[n].desc.softcap = 5.0f;
    cases[n].alibi = 1;
    cases[n++].desc.score_mod = "exp(-s * s / 8.0) + s";
    cases[n] = bwd_case(64, 64, 4, 2, 32, FJ_DTYPE_F32);
    cases[n].bias = 1;
    cases[n].mask = 1;
    cases[n++].desc.score_mod = "min(s, 2.0) + sqrt(s * s + 1.0)";
    cases[n] = bwd_case(80, 80, 2, 1, 32, FJ_DTYPE_F32);
    cases[n].desc.causal = 1;
    cases[n++].desc.score_mod = "k % 5 == 0 ? -1.0 / 0.0 : s * 1.25";
    cases[n] = bwd_case(30, 200, 2, 2, 32, FJ_DTYPE_BF16);
    cases[n].desc.window_left = 50;
    /* floor's steps away from where scores gather: a score within rounding of a step would
    ** flip it between the kernel and the reference (lse jumps by one). */
    cases[n++].desc.score_mod = "log(1.0 + exp(s)) + floor(s * 0.125 + 0.5)";
    run_cases(state, cases, n);
}

/* The bias's gradient (desc.dbias): full, shared by the batch, a key bias broadcast over heads
** and rows (summed over them, in shares of the rows where its tiles are few); with score_mod,
** ALiBi, masks, causal and GQA; dtypes. */
static void test_dbias(void **state)
{
    fjh_case cases[12];
    size_t n = 0;
    cases[n] = bwd_case(37, 53, 4, 2, 32, FJ_DTYPE_F32);
    cases[n++].bias = 1;
    cases[n] = bwd_case(40, 40, 4, 4, 32, FJ_DTYPE_BF16);
    cases[n].bias = 2;
    cases[n++].desc.causal = 1;
    cases[n] = bwd_case(30, 70, 4, 2, 48, FJ_DTYPE_F16);
    cases[n].bias = 3;
    cases[n++].mask = 1;
    cases[n] = bwd_case(33, 47, 2, 2, 32, FJ_DTYPE_F32);
    cases[n].bias = 1;
    cases[n].bias_f32 = 1;
    cases[n++].desc.score_mod = "s > 0.0 ? tanh(s) * 2.0 : s";
    cases[n] = bwd_case(50, 50, 4, 1, 32, FJ_DTYPE_BF16);
    cases[n].bias = 3;
    cases[n].alibi = 1;
    cases[n++].desc.softcap = 4.0f;
    cases[n] = bwd_case(1, 90, 2, 2, 16, FJ_DTYPE_F32);
    cases[n++].bias = 2;
    /* Several of the kernel's 64 x 32 tiles each way, some wholly outside a band or masked. */
    cases[n] = bwd_case(150, 200, 2, 1, 24, FJ_DTYPE_BF16);
    cases[n].bias = 3;
    cases[n++].desc.causal = 1;
    cases[n] = bwd_case(130, 190, 2, 2, 40, FJ_DTYPE_F16);
    cases[n].bias = 1;
    cases[n].desc.window_left = 40;
    cases[n++].desc.mask_mod = "k / 64 != 1 || q % 3 == 0";
    /* A key bias of one sequence and one key tile: its five row tiles in shares (as many as
    ** fill twice the device's compute units: two at least), summed by a last stage. Not
    ** causal: with the band at the bottom right, 270 of the 300 rows see no key and the rest
    ** 1 to 30, so each of the 30 sums is dominated by D = rowsum(dO O) read from the rounded
    ** out (the plain implementation's D from its own rounded O): two errors of one source,
    ** and the largest of 30 exceeded twice the plain one in 5 of 200 random runs (OpenCL;
    ** 0 of 200 without the band). */
    cases[n] = bwd_case(300, 30, 4, 2, 32, FJ_DTYPE_BF16);
    cases[n].batch = 1;
    cases[n++].bias = 3;
    /* The tensor cores' tiles (64 keys by 64 rows) at the head dims of the grid: several each
    ** way, ragged ends, soft-capping (the bias is added after it: its gradient is not through
    ** tanh), a window, GQA. */
    cases[n] = bwd_case(130, 200, 4, 2, 128, FJ_DTYPE_BF16);
    cases[n].bias = 2;
    cases[n].desc.softcap = 5.0f;
    cases[n++].desc.causal = 1;
    cases[n] = bwd_case(77, 260, 2, 1, 256, FJ_DTYPE_F16);
    cases[n].bias = 1;
    cases[n].desc.window_left = 70;
    cases[n++].desc.window_right = 10;
    cases[n] = bwd_case(200, 129, 2, 2, 64, FJ_DTYPE_BF16);
    cases[n].bias = 3;
    cases[n].bias_f32 = 1;
    cases[n++].desc.score_mod = "s * 0.5 + tanh(s)";
    for (size_t i = 0; i < n; i++)
        cases[i].dbias = 1;
    run_cases(state, cases, n);
}

/* Packed sequences of different lengths (one without queries), with seqused_k (the keys past
** it get zero gradients), causal, windows, a mask_mod; each with dq by atomics and
** deterministic. Then a bias (with its gradient: full, shared by the batch, a key bias), a mask
** tensor, ranges and block classes, which index the sequences as a padded batch of the
** longest. */
static void test_varlen(void **state)
{
    fjh_case cases[15];
    for (int i = 0; i < 13; i++) {
        const int kind = i % 4;
        cases[i] = bwd_case(40 + 13 * kind, 70, 4, 2, 32,
                            kind == 2 ? FJ_DTYPE_F32 : kind == 3 ? FJ_DTYPE_F16 : FJ_DTYPE_BF16);
        cases[i].batch = 4;
        cases[i].varlen = 1 + kind % 2;
        cases[i].desc.causal = kind == 1;
        cases[i].desc.window_left = kind == 2 ? 7 : -1;
        cases[i].desc.mask_mod = kind == 3 && i < 8 ? "k % 2 == 0 || q == k" : NULL;
        cases[i].desc.deterministic = i >= 4 && i < 8;
    }
    cases[8].bias = 1;
    cases[8].dbias = 1;
    cases[9].bias = 2;
    cases[9].dbias = 1;
    cases[10].bias = 3;
    cases[10].bias_f32 = 1;
    cases[10].dbias = 1;
    cases[11].mask = 1;
    cases[12].ranges = 2;
    cases[12].bias = 1;
    /* Block classes of each sequence's own 128-row and 128-key blocks, over several blocks. */
    cases[13] = bwd_case(300, 400, 4, 2, 64, FJ_DTYPE_BF16);
    cases[13].batch = 3;
    cases[13].varlen = 2;
    cases[13].desc.causal = 1;
    cases[13].blocks = 1;
    cases[14] = bwd_case(260, 260, 4, 4, 32, FJ_DTYPE_F16);
    cases[14].batch = 3;
    cases[14].varlen = 1;
    cases[14].desc.mask_mod = "(q / 50) % 2 == (k / 50) % 2";
    cases[14].desc.deterministic = 1;
    cases[14].blocks = 2;
    run_cases(state, cases, 15);
}

/* Ten runs of the same deterministic backward of S rows at head dim D give the same bits, in
** f32 (the SIMT stages) and bf16 (on CUDA the tensor-core stages: dq a stage of its own, or on
** Hopper added into slices of an f32 sum by runs of the dk/dv stage, two runs of 16 slices at
** 4000 rows, d 40, and at 2000 rows, d 256, by the split kernel's atomics; test_plan checks
** those counts), and the call reports its workspace: D, the lse in log2 units, and dq's slices
** (nothing N x N). */
static void bit_identical_runs(fj_context *ctx, fj_dtype dtype, int S, int D)
{
    enum { B = 2, H = 4, HKV = 2 };
    const size_t nq = (size_t)B * S * H * D, nk = (size_t)B * S * HKV * D;
    const size_t es = fj_dtype_size(dtype);
    unsigned char *host = malloc(nq * 4);
    assert_non_null(host);
    uint64_t s = 99;
    for (size_t i = 0; i < nq; i++) {
        const float x = (float)fjr_signed_unit(fjr_lcg(&s));
        uint32_t bits;
        memcpy(&bits, &x, 4);
        if (dtype == FJ_DTYPE_BF16) { /* truncated: any bf16 values will do */
            const uint16_t h = (uint16_t)(bits >> 16);
            memcpy(host + i * 2, &h, 2);
        } else {
            memcpy(host + i * 4, &x, 4);
        }
    }
    void *q, *k, *v, *o, *g, *l, *grads[3];
    const size_t qb = nq * es, kb = nk * es, lb = (size_t)B * H * S * 4;
    assert_int_equal(fj_malloc(ctx, qb, &q), FJ_OK);
    assert_int_equal(fj_malloc(ctx, kb, &k), FJ_OK);
    assert_int_equal(fj_malloc(ctx, kb, &v), FJ_OK);
    assert_int_equal(fj_malloc(ctx, qb, &o), FJ_OK);
    assert_int_equal(fj_malloc(ctx, qb, &g), FJ_OK);
    assert_int_equal(fj_malloc(ctx, lb, &l), FJ_OK);
    assert_int_equal(fj_memcpy_h2d(ctx, q, host, qb), FJ_OK);
    assert_int_equal(fj_memcpy_h2d(ctx, k, host, kb), FJ_OK);
    assert_int_equal(fj_memcpy_h2d(ctx, v, host + 7 * es, kb - 7 * es), FJ_OK);
    assert_int_equal(fj_memcpy_h2d(ctx, g, host + 3 * es, qb - 3 * es), FJ_OK);
    fj_tensor tq = {.data = q,
                    .dtype = dtype,
                    .ndim = 4,
                    .shape = {B, S, H, D},
                    .stride = {S * H * D, H * D, D, 1}};
    fj_tensor tk = tq, tv, to = tq, tg = tq;
    tk.data = k;
    tk.shape[2] = HKV;
    tk.stride[0] = S * HKV * D;
    tk.stride[1] = HKV * D;
    tv = tk;
    tv.data = v;
    to.data = o;
    tg.data = g;
    fj_tensor tl = {.data = l, .dtype = FJ_DTYPE_F32, .ndim = 3, .shape = {B, H, S},
                    .stride = {H * S, S, 1}};
    fj_attention_desc desc;
    fj_attention_desc_init(&desc);
    desc.causal = 1;
    desc.deterministic = 1;
    assert_int_equal(fj_attention_forward(ctx, &desc, &tq, &tk, &tv, &to, &tl, NULL), FJ_OK);
    /* Ten runs into the same gradient buffers, poisoned before each, against the first. */
    enum { RUNS = 10 };
    unsigned char *first[3], *bytes[3];
    const size_t sizes[3] = {qb, kb, kb};
    fj_tensor td[3] = {tq, tk, tv};
    for (int i = 0; i < 3; i++) {
        assert_int_equal(fj_malloc(ctx, sizes[i], &grads[i]), FJ_OK);
        td[i].data = grads[i];
        first[i] = malloc(sizes[i]);
        bytes[i] = malloc(sizes[i]);
        assert_true(first[i] && bytes[i]);
    }
    for (int run = 0; run < RUNS; run++) {
        for (int i = 0; i < 3; i++) {
            memset(bytes[i], 0x5a + run, sizes[i]);
            assert_int_equal(fj_memcpy_h2d(ctx, grads[i], bytes[i], sizes[i]), FJ_OK);
        }
        fj_status st = fj_attention_backward(ctx, &desc, &tq, &tk, &tv, &to, &tg, &tl, &td[0],
                                             &td[1], &td[2], NULL);
        if (st != FJ_OK)
            fail_msg("fj_attention_backward: %s", fj_context_last_error(ctx));
        fj_call_info info;
        memset(&info, 0, sizeof info);
        info.struct_size = sizeof info;
        assert_int_equal(fj_context_last_call(ctx, &info), FJ_OK);
        /* D and the lse in log2 units, 8 bytes a query row and head, and dq's slices, at
        ** most 16 of f32 rows padded to 128 or 256 (each workspace 256-byte aligned) */
        const uint64_t slices = 16 * (uint64_t)B * H * S * (D <= 128 ? 128 : 256) * 4;
        assert_true(info.workspace_bytes >= 2 * (uint64_t)lb &&
                    info.workspace_bytes <= 2 * lb + slices + 3 * 256);
        for (int i = 0; i < 3; i++) {
            assert_int_equal(fj_memcpy_d2h(ctx, run ? bytes[i] : first[i], grads[i], sizes[i]),
                             FJ_OK);
            if (run && memcmp(first[i], bytes[i], sizes[i]))
                fail_msg("run %d: gradient %d differs from the first run's", run, i);
        }
    }
    for (int i = 0; i < 3; i++) {
        free(first[i]);
        free(bytes[i]);
        fj_free(ctx, grads[i]);
    }
    void *bufs[6] = {q, k, v, o, g, l};
    for (int i = 0; i < 6; i++)
        fj_free(ctx, bufs[i]);
    free(host);
}

static void test_bit_identical_runs(void **state)
{
    fj_context *ctx = suite_context(state);
    bit_identical_runs(ctx, FJ_DTYPE_F32, 77, 40);
    bit_identical_runs(ctx, FJ_DTYPE_BF16, 77, 40);
    if (FJ_TEST_BACKEND == FJ_BACKEND_CUDA) { /* the SIMT stages take seconds there on a CPU */
        bit_identical_runs(ctx, FJ_DTYPE_BF16, 4000, 40);
        bit_identical_runs(ctx, FJ_DTYPE_BF16, 2000, 256);
        /* and in turns (Hopper: one sum of dq, the key blocks adding in order) */
        fj_context *turns = suite_context_with_env("FLASHJIT_BWD_CONFIG", "dq_turns=1");
        bit_identical_runs(turns, FJ_DTYPE_BF16, 4000, 40);
        fj_context_destroy(turns);
    }
}

/* Bad arguments are named (validation comes first: the data is never read). */
static void test_bad_arguments(void **state)
{
    fj_context *ctx = suite_context(state);
    char *a = (char *)(uintptr_t)(1u << 20); /* never read; tensors 1 MiB apart */
    fj_tensor t[10];
    for (int i = 0; i < 10; i++) {
        t[i] = (fj_tensor){.data = a + ((size_t)i << 20), .dtype = FJ_DTYPE_BF16, .ndim = 4,
                           .shape = {2, 8, 2, 16}, .stride = {256, 32, 16, 1}};
    }
    fj_tensor lse = {.data = a + (20u << 20), .dtype = FJ_DTYPE_F32, .ndim = 3, .shape = {2, 2, 8},
                     .stride = {16, 8, 1}};
    /* q k v out dout dq dk dv */
    fj_tensor *q = &t[0], *k = &t[1], *v = &t[2], *out = &t[3], *dout = &t[4];
    fj_tensor *dq = &t[5], *dk = &t[6], *dv = &t[7];
    fj_attention_desc desc;
    fj_attention_desc_init(&desc);
    fj_tensor bias = {.data = a + (22u << 20), .dtype = FJ_DTYPE_F32, .ndim = 4,
                      .shape = {2, 2, 8, 8}, .stride = {0, 64, 8, 1}}; /* shared by the batch */
    fj_tensor dbias = {.data = a + (24u << 20), .dtype = FJ_DTYPE_F32, .ndim = 4,
                       .shape = {1, 2, 8, 8}, .stride = {128, 64, 8, 1}};
    fj_tensor dbias_full = dbias, dbias_bf16 = dbias;
    dbias_full.shape[0] = 2;
    dbias_bf16.dtype = FJ_DTYPE_BF16;
    struct {
        const char *message;
        fj_status status;
    } want[9] = {{"lse is NULL", FJ_ERR_INVALID_ARGUMENT},
                 {"dout.shape[1] = 9, expected 8 (as out.shape[1])", FJ_ERR_INVALID_ARGUMENT},
                 {"dk.dtype = f16 differs from k.dtype = bf16", FJ_ERR_INVALID_ARGUMENT},
                 {"dv overlaps v", FJ_ERR_INVALID_ARGUMENT},
                 {"desc.score_mod: too long to differentiate", FJ_ERR_UNSUPPORTED},
                 {"desc.deterministic = 2", FJ_ERR_INVALID_ARGUMENT},
                 {"desc.dbias is set but desc.bias is NULL", FJ_ERR_INVALID_ARGUMENT},
                 {"desc.dbias.shape[0] (batch, or 1 where the bias broadcasts it) = 2, expected 1",
                  FJ_ERR_INVALID_ARGUMENT},
                 {"desc.dbias.dtype = bf16, expected f32", FJ_ERR_INVALID_ARGUMENT}};
    for (int i = 0; i < 9; i++) {
        fj_tensor b_dout = *dout, b_dk = *dk, b_dv = *dv;
        fj_attention_desc d = desc;
        const fj_tensor *l = &lse;
        if (i == 0)
            l = NULL;
        if (i == 1)
            b_dout.shape[1] = 9;
        if (i == 2)
            b_dk.dtype = FJ_DTYPE_F16;
        if (i == 3)
            b_dv.data = v->data;
        char nested[512] = ""; /* exp(exp(...exp(s)...)): a derivative text of ~24 KB */
        for (int j = 0; j < 60; j++)
            strcat(nested, "exp(");
        strcat(nested, "s");
        for (int j = 0; j < 60; j++)
            strcat(nested, ")");
        if (i == 4)
            d.score_mod = nested;
        if (i == 5)
            d.deterministic = 2;
        if (i == 6)
            d.dbias = &dbias;
        if (i >= 7) {
            d.bias = &bias;
            d.dbias = i == 7 ? &dbias_full : &dbias_bf16;
        }
        fj_status st = fj_attention_backward(ctx, &d, q, k, v, out, &b_dout, l, dq, &b_dk, &b_dv,
                                             NULL);
        if (st != want[i].status || !strstr(fj_context_last_error(ctx), want[i].message))
            fail_msg("case %d: status %d, '%s'; expected %d and '%s'", i, st,
                     fj_context_last_error(ctx), want[i].status, want[i].message);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_matches_finite_differences),
        cmocka_unit_test(test_score_mod),
        cmocka_unit_test(test_dbias),
        cmocka_unit_test(test_tensor_core_tiles),
        cmocka_unit_test(test_shapes_and_options),
        cmocka_unit_test(test_masks_and_terms),
        cmocka_unit_test(test_varlen),
        cmocka_unit_test(test_bit_identical_runs),
        cmocka_unit_test(test_bad_arguments),
    };
    return suite_run("backward", tests);
}
