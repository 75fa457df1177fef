/* Getting a kernel for a variant: memory first, then the user cache, then shipped caches, else
** render the template, compile, load and store the binary in the user cache. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <pthread.h>
#include <unistd.h>

#include "variant.h"

const char *fj__compile_options(fj_backend_kind backend)
{
    /* Strict IEEE float (no fast-math): the SIMT kernels' accuracy relies on it. */
    return backend == FJ_BACKEND_OPENCL ? "-cl-std=CL1.2" : "";
}

fj_status fj__variant_key(const fj__variant *v, const char *target, const char *template_hash,
                          char **text, char hash[65], fj__err *err)
{
    size_t len = fj__variant_key_text(v, target, template_hash, NULL, 0);
    *text = malloc(len + 1);
    if (!*text)
        return fj__fail(err, FJ_ERR_OUT_OF_MEMORY, "out of memory for a variant key");
    fj__variant_key_text(v, target, template_hash, *text, len + 1);
    fj__sha256_hex(*text, len, hash);
    return FJ_OK;
}

fj_status fj__variant_render(const fj__variant *v, const char *key_text, char **source,
                             fj__err *err)
{
    tpl_param params[FJ__MAX_PARAMS];
    int n = fj__variant_params(v, params);
    return tpl_render(fj__variant_template(v), params, n, key_text, source, err);
}

/* With $FLASHJIT_DUMP=DIR, writes DIR/<hash>.src, .opts and .log so that any compile can be
** reproduced by hand. Best effort: a dump that fails is ignored. */
void fj__dump_compile(const char *key_hash, const char *key_text, const char *source,
                      const char *options, const char *log)
{
    const char *dir = getenv("FLASHJIT_DUMP");
    if (!dir || !dir[0])
        return;
    mkdir(dir, 0777);
    const char *parts[][2] = {{"src", source}, {"opts", options}, {"log", log}, {"key", key_text}};
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%.16s.%s", dir, key_hash, parts[i][0]);
        FILE *f = fopen(path, "w");
        if (!f)
            continue;
        if (parts[i][1])
            fputs(parts[i][1], f);
        fclose(f);
    }
}

/* Loads binary into k and reads its resources once (a call reports them without asking the
** driver again). */
static fj_status load_binary(fj_context *ctx, fj__kernel *k, const void *binary, size_t size)
{
    fj_status st =
        ctx->ops->load(ctx->backend, binary, size, fj__variant_entry(&k->variant), &k->handle);
    if (st == FJ_OK && ctx->ops->kernel_info)
        ctx->ops->kernel_info(ctx->backend, k->handle, &k->registers, &k->spill_bytes);
    return st;
}

/* Loads k from the user or a shipped cache. Returns 1 when it did; a binary that fails to load
** (another driver, say) is a miss, and a user-cache row is dropped so the rebuild replaces it. */
static int load_cached(fj_context *ctx, fj__kernel *k)
{
    void *bin = NULL;
    size_t size = 0;
    cache_origin origin =
        cache_get_kernel(ctx->cache, k->key_hash, k->key_text, &bin, &size, &ctx->err);
    if (origin == CACHE_MISS)
        return 0;
    double t0 = fj__now_ms();
    fj__err scratch = ctx->err;
    fj_status st = load_binary(ctx, k, bin, size);
    free(bin);
    if (st != FJ_OK) {
        ctx->err = scratch; /* not the caller's problem: the kernel is rebuilt */
        if (origin == CACHE_USER)
            cache_forget_kernel(ctx->cache, k->key_hash);
        return 0;
    }
    ctx->last_call.load_ms = fj__now_ms() - t0;
    ctx->last_call.source = origin == CACHE_USER ? FJ_KERNEL_USER_CACHE : FJ_KERNEL_SHIPPED_CACHE;
    return 1;
}

/* One render + compile, touching nothing of the context but its backend's compile, which is
** thread-safe: several run at once when the tuner builds candidates. */
typedef struct compile_job {
    const fj_context *ctx;
    fj__kernel *k;
    fj__blob bin;
    char *log;
    double render_ms, compile_ms;
    fj_status status;
    fj__err err;
} compile_job;

static void run_compile(compile_job *job)
{
    const fj_context *ctx = job->ctx;
    const char *options = fj__compile_options(ctx->ops->kind);
    char *source = NULL;
    double t0 = fj__now_ms();
    job->status = fj__variant_render(&job->k->variant, job->k->key_text, &source, &job->err);
    double t1 = fj__now_ms();
    job->render_ms = t1 - t0;
    if (job->status == FJ_OK) {
        job->status =
            ctx->ops->compile(ctx->backend, source, options, &job->bin, &job->log, &job->err);
        job->compile_ms = fj__now_ms() - t1;
        fj__dump_compile(job->k->key_hash, job->k->key_text, source, options, job->log);
    }
    free(source);
}

/* Loads a compiled job's binary into k and stores it in the user cache. */
static fj_status finish_compile(fj_context *ctx, compile_job *job)
{
    fj_call_info *info = &ctx->last_call;
    fj__kernel *k = job->k;
    info->render_ms = job->render_ms;
    info->compile_ms = job->compile_ms;
    fj_status st = job->status;
    if (st != FJ_OK) {
        memcpy(ctx->err.msg, job->err.msg, sizeof ctx->err.msg);
    } else {
        ctx->compiles++;
        double t0 = fj__now_ms();
        st = load_binary(ctx, k, job->bin.data, job->bin.size);
        info->load_ms = fj__now_ms() - t0;
        info->source = FJ_KERNEL_COMPILED;
        if (st == FJ_OK)
            cache_put_kernel(ctx->cache, k->key_hash, ctx->ops->name,
                             ctx->ops->compiler(ctx->backend), ctx->device.name, k->key_text,
                             job->bin.data, job->bin.size, job->compile_ms, job->log, &ctx->err);
    }
    FJ_FREE(job->bin.data);
    FJ_FREE(job->log);
    return st;
}

/* The kernel of v if this context has loaded it, else NULL. */
static fj__kernel *find_loaded(fj_context *ctx, const fj__variant *v)
{
    /* The kernel of the previous call first (the common case of a training loop). */
    if (ctx->nkernels > ctx->last_used &&
        memcmp(&ctx->kernels[ctx->last_used].variant, v, sizeof *v) == 0)
        return &ctx->kernels[ctx->last_used];
    for (size_t i = 0; i < ctx->nkernels; i++)
        if (memcmp(&ctx->kernels[i].variant, v, sizeof *v) == 0) {
            ctx->last_used = i;
            return &ctx->kernels[i];
        }
    return NULL;
}

static fj_status reserve(fj_context *ctx, size_t more)
{
    if (ctx->nkernels + more <= ctx->capacity)
        return FJ_OK;
    size_t cap = ctx->capacity ? ctx->capacity : 16;
    while (cap < ctx->nkernels + more)
        cap *= 2;
    fj__kernel *grown = realloc(ctx->kernels, cap * sizeof *grown);
    if (!grown)
        return fj__fail(&ctx->err, FJ_ERR_OUT_OF_MEMORY, "out of memory for the kernel table");
    ctx->kernels = grown;
    ctx->capacity = cap;
    return FJ_OK;
}

/* Keys k and loads it from a cache; *cached says whether that worked. */
static fj_status key_and_lookup(fj_context *ctx, const fj__variant *v, fj__kernel *k, int *cached)
{
    memset(k, 0, sizeof *k);
    k->variant = *v;
    fj_status st = fj__variant_key(v, ctx->ops->target(ctx->backend), ctx->template_hash,
                                   &k->key_text, k->key_hash, &ctx->err);
    *cached = st == FJ_OK && load_cached(ctx, k);
    return st;
}

fj_status fj__kernel_get(fj_context *ctx, const fj__variant *v, const fj__kernel **out)
{
    fj_call_info *info = &ctx->last_call;
    double t0 = fj__now_ms();
    if ((*out = find_loaded(ctx, v))) {
        info->source = FJ_KERNEL_MEMORY;
        return FJ_OK;
    }
    fj_status st = reserve(ctx, 1);
    if (st != FJ_OK)
        return st;
    fj__kernel k;
    int cached = 0;
    st = key_and_lookup(ctx, v, &k, &cached);
    info->lookup_ms = fj__now_ms() - t0 - info->load_ms;
    if (st == FJ_OK && !cached) {
        compile_job job = {.ctx = ctx, .k = &k};
        run_compile(&job);
        st = finish_compile(ctx, &job);
    }
    if (st != FJ_OK) {
        FJ_FREE(k.key_text);
        return st;
    }
    ctx->kernels[ctx->nkernels] = k;
    ctx->last_used = ctx->nkernels++;
    *out = &ctx->kernels[ctx->last_used];
    return FJ_OK;
}

/* A pool of threads working through compile jobs. */
typedef struct job_queue {
    compile_job *jobs;
    int n;
    int next;
    pthread_mutex_t lock;
} job_queue;

static void *compile_worker(void *arg)
{
    job_queue *q = arg;
    for (;;) {
        pthread_mutex_lock(&q->lock);
        int i = q->next < q->n ? q->next++ : -1;
        pthread_mutex_unlock(&q->lock);
        if (i < 0)
            return NULL;
        run_compile(&q->jobs[i]);
    }
}

fj_status fj__kernels_prepare(fj_context *ctx, const fj__variant *vs, int n, fj_status *status,
                              char (*why)[160])
{
    fj_status st = reserve(ctx, (size_t)n);
    if (st != FJ_OK)
        return st;
    fj__kernel *pending = calloc((size_t)n, sizeof *pending);
    compile_job *jobs = calloc((size_t)n, sizeof *jobs);
    int *index = calloc((size_t)n, sizeof *index);
    if (!pending || !jobs || !index) {
        free(pending);
        free(jobs);
        free(index);
        return fj__fail(&ctx->err, FJ_ERR_OUT_OF_MEMORY, "out of memory for compile jobs");
    }
    int njobs = 0;
    for (int i = 0; i < n; i++) {
        status[i] = FJ_OK;
        why[i][0] = '\0';
        if (find_loaded(ctx, &vs[i]))
            continue;
        int cached = 0;
        status[i] = key_and_lookup(ctx, &vs[i], &pending[i], &cached);
        if (status[i] == FJ_OK && cached) {
            ctx->kernels[ctx->nkernels++] = pending[i];
        } else if (status[i] == FJ_OK) {
            jobs[njobs] = (compile_job){.ctx = ctx, .k = &pending[i]};
            index[njobs++] = i;
        }
    }
    /* NVRTC and OpenCL compilers are thread-safe: compile on up to 8 threads. */
    job_queue q = {.jobs = jobs, .n = njobs};
    pthread_mutex_init(&q.lock, NULL);
    pthread_t threads[8];
    int nthreads = 0;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int want = njobs < 8 ? njobs : 8;
    if (cpus > 0 && want > cpus)
        want = (int)cpus;
    for (; nthreads < want; nthreads++)
        if (pthread_create(&threads[nthreads], NULL, compile_worker, &q) != 0)
            break;
    compile_worker(&q); /* the calling thread works too (and alone if no thread started) */
    for (int t = 0; t < nthreads; t++)
        pthread_join(threads[t], NULL);
    pthread_mutex_destroy(&q.lock);

    for (int j = 0; j < njobs; j++) {
        int i = index[j];
        status[i] = finish_compile(ctx, &jobs[j]);
        if (status[i] == FJ_OK)
            ctx->kernels[ctx->nkernels++] = pending[i];
        else
            FJ_FREE(pending[i].key_text);
    }
    for (int i = 0; i < n; i++)
        if (status[i] != FJ_OK)
            snprintf(why[i], 160, "%s: %.140s", fj_status_string(status[i]), ctx->err.msg);
    free(pending);
    free(jobs);
    free(index);
    return FJ_OK;
}

void fj__kernels_release(fj_context *ctx)
{
    for (size_t i = 0; i < ctx->nkernels; i++) {
        ctx->ops->unload(ctx->backend, ctx->kernels[i].handle);
        FJ_FREE(ctx->kernels[i].key_text);
    }
    FJ_FREE(ctx->kernels);
    ctx->nkernels = ctx->capacity = ctx->last_used = 0;
}
