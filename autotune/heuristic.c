/* The default tile choice, used until a tuned record exists for the device and shape. */
#include "../runtime/internal.h"

#include <string.h>

static int32_t round_up(int64_t x, int32_t to)
{
    return (int32_t)((x + to - 1) / to * to);
}

void fj__plan_forward(const fj__problem *p, const fj_device_info *dev, fj__variant *v)
{
    memset(v, 0, sizeof *v);
    v->family = FJ__FAMILY_FWD;
    v->backend = dev->backend;
    v->dtype = p->dtype;
    /* Head dims are padded to multiples of 16 (the tensor-core k step) so that nearby head dims
    ** share a kernel; the padding lanes are masked at load and store. */
    v->head_dim_pad = round_up(p->head_dim, 16);
    v->head_dim_v_pad = round_up(p->head_dim_v, 16);
    v->local_mask = p->window_left >= 0 || p->window_right >= 0;
    v->softcap = p->softcap > 0.0f;
    v->write_lse = p->lse != NULL;

    /* OpenCL: one work-item per query row; the key tile is as deep as local memory allows
    ** (K and V tiles in float), at most 64 KiB. */
    v->tile_m = 32;
    v->threads = v->tile_m;
    uint64_t budget = dev->local_memory ? dev->local_memory : 32768;
    if (budget > 65536)
        budget = 65536;
    v->tile_n = 32;
    while (v->tile_n > 8 &&
           (uint64_t)v->tile_n * (uint64_t)(v->head_dim_pad + v->head_dim_v_pad) * 4 > budget)
        v->tile_n /= 2;
}
