/* The bottom layer: errors, memory helpers, names and small utilities that every other folder
** uses. Depends on the public header alone; nothing here knows about kernels, caches or
** backends. */
#ifndef FJ_CORE_H
#define FJ_CORE_H

#include "flashjit.h"

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

/* Frees p (NULL is fine) and clears it, so a pointer is never freed twice. */
#define FJ_FREE(p)                                                                                 \
    do {                                                                                           \
        free(p);                                                                                   \
        (p) = NULL;                                                                                \
    } while (0)

#if defined(__GNUC__)
#define FJ_PRINTF(fmt, args) __attribute__((format(printf, fmt, args)))
#else
#define FJ_PRINTF(fmt, args)
#endif

/* ---- errors ---------------------------------------------------------------------------- */

/* Where a failure's detail is written: the context's message, a thread's, or a job's own. */
typedef struct fj__err {
    char msg[2048];
} fj__err;

/* Formats the detail of a failure into err and returns status, so a failing path is one line:
** `return fj__fail(err, FJ_ERR_INVALID_ARGUMENT, "q.ndim = %d, expected 4", n);` */
fj_status fj__fail(fj__err *err, fj_status status, const char *fmt, ...) FJ_PRINTF(3, 4);
/* Appends text to err's message (used to attach a warning to an otherwise successful call). */
void fj__append(fj__err *err, const char *fmt, ...) FJ_PRINTF(2, 3);

/* The largest head dim (q's and k's, and v's) any kernel serves: DeepSeek's 576 / 512. */
#define FJ__MAX_HEAD_DIM 576

/* ---- extensible option structs ------------------------------------------------------------ */

/* The offset just past field f of T: a struct_size a caller of an older (or this) version may
** pass, since option structs only grow by whole fields at the end. */
#define FJ__FIELD_END(T, f) (offsetof(T, f) + sizeof(((T *)0)->f))

/* Whether size is one of the n field ends in ends (or the whole struct's size, whole): a
** struct_size that ends inside a field would have the struct copied half a field deep. */
int fj__size_on_field_end(size_t size, const size_t *ends, int n, size_t whole);

/* ---- small utilities ------------------------------------------------------------------- */

/* Monotonic wall-clock time in milliseconds. */
double fj__now_ms(void);

/* Event logging to stderr, chosen by $FLASHJIT_LOG (read once): "info" reports where each
** kernel came from (compiled, and why, or loaded from a cache) and what it cost; "debug" that
** and each launch, before it is issued (with CUDA_LAUNCH_BLOCKING=1 the last line names a
** kernel that hangs); anything else or unset, nothing. Both are cheap to call when off. */
int fj__log_info_enabled(void);
int fj__log_debug_enabled(void);
void fj__log_info(const char *fmt, ...) FJ_PRINTF(1, 2);
/* ---- hashes and signatures (crypto.c, on libsodium) ---------------------------------------- */

/* SHA-256 of data; hex is 65 bytes (64 digits and a NUL). */
void fj__sha256_hex(const void *data, size_t size, char hex[65]);
/* Incremental SHA-256. fj__sha256_field hashes a length (8 bytes, little-endian) and then the
** bytes, so that a sequence of fields has one encoding. */
typedef struct fj__sha256 {
    _Alignas(16) unsigned char state[128];
} fj__sha256;
void fj__sha256_init(fj__sha256 *h);
void fj__sha256_update(fj__sha256 *h, const void *data, size_t size);
void fj__sha256_field(fj__sha256 *h, const void *data, size_t size);
void fj__sha256_final(fj__sha256 *h, unsigned char digest[32]);
/* An Ed25519 public key. */
typedef struct fj__public_key {
    unsigned char bytes[32];
} fj__public_key;
/* Ed25519. Each returns 0 on success, -1 on failure (a bad signature, no usable libsodium). */
int fj__sign_keypair(unsigned char public_key[32], unsigned char secret_key[64]);
int fj__sign(const unsigned char *message, size_t size, const unsigned char secret_key[64],
             unsigned char signature[64]);
int fj__sign_verify(const unsigned char *message, size_t size, const unsigned char public_key[32],
                    const unsigned char signature[64]);
/* Hex of size bytes: decode needs exactly 2 * size digits (0, else -1); encode writes 2 * size
** digits and a NUL. */
int fj__hex_decode(const char *hex, unsigned char *out, size_t size);
void fj__hex_encode(const unsigned char *data, size_t size, char *hex);
/* strdup that returns NULL on NULL input or allocation failure. */
char *fj__strdup(const char *s);
/* The name used in variant keys and messages: "f16", "bf16", "f32", ... */
const char *fj__dtype_name(fj_dtype dtype);
/* Whether dtype is one of the FP8 types (f8e4m3, f8e5m2). */
int fj__dtype_fp8(fj_dtype dtype);
const char *fj__backend_name(fj_backend_kind kind);
/* t as [batch, seq, heads, dim]: a packed [total, heads, dim] tensor as one batch of total rows. */
fj_tensor fj__tensor_4d(const fj_tensor *t);

#endif /* FJ_CORE_H */
