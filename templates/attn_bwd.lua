% -- The backward of attention for any backend (the portable dialect), FlashAttention-2 style:
% -- nothing N x N is stored; the scores are recomputed from q, k and the forward's log-sum-exp.
% -- With P = exp(s - lse), D = rowsum(dO * O):
% --     dV = P^T dO,   dP = dO V^T,   dS = P * (dP - D),   dQ = dS' K,   dK = dS'^T Q,
% -- where dS' is dS times the derivative of the score with respect to q.k (scale, 1 - tanh^2
% -- through soft-capping, score_mod's generated derivative; ALiBi, bias and masks are
% -- constants). Three stages, one kernel each (parameter `stage`), and a fourth on request:
% --   dot   D of every query row, into an f32 workspace [batch, heads_q, seqlen_q]: TILE_M
% --         rows a work-group, a team of THREADS / TILE_M work-items each (consecutive
% --         columns: the loads coalesce) whose sums add in local memory;
% --   dkdv  a work-item per key: its dK and dV summed over every query row of every query head
% --         of its kv head (query tiles of TILE_M rows streamed through local memory);
% --   dq    a work-item per query row: its dQ over the key tiles of TILE_N keys it sees;
% --   dbias the bias's gradient (dS through score_mod), summed over the dimensions the bias
% --         broadcasts: a tile of it a work-group, S and dP recomputed by tiles through local
% --         memory;
% --   and stage 5, dq_store: TILE_M rows of dq a work-group, cast from the f32 sum that the
% --         tensor-core dkdv stage (attn_bwd_mma.cu.lua, grads 4) accumulated by atomics;
% --   stage 6, dbias_sum: a bias summed over rows, from dbias's shares of the rows.
% -- No stage here uses atomics: the gradients are bit-identical run to run.
% --
% -- Variable lengths (varlen 1, 2 with seqused_k): BLOCK_Z is the sequence, found as the
% -- forward finds it; keys past seqused_k get zero dk and dv.
% --
% -- Parameters: dtypes (one type), head_dim_pad, head_dim_v_pad, tile_m, tile_n, threads, stage,
% -- local_mask, softcap, varlen, the masks' and score terms' (attn_masks.lua), shared_bytes (the
% -- host's size of Smem), args (fj_bwd_params).
% assert(stage >= 1 and stage <= 6,
%        "attn_bwd: stage 1 (dot), 2 (dkdv), 3 (dq), 4 (dbias), 5 (dq_store) or 6 (dbias_sum)")
% assert(score_mod == "" or score_mod_grad ~= "", "attn_bwd: score_mod needs score_mod_grad")
% assert(kv_dtype == q_dtype and out_dtype == q_dtype, "attn_bwd takes one element type")
% include("dialect.lua")
% include("attn_masks.lua")
% include("attn_dbias.lua")
% include("params.lua")
% include("sequence.lua")
% params_struct(args)
% local sparse = mask_mod ~= "" or mask_tensor or mask_ranges > 0
% local terms = alibi or bias ~= "" or score_mod ~= ""
#define TILE_M ${tile_m}
#define TILE_N ${tile_n}
#define THREADS ${threads}
#define DP ${head_dim_pad}
#define DVP ${head_dim_v_pad}
#define LOG2E 1.4426950408889634f

% -- The block's sequence: `batch`, its lengths (seqlen_q, seqlen_k; len_k the keys it holds,
% -- seqused_k or not), the tensors moved to its first rows (packed: through cu_seqlens,
% -- clamped as the forward clamps them), the gradients' pointers, and d_rows, the rows per
% -- (batch, head) of the D workspace.
% local function emit_sequence()
    const int batch = BLOCK_Z;
%   if varlen > 0 then
% packed_sequence()
    const int d_rows = max_seqlen_q;
%   else
    const int q_first = 0, k_first = 0, len_k = seqlen_k, d_rows = seqlen_q;
%   end
    q += (I64)q_first * q_ss + batch * q_sb;
    k += (I64)k_first * k_ss + batch * k_sb;
    v += (I64)k_first * v_ss + batch * v_sb;
    out += (I64)q_first * o_ss + batch * o_sb;
    lse += (I64)q_first * l_ss + batch * l_sb;
    GLOBAL const o_t *dout = GPTR(const o_t, P.dout) + (I64)q_first * P.do_ss + batch * P.do_sb;
    GLOBAL q_t *dq_p = GPTR(q_t, P.dq) + (I64)q_first * P.dq_ss + batch * P.dq_sb;
    GLOBAL kv_t *dk_p = GPTR(kv_t, P.dk) + (I64)k_first * P.dk_ss + batch * P.dk_sb;
    GLOBAL kv_t *dv_p = GPTR(kv_t, P.dv) + (I64)k_first * P.dv_ss + batch * P.dv_sb;
    GLOBAL float *delta_p = GPTR(float, P.delta) + (I64)batch * heads_q * d_rows;
    GLOBAL float *lse2_p = GPTR(float, P.lse2) + (I64)batch * heads_q * d_rows;
% end
% local unpack_names = varlen > 0 and { seqlen_q = "max_seqlen_q", seqlen_k = "max_seqlen_k" } or nil
% -- The block class of query row `row` and key `key` of this (batch, head), an expression.
% local function block_class(row, key)
%   return "LDG(GPTR(const int, P.fwd.mask.block_mask) + batch * P.fwd.mask.blocks_sb + " ..
%          "head * P.fwd.mask.blocks_sh + (" .. row .. " / 128) * P.fwd.mask.blocks_sq + " ..
%          key .. " / 128)"
% end

% -- `bool seen`: whether query row `row` of this (batch, head) sees key `key`, as the forward
% -- decides it: the tensors' ends, the band, the caller's block classes, the element masks.
% -- tile_class: a variable already holding the pair's block class (a tile within one block).
% local function emit_seen(row, key, tile_class)
        bool seen = ${row} < seqlen_q && ${key} < seqlen_k;
%   if local_mask then
        seen = seen && (window_left < 0 || ${key} >= ${row} + shift - window_left) &&
               (window_right < 0 || ${key} <= ${row} + shift + window_right);
%   end
%   if block_mask then
        const int cls = seen ? ${tile_class or block_class(row, key)} : 0;
        seen = seen && cls != 0;
%     if sparse then
        seen = seen && (cls == 2 || fj_keeps(mc, ${row}, ${key}));
%     end
%   elseif sparse then
        seen = seen && fj_keeps(mc, ${row}, ${key});
%   end
% end

% -- `p`, `ds` and `dd` of a seen pair: P from the score (log2 units); ds = dS through
% -- score_mod's derivative at its s (the bias's gradient); dd = ds times the raw score's
% -- derivative (scale; 1 - tanh^2 through soft-capping); from the raw q.k `qk`, the row's lse
% -- (log2 units) and D, and dP `dp`.
% local function emit_pair(qk, row, key)
        float x = ${qk} * score_mul;
%   if softcap then
        const float t = F_TANH(x);
        x = cap_mul * t;
%   end
%   if score_mod ~= "" then
        const float capped = x;
%   end
%   if terms then
        x = fj_score(mc, x, ${row}, ${key});
%   end
        const float p = lse_l2 == -F_INF ? 0.0f : F_EXP2(x - lse_l2);
        float ds = p * (dp - delta); /* dL/d(score), natural units */
%   if score_mod ~= "" then
        /* Through score_mod: dL/d(its s), which is also dL/d(bias). p = 0 (a score the
        ** expression masked to -inf) contributes nothing, whatever the derivative there. */
        ds = p > 0.0f ? ds * fj_score_grad(mc, capped, ${row}, ${key}) : 0.0f;
%   end
%   if softcap then
        const float dd = ds * P.scale * (1.0f - t * t);
%   else
        const float dd = ds * P.scale;
%   end
% end

% if stage == 1 then
#define LANES (THREADS / TILE_M) /* work-items a row */

/* D = rowsum(dO * O) of every query row, and its lse in log2 units (+inf for a row that sees
** no key: exp2(s - lse2) is then 0). */
KERNEL(THREADS)
fj_attn_bwd_dot(
% params_arg(args)
)
{
    SHARED float part[THREADS]; /* the lanes' sums, a row's LANES apart */
% params_unpack(args.fields[1].block, "P.fwd", unpack_names)
% emit_sequence()
    const int lane = THREAD_X % LANES, row = BLOCK_X * TILE_M + THREAD_X / LANES, head = BLOCK_Y;
    float d = 0.0f;
    if (row < seqlen_q) {
        GLOBAL const o_t *o = out + (I64)row * o_ss + (I64)head * o_sh;
        GLOBAL const o_t *g = dout + (I64)row * P.do_ss + (I64)head * P.do_sh;
        for (int c = lane; c < head_dim_v; c += LANES)
            d = F_FMA(O_LOAD(g, c), O_LOAD(o, c), d);
    }
    part[THREAD_X] = d;
    BARRIER();
    if (lane != 0 || row >= seqlen_q)
        return;
    for (int i = 1; i < LANES; i++)
        d += part[THREAD_X + i];
    delta_p[(I64)head * d_rows + row] = d;
    const float l = lse[(I64)head * l_sh + (I64)row * l_ss];
    lse2_p[(I64)head * d_rows + row] = l == -F_INF ? F_INF : l * LOG2E;
}
% elseif stage == 2 then
typedef struct Smem {
    float q[TILE_M][DP];   /* a tile of query rows (raw) */
    float g[TILE_M][DVP];  /* their dO */
    float lse[TILE_M];     /* log2 units */
    float delta[TILE_M];
} Smem;
% smem_matches_host()

/* dK and dV of one key per work-item, over every query row of the kv head's query heads. */
KERNEL(TILE_N)
fj_attn_bwd_dkdv(
% params_arg(args)
)
{
    SHARED Smem sm;
% params_unpack(args.fields[1].block, "P.fwd", unpack_names)
% emit_sequence()
    const int tid = THREAD_X, key0 = BLOCK_X * TILE_N, key = key0 + tid;
    const int head_kv = BLOCK_Y, group = heads_q / heads_kv;
    const bool live = key < seqlen_k;
    const int shift = seqlen_k - seqlen_q;
    float k_row[DP], v_row[DVP], dk[DP], dv[DVP];
    GLOBAL const kv_t *kp = k + (I64)key * k_ss + (I64)head_kv * k_sh;
    GLOBAL const kv_t *vp = v + (I64)key * v_ss + (I64)head_kv * v_sh;
    for (int c = 0; c < DP; c++) {
        k_row[c] = live && c < head_dim ? KV_LOAD(kp, c) : 0.0f;
        dk[c] = 0.0f;
    }
    for (int c = 0; c < DVP; c++) {
        v_row[c] = live && c < head_dim_v ? KV_LOAD(vp, c) : 0.0f;
        dv[c] = 0.0f;
    }
    /* The query rows that may see one of this block's keys. */
    const int last_key = I_MIN(key0 + TILE_N, seqlen_k) - 1;
    const int row_lo = window_right < 0 ? 0 : I_MAX(0, key0 - shift - window_right);
    const int row_hi = window_left < 0 ? seqlen_q - 1 : I_MIN(seqlen_q - 1, last_key - shift + window_left);
    for (int hh = 0; hh < group; hh++) {
        const int head = head_kv * group + hh;
%   if sparse or terms then
        MASK_CTX(mc, P.fwd.mask, batch, head, seqlen_q, seqlen_k);
%   end
        for (int m0 = row_lo / TILE_M * TILE_M; m0 <= row_hi; m0 += TILE_M) {
            BARRIER();
            for (int i = tid; i < TILE_M * DP; i += TILE_N) {
                const int r = i / DP, c = i % DP, row = m0 + r;
                sm.q[r][c] = row < seqlen_q && c < head_dim
                                 ? Q_LOAD(q, (I64)row * q_ss + (I64)head * q_sh + c)
                                 : 0.0f;
            }
            for (int i = tid; i < TILE_M * DVP; i += TILE_N) {
                const int r = i / DVP, c = i % DVP, row = m0 + r;
                sm.g[r][c] = row < seqlen_q && c < head_dim_v
                                 ? O_LOAD(dout, (I64)row * P.do_ss + (I64)head * P.do_sh + c)
                                 : 0.0f;
            }
            for (int r = tid; r < TILE_M; r += TILE_N) {
                const int row = m0 + r;
                sm.lse[r] = row < seqlen_q ? lse[(I64)head * l_sh + (I64)row * l_ss] * LOG2E : -F_INF;
                sm.delta[r] = row < seqlen_q ? delta_p[(I64)head * d_rows + row] : 0.0f;
            }
            BARRIER();
            if (!live)
                continue;
            for (int r = 0; r < TILE_M; r++) {
                const int row = m0 + r;
% emit_seen("row", "key")
                if (!seen)
                    continue;
                float qk = 0.0f, dp = 0.0f;
                for (int c = 0; c < DP; c++)
                    qk = F_FMA(sm.q[r][c], k_row[c], qk);
                for (int c = 0; c < DVP; c++)
                    dp = F_FMA(sm.g[r][c], v_row[c], dp);
                const float lse_l2 = sm.lse[r], delta = sm.delta[r];
% emit_pair("qk", "row", "key")
                for (int c = 0; c < DP; c++)
                    dk[c] = F_FMA(dd, sm.q[r][c], dk[c]);
                for (int c = 0; c < DVP; c++)
                    dv[c] = F_FMA(p, sm.g[r][c], dv[c]);
            }
        }
    }
    if (key >= len_k) /* keys past seqused_k, in the sequence's rows, get zeros */
        return;
    GLOBAL kv_t *dkp = dk_p + (I64)key * P.dk_ss + (I64)head_kv * P.dk_sh;
    GLOBAL kv_t *dvp = dv_p + (I64)key * P.dv_ss + (I64)head_kv * P.dv_sh;
    for (int c = 0; c < head_dim; c++)
        KV_STORE(dkp, c, dk[c]);
    for (int c = 0; c < head_dim_v; c++)
        KV_STORE(dvp, c, dv[c]);
}
% elseif stage == 3 then
typedef struct Smem {
    float k[TILE_N][DP];
    float v[TILE_N][DVP];
} Smem;
% smem_matches_host()

/* dQ of one query row per work-item, over the key tiles its band reaches. */
KERNEL(TILE_M)
fj_attn_bwd_dq(
% params_arg(args)
)
{
    SHARED Smem sm;
% params_unpack(args.fields[1].block, "P.fwd", unpack_names)
% emit_sequence()
    const int tid = THREAD_X, row0 = BLOCK_X * TILE_M, row = row0 + tid;
    const int head = BLOCK_Y, head_kv = head / (heads_q / heads_kv);
    const bool live = row < seqlen_q;
    const int shift = seqlen_k - seqlen_q;
    float q_row[DP], g_row[DVP], dq[DP];
    GLOBAL const q_t *qp = q + (I64)row * q_ss + (I64)head * q_sh;
    GLOBAL const o_t *gp = dout + (I64)row * P.do_ss + (I64)head * P.do_sh;
    for (int c = 0; c < DP; c++) {
        q_row[c] = live && c < head_dim ? Q_LOAD(qp, c) : 0.0f;
        dq[c] = 0.0f;
    }
    for (int c = 0; c < DVP; c++)
        g_row[c] = live && c < head_dim_v ? O_LOAD(gp, c) : 0.0f;
    const float lse_l2 = live ? lse[(I64)head * l_sh + (I64)row * l_ss] * LOG2E : -F_INF;
    const float delta = live ? delta_p[(I64)head * d_rows + row] : 0.0f;
%   if sparse or terms then
    MASK_CTX(mc, P.fwd.mask, batch, head, seqlen_q, seqlen_k);
%   end
    /* The keys the block's rows may see. */
    const int last_row = I_MIN(row0 + TILE_M, seqlen_q) - 1;
    const int key_lo = window_left < 0 ? 0 : I_MAX(0, row0 + shift - window_left);
    const int key_hi = window_right < 0 ? seqlen_k - 1 : I_MIN(seqlen_k - 1, last_row + shift + window_right);
    for (int n0 = key_lo / TILE_N * TILE_N; n0 <= key_hi; n0 += TILE_N) {
        BARRIER();
        for (int i = tid; i < TILE_N * DP; i += TILE_M) {
            const int j = i / DP, c = i % DP, key = n0 + j;
            sm.k[j][c] = key < seqlen_k && c < head_dim
                             ? KV_LOAD(k, (I64)key * k_ss + (I64)head_kv * k_sh + c)
                             : 0.0f;
        }
        for (int i = tid; i < TILE_N * DVP; i += TILE_M) {
            const int j = i / DVP, c = i % DVP, key = n0 + j;
            sm.v[j][c] = key < seqlen_k && c < head_dim_v
                             ? KV_LOAD(v, (I64)key * v_ss + (I64)head_kv * v_sh + c)
                             : 0.0f;
        }
        BARRIER();
        if (!live)
            continue;
        for (int j = 0; j < TILE_N; j++) {
            const int key = n0 + j;
% emit_seen("row", "key")
            if (!seen)
                continue;
            float qk = 0.0f, dp = 0.0f;
            for (int c = 0; c < DP; c++)
                qk = F_FMA(q_row[c], sm.k[j][c], qk);
            for (int c = 0; c < DVP; c++)
                dp = F_FMA(g_row[c], sm.v[j][c], dp);
% emit_pair("qk", "row", "key")
            for (int c = 0; c < DP; c++)
                dq[c] = F_FMA(dd, sm.k[j][c], dq[c]);
        }
    }
    if (!live)
        return;
    GLOBAL q_t *dqp = dq_p + (I64)row * P.dq_ss + (I64)head * P.dq_sh;
    for (int c = 0; c < head_dim; c++)
        Q_STORE(dqp, c, dq[c]);
}
% elseif stage == 4 then
%   -- the bias's key and row extents: the sequences' longest with variable lengths
%   local keys_all = varlen > 0 and "max_seqlen_k" or "seqlen_k"
%   local rows_all = varlen > 0 and "max_seqlen_q" or "seqlen_q"
%   assert(threads == tile_m * tile_n // 16, "attn_bwd dbias: a work-item per 4 x 4 elements")
%   assert(128 % tile_m == 0 and 128 % tile_n == 0, "attn_bwd dbias: tiles within class blocks")
#define CHUNK 32        /* head-dim columns a pass (fj__variant_shared_bytes's) */
#define TY (TILE_M / 4) /* a work-item's rows: ty, ty + TY, ty + 2 TY, ty + 3 TY of the tile */
#define TX (TILE_N / 4) /* and keys: tx, tx + TX, ... (consecutive work-items, consecutive keys) */
typedef struct Smem {
    float a[TILE_M][CHUNK + 1]; /* CHUNK columns of the tile's q rows, then of their dout */
    float b[TILE_N][CHUNK + 1]; /* the same columns of its keys' k, then of v */
    float lse[TILE_M];          /* log2 units */
    float delta[TILE_M];
    float part[TY][TILE_N];     /* a bias broadcast over rows: TY partial sums a key */
} Smem;
% smem_matches_host()

% -- acc += A B^T over head-dim columns [0, n) of a's rows (stride as, read by a_load) and b's:
% -- the tile's rows and keys through local memory, CHUNK columns a pass, 4 x 4 products a
% -- work-item (rows and keys past the sequence's read as 0).
% local function emit_tile_product(acc, a, a_load, as, b, b_load, bs, n)
        for (int c0 = 0; c0 < ${n}; c0 += CHUNK) {
            BARRIER();
            for (int i = tid; i < TILE_M * CHUNK; i += THREADS) {
                const int r = i / CHUNK, c = c0 + i % CHUNK;
                sm.a[r][i % CHUNK] = m0 + r < seqlen_q && c < ${n}
                                         ? ${a_load}(${a}, (I64)(m0 + r) * ${as} + c)
                                         : 0.0f;
            }
            for (int i = tid; i < TILE_N * CHUNK; i += THREADS) {
                const int r = i / CHUNK, c = c0 + i % CHUNK;
                sm.b[r][i % CHUNK] = k0 + r < seqlen_k && c < ${n}
                                         ? ${b_load}(${b}, (I64)(k0 + r) * ${bs} + c)
                                         : 0.0f;
            }
            BARRIER();
            for (int c = 0; c < CHUNK; c++) {
                float x[4], y[4];
                for (int i = 0; i < 4; i++) {
                    x[i] = sm.a[ty + TY * i][c];
                    y[i] = sm.b[tx + TX * i][c];
                }
                for (int i = 0; i < 4; i++)
                    for (int j = 0; j < 4; j++)
                        ${acc}[i][j] = F_FMA(x[i], y[j], ${acc}[i][j]);
            }
        }
% end
/* The bias's gradient dbias [batches, heads, rows, keys] (an extent of 1 where the bias
** broadcasts: summed over), TILE_M rows by TILE_N keys of it a work-group (one row where the
** rows are summed), 4 x 4 elements a work-item: each element's sum of ds over the (batch, head,
** query row) triples it stands for, S = q k^T and dP = dout v^T recomputed a tile at a time.
** Grid: x the (batch, head) pairs of dbias times its key tiles, y its row tiles (summed rows:
** P.dbias_splits shares of them, each summed into the workspace unless there is one). Variable
** lengths index the sequences as a padded batch (sequence b's query i, key j at (b, i, j)); an
** element past a sequence's lengths has none of its pairs. Its S, dP and sums (48 floats a
** work-item) beside a score_mod's derivative spilled at the 128 registers ptxas chose for
** four blocks an SM: KERNEL_ONE_BLOCK lets it take what it needs (152 there). */
KERNEL_ONE_BLOCK(THREADS)
fj_attn_bwd_dbias(
% params_arg(args)
)
{
    SHARED Smem sm;
% params_unpack(args.fields[1].block, "P.fwd", unpack_names)
    const int tid = THREAD_X, tx = tid % TX, ty = tid / TX;
% dbias_block("BLOCK_X", "BLOCK_Y", "k0", "TILE_M", "TILE_N", rows_all, keys_all)
    const int group = heads_q / heads_kv;
    /* The rows of this work-group's tile, or of its share of the row tiles where they are
    ** summed (stage 6 adds the shares' sums where there are several). */
    const int m_lo = mb_lo * TILE_M, m_end = I_MIN(mb_hi * TILE_M, ${rows_all});
    float acc[4][4];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++)
            acc[i][j] = 0.0f;
    for (int batch = b_lo; batch < b_hi; batch++) {
%   if varlen > 0 then
% packed_sequence()
        const int d_rows = max_seqlen_q;
%   else
        const int q_first = 0, k_first = 0, d_rows = seqlen_q;
%   end
        const int shift = seqlen_k - seqlen_q, m_hi = I_MIN(m_end, seqlen_q);
        for (int head = h_lo; head < h_hi; head++) {
            const int head_kv = head / group;
%   if sparse or terms then
            MASK_CTX(mc, P.fwd.mask, batch, head, seqlen_q, seqlen_k);
%   end
            GLOBAL const q_t *qp = q + batch * q_sb + (I64)q_first * q_ss + (I64)head * q_sh;
            GLOBAL const o_t *gp = GPTR(const o_t, P.dout) + batch * P.do_sb +
                                   (I64)q_first * P.do_ss + (I64)head * P.do_sh;
            GLOBAL const kv_t *kp = k + batch * k_sb + (I64)k_first * k_ss + (I64)head_kv * k_sh;
            GLOBAL const kv_t *vp = v + batch * v_sb + (I64)k_first * v_ss + (I64)head_kv * v_sh;
            for (int m0 = m_lo; m0 < m_hi && k0 < seqlen_k; m0 += TILE_M) {
%   if local_mask then
                if (${dbias_tile_outside_band("m0", "k0", "TILE_M", "TILE_N")})
                    continue;
%   end
%   if block_mask then
                const int tile_class = ${block_class("m0", "k0")}; /* (the tile's one block) */
                if (tile_class == 0)
                    continue;
%   end
                BARRIER(); /* the last tile's lse and D read */
                for (int r = tid; r < TILE_M; r += THREADS) {
                    const int row = m0 + r;
                    const I64 at = batch * l_sb + (I64)head * l_sh + (I64)(q_first + row) * l_ss;
                    sm.lse[r] = row < seqlen_q ? lse[at] * LOG2E : -F_INF;
                    sm.delta[r] = row < seqlen_q ? GPTR(float, P.delta)[((I64)batch * heads_q +
                                                                         head) * d_rows + row]
                                                 : 0.0f;
                }
                float s[4][4], dps[4][4];
                for (int i = 0; i < 4; i++)
                    for (int j = 0; j < 4; j++)
                        s[i][j] = dps[i][j] = 0.0f;
% emit_tile_product("s", "qp", "Q_LOAD", "q_ss", "kp", "KV_LOAD", "k_ss", "head_dim")
% emit_tile_product("dps", "gp", "O_LOAD", "P.do_ss", "vp", "KV_LOAD", "v_ss", "head_dim_v")
                for (int i = 0; i < 4; i++)
                    for (int j = 0; j < 4; j++) {
                        const int row = m0 + ty + TY * i, key = k0 + tx + TX * j;
% emit_seen("row", "key", block_mask and "tile_class" or nil)
                        if (!seen)
                            continue;
                        const float dp = dps[i][j], lse_l2 = sm.lse[ty + TY * i];
                        const float delta = sm.delta[ty + TY * i];
% emit_pair("s[i][j]", "row", "key")
                        (void)dd;
                        acc[i][j] += ds;
                    }
            }
        }
    }
    /* Summed over rows (rows_summed): each work-item's four, then the TY work-items of a key, in
    ** order. (The barriers are the work-group's whatever the case: PoCL ran a conditional pair
    ** of them wrongly when work-groups ran side by side.) */
    for (int j = 0; j < 4; j++)
        sm.part[ty][tx + TX * j] = acc[0][j] + acc[1][j] + acc[2][j] + acc[3][j];
    BARRIER();
    GLOBAL float *out_p = GPTR(float, P.dbias) + b_ * P.dbias_sb + h_ * P.dbias_sh;
    if (rows_summed) {
        if (tid < TILE_N && k0 + tid < ${keys_all}) {
            float sum = 0.0f;
            for (int y = 0; y < TY; y++)
                sum += sm.part[y][tid];
            if (P.dbias_splits > 1) /* this share's sum */
                ${dbias_part("BLOCK_Y", "pair", "k0 + tid", keys_all)} = sum;
            else
                out_p[k0 + tid] = sum;
        }
        return;
    }
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 4; j++) {
            const int row = m_lo + ty + TY * i, key = k0 + tx + TX * j;
            if (row < P.dbias_rows && key < ${keys_all})
                out_p[(I64)row * P.dbias_ss + key] = acc[i][j];
        }
}
% elseif stage == 6 then
%   local keys_all = varlen > 0 and "max_seqlen_k" or "seqlen_k"
/* A bias's gradient summed over rows in P.dbias_splits shares: their sums from the workspace
** ([share, pair, key], stage 4's) added in order, a work-item per element of dbias. */
KERNEL(THREADS)
fj_attn_bwd_dbias_sum(
% params_arg(args)
)
{
% params_unpack(args.fields[1].block, "P.fwd", unpack_names)
    const I64 e = (I64)BLOCK_X * THREADS + THREAD_X;
    if (e >= (I64)P.dbias_batches * P.dbias_heads * ${keys_all})
        return;
    const int key = (int)(e % ${keys_all});
    const I64 pair = e / ${keys_all};
    float sum = 0.0f;
    for (int s = 0; s < P.dbias_splits; s++)
        sum += ${dbias_part("s", "pair", "key", keys_all)};
    GPTR(float, P.dbias)[pair / P.dbias_heads * P.dbias_sb + pair % P.dbias_heads * P.dbias_sh +
                         key] = sum;
}
% elseif stage == 5 then
/* dQ from its f32 sum in the workspace, dq_slices slices [batch, heads_q, d_rows, DP] added in
** order, TILE_M rows a work-group (consecutive work-items, consecutive elements), times what dS
** was not multiplied by (the scale; nothing through soft-capping). The tile's addresses are
** computed once, and each element's from them in 32 bits but for dq's row stride. */
KERNEL(THREADS)
fj_attn_bwd_dq_store(
% params_arg(args)
)
{
% params_unpack(args.fields[1].block, "P.fwd", unpack_names)
% emit_sequence()
%   if softcap then
    const float factor = 1.0f;
%   else
    const float factor = P.scale;
%   end
    const int head = BLOCK_Y, row0 = BLOCK_X * TILE_M;
    const int rows = I_MIN(TILE_M, seqlen_q - row0);
    GLOBAL const float *sum =
        GPTR(const float, P.dq_acc) + (((I64)batch * heads_q + head) * d_rows + row0) * DP;
    GLOBAL q_t *dst = dq_p + (I64)row0 * P.dq_ss + (I64)head * P.dq_sh;
    const int slices = P.dq_slices;
    for (int i = THREAD_X; i < rows * DP; i += THREADS) {
        const int r = i / DP, c = i - r * DP;
        if (c >= head_dim)
            continue;
        float x = sum[i];
        for (int j = 1; j < slices; j++)
            x += sum[i + j * P.dq_slice];
        Q_STORE(dst + (I64)r * P.dq_ss, c, x * factor);
    }
}
% end
