/* What every planner shares: workspaces and steps, and filling a step's parameter block from the
** request of the plan's kind. */
#include <string.h>

#include "plan.h"

void fj__variant_from_features(fj__variant *v, int family, const fj__features *f,
                               const fj_device_info *dev)
{
    memset(v, 0, sizeof *v);
    v->family = family;
    v->backend = dev->backend;
    v->path = FJ__PATH_SIMT;
    v->q_dtype = f->q_dtype;
    v->kv_dtype = f->kv_dtype;
    v->out_dtype = f->out_dtype;
    v->acc_dtype = FJ_DTYPE_F32;
    /* Padded to multiples of 16 (the tensor-core k step) so that nearby head dims share a
    ** kernel; the padding lanes are masked at load and store. */
    v->head_dim_pad = fj__round_up(f->head_dim, 16);
    v->head_dim_v_pad = fj__round_up(f->head_dim_v, 16);
}

void fj__variant_score_fields(fj__variant *v, const fj__features *f)
{
    v->local_mask = f->window_left >= 0 || f->window_right >= 0;
    v->softcap = f->softcap;
    v->neg_scale = f->neg_scale;
    v->descale = f->descale;
    v->mask_mod = f->mask_mod;
    v->score_mod = f->score_mod;
    v->alibi = f->alibi;
    v->bias = f->bias_dtype < 0 ? 0 : f->bias_dtype == FJ_DTYPE_F32 ? 1 : 2;
    v->mask_tensor = f->mask;
    v->mask_ranges = f->ranges;
    v->block_mask = f->block_mask;
}

/* A workspace of `bytes` at the end of a part of the arena that holds *part bytes so far. */
static int add_workspace(fj__plan *plan, size_t bytes, size_t *part, int counters)
{
    const int i = plan->nworkspaces++;
    fj__workspace *w = &plan->workspaces[i];
    memset(w, 0, sizeof *w);
    w->bytes = bytes;
    w->counters = counters;
    w->offset = *part;
    *part += (bytes + FJ__WORKSPACE_ALIGN - 1) / FJ__WORKSPACE_ALIGN * FJ__WORKSPACE_ALIGN;
    return i;
}

int fj__plan_add_workspace(fj__plan *plan, size_t bytes)
{
    return add_workspace(plan, bytes, &plan->workspace_bytes, 0);
}

int fj__plan_add_counters(fj__plan *plan, size_t bytes)
{
    return add_workspace(plan, bytes, &plan->counter_bytes, 1);
}

fj__step *fj__plan_add_step(fj__plan *plan, fj__step_kind kind)
{
    fj__step *s = &plan->steps[plan->nsteps++];
    memset(s, 0, sizeof *s);
    s->kind = kind;
    s->workspace = -1;
    s->skip_if_memo = -1;
    s->block[0] = s->block[1] = s->block[2] = 1;
    s->grid[0] = s->grid[1] = s->grid[2] = 1;
    return s;
}

fj_status fj__plan_fill(const fj__plan *plan, int i, int run, const void *request,
                        void *const *ws, fj__tmap_fn tmap, void *tmap_ud, void *params,
                        fj__err *err)
{
    const fj__playout *layout = fj__variant_layout(&plan->steps[i].variant);
    if (layout->size > FJ__MAX_PARAMS_BYTES)
        return fj__fail(err, FJ_ERR_BACKEND, "%s is %zu bytes, more than %d", layout->name,
                        layout->size, FJ__MAX_PARAMS_BYTES);
    /* Zeroed whole: padding included, so equal requests give equal bytes. */
    memset(params, 0, layout->size);
    if (plan->kind == FJ__PLAN_MERGE) {
        fj__merge_fill(plan, i, request, ws, params);
        return FJ_OK;
    }
    if (plan->kind == FJ__PLAN_APPEND) {
        fj__append_fill(request, params);
        return FJ_OK;
    }
    if (plan->kind == FJ__PLAN_BACKWARD) {
        const fj__bwd_problem *p = request;
        if (plan->steps[i].variant.family == FJ__FAMILY_CLASSIFY) /* the forward's classifier */
            return fj__fwd_fill(plan, i, &p->f, ws, tmap, tmap_ud, params);
        return fj__bwd_fill(plan, i, run, request, ws, tmap, tmap_ud, params);
    }
    return fj__fwd_fill(plan, i, request, ws, tmap, tmap_ud, params);
}
