/* fj_attention_forward and fj_attention_tune: validate, plan (memoised by the request's
** features), run the plan. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <string.h>

#include "../plan/expr.h"
#include "context.h"

/* A parsed expression: its source as given, and the tree with the canonical text. */
typedef struct fj__mod {
    char *src;
    int score; /* 1: parsed as score_mod */
    fj__expr *expr;
} fj__mod;

/* Finds the parsed expression of src in m, parsing it the first time. */
static fj_status find_mod(fj__mods *m, const char *field, const char *src, int score,
                          const fj__expr **out, fj__err *err)
{
    for (size_t i = 0; i < m->n; i++)
        if (m->items[i].score == score && strcmp(m->items[i].src, src) == 0) {
            *out = m->items[i].expr;
            return FJ_OK;
        }
    fj__expr *e = NULL;
    fj_status st = fj__expr_parse(field, src, score, &e, err);
    if (st != FJ_OK)
        return st;
    if (m->n == m->cap) {
        size_t cap = m->cap ? 2 * m->cap : 8;
        fj__mod *grown = realloc(m->items, cap * sizeof *grown);
        if (!grown) {
            fj__expr_free(e);
            return fj__fail(err, FJ_ERR_OUT_OF_MEMORY, "out of memory for an expression");
        }
        m->items = grown;
        m->cap = cap;
    }
    char *copy = fj__strdup(src);
    if (!copy) {
        fj__expr_free(e);
        return fj__fail(err, FJ_ERR_OUT_OF_MEMORY, "out of memory for an expression");
    }
    m->items[m->n++] = (fj__mod){.src = copy, .score = score, .expr = e};
    *out = e;
    return FJ_OK;
}

fj_status fj__mods_resolve(fj__mods *m, fj__problem *p, fj__err *err)
{
    const fj__expr *mask = NULL, *score = NULL;
    fj_status st = FJ_OK;
    if (p->mask_mod_src)
        st = find_mod(m, "mask_mod", p->mask_mod_src, 0, &mask, err);
    if (st == FJ_OK && p->score_mod_src)
        st = find_mod(m, "score_mod", p->score_mod_src, 1, &score, err);
    if (st != FJ_OK)
        return st;
    if ((fj__expr_uses_args(mask) || fj__expr_uses_args(score)) && p->mod_args_count == 0)
        return fj__fail(err, FJ_ERR_INVALID_ARGUMENT,
                        "desc.%s reads arg[] or iarg[] but desc.mod_args_count = 0",
                        fj__expr_uses_args(mask) ? "mask_mod" : "score_mod");
    p->mask_mod = mask ? fj__expr_text(mask) : NULL;
    p->mask_mod_reads_args = fj__expr_uses_args(mask);
    p->score_mod = score ? fj__expr_text(score) : NULL;
    p->score_mod_grad = score ? fj__expr_grad_text(score) : NULL;
    return FJ_OK;
}

void fj__mods_free(fj__mods *m)
{
    for (size_t i = 0; i < m->n; i++) {
        FJ_FREE(m->items[i].src);
        fj__expr_free(m->items[i].expr);
    }
    FJ_FREE(m->items);
    m->n = m->cap = 0;
}

fj_status fj__plan_request(const fj_attention_desc *desc, const fj_tensor *q, const fj_tensor *k,
                           const fj_tensor *v, const fj_tensor *out, const fj_tensor *lse,
                           const fj_device_info *dev, const char *config, fj__mods *mods,
                           fj__plan *plan, fj__err *err)
{
    fj__problem p;
    fj_status st = fj__validate_forward(desc, q, k, v, out, lse, &p, err);
    if (st == FJ_OK)
        st = fj__mods_resolve(mods, &p, err);
    if (st != FJ_OK)
        return st;
    fj__features f;
    fj__features_of(&p, &f);
    fj__variant var, dec;
    fj__choose_forward(&f, dev, config, &var);
    if (fj__prefer_decode(&f, dev, config, &var, &dec))
        return fj__plan_decode(&f, dev, &dec, plan, err);
    if (f.paged && !var.paged)
        return fj__fail(err, FJ_ERR_UNSUPPORTED, "no kernel serves this paged KV cache request");
    return fj__plan_forward(&f, dev, &var, plan, err);
}

/* The device, and the templates' hash: a record tuned with other kernels was measured on
** kernels this library no longer builds, so it is not taken (the bucket tunes again, or runs
** the heuristic). */
void fj__fingerprint(const fj_context *ctx, char *buf, size_t size)
{
    snprintf(buf, size, "%s|%s|%d|%s|%s|templates %.16s", ctx->ops->name, ctx->device.name,
             (int)ctx->device.compute_units, ctx->device.driver, ctx->ops->target(ctx->backend),
             ctx->template_hash);
}

/* ---- tuning: the tuner's view of this context ------------------------------------------- */

/* The plan of candidate c: a forward's, or a decode's with c's splits (0: the plan's). */
static fj_status candidate_plan(const fj__tuning *t, const fj__tune_candidate *c, fj__plan *plan)
{
    if (c->v.family != FJ__FAMILY_DECODE)
        return fj__plan_forward(t->f, &t->ctx->device, &c->v, plan, &t->ctx->err);
    fj__features g = *t->f;
    if (c->splits > 0)
        g.num_splits = c->splits;
    return fj__plan_decode(&g, &t->ctx->device, &c->v, plan, &t->ctx->err);
}

/* Tunes p's bucket on ctx (heuristic: the planned variant). */
static fj_status tune(fj_context *ctx, const fj__problem *p, const fj__features *f,
                      const fj__variant *heuristic, void *stream, fj_tune_result *r)
{
    const fj__tuning t = {.ctx = ctx, .request = p, .stream = stream, .f = f,
                          .plan = candidate_plan, .outputs = {p->out}};
    fj_status st = fj__tune_request(&t, heuristic, r);
    ctx->last_plan_valid = 0; /* the next call must see the new record */
    return st;
}

/* ---- the forward -------------------------------------------------------------------------- */

/* The bucket's tuned record for f under its planned variant v, or (under FJ_TUNE_ON_MISS) the
** winner of tuning it now (ctx->last_call.tuned 2); NULL for none. */
static const char *tuned_record(fj_context *ctx, const fj__problem *p, const fj__features *f,
                                const fj__variant *v, void *stream, fj_status *st)
{
    const char *tuned = fj__tuned_config(&ctx->tuned, ctx->cache, ctx->fingerprint, f, v);
    if (!tuned && ctx->tune_policy == FJ_TUNE_ON_MISS) {
        fj_tune_result r = {.struct_size = sizeof r};
        if ((*st = tune(ctx, p, f, v, stream, &r)) != FJ_OK)
            return NULL;
        tuned = fj__tuned_config(&ctx->tuned, ctx->cache, ctx->fingerprint, f, v);
        ctx->last_call.tuned = 2;
    }
    return tuned;
}

/* The plan a request runs with: the decode plan where fj__prefer_decode says, else the forward
** plan; of the heuristic's variant, a tuned record's, or (under FJ_TUNE_ON_MISS) the winner of
** tuning it now; $FLASHJIT_CONFIG overrides all of them. A decode's splits: desc.num_splits,
** else the config's or the record's, else the plan's. A record that does not fit (from another
** library version, say) is ignored. */
static fj_status plan_slow(fj_context *ctx, const fj__problem *p, const fj__features *f,
                           fj__plan *plan, void *stream)
{
    fj__variant v, dec;
    fj_status st = FJ_OK;
    fj__choose_forward(f, &ctx->device, ctx->config, &v);
    if (fj__prefer_decode(f, &ctx->device, ctx->config, &v, &dec)) {
        const char *config = ctx->config; /* fj__prefer_decode applied its tiles */
        if (!config) {
            config = tuned_record(ctx, p, f, &dec, stream, &st);
            if (st != FJ_OK)
                return st;
            if (config) { /* its tiles (CUDA's kernels) and splits */
                fj__decode_apply_config(&dec, config, &ctx->device);
                if (!ctx->last_call.tuned)
                    ctx->last_call.tuned = 1;
            }
        }
        fj__features g = *f;
        if (g.num_splits == 0)
            g.num_splits = fj__config_splits(config);
        return fj__plan_decode(&g, &ctx->device, &dec, plan, &ctx->err);
    }
    if (f->paged && !v.paged)
        return fj__fail(&ctx->err, FJ_ERR_UNSUPPORTED,
                        "no kernel serves this paged KV cache request");
    if (!ctx->config) {
        const char *tuned = tuned_record(ctx, p, f, &v, stream, &st);
        if (st != FJ_OK)
            return st;
        fj__variant t = v;
        if (tuned && fj__apply_config(&t, tuned, NULL) == 0 && fj__variant_fits(&t, &ctx->device)) {
            v = t;
            if (!ctx->last_call.tuned)
                ctx->last_call.tuned = 1;
        }
    }
    return fj__plan_forward(f, &ctx->device, &v, plan, &ctx->err);
}

/* The plan of p: the previous call's when the features are equal (tuning forgets it, so a new
** record takes effect at the next call). */
static fj_status plan_of(fj_context *ctx, const fj__problem *p, void *stream, const fj__plan **out)
{
    fj__features f;
    fj__features_of(p, &f);
    if (ctx->last_plan_valid && memcmp(&f, &ctx->last_features, sizeof f) == 0) {
        ctx->last_call.tuned = ctx->last_plan_tuned;
        *out = &ctx->last_plan;
        return FJ_OK;
    }
    ctx->last_plan_valid = 0;
    fj_status st = plan_slow(ctx, p, &f, &ctx->last_plan, stream);
    if (st != FJ_OK)
        return st;
    ctx->last_features = f;
    ctx->last_plan_tuned = ctx->last_call.tuned == 2 ? 1 : ctx->last_call.tuned;
    ctx->last_plan_valid = 1;
    *out = &ctx->last_plan;
    return FJ_OK;
}

/* Starts a call: clears the error and the report. */
fj_status fj_attention_forward(fj_context *ctx, const fj_attention_desc *desc, const fj_tensor *q,
                               const fj_tensor *k, const fj_tensor *v, fj_tensor *out,
                               fj_tensor *lse, void *stream)
{
    if (!ctx)
        return FJ_ERR_INVALID_ARGUMENT;
    double t0 = fj__now_ms();
    fj__begin_call(ctx);
    fj__problem p;
    fj_status st = fj__validate_forward(desc, q, k, v, out, lse, &p, &ctx->err);
    if (st == FJ_OK)
        st = fj__validate_memory(&p, ctx->ops, ctx->backend, &ctx->err);
    if (st == FJ_OK)
        st = fj__mods_resolve(&ctx->mods, &p, &ctx->err);
    const fj__plan *plan = NULL;
    if (st == FJ_OK)
        st = plan_of(ctx, &p, stream, &plan);
    if (st == FJ_OK)
        st = fj__plan_run(ctx, plan, &p, stream);
    ctx->last_call.total_ms = fj__now_ms() - t0;
    return st;
}

fj_status fj_attention_tune(fj_context *ctx, const fj_attention_desc *desc, const fj_tensor *q,
                            const fj_tensor *k, const fj_tensor *v, fj_tensor *out, fj_tensor *lse,
                            void *stream, fj_tune_result *result)
{
    if (!ctx)
        return FJ_ERR_INVALID_ARGUMENT;
    fj__begin_call(ctx);
    if (result && result->struct_size != sizeof *result)
        return fj__fail(&ctx->err, FJ_ERR_INVALID_ARGUMENT,
                        "result.struct_size = %zu, expected sizeof(fj_tune_result) = %zu",
                        result->struct_size, sizeof *result);
    fj__problem p;
    fj_status st = fj__validate_forward(desc, q, k, v, out, lse, &p, &ctx->err);
    if (st == FJ_OK)
        st = fj__validate_memory(&p, ctx->ops, ctx->backend, &ctx->err);
    if (st == FJ_OK)
        st = fj__mods_resolve(&ctx->mods, &p, &ctx->err);
    if (st != FJ_OK)
        return st;
    fj__features f;
    fj__features_of(&p, &f);
    /* The heuristic's kernel, as planned without a config: the decode's where it serves. */
    fj__variant var, dec;
    fj__choose_forward(&f, &ctx->device, NULL, &var);
    if (fj__prefer_decode(&f, &ctx->device, NULL, &var, &dec))
        var = dec;
    else if (f.paged && !var.paged)
        return fj__fail(&ctx->err, FJ_ERR_UNSUPPORTED,
                        "no kernel serves this paged KV cache request");
    fj_tune_result local = {.struct_size = sizeof local};
    return tune(ctx, &p, &f, &var, stream, result ? result : &local);
}
