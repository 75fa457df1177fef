/* The autotuner: for one request's shape bucket, compile the candidate tile configurations in
** parallel, run each plan on the request's own tensors, drop those that fail, spill or disagree
** with the heuristic's result, time the rest, and keep the winner (and every measurement) in
** the cache's tunings table, keyed by device fingerprint, bucket and kind (forward, backward). */
#define _POSIX_C_SOURCE 200809L
#include "tune.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#define TUNE_MAX_CANDIDATES 80
#define TUNE_MIN_REPS 5
#define TUNE_MAX_REPS 20
#define TUNE_BUDGET_MS 200.0

static long long pow2_at_least(long long x, long long floor)
{
    long long p = floor;
    while (p < x)
        p *= 2;
    return p;
}

const char *fj__tune_kind(const fj__variant *v)
{
    return v->family == FJ__FAMILY_BWD ? "bwd" : v->family == FJ__FAMILY_DECODE ? "dec" : "fwd";
}

void fj__tune_candidate_config(const fj__tune_candidate *c, char *buf, size_t size)
{
    fj__variant_config(&c->v, buf, size);
    const size_t used = strlen(buf);
    if (c->splits > 0)
        snprintf(buf + used, size - used, ",splits=%d", (int)c->splits);
}

void fj__tune_bucket(const fj__features *f, const fj__variant *v, char *buf, size_t size)
{
    const char *mask = !v->local_mask                               ? "none"
                       : f->window_right == 0 && f->window_left < 0 ? "causal"
                                                                    : "window";
    /* A decode's query rows pick its packing: counted exactly (1 to 16, or a chunk's pow2). */
    const int decode = v->family == FJ__FAMILY_DECODE;
    snprintf(buf, size,
             "%s.%s|%s|d=%d|dv=%d|sq=%lld|sk=%lld|bh=%lld|mask=%s|softcap=%d|neg=%d",
             fj__tune_kind(v),
             v->path == FJ__PATH_WGMMA    ? "wgmma"
             : v->path == FJ__PATH_MMA    ? "mma"
             : v->path == FJ__PATH_VECTOR ? "vec"
                                          : "simt",
             fj__dtype_name((fj_dtype)f->q_dtype), (int)v->head_dim_pad, (int)v->head_dim_v_pad,
             decode && f->seqlen_q <= FJ__DECODE_MAX_SEQLEN_Q ? (long long)f->seqlen_q
                                                              : pow2_at_least(f->seqlen_q, 64),
             pow2_at_least(f->seqlen_k, 64), pow2_at_least(f->batch * f->heads_q, 1), mask,
             (int)v->softcap, (int)v->neg_scale);
    if (decode) {
        size_t used = strlen(buf);
        snprintf(buf + used, size - used, "|group=%lld|paged=%d",
                 (long long)(f->heads_q / f->heads_kv), (int)v->paged);
    }
    if (v->family == FJ__FAMILY_BWD) { /* the deterministic plan runs other launches */
        size_t used = strlen(buf);
        snprintf(buf + used, size - used, "|det=%d", (int)f->deterministic);
    }
    if (v->alibi || v->bias || v->mask_tensor || v->varlen || v->mask_ranges || v->block_mask) {
        size_t used = strlen(buf);
        snprintf(buf + used, size - used, "|terms=%s%s%s%s%s%s", v->alibi ? "a" : "",
                 v->bias == 1 ? "b32"
                 : v->bias    ? "b"
                              : "",
                 v->mask_tensor ? "m" : "",
                 v->varlen == 2 ? "vu"
                 : v->varlen    ? "v"
                                : "",
                 v->mask_ranges == 4 ? "r4"
                 : v->mask_ranges    ? "r2"
                                     : "",
                 v->block_mask ? "k" : "");
    }
    if (v->mask_mod || v->score_mod) {
        /* Expressions change the kernel: a bucket per pair of them. */
        char both[2 * 2048 + 2], hex[65];
        snprintf(both, sizeof both, "%s\n%s", v->mask_mod ? v->mask_mod : "",
                 v->score_mod ? v->score_mod : "");
        fj__sha256_hex(both, strlen(both), hex);
        size_t used = strlen(buf);
        snprintf(buf + used, size - used, "|mod=%.16s", hex);
    }
}

/* A bucket and its record (config NULL for none). */
typedef struct memo_entry {
    char *bucket;
    char *config;
} memo_entry;

struct fj__tune_memo {
    memo_entry *entries;
    size_t n, cap;
};

/* Remembers a bucket's record (config NULL for none), taking config; returns it. */
static const char *remember(fj__tune_memo **memo, const char *bucket, char *config)
{
    if (!*memo && !(*memo = calloc(1, sizeof **memo))) {
        free(config);
        return NULL;
    }
    fj__tune_memo *m = *memo;
    if (m->n == m->cap) {
        size_t cap = m->cap ? 2 * m->cap : 16;
        memo_entry *grown = realloc(m->entries, cap * sizeof *grown);
        if (!grown) {
            free(config);
            return NULL;
        }
        m->entries = grown;
        m->cap = cap;
    }
    char *b = fj__strdup(bucket);
    if (!b) {
        free(config);
        return NULL;
    }
    m->entries[m->n++] = (memo_entry){.bucket = b, .config = config};
    return config;
}

static memo_entry *find_memo(fj__tune_memo *m, const char *bucket)
{
    for (size_t i = 0; m && i < m->n; i++)
        if (strcmp(m->entries[i].bucket, bucket) == 0)
            return &m->entries[i];
    return NULL;
}

/* The record of a bucket of that kind: from the memo, else the cache (then remembered). */
static const char *lookup(fj__tune_memo **memo, fj_cache *cache, const char *fingerprint,
                          const char *kind, const char *bucket)
{
    memo_entry *e = find_memo(*memo, bucket);
    if (e)
        return e->config;
    char *config = NULL;
    double us = 0;
    cache_get_tuning(cache, fingerprint, bucket, kind, &config, &us);
    return remember(memo, bucket, config);
}

const char *fj__tuned_config(fj__tune_memo **memo, fj_cache *cache, const char *fingerprint,
                             const fj__features *f, const fj__variant *v)
{
    char bucket[256];
    fj__tune_bucket(f, v, bucket, sizeof bucket);
    return lookup(memo, cache, fingerprint, fj__tune_kind(v), bucket);
}

void fj__tune_memo_free(fj__tune_memo **memo)
{
    fj__tune_memo *m = *memo;
    if (!m)
        return;
    for (size_t i = 0; i < m->n; i++) {
        FJ_FREE(m->entries[i].bucket);
        FJ_FREE(m->entries[i].config);
    }
    FJ_FREE(m->entries);
    FJ_FREE(*memo);
}

static int contains(const fj__tune_candidate *cs, int n, const fj__variant *v, int32_t splits)
{
    for (int i = 0; i < n; i++)
        if (memcmp(&cs[i].v, v, sizeof *v) == 0 && cs[i].splits == splits)
            return 1;
    return 0;
}

/* Adds candidate (v, splits) to out[*n] where it fits the device and is new. */
static void add(fj__tune_candidate *out, int *n, const fj__variant *v, int32_t splits,
                const fj_device_info *dev)
{
    if (*n < TUNE_MAX_CANDIDATES && fj__variant_fits(v, dev) && !contains(out, *n, v, splits))
        out[(*n)++] = (fj__tune_candidate){.v = *v, .splits = splits};
}

/* A decode's candidates for its kernel h: the split count (the plan's, then powers of two up
** to the key tiles), and on tensor cores also the tile depth and the ring's length (the blocks
** an SM follow from the ring's shared memory, as in the plan), and on sm_90 the other ways of
** copying the tiles (cp.async, the copy engine's rows, tensor maps' panels: the plan's rule is
** from a few shapes, and by batch and length another can win) with the rings that suit them
** (fj__plan_decode runs rows where tensor maps cannot copy the tiles); on wgmma the
** copying-warpgroup kernel's tiles, rings and loop, and the seesaw kernel (warps 8) wherever it
** fits (the plan takes it only where it measured ahead; fj__plan_decode runs the other where
** tensor maps cannot read k). */
static int decode_search_space(const fj__variant *h, const fj__features *f,
                               const fj_device_info *dev, fj__tune_candidate *out)
{
    int n = 0;
    out[n++] = (fj__tune_candidate){.v = *h};
    static const int splits[] = {0, 1, 2, 4, 8, 16, 32, 64};
    /* (split_dv, value dims beyond 256: every warp takes all of a tile's keys, so shorter
    ** tiles fit) */
    static const int tns[] = {64, 64, 128, 128}, stages[] = {3, 4, 2, 3};
    static const int split_tns[] = {32, 32, 64, 64}, split_stages[] = {3, 4, 2, 3};
    /* (attn_decode_wgmma.cu.lua, value dims beyond 256 on sm_90a: two slots of 64 keys where
    ** they fit, longer rings of 32, and the pipelined loop; then the seesaw kernel) */
    static const int wg_tns[] = {64, 32, 32, 64}, wg_stages[] = {2, 3, 4, 2};
    static const int wg_overlap[] = {0, 0, 0, 1};
    const int wgmma = h->path == FJ__PATH_WGMMA;
    const int *tn = wgmma ? wg_tns : h->split_dv ? split_tns : tns;
    const int *st = wgmma ? wg_stages : h->split_dv ? split_stages : stages;
    fj__variant seesaw = *h; /* (as planned, or the other kernel's variant made the seesaw's) */
    if (wgmma)
        fj__decode_make_seesaw(&seesaw);
    const int has_seesaw = wgmma && fj__variant_fits(&seesaw, dev);
    const int variants = h->path == FJ__PATH_MMA ? 4 : wgmma ? 4 + has_seesaw : 1;
    for (int a = 0; a < variants; a++)
        for (int s = 0; s < 8; s++) {
            const int as_given = variants == 1 || a == 4; /* as planned, or the seesaw kernel */
            fj__variant v = a == 4 ? seesaw : *h;
            const int32_t grain = !as_given ? tn[a] : v.tile_n > 0 ? v.tile_n : 32;
            if (splits[s] > 1 && (int64_t)(splits[s] - 1) * grain >= f->seqlen_k)
                continue; /* more splits than key tiles: the plan would run fewer */
            if (!as_given) {
                v.tile_n = tn[a];
                v.stages = (uint8_t)st[a];
                if (wgmma) {
                    v.warps = 12;
                    v.threads = 384;
                    v.overlap = (uint8_t)wg_overlap[a];
                } else {
                    fj__decode_mma_residency(&v, dev);
                }
            }
            add(out, &n, &v, splits[s], dev);
        }
    if (h->path == FJ__PATH_MMA && fj__sm_version(dev) >= 90) {
        /* ways 0-2: cp.async, rows, panels; row copies want short rings
        ** (fj__decode_too_many_copies) */
        static const int way_stages[3][2] = {{3, 4}, {2, 3}, {3, 2}};
        for (int way = 0; way < 3; way++) {
            fj__variant w = *h;
            w.bulk = way > 0;
            w.swizzle = way == 2;
            if ((w.bulk == h->bulk && w.swizzle == h->swizzle) ||
                (w.swizzle && !fj__decode_swizzle_fits(&w)))
                continue; /* the planned way (above), or panels that cannot be */
            for (int a = 0; a < 2; a++)
                for (int s = 0; s < 8; s++) {
                    if (splits[s] > 1 && (int64_t)(splits[s] - 1) * h->tile_n >= f->seqlen_k)
                        continue;
                    fj__variant v = w;
                    v.stages = (uint8_t)way_stages[way][a];
                    fj__decode_mma_residency(&v, dev);
                    if (!fj__decode_too_many_copies(&v))
                        add(out, &n, &v, splits[s], dev);
                }
        }
    }
    return n;
}

/* The backward's candidates for its dk/dv variant h (the plan applies each one's config to
** both stages: fj__variant_config): on tensor cores the computing warps (keys a block: 16 a
** warp) and the streamed query rows, on Hopper with and without a producer warpgroup (for two
** computing warpgroups), and with it a persistent grid or not, on mma.sync with warps of their
** own keys and in a grid; on the SIMT kernels keys a work-group and streamed rows. */
static int bwd_search_space(const fj__variant *h, const fj_device_info *dev,
                            fj__tune_candidate *out)
{
    int n = 0;
    out[n++] = (fj__tune_candidate){.v = *h};
    static const int wg_warps[] = {4, 8, 12}, wg_rows[] = {64, 128};
    static const int mma_warps[] = {2, 4, 8}, mma_rows[] = {16, 32, 64, 128};
    static const int simt_keys[] = {16, 32, 64}, simt_rows[] = {16, 32};
    const int *as = h->path == FJ__PATH_WGMMA ? wg_warps : h->path == FJ__PATH_MMA ? mma_warps : simt_keys;
    const int *bs = h->path == FJ__PATH_WGMMA ? wg_rows : h->path == FJ__PATH_MMA ? mma_rows : simt_rows;
    const int nb = h->path == FJ__PATH_MMA ? 4 : 2;
    /* Modes: on WGMMA's stage 2 0 no producer, 1 a producer, 2 a producer and a persistent
    ** grid; on mma.sync's stage 2 0 a warp's own 16 keys, 1 warps in a grid (d_split). */
    const int wgmma = h->path == FJ__PATH_WGMMA;
    const int modes = wgmma && h->stage == 2 && !h->d_split          ? 3
                      : h->path == FJ__PATH_MMA && h->stage == 2 ? 2
                                                                 : 1;
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < nb; b++)
            for (int mode = 0; mode < modes && n < TUNE_MAX_CANDIDATES; mode++) {
                fj__variant v = *h;
                v.tile_m = bs[b];
                if (h->path == FJ__PATH_SIMT) {
                    v.tile_n = v.threads = as[a];
                } else {
                    if (h->path == FJ__PATH_MMA && h->stage == 2)
                        v.d_split = mode == 1;
                    v.producer = wgmma && mode > 0;
                    v.persistent = wgmma && mode == 2;
                    v.warps = as[a] + 4 * v.producer;
                    v.threads = 32 * v.warps;
                    v.tile_n = 16 * as[a];
                }
                add(out, &n, &v, 0, dev);
            }
    return n;
}

/* The candidates for heuristic h, h itself first. Shapes that cannot fit the device's shared
** memory are pruned before anything is compiled. */
static int search_space(const fj__variant *h, const fj__features *f, const fj_device_info *dev,
                        fj__tune_candidate *out)
{
    if (h->family == FJ__FAMILY_BWD)
        return bwd_search_space(h, dev, out);
    if (h->family == FJ__FAMILY_DECODE)
        return decode_search_space(h, f, dev, out);
    int n = 0;
    out[n++] = (fj__tune_candidate){.v = *h};
    int32_t widest = h->head_dim_pad > h->head_dim_v_pad ? h->head_dim_pad : h->head_dim_v_pad;
    if (h->path == FJ__PATH_WGMMA && (h->head_dim_pad > 256 || fj__variant_dv_slices(h) > 1)) {
        /* Head dims beyond 256: one consumer warpgroup (Q fills a third of shared memory); key
        ** tile depth against ring slots, with and without the pipelined softmax. */
        for (int tn = 16; tn <= 128; tn += 16)
            for (int st = 1; st <= 3; st++)
                for (int ov = 0; ov < 2 && n < TUNE_MAX_CANDIDATES; ov++) {
                    fj__variant v = *h;
                    v.tile_n = tn;
                    v.stages = (uint8_t)st;
                    v.overlap = (uint8_t)ov;
                    add(out, &n, &v, 0, dev);
                }
    } else if (h->path == FJ__PATH_WGMMA) {
        /* Key tile depth, two or three consumer warpgroups, and how they overlap: not at all,
        ** softmax against P V, and also taking turns (two warpgroups only). Two ring slots, the
        ** heuristic's Q buffers where they fit, all exponentials on MUFU (the heuristic, first,
        ** keeps its exp_poly). */
        static const int tns[] = {64, 80, 96, 112, 128, 160, 176, 192};
        /* With block classes, first (the limit never cuts them): the walk by votes, the zigzag
        ** persistent grid with a second Q buffer, and both (at 8k, d 128: window and documents
        ** +4-5 %, +10-11 % with both; causal-like masks even to -3 %: bench/RESULTS.md). */
        if ((h->block_mask || fj__variant_element_masks(h)) && !fj__dtype_fp8((fj_dtype)h->q_dtype))
            for (int k = 1; k <= 3; k++) {
                fj__variant v = *h;
                v.class_vote = (uint8_t)(k & 1);
                if (k & 2) {
                    v.persistent = 3;
                    v.stages = 2;
                    v.q_stages = 2;
                    if (!fj__variant_fits(&v, dev))
                        v.q_stages = 1;
                }
                add(out, &n, &v, 0, dev);
            }
        for (int c = 2; c <= 3; c++)
            for (int b = 0; b < 8; b++)
                for (int mode = 0; mode < 3 && n < TUNE_MAX_CANDIDATES; mode++) {
                    fj__variant v = *h;
                    v.tile_m = 64 * c;
                    v.warps = 4 * (c + 1);
                    v.threads = 32 * v.warps;
                    v.tile_n = tns[b];
                    v.stages = 2;
                    v.overlap = mode > 0;
                    v.pingpong = mode == 2;
                    v.exp_poly = 0;
                    if (!fj__variant_fits(&v, dev))
                        v.q_stages = 1; /* a second Q buffer only where it fits */
                    add(out, &n, &v, 0, dev);
                }
    } else if (h->path == FJ__PATH_MMA) {
        static const int tms[] = {64, 128}, tns[] = {32, 64, 128}, unrolls[] = {0, 1, 2};
        for (int a = 0; a < 2; a++)
            for (int b = 0; b < 3; b++)
                for (int q = 0; q < 2; q++)
                    for (int u = 0; u < 3 && n < TUNE_MAX_CANDIDATES - 1; u++) {
                        if ((q && widest > 128) || (q && unrolls[u] != 0) ||
                            (tns[b] == 128 && widest > 64))
                            continue;
                        fj__variant v = *h;
                        v.tile_m = tms[a];
                        v.tile_n = tns[b];
                        v.q_in_regs = (uint8_t)q;
                        v.kk_unroll = unrolls[u];
                        /* Four warps of two m16 tiles each, and for 128-row tiles also eight
                        ** warps of one (fewer accumulators per thread, as FA2 at d 256). */
                        for (int w = 4; w <= (tms[a] == 128 ? 8 : 4); w *= 2) {
                            v.warps = w;
                            v.threads = 32 * w;
                            add(out, &n, &v, 0, dev);
                        }
                    }
    } else {
        static const int tms[] = {16, 32, 64}, tns[] = {8, 16, 32};
        for (int a = 0; a < 3; a++)
            for (int b = 0; b < 3 && n < TUNE_MAX_CANDIDATES; b++) {
                fj__variant v = *h;
                v.tile_m = v.threads = tms[a];
                v.tile_n = tns[b];
                add(out, &n, &v, 0, dev);
            }
    }
    return n;
}

static float to_float(fj_dtype dtype, const unsigned char *p)
{
    uint16_t h;
    uint32_t u;
    float f;
    switch (dtype) {
    case FJ_DTYPE_BF16:
        memcpy(&h, p, 2);
        u = (uint32_t)h << 16;
        memcpy(&f, &u, 4);
        return f;
    case FJ_DTYPE_F16: {
        memcpy(&h, p, 2);
        uint32_t e = (h >> 10) & 31, m = h & 1023;
        f = e == 0 ? ldexpf((float)m, -24) : e == 31 ? NAN : ldexpf((float)(m | 1024), (int)e - 25);
        return h & 0x8000 ? -f : f;
    }
    default: memcpy(&f, p, 4); return f;
    }
}

/* Largest difference between two copies of an output span, and the largest magnitude. */
static void compare(fj_dtype dtype, const unsigned char *a, const unsigned char *b, size_t bytes,
                    double *max_diff, double *max_ref)
{
    size_t es = fj_dtype_size(dtype);
    *max_diff = *max_ref = 0;
    for (size_t i = 0; i + es <= bytes; i += es) {
        float x = to_float(dtype, a + i), y = to_float(dtype, b + i);
        if (isnan(x) && isnan(y))
            continue; /* storage between the view's elements, untouched by both */
        double d = fabs((double)x - (double)y);
        *max_diff = isnan(d) ? INFINITY : fmax(*max_diff, d);
        *max_ref = fmax(*max_ref, fabs((double)y));
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median host time of runs of v's plan (each waited for), in microseconds; negative on
** failure. */
static double time_candidate(const fj__tune_host *h, const fj__tune_candidate *c)
{
    double times[TUNE_MAX_REPS], start = fj__now_ms();
    int n = 0;
    while (n < TUNE_MAX_REPS && (n < TUNE_MIN_REPS || fj__now_ms() - start < TUNE_BUDGET_MS)) {
        double t0 = fj__now_ms();
        if (h->run(h->ud, c) != FJ_OK)
            return -1;
        times[n++] = (fj__now_ms() - t0) * 1e3;
    }
    qsort(times, (size_t)n, sizeof times[0], cmp_double);
    return times[n / 2];
}

/* Appends one JSON object to a growing buffer (best effort: a full buffer stops appending). */
static void json_add(char *json, size_t size, const char *config, double us, const char *why)
{
    size_t used = strlen(json);
    char reason[96]; /* why, cut to fit, with the characters JSON would need escaped blanked */
    size_t n = 0;
    for (; why && why[n] && n + 1 < sizeof reason; n++)
        reason[n] = why[n] == '"' || why[n] == '\\' || (unsigned char)why[n] < 32 ? ' ' : why[n];
    reason[n] = '\0';
    if (why)
        snprintf(json + used, size - used, "%s{\"config\":\"%s\",\"dropped\":\"%s\"}",
                 used > 1 ? "," : "", config, reason);
    else
        snprintf(json + used, size - used, "%s{\"config\":\"%s\",\"us\":%.2f}", used > 1 ? "," : "",
                 config, us);
}

fj_status fj__tune(const fj__tune_host *h, fj__tune_memo **memo, fj_cache *cache,
                   const char *fingerprint, const fj__features *f, const fj__variant *heuristic,
                   fj_dtype out_dtype, size_t out_bytes, fj_tune_result *r, fj__err *err)
{
    size_t struct_size = r->struct_size;
    memset(r, 0, sizeof *r);
    r->struct_size = struct_size;
    const char *kind = fj__tune_kind(heuristic);
    fj__tune_bucket(f, heuristic, r->bucket, sizeof r->bucket);
    const char *record = lookup(memo, cache, fingerprint, kind, r->bucket);
    if (record) {
        r->from_record = 1;
        snprintf(r->best_config, sizeof r->best_config, "%s", record);
        return FJ_OK;
    }

    fj__tune_candidate cands[TUNE_MAX_CANDIDATES];
    fj_status status[TUNE_MAX_CANDIDATES];
    char why[TUNE_MAX_CANDIDATES][160];
    int n = search_space(heuristic, f, h->device, cands);
    r->candidates = n;
    fj_status st = h->prepare(h->ud, cands, n, status, why);
    if (st != FJ_OK)
        return st;
    if (status[0] != FJ_OK)
        return fj__fail(err, status[0], "tuning: the heuristic's kernel: %s", why[0]);

    /* The heuristic's output is the reference every candidate must reproduce. */
    unsigned char *ref = malloc(out_bytes), *got = malloc(out_bytes);
    char *json = malloc(16384);
    if (!ref || !got || !json) {
        free(ref);
        free(got);
        free(json);
        return fj__fail(err, FJ_ERR_OUT_OF_MEMORY, "tuning: out of memory");
    }
    strcpy(json, "[");
    st = h->run(h->ud, &cands[0]);
    if (st == FJ_OK)
        st = h->read_output(h->ud, ref, out_bytes);
    if (st != FJ_OK)
        fj__fail(err, st, "tuning: the heuristic's plan: %s", h->last_error(h->ud));
    int best = -1;
    double best_us = INFINITY;
    for (int i = 0; i < n && st == FJ_OK; i++) {
        char config[128];
        fj__tune_candidate_config(&cands[i], config, sizeof config);
        int32_t spills = status[i] == FJ_OK ? h->spills(h->ud, &cands[i].v) : 0;
        if (status[i] == FJ_OK && spills > 0 && i > 0)
            snprintf(why[i], sizeof why[i], "spills %d bytes", (int)spills);
        double us = -1, diff = 0, mag = 0;
        if (status[i] == FJ_OK && !why[i][0]) {
            if (h->run(h->ud, &cands[i]) != FJ_OK ||
                h->read_output(h->ud, got, out_bytes) != FJ_OK) {
                snprintf(why[i], sizeof why[i], "failed to run: %.120s", h->last_error(h->ud));
            } else {
                compare(out_dtype, got, ref, out_bytes, &diff, &mag);
                double tol = (out_dtype == FJ_DTYPE_F32 ? 1e-4 : 2e-2) * fmax(1.0, mag);
                if (diff > tol)
                    snprintf(why[i], sizeof why[i], "differs from the heuristic by %.3g", diff);
                else if ((us = time_candidate(h, &cands[i])) < 0)
                    snprintf(why[i], sizeof why[i], "failed to run: %.120s", h->last_error(h->ud));
            }
        }
        if (why[i][0]) {
            r->dropped++;
            json_add(json, 16384, config, 0, why[i]);
            continue;
        }
        json_add(json, 16384, config, us, NULL);
        if (i == 0)
            r->heuristic_us = us;
        if (us < best_us) {
            best_us = us;
            best = i;
        }
    }
    if (st == FJ_OK && best < 0)
        st = fj__fail(err, FJ_ERR_BACKEND, "tuning %s: no candidate ran", r->bucket);
    if (st == FJ_OK) {
        strcat(json, "]");
        r->best_us = best_us;
        fj__tune_candidate_config(&cands[best], r->best_config, sizeof r->best_config);
        fj__err warn = {{0}};
        cache_put_tuning(cache, fingerprint, r->bucket, kind, r->best_config, best_us, json,
                         &warn);
        if (warn.msg[0])
            fj__fail(err, FJ_OK, "%s", warn.msg);
        memo_entry *e = find_memo(*memo, r->bucket);
        char *copy = fj__strdup(r->best_config);
        if (e) {
            free(e->config);
            e->config = copy;
        } else {
            remember(memo, r->bucket, copy);
        }
    }
    free(ref);
    free(got);
    free(json);
    return st;
}
