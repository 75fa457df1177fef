/* Running plans: workspaces from the stream's arena, then each step in order (memsets and
** kernel launches, each kernel with its one parameter block). */
#include <stdint.h>
#include <string.h>

#include "context.h"

/* Device memory for stream's arena: from the caller's allocator (fj_context_options.allocator)
** where set, else the backend's; a failure says which. Memory the kernels could not read whole
** vectors of goes back to the caller's allocator, and the call fails by name. */
static fj_status arena_alloc(fj_context *ctx, void *stream, size_t bytes, void **mem)
{
    const fj_allocator *al = &ctx->opts.allocator;
    if (!al->alloc) {
        const fj_status st = ctx->ops->mem_alloc(ctx->backend, bytes, mem);
        return st == FJ_OK ? st
                           : fj__fail(&ctx->err, st, "cannot allocate a %zu-byte workspace", bytes);
    }
    *mem = al->alloc(al->user, bytes, stream);
    if (!*mem)
        return fj__fail(&ctx->err, FJ_ERR_OUT_OF_MEMORY,
                        "opts.allocator returned no memory for a %zu-byte workspace", bytes);
    if ((uintptr_t)*mem % FJ__ARENA_ALIGN) {
        void *bad = *mem;
        al->free(al->user, bad, bytes, stream);
        *mem = NULL;
        return fj__fail(&ctx->err, FJ_ERR_INVALID_ARGUMENT,
                        "opts.allocator returned %p for a %zu-byte workspace: not %d-byte aligned",
                        bad, bytes, FJ__ARENA_ALIGN);
    }
    return FJ_OK;
}

/* Frees memory of stream's arena (the work that may read it, its stream's, has finished). */
static void arena_release(fj_context *ctx, void *stream, void *mem, size_t bytes)
{
    const fj_allocator *al = &ctx->opts.allocator;
    if (al->free)
        al->free(al->user, mem, bytes, stream);
    else
        ctx->ops->mem_free(ctx->backend, mem);
}

/* Frees arena a's memory, both parts (the work that may read it has finished). */
static void arena_free(fj_context *ctx, fj__arena *a)
{
    if (a->mem)
        arena_release(ctx, a->stream, a->mem, a->bytes);
    if (a->counters)
        arena_release(ctx, a->stream, a->counters, a->counter_bytes);
    a->mem = a->counters = NULL;
    a->bytes = a->counter_bytes = 0;
}

/* Replaces a part of stream's arena (*mem, *have bytes) with one of `want` bytes, freeing the
** old one after the stream's work that may read it. */
static fj_status arena_grow(fj_context *ctx, void *stream, void **mem, size_t *have, size_t want)
{
    if (*mem) {
        ctx->ops->synchronize(ctx->backend, stream);
        arena_release(ctx, stream, *mem, *have);
        *mem = NULL;
    }
    *have = 0;
    const fj_status st = arena_alloc(ctx, stream, want, mem);
    if (st == FJ_OK)
        *have = want;
    return st;
}

/* The arena of stream, holding at least bytes of scratch and counter_bytes of zeroed counters;
** a new stream takes a free slot, or the oldest one's. Growing or taking over an arena frees its
** old memory after the work that may still use it (its stream's) has finished; grown counters
** are zeroed on the stream, before the launches that use them. */
static fj_status arena_for(fj_context *ctx, void *stream, size_t bytes, size_t counter_bytes,
                          fj__arena **out)
{
    fj__arena *a = NULL;
    for (int i = 0; i < ctx->narenas && !a; i++)
        if (ctx->arenas[i].stream == stream)
            a = &ctx->arenas[i];
    /* Taking or growing an arena allocates (and waits): impossible while the stream is being
    ** captured into a graph, so that is named rather than left to break the capture. */
    if ((!a || a->bytes < bytes || a->counter_bytes < counter_bytes) && ctx->ops->capturing &&
        ctx->ops->capturing(ctx->backend, stream))
        return fj__fail(&ctx->err, FJ_ERR_INVALID_ARGUMENT,
                        "stream %p is being captured into a graph and has no %zu-byte workspace "
                        "yet: make one call of this kind on it before capturing",
                        stream, bytes + counter_bytes);
    if (!a) {
        if (ctx->narenas < FJ__ARENAS) {
            a = &ctx->arenas[ctx->narenas++];
        } else {
            a = &ctx->arenas[ctx->next_arena_victim];
            ctx->next_arena_victim = (ctx->next_arena_victim + 1) % FJ__ARENAS;
        }
        if (a->mem || a->counters) {
            ctx->ops->synchronize(ctx->backend, a->stream);
            arena_free(ctx, a);
        }
        memset(a, 0, sizeof *a);
        a->stream = stream;
    }
    if (a->bytes < bytes) {
        a->memo_valid = 0;
        fj_status st = arena_grow(ctx, stream, &a->mem, &a->bytes, bytes);
        if (st != FJ_OK)
            return st;
    }
    if (a->counter_bytes < counter_bytes) {
        fj_status st = arena_grow(ctx, stream, &a->counters, &a->counter_bytes, counter_bytes);
        if (st != FJ_OK)
            return st;
        st = ctx->ops->memset_async(ctx->backend, a->counters, 0, counter_bytes, stream);
        if (st != FJ_OK) { /* counters not known to be zero are none */
            arena_release(ctx, stream, a->counters, a->counter_bytes);
            a->counters = NULL;
            a->counter_bytes = 0;
            return st;
        }
    }
    *out = a;
    return FJ_OK;
}

void fj__arenas_release(fj_context *ctx)
{
    for (int i = 0; i < ctx->narenas; i++)
        arena_free(ctx, &ctx->arenas[i]);
    ctx->narenas = 0;
}

/* Whether arena a still holds what plan's memoised workspace w would be given. */
static int memo_holds(const fj__arena *a, const fj__workspace *w)
{
    return a && w->memo && a->memo_valid && a->memo_offset == w->offset &&
           memcmp(a->memo_key, w->memo_key, sizeof w->memo_key) == 0;
}

/* Encodes a tensor map for role (FJ__MAP_*), or reuses the role's last one when the description
** is the same. */
static fj_status encode_map(void *ud, int role, const fj__tensor_map_desc *d, fj__tensor_map *map)
{
    fj_context *ctx = ud;
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

fj_status fj__plan_run(fj_context *ctx, const fj__plan *plan, const void *request, void *stream)
{
    fj__arena *a = NULL;
    void *ws[FJ__MAX_WORKSPACES] = {0};
    fj_status st = FJ_OK;
    ctx->last_call.workspace_bytes = plan->workspace_bytes + plan->counter_bytes;
    if (plan->workspace_bytes > 0 || plan->counter_bytes > 0) {
        st = arena_for(ctx, stream, plan->workspace_bytes, plan->counter_bytes, &a);
        if (st != FJ_OK)
            return st;
        for (int i = 0; i < plan->nworkspaces; i++)
            ws[i] = (char *)(plan->workspaces[i].counters ? a->counters : a->mem) +
                    plan->workspaces[i].offset;
    }
    /* Room for any parameter block, aligned for the tensor maps inside. */
    _Alignas(64) unsigned char params[FJ__MAX_PARAMS_BYTES];
    for (int i = 0; i < plan->nsteps && st == FJ_OK; i++) {
        const fj__step *s = &plan->steps[i];
        if (s->kind == FJ__STEP_MEMSET) {
            const fj__workspace *w = &plan->workspaces[s->workspace];
            st = ctx->ops->memset_async(ctx->backend, ws[s->workspace], 0, w->bytes, stream);
            if (st == FJ_OK)
                fj__note_launch(ctx, "memset");
            continue;
        }
        if (s->skip_if_memo >= 0 && memo_holds(a, &plan->workspaces[s->skip_if_memo]))
            continue;
        const fj__kernel *k = NULL;
        st = fj__kernel_get(ctx, &s->variant, &k);
        const fj__playout *layout = fj__variant_layout(&s->variant);
        for (int run = 0; run < (s->runs > 1 ? s->runs : 1) && st == FJ_OK; run++) {
            st = fj__plan_fill(plan, i, run, request, ws, encode_map, ctx, params, &ctx->err);
            if (st != FJ_OK)
                break;
            const fj__launch l = {.grid = {s->grid[0], s->grid[1], s->grid[2]},
                                  .block = {s->block[0], s->block[1], s->block[2]},
                                  .shared_bytes = s->shared_bytes,
                                  .overlap_previous = s->overlap_previous,
                                  .params = params,
                                  .params_size = layout->size,
                                  .layout = layout};
            if (fj__log_debug_enabled())
                fj__log_info("launch %s (%s, step %d, run %d of %d): grid %u x %u x %u, block %u",
                             fj__variant_entry(&s->variant), fj__variant_path(&s->variant), i,
                             run + 1, s->runs > 1 ? s->runs : 1, l.grid[0], l.grid[1], l.grid[2],
                             l.block[0]);
            st = ctx->ops->launch(ctx->backend, k->handle, &l, stream);
        }
        if (st != FJ_OK)
            break;
        fj__note_launch(ctx, fj__variant_path(&s->variant));
        if (i == plan->main_step) {
            ctx->last_call.variant = k->key_text;
            ctx->last_call.kernel_path = fj__variant_path(&s->variant);
            ctx->last_call.registers = k->registers;
            ctx->last_call.spill_bytes = k->spill_bytes;
        }
    }
    ctx->last_call.compiles = ctx->compiles;
    if (!a)
        return st;
    /* What the arena holds now: the plan's memoised workspace, once its steps ran; otherwise
    ** the plan may have written anywhere in it. */
    a->memo_valid = 0;
    for (int w = 0; w < plan->nworkspaces && st == FJ_OK; w++)
        if (plan->workspaces[w].memo) {
            a->memo_valid = 1;
            a->memo_offset = plan->workspaces[w].offset;
            memcpy(a->memo_key, plan->workspaces[w].memo_key, sizeof a->memo_key);
        }
    return st;
}
