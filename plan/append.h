/* A validated append to a paged KV cache (fj_kv_cache_append): what its plan and parameter block
** are made from. */
#ifndef FJ_PLAN_APPEND_H
#define FJ_PLAN_APPEND_H

#include "../core/core.h"

typedef struct fj__append_problem {
    const fj_tensor *k_new, *v_new;     /* [batch, tokens, heads_kv, head_dim (head_dim_v)] */
    const fj_tensor *k_cache, *v_cache; /* [num_pages, page_size, heads_kv, ...] */
    const fj_tensor *page_table;        /* I32 [batch, max_pages] */
    const fj_tensor *seqused_k;         /* I32 [batch]: where each sequence's new keys start */
    int64_t batch, tokens, heads_kv, head_dim, head_dim_v, num_pages, page_size, max_pages;
    fj_dtype dtype;
} fj__append_problem;

#endif /* FJ_PLAN_APPEND_H */
