/* fj_block_mask_build: validate (as a forward of q and k whose block_mask the classes are),
** plan (the block classifier's one launch into the caller's tensor) and run. */
#include "context.h"

fj_status fj_block_mask_build(fj_context *ctx, const fj_attention_desc *desc, const fj_tensor *q,
                              const fj_tensor *k, fj_tensor *classes, void *stream)
{
    if (!ctx)
        return FJ_ERR_INVALID_ARGUMENT;
    double t0 = fj__now_ms();
    fj__begin_call(ctx);
    fj__problem p;
    fj__plan plan;
    fj_status st = fj__validate_block_mask(desc, q, k, classes, &p, &ctx->err);
    if (st == FJ_OK)
        st = fj__validate_memory(&p, ctx->ops, ctx->backend, &ctx->err);
    if (st == FJ_OK)
        st = fj__mods_resolve(&ctx->mods, &p, &ctx->err);
    if (st == FJ_OK) {
        fj__features f;
        fj__features_of(&p, &f);
        const int64_t extent[2] = {classes->shape[0], classes->shape[1]};
        st = fj__plan_block_mask(&f, &ctx->device, extent, p.blocks_stride, &plan, &ctx->err);
    }
    if (st == FJ_OK)
        st = fj__plan_run(ctx, &plan, &p, stream);
    ctx->last_call.total_ms = fj__now_ms() - t0;
    return st;
}
