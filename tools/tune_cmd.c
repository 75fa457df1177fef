/* `flashjit tune`: tunes the forward kernel (and with --backward the backward's stages; with
** --decode the decode plan: its kernel and key splits) over a grid of shapes (by default
** FlashAttention's benchmark grid) and keeps the winners in the cache. Buckets tuned before are skipped, so an interrupted run resumes where it stopped. */
#define _POSIX_C_SOURCE 200809L
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "../cache/cache.h"
#include "../runtime/context.h"
#include "flashjit.h"
#include "reference.h"
#include "tools.h"

#define MAX_LIST 16

static int tune_usage(FILE *f)
{
    fprintf(f,
            "usage: flashjit tune [options]\n"
            "Tunes tile configurations for a grid of shapes and keeps the winners in the cache.\n"
            "  --backend auto|cuda|opencl [auto]   --device N [0]   --cache PATH\n"
            "  --dtype bf16|f16|f32|e4m3|e5m2 [bf16] (FP8: q, k, v in it, out bf16; forwards only)\n"
            "  --head-dim N,... [64,128,256]\n"
            "  --seqlen N,... [512,1024,2048,4096,8192,16384]   --causal 0,1 [0,1]\n"
            "  --tokens N [16384] (batch = tokens / seqlen)   --hidden N [2048] (heads = hidden / "
            "d)\n"
            "  --backward   also the backward (fj_attention_backward_tune)\n"
            "  --deterministic   the backward's deterministic plan (implies --backward)\n"
            "  --decode N   decode requests of N query rows a sequence (1 to 16; --seqlen is then\n"
            "               the keys'), with --group G [1] query heads a kv head and --paged P\n"
            "               [0] a paged KV cache of P-key pages: tunes the kernel and key splits\n");
    return 2;
}

static void progress(int done, int total, const char *what)
{
    if (!isatty(STDOUT_FILENO))
        return;
    int width = 30, filled = total ? done * width / total : width;
    printf("\r[");
    for (int i = 0; i < width; i++)
        putchar(i < filled ? '#' : '.');
    printf("] %d/%d %-40s", done, total, what);
    fflush(stdout);
}

/* One result line: the shape, the heuristic's and the winner's times and the winner. */
static void describe_tuning(char *line, size_t size, long long d, long long causal, long long len,
                            fj_status st, const fj_tune_result *t, const char *why)
{
    if (st != FJ_OK)
        snprintf(line, size, "%4lld %6lld %6lld  FAILED: %.200s", d, causal, len, why);
    else if (t->from_record)
        snprintf(line, size, "%4lld %6lld %6lld  %10s %10s %7s  %-50s (tuned before)", d, causal,
                 len, "-", "-", "-", t->best_config);
    else
        snprintf(line, size, "%4lld %6lld %6lld  %10.1f %10.1f %+6.1f%%  %-50s %d/%d dropped", d,
                 causal, len, t->heuristic_us, t->best_us,
                 100.0 * (t->heuristic_us / t->best_us - 1.0), t->best_config, t->dropped,
                 t->candidates);
}

int fjt_tune_command(int argc, char **argv)
{
    enum {
        O_BACKEND = 256,
        O_DEVICE,
        O_CACHE,
        O_DTYPE,
        O_D,
        O_S,
        O_CAUSAL,
        O_TOKENS,
        O_HIDDEN,
        O_BACKWARD,
        O_DETERMINISTIC,
        O_DECODE,
        O_GROUP,
        O_PAGED,
        O_HELP
    };
    static const struct option opts[] = {{"backend", required_argument, 0, O_BACKEND},
                                         {"device", required_argument, 0, O_DEVICE},
                                         {"cache", required_argument, 0, O_CACHE},
                                         {"dtype", required_argument, 0, O_DTYPE},
                                         {"head-dim", required_argument, 0, O_D},
                                         {"seqlen", required_argument, 0, O_S},
                                         {"causal", required_argument, 0, O_CAUSAL},
                                         {"tokens", required_argument, 0, O_TOKENS},
                                         {"hidden", required_argument, 0, O_HIDDEN},
                                         {"backward", no_argument, 0, O_BACKWARD},
                                         {"deterministic", no_argument, 0, O_DETERMINISTIC},
                                         {"decode", required_argument, 0, O_DECODE},
                                         {"group", required_argument, 0, O_GROUP},
                                         {"paged", required_argument, 0, O_PAGED},
                                         {"help", no_argument, 0, O_HELP},
                                         {0, 0, 0, 0}};
    fj_context_options o;
    fj_context_options_init(&o);
    fj_dtype dtype = FJ_DTYPE_BF16;
    int64_t dims[MAX_LIST] = {64, 128, 256}, lens[MAX_LIST] = {512, 1024, 2048, 4096, 8192, 16384};
    int64_t causal[MAX_LIST] = {0, 1};
    int nd = 3, ns = 6, nc = 2, opt, backward = 0, deterministic = 0;
    int64_t tokens = 16384, hidden = 2048, value = 0, decode = 0, group = 1, paged = 0;
    optind = 1;
    while ((opt = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (opt) {
        case O_BACKEND:
            if (fjt_parse_backend(optarg, &o.backend))
                return fprintf(stderr, "flashjit tune: unknown backend '%s'\n", optarg), 2;
            break;
        case O_DEVICE:
            if (fjt_parse_int("device", optarg, 0, INT32_MAX, &value))
                return 2;
            o.device = (int32_t)value;
            break;
        case O_CACHE: o.cache_path = optarg; break;
        case O_DTYPE:
            if (fjt_parse_dtype(optarg, &dtype))
                return fprintf(stderr,
                               "flashjit tune: --dtype takes bf16, f16, f32, e4m3 or e5m2, not '%s'\n",
                               optarg),
                       2;
            break;
        case O_D:
            if ((nd = fjt_parse_list("head-dim", optarg, 1, 576, dims, MAX_LIST)) < 0)
                return 2;
            break;
        case O_S:
            if ((ns = fjt_parse_list("seqlen", optarg, 1, INT32_MAX, lens, MAX_LIST)) < 0)
                return 2;
            break;
        case O_CAUSAL:
            if ((nc = fjt_parse_list("causal", optarg, 0, 1, causal, MAX_LIST)) < 0)
                return 2;
            break;
        case O_TOKENS:
            if (fjt_parse_int("tokens", optarg, 1, INT32_MAX, &tokens))
                return 2;
            break;
        case O_HIDDEN:
            if (fjt_parse_int("hidden", optarg, 1, INT32_MAX, &hidden))
                return 2;
            break;
        case O_BACKWARD: backward = 1; break;
        case O_DETERMINISTIC: backward = deterministic = 1; break;
        case O_DECODE:
            if (fjt_parse_int("decode", optarg, 1, FJ__DECODE_MAX_SEQLEN_Q, &decode))
                return 2;
            break;
        case O_GROUP:
            if (fjt_parse_int("group", optarg, 1, INT32_MAX, &group))
                return 2;
            break;
        case O_PAGED:
            if (fjt_parse_int("paged", optarg, 1, INT32_MAX, &paged))
                return 2;
            break;
        case O_HELP: tune_usage(stdout); return 0;
        default: return tune_usage(stderr);
        }
    }
    if ((group > 1 || paged) && !decode)
        return fprintf(stderr, "flashjit tune: --group and --paged go with --decode\n"), 2;
    if (decode && backward)
        return fprintf(stderr, "flashjit tune: --decode tunes forwards only (no --backward)\n"), 2;
    if (fj__dtype_fp8(dtype) && (backward || paged))
        return fprintf(stderr, "flashjit tune: --dtype %s: FP8 inputs have no backward and no "
                               "paged cache (tune their forward)\n",
                       fj__dtype_name(dtype)),
               2;
    for (int a = 0; a < nd; a++)
        if (hidden % dims[a] != 0 || (hidden / dims[a]) % group != 0)
            return fprintf(
                       stderr,
                       "flashjit tune: --hidden %lld is not a multiple of --head-dim %lld times "
                       "--group %lld (heads = hidden / head-dim, kv heads = heads / group)\n",
                       (long long)hidden, (long long)dims[a], (long long)group),
                   2;
    fj_context *ctx = NULL;
    fj_status st = fj_context_create(&o, &ctx);
    if (st != FJ_OK) {
        fprintf(stderr, "flashjit tune: %s: %s\n", fj_status_string(st), fj_last_create_error());
        return 2;
    }
    /* Tuning is worth its minutes only if the records are kept. */
    if (!cache_writable(ctx->cache)) {
        const char *why = fj_context_last_error(ctx);
        fprintf(stderr,
                "flashjit tune: the cache %s cannot be written, so the results would be lost%s%s\n",
                o.cache_path ? o.cache_path : "(the default)", why[0] ? ": " : "", why);
        fj_context_destroy(ctx);
        return 1;
    }
    fj_device_info dev = {.struct_size = sizeof dev};
    fj_context_get_device_info(ctx, &dev);
    printf("tuning on %s (%s), cache %s\n", dev.name, dev.arch, fj_context_cache_path(ctx));

    int total = nd * ns * nc, done = 0, failed = 0;
    char(*lines)[320] = calloc((size_t)total, sizeof *lines);
    char(*bwd_lines)[320] = calloc((size_t)total, sizeof *bwd_lines);
    for (int a = 0; a < nd; a++)
        for (int c = 0; c < nc; c++)
            for (int s = 0; s < ns; s++) {
                fjh_case k;
                fjh_case_init(&k);
                k.dtype = dtype;
                k.head_dim = k.head_dim_v = dims[a];
                k.seqlen_q = k.seqlen_k = lens[s];
                k.batch = tokens / lens[s] > 0 ? tokens / lens[s] : 1;
                k.heads_q = k.heads_kv = hidden / dims[a];
                if (decode) { /* a few query rows against lens[s] keys */
                    k.seqlen_q = decode;
                    k.heads_kv = k.heads_q / group;
                    k.paged = (int)paged;
                }
                k.desc.causal = (int)causal[c];
                k.with_lse = backward; /* the backward reads the forward's lse */
                k.backward = backward;
                k.desc.deterministic = deterministic;
                k.tune = 1;
                k.skip_check = 1;
                char what[64];
                snprintf(what, sizeof what, "d=%lld causal=%lld s=%lld", (long long)dims[a],
                         (long long)causal[c], (long long)lens[s]);
                progress(done, total, what);
                fjh_result r;
                st = fjh_run(ctx, &k, &r);
                const fj_tune_result *t = &r.tune;
                const long long d = dims[a], cz = causal[c], len = lens[s];
                describe_tuning(lines[done], sizeof lines[0], d, cz, len, st, t, r.why);
                describe_tuning(bwd_lines[done], sizeof bwd_lines[0], d, cz, len, st, &r.bwd_tune,
                                r.why);
                failed += st != FJ_OK;
                done++;
            }
    progress(done, total, "done");
    if (isatty(STDOUT_FILENO))
        printf("\n");
    printf("%4s %6s %6s  %10s %10s %7s  %-50s\n", "d", "causal", "s", "heur. us", "tuned us",
           "gain", "winner");
    for (int i = 0; i < total; i++)
        printf("%s\n", lines[i]);
    if (backward) {
        printf("backward%s:\n", deterministic ? " (deterministic)" : "");
        for (int i = 0; i < total; i++)
            printf("%s\n", bwd_lines[i]);
    }
    printf("%d shapes tuned, %d failed\n", total - failed, failed);
    free(lines);
    free(bwd_lines);
    fj_context_destroy(ctx);
    return failed ? 1 : 0;
}
