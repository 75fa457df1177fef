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
% -- split, and (causal, windows) outside the row's band, at -inf; the rows' maxima in mx.
% function decode_scores(acc, blocks)
#pragma unroll
        for (int j = 0; j < ${blocks}; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
%   if softcap then
                float x = cap_mul * tanhf(${acc}[j][e] * score_mul);
%   else
                float x = ${acc}[j][e] * score_mul;
%   end
                const int key = n0 + 8 * j + 2 * t + (e % 2);
                const bool seen = ${decode_seen("key", "qpos[e / 2]")};
                x = seen ? x : NEG_INF;
                ${acc}[j][e] = x;
                mx[e / 2] = fmaxf(mx[e / 2], x);
            }
        mx[0] = quad_max(mx[0]);
        mx[1] = quad_max(mx[1]);
% end
%
% -- decode_halves_store(sums, bar): the end: the rows' sums (row_sum, each thread's part) over
% -- the quad and both warpgroups (through sums[2][64] in shared memory and named barrier bar
% -- of both), then this warpgroup's columns of O normalised and stored (or, with `partial`,
% -- the split's state; row_max the rows' maximum in log2 units). Natural-log log-sum-exp; a
% -- row that saw no key gets 0 and -inf.
% function decode_halves_store(sums, bar)
    row_sum[0] = quad_sum(row_sum[0]);
    row_sum[1] = quad_sum(row_sum[1]);
    if (t == 0) {
        ${sums}[half][r0] = row_sum[0];
        ${sums}[half][r1] = row_sum[1];
    }
    bar_sync(${bar}, 256);
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = h ? r1 : r0, pr = g0 + r;
        if (pr >= rows)
            continue;
        const float sum = ${sums}[0][r] + ${sums}[1][r], inv = sum > 0.0f ? 1.0f / sum : 0.0f;
        const int head = head_kv * qgroup + pr / seqlen_q, row = q_first + pr % seqlen_q;
#pragma unroll
        for (int j = 0; j < DVH / 8; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int c = half * DVH + 8 * j + 2 * t + e;
                if (c < head_dim_v) {
% decode_store_out("o[j][2 * h + e] * inv")
                }
            }
        if (half == 0 && t == 0) {
            const float x = sum > 0.0f ? (row_max[h] + lg2(sum)) * F_LN2 : NEG_INF;
            (void)x; /* not stored without lse */
% decode_store_lse("x")
        }
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
