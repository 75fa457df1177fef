/* The default kernel path and tile choice, used until a tuned record exists for the device and
** shape. */
#include "../runtime/internal.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int32_t round_up(int64_t x, int32_t to)
{
    return (int32_t)((x + to - 1) / to * to);
}

/* The tensor-core kernel copies 16-byte chunks: base, row strides and head dim must allow it. */
static int rows_are_16b_aligned(const fj_tensor *packed_or_4d)
{
    const fj_tensor t = fj__tensor_4d(packed_or_4d);
    if ((uintptr_t)t.data % 16 != 0 || t.shape[3] % 8 != 0)
        return 0;
    for (int i = 0; i < 3; i++)
        if (t.stride[i] % 8 != 0)
            return 0;
    return 1;
}

/* Compute capability as major * 10 + minor from "sm_90a"; 0 when unknown. */
static int sm_version(const fj_device_info *dev)
{
    int v = 0;
    return sscanf(dev->arch, "sm_%d", &v) == 1 ? v : 0;
}

static void plan_mma(fj__variant *v, const fj__problem *p, const fj_device_info *dev)
{
    int32_t widest = v->head_dim_pad > v->head_dim_v_pad ? v->head_dim_pad : v->head_dim_v_pad;
    v->path = FJ__PATH_MMA;
    /* Up to d = 128: 128 rows, four warps of two m16 tiles (each K/V fragment read from shared
    ** memory feeds two mma). Beyond: 64 rows in four warps, or for long sequences 128 rows in
    ** eight warps of one m16 tile (FA2's d = 256 shape) where shared memory allows: on an H200
    ** that gains 3-7 % from 2k keys on (non-causal) and 8k (causal), and loses up to 10 % below
    ** (bench/RESULTS.md). 64-key tiles throughout. No spills (ptxas, sm_80 to sm_90a). */
    v->warps = widest > 128 && p->seqlen_q >= (v->local_mask ? 8192 : 2048) ? 8 : 4;
    v->tile_m = widest <= 128 || v->warps == 8 ? 128 : 64;
    v->tile_n = 64;
    v->q_in_regs = widest <= 64;
    /* The S = Q K^T k-loop. Fully unrolled, at d = 128 ptxas hoists fragments of later steps
    ** and the 128 accumulators of O spill; two steps at a time fit except for the causal kernel
    ** (its masking needs the registers), which runs it one step at a time. With Q in registers
    ** the loop is always unrolled. Chosen from `flashjit tune` over the benchmark grid on an H200
    ** (bench/RESULTS.md): this is the winner or within 1 % of it at every point. */
    v->kk_unroll = v->q_in_regs ? 0 : widest <= 128 && v->local_mask ? 1 : 2;
    /* Before Hopper, ptxas spills the causal d = 128 kernel at 64-key tiles (checked for sm_80,
    ** sm_86, sm_89): halve the tile there. */
    if (sm_version(dev) < 90 && v->local_mask && widest > 64 && widest <= 128) {
        v->tile_n = 32;
        v->kk_unroll = 2;
    }
    if (fj__variant_shared_bytes(v) > dev->local_memory && v->warps == 8) {
        v->warps = 4;
        v->tile_m = 64;
    }
    /* Shrink until the tiles fit the block's shared memory. */
    while (fj__variant_shared_bytes(v) > dev->local_memory && v->tile_n > 16)
        v->tile_n /= 2;
    while (fj__variant_shared_bytes(v) > dev->local_memory && v->tile_m > 16 * v->warps)
        v->tile_m /= 2;
    v->threads = 32 * v->warps;
}

/* Whether bulk tensor copies can read t: 16-byte aligned base and byte strides, and no
** broadcast (stride 0) dimension of more than one element. */
static int tma_can_read(const fj_tensor *packed_or_4d)
{
    if (!rows_are_16b_aligned(packed_or_4d))
        return 0;
    const fj_tensor t = fj__tensor_4d(packed_or_4d);
    for (int i = 0; i < 3; i++)
        if (t.shape[i] > 1 && (t.stride[i] <= 0 || t.stride[i] >= ((int64_t)1 << 38)))
            return 0;
    return 1;
}

/* Registers a consumer thread of the WGMMA kernel has after reallocation (see the template). */
static int wgmma_consumer_registers(int consumers, int ctas_per_sm)
{
    return ctas_per_sm == 2 ? 232 : consumers == 3 ? 160 : consumers == 2 ? 240 : 255;
}

/* Whether the WGMMA kernel serves p on dev: Hopper's arch-specific target, 16-bit data that TMA
** can read, head dims that pad to at most 256. */
static int wgmma_serves(const fj__problem *p, const fj_device_info *dev)
{
    /* The kernel numbers its work tiles (64-row blocks at the least) with 32-bit ints. */
    if ((p->seqlen_q + 63) / 64 * p->heads_q * p->batch >= INT32_MAX)
        return 0;
    return sm_version(dev) == 90 && strchr(dev->arch, 'a') != NULL &&
           round_up(p->head_dim, 64) <= 256 && round_up(p->head_dim_v, 64) <= 256 &&
           tma_can_read(p->q) && tma_can_read(p->k) && tma_can_read(p->v) &&
           rows_are_16b_aligned(p->out);
}

/* Whether TMA can copy tiles of p's bias: rows of 16-byte multiples, one per query, and the
** broadcast-free dimensions nested as in a contiguous [batch, heads, sq, sk] tensor. */
static int bias_tma_can_read(const fj__problem *p)
{
    const fj_tensor *b = p->bias;
    const int64_t es = (int64_t)fj_dtype_size(b->dtype);
    const int64_t *s = p->bias_stride; /* batch, head, row; 0 where broadcast */
    if ((uintptr_t)b->data % 16 || s[2] <= 0 || (s[2] * es) % 16 || s[2] < p->seqlen_k ||
        (s[1] && ((s[1] * es) % 16 || s[1] < s[2] * p->seqlen_q)) ||
        (s[0] && ((s[0] * es) % 16 || s[0] < (s[1] ? s[1] * p->heads_q : s[2] * p->seqlen_q))))
        return 0;
    return s[0] * es < ((int64_t)1 << 40) && s[1] * es < ((int64_t)1 << 40);
}

static void plan_wgmma(fj__variant *v, const fj__problem *p, const fj_device_info *dev)
{
    v->path = FJ__PATH_WGMMA;
    /* 64-column panels of the 128-byte swizzle. */
    v->head_dim_pad = round_up(v->head_dim_pad, 64);
    v->head_dim_v_pad = round_up(v->head_dim_v_pad, 64);
    int32_t widest = v->head_dim_pad > v->head_dim_v_pad ? v->head_dim_pad : v->head_dim_v_pad;
    /* Measured on an H200 (bench/RESULTS.md). Two consumer warpgroups of 64 rows and a
    ** producer; 128-key tiles up to d = 128, 80 beyond (O's accumulators take 128 registers;
    ** 80 beat 64 by 19 % at d 256), two tiles in flight. From d = 128 on, the softmax of a tile
    ** overlaps the previous P V; up to d = 128 the two warpgroups also ping-pong (below). At
    ** d = 64 from 2k queries three warpgroups with the plain loop gain 8-10 % (112-key tiles)
    ** (pipelined, they lost 13 % at 2k causal in one sweep). Non-causal
    ** d = 128 keeps three tiles in flight (+8-15 % at 2k and 8k in one sweep, within the
    ** run-to-run spread in the next grid run; causal: no gain). */
    v->tile_m = 128;
    v->warps = 12;
    v->tile_n = widest <= 128 ? 128 : 80;
    v->stages = 2;
    v->q_stages = 1;
    v->ctas_per_sm = 1;
    v->overlap = widest > 64;
    /* Element masks skip and mask by 128 x 128 blocks: tiles that divide them. */
    const int classes = v->block_mask || fj__variant_element_masks(v);
    /* Work tiles of unequal cost: a band, skipped blocks, sequences of different lengths. */
    const int uneven = v->local_mask || classes || v->varlen;
    v->bias_tma = v->bias && bias_tma_can_read(p);
    if ((classes || v->bias_tma) && widest > 128)
        v->tile_n = 64;
    /* A persistent grid (a block per SM, the next tile's loads under the last one's epilogue).
    ** Without a band every work tile costs the same: striding gains up to 27 % at 512 keys and
    ** matches from 8k. Causal tiles differ in cost: strided they lost up to 40 % (whole
    ** columns of heavy tiles land on the same blocks); dealt zigzag (heavy and light tiles
    ** pair up) they gain 8-38 % over one block per tile at 512 to 4k keys, d 64 to 256, more
    ** than the dynamic counter and without its spills at d 256; from 8k queries the static
    ** deal lost up to 29 % (16k, d 128) to one block per tile, longest first, which the
    ** hardware balances (bench/RESULTS.md). */
    v->persistent = !uneven ? 1 : p->seqlen_q <= 4096 ? 3 : 0;
    if (widest > 64 && widest <= 128 && !v->local_mask)
        v->stages = 3;
    v->threads = 32 * v->warps;
    if (!fj__variant_fits(v, dev))
        v->stages = 2; /* a smaller shared memory than the H200's */
    /* (Three consumer warpgroups have 160 registers each: too few for score terms.) 128-key
    ** tiles beat 112 by 1-13 % (non-causal 2k 444 -> 468-501, 8k 490 -> 510; causal 2k
    ** 386 -> 400, 4k/16k +3 %): 2k keys fill 16 whole tiles, not 18 and a sliver. */
    if (widest <= 64 && p->seqlen_q >= 2048 && !classes && !v->alibi && !v->bias && !v->score_mod) {
        v->tile_m = 192;
        v->warps = 16;
        v->tile_n = 128;
    }
    /* Two consumer warpgroups take turns issuing their products (FA3's ping-pong), which
    ** needs the pipelined loop; at d 64 the pair beats the plain loop (non-causal 512 / 1k keys
    ** 350 -> 366 / 378 -> 404, causal +1-2 %) though the pipelined loop alone loses 6 % there;
    ** non-causal d 128 +4-6 % at 512, even from 2k. */
    if (v->tile_m == 128 && widest <= 128) {
        v->overlap = 1;
        v->pingpong = 1;
    }
    /* d 128 without a band from 4k keys: 160-key tiles in two slots and one Q buffer (FA3's
    ** shape), +1-4 % at 4k-16k in the steady state (bench/RESULTS.md; a second Q buffer fits
    ** but measured 2 % slower at 4k); at 2k, where 160 leaves a sliver, even. */
    const int wide_keys =
        widest > 64 && widest <= 128 && !uneven && !v->bias && p->seqlen_k >= 4096;
    if (wide_keys) {
        v->tile_n = 160;
        v->stages = 2;
    }
    v->threads = 32 * v->warps;
    while (!fj__variant_fits(v, dev) && v->tile_n > 16)
        v->tile_n -= 16;
    if (!fj__variant_fits(v, dev))
        v->stages = 1;
    /* O's 128 accumulators at d 256: rescaling them for every key tile costs more than a
    ** stale exponent base (+4-5 % at 4k; at d 64 and 128 the skip lost 1-2 %). */
    v->lazy_rescale = widest > 128;
    /* d 64 with 128-row tiles and no band or score terms: the exponentials of two column
    ** blocks in eight come from a polynomial on the FMA pipe, off the MUFU unit that is as
    ** busy as the tensor cores there (with ping-pong: +1-3 % over none at 512 and 1k keys, one
    ** in eight about as much; causal and 192-row tiles lost 2-10 % in an earlier sweep). */
    if (widest <= 64 && v->tile_m == 128 && !uneven && !v->softcap && !v->neg_scale && !v->alibi &&
        !v->bias && !v->score_mod)
        v->exp_poly = 2;
    /* A second Q buffer where shared memory allows (d 64; d 128 with two stages): the next
    ** work tile's Q is copied while this one runs instead of after its last S = Q K^T. */
    v->q_stages = wide_keys ? 1 : 2;
    if (!fj__variant_fits(v, dev))
        v->q_stages = 1;
}

/* Key tiles of width bn that query rows [r0, r1) see: the band's (attn_key_band in the
** templates), cut at the keys' end. */
static int64_t band_tiles(const fj__problem *p, int64_t r0, int64_t r1, int64_t bn)
{
    const int64_t shift = (int64_t)p->seqlen_k - p->seqlen_q;
    int64_t lo = 0, hi = p->seqlen_k;
    if (p->window_left >= 0 && r0 + shift - p->window_left > 0)
        lo = r0 + shift - p->window_left;
    if (p->window_right >= 0 && r1 + shift + p->window_right < hi)
        hi = r1 + shift + p->window_right;
    if (hi <= lo)
        return 0;
    return (hi + bn - 1) / bn - lo / bn;
}

uint32_t fj__zigzag_grid(const fj__problem *p, const fj__variant *v, uint32_t sms)
{
    const int64_t m_blocks = (p->seqlen_q + v->tile_m - 1) / v->tile_m;
    const int64_t work = m_blocks * p->heads_q * p->batch;
    /* Beyond 64 rounds the last round's share is small; the search costs work * sms / 8. */
    if (work <= (int64_t)sms || work > 64 * (int64_t)sms || v->tile_m <= 0 || v->tile_n <= 0)
        return work < (int64_t)sms ? (uint32_t)work : sms;
    int64_t *cost = malloc((size_t)m_blocks * sizeof *cost);
    int64_t *load = malloc(sizeof *load * sms);
    if (!cost || !load) {
        free(cost);
        free(load);
        return sms;
    }
    /* The w-th tile's query block is w % m_blocks (with a bias or mask tensor, whose batches
    ** run fastest, (w / batch) % m_blocks), counted from the last block when the kernel runs
    ** heavy tiles first (a band or block classes); its cost is the key tiles each of its 64-row
    ** warpgroups computes, plus one for its prologue and epilogue. */
    const int heavy_first = v->local_mask || v->block_mask || fj__variant_element_masks(v);
    const int64_t repeat = v->bias || v->mask_tensor ? p->batch : 1;
    for (int64_t mb = 0; mb < m_blocks; mb++) {
        const int64_t m0 = (heavy_first ? m_blocks - 1 - mb : mb) * v->tile_m;
        cost[mb] = 1;
        for (int64_t r0 = m0; r0 < m0 + v->tile_m && r0 < p->seqlen_q; r0 += 64) {
            const int64_t r1 = r0 + 64 < p->seqlen_q ? r0 + 64 : p->seqlen_q;
            cost[mb] += band_tiles(p, r0, r1, v->tile_n);
        }
    }
    uint32_t best = sms;
    int64_t best_span = INT64_MAX;
    for (uint32_t g = sms; g >= sms - sms / 8 && g > 0; g--) {
        memset(load, 0, sizeof *load * g);
        int64_t w = 0, mb = 0, seen = 0, span = 0; /* seen: tiles of block mb in a row */
        for (int64_t round = 0; w < work; round++)
            for (uint32_t pos = 0; pos < g && w < work; pos++, w++) {
                int64_t *l = &load[round & 1 ? g - 1 - pos : pos];
                *l += cost[mb];
                span = *l > span ? *l : span;
                if (++seen == repeat) {
                    seen = 0;
                    mb = mb + 1 == m_blocks ? 0 : mb + 1;
                }
            }
        if (span < best_span) { /* ties keep the larger grid */
            best_span = span;
            best = g;
        }
    }
    free(cost);
    free(load);
    return best;
}

static void plan_simt(fj__variant *v, const fj_device_info *dev)
{
    /* One work-item per query row; the key tile is as deep as local memory allows (K and V
    ** tiles in float), at most 64 KiB on OpenCL and the 48 KiB of static shared memory on CUDA. */
    v->path = FJ__PATH_SIMT;
    v->tile_m = 32;
    v->threads = v->tile_m;
    v->tile_n = 32;
    while (v->tile_n > 8 && !fj__variant_fits(v, dev))
        v->tile_n /= 2;
}

int fj__apply_config(fj__variant *v, const char *config, fj__err *err)
{
    /* The tunable fields: 32-bit tile sizes and one-byte switches and counts. */
    static const struct {
        const char *name;
        size_t offset, size;
        int32_t lo, hi;
    } fields[] = {{"tile_m", offsetof(fj__variant, tile_m), 4, 16, 256},
                  {"tile_n", offsetof(fj__variant, tile_n), 4, 8, 256},
                  {"warps", offsetof(fj__variant, warps), 4, 1, 16},
                  {"kk_unroll", offsetof(fj__variant, kk_unroll), 4, 0, 16},
                  {"q_in_regs", offsetof(fj__variant, q_in_regs), 1, 0, 1},
                  {"overlap", offsetof(fj__variant, overlap), 1, 0, 1},
                  {"pingpong", offsetof(fj__variant, pingpong), 1, 0, 1},
                  {"persistent", offsetof(fj__variant, persistent), 1, 0, 3},
                  {"stages", offsetof(fj__variant, stages), 1, 1, 4},
                  {"q_stages", offsetof(fj__variant, q_stages), 1, 1, 2},
                  {"ctas_per_sm", offsetof(fj__variant, ctas_per_sm), 1, 1, 2},
                  {"exp_poly", offsetof(fj__variant, exp_poly), 1, 0, 8},
                  {"lazy_rescale", offsetof(fj__variant, lazy_rescale), 1, 0, 1}};
    const char *p = config;
    while (p && *p) {
        if (!strncmp(p, "path=", 5)) {
            size_t len = strspn(p + 5, "abcdefghijklmnopqrstuvwxyz");
            if (!((len == 3 && !strncmp(p + 5, "mma", 3)) ||
                  (len == 5 && !strncmp(p + 5, "wgmma", 5)) ||
                  (len == 4 && !strncmp(p + 5, "simt", 4))))
                return fj__fail(err, FJ_ERR_INVALID_ARGUMENT,
                                "FLASHJIT_CONFIG: path must be simt, mma or wgmma: '%s'", p),
                       -1;
            p += 5 + len;
            if (*p == ',')
                p++;
            continue;
        }
        char name[32];
        int value = 0, used = 0;
        if (sscanf(p, "%31[a-z_]=%d%n", name, &value, &used) != 2)
            return fj__fail(err, FJ_ERR_INVALID_ARGUMENT, "FLASHJIT_CONFIG: cannot read '%s'", p),
                   -1;
        size_t i = 0;
        while (i < sizeof fields / sizeof fields[0] && strcmp(name, fields[i].name))
            i++;
        if (i == sizeof fields / sizeof fields[0])
            return fj__fail(err, FJ_ERR_INVALID_ARGUMENT, "FLASHJIT_CONFIG: unknown field '%s'",
                            name),
                   -1;
        if (value < fields[i].lo || value > fields[i].hi)
            return fj__fail(err, FJ_ERR_INVALID_ARGUMENT,
                            "FLASHJIT_CONFIG: %s = %d, expected %d..%d", name, value, fields[i].lo,
                            fields[i].hi),
                   -1;
        if (fields[i].size == 4)
            memcpy((char *)v + fields[i].offset, &(int32_t){value}, sizeof(int32_t));
        else
            *((uint8_t *)v + fields[i].offset) = (uint8_t)value;
        p += used;
        if (*p == ',')
            p++;
    }
    v->threads = v->path == FJ__PATH_SIMT ? v->tile_m : 32 * v->warps;
    return 0;
}

int fj__variant_fits(const fj__variant *v, const fj_device_info *dev)
{
    if (v->path == FJ__PATH_WGMMA) {
        int consumers = v->tile_m / 64;
        /* S and O fragments per consumer thread, plus ~40 for addresses and softmax state; and
        ** P's when the loop is pipelined (the plain loop packs P as S dies: 192 x 128 tiles at
        ** d 64 fit the 160 registers of three consumers without spills). */
        int registers =
            v->tile_n / 2 + (v->overlap ? v->tile_n / 4 : 0) + v->head_dim_v_pad / 2 + 40;
        return consumers >= 1 && consumers <= 3 && v->tile_m == 64 * consumers &&
               (!v->pingpong || (consumers == 2 && v->overlap)) &&
               v->warps == 4 * (consumers + 1) && v->threads == 32 * v->warps &&
               v->tile_n % 16 == 0 && v->tile_n >= 16 && v->tile_n <= 256 && v->stages >= 1 &&
               v->stages <= 4 && v->q_stages >= 1 && v->q_stages <= 2 &&
               v->head_dim_pad % 64 == 0 && v->head_dim_v_pad % 64 == 0 && v->head_dim_pad <= 256 &&
               v->head_dim_v_pad <= 256 && v->ctas_per_sm >= 1 && v->ctas_per_sm <= 2 &&
               (v->ctas_per_sm == 1 || consumers == 1) && v->exp_poly <= 8 &&
               v->lazy_rescale <= 1 &&
               registers <= wgmma_consumer_registers(consumers, v->ctas_per_sm) &&
               (!(v->block_mask || fj__variant_element_masks(v)) ||
                (128 % v->tile_m == 0 && 128 % v->tile_n == 0)) &&
               (!v->bias_tma || (v->tile_n * fj__variant_bias_bytes(v)) % 128 == 0) &&
               /* Each block also reserves 1 KiB of the SM's shared memory, which holds the
               ** largest block's opt-in plus that kilobyte. */
               (uint64_t)v->ctas_per_sm * (fj__variant_shared_bytes(v) + 1024u) <=
                   dev->local_memory + 1024u;
    }
    if (v->path == FJ__PATH_MMA)
        return v->warps >= 1 && v->tile_m % (16 * v->warps) == 0 && v->tile_n % 16 == 0 &&
               v->threads == 32 * v->warps && fj__variant_shared_bytes(v) <= dev->local_memory;
    uint64_t budget = dev->local_memory ? dev->local_memory : 32768;
    uint64_t cap = dev->backend == FJ_BACKEND_CUDA ? 48 * 1024 : 64 * 1024;
    budget = budget < cap ? budget : cap;
    return v->threads == v->tile_m &&
           (uint64_t)v->tile_n * (uint64_t)(v->head_dim_pad + v->head_dim_v_pad) * 4 <= budget;
}

void fj__variant_config(const fj__variant *v, char *buf, size_t size)
{
    if (v->path == FJ__PATH_WGMMA)
        snprintf(buf, size,
                 "path=wgmma,tile_m=%d,tile_n=%d,warps=%d,stages=%d,q_stages=%d,overlap=%d,"
                 "pingpong=%d,persistent=%d,ctas_per_sm=%d,exp_poly=%d,lazy_rescale=%d",
                 (int)v->tile_m, (int)v->tile_n, (int)v->warps, (int)v->stages, (int)v->q_stages,
                 (int)v->overlap, (int)v->pingpong, (int)v->persistent, (int)v->ctas_per_sm,
                 (int)v->exp_poly, (int)v->lazy_rescale);
    else if (v->path == FJ__PATH_MMA)
        snprintf(buf, size, "tile_m=%d,tile_n=%d,warps=%d,kk_unroll=%d,q_in_regs=%d",
                 (int)v->tile_m, (int)v->tile_n, (int)v->warps, (int)v->kk_unroll,
                 (int)v->q_in_regs);
    else
        snprintf(buf, size, "tile_m=%d,tile_n=%d", (int)v->tile_m, (int)v->tile_n);
}

void fj__plan_forward(const fj__problem *p, const fj_device_info *dev, const char *config,
                      fj__variant *v)
{
    memset(v, 0, sizeof *v);
    v->family = FJ__FAMILY_FWD;
    v->backend = dev->backend;
    v->dtype = p->dtype;
    /* Head dims are padded to multiples of 16 (the tensor-core k step) so that nearby head dims
    ** share a kernel; the padding lanes are masked at load and store. */
    v->head_dim_pad = round_up(p->head_dim, 16);
    v->head_dim_v_pad = round_up(p->head_dim_v, 16);
    v->local_mask = p->window_left >= 0 || p->window_right >= 0;
    v->softcap = p->softcap > 0.0f;
    v->neg_scale = p->scale < 0.0f;
    v->mask_mod = p->mask_mod;
    v->score_mod = p->score_mod;
    v->alibi = p->alibi != NULL;
    v->bias = !p->bias ? 0 : p->bias->dtype == FJ_DTYPE_F32 ? 1 : 2;
    v->mask_tensor = p->mask != NULL;
    v->varlen = (uint8_t)((p->cu_seqlens_q != NULL) + (p->seqused_k != NULL));
    v->mask_ranges = p->mask_ranges ? (uint8_t)p->mask_ranges->shape[3] : 0;
    v->block_mask = p->block_mask != NULL;
    v->write_lse = p->lse != NULL;

    /* Head dims beyond 256 run on the SIMT kernels only, so far; variable lengths, masks and
    ** score terms beyond the band on the Hopper kernel (variable lengths without element masks,
    ** whose block classifier takes dense shapes) and the SIMT kernels. */
    const int extras = p->mask_mod || p->score_mod || v->alibi || v->bias || v->mask_tensor ||
                       v->mask_ranges || v->block_mask;
    int tensor_cores = dev->backend == FJ_BACKEND_CUDA && sm_version(dev) >= 80 &&
                       v->head_dim_pad <= 256 && v->head_dim_v_pad <= 256 &&
                       (p->dtype == FJ_DTYPE_F16 || p->dtype == FJ_DTYPE_BF16) &&
                       rows_are_16b_aligned(p->q) && rows_are_16b_aligned(p->k) &&
                       rows_are_16b_aligned(p->v) && rows_are_16b_aligned(p->out);
    /* "path=mma" in the override keeps Hopper on the mma.sync kernel (tests, comparisons). */
    const int wgmma = tensor_cores && wgmma_serves(p, dev) &&
                      !(v->varlen && fj__variant_element_masks(v)) &&
                      !(config && strstr(config, "path=mma"));
    tensor_cores = wgmma || (tensor_cores && !extras && !v->varlen);
    if (wgmma)
        plan_wgmma(v, p, dev);
    else if (tensor_cores)
        plan_mma(v, p, dev);
    else
        plan_simt(v, dev);
    /* A development and tuning override, already validated when the context was made; a
    ** configuration that does not fit this request keeps the heuristic's. */
    fj__variant tuned = *v;
    if (tensor_cores && config && fj__apply_config(&tuned, config, NULL) == 0 &&
        fj__variant_fits(&tuned, dev))
        *v = tuned;
}
