% -- Decode attention: a few query rows per sequence (seqlen_q <= 16: decoding, speculative
% -- decoding) against a long key range, for any backend (the portable dialect).
% --
% -- Work: a work-group takes one (batch, kv head, row tile, split). Its rows are the query rows of
% -- every query head that shares the kv head (grouped-query heads packed: group row g is query
% -- head kv_head * group + g / seqlen_q, row g % seqlen_q), so each key and value tile is read
% -- from memory once for all of them. The split's keys stream through shared memory in tiles of
% -- TILE_N, converted to float once; all THREADS work-items score (row, key) pairs, a work-item
% -- per row runs the online softmax, and the accumulators of O are spread over the work-items
% -- (ACC elements each, row-major over rows x DVP).
% --
% -- Output: with `partial`, the split's normalised output and natural-log log-sum-exp go to f32
% -- workspaces, split 0's state at P.part (a merge slot: rows as out's), split s's at
% -- part_so / part_sl elements further, and a merge step (attn_merge.lua, strided states)
% -- combines them; else straight to out and lse. A
% -- row that sees no key writes out 0 and lse -inf (an empty state, weighing nothing).
% --
% -- Parameters: backend, q/kv/out dtypes (one type, or an FP8 kv with descale: k's factor
% -- scales the scores, v's the output), head_dim_pad, head_dim_v_pad, tile_m (rows
% -- per work-group), tile_n (keys per tile), threads, local_mask (causal or window), softcap,
% -- write_lse, varlen (0 dense; 1 packed through cu_seqlens_q/k; 2 and seqused_k; with paged, the
% -- queries packed), paged (k and v are pages found through P.page_table, seqused_k the keys of
% -- each sequence), partial,
% -- shared_bytes (the host's size of Smem), args (fj_decode_params); and the masks and score
% -- terms attn_masks.lua applies (alibi, bias, mask_mod, score_mod, mask_tensor, mask_ranges; not
% -- block classes): a row's query and key positions within its sequence, whose own lengths
% -- align them bottom-right, as the forward's.
% assert(threads == 128, "attn_decode: 128 work-items per work-group")
% assert(tile_m >= 1 and tile_m <= threads, "attn_decode: 1 to 128 rows per work-group")
% include("dialect.lua")
% assert(out_dtype == q_dtype and (kv_dtype == q_dtype or is_fp8(kv_dtype)), "attn_decode takes one element type for q, k, v and out, or an FP8 cache")
% include("params.lua")
% include("sequence.lua")
% include("descale.lua")
% include("attn_masks.lua")
% assert(not block_mask and not bias_tma, "attn_decode: no block classes, the bias by loads")
% params_struct(args)
#define THREADS ${threads}
#define ROWS ${tile_m}
#define TILE_N ${tile_n}
#define DP ${head_dim_pad}
#define DVP ${head_dim_v_pad}
#define ACC ((ROWS * DVP + THREADS - 1) / THREADS) /* O elements per work-item */

/* Shared memory (its size is the host's fj__variant_shared_bytes: checked below). K rows are
** padded by one float so that work-items scoring different keys hit different banks. */
typedef struct Smem {
    float q[ROWS][DP]; /* the rows' queries, scaled to log2 units (or to the tanh argument) */
    float k[TILE_N][DP + 1];
    float v[TILE_N][DVP];
    float p[ROWS][TILE_N]; /* scores, then their exponentials */
    float m[ROWS];         /* running max per row (log2 units) */
    float l[ROWS];         /* running sum of exp2(score - m) */
    float alpha[ROWS];     /* this tile's rescale of the row's accumulators */
} Smem;
% smem_matches_host()

% decode_key_row()

KERNEL(THREADS)
fj_attn_decode(
% params_arg(args)
)
{
    SHARED Smem sm;
    const int tid = THREAD_X;
% decode_block("ROWS", true)

% descale_factors("P.fwd")
    for (int i = tid; i < ROWS * DP; i += THREADS) {
        const int r = i / DP, c = i % DP, g = g0 + r;
        const int head = head_kv * qgroup + g / I_MAX(seqlen_q, 1), row = g % I_MAX(seqlen_q, 1);
        sm.q[r][c] = (g < rows && c < head_dim)
                         ? Q_LOAD(q, (I64)row * q_ss + (I64)head * q_sh + c) * score_mul * qk_factor
                         : 0.0f;
    }
    if (tid < ROWS) {
        sm.m[tid] = -F_INF;
        sm.l[tid] = 0.0f;
    }
    float acc[ACC]; /* (loops over it unrolled: in registers, not a stack frame) */
#pragma unroll
    for (int e = 0; e < ACC; e++)
        acc[e] = 0.0f;

    for (int n0 = I_MAX(lo, 0) / TILE_N * TILE_N; n0 <= hi; n0 += TILE_N) {
        BARRIER(); /* the previous tile is consumed (and q, m, l are in place) */
        for (int i = tid; i < TILE_N * DP; i += THREADS) {
            const int j = i / DP, c = i % DP, key = n0 + j;
            sm.k[j][c] = (key <= hi && c < head_dim) ? KV_LOAD(k, key_row(key, k_sb, k_ss) + c) : 0.0f;
        }
        for (int i = tid; i < TILE_N * DVP; i += THREADS) {
            const int j = i / DVP, c = i % DVP, key = n0 + j;
            sm.v[j][c] = (key <= hi && c < head_dim_v) ? KV_LOAD(v, key_row(key, v_sb, v_ss) + c) : 0.0f;
        }
        BARRIER();
        /* Scores of every (row, key) pair of the tile; -inf where the key is not seen (no test
        ** of the band in a tile that every row sees whole). */
        const bool whole = n0 >= full_lo && n0 + TILE_N - 1 <= full_hi;
        for (int i = tid; i < ROWS * TILE_N; i += THREADS) {
            const int r = i / TILE_N, j = i % TILE_N, key = n0 + j, g = g0 + r;
            float x = 0.0f;
            for (int c = 0; c < DP; c++)
                x = F_FMA(sm.q[r][c], sm.k[j][c], x);
% if softcap then
            x = cap_mul * F_TANH(x);
% end
            bool seen = g < rows &&
                        (whole || (key >= lo && ${decode_seen("key", "g % I_MAX(seqlen_q, 1)")}));
% if mask_terms.keeps or mask_terms.score then
            if (seen) { /* the row's query head and position, as decode_head_row's */
                const int head = head_kv * qgroup + g / I_MAX(seqlen_q, 1);
                const int qrow = g % I_MAX(seqlen_q, 1);
                MASK_CTX(mc, P.fwd.mask, batch, head, seqlen_q, seqlen_k);
%   if mask_terms.score then
                x = fj_score(mc, x, qrow, key);
%   end
%   if mask_terms.keeps then
                seen = fj_keeps(mc, qrow, key);
%   end
            }
% end
            sm.p[r][j] = seen ? x : -F_INF;
        }
        BARRIER();
        /* The online softmax, a work-item per row. */
        if (tid < ROWS) {
            const float m_old = sm.m[tid];
            float m_new = m_old;
            for (int j = 0; j < TILE_N; j++)
                m_new = F_MAX(m_new, sm.p[tid][j]);
            /* m_new = -inf: nothing seen yet; the row's accumulators are all zero. */
            const float alpha = m_new == -F_INF ? 1.0f : F_EXP2(m_old - m_new);
            float sum = 0.0f;
            for (int j = 0; j < TILE_N; j++) {
                const float e = m_new == -F_INF ? 0.0f : F_EXP2(sm.p[tid][j] - m_new);
                sm.p[tid][j] = e;
                sum += e;
            }
            sm.m[tid] = m_new;
            sm.l[tid] = sm.l[tid] * alpha + sum;
            sm.alpha[tid] = alpha;
        }
        BARRIER();
#pragma unroll
        for (int e = 0; e < ACC; e++) {
            const int i = tid + e * THREADS, r = i / DVP, c = i % DVP;
            if (r < ROWS) {
                float a = acc[e] * sm.alpha[r];
                for (int j = 0; j < TILE_N; j++)
                    a = F_FMA(sm.p[r][j], sm.v[j][c], a);
                acc[e] = a;
            }
        }
    }
    BARRIER(); /* m and l are final */

#pragma unroll
    for (int e = 0; e < ACC; e++) {
        const int i = tid + e * THREADS, r = i / DVP, c = i % DVP, g = g0 + r;
        if (r >= ROWS || g >= rows || c >= head_dim_v)
            continue;
% decode_head_row("g")
        const float l = sm.l[r];
        const float o = l > 0.0f ? acc[e] * v_factor / l : 0.0f;
% decode_store_out("o")
    }
    if (tid < ROWS && g0 + tid < rows) {
        const int g = g0 + tid;
% decode_head_row("g")
        const float l = sm.l[tid];
        const float x = l > 0.0f ? (sm.m[tid] + F_LOG2(l)) * F_LN2 : -F_INF;
% decode_store_lse("x")
    }
}
