/* A validated append to a paged KV cache (fj_kv_cache_append): what its plan and parameter block
** are made from. */
#ifndef FJ_PLAN_APPEND_H
#define FJ_PLAN_APPEND_H

#include "../core/core.h"

typedef struct fj__append_problem {
    /* [batch, tokens, heads_kv, head_dim (head_dim_v)], or packed [tokens, heads_kv, ...] with
    ** cu_seqlens_new I32 [batch + 1] (sequence b's tokens from row cu_seqlens_new[b]) */
    const fj_tensor *k_new, *v_new, *cu_seqlens_new;
    int64_t new_strides[2][3];          /* k_new's and v_new's batch (0 packed), token, head */
    const fj_tensor *k_cache, *v_cache; /* [num_pages, page_size, heads_kv, ...] */
    const fj_tensor *page_table;        /* I32 [batch, max_pages] */
    const fj_tensor *seqused_k;         /* I32 [batch]: where each sequence's new keys start */
    int64_t batch, tokens, heads_kv, head_dim, head_dim_v, num_pages, page_size, max_pages;
    /* (tokens: packed, of all sequences together) */
    fj_dtype dtype;     /* the caches' */
    fj_dtype new_dtype; /* k_new's and v_new's: dtype (copied as bits), or rounded into it */
    /* An FP8 cache's descale factors for k and v (NULL: 1), f32 [1], [heads_kv] or [batch,
    ** heads_kv], and their batch and head strides (0 where absent): new values are divided by
    ** them. */
    const fj_tensor *descale[2];
    int64_t descale_stride[2][2];
} fj__append_problem;

#endif /* FJ_PLAN_APPEND_H */
