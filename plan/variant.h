/* Variants: everything that changes a kernel's generated code, and nothing else. Two launches
** with equal variants share a binary; the variant's canonical key names that binary in caches.
** A variant belongs to a kernel family (forward, block classifier), which fixes its template,
** entry point and parameter block. */
#ifndef FJ_PLAN_VARIANT_H
#define FJ_PLAN_VARIANT_H

#include "../core/core.h"
#include "../templates/render.h"
#include "params.h"

/* The kernel families. FWD: the forward kernels (attn_fwd_*.lua); CLASSIFY: block classes of
** masks (attn_classify.lua), a step before the Hopper forward; MERGE: attention states combined
** by their log-sum-exps (attn_merge.lua); DECODE: forwards of a few query rows per sequence,
** grouped-query heads packed, keys split (attn_decode.lua); APPEND: keys and values written
** into a paged KV cache (kv_append.lua); BWD: the backward's stages (attn_bwd.lua); DEQUANT:
** FP8 q, k or v into 16-bit copies, a step before a 16-bit forward (fp8_dequant.lua);
** TRANSPOSE_V: FP8 v transposed, keys contiguous, a step before Hopper's FP8 forward
** (fp8_transpose_v.cu.lua). */
typedef enum fj__kernel_family {
    FJ__FAMILY_FWD = 1,
    FJ__FAMILY_CLASSIFY = 2,
    FJ__FAMILY_MERGE = 3,
    FJ__FAMILY_DECODE = 4,
    FJ__FAMILY_APPEND = 5,
    FJ__FAMILY_BWD = 6,
    FJ__FAMILY_DEQUANT = 7,
    FJ__FAMILY_TRANSPOSE_V = 8
} fj__kernel_family;

/* The kernel designs of the forward and decode families. */
typedef enum fj__kernel_path {
    FJ__PATH_SIMT = 0, /* portable: one thread per query row (OpenCL; CUDA f32 and unaligned) */
    FJ__PATH_MMA = 1,  /* CUDA tensor cores, mma.sync (sm_80+); DECODE too */
    FJ__PATH_WGMMA = 2, /* Hopper: TMA, warp specialisation, wgmma (sm_90a) */
    FJ__PATH_VECTOR = 3 /* DECODE on CUDA: keys in 16-byte vectors straight into registers */
} fj__kernel_path;

/* Always zero the struct before filling it: it is compared with memcmp. */
typedef struct fj__variant {
    int32_t family;  /* fj__kernel_family */
    int32_t backend; /* fj_backend_kind */
    int32_t path;    /* fj__kernel_path */
    /* Element types by role (fj_dtype): the query, the keys and values, the output, and the
    ** accumulators (f32). */
    int32_t q_dtype, kv_dtype, out_dtype, acc_dtype;
    int32_t head_dim_pad; /* head_dim rounded up to a multiple of 16 */
    int32_t head_dim_v_pad;
    int32_t tile_m;     /* query rows per block (DECODE: packed group rows; MMA 16, 32 or 64) */
    int32_t tile_n;     /* keys per streamed tile */
    int32_t threads;    /* threads (work-items) per block */
    int32_t inputs;     /* MERGE: the states one launch reads (slot 0's elements are q_dtype,
                        ** the others' kv_dtype; out_dtype the result's); 0: a run-time count
                        ** of strided states of q_dtype */
    int32_t warps;      /* MMA, WGMMA: warps per block (threads / 32) */
    int32_t kk_unroll;  /* MMA: unroll factor of the S = Q K^T k-loop (0: full) */
    uint8_t q_in_regs;  /* MMA: Q fragments stay in registers across key tiles */
    uint8_t local_mask; /* causal or sliding window: per-element masking near the diagonal */
    uint8_t softcap;    /* tanh soft-capping of scores */
    uint8_t write_lse;
    uint8_t neg_scale;    /* softmax_scale < 0 (maxima must be taken on scaled scores) */
    uint8_t stages;       /* WGMMA, DECODE MMA: key/value tiles in flight (shared-memory ring slots);
                          ** DECODE VECTOR: keys per lane group and chunk */
    uint8_t q_stages;     /* WGMMA: Q buffers (2: the next work tile's Q loads during this one) */
    uint8_t ctas_per_sm;  /* WGMMA: blocks sharing an SM (2: of one consumer warpgroup each);
                          ** DECODE (MMA, VECTOR): blocks per SM the registers must allow (0: any) */
    uint8_t exp_poly;     /* WGMMA: of every 8 score column blocks, those whose exp2 is a
                          ** polynomial on the FMA pipe (0: all on the MUFU unit) */
    uint8_t lazy_rescale; /* WGMMA: a row's exponent base moves only when its maximum outgrows
                          ** it by 2^8, so O is rarely rescaled */
    uint8_t score_parts;  /* FWD on WGMMA with FP8 q and k beyond one 128-column panel (head
                          ** dims 129-256): S's second panel summed apart and added in f32
                          ** (issue_qk of attn_fwd_wgmma.cu.lua says why), in this many parts
                          ** of the key tile (1: whole); 0 otherwise */
    uint8_t overlap;      /* WGMMA: the softmax of a tile overlaps P V of the previous one; BWD
                          ** stage 2: the element pass split around the products (where dS
                          ** needs only P, dP and D) */
    uint8_t pingpong;     /* WGMMA: the two consumer warpgroups take turns issuing products */
    uint8_t persistent;   /* WGMMA: 0 a block per work tile; a block per SM taking 1 every
                          ** gridDim.x-th tile, 2 tiles from a counter shared by the grid, or
                          ** 3 tiles dealt zigzag by rounds; BWD stage 2 (with a producer): 1
                          ** a block per SM taking every gridDim.x-th key block */
    uint8_t alibi;        /* ALiBi slopes */
    uint8_t bias;         /* additive bias: 0 none, 1 f32, 2 in q's dtype */
    uint8_t mask_tensor;
    uint8_t varlen;       /* 0 dense, 1 packed sequences, 2 and seqused_k */
    uint8_t mask_ranges;  /* 0 none, else the ranges' columns per key (2 or 4) */
    uint8_t block_mask;   /* 128 x 128 block classes given */
    uint8_t bias_tma;     /* WGMMA: bias tiles copied by TMA into shared memory with K's */
    uint8_t class_vote;   /* FWD on WGMMA with block classes: key tiles of class 0 passed over
                          ** many at a time (a consumer warp's 32 by a vote, the producer's 4 by
                          ** independent loads), not one dependent load each */
    uint8_t v_in_k;       /* v is a view of k's first dims, read from K's tiles (loaded once):
                          ** FWD on WGMMA with d_split, each block's value columns are the
                          ** first panels of its K tile; DECODE MMA, V is the K tile's first
                          ** columns */
    uint8_t d_split;      /* FWD on WGMMA: the two blocks of a cluster each hold half of the
                          ** head dim of Q and K and half of the value columns (dv_slices 2);
                          ** each computes S over its half, and the halves are added through
                          ** distributed shared memory (no block recomputes S); BWD stage 2 on
                          ** WGMMA (head dims beyond 128): the two warpgroups share 64 keys and
                          ** split the columns of dK and dV (attn_bwd_wgmma_split.cu.lua); on
                          ** MMA, pairs of warps share 32 keys and split S^T's queries and
                          ** dK's and dV's columns (attn_bwd_mma_grid.cu.lua) */
    uint8_t partial;      /* DECODE: writes each split's state to the workspace for a merge */
    uint8_t merge_last;   /* DECODE MMA on CUDA, partial: the last split of a block's rows to
                          ** finish merges the splits' states into out and lse itself (its
                          ** arrivals counted in the arena's zeroed counters), so the plan has
                          ** no merge step; opt-in ("merge_last=1"), kept by the plan where it
                          ** splits (bench/RESULTS.md: not yet faster than the step) */
    uint8_t split_dv;     /* DECODE MMA: a slab's warps split S's head dims and O's columns (the
                          ** parts of S added through shared memory), not the keys: value dims
                          ** beyond 256 */
    uint8_t bulk;         /* DECODE MMA: K and V rows by the bulk-copy engine (sm_90+), a ring
                          ** slot complete on its mbarrier, not by cp.async pieces; DECODE
                          ** WGMMA: K and V tiles by bulk tensor copies (tensor maps) */
    uint8_t swizzle;      /* DECODE MMA, by cp.async column copies or bulk: the ring's K and V
                          ** tiles in 64-column panels of the 128-byte swizzle, so each copy's
                          ** lines land whole; with bulk, a panel a copy by tensor maps
                          ** (fj__decode_swizzle_fits) */
    uint8_t descale;      /* FP8 inputs' descale factors are given (fj__fwd_params) */
    uint8_t dequant;      /* FWD (16-bit): the request's q, k and v are FP8, read from 16-bit
                          ** copies that the plan's DEQUANT steps make first (descale folded
                          ** in); the kernel itself is the 16-bit one (not a template
                          ** parameter) */
    uint8_t v_transposed; /* FWD on WGMMA with FP8: v comes transposed (keys contiguous, each
                          ** 16 in P's register order) from the plan's TRANSPOSE_V step, so TMA
                          ** brings P V's K-major operand straight into the ring: no staging
                          ** buffers, no transposing warps (dense requests) */
    uint8_t paged;        /* DECODE, FWD on WGMMA: k and v are pages of a KV cache found through
                          ** a table */
    uint8_t page_rows;    /* FWD on WGMMA, paged; DECODE by the mma kernel's tensor loader,
                          ** paged: the key rows of one tensor-map copy, a divisor of tile_n
                          ** and of the page size (fj__page_rows; 0 while the heuristic plans
                          ** the tiles) */
    uint8_t row_band;     /* DECODE with local_mask: each row tile bounds its keys by its own
                          ** rows' band, not the sequence's (a paged chunk of more rows than
                          ** decode takes: causal prefill reads half the keys) */
    uint8_t stage;        /* BWD: 1 D = rowsum(dout * out), 2 dk and dv, 3 dq, 4 dbias, 5 dq
                          ** from the f32 sum that stage 2 accumulated (grads 4), 6 dbias from
                          ** stage 4's shares of a sum over rows */
    uint8_t producer;     /* BWD stage 2 on WGMMA: warpgroup 0 copies (TMA) and gives its
                          ** registers to the computing warpgroups; `warps` counts it */
    uint8_t multicast;    /* DECODE WGMMA with bulk: the two row tiles of a kv head run as a
                          ** cluster pair, each block's bulk copies bringing half of a tile's
                          ** panels into both blocks (multicast), so L2 serves each tile once */
    uint8_t dq_turns;     /* BWD stage 2 on WGMMA, persistent and deterministic: the key blocks
                          ** add a query tile's dQ into the one sum in turns, key block order,
                          ** counted in the workspace (no slices) */
    uint8_t grads;        /* BWD stage 2 on MMA: what the launch writes, the sum of 1 dk, 2 dv
                          ** and 4 dq (added by atomics into an f32 workspace; with dk, whose
                          ** launch forms dS) */
    const char *mask_mod; /* canonical expression texts, interned by the context (NULL: none) */
    const char *score_mod;
    const char *score_mod_grad; /* BWD: score_mod's derivative with respect to s (interned) */
} fj__variant;

/* The decode kernel declares its shared memory statically: CUDA's limit for that. */
#define FJ__DECODE_MAX_SHARED (48 * 1024)
/* Key splits of a decode (the strided merge's states). */
#define FJ__DECODE_MAX_SPLITS 64

/* The template v renders with, its entry point, and its parameter block. */
const char *fj__variant_template(const fj__variant *v);
const char *fj__variant_entry(const fj__variant *v);
const fj__playout *fj__variant_layout(const fj__variant *v);
/* Which design runs, for reports: "opencl.fwd.simt", "cuda.fwd.mma", "cuda.classify", ... */
const char *fj__variant_path(const fj__variant *v);

/* Whether v is the Hopper decode kernel of two warpgroups and no copying one, whose softmaxes
** take turns under each other's products (attn_decode_seesaw.cu.lua: `warps` 8 on the decode
** family's wgmma path; 12 is attn_decode_wgmma.cu.lua's). */
int fj__decode_seesaw(const fj__variant *v);
/* Gives v (a decode on the wgmma path) the seesaw kernel's fixed shape: two warpgroups, two
** ring slots of 64-key tiles (32 where v is not read from k) by bulk tensor copies, none of the
** other kernel's options (fj__variant_fits checks the rest). */
void fj__decode_make_seesaw(fj__variant *v);
/* Whether v masks by element beyond the band (mask_mod, mask tensor, ranges): on the Hopper
** kernel these are classified and skipped by 128 x 128 blocks. */
int fj__variant_element_masks(const fj__variant *v);
/* Bytes of one bias element of v (0 without a bias). */
uint32_t fj__variant_bias_bytes(const fj__variant *v);
/* Shared memory of v in bytes: what a launch asks for as dynamic shared memory, except on the
** SIMT kernels, which declare it statically (their launches ask for none). The kernel checks its
** own layout against it (template parameter shared_bytes). */
uint32_t fj__variant_shared_bytes(const fj__variant *v);
/* The dynamic shared memory a launch of v asks for: fj__variant_shared_bytes, or 0 where the
** kernel declares its memory statically (the SIMT kernels, CUDA's vector decode kernel). */
uint32_t fj__variant_dynamic_shared_bytes(const fj__variant *v);
/* DECODE on the MMA path: who copies K and V into the ring (template parameter loader): the
** copy engine, "bulk" (a row a copy) or with swizzle "tensor" (a 64-column panel a copy by
** tensor maps: the kernel's parameters are then fj__decode_tma_params), else cp.async by
** threads: "columns" (each thread the same
** 16-byte column of rows: columns that divide the threads and the tile; paged, also a warp's
** 32 lanes, which look its rows' pages up), "wide_rows" (a warp a whole row: 256 dims and
** more) or "pieces" (any piece any thread); "" elsewhere. */
const char *fj__variant_decode_loader(const fj__variant *v);
/* DECODE on the VECTOR path: the lanes that hold one key (a power of two, 8 elements each). */
int fj__variant_decode_lanes(const fj__variant *v);
/* WGMMA: registers per consumer thread after the producer gives its own away (template
** parameter consumer_regs), and those the producer's warpgroup keeps (producer_regs: 24, the
** least the ISA allows; the FP8 forward's, whose warps 1-3 transpose value tiles, 56 up to 128
** value columns and 40 beyond, where the consumers need the rest; the decode's 48). */
int fj__variant_consumer_registers(const fj__variant *v);
int fj__variant_producer_registers(const fj__variant *v);
/* FWD on WGMMA with FP8 inputs: the staging buffers of value tiles before their transposition
** (template parameter v_stages: 4, or 2 beyond 128 value columns, where 2 fit beside the ring);
** 0 otherwise. */
int fj__variant_value_stages(const fj__variant *v);

/* FWD on WGMMA: the value columns split into this many slices of head_dim_v_pad / slices
** (a multiple of 64, at most 256: O's accumulators of a warpgroup), each slice a work tile of
** its own that recomputes S (head dims beyond 256), or with d_split the two blocks of a cluster
** that share S's work. 1 for every other variant. */
int fj__variant_dv_slices(const fj__variant *v);
/* The value slices (without d_split) of value columns padded to head_dim_v_pad: 1 up to 256,
** else ceil(head_dim_v_pad / 256). */
int fj__dv_slices_of(int32_t head_dim_v_pad);
/* WGMMA: the order of the work tiles, which the kernel follows and the zigzag grid's cost model
** simulates (template parameters batch_fastest, heavy_first). */
typedef struct fj__tile_order {
    int batch_fastest; /* batches run fastest (a bias or mask tensor, mostly shared by all
                       ** batches, is then read once through L2), else query blocks */
    int heavy_first;   /* query blocks from the last (the heaviest: a band, block classes) */
} fj__tile_order;
fj__tile_order fj__variant_tile_order(const fj__variant *v);
/* Whether v's tiles are consistent and fit the device (shared memory, threads, registers). */
int fj__variant_fits(const fj__variant *v, const fj_device_info *dev);

/* Writes v's tile fields as "tile_m=128,tile_n=64,warps=4,kk_unroll=1,q_in_regs=0" (MMA),
** "path=wgmma,tile_m=128,tile_n=128,warps=12,stages=2,..." (WGMMA), "tile_m=16,tile_n=64,
** stages=3,q_in_regs=1,ctas_per_sm=0" (DECODE on MMA), "stages=2,ctas_per_sm=0" (DECODE
** VECTOR). */
void fj__variant_config(const fj__variant *v, char *buf, size_t size);
/* Applies "name=value,..." overrides of tile fields (tile_m, tile_n, warps, q_in_regs,
** kk_unroll, stages, ...) to v. "path=mma|wgmma|simt|decode|vec" is accepted and ignored here:
** it steers fj__choose_forward, fj__prefer_decode and fj__choose_decode. Returns 0, or -1 naming the first bad item
** in err. */
int fj__apply_config(fj__variant *v, const char *config, fj__err *err);

/* Where the value of field `name` starts in a config ("name=" at its start or after a comma),
** or NULL where the config (NULL: none) does not set it. */
const char *fj__config_field(const char *config, const char *name);

/* A decode's key splits in a config ("splits=N", 1 to FJ__DECODE_MAX_SPLITS: a tuned record
** or $FLASHJIT_CONFIG), which fj__apply_config accepts and leaves to the plan; 0 for none. */
int32_t fj__config_splits(const char *config);

/* The most template parameters a variant has, with room to grow (fj__variant_params fills an
** array of this size). */
#define FJ__MAX_TPL_PARAMS 80

/* The template parameters of v, in a fixed order. Returns their number. */
int fj__variant_params(const fj__variant *v, tpl_param out[FJ__MAX_TPL_PARAMS]);
/* The key of v for a compile target: canonical text (malloc'd: sorted name=value lines, ending
** with a newline) and its SHA-256. */
fj_status fj__variant_key(const fj__variant *v, const char *target, const char *template_hash,
                          char **text, char hash[65], fj__err *err);
/* Renders v's kernel source, starting with key_text in a comment, from the embedded templates
** and those in folder template_dir (tpl_render; NULL: none). */
fj_status fj__variant_render(const fj__variant *v, const char *template_dir, const char *key_text,
                             char **source, fj__err *err);

#endif /* FJ_PLAN_VARIANT_H */
