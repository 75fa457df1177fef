% -- What the bias's gradient's kernels share (attn_bwd.lua's stage 4 on SIMT units,
% -- attn_bwd_dbias_mma.cu.lua on mma.sync; attn_bwd.lua's stage 6 adds the shares): which tile
% -- of dbias a block owns, the (batch, head) pairs and query rows its elements stand for, and
% -- the workspace of a sum over rows in shares. plan/bwd.c's plan_dbias makes the grid to match.
% -- Include after dialect.lua.

% -- The workspace of dbias's shares of summed rows (stage 4 writes, stage 6 adds): element
% -- [share][pair][key] of [P.dbias_splits][batches * heads of dbias][keys], an expression.
% function dbias_part(share, pair, key, keys)
%   return "GPTR(float, P.dbias_part)[((I64)(" .. share .. ") * P.dbias_batches * P.dbias_heads + " ..
%          pair .. ") * " .. keys .. " + " .. key .. "]"
% end

% -- The block's tile of dbias [batches, heads, rows, keys] (an extent of 1 where the bias
% -- broadcasts: summed over), from the grid: x the (batch, head) pairs of dbias times its key
% -- tiles, y its row tiles, or where the rows are summed the P.dbias_splits shares of them.
% -- Declares the tile's first key (named `key0`), `pair` and its b_ and h_ in dbias,
% -- `rows_summed`, the (batch, head) pairs its elements stand for, [b_lo, b_hi) x [h_lo, h_hi),
% -- and its query tiles [mb_lo, mb_hi) of tile_m rows (one, or its share's: none past the rows).
% -- The other arguments are C expressions: the block's x and y, the tiles' rows and keys, and
% -- the rows and keys of dbias.
% function dbias_block(block_x, block_y, key0, tile_m, tile_n, rows, keys)
    const int key_tiles = (${keys} + ${tile_n} - 1) / ${tile_n};
    const int ${key0} = ${block_x} % key_tiles * ${tile_n}, pair = ${block_x} / key_tiles;
    const int h_ = pair % P.dbias_heads, b_ = pair / P.dbias_heads;
    const bool rows_summed = P.dbias_rows == 1;
    const int b_lo = P.dbias_batches == 1 ? 0 : b_, b_hi = P.dbias_batches == 1 ? batches : b_ + 1;
    const int h_lo = P.dbias_heads == 1 ? 0 : h_, h_hi = P.dbias_heads == 1 ? heads_q : h_ + 1;
    const int row_tiles = (${rows} + ${tile_m} - 1) / ${tile_m};
    const int share_tiles = rows_summed ? (row_tiles + P.dbias_splits - 1) / P.dbias_splits : 1;
    const int mb_lo = ${block_y} * share_tiles, mb_hi = I_MIN(mb_lo + share_tiles, row_tiles);
% end

% -- Whether the tile of query rows [m0, m0 + tile_m) and keys [k0, k0 + tile_n) lies wholly
% -- outside the band (local_mask: a window or causal; `shift`, seqlen_k - seqlen_q, declared):
% -- its elements have no pairs. An expression of C expressions.
% function dbias_tile_outside_band(m0, k0, tile_m, tile_n)
%   return "((window_right >= 0 && " .. k0 .. " > " .. m0 .. " + " .. tile_m .. " - 1 + shift + window_right) || " ..
%          "(window_left >= 0 && " .. k0 .. " + " .. tile_n .. " - 1 < " .. m0 .. " + shift - window_left))"
% end
