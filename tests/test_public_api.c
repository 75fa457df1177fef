/* The public API as an application sees it (only flashjit.h, linked with -lflashjit): status
** text, versions, and the argument checks of every entry point besides the forward's fields. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "flashjit.h"

static void test_version_and_status_strings(void **state)
{
    (void)state;
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", FJ_VERSION_MAJOR, FJ_VERSION_MINOR, FJ_VERSION_PATCH);
    assert_string_equal(fj_version(), want);
    for (int a = FJ_OK; a <= FJ_ERR_NO_DEVICE; a++) {
        assert_true(strlen(fj_status_string((fj_status)a)) > 0);
        for (int b = a + 1; b <= FJ_ERR_NO_DEVICE; b++)
            assert_string_not_equal(fj_status_string((fj_status)a), fj_status_string((fj_status)b));
    }
    assert_string_equal(fj_status_string((fj_status)1234), "unknown status");
    assert_int_equal(fj_dtype_size(FJ_DTYPE_BF16), 2);
    assert_int_equal(fj_dtype_size(FJ_DTYPE_F32), 4);
    assert_int_equal(fj_dtype_size((fj_dtype)77), 0);
}

static void test_context_create_rejects_bad_options(void **state)
{
    (void)state;
    fj_context *ctx = (fj_context *)&ctx; /* must be reset to NULL on failure */
    assert_int_equal(fj_context_create(NULL, NULL), FJ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fj_last_create_error(), "out is NULL"));

    fj_context_options o;
    fj_context_options_init(&o);
    o.struct_size = 4;
    assert_int_equal(fj_context_create(&o, &ctx), FJ_ERR_INVALID_ARGUMENT);
    assert_null(ctx);
    assert_non_null(strstr(fj_last_create_error(), "opts.struct_size = 4"));
    /* A size ending inside a field (the shipped-cache list's pointer) is refused too. */
    o.struct_size = offsetof(fj_context_options, shipped_caches) + 4;
    assert_int_equal(fj_context_create(&o, &ctx), FJ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fj_last_create_error(), "not the size of a released"));
    /* Every field end of a released layout is accepted: the first version's ... */
    o.struct_size = offsetof(fj_context_options, shipped_caches);
    o.backend = FJ_BACKEND_OPENCL;
    fj_context *small = NULL;
    if (fj_context_create(&o, &small) == FJ_OK)
        fj_context_destroy(small);
    else
        assert_null(strstr(fj_last_create_error(), "struct_size"));

    fj_context_options_init(&o);
    o.backend = (fj_backend_kind)9;
    assert_int_equal(fj_context_create(&o, &ctx), FJ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fj_last_create_error(), "opts.backend = 9"));

    fj_context_options_init(&o);
    o.device = -1;
    assert_int_equal(fj_context_create(&o, &ctx), FJ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fj_last_create_error(), "opts.device = -1"));

    fj_context_options_init(&o);
    const char *keys[] = {"00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff",
                          "not-a-key", NULL};
    o.trusted_keys = keys;
    assert_int_equal(fj_context_create(&o, &ctx), FJ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fj_last_create_error(), "opts.trusted_keys[1] is not an Ed25519"));

    fj_context_options_init(&o);
    o.backend = FJ_BACKEND_OPENCL;
    o.device = 999;
    assert_int_equal(fj_context_create(&o, &ctx), FJ_ERR_NO_DEVICE);
    assert_non_null(strstr(fj_last_create_error(), "999"));
    assert_null(ctx);

    fj_context_destroy(NULL); /* a harmless no-op */
    assert_non_null(fj_context_last_error(NULL));
    fj_context_options_init(NULL); /* no-ops too */
    fj_attention_desc_init(NULL);
    assert_string_equal(fj_context_cache_path(NULL), "");
    fj_device_info dev = {.struct_size = sizeof dev};
    assert_int_equal(fj_context_get_device_info(NULL, &dev), FJ_ERR_INVALID_ARGUMENT);
}

static void test_device_queries(void **state)
{
    (void)state;
    int32_t n = -1;
    assert_int_equal(fj_device_count(FJ_BACKEND_AUTO, &n), FJ_ERR_INVALID_ARGUMENT);
    assert_int_equal(n, 0);
    assert_int_equal(fj_device_count(FJ_BACKEND_OPENCL, NULL), FJ_ERR_INVALID_ARGUMENT);
    assert_int_equal(fj_device_count(FJ_BACKEND_CUDA, &n), FJ_OK); /* 0 without CUDA */
    fj_device_info info = {.struct_size = 3};
    assert_int_equal(fj_device_get_info(FJ_BACKEND_OPENCL, 0, &info), FJ_ERR_INVALID_ARGUMENT);
    assert_int_equal(fj_device_get_info(FJ_BACKEND_OPENCL, 0, NULL), FJ_ERR_INVALID_ARGUMENT);
    info.struct_size = sizeof info;
    assert_int_equal(fj_device_get_info(FJ_BACKEND_OPENCL, -1, &info), FJ_ERR_NO_DEVICE);
}

static int setup(void **state)
{
    fj_context_options o;
    fj_context_options_init(&o);
    o.backend = FJ_BACKEND_OPENCL;
    o.cache_path = ":memory:";
    fj_context *ctx = NULL;
    if (fj_context_create(&o, &ctx) != FJ_OK)
        printf("SKIP: no OpenCL device: %s\n", fj_last_create_error());
    *state = ctx;
    return 0;
}

static int teardown(void **state)
{
    fj_context_destroy(*state);
    return 0;
}

static void test_memory_and_call_checks(void **state)
{
    fj_context *ctx = *state;
    if (!ctx)
        skip();
    void *p = (void *)&p;
    assert_int_equal(fj_malloc(ctx, 0, &p), FJ_ERR_INVALID_ARGUMENT);
    assert_null(p);
    assert_non_null(strstr(fj_context_last_error(ctx), "bytes = 0"));
    assert_int_equal(fj_malloc(ctx, 16, NULL), FJ_ERR_INVALID_ARGUMENT);
    assert_int_equal(fj_malloc(NULL, 16, &p), FJ_ERR_INVALID_ARGUMENT);
    assert_int_equal(fj_malloc(ctx, 64, &p), FJ_OK);
    char host[64] = {1};
    assert_int_equal(fj_memcpy_h2d(ctx, NULL, host, 4), FJ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fj_context_last_error(ctx), "dst is NULL"));
    assert_int_equal(fj_memcpy_d2h(ctx, host, NULL, 4), FJ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fj_context_last_error(ctx), "src is NULL"));
    assert_int_equal(fj_memcpy_h2d(ctx, p, host, 64), FJ_OK);
    char back[64] = {0};
    assert_int_equal(fj_memcpy_d2h(ctx, back, p, 64), FJ_OK);
    assert_memory_equal(host, back, 64);
    assert_int_equal(fj_free(ctx, p), FJ_OK);
    assert_int_equal(fj_free(ctx, NULL), FJ_OK);
    assert_int_equal(fj_synchronize(NULL, NULL), FJ_ERR_INVALID_ARGUMENT);
    assert_int_equal(fj_synchronize(ctx, NULL), FJ_OK);

    fj_call_info info = {.struct_size = 1};
    assert_int_equal(fj_context_last_call(ctx, &info), FJ_ERR_INVALID_ARGUMENT);
    assert_int_equal(fj_context_last_call(NULL, &info), FJ_ERR_INVALID_ARGUMENT);
    assert_int_equal(fj_attention_forward(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
                     FJ_ERR_INVALID_ARGUMENT);
    assert_int_equal(fj_attention_forward(ctx, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
                     FJ_ERR_INVALID_ARGUMENT);
    assert_string_equal(fj_context_last_error(ctx), "q is NULL");
    /* The appends: no context, or no tensors, named (the packed one's offsets first). */
    assert_int_equal(fj_kv_cache_append(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
                     FJ_ERR_INVALID_ARGUMENT);
    assert_int_equal(fj_kv_cache_append_quantized(NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                                                  NULL, NULL, NULL),
                     FJ_ERR_INVALID_ARGUMENT);
    assert_int_equal(fj_kv_cache_append(ctx, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
                     FJ_ERR_INVALID_ARGUMENT);
    assert_string_equal(fj_context_last_error(ctx), "k_new is NULL");
    assert_int_equal(fj_kv_cache_append_packed(ctx, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                                               NULL),
                     FJ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fj_context_last_error(ctx), "cu_seqlens_new is NULL"));
    assert_int_equal(fj_kv_cache_append_quantized(ctx, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                                                  NULL, NULL, NULL),
                     FJ_ERR_INVALID_ARGUMENT);
    assert_string_equal(fj_context_last_error(ctx), "k_new is NULL");
    info.struct_size = sizeof info;
    assert_int_equal(fj_context_last_call(ctx, &info), FJ_OK);
    assert_int_equal(info.source, FJ_KERNEL_NONE);
    /* The first version's size (up to `tuned`) is still filled, and nothing past it. */
    memset(&info, 0x5a, sizeof info);
    info.struct_size = offsetof(fj_call_info, tuned) + sizeof info.tuned;
    assert_int_equal(fj_context_last_call(ctx, &info), FJ_OK);
    assert_int_equal(info.source, FJ_KERNEL_NONE);
    assert_int_equal(info.struct_size, offsetof(fj_call_info, tuned) + sizeof info.tuned);
    uint64_t untouched;
    memset(&untouched, 0x5a, sizeof untouched);
    assert_memory_equal(&info.workspace_bytes, &untouched, sizeof untouched);
    /* The second's (up to `workspace_bytes`) too, its `launched` left alone. */
    memset(&info, 0x5a, sizeof info);
    info.struct_size = offsetof(fj_call_info, workspace_bytes) + sizeof info.workspace_bytes;
    assert_int_equal(fj_context_last_call(ctx, &info), FJ_OK);
    assert_int_equal(info.workspace_bytes, 0);
    const char *never;
    memset(&never, 0x5a, sizeof never);
    assert_memory_equal(&info.launched, &never, sizeof never);
    /* A call that failed launched nothing. */
    info.struct_size = sizeof info;
    assert_int_equal(fj_context_last_call(ctx, &info), FJ_OK);
    assert_string_equal(info.launched, "");

    fj_device_info dev = {.struct_size = 12};
    assert_int_equal(fj_context_get_device_info(ctx, &dev), FJ_ERR_INVALID_ARGUMENT);
    assert_int_equal(fj_context_get_device_info(ctx, NULL), FJ_ERR_INVALID_ARGUMENT);
    dev.struct_size = sizeof dev;
    assert_int_equal(fj_context_get_device_info(ctx, &dev), FJ_OK);
    assert_int_equal(dev.backend, FJ_BACKEND_OPENCL);
    assert_true(strlen(dev.name) > 0);
    assert_string_equal(fj_context_cache_path(ctx), ":memory:");

    /* A cache file that cannot be used: a warning, and the path says there is none. */
    fj_context_options o;
    fj_context_options_init(&o);
    o.backend = FJ_BACKEND_OPENCL;
    o.cache_path = "/proc/version/kernels.db"; /* its folder is a file */
    fj_context *nocache = NULL;
    assert_int_equal(fj_context_create(&o, &nocache), FJ_OK);
    assert_non_null(strstr(fj_context_last_error(nocache), "is not used"));
    assert_string_equal(fj_context_cache_path(nocache), ":memory:");
    fj_context_destroy(nocache);
}

/* Expressions are checked before anything is compiled: a bad one names its position, and one
** that reads mod_args needs them. */
static void test_bad_expressions_are_rejected(void **state)
{
    fj_context *ctx = *state;
    if (!ctx)
        skip();
    void *mem = NULL;
    assert_int_equal(fj_malloc(ctx, 4096, &mem), FJ_OK);
    fj_tensor t = {.data = mem,
                   .dtype = FJ_DTYPE_F32,
                   .ndim = 4,
                   .shape = {1, 8, 1, 16},
                   .stride = {128, 16, 16, 1}};
    fj_tensor o = t;
    o.data = (char *)mem + 1024;
    fj_attention_desc d;
    fj_attention_desc_init(&d);
    d.mask_mod = "q >= k; while(1);";
    assert_int_equal(fj_attention_forward(ctx, &d, &t, &t, &t, &o, NULL, NULL),
                     FJ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fj_context_last_error(ctx), "desc.mask_mod: unexpected character ';'"));
    assert_non_null(strstr(fj_context_last_error(ctx), "position 7"));
    fj_attention_desc_init(&d);
    d.score_mod = "s + arg[h]";
    assert_int_equal(fj_attention_forward(ctx, &d, &t, &t, &t, &o, NULL, NULL),
                     FJ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fj_context_last_error(ctx), "mod_args_count = 0"));
    d.score_mod = NULL;
    d.mask_mod = "q >= k";
    assert_int_equal(fj_attention_forward(ctx, &d, &t, &t, &t, &o, NULL, NULL), FJ_OK);
    assert_int_equal(fj_synchronize(ctx, NULL), FJ_OK);
    assert_int_equal(fj_free(ctx, mem), FJ_OK);
}

/* The OpenCL device has no system SVM: its kernels can touch only this context's fj_malloc()
** memory, so host pointers, tensors running past their block and foreign frees are refused. */
static void test_opencl_tensors_must_be_context_memory(void **state)
{
    fj_context *ctx = *state;
    if (!ctx)
        skip();
    void *mem = NULL;
    assert_int_equal(fj_malloc(ctx, 4096, &mem), FJ_OK);
    static float host[128 * 4];
    fj_tensor t = {.data = mem,
                   .dtype = FJ_DTYPE_F32,
                   .ndim = 4,
                   .shape = {1, 8, 1, 16},
                   .stride = {128, 16, 16, 1}};
    fj_tensor o = t;
    o.data = (char *)mem + 2048;
    fj_attention_desc d;
    fj_attention_desc_init(&d);

    fj_tensor h = t;
    h.data = host;
    assert_int_equal(fj_attention_forward(ctx, &d, &h, &t, &t, &o, NULL, NULL),
                     FJ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fj_context_last_error(ctx), "q.data"));
    assert_non_null(strstr(fj_context_last_error(ctx), "fj_malloc"));
    /* 512 bytes starting 64 bytes before the block's end. */
    o.data = (char *)mem + 4096 - 64;
    assert_int_equal(fj_attention_forward(ctx, &d, &t, &t, &t, &o, NULL, NULL),
                     FJ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fj_context_last_error(ctx), "out.data"));
    o.data = (char *)mem + 4096 - 512;
    assert_int_equal(fj_attention_forward(ctx, &d, &t, &t, &t, &o, NULL, NULL), FJ_OK);
    assert_int_equal(fj_synchronize(ctx, NULL), FJ_OK);

    assert_int_equal(fj_free(ctx, host), FJ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fj_context_last_error(ctx), "not returned by fj_malloc"));
    assert_int_equal(fj_free(ctx, (char *)mem + 16), FJ_ERR_INVALID_ARGUMENT);
    assert_int_equal(fj_free(ctx, mem), FJ_OK);
    assert_int_equal(fj_free(ctx, mem), FJ_ERR_INVALID_ARGUMENT);
    /* Freed memory is no longer a place for tensors. */
    assert_int_equal(fj_attention_forward(ctx, &d, &t, &t, &t, &t, NULL, NULL),
                     FJ_ERR_INVALID_ARGUMENT);
}

/* The caller's allocator (fj_context_options.allocator) for workspaces: here fj_malloc on the
** same context, counted; fail makes it return NULL. */
typedef struct counted_allocator {
    fj_context *ctx;
    int allocs, frees, fail;
    size_t live;
    size_t shift; /* bytes past fj_malloc's pointer that alloc returns (misaligned memory) */
} counted_allocator;

static void *counted_alloc(void *user, size_t bytes, void *stream)
{
    (void)stream;
    counted_allocator *c = user;
    void *p = NULL;
    if (c->fail || fj_malloc(c->ctx, bytes + c->shift, &p) != FJ_OK)
        return NULL;
    c->allocs++;
    c->live += bytes;
    return (char *)p + c->shift;
}

static void counted_free(void *user, void *ptr, size_t bytes, void *stream)
{
    (void)stream;
    counted_allocator *c = user;
    assert_int_equal(fj_free(c->ctx, (char *)ptr - c->shift), FJ_OK);
    c->frees++;
    c->live -= bytes;
}

/* A split decode (its partial states are a workspace) on a context with and without the
** caller's allocator: the workspace comes from it and goes back to it, the outputs are equal
** bit for bit, an allocator that fails or returns misaligned memory makes the call fail by
** name, and half an allocator is refused. */
static void test_caller_allocator_for_workspaces(void **state)
{
    (void)state;
    fj_context_options o;
    fj_context_options_init(&o);
    o.backend = FJ_BACKEND_OPENCL;
    o.cache_path = ":memory:";
    counted_allocator c = {0};
    o.allocator = (fj_allocator){.alloc = counted_alloc, .free = counted_free, .user = &c};
    fj_context *ctx = NULL, *plain = NULL;
    if (fj_context_create(&o, &ctx) != FJ_OK)
        skip();
    c.ctx = ctx;
    o.allocator = (fj_allocator){0};
    assert_int_equal(fj_context_create(&o, &plain), FJ_OK);

    enum { SK = 600, HQ = 4, D = 16 };
    static float host_q[HQ * D], host_kv[SK * D], out[2][HQ * D];
    unsigned s = 12345u;
    for (int i = 0; i < HQ * D; i++)
        host_q[i] = (float)((s = s * 1103515245u + 12345u) >> 9) / (1u << 23) - 0.5f;
    for (int i = 0; i < SK * D; i++)
        host_kv[i] = (float)((s = s * 1103515245u + 12345u) >> 9) / (1u << 23) - 0.5f;
    fj_context *ctxs[2] = {ctx, plain};
    for (int i = 0; i < 2; i++) {
        void *mem = NULL;
        const size_t qb = sizeof host_q, kb = sizeof host_kv;
        assert_int_equal(fj_malloc(ctxs[i], 2 * qb + kb, &mem), FJ_OK);
        assert_int_equal(fj_memcpy_h2d(ctxs[i], mem, host_q, qb), FJ_OK);
        assert_int_equal(fj_memcpy_h2d(ctxs[i], (char *)mem + qb, host_kv, kb), FJ_OK);
        fj_tensor q = {.data = mem, .dtype = FJ_DTYPE_F32, .ndim = 4, .shape = {1, 1, HQ, D},
                       .stride = {HQ * D, HQ * D, D, 1}};
        fj_tensor kv = {.data = (char *)mem + qb, .dtype = FJ_DTYPE_F32, .ndim = 4,
                        .shape = {1, SK, 1, D}, .stride = {SK * D, D, D, 1}};
        fj_tensor o_t = q;
        o_t.data = (char *)mem + qb + kb;
        fj_attention_desc d;
        fj_attention_desc_init(&d);
        d.num_splits = 4;
        assert_int_equal(fj_attention_forward(ctxs[i], &d, &q, &kv, &kv, &o_t, NULL, NULL), FJ_OK);
        assert_int_equal(fj_memcpy_d2h(ctxs[i], out[i], o_t.data, qb), FJ_OK);
        fj_call_info info = {.struct_size = sizeof info};
        assert_int_equal(fj_context_last_call(ctxs[i], &info), FJ_OK);
        assert_non_null(strstr(info.kernel_path, "decode"));
        assert_true(info.workspace_bytes > 0);
        /* the split decode, then the merge of its four states */
        char want[128];
        snprintf(want, sizeof want, "%s,%.*s.merge", info.kernel_path,
                 (int)strcspn(info.kernel_path, "."), info.kernel_path);
        assert_string_equal(info.launched, want);
        assert_int_equal(fj_free(ctxs[i], mem), FJ_OK);
    }
    assert_memory_equal(out[0], out[1], sizeof out[0]);
    assert_int_equal(c.allocs, 1);
    assert_int_equal(c.frees, 0);
    fj_context_destroy(ctx);
    assert_int_equal(c.frees, 1); /* handed back with the context */
    assert_int_equal(c.live, 0);
    fj_context_destroy(plain);

    /* An allocator that fails: the call says so. */
    counted_allocator none = {.fail = 1};
    o.allocator = (fj_allocator){.alloc = counted_alloc, .free = counted_free, .user = &none};
    assert_int_equal(fj_context_create(&o, &ctx), FJ_OK);
    none.ctx = ctx;
    void *mem = NULL;
    assert_int_equal(fj_malloc(ctx, 64 * 1024, &mem), FJ_OK);
    fj_tensor q = {.data = mem, .dtype = FJ_DTYPE_F32, .ndim = 4, .shape = {1, 1, HQ, D},
                   .stride = {HQ * D, HQ * D, D, 1}};
    fj_tensor kv = {.data = (char *)mem + 1024, .dtype = FJ_DTYPE_F32, .ndim = 4,
                    .shape = {1, 500, 1, D}, .stride = {500 * D, D, D, 1}};
    fj_tensor o_t = q;
    o_t.data = (char *)mem + 512;
    fj_attention_desc d;
    fj_attention_desc_init(&d);
    d.num_splits = 2;
    assert_int_equal(fj_attention_forward(ctx, &d, &q, &kv, &kv, &o_t, NULL, NULL),
                     FJ_ERR_OUT_OF_MEMORY);
    assert_non_null(strstr(fj_context_last_error(ctx), "workspace"));
    assert_int_equal(fj_free(ctx, mem), FJ_OK);
    fj_context_destroy(ctx);
    assert_int_equal(none.frees, 0);

    /* An allocator whose memory kernels cannot read whole vectors of: the call names it, and
    ** the memory goes back to it at once. */
    counted_allocator askew = {.shift = 4};
    o.allocator = (fj_allocator){.alloc = counted_alloc, .free = counted_free, .user = &askew};
    assert_int_equal(fj_context_create(&o, &ctx), FJ_OK);
    askew.ctx = ctx;
    assert_int_equal(fj_malloc(ctx, 64 * 1024, &mem), FJ_OK);
    q.data = mem;
    kv.data = (char *)mem + 1024;
    o_t.data = (char *)mem + 512;
    assert_int_equal(fj_attention_forward(ctx, &d, &q, &kv, &kv, &o_t, NULL, NULL),
                     FJ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fj_context_last_error(ctx), "not 16-byte aligned"));
    assert_non_null(strstr(fj_context_last_error(ctx), "opts.allocator"));
    assert_int_equal(askew.allocs, 1);
    assert_int_equal(askew.frees, 1);
    assert_int_equal(fj_free(ctx, mem), FJ_OK);
    fj_context_destroy(ctx);
    assert_int_equal(askew.frees, 1);

    /* Half an allocator is refused by name. */
    o.allocator = (fj_allocator){.alloc = counted_alloc};
    assert_int_equal(fj_context_create(&o, &ctx), FJ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fj_last_create_error(), "opts.allocator"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_version_and_status_strings),
        cmocka_unit_test(test_context_create_rejects_bad_options),
        cmocka_unit_test(test_device_queries),
        cmocka_unit_test_setup_teardown(test_memory_and_call_checks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_bad_expressions_are_rejected, setup, teardown),
        cmocka_unit_test_setup_teardown(test_opencl_tensors_must_be_context_memory, setup,
                                        teardown),
        cmocka_unit_test(test_caller_allocator_for_workspaces),
    };
    return cmocka_run_group_tests_name("public_api", tests, NULL, NULL);
}
