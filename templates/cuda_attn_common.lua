% -- Pieces shared by the CUDA forward kernels (attn_fwd_mma.cu.lua, attn_fwd_wgmma.cu.lua), so
% -- that both keep one schedule of blocks and one spelling of the band. They read the forward
% -- parameter block's fields by name (the kernels unpack them). Each function emits its text
% -- where it is called.

% -- The block's first query row m0, its head (and the key/value head it reads) and batch; with
% -- `slices` value slices (more than 1), also its slice: the slices of a query tile are
% -- neighbours in x, so that they read its key and value tiles through L2 at about one time.
% function attn_block_origin(slices)
%   local x, tiles = "blockIdx.x", "gridDim.x" -- the block's query tile, and their count
%   if slices and slices > 1 then
%     x, tiles = "tile_x", "tiles_x"
    const int slice = blockIdx.x % ${slices}, tile_x = blockIdx.x / ${slices};
    const int tiles_x = gridDim.x / ${slices};
%   end
% if local_mask then
    /* Heavy (late) query tiles first, so causal work is balanced across the grid. */
    const int m0 = (${tiles} - 1 - ${x}) * BM;
% else
    const int m0 = ${x} * BM;
% end
    const int head = blockIdx.y, batch = blockIdx.z;
    const int head_kv = head / (heads_q / heads_kv);
% end

% -- The key tiles [nb_lo, nb_hi) of BN keys the block's rows may see; with a band, also shift
% -- (keys are aligned to queries bottom-right).
% function attn_key_band()
    /* Keys the block's rows may see: [n_lo, n_hi). */
    int n_lo = 0, n_hi = seqlen_k;
% if local_mask then
    const int shift = seqlen_k - seqlen_q;
    if (window_left >= 0)
        n_lo = imax(0, m0 + shift - window_left);
    if (window_right >= 0)
        n_hi = imin(seqlen_k, imin(seqlen_q, m0 + BM) + shift + window_right);
% end
    /* Rows far below the band (causal with seqlen_q beyond seqlen_k by a tile and two key
    ** tiles) have n_hi <= -2 BN + 1, whose rounding up would give fewer key tiles than none: an
    ** empty band is [nb_lo, nb_lo) (callers count tiles as nb_hi - nb_lo). */
    const int nb_lo = n_lo / BN, nb_hi = imax(nb_lo, (n_hi + BN - 1) / BN);
% end

% -- Inside a loop over the thread's rows: the offsets [lo, hi] from column col0 of the keys
% -- that query `row` may see (the tensor's end, and the band when there is one). left: the
% -- window may have a left edge (nil: decided at run time; false: known not to, lo = -1).
% function attn_visible_cols(row, left)
            int hi = seqlen_k - 1 - col0; /* last visible offset */
% if local_mask then
            const int row = ${row};
            if (window_right >= 0)
                hi = imin(hi, row + shift + window_right - col0);
%   if left == nil then
            const int lo = window_left >= 0 ? row + shift - window_left - col0 : -1;
%   elseif left then
            const int lo = row + shift - window_left - col0;
%   else
            const int lo = -1;
%   end
% else
            const int lo = -1;
% end
% end

% -- The band's per-element masking, emit(left) (see attn_visible_cols), specialised at run time
% -- on whether the window has a left edge: causal masks compare only the right one.
% function attn_band_cases(emit)
% if local_mask then
        if (window_left < 0) {
%   emit(false)
        } else {
%   emit(true)
        }
% else
%   emit(false)
% end
% end

% -- NEG_INF, and TO_LOG2(x): a raw score or maximum in log2 units. With a positive scale and no
% -- soft-capping the kernels keep S unscaled (the scale folds into exp2's FFMA); otherwise S is
% -- scaled (and capped) in place and already in log2 units.
% -- scaled: S is scaled in place (default: with soft-capping or a negative scale).
% function attn_score_macros(scaled)
#define NEG_INF __int_as_float(0xff800000)
% if scaled == nil then scaled = softcap or neg_scale end
% if not scaled then
#define TO_LOG2(x) ((x) * score_mul)
% else
#define TO_LOG2(x) (x)
% end
% end
