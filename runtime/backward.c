/* fj_attention_backward: validate (the forward's checks, then the gradients'), plan and run. */
#include "context.h"

fj_status fj__plan_backward_request(const fj_attention_desc *desc, const fj_tensor *q,
                                    const fj_tensor *k, const fj_tensor *v, const fj_tensor *out,
                                    const fj_tensor *dout, const fj_tensor *lse,
                                    const fj_tensor *dq, const fj_tensor *dk, const fj_tensor *dv,
                                    const fj_device_info *dev, const char *config, fj__mods *mods,
                                    fj__bwd_problem *p, fj__plan *plan, fj__err *err)
{
    fj_status st = fj__validate_backward(desc, q, k, v, out, dout, lse, dq, dk, dv, p, err);
    if (st == FJ_OK)
        st = fj__mods_resolve(mods, &p->f, err);
    if (st != FJ_OK)
        return st;
    fj__features f;
    fj__bwd_features_of(p, &f);
    return fj__plan_backward(&f, dev, config, plan, err);
}

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
    /* What the request asks is checked (and planned) before where its data lies. */
    fj_status st =
        fj__plan_backward_request(desc, q, k, v, out, dout, lse, dq, dk, dv, &ctx->device,
                                  ctx->bwd_config, &ctx->mods, &p, &plan, &ctx->err);
    if (st == FJ_OK)
        st = fj__validate_backward_memory(&p, ctx->ops, ctx->backend, &ctx->err);
    if (st == FJ_OK)
        st = fj__plan_run(ctx, &plan, &p, stream);
    ctx->last_call.total_ms = fj__now_ms() - t0;
    return st;
}
