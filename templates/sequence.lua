% -- A packed sequence (variable lengths), spelled once for every kernel that reads them: where
% -- the block's sequence starts in the packed tensors and how long it is, from cu_seqlens_q/k
% -- (and seqused_k when varlen is 2). The offsets are the caller's device data: clamped into the
% -- tensors and to the maxima.
% --
% -- Parameter: varlen. packed_sequence() goes where `batch` (the sequence) and the forward
% -- block's locals (cu_seqlens_q, cu_seqlens_k, seqused_k, total_q, total_k, max_seqlen_q,
% -- max_seqlen_k) are declared; it declares q_first, k_first, seqlen_q, len_k (the keys the
% -- sequence holds) and seqlen_k (the keys it uses). packed_queries() declares the queries'
% -- alone, q_first and seqlen_q (a paged cache's keys are found otherwise; keys_between puts
% -- packed_sequence's k_first between them, where it always stood, so those kernels' text and
% -- binaries stay as they were).
% function packed_queries(keys_between)
    const int q_first = I_MIN(I_MAX(cu_seqlens_q[batch], 0), total_q);
%   if keys_between then
    const int k_first = I_MIN(I_MAX(cu_seqlens_k[batch], 0), total_k);
%   end
    const int seqlen_q = I_MIN(I_MAX(I_MIN(cu_seqlens_q[batch + 1], total_q) - q_first, 0), max_seqlen_q);
% end
% function packed_sequence()
% packed_queries(true)
    const int len_k = I_MIN(I_MAX(I_MIN(cu_seqlens_k[batch + 1], total_k) - k_first, 0), max_seqlen_k);
%   if varlen == 2 then
    const int seqlen_k = I_MIN(len_k, I_MAX(seqused_k[batch], 0));
%   else
    const int seqlen_k = len_k;
%   end
% end
%
% -- The decode kernels' sequence (parameters varlen and paged; decode_block below opens a body
% -- with all of it): decode_key_row() defines
% -- key_row(key, s_batch_or_page, s_row), where key `key` of the sequence starts in k or v (and,
% -- paged, PAGE_NUMBER(i) of the sequence's page i);
% -- decode_sequence() goes after `batch` and head_kv are declared, and moves q, k and v to the
% -- sequence (and kv head), declaring q_first and seqlen_q / seqlen_k (packed and paged: the
% -- queries packed through cu_seqlens_q, the keys in pages, seqused_k of them; paged, also
% -- `pages`, the sequence's row of the table, and page_div, dialect.lua's divider by the page
% -- size, which key_row uses and the kernels' own page lookups should: keys are never
% -- negative there);
% -- decode_split_keys(per_tile, full_band), after it and `split`, declares shift and the keys
% -- [lo, hi] the split's rows may see (row_band: the block's rows'), and with full_band the keys
% -- [full_lo, full_hi] that every one of those rows sees (decode_scores masks only tiles that
% -- reach outside them); decode_store_out(val) and
% -- decode_store_lse(x) store element c of query head `head`, row `row` (declared by the
% -- caller) of the output, and its natural-log log-sum-exp: with `partial` the split's state in
% -- the workspace (P.part, split s at P.part_so / part_sl elements further), else out and
% -- (write_lse) lse.
% -- page_number() defines PAGE_NUMBER(i): entry i of `pages` (a sequence's row of the page
% -- table, which the caller declares), clamped into the cache (P.num_pages of FJ__PAGE_FIELDS):
% -- the table is device data the host cannot check.
% function page_number()
#define PAGE_NUMBER(i) I_MIN(I_MAX(LDG(pages + (i)), 0), P.num_pages - 1)
% end
% function decode_key_row()
/* Where key `key` of the sequence starts in k or v (batch and head applied), given the tensor's
** batch (page) and row strides. Paged: PAGE_NUMBER(i) is the number of the sequence's page i,
** from the table, clamped into the cache. */
% if paged then
% page_number()
/* Key `key`, on page number `page` (PAGE_NUMBER of its page), as key_row. */
#define page_row(page, key, s_page, s_row)                                                     \
    ((I64)(page) * (s_page) + (I64)mod_by(page_div, key) * (s_row))
#define key_row(key, s_page, s_row) page_row(PAGE_NUMBER(div_by(page_div, key)), key, s_page, s_row)
% else
#define key_row(key, s_batch, s_row) ((I64)(key) * (s_row))
% end
% end
% -- decode_block(per_tile, full_band) opens a decode kernel's body after `tid`: the parameter
% -- block P (fj_decode_params: the kernel's argument, or its `dec` block) unpacked (P.fwd's
% -- fields as locals), the block's coordinates (split, qgroup query heads a kv head, head_kv,
% -- g0 its row tile's first packed row of per_tile, batch), its sequence (decode_sequence),
% -- `rows` (the sequence's packed rows) and the split's keys (decode_split_keys, given
% -- full_band; with `pair`, the band of the row tile and its cluster partner's, BLOCK_X ^ 1: the
% -- keys of both, so that a pair sharing copies reads the same tiles; row tiles are then whole
% -- pairs, and not of packed sequences). Packed sequences: the row tiles are the longest
% -- sequence's, and a block whose tile starts past its own sequence's rows reads no keys (its
% -- rows are no one's: the merge skips them), so decode rows beside a long prefill chunk do not
% -- stream their keys once per tile of the chunk.
% function decode_block(per_tile, full_band, pair)
% params_unpack(params_block(args, "dec").fields[1].block, "P.fwd", varlen > 0 and { seqlen_q = "max_seqlen_q", seqlen_k = "max_seqlen_k" } or paged and { seqlen_k = "max_seqlen_k" } or nil)
    const int split = BLOCK_Y;
    const int qgroup = heads_q / heads_kv;
    const int head_kv = BLOCK_X / P.row_tiles;
    const int g0 = (BLOCK_X % P.row_tiles) * ${per_tile}; /* the tile's first packed row */
    const int batch = BLOCK_Z;
% decode_sequence()
    const int rows = qgroup * seqlen_q; /* the sequence's packed rows */
% decode_split_keys(per_tile, full_band, pair)
% if varlen > 0 then
    if (g0 >= rows) /* (not a return: on PoCL, that corrupted other work-groups' results) */
        hi = -1; /* a row tile past its sequence's rows: no keys, and none of its rows written */
% end
% end
% function decode_sequence()
% if varlen > 0 and paged then
% packed_queries()
    q += (I64)q_first * q_ss;
% elseif varlen > 0 then
% packed_sequence()
    q += (I64)q_first * q_ss;
    k += (I64)k_first * k_ss;
    v += (I64)k_first * v_ss;
% else
    const int q_first = 0;
% end
% if paged then
    /* The sequence's keys: seqused_k of them (clamped), in the pages its table row lists. */
    const int seqlen_k = I_MIN(I_MAX(LDG(seqused_k + batch), 0), max_seqlen_k);
    GLOBAL const int *pages = GPTR(const int, P.page_table) + batch * P.pt_sb;
    const divider page_div = divider_of(P.page_size); /* key / page size, without `/` */
    q += batch * q_sb;
    k += head_kv * k_sh;
    v += head_kv * v_sh;
% else
    q += batch * q_sb;
    k += batch * k_sb + head_kv * k_sh;
    v += batch * v_sb + head_kv * v_sh;
% end
% end
% function decode_split_keys(per_tile, full_band, pair)
    /* This split's keys, and the keys any of the rows may see: [lo, hi]. */
    const int shift = seqlen_k - seqlen_q;
    int lo = split * P.keys_per_split;
    int hi = I_MIN(seqlen_k, lo + P.keys_per_split) - 1;
%   if full_band then
    int full_lo = lo, full_hi = hi; /* the keys every row sees */
%   end
%   if local_mask then
    {
%     if row_band then
        /* The positions [first, last] of the tile's rows (with `pair`, of both tiles of its
        ** cluster pair): every position where those packed rows reach into a second head. */
        const int g_first = ${pair and "g0 - BLOCK_X % 2 * " .. per_tile or "g0"};
        const int g_last = I_MIN(g_first + ${pair and "2 * " or ""}${per_tile}, rows) - 1;
        const int sq = I_MAX(seqlen_q, 1);
        const bool one_head = g_first / sq == g_last / sq;
        const int first = one_head ? g_first % sq : 0;
        const int last = one_head ? g_last % sq : seqlen_q - 1;
%     else
        /* Rows 0 .. seqlen_q - 1 all belong to every head: the band of the whole sequence. */
        const int first = 0, last = seqlen_q - 1;
%     end
        if (window_left >= 0)
            lo = I_MAX(lo, first + shift - window_left);
        if (window_right >= 0)
            hi = I_MIN(hi, last + shift + window_right);
%     if full_band then
        if (window_left >= 0)
            full_lo = I_MAX(full_lo, last + shift - window_left);
        if (window_right >= 0)
            full_hi = I_MIN(full_hi, first + shift + window_right);
%     end
    }
%   end
% end
% -- decode_seen(key, qp): the C expression of whether a row at query position qp sees key `key`:
% -- one of the split's keys (after decode_split_keys: at most hi) and (local_mask) in the row's
% -- band.
% function decode_seen(key, qp)
%   local e = "(" .. key .. ") <= hi"
%   if local_mask then
%     e = e .. " &&\n" ..
%         "                (window_left < 0 || (" .. key .. ") >= (" .. qp .. ") + shift - window_left) &&\n" ..
%         "                (window_right < 0 || (" .. key .. ") <= (" .. qp .. ") + shift + window_right)"
%   end
%   return e
% end
% -- decode_head_row(pr): declares `head` and `row`, the query head and the row of O (and lse) of
% -- packed row pr: a kv head's packed rows are its query heads' rows, head by head (packed row
% -- pr is query head head_kv * qgroup + pr / seqlen_q at position pr % seqlen_q). A split's
% -- state of packed sequences keeps the sequence's own rows (the merge packs them).
% local function state_keeps_own_rows() return partial and varlen > 0 end
% function decode_head_row(pr)
%   local first = state_keeps_own_rows() and "" or "q_first + "
        const int head = head_kv * qgroup + (${pr}) / seqlen_q, row = ${first}(${pr}) % seqlen_q;
% end
% -- Where a row's results lie, as expressions of `batch`, `row`, `head` (and the split's number
% -- `split`): decode_state_at(split) and decode_state_lse_at(split), a split's state of the row
% -- in the workspace (P.part; split s at P.part_so / part_sl elements further); decode_final_row()
% -- out's row of that state row (packed sequences: the state keeps the sequence's own rows, out
% -- its packed ones); decode_final_at(r) and decode_final_lse_at(r), row r of out and of lse.
% -- decode_out_row(): where this kernel stores a row of O (with `partial`, the split's state);
% -- decode_store_out_at(at, val) stores val at offset `at` of it, and decode_store_out(val) at
% -- column `c` of the row.
% function decode_state_at(split)
%   return split .. " * P.part_so + batch * P.part.o_sb + (I64)row * P.part.o_ss + " ..
%          "(I64)head * P.part.o_sh"
% end
% function decode_state_lse_at(split)
%   return split .. " * P.part_sl + batch * P.part.l_sb + (I64)head * P.part.l_sh + " ..
%          "(I64)row * P.part.l_ss"
% end
% function decode_final_row()
%   return state_keeps_own_rows() and "(q_first + row)" or "row"
% end
% function decode_final_at(r)
%   return "batch * o_sb + (I64)" .. r .. " * o_ss + (I64)head * o_sh"
% end
% function decode_final_lse_at(r)
%   return "batch * l_sb + (I64)head * l_sh + (I64)" .. r .. " * l_ss"
% end
% function decode_out_row()
%   if partial then
%     return decode_state_at("split")
%   end
%   return decode_final_at("row")
% end
% function decode_store_out_at(at, val)
%   if partial then
        GPTR(float, P.part.o)[${at}] = ${val};
%   else
        O_STORE(out, ${at}, ${val});
%   end
% end
% function decode_store_out(val)
%   decode_store_out_at(decode_out_row() .. " + c", val)
% end
% function decode_store_lse(x)
%   if partial then
        GPTR(float, P.part.l)[${decode_state_lse_at("split")}] = ${x};
%   elseif write_lse then
        lse[${decode_final_lse_at("row")}] = ${x};
%   end
% end
