% -- Device helpers for CUDA tensor-core kernels (sm_80+), in inline PTX so that a compile needs
% -- no toolkit header: shared-memory addresses, cp.async, named barriers, ldmatrix, mma.sync
% -- m16n8k16 with f32 accumulators, packing floats into 16-bit pairs, ex2; the tile copy
% -- (mma_load_tile) and a warp's products of shared-memory and register operands
% -- (mma_rows_by_rows, mma_regs_by_rows, pack_rows). elem_t: the products' 16-bit type; q_t,
% -- kv_t, o_t: the element types of q, k and v, and out. Parameters: q_dtype, kv_dtype,
% -- out_dtype ("bf16" or "f16", one type for all three; or q, k and v in one FP8 type,
% -- "f8e4m3" or "f8e5m2", and out 16-bit, for Hopper's FP8 products, cuda_hopper.lua's: the
% -- 16-bit helpers here then take out's type; or an FP8 cache, k and v FP8 and q and out one
% -- 16-bit type, whose products are f16: the decode kernel converts the cache's tiles and q).
% local fp8_in = q_dtype == "f8e4m3" or q_dtype == "f8e5m2"
% local fp8_cache = not fp8_in and (kv_dtype == "f8e4m3" or kv_dtype == "f8e5m2")
% assert(out_dtype == "bf16" or out_dtype == "f16", "cuda_mma: tensor cores write bf16 or f16, not " .. tostring(out_dtype))
% assert((kv_dtype == q_dtype or fp8_cache) and (out_dtype == q_dtype or fp8_in),
%        "cuda_mma: one element type for q, k, v and out, FP8 inputs and a 16-bit out, " ..
%        "or an FP8 cache")
% local ptx_type = fp8_cache and "f16" or out_dtype
typedef unsigned short elem_t;
typedef ${fp8_in and "unsigned char" or "elem_t"} q_t;
typedef ${(fp8_in or fp8_cache) and "unsigned char" or "elem_t"} kv_t;
typedef elem_t o_t;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;

__device__ __forceinline__ u32 smem_addr(const void *p)
{
    u64 a;
    asm("cvta.to.shared.u64 %0, %1;" : "=l"(a) : "l"(p));
    return (u32)a;
}

/* Programmatic dependent launch (sm_90+; nothing before): a grid launched to overlap the end of
** the one before it (fj__step.overlap_previous) waits for that grid's completion and writes
** before it reads or adds to what that grid wrote (at once where launched otherwise), and a
** grid lets the next one launch early once each of its blocks said so (or ended). */
__device__ __forceinline__ void grid_wait_previous()
{
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void grid_launch_next()
{
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;");
#endif
}

/* Copies 16 bytes global -> shared without registers; src_bytes 0 writes zeros instead. */
__device__ __forceinline__ void cp_async16(u32 dst, const void *src, int src_bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes));
}
/* The L2 policy of data streamed through once (a decode's keys and values): its lines may leave
** L2 first. Not volatile: the compiler makes it once. */
__device__ __forceinline__ u64 l2_evict_first()
{
    u64 policy;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    return policy;
}
/* cp_async16 for data streamed through once: evict-first in L2 (l2_evict_first), and L2 fetches
** 256-byte blocks around it. */
__device__ __forceinline__ void cp_async16_stream(u32 dst, const void *src, int src_bytes)
{
    const u64 policy = l2_evict_first();
    asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::256B [%0], [%1], 16, %2, %3;" ::"r"(dst),
                 "l"(src), "r"(src_bytes), "l"(policy));
}
/* p moved on by `bytes`, in an add the compiler keeps: in an unrolled run of copies it would
** otherwise multiply each copy's offset out afresh (j * step: a wide multiply and more a copy). */
template <typename T> __device__ __forceinline__ void advance_bytes(const T *&p, long long bytes)
{
    asm("add.s64 %0, %0, %1;" : "+l"(p) : "l"(bytes));
}
/* The same for one 4-byte word (zeros where src_bytes is 0). */
__device__ __forceinline__ void cp_async4(u32 dst, const void *src, int src_bytes)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(src_bytes));
}
/* Named barrier `id` (1-15; 0 is __syncthreads') of `count` threads, whole warps. */
__device__ __forceinline__ void bar_sync(int id, int count)
{
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(count) : "memory");
}
/* Arrives at it without waiting: this thread's earlier shared-memory writes are visible to the
** threads whose bar_sync completes the barrier. */
__device__ __forceinline__ void bar_arrive(int id, int count)
{
    asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(count) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
/* Waits for every committed group: copies issued since the last commit are not waited for. */
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }

__device__ __forceinline__ void ldmatrix_x4(u32 addr, u32 &r0, u32 &r1, u32 &r2, u32 &r3)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(u32 addr, u32 &r0, u32 &r1, u32 &r2, u32 &r3)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3) : "r"(addr));
}

/* d += a * b for one m16n8k16 tile: a row-major 16x16, b column-major 16x8, d f32. */
__device__ __forceinline__ void mma16816(float *d, const u32 *a, u32 b0, u32 b1)
{
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.${ptx_type}.${ptx_type}.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Two floats as one register of two 16-bit values, lo in the low half, rounded to nearest. */
__device__ __forceinline__ u32 pack2(float lo, float hi)
{
    u32 r;
    asm("cvt.rn.${ptx_type}x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

/* p[0] += a, p[1] += b in global memory, atomically (8-byte aligned p): one vector reduction
** on sm_90, two scalar ones before. */
__device__ __forceinline__ void red_add2(float *p, float a, float b)
{
#if __CUDA_ARCH__ >= 900
    asm volatile("red.global.add.v2.f32 [%0], {%1, %2};" ::"l"(p), "f"(a), "f"(b) : "memory");
#else
    asm volatile("red.global.add.f32 [%0], %1;" ::"l"(p), "f"(a) : "memory");
    asm volatile("red.global.add.f32 [%0], %1;" ::"l"(p + 1), "f"(b) : "memory");
#endif
}

__device__ __forceinline__ float ex2(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ float lg2(float x)
{
    float y;
    asm("lg2.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

__device__ __forceinline__ int imin(int a, int b) { return a < b ? a : b; }
__device__ __forceinline__ int imax(int a, int b) { return a > b ? a : b; }
/* a / b rounded towards minus infinity, for b > 0. */
__device__ __forceinline__ int floor_div(int a, int b) { return a >= 0 ? a / b : -((b - 1 - a) / b); }

__device__ __forceinline__ float quad_max(float x)
{
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
__device__ __forceinline__ float quad_sum(float x)
{
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}

% -- The tile macros of a kernel of tile_m x tile_n tiles on `warps` warps and padded head dims:
% -- BM, BN, THREADS, DP, DVP (`dv`, default head_dim_v_pad: a block's value columns), and QS,
% -- VS, the row strides of q/k and v tiles in shared memory (16 bytes of padding: ldmatrix
% -- without bank conflicts; fj__variant_shared_bytes counts them).
% function mma_tile_macros(dv)
#define BM ${tile_m}
#define BN ${tile_n}
#define THREADS ${warps * 32}
#define DP ${head_dim_pad}
#define DVP ${dv or head_dim_v_pad}
#define QS (DP + 8)
#define VS (DVP + 8)
% end

% -- `need_mask |= ...` where the tile of query rows [m0, m0 + BM) and keys [n0, n0 + BN) crosses
% -- an edge of the band (local_mask: a window or causal; shift = seqlen_k - seqlen_q). Goes after
% -- `bool need_mask` is set for the tensors' ends.
% function mma_band_crossing()
%   if local_mask then
        if (window_right >= 0)
            need_mask |= n0 + BN - 1 > m0 + shift + window_right;
        if (window_left >= 0)
            need_mask |= n0 < m0 + BM - 1 + shift - window_left;
%   end
% end

% -- load_tile<ROWS, COLS, SS[, UNROLLED]>(s, g, ld, row0, rows, cols): cp.async of a tile of rows
% -- into shared memory. Emitted where called: it reads THREADS, which the kernel defines first.
% function mma_load_tile()
/* Copies rows [row0, row0 + ROWS) of a [rows, cols] matrix (row stride ld, in elements) into
** shared memory (row stride SS), zero-filling rows past `rows` and columns past `cols`. Each
** thread always copies the same 16-byte column of rows STEP apart, so the addresses are one base
** and constant steps; only a tile at the edge of the matrix checks bounds. Its loops are not
** unrolled: unrolled, their addresses compete with the accumulators for registers; UNROLLED
** unrolls a whole tile's, for a kernel that has the registers (the grid dk/dv kernel: 1-3 %
** faster so on an H100, bench/RESULTS.md). */
template <int ROWS, int COLS, int SS, bool UNROLLED = false>
__device__ __forceinline__ void load_tile(elem_t *s, const elem_t *g, long long ld, int row0,
                                          int rows, int cols)
{
    constexpr int CHUNKS = COLS / 8;
    if constexpr (THREADS % CHUNKS == 0) {
        constexpr int STEP = THREADS / CHUNKS;
        const int r = threadIdx.x / CHUNKS, c = (threadIdx.x % CHUNKS) * 8;
        const elem_t *src = g + (row0 + r) * ld + c;
        const long long step = STEP * ld;
        u32 dst = smem_addr(s + r * SS + c);
        if (row0 + ROWS <= rows && cols == COLS && UNROLLED) {
#pragma unroll
            for (int rr = r; rr < ROWS; rr += STEP, src += step, dst += STEP * SS * 2)
                cp_async16(dst, src, 16);
        } else if (row0 + ROWS <= rows && cols == COLS) {
#pragma unroll 1
            for (int rr = r; rr < ROWS; rr += STEP, src += step, dst += STEP * SS * 2)
                cp_async16(dst, src, 16);
        } else {
            const bool col_ok = c < cols;
#pragma unroll 1
            for (int rr = r; rr < ROWS; rr += STEP, src += step, dst += STEP * SS * 2) {
                const bool ok = col_ok && row0 + rr < rows;
                cp_async16(dst, ok ? src : g, ok ? 16 : 0);
            }
        }
    } else {
#pragma unroll 1
        for (int i = threadIdx.x; i < ROWS * CHUNKS; i += THREADS) {
            const int r = i / CHUNKS, c = (i % CHUNKS) * 8;
            const bool ok = row0 + r < rows && c < cols;
            cp_async16(smem_addr(s + r * SS + c), ok ? g + (row0 + r) * ld + c : g, ok ? 16 : 0);
        }
    }
}
% end

/* acc[N / 8][4] += A B^T over K = 16 * KSTEPS: A the 16 rows at a (row stride AS), B the N rows
** at b (row stride BS), both row-major in shared memory (S = Q K^T: the key rows are B's). */
template <int N, int KSTEPS, int AS, int BS>
__device__ __forceinline__ void mma_rows_by_rows(float (*acc)[4], const elem_t *a, const elem_t *b,
                                                 int lane)
{
#pragma unroll
    for (int kk = 0; kk < KSTEPS; kk++) {
        u32 af[4];
        ldmatrix_x4(smem_addr(a + (lane % 16) * AS + kk * 16 + (lane / 16) * 8), af[0], af[1], af[2],
                    af[3]);
#pragma unroll
        for (int np = 0; np < N / 16; np++) {
            u32 b0, b1, b2, b3;
            ldmatrix_x4(smem_addr(b + (np * 16 + (lane / 16) * 8 + lane % 8) * BS + kk * 16 +
                                  ((lane / 8) % 2) * 8),
                        b0, b1, b2, b3);
            mma16816(acc[2 * np], af, b0, b1);
            mma16816(acc[2 * np + 1], af, b2, b3);
        }
    }
}

/* acc[MT][N / 8][4] += A B over K = 16 * KSTEPS, a warp's 16 * MT rows by N columns, both
** operands in shared memory, each fragment read once for every product it enters (a B fragment
** serves MT row tiles). A at a, row stride AS: row-major (rows by K), or with A_T its transpose
** (K rows by the product's rows: dQ += dS K with dS^T stored). B at b, row stride BS: N rows by
** K (B_KN false: S^T = K Q^T, the query rows are B's), or K rows by N columns (B_KN: dV += P^T
** dO). Each ldmatrix address is the lane's shared address plus a constant, one register and an
** immediate offset in the instruction (a generic pointer a fragment costs 64-bit arithmetic
** and a conversion). */
template <int MT, int N, int KSTEPS, int AS, int BS, bool A_T, bool B_KN>
__device__ __forceinline__ void mma_tiles(float (*acc)[N / 8][4], const elem_t *a, const elem_t *b,
                                          int lane)
{
    constexpr u32 E = sizeof(elem_t);
    /* The lane's row and column within a 16 x 16 piece, as ldmatrix.x4 reads it: its matrix
    ** (lane / 8) at rows 8 (lane / 16) or columns 8 (lane / 16) of the piece. */
    const int r16 = lane % 16, c16 = (lane / 16) * 8;            /* matrices down, then across */
    const int r8 = (lane / 16) * 8 + lane % 8, c8 = (lane / 8) % 2 * 8; /* across, then down */
    const u32 a_lane = smem_addr(a) + E * (A_T ? r8 * AS + c8 : r16 * AS + c16);
    const u32 b_lane = smem_addr(b) + E * (B_KN ? r16 * BS + c16 : r8 * BS + c8);
#pragma unroll
    for (int kk = 0; kk < KSTEPS; kk++) {
        u32 af[MT][4];
#pragma unroll
        for (int mi = 0; mi < MT; mi++)
            if (A_T)
                ldmatrix_x4_trans(a_lane + E * (kk * 16 * AS + mi * 16), af[mi][0], af[mi][1],
                                  af[mi][2], af[mi][3]);
            else
                ldmatrix_x4(a_lane + E * (mi * 16 * AS + kk * 16), af[mi][0], af[mi][1],
                            af[mi][2], af[mi][3]);
#pragma unroll
        for (int np = 0; np < N / 16; np++) {
            u32 b0, b1, b2, b3;
            if (B_KN)
                ldmatrix_x4_trans(b_lane + E * (kk * 16 * BS + np * 16), b0, b1, b2, b3);
            else
                ldmatrix_x4(b_lane + E * (np * 16 * BS + kk * 16), b0, b1, b2, b3);
#pragma unroll
            for (int mi = 0; mi < MT; mi++) {
                mma16816(acc[mi][2 * np], af[mi], b0, b1);
                mma16816(acc[mi][2 * np + 1], af[mi], b2, b3);
            }
        }
    }
}

/* The offset of 16-bit element (r, c) (c a multiple of 8) of a tile of ROWS rows held as
** 64-column panels of ROWS x 128 bytes in the 128-byte swizzle: 16-byte piece j of row r at
** piece j ^ (r % 8) of its row (cuda_hopper.lua's swizzled_chunk, the layout a tensor map's
** copies write with CU_TENSOR_MAP_SWIZZLE_128B from a 1024-byte boundary). A tile's rows from
** r0 on (r0 a multiple of 8) are the same layout from offset r0 * 64. */
template <int ROWS> __device__ __forceinline__ int panel_at(int r, int c)
{
    return (c / 64) * (ROWS * 64) + r * 64 + ((c % 64) ^ ((r & 7) << 3));
}

/* acc[N / 8][4] += A B over K = 16 * KSTEPS: A in registers as packed fragments (pack_rows), B
** the K rows at b of N columns in shared memory (O += P V): row-major (row stride BS), or with
** PANEL_ROWS the panels of a tile of that many rows (panel_at; b's row a multiple of 8). */
template <int N, int KSTEPS, int BS, int PANEL_ROWS = 0>
__device__ __forceinline__ void mma_regs_by_rows(float (*acc)[4], const u32 (*a)[4],
                                                 const elem_t *b, int lane)
{
#pragma unroll
    for (int kk = 0; kk < KSTEPS; kk++)
#pragma unroll
        for (int op = 0; op < N / 16; op++) {
            u32 b0, b1, b2, b3;
            if (PANEL_ROWS) { /* (apart: one address sum for both reorders row-major's) */
                const int row = kk * 16 + lane % 16, c = op * 16 + (lane / 16) * 8;
                ldmatrix_x4_trans(smem_addr(b + panel_at<PANEL_ROWS>(row, c)), b0, b1, b2, b3);
            } else
                ldmatrix_x4_trans(
                    smem_addr(b + (kk * 16 + lane % 16) * BS + op * 16 + (lane / 16) * 8), b0, b1,
                    b2, b3);
            mma16816(acc[2 * op], a[kk], b0, b1);
            mma16816(acc[2 * op + 1], a[kk], b2, b3);
        }
}

/* a[KSTEPS][4] = the A fragments of the 16 rows x 16 * KSTEPS columns of a matrix held
** transposed in shared memory: t, its column 0, the rows of the transpose (K of them) with row
** stride TS (dQ += dS K with dS^T stored). */
template <int KSTEPS, int TS>
__device__ __forceinline__ void ldmatrix_a_trans(u32 (*a)[4], const elem_t *t, int lane)
{
#pragma unroll
    for (int kk = 0; kk < KSTEPS; kk++)
        ldmatrix_x4_trans(smem_addr(t + (kk * 16 + (lane / 16) * 8 + lane % 8) * TS + ((lane / 8) % 2) * 8),
                          a[kk][0], a[kk][1], a[kk][2], a[kk][3]);
}

/* Zeroes N / 8 accumulator tiles. */
template <int N>
__device__ __forceinline__ void zero_acc(float (*acc)[4])
{
#pragma unroll
    for (int j = 0; j < N / 8; j++)
        acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
}

/* The accumulators of 16 rows by 16 * KSTEPS columns as A-operand fragments of 16-bit pairs: the
** layout of two n8 accumulator tiles is that of one k16 A fragment. */
template <int KSTEPS>
__device__ __forceinline__ void pack_rows(u32 (*a)[4], const float (*acc)[4])
{
#pragma unroll
    for (int kk = 0; kk < KSTEPS; kk++) {
        a[kk][0] = pack2(acc[2 * kk][0], acc[2 * kk][1]);
        a[kk][1] = pack2(acc[2 * kk][2], acc[2 * kk][3]);
        a[kk][2] = pack2(acc[2 * kk + 1][0], acc[2 * kk + 1][1]);
        a[kk][3] = pack2(acc[2 * kk + 1][2], acc[2 * kk + 1][3]);
    }
}
