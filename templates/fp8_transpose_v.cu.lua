% -- FP8 values transposed ahead of Hopper's FP8 forward (attn_fwd_wgmma.cu.lua with
% -- v_transposed). P V takes both FP8 operands K-major, and P V's k dimension is the keys: so v
% -- [b, s, hkv, dv] becomes dst [b, hkv, dv, keys], each value column a row of keys (keys:
% -- seqlen_k rounded up to 16, those past seqlen_k zeros, since 0 * NaN is not 0). TMA then
% -- brings 128 keys by all value columns of it straight into a ring slot, in the layout the
% -- kernel's own transposing warps write otherwise.
% --
% -- The order of keys: within each 16, position 4t + i holds key 2t + (0, 1, 8, 9)[i] - the
% -- order in which a thread t of a quad holds P's probabilities in its accumulator registers
% -- (pack_p in attn_fwd_wgmma.cu.lua), so that P becomes P V's A operand by conversion alone.
% -- The forward's key tiles start at multiples of 128 keys (dense requests), so each 16 of a
% -- tile is a 16 of the row.
% --
% -- Work: a block of THREADS threads per KEYS keys of a (kv head, batch): grid (keys / KEYS,
% -- hkv, b). For each COLS value columns, the block reads the KEYS x COLS bytes in 16-byte
% -- pieces (rows of 16-byte multiples: what the FP8 kernel takes) into shared memory and writes
% -- each column's keys out in 16-byte pieces.
% --
% -- Parameters: backend (cuda), kv_dtype (an FP8 type), q_dtype, out_dtype, threads, tile_n
% -- (a block's keys), args (fj_transpose_v_params).
% assert(backend == "cuda" and threads == 256 and tile_n == 64,
%        "fp8_transpose_v: CUDA, 256 threads, 64 keys a block (a thread per 16 bytes)")
% include("dialect.lua")
% assert(is_fp8(kv_dtype), "fp8_transpose_v: FP8 values")
% include("params.lua")
% params_struct(args)
#define THREADS ${threads}
#define KEYS ${tile_n} /* a block's */
#define COLS 64 /* value columns a pass */
#define ROW_BYTES (COLS + 16) /* a key's bytes in shared memory (rows 16-byte aligned) */

/* The key at position p (0-15) of each 16 of the output: 2t + (0, 1, 8, 9)[i] for p = 4t + i. */
__device__ __forceinline__ int key_at(int p)
{
    return 2 * (p >> 2) + (p & 1) + ((p & 2) << 2);
}

KERNEL(THREADS)
fj_fp8_transpose_v(
% params_arg(args)
)
{
    __shared__ __align__(16) unsigned char tile[KEYS * ROW_BYTES];
    const int k0 = blockIdx.x * KEYS, head = blockIdx.y, batch = blockIdx.z, tid = threadIdx.x;
    const unsigned char *src = (const unsigned char *)P.src + batch * P.s_sb + head * P.s_sh;
    unsigned char *dst = (unsigned char *)P.dst + batch * P.o_sb + head * P.o_sh;
    /* Reading: thread tid takes 16 columns (piece tid % 4) of key tid / 4; writing: 16 keys
    ** (piece tid % 4) of column tid / 4. */
    const int row = tid / 4, piece = 16 * (tid % 4);
    for (int c0 = 0; c0 < P.dim; c0 += COLS) {
        const int key = k0 + row, col = c0 + piece;
        uint4 in = make_uint4(0u, 0u, 0u, 0u);
        if (key < P.seqlen_k && col < P.dim)
            in = __ldg((const uint4 *)(src + (long long)key * P.s_ss + col));
        *(uint4 *)(tile + row * ROW_BYTES + piece) = in;
        __syncthreads();
        const int out_col = c0 + row, first = k0 + piece;
        if (out_col < P.dim && first < P.keys) {
            unsigned int w[4];
#pragma unroll
            for (int j = 0; j < 4; j++) {
                const unsigned char *at = tile + row; /* column `row` of the tile */
                w[j] = (unsigned int)at[(piece + key_at(4 * j)) * ROW_BYTES] |
                       (unsigned int)at[(piece + key_at(4 * j + 1)) * ROW_BYTES] << 8 |
                       (unsigned int)at[(piece + key_at(4 * j + 2)) * ROW_BYTES] << 16 |
                       (unsigned int)at[(piece + key_at(4 * j + 3)) * ROW_BYTES] << 24;
            }
            *(uint4 *)(dst + (long long)out_col * P.keys + first) =
                make_uint4(w[0], w[1], w[2], w[3]);
        }
        __syncthreads();
    }
}
