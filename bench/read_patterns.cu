// How fast the GPU's memory serves a decode's reads of K and V in a given order and copy
// mechanism, with no arithmetic on them: the ceiling of each of the decode kernel's read
// patterns, beside which its own and cuDNN's bandwidth can be read (bench/RESULTS.md).
//
// K and V: [B, S, 8, 128] bf16 (256-byte rows, rows of one kv head 2 KiB apart), two buffers.
// The grid is the decode's without splits, (1, 8, B), 128 threads a block; block (h, b) reads
// kv head h of sequence b, tile by tile, into a ring of shared memory, and touches each tile
// once it has landed. Patterns (`mode`):
//   0  a ring slot holds TK keys of K then of V (a thread issues its K pieces, then its V
//      pieces), 16-byte cp.async;
//   1  the same, a thread's K and V pieces alternating;
//   2  the ring's slots take K's tile and V's tile in turn (cuDNN's decode kernel holds one
//      128-key tile of each);
//   3  contiguous: each block reads its share of K, then of V, 16 bytes a load (`ld.global.cs`);
//   4  as 0, the rows in [b, h, s, d] memory (a block's rows contiguous);
//   5  as 0 by the bulk-copy engine, a row a copy, each slot complete on its mbarrier (the
//      decode kernel's `bulk` loader for large dense caches);
//   6  as 5 with the L2 policy the decode kernel gives its copies (evict-first);
//   7  as 6 into rows padded by 16 bytes in shared memory (the decode kernel's ring rows,
//      padded for ldmatrix), so no row but every eighth starts on a 128-byte line.
// Blocks an SM follow from the ring's size (printed).
//
// Build and run on the GPU machine (nothing else of the library needed):
//   nvcc -O3 -arch=sm_90 -o /tmp/read_patterns bench/read_patterns.cu
//   /tmp/read_patterns [B=128] [S=8192] [RANDOM=0]
// Prints GB/s of K and V read for each pattern, twice over the list. RANDOM=1 fills K and V
// with random bf16 values (as the benchmarks' caches) instead of constant bytes.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#define CHECK(x)                                                                                \
    do {                                                                                        \
        cudaError_t e_ = (x);                                                                   \
        if (e_ != cudaSuccess) {                                                                \
            printf("%s: %s\n", #x, cudaGetErrorString(e_));                                     \
            exit(1);                                                                            \
        }                                                                                       \
    } while (0)

enum { HEADS = 8, ROW = 256, THREADS = 128 };

__device__ __forceinline__ unsigned shared_addr(const void *p)
{
    return (unsigned)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void cp16(void *s, const void *g)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(shared_addr(s)), "l"(g));
}
__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;"); }
template <int N> __device__ __forceinline__ void wait_groups()
{
    asm volatile("cp.async.wait_group %0;" ::"n"(N));
}
// Waits until at most n (0-6) of the thread's cp.async groups are pending.
__device__ __forceinline__ void wait_groups(int n)
{
    switch (n) {
    case 0: wait_groups<0>(); break;
    case 1: wait_groups<1>(); break;
    case 2: wait_groups<2>(); break;
    case 3: wait_groups<3>(); break;
    case 4: wait_groups<4>(); break;
    case 5: wait_groups<5>(); break;
    default: wait_groups<6>(); break;
    }
}
__device__ __forceinline__ void mbar_init(unsigned bar, int count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_expect(unsigned bar, unsigned bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar),
                 "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned bar, unsigned parity)
{
    asm volatile("{\n .reg .pred p;\n W: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
                 " @!p bra W;\n}" ::"r"(bar), "r"(parity) : "memory");
}
// A bulk copy completing on mbarrier bar; evict_first: the lines evict-first in L2, as the
// decode kernel copies K and V.
__device__ __forceinline__ void bulk_row(unsigned dst, const void *src, unsigned bytes,
                                         unsigned bar, bool evict_first)
{
    if (evict_first) {
        unsigned long long policy;
        asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
                     ".L2::cache_hint [%0], [%1], %2, [%3], %4;"
                     ::"r"(dst), "l"(src), "r"(bytes), "r"(bar), "l"(policy) : "memory");
    } else {
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
                     " [%0], [%1], %2, [%3];"
                     ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
    }
}
// Modes 5 and 6 copy by the bulk-copy engine (and need the ring's mbarriers).
__host__ __device__ constexpr bool bulk_mode(int mode) { return mode >= 5 && mode <= 7; }
// Bytes between a tile's rows in shared memory.
__host__ __device__ constexpr int smem_row(int mode) { return mode == 7 ? ROW + 16 : ROW; }

struct params {
    const char *k, *v;
    int batch, seqlen, mode, tile, stages; // tile: keys a tile (TK); stages: ring slots
    float *sink;                           // written never (keeps the loads)
};

__device__ __forceinline__ const char *row_addr(const params &p, const char *base, int b, int h,
                                                int s)
{
    if (p.mode == 4)
        return base + ((((size_t)b * HEADS + h) * p.seqlen + s) * ROW);
    return base + ((((size_t)b * p.seqlen + s) * HEADS + h) * ROW);
}

// Mode 3: the block's share of each buffer, read front to back.
__device__ void read_contiguous(const params &p, int block, int blocks, int t, float &acc)
{
    const size_t n = (size_t)p.batch * p.seqlen * HEADS * ROW / 16, per = n / blocks;
    for (int which = 0; which < 2; which++) {
        const uint4 *x = (const uint4 *)(which ? p.v : p.k) + (size_t)block * per;
        for (size_t i = t; i < per; i += THREADS * 4) {
#pragma unroll
            for (int u = 0; u < 4; u++)
                if (i + u * THREADS < per) {
                    const uint4 y = __ldcs(x + i + u * THREADS);
                    acc += __uint_as_float(y.x ^ y.w);
                }
        }
    }
}

// Modes 5 and 6: tile u's K and V rows by bulk copies into slot u % stages.
__device__ void read_bulk(const params &p, char *smem, int b, int h, int t, float &acc)
{
    const int tk = p.tile, tiles = p.seqlen / tk, rs = smem_row(p.mode), slot_bytes = 2 * tk * rs;
    const unsigned bars = shared_addr(smem + p.stages * slot_bytes);
    if (t == 0) {
        for (int s = 0; s < p.stages; s++)
            mbar_init(bars + 8 * s, 1);
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    auto issue = [&](int u) {
        if (u >= tiles)
            return;
        const int slot = u % p.stages;
        const unsigned bar = bars + 8 * slot;
        if (t == 0)
            mbar_expect(bar, 2 * tk * ROW);
        for (int i = t; i < 2 * tk; i += THREADS) {
            const bool is_k = i < tk;
            const int r = is_k ? i : i - tk;
            char *dst = smem + slot * slot_bytes + (is_k ? 0 : tk * rs) + r * rs;
            bulk_row(shared_addr(dst), row_addr(p, is_k ? p.k : p.v, b, h, u * tk + r), ROW,
                     bar, p.mode >= 6);
        }
    };
    for (int u = 0; u < p.stages - 1; u++)
        issue(u);
    for (int u = 0; u < tiles; u++) {
        mbar_wait(bars + 8 * (u % p.stages), (u / p.stages) & 1);
        acc += *(const float *)(smem + (u % p.stages) * slot_bytes + t * 16);
        __syncthreads(); // every thread is past slot (u - 1), which issue() refills
        issue(u + p.stages - 1);
    }
}

// Modes 0, 1, 2, 4: cp.async into the ring, a commit group a unit (a tile of K and V, or in
// mode 2 a tile of K or of V).
__device__ void read_cp_async(const params &p, char *smem, int b, int h, int t, float &acc)
{
    const int tk = p.tile, pieces = tk * ROW / 16, tiles = p.seqlen / tk;
    const int slot_bytes = (p.mode == 2 ? 1 : 2) * tk * ROW;
    const int units = p.mode == 2 ? 2 * tiles : tiles;
    auto piece = [&](const char *base, int tile, int q) {
        return row_addr(p, base, b, h, tile * tk + q / 16) + (q % 16) * 16;
    };
    auto issue = [&](int u) {
        if (u < units) {
            char *slot = smem + (u % p.stages) * slot_bytes;
            if (p.mode == 2) {
                for (int q = t; q < pieces; q += THREADS)
                    cp16(slot + q * 16, piece((u & 1) ? p.v : p.k, u >> 1, q));
            } else if (p.mode == 1) {
                for (int q = t; q < pieces; q += THREADS) {
                    cp16(slot + q * 16, piece(p.k, u, q));
                    cp16(slot + tk * ROW + q * 16, piece(p.v, u, q));
                }
            } else {
                for (int q = t; q < pieces; q += THREADS)
                    cp16(slot + q * 16, piece(p.k, u, q));
                for (int q = t; q < pieces; q += THREADS)
                    cp16(slot + tk * ROW + q * 16, piece(p.v, u, q));
            }
        }
        commit(); // an empty group past the end keeps the count
    };
    for (int u = 0; u < p.stages - 1; u++)
        issue(u);
    for (int u = 0; u < units; u++) {
        wait_groups(p.stages - 2);
        __syncthreads();
        acc += *(const float *)(smem + (u % p.stages) * slot_bytes + t * 16);
        __syncthreads();
        issue(u + p.stages - 1);
    }
    wait_groups<0>();
}

__global__ void __launch_bounds__(THREADS) read_kv(params p)
{
    extern __shared__ __align__(128) char smem[];
    const int b = blockIdx.z, h = blockIdx.y, t = threadIdx.x;
    float acc = 0;
    if (p.mode == 3)
        read_contiguous(p, b * gridDim.y + h, gridDim.y * gridDim.z, t, acc);
    else if (bulk_mode(p.mode))
        read_bulk(p, smem, b, h, t, acc);
    else
        read_cp_async(p, smem, b, h, t, acc);
    if (acc == 1.2345f)
        p.sink[0] = acc;
}

// Random signed bf16 pairs of magnitude 2^-15 to 2 (a hash of the index), so the bytes vary
// as a real cache's do.
__global__ void fill_random(unsigned *x, size_t n, unsigned seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        unsigned h = (unsigned)i * 2654435761u ^ seed;
        h ^= h >> 15;
        h *= 2246822519u;
        h ^= h >> 13;
        x[i] = (h & 0xbfffbfffu) | 0x38003800u;
    }
}

int main(int argc, char **argv)
{
    const int batch = argc > 1 ? atoi(argv[1]) : 128, seqlen = argc > 2 ? atoi(argv[2]) : 8192;
    const size_t bytes = (size_t)batch * seqlen * HEADS * ROW;
    char *k, *v;
    float *sink;
    CHECK(cudaMalloc(&k, bytes));
    CHECK(cudaMalloc(&v, bytes));
    CHECK(cudaMalloc(&sink, 4));
    if (argc > 3 && atoi(argv[3])) {
        fill_random<<<1024, 256>>>((unsigned *)k, bytes / 4, 1);
        fill_random<<<1024, 256>>>((unsigned *)v, bytes / 4, 2);
        CHECK(cudaGetLastError());
        printf("random bf16 data\n");
    } else {
        CHECK(cudaMemset(k, 1, bytes));
        CHECK(cudaMemset(v, 2, bytes));
    }
    CHECK(cudaFuncSetAttribute(read_kv, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 << 10));
    static const struct {
        int mode, tile, stages, min_kib; // min_kib: shared memory asked for at least
        const char *name;
    } cases[] = {
        {0, 64, 4, 0, "K then V a slot, 64 x 4"},
        {0, 64, 3, 0, "K then V a slot, 64 x 3"},
        {1, 64, 3, 0, "K, V alternating pieces, 64 x 3"},
        {0, 64, 2, 0, "K then V a slot, 64 x 2"},
        {0, 128, 2, 0, "K then V a slot, 128 x 2"},
        {2, 128, 2, 86, "K tile, V tile in turn, 128 x 2 in 86 KiB (cuDNN's shape)"},
        {2, 128, 3, 0, "K tile, V tile in turn, 128 x 3"},
        {2, 64, 4, 0, "K tile, V tile in turn, 64 x 4"},
        {2, 64, 6, 0, "K tile, V tile in turn, 64 x 6"},
        {5, 64, 3, 0, "bulk rows, K then V a slot, 64 x 3"},
        {6, 64, 3, 0, "bulk rows evict-first, K then V a slot, 64 x 3"},
        {7, 64, 3, 0, "bulk rows evict-first into padded rows, 64 x 3 (the decode kernel's)"},
        {5, 64, 4, 0, "bulk rows, K then V a slot, 64 x 4"},
        {5, 128, 2, 0, "bulk rows, K then V a slot, 128 x 2"},
        {4, 64, 3, 0, "[b, h, s, d] rows, K then V a slot, 64 x 3"},
        {3, 0, 0, 0, "contiguous shares, 16-byte loads"},
    };
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    for (int round = 0; round < 2; round++)
        for (const auto &c : cases) {
            const params p{k, v, batch, seqlen, c.mode, c.tile, c.stages, sink};
            int smem = c.mode == 3 ? 0
                                   : c.stages * (c.mode == 2 ? 1 : 2) * c.tile * smem_row(c.mode) +
                                         (bulk_mode(c.mode) ? 64 : 0);
            if (c.min_kib * 1024 > smem)
                smem = c.min_kib * 1024;
            const dim3 grid(1, HEADS, batch);
            for (int w = 0; w < 3; w++)
                read_kv<<<grid, THREADS, smem>>>(p);
            CHECK(cudaGetLastError());
            const int reps = 10;
            CHECK(cudaEventRecord(e0));
            for (int r = 0; r < reps; r++)
                read_kv<<<grid, THREADS, smem>>>(p);
            CHECK(cudaEventRecord(e1));
            CHECK(cudaEventSynchronize(e1));
            float ms;
            CHECK(cudaEventElapsedTime(&ms, e0, e1));
            int per_sm = 0;
            CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, read_kv, THREADS, smem));
            printf("round %d  %6.0f GB/s  blocks/SM %2d  %s\n", round,
                   2.0 * bytes * reps / (ms * 1e6), per_sm, c.name);
        }
    return 0;
}
