/* The autotuner: shape buckets, the search space of tile configurations per kernel design, and
** the search itself (compile every candidate, run each plan on the request's own tensors, drop
** those that fail, spill or disagree with the heuristic, time the rest, keep the winner and
** every measurement in the cache). It runs nothing itself: the runtime lends it a narrow
** interface (fj__tune_host) that prepares and runs plans. */
#ifndef FJ_AUTOTUNE_TUNE_H
#define FJ_AUTOTUNE_TUNE_H

#include "../cache/cache.h"
#include "../plan/plan.h"

/* One point of the search: the plan's kernel variant (the backward's: its dk/dv variant) and,
** for a decode plan, the key splits (0: the plan's own choice). A record's config names both:
** the variant's tile fields (fj__variant_config), then ",splits=N" where splits is set. */
typedef struct fj__tune_candidate {
    fj__variant v;
    int32_t splits;
} fj__tune_candidate;
void fj__tune_candidate_config(const fj__tune_candidate *c, char *buf, size_t size);

/* What the tuner asks of whoever runs kernels. Every function returns an fj_status and
** describes a failure in the host's error (last_error). */
typedef struct fj__tune_host {
    void *ud;
    const fj_device_info *device;
    /* Makes the kernels of n candidates' plans ready (compiled on several threads where
    ** needed); status[i] and why[i] say what became of candidate i. */
    fj_status (*prepare)(void *ud, const fj__tune_candidate *cs, int n, fj_status *status,
                         char (*why)[160]);
    /* Runs the whole plan of candidate c on the request once and waits for it. */
    fj_status (*run)(void *ud, const fj__tune_candidate *c);
    /* Spill bytes per thread of v's kernel (0: none or unknown). */
    int32_t (*spills)(void *ud, const fj__variant *v);
    /* Copies the request's output (its storage span, bytes) to host memory. */
    fj_status (*read_output)(void *ud, void *host, size_t bytes);
    const char *(*last_error)(void *ud);
} fj__tune_host;

/* "fwd", "bwd" or "dec": the kind of v's plan (a forward, a backward whose dk/dv variant v is,
** or a decode), a column of the cache's tuning records. */
const char *fj__tune_kind(const fj__variant *v);

/* The shape bucket of f under its planned variant v (the backward's: its dk/dv variant, and
** the bucket notes whether the request is deterministic), e.g.
** "fwd.mma|bf16|d=128|dv=128|sq=4096|sk=4096|bh=64|mask=causal|softcap=0|neg=0" (a decode's:
** its query rows exactly and whether the cache is paged). Whether lse
** is written is not part of it: that is an epilogue store, and a record tuned either way serves
** calls of both kinds (`flashjit tune` tunes without lse). */
void fj__tune_bucket(const fj__features *f, const fj__variant *v, char *buf, size_t size);

/* Tuning records looked up so far (a bucket's config, or NULL for none), kept per context. */
typedef struct fj__tune_memo fj__tune_memo;
/* The tuned configuration of f's bucket under its planned variant v (fj__tune_bucket, of v's
** kind): from the memo, else the cache (then remembered); NULL when there is none. The string
** is owned by the memo. */
const char *fj__tuned_config(fj__tune_memo **memo, fj_cache *cache, const char *fingerprint,
                             const fj__features *f, const fj__variant *v);
void fj__tune_memo_free(fj__tune_memo **memo);

/* Tunes f's bucket with heuristic's plan as the reference (see fj_attention_tune and
** fj_attention_backward_tune). out_dtype and out_bytes describe the output span the candidates
** must reproduce (the backward's: dq, dk and dv one after the other). A bucket with a record
** returns it (from_record = 1). The winner goes to the cache and the memo. */
fj_status fj__tune(const fj__tune_host *h, fj__tune_memo **memo, fj_cache *cache,
                   const char *fingerprint, const fj__features *f, const fj__variant *heuristic,
                   fj_dtype out_dtype, size_t out_bytes, fj_tune_result *r, fj__err *err);

#endif /* FJ_AUTOTUNE_TUNE_H */
