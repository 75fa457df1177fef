/* The context: one device of one backend, its loaded kernels and the report of the last call. */
#ifndef FJ_RUNTIME_CONTEXT_H
#define FJ_RUNTIME_CONTEXT_H

#include "internal.h"
#include "../cache/cache.h"

#define FJ__PLAN_KEY 25
#define FJ__TILE_COUNTERS 64
#define FJ__CLASS_BUFFERS 8

/* A kernel loaded in this context. */
typedef struct fj__kernel {
    fj__variant variant;
    void *handle;                   /* the backend's kernel object */
    char *key_text;                 /* canonical variant key: sorted name=value lines */
    char key_hash[65];              /* SHA-256 of key_text */
    int32_t registers, spill_bytes; /* per thread, read once at load (0: unknown) */
} fj__kernel;

struct fj_context {
    fj_context_options opts;
    char *cache_path; /* resolved path, or ":memory:" */
    char *config;     /* $FLASHJIT_CONFIG at creation: tile overrides, or NULL */
    fj_cache *cache;
    const struct fj_backend_ops *ops;
    void *backend;
    fj_device_info device;
    char template_hash[65];
    fj__err err;

    fj__kernel *kernels;
    size_t nkernels, capacity;
    size_t last_used; /* index of the kernel the previous call used: checked first */

    fj_call_info last_call;
    uint64_t compiles;

    int tune_policy;         /* fj_tune_policy after $FLASHJIT_TUNE */
    char fingerprint[512];   /* device identity tuning results are keyed by */
    struct fj__tuned *tuned; /* buckets looked up so far, with their record (or none) */
    size_t ntuned, captuned;

    int64_t last_plan_key[FJ__PLAN_KEY]; /* the previous call's shape (attention.c) ... */
    fj__variant last_plan;               /* ... and the variant it ran with */
    int32_t last_plan_tuned;
    int last_plan_valid;

    struct fj__mod *mods; /* mask/score expressions parsed so far, kept for the context's life:
                          ** variants point at their canonical texts */
    size_t nmods, capmods;

    /* Tile counters of dynamically scheduled kernels: two ints for each stream that launched
    ** one (launches on one stream never overlap, and each leaves its counter at zero). */
    void *tile_counters; /* device memory, FJ__TILE_COUNTERS pairs, zeroed at allocation */
    void *counter_streams[FJ__TILE_COUNTERS];
    int ncounter_streams;

    /* The grid of the last zigzag-scheduled launch (fj__zigzag_grid; 0: none yet) and the
    ** shape it was chosen for. */
    int64_t zigzag_key[10];
    uint32_t zigzag_grid;

    /* The last tensor maps of q, k, v and bias (Hopper kernel): a call on the same tensors as the
    ** previous one skips encoding them again. Bytes, not fj__tensor_map: a calloc'd context
    ** has no 64-byte alignment. */
    struct {
        int valid;
        fj__tensor_map_desc desc;
        unsigned char bytes[sizeof(fj__tensor_map)];
    } last_maps[4];

    /* Block classes computed for the Hopper kernel (classify.c), one buffer per stream: a
    ** stream's launches never overlap, so its next classification may overwrite the buffer.
    ** key describes what the classes hold when they depend on nothing but it (a mask_mod that
    ** reads no mod_args), so that an equal call skips the pre-pass; key_valid 0 otherwise. */
    struct fj__class_buffer {
        void *stream;
        void *mem;
        size_t bytes;
        int key_valid;
        int64_t key[6];
    } class_buffers[FJ__CLASS_BUFFERS];
    int nclass_buffers, next_class_victim;
};

/* A parsed expression: its source as given, and the tree with the canonical text. */
typedef struct fj__mod {
    char *src;
    int score; /* 1: parsed as score_mod */
    struct fj__expr *expr;
} fj__mod;

/* Parses (or finds) the expressions of p and sets p->mask_mod and p->score_mod. */
fj_status fj__resolve_mods(fj_context *ctx, fj__problem *p);
/* Frees the parsed expressions. */
void fj__mods_release(fj_context *ctx);

/* A tuning record in memory: config is NULL when the bucket has none. */
typedef struct fj__tuned {
    char *bucket;
    char *config;
} fj__tuned;

/* The kernel parameter list shared by the forward templates and the classifier (see
** attn_params_tail() in cuda_attn_common.lua). Returns the number of arguments. */
int fj__forward_args(const fj__problem *p, fj__arg args[FJ__MAX_ARGS]);
/* Whether the Hopper kernel v needs block classes that the caller did not give (element masks:
** mask_mod, mask tensor, ranges). */
int fj__needs_classes(const fj__variant *v);
/* The classifier variant for v's masks. */
void fj__classify_variant(const fj__variant *v, fj__variant *cv);
/* Classifies p's 128 x 128 blocks under its element masks (attn_classify.lua) on stream into a
** buffer of ctx, and points p->block_mask and p->blocks_stride at it (cls holds the tensor). */
fj_status fj__classify_blocks(fj_context *ctx, fj__problem *p, const fj__variant *v, void *stream,
                              fj_tensor *cls);
/* Frees the class buffers. */
void fj__class_buffers_release(fj_context *ctx);

/* Launches v for the validated request p. */
fj_status fj__forward_variant(fj_context *ctx, const fj__problem *p, const fj__variant *v,
                              void *stream);

/* ---- tuning (autotune/tune.c) ---- */
/* The device identity of ctx for tuning records: backend, name, compute units, driver, arch. */
void fj__fingerprint(const fj_context *ctx, char *buf, size_t size);
/* The shape bucket of p under its planned variant v, e.g.
** "fwd.mma|bf16|d=128|dv=128|sq=4096|sk=4096|bh=64|mask=causal|softcap=0|lse=1". */
void fj__tune_bucket(const fj__problem *p, const fj__variant *v, char *buf, size_t size);
/* The tuned configuration of a bucket (memoised per context), or NULL. */
const char *fj__tuned_config(fj_context *ctx, const char *bucket);
/* Tunes p's bucket (see fj_attention_tune); heuristic is the planned variant. */
fj_status fj__tune(fj_context *ctx, const fj__problem *p, const fj__variant *heuristic,
                   void *stream, fj_tune_result *result);
/* Frees the memoised tuning records. */
void fj__tuned_release(fj_context *ctx);

/* Finds the kernel of variant v: already loaded, or rendered, compiled and loaded now. Fills the
** lookup/render/compile/load parts of ctx->last_call. */
fj_status fj__kernel_get(fj_context *ctx, const fj__variant *v, const fj__kernel **out);
/* Makes the kernels of n variants loaded (memory, cache, or compiled now on several threads).
** status[i] and why[i] say what became of variant i; returns FJ_OK unless out of memory. */
fj_status fj__kernels_prepare(fj_context *ctx, const fj__variant *vs, int n, fj_status *status,
                              char (*why)[160]);
/* Unloads every kernel of ctx. */
void fj__kernels_release(fj_context *ctx);

/* The key of v: canonical text (malloc'd) and its SHA-256, for a backend target. */
fj_status fj__variant_key(const fj__variant *v, const char *target, const char *template_hash,
                          char **text, char hash[65], fj__err *err);
/* Renders v's kernel source, starting with key_text in a comment. */
fj_status fj__variant_render(const fj__variant *v, const char *key_text, char **source,
                             fj__err *err);
/* With $FLASHJIT_DUMP=DIR, writes DIR/<hash>.src, .opts, .log and .key so that any compile can
** be reproduced by hand. Best effort. */
void fj__dump_compile(const char *key_hash, const char *key_text, const char *source,
                      const char *options, const char *log);
/* Compile options of a backend. */
const char *fj__compile_options(fj_backend_kind backend);

/* Writes the canonical key text of v (sorted name=value lines, ending with a newline) into
** buf. Returns the length, or the length it would need when size is too small. */
size_t fj__variant_key_text(const fj__variant *v, const char *target, const char *template_hash,
                            char *buf, size_t size);

#endif /* FJ_RUNTIME_CONTEXT_H */
