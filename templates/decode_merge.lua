% -- The merge of a decode's splits inside the decode kernel (variant merge_last, CUDA): the last
% -- split of a block's rows to finish combines every split's state of those rows into out and
% -- lse, so the plan needs no merge step (attn_merge.lua's strided states, the same algebra:
% -- with m = max l_s and w_s = exp(l_s - m), o = sum w_s o_s / sum w_s, l = m + log(sum w_s);
% -- a state with l = -inf weighs nothing and its o is never read into the sum; all empty gives
% -- o = 0, l = -inf; a NaN or +inf l makes the row NaN).
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
% -- decode_merge_last(per_tile, threads): after decode_block (batch, g0, rows, qgroup,
% -- head_kv, seqlen_q, q_first and the forward's fields as locals) and the block's stores, at
% -- the kernel's end, with every one of the block's `threads` threads (tid) arriving.
% function decode_merge_last(per_tile, threads)
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
            const int dv = head_dim_v;
            for (int i = tid; i < ${per_tile} * dv; i += ${threads}) {
                const int pr = g0 + i / dv, c = i % dv;
                if (pr >= rows)
                    break; /* (i grows: every later element is past the rows too) */
% decode_head_row("pr")
                const I64 so = batch * P.part.o_sb + (I64)row * P.part.o_ss + (I64)head * P.part.o_sh + c;
                const I64 sl = batch * P.part.l_sb + (I64)head * P.part.l_sh + (I64)row * P.part.l_ss;
                GLOBAL const float *ls = GPTR(const float, P.part.l) + sl;
                GLOBAL const float *os = GPTR(const float, P.part.o) + so;
                /* One pass in split order, rescaling as the maximum grows; the loads of a few
                ** splits go out together (ld.global.cg: L2, where the other blocks' stores are). */
                float m = -F_INF, sum = 0.0f, acc = 0.0f;
                bool nan = false;
#pragma unroll 8
                for (int s = 0; s < (int)gridDim.y; s++) {
                    const float l = __ldcg(ls + s * P.part_sl);
                    const float o = __ldcg(os + s * P.part_so);
                    nan = nan || !(l < F_INF);
                    if (l > m) {
                        const float r = m > -F_INF ? expf(m - l) : 0.0f;
                        sum *= r;
                        acc *= r;
                        m = l;
                    }
                    if (l > -F_INF) {
                        const float w = expf(l - m);
                        sum += w;
                        acc = fmaf(w, o, acc);
                    }
                }
                const float val = nan ? F_NAN : sum > 0.0f ? acc / sum : 0.0f;
                const int drow = ${varlen > 0 and "q_first + " or ""}row; /* out's row */
                O_STORE(out, batch * o_sb + (I64)drow * o_ss + (I64)head * o_sh + c, val);
%   if write_lse then
                if (c == 0)
                    lse[batch * l_sb + (I64)head * l_sh + (I64)drow * l_ss] =
                        nan ? F_NAN : m > -F_INF ? m + logf(sum) : -F_INF;
%   end
            }
        }
    }
% end
