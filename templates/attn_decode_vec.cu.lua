% -- Decode attention on CUDA for 16-bit data in 16-byte rows: the decode family's bandwidth
% -- kernel. Same work and output as attn_decode.lua (a work-group per (batch, kv head, row tile,
% -- split); grouped-query heads packed; with `partial` the split's state goes to the workspace),
% -- but no shared-memory tiles: each key is read straight into registers as 16-byte vectors.
% --
% -- A key group of LANES lanes (a power of two, LANES * 8 >= the head dims) holds one key: lane
% -- j reads elements 8j .. 8j + 7 of its K row and of its V row. A warp holds KEYS_PER_WARP
% -- keys at a time and a work-group GROUPS; the groups walk the split's keys in chunks of UNROLL
% -- keys each, the next chunk's vectors loading while one is used. Every lane keeps the query rows'
% -- 8-element slices (scaled to log2 units, or to the tanh argument) and its slice of each
% -- row's output accumulator; a key's score is the group's lanes' partial dot products summed
% -- with shuffles, and every lane of the group runs the row's online softmax on it. At the end
% -- the groups' states (max, sum, accumulators) meet in shared memory and are combined.
% --
% -- An FP8 cache (kv_dtype e4m3 or e5m2, q and out 16-bit) is read the same way, 8-byte vectors
% -- of 8 elements: half the bytes, each element converted in registers (unpack8_kv); k's descale
% -- factor scales the query slices, v's the output.
% --
% -- Parameters: as attn_decode.lua (backend "cuda" only, no tile_n), lanes (the key group's
% -- lanes), stages (UNROLL: keys per group and chunk), ctas_per_sm (blocks per SM the register
% -- allocation must allow; 0 for no bound), descale.
% assert(backend == "cuda", "attn_decode_vec is a CUDA kernel")
% assert(threads == 128, "attn_decode_vec: 128 threads per block")
% assert(tile_m >= 1 and tile_m <= 8, "attn_decode_vec: 1 to 8 rows per block")
% assert(head_dim_pad % 8 == 0 and head_dim_v_pad % 8 == 0, "attn_decode_vec: head dims in 16-byte vectors")
% assert(stages >= 1 and stages <= 8, "attn_decode_vec: 1 to 8 keys per group and chunk")
% assert(lanes >= 1 and lanes <= 32 and lanes * 8 >= math.max(head_dim_pad, head_dim_v_pad), "attn_decode_vec: lanes cover the head dims")
% assert(q_dtype ~= "f32" and out_dtype == q_dtype, "attn_decode_vec: 16-bit q and out")
% include("dialect.lua")
% local fp8_kv = is_fp8(kv_dtype)
% assert(kv_dtype == q_dtype or fp8_kv, "attn_decode_vec: k and v as q, or an FP8 cache")
% include("params.lua")
% include("sequence.lua")
% include("descale.lua")
% params_struct(args)
#define THREADS ${threads}
#define ROWS ${tile_m}
#define DP ${head_dim_pad}
#define DVP ${head_dim_v_pad}
#define LANES ${lanes}
#define KEYS_PER_WARP (32 / LANES)
#define GROUPS (THREADS / 32 * KEYS_PER_WARP)
#define UNROLL ${stages} /* keys per group and chunk */
#define FULL_MASK 0xffffffffu

/* The key groups' states, combined at the end (size: the host's fj__variant_shared_bytes). */
typedef struct Smem {
    float m[GROUPS][ROWS];
    float l[GROUPS][ROWS];
    float o[GROUPS][ROWS][DVP];
} Smem;
% smem_matches_host()

/* Eight 16-bit elements of a 16-byte vector as floats. */
INLINE void unpack8(uint4 x, float f[8])
{
    const uint w[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
%   if q_dtype == "bf16" then
        f[2 * i] = __uint_as_float(w[i] << 16);
        f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
%   else
        f[2 * i] = f16_to_float((ushort)(w[i] & 0xffffu));
        f[2 * i + 1] = f16_to_float((ushort)(w[i] >> 16));
%   end
    }
}
% if fp8_kv then

/* A lane's 8 elements of a K or V row: 8 FP8 bytes, as floats times 1 / KV_UNIT
** (cuda_fp8_cache.lua). */
typedef uint2 kv_vec;
% include("cuda_fp8_cache.lua")
INLINE void unpack8_kv(uint2 x, float f[8])
{
    const uint w[2] = {x.x, x.y};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const uint h = fp8_pair_to_f16x2(w[i / 2], i % 2);
        f[2 * i] = f16_to_float((ushort)(h & 0xffffu));
        f[2 * i + 1] = f16_to_float((ushort)(h >> 16));
    }
}
% else

typedef uint4 kv_vec; /* a lane's 8 elements of a K or V row */
#define KV_UNIT 1.0f
#define unpack8_kv unpack8
% end

% decode_key_row()

extern "C" __global__ void __launch_bounds__(THREADS, ${math.max(ctas_per_sm, 1)})
fj_attn_decode(
% params_arg(args)
)
{
    __shared__ Smem sm;
    const int tid = THREAD_X, lane = tid % 32;
    const int group = tid / 32 * KEYS_PER_WARP + lane / LANES; /* this lane's key group */
    const int gl = lane % LANES;                                /* its lane in the group */
% decode_block("ROWS")
% descale_factors("P.fwd")
    const float q_mul = score_mul * qk_factor * KV_UNIT, out_mul = v_factor * KV_UNIT;

    /* The rows' query slices and states; a row beyond the tile's rows sees nothing. */
    float qv[ROWS][8], acc[ROWS][8], m[ROWS], l[ROWS];
    int row_of[ROWS];
    bool live[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        const int g = g0 + r;
        live[r] = g < rows;
        const int head = head_kv * qgroup + (live[r] ? g / seqlen_q : 0);
        row_of[r] = live[r] ? g % seqlen_q : 0;
        float f[8] = {0, 0, 0, 0, 0, 0, 0, 0};
        if (live[r] && gl * 8 < head_dim)
            unpack8(*(const uint4 *)(q + (I64)row_of[r] * q_ss + (I64)head * q_sh + gl * 8), f);
#pragma unroll
        for (int i = 0; i < 8; i++) {
            qv[r][i] = f[i] * q_mul;
            acc[r][i] = 0.0f;
        }
        m[r] = -F_INF;
        l[r] = 0.0f;
    }

    /* The walk, a chunk at a time. A warp's chunk is UNROLL rounds of its KEYS_PER_WARP
    ** neighbouring keys, GROUPS keys apart: keys base + mine + u * GROUPS for this lane, with
    ** base the same for the whole warp (the loop and the shuffles keep all 32 lanes in step).
    ** Chunk c + 1's vectors load while chunk c is used (and, paged, chunk c + 2's page numbers),
    ** so a lane has 2 * UNROLL * 32 bytes in flight (16 with an FP8 cache). Each row's state is
    ** rescaled once per chunk. */
    const kv_vec zero = {};
    const int mine = lane / LANES;
    const int wfirst = I_MAX(lo, 0) + tid / 32 * KEYS_PER_WARP;
    kv_vec kx[UNROLL], vx[UNROLL], kn[UNROLL], vn[UNROLL];
% if paged then
    int pg[UNROLL], pr[UNROLL]; /* the next chunk's page numbers and rows in them */
    auto pages_of = [&](int base) {
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int key = base + mine + u * GROUPS, i = div_by(page_div, key);
            pg[u] = key <= hi ? PAGE_NUMBER(i) : 0;
            pr[u] = key - i * P.page_size;
        }
    };
%   key_offset = function(t) return "(I64)pg[u] * " .. t .. "_sb + (I64)pr[u] * " .. t .. "_ss" end
% else
%   key_offset = function(t) return "(I64)key * " .. t .. "_ss" end
% end
    auto load = [&](kv_vec (&kd)[UNROLL], kv_vec (&vd)[UNROLL], int base) {
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int key = base + mine + u * GROUPS;
            kd[u] = key <= hi && gl * 8 < head_dim ? *(const kv_vec *)(k + ${key_offset("k")} + gl * 8) : zero;
            vd[u] = key <= hi && gl * 8 < head_dim_v ? *(const kv_vec *)(v + ${key_offset("v")} + gl * 8) : zero;
        }
    };
% if paged then
    pages_of(wfirst);
    load(kx, vx, wfirst);
    pages_of(wfirst + GROUPS * UNROLL);
% else
    load(kx, vx, wfirst);
% end
    for (int base = wfirst; base <= hi; base += GROUPS * UNROLL) {
        load(kn, vn, base + GROUPS * UNROLL);
% if paged then
        pages_of(base + 2 * GROUPS * UNROLL);
% end
        float s[ROWS][UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            float kf[8];
            unpack8_kv(kx[u], kf);
#pragma unroll
            for (int r = 0; r < ROWS; r++) {
                float x = 0.0f;
#pragma unroll
                for (int i = 0; i < 8; i++)
                    x = F_FMA(qv[r][i], kf[i], x);
#pragma unroll
                for (int off = LANES / 2; off > 0; off /= 2)
                    x += __shfl_xor_sync(FULL_MASK, x, off);
% if softcap then
                x = cap_mul * F_TANH(x);
% end
                const int key = base + mine + u * GROUPS;
                const bool seen = live[r] && ${decode_seen("key", "row_of[r]")};
                s[r][u] = seen ? x : -F_INF;
            }
        }
#pragma unroll
        for (int r = 0; r < ROWS; r++) {
            float m_new = m[r];
#pragma unroll
            for (int u = 0; u < UNROLL; u++)
                m_new = F_MAX(m_new, s[r][u]);
            if (m_new == -F_INF) { /* nothing seen yet: the state stays empty */
#pragma unroll
                for (int u = 0; u < UNROLL; u++)
                    s[r][u] = 0.0f;
                continue;
            }
            const float alpha = F_EXP2(m[r] - m_new);
            l[r] *= alpha;
#pragma unroll
            for (int i = 0; i < 8; i++)
                acc[r][i] *= alpha;
#pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                const float p = F_EXP2(s[r][u] - m_new);
                l[r] += p;
                s[r][u] = p;
            }
            m[r] = m_new;
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            float vf[8];
            unpack8_kv(vx[u], vf);
#pragma unroll
            for (int r = 0; r < ROWS; r++)
#pragma unroll
                for (int i = 0; i < 8; i++)
                    acc[r][i] = F_FMA(s[r][u], vf[i], acc[r][i]);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            kx[u] = kn[u];
            vx[u] = vn[u];
        }
    }

    /* The groups' states into shared memory, then each output element combined over them. */
#pragma unroll
    for (int r = 0; r < ROWS; r++) {
        if (gl == 0) {
            sm.m[group][r] = m[r];
            sm.l[group][r] = l[r];
        }
        if (gl * 8 < DVP)
#pragma unroll
            for (int i = 0; i < 8; i++)
                sm.o[group][r][gl * 8 + i] = acc[r][i];
    }
    __syncthreads();
    for (int i = tid; i < ROWS * DVP; i += THREADS) {
        const int r = i / DVP, c = i % DVP, g = g0 + r;
        if (g >= rows || c >= head_dim_v)
            continue;
        float mx = -F_INF;
        for (int j = 0; j < GROUPS; j++)
            mx = F_MAX(mx, sm.m[j][r]);
        float sum = 0.0f, o = 0.0f;
        if (mx > -F_INF)
            for (int j = 0; j < GROUPS; j++) {
                const float w = sm.m[j][r] > -F_INF ? F_EXP2(sm.m[j][r] - mx) : 0.0f;
                sum = F_FMA(w, sm.l[j][r], sum);
                o = F_FMA(w, sm.o[j][r][c], o);
            }
% decode_head_row("g")
        const float val = sum > 0.0f ? o * out_mul / sum : 0.0f;
% decode_store_out("val")
        if (c == 0) {
            const float x = sum > 0.0f ? (mx + F_LOG2(sum)) * F_LN2 : -F_INF;
% decode_store_lse("x")
        }
    }
}
