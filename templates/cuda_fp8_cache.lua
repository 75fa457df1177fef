% -- An FP8 KV cache's bytes as f16 on CUDA, for the decode kernels that read one with 16-bit
% -- queries (attn_decode_vec.cu.lua converts in registers, attn_decode_mma.cu.lua into its
% -- products' tile): e5m2 is f16's top byte; e4m3 converts by cvt from sm_89 on, and before
% -- that by placing its sign, exponent and mantissa bits in f16's fields, which reads the value
% -- times 2^-8 (exponent bias 15 against 7; subnormals alike), so KV_UNIT is 256 there and an
% -- e4m3 NaN reads as +-480. Every value read is exact in f16; a kernel puts KV_UNIT into its
% -- scores' and its output's factors.
% -- Parameter: kv_dtype ("f8e4m3" or "f8e5m2"). Needs dialect.lua (INLINE, uint, ushort).
% assert(kv_dtype == "f8e4m3" or kv_dtype == "f8e5m2", "cuda_fp8_cache: an FP8 cache")
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
#define E4M3_BY_CVT 1
#else
#define E4M3_BY_CVT 0
#endif
#define KV_UNIT ${kv_dtype == "f8e4m3" and "(E4M3_BY_CVT ? 1.0f : 256.0f)" or "1.0f"}
/* Bytes 2j and 2j + 1 of w as an f16 pair (j = 0: bytes 0, 1; j = 1: bytes 2, 3). */
INLINE uint fp8_pair_to_f16x2(uint w, int j)
{
% if kv_dtype == "f8e5m2" then
    return __byte_perm(w, 0u, j ? 0x3424u : 0x1404u);
% else
#if E4M3_BY_CVT
    uint h;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(h) : "h"((ushort)(w >> (16 * j))));
    return h;
#else
    const uint x = __byte_perm(w, 0u, j ? 0x4342u : 0x4140u); /* bytes in the halves' lows */
    return ((x << 7) & 0x3f803f80u) | ((x << 8) & 0x80008000u);
#endif
% end
}
/* Eight FP8 elements (8 bytes, in order) as eight f16 (16 bytes, in order). */
INLINE uint4 fp8x8_to_f16x8(uint2 x)
{
    return make_uint4(fp8_pair_to_f16x2(x.x, 0), fp8_pair_to_f16x2(x.x, 1),
                      fp8_pair_to_f16x2(x.y, 0), fp8_pair_to_f16x2(x.y, 1));
}
