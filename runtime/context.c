/* Contexts, devices and memory: the public entry points that are not attention itself. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <string.h>

#include "context.h"
#include "../templates/render.h"

static _Thread_local fj__err create_err;

/* The backends, in the order FJ_BACKEND_AUTO tries them. */
static const struct fj_backend_ops *const backends[] = {
    &fj__cuda_backend,
    &fj__opencl_backend,
};

static const struct fj_backend_ops *find_backend(fj_backend_kind kind)
{
    for (size_t i = 0; i < sizeof backends / sizeof backends[0]; i++)
        if (backends[i]->kind == kind)
            return backends[i];
    return NULL;
}

#define FJ__MAX_TRUSTED_KEYS 16

void fj_context_options_init(fj_context_options *opts)
{
    if (!opts)
        return;
    memset(opts, 0, sizeof *opts);
    opts->struct_size = sizeof *opts;
    opts->backend = FJ_BACKEND_AUTO;
}

void fj_attention_desc_init(fj_attention_desc *desc)
{
    if (!desc)
        return;
    memset(desc, 0, sizeof *desc);
    desc->struct_size = sizeof *desc;
    desc->window_left = -1;
    desc->window_right = -1;
}

const char *fj_last_create_error(void)
{
    return create_err.msg;
}

const char *fj_context_last_error(const fj_context *ctx)
{
    return ctx ? ctx->err.msg : "ctx is NULL";
}

void fj__begin_call(fj_context *ctx)
{
    ctx->err.msg[0] = '\0';
    memset(&ctx->last_call, 0, sizeof ctx->last_call);
    ctx->last_call.struct_size = sizeof ctx->last_call;
    ctx->nlaunches = 0;
}

void fj__note_launch(fj_context *ctx, const char *what)
{
    const int max = (int)(sizeof ctx->launches / sizeof ctx->launches[0]);
    if (ctx->nlaunches < max)
        ctx->launches[ctx->nlaunches] = what;
    ctx->nlaunches++; /* (counted past the list: tuning runs plan after plan) */
}

/* ctx's launches joined by "," into its text (a list cut short ends in ",..."). */
static const char *launched_text(fj_context *ctx)
{
    const int max = (int)(sizeof ctx->launches / sizeof ctx->launches[0]);
    const size_t size = sizeof ctx->launched, tail = sizeof ",...";
    size_t used = 0;
    int cut = 0;
    ctx->launched[0] = '\0';
    for (int i = 0; i < ctx->nlaunches && i < max && !cut; i++) {
        const int n = snprintf(ctx->launched + used, size - tail - used, "%s%s", i ? "," : "",
                               ctx->launches[i]);
        if (n < 0 || (size_t)n >= size - tail - used) {
            ctx->launched[used] = '\0';
            cut = 1;
        } else {
            used += (size_t)n;
        }
    }
    if (cut || ctx->nlaunches > max)
        memcpy(ctx->launched + used, used ? ",..." : "...", used ? tail : tail - 1);
    return ctx->launched;
}

const char *fj_context_cache_path(const fj_context *ctx)
{
    if (!ctx)
        return "";
    return cache_user_db(ctx->cache) ? ctx->cache_path : ":memory:";
}

/* The first-version size of fj_context_options: the smallest struct_size accepted. */
#define FJ__OPTIONS_V1_SIZE (offsetof(fj_context_options, cache_path) + sizeof(const char *))

char *fj__default_cache_path(void)
{
    const char *env = getenv("FLASHJIT_CACHE");
    if (env && env[0])
        return fj__strdup(env);
    char buf[4096];
    const char *xdg = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    if (xdg && xdg[0])
        snprintf(buf, sizeof buf, "%s/flashjit/kernels.db", xdg);
    else if (home && home[0])
        snprintf(buf, sizeof buf, "%s/.cache/flashjit/kernels.db", home);
    else
        snprintf(buf, sizeof buf, ":memory:");
    return fj__strdup(buf);
}

fj_status fj_context_create(const fj_context_options *opts, fj_context **out)
{
    fj__err *err = &create_err;
    err->msg[0] = '\0';
    if (!out)
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT, "out is NULL");
    *out = NULL;
    fj_context_options o;
    fj_context_options_init(&o);
    if (opts) {
#define END(f) FJ__FIELD_END(fj_context_options, f)
        static const size_t ends[] = {END(cache_path), END(shipped_caches), END(cache_readonly),
                                      END(tune), END(trusted_keys), END(allocator)};
#undef END
        if (opts->struct_size < FJ__OPTIONS_V1_SIZE || opts->struct_size > sizeof o ||
            !fj__size_on_field_end(opts->struct_size, ends, (int)(sizeof ends / sizeof ends[0]),
                                   sizeof o))
            return fj__fail(err, FJ_ERR_INVALID_ARGUMENT,
                            "opts.struct_size = %zu is not the size of a released "
                            "fj_context_options (%zu to %zu, ending on a field; call "
                            "fj_context_options_init)",
                            opts->struct_size, (size_t)FJ__OPTIONS_V1_SIZE, sizeof o);
        memcpy(&o, opts, opts->struct_size);
    }
    if (o.backend != FJ_BACKEND_AUTO && o.backend != FJ_BACKEND_CUDA &&
        o.backend != FJ_BACKEND_OPENCL)
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT, "opts.backend = %d is not an fj_backend_kind",
                        (int)o.backend);
    if (o.device < 0)
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT, "opts.device = %d is negative",
                        (int)o.device);
    if (o.cache_readonly != 0 && o.cache_readonly != 1)
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT, "opts.cache_readonly = %d, expected 0 or 1",
                        (int)o.cache_readonly);
    for (const char *const *p = o.shipped_caches; p && *p; p++)
        if (!(*p)[0])
            return fj__fail(err, FJ_ERR_INVALID_ARGUMENT, "opts.shipped_caches[%d] is empty",
                            (int)(p - o.shipped_caches));
    fj__public_key trusted[FJ__MAX_TRUSTED_KEYS];
    int ntrusted = 0;
    for (const char *const *p = o.trusted_keys; p && *p; p++, ntrusted++)
        if (ntrusted == FJ__MAX_TRUSTED_KEYS ||
            fj__hex_decode(*p, trusted[ntrusted].bytes, 32) != 0)
            return fj__fail(
                err, FJ_ERR_INVALID_ARGUMENT,
                ntrusted == FJ__MAX_TRUSTED_KEYS
                    ? "opts.trusted_keys[%d]: at most 16 keys"
                    : "opts.trusted_keys[%d] is not an Ed25519 public key (64 hex digits)",
                ntrusted);
    if (!o.allocator.alloc != !o.allocator.free)
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT,
                        "opts.allocator: alloc and free are both set or both NULL (%s is NULL)",
                        o.allocator.alloc ? "free" : "alloc");
    if (o.tune != FJ_TUNE_NEVER && o.tune != FJ_TUNE_ON_MISS)
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT,
                        "opts.tune = %d, expected FJ_TUNE_NEVER or FJ_TUNE_ON_MISS", (int)o.tune);
    const char *tune_env = getenv("FLASHJIT_TUNE");
    if (tune_env && tune_env[0]) {
        if (!strcmp(tune_env, "on_miss"))
            o.tune = FJ_TUNE_ON_MISS;
        else if (!strcmp(tune_env, "never"))
            o.tune = FJ_TUNE_NEVER;
        else
            return fj__fail(err, FJ_ERR_INVALID_ARGUMENT,
                            "FLASHJIT_TUNE = '%s', expected never or on_miss", tune_env);
    }

    const struct fj_backend_ops *ops = NULL;
    if (o.backend == FJ_BACKEND_AUTO) {
        for (size_t i = 0; i < sizeof backends / sizeof backends[0] && !ops; i++) {
            int32_t count = 0;
            if (backends[i]->device_count(&count) == FJ_OK && count > o.device)
                ops = backends[i];
        }
        if (!ops)
            return fj__fail(err, FJ_ERR_NO_DEVICE,
                            "no backend has a device %d (is an OpenCL driver such as PoCL "
                            "installed?)",
                            (int)o.device);
    } else {
        ops = find_backend(o.backend);
        if (!ops)
            return fj__fail(err, FJ_ERR_NO_DEVICE, "the %s backend is not available in this build",
                            fj__backend_name(o.backend));
    }

    fj_context *ctx = calloc(1, sizeof *ctx);
    if (!ctx)
        return fj__fail(err, FJ_ERR_OUT_OF_MEMORY, "out of memory for a context");
    ctx->ops = ops;
    ctx->opts = o;
    ctx->tune_policy = o.tune;
    ctx->cache_path = o.cache_path ? fj__strdup(o.cache_path) : fj__default_cache_path();
    ctx->opts.cache_path = ctx->cache_path;
    ctx->device.struct_size = sizeof ctx->device;
    fj_status st =
        ctx->cache_path ? FJ_OK : fj__fail(&ctx->err, FJ_ERR_OUT_OF_MEMORY, "out of memory");
    if (st == FJ_OK)
        st = ops->device_info(o.device, &ctx->device, &ctx->err);
    if (st == FJ_OK)
        st = ops->create(o.device, &ctx->err, &ctx->backend);
    /* Templates from a folder (development): read once, so that every kernel this context
    ** renders comes from the templates its keys were hashed from. */
    const char *template_dir = tpl_env_dir();
    if (st == FJ_OK && template_dir && !(ctx->template_dir = fj__strdup(template_dir)))
        st = fj__fail(&ctx->err, FJ_ERR_OUT_OF_MEMORY, "out of memory");
    if (st == FJ_OK)
        st = tpl_set_hash(ctx->template_dir, ctx->template_hash, &ctx->err);
    const char *const names[2] = {"FLASHJIT_CONFIG", "FLASHJIT_BWD_CONFIG"};
    char **kept[2] = {&ctx->config, &ctx->bwd_config};
    for (int i = 0; i < 2; i++) {
        const char *config = getenv(names[i]);
        if (st == FJ_OK && config && config[0]) {
            fj__variant probe = {0};
            fj__err why = {{0}};
            if (fj__apply_config(&probe, config, &why) != 0) {
                /* The parser names FLASHJIT_CONFIG; the message names the variable read. */
                const char *detail = strchr(why.msg, ':');
                st = fj__fail(&ctx->err, FJ_ERR_INVALID_ARGUMENT, "%s%s", names[i],
                              detail ? detail : why.msg);
            }
            else if (!(*kept[i] = fj__strdup(config)))
                st = fj__fail(&ctx->err, FJ_ERR_OUT_OF_MEMORY, "out of memory");
        }
    }
    if (st == FJ_OK) {
        /* Cache problems become a warning in ctx->err, never a failure. */
        ctx->err.msg[0] = '\0';
        ctx->opts.shipped_caches = NULL; /* the caller's lists are not retained */
        ctx->opts.trusted_keys = NULL;
        cache_options co = {.path = ctx->cache_path,
                            .shipped = o.shipped_caches,
                            .readonly = o.cache_readonly != 0,
                            .own_file = o.cache_path == NULL,
                            .trusted = trusted,
                            .ntrusted = ntrusted};
        st = cache_open(&co, &ctx->cache, &ctx->err);
        fj__fingerprint(ctx, ctx->fingerprint, sizeof ctx->fingerprint);
    }
    if (st != FJ_OK) {
        memcpy(err->msg, ctx->err.msg, sizeof err->msg);
        fj_context_destroy(ctx);
        return st;
    }
    *out = ctx;
    return FJ_OK;
}

void fj_context_destroy(fj_context *ctx)
{
    if (!ctx)
        return;
    fj__tune_memo_free(&ctx->tuned);
    fj__mods_free(&ctx->mods);
    if (ctx->backend) {
        fj__arenas_release(ctx);
        fj__kernels_release(ctx);
        ctx->ops->destroy(ctx->backend);
    }
    cache_close(ctx->cache);
    FJ_FREE(ctx->cache_path);
    FJ_FREE(ctx->config);
    FJ_FREE(ctx->bwd_config);
    FJ_FREE(ctx->template_dir);
    free(ctx);
}

static fj_status check_info(const fj_device_info *info, fj__err *err)
{
    if (!info)
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT, "info is NULL");
    if (info->struct_size != sizeof *info)
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT,
                        "info.struct_size = %zu, expected %zu (sizeof(fj_device_info))",
                        info->struct_size, sizeof *info);
    return FJ_OK;
}

fj_status fj_device_count(fj_backend_kind backend, int32_t *count)
{
    if (!count)
        return FJ_ERR_INVALID_ARGUMENT;
    *count = 0;
    if (backend != FJ_BACKEND_CUDA && backend != FJ_BACKEND_OPENCL)
        return FJ_ERR_INVALID_ARGUMENT;
    const struct fj_backend_ops *ops = find_backend(backend);
    return ops ? ops->device_count(count) : FJ_OK;
}

fj_status fj_device_get_info(fj_backend_kind backend, int32_t index, fj_device_info *info)
{
    fj__err err = {{0}};
    fj_status st = check_info(info, &err);
    if (st != FJ_OK)
        return st;
    if (backend != FJ_BACKEND_CUDA && backend != FJ_BACKEND_OPENCL)
        return FJ_ERR_INVALID_ARGUMENT;
    const struct fj_backend_ops *ops = find_backend(backend);
    if (!ops || index < 0)
        return FJ_ERR_NO_DEVICE;
    memset(info, 0, sizeof *info);
    info->struct_size = sizeof *info;
    return ops->device_info(index, info, &err);
}

fj_status fj_context_get_device_info(const fj_context *ctx, fj_device_info *info)
{
    if (!ctx)
        return FJ_ERR_INVALID_ARGUMENT;
    fj_status st = check_info(info, (fj__err *)&ctx->err);
    if (st == FJ_OK)
        *info = ctx->device;
    return st;
}

fj_status fj_context_last_call(const fj_context *ctx, fj_call_info *info)
{
    if (!ctx)
        return FJ_ERR_INVALID_ARGUMENT;
    /* The first version ended with `tuned`, the second with `workspace_bytes`. */
    const size_t v1 = offsetof(fj_call_info, tuned) + sizeof info->tuned;
    const size_t v2 = offsetof(fj_call_info, workspace_bytes) + sizeof info->workspace_bytes;
    if (!info ||
        (info->struct_size != sizeof *info && info->struct_size != v1 && info->struct_size != v2))
        return fj__fail((fj__err *)&ctx->err, FJ_ERR_INVALID_ARGUMENT,
                        "info is NULL or info.struct_size is not sizeof(fj_call_info)");
    const size_t size = info->struct_size;
    memcpy(info, &ctx->last_call, size);
    info->struct_size = size;
    if (size == sizeof *info) /* (the text is a cache of ctx's launches: ctx stays the same) */
        info->launched = launched_text((fj_context *)ctx);
    return FJ_OK;
}

/* ---- memory ---------------------------------------------------------------------------- */

fj_status fj_malloc(fj_context *ctx, size_t bytes, void **ptr)
{
    if (!ctx)
        return FJ_ERR_INVALID_ARGUMENT;
    ctx->err.msg[0] = '\0';
    if (!ptr)
        return fj__fail(&ctx->err, FJ_ERR_INVALID_ARGUMENT, "ptr is NULL");
    *ptr = NULL;
    if (bytes == 0)
        return fj__fail(&ctx->err, FJ_ERR_INVALID_ARGUMENT, "bytes = 0");
    return ctx->ops->mem_alloc(ctx->backend, bytes, ptr);
}

fj_status fj_free(fj_context *ctx, void *ptr)
{
    if (!ctx)
        return FJ_ERR_INVALID_ARGUMENT;
    ctx->err.msg[0] = '\0';
    return ptr ? ctx->ops->mem_free(ctx->backend, ptr) : FJ_OK;
}

static fj_status check_copy(fj_context *ctx, void *dst, const void *src)
{
    if (!ctx)
        return FJ_ERR_INVALID_ARGUMENT;
    ctx->err.msg[0] = '\0';
    if (!dst)
        return fj__fail(&ctx->err, FJ_ERR_INVALID_ARGUMENT, "dst is NULL");
    if (!src)
        return fj__fail(&ctx->err, FJ_ERR_INVALID_ARGUMENT, "src is NULL");
    return FJ_OK;
}

fj_status fj_memcpy_h2d(fj_context *ctx, void *dst, const void *src, size_t bytes)
{
    fj_status st = check_copy(ctx, dst, src);
    if (st != FJ_OK || bytes == 0)
        return st;
    return ctx->ops->copy_h2d(ctx->backend, dst, src, bytes);
}

fj_status fj_memcpy_d2h(fj_context *ctx, void *dst, const void *src, size_t bytes)
{
    fj_status st = check_copy(ctx, dst, src);
    if (st != FJ_OK || bytes == 0)
        return st;
    return ctx->ops->copy_d2h(ctx->backend, dst, src, bytes);
}

fj_status fj_synchronize(fj_context *ctx, void *stream)
{
    if (!ctx)
        return FJ_ERR_INVALID_ARGUMENT;
    ctx->err.msg[0] = '\0';
    return ctx->ops->synchronize(ctx->backend, stream);
}
