/* Plans on the OpenCL backend: every kernel family compiles, loads and loads again from the
** cache; a plan's memset and classifier steps run with workspaces from the stream's arena,
** write what the host computes, and an equal plan skips the classifier while the arena still
** holds its classes. The backward's and decode's plans for GPUs without one: which stages run
** on tensor cores, and their launches. */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "runtime/context.h"

static fj_context *opencl_context(const char *cache)
{
    fj_context_options o;
    fj_context_options_init(&o);
    o.backend = FJ_BACKEND_OPENCL;
    o.cache_path = cache;
    fj_context *ctx = NULL;
    if (fj_context_create(&o, &ctx) != FJ_OK)
        return NULL;
    return ctx;
}

/* A request of seqlen x seqlen keys, one head, d 64, with mask_mod; tensors in device memory
** (their contents do not matter to the classifier). */
typedef struct request {
    fj_tensor q, lse;
    void *mem;
    fj_attention_desc desc;
    fj__problem p;
    fj__features f;
} request;

static void make_request(fj_context *ctx, request *r, int64_t s, const char *mask_mod)
{
    memset(r, 0, sizeof *r);
    assert_int_equal(fj_malloc(ctx, (size_t)(s * 64 * 2 + s * 4), &r->mem), FJ_OK);
    r->q = (fj_tensor){.data = r->mem,
                       .dtype = FJ_DTYPE_BF16,
                       .ndim = 4,
                       .shape = {1, s, 1, 64},
                       .stride = {s * 64, 64, 64, 1}};
    r->lse = (fj_tensor){.data = (char *)r->mem + s * 64 * 2,
                         .dtype = FJ_DTYPE_F32,
                         .ndim = 3,
                         .shape = {1, 1, s},
                         .stride = {s, s, 1}};
    fj_attention_desc_init(&r->desc);
    r->desc.mask_mod = mask_mod;
    fj__err err = {{0}};
    if (fj__validate_forward(&r->desc, &r->q, &r->q, &r->q, &r->q, &r->lse, &r->p, &err) != FJ_OK)
        fail_msg("validate: %s", err.msg);
    assert_int_equal(fj__mods_resolve(&ctx->mods, &r->p, &err), FJ_OK);
    fj__features_of(&r->p, &r->f);
}

/* The plan of a Hopper-style forward of r on ctx's backend, cut before the forward itself:
** zero the tile counter (a dynamic schedule), classify the mask's blocks. */
static void classifier_plan(fj_context *ctx, const request *r, fj__plan *plan)
{
    fj__variant v;
    memset(&v, 0, sizeof v);
    v.family = FJ__FAMILY_FWD;
    v.backend = ctx->ops->kind;
    v.path = FJ__PATH_WGMMA;
    v.q_dtype = v.kv_dtype = v.out_dtype = FJ_DTYPE_BF16;
    v.acc_dtype = FJ_DTYPE_F32;
    v.tile_m = v.tile_n = 128;
    v.persistent = 2;
    v.mask_mod = r->p.mask_mod;
    fj__err err = {{0}};
    assert_int_equal(fj__plan_forward(&r->f, &ctx->device, &v, plan, &err), FJ_OK);
    assert_int_equal(plan->nsteps, 3);
    assert_int_equal(plan->steps[0].kind, FJ__STEP_MEMSET);
    assert_int_equal(plan->steps[1].variant.family, FJ__FAMILY_CLASSIFY);
    assert_int_equal(plan->main_step, 2);
    assert_true(plan->workspaces[plan->fwd.classes].memo);
    plan->nsteps = 2; /* the forward itself needs a Hopper GPU */
}

/* Runs plan for p on the context's own queue and waits for it. */
static void run_plan(fj_context *ctx, const fj__plan *plan, const fj__problem *p)
{
    if (fj__plan_run(ctx, plan, p, NULL) != FJ_OK)
        fail_msg("plan: %s", ctx->err.msg);
    assert_int_equal(fj_synchronize(ctx, NULL), FJ_OK);
}

/* The classes the arena holds for plan (qb x kb, one batch and head). */
static void read_classes(fj_context *ctx, const fj__plan *plan, int32_t *out, size_t n)
{
    assert_int_equal(ctx->narenas, 1);
    const char *mem = (const char *)ctx->arenas[0].mem;
    assert_int_equal(
        fj_memcpy_d2h(ctx, out, mem + plan->workspaces[plan->fwd.classes].offset, n * sizeof *out),
        FJ_OK);
}

static void test_every_family_loads_compiled_and_cached(void **state)
{
    (void)state;
    char cache[] = "/tmp/fj-plan-XXXXXX";
    int fd = mkstemp(cache);
    assert_true(fd >= 0);
    close(fd);
    unlink(cache);
    for (int round = 0; round < 2; round++) { /* compiled, then from the cache */
        fj_context *ctx = opencl_context(cache);
        if (!ctx) {
            print_message("SKIP: no OpenCL device: %s\n", fj_last_create_error());
            return;
        }
        request r;
        make_request(ctx, &r, 300, "q / 64 == k / 64");
        fj__variant fwd, cls;
        fj__choose_forward(&r.f, &ctx->device, NULL, &fwd);
        fj__classify_variant(&fwd, &cls);
        const fj__variant *vs[2] = {&fwd, &cls};
        for (int i = 0; i < 2; i++) {
            const fj__kernel *k = NULL;
            memset(&ctx->last_call, 0, sizeof ctx->last_call);
            if (fj__kernel_get(ctx, vs[i], &k) != FJ_OK)
                fail_msg("%s, round %d: %s", fj__variant_path(vs[i]), round, ctx->err.msg);
            assert_int_equal(ctx->last_call.source,
                             round == 0 ? FJ_KERNEL_COMPILED : FJ_KERNEL_USER_CACHE);
        }
        fj_free(ctx, r.mem);
        fj_context_destroy(ctx);
    }
    unlink(cache);
}

static void test_classifier_plan_and_its_memo(void **state)
{
    (void)state;
    fj_context *ctx = opencl_context(":memory:");
    if (!ctx) {
        print_message("SKIP: no OpenCL device: %s\n", fj_last_create_error());
        return;
    }
    /* Documents of 64 rows: 300 keys are 3 x 3 blocks of 128; the diagonal ones keep some
    ** pairs (the last, rows and keys 256-299 all in document 4, keeps every pair), the others
    ** none. */
    request r;
    make_request(ctx, &r, 300, "q / 64 == k / 64");
    fj__plan plan;
    classifier_plan(ctx, &r, &plan);
    run_plan(ctx, &plan, &r.p);
    const int32_t want[9] = {1, 0, 0, 0, 1, 0, 0, 0, 2};
    int32_t got[9];
    read_classes(ctx, &plan, got, 9);
    assert_memory_equal(got, want, sizeof want);
    /* The tile counter was zeroed. */
    int32_t counter = -1;
    assert_int_equal(
        fj_memcpy_d2h(ctx, &counter,
                      (char *)ctx->arenas[0].mem + plan.workspaces[plan.fwd.counter].offset,
                      sizeof counter),
        FJ_OK);
    assert_int_equal(counter, 0);

    /* Poisoned classes survive an equal plan: it skips the classifier. */
    const int32_t poison[9] = {7, 7, 7, 7, 7, 7, 7, 7, 7};
    char *classes = (char *)ctx->arenas[0].mem + plan.workspaces[plan.fwd.classes].offset;
    assert_int_equal(fj_memcpy_h2d(ctx, classes, poison, sizeof poison), FJ_OK);
    run_plan(ctx, &plan, &r.p);
    read_classes(ctx, &plan, got, 9);
    assert_memory_equal(got, poison, sizeof poison);

    /* Another mask's plan writes its own classes, and the first one's are then recomputed. */
    request other;
    make_request(ctx, &other, 300, "k <= q");
    fj__plan plan2;
    classifier_plan(ctx, &other, &plan2);
    run_plan(ctx, &plan2, &other.p);
    const int32_t causal[9] = {1, 0, 0, 2, 1, 0, 2, 2, 1};
    read_classes(ctx, &plan2, got, 9);
    assert_memory_equal(got, causal, sizeof causal);
    run_plan(ctx, &plan, &r.p);
    read_classes(ctx, &plan, got, 9);
    assert_memory_equal(got, want, sizeof want);

    fj_free(ctx, r.mem);
    fj_free(ctx, other.mem);
    fj_context_destroy(ctx);
}

/* A dense 16-bit backward request's features: b 2, 300 x 300, 8 / 2 heads, tensors in rows of
** 16-byte chunks. */
/* The devices the plan tests ask the planner about: an H200 (sm_90a, 227 KiB of shared memory
** a block), an sm_86 (99 KiB), an sm_75 and an OpenCL CPU device. */
typedef struct planned_devices {
    fj_device_info h200, sm86, sm75, cpu;
} planned_devices;

static planned_devices planned_device_set(void)
{
    planned_devices d;
    d.h200 = (fj_device_info){.struct_size = sizeof(fj_device_info),
                              .backend = FJ_BACKEND_CUDA,
                              .arch = "sm_90a",
                              .compute_units = 132,
                              .local_memory = 227 << 10};
    d.sm86 = d.sm75 = d.cpu = d.h200;
    snprintf(d.sm86.arch, sizeof d.sm86.arch, "sm_86");
    d.sm86.local_memory = 99 << 10;
    snprintf(d.sm75.arch, sizeof d.sm75.arch, "sm_75");
    d.cpu.backend = FJ_BACKEND_OPENCL;
    snprintf(d.cpu.arch, sizeof d.cpu.arch, "opencl");
    d.cpu.local_memory = 64 << 10;
    return d;
}

static fj__features bwd_features(int64_t d, int64_t dv, fj_dtype dtype)
{
    fj__features f;
    memset(&f, 0, sizeof f);
    f.batch = 2;
    f.seqlen_q = f.seqlen_k = 300;
    f.heads_q = 8;
    f.heads_kv = 2;
    f.head_dim = d;
    f.head_dim_v = dv;
    f.q_dtype = f.kv_dtype = f.out_dtype = dtype;
    f.bias_dtype = -1;
    f.window_left = f.window_right = -1;
    f.lse = 1;
    for (int i = 0; i < 4; i++)
        f.rows_16b[i] = 1;
    for (int i = 0; i < 3; i++)
        f.tma[i] = 1;
    f.grads_16b = f.dout_tma = 1;
    return f;
}

/* The paths of plan's steps, as "memset,simt,mma,simt" (stage 2's second launch included). */
static void stage_paths(const fj__plan *plan, char *buf, size_t size)
{
    buf[0] = 0;
    for (int i = 0; i < plan->nsteps; i++)
        snprintf(buf + strlen(buf), size - strlen(buf), "%s%s", i ? "," : "",
                 plan->steps[i].kind == FJ__STEP_MEMSET                 ? "memset"
                 : plan->steps[i].variant.family == FJ__FAMILY_CLASSIFY ? "classify"
                 : plan->steps[i].variant.path == FJ__PATH_MMA          ? "mma"
                 : plan->steps[i].variant.path == FJ__PATH_WGMMA        ? "wgmma"
                                                                        : "simt");
}

/* The bias's gradient: 64 x 64 tiles of it (rows by keys) on an H200's tensor cores, a block
** each; a key bias (summed over heads and rows) of few key tiles splits the rows into shares
** that fill the device twice (at most 64), whose sums a last stage adds; where the key tiles fill
** it, one share and no last stage. */
static void test_dbias_row_shares(void **state)
{
    (void)state;
    const planned_devices devs = planned_device_set();
    const struct {
        int64_t batch_extent, seqlen_k;
        int32_t splits;
    } cases[] = {{2, 300, 5},   /* 10 tiles: 27 shares would fill 132 SMs twice; 5 row tiles */
                 {1, 64, 5},    /* 1 tile */
                 {2, 20000, 1}, /* 626 tiles fill them */
                 {2, 4000, 3}}; /* 126 tiles: 3 shares fill them */
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fj__features f = bwd_features(128, 128, FJ_DTYPE_BF16);
        f.bias_dtype = FJ_DTYPE_F32;
        f.seqlen_k = cases[i].seqlen_k;
        f.dbias_extent[0] = cases[i].batch_extent;
        f.dbias_extent[1] = f.dbias_extent[2] = 1;
        fj__plan plan;
        fj__err err = {{0}};
        if (fj__plan_backward(&f, &devs.h200, NULL, &plan, &err) != FJ_OK)
            fail_msg("case %zu: %s", i, err.msg);
        const int32_t want = cases[i].splits;
        const fj__step *last = &plan.steps[plan.nsteps - 1];
        const fj__step *tiles = want > 1 ? last - 1 : last;
        const int64_t key_tiles = (f.seqlen_k + tiles->variant.tile_n - 1) / tiles->variant.tile_n;
        const int64_t pairs = cases[i].batch_extent;
        assert_true(tiles->variant.stage == 4 && tiles->variant.path == FJ__PATH_MMA &&
                    tiles->variant.tile_m == 64 && tiles->variant.tile_n == 64);
        assert_true(tiles->grid[0] == (uint32_t)(pairs * key_tiles) &&
                    tiles->grid[1] == (uint32_t)want);
        assert_int_equal(plan.bwd.dbias_splits, want);
        if (want == 1) {
            assert_int_equal(plan.bwd.dbias_part, -1);
            continue;
        }
        assert_int_equal(last->variant.stage, 6);
        assert_true(fj__variant_fits(&last->variant, &devs.h200));
        assert_true(last->grid[0] * last->block[0] >= (uint32_t)(pairs * f.seqlen_k) &&
                    (last->grid[0] - 1) * last->block[0] < (uint32_t)(pairs * f.seqlen_k));
        assert_true(plan.workspaces[plan.bwd.dbias_part].bytes ==
                    (size_t)(want * pairs * f.seqlen_k) * sizeof(float));
    }
}

static void test_backward_plans(void **state)
{
    (void)state;
    const planned_devices devs = planned_device_set();
    /* Deterministic: D, dk/dv (dK and dV apart above d + dv = 256), dq. Not: dq's f32 sum
    ** zeroed, D, dk/dv adding dq by atomics (with dK), dq cast from the sum. On sm_90a dk/dv
    ** runs on wgmma to d and dv 256 (where TMA can read q, k, v and dout; beyond 128 the split
    ** kernel, d_split) and dq to 128, and
    ** dk/dv adds dq there when deterministic too (into slices of its sum, in runs). */
    const struct {
        int64_t d, dv;
        fj_dtype dtype;
        int change; /* 1 dbias, 2 block classes, 3 unaligned dout, 4 a mask_mod, 5 dout TMA
                    ** cannot read (rows 16-byte aligned, a stride not), 6 soft-capping */
        const fj_device_info *dev;
        int deterministic;
        const char *paths;
    } cases[] = {
        {128, 128, FJ_DTYPE_BF16, 0, &devs.h200, 1, "memset,simt,wgmma,simt"},
        {128, 128, FJ_DTYPE_BF16, 0, &devs.h200, 0, "memset,simt,wgmma,simt"},
        {64, 64, FJ_DTYPE_F16, 4, &devs.h200, 1, "memset,classify,simt,wgmma,simt"},
        {64, 64, FJ_DTYPE_F16, 4, &devs.h200, 0, "memset,classify,simt,wgmma,simt"},
        {64, 64, FJ_DTYPE_BF16, 0, &devs.h200, 0, "memset,simt,wgmma,simt"},
        {64, 64, FJ_DTYPE_BF16, 6, &devs.h200, 0, "memset,simt,wgmma,simt"},
        /* beyond 128 on Hopper: the split dk/dv kernel, slices where deterministic */
        {256, 256, FJ_DTYPE_BF16, 0, &devs.h200, 1, "memset,simt,wgmma,simt"},
        {256, 256, FJ_DTYPE_BF16, 0, &devs.h200, 0, "memset,simt,wgmma,simt"},
        {192, 128, FJ_DTYPE_BF16, 0, &devs.h200, 1, "memset,simt,wgmma,simt"},
        {256, 256, FJ_DTYPE_BF16, 5, &devs.h200, 1, "simt,mma,mma,mma"}, /* dK, dV, dQ */
        {128, 128, FJ_DTYPE_F32, 0, &devs.h200, 0, "simt,simt,simt"},
        /* the bias's gradient: a stage after the others, on mma.sync where its tiles fit (at
        ** d 256 on sm_86 not even 16 rows do: SIMT), SIMT without tensor cores */
        {128, 128, FJ_DTYPE_BF16, 1, &devs.h200, 0, "memset,simt,wgmma,simt,mma"},
        {128, 128, FJ_DTYPE_BF16, 1, &devs.h200, 1, "memset,simt,wgmma,simt,mma"},
        {64, 64, FJ_DTYPE_BF16, 1, &devs.sm86, 1, "simt,mma,mma,mma"},
        {256, 256, FJ_DTYPE_BF16, 1, &devs.sm86, 1, "simt,mma,mma,mma,simt"},
        {128, 128, FJ_DTYPE_BF16, 1, &devs.sm75, 0, "simt,simt,simt,simt"},
        {128, 128, FJ_DTYPE_BF16, 2, &devs.h200, 0, "memset,simt,wgmma,simt"},
        {128, 128, FJ_DTYPE_BF16, 2, &devs.h200, 1, "memset,simt,wgmma,simt"},
        {96, 64, FJ_DTYPE_BF16, 0, &devs.h200, 0, "memset,simt,wgmma,simt"}, /* padded to 128 / 64 */
        {128, 128, FJ_DTYPE_BF16, 5, &devs.h200, 0, "memset,simt,mma,simt"},
        {128, 128, FJ_DTYPE_BF16, 5, &devs.h200, 1, "simt,mma,wgmma"},
        {128, 128, FJ_DTYPE_BF16, 3, &devs.h200, 0, "simt,simt,simt"},
        {512, 512, FJ_DTYPE_BF16, 0, &devs.h200, 0, "simt,simt,simt"},
        {128, 128, FJ_DTYPE_BF16, 0, &devs.sm86, 1, "simt,mma,mma"},
        {256, 256, FJ_DTYPE_BF16, 0, &devs.sm86, 1, "simt,mma,mma,mma"}, /* smaller tiles: 99 KiB */
        {256, 256, FJ_DTYPE_BF16, 0, &devs.sm86, 0, "memset,simt,mma,mma,simt"},
        {128, 128, FJ_DTYPE_BF16, 0, &devs.sm75, 0, "simt,simt,simt"},
        {128, 128, FJ_DTYPE_BF16, 0, &devs.cpu, 0, "simt,simt,simt"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fj__features f = bwd_features(cases[i].d, cases[i].dv, cases[i].dtype);
        f.deterministic = (uint8_t)cases[i].deterministic;
        if (cases[i].change == 1) { /* a bias shared by the batch: dbias [1, 8, 300, 300] */
            f.dbias_extent[0] = 1;
            f.dbias_extent[1] = f.heads_q;
            f.dbias_extent[2] = f.seqlen_q;
        }
        f.bias_dtype = cases[i].change == 1 ? FJ_DTYPE_F32 : -1;
        f.block_mask = cases[i].change == 2;
        f.grads_16b = cases[i].change != 3;
        f.dout_tma = cases[i].change != 3 && cases[i].change != 5;
        f.mask_mod = cases[i].change == 4 ? "(FJ_Q >= FJ_K)" : NULL;
        f.softcap = cases[i].change == 6;
        fj__plan plan;
        fj__err err = {{0}};
        if (fj__plan_backward(&f, cases[i].dev, NULL, &plan, &err) != FJ_OK)
            fail_msg("case %zu: %s", i, err.msg);
        char paths[64];
        stage_paths(&plan, paths, sizeof paths);
        if (strcmp(paths, cases[i].paths))
            fail_msg("case %zu (d %lld, %s): stages %s, expected %s", i, (long long)cases[i].d,
                     cases[i].dev->arch, paths, cases[i].paths);
        const fj__variant *dkdv = &plan.steps[plan.main_step].variant;
        assert_int_equal(dkdv->stage, 2);
        /* d_split: Hopper's split kernel beyond d 128; mma.sync's warp grid to d 128 where its
        ** 64-row tiles fit the shared memory (not sm_86's 99 KiB) */
        const int beyond_128 = cases[i].d > 128 || cases[i].dv > 128;
        const int grid_fits = cases[i].dev != &devs.sm86;
        if (dkdv->d_split != (dkdv->path == FJ__PATH_WGMMA ? beyond_128
                              : dkdv->path == FJ__PATH_MMA ? !beyond_128 && grid_fits
                                                           : 0))
            fail_msg("case %zu (d %lld, %s): d_split %d", i, (long long)cases[i].d,
                     cases[i].dev->arch, dkdv->d_split);
        /* Hopper's dk/dv kernels have a producer warpgroup where the element pass reads no
        ** tensor of its own (these cases: but the bias of the dbias cases): 12 warps, 128 keys
        ** (the split kernel: 64, its two computing warpgroups sharing them) */
        const int fed = dkdv->path == FJ__PATH_WGMMA && f.bias_dtype < 0;
        assert_int_equal(dkdv->producer, fed);
        if (fed)
            assert_true(dkdv->warps == 12 && dkdv->threads == 384 &&
                        dkdv->tile_n == (dkdv->d_split ? 64 : 128));
        /* and the unsplit one is persistent where deterministic (one launch in place of runs),
        ** or else at d 64 where every key block has the same work (no mask_mod, block classes,
        ** window); not with soft-capping, nor deterministic with a mask_mod (runs instead) */
        const int uniform = !f.mask_mod && !f.block_mask && cases[i].d <= 64 && cases[i].dv <= 64;
        assert_int_equal(dkdv->persistent,
                         fed && !dkdv->d_split && !f.softcap &&
                             ((cases[i].deterministic && !f.mask_mod) || uniform));
        if (dkdv->persistent && !cases[i].deterministic) /* a block an SM, or one an item */
            assert_true(plan.steps[plan.main_step].runs == 0 &&
                        plan.steps[plan.main_step].grid[0] ==
                                                (uint32_t)(2 * 2 * ((300 + 127) / 128)) &&
                        plan.steps[plan.main_step].grid[1] == 1);
        /* dq's sum: zeroed first, as large as dq in f32 (padded head dim) */
        const int atomic = plan.steps[0].kind == FJ__STEP_MEMSET;
        assert_int_equal(plan.bwd.dq_acc >= 0, atomic);
        if (atomic) { /* slices of it: one unless deterministic (then the key blocks of
                      ** each (batch, kv head) in runs, slices at a time) */
            const fj__step *main = &plan.steps[plan.main_step];
            const int slices = plan.bwd.dq_slices, keys = (300 + main->variant.tile_n - 1) /
                                                          main->variant.tile_n;
            assert_int_equal(plan.steps[0].workspace, plan.bwd.dq_acc);
            assert_true(plan.bwd.dq_slice == 2 * 8 * 300 * main->variant.head_dim_pad);
            assert_true(plan.workspaces[plan.bwd.dq_acc].bytes ==
                        (size_t)slices * (size_t)plan.bwd.dq_slice * 4);
            /* the cast last, but for the bias's gradient after it */
            const int dbias = f.dbias_extent[0] > 0;
            assert_int_equal(plan.steps[plan.nsteps - 1 - dbias].variant.stage, 5);
            if (dbias) { /* 64 x 64 tiles: 8 heads x 5 key tiles by 5 row tiles */
                const fj__step *last = &plan.steps[plan.nsteps - 1];
                assert_true(last->variant.stage == 4 && last->variant.path == FJ__PATH_MMA);
                assert_true(last->grid[0] == 8 * 5 && last->grid[1] == 5 && last->grid[2] == 1);
                assert_int_equal(last->block[0], 128);
            }
            if (cases[i].deterministic) {
                assert_true(slices >= 1 && slices <= keys && main->grid[0] == (uint32_t)slices);
                if (main->variant.persistent) /* block x takes key blocks x, x + slices, ... */
                    assert_int_equal(main->runs, 0);
                else
                    assert_true(main->runs * slices >= keys && (main->runs - 1) * slices < keys);
            } else {
                assert_true(slices == 1 && main->runs == 0);
            }
        }
        for (int s = 0; s < plan.nsteps; s++) {
            const fj__step *st = &plan.steps[s];
            if (st->kind == FJ__STEP_MEMSET)
                continue;
            assert_true(fj__variant_fits(&st->variant, cases[i].dev));
            /* Tensor-core launches take their tiles as dynamic shared memory; one block per
            ** tile of the stage's rows (keys for dk/dv, query rows for dq). */
            assert_int_equal(st->shared_bytes, st->variant.path != FJ__PATH_SIMT
                                                   ? fj__variant_shared_bytes(&st->variant)
                                                   : 0);
            if (st->variant.path != FJ__PATH_SIMT) {
                const int stage = st->variant.stage;
                const int32_t tile = stage == 2 ? st->variant.tile_n : st->variant.tile_m;
                if (st->variant.persistent || stage == 4)
                    continue; /* checked above */
                if (st->runs == 0)
                    assert_int_equal(st->grid[0], (300 + tile - 1) / tile);
                assert_int_equal(st->grid[1], stage == 2 ? 2 : 8);
                assert_int_equal(st->block[0], st->variant.threads);
            }
        }
        /* Element masks classified first: the tensor-core stages read the classes */
        const int classified = strstr(cases[i].paths, "classify") != NULL;
        assert_int_equal(plan.fwd.classes >= 0, classified);
        assert_int_equal(dkdv->block_mask, classified || cases[i].change == 2);
        if (i == 0) { /* tile overrides: one on wgmma, one on mma.sync; one that cannot fit: ignored */
            fj__plan tuned;
            assert_int_equal(fj__plan_backward(&f, cases[i].dev, "warps=4", &tuned, &err), FJ_OK);
            const fj__variant *h = &tuned.steps[tuned.main_step].variant;
            assert_true(h->path == FJ__PATH_WGMMA && h->warps == 4 && h->tile_n == 64 &&
                        h->threads == 128 && h->stages == 2 && !h->producer);
            /* the producer: switched alone, the computing warps stay; asked for with warps that
            ** cannot hold it, ignored */
            assert_int_equal(fj__plan_backward(&f, cases[i].dev, "producer=0", &tuned, &err),
                             FJ_OK);
            h = &tuned.steps[tuned.main_step].variant;
            assert_true(!h->producer && !h->persistent && h->warps == 8 && h->tile_n == 128 &&
                        h->threads == 256);
            assert_int_equal(fj__plan_backward(&f, cases[i].dev, "warps=8", &tuned, &err), FJ_OK);
            h = &tuned.steps[tuned.main_step].variant;
            assert_true(!h->producer && h->warps == 8 && h->tile_n == 128);
            assert_int_equal(
                fj__plan_backward(&f, cases[i].dev, "producer=1,warps=8", &tuned, &err), FJ_OK);
            assert_true(tuned.steps[tuned.main_step].variant.producer &&
                        tuned.steps[tuned.main_step].variant.warps == 12); /* ignored */
            /* a persistent dk/dv grid: deterministic, one launch of `slices` blocks a (batch, kv
            ** head), no runs; otherwise a block an SM at most */
            assert_int_equal(fj__plan_backward(&f, cases[i].dev, "persistent=1", &tuned, &err),
                             FJ_OK);
            const fj__step *ps = &tuned.steps[tuned.main_step];
            assert_true(f.deterministic && ps->variant.persistent == 1 && ps->runs == 0 &&
                        ps->grid[0] == (uint32_t)tuned.bwd.dq_slices && ps->grid[1] == 2);
            assert_int_equal(fj__plan_backward(&f, cases[i].dev, "persistent=0", &tuned, &err),
                             FJ_OK);
            ps = &tuned.steps[tuned.main_step];
            assert_true(ps->variant.producer && !ps->variant.persistent && ps->runs >= 1);
            fj__features nondet = f;
            nondet.deterministic = 0;
            assert_int_equal(
                fj__plan_backward(&nondet, cases[i].dev, "persistent=1", &tuned, &err), FJ_OK);
            ps = &tuned.steps[tuned.main_step];
            assert_true(ps->variant.persistent == 1 && ps->runs == 0 && ps->grid[1] == 1 &&
                        ps->grid[2] == 1 &&
                        ps->grid[0] <= (uint32_t)cases[i].dev->compute_units);
            fj__features masked = f;
            masked.mask = 1; /* its element pass spills beside a producer */
            assert_int_equal(fj__plan_backward(&masked, cases[i].dev, NULL, &tuned, &err), FJ_OK);
            h = &tuned.steps[tuned.main_step].variant;
            assert_true(h->path == FJ__PATH_WGMMA && !h->producer && h->warps == 8);
            /* a bias at d 64 (f32 or 16-bit): 64 streamed rows, where 128 spilled */
            for (int dt = 0; dt < 2; dt++) {
                fj__features biased = bwd_features(64, 64, FJ_DTYPE_BF16);
                biased.bias_dtype = dt ? FJ_DTYPE_F32 : FJ_DTYPE_BF16;
                assert_int_equal(fj__plan_backward(&biased, cases[i].dev, NULL, &tuned, &err),
                                 FJ_OK);
                h = &tuned.steps[tuned.main_step].variant;
                assert_true(h->path == FJ__PATH_WGMMA && h->bias && h->tile_m == 64);
            }
            /* the Hopper dk/dv ring: 2 to 4 slots where they fit (3 of 64 rows at d 64; at
            ** d 128 beside dQ's buffers, 3), more ignored */
            fj__features narrow = bwd_features(64, 64, FJ_DTYPE_BF16);
            narrow.softcap = 1; /* 64 rows a tile */
            assert_int_equal(fj__plan_backward(&narrow, cases[i].dev, "stages=3", &tuned, &err),
                             FJ_OK);
            assert_int_equal(tuned.steps[tuned.main_step].variant.stages, 3);
            assert_int_equal(fj__plan_backward(&f, cases[i].dev, "stages=3", &tuned, &err), FJ_OK);
            assert_int_equal(tuned.steps[tuned.main_step].variant.stages, 3);
            assert_int_equal(fj__plan_backward(&f, cases[i].dev, "stages=4", &tuned, &err), FJ_OK);
            assert_int_equal(tuned.steps[tuned.main_step].variant.stages, 2);
            assert_int_equal(fj__plan_backward(&f, cases[i].dev, "stages=6", &tuned, &err), FJ_OK);
            assert_int_equal(tuned.steps[tuned.main_step].variant.stages, 2);
            assert_int_equal(
                fj__plan_backward(&f, cases[i].dev, "path=mma,warps=8,tile_m=16", &tuned, &err),
                FJ_OK);
            const fj__variant *t = &tuned.steps[tuned.main_step].variant;
            assert_true(t->warps == 8 && t->tile_n == 128 && t->tile_m == 16 && t->threads == 256);
            assert_int_equal(tuned.steps[tuned.main_step].grid[0], (300 + 127) / 128);
            assert_int_equal(
                fj__plan_backward(&f, cases[i].dev, "warps=16,tile_m=256", &tuned, &err), FJ_OK);
            assert_true(tuned.steps[tuned.main_step].variant.warps == dkdv->warps &&
                        tuned.steps[tuned.main_step].variant.tile_m == dkdv->tile_m);
        }
        if (i == 2) { /* an override whose tiles do not divide the classes' 128 x 128 blocks:
                       ** the kernels read the masks everywhere */
            fj__plan wide;
            assert_int_equal(
                fj__plan_backward(&f, cases[i].dev, "path=mma,warps=16", &wide, &err), FJ_OK);
            const fj__variant *w = &wide.steps[wide.main_step].variant;
            assert_true(w->path == FJ__PATH_MMA && w->tile_n == 256 && !w->block_mask);
            assert_true(fj__variant_fits(w, cases[i].dev));
        }
        if (dkdv->path == FJ__PATH_WGMMA) { /* dK, dV and dQ in one launch */
            assert_int_equal(dkdv->grads, 7);
            assert_true(atomic);
            assert_true(dkdv->head_dim_pad % 64 == 0 && dkdv->head_dim_pad >= cases[i].d);
            /* 128 query rows a streamed tile at d and dv 64 with a light element pass (a
            ** mask_mod is), else 64 */
            const int light = cases[i].change != 6;
            assert_int_equal(dkdv->tile_m,
                             cases[i].d <= 64 && cases[i].dv <= 64 && light ? 128 : 64);
            /* the cast reads dq's sum with the dk/dv kernel's row stride */
            if (atomic)
                assert_int_equal(plan.steps[plan.nsteps - 1].variant.head_dim_pad,
                                 dkdv->head_dim_pad);
        }
        if (dkdv->path == FJ__PATH_MMA) {
            const int dq = atomic ? 4 : 0, apart = cases[i].d + cases[i].dv > 256;
            assert_int_equal(dkdv->grads, (apart ? 1 : 3) | dq); /* dK (and dV) */
            if (apart)
                assert_int_equal(plan.steps[plan.main_step + 1].variant.grads, 2);
        }
    }
}

/* The deterministic backward on Hopper adds dq in runs of its dk/dv stage into slices of the
** sum: as many slices as fill the 132 SMs where a run of one would not (few sequences and heads),
** one where the (batch, kv head) pairs fill them alone; every key block in exactly one run. */
static void test_deterministic_slices(void **state)
{
    (void)state;
    const planned_devices devs = planned_device_set();
    const struct {
        int64_t batch, seqlen, heads, d;
        int min_slices, max_slices;
    } cases[] = {
        {1, 16384, 16, 128, 8, 8},  /* 16 pairs: 128 blocks a run */
        {4, 4096, 16, 128, 2, 4},   /* 64 pairs */
        {16, 1024, 32, 64, 1, 1},   /* 512 pairs: four waves a run */
        {2, 1000, 4, 128, 8, 8},    /* 8 key blocks: one run */
        {3, 130, 2, 64, 2, 2},      /* 2 key blocks, the second of 2 keys */
        {1, 16384, 8, 256, 16, 16}, /* 8 pairs (the split kernel): 128 blocks a run */
        {2, 4000, 2, 40, 16, 16},   /* test_backward's bit-identical runs: two of them */
        {2, 2000, 2, 256, 16, 16},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fj__features f = bwd_features(cases[i].d, cases[i].d, FJ_DTYPE_BF16);
        f.batch = cases[i].batch;
        f.seqlen_q = f.seqlen_k = cases[i].seqlen;
        f.heads_q = f.heads_kv = cases[i].heads;
        f.deterministic = 1;
        fj__plan plan;
        fj__err err = {{0}};
        assert_int_equal(fj__plan_backward(&f, &devs.h200, NULL, &plan, &err), FJ_OK);
        const fj__step *main = &plan.steps[plan.main_step];
        const int64_t keys = (cases[i].seqlen + main->variant.tile_n - 1) / main->variant.tile_n;
        const int slices = plan.bwd.dq_slices;
        printf("  b %lld, s %lld, h %lld, d %lld: %d slices, %d runs\n", (long long)cases[i].batch,
               (long long)cases[i].seqlen, (long long)cases[i].heads, (long long)cases[i].d,
               slices, main->runs);
        assert_int_equal(main->variant.path, FJ__PATH_WGMMA);
        assert_true(slices >= cases[i].min_slices && slices <= cases[i].max_slices);
        assert_int_equal(main->grid[0], (uint32_t)slices);
        /* persistent (with a producer): block x takes key blocks x, x + slices, ... in turn;
        ** else runs of slices key blocks */
        assert_int_equal(main->variant.persistent, !main->variant.d_split);
        if (main->variant.persistent)
            assert_true(main->runs == 0 && main->grid[1] == (uint32_t)cases[i].heads &&
                        main->grid[2] == (uint32_t)cases[i].batch);
        else
            assert_true(main->runs * slices >= keys && (main->runs - 1) * slices < keys);
        assert_true(plan.workspaces[plan.bwd.dq_acc].bytes ==
                    (size_t)slices * (size_t)(cases[i].batch * cases[i].heads * cases[i].seqlen *
                                              main->variant.head_dim_pad) * 4);
    }
}

/* dq_turns (asked for: "dq_turns=1"): the deterministic persistent dk/dv stage adds into the one
** sum in turns, counted per (batch, head) and query tile in a workspace zeroed beside the sum's;
** as many blocks a (batch, kv head) as fill the SMs once (each key block of it in turn), one
** where the pairs fill them alone. Not where tiles are skipped by class (a block mask) or for
** packed sequences (the config does not fit: ignored), nor without a persistent grid. */
static void test_dq_turns(void **state)
{
    (void)state;
    const planned_devices devs = planned_device_set();
    const struct {
        int64_t batch, seqlen, heads, d;
        int block_mask, varlen;
        const char *config;
        int turns;
        uint32_t blocks; /* grid[0] with turns */
    } cases[] = {
        {1, 16384, 16, 128, 0, 0, "dq_turns=1", 1, 8},     /* 132 SMs / 16 pairs */
        {4, 4096, 16, 64, 0, 0, "dq_turns=1", 1, 2},       /* / 64 pairs */
        {16, 1024, 32, 64, 0, 0, "dq_turns=1", 1, 1},      /* 512 pairs */
        {1, 300, 4, 128, 0, 0, "dq_turns=1", 1, 3},        /* 3 key blocks of 128 */
        {1, 4096, 4, 128, 1, 0, "dq_turns=1", 0, 0},       /* block classes */
        {1, 4096, 4, 128, 0, 1, "dq_turns=1", 0, 0},       /* packed sequences */
        {1, 4096, 4, 128, 0, 0, "dq_turns=1,persistent=0", 0, 0},
        {1, 4096, 4, 128, 0, 0, NULL, 0, 0},               /* not by default */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fj__features f = bwd_features(cases[i].d, cases[i].d, FJ_DTYPE_BF16);
        f.batch = cases[i].batch;
        f.seqlen_q = f.seqlen_k = cases[i].seqlen;
        f.heads_q = f.heads_kv = cases[i].heads;
        f.block_mask = cases[i].block_mask;
        f.varlen = cases[i].varlen;
        f.deterministic = 1;
        fj__plan plan;
        fj__err err = {{0}};
        assert_int_equal(fj__plan_backward(&f, &devs.h200, cases[i].config, &plan, &err), FJ_OK);
        const fj__step *main = &plan.steps[plan.main_step];
        assert_int_equal(main->variant.path, FJ__PATH_WGMMA);
        assert_int_equal(main->variant.dq_turns, cases[i].turns);
        assert_int_equal(plan.bwd.dq_turns >= 0, cases[i].turns);
        if (!cases[i].turns)
            continue;
        const int64_t tiles = (cases[i].seqlen + main->variant.tile_m - 1) / main->variant.tile_m;
        assert_int_equal(plan.bwd.dq_slices, 1);
        assert_true(plan.workspaces[plan.bwd.dq_turns].bytes ==
                    (size_t)(cases[i].batch * cases[i].heads * tiles) * sizeof(int32_t));
        assert_true(plan.steps[0].kind == FJ__STEP_MEMSET &&
                    plan.steps[1].kind == FJ__STEP_MEMSET &&
                    plan.steps[1].workspace == plan.bwd.dq_turns);
        assert_true(main->runs == 0 && main->grid[0] == cases[i].blocks &&
                    main->grid[1] == (uint32_t)cases[i].heads &&
                    main->grid[2] == (uint32_t)cases[i].batch);
    }
}

/* The decode variant f gets on dev under config where the forward would plan fwd_path (case i
** of a table: failing when the decode does not take f). */
static fj__variant decode_variant_of(const fj__features *f, const fj_device_info *dev,
                                     const char *config, int fwd_path, size_t i)
{
    fj__variant fwd, v;
    memset(&fwd, 0, sizeof fwd);
    fwd.path = fwd_path;
    if (!fj__prefer_decode(f, dev, config, &fwd, &v))
        fail_msg("case %zu: not on a decode kernel", i);
    return v;
}

/* The tensor-core decode ring's tiles in the 128-byte swizzle's panels (swizzle): by default
** where the copy engine takes the tiles and tensor maps can (sm_90: a dense cache of 1 GiB or
** more at 128 dims; pages of whole 64-key tiles; of whole 8-key periods of the swizzle that
** divide a tile, copied a page at a time, page_rows, from 512 MiB), then a panel a copy
** ("tensor" loader);
** asked for (swizzle=1), also where cp.async columns copy them (head dims 64 and 128, dense or
** paged, sm_80 and sm_90). Dropped elsewhere: wider or odd head dims, the vector kernel, and in
** the plan tensor maps that cannot copy the tiles (pages of 4, packed sequences: bulk row
** copies then). The ring's shared memory loses its rows' padding, 16 bytes a row of K and of
** V, less the slack that puts it on a 1024-byte boundary. */
static void test_decode_swizzle(void **state)
{
    (void)state;
    const planned_devices devs = planned_device_set();
    const struct {
        int64_t d, batch, page; /* page: a paged cache's page size (0 dense; -1 packed) */
        const fj_device_info *dev;
        const char *config;
        int swizzle;         /* the variant's */
        const char *planned; /* the plan's loader */
    } cases[] = {
        {128, 2, 0, &devs.h200, "swizzle=1", 1, "columns"},
        {64, 2, 0, &devs.h200, "swizzle=1", 1, "columns"},
        {128, 2, 0, &devs.sm86, "swizzle=1", 1, "columns"},
        {128, 2, 16, &devs.h200, "bulk=0,swizzle=1", 1, "columns"},
        {128, 2, 64, &devs.h200, NULL, 1, "tensor"},
        {128, 2, 256, &devs.h200, NULL, 1, "tensor"},
        {128, 128, 16, &devs.h200, NULL, 1, "tensor"}, /* a tile across pages, 4 GiB */
        {128, 2, 16, &devs.h200, NULL, 0, "bulk"},     /* likewise, 64 MiB */
        {128, 2, 8, &devs.h200, "swizzle=1", 1, "tensor"},
        {64, 2, 32, &devs.h200, "swizzle=1", 1, "tensor"},
        {128, 2, 4, &devs.h200, NULL, 0, "bulk"},        /* pages of part periods */
        {128, 2, 4, &devs.h200, "swizzle=1", 1, "bulk"}, /* likewise, asked */
        {128, 2, 0, &devs.h200, "bulk=1,swizzle=1", 1, "tensor"},
        {128, 128, 0, &devs.h200, NULL, 1, "tensor"},              /* 4 GiB */
        {128, 128, -1, &devs.h200, "bulk=1,swizzle=1", 1, "bulk"}, /* packed sequences */
        {64, 2, 64, &devs.h200, NULL, 1, "tensor"},
        {128, 2, 64, &devs.sm86, NULL, 0, "columns"},
        {256, 2, 0, &devs.h200, "swizzle=1", 0, "bulk"}, /* Q's fragments from shared memory */
        {256, 2, 64, &devs.h200, NULL, 0, "bulk"},
        {96, 2, 0, &devs.h200, "swizzle=1", 0, "pieces"}, /* no whole panels */
        {8, 2, 0, &devs.h200, "swizzle=1", 0, "columns"},
        {32, 2, 0, &devs.h200, "swizzle=1", 0, "columns"},
        {128, 2, 0, &devs.h200, "path=vec,swizzle=1", 0, ""},
        {128, 2, 0, &devs.h200, NULL, 0, "columns"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fj__features f = bwd_features(cases[i].d, cases[i].d, FJ_DTYPE_BF16);
        f.batch = cases[i].batch;
        f.seqlen_q = 1;
        f.seqlen_k = cases[i].batch > 8 ? 8192 : 4096;
        f.heads_kv = 8;
        f.heads_q = 32;
        f.paged = cases[i].page > 0;
        f.page_size = cases[i].page > 0 ? (int32_t)cases[i].page : 0;
        f.varlen = cases[i].page < 0;
        const fj__variant v = decode_variant_of(&f, cases[i].dev, cases[i].config,
                                                FJ__PATH_WGMMA, i);
        if (v.swizzle != cases[i].swizzle)
            fail_msg("case %zu: swizzle %d, expected %d", i, v.swizzle, cases[i].swizzle);
        fj__plan plan;
        fj__err err = {{0}};
        assert_int_equal(fj__plan_decode(&f, cases[i].dev, &v, &plan, &err), FJ_OK);
        const fj__variant *planned = &plan.steps[0].variant;
        if (strcmp(fj__variant_decode_loader(planned), cases[i].planned))
            fail_msg("case %zu: the plan's loader '%s', expected '%s'", i,
                     fj__variant_decode_loader(planned), cases[i].planned);
        /* a copy a page where a tile spans pages, else a tile */
        const int tensor = !strcmp(fj__variant_decode_loader(planned), "tensor");
        const int64_t copy_rows =
            cases[i].page > 0 && cases[i].page < planned->tile_n ? cases[i].page : planned->tile_n;
        if (planned->page_rows != (tensor && cases[i].page > 0 ? copy_rows : 0))
            fail_msg("case %zu: page_rows %d", i, planned->page_rows);
        assert_true(fj__variant_fits(planned, cases[i].dev));
        assert_true((fj__variant_layout(planned) == &fj__decode_tma_params_layout) ==
                    (planned->path == FJ__PATH_WGMMA ||
                     !strcmp(fj__variant_decode_loader(planned), "tensor")));
        if (v.swizzle) {
            fj__variant padded = v;
            padded.swizzle = 0;
            const uint32_t q = 2u * (uint32_t)v.tile_m * (uint32_t)(v.head_dim_pad + 8);
            const uint32_t slack = 1023u + (1024u - q % 1024u) % 1024u;
            assert_int_equal(fj__variant_shared_bytes(&padded) + slack -
                                 fj__variant_shared_bytes(&v),
                             v.stages * v.tile_n * 2 * 16);
        }
    }
}

/* Masks and score terms in a decode (ALiBi, mask_mod, score_mod, a bias, a mask tensor): a
** paged cache takes the portable decode kernel with them; a contiguous one keeps the
** tensor-core forward on CUDA's 16-bit data and takes the decode kernel where the forward is
** the portable one. */
static void test_decode_masks_and_terms(void **state)
{
    (void)state;
    const planned_devices devs = planned_device_set();
    static const char *const mod = "(FJ_K >= 5)"; /* interned texts are compared by address */
    for (int term = 0; term < 5; term++)
        for (int paged = 0; paged <= 1; paged++)
            for (int cpu = 0; cpu <= 1; cpu++) {
                fj__features f = bwd_features(128, 128, FJ_DTYPE_BF16);
                f.seqlen_q = 1;
                f.paged = (uint8_t)paged;
                f.page_size = paged ? 16 : 0;
                f.alibi = term == 0;
                f.mask_mod = term == 1 ? mod : NULL;
                f.score_mod = term == 2 ? mod : NULL;
                f.bias_dtype = term == 3 ? FJ_DTYPE_F32 : -1;
                f.mask = term == 4;
                const fj_device_info *dev = cpu ? &devs.cpu : &devs.h200;
                fj__variant fwd, v;
                fj__choose_forward(&f, dev, NULL, &fwd);
                const int decode = fj__prefer_decode(&f, dev, NULL, &fwd, &v);
                if (decode != (paged || cpu))
                    fail_msg("term %d, paged %d, cpu %d: decode %d", term, paged, cpu, decode);
                if (decode) {
                    assert_int_equal(v.path, FJ__PATH_SIMT);
                    assert_int_equal(v.alibi, term == 0);
                    assert_true(v.mask_mod == f.mask_mod && v.score_mod == f.score_mod);
                    assert_int_equal(v.bias, term == 3);
                    assert_int_equal(v.mask_tensor, term == 4);
                }
            }
}

/* A paged chunk of more rows than decode takes, under a band (causal, a window), bounds each row
** tile's keys by its own rows (row_band), on every decode kernel (on sm_90a where path=decode
** asks: such chunks run on Hopper's forward); decode's rows and requests without a band keep the
** sequence's bounds. */
static void test_decode_row_band(void **state)
{
    (void)state;
    const planned_devices devs = planned_device_set();
    static const struct {
        int64_t seqlen_q;
        int32_t window_left, window_right;
        int want;
    } cases[] = {{64, -1, 0, 1}, {17, 100, -1, 1}, {16, -1, 0, 0}, {1, -1, 0, 0}, {64, -1, -1, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int cpu = 0; cpu <= 1; cpu++) {
            fj__features f = bwd_features(128, 128, FJ_DTYPE_BF16);
            f.seqlen_q = cases[i].seqlen_q;
            f.paged = 1;
            f.page_size = 16;
            f.window_left = cases[i].window_left;
            f.window_right = cases[i].window_right;
            fj__variant fwd, v;
            const fj_device_info *dev = cpu ? &devs.cpu : &devs.h200;
            fj__choose_forward(&f, dev, NULL, &fwd);
            assert_true(fj__prefer_decode(&f, dev, "path=decode", &fwd, &v));
            if (v.row_band != cases[i].want)
                fail_msg("sq %lld, window (%d, %d), cpu %d: row_band %d", (long long)f.seqlen_q,
                         f.window_left, f.window_right, cpu, v.row_band);
        }
}

/* The merge kernel's row index is 32-bit: a merge of more (batch, row, head) rows than that is
** refused with their count, and one of 2^30 rows planned over its work-groups of 4 rows. */
static void test_merge_row_limit(void **state)
{
    (void)state;
    fj__merge_problem p = {.n = 2,
                           .batch = 1 << 16,
                           .seqlen = 1 << 12,
                           .heads = 8,
                           .head_dim_v = 64,
                           .in_dtype = FJ_DTYPE_BF16,
                           .out_dtype = FJ_DTYPE_BF16};
    fj__plan plan;
    fj__err err = {{0}};
    assert_int_equal(fj__plan_merge(&p, FJ_BACKEND_OPENCL, &plan, &err), FJ_ERR_UNSUPPORTED);
    assert_non_null(strstr(err.msg, "2147483648 (batch, row, head) rows to merge"));
    p.heads = 4;
    assert_int_equal(fj__plan_merge(&p, FJ_BACKEND_OPENCL, &plan, &err), FJ_OK);
    assert_int_equal(plan.nsteps, 1);
    assert_int_equal(plan.steps[0].grid[0], (1u << 30) / 4);
}

/* A dense cache of 128-dim rows takes bulk copies on sm_90 (three tiles, two blocks an SM), by
** tensor maps (swizzle) once K and V reach 512 MiB, or 128 MiB where the grid has a block for
** every SM without splits, by rows from 1 GiB where tensor maps cannot copy them (k's rows
** unaligned); rows of 64 dims likewise, by tensor maps only and in four slots; smaller caches
** and sm_80 keep cp.async's four. */
static void test_decode_large_dense_bulk(void **state)
{
    (void)state;
    const planned_devices devs = planned_device_set();
    const struct {
        int64_t batch, seqlen_k, d;
        const fj_device_info *dev;
        int bulk, stages;
        int no_maps; /* k's rows not for tensor maps */
    } cases[] = {
        {128, 8192, 128, &devs.h200, 1, 3, 0}, {8, 32768, 128, &devs.h200, 1, 3, 0},
        {1, 131072, 128, &devs.h200, 1, 3, 0}, {7, 32768, 128, &devs.h200, 1, 3, 0},
        {32, 1024, 128, &devs.h200, 1, 3, 0},  {16, 1024, 128, &devs.h200, 0, 4, 0},
        {1, 65536, 128, &devs.h200, 0, 4, 0},  {8, 8192, 128, &devs.h200, 0, 4, 0},
        {1, 131072, 128, &devs.h200, 0, 4, 1}, {8, 32768, 128, &devs.h200, 1, 3, 1},
        {128, 8192, 64, &devs.h200, 1, 4, 0},  {128, 8192, 128, &devs.sm86, 0, 2, 0},
        {128, 8192, 64, &devs.h200, 0, 4, 1},  {1, 32768, 64, &devs.h200, 0, 4, 0},
        {8, 32768, 64, &devs.h200, 1, 4, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fj__features f = bwd_features(cases[i].d, cases[i].d, FJ_DTYPE_BF16);
        f.batch = cases[i].batch;
        f.seqlen_q = 1;
        f.seqlen_k = cases[i].seqlen_k;
        f.heads_kv = 8;
        f.heads_q = 32;
        f.tma[FJ__T_K] = !cases[i].no_maps;
        const fj__variant v = decode_variant_of(&f, cases[i].dev, NULL, FJ__PATH_WGMMA, i);
        if (v.path != FJ__PATH_MMA || v.bulk != cases[i].bulk || v.stages != cases[i].stages)
            fail_msg("case %zu: path %d, bulk %d, stages %d; expected mma, %d, %d", i, v.path,
                     v.bulk, v.stages, cases[i].bulk, cases[i].stages);
        assert_int_equal(v.swizzle, v.bulk && !cases[i].no_maps);
        if (v.bulk)
            assert_int_equal(v.ctas_per_sm, cases[i].d == 128 ? 2 : 3);
    }
}

/* A paged cache's chunks of prefill (beyond 16 rows, or where "path=wgmma" asks: W): Hopper's
** forward where its tiles and the pages fit (fj__page_rows: a copy a tile where
** pages hold whole tiles, a page where tiles hold whole pages of at least 8 keys), 16-bit data,
** no score terms, any row count; the decode kernels still for other page sizes, f32, ALiBi,
** and elsewhere than sm_90a. */
static void test_paged_prefill_plans(void **state)
{
    (void)state;
#define W "path=wgmma"
    const planned_devices devs = planned_device_set();
    const struct {
        int64_t d, sq, page;
        fj_dtype dtype;
        int alibi;
        const fj_device_info *dev;
        const char *config;
        int forward, tile_n, page_rows;
    } cases[] = {
        {128, 2048, 64, FJ_DTYPE_BF16, 0, &devs.h200, W, 1, 128, 64},
        {128, 2048, 16, FJ_DTYPE_BF16, 0, &devs.h200, W, 1, 128, 16},
        {128, 300, 256, FJ_DTYPE_F16, 0, &devs.h200, W, 1, 128, 128},
        {256, 300, 128, FJ_DTYPE_BF16, 0, &devs.h200, W, 1, 64, 64},
        {256, 300, 32, FJ_DTYPE_BF16, 0, &devs.h200, W, 1, 64, 32},
        {64, 300, 8, FJ_DTYPE_BF16, 0, &devs.h200, W, 1, 128, 8},
        {128, 16, 64, FJ_DTYPE_BF16, 0, &devs.h200, NULL, 0, 0, 0},
        {128, 16, 64, FJ_DTYPE_BF16, 0, &devs.h200, W, 1, 128, 64},
        {128, 2048, 64, FJ_DTYPE_BF16, 0, &devs.h200, NULL, 1, 128, 64},
        {128, 17, 16, FJ_DTYPE_BF16, 0, &devs.h200, NULL, 1, 128, 16},
        {128, 2048, 64, FJ_DTYPE_BF16, 0, &devs.h200, "path=decode", 0, 0, 0},
        {128, 2048, 48, FJ_DTYPE_BF16, 0, &devs.h200, NULL, 0, 0, 0},
        {128, 2048, 48, FJ_DTYPE_BF16, 0, &devs.h200, W, 0, 0, 0},
        {128, 2048, 5, FJ_DTYPE_BF16, 0, &devs.h200, W, 0, 0, 0},
        {128, 2048, 4, FJ_DTYPE_BF16, 0, &devs.h200, W, 0, 0, 0},
        {128, 2048, 64, FJ_DTYPE_F32, 0, &devs.h200, W, 0, 0, 0},
        {128, 2048, 64, FJ_DTYPE_BF16, 1, &devs.h200, W, 0, 0, 0},
        {128, 2048, 64, FJ_DTYPE_BF16, 0, &devs.sm86, W, 0, 0, 0},
        {128, 2048, 64, FJ_DTYPE_BF16, 0, &devs.h200, W ",tile_n=80", 1, 128, 64},
        {128, 2048, 64, FJ_DTYPE_BF16, 0, &devs.h200, W ",tile_n=64", 1, 64, 64},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fj__features f = bwd_features(cases[i].d, cases[i].d, cases[i].dtype);
        f.seqlen_q = cases[i].sq;
        f.seqlen_k = 8192;
        f.paged = 1;
        f.page_size = cases[i].page;
        f.alibi = (uint8_t)cases[i].alibi;
        fj__variant fwd, dec;
        fj__choose_forward(&f, cases[i].dev, cases[i].config, &fwd);
        const int decoded = fj__prefer_decode(&f, cases[i].dev, cases[i].config, &fwd, &dec);
        if (decoded == cases[i].forward)
            fail_msg("case %zu: %s kernel, expected the %s", i,
                     decoded ? "a decode" : "the forward",
                     cases[i].forward ? "forward" : "decode kernels");
        if (!cases[i].forward)
            continue;
        if (fwd.path != FJ__PATH_WGMMA || !fwd.paged || fwd.tile_n != cases[i].tile_n ||
            fwd.page_rows != cases[i].page_rows || !fj__variant_fits(&fwd, cases[i].dev))
            fail_msg("case %zu: path %d, paged %d, tile_n %d, page_rows %d; expected wgmma, 1, "
                     "%d, %d", i, fwd.path, fwd.paged, fwd.tile_n, fwd.page_rows,
                     cases[i].tile_n, cases[i].page_rows);
    }
    /* Packed queries: by the longest sequence, unless they are mostly decode rows (few_rows:
    ** at most 16 a sequence on average), which the decode kernels pack by kv head. */
    for (int few = 0; few <= 1; few++) {
        fj__features f = bwd_features(128, 128, FJ_DTYPE_BF16);
        f.seqlen_q = 2048;
        f.seqlen_k = 8192;
        f.paged = 1;
        f.page_size = 64;
        f.varlen = 1;
        f.few_rows = (uint8_t)few;
        fj__variant fwd, dec;
        fj__choose_forward(&f, &devs.h200, NULL, &fwd);
        assert_int_equal(fj__prefer_decode(&f, &devs.h200, NULL, &fwd, &dec), few);
    }
#undef W
}

/* The decode plans of a few query rows per sequence: which kernel (tensor cores on sm_80+
** where they fit, else CUDA's vector kernel, else the portable one; "path=vec" asks for the
** vector kernel), the packed rows a block, its shared memory (dynamic on tensor cores only),
** whether rows come by bulk copies (sm_90: paged caches, rows beyond 128 dims, large dense
** caches: test_decode_large_dense_bulk), the splits
** that fill the device and how they are merged, and the tile overrides a config gives. */
static void test_decode_plans(void **state)
{
    (void)state;
    const planned_devices devs = planned_device_set();
    const struct {
        int64_t d, sq, group;
        fj_dtype dtype;
        const fj_device_info *dev;
        const char *config;
        int path, tile_m, stages, bulk;
    } cases[] = {
        {128, 1, 4, FJ_DTYPE_BF16, &devs.h200, NULL, FJ__PATH_MMA, 16, 4, 0},
        {128, 4, 4, FJ_DTYPE_F16, &devs.h200, NULL, FJ__PATH_MMA, 16, 4, 0},
        {128, 5, 6, FJ_DTYPE_BF16, &devs.h200, NULL, FJ__PATH_MMA, 32, 4, 0},
        {64, 16, 8, FJ_DTYPE_BF16, &devs.h200, NULL, FJ__PATH_MMA, 64, 4, 0},
        {256, 1, 8, FJ_DTYPE_BF16, &devs.h200, NULL, FJ__PATH_MMA, 16, 3, 1}, /* 4 do not fit */
        {128, 1, 4, FJ_DTYPE_BF16, &devs.h200, "path=vec", FJ__PATH_VECTOR, 4, 3, 0},
        {128, 1, 4, FJ_DTYPE_BF16, &devs.h200, "stages=5", FJ__PATH_MMA, 16, 5, 0},
        {128, 1, 4, FJ_DTYPE_BF16, &devs.h200, "tile_n=128,stages=2", FJ__PATH_MMA, 16, 2, 0},
        /* 344 KiB: does not fit */
        {128, 1, 4, FJ_DTYPE_BF16, &devs.h200, "tile_n=128,stages=5", FJ__PATH_MMA, 16, 4, 0},
        /* four warps need 64 keys a tile or more */
        {128, 1, 4, FJ_DTYPE_BF16, &devs.h200, "tile_n=16", FJ__PATH_MMA, 16, 4, 0},
        {128, 1, 4, FJ_DTYPE_BF16, &devs.h200, "bulk=1", FJ__PATH_MMA, 16, 4, 1},
        {128, 1, 4, FJ_DTYPE_BF16, &devs.h200, "merge_last=1", FJ__PATH_MMA, 16, 4, 0},
        {128, 1, 4, FJ_DTYPE_BF16, &devs.sm86, "merge_last=1", FJ__PATH_MMA, 16, 2, 0},
        {128, 1, 4, FJ_DTYPE_BF16, &devs.h200, "path=vec,merge_last=1", FJ__PATH_VECTOR, 4, 3, 0},
        {128, 1, 4, FJ_DTYPE_BF16, &devs.sm86, NULL, FJ__PATH_MMA, 16, 2, 0},
        {128, 1, 4, FJ_DTYPE_BF16, &devs.sm86, "bulk=1", FJ__PATH_MMA, 16, 2, 0}, /* sm_90+ */
        {256, 1, 4, FJ_DTYPE_BF16, &devs.sm86, NULL, FJ__PATH_VECTOR, 4, 3, 0}, /* 99 KiB */
        {128, 1, 4, FJ_DTYPE_BF16, &devs.sm75, NULL, FJ__PATH_VECTOR, 4, 3, 0},
        /* bulk copies of a paged cache's rows, two blocks an SM; a deeper ring asked without
        ** bulk=1 (a config or record from before bulk copies) by cp.async */
        {128, 1, 4, FJ_DTYPE_BF16, &devs.h200, "paged", FJ__PATH_MMA, 16, 3, 1},
        {128, 1, 4, FJ_DTYPE_BF16, &devs.h200, "paged,stages=4", FJ__PATH_MMA, 16, 4, 0},
        {128, 1, 4, FJ_DTYPE_BF16, &devs.h200, "paged,stages=4,bulk=1", FJ__PATH_MMA, 16, 4, 1},
        {128, 1, 4, FJ_DTYPE_BF16, &devs.h200, "paged,stages=2", FJ__PATH_MMA, 16, 2, 1},
        {128, 1, 4, FJ_DTYPE_F32, &devs.h200, NULL, FJ__PATH_SIMT, 4, 0, 0},
        {128, 1, 4, FJ_DTYPE_BF16, &devs.cpu, NULL, FJ__PATH_SIMT, 4, 0, 0},
        /* an e4m3 cache read by 16-bit queries: the tensor-core kernel on sm_80+ (by cp.async,
        ** two slots; at most 32 rows a block), the vector kernel before sm_80 or asked for
        ** (more keys a chunk), the portable one elsewhere */
        {128, 1, 4, FJ_DTYPE_BF16, &devs.h200, "fp8", FJ__PATH_MMA, 16, 2, 0},
        {64, 4, 4, FJ_DTYPE_F16, &devs.sm86, "fp8", FJ__PATH_MMA, 16, 2, 0},
        {64, 16, 4, FJ_DTYPE_F16, &devs.sm86, "fp8", FJ__PATH_MMA, 32, 2, 0},
        {128, 1, 4, FJ_DTYPE_BF16, &devs.h200, "paged,fp8", FJ__PATH_MMA, 16, 2, 0},
        {128, 1, 4, FJ_DTYPE_BF16, &devs.sm75, "fp8", FJ__PATH_VECTOR, 4, 5, 0},
        {128, 1, 4, FJ_DTYPE_BF16, &devs.h200, "fp8,path=vec", FJ__PATH_VECTOR, 4, 5, 0},
        {64, 4, 4, FJ_DTYPE_F16, &devs.sm86, "fp8,path=vec", FJ__PATH_VECTOR, 8, 4, 0},
        {128, 1, 4, FJ_DTYPE_BF16, &devs.h200, "paged,fp8,path=vec", FJ__PATH_VECTOR, 4, 4, 0},
        {128, 1, 4, FJ_DTYPE_BF16, &devs.cpu, "fp8", FJ__PATH_SIMT, 4, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fj__features f = bwd_features(cases[i].d, cases[i].d, cases[i].dtype);
        f.batch = 1;
        f.seqlen_q = cases[i].sq;
        f.seqlen_k = 32768;
        f.heads_kv = 8;
        f.heads_q = 8 * cases[i].group;
        const char *config = cases[i].config;
        if (config && !strncmp(config, "paged", 5)) { /* not a config: a paged cache */
            f.paged = 1;
            config = config[5] == ',' ? config + 6 : NULL;
        }
        if (config && !strncmp(config, "fp8", 3)) { /* nor this: an FP8 cache */
            f.kv_dtype = FJ_DTYPE_F8_E4M3;
            config = config[3] == ',' ? config + 4 : NULL;
        }
        const fj__variant v = decode_variant_of(
            &f, cases[i].dev, config,
            cases[i].path == FJ__PATH_SIMT ? FJ__PATH_SIMT : FJ__PATH_WGMMA /* as planned */, i);
        if (v.path != cases[i].path || v.tile_m != cases[i].tile_m ||
            v.stages != cases[i].stages || v.bulk != cases[i].bulk)
            fail_msg("case %zu: path %d, %d rows, stages %d, bulk %d; expected %d, %d, %d, %d", i,
                     v.path, v.tile_m, v.stages, v.bulk, cases[i].path, cases[i].tile_m,
                     cases[i].stages, cases[i].bulk);
        assert_true(fj__variant_fits(&v, cases[i].dev));
        if (v.path == FJ__PATH_MMA) {
            assert_true(v.head_dim_pad == cases[i].d && v.q_in_regs == (cases[i].d <= 128));
            const int wide = cases[i].config && !strcmp(cases[i].config, "tile_n=128,stages=2");
            assert_int_equal(v.tile_n, wide ? 128 : 64);
        }
        fj__plan plan;
        fj__err err = {{0}};
        assert_int_equal(fj__plan_decode(&f, cases[i].dev, &v, &plan, &err), FJ_OK);
        const fj__step *s = &plan.steps[plan.main_step];
        assert_int_equal(s->shared_bytes,
                         v.path == FJ__PATH_MMA ? fj__variant_shared_bytes(&s->variant) : 0);
        /* One batch of 8 kv heads: split so the grid fills the device, then merged by a step,
        ** or, asked for, by the tensor-core kernel's last split of each block's rows
        ** (merge_last), counting arrivals in zeroed counters (an int a block of a split). */
        assert_int_equal(s->grid[0], 8 * ((f.seqlen_q * cases[i].group + v.tile_m - 1) / v.tile_m));
        assert_true(s->grid[1] > 1 && s->variant.partial);
        assert_true((int64_t)s->grid[1] * plan.decode.keys_per_split >= f.seqlen_k);
        const int merge_last = v.path == FJ__PATH_MMA && config && strstr(config, "merge_last=1");
        assert_int_equal(s->variant.merge_last, merge_last);
        assert_int_equal(plan.nsteps, merge_last ? 1 : 2);
        if (merge_last) {
            assert_true(plan.decode.arrivals >= 0);
            const fj__workspace *w = &plan.workspaces[plan.decode.arrivals];
            assert_true(w->counters && w->bytes == f.batch * s->grid[0] * sizeof(int32_t));
            assert_true(plan.counter_bytes >= w->offset + w->bytes);
        } else {
            assert_int_equal(plan.decode.arrivals, -1);
            assert_int_equal(plan.counter_bytes, 0);
            /* The merge: a work-group's four teams take 4 / teams rows, a row's states shared
            ** by `teams` (more than 4 splits: 2, more than 8: 4), its columns 32 a
            ** work-group. */
            const fj__step *m = &plan.steps[1];
            const int teams = fj__merge_state_teams(plan.decode.splits);
            const int64_t rows = f.batch * f.seqlen_q * f.heads_q;
            assert_int_equal(teams,
                             plan.decode.splits > 8 ? 4 : plan.decode.splits > 4 ? 2 : 1);
            assert_int_equal(m->grid[0], (rows + 4 / teams - 1) / (4 / teams));
            assert_int_equal(m->grid[1], (f.head_dim_v + 31) / 32);
            assert_int_equal(m->variant.inputs, 0);
        }
        /* An FP8 cache's vector kernel: up to 4 rows three blocks an SM, paged or not. */
        if (f.kv_dtype != f.q_dtype && v.path == FJ__PATH_VECTOR)
            assert_int_equal(v.ctas_per_sm, v.tile_m <= 4 ? 3 : 0);
        /* Tensor cores: blocks an SM from shared memory (d 128: one with four tiles, two with
        ** three, three for an FP8 cache's two), and the splits of least modelled time, so 8
        ** blocks fill one whole wave (with three blocks, 47 splits of 11 tiles where 48 would
        ** round to the same). */
        if (i == 0 || (f.paged && !config && v.path == FJ__PATH_MMA)) {
            const int fp8 = f.kv_dtype != f.q_dtype, blocks = fp8 ? 3 : f.paged ? 2 : 1;
            assert_int_equal(v.ctas_per_sm, blocks);
            assert_int_equal(s->grid[1], fp8 ? 47 : 16 * blocks);
        }
    }
}

/* Decode with value dims beyond 256 (MLA's 576 / 512): on sm_90a, from 16 packed rows a kv head,
** a wgmma kernel (64 packed rows a block), which warps=4 turns down for the mma kernel's
** split_dv; dv to 256 never on wgmma. Where v is read from k by bulk tensor copies (tensor maps
** read k; a paged cache's pages hold whole 64-key tiles), a panel of k lies past v, 128 packed
** rows a kv head share each K tile and the blocks fill a quarter of the device before splits
** (a batch of 33 at 128 rows; not of 16 or 1, nor 64 rows, unless warps=8 asks), the
** seesaw kernel (two warpgroups: warps 8); else, or asked for options only it takes, the
** kernel of three warpgroups (warps 12; 64-key tiles where two ring slots fit, else 32), whose
** tiles come by bulk tensor copies where tensor maps read k and v and pages hold whole tiles
** (bulk=0 turns them off; multicast=1 has two row tiles of a kv head share them as a cluster
** pair, but not of packed sequences), else by its threads. */
static void test_decode_wide_plans(void **state)
{
    (void)state;
    const planned_devices devs = planned_device_set();
    const struct {
        int64_t d, dv, group;
        int v_in_k;
        const fj_device_info *dev;
        const char *config;
        int page;     /* paged cache's keys a page (0: contiguous; -1: k no tensor map reads) */
        int path, tile_n;
        int bulk;     /* (wgmma) its tiles by bulk tensor copies */
        int warps;    /* (wgmma) 8: the seesaw kernel; 12: the other */
        int64_t batch;
    } cases[] = {
        {576, 512, 128, 1, &devs.h200, NULL, 0, FJ__PATH_WGMMA, 64, 1, 8, 64},
        {576, 512, 128, 1, &devs.h200, NULL, 0, FJ__PATH_WGMMA, 64, 1, 12, 1}, /* batch 1 */
        {576, 512, 128, 1, &devs.h200, "warps=8", 64, FJ__PATH_WGMMA, 64, 1, 8, 1},
        {576, 512, 128, 1, &devs.h200, NULL, 64, FJ__PATH_WGMMA, 64, 1, 8, 64},
        {576, 512, 128, 1, &devs.h200, NULL, 256, FJ__PATH_WGMMA, 64, 1, 8, 64},
        /* tiles span pages */
        {576, 512, 128, 1, &devs.h200, NULL, 16, FJ__PATH_WGMMA, 64, 0, 12, 64},
        {576, 512, 128, 1, &devs.h200, NULL, 96, FJ__PATH_WGMMA, 64, 0, 12, 64},
        {576, 512, 128, 1, &devs.h200, "tile_n=32,stages=3", 96, FJ__PATH_WGMMA, 32, 1, 12, 64},
        {576, 512, 128, 1, &devs.h200, "tile_n=32,stages=3", 64, FJ__PATH_WGMMA, 32, 1, 12, 64},
        {576, 512, 128, 1, &devs.h200, "bulk=0", 64, FJ__PATH_WGMMA, 64, 0, 12, 64},
        {576, 512, 128, 1, &devs.h200, "warps=12", 0, FJ__PATH_WGMMA, 64, 1, 12, 64},
        {576, 512, 128, 1, &devs.h200, "multicast=1", 64, FJ__PATH_WGMMA, 64, 1, 12, 64},
        {576, 512, 128, 1, &devs.h200, "warps=12,multicast=1", 64, FJ__PATH_WGMMA, 64, 1, 12, 64},
        {576, 512, 64, 1, &devs.h200, "multicast=1", 64, FJ__PATH_WGMMA, 64, 1, 12, 64},
        {576, 512, 128, 1, &devs.h200, "multicast=1,bulk=0", 64, FJ__PATH_WGMMA, 64, 0, 12, 64},
        {576, 512, 128, 1, &devs.h200, NULL, -1, FJ__PATH_WGMMA, 64, 0, 12, 64},
        {576, 512, 64, 1, &devs.h200, NULL, 0, FJ__PATH_WGMMA, 64, 1, 12, 64}, /* 64 rows */
        {576, 512, 64, 1, &devs.h200, NULL, 0, FJ__PATH_WGMMA, 64, 1, 12, 200},
        {576, 512, 128, 1, &devs.h200, NULL, 64, FJ__PATH_WGMMA, 64, 1, 8, 33}, /* 66 blocks */
        {576, 512, 128, 1, &devs.h200, NULL, 64, FJ__PATH_WGMMA, 64, 1, 12, 16}, /* 32 */
        {576, 512, 64, 0, &devs.h200, NULL, 0, FJ__PATH_WGMMA, 32, 1, 12, 64},
        {512, 512, 64, 1, &devs.h200, NULL, 0, FJ__PATH_WGMMA, 64, 1, 12, 64}, /* no panel past v */
        {576, 384, 128, 1, &devs.h200, NULL, 0, FJ__PATH_WGMMA, 64, 1, 12, 64}, /* v not 512 */
        {576, 384, 128, 1, &devs.h200, "warps=8", 0, FJ__PATH_WGMMA, 64, 1, 8, 64},
        {320, 320, 64, 0, &devs.h200, NULL, 64, FJ__PATH_WGMMA, 64, 1, 12, 64},
        {576, 512, 16, 1, &devs.h200, NULL, 0, FJ__PATH_WGMMA, 64, 1, 12, 64},
        {576, 512, 32, 1, &devs.h200, NULL, 64, FJ__PATH_WGMMA, 64, 1, 12, 128},
        {576, 512, 8, 1, &devs.h200, NULL, 0, FJ__PATH_MMA, 32, 0, 4, 64}, /* half a slab */
        {320, 320, 4, 0, &devs.h200, NULL, 0, FJ__PATH_MMA, 32, 0, 4, 64},
        {576, 512, 128, 1, &devs.h200, "warps=4", 0, FJ__PATH_MMA, 32, 0, 4, 64},
        {448, 192, 4, 0, &devs.h200, NULL, 0, FJ__PATH_MMA, 64, 0, 4, 64},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fj__features f = bwd_features(cases[i].d, cases[i].dv, FJ_DTYPE_BF16);
        f.batch = cases[i].batch;
        f.seqlen_q = 1;
        f.seqlen_k = 8192;
        f.heads_kv = 1;
        f.heads_q = cases[i].group;
        f.v_in_k = cases[i].v_in_k;
        f.paged = cases[i].page > 0;
        f.page_size = cases[i].page > 0 ? cases[i].page : 0;
        f.tma[FJ__T_K] = cases[i].page >= 0;
        const fj__variant v =
            decode_variant_of(&f, cases[i].dev, cases[i].config, FJ__PATH_WGMMA, i);
        if (v.path != cases[i].path || v.tile_n != cases[i].tile_n || v.warps != cases[i].warps)
            fail_msg("case %zu: path %d, %d keys, %d warps; expected %d, %d, %d", i, v.path,
                     v.tile_n, v.warps, cases[i].path, cases[i].tile_n, cases[i].warps);
        assert_true(fj__variant_fits(&v, cases[i].dev));
        fj__plan plan;
        fj__err err = {{0}};
        assert_int_equal(fj__plan_decode(&f, cases[i].dev, &v, &plan, &err), FJ_OK);
        const fj__step *s = &plan.steps[plan.main_step];
        assert_int_equal(s->block[0], v.threads);
        assert_int_equal(s->shared_bytes, fj__variant_shared_bytes(&s->variant));
        if (v.path == FJ__PATH_WGMMA && s->variant.bulk != cases[i].bulk)
            fail_msg("case %zu: bulk %d; expected %d", i, s->variant.bulk, cases[i].bulk);
        if (v.path == FJ__PATH_WGMMA) {
            const int stages = cases[i].config && strstr(cases[i].config, "stages=3") ? 3 : 2;
            assert_true(v.threads == 32 * v.warps && v.tile_m == 64 && v.stages == stages &&
                        v.v_in_k == cases[i].v_in_k && v.head_dim_v_pad % 128 == 0);
            assert_true(s->shared_bytes <= cases[i].dev->local_memory);
            assert_int_equal(s->grid[0], (cases[i].group + 63) / 64);
            assert_int_equal(plan.decode.keys_per_split % v.tile_n, 0); /* tiles from page starts */
            /* asked for, bulk copies shared by a kv head's row tiles where they pair up */
            const int asked = cases[i].config && strstr(cases[i].config, "multicast=1");
            assert_int_equal(s->variant.multicast,
                             asked && s->variant.bulk && (cases[i].group + 63) / 64 % 2 == 0);
            if (s->variant.multicast) { /* packed sequences: no bulk copies, so no pairs */
                f.varlen = 1;
                assert_int_equal(fj__plan_decode(&f, cases[i].dev, &v, &plan, &err), FJ_OK);
                assert_false(plan.steps[plan.main_step].variant.multicast);
            }
        } else {
            assert_int_equal(v.split_dv, cases[i].dv > 256);
        }
    }
    /* The seesaw kernel asked for where k's tiles cannot come by tensor maps: the other kernel,
    ** by its threads' copies. */
    fj__features f = bwd_features(576, 512, FJ_DTYPE_BF16);
    f.seqlen_q = 1;
    f.seqlen_k = 8192;
    f.heads_kv = 1;
    f.heads_q = 128;
    f.v_in_k = 1;
    f.paged = 1;
    f.page_size = 16;
    f.tma[FJ__T_K] = 1;
    const fj__variant v = decode_variant_of(&f, &devs.h200, "warps=8", FJ__PATH_WGMMA, 99);
    assert_true(fj__decode_seesaw(&v));
    fj__plan plan;
    fj__err err = {{0}};
    assert_int_equal(fj__plan_decode(&f, &devs.h200, &v, &plan, &err), FJ_OK);
    const fj__step *s = &plan.steps[plan.main_step];
    assert_true(!fj__decode_seesaw(&s->variant) && s->variant.warps == 12 && !s->variant.bulk);
    assert_int_equal(s->block[0], 384);
    assert_true(fj__variant_fits(&s->variant, &devs.h200));
    assert_int_equal(s->shared_bytes, fj__variant_shared_bytes(&s->variant));
}

/* MLA prefill (more query rows than decode takes; one kv head of 576 whose first 512 dims are
** v): on sm_90a the seesaw decode kernel, contiguous or on pages of whole 64-key tiles, where its
** row tiles fill a quarter of the device, without splits where they fill it once; the forward
** where they do not, where v is not a view of k, where "path=wgmma" asks for it and before
** sm_90; on pages of part tiles (16 keys: neither the seesaw kernel's tensor maps nor the
** forward read them), the other decode kernel. v its own tensor goes to the decode kernels only
** where "path=decode" asks (the other kernel; the seesaw one in 32-key tiles with warps=8). */
static void test_mla_prefill_plans(void **state)
{
    (void)state;
    const planned_devices devs = planned_device_set();
    const struct {
        int64_t sq, hq, batch;
        int v_in_k, page;
        const fj_device_info *dev;
        const char *config;
        int decode; /* 0: the forward; 1: the seesaw kernel; 2: another decode kernel */
    } cases[] = {
        {8192, 16, 2, 1, 0, &devs.h200, NULL, 1},
        {8192, 128, 2, 1, 64, &devs.h200, NULL, 1},
        {300, 16, 1, 1, 0, &devs.h200, NULL, 1},   /* 75 row tiles */
        {100, 16, 1, 1, 0, &devs.h200, NULL, 0},   /* 25 */
        {8192, 16, 2, 0, 0, &devs.h200, NULL, 0},  /* v not in k */
        {8192, 16, 2, 1, 0, &devs.h200, "path=wgmma", 0},
        {8192, 16, 2, 1, 16, &devs.h200, NULL, 2}, /* tiles span pages */
        {8192, 16, 2, 1, 0, &devs.sm86, NULL, 0},
        {8192, 16, 2, 0, 0, &devs.h200, "path=decode", 2},
        {8192, 16, 2, 0, 0, &devs.h200, "path=decode,warps=8", 1},
        {8192, 16, 2, 0, 0, &devs.h200, "path=decode,warps=8,tile_n=64", 2}, /* cannot fit */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fj__features f = bwd_features(576, 512, FJ_DTYPE_BF16);
        f.batch = cases[i].batch;
        f.seqlen_q = cases[i].sq;
        f.seqlen_k = 8192;
        f.heads_q = cases[i].hq;
        f.heads_kv = 1;
        f.v_in_k = (uint8_t)cases[i].v_in_k;
        f.paged = cases[i].page > 0;
        f.page_size = cases[i].page;
        f.window_right = 0; /* causal */
        fj__variant fwd, dec;
        fj__choose_forward(&f, cases[i].dev, cases[i].config, &fwd);
        const int decoded = fj__prefer_decode(&f, cases[i].dev, cases[i].config, &fwd, &dec);
        const int got = !decoded ? 0 : fj__decode_seesaw(&dec) ? 1 : 2;
        if (got != cases[i].decode)
            fail_msg("case %zu: kernel %d, expected %d", i, got, cases[i].decode);
        if (got != 1)
            continue;
        assert_true(dec.row_band && dec.bulk);
        fj__plan plan;
        fj__err err = {{0}};
        assert_int_equal(fj__plan_decode(&f, cases[i].dev, &dec, &plan, &err), FJ_OK);
        const fj__step *s = &plan.steps[plan.main_step];
        assert_true(fj__decode_seesaw(&s->variant) && s->variant.bulk);
        assert_int_equal(s->variant.tile_n, cases[i].v_in_k ? 64 : 32);
        assert_true(fj__variant_fits(&s->variant, cases[i].dev));
        assert_int_equal(s->grid[0], (cases[i].hq * cases[i].sq + 63) / 64);
        if (cases[i].sq == 8192)
            assert_int_equal(s->grid[1], 1); /* no splits: the row tiles fill the device */
    }
}

/* The tuner's host for a search it only lists: prepare() keeps the candidates and stops it. */
typedef struct listed_candidates {
    fj__tune_candidate c[64];
    int n;
} listed_candidates;

static fj_status list_candidates(void *ud, const fj__tune_candidate *cs, int n,
                                 fj_status *status, char (*why)[160])
{
    listed_candidates *l = ud;
    (void)status;
    (void)why;
    l->n = n < 64 ? n : 64;
    memcpy(l->c, cs, (size_t)l->n * sizeof *cs);
    return FJ_ERR_UNSUPPORTED;
}

/* The tuner's decode candidates for MLA (576 / 512, v in k) on the H200: with 64 and with 128
** heads (planned on the three-warpgroup kernel and on the seesaw one) both wgmma kernels, the
** seesaw kernel as planned (warps 8, two slots of 64 keys), and no candidate the device cannot
** hold. */
static void test_decode_tune_candidates(void **state)
{
    (void)state;
    const planned_devices devs = planned_device_set();
    static const int64_t groups[] = {64, 128};
    for (size_t i = 0; i < 2; i++) {
        fj__features f = bwd_features(576, 512, FJ_DTYPE_BF16);
        f.batch = 64;
        f.seqlen_q = 1;
        f.seqlen_k = 8192;
        f.heads_kv = 1;
        f.heads_q = groups[i];
        f.v_in_k = 1;
        f.paged = 1;
        f.page_size = 64;
        f.tma[FJ__T_K] = 1;
        const fj__variant h = decode_variant_of(&f, &devs.h200, NULL, FJ__PATH_WGMMA, i);
        assert_int_equal(fj__decode_seesaw(&h), groups[i] == 128);
        listed_candidates l = {.n = 0};
        const fj__tune_host host = {.ud = &l, .device = &devs.h200, .prepare = list_candidates};
        fj__tune_memo *memo = NULL;
        fj_tune_result r = {.struct_size = sizeof r};
        fj__err err = {{0}};
        assert_int_equal(fj__tune(&host, &memo, NULL, "test", &f, &h, FJ_DTYPE_BF16, 0, &r, &err),
                         FJ_ERR_UNSUPPORTED);
        fj__tune_memo_free(&memo);
        assert_true(l.n > 1 && memcmp(&l.c[0].v, &h, sizeof h) == 0);
        int seesaw = 0, other = 0;
        for (int c = 0; c < l.n; c++) {
            const fj__variant *v = &l.c[c].v;
            assert_true(v->path == FJ__PATH_WGMMA && fj__variant_fits(v, &devs.h200));
            if (fj__decode_seesaw(v)) {
                assert_true(v->tile_n == 64 && v->stages == 2 && v->bulk && !v->overlap);
                seesaw++;
            } else {
                assert_int_equal(v->warps, 12);
                other++;
            }
        }
        printf("  %lld heads: %d candidates, %d on the seesaw kernel\n", (long long)groups[i],
               l.n, seesaw);
        assert_true(seesaw >= 2 && other >= 2); /* the plan's splits and others, each kernel */
    }
}

/* The SIMT forward's local memory (attn_fwd_simt.lua's Smem, static: 48 KiB on CUDA) counts the
** block skipping's tile flags beside the K and V tiles: f32 at d 320 / dv 64 with a mask_mod
** took 32-key tiles of exactly 48 KiB plus the flags' 8 bytes, which ptxas refused. Launches ask
** for no dynamic shared memory. */
static void test_simt_forward_local_memory(void **state)
{
    (void)state;
    const planned_devices devs = planned_device_set();
    const fj_device_info *const dev[] = {&devs.h200, &devs.sm86, &devs.cpu};
    static const int64_t dims[][2] = {{320, 64}, {64, 64}, {192, 192}, {576, 512}, {8, 8}};
    for (size_t i = 0; i < 3; i++)
        for (size_t j = 0; j < sizeof dims / sizeof dims[0]; j++)
            for (int masked = 0; masked < 2; masked++) {
                fj__features f = bwd_features(dims[j][0], dims[j][1], FJ_DTYPE_F32);
                f.mask_mod = masked ? "k % 7 == 0" : NULL;
                fj__variant v;
                fj__choose_forward(&f, dev[i], NULL, &v);
                assert_int_equal(v.path, FJ__PATH_SIMT);
                assert_true(fj__variant_fits(&v, dev[i]));
                const uint32_t floats = 4u * (uint32_t)(v.tile_n * (v.head_dim_pad +
                                                                    v.head_dim_v_pad));
                assert_int_equal(fj__variant_shared_bytes(&v), floats + (masked ? 8u : 0u));
                assert_true(fj__variant_shared_bytes(&v) <=
                            (dev[i]->backend == FJ_BACKEND_CUDA ? 48u << 10 : 64u << 10));
                fj__plan plan;
                fj__err err = {{0}};
                assert_int_equal(fj__plan_forward(&f, dev[i], &v, &plan, &err), FJ_OK);
                assert_int_equal(plan.steps[plan.main_step].shared_bytes, 0);
            }
}

/* Forwards with head dims beyond 256: on Hopper's kernel, value slices of at most 256 that
** recompute S, or asked for (d_split=1) a cluster pair splitting S's head dim where dv allows
** (d > 256, dv <= 512: halves of whole panels, so 576 pads to 640; v a view of k then takes
** its value tiles from K's); the grid counts every block of a work tile. Before Hopper (and
** on any CUDA device asked for by path=mma) mma.sync's kernel in value slices of whole column
** pairs (dv padded to 16 a slice), a block each in the grid's x; path=simt the SIMT kernel. */
static void test_wide_forward_plans(void **state)
{
    (void)state;
    const planned_devices devs = planned_device_set();
    const struct {
        int64_t d, dv;
        const fj_device_info *dev;
        const char *config;
        int path, d_split, d_pad, dv_pad, slices;
    } cases[] = {
        {512, 512, &devs.h200, NULL, FJ__PATH_WGMMA, 0, 512, 512, 2},
        {576, 512, &devs.h200, NULL, FJ__PATH_WGMMA, 0, 576, 512, 2},
        {320, 320, &devs.h200, NULL, FJ__PATH_WGMMA, 0, 320, 384, 2},
        {576, 576, &devs.h200, NULL, FJ__PATH_WGMMA, 0, 576, 576, 3},
        {128, 512, &devs.h200, NULL, FJ__PATH_WGMMA, 0, 128, 512, 2},
        {448, 192, &devs.h200, NULL, FJ__PATH_WGMMA, 0, 448, 192, 1},
        {512, 512, &devs.h200, "d_split=1", FJ__PATH_WGMMA, 1, 512, 512, 2},
        {576, 512, &devs.h200, "d_split=1", FJ__PATH_WGMMA, 1, 640, 512, 2},
        {320, 320, &devs.h200, "d_split=1", FJ__PATH_WGMMA, 1, 384, 384, 2},
        {448, 192, &devs.h200, "d_split=1", FJ__PATH_WGMMA, 1, 512, 256, 2},
        {264, 264, &devs.h200, "d_split=1", FJ__PATH_WGMMA, 1, 384, 384, 2},
        {576, 576, &devs.h200, "d_split=1", FJ__PATH_WGMMA, 0, 576, 576, 3}, /* 288 a block */
        {128, 512, &devs.h200, "d_split=1", FJ__PATH_WGMMA, 0, 128, 512, 2}, /* d <= 256 */
        {512, 512, &devs.sm86, NULL, FJ__PATH_MMA, 0, 512, 512, 2},
        {576, 512, &devs.sm86, NULL, FJ__PATH_MMA, 0, 576, 512, 2},
        {512, 512, &devs.sm86, "path=simt", FJ__PATH_SIMT, 0, 512, 512, 1},
        {512, 512, &devs.h200, "path=simt", FJ__PATH_SIMT, 0, 512, 512, 1},
        {576, 512, &devs.h200, "v_in_k", FJ__PATH_WGMMA, 0, 576, 512, 2},
        {576, 512, &devs.h200, "v_in_k,d_split=1", FJ__PATH_WGMMA, 1, 640, 512, 2},
        {512, 512, &devs.sm86, "path=mma", FJ__PATH_MMA, 0, 512, 512, 2},
        {576, 512, &devs.sm86, "path=mma", FJ__PATH_MMA, 0, 576, 512, 2},
        {576, 576, &devs.sm86, "path=mma", FJ__PATH_MMA, 0, 576, 576, 3},
        {264, 264, &devs.sm86, "path=mma", FJ__PATH_MMA, 0, 272, 288, 2},
        {448, 192, &devs.sm86, "path=mma", FJ__PATH_MMA, 0, 448, 192, 1},
        {136, 520, &devs.sm86, "path=mma", FJ__PATH_MMA, 0, 144, 528, 3},
        {512, 512, &devs.h200, "path=mma", FJ__PATH_MMA, 0, 512, 512, 2},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fj__features f = bwd_features(cases[i].d, cases[i].dv, FJ_DTYPE_BF16);
        const char *config = cases[i].config;
        if (config && !strncmp(config, "v_in_k", 6)) { /* not a config: v a view of k (MLA) */
            f.v_in_k = 1;
            config = config[6] ? config + 7 : NULL;
        }
        fj__variant v;
        fj__choose_forward(&f, cases[i].dev, config, &v);
        /* Split, MLA's value columns come with each block's K tiles, none of their own */
        assert_int_equal(v.v_in_k, f.v_in_k && v.d_split);
        const int slices = fj__variant_dv_slices(&v);
        if (v.path != cases[i].path || v.d_split != cases[i].d_split ||
            (v.path != FJ__PATH_SIMT &&
             (v.head_dim_pad != cases[i].d_pad || v.head_dim_v_pad != cases[i].dv_pad)) ||
            slices != cases[i].slices)
            fail_msg("case %zu: path %d, d_split %d, dims %d / %d, %d slices", i, v.path,
                     v.d_split, v.head_dim_pad, v.head_dim_v_pad, slices);
        assert_true(fj__variant_fits(&v, cases[i].dev));
        if (v.path == FJ__PATH_SIMT)
            continue;
        /* Slices of whole column pairs (mma.sync) or panels (Hopper), at most 256 columns. */
        const int dv = v.head_dim_v_pad / slices;
        assert_true(dv <= 256 && dv % (v.path == FJ__PATH_MMA ? 16 : 64) == 0);
        assert_true(fj__variant_shared_bytes(&v) <= cases[i].dev->local_memory);
        if (v.path == FJ__PATH_WGMMA) {
            assert_int_equal(v.tile_m, 64);
            assert_int_equal(v.persistent, 0);
        }
        fj__plan plan;
        fj__err err = {{0}};
        assert_int_equal(fj__plan_forward(&f, cases[i].dev, &v, &plan, &err), FJ_OK);
        const fj__step *s = &plan.steps[plan.main_step];
        /* a block a query tile and slice: mma.sync's grid (x, heads, batch), Hopper's work tiles */
        const int64_t tiles = (f.seqlen_q + v.tile_m - 1) / v.tile_m * slices;
        assert_int_equal(s->grid[0], v.path == FJ__PATH_MMA ? tiles : tiles * f.heads_q * f.batch);
        assert_int_equal(s->shared_bytes, fj__variant_shared_bytes(&v));
    }
}

/* FP8 q, k and v (out bf16): Hopper's kernel with 128-key tiles, q's and k's head dims in
** 128-column panels, one value slice, a static schedule, O rescaled for every tile (no lazy
** rescale, which also does not fit), the plain loop at dv 256 (where the pipelined one's
** registers do not fit), fitting with v transposed by a plan step first (dense requests) or,
** packed or asked (v_transposed=0), with its staging buffers; q's head dims beyond 128 with
** S's second panel apart, in as few parts of the key tile as the registers allow (with the
** kernel's transposer: 2 at 128 value columns, pipelined; 8 at 256; where a mask or score
** term takes the SIMT kernel);
** elsewhere (sm_86, head dims beyond 256, rows not of 16 FP8 elements) the SIMT kernel. FP8 read
** as FP8 (dequant=0; test_fp8_dequant_plans has the 16-bit copies that replace the SIMT kernel
** by default). */
static void test_fp8_forward_plans(void **state)
{
    (void)state;
    const planned_devices devs = planned_device_set();
    const struct {
        int64_t d, dv;
        int causal, rows_16b;
        const fj_device_info *dev;
        int path, d_pad, overlap, parts, mask_mod;
    } cases[] = {
        {64, 64, 0, 1, &devs.h200, FJ__PATH_WGMMA, 128, 1, 0, 0},
        {128, 128, 1, 1, &devs.h200, FJ__PATH_WGMMA, 128, 1, 0, 0},
        {96, 64, 1, 1, &devs.h200, FJ__PATH_WGMMA, 128, 1, 0, 0},
        {128, 256, 0, 1, &devs.h200, FJ__PATH_WGMMA, 128, 0, 0, 0},
        {96, 256, 1, 1, &devs.h200, FJ__PATH_WGMMA, 128, 0, 0, 0},
        {96, 192, 1, 1, &devs.h200, FJ__PATH_WGMMA, 128, 1, 0, 0},
        {192, 128, 1, 1, &devs.h200, FJ__PATH_WGMMA, 256, 1, 2, 0},
        {256, 64, 0, 1, &devs.h200, FJ__PATH_WGMMA, 256, 1, 1, 1},
        {256, 256, 0, 1, &devs.h200, FJ__PATH_WGMMA, 256, 0, 8, 0},
        {160, 192, 1, 1, &devs.h200, FJ__PATH_WGMMA, 256, 0, 2, 0},
        {256, 256, 1, 1, &devs.h200, FJ__PATH_SIMT, 0, 0, 0, 1},
        {40, 40, 0, 0, &devs.h200, FJ__PATH_SIMT, 0, 0, 0, 0},
        {320, 320, 0, 1, &devs.h200, FJ__PATH_SIMT, 0, 0, 0, 0},
        {128, 128, 0, 1, &devs.sm86, FJ__PATH_SIMT, 0, 0, 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fj__features f = bwd_features(cases[i].d, cases[i].dv, FJ_DTYPE_F8_E4M3);
        f.out_dtype = FJ_DTYPE_BF16;
        f.seqlen_q = f.seqlen_k = 4096;
        if (cases[i].causal)
            f.window_left = -1, f.window_right = 0;
        if (cases[i].mask_mod)
            f.mask_mod = "q / 64 == k / 64";
        for (int t = 0; t < 3; t++)
            f.rows_16b[t] = f.tma[t] = (uint8_t)cases[i].rows_16b;
        fj__variant v;
        fj__choose_forward(&f, cases[i].dev, "dequant=0,v_transposed=0", &v);
        if (v.path != cases[i].path)
            fail_msg("case %zu: path %d, expected %d", i, v.path, cases[i].path);
        assert_true(fj__variant_fits(&v, cases[i].dev));
        if (v.path != FJ__PATH_WGMMA)
            continue;
        assert_int_equal(v.tile_n, 128);
        assert_int_equal(v.head_dim_pad, cases[i].d_pad);
        if (v.overlap != cases[i].overlap)
            fail_msg("case %zu: overlap %d (tile_m %d, parts %d)", i, v.overlap, v.tile_m,
                     v.score_parts);
        if (v.score_parts != cases[i].parts)
            fail_msg("case %zu: score_parts %d, expected %d", i, v.score_parts, cases[i].parts);
        if (cases[i].parts) { /* S's panels apart, in parts of whole n8 blocks */
            fj__variant one = v, odd = v;
            one.score_parts = 0, odd.score_parts = 5;
            assert_false(fj__variant_fits(&one, cases[i].dev));
            assert_false(fj__variant_fits(&odd, cases[i].dev));
        }
        assert_int_equal(fj__variant_dv_slices(&v), 1);
        assert_true(v.persistent != 2 && v.stages >= 1 && !v.lazy_rescale);
        fj__variant lazy = v;
        lazy.lazy_rescale = 1;
        assert_false(fj__variant_fits(&lazy, cases[i].dev));
        assert_true(fj__variant_shared_bytes(&v) <= cases[i].dev->local_memory);
        /* A configuration the kernel cannot take (64-key tiles) does not fit. */
        fj__variant bad = v;
        bad.tile_n = 64;
        assert_false(fj__variant_fits(&bad, cases[i].dev));
        /* With v_transposed=0 the kernel transposes v: staging buffers, and the producer
        ** keeps more registers for its transposing warps. By default (dense requests) v is
        ** transposed by the plan's first step into [b, hkv, dv, keys rounded to 16] (a block
        ** per 64 keys of a kv head and batch), the producer keeping a 16-bit kernel's
        ** registers and no staging buffers, S's second panel in no more parts than with
        ** the kernel's transposer, and the tiles still fitting; packed sequences transpose in
        ** the kernel, and v transposed by a step does not fit them. */
        assert_false(v.v_transposed);
        assert_true(fj__variant_value_stages(&v) > 0);
        assert_true(fj__variant_producer_registers(&v) > 24);
        const int own_parts = v.score_parts;
        fj__choose_forward(&f, cases[i].dev, "dequant=0", &v);
        assert_true(v.v_transposed);
        assert_true(v.score_parts <= own_parts);
        assert_int_equal(v.path, FJ__PATH_WGMMA);
        assert_true(fj__variant_fits(&v, cases[i].dev));
        assert_int_equal(fj__variant_value_stages(&v), 0);
        assert_int_equal(fj__variant_producer_registers(&v), 24);
        fj__plan plan;
        fj__err err = {0};
        assert_int_equal(fj__plan_forward(&f, cases[i].dev, &v, &plan, &err), FJ_OK);
        const fj__step *t = &plan.steps[0];
        assert_int_equal(t->variant.family, FJ__FAMILY_TRANSPOSE_V);
        assert_true(fj__variant_fits(&t->variant, cases[i].dev));
        assert_int_equal(t->grid[0], (f.seqlen_k + 63) / 64);
        assert_int_equal(t->grid[1], f.heads_kv);
        assert_int_equal(t->grid[2], f.batch);
        assert_int_equal(plan.fwd.v_keys, (f.seqlen_k + 15) / 16 * 16);
        assert_true(plan.workspaces[plan.fwd.v_transposed].bytes ==
                    (size_t)(f.batch * f.heads_kv * f.head_dim_v * plan.fwd.v_keys));
        assert_int_equal(plan.steps[plan.main_step].variant.v_transposed, 1);
        fj__features packed = f;
        packed.varlen = 1;
        fj__variant pv;
        fj__choose_forward(&packed, cases[i].dev, "dequant=0", &pv);
        if (pv.path == FJ__PATH_WGMMA) {
            assert_false(pv.v_transposed);
            assert_true(fj__variant_value_stages(&pv) > 0);
            pv.v_transposed = 1;
            assert_false(fj__variant_fits(&pv, cases[i].dev));
        }
    }
}

/* FP8 q, k and v through 16-bit copies: the 16-bit plan of the same shape (mma on sm_86,
** Hopper's kernel for d 576 / dv 512 on sm_90a) with three dequantising steps first, each a
** work-group per (row, batch) writing a workspace of the copy's size. By default where the FP8
** request would take the SIMT forward on CUDA; always with dequant=1, never with dequant=0;
** packed sequences, decode's few rows, OpenCL and what Hopper's FP8 kernel serves keep the FP8
** plans. */
static void test_fp8_dequant_plans(void **state)
{
    (void)state;
    const planned_devices devs = planned_device_set();
    const struct {
        int64_t d, dv;
        const fj_device_info *dev;
        const char *config;
        int varlen, seqlen_q, dequant, path;
    } cases[] = {
        {128, 128, &devs.sm86, "dequant=1", 0, 300, 1, FJ__PATH_MMA},
        {576, 512, &devs.h200, "dequant=1", 0, 300, 1, FJ__PATH_WGMMA},
        {256, 256, &devs.h200, "dequant=1,stages=2", 0, 300, 1, FJ__PATH_WGMMA},
        {128, 128, &devs.h200, "dequant=1", 0, 300, 1, FJ__PATH_WGMMA},
        {128, 128, &devs.sm86, NULL, 0, 300, 1, FJ__PATH_MMA},
        {576, 512, &devs.h200, NULL, 0, 300, 1, FJ__PATH_WGMMA},
        {128, 128, &devs.h200, NULL, 0, 300, 0, FJ__PATH_WGMMA},
        {128, 128, &devs.sm86, "dequant=0", 0, 300, 0, FJ__PATH_SIMT},
        {128, 128, &devs.sm86, "tile_n=32", 0, 300, 1, FJ__PATH_MMA},
        {128, 128, &devs.sm86, NULL, 0, 16, 0, FJ__PATH_SIMT},
        {128, 128, &devs.sm86, "dequant=1", 0, 16, 1, FJ__PATH_MMA},
        {128, 128, &devs.cpu, NULL, 0, 300, 0, FJ__PATH_SIMT},
        {128, 128, &devs.cpu, "dequant=1", 0, 300, 1, FJ__PATH_SIMT},
        {128, 128, &devs.sm86, "dequant=1", 1, 300, 0, FJ__PATH_SIMT},
        {128, 128, &devs.sm86, NULL, 1, 300, 0, FJ__PATH_SIMT},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fj__features f = bwd_features(cases[i].d, cases[i].dv, FJ_DTYPE_F8_E4M3);
        f.out_dtype = FJ_DTYPE_BF16;
        f.descale = 1;
        f.varlen = (uint8_t)cases[i].varlen;
        f.seqlen_q = cases[i].seqlen_q;
        fj__variant v;
        fj__choose_forward(&f, cases[i].dev, cases[i].config, &v);
        if (v.path != cases[i].path || v.dequant != cases[i].dequant)
            fail_msg("case %zu: path %d dequant %d", i, v.path, v.dequant);
        fj__plan plan;
        fj__err err = {0};
        assert_int_equal(fj__plan_forward(&f, cases[i].dev, &v, &plan, &err), FJ_OK);
        if (!v.dequant) {
            assert_int_not_equal(plan.steps[0].variant.family, FJ__FAMILY_DEQUANT);
            continue;
        }
        assert_int_equal(v.q_dtype, FJ_DTYPE_BF16);
        assert_int_equal(v.kv_dtype, FJ_DTYPE_BF16);
        assert_false(v.descale);
        const int64_t rows[3] = {f.seqlen_q, f.seqlen_k, f.seqlen_k};
        const int64_t heads[3] = {f.heads_q, f.heads_kv, f.heads_kv};
        const int64_t dims[3] = {f.head_dim, f.head_dim, f.head_dim_v};
        for (int t = 0; t < 3; t++) {
            const fj__step *s = &plan.steps[t];
            assert_int_equal(s->variant.family, FJ__FAMILY_DEQUANT);
            assert_int_equal(s->variant.q_dtype, FJ_DTYPE_F8_E4M3);
            assert_int_equal(s->variant.out_dtype, FJ_DTYPE_BF16);
            assert_true(fj__variant_fits(&s->variant, cases[i].dev));
            assert_int_equal(s->grid[0], rows[t]);
            assert_int_equal(s->grid[1], f.batch);
            assert_int_equal(plan.fwd.dequant[t] >= 0, 1);
            assert_true(plan.workspaces[plan.fwd.dequant[t]].bytes ==
                        (size_t)(f.batch * rows[t] * heads[t] * dims[t] * 2));
        }
        assert_true(plan.main_step >= 3);
        assert_int_equal(plan.steps[plan.main_step].variant.path, cases[i].path);
    }
}

/* Whether Hopper variant v's register handover fits its block: the copying warpgroup keeps
** fj__variant_producer_registers and the computing ones ask for
** fj__variant_consumer_registers (setmaxnreg), from a pool of what the block was launched with
** (64K / threads a thread, in multiples of 8; half with two blocks an SM). Asking for more
** than the pool holds makes setmaxnreg.inc wait forever. Returns whether v hands over. */
static int check_register_shares(const fj__variant *v, const char *what)
{
    const int keep = fj__variant_producer_registers(v), regs = fj__variant_consumer_registers(v);
    if (v->path != FJ__PATH_WGMMA || regs == 255) /* (255: no handover) */
        return 0;
    const int per_sm = v->ctas_per_sm == 2 ? 2 : 1;
    const int launched = 65536 / per_sm / v->threads / 8 * 8;
    const long asked = 128L * keep + (long)(v->threads - 128) * regs;
    if (keep % 8 || regs % 8 || keep < 24 || regs > 256 || regs < keep ||
        asked > (long)launched * v->threads)
        fail_msg("%s: %d threads launched with %d registers each; the producer keeps %d and the "
                 "others ask for %d: %ld of %ld",
                 what, v->threads, launched, keep, regs, asked, (long)launched * v->threads);
    return 1;
}

/* Every Hopper variant the heuristics choose on an H200 hands its registers over within its
** block's pool (check_register_shares): forwards (16-bit and FP8, d 64 to 256, causal and not,
** short and long, paged chunks, the tile overrides of 192 rows and of two blocks an SM), the
** backward's stages (plain, soft-capped, a mask_mod, block classes, a bias; d 64 to 256) and
** the wgmma decode kernels (MLA's 576 / 512 at 16 to 128 heads). */
static void test_register_shares(void **state)
{
    (void)state;
    const planned_devices devs = planned_device_set();
    static const int64_t dims[] = {64, 96, 128, 192, 256};
    static const fj_dtype dtypes[] = {FJ_DTYPE_BF16, FJ_DTYPE_F8_E4M3};
    static const char *const configs[] = {NULL, "tile_m=192", "tile_m=64,warps=8,ctas_per_sm=2"};
    char what[96];
    int forwards = 0, backwards = 0, decodes = 0; /* of them, those that hand over */
    for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++)
        for (int t = 0; t < 2; t++)
            for (int variant = 0; variant < 4; variant++)
                for (size_t c = 0; c < sizeof configs / sizeof configs[0]; c++) {
                    fj__features f = bwd_features(dims[d], dims[d], dtypes[t]);
                    f.out_dtype = FJ_DTYPE_BF16;
                    f.seqlen_q = f.seqlen_k = variant == 1 ? 8192 : 1000;
                    f.window_right = variant == 2 ? 0 : -1; /* causal */
                    if (variant == 3 && t == 0) { /* a chunk against pages of 64 */
                        f.paged = 1;
                        f.page_size = 64;
                        f.seqlen_q = 2048;
                    }
                    fj__variant v;
                    fj__choose_forward(&f, &devs.h200, configs[c], &v);
                    snprintf(what, sizeof what, "forward d %lld, %s, case %d, config %s",
                             (long long)dims[d], t ? "e4m3" : "bf16", variant,
                             configs[c] ? configs[c] : "none");
                    forwards += check_register_shares(&v, what);
                }
    for (size_t d = 0; d < sizeof dims / sizeof dims[0]; d++)
        for (int change = 0; change < 5; change++) {
            fj__features f = bwd_features(dims[d], dims[d], FJ_DTYPE_BF16);
            f.softcap = change == 1;
            f.mask_mod = change == 2 ? "(FJ_Q >= FJ_K)" : NULL;
            f.block_mask = change == 3;
            f.bias_dtype = change == 4 ? FJ_DTYPE_F32 : -1;
            for (int det = 0; det <= 1; det++) {
                f.deterministic = (uint8_t)det;
                fj__plan plan;
                fj__err err = {{0}};
                if (fj__plan_backward(&f, &devs.h200, NULL, &plan, &err) != FJ_OK)
                    fail_msg("backward d %lld, change %d: %s", (long long)dims[d], change,
                             err.msg);
                for (int i = 0; i < plan.nsteps; i++) {
                    snprintf(what, sizeof what, "backward d %lld, change %d, det %d, step %d",
                             (long long)dims[d], change, det, i);
                    backwards += check_register_shares(&plan.steps[i].variant, what);
                }
            }
        }
    static const int64_t groups[] = {16, 32, 64, 128};
    for (size_t g = 0; g < sizeof groups / sizeof groups[0]; g++)
        for (int rows = 1; rows <= 4; rows *= 2) {
            fj__features f = bwd_features(576, 512, FJ_DTYPE_BF16);
            f.heads_q = groups[g];
            f.heads_kv = 1;
            f.seqlen_q = rows;
            f.seqlen_k = 8192;
            f.v_in_k = 1;
            fj__variant v;
            if (!fj__choose_decode(&f, &devs.h200, NULL, &v))
                continue;
            snprintf(what, sizeof what, "MLA decode, %lld heads, %d rows", (long long)groups[g],
                     rows);
            decodes += check_register_shares(&v, what);
        }
    printf("  handovers checked: %d forward, %d backward, %d decode variants\n", forwards,
           backwards, decodes);
    assert_true(forwards >= 40 && backwards >= 10 && decodes >= 4);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_family_loads_compiled_and_cached),
        cmocka_unit_test(test_classifier_plan_and_its_memo),
        cmocka_unit_test(test_backward_plans),
        cmocka_unit_test(test_dbias_row_shares),
        cmocka_unit_test(test_dq_turns),
        cmocka_unit_test(test_deterministic_slices),
        cmocka_unit_test(test_decode_plans),
        cmocka_unit_test(test_decode_swizzle),
        cmocka_unit_test(test_merge_row_limit),
        cmocka_unit_test(test_decode_large_dense_bulk),
        cmocka_unit_test(test_paged_prefill_plans),
        cmocka_unit_test(test_decode_masks_and_terms),
        cmocka_unit_test(test_decode_row_band),
        cmocka_unit_test(test_decode_wide_plans),
        cmocka_unit_test(test_mla_prefill_plans),
        cmocka_unit_test(test_decode_tune_candidates),
        cmocka_unit_test(test_simt_forward_local_memory),
        cmocka_unit_test(test_wide_forward_plans),
        cmocka_unit_test(test_fp8_forward_plans),
        cmocka_unit_test(test_fp8_dequant_plans),
        cmocka_unit_test(test_register_shares),
    };
    return cmocka_run_group_tests_name("plan", tests, NULL, NULL);
}
