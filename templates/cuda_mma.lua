% -- Device helpers for CUDA tensor-core kernels (sm_80+), in inline PTX so that a compile needs
% -- no toolkit header: shared-memory addresses, cp.async, ldmatrix, mma.sync m16n8k16 with f32
% -- accumulators, packing floats into 16-bit pairs, ex2. q_t, kv_t, o_t: the element types of
% -- q, k and v, and out. Parameters: q_dtype, kv_dtype, out_dtype ("bf16" or "f16", one type
% -- for all three so far).
% assert(q_dtype == "bf16" or q_dtype == "f16", "cuda_mma: tensor cores take bf16 or f16, not " .. tostring(q_dtype))
% assert(kv_dtype == q_dtype and out_dtype == q_dtype, "cuda_mma: one element type for q, k, v and out")
% local ptx_type = q_dtype
typedef unsigned short elem_t;
typedef elem_t q_t;
typedef elem_t kv_t;
typedef elem_t o_t;
typedef unsigned int u32;
typedef unsigned long long u64;

__device__ __forceinline__ u32 smem_addr(const void *p)
{
    u64 a;
    asm("cvta.to.shared.u64 %0, %1;" : "=l"(a) : "l"(p));
    return (u32)a;
}

/* Copies 16 bytes global -> shared without registers; src_bytes 0 writes zeros instead. */
__device__ __forceinline__ void cp_async16(u32 dst, const void *src, int src_bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
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
