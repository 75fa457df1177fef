/* CUDA graphs: after the first call of a kind, a decode call (dense with split keys, paged,
** speculative with causal rows) launches only kernels on the caller's stream, so it can be
** captured into a CUDA graph (global capture mode: any synchronisation or allocation during the
** capture fails it); a first call during a capture is refused with a message instead. The replay must reproduce the direct call bit for bit, and must read the
** buffers' current contents: the queries are replaced between replays. The Driver API calls the
** test itself needs (streams and graphs) come from libcuda.so.1 through dlopen, as the library's.
** gpu label; without a CUDA device the suite skips. */
#define _POSIX_C_SOURCE 200809L
#include <dlfcn.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#define FJ_TEST_BACKEND FJ_BACKEND_CUDA
#include "backend_suite.h"
#include "random.h"
#include "reference.h"

/* ---- the few Driver API calls the test makes -------------------------------------------- */
typedef int CUresult;
typedef struct CUstream_st *CUstream;
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;
enum { CU_STREAM_NON_BLOCKING = 1, CU_STREAM_CAPTURE_MODE_GLOBAL = 0 };

static struct {
    void *lib;
    CUresult (*cuStreamCreate)(CUstream *, unsigned);
    CUresult (*cuStreamDestroy)(CUstream);
    CUresult (*cuStreamSynchronize)(CUstream);
    CUresult (*cuStreamBeginCapture)(CUstream, int);
    CUresult (*cuStreamEndCapture)(CUstream, CUgraph *);
    CUresult (*cuGraphInstantiate)(CUgraphExec *, CUgraph, unsigned long long);
    CUresult (*cuGraphLaunch)(CUgraphExec, CUstream);
    CUresult (*cuGraphExecDestroy)(CUgraphExec);
    CUresult (*cuGraphDestroy)(CUgraph);
} cu;

static int load_driver(void)
{
    cu.lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!cu.lib)
        return 0;
#define LOAD(name, symbol) *(void **)&cu.name = dlsym(cu.lib, symbol)
    LOAD(cuStreamCreate, "cuStreamCreate");
    LOAD(cuStreamDestroy, "cuStreamDestroy_v2");
    LOAD(cuStreamSynchronize, "cuStreamSynchronize");
    LOAD(cuStreamBeginCapture, "cuStreamBeginCapture_v2");
    LOAD(cuStreamEndCapture, "cuStreamEndCapture");
    LOAD(cuGraphInstantiate, "cuGraphInstantiateWithFlags");
    LOAD(cuGraphLaunch, "cuGraphLaunch");
    LOAD(cuGraphExecDestroy, "cuGraphExecDestroy");
    LOAD(cuGraphDestroy, "cuGraphDestroy");
#undef LOAD
    return cu.cuStreamCreate && cu.cuStreamDestroy && cu.cuStreamSynchronize &&
           cu.cuStreamBeginCapture && cu.cuStreamEndCapture && cu.cuGraphInstantiate &&
           cu.cuGraphLaunch && cu.cuGraphExecDestroy && cu.cuGraphDestroy;
}

#define CU_OK(call) assert_int_equal((call), 0)

/* ---- data --------------------------------------------------------------------------------- */
static uint64_t rng = 0x2545f4914f6cdd1dull;

static float uniform_pm1(void) /* [-1, 1) */
{
    return (float)fjr_signed_unit(fjr_xorshift(&rng));
}

/* A device buffer of n bf16 values, random; its host copy for re-uploads. */
typedef struct buf {
    void *dev;
    uint16_t *host;
    size_t n;
} buf;

static void buf_random(fj_context *ctx, buf *b, size_t n)
{
    b->n = n;
    b->host = malloc(n * sizeof *b->host);
    assert_non_null(b->host);
    for (size_t i = 0; i < n; i++)
        b->host[i] = fjr_f32_to_bf16(uniform_pm1());
    assert_int_equal(fj_malloc(ctx, n * 2, &b->dev), FJ_OK);
    assert_int_equal(fj_memcpy_h2d(ctx, b->dev, b->host, n * 2), FJ_OK);
}

static void buf_poison(fj_context *ctx, buf *b)
{
    memset(b->host, 0xff, b->n * 2); /* NaN in bf16 */
    assert_int_equal(fj_memcpy_h2d(ctx, b->dev, b->host, b->n * 2), FJ_OK);
}

static void buf_free(fj_context *ctx, buf *b)
{
    fj_free(ctx, b->dev);
    free(b->host);
}

static fj_tensor bshd(void *data, int64_t b, int64_t s, int64_t h, int64_t d)
{
    fj_tensor t = {.data = data, .dtype = FJ_DTYPE_BF16, .ndim = 4};
    const int64_t shape[4] = {b, s, h, d}, stride[4] = {s * h * d, h * d, d, 1};
    memcpy(t.shape, shape, sizeof shape);
    memcpy(t.stride, stride, sizeof stride);
    return t;
}

/* One decode problem: q [b, sq, hq, d] against b sequences of sk keys, dense or in pages of
** page_size keys (page_size 0: dense), a shuffled page table. */
typedef struct problem {
    int64_t b, sq, sk, hq, hkv, d, page_size;
    int32_t splits;
    int causal;
} problem;

/* Runs p directly and from a captured graph, twice with different queries; the replays must
** equal the direct calls bit for bit, and the direct calls must be finite. */
static void check_graph(fj_context *ctx, const problem *p)
{
    const int64_t pages_per_seq = p->page_size ? (p->sk + p->page_size - 1) / p->page_size : 0;
    const int64_t num_pages = p->b * pages_per_seq + 3; /* spare pages */
    buf q, k, v, out_direct, out_graph;
    buf_random(ctx, &q, (size_t)(p->b * p->sq * p->hq * p->d));
    const size_t kv_elems = p->page_size ? (size_t)(num_pages * p->page_size * p->hkv * p->d)
                                         : (size_t)(p->b * p->sk * p->hkv * p->d);
    buf_random(ctx, &k, kv_elems);
    buf_random(ctx, &v, kv_elems);
    buf_random(ctx, &out_direct, (size_t)(p->b * p->sq * p->hq * p->d));
    buf_random(ctx, &out_graph, out_direct.n);

    fj_attention_desc desc;
    fj_attention_desc_init(&desc);
    desc.num_splits = p->splits;
    desc.causal = p->causal;
    fj_tensor table = {0}, used = {0};
    void *table_dev = NULL, *used_dev = NULL;
    fj_tensor tq = bshd(q.dev, p->b, p->sq, p->hq, p->d);
    fj_tensor tk = bshd(k.dev, p->b, p->sk, p->hkv, p->d), tv = bshd(v.dev, p->b, p->sk, p->hkv, p->d);
    if (p->page_size) {
        tk = bshd(k.dev, num_pages, p->page_size, p->hkv, p->d);
        tv = bshd(v.dev, num_pages, p->page_size, p->hkv, p->d);
        int32_t *pages = malloc((size_t)(p->b * pages_per_seq) * sizeof *pages);
        int32_t *lens = malloc((size_t)p->b * sizeof *lens);
        assert_true(pages && lens);
        for (int64_t i = 0; i < p->b * pages_per_seq; i++)
            pages[i] = (int32_t)((i * 7 + 2) % num_pages); /* 7 is prime to the counts used */
        for (int64_t i = 0; i < p->b; i++)
            lens[i] = (int32_t)(p->sk - i * 37 % p->sk);
        assert_int_equal(fj_malloc(ctx, (size_t)(p->b * pages_per_seq) * 4, &table_dev), FJ_OK);
        assert_int_equal(fj_malloc(ctx, (size_t)p->b * 4, &used_dev), FJ_OK);
        assert_int_equal(fj_memcpy_h2d(ctx, table_dev, pages, (size_t)(p->b * pages_per_seq) * 4),
                         FJ_OK);
        assert_int_equal(fj_memcpy_h2d(ctx, used_dev, lens, (size_t)p->b * 4), FJ_OK);
        free(pages);
        free(lens);
        table = (fj_tensor){.data = table_dev, .dtype = FJ_DTYPE_I32, .ndim = 2,
                            .shape = {p->b, pages_per_seq}, .stride = {pages_per_seq, 1}};
        used = (fj_tensor){.data = used_dev, .dtype = FJ_DTYPE_I32, .ndim = 1,
                           .shape = {p->b}, .stride = {1}};
        desc.page_table = &table;
        desc.seqused_k = &used;
        desc.max_seqlen_k = p->sk;
    }
    fj_tensor td = bshd(out_direct.dev, p->b, p->sq, p->hq, p->d);
    fj_tensor tg = bshd(out_graph.dev, p->b, p->sq, p->hq, p->d);

    CUstream stream = NULL;
    CU_OK(cu.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    /* The first call of the kind compiles, plans and sizes the stream's workspace. */
    assert_int_equal(fj_attention_forward(ctx, &desc, &tq, &tk, &tv, &td, NULL, stream), FJ_OK);
    CU_OK(cu.cuStreamSynchronize(stream));

    CUgraph graph = NULL;
    CUgraphExec exec = NULL;
    CU_OK(cu.cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    const fj_status captured = fj_attention_forward(ctx, &desc, &tq, &tk, &tv, &tg, NULL, stream);
    const CUresult ended = cu.cuStreamEndCapture(stream, &graph);
    if (captured != FJ_OK)
        printf("  capture: %s\n", fj_context_last_error(ctx));
    assert_int_equal(captured, FJ_OK);
    CU_OK(ended);
    CU_OK(cu.cuGraphInstantiate(&exec, graph, 0));

    fj_call_info info = {.struct_size = sizeof info};
    assert_int_equal(fj_context_last_call(ctx, &info), FJ_OK);
    for (int round = 0; round < 2; round++) {
        if (round == 1) { /* new queries: the graph reads the buffer, not a copy */
            for (size_t i = 0; i < q.n; i++)
                q.host[i] = fjr_f32_to_bf16(uniform_pm1());
            assert_int_equal(fj_memcpy_h2d(ctx, q.dev, q.host, q.n * 2), FJ_OK);
        }
        buf_poison(ctx, &out_direct);
        buf_poison(ctx, &out_graph);
        assert_int_equal(fj_attention_forward(ctx, &desc, &tq, &tk, &tv, &td, NULL, stream), FJ_OK);
        CU_OK(cu.cuGraphLaunch(exec, stream));
        CU_OK(cu.cuStreamSynchronize(stream));
        uint16_t *a = malloc(out_direct.n * 2), *g = malloc(out_direct.n * 2);
        assert_true(a && g);
        assert_int_equal(fj_memcpy_d2h(ctx, a, out_direct.dev, out_direct.n * 2), FJ_OK);
        assert_int_equal(fj_memcpy_d2h(ctx, g, out_graph.dev, out_direct.n * 2), FJ_OK);
        size_t differ = 0, bad = 0;
        for (size_t i = 0; i < out_direct.n; i++) {
            differ += a[i] != g[i];
            bad += !isfinite(fjr_bf16_to_f32(a[i]));
        }
        printf("  b %lld sq %lld sk %lld hq %lld hkv %lld d %lld page %lld splits %d causal %d"
               " round %d: %s, %zu differ, %zu not finite\n",
               (long long)p->b, (long long)p->sq, (long long)p->sk, (long long)p->hq,
               (long long)p->hkv, (long long)p->d, (long long)p->page_size, p->splits, p->causal,
               round, info.kernel_path, differ, bad);
        free(a);
        free(g);
        assert_int_equal(differ, 0);
        assert_int_equal(bad, 0);
    }
    CU_OK(cu.cuGraphExecDestroy(exec));
    CU_OK(cu.cuGraphDestroy(graph));
    CU_OK(cu.cuStreamDestroy(stream));
    fj_free(ctx, table_dev);
    fj_free(ctx, used_dev);
    buf_free(ctx, &q);
    buf_free(ctx, &k);
    buf_free(ctx, &v);
    buf_free(ctx, &out_direct);
    buf_free(ctx, &out_graph);
}

static void test_decode_graphs(void **state)
{
    fj_context *ctx = suite_context(state);
    assert_true(load_driver());
    static const problem problems[] = {
        {.b = 4, .sq = 1, .sk = 3000, .hq = 32, .hkv = 8, .d = 128, .splits = 0},
        {.b = 2, .sq = 1, .sk = 9000, .hq = 16, .hkv = 2, .d = 128, .splits = 7},
        {.b = 3, .sq = 1, .sk = 1000, .hq = 8, .hkv = 8, .d = 64, .page_size = 16},
        {.b = 2, .sq = 4, .sk = 700, .hq = 8, .hkv = 2, .d = 128, .page_size = 64, .splits = 3,
         .causal = 1},
        {.b = 2, .sq = 3, .sk = 500, .hq = 8, .hkv = 2, .d = 64, .causal = 1},
    };
    for (size_t i = 0; i < sizeof problems / sizeof problems[0]; i++)
        check_graph(ctx, &problems[i]);
}

/* A first call on a stream that is being captured cannot allocate the stream's workspace: the
** call says so (naming the cause) instead of breaking the capture with an allocation. On a
** context of its own: workspaces are kept by stream handle, and the driver hands a new stream
** the handle of one destroyed before, whose workspace the suite's context would still hold. */
static void test_first_call_in_capture_is_named(void **state)
{
    (void)suite_context(state); /* skips without a device */
    assert_true(load_driver());
    fj_context *ctx = suite_new_context();
    const int64_t b = 1, sk = 8192, hq = 8, hkv = 2, d = 128;
    buf q, k, v, out;
    buf_random(ctx, &q, (size_t)(b * hq * d));
    buf_random(ctx, &k, (size_t)(b * sk * hkv * d));
    buf_random(ctx, &v, (size_t)(b * sk * hkv * d));
    buf_random(ctx, &out, (size_t)(b * hq * d));
    fj_attention_desc desc;
    fj_attention_desc_init(&desc);
    desc.num_splits = 8; /* split states: a workspace */
    fj_tensor tq = bshd(q.dev, b, 1, hq, d), tk = bshd(k.dev, b, sk, hkv, d);
    fj_tensor tv = bshd(v.dev, b, sk, hkv, d), to = bshd(out.dev, b, 1, hq, d);
    CUstream stream = NULL;
    CU_OK(cu.cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    CU_OK(cu.cuStreamBeginCapture(stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    const fj_status st = fj_attention_forward(ctx, &desc, &tq, &tk, &tv, &to, NULL, stream);
    const char *message = fj_context_last_error(ctx);
    printf("  first call in a capture: %s: %s\n", fj_status_string(st), message);
    CUgraph graph = NULL;
    const CUresult ended = cu.cuStreamEndCapture(stream, &graph);
    assert_int_equal(st, FJ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(message, "being captured"));
    CU_OK(ended); /* nothing was queued or allocated: the capture is intact */
    CU_OK(cu.cuGraphDestroy(graph));
    /* Outside the capture the same call runs. */
    assert_int_equal(fj_attention_forward(ctx, &desc, &tq, &tk, &tv, &to, NULL, stream), FJ_OK);
    CU_OK(cu.cuStreamSynchronize(stream));
    CU_OK(cu.cuStreamDestroy(stream));
    buf_free(ctx, &q);
    buf_free(ctx, &k);
    buf_free(ctx, &v);
    buf_free(ctx, &out);
    fj_context_destroy(ctx);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode_graphs),
        cmocka_unit_test(test_first_call_in_capture_is_named),
    };
    return suite_run("graph", tests);
}
