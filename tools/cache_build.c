/* `flashjit cache build`: render and compile CUDA kernels for an arch with NVRTC alone (no GPU, no
** driver), into a cache that a GPU process later loads as hits. A release pipeline builds the
** cache it ships this way. */
#define _POSIX_C_SOURCE 200809L
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../templates/render.h"
#include "cache.h"
#include "context.h"
#include "expr.h"
#include "tools.h"

#define MAX_VALUES 16
#define MAX_BUILT 4096

/* A comma-separated list of integers ("64,128,256"); returns the count. */
static int parse_list(const char *s, int64_t *out)
{
    int n = 0;
    char *copy = fj__strdup(s), *save = NULL;
    for (char *tok = strtok_r(copy, ",", &save); tok && n < MAX_VALUES;
         tok = strtok_r(NULL, ",", &save))
        out[n++] = strtoll(tok, NULL, 10);
    free(copy);
    return n;
}

static int build_usage(FILE *f)
{
    fprintf(
        f,
        "usage: flashjit cache build --arch sm_80|sm_86|sm_89|sm_90a [options]\n"
        "Compiles the forward kernels of every combination below for the arch, with NVRTC only,\n"
        "into the cache (--cache PATH, default the user cache). Lists take commas.\n"
        "  --dtype bf16,f16 [bf16]        --head-dim N,... [64,128]   --head-dim-v N,... [= "
        "head-dim]\n"
        "  --causal 0,1 [0,1]             --softcap 0,1 [0]           --lse 0,1 [1]\n"
        "  --seqlen N,... [1024,8192]     (the tiles can depend on the length)\n"
        "Masks and score terms (one kernel each; see flashjit run):\n"
        "  --mask-mod EXPR   --score-mod EXPR   --alibi   --bias f32|dtype   --mask\n"
        "  --ranges 2|4      --block-mask\n"
        "Packed sequences: --varlen 1 (cu_seqlens_q/k) or 2 (and seqused_k)\n");
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
    char hash[65];
    fj_cache *cache;
    int built, failed, nbuilt;
    char (*built_keys)[65];
} build_run;

/* Renders, compiles and stores v (once per run) and prints its line. */
static void build_variant(build_run *r, const fj__variant *v, int64_t d, int64_t dv,
                          int64_t causal, int64_t softcap)
{
    fj__err err = {{0}};
    char *key_text = NULL, *source = NULL, *log = NULL, key[65], compiler[256];
    fj__blob bin = {0};
    double t0 = fj__now_ms();
    fj_status st = fj__variant_key(v, r->target, r->hash, &key_text, key, &err);
    /* Lengths that plan the same kernel build it once. */
    for (int b = 0; st == FJ_OK && b < r->nbuilt; b++)
        if (!strcmp(r->built_keys[b], key)) {
            free(key_text);
            return;
        }
    if (st == FJ_OK && r->nbuilt < MAX_BUILT)
        snprintf(r->built_keys[r->nbuilt++], sizeof r->built_keys[0], "%s", key);
    if (st == FJ_OK)
        st = fj__variant_render(v, key_text, &source, &err);
    if (st == FJ_OK)
        st = fj__cuda_compile_for(r->arch, source, fj__compile_options(FJ_BACKEND_CUDA), &bin,
                                  &log, &err);
    double ms = fj__now_ms() - t0;
    if (source)
        fj__dump_compile(key, key_text, source, fj__compile_options(FJ_BACKEND_CUDA), log);
    if (st == FJ_OK) {
        snprintf(compiler, sizeof compiler, "%s %s", r->arch, fj__cuda_compiler_version());
        fj__err warn = {{0}};
        cache_put_kernel(r->cache, key, "cuda", compiler, "offline", key_text, bin.data,
                         bin.size, ms, log, &warn);
        if (warn.msg[0]) {
            st = FJ_ERR_CACHE;
            snprintf(err.msg, sizeof err.msg, "%s", warn.msg);
        }
    }
    int regs = -1, spills = -1;
    resources(log, &regs, &spills);
    /* ptxas' C7513: the kernel's wgmma instructions run one at a time. */
    const char *serial = log && strstr(log, "C7513") ? "  wgmma serialised" : "";
    printf("%-12.12s %-14s %-5s %4lld %4lld %6lld %7lld %5d %6d %7.0fms%s%s%s\n", key,
           fj__variant_path(v), fj__dtype_name((fj_dtype)v->dtype), (long long)d, (long long)dv,
           (long long)causal, (long long)softcap, regs, spills, ms, serial,
           st == FJ_OK ? "" : "  FAILED: ", st == FJ_OK ? "" : err.msg);
    r->built += st == FJ_OK;
    r->failed += st != FJ_OK;
    free(key_text);
    free(source);
    free(log);
    free(bin.data);
}

/* Parses an expression option into its canonical text (static storage per option). */
static int parse_mod(const char *field, const char *text, int score, const char **out)
{
    static fj__expr *parsed[2];
    fj__err err = {{0}};
    fj__expr_free(parsed[score]);
    parsed[score] = NULL;
    if (fj__expr_parse(field, text, score, &parsed[score], &err) != FJ_OK) {
        fprintf(stderr, "flashjit cache build: %s\n", err.msg);
        return -1;
    }
    *out = fj__expr_text(parsed[score]);
    return 0;
}

int fjt_cache_build(int argc, char **argv)
{
    enum {
        O_ARCH = 256,
        O_CACHE,
        O_DTYPE,
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
        O_HELP
    };
    static const struct option opts[] = {{"arch", required_argument, 0, O_ARCH},
                                         {"cache", required_argument, 0, O_CACHE},
                                         {"dtype", required_argument, 0, O_DTYPE},
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
                                         {"backend", required_argument, 0, O_BACKEND},
                                         {"help", no_argument, 0, O_HELP},
                                         {0, 0, 0, 0}};
    const char *path_opt = NULL, *mask_mod = NULL, *score_mod = NULL;
    int64_t dims[MAX_VALUES] = {64, 128}, dvs[MAX_VALUES], causal[MAX_VALUES] = {0, 1};
    int64_t softcap[MAX_VALUES] = {0}, lse[MAX_VALUES] = {1};
    int64_t lens[MAX_VALUES] = {1024, 8192}; /* the planner picks some tiles by length */
    int nd = 2, ndv = 0, nc = 2, ns = 1, nl = 1, nq = 2;
    int alibi = 0, bias = 0, mask = 0, ranges = 0, block_mask = 0, varlen = 0;
    fj_dtype dtypes[2] = {FJ_DTYPE_BF16};
    int ndt = 1, opt;
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
            for (char *tok = strtok_r(copy, ",", &save); tok && ndt < 2;
                 tok = strtok_r(NULL, ",", &save)) {
                fj_dtype dt;
                if (fjt_parse_dtype(tok, &dt) || dt == FJ_DTYPE_F32)
                    bad = 1;
                else
                    dtypes[ndt++] = dt;
            }
            free(copy);
            if (ndt == 0 || bad)
                return fprintf(stderr, "flashjit cache build: --dtype takes bf16 and f16\n"), 2;
            break;
        }
        case O_D: nd = parse_list(optarg, dims); break;
        case O_DV: ndv = parse_list(optarg, dvs); break;
        case O_CAUSAL: nc = parse_list(optarg, causal); break;
        case O_SOFTCAP: ns = parse_list(optarg, softcap); break;
        case O_LSE: nl = parse_list(optarg, lse); break;
        case O_SEQ: nq = parse_list(optarg, lens); break;
        case O_MASK_MOD:
            if (parse_mod("mask_mod", optarg, 0, &mask_mod))
                return 2;
            break;
        case O_SCORE_MOD:
            if (parse_mod("score_mod", optarg, 1, &score_mod))
                return 2;
            break;
        case O_ALIBI: alibi = 1; break;
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
    if (!run.arch || strncmp(run.arch, "sm_", 3) != 0)
        return build_usage(stderr);

    fj__err err = {{0}};
    tpl_set_hash(run.hash, &err);
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
    for (int a = 0; a < ndt; a++)
        for (int i = 0; i < nd; i++)
            for (int c = 0; c < nc; c++)
                for (int sc = 0; sc < ns; sc++)
                    for (int l = 0; l < nl * nq; l++) {
                        int64_t seqlen = lens[l % nq];
                        int64_t d = dims[i], dv = ndv ? dvs[i < ndv ? i : ndv - 1] : d;
                        /* A representative aligned request; only what shapes the code matters
                        ** (the optional tensors' presence and the bias's dtype). */
                        fj_tensor t = {.data = (void *)(uintptr_t)256,
                                       .dtype = dtypes[a],
                                       .ndim = 4,
                                       .shape = {1, 128, 1, d},
                                       .stride = {128 * 256, 256, 256, 1}};
                        fj_tensor tv = t, tb = t, tr = t;
                        tv.shape[3] = dv;
                        tb.dtype = bias == 1 ? FJ_DTYPE_F32 : dtypes[a];
                        tr.shape[3] = ranges;
                        fj__problem p = {.dtype = dtypes[a],
                                         .head_dim = d,
                                         .head_dim_v = dv,
                                         .q = &t,
                                         .k = &t,
                                         .v = &tv,
                                         .out = &tv,
                                         .lse = lse[l / nq] ? &t : NULL,
                                         .seqlen_q = seqlen,
                                         .seqlen_k = seqlen,
                                         .softcap = softcap[sc] ? 1.0f : 0,
                                         .window_left = -1,
                                         .window_right = causal[c] ? 0 : -1,
                                         .mask_mod = mask_mod,
                                         .score_mod = score_mod,
                                         .alibi = alibi ? &t : NULL,
                                         .bias = bias ? &tb : NULL,
                                         .mask = mask ? &t : NULL,
                                         .mask_ranges = ranges ? &tr : NULL,
                                         .block_mask = block_mask ? &t : NULL,
                                         .cu_seqlens_q = varlen ? &t : NULL,
                                         .cu_seqlens_k = varlen ? &t : NULL,
                                         .seqused_k = varlen == 2 ? &t : NULL};
                        p.bias_stride[2] = seqlen; /* a contiguous [1, 1, sq, sk] bias */
                        fj__variant v;
                        fj__plan_forward(&p, &dev, getenv("FLASHJIT_CONFIG"), &v);
                        build_variant(&run, &v, d, dv, causal[c], softcap[sc]);
                        if (fj__needs_classes(&v)) {
                            fj__variant cv;
                            fj__classify_variant(&v, &cv);
                            build_variant(&run, &cv, d, dv, causal[c], softcap[sc]);
                        }
                    }
    printf("%d kernels built for %s into %s, %d failed\n", run.built, run.arch, path,
           run.failed);
    cache_close(run.cache);
    free(path);
    return run.failed ? 1 : 0;
}
