/* Mask and score expressions: which texts the grammar accepts (and what they compute), which it
** rejects, and that the rejection names the position; rejected texts never reach a compiler. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "plan/expr.h"
#include "plan/variant.h"

static const float args[] = {0.5f, -2.0f, 3.25f, 7.0f};

static double eval_text(const char *text, int score, const fj__expr_env *env)
{
    fj__expr *e = NULL;
    fj__err err = {{0}};
    if (fj__expr_parse(score ? "score_mod" : "mask_mod", text, score, &e, &err) != FJ_OK)
        fail_msg("'%s' was rejected: %s", text, err.msg);
    double v = fj__expr_eval(e, env);
    fj__expr_free(e);
    return v;
}

static void test_accepted_expressions_compute(void **state)
{
    (void)state;
    fj__expr_env env = {
        .b = 1, .h = 3, .q = 70, .k = 5, .sq = 128, .sk = 96, .s = 1.5, .args = args, .nargs = 4};
    static const struct {
        const char *text;
        int score;
        double want;
    } cases[] = {
        {"q >= k", 0, 1},
        {"q / 64 == k / 64", 0, 0}, /* integer division: 1 vs 0 */
        {"(q / 64) * 64 + k % 7", 0, 69},
        {"q - k < 100 && k < sk || b == 9", 0, 1},
        {"!(q < k)", 0, 1},
        {"k <= q + sk - sq ? 1 : 0", 0, 1},
        {"min(q, k) + max(q, k)", 0, 75},
        {"abs(k - q)", 0, 65},
        {"-q + 2 * k", 0, -60},
        {"s * 0.5f", 1, 0.75},
        {"s - arg[1] * abs(q - k)", 1, 1.5 + 2.0 * 65},
        {"s + iarg[0]", 1, 1.5 + 1056964608.0}, /* the int32 bits of 0.5f */
        {"arg[h]", 1, 7.0},
        {"arg[100] + arg[-5]", 1, 7.0 + 0.5}, /* indices clamp into the array */
        {"tanh(s / 2.0) * 2.0", 1, 2.0 * tanh(0.75)},
        {"exp(log(s)) + sqrt(4.0) + floor(2.7)", 1, 1.5 + 2.0 + 2.0},
        {"q / 64 == k / 64 && (q - k) % 2 == 0", 0, 0},
        {"1.5e1 > 14", 0, 1},
        {"  q>=k  ", 0, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        double got = eval_text(cases[i].text, cases[i].score, &env);
        if (fabs(got - cases[i].want) > 1e-6 * fmax(1.0, fabs(cases[i].want)))
            fail_msg("'%s' = %.9g, expected %.9g", cases[i].text, got, cases[i].want);
    }
}

/* The arithmetic the header defines, which the kernels compute too: int32 that wraps, a zero
** divisor gives 0, floats are IEEE single precision. */
static void test_defined_arithmetic(void **state)
{
    (void)state;
    fj__expr_env env = {.q = 70, .k = 0, .sq = 65536, .sk = 65536, .s = 1.0};
    static const struct {
        const char *text;
        int score;
        double want;
    } cases[] = {
        {"q / 0", 0, 0},
        {"q % 0", 0, 0},
        {"q / (k - k)", 0, 0},
        {"-q / 0 == 0", 0, 1},
        {"sq * sk", 0, 0},                    /* 2^32 wraps to 0 */
        {"sq * sq / 2 + sq * sq / 2", 0, 0},  /* 0 / 2 twice */
        {"2147483647 + 1", 0, -2147483648.0}, /* wraps */
        {"-2147483647 - 1 - 1", 0, 2147483647.0},
        {"(-2147483647 - 1) / -1", 0, -2147483648.0},
        {"(-2147483647 - 1) % -1", 0, 0},
        {"abs(-2147483647 - 1)", 0, -2147483648.0},
        {"-(-2147483647 - 1)", 0, -2147483648.0},
        {"-7 / 2", 0, -3}, /* truncates toward zero, as C */
        {"-7 % 2", 0, -1},
        {"16777217 + 0.0", 0, 16777216.0}, /* the int converts to float */
        {"16777217 == 16777216.0", 0, 1},  /* ... rounding to 16777216 */
        {"s / 0.0 > 3.4e38", 1, 1},        /* IEEE: +inf */
        {"s * 3e38 * 10.0 > 3.4e38", 1, 1},
        {"0.1 + 0.2 == 0.3", 0, 1},    /* true in single precision, false in double */
        {"min(s, log(-1.0))", 1, 1.0}, /* fminf: a NaN operand yields the other one */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        double got = eval_text(cases[i].text, cases[i].score, &env);
        if (got != cases[i].want)
            fail_msg("'%s' = %.9g, expected %.9g", cases[i].text, got, cases[i].want);
    }
}

static void test_canonical_text_has_only_grammar_tokens(void **state)
{
    (void)state;
    fj__expr *e = NULL;
    fj__err err = {{0}};
    assert_int_equal(fj__expr_parse("score_mod", "s - arg[h] * abs(q - k)", 1, &e, &err), FJ_OK);
    assert_string_equal(fj__expr_text(e),
                        "(FJ_S - (ARG_F(FJ_H) * ((float)EXPR_IABS(EXPR_ISUB(FJ_Q, FJ_K)))))");
    assert_true(fj__expr_uses_args(e));
    fj__expr_free(e);
    assert_int_equal(fj__expr_parse("mask_mod", "q / 64 == k / 64", 0, &e, &err), FJ_OK);
    assert_string_equal(fj__expr_text(e), "(EXPR_IDIV(FJ_Q, 64) == EXPR_IDIV(FJ_K, 64))");
    assert_false(fj__expr_uses_args(e));
    fj__expr_free(e);
    assert_int_equal(fj__expr_parse("score_mod", "s * 2", 1, &e, &err), FJ_OK);
    assert_string_equal(fj__expr_text(e), "(FJ_S * ((float)2))");
    fj__expr_free(e);
    assert_int_equal(fj__expr_parse("score_mod", "s * 1.0 + 2.5e3 + 3f", 1, &e, &err), FJ_OK);
    assert_string_equal(fj__expr_text(e), "(((FJ_S * 1.0f) + 2500.0f) + 3.0f)");
    fj__expr_free(e);
}

static void test_rejected_expressions_name_the_position(void **state)
{
    (void)state;
    static const struct {
        const char *text;
        int score;
        const char *message;
    } cases[] = {
        {"", 0, "the expression is empty"},
        {"q >= k; system(1)", 0,
         "unexpected character ';' (one expression, no statements) at position 7"},
        {"{ return 1; }", 0, "unexpected character '{'"},
        {"#include <x>", 0, "no preprocessor"},
        {"asm(\"trap;\")", 0, "unknown name 'asm'"},
        {"q >= kk", 0, "unknown name 'kk'"},
        {"printf(q)", 0, "unknown name 'printf'"},
        {"s > 0", 0, "'s' (the score) exists only in score_mod"},
        {"arg[1.5]", 1, "an index into mod_args must be an integer"},
        {"s % 2", 1, "'%' needs integer operands"},
        {"(q >= k", 0, "expected ')'"},
        {"q >= k)", 0, "unexpected ')' after the expression"},
        {"q >= ", 0, "expected a number, a name or '(' but found the end"},
        {"min(q)", 0, "expected ','"},
        {"q ? k", 0, "expected ':'"},
        {"q @ k", 0, "unexpected character '@'"},
        {"q = k", 0, "unexpected character '='"},
        {"\"q\"", 0, "unexpected character '\"'"},
        {"q < k < 3", 0, "unexpected '<' after the expression"},
        {"k < 99999999999", 0, "literal 99999999999 is out of range"},
        {"s * 1e99", 1, "literal 1e99 is out of range"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fj__expr *e = NULL;
        fj__err err = {{0}};
        fj_status st = fj__expr_parse(cases[i].score ? "score_mod" : "mask_mod", cases[i].text,
                                      cases[i].score, &e, &err);
        if (st != FJ_ERR_INVALID_ARGUMENT || e || !strstr(err.msg, cases[i].message) ||
            !strstr(err.msg, "position"))
            fail_msg("'%s': status %d, message '%s', expected '%s'", cases[i].text, st, err.msg,
                     cases[i].message);
    }
}

static void test_long_expressions_are_bounded(void **state)
{
    (void)state;
    char text[8192] = "q";
    for (int i = 0; i < 600; i++)
        strcat(text, " + k");
    fj__expr *e = NULL;
    fj__err err = {{0}};
    assert_int_equal(fj__expr_parse("mask_mod", text, 0, &e, &err), FJ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "too long"));
    /* Nesting is bounded too, so no input can exhaust the parser's stack. */
    static char deep[200001];
    memset(deep, '(', 100000);
    strcpy(deep + 100000, "q");
    memset(deep + 100001, ')', 99999);
    assert_int_equal(fj__expr_parse("mask_mod", deep, 0, &e, &err), FJ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "nested too deeply"));
    memset(deep, '-', 100000);
    strcpy(deep + 100000, "q");
    assert_int_equal(fj__expr_parse("mask_mod", deep, 0, &e, &err), FJ_ERR_INVALID_ARGUMENT);
    assert_non_null(strstr(err.msg, "nested too deeply"));
    char ok[200];
    memset(ok, '(', 90);
    strcpy(ok + 90, "q");
    memset(ok + 91, ')', 90);
    ok[181] = '\0';
    assert_int_equal(fj__expr_parse("mask_mod", ok, 0, &e, &err), FJ_OK);
    fj__expr_free(e);
}

/* Long expressions (here 1.5 KB of emitted C, the limit is 2 KB) go into a kernel's key whole:
** no fixed-size buffer holds them on the way (one of 1 KB once truncated them and read past its
** end), and the same expression always gives the same key. */
static void test_long_expressions_key_whole(void **state)
{
    (void)state;
    char text[4096] = "q";
    for (int i = 0; i < 100; i++)
        strcat(text, " + k");
    fj__expr *e = NULL;
    fj__err err = {{0}};
    assert_int_equal(fj__expr_parse("mask_mod", text, 0, &e, &err), FJ_OK);
    const char *c = fj__expr_text(e);
    assert_true(strlen(c) > 1500);
    fj__variant v;
    memset(&v, 0, sizeof v);
    v.family = FJ__FAMILY_FWD;
    v.backend = FJ_BACKEND_OPENCL;
    v.tile_m = v.tile_n = 32;
    v.mask_mod = c;
    char *first = NULL, *second = NULL, h1[65], h2[65];
    assert_int_equal(fj__variant_key(&v, "opencl|x", "0123", &first, h1, &err), FJ_OK);
    assert_int_equal(fj__variant_key(&v, "opencl|x", "0123", &second, h2, &err), FJ_OK);
    assert_non_null(strstr(first, c));
    assert_string_equal(first, second);
    assert_string_equal(h1, h2);
    free(first);
    free(second);
    fj__expr_free(e);
}

/* score_mod derivatives: the generated text only where s varies (integer parts, comparisons
** and floor give none), and its evaluation against central differences in double precision
** over the branches of ternaries, min/max/abs and every function. */
static void test_score_mod_derivatives(void **state)
{
    (void)state;
    struct {
        const char *expr, *grad; /* grad: the exact text, or NULL to check it only numerically */
    } cases[] = {{"s", "1.0f"},
                 {"s * 2.0 + 1.0", "((1.0f * 2.0f))"},
                 {"q / 64 == k / 64 ? s : -1.0 / 0.0", "((EXPR_IDIV(FJ_Q, 64) == EXPR_IDIV(FJ_K, 64)) ? 1.0f : 0.0f)"},
                 {"floor(s) + (s > 1.0)", "0.0f"},
                 {"tanh(s / 3.0) * 3.0", NULL},
                 {"s > 0.2 ? exp(s) - 1.0 : -log(1.0 - s)", NULL},
                 {"max(s, 0.5 * s) + abs(s - 0.3) - min(s * s, 1.0)", NULL},
                 {"sqrt(s * s + 2.0) / (1.0 + exp(-s))", NULL},
                 {"-s + (q - k) * 0.01", NULL}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fj__expr *e = NULL;
        fj__err err = {{0}};
        assert_int_equal(fj__expr_parse("score_mod", cases[i].expr, 1, &e, &err), FJ_OK);
        const char *g = fj__expr_grad_text(e);
        assert_non_null(g);
        if (cases[i].grad && strcmp(g, cases[i].grad) != 0)
            fail_msg("%s: derivative text %s, expected %s", cases[i].expr, g, cases[i].grad);
        for (double s = -2.05; s < 2.0; s += 0.1) {
            fj__expr_env env = {.q = 3, .k = 70, .sq = 100, .sk = 100, .s = s, .exact = 1};
            const double analytic = fj__expr_eval_grad(e, &env);
            const double h = 1e-6;
            env.s = s + h;
            const double up = fj__expr_eval(e, &env);
            env.s = s - h;
            const double down = fj__expr_eval(e, &env);
            const double numeric = (up - down) / (2 * h);
            if (fabs(numeric - analytic) > 1e-5 * (1 + fabs(numeric)))
                fail_msg("%s at s = %g: derivative %.9g, finite difference %.9g", cases[i].expr, s,
                         analytic, numeric);
        }
        fj__expr_free(e);
    }
    fj__expr *mask = NULL;
    fj__err err = {{0}};
    assert_int_equal(fj__expr_parse("mask_mod", "k <= q", 0, &mask, &err), FJ_OK);
    assert_null(fj__expr_grad_text(mask)); /* only a score_mod has one */
    fj__expr_free(mask);
}

/* Nested functions differentiate in time and text linear in the depth: abs's derivative names
** its operand's once (its sign times it), so 40 levels fit the derivative's text and 90 are
** refused as too long, at once (naming it twice, as `x >= 0 ? x' : -x'` did, took 2^depth:
** found by fuzz_expr). */
static void test_nested_derivatives_stay_linear(void **state)
{
    (void)state;
    for (int depth = 40; depth <= 90; depth += 50) {
        char text[2048] = "";
        for (int i = 0; i < depth; i++)
            strcat(text, "abs(");
        strcat(text, "s - 0.5");
        for (int i = 0; i < depth; i++)
            strcat(text, ")");
        fj__expr *e = NULL;
        fj__err err = {{0}};
        assert_int_equal(fj__expr_parse("score_mod", text, 1, &e, &err), FJ_OK);
        if (depth == 40)
            assert_non_null(fj__expr_grad_text(e));
        else
            assert_null(fj__expr_grad_text(e)); /* too long to differentiate in a kernel */
        fj__expr_env env = {.s = -1.5, .exact = 1};
        assert_true(fj__expr_eval_grad(e, &env) == -1.0); /* below 0.5: the innermost sign */
        env.s = 1.0;
        assert_true(fj__expr_eval_grad(e, &env) == 1.0);
        fj__expr_free(e);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_accepted_expressions_compute),
        cmocka_unit_test(test_defined_arithmetic),
        cmocka_unit_test(test_canonical_text_has_only_grammar_tokens),
        cmocka_unit_test(test_rejected_expressions_name_the_position),
        cmocka_unit_test(test_long_expressions_are_bounded),
        cmocka_unit_test(test_long_expressions_key_whole),
        cmocka_unit_test(test_score_mod_derivatives),
        cmocka_unit_test(test_nested_derivatives_stay_linear),
    };
    return cmocka_run_group_tests_name("expr", tests, NULL, NULL);
}
