/* Internal declarations shared by the runtime's files. Nothing here is public API. */
#ifndef FJ_RUNTIME_INTERNAL_H
#define FJ_RUNTIME_INTERNAL_H

#include "flashjit.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "backend.h"

/* Frees p (NULL is fine) and clears it, so a pointer is never freed twice. */
#define FJ_FREE(p)                                                                                 \
    do {                                                                                           \
        free(p);                                                                                   \
        (p) = NULL;                                                                                \
    } while (0)

#if defined(__GNUC__)
#define FJ_PRINTF(fmt, args) __attribute__((format(printf, fmt, args)))
#else
#define FJ_PRINTF(fmt, args)
#endif

/* ---- errors ---------------------------------------------------------------------------- */

/* Formats the detail of a failure into err and returns status, so a failing path is one line:
** `return fj__fail(err, FJ_ERR_INVALID_ARGUMENT, "q.ndim = %d, expected 4", n);` */
fj_status fj__fail(fj__err *err, fj_status status, const char *fmt, ...) FJ_PRINTF(3, 4);
/* Appends text to err's message (used to attach a warning to an otherwise successful call). */
void fj__append(fj__err *err, const char *fmt, ...) FJ_PRINTF(2, 3);

/* ---- small utilities ------------------------------------------------------------------- */

/* Monotonic wall-clock time in milliseconds. */
double fj__now_ms(void);
/* SHA-256 of data; hex is 65 bytes (64 digits and a NUL). */
void fj__sha256_hex(const void *data, size_t size, char hex[65]);
/* strdup that returns NULL on NULL input or allocation failure. */
char *fj__strdup(const char *s);
/* The name used in variant keys and messages: "f16", "bf16", "f32", ... */
const char *fj__dtype_name(fj_dtype dtype);
const char *fj__backend_name(fj_backend_kind kind);
/* t as [batch, seq, heads, dim]: a packed [total, heads, dim] tensor as one batch of total rows. */
fj_tensor fj__tensor_4d(const fj_tensor *t);
/* The default kernel cache path ($FLASHJIT_CACHE, $XDG_CACHE_HOME/..., ~/.cache/...); malloc'd. */
char *fj__default_cache_path(void);

/* ---- a validated request --------------------------------------------------------------- */

/* Everything fj_attention_forward() needs once the arguments are checked: sizes, tensors and the
** resolved options (defaults applied, causal folded into the window). */
typedef struct fj__problem {
    int64_t batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, head_dim_v;
    fj_dtype dtype;
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
} fj__problem;

/* Checks every argument of a forward call and fills *p. The message in err names the first bad
** field and its value. */
fj_status fj__validate_forward(const fj_attention_desc *desc, const fj_tensor *q,
                               const fj_tensor *k, const fj_tensor *v, const fj_tensor *out,
                               const fj_tensor *lse, fj__problem *p, fj__err *err);

/* ---- variants: what changes the generated code ----------------------------------------- */

/* The kernel designs the templates provide. */
/* FWD: the forward kernels; CLASSIFY: block classes of masks (attn_classify.lua), a pre-pass
** of the Hopper forward. */
typedef enum fj__kernel_family { FJ__FAMILY_FWD = 1, FJ__FAMILY_CLASSIFY = 2 } fj__kernel_family;

/* The kernel designs of a family. */
typedef enum fj__kernel_path {
    FJ__PATH_SIMT = 0, /* portable: one thread per query row (OpenCL; CUDA f32 and unaligned) */
    FJ__PATH_MMA = 1,  /* CUDA tensor cores, mma.sync (sm_80+) */
    FJ__PATH_WGMMA = 2 /* Hopper: TMA, warp specialisation, wgmma (sm_90a) */
} fj__kernel_path;

/* Everything that changes generated code and nothing else: two requests with equal variants
** share a kernel. Always zero the struct before filling it; it is compared with memcmp. */
typedef struct fj__variant {
    int32_t family;       /* fj__kernel_family */
    int32_t backend;      /* fj_backend_kind */
    int32_t path;         /* fj__kernel_path */
    int32_t dtype;        /* fj_dtype of q, k, v, out */
    int32_t head_dim_pad; /* head_dim rounded up to a multiple of 16 */
    int32_t head_dim_v_pad;
    int32_t tile_m;     /* query rows per block */
    int32_t tile_n;     /* keys per streamed tile */
    int32_t threads;    /* threads (work-items) per block */
    int32_t warps;      /* MMA, WGMMA: warps per block (threads / 32) */
    int32_t kk_unroll;  /* MMA: unroll factor of the S = Q K^T k-loop (0: full) */
    uint8_t q_in_regs;  /* MMA: Q fragments stay in registers across key tiles */
    uint8_t local_mask; /* causal or sliding window: per-element masking near the diagonal */
    uint8_t softcap;    /* tanh soft-capping of scores */
    uint8_t write_lse;
    uint8_t neg_scale;    /* softmax_scale < 0 (maxima must be taken on scaled scores) */
    uint8_t stages;       /* WGMMA: key/value tiles in flight (shared-memory ring slots) */
    uint8_t q_stages;     /* WGMMA: Q buffers (2: the next work tile's Q loads during this one) */
    uint8_t ctas_per_sm;  /* WGMMA: blocks sharing an SM (2: of one consumer warpgroup each) */
    uint8_t exp_poly;     /* WGMMA: of every 8 score column blocks, those whose exp2 is a
                          ** polynomial on the FMA pipe (0: all on the MUFU unit) */
    uint8_t lazy_rescale; /* WGMMA: a row's exponent base moves only when its maximum outgrows
                          ** it by 2^8, so O is rarely rescaled */
    uint8_t overlap;      /* WGMMA: the softmax of a tile overlaps P V of the previous one */
    uint8_t pingpong;     /* WGMMA: the two consumer warpgroups take turns issuing products */
    uint8_t persistent;   /* WGMMA: 0 a block per work tile; a block per SM taking 1 every
                          ** gridDim.x-th tile, 2 tiles from a counter shared by the grid, or
                          ** 3 tiles dealt zigzag by rounds */
    uint8_t alibi;        /* ALiBi slopes */
    uint8_t bias;         /* additive bias: 0 none, 1 f32, 2 in q's dtype */
    uint8_t mask_tensor;
    uint8_t varlen;       /* 0 dense, 1 packed sequences, 2 and seqused_k */
    uint8_t mask_ranges;  /* 0 none, else the ranges' columns per key (2 or 4) */
    uint8_t block_mask;   /* 128 x 128 block classes given */
    uint8_t bias_tma;     /* WGMMA: bias tiles copied by TMA into shared memory with K's */
    const char *mask_mod; /* canonical expression texts, interned by the context (NULL: none) */
    const char *score_mod;
} fj__variant;

/* The template the variant renders with, and the kernel's entry point. */
const char *fj__variant_template(const fj__variant *v);
const char *fj__variant_entry(const fj__variant *v);
/* Which design runs, for reports: "opencl.fwd", "cuda.fwd.mma", ... */
const char *fj__variant_path(const fj__variant *v);

/* Chooses the kernel path and tile configuration (the heuristic of autotune/) and fills a whole
** variant. config, when not NULL, overrides tile fields ("tile_m=64,tile_n=32"; see
** fj__parse_config). */
void fj__plan_forward(const fj__problem *p, const fj_device_info *dev, const char *config,
                      fj__variant *v);
/* The grid of a zigzag-scheduled (persistent = 3) launch of v on a device of sms blocks at
** once: of the grids from sms down by an eighth, the one whose deal of p's work tiles has the
** smallest largest share under a cost model of the band (the work count when it is smaller).
** Counting an odd round and a short last one, the full grid can deal 10 % more to its busiest
** block than the mean. */
uint32_t fj__zigzag_grid(const fj__problem *p, const fj__variant *v, uint32_t sms);
/* Whether v's tiles are consistent and fit the device (shared memory, threads). */
int fj__variant_fits(const fj__variant *v, const fj_device_info *dev);
/* Writes v's tile fields as "tile_m=128,tile_n=64,warps=4,kk_unroll=1,q_in_regs=0" (MMA),
** "path=wgmma,tile_m=128,tile_n=128,warps=12,stages=2" (WGMMA). */
void fj__variant_config(const fj__variant *v, char *buf, size_t size);
/* Applies "name=value,..." overrides of tile fields (tile_m, tile_n, warps, q_in_regs,
** kk_unroll, stages) to v. "path=mma|wgmma" is accepted and ignored here: it steers
** fj__plan_forward. Returns 0, or -1 naming the first bad item in err. */
int fj__apply_config(fj__variant *v, const char *config, fj__err *err);
/* Dynamic shared memory a launch of v needs, in bytes. */
uint32_t fj__variant_shared_bytes(const fj__variant *v);
/* Whether v masks by element beyond the band (mask_mod, mask tensor, ranges): on the Hopper
** kernel these are classified and skipped by 128 x 128 blocks. */
int fj__variant_element_masks(const fj__variant *v);
/* Bytes of one bias element of v (0 without a bias). */
uint32_t fj__variant_bias_bytes(const fj__variant *v);

#endif /* FJ_RUNTIME_INTERNAL_H */
