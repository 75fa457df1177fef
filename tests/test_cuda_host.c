/* The CUDA backend's host side without a GPU, against the driver stub (tests/driver_stub.c,
** found as libcuda.so.1 through LD_LIBRARY_PATH): kernels are rendered and compiled by NVRTC
** for real, launches are recorded instead of run. Checked through the public API and the
** stub's records: which kernel a request runs on which architecture, that every tensor's
** address reaches the launched kernel's parameter block, that a decode with split keys is its
** kernel and then the merge, that a memoised call compiles, allocates and synchronises nothing,
** the graph-capture rules (a first call during a capture is refused by name; after one call
** the same call captures without allocating or synchronising), the backward's stages, and that
** a failed compile's message names its cause. No
** numerics: the `gpu` suites check those on a device. Skips where NVRTC or the stub is
** missing. */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "driver_stub.h"
#include "flashjit.h"

/* ---- the stub's records (see driver_stub.c) -------------------------------------------------- */

static struct {
    void (*reset)(void);
    int (*launches)(void);
    const fjstub_launch *(*launch_at)(int);
    int (*allocs)(void);
    int (*syncs)(void);
    void (*set_capturing)(void *);
} stub;

static int load_stub(void)
{
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib || !dlsym(lib, "fjstub_reset"))
        return 0; /* a real driver, or none */
    *(void **)&stub.reset = dlsym(lib, "fjstub_reset");
    *(void **)&stub.launches = dlsym(lib, "fjstub_launches");
    *(void **)&stub.launch_at = dlsym(lib, "fjstub_launch_at");
    *(void **)&stub.allocs = dlsym(lib, "fjstub_allocs");
    *(void **)&stub.syncs = dlsym(lib, "fjstub_syncs");
    *(void **)&stub.set_capturing = dlsym(lib, "fjstub_set_capturing");
    return 1;
}

/* ---- requests -------------------------------------------------------------------------------- */
/* A request's tensors in (stub) device memory: q [b, sq, hq, d], k and v [b, sk, hkv, d|dv]
** (v a view of k's first dv columns with v_in_k), out, lse [b, hq, sq]. */
typedef struct request {
    fj_attention_desc desc;
    fj_tensor q, k, v, out, lse;
    void *mem[5];
} request;

static fj_tensor dense(void *data, fj_dtype dtype, int64_t b, int64_t s, int64_t h, int64_t d)
{
    return (fj_tensor){.data = data,
                       .dtype = dtype,
                       .ndim = 4,
                       .shape = {b, s, h, d},
                       .stride = {s * h * d, h * d, d, 1}};
}

static void request_make_typed(fj_context *ctx, request *r, fj_dtype dt, int64_t b, int64_t sq,
                               int64_t sk, int64_t hq, int64_t hkv, int64_t d, int64_t dv,
                               int v_in_k)
{
    memset(r, 0, sizeof *r);
    fj_attention_desc_init(&r->desc);
    const int64_t es = (int64_t)fj_dtype_size(dt);
    const size_t bytes[5] = {(size_t)(b * sq * hq * d * es), (size_t)(b * sk * hkv * d * es),
                             (size_t)(b * sk * hkv * dv * es), (size_t)(b * sq * hq * dv * es),
                             (size_t)(b * hq * sq * 4)};
    for (int i = 0; i < 5; i++)
        assert_int_equal(fj_malloc(ctx, bytes[i], &r->mem[i]), FJ_OK);
    r->q = dense(r->mem[0], dt, b, sq, hq, d);
    r->k = dense(r->mem[1], dt, b, sk, hkv, d);
    r->v = dense(v_in_k ? r->mem[1] : r->mem[2], dt, b, sk, hkv, dv);
    if (v_in_k) /* k's strides, its first dv columns */
        memcpy(r->v.stride, r->k.stride, sizeof r->v.stride);
    r->out = dense(r->mem[3], dt, b, sq, hq, dv);
    r->lse = (fj_tensor){.data = r->mem[4],
                         .dtype = FJ_DTYPE_F32,
                         .ndim = 3,
                         .shape = {b, hq, sq},
                         .stride = {hq * sq, sq, 1}};
}

static void request_make(fj_context *ctx, request *r, int64_t b, int64_t sq, int64_t sk, int64_t hq,
                         int64_t hkv, int64_t d, int64_t dv, int v_in_k)
{
    request_make_typed(ctx, r, FJ_DTYPE_BF16, b, sq, sk, hq, hkv, d, dv, v_in_k);
}

static void request_free(fj_context *ctx, request *r)
{
    for (int i = 0; i < 5; i++)
        fj_free(ctx, r->mem[i]);
}

static fj_status run(fj_context *ctx, request *r, void *stream)
{
    return fj_attention_forward(ctx, &r->desc, &r->q, &r->k, &r->v, &r->out, &r->lse, stream);
}

static const char *kernel_path(fj_context *ctx)
{
    fj_call_info info = {.struct_size = sizeof info};
    assert_int_equal(fj_context_last_call(ctx, &info), FJ_OK);
    return info.kernel_path ? info.kernel_path : "";
}

/* Whether the 8 bytes of pointer p appear in launch l's parameter block (tensor maps hold
** their base address there too). */
static int params_hold(const fjstub_launch *l, const void *p)
{
    for (size_t o = 0; o + sizeof p <= sizeof l->params; o += 8)
        if (memcmp(l->params + o, &p, sizeof p) == 0)
            return 1;
    return 0;
}

/* The last call ran kernels already loaded, and allocated and synchronised nothing since the
** stub's records were reset. */
static void assert_memoised(fj_context *ctx)
{
    fj_call_info info = {.struct_size = sizeof info};
    assert_int_equal(fj_context_last_call(ctx, &info), FJ_OK);
    assert_int_equal(info.source, FJ_KERNEL_MEMORY);
    assert_int_equal(stub.allocs(), 0);
    assert_int_equal(stub.syncs(), 0);
}

/* A context on the stub with compute capability sm (the stub's FJ_STUB_SM), or NULL where the
** suite should skip. */
static fj_context *stub_context(const char *sm)
{
    setenv("FJ_STUB_SM", sm, 1);
    fj_context_options o;
    fj_context_options_init(&o);
    o.backend = FJ_BACKEND_CUDA;
    fj_context *ctx = NULL;
    return fj_context_create(&o, &ctx) == FJ_OK ? ctx : NULL;
}

/* ---- the tests ------------------------------------------------------------------------------- */

/* A prefill on sm_90a runs Hopper's kernel, and every tensor's address is in what it got. */
static void test_forward_reaches_the_kernel(void **state)
{
    fj_context *ctx = stub_context("90");
    assert_non_null(ctx);
    fj_device_info info = {.struct_size = sizeof info};
    assert_int_equal(fj_context_get_device_info(ctx, &info), FJ_OK);
    assert_string_equal(info.arch, "sm_90a");
    request r;
    request_make(ctx, &r, 2, 300, 300, 4, 2, 128, 128, 0);
    r.desc.causal = 1;
    stub.reset();
    assert_int_equal(run(ctx, &r, NULL), FJ_OK);
    assert_string_equal(kernel_path(ctx), "cuda.fwd.wgmma");
    assert_true(stub.launches() >= 1);
    const fjstub_launch *l = stub.launch_at(stub.launches() - 1);
    assert_string_equal(l->function, "fj_attn_fwd");
    const void *tensors[5] = {r.q.data, r.k.data, r.v.data, r.out.data, r.lse.data};
    for (int i = 0; i < 5; i++)
        assert_true(params_hold(l, tensors[i]));
    request_free(ctx, &r);
    fj_context_destroy(ctx);
}

/* A decode with four key splits: the decode kernel over (kv heads, splits, batch), then the
** merge, whose launch overlaps the decode kernel's end on sm_90 only; or, asked for
** (FLASHJIT_CONFIG merge_last=1), the decode kernel alone, whose last split of each block's
** rows merges them into out and lse (its arrival counters zeroed once, when the stream's arena
** got them). A memoised repeat compiles, allocates and synchronises nothing. */
static void test_split_decode_then_merge(void **state)
{
    for (int sm = 80; sm <= 90; sm += 10)
        for (int merge_last = 1; merge_last >= 0; merge_last--) {
            if (merge_last)
                setenv("FLASHJIT_CONFIG", "merge_last=1", 1); /* read when a context is made */
            fj_context *ctx = stub_context(sm == 90 ? "90" : "80");
            unsetenv("FLASHJIT_CONFIG");
            assert_non_null(ctx);
            request r;
            request_make(ctx, &r, 3, 1, 4096, 8, 2, 128, 128, 0);
            r.desc.num_splits = 4;
            stub.reset();
            assert_int_equal(run(ctx, &r, NULL), FJ_OK);
            assert_string_equal(kernel_path(ctx), "cuda.decode.mma");
            /* the arena and its zeroed counters: 3 x 2 blocks' arrivals */
            assert_int_equal(stub.allocs(), merge_last ? 2 : 1);
            fj_call_info before = {.struct_size = sizeof before};
            assert_int_equal(fj_context_last_call(ctx, &before), FJ_OK);
            stub.reset();
            assert_int_equal(run(ctx, &r, NULL), FJ_OK);
            assert_int_equal(stub.launches(), merge_last ? 1 : 2);
            const fjstub_launch *dec = stub.launch_at(0);
            assert_string_equal(dec->function, "fj_attn_decode");
            assert_int_equal(dec->grid[1], 4); /* the splits */
            assert_int_equal(dec->grid[2], 3); /* the batch */
            assert_int_equal(dec->overlap_previous, 0);
            assert_true(params_hold(dec, r.q.data) && params_hold(dec, r.k.data) &&
                        params_hold(dec, r.v.data));
            if (merge_last) {
                assert_true(params_hold(dec, r.out.data) && params_hold(dec, r.lse.data));
            } else {
                const fjstub_launch *merge = stub.launch_at(1);
                assert_string_equal(merge->function, "fj_attn_merge");
                assert_int_equal(merge->grid[1], 128 / 32); /* 128 columns, 32-lane groups */
                assert_int_equal(merge->overlap_previous, sm == 90);
                assert_true(params_hold(merge, r.out.data) && params_hold(merge, r.lse.data));
            }
            fj_call_info after = {.struct_size = sizeof after};
            assert_int_equal(fj_context_last_call(ctx, &after), FJ_OK);
            assert_int_equal(after.compiles, before.compiles);
            assert_memoised(ctx);
            request_free(ctx, &r);
            fj_context_destroy(ctx);
        }
}

/* During a capture the first call of a kind (it would allocate its workspace) is refused by
** name; after one call on the stream, the same call captures without allocating or
** synchronising. */
static void test_graph_capture_rules(void **state)
{
    fj_context *ctx = stub_context("90");
    assert_non_null(ctx);
    request r;
    request_make(ctx, &r, 2, 1, 3000, 8, 2, 64, 64, 0);
    r.desc.num_splits = 3;
    void *stream = (void *)(uintptr_t)0x5000; /* the stub takes any handle */
    stub.set_capturing(stream);
    assert_int_equal(run(ctx, &r, stream), FJ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(fj_context_last_error(ctx), "being captured"));
    stub.set_capturing(NULL);
    assert_int_equal(run(ctx, &r, stream), FJ_OK);
    stub.set_capturing(stream);
    stub.reset();
    assert_int_equal(run(ctx, &r, stream), FJ_OK);
    assert_int_equal(stub.allocs(), 0);
    assert_int_equal(stub.syncs(), 0);
    assert_int_equal(stub.launches(), 2);
    for (int i = 0; i < 2; i++)
        assert_ptr_equal(stub.launch_at(i)->stream, stream);
    stub.set_capturing(NULL);
    request_free(ctx, &r);
    fj_context_destroy(ctx);
}

/* Whether some recorded launch of kernel `function` (NULL: of any kernel) holds pointer p in
** its parameters. */
static int launched_with(const char *function, const void *p)
{
    for (int i = 0; i < stub.launches(); i++)
        if ((!function || !strcmp(stub.launch_at(i)->function, function)) &&
            params_hold(stub.launch_at(i), p))
            return 1;
    return 0;
}

/* The backward on sm_90a and sm_80, default and deterministic: its stages in order (D first,
** then dk and dv, which write dk and dv), dq's address in a launch, and a memoised repeat that
** compiles, allocates and synchronises nothing. */
static void test_backward_stages(void **state)
{
    static const char *const sms[] = {"90", "80"};
    for (int a = 0; a < 2; a++)
        for (int det = 0; det < 2; det++) {
            fj_context *ctx = stub_context(sms[a]);
            assert_non_null(ctx);
            request r, g; /* g: dout in q's place, dq, dk, dv in the others' */
            request_make(ctx, &r, 2, 200, 300, 4, 2, 64, 64, 0);
            request_make(ctx, &g, 2, 200, 300, 4, 2, 64, 64, 0);
            r.desc.causal = 1;
            r.desc.deterministic = det;
            fj_status st = fj_attention_backward(ctx, &r.desc, &r.q, &r.k, &r.v, &r.out, &g.out,
                                                 &r.lse, &g.q, &g.k, &g.v, NULL);
            assert_int_equal(st, FJ_OK);
            stub.reset();
            st = fj_attention_backward(ctx, &r.desc, &r.q, &r.k, &r.v, &r.out, &g.out, &r.lse, &g.q,
                                       &g.k, &g.v, NULL);
            assert_int_equal(st, FJ_OK);
            printf("  sm_%s deterministic %d: %s,", sms[a], det, kernel_path(ctx));
            for (int i = 0; i < stub.launches(); i++)
                printf(" %s", stub.launch_at(i)->function);
            printf("\n");
            assert_true(stub.launches() >= 2);
            assert_string_equal(stub.launch_at(0)->function, "fj_attn_bwd_dot");
            assert_true(launched_with("fj_attn_bwd_dkdv", g.k.data));
            assert_true(launched_with("fj_attn_bwd_dkdv", g.v.data));
            assert_true(launched_with(NULL, g.q.data)); /* dq */
            assert_memoised(ctx);
            request_free(ctx, &r);
            request_free(ctx, &g);
            fj_context_destroy(ctx);
        }
}

/* A backward with the bias's gradient on sm_90a and sm_80: dq, dk and dv on the tensor cores
** (as without it), then the SIMT dbias stage last, which gets dbias's address; for a key bias
** (its five key tiles too few for the device), the dbias stage's shares of the rows, then their
** sum, which gets it. */
static void test_bias_gradient_stages(void **state)
{
    (void)state;
    static const char *const sms[] = {"90", "80"};
    static const char *const paths[] = {"cuda.bwd.wgmma", "cuda.bwd.mma"};
    for (int a = 0; a < 2; a++) {
        fj_context *ctx = stub_context(sms[a]);
        assert_non_null(ctx);
        request r, g;
        request_make(ctx, &r, 2, 200, 300, 4, 2, 64, 64, 0);
        request_make(ctx, &g, 2, 200, 300, 4, 2, 64, 64, 0);
        void *mem[2];
        const size_t bytes = (size_t)4 * 200 * 300 * sizeof(float); /* [1, 4, 200, 300] */
        for (int i = 0; i < 2; i++)
            assert_int_equal(fj_malloc(ctx, bytes, &mem[i]), FJ_OK);
        fj_tensor bias = {.data = mem[0],
                          .dtype = FJ_DTYPE_F32,
                          .ndim = 4,
                          .shape = {1, 4, 200, 300},
                          .stride = {0, 200 * 300, 300, 1}};
        fj_tensor keys = bias; /* [2, 1, 1, 300] */
        keys.shape[0] = 2;
        keys.shape[1] = keys.shape[2] = 1;
        keys.stride[0] = 300;
        keys.stride[1] = keys.stride[2] = 0;
        for (int kind = 0; kind < 2; kind++) {
            const fj_tensor *b = kind ? &keys : &bias;
            fj_tensor dbias = *b;
            dbias.data = mem[1];
            r.desc.causal = 1;
            r.desc.bias = b;
            r.desc.dbias = &dbias;
            stub.reset();
            assert_int_equal(fj_attention_backward(ctx, &r.desc, &r.q, &r.k, &r.v, &r.out,
                                                   &g.out, &r.lse, &g.q, &g.k, &g.v, NULL),
                             FJ_OK);
            printf("  sm_%s with dbias of a %s bias: %s,", sms[a], kind ? "key" : "head",
                   kernel_path(ctx));
            for (int i = 0; i < stub.launches(); i++)
                printf(" %s", stub.launch_at(i)->function);
            printf("\n");
            assert_string_equal(kernel_path(ctx), paths[a]);
            assert_true(launched_with("fj_attn_bwd_dkdv", g.k.data));
            assert_true(launched_with(NULL, g.q.data));
            const fjstub_launch *last = stub.launch_at(stub.launches() - 1);
            assert_string_equal(last->function, kind ? "fj_attn_bwd_dbias_sum"
                                                     : "fj_attn_bwd_dbias");
            assert_true(params_hold(last, dbias.data));
            if (kind)
                assert_string_equal(stub.launch_at(stub.launches() - 2)->function,
                                    "fj_attn_bwd_dbias");
        }
        for (int i = 0; i < 2; i++)
            fj_free(ctx, mem[i]);
        request_free(ctx, &r);
        request_free(ctx, &g);
        fj_context_destroy(ctx);
    }
}

/* The deterministic backward on sm_90a with few (batch, kv head) pairs and many keys: its dk/dv
** stage is one persistent launch of `slices` blocks a (batch, kv head), each taking its key
** blocks in turn; with FLASHJIT_BWD_CONFIG=persistent=0 it is launched in runs one after another
** on the call's stream, each the same grid, each with its own parameter block (its first key
** block). The cast comes after them. */
static void deterministic_launches(int persistent)
{
    if (!persistent)
        setenv("FLASHJIT_BWD_CONFIG", "persistent=0", 1); /* read when a context is made */
    fj_context *ctx = stub_context("90");
    unsetenv("FLASHJIT_BWD_CONFIG");
    assert_non_null(ctx);
    request r, g;
    request_make(ctx, &r, 2, 200, 3000, 4, 2, 64, 64, 0);
    request_make(ctx, &g, 2, 200, 3000, 4, 2, 64, 64, 0);
    r.desc.deterministic = 1;
    void *stream = (void *)(uintptr_t)0x5eed;
    stub.reset();
    assert_int_equal(fj_attention_backward(ctx, &r.desc, &r.q, &r.k, &r.v, &r.out, &g.out,
                                           &r.lse, &g.q, &g.k, &g.v, stream),
                     FJ_OK);
    int runs = 0, first = -1, last = -1;
    for (int i = 0; i < stub.launches(); i++) {
        const fjstub_launch *l = stub.launch_at(i);
        assert_ptr_equal(l->stream, stream);
        if (strcmp(l->function, "fj_attn_bwd_dkdv"))
            continue;
        if (first < 0)
            first = i;
        else
            assert_memory_equal(l->grid, stub.launch_at(first)->grid, sizeof l->grid);
        for (int j = first; j < i; j++) /* a block of its own */
            assert_memory_not_equal(l->params, stub.launch_at(j)->params, sizeof l->params);
        last = i;
        runs++;
    }
    const fjstub_launch *l = stub.launch_at(first);
    printf("  %s: %d launches of %u blocks a (batch, kv head)\n",
           persistent ? "persistent" : "runs", runs, l->grid[0]);
    /* 3000 keys are 24 key blocks of 128: more than the slices */
    assert_true(l->grid[0] >= 2 && l->grid[0] < 24 && l->grid[1] == 2 && l->grid[2] == 2);
    if (persistent)
        assert_int_equal(runs, 1);
    else
        assert_true(runs >= 2 && last == first + runs - 1);
    assert_string_equal(stub.launch_at(last + 1)->function, "fj_attn_bwd_dq_store");
    request_free(ctx, &r);
    request_free(ctx, &g);
    fj_context_destroy(ctx);
}

static void test_deterministic_launches(void **state)
{
    (void)state;
    deterministic_launches(1);
    deterministic_launches(0);
}

/* The f32 SIMT forward at d 320 / dv 64 with a mask_mod, on sm_89 and sm_90: its K and V tiles
** fill the 48 KiB of static shared memory, and the block skipping's flags must fit beside them
** (the plan forgot them and ptxas refused the kernel by 8 bytes). */
static void test_simt_forward_fits_static_shared_memory(void **state)
{
    (void)state;
    static const char *const sms[] = {"89", "90"};
    for (int i = 0; i < 2; i++) {
        fj_context *ctx = stub_context(sms[i]);
        assert_non_null(ctx);
        request r;
        request_make_typed(ctx, &r, FJ_DTYPE_F32, 1, 64, 257, 3, 3, 320, 64, 0);
        r.desc.causal = 1;
        r.desc.mask_mod = "k <= q + 2 || k % 7 == 0";
        const fj_status st = run(ctx, &r, NULL);
        if (st != FJ_OK)
            fail_msg("sm_%s: %s", sms[i], fj_context_last_error(ctx));
        assert_string_equal(kernel_path(ctx), "cuda.fwd.simt");
        request_free(ctx, &r);
        fj_context_destroy(ctx);
    }
}

/* A kernel that NVRTC's ptxas refuses (more static shared memory than any GPU has) after pages
** of warnings: the failure names ptxas' error, which a log with ptxas' resource report
** (--ptxas-options=-v) does not carry and the warnings would crowd out of the message. */
static void test_compile_errors_name_their_cause(void **state)
{
    (void)state;
    char dir[] = "/tmp/fj-ptxas-XXXXXX", path[64];
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/attn_fwd_wgmma.cu.lua", dir);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("extern \"C\" __global__ void fj_attn_fwd(float *out)\n{\n", f);
    for (int i = 0; i < 40; i++)
        fprintf(f, "    int an_unused_variable_named_%d = %d;\n", i, i);
    fputs("    __shared__ float big[60000];\n    big[threadIdx.x] = 1.0f;\n    __syncthreads();\n"
          "    out[threadIdx.x] = big[59999 - threadIdx.x];\n}\n",
          f);
    fclose(f);
    setenv("FLASHJIT_TEMPLATE_DIR", dir, 1);
    fj_context *ctx = stub_context("90");
    assert_non_null(ctx);
    request r;
    request_make(ctx, &r, 1, 64, 64, 2, 2, 128, 128, 0);
    assert_int_equal(run(ctx, &r, NULL), FJ_ERR_COMPILE);
    const char *msg = fj_context_last_error(ctx);
    printf("  %.160s\n", msg);
    if (!strstr(msg, "too much shared data"))
        fail_msg("the message lacks ptxas' error: %s", msg);
    request_free(ctx, &r);
    fj_context_destroy(ctx);
    unsetenv("FLASHJIT_TEMPLATE_DIR");
    unlink(path);
    rmdir(dir);
}

/* MLA's decode (576 / 512, v a view of k, 16 query heads on one kv head: bandwidth-bound), dense
** and paged: a decode kernel, not the forward (whose rows would be one query each): on Hopper
** the wgmma one (64 packed rows a block, those past the 16 zeros), before it the tensor-core
** one, its warps splitting O's 512 columns. And a decode of d = dv = 512 (its own v): before
** Hopper, cp.async copies a paged cache's rows whole a warp each (16-byte columns of 64 threads
** a row would outgrow a warp's page lookups). */
static void test_wide_decode_routing(void **state)
{
    static const struct {
        const char *sm, *dense, *paged;
    } want[] = {{"90", "cuda.decode.wgmma", "cuda.decode.wgmma"},
                {"80", "cuda.decode.mma", "cuda.decode.mma"}};
    static const struct {
        int64_t d, dv;
        int v_in_k;
        const char *name;
    } shapes[] = {{576, 512, 1, "MLA"}, {512, 512, 0, "d 512"}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        for (size_t sh = 0; sh < 2; sh++) {
            fj_context *ctx = stub_context(want[i].sm);
            assert_non_null(ctx);
            request r;
            request_make(ctx, &r, 2, 1, 640, 16, 1, shapes[sh].d, shapes[sh].dv,
                         shapes[sh].v_in_k);
            assert_int_equal(run(ctx, &r, NULL), FJ_OK);
            printf("  sm_%s dense %s decode: %s\n", want[i].sm, shapes[sh].name, kernel_path(ctx));
            assert_string_equal(kernel_path(ctx), want[i].dense);
            /* the same keys as 10 pages of 64 per sequence */
            int32_t table[2][10], used[2] = {640, 640};
            for (int s = 0; s < 2; s++)
                for (int p = 0; p < 10; p++)
                    table[s][p] = s * 10 + p;
            void *dtable = NULL, *dused = NULL;
            assert_int_equal(fj_malloc(ctx, sizeof table, &dtable), FJ_OK);
            assert_int_equal(fj_malloc(ctx, sizeof used, &dused), FJ_OK);
            assert_int_equal(fj_memcpy_h2d(ctx, dtable, table, sizeof table), FJ_OK);
            assert_int_equal(fj_memcpy_h2d(ctx, dused, used, sizeof used), FJ_OK);
            fj_tensor tt = {.data = dtable,
                            .dtype = FJ_DTYPE_I32,
                            .ndim = 2,
                            .shape = {2, 10},
                            .stride = {10, 1}};
            fj_tensor tu = {
                .data = dused, .dtype = FJ_DTYPE_I32, .ndim = 1, .shape = {2}, .stride = {1}};
            fj_tensor *kv[2] = {&r.k, &r.v};
            for (int j = 0; j < 2; j++) {
                kv[j]->shape[0] = 20;
                kv[j]->shape[1] = 64;
                kv[j]->stride[0] = 64 * kv[j]->stride[1];
            }
            r.desc.page_table = &tt;
            r.desc.seqused_k = &tu;
            const fj_status st = run(ctx, &r, NULL);
            if (st != FJ_OK)
                fail_msg("sm_%s paged %s: %s", want[i].sm, shapes[sh].name,
                         fj_context_last_error(ctx));
            printf("  sm_%s paged %s decode: %s\n", want[i].sm, shapes[sh].name,
                   kernel_path(ctx));
            assert_string_equal(kernel_path(ctx), want[i].paged);
            fj_free(ctx, dtable);
            fj_free(ctx, dused);
            request_free(ctx, &r);
            fj_context_destroy(ctx);
        }
}

int main(void)
{
    if (!load_stub()) {
        printf("SKIP: libcuda.so.1 is not the driver stub (run with LD_LIBRARY_PATH at it)\n");
        return 77;
    }
    fj_context *probe = stub_context("90");
    if (!probe) {
        printf("SKIP: no CUDA context on the stub: %s\n", fj_last_create_error());
        return 77;
    }
    request r; /* a first compile: NVRTC must be there */
    request_make(probe, &r, 1, 1, 64, 2, 2, 64, 64, 0);
    const fj_status st = run(probe, &r, NULL);
    const int no_nvrtc = st != FJ_OK && strstr(fj_context_last_error(probe), "NVRTC is not");
    if (no_nvrtc)
        printf("SKIP: %s\n", fj_context_last_error(probe));
    request_free(probe, &r);
    fj_context_destroy(probe);
    if (no_nvrtc)
        return 77;
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_reaches_the_kernel),
        cmocka_unit_test(test_split_decode_then_merge),
        cmocka_unit_test(test_graph_capture_rules),
        cmocka_unit_test(test_wide_decode_routing),
        cmocka_unit_test(test_backward_stages),
        cmocka_unit_test(test_bias_gradient_stages),
        cmocka_unit_test(test_deterministic_launches),
        cmocka_unit_test(test_simt_forward_fits_static_shared_memory),
        cmocka_unit_test(test_compile_errors_name_their_cause),
    };
    return cmocka_run_group_tests_name("cuda host (driver stub)", tests, NULL, NULL);
}
