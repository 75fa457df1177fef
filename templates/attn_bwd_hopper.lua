% -- The parts that Hopper's dk/dv kernels share (attn_bwd_wgmma.cu.lua, whose warpgroups own 64
% -- keys each, and attn_bwd_wgmma_split.cu.lua, whose two warpgroups share 64 keys and split
% -- their columns), so that the shared-memory tiles, the ring of streamed Q and dO tiles and the
% -- dQ products are spelled once. Both kernels declare what these parts read: BM, BN, DP, DVP,
% -- THREADS; in the kernel body the ring's slots (sQG, QG_BYTES, Q_BYTES, sLD, STAGES), the
% -- mbarriers (`bar(kind, i)` with KV_FULL, FULL and EMPTY, and `freed`), the block's keys (n0,
% -- head_kv, sK, sV, K_BYTES, V_BYTES) and the stream (bwd_dkdv_stream, live_from, `tb`).
% -- It includes the helpers it reads (cuda_mma.lua, cuda_hopper.lua, cuda_attn_common.lua) and
% -- attn_bwd_tc.lua.
% --
% -- With `producer` (the variant's), warpgroup 0 only copies: it gives its registers to the
% -- others (setmaxnreg), and its first warp fills every slot as the computing warpgroups free
% -- it. Without, every warpgroup computes, and the warp that frees a slot last refills it.
% -- Either way `wg` counts the computing warpgroups from 0 (the producer's is -1), and
% -- COMPUTE_THREADS are theirs.
% include("cuda_mma.lua")
% include("cuda_hopper.lua")
% include("cuda_attn_common.lua")
% include("attn_bwd_tc.lua")

% -- The family's block in the kernel's argument `args`: the argument itself, or its `bwd` field
% -- where the argument adds the tensor maps (fj_bwd_tma_params, the dk/dv stage).
% function bwd_family(args)
%   return params_block(args, "bwd")
% end

% -- The wgmma products of the given widths (N; nil entries and repeats skipped), the tile macros
% -- (BM, BN, DP, DVP, THREADS) and the constants every kernel reads.
% function bwd_hopper_prelude(widths)
%   local seen = {}
%   for i = 1, 4 do
%     local n = widths[i]
%     if n and not seen[n] then seen[n] = true; hopper_wgmma(n) end
%   end

% mma_tile_macros()
/* Warpgroup 0 only copies (a producer), and the threads that compute. */
constexpr int PRODUCER = ${producer and 1 or 0}, COMPUTE_THREADS = THREADS - 128 * PRODUCER;
/* The bytes after the tiles for the mbarriers, the slots' counts and (dq_turns) the turns of
** the slots' tiles (the host's fj__variant_shared_bytes counts them). */
constexpr int BAR_BYTES = ${dq_turns and 256 or 128};
#define NEG_INF __int_as_float(0xff800000)
#define POS_INF __int_as_float(0x7f800000)
#define LOG2E 1.4426950408889634f
% end

% -- Shared-memory tiles: 64-column panels of rows x 128 bytes, 16-byte chunk c of row r stored
% -- at chunk c ^ (r % 8) (the 128-byte swizzle, the layout wgmma reads and TMA writes; an
% -- element's address: cuda_hopper.lua's swizzled).
% function bwd_hopper_tiles()
%   if varlen > 0 then

/* The named barrier of the computing threads after zero_rows (the kernels' own take 1 and 2). */
constexpr int ZEROS_BARRIER = 3;

/* Packed sequences: zeroes rows [from, ROWS) of a swizzled tile of COLS columns, which the bulk
** copies read from the next sequence (past a tensor's end they read zeros), by the computing
** threads; then zeros_before_wgmma(). Scores of those rows are masked, but a product with them
** would carry any NaN or inf they hold into the gradients. */
template <int ROWS, int COLS>
__device__ __forceinline__ void zero_rows(u32 tile, int from)
{
    constexpr int CHUNKS = COLS / 8; /* 16-byte chunks a row: 8 a panel */
#pragma unroll 1
    for (int i = threadIdx.x - 128 * PRODUCER + imax(from, 0) * CHUNKS; i < ROWS * CHUNKS;
         i += COMPUTE_THREADS) {
        const int r = i / CHUNKS, c = i % CHUNKS;
        st_shared_zero16(tile + (c / 8) * (ROWS * 128) + r * 128 + (c % 8) * 16);
    }
}
__device__ __forceinline__ void zeros_before_wgmma()
{
    fence_proxy_async(); /* the zeros are read by wgmma (the async proxy) */
    bar_sync(ZEROS_BARRIER, COMPUTE_THREADS);
}
%   end
% end

% -- dS for dQ = dS K: dS^T of a warp's keys (accumulators turned A fragments) stored transposed
% -- into a swizzled tile of BM query rows by the block's keys, and one 64 x 64 piece of the
% -- product.
% function bwd_hopper_dq_parts()
/* dS^T of a warp (A fragments of its 16 keys from key0 by 16 KB queries) into the swizzled tile
** `tile` as dS (query rows by the block's keys), by transposing matrix stores: register r of
** k16 block kk holds the 8 x 8 matrix of keys key0 + 8 (r % 2) + [0, 8) by queries
** 16 kk + 8 (r / 2) + [0, 8), whose query rows take 16 bytes (8 keys, one swizzle chunk) each. */
template <int KB>
__device__ __forceinline__ void store_ds_transposed(u32 tile, const u32 (*dsf)[4], int key0, int lane)
{
    const int m = lane / 8; /* the matrix whose row lane % 8 this lane addresses */
    const u32 at = swizzled(tile, BM, 8 * (m / 2) + lane % 8, key0 + 8 * (m % 2));
#pragma unroll
    for (int kk = 0; kk < KB; kk++)
        stmatrix_x4_trans(at + kk * 16 * 128, dsf[kk]); /* 16 rows on: the same swizzle */
}

/* dQ = dS K of a tile in pieces of 64 rows (block rb) by 64 columns (panel cp). */
constexpr int ROW_BLOCKS = BM / 64, DQ_PIECES = ROW_BLOCKS * (DP / 64);

/* A piece's product into acc: dS in sDS (K-major over the block's keys), K N-major. */
__device__ __forceinline__ void dq_piece(float (*acc)[4], u32 sDS, u32 sK, int piece)
{
    const int rb = piece % ROW_BLOCKS, cp = piece / ROW_BLOCKS;
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < BN / 16; kk++)
        wgmma_ss_t_64(&acc[0][0], gmma_kmajor(sDS + rb * 64 * 128, BM, kk),
                      gmma_nmajor(sK + cp * BN * 128, BN, kk), kk > 0);
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs<32>(&acc[0][0]);
}
% end

% -- dq_turns (deterministic, one sum): the key blocks of a (batch, kv head) add a query tile's
% -- dQ in turns, in key-block order, counted per (batch, head) and query tile in P.dq_turns
% -- (zeroed by the plan). Each computing warp adds one to a tile's count once its additions of
% -- the tile landed; key block j's turn comes when the count reaches the computing warps' share
% -- of every key block before it whose band reaches the tile (bwd_dkdv_stream's first_block:
% -- the bands' ends do not decrease, so those are contiguous). The producer's filling warp
% -- also keeps the turns: it notes each tile's count and due value as it fills the tile's slot
% -- (turn_idx, turn_due), and before it waits to refill a slot it takes the turns of the tiles
% -- up to the slot's (waits for each in the stream's order and arrives on TURN, buffer n % 2 as
% -- dS's), so the computing warps only wait on an mbarrier; no warp of its own (whose branch
% -- made the producer's warpgroup spill at 24 registers). A computing warp settles a tile's
% -- turn two tiles later (one where its tiles' bulk groups differ in number) so that it seldom
% -- waits for its additions to land, and at its item's end; key blocks then run about two tiles
% -- apart. No turn waits for a later key block, and a block takes its key blocks in order, so
% -- the oldest key block at work can always go on.
% -- bwd_hopper_turns(): the computing warps' part, in the item before the dQ additions:
% -- settle_turns(all) before a tile's additions (all: at the item's end) and take_turn(head,
% -- m0) once its turn came. bwd_hopper_turn_keeper(): the filling warp's part, `note_turn(i, n)`
% -- as it fills stream item i as the block's tile n and `keep_through(m)`, which takes the
% -- turns of the block's tiles before m. Opt-in (the plan's dq_turns; bench/RESULTS.md says
% -- why).
%
% -- The index in P.dq_turns of the count of query tile m0 (C expressions) of query head head.
% local function turn_at(head, m0)
%   return "(batch * heads_q + " .. head .. ") * ((seqlen_q + BM - 1) / BM) + " .. m0 .. " / BM"
% end
% function bwd_hopper_turns()
    /* The counts of the warp's tiles whose turns are not settled: its last (turn_last) and, where
    ** it adds each tile in the same number of bulk groups (TILE_GROUPS), the one before
    ** (turn_older), so that it waits only for the additions a tile older than its last. */
    constexpr int TILE_GROUPS = DQ_PIECES % NWG == 0 ? DQ_PIECES / NWG : 0;
    int turn_last = -1, turn_older = -1;
    auto settle = [&](int turn) { /* after the additions of tile `turn` landed */
        if (turn >= 0 && lane == 0) {
            fence_proxy_async_global(); /* (made by the async proxy) before the count moves */
            red_release_add(P.dq_turns + turn, 1);
        }
    };
    /* Before a tile's additions: settles the turns whose additions are due to have landed
    ** (with `all`, every turn: the item's end). */
    auto settle_turns = [&](bool all) {
        if (lane == 0) {
            if (TILE_GROUPS > 0 && !all)
                bulk_wait<TILE_GROUPS>();
            else
                bulk_wait<0>();
        }
        settle(turn_older);
        turn_older = -1;
        if (TILE_GROUPS == 0 || all) {
            settle(turn_last);
            turn_last = -1;
        }
    };
    /* Query tile m0 of query head `head`, whose turn came, is the warp's last. */
    auto take_turn = [&](int head, int m0) {
        turn_older = turn_last;
        turn_last = ${turn_at("head", "m0")};
    };
% end

% function bwd_hopper_turn_keeper()
            /* Slot s's tile's turn: its count's index at turns + 4 s, its due value 4 STAGES bytes
            ** on (noted as the slot is filled; shared addresses, which take one register). */
            const u32 turns = bars + 8u * BARS + 4u * STAGES;
            int kept = 0; /* the block's tiles whose turn came */
            auto keep_through = [&](int m) {
                for (; kept < m; kept++) {
                    if (kept >= 2) /* the computing warps are past tile kept - 2's turn */
                        mbar_wait(bar(DS_EMPTY, kept & 1), ((kept >> 1) & 1) ^ 1);
                    if (lane == 0) {
                        const u32 at = turns + 4u * (u32)(kept % STAGES);
                        const int *count = P.dq_turns + ld_shared_u32(at);
                        const int due = (int)ld_shared_u32(at + 4u * STAGES);
                        while (ld_acquire(count) < due)
                            __nanosleep(32);
                        mbar_arrive(bar(TURN, kept & 1));
                    }
                    __syncwarp();
                }
            };
% end

% -- ---- the block ----------------------------------------------------------------------------
% -- bwd_hopper_shared(family): the family's parameters (P, the `bwd` block of the kernel's
% -- argument T, whose layout is `family`, unpacked), the shared memory (aligned to 1024 bytes:
% -- smem, sK, sV, the ring's sQG and sLD, the mbarriers `bar(kind, i)` and the slots' counts
% -- `freed`), then the thread's warpgroup, warp and lane. Goes first in the kernel body.
% function bwd_hopper_shared(family)
    const fj_bwd_params &P = T.bwd;
% params_unpack(family.fields[1].block, "P.fwd", bwd_unpack_names())
    const float scale = P.scale;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    unsigned char *smem = smem_raw + ((1024u - (smem_addr(smem_raw) & 1023u)) & 1023u);
    const u32 sK = smem_addr(smem), sV = sK + K_BYTES;
    const u32 sQG = sK + RING_OFFSET; /* slot s: Q at sQG + s * QG_BYTES, dO Q_BYTES after it */
    float *sLD = (float *)(smem + LD_OFFSET); /* slot s: lse at sLD + 2 * BM * s, D BM after */
    const u32 bars = sK + BAR_OFFSET;
    auto bar = [&](int kind, int i) { return bars + 8u * (u32)(kind + i); };
    int *freed = (int *)(smem + BAR_OFFSET + BARS * 8); /* slot s: warps done with it */

    /* The computing warpgroup (-1: the producer), broadcast from lane 0 so that ptxas keeps what
    ** derives from it uniform. */
    const int tid = threadIdx.x, wg = __shfl_sync(0xffffffffu, tid / 128, 0) - PRODUCER;
    const int warp = (tid % 128) / 32, lane = tid % 32;
% end

% -- The block's work items: with `persistent` (a grid of fewer blocks than items) every
% -- gridDim.x-th of the P.key_blocks * heads_kv * batches items, or where the grid spans the kv
% -- heads and batches (deterministic plans: slice blockIdx.x of dQ's sum is then the block's
% -- alone) of the P.key_blocks of its own (bwd_dkdv_block's order); else the one item that
% -- blockIdx names. bwd_hopper_items() opens the loop (or scope) that bwd_hopper_item() goes
% -- first in.
% function bwd_hopper_items()
%   if persistent > 0 then
    for (int w = blockIdx.x; w < P.key_blocks * (heads_kv * batches / (gridDim.y * gridDim.z));
         w += gridDim.x) {
%   else
    { /* the block's one item */
%   end
% end

% -- An item's keys, sequence, stream and block classes, `next_live(i)` (without a producer) and
% -- `tb`, the tensors' batch. `computing`: for the computing warpgroups, else the producer's.
% -- The computing warpgroups find live tiles by a vote where a producer gave them its
% -- registers; the producer (24 registers: the vote spilled 4-12 bytes there) and a kernel
% -- without a producer (its computing threads at the 255 cap) walk one tile at a time.
% function bwd_hopper_item(computing)
% bwd_dkdv_block(persistent > 0 and "w" or nil)
% bwd_block_classes()
% bwd_live_from(producer and computing)
%   if not producer then
    auto next_live = [&](int i) { return i < count ? live_from(i + 1) : count; };
%   end
    const int tb = ${varlen > 0 and "0" or "batch"}; /* the tensors' batch (packed: one) */
% end

% -- ---- the ring: slots of Q and dO tiles, each guarded by a full and an empty mbarrier ----
% -- A slot is filled by one warp: Q and dO by bulk tensor copies (TMA) from its lane 0, the rows'
% -- lse2 and D (stage 1 writes both) by cp.async, a word a lane. With a producer its first warp
% -- copies K and V and fills every slot; without, the first warp copies K and V and fills the
% -- first slots, and after that the warp that frees a slot last refills it with the tile
% -- `STAGES` on.

% -- `fill(i, n)`: fills slot n % STAGES with stream item i, by the calling warp.
% function bwd_hopper_ring_fill()
    /* Fills slot n % STAGES with stream item i, by the calling warp: Q and dO by bulk copies
    ** from lane 0, the rows' lse2 and D (zeros past the rows) a word a lane. */
    auto fill = [&](int i, int n) {
        const int slot = n % STAGES, head = item_head(i), m0 = item_m0(i);
        const u32 sQ = sQG + slot * QG_BYTES;
        if (lane == 0) {
            mbar_arrive_expect(bar(FULL, slot), QG_BYTES);
            load_panels<DP>(sQ, &T.tm_q, bar(FULL, slot), BM, q_first + m0, head, tb, T.perm_q);
            load_panels<DVP>(sQ + Q_BYTES, &T.tm_do, bar(FULL, slot), BM, q_first + m0, head, tb,
                             T.perm_do);
        }
        const long long rows = (long long)(batch * heads_q + head) * d_rows + m0;
#pragma unroll 1
        for (int r = lane; r < 2 * BM; r += 32) {
            const bool ok = m0 + r % BM < seqlen_q;
            cp_async4(smem_addr(sLD + 2 * BM * slot + r), (r < BM ? P.lse2 : P.delta) + rows + r % BM,
                      ok ? 4 : 0);
        }
        cp_async_arrive(bar(FULL, slot));
    };
    /* K and V by bulk copies from the calling thread. */
    auto load_kv = [&]() {
        mbar_arrive_expect(bar(KV_FULL, 0), K_BYTES + V_BYTES);
        load_panels<DP>(sK, &T.tm_k, bar(KV_FULL, 0), BN, k_first + n0, head_kv, tb, T.perm_k);
        load_panels<DVP>(sV, &T.tm_v, bar(KV_FULL, 0), BN, k_first + n0, head_kv, tb, T.perm_v);
    };
% end

% -- The barriers' setup (`barriers_extra()`: the kernel's own, by thread 0). Goes after
% -- bwd_hopper_shared().
% function bwd_hopper_barriers(barriers_extra)
    /* In runs (deterministic plans) a run launches while the one before it ends: it reads stage
    ** 1's D and lse2 at once (the first run waits for them) and waits for the run before it
    ** before its first dQ addition. */
    if (P.key_block0 == 0)
        grid_wait_previous();
    grid_launch_next();
    if (tid == 0) {
        mbar_init(bar(KV_FULL, 0), 1);
%   if persistent > 0 then
        mbar_init(bar(KV_EMPTY, 0), COMPUTE_THREADS);
%   end
        for (int s = 0; s < STAGES; s++) {
            mbar_init(bar(FULL, s), 1 + 32);
            mbar_init(bar(EMPTY, s), COMPUTE_THREADS);
            freed[s] = 0;
        }
%   if barriers_extra then barriers_extra() end
        mbar_init_fence();
    }
    __syncthreads();
% end

% -- The producer's warpgroup (with `producer`): its first warp fills slot n % STAGES with the
% -- block's n-th live tile once the computing threads freed the slot's previous one, and copies
% -- K and V of the block's first item with work before its tiles (the computing threads wait
% -- for them first), and of each later item after the item's first STAGES tiles (whose slots
% -- the last item's tiles free, so they load while the last item ends), once the computing
% -- threads are done with the last item's K and V (KV_EMPTY, persistent). Then it leaves, and
% -- the computing warpgroups take its registers (`consumer_regs`). Goes after
% -- bwd_hopper_barriers().
% function bwd_hopper_producer()
    if (wg < 0) {
        regs_dec<${producer_regs}>();
        if (warp == 0) {
            int n = 0, kv_loads = 0; /* the block's tiles and K/V copies so far */
%   if dq_turns then
% bwd_hopper_turn_keeper()
%   end
% bwd_hopper_items()
% bwd_hopper_item(false)
% bwd_hopper_ring_fill()
                const int n_first = n; /* the item's first tile */
                auto fill_next = [&](int i) {
%   if dq_turns then
                    /* (the slot's last tile may need its turn before the slot is freed) */
                    keep_through(n - STAGES + 1);
%   end
                    if (n >= STAGES)
                        mbar_wait(bar(EMPTY, n % STAGES), (n / STAGES - 1) & 1);
%   if dq_turns then
                    if (lane == 0) { /* tile n's turn, taken STAGES tiles later */
                        const int head = item_head(i), m0 = item_m0(i);
                        const u32 at = turns + 4u * (u32)(n % STAGES);
                        st_shared_u32(at, (u32)(${turn_at("head", "m0")}));
                        st_shared_u32(at + 4u * STAGES,
                                      (u32)((COMPUTE_THREADS / 32) * (n0 / BN - first_block(m0))));
                    }
%   end
                    fill(i, n++);
                };
                auto copy_kv = [&]() {
                    if (lane == 0)
                        load_kv();
                    kv_loads++;
                };
                /* (n_first == 0: no item before this one had tiles, so no K and V are in use) */
                int i = live_from(0);
                if (n_first == 0 && i < count)
                    copy_kv();
                for (; i < count && n < n_first + STAGES; i = live_from(i + 1))
                    fill_next(i);
                if (n > n_first && n_first > 0) {
%   if dq_turns then
                    keep_through(n_first); /* the last item's tiles add with its K */
%   end
%   if persistent > 0 then
                    mbar_wait(bar(KV_EMPTY, 0), (kv_loads - 1) & 1);
%   end
                    copy_kv();
                }
                for (; i < count; i = live_from(i + 1))
                    fill_next(i);
            }
%   if dq_turns then
            keep_through(n);
%   end
            cp_async_wait_all(); /* its lse2 and D copies landed before the warp leaves */
        }
        return;
    }
    regs_inc<${consumer_regs}>();
% end

% -- Without a producer: the first warp copies K and V and fills the first slots; declares
% -- `refill`, the item that the next freed slot takes. Goes after `i`, the first live item.
% function bwd_hopper_first_fills()
    int refill = i;
    for (int n = 0; n < STAGES; n++) {
        if (tid < 32 && refill < count) {
            if (n == 0 && lane == 0)
                load_kv();
            fill(refill, n);
        }
        refill = next_live(refill);
    }
% end

% -- The computing warpgroups' start of the block, after bwd_hopper_barriers(): the producer's
% -- warpgroup (with `producer`) goes its own way; the block's tiles `n` and K/V copies so far;
% -- the items' loop opened (bwd_hopper_items) with the item's parts, `fill`, `load_kv` and `i`,
% -- the item's first live stream item; without a producer, the first fills.
% function bwd_hopper_computing()
%   if producer then
% bwd_hopper_producer()
%   end

    int n = 0, kv_loads = 0; /* the block's tiles and K/V copies so far */
% bwd_hopper_items()
% bwd_hopper_item(true)
% bwd_hopper_ring_fill()
    int i = live_from(0);
%   if not producer then
% bwd_hopper_first_fills()
%   end
% end

% -- Waits for K and V (where the item has work: the block's `kv_loads`-th copy, counted),
% -- zeroing the keys past seqlen_k.
% function bwd_hopper_kv_wait()
    if (i < count) {
        mbar_wait(bar(KV_FULL, 0), kv_loads & 1);
        kv_loads++;
%   if varlen > 0 then
        if (n0 + BN > seqlen_k) { /* keys of the next sequence, or unused (seqused_k) */
            zero_rows<BN, DP>(sK, seqlen_k - n0);
            zero_rows<BN, DVP>(sV, seqlen_k - n0);
            zeros_before_wgmma();
        }
%   end
    }
% end

% -- Stream item i, the block's n-th tile: its slot, head and first query row m0, the masks'
% -- context and block class, its Q (sQ) and dO (sG) tiles and the rows' lse2 (sL) and D (sD)
% -- from row `rows_from` of the tile (a C expression; default 0); then waits for the slot,
% -- zeroing rows past seqlen_q. Goes first in the stream's loop.
% function bwd_hopper_tile(rows_from)
        const int slot = n % STAGES, head = item_head(i), m0 = item_m0(i);
% bwd_mask_ctx("head")
%   if block_mask then
        const int block_class = block_class_of(head, m0, n0);
%   end
        const u32 sQ = sQG + slot * QG_BYTES, sG = sQ + Q_BYTES;
        const float *sL = sLD + 2 * BM * slot${rows_from and " + " .. rows_from or ""}, *sD = sL + BM;
        mbar_wait(bar(FULL, slot), (n / STAGES) & 1);
%   if varlen > 0 then
        if (m0 + BM > seqlen_q) { /* rows of the next sequence */
            zero_rows<BM, DP>(sQ, seqlen_q - m0);
            zero_rows<BM, DVP>(sG, seqlen_q - m0);
            zeros_before_wgmma();
        }
%   end
% end

% -- Frees slot `slot` of tile n once the thread's products have read it (their wgmma waited
% -- for); without a producer, refills it from the warp that frees it last.
% function bwd_hopper_slot_release()
        mbar_arrive(bar(EMPTY, slot));
%   if not producer then
        /* The warp that frees the slot last refills it (its wait returns at once: every thread
        ** arrived before its warp counted itself; it orders their reads before the copies). */
        __syncwarp();
        int last = 0;
        if (lane == 0)
            last = atomicAdd(&freed[slot], 1) == THREADS / 32 - 1;
        if (__shfl_sync(0xffffffffu, last, 0)) {
            if (lane == 0)
                freed[slot] = 0;
            if (refill < count) {
                mbar_wait(bar(EMPTY, slot), (n / STAGES) & 1);
                fill(refill, n + STAGES);
            }
        }
        refill = next_live(refill);
%   end
% end
