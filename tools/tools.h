/* The CLI's commands, one file each. */
#ifndef FJ_TOOLS_H
#define FJ_TOOLS_H

#include "flashjit.h"

#include <stdint.h>

/* Reads s, the argument of option --opt, as an integer in [lo, hi] into *out; else prints a
** message naming the option and returns -1. */
int fjt_parse_int(const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out);
/* The same for a comma-separated list of at most max integers; returns the count, or -1. */
int fjt_parse_list(const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out, int max);
/* The same for a finite float. */
int fjt_parse_float(const char *opt, const char *s, float *out);
/* The index of s (any case) in words, a NULL-terminated list; -1 when it is not there. */
int fjt_pick(const char *s, const char *const *words);
/* "bf16", "f16" / "fp16" or "f32" / "fp32" (any case) into *dtype; -1 for anything else. */
int fjt_parse_dtype(const char *s, fj_dtype *dtype);
/* "auto", "cuda" or "opencl" (any case) into *k; -1 for anything else. */
int fjt_parse_backend(const char *s, fj_backend_kind *k);
/* `flashjit cache ...`; argv[0] is "cache". Returns the exit status. */
int fjt_cache_command(int argc, char **argv);
/* `flashjit tune ...`; argv[0] is "tune". */
int fjt_tune_command(int argc, char **argv);
/* `flashjit cache build ...`; argv[0] is "build". */
int fjt_cache_build(int argc, char **argv);

#endif /* FJ_TOOLS_H */
