/* The default kernel path and tile choice, used until a tuned record exists for the device and
** shape, and the zigzag schedule's grid model. Pure functions of a request's features. */
#include "plan.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int fj__sm_version(const fj_device_info *dev)
{
    int v = 0;
    return sscanf(dev->arch, "sm_%d", &v) == 1 ? v : 0;
}

static void plan_mma(fj__variant *v, const fj__features *f, const fj_device_info *dev)
{
    v->path = FJ__PATH_MMA;
    /* Value dims beyond 256: equal slices of whole column pairs, a block each
    ** (fj__variant_dv_slices); beyond 256 in q and k, wider Q and K tiles alone. */
    v->head_dim_v_pad = fj__round_up(v->head_dim_v_pad, 16 * fj__dv_slices_of(v->head_dim_v_pad));
    int32_t widest = v->head_dim_pad > v->head_dim_v_pad ? v->head_dim_pad : v->head_dim_v_pad;
    /* Up to d = 128: 128 rows, four warps of two m16 tiles (each K/V fragment read from shared
    ** memory feeds two mma). Beyond: 64 rows in four warps, or for long sequences 128 rows in
    ** eight warps of one m16 tile (FA2's d = 256 shape) where shared memory allows: on an H200
    ** that gains 3-7 % from 2k keys on (non-causal) and 8k (causal), and loses up to 10 % below
    ** (bench/RESULTS.md). 64-key tiles throughout. No spills (ptxas, sm_80 to sm_90a). */
    v->warps = widest > 128 && f->seqlen_q >= (v->local_mask ? 8192 : 2048) ? 8 : 4;
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
    if (fj__sm_version(dev) < 90 && v->local_mask && widest > 64 && widest <= 128) {
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
    /* Then fewer warps (head dims beyond 256 in 99 KiB: 64 rows of Q alone take 73 KiB at 576). */
    while (fj__variant_shared_bytes(v) > dev->local_memory && v->warps > 1) {
        v->warps /= 2;
        v->tile_m /= 2;
    }
    v->threads = 32 * v->warps;
}

/* A 0/1 switch of the override (dequant=, v_transposed=; validated when the context was
** made), or `unset` where it is not given. */
static int config_switch(const char *config, const char *name, int unset)
{
    const char *value = fj__config_field(config, name);
    return value ? *value == '1' : unset;
}

/* Whether the WGMMA kernel serves f on dev: Hopper's arch-specific target, 16-bit data (or FP8
** q, k and v, head dims up to 256: beyond 128 columns S is summed by panels, variant field
** score_parts) that TMA can read (16-bit head dims beyond 256 too: their value
** columns split into slices). */
static int wgmma_serves(const fj__features *f, const fj_device_info *dev)
{
    if (fj__dtype_fp8((fj_dtype)f->q_dtype) && (f->head_dim > 256 || f->head_dim_v > 256))
        return 0;
    /* The kernel numbers its work tiles (64-row blocks at the least, by value slices: at most
    ** 3, with d beyond 256 at least 2) with 32-bit ints. */
    const int64_t slices = f->head_dim > 256 ? 3 : fj__dv_slices_of(fj__round_up(f->head_dim_v, 64));
    if ((f->seqlen_q + 63) / 64 * f->heads_q * f->batch * slices >= INT32_MAX)
        return 0;
    return fj__sm_version(dev) == 90 && strchr(dev->arch, 'a') != NULL && f->tma[FJ__T_Q] &&
           f->tma[FJ__T_K] && f->tma[FJ__T_V] && f->rows_16b[FJ__T_OUT];
}

/* Head dims beyond 256: one consumer warpgroup of 64 rows (Q alone takes up to 72 KiB of
** shared memory), a value slice of at most 256 columns per work tile, the softmax pipelined
** against P V, and the widest key tiles that two ring slots (three with v in k) allow (one,
** failing that). */
static void plan_wgmma_wide_tiles(fj__variant *v, const fj_device_info *dev)
{
    v->tile_m = 64;
    v->warps = 8;
    v->threads = 32 * v->warps;
    /* With v in k a slot goes back only once P V has read it: a third slot keeps a key tile
    ** in flight. */
    v->stages = v->v_in_k ? 3 : 2;
    v->q_stages = 1;
    v->ctas_per_sm = 1;
    v->overlap = 1;
    v->lazy_rescale = 1;
    v->bias_tma = 0;
    v->persistent = 0;
    for (v->tile_n = 128; v->tile_n > 16 && !fj__variant_fits(v, dev); v->tile_n -= 16)
        ;
    if (!fj__variant_fits(v, dev))
        v->stages = 1;
}

/* Value slices that each recompute S, or (split, where d is beyond 256 and dv at most 512) the
** two blocks of a cluster splitting S's head dim and the value columns between them (d_split:
** halves of whole panels). The split is correct but measured slower on an H200 (d 512
** 255-273 TFLOP/s against 315-333, 576 / 512 220-263 against 246-296, MLA even: the exchange's
** wait is exposed with one consumer warpgroup; bench/RESULTS.md), so it is taken only when
** asked for ("d_split=1" in the config). */
static void plan_wgmma_wide(fj__variant *v, const fj__features *f, const fj_device_info *dev,
                            int split_asked)
{
    if (split_asked && v->head_dim_pad > 256 && v->head_dim_v_pad <= 512) {
        fj__variant split = *v;
        split.d_split = 1;
        split.head_dim_pad = fj__round_up(v->head_dim_pad, 128);
        split.head_dim_v_pad = fj__round_up(v->head_dim_v_pad, 128);
        /* v a view of k (MLA; dv <= d, so each half of v's panels lies in a half of k's): the
        ** value slices are loaded as part of K's tiles */
        split.v_in_k = f->v_in_k;
        plan_wgmma_wide_tiles(&split, dev);
        if (fj__variant_fits(&split, dev)) {
            *v = split;
            return;
        }
    }
    plan_wgmma_wide_tiles(v, dev);
}

/* FP8 inputs: P V reads value tiles of whole 128-key panels (transposed in the kernel, through
** staging buffers), so 128-key tiles; then as many Q buffers and ring slots as fit, and where
** even one of each does not (256 value columns: O's 128 accumulators, S's 64 and P's 16 a
** thread spilled 48 bytes) the plain loop, whose P is packed as S dies (no spills). */
static void plan_wgmma_fp8(fj__variant *v, const fj_device_info *dev)
{
    v->tile_n = 128;
    v->persistent = v->persistent == 2 ? 0 : v->persistent;
    /* Beyond one panel of q and k: one ring slot and one Q buffer. Two and three slots fit,
    ** and measured no faster at d 256 (H100, bench/RESULTS.md, "FP8 forward's ring depth").
    ** Up to one panel, the 16-bit plan's ring. */
    if (v->head_dim_pad > 128)
        v->stages = v->q_stages = 1;
    const fj__variant want = *v;
    /* Beyond one panel of q and k, S's second panel summed apart: in as few parts of the key
    ** tile as the registers allow (1 to 128 value columns, 8 at 256); one panel: none. */
    static const uint8_t one_panel[] = {0}, two_panels[] = {1, 2, 4, 8};
    const int wide = v->head_dim_pad > 128;
    const uint8_t *parts = wide ? two_panels : one_panel;
    const int nparts = wide ? (int)sizeof two_panels : (int)sizeof one_panel;
    for (int i = 0; i < nparts; i++) {
        for (int pipelined = want.overlap; pipelined >= 0; pipelined--) {
            *v = want;
            v->score_parts = parts[i];
            v->overlap = (uint8_t)pipelined;
            v->pingpong = (uint8_t)(pipelined && want.pingpong);
            while (!fj__variant_fits(v, dev) && v->q_stages > 1)
                v->q_stages--;
            while (!fj__variant_fits(v, dev) && v->stages > 1)
                v->stages--;
            if (fj__variant_fits(v, dev))
                return;
        }
    }
}

static void plan_wgmma(fj__variant *v, const fj__features *f, const fj_device_info *dev,
                       const char *config)
{
    v->path = FJ__PATH_WGMMA;
    /* 64-column panels of the 128-byte swizzle (128 columns of FP8). */
    const int fp8 = fj__dtype_fp8((fj_dtype)v->q_dtype);
    v->head_dim_pad = fj__round_up(v->head_dim_pad, fp8 ? 128 : 64);
    v->head_dim_v_pad = fj__round_up(v->head_dim_v_pad, 64);
    /* Beyond 256 value columns, equal slices of whole panels (fj__variant_dv_slices). */
    const int32_t slices = fj__dv_slices_of(v->head_dim_v_pad);
    v->head_dim_v_pad = fj__round_up(v->head_dim_v_pad, 64 * slices);
    if (v->head_dim_pad > 256 || slices > 1) {
        plan_wgmma_wide(v, f, dev, config && strstr(config, "d_split=1") != NULL);
        return;
    }
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
    if (v->paged && widest > 128)
        v->tile_n = 64; /* tiles that pages of powers of two hold whole, or hold whole pages */
    v->stages = 2;
    v->q_stages = 1;
    v->ctas_per_sm = 1;
    v->overlap = widest > 64;
    /* Element masks skip and mask by 128 x 128 blocks: tiles that divide them. */
    const int classes = v->block_mask || fj__variant_element_masks(v);
    /* Work tiles of unequal cost: a band, skipped blocks, sequences of different lengths. */
    const int uneven = v->local_mask || classes || v->varlen || v->paged;
    v->bias_tma = v->bias && f->bias_tma;
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
    v->persistent = !uneven ? 1 : f->seqlen_q <= 4096 ? 3 : 0;
    if (widest > 64 && widest <= 128 && !v->local_mask)
        v->stages = 3;
    v->threads = 32 * v->warps;
    if (!fj__variant_fits(v, dev))
        v->stages = 2; /* a smaller shared memory than the H200's */
    /* (Three consumer warpgroups have 160 registers each: too few for score terms.) 128-key
    ** tiles beat 112 by 1-13 % (non-causal 2k 444 -> 468-501, 8k 490 -> 510; causal 2k
    ** 386 -> 400, 4k/16k +3 %): 2k keys fill 16 whole tiles, not 18 and a sliver. */
    if (widest <= 64 && f->seqlen_q >= 2048 && !classes && !v->alibi && !v->bias && !v->score_mod) {
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
        widest > 64 && widest <= 128 && !uneven && !v->bias && f->seqlen_k >= 4096;
    if (wide_keys) {
        v->tile_n = 160;
        v->stages = 2;
    }
    v->threads = 32 * v->warps;
    if (!fp8) { /* (FP8's tiles: plan_wgmma_fp8) */
        while (!fj__variant_fits(v, dev) && v->tile_n > 16)
            v->tile_n -= 16;
        if (!fj__variant_fits(v, dev))
            v->stages = 1;
    }
    /* O's 128 accumulators at d 256: rescaling them for every key tile costs more than a
    ** stale exponent base (+4-5 % at 4k; at d 64 and 128 the skip lost 1-2 %). Not in FP8
    ** (fj__variant_fits says why). */
    v->lazy_rescale = widest > 128 && !fp8;
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
    if (fp8) {
        /* v transposed by a plan step for dense requests (v_transposed=0 keeps the kernel's
        ** own transposing warps): the step and the kernel together were 1.41x the kernel
        ** alone at d 256, 1.06x at 192 / 128 and d 128 (H100, 16k, bench/RESULTS.md).
        ** Decided before the tiles: the registers the producer keeps depend on it. */
        v->v_transposed = !f->varlen && !f->paged && f->heads_kv <= FJ__MAX_GRID_DIM_Y &&
                          f->batch <= FJ__MAX_GRID_DIM_Y &&
                          config_switch(config, "v_transposed", 1);
        plan_wgmma_fp8(v, dev);
    }
}

/* Key tiles of width bn that query rows [r0, r1) see: the band's (attn_key_band in the
** templates), cut at the keys' end. */
static int64_t band_tiles(const fj__features *f, int64_t r0, int64_t r1, int64_t bn)
{
    const int64_t shift = (int64_t)f->seqlen_k - f->seqlen_q;
    int64_t lo = 0, hi = f->seqlen_k;
    if (f->window_left >= 0 && r0 + shift - f->window_left > 0)
        lo = r0 + shift - f->window_left;
    if (f->window_right >= 0 && r1 + shift + f->window_right < hi)
        hi = r1 + shift + f->window_right;
    if (hi <= lo)
        return 0;
    return (hi + bn - 1) / bn - lo / bn;
}

uint32_t fj__zigzag_grid(const fj__features *f, const fj__variant *v, uint32_t sms)
{
    const int64_t m_blocks = (f->seqlen_q + v->tile_m - 1) / v->tile_m;
    const int64_t slices = fj__variant_dv_slices(v);
    const int64_t work = m_blocks * f->heads_q * f->batch * slices;
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
    const fj__tile_order order = fj__variant_tile_order(v);
    const int64_t repeat = (order.batch_fastest ? f->batch : 1) * slices;
    for (int64_t mb = 0; mb < m_blocks; mb++) {
        const int64_t m0 = (order.heavy_first ? m_blocks - 1 - mb : mb) * v->tile_m;
        cost[mb] = 1;
        for (int64_t r0 = m0; r0 < m0 + v->tile_m && r0 < f->seqlen_q; r0 += 64) {
            const int64_t r1 = r0 + 64 < f->seqlen_q ? r0 + 64 : f->seqlen_q;
            cost[mb] += band_tiles(f, r0, r1, v->tile_n);
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

int32_t fj__page_rows(int32_t tile_n, int64_t page_size)
{
    /* A copy is a tile where pages hold whole tiles, else a page where tiles hold whole pages:
    ** pages of whole 8-row periods of the 128-byte swizzle, which TMA applies by shared-memory
    ** address, so a copy must start on a period. */
    if (tile_n > 0 && page_size % tile_n == 0)
        return tile_n;
    if (page_size > 0 && tile_n % page_size == 0 && page_size % 8 == 0)
        return (int32_t)page_size;
    return 0;
}

/* A paged variant's copies for its tiles (0 where none fit; unpaged: nothing). */
static void set_page_rows(fj__variant *v, const fj__features *f)
{
    if (v->paged)
        v->page_rows = (uint8_t)fj__page_rows(v->tile_n, f->page_size);
}

/* Whether FP8 q, k and v can go through 16-bit copies (variant field dequant): dense (a copy's
** size follows from the features; packed rows' count does not), with a grid of batch
** work-groups. */
static int dequant_can(const fj__features *f)
{
    return fj__dtype_fp8((fj_dtype)f->q_dtype) && f->kv_dtype == f->q_dtype &&
           (f->out_dtype == FJ_DTYPE_F16 || f->out_dtype == FJ_DTYPE_BF16) && !f->paged &&
           !f->varlen && f->batch <= FJ__MAX_GRID_DIM_Y && f->seqlen_q <= INT32_MAX &&
           f->seqlen_k <= INT32_MAX;
}

/* f as the 16-bit forward reads it after the dequantising steps: q, k and v in out's dtype,
** contiguous [b, s, h, d] in workspaces (aligned), no descale factors, v apart from k. */
static fj__features dequantised_features(const fj__features *f)
{
    fj__features g = *f;
    g.q_dtype = g.kv_dtype = f->out_dtype;
    g.descale = 0;
    g.v_in_k = 0;
    const int64_t dims[3] = {f->head_dim, f->head_dim, f->head_dim_v};
    for (int t = FJ__T_Q; t <= FJ__T_V; t++)
        g.rows_16b[t] = g.tma[t] = (uint8_t)(dims[t] * 2 % 16 == 0);
    return g;
}

/* The forward's variant for f as it is (FP8 read as FP8). */
static void choose_native(const fj__features *f, const fj_device_info *dev, const char *config,
                          fj__variant *v)
{
    fj__variant_from_features(v, FJ__FAMILY_FWD, f, dev);
    fj__variant_score_fields(v, f);
    v->varlen = f->varlen;
    v->write_lse = f->lse;

    /* Head dims beyond 256 run on the Hopper kernel and the SIMT kernels; variable lengths,
    ** masks and score terms beyond the band likewise (variable lengths without element masks,
    ** whose block classifier takes dense shapes, a bias or block classes: the SIMT kernels read
    ** each sequence's rows of them, Hopper's kernel is not built for that). */
    const int extras = f->mask_mod || f->score_mod || v->alibi || v->bias || v->mask_tensor ||
                       v->mask_ranges || v->block_mask;
    const int sixteen_bit = (f->q_dtype == FJ_DTYPE_F16 || f->q_dtype == FJ_DTYPE_BF16) &&
                            f->kv_dtype == f->q_dtype && f->out_dtype == f->q_dtype;
    /* "path=mma" in the override keeps Hopper on the mma.sync kernel, "path=simt" any device on
    ** the SIMT one (tests, comparisons). */
    const int mma_asked = config && strstr(config, "path=mma");
    const int simt_asked = config && strstr(config, "path=simt");
    /* FP8 q, k and v with a 16-bit out: Hopper's kernel only. */
    const int fp8 = fj__dtype_fp8((fj_dtype)f->q_dtype) && f->kv_dtype == f->q_dtype &&
                    (f->out_dtype == FJ_DTYPE_F16 || f->out_dtype == FJ_DTYPE_BF16);
    int tensor_cores = dev->backend == FJ_BACKEND_CUDA && fj__sm_version(dev) >= 80 &&
                       !simt_asked && (sixteen_bit || fp8) && f->rows_16b[FJ__T_Q] &&
                       f->rows_16b[FJ__T_K] && f->rows_16b[FJ__T_V] && f->rows_16b[FJ__T_OUT];
    /* A paged cache (chunks of prefill against it): Hopper's kernel reads the pages for 16-bit
    ** data to head dims 256 without score terms or masks beyond the band; the decode kernels
    ** take the rest. */
    const int wide = v->head_dim_pad > 256 || v->head_dim_v_pad > 256;
    const int pages_read = !f->paged || (sixteen_bit && !extras && !wide);
    const int wgmma = tensor_cores && wgmma_serves(f, dev) && pages_read &&
                      !(v->varlen && (fj__variant_element_masks(v) || v->bias || v->block_mask)) &&
                      !mma_asked;
    /* Before Hopper, head dims beyond 256 too: mma.sync's kernel in value slices (plan_mma),
    ** where its tiles fit the shared memory. */
    tensor_cores = wgmma || (tensor_cores && !fp8 && !extras && !v->varlen);
    const fj__variant before = *v;
    if (wgmma) {
        v->paged = f->paged;
        plan_wgmma(v, f, dev, config);
        set_page_rows(v, f);
        /* no FP8 tiles fit this device, or the pages no tiles: SIMT (the decode kernels take a
        ** paged cache) */
        tensor_cores = !((fp8 && !fj__variant_fits(v, dev)) || (v->paged && !v->page_rows));
    } else if (tensor_cores) {
        plan_mma(v, f, dev);
        tensor_cores = fj__variant_fits(v, dev); /* else no tiles fit the shared memory: SIMT */
    }
    if (!tensor_cores) {
        *v = before;
        plan_simt(v, dev);
    }
    /* A development and tuning override, already validated when the context was made; a
    ** configuration that does not fit this request keeps the heuristic's. */
    fj__variant tuned = *v;
    if (tensor_cores && config && fj__apply_config(&tuned, config, NULL) == 0) {
        set_page_rows(&tuned, f);
        /* (class_vote: asked of every request; only Hopper's kernel with classes walks them,
        ** and not with FP8, whose consumers spilled 8 bytes with it at d 128 causal) */
        tuned.class_vote &= tuned.path == FJ__PATH_WGMMA &&
                            !fj__dtype_fp8((fj_dtype)tuned.q_dtype) &&
                            (tuned.block_mask || fj__variant_element_masks(&tuned));
        tuned.dequant = 0; /* (asked of every request; fj__choose_forward decides) */
        tuned.v_transposed = v->v_transposed; /* (likewise; plan_wgmma decides) */
        if ((!tuned.paged || tuned.page_rows) && fj__variant_fits(&tuned, dev))
            *v = tuned;
    }
}

void fj__choose_forward(const fj__features *f, const fj_device_info *dev, const char *config,
                        fj__variant *v)
{
    /* The copies: 0 never, 1 always (dequant=0/1), 2 (not given) where the FP8 request would
    ** otherwise take the SIMT forward on CUDA and the copies a tensor-core one, but for decode's
    ** few query rows (copies of K and V would triple what decode reads). */
    const int mode = dequant_can(f) ? config_switch(config, "dequant", 2) : 0;
    if (mode != 1)
        choose_native(f, dev, config, v);
    if (mode == 0 || (mode == 2 && (dev->backend != FJ_BACKEND_CUDA || v->path != FJ__PATH_SIMT ||
                                    f->seqlen_q <= FJ__DECODE_MAX_SEQLEN_Q)))
        return;
    /* Measured on an H100 (bench/RESULTS.md, "FP8 through 16-bit copies"): where Hopper's FP8
    ** kernel does not serve, the SIMT forward costs FP8 requests 47-270x their 16-bit
    ** equivalents; the copies and the 16-bit tensor-core forward 1.03-1.27x (2.1x under a
    ** mask that keeps 1/64 of the scores: the copies do not shrink with it). */
    const fj__features g = dequantised_features(f);
    fj__variant copies;
    choose_native(&g, dev, config, &copies);
    if (mode == 1 || copies.path != FJ__PATH_SIMT) {
        *v = copies;
        v->dequant = 1;
    }
}
