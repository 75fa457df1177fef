/* The runtime's side of tuning (fj__tune_host) for one request, shared by the forward's and the
** backward's: every candidate's plan made and its kernels made ready together, a candidate's
** plan run on the request and waited for, the outputs read back one after the other. Each
** request kind lends only how a candidate is planned. */
#include <stdio.h>
#include <stdlib.h>

#include "context.h"

size_t fj__span_bytes(const fj_tensor *t)
{
    int64_t last = 0;
    for (int i = 0; i < t->ndim; i++)
        last += (t->shape[i] - 1) * t->stride[i];
    return (size_t)(last + 1) * fj_dtype_size(t->dtype);
}

static fj_status tuning_prepare(void *ud, const fj__tune_candidate *cs, int n, fj_status *status,
                                char (*why)[160])
{
    const fj__tuning *t = ud;
    fj__plan *plans = calloc((size_t)n, sizeof *plans);
    if (!plans)
        return fj__fail(&t->ctx->err, FJ_ERR_OUT_OF_MEMORY, "tuning: out of memory");
    for (int i = 0; i < n; i++) {
        status[i] = t->plan(t, &cs[i], &plans[i]);
        if (status[i] != FJ_OK)
            snprintf(why[i], sizeof why[i], "%.150s", t->ctx->err.msg);
    }
    const fj_status st = fj__plans_prepare(t->ctx, plans, n, status, why);
    free(plans);
    return st;
}

static fj_status tuning_run(void *ud, const fj__tune_candidate *c)
{
    const fj__tuning *t = ud;
    fj__plan plan;
    fj_status st = t->plan(t, c, &plan);
    if (st == FJ_OK)
        st = fj__plan_run(t->ctx, &plan, t->request, t->stream);
    if (st == FJ_OK)
        st = t->ctx->ops->synchronize(t->ctx->backend, t->stream);
    return st;
}

static int32_t tuning_spills(void *ud, const fj__variant *v)
{
    return fj__kernel_spills(((const fj__tuning *)ud)->ctx, v);
}

static fj_status tuning_read_output(void *ud, void *host, size_t bytes)
{
    const fj__tuning *t = ud;
    fj_status st = FJ_OK;
    size_t at = 0;
    for (int i = 0; i < FJ__TUNING_OUTPUTS && t->outputs[i] && st == FJ_OK; i++) {
        const size_t n = fj__span_bytes(t->outputs[i]);
        if (at + n > bytes)
            return FJ_ERR_INVALID_ARGUMENT;
        st = t->ctx->ops->copy_d2h(t->ctx->backend, (char *)host + at, t->outputs[i]->data, n);
        at += n;
    }
    return st;
}

static const char *tuning_last_error(void *ud)
{
    return ((const fj__tuning *)ud)->ctx->err.msg;
}

fj_status fj__tune_request(const fj__tuning *t, const fj__variant *heuristic, fj_tune_result *r)
{
    const fj__tune_host host = {.ud = (void *)t,
                                .device = &t->ctx->device,
                                .prepare = tuning_prepare,
                                .run = tuning_run,
                                .spills = tuning_spills,
                                .read_output = tuning_read_output,
                                .last_error = tuning_last_error};
    size_t bytes = 0;
    for (int i = 0; i < FJ__TUNING_OUTPUTS && t->outputs[i]; i++)
        bytes += fj__span_bytes(t->outputs[i]);
    fj_context *ctx = t->ctx;
    return fj__tune(&host, &ctx->tuned, ctx->cache, ctx->fingerprint, t->f, heuristic,
                    t->outputs[0]->dtype, bytes, r, &ctx->err);
}
