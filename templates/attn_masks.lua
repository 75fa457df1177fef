% -- Masks beyond the band and score terms, one spelling for every kernel that applies them (the
% -- SIMT forward, the Hopper forward, the block classifier); written in the portable dialect,
% -- so dialect.lua comes first. Each kernel keeps the parameter names of attn_params_portable()
% -- (attn_params_tail() in cuda_attn_common.lua spells the same list for the CUDA kernels).
% --
% -- Parameters: mask_mod and score_mod (checked canonical expressions, "" for none: see
% -- runtime/expr.h), alibi, bias ("", "f32", "dtype"), bias_tma, mask_tensor, mask_ranges (0, 2
% -- or 4).
% --
% -- MASK_CTX(c, batch, head) declares `mask_ctx c` for one (batch, head); then
% --   fj_keeps(c, row, key)        whether row keeps key under mask_mod, the mask tensor and the
% --                                ranges (the band, the block classes and the tensor's ends
% --                                are the caller's: row < seqlen_q, key < seqlen_k);
% --   fj_score(c, x, row, key)     score x (log2 units, scaled and capped) with ALiBi, bias and
% --                                score_mod applied; the same bounds.

% -- bias_tma: the kernel adds the bias itself from shared memory (fj_score leaves it out).
% local element_masks = mask_mod ~= "" or mask_tensor or mask_ranges > 0
% local bias_global = bias ~= "" and not bias_tma
% local score_terms = alibi or bias_global or score_mod ~= ""

% -- The forward kernels' parameter list in the dialect, after the kernel's name; sq and sk name
% -- the sequence-length parameters (with variable lengths they are the maxima).
% function attn_params_portable(sq, sk, more)
            (GLOBAL const STORE_T *q, GLOBAL const STORE_T *k, GLOBAL const STORE_T *v,
            GLOBAL STORE_T *out, GLOBAL float *lse,
            int ${sq}, int ${sk}, int heads_q, int heads_kv, int head_dim, int head_dim_v,
            I64 q_sb, I64 q_ss, I64 q_sh, I64 k_sb, I64 k_ss, I64 k_sh,
            I64 v_sb, I64 v_ss, I64 v_sh, I64 o_sb, I64 o_ss, I64 o_sh,
            I64 l_sb, I64 l_sh, I64 l_ss,
            float score_mul, float cap_mul, int window_left, int window_right,
            GLOBAL const float *mod_args, int mod_args_count,
            GLOBAL const float *alibi, I64 alibi_sb,
            GLOBAL const void *bias, I64 bias_sb, I64 bias_sh, I64 bias_ss,
            GLOBAL const uchar *mask, I64 mask_sb, I64 mask_sh, I64 mask_ss,
            GLOBAL const int *cu_seqlens_q, GLOBAL const int *cu_seqlens_k,
            GLOBAL const int *seqused_k, int total_q, int total_k,
            GLOBAL const int *mask_ranges, I64 ranges_sb, I64 ranges_sh, I64 ranges_sk,
            GLOBAL const int *block_mask, I64 blocks_sb, I64 blocks_sh, I64 blocks_sq${more and "," or ")"}
% end

% if bias == "f32" then
typedef float BIAS_T;
#define BIAS_LOAD(p, i) ((p)[i])
% elseif bias == "dtype" then
typedef STORE_T BIAS_T;
#define BIAS_LOAD(p, i) LOAD(p, i)
% end

/* What the masks and score terms read for one (batch, head). */
typedef struct mask_ctx {
    int b, h, sq, sk;
    int shift; /* keys align with queries bottom-right: ALiBi's distance is |q + shift - k| */
% if mask_mod ~= "" or score_mod ~= "" then
    GLOBAL const float *mod_args;
    int mod_args_count;
% end
% if alibi then
    float slope; /* log2 units */
% end
% if bias ~= "" then
    GLOBAL const BIAS_T *bias;
    I64 bias_ss;
% end
% if mask_tensor then
    GLOBAL const uchar *mask;
    I64 mask_ss;
% end
% if mask_ranges > 0 then
    GLOBAL const int *ranges;
    I64 ranges_sk;
% end
} mask_ctx;

#define MASK_CTX(c, batch_, head_)                                                          \
    mask_ctx c;                                                                             \
    c.b = (batch_);                                                                         \
    c.h = (head_);                                                                          \
    c.sq = seqlen_q;                                                                        \
    c.sk = seqlen_k;                                                                        \
    c.shift = seqlen_k - seqlen_q;                                                          \
    MASK_CTX_MODS(c)                                                                        \
    MASK_CTX_ALIBI(c)                                                                       \
    MASK_CTX_BIAS(c)                                                                        \
    MASK_CTX_MASK(c)                                                                        \
    MASK_CTX_RANGES(c)
% if mask_mod ~= "" or score_mod ~= "" then
#define MASK_CTX_MODS(c) c.mod_args = mod_args; c.mod_args_count = mod_args_count;
% else
#define MASK_CTX_MODS(c)
% end
% if alibi then
#define MASK_CTX_ALIBI(c) c.slope = alibi[c.b * alibi_sb + c.h] * (1.0f / F_LN2);
% else
#define MASK_CTX_ALIBI(c)
% end
% if bias ~= "" then
#define MASK_CTX_BIAS(c) c.bias = (GLOBAL const BIAS_T *)bias + c.b * bias_sb + c.h * bias_sh; c.bias_ss = bias_ss;
% else
#define MASK_CTX_BIAS(c)
% end
% if mask_tensor then
#define MASK_CTX_MASK(c) c.mask = mask + c.b * mask_sb + c.h * mask_sh; c.mask_ss = mask_ss;
% else
#define MASK_CTX_MASK(c)
% end
% if mask_ranges > 0 then
#define MASK_CTX_RANGES(c) c.ranges = mask_ranges + c.b * ranges_sb + c.h * ranges_sh; c.ranges_sk = ranges_sk;
% else
#define MASK_CTX_RANGES(c)
% end

% if mask_mod ~= "" or score_mod ~= "" then
/* The names the expressions use (see runtime/expr.h); loads clamp into mod_args. */
#define FJ_B (c.b)
#define FJ_H (c.h)
#define FJ_Q fj_q
#define FJ_K fj_k
#define FJ_SQ (c.sq)
#define FJ_SK (c.sk)
#define FJ_S fj_s
#define ARG_INDEX(i) I_MIN(I_MAX((int)(i), 0), c.mod_args_count - 1)
#define ARG_F(i) (c.mod_args_count > 0 ? c.mod_args[ARG_INDEX(i)] : 0.0f)
#define ARG_I(i) (c.mod_args_count > 0 ? ((GLOBAL const int *)c.mod_args)[ARG_INDEX(i)] : 0)
% end

% if element_masks then
INLINE bool fj_keeps(const mask_ctx c, int fj_q, int fj_k)
{
    bool keep = true;
%   if mask_mod ~= "" then
    keep = (${mask_mod}) != 0;
%   end
%   if mask_tensor then
    keep = keep && c.mask[fj_q * c.mask_ss + fj_k] != 0;
%   end
%   if mask_ranges > 0 then
    GLOBAL const int *r = c.ranges + fj_k * c.ranges_sk;
    keep = keep && !(fj_q >= r[0] && fj_q < r[1]);
%     if mask_ranges == 4 then
    keep = keep && !(fj_q >= r[2] && fj_q < r[3]);
%     end
%   end
    return keep;
}
% end

% if score_terms then
INLINE float fj_score(const mask_ctx c, float x, int fj_q, int fj_k)
{
%   if alibi then
    x -= c.slope * (float)EXPR_IABS(fj_q + c.shift - fj_k);
%   end
%   if bias_global then
    x += BIAS_LOAD(c.bias, fj_q * c.bias_ss + fj_k) * (1.0f / F_LN2);
%   end
%   if score_mod ~= "" then
    const float fj_s = x * F_LN2; /* the score after scaling and soft-capping */
    x = (${score_mod}) * (1.0f / F_LN2);
%   end
    return x;
}
% end
