% -- The backward's dk/dv stage on Hopper (sm_90a) for head dims beyond 128: the two warpgroups
% -- of a block share its 64 keys and split the columns of dK and dV between them (d_split), so
% -- that each holds 64 keys by d / 2 and dv / 2 accumulators (attn_bwd_wgmma.cu.lua gives each
% -- warpgroup 64 keys of its own by all of d and dv, which at d 256 would take 256 registers a
% -- thread for dK and dV alone).
% --
% -- A block owns BN = 64 keys of one (batch, kv head) and streams tiles of BM = 64 query rows
% -- of every query head of the group through attn_bwd_hopper.lua's ring: with `producer`, a
% -- warpgroup of its own fills it and gives its registers to the two computing warpgroups (240
% -- each; the plan chooses it where the d <= 128 kernel has one); without, the computing warps
% -- refill it as they free its slots. Per computing warpgroup wg and tile:
% --   S^T, dP^T of its QH = 32 queries from m0 + 32 wg    wgmma over d and dv, all 64 keys
% --   P^T, dS^T                                           attn_bwd_tc.lua's element pass
% --   P^T and dS^T (keys by queries) and dS (queries by keys) into shared memory, its half
% --   of their columns; then the two warpgroups meet (named barrier)
% --   dV[:, wg half] += P^T dO[:, wg half], dK[:, wg half] += dS^T Q[:, wg half]
% --                                                       wgmma, both operands from shared memory
% --   with dQ (grads 7): pieces wg, wg + 2, ... of dQ = dS K (64 rows by 64 columns each) into
% --   the f32 workspace by vector atomics (slice blockIdx.x of it, as attn_bwd_wgmma.cu.lua's:
% --   deterministic plans add each element of a slice once a run)
% -- and before the next tile's stores the two meet again (both read this tile's P^T and dS);
% -- those meetings are named barriers of the computing threads (COMPUTE_THREADS).
% -- Everything in shared memory is in 64-column panels with the 128-byte swizzle; d and dv are
% -- padded to multiples of 128 (halves of whole panels), at most 256.
% --
% -- Parameters: dtypes (one 16-bit type), head_dim_pad, head_dim_v_pad (128 or 256; the plan
% -- takes this kernel where one is 256), stage 2, d_split, warps (8, or 12 with producer),
% -- producer, consumer_regs and producer_regs, tile_m 64, tile_n 64,
% -- stages (the ring), grads (3, or 7 with dQ), local_mask, softcap, block_mask, varlen, the
% -- masks' and score terms' (attn_masks.lua), shared_bytes (the host's size), args
% -- (fj_bwd_tma_params).
% assert(stage == 2 and d_split, "attn_bwd_wgmma_split: the dk/dv stage, columns split")
% assert(warps == 8 + (producer and 4 or 0) and tile_m == 64 and tile_n == 64, "attn_bwd_wgmma_split: two computing warpgroups, 64 x 64 tiles")
% assert(persistent == 0, "attn_bwd_wgmma_split: one item a block")
% assert(stages >= 2 and stages <= 4, "attn_bwd_wgmma_split: a ring of 2 to 4 slots")
% assert(head_dim_pad % 128 == 0 and head_dim_v_pad % 128 == 0 and head_dim_pad <= 256 and head_dim_v_pad <= 256, "attn_bwd_wgmma_split: head dims padded to 128 or 256")
% assert(grads == 3 or grads == 7, "attn_bwd_wgmma_split: dK and dV, and dQ added into the workspace or not")
% local want_dq = grads >= 4
% local DH, DVH = head_dim_pad // 2, head_dim_v_pad // 2
% include("attn_bwd_hopper.lua")
% include("params.lua")
% params_struct(args)
% local family = bwd_family(args)
% assert(family ~= args, "attn_bwd_wgmma_split: fj_bwd_tma_params")
% -- The products' widths: a warpgroup's queries (32), its columns of dK and dV, dQ's pieces.
% bwd_hopper_prelude({ 32, DH, DVH, want_dq and 64 or nil })
constexpr int STAGES = ${stages}; /* ring slots of Q and dO tiles */
constexpr int QH = BM / 2;        /* a warpgroup's queries of a tile: S^T's columns */
constexpr int DH = DP / 2, DVH = DVP / 2; /* a warpgroup's columns of dK and dV */

/* ---- shared memory ------------------------------------------------------------------------- */
/* K [BN][DP], V [BN][DVP], the ring's slots of Q [BM][DP] and dO [BM][DVP], then P^T and dS^T
** [BN][BM] and with dQ dS [BM][BN] (swizzled 64-column panels, attn_bwd_hopper.lua), then the
** slots' lse (log2 units) and D, [BM] floats each, the mbarriers and the slots' counts of
** warps that freed them. Panels start 1024-byte aligned. */
constexpr int K_BYTES = BN * DP * 2, V_BYTES = BN * DVP * 2;
constexpr int Q_BYTES = BM * DP * 2, QG_BYTES = Q_BYTES + BM * DVP * 2;
constexpr int PT_BYTES = BN * BM * 2;
constexpr int RING_OFFSET = K_BYTES + V_BYTES, PT_OFFSET = RING_OFFSET + STAGES * QG_BYTES;
constexpr int LD_OFFSET = PT_OFFSET + ${want_dq and 3 or 2} * PT_BYTES;
constexpr int BAR_OFFSET = LD_OFFSET + STAGES * 8 * BM;
static_assert(BAR_OFFSET + BAR_BYTES + 1023 == ${shared_bytes}, "the host's shared-memory size");

/* The mbarriers by kind, 8 bytes each from BAR_OFFSET (attn_bwd_hopper.lua's ring). */
enum Bar : int {
    KV_FULL = 0,           /* K and V landed: bulk copies */
    FULL = 1,              /* slot s holds its tile and its rows' lse2 and D */
    EMPTY = FULL + STAGES, /* slot s is read: every thread's arrival (after its own reads) */
    BARS = EMPTY + STAGES
};
static_assert(BARS * 8 + STAGES * 4 <= BAR_BYTES, "the mbarriers' and the counts' bytes");
/* Named barriers of the computing threads: P^T, dS^T and dS are free to write (both
** warpgroups' products of the previous tile landed), and they are whole. */
enum Named : int { TILES_FREE = 1, TILES_WHOLE = 2 };

% bwd_hopper_tiles()
% if want_dq then
% bwd_hopper_dq_parts()
% end

/* ---- the products ---------------------------------------------------------------------------- */
/* S^T = K Q^T and dP^T = V dO^T of a warpgroup: the block's 64 keys by the QH queries whose rows
** start at q (Q) and g (dO) in the slot's tiles, issued together and waited for. */
__device__ __forceinline__ void scores_and_dp(float (*s)[4], float (*dp)[4], u32 sK, u32 sV, u32 q,
                                              u32 g)
{
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < DP / 16; kk++)
        wgmma_ss_32(&s[0][0], gmma_kmajor(sK, BN, kk), gmma_kmajor(q, BM, kk), kk > 0);
#pragma unroll
    for (int kk = 0; kk < DVP / 16; kk++)
        wgmma_ss_32(&dp[0][0], gmma_kmajor(sV, BN, kk), gmma_kmajor(g, BM, kk), kk > 0);
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs<QH / 2>(&s[0][0]);
    fence_regs<QH / 2>(&dp[0][0]);
}

/* acc (64 keys x N) += A B over the tile's BM queries: A (P^T or dS^T, keys by queries, K-major)
** and B (the warpgroup's N columns of dO or Q, N-major), both in shared memory. */
% local function by_tile(n)
__device__ __forceinline__ void keys_by_tile_${n}(float *acc, u32 a, u32 b)
{
#pragma unroll
    for (int kk = 0; kk < BM / 16; kk++)
        wgmma_ss_t_${n}(acc, gmma_kmajor(a, BN, kk), gmma_nmajor(b, BM, kk), 1);
}
% end
% by_tile(DH)
% if DVH ~= DH then by_tile(DVH) end

/* A warp's 16 keys (from key0) by QH queries (from q0) of P^T or dS^T (A fragments) into the
** swizzled [BN][BM] tile, by matrix stores: register r of k16 block kk holds the 8 x 8 matrix
** of keys key0 + 8 (r % 2) + [0, 8) by queries q0 + 16 kk + 8 (r / 2) + [0, 8). */
__device__ __forceinline__ void store_keys_by_queries(u32 tile, const u32 (*f)[4], int key0, int q0,
                                                      int lane)
{
    const int m = lane / 8; /* the matrix whose row lane % 8 this lane addresses */
    const int key = key0 + 8 * (m % 2) + lane % 8;
#pragma unroll
    for (int kk = 0; kk < QH / 16; kk++)
        stmatrix_x4(swizzled(tile, BN, key, q0 + 16 * kk + 8 * (m / 2)), f[kk]);
}
% if want_dq then

/* Adds a warp's 16 rows of a finished piece (acc: rows row0 + [0, 16), 64 columns) into the f32
** sum at dq (DP floats a row, the piece's first column), none from seqlen_q on. */
__device__ __forceinline__ void add_dq_rows(float *dq, const float (*acc)[4], int row0,
                                            int seqlen_q, int lane)
{
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int row = row0 + g + 8 * h;
        if (row >= seqlen_q)
            continue;
        float *dst = dq + (long long)row * DP + 2 * t;
#pragma unroll
        for (int j = 0; j < 8; j++)
            red_add2(dst + j * 8, acc[j][2 * h], acc[j][2 * h + 1]);
    }
}
% end

/* ---- the kernel ------------------------------------------------------------------------------ */
/* dK and dV of BN keys of one (batch, kv head), key block key_block0 + blockIdx.x, over every
** query row of the group's heads. */
extern "C" __global__ void __launch_bounds__(THREADS, 1)
fj_attn_bwd_dkdv(
% params_arg(args, "T")
)
{
% bwd_hopper_shared(family)
    const u32 sPT = sK + PT_OFFSET, sDST = sPT + PT_BYTES; /* P^T, dS^T */
    [[maybe_unused]] const u32 sDS = sDST + PT_BYTES;     /* dS (with dQ) */
% bwd_hopper_barriers()
% bwd_hopper_computing()

    /* ---- warpgroup wg: the block's keys by columns [wg DH, wg DH + DH) of dK and
    ** [wg DVH, wg DVH + DVH) of dV, and queries [m0 + wg QH, m0 + wg QH + QH) of S^T ---------- */
    float dka[DH / 8][4], dva[DVH / 8][4];
    zero_acc<DH>(dka);
    zero_acc<DVH>(dva);
    const int key_row = n0 + warp * 16; /* this warp's first key */
% if want_dq then
    float *dq = nullptr; /* the workspace's rows of the tile's head */
% end
% bwd_hopper_kv_wait()
    for (; i < count; i = live_from(i + 1), n++) {
% bwd_hopper_tile("wg * QH")
        const int mq = m0 + wg * QH; /* the warpgroup's first query row */

        /* S^T = K Q^T and dP^T = V dO^T: the block's 64 keys by the warpgroup's QH queries. */
        float s[QH / 8][4], dp[QH / 8][4];
        scores_and_dp(s, dp, sK, sV, sQ + wg * QH * 128, sG + wg * QH * 128);

% bwd_dkdv_elements(true, "QH", "mq")

        /* P^T, dS^T (and dS) into shared memory, once both warpgroups' products of the previous
        ** tile have read them. */
        u32 pf[QH / 16][4], dsf[QH / 16][4];
        pack_rows<QH / 16>(pf, s);
        pack_rows<QH / 16>(dsf, dp);
        bar_sync(TILES_FREE, COMPUTE_THREADS);
        store_keys_by_queries(sPT, pf, warp * 16, wg * QH, lane);
        store_keys_by_queries(sDST, dsf, warp * 16, wg * QH, lane);
% if want_dq then
        store_ds_transposed<QH / 16>(sDS + wg * QH * 128, dsf, warp * 16, lane);
% end
        fence_proxy_async(); /* read by wgmma (the async proxy) */
        bar_sync(TILES_WHOLE, COMPUTE_THREADS);

        /* dV += P^T dO, dK += dS^T Q over the warpgroup's columns. */
        wgmma_fence();
        keys_by_tile_${DVH}(&dva[0][0], sPT, sG + wg * (DVH / 64) * BM * 128);
        keys_by_tile_${DH}(&dka[0][0], sDST, sQ + wg * (DH / 64) * BM * 128);
        wgmma_commit();
% if want_dq then
        /* dQ = dS K: pieces wg, wg + 2, ... (their products wait for dK's and dV's too). */
        if (n == 0)
            grid_wait_previous(); /* the run before this one added its dQ */
        dq = P.dq_acc + blockIdx.x * P.dq_slice + (long long)(batch * heads_q + head) * d_rows * DP;
        for (int piece = wg; piece < DQ_PIECES; piece += 2) {
            float acc[8][4];
            dq_piece(acc, sDS, sK, piece);
            add_dq_rows(dq + piece * 64, acc, m0 + warp * 16, seqlen_q, lane);
        }
% end
        wgmma_wait<0>();
        /* dK and dV are not read until their products landed. */
        fence_regs<DH / 2>(&dka[0][0]);
        fence_regs<DVH / 2>(&dva[0][0]);
% bwd_hopper_slot_release()
    }

% bwd_store_dkdv(true, true, true)
    }
}
