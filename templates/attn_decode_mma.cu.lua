% -- Decode attention on tensor cores (sm_80+): the decode family's kernel for 16-bit data in
% -- 16-byte rows on CUDA. Same work and output as attn_decode.lua (a block per (batch, kv head,
% -- row tile, split); grouped-query heads packed, so each key and value is read once for every
% -- query head that shares it; with `partial` the split's state goes to the workspace), built
% -- for the bandwidth limit, as FlashInfer's tensor-core decode:
% --   - keys and values stream through a ring of STAGES shared-memory tiles of BN keys by
% --     cp.async, or with `bulk` (sm_90) by the bulk-copy engine: a row a copy, or with
% --     `swizzle` too a 64-column panel a copy by tensor maps (the `tensor` loader); a slot
% --     complete on its mbarrier; (STAGES - 1) tiles are always in flight; one block barrier
% --     a tile; read once, they are marked evict-first in L2 (cp.async: with 256-byte L2
% --     fetches; the tensor maps' copies carry no hint: with row copies it made no difference);
% --   - the packed rows are the M side of mma.sync m16n8k16: the block's BM rows are BM / 16
% --     slabs of 16, and the KWARPS warps of a slab share its work (below): S = Q K^T and
% --     O += P V on tensor cores, one online softmax per (row, key) in the accumulators'
% --     registers;
% --   - a slab's warps split the keys of each tile (each warp its own softmax state over its
% --     keys; at the end the states meet in shared memory and are combined); or, with
% --     `split_dv` (value dims beyond 256, whose O would not fit a warp's registers; one slab),
% --     the head dims of S and the columns of O: each warp keeps its quarter of Q's columns in
% --     registers and computes its part of S over them for every key of the tile; the parts
% --     meet in shared memory (Xch), each warp adds them up in the same order (so all hold the
% --     same S), runs the softmax, and adds P V into its quarter of O's columns (MLA's 576 / 512:
% --     144 dims of S and 128 columns of O a warp), so S is computed once and Q read once;
% --   - `v_in_k` (MLA's latent cache: v a view of k's first dims): a ring slot holds the K tile
% --     alone and V is read from its first columns;
% --   - an FP8 cache (kv_dtype e4m3 or e5m2, q and out 16-bit): the ring holds the cache's bytes
% --     (half a 16-bit tile's), and each tile is converted into f16 in shared memory (Conv)
% --     before the products, which run in f16 (Q converted as it is loaded): the warps whose
% --     products read a tile's key rows convert them, and meet at a named barrier of their
% --     own; the descale factors and KV_UNIT (cuda_fp8_cache.lua) go into the scores' factor
% --     and the output's.
% -- Query rows past the packed rows are zeros, computed and never stored.
% --
% -- Parameters: as attn_decode.lua (q and out one 16-bit type, k and v that type or FP8; no
% -- tile_n limit of its own), descale (an FP8 cache's factors), tile_m (BM:
% -- 16, 32 or 64 packed rows), tile_n (BN keys a tile; KPW = BN / KWARPS a multiple of 16),
% -- stages (the ring's tiles), swizzle (the ring's tiles in the 128-byte swizzle's panels, below),
% -- page_rows (paged, by the tensor loader: the key rows of one tensor-map copy, below),
% -- q_in_regs (the query fragments stay in registers across the walk,
% -- else they are read from shared memory a tile at a time: large head dims), split_dv, v_in_k
% -- and bulk (above), partial (with it, the merge's launch may overlap this grid's end: see
% -- attn_merge.lua), merge_last (with partial: the last split of a block's rows merges them
% -- here, decode_merge.lua; no merge step), shared_bytes (the host's fj__variant_shared_bytes),
% -- ctas_per_sm (the blocks an SM holds, which the registers must allow: the plan's from shared
% -- memory, fj__decode_mma_residency; 0 no bound).
% assert(backend == "cuda", "attn_decode_mma is a CUDA kernel")
% assert(threads == 128, "attn_decode_mma: 128 threads per block")
% assert(tile_m == 16 or tile_m == 32 or tile_m == 64, "attn_decode_mma: 16, 32 or 64 packed rows per block")
% assert(head_dim_pad % 16 == 0 and head_dim_v_pad % 16 == 0, "attn_decode_mma: head dims padded to 16")
% assert(stages >= 2 and stages <= 8, "attn_decode_mma: 2 to 8 tiles in the ring")
% local kwarps = 4 // (tile_m // 16)
% assert(tile_n % (16 * (split_dv and 1 or kwarps)) == 0, "attn_decode_mma: 16 keys a warp at least")
% assert(not split_dv or (tile_m == 16 and head_dim_pad % 64 == 0 and head_dim_v_pad % 64 == 0 and not q_in_regs),
%        "attn_decode_mma: split_dv takes one slab, whole 16-column blocks a warp, and Q's in registers its own way")
% assert(not v_in_k or head_dim_v_pad <= head_dim_pad, "attn_decode_mma: v_in_k reads V inside K's rows")
% include("dialect.lua")
% local fp8_kv = is_fp8(kv_dtype)
% assert(not fp8_kv or (not split_dv and not v_in_k and not swizzle and loader ~= "wide_rows"
%                       and head_dim_pad % 16 == 0 and head_dim_v_pad % 16 == 0),
%        "attn_decode_mma: an FP8 cache in rows of 16-byte pieces, copied by the bulk, column " ..
%        "or piece loader, neither split_dv, v_in_k nor swizzle")
% include("cuda_mma.lua")
% if merge_last then
% include("decode_merge.lua")
% end
% if fp8_kv then
% include("cuda_fp8_cache.lua")
% include("descale.lua")
% end
% if bulk then
% include("cuda_hopper.lua")
% end
% local tensor = loader == "tensor" -- panels by tensor maps (the kernel's parameter is then T)
% include("params.lua")
% include("sequence.lua")
% params_struct(args)
% mma_tile_macros()
#define WARPS 4
#define SLABS (BM / 16)        /* row slabs of 16 packed rows */
#define KWARPS (WARPS / SLABS) /* warps sharing a slab */
#define STAGES ${stages}
#define KT (DP / 16)  /* k steps of S = Q K^T */
% if split_dv then
#define KPW BN                 /* a warp's keys of a tile: all */
#define KTW (KT / KWARPS)      /* k steps of S over a warp's head dims (its query fragments) */
#define CPW (DVP / KWARPS)     /* O's columns a warp takes */
% else
#define KTW KT                 /* k steps of S a warp takes: all */
#define KPW (BN / KWARPS)      /* a warp's keys of a tile */
#define CPW DVP                /* O's columns a warp takes: all */
% end
#define NT (KPW / 8)  /* S's n8 column blocks a warp */
#define OT (CPW / 8)  /* O's n8 column blocks a warp */
#define PT (KPW / 16) /* k steps of O += P V */
#define EPP (16 / (int)sizeof(kv_t)) /* elements of K and V in a 16-byte piece */
#define NEG_INF __int_as_float(0xff800000)

/* Shared memory (dynamic, the host's fj__variant_shared_bytes): the rows' queries Q [BM][QS],
** then the ring of STAGES slots of K [BN][KROW] and V [BN][VROW] (kv_t; with v_in_k V is K's
** first columns), with an FP8 cache the f16 tile the products read (Conv: K [BN][QS] and V
** [BN][VS]), and with split_dv the warps' parts of S (Xch). Without split_dv the same bytes
** hold each warp's state for the combine after the walk (Comb). With bulk, the ring slots'
** mbarriers follow. The products read rows padded by 16 bytes (ldmatrix without bank
** conflicts): the ring's own, or Conv's (an FP8 ring's rows are not padded: its pieces are read
** 8 bytes a lane, a warp's whole rows at once); with `swizzle` the ring's tiles are 64-column
** panels of BN rows x 128 bytes in the 128-byte swizzle (cuda_mma.lua's panel_at; the layout a
** tensor map's copies write, so the ring starts on a 1024-byte boundary, RING_AT): ldmatrix
** without conflicts too, and each copy lands on whole 128-byte lines of shared memory (rows
** padded by 16 bytes cost bulk copies 7 % of their bandwidth, cp.async's copies half as many L2
** requests again: bench/RESULTS.md). RING_K_AT(r, c) and RING_V_AT(r, c) are the offsets of
** element (r, c) (c a multiple of 8) in a ring slot's K and V tiles, RING_K_PITCH and
** RING_V_PITCH the elements from a row to the next; TILE_K_AT, ... the same of the tile the
** products read (Conv's with an FP8 cache, else the ring slot's). */
#define KROW ${(swizzle or fp8_kv) and "DP" or "QS"} /* a row's elements (in all panels) */
% if v_in_k then
#define VROW KROW
#define SLOT_V 0               /* where V starts in a ring slot */
#define RING_SLOT (BN * KROW)
% else
#define VROW ${(swizzle or fp8_kv) and "DVP" or "VS"}
#define SLOT_V (BN * KROW)
#define RING_SLOT (BN * (KROW + VROW))
% end
% if fp8_kv then
/* The tile the products read: Conv's K rows, then its V rows, padded (in elem_t). */
#define TILE_KROW QS
#define TILE_VROW VS
#define TILE_V (BN * QS)
#define RING_BYTES (STAGES * RING_SLOT * (int)sizeof(kv_t) + 2 * BN * (QS + VS))
% else
/* The tile the products read: the ring slot's. */
#define TILE_KROW KROW
#define TILE_VROW VROW
#define TILE_V SLOT_V
#define RING_BYTES (STAGES * RING_SLOT * 2)
% end
% if swizzle then
#define RING_K_PITCH 64
#define RING_V_PITCH 64
#define RING_K_AT(r, c) panel_at<BN>(r, c)
#define RING_V_AT(r, c) panel_at<BN>(r, c)
#define RING_AT ((2 * BM * QS + 1023) / 1024 * 1024) /* the ring's first byte */
% else
#define RING_K_PITCH KROW
#define RING_V_PITCH VROW
/* (unparenthesised, so that `p + RING_K_AT(r, a + b)` is the plain sum p + r * KROW + a + b:
** grouped, ptxas gets other address arithmetic than the kernels were timed with) */
#define RING_K_AT(r, c) (r) * KROW + c
#define RING_V_AT(r, c) (r) * VROW + c
#define RING_AT (2 * BM * QS)
% end
% if fp8_kv then
#define TILE_K_PITCH TILE_KROW
#define TILE_V_PITCH TILE_VROW
#define TILE_K_AT(r, c) (r) * TILE_KROW + c /* (unparenthesised: as RING_K_AT) */
#define TILE_V_AT(r, c) (r) * TILE_VROW + c
% else
#define TILE_K_PITCH RING_K_PITCH
#define TILE_V_PITCH RING_V_PITCH
#define TILE_K_AT(r, c) RING_K_AT(r, c)
#define TILE_V_AT(r, c) RING_V_AT(r, c)
% end
#define WALK_BYTES (RING_AT + RING_BYTES)
% if split_dv then
typedef struct Xch {
    float s[WARPS][16][BN + 8]; /* each warp's part of the tile's S (rows 32 bytes apart in banks) */
} Xch;
#define SHARED_END (WALK_BYTES + (int)sizeof(Xch))
% else
typedef struct Comb {
    float m[WARPS][16]; /* row maxima, log2 units */
    float l[WARPS][16]; /* row sums of exp2(score - m) */
    float o[WARPS][16][DVP];
} Comb;
#define SHARED_END (WALK_BYTES > (int)sizeof(Comb) ? WALK_BYTES : (int)sizeof(Comb))
% end
% if bulk then
#define BARS_AT SHARED_END /* the ring slots' mbarriers */
% end
static_assert(WALK_BYTES % 16 == 0 && SHARED_END % 8 == 0 &&
                  SHARED_END + ${bulk and "8 * STAGES" or "0"}${swizzle and " + 1023" or ""} ==
                      ${shared_bytes},
              "the host's fj__variant_shared_bytes");

% decode_key_row()
% -- Who copies K and V into the ring (load_tile_kv below): `loader`, the host's choice
% -- (fj__variant_decode_loader): the bulk-copy engine a row a copy ("bulk") or a swizzled
% -- panel a copy ("tensor"); else cp.async by threads, each the same column of rows
% -- ("columns"), a warp a whole wide row ("wide_rows"), or any piece any thread ("pieces").
% local ck = head_dim_pad // (fp8_kv and 16 or 8)
% assert((loader ~= "bulk" and not tensor) or bulk,
%        "attn_decode_mma: bulk copies are the bulk variant's")
% -- (the kernel's side of fj__decode_swizzle_fits: what the panels' arithmetic relies on)
% assert(not swizzle or ((tensor or (loader == "columns" and (threads // ck) % 8 == 0)) and
%                        q_in_regs and not split_dv and not v_in_k and head_dim_pad % 64 == 0 and
%                        head_dim_v_pad % 64 == 0),
%        "attn_decode_mma: swizzle takes tensor maps' copies or cp.async columns of whole " ..
%        "64-column panels (head dims 64, 128), Q in registers")
% assert(not (tensor and paged) or (page_rows >= 8 and page_rows % 8 == 0 and tile_n % page_rows == 0),
%        "attn_decode_mma: the tensor loader's paged copies are whole swizzle periods dividing a tile")
% if loader == "wide_rows" then

/* A warp's copy of one wide row (the wide-row loader below), the row at `off` in tensor t: lane
** `lane` copies 16-byte pieces lane, lane + 32, ... of the PAD padded columns to dst; zeros past
** `dims` and where the row is not `in` (past the split's end; the row then unread). */
template <int PAD>
__device__ __forceinline__ void copy_wide_row(elem_t *dst, const elem_t *t, I64 off, bool in,
                                              int dims, int lane)
{
#pragma unroll
    for (int x = 0; x < (PAD / 8 + 31) / 32; x++) {
        const int c = (lane + 32 * x) * 8;
        const bool ok = in && c < dims;
        if (c < PAD)
            cp_async16_stream(smem_addr(dst + c), ok ? t + off + c : t, ok ? 16 : 0);
    }
}
% end

extern "C" __global__ void __launch_bounds__(THREADS, ${math.max(ctas_per_sm, 1)})
fj_attn_decode(
% params_arg(args, tensor and "T" or "P")
)
{
% if tensor then
    const fj_decode_params &P = T.dec;
% end
% if swizzle then
    /* (from its first 1024-byte boundary, the swizzle's atoms: the host counts 1023 bytes of
    ** slack) */
    extern __shared__ __attribute__((aligned(1024))) unsigned char smem_raw[];
    unsigned char *smem = smem_raw + (1024u - smem_addr(smem_raw) % 1024u) % 1024u;
% else
    extern __shared__ __attribute__((aligned(128))) unsigned char smem[];
% end
% if partial and not merge_last then
    /* The merge of the splits may launch once every block has started: it waits for this
    ** grid's states itself (attn_merge.lua), so its launch overlaps the last blocks' work. */
    grid_launch_next();
% end
    elem_t *sQ = (elem_t *)smem;
    kv_t *ring = (kv_t *)${swizzle and "(smem + RING_AT)" or "(sQ + BM * QS)"};
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int g = lane / 4, t = lane % 4; /* row group and column pair of mma fragments */
    const int slab = warp / KWARPS, kw = warp % KWARPS;
% decode_block("BM")

    /* The packed rows' queries: row r of the tile is query head head_kv * qgroup + (g0 + r) /
    ** seqlen_q, position (g0 + r) % seqlen_q; zeros past the rows and the head dim. */
    for (int i = tid; i < BM * (DP / 8); i += THREADS) {
        const int r = i / (DP / 8), c = (i % (DP / 8)) * 8, pr = g0 + r;
        const bool ok = pr < rows && c < head_dim;
        const int head = head_kv * qgroup + (ok ? pr / seqlen_q : 0);
        const q_t *src = q + (I64)(ok ? pr % seqlen_q : 0) * q_ss + (I64)head * q_sh + c;
% if fp8_kv and q_dtype == "bf16" then
        /* (through registers, into f16: the products' type) */
        const uint4 x = ok ? *(const uint4 *)src : make_uint4(0u, 0u, 0u, 0u);
        const u32 w[4] = {x.x, x.y, x.z, x.w};
        u32 h[4];
#pragma unroll
        for (int j = 0; j < 4; j++)
            h[j] = pack2(__uint_as_float(w[j] << 16), __uint_as_float(w[j] & 0xffff0000u));
        *(uint4 *)(sQ + r * QS + c) = make_uint4(h[0], h[1], h[2], h[3]);
% else
        cp_async16(smem_addr(sQ + r * QS + c), ok ? src : q, ok ? 16 : 0);
% end
    }
    cp_async_commit();
% if bulk then

    /* The ring slots' barriers (a phase: one arrival, thread 0's announcing the tile's bytes,
    ** and those bytes), and zeros in the columns past the head dims, which no row copy writes
    ** (a tensor map's copies write zeros there). */
    const u32 bars = smem_addr(smem + BARS_AT);
    if (tid == 0) {
        for (int s = 0; s < STAGES; s++)
            mbar_init(bars + 8 * s, 1);
        mbar_init_fence();
    }
%   if not tensor then
    for (int i = tid; i < STAGES * BN; i += THREADS) {
        kv_t *row = ring + (i / BN) * RING_SLOT + (i % BN) * KROW;
        for (int c = head_dim; c < DP; c += EPP)
            *(uint4 *)(row + c) = make_uint4(0, 0, 0, 0);
%     if not v_in_k then
        row = ring + (i / BN) * RING_SLOT + SLOT_V + (i % BN) * VROW;
        for (int c = head_dim_v; c < DVP; c += EPP)
            *(uint4 *)(row + c) = make_uint4(0, 0, 0, 0);
%     end
    }
%   end
    __syncthreads();
% end

    /* load_tile_kv(slot, n0): keys [n0, n0 + BN) of K and V into ring slot `slot` (a paged
    ** cache's pages looked up before by pages_of(n0)). */
% if tensor then
    /* By tensor maps (sm_90): thread 0 copies the tile's 64-column panels of K, then V's, in
    ** the swizzle's layout; the slot's barrier completes when they have landed. Rows past the
    ** tensor's and columns past the head dims are the maps' zeros; rows past the sequence's
    ** keys (seqused_k, a last page's) may hold anything, and the warps zero their values before
    ** P V (zero_values below). Tiles start at multiples of BN (the plan's splits do, and a
    ** band's start is rounded down to one), so a paged tile is a part of one page, or
    ** BN / PAGE_ROWS whole pages (the host's page_rows, fj__page_rows: pages of whole 8-row
    ** periods of the swizzle, which TMA applies by shared-memory address), a copy a page and
    ** panel at row j * PAGE_ROWS of the panel. */
    constexpr u32 TILE_BYTES = (u32)(RING_SLOT * (int)sizeof(kv_t));
%   local page_copies = paged and page_rows < tile_n -- a tile as several pages
%   if page_copies then
    constexpr int PAGE_ROWS = ${page_rows}, PAGES = BN / PAGE_ROWS; /* copies a panel */
    /* thread 0's: the pages of the next tile's keys, looked up a tile ahead (past the
    ** sequence's keys its last page, whose table slot exists) */
    int next_page[PAGES];
    auto pages_of = [&](int n0) {
        if (tid == 0 && n0 <= hi) {
#pragma unroll
            for (int j = 0; j < PAGES; j++)
                next_page[j] =
                    PAGE_NUMBER(div_by(page_div, I_MIN(n0 + j * PAGE_ROWS, seqlen_k - 1)));
        }
    };
%   elseif paged then
    int next_page = 0; /* thread 0's: the page of the next tile's keys, looked up a tile ahead */
    auto pages_of = [&](int n0) {
        if (tid == 0 && n0 <= hi)
            next_page = PAGE_NUMBER(div_by(page_div, n0));
    };
%   end
    auto load_tile_kv = [&](int slot, int n0) {
        if (tid != 0)
            return;
        const u32 bar = bars + 8 * slot, dst = smem_addr(ring + slot * RING_SLOT);
        mbar_arrive_expect(bar, TILE_BYTES);
%   if page_copies then
#pragma unroll
        for (int j = 0; j < PAGES; j++)
            load_panels<DP>(dst + j * PAGE_ROWS * 128, &T.tm_k, bar, BN, 0, head_kv, next_page[j],
                            T.perm_k);
#pragma unroll
        for (int j = 0; j < PAGES; j++)
            load_panels<DVP>(dst + SLOT_V * (int)sizeof(kv_t) + j * PAGE_ROWS * 128, &T.tm_v, bar,
                             BN, 0, head_kv, next_page[j], T.perm_v);
%   else
%     if paged then
        const int page = next_page, row = mod_by(page_div, n0);
%     else
        const int page = batch, row = n0;
%     end
        load_panels<DP>(dst, &T.tm_k, bar, BN, row, head_kv, page, T.perm_k);
        load_panels<DVP>(dst + SLOT_V * (int)sizeof(kv_t), &T.tm_v, bar, BN, row, head_kv, page,
                         T.perm_v);
%   end
    };
% elseif loader == "bulk" then
    /* By the bulk-copy engine (sm_90), a row a copy (copy i of a tile: K's row i, or V's row
    ** i - BN), issued by thread i % THREADS; the slot's barrier completes when the tile's bytes
    ** have landed. Rows past hi are copies of row hi (finite, and masked: their P is 0);
    ** columns past the head dims are zeros from the start. */
#define COPIES (BN * ${v_in_k and 1 or 2})
#define CPT ((COPIES + THREADS - 1) / THREADS) /* copies a thread issues a tile */
    const u32 tile_bytes =
        (u32)(BN * (head_dim${v_in_k and "" or " + head_dim_v"}) * (int)sizeof(kv_t));
    const u64 policy = l2_evict_first(); /* read once */
%   if paged then
    /* The pages of the thread's rows of the next tile, and the rows in them, looked up a tile
    ** ahead (the table's latency off the copies' path). */
    int row_page[CPT], row_within[CPT];
    auto pages_of = [&](int n0) {
#pragma unroll
        for (int c = 0; c < CPT; c++) {
            /* (a split with no keys has hi -1: key 0 then, as div_by takes no negatives) */
            const int key = I_MAX(I_MIN(n0 + (tid + c * THREADS) % BN, hi), 0);
            const int i = div_by(page_div, key);
            row_page[c] = PAGE_NUMBER(i);
            row_within[c] = key - i * P.page_size;
        }
    };
%   end
    auto load_tile_kv = [&](int slot, int n0) {
        const u32 bar = bars + 8 * slot;
        if (tid == 0)
            mbar_arrive_expect(bar, tile_bytes);
#pragma unroll
        for (int c = 0; c < CPT; c++) {
            const int i = tid + c * THREADS, r = i % BN;
            if (COPIES % THREADS != 0 && i >= COPIES)
                break;
            const bool is_k = i < BN;
%   if paged then
            const I64 off = is_k ? (I64)row_page[c] * k_sb + (I64)row_within[c] * k_ss
                                 : (I64)row_page[c] * v_sb + (I64)row_within[c] * v_ss;
%   else
            const int key = I_MIN(n0 + r, hi);
            const I64 off = (I64)key * (is_k ? k_ss : v_ss);
%   end
            const kv_t *dst = ring + slot * RING_SLOT + (is_k ? r * KROW : SLOT_V + r * VROW);
            bulk_load_row(smem_addr(dst), is_k ? k + off : v + off,
                          (u32)((is_k ? head_dim : head_dim_v) * (int)sizeof(kv_t)), bar, policy);
        }
    };
% elseif loader == "columns" then
    /* By cp.async, here and below: zeros past hi and the head dims, a 16-byte piece at a time. */
    /* Each thread copies the same column of rows row0 + j * RSTEP (j < RPT) of every tile, in
    ** K and in V. */
#define CK (DP / EPP)
#define RSTEP (THREADS / CK)
#define RPT (BN / RSTEP)
    const int row0 = tid / CK, col = (tid % CK) * EPP;
%   if paged then
    /* The pages of the next tile's rows, and the rows in them, looked up a tile ahead (the
    ** table's latency off the copies' path) and once a row: a warp copies BN / 4 rows (row
    ** warp * RPW + a + j * RSTEP of thread row0 = warp * RPW + a), and lane a * RPT + j looks
    ** up that row; the threads copying it take its page by shuffles. */
#define RPW (32 / CK) /* rows a warp copies at a time */
    static_assert(32 % CK == 0 && BN / 4 <= 32, "attn_decode_mma: a lane's row of a warp's");
    int row_page = 0, row_within = 0;
    auto pages_of = [&](int n0) {
        const int key = n0 + warp * RPW + lane / RPT + (lane % RPT) * RSTEP;
        const int i = div_by(page_div, key);
        row_page = lane < BN / 4 && key <= hi ? PAGE_NUMBER(i) : 0;
        row_within = key - i * P.page_size;
    };
%   else
    /* Dense: the thread's next row of K and of V, moved on by an add a copy as the tiles are
    ** loaded (in order, each once), so no copy's address is multiplied out (that arithmetic
    ** was over half of the walk's instructions). A column past the head dim copies zeros from
    ** the tensor's start and never moves. */
    const bool k_col = col < head_dim;
    const u32 k_bytes = k_col ? 16 : 0;
    const I64 k_step = k_col ? (I64)RSTEP * k_ss * (I64)sizeof(kv_t) : 0;
    const kv_t *k_next = k_col ? k + (I64)(lo + row0) * k_ss + col : k;
%     if not v_in_k then
    const bool v_col = col < head_dim_v;
    const u32 v_bytes = v_col ? 16 : 0;
    const I64 v_step = v_col ? (I64)RSTEP * v_ss * (I64)sizeof(kv_t) : 0;
    const kv_t *v_next = v_col ? v + (I64)(lo + row0) * v_ss + col : v;
%     end
%   end
    auto load_tile_kv = [&](int slot, int n0) {
        /* (the thread's rows are row0 + j * RSTEP: one row % 8, so one swizzled column) */
        kv_t *sK = ring + slot * RING_SLOT + RING_K_AT(row0, col);
%   if not v_in_k then
        kv_t *sV = ring + slot * RING_SLOT + SLOT_V + RING_V_AT(row0, col);
%   end
%   if not paged then
        /* The thread's rows j * RSTEP <= left are in the split: all but in the last tile. Shared
        ** addresses from the slot's by constant offsets. */
        const u32 dK = smem_addr(sK)${v_in_k and "" or ", dV = smem_addr(sV)"};
        constexpr int K_GAP = RSTEP * RING_K_PITCH * (int)sizeof(kv_t); /* bytes between the rows */
        constexpr int V_GAP = RSTEP * RING_V_PITCH * (int)sizeof(kv_t);
        const int left = hi - n0 - row0;
        if (left >= (RPT - 1) * RSTEP) {
#pragma unroll
            for (int j = 0; j < RPT; j++) {
                cp_async16_stream(dK + j * K_GAP, k_next, k_bytes);
                advance_bytes(k_next, k_step);
%     if not v_in_k then
                cp_async16_stream(dV + j * V_GAP, v_next, v_bytes);
                advance_bytes(v_next, v_step);
%     end
            }
        } else {
#pragma unroll
            for (int j = 0; j < RPT; j++) {
                const bool in = j * RSTEP <= left;
                cp_async16_stream(dK + j * K_GAP, in ? k_next : k, in ? k_bytes : 0);
                advance_bytes(k_next, k_step);
%     if not v_in_k then
                cp_async16_stream(dV + j * V_GAP, in ? v_next : v, in ? v_bytes : 0);
                advance_bytes(v_next, v_step);
%     end
            }
        }
%   else
#pragma unroll
        for (int j = 0; j < RPT; j++) {
            const int key = n0 + row0 + j * RSTEP;
            const bool kok = key <= hi && col < head_dim, vok = key <= hi && col < head_dim_v;
            const int by = (row0 - warp * RPW) * RPT + j; /* the lane that looked the row up */
            const int pg = __shfl_sync(0xffffffffu, row_page, by), pin = __shfl_sync(0xffffffffu, row_within, by);
            const I64 ko = (I64)pg * k_sb + (I64)pin * k_ss, vo = (I64)pg * v_sb + (I64)pin * v_ss;
            cp_async16_stream(smem_addr(sK + j * RSTEP * RING_K_PITCH), kok ? k + ko + col : k,
                              kok ? 16 : 0);
%     if not v_in_k then
            cp_async16_stream(smem_addr(sV + j * RSTEP * RING_V_PITCH), vok ? v + vo + col : v,
                              vok ? 16 : 0);
%     else
            (void)vok;
            (void)vo;
%     end
        }
%   end
    };
% elseif loader == "wide_rows" then
    /* Wide rows (256 head dims and more): a warp copies whole rows, every WARPS-th of a tile (its
    ** row j is row warp + WARPS * j), its lanes the 16-byte pieces of each. */
#define RPW (BN / WARPS) /* rows a warp copies a tile */
    static_assert(RPW <= 32, "attn_decode_mma: a lane for each row a warp copies");
%   if paged then
    /* Paged: lane j looks the warp's row j of the next tile up, a tile ahead (the table's
    ** latency off the copies' path); the copying lanes take its page by shuffles. */
    int row_page = 0, row_within = 0;
    auto pages_of = [&](int n0) {
        const int key = n0 + warp + lane * WARPS, i = div_by(page_div, key);
        row_page = lane < RPW && key <= hi ? PAGE_NUMBER(i) : 0;
        row_within = key - i * P.page_size;
    };
%   end
    auto load_tile_kv = [&](int slot, int n0) {
        elem_t *sK = ring + slot * RING_SLOT;
#pragma unroll
        for (int j = 0; j < RPW; j++) {
            const int r = warp + j * WARPS, key = n0 + r;
            const bool in = key <= hi;
%   if paged then
            const int pg = __shfl_sync(0xffffffffu, row_page, j), pin = __shfl_sync(0xffffffffu, row_within, j);
            const I64 ko = (I64)pg * k_sb + (I64)pin * k_ss;
%   else
            const I64 ko = (I64)key * k_ss;
%   end
            copy_wide_row<DP>(sK + r * KROW, k, ko, in, head_dim, lane);
%   if not v_in_k then
%     if paged then
            const I64 vo = (I64)pg * v_sb + (I64)pin * v_ss;
%     else
            const I64 vo = (I64)key * v_ss;
%     end
            copy_wide_row<DVP>(sK + SLOT_V + r * VROW, v, vo, in, head_dim_v, lane);
%   end
        }
    };
% else
%   if paged then
    auto pages_of = [&](int) {}; /* each piece looks its page up */
%   end
    auto load_tile_kv = [&](int slot, int n0) {
        kv_t *sK = ring + slot * RING_SLOT;
#pragma unroll 1
        for (int i = tid; i < BN * (DP / EPP); i += THREADS) {
            const int r = i / (DP / EPP), c = (i % (DP / EPP)) * EPP, key = n0 + r;
            const bool ok = key <= hi && c < head_dim;
            cp_async16_stream(smem_addr(sK + r * KROW + c),
                              ok ? k + key_row(key, k_sb, k_ss) + c : k, ok ? 16 : 0);
        }
%   if not v_in_k then
        kv_t *sV = sK + SLOT_V;
#pragma unroll 1
        for (int i = tid; i < BN * (DVP / EPP); i += THREADS) {
            const int r = i / (DVP / EPP), c = (i % (DVP / EPP)) * EPP, key = n0 + r;
            const bool ok = key <= hi && c < head_dim_v;
            cp_async16_stream(smem_addr(sV + r * VROW + c),
                              ok ? v + key_row(key, v_sb, v_ss) + c : v, ok ? 16 : 0);
        }
%   end
    };
% end

% if local_mask then
    /* The query positions of the thread's two rows of its slab (rows g and g + 8), which the
    ** band is relative to. */
    int qpos[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int pr = g0 + slab * 16 + g + 8 * h;
        qpos[h] = pr < rows ? pr % seqlen_q : 0;
    }
% end

    float o[OT][4], row_max[2] = {NEG_INF, NEG_INF}, row_sum[2] = {0.0f, 0.0f};
    zero_acc<CPW>(o);

% if tensor and local_mask then
    lo = lo / BN * BN; /* tiles at multiples of BN (keys before the band are masked) */
% end
    const int ntiles = hi >= lo ? (hi - lo) / BN + 1 : 0;
% if paged then
    pages_of(lo);
% end
#pragma unroll 1
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < ntiles) {
            load_tile_kv(s, lo + s * BN);
% if paged then
            pages_of(lo + (s + 1) * BN);
% end
        }
% if bulk then
    }
    cp_async_wait_all(); /* Q */
    __syncthreads();
% else
        cp_async_commit(); /* empty groups too: the wait below counts STAGES - 1 a tile */
    }
% end
% if fp8_kv then

    /* An FP8 tile into Conv: the key rows [kw * KPW, (kw + 1) * KPW) of ring slot `raw` that
    ** this warp's products read, converted by the SLABS warps that read them, lane li of them
    ** taking 8-element pieces li, li + 32 * SLABS, ... (a warp reads whole rows, 8 bytes a lane,
    ** and writes whole 16-byte pieces: no bank conflicts). Not unrolled: unrolled (fully or by
    ** two), it spilled under NVRTC at d 64 and 256. */
    elem_t *conv = (elem_t *)(ring + STAGES * RING_SLOT);
    auto convert_keys = [&](const kv_t *raw) {
        constexpr int KP = KPW * (DP / 8), VP = KPW * (DVP / 8), STEP = 32 * SLABS;
        const int li = slab * 32 + lane, r0 = kw * KPW;
#pragma unroll 1
        for (int j = 0; j < (KP + STEP - 1) / STEP; j++) {
            const int i = li + j * STEP, r = r0 + i / (DP / 8), c = (i % (DP / 8)) * 8;
            if (KP % STEP == 0 || i < KP)
                *(uint4 *)(conv + r * TILE_KROW + c) =
                    fp8x8_to_f16x8(*(const uint2 *)(raw + r * KROW + c));
        }
#pragma unroll 1
        for (int j = 0; j < (VP + STEP - 1) / STEP; j++) {
            const int i = li + j * STEP, r = r0 + i / (DVP / 8), c = (i % (DVP / 8)) * 8;
            if (VP % STEP == 0 || i < VP)
                *(uint4 *)(conv + TILE_V + r * TILE_VROW + c) =
                    fp8x8_to_f16x8(*(const uint2 *)(raw + SLOT_V + r * VROW + c));
        }
    };
% descale_factors("P.fwd")
    /* The cache's factors (and KV_UNIT) on the scores and on the output. */
    const float qk_mul = score_mul * qk_factor * KV_UNIT, out_mul = v_factor * KV_UNIT;
% end
% local q_frags = q_in_regs or split_dv
% if q_frags then
    /* The query fragments of the warp's slab (split_dv: of its head dims, from dim Q0) */
    const int Q0 = ${split_dv and "kw * KTW * 16" or "0"};
    u32 qf[KTW][4];
%   if not bulk then
    asm volatile("cp.async.wait_group ${stages - 1};" ::: "memory");
    __syncthreads();
%   end
#pragma unroll
    for (int kk = 0; kk < KTW; kk++)
        ldmatrix_x4(smem_addr(sQ + (slab * 16 + lane % 16) * QS + Q0 + kk * 16 + (lane / 16) * 8),
                    qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3]);
% end

#pragma unroll 1
    for (int tile = 0; tile < ntiles; tile++) {
        /* This tile (and Q) landed; every warp is done with the slot the next load takes. */
% if bulk then
        mbar_wait(bars + 8 * (tile % STAGES), (tile / STAGES) & 1);
% else
        asm volatile("cp.async.wait_group ${stages - 2};" ::: "memory");
% end
        __syncthreads();
        if (tile + STAGES - 1 < ntiles) {
            load_tile_kv((tile + STAGES - 1) % STAGES, lo + (tile + STAGES - 1) * BN);
% if paged then
            pages_of(lo + (tile + STAGES) * BN);
% end
        }
% if not bulk then
        cp_async_commit();
% end

% if fp8_kv then
        convert_keys(ring + (tile % STAGES) * RING_SLOT);
        bar_sync(1 + kw, 32 * SLABS); /* the warps of these keys: Conv's rows written */
        const elem_t *slot = conv;
% else
        const elem_t *slot = ring + (tile % STAGES) * RING_SLOT;
% end
% if split_dv then
        /* S: every key of the tile over the warp's head dims; P V: the warp's columns of V */
        const elem_t *sK = slot + Q0;
        const elem_t *sV = slot + TILE_V + kw * CPW;
% else
        const elem_t *sK = slot + kw * KPW * TILE_K_PITCH; /* (KPW: whole swizzle periods) */
        const elem_t *sV = slot + TILE_V + kw * KPW * TILE_V_PITCH;
% end
        const int n0 = lo + tile * BN + ${split_dv and "0" or "kw * KPW"}; /* the warp's first key */

        /* S = Q K^T over the warp's keys, then in log2 units (soft-capped). */
        float s[NT][4];
        zero_acc<KPW>(s);
% if q_frags then
#pragma unroll
        for (int kk = 0; kk < KTW; kk++)
#pragma unroll
            for (int np = 0; np < NT / 2; np++) {
                u32 b0, b1, b2, b3;
                ldmatrix_x4(smem_addr(sK + TILE_K_AT(np * 16 + (lane / 16) * 8 + lane % 8,
                                                     kk * 16 + ((lane / 8) % 2) * 8)),
                            b0, b1, b2, b3);
                mma16816(s[2 * np], qf[kk], b0, b1);
                mma16816(s[2 * np + 1], qf[kk], b2, b3);
            }
% else
        mma_rows_by_rows<KPW, KT, QS, TILE_KROW>(s, sQ + slab * 16 * QS, sK, lane);
% end
% if split_dv then
        /* The warps' parts of S added up, in the same order in every warp. */
        Xch &xc = *(Xch *)(smem + WALK_BYTES);
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int h = 0; h < 2; h++)
                *(float2 *)&xc.s[warp][g + 8 * h][8 * j + 2 * t] = make_float2(s[j][2 * h], s[j][2 * h + 1]);
        __syncthreads(); /* every warp's part (each reads them before the next tile's barrier) */
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                float2 sum = *(const float2 *)&xc.s[0][g + 8 * h][8 * j + 2 * t];
#pragma unroll
                for (int w = 1; w < WARPS; w++) {
                    const float2 part = *(const float2 *)&xc.s[w][g + 8 * h][8 * j + 2 * t];
                    sum.x += part.x;
                    sum.y += part.y;
                }
                s[j][2 * h] = sum.x;
                s[j][2 * h + 1] = sum.y;
            }
% end
% local qk_mul = fp8_kv and "qk_mul" or "score_mul"
#pragma unroll
        for (int j = 0; j < NT; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
% if softcap then
                s[j][e] = cap_mul * tanhf(s[j][e] * ${qk_mul});
% else
                s[j][e] *= ${qk_mul};
% end
        /* Keys past the split (the last tile's), and (causal, windows) outside the row's band. */
% if not local_mask then
        if (n0 + KPW - 1 > hi)
% end
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int key = n0 + 8 * j + 2 * t + (e % 2);
                    const bool seen = ${decode_seen("key", "qpos[e / 2]")};
                    if (!seen)
                        s[j][e] = NEG_INF;
                }

        /* Online softmax of the thread's two rows (a quad holds a row's columns). */
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float mx = row_max[h];
#pragma unroll
            for (int j = 0; j < NT; j++)
                mx = fmaxf(mx, fmaxf(s[j][2 * h], s[j][2 * h + 1]));
            mx = quad_max(mx);
            /* A row with no key yet keeps max -inf; subtracting 0 then gives exp2(-inf) = 0. */
            const float base = mx == NEG_INF ? 0.0f : mx;
            const float alpha = ex2(row_max[h] - base);
            row_max[h] = mx;
            float sum = 0.0f;
#pragma unroll
            for (int j = 0; j < NT; j++)
#pragma unroll
                for (int e = 2 * h; e < 2 * h + 2; e++) {
                    s[j][e] = ex2(s[j][e] - base);
                    sum += s[j][e];
                }
            row_sum[h] = row_sum[h] * alpha + sum; /* the quad's sum is taken at the end */
            /* (skipping this where no row of the warp's has a new maximum was 1-4 % slower) */
#pragma unroll
            for (int j = 0; j < OT; j++) {
                o[j][2 * h] *= alpha;
                o[j][2 * h + 1] *= alpha;
            }
        }

% if tensor then
        /* The warp's rows past the sequence's keys (a last page's): their P is 0, but a tensor
        ** map copied them whatever they hold, and 0 times NaN is not 0, so they are zeroed. */
        if (n0 + KPW > seqlen_k) {
            for (int i = lane; i < KPW * (DVP / 8); i += 32) {
                const int r = i / (DVP / 8), c = (i % (DVP / 8)) * 8;
                if (n0 + r >= seqlen_k)
                    *(uint4 *)(sV + TILE_V_AT(r, c)) = make_uint4(0u, 0u, 0u, 0u);
            }
            __syncwarp();
        }
% end
        /* O += P V over the warp's keys, P as 16-bit A fragments. */
        u32 p[PT][4];
        pack_rows<PT>(p, s);
        mma_regs_by_rows<CPW, PT, TILE_VROW${swizzle and ", BN" or ""}>(o, p, sV, lane);
    }

    /* The state of a slab's warps combined, normalised, and stored (or, with `partial`, the
    ** split's state into the workspace). Natural-log log-sum-exp; a row that saw no key gets 0
    ** and -inf. */
    auto store_row = [&](int r, int c, float val, float m_log2, float sum) {
        const int pr = g0 + r;
% decode_head_row("pr")
% decode_store_out("val")
        if (c == 0) {
            const float x = sum > 0.0f ? (m_log2 + lg2(sum)) * F_LN2 : NEG_INF;
            (void)x; /* not stored without lse */
% decode_store_lse("x")
        }
    };
    row_sum[0] = quad_sum(row_sum[0]);
    row_sum[1] = quad_sum(row_sum[1]);
% if split_dv or kwarps == 1 then
    /* Each warp holds whole rows' states (split_dv: every warp the same) and stores its columns. */
#pragma unroll
    for (int h = 0; h < 2; h++) {
        if (g0 + slab * 16 + g + 8 * h >= rows)
            continue;
        const float inv = row_sum[h] > 0.0f ? ${fp8_kv and "out_mul" or "1.0f"} / row_sum[h] : 0.0f;
#pragma unroll
        for (int j = 0; j < OT; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int c = ${split_dv and "kw * CPW + " or ""}8 * j + 2 * t + e;
                if (c < head_dim_v)
                    store_row(slab * 16 + g + 8 * h, c, o[j][2 * h + e] * inv, row_max[h], row_sum[h]);
            }
    }
% else
    cp_async_wait_all();
    __syncthreads(); /* every warp is done with the ring, which now holds Comb */
    Comb &cb = *(Comb *)smem;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        if (t == 0) {
            cb.m[warp][g + 8 * h] = row_max[h];
            cb.l[warp][g + 8 * h] = row_sum[h];
        }
#pragma unroll
        for (int j = 0; j < OT; j++) {
            cb.o[warp][g + 8 * h][8 * j + 2 * t] = o[j][2 * h];
            cb.o[warp][g + 8 * h][8 * j + 2 * t + 1] = o[j][2 * h + 1];
        }
    }
    __syncthreads();
    for (int i = tid; i < BM * DVP; i += THREADS) {
        const int r = i / DVP, c = i % DVP, w0 = (r / 16) * KWARPS, rr = r % 16;
        if (g0 + r >= rows || c >= head_dim_v)
            continue;
        float mx = NEG_INF;
#pragma unroll
        for (int w = 0; w < KWARPS; w++)
            mx = fmaxf(mx, cb.m[w0 + w][rr]);
        float sum = 0.0f, acc = 0.0f;
        if (mx > NEG_INF)
#pragma unroll
            for (int w = 0; w < KWARPS; w++) {
                const float wt = ex2(cb.m[w0 + w][rr] - mx); /* 0 for a warp that saw nothing */
                sum = fmaf(wt, cb.l[w0 + w][rr], sum);
                acc = fmaf(wt, cb.o[w0 + w][rr][c], acc);
            }
        const float val = sum > 0.0f ? ${fp8_kv and "acc * out_mul / sum" or "acc / sum"} : 0.0f;
        store_row(r, c, val, mx, sum);
    }
% end
% if merge_last then
%   assert(shared_bytes >= 4 * decode_merge_scratch_floats(tile_m),
%          "attn_decode_mma: the merge's scratch fits the ring")
    cp_async_wait_all(); /* (the ring's bytes hold the merge's scratch, once all arrived) */
% decode_merge_last("BM", "DVP", "THREADS", "(float *)smem")
% end
}
