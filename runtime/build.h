/* What a call and an offline build (`flashjit cache build`) share: turning a request into a
** plan without a device, and turning a variant into a binary (key, render, compile). The
** small internal API of the runtime that tools/ uses beside the public header. */
#ifndef FJ_RUNTIME_BUILD_H
#define FJ_RUNTIME_BUILD_H

#include "../backend/backend.h"
#include "../plan/plan.h"

/* The default kernel cache path ($FLASHJIT_CACHE, $XDG_CACHE_HOME/..., ~/.cache/...);
** malloc'd. */
char *fj__default_cache_path(void);

/* Parsed mask/score expressions, kept while variants point at their canonical texts. */
typedef struct fj__mods {
    struct fj__mod *items;
    size_t n, cap;
} fj__mods;

/* Parses (or finds in m) the expressions of p and sets p->mask_mod and p->score_mod. */
fj_status fj__mods_resolve(fj__mods *m, fj__problem *p, fj__err *err);
void fj__mods_free(fj__mods *m);

/* Validates a request and plans it for a described device as fj_attention_forward() would
** (without tuned records): the offline build's way to know which kernels a request needs. The
** tensors' data pointers only matter for their alignment. Expressions are kept in mods. */
fj_status fj__plan_request(const fj_attention_desc *desc, const fj_tensor *q, const fj_tensor *k,
                           const fj_tensor *v, const fj_tensor *out, const fj_tensor *lse,
                           const fj_device_info *dev, const char *config, fj__mods *mods,
                           fj__plan *plan, fj__err *err);

/* The same for a backward (fj_attention_backward's validation and plan, p the validated
** problem): the call and the offline build plan it through here. */
fj_status fj__plan_backward_request(const fj_attention_desc *desc, const fj_tensor *q,
                                    const fj_tensor *k, const fj_tensor *v, const fj_tensor *out,
                                    const fj_tensor *dout, const fj_tensor *lse,
                                    const fj_tensor *dq, const fj_tensor *dk, const fj_tensor *dv,
                                    const fj_device_info *dev, const char *config,
                                    fj__mods *mods, fj__bwd_problem *p, fj__plan *plan,
                                    fj__err *err);

/* Compiles source for the job's target; thread-safe (several jobs compile at once). */
typedef fj_status (*fj__compile_fn)(void *ud, const char *source, const char *options,
                                    fj__blob *binary, char **log, fj__err *err);

/* One kernel's build: fj__compile_job_key names it, fj__compile_job_run renders and compiles
** it. Touches nothing but the job, so jobs may run on several threads. */
typedef struct fj__compile_job {
    fj__variant variant;
    const char *target;        /* "cuda|sm_90a", or the OpenCL device's */
    const char *template_dir;  /* templates that override the embedded ones, or NULL */
    const char *template_hash; /* tpl_set_hash() of the same */
    fj_backend_kind backend;
    fj__compile_fn compile;
    void *compile_ud;
    /* Results: */
    char *key_text; /* malloc'd */
    char key_hash[65];
    fj__blob binary; /* malloc'd */
    char *log;       /* the compiler's log, malloc'd, may be NULL */
    double render_ms, compile_ms;
    fj_status status;
    fj__err err;
} fj__compile_job;

/* The compile options of a backend's kernels. */
const char *fj__compile_options(fj_backend_kind backend);
/* Computes the job's key (key_text, key_hash). */
fj_status fj__compile_job_key(fj__compile_job *job);
/* Renders and compiles the keyed job into binary and log; status and err say how it went.
** With $FLASHJIT_DUMP=DIR the source, options, log and key go to DIR/<hash>.*. */
void fj__compile_job_run(fj__compile_job *job);
/* Frees the job's results (key, binary, log). */
void fj__compile_job_clear(fj__compile_job *job);

#endif /* FJ_RUNTIME_BUILD_H */
