/* The smallest complete use of flashjit: create a context, allocate device memory, copy inputs,
** run the forward, read the output back and compare it with a plain computation.
** Build: cc hello_attention.c -Iinclude -Lbuild -lflashjit -lm */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "flashjit.h"

enum { B = 1, S = 100, H = 2, D = 32 };

/* On failure: print the status and the context's message, and exit. */
static void check(fj_context *ctx, fj_status st, const char *what)
{
    if (st == FJ_OK)
        return;
    fprintf(stderr, "%s: %s: %s\n", what, fj_status_string(st),
            ctx ? fj_context_last_error(ctx) : fj_last_create_error());
    exit(1);
}

static fj_tensor tensor(void *data, fj_dtype dtype)
{
    /* [batch, seq, heads, dim], dense: strides in elements */
    fj_tensor t = {.data = data,
                   .dtype = dtype,
                   .ndim = 4,
                   .shape = {B, S, H, D},
                   .stride = {S * H * D, H * D, D, 1}};
    return t;
}

int main(void)
{
    static float q[B * S * H * D], k[B * S * H * D], v[B * S * H * D], out[B * S * H * D];
    srand(7);
    for (int i = 0; i < B * S * H * D; i++) {
        q[i] = (float)rand() / RAND_MAX - 0.5f;
        k[i] = (float)rand() / RAND_MAX - 0.5f;
        v[i] = (float)rand() / RAND_MAX - 0.5f;
    }

    fj_context *ctx = NULL;
    fj_context_options opts;
    fj_context_options_init(&opts);
    opts.cache_path = ":memory:";
    check(NULL, fj_context_create(&opts, &ctx), "fj_context_create");

    size_t bytes = sizeof q;
    void *dq, *dk, *dv, *dout;
    check(ctx, fj_malloc(ctx, bytes, &dq), "fj_malloc");
    check(ctx, fj_malloc(ctx, bytes, &dk), "fj_malloc");
    check(ctx, fj_malloc(ctx, bytes, &dv), "fj_malloc");
    check(ctx, fj_malloc(ctx, bytes, &dout), "fj_malloc");
    check(ctx, fj_memcpy_h2d(ctx, dq, q, bytes), "fj_memcpy_h2d");
    check(ctx, fj_memcpy_h2d(ctx, dk, k, bytes), "fj_memcpy_h2d");
    check(ctx, fj_memcpy_h2d(ctx, dv, v, bytes), "fj_memcpy_h2d");

    fj_attention_desc desc;
    fj_attention_desc_init(&desc);
    desc.causal = 1;
    fj_tensor tq = tensor(dq, FJ_DTYPE_F32), tk = tensor(dk, FJ_DTYPE_F32);
    fj_tensor tv = tensor(dv, FJ_DTYPE_F32), tout = tensor(dout, FJ_DTYPE_F32);
    check(ctx, fj_attention_forward(ctx, &desc, &tq, &tk, &tv, &tout, NULL, NULL), "forward");
    check(ctx, fj_synchronize(ctx, NULL), "fj_synchronize");
    check(ctx, fj_memcpy_d2h(ctx, out, dout, bytes), "fj_memcpy_d2h");

    /* The same attention, computed plainly. */
    double worst = 0;
    for (int h = 0; h < H; h++)
        for (int i = 0; i < S; i++) {
            double s[S], m = -INFINITY, sum = 0;
            for (int j = 0; j <= i; j++) {
                s[j] = 0;
                for (int c = 0; c < D; c++)
                    s[j] += q[(i * H + h) * D + c] * k[(j * H + h) * D + c];
                s[j] /= sqrt(D);
                m = fmax(m, s[j]);
            }
            for (int j = 0; j <= i; j++)
                sum += exp(s[j] - m);
            for (int c = 0; c < D; c++) {
                double o = 0;
                for (int j = 0; j <= i; j++)
                    o += exp(s[j] - m) / sum * v[(j * H + h) * D + c];
                worst = fmax(worst, fabs(o - out[(i * H + h) * D + c]));
            }
        }

    fj_free(ctx, dq);
    fj_free(ctx, dk);
    fj_free(ctx, dv);
    fj_free(ctx, dout);
    fj_context_destroy(ctx);
    printf("max abs error %.3g: %s\n", worst, worst < 1e-5 ? "ok" : "WRONG");
    printf("%d passed, %d failed\n", worst < 1e-5, worst >= 1e-5);
    return worst < 1e-5 ? 0 : 1;
}
