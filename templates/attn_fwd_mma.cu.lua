% -- Forward attention on tensor cores (sm_80+), the FlashAttention-2 design.
% --
% -- A block computes tile_m query rows of one (batch, head); its warps split the rows, each
% -- owning mt m16 tiles. Q, then key and value tiles of tile_n rows, are copied to shared memory
% -- with cp.async (rows padded by 16 bytes, so ldmatrix is free of bank conflicts). Per key tile:
% --   S = Q K^T     ldmatrix + mma.sync m16n8k16, f32 accumulators in registers
% --   online softmax on S in registers (exp2, quad shuffles), rescaling O
% --   O += P V      P reused from S's registers as the A operand, V through ldmatrix.trans
% -- The value tile loads while S is computed and the next key tile while P V is, as in FA2.
% -- Key tiles run from last to first, so only the first few need per-element masking; tiles
% -- outside the causal/window band are never loaded. Requires d, dv multiples of 8 and 16-byte
% -- aligned rows (the planner falls back to the SIMT kernel otherwise).
% -- Value dims beyond 256 (O's accumulators would not fit a thread) split into dv_slices equal
% -- slices of whole m16n8 column pairs, a block each: each block computes S over every column
% -- of q and k, and O for its slice (the slices of a query tile neighbours in the grid, which
% -- then read its key and value tiles through L2 at about one time); the first slice writes
% -- the lse. Head dims beyond 256 in q and k take only shared memory (Q and K tiles of d + 8
% -- columns).
% --
% -- Parameters: dtype, head_dim_pad, head_dim_v_pad, dv_slices, tile_m, tile_n, warps,
% -- q_in_regs, kk_unroll (unroll factor of the S = Q K^T k-loop, 0 = full), local_mask, softcap,
% -- neg_scale, write_lse.
% -- With a positive scale and no soft-capping, S stays unscaled: maxima are taken on raw scores
% -- and the scale folds into one FFMA per element, exp2(s * scale - max * scale).
% local fused = not softcap and not neg_scale
% local mt = tile_m // (16 * warps)
% assert(mt >= 1 and mt * 16 * warps == tile_m, "tile_m must be a multiple of 16 * warps")
% assert(tile_n % 16 == 0 and head_dim_pad % 16 == 0 and head_dim_v_pad % 16 == 0, "tiles must be multiples of 16")
% local slice_dv = head_dim_v_pad // dv_slices
% assert(slice_dv * dv_slices == head_dim_v_pad and slice_dv % 16 == 0 and slice_dv <= 256,
%        "value slices of whole column pairs, at most 256 columns")
% local sliced = dv_slices > 1
% -- The value columns of the block's slice inside the tensor (past them, padding).
% local V_COLS = sliced and "v_cols" or "head_dim_v"
% include("cuda_mma.lua")
% include("cuda_attn_common.lua")
% include("params.lua")
% params_struct(args)

% mma_tile_macros(slice_dv)
#define MT ${mt}
#define NT (BN / 8)
#define KT (DP / 16)
#define OT (DVP / 8)
/* Shared memory: Q [BM][QS], K [BN][QS], V [BN][VS], as much as the host launches with. */
static_assert(2 * (BM * QS + BN * QS + BN * VS) == ${shared_bytes}, "the host's shared-memory size");
% attn_score_macros()

% mma_load_tile()

extern "C" __global__ void __launch_bounds__(THREADS, ${warps <= 4 and 2 or 1})
fj_attn_fwd(
% params_arg(args)
)
{
% params_unpack(args, "P")
    extern __shared__ __attribute__((aligned(128))) unsigned char smem[];
    elem_t *sQ = (elem_t *)smem;
    elem_t *sK = sQ + BM * QS;
    elem_t *sV = sK + BN * QS;

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int g = lane / 4, t = lane % 4; /* row group and column pair of mma fragments */
% attn_block_origin(dv_slices)
    q += batch * q_sb + head * q_sh;
    k += batch * k_sb + head_kv * k_sh;
% if sliced then
    v += batch * v_sb + head_kv * v_sh + slice * DVP;
    out += batch * o_sb + head * o_sh + slice * DVP;
    /* The slice's columns inside the tensor (a whole slice's: DVP, load_tile's fast path). */
    const int v_cols = imin(head_dim_v - slice * DVP, DVP);
% else
    v += batch * v_sb + head_kv * v_sh;
    out += batch * o_sb + head * o_sh;
% end
    lse += batch * l_sb + head * l_sh;
    const int warp_row = m0 + warp * 16 * MT; /* first query row of this warp */

% attn_key_band()

    float o[MT][OT][4];
    float row_max[MT][2], row_sum[MT][2];
#pragma unroll
    for (int i = 0; i < MT; i++) {
#pragma unroll
        for (int j = 0; j < OT; j++)
            o[i][j][0] = o[i][j][1] = o[i][j][2] = o[i][j][3] = 0.0f;
        row_max[i][0] = row_max[i][1] = NEG_INF;
        row_sum[i][0] = row_sum[i][1] = 0.0f;
    }
% if q_in_regs then
    u32 qf[MT][KT][4];
% end

    if (nb_lo < nb_hi) {
        load_tile<BM, DP, QS>(sQ, q, q_ss, m0, seqlen_q, head_dim);
        load_tile<BN, DP, QS>(sK, k, k_ss, (nb_hi - 1) * BN, seqlen_k, head_dim);
        cp_async_commit();
    }
    for (int nb = nb_hi - 1; nb >= nb_lo; nb--) {
        const int n0 = nb * BN;
        cp_async_wait_all();
        __syncthreads(); /* K(nb) (and Q) landed; every warp is done with V of the last tile */
        load_tile<BN, DVP, VS>(sV, v, v_ss, n0, seqlen_k, ${V_COLS});
        cp_async_commit();

        /* S = Q K^T */
        float s[MT][NT][4];
#pragma unroll
        for (int i = 0; i < MT; i++)
#pragma unroll
            for (int j = 0; j < NT; j++)
                s[i][j][0] = s[i][j][1] = s[i][j][2] = s[i][j][3] = 0.0f;
% if q_in_regs then
        if (nb == nb_hi - 1) {
#pragma unroll
            for (int i = 0; i < MT; i++)
#pragma unroll
                for (int kk = 0; kk < KT; kk++)
                    ldmatrix_x4(smem_addr(sQ + (warp * 16 * MT + i * 16 + lane % 16) * QS + kk * 16 + (lane / 16) * 8),
                                qf[i][kk][0], qf[i][kk][1], qf[i][kk][2], qf[i][kk][3]);
        }
% end
% if q_in_regs or kk_unroll == 0 then
#pragma unroll
% else
        /* Fully unrolled, ptxas hoists the Q and K fragments of later steps, and at d = 128 the
        ** accumulators then spill. */
#pragma unroll ${kk_unroll}
% end
        for (int kk = 0; kk < KT; kk++) {
% if q_in_regs then
#define QF(i) qf[i][kk]
% else
            u32 a[MT][4];
#pragma unroll
            for (int i = 0; i < MT; i++)
                ldmatrix_x4(smem_addr(sQ + (warp * 16 * MT + i * 16 + lane % 16) * QS + kk * 16 + (lane / 16) * 8),
                            a[i][0], a[i][1], a[i][2], a[i][3]);
#define QF(i) a[i]
% end
#pragma unroll
            for (int np = 0; np < NT / 2; np++) {
                u32 b0, b1, b2, b3;
                ldmatrix_x4(smem_addr(sK + (np * 16 + (lane / 16) * 8 + lane % 8) * QS + kk * 16 + ((lane / 8) % 2) * 8),
                            b0, b1, b2, b3);
#pragma unroll
                for (int i = 0; i < MT; i++) {
                    mma16816(s[i][2 * np], QF(i), b0, b1);
                    mma16816(s[i][2 * np + 1], QF(i), b2, b3);
                }
            }
#undef QF
        }

        /* Masked where this tile needs it (and in log2 units, soft-capped, unless fused). */
        bool need_mask = n0 + BN > seqlen_k;
% mma_band_crossing()
% if not fused then
#pragma unroll
        for (int i = 0; i < MT; i++)
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
%   if softcap then
                    s[i][j][e] = cap_mul * tanhf(s[i][j][e] * score_mul);
%   else
                    s[i][j][e] *= score_mul;
%   end
                }
% end
        if (need_mask) {
            /* Bounds relative to this thread's first column, so that each element compares a
            ** compile-time column offset: key = n0 + 2t + c with c = 8j + (e % 2). Without a
            ** left window edge (causal) only the right one is compared. */
            const int col0 = n0 + 2 * t;
% local function mask_band(left)
#pragma unroll
            for (int i = 0; i < MT; i++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
% attn_visible_cols("warp_row + i * 16 + g + h * 8", left)
#pragma unroll
                    for (int j = 0; j < NT; j++)
#pragma unroll
                        for (int e = 0; e < 2; e++) {
                            const int c = j * 8 + e;
                            if (c > hi || c < lo)
                                s[i][j][2 * h + e] = NEG_INF;
                        }
                }
% end
% attn_band_cases(mask_band)
        }

        /* Online softmax: new row maxima, rescale O and the sums, P = exp2(S - max). */
#pragma unroll
        for (int i = 0; i < MT; i++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                /* Reductions as trees: short dependency chains for only two warps a scheduler. */
                float t[NT];
#pragma unroll
                for (int j = 0; j < NT; j++)
                    t[j] = fmaxf(s[i][j][2 * h], s[i][j][2 * h + 1]);
#pragma unroll
                for (int w = NT / 2; w >= 1; w /= 2)
#pragma unroll
                    for (int j = 0; j < w; j++)
                        t[j] = fmaxf(t[j], t[j + w]);
                const float mx = quad_max(fmaxf(row_max[i][h], t[0]));
                /* A row with no key yet keeps max -inf; subtracting 0 then gives exp2(-inf) = 0. */
                const float base = mx == NEG_INF ? 0.0f : TO_LOG2(mx);
                const float alpha = ex2(TO_LOG2(row_max[i][h]) - base);
                row_max[i][h] = mx;
#pragma unroll
                for (int j = 0; j < NT; j++) {
#pragma unroll
                    for (int e = 2 * h; e < 2 * h + 2; e++)
% if fused then
                        s[i][j][e] = ex2(fmaf(s[i][j][e], score_mul, -base));
% else
                        s[i][j][e] = ex2(s[i][j][e] - base);
% end
                    t[j] = s[i][j][2 * h] + s[i][j][2 * h + 1];
                }
#pragma unroll
                for (int w = NT / 2; w >= 1; w /= 2)
#pragma unroll
                    for (int j = 0; j < w; j++)
                        t[j] += t[j + w];
                const float sum = t[0];
                row_sum[i][h] = row_sum[i][h] * alpha + sum;
#pragma unroll
                for (int j = 0; j < OT; j++) {
                    o[i][j][2 * h] *= alpha;
                    o[i][j][2 * h + 1] *= alpha;
                }
            }

        /* P as 16-bit pairs right away: half the registers of S through the P V product. The
        ** accumulator layout of two n8 tiles is the A-operand layout of one k16 step. */
        u32 p[MT][BN / 16][4];
#pragma unroll
        for (int i = 0; i < MT; i++)
#pragma unroll
            for (int kk = 0; kk < BN / 16; kk++) {
                p[i][kk][0] = pack2(s[i][2 * kk][0], s[i][2 * kk][1]);
                p[i][kk][1] = pack2(s[i][2 * kk][2], s[i][2 * kk][3]);
                p[i][kk][2] = pack2(s[i][2 * kk + 1][0], s[i][2 * kk + 1][1]);
                p[i][kk][3] = pack2(s[i][2 * kk + 1][2], s[i][2 * kk + 1][3]);
            }

        cp_async_wait_all();
        __syncthreads(); /* V(nb) landed; every warp is done with K(nb) */
        if (nb > nb_lo) {
            load_tile<BN, DP, QS>(sK, k, k_ss, n0 - BN, seqlen_k, head_dim);
            cp_async_commit();
        }

        /* O += P V */
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
#pragma unroll
            for (int op = 0; op < OT / 2; op++) {
                u32 b0, b1, b2, b3;
                ldmatrix_x4_trans(smem_addr(sV + (kk * 16 + lane % 16) * VS + op * 16 + (lane / 16) * 8),
                                  b0, b1, b2, b3);
#pragma unroll
                for (int i = 0; i < MT; i++) {
                    mma16816(o[i][2 * op], p[i][kk], b0, b1);
                    mma16816(o[i][2 * op + 1], p[i][kk], b2, b3);
                }
            }
        }
    }

    /* Normalise and store; a row that saw no key gets 0 and lse -inf. */
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const float sum = quad_sum(row_sum[i][h]);
            const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
            const int row = warp_row + i * 16 + g + h * 8;
            if (row >= seqlen_q)
                continue;
#pragma unroll
            for (int j = 0; j < OT; j++) {
                const int col = j * 8 + 2 * t;
                if (col < ${V_COLS})
                    *(u32 *)(out + row * o_ss + col) = pack2(o[i][j][2 * h] * inv, o[i][j][2 * h + 1] * inv);
            }
% if write_lse then
            if (t == 0${sliced and " && slice == 0" or ""})
                lse[row * l_ss] = sum > 0.0f ? (TO_LOG2(row_max[i][h]) + lg2(sum)) * 0.693147180559945309f : NEG_INF;
% end
        }
}
