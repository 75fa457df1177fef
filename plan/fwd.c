/* The forward plan and its parameter blocks: [dequantise FP8 q, k, v] [transpose FP8 v] [zero
** the tile counter] [classify the element masks' blocks] forward, and how each step's block is
** filled from a request. */
#include <string.h>

#include "plan.h"

#define LOG2E 1.4426950408889634
#define CLS 128             /* the block classifier's block edge (attn_classify.lua) */
#define CLS_THREADS 256     /* its work-group */
#define DEQUANT_THREADS 128 /* fp8_dequant.lua's work-group */
#define TRANSPOSE_V_THREADS 256 /* fp8_transpose_v.cu.lua's block ... */
#define TRANSPOSE_V_KEYS 64     /* ... and its keys (its variant's tile_n) */

/* The rows, heads and head dim of q, k and v (t = FJ__T_Q, _K, _V) of a dense request. */
static void tensor_dims(int t, int64_t seqlen_q, int64_t seqlen_k, int64_t heads_q,
                        int64_t heads_kv, int64_t head_dim, int64_t head_dim_v, int64_t out[3])
{
    out[0] = t == FJ__T_Q ? seqlen_q : seqlen_k;
    out[1] = t == FJ__T_Q ? heads_q : heads_kv;
    out[2] = t == FJ__T_V ? head_dim_v : head_dim;
}

/* A step that rewrites FP8 inputs (of type in) for forward v: a kernel of `family` with
** `threads` work-items a work-group, reading in and writing out's dtype where it converts. */
static fj__step *add_input_step(fj__plan *plan, int family, const fj__variant *v, int32_t in,
                                int threads)
{
    fj__step *s = fj__plan_add_step(plan, FJ__STEP_KERNEL);
    fj__variant *sv = &s->variant;
    sv->family = family;
    sv->backend = v->backend;
    sv->path = FJ__PATH_SIMT;
    sv->q_dtype = sv->kv_dtype = in;
    sv->out_dtype = v->out_dtype;
    sv->acc_dtype = FJ_DTYPE_F32;
    sv->threads = threads;
    s->block[0] = (uint32_t)threads;
    return s;
}

/* FP8 q, k and v read through 16-bit copies (v->dequant): a step each, into workspaces
** [batch, rows, heads, dim] of out's dtype, before anything else. */
static void add_dequant_steps(const fj__features *f, const fj__variant *v, fj__plan *plan)
{
    for (int t = FJ__T_Q; t <= FJ__T_V; t++) {
        int64_t d[3];
        tensor_dims(t, f->seqlen_q, f->seqlen_k, f->heads_q, f->heads_kv, f->head_dim,
                    f->head_dim_v, d);
        plan->fwd.dequant[t] = fj__plan_add_workspace(
            plan, (size_t)(f->batch * d[0] * d[1] * d[2]) * fj_dtype_size((fj_dtype)v->out_dtype));
        fj__step *s = add_input_step(plan, FJ__FAMILY_DEQUANT, v, f->q_dtype, DEQUANT_THREADS);
        s->grid[0] = (uint32_t)d[0]; /* (step t) */
        s->grid[1] = (uint32_t)f->batch;
    }
}

/* FP8 v transposed for Hopper's FP8 forward (v->v_transposed): a step into a workspace
** [batch, heads_kv, head_dim_v, keys] (keys: seqlen_k rounded up to 16), ahead of the forward. */
static void add_transpose_v_step(const fj__features *f, const fj__variant *v, fj__plan *plan)
{
    plan->fwd.v_keys = (f->seqlen_k + 15) / 16 * 16;
    plan->fwd.v_transposed = fj__plan_add_workspace(
        plan, (size_t)(f->batch * f->heads_kv * f->head_dim_v * plan->fwd.v_keys));
    fj__step *s =
        add_input_step(plan, FJ__FAMILY_TRANSPOSE_V, v, v->kv_dtype, TRANSPOSE_V_THREADS);
    s->variant.tile_n = TRANSPOSE_V_KEYS;
    s->grid[0] = (uint32_t)((plan->fwd.v_keys + TRANSPOSE_V_KEYS - 1) / TRANSPOSE_V_KEYS);
    s->grid[1] = (uint32_t)f->heads_kv;
    s->grid[2] = (uint32_t)f->batch;
}

void fj__classify_variant(const fj__variant *v, fj__variant *cv)
{
    memset(cv, 0, sizeof *cv);
    cv->family = FJ__FAMILY_CLASSIFY;
    cv->backend = v->backend;
    cv->path = FJ__PATH_SIMT;
    cv->q_dtype = v->q_dtype;
    cv->kv_dtype = v->kv_dtype;
    cv->out_dtype = v->out_dtype;
    cv->acc_dtype = v->acc_dtype;
    cv->tile_m = cv->tile_n = CLS;
    cv->threads = CLS_THREADS;
    cv->mask_mod = v->mask_mod;
    cv->mask_tensor = v->mask_tensor;
    cv->mask_ranges = v->mask_ranges;
}

/* Adds the classifier's step for forward variant v's masks over f's shape, for cb x ch (batch,
** head) pairs of classes (ch of them per batch), once the grid allows them. */
static fj_status add_classify_step(const fj__features *f, const fj__variant *v, int64_t cb,
                                   int64_t ch, fj__plan *plan, fj__step **out, fj__err *err)
{
    const int64_t qb = (f->seqlen_q + CLS - 1) / CLS, kb = (f->seqlen_k + CLS - 1) / CLS;
    if (qb > 65535 || cb * ch > 65535)
        return fj__fail(err, FJ_ERR_UNSUPPORTED,
                        "masks of %lld query blocks for %lld (batch, head) pairs: the block "
                        "classifier's grid allows 65535 of each",
                        (long long)qb, (long long)(cb * ch));
    fj__step *s = fj__plan_add_step(plan, FJ__STEP_KERNEL);
    fj__classify_variant(v, &s->variant);
    s->grid[0] = (uint32_t)kb;
    s->grid[1] = (uint32_t)qb;
    s->grid[2] = (uint32_t)(cb * ch);
    s->block[0] = CLS_THREADS;
    plan->fwd.cls_heads = (int32_t)ch;
    *out = s;
    return FJ_OK;
}

fj_status fj__plan_classes(const fj__features *f, const fj__variant *v, fj__plan *plan,
                           fj__err *err)
{
    const int64_t cb = f->classes_by_b ? f->batch : 1, ch = f->classes_by_h ? f->heads_q : 1;
    const int64_t qb = (f->seqlen_q + CLS - 1) / CLS, kb = (f->seqlen_k + CLS - 1) / CLS;
    fj__step *s = NULL;
    fj_status st = add_classify_step(f, v, cb, ch, plan, &s, err);
    if (st != FJ_OK)
        return st;
    const int ws = fj__plan_add_workspace(plan, (size_t)(cb * ch * qb * kb) * sizeof(int32_t));
    plan->fwd.classes = ws;
    plan->fwd.cls_stride[0] = f->classes_by_b ? ch * qb * kb : 0;
    plan->fwd.cls_stride[1] = f->classes_by_h ? qb * kb : 0;
    plan->fwd.cls_stride[2] = kb;
    /* A mask_mod alone, reading no mod_args, is a pure function of the shape: its classes are
    ** computed once and reused while the workspace holds them. Tensors and mod_args may change
    ** between calls: classified every time. */
    fj__workspace *w = &plan->workspaces[ws];
    w->memo = f->mask_mod && !f->mask && !f->ranges && !f->mask_mod_reads_args;
    const int64_t key[6] = {(int64_t)(uintptr_t)f->mask_mod, f->seqlen_q, f->seqlen_k, cb, ch, kb};
    memcpy(w->memo_key, key, sizeof key);
    s->skip_if_memo = ws;
    return FJ_OK;
}

fj_status fj__plan_block_mask(const fj__features *f, const fj_device_info *dev,
                              const int64_t extent[2], const int64_t stride[3], fj__plan *plan,
                              fj__err *err)
{
    memset(plan, 0, sizeof *plan);
    plan->kind = FJ__PLAN_FORWARD;
    plan->fwd.classes = plan->fwd.counter = -1;
    static const char *const by[2] = {"batch", "head"};
    const int differs[2] = {f->classes_by_b, f->classes_by_h};
    const int64_t full[2] = {f->batch, f->heads_q};
    for (int a = 0; a < 2; a++)
        if (differs[a] && extent[a] != full[a])
            return fj__fail(err, FJ_ERR_INVALID_ARGUMENT,
                            "classes.shape[%d] = %lld, but the masks differ by %s: expected %lld",
                            a, (long long)extent[a], by[a], (long long)full[a]);
    /* Packed sequences are classified as the padded batch of the longest: a block's pairs of a
    ** shorter sequence are some of the ones classified, so its class holds for them, unless
    ** the mask reads the sequence's own lengths. */
    if (f->varlen && f->mask_mod && (strstr(f->mask_mod, "FJ_SQ") || strstr(f->mask_mod, "FJ_SK")))
        return fj__fail(err, FJ_ERR_UNSUPPORTED,
                        "desc.mask_mod reads sq or sk: packed sequences' block classes are built "
                        "for the longest, whose lengths those are not");
    fj__variant v;
    fj__variant_from_features(&v, FJ__FAMILY_FWD, f, dev);
    fj__variant_score_fields(&v, f);
    memcpy(plan->fwd.cls_stride, stride, sizeof plan->fwd.cls_stride);
    fj__step *s = NULL;
    plan->main_step = 0;
    return add_classify_step(f, &v, extent[0], extent[1], plan, &s, err);
}

fj_status fj__plan_forward(const fj__features *f, const fj_device_info *dev, const fj__variant *v,
                           fj__plan *plan, fj__err *err)
{
    memset(plan, 0, sizeof *plan);
    plan->fwd.classes = plan->fwd.counter = -1;
    plan->fwd.dequant[0] = plan->fwd.dequant[1] = plan->fwd.dequant[2] = -1;
    plan->fwd.v_transposed = -1;
    if (v->dequant && fj__dtype_fp8((fj_dtype)f->q_dtype))
        add_dequant_steps(f, v, plan);
    if (v->v_transposed)
        add_transpose_v_step(f, v, plan);
    if (v->persistent == 2 && v->path == FJ__PATH_WGMMA) {
        /* The dynamic schedule's tile counter, zero at the launch. */
        plan->fwd.counter = fj__plan_add_workspace(plan, sizeof(int32_t));
        fj__plan_add_step(plan, FJ__STEP_MEMSET)->workspace = plan->fwd.counter;
    }
    /* Element masks on the Hopper kernel: block classes first, read as its block_mask. */
    if (v->path == FJ__PATH_WGMMA && !v->block_mask && fj__variant_element_masks(v)) {
        fj_status st = fj__plan_classes(f, v, plan, err);
        if (st != FJ_OK)
            return st;
    }
    plan->main_step = plan->nsteps;
    fj__step *s = fj__plan_add_step(plan, FJ__STEP_KERNEL);
    s->variant = *v;
    s->block[0] = (uint32_t)v->threads;
    s->shared_bytes = fj__variant_dynamic_shared_bytes(v);
    const uint64_t m_blocks = (uint64_t)((f->seqlen_q + v->tile_m - 1) / v->tile_m);
    if (v->path != FJ__PATH_WGMMA) { /* a block a query tile (and value slice) */
        s->grid[0] = (uint32_t)(m_blocks * (uint64_t)fj__variant_dv_slices(v));
        s->grid[1] = (uint32_t)f->heads_q;
        s->grid[2] = (uint32_t)f->batch;
        return FJ_OK;
    }
    /* Work tiles in one dimension; persistent: no more blocks than fit the SMs at once (one or
    ** two each). */
    const uint64_t work = m_blocks * (uint64_t)f->heads_q * (uint64_t)f->batch *
                          (uint64_t)fj__variant_dv_slices(v);
    const uint64_t sms = dev->compute_units > 0
                             ? (uint64_t)dev->compute_units * (v->ctas_per_sm ? v->ctas_per_sm : 1)
                             : work;
    s->grid[0] = (uint32_t)(v->persistent && sms < work ? sms : work);
    if (v->persistent == 3 && sms < work && sms <= UINT32_MAX)
        s->grid[0] = fj__zigzag_grid(f, v, (uint32_t)sms);
    return FJ_OK;
}

/* ---- parameter blocks --------------------------------------------------------------------- */

static void fill_mask(const fj__problem *p, fj__mask_params *m)
{
    m->mod_args = p->mod_args;
    m->mod_args_count = (int32_t)p->mod_args_count;
    m->alibi = p->alibi ? p->alibi->data : NULL;
    m->alibi_sb = p->alibi_stride_b;
    m->bias = p->bias ? p->bias->data : NULL;
    m->bias_sb = p->bias_stride[0];
    m->bias_sh = p->bias_stride[1];
    m->bias_ss = p->bias_stride[2];
    m->mask = p->mask ? p->mask->data : NULL;
    m->mask_sb = p->mask_stride[0];
    m->mask_sh = p->mask_stride[1];
    m->mask_ss = p->mask_stride[2];
    m->mask_ranges = p->mask_ranges ? p->mask_ranges->data : NULL;
    m->ranges_sb = p->ranges_stride[0];
    m->ranges_sh = p->ranges_stride[1];
    m->ranges_sk = p->ranges_stride[2];
    m->block_mask = p->block_mask ? p->block_mask->data : NULL;
    m->blocks_sb = p->blocks_stride[0];
    m->blocks_sh = p->blocks_stride[1];
    m->blocks_sq = p->blocks_stride[2];
}

void fj__fill_fwd_params(const fj__plan *plan, const fj__problem *p, void *const *ws,
                         fj__fwd_params *F)
{
    F->q = p->q->data;
    F->k = p->k->data;
    F->v = p->v->data;
    F->out = p->out->data;
    F->lse = p->lse ? p->lse->data : NULL;
    F->cu_seqlens_q = p->cu_seqlens_q ? p->cu_seqlens_q->data : NULL;
    F->cu_seqlens_k = p->cu_seqlens_k ? p->cu_seqlens_k->data : NULL;
    F->seqused_k = p->seqused_k ? p->seqused_k->data : NULL;
    int64_t *strides[4] = {&F->q_sb, &F->k_sb, &F->v_sb, &F->o_sb};
    for (int t = 0; t < 4; t++) {
        strides[t][0] = p->strides[t][0];
        strides[t][1] = p->strides[t][1];
        strides[t][2] = p->strides[t][2];
    }
    F->l_sb = p->lse_stride[0];
    F->l_sh = p->lse_stride[1];
    F->l_ss = p->lse_stride[2];
    const void **descale[3] = {&F->q_descale, &F->k_descale, &F->v_descale};
    int64_t *descale_strides[3] = {&F->qd_sb, &F->kd_sb, &F->vd_sb};
    for (int t = 0; t < 3; t++) {
        *descale[t] = p->descale[t] ? p->descale[t]->data : NULL;
        descale_strides[t][0] = p->descale_stride[t][0];
        descale_strides[t][1] = p->descale_stride[t][1];
    }
    fill_mask(p, &F->mask);
    if (plan->fwd.classes >= 0) { /* the classifier's classes stand in for a block_mask */
        F->mask.block_mask = ws[plan->fwd.classes];
        F->mask.blocks_sb = plan->fwd.cls_stride[0];
        F->mask.blocks_sh = plan->fwd.cls_stride[1];
        F->mask.blocks_sq = plan->fwd.cls_stride[2];
    }
    /* Without soft-capping q.k is scaled straight to log2 units; with it, to the tanh argument,
    ** and the cap carries the log2 factor. */
    if (p->softcap > 0.0f) {
        F->score_mul = (float)((double)p->scale / p->softcap);
        F->cap_mul = (float)((double)p->softcap * LOG2E);
    } else {
        F->score_mul = (float)((double)p->scale * LOG2E);
        F->cap_mul = 0.0f;
    }
    F->batches = (int32_t)p->batch;
    F->seqlen_q = (int32_t)p->seqlen_q;
    F->seqlen_k = (int32_t)p->seqlen_k;
    F->heads_q = (int32_t)p->heads_q;
    F->heads_kv = (int32_t)p->heads_kv;
    F->head_dim = (int32_t)p->head_dim;
    F->head_dim_v = (int32_t)p->head_dim_v;
    F->window_left = p->window_left;
    F->window_right = p->window_right;
    F->total_q = p->cu_seqlens_q ? (int32_t)p->q->shape[0] : 0;
    F->total_k = p->cu_seqlens_k ? (int32_t)p->k->shape[0] : 0; /* (a paged cache: no offsets) */
}

void fj__tensor_map_of(const fj_tensor *packed_or_4d, uint32_t rows, fj__tensor_map_desc *d,
                       int32_t *perm)
{
    const fj_tensor t4 = fj__tensor_4d(packed_or_4d);
    const fj_tensor *t = &t4;
    const uint64_t es = fj_dtype_size(t->dtype);
    int order[3] = {0, 1, 2}; /* batch, seqlen, heads */
    for (int i = 1; i < 3; i++)
        for (int j = i; j > 0; j--) {
            const int a = order[j - 1], b = order[j];
            const int64_t ka = t->shape[a] == 1 ? INT64_MAX : t->stride[a];
            const int64_t kb = t->shape[b] == 1 ? INT64_MAX : t->stride[b];
            if (kb >= ka)
                break;
            order[j - 1] = b;
            order[j] = a;
        }
    memset(d, 0, sizeof *d); /* compared with memcmp: no stray padding bytes */
    d->base = t->data;
    d->dtype = t->dtype;
    d->dims[0] = (uint64_t)t->shape[3];
    d->box[0] = (uint32_t)(128 / es);
    uint64_t extent = ((uint64_t)t->shape[3] * es + 15) / 16 * 16; /* bytes spanned so far */
    *perm = 0;
    for (int slot = 0; slot < 3; slot++) {
        const int dim = order[slot];
        const uint64_t n = (uint64_t)t->shape[dim];
        const uint64_t stride = n == 1 ? extent : (uint64_t)t->stride[dim] * es;
        d->dims[1 + slot] = n;
        d->strides[slot] = stride;
        d->box[1 + slot] = dim == 1 ? rows : 1;
        if (stride * n > extent)
            extent = stride * n;
        if (dim == 1)
            *perm |= slot;
        else if (dim == 2)
            *perm |= slot << 2;
    }
}

/* The TMA view of the bias [batch, heads, sq, sk] (broadcast dimensions of size 1) for boxes
** of 128 bytes of keys by `rows` query rows (see bias_tma in problem.c). */
static void bias_map_of(const fj__problem *p, uint32_t rows, fj__tensor_map_desc *d)
{
    const uint64_t es = fj_dtype_size(p->bias->dtype);
    const int64_t *s = p->bias_stride;
    memset(d, 0, sizeof *d);
    d->base = p->bias->data;
    d->dtype = p->bias->dtype;
    d->dims[0] = (uint64_t)p->seqlen_k;
    d->dims[1] = (uint64_t)p->seqlen_q;
    d->dims[2] = s[1] ? (uint64_t)p->heads_q : 1;
    d->dims[3] = s[0] ? (uint64_t)p->batch : 1;
    d->strides[0] = (uint64_t)s[2] * es;
    d->strides[1] = s[1] ? (uint64_t)s[1] * es : d->strides[0] * d->dims[1];
    d->strides[2] = s[0] ? (uint64_t)s[0] * es : d->strides[1] * d->dims[2];
    d->box[0] = (uint32_t)(128 / es);
    d->box[1] = rows;
    d->box[2] = d->box[3] = 1;
}

/* The transposed values of p in their workspace (add_transpose_v_step), as a tensor whose "rows"
** are value columns and whose "head dim" is the keys: [batch, head_dim_v, heads_kv, keys] at the
** workspace's strides. */
static fj_tensor transposed_v(const fj__plan *plan, const fj__problem *p, void *const *ws)
{
    const int64_t keys = plan->fwd.v_keys, per_head = p->head_dim_v * keys;
    return (fj_tensor){.data = ws[plan->fwd.v_transposed],
                       .dtype = p->kv_dtype,
                       .ndim = 4,
                       .shape = {p->batch, p->head_dim_v, p->heads_kv, keys},
                       .stride = {p->heads_kv * per_head, keys, per_head, 1}};
}

static void fill_transpose_v(const fj__plan *plan, const fj__problem *p, void *const *ws,
                             fj__transpose_v_params *T)
{
    const fj_tensor vt = transposed_v(plan, p, ws);
    T->src = p->v->data;
    T->dst = vt.data;
    T->s_sb = p->strides[FJ__T_V][0];
    T->s_ss = p->strides[FJ__T_V][1];
    T->s_sh = p->strides[FJ__T_V][2];
    T->o_sb = vt.stride[0];
    T->o_sh = vt.stride[2];
    T->seqlen_k = (int32_t)p->seqlen_k;
    T->keys = (int32_t)plan->fwd.v_keys;
    T->dim = (int32_t)p->head_dim_v;
}

static fj_status fill_fwd_tma(const fj__plan *plan, const fj__variant *v, const fj__problem *p,
                              void *const *ws, fj__tmap_fn tmap, void *ud, fj__fwd_tma_params *P)
{
    fj__fill_fwd_params(plan, p, ws, &P->fwd);
    const fj_tensor vt = v->v_transposed ? transposed_v(plan, p, ws) : (fj_tensor){0};
    const fj_tensor *t[3] = {p->q, p->k, v->v_transposed ? &vt : p->v};
    /* A paged cache's pages are the maps' batches, copied page_rows keys at a time; transposed
    ** values all value columns of 128 keys at a time. */
    const uint32_t key_rows = (uint32_t)(v->paged ? v->page_rows : v->tile_n);
    const uint32_t rows[3] = {(uint32_t)v->tile_m, key_rows,
                              v->v_transposed ? (uint32_t)v->head_dim_v_pad : key_rows};
    fj__tensor_map *maps[3] = {&P->tm_q, &P->tm_k, &P->tm_v};
    int32_t *perms[3] = {&P->perm_q, &P->perm_k, &P->perm_v};
    fj_status st = FJ_OK;
    for (int i = 0; i < 3 && st == FJ_OK; i++) {
        fj__tensor_map_desc d;
        fj__tensor_map_of(t[i], rows[i], &d, perms[i]);
        st = tmap(ud, FJ__MAP_Q + i, &d, maps[i]);
    }
    if (st == FJ_OK && v->bias_tma) {
        fj__tensor_map_desc d;
        bias_map_of(p, (uint32_t)v->tile_m, &d);
        st = tmap(ud, FJ__MAP_BIAS, &d, &P->tm_bias);
    }
    P->tile_counter = plan->fwd.counter >= 0 ? ws[plan->fwd.counter] : NULL;
    if (v->paged)
        FJ__FILL_PAGE_FIELDS(P, p);
    return st;
}

static void fill_classify(const fj__plan *plan, const fj__problem *p, void *const *ws,
                          fj__classify_params *C)
{
    /* Into the forward's workspace, or (fj_block_mask_build) the request's block_mask. */
    C->classes = plan->fwd.classes >= 0 ? ws[plan->fwd.classes] : p->block_mask->data;
    C->cls_sb = plan->fwd.cls_stride[0];
    C->cls_sh = plan->fwd.cls_stride[1];
    C->cls_sq = plan->fwd.cls_stride[2];
    fill_mask(p, &C->mask);
    C->seqlen_q = (int32_t)p->seqlen_q;
    C->seqlen_k = (int32_t)p->seqlen_k;
    C->cls_heads = plan->fwd.cls_heads;
}

/* The 16-bit copy of tensor t (q, k, v) of p in its workspace: contiguous [b, s, h, d] of out's
** dtype (add_dequant_steps sizes it). */
static fj_tensor dequant_copy(const fj__plan *plan, const fj__problem *p, void *const *ws, int t)
{
    int64_t d[3];
    tensor_dims(t, p->seqlen_q, p->seqlen_k, p->heads_q, p->heads_kv, p->head_dim,
                p->head_dim_v, d);
    return (fj_tensor){.data = ws[plan->fwd.dequant[t]],
                       .dtype = p->out_dtype,
                       .ndim = 4,
                       .shape = {p->batch, d[0], d[1], d[2]},
                       .stride = {d[0] * d[1] * d[2], d[1] * d[2], d[2], 1}};
}

/* Step t's block: tensor t (q, k, v) into its 16-bit copy. k's descale factors go into q's copy
** with q's (the scores see their product), so k's copy is exact and only q's and v's round. */
static void fill_dequant(const fj__plan *plan, int t, const fj__problem *p, void *const *ws,
                         fj__dequant_params *D)
{
    const fj_tensor *src[3] = {p->q, p->k, p->v};
    const fj_tensor copy = dequant_copy(plan, p, ws, t);
    D->src = src[t]->data;
    D->dst = copy.data;
    D->o_sb = copy.stride[0];
    D->o_ss = copy.stride[1];
    D->o_sh = copy.stride[2];
    const int own = t != FJ__T_K; /* (k's factors: in q's copy) */
    D->descale = own && p->descale[t] ? p->descale[t]->data : NULL;
    D->d_sb = p->descale_stride[t][0];
    D->d_sh = p->descale_stride[t][1];
    if (t == FJ__T_Q && p->descale[FJ__T_K]) {
        D->descale2 = p->descale[FJ__T_K]->data;
        D->d2_sb = p->descale_stride[FJ__T_K][0];
        D->d2_sh = p->descale_stride[FJ__T_K][1];
    }
    D->s_sb = p->strides[t][0];
    D->s_ss = p->strides[t][1];
    D->s_sh = p->strides[t][2];
    D->heads = (int32_t)copy.shape[2];
    D->dim = (int32_t)copy.shape[3];
    D->group = (int32_t)(t == FJ__T_Q ? p->heads_q / p->heads_kv : 1); /* descale by kv head */
    int64_t whole = (uintptr_t)D->src % 16 == 0 && (uintptr_t)D->dst % 16 == 0 && D->dim % 16 == 0;
    const int64_t strides[6] = {D->s_sb, D->s_ss, D->s_sh, D->o_sb, D->o_ss, D->o_sh};
    for (int j = 0; j < 6; j++)
        whole &= strides[j] % 16 == 0;
    D->chunks = (int32_t)whole;
}

/* The request as the 16-bit forward after the dequantising steps reads it: q, k and v are the
** contiguous copies in the workspaces (t holds their tensors), with no descale factors. */
static void dequantised(const fj__plan *plan, const fj__problem *p, void *const *ws,
                        fj__problem *pd, fj_tensor t[3])
{
    *pd = *p;
    const fj_tensor **dst[3] = {&pd->q, &pd->k, &pd->v};
    for (int i = FJ__T_Q; i <= FJ__T_V; i++) {
        t[i] = dequant_copy(plan, p, ws, i);
        *dst[i] = &t[i];
        for (int j = 0; j < 3; j++)
            pd->strides[i][j] = t[i].stride[j];
        pd->descale[i] = NULL;
        pd->descale_stride[i][0] = pd->descale_stride[i][1] = 0;
    }
    pd->q_dtype = pd->kv_dtype = p->out_dtype;
}

fj_status fj__fwd_fill(const fj__plan *plan, int i, const fj__problem *p, void *const *ws,
                       fj__tmap_fn tmap, void *tmap_ud, void *params)
{
    const fj__variant *v = &plan->steps[i].variant;
    if (v->family == FJ__FAMILY_DEQUANT) {
        fill_dequant(plan, i, p, ws, params); /* (steps 0-2: q, k, v) */
        return FJ_OK;
    }
    if (v->family == FJ__FAMILY_TRANSPOSE_V) {
        fill_transpose_v(plan, p, ws, params);
        return FJ_OK;
    }
    fj__problem pd;
    fj_tensor copies[3];
    if (plan->steps[plan->main_step].variant.dequant) { /* the main step reads the copies */
        dequantised(plan, p, ws, &pd, copies);
        p = &pd;
    }
    if (plan->steps[plan->main_step].variant.family == FJ__FAMILY_DECODE)
        return fj__decode_fill(plan, i, p, ws, tmap, tmap_ud, params);
    if (v->family == FJ__FAMILY_CLASSIFY) {
        fill_classify(plan, p, ws, params);
        return FJ_OK;
    }
    if (v->path == FJ__PATH_WGMMA)
        return fill_fwd_tma(plan, v, p, ws, tmap, tmap_ud, params);
    fj__fill_fwd_params(plan, p, ws, params);
    return FJ_OK;
}
