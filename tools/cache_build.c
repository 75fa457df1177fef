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
        "  --seqlen N,... [1024,8192]     (the tiles can depend on the length)\n");
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

int fjt_cache_build(int argc, char **argv)
{
    enum { O_ARCH = 256, O_CACHE, O_DTYPE, O_D, O_DV, O_CAUSAL, O_SOFTCAP, O_LSE, O_SEQ, O_HELP };
    static const struct option opts[] = {{"arch", required_argument, 0, O_ARCH},
                                         {"cache", required_argument, 0, O_CACHE},
                                         {"dtype", required_argument, 0, O_DTYPE},
                                         {"head-dim", required_argument, 0, O_D},
                                         {"head-dim-v", required_argument, 0, O_DV},
                                         {"causal", required_argument, 0, O_CAUSAL},
                                         {"softcap", required_argument, 0, O_SOFTCAP},
                                         {"lse", required_argument, 0, O_LSE},
                                         {"seqlen", required_argument, 0, O_SEQ},
                                         {"backend", required_argument, 0, O_HELP + 1},
                                         {"help", no_argument, 0, O_HELP},
                                         {0, 0, 0, 0}};
    const char *arch = NULL, *path_opt = NULL;
    int64_t dims[MAX_VALUES] = {64, 128}, dvs[MAX_VALUES], causal[MAX_VALUES] = {0, 1};
    int64_t softcap[MAX_VALUES] = {0}, lse[MAX_VALUES] = {1};
    int64_t lens[MAX_VALUES] = {1024, 8192}; /* the planner picks some tiles by length */
    int nd = 2, ndv = 0, nc = 2, ns = 1, nl = 1, nq = 2;
    fj_dtype dtypes[2] = {FJ_DTYPE_BF16};
    int ndt = 1, opt;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (opt) {
        case O_ARCH: arch = optarg; break;
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
        case O_HELP + 1:
            if (strcmp(optarg, "cuda") != 0)
                return fprintf(stderr,
                               "flashjit cache build: only --backend cuda builds offline\n"),
                       2;
            break;
        case O_HELP: build_usage(stdout); return 0;
        default: return build_usage(stderr);
        }
    }
    if (!arch || strncmp(arch, "sm_", 3) != 0)
        return build_usage(stderr);

    fj__err err = {{0}};
    char hash[65];
    tpl_set_hash(hash, &err);
    char *path = path_opt ? fj__strdup(path_opt) : fj__default_cache_path();
    fj_cache *cache = NULL;
    cache_options co = {.path = path};
    cache_open(&co, &cache, &err);
    if (!cache_writable(cache)) {
        fprintf(stderr, "flashjit cache build: %s\n", err.msg);
        cache_close(cache);
        free(path);
        return 1;
    }
    char target[64], compiler[256];
    snprintf(target, sizeof target, "cuda|%s", arch);
    fj_device_info dev = {.struct_size = sizeof dev,
                          .backend = FJ_BACKEND_CUDA,
                          .local_memory = arch_shared_memory(arch)};
    snprintf(dev.arch, sizeof dev.arch, "%s", arch);

    int built = 0, failed = 0, nbuilt = 0;
    static char built_keys[MAX_BUILT][65];
    printf("%-12s %-14s %-5s %4s %4s %6s %7s %5s %6s %9s\n", "key", "path", "dtype", "d", "dv",
           "causal", "softcap", "regs", "spills", "compile");
    for (int a = 0; a < ndt; a++)
        for (int i = 0; i < nd; i++)
            for (int c = 0; c < nc; c++)
                for (int sc = 0; sc < ns; sc++)
                    for (int l = 0; l < nl * nq; l++) {
                        int64_t seqlen = lens[l % nq];
                        int64_t d = dims[i], dv = ndv ? dvs[i < ndv ? i : ndv - 1] : d;
                        /* A representative aligned request; only what shapes the code matters. */
                        fj_tensor t = {.data = (void *)(uintptr_t)256,
                                       .dtype = dtypes[a],
                                       .ndim = 4,
                                       .shape = {1, 128, 1, d},
                                       .stride = {128 * 256, 256, 256, 1}};
                        fj_tensor tv = t;
                        tv.shape[3] = dv;
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
                                         .window_right = causal[c] ? 0 : -1};
                        fj__variant v;
                        fj__plan_forward(&p, &dev, getenv("FLASHJIT_CONFIG"), &v);
                        char *key_text = NULL, *source = NULL, *log = NULL, key[65];
                        fj__blob bin = {0};
                        double t0 = fj__now_ms();
                        fj_status st = fj__variant_key(&v, target, hash, &key_text, key, &err);
                        /* Lengths that plan the same kernel build it once. */
                        int seen = 0;
                        for (int b = 0; st == FJ_OK && b < nbuilt && !seen; b++)
                            seen = !strcmp(built_keys[b], key);
                        if (seen) {
                            free(key_text);
                            continue;
                        }
                        if (st == FJ_OK && nbuilt < MAX_BUILT)
                            snprintf(built_keys[nbuilt++], sizeof built_keys[0], "%s", key);
                        if (st == FJ_OK)
                            st = fj__variant_render(&v, key_text, &source, &err);
                        if (st == FJ_OK)
                            st = fj__cuda_compile_for(arch, source,
                                                      fj__compile_options(FJ_BACKEND_CUDA), &bin,
                                                      &log, &err);
                        double ms = fj__now_ms() - t0;
                        if (source)
                            fj__dump_compile(key, key_text, source,
                                             fj__compile_options(FJ_BACKEND_CUDA), log);
                        if (st == FJ_OK) {
                            snprintf(compiler, sizeof compiler, "%s %s", arch,
                                     fj__cuda_compiler_version());
                            fj__err warn = {{0}};
                            cache_put_kernel(cache, key, "cuda", compiler, "offline", key_text,
                                             bin.data, bin.size, ms, log, &warn);
                            if (warn.msg[0]) {
                                st = FJ_ERR_CACHE;
                                snprintf(err.msg, sizeof err.msg, "%s", warn.msg);
                            }
                        }
                        int regs = -1, spills = -1;
                        resources(log, &regs, &spills);
                        /* ptxas' C7513: the kernel's wgmma instructions run one at a time. */
                        const char *serial =
                            log && strstr(log, "C7513") ? "  wgmma serialised" : "";
                        printf("%-12.12s %-14s %-5s %4lld %4lld %6lld %7lld %5d %6d %7.0fms%s%s%s\n",
                               key, fj__variant_path(&v), fj__dtype_name(dtypes[a]), (long long)d,
                               (long long)dv, (long long)causal[c], (long long)softcap[sc], regs,
                               spills, ms, serial, st == FJ_OK ? "" : "  FAILED: ",
                               st == FJ_OK ? "" : err.msg);
                        built += st == FJ_OK;
                        failed += st != FJ_OK;
                        free(key_text);
                        free(source);
                        free(log);
                        free(bin.data);
                    }
    printf("%d kernels built for %s into %s, %d failed\n", built, arch, path, failed);
    cache_close(cache);
    free(path);
    return failed ? 1 : 0;
}
