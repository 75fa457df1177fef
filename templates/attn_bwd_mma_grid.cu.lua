% -- The dk/dv stage of the backward on mma.sync (sm_80+) with its warps in a grid, as
% -- FlashAttention-2's: attn_bwd_mma.cu.lua's stage 2 (its products, element pass, stream and
% -- stores, attn_bwd_tc.lua), but a warp does not own 16 keys by every column. The block owns
% -- BN keys of one (batch, kv head) and streams tiles of BM query rows; warp w works on keys
% -- KW = 32 from (w / 2) 32 and on half c = w % 2 of the rest:
% --   S^T = K Q^T and dP^T = V dO^T: its 32 keys by queries [c QW, c QW + QW) (QW = BM / 2);
% --   P^T and dS^T from them (the element pass) go to shared memory, [BN][PS] each. Where
% --   only the ends and the band mask (bwd_p_from_bounds_only) P^T's exponentials are taken
% --   unmasked in one stretch of code with dP^T's products, which ptxas interleaves, and
% --   clipped after; else where dS needs only P, dP and D (no soft-capping, no score_mod) P^T
% --   is taken, masked, before those products;
% --   dV += P^T dO and dK += dS^T Q: its 32 keys by columns [c DH, c DH + DH) (DH = DP / 2,
% --   DVH = DVP / 2), over the tile's BM queries, after a barrier of the pair of warps alone
% --   (the rows of P^T and dS^T that they read are theirs);
% --   with grads 7, dQ += dS K by atomics into the f32 workspace, as attn_bwd_mma.cu.lua's, in
% --   pieces of DQ_MT 16 rows by DQ_COLS columns shared out among the warps: a tile's dQ after
% --   the next tile's first barrier (when every warp's dS^T is whole), so dS^T has two
% --   buffers, and no barrier of the whole block stands between the products of a tile. The
% --   pairs of warps drift apart within a tile, one's element pass beside another's products.
% -- Each fragment loaded from shared memory serves two row tiles (the warp's 32 rows), and the
% -- operands a warp reads are half the tile's, so a flop reads about 0.7x the shared memory of
% -- attn_bwd_mma.cu.lua's (a warp of 16 keys by every column): FA2's arithmetic, 0.058 bytes a
% -- flop against 0.081 at d 128 (H100: 1.12-1.20x that kernel; bench/RESULTS.md).
% --
% -- Serves what attn_bwd_mma.cu.lua's stage 2 serves where dK and dV are one launch (grads 3,
% -- 7 with dQ by atomics): head dims padded to 32 (halves of 16), d + dv to 256, an even
% -- number of warps of 16 keys each (2 warps a 32-key row of the grid), BM a multiple of 32.
% --
% -- Parameters: as attn_bwd_mma.cu.lua's stage 2 (dtypes, head_dim_pad, head_dim_v_pad, tile_m,
% -- tile_n, warps, stage 2, grads 3 or 7, d_split 1, local_mask, softcap, block_mask, varlen,
% -- the masks' and score terms', shared_bytes, args).
% assert(stage == 2 and d_split, "attn_bwd_mma_grid: stage 2 with d_split")
% assert(grads == 3 or grads == 7, "attn_bwd_mma_grid: dK and dV, and dQ by atomics with grads 7")
% assert(warps % 2 == 0 and tile_n == 16 * warps, "attn_bwd_mma_grid: 32 keys a pair of warps")
% assert(tile_m % 32 == 0, "attn_bwd_mma_grid: halves of 16 query rows")
% assert(head_dim_pad % 32 == 0 and head_dim_v_pad % 32 == 0, "attn_bwd_mma_grid: halves of 16 columns")
% assert(head_dim_pad + head_dim_v_pad <= 256, "attn_bwd_mma_grid: dK's and dV's halves in a thread's registers")
% local want_dq = grads == 7
% include("cuda_mma.lua")
% include("cuda_attn_common.lua")
% include("attn_bwd_tc.lua")
% -- The element pass's shape: "exps" (only the ends and the band mask: bwd_dkdv_exps beside
% -- dP^T's products, bwd_dkdv_clip after), "p_first" (dS from P, dP and D alone: P^T, masked,
% -- before dP^T's products), or "after" (both after them).
% local shape = bwd_p_from_bounds_only() and "exps" or bwd_ds_from_p_only() and "p_first" or "after"
% include("params.lua")
% params_struct(args)

% bwd_mma_preamble()

#define QW (BM / 2)   /* a warp's queries of S^T and dP^T */
#define DH (DP / 2)   /* a warp's columns of dK */
#define DVH (DVP / 2) /* and of dV */
/* P^T and dS^T, [BN][PS] each (with dQ two buffers of dS^T), after the streamed tiles (rows
** 16 bytes apart mod 128 bytes: ldmatrix without bank conflicts). */
#define PS (BM + 8)
% bwd_stream_smem(want_dq and "6 * BN * PS" or "4 * BN * PS")
% if want_dq then
% bwd_dq_pieces(2)

/* Adds dQ = dS K of a tile (rows [m0, m0 + BM) of a head, whose workspace rows start at dq_acc)
** into the f32 sum: dS^T in sDS, K in sK; each warp takes pieces of 16 DQ_MT rows by DQ_COLS
** columns (one each where there are as many pieces as warps). */
__device__ __forceinline__ void add_dq_tile(float *dq_acc, const elem_t *sDS, const elem_t *sK,
                                            int m0, int seqlen_q, int warp, int lane)
{
#pragma unroll 1
    for (int piece = warp; piece < DQ_PIECES; piece += THREADS / 32) {
        const int r0 = piece % DQ_STRIPS * 16 * DQ_MT, c0 = piece / DQ_STRIPS * DQ_COLS;
        float acc[DQ_MT][DQ_COLS / 8][4];
#pragma unroll
        for (int mi = 0; mi < DQ_MT; mi++)
            zero_acc<DQ_COLS>(acc[mi]);
        mma_tiles<DQ_MT, DQ_COLS, BN / 16, PS, QS, true, true>(acc, sDS + r0, sK + c0, lane);
        add_dq_piece(dq_acc, acc, m0 + r0, c0, seqlen_q, lane);
    }
}
% end

% -- A warp's 16-key row tile mi of `acc` (mma's accumulators, QW / 8 column blocks) into rows
% -- of `dst` ([BN][PS], 16-bit), at the warp's keys and queries.
% function tile_to_smem(dst, acc)
#pragma unroll
            for (int j = 0; j < QW / 8; j++)
#pragma unroll
                for (int h = 0; h < 2; h++)
                    *(u32 *)(${dst} + (wk * 32 + mi * 16 + g + 8 * h) * PS + wc * QW + 8 * j +
                             2 * t) = pack2(${acc}[j][2 * h], ${acc}[j][2 * h + 1]);
% end

/* dK and dV of BN keys of one (batch, kv head), over every query row of the group's heads. */
extern "C" __global__ void __launch_bounds__(THREADS, 1)
fj_attn_bwd_dkdv(
% params_arg(args)
)
{
% params_unpack(args.fields[1].block, "P.fwd", bwd_unpack_names())
    const float scale = P.scale;
% bwd_stream_smem_pointers("sPT")
    elem_t *sDS = sPT + BN * PS; /* this tile's dS^T (with dQ, buffers alternate) */

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int wk = warp / 2, wc = warp % 2; /* the warp's 32 keys, and its half of the rest */
% bwd_dkdv_block(nil, true)

    float dk_acc[2][DH / 8][4], dv_acc[2][DVH / 8][4];
#pragma unroll
    for (int mi = 0; mi < 2; mi++) {
        zero_acc<DH>(dk_acc[mi]);
        zero_acc<DVH>(dv_acc[mi]);
    }
% bwd_dkdv_stream_start(true, true)
% if want_dq then
    /* Adds item j's dQ, its dS^T at ds. */
    auto add_dq = [&](int j, const elem_t *ds) {
        add_dq_tile(P.dq_acc + blockIdx.x * P.dq_slice +
                        ((long long)(batch * heads_q + item_head(j)) * d_rows) * DP,
                    ds, sK, item_m0(j), seqlen_q, warp, lane);
    };
    int last = -1; /* the item whose dQ is to add */
% end
    for (int b = 0; i < count; b ^= 1, i = next) {
        const int m0 = item_m0(i);
        next = live_from(i + 1);
% bwd_mask_ctx("item_head(i)")
% bwd_stream_landed()
% if want_dq then
        /* The last item's dQ: every warp's rows of its dS^T written before the barrier above. */
        if (last >= 0)
            add_dq(last, sDS);
        last = i;
        sDS = sPT + (b + 1) * BN * PS;
% end
% if block_mask then
        const int block_class = block_class_of(item_head(i), m0, n0);
% end

        /* S^T = K Q^T and dP^T = V dO^T: the warp's 32 keys by its QW queries. */
        float s_acc[2][QW / 8][4], dp_acc[2][QW / 8][4];
#pragma unroll
        for (int mi = 0; mi < 2; mi++) {
            zero_acc<QW>(s_acc[mi]);
            zero_acc<QW>(dp_acc[mi]);
        }
        mma_tiles<2, QW, DP / 16, QS, QS, false, false>(s_acc, sK + wk * 32 * QS,
                                                        sQ + wc * QW * QS, lane);
% if shape == "exps" then
        /* P^T unmasked, its exponentials in one stretch of code with dP^T's products (beside
        ** them); outside the ends and the band zeroed after. */
#pragma unroll
        for (int mi = 0; mi < 2; mi++) {
            float(&s)[QW / 8][4] = s_acc[mi];
% bwd_dkdv_exps("QW", "wc * QW")
        }
% elseif shape == "p_first" then
        /* P^T first, its exponentials beside dP^T's products, which it does not wait for. */
#pragma unroll
        for (int mi = 0; mi < 2; mi++) {
            const int key_row = n0 + wk * 32 + mi * 16; /* the row tile's first key */
            float(&s)[QW / 8][4] = s_acc[mi];
% bwd_dkdv_elements(false, "QW", "m0 + wc * QW", "wc * QW")
% tile_to_smem("sPT", "s")
        }
% end
        mma_tiles<2, QW, DVP / 16, VS, VS, false, false>(dp_acc, sV + wk * 32 * VS,
                                                         sG + wc * QW * VS, lane);

        /* ${shape == "p_first" and "dS^T" or "P^T and dS^T"}, a 16-key row tile at a time, into shared
        ** memory. */
#pragma unroll
        for (int mi = 0; mi < 2; mi++) {
            const int key_row = n0 + wk * 32 + mi * 16; /* the row tile's first key */
            float(&s)[QW / 8][4] = s_acc[mi];
            float(&dp)[QW / 8][4] = dp_acc[mi];
% if shape == "exps" then
% bwd_dkdv_clip("QW", "m0 + wc * QW")
% tile_to_smem("sPT", "s")
% end
% if shape == "after" then
% bwd_dkdv_elements(true, "QW", "m0 + wc * QW", "wc * QW")
% tile_to_smem("sPT", "s")
% else
% bwd_dkdv_ds_from_p("QW", "wc * QW")
% end
% tile_to_smem("sDS", "dp")
        }
        /* The pair's rows of P^T and dS^T written; the next tile's first barrier guards their
        ** rewrite. */
        bar_sync(1 + wk, 64);

        /* dV += P^T dO and dK += dS^T Q: the warp's 32 keys by its half of the columns. */
        mma_tiles<2, DVH, BM / 16, PS, VS, false, true>(dv_acc, sPT + wk * 32 * PS, sG + wc * DVH,
                                                        lane);
        mma_tiles<2, DH, BM / 16, PS, QS, false, true>(dk_acc, sDS + wk * 32 * PS, sQ + wc * DH,
                                                       lane);
    }
% if want_dq then
    if (last >= 0) {
        __syncthreads(); /* the last item's dS^T whole */
        add_dq(last, sDS);
    }
% end

#pragma unroll
    for (int mi = 0; mi < 2; mi++) {
        const int wg = wc, key_row = n0 + wk * 32 + mi * 16;
        float(&dka)[DH / 8][4] = dk_acc[mi];
        float(&dva)[DVH / 8][4] = dv_acc[mi];
% bwd_store_dkdv(true, true, true)
    }
}
