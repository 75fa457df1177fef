/* Block classes for the Hopper kernel's element masks: the pre-pass that tells it which key
** tiles to skip and which to mask per element (templates/attn_classify.lua). */
#include <string.h>

#include "context.h"

#define CLS 128

int fj__needs_classes(const fj__variant *v)
{
    return v->family == FJ__FAMILY_FWD && v->path == FJ__PATH_WGMMA && !v->block_mask &&
           fj__variant_element_masks(v);
}

void fj__classify_variant(const fj__variant *v, fj__variant *cv)
{
    memset(cv, 0, sizeof *cv);
    cv->family = FJ__FAMILY_CLASSIFY;
    cv->backend = v->backend;
    cv->path = FJ__PATH_SIMT;
    cv->dtype = v->dtype;
    cv->tile_m = cv->tile_n = CLS;
    cv->threads = 256;
    cv->mask_mod = v->mask_mod;
    cv->mask_tensor = v->mask_tensor;
    cv->mask_ranges = v->mask_ranges;
}

/* The buffer of stream, grown to bytes; a new stream takes a free slot, or the oldest one's
** (freeing device memory waits for the work that may still read it). */
static struct fj__class_buffer *class_buffer(fj_context *ctx, void *stream, size_t bytes,
                                             fj_status *st)
{
    struct fj__class_buffer *b = NULL;
    for (int i = 0; i < ctx->nclass_buffers && !b; i++)
        if (ctx->class_buffers[i].stream == stream)
            b = &ctx->class_buffers[i];
    if (!b) {
        if (ctx->nclass_buffers < FJ__CLASS_BUFFERS) {
            b = &ctx->class_buffers[ctx->nclass_buffers++];
        } else {
            b = &ctx->class_buffers[ctx->next_class_victim];
            ctx->next_class_victim = (ctx->next_class_victim + 1) % FJ__CLASS_BUFFERS;
        }
        if (b->mem)
            ctx->ops->mem_free(ctx->backend, b->mem);
        memset(b, 0, sizeof *b);
        b->stream = stream;
    }
    if (b->bytes < bytes) {
        if (b->mem)
            ctx->ops->mem_free(ctx->backend, b->mem);
        b->mem = NULL;
        b->bytes = 0;
        b->key_valid = 0;
        *st = ctx->ops->mem_alloc(ctx->backend, bytes, &b->mem);
        if (*st != FJ_OK) {
            b->mem = NULL;
            fj__fail(&ctx->err, *st, "cannot allocate %zu bytes for block classes", bytes);
            return NULL;
        }
        b->bytes = bytes;
    }
    *st = FJ_OK;
    return b;
}

fj_status fj__classify_blocks(fj_context *ctx, fj__problem *p, const fj__variant *v,
                              void *stream, fj_tensor *cls)
{
    /* Classes per batch and head only where the masks differ by them. */
    const char *mm = v->mask_mod;
    const int by_b = (mm && strstr(mm, "FJ_B")) || (p->mask && p->mask_stride[0]) ||
                     (p->mask_ranges && p->ranges_stride[0]);
    const int by_h = (mm && strstr(mm, "FJ_H")) || (p->mask && p->mask_stride[1]) ||
                     (p->mask_ranges && p->ranges_stride[1]);
    const int64_t cb = by_b ? p->batch : 1, ch = by_h ? p->heads_q : 1;
    const int64_t qb = (p->seqlen_q + CLS - 1) / CLS, kb = (p->seqlen_k + CLS - 1) / CLS;
    if (qb > 65535 || cb * ch > 65535)
        return fj__fail(&ctx->err, FJ_ERR_UNSUPPORTED,
                        "masks of %lld query blocks for %lld (batch, head) pairs: the block "
                        "classifier's grid allows 65535 of each",
                        (long long)qb, (long long)(cb * ch));
    fj_status st = FJ_OK;
    struct fj__class_buffer *buf =
        class_buffer(ctx, stream, (size_t)(cb * ch * qb * kb) * sizeof(int32_t), &st);
    if (!buf)
        return st;
    memset(cls, 0, sizeof *cls);
    cls->data = buf->mem;
    cls->dtype = FJ_DTYPE_I32;
    cls->ndim = 4;
    p->block_mask = cls;
    p->blocks_stride[0] = by_b ? ch * qb * kb : 0;
    p->blocks_stride[1] = by_h ? qb * kb : 0;
    p->blocks_stride[2] = kb;

    /* A mask_mod alone, reading no mod_args, is a pure function of the shape: its classes are
    ** computed once. Tensors and mod_args may change between calls: classified each time. */
    const int pure = mm && !p->mask && !p->mask_ranges && !p->mask_mod_reads_args;
    const int64_t key[6] = {(int64_t)(uintptr_t)mm, p->seqlen_q, p->seqlen_k, cb, ch, kb};
    if (pure && buf->key_valid && !memcmp(buf->key, key, sizeof key))
        return FJ_OK;
    buf->key_valid = 0;

    fj__variant cv;
    fj__classify_variant(v, &cv);
    const fj__kernel *kernel = NULL;
    st = fj__kernel_get(ctx, &cv, &kernel);
    if (st != FJ_OK)
        return st;
    fj__arg args[FJ__MAX_ARGS];
    fj__launch l = {.grid = {(uint32_t)kb, (uint32_t)qb, (uint32_t)(cb * ch)},
                    .block = {256, 1, 1},
                    .args = args};
    l.nargs = fj__forward_args(p, args);
    args[l.nargs++] = (fj__arg){.kind = FJ__ARG_PTR, .v.ptr = buf->mem};
    for (int i = 0; i < 3; i++)
        args[l.nargs++] = (fj__arg){.kind = FJ__ARG_I64, .v.i64 = p->blocks_stride[i]};
    args[l.nargs++] = (fj__arg){.kind = FJ__ARG_I32, .v.i32 = (int32_t)ch};
    st = ctx->ops->launch(ctx->backend, kernel->handle, &l, stream);
    if (st == FJ_OK && pure) {
        memcpy(buf->key, key, sizeof key);
        buf->key_valid = 1;
    }
    return st;
}

void fj__class_buffers_release(fj_context *ctx)
{
    for (int i = 0; i < ctx->nclass_buffers; i++)
        if (ctx->class_buffers[i].mem)
            ctx->ops->mem_free(ctx->backend, ctx->class_buffers[i].mem);
    ctx->nclass_buffers = 0;
}
