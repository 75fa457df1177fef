/* Getting a kernel for a variant: memory first, then the user cache, then shipped caches, else
** render the template, compile, load and store the binary in the user cache. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

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
    fj_status st =
        ctx->ops->load(ctx->backend, bin, size, fj__variant_entry(&k->variant), &k->handle);
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

/* Renders and compiles k's variant, then loads the binary. */
static fj_status build(fj_context *ctx, fj__kernel *k)
{
    fj_call_info *info = &ctx->last_call;
    char *source = NULL, *log = NULL;
    fj__blob bin = {0};
    const char *options = fj__compile_options(ctx->ops->kind);

    double t0 = fj__now_ms();
    fj_status st = fj__variant_render(&k->variant, k->key_text, &source, &ctx->err);
    double t1 = fj__now_ms();
    info->render_ms = t1 - t0;
    if (st != FJ_OK)
        goto out;
    st = ctx->ops->compile(ctx->backend, source, options, &bin, &log);
    double t2 = fj__now_ms();
    info->compile_ms = t2 - t1;
    fj__dump_compile(k->key_hash, k->key_text, source, options, log);
    if (st != FJ_OK)
        goto out;
    ctx->compiles++;
    st = ctx->ops->load(ctx->backend, bin.data, bin.size, fj__variant_entry(&k->variant),
                        &k->handle);
    info->load_ms = fj__now_ms() - t2;
    info->source = FJ_KERNEL_COMPILED;
    if (st == FJ_OK)
        cache_put_kernel(ctx->cache, k->key_hash, ctx->ops->name, ctx->ops->compiler(ctx->backend),
                         ctx->device.name, k->key_text, bin.data, bin.size, info->compile_ms, log,
                         &ctx->err);
out:
    free(source);
    free(log);
    free(bin.data);
    return st;
}

fj_status fj__kernel_get(fj_context *ctx, const fj__variant *v, const fj__kernel **out)
{
    fj_call_info *info = &ctx->last_call;
    double t0 = fj__now_ms();
    /* Memoised: the kernel of the previous call first (the common case of a training loop),
    ** then the others. */
    if (ctx->nkernels > ctx->last_used &&
        memcmp(&ctx->kernels[ctx->last_used].variant, v, sizeof *v) == 0) {
        *out = &ctx->kernels[ctx->last_used];
        info->source = FJ_KERNEL_MEMORY;
        return FJ_OK;
    }
    for (size_t i = 0; i < ctx->nkernels; i++)
        if (memcmp(&ctx->kernels[i].variant, v, sizeof *v) == 0) {
            ctx->last_used = i;
            *out = &ctx->kernels[i];
            info->source = FJ_KERNEL_MEMORY;
            info->lookup_ms = fj__now_ms() - t0;
            return FJ_OK;
        }

    if (ctx->nkernels == ctx->capacity) {
        size_t cap = ctx->capacity ? 2 * ctx->capacity : 16;
        fj__kernel *grown = realloc(ctx->kernels, cap * sizeof *grown);
        if (!grown)
            return fj__fail(&ctx->err, FJ_ERR_OUT_OF_MEMORY, "out of memory for the kernel table");
        ctx->kernels = grown;
        ctx->capacity = cap;
    }
    fj__kernel k = {.variant = *v};
    fj_status st = fj__variant_key(v, ctx->ops->target(ctx->backend), ctx->template_hash,
                                   &k.key_text, k.key_hash, &ctx->err);
    int cached = st == FJ_OK && load_cached(ctx, &k);
    info->lookup_ms = fj__now_ms() - t0 - info->load_ms;
    if (st == FJ_OK && !cached)
        st = build(ctx, &k);
    if (st != FJ_OK) {
        FJ_FREE(k.key_text);
        return st;
    }
    ctx->kernels[ctx->nkernels] = k;
    ctx->last_used = ctx->nkernels++;
    *out = &ctx->kernels[ctx->last_used];
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
