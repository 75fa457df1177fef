/* Getting a kernel for a variant: memory first, then the user cache, then shipped caches, else
** render the template, compile, load and store the binary in the user cache. */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "context.h"

const char *fj__compile_options(fj_backend_kind backend)
{
    /* Strict IEEE float (no fast-math): the SIMT kernels' accuracy relies on it. */
    return backend == FJ_BACKEND_OPENCL ? "-cl-std=CL1.2" : "";
}

/* With $FLASHJIT_DUMP=DIR, writes DIR/<hash>.src, .opts, .log and .key so that any compile can
** be reproduced by hand. Best effort: a dump that fails is ignored. */
static void dump_compile(const char *key_hash, const char *key_text, const char *source,
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

fj_status fj__compile_job_key(fj__compile_job *job)
{
    job->status = fj__variant_key(&job->variant, job->target, job->template_hash, &job->key_text,
                                  job->key_hash, &job->err);
    return job->status;
}

void fj__compile_job_run(fj__compile_job *job)
{
    const char *options = fj__compile_options(job->backend);
    char *source = NULL;
    double t0 = fj__now_ms();
    job->status =
        fj__variant_render(&job->variant, job->template_dir, job->key_text, &source, &job->err);
    double t1 = fj__now_ms();
    job->render_ms = t1 - t0;
    if (job->status == FJ_OK) {
        job->status =
            job->compile(job->compile_ud, source, options, &job->binary, &job->log, &job->err);
        job->compile_ms = fj__now_ms() - t1;
        dump_compile(job->key_hash, job->key_text, source, options, job->log);
    }
    free(source);
}

void fj__compile_job_clear(fj__compile_job *job)
{
    FJ_FREE(job->key_text);
    FJ_FREE(job->binary.data);
    FJ_FREE(job->log);
}

/* The context's backend as a compile function (thread-safe: it reports into the job's err). */
static fj_status backend_compile(void *ud, const char *source, const char *options,
                                 fj__blob *binary, char **log, fj__err *err)
{
    const fj_context *ctx = ud;
    return ctx->ops->compile(ctx->backend, source, options, binary, log, err);
}

/* A compile job for v on ctx's backend, its key computed. */
static fj_status job_for(fj_context *ctx, const fj__variant *v, fj__compile_job *job)
{
    memset(job, 0, sizeof *job);
    job->variant = *v;
    job->target = ctx->ops->target(ctx->backend);
    job->template_dir = ctx->template_dir;
    job->template_hash = ctx->template_hash;
    job->backend = ctx->ops->kind;
    job->compile = backend_compile;
    job->compile_ud = ctx;
    return fj__compile_job_key(job);
}

/* Adds what getting one kernel cost to the call's report; the report's source is the costliest
** of the call's kernels. */
static void report(fj_context *ctx, fj_kernel_source source, double lookup_ms, double render_ms,
                   double compile_ms, double load_ms)
{
    fj_call_info *info = &ctx->last_call;
    if (source > info->source)
        info->source = source;
    info->lookup_ms += lookup_ms;
    info->render_ms += render_ms;
    info->compile_ms += compile_ms;
    info->load_ms += load_ms;
}

/* Loads binary, the kernel of v, into k and reads its resources once (a call reports them
** without asking the driver again). */
static fj_status load_binary(fj_context *ctx, const fj__variant *v, fj__kernel *k,
                             const void *binary, size_t size)
{
    fj_status st = ctx->ops->load(ctx->backend, binary, size, fj__variant_entry(v), &k->handle);
    if (st == FJ_OK && ctx->ops->kernel_info)
        ctx->ops->kernel_info(ctx->backend, k->handle, &k->registers, &k->spill_bytes);
    return st;
}

/* Loads the keyed job's kernel from the user or a shipped cache into k. Returns 1 when it did;
** a binary that fails to load (another driver, say) is a miss, and a user-cache row is dropped
** so the rebuild replaces it. */
static int load_cached(fj_context *ctx, const fj__compile_job *job, fj__kernel *k)
{
    void *bin = NULL;
    size_t size = 0;
    double t0 = fj__now_ms();
    cache_origin origin =
        cache_get_kernel(ctx->cache, job->key_hash, job->key_text, &bin, &size, &ctx->err);
    double t1 = fj__now_ms();
    if (origin == CACHE_MISS) {
        report(ctx, FJ_KERNEL_NONE, t1 - t0, 0, 0, 0);
        return 0;
    }
    fj__err scratch = ctx->err;
    fj_status st = load_binary(ctx, &job->variant, k, bin, size);
    free(bin);
    if (st != FJ_OK) {
        ctx->err = scratch; /* not the caller's problem: the kernel is rebuilt */
        if (origin == CACHE_USER)
            cache_forget_kernel(ctx->cache, job->key_hash);
        report(ctx, FJ_KERNEL_NONE, fj__now_ms() - t0, 0, 0, 0);
        return 0;
    }
    report(ctx, origin == CACHE_USER ? FJ_KERNEL_USER_CACHE : FJ_KERNEL_SHIPPED_CACHE, t1 - t0, 0,
           0, fj__now_ms() - t1);
    fj__log_info("%s %.12s from the %s cache in %.1f ms", fj__variant_path(&job->variant),
                 job->key_hash, origin == CACHE_USER ? "user" : "shipped", fj__now_ms() - t0);
    return 1;
}

/* Loads a compiled job's binary into k and stores it in the user cache. */
static fj_status finish_compile(fj_context *ctx, fj__compile_job *job, fj__kernel *k)
{
    fj_status st = job->status;
    if (st != FJ_OK) {
        memcpy(ctx->err.msg, job->err.msg, sizeof ctx->err.msg);
        return st;
    }
    ctx->compiles++;
    double t0 = fj__now_ms();
    st = load_binary(ctx, &job->variant, k, job->binary.data, job->binary.size);
    report(ctx, FJ_KERNEL_COMPILED, 0, job->render_ms, job->compile_ms, fj__now_ms() - t0);
    fj__log_info("%s %.12s compiled (in no cache): render %.1f ms, compile %.1f ms, load %.1f ms; "
                 "%d registers, %d bytes spilled",
                 fj__variant_path(&job->variant), job->key_hash, job->render_ms, job->compile_ms,
                 fj__now_ms() - t0, k->registers, k->spill_bytes);
    if (st == FJ_OK)
        cache_put_kernel(ctx->cache, job->key_hash, ctx->ops->name,
                         ctx->ops->compiler(ctx->backend), ctx->device.name, job->key_text,
                         job->binary.data, job->binary.size, job->compile_ms, job->log, &ctx->err);
    return st;
}

/* The kernel of v if this context has loaded it, else NULL. */
static fj__kernel *find_loaded(fj_context *ctx, const fj__variant *v)
{
    /* The kernel of the previous lookup first (the common case of a training loop). */
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

/* Keeps a loaded kernel in the table (reserved before); the job's key moves into it. */
static const fj__kernel *keep(fj_context *ctx, fj__kernel *k, fj__compile_job *job)
{
    k->variant = job->variant;
    k->key_text = job->key_text;
    job->key_text = NULL;
    memcpy(k->key_hash, job->key_hash, sizeof k->key_hash);
    ctx->kernels[ctx->nkernels] = *k;
    ctx->last_used = ctx->nkernels++;
    return &ctx->kernels[ctx->last_used];
}

fj_status fj__kernel_get(fj_context *ctx, const fj__variant *v, const fj__kernel **out)
{
    if ((*out = find_loaded(ctx, v))) {
        report(ctx, FJ_KERNEL_MEMORY, 0, 0, 0, 0);
        return FJ_OK;
    }
    double t0 = fj__now_ms();
    fj_status st = reserve(ctx, 1);
    fj__compile_job job;
    if (st == FJ_OK)
        st = job_for(ctx, v, &job);
    else
        memset(&job, 0, sizeof job);
    report(ctx, FJ_KERNEL_NONE, fj__now_ms() - t0, 0, 0, 0);
    fj__kernel k = {0};
    if (st == FJ_OK && !load_cached(ctx, &job, &k)) {
        fj__compile_job_run(&job);
        st = finish_compile(ctx, &job, &k);
    }
    if (st == FJ_OK)
        *out = keep(ctx, &k, &job);
    fj__compile_job_clear(&job);
    return st;
}

/* A pool of threads working through compile jobs. */
typedef struct job_queue {
    fj__compile_job *jobs;
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
        fj__compile_job_run(&q->jobs[i]);
    }
}

/* Runs the jobs on up to 8 threads (NVRTC and OpenCL compilers are thread-safe). */
static void run_jobs(fj__compile_job *jobs, int n)
{
    job_queue q = {.jobs = jobs, .n = n};
    pthread_mutex_init(&q.lock, NULL);
    pthread_t threads[8];
    int nthreads = 0;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int want = n < 8 ? n : 8;
    if (cpus > 0 && want > cpus)
        want = (int)cpus;
    for (; nthreads < want; nthreads++)
        if (pthread_create(&threads[nthreads], NULL, compile_worker, &q) != 0)
            break;
    compile_worker(&q); /* the calling thread works too (and alone if no thread started) */
    for (int t = 0; t < nthreads; t++)
        pthread_join(threads[t], NULL);
    pthread_mutex_destroy(&q.lock);
}

int32_t fj__kernel_spills(fj_context *ctx, const fj__variant *v)
{
    const fj__kernel *k = NULL;
    return fj__kernel_get(ctx, v, &k) == FJ_OK ? k->spill_bytes : 0;
}

fj_status fj__kernels_prepare(fj_context *ctx, const fj__variant *vs, int n, fj_status *status,
                              char (*why)[160])
{
    fj_status st = reserve(ctx, (size_t)n);
    if (st != FJ_OK)
        return st;
    fj__compile_job *jobs = calloc((size_t)n, sizeof *jobs);
    int *index = calloc((size_t)n, sizeof *index);
    if (!jobs || !index) {
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
        fj__compile_job *job = &jobs[njobs];
        fj__kernel k = {0};
        status[i] = job_for(ctx, &vs[i], job);
        if (status[i] == FJ_OK && !load_cached(ctx, job, &k)) {
            index[njobs++] = i; /* compiled below */
            continue;
        }
        if (status[i] == FJ_OK)
            keep(ctx, &k, job);
        fj__compile_job_clear(job); /* the slot serves the next job */
    }
    run_jobs(jobs, njobs);
    for (int j = 0; j < njobs; j++) {
        int i = index[j];
        fj__kernel k = {0};
        status[i] = finish_compile(ctx, &jobs[j], &k);
        if (status[i] == FJ_OK)
            keep(ctx, &k, &jobs[j]);
        fj__compile_job_clear(&jobs[j]);
    }
    for (int i = 0; i < n; i++)
        if (status[i] != FJ_OK)
            snprintf(why[i], 160, "%s: %.140s", fj_status_string(status[i]), ctx->err.msg);
    free(jobs);
    free(index);
    return FJ_OK;
}

fj_status fj__plans_prepare(fj_context *ctx, const fj__plan *plans, int n, fj_status *status,
                            char (*why)[160])
{
    const size_t most = (size_t)n * FJ__MAX_STEPS;
    fj__variant *all = calloc(most, sizeof *all);
    /* plan i's kernels: all[uses[i * FJ__MAX_STEPS + u]], u < count[i] */
    int *uses = calloc(most, sizeof *uses);
    fj_status *st_all = calloc(most, sizeof *st_all);
    char(*why_all)[160] = calloc(most, sizeof *why_all);
    int *count = calloc((size_t)n, sizeof *count);
    fj_status st = all && uses && st_all && why_all && count
                       ? FJ_OK
                       : fj__fail(&ctx->err, FJ_ERR_OUT_OF_MEMORY, "out of memory for kernels");
    int m = 0;
    for (int i = 0; i < n && st == FJ_OK; i++) {
        if (status[i] != FJ_OK)
            continue;
        why[i][0] = '\0';
        for (int s = 0; s < plans[i].nsteps; s++) {
            if (plans[i].steps[s].kind != FJ__STEP_KERNEL)
                continue;
            int j = 0;
            while (j < m && memcmp(&all[j], &plans[i].steps[s].variant, sizeof all[j]))
                j++;
            if (j == m)
                all[m++] = plans[i].steps[s].variant;
            uses[i * FJ__MAX_STEPS + count[i]++] = j;
        }
    }
    if (st == FJ_OK)
        st = fj__kernels_prepare(ctx, all, m, st_all, why_all);
    for (int i = 0; i < n && st == FJ_OK; i++)
        for (int u = 0; u < count[i] && status[i] == FJ_OK; u++) {
            const int j = uses[i * FJ__MAX_STEPS + u];
            status[i] = st_all[j];
            snprintf(why[i], 160, "%s", why_all[j]);
        }
    free(all);
    free(uses);
    free(st_all);
    free(why_all);
    free(count);
    return st;
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
