/* The decode plan: forwards of a few query rows per sequence (decoding, speculative decoding)
** on a decode kernel (on CUDA attn_decode_mma.cu.lua on tensor cores, or attn_decode_vec.cu.lua;
** else attn_decode.lua), every query head of a kv head packed into one
** work-group so each key and value is read once for all of them, and the keys of each sequence
** split so the grid fills the device (FlashDecoding): with more than one split, each split's
** state goes to an f32 workspace and a merge step (attn_merge.lua, strided states) combines
** them into out and lse; or, on the tensor-core kernel where asked for (merge_last), the last
** split of each block's rows to finish combines them in the kernel (decode_merge.lua).
**
** Workspace layout of the partial states: split s's output at [s][batch][row][head][dv] and its
** log-sum-exp at [s][batch][head][row] (seqlen_q rows a sequence: of packed sequences, each
** sequence's own rows at its batch, which the merge writes to out's packed rows). */
#include <stdlib.h>
#include <string.h>

#include "plan.h"

#define DECODE_THREADS 128  /* attn_decode.lua */
#define MAX_ROWS 64         /* packed group rows per work-group */
#define MIN_SPLIT_BYTES (128 * 1024) /* of K and V an automatic split reads, at least ... */
#define MIN_SPLIT_KEYS 64            /* ... within these bounds on its keys */
#define MAX_MIN_SPLIT_KEYS 256
#define BLOCKS_PER_UNIT 4   /* automatic splits aim at this many work-groups per compute unit */
#define MAX_BULK_IN_FLIGHT 256 /* row copies a tensor-core decode block keeps outstanding */
#define MIN_WGMMA_ROWS 16      /* packed rows that take value dims beyond 256 to wgmma */
#define BULK_MIN_DENSE_BYTES (1ll << 30)   /* K + V of a dense cache that takes bulk row copies */
#define TENSOR_MIN_DENSE_BYTES (1ll << 29) /* ... or tensor maps' copies */
#define TENSOR_MIN_FULL_GRID_BYTES (1ll << 27) /* ... where the unsplit grid fills the SMs */
/* K + V of a paged cache whose tiles tensor maps copy a page at a time (pages of part tiles) */
#define TENSOR_MIN_PAGE_COPIES_BYTES (1ll << 29)

/* Whether f's q is 16-bit and q, k and v come in 16-byte rows on CUDA. */
static int cuda_rows_16b(const fj__features *f, const fj_device_info *dev)
{
    return dev->backend == FJ_BACKEND_CUDA &&
           (f->q_dtype == FJ_DTYPE_BF16 || f->q_dtype == FJ_DTYPE_F16) &&
           f->rows_16b[FJ__T_Q] && f->rows_16b[FJ__T_K] && f->rows_16b[FJ__T_V];
}

/* Whether f is 16-bit data in 16-byte rows on CUDA: what the CUDA decode kernels (tensor
** cores, vectors) take. */
static int cuda_sixteen_bit(const fj__features *f, const fj_device_info *dev)
{
    return cuda_rows_16b(f, dev) && f->kv_dtype == f->q_dtype;
}

/* An FP8 KV cache read by 16-bit queries (the CUDA kernels convert it into f16 as they load,
** the portable one into floats). */
static int fp8_cache(const fj__features *f)
{
    return fj__dtype_fp8((fj_dtype)f->kv_dtype) &&
           (f->q_dtype == FJ_DTYPE_F16 || f->q_dtype == FJ_DTYPE_BF16);
}

/* Whether f is such a cache in 16-byte rows on CUDA: what the CUDA decode kernels take of it. */
static int cuda_fp8_cache(const fj__features *f, const fj_device_info *dev)
{
    return cuda_rows_16b(f, dev) && fp8_cache(f);
}

void fj__decode_mma_residency(fj__variant *v, const fj_device_info *dev)
{
    const uint64_t per_block = fj__variant_shared_bytes(v) + 1024u;
    const uint64_t fit = (dev->local_memory + 1024u) / per_block;
    /* (an FP8 cache's conversion wants more than a quarter of the registers: 4 blocks spilled
    ** 4-32 bytes under NVRTC at 64 dims, paged) */
    const uint64_t most = fj__dtype_fp8((fj_dtype)v->kv_dtype) ? 3 : 4;
    v->ctas_per_sm = (uint8_t)(fit < 1 ? 1 : fit > most ? most : fit);
}

int fj__decode_too_many_copies(const fj__variant *v)
{
    /* (the tensor loader's copies are panels: a few a tile) */
    return v->bulk && !v->swizzle &&
           (v->stages - 1) * v->tile_n * (v->v_in_k ? 1 : 2) > MAX_BULK_IN_FLIGHT;
}

int fj__decode_swizzle_fits(const fj__variant *v)
{
    /* whole 64-column panels of 16-bit K and V tiles of their own, Q in registers; copied by
    ** tensor maps (bulk), or by the column loader, its thread's rows a multiple of 8 apart (one
    ** row % 8 a thread, so one swizzled column) */
    if (v->path != FJ__PATH_MMA || !v->q_in_regs || v->split_dv || v->v_in_k ||
        fj__dtype_fp8((fj_dtype)v->kv_dtype) || v->head_dim_pad % 64 != 0 ||
        v->head_dim_v_pad % 64 != 0)
        return 0;
    if (v->bulk)
        return 1;
    return !strcmp(fj__variant_decode_loader(v), "columns") &&
           (v->threads / (v->head_dim_pad / 8)) % 8 == 0;
}

/* The decode grid's blocks without splits: a block per (batch, kv head, tile_m packed rows). */
static int64_t unsplit_blocks(const fj__features *f, int64_t group_rows, int32_t tile_m)
{
    return f->batch * f->heads_kv * fj__div_up(group_rows, tile_m);
}

/* The key rows of one tensor-map copy of f's K and V into v's tiles of v->tile_n keys: a tile
** where the cache is contiguous or its pages hold whole tiles (the kernels start their tiles at
** multiples of tile_n, so a tile's box lies in one page); the mma kernel's tensor loader also
** takes a tile as several pages (fj__page_rows: pages of whole periods of the swizzle that
** divide the tile). 0 where no copy fits. */
static int32_t copy_rows(const fj__features *f, const fj__variant *v)
{
    if (!f->paged || f->page_size % v->tile_n == 0)
        return v->tile_n;
    return v->path == FJ__PATH_MMA ? fj__page_rows(v->tile_n, f->page_size) : 0;
}

/* Whether a decode kernel can take f's K and V tiles by bulk tensor copies (the wgmma kernels'
** bulk, the mma kernel's tensor loader): tensors a tensor map reads, dense (not packed), and
** the pages copy_rows allows. Elsewhere threads copy them (the wgmma kernel's, any page size,
** packed sequences) or the copy engine a row a copy (the mma kernel's). */
static int tensor_copies_fit(const fj__features *f, const fj__variant *v)
{
    return f->tma[FJ__T_K] && (v->v_in_k || f->tma[FJ__T_V]) && !f->varlen && copy_rows(f, v) > 0;
}

/* On sm_80+, the tensor-core kernel (attn_decode_mma.cu.lua): 16, 32 or 64 packed rows a block,
** 64-key tiles in a ring, the query fragments in registers to d 128. Value dims beyond 256
** (MLA's 512) split S's head dims and O's columns across a block's four warps (split_dv) on
** 16 rows a block, both dims padded to 64; v a view of k's first dims (MLA's latent cache) is
** read from K's tiles. On sm_90+ the tiles come by bulk copies (below). An FP8 cache (rows of
** 16-byte pieces, head dims to 256, v not in k) is converted into f16 tiles for the products.
** Returns 1 and fills *v when it serves f on dev. */
static int choose_mma(const fj__features *f, const fj_device_info *dev, int64_t group_rows,
                      fj__variant *v)
{
    const int fp8 = cuda_fp8_cache(f, dev);
    if ((!cuda_sixteen_bit(f, dev) && !fp8) || fj__sm_version(dev) < 80 ||
        (fp8 && (f->head_dim > 256 || f->head_dim_v > 256 || f->v_in_k)))
        return 0;
    fj__variant t = *v;
    t.path = FJ__PATH_MMA;
    t.warps = 4;
    t.split_dv = f->head_dim_v > 256;
    t.head_dim_pad = (int32_t)fj__round_up(f->head_dim, t.split_dv ? 64 : 16);
    t.head_dim_v_pad = (int32_t)fj__round_up(f->head_dim_v, t.split_dv ? 64 : 16);
    t.v_in_k = f->v_in_k && t.head_dim_v_pad <= t.head_dim_pad;
    t.tile_m = t.split_dv || group_rows <= 16 ? 16 : group_rows <= 32 ? 32 : 64;
    if (fp8 && t.tile_m > 32)
        t.tile_m = 32; /* (64 spilled under NVRTC at d 80 and 256: the conversion's registers) */
    t.tile_n = t.split_dv ? 32 : 64;
    t.q_in_regs = !t.split_dv && t.head_dim_pad <= 128;
    /* On Hopper the copy engine moves whole rows (bulk): no thread computes a piece's address
    ** or waits on its own copies; where tensor maps can copy the tiles, a 64-column panel a
    ** copy in the 128-byte swizzle (swizzle): row copies land in rows padded for ldmatrix,
    ** which costs them 7 % of the bandwidth (bench/read_patterns.cu), and panels read 1.04-1.06x
    ** as fast as rows from batch 8 x 32k keys (H100, bench/RESULTS.md). A dense cache of rows to
    ** 128 dims takes cp.async's ring of four tiles (one block an SM), faster at batch 1 and
    ** wherever rows are 128 bytes (d 64: bulk rows 0.74-0.79x), except rows of 128 dims in a
    ** cache of BULK_MIN_DENSE_BYTES or more (rows 1.01-1.06x from batch 8 x 32k; 0.89-0.99x at
    ** batch 1), or by tensor maps of TENSOR_MIN_DENSE_BYTES or more, or of
    ** TENSOR_MIN_FULL_GRID_BYTES where the grid has a block for every SM without splits (1.01-
    ** 1.02x at b 1 x 128k keys and 32-128 x 1k; 0.96x at b 1 x 32k, the same at 8 x 8k);
    ** rows of 64 dims by tensor maps too, from the same sizes (in four slots 1.01-1.06x
    ** cp.async from 128 MiB, 0.94x at b 1 x 32k's 64 MiB; a row a copy ran at 0.74-0.79x). Pages
    ** of part tiles (a copy a page and panel: 16 copies a tile at pages of 16) by tensor maps
    ** from TENSOR_MIN_PAGE_COPIES_BYTES: 1.03-1.04x row copies there at d 128, 1.00x at
    ** 256 MiB, 0.89-0.96x at 32-128 MiB (H100, bench/RESULTS.md). */
    const int64_t cache_bytes = f->batch * f->seqlen_k * f->heads_kv *
                                (f->head_dim + f->head_dim_v) *
                                (int64_t)fj_dtype_size((fj_dtype)f->kv_dtype);
    fj__variant panels = t; /* (t by bulk copies) */
    panels.bulk = 1;
    const int page_copies = f->paged && f->page_size < t.tile_n;
    const int tensor = fj__sm_version(dev) >= 90 && tensor_copies_fit(f, &panels) &&
                       fj__decode_swizzle_fits(&panels) &&
                       (!page_copies || cache_bytes >= TENSOR_MIN_PAGE_COPIES_BYTES);
    int64_t dense_min = BULK_MIN_DENSE_BYTES;
    if (tensor)
        dense_min = unsplit_blocks(f, group_rows, t.tile_m) >= fj__compute_units(dev)
                        ? TENSOR_MIN_FULL_GRID_BYTES
                        : TENSOR_MIN_DENSE_BYTES;
    /* An FP8 cache's rows (half the bytes) by cp.async too: by bulk copies they ran at
    ** 0.62-0.88x (H100, d 128, dense and paged, bench/RESULTS.md). */
    const int rows_64 = t.head_dim_pad == 64 && t.head_dim_v_pad == 64;
    const int dense_bulk =
        (t.head_dim_pad == 128 && t.head_dim_v_pad == 128) || (tensor && rows_64);
    t.bulk = fj__sm_version(dev) >= 90 && !fp8 &&
             (f->paged || t.head_dim_pad > 128 || t.head_dim_v_pad > 128 ||
              (dense_bulk && cache_bytes >= dense_min));
    t.swizzle = t.bulk && tensor;
    /* Ring depth, the best of A/Bs on the H200 (bench/RESULTS.md): by cp.async four tiles (at
    ** d 128 one block an SM), three for a paged cache (two blocks: its page arithmetic wants
    ** the second block's warps); by bulk copies three (two blocks), since a block with more
    ** than MAX_BULK_IN_FLIGHT row copies outstanding ran at 0.6x; two with split_dv (two
    ** blocks of 104 KiB at 576 / 512); two for an FP8 cache (three blocks an SM: 1.00-1.05x
    ** dense and 1.05-1.22x paged over three or four slots' two blocks on the H100); a dense
    ** cache of 64-dim rows by tensor maps four, as timed (two copies a tile). Fewer where
    ** large heads do not fit. */
    const int dense_panels_64 = t.swizzle && !f->paged && rows_64;
    t.stages = t.split_dv || fp8 ? 2 : f->paged || (t.bulk && !dense_panels_64) ? 3 : 4;
    while (t.stages > 2 && (fj__decode_too_many_copies(&t) || !fj__variant_fits(&t, dev)))
        t.stages--;
    if (!fj__variant_fits(&t, dev))
        return 0;
    fj__decode_mma_residency(&t, dev);
    *v = t;
    return 1;
}

/* On sm_90a, for value dims beyond 256 (MLA's 576 / 512) and 16 packed rows or more, 64 packed
** rows a block on wgmma (rows past the packed ones are zeros: at MLA's 16-48 heads the wgmma
** kernel read 1.0-2.7x as fast as the mma kernel's split_dv, which mma.sync's rate bounds at
** 32-48 heads; RESULTS.md). Where the work is compute-bound (SEESAW_MIN_ROWS packed rows a kv
** head, so that two row tiles share each K tile), v is read from k's tiles by bulk tensor
** copies, a panel of k lies past v's 512 columns (MLA's; other widths only when warps=8 asks,
** not measured; v its own tensor in 32-key tiles too, measured 0.80-1.08x the forward's value
** slices, RESULTS.md) and the blocks before any split fill a quarter of the device
** (SEESAW_MIN_FILL), the seesaw kernel (attn_decode_seesaw.cu.lua: two warpgroups, each the
** whole S of every other 64-key tile, one's softmax under the other's products; warps 8); else
** attn_decode_wgmma.cu.lua (a copying warpgroup and two computing ones splitting S's head dims
** and O's columns; warps 12), 64-key tiles in two ring slots where they fit, else 32-key tiles.
** Returns 1 and fills *v when either serves f on dev. (On the H200 the seesaw kernel ran 2-4 %
** ahead at 128 heads from batch 32; behind where the blocks are few (batch 1: many splits of
** few tiles, 7-17 %), up to 11 % behind at 16-48 heads and even at 64 (bandwidth-bound
** there), RESULTS.md.) */
#define SEESAW_MIN_ROWS 128 /* packed rows a kv head */
#define SEESAW_MIN_FILL 4   /* blocks before splits >= compute units / this */
static int choose_wgmma(const fj__features *f, const fj_device_info *dev, int64_t group_rows,
                        fj__variant *v)
{
    /* Fewer packed rows than a slab of mma.sync leave the wgmma kernels' tiles mostly zeros. */
    if (!cuda_sixteen_bit(f, dev) || f->head_dim_v <= 256 || group_rows < MIN_WGMMA_ROWS)
        return 0;
    fj__variant t = *v;
    t.path = FJ__PATH_WGMMA;
    t.tile_m = 64;
    t.head_dim_pad = (int32_t)fj__round_up(f->head_dim, 64);
    t.head_dim_v_pad = (int32_t)fj__round_up(f->head_dim_v, 128);
    t.v_in_k = f->v_in_k && t.head_dim_v_pad <= t.head_dim_pad;
    t.stages = 2;
    t.ctas_per_sm = 1;
    t.bulk = 1; /* where the tensors allow (fj__plan_decode: tensor_copies_fit) */
    fj__variant seesaw = t;
    fj__decode_make_seesaw(&seesaw);
    const int64_t blocks = unsplit_blocks(f, group_rows, t.tile_m);
    if (t.v_in_k && t.head_dim_v_pad == 512 && group_rows >= SEESAW_MIN_ROWS &&
        blocks * SEESAW_MIN_FILL >= fj__compute_units(dev) && tensor_copies_fit(f, &seesaw) &&
        fj__variant_fits(&seesaw, dev)) {
        *v = seesaw;
        return 1;
    }
    t.warps = 12;
    t.threads = 384;
    /* (multicast=1, a cluster pair sharing the copies, is opt-in: measured slower,
    ** bench/RESULTS.md) */
    for (t.tile_n = 64; t.tile_n >= 32; t.tile_n /= 2)
        if (fj__variant_fits(&t, dev)) {
            *v = t;
            return 1;
        }
    return 0;
}

/* On CUDA, the vector kernel (keys as vectors straight into registers), up to 8 packed rows per
** block (each lane keeps a slice of every row's query and output); also the kernel of an FP8
** cache read by 16-bit queries, whose bytes it converts in registers. Returns 1 and fills *v
** when it serves f on dev. */
static int choose_vector(const fj__features *f, const fj_device_info *dev, int64_t group_rows,
                         fj__variant *v)
{
    const int fp8_rows = cuda_fp8_cache(f, dev);
    if (!cuda_sixteen_bit(f, dev) && !fp8_rows)
        return 0;
    fj__variant t = *v;
    t.path = FJ__PATH_VECTOR;
    t.head_dim_pad = (int32_t)f->head_dim; /* multiples of 8: rows_16b */
    t.head_dim_v_pad = (int32_t)f->head_dim_v;
    t.tile_m = 1;
    while (t.tile_m < group_rows && t.tile_m < 8)
        t.tile_m *= 2;
    /* Keys per group and chunk, and blocks per SM: the best of an A/B on the H200
    ** (bench/RESULTS.md); fewer where more rows or page arithmetic take registers. */
    t.stages = t.tile_m > 4 || f->paged ? 2 : 3;
    t.ctas_per_sm = t.tile_m > 4 || f->paged ? 0 : 3;
    /* An FP8 cache's vectors are half as wide: more keys a chunk keep more bytes in flight
    ** (twice the keys: +4-7 % on the H100, bench/RESULTS.md), as far as NVRTC builds them
    ** without spills (one fewer paged: the rows within pages). Up to 4 rows three blocks an
    ** SM, paged too (+11-15 % there on the H100). */
    if (fp8_rows) {
        t.ctas_per_sm = t.tile_m > 4 ? 0 : 3;
        t.stages = (t.tile_m > 4 ? 4 : 5) - (f->paged ? 1 : 0);
    }
    if (!fj__variant_fits(&t, dev))
        return 0;
    *v = t;
    return 1;
}

/* Whether config asks for the decode kernels ("path=decode"). */
static int decode_asked(const char *config)
{
    return config && strstr(config, "path=decode");
}

int fj__choose_decode(const fj__features *f, const fj_device_info *dev, const char *config,
                      fj__variant *v)
{
    memset(v, 0, sizeof *v);
    const int64_t group_rows = f->heads_q / f->heads_kv * f->seqlen_q;
    /* A paged cache has no other kernel: any number of query rows (chunked prefill). A dense
    ** one takes a prefill here only on the seesaw kernel, which reads v from k's tiles: MLA's
    ** latent cache, where the forward kernel's value slices recompute S for each half of O
    ** (bench/RESULTS.md). The kernel is the one that decodes; a row tile is 64 consecutive
    ** positions of one query head. */
    const int dense_prefill = f->seqlen_q > FJ__DECODE_MAX_SEQLEN_Q && !f->paged;
    /* "path=decode" also takes a dense prefill with its own v to the Hopper decode kernels
    ** (opt-in, for measuring them against the forward's value slices beyond 256 dims). */
    const int prefill_asked = dense_prefill && decode_asked(config);
    if ((dense_prefill && !f->v_in_k && !prefill_asked) || f->block_mask ||
        f->out_dtype != f->q_dtype || (f->kv_dtype != f->q_dtype && !fp8_cache(f)))
        return 0;
    fj__variant_from_features(v, FJ__FAMILY_DECODE, f, dev);
    v->threads = DECODE_THREADS;
    fj__variant_score_fields(v, f);
    /* Masks and score terms beyond the band (ALiBi, a bias, mask_mod, score_mod, a mask tensor,
    ** FlashMask ranges): the portable kernel's alone. */
    const int terms = v->alibi || v->mask_mod || v->score_mod || v->bias || v->mask_tensor ||
                      v->mask_ranges;
    v->write_lse = f->lse;
    v->varlen = f->varlen;
    v->paged = f->paged;
    /* A chunk of many rows (chunked prefill against a paged cache) under a band: a row tile's
    ** own band leaves out keys the sequence's would read (decode's few rows: the same band). */
    v->row_band = v->local_mask && f->seqlen_q > FJ__DECODE_MAX_SEQLEN_Q;
    const int vector_asked = config && strstr(config, "path=vec");
    /* warps=4 asks for the mma kernel where a wgmma kernel (8 or 12) would serve */
    const char *warps = fj__config_field(config, "warps");
    const int mma_asked = warps && atoi(warps) == 4;
    const int wgmma = !terms && !vector_asked && !mma_asked && choose_wgmma(f, dev, group_rows, v);
    if (dense_prefill) /* the seesaw kernel or none (asked: either wgmma kernel) */
        return wgmma && (fj__decode_seesaw(v) || prefill_asked);
    if (wgmma || (!terms && ((!vector_asked && choose_mma(f, dev, group_rows, v)) ||
                             choose_vector(f, dev, group_rows, v))))
        return 1;
    /* Every packed row of a kv head in one work-group where they fit (up to 64), 32-key tiles;
    ** smaller where shared memory runs out (large head dims). */
    v->tile_m = 1;
    while (v->tile_m < group_rows && v->tile_m < MAX_ROWS)
        v->tile_m *= 2;
    v->tile_n = 32;
    while (!fj__variant_fits(v, dev) && v->tile_m > 1)
        v->tile_m /= 2;
    while (!fj__variant_fits(v, dev) && v->tile_n > 8)
        v->tile_n /= 2;
    return fj__variant_fits(v, dev);
}

int fj__decode_apply_config(fj__variant *v, const char *config, const fj_device_info *dev)
{
    fj__variant t = *v;
    if (v->path == FJ__PATH_SIMT || fj__apply_config(&t, config, NULL) != 0)
        return 0;
    t.tile_m = v->tile_m;
    if (t.path == FJ__PATH_WGMMA) {
        /* warps 8 or 12: the seesaw kernel or the other. Options only the other takes
        ** (bulk=0, multicast, overlap, other tiles) move a planned seesaw kernel to it. */
        t.threads = 32 * t.warps;
        /* Asked onto the seesaw kernel from the other: its shape, then the options asked. */
        if (fj__decode_seesaw(&t) && !fj__decode_seesaw(v)) {
            fj__decode_make_seesaw(&t);
            fj__apply_config(&t, config, NULL);
            t.tile_m = v->tile_m;
        }
        if (fj__decode_seesaw(&t) && !fj__config_field(config, "warps") &&
            !fj__variant_fits(&t, dev)) {
            t.warps = 12;
            t.threads = 384;
        }
    }
    /* A ring deeper than bulk copies sustain, asked without bulk=1 (a tuning record or config
    ** from before bulk copies): by cp.async, with which such rings were measured. */
    if (fj__decode_too_many_copies(&t) && !strstr(config, "bulk="))
        t.bulk = 0;
    if (t.swizzle && !fj__decode_swizzle_fits(&t))
        t.swizzle = 0; /* (asked of every decode: where the rows are copied otherwise, none) */
    if (t.path == FJ__PATH_MMA && !strstr(config, "ctas_per_sm="))
        fj__decode_mma_residency(&t, dev);
    if (!fj__variant_fits(&t, dev))
        return 0;
    *v = t;
    return 1;
}

int fj__prefer_decode(const fj__features *f, const fj_device_info *dev, const char *config,
                      const fj__variant *fwd, fj__variant *v)
{
    const int asked = decode_asked(config);
    const int forward_asked = config && (strstr(config, "path=mma") || strstr(config, "path=wgmma") ||
                                         strstr(config, "path=simt"));
    if (!fj__choose_decode(f, dev, config, v))
        return 0;
    if (config)
        fj__decode_apply_config(v, config, dev);
    /* A paged cache: chunks of prefill (more rows than decode takes) on Hopper's forward where
    ** it reads the pages (fwd->paged; 2.3-6x the decode kernels at 2048 rows: bench/RESULTS.md),
    ** decode here unless "path=wgmma" asks for the forward. Packed queries of mostly decode
    ** rows (few_rows) stay here whatever their longest: the forward would give each sequence a
    ** whole row tile a head, its keys read and multiplied for one row, where the decode
    ** kernels pack a kv head's rows and split the keys. The seesaw kernel keeps MLA's chunks
    ** (the forward does not read their pages today, and computes S twice where it would). */
    const int chunks = f->seqlen_q > FJ__DECODE_MAX_SEQLEN_Q && !f->few_rows &&
                       !fj__decode_seesaw(v);
    if (f->paged)
        return asked || !(fwd->paged && (forward_asked || chunks));
    return asked || fwd->path == FJ__PATH_SIMT ||
           (v->path != FJ__PATH_SIMT && !forward_asked);
}

/* The fewest keys of an automatic split of f: MIN_SPLIT_BYTES of a kv head's keys and values
** (256 keys at d 128; 128 at d 256; 113 for MLA's 576-dim rows, v read from k), within
** [MIN_SPLIT_KEYS, MAX_MIN_SPLIT_KEYS]: wide rows split finer, so one sequence fills more of the
** device. */
static int64_t min_split_keys(const fj__features *f)
{
    const int64_t per_key = (int64_t)fj_dtype_size((fj_dtype)f->kv_dtype) *
                            (f->head_dim + (f->v_in_k ? 0 : f->head_dim_v));
    const int64_t keys = per_key > 0 ? MIN_SPLIT_BYTES / per_key : MAX_MIN_SPLIT_KEYS;
    return keys < MIN_SPLIT_KEYS ? MIN_SPLIT_KEYS : keys > MAX_MIN_SPLIT_KEYS ? MAX_MIN_SPLIT_KEYS : keys;
}

/* The number of splits of f's keys (rounded to `grain` keys each): the caller's, or enough
** work-groups for every compute unit without splits of fewer than min_split_keys (packed
** sequences counted at the most keys). Where `slots` blocks run at once across the device (0:
** unknown), the automatic count is the one of least modelled time: waves of blocks times the
** keys of a block (plus SPLIT_OVERHEAD_KEYS for its start and end), fewer splits on ties; so a
** last wave is never a sliver. */
#define SPLIT_OVERHEAD_KEYS 128
static int32_t splits_of(const fj__features *f, const fj_device_info *dev, int64_t blocks,
                         int32_t grain, int64_t slots)
{
    const int64_t tiles = fj__div_up(f->seqlen_k, grain);
    const int64_t most = tiles < FJ__DECODE_MAX_SPLITS ? tiles : FJ__DECODE_MAX_SPLITS;
    const int64_t longest = fj__div_up(f->seqlen_k, min_split_keys(f)); /* automatic splits */
    int64_t want = f->num_splits;
    /* A prefill's rows (more than decode's) whose blocks fill the device once: no split. The
    ** model below weighs only the waves; each split adds a state of dv floats a row, written
    ** and read again by the merge (a GiB at MLA's b 2 x 8k x 16 heads), which many rows make
    ** dear. (Measured with this rule only: MLA's prefill, bench/RESULTS.md.) */
    if (want == 0 && f->seqlen_q > FJ__DECODE_MAX_SEQLEN_Q && slots > 0 && blocks >= slots)
        want = 1;
    else if (want == 0 && slots > 0) {
        int64_t best_cost = INT64_MAX;
        for (int64_t s = 1; s <= (most < longest ? most : longest); s++) {
            const int64_t keys = fj__round_up(fj__div_up(f->seqlen_k, s), grain);
            const int64_t real = fj__div_up(f->seqlen_k, keys);
            const int64_t cost = fj__div_up(blocks * real, slots) * (keys + SPLIT_OVERHEAD_KEYS);
            if (cost < best_cost) {
                best_cost = cost;
                want = s;
            }
        }
    } else if (want == 0) {
        const int64_t units = fj__compute_units(dev);
        want = fj__div_up(BLOCKS_PER_UNIT * units, blocks);
        if (want > longest)
            want = longest;
    }
    if (want > most)
        want = most;
    return want < 1 ? 1 : (int32_t)want;
}

fj_status fj__plan_decode(const fj__features *f, const fj_device_info *dev, const fj__variant *v,
                          fj__plan *plan, fj__err *err)
{
    memset(plan, 0, sizeof *plan);
    plan->kind = FJ__PLAN_FORWARD;
    plan->fwd.classes = plan->fwd.counter = -1;
    plan->decode.ws_o = plan->decode.ws_l = plan->decode.arrivals = -1;
    const int64_t group_rows = f->heads_q / f->heads_kv * f->seqlen_q;
    const int64_t row_tiles = fj__div_up(group_rows, v->tile_m);
    const int64_t blocks = f->batch * f->heads_kv * row_tiles;
    if (f->heads_kv * row_tiles > INT32_MAX)
        return fj__fail(err, FJ_ERR_UNSUPPORTED,
                        "%lld kv heads x %lld row tiles: the decode grid allows %d",
                        (long long)f->heads_kv, (long long)row_tiles, INT32_MAX);
    const int32_t grain = v->tile_n > 0 ? v->tile_n : 32; /* keys a split is rounded to */
    /* The tensor-core kernel's blocks an SM holds are its ctas_per_sm (its shared memory's). */
    const int64_t slots = v->path == FJ__PATH_MMA || v->path == FJ__PATH_WGMMA
                              ? (int64_t)v->ctas_per_sm * dev->compute_units
                              : 0;
    int32_t splits = splits_of(f, dev, blocks, grain, slots);
    const int32_t keys = fj__round_up(fj__div_up(f->seqlen_k, splits), grain);
    splits = (int32_t)fj__div_up(f->seqlen_k, keys);
    plan->decode.splits = splits;
    plan->decode.keys_per_split = keys;
    plan->decode.row_tiles = (int32_t)row_tiles;
    const uint64_t rows = (uint64_t)(f->batch * f->seqlen_q * f->heads_q);
    if (splits > 1) {
        plan->decode.ws_o = fj__plan_add_workspace(
            plan, (size_t)splits * rows * (size_t)f->head_dim_v * sizeof(float));
        plan->decode.ws_l = fj__plan_add_workspace(plan, (size_t)splits * rows * sizeof(float));
    }
    fj__step *s = fj__plan_add_step(plan, FJ__STEP_KERNEL);
    s->variant = *v;
    s->variant.partial = splits > 1;
    s->variant.merge_last = v->merge_last && splits > 1 && v->path == FJ__PATH_MMA &&
                            v->backend == FJ_BACKEND_CUDA;
    if (v->path == FJ__PATH_WGMMA) {
        s->variant.bulk = v->bulk && tensor_copies_fit(f, v);
        /* The seesaw kernel reads k only by tensor maps. Where they cannot (warps=8 from a
        ** config or a tuning record on packed sequences or pages of part tiles), the other
        ** kernel, by its threads' copies: its two slots of 64-key tiles fit wherever the
        ** seesaw kernel's did (MLA's 576 / 512: 226 KiB). */
        if (fj__decode_seesaw(&s->variant) && !s->variant.bulk) {
            s->variant.warps = 12;
            s->variant.threads = 384;
        }
        /* (asked for) a kv head's row tiles in cluster pairs, blockIdx.x 2j and 2j + 1, over
        ** the keys of both (not packed sequences, which take no bulk copies: a tile past its
        ** sequence's rows reads no keys) */
        s->variant.multicast = v->multicast && s->variant.bulk && row_tiles % 2 == 0;
    }
    /* The mma kernel's tensor loader where tensor maps cannot copy the tiles (a config's or a
    ** tuning record's swizzle=1 on other pages): row copies. */
    if (v->path == FJ__PATH_MMA && v->bulk && v->swizzle && !tensor_copies_fit(f, v))
        s->variant.swizzle = 0;
    if (f->paged && !strcmp(fj__variant_decode_loader(&s->variant), "tensor"))
        s->variant.page_rows = (uint8_t)copy_rows(f, &s->variant);
    s->shared_bytes = fj__variant_dynamic_shared_bytes(&s->variant);
    s->block[0] = (uint32_t)s->variant.threads;
    /* The kv heads (and row tiles) fastest: the blocks running together read the same key
    ** rows of every head, so memory pages are read whole. */
    s->grid[0] = (uint32_t)(f->heads_kv * row_tiles);
    s->grid[1] = (uint32_t)splits;
    s->grid[2] = (uint32_t)f->batch;
    plan->main_step = 0;
    if (s->variant.merge_last) /* an arrival count per block of a split */
        plan->decode.arrivals =
            fj__plan_add_counters(plan, (size_t)(f->batch * s->grid[0]) * sizeof(int32_t));
    if (splits == 1 || s->variant.merge_last)
        return FJ_OK;
    const fj_status st = fj__merge_rows_fit(rows, err);
    if (st != FJ_OK)
        return st;
    fj__step *m = fj__plan_add_strided_merge_step(plan, v->backend, splits, v->out_dtype,
                                                  v->write_lse, rows, f->head_dim_v);
    /* On Hopper the merge launches while the decode kernel's last blocks run, and waits for
    ** their states in the kernel (attn_merge.lua): its launch latency leaves the call's time. */
    m->overlap_previous = v->backend == FJ_BACKEND_CUDA && fj__sm_version(dev) >= 90;
    m->variant.varlen = f->varlen ? 1 : 0; /* sequence b's states at batch b; out packed */
    return FJ_OK;
}

/* Split 0's state in the workspace (see the layout above). */
static void partial_slot(const fj__plan *plan, const fj__problem *p, void *const *ws,
                         fj__merge_slot *S)
{
    fj__merge_contiguous_slot(ws[plan->decode.ws_o], ws[plan->decode.ws_l], p->seqlen_q,
                              p->heads_q, p->head_dim_v, S);
}

/* The tensor maps of K and V (the wgmma kernel's bulk copies, the mma kernel's tensor loader;
** zeros without): boxes of a copy's rows (a tile's, or page_rows) by 64 columns, a paged
** cache's pages as its batches. */
static fj_status fill_decode_maps(const fj__variant *v, const fj__problem *p, fj__tmap_fn tmap,
                                  void *ud, fj__decode_tma_params *T)
{
    if (!v->bulk)
        return FJ_OK;
    const uint32_t rows = (uint32_t)(v->page_rows ? v->page_rows : v->tile_n);
    fj__tensor_map_desc d;
    fj__tensor_map_of(p->k, rows, &d, &T->perm_k);
    fj_status st = tmap(ud, FJ__MAP_DECODE_K, &d, &T->tm_k);
    if (st == FJ_OK && !v->v_in_k) {
        fj__tensor_map_of(p->v, rows, &d, &T->perm_v);
        st = tmap(ud, FJ__MAP_DECODE_V, &d, &T->tm_v);
    }
    return st;
}

fj_status fj__decode_fill(const fj__plan *plan, int i, const fj__problem *p, void *const *ws,
                          fj__tmap_fn tmap, void *tmap_ud, void *params)
{
    const int64_t rows = p->batch * p->seqlen_q * p->heads_q;
    if (plan->steps[i].variant.family == FJ__FAMILY_MERGE) {
        fj__merge_params *M = params;
        partial_slot(plan, p, ws, &M->in0);
        M->dst.o = p->out->data;
        M->dst.o_sb = p->strides[FJ__T_OUT][0];
        M->dst.o_ss = p->strides[FJ__T_OUT][1];
        M->dst.o_sh = p->strides[FJ__T_OUT][2];
        if (p->lse) {
            M->dst.l = p->lse->data;
            M->dst.l_sb = p->lse_stride[0];
            M->dst.l_sh = p->lse_stride[1];
            M->dst.l_ss = p->lse_stride[2];
        }
        M->states = plan->decode.splits;
        M->state_so = rows * p->head_dim_v;
        M->state_sl = rows;
        M->pairs = rows;
        M->seqlen = (int32_t)p->seqlen_q;
        M->heads = (int32_t)p->heads_q;
        M->head_dim_v = (int32_t)p->head_dim_v;
        M->state_teams = fj__merge_state_teams(plan->decode.splits);
        if (p->cu_seqlens_q) {
            M->cu_seqlens_q = p->cu_seqlens_q->data;
            M->total_q = (int32_t)p->q->shape[0];
        }
        return FJ_OK;
    }
    const fj__variant *v = &plan->steps[i].variant;
    fj__decode_tma_params *T =
        fj__variant_layout(v) == &fj__decode_tma_params_layout ? params : NULL;
    fj__decode_params *D = T ? &T->dec : params;
    fj__fill_fwd_params(plan, p, ws, &D->fwd);
    if (plan->decode.splits > 1) {
        partial_slot(plan, p, ws, &D->part);
        D->part_so = rows * p->head_dim_v;
        D->part_sl = rows;
    }
    D->keys_per_split = plan->decode.keys_per_split;
    D->row_tiles = plan->decode.row_tiles;
    D->arrivals = plan->decode.arrivals >= 0 ? ws[plan->decode.arrivals] : NULL;
    if (p->page_table)
        FJ__FILL_PAGE_FIELDS(D, p);
    return T ? fill_decode_maps(v, p, tmap, tmap_ud, T) : FJ_OK;
}
