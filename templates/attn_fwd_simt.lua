% -- Forward attention, FlashAttention style, for any backend (the portable dialect) and any
% -- dtype and alignment: the OpenCL kernel, and the CUDA path for f32 and unaligned tensors.
% --
% -- One work-group computes tile_m query rows of one (batch, head); each work-item owns one row:
% -- its query vector and output accumulator stay in private memory. Key and value tiles of
% -- tile_n rows are streamed through local memory, converted to float once, and shared by the
% -- whole group. The softmax is online: a running max m and sum l per row, the accumulator
% -- rescaled by exp2(m_old - m_new) whenever the max grows. Memory is O(N): no score matrix.
% -- Tiles entirely outside the causal/window band of the group's rows are never loaded.
% --
% -- Parameters: dtype, head_dim_pad, head_dim_v_pad, tile_m, tile_n, local_mask, softcap,
% -- write_lse, mask_mod and score_mod (checked canonical expressions, "" for none: see
% -- runtime/expr.h), alibi, bias ("", "f32" or "dtype": the bias tensor's type), mask_tensor,
% -- varlen (0 dense; 1 packed sequences found through cu_seqlens_q/k, BLOCK_Z the sequence;
% -- 2 also cutting each sequence's keys at seqused_k), mask_ranges (0, or 2 / 4 columns of masked
% -- row ranges per key), block_mask (the caller's 128 x 128 block classes), descale (FP8 q, k
% -- and v with their descale factors: q's and k's scale the scores, v's the output).
% local mods = mask_mod ~= "" or score_mod ~= ""
% -- Masks beyond the band: a key tile no row of the group keeps is skipped whole.
% local sparse = mask_mod ~= "" or mask_tensor or mask_ranges > 0
% assert(not block_mask or (128 % tile_m == 0 and 128 % tile_n == 0), "block_mask needs tiles that divide 128")
% -- Emits `bool keep`: whether this row keeps `key` under the element masks (attn_masks.lua)
% -- and the caller's block class (the band and the tensor's end are checked by the caller).
% local function emit_keep()
% if sparse then
            bool keep = in_range && fj_keeps(mc, row, key);
% else
            bool keep = true;
% end
% if block_mask then
            keep = keep || block_class == 2; /* the caller keeps the whole block */
% end
% end
% assert(tile_m > 0 and tile_n > 0, "tile sizes must be positive")
% include("dialect.lua")
% assert((kv_dtype == q_dtype and (out_dtype == q_dtype or is_fp8(q_dtype))) or (is_fp8(kv_dtype) and out_dtype == q_dtype), "the SIMT forward takes one element type for q, k, v and out, FP8 q, k, v and a 16-bit out, or an FP8 k and v")
% include("attn_masks.lua")
% include("params.lua")
% include("sequence.lua")
% include("descale.lua")
% params_struct(args)

#define TILE_M ${tile_m}
#define TILE_N ${tile_n}
#define DP ${head_dim_pad}
#define DVP ${head_dim_v_pad}

/* The work-group's local memory (its size is the host's, fj__variant_shared_bytes): the key and
** value tiles in float, and with element masks the block skipping's two tile flags. */
typedef struct Smem {
    float k[TILE_N][DP];
    float v[TILE_N][DVP];
% if sparse then
    int kept[2];
% end
} Smem;
% smem_matches_host()

KERNEL(TILE_M)
fj_attn_fwd(
% params_arg(args)
)
{
% -- With variable lengths the sequence lengths are per block: the parameters are the maxima.
% params_unpack(args, "P", varlen > 0 and { seqlen_q = "max_seqlen_q", seqlen_k = "max_seqlen_k" } or nil)
    SHARED Smem sm;

    const int tid = THREAD_X;
    const int row0 = BLOCK_X * TILE_M;
    const int row = row0 + tid;
    const int head = BLOCK_Y;
    const int batch = BLOCK_Z;
    const int head_kv = head / (heads_q / heads_kv);
% if varlen > 0 then
% packed_sequence()
    q += (I64)q_first * q_ss;
    k += (I64)k_first * k_ss;
    v += (I64)k_first * v_ss;
    out += (I64)q_first * o_ss;
    lse += (I64)q_first * l_ss;
% end
    const bool live = row < seqlen_q;

    q += batch * q_sb + head * q_sh;
    k += batch * k_sb + head_kv * k_sh;
    v += batch * v_sb + head_kv * v_sh;

    /* The query row, scaled so that q.k is already the exponent's argument (log2 units), or
    ** the tanh argument when soft-capping (FP8: times q's and k's descale factors). */
% descale_factors("P")
    const float q_mul = score_mul * qk_factor;
    float q_row[DP];
    for (int c = 0; c < DP; c++)
        q_row[c] = (live && c < head_dim) ? Q_LOAD(q, row * q_ss + c) * q_mul : 0.0f;
    float acc[DVP];
    for (int c = 0; c < DVP; c++)
        acc[c] = 0.0f;

    /* Keys this row may see: [lo, hi]. Both ends grow with the row, so the group's range is
    ** [lo(first row), hi(last row)]. */
    const int shift = seqlen_k - seqlen_q;
% if local_mask then
    const int last = I_MIN(seqlen_q - 1, row0 + TILE_M - 1);
    const int lo = window_left < 0 ? 0 : I_MAX(0, row + shift - window_left);
    const int hi = window_right < 0 ? seqlen_k - 1 : I_MIN(seqlen_k - 1, row + shift + window_right);
    const int group_lo = window_left < 0 ? 0 : I_MAX(0, row0 + shift - window_left);
    const int group_hi = window_right < 0 ? seqlen_k - 1 : I_MIN(seqlen_k - 1, last + shift + window_right);
% else
    const int lo = 0, hi = seqlen_k - 1, group_lo = 0, group_hi = seqlen_k - 1;
% end

% if mods or sparse or alibi or bias ~= "" then
    MASK_CTX(mc, P.mask, batch, head, seqlen_q, seqlen_k);
% end
    float m = -F_INF; /* running max, log2 units */
    float l = 0.0f;      /* running sum of exp2(score - m) */
% if sparse then
    /* Block skipping: a key tile that no row of the group keeps is neither loaded nor scored
    ** (documents, block-sparse masks, ranges). Tile t's flag is sm.kept[t % 2]; the other one
    ** is cleared for the next tile while this one is decided. */
    if (tid == 0)
        sm.kept[0] = sm.kept[1] = 0;
    int t = 0;
% end
    for (int n0 = group_lo / TILE_N * TILE_N; n0 <= group_hi; n0 += TILE_N) {
% if block_mask then
        /* The caller's class of the 128 x 128 block that holds this tile: 0 skips it. */
        const int block_class = GPTR(const int, P.mask.block_mask)[batch * P.mask.blocks_sb +
                                                               head * P.mask.blocks_sh +
                                                               (row0 / 128) * P.mask.blocks_sq + n0 / 128];
        if (block_class == 0)
            continue;
% end
        BARRIER();
% if sparse then
        const int flag = t++ & 1;
        bool any = false;
        for (int j = 0; j < TILE_N && !any; j++) {
            const int key = n0 + j;
            const bool in_range = live && key < seqlen_k;
% emit_keep()
            any = in_range && keep && key >= lo && key <= hi;
        }
        if (any)
            LOCAL_FLAG_SET(sm.kept[flag]);
        if (tid == 0)
            sm.kept[flag ^ 1] = 0;
        BARRIER();
        if (!sm.kept[flag])
            continue;
% end
        for (int i = tid; i < TILE_N * DP; i += TILE_M) {
            const int r = i / DP, c = i % DP, key = n0 + r;
            sm.k[r][c] = (key < seqlen_k && c < head_dim) ? KV_LOAD(k, key * k_ss + c) : 0.0f;
        }
        for (int i = tid; i < TILE_N * DVP; i += TILE_M) {
            const int r = i / DVP, c = i % DVP, key = n0 + r;
            sm.v[r][c] = (key < seqlen_k && c < head_dim_v) ? KV_LOAD(v, key * v_ss + c) : 0.0f;
        }
        BARRIER();

        float s[TILE_N];
        float m_new = m;
        for (int j = 0; j < TILE_N; j++) {
            float x = 0.0f;
            for (int c = 0; c < DP; c++)
                x = F_FMA(q_row[c], sm.k[j][c], x);
% if softcap then
            x = cap_mul * F_TANH(x);
% end
            const int key = n0 + j;
            const bool in_range = live && key < seqlen_k;
% if alibi or bias ~= "" or score_mod ~= "" then
            if (in_range)
                x = fj_score(mc, x, row, key);
% end
% emit_keep()
            s[j] = (live && keep && key >= lo && key <= hi) ? x : -F_INF;
            m_new = F_MAX(m_new, s[j]);
        }
        if (m_new == -F_INF)
            continue; /* every key of this tile is masked for this row */
        const float alpha = F_EXP2(m - m_new);
        l *= alpha;
        for (int c = 0; c < DVP; c++)
            acc[c] *= alpha;
        for (int j = 0; j < TILE_N; j++) {
            const float p = F_EXP2(s[j] - m_new);
            l += p;
            for (int c = 0; c < DVP; c++)
                acc[c] = F_FMA(p, sm.v[j][c], acc[c]);
        }
        m = m_new;
    }

    if (!live)
        return;
    const float inv_l = l > 0.0f ? v_factor / l : 0.0f;
    out += batch * o_sb + head * o_sh + row * o_ss;
    for (int c = 0; c < head_dim_v; c++)
        O_STORE(out, c, acc[c] * inv_l);
% if write_lse then
    lse[batch * l_sb + head * l_sh + row * l_ss] = l > 0.0f ? (m + F_LOG2(l)) * F_LN2 : -F_INF;
% end
}
