/* A validated merge of attention states (fj_attention_merge): what its plan and parameter blocks
** are made from. */
#ifndef FJ_PLAN_MERGE_H
#define FJ_PLAN_MERGE_H

#include "../core/core.h"

/* The most states one call merges (in chained steps of up to 8; see plan.h). */
#define FJ__MERGE_MAX_STATES 64

typedef struct fj__merge_problem {
    int32_t n;                                /* states */
    const fj_tensor *outs, *lses;             /* n each: [b, s, h, dv] or packed [total, h, dv]; lse
                                              ** [b, h, s] or [h, total] */
    const fj_tensor *out, *lse;               /* the result (lse NULL: not written) */
    int64_t batch, seqlen, heads, head_dim_v; /* packed: batch 1, seqlen total */
    fj_dtype in_dtype, out_dtype;
} fj__merge_problem;

#endif /* FJ_PLAN_MERGE_H */
