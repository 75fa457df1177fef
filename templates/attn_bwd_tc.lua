% -- The parts that the backward's tensor-core kernels share (attn_bwd_mma.cu.lua on mma.sync,
% -- attn_bwd_wgmma.cu.lua on Hopper's wgmma), so that what decides a gradient is spelled once:
% -- the block's sequence, its block classes and masks, the element pass that turns scores into
% -- P and dS, and the dk/dv kernel's stream of query tiles and its stores.
% --
% -- Both kernels hold a warp's 16 rows of a product in mma's accumulator layout: element e of
% -- column block j, x[j][e], is row g + 8 (e / 2) and column 8 j + 2 t + (e % 2) (g = lane / 4,
% -- t = lane % 4), which is also the layout of wgmma's accumulators, warp by warp.
% --
% -- Parameters: the masks' and score terms' (attn_masks.lua), softcap, local_mask, block_mask,
% -- varlen. Include after cuda_mma.lua and cuda_attn_common.lua; it includes what its parts
% -- read (the masks and score terms, packed sequences) where the variant has them.
% -- What its parts need of every kernel that includes it: score_mod's derivative (the element
% -- pass), and tiles within the 128 x 128 class blocks (a tile reads one block's class).
% assert(score_mod == "" or score_mod_grad ~= "", "attn_bwd_tc: score_mod needs score_mod_grad")
% assert(not block_mask or (128 % tile_m == 0 and 128 % tile_n == 0), "attn_bwd_tc: block classes need tiles that divide 128")
% local element_masks = mask_mod ~= "" or mask_tensor or mask_ranges > 0
% local terms = alibi or bias ~= "" or score_mod ~= ""
% include("dialect.lua")
% if element_masks or terms then
% include("attn_masks.lua")
% end
% if varlen > 0 then
% include("sequence.lua")
% end

% -- The kernels on mma.sync (attn_bwd_mma.cu.lua, attn_bwd_dbias_mma.cu.lua): the tile macros,
% -- the infinities, log2(e) and load_tile. After cuda_mma.lua and params_struct().
% function bwd_mma_preamble()
% mma_tile_macros()
#define NEG_INF __int_as_float(0xff800000)
#define POS_INF __int_as_float(0x7f800000)
#define LOG2E 1.4426950408889634f
% mma_load_tile()
% end

% -- The shared memory of a block that owns BN keys and streams query tiles (the dk/dv kernel on
% -- mma.sync, and the dbias kernel): K [BN][QS], V [BN][VS], then two buffers of Q [BM][QS]
% -- and dO [BM][VS], then two of the rows' lse (log2 units) and D, [BM] floats each, then
% -- `extra` bytes (a C expression, or nil), all checked against the host's size. Then
% -- bwd_stream_smem_pointers(extra_name) in the kernel declares sK, sV, sQG (buffer b: Q at
% -- sQG + b * QG_ELEMS, dO after it), sLD (buffer b: lse at sLD + 2 * BM * b, D after it) and,
% -- given a name, that `extra` area's start as 16-bit elements.
% function bwd_stream_smem(extra)
/* Shared memory: K [BN][QS], V [BN][VS], two buffers of Q [BM][QS] and dO [BM][VS], two of the
** rows' lse and D ([BM] floats each)${extra and ", then " .. extra .. " bytes" or ""}. */
#define QG_ELEMS (BM * (QS + VS))
static_assert(2 * (BN * (QS + VS) + 2 * QG_ELEMS) + 16 * BM ${extra and ("+ " .. extra .. " ") or ""}== ${shared_bytes},
              "the host's shared-memory size");
% end
% function bwd_stream_smem_pointers(extra_name)
    extern __shared__ __attribute__((aligned(128))) unsigned char smem[];
    elem_t *sK = (elem_t *)smem;
    elem_t *sV = sK + BN * QS;
    elem_t *sQG = sV + BN * VS;
    float *sLD = (float *)(sQG + 2 * QG_ELEMS);
%   if extra_name then
    elem_t *const ${extra_name} = (elem_t *)(sLD + 4 * BM);
%   end
% end

% -- A block's turn in its stream (after bwd_stream_smem_pointers, inside the loop over items i
% -- with buffer b): item i's tiles landed, every warp done with buffer b ^ 1, into which the
% -- next live item's are issued (the kernel's `issue(next, b ^ 1)`); then sQ, sG (dO), sL
% -- (lse) and sD (D) point at buffer b.
% function bwd_stream_landed()
        cp_async_wait_all();
        __syncthreads(); /* item i landed; every warp is done with buffer b ^ 1 */
        if (next < count) {
            issue(next, b ^ 1);
            cp_async_commit();
        }
        const elem_t *sQ = sQG + b * QG_ELEMS, *sG = sQ + BM * QS;
        const float *sL = sLD + 2 * BM * b, *sD = sL + BM;
% end

% -- S^T = K Q^T into s and (want_dp) dP^T = V dO^T into dp: the warp's 16 keys by the BM
% -- queries of buffer b (after bwd_stream_landed).
% function bwd_stream_products(want_dp)
        float s[BM / 8][4], dp[BM / 8][4];
        zero_acc<BM>(s);
        zero_acc<BM>(dp);
        mma_rows_by_rows<BM, DP / 16, QS, QS>(s, sK + warp * 16 * QS, sQ, lane);
%   if want_dp then
        mma_rows_by_rows<BM, DVP / 16, VS, VS>(dp, sV + warp * 16 * VS, sG, lane);
%   end
% end

% -- The masks' and score terms' context of (batch, `head`) (a C expression), `mc`, where the
% -- variant reads them.
% function bwd_mask_ctx(head)
%   if element_masks or terms then
        MASK_CTX(mc, P.fwd.mask, batch, ${head}, seqlen_q, seqlen_k);
%   end
% end

% -- The block's sequence: with packed sequences (varlen), where it starts in the packed tensors
% -- and its lengths (sequence.lua: q_first, k_first, seqlen_q, seqlen_k the keys it uses, len_k
% -- those it holds, whose rows past seqlen_k get zero gradients), and the rows per (batch,
% -- head) of the D workspace; dense: the tensors' own. Goes where `batch` is declared.
% -- The names params_unpack() gives the forward block's lengths, so that bwd_sequence() can
% -- declare the sequence's own.
% function bwd_unpack_names()
%   return varlen > 0 and { seqlen_q = "max_seqlen_q", seqlen_k = "max_seqlen_k" } or nil
% end
% function bwd_sequence()
%   if varlen > 0 then
% packed_sequence()
    const int d_rows = max_seqlen_q;
%   else
    const int q_first = 0, k_first = 0, len_k = seqlen_k, d_rows = seqlen_q;
%   end
% end

% -- With block_mask, `block_class_of(head, m, n)`: the class (0 skip, 1 partial, 2 full) of the
% -- 128 x 128 block of (batch, head) that holds query row m and key n. Goes after `batch`; with
% -- `any_batch`, block_class_of(batch, head, m, n) instead.
% function bwd_block_classes(any_batch)
%   if block_mask then
    auto block_class_of = [&](${any_batch and "int batch, " or ""}int head_, int m, int n) {
        return P.fwd.mask.block_mask[batch * P.fwd.mask.blocks_sb + head_ * P.fwd.mask.blocks_sh +
                                     (m / 128) * P.fwd.mask.blocks_sq + n / 128];
    };
%   end
% end

% -- `bool need_mask`: whether the tile of query rows [m0, m0 + BM) and keys [n0, n0 + BN)
% -- crosses the ends or the band, so that its elements are masked one by one.
% function bwd_need_mask()
        bool need_mask = m0 + BM > seqlen_q || n0 + BN > seqlen_k;
% mma_band_crossing()
% end

% -- The element pass over the two products of one tile, s (scores) and dp (dP), NT n8 tiles of
% -- a warp's 16 rows: s becomes P and dp becomes dS (times 1 / scale without soft-capping;
% -- only where want_ds; want_ds "raw": dL/d(score) without soft-capping's derivative, which is
% -- the bias's gradient). lse2 and delta: the log-sum-exp (log2 units, +inf for rows that
% -- see nothing) and D of the element's query; row and key: its query row and key; all C
% -- expressions of the row half h, j and e. masked: elements outside [lo[h], hi[h]] (offsets
% -- from the thread's first column: the ends and the band) get P = 0 without their masks and
% -- terms being read; the element masks (mc: MASK_CTX) apply everywhere, but in tiles whose
% -- block class (`block_class`, with block_mask) is 2. With the mask tensor they come first
% -- and a masked element skips the terms and the exponential (its loads in flight beside the
% -- exponentials spilled 4-12 bytes in Hopper's d 128 dk/dv kernel); computed masks come
% -- after the exponential (first, they spilled 24-32 bytes at d 64 with 128-row tiles).
% function bwd_scores_to_p_ds(nt, lse2, delta, row, key, masked, want_ds)
#pragma unroll
        for (int j = 0; j < ${nt}; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int h = e / 2;
%   if masked then
                const int c = j * 8 + (e & 1);
                const bool inside = c <= hi[h] && c >= lo[h];
%   else
                const bool inside = true;
%   end
                float x = s[j][e] * score_mul, p = 0.0f;
%   if softcap then
                const float th = tanhf(x);
                x = cap_mul * th;
%   end
%   if score_mod ~= "" then
                const float capped = x;
%   end
%   local keeps = (block_mask and "block_class == 2 || " or "") .. "fj_keeps(mc, " .. row .. ", " .. key .. ")"
%   if mask_tensor then
                if (inside && (${keeps})) {
%   else
                if (inside) {
%   end
%   if terms then
                    x = fj_score(mc, x, ${row}, ${key});
%   end
                    p = ex2(x - ${lse2});
%   if element_masks and not mask_tensor then
                    if (!(${keeps}))
                        p = 0.0f;
%   end
                }
                s[j][e] = p;
%   if want_ds then
                float ds = p * (dp[j][e] - ${delta});
%     if score_mod ~= "" then
                /* Through score_mod: p = 0 (masked, or -inf from the expression) contributes
                ** nothing, whatever the derivative there. */
                ds = p > 0.0f ? ds * fj_score_grad(mc, capped, ${row}, ${key}) : 0.0f;
%     end
%     if softcap and want_ds ~= "raw" then
                ds *= scale * (1.0f - th * th);
%     end
                dp[j][e] = ds;
%   end
            }
% end

% -- What dS was not multiplied by: the scale, or nothing with soft-capping.
% function bwd_ds_factor()
%   return softcap and "1.0f" or "scale"
% end

% -- ---- the dk/dv kernel (stage 2): a block owns BN keys from n0 of one (batch, kv head) ----
% -- bwd_dkdv_block(item, divider): the block's keys (key block key_block0 + blockIdx.x of kv
% -- head blockIdx.y, batch blockIdx.z), the thread's fragment coordinates g and t (after
% -- `lane`), its sequence (none left: return) and its stream (bwd_dkdv_stream, `divider` its).
% -- With `item` (a C expression: a persistent grid's work item, Hopper's kernel), the keys,
% -- kv head and batch are item's (key blocks innermost, as a grid's x: P.key_blocks of them a
% -- (batch, kv head), so that the blocks at work at once share their heads' Q and dO tiles in
% -- L2; where the grid spans the kv heads and batches, y and z, the block's), a block without
% -- keys goes on to its next item (`continue`), and q, k, v and lse stay where they are (that
% -- kernel reads them through tensor maps and workspaces).
% function bwd_dkdv_block(item, divider)
    const int g = lane / 4, t = lane % 4; /* row group and column pair of the fragments */
%   if item then
    /* (batch, kv head) pair, and the keys */
    const int pair = (${item}) / P.key_blocks + blockIdx.y + blockIdx.z * heads_kv;
    const int n0 = (${item}) % P.key_blocks * BN;
    const int head_kv = pair % heads_kv, batch = pair / heads_kv;
%   else
    const int n0 = (P.key_block0 + blockIdx.x) * BN, head_kv = blockIdx.y, batch = blockIdx.z;
%   end
    const int group = heads_q / heads_kv;
% bwd_sequence()
    if (n0 >= len_k)
        ${item and "continue" or "return"};
% bwd_dkdv_stream(not item, divider)
% end

% -- bwd_dkdv_stream(moves, divider): moves q, k, v, lse to the block's sequence and heads (where
% -- `moves`), and declares dout, delta, the query rows [m_lo, m_hi) that may see one of the
% -- block's keys, their first tile mb_lo, `tiles` per head and `count`, the (head, query tile)
% -- pairs it streams, heads outermost (none for keys past seqlen_k: zero gradients), and
% -- item_head(i) and item_m0(i), item i's head and first query row: with `divider`, dividing
% -- by `tiles` by dialect.lua's multiply-high (`/` by a run-time int is ~20 instructions,
% -- several an item: mma.sync's kernels), else by `/` (Hopper's kernel, whose consumers
% -- spilled 4-8 bytes with the divider's registers at d 64 with a mask_mod or block classes,
% -- sm_90a). Goes after bwd_sequence().
% function bwd_dkdv_stream(moves, divider)
%   if moves then
    k += batch * k_sb + (long long)k_first * k_ss + head_kv * k_sh;
    v += batch * v_sb + (long long)k_first * v_ss + head_kv * v_sh;
    q += batch * q_sb + (long long)q_first * q_ss;
    lse += batch * l_sb + (long long)q_first * l_ss;
%   end
    const elem_t *dout = P.dout + batch * P.do_sb + (long long)q_first * P.do_ss;
    const float *delta = P.delta + (long long)batch * heads_q * d_rows;

    /* The query rows [m_lo, m_hi) that may see one of the block's keys; first_block(m), for a
    ** row m below the block's m_hi, the first key block whose m_hi is beyond m (m_hi's inverse:
    ** key block j's is past m where (j + 1) BN - shift + window_left > m). */
    int m_lo = 0, m_hi = seqlen_q;
%   if local_mask then
    const int shift = seqlen_k - seqlen_q;
    if (window_right >= 0)
        m_lo = imax(0, n0 - shift - window_right);
    if (window_left >= 0)
        m_hi = imin(seqlen_q, imin(seqlen_k, n0 + BN) - 1 - shift + window_left + 1);
    [[maybe_unused]] auto first_block = [&](int m) {
        return window_left >= 0 ? imax(0, m + shift - window_left) / BN : 0;
    };
%   else
    [[maybe_unused]] auto first_block = [&](int) { return 0; };
%   end
    const int mb_lo = m_lo / BM, tiles = imax(0, (m_hi + BM - 1) / BM - mb_lo);
    /* (head, query tile) pairs, heads outermost; none for keys past seqlen_k (zero gradients). */
    const int count = n0 < seqlen_k ? tiles * group : 0;
    /* Item i: query tile i % tiles (its first row item_m0(i)) of head item_head(i). */
%   if divider then
    const divider by_tiles = divider_of(imax(tiles, 1));
    [[maybe_unused]] auto item_head = [&](int i) { return head_kv * group + div_by(by_tiles, i); };
    [[maybe_unused]] auto item_m0 = [&](int i) { return (mb_lo + mod_by(by_tiles, i)) * BM; };
%   else
    [[maybe_unused]] auto item_head = [&](int i) { return head_kv * group + i / tiles; };
    [[maybe_unused]] auto item_m0 = [&](int i) { return (mb_lo + i % tiles) * BM; };
%   end
% end

% -- The lse (log2 units; +inf for rows past the end or that see nothing) and D of stream item
% -- i's rows into buffer b of sLD ([2][2][BM] floats: per buffer, lse then D). Goes inside the
% -- kernel's `issue(i, b)`, after `head` and `m0` are declared.
% function bwd_load_lse_delta()
        for (int r = tid; r < BM; r += THREADS) {
            const int row = m0 + r;
            const float l = row < seqlen_q ? lse[head * l_sh + row * l_ss] : NEG_INF;
            sLD[2 * BM * b + r] = l == NEG_INF ? POS_INF : l * LOG2E;
            sLD[2 * BM * b + BM + r] = row < seqlen_q ? delta[(long long)head * d_rows + row] : 0.0f;
        }
% end

% -- dQ of a dk/dv tile on mma.sync, by atomics into the f32 workspace: BM rows by DP columns in
% -- pieces of 16 `mt` rows by DQ_COLS columns, as many pieces as warps where the rows allow and
% -- at most 64 columns each (32 accumulators a thread, beside dK's and dV's): DQ_MT, DQ_STRIPS
% -- (pieces down a column), DQ_COLS, DQ_PIECES, and add_dq_piece(), which adds a piece.
% function bwd_dq_pieces(mt)
%   local strips = tile_m // (16 * mt)
%   local per_strip = math.max(1, warps // strips)
%   while head_dim_pad % (16 * per_strip) ~= 0 do per_strip = per_strip // 2 end
%   while head_dim_pad // per_strip > 64 and head_dim_pad % (32 * per_strip) == 0 do per_strip = per_strip * 2 end
#define DQ_MT ${mt}
#define DQ_STRIPS ${strips}
#define DQ_COLS ${head_dim_pad // per_strip}
#define DQ_PIECES ${strips * per_strip}

/* Adds a piece of dQ, acc[DQ_MT][DQ_COLS / 8][4] in mma's layout, rows from row0 and columns
** from c0, into the f32 sum whose rows (DP floats each) start at dq_acc; rows from seqlen_q on
** are not added. */
__device__ __forceinline__ void add_dq_piece(float *dq_acc, const float (*acc)[DQ_COLS / 8][4],
                                             int row0, int c0, int seqlen_q, int lane)
{
    const int g = lane / 4, t = lane % 4;
#pragma unroll
    for (int mi = 0; mi < DQ_MT; mi++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int row = row0 + mi * 16 + g + 8 * h;
            if (row >= seqlen_q)
                continue;
            float *dst = dq_acc + (long long)row * DP + c0 + 2 * t;
#pragma unroll
            for (int j = 0; j < DQ_COLS / 8; j++)
                red_add2(dst + j * 8, acc[mi][j][2 * h], acc[mi][j][2 * h + 1]);
        }
}
% end

% -- The dk/dv kernels' stream on mma.sync (attn_bwd_mma.cu.lua, attn_bwd_mma_grid.cu.lua), after
% -- bwd_stream_smem_pointers() and bwd_dkdv_block(): `issue(i, b)` copies item i's tiles into
% -- buffer b; then the block classes and `live_from`, and the first live item i (with `next`
% -- declared for the loop), its K (and V where `load_v`) and tiles in flight (none: i == count);
% -- `unrolled`: the copies' loops unrolled (load_tile's UNROLLED).
% function bwd_dkdv_stream_start(load_v, unrolled)
%   local u = unrolled and ", true" or ""
    /* Tile i of the stream into buffer b: Q and dO by cp.async, lse and D by the threads. */
    auto issue = [&](int i, int b) {
        const int head = item_head(i), m0 = item_m0(i);
        elem_t *sQ = sQG + b * QG_ELEMS;
        load_tile<BM, DP, QS${u}>(sQ, q + head * q_sh, q_ss, m0, seqlen_q, head_dim);
        load_tile<BM, DVP, VS${u}>(sQ + BM * QS, dout + head * P.do_sh, P.do_ss, m0, seqlen_q,
                               head_dim_v);
% bwd_load_lse_delta()
    };
% bwd_block_classes()
% bwd_live_from(true)
    int i = live_from(0), next;
    if (i < count) {
        load_tile<BN, DP, QS${u}>(sK, k, k_ss, n0, seqlen_k, head_dim);
%   if load_v then
        load_tile<BN, DVP, VS${u}>(sV, v, v_ss, n0, seqlen_k, head_dim_v);
%   end
        issue(i, 0);
        cp_async_commit();
    }
% end

% -- `live_from(i)`: the stream's first item from i on that is live: with block classes, tiles
% -- of class 0 are neither loaded nor computed. With `vote` (whole warps call it, with the
% -- registers to spare: see bwd_hopper_item) 32 tiles at a time.
% function bwd_live_from(vote)
    /* The stream's first item from i on that is live (count where none is): with block
    ** classes, tiles of class 0 are neither loaded nor computed. */
    auto live_from = [&](int i) {
%   if block_mask and vote then
        if (i >= count)
            return i;
        /* A key block's classes lie a class row apart, a cache line each: the warp reads up to
        ** 32 query tiles' of one head at once, tile t + lane a lane, and votes, rather than
        ** chaining a dependent load a tile (count is whole heads of `tiles` each). */
#pragma unroll 1
        for (int h = i / tiles, t = i % tiles; i < count;) {
            const int here = t + (int)(threadIdx.x & 31u);
            const u32 live = __ballot_sync(
                0xffffffffu,
                here < tiles && block_class_of(head_kv * group + h, (mb_lo + here) * BM, n0) != 0);
            if (live)
                return i + __ffs(live) - 1;
            const int step = min(32, tiles - t);
            i += step;
            t += step;
            if (t == tiles) {
                t = 0;
                h++;
            }
        }
        return count;
%   elseif block_mask then
        if (i >= count)
            return i;
        /* Item i is query tile t of head h of the group (stepped, not divided, per item). */
        for (int h = i / tiles, t = i % tiles;
             i < count && block_class_of(head_kv * group + h, (mb_lo + t) * BM, n0) == 0; i++)
            if (++t == tiles) {
                t = 0;
                h++;
            }
        return i;
%   else
        return i;
%   end
    };
% end

% -- The lse and D of element e of fragment column block j of a dk/dv tile (sL, sD: its queries').
% local DKDV_LSE2, DKDV_DELTA = "sL[j * 8 + 2 * t + (e & 1)]", "sD[j * 8 + 2 * t + (e & 1)]"

% -- The C expressions of the lse2 and D of element e of column block j: sL and sD from the C
% -- expression `at` (default 0: the tile's first query's).
% function bwd_dkdv_lse2_delta(at)
%   if not at then
%     return DKDV_LSE2, DKDV_DELTA
%   end
%   local at_e = at .. " + j * 8 + 2 * t + (e & 1)]"
%   return "sL[" .. at_e, "sD[" .. at_e
% end

% -- lo[2] and hi[2]: the query offsets [lo, hi] from the thread's first column col0 (`first` +
% -- 2 t) that each of its two keys (from key_row) sees: the ends and the band.
% function bwd_dkdv_bounds(first)
            const int col0 = ${first} + 2 * t;
            int lo[2], hi[2];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int key = key_row + g + 8 * h;
                hi[h] = key < seqlen_k ? seqlen_q - 1 - col0 : -1;
                lo[h] = 0 - col0;
%   if local_mask then
                if (window_right >= 0)
                    lo[h] = imax(lo[h], key - shift - window_right - col0);
                if (window_left >= 0)
                    hi[h] = imin(hi[h], key - shift + window_left - col0);
%   end
            }
% end

% -- The element pass of a dk/dv tile: s = S^T and dp = dP^T, a warp's 16 keys from key_row by
% -- `cols` queries (default BM) from the C expression `first` (default m0), whose lse and D are
% -- sL and sD from the C expression `at` (default 0: the tile's first query's). Masked where the
% -- tile (BM queries from m0) crosses the ends or the band: query offsets [lo, hi] from the
% -- thread's first column col0 that each of its two keys sees.
% function bwd_dkdv_elements(want_ds, cols, first, at)
%   cols = cols or "BM"
%   first = first or "m0"
%   local lse2, delta = bwd_dkdv_lse2_delta(at)
        /* Masked where the tile crosses the ends or the band: query offsets [lo, hi] from the
        ** thread's first column col0 that each of its two keys sees. */
% bwd_need_mask()
#define LSE2 ${lse2}
#define DELTA ${delta}
        if (need_mask) {
% bwd_dkdv_bounds(first)
% bwd_scores_to_p_ds(cols .. " / 8", "LSE2", "DELTA", first .. " + 8 * j + 2 * t + (e & 1)", "key_row + g + 8 * h", true, want_ds)
        } else {
% bwd_scores_to_p_ds(cols .. " / 8", "LSE2", "DELTA", first .. " + 8 * j + 2 * t + (e & 1)", "key_row + g + 8 * h", false, want_ds)
        }
#undef LSE2
#undef DELTA
% end

% -- Whether dS is P (dP - D) alone, so that a kernel may compute P first (bwd_dkdv_elements(false))
% -- and dS later (bwd_dkdv_ds_from_p): not through soft-capping's or score_mod's derivatives,
% -- which need each score again.
% function bwd_ds_from_p_only()
%   return not softcap and score_mod == ""
% end

% -- Whether P is the exponential of the score less the row's lse but outside the ends and the
% -- band (no element masks, score terms or soft-capping): then a kernel may take every
% -- exponential of a tile unmasked (bwd_dkdv_exps), in one stretch of code with other products
% -- so that they run beside them, and zero those outside the bounds later (bwd_dkdv_clip).
% function bwd_p_from_bounds_only()
%   return not element_masks and not terms and not softcap
% end

% -- P^T into s from the scores S^T in s, every element's, `cols` queries (default BM) whose lse
% -- is sL from the C expression `at` (default 0): elements outside the bounds may be anything
% -- (+inf where the score exceeds its row's lse) until bwd_dkdv_clip.
% function bwd_dkdv_exps(cols, at)
%   assert(bwd_p_from_bounds_only(), "bwd_dkdv_exps: P needs more than the bounds")
%   local lse2 = bwd_dkdv_lse2_delta(at)
#pragma unroll
        for (int j = 0; j < ${cols or "BM"} / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                s[j][e] = ex2(s[j][e] * score_mul - ${lse2});
% end

% -- bwd_dkdv_exps' P in s zeroed outside the ends and the band, where the tile (`cols` queries
% -- from the C expression `first`, as bwd_dkdv_elements) crosses them.
% function bwd_dkdv_clip(cols, first)
%   first = first or "m0"
% bwd_need_mask()
        if (need_mask) {
% bwd_dkdv_bounds(first)
#pragma unroll
            for (int j = 0; j < ${cols or "BM"} / 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int c = j * 8 + (e & 1), h = e / 2;
                    if (c > hi[h] || c < lo[h])
                        s[j][e] = 0.0f;
                }
        }
% end

% -- The second half of a dk/dv tile's element pass split by bwd_ds_from_p_only(): dS^T =
% -- P^T (dP^T - D) into dp from P^T in s, `cols` queries (default BM) whose D is sD from the C
% -- expression `at` (default 0). Masked elements have P = 0, so their dS is 0 as in the whole
% -- pass.
% function bwd_dkdv_ds_from_p(cols, at)
%   assert(bwd_ds_from_p_only(), "bwd_dkdv_ds_from_p: dS needs the scores here")
%   cols = cols or "BM"
%   local _, delta = bwd_dkdv_lse2_delta(at)
#pragma unroll
        for (int j = 0; j < ${cols} / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                dp[j][e] = s[j][e] * (dp[j][e] - ${delta});
% end

% -- The warp's keys' rows of dK and dV from the accumulators dka[DP / 8][4] and dva[DVP / 8][4]
% -- (zeros for keys no query sees); with `split`, the warpgroup's columns: dka[DH / 8][4] from
% -- column wg * DH and dva[DVH / 8][4] from wg * DVH.
% function bwd_store_dkdv(want_dk, want_dv, split)
%   local dk_cols, dv_cols = split and "DH" or "DP", split and "DVH" or "DVP"
%   local dk_first, dv_first = split and "wg * DH + " or "", split and "wg * DVH + " or ""
    /* The warp's keys' rows of dK and dV (zeros for keys no query sees). */
    elem_t *dk = P.dk + batch * P.dk_sb + (long long)k_first * P.dk_ss + head_kv * P.dk_sh${split and " + wg * DH" or ""};
    elem_t *dv = P.dv + batch * P.dv_sb + (long long)k_first * P.dv_ss + head_kv * P.dv_sh${split and " + wg * DVH" or ""};
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int key = key_row + g + 8 * h;
        if (key >= len_k)
            continue;
%   if want_dk then
#pragma unroll
        for (int j = 0; j < ${dk_cols} / 8; j++) {
            const int col = j * 8 + 2 * t;
            if (${dk_first}col < head_dim)
                *(u32 *)(dk + key * P.dk_ss + col) =
                    pack2(dka[j][2 * h] * ${bwd_ds_factor()}, dka[j][2 * h + 1] * ${bwd_ds_factor()});
        }
%   end
%   if want_dv then
#pragma unroll
        for (int j = 0; j < ${dv_cols} / 8; j++) {
            const int col = j * 8 + 2 * t;
            if (${dv_first}col < head_dim_v)
                *(u32 *)(dv + key * P.dv_ss + col) = pack2(dva[j][2 * h], dva[j][2 * h + 1]);
        }
%   end
    }
% end

% -- ---- the dq kernel (stage 3): a block owns BM query rows from m0 of one (batch, head) ----
% -- bwd_dq_stream(): moves q, k, v, lse to the block's sequence and heads, declares dout and
% -- delta, the key tiles [nb_lo, nb_hi) of the band (attn_key_band) and the masks' context.
% -- Goes after bwd_sequence().
% function bwd_dq_stream()
    q += batch * q_sb + (long long)q_first * q_ss + head * q_sh;
    k += batch * k_sb + (long long)k_first * k_ss + head_kv * k_sh;
    v += batch * v_sb + (long long)k_first * v_ss + head_kv * v_sh;
    lse += batch * l_sb + (long long)q_first * l_ss + head * l_sh;
    const elem_t *dout = P.dout + batch * P.do_sb + (long long)q_first * P.do_ss + head * P.do_sh;
    const float *delta = P.delta + ((long long)batch * heads_q + head) * d_rows;
% attn_key_band()
% bwd_mask_ctx("head")
% end

% -- The lse2 and dl of the thread's two rows from warp_row (declared before).
% function bwd_dq_rows()
    /* The lse (log2 units; +inf for rows past the end or that see nothing) and D of the
    ** thread's two rows. */
    float lse2[2], dl[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int row = warp_row + g + 8 * h;
        const float l = row < seqlen_q ? lse[row * l_ss] : NEG_INF;
        lse2[h] = l == NEG_INF ? POS_INF : l * LOG2E;
        dl[h] = row < seqlen_q ? delta[row] : 0.0f;
    }
% end

% -- `live_from(nb)`: the first key tile from nb on that is live.
% function bwd_dq_live_from()
    /* The first key tile from nb on that is live (as stage 2's; a query block's classes lie
    ** side by side, so the walk reads each cache line once). */
    auto live_from = [&](int nb) {
%   if block_mask then
        while (nb < nb_hi && block_class_of(head, m0, nb * BN) == 0)
            nb++;
%   end
        return nb;
    };
% end

% -- The element pass of a dq tile: s = S and dp = dP, a warp's 16 rows from warp_row by BN keys
% -- from n0.
% function bwd_dq_elements(want_ds)
        /* Masked where the tile crosses the ends or the band: key offsets [lo, hi] from the
        ** thread's first column col0 that each of its two rows sees (none past the rows' end,
        ** whose masks and terms are not to be read). */
% bwd_need_mask()
        if (need_mask) {
            const int col0 = n0 + 2 * t;
            int lo[2], hi[2];
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int row = warp_row + g + 8 * h;
                hi[h] = row < seqlen_q ? seqlen_k - 1 - col0 : -1;
                lo[h] = 0 - col0;
%   if local_mask then
                if (window_right >= 0)
                    hi[h] = imin(hi[h], row + shift + window_right - col0);
                if (window_left >= 0)
                    lo[h] = imax(lo[h], row + shift - window_left - col0);
%   end
            }
% bwd_scores_to_p_ds("BN / 8", "lse2[h]", "dl[h]", "warp_row + g + 8 * h", "n0 + 8 * j + 2 * t + (e & 1)", true, want_ds)
        } else {
% bwd_scores_to_p_ds("BN / 8", "lse2[h]", "dl[h]", "warp_row + g + 8 * h", "n0 + 8 * j + 2 * t + (e & 1)", false, want_ds)
        }
% end

% -- The warp's rows of dQ from the accumulators dqa[DP / 8][4].
% function bwd_store_dq()
    /* The warp's rows of dQ (zeros for rows that see no key). */
    elem_t *dq = P.dq + batch * P.dq_sb + (long long)q_first * P.dq_ss + head * P.dq_sh;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int row = warp_row + g + 8 * h;
        if (row >= seqlen_q)
            continue;
#pragma unroll
        for (int j = 0; j < DP / 8; j++) {
            const int col = j * 8 + 2 * t;
            if (col < head_dim)
                *(u32 *)(dq + row * P.dq_ss + col) =
                    pack2(dqa[j][2 * h] * ${bwd_ds_factor()}, dqa[j][2 * h + 1] * ${bwd_ds_factor()});
        }
    }
% end
