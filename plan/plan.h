/* Plans: a request becomes an ordered list of steps (kernel launches, workspace memsets) and
** the workspaces they share, taken from the runtime's per-stream arena. Planning is a pure
** function of the request's features and the device; filling a step's parameter block turns the
** plan and the request's arguments into the bytes a launch passes. Nothing here runs anything.
**
** The forward plan: [zero the tile counter] [classify the masks' blocks] forward.
** The decode plan: the decode kernel, and with split keys a merge of the splits' states (a
** merge step, or within the kernel: variant.merge_last).
** The merge plan: one merge of up to 8 states, or a chain of them through an f32 workspace.
** The append plan: one launch writing new keys and values into a paged KV cache.
** The backward plan: D = rowsum(dout * out), then dk and dv, then dq [, then dbias]. */
#ifndef FJ_PLAN_PLAN_H
#define FJ_PLAN_PLAN_H

#include "append.h"
#include "families.h"
#include "merge.h"
#include "problem.h"
#include "variant.h"

#define FJ__MAX_STEPS 10 /* a merge of 64 states chains 9 */
#define FJ__MAX_WORKSPACES 6 /* a forward's: 16-bit q, k, v copies, classes, a counter */
#define FJ__MAX_GRID_DIM_Y 65535 /* of a launch's second and third grid dimensions */
#define FJ__DECODE_MAX_SEQLEN_Q 16 /* query rows per sequence the decode kernel takes */

typedef enum fj__step_kind {
    FJ__STEP_KERNEL = 1, /* launch variant's kernel */
    FJ__STEP_MEMSET = 2  /* zero a workspace */
} fj__step_kind;

typedef struct fj__step {
    fj__step_kind kind;
    fj__variant variant; /* KERNEL */
    uint32_t grid[3], block[3];
    uint32_t shared_bytes;
    int workspace;    /* MEMSET: the workspace zeroed */
    int skip_if_memo; /* KERNEL: skipped when this workspace (>= 0) still holds what an equal
                      ** plan wrote into it (see fj__workspace.memo); -1: never skipped */
    uint8_t overlap_previous; /* KERNEL: fj__launch's (its template waits for the previous
                              ** kernel's writes before reading them) */
    int32_t runs; /* KERNEL: launched this many times in turn, its block filled for each run
                  ** (0: once); a run sees the writes of the runs before it */
} fj__step;

/* The alignment an arena's memory must have: the widest access a kernel makes to a workspace
** (16-byte vectors, bulk reductions); workspaces start FJ__WORKSPACE_ALIGN bytes apart in it. */
#define FJ__ARENA_ALIGN 16
#define FJ__WORKSPACE_ALIGN 256

typedef struct fj__workspace {
    size_t bytes;
    size_t offset; /* in the arena, FJ__WORKSPACE_ALIGN-byte aligned */
    /* memo: what the steps write here depends on memo_key alone, so a later run of a plan with
    ** the same key, offset and arena may skip the steps that write it. */
    int memo;
    int64_t memo_key[6];
    /* counters: not scratch but counters that are zero at every launch and that the plan's
    ** kernels leave zero (each one's last user resets it). They lie in the arena's zeroed part
    ** (runtime/exec.c), which nothing else writes, so a plan needs no memset step for them;
    ** offset is in that part. */
    int counters;
} fj__workspace;

/* What a plan computes, and so which request fills its steps' blocks (fj__plan_fill). */
typedef enum fj__plan_kind {
    FJ__PLAN_FORWARD = 0, /* from an fj__problem */
    FJ__PLAN_MERGE = 1,   /* from an fj__merge_problem */
    FJ__PLAN_APPEND = 2,  /* from an fj__append_problem */
    FJ__PLAN_BACKWARD = 3 /* from an fj__bwd_problem */
} fj__plan_kind;

typedef struct fj__plan {
    int32_t kind; /* fj__plan_kind */
    int nsteps, nworkspaces;
    fj__step steps[FJ__MAX_STEPS];
    fj__workspace workspaces[FJ__MAX_WORKSPACES];
    size_t workspace_bytes; /* the arena the plan needs */
    size_t counter_bytes;   /* the arena's zeroed counters it needs (fj__workspace.counters) */
    int main_step;          /* the step that computes the result (reports, tuning) */
    /* The forward's workspaces (-1: none): block classes and the tile counter, and how the
    ** classes are laid out (I32 [cls_batches, cls_heads, query blocks, key blocks], strides 0
    ** where the masks do not differ). */
    struct {
        int classes, counter;
        int dequant[3]; /* q's, k's and v's 16-bit copies (variant field dequant; steps 0-2) */
        int v_transposed; /* FP8 v transposed (variant field v_transposed; fp8_transpose_v) */
        int64_t v_keys;   /* its rows' keys: seqlen_k rounded up to 16 */
        int64_t cls_stride[3];
        int32_t cls_heads;
    } fwd;
    /* The merge's steps: step i merges the states from first[i] on (after the running state in
    ** the workspace, for every step but the first); the running state (-1: none, one step). */
    struct {
        int first[FJ__MAX_STEPS];
        int ws_out, ws_lse;
    } merge;
    /* The decode's split states (-1: one split, none), its splits, the keys of each, and the
    ** row tiles of each kv head's packed rows; with merge_last, the splits' arrivals (an int
    ** per block of a split: [batch, kv heads x row tiles]; -1: none). */
    struct {
        int ws_o, ws_l, arrivals;
        int32_t splits, keys_per_split, row_tiles;
    } decode;
    /* The backward's workspaces: D = rowsum(dout * out) and the lse in log2 units, each
    ** [batch, heads_q, seqlen_q]; dq's f32 sum, dq_slices slices [batch, heads_q, seqlen_q,
    ** head_dim_pad] of dq_slice floats (-1: dq is a stage of its own); a bias's gradient summed
    ** over rows in dbias_splits shares: their sums [splits, batches, heads, keys] (-1: one
    ** share, none). */
    struct {
        int delta, lse2, dq_acc, dbias_part;
        int32_t dbias_splits;
        int dq_turns; /* stage 2's turns (dq_turns): an int per (batch, head) and query tile */
        int32_t dq_slices;
        int64_t dq_slice;
    } bwd;
} fj__plan;

/* Building blocks of the planners (plan.c): a workspace (its index; 256-byte aligned in the
** arena), counters, and a step (zeroed, grid and block 1, no workspace, never skipped). */
int fj__plan_add_workspace(fj__plan *plan, size_t bytes);
/* Counters in the arena's zeroed part (fj__workspace.counters; 256-byte aligned there). */
int fj__plan_add_counters(fj__plan *plan, size_t bytes);
fj__step *fj__plan_add_step(fj__plan *plan, fj__step_kind kind);

/* Zeroes *v and fills what every family's variant takes from the request: the family, the
** backend, the SIMT path, the element types, f32 accumulation, head dims padded to 16. */
void fj__variant_from_features(fj__variant *v, int family, const fj__features *f,
                               const fj_device_info *dev);
/* Fills what decides a pair's score and whether it is seen, for the kernels that recompute
** scores (the forward's, the backward's): the band, soft-capping, the scale's sign, the
** expressions, ALiBi, the bias, the mask tensor, the ranges and the block classes. */
void fj__variant_score_fields(fj__variant *v, const fj__features *f);

static inline int64_t fj__div_up(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

static inline int32_t fj__round_up(int64_t x, int32_t to)
{
    return (int32_t)fj__div_up(x, to) * to;
}

/* The device's compute units (SMs), at least one (a device that reports none). */
static inline int64_t fj__compute_units(const fj_device_info *dev)
{
    return dev->compute_units > 0 ? dev->compute_units : 1;
}

/* A merge slot of states laid out contiguously: o [b, seqlen, heads, dv], l [b, heads, seqlen]
** (merge.c; the running state of a chained merge, the splits of a decode). */
void fj__merge_contiguous_slot(void *o, void *l, int64_t seqlen, int64_t heads, int64_t dv,
                               fj__merge_slot *S);
/* A merge step (merge.c) of `rows` (batch, row, head) rows: `inputs` states per launch (1 to
** FJ__MERGE_SLOTS; 0 for fj__plan_add_strided_merge_step's), slot 0's elements `first`, the
** others' `rest`, the result's `out`; write_lse: the result's lse is written. */
fj__step *fj__plan_add_merge_step(fj__plan *plan, fj_backend_kind backend, int inputs,
                                  fj_dtype first, fj_dtype rest, fj_dtype out, int write_lse,
                                  uint64_t rows);
/* A merge step of `states` f32 states at a fixed stride in one workspace (a decode's splits:
** inputs 0, a run-time count), rows of head_dim_v elements, whose columns are shared by
** work-groups along the grid's y and, with many states, each pair's states by several teams of a
** work-group (fj__merge_state_teams: fj_merge_params' state_teams). */
fj__step *fj__plan_add_strided_merge_step(fj__plan *plan, fj_backend_kind backend,
                                          int32_t states, fj_dtype out, int write_lse,
                                          uint64_t rows, int64_t head_dim_v);
/* The teams (of a merge work-group's four) that share a pair's strided states: 1, 2 or 4. */
int fj__merge_state_teams(int32_t states);
/* FJ_OK where a merge step takes `rows` (batch, row, head) rows (its row index is 32-bit), else
** FJ_ERR_UNSUPPORTED naming the count. */
fj_status fj__merge_rows_fit(uint64_t rows, fj__err *err);

/* Compute capability as major * 10 + minor from dev's arch ("sm_90a": 90); 0 when unknown. */
int fj__sm_version(const fj_device_info *dev);

/* The heuristic's forward variant for f on dev: kernel path and tile configuration. config,
** when not NULL, overrides tile fields ("tile_m=64,tile_n=32"; see fj__apply_config) where the
** result still fits. */
void fj__choose_forward(const fj__features *f, const fj_device_info *dev, const char *config,
                        fj__variant *v);
/* The key rows of one tensor-map copy of a paged cache into tiles of tile_n keys over pages of
** page_size keys (Hopper's paged forward, the mma decode kernel's tensor loader): a whole tile,
** or a whole page; 0 where neither fits. */
int32_t fj__page_rows(int32_t tile_n, int64_t page_size);
/* The forward plan of f on dev with kernel v (from fj__choose_forward, perhaps changed by a
** tuned record): its steps, grids and workspaces. Fails (FJ_ERR_UNSUPPORTED) only for masks too
** large for the block classifier's grid. */
fj_status fj__plan_forward(const fj__features *f, const fj_device_info *dev, const fj__variant *v,
                           fj__plan *plan, fj__err *err);

/* The decode variant for f on dev (decode.c): returns 1 and fills *v when a decode kernel
** serves f (at most FJ__DECODE_MAX_SEQLEN_Q rows per sequence, or any number against a paged
** cache or on the seesaw kernel (MLA's latent cache on sm_90a); no score terms or element masks,
** one element type, tiles that fit), else 0. On CUDA the tensor-core kernel where it serves,
** then the vector kernel (the one config "path=vec" asks for), then the portable one. */
int fj__choose_decode(const fj__features *f, const fj_device_info *dev, const char *config,
                      fj__variant *v);
/* Whether f runs on the decode kernel (filling *v) rather than fwd, the forward variant
** fj__choose_forward gave: where the decode kernel serves and fwd is the SIMT kernel, where the
** decode kernel is one of CUDA's (they read K and V at the bandwidth limit; the tensor-core
** forward kernels do not at one query row: bench/RESULTS.md), for a paged cache, or where config
** asks for it ("path=decode"). A config naming a forward path ("path=mma|wgmma|simt") keeps dense
** requests on the forward (comparisons). */
int fj__prefer_decode(const fj__features *f, const fj_device_info *dev, const char *config,
                      const fj__variant *fwd, fj__variant *v);
/* Applies config's tile overrides to the CUDA decode kernel v (tensor cores: tile_n=, stages=,
** q_in_regs=, ctas_per_sm= (else what the ring's shared memory allows), bulk= (a ring deeper
** than fj__decode_too_many_copies allows, asked without it, takes cp.async), swizzle= (where
** fj__decode_swizzle_fits, else none); vectors: stages=,
** ctas_per_sm=); the packed rows a block stay the plan's, and a config's splits= are the plan's
** (fj__config_splits). Returns 1 when v took them, 0 (v unchanged) when they do not apply or
** fit. */
int fj__decode_apply_config(fj__variant *v, const char *config, const fj_device_info *dev);
/* Sets the blocks an SM of tensor-core decode variant v (ctas_per_sm) to what its shared
** memory allows (at most 4, 3 with an FP8 cache, each reserving 1 KiB more); its registers are
** then bounded to allow them, and the plan's splits count on them. */
void fj__decode_mma_residency(fj__variant *v, const fj_device_info *dev);
/* Whether tensor-core decode variant v's ring keeps more bulk row copies outstanding than a
** block sustains (plan/decode.c's MAX_BULK_IN_FLIGHT: more ran at 0.6x on the H200); the
** tensor loader's panel copies (swizzle) are never too many. */
int fj__decode_too_many_copies(const fj__variant *v);
/* Whether tensor-core decode variant v can hold its ring's tiles in the 128-byte swizzle's
** 64-column panels (swizzle=1): 16-bit K and V of their own, head dims 64 or 128, Q in
** registers, copied by the copy engine (then by tensor maps, where fj__plan_decode finds that
** they can) or by cp.async columns. */
int fj__decode_swizzle_fits(const fj__variant *v);
/* The decode plan of f on dev with kernel v (from fj__choose_decode): splits (the caller's
** num_splits, or enough to fill the device), the kernel step, and the merge of the splits. */
fj_status fj__plan_decode(const fj__features *f, const fj_device_info *dev, const fj__variant *v,
                          fj__plan *plan, fj__err *err);

/* The plan of fj_block_mask_build: the classifier's one step writing f's block classes into
** the caller's tensor of the given batch and head extents (1: shared) and batch, head and
** query-block strides, which the request's problem holds as its block_mask. Fails naming
** classes.shape[0] or [1] where the masks differ by batch or head but the extent is 1. */
fj_status fj__plan_block_mask(const fj__features *f, const fj_device_info *dev,
                              const int64_t extent[2], const int64_t stride[3], fj__plan *plan,
                              fj__err *err);

/* The classifier variant for forward variant v's masks. */
void fj__classify_variant(const fj__variant *v, fj__variant *cv);

/* The grid of a zigzag-scheduled (persistent = 3) launch of v on a device of sms blocks at
** once: of the grids from sms down by an eighth, the one whose deal of f's work tiles has the
** smallest largest share under a cost model of the band (the work count when it is smaller).
** Counting an odd round and a short last one, the full grid can deal 10 % more to its busiest
** block than the mean. */
uint32_t fj__zigzag_grid(const fj__features *f, const fj__variant *v, uint32_t sms);

/* Encodes a tensor map for a parameter block (the runtime's, which asks the backend and keeps
** the last map of each role). role: FJ__MAP_*. */
typedef fj_status (*fj__tmap_fn)(void *ud, int role, const fj__tensor_map_desc *d,
                                 fj__tensor_map *out);
/* The roles of tensor maps: the forward's, then the backward's (apart, so that a training
** step's forward and backward keep their own). */
enum {
    FJ__MAP_Q, FJ__MAP_K, FJ__MAP_V, FJ__MAP_BIAS,
    FJ__MAP_BWD_Q, FJ__MAP_BWD_K, FJ__MAP_BWD_V, FJ__MAP_BWD_DOUT, FJ__MAP_BWD_DQ_ACC,
    FJ__MAP_DECODE_K, FJ__MAP_DECODE_V,
    FJ__MAP_ROLES
};
/* The TMA view of one [batch, seqlen, heads, dim] tensor (or packed [total, heads, dim]) for
** boxes of `rows` rows and one 128-byte panel of columns (fwd.c). The three outer dimensions
** are ordered by stride, as the driver expects of a tiled map (dimensions of one element go
** last, with any stride); *perm tells the kernel which slot holds the row (bits 0-1) and head
** (bits 2-3) coordinates. */
void fj__tensor_map_of(const fj_tensor *packed_or_4d, uint32_t rows, fj__tensor_map_desc *d,
                       int32_t *perm);

/* The merge plan of p on backend: its steps, grids and workspace. */
fj_status fj__plan_merge(const fj__merge_problem *p, fj_backend_kind backend, fj__plan *plan,
                         fj__err *err);

/* Adds the block classifier's step for variant v's element masks (fwd.c): classes of every
** 128 x 128 block into a workspace (plan->fwd.classes, laid out as cls_stride says), per batch
** and head only where the masks differ by them, which the kernels then read as their
** block_mask. Fails (FJ_ERR_UNSUPPORTED, nothing added) where the classifier's grid is too
** small for f. */
fj_status fj__plan_classes(const fj__features *f, const fj__variant *v, fj__plan *plan,
                           fj__err *err);

/* The backward plan of f on dev (bwd.c): D, then dk and dv, then dq (attn_bwd.lua; dk, dv and dq
** on tensor cores where attn_bwd_mma.cu.lua serves f). config (NULL: none; see
** $FLASHJIT_BWD_CONFIG in the README) overrides the tensor-core stages' tile_m, tile_n and
** warps where the result fits, the rows a block owns following the warps (16 each). */
fj_status fj__plan_backward(const fj__features *f, const fj_device_info *dev, const char *config,
                            fj__plan *plan, fj__err *err);

/* The plan of an append to a paged KV cache (append.c): one launch. */
fj_status fj__plan_append(const fj__append_problem *p, fj_backend_kind backend, fj__plan *plan,
                          fj__err *err);

/* Fills the parameter block of kernel step i of plan, its run `run` (0 where the step runs
** once), for its request (an fj__problem for a forward plan, an fj__merge_problem for a merge,
** an fj__append_problem for an append, an fj__bwd_problem for a backward; see plan->kind),
** whose workspaces start at ws[] (device pointers); params has room for FJ__MAX_PARAMS_BYTES. */
fj_status fj__plan_fill(const fj__plan *plan, int i, int run, const void *request,
                        void *const *ws, fj__tmap_fn tmap, void *tmap_ud, void *params,
                        fj__err *err);
/* The families' fills, which fj__plan_fill calls with the block zeroed (fwd.c, merge.c,
** decode.c); fj__fwd_fill hands a decode plan's steps to fj__decode_fill. */
fj_status fj__fwd_fill(const fj__plan *plan, int i, const fj__problem *p, void *const *ws,
                       fj__tmap_fn tmap, void *tmap_ud, void *params);
fj_status fj__decode_fill(const fj__plan *plan, int i, const fj__problem *p, void *const *ws,
                          fj__tmap_fn tmap, void *tmap_ud, void *params);
void fj__append_fill(const fj__append_problem *p, void *params);
fj_status fj__bwd_fill(const fj__plan *plan, int i, int run, const fj__bwd_problem *p,
                       void *const *ws, fj__tmap_fn tmap, void *tmap_ud, void *params);
/* The forward family's block of p (fwd.c), for the families that embed it. */
void fj__fill_fwd_params(const fj__plan *plan, const fj__problem *p, void *const *ws,
                         fj__fwd_params *F);
void fj__merge_fill(const fj__plan *plan, int i, const fj__merge_problem *p, void *const *ws,
                    void *params);

#endif /* FJ_PLAN_PLAN_H */
