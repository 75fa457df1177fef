/* libFuzzer target: the expression parser, its C emission, the evaluator, a score_mod's
** derivative (text and dual-number value), and the variant key that carries the emitted text.
** Input: one flag byte (bit 0: score_mod), then the text. Any accepted text must emit bounded C,
** evaluate without undefined behaviour, and key cleanly. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_input.h"
#include "../plan/expr.h"
#include "../plan/variant.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    int score = data[0] & 1;
    char *text = malloc(size);
    if (!text)
        return 0;
    memcpy(text, data + 1, size - 1);
    text[size - 1] = '\0';

    fj__expr *e = NULL;
    fj__err err = {{0}};
    if (fj__expr_parse(score ? "score_mod" : "mask_mod", text, score, &e, &err) == FJ_OK) {
        const char *c = fj__expr_text(e);
        if (strlen(c) >= FJ__EXPR_MAX_TEXT)
            abort();
        const char *g = fj__expr_grad_text(e);
        if (!score && g) /* only a score_mod has one (NULL where it would be too long) */
            abort();
        if (g && strlen(g) >= FJ__EXPR_MAX_GRAD_TEXT)
            abort();
        static const float args[5] = {0.5f, -2.0f, 3.4e38f, 1e-45f, -0.0f};
        for (int i = 0; i < 4; i++) {
            fj__expr_env env = {.b = i,
                                .h = 3 * i,
                                .q = i ? 70 * i : 0x3fffffff,
                                .k = i * 5,
                                .sq = 1 << 30,
                                .sk = 129,
                                .s = i == 2 ? 3.0e38 : -1.5,
                                .args = args,
                                .nargs = i == 3 ? 0 : 5};
            (void)fj__expr_eval(e, &env);
            if (score) {
                (void)fj__expr_eval_grad(e, &env);
                env.exact = 1;
                (void)fj__expr_eval_grad(e, &env);
            }
        }
        fj__variant v;
        memset(&v, 0, sizeof v);
        v.family = FJ__FAMILY_FWD;
        v.backend = FJ_BACKEND_CUDA;
        v.path = FJ__PATH_WGMMA;
        v.tile_m = 128;
        v.tile_n = 128;
        v.head_dim_pad = v.head_dim_v_pad = 128;
        if (score)
            v.score_mod = c;
        else
            v.mask_mod = c;
        char *key_text = NULL, hash[65];
        if (fj__variant_key(&v, "cuda|sm_90a", "0123", &key_text, hash, &err) == FJ_OK &&
            (!strstr(key_text, c) || strlen(hash) != 64))
            abort(); /* the key must carry the whole text */
        free(key_text);
        fj__expr_free(e);
    }
    free(text);
    return 0;
}
