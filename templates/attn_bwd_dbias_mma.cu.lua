% -- The bias's gradient on tensor cores (sm_80+): the backward's stage 4 where desc.dbias is
% -- asked for (attn_bwd.lua's stage 4 is its SIMT form, with the same grid, workspace and sums).
% -- A block owns a tile of dbias, tile_m query rows by tile_n keys (16 keys a warp), and for
% -- each (batch, head, query tile) that the tile's elements stand for recomputes what the dk/dv
% -- kernel does: S^T = K Q^T and dP^T = V dO^T (mma.sync m16n8k16, f32 accumulators), and
% -- attn_bwd_tc.lua's element pass makes dS^T of them: dL/d(score) through score_mod's
% -- derivative but not soft-capping's, which comes before the bias is added. That is the
% -- bias's gradient, added into the tile's sums.
% --
% -- Sums in one fixed order, no atomics: element by element over the batches and heads that
% -- dbias broadcasts (items in order, batches outermost); where its rows are summed (a key
% -- bias) also over the query tiles of the block's share (P.dbias_splits shares of them, each
% -- share's sums into the workspace that attn_bwd.lua's stage 6 adds), then each thread's
% -- columns, then the quad's. Grid (plan/bwd.c's plan_dbias): x the (batch, head) pairs of
% -- dbias times its key tiles, y its row tiles or shares.
% --
% -- A (batch, kv head)'s K and V tiles are loaded once for its items; each item's Q and dO are
% -- double-buffered (cp.async) under the last one's products. Items outside the band or in
% -- blocks of class 0 are skipped (their dS is 0).
% --
% -- Serves what attn_bwd_mma.cu.lua serves (the band, soft-capping, the element masks and score
% -- terms, block classes, grouped heads, head dims to 256) but packed sequences, which take the
% -- SIMT stage with a bias (plan/bwd.c's mma_serves).
% --
% -- Parameters: dtypes (one 16-bit type), head_dim_pad, head_dim_v_pad, tile_m, tile_n, warps,
% -- local_mask, softcap, block_mask, the masks' and score terms' (attn_masks.lua),
% -- shared_bytes (the host's size of the tiles), args (fj_bwd_params).
% assert(stage == 4 and varlen == 0, "attn_bwd_dbias_mma: stage 4 (dbias), dense sequences")
% assert(head_dim_pad % 16 == 0 and head_dim_v_pad % 16 == 0 and tile_m % 16 == 0 and tile_n == 16 * warps, "attn_bwd_dbias_mma: tiles of 16, 16 keys a warp")
% assert(bias ~= "", "attn_bwd_dbias_mma: the gradient of a bias")
% include("cuda_mma.lua")
% include("cuda_attn_common.lua")
% include("attn_bwd_tc.lua")
% include("attn_dbias.lua")
% include("params.lua")
% params_struct(args)

% bwd_mma_preamble()
% bwd_stream_smem()

/* A BM x BN tile of dbias [batches, heads, rows, keys] (an extent of 1 where the bias
** broadcasts: summed over). */
extern "C" __global__ void __launch_bounds__(THREADS, 1)
fj_attn_bwd_dbias(
% params_arg(args)
)
{
% params_unpack(args.fields[1].block, "P.fwd")
    const float scale = P.scale;
% bwd_stream_smem_pointers()

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int g = lane / 4, t = lane % 4; /* row group and column pair of the fragments */
% dbias_block("blockIdx.x", "blockIdx.y", "n0", "BM", "BN", "seqlen_q", "seqlen_k")
    const int key_row = n0 + warp * 16; /* this warp's first key */
    const int group = heads_q / heads_kv;
% if local_mask then
    const int shift = seqlen_k - seqlen_q;
% end
    /* Items: the (batch, head) pairs the tile stands for (outermost) by its query tiles. */
    const int heads = h_hi - h_lo, tiles = imax(0, mb_hi - mb_lo);
    const int count = n0 < seqlen_k ? (b_hi - b_lo) * heads * tiles : 0;
    auto item_batch = [&](int i) { return b_lo + i / tiles / heads; };
    auto item_head = [&](int i) { return h_lo + i / tiles % heads; };
    auto item_m0 = [&](int i) { return (mb_lo + i % tiles) * BM; };
% bwd_block_classes(true)
    /* The first item from i on whose tile has pairs: inside the band, of a class other than 0. */
    auto live_from = [&](int i) {
        for (; i < count; i++) {
            [[maybe_unused]] const int m0 = item_m0(i);
% if local_mask then
            if (${dbias_tile_outside_band("m0", "n0", "BM", "BN")})
                continue;
% end
% if block_mask then
            if (block_class_of(item_batch(i), item_head(i), m0, n0) == 0)
                continue;
% end
            return i;
        }
        return count;
    };

    /* Item i's Q and dO into buffer b by cp.async, its rows' lse and D by the threads. */
    auto issue = [&](int i, int b) {
        const int batch = item_batch(i), head = item_head(i), m0 = item_m0(i);
        elem_t *sQ = sQG + b * QG_ELEMS;
        load_tile<BM, DP, QS>(sQ, q + batch * q_sb + head * q_sh, q_ss, m0, seqlen_q, head_dim);
        load_tile<BM, DVP, VS>(sQ + BM * QS, P.dout + batch * P.do_sb + head * P.do_sh, P.do_ss,
                               m0, seqlen_q, head_dim_v);
        const float *delta = P.delta + ((long long)batch * heads_q + head) * seqlen_q;
        for (int r = tid; r < BM; r += THREADS) {
            const int row = m0 + r;
            const float l =
                row < seqlen_q ? lse[batch * l_sb + head * l_sh + row * l_ss] : NEG_INF;
            sLD[2 * BM * b + r] = l == NEG_INF ? POS_INF : l * LOG2E;
            sLD[2 * BM * b + BM + r] = row < seqlen_q ? delta[row] : 0.0f;
        }
    };

    float acc[BM / 8][4]; /* the tile's sums: the warp's 16 keys by BM query rows */
    zero_acc<BM>(acc);
    int i = live_from(0), next, kv_at = -1;
    if (i < count) {
        issue(i, 0);
        cp_async_commit();
    }
    for (int b = 0; i < count; b ^= 1, i = next) {
        const int batch = item_batch(i), head = item_head(i), m0 = item_m0(i);
        next = live_from(i + 1);
        const int kv = batch * heads_kv + head / group;
        if (kv != kv_at) { /* this (batch, kv head)'s K and V */
            __syncthreads(); /* (every warp done with the last) */
            load_tile<BN, DP, QS>(sK, k + batch * k_sb + (head / group) * k_sh, k_ss, n0, seqlen_k,
                                  head_dim);
            load_tile<BN, DVP, VS>(sV, v + batch * v_sb + (head / group) * v_sh, v_ss, n0,
                                   seqlen_k, head_dim_v);
            cp_async_commit();
            kv_at = kv;
        }
% bwd_mask_ctx("head")
% bwd_stream_landed()
% if block_mask then
        const int block_class = block_class_of(batch, head, m0, n0);
% end

        /* S^T = K Q^T and dP^T = V dO^T: the warp's 16 keys by BM queries; dS^T into dp. */
% bwd_stream_products(true)
% bwd_dkdv_elements("raw")
#pragma unroll
        for (int j = 0; j < BM / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                acc[j][e] += dp[j][e];
    }

    /* Element (j, e) of acc is key key_row + g + 8 (e / 2), query row m0 + 8 j + 2 t + e % 2. */
    float *dbias = P.dbias + b_ * P.dbias_sb + h_ * P.dbias_sh;
    if (rows_summed) {
        /* each key's sum: the thread's columns, then the quad's (fixed orders) */
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float sum = 0.0f;
#pragma unroll
            for (int j = 0; j < BM / 8; j++)
                sum += acc[j][2 * h] + acc[j][2 * h + 1];
            sum += __shfl_xor_sync(0xffffffffu, sum, 1);
            sum += __shfl_xor_sync(0xffffffffu, sum, 2);
            const int key = key_row + g + 8 * h;
            if (t != 0 || key >= seqlen_k)
                continue;
            if (P.dbias_splits > 1) /* this share's sum */
                ${dbias_part("blockIdx.y", "pair", "key", "seqlen_k")} = sum;
            else
                dbias[key] = sum;
        }
        return;
    }
    const int m_lo = mb_lo * BM;
#pragma unroll
    for (int j = 0; j < BM / 8; j++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int row = m_lo + 8 * j + 2 * t + (e & 1), key = key_row + g + 8 * (e / 2);
            if (row < P.dbias_rows && key < seqlen_k)
                dbias[(long long)row * P.dbias_ss + key] = acc[j][e];
        }
}
