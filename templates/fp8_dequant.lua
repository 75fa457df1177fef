% -- FP8 inputs dequantised for a 16-bit forward: row s of batch b of src ([b, s, h, d], FP8 of
% -- q_dtype) becomes that row of dst ([b, s, h, d] of out_dtype, f16 or bf16), each
% -- element times its (batch, head / group)'s factors from descale and descale2 (NULL: 1).
% -- Every e4m3 and e5m2 value is exact in f16 and bf16, so only a product with a factor
% -- rounds. The plan runs one launch for each of q, k and v ahead of the 16-bit forward that
% -- reads the copies (plan/fwd.c, variant field dequant).
% --
% -- Work: a work-group of THREADS work-items per (row, batch): grid (rows, batch).
% --
% -- Parameters: backend, q_dtype (the FP8 type), out_dtype (the copies'), threads, args
% -- (fj_dequant_params).
% assert(threads == 128, "fp8_dequant: 128 work-items per work-group")
% include("dialect.lua")
% assert(is_fp8(q_dtype) and not is_fp8(out_dtype), "fp8_dequant: FP8 into 16 bits")
% include("params.lua")
% params_struct(args)
#define THREADS ${threads}

KERNEL(THREADS)
fj_fp8_dequant(
% params_arg(args)
)
{
    const int s = BLOCK_X, b = BLOCK_Y, tid = THREAD_X;
    GLOBAL const q_t *src = GPTR(const q_t, P.src) + b * P.s_sb + (I64)s * P.s_ss;
    GLOBAL o_t *dst = GPTR(o_t, P.dst) + b * P.o_sb + (I64)s * P.o_ss;
    GLOBAL const float *d1 = GPTR(const float, P.descale), *d2 = GPTR(const float, P.descale2);
    for (int i = tid; i < P.heads * P.dim; i += THREADS) {
        const int h = i / P.dim, c = i % P.dim, g = h / P.group;
        const float f = (d1 ? LDG(d1 + b * P.d_sb + g * P.d_sh) : 1.0f) *
                        (d2 ? LDG(d2 + b * P.d2_sb + g * P.d2_sh) : 1.0f);
        O_STORE(dst, h * P.o_sh + c, Q_LOAD_RO(src, h * P.s_sh + c) * f);
    }
}
