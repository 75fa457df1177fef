/* Variants: the families' templates and parameter blocks, the tile configuration's rules
** (consistency, shared memory, registers), configuration strings, and the template parameters,
** which feed both the render and the key, so the key always covers exactly what the template
** sees. */
#include "variant.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "families.h"
#include "plan.h"

const char *fj__variant_template(const fj__variant *v)
{
    if (v->family == FJ__FAMILY_CLASSIFY)
        return "attn_classify.lua";
    if (v->family == FJ__FAMILY_MERGE)
        return "attn_merge.lua";
    if (v->family == FJ__FAMILY_DECODE)
        return v->path == FJ__PATH_VECTOR  ? "attn_decode_vec.cu.lua"
               : v->path == FJ__PATH_MMA   ? "attn_decode_mma.cu.lua"
               : v->path == FJ__PATH_WGMMA ? (fj__decode_seesaw(v) ? "attn_decode_seesaw.cu.lua"
                                                                   : "attn_decode_wgmma.cu.lua")
                                           : "attn_decode.lua";
    if (v->family == FJ__FAMILY_APPEND)
        return "kv_append.lua";
    if (v->family == FJ__FAMILY_DEQUANT)
        return "fp8_dequant.lua";
    if (v->family == FJ__FAMILY_TRANSPOSE_V)
        return "fp8_transpose_v.cu.lua";
    if (v->family == FJ__FAMILY_BWD)
        return v->path == FJ__PATH_WGMMA ? (v->d_split ? "attn_bwd_wgmma_split.cu.lua"
                                                       : "attn_bwd_wgmma.cu.lua")
               : v->path == FJ__PATH_MMA ? (v->stage == 4   ? "attn_bwd_dbias_mma.cu.lua"
                                            : v->d_split ? "attn_bwd_mma_grid.cu.lua"
                                                         : "attn_bwd_mma.cu.lua")
                                         : "attn_bwd.lua";
    switch (v->path) {
    case FJ__PATH_MMA: return "attn_fwd_mma.cu.lua";
    case FJ__PATH_WGMMA: return "attn_fwd_wgmma.cu.lua";
    default: return "attn_fwd_simt.lua";
    }
}

const char *fj__variant_entry(const fj__variant *v)
{
    return v->family == FJ__FAMILY_CLASSIFY ? "fj_attn_classify"
           : v->family == FJ__FAMILY_MERGE  ? "fj_attn_merge"
           : v->family == FJ__FAMILY_DECODE ? "fj_attn_decode"
           : v->family == FJ__FAMILY_APPEND ? "fj_kv_append"
           : v->family == FJ__FAMILY_DEQUANT ? "fj_fp8_dequant"
           : v->family == FJ__FAMILY_TRANSPOSE_V ? "fj_fp8_transpose_v"
           : v->family == FJ__FAMILY_BWD    ? (v->stage == 1   ? "fj_attn_bwd_dot"
                                               : v->stage == 2 ? "fj_attn_bwd_dkdv"
                                               : v->stage == 3 ? "fj_attn_bwd_dq"
                                               : v->stage == 4 ? "fj_attn_bwd_dbias"
                                               : v->stage == 5 ? "fj_attn_bwd_dq_store"
                                                               : "fj_attn_bwd_dbias_sum")
                                            : "fj_attn_fwd";
}

/* Whether v is the tensor-core decode kernel with its `tensor` loader
** (fj__variant_decode_loader), whose tiles come by tensor maps. */
static int decode_tensor_loader(const fj__variant *v)
{
    return v->family == FJ__FAMILY_DECODE && v->path == FJ__PATH_MMA && v->bulk && v->swizzle;
}

const fj__playout *fj__variant_layout(const fj__variant *v)
{
    if (v->family == FJ__FAMILY_CLASSIFY)
        return &fj__classify_params_layout;
    if (v->family == FJ__FAMILY_MERGE)
        return &fj__merge_params_layout;
    if (v->family == FJ__FAMILY_DECODE)
        return v->path == FJ__PATH_WGMMA || decode_tensor_loader(v) ? &fj__decode_tma_params_layout
                                                                    : &fj__decode_params_layout;
    if (v->family == FJ__FAMILY_APPEND)
        return &fj__append_params_layout;
    if (v->family == FJ__FAMILY_DEQUANT)
        return &fj__dequant_params_layout;
    if (v->family == FJ__FAMILY_TRANSPOSE_V)
        return &fj__transpose_v_params_layout;
    if (v->family == FJ__FAMILY_BWD)
        return v->path == FJ__PATH_WGMMA && v->stage == 2 ? &fj__bwd_tma_params_layout
                                                          : &fj__bwd_params_layout;
    return v->path == FJ__PATH_WGMMA ? &fj__fwd_tma_params_layout : &fj__fwd_params_layout;
}

const char *fj__variant_path(const fj__variant *v)
{
    if (v->family == FJ__FAMILY_CLASSIFY)
        return v->backend == FJ_BACKEND_CUDA ? "cuda.classify" : "opencl.classify";
    if (v->family == FJ__FAMILY_MERGE)
        return v->backend == FJ_BACKEND_CUDA ? "cuda.merge" : "opencl.merge";
    if (v->family == FJ__FAMILY_DECODE)
        return v->backend != FJ_BACKEND_CUDA   ? "opencl.decode"
               : v->path == FJ__PATH_VECTOR ? "cuda.decode.vec"
               : v->path == FJ__PATH_MMA    ? "cuda.decode.mma"
               : v->path == FJ__PATH_WGMMA  ? (fj__decode_seesaw(v) ? "cuda.decode.seesaw"
                                                                    : "cuda.decode.wgmma")
                                            : "cuda.decode";
    if (v->family == FJ__FAMILY_APPEND)
        return v->backend == FJ_BACKEND_CUDA ? "cuda.kv_append" : "opencl.kv_append";
    if (v->family == FJ__FAMILY_DEQUANT)
        return v->backend == FJ_BACKEND_CUDA ? "cuda.dequant" : "opencl.dequant";
    if (v->family == FJ__FAMILY_TRANSPOSE_V)
        return "cuda.transpose_v";
    if (v->family == FJ__FAMILY_BWD)
        return v->backend != FJ_BACKEND_CUDA ? "opencl.bwd.simt"
               : v->path == FJ__PATH_WGMMA   ? "cuda.bwd.wgmma"
               : v->path == FJ__PATH_MMA     ? "cuda.bwd.mma"
                                             : "cuda.bwd.simt";
    if (v->backend == FJ_BACKEND_CUDA)
        return v->path == FJ__PATH_WGMMA ? "cuda.fwd.wgmma"
               : v->path == FJ__PATH_MMA ? "cuda.fwd.mma"
                                         : "cuda.fwd.simt";
    return "opencl.fwd.simt";
}

/* The seesaw kernel's keys a tile: a V tile of its own shares the slot with K's. */
static int seesaw_tile_n(const fj__variant *v)
{
    return v->v_in_k ? 64 : 32;
}

int fj__decode_seesaw(const fj__variant *v)
{
    return v->family == FJ__FAMILY_DECODE && v->path == FJ__PATH_WGMMA && v->warps == 8;
}

void fj__decode_make_seesaw(fj__variant *v)
{
    v->warps = 8;
    v->threads = 256;
    v->tile_n = seesaw_tile_n(v);
    v->stages = 2;
    v->bulk = 1;
    v->overlap = v->multicast = 0;
}

int fj__variant_element_masks(const fj__variant *v)
{
    return v->mask_mod || v->mask_tensor || v->mask_ranges;
}

uint32_t fj__variant_bias_bytes(const fj__variant *v)
{
    return v->bias == 0 ? 0 : v->bias == 1 ? 4u : (uint32_t)fj_dtype_size((fj_dtype)v->q_dtype);
}

/* What attn_bwd_hopper.lua lays out for both of Hopper's dk/dv kernels (qs bytes an element):
** K and V, a ring of `stages` slots of Q and dO, the slots' lse and D, 128 bytes of mbarriers
** and counts (256 with dq_turns: the slots' turns too, BAR_BYTES), and slack to align the
** panels; each kernel's own tiles come on top. */
static uint32_t hopper_dkdv_shared_bytes(const fj__variant *v, uint32_t qs)
{
    const uint32_t row = qs * (uint32_t)(v->head_dim_pad + v->head_dim_v_pad);
    return row * (uint32_t)(v->tile_n + v->stages * v->tile_m) +
           8u * (uint32_t)(v->stages * v->tile_m) + (v->dq_turns ? 256u : 128u) + 1023u;
}

uint32_t fj__variant_shared_bytes(const fj__variant *v)
{
    const uint32_t qs = (uint32_t)fj_dtype_size((fj_dtype)v->q_dtype);
    const uint32_t kvs = (uint32_t)fj_dtype_size((fj_dtype)v->kv_dtype);
    if (v->family == FJ__FAMILY_BWD && v->path == FJ__PATH_MMA) {
        /* attn_bwd_mma.cu.lua, rows padded by 8 elements: stage 2 K and V, two buffers of Q
        ** and dO, two of the rows' lse and D, and with dQ (grads 4) dS^T [tile_n][tile_m + 8];
        ** with d_split (attn_bwd_mma_grid.cu.lua) P^T and dS^T [tile_n][tile_m + 8], and with
        ** dQ a second dS^T; stage 3 Q and dO, two buffers of K and V; attn_bwd_dbias_mma.cu.lua
        ** (stage 4) as stage 2 without dQ. */
        const uint32_t row = qs * (uint32_t)(v->head_dim_pad + 8 + v->head_dim_v_pad + 8);
        const uint32_t tiles = (v->grads & 4 ? 1u : 0u) + (v->d_split ? 2u : 0u);
        const uint32_t ds = tiles * qs * (uint32_t)(v->tile_n * (v->tile_m + 8));
        return v->stage == 2 || v->stage == 4
                   ? row * (uint32_t)(v->tile_n + 2 * v->tile_m) + 16u * (uint32_t)v->tile_m + ds
                   : row * (uint32_t)(v->tile_m + 2 * v->tile_n);
    }
    if (v->family == FJ__FAMILY_BWD && v->path == FJ__PATH_WGMMA && v->d_split)
        /* attn_bwd_wgmma_split.cu.lua: P^T and dS^T [tile_n][tile_m] and with dQ (grads 4) dS
        ** [tile_m][tile_n] */
        return hopper_dkdv_shared_bytes(v, qs) +
               (v->grads & 4 ? 3u : 2u) * qs * (uint32_t)(v->tile_m * v->tile_n);
    if (v->family == FJ__FAMILY_BWD && v->path == FJ__PATH_WGMMA) {
        /* attn_bwd_wgmma.cu.lua: stage 2 with dQ (grads 4) two buffers of dS [tile_m][tile_n]
        ** and a staged 64 x 64 f32 piece of dQ a warpgroup (64 keys); stage 3 Q and dO, two
        ** buffers of K and V, and slack to align the panels. */
        const uint32_t ds = v->grads & 4 ? 2u * qs * (uint32_t)(v->tile_m * v->tile_n) +
                                               4u * 64u * (uint32_t)v->tile_n
                                         : 0u;
        return v->stage == 2 ? hopper_dkdv_shared_bytes(v, qs) + ds
                             : qs * (uint32_t)(v->head_dim_pad + v->head_dim_v_pad) *
                                       (uint32_t)(v->tile_m + 2 * v->tile_n) +
                                   1023u;
    }
    if (v->family == FJ__FAMILY_BWD) /* attn_bwd.lua's Smem of each stage: floats only */
        return v->stage == 2 ? 4u * (uint32_t)(v->tile_m * (v->head_dim_pad + v->head_dim_v_pad) +
                                               2 * v->tile_m)
               : v->stage == 3 ? 4u * (uint32_t)(v->tile_n * (v->head_dim_pad + v->head_dim_v_pad))
               /* dbias: 32-column chunks (CHUNK) of its rows and keys, each row's lse and D, a
               ** quarter of its rows' partial sums by key */
               : v->stage == 4
                   ? 4u * (uint32_t)((v->tile_m + v->tile_n) * (32 + 1) + 2 * v->tile_m +
                                     v->tile_m / 4 * v->tile_n)
                               : 0u;
    if (v->family == FJ__FAMILY_DECODE && v->path == FJ__PATH_VECTOR) {
        /* attn_decode_vec.cu.lua's Smem: each key group's max, sum and accumulators per row. */
        const uint32_t groups = (uint32_t)(v->threads / 32 * (32 / fj__variant_decode_lanes(v)));
        return 4u * groups * (uint32_t)(v->tile_m * (v->head_dim_v_pad + 2));
    }
    if (v->family == FJ__FAMILY_DECODE && v->path == FJ__PATH_MMA) {
        /* attn_decode_mma.cu.lua: Q (rows padded by 8 elements) and the ring of K and V tiles
        ** (rows padded by 8 elements, none with swizzle or of an FP8 cache; v_in_k: K's alone;
        ** with swizzle from the first 1024-byte boundary after Q, and 1023 bytes of slack to
        ** align the whole), with an FP8 cache the 16-bit tile converted from it (Conv: K and V,
        ** rows padded by 8 elements). Then with split_dv the exchange (Xch: 4 warps' parts of S,
        ** 16 rows of tile_n + 8 floats each); else the warps' states (Comb: max, sum and
        ** accumulators of 16 rows each) overlay the walk's bytes. With bulk, an mbarrier a ring
        ** slot after all. */
        const int fp8_cache = fj__dtype_fp8((fj_dtype)v->kv_dtype);
        const uint32_t pad = v->swizzle || fp8_cache ? 0u : 8u;
        const uint32_t slot = (uint32_t)v->head_dim_pad + pad +
                              (v->v_in_k ? 0u : (uint32_t)v->head_dim_v_pad + pad);
        const uint32_t conv = fp8_cache ? 2u * (uint32_t)v->tile_n *
                                              (uint32_t)(v->head_dim_pad + v->head_dim_v_pad + 16)
                                        : 0u;
        const uint32_t q = qs * (uint32_t)v->tile_m * (uint32_t)(v->head_dim_pad + 8);
        const uint32_t walk = (v->swizzle ? (q + 1023u) / 1024u * 1024u : q) +
                              kvs * (uint32_t)v->stages * (uint32_t)v->tile_n * slot + conv;
        const uint32_t comb = 4u * 4u * 16u * (uint32_t)(v->head_dim_v_pad + 2);
        const uint32_t end = v->split_dv ? walk + 4u * 16u * 4u * (uint32_t)(v->tile_n + 8)
                                         : walk > comb ? walk : comb;
        return end + (v->bulk ? 8u * (uint32_t)v->stages : 0u) + (v->swizzle ? 1023u : 0u);
    }
    if (fj__decode_seesaw(v)) {
        /* attn_decode_seesaw.cu.lua: Q's panels and two ring slots of a K tile's panels (and a V
        ** tile's, where v is not read from k), two floats a row per warpgroup (Rows), an
        ** mbarrier a slot's panel, and slack to align the panels to 1024 bytes. */
        const uint32_t q_panels = (uint32_t)v->head_dim_pad / 64u;
        const uint32_t slot_panels =
            q_panels + (v->v_in_k ? 0u : (uint32_t)v->head_dim_v_pad / 64u);
        return 128u * (q_panels * (uint32_t)v->tile_m + 2u * slot_panels * (uint32_t)v->tile_n) +
               16u * (uint32_t)v->tile_m + 16u * slot_panels + 1023u;
    }
    if (v->family == FJ__FAMILY_DECODE && v->path == FJ__PATH_WGMMA) {
        /* attn_decode_wgmma.cu.lua: Q's panels but an odd last one (held in registers), the
        ** halves' exchange (Xs: two regions of a consumer thread's S over half a tile's keys,
        ** tile_n / 4 floats x 128 threads each; at least a panel, where Q's odd one lands
        ** first), the ring of K [and V] tiles, two floats a row per half (Meet), two mbarriers
        ** a ring slot and Q's, and slack to align the panels to 1024 bytes. */
        const uint32_t slot = qs * (uint32_t)v->tile_n *
                              (uint32_t)(v->head_dim_pad + (v->v_in_k ? 0 : v->head_dim_v_pad));
        const uint32_t q_panels = (uint32_t)v->head_dim_pad / 64u;
        const uint32_t q = qs * (uint32_t)v->tile_m * (q_panels & ~1u) * 64u;
        const uint32_t panel = (uint32_t)v->tile_m * 128u;
        const uint32_t xs = 256u * (uint32_t)v->tile_n > (q_panels % 2 ? panel : 0u)
                                ? 256u * (uint32_t)v->tile_n
                                : panel;
        return q + xs + (uint32_t)v->stages * slot + 16u * (uint32_t)v->tile_m +
               16u * (uint32_t)v->stages + 8u + 1023u;
    }
    if (v->family == FJ__FAMILY_DECODE) /* attn_decode.lua's Smem: floats only */
        return 4u * (uint32_t)(v->tile_m * v->head_dim_pad + v->tile_n * (v->head_dim_pad + 1) +
                               v->tile_n * v->head_dim_v_pad + v->tile_m * v->tile_n +
                               3 * v->tile_m);
    if (v->family != FJ__FAMILY_FWD)
        return 0;
    if (v->path == FJ__PATH_WGMMA) {
        /* Q buffers, a ring of K and V (and bias) tiles, 8 + 4 * stages mbarriers and two
        ** tile slots (see the template), and slack to align the panels to 1024 bytes; with
        ** d_split half of Q's and K's columns, and two buffers of the peer's partial scores
        ** (tile_m x tile_n floats) with their 4 mbarriers; with FP8 inputs the staging buffers
        ** of value tiles in 128-column panels, two mbarriers each. */
        const int32_t d = v->d_split ? v->head_dim_pad / 2 : v->head_dim_pad;
        uint32_t q = qs * (uint32_t)(v->tile_m * d) * (v->q_stages ? v->q_stages : 1u);
        const int32_t dv = v->head_dim_v_pad / fj__variant_dv_slices(v);
        uint32_t kv = kvs * (uint32_t)(v->tile_n * (d + (v->v_in_k ? 0 : dv)));
        if (v->bias_tma) /* a bias tile per ring slot */
            kv += fj__variant_bias_bytes(v) * (uint32_t)(v->tile_m * v->tile_n);
        const uint32_t exchange = v->d_split ? 2u * 4u * (uint32_t)(v->tile_m * v->tile_n) + 32u : 0u;
        const uint32_t staging = (uint32_t)fj__variant_value_stages(v) *
                                 (128u * (uint32_t)(v->tile_n * ((dv + 127) / 128)) + 16u);
        return q + v->stages * kv + exchange + staging + 8u * (8u + 4u * v->stages) + 8u + 1023u;
    }
    if (v->path != FJ__PATH_MMA) /* attn_fwd_simt.lua's Smem (static): K and V tiles in float,
                                  ** and two tile flags with element masks */
        return 4u * (uint32_t)(v->tile_n * (v->head_dim_pad + v->head_dim_v_pad)) +
               (fj__variant_element_masks(v) ? 8u : 0u);
    /* Q [tile_m][d + 8], K [tile_n][d + 8], V [tile_n][dv + 8] (dv: the block's value slice). */
    const int32_t dv = v->head_dim_v_pad / fj__variant_dv_slices(v);
    return (uint32_t)(qs * v->tile_m * (v->head_dim_pad + 8) +
                      kvs * v->tile_n * (v->head_dim_pad + 8 + dv + 8));
}

uint32_t fj__variant_dynamic_shared_bytes(const fj__variant *v)
{
    const int dynamic = v->family == FJ__FAMILY_DECODE ? v->path == FJ__PATH_MMA ||
                                                             v->path == FJ__PATH_WGMMA
                                                       : v->path != FJ__PATH_SIMT;
    return dynamic ? fj__variant_shared_bytes(v) : 0u;
}

const char *fj__variant_decode_loader(const fj__variant *v)
{
    if (v->family != FJ__FAMILY_DECODE || v->path != FJ__PATH_MMA)
        return "";
    if (v->bulk)
        return decode_tensor_loader(v) ? "tensor" : "bulk";
    /* 16-byte columns of a row */
    const int ck = v->head_dim_pad * (int)fj_dtype_size((fj_dtype)v->kv_dtype) / 16;
    const int columns_fit = ck > 0 && v->threads % ck == 0 && v->tile_n % (v->threads / ck) == 0 &&
                            (!v->paged || (32 % ck == 0 && v->tile_n / 4 <= 32));
    if (v->head_dim_pad == v->head_dim_v_pad && columns_fit)
        return "columns";
    return ck >= 32 ? "wide_rows" : "pieces";
}

int fj__variant_decode_lanes(const fj__variant *v)
{
    const int widest = v->head_dim_pad > v->head_dim_v_pad ? v->head_dim_pad : v->head_dim_v_pad;
    int lanes = 1;
    while (lanes * 8 < widest && lanes < 32)
        lanes *= 2;
    return lanes;
}

int fj__variant_dv_slices(const fj__variant *v)
{
    if (v->family != FJ__FAMILY_FWD || (v->path != FJ__PATH_WGMMA && v->path != FJ__PATH_MMA))
        return 1;
    return v->d_split ? 2 : fj__dv_slices_of(v->head_dim_v_pad);
}

int fj__dv_slices_of(int32_t head_dim_v_pad)
{
    return head_dim_v_pad > 256 ? (head_dim_v_pad + 255) / 256 : 1;
}

int fj__variant_producer_registers(const fj__variant *v)
{
    if (v->family == FJ__FAMILY_DECODE) /* attn_decode_wgmma.cu.lua's copying warpgroup */
        return 48;
    if (v->family == FJ__FAMILY_FWD && fj__dtype_fp8((fj_dtype)v->q_dtype) && !v->v_transposed)
        return v->head_dim_v_pad <= 128 ? 56 : 40;
    /* A paged forward copying a tile as several pages keeps their numbers across the waits. */
    if (v->family == FJ__FAMILY_FWD && v->paged && v->page_rows && v->page_rows < v->tile_n)
        return 40;
    return 24;
}

int fj__variant_value_stages(const fj__variant *v)
{
    if (v->family != FJ__FAMILY_FWD || v->path != FJ__PATH_WGMMA ||
        !fj__dtype_fp8((fj_dtype)v->q_dtype) || v->v_transposed)
        return 0;
    return v->head_dim_v_pad / fj__variant_dv_slices(v) <= 128 ? 4 : 2;
}

int fj__variant_consumer_registers(const fj__variant *v)
{
    /* The producer warpgroup keeps its registers and the consumers share the rest of 64K per
    ** SM, in multiples of 8; two blocks of 256 threads per SM start with 128 each, and the
    ** producer's and a consumer's keep a block's share (24 + 232). One consumer warpgroup alone
    ** reallocates nothing: 255 (and 0: not a wgmma kernel, whose value is unused). (The
    ** forward's consumers own 64 query rows each; the backward's are its warpgroups but the
    ** producer.) */
    if (v->family == FJ__FAMILY_DECODE) /* attn_decode_wgmma.cu.lua: beside its copying warps' 48 */
        return 224;
    const int consumers = v->family == FJ__FAMILY_BWD ? v->warps / 4 - v->producer : v->tile_m / 64;
    const int keep = fj__variant_producer_registers(v);
    /* The block's pool is what it was launched with: 64K / threads a thread, in multiples of 8
    ** (168 for three warpgroups: 504 a thread of each). setmaxnreg.inc waits until the pool
    ** holds what it asks for, so asking for more than the producer gave back would hang. */
    const int launched = 512 / (consumers + 1) / 8 * 8;
    return v->ctas_per_sm == 2 ? (256 - keep) / 8 * 8
           : consumers < 2     ? 255
                               : (launched * (consumers + 1) - keep) / consumers / 8 * 8;
}

fj__tile_order fj__variant_tile_order(const fj__variant *v)
{
    return (fj__tile_order){.batch_fastest = v->bias || v->mask_tensor,
                            .heavy_first =
                                v->local_mask || v->block_mask || fj__variant_element_masks(v)};
}

/* The backward's tensor-core kernels read block classes per tile: a tile must lie in one
** 128 x 128 block. */
static int bwd_tiles_fit_classes(const fj__variant *v)
{
    return !v->block_mask || (128 % v->tile_m == 0 && 128 % v->tile_n == 0);
}

int fj__variant_fits(const fj__variant *v, const fj_device_info *dev)
{
    if (v->family == FJ__FAMILY_CLASSIFY)
        return v->threads == 256;
    if (v->family == FJ__FAMILY_MERGE)
        return v->threads == 128 && v->inputs >= 0 && v->inputs <= FJ__MERGE_SLOTS;
    if (v->family == FJ__FAMILY_APPEND || v->family == FJ__FAMILY_DEQUANT)
        return v->threads == 128;
    if (v->family == FJ__FAMILY_TRANSPOSE_V)
        return v->threads == 256 && v->backend == FJ_BACKEND_CUDA;
    /* A paged forward: Hopper's kernel, copies of whole swizzle periods that divide its tiles
    ** (fj__page_rows; 0 while the heuristic plans the tiles, which no kernel renders), of
    ** 16-bit data, one block a work tile's columns, no block classes or bias tiles
    ** (attn_fwd_wgmma.cu.lua's assertion). */
    if (v->family == FJ__FAMILY_FWD && v->paged &&
        (v->path != FJ__PATH_WGMMA ||
         (v->page_rows && (v->page_rows % 8 || v->tile_n % v->page_rows)) ||
         fj__dtype_fp8((fj_dtype)v->q_dtype) || v->d_split || v->block_mask ||
         fj__variant_element_masks(v) || v->bias_tma))
        return 0;
    /* A paged decode's tensor-map copies of page_rows keys: the mma kernel's tensor loader's,
    ** whole swizzle periods that divide its tiles (fj__page_rows). */
    if (v->family == FJ__FAMILY_DECODE && v->page_rows &&
        (!decode_tensor_loader(v) || !v->paged || v->page_rows % 8 || v->tile_n % v->page_rows))
        return 0;
    if (v->family == FJ__FAMILY_BWD && v->path == FJ__PATH_MMA && v->stage == 4)
        /* attn_bwd_dbias_mma.cu.lua: 16 keys a warp, a bias, dense sequences */
        return v->warps >= 1 && v->threads == 32 * v->warps && v->tile_n == 16 * v->warps &&
               v->tile_m % 16 == 0 && v->tile_m >= 16 && v->tile_m <= 128 && !v->grads &&
               v->bias && !v->varlen && v->head_dim_pad % 16 == 0 &&
               v->head_dim_v_pad % 16 == 0 && v->head_dim_pad <= 256 &&
               v->head_dim_v_pad <= 256 && bwd_tiles_fit_classes(v) &&
               fj__variant_shared_bytes(v) <= dev->local_memory;
    if (v->family == FJ__FAMILY_BWD && v->path == FJ__PATH_MMA) /* attn_bwd_mma.cu.lua */
        return (v->stage == 2 || v->stage == 3) && v->warps >= 1 && v->threads == 32 * v->warps &&
               (v->stage == 2
                    ? v->tile_n == 16 * v->warps && v->tile_m % 16 == 0 && v->grads >= 1 &&
                          v->grads <= 7 && (!(v->grads & 4) || (v->grads & 1)) /* dQ needs dS */
                    : v->tile_m == 16 * v->warps && v->tile_n % 16 == 0 && !v->grads) &&
               v->head_dim_pad <= 256 && v->head_dim_v_pad <= 256 &&
               /* dK's and dV's accumulators in one launch: 2 * (d + dv) / 8 floats a thread */
               ((v->grads & 3) != 3 || v->head_dim_pad + v->head_dim_v_pad <= 256) &&
               /* d_split (attn_bwd_mma_grid.cu.lua): pairs of warps share 32 keys and split
               ** the queries of S^T and the columns of dK and dV (the template takes 32-row
               ** tiles, which have not run on a GPU; a named barrier a pair, ids 1 to 15) */
               (!v->d_split || (v->stage == 2 && v->warps % 2 == 0 && v->warps <= 30 &&
                                v->tile_m % 64 == 0 &&
                                (v->grads == 3 || v->grads == 7) &&
                                v->head_dim_pad % 32 == 0 && v->head_dim_v_pad % 32 == 0)) &&
               bwd_tiles_fit_classes(v) &&
               fj__variant_shared_bytes(v) <= dev->local_memory;
    if (v->family == FJ__FAMILY_BWD && v->path == FJ__PATH_WGMMA && v->d_split)
        /* attn_bwd_wgmma_split.cu.lua: two computing warpgroups (and a producer's) share 64
        ** keys and split the columns of dK and dV (halves of whole panels), a block each */
        return v->stage == 2 && v->warps == 8 + 4 * v->producer && v->threads == 32 * v->warps &&
               !v->persistent && !v->dq_turns && v->tile_m == 64 &&
               v->tile_n == 64 && (v->grads == 3 || v->grads == 7) && v->stages >= 2 &&
               v->stages <= 4 && v->head_dim_pad % 128 == 0 && v->head_dim_v_pad % 128 == 0 &&
               v->head_dim_pad <= 256 && v->head_dim_v_pad <= 256 && bwd_tiles_fit_classes(v) &&
               fj__variant_shared_bytes(v) <= dev->local_memory;
    if (v->family == FJ__FAMILY_BWD && v->path == FJ__PATH_WGMMA) /* attn_bwd_wgmma.cu.lua */
        return v->warps % 4 == 0 && v->warps >= 4 && v->warps <= 12 &&
               v->threads == 32 * v->warps &&
               /* a producer feeds two computing warpgroups of stage 2, which may then take
               ** every gridDim.x-th item (persistent) */
               (!v->producer || (v->stage == 2 && v->warps == 12)) &&
               v->persistent <= v->producer &&
               /* turns count every key block before a tile's: no tile skipped by class */
               v->dq_turns <= v->persistent &&
               !(v->dq_turns && (v->block_mask || v->varlen || v->stages > 3)) &&
               (v->stage == 2 ? v->tile_n == 16 * (v->warps - 4 * v->producer) &&
                                    (v->tile_m == 64 || v->tile_m == 128) &&
                                    (v->grads == 3 || v->grads == 7) &&
                                    v->stages >= 2 && v->stages <= 4 && /* the ring */
                                    /* S^T and dP^T (tile_m / 2 floats a thread each) beside
                                    ** dK and dV ((d + dv) / 2) */
                                    v->tile_m + (v->head_dim_pad + v->head_dim_v_pad) / 2 <= 192
                : v->stage == 3 ? v->tile_m == 16 * v->warps && v->tile_n % 16 == 0 &&
                                      v->tile_n >= 16 && v->tile_n <= 256 && !v->grads &&
                                      /* S and dP beside dQ (d / 2) */
                                      v->tile_n + v->head_dim_pad / 2 <= 192
                                : 0) &&
               v->head_dim_pad % 64 == 0 && v->head_dim_v_pad % 64 == 0 &&
               v->head_dim_pad <= 128 && v->head_dim_v_pad <= 128 && bwd_tiles_fit_classes(v) &&
               fj__variant_shared_bytes(v) <= dev->local_memory;
    if (v->family == FJ__FAMILY_BWD) { /* static shared memory, as the SIMT forward's */
        uint64_t budget = dev->local_memory ? dev->local_memory : 32768;
        const uint64_t cap = dev->backend == FJ_BACKEND_CUDA ? 48 * 1024 : 64 * 1024;
        budget = budget < cap ? budget : cap;
        /* A work-item a key (stage 2) or a row (3); stage 1 a team of them a row, stage 4 4 x 4
        ** elements of tiles within the 128 x 128 class blocks, stage 5 rows of elements, stage
        ** 6 an element */
        const int dbias_tiles = v->tile_m % 4 == 0 && v->tile_n % 4 == 0 && v->tile_n > 0 &&
                                128 % v->tile_m == 0 && 128 % v->tile_n == 0 &&
                                v->threads == v->tile_m * v->tile_n / 16;
        return v->stage >= 1 && v->stage <= 6 && v->tile_m >= 1 &&
               (v->stage == 1 || v->stage == 5 ? v->threads % v->tile_m == 0 && v->threads <= 1024
                : v->stage == 4                ? dbias_tiles
                : v->stage == 6                ? v->threads >= 32 && v->threads <= 1024
                              : v->tile_n >= 1 &&
                                    v->threads == (v->stage == 2 ? v->tile_n : v->tile_m)) &&
               fj__variant_shared_bytes(v) <= budget;
    }
    if (v->family == FJ__FAMILY_DECODE && v->path == FJ__PATH_VECTOR)
        return v->backend == FJ_BACKEND_CUDA && v->threads == 128 && v->tile_m >= 1 &&
               v->tile_m <= 8 && v->stages >= 1 && v->stages <= 8 &&
               v->ctas_per_sm <= 4 && v->head_dim_pad % 8 == 0 && v->head_dim_v_pad % 8 == 0 &&
               v->head_dim_pad <= 256 && v->head_dim_v_pad <= 256 &&
               fj__variant_shared_bytes(v) <= FJ__DECODE_MAX_SHARED;
    if (v->family == FJ__FAMILY_DECODE && v->path == FJ__PATH_MMA) { /* attn_decode_mma.cu.lua */
        const int slabs = v->tile_m / 16, kwarps = slabs > 0 ? 4 / slabs : 0;
        /* A warp's floats a thread: S's (its keys, or with split_dv all of the tile's beside its
        ** quarter of Q's fragments) and O's (all columns, or with split_dv a quarter). */
        const int regs = v->split_dv ? v->tile_n / 2 + v->head_dim_pad / 16 + v->head_dim_v_pad / 8
                                     : (kwarps ? v->tile_n / kwarps / 2 : 0) + v->head_dim_v_pad / 2;
        return v->backend == FJ_BACKEND_CUDA && v->threads == 128 && v->warps == 4 &&
               (v->tile_m == 16 || v->tile_m == 32 || v->tile_m == 64) &&
               v->tile_n % (16 * (v->split_dv ? 1 : kwarps)) == 0 && v->tile_n >= 16 &&
               v->tile_n <= 128 &&
               (!v->split_dv || (v->tile_m == 16 && v->head_dim_pad % 64 == 0 &&
                                 v->head_dim_v_pad % 64 == 0 && !v->q_in_regs)) &&
               (!v->v_in_k || v->head_dim_v_pad <= v->head_dim_pad) && regs <= 160 &&
               v->stages >= 2 &&
               v->stages <= 8 && v->ctas_per_sm <= 4 && v->head_dim_pad % 16 == 0 &&
               v->head_dim_v_pad % 16 == 0 && v->head_dim_pad <= FJ__MAX_HEAD_DIM &&
               v->head_dim_v_pad <= FJ__MAX_HEAD_DIM && (!v->bulk || fj__sm_version(dev) >= 90) &&
               fj__variant_shared_bytes(v) <= dev->local_memory;
    }
    if (fj__decode_seesaw(v)) /* attn_decode_seesaw.cu.lua */
        return v->backend == FJ_BACKEND_CUDA && fj__sm_version(dev) == 90 &&
               strchr(dev->arch, 'a') != NULL && v->threads == 256 && v->tile_m == 64 &&
               v->tile_n == seesaw_tile_n(v) && v->stages == 2 && v->bulk && !v->overlap &&
               !v->multicast && v->head_dim_pad % 64 == 0 && v->head_dim_v_pad % 128 == 0 &&
               v->head_dim_v_pad <= 512 &&
               (!v->v_in_k || v->head_dim_pad >= v->head_dim_v_pad + 64) &&
               v->head_dim_pad <= FJ__MAX_HEAD_DIM &&
               fj__variant_shared_bytes(v) <= dev->local_memory;
    if (v->family == FJ__FAMILY_DECODE && v->path == FJ__PATH_WGMMA) /* attn_decode_wgmma.cu.lua */
        return v->backend == FJ_BACKEND_CUDA && fj__sm_version(dev) == 90 &&
               strchr(dev->arch, 'a') != NULL && v->threads == 384 && v->warps == 12 &&
               v->tile_m == 64 && (v->tile_n == 32 || v->tile_n == 64 || v->tile_n == 128) &&
               v->stages >= 2 && v->stages <= 4 && v->head_dim_pad % 64 == 0 &&
               v->head_dim_v_pad % 128 == 0 && v->head_dim_v_pad <= 512 &&
               v->head_dim_pad <= FJ__MAX_HEAD_DIM &&
               (!v->v_in_k || v->head_dim_v_pad <= v->head_dim_pad) &&
               fj__variant_shared_bytes(v) <= dev->local_memory;
    if (v->family == FJ__FAMILY_DECODE) /* static shared memory: 48 KiB on CUDA */
        return v->threads == 128 && v->tile_m >= 1 && v->tile_m <= 128 && v->tile_n >= 8 &&
               v->tile_n <= 64 && fj__variant_shared_bytes(v) <= FJ__DECODE_MAX_SHARED &&
               fj__variant_shared_bytes(v) <= dev->local_memory;
    if (v->path == FJ__PATH_WGMMA) {
        int consumers = v->tile_m / 64;
        /* A slice of the value columns per work tile (head dims beyond 256). */
        const int slices = fj__variant_dv_slices(v), dv = v->head_dim_v_pad / slices;
        /* S and O fragments per consumer thread, plus ~40 for addresses and softmax state; and
        ** P's when the loop is pipelined (the plain loop packs P as S dies: 192 x 128 tiles at
        ** d 64 fit the 160 registers of three consumers without spills). */
        /* (d_split: ~16 more for the exchange's addresses; at 96-key tiles it reached 255) */
        /* (P takes a word a thread per 4 keys in FP8, per 2 in 16 bits.) */
        const int fp8 = fj__dtype_fp8((fj_dtype)v->q_dtype);
        /* (FP8 beyond one panel: a part's second sum besides S, less 8 beyond 128 value
        ** columns, where ptxas builds 16-key parts at dv 256 in 232 without spills) */
        const int parts = v->score_parts;
        int registers = v->tile_n / 2 + (v->overlap ? v->tile_n / (fp8 ? 8 : 4) : 0) + dv / 2 + 40 +
                        (v->d_split ? 16 : 0) +
                        (parts > 0 ? v->tile_n / parts / 2 - (dv > 128 ? 8 : 0) : 0);
        return consumers >= 1 && consumers <= 3 && v->tile_m == 64 * consumers &&
               (!v->pingpong || (consumers == 2 && v->overlap)) &&
               v->warps == 4 * (consumers + 1) && v->threads == 32 * v->warps &&
               v->tile_n % 16 == 0 && v->tile_n >= 16 && v->tile_n <= 256 && v->stages >= 1 &&
               v->stages <= 4 && v->q_stages >= 1 && v->q_stages <= 2 &&
               v->head_dim_pad % 64 == 0 && dv % 64 == 0 && dv * slices == v->head_dim_v_pad &&
               /* (d_split pads 576 to 640: halves of whole panels) */
               v->head_dim_pad <= FJ__MAX_HEAD_DIM + 64 && v->head_dim_v_pad <= FJ__MAX_HEAD_DIM &&
               v->ctas_per_sm >= 1 && v->ctas_per_sm <= 2 &&
               (v->ctas_per_sm == 1 || consumers == 1) && v->exp_poly <= 8 &&
               v->lazy_rescale <= 1 && registers <= fj__variant_consumer_registers(v) &&
               (!(v->block_mask || fj__variant_element_masks(v)) ||
                (128 % v->tile_m == 0 && 128 % v->tile_n == 0)) &&
               (!v->bias_tma || (v->tile_n * fj__variant_bias_bytes(v)) % 128 == 0) &&
               /* d_split: a cluster pair per work tile, in grid order (no persistent grid),
               ** halves of whole panels */
               (!v->d_split || (consumers == 1 && !v->persistent && v->head_dim_pad % 128 == 0 &&
                                v->head_dim_v_pad % 128 == 0 && v->ctas_per_sm == 1)) &&
               /* v_in_k: each block's value columns lead its half of K's */
               (!v->v_in_k || (v->d_split && v->head_dim_v_pad <= v->head_dim_pad)) &&
               /* FP8: one value slice, value tiles of whole 128-key panels, q's and k's
               ** columns in 128-byte panels, a static schedule (the transposing warps follow
               ** the consumers' order), and O rescaled for every tile: with a stale exponent
               ** base (P up to 256) the output's error was 2.8x a plain FP8 implementation's
               ** at dv 192 and 256 on the H200, 0.9-1.1x without */
               (!fp8 || (slices == 1 && !v->d_split && !v->v_in_k && v->tile_n % 128 == 0 &&
                         v->head_dim_pad % 128 == 0 && v->head_dim_pad <= 256 &&
                         v->persistent != 2 &&
                         !v->lazy_rescale)) &&
               /* v transposed by a plan step: FP8, dense (its workspace follows the shape) */
               (!v->v_transposed || (fp8 && !v->varlen && !v->paged)) &&
               /* FP8 beyond one panel of q and k: its second panel in parts of whole n8
               ** blocks; beyond 128 value columns (16-key parts) ptxas spilled 36-164 bytes
               ** with element masks or score terms, so those take the SIMT kernel */
               (fp8 && v->head_dim_pad > 128
                    ? parts > 0 && v->tile_n % parts == 0 && (v->tile_n / parts) % 8 == 0 &&
                          (dv <= 128 || !(fj__variant_element_masks(v) || v->alibi || v->bias ||
                                          (v->score_mod && *v->score_mod)))
                    : parts == 0) &&
               /* Each block also reserves 1 KiB of the SM's shared memory, which holds the
               ** largest block's opt-in plus that kilobyte. */
               (uint64_t)v->ctas_per_sm * (fj__variant_shared_bytes(v) + 1024u) <=
                   dev->local_memory + 1024u;
    }
    if (v->path == FJ__PATH_MMA) {
        /* attn_fwd_mma.cu.lua: value slices of whole column pairs, at most 256 columns */
        const int slices = fj__variant_dv_slices(v), dv = v->head_dim_v_pad / slices;
        return v->warps >= 1 && v->tile_m % (16 * v->warps) == 0 && v->tile_n % 16 == 0 &&
               v->threads == 32 * v->warps && dv % 16 == 0 && dv * slices == v->head_dim_v_pad &&
               dv <= 256 && v->head_dim_pad <= FJ__MAX_HEAD_DIM &&
               fj__variant_shared_bytes(v) <= dev->local_memory;
    }
    /* SIMT: its local memory (at most 64 KiB on OpenCL and the 48 KiB of static shared memory
    ** on CUDA). */
    uint64_t budget = dev->local_memory ? dev->local_memory : 32768;
    uint64_t cap = dev->backend == FJ_BACKEND_CUDA ? 48 * 1024 : 64 * 1024;
    budget = budget < cap ? budget : cap;
    return v->threads == v->tile_m && fj__variant_shared_bytes(v) <= budget;
}

void fj__variant_config(const fj__variant *v, char *buf, size_t size)
{
    if (v->family == FJ__FAMILY_BWD && v->path == FJ__PATH_WGMMA) /* plan/bwd.c applies these */
        snprintf(buf, size, "tile_m=%d,warps=%d,producer=%d,overlap=%d,persistent=%d",
                 (int)v->tile_m, (int)v->warps, (int)v->producer, (int)v->overlap,
                 (int)v->persistent);
    else if (v->family == FJ__FAMILY_BWD)
        snprintf(buf, size, v->path == FJ__PATH_SIMT ? "tile_m=%d,tile_n=%d" : "tile_m=%d,warps=%d",
                 (int)v->tile_m, v->path == FJ__PATH_SIMT ? (int)v->tile_n : (int)v->warps);
    else if (v->family == FJ__FAMILY_DECODE && v->path == FJ__PATH_VECTOR)
        snprintf(buf, size, "stages=%d,ctas_per_sm=%d", (int)v->stages, (int)v->ctas_per_sm);
    else if (v->family == FJ__FAMILY_DECODE && v->path == FJ__PATH_WGMMA)
        snprintf(buf, size, "warps=%d,tile_n=%d,stages=%d,overlap=%d,bulk=%d,multicast=%d",
                 (int)v->warps, (int)v->tile_n, (int)v->stages, (int)v->overlap, (int)v->bulk,
                 (int)v->multicast);
    else if (v->family == FJ__FAMILY_DECODE && v->path == FJ__PATH_MMA)
        snprintf(buf, size, "tile_m=%d,tile_n=%d,stages=%d,q_in_regs=%d,ctas_per_sm=%d,bulk=%d",
                 (int)v->tile_m, (int)v->tile_n, (int)v->stages, (int)v->q_in_regs,
                 (int)v->ctas_per_sm, (int)v->bulk);
    else if (v->path == FJ__PATH_WGMMA)
        snprintf(buf, size,
                 "path=wgmma,tile_m=%d,tile_n=%d,warps=%d,stages=%d,q_stages=%d,overlap=%d,"
                 "pingpong=%d,persistent=%d,ctas_per_sm=%d,exp_poly=%d,lazy_rescale=%d,d_split=%d",
                 (int)v->tile_m, (int)v->tile_n, (int)v->warps, (int)v->stages, (int)v->q_stages,
                 (int)v->overlap, (int)v->pingpong, (int)v->persistent, (int)v->ctas_per_sm,
                 (int)v->exp_poly, (int)v->lazy_rescale, (int)v->d_split);
    else if (v->path == FJ__PATH_MMA)
        snprintf(buf, size, "tile_m=%d,tile_n=%d,warps=%d,kk_unroll=%d,q_in_regs=%d",
                 (int)v->tile_m, (int)v->tile_n, (int)v->warps, (int)v->kk_unroll,
                 (int)v->q_in_regs);
    else
        snprintf(buf, size, "tile_m=%d,tile_n=%d", (int)v->tile_m, (int)v->tile_n);
}

int fj__apply_config(fj__variant *v, const char *config, fj__err *err)
{
    /* The tunable fields: 32-bit tile sizes and one-byte switches and counts. */
    static const struct {
        const char *name;
        size_t offset, size;
        int32_t lo, hi;
    } fields[] = {{"tile_m", offsetof(fj__variant, tile_m), 4, 16, 256},
                  {"tile_n", offsetof(fj__variant, tile_n), 4, 8, 256},
                  {"warps", offsetof(fj__variant, warps), 4, 1, 16},
                  {"kk_unroll", offsetof(fj__variant, kk_unroll), 4, 0, 16},
                  {"q_in_regs", offsetof(fj__variant, q_in_regs), 1, 0, 1},
                  {"overlap", offsetof(fj__variant, overlap), 1, 0, 1},
                  {"pingpong", offsetof(fj__variant, pingpong), 1, 0, 1},
                  {"persistent", offsetof(fj__variant, persistent), 1, 0, 3},
                  {"stages", offsetof(fj__variant, stages), 1, 1, 8},
                  {"q_stages", offsetof(fj__variant, q_stages), 1, 1, 2},
                  {"ctas_per_sm", offsetof(fj__variant, ctas_per_sm), 1, 0, 4},
                  {"exp_poly", offsetof(fj__variant, exp_poly), 1, 0, 8},
                  {"lazy_rescale", offsetof(fj__variant, lazy_rescale), 1, 0, 1},
                  {"score_parts", offsetof(fj__variant, score_parts), 1, 0, 16},
                  {"d_split", offsetof(fj__variant, d_split), 1, 0, 1},
                  {"bulk", offsetof(fj__variant, bulk), 1, 0, 1},
                  {"swizzle", offsetof(fj__variant, swizzle), 1, 0, 1},
                  {"merge_last", offsetof(fj__variant, merge_last), 1, 0, 1},
                  {"multicast", offsetof(fj__variant, multicast), 1, 0, 1},
                  {"producer", offsetof(fj__variant, producer), 1, 0, 1},
                  {"dq_turns", offsetof(fj__variant, dq_turns), 1, 0, 1},
                  {"class_vote", offsetof(fj__variant, class_vote), 1, 0, 1},
                  {"dequant", offsetof(fj__variant, dequant), 1, 0, 1},
                  {"v_transposed", offsetof(fj__variant, v_transposed), 1, 0, 1}};
    const char *p = config;
    while (p && *p) {
        if (!strncmp(p, "path=", 5)) {
            size_t len = strspn(p + 5, "abcdefghijklmnopqrstuvwxyz");
            if (!((len == 3 && !strncmp(p + 5, "mma", 3)) ||
                  (len == 5 && !strncmp(p + 5, "wgmma", 5)) ||
                  (len == 4 && !strncmp(p + 5, "simt", 4)) ||
                  (len == 6 && !strncmp(p + 5, "decode", 6)) ||
                  (len == 3 && !strncmp(p + 5, "vec", 3))))
                return fj__fail(err, FJ_ERR_INVALID_ARGUMENT,
                                "FLASHJIT_CONFIG: path must be simt, mma, wgmma, decode or vec: '%s'",
                                p),
                       -1;
            p += 5 + len;
            if (*p == ',')
                p++;
            continue;
        }
        char name[32];
        int value = 0, used = 0;
        if (sscanf(p, "%31[a-z_]=%d%n", name, &value, &used) != 2)
            return fj__fail(err, FJ_ERR_INVALID_ARGUMENT, "FLASHJIT_CONFIG: cannot read '%s'", p),
                   -1;
        if (!strcmp(name, "splits")) { /* a decode plan's, not the variant's (fj__config_splits) */
            if (value < 1 || value > FJ__DECODE_MAX_SPLITS)
                return fj__fail(err, FJ_ERR_INVALID_ARGUMENT,
                                "FLASHJIT_CONFIG: splits = %d, expected 1..%d", value,
                                FJ__DECODE_MAX_SPLITS),
                       -1;
            p += used;
            if (*p == ',')
                p++;
            continue;
        }
        size_t i = 0;
        while (i < sizeof fields / sizeof fields[0] && strcmp(name, fields[i].name))
            i++;
        if (i == sizeof fields / sizeof fields[0])
            return fj__fail(err, FJ_ERR_INVALID_ARGUMENT, "FLASHJIT_CONFIG: unknown field '%s'",
                            name),
                   -1;
        if (value < fields[i].lo || value > fields[i].hi)
            return fj__fail(err, FJ_ERR_INVALID_ARGUMENT,
                            "FLASHJIT_CONFIG: %s = %d, expected %d..%d", name, value, fields[i].lo,
                            fields[i].hi),
                   -1;
        if (fields[i].size == 4)
            memcpy((char *)v + fields[i].offset, &(int32_t){value}, sizeof(int32_t));
        else
            *((uint8_t *)v + fields[i].offset) = (uint8_t)value;
        p += used;
        if (*p == ',')
            p++;
    }
    if (v->family == FJ__FAMILY_FWD) /* the forward's threads follow its tiles */
        v->threads = v->path == FJ__PATH_SIMT ? v->tile_m : 32 * v->warps;
    return 0;
}

const char *fj__config_field(const char *config, const char *name)
{
    const size_t len = strlen(name);
    for (const char *at = config; at && (at = strstr(at, name)) != NULL; at += len)
        if ((at == config || at[-1] == ',') && at[len] == '=')
            return at + len + 1;
    return NULL;
}

int32_t fj__config_splits(const char *config)
{
    const char *value = fj__config_field(config, "splits");
    const int splits = value ? atoi(value) : 0;
    return splits >= 1 && splits <= FJ__DECODE_MAX_SPLITS ? splits : 0;
}

int fj__variant_params(const fj__variant *v, tpl_param out[FJ__MAX_TPL_PARAMS])
{
    int n = 0;
#define INT_PARAM(field) out[n++] = (tpl_param){.name = #field, .kind = TPL_INT, .i = v->field}
#define BOOL_PARAM(field)                                                                          \
    out[n++] = (tpl_param)                                                                         \
    {                                                                                              \
        .name = #field, .kind = TPL_BOOL, .i = v->field                                            \
    }
#define STR_PARAM(field, value)                                                                    \
    out[n++] = (tpl_param)                                                                         \
    {                                                                                              \
        .name = field, .kind = TPL_STR, .s = value                                                 \
    }
#define DTYPE_PARAM(field) STR_PARAM(#field, fj__dtype_name((fj_dtype)v->field))
    STR_PARAM("backend", fj__backend_name((fj_backend_kind)v->backend));
    DTYPE_PARAM(q_dtype);
    DTYPE_PARAM(kv_dtype);
    DTYPE_PARAM(out_dtype);
    DTYPE_PARAM(acc_dtype);
    STR_PARAM("kernel", fj__variant_template(v));
    out[n++] = (tpl_param){.name = "args", .kind = TPL_LAYOUT, .layout = fj__variant_layout(v)};
    STR_PARAM("mask_mod", v->mask_mod ? v->mask_mod : "");
    STR_PARAM("score_mod", v->score_mod ? v->score_mod : "");
    STR_PARAM("score_mod_grad", v->score_mod_grad ? v->score_mod_grad : "");
    INT_PARAM(head_dim_pad);
    INT_PARAM(head_dim_v_pad);
    INT_PARAM(tile_m);
    INT_PARAM(tile_n);
    INT_PARAM(threads);
    INT_PARAM(inputs);
    INT_PARAM(warps);
    INT_PARAM(kk_unroll);
    INT_PARAM(stages);
    INT_PARAM(q_stages);
    INT_PARAM(ctas_per_sm);
    INT_PARAM(exp_poly);
    BOOL_PARAM(q_in_regs);
    BOOL_PARAM(lazy_rescale);
    BOOL_PARAM(overlap);
    BOOL_PARAM(pingpong);
    INT_PARAM(persistent);
    /* Derived from the fields above, so the kernel follows the host's arithmetic. */
    const fj__tile_order order = fj__variant_tile_order(v);
    out[n++] =
        (tpl_param){.name = "shared_bytes", .kind = TPL_INT, .i = fj__variant_shared_bytes(v)};
    out[n++] = (tpl_param){
        .name = "consumer_regs", .kind = TPL_INT, .i = fj__variant_consumer_registers(v)};
    out[n++] = (tpl_param){
        .name = "producer_regs", .kind = TPL_INT, .i = fj__variant_producer_registers(v)};
    out[n++] = (tpl_param){.name = "v_stages", .kind = TPL_INT, .i = fj__variant_value_stages(v)};
    out[n++] = (tpl_param){.name = "dv_slices", .kind = TPL_INT, .i = fj__variant_dv_slices(v)};
    INT_PARAM(score_parts);
    out[n++] = (tpl_param){.name = "batch_fastest", .kind = TPL_BOOL, .i = order.batch_fastest};
    out[n++] = (tpl_param){.name = "heavy_first", .kind = TPL_BOOL, .i = order.heavy_first};
    out[n++] = (tpl_param){.name = "lanes", .kind = TPL_INT, .i = fj__variant_decode_lanes(v)};
    STR_PARAM("loader", fj__variant_decode_loader(v));
    BOOL_PARAM(alibi);
    STR_PARAM("bias", v->bias == 0 ? "" : v->bias == 1 ? "f32" : "dtype");
    BOOL_PARAM(mask_tensor);
    INT_PARAM(varlen);
    INT_PARAM(mask_ranges);
    BOOL_PARAM(block_mask);
    BOOL_PARAM(bias_tma);
    BOOL_PARAM(class_vote);
    BOOL_PARAM(d_split);
    BOOL_PARAM(v_in_k);
    BOOL_PARAM(partial);
    BOOL_PARAM(merge_last);
    BOOL_PARAM(split_dv);
    BOOL_PARAM(bulk);
    BOOL_PARAM(swizzle);
    BOOL_PARAM(multicast);
    BOOL_PARAM(producer);
    BOOL_PARAM(dq_turns);
    INT_PARAM(stage);
    INT_PARAM(grads);
    BOOL_PARAM(paged);
    INT_PARAM(page_rows);
    BOOL_PARAM(row_band);
    BOOL_PARAM(local_mask);
    BOOL_PARAM(softcap);
    BOOL_PARAM(neg_scale);
    BOOL_PARAM(write_lse);
    BOOL_PARAM(descale);
    BOOL_PARAM(v_transposed);
#undef INT_PARAM
#undef BOOL_PARAM
#undef STR_PARAM
#undef DTYPE_PARAM
    return n;
}

static int by_name(const void *a, const void *b)
{
    return strcmp(((const tpl_param *)a)->name, ((const tpl_param *)b)->name);
}

/* Appends "name=value\n" to *buf (grown as needed); returns 0, or -1 out of memory. */
static int append_line(char **buf, size_t *len, size_t *cap, const char *name, const char *value)
{
    size_t need = strlen(name) + strlen(value) + 3;
    if (*len + need > *cap) {
        size_t cap2 = (*cap ? *cap : 1024);
        while (cap2 < *len + need)
            cap2 *= 2;
        char *grown = realloc(*buf, cap2);
        if (!grown)
            return -1;
        *buf = grown;
        *cap = cap2;
    }
    *len += (size_t)snprintf(*buf + *len, *cap - *len, "%s=%s\n", name, value);
    return 0;
}

fj_status fj__variant_key(const fj__variant *v, const char *target, const char *template_hash,
                          char **text, char hash[65], fj__err *err)
{
    tpl_param params[FJ__MAX_TPL_PARAMS + 2];
    int n = fj__variant_params(v, params);
    params[n++] = (tpl_param){.name = "target", .kind = TPL_STR, .s = target};
    params[n++] = (tpl_param){.name = "templates", .kind = TPL_STR, .s = template_hash};
    qsort(params, (size_t)n, sizeof params[0], by_name);
    /* Built to any length: expressions are user text (no fixed buffer holds them). */
    char *buf = NULL;
    size_t len = 0, cap = 0;
    int bad = 0;
    for (int i = 0; i < n && !bad; i++) {
        char value[96];
        const char *s = value;
        if (params[i].kind == TPL_STR) {
            s = params[i].s;
        } else if (params[i].kind == TPL_LAYOUT) {
            char sig[17];
            fj__playout_signature(params[i].layout, sig);
            snprintf(value, sizeof value, "%s/%s", params[i].layout->name, sig);
        } else {
            snprintf(value, sizeof value, "%lld", (long long)params[i].i);
        }
        bad = append_line(&buf, &len, &cap, params[i].name, s);
    }
    if (bad || !buf) {
        free(buf);
        *text = NULL;
        return fj__fail(err, FJ_ERR_OUT_OF_MEMORY, "out of memory for a variant key");
    }
    *text = buf;
    fj__sha256_hex(buf, len, hash);
    return FJ_OK;
}

fj_status fj__variant_render(const fj__variant *v, const char *template_dir, const char *key_text,
                             char **source, fj__err *err)
{
    tpl_param params[FJ__MAX_TPL_PARAMS];
    int n = fj__variant_params(v, params);
    return tpl_render(template_dir, fj__variant_template(v), params, n, key_text, source, err);
}
