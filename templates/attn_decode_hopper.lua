% -- Parts of Hopper's two decode kernels (attn_decode_wgmma.cu.lua, attn_decode_seesaw.cu.lua),
% -- which both give 64 packed rows to two warpgroups, each holding O's rows r0 = warp * 16 + g
% -- and r1 = r0 + 8 (the wgmma accumulator layout) for half of the value columns (DVH, `half`).
% -- Include after sequence.lua; the emitted code uses the caller's locals named below.
%
/* Lanes lane, lane + 32, ... copy the 16-byte pieces of row r of a swizzled tile of `rows` rows
** (cuda_hopper.lua's swizzled_chunk) from src by cp.async: zeros past `dims` of the COLS
** columns and where the row is not `in` (`any`, a readable address, stands in for src there).
** STREAM: read once (evict first). */
template <int COLS, bool STREAM>
__device__ __forceinline__ void copy_row(u32 tile, int rows, int r, const elem_t *src, bool in,
                                         int dims, const elem_t *any, int lane)
{
    for (int j = lane; j < COLS / 8; j += 32) {
        const bool ok = in && j * 8 < dims;
        const u32 dst = swizzled_chunk(tile, rows, r, j);
        if constexpr (STREAM)
            cp_async16_stream(dst, ok ? src + j * 8 : any, ok ? 16 : 0);
        else
            cp_async16(dst, ok ? src + j * 8 : any, ok ? 16 : 0);
    }
}

/* Zeroes COLS columns from 16-byte chunk chunk0 of rows [from, ROWS) of a swizzled tile of ROWS
** rows, a warpgroup's 128 threads (ti) 16 bytes at a time, and orders the zeros before wgmma's
** reads: the rows of a last tile past the sequence's keys, whose P is 0 but whose values may not
** be finite (0 times NaN is not 0). */
template <int ROWS, int COLS>
__device__ __forceinline__ void zero_rows(u32 tile, int from, int chunk0, int ti)
{
    constexpr int PIECES = COLS / 8; /* 16-byte pieces of a row's columns */
    for (int i = ti; i < (ROWS - from) * PIECES; i += 128)
        st_shared_zero16(swizzled_chunk(tile, ROWS, from + i / PIECES, chunk0 + i % PIECES));
    fence_proxy_async();
}

% -- decode_copy_q(first, step): the query rows of the block's BM packed rows into the swizzled
% -- tile at sQ by cp.async (D columns), a warp's lanes a row's pieces, rows first, first + step,
% -- ...: packed row r is query head head_kv * qgroup + (g0 + r) / seqlen_q, position
% -- (g0 + r) % seqlen_q; zeros past the rows and the head dim.
% function decode_copy_q(first, step)
    for (int r = ${first}; r < BM; r += ${step}) {
        const int pr = g0 + r;
        const bool ok = pr < rows;
        const elem_t *src = q + (I64)(ok ? pr % seqlen_q : 0) * q_ss +
                            (I64)(head_kv * qgroup + (ok ? pr / seqlen_q : 0)) * q_sh;
        copy_row<D, false>(sQ, BM, r, src, ok, head_dim, q, lane);
    }
% end
%
% -- decode_hopper_opening(): the kernel body's start: the decode block P (the tensor-map block
% -- T's), with `partial` the merge's early launch, and `base` (u32) / `smem` (a pointer), the
% -- dynamic shared memory from its first 1024-byte boundary (the swizzle's atoms; the host's
% -- shared_bytes count 1023 bytes of slack).
% function decode_hopper_opening()
    const fj_decode_params &P = T.dec;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
%   if partial then
    /* The merge of the splits may launch once every block has started (attn_merge.lua). */
    grid_launch_next();
%   end
    const u32 base = (smem_addr(smem_raw) + 1023) & ~1023u;
    unsigned char *smem = smem_raw + (base - smem_addr(smem_raw));
% end
%
% -- decode_row_positions(): qpos[2], the query positions of rows r0 and r1 (with local_mask:
% -- the band is relative to them; declares nothing without).
% function decode_row_positions()
%   if local_mask then
    /* The rows' query positions, which the band is relative to. */
    const int qpos[2] = {g0 + r0 < rows ? (g0 + r0) % seqlen_q : 0,
                         g0 + r1 < rows ? (g0 + r1) % seqlen_q : 0};
%   end
% end
%
% -- decode_scores(acc, blocks): the accumulators acc[blocks][4] of S over keys n0 + 8 j + ...
% -- (n0 and mx[2], at -inf, declared by the caller) in log2 units (soft-capped); keys past the
% -- split, and (causal, windows) outside the row's band, at -inf; the rows' maxima in mx. Only a
% -- tile that reaches outside the keys every row sees ([full_lo, full_hi]: the kernel's
% -- decode_block passes full_band) is masked key by key: the others, most of a long band's,
% -- skip the comparisons.
% function decode_scores(acc, blocks)
        if (n0 >= full_lo && n0 + 8 * ${blocks} - 1 <= full_hi) {
% score_loop(acc, blocks, false)
        } else {
% score_loop(acc, blocks, true)
        }
        mx[0] = quad_max(mx[0]);
        mx[1] = quad_max(mx[1]);
% end
% -- score_loop(acc, blocks, masked): decode_scores' loop over the tile, with or without the
% -- keys' mask.
% function score_loop(acc, blocks, masked)
#pragma unroll
            for (int j = 0; j < ${blocks}; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
%   if softcap then
                    float x = cap_mul * tanhf(${acc}[j][e] * score_mul);
%   else
                    float x = ${acc}[j][e] * score_mul;
%   end
%   if masked then
                    const int key = n0 + 8 * j + 2 * t + (e % 2);
                    const bool seen = ${decode_seen("key", "qpos[e / 2]")};
                    x = seen ? x : NEG_INF;
%   end
                    ${acc}[j][e] = x;
                    mx[e / 2] = fmaxf(mx[e / 2], x);
                }
% end
%
% -- decode_halves_store(sums, bar, stage, room): the end: the rows' sums (row_sum, each thread's
% -- part) over the quad and both warpgroups (through sums[2][64] in shared memory and named
% -- barrier bar of both), then O normalised and stored (or, with `partial`, the split's state;
% -- row_max the rows' maximum in log2 units). Natural-log log-sum-exp; a row that saw no key
% -- gets 0 and -inf. O leaves through shared memory at `stage` (a generic pointer to `room`
% -- bytes that no one reads once both warpgroups are past their last tile: Q's panels and the
% -- ring): the rows (as many as fit, 64, 32 or 16 a round) staged with their offsets in O, then
% -- each staged row stored whole by the block's 8 warps, 128 columns a warp at a time, a lane's
% -- columns 32 apart (stores of consecutive columns, four loads in flight). Each thread storing
% -- its accumulators' scattered pairs itself, a long unrolled run of stores, took 5 us at the
% -- end of an MLA block, and 12 us with the f32 states of splits (H200, bench/RESULTS.md).
% function decode_halves_store(sums, bar, stage, room)
    row_sum[0] = quad_sum(row_sum[0]);
    row_sum[1] = quad_sum(row_sum[1]);
    if (t == 0) {
        ${sums}[half][r0] = row_sum[0];
        ${sums}[half][r1] = row_sum[1];
    }
    bar_sync(${bar}, 256); /* both warpgroups' sums, and both are done with Q and the ring */
    float inv[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = h ? r1 : r0, pr = g0 + r;
        const float sum = ${sums}[0][r] + ${sums}[1][r];
        inv[h] = sum > 0.0f ? 1.0f / sum : 0.0f;
        if (half == 0 && t == 0 && pr < rows) {
% decode_head_row("pr")
            const float x = sum > 0.0f ? (row_max[h] + lg2(sum)) * F_LN2 : NEG_INF;
            (void)x; /* not stored without lse */
            (void)head;
            (void)row;
% decode_store_lse("x")
        }
    }
    /* A staged row: DV floats and 8 of padding (a warp's 8-byte pairs without bank conflicts),
    ** and 8 bytes for its offset in O. */
    constexpr int SROW = DV + 8, ROW_BYTES = SROW * 4 + 8;
    constexpr int RR = 64 * ROW_BYTES <= (${room}) ? 64 : 32 * ROW_BYTES <= (${room}) ? 32 : 16;
    static_assert(16 * ROW_BYTES <= (${room}), "a warp's 16 rows fit the staging bytes");
    float *stage = (float *)(${stage});
    I64 *row_at = (I64 *)(stage + RR * SROW);
    const int real = I_MIN(rows - g0, BM); /* the block's packed rows that exist */
    for (int w0 = 0; w0 < real; w0 += RR) {
        if (warp * 16 >= w0 && warp * 16 < w0 + RR) {
#pragma unroll
            for (int j = 0; j < DVH / 8; j++)
#pragma unroll
                for (int h = 0; h < 2; h++)
                    *(float2 *)&stage[(r0 + 8 * h - w0) * SROW + half * DVH + 8 * j + 2 * t] =
                        make_float2(o[j][2 * h] * inv[h], o[j][2 * h + 1] * inv[h]);
            if (half == 0 && t == 0)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int pr = g0 + (h ? r1 : r0);
% decode_head_row("pr")
                    row_at[(h ? r1 : r0) - w0] = ${decode_out_row()};
                }
        }
        bar_sync(${bar}, 256); /* the round's rows staged */
        const int units = I_MIN(real - w0, RR) * (DV / 128); /* (row, 128 columns) */
#pragma unroll 2
        for (int u = warp + 4 * half; u < units; u += 8) {
            const int rr = u / (DV / 128), c0 = u % (DV / 128) * 128 + lane;
            const I64 at = row_at[rr];
            float x[4];
#pragma unroll
            for (int e = 0; e < 4; e++)
                x[e] = stage[rr * SROW + c0 + 32 * e];
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (c0 + 32 * e < head_dim_v) {
% decode_store_out_at("at + c0 + 32 * e", "x[e]")
                }
        }
        if (w0 + RR < real)
            bar_sync(${bar}, 256); /* read before the next round writes */
    }
% end

/* O's rows r0 and r1 (N / 8 accumulator blocks) times f[0] and f[1]; skipped where no row of the
** warp's changed its scale (f 1: exact), as is usual once a long sequence's largest scores
** have been seen. */
template <int N> __device__ __forceinline__ void scale_rows(float (*o)[4], const float *f)
{
    if (!__any_sync(0xffffffffu, f[0] != 1.0f || f[1] != 1.0f))
        return;
#pragma unroll
    for (int j = 0; j < N / 8; j++) {
        o[j][0] *= f[0];
        o[j][1] *= f[0];
        o[j][2] *= f[1];
        o[j][3] *= f[1];
    }
}
