/* The kernel families' parameter blocks: each argument list is written here once. A kernel
** family (forward, block classifier, ...) takes one struct argument; templates/params.lua
** writes the kernel's struct from the layouts below, and a render fails if its layout differs
** from the host's. To add a field: add a row, fill it in the family's fill function (fwd.c,
** classify.c), read it in the template as P.<name>. */
#ifndef FJ_PLAN_FAMILIES_H
#define FJ_PLAN_FAMILIES_H

#include "params.h"

/* Masks and score terms beyond the causal/window band (templates/attn_masks.lua), for every
** family that computes or classifies scores: mask_mod/score_mod arguments, ALiBi slopes, the
** bias and mask tensors, FlashMask ranges and 128 x 128 block classes, with their batch, head
** and row (or key, or query-block) strides; a pointer is NULL when its term is absent. */
#define FJ__MASK_PARAMS(X, T)                                                                      \
    X(T, PTR, mod_args, "const float")                                                             \
    X(T, PTR, alibi, "const float")                                                                \
    X(T, PTR, bias, "const void")                                                                  \
    X(T, PTR, mask, "const unsigned char")                                                         \
    X(T, PTR, mask_ranges, "const int")                                                            \
    X(T, PTR, block_mask, "const int")                                                             \
    X(T, I64, alibi_sb, 0)                                                                         \
    X(T, I64, bias_sb, 0)                                                                          \
    X(T, I64, bias_sh, 0)                                                                          \
    X(T, I64, bias_ss, 0)                                                                          \
    X(T, I64, mask_sb, 0)                                                                          \
    X(T, I64, mask_sh, 0)                                                                          \
    X(T, I64, mask_ss, 0)                                                                          \
    X(T, I64, ranges_sb, 0)                                                                        \
    X(T, I64, ranges_sh, 0)                                                                        \
    X(T, I64, ranges_sk, 0)                                                                        \
    X(T, I64, blocks_sb, 0)                                                                        \
    X(T, I64, blocks_sh, 0)                                                                        \
    X(T, I64, blocks_sq, 0)                                                                        \
    X(T, I32, mod_args_count, 0)
FJ__PARAM_STRUCT(fj__mask_params, FJ__MASK_PARAMS);

/* The forward family (attn_fwd_*.lua): q [b, sq, hq, d], k [b, sk, hkv, d], v [b, sk, hkv, dv],
** out [b, sq, hq, dv] (q_t, kv_t, o_t are the kernels' element types) with their batch, row and
** head strides (batch 0 when packed), lse [b, hq, sq] (NULL: not written) with batch, head and
** row strides; variable lengths (cu_seqlens_q/k, seqused_k: NULL when dense; total_q/k the
** packed tensors' rows; seqlen_q/k are then the maxima); FP8 inputs' descale factors (f32;
** NULL: 1) with their batch and kv head strides (0: one factor); the scale folded into log2
** units (score_mul, and cap_mul with soft-capping), the window (-1: unbounded). */
#define FJ__FWD_PARAMS(X, T)                                                                       \
    X(T, PTR, q, "const q_t")                                                                      \
    X(T, PTR, k, "const kv_t")                                                                     \
    X(T, PTR, v, "const kv_t")                                                                     \
    X(T, PTR, out, "o_t")                                                                          \
    X(T, PTR, lse, "float")                                                                        \
    X(T, PTR, cu_seqlens_q, "const int")                                                           \
    X(T, PTR, cu_seqlens_k, "const int")                                                           \
    X(T, PTR, seqused_k, "const int")                                                              \
    X(T, PTR, q_descale, "const float")                                                            \
    X(T, PTR, k_descale, "const float")                                                            \
    X(T, PTR, v_descale, "const float")                                                            \
    X(T, I64, q_sb, 0)                                                                             \
    X(T, I64, q_ss, 0)                                                                             \
    X(T, I64, q_sh, 0)                                                                             \
    X(T, I64, k_sb, 0)                                                                             \
    X(T, I64, k_ss, 0)                                                                             \
    X(T, I64, k_sh, 0)                                                                             \
    X(T, I64, v_sb, 0)                                                                             \
    X(T, I64, v_ss, 0)                                                                             \
    X(T, I64, v_sh, 0)                                                                             \
    X(T, I64, o_sb, 0)                                                                             \
    X(T, I64, o_ss, 0)                                                                             \
    X(T, I64, o_sh, 0)                                                                             \
    X(T, I64, l_sb, 0)                                                                             \
    X(T, I64, l_sh, 0)                                                                             \
    X(T, I64, l_ss, 0)                                                                             \
    X(T, I64, qd_sb, 0)                                                                            \
    X(T, I64, qd_sh, 0)                                                                            \
    X(T, I64, kd_sb, 0)                                                                            \
    X(T, I64, kd_sh, 0)                                                                            \
    X(T, I64, vd_sb, 0)                                                                            \
    X(T, I64, vd_sh, 0)                                                                            \
    X(T, BLOCK, mask, fj__mask_params)                                                             \
    X(T, F32, score_mul, 0)                                                                        \
    X(T, F32, cap_mul, 0)                                                                          \
    X(T, I32, batches, 0)                                                                          \
    X(T, I32, seqlen_q, 0)                                                                         \
    X(T, I32, seqlen_k, 0)                                                                         \
    X(T, I32, heads_q, 0)                                                                          \
    X(T, I32, heads_kv, 0)                                                                         \
    X(T, I32, head_dim, 0)                                                                         \
    X(T, I32, head_dim_v, 0)                                                                       \
    X(T, I32, window_left, 0)                                                                      \
    X(T, I32, window_right, 0)                                                                     \
    X(T, I32, total_q, 0)                                                                          \
    X(T, I32, total_k, 0)
FJ__PARAM_STRUCT(fj__fwd_params, FJ__FWD_PARAMS);

/* A paged KV cache's table, as every kernel that reads or writes pages takes it: the page table
** [batch, max_pages] (I32, device memory) with its batch stride, the keys a page and the pages
** of the cache (kernels clamp page numbers into [0, num_pages): the host cannot check them). */
#define FJ__PAGE_FIELDS(X, T)                                                                      \
    X(T, PTR, page_table, "const int")                                                             \
    X(T, I64, pt_sb, 0)                                                                            \
    X(T, I32, page_size, 0)                                                                        \
    X(T, I32, num_pages, 0)
/* Fills a block's FJ__PAGE_FIELDS from a request's paged cache (src: its page_table tensor,
** page_size and num_pages). */
#define FJ__FILL_PAGE_FIELDS(dst, src)                                                             \
    ((dst)->page_table = (src)->page_table->data, (dst)->pt_sb = (src)->page_table->stride[0],     \
     (dst)->page_size = (int32_t)(src)->page_size, (dst)->num_pages = (int32_t)(src)->num_pages)

/* The Hopper forward kernel (attn_fwd_wgmma.cu.lua): the family's block and what its bulk
** tensor copies and persistent schedule need: tensor maps of q, k, v (and of the bias when it
** comes by TMA; zeros otherwise), the slots of their row and head coordinates (perm_*: bits
** 0-1 the row's, 2-3 the head's), the tile counter of the dynamic schedule (zeroed before
** the launch; NULL for the static ones), and a paged cache's table (variant.paged: k and v
** are pages [num_pages, page_size, hkv, d], their tensor maps' batches the pages). */
#define FJ__FWD_TMA_PARAMS(X, T)                                                                   \
    X(T, TMAP, tm_q, 0)                                                                            \
    X(T, TMAP, tm_k, 0)                                                                            \
    X(T, TMAP, tm_v, 0)                                                                            \
    X(T, TMAP, tm_bias, 0)                                                                         \
    X(T, BLOCK, fwd, fj__fwd_params)                                                               \
    X(T, PTR, tile_counter, "int")                                                                 \
    X(T, I32, perm_q, 0)                                                                           \
    X(T, I32, perm_k, 0)                                                                           \
    X(T, I32, perm_v, 0)                                                                           \
    FJ__PAGE_FIELDS(X, T)
FJ__PARAM_STRUCT(fj__fwd_tma_params, FJ__FWD_TMA_PARAMS);

/* The block classifier (attn_classify.lua): writes the class of each 128 x 128 block of
** (query, key) pairs of seqlen_q x seqlen_k under the element masks into classes, at the given
** batch, head and query-block strides; cls_heads (batch, head) pairs per batch are classified
** (1 when the masks do not differ by head). */
#define FJ__CLASSIFY_PARAMS(X, T)                                                                  \
    X(T, PTR, classes, "int")                                                                      \
    X(T, I64, cls_sb, 0)                                                                           \
    X(T, I64, cls_sh, 0)                                                                           \
    X(T, I64, cls_sq, 0)                                                                           \
    X(T, BLOCK, mask, fj__mask_params)                                                             \
    X(T, I32, seqlen_q, 0)                                                                         \
    X(T, I32, seqlen_k, 0)                                                                         \
    X(T, I32, cls_heads, 0)
FJ__PARAM_STRUCT(fj__classify_params, FJ__CLASSIFY_PARAMS);

/* One attention state of a merge (attn_merge.lua): out o [b, s, h, dv] (element type by role,
** see the template) and its log-sum-exp l [b, h, s], with batch, row and head strides of o and
** batch, head and row strides of l. The merge's destination uses it too (l NULL: not written). */
#define FJ__MERGE_SLOT_PARAMS(X, T)                                                                \
    X(T, PTR, o, "const void")                                                                     \
    X(T, PTR, l, "const float")                                                                    \
    X(T, I64, o_sb, 0)                                                                             \
    X(T, I64, o_ss, 0)                                                                             \
    X(T, I64, o_sh, 0)                                                                             \
    X(T, I64, l_sb, 0)                                                                             \
    X(T, I64, l_sh, 0)                                                                             \
    X(T, I64, l_ss, 0)
FJ__PARAM_STRUCT(fj__merge_slot, FJ__MERGE_SLOT_PARAMS);

/* The merge (attn_merge.lua): up to FJ__MERGE_SLOTS states in[0..inputs-1] combined into dst,
** for pairs = batches * seqlen * heads (batch, row, head) rows of head_dim_v elements; or
** (inputs 0) `states` states of one layout, state i at in0 moved by i * state_so elements of o
** and i * state_sl of l, the elements of a row shared by the work-groups along the grid's y (a
** run of lanes each, an element a lane: fj__plan_add_strided_merge_step's grid) and a pair's
** states by state_teams of a work-group's teams (1, 2 or 4: state j by team j % state_teams; 0
** counts as 1). Strided states of packed sequences (the variant's varlen: a decode's splits) keep
** sequence b's rows at batch b, rows 0 to seqlen - 1; dst is packed [total_q, heads, dv], b's
** rows from cu_seqlens_q[b], as many as the sequence has (sequence.lua's packed_queries). */
#define FJ__MERGE_SLOTS 8
#define FJ__MERGE_PARAMS(X, T)                                                                     \
    X(T, BLOCK, in0, fj__merge_slot)                                                               \
    X(T, BLOCK, in1, fj__merge_slot)                                                               \
    X(T, BLOCK, in2, fj__merge_slot)                                                               \
    X(T, BLOCK, in3, fj__merge_slot)                                                               \
    X(T, BLOCK, in4, fj__merge_slot)                                                               \
    X(T, BLOCK, in5, fj__merge_slot)                                                               \
    X(T, BLOCK, in6, fj__merge_slot)                                                               \
    X(T, BLOCK, in7, fj__merge_slot)                                                               \
    X(T, BLOCK, dst, fj__merge_slot)                                                               \
    X(T, I64, pairs, 0)                                                                            \
    X(T, I64, state_so, 0)                                                                         \
    X(T, I64, state_sl, 0)                                                                         \
    X(T, I32, states, 0)                                                                           \
    X(T, I32, seqlen, 0)                                                                           \
    X(T, I32, heads, 0)                                                                            \
    X(T, I32, head_dim_v, 0)                                                                       \
    X(T, I32, state_teams, 0)                                                                      \
    X(T, PTR, cu_seqlens_q, "const int")                                                           \
    X(T, I32, total_q, 0)
FJ__PARAM_STRUCT(fj__merge_params, FJ__MERGE_PARAMS);

/* Decode (attn_decode.lua): the forward's block (with a paged cache its k and v strides are
** the page's, the row's in the page and the head's; seqlen_k the most keys a sequence can
** have); for split-KV (variant.partial) the f32 state of split 0 (rows as out's; see
** plan/decode.c) with the split strides of its o and l; the keys of each split; the row tiles
** of each kv head's packed query rows; a paged cache's table (FJ__PAGE_FIELDS); with
** variant.merge_last, the splits' arrivals (zero at the launch, left zero; plan/decode.c). */
#define FJ__DECODE_PARAMS(X, T)                                                                    \
    X(T, BLOCK, fwd, fj__fwd_params)                                                               \
    X(T, BLOCK, part, fj__merge_slot)                                                              \
    X(T, I64, part_so, 0)                                                                          \
    X(T, I64, part_sl, 0)                                                                          \
    X(T, I32, keys_per_split, 0)                                                                   \
    X(T, I32, row_tiles, 0)                                                                        \
    FJ__PAGE_FIELDS(X, T)                                                                          \
    X(T, PTR, arrivals, "int")
FJ__PARAM_STRUCT(fj__decode_params, FJ__DECODE_PARAMS);

/* The Hopper decode kernel (attn_decode_wgmma.cu.lua): the family's block and, where it copies
** K and V tiles by bulk tensor copies (variant.bulk; zeros otherwise), their tensor maps (a
** paged cache's as [pages, page_size, hkv, d]) with the slots of their row and head
** coordinates (perm_*, as the forward's). */
#define FJ__DECODE_TMA_PARAMS(X, T)                                                                \
    X(T, TMAP, tm_k, 0)                                                                            \
    X(T, TMAP, tm_v, 0)                                                                            \
    X(T, BLOCK, dec, fj__decode_params)                                                            \
    X(T, I32, perm_k, 0)                                                                           \
    X(T, I32, perm_v, 0)
FJ__PARAM_STRUCT(fj__decode_tma_params, FJ__DECODE_TMA_PARAMS);

/* The backward (attn_bwd.lua): the forward's block (q, k, v, out, lse and everything that
** decides the scores); dout [b, sq, hq, dv] and the gradients dq, dk, dv (shaped as q, k, v)
** with their batch, row and head strides; D = rowsum(dout * out), an f32 workspace
** [b, hq, sq], and lse2, the rows' lse in log2 units (+inf where the forward's is -inf: rows
** that see no key), another; both written by stage 1; dQ's f32 sum where stage 2 accumulates
** it (NULL: not), a workspace of dq_slices slices [b, hq, sq, head_dim_pad], dq_slice floats
** apart (0 where there is one), that stage 5 adds in order, stage 2's block x adding into slice
** x (one, by atomics; deterministic: see dq_slices in bwd.c); stage 2's first key block (its
** launch's blockIdx.x 0: a run's); with a persistent stage 2, the key blocks of a (batch, kv
** head), whose items its blocks take in turn (0: a block an item), and whether a block's items
** add into dQ's sum one after another (deterministic plans); the bias's gradient (f32; NULL:
** not asked for) with its batch, head and row strides, element count and batch, head and row
** extents (1: summed over); the softmax scale (natural units: dS's factor). */
#define FJ__BWD_PARAMS(X, T)                                                                       \
    X(T, BLOCK, fwd, fj__fwd_params)                                                               \
    X(T, PTR, dout, "const o_t")                                                                   \
    X(T, PTR, dq, "q_t")                                                                           \
    X(T, PTR, dk, "kv_t")                                                                          \
    X(T, PTR, dv, "kv_t")                                                                          \
    X(T, PTR, delta, "float")                                                                      \
    X(T, PTR, lse2, "float")                                                                       \
    X(T, PTR, dq_acc, "float")                                                                     \
    X(T, I64, do_sb, 0)                                                                            \
    X(T, I64, do_ss, 0)                                                                            \
    X(T, I64, do_sh, 0)                                                                            \
    X(T, I64, dq_sb, 0)                                                                            \
    X(T, I64, dq_ss, 0)                                                                            \
    X(T, I64, dq_sh, 0)                                                                            \
    X(T, I64, dk_sb, 0)                                                                            \
    X(T, I64, dk_ss, 0)                                                                            \
    X(T, I64, dk_sh, 0)                                                                            \
    X(T, I64, dv_sb, 0)                                                                            \
    X(T, I64, dv_ss, 0)                                                                            \
    X(T, I64, dv_sh, 0)                                                                            \
    X(T, I64, dq_slice, 0)                                                                         \
    X(T, PTR, dbias, "float")                                                                      \
    X(T, PTR, dbias_part, "float")                                                                 \
    X(T, I64, dbias_sb, 0)                                                                         \
    X(T, I64, dbias_sh, 0)                                                                         \
    X(T, I64, dbias_ss, 0)                                                                         \
    X(T, I32, dbias_batches, 0)                                                                    \
    X(T, I32, dbias_heads, 0)                                                                      \
    X(T, I32, dbias_rows, 0)                                                                       \
    X(T, I32, dbias_splits, 0)                                                                     \
    X(T, I32, dq_slices, 0)                                                                        \
    X(T, I32, key_block0, 0)                                                                       \
    X(T, I32, key_blocks, 0)                                                                       \
    X(T, I32, dq_ordered, 0)                                                                       \
    X(T, PTR, dq_turns, "int")                                                                     \
    X(T, F32, scale, 0)
FJ__PARAM_STRUCT(fj__bwd_params, FJ__BWD_PARAMS);

/* Hopper's dk/dv stage (attn_bwd_wgmma.cu.lua, stage 2): the family's block and the tensor maps
** of its bulk copies: q and dout for the streamed tiles, k and v for the block's keys, with the
** slots of their row and head coordinates (perm_*, as the forward's); with dQ (grads 4) tm_dq_acc,
** the f32 sum [slices, batch * heads_q, d_rows, head_dim_pad] that the kernel adds dQ's pieces
** into by bulk tensor reductions (bwd.c says its box). */
#define FJ__BWD_TMA_PARAMS(X, T)                                                                   \
    X(T, TMAP, tm_q, 0)                                                                            \
    X(T, TMAP, tm_k, 0)                                                                            \
    X(T, TMAP, tm_v, 0)                                                                            \
    X(T, TMAP, tm_do, 0)                                                                           \
    X(T, TMAP, tm_dq_acc, 0)                                                                       \
    X(T, BLOCK, bwd, fj__bwd_params)                                                               \
    X(T, I32, perm_q, 0)                                                                           \
    X(T, I32, perm_k, 0)                                                                           \
    X(T, I32, perm_v, 0)                                                                           \
    X(T, I32, perm_do, 0)
FJ__PARAM_STRUCT(fj__bwd_tma_params, FJ__BWD_TMA_PARAMS);

/* Appending to a paged KV cache (kv_append.lua): the new keys and values [b, tokens, hkv, d]
** with batch, token and head strides (packed [tokens, hkv, d]: batch stride 0, and sequence b's
** rows from cu_seqlens_new[b], of batch sequences); the caches [num_pages, page_size, hkv, d]
** with page, row and head strides; seqused_k [b]; the table's width and the table
** (FJ__PAGE_FIELDS); an FP8 cache's descale factors of k and v (NULL: 1) with batch and head
** strides. */
#define FJ__APPEND_PARAMS(X, T)                                                                    \
    X(T, PTR, k_new, "const void")                                                                 \
    X(T, PTR, v_new, "const void")                                                                 \
    X(T, PTR, k_cache, "void")                                                                     \
    X(T, PTR, v_cache, "void")                                                                     \
    X(T, PTR, seqused_k, "const int")                                                              \
    X(T, I64, kn_sb, 0)                                                                            \
    X(T, I64, kn_ss, 0)                                                                            \
    X(T, I64, kn_sh, 0)                                                                            \
    X(T, I64, vn_sb, 0)                                                                            \
    X(T, I64, vn_ss, 0)                                                                            \
    X(T, I64, vn_sh, 0)                                                                            \
    X(T, I64, kc_sp, 0)                                                                            \
    X(T, I64, kc_ss, 0)                                                                            \
    X(T, I64, kc_sh, 0)                                                                            \
    X(T, I64, vc_sp, 0)                                                                            \
    X(T, I64, vc_ss, 0)                                                                            \
    X(T, I64, vc_sh, 0)                                                                            \
    X(T, I32, heads_kv, 0)                                                                         \
    X(T, I32, head_dim, 0)                                                                         \
    X(T, I32, head_dim_v, 0)                                                                       \
    X(T, I32, max_pages, 0)                                                                        \
    FJ__PAGE_FIELDS(X, T)                                                                          \
    X(T, PTR, cu_seqlens_new, "const int")                                                         \
    X(T, I32, batch, 0)                                                                            \
    X(T, I32, tokens, 0)                                                                           \
    X(T, PTR, k_descale, "const float")                                                            \
    X(T, PTR, v_descale, "const float")                                                            \
    X(T, I64, kd_sb, 0)                                                                            \
    X(T, I64, kd_sh, 0)                                                                            \
    X(T, I64, vd_sb, 0)                                                                            \
    X(T, I64, vd_sh, 0)
FJ__PARAM_STRUCT(fj__append_params, FJ__APPEND_PARAMS);

/* FP8 inputs dequantised (fp8_dequant.lua): src [b, s, h, d] of FP8 (q_t) at batch, row and head
** strides, times its (batch, head / group)'s factors from descale and descale2 (each NULL: 1;
** batch and head strides), into dst [b, s, h, d] of the 16-bit out type (o_t) at its batch, row
** and head strides. A work-group per (batch, row); chunks 1: dim, the strides and both bases
** in whole 16-element chunks (CUDA moves a chunk at a time). */
#define FJ__DEQUANT_PARAMS(X, T)                                                                   \
    X(T, PTR, src, "const q_t")                                                                    \
    X(T, PTR, dst, "o_t")                                                                          \
    X(T, PTR, descale, "const float")                                                              \
    X(T, I64, s_sb, 0)                                                                             \
    X(T, I64, s_ss, 0)                                                                             \
    X(T, I64, s_sh, 0)                                                                             \
    X(T, I64, d_sb, 0)                                                                             \
    X(T, I64, d_sh, 0)                                                                             \
    X(T, PTR, descale2, "const float")                                                             \
    X(T, I64, d2_sb, 0)                                                                            \
    X(T, I64, d2_sh, 0)                                                                            \
    X(T, I64, o_sb, 0)                                                                             \
    X(T, I64, o_ss, 0)                                                                             \
    X(T, I64, o_sh, 0)                                                                             \
    X(T, I32, heads, 0)                                                                            \
    X(T, I32, dim, 0)                                                                              \
    X(T, I32, group, 0)                                                                            \
    X(T, I32, chunks, 0)
FJ__PARAM_STRUCT(fj__dequant_params, FJ__DEQUANT_PARAMS);

/* FP8 values transposed (fp8_transpose_v.cu.lua): src [b, s, hkv, dv] of FP8 (kv_t) at batch,
** row and head strides into dst [b, hkv, dv, keys] (keys: seqlen_k rounded up to 16, the rest
** zeros) at its batch and head strides. A block per 64 keys of a (kv head, batch). */
#define FJ__TRANSPOSE_V_PARAMS(X, T)                                                               \
    X(T, PTR, src, "const kv_t")                                                                   \
    X(T, PTR, dst, "kv_t")                                                                         \
    X(T, I64, s_sb, 0)                                                                             \
    X(T, I64, s_ss, 0)                                                                             \
    X(T, I64, s_sh, 0)                                                                             \
    X(T, I64, o_sb, 0)                                                                             \
    X(T, I64, o_sh, 0)                                                                             \
    X(T, I32, seqlen_k, 0)                                                                         \
    X(T, I32, keys, 0)                                                                             \
    X(T, I32, dim, 0)
FJ__PARAM_STRUCT(fj__transpose_v_params, FJ__TRANSPOSE_V_PARAMS);

/* The largest parameter block, for buffers that hold any of them. */
#define FJ__MAX_PARAMS_BYTES 2048

#endif /* FJ_PLAN_FAMILIES_H */
