/* The merge plan and its parameter blocks. Up to 8 states merge in one launch; more chain
** through a running state in an f32 workspace: the first step merges 8 states into it, each
** later step it and 7 more, the last step writing the result. */
#include <string.h>

#include "plan.h"

#define MERGE_THREADS 128 /* attn_merge.lua's work-group */
#define MERGE_LANES 32    /* attn_merge.lua's team: the lanes that share a (batch, row, head) pair */
#define MERGE_PAIRS (MERGE_THREADS / MERGE_LANES) /* pairs per work-group */

fj__step *fj__plan_add_merge_step(fj__plan *plan, fj_backend_kind backend, int inputs,
                                  fj_dtype first, fj_dtype rest, fj_dtype out, int write_lse,
                                  uint64_t rows)
{
    fj__step *s = fj__plan_add_step(plan, FJ__STEP_KERNEL);
    fj__variant *v = &s->variant;
    v->family = FJ__FAMILY_MERGE;
    v->backend = backend;
    v->path = FJ__PATH_SIMT;
    v->q_dtype = first;
    v->kv_dtype = rest;
    v->out_dtype = out;
    v->acc_dtype = FJ_DTYPE_F32;
    v->threads = MERGE_THREADS;
    v->inputs = inputs;
    v->write_lse = (uint8_t)write_lse;
    s->grid[0] = (uint32_t)fj__div_up((int64_t)rows, MERGE_PAIRS);
    s->block[0] = MERGE_THREADS;
    return s;
}

int fj__merge_state_teams(int32_t states)
{
    /* (a lane loads ROUND = 4 of its team's states' elements at once, attn_merge.lua: each
    ** round waits on memory, so one round up to 16 states, then a round more every 16) */
    return states > 8 ? MERGE_PAIRS : states > 4 ? 2 : 1;
}

fj_status fj__merge_rows_fit(uint64_t rows, fj__err *err)
{
    if (rows > INT32_MAX) /* attn_merge.lua's row index is 32-bit */
        return fj__fail(err, FJ_ERR_UNSUPPORTED,
                        "%llu (batch, row, head) rows to merge: at most %d",
                        (unsigned long long)rows, INT32_MAX);
    return FJ_OK;
}

fj__step *fj__plan_add_strided_merge_step(fj__plan *plan, fj_backend_kind backend,
                                          int32_t states, fj_dtype out, int write_lse,
                                          uint64_t rows, int64_t head_dim_v)
{
    fj__step *s =
        fj__plan_add_merge_step(plan, backend, 0, FJ_DTYPE_F32, FJ_DTYPE_F32, out, write_lse, rows);
    /* A work-group's teams take MERGE_PAIRS / teams pairs, a pair's states shared by `teams`;
    ** a row's columns across work-groups along y, a run of MERGE_LANES lanes each (a lane an
    ** element), so a single sequence's few rows still fill the device. */
    const int64_t pairs_per_group = MERGE_PAIRS / fj__merge_state_teams(states);
    s->grid[0] = (uint32_t)fj__div_up((int64_t)rows, pairs_per_group);
    s->grid[1] = (uint32_t)fj__div_up(head_dim_v, MERGE_LANES);
    return s;
}

fj_status fj__plan_merge(const fj__merge_problem *p, fj_backend_kind backend, fj__plan *plan,
                         fj__err *err)
{
    memset(plan, 0, sizeof *plan);
    plan->kind = FJ__PLAN_MERGE;
    plan->merge.ws_out = plan->merge.ws_lse = -1;
    const uint64_t pairs = (uint64_t)(p->batch * p->seqlen * p->heads);
    const fj_status st = fj__merge_rows_fit(pairs, err);
    if (st != FJ_OK)
        return st;
    if (p->n > FJ__MERGE_SLOTS) {
        plan->merge.ws_out =
            fj__plan_add_workspace(plan, (size_t)pairs * (size_t)p->head_dim_v * sizeof(float));
        plan->merge.ws_lse = fj__plan_add_workspace(plan, (size_t)pairs * sizeof(float));
    }
    int next = 0; /* the first state not merged yet */
    while (next < p->n) {
        const int first_step = next == 0;
        const int room = first_step ? FJ__MERGE_SLOTS : FJ__MERGE_SLOTS - 1;
        const int take = p->n - next < room ? p->n - next : room;
        const int last = next + take == p->n;
        plan->merge.first[plan->nsteps] = next;
        fj__plan_add_merge_step(plan, backend, first_step ? take : take + 1,
                                first_step ? p->in_dtype : FJ_DTYPE_F32, p->in_dtype,
                                last ? p->out_dtype : FJ_DTYPE_F32, last ? p->lse != NULL : 1,
                                pairs);
        next += take;
    }
    plan->main_step = plan->nsteps - 1;
    return FJ_OK;
}

/* A state's view in a slot: dense [b, s, h, dv] or packed [total, h, dv] (batch stride 0), and
** its lse [b, h, s] or [h, total] (NULL: none). */
static void slot_of(const fj_tensor *o, const fj_tensor *l, fj__merge_slot *S)
{
    const int packed = o->ndim == 3;
    S->o = o->data;
    S->o_sb = packed ? 0 : o->stride[0];
    S->o_ss = o->stride[packed ? 0 : 1];
    S->o_sh = o->stride[packed ? 1 : 2];
    if (!l)
        return;
    S->l = l->data;
    S->l_sb = packed ? 0 : l->stride[0];
    S->l_sh = l->stride[packed ? 0 : 1];
    S->l_ss = l->stride[packed ? 1 : 2];
}

void fj__merge_contiguous_slot(void *o, void *l, int64_t seqlen, int64_t heads, int64_t dv,
                               fj__merge_slot *S)
{
    S->o = o;
    S->l = l;
    S->o_sh = dv;
    S->o_ss = heads * dv;
    S->o_sb = seqlen * S->o_ss;
    S->l_ss = 1;
    S->l_sh = seqlen;
    S->l_sb = heads * seqlen;
}

/* The running state in the workspace. */
static void running_slot(const fj__merge_problem *p, void *out, void *lse, fj__merge_slot *S)
{
    fj__merge_contiguous_slot(out, lse, p->seqlen, p->heads, p->head_dim_v, S);
}

void fj__merge_fill(const fj__plan *plan, int i, const fj__merge_problem *p, void *const *ws,
                    void *params)
{
    fj__merge_params *M = params;
    fj__merge_slot *slots[FJ__MERGE_SLOTS] = {&M->in0, &M->in1, &M->in2, &M->in3,
                                              &M->in4, &M->in5, &M->in6, &M->in7};
    const fj__variant *v = &plan->steps[i].variant;
    void *run_o = plan->merge.ws_out >= 0 ? ws[plan->merge.ws_out] : NULL;
    void *run_l = plan->merge.ws_lse >= 0 ? ws[plan->merge.ws_lse] : NULL;
    int slot = 0;
    if (i > 0)
        running_slot(p, run_o, run_l, slots[slot++]);
    for (int s = plan->merge.first[i]; slot < v->inputs; s++)
        slot_of(&p->outs[s], &p->lses[s], slots[slot++]);
    if (i == plan->nsteps - 1)
        slot_of(p->out, p->lse, &M->dst);
    else
        running_slot(p, run_o, run_l, &M->dst);
    M->pairs = p->batch * p->seqlen * p->heads;
    M->seqlen = (int32_t)p->seqlen;
    M->heads = (int32_t)p->heads;
    M->head_dim_v = (int32_t)p->head_dim_v;
}
