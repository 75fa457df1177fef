% -- The backward of attention on tensor cores (sm_80+): FlashAttention-2's products, without its
% -- atomics. After attn_bwd.lua's first stage (D = rowsum(dO * O) into the f32 workspace), two
% -- kernels, each a forward-like loop of mma.sync m16n8k16 products with f32 accumulators:
% --   stage 2, dkdv: a block owns tile_n keys of one (batch, kv head), 16 per warp, and streams
% --     tiles of tile_m query rows of every query head of the group:
% --       S^T = K Q^T, dP^T = V dO^T, P^T = exp2(S^T - lse), dS^T = P^T * (dP^T - D),
% --       dV += P^T dO, dK += dS^T Q;
% --   stage 3, dq: a block owns tile_m query rows of one (batch, head), 16 per warp, and streams
% --     tiles of tile_n keys: S = Q K^T, dP = dO V^T, P and dS as above, dQ += dS K.
% -- P and dS go from the accumulators to the A operand as 16-bit pairs, as P in the forward.
% -- Where dK's and dV's accumulators would not both fit a thread's registers (d + dv above 256)
% -- stage 2 runs twice, writing dK (S, dP, dS) and then dV (S, P): `grads` 1 and 2, 3 both.
% -- Unless the request is deterministic, stage 2 also forms dQ (grads + 4, with dK) and stage 3
% -- does not run: dS^T goes to shared memory, the warps take its tile's dQ = dS K by query rows
% -- and add it by atomics into an f32 workspace [batch, heads_q, rows, DP] (zeroed before;
% -- attn_bwd.lua's stage 5 casts it; slice blockIdx.x of it, and key block key_block0 +
% -- blockIdx.x, as Hopper's): five products a tile instead of seven, in an order
% -- of additions that varies run to run. Otherwise no atomics: the gradients are bit-identical.
% -- The streamed tiles are double-buffered (cp.async). dS is taken with respect to the raw q.k times its derivative
% -- (scale; scale * (1 - tanh^2) through soft-capping): without soft-capping the scale
% -- multiplies dK and dQ once, at the store.
% --
% -- Serves requests with the band (causal, windows), soft-capping, any scale sign, the
% -- element masks (mask_mod, the mask tensor, FlashMask ranges) and score terms (ALiBi, a bias,
% -- score_mod through its generated derivative) of attn_masks.lua, the caller's 128 x 128
% -- block classes (a tile, which lies in one block, is skipped where its class is 0 and read
% -- without the element masks where it is 2), packed sequences (varlen 1, and 2 with
% -- seqused_k), grouped heads, d and dv multiples of 8 up to 256 in 16-byte-aligned rows; the
% -- planner (plan/bwd.c) sends the rest (the bias's gradient, f32) to attn_bwd.lua's SIMT
% -- stages.
% --
% -- Parameters: dtypes (one 16-bit type), head_dim_pad, head_dim_v_pad, tile_m, tile_n, warps,
% -- stage (2 or 3), grads (stage 2: the sum of 1 dK, 2 dV, 4 dQ by atomics), local_mask, softcap, block_mask, varlen, the
% -- masks' and score terms' (attn_masks.lua), shared_bytes (the host's size of the tiles), args
% -- (fj_bwd_params).
% assert(stage == 2 or stage == 3, "attn_bwd_mma: stage 2 (dkdv) or 3 (dq)")
% assert(head_dim_pad % 16 == 0 and head_dim_v_pad % 16 == 0 and tile_m % 16 == 0 and tile_n % 16 == 0, "attn_bwd_mma: tiles of 16")
% assert((stage == 2 and tile_n == 16 * warps) or (stage == 3 and tile_m == 16 * warps), "attn_bwd_mma: 16 rows a warp")
% assert(stage == 3 or (grads >= 1 and grads <= 7 and (grads < 4 or grads % 2 == 1)), "attn_bwd_mma: stage 2 writes dk (1), dv (2), dq (4, with dk)")
% local want_dk = stage == 3 or grads % 2 == 1 -- dS is needed (stage 3: for dQ)
% local want_dv = stage == 2 and grads % 4 >= 2
% local want_dq = stage == 2 and grads >= 4 -- stage 2 adds dQ by atomics
% include("cuda_mma.lua")
% include("cuda_attn_common.lua")
% include("attn_bwd_tc.lua")
% include("params.lua")
% params_struct(args)

% bwd_mma_preamble()

% local ds_factor = bwd_ds_factor()

% if stage == 2 then
/* With dQ, the tile's dS^T [BN][DSS] after the streamed tiles. */
#define DSS (BM + 8)
% bwd_stream_smem(want_dq and "2 * BN * DSS" or nil)
% if want_dq then
% bwd_dq_pieces(1)

/* Adds dQ = dS K of a tile (rows [m0, m0 + BM) of `head`) into the f32 sum: dS^T in sDS, K in
** sK; each warp takes pieces of 16 rows by DQ_COLS columns. */
__device__ __forceinline__ void add_dq_tile(float *dq_acc, const elem_t *sDS, const elem_t *sK,
                                            int m0, int seqlen_q, int warp, int lane)
{
#pragma unroll 1
    for (int piece = warp; piece < DQ_PIECES; piece += THREADS / 32) {
        const int strip = piece % DQ_STRIPS, c0 = piece / DQ_STRIPS * DQ_COLS;
        u32 dsf[BN / 16][4];
        ldmatrix_a_trans<BN / 16, DSS>(dsf, sDS + strip * 16, lane);
        float acc[DQ_COLS / 8][4];
        zero_acc<DQ_COLS>(acc);
        mma_regs_by_rows<DQ_COLS, BN / 16, QS>(acc, dsf, sK + c0, lane);
        add_dq_piece(dq_acc, &acc, m0 + strip * 16, c0, seqlen_q, lane);
    }
}
% end

/* dK and dV of BN keys of one (batch, kv head), over every query row of the group's heads. */
extern "C" __global__ void __launch_bounds__(THREADS, ${warps <= 4 and 2 or 1})
fj_attn_bwd_dkdv(
% params_arg(args)
)
{
% params_unpack(args.fields[1].block, "P.fwd", bwd_unpack_names())
    const float scale = P.scale;
% bwd_stream_smem_pointers(want_dq and "sDS")

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
% bwd_dkdv_block(nil, true)

% if want_dk then
    float dka[DP / 8][4];
    zero_acc<DP>(dka);
% end
% if want_dv then
    float dva[DVP / 8][4];
    zero_acc<DVP>(dva);
% end
% bwd_dkdv_stream_start(want_dk)
    const int key_row = n0 + warp * 16; /* this warp's first key */
    for (int b = 0; i < count; b ^= 1, i = next) {
        const int m0 = item_m0(i);
        next = live_from(i + 1);
% bwd_mask_ctx("item_head(i)")
% bwd_stream_landed()
% if block_mask then
        const int block_class = block_class_of(item_head(i), m0, n0);
% end

        /* S^T = K Q^T and dP^T = V dO^T: the warp's 16 keys by BM queries. */
% bwd_stream_products(want_dk)

% bwd_dkdv_elements(want_dk)

        /* dV += P^T dO, dK += dS^T Q: P^T and dS^T as A fragments, dO and Q by ldmatrix.trans. */
% if want_dv then
        u32 pf[BM / 16][4];
        pack_rows<BM / 16>(pf, s);
        mma_regs_by_rows<DVP, BM / 16, VS>(dva, pf, sG, lane);
% end
% if want_dk then
        u32 dsf[BM / 16][4];
        pack_rows<BM / 16>(dsf, dp);
%   if want_dq then
        /* The warp's rows of dS^T, for dQ: fragment register r holds rows g + 8 (r % 2), columns
        ** 16 kk + 8 (r / 2) + 2 t. */
#pragma unroll
        for (int kk = 0; kk < BM / 16; kk++)
#pragma unroll
            for (int r = 0; r < 4; r++)
                *(u32 *)(sDS + (warp * 16 + g + 8 * (r % 2)) * DSS + kk * 16 + 8 * (r / 2) + 2 * t) =
                    dsf[kk][r];
%   end
        mma_regs_by_rows<DP, BM / 16, QS>(dka, dsf, sQ, lane);
% end
% if want_dq then
        __syncthreads(); /* dS^T whole; the next tile's first barrier guards its rewrite */
        add_dq_tile(P.dq_acc + blockIdx.x * P.dq_slice +
                        ((long long)(batch * heads_q + item_head(i)) * d_rows) * DP,
                    sDS, sK, m0, seqlen_q, warp, lane);
% end
    }

% bwd_store_dkdv(want_dk, want_dv)
}
% else
/* Shared memory: Q [BM][QS] and dO [BM][VS], then two buffers of K [BN][QS] and V [BN][VS]. */
#define KV_ELEMS (BN * (QS + VS))
static_assert(2 * (BM * (QS + VS) + 2 * KV_ELEMS) == ${shared_bytes}, "the host's shared-memory size");

/* dQ of BM query rows of one (batch, head), over the key tiles their band reaches. */
extern "C" __global__ void __launch_bounds__(THREADS, ${warps <= 4 and 2 or 1})
fj_attn_bwd_dq(
% params_arg(args)
)
{
% params_unpack(args.fields[1].block, "P.fwd", bwd_unpack_names())
    const float scale = P.scale;
    extern __shared__ __attribute__((aligned(128))) unsigned char smem[];
    elem_t *sQ = (elem_t *)smem;
    elem_t *sG = sQ + BM * QS;
    elem_t *sKV = sG + BM * VS; /* buffer b: K at sKV + b * KV_ELEMS, V after it */

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int g = lane / 4, t = lane % 4; /* row group and column pair of mma fragments */
% attn_block_origin()
% bwd_sequence()
    if (m0 >= seqlen_q)
        return;
% bwd_dq_stream()
    const int warp_row = m0 + warp * 16; /* first query row of this warp */
% bwd_dq_rows()

    float dqa[DP / 8][4];
    zero_acc<DP>(dqa);

% bwd_block_classes()
% bwd_dq_live_from()
    int nb = live_from(nb_lo), next;
    if (nb < nb_hi) {
        load_tile<BM, DP, QS>(sQ, q, q_ss, m0, seqlen_q, head_dim);
        load_tile<BM, DVP, VS>(sG, dout, P.do_ss, m0, seqlen_q, head_dim_v);
        load_tile<BN, DP, QS>(sKV, k, k_ss, nb * BN, seqlen_k, head_dim);
        load_tile<BN, DVP, VS>(sKV + BN * QS, v, v_ss, nb * BN, seqlen_k, head_dim_v);
        cp_async_commit();
    }
    for (int b = 0; nb < nb_hi; b ^= 1, nb = next) {
        const int n0 = nb * BN;
        next = live_from(nb + 1);
        cp_async_wait_all();
        __syncthreads(); /* tile nb landed; every warp is done with buffer b ^ 1 */
        if (next < nb_hi) {
            elem_t *buf = sKV + (b ^ 1) * KV_ELEMS;
            load_tile<BN, DP, QS>(buf, k, k_ss, next * BN, seqlen_k, head_dim);
            load_tile<BN, DVP, VS>(buf + BN * QS, v, v_ss, next * BN, seqlen_k, head_dim_v);
            cp_async_commit();
        }
        const elem_t *sK = sKV + b * KV_ELEMS, *sV = sK + BN * QS;
% if block_mask then
        const int block_class = block_class_of(head, m0, n0);
% end

        /* S = Q K^T and dP = dO V^T: the warp's 16 rows by BN keys. */
        float s[BN / 8][4], dp[BN / 8][4];
        zero_acc<BN>(s);
        zero_acc<BN>(dp);
        mma_rows_by_rows<BN, DP / 16, QS, QS>(s, sQ + warp * 16 * QS, sK, lane);
        mma_rows_by_rows<BN, DVP / 16, VS, VS>(dp, sG + warp * 16 * VS, sV, lane);

% bwd_dq_elements(want_dk)

        /* dQ += dS K: dS as A fragments, K by ldmatrix.trans. */
        u32 dsf[BN / 16][4];
        pack_rows<BN / 16>(dsf, dp);
        mma_regs_by_rows<DP, BN / 16, QS>(dqa, dsf, sK, lane);
    }

% bwd_store_dq()
}
% end
