/* What every planner shares: workspaces and steps, and filling a step's parameter block from the
** request of the plan's kind. */
#include <string.h>

#include "plan.h"

#define WORKSPACE_ALIGN 256 /* of every workspace in the arena */

int fj__plan_add_workspace(fj__plan *plan, size_t bytes)
{
    const int i = plan->nworkspaces++;
    fj__workspace *w = &plan->workspaces[i];
    memset(w, 0, sizeof *w);
    w->bytes = bytes;
    w->offset = plan->workspace_bytes;
    plan->workspace_bytes += (bytes + WORKSPACE_ALIGN - 1) / WORKSPACE_ALIGN * WORKSPACE_ALIGN;
    return i;
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

fj_status fj__plan_fill(const fj__plan *plan, int i, const void *request, void *const *ws,
                        fj__tmap_fn tmap, void *tmap_ud, void *params, fj__err *err)
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
        fj__bwd_fill(plan, request, ws, params);
        return FJ_OK;
    }
    return fj__fwd_fill(plan, i, request, ws, tmap, tmap_ud, params);
}
