% -- Decode attention for Hopper (sm_90a) where it is compute-bound: MLA's latent cache (v a view
% -- of k's first dims, 576 / 512) under 64-128 query heads, and (v its own tensor) value dims
% -- beyond 256 under many packed rows. The decode family's work and output
% -- (a block per (batch, kv head, row tile, split); grouped-query heads packed; with `partial` the
% -- split's state to the workspace), scheduled so that one warpgroup's softmax runs under the
% -- other's products ("seesaw", after FlashMLA's write-up).
% --
% -- A block is BM = 64 packed rows and two warpgroups; O's value columns are split between them
% -- (O_L, columns [0, DVH), in warpgroup 0; O_R, [DVH, DV), in warpgroup 1: 64 x 256 f32 each at
% -- dv 512, half a warpgroup's registers). Key tiles of BN keys (64; 32 where v is its own
% -- tensor, whose tile then shares the slot) come in pairs, tile a (even) in ring slot 0 and tile
% -- b (odd) in slot 1, and each warpgroup computes the whole S of its own tile (warpgroup 0 of a,
% -- 1 of b: m64nBN over all of d, Q and K from shared memory). With m
% -- the rows' running maximum (the same in both), per pair:
% --   warpgroup 0: S_a; m0 = max(m, rowmax S_a); P_a = exp2(S_a - m0); O_L = O_L e(m - m0) +
% --                P_a V_aL; then, given m1 from warpgroup 1, O_L = O_L e(m0 - m1) + P_b V_bL,
% --                and hands warpgroup 1 P_a e(m0 - m1) (exact in f32, rounded once to 16 bits);
% --   warpgroup 1: S_b; m1 = max(m0, rowmax S_b); P_b = exp2(S_b - m1); O_R = O_R e(m - m1) +
% --                P_b V_bR + (P_a e(m0 - m1)) V_aR, and hands warpgroup 0 P_b.
% -- So while warpgroup 0 exponentiates, warpgroup 1's products run, and the other way round.
% -- Row sums: each warpgroup adds its own tiles' (scaled as its O), summed at the end.
% --
% -- The copies (bulk tensor copies issued by one thread of each warpgroup, no copying warpgroup;
% -- the first two tiles by thread 0): a tile's 64-column panels each complete their own mbarrier
% -- (FULL[slot][panel]), and S's products start on a panel as soon as it lands. A slot holds
% -- the K tile's NP panels, then (v its own tensor) the V tile's NV; with v_in_k V's panels are
% -- K's first. A panel of a slot is copied again (the tile two on) by the warpgroup that reads
% -- it last, once its products are done: value panels [VP, VP + NL) (O_L's) by warpgroup 0,
% -- [VP + NL, VP + 2 NL) by warpgroup 1, K's other panels by the slot's S warpgroup; but K's last
% -- panel (XP: only S reads it; with v_in_k it lies past the value columns) carries the slot's P
% -- from the warpgroup that computed it to the other once S has landed (thread-indexed 16-bit A
% -- fragments, BN x 128 bytes: a panel of the tile), so the reader copies it again.
% --
% -- Parameters: as attn_decode.lua (one 16-bit type), tile_m 64, tile_n 64 (v_in_k) or 32,
% -- stages 2, warps 8, threads 256, head_dim_pad (multiple of 64; with v_in_k at least a panel
% -- past head_dim_v_pad), head_dim_v_pad (multiple of 128, at most 512), v_in_k, bulk
% -- (required), partial, shared_bytes (fj__variant_shared_bytes).
% assert(backend == "cuda", "attn_decode_seesaw is a CUDA kernel")
% assert(threads == 256 and warps == 8, "attn_decode_seesaw: two warpgroups")
% assert(tile_m == 64 and tile_n == (v_in_k and 64 or 32) and stages == 2,
%        "attn_decode_seesaw: 64 rows, 64 keys (v_in_k) or 32, two ring slots")
% assert(bulk, "attn_decode_seesaw: bulk tensor copies")
% assert(head_dim_pad % 64 == 0 and head_dim_v_pad % 128 == 0 and head_dim_v_pad <= 512 and
%        (not v_in_k or head_dim_pad >= head_dim_v_pad + 64),
%        "attn_decode_seesaw: whole panels, each half of dv at most 256, and a panel past dv")
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
constexpr int BM = 64, BN = ${tile_n};                  /* packed rows; keys a tile */
constexpr int D = ${head_dim_pad}, DV = ${head_dim_v_pad}, DVH = DV / 2; /* padded head dims */
constexpr bool V_IN_K = ${v_in_k and "true" or "false"}; /* V's panels are K's first */
constexpr int NP = D / 64;     /* 64-column panels of Q and of a K tile */
constexpr int NL = DVH / 64;   /* value panels of a warpgroup's columns: VP + [h NL, (h + 1) NL) */
constexpr int NV = V_IN_K ? 0 : DV / 64;  /* a V tile's panels of its own */
constexpr int VP = V_IN_K ? 0 : NP;       /* a slot's first value panel */
constexpr int NS = NP + NV;               /* panels a slot */
constexpr int KO = V_IN_K ? 2 * NL : 0;   /* K's panels [KO, XP): the slot's S warpgroup's */
constexpr int XP = NP - 1;     /* the exchange panel (K's last, past the value columns) */
constexpr int QPANEL = BM * 128, PANEL = BN * 128; /* bytes of a panel of Q, of a tile */
static_assert(BM * BN * 2 == PANEL && (!V_IN_K || 2 * NL < NP),
              "a P tile fills the exchange panel, which V does not read");
#define NEG_INF __int_as_float(0xff800000)

/* Named barriers between the warpgroups (bar_arrive by one, bar_sync by the other), each used
** once a pair: the maxima of tile a and of tile b, P of a and of b in their exchange panels;
** then each warpgroup's own (its 128 threads) and the end's. */
enum { MAX_A = 1, MAX_B = 2, P_A = 3, P_B = 4, OWN = 5 /* + warpgroup */, END = 7 };

/* ---- shared memory (from a 1024-byte boundary) --------------------------------------------- */
/* Q's panels, ring slots 0 and 1 (NS panels each: a K tile's, then a V tile's), the rows' values
** and FULL[2][NS]. Panels are rows of 128 bytes in the 128-byte swizzle (16-byte piece j of row
** r at (j ^ r % 8) * 16). */
struct Rows {
    float max[2][BM]; /* the running maximum after tile a (warpgroup 0's), after tile b (1's) */
    float sum[2][BM]; /* each warpgroup's row sums, at the end */
};
constexpr int SLOT_BYTES = NS * PANEL, RING_AT = NP * QPANEL;
constexpr int ROWS_AT = RING_AT + 2 * SLOT_BYTES, BARS_AT = ROWS_AT + (int)sizeof(Rows);
static_assert(BARS_AT + 16 * NS + 1023 == ${shared_bytes}, "the host's fj__variant_shared_bytes");

% decode_key_row()

extern "C" __global__ void __launch_bounds__(256, 1)
fj_attn_decode(
% params_arg(args, "T")
)
{
% decode_hopper_opening()
    const u32 sQ = base, ring = base + RING_AT, bars = base + BARS_AT;
    Rows &rx = *(Rows *)(smem + ROWS_AT);
    const int tid = threadIdx.x, half = __shfl_sync(0xffffffffu, tid / 128, 0);
    const int ti = tid % 128, warp = ti / 32, lane = tid % 32;
% decode_block("BM", true)
% if paged then
    lo = lo / BN * BN; /* a tile's box in one page (keys before the band are masked) */
% end
    const int ntiles = hi >= lo ? (hi - lo) / BN + 1 : 0;

    /* ---- the copies ---- */
    /* The page (contiguous: the sequence) that holds tile `tile` (0 past the last): its table
    ** entry read by page_entry, then clamped into the cache by page_of, so that a read issued a
    ** pair of tiles ahead is waited for only where the copy needs it. */
    auto page_entry = [&](int tile) {
% if paged then
        return tile < ntiles ? LDG(pages + div_by(page_div, lo + tile * BN)) : 0;
% else
        return tile < ntiles ? batch : 0;
% end
    };
    auto page_of = [&](int entry) {
        return ${paged and "I_MIN(I_MAX(entry, 0), P.num_pages - 1)" or "entry"};
    };
    /* Panels [p0, p1) of tile `tile` into its slot (K's, then V's), on page `page`, each on its
    ** FULL barrier. */
    auto copy_panels = [&](int tile, int page, int p0, int p1) {
        const int s = tile % 2;
% if paged then
        const int row = mod_by(page_div, lo + tile * BN);
% else
        const int row = lo + tile * BN;
% end
        for (int p = p0; p < p1; p++) {
            const u32 full = bars + 8 * (s * NS + p), dst = ring + s * SLOT_BYTES + p * PANEL;
            mbar_arrive_expect(full, PANEL);
% if v_in_k then
            tma_load_tile(dst, &T.tm_k, full, p * 64, row, head_kv, page, T.perm_k);
% else
            if (p < NP)
                tma_load_tile(dst, &T.tm_k, full, p * 64, row, head_kv, page, T.perm_k);
            else
                tma_load_tile(dst, &T.tm_v, full, (p - NP) * 64, row, head_kv, page, T.perm_v);
% end
        }
    };
    /* Warpgroup h's panels of tile `tile` (see the top): its value panels, the exchange panel
    ** where it reads the slot's P (slot 1 - h), and the rest where it computes the slot's S. */
    auto copy_mine = [&](int tile, int page) {
        const int s = tile % 2;
        fence_proxy_async(); /* this warpgroup's reads of the slot (P's too) before the copies */
        copy_panels(tile, page, VP + half * NL, VP + (half + 1) * NL);
        if (s == half)
            copy_panels(tile, page, KO, XP);
        else
            copy_panels(tile, page, XP, NP);
    };

    if (tid == 0) {
        for (int i = 0; i < 2 * NS; i++)
            mbar_init(bars + 8 * i, 1);
        mbar_init_fence();
        if (ntiles > 0)
            copy_panels(0, page_of(page_entry(0)), 0, NS);
        if (ntiles > 1)
            copy_panels(1, page_of(page_entry(1)), 0, NS);
    }
    /* Q: a warp copies every eighth row. */
% decode_copy_q("tid / 32", 8)
    cp_async_commit();
    cp_async_wait_all();
    fence_proxy_async(); /* Q's copies (generic proxy) before wgmma's reads (async proxy) */
    __syncthreads();     /* and the barriers' initialisation */

    /* ---- the warpgroups' parts ---- */
    const int g = lane / 4, t = lane % 4;      /* row group and column pair of the fragments */
    const int r0 = warp * 16 + g, r1 = r0 + 8; /* the thread's two rows of the tile */
% decode_row_positions()
    float o[DVH / 8][4], row_max[2] = {NEG_INF, NEG_INF}, row_sum[2] = {0.0f, 0.0f};
    zero_acc<DVH>(o);
    float sf[BN / 8][4]; /* S of this warpgroup's tile, then its P in f32 */
    u32 pa[BN / 16][4];  /* a P as A fragments: tile a's, then (warpgroup 0) tile b's */
    u32 pb[BN / 16][4];  /* (warpgroup 1) tile b's, in flight beside tile a's */

    /* S = Q K^T of tile `tile` (this warpgroup's), issued panel by panel as they land. (Each
    ** warpgroup's tiles sit in one slot, so every descriptor is the same each time: `here`
    ** keeps the compiler from holding all 2 x 4 NP of them in registers across the loop.) */
    auto issue_s = [&](int tile) {
        const int s = tile % 2;
        const u32 parity = (tile / 2) & 1, slot = ring + s * SLOT_BYTES;
        wgmma_fence();
#pragma unroll
        for (int p = 0; p < NP; p++) {
            mbar_wait(bars + 8 * (s * NS + p), parity);
            const u32 qp = here(sQ + p * QPANEL), kp = here(slot + p * PANEL);
#pragma unroll
            for (int k = 0; k < 4; k++)
                wgmma_ss_${tile_n}(&sf[0][0], gmma_desc(qp + k * 32, 16, 1024),
                                   gmma_desc(kp + k * 32, 16, 1024), p > 0 || k > 0);
        }
        wgmma_commit();
    };
    /* Every product issued has landed. (Called unconditionally where S may be in flight: ptxas
    ** serialises all of a kernel's wgmma where a path may touch registers of one in flight.) */
    auto landed = [&]() {
        wgmma_wait<0>();
        fence_regs<BN / 2>(&sf[0][0]);
        fence_regs<DVH / 2>(&o[0][0]);
        fence_regs<BN / 4>(&pa[0][0]);
        fence_regs<BN / 4>(&pb[0][0]);
    };
    /* S (landed) in log2 units (soft-capped); keys past the split, and (causal, windows)
    ** outside the row's band, at -inf; the rows' maxima of the tile in mx. */
    auto scores = [&](int tile, float *mx) {
        const int n0 = lo + tile * BN;
        mx[0] = mx[1] = NEG_INF;
% decode_scores("sf", "BN / 8")
    };
    /* A row with no key yet keeps max -inf; subtracting 0 then gives exp2(-inf) = 0. */
    auto base_of = [](float m) { return m == NEG_INF ? 0.0f : m; };
    /* P = exp2(S - base) in sf; the rows' sums of it added to row_sum. */
    auto exponentiate = [&](const float *b) {
#pragma unroll
        for (int h = 0; h < 2; h++) {
            float sum = 0.0f;
#pragma unroll
            for (int j = 0; j < BN / 8; j++)
#pragma unroll
                for (int e = 2 * h; e < 2 * h + 2; e++) {
                    sf[j][e] = ex2(sf[j][e] - b[h]);
                    sum += sf[j][e];
                }
            row_sum[h] += sum; /* the quad's and the warpgroups' sums at the end */
        }
    };
    /* O's rows and row sums times f (O's skipped where no row of the warp's changed its
    ** scale: scale_rows). */
    auto rescale = [&](const float *f) {
        row_sum[0] *= f[0];
        row_sum[1] *= f[1];
        scale_rows<DVH>(o, f);
    };
    /* The exchange panel of slot s (this thread's first word), and word (kk, i) of a thread's P
    ** (A fragments) from there. */
    auto xpanel = [&](int s) { return here(ring + s * SLOT_BYTES + XP * PANEL + ti * 4); };
    auto xword = [](u32 x, int kk, int i) { return x + (kk * 4 + i) * 128 * 4; };
    /* P (sf) times the rows' factors f, as 16-bit A fragments, to slot s's exchange panel, once
    ** every warp's part of S has landed (a warp's wgmma_wait covers its own rows' products, which
    ** all read the whole panel). */
    auto give_p = [&](int s, const float *f) {
        bar_sync(OWN + half, 128);
        const u32 x = xpanel(s);
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
            const float *c0 = sf[2 * kk], *c1 = sf[2 * kk + 1];
            st_shared_u32(xword(x, kk, 0), pack2(c0[0] * f[0], c0[1] * f[0]));
            st_shared_u32(xword(x, kk, 1), pack2(c0[2] * f[1], c0[3] * f[1]));
            st_shared_u32(xword(x, kk, 2), pack2(c1[0] * f[0], c1[1] * f[0]));
            st_shared_u32(xword(x, kk, 3), pack2(c1[2] * f[1], c1[3] * f[1]));
        }
    };
    auto take_p = [&](int s) {
        const u32 x = xpanel(s);
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                pa[kk][i] = ld_shared_u32(xword(x, kk, i));
    };
    /* O += P V of slot s into this warpgroup's columns (V's panels from VP), issued. */
    auto issue_pv = [&](int s, const u32 (*p)[4]) {
        const u32 v = here(ring + s * SLOT_BYTES + (VP + half * NL) * PANEL);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++)
            wgmma_rs_${half_dv}(&o[0][0], p[kk], gmma_nmajor(v, BN, kk), 1);
        wgmma_commit();
    };
    /* This warpgroup's value panels of tile `tile`, made ready for its P V: with v its own
    ** tensor, waited for (with v_in_k they are K's, which the tile's S waited for). And the rows
    ** of a tile past the sequence's last key are whatever the cache holds there (a page's unused
    ** rows: maybe not finite). Their P is 0, but 0 times NaN is not: before its P V each
    ** warpgroup zeroes its value columns of those rows (once the tile's S has landed). */
    auto take_values = [&](int tile) {
% if not v_in_k then
#pragma unroll
        for (int j = 0; j < NL; j++)
            mbar_wait(bars + 8 * ((tile % 2) * NS + VP + half * NL + j), (tile / 2) & 1);
% end
        const int valid = seqlen_k - (lo + tile * BN);
        if (valid >= BN)
            return;
        bar_sync(OWN + half, 128); /* (every warp's part of this warpgroup's S, as give_p) */
        zero_rows<BN, DVH>(ring + (tile % 2) * SLOT_BYTES + VP * PANEL, valid, half * (DVH / 8),
                           ti);
        bar_sync(OWN + half, 128);
    };

    /* The page of the tile this warpgroup's copying thread copies next into each slot, looked
    ** up a pair ahead (the table's latency off the copies' path). */
    int next_page[2] = {ti == 0 ? page_entry(2) : 0, ti == 0 ? page_entry(3) : 0};
    /* Once this warpgroup's products on tile `tile` have landed: its panels of the tile two on. */
    auto recycle = [&](int tile) {
        bar_sync(OWN + half, 128); /* every warp's products landed */
        if (ti == 0 && tile + 2 < ntiles) {
            copy_mine(tile + 2, page_of(next_page[tile % 2]));
            next_page[tile % 2] = page_entry(tile + 4);
        }
    };

    if (half == 0) {
        /* ---- warpgroup 0: even tiles' S and softmax, O_L ---- */
        if (ntiles > 0)
            issue_s(0);
#pragma unroll 1
        for (int a = 0; a < ntiles; a += 2) {
            const int b = a + 1;
            const bool has_b = b < ntiles;
            float mx[2], m0[2], b0[2], f[2];
            landed();
            scores(a, mx);
#pragma unroll
            for (int h = 0; h < 2; h++) {
                m0[h] = fmaxf(row_max[h], mx[h]);
                b0[h] = base_of(m0[h]);
                f[h] = ex2(row_max[h] - b0[h]);
            }
            if (t == 0) {
                rx.max[0][r0] = m0[0];
                rx.max[0][r1] = m0[1];
            }
            bar_arrive(MAX_A, 256);
            rescale(f);
            exponentiate(b0);
            take_values(a);
            pack_rows<BN / 16>(pa, sf);
            issue_pv(0, pa);
            /* P_a to the pair's maximum for warpgroup 1 (S_b's maxima, if any) */
            float m1[2] = {m0[0], m0[1]};
            if (has_b) {
                bar_sync(MAX_B, 256);
                m1[0] = rx.max[1][r0];
                m1[1] = rx.max[1][r1];
            }
#pragma unroll
            for (int h = 0; h < 2; h++) {
                f[h] = ex2(m0[h] - base_of(m1[h]));
                row_max[h] = m1[h];
            }
            give_p(0, f);
            bar_arrive(P_A, 256);
            landed();
            recycle(a);
            if (has_b) {
                rescale(f);
                bar_sync(P_B, 256);
                take_p(1);
                take_values(b);
                issue_pv(1, pa);
                landed();
                recycle(b);
            }
            if (a + 2 < ntiles)
                issue_s(a + 2);
        }
    } else {
        /* ---- warpgroup 1: odd tiles' S and softmax, O_R ---- */
        if (ntiles > 1)
            issue_s(1);
#pragma unroll 1
        for (int a = 0; a < ntiles; a += 2) {
            const int b = a + 1;
            const bool has_b = b < ntiles;
            float mx[2] = {NEG_INF, NEG_INF}, m1[2], b1[2], f[2];
            landed();
            if (has_b)
                scores(b, mx);
            bar_sync(MAX_A, 256);
#pragma unroll
            for (int h = 0; h < 2; h++) {
                m1[h] = fmaxf(h ? rx.max[0][r1] : rx.max[0][r0], mx[h]);
                b1[h] = base_of(m1[h]);
                f[h] = ex2(row_max[h] - b1[h]);
                row_max[h] = m1[h];
            }
            rescale(f);
            if (has_b) {
                if (t == 0) {
                    rx.max[1][r0] = m1[0];
                    rx.max[1][r1] = m1[1];
                }
                bar_arrive(MAX_B, 256);
                exponentiate(b1);
                const float one[2] = {1.0f, 1.0f};
                give_p(1, one);
                pack_rows<BN / 16>(pb, sf);
                bar_arrive(P_B, 256);
                take_values(b);
                issue_pv(1, pb);
            }
            bar_sync(P_A, 256);
            take_p(0);
            take_values(a);
            issue_pv(0, pa);
            landed();
            if (has_b)
                recycle(b);
            recycle(a);
            if (b + 2 < ntiles)
                issue_s(b + 2);
        }
    }

    landed();

    /* The rows' sums over both warpgroups, then O normalised and stored through Q's and the
    ** ring's bytes. */
% decode_halves_store("rx.sum", "END", "smem", "ROWS_AT")
}
