% -- Masks beyond the band and score terms, one spelling for every kernel that applies them (the
% -- SIMT forward, the Hopper forward, the block classifier); written in the portable dialect,
% -- so dialect.lua comes first. They read the family's mask parameter block (fj_mask_params,
% -- plan/families.h).
% --
% -- Parameters: mask_mod and score_mod (checked canonical expressions, "" for none: see
% -- plan/expr.h), score_mod_grad (its derivative with respect to s, "" outside the backward),
% -- alibi, bias ("", "f32", "dtype"), bias_tma, mask_tensor, mask_ranges (0, 2 or 4).
% --
% -- MASK_CTX(c, m, batch, head, sq, sk) declares `mask_ctx c` for one (batch, head) of sequence
% -- lengths sq and sk from the mask block m; then
% --   fj_keeps(c, row, key)        whether row keeps key under mask_mod, the mask tensor and the
% --                                ranges (the band, the block classes and the tensor's ends
% --                                are the caller's: row < seqlen_q, key < seqlen_k);
% --   fj_score(c, x, row, key)     score x (log2 units, scaled and capped) with ALiBi, bias and
% --                                score_mod applied; the same bounds;
% --   fj_score_grad(c, x, row, key) (score_mod_grad given: the backward) the derivative of
% --                                score_mod with respect to s at the s fj_score gives it;
% -- and, for the including template, mask_terms.keeps and mask_terms.score: whether fj_keeps
% -- and fj_score are defined (the variant has element masks, score terms).

% -- bias_tma: the kernel adds the bias itself from shared memory (fj_score leaves it out).
% local element_masks = mask_mod ~= "" or mask_tensor or mask_ranges > 0
% local bias_global = bias ~= "" and not bias_tma
% local score_terms = alibi or bias_global or score_mod ~= ""
% mask_terms = { keeps = element_masks, score = score_terms }

% if bias == "f32" then
typedef float BIAS_T;
#define BIAS_LOAD(p, i) LDG((p) + (i))
% elseif bias == "dtype" then
typedef q_t BIAS_T; /* q's element type, whatever k's and v's (an FP8 KV cache) */
#define BIAS_LOAD(p, i) Q_LOAD_RO(p, i)
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

#define MASK_CTX(c, m, batch_, head_, sq_, sk_)                                              \
    mask_ctx c;                                                                             \
    c.b = (batch_);                                                                         \
    c.h = (head_);                                                                          \
    c.sq = (sq_);                                                                           \
    c.sk = (sk_);                                                                           \
    c.shift = c.sk - c.sq;                                                                  \
    MASK_CTX_MODS(c, m)                                                                     \
    MASK_CTX_ALIBI(c, m)                                                                    \
    MASK_CTX_BIAS(c, m)                                                                     \
    MASK_CTX_MASK(c, m)                                                                     \
    MASK_CTX_RANGES(c, m)
% if mask_mod ~= "" or score_mod ~= "" then
#define MASK_CTX_MODS(c, m) c.mod_args = GPTR(const float, (m).mod_args); c.mod_args_count = (m).mod_args_count;
% else
#define MASK_CTX_MODS(c, m)
% end
% if alibi then
#define MASK_CTX_ALIBI(c, m) c.slope = LDG(GPTR(const float, (m).alibi) + c.b * (m).alibi_sb + c.h) * (1.0f / F_LN2);
% else
#define MASK_CTX_ALIBI(c, m)
% end
% if bias ~= "" then
#define MASK_CTX_BIAS(c, m) c.bias = GPTR(const BIAS_T, (m).bias) + c.b * (m).bias_sb + c.h * (m).bias_sh; c.bias_ss = (m).bias_ss;
% else
#define MASK_CTX_BIAS(c, m)
% end
% if mask_tensor then
#define MASK_CTX_MASK(c, m) c.mask = GPTR(const uchar, (m).mask) + c.b * (m).mask_sb + c.h * (m).mask_sh; c.mask_ss = (m).mask_ss;
% else
#define MASK_CTX_MASK(c, m)
% end
% if mask_ranges > 0 then
#define MASK_CTX_RANGES(c, m) c.ranges = GPTR(const int, (m).mask_ranges) + c.b * (m).ranges_sb + c.h * (m).ranges_sh; c.ranges_sk = (m).ranges_sk;
% else
#define MASK_CTX_RANGES(c, m)
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
/* An expression that reads arg[] or iarg[] is only accepted with mod_args_count >= 1 and
** mod_args set (runtime/attention.c, validate.c), so the loads need no guard: unguarded, the
** compiler merges the repeated ones (a guard made it load every one of them apart, 10 % of a
** documents mask given as iarg[] bounds at 8k). */
INLINE int arg_index(int i, int n) { return i < 0 ? 0 : i < n ? i : n - 1; }
#define ARG_F(i) LDG(c.mod_args + arg_index((int)(i), c.mod_args_count))
#define ARG_I(i) LDG((GLOBAL const int *)c.mod_args + arg_index((int)(i), c.mod_args_count))
% end

% if score_mod ~= "" then
/* A score_mod value in the kernels' log2 units. A finite score beyond what those can hold
** saturates (a row of equal huge scores is still a uniform softmax); -inf still masks, NaN stays. */
INLINE float score_to_log2(float v)
{
    const float x = v * (1.0f / F_LN2);
    return EXPR_FABS(v) < F_INF ? EXPR_FMIN(EXPR_FMAX(x, -F_MAXF), F_MAXF) : x;
}
% end

% if element_masks then
INLINE bool fj_keeps(const mask_ctx c, int fj_q, int fj_k)
{
    bool keep = true;
%   if mask_mod ~= "" then
    keep = (${mask_mod}) != 0;
%   end
%   if mask_tensor then
    keep = keep && LDG(c.mask + fj_q * c.mask_ss + fj_k) != 0;
%   end
%   if mask_ranges > 0 then
    GLOBAL const int *r = c.ranges + fj_k * c.ranges_sk;
    keep = keep && !(fj_q >= LDG(r) && fj_q < LDG(r + 1));
%     if mask_ranges == 4 then
    keep = keep && !(fj_q >= LDG(r + 2) && fj_q < LDG(r + 3));
%     end
%   end
    return keep;
}
% end

% if score_terms then
/* Score x with ALiBi and the bias added: what score_mod reads as s (in log2 units). */
INLINE float fj_score_input(const mask_ctx c, float x, int fj_q, int fj_k)
{
%   if alibi then
    x -= c.slope * (float)EXPR_IABS(fj_q + c.shift - fj_k);
%   end
%   if bias_global then
    x += BIAS_LOAD(c.bias, fj_q * c.bias_ss + fj_k) * (1.0f / F_LN2);
%   end
    return x;
}

INLINE float fj_score(const mask_ctx c, float x, int fj_q, int fj_k)
{
    x = fj_score_input(c, x, fj_q, fj_k);
%   if score_mod ~= "" then
    const float fj_s = x * F_LN2; /* the score after scaling, soft-capping, ALiBi and bias */
    x = score_to_log2(${score_mod});
%   end
    return x;
}
% end
% if score_mod_grad ~= "" then

INLINE float fj_score_grad(const mask_ctx c, float x, int fj_q, int fj_k)
{
    const float fj_s = fj_score_input(c, x, fj_q, fj_k) * F_LN2;
    return ${score_mod_grad};
}
% end
