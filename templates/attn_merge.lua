% -- Merging attention states (fj_attention_merge, and the chained steps of longer merges), by
% -- merge_state.lua's algebra: o = sum w_i o_i / sum w_i and l = m + log(sum w_i) over disjoint
% -- key sets.
% --
% -- Work: a work-group of THREADS work-items takes PAIRS (batch, row, head) pairs, a warp-sized
% -- team of LANES each; a team reads its pair's log-sum-exps, the work-group waits at a barrier,
% -- then each lane merges every LANES-th element. Everything a pair's result depends on is read
% -- before any of it is written, and only by its own work-group, so dst may be one of the inputs
% -- (in place, with the same strides).
% --
% -- Strided states (inputs = 0): P.states states (1 to 64) of one element type (q_t), state i at
% -- slot in0 moved by i * state_so elements of o and i * state_sl of l: the split-KV partials of
% -- a decode plan (attn_decode.lua), which lie in one workspace. A row's elements are shared by
% -- the work-groups along the grid's y, a lane an element, so a few rows of wide states (a
% -- decode of one sequence, MLA's 512 columns) still fill the device; and a pair's states by
% -- P.state_teams teams of the work-group (state i by team i % state_teams, whose sums meet in
% -- shared memory), so many states (a decode of few rows in many splits) are loaded at once.
% -- Everything but the loads is found before the wait for the states' writer, and the first
% -- round of a lane's loads goes with the log-sum-exps', so most merges wait on memory once.
% -- dst is never one of these inputs. With varlen, the states are a decode's of packed
% -- sequences: sequence b's rows at batch b, rows 0 to P.seqlen - 1, and dst packed, its rows
% -- from P.cu_seqlens_q[b] as sequence.lua's packed_queries() finds them; rows past a
% -- sequence's end are idle.
% --
% -- Parameters: backend, q_dtype (slot 0's elements), kv_dtype (the other slots'), out_dtype
% -- (dst's), inputs (slots read, 1 to 8; 0 strided states), varlen (strided states: dst packed),
% -- write_lse (dst.l is written), threads (128), args (the family's parameter block,
% -- fj_merge_params).
% assert(inputs >= 0 and inputs <= 8, "attn_merge: 1 to 8 inputs per launch, or 0 (strided)")
% assert(threads == 128, "attn_merge: 128 work-items per work-group")
% include("dialect.lua")
% include("merge_state.lua")
% include("params.lua")
% include("sequence.lua")
% params_struct(args)
#define THREADS ${threads}
#define LANES 32 /* plan/merge.c's MERGE_LANES */
#define PAIRS (THREADS / LANES)
#define INPUTS ${inputs}
#define MAX_STATES 64 /* strided states */
#define ROUND 4       /* strided states whose elements a lane loads at once */

/* Element e of state s at (b, row, h) and its log-sum-exp. */
#define STATE_AT(s, b, row, h) ((b) * (s).o_sb + (I64)(row) * (s).o_ss + (I64)(h) * (s).o_sh)
#define LSE_AT(s, b, row, h) ((b) * (s).l_sb + (I64)(h) * (s).l_sh + (I64)(row) * (s).l_ss)

% if inputs == 0 then
KERNEL(THREADS)
fj_attn_merge(
% params_arg(args)
)
{
    SHARED float w[PAIRS][MAX_STATES]; /* a pair's log-sum-exps, then its states' weights */
    SHARED float part[PAIRS][LANES];     /* each team's sum of its states, an element a lane */
    /* Where the work-item's pair, states and element lie, from the parameters alone, so found
    ** while the grid that writes the states may still run: team `team` takes states share,
    ** share + teams, ... of the work-group's pair `slot`, each lane one element of them. */
    const int team = THREAD_X / LANES, lane = THREAD_X % LANES;
    const int shift = P.state_teams >= 4 ? 2 : P.state_teams >= 2 ? 1 : 0; /* 1, 2 or 4 teams */
    const int teams = 1 << shift, slot = team >> shift, share = team & (teams - 1);
    const I64 pair64 = (I64)BLOCK_X * (PAIRS >> shift) + slot;
    const int pair = (int)pair64; /* where it is live, < 2^31 (plan/merge.c) */
%   local dst_row = varlen > 0 and "q_first + row" or "row"
%   if varlen > 0 then
    const bool in_grid = pair64 < P.pairs;
%   else
    const bool live = pair64 < P.pairs;
%   end
    const int h = pair % P.heads, row_all = pair / P.heads;
    const int row = row_all % P.seqlen, b = row_all / P.seqlen;
%   if varlen > 0 then
    /* dst's row of the states' `row`: the sequence's packed rows, which may be fewer. */
    const int batch = I_MIN(b, (int)(P.pairs / P.heads / P.seqlen) - 1);
    GLOBAL const int *cu_seqlens_q = GPTR(const int, P.cu_seqlens_q);
    const int total_q = P.total_q, max_seqlen_q = P.seqlen;
%     packed_queries()
    const bool live = in_grid && row < seqlen_q;
%   end
    const int n = I_MIN(P.states, MAX_STATES);
    const int d = BLOCK_Y * LANES + lane; /* the grid's y covers a row's elements */
    const bool mine = live && d < P.head_dim_v;
    GLOBAL const float *l0 = GPTR(const float, P.in0.l) + LSE_AT(P.in0, b, row, h);
    GLOBAL const q_t *o0 = GPTR(const q_t, P.in0.o) + STATE_AT(P.in0, b, row, h) + d;
    GLOBAL o_t *out = GPTR(o_t, P.dst.o) + STATE_AT(P.dst, b, ${dst_row}, h);
% if backend == "cuda" then
#if __CUDA_ARCH__ >= 900
    /* Launched to overlap the end of the kernel that wrote the states (a decode's splits:
    ** programmatic dependent launch), this waits for that kernel's writes; returns at once
    ** when launched otherwise. The pointers as operands put the index arithmetic before the
    ** wait in the PTX, but ptxas still schedules the wait (ACQBULK) near the kernel's start,
    ** ahead of the divisions (sm_90a SASS, bench/RESULTS.md 2026-12-06). */
    asm volatile("griddepcontrol.wait;" ::"l"(l0), "l"(o0), "l"(out) : "memory");
#endif
% end
    /* One round of loads brings the first ROUND of the team's states' elements and the
    ** log-sum-exps (a decode's partials are read once, from memory: each round waits on it).
    ** A lane's state index is clamped to the last state, and whatever an empty or a clamped
    ** state's element holds is loaded but never added. The log-sum-exps are padded with empty
    ** states to a multiple of 4, which the loops over them take at a time. */
    const int k = share * LANES + lane; /* the work-item among its pair's */
    const int last = n - 1, n4 = (n + 3) & ~3;
    float x[ROUND];
#pragma unroll
    for (int j = 0; j < ROUND; j++)
        x[j] = mine && last >= 0 ? Q_LOAD(o0, I_MIN(share + (j << shift), last) * P.state_so)
                                 : 0.0f;
    for (int i = k; live && i < n4; i += teams * LANES)
        w[slot][i] = i < n ? LDG(l0 + i * P.state_sl) : -F_INF;
    BARRIER();
    float m = -F_INF;
    bool nan = false;
#pragma unroll 1
    for (int i0 = 0; live && i0 < n4; i0 += 4) {
#pragma unroll
        for (int i = i0; i < i0 + 4; i++) {
            nan = ${merge_bad("nan", "w[slot][i]")};
            m = F_MAX(m, w[slot][i]);
        }
    }
    BARRIER(); /* every lane has read the log-sum-exps */
    for (int i = k; live && i < n4; i += teams * LANES)
        w[slot][i] = ${merge_weight("w[slot][i]", "m")};
    BARRIER();
    float sum = 0.0f;
#pragma unroll 1
    for (int i0 = 0; live && i0 < n4; i0 += 4) {
#pragma unroll
        for (int i = i0; i < i0 + 4; i++)
            sum += w[slot][i];
    }
    float acc = 0.0f;
    for (int i0 = share; mine && i0 < n; i0 += ROUND * teams) {
        if (i0 > share) { /* a later round */
#pragma unroll
            for (int j = 0; j < ROUND; j++)
                x[j] = Q_LOAD(o0, I_MIN(i0 + (j << shift), last) * P.state_so);
        }
#pragma unroll
        for (int j = 0; j < ROUND; j++) {
            const int i = i0 + (j << shift);
            const float wi = w[slot][I_MIN(i, last)];
            acc = i < n && wi > 0.0f ? F_FMA(wi, x[j], acc) : acc;
        }
    }
    /* The pair's teams' sums meet, in their order. (Not under `if (teams > 1)`: PoCL's build
    ** of that barrier, with none after it, merged the sums wrongly.) */
    part[team][lane] = acc;
    BARRIER();
    acc = 0.0f;
    for (int t = 0; share == 0 && t < teams; t++)
        acc += part[team + t][lane];
    if (mine && share == 0)
        O_STORE(out, d, acc * ${merge_scale("sum", "nan")});
%   if write_lse then
    if (live && share == 0 && lane == 0 && BLOCK_Y == 0)
        GPTR(float, P.dst.l)[LSE_AT(P.dst, b, ${dst_row}, h)] =
            ${merge_lse("m", "sum", "nan")};
%   end
}
% else
KERNEL(THREADS)
fj_attn_merge(
% params_arg(args)
)
{
    SHARED float lse[PAIRS][INPUTS];
    const int team = THREAD_X / LANES, lane = THREAD_X % LANES;
    const I64 pair64 = (I64)BLOCK_X * PAIRS + team;
    const int pair = (int)pair64; /* where it is live, < 2^31 (plan/merge.c) */
    const bool live = pair64 < P.pairs;
    const int h = pair % P.heads, row_all = pair / P.heads;
    const int row = row_all % P.seqlen, b = row_all / P.seqlen;
    if (live && lane < INPUTS) {
% for i = 0, inputs - 1 do
        if (lane == ${i})
            lse[team][${i}] = LDG(GPTR(const float, P.in${i}.l) + LSE_AT(P.in${i}, b, row, h));
% end
    }
    BARRIER();
    if (!live)
        return;
    float m = -F_INF;
    bool nan = false;
    for (int i = 0; i < INPUTS; i++) {
        nan = ${merge_bad("nan", "lse[team][i]")};
        m = F_MAX(m, lse[team][i]);
    }
    float w[INPUTS], sum = 0.0f;
    for (int i = 0; i < INPUTS; i++) {
        /* exp(-inf - m) is 0: an empty state weighs nothing; m = -inf: every state is empty. */
        w[i] = ${merge_weight("lse[team][i]", "m")};
        sum += w[i];
    }
    const float scale = ${merge_scale("sum", "nan")};
% for i = 0, inputs - 1 do
    GLOBAL const ${i == 0 and "q_t" or "kv_t"} *o${i} = GPTR(const ${i == 0 and "q_t" or "kv_t"}, P.in${i}.o) + STATE_AT(P.in${i}, b, row, h);
% end
    GLOBAL o_t *out = GPTR(o_t, P.dst.o) + STATE_AT(P.dst, b, row, h);
    for (int d = lane; d < P.head_dim_v; d += LANES) {
        float acc = 0.0f;
% for i = 0, inputs - 1 do
        if (w[${i}] > 0.0f)
            acc = F_FMA(w[${i}], ${i == 0 and "Q" or "KV"}_LOAD(o${i}, d), acc);
% end
        O_STORE(out, d, acc * scale);
    }
% if write_lse then
    if (lane == 0)
        GPTR(float, P.dst.l)[LSE_AT(P.dst, b, row, h)] =
            ${merge_lse("m", "sum", "nan")};
% end
}
% end
