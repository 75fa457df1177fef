/* The float64 reference, a plain low-precision attention for the error bar, host-side dtype
** conversions, and a harness that runs one forward case on a context and checks every element.
** Used by the CLI (`flashjit run`), the tests and the benchmarks. */
#ifndef FJ_TOOLS_CHECK_REFERENCE_H
#define FJ_TOOLS_CHECK_REFERENCE_H

#include "flashjit.h"

#include <stddef.h>
#include <stdint.h>

/* ---- host dtype conversions (round to nearest even) ---------------------------------------- */
uint16_t fjr_f32_to_bf16(float x);
float fjr_bf16_to_f32(uint16_t x);
uint16_t fjr_f32_to_f16(float x);
float fjr_f16_to_f32(uint16_t x);
/* FP8 (f8e4m3: no infinities, S.1111.111 NaN; f8e5m2: IEEE-like); to FP8 saturates to the largest
** finite value. */
float fjr_fp8_to_f32(fj_dtype dtype, uint8_t x);
uint8_t fjr_f32_to_fp8(fj_dtype dtype, float x);
/* x rounded to dtype and back to float. */
float fjr_round(fj_dtype dtype, float x);
/* Stores x as one element of dtype at dst / reads one element. */
void fjr_store(fj_dtype dtype, void *dst, float x);
float fjr_load(fj_dtype dtype, const void *src);

/* ---- the problem --------------------------------------------------------------------------- */
typedef struct fjr_problem {
    int64_t batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, head_dim_v;
    double scale;                          /* resolved: never 0 */
    double softcap;                        /* 0: off */
    int causal, window_left, window_right; /* as in fj_attention_desc */
    const struct fj__expr *mask_mod;       /* parsed expressions (runtime/expr.h), or NULL */
    const struct fj__expr *score_mod;
    const void *mod_args; /* host copy of the expressions' arguments */
    int64_t mod_args_count;
    int exact_mods;       /* 1: expressions in double precision (finite differences); 0: as
                          ** the kernels round them */
    /* Score terms, host copies (NULL: none); broadcast dimensions have stride 0. */
    const float *alibi; /* slope of (b, h) at b * alibi_stride_b + h */
    int64_t alibi_stride_b;
    fj_dtype bias_dtype;
    const void *bias; /* bias of (b, h, i, j) at the strides below, in bias_dtype */
    int64_t bias_stride[4];
    const unsigned char *mask; /* nonzero keeps (b, h, i, j) */
    int64_t mask_stride[4];
    int64_t batch_offset;  /* added to b where expressions, ALiBi, the bias, the masks, the
                           ** block classes and the bias's gradient see it (one sequence of a
                           ** batch solved as a problem of its own) */
    const int32_t *ranges; /* FlashMask column ranges of (b, h, j) at the strides below */
    int64_t ranges_stride[3];
    int ranges_n;          /* 2 or 4 */
    const int32_t *blocks; /* block classes of (b, h, i / 128, j / 128) at the strides below
                           ** (batch, head, query block; key blocks contiguous) */
    int64_t blocks_stride[3];
    /* The backward's bias gradient (NULL: none), zeroed by the caller: double for
    ** fjr_attention_backward, float for _lowp; (b, h, i, j) adds into b * dbias_stride[0] +
    ** h * dbias_stride[1] + i * dbias_stride[2] + j (stride 0: summed over). */
    void *dbias;
    int64_t dbias_stride[3];
} fjr_problem;

/* Whether query row i of (batch b, head h) sees key j, straight from the API's definition. */
int fjr_visible(const fjr_problem *p, int64_t b, int64_t h, int64_t i, int64_t j);
/* Forward FLOPs as FlashAttention counts them (see bench/RESULTS.md). */
double fjr_flops(const fjr_problem *p);

/* Attention in float64. q [b, sq, hq, d], k [b, sk, hkv, d], v [b, sk, hkv, dv] dense;
** out [b, sq, hq, dv], lse [b, hq, sq] (may be NULL). */
void fjr_attention(const fjr_problem *p, const double *q, const double *k, const double *v,
                   double *out, double *lse);
/* The gradients of attention in float64, from dout [b, sq, hq, dv]: dq like q, dk and dv like k
** and v (summed over each kv head's query heads); through score_mod by its derivative with
** respect to s (fj__expr_eval_grad); and the bias's into p->dbias when set. */
void fjr_attention_backward(const fjr_problem *p, const double *q, const double *k,
                            const double *v, const double *dout, double *dq, double *dk,
                            double *dv);
/* The gradients' magnitudes: fjr_attention_backward with every factor of every term by its
** absolute value (dS = P (|dP| + |D|)). A float implementation's rounding error in an element
** scales with it, also where dP - D cancels and the gradient itself is near 0. */
void fjr_attention_backward_magnitude(const fjr_problem *p, const double *q, const double *k,
                                      const double *v, const double *dout, double *dq,
                                      double *dk, double *dv);
/* The plain low-precision backward the error bar is measured against: float arithmetic on the
** rounded inputs, P and dS rounded to dtype, D = rowsum(dO O) from O rounded to dtype (as the
** forward stores it), the gradients rounded to dtype. */
void fjr_attention_backward_lowp(const fjr_problem *p, fj_dtype dtype, const float *q,
                                 const float *k, const float *v, const float *dout, float *dq,
                                 float *dk, float *dv);

/* The dtype of the output of inputs in dtype: bf16 for FP8 inputs, else dtype itself. */
fj_dtype fjr_out_dtype(fj_dtype dtype);

/* The plain low-precision attention the error bar is measured against: scores and softmax in
** float32, P rounded to dtype before P.V, output rounded to fjr_out_dtype(dtype). Same
** layouts, float data. */
void fjr_attention_lowp(const fjr_problem *p, fj_dtype dtype, const float *q, const float *k,
                        const float *v, float *out);

/* Merged attention states in float64 (fj_attention_merge's definition): states s < n hold rows
** r < rows of dv elements at outs[s][r * dv + d] and log-sum-exps at lses[s * rows + r]; out
** [rows, dv] and lse [rows] (may be NULL) get the merge. Empty states (lse -inf) weigh nothing;
** a row of empty states is 0 with lse -inf; a NaN or +inf lse makes the row NaN. */
void fjr_merge(int n, const double *const *outs, const double *lses, int64_t rows, int64_t dv,
               double *out, double *lse);

/* ---- the harness --------------------------------------------------------------------------- */
typedef enum fjh_layout {
    FJH_LAYOUT_BSHD = 0,  /* dense [batch, seq, heads, dim] */
    FJH_LAYOUT_BHSD = 1,  /* dense [batch, heads, seq, dim], passed through strides */
    FJH_LAYOUT_PADDED = 2 /* [batch, seq, heads, dim] with gaps between rows, heads and batches */
} fjh_layout;

typedef struct fjh_case {
    int64_t batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, head_dim_v;
    fj_dtype dtype;
    fj_attention_desc desc;
    fjh_layout layout;
    int with_lse;
    uint64_t seed;         /* 0: a fresh seed from the clock */
    int timing_reps;       /* > 0: also time this many calls after the check (median) */
    int skip_check;        /* 1: no reference (timing only) */
    int tune;              /* 1: fj_attention_tune the request first (result in fjh_result.tune),
                           ** and with backward fj_attention_backward_tune (in bwd_tune); 2: the
                           ** backward only */
    const float *mod_args; /* host values of desc.mod_args (uploaded by the harness), or NULL */
    int64_t mod_args_count;
    /* Score terms the harness makes (random values) and passes in desc: */
    int alibi;    /* 0 none, 1 slopes [heads_q], 2 [batch, heads_q] */
    int bias;     /* 0 none, 1 [b, hq, sq, sk], 2 [1, hq, sq, sk], 3 [b, hq, sq, sk] with head
                  ** and row strides 0 (a key bias) */
    int bias_f32; /* the bias in f32 rather than the case's dtype */
    int mask;     /* 0 none, 1 random [b, hq, sq, sk] (a quarter masked, one row entirely), 2 key
                  ** padding [b, 1, 1, sk] (batch b masks its last b/3 of the keys) */
    int varlen;   /* 1: packed sequences of random lengths up to seqlen_q / seqlen_k (sequence 1
                  ** empty), through cu_seqlens; 2: also seqused_k. With paged: the queries
                  ** packed (cu_seqlens_q), the keys the pages' */
    int ranges;   /* 2: random masked row ranges [b, hq, sk, 2]; 4: two per key, [1, hq, sk, 4] */
    int blocks;   /* 1: random block classes (0 / 1 / 2) [b, hq, qb, kb]; 2: [1, 1, qb, kb] */
    int paged;    /* > 0: k and v as a paged KV cache of pages of this many keys, in a shuffled
                  ** page order with spare pages; sequences of seqlen_k, 0, 1 and random keys
                  ** (seqused_k); unused rows and pages hold NaN */
    int v_in_k;   /* 1: v is a view of k's first head_dim_v dims (MLA's latent cache) */
    int backward; /* 1: also fj_attention_backward from a random dout, its dq, dk, dv checked
                  ** (dense cases with lse) */
    int dbias;    /* with backward and bias: also desc.dbias (f32, the bias's broadcast
                  ** dimensions summed), checked (dense cases) */
    int kv_fp8;   /* 0, or the FP8 dtype (FJ_DTYPE_F8_E4M3 / _E5M2) k and v are stored in: an
                  ** FP8 KV cache read by q in dtype (16-bit), out in dtype */
    int append;   /* > 0 with paged (not v_in_k): each sequence's last `append` keys (all where
                  ** it has fewer) are written by fj_kv_cache_append (packed with varlen; an FP8
                  ** cache's quantised from dtype with descale factors) after the host's copy */
} fjh_case;

typedef struct fjh_result {
    fj_status status;
    char error[1024];
    uint64_t seed;
    double max_abs_err;      /* max |out - ref| over all elements */
    double ref_max_abs;      /* max |ref| */
    double rel_err;          /* max_abs_err / ref_max_abs */
    double lowp_max_abs_err; /* the plain low-precision implementation's max error */
    double rounding_atol;    /* twice the dtype's rounding error of an add at the output's size */
    double lse_max_err;      /* max |lse - ref| where finite */
    /* The backward's dq, dk, dv and dbias: max errors, the plain implementation's, the
    ** references' max magnitudes (when the case asked for them). */
    double grad_err[4], grad_lowp_err[4], grad_max[4];
    int64_t bad_elements;    /* outputs non-finite, unwritten, or lse not -inf where it must be */
    int64_t clobbered;       /* bytes outside the output views that changed */
    int pass;
    char why[256];      /* the failed criterion */
    fj_call_info first; /* report of the first call (strings copied below) */
    char variant[2048];
    char kernel_path[64];
    char launched[256];       /* the first call's launches (fj_call_info.launched) */
    char bwd_kernel_path[64]; /* the backward's main step's, when the case ran one */
    double first_call_ms; /* host time of the first call, synchronised */
    double kernel_ms;     /* median of timing_reps synchronised calls */
    double tflops;
    double bwd_kernel_ms; /* the same of the backward, when the case ran one */
    double bwd_tflops;    /* FlashAttention's count: 2.5 x the forward's */
    fj_tune_result tune; /* when the case asked for tuning */
    fj_tune_result bwd_tune; /* the backward's, when the case asked for tuning and a backward */
    int32_t bwd_tuned;       /* the backward call's fj_call_info.tuned */
} fjh_result;

/* The short name of a case's dtype: "bf16", "f16", "f32", "e4m3", "e5m2". */
const char *fjh_dtype_name(fj_dtype dtype);

/* Initialises a case with the defaults (one small bf16 problem). */
void fjh_case_init(fjh_case *c);
/* A case with the defaults but this shape (d the head dim of q, k and v) and dtype. */
fjh_case fjh_case_of(int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q,
                     int64_t heads_kv, int64_t head_dim, fj_dtype dtype);
/* Makes fresh random inputs, runs the forward on ctx with poisoned outputs, and checks every
** element against the float64 reference: f32 needs rel_err <= 1e-5, f16/bf16 an error no more
** than twice the plain low-precision implementation's. Returns the library's status. */
fj_status fjh_run(fj_context *ctx, const fjh_case *c, fjh_result *r);
/* What running c needs, in bytes (an upper estimate): host memory (inputs, copies, the
** reference) and device memory. The harness ends the process with a message when a host
** allocation fails; callers refuse problems that cannot fit first. */
void fjh_memory(const fjh_case *c, double *host_bytes, double *device_bytes);
/* A one-line description of a case, for logs. */
void fjh_describe(const fjh_case *c, char *buf, size_t size);

#endif /* FJ_TOOLS_CHECK_REFERENCE_H */
