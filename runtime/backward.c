/* fj_attention_backward and fj_attention_backward_tune: validate (the forward's checks, then
** the gradients'), plan (with the bucket's tuned tiles where a record exists) and run; and the
** tuner's view of a backward request. */
#include <string.h>

#include "../autotune/tune.h"
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

/* ---- tuning: the tuner's view of a backward request ---------------------------------------- */
/* A candidate is the dk/dv variant of a plan; the plan applies its config to both tensor-core
** (or SIMT) stages, as $FLASHJIT_BWD_CONFIG. */

/* Whether plan took config's tiles: the planner ignores tiles that do not fit, and the dk/dv
** variant's own config then differs. */
static int plan_takes(const fj__plan *plan, const char *config)
{
    char applied[128];
    fj__variant_config(&plan->steps[plan->main_step].variant, applied, sizeof applied);
    return strcmp(applied, config) == 0;
}

/* The plan of candidate c, which must take c's config (else the tuner would time the
** heuristic again under another name). */
static fj_status plan_candidate(const fj__tuning *t, const fj__tune_candidate *c, fj__plan *plan)
{
    char config[128];
    fj__variant_config(&c->v, config, sizeof config);
    fj_status st = fj__plan_backward(t->f, &t->ctx->device, config, plan, &t->ctx->err);
    if (st == FJ_OK && !plan_takes(plan, config))
        st = fj__fail(&t->ctx->err, FJ_ERR_UNSUPPORTED, "the plan does not take %s", config);
    return st;
}

/* Tunes p's bucket on ctx; heuristic: the dk/dv variant of the heuristic's plan. The
** candidates must reproduce dq, dk and dv. */
static fj_status bwd_tune(fj_context *ctx, const fj__bwd_problem *p, const fj__features *f,
                          const fj__variant *heuristic, void *stream, fj_tune_result *r)
{
    const fj__tuning t = {.ctx = ctx, .request = p, .stream = stream, .f = f,
                          .plan = plan_candidate, .outputs = {p->dq, p->dk, p->dv}};
    return fj__tune_request(&t, heuristic, r);
}

/* ---- the backward ----------------------------------------------------------------------- */

/* The plan of a validated request: $FLASHJIT_BWD_CONFIG's tiles where set; else the bucket's
** tuned record's, or (under FJ_TUNE_ON_MISS) the winner of tuning it now; else the
** heuristic's (plan, as planned without a config). */
static fj_status plan_tuned(fj_context *ctx, const fj__bwd_problem *p, fj__plan *plan,
                            void *stream)
{
    if (ctx->bwd_config)
        return FJ_OK;
    fj__features f;
    fj__bwd_features_of(p, &f);
    const fj__variant heuristic = plan->steps[plan->main_step].variant;
    const char *tuned = fj__tuned_config(&ctx->tuned, ctx->cache, ctx->fingerprint, &f, &heuristic);
    if (!tuned && ctx->tune_policy == FJ_TUNE_ON_MISS) {
        fj_tune_result r = {.struct_size = sizeof r};
        fj_status st = bwd_tune(ctx, p, &f, &heuristic, stream, &r);
        if (st != FJ_OK)
            return st;
        tuned = fj__tuned_config(&ctx->tuned, ctx->cache, ctx->fingerprint, &f, &heuristic);
        ctx->last_call.tuned = 2;
    }
    fj__plan t;
    fj__err ignored;
    /* A record that does not fit (from another library version, say) changes nothing. */
    if (tuned && fj__plan_backward(&f, &ctx->device, tuned, &t, &ignored) == FJ_OK &&
        plan_takes(&t, tuned)) {
        *plan = t;
        if (!ctx->last_call.tuned)
            ctx->last_call.tuned = 1;
    }
    return FJ_OK;
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
        st = plan_tuned(ctx, &p, &plan, stream);
    if (st == FJ_OK)
        st = fj__plan_run(ctx, &plan, &p, stream);
    ctx->last_call.total_ms = fj__now_ms() - t0;
    return st;
}

fj_status fj_attention_backward_tune(fj_context *ctx, const fj_attention_desc *desc,
                                     const fj_tensor *q, const fj_tensor *k, const fj_tensor *v,
                                     const fj_tensor *out, const fj_tensor *dout,
                                     const fj_tensor *lse, fj_tensor *dq, fj_tensor *dk,
                                     fj_tensor *dv, void *stream, fj_tune_result *result)
{
    if (!ctx)
        return FJ_ERR_INVALID_ARGUMENT;
    fj__begin_call(ctx);
    if (result && result->struct_size != sizeof *result)
        return fj__fail(&ctx->err, FJ_ERR_INVALID_ARGUMENT,
                        "result.struct_size = %zu, expected sizeof(fj_tune_result) = %zu",
                        result->struct_size, sizeof *result);
    fj__bwd_problem p;
    fj__plan plan;
    fj_status st = fj__plan_backward_request(desc, q, k, v, out, dout, lse, dq, dk, dv,
                                             &ctx->device, NULL, &ctx->mods, &p, &plan, &ctx->err);
    if (st == FJ_OK)
        st = fj__validate_backward_memory(&p, ctx->ops, ctx->backend, &ctx->err);
    if (st != FJ_OK)
        return st;
    fj__features f;
    fj__bwd_features_of(&p, &f);
    fj_tune_result local = {.struct_size = sizeof local};
    return bwd_tune(ctx, &p, &f, &plan.steps[plan.main_step].variant, stream,
                    result ? result : &local);
}
