/* fj_attention_merge: validate, plan (one launch, or a chain through a workspace) and run. */
#include "context.h"

fj_status fj_attention_merge(fj_context *ctx, const fj_tensor *outs, const fj_tensor *lses,
                             int32_t n, fj_tensor *out, fj_tensor *lse, void *stream)
{
    if (!ctx)
        return FJ_ERR_INVALID_ARGUMENT;
    double t0 = fj__now_ms();
    fj__begin_call(ctx);
    fj__merge_problem p;
    fj__plan plan;
    fj_status st = fj__validate_merge(outs, lses, n, out, lse, &p, &ctx->err);
    if (st == FJ_OK)
        st = fj__validate_merge_memory(&p, ctx->ops, ctx->backend, &ctx->err);
    if (st == FJ_OK)
        st = fj__plan_merge(&p, ctx->device.backend, &plan, &ctx->err);
    if (st == FJ_OK)
        st = fj__plan_run(ctx, &plan, &p, stream);
    ctx->last_call.total_ms = fj__now_ms() - t0;
    return st;
}
