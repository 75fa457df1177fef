% -- Appending keys and values to a paged KV cache (fj_kv_cache_append): token t of sequence b
% -- (k_new[b, t], v_new[b, t]) goes to position seqused_k[b] + t of the sequence, that is row
% -- position % page_size of page page_table[b, position / page_size]. A position beyond the
% -- table's pages is not written; a page number is clamped into the cache (device data the host
% -- cannot check). New tokens of the caches' dtype are copied as bits; others (q_dtype: f16,
% -- bf16, f32) are divided by their (batch, kv head)'s descale factor (NULL: 1) and rounded
% -- into the caches' dtype (out_dtype; into FP8 saturating, as the dialect's stores).
% --
% -- Work: a work-group of THREADS work-items per (token, sequence) copies the token's keys and
% -- values of every kv head. Packed new tokens (varlen): a work-group per row of k_new and v_new,
% -- which finds its sequence b by bisection of cu_seqlens_new and is its token row - (b's first
% -- row, clamped as sequence.lua's packed_queries clamps offsets); a row of no sequence is not
% -- written.
% --
% -- Parameters: backend, q/kv/out dtypes (kv_dtype: the caches'; q_dtype ~= out_dtype: new
% -- tokens of q_dtype rounded into out_dtype, the caches' again; else copied by bits, kv_dtype
% -- giving the element size), varlen, threads, args (fj_append_params).
% assert(threads == 128, "kv_append: 128 work-items per work-group")
% include("dialect.lua")
% include("params.lua")
% include("sequence.lua")
% params_struct(args)
#define THREADS ${threads}
% local convert = q_dtype ~= out_dtype
% if convert then
typedef q_t new_t;   /* an element of k_new, v_new */
typedef o_t cache_t; /* of the caches */
/* Element j of src divided by descale factor f into element i of dst, rounded; a factor is
** element at of d, or 1 without d. */
#define PUT(dst, i, src, j, f) O_STORE(dst, i, Q_LOAD_RO(src, j) / (f))
#define FACTOR(d, at) ((d) ? LDG((d) + (at)) : 1.0f)
% else
% local raw = kv_dtype == "f32" and "uint" or is_fp8(kv_dtype) and "uchar" or "ushort"
typedef ${raw} new_t; /* an element's bits */
typedef ${raw} cache_t;
/* Element j of src copied to element i of dst (no factor: f is not compiled). */
#define PUT(dst, i, src, j, f) ((dst)[i] = (src)[j])
% end

% page_number()

KERNEL(THREADS)
fj_kv_append(
% params_arg(args)
)
{
% if varlen > 0 then
    const int r = BLOCK_X, tid = THREAD_X;
    GLOBAL const int *cu_seqlens_q = GPTR(const int, P.cu_seqlens_new);
    const int total_q = P.tokens, max_seqlen_q = P.tokens;
    /* The last sequence whose first row is at most r (0 <= r < tokens: clamping the offsets
    ** into the rows would not change a comparison). */
    int batch = 0;
    for (int hi = P.batch - 1; batch < hi;) {
        const int mid = batch + (hi - batch + 1) / 2;
        if (LDG(cu_seqlens_q + mid) <= r)
            batch = mid;
        else
            hi = mid - 1;
    }
%   packed_queries()
    if (r < q_first || r >= q_first + seqlen_q)
        return; /* a row between sequences (or offsets out of order) */
    const int b = batch, t = r - q_first;
% else
    const int t = BLOCK_X, b = BLOCK_Y, tid = THREAD_X;
% end
% local new_row = varlen > 0 and "r" or "t" -- the token's row of k_new and v_new
    const I64 position = (I64)I_MAX(LDG(GPTR(const int, P.seqused_k) + b), 0) + t;
    if (position >= (I64)P.max_pages * P.page_size)
        return; /* beyond the sequence's pages */
    const int slot = (int)(position / P.page_size), row = (int)(position % P.page_size);
    GLOBAL const int *pages = GPTR(const int, P.page_table) + b * P.pt_sb;
    const int page = PAGE_NUMBER(slot);
    GLOBAL const new_t *kn = GPTR(const new_t, P.k_new) + b * P.kn_sb + (I64)${new_row} * P.kn_ss;
    GLOBAL const new_t *vn = GPTR(const new_t, P.v_new) + b * P.vn_sb + (I64)${new_row} * P.vn_ss;
    GLOBAL cache_t *kc = GPTR(cache_t, P.k_cache) + page * P.kc_sp + (I64)row * P.kc_ss;
    GLOBAL cache_t *vc = GPTR(cache_t, P.v_cache) + page * P.vc_sp + (I64)row * P.vc_ss;
% if convert then
    GLOBAL const float *kd = GPTR(const float, P.k_descale), *vd = GPTR(const float, P.v_descale);
% end
    for (int i = tid; i < P.heads_kv * P.head_dim; i += THREADS) {
        const int h = i / P.head_dim, c = i % P.head_dim;
        PUT(kc, h * P.kc_sh + c, kn, h * P.kn_sh + c, FACTOR(kd, b * P.kd_sb + h * P.kd_sh));
    }
    for (int i = tid; i < P.heads_kv * P.head_dim_v; i += THREADS) {
        const int h = i / P.head_dim_v, c = i % P.head_dim_v;
        PUT(vc, h * P.vc_sh + c, vn, h * P.vn_sh + c, FACTOR(vd, b * P.vd_sb + h * P.vd_sh));
    }
}
