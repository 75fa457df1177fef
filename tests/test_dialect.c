/* The portable dialect's arithmetic (templates/dialect.lua) rendered and run on the OpenCL
** device: the divider that the paged kernels divide key positions by (divider_of, div_by,
** mod_by) against C's / and %, for every divisor to 4096, large ones up to 2^31 - 1, and
** numerators at and around multiples of each, small and up to 2^31 - 1. (The CUDA spelling
** differs only in __umulhi for mul_hi.) Skips, visibly, where there is no OpenCL device. */
#define _POSIX_C_SOURCE 200809L
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "backend/backend.h"
#include "core/layout.h"
#include "templates/render.h"

/* The kernel: work-item i divides numerators[i] by divisors[i / per_divisor]. */
static const char *const KERNEL_TEXT =
    "% include(\"dialect.lua\")\n"
    "typedef struct {\n"
    "    I64 divisors, numerators, quotients, remainders;\n"
    "    int pairs, per_divisor;\n"
    "} fj_divtest_params;\n"
    "KERNEL(64) fj_divtest(const fj_divtest_params P)\n"
    "{\n"
    "    const int i = BLOCK_X * 64 + THREAD_X;\n"
    "    if (i >= P.pairs)\n"
    "        return;\n"
    "    const divider v = divider_of(GPTR(const int, P.divisors)[i / P.per_divisor]);\n"
    "    const int n = GPTR(const int, P.numerators)[i];\n"
    "    GPTR(int, P.quotients)[i] = div_by(v, n);\n"
    "    GPTR(int, P.remainders)[i] = mod_by(v, n);\n"
    "}\n";

typedef struct divtest_params {
    void *divisors, *numerators, *quotients, *remainders;
    int32_t pairs, per_divisor;
} divtest_params;

static const fj__pfield DIVTEST_FIELDS[] = {
    {"divisors", FJ__PK_PTR, "int", NULL, offsetof(divtest_params, divisors), 8},
    {"numerators", FJ__PK_PTR, "int", NULL, offsetof(divtest_params, numerators), 8},
    {"quotients", FJ__PK_PTR, "int", NULL, offsetof(divtest_params, quotients), 8},
    {"remainders", FJ__PK_PTR, "int", NULL, offsetof(divtest_params, remainders), 8},
    {"pairs", FJ__PK_I32, NULL, NULL, offsetof(divtest_params, pairs), 4},
    {"per_divisor", FJ__PK_I32, NULL, NULL, offsetof(divtest_params, per_divisor), 4},
};
static const fj__playout DIVTEST_LAYOUT = {"fj_divtest_params", DIVTEST_FIELDS, 6,
                                           sizeof(divtest_params), 8};

/* The test's template by name; every other (dialect.lua, engine.lua) from the embedded set. */
static const char *lookup(void *ud, const char *name, size_t *len)
{
    (void)ud;
    if (!strcmp(name, "divtest.lua")) {
        *len = strlen(KERNEL_TEXT);
        return KERNEL_TEXT;
    }
    for (size_t i = 0; i < tpl_embedded_count; i++)
        if (!strcmp(tpl_embedded_files[i].name, name)) {
            *len = tpl_embedded_files[i].size;
            return tpl_embedded_files[i].text;
        }
    return NULL;
}

enum { PER_DIVISOR = 40, SMALL_DIVISORS = 4096 };
static const int32_t LARGE_DIVISORS[] = {4099,    65535,   65536,         65537,      1000003,
                                         1 << 20, 1 << 30, (1 << 30) + 1, 2147483646, 2147483647};

/* Numerator j of divisor d: 0 to 3, multiples k d of a few k and their neighbours (those that
** are ints in [0, 2^31)), the top of the domain, and pseudo-random ints. */
static int32_t numerator(int32_t d, int j, uint32_t *rng)
{
    static const int64_t ks[] = {1, 2, 3, 7, 64, 1000, 65536, 1 << 24};
    const int64_t top = INT32_MAX;
    int64_t n;
    if (j < 4) {
        n = j;
    } else if (j < 4 + 3 * 8) {
        const int64_t k = ks[(j - 4) / 3];
        n = k * d + (j - 4) % 3 - 1;
    } else if (j < 34) {
        n = top - (j - 28) * (int64_t)(j % 2 ? d : 1);
    } else {
        *rng = *rng * 1664525u + 1013904223u;
        n = *rng >> 1;
    }
    return n < 0 || n > top ? (int32_t)(top - d) : (int32_t)n;
}

static void test_divider_matches_division(void **state)
{
    (void)state;
    const struct fj_backend_ops *ops = &fj__opencl_backend;
    fj__err err = {{0}};
    void *b = NULL;
    assert_int_equal(ops->create(0, &err, &b), FJ_OK);

    tpl_param params[] = {{.name = "backend", .kind = TPL_STR, .s = "opencl"},
                          {.name = "q_dtype", .kind = TPL_STR, .s = "f32"},
                          {.name = "kv_dtype", .kind = TPL_STR, .s = "f32"},
                          {.name = "out_dtype", .kind = TPL_STR, .s = "f32"}};
    char *source = NULL, *log = NULL;
    if (tpl_render_with(lookup, NULL, NULL, "divtest.lua", params, 4, NULL, &source, &err) !=
        FJ_OK)
        fail_msg("render: %s", err.msg);
    fj__blob bin = {0};
    if (ops->compile(b, source, "", &bin, &log, &err) != FJ_OK)
        fail_msg("compile: %s\n%s", err.msg, log ? log : "");
    void *kernel = NULL;
    assert_int_equal(ops->load(b, bin.data, bin.size, "fj_divtest", &kernel), FJ_OK);

    const int nd = SMALL_DIVISORS + (int)(sizeof LARGE_DIVISORS / sizeof LARGE_DIVISORS[0]);
    const int pairs = nd * PER_DIVISOR;
    const size_t bytes = (size_t)pairs * sizeof(int32_t);
    int32_t *divisors = malloc((size_t)nd * sizeof *divisors), *num = malloc(bytes);
    int32_t *quo = malloc(bytes), *rem = malloc(bytes);
    assert_non_null(divisors);
    assert_non_null(num);
    assert_non_null(quo);
    assert_non_null(rem);
    uint32_t rng = 12345;
    for (int i = 0; i < nd; i++) {
        divisors[i] = i < SMALL_DIVISORS ? i + 1 : LARGE_DIVISORS[i - SMALL_DIVISORS];
        for (int j = 0; j < PER_DIVISOR; j++)
            num[i * PER_DIVISOR + j] = numerator(divisors[i], j, &rng);
    }
    divtest_params P = {.pairs = pairs, .per_divisor = PER_DIVISOR};
    assert_int_equal(ops->mem_alloc(b, (size_t)nd * sizeof *divisors, &P.divisors), FJ_OK);
    assert_int_equal(ops->mem_alloc(b, bytes, &P.numerators), FJ_OK);
    assert_int_equal(ops->mem_alloc(b, bytes, &P.quotients), FJ_OK);
    assert_int_equal(ops->mem_alloc(b, bytes, &P.remainders), FJ_OK);
    assert_int_equal(ops->copy_h2d(b, P.divisors, divisors, (size_t)nd * sizeof *divisors), FJ_OK);
    assert_int_equal(ops->copy_h2d(b, P.numerators, num, bytes), FJ_OK);
    /* poisoned: a result the kernel did not write fails below */
    assert_int_equal(ops->memset_async(b, P.quotients, 0xff, bytes, NULL), FJ_OK);
    assert_int_equal(ops->memset_async(b, P.remainders, 0xff, bytes, NULL), FJ_OK);
    const fj__launch l = {.grid = {(uint32_t)(pairs + 63) / 64, 1, 1},
                          .block = {64, 1, 1},
                          .params = &P,
                          .params_size = sizeof P,
                          .layout = &DIVTEST_LAYOUT};
    assert_int_equal(ops->launch(b, kernel, &l, NULL), FJ_OK);
    assert_int_equal(ops->synchronize(b, NULL), FJ_OK);
    assert_int_equal(ops->copy_d2h(b, quo, P.quotients, bytes), FJ_OK);
    assert_int_equal(ops->copy_d2h(b, rem, P.remainders, bytes), FJ_OK);

    int wrong = 0;
    for (int i = 0; i < pairs; i++) {
        const int32_t d = divisors[i / PER_DIVISOR], n = num[i];
        if (quo[i] != n / d || rem[i] != n % d) {
            if (wrong++ < 5)
                print_error("%d / %d: %d rem %d, expected %d rem %d\n", n, d, quo[i], rem[i],
                            n / d, n % d);
        }
    }
    assert_int_equal(wrong, 0);

    void *bufs[] = {P.divisors, P.numerators, P.quotients, P.remainders};
    for (int i = 0; i < 4; i++)
        ops->mem_free(b, bufs[i]);
    ops->unload(b, kernel);
    ops->destroy(b);
    free(bin.data);
    free(log);
    free(source);
    free(divisors);
    free(num);
    free(quo);
    free(rem);
}

int main(void)
{
    int32_t devices = 0;
    if (fj__opencl_backend.device_count(&devices) != FJ_OK || devices == 0) {
        printf("SKIP: no opencl device\n");
        return 77;
    }
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_divider_matches_division)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
