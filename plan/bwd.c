/* The backward plan: D = rowsum(dout * out) into an f32 workspace (attn_bwd.lua), then dk and
** dv per key block, then dq per query block (on tensor cores where they serve: Hopper's
** attn_bwd_wgmma.cu.lua, else attn_bwd_mma.cu.lua; else attn_bwd.lua), then the bias's
** gradient if asked for; and how each stage's block is filled. On tensor cores dq is not a
** stage of its own (five products where a stage of its own makes seven): the dk/dv blocks add
** their share of it into a zeroed f32 workspace, and a last stage casts the sum. They add by
** atomics (on Hopper by bulk reductions), or, deterministic on Hopper, into slices of the sum
** each added in one order (dq_slices); deterministic elsewhere dq is a stage of its own. Element
** masks are classified by blocks first (the forward's classifier). */
#include <string.h>

#include "expr.h"
#include "plan.h"

#define TILE 32 /* query rows and keys per work-group, halved where local memory runs out */

/* Whether the tensor-core stages serve f on dev: CUDA sm_80+, one 16-bit element type in rows
** of 16-byte chunks, head dims to 256 (masks, block classes, score terms and packed sequences
** are the kernels' own). The bias's gradient is a stage of its own after them in any plan
** (from q, k, v, dout, lse and stage 1's D alone): attn_bwd_dbias_mma.cu.lua where these serve
** (packed sequences with a bias do not), else attn_bwd.lua's dbias. */
static int mma_serves(const fj__features *f, const fj_device_info *dev)
{
    const int sixteen_bit = (f->q_dtype == FJ_DTYPE_F16 || f->q_dtype == FJ_DTYPE_BF16) &&
                            f->kv_dtype == f->q_dtype && f->out_dtype == f->q_dtype;
    /* (variable lengths with a bias, a mask, ranges or block classes: the SIMT kernels, as the
    ** forward's) */
    const int varlen_tensors =
        f->varlen && (f->bias_dtype >= 0 || f->mask || f->ranges || f->block_mask);
    return dev->backend == FJ_BACKEND_CUDA && fj__sm_version(dev) >= 80 && sixteen_bit &&
           !varlen_tensors && f->head_dim <= 256 && f->head_dim_v <= 256 &&
           f->rows_16b[FJ__T_Q] && f->rows_16b[FJ__T_K] && f->rows_16b[FJ__T_V] &&
           f->rows_16b[FJ__T_OUT] && f->grads_16b;
}

/* Stage 2 on mma.sync with its warps in a grid (attn_bwd_mma_grid.cu.lua, d_split), where it
** serves f: d and dv to 128 in halves of 16 columns. Eight warps, 128 keys, and streamed tiles
** of 128 query rows at d and dv 64 with a plain element pass (H100, `path=mma`, 4k: 1.13-1.14x
** the old kernel against 0.96-0.97x with 64), else 64 (with a bias, score_mod or soft-capping
** as Hopper's; with masks or packed sequences 128 spilled 4-24 bytes on sm_90a). Not beyond
** d 64 with element masks, block classes or packed sequences (64 rows spilled 4-40 bytes on
** sm_90a), nor where 64 rows do not fit dev's shared memory (sm_80 at d 128, sm_86/89): 32-row
** tiles, which would, have not run on a GPU. 0 where it does not serve (v unchanged). */
static int bwd_mma_grid_variant(int deterministic, const fj_device_info *dev, fj__variant *v)
{
    fj__variant grid = *v;
    const int masked = fj__variant_element_masks(&grid) || grid.block_mask || grid.varlen;
    const int plain = !masked && !(grid.score_mod && grid.score_mod[0]) && !grid.softcap &&
                      !grid.bias;
    grid.head_dim_pad = fj__round_up(grid.head_dim_pad, 32);
    grid.head_dim_v_pad = fj__round_up(grid.head_dim_v_pad, 32);
    if (grid.head_dim_pad > 128 || grid.head_dim_v_pad > 128)
        return 0;
    grid.d_split = 1;
    grid.warps = 8;
    grid.threads = 32 * grid.warps;
    grid.tile_n = 16 * grid.warps;
    const int narrow = grid.head_dim_pad <= 64 && grid.head_dim_v_pad <= 64;
    if (!narrow && masked)
        return 0;
    grid.tile_m = narrow && plain ? 128 : 64;
    grid.grads = deterministic ? 3 : 7;
    if (fj__variant_shared_bytes(&grid) > dev->local_memory)
        grid.tile_m = 64; /* (fj__variant_fits: no fewer) */
    if (!fj__variant_fits(&grid, dev))
        return 0;
    *v = grid;
    return 1;
}

/* The tensor-core variant of stage 2 (dk, dv) or 3 (dq), where stage 2's warp grid does not
** serve (bwd_mma_grid_variant: head dims beyond 128): warps of 16 rows each (keys for stage
** 2, query rows for 3), four, or eight for stage 2 to d and dv 128 (a block of 128 keys: each
** streamed tile of Q and dO, and each atomic addition to dQ, serves twice the keys; H200, 4k:
** 1.09x at d 64 and 1.16x at d 128 over four), and 64-deep streamed tiles, 32 where the
** accumulators (d, dv above 64 for stage 2, above 128 for stage 3) leave fewer registers for
** the streamed products (at d 128 stage 2 would be 1.13x faster with 64, but spills). Stage 2
** writes dK and dV in one launch where both accumulators fit a thread (d + dv to 256), else
** dK and then dV in two (grads: see fj__variant); unless `deterministic`, dK's launch also adds
** dQ into the workspace. Until the block's shared memory fits the device (sm_86/89: 99 KiB),
** the streamed tiles halve (to 16), then the warps (and the block's own rows with them). */
static void bwd_mma_variant(int stage, int deterministic, const fj_device_info *dev, fj__variant *v)
{
    const int widest = v->head_dim_pad > v->head_dim_v_pad ? v->head_dim_pad : v->head_dim_v_pad;
    v->path = FJ__PATH_MMA;
    if (stage == 2 && bwd_mma_grid_variant(deterministic, dev, v))
        return;
    v->warps = stage == 2 && widest <= 128 ? 8 : 4;
    v->threads = 32 * v->warps;
    if (stage == 2) {
        v->tile_n = 16 * v->warps;
        v->tile_m = widest <= 64 ? 64 : 32;
        v->grads = (v->head_dim_pad + v->head_dim_v_pad <= 256 ? 3 : 1) | (deterministic ? 0 : 4);
    } else {
        v->tile_m = 16 * v->warps;
        v->tile_n = widest <= 128 ? 64 : 32;
    }
    int32_t *streamed = stage == 2 ? &v->tile_m : &v->tile_n;
    int32_t *owned = stage == 2 ? &v->tile_n : &v->tile_m;
    while (fj__variant_shared_bytes(v) > dev->local_memory) {
        if (*streamed > 16) {
            *streamed /= 2;
        } else if (v->warps > 1) {
            v->warps /= 2;
            v->threads = 32 * v->warps;
            *owned = 16 * v->warps;
        } else {
            break; /* fj__variant_fits refuses it: the SIMT stage runs */
        }
    }
}

/* Whether Hopper's kernels (attn_bwd_wgmma.cu.lua) may serve stages 2 and 3 of f on dev: sm_90a,
** where the mma.sync kernels serve (the head dims they take: fj__variant_fits); "path=mma" in
** the override keeps the mma.sync kernels (tests, comparisons). */
static int wgmma_serves(const fj__features *f, const fj_device_info *dev, const char *config)
{
    return mma_serves(f, dev) && fj__sm_version(dev) == 90 && strchr(dev->arch, 'a') != NULL &&
           !(config && strstr(config, "path=mma"));
}

/* The Hopper variant of stage 2 or 3: two warpgroups of 64 rows (keys; query rows), head dims
** padded to the swizzle's 64-column panels. Beyond d and dv 128 (whose dK and dV would not fit
** a warpgroup's registers) stage 2 is d_split: the warpgroups share 64 keys and split the
** columns, 64-row tiles. Otherwise stage 2 writes dK and dV in one launch (and adds dQ
** to the workspace: dq_slices) and streams query rows through a ring of two slots
** (three measured the same on the H200, d 64 and 128, 4k and 16k): 128 a tile at d and dv 64
** (H200, bf16: 1.12-1.22x over 64), but where the element pass needs more registers (score_mod,
** soft-capping, a mask tensor, mask ranges: S^T's and dP^T's accumulators, 64 floats each at
** 128 rows, beside dK's and dV's spill there), and 64 at d 128 (128 does not fit). Stage 3
** (deterministic, where stage 2 runs on mma.sync) streams 128 keys a tile at d 64 and 64
** beyond (H200, a plan of stages 2 and 3 against one of stage 2 at d 64: 1.09-1.14x the time
** with 128, 1.11-1.18x with 64; at d 128 the two within 1 %). */
static void bwd_wgmma_variant(int stage, int deterministic, fj__variant *v)
{
    const int score_mod = v->score_mod && v->score_mod[0];
    /* Stage 2: a producer warpgroup copies, and the two computing warpgroups take its registers
    ** (240 each; H200, bf16: 0.99-1.08x over both computing and refilling at d <= 128, most at
    ** 16k; 1.04-1.07x on the split kernel at d 256), except where the element pass reads a
    ** tensor of its own (a mask tensor, ranges, a bias) or a score_mod and its derivative:
    ** those spill at 240 (the offline spill test). */
    const int producer = stage == 2 && !v->mask_tensor && !v->mask_ranges && !v->bias && !score_mod;
    v->path = FJ__PATH_WGMMA;
    v->head_dim_pad = fj__round_up(v->head_dim_pad, 64);
    v->head_dim_v_pad = fj__round_up(v->head_dim_v_pad, 64);
    v->warps = 8;
    v->threads = 32 * v->warps;
    if (stage == 2 && (v->head_dim_pad > 128 || v->head_dim_v_pad > 128)) {
        /* d or dv beyond 128: attn_bwd_wgmma_split.cu.lua, both head dims padded to halves of
        ** whole panels */
        v->d_split = 1;
        v->head_dim_pad = fj__round_up(v->head_dim_pad, 128);
        v->head_dim_v_pad = fj__round_up(v->head_dim_v_pad, 128);
        v->tile_m = v->tile_n = 64;
        v->producer = producer;
        v->warps += 4 * v->producer;
        v->threads = 32 * v->warps;
        v->stages = 2;
        v->grads = 7;
    } else if (stage == 2) {
        /* 128 streamed rows at d 64 only for light element passes: with a bias (16-bit or f32)
        ** the dk/dv kernel spilled 108-132 bytes there, and 64 rows ran 1.07-1.12x as fast
        ** (H100, b 4 h 16 s 4k, causal and not; bench/RESULTS.md). */
        const int light_elements =
            !score_mod && !v->softcap && !v->mask_tensor && !v->mask_ranges && !v->bias;
        v->tile_n = 16 * v->warps;
        v->producer = producer;
        /* The element pass split around the products (where the kernel can: no soft-capping,
        ** no score_mod): at d 128 1.01-1.03x the fused pass; at d 64 (128-row tiles) 0.98-0.99x
        ** without a producer and 0.90-0.94x with one (H200). */
        v->overlap = v->head_dim_pad >= 128;
        v->warps += 4 * v->producer;
        v->threads = 32 * v->warps;
        /* A block an SM taking item after item (with the producer, which loads the next item's
        ** tiles while the last one ends). H200, bf16: deterministic plans, one launch in place
        ** of the runs (the same sums in the same order), 0.97-1.11x, median 1.03x; otherwise
        ** 1.04-1.09x at d 64 where every key block has the same work, 0.98-1.01x at d 128 and
        ** 0.69-0.99x causal, so only there. Not for packed sequences or soft-capping (their
        ** items spill 4-16 bytes at d 64 and 128), nor for a mask_mod (4-12 bytes at d 64,
        ** deterministic: the expression's terms beside the items' loop). */
        const int uniform = !v->local_mask && !v->block_mask && !v->mask_mod;
        v->persistent = v->producer && !v->varlen && !v->softcap &&
                        ((deterministic && !v->mask_mod) ||
                         (uniform && v->head_dim_pad <= 64 && v->head_dim_v_pad <= 64));
        /* Turns (dq_turns: the key blocks add each query tile's dQ into the one sum in
        ** key-block order, no slices) only where asked for ("dq_turns=1"). H200, bf16,
        ** deterministic, turns over slices: d 128 16k 1.09-1.14x (causal 1.16-1.19x), but d 64
        ** and 1k 0.84-0.93x, and the turns' keeper spills (bench/RESULTS.md). */
        v->dq_turns = 0;
        v->tile_m = v->head_dim_pad <= 64 && v->head_dim_v_pad <= 64 && light_elements ? 128 : 64;
        v->stages = 2;
        v->grads = 7;
    } else {
        v->tile_m = 16 * v->warps;
        v->tile_n = v->head_dim_pad <= 64 ? 128 : 64;
    }
}

/* v (stage 2 or 3) with config's tile fields applied, where that fits dev; else v unchanged.
** On tensor cores a block owns 16 rows a warp (keys for stage 2, query rows for 3); on the SIMT
** kernels a work-item each (tile_n keys for stage 2, tile_m query rows for 3). */
static void apply_bwd_config(const char *config, const fj_device_info *dev, fj__variant *v)
{
    fj__variant o = *v;
    fj__err ignored;
    if (!config || fj__apply_config(&o, config, &ignored) != 0)
        return;
    if (o.path == FJ__PATH_SIMT) {
        o.threads = o.stage == 2 ? o.tile_n : o.tile_m;
    } else {
        /* `warps` counts a producer's. A config that names the producer but not the warps keeps
        ** the computing warps; one that names the warps but not the producer keeps it only
        ** where they hold it (12: two computing warpgroups); without it, no persistent grid
        ** unless named (which then does not fit). */
        const int names_warps = fj__config_field(config, "warps") != NULL;
        const int names_producer = fj__config_field(config, "producer") != NULL;
        if (o.stage != 2 || o.path != FJ__PATH_WGMMA)
            o.producer = 0; /* (a config is applied to both stages: fj__variant_config) */
        else if (names_producer && !names_warps)
            o.warps += 4 * (o.producer - v->producer);
        else if (names_warps && !names_producer && o.warps != 12)
            o.producer = 0;
        if (!o.producer && !fj__config_field(config, "persistent"))
            o.persistent = 0; /* a persistent grid needs the producer */
        if (!o.persistent && !fj__config_field(config, "dq_turns"))
            o.dq_turns = 0; /* and the turns a persistent grid */
        o.threads = 32 * o.warps;
        if (o.stage == 2) { /* d_split on WGMMA: two warpgroups share 64 keys */
            o.tile_n = o.d_split && o.path == FJ__PATH_WGMMA ? 64 : 16 * (o.warps - 4 * o.producer);
        } else {
            o.tile_m = 16 * o.warps;
            o.d_split = 0; /* (stage 2's alone) */
        }
    }
    /* Tiles that mma.sync's warp grid cannot take (d_split not named) go to its kernel of a
    ** warp's own keys. */
    if (o.path == FJ__PATH_MMA && o.d_split && !fj__config_field(config, "d_split") &&
        !fj__variant_fits(&o, dev))
        o.d_split = 0;
    if (fj__variant_fits(&o, dev))
        *v = o;
}

/* The variant of stage `stage` for f on dev: what decides the scores, as the forward's. */
static void bwd_variant(const fj__features *f, const fj_device_info *dev, const char *config,
                        int stage, fj__variant *v)
{
    fj__variant_from_features(v, FJ__FAMILY_BWD, f, dev);
    v->stage = (uint8_t)stage;
    v->varlen = f->varlen;
    if (stage == 5) { /* a cast: 32 rows a work-group; soft-capping decides its factor */
        v->softcap = f->softcap;
        v->tile_m = 32;
        v->tile_n = 1;
        v->threads = 128;
        return;
    }
    if (stage == 1) { /* D: 8 rows a work-group, 16 work-items each (coalesced loads) */
        v->tile_m = 8;
        v->threads = 128;
        return;
    }
    if (stage > 1) { /* what the scores depend on, and score_mod's derivative */
        fj__variant_score_fields(v, f);
        v->score_mod_grad = f->score_mod_grad;
    }
    /* Hopper's dk/dv stage copies q, k, v and dout by TMA; stage 3 by cp.async. */
    const int tma = f->tma[FJ__T_Q] && f->tma[FJ__T_K] && f->tma[FJ__T_V] && f->dout_tma;
    if ((stage == 3 || (stage == 2 && tma)) && wgmma_serves(f, dev, config)) {
        fj__variant hopper = *v;
        bwd_wgmma_variant(stage, f->deterministic, &hopper);
        if (fj__variant_fits(&hopper, dev)) {
            apply_bwd_config(config, dev, &hopper);
            *v = hopper;
            return;
        }
    }
    if ((stage == 2 || stage == 3) && mma_serves(f, dev)) {
        fj__variant mma = *v;
        bwd_mma_variant(stage, f->deterministic, dev, &mma);
        if (fj__variant_fits(&mma, dev)) {
            apply_bwd_config(config, dev, &mma);
            *v = mma;
            return;
        }
    }
    if (stage == 4 && mma_serves(f, dev)) {
        /* Tiles of dbias on tensor cores (attn_bwd_dbias_mma.cu.lua): 64 keys on four warps by
        ** 64 query rows, fewer rows until the tiles fit the device's shared memory. */
        fj__variant mma = *v;
        mma.path = FJ__PATH_MMA;
        mma.warps = 4;
        mma.threads = 32 * mma.warps;
        mma.tile_n = 16 * mma.warps;
        for (mma.tile_m = 64; mma.tile_m > 16 && !fj__variant_fits(&mma, dev); mma.tile_m /= 2)
            ;
        if (fj__variant_fits(&mma, dev)) {
            *v = mma;
            return;
        }
    }
    if (stage == 4) {
        /* Tiles of dbias: 64 rows x 32 keys, 4 x 4 elements a work-item. (64 x 64 on 256
        ** work-items: ptxas kept them to 128 registers, and a score_mod's derivative spilled
        ** 8 bytes at d 64; the same 128 registers without spills on 128 work-items.) */
        v->tile_m = 64;
        v->tile_n = 32;
        v->threads = v->tile_m * v->tile_n / 16;
        return;
    }
    v->tile_m = v->tile_n = TILE;
    v->threads = stage == 2 ? v->tile_n : v->tile_m;
    while (!fj__variant_fits(v, dev) && (stage == 2 ? v->tile_m : v->tile_n) > 1) {
        if (stage == 2)
            v->tile_m /= 2;
        else
            v->tile_n /= 2;
    }
    if (stage == 2 || stage == 3)
        apply_bwd_config(config, dev, v);
}

/* Stage 4's grid (attn_bwd.lua's dbias, step s): x the (batch, head) pairs of dbias times its
** key tiles, y its row tiles. Where the rows are summed, y is the shares of the row tiles that
** fill the device twice over with x; with more than one, stage 6 adds their sums (from a
** workspace) in order. 0 where a launch cannot hold the grid. */
static int plan_dbias(const fj__features *f, const fj_device_info *dev, fj__plan *plan,
                      fj__step *s)
{
    const int64_t *e = f->dbias_extent;
    const fj__variant *v = &s->variant;
    const int64_t x = e[0] * e[1] * fj__div_up(f->seqlen_k, v->tile_n);
    int64_t y = fj__div_up(e[2] == 1 ? f->seqlen_q : e[2], v->tile_m);
    if (e[2] == 1) { /* no more shares than fill the device twice, nor than 64 */
        int64_t shares = fj__div_up(2 * (int64_t)fj__compute_units(dev), x);
        shares = shares < 64 ? shares : 64;
        y = y < shares ? y : shares;
    }
    if (x > INT32_MAX || y > 65535)
        return 0;
    s->grid[0] = (uint32_t)x;
    s->grid[1] = (uint32_t)y;
    s->grid[2] = 1;
    if (e[2] != 1 || y == 1)
        return 1;
    plan->bwd.dbias_splits = (int32_t)y;
    const int64_t elements = e[0] * e[1] * f->seqlen_k;
    plan->bwd.dbias_part =
        fj__plan_add_workspace(plan, (size_t)(y * elements) * sizeof(float));
    fj__step *sum = fj__plan_add_step(plan, FJ__STEP_KERNEL);
    fj__variant_from_features(&sum->variant, FJ__FAMILY_BWD, f, dev);
    sum->variant.stage = 6;
    sum->variant.varlen = f->varlen;
    sum->variant.tile_m = sum->variant.tile_n = 1;
    sum->variant.threads = 128;
    sum->block[0] = (uint32_t)sum->variant.threads;
    sum->grid[0] = (uint32_t)fj__div_up(elements, sum->variant.threads);
    return elements <= (int64_t)sum->variant.threads * INT32_MAX;
}

/* The key blocks of one (batch, kv head): stage 2's blocks (or a persistent grid's items). */
static int64_t bwd_key_blocks(int64_t seqlen_k, const fj__variant *v)
{
    return fj__div_up(seqlen_k, v->tile_n);
}

/* The (batch, kv head) pairs of f: stage 2's units of work beside the key blocks. */
static int64_t bwd_pairs(const fj__features *f)
{
    return f->batch * f->heads_kv;
}

/* The blocks of a deterministic plan's persistent grid that take turns (dq_turns) for each
** (batch, kv head) of f: as many as fill the SMs once, each taking every one of them-th key
** block, in order (attn_bwd_hopper.lua's items); a turn waits only for the key block before it. */
static int32_t turn_blocks(const fj__features *f, const fj__variant *v, const fj_device_info *dev)
{
    const int64_t units = bwd_pairs(f), sms = fj__compute_units(dev);
    const int64_t key_blocks = bwd_key_blocks(f->seqlen_k, v);
    const int64_t blocks = units >= sms ? 1 : sms / units;
    return (int32_t)(blocks < key_blocks ? blocks : key_blocks);
}

/* The slices of dq's f32 sum for the dk/dv stage v of f on dev: one, added by atomics in any
** order, unless deterministic on Hopper. There the stage runs in turns (runs) of `slices` key
** blocks a (batch, kv head), key block r * slices + j of run r adding into slice j, so that each
** element of a slice takes one addition a run and the runs come in order; stage 5 adds the
** slices in order. The count (to MAX_DQ_SLICES) is the cheapest by a model counted in the time
** of one block (one key block of one (batch, kv head), from BLOCK_ROWS query rows): the runs'
** waves of blocks on the SMs, a launch between runs, and zeroing and reading each slice (as
** many floats as dq; the H200 streams a slice in about units / 150 blocks' time). Up to 16:
** with few units a run fills the SMs only with more than 8 slices (H200, d 256, b 1 x 8 heads
** at 16k: 8 slices, 64 blocks a run on 132 SMs, took 2.07-2.18x the default's time). */
#define MAX_DQ_SLICES 16
#define BLOCK_ROWS 120 /* query rows whose streaming takes as long as a launch between runs */
#define SLICE_BLOCKS 150.0
static int32_t dq_slices(const fj__features *f, const fj__variant *v, const fj_device_info *dev)
{
    if (!f->deterministic || v->path != FJ__PATH_WGMMA || v->dq_turns)
        return 1;
    const int64_t units = bwd_pairs(f), sms = fj__compute_units(dev);
    const int64_t key_blocks = bwd_key_blocks(f->seqlen_k, v);
    int32_t best = 1;
    double best_cost = 0;
    for (int32_t s = 1; s <= MAX_DQ_SLICES && s <= key_blocks; s++) {
        const int64_t runs = (key_blocks + s - 1) / s, last = key_blocks - (runs - 1) * s;
        const int64_t waves =
            (runs - 1) * ((units * s + sms - 1) / sms) + (units * last + sms - 1) / sms;
        const double cost = (double)waves + (double)runs * BLOCK_ROWS / (double)f->seqlen_q +
                            (double)s * (double)units / SLICE_BLOCKS;
        if (s == 1 || cost < best_cost) {
            best = s;
            best_cost = cost;
        }
    }
    return best;
}

fj_status fj__plan_backward(const fj__features *f, const fj_device_info *dev, const char *config,
                            fj__plan *plan, fj__err *err)
{
    memset(plan, 0, sizeof *plan);
    plan->kind = FJ__PLAN_BACKWARD;
    plan->fwd.classes = plan->fwd.counter = -1;
    if (f->score_mod && !f->score_mod_grad)
        return fj__fail(err, FJ_ERR_UNSUPPORTED,
                        "desc.score_mod: too long to differentiate (its derivative would exceed "
                        "%d characters)",
                        FJ__EXPR_MAX_GRAD_TEXT);
    const size_t rows = (size_t)(f->batch * f->heads_q * f->seqlen_q);
    plan->bwd.delta = fj__plan_add_workspace(plan, rows * sizeof(float));
    plan->bwd.lse2 = fj__plan_add_workspace(plan, rows * sizeof(float));
    plan->bwd.dq_acc = plan->bwd.dq_turns = plan->bwd.dbias_part = -1;
    plan->bwd.dbias_splits = 1;
    plan->bwd.dq_slices = 1;
    /* dq added in stage 2 (on tensor cores): its f32 sum is zeroed first, and stage 5 casts it
    ** where stage 3 would compute dq. */
    fj__variant dkdv;
    bwd_variant(f, dev, config, 2, &dkdv);
    if (dkdv.grads & 4) {
        plan->bwd.dq_slices = dq_slices(f, &dkdv, dev);
        plan->bwd.dq_slice = (int64_t)rows * dkdv.head_dim_pad;
        plan->bwd.dq_acc = fj__plan_add_workspace(
            plan, (size_t)plan->bwd.dq_slices * (size_t)plan->bwd.dq_slice * sizeof(float));
        fj__plan_add_step(plan, FJ__STEP_MEMSET)->workspace = plan->bwd.dq_acc;
        if (dkdv.dq_turns) { /* the turns taken, per (batch, head) and query tile of stage 2 */
            const size_t tiles = (size_t)fj__div_up(f->seqlen_q, dkdv.tile_m);
            plan->bwd.dq_turns = fj__plan_add_workspace(
                plan, (size_t)(f->batch * f->heads_q) * tiles * sizeof(int32_t));
            fj__plan_add_step(plan, FJ__STEP_MEMSET)->workspace = plan->bwd.dq_turns;
        }
    }
    /* Element masks on tensor cores: classified by 128 x 128 blocks first, as the forward's, so
    ** that the kernels skip empty tiles and read full ones without the masks (dense requests:
    ** the classifier takes dense shapes; where its grid cannot cover f, the masks are read
    ** everywhere). */
    fj__err unclassified;
    const int classes = dkdv.path != FJ__PATH_SIMT && !dkdv.block_mask && !dkdv.varlen &&
                        fj__variant_element_masks(&dkdv) &&
                        fj__plan_classes(f, &dkdv, plan, &unclassified) == FJ_OK;
    const int stages[] = {1, 2, plan->bwd.dq_acc >= 0 ? 5 : 3, 4};
    for (int i = 0; i < (f->dbias_extent[0] ? 4 : 3); i++) {
        const int stage = stages[i];
        fj__step *s = fj__plan_add_step(plan, FJ__STEP_KERNEL);
        if (stage == 2) {
            s->variant = dkdv;
        } else {
            bwd_variant(f, dev, config, stage, &s->variant);
            if (stage == 5) /* the f32 sum's rows are as wide as the dk/dv kernel pads them */
                s->variant.head_dim_pad = dkdv.head_dim_pad;
        }
        if (classes && s->variant.path != FJ__PATH_SIMT) {
            /* Tiles that do not divide the classes' blocks (an override's) read the masks
            ** everywhere instead. */
            fj__variant classed = s->variant;
            classed.block_mask = 1;
            if (fj__variant_fits(&classed, dev))
                s->variant = classed;
        }
        if (!fj__variant_fits(&s->variant, dev))
            return fj__fail(err, FJ_ERR_UNSUPPORTED,
                            "head dims %lld / %lld: the backward's tiles do not fit this device",
                            (long long)f->head_dim, (long long)f->head_dim_v);
        const fj__variant *v = &s->variant;
        s->block[0] = (uint32_t)v->threads;
        s->shared_bytes = fj__variant_dynamic_shared_bytes(v);
        if (stage == 4) {
            if (!plan_dbias(f, dev, plan, s))
                return fj__fail(err, FJ_ERR_UNSUPPORTED,
                                "desc.dbias of %lld x %lld x %lld x %lld elements: more tiles "
                                "than a launch's grid holds",
                                (long long)f->dbias_extent[0], (long long)f->dbias_extent[1],
                                (long long)f->dbias_extent[2], (long long)f->seqlen_k);
            continue;
        }
        /* Tiles of keys (stage 2), of query rows (1, 3, 5). */
        const int64_t n = stage == 2 ? f->seqlen_k : f->seqlen_q;
        const int32_t tile = stage == 2 ? v->tile_n : v->tile_m;
        s->grid[0] = (uint32_t)((n + tile - 1) / tile);
        s->grid[1] = (uint32_t)(stage == 2 ? f->heads_kv : f->heads_q);
        s->grid[2] = (uint32_t)f->batch;
        const int sliced = stage == 2 && f->deterministic && plan->bwd.dq_acc >= 0;
        if (sliced && v->persistent) {
            /* one launch: block x of each (batch, kv head) takes key blocks x, x + blocks, ...
            ** in order, into slice x, or in turns into the one sum (attn_bwd_hopper.lua's
            ** items) */
            s->grid[0] = (uint32_t)(v->dq_turns ? turn_blocks(f, v, dev) : plan->bwd.dq_slices);
        } else if (sliced) { /* runs of dq_slices key blocks */
            s->runs = (int32_t)((s->grid[0] + plan->bwd.dq_slices - 1) / plan->bwd.dq_slices);
            s->grid[0] = (uint32_t)plan->bwd.dq_slices;
            /* a run launches while the one before it ends, and waits for its sums (the
            ** kernel: attn_bwd_wgmma.cu.lua) */
            s->overlap_previous = 1;
        } else if (stage == 2 && v->persistent && !f->deterministic) {
            /* a block an SM, each taking every grid[0]-th item */
            const uint64_t items = (uint64_t)s->grid[0] * s->grid[1] * s->grid[2];
            const uint64_t sms = (uint64_t)fj__compute_units(dev);
            s->grid[0] = (uint32_t)(items < sms ? items : sms);
            s->grid[1] = s->grid[2] = 1;
        }
        if (stage == 2) {
            plan->main_step = plan->nsteps - 1; /* dk and dv: most of the work */
            if (v->path == FJ__PATH_MMA && !(v->grads & 2)) { /* dK here, dV apart */
                fj__step *dv = fj__plan_add_step(plan, FJ__STEP_KERNEL);
                *dv = *s;
                dv->variant.grads = 2;
                dv->shared_bytes = fj__variant_dynamic_shared_bytes(&dv->variant);
            }
        }
    }
    return FJ_OK;
}

/* The box of dQ's bulk tensor reductions into its f32 sum (attn_bwd_wgmma.cu.lua's add_dq_rows):
** a warp's 16 rows of a piece by 32 floats, the 128 bytes of the 128-byte swizzle's widest box. */
#define DQ_BOX_ROWS 16u
#define DQ_BOX_FLOATS 32u

/* The tensor maps of Hopper's dk/dv stage: q and dout in boxes of its streamed rows, k and v of
** the block's keys; with dQ (grads 4) the f32 sum, [slices, batch * heads_q, d_rows, head_dim_pad]
** (d_rows: seqlen_q, the longest sequence's when packed), where boxes that reach past d_rows are
** clipped. */
static fj_status fill_bwd_maps(const fj__plan *plan, const fj__variant *v, const fj__bwd_problem *p,
                               void *const *ws, fj__tmap_fn tmap, void *ud, fj__bwd_tma_params *T)
{
    const fj_tensor *t[4] = {p->f.q, p->f.k, p->f.v, p->dout};
    const uint32_t rows[4] = {(uint32_t)v->tile_m, (uint32_t)v->tile_n, (uint32_t)v->tile_n,
                              (uint32_t)v->tile_m};
    fj__tensor_map *maps[4] = {&T->tm_q, &T->tm_k, &T->tm_v, &T->tm_do};
    int32_t *perms[4] = {&T->perm_q, &T->perm_k, &T->perm_v, &T->perm_do};
    fj_status st = FJ_OK;
    for (int i = 0; i < 4 && st == FJ_OK; i++) {
        fj__tensor_map_desc d;
        fj__tensor_map_of(t[i], rows[i], &d, perms[i]);
        st = tmap(ud, FJ__MAP_BWD_Q + i, &d, maps[i]);
    }
    if (st == FJ_OK && (v->grads & 4) && plan->bwd.dq_acc >= 0) {
        const uint64_t row = 4u * (uint64_t)v->head_dim_pad;
        fj__tensor_map_desc d;
        memset(&d, 0, sizeof d);
        d.base = ws[plan->bwd.dq_acc];
        d.dtype = FJ_DTYPE_F32;
        d.dims[0] = (uint64_t)v->head_dim_pad;
        d.dims[1] = (uint64_t)p->f.seqlen_q;
        d.dims[2] = (uint64_t)(p->f.batch * p->f.heads_q);
        d.dims[3] = (uint64_t)plan->bwd.dq_slices;
        d.strides[0] = row;
        d.strides[1] = row * (uint64_t)p->f.seqlen_q;
        d.strides[2] = 4u * (uint64_t)plan->bwd.dq_slice;
        d.box[0] = DQ_BOX_FLOATS;
        d.box[1] = DQ_BOX_ROWS;
        d.box[2] = d.box[3] = 1;
        st = tmap(ud, FJ__MAP_BWD_DQ_ACC, &d, &T->tm_dq_acc);
    }
    return st;
}

fj_status fj__bwd_fill(const fj__plan *plan, int i, int run, const fj__bwd_problem *p,
                       void *const *ws, fj__tmap_fn tmap, void *tmap_ud, void *params)
{
    const fj__variant *v = &plan->steps[i].variant;
    const int maps = v->path == FJ__PATH_WGMMA && v->stage == 2;
    fj__bwd_params *B = maps ? &((fj__bwd_tma_params *)params)->bwd : params;
    fj__fill_fwd_params(plan, &p->f, ws, &B->fwd);
    B->dout = p->dout->data;
    B->dq = p->dq->data;
    B->dk = p->dk->data;
    B->dv = p->dv->data;
    B->delta = ws[plan->bwd.delta];
    B->lse2 = ws[plan->bwd.lse2];
    B->dq_acc = plan->bwd.dq_acc >= 0 ? ws[plan->bwd.dq_acc] : NULL;
    B->dq_slices = plan->bwd.dq_slices;
    B->dq_slice = plan->bwd.dq_slices > 1 ? plan->bwd.dq_slice : 0;
    B->key_block0 = run * (int32_t)plan->steps[i].grid[0];
    B->key_blocks = v->persistent ? (int32_t)bwd_key_blocks(p->f.seqlen_k, v) : 0;
    B->dq_ordered = v->persistent && p->f.deterministic && !v->dq_turns;
    B->dq_turns = plan->bwd.dq_turns >= 0 ? ws[plan->bwd.dq_turns] : NULL;
    int64_t *strides[4] = {&B->do_sb, &B->dq_sb, &B->dk_sb, &B->dv_sb};
    for (int t = 0; t < 4; t++)
        for (int a = 0; a < 3; a++)
            strides[t][a] = p->grad_strides[t][a];
    B->scale = p->f.scale;
    if (p->dbias) {
        B->dbias = p->dbias->data;
        B->dbias_sb = p->dbias->stride[0];
        B->dbias_sh = p->dbias->stride[1];
        B->dbias_ss = p->dbias->stride[2];
        B->dbias_batches = (int32_t)p->dbias_extent[0];
        B->dbias_heads = (int32_t)p->dbias_extent[1];
        B->dbias_rows = (int32_t)p->dbias_extent[2];
        B->dbias_splits = plan->bwd.dbias_splits;
        B->dbias_part = plan->bwd.dbias_part >= 0 ? ws[plan->bwd.dbias_part] : NULL;
    }
    return maps ? fill_bwd_maps(plan, v, p, ws, tmap, tmap_ud, params) : FJ_OK;
}
