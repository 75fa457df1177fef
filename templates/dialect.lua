% -- The portable dialect: one spelling of a kernel for OpenCL C and CUDA C++. Templates written
% -- with these macros (KERNEL, GLOBAL, SHARED, BARRIER, THREAD_X, BLOCK_X/Y/Z, F_* math, I64,
% -- LOCAL_FLAG_SET: set a shared int to 1 from any number of threads; KERNEL_ONE_BLOCK: a
% -- KERNEL whose work-items may take all the registers one block leaves them, where ptxas
% -- would otherwise keep them to fewer, for more blocks an SM, and spill)
% -- render for either backend. Element access by role: q_t, kv_t, o_t are the element types in
% -- memory of q, of k and v, and of out (a family may give the roles other meanings); Q_LOAD(p,
% -- i) reads element i as float (likewise KV_, O_; *_LOAD_RO through the read-only path) and
% -- Q_STORE(p, i, x) writes x rounded to nearest even. Where all three types are one, STORE_T,
% -- LOAD, LOAD_RO and STORE name it and its accesses.
% -- GPTR(T, x): a pointer field of a parameter block as a pointer to T (on OpenCL pointers
% -- travel in blocks as integers).
% -- smem_matches_host() checks, at compile time, that the kernel's struct Smem has the size the
% -- host gave as shared_bytes (fj__variant_shared_bytes).
% -- Parameters: backend ("opencl" or "cuda"), q_dtype, kv_dtype, out_dtype ("f32", "f16",
% -- "bf16", "f8e4m3", "f8e5m2"; FP8 stores round to nearest even and saturate at the largest
% -- finite value, as CUDA's satfinite conversions).
% if backend == "opencl" then
#define KERNEL(threads) __kernel __attribute__((reqd_work_group_size(threads, 1, 1))) void
#define KERNEL_ONE_BLOCK(threads) KERNEL(threads)
#define GLOBAL __global
#define SHARED __local
#define BARRIER() barrier(CLK_LOCAL_MEM_FENCE)
#define THREAD_X ((int)get_local_id(0))
#define BLOCK_X ((int)get_group_id(0))
#define BLOCK_Y ((int)get_group_id(1))
#define BLOCK_Z ((int)get_group_id(2))
#define F_FMA fma
#define F_MAX fmax
#define F_EXP2 exp2
#define F_LOG2 log2
#define F_TANH tanh
#define F_RINT rint
#define F_INF INFINITY
#define F_LN2 M_LN2_F
#define LOCAL_FLAG_SET(x) atomic_or(&(x), 1)
#define BITS_TO_FLOAT as_float
#define FLOAT_TO_BITS as_uint
#define INLINE inline
typedef long I64;
% elseif backend == "cuda" then
#define KERNEL(threads) extern "C" __global__ void __launch_bounds__(threads)
#define KERNEL_ONE_BLOCK(threads) extern "C" __global__ void __launch_bounds__(threads, 1)
#define GLOBAL
#define SHARED __shared__
#define BARRIER() __syncthreads()
#define THREAD_X ((int)threadIdx.x)
#define BLOCK_X ((int)blockIdx.x)
#define BLOCK_Y ((int)blockIdx.y)
#define BLOCK_Z ((int)blockIdx.z)
#define F_FMA fmaf
#define F_MAX fmaxf
#define F_EXP2 exp2f
#define F_LOG2 log2f
#define F_TANH tanhf
#define F_RINT rintf
#define F_INF __int_as_float(0x7f800000)
#define F_LN2 0.693147180559945309f
#define LOCAL_FLAG_SET(x) atomicOr(&(x), 1)
#define BITS_TO_FLOAT __uint_as_float
#define FLOAT_TO_BITS __float_as_uint
#define INLINE __device__ __forceinline__
typedef long long I64;
typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
% else
%   error("dialect: unknown backend " .. tostring(backend))
% end
#define GPTR(T, x) ((GLOBAL T *)(x))
#define F_MAXF 3.40282347e38f /* the largest finite float */
#define F_NAN BITS_TO_FLOAT(0x7fc00000u)
% -- LDG(p): *p for memory the kernel only reads (masks, ranges, classes, offsets), through
% -- CUDA's read-only data cache; LOAD_RO(p, i) likewise for an element as float.
% if backend == "cuda" then
#define LDG(p) __ldg(p)
% else
#define LDG(p) (*(p))
% end
#define I_MIN(a, b) ((a) < (b) ? (a) : (b))
#define I_MAX(a, b) ((a) > (b) ? (a) : (b))
/* Division of ints in [0, 2^31) by a divisor fixed for the kernel (d >= 1: a page size) by a
** multiply-high, an add and a shift, where `/` by a runtime int costs ~20 instructions: on a
** copying thread's path that is time the whole block waits for. Granlund and Montgomery's
** multiplier: l = ceil(log2 d), m = 2^32 (2^l - d) / d + 1; n / d = (mul_hi(n, m) + n) >> l,
** which does not overflow for n < 2^31. divider_of once, then div_by / mod_by. */
typedef struct {
    uint d, mul, shift;
} divider;
INLINE divider divider_of(int d)
{
    divider v;
    v.d = (uint)d;
    v.shift = 0;
    while ((1u << v.shift) < v.d)
        v.shift++;
    v.mul = (uint)((((I64)1 << 32) * (((I64)1 << v.shift) - (I64)d)) / d + 1);
    return v;
}
INLINE int div_by(divider v, int n)
{
% if backend == "cuda" then
    return (int)((__umulhi((uint)n, v.mul) + (uint)n) >> v.shift);
% else
    return (int)((mul_hi((uint)n, v.mul) + (uint)n) >> v.shift);
% end
}
INLINE int mod_by(divider v, int n) { return n - div_by(v, n) * (int)v.d; }
/* What mask and score expressions may call (plan/expr.h). Functions, not macros: a macro that
** repeats its argument makes nested calls (abs(abs(...))) grow exponentially when the compiler
** expands them. Integer arithmetic is int32 that wraps, computed on uint (C leaves signed overflow
** undefined), and a zero divisor gives 0: the semantics the header promises and the host's
** evaluator computes. */
INLINE int expr_iadd(int a, int b) { return (int)((uint)a + (uint)b); }
INLINE int expr_isub(int a, int b) { return (int)((uint)a - (uint)b); }
INLINE int expr_imul(int a, int b) { return (int)((uint)a * (uint)b); }
INLINE int expr_ineg(int a) { return (int)(0u - (uint)a); }
INLINE int expr_idiv(int a, int b) { return b == 0 ? 0 : b == -1 ? expr_ineg(a) : a / b; }
INLINE int expr_imod(int a, int b) { return b == 0 || b == -1 ? 0 : a % b; }
% if backend == "cuda" then
/* NVVM's optimiser takes time exponential in the depth of nested integer min/max (a select or
** its min intrinsic: 12 levels ~50 s, each level ~3x), so they are PTX it cannot look through;
** ptxas still makes them one IMNMX each. */
INLINE int expr_imin(int a, int b) { int r; asm("min.s32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b)); return r; }
INLINE int expr_imax(int a, int b) { int r; asm("max.s32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(b)); return r; }
% else
INLINE int expr_imin(int a, int b) { return a < b ? a : b; }
INLINE int expr_imax(int a, int b) { return a > b ? a : b; }
% end
INLINE int expr_iabs(int a) { return a < 0 ? expr_ineg(a) : a; }
#define EXPR_IADD expr_iadd
#define EXPR_ISUB expr_isub
#define EXPR_IMUL expr_imul
#define EXPR_INEG expr_ineg
#define EXPR_IDIV expr_idiv
#define EXPR_IMOD expr_imod
#define EXPR_IMIN expr_imin
#define EXPR_IMAX expr_imax
#define EXPR_IABS expr_iabs
% if backend == "opencl" then
#define EXPR_FMIN fmin
#define EXPR_FMAX fmax
#define EXPR_FABS fabs
#define EXPR_EXP exp
#define EXPR_LOG log
#define EXPR_SQRT sqrt
#define EXPR_TANH tanh
#define EXPR_FLOOR floor
% else
#define EXPR_FMIN fminf
#define EXPR_FMAX fmaxf
#define EXPR_FABS fabsf
#define EXPR_EXP expf
#define EXPR_LOG logf
#define EXPR_SQRT sqrtf
#define EXPR_TANH tanhf
#define EXPR_FLOOR floorf
% end

/* Conversions of the 16-bit types, for whichever roles use them. */
% if backend == "cuda" then
INLINE float f16_to_float(ushort h)
{
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
INLINE ushort float_to_f16(float f)
{
    ushort h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
% end
INLINE float bf16_to_float(ushort b) { return BITS_TO_FLOAT((uint)b << 16); }
INLINE ushort float_to_bf16(float f)
{
    uint u = FLOAT_TO_BITS(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (ushort)((u >> 16) | 0x40u); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (ushort)(u >> 16);
}
% local fp8 = { f8e4m3 = "e4m3", f8e5m2 = "e5m2" }
% -- Whether dtype name dt is an FP8 type (for the asserts of templates that include this one).
% function is_fp8(dt) return fp8[dt] ~= nil end
% if fp8[q_dtype] or fp8[kv_dtype] or fp8[out_dtype] then
/* FP8 to float, exactly: e4m3 (exponent bias 7, no infinities, S.1111.111 is NaN) and e5m2
** (bias 15, IEEE-like: f16's top byte). Subnormals are m * 2^(1 - bias - mantissa bits). */
INLINE float e4m3_to_float(uchar b)
{
    const uint s = (uint)(b & 0x80u) << 24, e = (b >> 3) & 15u, m = b & 7u;
    if (e == 15u && m == 7u)
        return F_NAN;
    if (e == 0u)
        return BITS_TO_FLOAT(s | FLOAT_TO_BITS((float)m * 0.001953125f)); /* 2^-9 */
    return BITS_TO_FLOAT(s | ((e + 120u) << 23) | (m << 20));
}
INLINE float e5m2_to_float(uchar b)
{
    const uint s = (uint)(b & 0x80u) << 24, e = (b >> 2) & 31u, m = b & 3u;
    if (e == 31u)
        return m ? F_NAN : BITS_TO_FLOAT(s | 0x7f800000u);
    if (e == 0u)
        return BITS_TO_FLOAT(s | FLOAT_TO_BITS((float)m * 0.0000152587890625f)); /* 2^-16 */
    return BITS_TO_FLOAT(s | ((e + 112u) << 23) | (m << 21));
}
% end
% if fp8[out_dtype] then
/* Float to FP8, rounded to nearest even, saturated at the largest finite value (infinities
** too); NaN stays NaN. Below the smallest normal, x in units of the subnormal step (rounding
** up to 2^mantissa bits gives the smallest normal's code); from it, the float's bits rounded
** at the FP8 mantissa's last bit and the exponent rebiased (a carry moves into the exponent,
** as it should). */
%   -- Each format: mantissa bits, exponent bias, largest finite value (float bits, and code).
%   for _, f in ipairs({ { "e4m3", 3, 7, "0x43e00000u", "448", "0x7eu" },
%                         { "e5m2", 2, 15, "0x47600000u", "57344", "0x7bu" } }) do
%     local name, m, bias, largest, largest_value, saturated = table.unpack(f)
%     local shift = 23 - m -- the float mantissa's bits below the FP8 one's
%     local normal = string.format("0x%08xu", (128 - bias) << 23) -- 2^(1 - bias)
%     local step = string.format("%.1ff", 2.0 ^ (bias - 1 + m)) -- subnormal steps in 1.0
%     local half = string.format("0x%xu", (1 << (shift - 1)) - 1) -- half a step, less one bit
INLINE uchar float_to_${name}(float x)
{
    const uint u = FLOAT_TO_BITS(x), s = (u >> 24) & 0x80u, a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (uchar)(s | 0x7fu);
    if (a >= ${largest}) /* ${largest_value} */
        return (uchar)(s | ${saturated});
    if (a < ${normal}) /* 2^${1 - bias} */
        return (uchar)(s | (uint)F_RINT(BITS_TO_FLOAT(a) * ${step}));
    return (uchar)(s | (((a + ${half} + ((a >> ${shift}) & 1u)) >> ${shift}) - (${127 - bias}u << ${m})));
}
%   end
% end
% -- One role's element type and accesses: typedef T <role>_t; <ROLE>_LOAD, _LOAD_RO, _STORE (FP8:
% -- the out role's only).
% local function element_role(role, dt)
%   local R = role:upper()
%   if fp8[dt] then
typedef uchar ${role}_t;
#define ${R}_LOAD(p, i) ${fp8[dt]}_to_float((p)[i])
#define ${R}_LOAD_RO(p, i) ${fp8[dt]}_to_float(LDG((p) + (i)))
%     if role == "o" then
#define ${R}_STORE(p, i, x) ((p)[i] = float_to_${fp8[dt]}(x))
%     end
%   elseif dt == "f32" then
typedef float ${role}_t;
#define ${R}_LOAD(p, i) ((p)[i])
#define ${R}_LOAD_RO(p, i) LDG((p) + (i))
#define ${R}_STORE(p, i, x) ((p)[i] = (x))
%   elseif dt == "f16" and backend == "opencl" then
typedef half ${role}_t;
#define ${R}_LOAD(p, i) vload_half((i), (p))
#define ${R}_LOAD_RO(p, i) ${R}_LOAD(p, i)
#define ${R}_STORE(p, i, x) vstore_half_rte((x), (i), (p))
%   elseif dt == "f16" or dt == "bf16" then
%     local cvt = dt == "f16" and "f16" or "bf16"
typedef ushort ${role}_t;
#define ${R}_LOAD(p, i) ${cvt}_to_float((p)[i])
#define ${R}_LOAD_RO(p, i) ${cvt}_to_float(LDG((p) + (i)))
#define ${R}_STORE(p, i, x) ((p)[i] = float_to_${cvt}(x))
%   else
%     error("dialect: unsupported dtype " .. tostring(dt))
%   end
% end
% element_role("q", q_dtype)
% element_role("kv", kv_dtype)
% element_role("o", out_dtype)
% if kv_dtype == q_dtype and out_dtype == q_dtype then
typedef q_t STORE_T;
#define LOAD Q_LOAD
#define LOAD_RO Q_LOAD_RO
#define STORE Q_STORE
% end
% function smem_matches_host()
%   if backend == "cuda" then
static_assert(sizeof(Smem) == ${shared_bytes}, "Smem: the host's fj__variant_shared_bytes");
%   else
typedef char Smem_matches_host[sizeof(Smem) == ${shared_bytes} ? 1 : -1];
%   end
% end
