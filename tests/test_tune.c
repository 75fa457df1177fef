/* The autotuner on the OpenCL backend (PoCL in CI): a small search space is tuned, kept in the
** cache, reused by another process without tuning again, and invalidated by another device
** fingerprint; candidates that fail to compile are dropped with a reason. */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <spawn.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "runtime/context.h"
#include "reference.h"
#include "templates/render.h"

extern char **environ;

static char tmpdir[] = "/tmp/fj-tune-test-XXXXXX";
static char cache_path[600];

static fjh_case small_case(void)
{
    fjh_case c;
    fjh_case_init(&c);
    c.batch = 1;
    c.heads_q = c.heads_kv = 2;
    c.seqlen_q = c.seqlen_k = 96;
    c.head_dim = c.head_dim_v = 32;
    c.dtype = FJ_DTYPE_F16;
    c.desc.causal = 1;
    return c;
}

static fj_context *make_context(int policy)
{
    fj_context_options o;
    fj_context_options_init(&o);
    o.backend = FJ_BACKEND_OPENCL;
    o.cache_path = cache_path;
    o.tune = policy;
    fj_context *ctx = NULL;
    if (fj_context_create(&o, &ctx) != FJ_OK)
        return NULL;
    return ctx;
}

/* Runs small_case() on ctx, checks it, and returns fj_call_info.tuned of its first call. */
static int run_small(fj_context *ctx)
{
    fjh_case c = small_case();
    fjh_result r;
    fj_status st = fjh_run(ctx, &c, &r);
    if (st != FJ_OK || !r.pass) {
        fprintf(stderr, "run failed: %s %s\n", fj_status_string(st), r.why);
        return -1;
    }
    return r.first.tuned;
}

static int setup(void **state)
{
    (void)state;
    if (!mkdtemp(tmpdir))
        return -1;
    snprintf(cache_path, sizeof cache_path, "%s/kernels.db", tmpdir);
    int32_t n = 0;
    fj_device_count(FJ_BACKEND_OPENCL, &n);
    if (n == 0)
        printf("SKIP: no OpenCL device\n");
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[700];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    return system(cmd) == 0 ? 0 : -1;
}

/* One line of what a tuning did, for the test's log. */
static void print_tuning(const fj_tune_result *t)
{
    printf("  tuned %s: %d candidates, %d dropped, heuristic %.1f us, best %.1f us (%s)\n",
           t->bucket, t->candidates, t->dropped, t->heuristic_us, t->best_us, t->best_config);
}

static fj_context *context_or_skip(int policy)
{
    fj_context *ctx = make_context(policy);
    if (!ctx)
        skip();
    return ctx;
}

static void test_tune_on_miss_then_reuse(void **state)
{
    (void)state;
    fj_context *ctx = context_or_skip(FJ_TUNE_ON_MISS);
    assert_int_equal(run_small(ctx), 2); /* tuned during the first call */
    assert_int_equal(run_small(ctx), 1); /* the record, from memory */
    fjh_case c = small_case();
    c.seqlen_q = c.seqlen_k = 80; /* same bucket (seqlens up to 128) */
    fjh_result r;
    assert_int_equal(fjh_run(ctx, &c, &r), FJ_OK);
    assert_true(r.pass);
    assert_int_equal(r.first.tuned, 1);
    c.with_lse = 0; /* a record tuned with lse serves calls without it (and the converse) */
    assert_int_equal(fjh_run(ctx, &c, &r), FJ_OK);
    assert_true(r.pass);
    assert_int_equal(r.first.tuned, 1);
    fj_context_destroy(ctx);

    /* The record is in the cache, with every measurement. */
    fj__err err = {{0}};
    fj_cache *cache = NULL;
    cache_options co = {.path = cache_path};
    assert_int_equal(cache_open(&co, &cache, &err), FJ_OK);
    ctx = context_or_skip(FJ_TUNE_NEVER);
    char *best = NULL;
    double us = 0;
    char bucket[256];
    snprintf(bucket, sizeof bucket,
             "fwd.simt|f16|d=32|dv=32|sq=128|sk=128|bh=2|mask=causal|"
             "softcap=0|neg=0");
    assert_true(cache_get_tuning(cache, ctx->fingerprint, bucket, "fwd", &best, &us));
    assert_non_null(strstr(best, "tile_m="));
    assert_true(us > 0);
    free(best);
    cache_close(cache);
    fj_context_destroy(ctx);

    /* Another process, even one that would tune, finds the record and does not tune. */
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    assert_true(n > 0);
    self[n] = '\0';
    char *argv[] = {self, "--worker", cache_path, NULL};
    pid_t pid;
    assert_int_equal(posix_spawn(&pid, self, NULL, NULL, argv, environ), 0);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 1);
}

static void test_other_fingerprint_tunes_again(void **state)
{
    (void)state;
    fj_context *ctx = context_or_skip(FJ_TUNE_ON_MISS);
    assert_int_equal(run_small(ctx), 1); /* tuned by the test before */
    fj_context_destroy(ctx);
    /* The same cache seen from another device (here: another driver version). */
    ctx = context_or_skip(FJ_TUNE_ON_MISS);
    strncat(ctx->fingerprint, "|driver 99", sizeof ctx->fingerprint - strlen(ctx->fingerprint) - 1);
    assert_int_equal(run_small(ctx), 2);
    fj_context_destroy(ctx);
}

/* Writes tmpdir/templates/attn_fwd_simt.lua: `first` (a template line), the embedded template,
** then `last`; returns the folder (dir). */
static const char *simt_template_with(char *dir, size_t size, const char *first, const char *last)
{
    char path[800];
    snprintf(dir, size, "%s/templates", tmpdir);
    mkdir(dir, 0777);
    snprintf(path, sizeof path, "%s/attn_fwd_simt.lua", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(first, f);
    for (size_t i = 0; i < tpl_embedded_count; i++)
        if (!strcmp(tpl_embedded_files[i].name, "attn_fwd_simt.lua"))
            fputs(tpl_embedded_files[i].text, f);
    fputs(last, f);
    fclose(f);
    return dir;
}

static void remove_templates(const char *dir)
{
    char path[800];
    snprintf(path, sizeof path, "%s/attn_fwd_simt.lua", dir);
    unlink(path);
    rmdir(dir);
}

static void test_other_templates_tune_again(void **state)
{
    (void)state;
    /* Records tuned with other templates (another release's kernels) are not taken. */
    char dir[700];
    simt_template_with(dir, sizeof dir, "", "% -- another release\n");
    setenv("FLASHJIT_TEMPLATE_DIR", dir, 1);
    fj_context *ctx = make_context(FJ_TUNE_ON_MISS); /* hashes the templates it sees */
    unsetenv("FLASHJIT_TEMPLATE_DIR");
    remove_templates(dir);
    if (!ctx)
        skip();
    assert_int_equal(run_small(ctx), 2); /* the bucket the tests before tuned */
    fj_context_destroy(ctx);
    ctx = context_or_skip(FJ_TUNE_ON_MISS); /* the embedded templates: their record stands */
    assert_int_equal(run_small(ctx), 1);
    fj_context_destroy(ctx);
}

static void test_never_policy_uses_heuristic_without_record(void **state)
{
    (void)state;
    fj_context *ctx = context_or_skip(FJ_TUNE_NEVER);
    fjh_case c = small_case();
    c.head_dim = c.head_dim_v = 48; /* a bucket nobody tuned */
    fjh_result r;
    assert_int_equal(fjh_run(ctx, &c, &r), FJ_OK);
    assert_true(r.pass);
    assert_int_equal(r.first.tuned, 0);
    /* Tuning that shape explicitly applies to the very next call of the same shape. */
    c.tune = 1;
    assert_int_equal(fjh_run(ctx, &c, &r), FJ_OK);
    assert_true(r.pass);
    assert_int_equal(r.tune.from_record, 0);
    assert_int_equal(r.first.tuned, 1);
    fj_context_destroy(ctx);
}

static void test_record_that_does_not_fit_is_ignored(void **state)
{
    (void)state;
    fj_context *ctx = context_or_skip(FJ_TUNE_NEVER);
    /* A record no kernel can honour (a foreign or damaged row): the heuristic runs instead. */
    fj__err warn = {{0}};
    cache_put_tuning(ctx->cache, ctx->fingerprint,
                     "fwd.simt|f16|d=80|dv=80|sq=128|sk=128|bh=2|mask=causal|softcap=0|lse=1|neg=0",
                     "fwd", "tile_m=16,tile_n=256", 1.0, "[]", &warn);
    assert_string_equal(warn.msg, "");
    fjh_case c = small_case();
    c.head_dim = c.head_dim_v = 80;
    fjh_result r;
    assert_int_equal(fjh_run(ctx, &c, &r), FJ_OK);
    assert_true(r.pass);
    assert_int_equal(r.first.tuned, 0);
    fj_context_destroy(ctx);
}

static void test_failing_candidates_are_dropped(void **state)
{
    (void)state;
    /* A template that refuses 8-key tiles: those candidates fail to render and are dropped.
    ** (A context reads the folder's name when it is made, its files when it renders.) */
    char dir[700];
    simt_template_with(dir, sizeof dir, "% assert(tile_n ~= 8, 'no 8-key tiles here')\n", "");
    setenv("FLASHJIT_TEMPLATE_DIR", dir, 1);
    fj_context *ctx = make_context(FJ_TUNE_NEVER);
    unsetenv("FLASHJIT_TEMPLATE_DIR");
    if (!ctx) {
        remove_templates(dir);
        skip();
    }
    fjh_case c = small_case();
    c.head_dim = c.head_dim_v = 64; /* an untuned bucket */
    c.tune = 1;
    fjh_result r;
    fj_status st = fjh_run(ctx, &c, &r);
    remove_templates(dir);
    assert_int_equal(st, FJ_OK);
    assert_true(r.pass);
    print_tuning(&r.tune);
    assert_int_equal(r.tune.from_record, 0);
    assert_true(r.tune.candidates >= 4);
    assert_true(r.tune.dropped >= 3); /* tile_m 16, 32, 64 with tile_n 8 */
    assert_null(strstr(r.tune.best_config, "tile_n=8,"));
    assert_true(r.tune.best_us > 0 && r.tune.best_us <= r.tune.heuristic_us);
    fj_context_destroy(ctx);
}

/* The backward's bucket: tuned by fj_attention_backward_tune (its candidates checked against
** the heuristic's gradients), its record used by later backward calls whose gradients still
** pass the reference check, returned at once by a second tune, and tuned on a miss under
** FJ_TUNE_ON_MISS; a deterministic request is a bucket of its own. */
static void test_backward_tune_then_reuse(void **state)
{
    (void)state;
    fj_context *ctx = context_or_skip(FJ_TUNE_NEVER);
    fjh_case c = small_case();
    c.head_dim = c.head_dim_v = 16;
    c.backward = 1;
    c.tune = 2; /* the backward only */
    fjh_result r;
    assert_int_equal(fjh_run(ctx, &c, &r), FJ_OK);
    assert_true(r.pass);
    const fj_tune_result *t = &r.bwd_tune;
    print_tuning(t);
    assert_int_equal(t->from_record, 0);
    assert_true(t->candidates > 1);
    assert_int_equal(strncmp(t->bucket, "bwd.simt|f16|d=16|", 18), 0);
    assert_non_null(strstr(t->bucket, "|det=0"));
    assert_non_null(strstr(t->best_config, "tile_m="));
    assert_true(t->best_us > 0 && t->heuristic_us > 0);
    assert_int_equal(r.bwd_tuned, 1); /* the call after the tuning took the record */

    c.tune = 0;
    assert_int_equal(fjh_run(ctx, &c, &r), FJ_OK);
    assert_true(r.pass);
    assert_int_equal(r.bwd_tuned, 1);
    c.tune = 2;
    assert_int_equal(fjh_run(ctx, &c, &r), FJ_OK);
    assert_int_equal(r.bwd_tune.from_record, 1);
    fj_context_destroy(ctx);

    /* $FLASHJIT_BWD_CONFIG (read when a context is made) wins over the record. */
    assert_int_equal(setenv("FLASHJIT_BWD_CONFIG", "tile_m=16", 1), 0);
    ctx = context_or_skip(FJ_TUNE_NEVER);
    unsetenv("FLASHJIT_BWD_CONFIG");
    c.tune = 0;
    assert_int_equal(fjh_run(ctx, &c, &r), FJ_OK);
    assert_true(r.pass);
    assert_int_equal(r.bwd_tuned, 0);
    fj_context_destroy(ctx);

    ctx = context_or_skip(FJ_TUNE_ON_MISS);
    c.tune = 0;
    c.desc.deterministic = 1; /* another bucket: tuned during the call */
    assert_int_equal(fjh_run(ctx, &c, &r), FJ_OK);
    assert_true(r.pass);
    assert_int_equal(r.bwd_tuned, 2);
    fj_context_destroy(ctx);
}

/* A decode (one query row, grouped heads, a paged cache) tunes its split count (and on CUDA
** its kernel's tiles): the record names the splits it chose where not the plan's, later calls
** take it, and the caller's desc.num_splits is still honoured. */
static void test_decode_tune_then_reuse(void **state)
{
    (void)state;
    fj_context *ctx = context_or_skip(FJ_TUNE_NEVER);
    fjh_case c;
    fjh_case_init(&c);
    c.batch = 2;
    c.heads_q = 8;
    c.heads_kv = 2;
    c.seqlen_q = 1;
    c.seqlen_k = 700;
    c.head_dim = c.head_dim_v = 32;
    c.dtype = FJ_DTYPE_F16;
    c.paged = 16;
    c.tune = 1;
    fjh_result r;
    assert_int_equal(fjh_run(ctx, &c, &r), FJ_OK);
    assert_true(r.pass);
    const fj_tune_result *t = &r.tune;
    print_tuning(t);
    assert_int_equal(t->from_record, 0);
    assert_true(t->candidates > 4); /* the plan's splits, then 1, 2, 4, ... up to the tiles */
    assert_int_equal(strncmp(t->bucket, "dec.simt|f16|d=32|dv=32|sq=1|sk=1024|bh=16|", 43), 0);
    assert_non_null(strstr(t->bucket, "|group=4|paged=1"));
    assert_int_equal(t->dropped, 0);
    assert_true(t->best_us > 0 && t->heuristic_us > 0);
    assert_non_null(strstr(r.first.kernel_path, ".decode"));
    assert_int_equal(r.first.tuned, 1); /* the call after the tuning took the record */

    c.tune = 0;
    for (int32_t splits = 0; splits <= 3; splits += 3) { /* the record's, then the caller's */
        c.desc.num_splits = splits;
        assert_int_equal(fjh_run(ctx, &c, &r), FJ_OK);
        assert_true(r.pass);
        assert_int_equal(r.first.tuned, 1);
    }
    c.tune = 1;
    c.desc.num_splits = 0;
    assert_int_equal(fjh_run(ctx, &c, &r), FJ_OK);
    assert_int_equal(r.tune.from_record, 1);
    fj_context_destroy(ctx);

    /* A config's splits name the plan's, and a bad count is refused by name. */
    fj__variant v = {0};
    fj__err err = {{0}};
    assert_int_equal(fj__config_splits("stages=2,splits=16"), 16);
    assert_int_equal(fj__config_splits("splits=3"), 3);
    assert_int_equal(fj__config_splits("tile_n=64"), 0);
    assert_int_equal(fj__apply_config(&v, "stages=2,splits=16", &err), 0);
    assert_int_equal(fj__apply_config(&v, "splits=65", &err), -1);
    assert_non_null(strstr(err.msg, "splits = 65"));
}

static void test_tune_rejects_bad_arguments(void **state)
{
    (void)state;
    assert_int_equal(fj_attention_tune(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
                     FJ_ERR_INVALID_ARGUMENT);
    fj_context *ctx = context_or_skip(FJ_TUNE_NEVER);
    fj_tune_result r = {.struct_size = 8};
    assert_int_equal(fj_attention_tune(ctx, NULL, NULL, NULL, NULL, NULL, NULL, NULL, &r),
                     FJ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fj_context_last_error(ctx), "result.struct_size = 8"));
    r.struct_size = sizeof r;
    assert_int_equal(fj_attention_tune(ctx, NULL, NULL, NULL, NULL, NULL, NULL, NULL, &r),
                     FJ_ERR_INVALID_ARGUMENT);
    assert_string_equal(fj_context_last_error(ctx), "q is NULL");
    /* The backward's: the same checks, then fj_attention_backward's */
    assert_int_equal(fj_attention_backward_tune(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                                                NULL, NULL, NULL, NULL, NULL),
                     FJ_ERR_INVALID_ARGUMENT);
    r.struct_size = 8;
    assert_int_equal(fj_attention_backward_tune(ctx, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                                                NULL, NULL, NULL, NULL, &r),
                     FJ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fj_context_last_error(ctx), "result.struct_size = 8"));
    r.struct_size = sizeof r;
    assert_int_equal(fj_attention_backward_tune(ctx, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                                                NULL, NULL, NULL, NULL, &r),
                     FJ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fj_context_last_error(ctx), "is NULL"));
    fj_context_destroy(ctx);

    fj_context_options o;
    fj_context_options_init(&o);
    o.tune = 7;
    fj_context *bad = NULL;
    assert_int_equal(fj_context_create(&o, &bad), FJ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fj_last_create_error(), "opts.tune = 7"));
    setenv("FLASHJIT_TUNE", "sometimes", 1);
    o.tune = FJ_TUNE_NEVER;
    assert_int_equal(fj_context_create(&o, &bad), FJ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fj_last_create_error(), "FLASHJIT_TUNE = 'sometimes'"));
    unsetenv("FLASHJIT_TUNE");
}

int main(int argc, char **argv)
{
    if (argc == 3 && !strcmp(argv[1], "--worker")) {
        snprintf(cache_path, sizeof cache_path, "%s", argv[2]);
        fj_context *ctx = make_context(FJ_TUNE_ON_MISS);
        int tuned = ctx ? run_small(ctx) : -1;
        fj_context_destroy(ctx);
        return tuned < 0 ? 99 : tuned;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_tune_on_miss_then_reuse),
        cmocka_unit_test(test_other_fingerprint_tunes_again),
        cmocka_unit_test(test_other_templates_tune_again),
        cmocka_unit_test(test_never_policy_uses_heuristic_without_record),
        cmocka_unit_test(test_record_that_does_not_fit_is_ignored),
        cmocka_unit_test(test_failing_candidates_are_dropped),
        cmocka_unit_test(test_backward_tune_then_reuse),
        cmocka_unit_test(test_decode_tune_then_reuse),
        cmocka_unit_test(test_tune_rejects_bad_arguments),
    };
    return cmocka_run_group_tests_name("tune", tests, setup, teardown);
}
