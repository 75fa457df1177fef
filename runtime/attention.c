/* fj_attention_forward: validate, plan a variant, get its kernel, launch. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "context.h"
#include "expr.h"

#define LOG2E 1.4426950408889634

/* The kernel parameter list shared by every forward template (see attn_fwd.*.lua). */
int fj__forward_args(const fj__problem *p, fj__arg args[FJ__MAX_ARGS])
{
    int n = 0;
    /* 55 arguments, and the Hopper kernel appends 8: well inside FJ__MAX_ARGS. */
#define PTR(x) args[n++] = (fj__arg){.kind = FJ__ARG_PTR, .v.ptr = (void *)(x)}
#define I32(x)                                                                                     \
    args[n++] = (fj__arg)                                                                          \
    {                                                                                              \
        .kind = FJ__ARG_I32, .v.i32 = (int32_t)(x)                                                 \
    }
#define I64(x)                                                                                     \
    args[n++] = (fj__arg)                                                                          \
    {                                                                                              \
        .kind = FJ__ARG_I64, .v.i64 = (int64_t)(x)                                                 \
    }
#define F32(x)                                                                                     \
    args[n++] = (fj__arg)                                                                          \
    {                                                                                              \
        .kind = FJ__ARG_F32, .v.f32 = (float)(x)                                                   \
    }
    PTR(p->q->data);
    PTR(p->k->data);
    PTR(p->v->data);
    PTR(p->out->data);
    /* Without lse the kernel never touches this argument; any valid pointer will do. */
    PTR(p->lse ? p->lse->data : p->out->data);
    I32(p->seqlen_q);
    I32(p->seqlen_k);
    I32(p->heads_q);
    I32(p->heads_kv);
    I32(p->head_dim);
    I32(p->head_dim_v);
    for (int i = 0; i < 4; i++) {
        I64(p->strides[i][0]);
        I64(p->strides[i][1]);
        I64(p->strides[i][2]);
    }
    for (int i = 0; i < 3; i++)
        I64(p->lse_stride[i]);
    /* Without soft-capping q.k is scaled straight to log2 units; with it, to the tanh argument,
    ** and the cap carries the log2 factor. */
    if (p->softcap > 0.0f) {
        F32((double)p->scale / p->softcap);
        F32((double)p->softcap * LOG2E);
    } else {
        F32((double)p->scale * LOG2E);
        F32(0.0);
    }
    I32(p->window_left);
    I32(p->window_right);
    /* Expression arguments: any valid pointer when there are none (never read then). */
    PTR(p->mod_args ? p->mod_args : p->out->data);
    I32(p->mod_args_count);
    /* Optional tensors: the data (any valid pointer when absent) and strides. */
#define TENSOR(t, strides, n)                                                                      \
    do {                                                                                           \
        PTR((t) ? (t)->data : p->out->data);                                                       \
        for (int i_ = 0; i_ < (n); i_++)                                                           \
            I64((strides)[i_]);                                                                    \
    } while (0)
    TENSOR(p->alibi, &p->alibi_stride_b, 1);
    TENSOR(p->bias, p->bias_stride, 3);
    TENSOR(p->mask, p->mask_stride, 3);
    /* Variable lengths: offsets, used lengths, and the packed tensors' rows. */
    PTR(p->cu_seqlens_q ? p->cu_seqlens_q->data : p->out->data);
    PTR(p->cu_seqlens_k ? p->cu_seqlens_k->data : p->out->data);
    PTR(p->seqused_k ? p->seqused_k->data : p->out->data);
    I32(p->cu_seqlens_q ? p->q->shape[0] : 0);
    I32(p->cu_seqlens_q ? p->k->shape[0] : 0);
    TENSOR(p->mask_ranges, p->ranges_stride, 3);
    TENSOR(p->block_mask, p->blocks_stride, 3);
#undef TENSOR
#undef PTR
#undef I32
#undef I64
#undef F32
    return n;
}

/* Encodes the tensor map d for role (0-3: q, k, v, bias), or reuses the role's last one when d
** is the same. */
static fj_status encode_map(fj_context *ctx, int role, const fj__tensor_map_desc *d,
                            fj__tensor_map *map)
{
    if (!ctx->ops->tensor_map)
        return fj__fail(&ctx->err, FJ_ERR_UNSUPPORTED, "the %s backend has no tensor maps",
                        ctx->ops->name);
    if (ctx->last_maps[role].valid && !memcmp(&ctx->last_maps[role].desc, d, sizeof *d)) {
        memcpy(map->bytes, ctx->last_maps[role].bytes, sizeof map->bytes);
        return FJ_OK;
    }
    ctx->last_maps[role].valid = 0;
    fj_status st = ctx->ops->tensor_map(ctx->backend, d, map);
    if (st == FJ_OK) {
        ctx->last_maps[role].desc = *d;
        memcpy(ctx->last_maps[role].bytes, map->bytes, sizeof map->bytes);
        ctx->last_maps[role].valid = 1;
    }
    return st;
}

/* The TMA view of the bias [batch, heads, sq, sk] (broadcast dimensions of size 1) for boxes
** of 128 bytes of keys by `rows` query rows (see bias_tma_can_read in autotune/heuristic.c). */
static fj_status bias_map_of(fj_context *ctx, const fj__problem *p, uint32_t rows,
                             fj__tensor_map *map)
{
    const uint64_t es = fj_dtype_size(p->bias->dtype);
    const int64_t *s = p->bias_stride;
    fj__tensor_map_desc d;
    memset(&d, 0, sizeof d);
    d.base = p->bias->data;
    d.bf16 = p->bias->dtype == FJ_DTYPE_BF16;
    d.f32 = p->bias->dtype == FJ_DTYPE_F32;
    d.dims[0] = (uint64_t)p->seqlen_k;
    d.dims[1] = (uint64_t)p->seqlen_q;
    d.dims[2] = s[1] ? (uint64_t)p->heads_q : 1;
    d.dims[3] = s[0] ? (uint64_t)p->batch : 1;
    d.strides[0] = (uint64_t)s[2] * es;
    d.strides[1] = s[1] ? (uint64_t)s[1] * es : d.strides[0] * d.dims[1];
    d.strides[2] = s[0] ? (uint64_t)s[0] * es : d.strides[1] * d.dims[2];
    d.box[0] = (uint32_t)(128 / es);
    d.box[1] = rows;
    d.box[2] = d.box[3] = 1;
    return encode_map(ctx, 3, &d, map);
}

/* The TMA view of one [batch, seqlen, heads, dim] tensor (role 0, 1, 2: q, k, v) for boxes of
** `rows` rows and 64 columns, encoded again only when it differs from the role's last one.
** The three outer dimensions are ordered by stride, as the driver expects of a tiled map
** (dimensions of one element go last, with any stride); *perm tells the kernel which slot holds
** the row (bits 0-1) and head (bits 2-3) coordinates. */
static fj_status tensor_map_of(fj_context *ctx, int role, const fj_tensor *t, uint32_t rows,
                               fj__tensor_map *map, int32_t *perm)
{
    int order[3] = {0, 1, 2}; /* batch, seqlen, heads */
    for (int i = 1; i < 3; i++)
        for (int j = i; j > 0; j--) {
            const int a = order[j - 1], b = order[j];
            const int64_t ka = t->shape[a] == 1 ? INT64_MAX : t->stride[a];
            const int64_t kb = t->shape[b] == 1 ? INT64_MAX : t->stride[b];
            if (kb >= ka)
                break;
            order[j - 1] = b;
            order[j] = a;
        }
    fj__tensor_map_desc d;
    memset(&d, 0, sizeof d); /* compared with memcmp below: no stray padding bytes */
    d.base = t->data;
    d.bf16 = t->dtype == FJ_DTYPE_BF16;
    d.dims[0] = (uint64_t)t->shape[3];
    d.box[0] = 64;
    uint64_t extent = ((uint64_t)t->shape[3] * 2 + 15) / 16 * 16; /* bytes spanned so far */
    *perm = 0;
    for (int slot = 0; slot < 3; slot++) {
        const int dim = order[slot];
        const uint64_t n = (uint64_t)t->shape[dim];
        const uint64_t stride = n == 1 ? extent : (uint64_t)t->stride[dim] * 2;
        d.dims[1 + slot] = n;
        d.strides[slot] = stride;
        d.box[1 + slot] = dim == 1 ? rows : 1;
        if (stride * n > extent)
            extent = stride * n;
        if (dim == 1)
            *perm |= slot;
        else if (dim == 2)
            *perm |= slot << 2;
    }
    return encode_map(ctx, role, &d, map);
}

/* The tile counter of stream (two ints, zero between launches), or NULL when there is none to
** give: the kernel then runs one tile per block. */
static int32_t *tile_counter(fj_context *ctx, void *stream)
{
    if (!ctx->tile_counters) {
        static const int32_t zeros[2 * FJ__TILE_COUNTERS];
        void *mem = NULL;
        if (ctx->ops->mem_alloc(ctx->backend, sizeof zeros, &mem) != FJ_OK)
            return NULL;
        if (ctx->ops->copy_h2d(ctx->backend, mem, zeros, sizeof zeros) != FJ_OK) {
            ctx->ops->mem_free(ctx->backend, mem);
            return NULL;
        }
        ctx->tile_counters = mem;
    }
    int i = 0;
    while (i < ctx->ncounter_streams && ctx->counter_streams[i] != stream)
        i++;
    if (i == FJ__TILE_COUNTERS)
        return NULL;
    if (i == ctx->ncounter_streams)
        ctx->counter_streams[ctx->ncounter_streams++] = stream;
    return (int32_t *)ctx->tile_counters + 2 * i;
}

/* The grid of a zigzag-scheduled launch of v (persistent = 3) on sms blocks at once, chosen
** again only when the shape differs from the previous such launch. */
static uint32_t zigzag_grid(fj_context *ctx, const fj__problem *p, const fj__variant *v,
                            uint32_t sms)
{
    const int64_t key[10] = {p->seqlen_q,
                             p->seqlen_k,
                             p->heads_q,
                             p->batch,
                             p->window_left,
                             p->window_right,
                             v->tile_m,
                             v->tile_n,
                             sms,
                             v->local_mask + 2 * (v->block_mask || fj__variant_element_masks(v)) +
                                 4 * (v->bias || v->mask_tensor)};
    if (!ctx->zigzag_grid || memcmp(key, ctx->zigzag_key, sizeof key)) {
        memcpy(ctx->zigzag_key, key, sizeof key);
        ctx->zigzag_grid = fj__zigzag_grid(p, v, sms);
    }
    return ctx->zigzag_grid;
}

fj_status fj__forward_variant(fj_context *ctx, const fj__problem *request, const fj__variant *v,
                              void *stream)
{
    fj_call_info *info = &ctx->last_call;
    const fj__problem *p = request;
    /* Element masks on the Hopper kernel: block classes first, read as its block_mask. */
    fj__problem classified;
    fj_tensor classes;
    fj_status st = FJ_OK;
    if (fj__needs_classes(v)) {
        classified = *request;
        st = fj__classify_blocks(ctx, &classified, v, stream, &classes);
        if (st != FJ_OK)
            return st;
        p = &classified;
    }
    const fj__kernel *kernel = NULL;
    st = fj__kernel_get(ctx, v, &kernel);
    info->compiles = ctx->compiles;
    if (st != FJ_OK)
        return st;
    info->variant = kernel->key_text;
    info->kernel_path = fj__variant_path(v);
    info->registers = kernel->registers;
    info->spill_bytes = kernel->spill_bytes;
    fj__arg args[FJ__MAX_ARGS];
    fj__launch l = {
        .grid = {(uint32_t)((p->seqlen_q + v->tile_m - 1) / v->tile_m), (uint32_t)p->heads_q,
                 (uint32_t)p->batch},
        .block = {(uint32_t)v->threads, 1, 1},
        .shared_bytes = fj__variant_shared_bytes(v),
        .nargs = fj__forward_args(p, args),
        .args = args,
    };
    fj__tensor_map maps[4]; /* read by the launch */
    int32_t perms[3];
    if (v->path == FJ__PATH_WGMMA) {
        /* Then the tensor maps of Q, K, V and the slots of their coordinates. */
        const fj_tensor t4[3] = {fj__tensor_4d(p->q), fj__tensor_4d(p->k), fj__tensor_4d(p->v)};
        const fj_tensor *t[3] = {&t4[0], &t4[1], &t4[2]};
        const uint32_t rows[3] = {(uint32_t)v->tile_m, (uint32_t)v->tile_n, (uint32_t)v->tile_n};
        for (int i = 0; i < 3; i++) {
            st = tensor_map_of(ctx, i, t[i], rows[i], &maps[i], &perms[i]);
            if (st != FJ_OK)
                return st;
            args[l.nargs + i] = (fj__arg){.kind = FJ__ARG_BYTES,
                                          .v.bytes = {.data = &maps[i], .size = sizeof maps[i]}};
            args[l.nargs + 3 + i] = (fj__arg){.kind = FJ__ARG_I32, .v.i32 = perms[i]};
        }
        l.nargs += 6;
        args[l.nargs++] = (fj__arg){.kind = FJ__ARG_I32, .v.i32 = (int32_t)p->batch};
        int32_t *counter = v->persistent == 2 ? tile_counter(ctx, stream) : NULL;
        args[l.nargs++] = (fj__arg){.kind = FJ__ARG_PTR, .v.ptr = counter};
        if (v->bias_tma) {
            st = bias_map_of(ctx, p, (uint32_t)v->tile_m, &maps[3]);
            if (st != FJ_OK)
                return st;
            args[l.nargs++] = (fj__arg){.kind = FJ__ARG_BYTES,
                                        .v.bytes = {.data = &maps[3], .size = sizeof maps[3]}};
        }
        /* Work tiles in one dimension; persistent: no more blocks than fit the SMs at once (one
        ** or two each), unless a dynamic schedule has no counter. */
        uint64_t work = (uint64_t)l.grid[0] * l.grid[1] * l.grid[2];
        uint64_t sms = ctx->device.compute_units > 0 ? (uint64_t)ctx->device.compute_units *
                                                           (v->ctas_per_sm ? v->ctas_per_sm : 1)
                                                     : work;
        int persistent =
            v->persistent == 1 || v->persistent == 3 || (v->persistent == 2 && counter);
        l.grid[0] = (uint32_t)(persistent && sms < work ? sms : work);
        if (v->persistent == 3 && sms < work && sms <= UINT32_MAX)
            l.grid[0] = zigzag_grid(ctx, p, v, (uint32_t)sms);
        l.grid[1] = l.grid[2] = 1;
    }
    return ctx->ops->launch(ctx->backend, kernel->handle, &l, stream);
}

/* Finds the parsed expression of src, parsing it the first time. */
static fj_status find_mod(fj_context *ctx, const char *field, const char *src, int score,
                          const fj__expr **out)
{
    for (size_t i = 0; i < ctx->nmods; i++)
        if (ctx->mods[i].score == score && strcmp(ctx->mods[i].src, src) == 0) {
            *out = ctx->mods[i].expr;
            return FJ_OK;
        }
    fj__expr *e = NULL;
    fj_status st = fj__expr_parse(field, src, score, &e, &ctx->err);
    if (st != FJ_OK)
        return st;
    if (ctx->nmods == ctx->capmods) {
        size_t cap = ctx->capmods ? 2 * ctx->capmods : 8;
        fj__mod *grown = realloc(ctx->mods, cap * sizeof *grown);
        if (!grown) {
            fj__expr_free(e);
            return fj__fail(&ctx->err, FJ_ERR_OUT_OF_MEMORY, "out of memory for an expression");
        }
        ctx->mods = grown;
        ctx->capmods = cap;
    }
    char *copy = fj__strdup(src);
    if (!copy) {
        fj__expr_free(e);
        return fj__fail(&ctx->err, FJ_ERR_OUT_OF_MEMORY, "out of memory for an expression");
    }
    ctx->mods[ctx->nmods++] = (fj__mod){.src = copy, .score = score, .expr = e};
    *out = e;
    return FJ_OK;
}

fj_status fj__resolve_mods(fj_context *ctx, fj__problem *p)
{
    const fj__expr *mask = NULL, *score = NULL;
    fj_status st = FJ_OK;
    if (p->mask_mod_src)
        st = find_mod(ctx, "mask_mod", p->mask_mod_src, 0, &mask);
    if (st == FJ_OK && p->score_mod_src)
        st = find_mod(ctx, "score_mod", p->score_mod_src, 1, &score);
    if (st != FJ_OK)
        return st;
    if ((fj__expr_uses_args(mask) || fj__expr_uses_args(score)) && p->mod_args_count == 0)
        return fj__fail(&ctx->err, FJ_ERR_INVALID_ARGUMENT,
                        "desc.%s reads arg[] or iarg[] but desc.mod_args_count = 0",
                        fj__expr_uses_args(mask) ? "mask_mod" : "score_mod");
    p->mask_mod = mask ? fj__expr_text(mask) : NULL;
    p->mask_mod_reads_args = fj__expr_uses_args(mask);
    p->score_mod = score ? fj__expr_text(score) : NULL;
    return FJ_OK;
}

void fj__mods_release(fj_context *ctx)
{
    for (size_t i = 0; i < ctx->nmods; i++) {
        FJ_FREE(ctx->mods[i].src);
        fj__expr_free(ctx->mods[i].expr);
    }
    FJ_FREE(ctx->mods);
    ctx->nmods = ctx->capmods = 0;
}

/* Everything the choice of variant depends on, so that a call shaped like the previous one
** reuses its variant without planning, bucketing and looking up tuning records again. */
static void plan_key(const fj__problem *p, int64_t key[FJ__PLAN_KEY])
{
    const fj_tensor *t[4] = {p->q, p->k, p->v, p->out};
    int64_t aligned = 0; /* the tensor-core path depends on 16-byte rows */
    for (int i = 0; i < 4; i++)
        aligned |= (int64_t)(((uintptr_t)t[i]->data % 16 == 0 && t[i]->stride[0] % 8 == 0 &&
                              t[i]->stride[1] % 8 == 0 && t[i]->stride[2] % 8 == 0))
                   << i;
    const int64_t k[FJ__PLAN_KEY] = {
        p->dtype, p->head_dim, p->head_dim_v, p->seqlen_q, p->seqlen_k, p->batch, p->heads_q,
        p->window_left, p->window_right, p->softcap > 0, p->scale < 0, p->lse != NULL,
        (int64_t)(uintptr_t)p->mask_mod, (int64_t)(uintptr_t)p->score_mod, aligned,
        p->alibi != NULL, p->bias ? 1 + (int64_t)p->bias->dtype : 0, p->mask != NULL,
        (p->cu_seqlens_q != NULL) + (p->seqused_k != NULL),
        p->mask_ranges ? p->mask_ranges->shape[3] : 0, p->block_mask != NULL,
        /* the bias's layout decides whether TMA copies it */
        p->bias ? (int64_t)((uintptr_t)p->bias->data % 16) : -1, p->bias_stride[0],
        p->bias_stride[1], p->bias_stride[2]};
    memcpy(key, k, sizeof k);
}

/* The variant a request runs with: the heuristic's, a tuned record's, or (under
** FJ_TUNE_ON_MISS) the winner of tuning it now. $FLASHJIT_CONFIG overrides all of them. */
static fj_status choose_variant_slow(fj_context *ctx, const fj__problem *p, fj__variant *v,
                                     void *stream)
{
    fj__plan_forward(p, &ctx->device, ctx->config, v);
    if (ctx->config)
        return FJ_OK;
    char bucket[256];
    fj__tune_bucket(p, v, bucket, sizeof bucket);
    const char *tuned = fj__tuned_config(ctx, bucket);
    if (!tuned && ctx->tune_policy == FJ_TUNE_ON_MISS) {
        fj_tune_result r = {.struct_size = sizeof r};
        fj_status st = fj__tune(ctx, p, v, stream, &r);
        if (st != FJ_OK)
            return st;
        tuned = fj__tuned_config(ctx, bucket);
        ctx->last_call.tuned = 2;
    }
    fj__variant t = *v;
    /* A record that does not fit (from another library version, say) is ignored. */
    if (tuned && fj__apply_config(&t, tuned, NULL) == 0 && fj__variant_fits(&t, &ctx->device)) {
        *v = t;
        if (!ctx->last_call.tuned)
            ctx->last_call.tuned = 1;
    }
    return FJ_OK;
}

/* choose_variant_slow, skipped when the call is shaped like the previous one (tuning clears
** the memory, so a new record takes effect at the next call). */
static fj_status choose_variant(fj_context *ctx, const fj__problem *p, fj__variant *v, void *stream)
{
    int64_t key[FJ__PLAN_KEY];
    plan_key(p, key);
    if (ctx->last_plan_valid && memcmp(key, ctx->last_plan_key, sizeof key) == 0) {
        *v = ctx->last_plan;
        ctx->last_call.tuned = ctx->last_plan_tuned;
        return FJ_OK;
    }
    fj_status st = choose_variant_slow(ctx, p, v, stream);
    if (st == FJ_OK) {
        memcpy(ctx->last_plan_key, key, sizeof key);
        ctx->last_plan = *v;
        ctx->last_plan_tuned = ctx->last_call.tuned == 2 ? 1 : ctx->last_call.tuned;
        ctx->last_plan_valid = 1;
    }
    return st;
}

/* Starts a call: clears the error and the report. */
static void begin_call(fj_context *ctx)
{
    ctx->err.msg[0] = '\0';
    memset(&ctx->last_call, 0, sizeof ctx->last_call);
    ctx->last_call.struct_size = sizeof ctx->last_call;
}

fj_status fj_attention_forward(fj_context *ctx, const fj_attention_desc *desc, const fj_tensor *q,
                               const fj_tensor *k, const fj_tensor *v, fj_tensor *out,
                               fj_tensor *lse, void *stream)
{
    if (!ctx)
        return FJ_ERR_INVALID_ARGUMENT;
    double t0 = fj__now_ms();
    begin_call(ctx);
    fj__problem p;
    fj_status st = fj__validate_forward(desc, q, k, v, out, lse, &p, &ctx->err);
    if (st == FJ_OK)
        st = fj__resolve_mods(ctx, &p);
    fj__variant var;
    if (st == FJ_OK)
        st = choose_variant(ctx, &p, &var, stream);
    if (st == FJ_OK)
        st = fj__forward_variant(ctx, &p, &var, stream);
    ctx->last_call.total_ms = fj__now_ms() - t0;
    return st;
}

fj_status fj_attention_tune(fj_context *ctx, const fj_attention_desc *desc, const fj_tensor *q,
                            const fj_tensor *k, const fj_tensor *v, fj_tensor *out, fj_tensor *lse,
                            void *stream, fj_tune_result *result)
{
    if (!ctx)
        return FJ_ERR_INVALID_ARGUMENT;
    begin_call(ctx);
    if (result && result->struct_size != sizeof *result)
        return fj__fail(&ctx->err, FJ_ERR_INVALID_ARGUMENT,
                        "result.struct_size = %zu, expected sizeof(fj_tune_result) = %zu",
                        result->struct_size, sizeof *result);
    fj__problem p;
    fj_status st = fj__validate_forward(desc, q, k, v, out, lse, &p, &ctx->err);
    if (st == FJ_OK)
        st = fj__resolve_mods(ctx, &p);
    if (st != FJ_OK)
        return st;
    fj__variant var;
    fj__plan_forward(&p, &ctx->device, NULL, &var);
    fj_tune_result local = {.struct_size = sizeof local};
    return fj__tune(ctx, &p, &var, stream, result ? result : &local);
}
