% -- Decode attention for Hopper (sm_90a) with value dims beyond 256 (MLA's 576 / 512): the
% -- decode family's work and output (a block per (batch, kv head, row tile, split), grouped-query
% -- heads packed, with `partial` the split's state to the workspace) on wgmma, for the shapes
% -- that are compute-bound (MLA with 64-128 query heads on one latent kv head) as well as the
% -- bandwidth-bound ones.
% --
% -- A block is BM = 64 packed rows and three warpgroups:
% --   producer   (warpgroup 0) copies Q once by cp.async (complete on QBAR), then key (and value)
% --              tiles of BN keys into a ring of STAGES slots, in the 128-byte swizzle that wgmma
% --              reads: with `bulk` one thread's bulk tensor copies (a 64-column panel a copy,
% --              counted in bytes on the slot's FULL mbarrier; a paged cache's tiles start at
% --              multiples of BN in pages of whole tiles, plan/decode.c); else all four warps'
% --              cp.async, each 16-byte piece straight to its place (any page size: a warp copies
% --              a row at a time, its page looked up a tile ahead), every thread's copies of a
% --              tile completing FULL. Consumers give the slot back on EMPTY.
% --   consumers  (warpgroups 1 and 2, `half` 0 and 1) share every tile:
% --                S = Q K^T      half h multiplies its half of d (Q's 64-column panels
% --                               [h QH, (h + 1) QH), and with an odd panel count 32 columns of
% --                               the last panel, held in registers) for all BN keys: m64nBN
% --                               products, which read as many bytes of Q as of K from shared
% --                               memory (split by keys instead, each would read all of Q for
% --                               half the keys: shared memory's bandwidth, not the tensor cores,
% --                               would bound S);
% --                meeting of S   half h owns keys [h KW, (h + 1) KW) (KW = BN / 2): each gives
% --                               the other its part of the other's keys through shared memory
% --                               (Xs, a region a half) and adds the other's part of its own;
% --                softmax        both halves agree on each row's new maximum (their tile maxima
% --                               meet in shared memory, Meet.max) and exponentiate their keys;
% --                               O is rescaled only where a warp's row maxima moved;
% --                P to shared    each half's P (16-bit A fragments, thread-indexed) goes to the
% --                               other's region of Xs, so both halves hold the whole tile's P;
% --                O += P V       half h adds into its DVH = DV / 2 value columns (O's
% --                               accumulators: 64 x 256 f32 at dv 512 is half a warpgroup's
% --                               registers), over all BN keys.
% --              At the end the halves' row sums meet (Meet.sum) and O leaves by shared memory.
% -- Both halves compute the same maxima (max is exact and commutative) and the same sums (a + b
% -- in the same order), so their columns agree on each row's scale. With v_in_k (MLA's latent
% -- cache, v a view of k's first dims) V is read from K's tile: no value copies.
% --
% -- Parameters: as attn_decode.lua (one 16-bit type), tile_m (64), tile_n (BN: 32, 64 or 128),
% -- stages (2..4), head_dim_pad (multiple of 64), head_dim_v_pad (multiple of 128, at most 512),
% -- v_in_k, warps (12), threads (384), partial, bulk, multicast (with bulk: the two row tiles of
% -- a kv head as a cluster pair over the keys of both tiles' band, each block's copies bringing
% -- half of a tile's panels into both; not varlen),
% -- overlap (software-pipelined: the next tile's S issued before this tile's P V, its softmax
% -- running while P V does), shared_bytes (fj__variant_shared_bytes), consumer_regs and
% -- producer_regs (fj__variant_consumer_registers, fj__variant_producer_registers).
% assert(backend == "cuda", "attn_decode_wgmma is a CUDA kernel")
% assert(threads == 384 and warps == 12,
%        "attn_decode_wgmma: a producer and two consumer warpgroups")
% assert(tile_m == 64, "attn_decode_wgmma: 64 packed rows per block")
% assert(tile_n == 32 or tile_n == 64 or tile_n == 128, "attn_decode_wgmma: tile_n 32, 64 or 128")
% assert(stages >= 2 and stages <= 4, "attn_decode_wgmma: 2 to 4 ring slots")
% assert(head_dim_pad % 64 == 0 and head_dim_v_pad % 128 == 0 and head_dim_v_pad <= 512,
%        "attn_decode_wgmma: d in 64-column panels, each half of dv whole panels of at most 256")
% assert(not v_in_k or head_dim_v_pad <= head_dim_pad,
%        "attn_decode_wgmma: v_in_k reads V inside K's rows")
% local half_dv = head_dim_v_pad // 2
% include("dialect.lua")
% include("cuda_mma.lua")
% include("cuda_hopper.lua")
% include("params.lua")
% include("sequence.lua")
% include("attn_decode_hopper.lua")
% params_struct(args)
% hopper_wgmma(tile_n)
% if half_dv ~= tile_n then hopper_wgmma(half_dv) end

/* ---- the variant, as constants ------------------------------------------------------------ */
constexpr int BM = 64, BN = ${tile_n}, KW = BN / 2;  /* packed rows; keys a tile, a half's keys */
constexpr int D = ${head_dim_pad}, DV = ${head_dim_v_pad}, DVH = DV / 2; /* padded head dims */
constexpr int STAGES = ${stages};
constexpr bool V_IN_K = ${v_in_k};
constexpr int THREADS = 384;
constexpr int CONSUMER_REGS = ${consumer_regs}, PRODUCER_REGS = ${producer_regs};
/* setmaxnreg moves registers within the block's launch allocation (64K / THREADS a thread, in
** steps of 8: 168); a consumer's increase waits until the producer's decrease covers it. */
constexpr int LAUNCH_REGS = 65536 / THREADS / 8 * 8;
static_assert(128 * PRODUCER_REGS + 256 * CONSUMER_REGS <= THREADS * LAUNCH_REGS,
              "the block's registers");
#define NEG_INF __int_as_float(0xff800000)

/* Q's 64-column panels: QH a half in shared memory; with an odd count the last one's 32 columns
** a half in registers (its k steps 2 half and 2 half + 1), which leaves MLA's 576 / 512 room for
** the exchange. */
constexpr int QPANELS = D / 64, QH = QPANELS / 2;
constexpr bool Q_ODD = QPANELS % 2 != 0;

/* ---- shared memory (from a 1024-byte boundary) --------------------------------------------- */
/* Q's shared panels, the halves' exchange, the ring, the meeting's row values and the barriers.
** Every tile is 64-column panels of rows x 128 bytes in the 128-byte swizzle (16-byte piece j
** of a row's panel at (j ^ row % 8) * 16); each ring slot K's tile [+ V's tile].
** Xs: region h is written by half h (its part of S over the other half's keys, [j][e][thread]),
** read by the other, which then writes its P into it ([k step][register][thread], the same
** words of the same threads), read by half h. A word is only ever written and read by the same
** thread index of each half, so one barrier a meeting orders it. Region 0 first receives Q's odd
** panel (the copies of Q's panels run on into it), which the consumers take into registers
** before the first meeting. */
constexpr int Q_BYTES = BM * QH * 2 * 128, K_BYTES = BN * D * 2;
constexpr int V_BYTES = V_IN_K ? 0 : BN * DV * 2, SLOT_BYTES = K_BYTES + V_BYTES;
constexpr int XS_WORDS = KW / 8 * 4 * 128; /* a region's: a thread's S over KW keys */
constexpr int XS_BYTES = 2 * 4 * XS_WORDS > (Q_ODD ? BM * 128 : 0) ? 2 * 4 * XS_WORDS : BM * 128;
struct Meet {
    float max[2][BM]; /* half h's row maxima of the tile (log2 units) */
    float sum[2][BM]; /* half h's row sums, at the end */
};
constexpr int XS_AT = Q_BYTES, RING_AT = XS_AT + XS_BYTES;
constexpr int MEET_AT = RING_AT + STAGES * SLOT_BYTES;
constexpr int BARS_AT = MEET_AT + (int)sizeof(Meet); /* FULL[STAGES], EMPTY[STAGES], QBAR */
static_assert(RING_AT % 1024 == 0, "the ring's panels on the swizzle's 1024-byte atoms");
static_assert(BARS_AT + 16 * STAGES + 8 + 1023 == ${shared_bytes},
              "the host's fj__variant_shared_bytes");

% -- The producer's parts, emitted in its lambda `produce` (warpgroup 0; `return` leaves it).
% -- copy_q(): Q's rows by cp.async, complete on QBAR.
% function copy_q()
%   decode_copy_q("warp", 4)
            cp_async_arrive(qbar);
% end
% -- copy_tiles_bulk(): lane 0 of warp 0 copies the tiles by bulk tensor copies (the other
% -- warps leave once their Q copies landed).
% function copy_tiles_bulk()
            if (warp != 0) {
                cp_async_wait_all(); /* no copy outlives its thread */
                return;
            }
            /* Lane 0 copies tile `tile` (its first key is lo + tile BN): K's panels, then V's. */
%   if paged then
            /* Its page is looked up a tile ahead: the table's latency off the copies' path. */
            auto page_of = [&](int tile) {
                return lane == 0 && tile < ntiles ? PAGE_NUMBER(div_by(page_div, lo + tile * BN))
                                                  : 0;
            };
            int next_page = page_of(0);
%   end
            for (int tile = 0; tile < ntiles; tile++) {
                const int s = tile % STAGES;
%   if paged then
                const int page = next_page, row = mod_by(page_div, lo + tile * BN);
                next_page = page_of(tile + 1);
%   else
                const int page = batch, row = lo + tile * BN;
%   end
                mbar_wait<${multicast}>(bars + 8 * (STAGES + s), ((tile / STAGES) & 1) ^ 1);
                if (lane == 0) {
                    const u32 sK = ring + s * SLOT_BYTES, full = bars + 8 * s;
                    mbar_arrive_expect(full, SLOT_BYTES);
%   if multicast then
                    /* Panels rank, rank + 2, ... of K's then V's, each into both blocks. */
                    load_panels<D>(sK, &T.tm_k, full, BN, row, head_kv, page, T.perm_k, 0, rank,
                                   2, 3);
%     if not v_in_k then
                    load_panels<DV>(sK + K_BYTES, &T.tm_v, full, BN, row, head_kv, page,
                                    T.perm_v, 0, (rank + D / 64) % 2, 2, 3);
%     end
%   else
                    load_panels<D>(sK, &T.tm_k, full, BN, row, head_kv, page, T.perm_k);
%     if not v_in_k then
                    load_panels<DV>(sK + K_BYTES, &T.tm_v, full, BN, row, head_kv, page, T.perm_v);
%     end
%   end
                }
                __syncwarp();
            }
            cp_async_wait_all();
            return;
% end
% -- copy_tiles_threads(): the four warps copy the tiles by cp.async, 16 bytes a piece.
% function copy_tiles_threads()
            /* A warp copies rows warp, warp + 4, ... of a tile, its lanes the row's pieces; rows
            ** past hi arrive as zeros (and are masked). */
% if paged then
            /* Paged: lane j looks up the page of the warp's row j (row warp + 4 j) a tile ahead
            ** (the table's latency off the copies' path); the copying lanes take it by shuffles. */
            static_assert(BN / 4 <= 32, "attn_decode_wgmma: a lane for each row a warp copies");
            auto page_of_row = [&](int tile) {
                const int key = lo + tile * BN + warp + 4 * lane;
                return lane < BN / 4 && key <= hi ? PAGE_NUMBER(div_by(page_div, key)) : 0;
            };
            int next_page = page_of_row(0);
% end
            for (int tile = 0; tile < ntiles; tile++) {
                const int s = tile % STAGES;
% if paged then
                const int row_page = next_page;
                next_page = page_of_row(tile + 1);
% end
                mbar_wait(bars + 8 * (STAGES + s), ((tile / STAGES) & 1) ^ 1);
                const u32 sK = ring + s * SLOT_BYTES;
                for (int r = warp; r < BN; r += 4) {
                    const int key = lo + tile * BN + r;
                    const bool in = key <= hi;
% if paged then
                    const int page = __shfl_sync(0xffffffffu, row_page, r / 4);
                    const I64 ko = in ? page_row(page, key, k_sb, k_ss) : 0;
% else
                    const I64 ko = in ? key_row(key, k_sb, k_ss) : 0;
% end
                    copy_row<D, true>(sK, BN, r, k + ko, in, head_dim, k, lane);
% if not v_in_k then
%   if paged then
                    const I64 vo = in ? page_row(page, key, v_sb, v_ss) : 0;
%   else
                    const I64 vo = in ? key_row(key, v_sb, v_ss) : 0;
%   end
                    copy_row<DV, true>(sK + K_BYTES, BN, r, v + vo, in, head_dim_v, v, lane);
% end
                }
                cp_async_arrive(bars + 8 * s);
            }
            cp_async_wait_all(); /* no copy outlives its thread */
% end

% decode_key_row()

% local cluster = multicast and "__cluster_dims__(2, 1, 1) " or ""
extern "C" __global__ void ${cluster}__launch_bounds__(THREADS, 1)
fj_attn_decode(
% params_arg(args, "T")
)
{
% decode_hopper_opening()
    const u32 sQ = base, ring = base + RING_AT, bars = base + BARS_AT;
    const u32 qbar = bars + 16 * STAGES; /* Q landed: each producer thread's copies */
    Meet &meet = *(Meet *)(smem + MEET_AT);
    const int tid = threadIdx.x, wg = __shfl_sync(0xffffffffu, tid / 128, 0);
    const int warp = (tid % 128) / 32, lane = tid % 32;
% decode_block("BM", true, multicast)
% if bulk and paged then
    lo = lo / BN * BN; /* a tile's box in one page (keys before the band are masked) */
% end
    const int ntiles = hi >= lo ? (hi - lo) / BN + 1 : 0;

    if (tid == 0) {
        for (int s = 0; s < STAGES; s++) {
            /* FULL: the bulk copies' bytes after one arrival, or each producer thread's copies */
            mbar_init(bars + 8 * s, ${bulk and 1 or 128});
            /* EMPTY: each consumer warp (multicast: of both blocks) */
            mbar_init(bars + 8 * (STAGES + s), ${multicast and 16 or 8});
        }
        mbar_init(qbar, 128);
        mbar_init_fence();
    }
% if multicast then
    /* Both blocks' barriers are set before either's copies or arrivals reach the other. */
    cluster_sync();
    const u32 rank = cluster_rank();
% else
    __syncthreads();
% end

    if (wg == 0) {
        /* ---- producer: Q, then a tile a free slot ---- */
        regs_dec<PRODUCER_REGS>();
        auto produce = [&]() {
% copy_q()
% if bulk then
% copy_tiles_bulk()
% else
% copy_tiles_threads()
% end
        };
        if (ntiles > 0)
            produce();
% if multicast then
        cluster_sync(); /* (the consumers' at the end) */
% end
        return;
    }

    /* ---- consumers ---- */
    regs_inc<CONSUMER_REGS>();
    const int half = wg - 1, ti = tid % 128;
    const int g = lane / 4, t = lane % 4;       /* row group and column pair of the fragments */
    const int r0 = warp * 16 + g, r1 = r0 + 8;  /* the thread's two rows of the tile */
% decode_row_positions()
    /* S: this half's panels of Q and K (all BN keys); P V: this half's value panels. */
    const u64 q_desc = gmma_desc(sQ + half * QH * BM * 128, 16, 1024);
    const u64 k_desc = gmma_desc(ring + half * QH * BN * 128, 16, 1024);
    const u64 v_desc = gmma_desc(ring + (V_IN_K ? 0 : K_BYTES) + half * (DVH / 64) * BN * 128,
                                 BN * 128, 1024);
    /* This half's two k steps of Q's odd panel (A fragments), taken at the first tile. */
    u32 q_odd[Q_ODD ? 2 : 1][4];
    /* The region this half writes its part of S to (and reads the other's P from), and the
    ** other's (Xs). */
    const u32 xs_mine = base + XS_AT + half * XS_WORDS * 4;
    const u32 xs_theirs = base + XS_AT + (1 - half) * XS_WORDS * 4;

    float o[DVH / 8][4], row_max[2] = {NEG_INF, NEG_INF}, row_sum[2] = {0.0f, 0.0f};
    zero_acc<DVH>(o);
    float sf[BN / 8][4]; /* this half's part of S over all the tile's keys */
    float sc[KW / 8][4]; /* S of this half's keys, then P */
    u32 pa[BN / 16][4];  /* the tile's P as A fragments: the first half's, then the second's */

    /* Q's odd panel into registers (the A fragments of k steps 2 half, 2 half + 1: rows r0, r1,
    ** columns 2t and 2t + 8 of each), before either half's first meeting overwrites it. */
    auto take_q_odd = [&]() {
        if constexpr (Q_ODD) {
            const u32 panel = base + XS_AT;
#pragma unroll
            for (int i = 0; i < 2; i++)
#pragma unroll
                for (int f = 0; f < 4; f++) {
                    const int r = f % 2 ? r1 : r0, c = (2 * half + i) * 16 + (f / 2) * 8 + 2 * t;
                    q_odd[i][f] = ld_shared_u32(swizzled_chunk(panel, BM, r, c / 8) + (c % 8) * 2);
                }
        }
        bar_sync(3, 256);
    };
    /* Tile `tile` landed in its slot: this half's part of S = Q K^T, issued (not waited for). */
    auto issue_s = [&](int tile) {
        const int s = tile % STAGES;
        if (tile == 0) {
            mbar_wait(qbar, 0);
            take_q_odd();
        }
        mbar_wait(bars + 8 * s, (tile / STAGES) & 1);
        fence_proxy_async(); /* the copies (generic proxy) before wgmma's reads (async proxy) */
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < QH * 4; kk++) {
            const u32 q_at = (kk / 4) * BM * 128 + (kk % 4) * 32;
            const u32 k_at = s * SLOT_BYTES + (kk / 4) * BN * 128 + (kk % 4) * 32;
            wgmma_ss_${tile_n}(&sf[0][0], q_desc + (q_at >> 4), k_desc + (k_at >> 4), kk > 0);
        }
        if constexpr (Q_ODD) {
            /* K's odd panel: k steps 2 half and 2 half + 1 (32 bytes each) */
            const u64 k_odd = gmma_desc(ring + s * SLOT_BYTES + 2 * QH * BN * 128 + half * 64,
                                        16, 1024);
#pragma unroll
            for (int i = 0; i < 2; i++)
                wgmma_rs_k_${tile_n}(&sf[0][0], q_odd[i], k_odd + ((i * 32) >> 4), QH > 0 || i > 0);
        }
        wgmma_commit();
    };
    /* The meeting of S (sf landed): this half's part of the other's keys to its region, the
    ** other's part of this half's keys added: sc, S of this half's keys. */
    auto meet_s = [&]() {
#pragma unroll
        for (int j = 0; j < KW / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                st_shared_u32(xs_mine + ((j * 4 + e) * 128 + ti) * 4,
                              __float_as_uint(half ? sf[j][e] : sf[KW / 8 + j][e]));
        bar_sync(3, 256);
#pragma unroll
        for (int j = 0; j < KW / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                sc[j][e] = (half ? sf[KW / 8 + j][e] : sf[j][e]) +
                           __uint_as_float(ld_shared_u32(xs_theirs + ((j * 4 + e) * 128 + ti) * 4));
    };
    /* O += P V over pa's k steps [k0, k1) into this half's columns, issued: pa's first KW / 16
    ** are this half's keys (V's rows from v_own), the rest the other half's (from v_other). */
    const u64 v_own = v_desc + ((half * KW * 128) >> 4);
    const u64 v_other = v_desc + (((1 - half) * KW * 128) >> 4);
    auto issue_pv = [&](int tile, int k0, int k1) {
        const u32 slot = (tile % STAGES) * SLOT_BYTES;
        wgmma_fence();
#pragma unroll
        for (int kk = k0; kk < k1; kk++) {
            const u64 rows = kk < KW / 16 ? v_own + ((slot + kk * 16 * 128) >> 4)
                                          : v_other + ((slot + (kk - KW / 16) * 16 * 128) >> 4);
            wgmma_rs_${half_dv}(&o[0][0], pa[kk], rows, 1);
        }
        wgmma_commit();
    };
    /* The softmax of tile `tile`'s S (landed in sc): in log2 units (soft-capped); keys past the
    ** split, and (causal, windows) outside the row's band, masked; the rows' new maxima agreed
    ** with the other half (the same in both); P in sc, its sums added; returns the factors O
    ** must be scaled by. */
    auto softmax = [&](int tile, float *alpha) {
        const int n0 = lo + tile * BN + half * KW;
        float mx[2] = {NEG_INF, NEG_INF};
% decode_scores("sc", "KW / 8")
        if (t == 0) {
            meet.max[half][r0] = mx[0];
            meet.max[half][r1] = mx[1];
        }
        bar_sync(1, 256); /* both halves' maxima */
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const int r = h ? r1 : r0;
            const float m = fmaxf(row_max[h], fmaxf(meet.max[0][r], meet.max[1][r]));
            /* A row with no key yet keeps max -inf; subtracting 0 then gives exp2(-inf) = 0. */
            const float b = m == NEG_INF ? 0.0f : m;
            alpha[h] = ex2(row_max[h] - b);
            row_max[h] = m;
            float sum = 0.0f;
#pragma unroll
            for (int j = 0; j < KW / 8; j++)
#pragma unroll
                for (int e = 2 * h; e < 2 * h + 2; e++) {
                    sc[j][e] = ex2(sc[j][e] - b);
                    sum += sc[j][e];
                }
            row_sum[h] = row_sum[h] * alpha[h] + sum; /* the quad's and halves' sums at the end */
        }
    };
    /* O's rows times alpha (scale_rows: skipped where the warp's rows kept their maxima). */
    auto rescale = [&](const float *alpha) { scale_rows<DVH>(o, alpha); };
    /* This half's P into pa's first k steps and to the other's region of Xs (the words this
    ** thread read its S from). */
    auto give_p = [&]() {
        pack_rows<KW / 16>(pa, sc);
#pragma unroll
        for (int kk = 0; kk < KW / 16; kk++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                st_shared_u32(xs_theirs + ((kk * 4 + i) * 128 + ti) * 4, pa[kk][i]);
    };
    /* Once both halves gave theirs, the other's P into pa's last k steps. */
    auto take_p = [&]() {
        bar_sync(2, 256);
#pragma unroll
        for (int kk = 0; kk < KW / 16; kk++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                pa[KW / 16 + kk][i] = ld_shared_u32(xs_mine + ((kk * 4 + i) * 128 + ti) * 4);
    };
    /* The slot is read (multicast: the other block's producer writes into it too, so both
    ** blocks' consumers free it). */
    auto release = [&](int tile) {
        const u32 empty = bars + 8 * (STAGES + tile % STAGES);
        warp_arrive(empty);
% if multicast then
        if (lane == 0)
            mbar_arrive_cluster(cluster_map(empty, rank ^ 1));
% end
    };
% if bulk and paged then
    /* The rows of a paged tile past the sequence's last key are whatever its last page holds
    ** there (a cache's unused rows: maybe not finite). Their P is 0, but 0 times NaN is not:
    ** each half zeroes its value columns of them once both halves' S has landed (after
    ** softmax's meeting), before the P meeting that precedes P V. */
    auto clear_tail = [&](int tile) {
        const int valid = seqlen_k - (lo + tile * BN);
        if (valid >= BN)
            return;
        zero_rows<BN, DVH>(ring + (tile % STAGES) * SLOT_BYTES + (V_IN_K ? 0 : K_BYTES), valid,
                           half * (DVH / 8), ti);
    };
% else
    auto clear_tail = [](int) {};
% end

% if overlap then
    /* Software-pipelined (as the forward's overlap): tile i's S is issued before tile i - 1's
    ** P V, and its softmax runs while P V does; O is rescaled and the next P shared once that
    ** product has landed. */
    float alpha[2];
    if (ntiles > 0) {
        issue_s(0);
        wgmma_wait<0>();
        fence_regs<BN / 2>(&sf[0][0]);
        meet_s();
        softmax(0, alpha);
        clear_tail(0);
        give_p();
        take_p();
    }
#pragma unroll 1
    for (int tile = 1; tile < ntiles; tile++) {
        issue_s(tile);
        issue_pv(tile - 1, 0, BN / 16);
        wgmma_wait<1>(); /* this tile's S; the last one's P V may run on */
        fence_regs<BN / 2>(&sf[0][0]);
        meet_s();
        softmax(tile, alpha);
        wgmma_wait<0>();
        fence_regs<DVH / 2>(&o[0][0]);
        fence_regs<BN / 4>(&pa[0][0]); /* pa stays untouched until its product has landed */
        release(tile - 1);
        rescale(alpha);
        clear_tail(tile);
        give_p();
        take_p();
        /* pinned here: writes of wgmma inputs moved past the next wgmma.fence serialise */
        fence_regs<DVH / 2>(&o[0][0]);
        fence_regs<BN / 4>(&pa[0][0]);
    }
    if (ntiles > 0) {
        issue_pv(ntiles - 1, 0, BN / 16);
        wgmma_wait<0>();
        fence_regs<DVH / 2>(&o[0][0]);
        release(ntiles - 1);
    }
% else
#pragma unroll 1
    for (int tile = 0; tile < ntiles; tile++) {
        issue_s(tile);
        wgmma_wait<0>();
        fence_regs<BN / 2>(&sf[0][0]);
        meet_s();
        float alpha[2];
        softmax(tile, alpha);
        rescale(alpha);
        clear_tail(tile);
        give_p();
        issue_pv(tile, 0, KW / 16); /* this half's keys while the other's P comes */
        take_p();
        issue_pv(tile, KW / 16, BN / 16);
        wgmma_wait<0>();
        fence_regs<DVH / 2>(&o[0][0]);
        release(tile);
    }
% end

    /* The rows' sums over both halves, then O normalised and stored through Q's and the ring's
    ** bytes. */
% decode_halves_store("meet.sum", "1", "smem", "MEET_AT")
% if multicast then
    cluster_sync(); /* no block ends while the other's arrivals may still reach it */
% end
}
