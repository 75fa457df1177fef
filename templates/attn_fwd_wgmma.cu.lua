% -- Forward attention for Hopper (sm_90a): warp-specialised, TMA-fed, wgmma.
% --
% -- A work tile is tile_m = 64 * NC query rows of one (batch, head); a block runs one or more
% -- of them (see persistent) with 1 + NC warpgroups:
% --   producer   (warpgroup 0; one thread) copies the tile's Q (once the consumers are done with
% --              the last one), then key and value tiles into a ring of `stages` shared-memory
% --              slots with bulk tensor copies (TMA), each slot guarded by a full and an empty
% --              mbarrier; it gives its registers to the consumers.
% --   consumers  (warpgroups 1..NC; 64 query rows each) per key tile:
% --                S = Q K^T    wgmma, both operands from shared memory, f32 in registers
% --                online softmax on S in registers (exp2, quad shuffles), rescaling O
% --                O += P V     wgmma with P from registers (S's accumulator layout is the
% --                             A-operand layout) and V from shared memory, transposed
% --              and release the slots to the producer.
% -- The consumer warpgroups run the same loop out of step, so one's softmax overlaps the
% -- other's matrix products. Shared memory uses the 128-byte swizzle in 64-column panels (the
% -- layout TMA writes and wgmma reads), so head dims are padded to multiples of 64; columns and
% -- rows past the tensor's end arrive as zeros. Key tiles run from last to first, so only the
% -- first ones need per-element masking; tiles outside the causal/window band are never loaded.
% --
% -- FP8 (q, k and v in f8e4m3 or f8e5m2, out 16-bit): the products take k = 32 and both operands
% -- K-major, so V must reach P V as value columns x keys. TMA brings each value tile into a
% -- staging buffer as it comes (keys x columns), and warps 1-3 of the producer's warpgroup
% -- write it out transposed into the ring slot (transpose_values), keys in the order in which
% -- P's registers hold them (pack_p), so that P needs no shuffles; or (v_transposed: dense
% -- requests) a plan step has written v transposed in that order (fp8_transpose_v.cu.lua) and
% -- TMA brings its tiles straight into the ring. q's and k's descale factors scale the scores,
% -- v's the output. Beyond one 128-column panel of q and k, the second
% -- panel's part of S is summed apart and added in f32 (issue_qk).
% --
% -- The kernel is a wiring of parts, each readable alone: the shared-memory layout (Smem), the
% -- pipeline ring and its barriers (Bar, Ring), the tile scheduler (Scheduler), the producer
% -- (produce), the key tiles a work tile visits (KeyWalk), the softmax of one tile with its
% -- masks (softmax_tile), the main loop (mainloop) and the epilogue (store_tile).
% --
% -- Parameters: q_dtype, kv_dtype, out_dtype (one of bf16, f16 for all three; or q and kv one
% -- FP8 type and out bf16 or f16), descale (FP8: descale factors given), v_transposed (FP8,
% -- dense: v comes transposed from the plan's step, tm_v its map), head_dim_pad,
% -- head_dim_v_pad (multiples of 64; with FP8 head_dim_pad 128 or 256), dv_slices (the value
% -- columns split into slices of head_dim_v_pad / dv_slices, at most 256: O's accumulators;
% -- each slice is a work tile of its own, which recomputes S, and the slices of a query block run next to each other so that
% -- they share its key and value tiles through L2), d_split (with 2 slices, 64-row tiles and no
% -- persistent grid: the slices of a work tile are the two blocks of a cluster, each holding half
% -- of Q's and K's columns; each computes S over its half and adds the other's through
% -- distributed shared memory (Exchange), so S is computed once), v_in_k (with d_split: v is a
% -- view of k's first dims, so each block takes the panels of its value columns first among its
% -- Q and K panels and reads its V tile from its K tile: no value loads), tile_m (64, 128 or 192), tile_n (multiple of
% -- 16), warps (4 * (1 + NC)), stages, local_mask, softcap, neg_scale, write_lse, overlap
% -- (software-pipeline softmax against P V), pingpong (with two consumer warpgroups and overlap:
% -- they take turns issuing their products), q_stages (1 or 2 Q buffers: with two, the next work
% -- tile's Q is copied while this one runs), ctas_per_sm (1, or 2 blocks of one consumer
% -- warpgroup sharing an SM: one's prologue and epilogue run under the other's products),
% -- exp_poly (0..8: of every 8 column blocks of scores, how many take exp2 from a polynomial on
% -- the FMA pipe rather than the MUFU unit, which at d 64 is as busy as the tensor cores),
% -- lazy_rescale (the softmax's exponent base moves only when a row's maximum outgrows it by
% -- 2^8, so O is rarely rescaled).
% -- paged (a paged KV cache: k and v are pages [num_pages, page_size, hkv, d], their tensor
% -- maps' batches the pages, found through the table of P's FJ__PAGE_FIELDS; each sequence's keys
% -- are seqused_k of them; q dense or packed) with page_rows (the rows of one bulk copy: a key
% -- tile is tile_n / page_rows copies of page_rows rows each, from the pages of its keys).
% -- persistent: 0 one block per work tile (BM query rows of a batch and head); 1 one block per
% -- SM, each taking every gridDim.x-th tile; 2 one block per SM, tiles after the first taken
% -- from a counter shared by the grid (tile_counter: one int, zeroed by the plan before the
% -- launch), which balances tiles of unequal cost (causal); 3 one block per SM, round r of tiles
% -- [r * gridDim.x, (r + 1) * gridDim.x) dealt forwards when r is even and backwards when odd,
% -- so that heavy and light causal tiles pair up without any shared state.
% -- mask_mod, score_mod, alibi, bias, mask_tensor, mask_ranges: see attn_masks.lua. Element
% -- masks need block classes: 128 x 128 blocks of (query, key) classed 0 (nothing kept: the
% -- key tile is never loaded), 1 (the element masks apply), 2 (all kept), read through the
% -- block_mask arguments, either the caller's (block_mask) or the classifier's
% -- (attn_classify.lua, a step of the plan before this kernel). class_vote: the tiles of class
% -- 0 are passed over many at a time (the consumers' warps 32 by a vote, the producer's thread
% -- 4 by independent loads) rather than one dependent load each (KeyWalk, live_tile_from).
% -- Derived on the host, so that both sides compute them once: shared_bytes (the dynamic
% -- shared memory of a launch), consumer_regs (registers per consumer thread after the
% -- producer's are given away), producer_regs (those the producer's warpgroup keeps), v_stages
% -- (FP8: the value tiles' staging buffers), score_parts (FP8 at head_dim_pad 256: the parts
% -- of the key tile in which S's second panel is summed apart, see issue_qk; else 0),
% -- batch_fastest and heavy_first (the order of the work tiles,
% -- which the host's zigzag grid model simulates).
% local element_masks = mask_mod ~= "" or mask_tensor or mask_ranges > 0
% local score_terms = alibi or bias ~= "" or score_mod ~= ""
% local dtype = q_dtype -- one element type for q, k, v and out (cuda_mma.lua checks), or FP8 in
% local fp8 = dtype == "f8e4m3" or dtype == "f8e5m2"
% assert(not fp8 or (not d_split and not v_in_k and dv_slices == 1 and persistent ~= 2 and tile_n % 128 == 0 and head_dim_pad % 128 == 0 and head_dim_pad <= 256), "FP8 takes one value slice, key tiles of 128-key panels, one or two 128-column panels of q and k and a static schedule")
% assert(score_parts == 0 or (fp8 and head_dim_pad == 256 and tile_n % score_parts == 0 and
%        (tile_n // score_parts) % 8 == 0), "S's second panel apart: FP8 beyond one panel, parts of whole n8 blocks")
% assert(not fp8 or head_dim_pad == 128 or score_parts > 0, "FP8 beyond one panel sums S by panels")
% assert(not v_transposed or (fp8 and varlen == 0 and not paged),
%        "v transposed by a step: FP8, dense")
% -- bias_tma: bias tiles (BM x BN) come with the key tiles, by TMA into shared memory, in
% -- 128-byte panels of keys with the 128-byte swizzle.
% local bias_es = bias == "f32" and 4 or 2
% assert(not bias_tma or (bias ~= "" and tile_n % (128 // bias_es) == 0), "bias tiles need tile_n a multiple of 128 bytes of keys")
% local classes = block_mask or element_masks
% assert(not classes or (128 % tile_m == 0 and 128 % tile_n == 0), "block classes need tiles that divide 128")
% assert(not class_vote or classes, "class_vote walks block classes")
% assert(varlen == 0 or not classes, "variable lengths with element masks run on the SIMT kernel")
% -- (page_rows: whole copies a tile, whole 8-row periods of the 128-byte swizzle a copy)
% assert(not paged or (not fp8 and not d_split and not classes and not bias_tma and
%        page_rows >= 8 and page_rows % 8 == 0 and tile_n % page_rows == 0),
%        "paged: 16-bit data, one block a work tile's columns, no block classes or bias " ..
%        "tiles, copies of whole swizzle periods that divide tile_n")
% local NC = tile_m // 64
% assert(NC >= 1 and NC <= 3 and NC * 64 == tile_m, "tile_m must be 64, 128 or 192")
% assert(warps == 4 * (NC + 1), "warps must be 4 * (1 + tile_m / 64)")
% local slice_dv = head_dim_v_pad // dv_slices
% assert(head_dim_pad % 64 == 0 and slice_dv % 64 == 0 and slice_dv * dv_slices == head_dim_v_pad and slice_dv <= 256, "head dims must be padded to multiples of 64, dv to slices of at most 256")
% assert(not d_split or (dv_slices == 2 and NC == 1 and persistent == 0 and head_dim_pad % 128 == 0), "d_split takes two value slices, one consumer warpgroup, a block per work tile and halves of whole panels")
% assert(not v_in_k or (d_split and slice_dv <= head_dim_pad // 2), "v_in_k needs d_split and a value slice inside each block's K columns")
% assert(tile_n % 16 == 0 and tile_n <= 256, "tile_n must be a multiple of 16, at most 256")
% assert(stages >= 1 and stages <= 4, "stages must be 1..4")
% assert(q_stages == 1 or q_stages == 2, "q_stages must be 1 or 2")
% assert(not pingpong or (NC == 2 and overlap), "pingpong needs two consumer warpgroups and overlap")
% assert(ctas_per_sm == 1 or (ctas_per_sm == 2 and NC == 1), "two blocks per SM take one consumer warpgroup each")
% assert(exp_poly >= 0 and exp_poly <= 8, "exp_poly must be 0..8")
% local fused = not softcap and not neg_scale and not score_terms
% include("cuda_mma.lua")
% include("cuda_hopper.lua")
% include("cuda_attn_common.lua")
% if element_masks or score_terms or descale or paged then
% include("dialect.lua")
% end
% if element_masks or score_terms then
% include("attn_masks.lua")
% end
% include("descale.lua")
% include("params.lua")
% include("sequence.lua")
% params_struct(args)
% local part_n = tile_n // math.max(score_parts, 1)
% hopper_wgmma(tile_n)
% if slice_dv ~= tile_n then hopper_wgmma(slice_dv) end
% if part_n ~= tile_n and part_n ~= slice_dv then hopper_wgmma(part_n) end

/* ---- the variant, as constants ------------------------------------------------------------ */
constexpr int BM = ${tile_m}, BN = ${tile_n};       /* query rows per work tile, keys per tile */
constexpr bool FP8 = ${fp8};                        /* q, k, v in FP8 (V transposed: see above) */
constexpr bool V_STAGED = FP8 && !${v_transposed}; /* ... here, from staging buffers */
constexpr int ES = FP8 ? 1 : 2;                     /* bytes of an element of q, k, v */
constexpr int PC = 128 / ES;                        /* columns of a 128-byte panel */
constexpr int KSTEP = 32 / ES;                      /* k of one product: 32 bytes of a row */
constexpr int P_REGS = 4 * (BN / KSTEP);            /* P's A fragments, words a thread */
/* S's second panel summed apart (issue_qk): in S_PARTS parts of PN keys; 0: one chain */
constexpr int S_PARTS = ${score_parts}, PN = BN / (S_PARTS > 0 ? S_PARTS : 1);
constexpr int D = ${head_dim_pad}; /* the head dim of q and k, padded to a panel (PC) */
constexpr bool D_SPLIT = ${d_split};
constexpr int DQ = D_SPLIT ? D / 2 : D; /* the columns of Q and K this block holds */
constexpr bool V_IN_K = ${v_in_k};      /* V's tile is the first DV columns of K's */
constexpr int DV = ${slice_dv}, DV_SLICES = ${dv_slices}; /* a work tile's value columns */
constexpr int NC = ${NC};                           /* consumer warpgroups of 64 rows */
constexpr int THREADS = ${warps * 32};
constexpr int STAGES = ${stages}, Q_STAGES = ${q_stages}; /* key/value ring slots, Q buffers */
constexpr int PERSISTENT = ${persistent};
constexpr int EXP_POLY = ${exp_poly};
constexpr int CONSUMER_REGS = ${consumer_regs};
constexpr int PRODUCER_REGS = ${producer_regs}; /* V_STAGED: warps 1-3 transpose value tiles */
constexpr bool LOCAL_MASK = ${local_mask};   /* a causal/window band */
constexpr bool CLASSES = ${classes};         /* 128 x 128 block classes skip and mask tiles */
constexpr bool CLASS_VOTE = ${class_vote};   /* class-0 tiles passed over many at a time */
constexpr bool HEAVY_FIRST = ${heavy_first}; /* query blocks from the last */
constexpr bool BATCH_FASTEST = ${batch_fastest};
constexpr bool VARLEN = ${varlen > 0};        /* packed sequences (paged: queries only) */
constexpr bool PAGED = ${paged};
constexpr int PAGE_ROWS = ${paged and page_rows or "BN"}; /* key rows a bulk copy */
constexpr bool OVERLAP = ${overlap}, PINGPONG = ${pingpong};
constexpr bool DYNAMIC = PERSISTENT == 2;
constexpr bool LAZY_RESCALE = ${lazy_rescale};
constexpr bool WRITE_LSE = ${write_lse};
constexpr bool DESCALE = ${descale};
constexpr bool BIAS_TMA = ${bias_tma};
/* The producer gives its registers away when there is a second consumer warpgroup to take them
** or a second block to leave them to. */
constexpr bool REALLOC = NC > 1 || ${ctas_per_sm} == 2;
% attn_score_macros(not fused)

/* ---- shared memory ------------------------------------------------------------------------- */
/* Bytes of one tile: PC-column panels of rows x 128 bytes. With V_IN_K a ring slot's value tile
** is the first DV / 64 panels of its key tile (VT_BYTES apart, the barriers VT_FULL / VT_EMPTY
** its key tile's: the slot goes back once P V has read it). With FP8 a ring slot's value tile
** is transposed: BN / 128 panels of DV rows (value columns) x 128 keys; where the kernel
** transposes (V_STAGED), V_STAGES staging buffers (VS) take the tiles as TMA brings them, in
** 128-column panels of BN keys, deep enough to hide the copies' latency from the transposing
** warps. */
constexpr int Q_BYTES = BM * DQ * ES, K_BYTES = BN * DQ * ES;
constexpr int V_BYTES = V_IN_K ? 0 : BN * DV * ES;
constexpr int V_STAGES = V_STAGED ? ${v_stages} : 1;
constexpr int VS_BYTES = V_STAGED ? BN * ((DV + PC - 1) / PC) * 128 : 0;
constexpr int X_BYTES = D_SPLIT ? BM * BN * 4 : 0; /* a buffer of the partner's partial scores */
constexpr int VT_BYTES = V_IN_K ? K_BYTES : V_BYTES;
constexpr int BIAS_BYTES = BIAS_TMA ? BM * BN * ${bias_es} : 0; /* a bias tile per ring slot */
constexpr int BIAS_PC = 128 / ${bias_es};                        /* keys per 128-byte panel */

/* The shared-memory barriers by kind: a kind of n takes n consecutive 8-byte words. */
enum Bar : int {
    Q_FULL = 0,                /* Q buffer k holds the work tile's Q (two, used or not) */
    Q_EMPTY = 2,               /* Q buffer k is free: one arrival per consumer warp */
    K_FULL = 4,                /* ring slot s holds a key (and bias) tile */
    K_EMPTY = K_FULL + STAGES, /* ring slot s's key tile is read: one arrival per consumer warp */
    V_FULL = K_EMPTY + STAGES,
    V_EMPTY = V_FULL + STAGES,
    TILE_FULL = V_EMPTY + STAGES, /* dynamic schedule: announcement slot k holds a tile */
    TILE_EMPTY = TILE_FULL + 2,   /* ... and has been read by every consumer warp */
    X_FULL = TILE_EMPTY + 2,      /* D_SPLIT: exchange buffer b holds the partner's scores */
    X_FREE = X_FULL + 2,          /* ... the partner has read what we left in its buffer b */
    VS_FULL = TILE_EMPTY + 2 + (D_SPLIT ? 4 : 0), /* V_STAGED: buffer b holds a value tile */
    VS_EMPTY = VS_FULL + V_STAGES,                /* ... and has been transposed */
    NUM_BARS = VS_FULL + (V_STAGED ? 2 * V_STAGES : 0)
};
constexpr Bar VT_FULL = V_IN_K ? K_FULL : V_FULL, VT_EMPTY = V_IN_K ? K_EMPTY : V_EMPTY;

/* Where everything lives: Q buffers, the key, value (and bias) ring, the two exchange buffers
** (D_SPLIT), the barriers and the two words of the tile announcements. The 128-byte swizzle
** repeats every 1024 bytes, so the base is aligned to that. */
struct Smem {
    u32 q, k, v, bias, x, vs, bars, slots;
    __device__ explicit Smem(u32 base)
        : q(base), k(q + Q_STAGES * Q_BYTES), v(k + STAGES * K_BYTES), bias(v + STAGES * V_BYTES),
          x(bias + STAGES * BIAS_BYTES), vs(x + 2 * X_BYTES), bars(vs + V_STAGES * VS_BYTES),
          slots(bars + 8 * NUM_BARS)
    {
    }
    static constexpr int BYTES = Q_STAGES * Q_BYTES + STAGES * (K_BYTES + V_BYTES + BIAS_BYTES) +
                                 2 * X_BYTES + V_STAGES * VS_BYTES + 8 * NUM_BARS + 8;
};
static_assert(Smem::BYTES + 1023 == ${shared_bytes}, "the host launches with the layout's size");

/* ---- the pipeline ring ---------------------------------------------------------------------- */
/* Key tile j of the block (counted over all its work tiles) goes to ring slot j % STAGES, whose
** barriers are then in phase (j / STAGES) & 1; Q tile n likewise in its own buffers. */
__device__ __forceinline__ int slot(int j) { return j % STAGES; }
__device__ __forceinline__ u32 phase(int j) { return (j / STAGES) & 1; }
__device__ __forceinline__ int q_slot(int n) { return n % Q_STAGES; }
__device__ __forceinline__ u32 q_phase(int n) { return (n / Q_STAGES) & 1; }

struct Ring {
    u32 bars;
    /* The address of barrier i of a kind. */
    __device__ u32 operator()(Bar kind, int i) const { return bars + 8 * (kind + i); }
    /* Sets up every barrier (one thread). */
    __device__ void init() const
    {
        for (int k = 0; k < Q_STAGES; k++) {
            mbar_init((*this)(Q_FULL, k), 1);
            mbar_init((*this)(Q_EMPTY, k), 4 * NC);
        }
#pragma unroll
        for (int s = 0; s < STAGES; s++) {
            mbar_init((*this)(K_FULL, s), 1);
            mbar_init((*this)(V_FULL, s), V_STAGED ? 3 : 1); /* the transposing warps */
            mbar_init((*this)(K_EMPTY, s), 4 * NC); /* one arrival per consumer warp */
            mbar_init((*this)(V_EMPTY, s), 4 * NC);
        }
        if constexpr (DYNAMIC)
            for (int k = 0; k < 2; k++) {
                mbar_init((*this)(TILE_FULL, k), 1);
                mbar_init((*this)(TILE_EMPTY, k), 4 * NC);
            }
        if constexpr (V_STAGED)
            for (int b = 0; b < V_STAGES; b++) {
                mbar_init((*this)(VS_FULL, b), 1);
                mbar_init((*this)(VS_EMPTY, b), 3);
            }
        if constexpr (D_SPLIT)
            for (int b = 0; b < 2; b++) { /* one arrival per consumer thread of the partner */
                mbar_init((*this)(X_FULL, b), 128);
                mbar_init((*this)(X_FREE, b), 128);
            }
        mbar_init_fence();
    }
};

/* ---- the tile scheduler ----------------------------------------------------------------------- */
/* A block's unit of work: BM query rows of one (batch, head) and value columns [v0, v0 + DV)
** (slice v0 / DV; with D_SPLIT also the block's half of Q's and K's columns: qk_panel), with the
** key tiles [nb_lo, nb_hi) its rows may see; its sequence's lengths, and with variable lengths
** its first rows in the packed tensors (tb: the batch coordinate in the tensor maps, 0 for
** packed tensors). */
struct WorkTile {
    int m0, head, batch, head_kv, nb_lo, nb_hi, seqlen_q, seqlen_k, q_first, k_first, tb, v0, slice;
};

/* The 64-column panel of Q and K that is local panel p of the block of slice (rank) r: its
** half in order, or with V_IN_K first the panels of its value columns (its V tile), then its
** share of the rest. */
__device__ __forceinline__ int qk_panel(int p, int r)
{
    if constexpr (V_IN_K) {
        constexpr int PV = DV / PC, PR = DQ / PC - PV;
        return p < PV ? r * PV + p : 2 * PV + r * PR + (p - PV);
    } else {
        return (D_SPLIT ? r * (DQ / PC) : 0) + p;
    }
}
/* Copies rows [row, row + the map's box) of batch `batch` of Q or K into a tile of `rows` rows:
** this block's panels. */
__device__ __forceinline__ void load_qk(u32 dst, const tmap_t *map, u32 bar, int rows, int row,
                                        int batch, const WorkTile &wt, int head, int perm)
{
#pragma unroll
    for (int p = 0; p < DQ / PC; p++)
        tma_load_tile(dst + p * rows * 128, map, bar, qk_panel(p, wt.slice) * PC, row, head,
                      batch, perm);
}

/* Where key tile nb's rows come from: copy j (of BN / PAGE_ROWS) brings the tile's rows from
** j * PAGE_ROWS on, starting at row `row` (0 where a copy is a page) of the tensor maps' batch
** batch[j]. Unpaged that is the sequence's (packed or dense) rows; paged, the pages the sequence's
** table row lists, each page number clamped into the cache and each table slot into the row (a
** last tile past the sequence's keys reads some page; its rows are masked, its values zeroed). */
% if paged then
% page_number()
% end
struct KeyCopies {
    static constexpr int N = BN / PAGE_ROWS;
    int row, batch[N];

% if paged then
    __device__ KeyCopies(const fj_fwd_tma_params &P, const WorkTile &wt, int nb,
                         const divider &page_div /* by P.page_size */)
    {
        const int *pages = P.page_table + (long long)wt.batch * P.pt_sb;
        const int last_slot = div_by(page_div, P.fwd.seqlen_k) - 1;
        row = N == 1 ? mod_by(page_div, nb * BN) : 0;
#pragma unroll
        for (int j = 0; j < N; j++)
            batch[j] = PAGE_NUMBER(imin(div_by(page_div, nb * BN + j * PAGE_ROWS), last_slot));
% else
    __device__ KeyCopies(const fj_fwd_tma_params &P, const WorkTile &wt, int nb)
    {
        (void)P;
        row = wt.k_first + nb * BN;
        batch[0] = wt.tb;
% end
    }
};

/* The block takes work tiles blockIdx.x, then (persistent) the next ones of its schedule: one
** when the grid covers every tile, several when it is persistent (a block per SM), which
** overlaps a tile's last products and stores with the next tile's loads. */
struct Scheduler {
    const fj_fwd_params &F;
    /* The forward's sizes, read once (uniform registers rather than parameter loads in the
    ** loops); with variable lengths the lengths are the maxima. */
    int seqlen_q, seqlen_k, heads_q, heads_kv, batches, window_left, window_right;
    int m_blocks, work_count;

    __device__ explicit Scheduler(const fj_fwd_params &f)
        : F(f), seqlen_q(f.seqlen_q), seqlen_k(f.seqlen_k), heads_q(f.heads_q),
          heads_kv(f.heads_kv), batches(f.batches), window_left(f.window_left),
          window_right(f.window_right), m_blocks((seqlen_q + BM - 1) / BM),
          work_count(m_blocks * heads_q * batches * DV_SLICES)
    {
    }

    /* The w-th work tile. Value slices run fastest, then query blocks, as a grid of one block
    ** per tile would run them (heaviest first under a band or classes); with a bias or mask
    ** tensor (most often one for all batches) the batches run before the query blocks instead,
    ** so that the blocks which read the same rows of it run together and share them through L2. */
    __device__ WorkTile at(int w) const
    {
        const int slice = w % DV_SLICES; /* with D_SPLIT the block's rank in its cluster */
        w /= DV_SLICES;
        int batch, mb, head;
        if constexpr (BATCH_FASTEST) {
            batch = w % batches, mb = (w / batches) % m_blocks, head = w / batches / m_blocks;
        } else {
            mb = w % m_blocks, head = (w / m_blocks) % heads_q, batch = w / m_blocks / heads_q;
        }
        const int m0 = (HEAVY_FIRST ? m_blocks - 1 - mb : mb) * BM;
        WorkTile wt{m0, head, batch, head / (heads_q / heads_kv), 0, 0, seqlen_q, seqlen_k, 0, 0, batch,
                    slice * DV, slice};
        if constexpr (VARLEN) {
            /* The sequence's first rows in the packed tensors and its lengths: the caller's device
            ** data, clamped into the tensors and to the maxima. */
            wt.q_first = imin(imax(__ldg(F.cu_seqlens_q + batch), 0), F.total_q);
            wt.seqlen_q = imin(imax(imin(__ldg(F.cu_seqlens_q + batch + 1), F.total_q) - wt.q_first, 0), seqlen_q);
            if constexpr (!PAGED) {
                wt.k_first = imin(imax(__ldg(F.cu_seqlens_k + batch), 0), F.total_k);
                wt.seqlen_k = imin(imax(imin(__ldg(F.cu_seqlens_k + batch + 1), F.total_k) -
                                        wt.k_first, 0), seqlen_k);
            }
%   if varlen == 2 then
            wt.seqlen_k = imin(wt.seqlen_k, imax(__ldg(F.seqused_k + batch), 0));
%   end
            wt.tb = 0;
        }
        if constexpr (PAGED) /* the sequence's keys: seqused_k of the table's (clamped) */
            wt.seqlen_k = imin(imax(__ldg(F.seqused_k + batch), 0), seqlen_k);
        {
            const int seqlen_q = wt.seqlen_q, seqlen_k = wt.seqlen_k;
% attn_key_band()
            wt.nb_lo = nb_lo;
            wt.nb_hi = m0 < seqlen_q ? nb_hi : nb_lo; /* rows past a short sequence: no work */
        }
        return wt;
    }

    /* The block's next work tile after w under a static schedule: every gridDim.x-th, or zigzag
    ** (persistent = 3: the block's position in round r is blockIdx.x, or gridDim.x - 1 -
    ** blockIdx.x when r is odd). */
    __device__ int next(int w) const
    {
        const int round = w / (int)gridDim.x + 1;
        if constexpr (PERSISTENT == 3)
            return (round & 1) ? (round + 1) * (int)gridDim.x - 1 - (int)blockIdx.x
                               : round * (int)gridDim.x + (int)blockIdx.x;
        else
            return w + (int)gridDim.x;
    }

    /* The dynamic schedule: the producer takes tiles from the grid's counter and announces each
    ** (or the end) to the consumers through a two-slot ring in shared memory. */
    __device__ int take(int *counter) const { return gridDim.x + atomicAdd(counter, 1); }
    __device__ void announce(const Ring &ring, u32 slots, int n, int w) const
    {
        mbar_wait(ring(TILE_EMPTY, n & 1), ((n >> 1) & 1) ^ 1);
        st_shared_u32(slots + 4 * (n & 1), (u32)w);
        mbar_arrive(ring(TILE_FULL, n & 1));
    }
    __device__ int receive(const Ring &ring, u32 slots, int n) const
    {
        mbar_wait(ring(TILE_FULL, n & 1), (n >> 1) & 1);
        const int w = (int)ld_shared_u32(slots + 4 * (n & 1));
        warp_arrive(ring(TILE_EMPTY, n & 1));
        return w;
    }
};

/* The block classes of a work tile's query rows, by key tile (with CLASSES). */
__device__ __forceinline__ const int *class_row(const fj_fwd_params &F, const WorkTile &wt)
{
    return F.mask.block_mask + wt.batch * F.mask.blocks_sb + wt.head * F.mask.blocks_sh +
           (wt.m0 / 128) * F.mask.blocks_sq;
}
__device__ __forceinline__ int class_of(const int *row, int nb) { return __ldg(row + nb * BN / 128); }
/* The first key tile from nb down to nb_lo whose class is not 0, or one below nb_lo where none
** is: four classes a round, their loads independent (one thread's walk, CLASS_VOTE). */
__device__ __forceinline__ int live_tile_from(const int *row, int nb, int nb_lo)
{
    for (;; nb -= 4) {
        int c[4];
#pragma unroll
        for (int j = 0; j < 4; j++) /* (1 below nb_lo: the walk ends there) */
            c[j] = nb - j >= nb_lo ? class_of(row, nb - j) : 1;
#pragma unroll
        for (int j = 0; j < 4; j++)
            if (c[j] != 0)
                return nb - j;
    }
}

/* ---- the producer --------------------------------------------------------------------------- */
/* One thread copies each work tile's Q (with its first key tile: a tile without keys only
** stores zeros), then its key and value tiles (and bias tiles) from the last down, skipping
** those of class 0, each into the next ring slot once the consumers have freed it. */
__device__ __forceinline__ void produce(const fj_fwd_tma_params &P, const Smem &sm,
                                        const Ring &ring, const Scheduler &sched)
{
    tma_prefetch_map(&P.tm_k);
    tma_prefetch_map(&P.tm_v);
    if constexpr (BIAS_TMA)
        tma_prefetch_map(&P.tm_bias);
    int it = 0, qn = 0; /* key tiles and Q tiles loaded so far */
% if paged then
    const divider page_div = divider_of(P.page_size); /* key / page size, without `/` */
% end
    for (int w = blockIdx.x, n = 0;; n++) {
        if constexpr (DYNAMIC)
            sched.announce(ring, sm.slots, n, w);
        if (w >= sched.work_count)
            break;
        const WorkTile wt = sched.at(w);
        [[maybe_unused]] const int *cls_row = CLASSES ? class_row(P.fwd, wt) : nullptr;
        bool q_loaded = false;
        for (int nb = wt.nb_hi - 1; nb >= wt.nb_lo; nb--) {
            if constexpr (CLASS_VOTE) {
                if ((nb = live_tile_from(cls_row, nb, wt.nb_lo)) < wt.nb_lo)
                    break;
            } else if constexpr (CLASSES) {
                if (class_of(cls_row, nb) == 0)
                    continue;
            }
            if (!q_loaded) {
                mbar_wait(ring(Q_EMPTY, q_slot(qn)), q_phase(qn) ^ 1);
                mbar_arrive_expect(ring(Q_FULL, q_slot(qn)), Q_BYTES);
                load_qk(sm.q + q_slot(qn) * Q_BYTES, &P.tm_q, ring(Q_FULL, q_slot(qn)), BM,
                        wt.q_first + wt.m0, wt.tb, wt, wt.head, P.perm_q);
                qn++;
                q_loaded = true;
            }
            /* (page numbers read before the wait) */
            const KeyCopies kc(P, wt, nb${paged and ", page_div" or ""});
            const int s = slot(it);
            const u32 ph = phase(it++);
            mbar_wait(ring(K_EMPTY, s), ph ^ 1);
            mbar_arrive_expect(ring(K_FULL, s), K_BYTES + BIAS_BYTES);
#pragma unroll
            for (int j = 0; j < KeyCopies::N; j++)
                load_qk(sm.k + s * K_BYTES + j * PAGE_ROWS * 128, &P.tm_k, ring(K_FULL, s), BN,
                        kc.row, kc.batch[j], wt, wt.head_kv, P.perm_k);
            if constexpr (BIAS_TMA) {
                /* The bias of these rows and keys: broadcast dimensions at coordinate 0. */
#pragma unroll
                for (int p = 0; p < BN / BIAS_PC; p++)
                    tma_load4(sm.bias + s * BIAS_BYTES + p * BM * 128, &P.tm_bias, ring(K_FULL, s),
                              nb * BN + p * BIAS_PC, wt.m0, P.fwd.mask.bias_sh ? wt.head : 0,
                              P.fwd.mask.bias_sb ? wt.batch : 0);
            }
            if constexpr (V_STAGED) { /* into staging, for the transposing warps */
                const int b = (it - 1) % V_STAGES;
                mbar_wait(ring(VS_EMPTY, b), (((it - 1) / V_STAGES) & 1) ^ 1);
                mbar_arrive_expect(ring(VS_FULL, b), VS_BYTES);
                load_panels<DV, ES>(sm.vs + b * VS_BYTES, &P.tm_v, ring(VS_FULL, b), BN,
                                    kc.row, wt.head_kv, kc.batch[0], P.perm_v, wt.v0);
            } else if constexpr (FP8) {
                /* transposed by the plan: the map's rows are value columns, its columns keys */
                mbar_wait(ring(V_EMPTY, s), ph ^ 1);
                mbar_arrive_expect(ring(V_FULL, s), V_BYTES);
                load_panels<BN, 1>(sm.v + s * V_BYTES, &P.tm_v, ring(V_FULL, s), DV, wt.v0,
                                   wt.head_kv, kc.batch[0], P.perm_v, kc.row);
            } else if constexpr (!V_IN_K) {
                mbar_wait(ring(V_EMPTY, s), ph ^ 1);
                mbar_arrive_expect(ring(V_FULL, s), V_BYTES);
#pragma unroll
                for (int j = 0; j < KeyCopies::N; j++)
                    load_panels<DV>(sm.v + s * V_BYTES + j * PAGE_ROWS * 128, &P.tm_v,
                                    ring(V_FULL, s), BN, kc.row, wt.head_kv, kc.batch[j],
                                    P.perm_v, wt.v0);
            }
        }
        w = DYNAMIC ? sched.take(P.tile_counter) : sched.next(w);
    }
}

/* ---- the softmax of one key tile ------------------------------------------------------------ */
% -- 2^f on [-1/2, 1/2] as 1 + f (c1 + f (c2 + ...)), minimax in relative error with p(0) = 1
% -- exactly: 4.3e-4 at degree 3, below bf16's rounding of P (2^-9); 3.6e-6 at degree 4 for f16.
% local coef = (dtype == "bf16" or fp8) and { "0.695766807f", "0.242030516f", "0.0416987501f" }
%     or { "0.693113625f", "0.240207106f", "0.0559768826f", "0.00978291221f" }
/* 2^x on the FMA and integer pipes, to take work off the MUFU unit: x = j + f with j an
** integer (x + 1.5 * 2^23 rounds it into the low mantissa bits) and |f| <= 1/2, 2^f by a
** polynomial, j added to its exponent field. x is clamped to -127, where f = 0, p = 1 and the
** exponent sum is exactly 0.0f, as exp2(-inf) must be for masked scores; below -126 the result
** is only approximately tiny. Rounding is explicit (__fadd_rn) so that nothing is contracted. */
__device__ __forceinline__ float ex2_poly(float x)
{
    x = fmaxf(x, -127.0f);
    const float r = __fadd_rn(x, 12582912.0f);
    const float f = __fsub_rn(x, __fsub_rn(r, 12582912.0f));
    float p = ${coef[#coef]};
% for i = #coef - 1, 1, -1 do
    p = fmaf(p, f, ${coef[i]});
% end
    p = fmaf(p, f, 1.0f);
    return __uint_as_float(__float_as_uint(p) + (__float_as_uint(r) << 23));
}
/* exp2 of a score of column block j (keys 8j..8j+7 of the tile): EXP_POLY of every 8 blocks,
** spread evenly, take the polynomial (j is a compile-time constant once unrolled). */
#define EX2_SCORE(j, x) ((((j) * EXP_POLY) % 8 + EXP_POLY >= 8) ? ex2_poly(x) : ex2(x))

/* Per-thread state of a consumer: the output accumulators and the running row statistics of
** its two rows (g and g + 8 of its warp's 16). Fragment element 4j + 2h + e is row g + 8h,
** column 8j + 2t + e. */
struct consumer_state {
    float o[DV / 2];
    float row_max[2], row_sum[2];
};

/* Which masks a key tile needs: the band's per-element masking (its edges, the keys' end) and,
** in a block of class 1, the element masks. */
struct TileMask {
    bool band, elem;
};

/* One tile of scores (keys from n0) into probabilities, in place: scaling, score terms, the
** masks of `mask`, new row maxima and sums, P = exp2(S - max). Returns in alpha the factor by
** which O must be rescaled once the previous P V has landed. */
__device__ __forceinline__ void softmax_tile(float *sc, consumer_state &st,
                                             float *alpha, TileMask mask, int n0, int warp_row,
                                             int g, int t, int seqlen_k, int shift,
                                             int window_left, int window_right, float score_mul,
                                             float cap_mul${(element_masks or score_terms) and ",\n                                             const mask_ctx &mc" or ""}${bias_tma and ", u32 bias_tile, int lrow0" or ""})
{
% if not fused then
#pragma unroll
    for (int i = 0; i < BN / 2; i++) {
%   if softcap then
        sc[i] = cap_mul * tanhf(sc[i] * score_mul);
%   else
        sc[i] *= score_mul;
%   end
    }
% end
% if bias_tma then
    /* The bias from shared memory. A thread's two adjacent keys 8j + 2t (+ 1) are one 4- or
    ** 8-byte word of 16-byte chunk cj ^ ct of key panel j / (BIAS_PC / 8), with cj from j and ct
    ** from t; the 128-byte swizzle stores row r's chunk c at c ^ (r % 8). Rows are 128-byte
    ** aligned, so each word's address is the row's base XOR a compile-time chunk. */
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = lrow0 + g + h * 8;
        const u32 base = bias_tile + r * 128 + (((2 * t * ${bias_es} / 16) ^ (r % 8)) << 4) + (2 * t * ${bias_es}) % 16;
#pragma unroll
        for (int j = 0; j < BN / 8; j++) {
            const u32 a = (base ^ (((j % (BIAS_PC / 8)) * ${bias_es // 2}) << 4)) + (j / (BIAS_PC / 8)) * (BM * 128);
            float b0, b1;
%   if bias == "f32" then
            asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];" : "=f"(b0), "=f"(b1) : "r"(a));
%   elseif dtype == "bf16" then
            u32 w;
            asm volatile("ld.shared.b32 %0, [%1];" : "=r"(w) : "r"(a));
            b0 = __uint_as_float(w << 16);
            b1 = __uint_as_float(w & 0xffff0000u);
%   else
            asm volatile("{.reg .b16 lo, hi;\n\tld.shared.v2.b16 {lo, hi}, [%2];\n\t"
                         "cvt.f32.f16 %0, lo;\n\tcvt.f32.f16 %1, hi;}"
                         : "=f"(b0), "=f"(b1) : "r"(a));
%   end
            sc[4 * j + 2 * h] += b0 * (1.0f / F_LN2);
            sc[4 * j + 2 * h + 1] += b1 * (1.0f / F_LN2);
        }
    }
% end
% if alibi or score_mod ~= "" or (bias ~= "" and not bias_tma) then
    /* ALiBi, bias and score_mod, on the scores of rows and keys inside the tensors. */
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int row = warp_row + g + h * 8;
#pragma unroll
        for (int j = 0; j < BN / 8; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int key = n0 + 2 * t + 8 * j + e;
                if (row < mc.sq && key < mc.sk)
                    sc[4 * j + 2 * h + e] = fj_score(mc, sc[4 * j + 2 * h + e], row, key);
            }
    }
% end
% if element_masks then
    /* A block of class 1: the element masks apply. Key by key, so that what a key's masks
    ** read (its ranges) serves both rows. */
%   if not mask_tensor then
    /* Every element's masks are evaluated, rows and keys past the ends clamped to the last ones
    ** (their results dropped), so that what they load (mod_args, ranges: a few words a row or
    ** key) issues together rather than each behind its bounds' branch. (A mask tensor's word
    ** an element, all in flight, spilled 4-92 bytes: it keeps the branches.) */
%   end
    if (mask.elem) {
#pragma unroll
        for (int j = 0; j < BN / 8; j++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int key = n0 + 2 * t + 8 * j + e, key_in = imax(0, imin(key, mc.sk - 1));
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int row = warp_row + g + h * 8;
%   if mask_tensor then
                    if (row < mc.sq && key < mc.sk && !fj_keeps(mc, row, key))
%   else
                    const bool keeps = fj_keeps(mc, imax(0, imin(row, mc.sq - 1)), key_in);
                    if (row < mc.sq && key < mc.sk && !keeps)
%   end
                        sc[4 * j + 2 * h + e] = NEG_INF;
                }
            }
    }
% end
    if (mask.band) {
        /* Bounds relative to this thread's first column, so that each element compares a
        ** compile-time column offset: key = n0 + 2t + 8j + e. Without a left window edge
        ** (causal) only the right one is compared. */
        const int col0 = n0 + 2 * t;
% local function mask_band(left)
#pragma unroll
        for (int h = 0; h < 2; h++) {
% attn_visible_cols("warp_row + g + h * 8", left)
#pragma unroll
            for (int j = 0; j < BN / 8; j++)
#pragma unroll
                for (int e = 0; e < 2; e++)
                    if (j * 8 + e > hi || j * 8 + e < lo)
                        sc[4 * j + 2 * h + e] = NEG_INF;
        }
% end
% attn_band_cases(mask_band)
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float r[BN / 8];
#pragma unroll
        for (int j = 0; j < BN / 8; j++)
            r[j] = fmaxf(sc[4 * j + 2 * h], sc[4 * j + 2 * h + 1]);
        /* Pairwise trees: short dependency chains, any number of blocks. */
#pragma unroll
        for (int w = 1; w < BN / 8; w *= 2)
#pragma unroll
            for (int j = 0; j + w < BN / 8; j += 2 * w)
                r[j] = fmaxf(r[j], r[j + w]);
        float mx = quad_max(fmaxf(st.row_max[h], r[0]));
        if constexpr (LAZY_RESCALE) {
            /* The exponent base moves only when the row's maximum has grown past it by more
            ** than 2^8 (a row's first key always moves it from -inf); below that, P may reach
            ** 256 and its row sum grows by as much, both well inside f32 and bf16/f16's ranges,
            ** and O keeps its scale. (-inf minus -inf is NaN: a row with no key yet stays put.) */
            if (!(TO_LOG2(mx) - TO_LOG2(st.row_max[h]) > 8.0f))
                mx = st.row_max[h];
        }
        /* A row with no key yet keeps max -inf; subtracting 0 then gives exp2(-inf) = 0. */
        const float base = mx == NEG_INF ? 0.0f : TO_LOG2(mx);
        alpha[h] = ex2(TO_LOG2(st.row_max[h]) - base);
        st.row_max[h] = mx;
#pragma unroll
        for (int j = 0; j < BN / 8; j++) {
#pragma unroll
            for (int e = 2 * h; e < 2 * h + 2; e++)
% if fused then
                sc[4 * j + e] = EX2_SCORE(j, fmaf(sc[4 * j + e], score_mul, -base));
% else
                sc[4 * j + e] = EX2_SCORE(j, sc[4 * j + e] - base);
% end
            r[j] = sc[4 * j + 2 * h] + sc[4 * j + 2 * h + 1];
        }
#pragma unroll
        for (int w = 1; w < BN / 8; w *= 2)
#pragma unroll
            for (int j = 0; j + w < BN / 8; j += 2 * w)
                r[j] += r[j + w];
        st.row_sum[h] = st.row_sum[h] * alpha[h] + r[0];
    }
}

% if fp8 then
/* Four non-negative floats as one word of e4m3, a in the low byte (saturated to 448). */
__device__ __forceinline__ u32 pack4_e4m3(float a, float b, float c, float d)
{
    u32 r;
    asm("{\n\t.reg .b16 lo, hi;\n\tcvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n\t"
        "cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n\tmov.b32 %0, {lo, hi};\n\t}"
        : "=r"(r) : "f"(a), "f"(b), "f"(c), "f"(d));
    return r;
}

% end
/* P as the A fragments of P V. 16 bits: two n8 accumulator blocks are one k16 fragment. FP8
** (e4m3): four blocks are one k32 fragment, whose word w holds, of the thread's keys 8j + 2t +
** (0, 1) of blocks j = 0..3, those of blocks 2 (w / 2) and 2 (w / 2) + 1 in row g + 8 (w % 2):
** k = 4t..4t+3 (w < 2) or 16 + 4t.. of the operand, the order in which transpose_values lays
** out V's keys. */
__device__ __forceinline__ void pack_p(const float *sc, u32 (*p)[4])
{
#pragma unroll
    for (int kk = 0; kk < BN / KSTEP; kk++) {
% if fp8 then
        const float *b = sc + 16 * kk;
        p[kk][0] = pack4_e4m3(b[0], b[1], b[4], b[5]);
        p[kk][1] = pack4_e4m3(b[2], b[3], b[6], b[7]);
        p[kk][2] = pack4_e4m3(b[8], b[9], b[12], b[13]);
        p[kk][3] = pack4_e4m3(b[10], b[11], b[14], b[15]);
% else
        p[kk][0] = pack2(sc[8 * kk + 0], sc[8 * kk + 1]);
        p[kk][1] = pack2(sc[8 * kk + 2], sc[8 * kk + 3]);
        p[kk][2] = pack2(sc[8 * kk + 4], sc[8 * kk + 5]);
        p[kk][3] = pack2(sc[8 * kk + 6], sc[8 * kk + 7]);
% end
    }
}

__device__ __forceinline__ void rescale(consumer_state &st, const float *alpha)
{
    if constexpr (LAZY_RESCALE) {
        /* No row of the warp moved its base (the common case): O keeps its scale. */
        if (!__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f))
            return;
    }
#pragma unroll
    for (int j = 0; j < DV / 8; j++) {
        st.o[4 * j + 0] *= alpha[0];
        st.o[4 * j + 1] *= alpha[0];
        st.o[4 * j + 2] *= alpha[1];
        st.o[4 * j + 3] *= alpha[1];
    }
}

/* ---- the products ---------------------------------------------------------------------------- */
/* S = Q K^T for the key tile in ring slot s: issued, not waited for (land_scores once it has
** been).
** FP8 beyond one 128-column panel of q and k (S_PARTS > 0): the tensor cores add FP8 products
** into their accumulator with about 13 bits of mantissa, and with the eight k-steps of d 256
** chained into one accumulator, inputs with outliers gave 3x the output error of a plain FP8
** implementation (test_fp8 on the H200; at d 128's four, as much as it). So the second panel's
** sum is kept apart in sx and added in f32 (as DeepSeek-V3 promotes its FP8 GEMMs' partial
** sums). The first panel runs over the whole tile; the second, where registers hold no second
** S (O of more than 128 value columns, or the pipelined loop's P), in S_PARTS parts of PN
** keys (fj__variant_fits counts their registers; plan_wgmma_fp8 picks), each added in once landed
** (a part's accumulator columns are the first PN of an n-BN tile's: the fragments run by n8
** blocks), the last in land_scores. Parts of few keys re-read Q's panel from shared memory
** for little work, so the first panel is not cut. */
__device__ __forceinline__ void add_part(float *sp, const float *sx)
{
#pragma unroll
    for (int i = 0; i < PN / 2; i++)
        sp[i] += sx[i];
}
__device__ __forceinline__ void issue_qk(float *sc, float *sx, u64 q_desc, u64 k_desc, int s)
{
    constexpr int FIRST = S_PARTS > 0 ? 4 : DQ / KSTEP; /* k-steps into sc: a panel's 4, or all */
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < FIRST; kk++)
        wgmma_ss_${tile_n}(sc, q_desc + (((kk / 4) * BM * 128 + (kk % 4) * 32) >> 4),
                   k_desc + ((s * K_BYTES + (kk / 4) * BN * 128 + (kk % 4) * 32) >> 4), kk > 0);
    if constexpr (S_PARTS > 0) {
        const u64 kd = k_desc + ((s * K_BYTES) >> 4);
#pragma unroll
        for (int part = 0; part < S_PARTS; part++) {
            if (part > 0) { /* the last part has landed in sx */
                wgmma_commit();
                wgmma_wait<0>();
                fence_regs<PN / 2>(sx);
                add_part(sc + (part - 1) * (PN / 2), sx);
                wgmma_fence();
            }
#pragma unroll
            for (int kk = FIRST; kk < DQ / KSTEP; kk++)
                wgmma_ss_${part_n}(sx, q_desc + (((kk / 4) * BM * 128 + (kk % 4) * 32) >> 4),
                           kd + ((part * PN * 128 + (kk / 4) * BN * 128 + (kk % 4) * 32) >> 4),
                           kk > FIRST);
        }
    }
    wgmma_commit();
}
/* S of issue_qk has landed: the last part of the second panel added in. */
__device__ __forceinline__ void land_scores(float *sc, float *sx)
{
    if constexpr (S_PARTS > 0) {
        fence_regs<PN / 2>(sx);
        add_part(sc + (S_PARTS - 1) * (PN / 2), sx);
    }
}

/* O += P V for the value tile in ring slot s: issued, not waited for. 16 bits: V N-major, k
** steps of 16 rows; FP8: V transposed, K-major, k steps of 32 bytes inside its 128-key panels. */
__device__ __forceinline__ void issue_pv(float *o, u32 (*p)[4], u64 v_desc, int s)
{
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BN / KSTEP; kk++) {
        const int step = FP8 ? (kk / 4) * DV * 128 + (kk % 4) * 32 : kk * 16 * 128;
        wgmma_rs_${slice_dv}(o, p[kk], v_desc + ((s * VT_BYTES + step) >> 4), 1);
    }
    wgmma_commit();
}

/* The two consumer warpgroups take turns issuing a round of products (named barriers 1 and 2,
** FA3's ping-pong), so that one's softmax runs while the tensor cores serve the other. In each
** work tile warpgroup 1 hands the first turn to warpgroup 0 and skips the hand-over after its
** last round, so every arrival is matched. */
__device__ __forceinline__ void turn_wait(int c)
{
    if constexpr (PINGPONG)
        asm volatile("bar.sync %0, 256;" ::"r"(1 + c) : "memory");
}
__device__ __forceinline__ void turn_pass(int c)
{
    if constexpr (PINGPONG)
        asm volatile("bar.arrive %0, 256;" ::"r"(2 - c) : "memory");
}

/* ---- the score exchange of a cluster pair (D_SPLIT) ----------------------------------------- */
/* The two blocks of a cluster compute S over their halves of the head dim for the same rows and
** keys, so their score fragments match thread for thread. Exchange n: each consumer thread
** writes its fragment into the partner's buffer n % 2 (once the partner has read what this
** block left there at exchange n - 2: X_FREE), arrives on the partner's X_FULL, waits for its
** own (the partner's half), adds it, and arrives on the partner's X_FREE. Buffers hold float4 b of thread i at (b * 128 + i) * 16, so a
** warp's accesses are contiguous. */
struct Exchange {
    u32 mine, theirs, bars, their_bars; /* buffer 0 and the barriers, here and in the partner */
    int n;                              /* exchanges so far */

    __device__ Exchange(const Smem &sm, const Ring &ring)
        : mine(sm.x), theirs(0), bars(ring(X_FULL, 0)), their_bars(0), n(0)
    {
        if constexpr (D_SPLIT) { /* (a block outside a cluster has no partner to map) */
            const u32 partner = cluster_rank() ^ 1;
            theirs = cluster_map(mine, partner);
            their_bars = cluster_map(bars, partner);
        }
    }
    __device__ u32 x_full(u32 base, int b) const { return base + 8 * b; }
    __device__ u32 x_free(u32 base, int b) const { return base + 8 * (X_FREE - X_FULL + b); }

    /* sc (this consumer thread's fragment, ctid 0..127) += the partner's. */
    __device__ void add_partner(float *sc, int ctid)
    {
        const int b = n & 1;
        const u32 ph = (n >> 1) & 1;
        n++;
        mbar_wait<true>(x_free(bars, b), ph ^ 1);
#pragma unroll
        for (int i = 0; i < BN / 8; i++)
            st_cluster_v4(theirs + b * X_BYTES + (i * 128 + ctid) * 16, sc[4 * i], sc[4 * i + 1],
                          sc[4 * i + 2], sc[4 * i + 3]);
        mbar_arrive_cluster(x_full(their_bars, b));
        mbar_wait<true>(x_full(bars, b), ph);
#pragma unroll
        for (int i = 0; i < BN / 8; i++) {
            float4 p;
            asm volatile("ld.shared.v4.f32 {%0, %1, %2, %3}, [%4];"
                         : "=f"(p.x), "=f"(p.y), "=f"(p.z), "=f"(p.w)
                         : "r"(mine + b * X_BYTES + (i * 128 + ctid) * 16) : "memory");
            sc[4 * i] += p.x;
            sc[4 * i + 1] += p.y;
            sc[4 * i + 2] += p.z;
            sc[4 * i + 3] += p.w;
        }
        mbar_arrive_cluster(x_free(their_bars, b));
    }
};

/* ---- the key tiles of a work tile ------------------------------------------------------------ */
/* Which key tiles the consumers of a work tile visit, in the producer's order (from the last
** down): the band's, or with classes those of classes 1 and 2, counted by the warp. With VOTE
** the whole warp walks together (every lane calls advance), reading 32 tiles' classes a lane
** each and keeping the vote: bit j of `live` is tile `unread + 32 - j`, not yet visited, of a
** class other than 0, and of `one` of class 1 (the consumers' walk with CLASS_VOTE; the FP8
** transposer's 56 registers keep the serial one, which visits the same tiles). */
template <bool VOTE = CLASS_VOTE> struct KeyWalk {
    int tiles;  /* how many */
    int nb_hi;  /* without classes: tile i has keys from (nb_hi - 1 - i) * BN */
    int nb, cls; /* with classes: the current tile and its class */
    const int *cls_row;
    int nb_lo;
    int unread; /* VOTE: the highest tile not yet read */
    u32 live, one;

    __device__ KeyWalk(const fj_fwd_params &F, const WorkTile &wt, int lane)
        : tiles(wt.nb_hi - wt.nb_lo), nb_hi(wt.nb_hi), nb(wt.nb_hi), cls(0), cls_row(nullptr),
          nb_lo(wt.nb_lo), unread(wt.nb_hi - 1), live(0), one(0)
    {
        if constexpr (CLASSES) {
            cls_row = class_row(F, wt);
            tiles = 0;
            for (int k = wt.nb_lo + lane; k < wt.nb_hi; k += 32)
                tiles += class_of(cls_row, k) != 0;
#pragma unroll
            for (int o = 16; o > 0; o /= 2)
                tiles += __shfl_xor_sync(0xffffffffu, tiles, o);
            advance();
        }
    }
    /* With classes: on to the next tile of class 1 or 2 (past the last: below nb_lo). */
    __device__ void advance()
    {
        if constexpr (VOTE) {
            while (live == 0 && unread >= nb_lo) {
                const int k = unread - (int)(threadIdx.x & 31u);
                const int c = k >= nb_lo ? class_of(cls_row, k) : 0;
                live = __ballot_sync(0xffffffffu, c != 0);
                one = __ballot_sync(0xffffffffu, c == 1);
                unread -= 32;
            }
            if (live == 0) {
                nb = nb_lo - 1;
                cls = 1;
                return;
            }
            const int j = __ffs(live) - 1;
            nb = unread + 32 - j;
            cls = (one >> j) & 1u ? 1 : 2;
            live &= live - 1u;
        } else {
            do
                cls = --nb >= nb_lo ? class_of(cls_row, nb) : 1;
            while (cls == 0);
        }
    }
    /* Tile i's first key, and whether the element masks apply there; then on to tile i + 1. */
    __device__ int take(int i, bool &elem)
    {
        if constexpr (CLASSES) {
            const int n0 = nb * BN;
            elem = cls == 1;
            advance();
            return n0;
        } else {
            elem = false;
            return (nb_hi - 1 - i) * BN;
        }
    }
};

/* ---- the value transposer (FP8) ---------------------------------------------------------- */
/* P's registers hold, of each 16 keys of a tile, keys 2t + (0, 1, 8, 9) in thread t of a quad,
** which P V reads as 4 consecutive k (pack_p): so position 4t + i of a transposed tile's 16
** holds key 2t + (0, 1, 8, 9)[i]. A warp's unit is 16 keys by 32 value columns: ldmatrix,
** transposing 16-bit pairs, gives thread t keys 2(t % 4) and 2(t % 4) + 1 of columns
** 2(t / 4) and 2(t / 4) + 1 (and the same 8 keys on from the second matrix), byte permutes make
** each column's 4 keys one word, and stmatrix writes those to rows col.. of the slot (its
** matrices: even and odd rows of the first 16 columns, then of the next 16). Keys at or past
** the sequence's end become zeros: with packed sequences the staged rows hold the next
** sequence's values, and 0 * NaN is not 0. */
__device__ __forceinline__ void stmatrix_x4(u32 addr, u32 r0, u32 r1, u32 r2, u32 r3)
{
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(addr),
                 "r"(r0), "r"(r1), "r"(r2), "r"(r3) : "memory");
}
__device__ __forceinline__ void transpose_tile(u32 src, u32 dst, int warp, int lane, int valid)
{
    constexpr int HALVES = BN / 16, UNITS = HALVES * (DV / 32);
    /* The row this lane addresses: of ldmatrix's matrices (keys 0-7, 8-15 of columns 0-15,
    ** then of 16-31) and of stmatrix's. Both sides are panels 128 bytes wide in the 128-byte
    ** swizzle (16-byte chunk c of row r at chunk c ^ (r % 8)), and a lane's key % 8 and row % 8
    ** are the same in every unit, so its row addresses are made once. */
    const int key_in = lane % 8 + 8 * ((lane / 8) % 2), col_in = 16 * (lane / 16);
    const int row_out = 2 * (lane % 8) + (lane / 8) % 2 + 16 * (lane / 16);
    const int ka = 2 * (lane % 4); /* this thread's first key of each 8 */
    const u32 src_lane = src + key_in * 128, dst_lane = dst + row_out * 128;
    /* One unit: 16 keys x 32 columns; masked, keys at or past `valid` become zeros (the calls
    ** pass constants, so each loop is compiled with or without the masking). */
    auto unit = [&](int u, bool masked) {
        const int k16 = 16 * (u % HALVES), c32 = 32 * (u / HALVES), col = c32 + col_in;
        u32 r0, r1, r2, r3;
        ldmatrix_x4_trans(src_lane + (col / 128) * (BN * 128) + k16 * 128 +
                              ((((col % 128) >> 4) ^ (lane % 8)) << 4),
                          r0, r1, r2, r3);
        if (masked && k16 + 16 > valid) { /* bytes 0-1 hold key ka, 2-3 key ka + 1 (r1, r3: 8 on) */
            const u32 lo = (k16 + ka < valid ? 0xffffu : 0u) |
                           (k16 + ka + 1 < valid ? 0xffff0000u : 0u);
            const u32 hi = (k16 + ka + 8 < valid ? 0xffffu : 0u) |
                           (k16 + ka + 9 < valid ? 0xffff0000u : 0u);
            r0 &= lo, r2 &= lo, r1 &= hi, r3 &= hi;
        }
        stmatrix_x4(dst_lane + (k16 / 128) * (DV * 128) + c32 * 128 +
                        ((((k16 % 128) >> 4) ^ (row_out % 8)) << 4),
                    __byte_perm(r0, r1, 0x6420), __byte_perm(r0, r1, 0x7531),
                    __byte_perm(r2, r3, 0x6420), __byte_perm(r2, r3, 0x7531));
    };
    /* Two units in flight where the producer keeps 56 registers (up to 128 value columns). With
    ** 40 (256 value columns) two spilled 8 bytes, one unit at a time cost 3-7 % (H100), so whole
    ** tiles take two there and a sequence's last tile one; with soft-capping or block classes
    ** that split spilled 8-68 bytes (one register allocation serves consumers and producer), so
    ** one throughout. */
    if (${slice_dv == 256 and not softcap and not classes} && valid >= BN) {
#pragma unroll 2
        for (int u = warp; u < UNITS; u += 3)
            unit(u, false);
    } else {
#pragma unroll ${producer_regs >= 56 and 2 or 1}
        for (int u = warp; u < UNITS; u += 3)
            unit(u, true);
    }
}
/* Warps 1-3 of the producer's warpgroup take each value tile from its staging buffer into its
** ring slot once the consumers have freed that, in the consumers' order (static schedules). */
__device__ __forceinline__ void transpose_values(const fj_fwd_params &F, const Smem &sm,
                                                 const Ring &ring, const Scheduler &sched,
                                                 int warp, int lane)
{
    int it = 0;
    for (int w = blockIdx.x; w < sched.work_count; w = sched.next(w)) {
        const WorkTile wt = sched.at(w);
        KeyWalk<false> walk(F, wt, lane);
        for (int i = 0; i < walk.tiles; i++, it++) {
            bool elem;
            const int valid = wt.seqlen_k - walk.take(i, elem);
            const int b = it % V_STAGES, s = slot(it);
            mbar_wait(ring(VS_FULL, b), (it / V_STAGES) & 1);
            mbar_wait(ring(V_EMPTY, s), phase(it) ^ 1);
            transpose_tile(sm.vs + b * VS_BYTES, sm.v + s * V_BYTES, warp, lane, valid);
            fence_proxy_async(); /* the writes, before wgmma reads them */
            warp_arrive(ring(VS_EMPTY, b));
            warp_arrive(ring(V_FULL, s));
        }
    }
}

/* FP8: the descale factors of a work tile's (batch, kv head): q's times k's, and v's (1 without
** descale). */
struct Descale {
    float qk, v;
};
__device__ __forceinline__ Descale descale_of(const fj_fwd_params &F, int batch, int head_kv)
{
% descale_factors("F")
    return {qk_factor, v_factor};
}

/* ---- the epilogue ------------------------------------------------------------------------------ */
/* Where the epilogue writes: out and lse with their strides, read once. */
struct OutView {
    o_t *out;
    float *lse;
    long long o_sb, o_sh, o_ss, l_sb, l_sh, l_ss;
    int head_dim_v;
    __device__ explicit OutView(const fj_fwd_params &F)
        : out(F.out), lse(F.lse), o_sb(F.o_sb), o_sh(F.o_sh), o_ss(F.o_ss), l_sb(F.l_sb),
          l_sh(F.l_sh), l_ss(F.l_ss), head_dim_v(F.head_dim_v)
    {
    }
};

/* Normalises and stores a warp's 16 rows of O (from warp_row: the work tile's value columns) and
** (the first slice) their lse; a row that saw no key gets 0 and lse -inf. */
__device__ __forceinline__ void store_tile(const OutView &F, const WorkTile &wt,
                                           const consumer_state &st, int warp_row, int seqlen_q,
                                           int g, int t, float score_mul, float o_mul)
{
    o_t *o_tile =
        F.out + wt.batch * F.o_sb + wt.head * F.o_sh + (long long)wt.q_first * F.o_ss + wt.v0;
    const int cols = F.head_dim_v - wt.v0; /* of this slice inside the tensor */
    [[maybe_unused]] float *l_tile =
        F.lse + wt.batch * F.l_sb + wt.head * F.l_sh + (long long)wt.q_first * F.l_ss;
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const float sum = quad_sum(st.row_sum[h]);
        const float inv = sum > 0.0f ? o_mul / sum : 0.0f; /* o_mul: v's descale factor */
        const int row = warp_row + g + h * 8;
        if constexpr (!BIAS_TMA) {
            /* A quad holds 8 consecutive columns of its row per j, two per thread. A 4 x 4
            ** transpose by shuffles (xor 1, then xor 2) hands thread t the whole 16-byte chunk
            ** j = 4m + t, so that each store of the warp writes 64 contiguous bytes of each of
            ** its 8 rows rather than 16 (+4-17 % at 512-1k keys). Every lane shuffles; the
            ** bounds apply to the stores. (With the bias by TMA these stores measured 10-15 %
            ** slower than the plain ones below, d 128, 8k keys; cause not found.) */
#pragma unroll
            for (int m = 0; m < DV / 32; m++) {
                u32 w[4];
#pragma unroll
                for (int u = 0; u < 4; u++)
                    w[u] = pack2(st.o[4 * (4 * m + u) + 2 * h] * inv,
                                 st.o[4 * (4 * m + u) + 2 * h + 1] * inv);
                const bool odd = t & 1, high = t & 2;
                u32 r0 = __shfl_xor_sync(0xffffffffu, odd ? w[0] : w[1], 1);
                u32 r1 = __shfl_xor_sync(0xffffffffu, odd ? w[2] : w[3], 1);
                /* Now even t holds chunks 0 and 2 of lanes t, t + 1; odd t chunks 1 and 3 of
                ** lanes t - 1, t (selects: an index that varies by lane would go to the stack). */
                w[0] = odd ? r0 : w[0];
                w[1] = odd ? w[1] : r0;
                w[2] = odd ? r1 : w[2];
                w[3] = odd ? w[3] : r1;
                r0 = __shfl_xor_sync(0xffffffffu, high ? w[0] : w[2], 2);
                r1 = __shfl_xor_sync(0xffffffffu, high ? w[1] : w[3], 2);
                const uint4 chunk = high ? make_uint4(r0, r1, w[2], w[3]) : make_uint4(w[0], w[1], r0, r1);
                const int col = 8 * (4 * m + t);
                if (row < seqlen_q && col < cols)
                    *(uint4 *)(o_tile + (long long)row * F.o_ss + col) = chunk;
            }
        } else {
            if (row < seqlen_q) {
#pragma unroll
                for (int j = 0; j < DV / 8; j++) {
                    const int col = j * 8 + 2 * t;
                    if (col < cols)
                        *(u32 *)(o_tile + (long long)row * F.o_ss + col) =
                            pack2(st.o[4 * j + 2 * h] * inv, st.o[4 * j + 2 * h + 1] * inv);
                }
            }
        }
        if constexpr (WRITE_LSE)
            if (row < seqlen_q && t == 0 && wt.v0 == 0)
                l_tile[row * F.l_ss] = sum > 0.0f ? (TO_LOG2(st.row_max[h]) + lg2(sum)) * 0.693147180559945309f : NEG_INF;
    }
}

/* ---- the kernel: the parts wired together ---------------------------------------------------- */
extern "C" __global__ void ${d_split and "__cluster_dims__(2, 1, 1) " or ""}__launch_bounds__(THREADS, ${ctas_per_sm})
fj_attn_fwd(
% params_arg(args)
)
{
    const fj_fwd_params &F = P.fwd;
    const int window_left = F.window_left, window_right = F.window_right;
    const float score_mul = F.score_mul, cap_mul = F.cap_mul;
    extern __shared__ __align__(1024) unsigned char smem[];
    const Smem sm((smem_addr(smem) + 1023) & ~1023u);
    const Ring ring{sm.bars};
    const Scheduler sched(F);
    const OutView outv(F);

% if element_masks and slice_dv > 128 then
    /* (Broadcast as below, this kernel spilled 4 bytes at d 256.) */
    const int tid = threadIdx.x, wg = tid / 128;
% else
    /* The warpgroup index, broadcast from lane 0 so that ptxas knows it is warp-uniform and
    ** keeps what derives from it (descriptors, loop bounds) in uniform registers: the wgmma
    ** descriptors no longer go through vector registers (causal d 128 +4-8 %). */
    const int tid = threadIdx.x, wg = __shfl_sync(0xffffffffu, tid / 128, 0);
% end
    if (tid == 0)
        ring.init();
    /* With D_SPLIT both blocks' barriers must be ready before either writes into the other, and
    ** neither may exit while the other can still write into it (cluster_sync at the end). */
    if constexpr (D_SPLIT)
        cluster_sync();
    else
        __syncthreads();

    if (wg == 0) {
        if constexpr (REALLOC)
            regs_dec<PRODUCER_REGS>();
        if (tid == 0)
            produce(P, sm, ring, sched);
        if constexpr (V_STAGED)
            if (tid >= 32)
                transpose_values(F, sm, ring, sched, tid / 32 - 1, tid % 32);
        if constexpr (D_SPLIT)
            cluster_sync();
        return;
    }

    /* ---- consumers ---- */
    if constexpr (REALLOC)
        regs_inc<CONSUMER_REGS>();
    const int c = wg - 1, warp = (tid % 128) / 32, lane = tid % 32;
    const int g = lane / 4, t = lane % 4; /* row group and column pair of the fragments */

    /* Descriptors: Q and K K-major (k steps of 32 bytes inside a panel), V N-major (panels
    ** BN * 128 bytes apart, k steps of 16 rows), or with FP8 transposed and K-major. */
    const u64 q_desc0 = gmma_desc(sm.q + 64 * c * 128, 16, 1024); /* Q buffer 0 */
    const u64 k_desc = gmma_desc(sm.k, 16, 1024);
    const u32 v_tiles = V_IN_K ? sm.k : sm.v;
    const u64 v_desc = gmma_desc(v_tiles, FP8 ? 16 : BN * 128, 1024);

    [[maybe_unused]] Exchange exchange(sm, ring);
    consumer_state st;
    float sc[BN / 2], sx[S_PARTS > 0 ? PN / 2 : 1];
    u32 p[BN / KSTEP][4];
    float alpha[2];
    int it = 0, qn = 0; /* key tiles and Q tiles consumed so far, as the producer counts them */
    for (int w = blockIdx.x, n = 0;; n++) {
        if constexpr (DYNAMIC)
            w = sched.receive(ring, sm.slots, n);
        if (w >= sched.work_count)
            break;
        const WorkTile wt = sched.at(w);
        /* The scores' factor (log2 units) and the output's: with FP8, times the descale
        ** factors (q's and k's, and v's). */
        float tile_mul = score_mul, o_mul = 1.0f;
        if constexpr (DESCALE) {
            const Descale f = descale_of(F, wt.batch, wt.head_kv);
            tile_mul *= f.qk;
            o_mul = f.v;
        }
        /* This sequence's lengths (the parameters are the maxima with variable lengths). */
        const int seqlen_q = wt.seqlen_q, seqlen_k = wt.seqlen_k;
        /* Keys align with queries bottom-right; without a band the masks only cut the end. */
        const int shift = LOCAL_MASK ? seqlen_k - seqlen_q : 0;
        KeyWalk<> walk(F, wt, lane);
        const int tiles = walk.tiles;
        const int wg_row = wt.m0 + 64 * c; /* first query row of this warpgroup */
        const int warp_row = wg_row + 16 * warp;
#pragma unroll
        for (int i = 0; i < DV / 2; i++)
            st.o[i] = 0.0f;
        st.row_max[0] = st.row_max[1] = NEG_INF;
        st.row_sum[0] = st.row_sum[1] = 0.0f;
% if element_masks or score_terms then
        MASK_CTX(mc, F.mask, wt.batch, wt.head, seqlen_q, seqlen_k);
% end

        /* Whether the tile of keys from n0 needs the band's per-element masking for this
        ** warpgroup. */
        auto band_mask = [&](int n0) {
            bool m = n0 + BN > seqlen_k;
            if constexpr (LOCAL_MASK) {
                if (window_right >= 0)
                    m |= n0 + BN - 1 > wg_row + shift + window_right;
                if (window_left >= 0)
                    m |= n0 < wg_row + 63 + shift - window_left;
            }
            return m;
        };
        /* Tile i's scores have landed in sc: hand its key slot back, then softmax them. */
        auto take_scores = [&](int i) {
            fence_regs<BN / 2>(sc);
            land_scores(sc, sx);
            TileMask mask;
            const int n0 = walk.take(i, mask.elem);
            mask.band = band_mask(n0);
            if constexpr (!BIAS_TMA && !V_IN_K)
                warp_arrive(ring(K_EMPTY, slot(it + i)));
            if constexpr (D_SPLIT)
                exchange.add_partner(sc, tid - 128);
            softmax_tile(sc, st, alpha, mask, n0, warp_row, g, t, seqlen_k, shift, window_left,
                         window_right, tile_mul, cap_mul${(element_masks or score_terms) and ", mc" or ""}${bias_tma and ", sm.bias + slot(it + i) * BIAS_BYTES, warp_row - wt.m0" or ""});
            if constexpr (BIAS_TMA && !V_IN_K) /* the bias has been read: K and bias go back together */
                warp_arrive(ring(K_EMPTY, slot(it + i)));
        };
        /* The product of tile i into O has landed: hand its value slot back. */
        auto take_product = [&](int i) {
            fence_regs<DV / 2>(st.o);
            warp_arrive(ring(VT_EMPTY, slot(it + i)));
        };
        /* The last S = Q K^T of this work tile has landed: Q's buffer may take the next. */
        auto release_q = [&]() {
            warp_arrive(ring(Q_EMPTY, q_slot(qn)));
            qn++;
        };

        /* This work tile's Q buffer. */
        const u64 q_desc = q_desc0 + ((q_slot(qn) * Q_BYTES) >> 4);
        if (tiles > 0)
            mbar_wait(ring(Q_FULL, q_slot(qn)), q_phase(qn));
        if constexpr ((VARLEN || PAGED) && !FP8) { /* (FP8: transpose_values zeroes them) */
            /* Packed sequences: the rows of the first (last) key tile past this sequence's keys
            ** hold another sequence's values, or anything (seqused_k; a page's unused rows).
            ** Their P is 0, but 0 * NaN is not, so the consumers zero them in shared memory before
            ** any product reads them. */
            const int nb_hi = walk.nb_hi;
            if (tiles > 0 && nb_hi * BN > seqlen_k) {
                mbar_wait(ring(VT_FULL, slot(it)), phase(it));
                const int r0 = imax(seqlen_k - (nb_hi - 1) * BN, 0), per_panel = (BN - r0) * 8;
                for (int i = tid - 128; i < per_panel * (DV / 64); i += 128 * NC)
                    st_shared_zero16(v_tiles + slot(it) * VT_BYTES + (i / per_panel) * (BN * 128) +
                                     r0 * 128 + (i % per_panel) * 16);
                fence_proxy_async();
                asm volatile("bar.sync 3, %0;" ::"n"(128 * NC) : "memory");
            }
        }
        if constexpr (PINGPONG)
            if (tiles > 0 && c == 1)
                turn_pass(c);
        if constexpr (OVERLAP) {
            /* Software-pipelined (FA3's intra-warpgroup overlap): the softmax of tile i runs
            ** while the tensor cores do P V of tile i - 1. Tiles run from the last key tile
            ** down. */
            if (tiles > 0) {
                turn_wait(c);
                mbar_wait(ring(K_FULL, slot(it)), phase(it));
                issue_qk(sc, sx, q_desc, k_desc, slot(it));
                turn_pass(c);
                wgmma_wait<0>();
                take_scores(0);
                pack_p(sc, p);
            }
            for (int i = 1; i < tiles; i++) {
                const int j = it + i;
                turn_wait(c);
                mbar_wait(ring(K_FULL, slot(j)), phase(j));
                issue_qk(sc, sx, q_desc, k_desc, slot(j));
                mbar_wait(ring(VT_FULL, slot(j - 1)), phase(j - 1));
                issue_pv(st.o, p, v_desc, slot(j - 1));
                turn_pass(c);
                wgmma_wait<1>(); /* S of this tile; P V of the last may still run */
                take_scores(i);
                wgmma_wait<0>();
                fence_regs<P_REGS>(&p[0][0]); /* P stays untouched until its product has landed */
                take_product(i - 1);
                /* P is packed only now that the last product has read it: a second P register
                ** set copied over the first made ptxas serialise every wgmma (C7513). */
                pack_p(sc, p);
                rescale(st, alpha);
                /* Pinned here: moved past the next wgmma.fence, these writes of wgmma inputs
                ** would make ptxas serialise every wgmma. */
                fence_regs<DV / 2>(st.o);
                fence_regs<P_REGS>(&p[0][0]);
            }
            if (tiles > 0) {
                const int j = it + tiles - 1;
                release_q();
                turn_wait(c);
                mbar_wait(ring(VT_FULL, slot(j)), phase(j));
                issue_pv(st.o, p, v_desc, slot(j));
                if (c == 0)
                    turn_pass(c);
                wgmma_wait<0>();
                take_product(tiles - 1);
            }
        } else {
            /* The block's tiles [0, tiles) run from key tile nb_hi - 1 down; this warpgroup's rows
            ** see only [i_first, i_end) of them (192-row blocks span a band wider than each
            ** warpgroup's: at 2k causal queries a warpgroup needs 89 % of the block's tiles), and
            ** none when all its rows lie past the sequence's end. The rest it hands back untouched,
            ** outside the main loop, whose branches then stay free of per-warpgroup conditions
            ** (one inside it, even made warp-uniform by a vote, cost 10 % at d 64). With classes
            ** the warpgroup visits every tile the producer loads. */
            int i_first = 0, i_end = tiles;
            if constexpr (!CLASSES) {
                const int nb_hi = walk.nb_hi;
                i_first = wg_row >= seqlen_q ? tiles : 0;
                if constexpr (LOCAL_MASK) {
                    const int wg_last = imin(wg_row + 63, seqlen_q - 1);
                    if (window_right >= 0) /* keys up to wg_last + shift + window_right */
                        i_first = imax(i_first, nb_hi - 1 - floor_div(wg_last + shift + window_right, BN));
                    if (window_left >= 0) /* keys from wg_row + shift - window_left */
                        i_end = imin(i_end, nb_hi - floor_div(wg_row + shift - window_left, BN));
                }
                i_first = imin(i_first, tiles);
                i_end = imax(imin(i_end, tiles), i_first);
            }
            /* A skipped slot is released once filled, so that each arrival counts in its own phase
            ** of the empty barriers. */
            auto hand_back = [&](int i) {
                const int j = it + i;
                mbar_wait(ring(K_FULL, slot(j)), phase(j));
                if constexpr (!V_IN_K)
                    warp_arrive(ring(K_EMPTY, slot(j)));
                mbar_wait(ring(VT_FULL, slot(j)), phase(j));
                warp_arrive(ring(VT_EMPTY, slot(j)));
            };
            for (int i = 0; i < i_first; i++)
                hand_back(i);
            for (int i = i_first; i < i_end; i++) {
                const int j = it + i;
                mbar_wait(ring(K_FULL, slot(j)), phase(j));
                issue_qk(sc, sx, q_desc, k_desc, slot(j));
                wgmma_wait<0>();
                take_scores(i);
                if (i == i_end - 1)
                    release_q();
                pack_p(sc, p);
                rescale(st, alpha);
                mbar_wait(ring(VT_FULL, slot(j)), phase(j));
                issue_pv(st.o, p, v_desc, slot(j));
                wgmma_wait<0>();
                take_product(i);
            }
            for (int i = i_end; i < tiles; i++)
                hand_back(i);
            if (i_first == i_end && tiles > 0)
                release_q(); /* no S = Q K^T ran */
        }
        it += tiles;
        if constexpr (!DYNAMIC)
            w = sched.next(w);
        store_tile(outv, wt, st, warp_row, seqlen_q, g, t, tile_mul, o_mul);
    }
    if constexpr (D_SPLIT)
        cluster_sync();
}
