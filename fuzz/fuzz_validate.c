/* libFuzzer target: a request's validation and planning, as fj_attention_forward does them before
** anything runs (runtime/validate.c, the expressions, features, the heuristic, the plan, the
** kernels' keys), for a described Hopper GPU and an OpenCL device; and a merge's, from the same
** tensors (fj_attention_merge). The bytes choose every field
** of the descriptor and of up to 15 tensors, the struct size, the expressions and a tile
** config. No memory behind a tensor is touched: data pointers only matter for their alignment
** and where they lie relative to each other. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_input.h"
#include "../runtime/build.h"
#include "../runtime/context.h"

/* Tensor i's data lies at (i + 1) << 32 (never dereferenced: nothing here touches memory), plus
** a byte's offset, aligned or not; or, by the byte's top bits, at the previous tensor's address
** (in-place merges and overlaps), or NULL. */
static void fill_tensor(fuzz_input *in, fj_tensor *t, int i)
{
    const uint8_t where = (uint8_t)fuzz_bits(in, 1);
    uintptr_t base = ((uintptr_t)(i + 1) << 32) + (where & 0x3f) * 4;
    if ((where >> 6) == 3 && i > 0)
        base = (uintptr_t)t[-1].data;
    t->data = (void *)base;
    if ((fuzz_bits(in, 1) & 0x1f) == 0)
        t->data = NULL;
    t->dtype = (fj_dtype)(fuzz_bits(in, 1) % 9);
    t->ndim = (int32_t)(fuzz_bits(in, 1) % 6);
    for (int d = 0; d < 4; d++) {
        t->shape[d] = fuzz_int(in);
        t->stride[d] = fuzz_int(in);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fuzz_input in = {.data = data, .size = size};
    fj_tensor t[15]; /* q k v out lse alibi bias mask cu_q cu_k used ranges blocks, pages, a
                     ** descale */
    memset(t, 0, sizeof t);
    for (int i = 0; i < 13; i++)
        fill_tensor(&in, &t[i], i);
    uint32_t present = (uint32_t)fuzz_bits(&in, 2); /* which optional tensors are given */

    fj_attention_desc d;
    fj_attention_desc_init(&d);
    uint8_t size_pick = (uint8_t)fuzz_bits(&in, 1);
    if (size_pick >= 0xe0) /* any struct size, field ends and field middles alike */
        d.struct_size = (size_t)fuzz_bits(&in, 2) % (sizeof d + 16);
    uint32_t scale_bits = (uint32_t)fuzz_bits(&in, 4), cap_bits = (uint32_t)fuzz_bits(&in, 4);
    if (fuzz_bits(&in, 1) & 1)
        memcpy(&d.softmax_scale, &scale_bits, 4);
    if (fuzz_bits(&in, 1) & 1)
        memcpy(&d.softcap, &cap_bits, 4);
    d.causal = (int32_t)fuzz_int(&in);
    d.window_left = (int32_t)((uint64_t)fuzz_int(&in) - 2); /* -2 .. 253 from one byte */
    d.window_right = (int32_t)((uint64_t)fuzz_int(&in) - 2);
    d.max_seqlen_q = fuzz_int(&in);
    d.max_seqlen_k = fuzz_int(&in);
    d.mod_args_count = (int64_t)((uint64_t)fuzz_int(&in) - 1);
    const int has_args = fuzz_bits(&in, 1) & 1;
    const size_t args_offset = fuzz_bits(&in, 1) & 7;
    d.mod_args = has_args ? (const void *)((uintptr_t)1 << 40 | args_offset) : NULL;
    const fj_tensor **optional[] = {&d.alibi_slopes, &d.bias,      &d.mask,        &d.cu_seqlens_q,
                                    &d.cu_seqlens_k, &d.seqused_k, &d.mask_ranges, &d.block_mask};
    for (int i = 0; i < 8; i++)
        if (present & (1u << i))
            *optional[i] = &t[5 + i];
    char mask[512], score[512], config[128];
    const char *m = fuzz_string(&in, mask, sizeof mask);
    const char *s = fuzz_string(&in, score, sizeof score);
    const char *cfg = fuzz_string(&in, config, sizeof config);
    d.mask_mod = m[0] ? m : NULL;
    d.score_mod = s[0] ? s : NULL;
    const int with_lse = (present >> 8) & 1;
    /* Decode and paged caches: a split count and a page table (read last: older seeds keep
    ** their meaning up to here). */
    fill_tensor(&in, &t[13], 13);
    d.num_splits = (int32_t)((uint64_t)fuzz_int(&in) - 2); /* -2 .. 253 */
    d.page_table = (present >> 10) & 1 ? &t[13] : NULL;
    /* FP8 descale factors (read after the page table, for the same reason). */
    fill_tensor(&in, &t[14], 14);
    d.q_descale = (present >> 11) & 1 ? &t[14] : NULL;
    d.k_descale = (present >> 12) & 1 ? &t[14] : NULL;
    d.v_descale = (present >> 13) & 1 ? &t[14] : NULL;

    static const fj_device_info devices[2] = {
        {.struct_size = sizeof(fj_device_info),
         .backend = FJ_BACKEND_CUDA,
         .name = "H200",
         .arch = "sm_90a",
         .compute_units = 132,
         .global_memory = 141ull << 30,
         .local_memory = 227 << 10},
        {.struct_size = sizeof(fj_device_info),
         .backend = FJ_BACKEND_OPENCL,
         .name = "cpu",
         .arch = "opencl",
         .compute_units = 2,
         .global_memory = 1ull << 30,
         .local_memory = 64 << 10},
    };
    for (int dev = 0; dev < 2; dev++) {
        fj__mods mods = {0};
        fj__plan plan;
        fj__err err = {{0}};
        fj_status st = fj__plan_request(&d, &t[0], &t[1], &t[2], &t[3], with_lse ? &t[4] : NULL,
                                        &devices[dev], cfg[0] ? cfg : NULL, &mods, &plan, &err);
        if (st == FJ_OK)
            for (int i = 0; i < plan.nsteps; i++) {
                if (plan.steps[i].kind != FJ__STEP_KERNEL)
                    continue;
                char *text = NULL, hash[65];
                if (fj__variant_key(&plan.steps[i].variant, "target", "0123", &text, hash, &err) ==
                    FJ_OK)
                    free(text);
            }
        else if (!err.msg[0])
            abort();                 /* every rejection names its reason */
        if (getenv("FJ_FUZZ_DEBUG")) /* why a seed does (not) plan */
            fprintf(stderr, "device %d: %s %s\n", dev, fj_status_string(st), err.msg);
        fj__mods_free(&mods);
    }
    /* The same tensors as a merge: states t[0..n-1], their lses t[6..], the result t[12] and
    ** maybe t[11] (aliases and overlaps included, as the bytes make them). */
    const int n = (int)(fuzz_bits(&in, 1) % 8) - 1; /* -1 .. 6 */
    fj__merge_problem mp;
    fj__err err = {{0}};
    if (fj__validate_merge(n >= 0 ? &t[0] : NULL, &t[6], n < 0 ? 1 : n, &t[12],
                           (present >> 9) & 1 ? &t[11] : NULL, &mp, &err) == FJ_OK) {
        fj__plan plan;
        if (fj__plan_merge(&mp, FJ_BACKEND_CUDA, &plan, &err) == FJ_OK)
            for (int i = 0; i < plan.nsteps; i++) {
                char *text = NULL, hash[65];
                if (fj__variant_key(&plan.steps[i].variant, "target", "0123", &text, hash, &err) ==
                    FJ_OK)
                    free(text);
            }
    } else if (!err.msg[0]) {
        abort();
    }
    if (getenv("FJ_FUZZ_DEBUG"))
        fprintf(stderr, "merge of %d: %s\n", n, err.msg[0] ? err.msg : "planned");
    /* The same tensors as a backward: dout t[5], dq dk dv t[6..8] (overlaps as the bytes make
    ** them), planned for both devices. */
    fj__bwd_problem bp;
    fj__err berr = {{0}};
    if (fj__validate_backward(&d, &t[0], &t[1], &t[2], &t[3], &t[5], with_lse ? &t[4] : NULL,
                              &t[6], &t[7], &t[8], &bp, &berr) == FJ_OK) {
        fj__mods mods = {0};
        if (fj__mods_resolve(&mods, &bp.f, &berr) == FJ_OK) {
            fj__features f;
            fj__bwd_features_of(&bp, &f); /* the gradients' alignment: the tensor-core stages */
            for (int dev = 0; dev < 2; dev++) {
                fj__plan plan;
                if (fj__plan_backward(&f, &devices[dev], NULL, &plan, &berr) == FJ_OK)
                    for (int i = 0; i < plan.nsteps; i++) {
                        char *text = NULL, hash[65];
                        if (fj__variant_key(&plan.steps[i].variant, "target", "0123", &text, hash,
                                            &berr) == FJ_OK)
                            free(text);
                    }
            }
        }
        fj__mods_free(&mods);
    } else if (!berr.msg[0]) {
        abort();
    }
    /* The same q and k with t[9] as the block classes fj_block_mask_build would write. */
    fj__problem kp;
    fj__err kerr = {{0}};
    if (fj__validate_block_mask(&d, &t[0], &t[1], &t[9], &kp, &kerr) == FJ_OK) {
        fj__mods mods = {0};
        if (fj__mods_resolve(&mods, &kp, &kerr) == FJ_OK) {
            fj__features f;
            fj__features_of(&kp, &f);
            const int64_t extent[2] = {t[9].shape[0], t[9].shape[1]};
            fj__plan plan;
            if (fj__plan_block_mask(&f, &devices[0], extent, kp.blocks_stride, &plan, &kerr) ==
                FJ_OK) {
                char *text = NULL, hash[65];
                if (fj__variant_key(&plan.steps[0].variant, "target", "0123", &text, hash,
                                    &kerr) == FJ_OK)
                    free(text);
            } else if (!kerr.msg[0]) {
                abort();
            }
        }
        fj__mods_free(&mods);
    } else if (!kerr.msg[0]) {
        abort();
    }
    /* The same tensors as an append to a paged cache: new keys and values t[0], t[1] into
    ** t[2], t[3] through the page table t[13] at the lengths t[10]; dense, then packed by the
    ** offsets t[8]; with the descale factors the descriptor has for k and v. */
    for (int packed = 0; packed <= 1; packed++) {
        fj__append_problem ap;
        fj__err aerr = {{0}};
        if (fj__validate_append(&t[0], &t[1], packed ? &t[8] : NULL, d.k_descale, d.v_descale,
                                &t[2], &t[3], &t[13], &t[10], &ap, &aerr) == FJ_OK) {
            fj__plan plan;
            if (fj__plan_append(&ap, FJ_BACKEND_OPENCL, &plan, &aerr) == FJ_OK) {
                char *text = NULL, hash[65];
                if (fj__variant_key(&plan.steps[0].variant, "target", "0123", &text, hash,
                                    &aerr) == FJ_OK)
                    free(text);
            }
        } else if (!aerr.msg[0]) {
            abort();
        }
    }
    return 0;
}
