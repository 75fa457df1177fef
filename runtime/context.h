/* The runtime's internal header: the context (one device of one backend, its loaded kernels,
** per-stream workspace arenas, memoised plans and the report of the last call) and the
** functions the runtime's files share. Nothing here is public API. */
#ifndef FJ_RUNTIME_CONTEXT_H
#define FJ_RUNTIME_CONTEXT_H

#include "../autotune/tune.h"
#include "../backend/backend.h"
#include "../cache/cache.h"
#include "../core/core.h"
#include "../plan/plan.h"
#include "build.h"

#define FJ__ARENAS 8

/* A kernel loaded in this context. */
typedef struct fj__kernel {
    fj__variant variant;
    void *handle;                   /* the backend's kernel object */
    char *key_text;                 /* canonical variant key: sorted name=value lines */
    char key_hash[65];              /* SHA-256 of key_text */
    int32_t registers, spill_bytes; /* per thread, read once at load (0: unknown) */
} fj__kernel;

/* The workspace arena of one stream: device memory that grows to the largest plan run on the
** stream and is never shrunk while the context lives (launches on one stream never overlap, so
** each plan may reuse it from offset 0). It remembers the memoised workspace the last plan left
** in it (fj__workspace.memo), so an equal plan can skip the steps that would write it again. */
typedef struct fj__arena {
    void *stream;
    void *mem;
    size_t bytes;
    /* The zeroed part: counters that are zero between the plans' launches (each plan's kernels
    ** leave them so: fj__workspace.counters), zeroed once when allocated or grown. */
    void *counters;
    size_t counter_bytes;
    int memo_valid;
    size_t memo_offset;
    int64_t memo_key[6];
} fj__arena;

struct fj_context {
    fj_context_options opts;
    char *cache_path; /* resolved path, or ":memory:" */
    char *config;     /* $FLASHJIT_CONFIG at creation: tile overrides, or NULL */
    char *bwd_config; /* $FLASHJIT_BWD_CONFIG at creation: the backward's, or NULL */
    fj_cache *cache;
    const struct fj_backend_ops *ops;
    void *backend;
    fj_device_info device;
    char *template_dir; /* $FLASHJIT_TEMPLATE_DIR at creation, or NULL: renders and keys agree */
    char template_hash[65];
    fj__err err;

    fj__kernel *kernels;
    size_t nkernels, capacity;
    size_t last_used; /* index of the kernel the previous call used: checked first */

    fj_call_info last_call;
    /* What the last call launched (fj__note_launch: a pointer each, cheap on the memoised
    ** path), and the text fj_context_last_call joins them into for last_call.launched. */
    const char *launches[16];
    int nlaunches;
    char launched[256];
    uint64_t compiles;

    int tune_policy;       /* fj_tune_policy after $FLASHJIT_TUNE */
    char fingerprint[512]; /* device identity tuning results are keyed by */
    fj__tune_memo *tuned;  /* buckets looked up so far, with their record (or none) */

    /* The previous forward's features and plan: an equal request reuses the plan. */
    fj__features last_features;
    fj__plan last_plan;
    int32_t last_plan_tuned;
    int last_plan_valid;

    fj__mods mods; /* mask/score expressions parsed so far, kept for the context's life:
                   ** variants point at their canonical texts */

    fj__arena arenas[FJ__ARENAS];
    int narenas, next_arena_victim;

    /* The last tensor maps of q, k, v and bias (Hopper kernel): a call on the same tensors as the
    ** previous one skips encoding them again. Bytes, not fj__tensor_map: a calloc'd context
    ** has no 64-byte alignment. */
    struct {
        int valid;
        fj__tensor_map_desc desc;
        unsigned char bytes[sizeof(fj__tensor_map)];
    } last_maps[FJ__MAP_ROLES];
};

/* ---- validation (validate.c) ---- */

/* Starts a call on ctx: clears the last error and the last call's report. */
void fj__begin_call(fj_context *ctx);
/* Adds `what` (a kernel path, or "memset": static text) to the last call's launches. */
void fj__note_launch(fj_context *ctx, const char *what);

/* Checks every argument of a merge (fj_attention_merge) and fills *p, naming the first bad
** argument in err. */
fj_status fj__validate_merge(const fj_tensor *outs, const fj_tensor *lses, int32_t n,
                             const fj_tensor *out, const fj_tensor *lse, fj__merge_problem *p,
                             fj__err *err);

/* Checks every argument of fj_attention_backward and fills *p (the forward's checks first). */
fj_status fj__validate_backward(const fj_attention_desc *desc, const fj_tensor *q,
                                const fj_tensor *k, const fj_tensor *v, const fj_tensor *out,
                                const fj_tensor *dout, const fj_tensor *lse, const fj_tensor *dq,
                                const fj_tensor *dk, const fj_tensor *dv, fj__bwd_problem *p,
                                fj__err *err);
fj_status fj__validate_backward_memory(const fj__bwd_problem *p,
                                       const struct fj_backend_ops *ops, void *backend,
                                       fj__err *err);

/* Checks every argument of fj_kv_cache_append_quantized (cu_seqlens_new NULL: dense new
** tokens; descale factors NULL: 1), which fj_kv_cache_append and _packed are too, and fills
** *p. */
fj_status fj__validate_append(const fj_tensor *k_new, const fj_tensor *v_new,
                              const fj_tensor *cu_seqlens_new, const fj_tensor *k_descale,
                              const fj_tensor *v_descale, const fj_tensor *k_cache,
                              const fj_tensor *v_cache, const fj_tensor *page_table,
                              const fj_tensor *seqused_k, fj__append_problem *p, fj__err *err);
/* The append's counterpart of fj__validate_memory. */
fj_status fj__validate_append_memory(const fj__append_problem *p, const struct fj_backend_ops *ops,
                                     void *backend, fj__err *err);

/* The merge's counterpart of fj__validate_memory. */
fj_status fj__validate_merge_memory(const fj__merge_problem *p, const struct fj_backend_ops *ops,
                                    void *backend, fj__err *err);

/* Checks every argument of a forward call and fills *p. The message in err names the first bad
** field and its value. */
fj_status fj__validate_forward(const fj_attention_desc *desc, const fj_tensor *q,
                               const fj_tensor *k, const fj_tensor *v, const fj_tensor *out,
                               const fj_tensor *lse, fj__problem *p, fj__err *err);

/* fj_block_mask_build's checks: desc's masks (at least one element mask, dense shapes), q and k
** as a forward's, classes as that forward's block_mask (errors name it "classes"); fills p
** with p->block_mask the classes. */
fj_status fj__validate_block_mask(const fj_attention_desc *desc, const fj_tensor *q,
                                  const fj_tensor *k, const fj_tensor *classes, fj__problem *p,
                                  fj__err *err);

/* Checks that every tensor of p lies in memory the backend's kernels may use (where the backend
** can tell: OpenCL can, CUDA accepts any pointer). */
fj_status fj__validate_memory(const fj__problem *p, const struct fj_backend_ops *ops, void *backend,
                              fj__err *err);

/* ---- kernels (kernels.c) ---- */

/* Finds the kernel of variant v: already loaded, or from a cache, or rendered, compiled and
** loaded now. Adds what it did to ctx->last_call (where the kernel came from, stage times). */
fj_status fj__kernel_get(fj_context *ctx, const fj__variant *v, const fj__kernel **out);
/* Spill bytes per thread of v's kernel, loaded (or compiled) now if need be; 0: none or
** unknown. */
int32_t fj__kernel_spills(fj_context *ctx, const fj__variant *v);
/* Makes the kernels of n variants loaded (memory, cache, or compiled now on several threads).
** status[i] and why[i] say what became of variant i; returns FJ_OK unless out of memory. */
fj_status fj__kernels_prepare(fj_context *ctx, const fj__variant *vs, int n, fj_status *status,
                              char (*why)[160]);
/* Makes the kernels of n plans ready at once (each distinct variant once, through
** fj__kernels_prepare). A plan whose status[i] is not FJ_OK on entry is skipped; otherwise
** status[i] and why[i] become those of the first of its kernels that failed. Returns FJ_OK
** unless out of memory. */
fj_status fj__plans_prepare(fj_context *ctx, const fj__plan *plans, int n, fj_status *status,
                            char (*why)[160]);
void fj__kernels_release(fj_context *ctx);

/* ---- plans (exec.c) ---- */

/* Runs plan for its request (an fj__problem or fj__merge_problem, by plan->kind) on stream:
** takes its workspaces from the stream's arena, then runs its steps in order. */
fj_status fj__plan_run(fj_context *ctx, const fj__plan *plan, const void *request, void *stream);
void fj__arenas_release(fj_context *ctx);

/* ---- tuning (attention.c, tuning.c) ---- */

/* The identity tuning records of ctx are keyed by: backend, device name, compute units, driver,
** arch, and the templates' hash. */
void fj__fingerprint(const fj_context *ctx, char *buf, size_t size);

/* The bytes of a tensor's storage, from its first element to its last. */
size_t fj__span_bytes(const fj_tensor *t);

/* One request as the tuner sees it (tuning.c): the request fj__plan_run takes (an fj__problem
** or fj__bwd_problem) on ctx and stream, its features (the bucket's, and the planner's input),
** how a candidate is planned, and the outputs the candidates must reproduce (in order; NULL
** ends them; the first's dtype is the comparison's). */
#define FJ__TUNING_OUTPUTS 3
typedef struct fj__tuning fj__tuning;
struct fj__tuning {
    fj_context *ctx;
    const void *request;
    void *stream;
    const fj__features *f;
    fj_status (*plan)(const fj__tuning *t, const fj__tune_candidate *c, fj__plan *out);
    const fj_tensor *outputs[FJ__TUNING_OUTPUTS];
};
/* Tunes t's bucket with heuristic's plan as the reference (fj__tune). */
fj_status fj__tune_request(const fj__tuning *t, const fj__variant *heuristic, fj_tune_result *r);

#endif /* FJ_RUNTIME_CONTEXT_H */
