/* fj_attention_backward: validate (the forward's checks, then the gradients'), plan and run. */
#include "context.h"

fj_status fj_attention_backward(fj_context *ctx, const fj_attention_desc *desc,
                                const fj_tensor *q, const fj_tensor *k, const fj_tensor *v,
                                const fj_tensor *out, const fj_tensor *dout, const fj_tensor *lse,
                                fj_tensor *dq, fj_tensor *dk, fj_tensor *dv, void *stream)
{
    if (!ctx)
        return FJ_ERR_INVALID_ARGUMENT;
    double t0 = fj__now_ms();
    fj__begin_call(ctx);
    fj__bwd_problem p;
    fj__plan plan;
    fj_status st =
        fj__validate_backward(desc, q, k, v, out, dout, lse, dq, dk, dv, &p, &ctx->err);
    if (st == FJ_OK)
        st = fj__mods_resolve(&ctx->mods, &p.f, &ctx->err);
    if (st == FJ_OK) { /* what the request asks is checked before where its data lies */
        fj__features f;
        fj__features_of(&p.f, &f);
        f.dbias_elements = p.dbias_elements;
        st = fj__plan_backward(&f, &ctx->device, &plan, &ctx->err);
    }
    if (st == FJ_OK)
        st = fj__validate_backward_memory(&p, ctx->ops, ctx->backend, &ctx->err);
    if (st == FJ_OK)
        st = fj__plan_run(ctx, &plan, &p, stream);
    ctx->last_call.total_ms = fj__now_ms() - t0;
    return st;
}
