/* A cmocka suite that runs on one backend's device (FJ_TEST_BACKEND, OpenCL unless the build
** says otherwise): the group state is a context on it, each test takes it with
** suite_context(), and suite_run() exits with ctest's skip code (SKIP_RETURN_CODE in
** tests/CMakeLists.txt) when there is no such device, so the summary says skipped instead of
** passed without checking anything. Include once, in the suite's own file. */
#ifndef FJ_TESTS_BACKEND_SUITE_H
#define FJ_TESTS_BACKEND_SUITE_H

#include <stdio.h>
#include <stdlib.h>

#include "flashjit.h"

#ifndef FJ_TEST_BACKEND
#define FJ_TEST_BACKEND FJ_BACKEND_OPENCL
#endif

enum { SUITE_SKIPPED = 77 };

static fj_status suite_status; /* the context's creation, for suite_run's skip decision */

static int suite_setup(void **state)
{
    fj_context_options o;
    fj_context_options_init(&o);
    o.backend = FJ_TEST_BACKEND;
    o.cache_path = ":memory:";
    fj_context *ctx = NULL;
    suite_status = fj_context_create(&o, &ctx);
    if (suite_status != FJ_OK)
        printf("SKIP: no %s device (%s: %s)\n",
               FJ_TEST_BACKEND == FJ_BACKEND_CUDA ? "CUDA" : "OpenCL",
               fj_status_string(suite_status), fj_last_create_error());
    *state = ctx;
    return 0;
}

static int suite_teardown(void **state)
{
    fj_context_destroy(*state);
    return 0;
}

/* The suite's context; skips the test where there is none. */
static fj_context *suite_context(void **state)
{
    if (!*state)
        skip();
    return *state;
}

/* A new context on the suite's backend (nothing compiled, no workspaces) into *ctx. */
static inline fj_status suite_create_context(fj_context **ctx)
{
    fj_context_options o;
    fj_context_options_init(&o);
    o.backend = FJ_TEST_BACKEND;
    o.cache_path = ":memory:";
    return fj_context_create(&o, ctx);
}

/* A second context on the suite's backend, new; the test fails without one. Destroy it with
** fj_context_destroy. (inline, so the suites that do not call it do not warn.) */
static inline fj_context *suite_new_context(void)
{
    fj_context *ctx = NULL;
    assert_int_equal(suite_create_context(&ctx), FJ_OK);
    return ctx;
}

/* The same, made while environment variable var is value (the library reads FLASHJIT_CONFIG
** and FLASHJIT_BWD_CONFIG when a context is made); the variable is unset again before any
** check can fail. (setenv: the suites define _POSIX_C_SOURCE 200809L.) */
static inline fj_context *suite_context_with_env(const char *var, const char *value)
{
    assert_int_equal(setenv(var, value, 1), 0);
    fj_context *ctx = NULL;
    const fj_status st = suite_create_context(&ctx);
    unsetenv(var);
    assert_int_equal(st, FJ_OK);
    return ctx;
}

/* Runs the tests as the group "<name>_cuda" or "<name>_opencl"; 77 without a device. */
#define suite_run(name, tests)                                                                     \
    suite_run_((FJ_TEST_BACKEND == FJ_BACKEND_CUDA ? name "_cuda" : name "_opencl"), (tests),      \
               sizeof(tests) / sizeof((tests)[0]))

static int suite_run_(const char *name, const struct CMUnitTest *tests, size_t n)
{
    /* The probe is created and destroyed before the suite's context, so every GPU suite also
    ** checks that a context can be made again after the last one released the device. */
    fj_context *probe = NULL;
    suite_setup((void **)&probe);
    if (!probe)
        return suite_status == FJ_ERR_NO_DEVICE ? SUITE_SKIPPED : 1;
    suite_teardown((void **)&probe);
    /* FJ_TEST_FILTER: run only the tests whose names match (cmocka's pattern: * and ?). */
    const char *filter = getenv("FJ_TEST_FILTER");
    if (filter && *filter)
        cmocka_set_test_filter(filter);
    return _cmocka_run_group_tests(name, tests, n, suite_setup, suite_teardown);
}

#endif /* FJ_TESTS_BACKEND_SUITE_H */
