% -- The merge of a decode's splits inside the decode kernel (variant merge_last, CUDA): the last
% -- split of a block's rows to finish combines every split's state of those rows into out and
% -- lse, so the plan needs no merge step (what attn_merge.lua's strided states do, by the same
% -- algebra, merge_state.lua's).
% --
% -- Arrivals: each block stores its split's state (decode_store_out / decode_store_lse with
% -- `partial`), makes it visible device-wide (__threadfence), and counts itself in
% -- P.arrivals[batch * gridDim.x + blockIdx.x], one int per block of a split (the splits run
% -- along the grid's y). The block that brings the count to gridDim.y is the last: it resets
% -- the count to zero, so the counters are zero again when the grid ends (the plan's
% -- fj__workspace.counters: zero at every launch, with no memset step), and merges. The states
% -- are added in split order, whichever block is last: the result does not depend on the
% -- order the blocks ran in. A block whose rows are no one's (packed sequences: a row tile
% -- past its sequence's rows) counts itself too and merges nothing.
% --
% -- The merge is bound by the latency of its loads (the states are in L2), so it makes few
% -- rounds of them: a thread a row finds the row's offsets (workspace and out); every split's
% -- l of the block's rows goes into shared memory; a thread a row turns them into the weights
% -- w_s and the row's scale (1 / sum w_s; 0 where every state is empty, NaN for a NaN or +inf
% -- l) and writes its lse; then each thread adds up the states of two of the rows' elements at
% -- a time, MERGE_BATCH splits' loads of each out together. Its code runs once, in a few blocks,
% -- before its instructions are cached, so its length is time: no divisions by run-time
% -- values in its loops (a row's are made once, by its thread), loops around the loads rolled,
% -- no branches around single loads. (A first version, 2000 instructions of unrolled divisions
% -- and branches, took 7-12 us more than the decode kernel on the H100 even without its state
% -- loads; bench/RESULTS.md.)
% --
% -- decode_merge_last(per_tile, cols, threads, scratch): after decode_block (batch, g0, rows,
% -- qgroup, head_kv, seqlen_q, q_first, head_dim_v and the forward's fields as locals) and the
% -- block's stores, at the kernel's end, with every one of the block's `threads` threads (tid)
% -- arriving; cols, the value columns padded (a constant, at least head_dim_v); scratch, a
% -- float pointer to shared memory (8-byte aligned) of at least
% -- decode_merge_scratch_floats(per_tile) floats that nothing reads or writes once the block's
% -- threads have all arrived.
% include("merge_state.lua")
% local max_splits = 64 -- plan/variant.h's FJ__DECODE_MAX_SPLITS
#define MERGE_BATCH 16 /* splits whose states a thread loads at once, for each element */
#define MERGE_MAX_SPLITS ${max_splits}
% function decode_merge_scratch_floats(per_tile)
%   -- a row's splits' weights and its scale; then its three offsets (I64 in two floats each)
%   return per_tile * (max_splits + 1) + 6 * per_tile
% end
% function decode_merge_last(per_tile, cols, threads, scratch)
%   assert(backend == "cuda" and partial, "decode_merge_last: a CUDA decode's split states")
    {
        /* Every state this block stored is visible before its arrival is counted. */
        __threadfence();
        bool last = false;
        if (tid == 0) {
            int *count = GPTR(int, P.arrivals) + (I64)batch * gridDim.x + blockIdx.x;
            last = atomicAdd(count, 1) == (int)gridDim.y - 1;
            if (last)
                *count = 0; /* (no other block of these rows counts again in this grid) */
        }
        if (__syncthreads_or(last)) {
            __threadfence(); /* the other splits' states are read after their arrivals */
            const int n = I_MIN((int)gridDim.y, MERGE_MAX_SPLITS);
            const int nrows = I_MAX(I_MIN(${per_tile}, rows - g0), 0); /* this block's rows */
            float *weight = ${scratch}; /* [row][split]: l, then the weights */
            float *scale = weight + ${per_tile} * MERGE_MAX_SPLITS; /* [row]: 1 / sum w_s, or NaN */
            /* (8-byte aligned: per_tile is a multiple of 16) */
            I64 *state_at = (I64 *)(scale + ${per_tile}); /* [row]: split 0's o, in P.part */
            I64 *lse_at = state_at + ${per_tile};         /* [row]: split 0's l */
            I64 *out_at = lse_at + ${per_tile};           /* [row]: out's row */
            if (tid < nrows) {
                const int pr = g0 + tid;
% decode_head_row("pr")
                state_at[tid] = ${decode_state_at("0")};
                lse_at[tid] = ${decode_state_lse_at("0")};
                out_at[tid] = ${decode_final_at(decode_final_row())};
            }
            __syncthreads();
            /* (i = r * 2^lg + s over the rows and splits rounded up to a power of two) */
            const int lg = n > 1 ? 32 - __clz(n - 1) : 0;
#pragma unroll 4
            for (int i = tid; i < nrows << lg; i += ${threads}) {
                const int r = i >> lg, s = i & ((1 << lg) - 1);
                if (s < n)
                    weight[r * MERGE_MAX_SPLITS + s] =
                        __ldcg(GPTR(const float, P.part.l) + lse_at[r] + s * P.part_sl);
            }
            __syncthreads();
            if (tid < nrows) {
                float *w = weight + tid * MERGE_MAX_SPLITS;
                float m = -F_INF;
                bool nan = false;
#pragma unroll 1
                for (int s = 0; s < n; s++) {
                    nan = ${merge_bad("nan", "w[s]")};
                    m = F_MAX(m, w[s]);
                }
                float sum = 0.0f;
#pragma unroll 1
                for (int s = 0; s < n; s++) {
                    w[s] = ${merge_weight("w[s]", "m")};
                    sum += w[s];
                }
                scale[tid] = ${merge_scale("sum", "nan")};
%   if write_lse then
                const int pr = g0 + tid;
% decode_head_row("pr")
                lse[${decode_final_lse_at(decode_final_row())}] =
                    ${merge_lse("m", "sum", "nan")};
%   end
            }
            __syncthreads();
            /* Two elements a thread at a time (e and e + threads of the rows' cols columns),
            ** MERGE_BATCH splits' loads of each in flight together. Branch-free: every load
            ** reads a state that exists (split, row and column clamped), and what an empty
            ** state or a clamped index read is never added. */
#pragma unroll 1
            for (int e0 = tid; e0 < nrows * ${cols}; e0 += 2 * ${threads}) {
                float acc[2] = {0.0f, 0.0f};
                const float *src[2];
                const float *w[2];
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int e = e0 + h * ${threads}, r = I_MIN(e / ${cols}, nrows - 1);
                    src[h] = GPTR(const float, P.part.o) + state_at[r] +
                             I_MIN(e % ${cols}, head_dim_v - 1);
                    w[h] = weight + r * MERGE_MAX_SPLITS;
                }
#pragma unroll 1
                for (int s0 = 0; s0 < n; s0 += MERGE_BATCH) {
                    float x[2][MERGE_BATCH];
#pragma unroll
                    for (int h = 0; h < 2; h++)
#pragma unroll
                        for (int j = 0; j < MERGE_BATCH; j++)
                            x[h][j] = __ldcg(src[h] + I_MIN(s0 + j, n - 1) * P.part_so);
#pragma unroll
                    for (int h = 0; h < 2; h++)
#pragma unroll
                        for (int j = 0; j < MERGE_BATCH; j++) {
                            const float wt = s0 + j < n ? w[h][s0 + j] : 0.0f;
                            acc[h] = wt > 0.0f ? fmaf(wt, x[h][j], acc[h]) : acc[h];
                        }
                }
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int e = e0 + h * ${threads}, r = e / ${cols}, c = e % ${cols};
                    if (r < nrows && c < head_dim_v)
                        O_STORE(out, out_at[r] + c, acc[h] * scale[r]);
                }
            }
        }
    }
% end
