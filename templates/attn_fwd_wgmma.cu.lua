% -- Forward attention for Hopper (sm_90a): warp-specialised, TMA-fed, wgmma.
% --
% -- A work tile is tile_m = 64 * NC query rows of one (batch, head); a block runs one or more
% -- of them (see persistent) with 1 + NC warpgroups:
% --   producer   (warpgroup 0; one thread) copies the tile's Q (once the consumers are done with
% --              the last one), then key and value tiles into a ring of `stages` shared-memory
% --              slots with bulk tensor copies (TMA), each slot guarded by a full and an empty
% --              mbarrier; it gives its registers to the consumers.
% --   consumers  (warpgroups 1..NC; 64 query rows each) per key tile:
% --                S = Q K^T    wgmma, both operands from shared memory, f32 in registers
% --                online softmax on S in registers (exp2, quad shuffles), rescaling O
% --                O += P V     wgmma with P from registers (S's accumulator layout is the
% --                             A-operand layout) and V from shared memory, transposed
% --              and release the slots to the producer.
% -- The consumer warpgroups run the same loop out of step, so one's softmax overlaps the
% -- other's matrix products. Shared memory uses the 128-byte swizzle in 64-column panels (the
% -- layout TMA writes and wgmma reads), so head dims are padded to multiples of 64; columns and
% -- rows past the tensor's end arrive as zeros. Key tiles run from last to first, so only the
% -- first ones need per-element masking; tiles outside the causal/window band are never loaded.
% --
% -- Parameters: q_dtype, kv_dtype, out_dtype (one of bf16, f16 for all three), head_dim_pad, head_dim_v_pad (multiples of 64, at most 256), tile_m
% -- (64 or 128 or 192), tile_n (multiple of 16), warps (4 * (1 + NC)), stages, local_mask,
% -- softcap, neg_scale, write_lse, overlap (software-pipeline softmax against P V), pingpong
% -- (with two consumer warpgroups and overlap: they take turns issuing their products),
% -- q_stages (1 or 2 Q buffers: with two, the next work tile's Q is copied while this one runs),
% -- ctas_per_sm (1, or 2 blocks of one consumer warpgroup sharing an SM: one's prologue and
% -- epilogue run under the other's products), exp_poly (0..8: of every 8 column blocks of
% -- scores, how many take exp2 from a polynomial on the FMA pipe rather than the MUFU unit,
% -- which at d 64 is as busy as the tensor cores), lazy_rescale (the softmax's exponent base
% -- moves only when a row's maximum outgrows it by 2^8, so O is rarely rescaled).
% -- persistent: 0 one block per work tile (BM query rows of a batch and head); 1 one block per
% -- SM, each taking every gridDim.x-th tile; 2 one block per SM, tiles after the first taken
% -- from a counter shared by the grid (tile_counter: one int, zeroed by the plan before the launch),
% -- which balances tiles of unequal cost (causal); 3 one block per SM, round r of tiles
% -- [r * gridDim.x, (r + 1) * gridDim.x) dealt forwards when r is even and backwards when odd,
% -- so that heavy and light causal tiles pair up without any shared state.
% -- mask_mod, score_mod, alibi, bias, mask_tensor, mask_ranges: see attn_masks.lua. Element
% -- masks need block classes: 128 x 128 blocks of (query, key) classed 0 (nothing kept: the
% -- key tile is never loaded), 1 (the element masks apply), 2 (all kept), read through the
% -- block_mask arguments, either the caller's (block_mask) or the classifier's
% -- (attn_classify.lua, run by the runtime before this kernel).
% local element_masks = mask_mod ~= "" or mask_tensor or mask_ranges > 0
% local score_terms = alibi or bias ~= "" or score_mod ~= ""
% local dtype = q_dtype -- one element type for q, k, v and out (cuda_mma.lua checks)
% -- bias_tma: bias tiles (BM x BN) come with the key tiles, by TMA into shared memory, in
% -- 128-byte panels of keys with the 128-byte swizzle.
% local bias_es = bias == "f32" and 4 or 2
% local bias_pc = 128 // bias_es
% assert(not bias_tma or (bias ~= "" and tile_n % bias_pc == 0), "bias tiles need tile_n a multiple of 128 bytes of keys")
% local classes = block_mask or element_masks
% assert(not classes or (128 % tile_m == 0 and 128 % tile_n == 0), "block classes need tiles that divide 128")
% assert(varlen == 0 or not classes, "variable lengths with element masks run on the SIMT kernel")
% -- Work tiles of unequal cost run heaviest first (last query rows first).
% local heavy_first = local_mask or classes
% local fused = not softcap and not neg_scale and not score_terms
% local NC = tile_m // 64
% assert(NC >= 1 and NC <= 3 and NC * 64 == tile_m, "tile_m must be 64, 128 or 192")
% assert(warps == 4 * (NC + 1), "warps must be 4 * (1 + tile_m / 64)")
% assert(head_dim_pad % 64 == 0 and head_dim_v_pad % 64 == 0 and head_dim_v_pad <= 256, "head dims must be padded to multiples of 64, dv to at most 256")
% assert(tile_n % 16 == 0 and tile_n <= 256, "tile_n must be a multiple of 16, at most 256")
% assert(stages >= 1 and stages <= 4, "stages must be 1..4")
% assert(q_stages == 1 or q_stages == 2, "q_stages must be 1 or 2")
% assert(not pingpong or (NC == 2 and overlap), "pingpong needs two consumer warpgroups and overlap")
% assert(ctas_per_sm == 1 or (ctas_per_sm == 2 and NC == 1), "two blocks per SM take one consumer warpgroup each")
% assert(exp_poly >= 0 and exp_poly <= 8, "exp_poly must be 0..8")
% -- Registers per thread after reallocation: the producer keeps the least the ISA allows. Two
% -- blocks of 256 threads per SM start with 128 each: 24 + 232 keeps the block's share.
% local regs_consumer = ctas_per_sm == 2 and 232 or ({ 240, 240, 160 })[NC]
% local realloc = NC > 1 or ctas_per_sm == 2
% local dynamic = persistent == 2
% include("cuda_mma.lua")
% include("cuda_hopper.lua")
% include("cuda_attn_common.lua")
% if element_masks or score_terms then
% include("dialect.lua")
% include("attn_masks.lua")
% end
% include("params.lua")
% params_struct(args)
% hopper_wgmma(tile_n)
% if head_dim_v_pad ~= tile_n then hopper_wgmma(head_dim_v_pad) end

#define BM ${tile_m}
#define BN ${tile_n}
#define D ${head_dim_pad}
#define DV ${head_dim_v_pad}
#define STAGES ${stages}
#define Q_STAGES ${q_stages}
#define THREADS ${warps * 32}
% attn_score_macros(not fused)
/* Bytes of one tile in shared memory: 64-column panels of rows x 128 bytes. */
#define Q_BYTES (BM * D * 2)
#define K_BYTES (BN * D * 2)
#define V_BYTES (BN * DV * 2)
% if bias_tma then
#define BIAS_BYTES (BM * BN * ${bias_es})
#define BIAS_PC ${bias_pc} /* keys per 128-byte panel */
% else
#define BIAS_BYTES 0
% end

/* The coordinates of a box at (col, row) of (batch, head) in a tensor map whose three outer
** dimensions the host ordered by stride; perm holds the slot of the row and head dimensions. */
__device__ __forceinline__ void tma_load_tile(u32 dst, const tmap_t *map, u32 bar, int col,
                                              int row, int head, int batch, int perm)
{
    const int ps = perm & 3, ph = (perm >> 2) & 3;
    const int c1 = ps == 0 ? row : ph == 0 ? head : batch;
    const int c2 = ps == 1 ? row : ph == 1 ? head : batch;
    const int c3 = ps == 2 ? row : ph == 2 ? head : batch;
    tma_load4(dst, map, bar, col, c1, c2, c3);
}

/* Copies a tile of `rows` rows and COLS columns as COLS / 64 panels of rows x 128 bytes. */
template <int COLS>
__device__ __forceinline__ void load_panels(u32 dst, const tmap_t *map, u32 bar, int rows,
                                            int row, int head, int batch, int perm)
{
#pragma unroll
    for (int p = 0; p < COLS / 64; p++)
        tma_load_tile(dst + p * rows * 128, map, bar, p * 64, row, head, batch, perm);
}

% if exp_poly > 0 then
%   -- 2^f on [-1/2, 1/2] as 1 + f (c1 + f (c2 + ...)), minimax in relative error with p(0) = 1
%   -- exactly: 4.3e-4 at degree 3, below bf16's rounding of P (2^-9); 3.6e-6 at degree 4 for f16.
%   local coef = dtype == "bf16" and { "0.695766807f", "0.242030516f", "0.0416987501f" }
%       or { "0.693113625f", "0.240207106f", "0.0559768826f", "0.00978291221f" }
/* 2^x on the FMA and integer pipes, to take work off the MUFU unit: x = j + f with j an
** integer (x + 1.5 * 2^23 rounds it into the low mantissa bits) and |f| <= 1/2, 2^f by a
** polynomial, j added to its exponent field. x is clamped to -127, where f = 0, p = 1 and the
** exponent sum is exactly 0.0f, as exp2(-inf) must be for masked scores; below -126 the result
** is only approximately tiny. Rounding is explicit (__fadd_rn) so that nothing is contracted. */
__device__ __forceinline__ float ex2_poly(float x)
{
    x = fmaxf(x, -127.0f);
    const float r = __fadd_rn(x, 12582912.0f);
    const float f = __fsub_rn(x, __fsub_rn(r, 12582912.0f));
    float p = ${coef[#coef]};
%   for i = #coef - 1, 1, -1 do
    p = fmaf(p, f, ${coef[i]});
%   end
    p = fmaf(p, f, 1.0f);
    return __uint_as_float(__float_as_uint(p) + (__float_as_uint(r) << 23));
}
/* exp2 of a score of column block j (keys 8j..8j+7 of the tile): ${exp_poly} of every 8 blocks,
** spread evenly, take the polynomial (j is a compile-time constant once unrolled). */
#define EX2_SCORE(j, x) ((((j) * ${exp_poly}) % 8 + ${exp_poly} >= 8) ? ex2_poly(x) : ex2(x))
% else
#define EX2_SCORE(j, x) ex2(x)
% end

/* Per-thread state of a consumer: the output accumulators and the running row statistics of
** its two rows (g and g + 8 of its warp's 16). Fragment element 4j + 2h + e is row g + 8h,
** column 8j + 2t + e. */
struct consumer_state {
    float o[DV / 2];
    float row_max[2], row_sum[2];
};

/* S = Q K^T for the key tile in ring slot s: issued, not waited for. */
__device__ __forceinline__ void issue_qk(float *sc, u64 q_desc, u64 k_desc, int s)
{
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++)
        wgmma_ss_${tile_n}(sc, q_desc + (((kk / 4) * BM * 128 + (kk % 4) * 32) >> 4),
                   k_desc + ((s * K_BYTES + (kk / 4) * BN * 128 + (kk % 4) * 32) >> 4), kk > 0);
    wgmma_commit();
}

/* O += P V for the value tile in ring slot s: issued, not waited for. */
__device__ __forceinline__ void issue_pv(float *o, u32 (*p)[4], u64 v_desc, int s)
{
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BN / 16; kk++)
        wgmma_rs_${head_dim_v_pad}(o, p[kk], v_desc + ((s * V_BYTES + kk * 16 * 128) >> 4), 1);
    wgmma_commit();
}

/* One tile of scores (keys from n0) into probabilities, in place: scaling, masking where
** need_mask, new row maxima and sums, P = exp2(S - max). Returns in alpha the factor by which O
** must be rescaled once the previous P V has landed. */
__device__ __forceinline__ void softmax_tile(float *sc, consumer_state &st,
                                             float *alpha, bool need_mask, int n0, int warp_row,
                                             int g, int t, int seqlen_k, int shift,
                                             int window_left, int window_right, float score_mul,
                                             float cap_mul${(element_masks or score_terms) and ",\n                                             const mask_ctx &mc, bool need_elem" or ""}${bias_tma and ", u32 bias_tile, int lrow0" or ""})
{
% if not fused then
#pragma unroll
    for (int i = 0; i < BN / 2; i++) {
%   if softcap then
        sc[i] = cap_mul * tanhf(sc[i] * score_mul);
%   else
        sc[i] *= score_mul;
%   end
    }
% end
% if bias_tma then
    /* The bias from shared memory. A thread's two adjacent keys 8j + 2t (+ 1) are one 4- or
    ** 8-byte word of 16-byte chunk cj ^ ct of key panel j / (BIAS_PC / 8), with cj from j and ct
    ** from t; the 128-byte swizzle stores row r's chunk c at c ^ (r % 8). Rows are 128-byte
    ** aligned, so each word's address is the row's base XOR a compile-time chunk. */
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = lrow0 + g + h * 8;
        const u32 base = bias_tile + r * 128 + (((2 * t * ${bias_es} / 16) ^ (r % 8)) << 4) + (2 * t * ${bias_es}) % 16;
#pragma unroll
        for (int j = 0; j < BN / 8; j++) {
            const u32 a = (base ^ (((j % (BIAS_PC / 8)) * ${bias_es // 2}) << 4)) + (j / (BIAS_PC / 8)) * (BM * 128);
            float b0, b1;
%   if bias == "f32" then
            asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(b0), "=f"(b1) : "r"(a));
%   elseif dtype == "bf16" then
            u32 w;
            asm volatile("ld.shared.b32 %0, [%1];" : "=r"(w) : "r"(a));
            b0 = __uint_as_float(w << 16);
            b1 = __uint_as_float(w & 0xffff0000u);
%   else
            asm volatile("{.reg .b16 lo, hi;\n\tld.shared.v2.b16 {lo, hi}, [%2];\n\t"
                         "cvt.f32.f16 %0, lo;\n\tcvt.f32.f16 %1, hi;}"
                         : "=f"(b0), "=f"(b1) : "r"(a));
%   end
            sc[4 * j + 2 * h] += b0 * (1.0f / F_LN2);
            sc[4 * j + 2 * h + 1] += b1 * (1.0f / F_LN2);
        }
    }
% end
% if alibi or score_mod ~= "" or (bias ~= "" and not bias_tma) then
    /* ALiBi, bias and score_mod, on the scores of rows and keys inside the tensors. */
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int row = warp_row + g + h * 8;
#pragma unroll
        for (int j = 0; j < BN / 8; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int key = n0 + 2 * t + 8 * j + e;
                if (row < mc.sq && key < mc.sk)
                    sc[4 * j + 2 * h + e] = fj_score(mc, sc[4 * j + 2 * h + e], row, key);
            }
    }
% end
% if element_masks then
    /* A block of class 1: the element masks apply. Key by key, so that what a key's masks
    ** read (its ranges) serves both rows. */
    if (need_elem) {
#pragma unroll
        for (int j = 0; j < BN / 8; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int key = n0 + 2 * t + 8 * j + e;
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int row = warp_row + g + h * 8;
                    if (row < mc.sq && key < mc.sk && !fj_keeps(mc, row, key))
                        sc[4 * j + 2 * h + e] = NEG_INF;
                }
            }
    }
% end
    if (need_mask) {
        /* Bounds relative to this thread's first column, so that each element compares a
        ** compile-time column offset: key = n0 + 2t + 8j + e. Without a left window edge
        ** (causal) only the right one is compared. */
        const int col0 = n0 + 2 * t;
% local function mask_band(left)
#pragma unroll
        for (int h = 0; h < 2; h++) {
% attn_visible_cols("warp_row + g + h * 8", left)
#pragma unroll
            for (int j = 0; j < BN / 8; j++)
#pragma unroll
                for (int e = 0; e < 2; e++)
                    if (j * 8 + e > hi || j * 8 + e < lo)
                        sc[4 * j + 2 * h + e] = NEG_INF;
        }
% end
% if local_mask then
        if (window_left < 0) {
% mask_band(false)
        } else {
% mask_band(true)
        }
% else
% mask_band(false)
% end
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float r[BN / 8];
#pragma unroll
        for (int j = 0; j < BN / 8; j++)
            r[j] = fmaxf(sc[4 * j + 2 * h], sc[4 * j + 2 * h + 1]);
        /* Pairwise trees: short dependency chains, any number of blocks. */
#pragma unroll
        for (int w = 1; w < BN / 8; w *= 2)
#pragma unroll
            for (int j = 0; j + w < BN / 8; j += 2 * w)
                r[j] = fmaxf(r[j], r[j + w]);
        float mx = quad_max(fmaxf(st.row_max[h], r[0]));
% if lazy_rescale then
        /* The exponent base moves only when the row's maximum has grown past it by more than
        ** 2^8 (a row's first key always moves it from -inf); below that, P may reach 256 and
        ** its row sum grows by as much, both well inside f32 and bf16/f16's ranges, and O
        ** keeps its scale. (-inf minus -inf is NaN: a row with no key yet stays put.) */
        if (!(TO_LOG2(mx) - TO_LOG2(st.row_max[h]) > 8.0f))
            mx = st.row_max[h];
% end
        /* A row with no key yet keeps max -inf; subtracting 0 then gives exp2(-inf) = 0. */
        const float base = mx == NEG_INF ? 0.0f : TO_LOG2(mx);
        alpha[h] = ex2(TO_LOG2(st.row_max[h]) - base);
        st.row_max[h] = mx;
#pragma unroll
        for (int j = 0; j < BN / 8; j++) {
#pragma unroll
            for (int e = 2 * h; e < 2 * h + 2; e++)
% if fused then
                sc[4 * j + e] = EX2_SCORE(j, fmaf(sc[4 * j + e], score_mul, -base));
% else
                sc[4 * j + e] = EX2_SCORE(j, sc[4 * j + e] - base);
% end
            r[j] = sc[4 * j + 2 * h] + sc[4 * j + 2 * h + 1];
        }
#pragma unroll
        for (int w = 1; w < BN / 8; w *= 2)
#pragma unroll
            for (int j = 0; j + w < BN / 8; j += 2 * w)
                r[j] += r[j + w];
        st.row_sum[h] = st.row_sum[h] * alpha[h] + r[0];
    }
}

/* P as the 16-bit A fragments of P V: two n8 accumulator blocks are one k16 fragment. */
__device__ __forceinline__ void pack_p(const float *sc, u32 (*p)[4])
{
#pragma unroll
    for (int kk = 0; kk < BN / 16; kk++) {
        p[kk][0] = pack2(sc[8 * kk + 0], sc[8 * kk + 1]);
        p[kk][1] = pack2(sc[8 * kk + 2], sc[8 * kk + 3]);
        p[kk][2] = pack2(sc[8 * kk + 4], sc[8 * kk + 5]);
        p[kk][3] = pack2(sc[8 * kk + 6], sc[8 * kk + 7]);
    }
}

__device__ __forceinline__ void rescale(consumer_state &st, const float *alpha)
{
% if lazy_rescale then
    /* No row of the warp moved its base (the common case): O keeps its scale. */
    if (!__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f))
        return;
% end
#pragma unroll
    for (int j = 0; j < DV / 8; j++) {
        st.o[4 * j + 0] *= alpha[0];
        st.o[4 * j + 1] *= alpha[0];
        st.o[4 * j + 2] *= alpha[1];
        st.o[4 * j + 3] *= alpha[1];
    }
}

/* A block's unit of work: BM query rows of one (batch, head), with the key tiles [nb_lo, nb_hi)
** its rows may see; its sequence's lengths, and with variable lengths its first rows in the
** packed tensors (tb: the batch coordinate in the tensor maps, 0 for packed tensors). */
struct work_tile {
    int m0, head, batch, head_kv, nb_lo, nb_hi, seqlen_q, seqlen_k, q_first, k_first, tb;
};

extern "C" __global__ void __launch_bounds__(THREADS, ${ctas_per_sm})
fj_attn_fwd(
% params_arg(args)
)
{
% params_unpack(args, "P")
% params_unpack(params_block(args, "fwd"), "P.fwd")
    extern __shared__ __align__(1024) unsigned char smem[];
    /* The 128-byte swizzle repeats every 1024 bytes: panels start on such a boundary. */
    const u32 sQ = (smem_addr(smem) + 1023) & ~1023u;
    const u32 sK = sQ + Q_STAGES * Q_BYTES;
    const u32 sV = sK + STAGES * K_BYTES;
    const u32 sB = sV + STAGES * V_BYTES; /* bias tiles, with bias_tma */
    const u32 bars = sB + STAGES * BIAS_BYTES;
/* Barriers of the Q buffers (two reserved), the key/value ring, the tile announcements. */
#define Q_FULL(k) (bars + 8 * (k))
#define Q_EMPTY(k) (bars + 8 * (2 + (k)))
#define K_FULL(s) (bars + 8 * (4 + (s)))
#define K_EMPTY(s) (bars + 8 * (4 + STAGES + (s)))
#define V_FULL(s) (bars + 8 * (4 + 2 * STAGES + (s)))
#define V_EMPTY(s) (bars + 8 * (4 + 3 * STAGES + (s)))
/* The two-slot ring through which the producer announces dynamically scheduled tiles. */
#define TILE_FULL(k) (bars + 8 * (4 + 4 * STAGES + (k)))
#define TILE_EMPTY(k) (bars + 8 * (6 + 4 * STAGES + (k)))
#define TILE_SLOT(k) (bars + 8 * (8 + 4 * STAGES) + 4 * (k))
/* Q tile n (counted over the block's work tiles that load one): its buffer and phase. */
#define Q_SLOT(n) ((n) % Q_STAGES)
#define Q_PHASE(n) (((n) / Q_STAGES) & 1)
/* The block classes of a work tile's query rows, by key tile. */
#define CLASS_ROW(wt) (P.fwd.mask.block_mask + (wt).batch * P.fwd.mask.blocks_sb + (wt).head * P.fwd.mask.blocks_sh + ((wt).m0 / 128) * P.fwd.mask.blocks_sq)
#define CLASS_OF(row, nb) __ldg((row) + (nb) * BN / 128)
/* The block's next work tile after w under a static schedule: every gridDim.x-th, or zigzag
** (persistent = 3: the block's position in round r is blockIdx.x, or gridDim.x - 1 - blockIdx.x
** when r is odd). */
% if persistent == 3 then
#define NEXT_TILE(w) ((((w) / (int)gridDim.x + 1) & 1) ? ((w) / (int)gridDim.x + 2) * (int)gridDim.x - 1 - (int)blockIdx.x \
                                                     : ((w) / (int)gridDim.x + 1) * (int)gridDim.x + (int)blockIdx.x)
% else
#define NEXT_TILE(w) ((w) + (int)gridDim.x)
% end
/* Ring position j (counted over all the block's key tiles): slot and phase. */
#define SLOT(j) ((j) % STAGES)
#define PHASE(j) (((j) / STAGES) & 1)

% if element_masks and head_dim_v_pad > 128 then
    /* (Broadcast as below, this kernel spilled 4 bytes at d 256.) */
    const int tid = threadIdx.x, wg = tid / 128;
% else
    /* The warpgroup index, broadcast from lane 0 so that ptxas knows it is warp-uniform and
    ** keeps what derives from it (descriptors, loop bounds) in uniform registers: the wgmma
    ** descriptors no longer go through vector registers (causal d 128 +4-8 %). */
    const int tid = threadIdx.x, wg = __shfl_sync(0xffffffffu, tid / 128, 0);
% end
    /* The block takes work tiles blockIdx.x, + gridDim.x, ...: one when the grid covers every
    ** tile, several when it is persistent (a block per SM), which overlaps a tile's last
    ** products and stores with the next tile's loads. */
    const int m_blocks = (seqlen_q + BM - 1) / BM; /* with variable lengths: of the longest */
    const int work_count = m_blocks * heads_q * batches;

    /* The w-th work tile. Query blocks run fastest, as a grid of one block per tile would run
    ** them; with a band, from the last (the heaviest) down, so causal work is balanced. With a
    ** bias or mask tensor (most often one for all batches) the batches run fastest instead, so
    ** that the blocks which read the same rows of it run together and share them through L2. */
    auto work_at = [&](int w) {
% if bias ~= "" or mask_tensor then
        const int batch = w % batches, mb = (w / batches) % m_blocks, head = w / batches / m_blocks;
% else
        const int mb = w % m_blocks, head = (w / m_blocks) % heads_q, batch = w / m_blocks / heads_q;
% end
% if heavy_first then
        const int m0 = (m_blocks - 1 - mb) * BM;
% else
        const int m0 = mb * BM;
% end
        work_tile wt{m0, head, batch, head / (heads_q / heads_kv), 0, 0, seqlen_q, seqlen_k, 0, 0, batch};
% if varlen > 0 then
        /* The sequence's first rows in the packed tensors and its lengths: the caller's device
        ** data, clamped into the tensors and to the maxima. */
        wt.q_first = imin(imax(__ldg(cu_seqlens_q + batch), 0), total_q);
        wt.k_first = imin(imax(__ldg(cu_seqlens_k + batch), 0), total_k);
        wt.seqlen_q = imin(imax(imin(__ldg(cu_seqlens_q + batch + 1), total_q) - wt.q_first, 0), seqlen_q);
        wt.seqlen_k = imin(imax(imin(__ldg(cu_seqlens_k + batch + 1), total_k) - wt.k_first, 0), seqlen_k);
%   if varlen == 2 then
        wt.seqlen_k = imin(wt.seqlen_k, imax(__ldg(seqused_k + batch), 0));
%   end
        wt.tb = 0;
% end
        {
            const int seqlen_q = wt.seqlen_q, seqlen_k = wt.seqlen_k;
% attn_key_band()
            wt.nb_lo = nb_lo;
            wt.nb_hi = m0 < seqlen_q ? nb_hi : nb_lo; /* rows past a short sequence: no work */
        }
        return wt;
    };

    if (tid == 0) {
        for (int k = 0; k < Q_STAGES; k++) {
            mbar_init(Q_FULL(k), 1);
            mbar_init(Q_EMPTY(k), ${4 * NC});
        }
#pragma unroll
        for (int s = 0; s < STAGES; s++) {
            mbar_init(K_FULL(s), 1);
            mbar_init(V_FULL(s), 1);
            mbar_init(K_EMPTY(s), ${4 * NC}); /* one arrival per consumer warp */
            mbar_init(V_EMPTY(s), ${4 * NC});
        }
% if dynamic then
        for (int k = 0; k < 2; k++) {
            mbar_init(TILE_FULL(k), 1);
            mbar_init(TILE_EMPTY(k), ${4 * NC});
        }
% end
        mbar_init_fence();
    }
    __syncthreads();

    if (wg == 0) {
        /* ---- producer ---- */
% if realloc then
        regs_dec<24>();
% end
        if (tid == 0) {
            tma_prefetch_map(&P.tm_k);
            tma_prefetch_map(&P.tm_v);
% if bias_tma then
            tma_prefetch_map(&P.tm_bias);
% end
            int it = 0, qn = 0; /* key tiles and Q tiles loaded so far */
            for (int w = blockIdx.x, n = 0;; n++) {
% if dynamic then
                /* Announce the tile (or the end) to the consumers. */
                mbar_wait(TILE_EMPTY(n & 1), ((n >> 1) & 1) ^ 1);
                st_shared_u32(TILE_SLOT(n & 1), (u32)w);
                mbar_arrive(TILE_FULL(n & 1));
% end
                if (w >= work_count)
                    break;
                const work_tile wt = work_at(w);
% if classes then
                const int *cls_row = CLASS_ROW(wt);
% end
                /* Q comes with the first key tile: with no key visible the consumers only store
                ** zeros. */
                bool q_loaded = false;
                for (int nb = wt.nb_hi - 1; nb >= wt.nb_lo; nb--) {
% if classes then
                    const int cls = CLASS_OF(cls_row, nb);
                    if (cls == 0)
                        continue;
% end
                    if (!q_loaded) {
                        mbar_wait(Q_EMPTY(Q_SLOT(qn)), Q_PHASE(qn) ^ 1);
                        mbar_arrive_expect(Q_FULL(Q_SLOT(qn)), Q_BYTES);
                        load_panels<D>(sQ + Q_SLOT(qn) * Q_BYTES, &P.tm_q, Q_FULL(Q_SLOT(qn)), BM,
                                       wt.q_first + wt.m0, wt.head, wt.tb, perm_q);
                        qn++;
                        q_loaded = true;
                    }
                    const int s = SLOT(it);
                    const u32 phase = PHASE(it++);
                    mbar_wait(K_EMPTY(s), phase ^ 1);
                    mbar_arrive_expect(K_FULL(s), K_BYTES + BIAS_BYTES);
                    load_panels<D>(sK + s * K_BYTES, &P.tm_k, K_FULL(s), BN, wt.k_first + nb * BN,
                                   wt.head_kv, wt.tb, perm_k);
% if bias_tma then
                    /* The bias of these rows and keys: broadcast dimensions at coordinate 0. */
#pragma unroll
                    for (int p = 0; p < BN / BIAS_PC; p++)
                        tma_load4(sB + s * BIAS_BYTES + p * BM * 128, &P.tm_bias, K_FULL(s),
                                  nb * BN + p * BIAS_PC, wt.m0, P.fwd.mask.bias_sh ? wt.head : 0,
                                  P.fwd.mask.bias_sb ? wt.batch : 0);
% end
                    mbar_wait(V_EMPTY(s), phase ^ 1);
                    mbar_arrive_expect(V_FULL(s), V_BYTES);
                    load_panels<DV>(sV + s * V_BYTES, &P.tm_v, V_FULL(s), BN, wt.k_first + nb * BN,
                                    wt.head_kv, wt.tb, perm_v);
                }
% if dynamic then
                w = gridDim.x + atomicAdd(tile_counter, 1);
% else
                w = NEXT_TILE(w);
% end
            }
        }
        return;
    }

    /* ---- consumers ---- */
% if realloc then
    regs_inc<${regs_consumer}>();
% end
    const int c = wg - 1, warp = (tid % 128) / 32, lane = tid % 32;
    const int g = lane / 4, t = lane % 4; /* row group and column pair of the fragments */

    /* Descriptors: Q and K K-major (k steps of 32 bytes inside a panel), V N-major (panels
    ** BN * 128 bytes apart, k steps of 16 rows). */
    const u64 q_desc0 = gmma_desc(sQ + 64 * c * 128, 16, 1024); /* Q buffer 0 */
    const u64 k_desc = gmma_desc(sK, 16, 1024);
    const u64 v_desc = gmma_desc(sV, BN * 128, 1024);

% if pingpong then
    /* The two consumer warpgroups take turns issuing a round of products (named barriers 1 and
    ** 2, FA3's ping-pong), so that one's softmax runs while the tensor cores serve the other.
    ** In each work tile warpgroup 1 hands the first turn to warpgroup 0 and skips the hand-over
    ** after its last round, so every arrival is matched. */
#define TURN_WAIT() asm volatile("bar.sync %0, 256;" ::"r"(1 + c) : "memory")
#define TURN_PASS() asm volatile("bar.arrive %0, 256;" ::"r"(2 - c) : "memory")
% else
#define TURN_WAIT()
#define TURN_PASS()
% end

    consumer_state st;
    float sc[BN / 2];
    u32 p[BN / 16][4];
    float alpha[2];
    int it = 0, qn = 0; /* key tiles and Q tiles consumed so far, as the producer counts them */
    for (int w = blockIdx.x, n = 0;; n++) {
% if dynamic then
        mbar_wait(TILE_FULL(n & 1), (n >> 1) & 1);
        w = (int)ld_shared_u32(TILE_SLOT(n & 1));
        warp_arrive(TILE_EMPTY(n & 1));
% end
        if (w >= work_count)
            break;
        const work_tile wt = work_at(w);
        /* This sequence's lengths (the arguments are the maxima with variable lengths). */
        const int seqlen_q = wt.seqlen_q, seqlen_k = wt.seqlen_k;
% if local_mask then
        const int shift = seqlen_k - seqlen_q; /* keys align with queries bottom-right */
% else
        const int shift = 0; /* no band: the masks only cut the tensor's end */
% end
% if classes then
        /* The key tiles the producer loads: those of classes 1 and 2, counted by the warp, then
        ** walked from the last down as the producer walks them (nb, its class). */
        const int *cls_row = CLASS_ROW(wt);
        int tiles = 0;
        for (int k = wt.nb_lo + lane; k < wt.nb_hi; k += 32)
            tiles += CLASS_OF(cls_row, k) != 0;
#pragma unroll
        for (int o = 16; o > 0; o /= 2)
            tiles += __shfl_xor_sync(0xffffffffu, tiles, o);
        int nb = wt.nb_hi, cls = 0;
        auto next_tile = [&]() {
            do
                cls = --nb >= wt.nb_lo ? CLASS_OF(cls_row, nb) : 1;
            while (cls == 0);
        };
        next_tile();
% else
        const int nb_hi = wt.nb_hi, tiles = wt.nb_hi - wt.nb_lo;
% end
        const int wg_row = wt.m0 + 64 * c; /* first query row of this warpgroup */
        const int warp_row = wg_row + 16 * warp;
#pragma unroll
        for (int i = 0; i < DV / 2; i++)
            st.o[i] = 0.0f;
        st.row_max[0] = st.row_max[1] = NEG_INF;
        st.row_sum[0] = st.row_sum[1] = 0.0f;
% if element_masks or score_terms then
        MASK_CTX(mc, P.fwd.mask, wt.batch, wt.head, seqlen_q, seqlen_k);
% end

        /* Whether the tile of keys from n0 needs per-element masking for this warpgroup. */
        auto needs_mask = [&](int n0) {
            bool m = n0 + BN > seqlen_k;
% if local_mask then
            if (window_right >= 0)
                m |= n0 + BN - 1 > wg_row + shift + window_right;
            if (window_left >= 0)
                m |= n0 < wg_row + 63 + shift - window_left;
% end
            return m;
        };
        /* Tile i's scores have landed in sc: hand its key slot back, then softmax them. */
        auto take_scores = [&](int i) {
            fence_regs<BN / 2>(sc);
% if classes then
            const int n0 = nb * BN;
            const bool need_elem = cls == 1;
            next_tile();
% else
            const int n0 = (nb_hi - 1 - i) * BN;
% end
% if not bias_tma then
            warp_arrive(K_EMPTY(SLOT(it + i)));
% end
            softmax_tile(sc, st, alpha, needs_mask(n0), n0, warp_row, g, t, seqlen_k, shift,
                         window_left, window_right, score_mul, cap_mul${(element_masks or score_terms) and ", mc, " .. (element_masks and "need_elem" or "false") or ""}${bias_tma and ", sB + SLOT(it + i) * BIAS_BYTES, warp_row - wt.m0" or ""});
% if bias_tma then
            /* The slot's bias has been read: K and bias go back together. */
            warp_arrive(K_EMPTY(SLOT(it + i)));
% end
        };
        /* The product of tile i into O has landed: hand its value slot back. */
        auto take_product = [&](int i) {
            fence_regs<DV / 2>(st.o);
            warp_arrive(V_EMPTY(SLOT(it + i)));
        };
        /* The last S = Q K^T of this work tile has landed: Q's buffer may take the next. */
        auto release_q = [&]() {
            warp_arrive(Q_EMPTY(Q_SLOT(qn)));
            qn++;
        };

        /* This work tile's Q buffer. */
        const u64 q_desc = q_desc0 + ((Q_SLOT(qn) * Q_BYTES) >> 4);
        if (tiles > 0)
            mbar_wait(Q_FULL(Q_SLOT(qn)), Q_PHASE(qn));
% if varlen > 0 then
        /* Packed sequences: the rows of the first (last) key tile past this sequence's keys
        ** hold another sequence's values, or anything (seqused_k). Their P is 0, but 0 * NaN is
        ** not, so the consumers zero them in shared memory before any product reads them. */
        if (tiles > 0 && nb_hi * BN > seqlen_k) {
            mbar_wait(V_FULL(SLOT(it)), PHASE(it));
            const int r0 = imax(seqlen_k - (nb_hi - 1) * BN, 0), per_panel = (BN - r0) * 8;
            for (int i = tid - 128; i < per_panel * (DV / 64); i += ${128 * NC})
                st_shared_zero16(sV + SLOT(it) * V_BYTES + (i / per_panel) * (BN * 128) + r0 * 128 +
                                 (i % per_panel) * 16);
            fence_proxy_async();
            asm volatile("bar.sync 3, ${128 * NC};" ::: "memory");
        }
% end
% if pingpong then
        if (tiles > 0 && c == 1)
            TURN_PASS();
% end
% if overlap then
        /* Software-pipelined (FA3's intra-warpgroup overlap): the softmax of tile i runs while
        ** the tensor cores do P V of tile i - 1. Tiles run from the last key tile down. */
        if (tiles > 0) {
            TURN_WAIT();
            mbar_wait(K_FULL(SLOT(it)), PHASE(it));
            issue_qk(sc, q_desc, k_desc, SLOT(it));
            TURN_PASS();
            wgmma_wait<0>();
            take_scores(0);
            pack_p(sc, p);
        }
        for (int i = 1; i < tiles; i++) {
            const int j = it + i;
            TURN_WAIT();
            mbar_wait(K_FULL(SLOT(j)), PHASE(j));
            issue_qk(sc, q_desc, k_desc, SLOT(j));
            mbar_wait(V_FULL(SLOT(j - 1)), PHASE(j - 1));
            issue_pv(st.o, p, v_desc, SLOT(j - 1));
            TURN_PASS();
            wgmma_wait<1>(); /* S of this tile; P V of the last may still run */
            take_scores(i);
            wgmma_wait<0>();
            fence_regs<BN / 4>(&p[0][0]); /* P stays untouched until its product has landed */
            take_product(i - 1);
            /* P is packed only now that the last product has read it: a second P register set
            ** copied over the first made ptxas serialise every wgmma (C7513). */
            pack_p(sc, p);
            rescale(st, alpha);
            /* Pinned here: moved past the next wgmma.fence, these writes of wgmma inputs would
            ** make ptxas serialise every wgmma. */
            fence_regs<DV / 2>(st.o);
            fence_regs<BN / 4>(&p[0][0]);
        }
        if (tiles > 0) {
            const int j = it + tiles - 1;
            release_q();
            TURN_WAIT();
            mbar_wait(V_FULL(SLOT(j)), PHASE(j));
            issue_pv(st.o, p, v_desc, SLOT(j));
            if (c == 0)
                TURN_PASS();
            wgmma_wait<0>();
            take_product(tiles - 1);
        }
% else
%   if classes then
        const int i_first = 0, i_end = tiles;
%   else
        /* The block's tiles [0, tiles) run from key tile nb_hi - 1 down; this warpgroup's rows
        ** see only [i_first, i_end) of them (192-row blocks span a band wider than each
        ** warpgroup's: at 2k causal queries a warpgroup needs 89 % of the block's tiles), and
        ** none when all its rows lie past the sequence's end. The rest it hands back untouched,
        ** outside the main loop, whose branches then stay free of per-warpgroup conditions
        ** (one inside it, even made warp-uniform by a vote, cost 10 % at d 64). */
        int i_first = wg_row >= seqlen_q ? tiles : 0, i_end = tiles;
%     if local_mask then
        const int wg_last = imin(wg_row + 63, seqlen_q - 1);
        if (window_right >= 0) /* keys up to wg_last + shift + window_right */
            i_first = imax(i_first, nb_hi - 1 - floor_div(wg_last + shift + window_right, BN));
        if (window_left >= 0) /* keys from wg_row + shift - window_left */
            i_end = imin(i_end, nb_hi - floor_div(wg_row + shift - window_left, BN));
%     end
        i_first = imin(i_first, tiles);
        i_end = imax(imin(i_end, tiles), i_first);
%   end
        /* A skipped slot is released once filled, so that each arrival counts in its own phase
        ** of the empty barriers. */
        auto hand_back = [&](int i) {
            const int j = it + i;
            mbar_wait(K_FULL(SLOT(j)), PHASE(j));
            warp_arrive(K_EMPTY(SLOT(j)));
            mbar_wait(V_FULL(SLOT(j)), PHASE(j));
            warp_arrive(V_EMPTY(SLOT(j)));
        };
        for (int i = 0; i < i_first; i++)
            hand_back(i);
        for (int i = i_first; i < i_end; i++) {
            const int j = it + i;
            mbar_wait(K_FULL(SLOT(j)), PHASE(j));
            issue_qk(sc, q_desc, k_desc, SLOT(j));
            wgmma_wait<0>();
            take_scores(i);
            if (i == i_end - 1)
                release_q();
            pack_p(sc, p);
            rescale(st, alpha);
            mbar_wait(V_FULL(SLOT(j)), PHASE(j));
            issue_pv(st.o, p, v_desc, SLOT(j));
            wgmma_wait<0>();
            take_product(i);
        }
        for (int i = i_end; i < tiles; i++)
            hand_back(i);
        if (i_first == i_end && tiles > 0)
            release_q(); /* no S = Q K^T ran */
% end
        it += tiles;
% if not dynamic then
        w = NEXT_TILE(w);
% end

        /* Normalise and store; a row that saw no key gets 0 and lse -inf. */
        elem_t *o_tile = out + wt.batch * o_sb + wt.head * o_sh + (long long)wt.q_first * o_ss;
% if write_lse then
        float *l_tile = lse + wt.batch * l_sb + wt.head * l_sh + (long long)wt.q_first * l_ss;
% end
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const float sum = quad_sum(st.row_sum[h]);
            const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
            const int row = warp_row + g + h * 8;
% if not bias_tma then
            /* A quad holds 8 consecutive columns of its row per j, two per thread. A 4 x 4
            ** transpose by shuffles (xor 1, then xor 2) hands thread t the whole 16-byte chunk
            ** j = 4m + t, so that each store of the warp writes 64 contiguous bytes of each of
            ** its 8 rows rather than 16 (+4-17 % at 512-1k keys). Every lane shuffles; the
            ** bounds apply to the stores. (With the bias by TMA these stores measured 10-15 %
            ** slower than the plain ones below, d 128, 8k keys; cause not found.) */
#pragma unroll
            for (int m = 0; m < DV / 32; m++) {
                u32 w[4];
#pragma unroll
                for (int u = 0; u < 4; u++)
                    w[u] = pack2(st.o[4 * (4 * m + u) + 2 * h] * inv,
                                 st.o[4 * (4 * m + u) + 2 * h + 1] * inv);
                const bool odd = t & 1, high = t & 2;
                u32 r0 = __shfl_xor_sync(0xffffffffu, odd ? w[0] : w[1], 1);
                u32 r1 = __shfl_xor_sync(0xffffffffu, odd ? w[2] : w[3], 1);
                /* Now even t holds chunks 0 and 2 of lanes t, t + 1; odd t chunks 1 and 3 of
                ** lanes t - 1, t (selects: an index that varies by lane would go to the stack). */
                w[0] = odd ? r0 : w[0];
                w[1] = odd ? w[1] : r0;
                w[2] = odd ? r1 : w[2];
                w[3] = odd ? w[3] : r1;
                r0 = __shfl_xor_sync(0xffffffffu, high ? w[0] : w[2], 2);
                r1 = __shfl_xor_sync(0xffffffffu, high ? w[1] : w[3], 2);
                const uint4 chunk = high ? make_uint4(r0, r1, w[2], w[3]) : make_uint4(w[0], w[1], r0, r1);
                const int col = 8 * (4 * m + t);
                if (row < seqlen_q && col < head_dim_v)
                    *(uint4 *)(o_tile + (long long)row * o_ss + col) = chunk;
            }
% else
            if (row < seqlen_q) {
#pragma unroll
                for (int j = 0; j < DV / 8; j++) {
                    const int col = j * 8 + 2 * t;
                    if (col < head_dim_v)
                        *(u32 *)(o_tile + (long long)row * o_ss + col) =
                            pack2(st.o[4 * j + 2 * h] * inv, st.o[4 * j + 2 * h + 1] * inv);
                }
            }
% end
% if write_lse then
            if (row < seqlen_q && t == 0)
                l_tile[row * l_ss] = sum > 0.0f ? (TO_LOG2(st.row_max[h]) + lg2(sum)) * 0.693147180559945309f : NEG_INF;
% end
        }
    }
}
