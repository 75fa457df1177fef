/* Status text, version, error formatting and small helpers used across the runtime. */
#define _POSIX_C_SOURCE 200809L
#include "core.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define FJ__STR2(x) #x
#define FJ__STR(x) FJ__STR2(x)

const char *fj_version(void)
{
    return FJ__STR(FJ_VERSION_MAJOR) "." FJ__STR(FJ_VERSION_MINOR) "." FJ__STR(FJ_VERSION_PATCH);
}

const char *fj_status_string(fj_status status)
{
    switch (status) {
#define FJ__STATUS_CASE(name, text)                                                                \
    case FJ_##name: return text;
        FJ_STATUS_MAP(FJ__STATUS_CASE)
#undef FJ__STATUS_CASE
    }
    return "unknown status";
}

fj_tensor fj__tensor_4d(const fj_tensor *t)
{
    fj_tensor v = *t;
    if (t->ndim == 3) {
        v.ndim = 4;
        for (int i = 3; i > 0; i--) {
            v.shape[i] = t->shape[i - 1];
            v.stride[i] = t->stride[i - 1];
        }
        v.shape[0] = 1;
        v.stride[0] = 0;
    }
    return v;
}

size_t fj_dtype_size(fj_dtype dtype)
{
    switch (dtype) {
    case FJ_DTYPE_F16:
    case FJ_DTYPE_BF16: return 2;
    case FJ_DTYPE_F32:
    case FJ_DTYPE_I32: return 4;
    case FJ_DTYPE_F8_E4M3:
    case FJ_DTYPE_F8_E5M2:
    case FJ_DTYPE_BOOL: return 1;
    }
    return 0;
}

int fj__dtype_fp8(fj_dtype dtype)
{
    return dtype == FJ_DTYPE_F8_E4M3 || dtype == FJ_DTYPE_F8_E5M2;
}

const char *fj__dtype_name(fj_dtype dtype)
{
    switch (dtype) {
    case FJ_DTYPE_F16: return "f16";
    case FJ_DTYPE_BF16: return "bf16";
    case FJ_DTYPE_F32: return "f32";
    case FJ_DTYPE_F8_E4M3: return "f8e4m3";
    case FJ_DTYPE_F8_E5M2: return "f8e5m2";
    case FJ_DTYPE_BOOL: return "bool";
    case FJ_DTYPE_I32: return "i32";
    }
    return "?";
}

const char *fj__backend_name(fj_backend_kind kind)
{
    switch (kind) {
    case FJ_BACKEND_AUTO: return "auto";
    case FJ_BACKEND_CUDA: return "cuda";
    case FJ_BACKEND_OPENCL: return "opencl";
    }
    return "?";
}

fj_status fj__fail(fj__err *err, fj_status status, const char *fmt, ...)
{
    if (err) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->msg, sizeof err->msg, fmt, ap);
        va_end(ap);
    }
    return status;
}

void fj__append(fj__err *err, const char *fmt, ...)
{
    if (!err)
        return;
    size_t used = strlen(err->msg);
    if (used + 1 >= sizeof err->msg)
        return;
    if (used > 0 && used + 3 < sizeof err->msg) {
        memcpy(err->msg + used, "; ", 3);
        used += 2;
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg + used, sizeof err->msg - used, fmt, ap);
    va_end(ap);
}

double fj__now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec * 1e-6;
}

/* $FLASHJIT_LOG as a level: 0 off, 1 info, 2 debug. */
static int log_level(void)
{
    static int level = -1; /* racy first read is benign: every thread computes the same */
    if (level < 0) {
        const char *name = getenv("FLASHJIT_LOG");
        level = !name ? 0 : !strcmp(name, "debug") ? 2 : !strcmp(name, "info") ? 1 : 0;
    }
    return level;
}

int fj__log_info_enabled(void)
{
    return log_level() >= 1;
}

int fj__log_debug_enabled(void)
{
    return log_level() >= 2;
}

void fj__log_info(const char *fmt, ...)
{
    if (!fj__log_info_enabled())
        return;
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "flashjit: %s\n", line);
}

char *fj__strdup(const char *s)
{
    if (!s)
        return NULL;
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (d)
        memcpy(d, s, n);
    return d;
}

int fj__size_on_field_end(size_t size, const size_t *ends, int n, size_t whole)
{
    if (size == whole)
        return 1;
    for (int i = 0; i < n; i++)
        if (size == ends[i])
            return 1;
    return 0;
}
