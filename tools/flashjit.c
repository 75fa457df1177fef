/* flashjit: the command-line tool. `info` describes the library and devices; `run` computes one
** attention on fresh random data, checks it against the float64 reference and times it. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "../backend/backend.h"
#include "flashjit.h"
#include "reference.h"
#include "tools.h"

static const char *backend_name(fj_backend_kind k)
{
    return k == FJ_BACKEND_CUDA ? "cuda" : k == FJ_BACKEND_OPENCL ? "opencl" : "auto";
}

static const char *source_name(fj_kernel_source s)
{
    switch (s) {
    case FJ_KERNEL_MEMORY: return "memory (already loaded)";
    case FJ_KERNEL_USER_CACHE: return "user cache";
    case FJ_KERNEL_SHIPPED_CACHE: return "shipped cache";
    case FJ_KERNEL_COMPILED: return "compiled now";
    default: return "none";
    }
}

static int usage(FILE *f)
{
    fprintf(
        f,
        "usage: flashjit <command> [options]\n"
        "\n"
        "commands:\n"
        "  info              version, backends, devices and the cache path\n"
        "  run [options]     one attention on random data: checks it against a float64\n"
        "                    reference, times it, prints PASS or FAIL (exit status 1)\n"
        "  tune [options]    tune tile configurations over a grid of shapes (tune --help)\n"
        "  cache <command>   path, ls, verify, export, import, prune, keygen, sign,\n"
        "                    build (cache --help)\n"
        "\n"
        "run options (defaults in brackets):\n"
        "  --backend auto|cuda|opencl [auto]   --device N [0]\n"
        "  --batch N [2]   --heads N [8]   --kv-heads N [= heads]\n"
        "  --seqlen N [512] (both)   --seqlen-q N   --seqlen-k N\n"
        "  --head-dim N [64]   --head-dim-v N [= head-dim]\n"
        "  --dtype bf16|f16|f32|e4m3|e5m2 [bf16] (FP8: q, k, v in it, out bf16)\n"
        "  --kv-dtype e4m3|e5m2    k and v only in FP8: an FP8 KV cache (q, out: --dtype)\n"
        "  --causal   --window-left N   --window-right N   --softcap X   --scale X\n"
        "  --layout bshd|bhsd|padded [bshd]   --no-lse\n"
        "  --reps N [5] timed calls   --seed N [fresh]   --no-check   --cache PATH\n"
        "  --shipped PATH (read-only cache, repeatable)   --trusted-key HEX (Ed25519, repeatable:\n"
        "      shipped caches must be signed by one; see flashjit cache sign)\n"
        "  --mask-mod EXPR   --score-mod EXPR   --mod-args X,Y,... (arg[0], arg[1], ...)\n"
        "      e.g. --mask-mod \"q / 64 == k / 64\" --score-mod \"s - arg[h] * abs(q - k)\"\n"
        "  --alibi heads|batch     random ALiBi slopes, [heads] or [batch, heads]\n"
        "  --bias full|heads|keys  random bias [b, h, sq, sk], [1, h, sq, sk] or a key bias\n"
        "                          broadcast by stride 0; --bias-f32: in f32, else the dtype\n"
        "                          (FP8: f32)\n"
        "  --mask random|keys      random bool mask [b, h, sq, sk], or key padding [b, 1, 1, sk]\n"
        "  --varlen                the batch as packed sequences of random lengths up to the\n"
        "                          seqlens (cu_seqlens_q/k); --seqused-k: also seqused_k\n"
        "  --ranges 2|4            random FlashMask column ranges, one or two per key\n"
        "  --block-mask full|shared  random 128 x 128 block classes, [b, h, ...] or [1, 1, ...]\n"
        "  --splits N              decode (seqlen-q <= 16): split the keys N ways (1-64;\n"
        "                          0 [default]: the plan's choice)\n"
        "  --paged N               k and v as a paged KV cache of N-key pages (shuffled page\n"
        "                          table; sequences of seqlen-k, 0, 1 and random keys); with\n"
        "                          --varlen the queries packed (cu_seqlens_q), a mixed batch\n"
        "  --append N              with --paged: each sequence's last N keys written by\n"
        "                          fj_kv_cache_append (packed with --varlen; into an FP8 cache\n"
        "                          quantised from --dtype, with descale factors)\n"
        "  --mla                   MLA's shape: one kv head of 576 dims whose first 512 are v\n"
        "                          (v a view of k); sets --head-dim, --head-dim-v, --kv-heads\n"
        "  --backward              also the gradients (fj_attention_backward) of a random dout,\n"
        "                          each checked against the float64 reference, and timed\n"
        "                          (not with --paged, --mla or --no-lse)\n"
        "  --dbias                 with --bias: also the bias's gradient (desc.dbias; implies\n"
        "                          --backward)\n"
        "  --deterministic         the backward bit-identical run to run (desc.deterministic;\n"
        "                          implies --backward; default: dq added by atomics)\n"
        "\n"
        "environment:\n"
        "  FLASHJIT_CACHE    the kernel cache file [$XDG_CACHE_HOME/flashjit/kernels.db,\n"
        "                    else ~/.cache/flashjit/kernels.db]\n"
        "  FLASHJIT_CONFIG   tile and path overrides, e.g. path=mma or stages=3 (README)\n"
        "  FLASHJIT_BWD_CONFIG  the backward's tile overrides, e.g. warps=8,tile_m=32\n"
        "  FLASHJIT_TUNE     never | on_miss: tune the first call of each shape bucket\n"
        "  FLASHJIT_LOG      info: a line on stderr for each kernel compiled (and what it\n"
        "                    cost) or loaded from a cache; debug: also each launch\n"
        "  FLASHJIT_DUMP     a folder: each compile's source, options, log and key\n"
        "\n"
        "exit status: 0 success (PASS), 1 a check failed (FAIL), 2 bad usage or arguments,\n"
        "  or no usable device\n"
        "\n"
        "examples:\n"
        "  flashjit info\n"
        "  flashjit run --seqlen 4096 --head-dim 128 --causal --backward\n"
        "  flashjit run --seqlen-q 1 --seqlen-k 32768 --heads 32 --kv-heads 8 --paged 16\n"
        "  flashjit cache build --arch sm_90a --head-dim 64,128 --cache app.db\n");
    return 2;
}

int fjt_parse_int(const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out)
{
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!s[0] || *end || errno == ERANGE || v < lo || v > hi) {
        fprintf(stderr, "flashjit: --%s takes an integer from %lld to %lld, not '%s'\n", opt,
                (long long)lo, (long long)hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

int fjt_parse_list(const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out, int max)
{
    int n = 0;
    const char *p = s;
    for (;;) {
        char item[32];
        size_t len = strcspn(p, ",");
        if (n == max || len >= sizeof item) {
            fprintf(stderr,
                    "flashjit: --%s takes up to %d integers separated by commas, not '%s'\n", opt,
                    max, s);
            return -1;
        }
        memcpy(item, p, len);
        item[len] = '\0';
        if (fjt_parse_int(opt, item, lo, hi, &out[n++]))
            return -1;
        if (!p[len])
            return n;
        p += len + 1;
    }
}

int fjt_parse_float(const char *opt, const char *s, float *out)
{
    char *end = NULL;
    errno = 0;
    float v = strtof(s, &end);
    if (!s[0] || *end || !isfinite(v)) { /* underflow (ERANGE) to a subnormal is a number */
        fprintf(stderr, "flashjit: --%s takes a finite number, not '%s'\n", opt, s);
        return -1;
    }
    *out = v;
    return 0;
}

int fjt_pick(const char *s, const char *const *words)
{
    for (int i = 0; words[i]; i++)
        if (!strcasecmp(s, words[i]))
            return i;
    return -1;
}

int fjt_parse_dtype(const char *s, fj_dtype *dtype)
{
    static const char *const words[] = {"bf16", "f16",  "fp16",   "f32",    "fp32",
                                        "e4m3", "e5m2", "f8e4m3", "f8e5m2", NULL};
    static const fj_dtype values[] = {FJ_DTYPE_BF16,    FJ_DTYPE_F16,     FJ_DTYPE_F16,
                                      FJ_DTYPE_F32,     FJ_DTYPE_F32,     FJ_DTYPE_F8_E4M3,
                                      FJ_DTYPE_F8_E5M2, FJ_DTYPE_F8_E4M3, FJ_DTYPE_F8_E5M2};
    int i = fjt_pick(s, words);
    if (i < 0)
        return -1;
    *dtype = values[i];
    return 0;
}

int fjt_parse_backend(const char *s, fj_backend_kind *k)
{
    static const char *const words[] = {"auto", "cuda", "opencl", NULL};
    static const fj_backend_kind values[] = {FJ_BACKEND_AUTO, FJ_BACKEND_CUDA, FJ_BACKEND_OPENCL};
    int i = fjt_pick(s, words);
    if (i < 0)
        return -1;
    *k = values[i];
    return 0;
}

static void print_device(const fj_device_info *d)
{
    printf("  device %d: %s", (int)d->index, d->name);
    if (d->platform[0])
        printf(" (%s)", d->platform);
    printf(", %d compute units, %.1f GiB, %llu KiB shared, arch %s, driver %s\n",
           (int)d->compute_units, (double)d->global_memory / (1 << 30),
           (unsigned long long)(d->local_memory >> 10), d->arch, d->driver);
}

/* A context's cache warning (an unusable cache file, a shipped cache not used), if any. */
static void print_cache_warning(const fj_context *ctx)
{
    const char *w = fj_context_last_error(ctx);
    if (w && w[0])
        fprintf(stderr, "flashjit: warning: %s\n", w);
}

static int cmd_info(void)
{
    printf("flashjit %s\n", fj_version());
    fj_backend_kind kinds[] = {FJ_BACKEND_CUDA, FJ_BACKEND_OPENCL};
    for (int i = 0; i < 2; i++) {
        int32_t n = 0;
        fj_device_count(kinds[i], &n);
        printf("backend %s: %d device%s\n", backend_name(kinds[i]), (int)n, n == 1 ? "" : "s");
        if (kinds[i] == FJ_BACKEND_CUDA) {
            char found[1024];
            fj__cuda_describe(found, sizeof found);
            printf("  %s\n", found);
        }
        for (int32_t d = 0; d < n; d++) {
            fj_device_info info = {.struct_size = sizeof info};
            if (fj_device_get_info(kinds[i], d, &info) == FJ_OK)
                print_device(&info);
        }
    }
    fj_context *ctx = NULL;
    if (fj_context_create(NULL, &ctx) == FJ_OK) {
        printf("cache: %s\n", fj_context_cache_path(ctx));
        print_cache_warning(ctx);
        fj_context_destroy(ctx);
    } else {
        printf("no usable device: %s\n", fj_last_create_error());
    }
    return 0;
}

static int cmd_run(int argc, char **argv)
{
    enum {
        O_BACKEND = 256,
        O_DEVICE,
        O_BATCH,
        O_HEADS,
        O_KVHEADS,
        O_SEQLEN,
        O_SEQLEN_Q,
        O_SEQLEN_K,
        O_HEAD_DIM,
        O_HEAD_DIM_V,
        O_DTYPE,
        O_CAUSAL,
        O_WLEFT,
        O_WRIGHT,
        O_SOFTCAP,
        O_SCALE,
        O_LAYOUT,
        O_NOLSE,
        O_REPS,
        O_SEED,
        O_NOCHECK,
        O_CACHE,
        O_MASKMOD,
        O_SCOREMOD,
        O_MODARGS,
        O_ALIBI,
        O_BIAS,
        O_BIAS_F32,
        O_MASK,
        O_VARLEN,
        O_SEQUSED,
        O_RANGES,
        O_BLOCKS,
        O_SPLITS,
        O_PAGED,
        O_APPEND,
        O_MLA,
        O_BACKWARD,
        O_DBIAS,
        O_DETERMINISTIC,
        O_KV_DTYPE,
        O_SHIPPED,
        O_TRUSTED,
        O_HELP
    };
    static const struct option opts[] = {{"backend", required_argument, 0, O_BACKEND},
                                         {"device", required_argument, 0, O_DEVICE},
                                         {"batch", required_argument, 0, O_BATCH},
                                         {"heads", required_argument, 0, O_HEADS},
                                         {"kv-heads", required_argument, 0, O_KVHEADS},
                                         {"seqlen", required_argument, 0, O_SEQLEN},
                                         {"seqlen-q", required_argument, 0, O_SEQLEN_Q},
                                         {"seqlen-k", required_argument, 0, O_SEQLEN_K},
                                         {"head-dim", required_argument, 0, O_HEAD_DIM},
                                         {"head-dim-v", required_argument, 0, O_HEAD_DIM_V},
                                         {"dtype", required_argument, 0, O_DTYPE},
                                         {"causal", no_argument, 0, O_CAUSAL},
                                         {"window-left", required_argument, 0, O_WLEFT},
                                         {"window-right", required_argument, 0, O_WRIGHT},
                                         {"softcap", required_argument, 0, O_SOFTCAP},
                                         {"splits", required_argument, 0, O_SPLITS},
                                         {"paged", required_argument, 0, O_PAGED},
                                         {"append", required_argument, 0, O_APPEND},
                                         {"mla", no_argument, 0, O_MLA},
                                         {"backward", no_argument, 0, O_BACKWARD},
                                         {"dbias", no_argument, 0, O_DBIAS},
                                         {"deterministic", no_argument, 0, O_DETERMINISTIC},
                                         {"kv-dtype", required_argument, 0, O_KV_DTYPE},
                                         {"scale", required_argument, 0, O_SCALE},
                                         {"layout", required_argument, 0, O_LAYOUT},
                                         {"no-lse", no_argument, 0, O_NOLSE},
                                         {"reps", required_argument, 0, O_REPS},
                                         {"seed", required_argument, 0, O_SEED},
                                         {"no-check", no_argument, 0, O_NOCHECK},
                                         {"cache", required_argument, 0, O_CACHE},
                                         {"mask-mod", required_argument, 0, O_MASKMOD},
                                         {"score-mod", required_argument, 0, O_SCOREMOD},
                                         {"mod-args", required_argument, 0, O_MODARGS},
                                         {"alibi", required_argument, 0, O_ALIBI},
                                         {"bias", required_argument, 0, O_BIAS},
                                         {"bias-f32", no_argument, 0, O_BIAS_F32},
                                         {"mask", required_argument, 0, O_MASK},
                                         {"varlen", no_argument, 0, O_VARLEN},
                                         {"seqused-k", no_argument, 0, O_SEQUSED},
                                         {"ranges", required_argument, 0, O_RANGES},
                                         {"block-mask", required_argument, 0, O_BLOCKS},
                                         {"shipped", required_argument, 0, O_SHIPPED},
                                         {"trusted-key", required_argument, 0, O_TRUSTED},
                                         {"help", no_argument, 0, O_HELP},
                                         {0, 0, 0, 0}};
    fjh_case c;
    fjh_case_init(&c);
    c.batch = 2;
    c.heads_q = 8;
    c.seqlen_q = c.seqlen_k = 512;
    c.head_dim = 64;
    c.timing_reps = 5;
    int64_t kv_heads = 0, head_dim_v = 0;
    static float mod_args[256];
    int nargs = 0;
    fj_context_options o;
    fj_context_options_init(&o);
    const char *shipped[9] = {0}, *trusted[9] = {0}; /* NULL-terminated */
    int nshipped = 0, ntrusted = 0;
    int opt;
    int64_t value = 0;
/* The option's argument as an integer in [lo, hi] into value; nonzero (after a message) if not. */
#define INT_ARG(lo, hi) fjt_parse_int(opts[optidx].name, optarg, lo, hi, &value)
/* A size (batch, heads, lengths, head dims): 1 to 2^31 - 1, else exit 2. */
#define SIZE_ARG(dst)                                                                              \
    do {                                                                                           \
        if (INT_ARG(1, INT32_MAX))                                                                 \
            return 2;                                                                              \
        (dst) = value;                                                                             \
    } while (0)
    int optidx = 0;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "", opts, &optidx)) != -1) {
        switch (opt) {
        case O_BACKEND:
            if (fjt_parse_backend(optarg, &o.backend))
                return fprintf(stderr, "flashjit: unknown backend '%s'\n", optarg), 2;
            break;
        case O_DEVICE:
            if (INT_ARG(0, INT32_MAX))
                return 2;
            o.device = (int32_t)value;
            break;
        case O_BATCH: SIZE_ARG(c.batch); break;
        case O_HEADS: SIZE_ARG(c.heads_q); break;
        case O_KVHEADS: SIZE_ARG(kv_heads); break;
        case O_SEQLEN:
            SIZE_ARG(c.seqlen_q);
            c.seqlen_k = c.seqlen_q;
            break;
        case O_SEQLEN_Q: SIZE_ARG(c.seqlen_q); break;
        case O_SEQLEN_K: SIZE_ARG(c.seqlen_k); break;
        case O_HEAD_DIM: SIZE_ARG(c.head_dim); break;
        case O_HEAD_DIM_V: SIZE_ARG(head_dim_v); break;
        case O_DTYPE:
            if (fjt_parse_dtype(optarg, &c.dtype))
                return fprintf(stderr, "flashjit: unknown dtype '%s'\n", optarg), 2;
            break;
        case O_CAUSAL: c.desc.causal = 1; break;
        case O_WLEFT:
            if (INT_ARG(-1, INT32_MAX))
                return 2;
            c.desc.window_left = (int32_t)value;
            break;
        case O_WRIGHT:
            if (INT_ARG(-1, INT32_MAX))
                return 2;
            c.desc.window_right = (int32_t)value;
            break;
        case O_SOFTCAP:
            if (fjt_parse_float("softcap", optarg, &c.desc.softcap))
                return 2;
            break;
        case O_SPLITS:
            if (INT_ARG(0, 64))
                return 2;
            c.desc.num_splits = (int32_t)value;
            break;
        case O_PAGED:
            if (INT_ARG(1, 65536))
                return 2;
            c.paged = (int)value;
            break;
        case O_APPEND:
            if (INT_ARG(1, 65536))
                return 2;
            c.append = (int)value;
            break;
        case O_BACKWARD: c.backward = 1; break;
        case O_DBIAS: c.dbias = c.backward = 1; break;
        case O_DETERMINISTIC: c.desc.deterministic = c.backward = 1; break;
        case O_KV_DTYPE: {
            fj_dtype kv;
            if (fjt_parse_dtype(optarg, &kv) || fj_dtype_size(kv) != 1)
                return fprintf(stderr, "flashjit: --kv-dtype takes e4m3 or e5m2, not '%s'\n",
                               optarg),
                       2;
            c.kv_fp8 = (int)kv;
            break;
        }
        case O_MLA: /* DeepSeek's latent cache: one kv head of 576, v its first 512 dims */
            c.head_dim = 576;
            head_dim_v = 512;
            kv_heads = 1;
            c.v_in_k = 1;
            break;
        case O_SCALE:
            if (fjt_parse_float("scale", optarg, &c.desc.softmax_scale))
                return 2;
            break;
        case O_LAYOUT: {
            /* In fjh_layout's order. */
            static const char *const layouts[] = {"bshd", "bhsd", "padded", NULL};
            int i = fjt_pick(optarg, layouts);
            if (i < 0)
                return fprintf(stderr, "flashjit: unknown layout '%s'\n", optarg), 2;
            c.layout = (fjh_layout)i;
            break;
        }
        case O_NOLSE: c.with_lse = 0; break;
        case O_REPS:
            if (INT_ARG(0, 1000000))
                return 2;
            c.timing_reps = (int)value;
            break;
        case O_SEED: {
            char *end = NULL;
            errno = 0;
            c.seed = strtoull(optarg, &end, 0);
            if (!optarg[0] || *end || errno == ERANGE)
                return fprintf(stderr, "flashjit: --seed takes an unsigned integer, not '%s'\n",
                               optarg),
                       2;
            break;
        }
        case O_NOCHECK: c.skip_check = 1; break;
        case O_CACHE: o.cache_path = optarg; break;
        case O_MASKMOD: c.desc.mask_mod = optarg; break;
        case O_SCOREMOD: c.desc.score_mod = optarg; break;
        case O_MODARGS: {
            char *copy = strdup(optarg), *save = NULL;
            int bad = !copy;
            for (char *tok = copy ? strtok_r(copy, ",", &save) : NULL; tok && !bad;
                 tok = strtok_r(NULL, ",", &save))
                bad = nargs == 256 || fjt_parse_float("mod-args", tok, &mod_args[nargs++]);
            free(copy);
            if (bad)
                return fprintf(stderr, "flashjit: --mod-args takes up to 256 numbers\n"), 2;
            break;
        }
        /* The harness's modes count from 1; 0 is none. */
        case O_ALIBI:
            c.alibi = 1 + fjt_pick(optarg, (const char *const[]){"heads", "batch", NULL});
            if (c.alibi == 0)
                return fprintf(stderr, "flashjit: --alibi takes heads or batch\n"), 2;
            break;
        case O_BIAS:
            c.bias = 1 + fjt_pick(optarg, (const char *const[]){"full", "heads", "keys", NULL});
            if (c.bias == 0)
                return fprintf(stderr, "flashjit: --bias takes full, heads or keys\n"), 2;
            break;
        case O_BIAS_F32: c.bias_f32 = 1; break;
        case O_MASK:
            c.mask = 1 + fjt_pick(optarg, (const char *const[]){"random", "keys", NULL});
            if (c.mask == 0)
                return fprintf(stderr, "flashjit: --mask takes random or keys\n"), 2;
            break;
        case O_VARLEN: c.varlen = c.varlen ? c.varlen : 1; break;
        case O_SEQUSED: c.varlen = 2; break;
        case O_RANGES:
            c.ranges = optarg[0] && !optarg[1] ? optarg[0] - '0' : 0;
            if (c.ranges != 2 && c.ranges != 4)
                return fprintf(stderr, "flashjit: --ranges takes 2 or 4\n"), 2;
            break;
        case O_BLOCKS:
            c.blocks = 1 + fjt_pick(optarg, (const char *const[]){"full", "shared", NULL});
            if (c.blocks == 0)
                return fprintf(stderr, "flashjit: --block-mask takes full or shared\n"), 2;
            break;
        case O_SHIPPED:
        case O_TRUSTED: {
            const char **list = opt == O_SHIPPED ? shipped : trusted;
            int *n = opt == O_SHIPPED ? &nshipped : &ntrusted;
            if (*n == 8)
                return fprintf(stderr, "flashjit: --%s at most 8 times\n", opts[optidx].name), 2;
            list[(*n)++] = optarg;
            break;
        }
        case O_HELP: usage(stdout); return 0;
        default: return usage(stderr);
        }
    }
    o.shipped_caches = nshipped ? shipped : NULL;
    o.trusted_keys = ntrusted ? trusted : NULL;
    /* The backward takes the forward's lse; a paged cache has no backward, and MLA's shared
    ** k and v would need their gradients summed, which the check does not do. */
    if (c.backward && (c.paged || c.v_in_k || !c.with_lse))
        return fprintf(stderr, "flashjit: --backward (or --dbias, --deterministic) is not taken "
                               "with %s\n",
                       c.paged ? "--paged" : c.v_in_k ? "--mla" : "--no-lse"),
               2;
    if (c.append && (!c.paged || c.v_in_k))
        return fprintf(stderr, "flashjit: --append is taken with --paged, not with %s\n",
                       c.v_in_k ? "--mla" : "a contiguous cache"),
               2;
    if (c.bias_f32 && !c.bias)
        c.bias = 1;
    if (c.bias && (c.dtype == FJ_DTYPE_F8_E4M3 || c.dtype == FJ_DTYPE_F8_E5M2))
        c.bias_f32 = 1; /* an FP8 request's bias is f32 (desc.bias) */
    c.heads_kv = kv_heads ? kv_heads : c.heads_q;
    c.mod_args = nargs ? mod_args : NULL;
    c.mod_args_count = nargs;
    c.head_dim_v = head_dim_v ? head_dim_v : c.head_dim;

    fj_context *ctx = NULL;
    fj_status st = fj_context_create(&o, &ctx);
    if (st != FJ_OK) {
        fprintf(stderr, "flashjit: cannot create a context (backend %s): %s: %s\n",
                backend_name(o.backend), fj_status_string(st), fj_last_create_error());
        return 2;
    }
    print_cache_warning(ctx);
    fj_device_info dev = {.struct_size = sizeof dev};
    fj_context_get_device_info(ctx, &dev);
    /* A problem that cannot fit is refused here, with its size, rather than failing midway. */
    double host_bytes = 0, device_bytes = 0;
    fjh_memory(&c, &host_bytes, &device_bytes);
    const double host_total = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE);
    if (host_bytes > host_total ||
        (dev.global_memory && device_bytes > (double)dev.global_memory)) {
        const int on_host = host_bytes > host_total;
        fprintf(stderr,
                "flashjit: this problem needs %.1f GiB of %s memory (%s), more than the %.1f GiB "
                "there are\n",
                (on_host ? host_bytes : device_bytes) / (1 << 30), on_host ? "host" : "device",
                on_host ? "inputs, copies and the float64 reference" : "its tensors",
                (on_host ? host_total : (double)dev.global_memory) / (1 << 30));
        fj_context_destroy(ctx);
        return 2;
    }
    char desc[512];
    fjh_describe(&c, desc, sizeof desc);
    printf("flashjit %s run\n", fj_version());
    printf("backend    %s, device %d: %s%s%s%s\n", backend_name(dev.backend), (int)dev.index,
           dev.name, dev.platform[0] ? " (" : "", dev.platform, dev.platform[0] ? ")" : "");
    printf("problem    %s\n", desc);

    fjh_result r;
    st = fjh_run(ctx, &c, &r);
    int failed = 0;
    if (st != FJ_OK) {
        printf("error      %s: %s\n", fj_status_string(st), r.error);
        /* A request the library refuses is the caller's mistake, as a bad option is. */
        failed = st == FJ_ERR_INVALID_ARGUMENT || st == FJ_ERR_UNSUPPORTED ? 2 : 1;
    } else {
        printf("kernel     %s, %s: lookup %.2f ms, render %.2f ms, compile %.1f ms, load %.2f ms\n",
               r.kernel_path, source_name(r.first.source), r.first.lookup_ms, r.first.render_ms,
               r.first.compile_ms, r.first.load_ms);
        if (strchr(r.launched, ',')) /* more than the one kernel */
            printf("launched   %s\n", r.launched);
        printf("variant    ");
        for (const char *s = r.variant; *s; s++)
            putchar(*s == '\n' ? (s[1] ? ' ' : '\n') : *s);
        printf("first call %.1f ms (host, synchronised)\n", r.first_call_ms);
        if (c.timing_reps > 0)
            printf("time       %.3f ms (median of %d) = %.3f TFLOP/s\n", r.kernel_ms, c.timing_reps,
                   r.tflops);
        else
            printf("time       not measured (--reps 0)\n");
        if (c.backward && r.bwd_kernel_path[0]) {
            printf("backward   %s%s", r.bwd_kernel_path,
                   r.bwd_tuned == 2 ? " (tuned now)" : r.bwd_tuned ? " (tuned tiles)" : "");
            if (r.bwd_kernel_ms > 0)
                printf(", %.3f ms (median of %d) = %.3f TFLOP/s (2.5x the forward's FLOPs)",
                       r.bwd_kernel_ms, c.timing_reps, r.bwd_tflops);
            printf("\n");
        }
        if (!c.skip_check) {
            printf("error      max abs %.3g, relative %.3g", r.max_abs_err, r.rel_err);
            if (c.dtype != FJ_DTYPE_F32)
                printf(", plain %s implementation %.3g", fjh_dtype_name(c.dtype),
                       r.lowp_max_abs_err);
            if (c.with_lse)
                printf(", lse %.3g", r.lse_max_err);
            printf("\n");
            static const char *const grads[4] = {"dq", "dk", "dv", "dbias"};
            for (int g = 0; c.backward && g < (c.dbias && c.bias ? 4 : 3); g++) {
                printf("%-10s max abs %.3g of %.3g", grads[g], r.grad_err[g], r.grad_max[g]);
                if (c.dtype != FJ_DTYPE_F32)
                    printf(", plain %.3g", r.grad_lowp_err[g]);
                printf("\n");
            }
        }
        failed = !r.pass;
    }
    printf("seed       0x%llx\n", (unsigned long long)r.seed);
    if (failed)
        printf("FAIL       %s\n", r.why);
    else
        printf("PASS\n");
    fj_context_destroy(ctx);
    return failed;
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return usage(stderr);
    if (!strcmp(argv[1], "info"))
        return cmd_info();
    if (!strcmp(argv[1], "run"))
        return cmd_run(argc - 1, argv + 1);
    if (!strcmp(argv[1], "tune"))
        return fjt_tune_command(argc - 1, argv + 1);
    if (!strcmp(argv[1], "cache"))
        return fjt_cache_command(argc - 1, argv + 1);
    if (!strcmp(argv[1], "help") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))
        return usage(stdout), 0;
    fprintf(stderr, "flashjit: unknown command '%s'\n", argv[1]);
    return usage(stderr);
}
