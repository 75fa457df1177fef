/* fj_kv_cache_append, _packed and _quantized: validate, plan (one launch) and run. */
#include "context.h"

fj_status fj_kv_cache_append_quantized(fj_context *ctx, const fj_tensor *k_new,
                                       const fj_tensor *v_new, const fj_tensor *cu_seqlens_new,
                                       const fj_tensor *k_descale, const fj_tensor *v_descale,
                                       fj_tensor *k_cache, fj_tensor *v_cache,
                                       const fj_tensor *page_table, const fj_tensor *seqused_k,
                                       void *stream)
{
    if (!ctx)
        return FJ_ERR_INVALID_ARGUMENT;
    double t0 = fj__now_ms();
    fj__begin_call(ctx);
    fj__append_problem p;
    fj__plan plan;
    fj_status st = fj__validate_append(k_new, v_new, cu_seqlens_new, k_descale, v_descale, k_cache,
                                       v_cache, page_table, seqused_k, &p, &ctx->err);
    if (st == FJ_OK)
        st = fj__validate_append_memory(&p, ctx->ops, ctx->backend, &ctx->err);
    if (st == FJ_OK)
        st = fj__plan_append(&p, ctx->device.backend, &plan, &ctx->err);
    if (st == FJ_OK)
        st = fj__plan_run(ctx, &plan, &p, stream);
    ctx->last_call.total_ms = fj__now_ms() - t0;
    return st;
}

fj_status fj_kv_cache_append(fj_context *ctx, const fj_tensor *k_new, const fj_tensor *v_new,
                             fj_tensor *k_cache, fj_tensor *v_cache, const fj_tensor *page_table,
                             const fj_tensor *seqused_k, void *stream)
{
    return fj_kv_cache_append_quantized(ctx, k_new, v_new, NULL, NULL, NULL, k_cache, v_cache,
                                        page_table, seqused_k, stream);
}

fj_status fj_kv_cache_append_packed(fj_context *ctx, const fj_tensor *k_new,
                                    const fj_tensor *v_new, const fj_tensor *cu_seqlens_new,
                                    fj_tensor *k_cache, fj_tensor *v_cache,
                                    const fj_tensor *page_table, const fj_tensor *seqused_k,
                                    void *stream)
{
    if (ctx && !cu_seqlens_new) {
        fj__begin_call(ctx);
        return fj__fail(&ctx->err, FJ_ERR_INVALID_ARGUMENT,
                        "cu_seqlens_new is NULL: packed new tokens need their offsets");
    }
    return fj_kv_cache_append_quantized(ctx, k_new, v_new, cu_seqlens_new, NULL, NULL, k_cache,
                                        v_cache, page_table, seqused_k, stream);
}
