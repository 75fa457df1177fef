/* Host-side costs of flashjit, per backend:
**   bench_host first [--backend B] [--cache PATH]   one process's first call: context creation,
**                                                   then render/compile/load or cache hit
**   bench_host overhead [--backend B]               memoised per-call host time of
**                                                   fj_attention_forward (validation, plan, lookup,
**                                                   launch), median over many calls
** --seqlen-q N (default 64) sets the query rows: 1 to 16 time a decode call; --paged P reads k
** and v as a paged cache of P-key pages (a divisor of 64) through a page table.
** bench/first_call.sh runs `first` cold and warm in fresh processes. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "flashjit.h"

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static _Noreturn void die(fj_context *ctx, fj_status st, const char *what)
{
    fprintf(stderr, "%s: %s: %s\n", what, fj_status_string(st),
            ctx ? fj_context_last_error(ctx) : fj_last_create_error());
    exit(1);
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return fprintf(stderr, "usage: bench_host first|overhead [--backend cuda|opencl] "
                               "[--cache PATH] [--seqlen-q N]\n"),
               2;
    fj_context_options o;
    fj_context_options_init(&o);
    o.cache_path = ":memory:";
    int sq = 64, page = 0;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--backend"))
            o.backend = !strcmp(argv[i + 1], "cuda") ? FJ_BACKEND_CUDA : FJ_BACKEND_OPENCL;
        else if (!strcmp(argv[i], "--cache"))
            o.cache_path = argv[i + 1];
        else if (!strcmp(argv[i], "--seqlen-q"))
            sq = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--paged"))
            page = atoi(argv[i + 1]);
    }
    if (sq < 1 || sq > 64)
        return fprintf(stderr, "bench_host: --seqlen-q takes 1 to 64\n"), 2;
    if (page < 0 || page > 64 || (page && 64 % page))
        return fprintf(stderr, "bench_host: --paged takes a divisor of 64\n"), 2;
    double t0 = now_ms();
    fj_context *ctx = NULL;
    fj_status st = fj_context_create(&o, &ctx);
    if (st != FJ_OK)
        die(NULL, st, "fj_context_create");
    double t_create = now_ms() - t0;

    /* A small problem: host costs dominate. */
    enum { B = 1, S = 64, H = 2, D = 64 };
    size_t n = (size_t)B * S * H * D, bytes = n * 2;
    unsigned short *host = malloc(bytes);
    for (size_t i = 0; i < n; i++)
        host[i] = (unsigned short)(0x3c00 + (rand() & 0x3ff)); /* f16 values in [1, 2) */
    void *q = NULL, *k = NULL, *v = NULL, *out = NULL;
    if ((st = fj_malloc(ctx, bytes, &q)) || (st = fj_malloc(ctx, bytes, &k)) ||
        (st = fj_malloc(ctx, bytes, &v)) || (st = fj_malloc(ctx, bytes, &out)))
        die(ctx, st, "fj_malloc");
    fj_memcpy_h2d(ctx, q, host, bytes);
    fj_memcpy_h2d(ctx, k, host, bytes);
    fj_memcpy_h2d(ctx, v, host, bytes);
    fj_tensor tq = {.data = q,
                    .dtype = FJ_DTYPE_F16,
                    .ndim = 4,
                    .shape = {B, S, H, D},
                    .stride = {S * H * D, H * D, D, 1}};
    fj_tensor tk = tq, tv = tq, to = tq;
    tk.data = k;
    tv.data = v;
    to.data = out;
    tq.shape[1] = to.shape[1] = sq; /* the first sq rows */
    fj_attention_desc desc;
    fj_attention_desc_init(&desc);
    desc.causal = 1;
    /* Paged: the same keys as S / page pages of one sequence, in order. */
    int32_t table[S], used[B] = {S};
    void *dtable = NULL, *dused = NULL;
    fj_tensor ttable = {.dtype = FJ_DTYPE_I32, .ndim = 2}, tused = ttable;
    if (page) {
        for (int i = 0; i < S / page; i++)
            table[i] = i;
        if ((st = fj_malloc(ctx, sizeof table, &dtable)) || (st = fj_malloc(ctx, sizeof used, &dused)))
            die(ctx, st, "fj_malloc");
        fj_memcpy_h2d(ctx, dtable, table, sizeof table);
        fj_memcpy_h2d(ctx, dused, used, sizeof used);
        ttable.data = dtable;
        ttable.shape[0] = B;
        ttable.shape[1] = S / page;
        ttable.stride[0] = S / page;
        ttable.stride[1] = 1;
        tused.data = dused;
        tused.ndim = 1;
        tused.shape[0] = B;
        tused.stride[0] = 1;
        fj_tensor *kv[2] = {&tk, &tv};
        for (int i = 0; i < 2; i++) {
            kv[i]->shape[0] = B * S / page;
            kv[i]->shape[1] = page;
            kv[i]->stride[0] = (int64_t)page * H * D;
        }
        desc.page_table = &ttable;
        desc.seqused_k = &tused;
    }

    t0 = now_ms();
    st = fj_attention_forward(ctx, &desc, &tq, &tk, &tv, &to, NULL, NULL);
    if (st == FJ_OK)
        st = fj_synchronize(ctx, NULL);
    double t_first = now_ms() - t0;
    if (st != FJ_OK)
        die(ctx, st, "first call");
    fj_call_info info = {.struct_size = sizeof info};
    fj_context_last_call(ctx, &info);

    if (!strcmp(argv[1], "first")) {
        static const char *src[] = {"none", "memory", "user cache", "shipped cache", "compiled"};
        printf("first call: %s; context %.1f ms, call %.1f ms (lookup %.2f, render %.2f, "
               "compile %.1f, load %.2f)\n",
               src[info.source], t_create, t_first, info.lookup_ms, info.render_ms, info.compile_ms,
               info.load_ms);
    } else {
        enum { CALLS = 20000, BATCH = 50 };
        static double times[CALLS];
        for (int i = 0; i < CALLS; i++) {
            double a = now_ms();
            st = fj_attention_forward(ctx, &desc, &tq, &tk, &tv, &to, NULL, NULL);
            times[i] = (now_ms() - a) * 1e3;
            if (st != FJ_OK)
                die(ctx, st, "call");
            if (i % BATCH == BATCH - 1)
                fj_synchronize(ctx, NULL); /* keep the queue short; not timed */
        }
        qsort(times, CALLS, sizeof times[0], cmp);
        printf("memoised call, host time: median %.2f us, p10 %.2f us, p90 %.2f us (%d calls)\n",
               times[CALLS / 2], times[CALLS / 10], times[CALLS * 9 / 10], CALLS);
    }
    fj_free(ctx, q);
    fj_free(ctx, k);
    fj_free(ctx, v);
    fj_free(ctx, out);
    fj_free(ctx, dtable);
    fj_free(ctx, dused);
    free(host);
    fj_context_destroy(ctx);
    return 0;
}
