/* Runs one forward case on a context and checks it: fresh random inputs (never zeros), outputs
** poisoned with NaN bytes before the run, every element compared with the float64 reference,
** and every byte around the output views checked untouched. */
#define _POSIX_C_SOURCE 200809L
#include "random.h"
#include "reference.h"

#include "../../plan/expr.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define POISON 0xff /* all-ones bytes: NaN in f32, f16 and bf16 */

static double now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

void fjh_case_init(fjh_case *c)
{
    memset(c, 0, sizeof *c);
    c->batch = 2;
    c->seqlen_q = c->seqlen_k = 128;
    c->heads_q = c->heads_kv = 4;
    c->head_dim = c->head_dim_v = 64;
    c->dtype = FJ_DTYPE_BF16;
    fj_attention_desc_init(&c->desc);
    c->with_lse = 1;
}

fjh_case fjh_case_of(int64_t batch, int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q,
                     int64_t heads_kv, int64_t head_dim, fj_dtype dtype)
{
    fjh_case c;
    fjh_case_init(&c);
    c.batch = batch;
    c.seqlen_q = seqlen_q;
    c.seqlen_k = seqlen_k;
    c.heads_q = heads_q;
    c.heads_kv = heads_kv;
    c.head_dim = c.head_dim_v = head_dim;
    c.dtype = dtype;
    return c;
}

const char *fjh_dtype_name(fj_dtype dtype)
{
    switch (dtype) {
    case FJ_DTYPE_F32: return "f32";
    case FJ_DTYPE_F16: return "f16";
    case FJ_DTYPE_F8_E4M3: return "e4m3";
    case FJ_DTYPE_F8_E5M2: return "e5m2";
    default: return "bf16";
    }
}

void fjh_describe(const fjh_case *c, char *buf, size_t size)
{
    static const char *layouts[] = {"bshd", "bhsd", "padded"};
    snprintf(buf, size,
             "b=%lld sq=%lld sk=%lld hq=%lld hkv=%lld d=%lld dv=%lld %s causal=%d window=(%d,%d) "
             "softcap=%g scale=%g layout=%s lse=%d",
             (long long)c->batch, (long long)c->seqlen_q, (long long)c->seqlen_k,
             (long long)c->heads_q, (long long)c->heads_kv, (long long)c->head_dim,
             (long long)c->head_dim_v, fjh_dtype_name(c->dtype), (int)c->desc.causal,
             (int)c->desc.window_left, (int)c->desc.window_right, (double)c->desc.softcap,
             (double)c->desc.softmax_scale, layouts[c->layout], c->with_lse);
    size_t used = strlen(buf);
    if (c->desc.mask_mod && used < size)
        used += (size_t)snprintf(buf + used, size - used, " mask_mod=\"%s\"", c->desc.mask_mod);
    if (c->desc.score_mod && used < size)
        used += (size_t)snprintf(buf + used, size - used, " score_mod=\"%s\"", c->desc.score_mod);
    static const char *biases[] = {"", "full", "heads", "keys"}, *masks[] = {"", "random", "keys"};
    if (c->alibi && used < size)
        used += (size_t)snprintf(buf + used, size - used, " alibi=%s",
                                 c->alibi == 2 ? "[b,hq]" : "[hq]");
    if (c->bias >= 1 && c->bias <= 3 && used < size)
        used += (size_t)snprintf(buf + used, size - used, " bias=%s%s", biases[c->bias],
                                 c->bias_f32 ? ",f32" : "");
    if (c->mask >= 1 && c->mask <= 2 && used < size)
        used += (size_t)snprintf(buf + used, size - used, " mask=%s", masks[c->mask]);
    if (c->desc.num_splits && used < size)
        used += (size_t)snprintf(buf + used, size - used, " splits=%d", (int)c->desc.num_splits);
    if (c->paged > 0 && used < size)
        used += (size_t)snprintf(buf + used, size - used, " paged=%d", c->paged);
    if (c->append > 0 && used < size)
        used += (size_t)snprintf(buf + used, size - used, " append=%d", c->append);
    if (c->kv_fp8 && used < size)
        used += (size_t)snprintf(buf + used, size - used, " kv=%s",
                                 fjh_dtype_name((fj_dtype)c->kv_fp8));
    if (c->v_in_k && used < size)
        used += (size_t)snprintf(buf + used, size - used, " v=k[..dv]");
    if (c->backward && used < size)
        used += (size_t)snprintf(buf + used, size - used, "%s%s",
                                 c->dbias ? " backward+dbias" : " backward",
                                 c->desc.deterministic ? " deterministic" : "");
    if (c->varlen && used < size)
        used += (size_t)snprintf(buf + used, size - used, " varlen%s",
                                 c->varlen == 2 ? "+seqused_k" : "");
    if (c->ranges && used < size)
        used += (size_t)snprintf(buf + used, size - used, " ranges=%d", c->ranges);
    if (c->blocks && used < size)
        snprintf(buf + used, size - used, " block_mask=%s", c->blocks == 1 ? "[b,hq]" : "[1,1]");
}

/* The harness's answer to a failed host allocation: a message naming what it was for, and the
** process ends (exit status 2, as for a bad request); fjh_memory() lets callers refuse such
** problems before they start. */
static void out_of_memory(const char *what, size_t bytes)
{
    fprintf(stderr, "flashjit check: out of host memory: %zu bytes for %s\n", bytes, what);
    exit(2);
}

/* malloc that never returns NULL (see out_of_memory). */
static void *xmalloc(size_t bytes, const char *what)
{
    void *p = malloc(bytes ? bytes : 1);
    if (!p)
        out_of_memory(what, bytes);
    return p;
}

static void *xcalloc(size_t n, size_t size, const char *what)
{
    void *p = calloc(n ? n : 1, size);
    if (!p)
        out_of_memory(what, n * size);
    return p;
}

void fjh_memory(const fjh_case *c, double *host_bytes, double *device_bytes)
{
    const double b = (double)c->batch, sq = (double)c->seqlen_q, sk = (double)c->seqlen_k;
    const double es = (double)fj_dtype_size(c->dtype);
    const double q = b * sq * c->heads_q * c->head_dim, k = b * sk * c->heads_kv * c->head_dim,
                 v = b * sk * c->heads_kv * c->head_dim_v, o = b * sq * c->heads_q * c->head_dim_v;
    const double lse = b * c->heads_q * sq * 4;
    /* Padded layouts add a few elements per row: a quarter is a generous bound. */
    double device = 1.25 * (q + k + v + o) * es + lse;
    if (c->bias || c->mask)
        device += b * c->heads_q * sq * sk * (c->bias ? (c->bias_f32 ? 4 : es) : 1);
    /* Host: a copy of every device tensor, the inputs as doubles and floats, the reference's
    ** output (double) and the low-precision one (float), and the bytes-seen maps. */
    double host = device;
    if (!c->skip_check)
        host += 12 * (q + k + v) + 13 * o + 2 * lse;
    *host_bytes = host;
    *device_bytes = device;
}

static double normal(uint64_t *s)
{
    double u1 = ((double)(fjr_splitmix(s) >> 11) + 0.5) / 9007199254740992.0;
    double u2 = fjr_unit(fjr_splitmix(s));
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

/* A tensor of the harness: its geometry, host storage (every element, gaps included) and
** device copy. */
typedef struct htensor {
    fj_tensor t;
    size_t elements; /* storage elements: the largest offset + 1 */
    unsigned char *host;
    void *dev;
} htensor;

static void geometry(htensor *h, fj_dtype dtype, int64_t b, int64_t s, int64_t heads, int64_t dim,
                     fjh_layout layout)
{
    memset(h, 0, sizeof *h);
    fj_tensor *t = &h->t;
    t->dtype = dtype;
    t->ndim = 4;
    t->shape[0] = b;
    t->shape[1] = s;
    t->shape[2] = heads;
    t->shape[3] = dim;
    int64_t dp = dim + 3, hp = heads * dp + 5;
    int64_t strides[3][4] = {{s * heads * dim, heads * dim, dim, 1},
                             {heads * s * dim, dim, s * dim, 1},
                             {s * hp + 7, hp, dp, 1}};
    memcpy(t->stride, strides[layout], sizeof t->stride);
    int64_t last = 0;
    for (int i = 0; i < 4; i++)
        last += (t->shape[i] - 1) * t->stride[i];
    h->elements = (size_t)last + 1;
}

static void lse_geometry(htensor *h, int64_t b, int64_t heads, int64_t sq, fjh_layout layout)
{
    memset(h, 0, sizeof *h);
    fj_tensor *t = &h->t;
    t->dtype = FJ_DTYPE_F32;
    t->ndim = 3;
    t->shape[0] = b;
    t->shape[1] = heads;
    t->shape[2] = sq;
    int64_t sp = layout == FJH_LAYOUT_PADDED ? sq + 2 : sq;
    t->stride[0] = heads * sp + (layout == FJH_LAYOUT_PADDED);
    t->stride[1] = sp;
    t->stride[2] = 1;
    h->elements = (size_t)((b - 1) * t->stride[0] + (heads - 1) * sp + sq);
}

static int64_t offset4(const fj_tensor *t, int64_t a, int64_t b, int64_t c, int64_t d)
{
    return a * t->stride[0] + b * t->stride[1] + c * t->stride[2] + d * t->stride[3];
}

/* Fills all storage of h with random values of its dtype and, when dense is not NULL, returns
** the logical values as dense [b, s, h, dim] doubles and floats (for the reference). */
/* The reference's contiguous copies of h's values (double and float), allocated. */
static void dense_of(const htensor *h, double **dense, float **densef)
{
    const fj_tensor *t = &h->t;
    size_t es = fj_dtype_size(t->dtype);
    size_t n = (size_t)(t->shape[0] * t->shape[1] * t->shape[2] * t->shape[3]);
    *dense = xmalloc(n * sizeof **dense, "the reference's inputs");
    *densef = xmalloc(n * sizeof **densef, "the reference's inputs");
    size_t idx = 0;
    for (int64_t a = 0; a < t->shape[0]; a++)
        for (int64_t b = 0; b < t->shape[1]; b++)
            for (int64_t c = 0; c < t->shape[2]; c++)
                for (int64_t d = 0; d < t->shape[3]; d++, idx++) {
                    float x = fjr_load(t->dtype, h->host + (size_t)offset4(t, a, b, c, d) * es);
                    (*densef)[idx] = x;
                    (*dense)[idx] = x;
                }
}

/* Fills h with standard-normal values and, with `dense`, gives their dense copies for the
** reference. Without one (a timing run, nothing checked) the values are uniform on [-sqrt 3,
** sqrt 3] instead (the same variance), some 20 times cheaper: multi-GB tensors fill in seconds. */
static void fill_random(htensor *h, uint64_t *rng, double **dense, float **densef)
{
    fj_tensor *t = &h->t;
    size_t es = fj_dtype_size(t->dtype);
    for (size_t i = 0; i < h->elements; i++) {
        const double x =
            dense ? normal(rng) : 1.7320508075688772 * fjr_signed_unit(fjr_splitmix(rng));
        fjr_store(t->dtype, h->host + i * es, (float)x);
    }
    if (dense)
        dense_of(h, dense, densef);
}

/* v's values made k's first head_dim_v dims (MLA: v is a view of k). */
static void v_from_k(const htensor *k, htensor *v)
{
    const fj_tensor *kt = &k->t, *vt = &v->t;
    const size_t es = fj_dtype_size(kt->dtype);
    for (int64_t a = 0; a < vt->shape[0]; a++)
        for (int64_t b = 0; b < vt->shape[1]; b++)
            for (int64_t c = 0; c < vt->shape[2]; c++)
                for (int64_t d = 0; d < vt->shape[3]; d++)
                    memcpy(v->host + (size_t)offset4(vt, a, b, c, d) * es,
                           k->host + (size_t)offset4(kt, a, b, c, d) * es, es);
}

/* The view of k that reads its first head_dim_v dims as v. */
static fj_tensor v_view_of(const fj_tensor *k, int64_t head_dim_v)
{
    fj_tensor v = *k;
    v.shape[v.ndim - 1] = head_dim_v;
    return v;
}

/* A tensor of any rank with the given shape and strides (0 broadcasts), host storage allocated
** and filled with NaN bytes. */
static void make_tensor(htensor *h, fj_dtype dtype, int ndim, const int64_t *shape,
                        const int64_t *stride)
{
    memset(h, 0, sizeof *h);
    h->t.dtype = dtype;
    h->t.ndim = ndim;
    int64_t last = 0;
    for (int i = 0; i < ndim; i++) {
        h->t.shape[i] = shape[i];
        h->t.stride[i] = stride[i];
        last += (shape[i] - 1) * stride[i];
    }
    h->elements = (size_t)last + 1;
    size_t bytes = h->elements * fj_dtype_size(dtype);
    h->host = xmalloc(bytes, "a tensor's host copy");
    memset(h->host, POISON, bytes);
}

/* The ALiBi slopes, bias and mask a case asks for, with random contents, described for the
** reference in p. Tensors the case does not ask for stay empty (host NULL). */
static void make_score_terms(const fjh_case *c, uint64_t *rng, fjr_problem *p, htensor *alibi,
                             htensor *bias, htensor *mask, htensor *ranges, htensor *blocks)
{
    /* Keys: a paged cache's table holds whole pages (a sequence's key j is column j). */
    const int64_t sk = c->paged > 0 ? (c->seqlen_k + c->paged - 1) / c->paged * c->paged
                                    : c->seqlen_k;
    const int64_t b = c->batch, hq = c->heads_q, sq = c->seqlen_q;
    if (c->alibi) {
        const int64_t shape[2] = {b, hq}, stride[2] = {hq, 1};
        int per_batch = c->alibi == 2;
        make_tensor(alibi, FJ_DTYPE_F32, per_batch ? 2 : 1, per_batch ? shape : shape + 1,
                    per_batch ? stride : stride + 1);
        float *s = (float *)alibi->host;
        for (size_t i = 0; i < alibi->elements; i++) /* slopes in (0, 0.5], as ALiBi's are */
            s[i] = (float)(0.5 * ((double)(fjr_splitmix(rng) >> 11) + 1) / 9007199254740992.0);
        p->alibi = s;
        p->alibi_stride_b = per_batch ? hq : 0;
    }
    if (c->bias) {
        const int64_t full[4] = {b, hq, sq, sk}, dense[4] = {hq * sq * sk, sq * sk, sk, 1};
        int64_t shape[4], stride[4];
        memcpy(shape, full, sizeof shape);
        memcpy(stride, dense, sizeof stride);
        if (c->bias == 2)
            shape[0] = 1;
        if (c->bias == 3)
            stride[0] = sk, stride[1] = stride[2] = 0;
        fj_dtype dt = c->bias_f32 ? FJ_DTYPE_F32 : c->dtype;
        make_tensor(bias, dt, 4, shape, stride);
        size_t es = fj_dtype_size(dt);
        for (size_t i = 0; i < bias->elements; i++)
            fjr_store(dt, bias->host + i * es, (float)normal(rng));
        p->bias_dtype = dt;
        p->bias = bias->host;
        for (int i = 0; i < 4; i++)
            p->bias_stride[i] = shape[i] == 1 ? 0 : stride[i];
    }
    if (c->mask) {
        const int64_t full[4] = {b, hq, sq, sk}, dense[4] = {hq * sq * sk, sq * sk, sk, 1};
        const int64_t keys[4] = {b, 1, 1, sk}, keys_stride[4] = {sk, sk, sk, 1};
        make_tensor(mask, FJ_DTYPE_BOOL, 4, c->mask == 1 ? full : keys,
                    c->mask == 1 ? dense : keys_stride);
        for (size_t i = 0; i < mask->elements; i++)
            mask->host[i] = c->mask == 1 ? (fjr_splitmix(rng) % 4 != 0) : 1;
        if (c->mask == 1)
            memset(mask->host, 0, (size_t)sk); /* query 0 of (0, 0) sees no key */
        else
            for (int64_t a = 0; a < b; a++)
                for (int64_t j = sk - a * sk / 3; j < sk; j++)
                    mask->host[a * sk + j] = 0;
        p->mask = mask->host;
        for (int i = 0; i < 4; i++)
            p->mask_stride[i] = mask->t.shape[i] == 1 ? 0 : mask->t.stride[i];
    }
    if (c->ranges) {
        /* Random ranges reaching past both ends of the rows, some empty or reversed. */
        const int64_t n = c->ranges;
        const int64_t shape[4] = {c->ranges == 2 ? b : 1, hq, sk, n};
        const int64_t stride[4] = {hq * sk * n, sk * n, n, 1};
        make_tensor(ranges, FJ_DTYPE_I32, 4, shape, stride);
        int32_t *r = (int32_t *)ranges->host;
        for (size_t i = 0; i < ranges->elements; i += 2) {
            r[i] = (int32_t)(fjr_splitmix(rng) % (uint64_t)(sq + 8)) - 4;
            r[i + 1] = r[i] + (int32_t)(fjr_splitmix(rng) % (uint64_t)(sq / 2 + 2)) - 1;
        }
        p->ranges = r;
        p->ranges_n = (int)n;
        for (int i = 0; i < 3; i++)
            p->ranges_stride[i] = shape[i] == 1 ? 0 : stride[i];
    }
    if (c->blocks) {
        const int64_t qb = (sq + 127) / 128, kb = (sk + 127) / 128;
        const int64_t shape[4] = {c->blocks == 1 ? b : 1, c->blocks == 1 ? hq : 1, qb, kb};
        const int64_t stride[4] = {hq * qb * kb, qb * kb, kb, 1};
        make_tensor(blocks, FJ_DTYPE_I32, 4, shape, stride);
        int32_t *k = (int32_t *)blocks->host;
        for (size_t i = 0; i < blocks->elements; i++)
            k[i] = (int32_t)(fjr_splitmix(rng) % 3);
        p->blocks = k;
        for (int i = 0; i < 3; i++)
            p->blocks_stride[i] = shape[i] == 1 ? 0 : stride[i];
    }
}

/* Packed sequences of a varlen case: lengths, offsets and the I32 tensors the library reads. */
typedef struct packing {
    int64_t n;                       /* sequences */
    int64_t *len_q, *len_k, *used_k; /* per sequence; used_k = len_k without seqused_k */
    int64_t total_q, total_k;
    htensor cu_q, cu_k, seqused; /* I32 [n + 1], [n + 1], [n] */
} packing;

static void make_packing(const fjh_case *c, uint64_t *rng, packing *pk)
{
    memset(pk, 0, sizeof *pk);
    pk->n = c->batch;
    pk->len_q = xcalloc((size_t)pk->n, sizeof *pk->len_q, "sequence lengths");
    pk->len_k = xcalloc((size_t)pk->n, sizeof *pk->len_k, "sequence lengths");
    pk->used_k = xcalloc((size_t)pk->n, sizeof *pk->used_k, "sequence lengths");
    for (int64_t b = 0; b < pk->n; b++) {
        /* Sequence 1 has no query; the others up to the maxima, the first at the maxima. */
        pk->len_q[b] = b == 1   ? 0
                       : b == 0 ? c->seqlen_q
                                : 1 + (int64_t)(fjr_splitmix(rng) % (uint64_t)c->seqlen_q);
        pk->len_k[b] =
            b == 0 ? c->seqlen_k : 1 + (int64_t)(fjr_splitmix(rng) % (uint64_t)c->seqlen_k);
        pk->used_k[b] =
            c->varlen == 2
                ? pk->len_k[b] - (int64_t)(fjr_splitmix(rng) % (uint64_t)(pk->len_k[b] / 2 + 1))
                : pk->len_k[b];
        pk->total_q += pk->len_q[b];
        pk->total_k += pk->len_k[b];
    }
    const int64_t n1 = pk->n + 1, one = 1;
    make_tensor(&pk->cu_q, FJ_DTYPE_I32, 1, &n1, &one);
    make_tensor(&pk->cu_k, FJ_DTYPE_I32, 1, &n1, &one);
    make_tensor(&pk->seqused, FJ_DTYPE_I32, 1, &pk->n, &one);
    int32_t *cq = (int32_t *)pk->cu_q.host, *ck = (int32_t *)pk->cu_k.host;
    int32_t *used = (int32_t *)pk->seqused.host;
    cq[0] = ck[0] = 0;
    for (int64_t b = 0; b < pk->n; b++) {
        cq[b + 1] = cq[b] + (int32_t)pk->len_q[b];
        ck[b + 1] = ck[b] + (int32_t)pk->len_k[b];
        used[b] = (int32_t)pk->used_k[b];
    }
}

/* NaN in the keys or values of t ([1, total_k, heads, dim]) that seqused_k leaves unused: a
** kernel must neither read them into a result nor let 0 * NaN through. */
static void poison_unused_keys(htensor *h, const packing *pk)
{
    const fj_tensor *t = &h->t;
    const size_t es = fj_dtype_size(t->dtype);
    int64_t first = 0;
    for (int64_t b = 0; b < pk->n; first += pk->len_k[b], b++)
        for (int64_t r = first + pk->used_k[b]; r < first + pk->len_k[b]; r++)
            for (int64_t hd = 0; hd < t->shape[2]; hd++)
                for (int64_t d = 0; d < t->shape[3]; d++)
                    memset(h->host + (size_t)offset4(t, 0, r, hd, d) * es, POISON, es);
}

/* The packed [total, heads, dim] view of a [1, total, heads, dim] tensor, and the [heads, total]
** view of a [1, heads, total] lse. */
static fj_tensor packed_view(const fj_tensor *t)
{
    fj_tensor v = *t;
    v.ndim = t->ndim - 1;
    for (int i = 0; i < 3; i++) {
        v.shape[i] = t->shape[i + 1];
        v.stride[i] = t->stride[i + 1];
    }
    v.shape[3] = v.stride[3] = 0;
    return v;
}

/* Sequence b of a varlen case as a problem of its own. */
static fjr_problem sequence_problem(const fjr_problem *p, const packing *pk, int64_t b)
{
    fjr_problem s = *p;
    s.batch = 1;
    s.batch_offset = b;
    s.seqlen_q = pk->len_q[b];
    s.seqlen_k = pk->used_k[b];
    return s;
}

/* The reference of a varlen case, one sequence at a time, into packed outputs (one batch of
** total_q rows, as check() reads them). */
static void reference_packed(const fjr_problem *p, const packing *pk, const double *qd,
                             const double *kd, const double *vd, const float *qf, const float *kf,
                             const float *vf, fj_dtype dtype, double *ref, double *ref_lse,
                             float *lowp)
{
    int64_t row_q = 0, row_k = 0;
    const int64_t hq = p->heads_q, hkv = p->heads_kv, d = p->head_dim, dv = p->head_dim_v;
    double *lse_b =
        xmalloc((size_t)(hq * (pk->total_q + 1)) * sizeof *lse_b, "the reference's lse");
    for (int64_t b = 0; b < pk->n; b++) {
        const fjr_problem s = sequence_problem(p, pk, b);
        if (s.seqlen_q > 0 && s.seqlen_k > 0) {
            fjr_attention(&s, qd + row_q * hq * d, kd + row_k * hkv * d, vd + row_k * hkv * dv,
                          ref + row_q * hq * dv, lse_b);
            if (lowp)
                fjr_attention_lowp(&s, dtype, qf + row_q * hq * d, kf + row_k * hkv * d,
                                   vf + row_k * hkv * dv, lowp + row_q * hq * dv);
        } else {
            for (int64_t i = 0; i < s.seqlen_q * hq * dv; i++) {
                ref[row_q * hq * dv + i] = 0;
                if (lowp)
                    lowp[row_q * hq * dv + i] = 0;
            }
            for (int64_t i = 0; i < hq * s.seqlen_q; i++)
                lse_b[i] = -INFINITY;
        }
        for (int64_t h = 0; h < hq; h++)
            for (int64_t i = 0; i < s.seqlen_q; i++)
                ref_lse[h * pk->total_q + row_q + i] = lse_b[h * s.seqlen_q + i];
        row_q += pk->len_q[b];
        row_k += pk->len_k[b];
    }
    free(lse_b);
}

/* The paged KV cache of a case: each sequence's keys (seqlen_k, 0, 1, then random counts)
** copied from the dense k and v into pages of c->paged keys dealt in a shuffled order from a
** cache with three spare pages; rows and pages no sequence uses hold NaN. With c->append, the
** host copies each sequence's keys but its last c->append (all where it has fewer), which
** append_tokens() has the library append. */
typedef struct paging {
    int64_t *used;          /* keys of each sequence */
    int64_t *copied;        /* of them, the first copied by the host */
    htensor table, seqused; /* I32 [batch, pages per sequence], [batch] */
    htensor k, v;           /* [num_pages, page, heads_kv, dim] */
} paging;

static void page_copy(const htensor *dense, htensor *pages, const fjh_case *c, const paging *pg)
{
    const size_t es = fj_dtype_size(dense->t.dtype);
    const int64_t page = c->paged, per = pg->table.t.shape[1];
    const int32_t *table = (const int32_t *)pg->table.host;
    memset(pages->host, POISON, pages->elements * es);
    /* A row at a time where both keep a row's elements together, else element by element. */
    const int rows = dense->t.stride[3] == 1 && pages->t.stride[3] == 1;
    const int64_t dims = dense->t.shape[3], step = rows ? dims : 1;
    for (int64_t b = 0; b < c->batch; b++)
        for (int64_t key = 0; key < pg->copied[b]; key++)
            for (int64_t h = 0; h < dense->t.shape[2]; h++)
                for (int64_t d = 0; d < dims; d += step)
                    memcpy(pages->host +
                               (size_t)offset4(&pages->t, table[b * per + key / page], key % page,
                                               h, d) * es,
                           dense->host + (size_t)offset4(&dense->t, b, key, h, d) * es,
                           (size_t)step * es);
}

static void make_paging(const fjh_case *c, uint64_t *rng, const htensor *k, const htensor *v,
                        paging *pg)
{
    memset(pg, 0, sizeof *pg);
    const int64_t b = c->batch, page = c->paged, sk = c->seqlen_k;
    const int64_t per = (sk + page - 1) / page, num = b * per + 3;
    pg->used = xcalloc((size_t)b, sizeof *pg->used, "sequence lengths");
    pg->copied = xcalloc((size_t)b, sizeof *pg->copied, "sequence lengths");
    for (int64_t i = 0; i < b; i++) {
        pg->used[i] = i == 0   ? sk
                      : i == 1 ? 0
                      : i == 2 ? 1
                               : (int64_t)(fjr_splitmix(rng) % (uint64_t)(sk + 1));
        pg->copied[i] = pg->used[i] > c->append ? pg->used[i] - c->append : 0;
    }
    int64_t *perm = xcalloc((size_t)num, sizeof *perm, "a page order");
    for (int64_t i = 0; i < num; i++)
        perm[i] = i;
    for (int64_t i = num - 1; i > 0; i--) { /* Fisher-Yates */
        const int64_t j = (int64_t)(fjr_splitmix(rng) % (uint64_t)(i + 1)), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    const int64_t tshape[2] = {b, per}, tstride[2] = {per, 1}, one = 1;
    make_tensor(&pg->table, FJ_DTYPE_I32, 2, tshape, tstride);
    make_tensor(&pg->seqused, FJ_DTYPE_I32, 1, &b, &one);
    for (int64_t i = 0; i < b * per; i++)
        ((int32_t *)pg->table.host)[i] = (int32_t)perm[i];
    for (int64_t i = 0; i < b; i++)
        ((int32_t *)pg->seqused.host)[i] = (int32_t)pg->used[i];
    free(perm);
    const htensor *dense[2] = {k, v};
    htensor *pages[2] = {&pg->k, &pg->v};
    for (int t = 0; t < 2; t++) {
        const int64_t h = dense[t]->t.shape[2], d = dense[t]->t.shape[3];
        const int64_t shape[4] = {num, page, h, d}, stride[4] = {page * h * d, h * d, d, 1};
        make_tensor(pages[t], dense[t]->t.dtype, 4, shape, stride);
        page_copy(dense[t], pages[t], c, pg);
    }
}

/* The reference of a paged case: sequence b against its first used[b] keys. */
static void reference_paged(const fjr_problem *p, const int64_t *used, const double *qd,
                            const double *kd, const double *vd, const float *qf, const float *kf,
                            const float *vf, fj_dtype dtype, double *ref, double *ref_lse,
                            float *lowp)
{
    const int64_t sq = p->seqlen_q, sk = p->seqlen_k, hq = p->heads_q, hkv = p->heads_kv;
    const int64_t d = p->head_dim, dv = p->head_dim_v;
    for (int64_t b = 0; b < p->batch; b++) {
        fjr_problem s = *p;
        s.batch = 1;
        s.batch_offset = b;
        s.seqlen_k = used[b];
        const int64_t qo = b * sq * hq * d, ko = b * sk * hkv * d, vo = b * sk * hkv * dv;
        const int64_t oo = b * sq * hq * dv, lo = b * hq * sq;
        if (used[b] > 0) {
            fjr_attention(&s, qd + qo, kd + ko, vd + vo, ref + oo, ref_lse + lo);
            if (lowp)
                fjr_attention_lowp(&s, dtype, qf + qo, kf + ko, vf + vo, lowp + oo);
            continue;
        }
        for (int64_t i = 0; i < sq * hq * dv; i++) {
            ref[oo + i] = 0;
            if (lowp)
                lowp[oo + i] = 0;
        }
        for (int64_t i = 0; i < hq * sq; i++)
            ref_lse[lo + i] = -INFINITY;
    }
}

/* Forward FLOPs of a case: with packed sequences or a paged cache, the sum over its sequences
** (queries: each sequence's rows; keys: the keys each one uses). pk and pg may be NULL. */
static double case_flops(const fjr_problem *p, const packing *pk, const paging *pg)
{
    if (!pk && !pg)
        return fjr_flops(p);
    double f = 0;
    const int64_t n = pk ? pk->n : p->batch;
    for (int64_t b = 0; b < n; b++) {
        fjr_problem s = pk ? sequence_problem(p, pk, b) : *p;
        if (!pk) {
            s.batch = 1;
            s.batch_offset = b;
        }
        if (pg)
            s.seqlen_k = pg->used[b];
        if (s.seqlen_q > 0 && s.seqlen_k > 0)
            f += fjr_flops(&s);
    }
    return f;
}

static fj_status upload(fj_context *ctx, htensor *h)
{
    size_t bytes = h->elements * fj_dtype_size(h->t.dtype);
    fj_status st = fj_malloc(ctx, bytes, &h->dev);
    if (st == FJ_OK)
        st = fj_memcpy_h2d(ctx, h->dev, h->host, bytes);
    h->t.data = h->dev;
    return st;
}

static void release(fj_context *ctx, htensor *h)
{
    if (h->dev)
        fj_free(ctx, h->dev);
    free(h->host);
    h->dev = NULL;
    h->host = NULL;
}

/* The library appends the keys and values of each sequence that make_paging left to it: the
** ones from pg->copied[b] to pg->used[b] - 1, from the dense k and v. With c->varlen packed
** (fj_kv_cache_append_packed: each sequence its own count), else c->append tokens a sequence
** (fj_kv_cache_append; one with fewer keys gets its first c->append, the ones past its length
** written where the attention does not look). An FP8 cache gets them in the case's dtype, as
** their values times 2 (k) and 0.5 (v), quantised by fj_kv_cache_append_quantized with those
** descale factors (exact: the codes come back). */
static fj_status append_tokens(fj_context *ctx, const fjh_case *c, const htensor *k,
                               const htensor *v, const paging *pg)
{
    const int64_t b = c->batch, t = c->append < c->seqlen_k ? c->append : c->seqlen_k, one = 1;
    const int packed = c->varlen != 0;
    int64_t rows = 0;
    htensor first, before, fresh[2], descale[2];
    make_tensor(&first, FJ_DTYPE_I32, 1, (int64_t[]){b + 1}, &one);
    make_tensor(&before, FJ_DTYPE_I32, 1, &b, &one);
    for (int64_t i = 0; i < b; i++) {
        ((int32_t *)first.host)[i] = (int32_t)rows;
        ((int32_t *)before.host)[i] = (int32_t)pg->copied[i];
        rows += packed ? pg->used[i] - pg->copied[i] : t;
    }
    ((int32_t *)first.host)[b] = (int32_t)rows;
    const fj_dtype cache = k->t.dtype, dtype = c->kv_fp8 ? c->dtype : cache;
    const size_t cs = fj_dtype_size(cache), ns = fj_dtype_size(dtype);
    const float factor[2] = {2.0f, 0.5f};
    const htensor *dense[2] = {k, v};
    fj_status st = FJ_OK;
    for (int i = 0; i < 2; i++) {
        const int64_t h = dense[i]->t.shape[2], d = dense[i]->t.shape[3];
        const int64_t shape[3] = {rows > 0 ? rows : 1, h, d}, stride[3] = {h * d, d, 1};
        make_tensor(&fresh[i], dtype, 3, shape, stride);
        for (int64_t s = 0; s < b; s++) {
            /* Sequence s's rows of fresh, from dense key pg->copied[s] on. */
            const int64_t row0 = packed ? ((int32_t *)first.host)[s] : s * t;
            const int64_t n = packed ? pg->used[s] - pg->copied[s] : t;
            for (int64_t r = 0; r < n; r++)
                for (int64_t j = 0; j < h * d; j++) {
                    const unsigned char *x =
                        dense[i]->host +
                        (size_t)offset4(&dense[i]->t, s, pg->copied[s] + r, j / d, j % d) * cs;
                    unsigned char *y = fresh[i].host + (size_t)((row0 + r) * h * d + j) * ns;
                    if (c->kv_fp8)
                        fjr_store(dtype, y, fjr_load(cache, x) * factor[i]);
                    else
                        memcpy(y, x, cs);
                }
        }
        if (!packed) { /* [b, t, h, d] */
            const int64_t s4[4] = {b, t, h, d}, st4[4] = {t * h * d, h * d, d, 1};
            fresh[i].t.ndim = 4;
            memcpy(fresh[i].t.shape, s4, sizeof s4);
            memcpy(fresh[i].t.stride, st4, sizeof st4);
        }
        make_tensor(&descale[i], FJ_DTYPE_F32, 1, &one, &one);
        memcpy(descale[i].host, &factor[i], sizeof(float));
    }
    htensor *parts[6] = {&first, &before, &fresh[0], &fresh[1], &descale[0], &descale[1]};
    for (int i = 0; i < 6 && st == FJ_OK; i++)
        st = upload(ctx, parts[i]);
    fj_tensor kc = pg->k.t, vc = pg->v.t; /* (uploaded: their data is the device's) */
    if (st == FJ_OK && rows > 0)
        st = c->kv_fp8 ? fj_kv_cache_append_quantized(
                             ctx, &fresh[0].t, &fresh[1].t, packed ? &first.t : NULL, &descale[0].t,
                             &descale[1].t, &kc, &vc, &pg->table.t, &before.t, NULL)
             : packed ? fj_kv_cache_append_packed(ctx, &fresh[0].t, &fresh[1].t, &first.t, &kc, &vc,
                                                  &pg->table.t, &before.t, NULL)
                      : fj_kv_cache_append(ctx, &fresh[0].t, &fresh[1].t, &kc, &vc, &pg->table.t,
                                           &before.t, NULL);
    if (st == FJ_OK)
        st = fj_synchronize(ctx, NULL);
    for (int i = 0; i < 6; i++)
        release(ctx, parts[i]);
    return st;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* FlashAttention-3's rounding allowance at reference value x: twice |(x + 0.3) - 0.3 - x| with
** every step rounded to dtype (one rounding step of an output of that size). */
static double rounding_allowance(fj_dtype dtype, double x)
{
    const float y = fjr_round(dtype, (float)x);
    const float z = fjr_round(dtype, fjr_round(dtype, y + 0.3f) - 0.3f);
    return 2.0 * fabs((double)z - y);
}

/* Compares the downloaded outputs with the reference and checks the bytes around the views. */
static void check(const fjh_case *c, const fjr_problem *p, const htensor *out, const htensor *lse,
                  const double *ref, const double *ref_lse, const float *lowp, fjh_result *r)
{
    const fj_dtype odt = out->t.dtype;
    size_t es = fj_dtype_size(odt);
    unsigned char *seen = xcalloc(out->elements, 1, "the check of the output");
    size_t idx = 0;
    for (int64_t a = 0; a < p->batch; a++)
        for (int64_t i = 0; i < p->seqlen_q; i++)
            for (int64_t h = 0; h < p->heads_q; h++)
                for (int64_t d = 0; d < p->head_dim_v; d++, idx++) {
                    int64_t off = offset4(&out->t, a, i, h, d);
                    seen[off] = 1;
                    double x = fjr_load(odt, out->host + (size_t)off * es);
                    if (!isfinite(x) || !isfinite(ref[idx])) {
                        /* Where the scores hold a NaN (a score_mod's log(-1), say) the reference
                        ** is NaN too: non-finite values must agree exactly, else it is wrong. */
                        r->bad_elements += !(isnan(x) ? isnan(ref[idx]) : x == ref[idx]);
                        continue;
                    }
                    r->max_abs_err = fmax(r->max_abs_err, fabs(x - ref[idx]));
                    r->ref_max_abs = fmax(r->ref_max_abs, fabs(ref[idx]));
                    if (lowp)
                        r->lowp_max_abs_err = fmax(r->lowp_max_abs_err, fabs(lowp[idx] - ref[idx]));
                    if (c->dtype != FJ_DTYPE_F32)
                        r->rounding_atol =
                            fmax(r->rounding_atol, rounding_allowance(odt, ref[idx]));
                }
    for (size_t e = 0; e < out->elements; e++)
        for (size_t byte = 0; !seen[e] && byte < es; byte++)
            r->clobbered += out->host[e * es + byte] != POISON;
    free(seen);
    if (lse && lse->host) {
        const float *l = (const float *)lse->host;
        unsigned char *lseen = xcalloc(lse->elements, 1, "the check of lse");
        for (int64_t a = 0; a < p->batch; a++)
            for (int64_t h = 0; h < p->heads_q; h++)
                for (int64_t i = 0; i < p->seqlen_q; i++) {
                    int64_t off = a * lse->t.stride[0] + h * lse->t.stride[1] + i;
                    lseen[off] = 1;
                    double want = ref_lse[(a * p->heads_q + h) * p->seqlen_q + i];
                    double got = l[off];
                    if (!isfinite(want) || !isfinite(got)) {
                        r->bad_elements += !(isnan(got) ? isnan(want) : got == want);
                    } else {
                        r->lse_max_err =
                            fmax(r->lse_max_err, fabs(got - want) / fmax(1.0, fabs(want)));
                    }
                }
        for (size_t e = 0; e < lse->elements; e++)
            for (size_t byte = 0; !lseen[e] && byte < 4; byte++)
                r->clobbered += lse->host[e * 4 + byte] != POISON;
        free(lseen);
    }
    r->rel_err = r->ref_max_abs > 0 ? r->max_abs_err / r->ref_max_abs : r->max_abs_err;

    /* The criteria. f32: relative error 1e-5. f16/bf16: FlashAttention-3's test criterion, no
    ** more than twice the error of the plain low-precision implementation plus twice the dtype's
    ** rounding error of an add at the output's magnitude (`2 * (out_ref + 0.3 - 0.3 - out_ref)`:
    ** one rounding step of the output, which the plain implementation may happen to avoid on a
    ** draw); the floor covers problems where both are exact (a single key, say). lse is computed
    ** in f32 from the same rounded inputs in every dtype: relative error 1e-4, or 1e-3 with FP8 q
    ** and k, whose products Hopper's tensor cores add with about 13 bits of mantissa (measured:
    ** 1-4e-4 at d 64-256; the outputs stay well inside their criterion). */
    const double lse_tol = fj__dtype_fp8(c->dtype) ? 1e-3 : 1e-4;
    r->pass = 0;
    if (r->bad_elements)
        snprintf(r->why, sizeof r->why,
                 "%lld output elements non-finite where the reference is not (or the reverse)",
                 (long long)r->bad_elements);
    else if (r->clobbered)
        snprintf(r->why, sizeof r->why, "%lld bytes outside the output views were written",
                 (long long)r->clobbered);
    else if (c->dtype == FJ_DTYPE_F32 && r->rel_err > 1e-5)
        snprintf(r->why, sizeof r->why, "f32 relative error %.3g > 1e-5", r->rel_err);
    else if (c->dtype != FJ_DTYPE_F32 &&
             r->max_abs_err >
                 fmax(2.0 * r->lowp_max_abs_err + r->rounding_atol, 1e-6 * r->ref_max_abs))
        snprintf(r->why, sizeof r->why,
                 "error %.3g > 2 x plain low-precision error %.3g + rounding %.3g",
                 r->max_abs_err, r->lowp_max_abs_err, r->rounding_atol);
    else if (r->lse_max_err > lse_tol)
        snprintf(r->why, sizeof r->why, "lse relative error %.3g > %g", r->lse_max_err, lse_tol);
    else
        r->pass = 1;
}

/* Compares one gradient (host copy g, its tensor's view) with the reference ref (contiguous)
** and the plain implementation lowp (NULL for f32); 0, or -1 with r->why set. */
static int check_grad(const fjh_case *c, const char *name, const htensor *g, const double *ref,
                      const float *lowp, const double *mag, int slot, fjh_result *r)
{
    const fj_tensor *t = &g->t;
    const size_t es = fj_dtype_size(t->dtype);
    unsigned char *seen = xcalloc(g->elements, 1, "a coverage map");
    double err = 0, low = 0, big = 0, atol = 0, scale = 0;
    int64_t bad = 0, idx = 0;
    for (int64_t a = 0; a < t->shape[0]; a++)
        for (int64_t b = 0; b < t->shape[1]; b++)
            for (int64_t h = 0; h < t->shape[2]; h++)
                for (int64_t d = 0; d < t->shape[3]; d++, idx++) {
                    const int64_t off = offset4(t, a, b, h, d);
                    seen[off] = 1;
                    const double x = fjr_load(t->dtype, g->host + (size_t)off * es);
                    if (!isfinite(x)) {
                        bad++;
                        continue;
                    }
                    err = fmax(err, fabs(x - ref[idx]));
                    big = fmax(big, fabs(ref[idx]));
                    if (mag)
                        scale = fmax(scale, mag[idx]);
                    if (lowp) {
                        low = fmax(low, fabs(lowp[idx] - ref[idx]));
                        /* In the case's dtype: dbias is f32, but its terms come from 16-bit
                        ** inputs as dq's do, and so does the plain implementation's. */
                        atol = fmax(atol, rounding_allowance(c->dtype, ref[idx]));
                    }
                }
    int64_t clobbered = 0;
    for (size_t e = 0; e < g->elements; e++)
        for (size_t byte = 0; !seen[e] && byte < es; byte++)
            clobbered += g->host[e * es + byte] != POISON;
    free(seen);
    r->grad_err[slot] = err;
    r->grad_lowp_err[slot] = low;
    r->grad_max[slot] = big;
    if (bad)
        snprintf(r->why, sizeof r->why, "%s: %lld elements non-finite or not written", name,
                 (long long)bad);
    else if (clobbered)
        snprintf(r->why, sizeof r->why, "%s: %lld bytes outside the view were written", name,
                 (long long)clobbered);
    else if (!lowp && err > 1e-4 * big + 1e-5 * scale)
        snprintf(r->why, sizeof r->why,
                 "%s: f32 error %.3g > 1e-4 x largest %.3g + 1e-5 x terms' magnitude %.3g", name,
                 err, big, scale);
    else if (lowp && err > fmax(2.0 * low + atol, 1e-6 * big))
        snprintf(r->why, sizeof r->why,
                 "%s: error %.3g > 2 x plain low-precision error %.3g + rounding %.3g", name, err,
                 low, atol);
    else
        return 0;
    return -1;
}

/* The float64 gradients of a varlen case, one sequence at a time, into packed arrays (keys past
** seqused_k and sequences without queries keep zero gradients); the bias's gradient, where
** asked, into dbias[0] (exact), [1] (magnitudes) and [2] (plain), at p's strides. */
static void reference_backward_packed(const fjr_problem *p, const packing *pk,
                                      const double *const in[4], double *const out[3],
                                      double *const mag[3], const float *const inf[4],
                                      float *const low[3], fj_dtype dtype, void *const dbias[3])
{
    const int64_t hq = p->heads_q, hkv = p->heads_kv, d = p->head_dim, dv = p->head_dim_v;
    const size_t n[3] = {(size_t)(pk->total_q * hq * d), (size_t)(pk->total_k * hkv * d),
                         (size_t)(pk->total_k * hkv * dv)};
    for (int t = 0; t < 3; t++) {
        memset(out[t], 0, n[t] * sizeof *out[t]);
        if (mag[t])
            memset(mag[t], 0, n[t] * sizeof *mag[t]);
        if (low[t])
            memset(low[t], 0, n[t] * sizeof *low[t]);
    }
    int64_t row_q = 0, row_k = 0;
    for (int64_t b = 0; b < pk->n; b++) {
        fjr_problem s = sequence_problem(p, pk, b);
        const int64_t oq = row_q * hq * d, ok = row_k * hkv * d, ov = row_k * hkv * dv;
        const int64_t og = row_q * hq * dv;
        if (s.seqlen_q > 0 && s.seqlen_k > 0) {
            s.dbias = dbias[0];
            fjr_attention_backward(&s, in[0] + oq, in[1] + ok, in[2] + ov, in[3] + og,
                                   out[0] + oq, out[1] + ok, out[2] + ov);
            s.dbias = dbias[1];
            if (mag[0])
                fjr_attention_backward_magnitude(&s, in[0] + oq, in[1] + ok, in[2] + ov,
                                                 in[3] + og, mag[0] + oq, mag[1] + ok,
                                                 mag[2] + ov);
            s.dbias = dbias[2];
            if (low[0])
                fjr_attention_backward_lowp(&s, dtype, inf[0] + oq, inf[1] + ok, inf[2] + ov,
                                            inf[3] + og, low[0] + oq, low[1] + ok, low[2] + ov);
        }
        row_q += pk->len_q[b];
        row_k += pk->len_k[b];
    }
}

/* The backward of a checked case (dense or packed): a random dout, poisoned dq, dk, dv, one
** call, and each gradient against the float64 reference (criteria as the forward's; f32: within
** 1e-4 of the largest element plus 1e-5 of the terms' magnitude, fjr_attention_backward_magnitude,
** since dP - D cancels: with one key a row's dq is 0 and a float kernel's is rounding). pk: the
** packing of a varlen case, else NULL. */
static fj_status run_backward(fj_context *ctx, const fjh_case *c, const fjr_problem *p,
                              const packing *pk, uint64_t *rng, const fj_attention_desc *desc,
                              const fj_tensor *qt, const fj_tensor *kt, const fj_tensor *vt,
                              const fj_tensor *ot, const fj_tensor *lt,
                              const double *const dense[3], const float *const densef[3],
                              fjh_result *r)
{
    const size_t es = fj_dtype_size(c->dtype);
    const int64_t b = pk ? 1 : c->batch, sq = pk ? pk->total_q : c->seqlen_q;
    const int64_t sk = pk ? pk->total_k : c->seqlen_k;
    htensor dout, g[3];
    geometry(&dout, c->dtype, b, sq, c->heads_q, c->head_dim_v, c->layout);
    geometry(&g[0], c->dtype, b, sq, c->heads_q, c->head_dim, c->layout);
    geometry(&g[1], c->dtype, b, sk, c->heads_kv, c->head_dim, c->layout);
    geometry(&g[2], c->dtype, b, sk, c->heads_kv, c->head_dim_v, c->layout);
    htensor *all[4] = {&dout, &g[0], &g[1], &g[2]};
    for (int i = 0; i < 4; i++) {
        all[i]->host = xmalloc(all[i]->elements * es, "a gradient's host copy");
        memset(all[i]->host, POISON, all[i]->elements * es);
    }
    double *dd = NULL, *ref[3] = {NULL, NULL, NULL}, *mag[3] = {NULL, NULL, NULL};
    float *df = NULL, *low[3] = {NULL, NULL, NULL};
    fill_random(&dout, rng, c->skip_check ? NULL : &dd, &df);
    fj_status st = FJ_OK;
    for (int i = 0; i < 4 && st == FJ_OK; i++)
        st = upload(ctx, all[i]);
    fj_tensor views[4] = {dout.t, g[0].t, g[1].t, g[2].t}; /* packed: [total, heads, dim] */
    for (int i = 0; i < 4 && pk; i++)
        views[i] = packed_view(&all[i]->t);
    /* dbias: the bias's shape with its broadcast dimensions (stride 0 in p) of extent 1. */
    htensor db;
    memset(&db, 0, sizeof db);
    fj_attention_desc with_dbias = *desc;
    int64_t db_ext[3] = {1, 1, 1};
    if (c->dbias && p->bias) {
        /* The bias's extents: packed sequences' as a padded batch of the longest. */
        const int64_t full[3] = {c->batch, c->heads_q, c->seqlen_q}, keys = c->seqlen_k;
        for (int a = 0; a < 3; a++)
            db_ext[a] = p->bias_stride[a] == 0 ? 1 : full[a];
        db.t = (fj_tensor){.dtype = FJ_DTYPE_F32,
                           .ndim = 4,
                           .shape = {db_ext[0], db_ext[1], db_ext[2], keys},
                           .stride = {db_ext[1] * db_ext[2] * keys, db_ext[2] * keys, keys, 1}};
        db.elements = (size_t)(db_ext[0] * db_ext[1] * db_ext[2] * keys);
        db.host = xmalloc(db.elements * 4, "dbias's host copy");
        memset(db.host, POISON, db.elements * 4);
        if (st == FJ_OK)
            st = upload(ctx, &db);
        with_dbias.dbias = &db.t;
    }
    r->bwd_tune.struct_size = sizeof r->bwd_tune;
    if (st == FJ_OK && c->tune)
        st = fj_attention_backward_tune(ctx, &with_dbias, qt, kt, vt, ot, &views[0], lt, &views[1],
                                        &views[2], &views[3], NULL, &r->bwd_tune);
    if (st == FJ_OK)
        st = fj_attention_backward(ctx, &with_dbias, qt, kt, vt, ot, &views[0], lt, &views[1],
                                   &views[2], &views[3], NULL);
    if (st == FJ_OK) {
        fj_call_info info;
        memset(&info, 0, sizeof info);
        info.struct_size = sizeof info;
        if (fj_context_last_call(ctx, &info) == FJ_OK) {
            if (info.kernel_path)
                snprintf(r->bwd_kernel_path, sizeof r->bwd_kernel_path, "%s", info.kernel_path);
            r->bwd_tuned = info.tuned;
        }
        st = fj_synchronize(ctx, NULL);
    }
    for (int i = 0; i < 3 && st == FJ_OK; i++)
        st = fj_memcpy_d2h(ctx, g[i].host, g[i].dev, g[i].elements * es);
    if (st == FJ_OK && db.dev)
        st = fj_memcpy_d2h(ctx, db.host, db.dev, db.elements * 4);
    if (st != FJ_OK) {
        snprintf(r->error, sizeof r->error, "%s", fj_context_last_error(ctx));
        snprintf(r->why, sizeof r->why, "backward: %s: %.200s", fj_status_string(st), r->error);
        r->pass = 0;
    } else if (!c->skip_check) {
        const int64_t n[3] = {b * sq * p->heads_q * p->head_dim,
                              b * sk * p->heads_kv * p->head_dim,
                              b * sk * p->heads_kv * p->head_dim_v};
        for (int i = 0; i < 3; i++) {
            ref[i] = xmalloc((size_t)n[i] * sizeof *ref[i], "the reference's gradients");
            if (c->dtype != FJ_DTYPE_F32)
                low[i] = xmalloc((size_t)n[i] * sizeof *low[i], "the plain gradients");
            else
                mag[i] = xmalloc((size_t)n[i] * sizeof *mag[i], "the gradients' magnitudes");
        }
        fjr_problem pd = *p; /* with the bias's gradient, where asked */
        double *ref_db = NULL, *mag_db = NULL;
        float *low_db = NULL;
        if (db.dev) {
            ref_db = xcalloc(db.elements, sizeof *ref_db, "the reference's dbias");
            if (mag[0])
                mag_db = xcalloc(db.elements, sizeof *mag_db, "dbias's magnitude");
            if (low[0])
                low_db = xcalloc(db.elements, sizeof *low_db, "the plain dbias");
            for (int a = 0; a < 3; a++)
                pd.dbias_stride[a] = db_ext[a] == 1 ? 0 : db.t.stride[a];
        }
        if (pk) {
            const double *const in[4] = {dense[0], dense[1], dense[2], dd};
            const float *const inf[4] = {densef[0], densef[1], densef[2], df};
            void *const db_parts[3] = {ref_db, mag_db, low_db};
            reference_backward_packed(&pd, pk, in, ref, mag, inf, low, c->dtype, db_parts);
        } else {
            pd.dbias = ref_db;
            fjr_attention_backward(&pd, dense[0], dense[1], dense[2], dd, ref[0], ref[1],
                                   ref[2]);
            pd.dbias = mag_db;
            if (mag[0])
                fjr_attention_backward_magnitude(&pd, dense[0], dense[1], dense[2], dd, mag[0],
                                                 mag[1], mag[2]);
            pd.dbias = low_db;
            if (low[0])
                fjr_attention_backward_lowp(&pd, c->dtype, densef[0], densef[1], densef[2], df,
                                            low[0], low[1], low[2]);
        }
        if (db.dev && check_grad(c, "dbias", &db, ref_db, low_db, mag_db, 3, r))
            r->pass = 0;
        free(ref_db);
        free(mag_db);
        free(low_db);
        static const char *const names[3] = {"dq", "dk", "dv"};
        for (int i = 0; i < 3 && r->pass; i++)
            if (check_grad(c, names[i], &g[i], ref[i], low[i], mag[i], i, r))
                r->pass = 0;
    }
    if (st == FJ_OK && c->timing_reps > 0) { /* the backward alone, as the forward is timed */
        double *times = xmalloc((size_t)c->timing_reps * sizeof *times, "timings");
        for (int i = 0; i < c->timing_reps && st == FJ_OK; i++) {
            const double t0 = now_ms();
            st = fj_attention_backward(ctx, &with_dbias, qt, kt, vt, ot, &views[0], lt, &views[1],
                                       &views[2], &views[3], NULL);
            if (st == FJ_OK)
                st = fj_synchronize(ctx, NULL);
            times[i] = now_ms() - t0;
        }
        if (st == FJ_OK) {
            qsort(times, (size_t)c->timing_reps, sizeof *times, cmp_double);
            r->bwd_kernel_ms = times[c->timing_reps / 2];
            /* FlashAttention's count: 2.5 times the forward's products */
            r->bwd_tflops = 2.5 * case_flops(p, pk, NULL) /
                            (r->bwd_kernel_ms * 1e-3) / 1e12;
        }
        free(times);
    }
    release(ctx, &db);
    for (int i = 0; i < 4; i++)
        release(ctx, all[i]);
    for (int i = 0; i < 3; i++) {
        free(ref[i]);
        free(mag[i]);
        free(low[i]);
    }
    free(dd);
    free(df);
    return st;
}

fj_status fjh_run(fj_context *ctx, const fjh_case *c, fjh_result *r)
{
    memset(r, 0, sizeof *r);
    if (c->v_in_k && (c->head_dim_v > c->head_dim || (c->varlen && !c->paged))) {
        r->status = FJ_ERR_INVALID_ARGUMENT;
        snprintf(r->why, sizeof r->why, "v as a view of k needs head_dim_v <= head_dim, dense "
                                        "or paged");
        snprintf(r->error, sizeof r->error, "%s", r->why);
        return r->status;
    }
    r->seed = c->seed;
    if (!r->seed) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        r->seed = ((uint64_t)ts.tv_nsec << 20) ^ (uint64_t)ts.tv_sec ^ ((uint64_t)getpid() << 40);
    }
    uint64_t rng = r->seed;
    fjr_problem p = {.batch = c->batch,
                     .seqlen_q = c->seqlen_q,
                     .seqlen_k = c->seqlen_k,
                     .heads_q = c->heads_q,
                     .heads_kv = c->heads_kv,
                     .head_dim = c->head_dim,
                     .head_dim_v = c->head_dim_v,
                     .softcap = c->desc.softcap,
                     .causal = c->desc.causal,
                     .window_left = c->desc.window_left,
                     .window_right = c->desc.window_right};
    p.scale = c->desc.softmax_scale != 0 ? c->desc.softmax_scale : 1.0 / sqrt((double)c->head_dim);

    /* Variable lengths: the sequences are stored as one batch of total rows (with a paged
    ** cache, the queries: the keys are paged from dense k and v). */
    packing pk;
    memset(&pk, 0, sizeof pk);
    int64_t geo_b = c->batch, geo_sq = c->seqlen_q, geo_kb = c->batch, geo_sk = c->seqlen_k;
    if (c->varlen) {
        make_packing(c, &rng, &pk);
        geo_b = 1;
        geo_sq = pk.total_q;
        if (!c->paged) {
            geo_kb = 1;
            geo_sk = pk.total_k;
        }
    }
    htensor q, k, v, out, lse;
    geometry(&q, c->dtype, geo_b, geo_sq, c->heads_q, c->head_dim, c->layout);
    const fj_dtype kv_dtype = c->kv_fp8 ? (fj_dtype)c->kv_fp8 : c->dtype;
    geometry(&k, kv_dtype, geo_kb, geo_sk, c->heads_kv, c->head_dim, c->layout);
    geometry(&v, kv_dtype, geo_kb, geo_sk, c->heads_kv, c->head_dim_v, c->layout);
    geometry(&out, fjr_out_dtype(c->dtype), geo_b, geo_sq, c->heads_q, c->head_dim_v, c->layout);
    lse_geometry(&lse, geo_b, c->heads_q, geo_sq, c->layout);
    size_t es = fj_dtype_size(out.t.dtype); /* out's elements (bf16 for FP8 inputs) */
    htensor *all[] = {&q, &k, &v, &out, &lse};
    for (int i = 0; i < 5; i++) {
        size_t bytes = all[i]->elements * fj_dtype_size(all[i]->t.dtype);
        all[i]->host = xmalloc(bytes, "a tensor's host copy");
        memset(all[i]->host, POISON, bytes);
    }
    double *qd = NULL, *kd = NULL, *vd = NULL, *ref = NULL, *ref_lse = NULL;
    float *qf = NULL, *kf = NULL, *vf = NULL, *lowp = NULL;
    int dense = !c->skip_check;
    fill_random(&q, &rng, dense ? &qd : NULL, &qf);
    fill_random(&k, &rng, dense ? &kd : NULL, &kf);
    fill_random(&v, &rng, dense ? &vd : NULL, &vf);
    if (c->v_in_k) { /* v's values are k's first dims; the library reads them through k */
        v_from_k(&k, &v);
        if (dense) {
            free(vd);
            free(vf);
            dense_of(&v, &vd, &vf);
        }
    }
    if (c->varlen == 2 && !c->paged) { /* after the reference's copies, which never read these */
        poison_unused_keys(&k, &pk);
        poison_unused_keys(&v, &pk);
    }
    paging pg;
    memset(&pg, 0, sizeof pg);
    if (c->paged > 0)
        make_paging(c, &rng, &k, &v, &pg);
    if (c->paged > 0 && c->varlen) /* the reference's keys: sequence b's at row b * seqlen_k */
        for (int64_t b = 0; b < c->batch; b++) {
            pk.len_k[b] = c->seqlen_k;
            pk.used_k[b] = pg.used[b];
        }
    htensor terms[5]; /* alibi, bias, mask, ranges, blocks */
    memset(terms, 0, sizeof terms);
    make_score_terms(c, &rng, &p, &terms[0], &terms[1], &terms[2], &terms[3], &terms[4]);

    fj_status st = FJ_OK;
    for (int i = 0; i < 5 && st == FJ_OK; i++)
        if (i < 4 || c->with_lse)
            st = upload(ctx, all[i]);
    for (int i = 0; i < 5 && st == FJ_OK; i++)
        if (terms[i].host)
            st = upload(ctx, &terms[i]);
    htensor *packs[] = {&pk.cu_q, &pk.cu_k, &pk.seqused};
    for (int i = 0; i < 3 && st == FJ_OK && c->varlen; i++)
        st = upload(ctx, packs[i]);
    htensor *page_parts[] = {&pg.table, &pg.seqused, &pg.k, &pg.v};
    for (int i = 0; i < 4 && st == FJ_OK && c->paged > 0; i++)
        st = upload(ctx, page_parts[i]);
    if (st == FJ_OK && c->paged > 0 && c->append > 0)
        st = append_tokens(ctx, c, &k, &v, &pg);
    /* What the library sees: the tensors, or their packed views. */
    fj_tensor qt = q.t, kt = k.t, vt = v.t, ot = out.t, lt = lse.t;
    if (c->varlen) {
        qt = packed_view(&q.t);
        kt = packed_view(&k.t);
        vt = packed_view(&v.t);
        ot = packed_view(&out.t);
        lt = packed_view(&lse.t);
    }
    if (c->paged > 0) {
        kt = pg.k.t;
        vt = pg.v.t;
    }
    if (c->v_in_k)
        vt = v_view_of(&kt, c->head_dim_v);
    fj_tensor *lse_t = c->with_lse ? &lt : NULL;
    /* The expressions' arguments go to the device; the reference reads the host copy. */
    fj_attention_desc desc = c->desc;
    if (c->varlen) {
        desc.cu_seqlens_q = &pk.cu_q.t;
        desc.cu_seqlens_k = c->paged ? NULL : &pk.cu_k.t;
        desc.seqused_k = c->varlen == 2 ? &pk.seqused.t : NULL;
        desc.max_seqlen_q = c->seqlen_q;
        desc.max_seqlen_k = c->seqlen_k;
    }
    if (c->paged > 0) {
        desc.page_table = &pg.table.t;
        desc.seqused_k = &pg.seqused.t;
    }
    desc.alibi_slopes = terms[0].host ? &terms[0].t : desc.alibi_slopes;
    desc.bias = terms[1].host ? &terms[1].t : desc.bias;
    desc.mask = terms[2].host ? &terms[2].t : desc.mask;
    desc.mask_ranges = terms[3].host ? &terms[3].t : desc.mask_ranges;
    desc.block_mask = terms[4].host ? &terms[4].t : desc.block_mask;
    void *dev_args = NULL;
    if (st == FJ_OK && c->mod_args && c->mod_args_count > 0) {
        size_t bytes = (size_t)c->mod_args_count * 4;
        st = fj_malloc(ctx, bytes, &dev_args);
        if (st == FJ_OK)
            st = fj_memcpy_h2d(ctx, dev_args, c->mod_args, bytes);
        desc.mod_args = dev_args;
        desc.mod_args_count = c->mod_args_count;
    }
    r->tune.struct_size = sizeof r->tune;
    if (st == FJ_OK && c->tune == 1) {
        st = fj_attention_tune(ctx, &desc, &qt, &kt, &vt, &ot, lse_t, NULL, &r->tune);
        /* Tuning wrote the outputs: poison them again. */
        if (st == FJ_OK)
            st = fj_memcpy_h2d(ctx, out.dev, out.host, out.elements * es);
        if (st == FJ_OK && c->with_lse)
            st = fj_memcpy_h2d(ctx, lse.dev, lse.host, lse.elements * 4);
    }
    if (st == FJ_OK) {
        double t0 = now_ms();
        st = fj_attention_forward(ctx, &desc, &qt, &kt, &vt, &ot, lse_t, NULL);
        if (st == FJ_OK)
            st = fj_synchronize(ctx, NULL);
        r->first_call_ms = now_ms() - t0;
        r->first.struct_size = sizeof r->first;
        fj_context_last_call(ctx, &r->first);
        snprintf(r->variant, sizeof r->variant, "%s", r->first.variant ? r->first.variant : "");
        snprintf(r->kernel_path, sizeof r->kernel_path, "%s",
                 r->first.kernel_path ? r->first.kernel_path : "");
        snprintf(r->launched, sizeof r->launched, "%s",
                 r->first.launched ? r->first.launched : "");
        r->first.variant = r->variant;
        r->first.kernel_path = r->kernel_path;
        r->first.launched = r->launched;
    }
    if (st == FJ_OK)
        st = fj_memcpy_d2h(ctx, out.host, out.dev, out.elements * es);
    if (st == FJ_OK && c->with_lse)
        st = fj_memcpy_d2h(ctx, lse.host, lse.dev, lse.elements * 4);
    if (st != FJ_OK) {
        snprintf(r->error, sizeof r->error, "%s", fj_context_last_error(ctx));
        snprintf(r->why, sizeof r->why, "%s: %.200s", fj_status_string(st), r->error);
        goto out;
    }

    fj__expr *mask_expr = NULL, *score_expr = NULL;
    fj__err parse_err = {{0}};
    if (!c->skip_check && desc.mask_mod)
        fj__expr_parse("mask_mod", desc.mask_mod, 0, &mask_expr, &parse_err);
    if (!c->skip_check && desc.score_mod)
        fj__expr_parse("score_mod", desc.score_mod, 1, &score_expr, &parse_err);
    p.mask_mod = mask_expr;
    p.score_mod = score_expr;
    p.mod_args = c->mod_args;
    p.mod_args_count = c->mod_args_count;
    if (!c->skip_check) {
        /* check() reads packed outputs as one batch of total_q rows. */
        fjr_problem pc = p;
        if (c->varlen) {
            pc.batch = 1;
            pc.seqlen_q = pk.total_q;
        }
        size_t nout = (size_t)(pc.batch * pc.seqlen_q * pc.heads_q * pc.head_dim_v);
        ref = xmalloc(nout * sizeof *ref, "the reference's output");
        ref_lse = xmalloc((size_t)(pc.batch * pc.heads_q * pc.seqlen_q) * sizeof *ref_lse,
                          "the reference's lse");
        if (c->dtype != FJ_DTYPE_F32)
            lowp = xmalloc(nout * sizeof *lowp, "the low-precision reference");
        if (c->varlen) {
            reference_packed(&p, &pk, qd, kd, vd, qf, kf, vf, c->dtype, ref, ref_lse, lowp);
        } else if (c->paged > 0) {
            reference_paged(&p, pg.used, qd, kd, vd, qf, kf, vf, c->dtype, ref, ref_lse, lowp);
        } else {
            fjr_attention(&p, qd, kd, vd, ref, ref_lse);
            if (lowp)
                fjr_attention_lowp(&p, c->dtype, qf, kf, vf, lowp);
        }
        check(c, &pc, &out, c->with_lse ? &lse : NULL, ref, ref_lse, lowp, r);
        if (c->backward && r->pass) {
            if (!c->with_lse || c->paged || c->v_in_k) {
                r->pass = 0;
                snprintf(r->why, sizeof r->why,
                         "the backward check takes dense or packed cases with lse");
            } else {
                const double *const dense3[3] = {qd, kd, vd};
                const float *const densef3[3] = {qf, kf, vf};
                st = run_backward(ctx, c, &p, c->varlen ? &pk : NULL, &rng, &desc, &qt, &kt, &vt,
                                  &ot, lse_t, dense3, densef3, r);
            }
        }
    } else {
        r->pass = 1;
        /* Unchecked (tuning, timing): the backward runs on its random dout all the same. */
        if (c->backward && st == FJ_OK)
            st = run_backward(ctx, c, &p, c->varlen ? &pk : NULL, &rng, &desc, &qt, &kt, &vt, &ot,
                              lse_t, NULL, NULL, r);
    }

    if (c->timing_reps > 0) {
        double *times = xmalloc((size_t)c->timing_reps * sizeof *times, "timings");
        for (int i = 0; i < c->timing_reps && st == FJ_OK; i++) {
            double t0 = now_ms();
            st = fj_attention_forward(ctx, &desc, &qt, &kt, &vt, &ot, lse_t, NULL);
            if (st == FJ_OK)
                st = fj_synchronize(ctx, NULL);
            times[i] = now_ms() - t0;
        }
        if (st == FJ_OK) {
            qsort(times, (size_t)c->timing_reps, sizeof *times, cmp_double);
            r->kernel_ms = times[c->timing_reps / 2];
            r->tflops = case_flops(&p, c->varlen ? &pk : NULL, c->paged > 0 ? &pg : NULL) /
                        (r->kernel_ms * 1e-3) / 1e12;
        }
        free(times);
    }
    fj__expr_free(mask_expr);
    fj__expr_free(score_expr);
out:
    if (dev_args)
        fj_free(ctx, dev_args);
    r->status = st;
    for (int i = 0; i < 5; i++)
        release(ctx, all[i]);
    for (int i = 0; i < 5; i++)
        release(ctx, &terms[i]);
    for (int i = 0; i < 3; i++)
        release(ctx, packs[i]);
    for (int i = 0; i < 4; i++)
        release(ctx, page_parts[i]);
    free(pg.used);
    free(pg.copied);
    free(pk.len_q);
    free(pk.len_k);
    free(pk.used_k);
    free(qd);
    free(kd);
    free(vd);
    free(qf);
    free(kf);
    free(vf);
    free(ref);
    free(ref_lse);
    free(lowp);
    return st;
}
