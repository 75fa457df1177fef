% -- Device helpers for Hopper (sm_90a) kernels, in inline PTX: mbarriers, bulk copies (rows,
% -- and tensor boxes by TMA), register reallocation, and warpgroup matrix products (wgmma) with
% -- their shared-memory descriptors. Include after cuda_mma.lua (it defines elem_t, u32, u64,
% -- smem_addr, and the named barriers bar_sync and bar_arrive).
% -- Parameter: q_dtype ("bf16" or "f16", or an FP8 type, "f8e4m3" or "f8e5m2"; cuda_mma.lua
% -- checks that k and v share it).
% local fp8_type = ({ f8e4m3 = "e4m3", f8e5m2 = "e5m2" })[q_dtype]
% local ptx_type = fp8_type or q_dtype

/* A TMA descriptor made by cuTensorMapEncodeTiled on the host, passed by value. */
struct __align__(64) tmap_t {
    u64 opaque[16];
};

/* ---- mbarriers: a phase completes when `count` arrivals and the expected bytes are in ---- */
__device__ __forceinline__ void mbar_init(u32 bar, u32 count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count));
}
/* Makes the initialised barriers visible to the copy engine and the other threads. */
__device__ __forceinline__ void mbar_init_fence()
{
    asm volatile("fence.mbarrier_init.release.cluster;\n\tfence.proxy.async.shared::cta;" ::: "memory");
}
/* One arrival that also announces `bytes` still to come from bulk copies. */
__device__ __forceinline__ void mbar_arrive_expect(u32 bar, u32 bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(u32 bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
/* One arrival for the calling warp, once all its threads got here. */
__device__ __forceinline__ void warp_arrive(u32 bar)
{
    __syncwarp();
    if (threadIdx.x % 32 == 0)
        mbar_arrive(bar);
}
/* An arrival on `bar`, made once all of this thread's earlier cp.async copies have landed (the
** barrier's count includes it). */
__device__ __forceinline__ void cp_async_arrive(u32 bar)
{
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}
/* Waits until the phase of the given parity has completed. A fresh barrier is in phase 0, so
** waiting for parity 1 returns at once: a producer's first wait on an empty slot. CLUSTER: also
** acquires what arrivals from other blocks of the cluster released (mbar_arrive_cluster). */
template <bool CLUSTER = false> __device__ __forceinline__ void mbar_wait(u32 bar, u32 parity)
{
    u32 done;
    do {
        if constexpr (CLUSTER)
            asm volatile("{\n\t.reg .pred p;\n\t"
                         "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n\t"
                         "selp.u32 %0, 1, 0, p;\n\t}"
                         : "=r"(done) : "r"(bar), "r"(parity) : "memory");
        else
            asm volatile("{\n\t.reg .pred p;\n\t"
                         "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
                         "selp.u32 %0, 1, 0, p;\n\t}"
                         : "=r"(done) : "r"(bar), "r"(parity) : "memory");
    } while (!done);
}

__device__ __forceinline__ void st_shared_u32(u32 addr, u32 v)
{
    asm volatile("st.shared.u32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ u32 ld_shared_u32(u32 addr)
{
    u32 v;
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
    return v;
}
__device__ __forceinline__ void st_shared_zero16(u32 addr)
{
    asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};" ::"r"(addr), "r"(0) : "memory");
}
/* Orders this thread's global-memory accesses by the generic proxy and by the async proxy (bulk
** copies and reductions) with each other. */
__device__ __forceinline__ void fence_proxy_async_global()
{
    asm volatile("fence.proxy.async.global;" ::: "memory");
}
/* A count in global memory read with acquire and added to with release (GPU scope). */
__device__ __forceinline__ int ld_acquire(const int *p)
{
    int v;
    asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}
__device__ __forceinline__ void red_release_add(int *p, int v)
{
    asm volatile("red.release.gpu.global.add.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
/* Orders this thread's shared-memory writes before later reads by the async proxy (wgmma, TMA). */
__device__ __forceinline__ void fence_proxy_async()
{
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
}

/* Stores four 8 x 8 matrices of 16-bit elements transposed: register j of every thread holds
** its pair of matrix j in the mma fragment layout (row lane / 4, columns 2 (lane % 4) + 0, 1),
** and lane 8 j + i gives the shared-memory address of the 16 bytes that take column i of
** matrix j. */
__device__ __forceinline__ void stmatrix_x4_trans(u32 addr, const u32 *r)
{
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};"
                 ::"r"(addr), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3]) : "memory");
}
/* The same without transposing: lane 8 j + i gives the address of the 16 bytes of row i of
** matrix j. */
__device__ __forceinline__ void stmatrix_x4(u32 addr, const u32 *r)
{
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};"
                 ::"r"(addr), "r"(r[0]), "r"(r[1]), "r"(r[2]), "r"(r[3]) : "memory");
}
__device__ __forceinline__ void st_shared_v2(u32 addr, float a, float b)
{
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};" ::"r"(addr), "f"(a), "f"(b) : "memory");
}

/* ---- clusters: a block's partner and its shared memory ---------------------------------- */
__device__ __forceinline__ u32 cluster_rank()
{
    u32 r;
    asm("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}
/* Every thread of every block of the cluster arrives, then waits for all: what each block wrote
** before is visible to the others after (its barriers' initialisation included). */
__device__ __forceinline__ void cluster_sync()
{
    asm volatile("barrier.cluster.arrive.release;\n\tbarrier.cluster.wait.acquire;" ::: "memory");
}
/* The address in block `rank`'s shared memory of what is at addr in this block's. */
__device__ __forceinline__ u32 cluster_map(u32 addr, u32 rank)
{
    u32 r;
    asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(addr), "r"(rank));
    return r;
}
__device__ __forceinline__ void st_cluster_v4(u32 addr, float a, float b, float c, float d)
{
    asm volatile("st.shared::cluster.v4.f32 [%0], {%1, %2, %3, %4};"
                 ::"r"(addr), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
}
/* An arrival on a barrier of another block of the cluster (addr from cluster_map), which
** releases this thread's earlier writes to the cluster. */
__device__ __forceinline__ void mbar_arrive_cluster(u32 addr)
{
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(addr) : "memory");
}
/* ---- bulk copies ------------------------------------------------------------------------ */
/* Copies `bytes` (a multiple of 16; both addresses 16-byte aligned) from global to shared memory;
** the barrier counts them. policy: an L2 cache policy (such as cuda_mma.lua's l2_evict_first). */
__device__ __forceinline__ void bulk_load_row(u32 dst, const void *src, u32 bytes, u32 bar, u64 policy)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
                 " [%0], [%1], %2, [%3], %4;"
                 ::"r"(dst), "l"(src), "r"(bytes), "r"(bar), "l"(policy) : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }
/* Waits until at most N of the calling thread's bulk groups have sources still to read. */
template <int N> __device__ __forceinline__ void bulk_wait_read()
{
    asm volatile("cp.async.bulk.wait_group.read %0;" ::"n"(N) : "memory");
}
/* Waits until at most N of the calling thread's bulk groups are incomplete. */
template <int N> __device__ __forceinline__ void bulk_wait()
{
    asm volatile("cp.async.bulk.wait_group %0;" ::"n"(N) : "memory");
}
/* Copies one box of a rank-4 tensor to shared memory (bulk tensor copies, TMA); the barrier
** counts its bytes. Elements outside the tensor arrive as zeros. */
__device__ __forceinline__ void tma_load4(u32 dst, const tmap_t *map, u32 bar, int c0, int c1,
                                          int c2, int c3)
{
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%3, %4, %5, %6}], [%2];"
                 ::"r"(dst), "l"((u64)map), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3)
                 : "memory");
}
/* tma_load4 into the same shared-memory offset of every block of the cluster that `mask` names
** (bit r: rank r), each block's barrier at bar's offset counting the bytes it receives. */
__device__ __forceinline__ void tma_load4_multicast(u32 dst, const tmap_t *map, u32 bar, int c0,
                                                    int c1, int c2, int c3, u16 mask)
{
    asm volatile("cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 ".multicast::cluster [%0], [%1, {%3, %4, %5, %6}], [%2], %7;"
                 ::"r"(dst), "l"((u64)map), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3),
                 "h"(mask)
                 : "memory");
}
/* Adds one box of f32 from shared memory (laid out as tma_load4 writes it) into a rank-4 tensor
** at (c0, c1, c2, c3), element by element and atomically, skipping elements outside the tensor:
** one bulk operation of the calling thread's current bulk group. The writes of the source need
** fence_proxy_async() by their threads first; the source may be written again once
** bulk_wait_read() says the group was read; the kernel must not end before bulk_wait() (the
** sums landed). */
__device__ __forceinline__ void tma_reduce_add4(const tmap_t *map, u32 src, int c0, int c1, int c2,
                                                int c3)
{
    asm volatile("cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group"
                 " [%0, {%2, %3, %4, %5}], [%1];"
                 ::"l"((u64)map), "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3) : "memory");
}
__device__ __forceinline__ void tma_prefetch_map(const tmap_t *map)
{
    asm volatile("prefetch.tensormap [%0];" ::"l"((u64)map) : "memory");
}

/* The coordinates of a box at (col, row) of (batch, head) in a tensor map whose three outer
** dimensions the host ordered by stride; perm holds the slot of the row and head dimensions.
** With a mask, into every block of the cluster it names (tma_load4_multicast). */
__device__ __forceinline__ void tma_load_tile(u32 dst, const tmap_t *map, u32 bar, int col,
                                              int row, int head, int batch, int perm,
                                              u16 multicast = 0)
{
    const int ps = perm & 3, ph = (perm >> 2) & 3;
    const int c1 = ps == 0 ? row : ph == 0 ? head : batch;
    const int c2 = ps == 1 ? row : ph == 1 ? head : batch;
    const int c3 = ps == 2 ? row : ph == 2 ? head : batch;
    if (multicast)
        tma_load4_multicast(dst, map, bar, col, c1, c2, c3, multicast);
    else
        tma_load4(dst, map, bar, col, c1, c2, c3);
}

/* Copies a tile of `rows` rows and COLS columns of ES bytes (from column col0) as panels of rows
** x 128 bytes (64 columns of 16 bits, 128 of 8; a last part-panel is filled out by the map's
** zeros or the next columns): panels first, first + step, ... of them (a cluster's blocks
** sharing a tile's copies take every other one), with a mask into every block it names. */
template <int COLS, int ES = 2>
__device__ __forceinline__ void load_panels(u32 dst, const tmap_t *map, u32 bar, int rows,
                                            int row, int head, int batch, int perm, int col0 = 0,
                                            int first = 0, int step = 1, u16 multicast = 0)
{
    constexpr int PC = 128 / ES; /* columns a panel */
#pragma unroll
    for (int p = first; p < (COLS + PC - 1) / PC; p += step)
        tma_load_tile(dst + p * rows * 128, map, bar, col0 + p * PC, row, head, batch, perm,
                      multicast);
}

/* ---- register reallocation between warpgroups --------------------------------------------- */
template <int N> __device__ __forceinline__ void regs_dec()
{
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N));
}
template <int N> __device__ __forceinline__ void regs_inc()
{
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N));
}

/* ---- wgmma ---------------------------------------------------------------------------------- */
/* A shared-memory matrix descriptor for the 128-byte swizzle (the layout TMA writes with
** CU_TENSOR_MAP_SWIZZLE_128B): rows of 128 bytes, eight-row atoms of 1024 bytes. lbo and sbo
** are the leading and stride byte offsets of the PTX ISA's canonical layouts. */
__device__ __forceinline__ u64 gmma_desc(u32 addr, u32 lbo, u32 sbo)
{
    return (u64)((addr & 0x3ffff) >> 4) | (u64)((lbo >> 4) & 0x3fff) << 16 |
           (u64)((sbo >> 4) & 0x3fff) << 32 | (u64)1 << 62;
}
/* A tile of `rows` rows stored as panels of rows x 128 bytes in that swizzle (16-byte chunk j of
** row r at chunk j ^ (r % 8)): the address of chunk j of row r, and of 16-bit element (r, c). */
__device__ __forceinline__ u32 swizzled_chunk(u32 tile, int rows, int r, int j)
{
    return tile + (j / 8) * rows * 128 + r * 128 + (((j % 8) ^ (r % 8)) << 4);
}
/* (Written out rather than as swizzled_chunk(tile, rows, r, c / 8) + (c % 8) * 2, the same
** address: that form gives ptxas other code for the kernels that use it, not yet timed.) */
__device__ __forceinline__ u32 swizzled(u32 tile, int rows, int r, int c)
{
    return tile + (c / 64) * (rows * 128) + r * 128 + ((((c % 64) / 8) ^ (r % 8)) << 4) +
           (c % 8) * 2;
}
/* a, as a value computed here: what derives from it (descriptors, addresses) is computed where
** it is used, not hoisted out of a loop into registers held across the loop. */
__device__ __forceinline__ u32 here(u32 a)
{
    asm volatile("" : "+r"(a));
    return a;
}
/* The descriptor of k16 step kk of an operand stored as 64-column panels of `rows` rows with the
** 128-byte swizzle. K-major: 32 bytes a step inside a panel, the next panel every fourth step.
** N-major (transposed): 16 rows a step, its N panels rows * 128 bytes apart. */
__device__ __forceinline__ u64 gmma_kmajor(u32 tile, int rows, int kk)
{
    return gmma_desc(tile + (kk / 4) * rows * 128 + (kk % 4) * 32, 16, 1024);
}
__device__ __forceinline__ u64 gmma_nmajor(u32 tile, int rows, int kk)
{
    return gmma_desc(tile + kk * 16 * 128, rows * 128, 1024);
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N> __device__ __forceinline__ void wgmma_wait()
{
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
/* Ties registers to this point: the compiler sees wgmma's outputs only as the asm operands of
** the issue, so reads after the wait must not be moved above it. */
template <int N> __device__ __forceinline__ void fence_regs(float *r)
{
#pragma unroll
    for (int i = 0; i < N; i++)
        asm volatile("" : "+f"(r[i])::"memory");
}
template <int N> __device__ __forceinline__ void fence_regs(u32 *r)
{
#pragma unroll
    for (int i = 0; i < N; i++)
        asm volatile("" : "+r"(r[i])::"memory");
}
% -- The operand lists of one wgmma: n/2 accumulators per thread, then the inputs.
% local function acc_list(n)
%   local t = {}
%   for i = 0, n // 2 - 1 do t[#t + 1] = "%" .. i end
%   return table.concat(t, ", ")
% end
% local function acc_operands(n)
%   local t = {}
%   for i = 0, n // 2 - 1 do t[#t + 1] = '"+f"(d[' .. i .. '])' end
%   return table.concat(t, ", ")
% end
% -- wgmma_ss_N: D[64 x N] (+)= A[64 x 16] B[16 x N], both from shared memory, K-major.
% -- wgmma_ss_t_N: the same with B N-major (transposed), as the backward's dQ = dS K needs.
% -- wgmma_rs_N: the same with A from registers (four 16-bit pairs, the mma.sync A layout) and
% -- B N-major (transposed), as P V needs; wgmma_rs_k_N (16 bits) with B K-major, as Q K^T with
% -- Q's fragments in registers needs.
% -- With FP8 inputs each product takes k = 32 (32 bytes a row, as k = 16 does in 16 bits) and
% -- both operands K-major, which FP8 requires: wgmma_ss_N for q and k, and wgmma_rs_N with A
% -- from registers in e4m3 (P; four words of four: thread (g, t) of a warp holds row g's
% -- k = 4t..4t+3, row g + 8's, row g's k = 16 + 4t.., row g + 8's) and B in v's type.
% function hopper_wgmma(n)
%   local a = n // 2
%   -- 16 bits: k = 16, the products' transpose flags (A never, B as named); FP8: k = 32, no
%   -- flags (K-major only), A from registers in e4m3.
%   local k = fp8_type and 32 or 16
%   local ss_forms = fp8_type and { { name = "ss", flags = "" } }
%       or { { name = "ss", flags = ", 0, 0" }, { name = "ss_t", flags = ", 0, 1" } }
%   local rs_types = (fp8_type and "e4m3" or ptx_type) .. "." .. ptx_type
%   local rs_forms = fp8_type and { { name = "rs", flags = "" } }
%       or { { name = "rs", flags = ", 1" }, { name = "rs_k", flags = ", 0" } }
%   for _, ss in ipairs(ss_forms) do
__device__ __forceinline__ void wgmma_${ss.name}_${n}(float *d, u64 desc_a, u64 desc_b, int accumulate)
{
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %${a + 2}, 0;\n\t"
                 "wgmma.mma_async.sync.aligned.m64n${n}k${k}.f32.${ptx_type}.${ptx_type} "
                 "{${acc_list(n)}}, %${a}, %${a + 1}, p, 1, 1${ss.flags};\n\t}"
                 : ${acc_operands(n)}
                 : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}
%   end
%   for _, rs in ipairs(rs_forms) do
__device__ __forceinline__ void wgmma_${rs.name}_${n}(float *d, const u32 *a, u64 desc_b, int accumulate)
{
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %${a + 5}, 0;\n\t"
                 "wgmma.mma_async.sync.aligned.m64n${n}k${k}.f32.${rs_types} "
                 "{${acc_list(n)}}, {%${a}, %${a + 1}, %${a + 2}, %${a + 3}}, %${a + 4}, p, 1, 1${rs.flags};\n\t}"
                 : ${acc_operands(n)}
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(accumulate));
}
%   end
% end
