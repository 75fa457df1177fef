% -- FP8 inputs dequantised for a 16-bit forward: row s of batch b of src ([b, s, h, d], FP8 of
% -- q_dtype) becomes that row of dst ([b, s, h, d] of out_dtype, f16 or bf16), each
% -- element times its (batch, head / group)'s factors from descale and descale2 (NULL: 1).
% -- Every e4m3 and e5m2 value is exact in f16 and bf16, so only a product with a factor
% -- rounds. The plan runs one launch for each of q, k and v ahead of the 16-bit forward that
% -- reads the copies (plan/fwd.c, variant field dequant).
% --
% -- Work: a work-group of THREADS work-items per (row, batch): grid (rows, batch). On CUDA, where
% -- P.chunks says the row is whole 16-element chunks (base, strides, dim), each work-item moves
% -- a chunk at a time: one 16-byte load and two 16-byte stores, so a row of the copy is one
% -- round of memory latency rather than one per element.
% --
% -- Parameters: backend, q_dtype (the FP8 type), out_dtype (the copies'), threads, args
% -- (fj_dequant_params).
% assert(threads == 128, "fp8_dequant: 128 work-items per work-group")
% include("dialect.lua")
% assert(is_fp8(q_dtype) and not is_fp8(out_dtype), "fp8_dequant: FP8 into 16 bits")
% include("params.lua")
% params_struct(args)
% local fp8_name = q_dtype:sub(3) -- e4m3, e5m2
#define THREADS ${threads}

/* Batch b's and kv head g's factor: descale's times descale2's (each NULL: 1). */
INLINE float factor(const ${args.name} P, int b, int g)
{
    GLOBAL const float *d1 = GPTR(const float, P.descale), *d2 = GPTR(const float, P.descale2);
    return (d1 ? LDG(d1 + b * P.d_sb + g * P.d_sh) : 1.0f) *
           (d2 ? LDG(d2 + b * P.d2_sb + g * P.d2_sh) : 1.0f);
}

KERNEL(THREADS)
fj_fp8_dequant(
% params_arg(args)
)
{
    const int s = BLOCK_X, b = BLOCK_Y, tid = THREAD_X;
    GLOBAL const q_t *src = GPTR(const q_t, P.src) + b * P.s_sb + (I64)s * P.s_ss;
    GLOBAL o_t *dst = GPTR(o_t, P.dst) + b * P.o_sb + (I64)s * P.o_ss;
% if backend == "cuda" then
    if (P.chunks) {
        const int per_head = P.dim >> 4;
        for (int i = tid; i < P.heads * per_head; i += THREADS) {
            const int h = i / per_head, c = (i - h * per_head) << 4;
            const float f = factor(P, b, h / P.group);
            const uint4 in = LDG((const uint4 *)(src + h * P.s_sh + c));
            const uint words[4] = {in.x, in.y, in.z, in.w};
            uint out[8];
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const uint w = words[j >> 1] >> ((j & 1) * 16); /* elements 2j, 2j + 1 */
                const uint lo = float_to_${out_dtype}(${fp8_name}_to_float((uchar)w) * f);
                const uint hi = float_to_${out_dtype}(${fp8_name}_to_float((uchar)(w >> 8)) * f);
                out[j] = lo | hi << 16;
            }
            uint4 *to = (uint4 *)(dst + h * P.o_sh + c);
            to[0] = make_uint4(out[0], out[1], out[2], out[3]);
            to[1] = make_uint4(out[4], out[5], out[6], out[7]);
        }
        return;
    }
% end
    for (int i = tid; i < P.heads * P.dim; i += THREADS) {
        const int h = i / P.dim, c = i % P.dim;
        O_STORE(dst, h * P.o_sh + c, Q_LOAD_RO(src, h * P.s_sh + c) * factor(P, b, h / P.group));
    }
}
