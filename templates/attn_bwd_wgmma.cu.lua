% -- The backward's tensor-core stages on Hopper (sm_90a): attn_bwd_mma.cu.lua's two kernels with
% -- their products on wgmma, warpgroup-wide and asynchronous, operands read from shared memory
% -- by the tensor cores rather than by every warp through ldmatrix.
% --
% -- Stage 2, dkdv: a block owns BN = 64 * NWG keys of one (batch, kv head), 64 per warpgroup,
% -- and streams tiles of BM query rows of every query head of the group through a ring of
% -- `stages` shared-memory slots, each guarded by a full and an empty mbarrier. A slot is filled
% -- by one warp: Q and dO by bulk tensor copies (TMA) from its lane 0, the rows' lse2 and D
% -- (stage 1 writes both) by cp.async, a word a lane (attn_bwd_hopper.lua's ring). With
% -- `producer`, a warpgroup of its own copies and gives its registers to the two computing
% -- warpgroups (240 each: the light element passes fit; the plan chooses). Without, the first
% -- warp fills the first slots (and copies K and V), the warp that frees a slot last refills it
% -- with the tile `stages` on, and each thread keeps all of its 255 registers, which the
% -- element passes with masks and score terms need beside dK's and dV's. Per tile, each
% -- computing warpgroup:
% --   S^T = K Q^T, dP^T = V dO^T    wgmma, both operands from shared memory
% --   P^T, dS^T                     attn_bwd_tc.lua's element pass, in registers
% --   dV += P^T dO, dK += dS^T Q    wgmma with P^T and dS^T from registers (the accumulator
% --                                 layout is the A-operand layout), dO and Q transposed
% -- and with dQ (grads 4) writes dS^T transposed (matrix stores) into one of two dS buffers,
% -- so that the block's dQ = dS K (BM x DP: pieces of 64 x 64 dealt to the warpgroups, K
% -- transposed) is added into the f32 workspace: each warp stages its rows of a piece in shared
% -- memory and adds them by two bulk tensor reductions (tm_dq_acc; no per-element atomics), into
% -- slice blockIdx.x of the sum (one slice: slice 0; deterministic plans: a launch, or run, adds
% -- each element of a slice once, and runs follow each other; or, with dq_turns, the key blocks
% -- add each query tile into the one sum in turns, attn_bwd_hopper.lua's bwd_hopper_turns). A
% -- tile's dQ runs in the next tile's iteration, once its dS is whole: the warpgroups meet only
% -- there and at the slots (mbarriers, no block barrier), so they drift apart and one's element
% -- pass runs under the other's products. Packed sequences: rows that the bulk copies read from
% -- the next sequence are zeroed before any product reads them.
% -- Stage 3, dq (deterministic requests whose dk/dv stage runs on mma.sync, where the bulk
% -- copies cannot read the tensors): a block owns BM = 64 * NWG query rows of one (batch,
% -- head), 64 per warpgroup, and streams tiles of BN keys (two buffers): S = Q K^T and
% -- dP = dO V^T from shared memory, P and dS in registers, dQ += dS K with K transposed.
% -- Everything in shared memory is in 64-column panels with the 128-byte swizzle (the layout
% -- wgmma reads; the copies swizzle their 16-byte chunks), so head dims are padded to 64.
% --
% -- Serves what attn_bwd_mma.cu.lua serves (the element passes, the streams and the stores are
% -- shared: attn_bwd_tc.lua), for d and dv padded to at most 128; dK and dV in one launch.
% --
% -- Parameters: dtypes (one 16-bit type), head_dim_pad, head_dim_v_pad (multiples of 64, at most
% -- 128), stage (2 or 3), warps (4 * NWG, and 4 more with producer), producer (stage 2, NWG 2)
% -- with consumer_regs and producer_regs, stages (stage 2's ring), tile_m and tile_n (stage 2:
% -- BM 64 or 128, BN 64 * NWG; stage 3: BM 64 * NWG, BN a multiple of 16), grads (stage 2: 3,
% -- or 7 with dQ), local_mask, softcap, block_mask, varlen, the masks' and score terms'
% -- (attn_masks.lua), dq_turns (stage 2, persistent), shared_bytes (the host's size), args
% -- (stage 2: fj_bwd_tma_params, the family's block with the tensor maps; stage 3:
% -- fj_bwd_params).
% assert(stage == 2 or stage == 3, "attn_bwd_wgmma: stage 2 (dkdv) or 3 (dq)")
% local NWG = warps // 4 - (producer and 1 or 0) -- the computing warpgroups
% local owned = stage == 2 and tile_n or tile_m -- the block's own rows: keys, or query rows
% assert(warps % 4 == 0 and NWG >= 1 and NWG <= 3 and owned == 64 * NWG, "attn_bwd_wgmma: 64 rows a warpgroup")
% assert(stage == 3 or tile_m == 64 or tile_m == 128, "attn_bwd_wgmma: tile_m 64 or 128")
% assert(stage == 3 or (stages >= 2 and stages <= 4), "attn_bwd_wgmma: stage 2 takes a ring of 2 to 4 slots")
% assert(not producer or (stage == 2 and NWG == 2), "attn_bwd_wgmma: a producer for stage 2's two computing warpgroups")
% assert(stage == 2 or (tile_n % 16 == 0 and tile_n <= 256), "attn_bwd_wgmma: tile_n a multiple of 16")
% assert(head_dim_pad % 64 == 0 and head_dim_v_pad % 64 == 0 and head_dim_pad <= 128 and head_dim_v_pad <= 128, "attn_bwd_wgmma: head dims padded to 64, at most 128")
% assert((stage == 2 and (grads == 3 or grads == 7)) or (stage == 3 and grads == 0), "attn_bwd_wgmma: dK and dV, and dQ added into the workspace or not")
% assert(not dq_turns or (stage == 2 and producer and persistent > 0 and grads == 7 and not block_mask and varlen == 0 and stages <= 3), "attn_bwd_wgmma: turns for a persistent dk/dv stage with a producer adding dQ, every tile of the band streamed, dense")
% local want_dq = grads >= 4
% include("attn_bwd_hopper.lua")
% -- Stage 2's element pass in two halves around the products (P^T beside dP^T's, dS^T beside
% -- dV's) where the plan asks for it (`overlap`) and dS^T needs only P^T, dP^T and D
% -- (attn_bwd_tc.lua); otherwise in one pass after both.
% local overlap_elements = stage == 2 and overlap and bwd_ds_from_p_only()
% include("params.lua")
% params_struct(args)
% local family = bwd_family(args)
% -- The products' widths: the streamed rows (S^T, dP^T by query rows; S, dP by keys), the head
% -- dims, and 64 (dQ's pieces).
% local streamed = stage == 2 and tile_m or tile_n
% bwd_hopper_prelude({ streamed, head_dim_pad, head_dim_v_pad, want_dq and 64 or nil })
constexpr int NWG = ${NWG}; /* warpgroups, 64 rows each: keys (stage 2), query rows (3) */

% if stage == 2 then
constexpr int STAGES = ${stages}; /* ring slots of Q and dO tiles */

/* ---- shared memory ------------------------------------------------------------------------- */
/* Tiles are 64-column panels of rows x 128 bytes, 16-byte chunk c of row r stored at chunk
** c ^ (r % 8) (the 128-byte swizzle): K [BN][DP], V [BN][DVP], the ring's slots of Q [BM][DP]
** and dO [BM][DVP], with dQ two buffers of dS [BM][BN] (panel w: warpgroup w's keys) and each
** warp's staged rows of a dQ piece (two boxes of [16][32] floats, swizzled alike: the boxes of
** tm_dq_acc), then the slots' lse (log2 units) and D, [BM] floats each, the mbarriers, the
** slots' counts of warps that freed them and (dq_turns) their tiles' turns (BAR_BYTES in all).
** Panels and boxes start 1024-byte aligned. */
constexpr int K_BYTES = BN * DP * 2, V_BYTES = BN * DVP * 2;
constexpr int Q_BYTES = BM * DP * 2, QG_BYTES = Q_BYTES + BM * DVP * 2;
constexpr int DS_BYTES = ${want_dq and "BM * BN * 2" or "0"};
constexpr int DQ_WARP_BYTES = 16 * 64 * 4; /* a warp's staged rows of a piece: two boxes */
constexpr int DQ_BYTES = ${want_dq and "4 * DQ_WARP_BYTES" or "0"};
constexpr int RING_OFFSET = K_BYTES + V_BYTES, DS_OFFSET = RING_OFFSET + STAGES * QG_BYTES;
constexpr int DQ_OFFSET = DS_OFFSET + 2 * DS_BYTES, LD_OFFSET = DQ_OFFSET + NWG * DQ_BYTES;
constexpr int BAR_OFFSET = LD_OFFSET + STAGES * 8 * BM;
static_assert(BAR_OFFSET + BAR_BYTES + 1023 == ${shared_bytes}, "the host's shared-memory size");
static_assert(DQ_OFFSET % 1024 == 0, "the staged boxes' swizzle starts at 1024-byte boundaries");

/* The mbarriers by kind, 8 bytes each from BAR_OFFSET: a kind of n takes n consecutive words. */
enum Bar : int {
    KV_FULL = 0,              /* K and V landed: bulk copies */
    KV_EMPTY = 1,             /* (persistent) the item's K and V are read: every computing thread */
    FULL = 2,                 /* slot s holds its tile (bulk copies) and its rows' lse2 and D
                              ** (one arrival per lane of the warp that filled it) */
    EMPTY = FULL + STAGES,    /* slot s is read: every computing thread's (after its own reads) */
    DS_FULL = EMPTY + STAGES, /* dS buffer b is whole: every thread's stores */
    DS_EMPTY = DS_FULL + 2,   /* dS buffer b is read by the dQ products: one arrival per warp */
    TURN = DS_EMPTY + 2,      /* (dq_turns) the turn of the tile whose dS is in buffer b came:
                              ** the filling warp */
    BARS = TURN + ${dq_turns and 2 or 0}
};
static_assert(BARS * 8 + STAGES * 4 * ${dq_turns and 3 or 1} <= BAR_BYTES,
              "the mbarriers' bytes, the counts' and (dq_turns) the slots' turns");
/* The named barrier of the computing threads between items (persistent, deterministic). */
constexpr int ITEM_BARRIER = 4;
% else
/* ---- shared memory ------------------------------------------------------------------------- */
/* Tiles as stage 2's: Q [BM][DP] and dO [BM][DVP], then two buffers of K [BN][DP] and V
** [BN][DVP]. */
constexpr int Q_BYTES = BM * DP * 2, G_BYTES = BM * DVP * 2;
constexpr int K_BYTES = BN * DP * 2, KV_BYTES = K_BYTES + BN * DVP * 2;
static_assert(Q_BYTES + G_BYTES + 2 * KV_BYTES + 1023 == ${shared_bytes}, "the host's shared-memory size");
% end

% bwd_hopper_tiles()

/* Copies rows [row0, row0 + ROWS) of a [rows, cols] matrix (row stride ld, in elements) into a
** swizzled tile, zero-filling rows past `rows` and columns past `cols`. */
template <int ROWS, int COLS>
__device__ __forceinline__ void load_swizzled(u32 tile, const elem_t *g, long long ld, int row0,
                                              int rows, int cols)
{
    constexpr int CHUNKS = COLS / 8;
#pragma unroll 1
    for (int i = threadIdx.x; i < ROWS * CHUNKS; i += THREADS) {
        const int r = i / CHUNKS, c = (i % CHUNKS) * 8;
        const bool ok = row0 + r < rows && c < cols;
        cp_async16(swizzled(tile, ROWS, r, c), ok ? g + (row0 + r) * ld + c : g, ok ? 16 : 0);
    }
}

/* ---- the products ---------------------------------------------------------------------------- */
% local S = stage == 2 and "BM" or "BN"
/* acc (64 x ${S}) = A B^T over K = 16 * KSTEPS: the warpgroup's 64 rows of a (K-major, `a_rows`
** rows) by the ${S} streamed rows of b: S^T = K Q^T, dP^T = V dO^T (stage 2); S = Q K^T,
** dP = dO V^T (stage 3). */
template <int KSTEPS>
__device__ __forceinline__ void rows_by_rows(float *acc, u32 a, int a_rows, u32 b)
{
#pragma unroll
    for (int kk = 0; kk < KSTEPS; kk++)
        wgmma_ss_${streamed}(acc, gmma_kmajor(a, a_rows, kk), gmma_kmajor(b, ${S}, kk), kk > 0);
}

/* S and dP of a tile, the two products above issued together and waited for: s = A_s B_s^T
** over d, dp = A_dp B_dp^T over dv, 64 rows by ${S} a warpgroup (`a_rows` rows of A). */
__device__ __forceinline__ void scores_and_dp(float (*s)[4], float (*dp)[4], u32 a_s, u32 a_dp,
                                              int a_rows, u32 b_s, u32 b_dp)
{
    wgmma_fence();
    rows_by_rows<DP / 16>(&s[0][0], a_s, a_rows, b_s);
    rows_by_rows<DVP / 16>(&dp[0][0], a_dp, a_rows, b_dp);
    wgmma_commit();
    wgmma_wait<0>();
    fence_regs<${S} / 2>(&s[0][0]);
    fence_regs<${S} / 2>(&dp[0][0]);
}

/* acc (64 x N) += A B over K = ${S}: A in registers (pack_rows of 64 x ${S} accumulators), B the
** ${S} streamed rows of N columns at b: dV += P^T dO, dK += dS^T Q (stage 2); dQ += dS K
** (stage 3). */
% local function regs_by_rows(n)
__device__ __forceinline__ void regs_by_rows_${n}(float *acc, const u32 (*a)[4], u32 b)
{
#pragma unroll
    for (int kk = 0; kk < ${S} / 16; kk++)
        wgmma_rs_${n}(acc, a[kk], gmma_nmajor(b, ${S}, kk), 1);
}
% end
% regs_by_rows(head_dim_pad)
% if head_dim_v_pad ~= head_dim_pad then regs_by_rows(head_dim_v_pad) end
% if want_dq then

% bwd_hopper_dq_parts()

/* The first of tile n's pieces that warpgroup wg takes: they are dealt from warpgroup n % NWG
** on, so that a single piece changes hands from tile to tile. */
__device__ __forceinline__ int first_dq_piece(int n, int wg)
{
    return (wg + NWG - n % NWG) % NWG;
}

/* Adds a warp's 16 rows of a finished piece (acc) into the f32 sum, at column col0 and row row0
** of its (batch, head) bh in slice `slice` of tm_dq_acc (the map clips rows past d_rows), through
** the warp's staged rows at `stage`: two boxes of 16 rows by 32 floats (the box plan/bwd.c gives
** the map: DQ_BOX_ROWS, DQ_BOX_FLOATS), 128-byte swizzled as the map reads them (conflict-free
** 8-byte stores), written once the warp's previous reductions have
** read them, then a bulk tensor reduction a box from lane 0. */
__device__ __forceinline__ void add_dq_rows(const tmap_t *map, u32 stage, const float (*acc)[4],
                                            int col0, int row0, int bh, int slice, int lane)
{
    /* acc[j][2h..2h+1]: row g + 8 h, columns 8 (j % 4) + 2 t of box j / 4, in 16-byte chunk
    ** 2 (j % 4) + t / 2, stored at chunk (2 (j % 4) + t / 2) ^ g of its row. */
    const int g = lane / 4, t = lane % 4;
    const u32 chunk = ((t / 2) ^ g) << 4;
    const u32 row = stage + g * 128 + (t % 2) * 8;
    if (lane == 0)
        bulk_wait_read<0>();
    __syncwarp();
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
        for (int j = 0; j < 8; j++)
            st_shared_v2(row + h * 1024 + (j / 4) * 2048 + (chunk ^ ((j % 4) * 32)), acc[j][2 * h],
                         acc[j][2 * h + 1]);
    fence_proxy_async(); /* read by the bulk reductions (the async proxy) */
    __syncwarp();
    if (lane == 0) {
        tma_reduce_add4(map, stage, col0, row0, bh, slice);
        tma_reduce_add4(map, stage + 2048, col0 + 32, row0, bh, slice);
        bulk_commit();
    }
}
% end

/* ---- the kernels ----------------------------------------------------------------------------- */
% if stage == 2 then
/* dK and dV of BN keys of one (batch, kv head) over every query row of the group's heads: key
** block key_block0 + blockIdx.x, or with `persistent` every gridDim.x-th of them from
** blockIdx.x (bwd_hopper_items). */
extern "C" __global__ void __launch_bounds__(THREADS, 1)
fj_attn_bwd_dkdv(
% params_arg(args, "T")
)
{
% bwd_hopper_shared(family)
    [[maybe_unused]] const u32 sDS = sK + DS_OFFSET; /* buffer b at sDS + b * DS_BYTES */
% bwd_hopper_barriers(function()
        for (int b = 0; b < 2; b++) {
            mbar_init(bar(DS_FULL, b), 128 * NWG);
            mbar_init(bar(DS_EMPTY, b), 4 * NWG);
%   if dq_turns then
            mbar_init(bar(TURN, b), 1);
%   end
        }
% end)
% bwd_hopper_computing()

    /* ---- warpgroup wg owns keys [n0 + 64 wg, n0 + 64 wg + 64) ------------------------------ */
    float dka[DP / 8][4], dva[DVP / 8][4];
    zero_acc<DP>(dka);
    zero_acc<DVP>(dva);
    const int key_row = n0 + wg * 64 + warp * 16; /* this warp's first key */
    const u32 sKw = sK + wg * 64 * 128, sVw = sV + wg * 64 * 128; /* the warpgroup's keys */
% if want_dq then
    /* Adds tile n's dQ pieces of this warpgroup into the workspace, once its dS is whole (both
    ** warpgroups wrote theirs); then the warp frees dS buffer n % 2. */
%   if dq_turns then
% bwd_hopper_turns()
%   end
    auto add_dq = [&](int n, int head, int m0) {
        const int b = n & 1;
        const u32 staged = sK + DQ_OFFSET + wg * DQ_BYTES + warp * DQ_WARP_BYTES; /* the warp's rows */
        if (n == 0)
            grid_wait_previous(); /* the run before this one added its dQ */
%   if dq_turns then
        settle_turns(false);
        mbar_wait(bar(TURN, b), (n >> 1) & 1);
        if (lane == 0)
            fence_proxy_async_global(); /* the additions (async proxy) after the count's read */
        take_turn(head, m0);
%   end
        for (int piece = first_dq_piece(n, wg); piece < DQ_PIECES; piece += NWG) {
            float acc[8][4];
            mbar_wait(bar(DS_FULL, b), (n >> 1) & 1);
            dq_piece(acc, sDS + b * DS_BYTES, sK, piece);
            add_dq_rows(&T.tm_dq_acc, staged, acc, (piece / ROW_BLOCKS) * 64,
                        m0 + (piece % ROW_BLOCKS) * 64 + warp * 16, batch * heads_q + head,
                        P.dq_slices > 1 ? (int)blockIdx.x : 0, lane);
        }
        warp_arrive(bar(DS_EMPTY, b));
    };
    int dq_head = 0, dq_m0 = 0;
% end
    const int n_first = n; /* the item's first tile */
% bwd_hopper_kv_wait()
    for (; i < count; i = live_from(i + 1), n++) {
% bwd_hopper_tile()

        /* S^T = K Q^T and dP^T = V dO^T: the warpgroup's 64 keys by BM queries. */
        float s[BM / 8][4], dp[BM / 8][4];
        u32 pf[BM / 16][4], dsf[BM / 16][4];
% if overlap_elements then
        /* Overlapped: P^T from S^T while dP^T's product runs, dV += P^T dO issued before dS^T,
        ** dS^T = P^T (dP^T - D) while dV's runs, then dK += dS^T Q (one wgmma group each, in
        ** order; P^T and dS^T as A fragments). */
        wgmma_fence();
        rows_by_rows<DP / 16>(&s[0][0], sKw, BN, sQ);
        wgmma_commit();
        rows_by_rows<DVP / 16>(&dp[0][0], sVw, BN, sG);
        wgmma_commit();
        wgmma_wait<1>();
        fence_regs<BM / 2>(&s[0][0]);
% bwd_dkdv_elements(false)
        pack_rows<BM / 16>(pf, s);
        wgmma_fence();
        regs_by_rows_${head_dim_v_pad}(&dva[0][0], pf, sG);
        wgmma_commit();
        wgmma_wait<1>();
        fence_regs<BM / 2>(&dp[0][0]);
% bwd_dkdv_ds_from_p()
        pack_rows<BM / 16>(dsf, dp);
        wgmma_fence();
        regs_by_rows_${head_dim_pad}(&dka[0][0], dsf, sQ);
        wgmma_commit();
% else
        scores_and_dp(s, dp, sKw, sVw, BN, sQ, sG);

% bwd_dkdv_elements(true)

        /* dV += P^T dO, dK += dS^T Q: P^T and dS^T as A fragments. */
        pack_rows<BM / 16>(pf, s);
        pack_rows<BM / 16>(dsf, dp);
        wgmma_fence();
        regs_by_rows_${head_dim_v_pad}(&dva[0][0], pf, sG);
        regs_by_rows_${head_dim_pad}(&dka[0][0], dsf, sQ);
        wgmma_commit();
% end
% if want_dq then
        /* dS^T into dS buffer n % 2 as dS, once the dQ products of tile n - 2 are done with it. */
        mbar_wait(bar(DS_EMPTY, n & 1), ((n >> 1) & 1) ^ 1);
        store_ds_transposed<BM / 16>(sDS + (n & 1) * DS_BYTES, dsf, wg * 64 + warp * 16, lane);
        fence_proxy_async(); /* read by wgmma (the async proxy) */
        mbar_arrive(bar(DS_FULL, n & 1));
% end
        wgmma_wait<0>();
        /* P^T and dS^T stay untouched, and dK and dV are not read, until their products landed. */
        fence_regs<BM / 4>(&pf[0][0]);
        fence_regs<BM / 4>(&dsf[0][0]);
        fence_regs<DP / 2>(&dka[0][0]);
        fence_regs<DVP / 2>(&dva[0][0]);
% bwd_hopper_slot_release()
% if want_dq then
        if (n > n_first)
            add_dq(n - 1, dq_head, dq_m0);
        dq_head = head;
        dq_m0 = m0;
% end
    }
% if want_dq then
    if (n > n_first)
        add_dq(n - 1, dq_head, dq_m0);
%   if dq_turns then
    settle_turns(true);
%   end
% end
% if persistent > 0 then
    if (n > n_first) /* the item's K and V are read (its last products waited for) */
        mbar_arrive(bar(KV_EMPTY, 0));
%   if want_dq then
    if (P.dq_ordered) {
        /* Deterministic: the item's sums landed before any warp adds the next item's into the
        ** block's slice, so that each element takes its additions in one order. */
        if (lane == 0)
            bulk_wait<0>();
        __syncwarp();
        bar_sync(ITEM_BARRIER, COMPUTE_THREADS);
    }
%   end
% end

% bwd_store_dkdv(true, true)
    }
% if want_dq then
    if (lane == 0)
        bulk_wait<0>(); /* the sums landed, and the staged rows are read, before the block ends */
% end
}
% else
/* dQ of BM query rows of one (batch, head), over the key tiles their band reaches. */
extern "C" __global__ void __launch_bounds__(THREADS, 1)
fj_attn_bwd_dq(
% params_arg(args)
)
{
% params_unpack(family.fields[1].block, "P.fwd", bwd_unpack_names())
    const float scale = P.scale;
    extern __shared__ __align__(1024) unsigned char smem_raw[];
    const u32 sQ = (smem_addr(smem_raw) + 1023u) & ~1023u, sG = sQ + Q_BYTES;
    const u32 sKV = sG + G_BYTES; /* buffer b: K at sKV + b * KV_BYTES, V K_BYTES after it */

    const int tid = threadIdx.x, wg = __shfl_sync(0xffffffffu, tid / 128, 0);
    const int warp = (tid % 128) / 32, lane = tid % 32;
    const int g = lane / 4, t = lane % 4; /* row group and column pair of the fragments */
% attn_block_origin()
% bwd_sequence()
    if (m0 >= seqlen_q)
        return;
% bwd_dq_stream()
    const int warp_row = m0 + wg * 64 + warp * 16; /* first query row of this warp */
% bwd_dq_rows()

    float dqa[DP / 8][4];
    zero_acc<DP>(dqa);

% bwd_block_classes()
% bwd_dq_live_from()
    int nb = live_from(nb_lo), next;
    if (nb < nb_hi) {
        load_swizzled<BM, DP>(sQ, q, q_ss, m0, seqlen_q, head_dim);
        load_swizzled<BM, DVP>(sG, dout, P.do_ss, m0, seqlen_q, head_dim_v);
        load_swizzled<BN, DP>(sKV, k, k_ss, nb * BN, seqlen_k, head_dim);
        load_swizzled<BN, DVP>(sKV + K_BYTES, v, v_ss, nb * BN, seqlen_k, head_dim_v);
        cp_async_commit();
    }
    const u32 sQw = sQ + wg * 64 * 128, sGw = sG + wg * 64 * 128; /* the warpgroup's rows */
    for (int b = 0; nb < nb_hi; b ^= 1, nb = next) {
        const int n0 = nb * BN;
        next = live_from(nb + 1);
        cp_async_wait_all();
        fence_proxy_async(); /* the copies are read by wgmma (the async proxy) */
        __syncthreads();     /* tile nb landed; every warpgroup is done with buffer b ^ 1 */
        if (next < nb_hi) {
            const u32 buf = sKV + (b ^ 1) * KV_BYTES;
            load_swizzled<BN, DP>(buf, k, k_ss, next * BN, seqlen_k, head_dim);
            load_swizzled<BN, DVP>(buf + K_BYTES, v, v_ss, next * BN, seqlen_k, head_dim_v);
            cp_async_commit();
        }
        const u32 sK = sKV + b * KV_BYTES, sV = sK + K_BYTES;
% if block_mask then
        const int block_class = block_class_of(head, m0, n0);
% end

        /* S = Q K^T and dP = dO V^T: the warpgroup's 64 rows by BN keys. */
        float s[BN / 8][4], dp[BN / 8][4];
        scores_and_dp(s, dp, sQw, sGw, BM, sK, sV);

% bwd_dq_elements(true)

        /* dQ += dS K: dS as A fragments, K transposed. */
        u32 dsf[BN / 16][4];
        pack_rows<BN / 16>(dsf, dp);
        wgmma_fence();
        regs_by_rows_${head_dim_pad}(&dqa[0][0], dsf, sK);
        wgmma_commit();
        wgmma_wait<0>();
        fence_regs<BN / 4>(&dsf[0][0]);
        fence_regs<DP / 2>(&dqa[0][0]);
    }

% bwd_store_dq()
}
% end
