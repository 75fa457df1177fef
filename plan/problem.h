/* A validated request (fj__problem) and the part of it that plans depend on (fj__features).
** The planner reads features only: two requests with equal features get the same plan, so the
** runtime memoises plans by comparing features, and nothing the planner reads can be missing
** from that comparison. */
#ifndef FJ_PLAN_PROBLEM_H
#define FJ_PLAN_PROBLEM_H

#include "../core/core.h"

/* Everything an attention call needs once its arguments are checked: sizes, tensors and the
** resolved options (defaults applied, causal folded into the window). */
typedef struct fj__problem {
    int64_t batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, head_dim_v;
    fj_dtype q_dtype, kv_dtype, out_dtype; /* per role: q; k and v; out */
    const fj_tensor *q, *k, *v, *out, *lse;
    float scale;                              /* resolved softmax scale */
    float softcap;                            /* 0: off */
    int32_t window_left;                      /* -1: unbounded */
    int32_t window_right;                     /* -1: unbounded; 0 when causal */
    const char *mask_mod_src, *score_mod_src; /* as given (NULL: none); parsed by the caller */
    const void *mod_args;
    int64_t mod_args_count;
    /* Set once parsed: canonical C texts, owned by the context (NULL: none). */
    const char *mask_mod, *score_mod;
    const char *score_mod_grad; /* d(score_mod)/ds as C text; NULL: none, or too long */
    int mask_mod_reads_args; /* the mask_mod reads mod_args (arg[] or iarg[]) */
    /* Score terms (NULL: none). Broadcast dimensions have stride 0 in the strides below. */
    const fj_tensor *alibi, *bias, *mask;
    int64_t alibi_stride_b; /* slopes of batch b start at b * alibi_stride_b */
    /* Batch, row and head strides of q, k, v, out (batch 0 when packed) and lse's batch, head
    ** and row strides, whatever the tensors' ranks. */
    int64_t strides[4][3];
    int64_t lse_stride[3];
    /* Variable lengths: batch is the number of sequences, seqlen_q/k their maxima. */
    const fj_tensor *cu_seqlens_q, *cu_seqlens_k, *seqused_k; /* NULL: not packed */
    int64_t bias_stride[3]; /* batch, head, query row; keys are contiguous */
    int64_t mask_stride[3];
    const fj_tensor *mask_ranges; /* FlashMask column ranges, or NULL */
    int64_t ranges_stride[3];     /* batch, head, key */
    const fj_tensor *block_mask;  /* 128 x 128 block classes, or NULL */
    int64_t blocks_stride[3];     /* batch, head, query block */
    int32_t num_splits;           /* decode: the caller's split count (0: the plan's) */
    int32_t deterministic;        /* backward: no floating-point atomics in a varying order */
    /* FP8 inputs' descale factors of q, k, v (NULL: 1) with their batch and kv head strides
    ** (0 for a single factor). */
    const fj_tensor *descale[3];
    int64_t descale_stride[3][2];
    /* A paged KV cache (NULL: none): k and v are pages (their strides above: page, row in the
    ** page, head), seqlen_k is the most keys a sequence can have, seqused_k its count. */
    const fj_tensor *page_table;
    int64_t num_pages, page_size;
} fj__problem;

/* A validated backward: the forward's problem and the gradients' tensors with their batch, row
** and head strides (dout, dq, dk, dv). */
typedef struct fj__bwd_problem {
    fj__problem f;
    const fj_tensor *dout, *dq, *dk, *dv;
    int64_t grad_strides[4][3];
    const fj_tensor *dbias; /* NULL: not asked for */
    int64_t dbias_extent[3]; /* its batch, head and row extents (1: summed over; 0: no dbias) */
} fj__bwd_problem;

/* The tensors of a problem by role, in the order of fj__features' per-tensor flags. */
enum { FJ__T_Q, FJ__T_K, FJ__T_V, FJ__T_OUT };

/* What plans depend on: shapes, dtypes, which options are on, and the few properties of the
** tensors' addresses and strides that decide which kernel can read them. A flat struct of
** numbers, zeroed before it is filled and compared with memcmp. */
typedef struct fj__features {
    int64_t batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, head_dim_v;
    int32_t q_dtype, kv_dtype, out_dtype;
    int32_t bias_dtype; /* -1: no bias */
    int32_t window_left, window_right;
    uint8_t softcap, neg_scale, lse;
    uint8_t alibi, mask, block_mask;
    uint8_t varlen;      /* 0 dense, 1 packed sequences, 2 and seqused_k */
    uint8_t ranges;      /* 0, or the ranges' columns per key (2 or 4) */
    uint8_t rows_16b[4]; /* q, k, v, out: rows of whole 16-byte chunks (tensor-core copies) */
    uint8_t tma[3];      /* q, k, v: bulk tensor copies can read them */
    uint8_t bias_tma;    /* bulk tensor copies can read the bias's tiles */
    uint8_t mask_mod_reads_args;
    uint8_t classes_by_b, classes_by_h; /* element masks differ by batch / by head */
    int32_t num_splits;                 /* decode: the caller's split count (0: automatic) */
    uint8_t paged;                      /* k and v are pages of a KV cache */
    int64_t page_size;                  /* (paged) keys a page */
    uint8_t few_rows; /* paged, packed queries of at most FJ__DECODE_MAX_SEQLEN_Q rows a
                      ** sequence on average (mostly decode rows, whatever the longest) */
    const char *mask_mod, *score_mod;   /* interned canonical texts: equal texts, equal pointers */
    const char *score_mod_grad;         /* its derivative's (interned with it), or NULL */
    int64_t dbias_extent[3]; /* backward: the bias's gradient's batch, head and row extents
                             ** (1: summed over; 0: no gradient) */
    uint8_t grads_16b; /* backward: dout, dq, dk, dv have rows of whole 16-byte chunks */
    uint8_t dout_tma;  /* backward: bulk tensor copies can read dout */
    uint8_t deterministic; /* backward: no floating-point atomics in a varying order */
    uint8_t descale;       /* FP8 inputs: descale factors given */
    uint8_t v_in_k;        /* v is a view of k's first head_dim_v dims (MLA's latent cache) */
} fj__features;

/* Fills *f from p (zeroing it first). */
void fj__features_of(const fj__problem *p, fj__features *f);
/* Fills *f from a backward request: its forward's features, and the gradients'. */
void fj__bwd_features_of(const fj__bwd_problem *p, fj__features *f);

#endif /* FJ_PLAN_PROBLEM_H */
