/* `flashjit cache build`: render and compile CUDA kernels for an arch with NVRTC alone (no GPU, no
** driver), into a cache that a GPU process later loads as hits. A release pipeline builds the
** cache it ships this way. */
#define _POSIX_C_SOURCE 200809L
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../cache/cache.h"
#include "../plan/expr.h"
#include "../runtime/build.h"
#include "../templates/render.h"
#include "tools.h"

#define MAX_VALUES 16
#define MAX_BUILT 4096

static int build_usage(FILE *f)
{
    fprintf(
        f,
        "usage: flashjit cache build --arch sm_80|sm_86|sm_89|sm_90a [options]\n"
        "Compiles the forward kernels of every combination below for the arch, with NVRTC only,\n"
        "into the cache (--cache PATH, default the user cache). Lists take commas.\n"
        "  --dtype bf16,f16,e4m3,e5m2 [bf16] (FP8: q, k, v in it, out bf16; with and without\n"
        "  descale factors)   --kv-dtype e4m3|e5m2 (k and v only: an FP8 KV cache)\n"
        "  --head-dim N,... [64,128]      --head-dim-v N,... [= head-dim]\n"
        "  --causal 0,1 [0,1]             --softcap 0,1 [0]           --lse 0,1 [1]\n"
        "  --seqlen N,... [1024,8192]     (the tiles can depend on the length)\n"
        "Masks and score terms (one kernel each; see flashjit run):\n"
        "  --mask-mod EXPR   --score-mod EXPR   --alibi   --bias f32|dtype   --mask\n"
        "  --ranges 2|4      --block-mask\n"
        "Packed sequences: --varlen 1 (cu_seqlens_q/k) or 2 (and seqused_k); with --paged P\n"
        "  (P > 0) the queries packed, the keys the pages'\n"
        "MLA's latent cache: --v-in-k (v a view of k's first head-dim-v dims, as --mla of\n"
        "  flashjit run; e.g. --head-dim 576 --head-dim-v 512 --v-in-k)\n"
        "Decode shapes (--seqlen is the keys'): --decode N,... query rows per sequence (1 to\n"
        "  16; with pages only, to 65536: chunked prefill), --group G,... [1] query heads per\n"
        "  kv head; what such calls run, whole and split (the decode kernel and the merge of\n"
        "  its splits); --paged P,... [0] k and v as a paged KV cache of P-key pages\n"
        "  (desc.page_table; 0: contiguous; page sizes share kernels but for whether a page\n"
        "  holds whole key tiles, and on sm_90 its size below a tile: e.g. --paged 0,16,64),\n"
        "  with the kernels that append to it (fj_kv_cache_append, _packed with --varlen; an\n"
        "  FP8 cache's quantising one); each decode for one sequence and for a batch of 2 GiB\n"
        "  of keys and values (large caches copy their tiles otherwise)\n"
        "Merges (fj_attention_merge) instead of the forward kernels: --merge N,... (states per\n"
        "  merge, 1 to 64), for each --dtype (states and result) and --lse\n"
        "Training: --backward also builds each request's backward kernels (fj_attention_backward;\n"
        "  with --bias, its dbias kernel too)\n");
    return 2;
}

/* Shared memory per block for the archs we target (cudaDevAttrMaxSharedMemoryPerBlockOptin). */
static uint64_t arch_shared_memory(const char *arch)
{
    if (!strncmp(arch, "sm_90", 5))
        return 232448;
    if (!strcmp(arch, "sm_80") || !strcmp(arch, "sm_87"))
        return 166912;
    return 101376; /* sm_86, sm_89 */
}

/* Parses the ptxas report in an NVRTC log: registers and spill bytes. */
static void resources(const char *log, int *regs, int *spills)
{
    const char *r = log ? strstr(log, "Used ") : NULL;
    *regs = r ? atoi(r + 5) : -1;
    const char *s = log ? strstr(log, "bytes spill stores") : NULL;
    *spills = 0;
    if (s) {
        while (s > log && s[-1] == ' ')
            s--;
        while (s > log && s[-1] >= '0' && s[-1] <= '9')
            s--;
        *spills = atoi(s);
    }
}

/* What one build run shares. */
typedef struct build_run {
    const char *arch;
    char target[64];
    const char *template_dir; /* $FLASHJIT_TEMPLATE_DIR, as a context reads it */
    char hash[65];
    fj_cache *cache;
    int built, failed, nbuilt;
    char (*built_keys)[65];
} build_run;

/* The offline compiler: NVRTC for the run's arch. */
static fj_status compile_for_arch(void *ud, const char *source, const char *options,
                                  fj__blob *binary, char **log, fj__err *err)
{
    return fj__cuda_compile_for(ud, source, options, binary, log, err);
}

/* Keys, renders, compiles and stores v (once per run) and prints its line. */
static void build_variant(build_run *r, const fj__variant *v, int64_t d, int64_t dv, int64_t causal,
                          int64_t softcap)
{
    fj__compile_job job = {.variant = *v,
                           .target = r->target,
                           .template_dir = r->template_dir,
                           .template_hash = r->hash,
                           .backend = FJ_BACKEND_CUDA,
                           .compile = compile_for_arch,
                           .compile_ud = (void *)r->arch};
    double t0 = fj__now_ms();
    fj_status st = fj__compile_job_key(&job);
    /* Requests that plan the same kernel build it once. */
    for (int b = 0; st == FJ_OK && b < r->nbuilt; b++)
        if (!strcmp(r->built_keys[b], job.key_hash)) {
            fj__compile_job_clear(&job);
            return;
        }
    if (st == FJ_OK && r->nbuilt < MAX_BUILT)
        snprintf(r->built_keys[r->nbuilt++], sizeof r->built_keys[0], "%s", job.key_hash);
    if (st == FJ_OK) {
        fj__compile_job_run(&job);
        st = job.status;
    }
    double ms = fj__now_ms() - t0;
    if (st == FJ_OK) {
        char compiler[256];
        snprintf(compiler, sizeof compiler, "%s %s", r->arch, fj__cuda_compiler_version());
        fj__err warn = {{0}};
        cache_put_kernel(r->cache, job.key_hash, "cuda", compiler, "offline", job.key_text,
                         job.binary.data, job.binary.size, ms, job.log, &warn);
        if (warn.msg[0]) {
            st = FJ_ERR_CACHE;
            snprintf(job.err.msg, sizeof job.err.msg, "%s", warn.msg);
        }
    }
    int regs = -1, spills = -1;
    resources(job.log, &regs, &spills);
    /* ptxas' C7513: the kernel's wgmma instructions run one at a time. */
    const char *serial = job.log && strstr(job.log, "C7513") ? "  wgmma serialised" : "";
    printf("%-12.12s %-14s %-5s %4lld %4lld %6lld %7lld %5d %6d %7.0fms%s%s%s\n", job.key_hash,
           fj__variant_path(v), fj__dtype_name((fj_dtype)v->q_dtype), (long long)d, (long long)dv,
           (long long)causal, (long long)softcap, regs, spills, ms, serial,
           st == FJ_OK ? "" : "  FAILED: ", st == FJ_OK ? "" : job.err.msg);
    r->built += st == FJ_OK;
    r->failed += st != FJ_OK;
    fj__compile_job_clear(&job);
}

/* Whether requests of q in dtype and k, v in kv_dtype read FP8 inputs, whose kernels come with
** and without descale factors. */
static int fp8_inputs(fj_dtype dtype, fj_dtype kv_dtype)
{
    return fj__dtype_fp8(dtype) || fj__dtype_fp8(kv_dtype);
}

/* What shapes the kernels of one offline request (see flashjit cache build --help). */
typedef struct build_request {
    fj_dtype dtype, kv_dtype; /* q's; k's and v's (q's, or FP8: an FP8 KV cache) */
    int descale;              /* FP8 inputs: with descale factors ([1] each) */
    int64_t d, dv, seqlen, causal, softcap, lse;
    int64_t decode_rows, group; /* decode: query rows and query heads per kv head (0: no) */
    int64_t page_size;          /* decode: k and v as pages of this many keys (0: contiguous) */
    const char *mask_mod, *score_mod;
    int alibi, bias, mask, ranges, block_mask, varlen;
    int v_in_k;   /* v a view of k's first dims (else v at an address of its own) */
    int backward; /* also the backward's kernels (with a bias, the dbias kernel too) */
} build_request;

/* Builds each kernel of plan; r (NULL for a merge or an append) gives the shape columns of the
** lines printed. */
static void build_plan(build_run *run, const fj__plan *plan, const build_request *r)
{
    for (int i = 0; i < plan->nsteps; i++)
        if (plan->steps[i].kind == FJ__STEP_KERNEL)
            build_variant(run, &plan->steps[i].variant, r ? r->d : 0, r ? r->dv : 0,
                          r ? r->causal : 0, r ? r->softcap : 0);
}

/* Builds the kernels of a merge's or an append's plan, or (st not FJ_OK) counts it failed with
** err's message. */
static void build_planned(build_run *run, fj_status st, const fj__err *err, const fj__plan *plan)
{
    if (st != FJ_OK) {
        fprintf(stderr, "flashjit cache build: %s\n", err->msg);
        run->failed++;
        return;
    }
    build_plan(run, plan, NULL);
}

/* Plans an append of tokens of new_dtype to a paged cache of cache_dtype (packed or not) as a
** call would, and builds its kernel. */
static void build_append_kernel(build_run *run, fj_dtype new_dtype, fj_dtype cache_dtype,
                                int packed)
{
    const fj_tensor offsets = {.data = (void *)(uintptr_t)4096, .dtype = FJ_DTYPE_I32};
    const fj__append_problem p = {.batch = 1,
                                  .tokens = 1,
                                  .heads_kv = 1,
                                  .head_dim = 128,
                                  .head_dim_v = 128,
                                  .num_pages = 1,
                                  .page_size = 16,
                                  .max_pages = 1,
                                  .cu_seqlens_new = packed ? &offsets : NULL,
                                  .dtype = cache_dtype,
                                  .new_dtype = new_dtype};
    fj__plan plan;
    fj__err err = {{0}};
    build_planned(run, fj__plan_append(&p, FJ_BACKEND_CUDA, &plan, &err), &err, &plan);
}

/* Plans a representative request of r's shape (`batch` sequences, one kv head, 16-byte
** aligned tensors: only what shapes the code matters) as a call would, and builds each kernel
** of the plan. Returns 0, or -1 when the request is not valid. */
static int build_request_at(build_run *run, const fj_device_info *dev, fj__mods *mods,
                            const build_request *r, int64_t batch)
{
    const int64_t s = r->seqlen;
    /* A decode's query rows and heads (q [1, rows, group, dim]), else s rows of one head; the
    ** keys of the masks' and bias's key dimension (a paged cache: its table's). */
    const int64_t sq = r->decode_rows ? r->decode_rows : s, hq = r->decode_rows ? r->group : 1;
    const int64_t page = r->page_size, pages = page ? (s + page - 1) / page : 0;
    const int64_t keys = page ? pages * page : s, qb = (sq + 127) / 128, kb = (keys + 127) / 128;
    void *const fake = (void *)(uintptr_t)4096; /* never read: offline */
    const int nd = r->varlen ? 3 : 4;
    /* [batch, s, 1, dim] dense, or [batch * s, 1, dim] packed. */
    fj_tensor q = {.data = fake, .dtype = r->dtype, .ndim = nd};
    const int64_t row = 1024; /* elements between rows and heads: room for any head dim */
    const int64_t shape4[4] = {batch, s, 1, r->d}, stride4[4] = {s * row, row, row, 1};
    for (int i = 0; i < nd; i++) {
        q.shape[i] = shape4[i + 4 - nd];
        q.stride[i] = stride4[i + 4 - nd];
    }
    q.shape[0] *= nd == 3 ? batch : 1;
    fj_tensor v = q;
    v.shape[nd - 1] = r->dv;
    if (!r->v_in_k) /* plans tell a view of k (MLA) by the address */
        v.data = (char *)fake + ((size_t)7 << 36);
    /* [batch, 1, s], or [1, batch * s] packed */
    const int64_t lse_rows = nd == 3 ? batch * s : s;
    fj_tensor lse = {.data = fake, .dtype = FJ_DTYPE_F32, .ndim = nd - 1};
    for (int i = 0; i < nd - 1; i++) {
        lse.shape[i] = i == nd - 2 ? lse_rows : 1;
        lse.stride[i] = i == nd - 2 ? 1 : lse_rows;
    }
    lse.shape[0] = nd == 4 ? batch : lse.shape[0];
    fj_attention_desc desc;
    fj_attention_desc_init(&desc);
    desc.causal = (int32_t)r->causal;
    desc.softcap = r->softcap ? 1.0f : 0.0f;
    desc.mask_mod = r->mask_mod;
    desc.score_mod = r->score_mod;
    desc.mod_args = fake;
    desc.mod_args_count = 1;
    const fj_tensor alibi = {
        .data = fake, .dtype = FJ_DTYPE_F32, .ndim = 1, .shape = {hq}, .stride = {1}};
    const fj_tensor bias = {.data = fake,
                            .dtype = r->bias == 1 ? FJ_DTYPE_F32 : r->dtype,
                            .ndim = 4,
                            .shape = {1, 1, sq, keys},
                            .stride = {sq * keys, sq * keys, keys, 1}};
    fj_tensor mask = bias;
    mask.dtype = FJ_DTYPE_BOOL;
    const fj_tensor ranges = {.data = fake,
                              .dtype = FJ_DTYPE_I32,
                              .ndim = 4,
                              .shape = {1, 1, keys, r->ranges},
                              .stride = {keys * r->ranges, keys * r->ranges, r->ranges, 1}};
    const fj_tensor blocks = {.data = fake,
                              .dtype = FJ_DTYPE_I32,
                              .ndim = 4,
                              .shape = {1, 1, qb, kb},
                              .stride = {qb * kb, qb * kb, kb, 1}};
    const fj_tensor cu = {
        .data = fake, .dtype = FJ_DTYPE_I32, .ndim = 1, .shape = {batch + 1}, .stride = {1}};
    const fj_tensor used = {
        .data = fake, .dtype = FJ_DTYPE_I32, .ndim = 1, .shape = {batch}, .stride = {1}};
    desc.alibi_slopes = r->alibi ? &alibi : NULL;
    desc.bias = r->bias ? &bias : NULL;
    desc.mask = r->mask ? &mask : NULL;
    desc.mask_ranges = r->ranges ? &ranges : NULL;
    desc.block_mask = r->block_mask ? &blocks : NULL;
    if (r->varlen) { /* (a paged cache's keys are its pages') */
        desc.cu_seqlens_q = &cu;
        desc.cu_seqlens_k = page ? NULL : &cu;
        desc.seqused_k = r->varlen == 2 ? &used : NULL;
        desc.max_seqlen_q = sq;
        desc.max_seqlen_k = s;
    }
    fj_tensor k = q, out = v;
    /* FP8: out in bf16 (for q in FP8) or q's dtype (an FP8 KV cache). */
    k.dtype = v.dtype = r->kv_dtype;
    if (fj__dtype_fp8(r->dtype))
        out.dtype = FJ_DTYPE_BF16;
    const fj_tensor scale = {
        .data = fake, .dtype = FJ_DTYPE_F32, .ndim = 1, .shape = {1}, .stride = {1}};
    if (r->descale) {
        desc.q_descale = fj__dtype_fp8(r->dtype) ? &scale : NULL;
        desc.k_descale = desc.v_descale = &scale;
    }
    /* A decode: q and out [batch, rows, group, dim], lse [batch, group, rows] (packed:
    ** [batch * rows, group, dim] and [group, batch * rows]). */
    if (r->decode_rows) {
        const int a = nd - 3; /* the rows' axis */
        const int64_t rows = nd == 4 ? sq : batch * sq;
        q.shape[a] = out.shape[a] = rows;
        q.shape[a + 1] = out.shape[a + 1] = hq;
        q.stride[0] = out.stride[0] = nd == 4 ? sq * hq * row : hq * row;
        q.stride[a] = out.stride[a] = hq * row;
        lse.shape[a] = hq;
        lse.shape[a + 1] = rows;
        lse.stride[0] = nd == 4 ? hq * sq : rows;
        lse.stride[a] = rows;
    }
    const fj_tensor table = {.data = fake,
                             .dtype = FJ_DTYPE_I32,
                             .ndim = 2,
                             .shape = {batch, pages},
                             .stride = {pages, 1}};
    if (page) { /* k and v [batch * pages, page, 1, dim] through a table [batch, pages] */
        for (fj_tensor *t = &k; t; t = t == &k ? &v : NULL) {
            const int64_t dim = t->shape[t->ndim - 1];
            *t = (fj_tensor){.data = t->data,
                             .dtype = t->dtype,
                             .ndim = 4,
                             .shape = {batch * pages, page, 1, dim},
                             .stride = {page * row, row, row, 1}};
        }
        desc.page_table = &table;
        desc.seqused_k = &used;
    }
    /* A decode builds its kernel whole and split (with the merge of the splits). */
    for (int32_t splits = r->decode_rows ? 1 : 0; splits <= (r->decode_rows ? 2 : 0); splits++) {
        desc.num_splits = splits;
        fj__plan plan;
        fj__err err = {{0}};
        if (fj__plan_request(&desc, &q, &k, &v, &out, r->lse ? &lse : NULL, dev,
                             getenv("FLASHJIT_CONFIG"), mods, &plan, &err) != FJ_OK) {
            fprintf(stderr, "flashjit cache build: %s\n", err.msg);
            return -1;
        }
        build_plan(run, &plan, r);
    }
    /* A paged cache is filled by appends: of its own dtype, and an FP8 cache's quantising one
    ** from q's dtype; packed where the queries are. */
    if (page) {
        build_append_kernel(run, r->kv_dtype, r->kv_dtype, r->varlen != 0);
        if (r->dtype != r->kv_dtype && !fj__dtype_fp8(r->dtype))
            build_append_kernel(run, r->dtype, r->kv_dtype, r->varlen != 0);
    }
    if (r->backward) {
        /* Gradients like their tensors, each at an address of its own (the backward checks
        ** that no output overlaps an input); dbias shaped as the bias. */
        fj_tensor dout = out, dq = q, dk = k, dv = v, dbias = bias;
        fj_tensor *moved[5] = {&dout, &dq, &dk, &dv, &dbias};
        for (int i = 0; i < 5; i++)
            moved[i]->data = (char *)fake + ((size_t)(i + 1) << 36);
        dbias.dtype = FJ_DTYPE_F32;
        desc.dbias = r->bias ? &dbias : NULL;
        desc.num_splits = 0;
        /* Both plans: dq by atomics (the default) and deterministic. */
        for (int deterministic = 0; deterministic <= 1; deterministic++) {
            desc.deterministic = deterministic;
            fj__bwd_problem bp;
            fj__plan plan;
            fj__err err = {{0}};
            if (fj__plan_backward_request(&desc, &q, &k, &v, &out, &dout, &lse, &dq, &dk, &dv, dev,
                                          getenv("FLASHJIT_BWD_CONFIG"), mods, &bp, &plan,
                                          &err) != FJ_OK) {
                fprintf(stderr, "flashjit cache build: backward: %s\n", err.msg);
                return -1;
            }
            build_plan(run, &plan, r);
        }
    }
    return 0;
}

/* K + V of the large decode cache a decode request is also built at: the decode plans differ
** by the cache's size (on sm_90 the tensor-core kernel's loaders, plan/decode.c's thresholds,
** all below this), so a shipped cache holds the kernels of small and large caches alike. */
#define LARGE_DECODE_CACHE_BYTES (1ll << 31)
#define MAX_DECODE_BATCH 65535 /* the decode grid's batch dimension */

/* Builds r's kernels (build_request_at) at one sequence and, a decode of at most
** FJ__DECODE_MAX_SEQLEN_Q rows, at a batch of LARGE_DECODE_CACHE_BYTES. */
static int build_request_kernels(build_run *run, const fj_device_info *dev, fj__mods *mods,
                                 const build_request *r)
{
    if (build_request_at(run, dev, mods, r, 1) != 0)
        return -1;
    if (!r->decode_rows || r->decode_rows > FJ__DECODE_MAX_SEQLEN_Q)
        return 0;
    const int64_t per_sequence = r->seqlen * (r->d + r->dv) * (int64_t)fj_dtype_size(r->kv_dtype);
    int64_t batch = (LARGE_DECODE_CACHE_BYTES + per_sequence - 1) / per_sequence;
    if (batch > MAX_DECODE_BATCH)
        batch = MAX_DECODE_BATCH;
    return batch > 1 ? build_request_at(run, dev, mods, r, batch) : 0;
}

/* Plans a merge of n states of dtype (the result too; lse written or not) as a call would, and
** builds each kernel of the plan. */
static void build_merge_kernels(build_run *run, fj_dtype dtype, int n, int lse)
{
    fj__merge_problem p = {.n = n,
                           .batch = 1,
                           .seqlen = 1,
                           .heads = 1,
                           .head_dim_v = 128,
                           .in_dtype = dtype,
                           .out_dtype = dtype};
    const fj_tensor fake = {.data = (void *)(uintptr_t)4096, .dtype = FJ_DTYPE_F32};
    p.lse = lse ? &fake : NULL;
    fj__plan plan;
    fj__err err = {{0}};
    build_planned(run, fj__plan_merge(&p, FJ_BACKEND_CUDA, &plan, &err), &err, &plan);
}

/* Checks an expression option (its canonical text is made when a request is planned). */
static int check_mod(const char *field, const char *text, int score)
{
    fj__expr *parsed = NULL;
    fj__err err = {{0}};
    fj_status st = fj__expr_parse(field, text, score, &parsed, &err);
    fj__expr_free(parsed);
    if (st != FJ_OK) {
        fprintf(stderr, "flashjit cache build: %s\n", err.msg);
        return -1;
    }
    return 0;
}

int fjt_cache_build(int argc, char **argv)
{
    enum {
        O_ARCH = 256,
        O_CACHE,
        O_DTYPE,
        O_KV_DTYPE,
        O_D,
        O_DV,
        O_CAUSAL,
        O_SOFTCAP,
        O_LSE,
        O_SEQ,
        O_MASK_MOD,
        O_SCORE_MOD,
        O_ALIBI,
        O_BIAS,
        O_MASK,
        O_RANGES,
        O_BLOCK_MASK,
        O_VARLEN,
        O_BACKEND,
        O_MERGE,
        O_DECODE,
        O_BACKWARD,
        O_GROUP,
        O_PAGED,
        O_V_IN_K,
        O_HELP
    };
    static const struct option opts[] = {{"arch", required_argument, 0, O_ARCH},
                                         {"cache", required_argument, 0, O_CACHE},
                                         {"dtype", required_argument, 0, O_DTYPE},
                                         {"kv-dtype", required_argument, 0, O_KV_DTYPE},
                                         {"head-dim", required_argument, 0, O_D},
                                         {"head-dim-v", required_argument, 0, O_DV},
                                         {"causal", required_argument, 0, O_CAUSAL},
                                         {"softcap", required_argument, 0, O_SOFTCAP},
                                         {"lse", required_argument, 0, O_LSE},
                                         {"seqlen", required_argument, 0, O_SEQ},
                                         {"mask-mod", required_argument, 0, O_MASK_MOD},
                                         {"score-mod", required_argument, 0, O_SCORE_MOD},
                                         {"alibi", no_argument, 0, O_ALIBI},
                                         {"bias", required_argument, 0, O_BIAS},
                                         {"mask", no_argument, 0, O_MASK},
                                         {"ranges", required_argument, 0, O_RANGES},
                                         {"block-mask", no_argument, 0, O_BLOCK_MASK},
                                         {"varlen", required_argument, 0, O_VARLEN},
                                         {"v-in-k", no_argument, 0, O_V_IN_K},
                                         {"backend", required_argument, 0, O_BACKEND},
                                         {"merge", required_argument, 0, O_MERGE},
                                         {"decode", required_argument, 0, O_DECODE},
                                         {"backward", no_argument, 0, O_BACKWARD},
                                         {"group", required_argument, 0, O_GROUP},
                                         {"paged", required_argument, 0, O_PAGED},
                                         {"help", no_argument, 0, O_HELP},
                                         {0, 0, 0, 0}};
    const char *path_opt = NULL, *mask_mod = NULL, *score_mod = NULL;
    int64_t dims[MAX_VALUES] = {64, 128}, dvs[MAX_VALUES], causal[MAX_VALUES] = {0, 1};
    int64_t softcap[MAX_VALUES] = {0}, lse[MAX_VALUES] = {1};
    int64_t lens[MAX_VALUES] = {1024, 8192}; /* the planner picks some tiles by length */
    int64_t merges[MAX_VALUES];
    int nd = 2, ndv = 0, nc = 2, ns = 1, nl = 1, nq = 2, nm = 0;
    int64_t decode_rows[MAX_VALUES] = {0}, groups[MAX_VALUES] = {1}, paged[MAX_VALUES] = {0};
    int ndec = 1, ngroup = 1, npaged = 1, decoding = 0, backward = 0;
    int alibi = 0, bias = 0, mask = 0, ranges = 0, block_mask = 0, varlen = 0, v_in_k = 0;
    fj_dtype dtypes[4] = {FJ_DTYPE_BF16}, kv_dtype = FJ_DTYPE_BF16;
    int ndt = 1, kv_given = 0, opt;
    static char built_keys[MAX_BUILT][65];
    build_run run = {.built_keys = built_keys};
    optind = 1;
    while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (opt) {
        case O_ARCH: run.arch = optarg; break;
        case O_CACHE: path_opt = optarg; break;
        case O_DTYPE: {
            ndt = 0;
            char *copy = fj__strdup(optarg), *save = NULL;
            int bad = 0;
            for (char *tok = strtok_r(copy, ",", &save); tok && ndt < 4;
                 tok = strtok_r(NULL, ",", &save)) {
                fj_dtype dt;
                if (fjt_parse_dtype(tok, &dt) || dt == FJ_DTYPE_F32)
                    bad = 1;
                else
                    dtypes[ndt++] = dt;
            }
            free(copy);
            if (ndt == 0 || bad)
                return fprintf(stderr,
                               "flashjit cache build: --dtype takes bf16, f16, e4m3 and e5m2\n"),
                       2;
            break;
        }
        case O_KV_DTYPE:
            if (fjt_parse_dtype(optarg, &kv_dtype) || !fj__dtype_fp8(kv_dtype))
                return fprintf(stderr,
                               "flashjit cache build: --kv-dtype takes e4m3 or e5m2, not '%s'\n",
                               optarg),
                       2;
            kv_given = 1;
            break;
        case O_D:
            if ((nd = fjt_parse_list("head-dim", optarg, 1, 576, dims, MAX_VALUES)) < 0)
                return 2;
            break;
        case O_DV:
            if ((ndv = fjt_parse_list("head-dim-v", optarg, 1, 576, dvs, MAX_VALUES)) < 0)
                return 2;
            break;
        case O_CAUSAL:
            if ((nc = fjt_parse_list("causal", optarg, 0, 1, causal, MAX_VALUES)) < 0)
                return 2;
            break;
        case O_SOFTCAP:
            if ((ns = fjt_parse_list("softcap", optarg, 0, 1, softcap, MAX_VALUES)) < 0)
                return 2;
            break;
        case O_LSE:
            if ((nl = fjt_parse_list("lse", optarg, 0, 1, lse, MAX_VALUES)) < 0)
                return 2;
            break;
        case O_SEQ:
            if ((nq = fjt_parse_list("seqlen", optarg, 1, INT32_MAX, lens, MAX_VALUES)) < 0)
                return 2;
            break;
        case O_MASK_MOD:
            if (check_mod("mask_mod", optarg, 0))
                return 2;
            mask_mod = optarg;
            break;
        case O_SCORE_MOD:
            if (check_mod("score_mod", optarg, 1))
                return 2;
            score_mod = optarg;
            break;
        case O_ALIBI: alibi = 1; break;
        case O_V_IN_K: v_in_k = 1; break;
        case O_BIAS:
            bias = 1 + fjt_pick(optarg, (const char *const[]){"f32", "dtype", NULL});
            if (bias == 0)
                return fprintf(stderr, "flashjit cache build: --bias takes f32 or dtype\n"), 2;
            break;
        case O_MASK: mask = 1; break;
        case O_RANGES:
            ranges = 2 * (1 + fjt_pick(optarg, (const char *const[]){"2", "4", NULL}));
            if (ranges == 0)
                return fprintf(stderr, "flashjit cache build: --ranges takes 2 or 4\n"), 2;
            break;
        case O_BLOCK_MASK: block_mask = 1; break;
        case O_VARLEN:
            varlen = 1 + fjt_pick(optarg, (const char *const[]){"1", "2", NULL});
            if (varlen == 0)
                return fprintf(stderr, "flashjit cache build: --varlen takes 1 or 2\n"), 2;
            break;
        case O_MERGE:
            if ((nm = fjt_parse_list("merge", optarg, 1, FJ__MERGE_MAX_STATES, merges,
                                     MAX_VALUES)) < 0)
                return 2;
            break;
        case O_DECODE:
            if ((ndec = fjt_parse_list("decode", optarg, 1, 65536, decode_rows, MAX_VALUES)) < 0)
                return 2;
            decoding = 1;
            break;
        case O_BACKWARD: backward = 1; break;
        case O_GROUP:
            if ((ngroup = fjt_parse_list("group", optarg, 1, 128, groups, MAX_VALUES)) < 0)
                return 2;
            break;
        case O_PAGED:
            if ((npaged = fjt_parse_list("paged", optarg, 0, 4096, paged, MAX_VALUES)) < 0)
                return 2;
            break;
        case O_BACKEND:
            if (strcmp(optarg, "cuda") != 0)
                return fprintf(stderr,
                               "flashjit cache build: only --backend cuda builds offline\n"),
                       2;
            break;
        case O_HELP: build_usage(stdout); return 0;
        default: return build_usage(stderr);
        }
    }
    int fp8_q = 0; /* FP8 queries (FP8 k and v too) */
    for (int a = 0; a < ndt; a++) {
        fp8_q |= fj__dtype_fp8(dtypes[a]);
        if (kv_given && fj__dtype_fp8(dtypes[a]))
            return fprintf(stderr,
                           "flashjit cache build: --kv-dtype goes with 16-bit queries "
                           "(--dtype bf16 or f16), not --dtype %s\n",
                           fj__dtype_name(dtypes[a])),
                   2;
    }
    if ((fp8_q || kv_given) && (backward || nm))
        return fprintf(stderr, "flashjit cache build: FP8 (--dtype e4m3|e5m2, --kv-dtype) has no "
                               "backward and no merge of its own (merges take the bf16 or f16 "
                               "states)\n"),
               2;
    if (backward && decoding)
        return fprintf(stderr, "flashjit cache build: --backward takes prefill shapes, not "
                               "--decode\n"),
               2;
    for (int i = 0; i < ndec * npaged; i++)
        if (decode_rows[i / npaged] > FJ__DECODE_MAX_SEQLEN_Q && !paged[i % npaged])
            return fprintf(stderr, "flashjit cache build: --decode beyond %d rows takes a paged "
                                   "cache (--paged P, P > 0: chunked prefill)\n",
                           FJ__DECODE_MAX_SEQLEN_Q),
                   2;
    for (int i = 0; i < npaged; i++)
        if (paged[i] && (!decoding || fp8_q))
            return fprintf(stderr, "flashjit cache build: --paged goes with --decode and 16-bit "
                                   "queries (an FP8 cache: --kv-dtype)\n"),
                   2;
    int sm = 0;
    char suffix = 0;
    if (!run.arch || sscanf(run.arch, "sm_%d%c", &sm, &suffix) < 1 || sm < 80 ||
        (suffix && suffix != 'a'))
        return fprintf(stderr,
                       "flashjit cache build: --arch takes sm_80 or newer (sm_80, sm_86, sm_89, "
                       "sm_90a), not '%s'\n",
                       run.arch ? run.arch : "(none)"),
               2;
    if (sm == 90 && suffix != 'a')
        fprintf(stderr, "flashjit cache build: note: sm_90 has no wgmma; an H100 or H200 runs the "
                        "Hopper kernel only from sm_90a binaries (--arch sm_90a)\n");

    fj__err err = {{0}};
    run.template_dir = tpl_env_dir();
    tpl_set_hash(run.template_dir, run.hash, &err);
    char *path = path_opt ? fj__strdup(path_opt) : fj__default_cache_path();
    cache_options co = {.path = path};
    cache_open(&co, &run.cache, &err);
    if (!cache_writable(run.cache)) {
        fprintf(stderr, "flashjit cache build: %s\n", err.msg);
        cache_close(run.cache);
        free(path);
        return 1;
    }
    snprintf(run.target, sizeof run.target, "cuda|%s", run.arch);
    fj_device_info dev = {.struct_size = sizeof dev,
                          .backend = FJ_BACKEND_CUDA,
                          .local_memory = arch_shared_memory(run.arch)};
    snprintf(dev.arch, sizeof dev.arch, "%s", run.arch);

    printf("%-12s %-14s %-5s %4s %4s %6s %7s %5s %6s %9s\n", "key", "path", "dtype", "d", "dv",
           "causal", "softcap", "regs", "spills", "compile");
    fj__mods mods = {0};
    int bad = 0;
    for (int a = 0; a < ndt && nm; a++)
        for (int m = 0; m < nm; m++)
            for (int l = 0; l < nl; l++)
                build_merge_kernels(&run, dtypes[a], (int)merges[m], (int)lse[l]);
    for (int a = 0; a < ndt && !bad && !nm; a++) {
        /* k and v: the FP8 KV cache's dtype, or q's */
        const fj_dtype kv = kv_given ? kv_dtype : dtypes[a];
        for (int i = 0; i < nd && !bad; i++)
            for (int c = 0; c < nc && !bad; c++)
                for (int sc = 0; sc < ns && !bad; sc++)
                    for (int l = 0; l < nl * nq * ndec * ngroup * npaged *
                                            (fp8_inputs(dtypes[a], kv) ? 2 : 1) &&
                                    !bad;
                         l++) {
                        /* l's digits: seqlen, lse, decode rows, group, paged, descale */
                        const int at_seq = l % nq, at_lse = l / nq % nl;
                        const int at_dec = l / (nq * nl) % ndec;
                        const int at_group = l / (nq * nl * ndec) % ngroup;
                        const int at_paged = l / (nq * nl * ndec * ngroup) % npaged;
                        const build_request r = {.dtype = dtypes[a],
                                                 .kv_dtype = kv,
                                                 .descale = l / (nq * nl * ndec * ngroup * npaged),
                                                 .decode_rows =
                                                     decoding ? decode_rows[at_dec] : 0,
                                                 .group = groups[at_group],
                                                 .page_size = paged[at_paged],
                                                 .d = dims[i],
                                                 .dv = ndv ? dvs[i < ndv ? i : ndv - 1] : dims[i],
                                                 .seqlen = lens[at_seq],
                                                 .causal = causal[c],
                                                 .softcap = softcap[sc],
                                                 .lse = lse[at_lse],
                                                 .mask_mod = mask_mod,
                                                 .score_mod = score_mod,
                                                 .alibi = alibi,
                                                 .bias = bias,
                                                 .mask = mask,
                                                 .ranges = ranges,
                                                 .block_mask = block_mask,
                                                 .varlen = varlen,
                                                 .v_in_k = v_in_k,
                                                 .backward = backward};
                        bad = build_request_kernels(&run, &dev, &mods, &r) != 0;
                    }
    }
    fj__mods_free(&mods);
    if (bad) {
        cache_close(run.cache);
        free(path);
        return 2;
    }
    printf("%d kernels built for %s into %s, %d failed\n", run.built, run.arch, path, run.failed);
    cache_close(run.cache);
    free(path);
    return run.failed ? 1 : 0;
}
