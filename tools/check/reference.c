/* The float64 reference attention, the plain low-precision one, and host dtype conversions. */
#define _POSIX_C_SOURCE 200809L
#include "reference.h"

#include "../../plan/expr.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static uint32_t f32_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

static float bits_f32(uint32_t u)
{
    float x;
    memcpy(&x, &u, 4);
    return x;
}

uint16_t fjr_f32_to_bf16(float x)
{
    uint32_t u = f32_bits(x);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

float fjr_bf16_to_f32(uint16_t x)
{
    return bits_f32((uint32_t)x << 16);
}

uint16_t fjr_f32_to_f16(float x)
{
    uint32_t u = f32_bits(x);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    u &= 0x7fffffffu;
    if (u >= 0x7f800000u)
        return sign | (u > 0x7f800000u ? 0x7e00u : 0x7c00u);
    if (u >= 0x477ff000u) /* rounds to 65536 or more: infinity */
        return sign | 0x7c00u;
    if (u < 0x38800000u) { /* below 2^-14: a subnormal half, in units of 2^-24 */
        float units = nearbyintf(bits_f32(u) * 16777216.0f);
        return sign | (uint16_t)units;
    }
    uint32_t mant = u & 0x7fffffu;
    uint32_t h = ((((u >> 23) & 0xffu) - 127u + 15u) << 10) | (mant >> 13);
    uint32_t rest = mant & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u)))
        h++; /* a carry into the exponent is the right result */
    return sign | (uint16_t)h;
}

float fjr_f16_to_f32(uint16_t x)
{
    uint32_t sign = (uint32_t)(x & 0x8000u) << 16;
    uint32_t exp = (x >> 10) & 0x1fu, mant = x & 0x3ffu;
    if (exp == 0) {
        float v = (float)mant * (1.0f / 16777216.0f);
        return sign ? -v : v;
    }
    if (exp == 31)
        return bits_f32(sign | 0x7f800000u | (mant << 13));
    return bits_f32(sign | ((exp - 15u + 127u) << 23) | (mant << 13));
}

float fjr_fp8_to_f32(fj_dtype dtype, uint8_t x)
{
    const int e4m3 = dtype == FJ_DTYPE_F8_E4M3;
    const int mbits = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15, emax = e4m3 ? 15 : 31;
    const int e = (x & 0x7f) >> mbits, m = x & ((1 << mbits) - 1);
    double v;
    if (e4m3 && e == emax && m == (1 << mbits) - 1)
        v = NAN;
    else if (!e4m3 && e == emax)
        v = m ? NAN : INFINITY;
    else if (e == 0)
        v = ldexp((double)m, 1 - bias - mbits);
    else
        v = ldexp(1.0 + ldexp((double)m, -mbits), e - bias);
    return (float)(x & 0x80 ? -v : v);
}

uint8_t fjr_f32_to_fp8(fj_dtype dtype, float x)
{
    /* x in units of its binade's quantum (the smallest normal binade's for subnormals), rounded
    ** to nearest even, then re-encoded; beyond the largest finite value it saturates. */
    const int e4m3 = dtype == FJ_DTYPE_F8_E4M3;
    const int mbits = e4m3 ? 3 : 2, bias = e4m3 ? 7 : 15;
    const double largest = e4m3 ? 448.0 : 57344.0;
    const uint8_t sign = signbit(x) ? 0x80 : 0, saturated = e4m3 ? 0x7e : 0x7b;
    if (isnan(x))
        return 0x7f;
    const double a = fabs((double)x);
    if (a >= largest)
        return sign | saturated;
    int e = 1 - bias; /* the exponent of a's binade, at least the smallest normal's */
    if (a > 0) {
        int fe;
        frexp(a, &fe); /* a = f * 2^fe, f in [0.5, 1) */
        e = fe - 1 > e ? fe - 1 : e;
    }
    double q = nearbyint(ldexp(a, mbits - e)); /* 2^mbits .. 2^(mbits + 1) when normal */
    if (q >= (double)(2 << mbits)) {           /* rounded up into the next binade */
        q /= 2;
        e++;
    }
    if (ldexp(q, e - mbits) > largest)
        return sign | saturated;
    if (q < (double)(1 << mbits)) /* subnormal (or zero): exponent field 0 */
        return sign | (uint8_t)q;
    return sign | (uint8_t)((e + bias) << mbits) | (uint8_t)((int)q - (1 << mbits));
}

fj_dtype fjr_out_dtype(fj_dtype dtype)
{
    return dtype == FJ_DTYPE_F8_E4M3 || dtype == FJ_DTYPE_F8_E5M2 ? FJ_DTYPE_BF16 : dtype;
}

float fjr_round(fj_dtype dtype, float x)
{
    switch (dtype) {
    case FJ_DTYPE_BF16: return fjr_bf16_to_f32(fjr_f32_to_bf16(x));
    case FJ_DTYPE_F16: return fjr_f16_to_f32(fjr_f32_to_f16(x));
    case FJ_DTYPE_F8_E4M3:
    case FJ_DTYPE_F8_E5M2: return fjr_fp8_to_f32(dtype, fjr_f32_to_fp8(dtype, x));
    default: return x;
    }
}

void fjr_store(fj_dtype dtype, void *dst, float x)
{
    uint16_t h;
    switch (dtype) {
    case FJ_DTYPE_BF16:
        h = fjr_f32_to_bf16(x);
        memcpy(dst, &h, 2);
        break;
    case FJ_DTYPE_F16:
        h = fjr_f32_to_f16(x);
        memcpy(dst, &h, 2);
        break;
    case FJ_DTYPE_F8_E4M3:
    case FJ_DTYPE_F8_E5M2: *(uint8_t *)dst = fjr_f32_to_fp8(dtype, x); break;
    default: memcpy(dst, &x, 4); break;
    }
}

float fjr_load(fj_dtype dtype, const void *src)
{
    uint16_t h;
    float x;
    switch (dtype) {
    case FJ_DTYPE_BF16: memcpy(&h, src, 2); return fjr_bf16_to_f32(h);
    case FJ_DTYPE_F16: memcpy(&h, src, 2); return fjr_f16_to_f32(h);
    case FJ_DTYPE_F8_E4M3:
    case FJ_DTYPE_F8_E5M2: return fjr_fp8_to_f32(dtype, *(const uint8_t *)src);
    default: memcpy(&x, src, 4); return x;
    }
}

/* Evaluates expression e of the problem for (b, h, i, j) and score s. */
/* The value of expression e at (b, h, i, j) and score s; with grad, its derivative with respect
** to s instead. */
static double eval_mod_at(const fjr_problem *p, const struct fj__expr *e, int64_t b, int64_t h,
                          int64_t i, int64_t j, double s, int grad)
{
    fj__expr_env env = {.b = b + p->batch_offset,
                        .h = h,
                        .q = i,
                        .k = j,
                        .sq = p->seqlen_q,
                        .sk = p->seqlen_k,
                        .s = s,
                        .args = p->mod_args,
                        .nargs = p->mod_args_count,
                        .exact = p->exact_mods};
    return grad ? fj__expr_eval_grad(e, &env) : fj__expr_eval(e, &env);
}

static double eval_mod(const fjr_problem *p, const struct fj__expr *e, int64_t b, int64_t h,
                       int64_t i, int64_t j, double s)
{
    return eval_mod_at(p, e, b, h, i, j, s, 0);
}

static int64_t pair_offset(const int64_t stride[4], int64_t b, int64_t h, int64_t i, int64_t j)
{
    return b * stride[0] + h * stride[1] + i * stride[2] + j * stride[3];
}

int fjr_visible(const fjr_problem *p, int64_t b, int64_t h, int64_t i, int64_t j)
{
    int64_t diag = i + p->seqlen_k - p->seqlen_q;
    if (p->causal && j > diag)
        return 0;
    if (p->window_left >= 0 && j < diag - p->window_left)
        return 0;
    if (p->window_right >= 0 && j > diag + p->window_right)
        return 0;
    const int64_t tb = b + p->batch_offset; /* the batch of the mask tensors */
    if (p->blocks) {
        /* 0: the block is skipped; 2: kept whole, whatever the other masks say. */
        int32_t cls = p->blocks[tb * p->blocks_stride[0] + h * p->blocks_stride[1] +
                                (i / 128) * p->blocks_stride[2] + j / 128];
        if (cls == 0)
            return 0;
        if (cls == 2)
            return 1;
    }
    if (p->mask && !p->mask[pair_offset(p->mask_stride, tb, h, i, j)])
        return 0;
    if (p->ranges) {
        const int32_t *r = p->ranges + tb * p->ranges_stride[0] + h * p->ranges_stride[1] +
                           j * p->ranges_stride[2];
        if ((i >= r[0] && i < r[1]) || (p->ranges_n == 4 && i >= r[2] && i < r[3]))
            return 0;
    }
    if (p->mask_mod)
        return eval_mod(p, p->mask_mod, b, h, i, j, 0) != 0;
    return 1;
}

double fjr_flops(const fjr_problem *p)
{
    double per_pair = 2.0 * (double)(p->head_dim + p->head_dim_v);
    double heads = (double)p->batch * (double)p->heads_q;
    int windowed = p->window_left >= 0 || p->window_right >= 0;
    int masked = p->mask_mod || p->mask || p->ranges || p->blocks;
    if (!p->causal && !windowed && !masked)
        return per_pair * heads * (double)p->seqlen_q * (double)p->seqlen_k;
    if (p->causal && !windowed && !masked && p->seqlen_q == p->seqlen_k)
        return per_pair * heads * (double)p->seqlen_q * (double)p->seqlen_k / 2.0;
    double pairs = 0; /* the visible pairs of the first head, as representative */
    for (int64_t i = 0; i < p->seqlen_q; i++)
        for (int64_t j = 0; j < p->seqlen_k; j++)
            pairs += fjr_visible(p, 0, 0, i, j);
    return per_pair * heads * pairs;
}

/* ALiBi and bias of (b, h, i, j). */
static double score_terms(const fjr_problem *p, int64_t b, int64_t h, int64_t i, int64_t j)
{
    double t = 0;
    const int64_t tb = b + p->batch_offset; /* the batch of the slopes and the bias */
    if (p->alibi)
        t -= p->alibi[tb * p->alibi_stride_b + h] *
             fabs((double)(i + p->seqlen_k - p->seqlen_q - j));
    if (p->bias)
        t += fjr_load(p->bias_dtype, (const unsigned char *)p->bias +
                                         (size_t)pair_offset(p->bias_stride, tb, h, i, j) *
                                             fj_dtype_size(p->bias_dtype));
    return t;
}

static double score_transform(const fjr_problem *p, int64_t b, int64_t h, int64_t i, int64_t j,
                              double dot)
{
    double s = dot * p->scale;
    s = p->softcap > 0 ? p->softcap * tanh(s / p->softcap) : s;
    s += score_terms(p, b, h, i, j);
    return p->score_mod ? fj__score_mod_saturate(eval_mod(p, p->score_mod, b, h, i, j, s)) : s;
}

/* ---- rows on the machine's cores ------------------------------------------------------------ */
/* fn(ctx, lo, hi) over rows [0, n) in contiguous parts, one a thread, on up to the machine's
** cores where n rows of `cost` operations each pay for threads (a long check's reference is
** minutes on one core; cost 0: one thread, in order). Each row's result must not depend on
** which part holds it, so the figures are the same on any number of threads. */
typedef void (*rows_fn)(const void *ctx, int64_t lo, int64_t hi);
typedef struct rows_part {
    rows_fn fn;
    const void *ctx;
    int64_t lo, hi;
} rows_part;

static void *run_part(void *arg)
{
    const rows_part *r = arg;
    r->fn(r->ctx, r->lo, r->hi);
    return NULL;
}

#define MAX_REFERENCE_THREADS 64
#define OPS_PER_THREAD 50000000.0 /* below this much work a part, fewer threads */
static void over_rows(int64_t n, double cost, rows_fn fn, const void *ctx)
{
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    int64_t parts = cpus > 1 ? (cpus < MAX_REFERENCE_THREADS ? cpus : MAX_REFERENCE_THREADS) : 1;
    const double by_work = (double)n * cost / OPS_PER_THREAD;
    if ((double)parts > by_work)
        parts = by_work < 1 ? 1 : (int64_t)by_work;
    if (parts > n)
        parts = n < 1 ? 1 : n;
    rows_part part[MAX_REFERENCE_THREADS];
    pthread_t thread[MAX_REFERENCE_THREADS];
    int started[MAX_REFERENCE_THREADS] = {0};
    for (int64_t t = 0; t < parts; t++) {
        part[t] = (rows_part){.fn = fn, .ctx = ctx, .lo = n * t / parts, .hi = n * (t + 1) / parts};
        if (t > 0) /* part 0 runs on this thread, as does any part whose thread did not start */
            started[t] = pthread_create(&thread[t], NULL, run_part, &part[t]) == 0;
    }
    run_part(&part[0]);
    for (int64_t t = 1; t < parts; t++)
        if (started[t])
            pthread_join(thread[t], NULL);
        else
            run_part(&part[t]);
}

/* The forward references' arguments, for over_rows (a row: one (b, h, i), forward_row). */
typedef struct forward_rows {
    const fjr_problem *p;
    fj_dtype dtype; /* _lowp's */
    const void *q, *k, *v;
    void *out;
    double *lse;
} forward_rows;

/* Row `row` of the forward references: batch b, query head h, query i (i fastest). */
static void forward_row(const fjr_problem *p, int64_t row, int64_t *b, int64_t *h, int64_t *i)
{
    *i = row % p->seqlen_q;
    *h = row / p->seqlen_q % p->heads_q;
    *b = row / p->seqlen_q / p->heads_q;
}

static double forward_cost(const fjr_problem *p)
{
    return (double)p->seqlen_k * (double)(p->head_dim + p->head_dim_v + 8);
}

static void attention_rows(const void *ctx, int64_t lo, int64_t hi)
{
    const forward_rows *f = ctx;
    const fjr_problem *p = f->p;
    const double *q = f->q, *k = f->k, *v = f->v;
    double *out = f->out, *lse = f->lse;
    const int64_t d = p->head_dim, dv = p->head_dim_v, group = p->heads_q / p->heads_kv;
    double *s = malloc((size_t)p->seqlen_k * sizeof *s);
    if (!s)
        abort();
    for (int64_t row = lo; row < hi; row++) {
        int64_t b, h, i;
        forward_row(p, row, &b, &h, &i);
        const double *qi = q + ((b * p->seqlen_q + i) * p->heads_q + h) * d;
        double *oi = out + ((b * p->seqlen_q + i) * p->heads_q + h) * dv;
        double m = -INFINITY;
        for (int64_t j = 0; j < p->seqlen_k; j++) {
            s[j] = -INFINITY;
            if (!fjr_visible(p, b, h, i, j))
                continue;
            const double *kj = k + ((b * p->seqlen_k + j) * p->heads_kv + h / group) * d;
            double dot = 0;
            for (int64_t c = 0; c < d; c++)
                dot += qi[c] * kj[c];
            s[j] = score_transform(p, b, h, i, j, dot);
            m = fmax(m, s[j]);
        }
        double sum = 0;
        for (int64_t c = 0; c < dv; c++)
            oi[c] = 0;
        if (m > -INFINITY)
            for (int64_t j = 0; j < p->seqlen_k; j++) {
                if (s[j] == -INFINITY)
                    continue;
                double e = exp(s[j] - m);
                sum += e;
                const double *vj = v + ((b * p->seqlen_k + j) * p->heads_kv + h / group) * dv;
                for (int64_t c = 0; c < dv; c++)
                    oi[c] += e * vj[c];
            }
        for (int64_t c = 0; c < dv && sum > 0; c++)
            oi[c] /= sum;
        if (lse)
            lse[(b * p->heads_q + h) * p->seqlen_q + i] = sum > 0 ? m + log(sum) : -INFINITY;
    }
    free(s);
}

void fjr_attention(const fjr_problem *p, const double *q, const double *k, const double *v,
                   double *out, double *lse)
{
    forward_rows f = {.p = p, .q = q, .k = k, .v = v, .out = out, .lse = lse};
    over_rows(p->batch * p->heads_q * p->seqlen_q, forward_cost(p), attention_rows, &f);
}

static void attention_lowp_rows(const void *ctx, int64_t lo, int64_t hi)
{
    const forward_rows *f = ctx;
    const fjr_problem *p = f->p;
    const fj_dtype dtype = f->dtype;
    const float *q = f->q, *k = f->k, *v = f->v;
    float *out = f->out;
    const int64_t d = p->head_dim, dv = p->head_dim_v, group = p->heads_q / p->heads_kv;
    float *s = malloc((size_t)p->seqlen_k * sizeof *s);
    float *acc = malloc((size_t)dv * sizeof *acc);
    if (!s || !acc)
        abort();
    for (int64_t row = lo; row < hi; row++) {
        int64_t b, h, i;
        forward_row(p, row, &b, &h, &i);
        const float *qi = q + ((b * p->seqlen_q + i) * p->heads_q + h) * d;
        float *oi = out + ((b * p->seqlen_q + i) * p->heads_q + h) * dv;
        float m = -INFINITY;
        for (int64_t j = 0; j < p->seqlen_k; j++) {
            s[j] = -INFINITY;
            if (!fjr_visible(p, b, h, i, j))
                continue;
            const float *kj = k + ((b * p->seqlen_k + j) * p->heads_kv + h / group) * d;
            float dot = 0;
            for (int64_t c = 0; c < d; c++)
                dot += qi[c] * kj[c];
            float x = dot * (float)p->scale;
            if (p->softcap > 0)
                x = (float)p->softcap * tanhf(x / (float)p->softcap);
            x += (float)score_terms(p, b, h, i, j);
            if (p->score_mod)
                x = (float)fj__score_mod_saturate(eval_mod(p, p->score_mod, b, h, i, j, x));
            s[j] = x;
            m = fmaxf(m, x);
        }
        float sum = 0;
        for (int64_t j = 0; j < p->seqlen_k && m > -INFINITY; j++)
            sum += s[j] == -INFINITY ? 0.0f : expf(s[j] - m);
        for (int64_t c = 0; c < dv; c++)
            acc[c] = 0;
        for (int64_t j = 0; j < p->seqlen_k && sum > 0; j++) {
            if (s[j] == -INFINITY)
                continue;
            float pj = fjr_round(dtype, expf(s[j] - m) / sum);
            const float *vj = v + ((b * p->seqlen_k + j) * p->heads_kv + h / group) * dv;
            for (int64_t c = 0; c < dv; c++)
                acc[c] += pj * vj[c];
        }
        for (int64_t c = 0; c < dv; c++)
            oi[c] = fjr_round(fjr_out_dtype(dtype), acc[c]);
    }
    free(s);
    free(acc);
}

void fjr_attention_lowp(const fjr_problem *p, fj_dtype dtype, const float *q, const float *k,
                        const float *v, float *out)
{
    forward_rows f = {.p = p, .dtype = dtype, .q = q, .k = k, .v = v, .out = out};
    over_rows(p->batch * p->heads_q * p->seqlen_q, forward_cost(p), attention_lowp_rows, &f);
}

/* The backward references' arguments, for over_rows (a row: one (batch, kv head) pair). */
typedef struct backward_pairs {
    const fjr_problem *p;
    fj_dtype dtype; /* _lowp's */
    const void *q, *k, *v, *dout;
    void *dq, *dk, *dv;
} backward_pairs;

/* FJR_BACKWARD(name, ...) defines name(ctx, lo, hi), a rows_fn: the backward for T = double or
** float over the (batch, kv head) pairs [lo, hi) of backward_pairs ctx (a pair's rows, and
** their contributions to its dK and dV, in the order of a single pass: b, h, i); lowp rounds P,
** dS and the results to dtype. MAG is applied to every factor of the gradients' terms: FJR_SAME
** for the gradients, fabs for their magnitudes (dS = P (|dP| + |D|) with |dP| and |D| sums of
** magnitudes, and so on), the scale of the rounding errors that a float implementation makes,
** cancellation in dP - D included. The gradients start zeroed (backward_over_pairs). */
#define FJR_SAME(x) (x)
#define FJR_BACKWARD(name, T, EXP, TANH, ROUND, MAG)                                               \
static void name(const void *ctx, int64_t lo, int64_t hi)                                          \
{                                                                                                  \
    const backward_pairs *a = ctx;                                                                 \
    const fjr_problem *p = a->p;                                                                   \
    const fj_dtype dtype = a->dtype;                                                               \
    const T *q = a->q, *k = a->k, *v = a->v, *dout = a->dout;                                      \
    T *dq = a->dq, *dk = a->dk, *dv = a->dv;                                                       \
    (void)dtype; /* (ROUND_DT's, in the float part) */                                             \
    const int64_t d = p->head_dim, dvd = p->head_dim_v, group = p->heads_q / p->heads_kv;          \
    const int64_t sk = p->seqlen_k;                                                                \
    T *s = malloc((size_t)sk * sizeof *s), *u = malloc((size_t)sk * sizeof *u);                    \
    T *o = malloc((size_t)dvd * sizeof *o), *g = malloc((size_t)sk * sizeof *g);                   \
    if (!s || !u || !o || !g)                                                                      \
        abort();                                                                                   \
    for (int64_t pair = lo; pair < hi; pair++)                                                     \
        for (int64_t b = pair / p->heads_kv, h = pair % p->heads_kv * group;                       \
             h < (pair % p->heads_kv + 1) * group; h++)                                            \
            for (int64_t i = 0; i < p->seqlen_q; i++) {                                            \
                const int64_t hk = h / group;                                                      \
                const T *qi = q + ((b * p->seqlen_q + i) * p->heads_q + h) * d;                    \
                const T *gi = dout + ((b * p->seqlen_q + i) * p->heads_q + h) * dvd;               \
                T *dqi = dq + ((b * p->seqlen_q + i) * p->heads_q + h) * d;                        \
                T m = -INFINITY;                                                                   \
                for (int64_t j = 0; j < sk; j++) {                                                 \
                    s[j] = -INFINITY;                                                              \
                    if (!fjr_visible(p, b, h, i, j))                                               \
                        continue;                                                                  \
                    const T *kj = k + ((b * sk + j) * p->heads_kv + hk) * d;                       \
                    T dot = 0;                                                                     \
                    for (int64_t c = 0; c < d; c++)                                                \
                        dot += qi[c] * kj[c];                                                      \
                    u[j] = dot * (T)p->scale;                                                      \
                    T x = p->softcap > 0 ? (T)p->softcap * TANH(u[j] / (T)p->softcap) : u[j];      \
                    s[j] = x + (T)score_terms(p, b, h, i, j);                                      \
                    g[j] = 1; /* d(score_mod)/ds */                                                \
                    if (p->score_mod) {                                                            \
                        g[j] = (T)eval_mod_at(p, p->score_mod, b, h, i, j, s[j], 1);               \
                        s[j] = (T)fj__score_mod_saturate(                                          \
                            eval_mod_at(p, p->score_mod, b, h, i, j, s[j], 0));                    \
                    }                                                                              \
                    m = s[j] > m ? s[j] : m;                                                       \
                }                                                                                  \
                if (m == -INFINITY)                                                                \
                    continue; /* no key: zero gradients */                                         \
                T sum = 0;                                                                         \
                for (int64_t j = 0; j < sk; j++)                                                   \
                    sum += s[j] == -INFINITY ? 0 : EXP(s[j] - m);                                  \
                for (int64_t c = 0; c < dvd; c++)                                                  \
                    o[c] = 0;                                                                      \
                for (int64_t j = 0; j < sk; j++) { /* P, in place of s, and O */                   \
                    s[j] = s[j] == -INFINITY ? 0 : ROUND(EXP(s[j] - m) / sum);                     \
                    const T *vj = v + ((b * sk + j) * p->heads_kv + hk) * dvd;                     \
                    for (int64_t c = 0; c < dvd && s[j] != 0; c++)                                 \
                        o[c] += s[j] * vj[c];                                                      \
                }                                                                                  \
                T delta = 0;                                                                       \
                for (int64_t c = 0; c < dvd; c++)                                                  \
                    delta += MAG(gi[c]) * MAG(ROUND(o[c])); /* O as stored */                      \
                for (int64_t j = 0; j < sk; j++) {                                                 \
                    if (s[j] == 0) /* masked (or underflowed): contributes nothing */              \
                        continue;                                                                  \
                    const T *kj = k + ((b * sk + j) * p->heads_kv + hk) * d;                       \
                    const T *vj = v + ((b * sk + j) * p->heads_kv + hk) * dvd;                     \
                    T *dkj = dk + ((b * sk + j) * p->heads_kv + hk) * d;                           \
                    T *dvj = dv + ((b * sk + j) * p->heads_kv + hk) * dvd;                         \
                    T dp = 0;                                                                      \
                    for (int64_t c = 0; c < dvd; c++)                                              \
                        dp += MAG(gi[c]) * MAG(vj[c]);                                             \
                    T ds = ROUND(s[j] * (MAG(dp) + MAG(-delta)));                                  \
                    T t = p->softcap > 0 ? TANH(u[j] / (T)p->softcap) : 0;                         \
                    T dd = MAG(ds * (T)p->scale * (p->softcap > 0 ? 1 - t * t : 1) * g[j]);        \
                    for (int64_t c = 0; c < d; c++) {                                              \
                        dqi[c] += dd * MAG(kj[c]);                                                 \
                        dkj[c] += dd * MAG(qi[c]);                                                 \
                    }                                                                              \
                    for (int64_t c = 0; c < dvd; c++)                                              \
                        dvj[c] += s[j] * MAG(gi[c]);                                               \
                    if (p->dbias) /* the bias enters score_mod's s: dS times its derivative */     \
                        ((T *)p->dbias)[(b + p->batch_offset) * p->dbias_stride[0] +               \
                                        h * p->dbias_stride[1] + i * p->dbias_stride[2] + j] +=    \
                            ds * MAG(g[j]);                                                        \
                }                                                                                  \
            }                                                                                      \
    free(s);                                                                                       \
    free(u);                                                                                       \
    free(g);                                                                                       \
    free(o);                                                                                       \
}

static double keep_double(double x)
{
    return x;
}

#define ROUND_DT(x) fjr_round(dtype, (x))
FJR_BACKWARD(backward_part, double, exp, tanh, keep_double, FJR_SAME)
FJR_BACKWARD(backward_magnitude_part, double, exp, tanh, keep_double, fabs)
FJR_BACKWARD(backward_lowp_part, float, expf, tanhf, ROUND_DT, FJR_SAME)
#undef ROUND_DT

/* The gradients zeroed, then part(pairs) on the machine's cores: (batch, kv head) pairs write
** disjoint rows of dQ, dK and dV, and the bias's gradient where no stride of it sums over
** batches or heads (else one thread, in the single pass's order). */
static void backward_over_pairs(const backward_pairs *a, size_t elem, rows_fn part)
{
    const fjr_problem *p = a->p;
    memset(a->dq, 0, (size_t)(p->batch * p->seqlen_q * p->heads_q * p->head_dim) * elem);
    memset(a->dk, 0, (size_t)(p->batch * p->seqlen_k * p->heads_kv * p->head_dim) * elem);
    memset(a->dv, 0, (size_t)(p->batch * p->seqlen_k * p->heads_kv * p->head_dim_v) * elem);
    const int shared = p->dbias && (p->dbias_stride[0] == 0 || p->dbias_stride[1] == 0);
    const double cost = (double)(p->heads_q / p->heads_kv) * (double)p->seqlen_q *
                        (double)p->seqlen_k * (double)(3 * p->head_dim + 3 * p->head_dim_v);
    over_rows(p->batch * p->heads_kv, shared ? 0 : cost, part, a);
}

void fjr_attention_backward(const fjr_problem *p, const double *q, const double *k,
                            const double *v, const double *dout, double *dq, double *dk,
                            double *dv)
{
    const backward_pairs a = {.p = p, .q = q, .k = k, .v = v, .dout = dout, .dq = dq, .dk = dk,
                              .dv = dv};
    backward_over_pairs(&a, sizeof *dq, backward_part);
}

void fjr_attention_backward_magnitude(const fjr_problem *p, const double *q, const double *k,
                                      const double *v, const double *dout, double *dq,
                                      double *dk, double *dv)
{
    const backward_pairs a = {.p = p, .q = q, .k = k, .v = v, .dout = dout, .dq = dq, .dk = dk,
                              .dv = dv};
    backward_over_pairs(&a, sizeof *dq, backward_magnitude_part);
}

void fjr_attention_backward_lowp(const fjr_problem *p, fj_dtype dtype, const float *q,
                                 const float *k, const float *v, const float *dout, float *dq,
                                 float *dk, float *dv)
{
    const backward_pairs a = {.p = p, .dtype = dtype, .q = q, .k = k, .v = v, .dout = dout,
                              .dq = dq, .dk = dk, .dv = dv};
    backward_over_pairs(&a, sizeof *dq, backward_lowp_part);
    const size_t n[3] = {(size_t)(p->batch * p->seqlen_q * p->heads_q * p->head_dim),
                         (size_t)(p->batch * p->seqlen_k * p->heads_kv * p->head_dim),
                         (size_t)(p->batch * p->seqlen_k * p->heads_kv * p->head_dim_v)};
    float *grads[3] = {dq, dk, dv};
    for (int t = 0; t < 3; t++)
        for (size_t i = 0; i < n[t]; i++)
            grads[t][i] = fjr_round(dtype, grads[t][i]);
}

void fjr_merge(int n, const double *const *outs, const double *lses, int64_t rows, int64_t dv,
               double *out, double *lse)
{
    for (int64_t r = 0; r < rows; r++) {
        double m = -INFINITY;
        int bad = 0;
        for (int s = 0; s < n; s++) {
            const double l = lses[s * rows + r];
            bad |= !(l < INFINITY);
            if (l > m)
                m = l;
        }
        double sum = 0;
        for (int s = 0; s < n && m > -INFINITY; s++)
            sum += exp(lses[s * rows + r] - m);
        for (int64_t d = 0; d < dv; d++) {
            double acc = 0;
            for (int s = 0; s < n && m > -INFINITY; s++)
                if (lses[s * rows + r] > -INFINITY)
                    acc += exp(lses[s * rows + r] - m) * outs[s][r * dv + d];
            out[r * dv + d] = bad ? NAN : m > -INFINITY ? acc / sum : 0.0;
        }
        if (lse)
            lse[r] = bad ? NAN : m > -INFINITY ? m + log(sum) : -INFINITY;
    }
}
