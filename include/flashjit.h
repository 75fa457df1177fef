/* flashjit: exact attention (FlashAttention) with kernels written at run time.
**
** This header is the whole public API and its specification. A request describes the attention
** to compute (shapes, dtype, mask); the library renders a kernel for exactly that request from
** Lua templates, compiles it for the device (OpenCL, or NVRTC on CUDA), keeps the binary, and
** launches it on the caller's stream or queue.
**
** Conventions
**  - Every function that can fail returns an fj_status. FJ_OK is 0. fj_status_string() gives a
**    static description of a code; fj_context_last_error() gives the detail of the last failure
**    on a context, naming the offending field and value.
**  - Option structs start with struct_size and only ever grow at the end. Always fill them with
**    their *_init() function first, then set the fields you need.
**  - Inputs are copied unless a comment says otherwise; returned const char * are borrowed.
**  - A context is used by one thread at a time. Different contexts are independent.
**  - Tensors live in device memory: fj_malloc() memory, or for CUDA any device pointer (for
**    example a framework's tensor). On OpenCL only the context's own fj_malloc() memory will do
**    (unless the device has system SVM), and a tensor anywhere else is FJ_ERR_INVALID_ARGUMENT.
*/
#ifndef FLASHJIT_H
#define FLASHJIT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define FJ_API __attribute__((visibility("default")))
#else
#define FJ_API
#endif

#define FJ_VERSION_MAJOR 0
#define FJ_VERSION_MINOR 1
#define FJ_VERSION_PATCH 0

/* The library's version as "MAJOR.MINOR.PATCH"; static storage. */
FJ_API const char *fj_version(void);

/* Status codes. X(name, description): the one table behind the enum and fj_status_string(). */
#define FJ_STATUS_MAP(X)                                                                           \
    X(OK, "success")                                                                               \
    X(ERR_INVALID_ARGUMENT, "invalid argument")                                                    \
    X(ERR_UNSUPPORTED, "unsupported request")                                                      \
    X(ERR_TEMPLATE, "kernel template failed to render")                                            \
    X(ERR_COMPILE, "kernel failed to compile")                                                     \
    X(ERR_BACKEND, "backend (driver) error")                                                       \
    X(ERR_CACHE, "kernel cache error")                                                             \
    X(ERR_OUT_OF_MEMORY, "out of memory")                                                          \
    X(ERR_NO_DEVICE, "no usable device")

typedef enum fj_status {
#define FJ__STATUS_ENUM(name, text) FJ_##name,
    FJ_STATUS_MAP(FJ__STATUS_ENUM)
#undef FJ__STATUS_ENUM
} fj_status;

/* A static, human-readable description of a status; "unknown status" for values outside the
** enum. Never NULL. */
FJ_API const char *fj_status_string(fj_status status);

/* Element types. Half and bfloat16 are IEEE binary16 and the upper half of binary32. FP8 types
** are part of the ABI for later versions; requests with them return FJ_ERR_UNSUPPORTED today. */
typedef enum fj_dtype {
    FJ_DTYPE_F16 = 0,
    FJ_DTYPE_BF16 = 1,
    FJ_DTYPE_F32 = 2,
    FJ_DTYPE_F8_E4M3 = 3,
    FJ_DTYPE_F8_E5M2 = 4,
    FJ_DTYPE_BOOL = 5, /* one byte, nonzero is true: masks */
    FJ_DTYPE_I32 = 6   /* sequence offsets and lengths */
} fj_dtype;

/* Size of one element in bytes, or 0 for a value outside the enum. */
FJ_API size_t fj_dtype_size(fj_dtype dtype);

/* Which backend a context uses. AUTO takes CUDA when a CUDA device and NVRTC are usable, else
** OpenCL. */
typedef enum fj_backend_kind {
    FJ_BACKEND_AUTO = 0,
    FJ_BACKEND_CUDA = 1,
    FJ_BACKEND_OPENCL = 2
} fj_backend_kind;

/* A strided view of device memory (like DLPack's DLTensor). Strides count elements, not bytes.
** The last dimension must be contiguous (stride 1). Attention tensors are 4-D:
**   q   [batch, seqlen_q, heads_q,  head_dim]
**   k   [batch, seqlen_k, heads_kv, head_dim]
**   v   [batch, seqlen_k, heads_kv, head_dim_v]
**   out [batch, seqlen_q, heads_q,  head_dim_v]
**   lse [batch, heads_q, seqlen_q] (3-D, float32, natural log)
** Any strides work, so [batch, heads, seq, dim] storage is passed by permuting the strides. */
typedef struct fj_tensor {
    void *data;
    fj_dtype dtype;
    int32_t ndim;
    int64_t shape[4];
    int64_t stride[4];
} fj_tensor;

/* Device memory for a context's workspaces from the caller (a framework's caching allocator, a
** memory pool) instead of the backend's own allocations. alloc(user, bytes, stream) returns
** `bytes` of device memory for work on `stream`, at least 16-byte aligned (CUDA: a device
** pointer; OpenCL: memory from fj_malloc() on the same context), or NULL, and the call that
** needed it then fails with FJ_ERR_OUT_OF_MEMORY (misaligned memory goes back to free() at once
** and the call fails with FJ_ERR_INVALID_ARGUMENT); free(user, ptr, bytes, stream) takes back
** what alloc gave, once the work queued on `stream` that may read it has finished, or when the
** context is destroyed (which the caller does once the work on its streams has finished). A
** context allocates a workspace only when a call needs more than its stream already holds (the
** first call of a kind on a stream), never during graph capture. Both functions set, or neither
** (the backend's own allocations). */
typedef struct fj_allocator {
    void *(*alloc)(void *user, size_t bytes, void *stream);
    void (*free)(void *user, void *ptr, size_t bytes, void *stream);
    void *user;
} fj_allocator;

/* Options of a context. */
typedef struct fj_context_options {
    size_t struct_size;      /* sizeof(fj_context_options), set by fj_context_options_init() */
    fj_backend_kind backend; /* default FJ_BACKEND_AUTO */
    int32_t device;          /* index among the backend's devices; default 0 */
    const char *cache_path;  /* kernel cache file; NULL: the default location, ":memory:": none.
                             ** The default is $FLASHJIT_CACHE, else
                             ** $XDG_CACHE_HOME/flashjit/kernels.db, else
                             ** ~/.cache/flashjit/kernels.db. */
    const char *const
        *shipped_caches;    /* NULL-terminated list of read-only caches (opened
                             ** immutable) consulted after the user cache; NULL for none. The
                             ** strings are copied. */
    int32_t cache_readonly; /* 1: never write the user cache (look up only) */
    int32_t tune;           /* fj_tune_policy; $FLASHJIT_TUNE (never, on_miss) overrides it */
    /* NULL-terminated list of Ed25519 public keys, 64 hex digits each (at most 16); NULL for
    ** none. With any, a shipped cache is used only if `flashjit cache sign` signed it with the
    ** secret key of one of them (checked when the context is created), and only the rows signed
    ** can supply kernels. Without, shipped caches are trusted as they are: a cache holds code
    ** that runs on the device, so ship signed caches and pass your key. */
    const char *const *trusted_keys;
    /* Added after the first versions (whose struct_size is still accepted): */
    fj_allocator allocator; /* workspaces' memory; all NULL: the backend's own */
} fj_context_options;

/* When flashjit measures tile configurations itself. Tuned results are kept in the cache per
** device and shape bucket (sequence lengths and batch x heads rounded up to powers of two, head
** dims, dtype, mask class) and used by every later call in that bucket, under any policy. */
typedef enum fj_tune_policy {
    FJ_TUNE_NEVER = 0,  /* the built-in heuristic, unless a tuned record exists (default) */
    FJ_TUNE_ON_MISS = 1 /* the first call of a bucket without a record tunes it (seconds) */
} fj_tune_policy;

/* Fills *opts with the defaults and sets struct_size. NULL is a no-op. */
FJ_API void fj_context_options_init(fj_context_options *opts);

typedef struct fj_context fj_context;

/* Creates a context for one device of one backend. The kernel cache never makes this fail: an
** unusable cache file (unwritable, locked, damaged, another application's) leaves the context
** without it, and fj_context_last_error(*out) then holds a warning saying why. On success *out owns
*everything the context
** allocates; on failure *out is NULL and the returned status says why (the detail of a failure
** before a context exists is available through fj_last_create_error()). opts may be NULL for
** the defaults; it is copied, not retained.
** Returns FJ_ERR_INVALID_ARGUMENT (out is NULL, bad struct_size, backend or device index),
** FJ_ERR_NO_DEVICE (the backend's runtime is missing or has no such device), FJ_ERR_BACKEND,
** FJ_ERR_OUT_OF_MEMORY.
** A context is not shared across fork(): create contexts in the child. */
FJ_API fj_status fj_context_create(const fj_context_options *opts, fj_context **out);

/* The detail of the last fj_context_create() failure on the calling thread; "" if none. */
FJ_API const char *fj_last_create_error(void);

/* Releases a context, its loaded kernels and its cache connection. Memory from fj_malloc() must
** be freed before. NULL is a harmless no-op. */
FJ_API void fj_context_destroy(fj_context *ctx);

/* The detail of the last failure on ctx, naming the bad field and value, or a warning the last
** call chose to report (such as a cache that could not be written); "" if none. Owned by ctx,
** valid until the next call on ctx. ctx NULL gives a static message. */
FJ_API const char *fj_context_last_error(const fj_context *ctx);

/* The kernel cache file the context uses (":memory:" when there is none). Owned by ctx. */
FJ_API const char *fj_context_cache_path(const fj_context *ctx);

/* Devices. */
typedef struct fj_device_info {
    size_t struct_size; /* set by the caller to sizeof(fj_device_info) */
    fj_backend_kind backend;
    int32_t index;
    int32_t compute_units;  /* SMs or OpenCL compute units */
    uint64_t global_memory; /* bytes */
    uint64_t local_memory;  /* bytes of shared (local) memory one block (work-group) may use */
    char name[128];         /* e.g. "NVIDIA H200" */
    char arch[64];          /* compile target, e.g. "sm_90a"; "opencl" for OpenCL */
    char driver[64];        /* driver version text */
    char platform[128];     /* OpenCL platform name; "" for CUDA */
} fj_device_info;

/* Number of devices the backend offers (AUTO is not allowed here). A backend whose runtime is
** missing has 0 devices and returns FJ_OK; *count is always written. */
FJ_API fj_status fj_device_count(fj_backend_kind backend, int32_t *count);

/* Describes device `index` of `backend`. info->struct_size must be set. */
FJ_API fj_status fj_device_get_info(fj_backend_kind backend, int32_t index, fj_device_info *info);

/* Describes the context's device and backend. info->struct_size must be set. */
FJ_API fj_status fj_context_get_device_info(const fj_context *ctx, fj_device_info *info);

/* The attention to compute, beyond what the tensors say. */
typedef struct fj_attention_desc {
    size_t struct_size; /* sizeof(fj_attention_desc), set by fj_attention_desc_init() */
    /* scores = q.k * softmax_scale; 0 (default) means 1/sqrt(head_dim). |softmax_scale| <= 1e6:
    ** scores are computed in float. */
    float softmax_scale;
    int32_t causal;      /* 0 or 1. Bottom-right aligned as in FlashAttention >= 2.1: query i
                         ** sees key j iff j <= i + seqlen_k - seqlen_q. Implies window_right=0. */
    int32_t window_left; /* sliding window: query i sees keys j with
                         ** i + seqlen_k - seqlen_q - window_left <= j <=
                         ** i + seqlen_k - seqlen_q + window_right; -1 (default) is unbounded */
    int32_t window_right;
    /* 1e-6 to 1e6: scores = softcap * tanh(scores / softcap); 0 (default): off. */
    float softcap;
    /* Expressions compiled into the kernel (NULL: none). mask_mod keeps the pair (q, k) where it
    ** is nonzero, on top of causal and window; score_mod replaces the score s (after scaling
    ** and soft-capping) by its value. The grammar: integers b h q k (batch, head, query row,
    ** key), sq sk (sequence lengths), float s (score_mod only), literals, + - * / % (integer
    ** arithmetic stays integer), comparisons, && || !, ?:, parentheses, min max abs exp log
    ** sqrt tanh floor, and arg[i] / iarg[i]: float / int32 element i of mod_args (indices are
    ** clamped into the array). Anything else is FJ_ERR_INVALID_ARGUMENT naming the position.
    ** Arithmetic, the same in every kernel and in the library's reference: integers are 32-bit
    ** two's complement and + - * and unary - wrap around; / truncates toward zero and x / 0 and
    ** x % 0 are 0 (INT_MIN / -1 wraps to INT_MIN, abs(INT_MIN) is INT_MIN); a float operand
    ** converts the other to float, and float arithmetic is IEEE single precision (x / 0.0 is
    ** +-inf or NaN; the compiler may fuse a multiply and an add); min and max of a NaN and a
    ** number give the number; comparisons, && || ! give the int 0 or 1. A score_mod value of -inf
    ** masks the pair; a finite one beyond +-2.35e38 saturates there (scores are held in log2
    ** units: the output is right, lse is then off by the difference).
    ** Requests with expressions run on the Hopper tensor-core kernel (sm_90a), elsewhere on the
    ** SIMT kernels. */
    const char *mask_mod;
    const char *score_mod;
    const void *mod_args;   /* device memory read by arg[] and iarg[]; NULL when unused */
    int64_t mod_args_count; /* 4-byte elements at mod_args */
    /* Scores as in FlashAttention and PyTorch's SDPA, all optional (NULL: none), in this order:
    ** s = softcap(q.k * scale) - slope[b, h] * |i + seqlen_k - seqlen_q - j| + bias[b, h, i, j],
    ** then score_mod; key j is kept for query i where mask[b, h, i, j] is nonzero, on top of
    ** causal, window and mask_mod.
    **   alibi_slopes: f32, [heads_q] or [batch, heads_q].
    **   bias: f32 or q's dtype, [batch | 1, heads_q | 1, seqlen_q | 1, seqlen_k]; a dimension
    **         of size 1 or stride 0 is broadcast.
    **   mask: FJ_DTYPE_BOOL, shaped and broadcast as bias.
    ** Requests with any of them run on the Hopper tensor-core kernel (sm_90a), elsewhere on the
    ** SIMT kernels. */
    const fj_tensor *alibi_slopes;
    const fj_tensor *bias;
    const fj_tensor *mask;
    /* Variable lengths (NULL: off), as FlashAttention's varlen functions: q, k, v and out are
    ** packed [total_tokens, heads, dim] (ndim 3) and sequence b holds rows
    ** cu_seqlens_q[b] .. cu_seqlens_q[b + 1] - 1 of q and out, cu_seqlens_k[b] ..
    ** cu_seqlens_k[b + 1] - 1 of k and v. Both are FJ_DTYPE_I32 [batch + 1] in device memory;
    ** seqused_k (optional, I32 [batch]) keeps only the first seqused_k[b] keys of sequence b.
    ** max_seqlen_q and max_seqlen_k (>= 1) bound the lengths: the grid is sized by them. The
    ** host cannot read device memory, so the kernels clamp offsets into the tensors and lengths
    ** to the maxima instead of trusting them. lse is [heads_q, total_q]. Causal and windows
    ** align each sequence's keys to its queries bottom-right. A bias, a mask and mask_ranges
    ** see the sequences as a padded batch of the longest (seqlen_q, seqlen_k in their shapes
    ** are max_seqlen_q, max_seqlen_k; sequence b's query i and key j at [b, h, i, j]), and so
    ** does a block_mask (its blocks of 128 of each sequence's own rows and keys). Runs on the
    ** Hopper tensor-core kernel (sm_90a) unless a mask_mod, a bias, a mask, ranges or a
    ** block_mask is given, elsewhere (and then) on the SIMT kernels. */
    const fj_tensor *cu_seqlens_q;
    const fj_tensor *cu_seqlens_k;
    const fj_tensor *seqused_k;
    int64_t max_seqlen_q;
    int64_t max_seqlen_k;
    /* FlashMask-style column ranges (NULL: none): FJ_DTYPE_I32 [batch | 1, heads_q | 1,
    ** seqlen_k, 2 or 4], broadcast like bias. Query rows i with r[0] <= i < r[1] (and, with 4
    ** columns, r[2] <= i < r[3]) do not see key j, where r = mask_ranges[b, h, j]: O(seqlen)
    ** memory for document, prefix-LM and shared-question masks. The Hopper tensor-core kernel
    ** (sm_90a), elsewhere (and with variable lengths) the SIMT kernels. */
    const fj_tensor *mask_ranges;
    /* A classification of 128 x 128 blocks of (query, key) pairs (NULL: none): FJ_DTYPE_I32
    ** [batch | 1, heads_q | 1, ceil(seqlen_q / 128), ceil(seqlen_k / 128)], broadcast like bias.
    ** 0: the block is skipped (its pairs are masked); 2: all its pairs are kept (mask_mod, mask
    ** and mask_ranges are not applied there); 1: the masks apply. Causal and window apply
    ** everywhere. A caller that knows its mask's structure saves the kernels the work of
    ** finding it; fj_block_mask_build writes it from the masks once, for many calls. With
    ** variable lengths as a bias is (seqlen_q, seqlen_k: max_seqlen_q, max_seqlen_k), on the
    ** SIMT kernels; else the Hopper tensor-core kernel (sm_90a), elsewhere the SIMT kernels. */
    const fj_tensor *block_mask;
    /* Decode (at most 16 query rows per sequence, or a paged cache; no block_mask): a kernel
    ** that packs the query heads of each kv head (each key read once for all of them) and splits
    ** the keys of each sequence into parts run in parallel, merged by log-sum-exp
    ** (FlashDecoding).
    ** num_splits: 0 (default) lets the plan choose (enough to fill the device), 1 to 64 asks for
    ** that many (fewer when the keys run out); packed sequences split by the longest. */
    int32_t num_splits;
    /* A paged KV cache (NULL: off), as vLLM and FlashInfer lay it out: k and v are pages
    ** [num_pages, page_size, heads_kv, head_dim (head_dim_v)] (any page_size >= 1, any strides
    ** with a contiguous last dimension), page_table is I32 [batch, max_pages_per_seq] (its row
    ** b lists the pages of sequence b in key order) and seqused_k (required) I32 [batch] holds
    ** each sequence's key count, at most max_pages_per_seq * page_size. q, out and lse are dense
    ** as without paging, or packed through cu_seqlens_q and max_seqlen_q (q, out
    ** [total_q, heads, dim], lse [heads_q, total_q]: sequences with different numbers of
    ** queries, vLLM's batch of decodes and prefill chunks; cu_seqlens_k is then refused, each
    ** sequence's keys being its pages); causal and windows align each sequence's keys to its
    ** queries bottom-right, so decode, speculative decode and chunked prefill against the cache
    ** all work. Page numbers come from device memory the host cannot check: the kernel clamps
    ** them into [0, num_pages). Runs on the decode kernels (any seqlen_q); on sm_90a, chunks of
    ** more than 16 query rows (packed: more than 16 a sequence on average, so that a batch of
    ** mostly decode rows stays on the decode kernels; any, under FLASHJIT_CONFIG=path=wgmma) run on
    ** the Hopper forward kernel instead where it takes them (16-bit data, head dims to 256, no
    ** score terms or masks beyond the band, pages of 8, 16, 32 or 64 keys or a multiple of 128, of
    ** 64 beyond head dim 128), which copies its key tiles by pages. A bias's,
    ** a mask's and the ranges' key dimension is the table's keys (max_pages_per_seq *
    ** page_size; with packed queries their query dimension is max_seqlen_q, sequence b's query i
    ** at row i of batch b: e.g. the tree masks of speculative decoding); not with block_mask. */
    const fj_tensor *page_table;
    /* fj_attention_backward: 1 gives bit-identical gradients run to run (no floating-point
    ** atomics in a varying order); 0 (default) lets the plan use them (on tensor cores, dq is
    ** then added by atomics in the dk/dv kernel instead of recomputed by a kernel of its own). */
    int32_t deterministic;
    /* fj_attention_backward only (the forward ignores it): where the gradient with respect to
    ** desc.bias goes (NULL: not computed). F32, 4-D, shaped as bias with every dimension the
    ** bias broadcasts (extent 1, or stride 0 over a larger extent) of extent 1: the gradient is
    ** summed over it. With variable lengths, the padded batch's as the bias (see
    ** cu_seqlens_q); the backward then runs on the SIMT kernels. */
    fj_tensor *dbias;
    /* FP8 inputs only (q_descale for an FP8 q, k_ and v_descale for FP8 k and v): the factors
    ** that turn each into its real values, as FlashAttention-3's descales: F32 tensors of
    ** shape [1] (one factor), [heads_kv] (per kv head) or [batch, heads_kv] (per sequence and
    ** kv head); query head h takes its kv head's; NULL: 1. The scores are (q * q_descale) .
    ** (k * k_descale) and out is P (v * v_descale). */
    const fj_tensor *q_descale;
    const fj_tensor *k_descale;
    const fj_tensor *v_descale;
} fj_attention_desc;

/* Fills *desc with the defaults (plain non-causal attention) and sets struct_size. NULL is a
** no-op. */
FJ_API void fj_attention_desc_init(fj_attention_desc *desc);

/* Computes out = softmax(q k^T * scale [masked, capped]) v and, when lse is not NULL, the
** log-sum-exp of each row's scores (natural log). Grouped-query attention: heads_q must be a
** multiple of heads_kv; query head h reads kv head h / (heads_q / heads_kv). A query row whose
** keys are all masked gets out = 0 and lse = -inf.
**
** desc may be NULL for the defaults. q, k, v and out share one dtype (f16, bf16 or f32); or q,
** k and v share an FP8 type (f8e4m3, f8e5m2; scaled by desc.q_descale, k_descale and
** v_descale) and out is f16 or bf16; or k and v alone are FP8 (an FP8 KV cache, paged or not,
** scaled by k_descale and v_descale) read by f16 or bf16 q, out as q. FP8 q, k and v run on
** Hopper's kernel with FP8 products where head_dim and head_dim_v are <= 256 (rows multiples
** of 16 bytes; with both beyond 128, not with element masks or score terms); other dense
** requests on CUDA (more than 16 query rows) through 16-bit copies of q, k and v in the
** workspace (descale factors folded in) and the 16-bit forward; the rest on the SIMT forward;
** an FP8 KV cache on the portable decode kernel; FP8 has no backward.
** head_dim and head_dim_v are 1..576 and may differ (on tensor cores: up to 576 on Hopper's
** kernel; before Hopper up to 256, and beyond in value slices where their tiles fit the shared
** memory, else on the SIMT forward). Accumulation is in float32 (Hopper's tensor cores add FP8
** products with about 13 bits of mantissa before they reach it).
** stream is the backend's queue: a CUstream for CUDA (NULL: the default stream), a
** cl_command_queue for OpenCL (NULL: the context's own queue). The call is asynchronous with
** respect to the host; fj_synchronize() waits.
**
** The first call for a new kind of request renders and compiles a kernel (or finds it in the
** cache); later calls reuse it. fj_context_last_call() reports which happened.
** Returns FJ_ERR_INVALID_ARGUMENT with the bad field in fj_context_last_error(),
** FJ_ERR_UNSUPPORTED, FJ_ERR_TEMPLATE, FJ_ERR_COMPILE, FJ_ERR_BACKEND, FJ_ERR_OUT_OF_MEMORY. */
FJ_API fj_status fj_attention_forward(fj_context *ctx, const fj_attention_desc *desc,
                                      const fj_tensor *q, const fj_tensor *k, const fj_tensor *v,
                                      fj_tensor *out, fj_tensor *lse, void *stream);

/* The gradients of fj_attention_forward: from dout (the loss's gradient with respect to out),
** dq, dk and dv. desc, q, k, v, out and lse exactly as passed to and written by the forward (lse
** is required); dout like out; dq like q, dk like k, dv like v (same dtype and shapes, any
** strides with a contiguous last dimension; none may overlap another tensor of the call).
** Grouped-query: dk and dv sum over each kv head's query heads. Every score and mask feature of
** the forward is honoured (the gradient goes through soft-capping, and through score_mod by its
** derivative with respect to s, generated from the expression: comparisons, floor and integer
** parts are piecewise constant, min/max/abs and ternaries take the branch they pick; ALiBi,
** bias, masks and mod_args are constants, and a score_mod whose derivative text would exceed
** 16 KiB is FJ_ERR_UNSUPPORTED); rows that see no key get zero gradients. The kernels recompute the scores from q, k and lse (no N x N
** storage): D = rowsum(dout * out) first, then dk and dv per key block, then dq per query block.
** On tensor cores with desc.deterministic 0 (the default), the dk/dv kernel also adds each key
** block's share of dq into an f32 workspace by atomics (its size, 4 bytes per element of dq
** with the head dim padded to 16, on Hopper to 64 or beyond 128 to 128, is in
** fj_call_info.workspace_bytes) and a
** last kernel casts
** it: faster, but the order of the additions, and so dq's last bits, vary run to run. With 1,
** bit-identical gradients: on Hopper the dk/dv kernel still adds dq, in launches one after
** another into up to 16 such workspaces, each element of one taking its additions in one order
** (all in workspace_bytes); elsewhere dq is a kernel of its own, and the SIMT kernels use no
** atomics at all.
** Variable lengths as the forward's (keys past seqused_k get zero dk and dv). On CUDA sm_80+
** with f16/bf16 rows of 16-byte multiples and head dims to 256, dk/dv and dq run on tensor
** cores (wgmma on sm_90a to head dims 128, else mma.sync), masks, block_mask (tiles of class 0
** skipped), score terms and variable lengths included, with the tiles of a tuning record where
** the cache has one (fj_attention_backward_tune); f32 and wider heads on the SIMT kernels (as
** everything on OpenCL), and dbias by a SIMT kernel after the others. Not with a paged cache
** (FJ_ERR_UNSUPPORTED).
** Returns FJ_ERR_INVALID_ARGUMENT naming the bad field, FJ_ERR_UNSUPPORTED, FJ_ERR_TEMPLATE,
** FJ_ERR_COMPILE, FJ_ERR_BACKEND, FJ_ERR_OUT_OF_MEMORY. */
FJ_API fj_status fj_attention_backward(fj_context *ctx, const fj_attention_desc *desc,
                                       const fj_tensor *q, const fj_tensor *k, const fj_tensor *v,
                                       const fj_tensor *out, const fj_tensor *dout,
                                       const fj_tensor *lse, fj_tensor *dq, fj_tensor *dk,
                                       fj_tensor *dv, void *stream);

/* Block classes of desc's element masks, built once for many calls (FlexAttention's
** create_block_mask): for every 128 x 128 block of (query, key) pairs of a dense forward of q
** and k (shaped as fj_attention_forward takes them), 0 where the masks keep no pair, 2 where they
** keep every pair, 1 where they must be applied pair by pair, written into classes, I32
** [batch | 1, heads_q | 1, ceil(seqlen_q / 128), ceil(seqlen_k / 128)] (extent 1 where the masks
** do not differ by batch or head; any strides with a contiguous last dimension). The masks are
** desc's mask_mod (with mod_args), mask and mask_ranges; causal and windows are left to the
** calls. Pass classes as desc.block_mask of later calls with the same masks (forward and
** backward): they skip the per-call classification that masks otherwise cost on the Hopper
** kernel, and every path skips the blocks of class 0. desc.block_mask must be NULL here, and
** desc must have an element mask. Packed sequences (cu_seqlens_q/k) are classified as the
** padded batch of the longest, whose classes hold for every sequence unless mask_mod reads sq
** or sk (then FJ_ERR_UNSUPPORTED); a paged request is FJ_ERR_UNSUPPORTED.
** Returns FJ_ERR_INVALID_ARGUMENT naming the bad argument ("classes.shape[2]"),
** FJ_ERR_UNSUPPORTED, FJ_ERR_TEMPLATE, FJ_ERR_COMPILE, FJ_ERR_BACKEND. */
FJ_API fj_status fj_block_mask_build(fj_context *ctx, const fj_attention_desc *desc,
                                     const fj_tensor *q, const fj_tensor *k, fj_tensor *classes,
                                     void *stream);

/* Merges attention states: outs[i] and lses[i] (i < n) are the output and log-sum-exp of
** attention over disjoint sets of keys (split-KV partials, a shared prefix and the rest, one
** device's keys in ring attention); out and lse become those of attention over their union:
** with m = max lses[i] and w_i = exp(lses[i] - m) per (batch, row, head),
**     out = sum w_i outs[i] / sum w_i,    lse = m + log(sum w_i).
**  - outs[i]: [b, sq, h, dv] (or packed [total, h, dv]) as fj_attention_forward writes out, all
**    of one shape and one dtype (f16, bf16, f32); lses[i]: F32 [b, h, sq] (or [h, total]), as it
**    writes lse. Any strides with a contiguous last dimension.
**  - out: their shape, any of the three dtypes; lse: NULL (not written) or like lses[i].
**  - A state whose lse is -inf holds no keys and weighs nothing (its out is never read); a row
**    where every state is empty gets out 0 and lse -inf; a NaN or +inf lse makes the row NaN.
**  - In place: out may be one of outs[i] and lse one of lses[i] (the same memory and strides);
**    any other overlap between the result and the inputs is FJ_ERR_INVALID_ARGUMENT.
**  - 1 <= n <= 64 (more than 8 run as a chain of launches through an f32 workspace).
** Returns FJ_ERR_INVALID_ARGUMENT naming the bad argument ("outs[2].shape[1]"),
** FJ_ERR_UNSUPPORTED, FJ_ERR_TEMPLATE, FJ_ERR_COMPILE, FJ_ERR_BACKEND, FJ_ERR_OUT_OF_MEMORY. */
FJ_API fj_status fj_attention_merge(fj_context *ctx, const fj_tensor *outs, const fj_tensor *lses,
                                    int32_t n, fj_tensor *out, fj_tensor *lse, void *stream);

/* Appends new keys and values to a paged KV cache (see fj_attention_desc.page_table): token t of
** sequence b, k_new[b, t] and v_new[b, t], goes to position seqused_k[b] + t of the sequence,
** i.e. row (position % page_size) of page page_table[b, position / page_size].
**  - k_new [b, tokens, heads_kv, head_dim], v_new [b, tokens, heads_kv, head_dim_v]: any
**    strides with a contiguous last dimension, one dtype. Of the caches' dtype, they are
**    copied as bits (f16, bf16, f32, or an FP8 cache's f8e4m3 / f8e5m2: tokens already
**    quantised). Of f16, bf16 or f32 into a cache of another dtype, they are rounded to it
**    (to nearest even; into FP8, saturated at the largest finite value, NaN kept): this is
**    fj_kv_cache_append_quantized with both descale factors 1.
**  - k_cache, v_cache [num_pages, page_size, heads_kv, head_dim (head_dim_v)]; page_table I32
**    [b, max_pages]; seqused_k I32 [b], the sequences' lengths before the append. It is read,
**    not changed: add tokens to it (on the device) before the attention call that should see
**    the new keys.
**  - The host cannot read the table or the lengths: a position beyond max_pages * page_size is
**    not written, and page numbers are clamped into [0, num_pages). Pages shared between
**    sequences get whatever was written last.
** Returns FJ_ERR_INVALID_ARGUMENT naming the bad argument, FJ_ERR_UNSUPPORTED, FJ_ERR_TEMPLATE,
** FJ_ERR_COMPILE, FJ_ERR_BACKEND. */
FJ_API fj_status fj_kv_cache_append(fj_context *ctx, const fj_tensor *k_new,
                                    const fj_tensor *v_new, fj_tensor *k_cache, fj_tensor *v_cache,
                                    const fj_tensor *page_table, const fj_tensor *seqused_k,
                                    void *stream);

/* fj_kv_cache_append for sequences that each add their own number of tokens (a serving batch
** that mixes decode steps and prefill chunks): k_new [tokens, heads_kv, head_dim] and v_new
** [tokens, heads_kv, head_dim_v] are packed, sequence b's new tokens being rows
** cu_seqlens_new[b] to cu_seqlens_new[b + 1] - 1 (I32 [batch + 1] in device memory: the
** cu_seqlens_q of an attention call whose queries are these tokens). Token t of sequence b goes
** to position seqused_k[b] + t, as fj_kv_cache_append's; the caches, page_table and seqused_k
** are as there. The offsets are clamped into [0, tokens]; rows that belong to no sequence are
** not written. */
FJ_API fj_status fj_kv_cache_append_packed(fj_context *ctx, const fj_tensor *k_new,
                                           const fj_tensor *v_new,
                                           const fj_tensor *cu_seqlens_new, fj_tensor *k_cache,
                                           fj_tensor *v_cache, const fj_tensor *page_table,
                                           const fj_tensor *seqused_k, void *stream);

/* Appends f16, bf16 or f32 keys and values to an FP8 KV cache, quantising them as the cache
** write of a serving engine does: each element of k_new is divided by its descale factor
** (k_descale's of the element's sequence and kv head), rounded to nearest even into the
** cache's dtype and saturated at its largest finite value (f8e4m3 +-448, f8e5m2 +-57344; NaN
** stays NaN); v_new likewise by v_descale. The descale factors are those the attention
** reads the cache with (fj_attention_desc.k_descale and v_descale, real value = cached value *
** factor): F32 [1], [heads_kv] or [b, heads_kv]; NULL is a factor of 1. cu_seqlens_new NULL:
** k_new and v_new are [b, tokens, ...] as fj_kv_cache_append's; else packed as
** fj_kv_cache_append_packed's. Everything else is as there; descale factors with a cache that
** is not FP8, or with tokens that already are, are FJ_ERR_INVALID_ARGUMENT. */
FJ_API fj_status fj_kv_cache_append_quantized(fj_context *ctx, const fj_tensor *k_new,
                                              const fj_tensor *v_new,
                                              const fj_tensor *cu_seqlens_new,
                                              const fj_tensor *k_descale,
                                              const fj_tensor *v_descale, fj_tensor *k_cache,
                                              fj_tensor *v_cache, const fj_tensor *page_table,
                                              const fj_tensor *seqused_k, void *stream);

/* Where the kernel of a call came from. */
typedef enum fj_kernel_source {
    FJ_KERNEL_NONE = 0,          /* no kernel was needed or the call failed before */
    FJ_KERNEL_MEMORY = 1,        /* already loaded in this context */
    FJ_KERNEL_USER_CACHE = 2,    /* binary from the user's cache file */
    FJ_KERNEL_SHIPPED_CACHE = 3, /* binary from a shipped, read-only cache */
    FJ_KERNEL_COMPILED = 4       /* rendered and compiled now */
} fj_kernel_source;

/* A report on the last fj_attention_forward() or fj_attention_merge() call of a context. */
typedef struct fj_call_info {
    size_t struct_size; /* set by the caller to sizeof(fj_call_info) */
    fj_kernel_source source;
    double lookup_ms;        /* time spent looking the kernel up (memory and cache) */
    double render_ms;        /* Lua template rendering; 0 unless compiled */
    double compile_ms;       /* backend compile; 0 unless compiled */
    double load_ms;          /* loading the binary into the device */
    double total_ms;         /* host time of the whole call, launch included */
    uint64_t compiles;       /* kernels this context compiled since it was created */
    const char *variant;     /* the variant key text (sorted name=value lines); owned by ctx */
    const char *kernel_path; /* which kernel design ran: "cuda.fwd.wgmma" (Hopper), "cuda.fwd.mma",
                             ** "cuda.fwd.simt", "opencl.fwd.simt"; decoding "cuda.decode.mma"
                             ** (tensor cores), "cuda.decode.vec", "cuda.decode",
                             ** "opencl.decode"; "cuda.merge", "opencl.merge"; the
                             ** backward's "cuda.bwd.wgmma" (Hopper), "cuda.bwd.mma",
                             ** "cuda.bwd.simt", "opencl.bwd.simt"; the cache append's
                             ** "cuda.kv_append", "opencl.kv_append" */
    int32_t registers;       /* registers per thread of that kernel; 0 if unknown */
    int32_t spill_bytes;     /* local memory per thread (spills); 0 if none or unknown */
    int32_t tuned;           /* 0: heuristic tiles, 1: a tuned record's, 2: tuned in this call */
    /* Added after the first version (whose struct_size is still accepted: filled up to tuned): */
    uint64_t workspace_bytes; /* device workspace the call's plan used, from the stream's arena
                              ** (the backward: D and the lse in log2 units, 8 bytes per query
                              ** row and head, and dq's f32 sum where atomics add it; split
                              ** decode: the splits' states); 0 for none */
    /* Added in the third version: */
    const char *launched; /* what the call launched, in order: kernel paths (as kernel_path)
                          ** and "memset" for a zeroed workspace, joined by ","; a step run
                          ** several times once. E.g. "cuda.classify,cuda.fwd.wgmma": the
                          ** masks' blocks classified first (a call given desc.block_mask, or
                          ** whose classes are memoised, launches no cuda.classify);
                          ** "cuda.decode.mma,cuda.merge": a split decode. "" for none */
} fj_call_info;

/* Fills *info with the report of the last call on ctx; info->struct_size must be set (to
** sizeof(fj_call_info), or an earlier version's size). The strings stay valid until the next
** call on ctx. */
FJ_API fj_status fj_context_last_call(const fj_context *ctx, fj_call_info *info);

/* The outcome of tuning one request's bucket. */
typedef struct fj_tune_result {
    size_t struct_size;    /* set by the caller to sizeof(fj_tune_result) */
    int32_t from_record;   /* 1: the bucket was tuned before; nothing was measured now */
    int32_t candidates;    /* configurations tried */
    int32_t dropped;       /* of which failed to compile, spilled registers, or gave other
                           ** results than the heuristic's configuration */
    double heuristic_us;   /* median time of the heuristic's configuration */
    double best_us;        /* median time of the winner */
    char best_config[128]; /* the winner, "tile_m=128,tile_n=64,..." */
    char bucket[256];      /* the shape bucket the result applies to */
} fj_tune_result;

/* Tunes the bucket of this request: compiles the candidate tile configurations (on several
** threads), runs each on these tensors (out and lse are overwritten), drops those that fail or
** disagree with the heuristic's result, times the rest (median of repeats) and keeps the
** fastest in the cache. A bucket tuned before returns its record (from_record = 1) at once.
** A request the decode kernels serve tunes the decode plan: the kernel's tiles and the number of
** key splits (best_config's "splits=N"; desc.num_splits, when set, wins at call time).
** result may be NULL. Takes seconds; returns the statuses of fj_attention_forward. */
FJ_API fj_status fj_attention_tune(fj_context *ctx, const fj_attention_desc *desc,
                                   const fj_tensor *q, const fj_tensor *k, const fj_tensor *v,
                                   fj_tensor *out, fj_tensor *lse, void *stream,
                                   fj_tune_result *result);

/* The same for the backward: tunes the bucket of this backward request (its tensors as
** fj_attention_backward's; dq, dk and dv are overwritten), keeping the fastest tiles of its
** dk/dv and dq stages in the cache, where later backward calls of the bucket find them
** (unless $FLASHJIT_BWD_CONFIG is set). Returns the statuses of fj_attention_backward. */
FJ_API fj_status fj_attention_backward_tune(fj_context *ctx, const fj_attention_desc *desc,
                                            const fj_tensor *q, const fj_tensor *k,
                                            const fj_tensor *v, const fj_tensor *out,
                                            const fj_tensor *dout, const fj_tensor *lse,
                                            fj_tensor *dq, fj_tensor *dk, fj_tensor *dv,
                                            void *stream, fj_tune_result *result);

/* Device memory helpers for callers without a framework. fj_malloc of 0 bytes fails with
** FJ_ERR_INVALID_ARGUMENT. fj_free(ctx, NULL) is a no-op; on OpenCL, freeing a pointer that
** fj_malloc did not return on this context (or freeing twice) is FJ_ERR_INVALID_ARGUMENT. Copies
*are synchronous with respect
** to the host and ordered after work already queued on the context's default queue. */
FJ_API fj_status fj_malloc(fj_context *ctx, size_t bytes, void **ptr);
FJ_API fj_status fj_free(fj_context *ctx, void *ptr);
FJ_API fj_status fj_memcpy_h2d(fj_context *ctx, void *dst, const void *src, size_t bytes);
FJ_API fj_status fj_memcpy_d2h(fj_context *ctx, void *dst, const void *src, size_t bytes);

/* Waits until all work queued on stream (NULL: the context's default queue) has finished. */
FJ_API fj_status fj_synchronize(fj_context *ctx, void *stream);

#ifdef __cplusplus
}
#endif
#endif /* FLASHJIT_H */
